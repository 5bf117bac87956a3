
/*
 * The worker's connection to each engine.
 *
 * Each worker process has one libkvgate client (kvg_client) per configured
 * engine (ngx_http_kvgate_engine_t; every function here takes the engine, or
 * the request that names it in er->engine), each with its own region
 * of shared memory with the engine, a unix socket that only tells life from
 * death, and two eventfd doorbells. The socket and the engine's doorbell join
 * the worker's event loop as nginx connections; every wake-up drains the
 * client's events (nginx's epoll is edge-triggered) and hands each to the
 * request it belongs to, through the event handler that request registered
 * in its ngx_http_kvgate_engine_req_t: this layer calls nothing above it by
 * name (see ngx_http_kvgate_engine.h).
 *
 * When the engine goes away, the client fails every live request at once
 * (the request answers 503) and a cancelable timer reconnects with backoff;
 * the next engine may serve another model, so the model, tokenizer and chat
 * template always come from the current connection.
 *
 * While a handshake is in progress (a new worker after a reload or a respawn,
 * or a reconnect whose socket connect succeeded), requests wait for it in the
 * queue that also holds requests waiting for ring room, for at most
 * connect_wait (kvgate_connect_wait) from the start of that handshake: a new
 * worker accepts connections at once, and refusing what arrives in the first
 * milliseconds would turn every reload into a burst of 503s. An engine that
 * refuses the connect (not running) is refused at once, as before: only a
 * handshake that is under way is worth waiting for.
 *
 * An engine can also go silent with its socket open: stopped (SIGSTOP), hung
 * in a step, starved of CPU. While it is up, a cancelable timer looks at its
 * heartbeat (one relaxed load from its statistics page) every tenth of
 * kvgate_engine_stall; unchanged for that long (liveness.h), the engine is
 * stalled: this worker routes nothing more to it, the requests it holds are
 * failed at once with 503 and cancelled in it (kvg_client_fail_live; the
 * layer above re-sends those that had no token yet, as when an engine dies)
 * and so are those waiting for its ring. The connection stays, and the
 * engine rejoins as soon as its heartbeat moves.
 */


#include "ngx_http_kvgate_engine.h"
#include "liveness.h"




#define NGX_HTTP_KVGATE_MAX_WAITING  4096


static void ngx_http_kvgate_engine_read(ngx_event_t *ev);
static void ngx_http_kvgate_engine_drain(ngx_http_kvgate_engine_t *w);
static void ngx_http_kvgate_reconnect(ngx_event_t *ev);
static void ngx_http_kvgate_engine_dummy(ngx_event_t *ev);
static void ngx_http_kvgate_submit_waiting(ngx_http_kvgate_engine_t *w);
static void ngx_http_kvgate_samples_waiting(ngx_http_kvgate_engine_t *w);
static void ngx_http_kvgate_samples_forget(ngx_http_kvgate_engine_req_t *er);
static void ngx_http_kvgate_handshake_timeout(ngx_event_t *ev);
static void ngx_http_kvgate_handshake_over(ngx_http_kvgate_engine_t *w);
static void ngx_http_kvgate_liveness_check(ngx_event_t *ev);


ngx_uint_t
ngx_http_kvgate_engine_up(ngx_http_kvgate_engine_t *w)
{
    /* NULL: no engine (a group none of whose engines is up) */

    if (w == NULL) {
        return 0;
    }

    return w->up;
}


ngx_uint_t
ngx_http_kvgate_engine_usable(ngx_http_kvgate_engine_t *w)
{
    /* NULL: no engine (a group none of whose engines is up) */

    if (w == NULL) {
        return 0;
    }

    return w->up && !w->stalled;
}


ngx_uint_t
ngx_http_kvgate_engine_stalled(ngx_http_kvgate_engine_t *w)
{
    return w != NULL && w->up && w->stalled;
}


ngx_msec_t
ngx_http_kvgate_engine_silent(ngx_http_kvgate_engine_t *w)
{
    if (w == NULL || !w->up || w->stall == 0) {
        return 0;
    }

    return (ngx_msec_t) kvg_liveness_silent_ms(&w->live,
                                               (int64_t) ngx_current_msec);
}


ngx_uint_t
ngx_http_kvgate_engine_available(ngx_http_kvgate_engine_t *w)
{
    /* NULL: no engine (a group none of whose engines is up) */

    if (w == NULL) {
        return 0;
    }

    return w->up || w->handshaking;
}


const kvg_engine_info *
ngx_http_kvgate_engine_info(ngx_http_kvgate_engine_t *w)
{
    /* NULL: no engine (a group none of whose engines is up) */

    if (w == NULL) {
        return NULL;
    }

    if (!w->up) {
        return NULL;
    }

    return kvg_client_info(w->client);
}


const char *
ngx_http_kvgate_engine_down_reason(ngx_http_kvgate_engine_t *w)
{
    if (w->up && w->stalled) {
        /* told as it is now: how long it has been silent so far */
        *ngx_snprintf((u_char *) w->stall_reason,
                      sizeof(w->stall_reason) - 1,
                      "stalled: no progress for %M ms",
                      ngx_http_kvgate_engine_silent(w)) = '\0';
        return w->stall_reason;
    }

    return w->reason[0] ? w->reason : "not connected yet";
}


/*
 * A descriptor owned by the client library joins the event loop. The
 * connection never closes the descriptor (the library does); it is only
 * released.
 */

static ngx_connection_t *
ngx_http_kvgate_watch(ngx_http_kvgate_engine_t *w, int fd)
{
    ngx_connection_t  *c;

    c = ngx_get_connection(fd, w->log);
    if (c == NULL) {
        return NULL;
    }

    c->data = w;
    c->log = w->log;
    c->read->log = c->log;
    c->write->log = c->log;
    c->read->handler = ngx_http_kvgate_engine_read;
    c->write->handler = ngx_http_kvgate_engine_dummy;

    if (ngx_add_event(c->read, NGX_READ_EVENT, 0) != NGX_OK) {
        c->fd = (ngx_socket_t) -1;
        ngx_free_connection(c);
        return NULL;
    }

    return c;
}


static void
ngx_http_kvgate_unwatch(ngx_connection_t **cp, ngx_uint_t fd_closed)
{
    ngx_connection_t  *c = *cp;

    if (c == NULL) {
        return;
    }

    /* a closed descriptor has already left epoll */

    if (!fd_closed && c->read->active) {
        ngx_del_event(c->read, NGX_READ_EVENT, 0);
    }

    if (c->read->posted) {
        ngx_delete_posted_event(c->read);
    }

    if (c->write->posted) {
        ngx_delete_posted_event(c->write);
    }

    c->read->closed = 1;
    c->write->closed = 1;
    c->fd = (ngx_socket_t) -1;

    ngx_free_connection(c);

    *cp = NULL;
}


static void
ngx_http_kvgate_engine_dummy(ngx_event_t *ev)
{
}


static void
ngx_http_kvgate_schedule_reconnect(ngx_http_kvgate_engine_t *w)
{
        ngx_msec_t                 delay;

    if (w->exiting || w->reconnect.timer_set) {
        return;
    }

    delay = (ngx_msec_t) kvg_client_retry_delay_ms(w->client);

    ngx_add_timer(&w->reconnect, delay ? delay : 1);
}


static void
ngx_http_kvgate_try_connect(ngx_http_kvgate_engine_t *w)
{
        char                       err[320];

    if (kvg_client_connect(w->client, err, sizeof(err)) != 0) {
        if (ngx_strcmp(err, w->reason) != 0) {
            ngx_log_error(NGX_LOG_WARN, w->log, 0,
                          "kvgate: cannot connect to the engine \"%V\": %s",
                          &w->name, err);
            ngx_cpystrn((u_char *) w->reason, (u_char *) err,
                        sizeof(w->reason));
        }

        ngx_http_kvgate_schedule_reconnect(w);
        return;
    }

    w->sock = ngx_http_kvgate_watch(w, kvg_client_socket_fd(w->client));
    if (w->sock == NULL) {
        kvg_client_disconnect(w->client, "cannot watch the engine's socket");

    } else if (w->connect_wait && !w->handshake.timer_set) {
        /* the socket is connected: the engine is there and answers soon */
        w->handshaking = 1;
        ngx_add_timer(&w->handshake, w->connect_wait);
    }

    /* the engine's answer may already be there */

    ngx_http_kvgate_engine_drain(w);
}


static void
ngx_http_kvgate_reconnect(ngx_event_t *ev)
{
    ngx_http_kvgate_engine_t  *w = ev->data;

    if (ngx_exiting || ngx_quit || ngx_terminate) {
        return;
    }

    ngx_http_kvgate_try_connect(w);
}


/* The handshake did not finish within connect_wait: the requests that
   waited for it are answered (503) and new ones are refused until it does. */

static void
ngx_http_kvgate_handshake_timeout(ngx_event_t *ev)
{
    ngx_http_kvgate_engine_t  *w = ev->data;

    
    w->handshaking = 0;

    if (w->up) {
        return;
    }

    ngx_log_error(NGX_LOG_WARN, w->log, 0,
                  "kvgate: the engine \"%V\": the handshake did not finish "
                  "within %M ms (kvgate_connect_wait), %ui requests waited "
                  "for it", &w->name, w->connect_wait, w->n_waiting);

    *ngx_snprintf((u_char *) w->reason, sizeof(w->reason) - 1,
                  "the handshake did not finish within %M ms",
                  w->connect_wait) = '\0';

    ngx_http_kvgate_submit_waiting(w);
}


static void
ngx_http_kvgate_handshake_over(ngx_http_kvgate_engine_t *w)
{
    
    w->handshaking = 0;

    if (w->handshake.timer_set) {
        ngx_del_timer(&w->handshake);
    }
}


/* ---- liveness ---- */

/* A tenth of the deadline: a stall is seen within about 1.2 x the deadline of
   the engine's last beat (liveness.h). */

static ngx_msec_t
ngx_http_kvgate_liveness_interval(ngx_http_kvgate_engine_t *w)
{
    return w->stall >= 10 ? w->stall / 10 : 1;
}


static void
ngx_http_kvgate_liveness_start(ngx_http_kvgate_engine_t *w)
{
    w->stalled = 0;

    if (w->stall == 0 || w->client == NULL) {
        return;
    }

    kvg_liveness_start(&w->live, kvg_client_heartbeat(w->client),
                       (int64_t) ngx_current_msec);

    if (!w->watch.timer_set) {
        ngx_add_timer(&w->watch, ngx_http_kvgate_liveness_interval(w));
    }
}


/* The engine went silent: out of routing; what it holds fails now (the
   layer above re-sends what has no token yet), and so does what waits for
   its ring, which will not drain. */

static void
ngx_http_kvgate_engine_stall(ngx_http_kvgate_engine_t *w)
{
    size_t                  n;
    uint32_t                pid;
    ngx_msec_t              silent;
    const kvg_engine_info  *info;
    char                    why[192];

    /* (up: the info is there until the connection is lost, which failing
       the requests may do: out of memory) */

    info = kvg_client_info(w->client);
    pid = info->engine_pid;
    silent = ngx_http_kvgate_engine_silent(w);

    w->stalled = 1;
    w->stall_key = kvg_client_heartbeat(w->client) ^ info->instance;

    *ngx_snprintf((u_char *) why, sizeof(why) - 1,
                  "kvgate: engine \"%V\" stalled: no progress for %M ms "
                  "(kvgate_engine_stall %M ms)", &w->name, silent, w->stall)
        = '\0';

    n = kvg_client_fail_live(w->client, 503, why);

    ngx_log_error(NGX_LOG_ERR, w->log, 0,
                  "kvgate: the engine \"%V\" (pid %uD) made no progress for "
                  "%M ms (kvgate_engine_stall): stalled, out of routing until "
                  "it moves again; %uz requests in it and %ui waiting for it "
                  "fail or go to another engine", &w->name, pid, silent, n,
                  w->n_waiting);

    if (w->state) {
        w->state(w, NGX_HTTP_KVGATE_ENGINE_STALLED);
    }

    ngx_http_kvgate_engine_drain(w);

    if (w->up) {
        ngx_http_kvgate_submit_waiting(w);
    }
}


static void
ngx_http_kvgate_engine_resume(ngx_http_kvgate_engine_t *w)
{
    w->stalled = 0;

    ngx_log_error(NGX_LOG_NOTICE, w->log, 0,
                  "kvgate: the engine \"%V\" makes progress again: back in "
                  "routing", &w->name);

    if (w->state) {
        w->state(w, NGX_HTTP_KVGATE_ENGINE_RESUMED);
    }
}


static void
ngx_http_kvgate_liveness_check(ngx_event_t *ev)
{
    ngx_http_kvgate_engine_t  *w = ev->data;

    if (!w->up || w->client == NULL) {
        return;
    }

    switch (kvg_liveness_observe(&w->live, kvg_client_heartbeat(w->client),
                                 (int64_t) ngx_current_msec,
                                 (int64_t) w->stall))
    {
    case KVG_LIVENESS_STALLED:
        ngx_http_kvgate_engine_stall(w);
        break;

    case KVG_LIVENESS_RESUMED:
        ngx_http_kvgate_engine_resume(w);
        break;

    default:
        break;
    }

    /* the failed requests' handlers may have lost the engine meanwhile */

    if (w->up && w->client != NULL && !w->watch.timer_set) {
        ngx_add_timer(&w->watch, ngx_http_kvgate_liveness_interval(w));
    }
}


ngx_int_t
ngx_http_kvgate_engine_init_process(ngx_cycle_t *cycle,
    ngx_http_kvgate_engine_t *w, ngx_msec_t connect_wait, ngx_msec_t stall,
    ngx_http_kvgate_engine_state_pt state)
{
    char                       err[320];
    kvg_client_opts            opts;
    
    /* the configuration's part stays; the connection's starts afresh */

    w->client = NULL;
    w->sock = NULL;
    w->bell = NULL;
    ngx_memzero(&w->reconnect, sizeof(ngx_event_t));
    ngx_memzero(&w->handshake, sizeof(ngx_event_t));
    ngx_memzero(&w->watch, sizeof(ngx_event_t));
    w->handshaking = 0;
    w->stalled = 0;
    w->n_waiting = 0;
    w->up = 0;
    w->exiting = 0;
    w->reason[0] = '\0';
    w->seen_model[0] = '\0';

    w->log = cycle->log;
    w->state = state;
    ngx_queue_init(&w->waiting);
    ngx_queue_init(&w->samples);

    ngx_memzero(&opts, sizeof(kvg_client_opts));
    opts.name = "nginx worker";
    opts.backoff_min_ms = 50;
    opts.backoff_max_ms = 2000;

    w->client = kvg_client_new(w->path, &opts, err, sizeof(err));
    if (w->client == NULL) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0, "kvgate: engine \"%V\": %s",
                      &w->name, err);
        return NGX_ERROR;
    }

    w->reconnect.handler = ngx_http_kvgate_reconnect;
    w->reconnect.log = cycle->log;
    w->reconnect.data = w;
    w->reconnect.cancelable = 1;

    /* not cancelable: a worker told to quit while requests wait for its
       handshake still serves them (it lingers connect_wait at most) */

    w->connect_wait = connect_wait;
    w->handshake.handler = ngx_http_kvgate_handshake_timeout;
    w->handshake.log = cycle->log;
    w->handshake.data = w;

    /* cancelable: looking at a heartbeat never holds up a graceful quit */

    w->stall = stall;
    w->watch.handler = ngx_http_kvgate_liveness_check;
    w->watch.log = cycle->log;
    w->watch.data = w;
    w->watch.cancelable = 1;

    ngx_http_kvgate_try_connect(w);

    return NGX_OK;
}


void
ngx_http_kvgate_engine_exit_process(ngx_http_kvgate_engine_t *w)
{
    
    if (w->client == NULL) {
        return;
    }

    w->exiting = 1;

    if (w->reconnect.timer_set) {
        ngx_del_timer(&w->reconnect);
    }

    ngx_http_kvgate_handshake_over(w);

    if (w->watch.timer_set) {
        ngx_del_timer(&w->watch);
    }

    ngx_http_kvgate_unwatch(&w->sock, 0);
    ngx_http_kvgate_unwatch(&w->bell, 0);

    /* closing the socket makes the engine cancel whatever is left */

    kvg_client_free(w->client);
    w->client = NULL;
    w->up = 0;
}


static void
ngx_http_kvgate_engine_read(ngx_event_t *ev)
{
    ngx_connection_t          *c = ev->data;
    ngx_http_kvgate_engine_t  *w = c->data;
    
    /* the socket only ever turns readable at the engine's death */

    if (c == w->sock && w->client) {
        kvg_client_socket_readable(w->client);
    }

    ngx_http_kvgate_engine_drain(w);
}


/* Submits the requests waiting for ring room or for the handshake, in order,
   until the ring is full again (the request that found it full goes back to
   the head). While the engine is down each of them is answered 503. */

static void
ngx_http_kvgate_submit_waiting(ngx_http_kvgate_engine_t *w)
{
    ngx_queue_t                   *q;
        ngx_http_kvgate_engine_req_t  *er;

    while (!ngx_queue_empty(&w->waiting)) {
        q = ngx_queue_head(&w->waiting);
        ngx_queue_remove(q);
        w->n_waiting--;
        er = ngx_queue_data(q, ngx_http_kvgate_engine_req_t, queue);
        er->queued = 0;

        /* its turn: not behind the others still waiting */

        er->resubmit = 1;

        if (er->retry(er) == NGX_AGAIN) {
            er->resubmit = 0;
            break;
        }
    }
}


/* er's samples message that waits for ring room is no longer needed. */

static void
ngx_http_kvgate_samples_forget(ngx_http_kvgate_engine_req_t *er)
{
    if (er->samples_queued) {
        ngx_queue_remove(&er->samples_queue);
        er->samples_queued = 0;
    }

    er->pend_draw = 0;
    er->pend_cancel = 0;
}


/* Sends the samples messages that found the ring full, in order, until it
   is full again. */

static void
ngx_http_kvgate_samples_waiting(ngx_http_kvgate_engine_t *w)
{
    int                            rc;
    ngx_queue_t                   *q;
        ngx_http_kvgate_engine_req_t  *er;

    while (!ngx_queue_empty(&w->samples) && w->client != NULL) {
        q = ngx_queue_head(&w->samples);
        er = ngx_queue_data(q, ngx_http_kvgate_engine_req_t, samples_queue);

        rc = kvg_client_samples(w->client, er->id, er->pend_draw,
                                er->pend_cancel);

        if (rc == KVG_CLIENT_AGAIN) {
            return;
        }

        ngx_log_debug4(NGX_LOG_DEBUG_HTTP, er->log, 0,
                       "kvgate: engine request %uL: draw %ud, cancel %08xD "
                       "(waited for room): %d", er->id, er->pend_draw,
                       er->pend_cancel, rc);

        ngx_http_kvgate_samples_forget(er);
    }
}


ngx_int_t
ngx_http_kvgate_engine_samples(ngx_http_kvgate_engine_req_t *er,
    unsigned draw, uint32_t cancel_mask)
{
    int                        rc;
    ngx_http_kvgate_engine_t  *w = er->engine;
    
    if (!er->submitted || w == NULL || w->client == NULL) {
        return NGX_DECLINED;
    }

    if (er->samples_queued) {
        /* behind the message that waits: one message says both (the engine
           draws before it cancels) */
        er->pend_draw += draw;
        er->pend_cancel |= cancel_mask;
        return NGX_OK;
    }

    rc = kvg_client_samples(w->client, er->id, draw, cancel_mask);

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, er->log, 0,
                   "kvgate: engine request %uL: draw %ud, cancel %08xD: %d",
                   er->id, draw, cancel_mask, rc);

    if (rc == KVG_CLIENT_AGAIN) {
        er->pend_draw = draw;
        er->pend_cancel = cancel_mask;
        ngx_queue_insert_tail(&w->samples, &er->samples_queue);
        er->samples_queued = 1;
        return NGX_OK;
    }

    return rc == 0 ? NGX_OK : NGX_DECLINED;
}


/* Hands out every pending event of the client. */

static void
ngx_http_kvgate_engine_drain(ngx_http_kvgate_engine_t *w)
{
    char                           tdesc[400];
    kvg_client_event               ev;
    const kvg_engine_info         *info;
    ngx_http_kvgate_engine_req_t  *er;

    if (w->client == NULL) {
        return;
    }

    while (kvg_client_next_event(w->client, &ev) == 1) {

        switch (ev.kind) {

        case KVG_CEV_UP:
            info = kvg_client_info(w->client);
            w->up = 1;
            w->reason[0] = '\0';
            ngx_cpystrn((u_char *) w->seen_model, (u_char *) info->model_name,
                        sizeof(w->seen_model));
            w->bell = ngx_http_kvgate_watch(w,
                                            kvg_client_doorbell_fd(w->client));

            if (w->bell == NULL) {
                kvg_client_disconnect(w->client,
                                      "cannot watch the engine's doorbell");
                break;
            }

            ngx_log_error(NGX_LOG_NOTICE, w->log, 0,
                          "kvgate: connected to the engine \"%V\" (pid %uD): "
                          "model \"%s\" (id %*s), context %uD, block %uD "
                          "tokens, chat template %s",
                          &w->name, info->engine_pid, info->model_name,
                          (size_t) 16,
                          info->model_id_hex, info->context_length,
                          info->block_tokens,
                          kvg_chat_template_summary(&info->chat, tdesc,
                                                    sizeof(tdesc)));

            if (w->state) {
                w->state(w, NGX_HTTP_KVGATE_ENGINE_UP);
            }

            ngx_http_kvgate_liveness_start(w);

            /* the requests that waited for the handshake go now, in order */

            ngx_http_kvgate_handshake_over(w);
            ngx_http_kvgate_submit_waiting(w);
            break;

        case KVG_CEV_DOWN:
            if (w->up) {
                ngx_log_error(NGX_LOG_ERR, w->log, 0,
                              "kvgate: lost the engine \"%V\": %s", &w->name,
                              ev.message);
            } else if (ngx_strcmp(ev.message, w->reason) != 0) {
                ngx_log_error(NGX_LOG_WARN, w->log, 0,
                              "kvgate: cannot connect to the engine \"%V\": "
                              "%s", &w->name, ev.message);
            }

            ngx_cpystrn((u_char *) w->reason, (u_char *) ev.message,
                        sizeof(w->reason));

            if (w->up && w->state) {
                w->state(w, NGX_HTTP_KVGATE_ENGINE_DOWN);
            }

            w->up = 0;
            w->stalled = 0;

            if (w->watch.timer_set) {
                ngx_del_timer(&w->watch);
            }

            ngx_http_kvgate_handshake_over(w);
            ngx_http_kvgate_unwatch(&w->sock, 1);
            ngx_http_kvgate_unwatch(&w->bell, 1);

            /* requests still waiting for ring room or for a handshake that
               failed never reached the engine: resubmitting them now answers
               each 503 */

            ngx_http_kvgate_submit_waiting(w);
            ngx_http_kvgate_schedule_reconnect(w);
            break;

        case KVG_CEV_WRITABLE:
            /* what live requests asked for first: a cancel frees blocks */
            ngx_http_kvgate_samples_waiting(w);
            ngx_http_kvgate_submit_waiting(w);
            break;

        default:
            er = ev.user;

            if (er == NULL) {
                break;
            }

            if (ev.kind == KVG_CEV_DONE || ev.kind == KVG_CEV_ERROR
                || ev.kind == KVG_CEV_WIPED)
            {
                /* the engine is done with it: nothing left to cancel */
                er->submitted = 0;
                ngx_http_kvgate_samples_forget(er);
            }

            er->event(er, &ev);
            break;
        }

        if (w->client == NULL) {
            return;
        }
    }
}


void
ngx_http_kvgate_engine_unavailable(ngx_http_kvgate_engine_t *w,
    kvg_api_error *err)
{
    kvg_api_error_set(err, 503, "engine_unavailable", NULL,
                      "kvgate: the engine is not available (%s)",
                      ngx_http_kvgate_engine_down_reason(w));
}


/* Puts er at the tail of the wait queue (for the handshake or for ring room:
   one queue, one order): NGX_AGAIN, or NGX_ERROR (503) when it is full. */

static ngx_int_t
ngx_http_kvgate_engine_enqueue(ngx_http_kvgate_engine_req_t *er,
    kvg_api_error *err)
{
    ngx_http_kvgate_engine_t  *w = er->engine;
    
    if (w->n_waiting >= NGX_HTTP_KVGATE_MAX_WAITING) {
        kvg_api_error_set(err, 503, "engine_overloaded", NULL,
                          "kvgate: the engine is overloaded (%lu requests "
                          "wait to be submitted)",
                          (unsigned long) w->n_waiting);
        return NGX_ERROR;
    }

    ngx_queue_insert_tail(&w->waiting, &er->queue);
    w->n_waiting++;
    er->queued = 1;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, er->log, 0,
                   "kvgate: queued behind %ui others", w->n_waiting - 1);

    return NGX_AGAIN;
}


ngx_int_t
ngx_http_kvgate_engine_wait_up(ngx_http_kvgate_engine_req_t *er,
    kvg_api_error *err)
{
    ngx_http_kvgate_engine_t  *w = er->engine;

    if (w->up) {
        return NGX_OK;
    }

    if (!w->handshaking) {
        ngx_http_kvgate_engine_unavailable(w, err);
        return NGX_ERROR;
    }

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, er->log, 0,
                   "kvgate: waits for the engine's handshake");

    return ngx_http_kvgate_engine_enqueue(er, err);
}


/*
 * What a push to the engine's submission ring came to (kvg_client_submit or
 * kvg_client_wipe: rc, the id it went out under, msg when it failed).
 */

static ngx_int_t
ngx_http_kvgate_engine_pushed(ngx_http_kvgate_engine_req_t *er, int rc,
    uint64_t id, const char *msg, kvg_api_error *err)
{
    ngx_http_kvgate_engine_t  *w = er->engine;

    if (rc == 0) {
        er->id = id;
        er->submitted = 1;
        er->instance = kvg_client_info(w->client)->instance;

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, er->log, 0,
                       "kvgate: sent as engine request %uL "
                       "(instance %016xL)", er->id, er->instance);

        return NGX_OK;
    }

    if (rc == KVG_CLIENT_AGAIN) {
        ngx_queue_insert_head(&w->waiting, &er->queue);
        w->n_waiting++;
        er->queued = 1;

        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, er->log, 0,
                       "kvgate: submission ring full, waiting for room");

        return NGX_AGAIN;
    }

    if (kvg_client_get_state(w->client) != KVG_CLIENT_UP) {
        kvg_api_error_set(err, 503, "engine_unavailable", NULL,
                          "kvgate: the engine connection failed: %s", msg);

        /* the client reports DOWN from its next event */
        ngx_http_kvgate_engine_drain(w);
        return NGX_ERROR;
    }

    kvg_api_error_set(err, 400, "invalid_request", NULL, "%s", msg);

    return NGX_ERROR;
}


/*
 * Whether er may go to the engine now: NGX_OK, NGX_AGAIN queued behind
 * those that wait for room (the order is kept), NGX_ERROR with err when
 * the engine is down or stalled (the layer above routes it elsewhere).
 */

static ngx_int_t
ngx_http_kvgate_engine_may_push(ngx_http_kvgate_engine_req_t *er,
    kvg_api_error *err)
{
    ngx_http_kvgate_engine_t  *w = er->engine;

    if (!w->up || w->stalled) {
        ngx_http_kvgate_engine_unavailable(w, err);
        return NGX_ERROR;
    }

    if (!ngx_queue_empty(&w->waiting) && !er->queued && !er->resubmit) {
        return ngx_http_kvgate_engine_enqueue(er, err);
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_kvgate_engine_submit(ngx_http_kvgate_engine_req_t *er,
    const kvg_client_req *q, kvg_api_error *err)
{
    int                        rc;
    char                       msg[320];
    uint64_t                   id;
    ngx_int_t                  may;
    ngx_http_kvgate_engine_t  *w = er->engine;

    may = ngx_http_kvgate_engine_may_push(er, err);
    if (may != NGX_OK) {
        return may;
    }

    id = 0;
    rc = kvg_client_submit(w->client, q, er, &id, msg, sizeof(msg));

    return ngx_http_kvgate_engine_pushed(er, rc, id, msg, err);
}


ngx_int_t
ngx_http_kvgate_engine_wipe(ngx_http_kvgate_engine_req_t *er,
    const u_char *salt, size_t salt_len, kvg_api_error *err)
{
    int                        rc;
    char                       msg[320];
    uint64_t                   id;
    ngx_int_t                  may;
    ngx_http_kvgate_engine_t  *w = er->engine;

    may = ngx_http_kvgate_engine_may_push(er, err);
    if (may != NGX_OK) {
        return may;
    }

    id = 0;
    rc = kvg_client_wipe(w->client, salt, salt_len, er, &id, msg,
                         sizeof(msg));

    return ngx_http_kvgate_engine_pushed(er, rc, id, msg, err);
}


ngx_int_t
ngx_http_kvgate_engine_pause(ngx_http_kvgate_engine_req_t *er,
    ngx_uint_t pause)
{
    ngx_http_kvgate_engine_t  *w = er->engine;

    if (!er->submitted || w == NULL || w->client == NULL) {
        return NGX_DECLINED;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, er->log, 0,
                   "kvgate: %s engine request %uL",
                   pause ? "pausing" : "resuming", er->id);

    if (kvg_client_pause(w->client, er->id, (int) pause) != 0) {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


void
ngx_http_kvgate_engine_cancel(ngx_http_kvgate_engine_req_t *er)
{
    ngx_http_kvgate_engine_t  *w = er->engine;

    
    ngx_http_kvgate_samples_forget(er);

    if (er->queued && w != NULL) {
        ngx_queue_remove(&er->queue);
        w->n_waiting--;
        er->queued = 0;
    }

    if (er->submitted) {
        er->submitted = 0;

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, er->log, 0,
                       "kvgate: cancelling engine request %uL", er->id);

        if (w != NULL && w->client != NULL) {
            (void) kvg_client_cancel(w->client, er->id);
        }
    }
}


/* ---- groups ---- */

ngx_uint_t
ngx_http_kvgate_group_available(ngx_http_kvgate_group_t *g)
{
    ngx_uint_t  i;

    for (i = 0; i < g->n; i++) {
        if (ngx_http_kvgate_engine_available(g->engines[i])) {
            return 1;
        }
    }

    return 0;
}


static ngx_uint_t
ngx_http_kvgate_model_is(const char *name, const char *model, size_t len)
{
    return ngx_strlen(name) == len && ngx_strncmp(name, model, len) == 0;
}


ngx_http_kvgate_engine_t *
ngx_http_kvgate_group_up(ngx_http_kvgate_group_t *g, const char *model,
    size_t model_len)
{
    ngx_uint_t                 i;
    const kvg_engine_info     *info;
    ngx_http_kvgate_engine_t  *e;

    for (i = 0; i < g->n; i++) {
        e = g->engines[i];
        info = ngx_http_kvgate_engine_info(e);

        if (info != NULL
            && (model == NULL
                || ngx_http_kvgate_model_is(info->model_name, model,
                                            model_len)))
        {
            return e;
        }
    }

    return NULL;
}


ngx_http_kvgate_engine_t *
ngx_http_kvgate_group_handshaking(ngx_http_kvgate_group_t *g)
{
    ngx_uint_t  i;

    for (i = 0; i < g->n; i++) {
        if (!g->engines[i]->up && g->engines[i]->handshaking) {
            return g->engines[i];
        }
    }

    return NULL;
}


ngx_uint_t
ngx_http_kvgate_group_seen(ngx_http_kvgate_group_t *g, const char *model,
    size_t model_len)
{
    ngx_uint_t  i;

    for (i = 0; i < g->n; i++) {
        if (ngx_http_kvgate_model_is(g->engines[i]->seen_model, model,
                                     model_len))
        {
            return 1;
        }
    }

    return 0;
}


void
ngx_http_kvgate_group_unavailable(ngx_http_kvgate_group_t *g,
    kvg_api_error *err)
{
    u_char      *p, *last;
    ngx_uint_t   i;
    u_char       why[640];

    if (g->n == 1) {
        ngx_http_kvgate_engine_unavailable(g->engines[0], err);
        return;
    }

    p = why;
    last = why + sizeof(why) - 1;

    for (i = 0; i < g->n && p < last; i++) {
        p = ngx_slprintf(p, last, "%s%V: %s", i ? "; " : "",
                         &g->engines[i]->name,
                         ngx_http_kvgate_engine_usable(g->engines[i])
                         ? "up, not serving the model"
                         : ngx_http_kvgate_engine_down_reason(g->engines[i]));
    }

    *p = '\0';

    kvg_api_error_set(err, 503, "engine_unavailable", NULL,
                      "kvgate: no engine of \"%.*s\" is available (%s)",
                      (int) g->name.len, (char *) g->name.data, (char *) why);
}


/* ---- what routing asks of an engine ---- */

/* What the engine publishes (its cache index and statistics page), read
   without locks: a lookup racing the engine's write may be wrong once, which
   only makes one routing choice worse (src/cache_index.h). */

uint64_t
ngx_http_kvgate_engine_load(ngx_http_kvgate_engine_t *w)
{
    if (!ngx_http_kvgate_engine_usable(w) || w->client == NULL) {
        return 0;
    }

    return kvg_client_load(w->client);
}


ngx_int_t
ngx_http_kvgate_engine_read_stats(ngx_http_kvgate_engine_t *w, kvg_stats *st)
{
    if (!ngx_http_kvgate_engine_usable(w) || w->client == NULL) {
        return NGX_DECLINED;
    }

    return kvg_client_stats(w->client, st) == 0 ? NGX_OK : NGX_DECLINED;
}


size_t
ngx_http_kvgate_engine_cached_prefix(ngx_http_kvgate_engine_t *w,
    const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], size_t n)
{
    if (w == NULL || !w->up || w->client == NULL || hashes == NULL) {
        return 0;
    }

    return kvg_client_cached_prefix(w->client, hashes, n);
}
