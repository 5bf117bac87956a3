/* Python's str operations on strings that carry taint: strip, case mapping,
 * split, splitlines, replace, find, count, the isX() predicates, HTML escaping.
 * Every output byte keeps the taint of the byte it was copied or mapped from;
 * text a template inserts (a replacement, an escape) carries the inserting
 * string's taint, so a data character stays data however it is rewritten. */
#include "jinja_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "utf8.h"

/* one code point at s[i]: its length */
size_t jstr_cp_at(const jv *s, size_t i, uint32_t *cp)
{
    int n = kvg_utf8_decode((const unsigned char *)s->u.s.p + i, s->u.s.n - i, cp);
    if (n <= 0) {
        *cp = (unsigned char)s->u.s.p[i];
        return 1;
    }
    return (size_t)n;
}

int jstr_isspace(uint32_t cp)
{
    return (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

static int in_chars(const jv *chars, uint32_t cp)
{
    for (size_t i = 0; i < chars->u.s.n;) {
        uint32_t x;
        i += jstr_cp_at(chars, i, &x);
        if (x == cp)
            return 1;
    }
    return 0;
}

/* str.strip/lstrip/rstrip: which: 1 left, 2 right, 3 both */
jv jstr_strip(jctx *c, const jnode *at, const jv *s, const jv *chars, int which)
{
    size_t b = 0, e = s->u.s.n;

    if (chars && chars->t == JT_NONE)
        chars = NULL;
    if (chars && chars->t != JT_STR)
        jerr(c, KVG_JINJA_ERROR, at, "strip arg must be None or str");
    if (which & 1) {
        while (b < e) {
            uint32_t cp;
            size_t k = jstr_cp_at(s, b, &cp);
            if (chars ? !in_chars(chars, cp) : !jstr_isspace(cp))
                break;
            b += k;
        }
    }
    if (which & 2) {
        while (e > b) {
            size_t k = e - 1;
            uint32_t cp;
            while (k > b && ((unsigned char)s->u.s.p[k] & 0xC0) == 0x80)
                k--;
            jstr_cp_at(s, k, &cp);
            if (chars ? !in_chars(chars, cp) : !jstr_isspace(cp))
                break;
            e = k;
        }
    }
    return jv_substr(s, b, e - b);
}

static int is_cased_letter(uint32_t cp)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static void put_cp(jctx *c, jsb *b, uint32_t cp, int data)
{
    unsigned char buf[4];
    int n = kvg_utf8_encode(cp, buf);
    jsb_put(c, b, (const char *)buf, (size_t)n, data);
}

static void put_upper(jctx *c, jsb *b, uint32_t cp, int data)
{
    if (cp == 0xDF) {           /* Python: 'ß'.upper() == 'SS' */
        jsb_put(c, b, "SS", 2, data);
        return;
    }
    put_cp(c, b, (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp), data);
}

/* Case mappings; each output character keeps its source character's taint. */
jv jstr_case(jctx *c, const jv *s, int mode)
{
    jsb b;
    int prev_cased = 0, first = 1, word_start = 1;

    jsb_init(c, &b, s->u.s.n + 8);
    for (size_t i = 0; i < s->u.s.n;) {
        uint32_t cp;
        size_t k = jstr_cp_at(s, i, &cp);
        int data = s->taint == JS_DATA || (s->taint == JS_MASK && s->u.s.mask[i]);
        uint32_t lo = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);

        switch (mode) {
        case CASE_UPPER:
            put_upper(c, &b, cp, data);
            break;
        case CASE_LOWER:
            put_cp(c, &b, lo, data);
            break;
        case CASE_SWAP:
            if (lo != cp)
                put_cp(c, &b, lo, data);
            else
                put_upper(c, &b, cp, data);
            break;
        case CASE_CAPITALIZE:
            if (first)
                put_cp(c, &b, (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp), data);
            else
                put_cp(c, &b, lo, data);
            break;
        case CASE_TITLE:        /* str.title: words are runs of cased letters */
            if (is_cased_letter(cp)) {
                if (prev_cased)
                    put_cp(c, &b, lo, data);
                else
                    put_cp(c, &b, (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp), data);
                prev_cased = 1;
            } else {
                put_cp(c, &b, cp, data);
                prev_cased = 0;
            }
            break;
        case CASE_JTITLE:       /* Jinja's |title: words start after [-\s({\[<] */
            if (jstr_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<') {
                put_cp(c, &b, cp, data);
                word_start = 1;
            } else if (word_start) {
                put_upper(c, &b, cp, data);
                word_start = 0;
            } else {
                put_cp(c, &b, lo, data);
            }
            break;
        }
        first = 0;
        i += k;
    }
    return jsb_str(&b);
}

/* str.split / rsplit (sep NULL: runs of whitespace) */
jv jstr_split(jctx *c, const jnode *at, const jv *s, const jv *sep, int64_t maxsplit, int right)
{
    jv parts[64], *all = parts;
    size_t n = 0, cap = 64;

#define PUSH(x) do {                                                          \
        if (n == cap) {                                                       \
            jv *nv = jalloc(c, cap * 2 * sizeof(jv));                         \
            memcpy(nv, all, n * sizeof(jv));                                  \
            all = nv;                                                         \
            cap *= 2;                                                         \
        }                                                                     \
        all[n++] = (x);                                                       \
    } while (0)

    if (sep && sep->t == JT_NONE)
        sep = NULL;
    if (sep && sep->t != JT_STR)
        jerr(c, KVG_JINJA_ERROR, at, "must be str or None, not %s", jv_type_name(sep));
    if (sep && !sep->u.s.n)
        jerr(c, KVG_JINJA_ERROR, at, "empty separator");
    if (maxsplit < 0)
        maxsplit = INT64_MAX;
    if (!right) {
        size_t i = 0, len = s->u.s.n;
        if (sep) {
            while (maxsplit-- > 0) {
                const char *f = memmem(s->u.s.p + i, len - i, sep->u.s.p, sep->u.s.n);
                if (!f)
                    break;
                size_t pos = (size_t)(f - s->u.s.p);
                PUSH(jv_substr(s, i, pos - i));
                i = pos + sep->u.s.n;
            }
            PUSH(jv_substr(s, i, len - i));
        } else {
            for (;;) {
                uint32_t cp;
                while (i < len && jstr_isspace((jstr_cp_at(s, i, &cp), cp)))
                    i += jstr_cp_at(s, i, &cp);
                if (i >= len)
                    break;
                if (maxsplit-- <= 0) {
                    /* the rest, trailing whitespace included (as Python) */
                    PUSH(jv_substr(s, i, len - i));
                    break;
                }
                size_t b = i;
                while (i < len && !jstr_isspace((jstr_cp_at(s, i, &cp), cp)))
                    i += jstr_cp_at(s, i, &cp);
                PUSH(jv_substr(s, b, i - b));
            }
        }
    } else {
        /* from the right, collected reversed */
        size_t e = s->u.s.n;
        if (sep) {
            while (maxsplit-- > 0) {
                const char *f = NULL;
                for (size_t k = e; k >= sep->u.s.n; k--) {
                    if (!memcmp(s->u.s.p + k - sep->u.s.n, sep->u.s.p, sep->u.s.n)) {
                        f = s->u.s.p + k - sep->u.s.n;
                        break;
                    }
                }
                if (!f)
                    break;
                size_t pos = (size_t)(f - s->u.s.p);
                PUSH(jv_substr(s, pos + sep->u.s.n, e - pos - sep->u.s.n));
                e = pos;
            }
            PUSH(jv_substr(s, 0, e));
        } else {
            for (;;) {
                uint32_t cp;
                size_t k;
                while (e > 0) {
                    k = e - 1;
                    while (k > 0 && ((unsigned char)s->u.s.p[k] & 0xC0) == 0x80)
                        k--;
                    jstr_cp_at(s, k, &cp);
                    if (!jstr_isspace(cp))
                        break;
                    e = k;
                }
                if (!e)
                    break;
                if (maxsplit-- <= 0) {
                    PUSH(jv_substr(s, 0, e));
                    break;
                }
                size_t end = e;
                while (e > 0) {
                    k = e - 1;
                    while (k > 0 && ((unsigned char)s->u.s.p[k] & 0xC0) == 0x80)
                        k--;
                    jstr_cp_at(s, k, &cp);
                    if (jstr_isspace(cp))
                        break;
                    e = k;
                }
                PUSH(jv_substr(s, e, end - e));
            }
        }
        for (size_t i = 0; i < n / 2; i++) {
            jv t = all[i];
            all[i] = all[n - 1 - i];
            all[n - 1 - i] = t;
        }
    }
#undef PUSH
    jv r = jv_list_new(c, n);
    memcpy(r.u.l->v, all, n * sizeof(jv));
    return r;
}

/* str.splitlines: \n \r \r\n \v \f \x1c-\x1e \x85 \u2028 \u2029 */
jv jstr_splitlines(jctx *c, const jv *s, int keepends)
{
    size_t n = 0, i = 0, b = 0;
    jv *v = jalloc(c, (s->u.s.n + 1) * sizeof(jv));

    while (i < s->u.s.n) {
        uint32_t cp;
        size_t k = jstr_cp_at(s, i, &cp);
        if (cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) ||
            cp == 0x85 || cp == 0x2028 || cp == 0x2029) {
            size_t e = i + k;
            if (cp == '\r' && e < s->u.s.n && s->u.s.p[e] == '\n')
                e++;
            v[n++] = jv_substr(s, b, (keepends ? e : i) - b);
            b = i = e;
        } else {
            i += k;
        }
    }
    if (b < s->u.s.n)
        v[n++] = jv_substr(s, b, s->u.s.n - b);
    jv r = jv_list_new(c, n);
    memcpy(r.u.l->v, v, n * sizeof(jv));
    return r;
}

jv jstr_replace(jctx *c, const jv *s, const jv *old, const jv *nw, int64_t count)
{
    jsb b;
    size_t i = 0;

    if (count < 0)
        count = INT64_MAX;
    jsb_init(c, &b, s->u.s.n + 16);
    if (!old->u.s.n) {
        /* Python inserts new between every character (and at both ends) */
        for (;;) {
            if (count-- > 0)
                jsb_put_str(c, &b, nw);
            if (i >= s->u.s.n)
                break;
            uint32_t cp;
            size_t k = jstr_cp_at(s, i, &cp);
            jsb_put_sub(c, &b, s, i, k);
            i += k;
        }
        return jsb_str(&b);
    }
    while (count-- > 0) {
        const char *f = memmem(s->u.s.p + i, s->u.s.n - i, old->u.s.p, old->u.s.n);
        if (!f)
            break;
        size_t pos = (size_t)(f - s->u.s.p);
        jsb_put_sub(c, &b, s, i, pos - i);
        jsb_put_str(c, &b, nw);
        i = pos + old->u.s.n;
    }
    jsb_put_sub(c, &b, s, i, s->u.s.n - i);
    return jsb_str(&b);
}

/* code point index of byte offset */
static int64_t cp_index(const jv *s, size_t off)
{
    int64_t n = 0;
    for (size_t i = 0; i < off; i++)
        n += ((unsigned char)s->u.s.p[i] & 0xC0) != 0x80;
    return n;
}

int64_t jstr_find(const jv *s, const jv *sub, int right)
{
    if (sub->u.s.n > s->u.s.n)
        return -1;
    if (!right) {
        const char *f = memmem(s->u.s.p, s->u.s.n, sub->u.s.p, sub->u.s.n);
        return f ? cp_index(s, (size_t)(f - s->u.s.p)) : -1;
    }
    for (size_t k = s->u.s.n - sub->u.s.n + 1; k-- > 0;)
        if (!memcmp(s->u.s.p + k, sub->u.s.p, sub->u.s.n))
            return cp_index(s, k);
    return -1;
}

int64_t jstr_count(const jv *s, const jv *sub)
{
    int64_t n = 0;
    size_t i = 0;

    if (!sub->u.s.n)
        return (int64_t)jv_ncp(s) + 1;
    for (;;) {
        const char *f = memmem(s->u.s.p + i, s->u.s.n - i, sub->u.s.p, sub->u.s.n);
        if (!f)
            return n;
        n++;
        i = (size_t)(f - s->u.s.p) + sub->u.s.n;
    }
}

/* str.isX(): all characters (at least one) pass */
int jstr_all(const jv *s, int kind)
{
    int cased = 0;

    if (!s->u.s.n)
        return 0;
    for (size_t i = 0; i < s->u.s.n;) {
        uint32_t cp;
        i += jstr_cp_at(s, i, &cp);
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
        int letter = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        int digit = k == UTF8PROC_CATEGORY_ND;
        int num = digit || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
        switch (kind) {
        case 'd': if (!digit) return 0; break;
        case 'n': if (!num) return 0; break;
        case 'a': if (!letter) return 0; break;
        case 'A': if (!letter && !num) return 0; break;
        case 's': if (!jstr_isspace(cp)) return 0; break;
        case 'u':
            if (k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT) return 0;
            cased |= k == UTF8PROC_CATEGORY_LU;
            break;
        case 'l':
            if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) return 0;
            cased |= k == UTF8PROC_CATEGORY_LL;
            break;
        }
    }
    return kind == 'u' || kind == 'l' ? cased : 1;
}

jv jinja_html_escape(jctx *c, const jv *s)
{
    jsb b;

    jsb_init(c, &b, s->u.s.n + 16);
    for (size_t i = 0; i < s->u.s.n; i++) {
        int data = s->taint == JS_DATA || (s->taint == JS_MASK && s->u.s.mask[i]);
        switch (s->u.s.p[i]) {
        case '&': jsb_put(c, &b, "&amp;", 5, data); break;
        case '<': jsb_put(c, &b, "&lt;", 4, data); break;
        case '>': jsb_put(c, &b, "&gt;", 4, data); break;
        case '"': jsb_put(c, &b, "&#34;", 5, data); break;
        case '\'': jsb_put(c, &b, "&#39;", 5, data); break;
        default: jsb_put_sub(c, &b, s, i, 1);
        }
    }
    jv r = jsb_str(&b);
    r.flags |= JF_SAFE;
    return r;
}
