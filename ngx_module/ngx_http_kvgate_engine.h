
/*
 * kvgate: the worker's connection to the engine, the bottom of the module's
 * stack. It knows nothing of HTTP requests: what it
 * carries for the layer above is an ngx_http_kvgate_engine_req_t, which that
 * layer embeds in its own state and fills with handler pointers, as
 * ngx_http_upstream_t carries create_request / process_header /
 * finalize_request for the module that owns it. The connection calls up
 * only through those pointers and the state hook given at init_process.
 */


#ifndef _NGX_HTTP_KVGATE_ENGINE_H_INCLUDED_
#define _NGX_HTTP_KVGATE_ENGINE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "api_error.h"
#include "client.h"
#include "liveness.h"


typedef struct ngx_http_kvgate_engine_req_s  ngx_http_kvgate_engine_req_t;
typedef struct ngx_http_kvgate_engine_s      ngx_http_kvgate_engine_t;

/* One event of the engine for the request (accepted, tokens, finished, done,
   error); after DONE or ERROR the request is no longer in the engine. */
typedef void (*ngx_http_kvgate_engine_event_pt)(
    ngx_http_kvgate_engine_req_t *er, const kvg_client_event *ev);

/* The request waited (for ring room, or for the engine's handshake) and may
   go now: the handler submits it again and returns what
   ngx_http_kvgate_engine_submit() said (NGX_AGAIN stops the queue), or
   NGX_ERROR once it has answered the request. After a handshake wait the
   engine may still be down (the wait ran out, or the handshake failed):
   the submit then fails with 503 as at any other time. */
typedef ngx_int_t (*ngx_http_kvgate_engine_retry_pt)(
    ngx_http_kvgate_engine_req_t *er);

/* What became of engine e for this worker: NGX_HTTP_KVGATE_ENGINE_*. */
typedef void (*ngx_http_kvgate_engine_state_pt)(ngx_http_kvgate_engine_t *e,
    ngx_uint_t event);

#define NGX_HTTP_KVGATE_ENGINE_DOWN     0    /* the connection was lost */
#define NGX_HTTP_KVGATE_ENGINE_UP       1    /* connected */
#define NGX_HTTP_KVGATE_ENGINE_STALLED  2    /* connected, went silent */
#define NGX_HTTP_KVGATE_ENGINE_RESUMED  3    /* its heartbeat moved again */


/* The most engines one configuration names (all groups together): each has
   a slot of its own in the shared metrics zone. */
#define NGX_HTTP_KVGATE_MAX_ENGINES  32


/*
 * One engine: what the configuration says of it (made while the
 * configuration is read, so every worker inherits it at fork) and the
 * worker's own connection to it (set up in init_process: each worker's copy
 * of this object is its own).
 */

struct ngx_http_kvgate_engine_s {
    /* configuration */
    ngx_str_t                  url;          /* "unix:/path" as written */
    ngx_str_t                  name;         /* name=, else the path */
    char                      *path;         /* the socket, NUL-terminated */
    uint64_t                   id;           /* stable: a hash of the name */
    ngx_uint_t                 index;        /* its metrics slot */

    /* the worker's connection */
    kvg_client                *client;
    ngx_log_t                 *log;
    ngx_connection_t          *sock;         /* the client's socket */
    ngx_connection_t          *bell;         /* the engine's doorbell */
    ngx_event_t                reconnect;
    ngx_event_t                handshake;    /* the end of connect_wait */
    ngx_msec_t                 connect_wait;
    ngx_uint_t                 handshaking;  /* requests may wait for it */
    ngx_queue_t                waiting;      /* for ring room or the handshake */
    ngx_uint_t                 n_waiting;
    ngx_queue_t                samples;      /* samples messages for room */
    ngx_uint_t                 up;
    ngx_uint_t                 exiting;
    ngx_http_kvgate_engine_state_pt  state;  /* told of connects and losses */
    char                       reason[320];

    /* liveness while up (kvgate_engine_stall): a cancelable timer looks at
       the engine's heartbeat; an engine silent for the deadline is stalled:
       out of routing, its requests failed (and re-sent by the layer above),
       the connection kept, back as soon as the heartbeat moves */
    ngx_event_t                watch;
    ngx_msec_t                 stall;        /* the deadline; 0: off */
    kvg_liveness               live;
    ngx_uint_t                 stalled;
    uint64_t                   stall_key;    /* its last heartbeat and instance:
                                                the same for every worker that
                                                sees one stall (counted once) */
    char                       stall_reason[96];
    /* the model it served when last up: while it is down, a request for
       that model is told 503 (it may come back), not 404 */
    char                       seen_model[128];
};


/*
 * A group of engines a location passes to (kvgate_engines NAME { ... }, or
 * the http-level kvgate_engine as a group of one, named ""). Requests are
 * routed among its engines by the layer above (kvg_route_pick).
 */

typedef struct {
    ngx_str_t                   name;
    ngx_http_kvgate_engine_t  **engines;
    ngx_uint_t                  n;
    ngx_uint_t                  policy;          /* kvg_route_policy */
    double                      balance_factor;
    uint64_t                    rr;              /* round robin, per worker */
    /* where it was defined, for messages */
    ngx_str_t                   file;
    ngx_uint_t                  line;
} ngx_http_kvgate_group_t;


struct ngx_http_kvgate_engine_req_s {
    /* set by the owner before the first submit (engine: the one it goes
       to; the owner may change it while the request is not live there) */
    ngx_http_kvgate_engine_t         *engine;
    ngx_http_kvgate_engine_event_pt   event;
    ngx_http_kvgate_engine_retry_pt   retry;
    void                             *data;
    ngx_log_t                        *log;

    /* the connection's own */
    ngx_queue_t                       queue;      /* waiting: room, handshake */
    uint64_t                          id;         /* in the engine */
    uint64_t                          instance;   /* engine it went to */
    unsigned                          submitted:1;  /* live in the engine */
    unsigned                          queued:1;     /* in the wait queue */
    unsigned                          resubmit:1;   /* leaving the queue */

    /* a samples message (draw, cancel) that found the ring full, sent at
       the next WRITABLE before any waiting submission */
    ngx_queue_t                       samples_queue;
    unsigned                          pend_draw;
    uint32_t                          pend_cancel;
    unsigned                          samples_queued:1;
};


/* connect_wait: how long requests may wait for a handshake in progress
   (0: never, they are refused while the worker is not connected); stall: how
   long the engine's heartbeat may stand still before it is taken for stalled
   (0: never). */
ngx_int_t ngx_http_kvgate_engine_init_process(ngx_cycle_t *cycle,
    ngx_http_kvgate_engine_t *e, ngx_msec_t connect_wait, ngx_msec_t stall,
    ngx_http_kvgate_engine_state_pt state);
void ngx_http_kvgate_engine_exit_process(ngx_http_kvgate_engine_t *e);

/* The engine's model, tokenizer and limits; NULL while it is down. */
const kvg_engine_info *ngx_http_kvgate_engine_info(
    ngx_http_kvgate_engine_t *e);
/* Connected (stalled or not). */
ngx_uint_t ngx_http_kvgate_engine_up(ngx_http_kvgate_engine_t *e);
/* Up and not stalled: requests may go to it. */
ngx_uint_t ngx_http_kvgate_engine_usable(ngx_http_kvgate_engine_t *e);
/* Up, and its heartbeat stood still past kvgate_engine_stall. */
ngx_uint_t ngx_http_kvgate_engine_stalled(ngx_http_kvgate_engine_t *e);
/* How long this worker has seen its heartbeat stand still (ms); 0 when the
   engine is down or its liveness is not watched. */
ngx_msec_t ngx_http_kvgate_engine_silent(ngx_http_kvgate_engine_t *e);
/* Up, or a handshake in progress that requests may wait for. */
ngx_uint_t ngx_http_kvgate_engine_available(ngx_http_kvgate_engine_t *e);
/* Why requests cannot go to it: why it is down, or that it stalled. */
const char *ngx_http_kvgate_engine_down_reason(ngx_http_kvgate_engine_t *e);
/* Sets the 503 engine_unavailable error, naming why. */
void ngx_http_kvgate_engine_unavailable(ngx_http_kvgate_engine_t *e,
    kvg_api_error *err);

/* The engine's load (kvg_client_load: tokens to compute), 0 while down or
   stalled. */
uint64_t ngx_http_kvgate_engine_load(ngx_http_kvgate_engine_t *e);
/* A copy of the engine's statistics page (kvg_client_stats): NGX_OK, or
   NGX_DECLINED while it is down or stalled. A stalled engine's page tells
   what it was, not what it is, and one the engine stopped in the middle of
   writing would keep the reader retrying for a writer that does not come. */
ngx_int_t ngx_http_kvgate_engine_read_stats(ngx_http_kvgate_engine_t *e,
    kvg_stats *st);
/* How many leading hashes of the chain the engine holds (its prefix cache;
   kvg_client_cached_prefix), 0 while down. */
size_t ngx_http_kvgate_engine_cached_prefix(ngx_http_kvgate_engine_t *e,
    const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], size_t n);

/* Some engine of g is up, or has a handshake in progress. */
ngx_uint_t ngx_http_kvgate_group_available(ngx_http_kvgate_group_t *g);
/* The first engine of g that is up (and serves model, when model is not
   NULL), NULL when there is none. A stalled engine counts: what it serves
   and its tokenizer hold; routing passes it over. */
ngx_http_kvgate_engine_t *ngx_http_kvgate_group_up(ngx_http_kvgate_group_t *g,
    const char *model, size_t model_len);
/* An engine of g whose handshake is under way, NULL when there is none. */
ngx_http_kvgate_engine_t *ngx_http_kvgate_group_handshaking(
    ngx_http_kvgate_group_t *g);
/* Whether an engine of g served model when it was last up. */
ngx_uint_t ngx_http_kvgate_group_seen(ngx_http_kvgate_group_t *g,
    const char *model, size_t model_len);
/* The 503 engine_unavailable error of a group none of whose engines can
   take the request, naming why (a group of one: as the engine's). */
void ngx_http_kvgate_group_unavailable(ngx_http_kvgate_group_t *g,
    kvg_api_error *err);

/* Submits er's request to er->engine; NGX_OK (live), NGX_AGAIN (queued until the ring has
   room: er->retry is called then), or NGX_ERROR with *err set (answer 503 /
   400; 503 too when the engine is stalled). */
ngx_int_t ngx_http_kvgate_engine_submit(ngx_http_kvgate_engine_req_t *er,
    const kvg_client_req *q, kvg_api_error *err);
/* Sends er a WIPE of the tenant whose salt is salt (kvg_client_wipe): er
   gets one event, KVG_CEV_WIPED with the counts or KVG_CEV_ERROR. NGX_OK
   (out), NGX_AGAIN (waits for ring room in the submission queue: er->retry
   is called then), or NGX_ERROR with *err set (503 when the engine is down
   or stalled). */
ngx_int_t ngx_http_kvgate_engine_wipe(ngx_http_kvgate_engine_req_t *er,
    const u_char *salt, size_t salt_len, kvg_api_error *err);
/* NGX_OK when the engine is up; NGX_AGAIN when a handshake is in progress:
   er waits (in the same queue as for ring room, in arrival order) and
   er->retry is called when it completes, fails or runs out of
   connect_wait; NGX_ERROR with *err set (503) when the engine is down. */
ngx_int_t ngx_http_kvgate_engine_wait_up(ngx_http_kvgate_engine_req_t *er,
    kvg_api_error *err);
/* Pauses (pause = 1) or resumes er's request in the engine: a paused request
   stops generating and keeps its blocks; events made before still come.
   NGX_OK, or NGX_DECLINED when it is not live in the engine (waiting for ring
   room, finished, or the engine went away). */
ngx_int_t ngx_http_kvgate_engine_pause(ngx_http_kvgate_engine_req_t *er,
    ngx_uint_t pause);
/* Self-consistency: starts the next draw undrawn samples of er's request
   and cancels those of cancel_mask (bit j: sample j). NGX_OK (sent, or kept
   until the ring has room: messages for one request keep their order),
   NGX_DECLINED when it is not live in the engine. */
ngx_int_t ngx_http_kvgate_engine_samples(ngx_http_kvgate_engine_req_t *er,
    unsigned draw, uint32_t cancel_mask);
/* Takes er out of the wait queue and the engine; no event for it follows. */
void ngx_http_kvgate_engine_cancel(ngx_http_kvgate_engine_req_t *er);


#endif /* _NGX_HTTP_KVGATE_ENGINE_H_INCLUDED_ */
