/* JSON string escaping; see json_out.h. */
#include "json_out.h"

#include <stdint.h>
#include <string.h>

#include "utf8.h"

static const char hexd[] = "0123456789abcdef";

/* Length of the run at s that is copied unchanged (ASCII without '"', '\', controls). */
static size_t plain_run(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n && p[i] >= 0x20 && p[i] < 0x7F && p[i] != '"' && p[i] != '\\')
        i++;
    return i;
}

static size_t one(const unsigned char *p, size_t n, char *out, size_t *used)
{
    unsigned char c = p[0];
    uint32_t cp;
    int l;
    if (c == '"' || c == '\\') {
        if (out) {
            out[0] = '\\';
            out[1] = (char)c;
        }
        *used = 1;
        return 2;
    }
    if (c < 0x20 || c == 0x7F) {
        char e = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : 0;
        *used = 1;
        if (e) {
            if (out) {
                out[0] = '\\';
                out[1] = e;
            }
            return 2;
        }
        if (out) {
            memcpy(out, "\\u00", 4);
            out[4] = hexd[c >> 4];
            out[5] = hexd[c & 15];
        }
        return 6;
    }
    if ((l = kvg_utf8_decode(p, n, &cp)) > 0) {
        if (out)
            memcpy(out, p, (size_t)l);
        *used = (size_t)l;
        return (size_t)l;
    }
    if (out)
        memcpy(out, "\\ufffd", 6);
    *used = 1;
    return 6;
}

size_t kvg_json_escape_len(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, total = 0;
    while (i < len) {
        size_t r = plain_run(p + i, len - i), used;
        total += r;
        i += r;
        if (i < len) {
            total += one(p + i, len - i, NULL, &used);
            i += used;
        }
    }
    return total;
}

size_t kvg_json_escape(char *out, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, w = 0;
    while (i < len) {
        size_t r = plain_run(p + i, len - i), used;
        memcpy(out + w, p + i, r);
        w += r;
        i += r;
        if (i < len) {
            w += one(p + i, len - i, out + w, &used);
            i += used;
        }
    }
    return w;
}
