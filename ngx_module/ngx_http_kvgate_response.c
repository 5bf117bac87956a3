
/*
 * The OpenAI response shapes: text_completion and chat.completion objects,
 * their streamed chunks as server-sent events ("data: {...}\n\n", then
 * "data: [DONE]\n\n"), and the model list; and Anthropic's for
 * /v1/messages: the message object, and its stream of named events
 * ("event: NAME\ndata: {...}\n\n": message_start, content_block_start,
 * ping, content_block_delta..., content_block_stop, message_delta,
 * message_stop). Text goes straight from the
 * engine's events into the output buffers, escaped by libkvgate
 * (kvg_json_escape), so nothing is parsed or rebuilt per token.
 */


#include "ngx_http_kvgate_module.h"

#include <math.h>

#include "json_out.h"
#include "tokenizer.h"


/* A growing output buffer in the request pool. */

typedef struct {
    ngx_pool_t  *pool;
    u_char      *start;
    u_char      *pos;
    u_char      *end;
    ngx_uint_t   failed;
} ngx_http_kvgate_out_t;


static void
ngx_http_kvgate_out_init(ngx_http_kvgate_out_t *o, ngx_pool_t *pool,
    size_t size)
{
    o->pool = pool;
    o->start = ngx_pnalloc(pool, size);
    o->pos = o->start;
    o->end = o->start ? o->start + size : NULL;
    o->failed = o->start == NULL;
}


static ngx_int_t
ngx_http_kvgate_out_reserve(ngx_http_kvgate_out_t *o, size_t n)
{
    size_t   used, cap;
    u_char  *p;

    if (o->failed) {
        return NGX_ERROR;
    }

    if ((size_t) (o->end - o->pos) >= n) {
        return NGX_OK;
    }

    used = o->pos - o->start;
    cap = (o->end - o->start) * 2;

    while (cap < used + n) {
        cap *= 2;
    }

    p = ngx_pnalloc(o->pool, cap);
    if (p == NULL) {
        o->failed = 1;
        return NGX_ERROR;
    }

    ngx_memcpy(p, o->start, used);

    /* the old block is given back when it is a large allocation (nginx
       frees only those before the pool goes); a small one stays, at most
       about as much as the new block since the size doubles */
    ngx_pfree(o->pool, o->start);

    o->start = p;
    o->pos = p + used;
    o->end = p + cap;

    return NGX_OK;
}


static void
ngx_http_kvgate_out_mem(ngx_http_kvgate_out_t *o, const void *s, size_t n)
{
    if (ngx_http_kvgate_out_reserve(o, n) == NGX_OK) {
        o->pos = ngx_cpymem(o->pos, s, n);
    }
}


#define ngx_http_kvgate_out_lit(o, s)                                         \
    ngx_http_kvgate_out_mem(o, s, sizeof(s) - 1)


static void
ngx_http_kvgate_out_cstr(ngx_http_kvgate_out_t *o, const char *s)
{
    ngx_http_kvgate_out_mem(o, s, ngx_strlen(s));
}


/* A JSON string: quotes and the escaped bytes. */

static void
ngx_http_kvgate_out_json(ngx_http_kvgate_out_t *o, const void *s, size_t n)
{
    if (ngx_http_kvgate_out_reserve(o, 6 * n + 2) != NGX_OK) {
        return;
    }

    *o->pos++ = '"';
    o->pos += kvg_json_escape((char *) o->pos, s, n);
    *o->pos++ = '"';
}


static void
ngx_http_kvgate_out_uint(ngx_http_kvgate_out_t *o, uint64_t v)
{
    if (ngx_http_kvgate_out_reserve(o, NGX_INT64_LEN) == NGX_OK) {
        o->pos = ngx_sprintf(o->pos, "%uL", v);
    }
}


static void
ngx_http_kvgate_out_float(ngx_http_kvgate_out_t *o, float v)
{
    double  d = v;

    /* JSON has no infinities; a probability of 0 reads as a huge cost */

    if (!isfinite(d)) {
        d = -9999.0;
    }

    if (ngx_http_kvgate_out_reserve(o, 48) != NGX_OK) {
        return;
    }

    if (d < 0) {
        *o->pos++ = '-';
        d = -d;
    }

    o->pos = ngx_sprintf(o->pos, "%.6f", d);
}


/* An output header with static key and value (both live as long as the request). */

ngx_int_t
ngx_http_kvgate_add_cache_headers(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx)
{
    ngx_http_kvgate_loc_conf_t  *klcf;

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);

    if (ctx->cache_status
        && ngx_http_kvgate_add_header(r, "X-KVGate-Cache", ctx->cache_status)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ctx->bucket != NGX_HTTP_KVGATE_BUCKET_NONE
        && ngx_http_kvgate_add_header(r, "X-KVGate-Bucket",
               kvg_bucket_label(&klcf->buckets, ctx->bucket))
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * Output. A non-streamed answer is one object, handed to nginx as it is
 * (ngx_http_kvgate_output_whole). A stream is many small chunks over a long
 * time, so its buffers are recycled as nginx's own modules do theirs: each
 * chunk is written in the request's scratch space, then copied into a
 * buffer taken from ctx->free (its memory reused when big enough), passed
 * to nginx, and ngx_chain_update_chains() moves every buffer the client
 * has fully taken from ctx->busy back to ctx->free. A stream then holds
 * about what is unsent, not all it produced (pool memory is otherwise
 * freed only with the request).
 *
 * While the client is behind (nginx still holds unsent output), chunks are
 * gathered in one open buffer (ctx->open) instead of being passed one by
 * one: every buffer passed costs nginx a few more (the chunked encoding's
 * size line and CRLF, chain links), more than a chunk's own bytes. The
 * open buffer is passed when it is full, when the client has caught up
 * (the write handler, ngx_http_kvgate_stream_flush) and at the end; the
 * bytes sent are the same, only the HTTP chunks are fewer and larger.
 *
 * The buffers are 4 KB (less for a small kvgate_max_unsent, more for a
 * chunk that needs it); at 4 KB and above they are large pool allocations
 * (over NGX_MAX_ALLOC_FROM_POOL), so one replaced by a bigger one is freed
 * at once. The memory they hold for unsent output is what backpressure
 * compares with kvgate_max_unsent (ngx_http_kvgate_stream_unsent).
 */

#define NGX_HTTP_KVGATE_BUF_SIZE  4096


static void
ngx_http_kvgate_out_scratch(ngx_http_kvgate_out_t *o, ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, size_t size)
{
    if (ctx->scratch && ctx->scratch_size >= size) {
        o->pool = r->pool;
        o->start = ctx->scratch;
        o->pos = o->start;
        o->end = o->start + ctx->scratch_size;
        o->failed = 0;
        return;
    }

    if (ctx->scratch) {
        ngx_pfree(r->pool, ctx->scratch);
        ctx->scratch = NULL;
        ctx->scratch_size = 0;
    }

    ngx_http_kvgate_out_init(o, r->pool, ngx_align(size, 1024));
}


/* the scratch space after a chunk was written (it may have grown) */

static void
ngx_http_kvgate_out_keep(ngx_http_kvgate_out_t *o, ngx_http_kvgate_ctx_t *ctx)
{
    ctx->scratch = o->start;
    ctx->scratch_size = o->start ? (size_t) (o->end - o->start) : 0;
}


/* A buffer for at least len bytes, all its flags cleared. */

static ngx_chain_t *
ngx_http_kvgate_get_buf(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    size_t len)
{
    size_t                       size;
    u_char                      *start, *end;
    ngx_buf_t                   *b;
    ngx_chain_t                 *cl;
    ngx_http_kvgate_loc_conf_t  *klcf;

    cl = ngx_chain_get_free_buf(r->pool, &ctx->free);
    if (cl == NULL) {
        return NULL;
    }

    b = cl->buf;
    start = b->start;
    end = b->end;

    if (start == NULL || (size_t) (end - start) < len) {

        /* a few buffers per kvgate_max_unsent, so that pausing on the
           buffers of unsent output (ngx_http_kvgate_stream_unsent) is not
           too coarse */

        klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);
        size = ngx_align(klcf->max_unsent / 8, 1024);
        size = ngx_min(size, NGX_HTTP_KVGATE_BUF_SIZE);
        size = ngx_max(size, ngx_align(len, 1024));

        start = ngx_pnalloc(r->pool, size);
        if (start == NULL) {
            return NULL;
        }

        if (b->start) {
            ngx_pfree(r->pool, b->start);
        }

        end = start + size;
    }

    /* a reused buffer keeps only its memory: nothing of its last use
       (last_buf, sync, flush...) may go out with the next chunk */

    ngx_memzero(b, sizeof(ngx_buf_t));
    b->start = start;
    b->end = end;
    b->pos = start;
    b->last = start;
    b->memory = 1;
    b->tag = (ngx_buf_tag_t) &ngx_http_kvgate_module;

    return cl;
}


/* Passes the open buffer (or, with none, only flushes what nginx holds),
   then recycles the buffers the client has taken. */

static ngx_int_t
ngx_http_kvgate_send(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    ngx_uint_t last)
{
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_chain_t  *out;

    out = ctx->open;
    ctx->open = NULL;

    if (out == NULL && last) {
        out = ngx_http_kvgate_get_buf(r, ctx, 0);
        if (out == NULL) {
            return NGX_ERROR;
        }
    }

    if (out) {
        b = out->buf;
        b->flush = 1;
        b->last_buf = last && r == r->main;
        b->last_in_chain = last;

        if (b->pos == b->last) {
            b->memory = 0;
            b->sync = 1;
        }
    }

    rc = ngx_http_output_filter(r, out);

    ngx_chain_update_chains(r->pool, &ctx->free, &ctx->busy, &out,
                            (ngx_buf_tag_t) &ngx_http_kvgate_module);

    return rc;
}


/* A slow reader: the rest goes out when it can take it (the request's write
   handler), within send_timeout. */

static ngx_int_t
ngx_http_kvgate_wait_write(ngx_http_request_t *r)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (!r->connection->write->delayed && !r->connection->write->timer_set) {
        ngx_add_timer(r->connection->write, clcf->send_timeout);
    }

    if (ngx_handle_write_event(r->connection->write, clcf->send_lowat)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    return NGX_AGAIN;
}


/* One chunk of a stream, written in the scratch space (o); last: the end of
   the stream. */

static ngx_int_t
ngx_http_kvgate_stream_put(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_out_t *o, ngx_uint_t last)
{
    size_t      len;
    ngx_int_t   rc;
    ngx_buf_t  *b;

    ngx_http_kvgate_out_keep(o, ctx);

    if (o->failed) {
        return NGX_ERROR;
    }

    len = o->pos - o->start;

    if (len == 0 && !last) {
        return NGX_OK;
    }

    if (ctx->open
        && (size_t) (ctx->open->buf->end - ctx->open->buf->last) < len)
    {
        rc = ngx_http_kvgate_send(r, ctx, 0);

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }
    }

    if (ctx->open == NULL) {
        ctx->open = ngx_http_kvgate_get_buf(r, ctx, len);
        if (ctx->open == NULL) {
            return NGX_ERROR;
        }
    }

    b = ctx->open->buf;
    b->last = ngx_cpymem(b->last, o->start, len);

    if (!last && (r->out || r->connection->buffered)) {

        /* the client is behind: the chunk waits in the open buffer; the
           write handler is armed, by the send that found the client behind */

        return NGX_OK;
    }

    rc = ngx_http_kvgate_send(r, ctx, last);

    if (rc == NGX_AGAIN && !last) {
        return ngx_http_kvgate_wait_write(r);
    }

    return rc;
}


ngx_int_t
ngx_http_kvgate_stream_flush(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx)
{
    return ngx_http_kvgate_send(r, ctx, 0);
}


/* The memory a stream holds for output the client has not taken: its busy
   buffers and the open one, whole (a partly sent or partly filled buffer is
   held all the same); what the chunked encoding adds to them is a few bytes
   each. */

size_t
ngx_http_kvgate_stream_unsent(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx)
{
    size_t        size;
    ngx_chain_t  *cl;

    size = 0;

    for (cl = ctx->busy; cl; cl = cl->next) {
        size += cl->buf->end - cl->buf->start;
    }

    if (ctx->open) {
        size += ctx->open->buf->end - ctx->open->buf->start;
    }

    return size;
}


void
ngx_http_kvgate_stream_trim(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx)
{
    ngx_uint_t    n;
    ngx_chain_t  *cl;

    n = 0;

    for (cl = ctx->free; cl; cl = cl->next) {
        if (cl->buf->start && ngx_pfree(r->pool, cl->buf->start) == NGX_OK) {
            cl->buf->start = NULL;
            cl->buf->end = NULL;
            cl->buf->pos = NULL;
            cl->buf->last = NULL;
            n++;
        }
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "kvgate: %ui idle output buffers freed", n);
}


/* A whole answer in o, as the request's output (ngx_http_kvgate_send_response
   marks it the last): a chain of one buffer in the pool, or NULL. */

static ngx_chain_t *
ngx_http_kvgate_output_whole(ngx_http_request_t *r, ngx_http_kvgate_out_t *o)
{
    ngx_buf_t    *b;
    ngx_chain_t  *out;

    if (o->failed) {
        return NULL;
    }

    b = ngx_calloc_buf(r->pool);
    out = ngx_alloc_chain_link(r->pool);
    if (b == NULL || out == NULL) {
        return NULL;
    }

    b->pos = o->start;
    b->last = o->pos;
    b->memory = 1;
    b->flush = 1;
    b->tag = (ngx_buf_tag_t) &ngx_http_kvgate_module;

    if (b->pos == b->last) {
        b->memory = 0;
        b->sync = 1;
    }

    out->buf = b;
    out->next = NULL;

    return out;
}


/* ---- pieces ---- */

static const char *
ngx_http_kvgate_finish_name(uint32_t reason)
{
    /* "cancelled": a self-consistency sample stopped once the vote was
       decided (other requests are never answered cancelled) */

    return reason == KVG_MSG_FINISH_LENGTH ? "length"
           : reason == KVG_MSG_FINISH_CANCELLED ? "cancelled" : "stop";
}


static void
ngx_http_kvgate_fingerprint(ngx_http_kvgate_out_t *o,
    ngx_http_kvgate_ctx_t *ctx)
{
    const kvg_engine_info  *info = ctx->ereq.engine
                             ? ngx_http_kvgate_engine_info(ctx->ereq.engine)
                             : NULL;

    ngx_http_kvgate_out_lit(o, ",\"system_fingerprint\":");

    if (info == NULL) {
        ngx_http_kvgate_out_lit(o, "null");
        return;
    }

    /* the model identity: a change of weights or tokenizer changes it */

    ngx_http_kvgate_out_lit(o, "\"fp_");
    ngx_http_kvgate_out_mem(o, info->model_id_hex, 12);
    ngx_http_kvgate_out_lit(o, "\"");
}


static void
ngx_http_kvgate_object_head(ngx_http_kvgate_out_t *o,
    ngx_http_kvgate_ctx_t *ctx, const char *object)
{
    ngx_http_kvgate_out_lit(o, "{\"id\":");
    ngx_http_kvgate_out_json(o, ctx->id, ctx->id_len);
    ngx_http_kvgate_out_lit(o, ",\"object\":\"");
    ngx_http_kvgate_out_cstr(o, object);
    ngx_http_kvgate_out_lit(o, "\",\"created\":");
    ngx_http_kvgate_out_uint(o, (uint64_t) ctx->created);
    ngx_http_kvgate_out_lit(o, ",\"model\":");
    ngx_http_kvgate_out_json(o, ctx->req->model, ctx->req->model_len);
    ngx_http_kvgate_fingerprint(o, ctx);
    ngx_http_kvgate_out_lit(o, ",\"choices\":[");
}


static void
ngx_http_kvgate_usage(ngx_http_kvgate_out_t *o, ngx_http_kvgate_ctx_t *ctx)
{
    ngx_http_kvgate_out_lit(o, "\"usage\":{\"prompt_tokens\":");
    ngx_http_kvgate_out_uint(o, ctx->prompt_tokens);
    ngx_http_kvgate_out_lit(o, ",\"completion_tokens\":");
    ngx_http_kvgate_out_uint(o, ctx->completion_tokens);
    ngx_http_kvgate_out_lit(o, ",\"total_tokens\":");
    ngx_http_kvgate_out_uint(o, (uint64_t) ctx->prompt_tokens
                                + ctx->completion_tokens);
    ngx_http_kvgate_out_lit(o, ",\"prompt_tokens_details\":"
                               "{\"cached_tokens\":");
    ngx_http_kvgate_out_uint(o, ctx->cached_tokens);
    ngx_http_kvgate_out_lit(o, "}}");
}


/*
 * Self-consistency's result:
 *   "kvgate":{"answer":"..."|null,"votes":{"<answer>":count|weight,...},
 *             "samples":k,"stopped_early":bool}
 * votes in the tally's order (kvg_sc_answer_at), counts for a majority vote,
 * summed weights for a logprob vote.
 */

static void
ngx_http_kvgate_vote_object(ngx_http_kvgate_out_t *o,
    ngx_http_kvgate_ctx_t *ctx)
{
    char        num[64];
    size_t      i, n, len;
    double      weight;
    unsigned    count;
    const char *a;

    ngx_http_kvgate_out_lit(o, "\"kvgate\":{\"answer\":");

    a = kvg_sc_answer(ctx->sc, &len);

    if (a == NULL) {
        ngx_http_kvgate_out_lit(o, "null");

    } else {
        ngx_http_kvgate_out_json(o, a, len);
    }

    ngx_http_kvgate_out_lit(o, ",\"votes\":{");

    n = kvg_sc_n_answers(ctx->sc);

    for (i = 0; i < n; i++) {
        kvg_sc_answer_at(ctx->sc, i, &a, &len, &count, &weight);

        if (i) {
            ngx_http_kvgate_out_lit(o, ",");
        }

        ngx_http_kvgate_out_json(o, a, len);
        ngx_http_kvgate_out_lit(o, ":");

        if (ctx->req->vote == KVG_VOTE_LOGPROB) {
            /* %.17g would print noise digits; 6 significant are plenty for
               a weight in (0, n] */
            (void) snprintf(num, sizeof(num), "%.6g", weight);
            ngx_http_kvgate_out_cstr(o, num);

        } else {
            ngx_http_kvgate_out_uint(o, count);
        }
    }

    ngx_http_kvgate_out_lit(o, "},\"samples\":");
    ngx_http_kvgate_out_uint(o, kvg_sc_samples_run(ctx->sc));
    ngx_http_kvgate_out_lit(o, ",\"stopped_early\":");

    if (kvg_sc_stopped_early(ctx->sc)) {
        ngx_http_kvgate_out_lit(o, "true}");

    } else {
        ngx_http_kvgate_out_lit(o, "false}");
    }
}


/* The room the kvgate object needs. */

static size_t
ngx_http_kvgate_vote_size(ngx_http_kvgate_ctx_t *ctx)
{
    size_t       i, n, len, size;
    double       weight;
    unsigned     count;
    const char  *a;

    if (ctx->sc == NULL) {
        return 0;
    }

    size = 256;
    n = kvg_sc_n_answers(ctx->sc);

    for (i = 0; i < n; i++) {
        kvg_sc_answer_at(ctx->sc, i, &a, &len, &count, &weight);
        size += 2 * kvg_json_escape_len(a, len) + 64;
    }

    return size;
}


/* The logprobs object of a choice for tokens ids[0..n). */

static void
ngx_http_kvgate_logprobs(ngx_http_kvgate_out_t *o, ngx_http_kvgate_ctx_t *ctx,
    const uint32_t *ids, const float *lps, size_t n, size_t *text_offset)
{
    size_t                  i, len, k;
    const u_char           *bytes;
    const kvg_engine_info  *info = ctx->ereq.engine
                             ? ngx_http_kvgate_engine_info(ctx->ereq.engine)
                             : NULL;

    if (!ctx->req->has_logprobs || info == NULL) {
        ngx_http_kvgate_out_lit(o, "null");
        return;
    }

    if (ctx->req->endpoint == KVG_ENDPOINT_CHAT) {
        ngx_http_kvgate_out_lit(o, "{\"content\":[");

        for (i = 0; i < n; i++) {
            bytes = kvg_tokenizer_token_bytes(info->tokenizer, (int32_t) ids[i],
                                              &len);
            if (bytes == NULL) {
                len = 0;
            }

            if (i) {
                ngx_http_kvgate_out_lit(o, ",");
            }

            ngx_http_kvgate_out_lit(o, "{\"token\":");
            ngx_http_kvgate_out_json(o, bytes, len);
            ngx_http_kvgate_out_lit(o, ",\"logprob\":");
            ngx_http_kvgate_out_float(o, lps[i]);
            ngx_http_kvgate_out_lit(o, ",\"bytes\":[");

            for (k = 0; k < len; k++) {
                if (k) {
                    ngx_http_kvgate_out_lit(o, ",");
                }

                ngx_http_kvgate_out_uint(o, bytes[k]);
            }

            ngx_http_kvgate_out_lit(o, "],\"top_logprobs\":[]}");
        }

        ngx_http_kvgate_out_lit(o, "]}");
        return;
    }

    ngx_http_kvgate_out_lit(o, "{\"tokens\":[");

    for (i = 0; i < n; i++) {
        bytes = kvg_tokenizer_token_bytes(info->tokenizer, (int32_t) ids[i],
                                          &len);
        if (i) {
            ngx_http_kvgate_out_lit(o, ",");
        }

        ngx_http_kvgate_out_json(o, bytes ? bytes : (u_char *) "",
                                 bytes ? len : 0);
    }

    ngx_http_kvgate_out_lit(o, "],\"token_logprobs\":[");

    for (i = 0; i < n; i++) {
        if (i) {
            ngx_http_kvgate_out_lit(o, ",");
        }

        ngx_http_kvgate_out_float(o, lps[i]);
    }

    ngx_http_kvgate_out_lit(o, "],\"top_logprobs\":null,\"text_offset\":[");

    for (i = 0; i < n; i++) {
        if (i) {
            ngx_http_kvgate_out_lit(o, ",");
        }

        ngx_http_kvgate_out_uint(o, *text_offset);
        bytes = kvg_tokenizer_token_bytes(info->tokenizer, (int32_t) ids[i],
                                          &len);
        *text_offset += bytes ? len : 0;
    }

    ngx_http_kvgate_out_lit(o, "]}");
}


/* ---- Anthropic's Messages API ---- */

static const char *
ngx_http_kvgate_stop_reason(ngx_http_kvgate_choice_t *ch)
{
    if (ch->finish_reason == KVG_MSG_FINISH_LENGTH) {
        return "max_tokens";
    }

    return ch->stop_sequence >= 0 ? "stop_sequence" : "end_turn";
}


/* "stop_reason":R,"stop_sequence":S|null */

static void
ngx_http_kvgate_message_stop(ngx_http_kvgate_out_t *o,
    ngx_http_kvgate_ctx_t *ctx, ngx_http_kvgate_choice_t *ch)
{
    ngx_http_kvgate_out_lit(o, "\"stop_reason\":\"");
    ngx_http_kvgate_out_cstr(o, ngx_http_kvgate_stop_reason(ch));
    ngx_http_kvgate_out_lit(o, "\",\"stop_sequence\":");

    if (ch->stop_sequence >= 0
        && (size_t) ch->stop_sequence < ctx->req->n_stop)
    {
        ngx_http_kvgate_out_json(o, ctx->req->stop[ch->stop_sequence],
                                 ctx->req->stop_len[ch->stop_sequence]);

    } else {
        ngx_http_kvgate_out_lit(o, "null");
    }
}


/*
 * "usage":{...}: input_tokens are the prompt's tokens neither read from the
 * cache nor written to it; cache_read_input_tokens the cached prefix the
 * engine reused (OpenAI's prompt_tokens_details.cached_tokens);
 * cache_creation_input_tokens the prompt tokens the engine computed and now
 * holds for the request's cache_control breakpoints (its DONE: known at the
 * end, so a stream's message_start says 0 and its message_delta the count).
 */

static void
ngx_http_kvgate_message_usage(ngx_http_kvgate_out_t *o,
    ngx_http_kvgate_ctx_t *ctx, uint32_t output_tokens)
{
    uint32_t  cached, written;

    cached = ngx_min(ctx->cached_tokens, ctx->prompt_tokens);
    written = ngx_min(ctx->cache_write_tokens, ctx->prompt_tokens - cached);

    ngx_http_kvgate_out_lit(o, "\"usage\":{\"input_tokens\":");
    ngx_http_kvgate_out_uint(o, ctx->prompt_tokens - cached - written);
    ngx_http_kvgate_out_lit(o, ",\"cache_creation_input_tokens\":");
    ngx_http_kvgate_out_uint(o, written);
    ngx_http_kvgate_out_lit(o, ",\"cache_read_input_tokens\":");
    ngx_http_kvgate_out_uint(o, cached);
    ngx_http_kvgate_out_lit(o, ",\"output_tokens\":");
    ngx_http_kvgate_out_uint(o, output_tokens);
    ngx_http_kvgate_out_lit(o, "}");
}


static void
ngx_http_kvgate_message_head(ngx_http_kvgate_out_t *o,
    ngx_http_kvgate_ctx_t *ctx)
{
    ngx_http_kvgate_out_lit(o, "{\"id\":");
    ngx_http_kvgate_out_json(o, ctx->id, ctx->id_len);
    ngx_http_kvgate_out_lit(o, ",\"type\":\"message\",\"role\":\"assistant\""
                               ",\"model\":");
    ngx_http_kvgate_out_json(o, ctx->req->model, ctx->req->model_len);
    ngx_http_kvgate_out_lit(o, ",\"content\":");
}


static ngx_int_t
ngx_http_kvgate_send_message(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx)
{
    ngx_chain_t               *out;
    ngx_http_kvgate_out_t      o;
    ngx_http_kvgate_choice_t  *ch;

    ch = &ctx->choices[0];

    ngx_http_kvgate_out_init(&o, r->pool,
                             1024 + kvg_json_escape_len((char *) ch->text,
                                                        ch->len));

    ngx_http_kvgate_message_head(&o, ctx);
    ngx_http_kvgate_out_lit(&o, "[{\"type\":\"text\",\"text\":");
    ngx_http_kvgate_out_json(&o, ch->text, ch->len);
    ngx_http_kvgate_out_lit(&o, "}],");
    ngx_http_kvgate_message_stop(&o, ctx, ch);
    ngx_http_kvgate_out_lit(&o, ",");
    ngx_http_kvgate_message_usage(&o, ctx, ctx->completion_tokens);
    ngx_http_kvgate_out_lit(&o, "}\n");

    out = ngx_http_kvgate_output_whole(r, &o);

    if (out == NULL || ngx_http_kvgate_add_cache_headers(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->header_sent = 1;

    return ngx_http_kvgate_send_response(r, NGX_HTTP_OK, "application/json",
                                         o.pos - o.start, out);
}


#define ngx_http_kvgate_event(o, name)                                        \
    ngx_http_kvgate_out_lit(o, "event: " name "\ndata: {\"type\":\"" name "\"")


/* message_start (with the prompt's usage), content_block_start, ping */

static ngx_int_t
ngx_http_kvgate_message_stream_start(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx)
{
    ngx_int_t              rc;
    ngx_http_kvgate_out_t  o;

    ngx_http_kvgate_out_scratch(&o, r, ctx, 1024);

    ngx_http_kvgate_event(&o, "message_start");
    ngx_http_kvgate_out_lit(&o, ",\"message\":");
    ngx_http_kvgate_message_head(&o, ctx);
    ngx_http_kvgate_out_lit(&o, "[],\"stop_reason\":null,"
                                "\"stop_sequence\":null,");
    ngx_http_kvgate_message_usage(&o, ctx, 0);
    ngx_http_kvgate_out_lit(&o, "}}\n\n");

    ngx_http_kvgate_event(&o, "content_block_start");
    ngx_http_kvgate_out_lit(&o, ",\"index\":0,\"content_block\":"
                                "{\"type\":\"text\",\"text\":\"\"}}\n\n");

    ngx_http_kvgate_event(&o, "ping");
    ngx_http_kvgate_out_lit(&o, "}\n\n");

    rc = ngx_http_kvgate_stream_put(r, ctx, &o, 0);

    return rc == NGX_ERROR ? NGX_ERROR : NGX_OK;
}


static ngx_int_t
ngx_http_kvgate_message_stream_text(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, const kvg_client_event *ev)
{
    ngx_int_t              rc;
    ngx_http_kvgate_out_t  o;

    if (ev->text_len == 0 || ev->sample != 0) {
        return NGX_OK;
    }

    ngx_http_kvgate_out_scratch(&o, r, ctx, 256 + 6 * ev->text_len);

    ngx_http_kvgate_event(&o, "content_block_delta");
    ngx_http_kvgate_out_lit(&o, ",\"index\":0,\"delta\":{\"type\":"
                                "\"text_delta\",\"text\":");
    ngx_http_kvgate_out_json(&o, ev->text, ev->text_len);
    ngx_http_kvgate_out_lit(&o, "}}\n\n");

    rc = ngx_http_kvgate_stream_put(r, ctx, &o, 0);

    return rc == NGX_ERROR ? NGX_ERROR : NGX_OK;
}


static ngx_int_t
ngx_http_kvgate_message_stream_stop(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, ngx_uint_t choice)
{
    ngx_int_t              rc;
    ngx_http_kvgate_out_t  o;

    if (choice != 0) {
        return NGX_OK;
    }

    ngx_http_kvgate_out_scratch(&o, r, ctx, 128);

    ngx_http_kvgate_event(&o, "content_block_stop");
    ngx_http_kvgate_out_lit(&o, ",\"index\":0}\n\n");

    rc = ngx_http_kvgate_stream_put(r, ctx, &o, 0);

    return rc == NGX_ERROR ? NGX_ERROR : NGX_OK;
}


/* message_delta (stop_reason, stop_sequence, usage) and message_stop; or an
   error event */

static ngx_int_t
ngx_http_kvgate_message_stream_end(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, kvg_api_error *error)
{
    char                   json[KVG_API_ERROR_JSON_MAX];
    size_t                 len;
    ngx_http_kvgate_out_t  o;

    ngx_http_kvgate_out_scratch(&o, r, ctx, 1024);

    if (error) {
        ctx->status = error->status;
        len = kvg_api_error_render_anthropic(error, json, sizeof(json));

        ngx_http_kvgate_out_lit(&o, "event: error\ndata: ");
        ngx_http_kvgate_out_mem(&o, json,
                                len < sizeof(json) ? len : sizeof(json) - 1);
        ngx_http_kvgate_out_lit(&o, "\n\n");

        return ngx_http_kvgate_stream_put(r, ctx, &o, 1);
    }

    ngx_http_kvgate_event(&o, "message_delta");
    ngx_http_kvgate_out_lit(&o, ",\"delta\":{");
    ngx_http_kvgate_message_stop(&o, ctx, &ctx->choices[0]);
    ngx_http_kvgate_out_lit(&o, "},");
    ngx_http_kvgate_message_usage(&o, ctx, ctx->completion_tokens);
    ngx_http_kvgate_out_lit(&o, "}\n\n");

    ngx_http_kvgate_event(&o, "message_stop");
    ngx_http_kvgate_out_lit(&o, "}\n\n");

    return ngx_http_kvgate_stream_put(r, ctx, &o, 1);
}


/* ---- non-streaming ---- */

ngx_int_t
ngx_http_kvgate_send_complete(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx)
{
    size_t                     size, off;
    ngx_uint_t                 j, n, chat;
    ngx_chain_t               *out;
    ngx_http_kvgate_out_t      o;
    ngx_http_kvgate_choice_t  *ch;

    if (ctx->req->endpoint == KVG_ENDPOINT_MESSAGES) {
        return ngx_http_kvgate_send_message(r, ctx);
    }

    chat = ctx->req->endpoint == KVG_ENDPOINT_CHAT;

    /* with a vote, only the samples drawn (a prefix of the indices) */

    n = ctx->sc ? ctx->sc_drawn : ctx->n_choices;

    size = 1024 + ngx_http_kvgate_vote_size(ctx);

    for (j = 0; j < n; j++) {
        size += kvg_json_escape_len((char *) ctx->choices[j].text,
                                    ctx->choices[j].len)
                + 256 + ctx->choices[j].n_ids * 96;
    }

    ngx_http_kvgate_out_init(&o, r->pool, size);

    ngx_http_kvgate_object_head(&o, ctx, chat ? "chat.completion"
                                              : "text_completion");

    for (j = 0; j < n; j++) {
        ch = &ctx->choices[j];
        off = 0;

        if (j) {
            ngx_http_kvgate_out_lit(&o, ",");
        }

        ngx_http_kvgate_out_lit(&o, "{\"index\":");
        ngx_http_kvgate_out_uint(&o, j);

        if (chat) {
            ngx_http_kvgate_out_lit(&o, ",\"message\":{\"role\":"
                                        "\"assistant\",\"content\":");
            ngx_http_kvgate_out_json(&o, ch->text, ch->len);
            ngx_http_kvgate_out_lit(&o, "}");

        } else {
            ngx_http_kvgate_out_lit(&o, ",\"text\":");
            ngx_http_kvgate_out_json(&o, ch->text, ch->len);
        }

        ngx_http_kvgate_out_lit(&o, ",\"logprobs\":");
        ngx_http_kvgate_logprobs(&o, ctx, ch->ids, ch->lps, ch->n_ids, &off);
        ngx_http_kvgate_out_lit(&o, ",\"finish_reason\":\"");
        ngx_http_kvgate_out_cstr(&o,
            ngx_http_kvgate_finish_name(ch->finish_reason));
        ngx_http_kvgate_out_lit(&o, "\"}");
    }

    ngx_http_kvgate_out_lit(&o, "],");
    ngx_http_kvgate_usage(&o, ctx);

    if (ctx->sc) {
        ngx_http_kvgate_out_lit(&o, ",");
        ngx_http_kvgate_vote_object(&o, ctx);
    }

    ngx_http_kvgate_out_lit(&o, "}\n");

    out = ngx_http_kvgate_output_whole(r, &o);

    if (out == NULL || ngx_http_kvgate_add_cache_headers(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->header_sent = 1;

    return ngx_http_kvgate_send_response(r, NGX_HTTP_OK, "application/json",
                                         o.pos - o.start, out);
}


/* ---- streaming ---- */

static void
ngx_http_kvgate_chunk_head(ngx_http_kvgate_out_t *o, ngx_http_kvgate_ctx_t *ctx)
{
    ngx_http_kvgate_out_lit(o, "data: ");
    ngx_http_kvgate_object_head(o, ctx,
        ctx->req->endpoint == KVG_ENDPOINT_CHAT ? "chat.completion.chunk"
                                                : "text_completion");
}


static void
ngx_http_kvgate_chunk_tail(ngx_http_kvgate_out_t *o, ngx_http_kvgate_ctx_t *ctx)
{
    ngx_http_kvgate_out_lit(o, "]");

    if (ctx->req->include_usage) {
        ngx_http_kvgate_out_lit(o, ",\"usage\":null");
    }

    ngx_http_kvgate_out_lit(o, "}\n\n");
}


ngx_int_t
ngx_http_kvgate_stream_start(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx)
{
    ngx_int_t  rc;

    if (ngx_http_kvgate_add_header(r, "Cache-Control", "no-cache") != NGX_OK
        || ngx_http_kvgate_add_header(r, "X-Accel-Buffering", "no") != NGX_OK
        || ngx_http_kvgate_add_cache_headers(r, ctx) != NGX_OK)
    {
        return NGX_ERROR;
    }

    /* the header alone: the chunks follow as the engine makes them */

    ctx->header_sent = 1;
    rc = ngx_http_kvgate_send_response(r, NGX_HTTP_OK, "text/event-stream",
                                       -1, NULL);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    if (ctx->req->endpoint == KVG_ENDPOINT_MESSAGES) {
        return ngx_http_kvgate_message_stream_start(r, ctx);
    }

    /* chat streams open every choice with the assistant's role (with a
       vote: those of the first wave; later waves as they are drawn) */

    return ngx_http_kvgate_stream_roles(r, ctx, 0,
                                        ctx->sc ? ctx->sc_drawn
                                                : ctx->n_choices);
}


ngx_int_t
ngx_http_kvgate_stream_roles(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, ngx_uint_t from, ngx_uint_t to)
{
    ngx_int_t              rc;
    ngx_uint_t             j;
    ngx_http_kvgate_out_t  o;

    if (ctx->req->endpoint != KVG_ENDPOINT_CHAT || from >= to) {
        return NGX_OK;
    }

    ngx_http_kvgate_out_scratch(&o, r, ctx, 256 + 96 * (to - from));
    ngx_http_kvgate_chunk_head(&o, ctx);

    for (j = from; j < to; j++) {
        if (j > from) {
            ngx_http_kvgate_out_lit(&o, ",");
        }

        ngx_http_kvgate_out_lit(&o, "{\"index\":");
        ngx_http_kvgate_out_uint(&o, j);
        ngx_http_kvgate_out_lit(&o, ",\"delta\":{\"role\":\"assistant\","
                                    "\"content\":\"\"},\"logprobs\":null,"
                                    "\"finish_reason\":null}");
    }

    ngx_http_kvgate_chunk_tail(&o, ctx);

    rc = ngx_http_kvgate_stream_put(r, ctx, &o, 0);

    return rc == NGX_ERROR ? NGX_ERROR : NGX_OK;
}


ngx_int_t
ngx_http_kvgate_stream_tokens(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, const kvg_client_event *ev)
{
    size_t                     off;
    ngx_int_t                  rc;
    ngx_http_kvgate_out_t      o;
    ngx_http_kvgate_choice_t  *ch;

    if (ctx->req->endpoint == KVG_ENDPOINT_MESSAGES) {
        return ngx_http_kvgate_message_stream_text(r, ctx, ev);
    }

    ch = &ctx->choices[ev->sample];

    /* held-back text (a possible stop string) produces no chunk until it is
       decided; logprobs still go out with their tokens */

    if (ev->text_len == 0 && !(ctx->req->has_logprobs && ev->n_tokens)) {
        return NGX_OK;
    }

    ngx_http_kvgate_out_scratch(&o, r, ctx,
                                320 + 6 * ev->text_len + 96 * ev->n_tokens);
    ngx_http_kvgate_chunk_head(&o, ctx);

    ngx_http_kvgate_out_lit(&o, "{\"index\":");
    ngx_http_kvgate_out_uint(&o, ev->sample);

    if (ctx->req->endpoint == KVG_ENDPOINT_CHAT) {
        ngx_http_kvgate_out_lit(&o, ",\"delta\":{\"content\":");
        ngx_http_kvgate_out_json(&o, ev->text, ev->text_len);
        ngx_http_kvgate_out_lit(&o, "}");

    } else {
        ngx_http_kvgate_out_lit(&o, ",\"text\":");
        ngx_http_kvgate_out_json(&o, ev->text, ev->text_len);
    }

    ngx_http_kvgate_out_lit(&o, ",\"logprobs\":");
    off = ch->text_offset;
    ngx_http_kvgate_logprobs(&o, ctx, ev->tokens, ev->logprobs,
                             ev->logprobs ? ev->n_tokens : 0, &off);
    ch->text_offset = off;
    ngx_http_kvgate_out_lit(&o, ",\"finish_reason\":null}");

    ngx_http_kvgate_chunk_tail(&o, ctx);

    rc = ngx_http_kvgate_stream_put(r, ctx, &o, 0);

    return rc == NGX_ERROR ? NGX_ERROR : NGX_OK;
}


ngx_int_t
ngx_http_kvgate_stream_finished(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, ngx_uint_t choice)
{
    ngx_int_t              rc;
    ngx_http_kvgate_out_t  o;

    if (ctx->req->endpoint == KVG_ENDPOINT_MESSAGES) {
        return ngx_http_kvgate_message_stream_stop(r, ctx, choice);
    }

    ngx_http_kvgate_out_scratch(&o, r, ctx, 384);
    ngx_http_kvgate_chunk_head(&o, ctx);

    ngx_http_kvgate_out_lit(&o, "{\"index\":");
    ngx_http_kvgate_out_uint(&o, choice);

    if (ctx->req->endpoint == KVG_ENDPOINT_CHAT) {
        ngx_http_kvgate_out_lit(&o, ",\"delta\":{}");

    } else {
        ngx_http_kvgate_out_lit(&o, ",\"text\":\"\"");
    }

    ngx_http_kvgate_out_lit(&o, ",\"logprobs\":null,\"finish_reason\":\"");
    ngx_http_kvgate_out_cstr(&o, ngx_http_kvgate_finish_name(
                        ctx->choices[choice].finish_reason));
    ngx_http_kvgate_out_lit(&o, "\"}");

    ngx_http_kvgate_chunk_tail(&o, ctx);

    rc = ngx_http_kvgate_stream_put(r, ctx, &o, 0);

    return rc == NGX_ERROR ? NGX_ERROR : NGX_OK;
}


/* The end of a stream: the usage chunk (when asked for) and [DONE]; or an
   error event when the stream cannot complete. */

ngx_int_t
ngx_http_kvgate_stream_end(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    kvg_api_error *error)
{
    char                   json[KVG_API_ERROR_JSON_MAX];
    size_t                 len;
    ngx_http_kvgate_out_t  o;

    if (ctx->req->endpoint == KVG_ENDPOINT_MESSAGES) {
        return ngx_http_kvgate_message_stream_end(r, ctx, error);
    }

    ngx_http_kvgate_out_scratch(&o, r, ctx, 512
                                            + ngx_http_kvgate_vote_size(ctx));

    if (error) {
        ctx->status = error->status;
        len = kvg_api_error_render(error, json, sizeof(json));

        ngx_http_kvgate_out_lit(&o, "data: ");
        ngx_http_kvgate_out_mem(&o, json,
                                len < sizeof(json) ? len : sizeof(json) - 1);
        ngx_http_kvgate_out_lit(&o, "\n\n");

        return ngx_http_kvgate_stream_put(r, ctx, &o, 1);
    }

    /* the vote's chunk (no choices) comes before the usage chunk: OpenAI
       clients expect usage in the last chunk before [DONE] */

    if (ctx->sc) {
        ngx_http_kvgate_chunk_head(&o, ctx);
        ngx_http_kvgate_out_lit(&o, "],");

        if (ctx->req->include_usage) {
            ngx_http_kvgate_out_lit(&o, "\"usage\":null,");
        }

        ngx_http_kvgate_vote_object(&o, ctx);
        ngx_http_kvgate_out_lit(&o, "}\n\n");
    }

    if (ctx->req->include_usage) {
        ngx_http_kvgate_chunk_head(&o, ctx);
        ngx_http_kvgate_out_lit(&o, "],");
        ngx_http_kvgate_usage(&o, ctx);
        ngx_http_kvgate_out_lit(&o, "}\n\n");
    }

    ngx_http_kvgate_out_lit(&o, "data: [DONE]\n\n");

    return ngx_http_kvgate_stream_put(r, ctx, &o, 1);
}


/* ---- models ---- */

ngx_int_t
ngx_http_kvgate_send_models(ngx_http_request_t *r)
{
    kvg_stats                    st;
    ngx_str_t                    id;
    u_char                      *p;
    uint64_t                     created;
    ngx_uint_t                   one, i, j, n, dup;
    ngx_chain_t                 *out;
    ngx_http_kvgate_out_t        o;
    ngx_http_kvgate_ctx_t       *ctx;
    ngx_http_kvgate_group_t     *g;
    ngx_http_kvgate_engine_t    *e;
    const kvg_engine_info       *info, *other;
    ngx_http_kvgate_loc_conf_t  *klcf;
    kvg_api_error                err;
    u_char                       msg[512];

    ctx = ngx_http_get_module_ctx(r, ngx_http_kvgate_module);
    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);
    g = klcf->group;

    if (ngx_http_kvgate_group_up(g, NULL, 0) == NULL) {
        ctx->status = NGX_HTTP_SERVICE_UNAVAILABLE;
        ngx_http_kvgate_group_unavailable(g, &err);
        return ngx_http_kvgate_send_api_error(r, &err, 1);
    }

    /* GET .../models lists; GET .../models/{id} retrieves one */

    one = 0;
    ngx_str_null(&id);

    p = ngx_strlcasestrn(r->uri.data, r->uri.data + r->uri.len,
                         (u_char *) "/models/", sizeof("/models/") - 2);
    if (p) {
        one = 1;
        id.data = p + sizeof("/models/") - 1;
        id.len = r->uri.data + r->uri.len - id.data;

        if (ngx_http_kvgate_group_up(g, (char *) id.data, id.len) == NULL) {
            ctx->status = NGX_HTTP_NOT_FOUND;
            ngx_snprintf(msg, sizeof(msg) - 1,
                         "The model `%V` does not exist or you do not have "
                         "access to it.%Z", &id);
            return ngx_http_kvgate_send_error(r, NGX_HTTP_NOT_FOUND,
                                              "invalid_request_error",
                                              "model_not_found", (char *) msg,
                                              0);
        }
    }

    ngx_http_kvgate_out_init(&o, r->pool, 512);

    if (!one) {
        ngx_http_kvgate_out_lit(&o, "{\"object\":\"list\",\"data\":[");
    }

    /* the union of the models the group's up engines serve, each once (in
       the order of the group; "created": the first engine's start) */

    n = 0;

    for (i = 0; i < g->n; i++) {
        e = g->engines[i];
        info = ngx_http_kvgate_engine_info(e);

        if (info == NULL
            || (one && (id.len != ngx_strlen(info->model_name)
                        || ngx_strncmp(id.data, info->model_name, id.len)
                           != 0)))
        {
            continue;
        }

        dup = 0;

        for (j = 0; j < i; j++) {
            other = ngx_http_kvgate_engine_info(g->engines[j]);

            if (other && ngx_strcmp(other->model_name, info->model_name) == 0)
            {
                dup = 1;
                break;
            }
        }

        if (dup) {
            continue;
        }

        created = 0;

        if (ngx_http_kvgate_engine_read_stats(e, &st) == NGX_OK) {
            created = st.start_unix_ms / 1000;
        }

        if (n++) {
            ngx_http_kvgate_out_lit(&o, ",");
        }

        ngx_http_kvgate_out_lit(&o, "{\"id\":");
        ngx_http_kvgate_out_json(&o, info->model_name,
                                 ngx_strlen(info->model_name));
        ngx_http_kvgate_out_lit(&o, ",\"object\":\"model\",\"created\":");
        ngx_http_kvgate_out_uint(&o, created);
        ngx_http_kvgate_out_lit(&o, ",\"owned_by\":\"kvgate\",\"root\":\"");
        ngx_http_kvgate_out_cstr(&o, info->model_id_hex);
        ngx_http_kvgate_out_lit(&o, "\",\"max_model_len\":");
        ngx_http_kvgate_out_uint(&o, info->context_length);
        ngx_http_kvgate_out_lit(&o, ",\"chat_template\":{\"name\":");
        ngx_http_kvgate_out_json(&o, info->chat.name,
                                 ngx_strlen(info->chat.name));
        ngx_http_kvgate_out_lit(&o, ",\"source\":");
        ngx_http_kvgate_out_json(&o, info->chat.source,
                                 ngx_strlen(info->chat.source));
        ngx_http_kvgate_out_lit(&o, ",\"sha256\":");
        ngx_http_kvgate_out_json(&o, info->chat.sha256,
                                 ngx_strlen(info->chat.sha256));
        ngx_http_kvgate_out_lit(&o, "}}");

        if (one) {
            break;
        }
    }

    if (!one) {
        ngx_http_kvgate_out_lit(&o, "]}");
    }

    ngx_http_kvgate_out_lit(&o, "\n");

    out = ngx_http_kvgate_output_whole(r, &o);
    if (out == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->status = NGX_HTTP_OK;

    return ngx_http_kvgate_send_response(r, NGX_HTTP_OK, "application/json",
                                         o.pos - o.start, out);
}
