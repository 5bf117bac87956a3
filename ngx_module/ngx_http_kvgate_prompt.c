
/*
 * A completion request's body turned into what the engine and a front tier
 * need: the parsed request (libkvgate), the tenant and its salt, the prompt's
 * tokens (the engine's chat template and tokenizer, content normalized
 * first), the stop ids and strings, the length bucket, the block hashes
 * salted with the tenant's salt, and the route key. Used by the request
 * lifecycle (ngx_http_kvgate_request.c) before submitting, and by
 * $kvgate_route_key in a front tier that only proxies
 * (ngx_http_kvgate_module.c). Reads the engine's model and tokenizer through
 * the connection, nothing else.
 */


#include "ngx_http_kvgate_module.h"

#include "chat_template.h"
#include "jinja.h"
#include "normalize.h"
#include "prefix_hash.h"
#include "tokenizer.h"

#if (NGX_LINUX)
#include <sys/resource.h>
#include <sys/syscall.h>
#endif


/* the nice value a prompt task runs at (see ngx_http_kvgate_prompt_thread) */
#define NGX_HTTP_KVGATE_TASK_NICE  10


/*
 * Where the work runs. Parsing, normalizing, tokenizing and hashing a long
 * prompt take milliseconds per megabyte, time every other request of the
 * worker would wait: a body of at least kvgate_thread_pool's min_bytes goes
 * to an nginx thread pool. The work (ngx_http_kvgate_prompt_work) is the
 * same code on either path and touches only what the task owns: ctx's prompt
 * fields, memory from malloc (nginx pools are not thread-safe), a copy of
 * the engine's info holding its own references to the tokenizer and the chat
 * template (the engine connection frees its own when the engine goes away) and a prefix
 * hasher: the worker's in the event loop, the task's own off it (a hasher
 * is not thread-safe).
 */

typedef struct {
    ngx_http_request_t               *request;
    ngx_http_kvgate_ctx_t            *ctx;
    ngx_http_kvgate_loc_conf_t       *klcf;
    ngx_http_kvgate_prompt_done_pt    done;
    kvg_engine_info                   info;       /* tokenizer, chat_template:
                                                     references */
    u_char                           *body;       /* malloc'd */
    size_t                            len;
    ngx_int_t                         rc;
    kvg_api_error                     err;
} ngx_http_kvgate_prompt_task_t;


static void ngx_http_kvgate_prompt_cleanup(void *data);
static ngx_int_t ngx_http_kvgate_tenant(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, ngx_http_kvgate_loc_conf_t *klcf,
    kvg_api_error *err);


/* The event loop's prefix hasher: one per worker, made at its first prompt,
   freed at exit (ngx_http_kvgate_prompt_exit_process). */
static kvg_prefix_hasher  *ngx_http_kvgate_loop_hasher;


/* What parsing allocated outside the request pool. */

void
ngx_http_kvgate_prompt_free(ngx_http_kvgate_ctx_t *ctx)
{
    if (ctx->req) {
        kvg_request_free(ctx->req);
        ctx->req = NULL;
    }

    if (ctx->tokens) {
        free(ctx->tokens);
        ctx->tokens = NULL;
    }

    if (ctx->hashes) {
        free(ctx->hashes);
        ctx->hashes = NULL;
    }
}


static void
ngx_http_kvgate_prompt_cleanup(void *data)
{
    ngx_http_kvgate_prompt_free(data);
}


/* ---- the body ---- */

/* The bytes a body buffer holds in memory; a chunked body's chain has
   buffers with no memory at all (pos and last NULL). */

static size_t
ngx_http_kvgate_buf_mem(const ngx_buf_t *b)
{
    return b->pos != NULL && b->last > b->pos ? (size_t) (b->last - b->pos)
                                              : 0;
}


/* Its length (it may be in memory, in a temp file, or both). */

static size_t
ngx_http_kvgate_body_size(ngx_http_request_t *r)
{
    off_t         len;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    if (r->request_body == NULL) {
        return 0;
    }

    len = 0;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;
        len += b->in_file ? b->file_last - b->file_pos
                          : (off_t) ngx_http_kvgate_buf_mem(b);
    }

    return (size_t) len;
}


/*
 * Copies the body into p (len bytes, as ngx_http_kvgate_body_size said).
 * Safe off the event loop: it reads the chain and the temp file (pread) of
 * a request the event loop leaves alone meanwhile, and allocates nothing.
 */

static ngx_int_t
ngx_http_kvgate_body_copy(ngx_http_request_t *r, u_char *p, size_t len,
    ngx_log_t *log)
{
    size_t        n;
    ssize_t       got;
    u_char       *end;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    end = p + len;

    /* a chunked body leaves zero-length buffers in the chain (a last_buf
       with pos NULL, empty chunks): there is nothing to copy from them, and
       ngx_cpymem() of a NULL source is undefined even for no bytes */

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if (b->in_file) {
            n = (size_t) (b->file_last - b->file_pos);
            if (n == 0) {
                continue;
            }

            if (n > (size_t) (end - p)) {
                return NGX_ERROR;
            }

            got = ngx_read_file(b->file, p, n, b->file_pos);

            if (got != (ssize_t) n) {
                ngx_log_error(NGX_LOG_ERR, log, 0,
                              "kvgate: cannot read the request body from "
                              "\"%V\"", &b->file->name);
                return NGX_ERROR;
            }

            p += n;

        } else {
            /* an empty buffer (chunked bodies have them) may have no pos */
            n = ngx_http_kvgate_buf_mem(b);
            if (n == 0) {
                continue;
            }

            if (n > (size_t) (end - p)) {
                return NGX_ERROR;
            }

            p = ngx_cpymem(p, b->pos, n);
        }
    }

    return p == end ? NGX_OK : NGX_ERROR;
}


/* ---- tokens ---- */

static ngx_int_t
ngx_http_kvgate_append_ids(ngx_http_kvgate_ctx_t *ctx, size_t *cap,
    const int32_t *ids, size_t n)
{
    int32_t  *g;
    size_t    nc;

    if (ctx->n_tokens + n > *cap) {
        nc = *cap ? *cap * 2 : 256;

        while (nc < ctx->n_tokens + n) {
            nc *= 2;
        }

        g = realloc(ctx->tokens, nc * sizeof(int32_t));
        if (g == NULL) {
            return NGX_ERROR;
        }

        ctx->tokens = g;
        *cap = nc;
    }

    ngx_memcpy(ctx->tokens + ctx->n_tokens, ids, n * sizeof(int32_t));
    ctx->n_tokens += n;

    return NGX_OK;
}


/*
 * Tokenizes text (normalized first when it is content and steps are on).
 * data: the spans of a rendered chat prompt that came from the request
 * (special-token text there stays text), or NULL.
 */

static ngx_int_t
ngx_http_kvgate_encode(ngx_http_kvgate_ctx_t *ctx, size_t *cap,
    const kvg_engine_info *info, const char *text, size_t len,
    unsigned flags, ngx_uint_t content, unsigned normalize,
    const kvg_text_span *data, size_t n_data, kvg_api_error *err,
    const char *param)
{
    int                   rc;
    char                  msg[256], *norm;
    size_t                n, nlen, least;
    int32_t              *ids;
    const kvg_tokenizer  *tok = info->tokenizer;

    norm = NULL;

    if (content && normalize && len) {
        if (kvg_normalize(normalize, text, len, &norm, &nlen, msg, sizeof(msg))
            != 0)
        {
            kvg_api_error_set(err, 400, "invalid_value", param, "%s", msg);
            return NGX_ERROR;
        }

        text = norm;
        len = nlen;
    }

    if (len == 0 && !(flags & KVG_ENC_BOS)) {
        free(norm);
        return NGX_OK;
    }

    /*
     * No token stands for more than kvg_tokenizer_max_token_bytes() bytes of
     * text, so the length alone may prove that the prompt cannot fit: then
     * the answer is the one tokenizing would give, without the time it takes.
     */

    least = ctx->n_tokens + kvg_tokenizer_min_tokens(tok, len);

    if (least >= info->context_length) {
        free(norm);
        kvg_api_error_set(err, 400, "context_length_exceeded", param,
                          "This model's maximum context length is %u tokens. "
                          "However, your prompt resulted in at least %zu "
                          "tokens, which leaves no room for a completion.",
                          info->context_length, least);
        return NGX_ERROR;
    }

    rc = kvg_tokenizer_encode_spans(tok, text, len, flags, data, n_data,
                                    &ids, &n, msg, sizeof(msg));
    free(norm);

    if (rc != 0) {
        kvg_api_error_set(err, 400, "invalid_value", param, "%s", msg);
        return NGX_ERROR;
    }

    rc = ngx_http_kvgate_append_ids(ctx, cap, ids, n);
    free(ids);

    if (rc != NGX_OK) {
        kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * kvgate_normalize on a chat request: each message's content, before the
 * template sees it (the template's own text is never rewritten).
 */

static ngx_int_t
ngx_http_kvgate_chat_normalize(json_t *data, unsigned normalize,
    kvg_api_error *err)
{
    char         msg[256], *norm;
    size_t       i, nlen;
    json_t      *m, *c, *s;

    json_array_foreach(json_object_get(data, "messages"), i, m) {
        c = json_object_get(m, "content");

        if (!json_is_string(c) || json_string_length(c) == 0) {
            continue;
        }

        if (kvg_normalize(normalize, json_string_value(c),
                          json_string_length(c), &norm, &nlen, msg,
                          sizeof(msg))
            != 0)
        {
            kvg_api_error_set(err, 400, "invalid_value", "messages", "%s",
                              msg);
            return NGX_ERROR;
        }

        s = json_stringn_nocheck(norm, nlen);
        free(norm);

        if (s == NULL || json_object_set_new(m, "content", s) != 0) {
            kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* The vocabulary's piece for id as a template variable ("" when none). */

static json_t *
ngx_http_kvgate_piece_json(const kvg_engine_info *info, int32_t id)
{
    size_t       len;
    const char  *p;

    p = id >= 0 ? kvg_tokenizer_piece(info->tokenizer, id, &len) : NULL;

    return p ? json_stringn(p, len) : json_string("");
}


/* The turn ends at the template's end-of-turn tokens the vocabulary has. */

static void
ngx_http_kvgate_chat_stops(ngx_http_kvgate_ctx_t *ctx,
    const kvg_engine_info *info)
{
    size_t               k, n;
    int32_t              id, ret;
    const char          *name;
    const char *const   *pieces;

    ret = kvg_tokenizer_find_piece(info->tokenizer, "<|return|>", 10);
    pieces = kvg_chat_end_pieces(&n);

    for (k = 0; k < n && ctx->n_stop_ids < KVG_PROTO_MAX_STOP_IDS; k++) {
        if (ret >= 0 && ngx_strcmp(pieces[k], "<|end|>") == 0) {
            continue;
        }

        id = kvg_tokenizer_find_piece(info->tokenizer, pieces[k],
                                      ngx_strlen(pieces[k]));
        if (id >= 0 && id != info->eos) {
            ctx->stop_ids[ctx->n_stop_ids++] = id;
        }
    }

    name = info->chat.origin == KVG_CHAT_BUILTIN ? info->chat.name : NULL;
    pieces = kvg_chat_builtin_stop_strings(name, &n);

    for (k = 0; k < n && ctx->n_stop < KVG_PROTO_MAX_STOP; k++) {
        ctx->stop[ctx->n_stop] = pieces[k];
        ctx->stop_len[ctx->n_stop++] = ngx_strlen(pieces[k]);
    }
}


/*
 * Where a cache_control breakpoint ends in the prompt's tokens: the
 * conversation up to and including the marked block (the messages before it,
 * its message with its blocks up to the marked one) rendered without the
 * generation prompt and tokenized; the prefix those tokens share with the
 * whole prompt's covers the marked block (what the template writes after it
 * differs). 0 when that conversation does not render (a template that wants
 * a user turn last): the breakpoint then holds nothing.
 */

static size_t
ngx_http_kvgate_breakpoint_tokens(ngx_http_kvgate_ctx_t *ctx,
    const kvg_engine_info *info, json_t *trusted,
    const kvg_cache_breakpoint *bp)
{
    int                  rc;
    char                 msg[256];
    size_t               i, n, idx, common;
    int32_t             *ids;
    json_t              *data, *all, *msgs, *m, *first, *role, *content;
    kvg_jinja_output     out;

    all = json_object_get(ctx->req->chat_data, "messages");
    first = json_array_get(all, 0);
    role = json_object_get(first, "role");

    /* the system prompt, when there is one, is the first message */

    idx = (size_t) (bp->message + 1);

    if (!(json_is_string(role)
          && ngx_strcmp(json_string_value(role), "system") == 0))
    {
        if (bp->message < 0) {
            return 0;
        }

        idx = (size_t) bp->message;
    }

    if (idx >= json_array_size(all)) {
        return 0;
    }

    data = json_copy(ctx->req->chat_data);
    msgs = json_array();

    if (data == NULL || msgs == NULL || json_object_set(data, "messages", msgs)) {
        json_decref(data);
        json_decref(msgs);
        return 0;
    }

    for (i = 0; i < idx; i++) {
        json_array_append(msgs, json_array_get(all, i));
    }

    m = json_copy(json_array_get(all, idx));
    content = json_object_get(m, "content");

    if (m != NULL && json_is_array(content)) {
        json_t  *parts = json_array();

        for (i = 0; i <= (size_t) bp->block && i < json_array_size(content);
             i++)
        {
            json_array_append(parts, json_array_get(content, i));
        }

        json_object_set_new(m, "content", parts);
    }

    json_array_append_new(msgs, m);
    json_decref(msgs);

    rc = kvg_jinja_render(info->chat_template, trusted, data, NULL, &out, msg,
                          sizeof(msg));
    json_decref(data);

    if (rc != KVG_JINJA_OK) {
        return 0;
    }

    rc = kvg_tokenizer_encode_spans(info->tokenizer, out.text, out.len,
                                    KVG_ENC_PARSE_SPECIAL, out.spans,
                                    out.n_spans, &ids, &n, msg, sizeof(msg));
    kvg_jinja_output_free(&out);

    if (rc != 0) {
        return 0;
    }

    for (common = 0; common < n && common < ctx->n_tokens; common++) {
        if (ids[common] != ctx->tokens[common]) {
            break;
        }
    }

    free(ids);

    return common;
}


/*
 * The engine's chat template over the request's messages, tokenized as one
 * text the way the model's reference does (the template renders BOS itself;
 * nothing is added), except that special-token text inside what came from
 * the request stays text: a user cannot forge a turn.
 */

static ngx_int_t
ngx_http_kvgate_chat_tokens(ngx_http_kvgate_ctx_t *ctx,
    const kvg_engine_info *info, unsigned normalize, kvg_api_error *err)
{
    int                  rc;
    char                 msg[512];
    size_t               cap;
    json_t              *trusted;
    kvg_jinja_output     out;
    const kvg_request   *req = ctx->req;

    if (info->chat_template == NULL) {
        kvg_api_error_set(err, 400, "chat_template_missing", "messages",
                          "The model '%s' has no chat template, so chat "
                          "requests cannot be answered: use /v1/completions, "
                          "or start its engine with --chat-template "
                          "FILE.jinja (or a built-in: "
                          KVG_CHAT_BUILTIN_NAMES ").", info->model_name);
        return NGX_ERROR;
    }

    if (normalize
        && ngx_http_kvgate_chat_normalize(req->chat_data, normalize, err)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    trusted = json_object();

    if (trusted == NULL
        || json_object_set_new(trusted, "bos_token",
                               ngx_http_kvgate_piece_json(info, info->bos))
        || json_object_set_new(trusted, "eos_token",
                               ngx_http_kvgate_piece_json(info, info->eos))
        || json_object_set_new(trusted, "add_generation_prompt",
                               json_true()))
    {
        json_decref(trusted);
        kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
        return NGX_ERROR;
    }

    rc = kvg_jinja_render(info->chat_template, trusted, req->chat_data, NULL,
                          &out, msg, sizeof(msg));

    switch (rc) {

    case KVG_JINJA_OK:
        break;

    case KVG_JINJA_RAISED:
        json_decref(trusted);
        kvg_api_error_set(err, 400, "invalid_value", "messages",
                          "The model's chat template does not accept these "
                          "messages: %s", msg);
        return NGX_ERROR;

    case KVG_JINJA_NOMEM:
        json_decref(trusted);
        kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
        return NGX_ERROR;

    default:
        json_decref(trusted);
        kvg_api_error_set(err, 400, "invalid_value", "messages",
                          "The model's chat template cannot render these "
                          "messages: %s", msg);
        return NGX_ERROR;
    }

    cap = 0;
    rc = ngx_http_kvgate_encode(ctx, &cap, info, out.text, out.len,
                                KVG_ENC_PARSE_SPECIAL, 0, 0, out.spans,
                                out.n_spans, err, "messages");
    kvg_jinja_output_free(&out);

    if (rc != NGX_OK) {
        json_decref(trusted);
        return NGX_ERROR;
    }

    /* where each cache_control breakpoint ends */

    ctx->n_breakpoints = 0;

    if (req->n_cache_breakpoints
        && json_object_set_new(trusted, "add_generation_prompt", json_false())
           == 0)
    {
        size_t  i;

        for (i = 0; i < req->n_cache_breakpoints
                    && ctx->n_breakpoints < KVG_PROTO_MAX_HOLDS; i++)
        {
            ctx->bp_tokens[ctx->n_breakpoints] =
                ngx_http_kvgate_breakpoint_tokens(ctx, info, trusted,
                                                  &req->cache_breakpoints[i]);
            ctx->bp_ttl_s[ctx->n_breakpoints++] =
                req->cache_breakpoints[i].ttl_s;
        }
    }

    json_decref(trusted);

    ngx_http_kvgate_chat_stops(ctx, info);

    return NGX_OK;
}


/*
 * How many of the request's headers $http_<name> would read: nginx compares
 * the header's name lowercased, with '-' as '_'.
 */

static ngx_uint_t
ngx_http_kvgate_header_count(ngx_http_request_t *r, ngx_str_t *name)
{
    u_char            ch;
    ngx_uint_t        i, k, n;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    n = 0;
    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len != name->len) {
            continue;
        }

        for (k = 0; k < name->len; k++) {
            ch = ngx_tolower(h[i].key.data[k]);

            if (ch == '-') {
                ch = '_';
            }

            if (ch != name->data[k]) {
                break;
            }
        }

        if (k == name->len) {
            n++;
        }
    }

    return n;
}


static ngx_int_t
ngx_http_kvgate_tenant(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_loc_conf_t *klcf, kvg_api_error *err)
{
    u_char      *salt;
    ngx_str_t    t, *name;
    ngx_uint_t   i, n;

    ngx_str_null(&t);

    /*
     * A tenant header given twice is refused, not resolved: nginx's
     * $http_<name> reads the first one, which behind a proxy that appends
     * its own is the client's.
     */

    if (klcf->tenant_headers) {
        name = klcf->tenant_headers->elts;

        for (i = 0; i < klcf->tenant_headers->nelts; i++) {
            n = ngx_http_kvgate_header_count(r, &name[i]);

            if (n > 1) {
                kvg_api_error_set(err, 400, "invalid_tenant", NULL,
                                  "The request carries the tenant header "
                                  "(kvgate_tenant $http_%.*s) %u times: a "
                                  "tenant is given once",
                                  (int) name[i].len, name[i].data,
                                  (unsigned) n);
                return NGX_ERROR;
            }
        }
    }

    if (klcf->tenant != NULL
        && ngx_http_complex_value(r, klcf->tenant, &t) != NGX_OK)
    {
        kvg_api_error_set(err, 500, NULL, NULL, "cannot evaluate kvgate_tenant");
        return NGX_ERROR;
    }

    if (t.len == 0) {
        if (klcf->tenant_required) {
            kvg_api_error_set(err, 401, "missing_tenant", NULL,
                              "This server requires a tenant: the request "
                              "carries none (kvgate_tenant evaluated to an "
                              "empty value)");
            return NGX_ERROR;
        }

        /*
         * The location's default tenant is a namespace of its own: its salt is
         * KVG_PREFIX_DEFAULT_MARK (a NUL, which no named tenant holds: refused
         * below) then its name, so "X-Tenant-Id: default" never shares the
         * anonymous tenant's cache (prefix_hash.h).
         */

        salt = ngx_pnalloc(r->pool, KVG_PROTO_MAX_SALT);
        if (salt == NULL) {
            kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
            return NGX_ERROR;
        }

        /* kvgate_default_tenant is checked to fit at configuration time */
        ctx->salt.len = kvg_prefix_default_salt(klcf->default_tenant.data,
                                                klcf->default_tenant.len,
                                                salt, KVG_PROTO_MAX_SALT);
        ctx->salt.data = salt;

        if (ctx->salt.len == 0) {
            ngx_str_null(&ctx->salt);
            kvg_api_error_set(err, 500, NULL, NULL,
                              "kvgate_default_tenant is too long");
            return NGX_ERROR;
        }

        ctx->tenant = klcf->default_tenant;
        ctx->default_tenant = 1;

        return NGX_OK;
    }

    if (t.len > KVG_PROTO_MAX_SALT) {
        kvg_api_error_set(err, 400, "invalid_tenant", NULL,
                          "The tenant is longer than %d bytes",
                          KVG_PROTO_MAX_SALT);
        return NGX_ERROR;
    }

    if (ngx_strlchr(t.data, t.data + t.len, '\0') != NULL) {
        kvg_api_error_set(err, 400, "invalid_tenant", NULL,
                          "The tenant contains a NUL byte");
        return NGX_ERROR;
    }

    /* a named tenant is salted with its name */

    ctx->tenant = t;
    ctx->salt = t;

    return NGX_OK;
}


/* The prompt's tokens from a parsed request (with the stop ids and strings
   the request and the template imply). */

static ngx_int_t
ngx_http_kvgate_tokens(ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_loc_conf_t *klcf, const kvg_engine_info *info,
    kvg_api_error *err)
{
    size_t              cap, i;
    const kvg_request  *req = ctx->req;

    cap = 0;

    for (i = 0; i < req->n_stop; i++) {
        if (req->stop_len[i] > KVG_PROTO_MAX_STOP_LEN) {
            kvg_api_error_set(err, 400, "string_above_max_length", "stop",
                              "Invalid 'stop': stop strings are at most %d "
                              "bytes here, got %zu", KVG_PROTO_MAX_STOP_LEN,
                              req->stop_len[i]);
            return NGX_ERROR;
        }

        ctx->stop[ctx->n_stop] = req->stop[i];
        ctx->stop_len[ctx->n_stop++] = req->stop_len[i];
    }

    if (req->endpoint != KVG_ENDPOINT_COMPLETIONS) {
        return ngx_http_kvgate_chat_tokens(ctx, info,
                                           (unsigned) klcf->normalize, err);
    }

    if (req->prompt_kind == KVG_PROMPT_TOKENS) {
        for (i = 0; i < req->n_prompt_tokens; i++) {
            if ((uint32_t) req->prompt_tokens[i] >= info->vocab_size) {
                kvg_api_error_set(err, 400, "invalid_value", "prompt",
                                  "Invalid 'prompt': token %d at position %zu "
                                  "is outside the model's vocabulary of %u",
                                  req->prompt_tokens[i], i, info->vocab_size);
                return NGX_ERROR;
            }
        }

        if (ngx_http_kvgate_append_ids(ctx, &cap, req->prompt_tokens,
                                       req->n_prompt_tokens)
            != NGX_OK)
        {
            kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
            return NGX_ERROR;
        }

        return NGX_OK;
    }

    return ngx_http_kvgate_encode(ctx, &cap, info, req->prompt,
                                  req->prompt_len,
                                  info->add_bos ? KVG_ENC_BOS : 0, 1,
                                  (unsigned) klcf->normalize, NULL, 0, err,
                                  "prompt");
}


/*
 * Bucket, block hashes and the route key: the gateway's one computation of
 * the chain (prefix_hash.h), rooted at the model of info (the engine the
 * prompt is tokenized for) and the tenant's salt, on either path: hasher is
 * the worker's in the event loop, a task's own in a thread (a hasher is not
 * thread-safe), and the chain is the same.
 */

static ngx_int_t
ngx_http_kvgate_hash(ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_loc_conf_t *klcf, const kvg_engine_info *info,
    kvg_prefix_hasher *hasher, kvg_api_error *err)
{
    char     msg[256];
    size_t   nb, depth;
    uint8_t  root[KVG_PREFIX_HASH_LEN];
    char     hex[2 * KVG_PREFIX_HASH_LEN + 1];

    ctx->bucket = kvg_bucket_index(&klcf->buckets, ctx->n_tokens);
    ctx->bypass = ctx->bucket == 0;

    nb = ctx->n_tokens / info->block_tokens;
    ctx->n_hashes = 0;

    if (kvg_prefix_root(hasher, info->model_id, KVG_PREFIX_HASH_LEN,
                        ctx->salt.data, ctx->salt.len, root, msg, sizeof(msg))
        != 0)
    {
        kvg_api_error_set(err, 503, "engine_unavailable", NULL, "%s", msg);
        return NGX_ERROR;
    }

    if (nb) {
        ctx->hashes = malloc(nb * KVG_PREFIX_HASH_LEN);
        if (ctx->hashes == NULL) {
            kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
            return NGX_ERROR;
        }

        if (kvg_prefix_chain(hasher, root, ctx->tokens, ctx->n_tokens,
                             info->block_tokens, ctx->hashes, nb,
                             &ctx->n_hashes, msg, sizeof(msg))
            != 0)
        {
            kvg_api_error_set(err, 503, "engine_unavailable", NULL, "%s",
                              msg);
            return NGX_ERROR;
        }
    }

    /*
     * The route key: the chain hash after route_blocks blocks (fewer when the
     * prompt is shorter; the root when it has no full block), so prompts
     * sharing their first blocks, under one tenant and model, land on the
     * same node.
     */

    depth = ngx_min(ctx->n_hashes, (size_t) klcf->route_blocks);

    kvg_prefix_hex(depth ? ctx->hashes[depth - 1] : root, hex);

    ngx_memcpy(ctx->route_key, hex, sizeof(ctx->route_key));
    ctx->route_key_set = 1;

    return NGX_OK;
}


/*
 * The body to the request, tokens and hashes: everything after the tenant,
 * which is resolved (and a request refused for it answered) before, in the
 * event loop. Runs in the event loop or a thread (see the top of the file).
 */

static ngx_int_t
ngx_http_kvgate_prompt_work(ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_loc_conf_t *klcf, const kvg_engine_info *info,
    kvg_prefix_hasher *hasher, const u_char *body, size_t len,
    kvg_api_error *err)
{
    kvg_endpoint  ep;

    ep = ctx->endpoint == NGX_HTTP_KVGATE_EP_CHAT ? KVG_ENDPOINT_CHAT
         : ctx->endpoint == NGX_HTTP_KVGATE_EP_MESSAGES ? KVG_ENDPOINT_MESSAGES
         : KVG_ENDPOINT_COMPLETIONS;

    ctx->req = kvg_request_parse(ep, (const char *) body, len, err);
    if (ctx->req == NULL) {
        return NGX_ERROR;
    }

    /* the model first: no tokenizing for a request this server cannot serve */

    if (ctx->req->model_len != ngx_strlen(info->model_name)
        || ngx_strncmp(ctx->req->model, info->model_name, ctx->req->model_len)
           != 0)
    {
        kvg_api_error_set(err, 404, "model_not_found", "model",
                          "The model `%s` does not exist or you do not have "
                          "access to it. This server serves `%s`.",
                          ctx->req->model, info->model_name);
        return NGX_ERROR;
    }

    if (ngx_http_kvgate_tokens(ctx, klcf, info, err) != NGX_OK
        || ngx_http_kvgate_hash(ctx, klcf, info, hasher, err) != NGX_OK)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * The tenant first, once: it comes before anything in the body is looked at,
 * so a request refused for its tenant (401 missing_tenant, 400
 * invalid_tenant) gets that answer whatever its body holds, as an API
 * answers a request without credentials, and no body is parsed or tokenized
 * for it. It evaluates variables (the request pool): in the event loop.
 */

static ngx_int_t
ngx_http_kvgate_prompt_tenant(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, ngx_http_kvgate_loc_conf_t *klcf,
    kvg_api_error *err)
{
    if (ctx->salt.data != NULL) {
        /* resolved for another engine of the group before */
        return NGX_OK;
    }

    return ngx_http_kvgate_tenant(r, ctx, klcf, err);
}


/* The body to the request, tokens and hashes in the event loop (the tenant
   resolved). */

static ngx_int_t
ngx_http_kvgate_prompt_loop(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_loc_conf_t *klcf, const kvg_engine_info *info,
    kvg_api_error *err)
{
    char        msg[256];
    size_t      len;
    u_char     *body;
    ngx_int_t   rc;

    if (ngx_http_kvgate_loop_hasher == NULL) {
        ngx_http_kvgate_loop_hasher = kvg_prefix_hasher_new(msg, sizeof(msg));

        if (ngx_http_kvgate_loop_hasher == NULL) {
            kvg_api_error_set(err, 500, NULL, NULL, "%s", msg);
            return NGX_ERROR;
        }
    }

    len = ngx_http_kvgate_body_size(r);
    body = malloc(len + 1);

    if (body == NULL
        || ngx_http_kvgate_body_copy(r, body, len, r->connection->log)
           != NGX_OK)
    {
        free(body);
        kvg_api_error_set(err, 500, NULL, NULL, "cannot read the request body");
        return NGX_ERROR;
    }

    body[len] = '\0';

    rc = ngx_http_kvgate_prompt_work(ctx, klcf, info,
                                     ngx_http_kvgate_loop_hasher, body, len,
                                     err);
    free(body);

    return rc;
}


/* The tenant, then parse the body, tokenize, hash: in the event loop. */

ngx_int_t
ngx_http_kvgate_prompt_parse(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_loc_conf_t *klcf, const kvg_engine_info *info,
    kvg_api_error *err)
{
    if (ngx_http_kvgate_prompt_tenant(r, ctx, klcf, err) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_kvgate_prompt_loop(r, ctx, klcf, info, err);
}


void
ngx_http_kvgate_prompt_exit_process(void)
{
    kvg_prefix_hasher_free(ngx_http_kvgate_loop_hasher);
    ngx_http_kvgate_loop_hasher = NULL;
}


/* ---- the client, while its request waits ---- */

/*
 * Whether the client has closed its connection, told without reading what
 * it may still send (nginx's ngx_http_test_reading does the same): an EOF
 * or a socket error marks the connection (c->error) and returns 1, with
 * *err the socket error (0 for a plain EOF). A pipelined request waiting
 * to be read is not an EOF. Used while a request waits for the engine or
 * for its prompt task.
 */

ngx_uint_t
ngx_http_kvgate_client_gone(ngx_http_request_t *r, ngx_err_t *err)
{
    int                n;
    char               buf[1];
    ngx_event_t       *rev;
    ngx_connection_t  *c;

    c = r->connection;
    rev = c->read;
    *err = 0;

    if (c->error) {
        return 1;
    }

#if (NGX_HTTP_V2)
    if (r->stream) {
        return 0;
    }
#endif

#if (NGX_HAVE_EPOLLRDHUP)

    if ((ngx_event_flags & NGX_USE_EPOLL_EVENT) && ngx_use_epoll_rdhup) {
        socklen_t  len;

        if (!rev->pending_eof) {
            return 0;
        }

        len = sizeof(ngx_err_t);
        (void) getsockopt(c->fd, SOL_SOCKET, SO_ERROR, (void *) err, &len);

        rev->eof = 1;
        c->error = 1;

        return 1;
    }

#endif

    n = recv(c->fd, buf, 1, MSG_PEEK);

    if (n > 0) {
        return 0;
    }

    if (n == -1) {
        *err = ngx_socket_errno;

        if (*err == NGX_EAGAIN) {
            *err = 0;
            return 0;
        }

        rev->error = 1;
    }

    rev->eof = 1;
    c->error = 1;

    return 1;
}


/* ---- off the event loop ---- */

#if (NGX_THREADS)

static void
ngx_http_kvgate_prompt_thread(void *data, ngx_log_t *log)
{
    char                            msg[256];
    kvg_prefix_hasher              *hasher;
    ngx_http_kvgate_prompt_task_t  *t = data;
#if (NGX_LINUX)
    int                             prio;
    pid_t                           tid;

    /*
     * A long prompt's work yields the CPU to the event loops: on a machine
     * with fewer cores than busy tasks, small requests would otherwise queue
     * behind the tokenizers for the CPU. Only this thread, only for this
     * task (the pool's threads serve other modules too); the tokens are the
     * same whatever the priority.
     */

    tid = (pid_t) syscall(SYS_gettid);
    errno = 0;
    prio = getpriority(PRIO_PROCESS, (id_t) tid);

    if (prio == -1 && errno != 0) {
        tid = 0;

    } else if (prio < NGX_HTTP_KVGATE_TASK_NICE) {
        (void) setpriority(PRIO_PROCESS, (id_t) tid,
                           NGX_HTTP_KVGATE_TASK_NICE);
    } else {
        tid = 0;
    }
#endif

    t->rc = NGX_ERROR;

    if (ngx_http_kvgate_body_copy(t->request, t->body, t->len, log)
        != NGX_OK)
    {
        kvg_api_error_set(&t->err, 500, NULL, NULL,
                          "cannot read the request body");
        goto done;
    }

    t->body[t->len] = '\0';

    hasher = kvg_prefix_hasher_new(msg, sizeof(msg));
    if (hasher == NULL) {
        kvg_api_error_set(&t->err, 500, NULL, NULL, "%s", msg);
        goto done;
    }

    t->rc = ngx_http_kvgate_prompt_work(t->ctx, t->klcf, &t->info, hasher,
                                        t->body, t->len, &t->err);

    kvg_prefix_hasher_free(hasher);

done:

    free(t->body);
    t->body = NULL;

    /* the engine connection may have dropped its own reference meanwhile */

    kvg_tokenizer_free((kvg_tokenizer *) t->info.tokenizer);
    t->info.tokenizer = NULL;
    kvg_jinja_free((kvg_jinja *) t->info.chat_template);
    t->info.chat_template = NULL;

#if (NGX_LINUX)
    if (tid != 0) {
        /* back to the pool's own priority (raising it again is allowed
           up to RLIMIT_NICE; where it is not, the thread stays lower) */
        (void) setpriority(PRIO_PROCESS, (id_t) tid, prio);
    }
#endif
}


/* While the task runs: note a client that leaves (the request cannot end
   before the task does; its completion answers such a request). */

static void
ngx_http_kvgate_prompt_reading(ngx_http_request_t *r)
{
    ngx_err_t  err;

    (void) ngx_http_kvgate_client_gone(r, &err);
}


static void
ngx_http_kvgate_prompt_timer(ngx_event_t *ev)
{
    ngx_http_kvgate_ctx_t  *ctx = ev->data;

    ctx->prompt_timedout = 1;
}


/* The task is done: back in the event loop. */

static void
ngx_http_kvgate_prompt_event(ngx_event_t *ev)
{
    ngx_connection_t               *c;
    ngx_http_request_t             *r;
    ngx_http_kvgate_ctx_t          *ctx;
    ngx_http_kvgate_prompt_task_t  *t;

    t = ev->data;
    r = t->request;
    ctx = t->ctx;
    c = r->connection;

    ngx_http_set_log_request(c->log, r);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "kvgate: prompt task done: rc %i, %uz tokens",
                   t->rc, ctx->n_tokens);

    r->main->blocked--;
    r->aio = 0;
    r->read_event_handler = ngx_http_block_reading;

    if (ctx->deadline.timer_set) {
        ngx_del_timer(&ctx->deadline);
    }

    if (ctx->prompt_timedout && !c->error) {
        kvg_api_error_set(&t->err, 504, "timeout", NULL,
                          "The request did not complete within %lu ms "
                          "(kvgate_timeout)", (unsigned long) t->klcf->timeout);
        t->rc = NGX_ERROR;
    }

    /*
     * The reference taken when the task was posted goes first: the body
     * read's own still holds the request, and the handler may end it (an
     * error, or a client that left, which nginx terminates at once).
     */

    r->main->count--;

    t->done(r, t->rc, &t->err);

    ngx_http_run_posted_requests(c);
}


static ngx_int_t
ngx_http_kvgate_prompt_post(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_loc_conf_t *klcf, const kvg_engine_info *info,
    ngx_http_kvgate_prompt_done_pt done, size_t len)
{
    ngx_thread_task_t              *task;
    ngx_http_kvgate_prompt_task_t  *t;

    task = ngx_thread_task_alloc(r->pool,
                                 sizeof(ngx_http_kvgate_prompt_task_t));
    if (task == NULL) {
        return NGX_ERROR;
    }

    t = task->ctx;
    t->request = r;
    t->ctx = ctx;
    t->klcf = klcf;
    t->done = done;
    t->len = len;

    t->body = malloc(len + 1);
    if (t->body == NULL) {
        return NGX_ERROR;
    }

    t->info = *info;
    t->info.tokenizer = kvg_tokenizer_ref(info->tokenizer);
    t->info.chat_template = info->chat_template
                            ? kvg_jinja_ref(info->chat_template) : NULL;

    task->handler = ngx_http_kvgate_prompt_thread;
    task->event.handler = ngx_http_kvgate_prompt_event;
    task->event.data = t;

    if (ngx_thread_task_post(klcf->thread_pool, task) != NGX_OK) {
        kvg_tokenizer_free((kvg_tokenizer *) t->info.tokenizer);
        kvg_jinja_free((kvg_jinja *) t->info.chat_template);
        free(t->body);
        return NGX_ERROR;
    }

    /*
     * Until the task is done, the request must not go away (blocked, as
     * nginx's own thread users do, and a reference of ours), a client that
     * leaves is only noted, and a graceful quit waits: it waits for
     * non-cancelable timers only.
     */

    r->main->blocked++;
    r->main->count++;
    r->aio = 1;
    r->read_event_handler = ngx_http_kvgate_prompt_reading;

    /* a request that was parked (it waited for the handshake) had the
       writer: nothing may finalize the request while the task runs */

    r->write_event_handler = ngx_http_request_empty_handler;

    ctx->deadline.handler = ngx_http_kvgate_prompt_timer;
    ctx->deadline.data = ctx;
    ctx->deadline.log = r->connection->log;
    ngx_add_timer(&ctx->deadline, klcf->timeout);

    return NGX_AGAIN;
}

#endif


ngx_int_t
ngx_http_kvgate_prompt_start(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_loc_conf_t *klcf, const kvg_engine_info *info,
    ngx_http_kvgate_prompt_done_pt done, kvg_api_error *err)
{
#if (NGX_THREADS)
    size_t  len;
#endif

    if (ngx_http_kvgate_prompt_tenant(r, ctx, klcf, err) != NGX_OK) {
        return NGX_ERROR;
    }

#if (NGX_THREADS)
    len = ngx_http_kvgate_body_size(r);

    if (klcf->thread_pool && len >= klcf->thread_min_bytes) {
        if (ngx_http_kvgate_prompt_post(r, ctx, klcf, info, done, len)
            == NGX_AGAIN)
        {
            return NGX_AGAIN;
        }

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "kvgate: cannot post the prompt to thread pool \"%V\", "
                      "tokenizing in the worker", &klcf->thread_pool_name);
    }
#endif

    return ngx_http_kvgate_prompt_loop(r, ctx, klcf, info, err);
}


/* ---- what cannot fit ---- */

/* The engine a request is (being) prepared for: the one it was tokenized
   for or sent to, else the first up of its location's group. */

static ngx_http_kvgate_engine_t *
ngx_http_kvgate_ctx_engine(ngx_http_request_t *r)
{
    ngx_http_kvgate_ctx_t       *ctx;
    ngx_http_kvgate_loc_conf_t  *klcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kvgate_module);

    if (ctx && ctx->ereq.engine) {
        return ctx->ereq.engine;
    }

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);

    return klcf->group ? ngx_http_kvgate_group_up(klcf->group, NULL, 0)
                       : NULL;
}


static ngx_http_kvgate_engine_t *
ngx_http_kvgate_front_engine(ngx_http_request_t *r)
{
    ngx_http_kvgate_loc_conf_t   *klcf;
    ngx_http_kvgate_main_conf_t  *kmcf;

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);

    if (klcf->group) {
        return ngx_http_kvgate_group_up(klcf->group, NULL, 0);
    }

    kmcf = ngx_http_get_module_main_conf(r, ngx_http_kvgate_module);

    if (kmcf->groups.nelts == 0) {
        return NULL;
    }

    return ngx_http_kvgate_group_up(
               ((ngx_http_kvgate_group_t **) kmcf->groups.elts)[0], NULL, 0);
}


/*
 * The largest body a prompt that fits the context can need: the text of
 * context_length tokens, each at most kvg_tokenizer_max_token_bytes() bytes
 * and each byte at most 6 in JSON (\u00XX), or 32 bytes a token (an id in a
 * token array, a chat message's envelope), whichever is more, and 64 KiB for
 * the rest of the request. 0: no such bound (the tokenizer may drop text).
 */

off_t
ngx_http_kvgate_prompt_body_limit(const kvg_engine_info *info)
{
    size_t  piece, per_token;

    if (info == NULL || info->tokenizer == NULL) {
        return 0;
    }

    piece = kvg_tokenizer_max_token_bytes(info->tokenizer);
    if (piece == 0) {
        return 0;
    }

    per_token = ngx_max(6 * piece, 32);

    return (off_t) info->context_length * (off_t) per_token + 65536;
}


/* The 413 for a body over the smaller of client_max_body_size and the
   limit derived from the context (whichever refused it). */

void
ngx_http_kvgate_prompt_too_large(ngx_http_request_t *r, kvg_api_error *err)
{
    off_t                      derived;
    const kvg_engine_info     *info;
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
    info = ngx_http_kvgate_engine_info(ngx_http_kvgate_ctx_engine(r));
    derived = ngx_http_kvgate_prompt_body_limit(info);

    if (derived && (clcf->client_max_body_size == 0
                    || derived < clcf->client_max_body_size))
    {
        kvg_api_error_set(err, 413, "request_too_large", NULL,
                          "The request body is larger than this server "
                          "accepts (%lld bytes: the most a prompt of the "
                          "model's context of %u tokens can take)",
                          (long long) derived, info->context_length);
        return;
    }

    kvg_api_error_set(err, 413, "request_too_large", NULL,
                      "The request body is larger than this server accepts "
                      "(client_max_body_size %lld bytes)",
                      (long long) clcf->client_max_body_size);
}


/* ---- the route key for a front tier ---- */

ngx_int_t
ngx_http_kvgate_route_key_from_body(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx)
{
    kvg_api_error                err;
    ngx_pool_cleanup_t          *cln;
    const kvg_engine_info       *info;
    ngx_http_kvgate_loc_conf_t  *klcf;

    /* a front tier's route key: as the location's group would hash it, or
       the configuration's first group's (its first engine up) */

    ctx->ereq.engine = ngx_http_kvgate_front_engine(r);
    info = ctx->ereq.engine ? ngx_http_kvgate_engine_info(ctx->ereq.engine)
                            : NULL;
    if (info == NULL) {
        return NGX_DECLINED;
    }

    if (ctx->endpoint != NGX_HTTP_KVGATE_EP_CHAT
        && ctx->endpoint != NGX_HTTP_KVGATE_EP_COMPLETIONS
        && ctx->endpoint != NGX_HTTP_KVGATE_EP_MESSAGES)
    {
        return NGX_DECLINED;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_kvgate_prompt_cleanup;
    cln->data = ctx;

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);

    if (ngx_http_kvgate_prompt_parse(r, ctx, klcf, info, &err) != NGX_OK) {
        ctx->route_key_set = 0;
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* ---- self-consistency: the answer of a sample ---- */

/*
 * The answer_pattern is compiled by libkvgate over PCRE2 (answer_re.h), not
 * ngx_regex: every match is counted against a budget of steps, per sample
 * and per request, since the pattern is the client's and runs in the event
 * loop, where a backtracking one would stall every other request of the
 * worker.
 */

ngx_int_t
ngx_http_kvgate_answer_compile(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, kvg_api_error *err)
{
    ngx_http_kvgate_loc_conf_t  *klcf;

    if (ctx->answer_re) {
        /* prepared again (it waited for the handshake): start afresh */
        kvg_answer_re_free(ctx->answer_re);
        ctx->answer_re = NULL;
    }

    if (!ctx->req->has_vote || ctx->req->answer_pattern == NULL) {
        return NGX_OK;
    }

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);

    ctx->answer_re = kvg_answer_re_new(ctx->req->answer_pattern,
                                       ctx->req->answer_pattern_len,
                                       (uint64_t) klcf->answer_sample_steps,
                                       (uint64_t) klcf->answer_request_steps,
                                       err);

    return ctx->answer_re ? NGX_OK : NGX_ERROR;
}


ngx_int_t
ngx_http_kvgate_answer_extract(ngx_http_kvgate_ctx_t *ctx,
    const u_char *text, size_t len, char *out, size_t cap, size_t *out_len,
    kvg_api_error *err)
{
    int          rc;
    size_t       ans_len;
    const char  *ans;

    *out_len = 0;
    ans = NULL;
    ans_len = 0;

    if (ctx->answer_re) {
        rc = kvg_answer_re_last(ctx->answer_re, (const char *) text, len,
                                &ans, &ans_len, err);
        if (rc < 0) {
            return NGX_ERROR;
        }

    } else {
        rc = kvg_vote_default_answer((const char *) text, len, &ans,
                                     &ans_len);
    }

    if (rc == 1) {
        *out_len = kvg_vote_normalize(ans, ans_len, out, cap);
    }

    return NGX_OK;
}
