/* Jinja values: the arena they live in, strings that carry which of their bytes
 * came from data, lazy views of jansson containers, and Python's str()/repr(),
 * equality and ordering, which a chat template's output depends on byte for byte. */
#include "jinja_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "utf8.h"

/* ---- arena ---- */

void *ja_alloc(jarena *a, size_t n)
{
    ja_chunk *h = a->head;

    n = (n + 15) & ~(size_t)15;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > 16384 ? n : (a->total < 65536 ? 16384 : 65536);

        if (a->limit && a->total + cap > a->limit)
            return NULL;
        h = malloc(sizeof *h + cap);
        if (!h)
            return NULL;
        h->cap = cap;
        h->used = 0;
        /* A big block gets its own chunk behind the current one, so the current
         * one's free space stays usable. */
        if (a->head && n > 16384) {
            h->next = a->head->next;
            a->head->next = h;
        } else {
            h->next = a->head;
            a->head = h;
        }
        a->total += cap;
    }
    void *p = (char *)h->data + h->used;
    h->used += n;
    return p;
}

void ja_free(jarena *a)
{
    ja_chunk *h = a->head;

    while (h) {
        ja_chunk *next = h->next;
        free(h);
        h = next;
    }
    a->head = NULL;
    a->total = 0;
}

void *jalloc(jctx *c, size_t n)
{
    void *p = ja_alloc(&c->arena, n ? n : 1);

    if (!p) {
        if (c->arena.limit && c->arena.total + n > c->arena.limit)
            jerr(c, KVG_JINJA_LIMIT, NULL,
                 "render memory limit reached (the output limit times 8)");
        jerr(c, KVG_JINJA_NOMEM, NULL, "out of memory");
    }
    return p;
}

/* ---- constructors ---- */

jv jv_undef(const char *msg)
{
    jv v = { .t = JT_UNDEF };
    v.u.undef.msg = msg;
    return v;
}

const char *jv_undef_msg(jctx *c, const jv *v)
{
    static const char *const TYPES[] = {
        [JT_NONE] = "NoneType", [JT_BOOL] = "bool", [JT_INT] = "int", [JT_FLOAT] = "float",
        [JT_STR] = "str", [JT_LIST] = "list", [JT_DICT] = "dict", [JT_JLIST] = "list",
        [JT_JDICT] = "dict", [JT_NS] = "Namespace", [JT_LOOP] = "LoopContext",
        [JT_MACRO] = "Macro", [JT_FUNC] = "function", [JT_METHOD] = "method",
    };

    if (v->u.undef.msg)
        return v->u.undef.msg;
    if (!v->u.undef.name)
        return "undefined value";
    /* made only now: most undefined attributes are only tested, never used */
    size_t len = strlen(v->u.undef.name) + 64;
    char *msg = jalloc(c, len);
    if (v->aux == JT_NONE)
        snprintf(msg, len, "'None' has no attribute '%s'", v->u.undef.name);
    else
        snprintf(msg, len, "'%s object' has no attribute '%s'",
                 v->aux < sizeof TYPES / sizeof TYPES[0] && TYPES[v->aux] ? TYPES[v->aux]
                                                                        : "object",
                 v->u.undef.name);
    return msg;
}

jv jv_lit(const char *s)
{
    return jv_strn(s, strlen(s), JS_CLEAN);
}

jv jv_substr(const jv *s, size_t off, size_t n)
{
    jv v = *s;

    v.u.s.p = s->u.s.p + off;
    v.u.s.n = n;
    if (s->taint == JS_MASK) {
        size_t ones = 0;

        v.u.s.mask = s->u.s.mask + off;
        for (size_t i = 0; i < n; i++)
            ones += v.u.s.mask[i] != 0;
        /* a slice may be all clean or all data: say so, cheaper to copy */
        if (ones == n)
            v.taint = n ? JS_DATA : JS_CLEAN;
        else if (!ones)
            v.taint = JS_CLEAN;
        v.aux = (uint32_t)ones;
    }
    if (!n)
        v.taint = JS_CLEAN;
    return v;
}

jv jv_from_json(json_t *j, int data)
{
    jv v = { .t = JT_NONE };

    switch (json_typeof(j)) {
    case JSON_STRING:
        return jv_strn(json_string_value(j), json_string_length(j), data ? JS_DATA : JS_CLEAN);
    case JSON_INTEGER:
        return jv_int(json_integer_value(j));
    case JSON_REAL:
        return jv_float(json_real_value(j));
    case JSON_TRUE:
        return jv_bool(1);
    case JSON_FALSE:
        return jv_bool(0);
    case JSON_ARRAY:
        v.t = JT_JLIST;
        v.u.j = j;
        v.flags = data ? JF_DATA : 0;
        return v;
    case JSON_OBJECT:
        v.t = JT_JDICT;
        v.u.j = j;
        v.flags = data ? JF_DATA : 0;
        return v;
    default:
        return v;
    }
}

jv jv_list_new(jctx *c, size_t n)
{
    jv v = { .t = JT_LIST };
    jlist *l = jalloc(c, sizeof *l);

    l->n = n;
    l->v = jalloc(c, (n ? n : 1) * sizeof(jv));
    memset(l->v, 0, (n ? n : 1) * sizeof(jv));
    v.u.l = l;
    return v;
}

jv jv_dict_new(jctx *c, size_t cap)
{
    jv v = { .t = JT_DICT };
    jdict *d = jalloc(c, sizeof *d);

    d->n = 0;
    d->cap = cap ? cap : 4;
    d->k = jalloc(c, d->cap * sizeof(jv));
    d->v = jalloc(c, d->cap * sizeof(jv));
    v.u.d = d;
    return v;
}

void jv_dict_set(jctx *c, jdict *d, const jv *k, const jv *v)
{
    for (size_t i = 0; i < d->n; i++) {
        if (jv_eq(c, &d->k[i], k)) {
            d->v[i] = *v;
            return;
        }
    }
    if (d->n == d->cap) {
        size_t cap = d->cap * 2;
        jv *nk = jalloc(c, cap * sizeof(jv)), *nv = jalloc(c, cap * sizeof(jv));

        memcpy(nk, d->k, d->n * sizeof(jv));
        memcpy(nv, d->v, d->n * sizeof(jv));
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = *k;
    d->v[d->n] = *v;
    d->n++;
}

int jv_dict_get_str(jctx *c, const jv *d, const char *k, size_t kn, jv *out)
{
    (void)c;
    if (d->t == JT_JDICT) {
        json_t *j = json_object_getn(d->u.j, k, kn);

        if (!j)
            return 0;
        *out = jv_from_json(j, d->flags & JF_DATA);
        return 1;
    }
    if (d->t == JT_DICT || d->t == JT_NS) {
        /* string keys compare as bytes: no need for jv_eq */
        const jdict *m = d->u.d;
        for (size_t i = 0; i < m->n; i++) {
            if (m->k[i].t == JT_STR && m->k[i].u.s.n == kn && !memcmp(m->k[i].u.s.p, k, kn)) {
                *out = m->v[i];
                return 1;
            }
        }
    }
    return 0;
}

int jv_dict_get(jctx *c, const jv *d, const jv *k, jv *out)
{
    if (k->t == JT_STR)
        return jv_dict_get_str(c, d, k->u.s.p, k->u.s.n, out);
    if (d->t == JT_JDICT)
        return 0;
    if (d->t != JT_DICT && d->t != JT_NS)
        return 0;
    for (size_t i = 0; i < d->u.d->n; i++) {
        if (jv_eq(c, &d->u.d->k[i], k)) {
            *out = d->u.d->v[i];
            return 1;
        }
    }
    return 0;
}

void jv_dict_keys_vals(jctx *c, const jv *d, jv **keys, jv **vals, size_t *n)
{
    if (d->t == JT_JDICT) {
        size_t cnt = json_object_size(d->u.j), i = 0;
        const char *k;
        size_t klen;
        json_t *val;
        int data = d->flags & JF_DATA;

        *keys = jalloc(c, (cnt ? cnt : 1) * sizeof(jv));
        if (vals)
            *vals = jalloc(c, (cnt ? cnt : 1) * sizeof(jv));
        json_object_keylen_foreach(d->u.j, k, klen, val) {
            if (i == cnt)
                break;
            (*keys)[i] = jv_strn(k, klen, data ? JS_DATA : JS_CLEAN);
            if (vals)
                (*vals)[i] = jv_from_json(val, data);
            i++;
        }
        *n = i;
        return;
    }
    *keys = d->u.d->k;
    if (vals)
        *vals = d->u.d->v;
    *n = d->u.d->n;
}

/* ---- kinds ---- */

int jv_is_str(const jv *v) { return v->t == JT_STR; }

int jv_is_list(const jv *v)
{
    return (v->t == JT_LIST && !(v->flags & JF_GEN)) || v->t == JT_JLIST;
}

int jv_is_dict(const jv *v)
{
    return v->t == JT_DICT || v->t == JT_JDICT;
}

const char *jv_type_name(const jv *v)
{
    switch (v->t) {
    case JT_UNDEF: return "Undefined";
    case JT_NONE: return "NoneType";
    case JT_BOOL: return "bool";
    case JT_INT: return "int";
    case JT_FLOAT: return "float";
    case JT_STR: return "str";
    case JT_LIST: return v->flags & JF_GEN ? "generator" : v->flags & JF_TUPLE ? "tuple" : "list";
    case JT_JLIST: return "list";
    case JT_DICT: case JT_JDICT: return "dict";
    case JT_NS: return "Namespace";
    case JT_LOOP: return "LoopContext";
    case JT_MACRO: return "Macro";
    default: return "function";
    }
}

size_t jv_ncp(const jv *s)
{
    size_t n = 0;

    for (size_t i = 0; i < s->u.s.n; i++)
        n += ((unsigned char)s->u.s.p[i] & 0xC0) != 0x80;
    return n;
}

size_t jv_cp_off(const jv *s, size_t cp)
{
    size_t i = 0;

    while (i < s->u.s.n && cp) {
        i++;
        while (i < s->u.s.n && ((unsigned char)s->u.s.p[i] & 0xC0) == 0x80)
            i++;
        cp--;
    }
    return i;
}

size_t jv_len(jctx *c, const jnode *at, const jv *v)
{
    switch (v->t) {
    case JT_STR: return jv_ncp(v);
    case JT_LIST:
        if (v->flags & JF_GEN)
            break;
        return v->u.l->n;
    case JT_JLIST: return json_array_size(v->u.j);
    case JT_JDICT: return json_object_size(v->u.j);
    case JT_DICT: return v->u.d->n;
    case JT_UNDEF: return 0;
    default: break;
    }
    jerr(c, KVG_JINJA_ERROR, at, "object of type '%s' has no len()", jv_type_name(v));
}

jv jv_list_at(jctx *c, const jv *l, size_t i)
{
    (void)c;
    if (l->t == JT_JLIST)
        return jv_from_json(json_array_get(l->u.j, i), l->flags & JF_DATA);
    return l->u.l->v[i];
}

jv *jv_items(jctx *c, const jnode *at, const jv *v, size_t *n)
{
    jv *out;

    switch (v->t) {
    case JT_LIST:
        *n = v->u.l->n;
        return v->u.l->v;
    case JT_JLIST:
        *n = json_array_size(v->u.j);
        out = jalloc(c, (*n ? *n : 1) * sizeof(jv));
        for (size_t i = 0; i < *n; i++)
            out[i] = jv_from_json(json_array_get(v->u.j, i), v->flags & JF_DATA);
        return out;
    case JT_DICT:
    case JT_JDICT:
        jv_dict_keys_vals(c, v, &out, NULL, n);
        return out;
    case JT_STR: {
        size_t k = 0, i = 0;

        out = jalloc(c, (v->u.s.n ? v->u.s.n : 1) * sizeof(jv));
        while (i < v->u.s.n) {
            size_t j = i + 1;

            while (j < v->u.s.n && ((unsigned char)v->u.s.p[j] & 0xC0) == 0x80)
                j++;
            out[k++] = jv_substr(v, i, j - i);
            i = j;
        }
        *n = k;
        return out;
    }
    case JT_UNDEF:
        *n = 0;
        return jalloc(c, sizeof(jv));   /* empty, but never NULL (memcpy of 0 items) */
    default:
        jerr(c, KVG_JINJA_ERROR, at, "'%s' object is not iterable", jv_type_name(v));
    }
}

int jv_truthy(const jv *v)
{
    switch (v->t) {
    case JT_UNDEF: case JT_NONE: return 0;
    case JT_BOOL: case JT_INT: return v->u.i != 0;
    case JT_FLOAT: return v->u.f != 0.0;
    case JT_STR: return v->u.s.n != 0;
    case JT_LIST: return (v->flags & JF_GEN) || v->u.l->n != 0;
    case JT_JLIST: return json_array_size(v->u.j) != 0;
    case JT_JDICT: return json_object_size(v->u.j) != 0;
    case JT_DICT: return v->u.d->n != 0;
    default: return 1;
    }
}

/* ---- equality and order (Python's) ---- */

static int is_num(const jv *v) { return v->t == JT_BOOL || v->t == JT_INT || v->t == JT_FLOAT; }

static void deeper(jctx *c)
{
    jstack_check(c, NULL);
    if (++c->depth > c->max_depth)
        jerr(c, KVG_JINJA_LIMIT, NULL, "nesting depth limit (%u) reached", c->max_depth);
}

int jv_eq(jctx *c, const jv *a, const jv *b)
{
    int r;

    if (is_num(a) && is_num(b)) {
        if (a->t == JT_FLOAT || b->t == JT_FLOAT) {
            double x = a->t == JT_FLOAT ? a->u.f : (double)a->u.i;
            double y = b->t == JT_FLOAT ? b->u.f : (double)b->u.i;
            return x == y;
        }
        return a->u.i == b->u.i;
    }
    if (a->t == JT_STR && b->t == JT_STR)
        return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    if (jv_is_list(a) && jv_is_list(b)) {
        /* a tuple never equals a list in Python */
        if ((a->flags & JF_TUPLE) != (b->flags & JF_TUPLE))
            return 0;
        size_t n = jv_len(c, NULL, a);
        if (n != jv_len(c, NULL, b))
            return 0;
        jsteps(c, NULL, n);
        deeper(c);
        r = 1;
        for (size_t i = 0; i < n && r; i++) {
            jv x = jv_list_at(c, a, i), y = jv_list_at(c, b, i);
            r = jv_eq(c, &x, &y);
        }
        c->depth--;
        return r;
    }
    if (jv_is_dict(a) && jv_is_dict(b)) {
        jv *ks, *vs;
        size_t n;

        if (jv_len(c, NULL, a) != jv_len(c, NULL, b))
            return 0;
        jsteps(c, NULL, jv_len(c, NULL, a));
        deeper(c);
        jv_dict_keys_vals(c, a, &ks, &vs, &n);
        r = 1;
        for (size_t i = 0; i < n && r; i++) {
            jv y;
            r = jv_dict_get(c, b, &ks[i], &y) && jv_eq(c, &vs[i], &y);
        }
        c->depth--;
        return r;
    }
    if (a->t != b->t)
        return 0;
    switch (a->t) {
    case JT_UNDEF: case JT_NONE: return 1;
    case JT_NS: return a->u.d == b->u.d;
    case JT_MACRO: return a->u.m == b->u.m;
    case JT_LOOP: return a->u.loop == b->u.loop;
    case JT_FUNC: return a->aux == b->aux;
    case JT_LIST: return a->u.l == b->u.l;
    default: return 0;
    }
}

int jv_cmp(jctx *c, const jnode *at, const jv *a, const jv *b)
{
    if (is_num(a) && is_num(b)) {
        if (a->t == JT_FLOAT || b->t == JT_FLOAT) {
            double x = a->t == JT_FLOAT ? a->u.f : (double)a->u.i;
            double y = b->t == JT_FLOAT ? b->u.f : (double)b->u.i;
            return x < y ? -1 : x > y ? 1 : 0;
        }
        return a->u.i < b->u.i ? -1 : a->u.i > b->u.i ? 1 : 0;
    }
    if (a->t == JT_STR && b->t == JT_STR) {
        /* UTF-8 byte order is code point order */
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int r = memcmp(a->u.s.p, b->u.s.p, n);
        if (r)
            return r < 0 ? -1 : 1;
        return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n ? 1 : 0;
    }
    if (jv_is_list(a) && jv_is_list(b) && (a->flags & JF_TUPLE) == (b->flags & JF_TUPLE)) {
        size_t na = jv_len(c, at, a), nb = jv_len(c, at, b);
        int r = 0;

        jsteps(c, at, na < nb ? na : nb);
        deeper(c);
        for (size_t i = 0; i < na && i < nb && !r; i++) {
            jv x = jv_list_at(c, a, i), y = jv_list_at(c, b, i);
            if (!jv_eq(c, &x, &y))
                r = jv_cmp(c, at, &x, &y);
        }
        c->depth--;
        if (r)
            return r;
        return na < nb ? -1 : na > nb ? 1 : 0;
    }
    jerr(c, KVG_JINJA_ERROR, at, "'<' not supported between instances of '%s' and '%s'",
         jv_type_name(a), jv_type_name(b));
}

/* ---- string builder ---- */

void jsb_init(jctx *c, jsb *b, size_t cap)
{
    b->cap = cap < 32 ? 32 : cap;
    b->p = jalloc(c, b->cap);
    b->m = NULL;
    b->n = 0;
    b->ndata = 0;
}

static void jsb_grow(jctx *c, jsb *b, size_t more)
{
    size_t need = b->n + more, cap = b->cap;

    if (need > c->max_output)
        jerr(c, KVG_JINJA_LIMIT, NULL, "output limit (%zu bytes) reached", c->max_output);
    if (need <= cap)
        return;
    while (cap < need)
        cap *= 2;
    char *p = jalloc(c, cap);
    memcpy(p, b->p, b->n);
    b->p = p;
    if (b->m) {
        uint8_t *m = jalloc(c, cap);
        memcpy(m, b->m, b->n);
        b->m = m;
    }
    b->cap = cap;
}

/* marks b's bytes [off, off+n): from src (ones: how many are set, or SIZE_MAX to
 * count them), else all data or all clean */
static void jsb_mark(jctx *c, jsb *b, size_t off, size_t n, const uint8_t *src, int all,
                     size_t ones)
{
    if (!b->m) {
        if (!all && !src)
            return;
        b->m = jalloc(c, b->cap);
        memset(b->m, 0, off);
    }
    if (src) {
        memcpy(b->m + off, src, n);
        if (ones == SIZE_MAX) {
            ones = 0;
            for (size_t i = 0; i < n; i++)
                ones += src[i] != 0;
        }
        b->ndata += ones;
    } else {
        memset(b->m + off, all ? 1 : 0, n);
        b->ndata += all ? n : 0;
    }
}

void jsb_put(jctx *c, jsb *b, const char *p, size_t n, int data)
{
    jsb_grow(c, b, n);
    memcpy(b->p + b->n, p, n);
    jsb_mark(c, b, b->n, n, NULL, data, 0);
    b->n += n;
}

void jsb_putc(jctx *c, jsb *b, char ch)
{
    jsb_put(c, b, &ch, 1, 0);
}

void jsb_put_sub(jctx *c, jsb *b, const jv *s, size_t off, size_t n)
{
    jsb_grow(c, b, n);
    memcpy(b->p + b->n, s->u.s.p + off, n);
    if (s->taint == JS_MASK)
        jsb_mark(c, b, b->n, n, s->u.s.mask + off, 0,
                 off == 0 && n == s->u.s.n ? s->aux : SIZE_MAX);
    else
        jsb_mark(c, b, b->n, n, NULL, s->taint == JS_DATA, 0);
    b->n += n;
}

void jsb_put_str(jctx *c, jsb *b, const jv *s)
{
    jsb_put_sub(c, b, s, 0, s->u.s.n);
}

void jsb_put_fmt(jctx *c, jsb *b, const char *fmt, ...)
{
    char buf[128];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0)
        jsb_put(c, b, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1, 0);
}

jv jsb_str(jsb *b)
{
    jv v = jv_strn(b->p, b->n, JS_CLEAN);

    if (b->m && b->n) {
        if (b->ndata == b->n) {
            v.taint = JS_DATA;
        } else if (b->ndata) {
            v.taint = JS_MASK;
            v.u.s.mask = b->m;
            v.aux = (uint32_t)b->ndata;     /* strings stay below 4 GiB: max_output */
        }
    }
    return v;
}

/* ---- Python str() and repr() ---- */

void jfmt_float(double f, char *buf, size_t n)
{
    char tmp[40], digits[24];
    int prec, exp10, nd = 0, decpt;
    size_t o = 0;

    if (isnan(f)) {
        snprintf(buf, n, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, n, f < 0 ? "-inf" : "inf");
        return;
    }
    /* the shortest digits that read back as f (Python's repr) */
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    const char *s = tmp;
    if (*s == '-') {
        if (o + 1 < n)
            buf[o++] = '-';
        s++;
    }
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9')
            digits[nd++] = *s;
    exp10 = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    decpt = exp10 + 1;
    char *w = buf + o;
    size_t left = n - o;
    if (decpt > 16 || decpt < -3) {
        if (nd == 1)
            snprintf(w, left, "%ce%c%02d", digits[0], exp10 < 0 ? '-' : '+', abs(exp10));
        else
            snprintf(w, left, "%c.%se%c%02d", digits[0], digits + 1, exp10 < 0 ? '-' : '+',
                     abs(exp10));
    } else if (decpt <= 0) {
        snprintf(w, left, "0.%.*s%s", -decpt, "0000", digits);
    } else if (decpt >= nd) {
        snprintf(w, left, "%s%.*s.0", digits, decpt - nd, "0000000000000000");
    } else {
        snprintf(w, left, "%.*s.%s", decpt, digits, digits + decpt);
    }
}

static void put_repr_str(jctx *c, jsb *b, const jv *s)
{
    const unsigned char *p = (const unsigned char *)s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    int sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';

    jsb_putc(c, b, q);
    while (i < n) {
        uint32_t cp;
        int len = kvg_utf8_decode(p + i, n - i, &cp);
        int data = s->taint == JS_DATA || (s->taint == JS_MASK && s->u.s.mask[i]);
        char esc[16];

        if (len <= 0) {
            cp = p[i];
            len = 1;
        }
        if (cp == (uint32_t)q || cp == '\\') {
            esc[0] = '\\';
            esc[1] = (char)cp;
            jsb_put(c, b, esc, 2, data);
        } else if (cp == '\n') {
            jsb_put(c, b, "\\n", 2, data);
        } else if (cp == '\r') {
            jsb_put(c, b, "\\r", 2, data);
        } else if (cp == '\t') {
            jsb_put(c, b, "\\t", 2, data);
        } else if (cp < 0x20 || cp == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", cp);
            jsb_put(c, b, esc, 4, data);
        } else if (cp >= 0x80) {
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
            int printable = !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                              cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                              cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                              cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
            if (printable)
                jsb_put(c, b, (const char *)p + i, (size_t)len, data);
            else if (cp < 0x100)
                jsb_put(c, b, esc, (size_t)snprintf(esc, sizeof esc, "\\x%02x", cp), data);
            else if (cp < 0x10000)
                jsb_put(c, b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x", cp), data);
            else
                jsb_put(c, b, esc, (size_t)snprintf(esc, sizeof esc, "\\U%08x", cp), data);
        } else {
            jsb_put(c, b, (const char *)p + i, 1, data);
        }
        i += (size_t)len;
    }
    jsb_putc(c, b, q);
}

static void put_seq(jctx *c, const jnode *at, jsb *b, const jv *v)
{
    size_t n = jv_len(c, at, v);
    int tuple = v->flags & JF_TUPLE;

    deeper(c);
    jsb_putc(c, b, tuple ? '(' : '[');
    for (size_t i = 0; i < n; i++) {
        jv x = jv_list_at(c, v, i);
        if (i)
            jsb_put(c, b, ", ", 2, 0);
        jv_repr_into(c, at, b, &x);
    }
    if (tuple && n == 1)
        jsb_putc(c, b, ',');
    jsb_putc(c, b, tuple ? ')' : ']');
    c->depth--;
}

static void put_dict(jctx *c, const jnode *at, jsb *b, const jv *v)
{
    jv *ks, *vs;
    size_t n;

    deeper(c);
    jv_dict_keys_vals(c, v, &ks, &vs, &n);
    jsb_putc(c, b, '{');
    for (size_t i = 0; i < n; i++) {
        if (i)
            jsb_put(c, b, ", ", 2, 0);
        jv_repr_into(c, at, b, &ks[i]);
        jsb_put(c, b, ": ", 2, 0);
        jv_repr_into(c, at, b, &vs[i]);
    }
    jsb_putc(c, b, '}');
    c->depth--;
}

void jv_repr_into(jctx *c, const jnode *at, jsb *b, const jv *v)
{
    if (v->t == JT_STR)
        put_repr_str(c, b, v);
    else if (v->t == JT_UNDEF)
        jsb_put(c, b, "Undefined", 9, 0);       /* Jinja2's Undefined.__repr__ */
    else
        jv_str_into(c, at, b, v);
}

void jv_str_into(jctx *c, const jnode *at, jsb *b, const jv *v)
{
    char buf[40];

    switch (v->t) {
    case JT_UNDEF:
        return;
    case JT_NONE:
        jsb_put(c, b, "None", 4, 0);
        return;
    case JT_BOOL:
        if (v->u.i)
            jsb_put(c, b, "True", 4, 0);
        else
            jsb_put(c, b, "False", 5, 0);
        return;
    case JT_INT:
        jsb_put(c, b, buf, (size_t)snprintf(buf, sizeof buf, "%lld", (long long)v->u.i), 0);
        return;
    case JT_FLOAT:
        jfmt_float(v->u.f, buf, sizeof buf);
        jsb_put(c, b, buf, strlen(buf), 0);
        return;
    case JT_STR:
        jsb_put_str(c, b, v);
        return;
    case JT_LIST:
        if (v->flags & JF_GEN)
            jerr(c, KVG_JINJA_ERROR, at,
                 "cannot print a generator (its text is a memory address): add |list");
        if (v->aux >= 1 && v->aux <= 3) {
            /* dict.keys()/values()/items() */
            static const char *const VIEW[] = { "dict_keys(", "dict_values(", "dict_items(" };
            jsb_put(c, b, VIEW[v->aux - 1], strlen(VIEW[v->aux - 1]), 0);
            put_seq(c, at, b, v);
            jsb_putc(c, b, ')');
            return;
        }
        put_seq(c, at, b, v);
        return;
    case JT_JLIST:
        put_seq(c, at, b, v);
        return;
    case JT_DICT:
    case JT_JDICT:
        put_dict(c, at, b, v);
        return;
    case JT_NS:
        jsb_put(c, b, "<Namespace ", 11, 0);
        put_dict(c, at, b, v);
        jsb_putc(c, b, '>');
        return;
    default:
        jerr(c, KVG_JINJA_ERROR, at, "cannot print a %s (its text is a memory address)",
             jv_type_name(v));
    }
}

jv jv_to_str(jctx *c, const jnode *at, const jv *v)
{
    jsb b;

    if (v->t == JT_STR)
        return *v;
    jsb_init(c, &b, 32);
    jv_str_into(c, at, &b, v);
    return jsb_str(&b);
}
