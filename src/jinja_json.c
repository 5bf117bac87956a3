/* The tojson filter of transformers' chat templates:
 *   json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
 * byte for byte: Python's separators (", " and ": ", or "," and ": " with an
 * indent), its float repr, NaN/Infinity, non-string keys turned into strings.
 * The escaped text of a data string stays data; quotes and punctuation are not. */
#include "jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "utf8.h"

typedef struct jopts {
    int ascii, sort;
    jv item_sep, key_sep;
    jv indent;                  /* JT_NONE: no newlines */
} jopts;

static void put_json_str(jctx *c, jsb *b, const jv *s, int ascii)
{
    const unsigned char *p = (const unsigned char *)s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    char esc[16];

    jsb_putc(c, b, '"');
    while (i < n) {
        int data = s->taint == JS_DATA || (s->taint == JS_MASK && s->u.s.mask[i]);
        unsigned char ch = p[i];
        size_t run = i;

        /* copy a run of plain bytes at once */
        while (run < n && p[run] >= 0x20 && p[run] != '"' && p[run] != '\\' &&
               !(ascii && p[run] >= 0x7f) &&
               (s->taint != JS_MASK || !s->u.s.mask[run] == !data))
            run++;
        if (run > i) {
            jsb_put_sub(c, b, s, i, run - i);
            i = run;
            continue;
        }
        switch (ch) {
        case '"': jsb_put(c, b, "\\\"", 2, data); i++; continue;
        case '\\': jsb_put(c, b, "\\\\", 2, data); i++; continue;
        case '\n': jsb_put(c, b, "\\n", 2, data); i++; continue;
        case '\r': jsb_put(c, b, "\\r", 2, data); i++; continue;
        case '\t': jsb_put(c, b, "\\t", 2, data); i++; continue;
        case '\b': jsb_put(c, b, "\\b", 2, data); i++; continue;
        case '\f': jsb_put(c, b, "\\f", 2, data); i++; continue;
        default: break;
        }
        if (ch < 0x20 || ch == 0x7f) {
            snprintf(esc, sizeof esc, "\\u%04x", ch);
            jsb_put(c, b, esc, 6, data);
            i++;
            continue;
        }
        /* ensure_ascii: a non-ASCII code point as \uXXXX (a surrogate pair above the BMP) */
        uint32_t cp;
        int len = kvg_utf8_decode(p + i, n - i, &cp);
        if (len <= 0) {
            cp = ch;
            len = 1;
        }
        if (cp >= 0x10000) {
            uint32_t v = cp - 0x10000;
            snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            jsb_put(c, b, esc, 12, data);
        } else {
            snprintf(esc, sizeof esc, "\\u%04x", cp);
            jsb_put(c, b, esc, 6, data);
        }
        i += (size_t)len;
    }
    jsb_putc(c, b, '"');
}

static void newline_indent(jctx *c, jsb *b, const jopts *o, unsigned level)
{
    jsb_putc(c, b, '\n');
    for (unsigned i = 0; i < level; i++)
        jsb_put_str(c, b, &o->indent);
}

/* a dict key as json.dumps turns it into a string */
static jv key_str(jctx *c, const jnode *at, const jv *k)
{
    char buf[40];

    switch (k->t) {
    case JT_STR: return *k;
    case JT_BOOL: return jv_lit(k->u.i ? "true" : "false");
    case JT_NONE: return jv_lit("null");
    case JT_INT: {
        int n = snprintf(buf, sizeof buf, "%lld", (long long)k->u.i);
        char *s = jalloc(c, (size_t)n + 1);
        memcpy(s, buf, (size_t)n + 1);
        return jv_strn(s, (size_t)n, JS_CLEAN);
    }
    case JT_FLOAT: {
        jfmt_float(k->u.f, buf, sizeof buf);
        if (isnan(k->u.f)) strcpy(buf, "NaN");
        else if (isinf(k->u.f)) strcpy(buf, k->u.f > 0 ? "Infinity" : "-Infinity");
        size_t n = strlen(buf);
        char *s = jalloc(c, n + 1);
        memcpy(s, buf, n + 1);
        return jv_strn(s, n, JS_CLEAN);
    }
    default:
        jerr(c, KVG_JINJA_ERROR, at, "keys must be str, int, float, bool or None, not %s",
             jv_type_name(k));
    }
}

static void dump(jctx *c, const jnode *at, jsb *b, const jv *v, const jopts *o, unsigned level)
{
    char buf[40];

    switch (v->t) {
    case JT_NONE: jsb_put(c, b, "null", 4, 0); return;
    case JT_BOOL:
        if (v->u.i)
            jsb_put(c, b, "true", 4, 0);
        else
            jsb_put(c, b, "false", 5, 0);
        return;
    case JT_INT:
        jsb_put(c, b, buf, (size_t)snprintf(buf, sizeof buf, "%lld", (long long)v->u.i), 0);
        return;
    case JT_FLOAT:
        if (isnan(v->u.f))
            jsb_put(c, b, "NaN", 3, 0);
        else if (isinf(v->u.f))
            jsb_put(c, b, v->u.f > 0 ? "Infinity" : "-Infinity", v->u.f > 0 ? 8 : 9, 0);
        else {
            jfmt_float(v->u.f, buf, sizeof buf);
            jsb_put(c, b, buf, strlen(buf), 0);
        }
        return;
    case JT_STR:
        put_json_str(c, b, v, o->ascii);
        return;
    default:
        break;
    }
    jstack_check(c, at);
    if (++c->depth > c->max_depth)
        jerr(c, KVG_JINJA_LIMIT, at, "nesting depth limit (%u) reached", c->max_depth);
    if (jv_is_list(v)) {
        size_t n = jv_len(c, at, v);
        jsb_putc(c, b, '[');
        for (size_t i = 0; i < n; i++) {
            jv x = jv_list_at(c, v, i);
            if (i)
                jsb_put_str(c, b, &o->item_sep);
            if (o->indent.t != JT_NONE)
                newline_indent(c, b, o, level + 1);
            dump(c, at, b, &x, o, level + 1);
        }
        if (n && o->indent.t != JT_NONE)
            newline_indent(c, b, o, level);
        jsb_putc(c, b, ']');
    } else if (jv_is_dict(v)) {
        jv *ks, *vs;
        size_t n;
        jv_dict_keys_vals(c, v, &ks, &vs, &n);
        jv *keys = jalloc(c, (n + 1) * sizeof(jv));
        size_t *order = jalloc(c, (n + 1) * sizeof(size_t));
        for (size_t i = 0; i < n; i++) {
            keys[i] = key_str(c, at, &ks[i]);
            order[i] = i;
        }
        if (o->sort) {
            /* insertion sort: stable, and dicts in templates are small */
            for (size_t i = 1; i < n; i++) {
                size_t k = order[i], j = i;
                while (j > 0 && jv_cmp(c, at, &ks[order[j - 1]], &ks[k]) > 0) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = k;
            }
        }
        jsb_putc(c, b, '{');
        for (size_t i = 0; i < n; i++) {
            size_t k = order[i];
            if (i)
                jsb_put_str(c, b, &o->item_sep);
            if (o->indent.t != JT_NONE)
                newline_indent(c, b, o, level + 1);
            put_json_str(c, b, &keys[k], o->ascii);
            jsb_put_str(c, b, &o->key_sep);
            dump(c, at, b, &vs[k], o, level + 1);
        }
        if (n && o->indent.t != JT_NONE)
            newline_indent(c, b, o, level);
        jsb_putc(c, b, '}');
    } else {
        jerr(c, KVG_JINJA_ERROR, at, "Object of type %s is not JSON serializable",
             jv_type_name(v));
    }
    c->depth--;
}

jv jinja_tojson(jctx *c, const jnode *at, const jv *x, const jcall *a)
{
    const jv *ascii = jarg(a, 0, "ensure_ascii");
    const jv *indent = jarg(a, 1, "indent");
    const jv *seps = jarg(a, 2, "separators");
    const jv *sort = jarg(a, 3, "sort_keys");
    jopts o = { .ascii = ascii ? jv_truthy(ascii) : 0, .sort = sort ? jv_truthy(sort) : 0 };
    jsb b;

    o.indent = jv_none();
    if (indent && indent->t != JT_NONE) {
        if (indent->t == JT_STR) {
            o.indent = *indent;
        } else if (indent->t == JT_INT || indent->t == JT_BOOL) {
            int64_t n = indent->u.i < 0 ? 0 : indent->u.i;
            if (n > 4096)
                jerr(c, KVG_JINJA_LIMIT, at, "tojson indent too large");
            char *sp = jalloc(c, (size_t)n + 1);
            memset(sp, ' ', (size_t)n);
            o.indent = jv_strn(sp, (size_t)n, JS_CLEAN);
        } else {
            jerr(c, KVG_JINJA_ERROR, at, "tojson indent must be an integer or a string");
        }
    }
    o.item_sep = jv_lit(o.indent.t == JT_NONE ? ", " : ",");
    o.key_sep = jv_lit(": ");
    if (seps && seps->t != JT_NONE) {
        if (!jv_is_list(seps) || jv_len(c, at, seps) != 2)
            jerr(c, KVG_JINJA_ERROR, at, "tojson separators must be a pair of strings");
        o.item_sep = jv_list_at(c, seps, 0);
        o.key_sep = jv_list_at(c, seps, 1);
        if (o.item_sep.t != JT_STR || o.key_sep.t != JT_STR)
            jerr(c, KVG_JINJA_ERROR, at, "tojson separators must be a pair of strings");
    }
    jsb_init(c, &b, 64);
    dump(c, at, &b, x, &o, 0);
    return jsb_str(&b);
}
