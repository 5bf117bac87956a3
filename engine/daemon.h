/* The engine daemon: serves one model to the clients that connect to its unix socket
 * (nginx workers, kvgate-cli), over the protocol of src/proto.h.
 *
 * One thread does everything, in a loop: accept and handshake new clients, take the
 * messages each client pushed to its submission ring, run one scheduler step, push
 * what the step produced to the clients' completion rings, ring their doorbells. When
 * nothing is running it sleeps in epoll until a client or a signal wakes it, and for
 * KVG_HEARTBEAT_IDLE_MS at most: every iteration, and every layer of a step, advances
 * the heartbeat on the statistics page (proto.h), by which a gateway tells a silent
 * engine (stopped, hung) from an idle one. Nothing a client does can block the loop:
 * a full completion ring keeps that client's output in the engine (bounded: its
 * requests are held in the scheduler, kvg_sched_hold) and the other clients go on.
 *
 * Every field read from shared memory is validated (proto.c, then the model's limits,
 * then the block hashes are recomputed from the tokens): a bad request is answered
 * with an ERROR, a corrupt ring closes that one connection. A client that disappears
 * (EOF on its socket) has all its requests cancelled and their blocks released.
 *
 * Stop (kvg_daemon_request_stop, e.g. from SIGTERM): the socket is closed and removed,
 * new submissions are refused with 503, running requests get drain_timeout_ms to
 * finish, then the rest are cancelled (ERROR 503) and kvg_daemon_run returns. */
#ifndef KVG_DAEMON_H
#define KVG_DAEMON_H

#include <stddef.h>
#include <stdint.h>

#include "chat_template.h"
#include "forward.h"
#include "model.h"
#include "prefix_cache.h"
#include "scheduler.h"
#include "warmup.h"

typedef struct kvg_daemon kvg_daemon;

typedef struct kvg_daemon_config {
    const char *socket_path;
    int socket_mode;             /* chmod of the socket; -1: 0660 */
    int socket_gid;              /* chown group of the socket; -1: unchanged */
    const char *served_name;     /* the model name clients ask for; NULL: the model's */
    /* The chat template clients render (chat_template.h): its description and
     * Jinja source (NULL when the model has none). Borrowed. */
    const kvg_chat_template_info *chat;
    const char *chat_src;
    size_t chat_len;
    int max_waiting;             /* requests queued for admission before 429; 0: 256 */
    int drain_timeout_ms;        /* on stop; 0: 10000; < 0: cancel at once */
    uint32_t ring_slots;         /* slots per direction; 0: 256 (sq) and 1024 (cq) */
    uint64_t sq_data_bytes;      /* 0: twice the largest submission the context allows */
    uint64_t cq_data_bytes;      /* 0: 1 MiB */
    int hold_tokens;             /* tokens per sample made and not yet read by the client
                                    (buffered here or unread in its ring) before the
                                    request is held; 0: 256 */
    int busy_poll_us;            /* after work, watch the rings this long before sleeping
                                    (saves a wake-up when requests come back to back);
                                    0: 50; < 0: never */
} kvg_daemon_config;

/* Borrows the model, forward pass, cache and pool; builds the scheduler with scfg.
 * NULL with err. */
kvg_daemon *kvg_daemon_new(const kvg_model *m, kvg_forward *fw, kvg_prefix_cache *pc,
                           kvg_kv_pool *pool, const kvg_sched_config *scfg,
                           const kvg_daemon_config *cfg, char *err, size_t err_len);
void kvg_daemon_free(kvg_daemon *d);

/* Prefills a warm-up file before serving (see warmup.h). */
int kvg_daemon_warmup(kvg_daemon *d, const kvg_warmup *w, kvg_warmup_result *res,
                      char *err, size_t err_len);

/* Binds and listens on the socket. A socket file nobody listens on (left by an engine
 * that died) is replaced; one a live engine answers on is refused, as is a path that
 * is not a socket. 0, or -1 with err. */
int kvg_daemon_listen(kvg_daemon *d, char *err, size_t err_len);

/* Serves until stopped; 0 after a clean stop, -1 with err on a fatal error. */
int kvg_daemon_run(kvg_daemon *d, char *err, size_t err_len);

/* Asks the loop to stop (async-signal-safe, any thread). The second call skips the
 * drain and cancels what is left at once. */
void kvg_daemon_request_stop(kvg_daemon *d);

#endif
