/* One client of the engine daemon: accept, handshake, intake, teardown (see
 * daemon_internal.h for the layers). Driven by daemon.c's loop. */
#ifndef KVG_DAEMON_CONN_H
#define KVG_DAEMON_CONN_H

#include "daemon_internal.h"

/* Accepts every pending client on the listening socket. */
void kvgd_accept(kvg_daemon *d);
/* The client's socket is readable: its hello (then the handshake), or EOF. */
void kvgd_conn_readable(dconn *c);
/* Takes and validates what the client pushed to its submission ring. */
void kvgd_conn_intake(dconn *c);
/* Unlinks c, cancels its running requests, frees it and everything it holds. */
void kvgd_conn_close(dconn *c);

#endif
