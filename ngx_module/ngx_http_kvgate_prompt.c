
/*
 * A completion request's body turned into what the engine and a front tier
 * need: the parsed request (libkvgate), the tenant, the prompt's tokens (the
 * engine's chat template and tokenizer, content normalized first), the stop
 * ids and strings, the length bucket, the block hashes salted with the
 * tenant, and the route key. Used by the request lifecycle
 * (ngx_http_kvgate_request.c) before submitting, and by $kvgate_route_key in
 * a front tier that only proxies (ngx_http_kvgate_module.c). Reads the
 * engine's model and tokenizer through the connection, nothing else.
 */


#include "ngx_http_kvgate_module.h"

#include "chat_template.h"
#include "normalize.h"
#include "tokenizer.h"


static void ngx_http_kvgate_prompt_cleanup(void *data);


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
}


static void
ngx_http_kvgate_prompt_cleanup(void *data)
{
    ngx_http_kvgate_prompt_free(data);
}


/* ---- the body ---- */

static ngx_int_t
ngx_http_kvgate_body_bytes(ngx_http_request_t *r, ngx_str_t *out)
{
    off_t         len;
    size_t        n;
    ssize_t       got;
    u_char       *p;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    out->len = 0;
    out->data = (u_char *) "";

    if (r->request_body == NULL || r->request_body->bufs == NULL) {
        return NGX_OK;
    }

    len = 0;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;
        len += b->in_file ? b->file_last - b->file_pos : b->last - b->pos;
    }

    if (len == 0) {
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, (size_t) len + 1);
    if (p == NULL) {
        return NGX_ERROR;
    }

    out->data = p;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if (b->in_file) {
            n = (size_t) (b->file_last - b->file_pos);
            got = ngx_read_file(b->file, p, n, b->file_pos);

            if (got != (ssize_t) n) {
                ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                              "kvgate: cannot read the request body from "
                              "\"%V\"", &b->file->name);
                return NGX_ERROR;
            }

            p += n;

        } else {
            p = ngx_cpymem(p, b->pos, b->last - b->pos);
        }
    }

    *p = '\0';
    out->len = p - out->data;

    return NGX_OK;
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


/* Tokenizes text (normalized first when it is content and steps are on). */

static ngx_int_t
ngx_http_kvgate_encode(ngx_http_kvgate_ctx_t *ctx, size_t *cap,
    const kvg_tokenizer *tok, const char *text, size_t len, unsigned flags,
    ngx_uint_t content, unsigned normalize, kvg_api_error *err,
    const char *param)
{
    int       rc;
    char      msg[256], *norm;
    size_t    n, nlen;
    int32_t  *ids;

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

    rc = kvg_tokenizer_encode(tok, text, len, flags, &ids, &n, msg,
                              sizeof(msg));
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


static ngx_int_t
ngx_http_kvgate_chat_tokens(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    const kvg_engine_info *info, unsigned normalize, kvg_api_error *err)
{
    char                 msg[256];
    size_t               cap, n_segs, i, n, k;
    int32_t              id;
    unsigned             flags;
    kvg_chat_segment    *segs;
    kvg_chat_template    t;
    const char *const   *pieces;
    const kvg_request   *req = ctx->req;

    t = info->chat_template;
    cap = 0;

    segs = ngx_palloc(r->pool, kvg_chat_max_segments(req->n_messages)
                               * sizeof(kvg_chat_segment));
    if (segs == NULL) {
        kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
        return NGX_ERROR;
    }

    if (kvg_chat_render(t, req->messages, req->n_messages, 1, segs,
                        kvg_chat_max_segments(req->n_messages), &n_segs, msg,
                        sizeof(msg))
        != 0)
    {
        kvg_api_error_set(err, 400, "invalid_value", "messages", "%s", msg);
        return NGX_ERROR;
    }

    /* chatml and plain leave BOS to the vocabulary's policy */

    if (!kvg_chat_template_has_bos(t) && info->add_bos && info->bos >= 0) {
        id = info->bos;

        if (ngx_http_kvgate_append_ids(ctx, &cap, &id, 1) != NGX_OK) {
            kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
            return NGX_ERROR;
        }
    }

    for (i = 0; i < n_segs; i++) {

        switch (segs[i].kind) {

        case KVG_SEG_BOS:
        case KVG_SEG_EOS:
            id = segs[i].kind == KVG_SEG_BOS ? info->bos : info->eos;

            if (id >= 0) {
                if (ngx_http_kvgate_append_ids(ctx, &cap, &id, 1) != NGX_OK) {
                    kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
                    return NGX_ERROR;
                }

                break;
            }

            /* no such id in the vocabulary: its text, as special tokens */

            /* fall through */

        case KVG_SEG_TEMPLATE:
            flags = KVG_ENC_PARSE_SPECIAL;

            if (ngx_http_kvgate_encode(ctx, &cap, info->tokenizer,
                                       segs[i].text, segs[i].len, flags, 0, 0,
                                       err, "messages")
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            break;

        default:

            /* message content can never become a special token */

            if (ngx_http_kvgate_encode(ctx, &cap, info->tokenizer,
                                       segs[i].text, segs[i].len, 0, 1,
                                       normalize, err, "messages")
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            break;
        }
    }

    /* the template's end-of-turn tokens end the answer */

    pieces = kvg_chat_template_stop_pieces(t, &n);

    for (k = 0; k < n && ctx->n_stop_ids < KVG_PROTO_MAX_STOP_IDS; k++) {
        id = kvg_tokenizer_find_piece(info->tokenizer, pieces[k],
                                      ngx_strlen(pieces[k]));
        if (id >= 0 && id != info->eos) {
            ctx->stop_ids[ctx->n_stop_ids++] = id;
        }
    }

    pieces = kvg_chat_template_stop_strings(t, &n);

    for (k = 0; k < n && ctx->n_stop < KVG_PROTO_MAX_STOP; k++) {
        ctx->stop[ctx->n_stop] = pieces[k];
        ctx->stop_len[ctx->n_stop++] = ngx_strlen(pieces[k]);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_kvgate_tenant(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_loc_conf_t *klcf, kvg_api_error *err)
{
    u_char     *salt;
    ngx_str_t   t;

    ngx_str_null(&t);

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
         * anonymous tenant's cache (prefix_hash.h). ctx->tenant is the salt;
         * $kvgate_tenant shows the name.
         */

        salt = ngx_pnalloc(r->pool, KVG_PROTO_MAX_SALT);
        if (salt == NULL) {
            kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
            return NGX_ERROR;
        }

        /* kvgate_default_tenant is checked to fit at configuration time */
        ctx->tenant.len = kvg_prefix_default_salt(klcf->default_tenant.data,
                                                  klcf->default_tenant.len,
                                                  salt, KVG_PROTO_MAX_SALT);
        ctx->tenant.data = salt;

        if (ctx->tenant.len == 0) {
            kvg_api_error_set(err, 500, NULL, NULL,
                              "kvgate_default_tenant is too long");
            return NGX_ERROR;
        }

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

    ctx->tenant = t;

    return NGX_OK;
}


/* The prompt's tokens from a parsed request (with the stop ids and strings
   the request and the template imply). */

static ngx_int_t
ngx_http_kvgate_tokens(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
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

    if (req->endpoint == KVG_ENDPOINT_CHAT) {
        return ngx_http_kvgate_chat_tokens(r, ctx, info,
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

    return ngx_http_kvgate_encode(ctx, &cap, info->tokenizer, req->prompt,
                                  req->prompt_len,
                                  info->add_bos ? KVG_ENC_BOS : 0, 1,
                                  (unsigned) klcf->normalize, err, "prompt");
}


/* Bucket, block hashes and the route key. */

static ngx_int_t
ngx_http_kvgate_hash(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_loc_conf_t *klcf, const kvg_engine_info *info,
    kvg_api_error *err)
{
    char         msg[256];
    size_t       nb, depth;
    uint8_t      root[KVG_PREFIX_HASH_LEN];
    char         hex[2 * KVG_PREFIX_HASH_LEN + 1];
    kvg_client  *c;

    c = ngx_http_kvgate_engine_client();

    ctx->bucket = kvg_bucket_index(&klcf->buckets, ctx->n_tokens);
    ctx->bypass = ctx->bucket == 0;

    nb = ctx->n_tokens / info->block_tokens;
    ctx->n_hashes = 0;

    if (nb) {
        ctx->hashes = ngx_palloc(r->pool, nb * KVG_PREFIX_HASH_LEN);
        if (ctx->hashes == NULL) {
            kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
            return NGX_ERROR;
        }

        if (kvg_client_hash_prompt(c, (char *) ctx->tenant.data,
                                   ctx->tenant.len, ctx->tokens,
                                   ctx->n_tokens, ctx->hashes, nb,
                                   &ctx->n_hashes, msg, sizeof(msg))
            != 0)
        {
            kvg_api_error_set(err, 503, "engine_unavailable", NULL, "%s", msg);
            return NGX_ERROR;
        }
    }

    /*
     * The route key: the chain hash after route_blocks blocks (fewer when the
     * prompt is shorter), so prompts sharing their first blocks, under one
     * tenant and model, land on the same node.
     */

    depth = ctx->n_hashes < (size_t) klcf->route_blocks
            ? ctx->n_hashes : (size_t) klcf->route_blocks;

    if (depth) {
        kvg_prefix_hex(ctx->hashes[depth - 1], hex);

    } else {
        if (kvg_client_hash_root(c, (char *) ctx->tenant.data, ctx->tenant.len,
                                 root, msg, sizeof(msg))
            != 0)
        {
            kvg_api_error_set(err, 503, "engine_unavailable", NULL, "%s", msg);
            return NGX_ERROR;
        }

        kvg_prefix_hex(root, hex);
    }

    ngx_memcpy(ctx->route_key, hex, sizeof(ctx->route_key));
    ctx->route_key_set = 1;

    return NGX_OK;
}


/* Parse the body and the tenant, tokenize, hash. */

ngx_int_t
ngx_http_kvgate_prompt_parse(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    ngx_http_kvgate_loc_conf_t *klcf, const kvg_engine_info *info,
    kvg_api_error *err)
{
    ngx_str_t     body;
    kvg_endpoint  ep;

    if (ngx_http_kvgate_body_bytes(r, &body) != NGX_OK) {
        kvg_api_error_set(err, 500, NULL, NULL, "cannot read the request body");
        return NGX_ERROR;
    }

    ep = ctx->endpoint == NGX_HTTP_KVGATE_EP_CHAT ? KVG_ENDPOINT_CHAT
                                                  : KVG_ENDPOINT_COMPLETIONS;

    ctx->req = kvg_request_parse(ep, (char *) body.data, body.len, err);
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

    if (ngx_http_kvgate_tenant(r, ctx, klcf, err) != NGX_OK
        || ngx_http_kvgate_tokens(r, ctx, klcf, info, err) != NGX_OK
        || ngx_http_kvgate_hash(r, ctx, klcf, info, err) != NGX_OK)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
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

    info = ngx_http_kvgate_engine_info();
    if (info == NULL) {
        return NGX_DECLINED;
    }

    if (ctx->endpoint != NGX_HTTP_KVGATE_EP_CHAT
        && ctx->endpoint != NGX_HTTP_KVGATE_EP_COMPLETIONS)
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
