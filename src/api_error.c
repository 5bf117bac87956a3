#include "api_error.h"
#include "api_error_testing.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "json_out.h"

const char *kvg_api_error_type(int status)
{
    if (status == 403)
        return "permission_error";
    if (status == 429)
        return "rate_limit_error";
    if (status >= 500)
        return "server_error";
    return "invalid_request_error";
}

int kvg_api_error_set(kvg_api_error *e, int status, const char *code, const char *param,
                      const char *fmt, ...)
{
    va_list ap;

    e->status = status;
    e->type = kvg_api_error_type(status);
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* Appends to a bounded buffer while counting the full length, snprintf-style. */
typedef struct {
    char *buf;
    size_t cap, len;
} outbuf;

static void put(outbuf *o, const char *s, size_t n)
{
    if (o->len < o->cap) {
        size_t room = o->cap - o->len;
        memcpy(o->buf + o->len, s, n < room ? n : room);
    }
    o->len += n;
}

static void put_json_string(outbuf *o, const char *s, size_t n)
{
    put(o, "\"", 1);
    if (o->len < o->cap && o->cap - o->len >= 6 * n) {
        o->len += kvg_json_escape(o->buf + o->len, s, n);
    } else {
        /* Near the end of the caller's buffer: count exactly, write what fits. */
        size_t need = kvg_json_escape_len(s, n);
        if (o->len < o->cap && o->cap - o->len >= need)
            kvg_json_escape(o->buf + o->len, s, n);
        o->len += need;
    }
    put(o, "\"", 1);
}

size_t kvg_api_error_render(const kvg_api_error *e, char *buf, size_t cap)
{
    outbuf o = { buf, cap, 0 };
    const char *type;

    put(&o, "{\"error\":{\"message\":", 20);
    put_json_string(&o, e->message, strnlen(e->message, sizeof e->message));
    put(&o, ",\"type\":", 8);
    type = e->type ? e->type : kvg_api_error_type(e->status);
    put_json_string(&o, type, strlen(type));
    put(&o, ",\"param\":", 9);
    if (e->param[0])
        put_json_string(&o, e->param, strnlen(e->param, sizeof e->param));
    else
        put(&o, "null", 4);
    put(&o, ",\"code\":", 8);
    if (e->code)
        put_json_string(&o, e->code, strlen(e->code));
    else
        put(&o, "null", 4);
    put(&o, "}}", 2);
    if (cap > 0)
        buf[o.len < cap ? o.len : cap - 1] = '\0';
    return o.len;
}

const char *kvg_api_error_anthropic_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default:  return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

size_t kvg_api_error_render_anthropic(const kvg_api_error *e, char *buf, size_t cap)
{
    outbuf o = { buf, cap, 0 };
    const char *type = kvg_api_error_anthropic_type(e->status);

    put(&o, "{\"type\":\"error\",\"error\":{\"type\":", 32);
    put_json_string(&o, type, strlen(type));
    put(&o, ",\"message\":", 11);
    put_json_string(&o, e->message, strnlen(e->message, sizeof e->message));
    put(&o, "}}", 2);
    if (cap > 0)
        buf[o.len < cap ? o.len : cap - 1] = '\0';
    return o.len;
}
