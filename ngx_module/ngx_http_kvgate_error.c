
/*
 * Sending: every response of the module goes out through
 * ngx_http_kvgate_send_response (its status, type and length, the header,
 * then the body), and every failure the gateway itself produces is an
 * OpenAI-style error. Clients of the OpenAI API parse the error object (the
 * official SDKs pick their exception class from the status), so errors use
 * this shape rather than nginx's HTML error pages. The body is rendered by
 * libkvgate (kvg_api_error_render), which is the one definition of the
 * format; Anthropic's /v1/messages gets that API's error object instead
 * (kvg_api_error_render_anthropic).
 */


#include "ngx_http_kvgate_module.h"


ngx_int_t
ngx_http_kvgate_add_header(ngx_http_request_t *r, const char *key,
    const char *value)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key.data = (u_char *) key;
    h->key.len = ngx_strlen(key);
    h->value.data = (u_char *) value;
    h->value.len = ngx_strlen(value);

    return NGX_OK;
}


ngx_int_t
ngx_http_kvgate_send_response(ngx_http_request_t *r, ngx_uint_t status,
    const char *type, off_t length, ngx_chain_t *out)
{
    ngx_int_t     rc;
    ngx_chain_t  *cl;

    r->headers_out.status = status;
    r->headers_out.content_length_n = length;
    r->headers_out.content_type.data = (u_char *) type;
    r->headers_out.content_type.len = ngx_strlen(type);
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only || out == NULL) {
        return rc;
    }

    /* the whole body: its last buffer ends the request's output */

    for (cl = out; cl->next; cl = cl->next) { /* void */ }

    cl->buf->last_buf = (r == r->main) ? 1 : 0;
    cl->buf->last_in_chain = 1;

    return ngx_http_output_filter(r, out);
}


ngx_uint_t
ngx_http_kvgate_retry_after(ngx_uint_t status)
{
    return (status == NGX_HTTP_TOO_MANY_REQUESTS
            || status == NGX_HTTP_SERVICE_UNAVAILABLE) ? 1 : 0;
}


ngx_int_t
ngx_http_kvgate_send_api_error(ngx_http_request_t *r, const kvg_api_error *e,
    ngx_uint_t retry_after)
{
    size_t                  len;
    u_char                 *p;
    ngx_buf_t              *b;
    ngx_chain_t             out;
    ngx_http_kvgate_ctx_t  *ctx;

    b = ngx_create_temp_buf(r->pool, KVG_API_ERROR_JSON_MAX + 1);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_kvgate_module);

    if (ctx && ctx->endpoint == NGX_HTTP_KVGATE_EP_MESSAGES) {
        len = kvg_api_error_render_anthropic(e, (char *) b->pos,
                                             KVG_API_ERROR_JSON_MAX);

    } else {
        len = kvg_api_error_render(e, (char *) b->pos,
                                   KVG_API_ERROR_JSON_MAX);
    }

    if (len >= KVG_API_ERROR_JSON_MAX) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = b->pos + len;
    *b->last++ = '\n';

    if (retry_after) {
        p = ngx_pnalloc(r->pool, NGX_INT_T_LEN + 1);
        if (p == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        *ngx_sprintf(p, "%ui", retry_after) = '\0';

        if (ngx_http_kvgate_add_header(r, "Retry-After", (char *) p)
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_kvgate_send_response(r, e->status, "application/json",
                                         b->last - b->pos, &out);
}


ngx_int_t
ngx_http_kvgate_send_error(ngx_http_request_t *r, ngx_uint_t status,
    const char *type, const char *code, const char *message,
    ngx_uint_t retry_after)
{
    kvg_api_error  e;

    kvg_api_error_set(&e, (int) status, code, NULL, "%s", message);

    if (type) {
        e.type = type;
    }

    return ngx_http_kvgate_send_api_error(r, &e, retry_after);
}
