
/*
 * OpenAI-style error responses. Clients of the OpenAI API parse the error
 * object (the official SDKs pick their exception class from the status), so
 * every failure the gateway itself produces uses this shape rather than
 * nginx's HTML error pages. The body is rendered by libkvgate
 * (kvg_api_error_render), which is the one definition of the format.
 */


#include "ngx_http_kvgate_module.h"


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
    size_t            len;
    ngx_int_t         rc;
    ngx_buf_t        *b;
    ngx_chain_t       out;
    ngx_table_elt_t  *h;

    b = ngx_create_temp_buf(r->pool, KVG_API_ERROR_JSON_MAX + 1);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    len = kvg_api_error_render(e, (char *) b->pos, KVG_API_ERROR_JSON_MAX);
    if (len >= KVG_API_ERROR_JSON_MAX) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = b->pos + len;
    *b->last++ = '\n';

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    if (retry_after) {
        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->value.data = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
        if (h->value.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->hash = 1;
        ngx_str_set(&h->key, "Retry-After");
        h->value.len = ngx_sprintf(h->value.data, "%ui", retry_after)
                       - h->value.data;
    }

    r->headers_out.status = e->status;
    r->headers_out.content_length_n = b->last - b->pos;
    ngx_str_set(&r->headers_out.content_type, "application/json");
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
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
