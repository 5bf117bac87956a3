#include "api_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "utf8.h"

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
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    char esc[8];

    put(o, "\"", 1);
    while (i < n) {
        unsigned char c = p[i];
        uint32_t cp;
        int l;

        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(o, esc, 2);
            i++;
        } else if (c < 0x20 || c == 0x7F) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            put(o, esc, 6);
            i++;
        } else if (c < 0x80) {
            put(o, (const char *)p + i, 1);
            i++;
        } else if ((l = kvg_utf8_decode(p + i, n - i, &cp)) > 0) {
            put(o, (const char *)p + i, (size_t)l);
            i += (size_t)l;
        } else {
            /* a message truncated mid-character, or bytes from a caller */
            put(o, "\\ufffd", 6);
            i++;
        }
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
