
/*
 * One completion request (/v1/completions, /v1/chat/completions) in the
 * worker, from the body to the last byte of the answer:
 *
 *   read the body (nginx may have spilled it to a temp file), have it
 *   turned into a parsed request, tokens, block hashes and a route key
 *   (ngx_http_kvgate_prompt.c), check it against the model and this
 *   server's limits, submit it over the shared-memory channel, then park
 *   the request with a deadline timer until the engine's events arrive and
 *   answer it (ngx_http_kvgate_response.c writes the answer).
 *
 * The worker never blocks: submission is a push into a ring (or a short wait
 * in the worker's queue when the ring is full), events come through the
 * engine connection (ngx_http_kvgate_engine.c), which calls this file only
 * through the handlers set in ctx->ereq, as upstream calls a proxy module
 * through ngx_http_upstream_t's. A client that disconnects cancels its
 * request in the engine; a pool cleanup makes sure no request leaves the
 * engine working for a request that no longer exists.
 */


#include "ngx_http_kvgate_module.h"

#include "route.h"
#include "tokenizer.h"


static void ngx_http_kvgate_body_handler(ngx_http_request_t *r);
static void ngx_http_kvgate_body_reading(ngx_http_request_t *r);
static ngx_int_t ngx_http_kvgate_wait_group(ngx_http_kvgate_ctx_t *ctx,
    kvg_api_error *err);
static ngx_uint_t ngx_http_kvgate_model_elsewhere(ngx_http_kvgate_ctx_t *ctx,
    kvg_api_error *err);
static ngx_int_t ngx_http_kvgate_go(ngx_http_kvgate_ctx_t *ctx,
    kvg_api_error *err);
static void ngx_http_kvgate_prompt_done(ngx_http_request_t *r, ngx_int_t rc,
    kvg_api_error *err);
static void ngx_http_kvgate_park(ngx_http_kvgate_ctx_t *ctx);
static ngx_int_t ngx_http_kvgate_sc_prepare(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, kvg_api_error *err);
static ngx_int_t ngx_http_kvgate_prepare(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, kvg_api_error *err);
static ngx_int_t ngx_http_kvgate_submit(ngx_http_kvgate_ctx_t *ctx,
    kvg_api_error *err);
static void ngx_http_kvgate_finish(ngx_http_kvgate_ctx_t *ctx, ngx_int_t rc);
static void ngx_http_kvgate_fail(ngx_http_kvgate_ctx_t *ctx,
    kvg_api_error *err);
static void ngx_http_kvgate_check_broken(ngx_http_request_t *r);
static void ngx_http_kvgate_writer(ngx_http_request_t *r);
static void ngx_http_kvgate_backpressure(ngx_http_kvgate_ctx_t *ctx);
static void ngx_http_kvgate_deadline(ngx_event_t *ev);
static void ngx_http_kvgate_cleanup(void *data);
static uint32_t ngx_http_kvgate_cache_ttl(ngx_http_kvgate_loc_conf_t *klcf,
    const kvg_request *req);
static void ngx_http_kvgate_engine_event(ngx_http_kvgate_engine_req_t *er,
    const kvg_client_event *ev);
static void ngx_http_kvgate_sc_tokens(ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_choice_t *ch, const kvg_client_event *ev);
static ngx_int_t ngx_http_kvgate_sc_tail(ngx_http_request_t *r,
    ngx_http_kvgate_choice_t *ch, const kvg_client_event *ev);
static ngx_int_t ngx_http_kvgate_sc_finished(ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_choice_t *ch, const kvg_client_event *ev,
    kvg_api_error *err);
static ngx_int_t ngx_http_kvgate_engine_retry(
    ngx_http_kvgate_engine_req_t *er);
static ngx_uint_t ngx_http_kvgate_reroute(ngx_http_kvgate_ctx_t *ctx,
    const kvg_client_event *ev);


#if (NGX_DEBUG)

/* the engine's events by kind (kvg_client_event_kind), for debug traces */

static const char  *ngx_http_kvgate_event_names[] = {
    "?", "up", "down", "writable", "accepted", "tokens", "finished", "done",
    "error"
};

#define ngx_http_kvgate_event_name(kind)                                      \
    ((size_t) (kind) < sizeof(ngx_http_kvgate_event_names) / sizeof(char *)  \
     ? ngx_http_kvgate_event_names[kind] : "?")

#endif


static ngx_http_request_body_filter_pt  ngx_http_kvgate_next_body_filter;


ngx_int_t
ngx_http_kvgate_completion_handler(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx)
{
    ngx_int_t            rc;
    kvg_api_error        err;
    ngx_pool_cleanup_t  *cln;

    ctx->group = ((ngx_http_kvgate_loc_conf_t *)
                  ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module))
                 ->group;

    if (!ngx_http_kvgate_group_available(ctx->group)) {

        /* no need to read a body nobody can serve */

        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        ctx->status = NGX_HTTP_SERVICE_UNAVAILABLE;

        return ngx_http_kvgate_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                          "server_error", "engine_unavailable",
                                          "kvgate: the engine is not available",
                                          1);
    }

    /*
     * A body no prompt that fits the context needs is refused before it is
     * read: by its Content-Length here, as it arrives (chunked) in
     * ngx_http_kvgate_request_body_filter. client_max_body_size, when
     * smaller, refuses first (nginx checks it itself).
     */

    ctx->body_limit = ngx_http_kvgate_prompt_body_limit(
                          ngx_http_kvgate_engine_info(
                              ngx_http_kvgate_group_up(ctx->group, NULL, 0)));

    if (ctx->body_limit
        && r->headers_in.content_length_n > ctx->body_limit)
    {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "kvgate: client intended to send a body of %O bytes, "
                      "over the %O a prompt of the engine's context can "
                      "need", r->headers_in.content_length_n,
                      ctx->body_limit);

        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        ngx_http_kvgate_prompt_too_large(r, &err);
        ctx->status = NGX_HTTP_REQUEST_ENTITY_TOO_LARGE;

        return ngx_http_kvgate_send_api_error(r, &err, 0);
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_kvgate_cleanup;
    cln->data = ctx;

    /* non-NULL until the body handler runs (it may run right away) */
    ctx->body_reader = ngx_http_kvgate_body_reading;

    rc = ngx_http_read_client_request_body(r, ngx_http_kvgate_body_handler);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    if (rc == NGX_AGAIN && ctx->body_reader != NULL) {
        /* the body is still coming: see ngx_http_kvgate_body_reading */
        ctx->body_reader = r->read_event_handler;
        r->read_event_handler = ngx_http_kvgate_body_reading;
    }

    return NGX_DONE;
}


/*
 * nginx's body reader, with one difference: a body that stalls past
 * client_body_timeout. nginx finalizes the request with 408 then, and
 * ngx_http_finalize_request() closes the connection without a response for
 * that status (error_page never sees it); the client is answered the OpenAI
 * 408 here instead, and the connection closes after it (the rest of the body
 * is never read).
 */

static void
ngx_http_kvgate_body_reading(ngx_http_request_t *r)
{
    ngx_int_t               rc;
    ngx_http_kvgate_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kvgate_module);

    if (!r->connection->read->timedout) {
        ctx->body_reader(r);
        return;
    }

    ngx_log_error(NGX_LOG_INFO, r->connection->log, NGX_ETIMEDOUT,
                  "kvgate: client timed out sending the request body");

    r->connection->read->timedout = 0;
    r->read_event_handler = ngx_http_block_reading;
    r->keepalive = 0;
    r->lingering_close = 0;

    ctx->status = NGX_HTTP_REQUEST_TIME_OUT;
    ctx->done = 1;

    rc = ngx_http_kvgate_send_error(r, NGX_HTTP_REQUEST_TIME_OUT, NULL,
                                    "timeout", "The request body did not "
                                    "arrive within client_body_timeout", 0);

    ngx_http_finalize_request(r, rc);
}


/*
 * Every request body passes here as nginx reads it (after chunked decoding):
 * a completion's body over its derived limit stops at the first byte past it
 * with 413, which error_page brings back to the location as an OpenAI error
 * (ngx_http_kvgate_prompt_too_large words it).
 */

static ngx_int_t
ngx_http_kvgate_request_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_chain_t            *cl;
    ngx_http_kvgate_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kvgate_module);

    if (ctx == NULL || ctx->body_limit == 0) {
        return ngx_http_kvgate_next_body_filter(r, in);
    }

    for (cl = in; cl; cl = cl->next) {
        ctx->body_read += ngx_buf_size(cl->buf);
    }

    if (ctx->body_read > ctx->body_limit) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "kvgate: client sent a body of more than %O bytes, "
                      "the most a prompt of the engine's context can need",
                      ctx->body_limit);

        r->lingering_close = 1;

        return NGX_HTTP_REQUEST_ENTITY_TOO_LARGE;
    }

    return ngx_http_kvgate_next_body_filter(r, in);
}


ngx_int_t
ngx_http_kvgate_request_init(ngx_conf_t *cf)
{
    ngx_http_kvgate_next_body_filter = ngx_http_top_request_body_filter;
    ngx_http_top_request_body_filter = ngx_http_kvgate_request_body_filter;

    return NGX_OK;
}


/* The request's memory is gone: the engine must not work for it. */

static void
ngx_http_kvgate_cleanup(void *data)
{
    ngx_http_kvgate_ctx_t  *ctx = data;

    ngx_http_kvgate_engine_cancel(&ctx->ereq);

    if (ctx->deadline.timer_set) {
        ngx_del_timer(&ctx->deadline);
    }

    if (ctx->sc) {
        kvg_sc_free(ctx->sc);
        ctx->sc = NULL;
    }

    if (ctx->answer_re) {
        kvg_answer_re_free(ctx->answer_re);
        ctx->answer_re = NULL;
    }

    ngx_http_kvgate_prompt_free(ctx);
}


/* The body is in: once the engine is up, have the prompt parsed and
   tokenized (perhaps in a thread), checked and submitted; then park. */

static void
ngx_http_kvgate_body_handler(ngx_http_request_t *r)
{
    ngx_int_t               rc;
    kvg_api_error           err;
    ngx_http_kvgate_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kvgate_module);

    ctx->body_reader = NULL;

    /* what the engine connection calls back, as upstream's handlers */

    ctx->ereq.event = ngx_http_kvgate_engine_event;
    ctx->ereq.retry = ngx_http_kvgate_engine_retry;
    ctx->ereq.data = ctx;
    ctx->ereq.log = r->connection->log;

    /* a worker whose handshake is still under way (just after a reload)
       holds the request until it is done: the model, the tokenizer and the
       limits the request is parsed and checked against come with it; the
       retry handler goes on then */

    rc = ngx_http_kvgate_wait_group(ctx, &err);

    if (rc == NGX_OK) {
        rc = ngx_http_kvgate_go(ctx, &err);
    }

    if (rc == NGX_ERROR) {
        ngx_http_kvgate_fail(ctx, &err);
        return;
    }

    if (rc == NGX_DONE) {
        /* in a thread: ngx_http_kvgate_prompt_done goes on */
        return;
    }

    if (rc == NGX_AGAIN && ctx->prepared) {
        /* counted once, at the first wait for ring room (a retry is the
           same wait) */
        ngx_http_kvgate_metrics_submit_wait();
    }

    ngx_http_kvgate_park(ctx);
}


/* The prompt task is done (rc NGX_OK) or refused the prompt: check and
   submit it, then park. */

static void
ngx_http_kvgate_prompt_done(ngx_http_request_t *r, ngx_int_t rc,
    kvg_api_error *perr)
{
    kvg_api_error           err;
    ngx_http_kvgate_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kvgate_module);

    if (r->connection->error) {
        /* the client left while its prompt was in a thread */
        ngx_http_kvgate_engine_cancel(&ctx->ereq);
        ctx->status = NGX_HTTP_CLIENT_CLOSED_REQUEST;
        ngx_http_kvgate_finish(ctx, NGX_HTTP_CLIENT_CLOSED_REQUEST);
        return;
    }

    if (rc != NGX_OK) {
        if (!ngx_http_kvgate_model_elsewhere(ctx, perr)) {
            ngx_http_kvgate_fail(ctx, perr);
            return;
        }

        /* tokenized again, for the engine that serves its model */

    } else {
        ctx->parsed = 1;
    }

    rc = ngx_http_kvgate_go(ctx, &err);

    if (rc == NGX_DONE) {
        return;
    }

    if (rc == NGX_ERROR) {
        ngx_http_kvgate_fail(ctx, &err);
        return;
    }

    if (rc == NGX_AGAIN) {
        /* counted once, at the first wait for ring room */
        ngx_http_kvgate_metrics_submit_wait();
    }

    ngx_http_kvgate_park(ctx);
}


/* Parked until the engine answers, the client leaves or time is up (again
   after a prompt task, which had the handlers and the deadline meanwhile). */

static void
ngx_http_kvgate_park(ngx_http_kvgate_ctx_t *ctx)
{
    ngx_http_request_t          *r = ctx->request;
    ngx_http_kvgate_loc_conf_t  *klcf;

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);

    r->read_event_handler = ngx_http_kvgate_check_broken;
    r->write_event_handler = ngx_http_kvgate_writer;

    ctx->deadline.handler = ngx_http_kvgate_deadline;
    ctx->deadline.data = ctx;
    ctx->deadline.log = r->connection->log;

    /* not cancelable: a graceful quit waits for parked requests to finish */

    ngx_add_timer(&ctx->deadline, klcf->timeout);
}


/*
 * Self-consistency: the answer_pattern is compiled (a bad one is a 400
 * before anything reaches the engine) and the wave driver made; the request
 * goes to the engine with its first wave only (kvg_sc_initial), the rest of
 * its n samples are drawn or dropped as the votes come in
 * (ngx_http_kvgate_sc_finished).
 */

static ngx_int_t
ngx_http_kvgate_sc_prepare(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    kvg_api_error *err)
{
    kvg_sc_config       c;
    const kvg_request  *req = ctx->req;

    if (ngx_http_kvgate_answer_compile(r, ctx, err) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ctx->sc) {
        /* prepared again (it waited for the handshake): start afresh */
        kvg_sc_free(ctx->sc);
        ctx->sc = NULL;
    }

    ngx_memzero(&c, sizeof(kvg_sc_config));
    c.vote = req->vote;
    c.n = (unsigned) req->n;
    c.min_samples = req->min_samples > 0 ? (unsigned) req->min_samples : 0;
    c.wave = req->wave > 0 ? (unsigned) req->wave : 0;
    c.agreement = req->agreement;

    ctx->sc = kvg_sc_new(&c);
    if (ctx->sc == NULL) {
        kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
        return NGX_ERROR;
    }

    ctx->sc_drawn = kvg_sc_initial(ctx->sc);

    return NGX_OK;
}


static ngx_int_t
ngx_http_kvgate_prepare(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    kvg_api_error *err)
{
    uint32_t                     room;
    ngx_uint_t                   j;
    const char                  *param;
    const kvg_request           *req;
    const kvg_engine_info       *info;
    ngx_http_kvgate_loc_conf_t  *klcf;

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);

    info = ngx_http_kvgate_engine_info(ctx->ereq.engine);
    if (info == NULL) {
        ngx_http_kvgate_group_unavailable(ctx->group, err);
        return NGX_ERROR;
    }

    /* the engine may have gone (or come back) while a thread tokenized */

    req = ctx->req;
    param = req->endpoint == KVG_ENDPOINT_COMPLETIONS ? "prompt" : "messages";

    if (req->n > klcf->max_n || (uint32_t) req->n > info->max_n) {
        kvg_api_error_set(err, 400, "integer_above_max_value", "n",
                          "Invalid 'n': %d is greater than the maximum of %ld "
                          "on this server.", req->n,
                          (long) (klcf->max_n < (ngx_int_t) info->max_n
                                  ? klcf->max_n : (ngx_int_t) info->max_n));
        return NGX_ERROR;
    }

    if (req->top_logprobs > 0) {
        kvg_api_error_set(err, 400, "unsupported_parameter",
                          req->endpoint == KVG_ENDPOINT_CHAT ? "top_logprobs"
                                                             : "logprobs",
                          "Alternatives per token are not supported here; "
                          "ask for the chosen tokens' logprobs only (%s).",
                          req->endpoint == KVG_ENDPOINT_CHAT
                          ? "logprobs: true, top_logprobs: 0" : "logprobs: 0");
        return NGX_ERROR;
    }

    if (ctx->n_tokens == 0) {
        kvg_api_error_set(err, 400, "invalid_value", param,
                          "The prompt is empty after tokenization.");
        return NGX_ERROR;
    }

    if (ctx->n_tokens >= info->context_length) {
        kvg_api_error_set(err, 400, "context_length_exceeded", param,
                          "This model's maximum context length is %u tokens. "
                          "However, your prompt resulted in %zu tokens, which "
                          "leaves no room for a completion.",
                          info->context_length, ctx->n_tokens);
        return NGX_ERROR;
    }

    room = info->context_length - (uint32_t) ctx->n_tokens;

    if (req->has_max_tokens) {
        if (klcf->max_tokens && req->max_tokens > klcf->max_tokens) {
            kvg_api_error_set(err, 400, "integer_above_max_value",
                              "max_tokens",
                              "Invalid 'max_tokens': %d is greater than the "
                              "maximum of %ld on this server.",
                              req->max_tokens, (long) klcf->max_tokens);
            return NGX_ERROR;
        }

        if ((uint32_t) req->max_tokens > room) {
            kvg_api_error_set(err, 400, "context_length_exceeded",
                              "max_tokens",
                              "This model's maximum context length is %u "
                              "tokens. However, you requested %zu tokens (%zu "
                              "in the prompt, %d in the completion).",
                              info->context_length,
                              ctx->n_tokens + (size_t) req->max_tokens,
                              ctx->n_tokens, req->max_tokens);
            return NGX_ERROR;
        }

        ctx->max_tokens = (uint32_t) req->max_tokens;

    } else {
        ctx->max_tokens = room;

        if (klcf->max_tokens && (uint32_t) klcf->max_tokens < room) {
            ctx->max_tokens = (uint32_t) klcf->max_tokens;
        }
    }

    ctx->n_choices = (ngx_uint_t) req->n;
    ctx->choices = ngx_pcalloc(r->pool, ctx->n_choices
                                        * sizeof(ngx_http_kvgate_choice_t));
    if (ctx->choices == NULL) {
        kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
        return NGX_ERROR;
    }

    for (j = 0; j < ctx->n_choices; j++) {
        ctx->choices[j].finish_reason = KVG_MSG_FINISH_STOP;
        ctx->choices[j].stop_sequence = -1;
    }

    if (req->has_vote && ngx_http_kvgate_sc_prepare(r, ctx, err) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->created = ngx_time();
    ctx->id_len = ngx_sprintf(ctx->id, "%s%08xD%08xD%08xD",
                              req->endpoint == KVG_ENDPOINT_CHAT ? "chatcmpl-"
                              : req->endpoint == KVG_ENDPOINT_MESSAGES ? "msg_"
                              : "cmpl-",
                              (uint32_t) ngx_random(), (uint32_t) ngx_random(),
                              (uint32_t) ngx_random())
                  - ctx->id;

    return NGX_OK;
}


/* cache_control's holds: the full blocks before each breakpoint, for its TTL
   (at most kvgate_cache_ttl_max) */

static void
ngx_http_kvgate_holds(ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_loc_conf_t *klcf, kvg_client_req *q)
{
    size_t                  i, nb;
    ngx_msec_t              ms;
    const kvg_engine_info  *info;

    info = ngx_http_kvgate_engine_info(ctx->ereq.engine);

    if (ctx->bypass || info == NULL || info->block_tokens == 0) {
        return;
    }

    for (i = 0; i < ctx->n_breakpoints; i++) {
        nb = ngx_min(ctx->bp_tokens[i] / info->block_tokens, ctx->n_hashes);
        ms = ngx_min((ngx_msec_t) ctx->bp_ttl_s[i] * 1000, klcf->cache_ttl_max);

        if (nb == 0 || ms == 0) {
            continue;
        }

        q->hold_blocks[q->n_holds] = (uint32_t) nb;
        q->hold_ms[q->n_holds++] = (uint32_t) ms;
    }
}


static ngx_int_t
ngx_http_kvgate_submit(ngx_http_kvgate_ctx_t *ctx, kvg_api_error *err)
{
    kvg_client_req               q;
    const kvg_request           *req = ctx->req;
    ngx_http_kvgate_loc_conf_t  *klcf;

    klcf = ngx_http_get_module_loc_conf(ctx->request, ngx_http_kvgate_module);

    ngx_memzero(&q, sizeof(kvg_client_req));

    q.salt = ctx->salt.data;
    q.salt_len = ctx->salt.len;
    q.tokens = ctx->tokens;
    q.n_tokens = ctx->n_tokens;
    q.hashes = (const uint8_t (*)[KVG_PREFIX_HASH_LEN]) ctx->hashes;
    q.n_hashes = ctx->n_hashes;
    q.bypass = (int) ctx->bypass;
    q.bucket = (unsigned) ctx->bucket;
    q.temperature = (float) req->temperature;
    q.top_p = (float) req->top_p;
    q.top_k = req->top_k > 0 ? (unsigned) req->top_k : 0;

    /* without a seed every request draws its own (as OpenAI does) */

    q.seed = req->has_seed ? (uint64_t) req->seed
                           : ((uint64_t) ngx_random() << 32) ^ ngx_random();
    q.n = (unsigned) req->n;
    q.max_tokens = ctx->max_tokens;
    q.stop_ids = ctx->stop_ids;
    q.n_stop_ids = ctx->n_stop_ids;
    q.stop = ctx->stop;
    q.stop_len = ctx->stop_len;
    q.n_stop = ctx->n_stop;
    q.cache_ttl_ms = ngx_http_kvgate_cache_ttl(klcf, req);
    ngx_http_kvgate_holds(ctx, klcf, &q);

    /* the engine gives up a little after the gateway does */

    q.deadline_ms = (uint32_t) (klcf->timeout + 1000);
    q.logprobs = req->has_logprobs;

    if (ctx->sc) {
        /* the first wave; a logprob vote needs every token's logprob (the
           client gets them only when it asked) */
        q.n_active = kvg_sc_initial(ctx->sc);

        if (req->vote == KVG_VOTE_LOGPROB) {
            q.logprobs = 1;
        }
    }

    ngx_log_debug7(NGX_LOG_DEBUG_HTTP, ctx->request->connection->log, 0,
                   "kvgate: submit \"%V\"%s %uz tokens, %uz block hashes, "
                   "bucket %ui, bypass %ui, max_tokens %uD",
                   &ctx->tenant, ctx->default_tenant ? " (default)" : "",
                   ctx->n_tokens, ctx->n_hashes, ctx->bucket,
                   ctx->bypass, ctx->max_tokens);

    return ngx_http_kvgate_engine_submit(&ctx->ereq, &q, err);
}


/*
 * Waits for the group: NGX_OK when one of its engines is up (it becomes the
 * one the prompt is tokenized for), NGX_AGAIN when none is but one has its
 * handshake under way (the request waits in that engine's queue), NGX_ERROR
 * (503) otherwise.
 */

static ngx_int_t
ngx_http_kvgate_wait_group(ngx_http_kvgate_ctx_t *ctx, kvg_api_error *err)
{
    ngx_http_kvgate_engine_t  *e;

    e = ngx_http_kvgate_group_up(ctx->group, NULL, 0);

    if (e != NULL) {
        ctx->ereq.engine = e;
        return NGX_OK;
    }

    e = ngx_http_kvgate_group_handshaking(ctx->group);

    if (e == NULL) {
        ngx_http_kvgate_group_unavailable(ctx->group, err);
        return NGX_ERROR;
    }

    ctx->ereq.engine = e;

    return ngx_http_kvgate_engine_wait_up(&ctx->ereq, err);
}


/*
 * The prompt was refused for its model by the engine it was tokenized for:
 * another engine of the group may serve that model (tokenize again for it:
 * 1), or one that did is down (503), or none does (the 404 stands).
 */

static ngx_uint_t
ngx_http_kvgate_model_elsewhere(ngx_http_kvgate_ctx_t *ctx,
    kvg_api_error *err)
{
    ngx_http_kvgate_engine_t  *e;

    if (err->status != 404 || ctx->req == NULL) {
        return 0;
    }

    e = ngx_http_kvgate_group_up(ctx->group, ctx->req->model,
                                 ctx->req->model_len);

    if (e != NULL && e != ctx->ereq.engine) {
        ngx_http_kvgate_prompt_free(ctx);
        ctx->ereq.engine = e;
        return 1;
    }

    if (ngx_http_kvgate_group_seen(ctx->group, ctx->req->model,
                                   ctx->req->model_len))
    {
        ngx_http_kvgate_group_unavailable(ctx->group, err);
    }

    return 0;
}


/* The TTL of the blocks a request fills: the location's kvgate_cache_ttl
   (0: the engine's default), or the retention the client asked for
   (prompt_cache_retention "24h"), at most kvgate_cache_ttl_max. */

static uint32_t
ngx_http_kvgate_cache_ttl(ngx_http_kvgate_loc_conf_t *klcf,
    const kvg_request *req)
{
    ngx_msec_t  ttl;

    if (req->cache_retention_s == 0) {
        return (uint32_t) klcf->cache_ttl;
    }

    ttl = (ngx_msec_t) req->cache_retention_s * 1000;

    if (ttl > klcf->cache_ttl_max) {
        ttl = klcf->cache_ttl_max;
    }

    if (ttl < klcf->cache_ttl) {
        ttl = klcf->cache_ttl;
    }

    return (uint32_t) ttl;
}


/* The route key of a prompt_cache_key: FNV-1a over the tenant, a separator
   and the key (the tenant's, so that equal keys of two tenants do not
   group), mixed by the route's rendezvous score. */

static uint64_t
ngx_http_kvgate_affinity_key(const ngx_str_t *tenant, const char *key,
    size_t len)
{
    size_t    i;
    uint64_t  h;

    h = 0xcbf29ce484222325ULL;

    for (i = 0; i < tenant->len; i++) {
        h = (h ^ tenant->data[i]) * 0x100000001b3ULL;
    }

    h = (h ^ 0xff) * 0x100000001b3ULL;

    for (i = 0; i < len; i++) {
        h = (h ^ (u_char) key[i]) * 0x100000001b3ULL;
    }

    return h;
}


/* Routes the parsed request: the engines of its group that are up and not
   stalled, serve the model it was tokenized for and have not failed it, by
   their cached prefix and load (a stalled engine's load, which it publishes
   itself, stands still at its last value: it is no candidate at all). NGX_OK
   with ctx->ereq.engine set, or NGX_ERROR. */

static ngx_int_t
ngx_http_kvgate_route(ngx_http_kvgate_ctx_t *ctx, kvg_api_error *err)
{
    int                        k;
    size_t                     cached;
    uint64_t                   key;
    ngx_uint_t                 i, short_context;
    kvg_route_policy           policy;
    kvg_route_reason           why;
    ngx_http_kvgate_group_t   *g = ctx->group;
    ngx_http_kvgate_engine_t  *e;
    const kvg_engine_info     *info;
    kvg_route_cand             cands[NGX_HTTP_KVGATE_MAX_ENGINES];

    short_context = 0;

    for (i = 0; i < g->n; i++) {
        e = g->engines[i];
        info = ngx_http_kvgate_engine_info(e);

        ngx_memzero(&cands[i], sizeof(kvg_route_cand));
        cands[i].id = e->id;

        if (info == NULL || (ctx->failed & (1u << i))
            || ngx_http_kvgate_engine_stalled(e)
            || ngx_memcmp(info->model_id, ctx->model_id, KVG_PREFIX_HASH_LEN)
               != 0)
        {
            continue;
        }

        /* engines of one model may run with different --context: only those
           with room for the prompt and the max_tokens asked for */

        if (info->context_length <= ctx->n_tokens
            || (ctx->req->has_max_tokens
                && info->context_length - ctx->n_tokens
                   < (size_t) ctx->req->max_tokens))
        {
            cands[i].eligible = 2;
            short_context = 1;
            continue;
        }

        cands[i].eligible = 1;
        cached = ngx_http_kvgate_engine_cached_prefix(e,
                     (const uint8_t (*)[KVG_PREFIX_HASH_LEN]) ctx->hashes,
                     ctx->n_hashes);
        cands[i].cached_blocks = (uint32_t) cached;
        cands[i].cached_tokens = (uint64_t) cached * info->block_tokens;
        cands[i].load = ngx_http_kvgate_engine_load(e);
    }

    /* none has room: any of them, whose limits then answer 400
       context_length_exceeded */

    for (i = 0; short_context && i < g->n; i++) {
        if (cands[i].eligible == 1) {
            short_context = 0;
        }
    }

    for (i = 0; i < g->n; i++) {
        cands[i].eligible = cands[i].eligible == 1
                            || (short_context && cands[i].eligible == 2);
    }

    /* the route key's first 16 hex digits */

    key = 0;

    for (i = 0; i < 16 && ctx->route_key_set; i++) {
        key = (key << 4)
              | (uint64_t) ngx_hextoi(&ctx->route_key[i], 1);
    }

    policy = (kvg_route_policy) g->policy;

    if (ctx->req->prompt_cache_key != NULL
        && (policy == KVG_ROUTE_PREFIX || policy == KVG_ROUTE_HASH))
    {
        /* prompt_cache_key: the client groups requests whose shared prefix
           may still be being computed; one engine per (tenant, key) by
           rendezvous hashing, under the same load cap */

        key = ngx_http_kvgate_affinity_key(&ctx->tenant,
                                           ctx->req->prompt_cache_key,
                                           ctx->req->prompt_cache_key_len);
        policy = KVG_ROUTE_HASH;
    }

    k = kvg_route_pick(policy, cands, g->n, key,
                       ctx->n_tokens, g->balance_factor, &g->rr, &why);

    if (k < 0) {
        ngx_http_kvgate_group_unavailable(g, err);
        return NGX_ERROR;
    }

    ctx->ereq.engine = g->engines[k];
    ctx->route_reason = why;
    ctx->routed = 1;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, ctx->request->connection->log, 0,
                   "kvgate: routed to engine \"%V\" (%ui cached blocks): %s",
                   &g->engines[k]->name, (ngx_uint_t) cands[k].cached_blocks,
                   kvg_route_reason_name(why));

    ngx_http_kvgate_metrics_route(g->engines[k]->index, (ngx_uint_t) why);

    return NGX_OK;
}


/* The engine the request was routed to is gone: it may go to another. */

static void
ngx_http_kvgate_route_failed(ngx_http_kvgate_ctx_t *ctx)
{
    ngx_uint_t  i;

    for (i = 0; i < ctx->group->n; i++) {
        if (ctx->group->engines[i] == ctx->ereq.engine) {
            ctx->failed |= 1u << i;
        }
    }

    ctx->routed = 0;
}


/*
 * The engine went away under a request (its connection was lost, it is
 * shutting down: a 503 of the engine, or it stalled: the 503 this worker
 * gives each request it held, kvgate_engine_stall) before the request had a
 * token from it: nothing of the answer depends on that engine yet, so
 * another engine of the group that serves the same model takes it, as if it
 * had been routed there first (the prompt is parsed, tokenized and hashed
 * already). A stream whose headers went out goes on: its usage reports the
 * new engine's counts. Returns 1 when the request went on or was answered, 0
 * to answer the engine's error as it is.
 */

static ngx_uint_t
ngx_http_kvgate_reroute(ngx_http_kvgate_ctx_t *ctx, const kvg_client_event *ev)
{
    ngx_int_t                  rc;
    kvg_api_error              err;
    ngx_http_kvgate_engine_t  *lost;

    if (ev->status != 503 || ctx->ttft_us >= 0 || !ctx->routed
        || ctx->group == NULL || ctx->group->n < 2)
    {
        return 0;
    }

    lost = ctx->ereq.engine;
    ngx_http_kvgate_route_failed(ctx);

    rc = ngx_http_kvgate_go(ctx, &err);

    if (rc == NGX_ERROR) {
        /* no other engine can take it: what happened to it, then why none
           of the others can (the group's list still shows the engine just
           lost as it was) */

        if (err.status == 503 && err.code
            && ngx_strcmp(err.code, "engine_unavailable") == 0)
        {
            kvg_api_error_set(&err, 503, "engine_unavailable", NULL,
                              "kvgate: engine \"%.*s\" failed the request "
                              "(%s) and no other engine of \"%.*s\" can take "
                              "it", (int) lost->name.len,
                              (char *) lost->name.data, ev->message,
                              (int) ctx->group->name.len,
                              (char *) ctx->group->name.data);
        }

        ngx_http_kvgate_fail(ctx, &err);
        return 1;
    }

    ngx_log_error(NGX_LOG_WARN, ctx->request->connection->log, 0,
                  "kvgate: engine \"%V\" failed the request before its first "
                  "token (%s): sent to engine \"%V\" instead",
                  &lost->name, ev->message, &ctx->ereq.engine->name);

    return 1;
}


/* Checks the request against the engine (once) and submits it. */

static ngx_int_t
ngx_http_kvgate_go(ngx_http_kvgate_ctx_t *ctx, kvg_api_error *err)
{
    ngx_int_t                    rc;
    const kvg_engine_info       *info;
    ngx_http_request_t          *r = ctx->request;
    ngx_http_kvgate_loc_conf_t  *klcf;

    while (!ctx->parsed) {
        klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);

        if (ctx->ereq.engine == NULL
            || !ngx_http_kvgate_engine_up(ctx->ereq.engine))
        {
            ctx->ereq.engine = ngx_http_kvgate_group_up(ctx->group, NULL, 0);
        }

        info = ctx->ereq.engine
               ? ngx_http_kvgate_engine_info(ctx->ereq.engine) : NULL;
        if (info == NULL) {
            ngx_http_kvgate_group_unavailable(ctx->group, err);
            return NGX_ERROR;
        }

        ngx_memcpy(ctx->model_id, info->model_id, KVG_PREFIX_HASH_LEN);

        rc = ngx_http_kvgate_prompt_start(r, ctx, klcf, info,
                                          ngx_http_kvgate_prompt_done, err);

        if (rc == NGX_AGAIN) {
            return NGX_DONE;
        }

        if (rc != NGX_OK) {
            if (ngx_http_kvgate_model_elsewhere(ctx, err)) {
                continue;
            }

            return NGX_ERROR;
        }

        ctx->parsed = 1;
    }

    for ( ;; ) {

        if (!ctx->routed
            || !ngx_http_kvgate_engine_usable(ctx->ereq.engine))
        {
            if (ctx->routed) {
                ngx_http_kvgate_route_failed(ctx);
            }

            if (ngx_http_kvgate_route(ctx, err) != NGX_OK) {
                return NGX_ERROR;
            }
        }

        if (!ctx->prepared) {
            if (ngx_http_kvgate_prepare(r, ctx, err) != NGX_OK) {
                return NGX_ERROR;
            }

            /* the token budget: refused before it reaches the engine */

            rc = ngx_http_kvgate_limit_admit(r, ctx, err);

            if (rc == NGX_DECLINED) {
                return NGX_ERROR;
            }

            if (rc != NGX_OK) {
                kvg_api_error_set(err, 500, NULL, NULL,
                                  "The token budget could not be checked");
                return NGX_ERROR;
            }

            ctx->prepared = 1;
        }

        rc = ngx_http_kvgate_submit(ctx, err);

        if (rc == NGX_ERROR && err->status == 503
            && !ngx_http_kvgate_engine_usable(ctx->ereq.engine))
        {
            /* it went down (or stalled) under the request: a miss, not an
               error, while another engine can take it */
            ngx_http_kvgate_route_failed(ctx);
            continue;
        }

        return rc;
    }
}


/* The engine connection's retry handler: the ring has room again, or the
   handshake the request waited for is over (done, failed or too slow). */

static ngx_int_t
ngx_http_kvgate_engine_retry(ngx_http_kvgate_engine_req_t *er)
{
    ngx_int_t               rc;
    ngx_uint_t              prepared;
    kvg_api_error           err;
    ngx_http_kvgate_ctx_t  *ctx = er->data;

    prepared = ctx->prepared;

    rc = ngx_http_kvgate_go(ctx, &err);

    if (rc == NGX_AGAIN && !prepared) {
        /* it waited for the handshake; now its first wait for ring room */
        ngx_http_kvgate_metrics_submit_wait();
    }

    if (rc == NGX_ERROR) {
        /* answered: the request (and ctx) may be gone now */
        ngx_http_kvgate_fail(ctx, &err);
    }

    if (rc == NGX_DONE) {
        /* it waited for the handshake and its prompt went to a thread:
           out of the queue, the others may go on */
        return NGX_OK;
    }

    return rc;
}


/* ---- answering ---- */

static void
ngx_http_kvgate_finish(ngx_http_kvgate_ctx_t *ctx, ngx_int_t rc)
{
    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = ctx->request;
    c = r->connection;

    ctx->done = 1;

    if (ctx->deadline.timer_set) {
        ngx_del_timer(&ctx->deadline);
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "kvgate: finalize rc:%i status:%ui engine request %uL",
                   rc, ctx->status, ctx->ereq.id);

    ngx_http_finalize_request(r, rc);
    ngx_http_run_posted_requests(c);
}


/* Answers with an error: a JSON error response, or, when the stream has
   begun, an error event that ends it. */

static void
ngx_http_kvgate_fail(ngx_http_kvgate_ctx_t *ctx, kvg_api_error *err)
{
    ngx_int_t            rc;
    ngx_http_request_t  *r = ctx->request;

    ngx_http_kvgate_engine_cancel(&ctx->ereq);

    if (ctx->done) {
        return;
    }

    if (ctx->header_sent) {
        rc = ngx_http_kvgate_stream_end(r, ctx, err);

    } else {
        ctx->status = err->status;
        rc = ngx_http_kvgate_send_api_error(r, err,
                 ctx->limit_retry ? ctx->limit_retry
                                  : ngx_http_kvgate_retry_after(err->status));
    }

    ngx_http_kvgate_finish(ctx, rc);
}


static ngx_int_t
ngx_http_kvgate_add_text(ngx_http_request_t *r, ngx_http_kvgate_choice_t *ch,
    const kvg_client_event *ev, ngx_uint_t keep_logprobs)
{
    size_t     nc;
    u_char    *p;
    uint32_t  *ids;
    float     *lps;

    if (ch->len + ev->text_len > ch->cap) {
        nc = ch->cap ? ch->cap * 2 : 256;

        while (nc < ch->len + ev->text_len) {
            nc *= 2;
        }

        p = ngx_pnalloc(r->pool, nc);
        if (p == NULL) {
            return NGX_ERROR;
        }

        if (ch->len) {
            ngx_memcpy(p, ch->text, ch->len);
        }

        ch->text = p;
        ch->cap = nc;
    }

    if (ev->text_len) {
        ngx_memcpy(ch->text + ch->len, ev->text, ev->text_len);
        ch->len += ev->text_len;
    }

    if (ev->logprobs == NULL || ev->n_tokens == 0 || !keep_logprobs) {
        return NGX_OK;
    }

    if (ch->n_ids + ev->n_tokens > ch->ids_cap) {
        nc = ch->ids_cap ? ch->ids_cap * 2 : 64;

        while (nc < ch->n_ids + ev->n_tokens) {
            nc *= 2;
        }

        ids = ngx_palloc(r->pool, nc * sizeof(uint32_t));
        lps = ngx_palloc(r->pool, nc * sizeof(float));
        if (ids == NULL || lps == NULL) {
            return NGX_ERROR;
        }

        if (ch->n_ids) {
            ngx_memcpy(ids, ch->ids, ch->n_ids * sizeof(uint32_t));
            ngx_memcpy(lps, ch->lps, ch->n_ids * sizeof(float));
        }

        ch->ids = ids;
        ch->lps = lps;
        ch->ids_cap = nc;
    }

    ngx_memcpy(ch->ids + ch->n_ids, ev->tokens, ev->n_tokens * sizeof(uint32_t));
    ngx_memcpy(ch->lps + ch->n_ids, ev->logprobs, ev->n_tokens * sizeof(float));
    ch->n_ids += ev->n_tokens;

    return NGX_OK;
}


/*
 * /v1/messages answers which of its stop_sequences ended a sample. The
 * engine says only "stop" (an end-of-turn id, or a stop string); it holds
 * back text that may be the start of a stop string and drops the match, so
 * the sample's tokens decode to its visible text followed by the stop
 * sequence that matched, and to exactly its visible text otherwise. The ids
 * are kept for that (only when the request has stop sequences).
 */

static ngx_int_t
ngx_http_kvgate_keep_ids(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_choice_t *ch, const kvg_client_event *ev)
{
    size_t     nc;
    uint32_t  *ids;

    ch->visible += ev->text_len;

    if (ctx->req->n_stop == 0 || ev->n_tokens == 0) {
        return NGX_OK;
    }

    if (ch->n_ids + ev->n_tokens > ch->ids_cap) {
        nc = ch->ids_cap ? ch->ids_cap * 2 : 64;

        while (nc < ch->n_ids + ev->n_tokens) {
            nc *= 2;
        }

        ids = ngx_palloc(r->pool, nc * sizeof(uint32_t));
        if (ids == NULL) {
            return NGX_ERROR;
        }

        if (ch->n_ids) {
            ngx_memcpy(ids, ch->ids, ch->n_ids * sizeof(uint32_t));
        }

        ch->ids = ids;
        ch->ids_cap = nc;
    }

    ngx_memcpy(ch->ids + ch->n_ids, ev->tokens,
               ev->n_tokens * sizeof(uint32_t));
    ch->n_ids += ev->n_tokens;

    return NGX_OK;
}


static void
ngx_http_kvgate_find_stop_sequence(ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_choice_t *ch)
{
    long                    n;
    char                   *text, *p;
    size_t                  len, cap, rest, i, tl;
    kvg_detok               dt;
    const kvg_request      *req = ctx->req;
    const kvg_engine_info  *info;

    if (req->n_stop == 0 || ch->n_ids == 0
        || ch->finish_reason != KVG_MSG_FINISH_STOP)
    {
        return;
    }

    info = ngx_http_kvgate_engine_info(ctx->ereq.engine);
    if (info == NULL || info->tokenizer == NULL) {
        return;
    }

    /* decoded as the engine does a continuation (engine/scheduler.c): token
       by token, its leading space kept; only the text past the visible
       bytes matters, so at most the visible bytes and the longest stop
       sequence are decoded */

    cap = ch->visible + KVG_PROTO_MAX_STOP_LEN + 64;
    text = ngx_alloc(cap, ngx_cycle->log);
    if (text == NULL) {
        return;
    }

    kvg_detok_init(&dt, info->tokenizer);
    dt.at_start = 0;
    len = 0;

    for (i = 0; i < ch->n_ids && len < ch->visible + KVG_PROTO_MAX_STOP_LEN;
         i++)
    {
        if (kvg_tokenizer_token_bytes(info->tokenizer, (int32_t) ch->ids[i],
                                      &tl)
            == NULL)
        {
            break;
        }

        /* kvg_detok_push's room for any token (tokenizer.h) */

        if (cap - len < 3 * (tl + 4)) {
            cap = len + 3 * (tl + 4) + cap;
            p = ngx_alloc(cap, ngx_cycle->log);
            if (p == NULL) {
                break;
            }

            ngx_memcpy(p, text, len);
            ngx_free(text);
            text = p;
        }

        n = kvg_detok_push(&dt, (int32_t) ch->ids[i], text + len, cap - len);
        if (n < 0) {
            break;
        }

        len += (size_t) n;
    }

    if (len > ch->visible) {
        rest = len - ch->visible;

        for (i = 0; i < req->n_stop; i++) {
            if (req->stop_len[i] <= rest
                && ngx_memcmp(text + ch->visible, req->stop[i],
                              req->stop_len[i]) == 0)
            {
                ch->stop_sequence = (ngx_int_t) i;
                break;
            }
        }
    }

    ngx_free(text);
}


/* ---- self-consistency ---- */

/* A sample's logprobs add up to the mean that weighs its vote. */

static void
ngx_http_kvgate_sc_tokens(ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_choice_t *ch, const kvg_client_event *ev)
{
    uint32_t  i;

    if (ev->logprobs == NULL) {
        return;
    }

    for (i = 0; i < ev->n_tokens; i++) {
        ch->lp_sum += ev->logprobs[i];
    }

    ch->lp_n += ev->n_tokens;
}


/*
 * A streamed sample's text is not kept for an answer object; only its end,
 * where the answer is looked for (the last NGX_HTTP_KVGATE_SC_TAIL bytes, in
 * a buffer of twice that, so a cut is a copy every TAIL bytes at most):
 * memory stays bounded however long the samples run.
 */

static ngx_int_t
ngx_http_kvgate_sc_tail(ngx_http_request_t *r, ngx_http_kvgate_choice_t *ch,
    const kvg_client_event *ev)
{
    size_t         n, keep;
    const u_char  *text;

    if (ch->text == NULL) {
        ch->cap = 2 * NGX_HTTP_KVGATE_SC_TAIL;
        ch->text = ngx_pnalloc(r->pool, ch->cap);
        if (ch->text == NULL) {
            return NGX_ERROR;
        }
    }

    text = (const u_char *) ev->text;
    n = ev->text_len;

    if (n > NGX_HTTP_KVGATE_SC_TAIL) {
        text += n - NGX_HTTP_KVGATE_SC_TAIL;
        n = NGX_HTTP_KVGATE_SC_TAIL;
    }

    if (ch->len + n > ch->cap) {
        keep = ch->len < NGX_HTTP_KVGATE_SC_TAIL ? ch->len
                                                 : NGX_HTTP_KVGATE_SC_TAIL;
        ngx_memmove(ch->text, ch->text + ch->len - keep, keep);
        ch->len = keep;
    }

    if (n) {
        ngx_memcpy(ch->text + ch->len, text, n);
        ch->len += n;
    }

    return NGX_OK;
}


/*
 * A sample finished: its answer votes (a cancelled one does not), and what
 * the wave driver decides goes to the engine: the next wave when nothing
 * runs and the vote is open, or, once it is decided, the cancel of every
 * sample still running or not drawn yet. NGX_DECLINED with *err set when
 * the answer_pattern ran out of its budget on this sample.
 */

static ngx_int_t
ngx_http_kvgate_sc_finished(ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_choice_t *ch, const kvg_client_event *ev,
    kvg_api_error *err)
{
    char              answer[NGX_HTTP_KVGATE_SC_ANSWER_MAX];
    size_t            len, tlen;
    u_char           *text;
    double            mean;
    ngx_int_t         rc;
    ngx_uint_t        drawn, cancelled;
    kvg_sc_action     act;

    if (ev->sample >= ctx->sc_drawn) {
        /* dropped undrawn */
        return NGX_OK;
    }

    cancelled = ev->finish_reason == KVG_MSG_FINISH_CANCELLED;
    len = 0;

    if (!cancelled) {
        /* the same end of the text, streamed or not: the last
           NGX_HTTP_KVGATE_SC_TAIL bytes, from a character's start */

        text = ch->text;
        tlen = ch->len;

        if (tlen > NGX_HTTP_KVGATE_SC_TAIL) {
            text += tlen - NGX_HTTP_KVGATE_SC_TAIL;
            tlen = NGX_HTTP_KVGATE_SC_TAIL;

            while (tlen && (*text & 0xc0) == 0x80) {
                text++;
                tlen--;
            }
        }

        if (ngx_http_kvgate_answer_extract(ctx, text, tlen, answer,
                                           sizeof(answer), &len, err)
            != NGX_OK)
        {
            /* the pattern ran out of its budget: no silent vote without
               this sample, the request is refused */
            ngx_log_error(NGX_LOG_INFO, ctx->request->connection->log, 0,
                          "kvgate: sample %uD: %s", ev->sample, err->message);
            ctx->answer_refused = 1;
            return NGX_DECLINED;
        }
    }

    mean = ch->lp_n ? ch->lp_sum / ch->lp_n : 0.0;

    ngx_memzero(&act, sizeof(kvg_sc_action));
    kvg_sc_finished(ctx->sc, ev->sample, len ? answer : NULL, len, mean,
                    (int) cancelled, &act);

    ngx_log_debug6(NGX_LOG_DEBUG_HTTP, ctx->request->connection->log, 0,
                   "kvgate: sample %uD answered \"%*s\"%s, mean logprob %.4f"
                   ": draw %ud",
                   ev->sample, len, answer, cancelled ? " (cancelled)" : "",
                   mean, act.draw);
    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ctx->request->connection->log, 0,
                   "kvgate: cancel %08xD, decided %d", act.cancel_mask,
                   act.decided);

    if (act.draw == 0 && act.cancel_mask == 0) {
        return NGX_OK;
    }

    drawn = ctx->sc_drawn;
    ctx->sc_drawn = kvg_sc_samples_run(ctx->sc);

    (void) ngx_http_kvgate_engine_samples(&ctx->ereq, act.draw,
                                         act.cancel_mask);

    if (ctx->req->stream && ctx->sc_drawn > drawn) {
        rc = ngx_http_kvgate_stream_roles(ctx->request, ctx, drawn,
                                          ctx->sc_drawn);
        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* The engine connection's event handler: one event for this request. */

static void
ngx_http_kvgate_engine_event(ngx_http_kvgate_engine_req_t *er,
    const kvg_client_event *ev)
{
    ngx_int_t                    rc;
    struct timeval               tv;
    kvg_api_error                err;
    ngx_http_request_t          *r;
    ngx_http_kvgate_ctx_t       *ctx;
    const kvg_engine_info       *info;
    ngx_http_kvgate_choice_t    *ch;

    ctx = er->data;
    r = ctx->request;

    ngx_log_debug5(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "kvgate: engine event \"%s\" for request %uL: sample %uD, "
                   "%uD tokens%s",
                   ngx_http_kvgate_event_name(ev->kind), ev->id, ev->sample,
                   ev->n_tokens, ctx->done ? ", already answered" : "");

    if (ctx->done) {
        return;
    }

    switch (ev->kind) {

    case KVG_CEV_ACCEPTED:
        info = ngx_http_kvgate_engine_info(ctx->ereq.engine);
        ctx->prompt_tokens = ev->prompt_tokens;
        ctx->cached_tokens = ev->cached_tokens;
        ctx->cache_status = kvg_cache_status((int) ctx->bypass,
                                             ev->prompt_tokens,
                                             ev->cached_tokens,
                                             info ? info->block_tokens : 16);

        /* a stream opens here, once: after a reroute the next engine's
           ACCEPTED only updates the counts the final usage reports */

        if (ctx->req->stream && !ctx->header_sent) {
            ctx->status = NGX_HTTP_OK;
            rc = ngx_http_kvgate_stream_start(r, ctx);

            if (rc == NGX_ERROR || rc > NGX_OK) {
                ngx_http_kvgate_engine_cancel(&ctx->ereq);
                ngx_http_kvgate_finish(ctx, rc);
                return;
            }

            ngx_http_kvgate_backpressure(ctx);
        }

        return;

    case KVG_CEV_TOKENS:
        if (ctx->ttft_us < 0) {
            ngx_gettimeofday(&tv);
            ctx->ttft_us = (ngx_int_t) ((tv.tv_sec - ctx->start_tv.tv_sec)
                                        * 1000000
                                        + (tv.tv_usec - ctx->start_tv.tv_usec));
        }

        if (ev->sample >= ctx->n_choices) {
            return;
        }

        ngx_http_kvgate_limit_tokens(ctx, ev->n_tokens);

        if (ctx->sc) {
            ngx_http_kvgate_sc_tokens(ctx, &ctx->choices[ev->sample], ev);
        }

        if (ctx->req->stream) {
            rc = ngx_http_kvgate_stream_tokens(r, ctx, ev);

            if (rc != NGX_ERROR && ctx->sc) {
                rc = ngx_http_kvgate_sc_tail(r, &ctx->choices[ev->sample],
                                             ev);
            }

        } else {
            rc = ngx_http_kvgate_add_text(r, &ctx->choices[ev->sample], ev,
                                          (ngx_uint_t) ctx->req->has_logprobs);
        }

        if (rc != NGX_ERROR
            && ctx->req->endpoint == KVG_ENDPOINT_MESSAGES)
        {
            rc = ngx_http_kvgate_keep_ids(r, ctx, &ctx->choices[ev->sample],
                                          ev);
        }

        if (rc == NGX_ERROR) {
            ngx_http_kvgate_engine_cancel(&ctx->ereq);
            ngx_http_kvgate_finish(ctx, NGX_ERROR);
            return;
        }

        if (ctx->req->stream) {
            ngx_http_kvgate_backpressure(ctx);
        }

        return;

    case KVG_CEV_FINISHED:
        if (ev->sample >= ctx->n_choices) {
            return;
        }

        ch = &ctx->choices[ev->sample];
        ch->finished = 1;
        ch->finish_reason = ev->finish_reason;

        if (ctx->req->endpoint == KVG_ENDPOINT_MESSAGES) {
            ngx_http_kvgate_find_stop_sequence(ctx, ch);
        }

        if (ev->finish_reason == KVG_MSG_FINISH_DEADLINE) {
            kvg_api_error_set(&err, 504, "timeout", NULL,
                              "The engine did not finish the request in time");
            ngx_http_kvgate_fail(ctx, &err);
            return;
        }

        /* a sample dropped before it was drawn is not part of the answer */

        if (ctx->req->stream
            && (ctx->sc == NULL || ev->sample < ctx->sc_drawn))
        {
            rc = ngx_http_kvgate_stream_finished(r, ctx, ev->sample);

            if (rc == NGX_ERROR) {
                ngx_http_kvgate_engine_cancel(&ctx->ereq);
                ngx_http_kvgate_finish(ctx, NGX_ERROR);
                return;
            }
        }

        if (ctx->sc) {
            rc = ngx_http_kvgate_sc_finished(ctx, ch, ev, &err);

            if (rc == NGX_DECLINED) {
                ngx_http_kvgate_fail(ctx, &err);
                return;
            }

            if (rc != NGX_OK) {
                ngx_http_kvgate_engine_cancel(&ctx->ereq);
                ngx_http_kvgate_finish(ctx, NGX_ERROR);
                return;
            }
        }

        if (ctx->req->stream) {
            ngx_http_kvgate_backpressure(ctx);
        }

        return;

    case KVG_CEV_DONE:
        ctx->usage_set = 1;
        ctx->prompt_tokens = ev->prompt_tokens;
        ctx->cached_tokens = ev->cached_tokens;
        ctx->completion_tokens = ev->completion_tokens;
        ctx->cache_write_tokens = ev->cache_write_tokens;

        if (ctx->cache_status == NULL) {
            info = ngx_http_kvgate_engine_info(ctx->ereq.engine);
            ctx->cache_status = kvg_cache_status((int) ctx->bypass,
                                                 ev->prompt_tokens,
                                                 ev->cached_tokens,
                                                 info ? info->block_tokens
                                                      : 16);
        }

        if (ctx->req->stream) {
            if (!ctx->header_sent) {
                ctx->status = NGX_HTTP_OK;
                rc = ngx_http_kvgate_stream_start(r, ctx);

                if (rc == NGX_ERROR || rc > NGX_OK) {
                    ngx_http_kvgate_finish(ctx, rc);
                    return;
                }
            }

            rc = ngx_http_kvgate_stream_end(r, ctx, NULL);

        } else {
            ctx->status = NGX_HTTP_OK;
            rc = ngx_http_kvgate_send_complete(r, ctx);
        }

        ngx_http_kvgate_finish(ctx, rc);
        return;

    case KVG_CEV_ERROR:
        if (ngx_http_kvgate_reroute(ctx, ev)) {
            return;
        }

        kvg_api_error_set(&err, ev->status,
                          ev->status == 429 ? "rate_limit_exceeded"
                          : ev->status == 503 ? "engine_unavailable"
                          : ev->status >= 500 ? "engine_error"
                          : "invalid_request",
                          NULL, "%s", ev->message);

        ngx_http_kvgate_fail(ctx, &err);
        return;

    default:
        return;
    }
}


/* ---- while parked ---- */

static void
ngx_http_kvgate_deadline(ngx_event_t *ev)
{
    kvg_api_error                err;
    ngx_http_kvgate_ctx_t       *ctx = ev->data;
    ngx_http_kvgate_loc_conf_t  *klcf;

    klcf = ngx_http_get_module_loc_conf(ctx->request, ngx_http_kvgate_module);

    ngx_log_error(NGX_LOG_WARN, ev->log, 0,
                  "kvgate: request timed out after %M ms (kvgate_timeout)",
                  klcf->timeout);

    kvg_api_error_set(&err, 504, "timeout", NULL,
                      "The request did not complete within %lu ms "
                      "(kvgate_timeout)", (unsigned long) klcf->timeout);

    ngx_http_kvgate_fail(ctx, &err);
}


static void
ngx_http_kvgate_abort(ngx_http_kvgate_ctx_t *ctx)
{
    ngx_http_kvgate_engine_cancel(&ctx->ereq);

    if (ctx->done) {
        return;
    }

    ctx->status = NGX_HTTP_CLIENT_CLOSED_REQUEST;
    ngx_http_kvgate_finish(ctx, NGX_HTTP_CLIENT_CLOSED_REQUEST);
}


/*
 * The client's connection while the request is parked: an EOF means the
 * client left, and the engine must stop working for it. Modelled on
 * ngx_http_upstream_check_broken_connection().
 */

static void
ngx_http_kvgate_check_broken(ngx_http_request_t *r)
{
    ngx_err_t               err;
    ngx_connection_t       *c;
    ngx_http_kvgate_ctx_t  *ctx;

    c = r->connection;
    ctx = ngx_http_get_module_ctx(r, ngx_http_kvgate_module);

    if (c->error) {
        ngx_http_kvgate_abort(ctx);
        return;
    }

    if (!ngx_http_kvgate_client_gone(r, &err)) {
        return;
    }

    ngx_log_error(NGX_LOG_INFO, c->log, err,
                  "kvgate: client prematurely closed connection, "
                  "cancelling its request");

    ngx_http_kvgate_abort(ctx);
}


/*
 * Backpressure. A stream's output waits in the worker, in buffers that are
 * recycled once sent (ngx_http_kvgate_response.c), while its client does
 * not read; when those buffers hold kvgate_max_unsent bytes or more the
 * request is paused in the engine (no more decoding, its blocks stay), and
 * resumed once the client has taken them down to half of that, so
 * a slow reader costs the worker a bounded amount of memory and the engine
 * no work. All samples of the request pause together (they are one request
 * in the engine). What the engine made before the pause reached it still
 * comes and is kept: the bound is kvgate_max_unsent plus what the
 * completion ring already held for it (~20 KB measured for a stream the
 * engine runs at full speed; at most the ring's worth). A client that never
 * drains is closed at send_timeout (ngx_http_kvgate_writer), which cancels
 * the request and frees its blocks.
 *
 * Non-streaming requests have nothing unsent until DONE, when the engine's
 * work is over: their text grows in memory up to n x max_tokens, and the
 * final object is left to nginx's writer and send_timeout.
 */

static void
ngx_http_kvgate_backpressure(ngx_http_kvgate_ctx_t *ctx)
{
    size_t                       unsent;
    ngx_http_request_t          *r = ctx->request;
    ngx_http_kvgate_loc_conf_t  *klcf;

    if (ctx->done || !ctx->req->stream) {
        return;
    }

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);
    unsent = ngx_http_kvgate_stream_unsent(r, ctx);

    if (!ctx->paused && unsent >= klcf->max_unsent) {

        if (ngx_http_kvgate_engine_pause(&ctx->ereq, 1) != NGX_OK) {
            return;
        }

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "kvgate: %uz bytes of buffers for unsent output "
                       "(kvgate_max_unsent %uz), pausing the request",
                       unsent, klcf->max_unsent);

        /* it may stay paused up to send_timeout: what it does not use now
           is given back */

        ctx->paused = 1;
        ngx_http_kvgate_stream_trim(r, ctx);
        ngx_http_kvgate_metrics_backpressure(NGX_HTTP_KVGATE_BP_PAUSE);
        return;
    }

    if (ctx->paused && unsent <= klcf->max_unsent / 2) {
        ctx->paused = 0;

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "kvgate: %uz bytes of buffers for unsent output, "
                       "resuming the request", unsent);

        if (ngx_http_kvgate_engine_pause(&ctx->ereq, 0) == NGX_OK) {
            ngx_http_kvgate_metrics_backpressure(NGX_HTTP_KVGATE_BP_RESUME);
        }
    }
}


/* Flushes streamed output the client could not take at once. */

static void
ngx_http_kvgate_writer(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_event_t               *wev;
    ngx_connection_t          *c;
    ngx_http_kvgate_ctx_t     *ctx;
    ngx_http_core_loc_conf_t  *clcf;

    c = r->connection;
    wev = c->write;
    ctx = ngx_http_get_module_ctx(r, ngx_http_kvgate_module);
    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (wev->timedout) {

        /* as nginx's own writer does at send_timeout: 408, and the
           connection is closed; the engine's work is cancelled, so a paused
           request's blocks are freed */

        ngx_log_error(NGX_LOG_INFO, c->log, NGX_ETIMEDOUT,
                      "kvgate: client timed out reading the stream "
                      "(send_timeout), cancelling its request");
        c->timedout = 1;

        ngx_http_kvgate_engine_cancel(&ctx->ereq);

        if (ctx->done) {
            return;
        }

        ngx_http_kvgate_metrics_backpressure(NGX_HTTP_KVGATE_BP_TIMEOUT);

        ctx->status = NGX_HTTP_REQUEST_TIME_OUT;
        r->headers_out.status = NGX_HTTP_REQUEST_TIME_OUT;
        ngx_http_kvgate_finish(ctx, NGX_HTTP_REQUEST_TIME_OUT);
        return;
    }

    if (!ctx->header_sent) {
        return;
    }

    /* what waited for the client goes out, and its buffers are recycled */

    rc = ngx_http_kvgate_stream_flush(r, ctx);

    if (rc == NGX_ERROR) {
        ngx_http_kvgate_abort(ctx);
        return;
    }

    ngx_http_kvgate_backpressure(ctx);

    if (r->buffered || r->postponed || c->buffered) {
        if (!wev->delayed) {
            ngx_add_timer(wev, clcf->send_timeout);
        }

        if (ngx_handle_write_event(wev, clcf->send_lowat) != NGX_OK) {
            ngx_http_kvgate_abort(ctx);
        }

        return;
    }

    if (wev->timer_set) {
        ngx_del_timer(wev);
    }
}
