
/*
 * OpenAI-style error responses. Clients of the OpenAI API parse the error
 * object, so every failure the gateway itself produces uses this shape
 * rather than nginx's HTML error pages.
 */


#include "ngx_http_kvgate_module.h"


static ngx_int_t ngx_http_kvgate_json_string(ngx_pool_t *pool, ngx_str_t *out,
    const char *s);


ngx_int_t
ngx_http_kvgate_send_error(ngx_http_request_t *r, ngx_uint_t status,
    const char *type, const char *code, const char *message,
    ngx_uint_t retry_after)
{
    size_t            len;
    u_char           *p;
    ngx_int_t         rc;
    ngx_str_t         jmessage, jtype, jcode;
    ngx_buf_t        *b;
    ngx_chain_t       out;
    ngx_table_elt_t  *h;

    static u_char     null[] = "null";

    if (ngx_http_kvgate_json_string(r->pool, &jmessage, message) != NGX_OK
        || ngx_http_kvgate_json_string(r->pool, &jtype, type) != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (code == NULL) {
        jcode.data = null;
        jcode.len = sizeof(null) - 1;

    } else if (ngx_http_kvgate_json_string(r->pool, &jcode, code) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    len = sizeof("{\"error\":{\"message\":,\"type\":,\"param\":null,\"code\":}}\n")
          - 1 + jmessage.len + jtype.len + jcode.len;

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = ngx_cpymem(b->last, "{\"error\":{\"message\":",
                   sizeof("{\"error\":{\"message\":") - 1);
    p = ngx_cpymem(p, jmessage.data, jmessage.len);
    p = ngx_cpymem(p, ",\"type\":", sizeof(",\"type\":") - 1);
    p = ngx_cpymem(p, jtype.data, jtype.len);
    p = ngx_cpymem(p, ",\"param\":null,\"code\":",
                   sizeof(",\"param\":null,\"code\":") - 1);
    p = ngx_cpymem(p, jcode.data, jcode.len);
    p = ngx_cpymem(p, "}}\n", sizeof("}}\n") - 1);
    b->last = p;

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

    r->headers_out.status = status;
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


/* Quotes and escapes s as a JSON string into memory from pool. */

static ngx_int_t
ngx_http_kvgate_json_string(ngx_pool_t *pool, ngx_str_t *out, const char *s)
{
    size_t   len;
    u_char  *p;

    len = ngx_strlen(s);

    out->len = len + ngx_escape_json(NULL, (u_char *) s, len) + 2;
    out->data = ngx_pnalloc(pool, out->len);
    if (out->data == NULL) {
        return NGX_ERROR;
    }

    p = out->data;
    *p++ = '"';
    p = (u_char *) ngx_escape_json(p, (u_char *) s, len);
    *p = '"';

    return NGX_OK;
}
