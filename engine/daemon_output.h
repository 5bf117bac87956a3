/* Scheduler events -> per-request output buffers -> the client's completion ring
 * (see daemon_internal.h for the layers). Driven by daemon.c's loop. */
#ifndef KVG_DAEMON_OUTPUT_H
#define KVG_DAEMON_OUTPUT_H

#include "daemon_internal.h"

/* The scheduler's event callback (ctx: the kvg_daemon): buffers output in the
 * request's record and marks its connection dirty. */
void kvgd_sched_event(void *ctx, const kvg_sched_event *ev);
/* Pushes what c's requests have buffered, frees the records that are over, holds or
 * releases requests whose client does not keep up, and rings c's doorbell. */
void kvgd_conn_flush(dconn *c);

#endif
