/* The daemon's request records and the answers every layer may give: the lowest
 * daemon unit (see daemon_internal.h). It changes records and marks, and never
 * pushes to a ring or closes a descriptor: daemon_output.c pushes what a record says,
 * daemon.c tears down what is marked closing. */
#ifndef KVG_DAEMON_REQ_H
#define KVG_DAEMON_REQ_H

#include <stdint.h>

#include "daemon_internal.h"

/* Marks c for teardown at the end of this loop iteration (the first reason is the
 * one logged). Safe to call from anywhere, any number of times. */
void kvgd_conn_fail(dconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A new record for client_id, linked at the end of c's requests; NULL when out of
 * memory. */
dreq *kvgd_req_new(dconn *c, uint64_t client_id);
/* Unlinks r from its connection (if any) and frees it. */
void kvgd_req_free(dreq *r);
/* Ends r with ERROR status/msg instead of DONE (the first error wins). */
void kvgd_req_set_error(dreq *r, uint32_t status, const char *msg);
/* Answers a request that never reached the scheduler with ERROR; out of memory marks
 * the connection failed. */
void kvgd_reply_error(dconn *c, uint64_t client_id, uint32_t status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Ends a request the scheduler still runs with ERROR status/msg (shutdown, out of
 * memory) and cancels it there. */
void kvgd_req_abort(kvg_daemon *d, dreq *r, uint32_t status, const char *msg);

#endif
