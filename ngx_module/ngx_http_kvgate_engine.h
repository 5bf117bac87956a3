
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


typedef struct ngx_http_kvgate_engine_req_s  ngx_http_kvgate_engine_req_t;

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

/* The worker connected to the engine (up = 1) or lost it (up = 0). */
typedef void (*ngx_http_kvgate_engine_state_pt)(ngx_uint_t up);


struct ngx_http_kvgate_engine_req_s {
    /* set by the owner before the first submit */
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
   (0: never, they are refused while the worker is not connected). */
ngx_int_t ngx_http_kvgate_engine_init_process(ngx_cycle_t *cycle,
    const char *path, ngx_msec_t connect_wait,
    ngx_http_kvgate_engine_state_pt state);
void ngx_http_kvgate_engine_exit_process(ngx_cycle_t *cycle);

kvg_client *ngx_http_kvgate_engine_client(void);
/* The engine's model, tokenizer and limits; NULL while it is down. */
const kvg_engine_info *ngx_http_kvgate_engine_info(void);
ngx_uint_t ngx_http_kvgate_engine_up(void);
/* Up, or a handshake in progress that requests may wait for. */
ngx_uint_t ngx_http_kvgate_engine_available(void);
const char *ngx_http_kvgate_engine_down_reason(void);
/* Sets the 503 engine_unavailable error, naming why. */
void ngx_http_kvgate_engine_unavailable(kvg_api_error *err);

/* Submits er's request; NGX_OK (live), NGX_AGAIN (queued until the ring has
   room: er->retry is called then), or NGX_ERROR with *err set (answer 503 /
   400). */
ngx_int_t ngx_http_kvgate_engine_submit(ngx_http_kvgate_engine_req_t *er,
    const kvg_client_req *q, kvg_api_error *err);
/* NGX_OK when the engine is up; NGX_AGAIN when a handshake is in progress:
   er waits (in the same queue as for ring room, in arrival order) and
   er->retry is called when it completes, fails or runs out of
   connect_wait; NGX_ERROR with *err set (503) when the engine is down. */
ngx_int_t ngx_http_kvgate_engine_wait_up(ngx_http_kvgate_engine_req_t *er,
    kvg_api_error *err);
/* Pauses (paused = 1) or resumes er's request in the engine: a paused request
   stops generating and keeps its blocks; events made before still come.
   NGX_OK, or NGX_DECLINED when it is not live in the engine (waiting for ring
   room, finished, or the engine went away). */
ngx_int_t ngx_http_kvgate_engine_hold(ngx_http_kvgate_engine_req_t *er,
    ngx_uint_t paused);
/* Self-consistency: starts the next draw undrawn samples of er's request
   and cancels those of cancel_mask (bit j: sample j). NGX_OK (sent, or kept
   until the ring has room: messages for one request keep their order),
   NGX_DECLINED when it is not live in the engine. */
ngx_int_t ngx_http_kvgate_engine_samples(ngx_http_kvgate_engine_req_t *er,
    unsigned draw, uint32_t cancel_mask);
/* Takes er out of the wait queue and the engine; no event for it follows. */
void ngx_http_kvgate_engine_cancel(ngx_http_kvgate_engine_req_t *er);


#endif /* _NGX_HTTP_KVGATE_ENGINE_H_INCLUDED_ */
