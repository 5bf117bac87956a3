/* Jinja filters, tests and the methods of str, dict and list, as Jinja2 3.1 and
 * Python define them. A filter's result keeps the taint of the bytes it copies:
 * a byte of output that came from a data byte stays data (upper/lower map each
 * character with its taint; replace marks the inserted text with the taint of
 * the replacement string, which a template literal has none of). */
#include "jinja_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "utf8.h"

/* ---- argument helpers ---- */

const jv *jarg(const jcall *a, int i, const char *name)
{
    if (i >= 0 && i < a->npos)
        return &a->pos[i];
    for (int k = 0; name && k < a->nkw; k++)
        if (!strcmp(a->kwname[k], name))
            return &a->kwval[k];
    return NULL;
}

static const char *str_z(jctx *c, const jv *s)
{
    char *z = jalloc(c, s->u.s.n + 1);
    memcpy(z, s->u.s.p, s->u.s.n);
    z[s->u.s.n] = 0;
    return z;
}

static jv need_str(jctx *c, const jnode *at, const jv *v, const char *what)
{
    if (!v || v->t != JT_STR)
        jerr(c, KVG_JINJA_ERROR, at, "%s must be a string, not %s", what,
             v ? jv_type_name(v) : "nothing");
    return *v;
}

static int64_t need_int(jctx *c, const jnode *at, const jv *v, int64_t dflt, const char *what)
{
    if (!v || v->t == JT_NONE)
        return dflt;
    if (v->t != JT_INT && v->t != JT_BOOL)
        jerr(c, KVG_JINJA_ERROR, at, "%s must be an integer, not %s", what, jv_type_name(v));
    return v->u.i;
}

static int opt_bool(const jv *v, int dflt)
{
    return v ? jv_truthy(v) : dflt;
}

/* soft_str: what Jinja2's string filters work on (undefined -> "") */
static jv sstr(jctx *c, const jnode *at, const jv *v)
{
    return jv_to_str(c, at, v);
}

/* one code point at s[i]: its length */
static size_t cp_at(const jv *s, size_t i, uint32_t *cp)
{
    int n = kvg_utf8_decode((const unsigned char *)s->u.s.p + i, s->u.s.n - i, cp);
    if (n <= 0) {
        *cp = (unsigned char)s->u.s.p[i];
        return 1;
    }
    return (size_t)n;
}

static int py_isspace(uint32_t cp)
{
    return (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

static int in_chars(const jv *chars, uint32_t cp)
{
    for (size_t i = 0; i < chars->u.s.n;) {
        uint32_t x;
        i += cp_at(chars, i, &x);
        if (x == cp)
            return 1;
    }
    return 0;
}

/* str.strip/lstrip/rstrip: which: 1 left, 2 right, 3 both */
static jv do_strip(jctx *c, const jnode *at, const jv *s, const jv *chars, int which)
{
    size_t b = 0, e = s->u.s.n;

    if (chars && chars->t == JT_NONE)
        chars = NULL;
    if (chars && chars->t != JT_STR)
        jerr(c, KVG_JINJA_ERROR, at, "strip arg must be None or str");
    if (which & 1) {
        while (b < e) {
            uint32_t cp;
            size_t k = cp_at(s, b, &cp);
            if (chars ? !in_chars(chars, cp) : !py_isspace(cp))
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
            cp_at(s, k, &cp);
            if (chars ? !in_chars(chars, cp) : !py_isspace(cp))
                break;
            e = k;
        }
    }
    return jv_substr(s, b, e - b);
}

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE, CASE_JTITLE, CASE_SWAP };

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
static jv map_case(jctx *c, const jv *s, int mode)
{
    jsb b;
    int prev_cased = 0, first = 1, word_start = 1;

    jsb_init(c, &b, s->u.s.n + 8);
    for (size_t i = 0; i < s->u.s.n;) {
        uint32_t cp;
        size_t k = cp_at(s, i, &cp);
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
            if (py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<') {
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
static jv do_split(jctx *c, const jnode *at, const jv *s, const jv *sep, int64_t maxsplit, int right)
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
                while (i < len && py_isspace((cp_at(s, i, &cp), cp)))
                    i += cp_at(s, i, &cp);
                if (i >= len)
                    break;
                if (maxsplit-- <= 0) {
                    /* the rest, trailing whitespace included (as Python) */
                    PUSH(jv_substr(s, i, len - i));
                    break;
                }
                size_t b = i;
                while (i < len && !py_isspace((cp_at(s, i, &cp), cp)))
                    i += cp_at(s, i, &cp);
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
                    cp_at(s, k, &cp);
                    if (!py_isspace(cp))
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
                    cp_at(s, k, &cp);
                    if (py_isspace(cp))
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
static jv do_splitlines(jctx *c, const jv *s, int keepends)
{
    size_t n = 0, i = 0, b = 0;
    jv *v = jalloc(c, (s->u.s.n + 1) * sizeof(jv));

    while (i < s->u.s.n) {
        uint32_t cp;
        size_t k = cp_at(s, i, &cp);
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

static jv do_replace(jctx *c, const jv *s, const jv *old, const jv *nw, int64_t count)
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
            size_t k = cp_at(s, i, &cp);
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

static int64_t do_find(const jv *s, const jv *sub, int right)
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

static int64_t do_count_sub(const jv *s, const jv *sub)
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

static int affix(jctx *c, const jnode *at, const jv *s, const jv *arg, int end)
{
    if (arg && (arg->t == JT_LIST || arg->t == JT_JLIST) && (arg->flags & JF_TUPLE || arg->t == JT_LIST)) {
        size_t n = jv_len(c, at, arg);
        for (size_t i = 0; i < n; i++) {
            jv x = jv_list_at(c, arg, i);
            if (affix(c, at, s, &x, end))
                return 1;
        }
        return 0;
    }
    jv p = need_str(c, at, arg, end ? "endswith's argument" : "startswith's argument");
    if (p.u.s.n > s->u.s.n)
        return 0;
    return !memcmp(s->u.s.p + (end ? s->u.s.n - p.u.s.n : 0), p.u.s.p, p.u.s.n);
}

static jv join_items(jctx *c, const jnode *at, const jv *sep, const jv *seq, const char *attr);

/* str.isX(): all characters (at least one) pass */
static int str_all(const jv *s, int kind)
{
    int cased = 0;

    if (!s->u.s.n)
        return 0;
    for (size_t i = 0; i < s->u.s.n;) {
        uint32_t cp;
        i += cp_at(s, i, &cp);
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
        int letter = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        int digit = k == UTF8PROC_CATEGORY_ND;
        int num = digit || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
        switch (kind) {
        case 'd': if (!digit) return 0; break;
        case 'n': if (!num) return 0; break;
        case 'a': if (!letter) return 0; break;
        case 'A': if (!letter && !num) return 0; break;
        case 's': if (!py_isspace(cp)) return 0; break;
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

/* "{} {0} {name}".format(...) without format specs */
static jv str_format(jctx *c, const jnode *at, const jv *s, const jcall *a)
{
    jsb b;
    int auto_i = 0;

    jsb_init(c, &b, s->u.s.n + 32);
    for (size_t i = 0; i < s->u.s.n; i++) {
        char ch = s->u.s.p[i];
        if ((ch == '{' || ch == '}') && i + 1 < s->u.s.n && s->u.s.p[i + 1] == ch) {
            jsb_put_sub(c, &b, s, i, 1);
            i++;
            continue;
        }
        if (ch == '}')
            jerr(c, KVG_JINJA_ERROR, at, "Single '}' encountered in format string");
        if (ch != '{') {
            jsb_put_sub(c, &b, s, i, 1);
            continue;
        }
        const char *close = memchr(s->u.s.p + i, '}', s->u.s.n - i);
        if (!close)
            jerr(c, KVG_JINJA_ERROR, at, "Single '{' encountered in format string");
        size_t fb = i + 1, fe = (size_t)(close - s->u.s.p);
        const jv *v = NULL;
        if (fb == fe) {
            v = jarg(a, auto_i++, NULL);
        } else if (s->u.s.p[fb] >= '0' && s->u.s.p[fb] <= '9') {
            v = jarg(a, atoi(s->u.s.p + fb), NULL);
        } else {
            for (int k = 0; k < a->nkw; k++)
                if (strlen(a->kwname[k]) == fe - fb && !memcmp(a->kwname[k], s->u.s.p + fb, fe - fb))
                    v = &a->kwval[k];
        }
        if (!v)
            jerr(c, KVG_JINJA_ERROR, at, "format: replacement field {%.*s} has no argument",
                 (int)(fe - fb > 40 ? 40 : fe - fb), s->u.s.p + fb);
        jv_str_into(c, at, &b, v);
        i = fe;
    }
    return jsb_str(&b);
}

static const char *const STR_METHODS[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower",
    "title", "capitalize", "swapcase", "replace", "find", "rfind", "index", "rindex", "count",
    "join", "format", "isdigit", "isnumeric", "isdecimal", "isalpha", "isalnum", "isspace",
    "isupper", "islower", "splitlines", "removeprefix", "removesuffix", "partition",
    "rpartition", "zfill", "center", "ljust", "rjust", "casefold", NULL
};
static const char *const DICT_METHODS[] = { "items", "keys", "values", "get", "copy", NULL };
static const char *const LIST_METHODS[] = { "index", "count", "copy", NULL };
static const char *const LIST_UNSAFE[] = { "append", "extend", "insert", "pop", "remove", "clear",
                                           "sort", "reverse", NULL };
static const char *const DICT_UNSAFE[] = { "pop", "popitem", "clear", "update", "setdefault",
                                           NULL };

static int in_list(const char *const *l, const char *name)
{
    for (; *l; l++)
        if (!strcmp(*l, name))
            return 1;
    return 0;
}

unsigned jinja_method_mask(const char *name)
{
    return (in_list(STR_METHODS, name) ? JM_STR : 0) | (in_list(DICT_METHODS, name) ? JM_DICT : 0) |
           (in_list(LIST_METHODS, name) ? JM_LIST : 0) |
           (in_list(DICT_UNSAFE, name) ? JM_DICT_UNSAFE : 0) |
           (in_list(LIST_UNSAFE, name) ? JM_LIST_UNSAFE : 0);
}

int jinja_has_method(const jv *recv, unsigned mask)
{
    if (recv->t == JT_STR)
        return mask & JM_STR;
    if (jv_is_dict(recv))
        return mask & JM_DICT;
    if (recv->t == JT_LIST || recv->t == JT_JLIST)
        return mask & JM_LIST;
    return 0;
}

int jinja_unsafe_method(const jv *recv, unsigned mask)
{
    if (jv_is_dict(recv))
        return mask & JM_DICT_UNSAFE;
    if ((recv->t == JT_LIST && !(recv->flags & JF_TUPLE)) || recv->t == JT_JLIST)
        return mask & JM_LIST_UNSAFE;
    return 0;
}

static jv pad(jctx *c, const jnode *at, const jv *s, const jcall *a, int how)
{
    int64_t w = need_int(c, at, jarg(a, 0, "width"), 0, "width");
    const jv *f = jarg(a, 1, "fillchar");
    const char *fill = " ";
    size_t fl = 1;
    int64_t n = (int64_t)jv_ncp(s);
    jsb b;

    if (f) {
        jv fs = need_str(c, at, f, "fillchar");
        if (jv_ncp(&fs) != 1)
            jerr(c, KVG_JINJA_ERROR, at, "The fill character must be exactly one character long");
        fill = fs.u.s.p;
        fl = fs.u.s.n;
    }
    if (w <= n)
        return *s;
    if (w - n > (int64_t)c->max_output)
        jerr(c, KVG_JINJA_LIMIT, at, "output limit (%zu bytes) reached", c->max_output);
    int64_t total = w - n, left = 0;
    if (how == 'c')
        left = total / 2 + (total & w & 1);
    else if (how == 'r')
        left = total;
    jsb_init(c, &b, s->u.s.n + (size_t)total * fl);
    for (int64_t i = 0; i < left; i++)
        jsb_put(c, &b, fill, fl, 0);
    jsb_put_str(c, &b, s);
    for (int64_t i = left; i < total; i++)
        jsb_put(c, &b, fill, fl, 0);
    return jsb_str(&b);
}

static jv str_method(jctx *c, const jnode *at, const jv *s, const char *m, const jcall *a)
{
    if (!strcmp(m, "strip")) return do_strip(c, at, s, jarg(a, 0, "chars"), 3);
    if (!strcmp(m, "lstrip")) return do_strip(c, at, s, jarg(a, 0, "chars"), 1);
    if (!strcmp(m, "rstrip")) return do_strip(c, at, s, jarg(a, 0, "chars"), 2);
    if (!strcmp(m, "split") || !strcmp(m, "rsplit"))
        return do_split(c, at, s, jarg(a, 0, "sep"), need_int(c, at, jarg(a, 1, "maxsplit"), -1,
                        "maxsplit"), m[0] == 'r');
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith"))
        return jv_bool(affix(c, at, s, jarg(a, 0, NULL), m[0] == 'e'));
    if (!strcmp(m, "upper")) return map_case(c, s, CASE_UPPER);
    if (!strcmp(m, "lower") || !strcmp(m, "casefold")) return map_case(c, s, CASE_LOWER);
    if (!strcmp(m, "title")) return map_case(c, s, CASE_TITLE);
    if (!strcmp(m, "capitalize")) return map_case(c, s, CASE_CAPITALIZE);
    if (!strcmp(m, "swapcase")) return map_case(c, s, CASE_SWAP);
    if (!strcmp(m, "replace")) {
        jv o = need_str(c, at, jarg(a, 0, "old"), "replace's old");
        jv nw = need_str(c, at, jarg(a, 1, "new"), "replace's new");
        return do_replace(c, s, &o, &nw, need_int(c, at, jarg(a, 2, "count"), -1, "count"));
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex")) {
        jv sub = need_str(c, at, jarg(a, 0, NULL), "the substring");
        int64_t r = do_find(s, &sub, m[0] == 'r');
        if (r < 0 && strstr(m, "index"))
            jerr(c, KVG_JINJA_ERROR, at, "substring not found");
        return jv_int(r);
    }
    if (!strcmp(m, "count")) {
        jv sub = need_str(c, at, jarg(a, 0, NULL), "the substring");
        return jv_int(do_count_sub(s, &sub));
    }
    if (!strcmp(m, "join")) {
        const jv *seq = jarg(a, 0, NULL);
        if (!seq)
            jerr(c, KVG_JINJA_ERROR, at, "join() takes exactly one argument");
        size_t n;
        jv *items = jv_items(c, at, seq, &n);
        for (size_t i = 0; i < n; i++)
            if (items[i].t != JT_STR)
                jerr(c, KVG_JINJA_ERROR, at, "sequence item %zu: expected str instance, %s found",
                     i, jv_type_name(&items[i]));
        return join_items(c, at, s, seq, NULL);
    }
    if (!strcmp(m, "format")) return str_format(c, at, s, a);
    if (!strcmp(m, "isdigit")) return jv_bool(str_all(s, 'd'));
    if (!strcmp(m, "isdecimal")) return jv_bool(str_all(s, 'd'));
    if (!strcmp(m, "isnumeric")) return jv_bool(str_all(s, 'n'));
    if (!strcmp(m, "isalpha")) return jv_bool(str_all(s, 'a'));
    if (!strcmp(m, "isalnum")) return jv_bool(str_all(s, 'A'));
    if (!strcmp(m, "isspace")) return jv_bool(str_all(s, 's'));
    if (!strcmp(m, "isupper")) return jv_bool(str_all(s, 'u'));
    if (!strcmp(m, "islower")) return jv_bool(str_all(s, 'l'));
    if (!strcmp(m, "splitlines")) return do_splitlines(c, s, opt_bool(jarg(a, 0, "keepends"), 0));
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        jv p = need_str(c, at, jarg(a, 0, NULL), "the affix");
        int end = m[6] == 's';
        if (p.u.s.n <= s->u.s.n &&
            !memcmp(s->u.s.p + (end ? s->u.s.n - p.u.s.n : 0), p.u.s.p, p.u.s.n))
            return jv_substr(s, end ? 0 : p.u.s.n, s->u.s.n - p.u.s.n);
        return *s;
    }
    if (!strcmp(m, "partition") || !strcmp(m, "rpartition")) {
        jv sep = need_str(c, at, jarg(a, 0, NULL), "the separator");
        jv r = jv_list_new(c, 3);
        int right = m[0] == 'r';
        if (!sep.u.s.n)
            jerr(c, KVG_JINJA_ERROR, at, "empty separator");
        r.flags = JF_TUPLE;
        int64_t cpi = do_find(s, &sep, right);
        if (cpi < 0) {
            r.u.l->v[0] = right ? jv_lit("") : *s;
            r.u.l->v[1] = jv_lit("");
            r.u.l->v[2] = right ? *s : jv_lit("");
            return r;
        }
        size_t off = jv_cp_off(s, (size_t)cpi);
        r.u.l->v[0] = jv_substr(s, 0, off);
        r.u.l->v[1] = jv_substr(s, off, sep.u.s.n);
        r.u.l->v[2] = jv_substr(s, off + sep.u.s.n, s->u.s.n - off - sep.u.s.n);
        return r;
    }
    if (!strcmp(m, "center")) return pad(c, at, s, a, 'c');
    if (!strcmp(m, "ljust")) return pad(c, at, s, a, 'l');
    if (!strcmp(m, "rjust")) return pad(c, at, s, a, 'r');
    if (!strcmp(m, "zfill")) {
        int64_t w = need_int(c, at, jarg(a, 0, NULL), 0, "width");
        int64_t n = (int64_t)jv_ncp(s);
        if (w <= n)
            return *s;
        if (w - n > (int64_t)c->max_output)
            jerr(c, KVG_JINJA_LIMIT, at, "output limit (%zu bytes) reached", c->max_output);
        jsb b;
        size_t sign = s->u.s.n && (s->u.s.p[0] == '-' || s->u.s.p[0] == '+');
        jsb_init(c, &b, (size_t)w + 4);
        jsb_put_sub(c, &b, s, 0, sign);
        for (int64_t i = 0; i < w - n; i++)
            jsb_putc(c, &b, '0');
        jsb_put_sub(c, &b, s, sign, s->u.s.n - sign);
        return jsb_str(&b);
    }
    jerr(c, KVG_JINJA_ERROR, at, "'str object' has no attribute '%s'", m);
}

jv jinja_call_method(jctx *c, const jnode *at, const jv *recv, const char *name, const jcall *a)
{
    if (recv->t == JT_LOOP && !strcmp(name, "cycle")) {
        if (!a->npos)
            jerr(c, KVG_JINJA_ERROR, at, "no items for cycling given");
        return a->pos[recv->u.loop->i % (size_t)a->npos];
    }
    if (((jv_is_dict(recv) && in_list(DICT_UNSAFE, name)) ||
         (((recv->t == JT_LIST && !(recv->flags & JF_TUPLE)) || recv->t == JT_JLIST) &&
          in_list(LIST_UNSAFE, name))))
        jerr(c, KVG_JINJA_ERROR, at, "access to attribute '%s' of '%s' object is unsafe.", name,
             jv_type_name(recv));
    if (recv->t == JT_STR && in_list(STR_METHODS, name))
        return str_method(c, at, recv, name, a);
    if (jv_is_dict(recv)) {
        if (!strcmp(name, "get")) {
            const jv *k = jarg(a, 0, "key"), *d = jarg(a, 1, "default");
            jv r;
            if (!k)
                jerr(c, KVG_JINJA_ERROR, at, "get expected at least 1 argument, got 0");
            if (jv_dict_get(c, recv, k, &r))
                return r;
            return d ? *d : jv_none();
        }
        if (!strcmp(name, "copy"))
            return *recv;
        jv *ks, *vs;
        size_t n;
        jv_dict_keys_vals(c, recv, &ks, &vs, &n);
        jv r = jv_list_new(c, n);
        /* a view prints as dict_keys([...]) (jv_str_into) */
        r.aux = !strcmp(name, "keys") ? 1 : !strcmp(name, "values") ? 2 : 3;
        for (size_t i = 0; i < n; i++) {
            if (!strcmp(name, "keys")) {
                r.u.l->v[i] = ks[i];
            } else if (!strcmp(name, "values")) {
                r.u.l->v[i] = vs[i];
            } else {
                jv t = jv_list_new(c, 2);
                t.flags = JF_TUPLE;
                t.u.l->v[0] = ks[i];
                t.u.l->v[1] = vs[i];
                r.u.l->v[i] = t;
            }
        }
        return r;
    }
    if ((recv->t == JT_LIST || recv->t == JT_JLIST) && in_list(LIST_METHODS, name)) {
        if (!strcmp(name, "copy"))
            return *recv;
        const jv *x = jarg(a, 0, NULL);
        size_t n = jv_len(c, at, recv);
        int64_t cnt = 0;
        if (!x)
            jerr(c, KVG_JINJA_ERROR, at, "%s() takes exactly one argument", name);
        for (size_t i = 0; i < n; i++) {
            jv y = jv_list_at(c, recv, i);
            if (jv_eq(c, &y, x)) {
                if (name[0] == 'i')
                    return jv_int((int64_t)i);
                cnt++;
            }
        }
        if (name[0] == 'i')
            jerr(c, KVG_JINJA_ERROR, at, "value is not in list");
        return jv_int(cnt);
    }
    jerr(c, KVG_JINJA_ERROR, at, "'%s object' has no attribute '%s'", jv_type_name(recv), name);
}

/* ---- attribute paths (selectattr, map, sort, ...): "a.b.0" ---- */

static jv get_path(jctx *c, const jv *x, const jv *attr)
{
    jv cur = *x;
    jv path = attr->t == JT_STR ? *attr : jv_none();
    size_t i = 0;

    if (attr->t == JT_INT) {
        jv r;
        if (jv_is_list(&cur)) {
            int64_t k = attr->u.i, n = (int64_t)jv_len(c, NULL, &cur);
            if (k < 0)
                k += n;
            return k >= 0 && k < n ? jv_list_at(c, &cur, (size_t)k) : jv_undef("no such element");
        }
        return jv_dict_get(c, &cur, attr, &r) ? r : jv_undef("no such element");
    }
    if (path.t != JT_STR)
        return jv_undef("bad attribute");
    while (i <= path.u.s.n) {
        const char *dot = memchr(path.u.s.p + i, '.', path.u.s.n - i);
        size_t e = dot ? (size_t)(dot - path.u.s.p) : path.u.s.n;
        jv part = jv_substr(&path, i, e - i), r;
        if (cur.t == JT_UNDEF)
            return cur;
        if (jv_is_dict(&cur) || cur.t == JT_NS) {
            if (!jv_dict_get(c, &cur, &part, &r))
                return jv_undef("no such attribute");
            cur = r;
        } else if (jv_is_list(&cur) && part.u.s.n && part.u.s.p[0] >= '0' && part.u.s.p[0] <= '9') {
            size_t k = (size_t)strtoull(str_z(c, &part), NULL, 10);
            if (k >= jv_len(c, NULL, &cur))
                return jv_undef("no such element");
            cur = jv_list_at(c, &cur, k);
        } else {
            return jv_undef("no such attribute");
        }
        i = e + 1;
        if (!dot)
            break;
    }
    return cur;
}

/* ---- sorting (stable merge sort; comparisons may raise) ---- */

typedef struct sortkey { jv key, val; } sortkey;

static int key_cmp(jctx *c, const jnode *at, const jv *a, const jv *b, int ci)
{
    if (ci && a->t == JT_STR && b->t == JT_STR) {
        jv la = map_case(c, a, CASE_LOWER), lb = map_case(c, b, CASE_LOWER);
        return jv_cmp(c, at, &la, &lb);
    }
    return jv_cmp(c, at, a, b);
}

static void msort(jctx *c, const jnode *at, sortkey *v, sortkey *tmp, size_t n, int ci, int rev)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    msort(c, at, v, tmp, h, ci, rev);
    msort(c, at, v + h, tmp, n - h, ci, rev);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = key_cmp(c, at, &v[j].key, &v[i].key, ci);
        /* take from the right only when strictly before (stability) */
        if (rev ? r > 0 : r < 0)
            tmp[k++] = v[j++];
        else
            tmp[k++] = v[i++];
    }
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

static jv lower_if(jctx *c, const jv *v, int ci)
{
    return ci && v->t == JT_STR ? map_case(c, v, CASE_LOWER) : *v;
}

/* ---- filters ---- */

#define UNUSED __attribute__((unused))
#define FILTER(name) static jv f_##name(UNUSED jctx *c, UNUSED const jnode *at, UNUSED const jv *x, \
                                     UNUSED const jcall *a)

FILTER(abs)
{
    (void)a;
    if (x->t == JT_INT || x->t == JT_BOOL) {
        if (x->u.i == INT64_MIN)
            jerr(c, KVG_JINJA_ERROR, at, "integer overflow (beyond 64 bits)");
        return jv_int(x->u.i < 0 ? -x->u.i : x->u.i);
    }
    if (x->t == JT_FLOAT)
        return jv_float(fabs(x->u.f));
    jerr(c, KVG_JINJA_ERROR, at, "bad operand type for abs(): '%s'", jv_type_name(x));
}

FILTER(capitalize) { jv s = sstr(c, at, x); (void)a; return map_case(c, &s, CASE_CAPITALIZE); }
FILTER(upper) { jv s = sstr(c, at, x); (void)a; return map_case(c, &s, CASE_UPPER); }
FILTER(lower) { jv s = sstr(c, at, x); (void)a; return map_case(c, &s, CASE_LOWER); }
FILTER(title) { jv s = sstr(c, at, x); (void)a; return map_case(c, &s, CASE_JTITLE); }

FILTER(center)
{
    jv s = sstr(c, at, x);
    jcall b = { .npos = 1, .pos = jarg(a, 0, "width") };
    jv w80 = jv_int(80);
    if (!b.pos)
        b.pos = &w80;
    return pad(c, at, &s, &b, 'c');
}

FILTER(length)
{
    (void)a;
    return jv_int((int64_t)jv_len(c, at, x));
}

FILTER(default)
{
    const jv *d = jarg(a, 0, "default_value");
    int boolean = opt_bool(jarg(a, 1, "boolean"), 0);
    if (x->t == JT_UNDEF || (boolean && !jv_truthy(x)))
        return d ? *d : jv_lit("");
    return *x;
}

static jv dict_pairs(jctx *c, const jnode *at, const jv *x)
{
    jv *ks, *vs;
    size_t n;

    if (!jv_is_dict(x))
        jerr(c, KVG_JINJA_ERROR, at, "can only iterate the items of a mapping, not %s",
             jv_type_name(x));
    jv_dict_keys_vals(c, x, &ks, &vs, &n);
    jv r = jv_list_new(c, n);
    for (size_t i = 0; i < n; i++) {
        jv t = jv_list_new(c, 2);
        t.flags = JF_TUPLE;
        t.u.l->v[0] = ks[i];
        t.u.l->v[1] = vs[i];
        r.u.l->v[i] = t;
    }
    return r;
}

FILTER(items)
{
    (void)a;
    if (x->t == JT_UNDEF)
        return jv_list_new(c, 0);
    jv r = dict_pairs(c, at, x);
    r.flags = JF_GEN;
    return r;
}

FILTER(dictsort)
{
    int ci = !opt_bool(jarg(a, 0, "case_sensitive"), 0);
    const jv *by = jarg(a, 1, "by");
    int rev = opt_bool(jarg(a, 2, "reverse"), 0);
    int pos = 0;

    if (x->t == JT_UNDEF)
        jerr(c, KVG_JINJA_ERROR, at, "%s", jv_undef_msg(c, x));
    if (by) {
        jv b = need_str(c, at, by, "by");
        if (b.u.s.n == 5 && !memcmp(b.u.s.p, "value", 5))
            pos = 1;
        else if (!(b.u.s.n == 3 && !memcmp(b.u.s.p, "key", 3)))
            jerr(c, KVG_JINJA_ERROR, at, "You can only sort by either \"key\" or \"value\"");
    }
    jv pairs = dict_pairs(c, at, x);
    size_t n = pairs.u.l->n;
    sortkey *v = jalloc(c, (n + 1) * sizeof *v), *tmp = jalloc(c, (n + 1) * sizeof *tmp);
    for (size_t i = 0; i < n; i++) {
        v[i].val = pairs.u.l->v[i];
        v[i].key = lower_if(c, &pairs.u.l->v[i].u.l->v[pos], ci);
    }
    msort(c, at, v, tmp, n, 0, rev);
    for (size_t i = 0; i < n; i++)
        pairs.u.l->v[i] = v[i].val;
    return pairs;
}

FILTER(sort)
{
    int rev = opt_bool(jarg(a, 0, "reverse"), 0);
    int ci = !opt_bool(jarg(a, 1, "case_sensitive"), 0);
    const jv *attr = jarg(a, 2, "attribute");
    size_t n;
    jv *items = jv_items(c, at, x, &n);
    sortkey *v = jalloc(c, (n + 1) * sizeof *v), *tmp = jalloc(c, (n + 1) * sizeof *tmp);

    for (size_t i = 0; i < n; i++) {
        v[i].val = items[i];
        v[i].key = attr && attr->t != JT_NONE ? get_path(c, &items[i], attr) : items[i];
        v[i].key = lower_if(c, &v[i].key, ci);
    }
    msort(c, at, v, tmp, n, 0, rev);
    jv r = jv_list_new(c, n);
    for (size_t i = 0; i < n; i++)
        r.u.l->v[i] = v[i].val;
    return r;
}

FILTER(unique)
{
    int ci = !opt_bool(jarg(a, 0, "case_sensitive"), 0);
    const jv *attr = jarg(a, 1, "attribute");
    size_t n, k = 0;
    jv *items = jv_items(c, at, x, &n);
    jv *keys = jalloc(c, (n + 1) * sizeof(jv));
    jv r = jv_list_new(c, n);

    for (size_t i = 0; i < n; i++) {
        jv key = attr && attr->t != JT_NONE ? get_path(c, &items[i], attr) : items[i];
        key = lower_if(c, &key, ci);
        size_t j;
        for (j = 0; j < k; j++)
            if (jv_eq(c, &keys[j], &key))
                break;
        if (j < k)
            continue;
        keys[k] = key;
        r.u.l->v[k++] = items[i];
    }
    r.u.l->n = k;
    r.flags = JF_GEN;
    return r;
}

static jv minmax(jctx *c, const jnode *at, const jv *x, const jcall *a, int want)
{
    int ci = !opt_bool(jarg(a, 0, "case_sensitive"), 0);
    const jv *attr = jarg(a, 1, "attribute");
    size_t n;
    jv *items = jv_items(c, at, x, &n);
    jv best, bkey;

    if (!n)
        return jv_undef("No aggregated item, sequence was empty.");
    best = items[0];
    bkey = attr && attr->t != JT_NONE ? get_path(c, &best, attr) : best;
    bkey = lower_if(c, &bkey, ci);
    for (size_t i = 1; i < n; i++) {
        jv k = attr && attr->t != JT_NONE ? get_path(c, &items[i], attr) : items[i];
        k = lower_if(c, &k, ci);
        if (jv_cmp(c, at, &k, &bkey) * want > 0) {
            best = items[i];
            bkey = k;
        }
    }
    return best;
}

FILTER(min) { return minmax(c, at, x, a, -1); }
FILTER(max) { return minmax(c, at, x, a, 1); }

FILTER(sum)
{
    const jv *attr = jarg(a, 0, "attribute");
    const jv *start = jarg(a, 1, "start");
    jv acc = start ? *start : jv_int(0);
    size_t n;
    jv *items = jv_items(c, at, x, &n);

    for (size_t i = 0; i < n; i++) {
        jv v = attr && attr->t != JT_NONE ? get_path(c, &items[i], attr) : items[i];
        acc = jinja_binop(c, at, OP_ADD, &acc, &v);
    }
    return acc;
}

FILTER(first)
{
    size_t n;
    jv *items;

    (void)a;
    if (x->t == JT_JLIST)
        return json_array_size(x->u.j) ? jv_list_at(c, x, 0)
                                       : jv_undef("No first item, sequence was empty.");
    items = jv_items(c, at, x, &n);
    return n ? items[0] : jv_undef("No first item, sequence was empty.");
}

FILTER(last)
{
    size_t n;
    jv *items;

    (void)a;
    if (x->t == JT_LIST && (x->flags & JF_GEN))
        jerr(c, KVG_JINJA_ERROR, at, "'generator' object is not reversible");
    items = jv_items(c, at, x, &n);
    return n ? items[n - 1] : jv_undef("No last item, sequence was empty.");
}

FILTER(list)
{
    size_t n;
    jv *items = jv_items(c, at, x, &n);
    jv r = jv_list_new(c, n);

    (void)a;
    memcpy(r.u.l->v, items, n * sizeof(jv));
    return r;
}

FILTER(reverse)
{
    (void)a;
    if (x->t == JT_STR) {
        size_t n;
        jv *chars = jv_items(c, at, x, &n);
        jsb b;
        jsb_init(c, &b, x->u.s.n);
        while (n--)
            jsb_put_str(c, &b, &chars[n]);
        return jsb_str(&b);
    }
    if (x->t == JT_LIST && (x->flags & JF_GEN)) {
        jerr(c, KVG_JINJA_ERROR, at, "argument to reversed() must be a sequence");
    }
    size_t n;
    jv *items = jv_items(c, at, x, &n);
    jv r = jv_list_new(c, n);
    for (size_t i = 0; i < n; i++)
        r.u.l->v[i] = items[n - 1 - i];
    r.flags = JF_GEN;
    return r;
}

static jv join_items(jctx *c, const jnode *at, const jv *sep, const jv *seq, const char *attr)
{
    size_t n;
    jv *items = jv_items(c, at, seq, &n);
    jsb b;
    jv av = attr ? jv_lit(attr) : jv_none();

    jsb_init(c, &b, 64);
    for (size_t i = 0; i < n; i++) {
        if (i)
            jsb_put_str(c, &b, sep);
        jv v = attr ? get_path(c, &items[i], &av) : items[i];
        jv_str_into(c, at, &b, &v);
    }
    return jsb_str(&b);
}

FILTER(join)
{
    const jv *d = jarg(a, 0, "d");
    const jv *attr = jarg(a, 1, "attribute");
    jv sep = d ? jv_to_str(c, at, d) : jv_lit("");
    return join_items(c, at, &sep, x, attr && attr->t == JT_STR ? str_z(c, attr) : NULL);
}

FILTER(string)
{
    (void)a;
    return jv_to_str(c, at, x);
}

FILTER(safe)
{
    jv s = jv_to_str(c, at, x);
    (void)a;
    s.flags |= JF_SAFE;
    return s;
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

FILTER(escape)
{
    if (x->t == JT_STR && (x->flags & JF_SAFE))
        return *x;
    jv s = jv_to_str(c, at, x);
    return jinja_html_escape(c, &s);
}

FILTER(trim)
{
    jv s = sstr(c, at, x);
    return do_strip(c, at, &s, jarg(a, 0, "chars"), 3);
}

FILTER(replace)
{
    jv s = sstr(c, at, x);
    jv o = jv_to_str(c, at, jarg(a, 0, "old") ? jarg(a, 0, "old") : &(jv){ .t = JT_UNDEF });
    jv nw = jv_to_str(c, at, jarg(a, 1, "new") ? jarg(a, 1, "new") : &(jv){ .t = JT_UNDEF });
    return do_replace(c, &s, &o, &nw, need_int(c, at, jarg(a, 2, "count"), -1, "count"));
}

FILTER(int)
{
    const jv *d = jarg(a, 0, "default");
    int64_t base = need_int(c, at, jarg(a, 1, "base"), 10, "base");
    jv dflt = d ? *d : jv_int(0);

    switch (x->t) {
    case JT_INT: case JT_BOOL:
        return jv_int(x->u.i);
    case JT_FLOAT:
        if (!isfinite(x->u.f) || fabs(x->u.f) >= 9.2e18)
            return dflt;
        return jv_int((int64_t)x->u.f);
    case JT_STR: {
        char buf[80];
        size_t o = 0;
        jv s = do_strip(c, at, x, NULL, 3);
        if (s.u.s.n == 0 || s.u.s.n >= sizeof buf)
            return dflt;
        for (size_t i = 0; i < s.u.s.n; i++) {
            char ch = s.u.s.p[i];
            if (ch == '_' && i && i + 1 < s.u.s.n && s.u.s.p[i - 1] != '_')
                continue;
            buf[o++] = ch;
        }
        buf[o] = 0;
        char *end;
        errno = 0;
        long long v = strtoll(buf, &end, (int)base);
        if (*end == 0 && end != buf && errno == 0)
            return jv_int(v);
        /* Jinja2 falls back to int(float(s)) */
        double f = strtod(buf, &end);
        if (*end == 0 && end != buf && isfinite(f) && fabs(f) < 9.2e18 && base == 10)
            return jv_int((int64_t)f);
        return dflt;
    }
    default:
        return dflt;
    }
}

FILTER(float)
{
    const jv *d = jarg(a, 0, "default");
    jv dflt = d ? *d : jv_float(0.0);

    switch (x->t) {
    case JT_INT: case JT_BOOL:
        return jv_float((double)x->u.i);
    case JT_FLOAT:
        return *x;
    case JT_STR: {
        jv s = do_strip(c, at, x, NULL, 3);
        const char *z = str_z(c, &s);
        char *end;
        if (!s.u.s.n)
            return dflt;
        double f = strtod(z, &end);
        if (*end || strchr(z, 'x') || strchr(z, 'X'))
            return dflt;
        return jv_float(f);
    }
    default:
        return dflt;
    }
}

FILTER(round)
{
    int64_t prec = need_int(c, at, jarg(a, 0, "precision"), 0, "precision");
    const jv *m = jarg(a, 1, "method");
    double v;
    char buf[400];

    if (x->t == JT_INT || x->t == JT_BOOL)
        v = (double)x->u.i;
    else if (x->t == JT_FLOAT)
        v = x->u.f;
    else
        jerr(c, KVG_JINJA_ERROR, at, "type %s doesn't define __round__ method", jv_type_name(x));
    if (m && m->t == JT_STR && m->u.s.n == 4 && !memcmp(m->u.s.p, "ceil", 4))
        return jv_float(ceil(v * pow(10, (double)prec)) / pow(10, (double)prec));
    if (m && m->t == JT_STR && m->u.s.n == 5 && !memcmp(m->u.s.p, "floor", 5))
        return jv_float(floor(v * pow(10, (double)prec)) / pow(10, (double)prec));
    if (!isfinite(v) || prec > 300 || prec < 0)
        return jv_float(prec < 0 ? nearbyint(v / pow(10, (double)-prec)) * pow(10, (double)-prec) : v);
    /* printf rounds the exact binary value half to even, as Python's round() */
    snprintf(buf, sizeof buf, "%.*f", (int)prec, v);
    return jv_float(strtod(buf, NULL));
}

FILTER(indent)
{
    const jv *w = jarg(a, 0, "width");
    int first = opt_bool(jarg(a, 1, "first"), 0);
    int blank = opt_bool(jarg(a, 2, "blank"), 0);
    jv ind;
    jsb b;

    if (w && w->t == JT_STR) {
        ind = *w;
    } else {
        int64_t n = need_int(c, at, w, 4, "width");
        if (n < 0)
            n = 0;
        if ((uint64_t)n > c->max_output)
            jerr(c, KVG_JINJA_LIMIT, at, "output limit (%zu bytes) reached", c->max_output);
        char *sp = jalloc(c, (size_t)n + 1);
        memset(sp, ' ', (size_t)n);
        ind = jv_strn(sp, (size_t)n, JS_CLEAN);
    }
    /* s + "\n", split into lines, as Jinja2 does */
    jv s = sstr(c, at, x);
    jsb_init(c, &b, s.u.s.n + 1);
    jsb_put_str(c, &b, &s);
    jsb_putc(c, &b, '\n');
    jv s2 = jsb_str(&b);
    jv lines = do_splitlines(c, &s2, 0);
    size_t n = lines.u.l->n;
    jsb_init(c, &b, s.u.s.n + 64);
    if (first)
        jsb_put_str(c, &b, &ind);
    for (size_t i = 0; i < n; i++) {
        const jv *ln = &lines.u.l->v[i];
        if (i) {
            jsb_putc(c, &b, '\n');
            if (blank || ln->u.s.n)
                jsb_put_str(c, &b, &ind);
        }
        jsb_put_str(c, &b, ln);
    }
    return jsb_str(&b);
}

FILTER(wordcount)
{
    jv s = sstr(c, at, x);
    int64_t n = 0;
    int in = 0;

    (void)a;
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp;
        i += cp_at(&s, i, &cp);
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
        int w = cp == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
                (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO) ||
                (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME);
        if (w && !in)
            n++;
        in = w;
    }
    return jv_int(n);
}

FILTER(truncate)
{
    jv s = sstr(c, at, x);
    int64_t len = need_int(c, at, jarg(a, 0, "length"), 255, "length");
    int killwords = opt_bool(jarg(a, 1, "killwords"), 0);
    const jv *endp = jarg(a, 2, "end");
    int64_t leeway = need_int(c, at, jarg(a, 3, "leeway"), 5, "leeway");
    jv end = endp ? jv_to_str(c, at, endp) : jv_lit("...");
    int64_t n = (int64_t)jv_ncp(&s), el = (int64_t)jv_ncp(&end);
    jsb b;

    if (len < el)
        jerr(c, KVG_JINJA_ERROR, at, "expected length >= %lld, got %lld", (long long)el,
             (long long)len);
    if (n <= len + leeway)
        return s;
    size_t cut = jv_cp_off(&s, (size_t)(len - el));
    jv head = jv_substr(&s, 0, cut);
    if (!killwords) {
        const char *sp = NULL;
        for (size_t k = head.u.s.n; k-- > 0;)
            if (head.u.s.p[k] == ' ') {
                sp = head.u.s.p + k;
                break;
            }
        if (sp)
            head = jv_substr(&head, 0, (size_t)(sp - head.u.s.p));
    }
    jsb_init(c, &b, head.u.s.n + end.u.s.n);
    jsb_put_str(c, &b, &head);
    jsb_put_str(c, &b, &end);
    return jsb_str(&b);
}

/* "%s %d %r %f %x %%" % args (format filter) */
FILTER(format)
{
    jv s = sstr(c, at, x);
    jsb b;
    int ai = 0;

    if (a->nkw && a->npos)
        jerr(c, KVG_JINJA_ERROR, at, "can't handle positional and keyword arguments at the same time");
    jsb_init(c, &b, s.u.s.n + 32);
    for (size_t i = 0; i < s.u.s.n; i++) {
        if (s.u.s.p[i] != '%') {
            jsb_put_sub(c, &b, &s, i, 1);
            continue;
        }
        char spec[32];
        size_t o = 0;
        spec[o++] = '%';
        i++;
        while (i < s.u.s.n && o < 20 && strchr("-+ #0123456789.", s.u.s.p[i]))
            spec[o++] = s.u.s.p[i++];
        if (i >= s.u.s.n)
            jerr(c, KVG_JINJA_ERROR, at, "incomplete format");
        char conv = s.u.s.p[i];
        if (conv == '%') {
            jsb_putc(c, &b, '%');
            continue;
        }
        if (ai >= a->npos)
            jerr(c, KVG_JINJA_ERROR, at, "not enough arguments for format string");
        const jv *v = &a->pos[ai++];
        char out[512];
        switch (conv) {
        case 's':
        case 'r': {
            if (o == 1) {
                if (conv == 's')
                    jv_str_into(c, at, &b, v);
                else
                    jv_repr_into(c, at, &b, v);
                break;
            }
            jsb tmp;
            jsb_init(c, &tmp, 32);
            if (conv == 's')
                jv_str_into(c, at, &tmp, v);
            else
                jv_repr_into(c, at, &tmp, v);
            jv t = jsb_str(&tmp);
            spec[o++] = 's';
            spec[o] = 0;
            int width = atoi(spec + 1 + (spec[1] == '-'));
            int pad_n = width - (int)jv_ncp(&t);
            if (spec[1] != '-')
                for (int k = 0; k < pad_n; k++)
                    jsb_putc(c, &b, ' ');
            jsb_put_str(c, &b, &t);
            if (spec[1] == '-')
                for (int k = 0; k < pad_n; k++)
                    jsb_putc(c, &b, ' ');
            break;
        }
        case 'd': case 'i': case 'x': case 'X': case 'o': {
            long long iv;
            if (v->t == JT_INT || v->t == JT_BOOL)
                iv = v->u.i;
            else if (v->t == JT_FLOAT && isfinite(v->u.f) && fabs(v->u.f) < 9.2e18)
                iv = (long long)v->u.f;
            else
                jerr(c, KVG_JINJA_ERROR, at, "%%%c format: a real number is required, not %s",
                     conv, jv_type_name(v));
            spec[o++] = 'l';
            spec[o++] = 'l';
            spec[o++] = conv == 'i' ? 'd' : conv;
            spec[o] = 0;
            jsb_put(c, &b, out, (size_t)snprintf(out, sizeof out, spec, iv) % sizeof out, 0);
            break;
        }
        case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
            double fv;
            if (v->t == JT_INT || v->t == JT_BOOL)
                fv = (double)v->u.i;
            else if (v->t == JT_FLOAT)
                fv = v->u.f;
            else
                jerr(c, KVG_JINJA_ERROR, at, "must be real number, not %s", jv_type_name(v));
            spec[o++] = conv;
            spec[o] = 0;
            int k = snprintf(out, sizeof out, spec, fv);
            jsb_put(c, &b, out, k < 0 ? 0 : (size_t)k < sizeof out ? (size_t)k : sizeof out - 1, 0);
            break;
        }
        default:
            jerr(c, KVG_JINJA_ERROR, at, "unsupported format character '%c'", conv);
        }
    }
    if (ai < a->npos)
        jerr(c, KVG_JINJA_ERROR, at, "not all arguments converted during string formatting");
    return jsb_str(&b);
}

FILTER(batch)
{
    int64_t size = need_int(c, at, jarg(a, 0, "linecount"), 1, "linecount");
    const jv *fill = jarg(a, 1, "fill_with");
    size_t n;
    jv *items = jv_items(c, at, x, &n);

    if (size <= 0)
        jerr(c, KVG_JINJA_ERROR, at, "batch size must be positive");
    size_t nb = (n + (size_t)size - 1) / (size_t)size;
    jv r = jv_list_new(c, nb);
    for (size_t i = 0; i < nb; i++) {
        size_t k = n - i * (size_t)size < (size_t)size ? n - i * (size_t)size : (size_t)size;
        size_t kk = fill && fill->t != JT_NONE ? (size_t)size : k;
        jv row = jv_list_new(c, kk);
        for (size_t j = 0; j < kk; j++)
            row.u.l->v[j] = j < k ? items[i * (size_t)size + j] : *fill;
        r.u.l->v[i] = row;
    }
    r.flags = JF_GEN;
    return r;
}

/* map('filter', args...) or map(attribute='x', default=...) */
FILTER(map)
{
    size_t n = 0;
    /* Jinja2 maps nothing over a falsy value (none|map(...) is empty) */
    jv *items = jv_truthy(x) ? jv_items(c, at, x, &n) : NULL;
    jv r = jv_list_new(c, n);
    const jv *attr = jarg(a, -1, "attribute");

    r.flags = JF_GEN;
    if (attr) {
        const jv *d = jarg(a, -1, "default");
        for (size_t i = 0; i < n; i++) {
            jv v = get_path(c, &items[i], attr);
            r.u.l->v[i] = v.t == JT_UNDEF && d ? *d : v;
        }
        return r;
    }
    if (a->npos < 1)
        jerr(c, KVG_JINJA_ERROR, at, "map requires a filter argument");
    jcall rest = { .npos = a->npos - 1, .pos = a->pos + 1, .nkw = a->nkw, .kwname = a->kwname,
                   .kwval = a->kwval };
    for (size_t i = 0; i < n; i++)
        r.u.l->v[i] = jinja_apply_filter_by_name(c, at, &a->pos[0], &items[i], &rest);
    return r;
}

static jv select_impl(jctx *c, const jnode *at, const jv *x, const jcall *a, int attr_mode, int want)
{
    size_t n = 0, k = 0;
    /* as map: a falsy value selects nothing, even none */
    jv *items = jv_truthy(x) ? jv_items(c, at, x, &n) : NULL;
    jv r = jv_list_new(c, n);
    int off = attr_mode ? 1 : 0;
    const jv *attr = attr_mode ? jarg(a, 0, NULL) : NULL;
    const jv *test = jarg(a, off, NULL);
    jcall rest = { .npos = a->npos > off + 1 ? a->npos - off - 1 : 0, .pos = a->pos + off + 1,
                   .nkw = a->nkw, .kwname = a->kwname, .kwval = a->kwval };

    if (attr_mode && !attr)
        jerr(c, KVG_JINJA_ERROR, at, "selectattr needs an attribute");
    for (size_t i = 0; i < n; i++) {
        jv v = attr ? get_path(c, &items[i], attr) : items[i];
        int ok = test ? jinja_apply_test_by_name(c, at, test, &v, &rest) : jv_truthy(&v);
        if (ok == want)
            r.u.l->v[k++] = items[i];
    }
    r.u.l->n = k;
    r.flags = JF_GEN;
    return r;
}

FILTER(select) { return select_impl(c, at, x, a, 0, 1); }
FILTER(reject) { return select_impl(c, at, x, a, 0, 0); }
FILTER(selectattr) { return select_impl(c, at, x, a, 1, 1); }
FILTER(rejectattr) { return select_impl(c, at, x, a, 1, 0); }

FILTER(tojson) { return jinja_tojson(c, at, x, a); }

static const struct { const char *name; jfilter_fn fn; } FILTERS[] = {
    { "abs", f_abs }, { "batch", f_batch }, { "capitalize", f_capitalize },
    { "center", f_center }, { "count", f_length }, { "d", f_default },
    { "default", f_default }, { "dictsort", f_dictsort }, { "e", f_escape },
    { "escape", f_escape }, { "first", f_first }, { "float", f_float },
    { "forceescape", f_escape }, { "format", f_format }, { "indent", f_indent },
    { "int", f_int }, { "items", f_items }, { "join", f_join }, { "last", f_last },
    { "length", f_length }, { "list", f_list }, { "lower", f_lower }, { "map", f_map },
    { "max", f_max }, { "min", f_min }, { "reject", f_reject }, { "rejectattr", f_rejectattr },
    { "replace", f_replace }, { "reverse", f_reverse }, { "round", f_round },
    { "safe", f_safe }, { "select", f_select }, { "selectattr", f_selectattr },
    { "sort", f_sort }, { "string", f_string }, { "sum", f_sum }, { "title", f_title },
    { "tojson", f_tojson }, { "trim", f_trim }, { "truncate", f_truncate },
    { "unique", f_unique }, { "upper", f_upper }, { "wordcount", f_wordcount },
};

jfilter_fn jinja_find_filter(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if (strlen(FILTERS[i].name) == n && !memcmp(FILTERS[i].name, name, n))
            return FILTERS[i].fn;
    return NULL;
}

jv jinja_apply_filter_by_name(jctx *c, const jnode *at, const jv *name, const jv *x,
                              const jcall *rest)
{
    if (name->t != JT_STR)
        jerr(c, KVG_JINJA_ERROR, at, "a filter name must be a string");
    jfilter_fn f = jinja_find_filter(name->u.s.p, name->u.s.n);
    if (!f)
        jerr(c, KVG_JINJA_ERROR, at, "No filter named '%.*s'.", (int)(name->u.s.n > 40 ? 40 : name->u.s.n),
             name->u.s.p);
    jstep(c, at);
    return f(c, at, x, rest);
}

/* ---- tests ---- */

#define TEST(name) static int t_##name(UNUSED jctx *c, UNUSED const jnode *at, UNUSED const jv *x, \
                                   UNUSED const jcall *a)

TEST(defined) { (void)c; (void)at; (void)a; return x->t != JT_UNDEF; }
TEST(undefined) { (void)c; (void)at; (void)a; return x->t == JT_UNDEF; }
TEST(none) { (void)c; (void)at; (void)a; return x->t == JT_NONE; }
TEST(string) { (void)c; (void)at; (void)a; return x->t == JT_STR; }
TEST(number) { (void)c; (void)at; (void)a; return x->t == JT_INT || x->t == JT_FLOAT || x->t == JT_BOOL; }
TEST(integer) { (void)c; (void)at; (void)a; return x->t == JT_INT; }
TEST(float) { (void)c; (void)at; (void)a; return x->t == JT_FLOAT; }
TEST(boolean) { (void)c; (void)at; (void)a; return x->t == JT_BOOL; }
TEST(true) { (void)c; (void)at; (void)a; return x->t == JT_BOOL && x->u.i; }
TEST(false) { (void)c; (void)at; (void)a; return x->t == JT_BOOL && !x->u.i; }
TEST(mapping) { (void)c; (void)at; (void)a; return jv_is_dict(x); }
TEST(iterable)
{
    (void)c; (void)at; (void)a;
    return x->t == JT_STR || x->t == JT_LIST || x->t == JT_JLIST || jv_is_dict(x) ||
           x->t == JT_UNDEF;
}
TEST(sequence)
{
    (void)c; (void)at; (void)a;
    return x->t == JT_STR || jv_is_list(x) || jv_is_dict(x) || x->t == JT_UNDEF;
}
TEST(callable)
{
    (void)c; (void)at; (void)a;
    return x->t == JT_MACRO || x->t == JT_FUNC || x->t == JT_METHOD;
}
TEST(escaped) { (void)c; (void)at; (void)a; return x->t == JT_STR && (x->flags & JF_SAFE); }

static int64_t int_of(jctx *c, const jnode *at, const jv *x)
{
    if (x->t == JT_INT || x->t == JT_BOOL)
        return x->u.i;
    if (x->t == JT_FLOAT && x->u.f == floor(x->u.f) && fabs(x->u.f) < 9.2e18)
        return (int64_t)x->u.f;
    if (x->t == JT_UNDEF)
        jerr(c, KVG_JINJA_ERROR, at, "%s", jv_undef_msg(c, x));
    if (x->t == JT_FLOAT)
        return 1;       /* a fraction is neither even nor divisible: odd */
    jerr(c, KVG_JINJA_ERROR, at, "unsupported operand type(s) for %%: '%s' and 'int'",
         jv_type_name(x));
}

TEST(even) { (void)a; return x->t == JT_FLOAT && x->u.f != floor(x->u.f) ? 0 : int_of(c, at, x) % 2 == 0; }
TEST(odd) { (void)a; return x->t == JT_FLOAT && x->u.f != floor(x->u.f) ? 0 : int_of(c, at, x) % 2 != 0; }
TEST(divisibleby)
{
    const jv *n = jarg(a, 0, "num");
    if (!n)
        jerr(c, KVG_JINJA_ERROR, at, "divisibleby needs a number");
    int64_t d = int_of(c, at, n);
    if (!d)
        jerr(c, KVG_JINJA_ERROR, at, "integer division or modulo by zero");
    if (x->t == JT_FLOAT && x->u.f != floor(x->u.f))
        return 0;
    return d == -1 || int_of(c, at, x) % d == 0;
}

static const jv *other(jctx *c, const jnode *at, const jcall *a)
{
    const jv *o = jarg(a, 0, NULL);
    if (!o)
        jerr(c, KVG_JINJA_ERROR, at, "the test needs an argument");
    return o;
}

TEST(eq) { return jv_eq(c, x, other(c, at, a)); }
TEST(ne) { return !jv_eq(c, x, other(c, at, a)); }
TEST(lt) { return jv_cmp(c, at, x, other(c, at, a)) < 0; }
TEST(le) { return jv_cmp(c, at, x, other(c, at, a)) <= 0; }
TEST(gt) { return jv_cmp(c, at, x, other(c, at, a)) > 0; }
TEST(ge) { return jv_cmp(c, at, x, other(c, at, a)) >= 0; }
TEST(in)
{
    const jv *seq = other(c, at, a);
    if (seq->t == JT_STR) {
        if (x->t != JT_STR)
            jerr(c, KVG_JINJA_ERROR, at, "'in <string>' requires string as left operand");
        return x->u.s.n == 0 || memmem(seq->u.s.p, seq->u.s.n, x->u.s.p, x->u.s.n) != NULL;
    }
    if (jv_is_dict(seq)) {
        jv r;
        return jv_dict_get(c, seq, x, &r);
    }
    size_t n;
    jv *items = jv_items(c, at, seq, &n);
    for (size_t i = 0; i < n; i++)
        if (jv_eq(c, &items[i], x))
            return 1;
    return 0;
}
TEST(sameas)
{
    const jv *o = other(c, at, a);
    if (x->t != o->t)
        return 0;
    switch (x->t) {
    case JT_NONE: case JT_UNDEF: return x->t == JT_NONE;
    case JT_BOOL: return x->u.i == o->u.i;
    case JT_INT: return x->u.i == o->u.i && x->u.i >= -5 && x->u.i <= 256;
    case JT_JLIST: case JT_JDICT: return x->u.j == o->u.j;
    case JT_LIST: return x->u.l == o->u.l;
    case JT_DICT: case JT_NS: return x->u.d == o->u.d;
    default: return 0;
    }
}
TEST(lower)
{
    jv s = jv_to_str(c, at, x);
    (void)a;
    return str_all(&s, 'l');
}
TEST(upper)
{
    jv s = jv_to_str(c, at, x);
    (void)a;
    return str_all(&s, 'u');
}
TEST(filter)
{
    (void)c; (void)at; (void)a;
    return x->t == JT_STR && jinja_find_filter(x->u.s.p, x->u.s.n) != NULL;
}
TEST(test)
{
    (void)c; (void)at; (void)a;
    return x->t == JT_STR && jinja_find_test(x->u.s.p, x->u.s.n) != NULL;
}

static const struct { const char *name; jtest_fn fn; } TESTS[] = {
    { "boolean", t_boolean }, { "callable", t_callable }, { "defined", t_defined },
    { "divisibleby", t_divisibleby }, { "eq", t_eq }, { "equalto", t_eq }, { "==", t_eq },
    { "escaped", t_escaped }, { "even", t_even }, { "false", t_false }, { "filter", t_filter },
    { "float", t_float }, { "ge", t_ge }, { ">=", t_ge }, { "gt", t_gt },
    { "greaterthan", t_gt }, { ">", t_gt }, { "in", t_in }, { "integer", t_integer },
    { "iterable", t_iterable }, { "le", t_le }, { "<=", t_le }, { "lower", t_lower },
    { "lt", t_lt }, { "lessthan", t_lt }, { "<", t_lt }, { "mapping", t_mapping },
    { "ne", t_ne }, { "!=", t_ne }, { "none", t_none }, { "number", t_number }, { "odd", t_odd },
    { "sameas", t_sameas }, { "sequence", t_sequence }, { "string", t_string },
    { "test", t_test }, { "true", t_true }, { "undefined", t_undefined }, { "upper", t_upper },
};

jtest_fn jinja_find_test(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof TESTS / sizeof TESTS[0]; i++)
        if (strlen(TESTS[i].name) == n && !memcmp(TESTS[i].name, name, n))
            return TESTS[i].fn;
    return NULL;
}

int jinja_apply_test_by_name(jctx *c, const jnode *at, const jv *name, const jv *x,
                             const jcall *rest)
{
    if (name->t != JT_STR)
        jerr(c, KVG_JINJA_ERROR, at, "a test name must be a string");
    jtest_fn t = jinja_find_test(name->u.s.p, name->u.s.n);
    if (!t)
        jerr(c, KVG_JINJA_ERROR, at, "No test named '%.*s'.", (int)(name->u.s.n > 40 ? 40 : name->u.s.n),
             name->u.s.p);
    return t(c, at, x, rest);
}
