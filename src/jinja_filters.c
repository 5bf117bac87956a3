/* Jinja filters, as Jinja2 3.1 defines them (tojson is transformers' json.dumps:
 * jinja_json.c), and the argument helpers filters, tests and methods share. A
 * filter's result keeps the taint of the bytes it copies. Filter names resolve
 * at compile time: an unknown one fails kvg_jinja_compile. */
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

const char *jstr_z(jctx *c, const jv *s)
{
    char *z = jalloc(c, s->u.s.n + 1);
    memcpy(z, s->u.s.p, s->u.s.n);
    z[s->u.s.n] = 0;
    return z;
}

jv jarg_str(jctx *c, const jnode *at, const jv *v, const char *what)
{
    if (!v || v->t != JT_STR)
        jerr(c, KVG_JINJA_ERROR, at, "%s must be a string, not %s", what,
             v ? jv_type_name(v) : "nothing");
    return *v;
}

int64_t jarg_int(jctx *c, const jnode *at, const jv *v, int64_t dflt, const char *what)
{
    if (!v || v->t == JT_NONE)
        return dflt;
    if (v->t != JT_INT && v->t != JT_BOOL)
        jerr(c, KVG_JINJA_ERROR, at, "%s must be an integer, not %s", what, jv_type_name(v));
    return v->u.i;
}

int jarg_bool(const jv *v, int dflt)
{
    return v ? jv_truthy(v) : dflt;
}

/* soft_str: what Jinja2's string filters work on (undefined -> "") */
jv jarg_sstr(jctx *c, const jnode *at, const jv *v)
{
    return jv_to_str(c, at, v);
}

/* ---- attribute paths (selectattr, map, sort, ...): "a.b.0" ---- */

jv jinja_get_path(jctx *c, const jv *x, const jv *attr)
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
            size_t k = (size_t)strtoull(jstr_z(c, &part), NULL, 10);
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
        jv la = jstr_case(c, a, CASE_LOWER), lb = jstr_case(c, b, CASE_LOWER);
        return jv_cmp(c, at, &la, &lb);
    }
    return jv_cmp(c, at, a, b);
}

static void msort(jctx *c, const jnode *at, sortkey *v, sortkey *tmp, size_t n, int ci, int rev)
{
    if (n < 2)
        return;
    jsteps(c, at, n);       /* n per level: n log n in all */
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
    return ci && v->t == JT_STR ? jstr_case(c, v, CASE_LOWER) : *v;
}

/* ---- filters ---- */

#define UNUSED __attribute__((unused))
#define FILTER(name) static jv f_##name(UNUSED jctx *c, UNUSED const jnode *at, \
                                     UNUSED const jv *x, \
                                     UNUSED const jcall *a)

FILTER(abs)
{
    if (x->t == JT_INT || x->t == JT_BOOL) {
        if (x->u.i == INT64_MIN)
            jerr(c, KVG_JINJA_ERROR, at, "integer overflow (beyond 64 bits)");
        return jv_int(x->u.i < 0 ? -x->u.i : x->u.i);
    }
    if (x->t == JT_FLOAT)
        return jv_float(fabs(x->u.f));
    jerr(c, KVG_JINJA_ERROR, at, "bad operand type for abs(): '%s'", jv_type_name(x));
}

FILTER(capitalize) { jv s = jarg_sstr(c, at, x); return jstr_case(c, &s, CASE_CAPITALIZE); }
FILTER(upper) { jv s = jarg_sstr(c, at, x); return jstr_case(c, &s, CASE_UPPER); }
FILTER(lower) { jv s = jarg_sstr(c, at, x); return jstr_case(c, &s, CASE_LOWER); }
FILTER(title) { jv s = jarg_sstr(c, at, x); return jstr_case(c, &s, CASE_JTITLE); }

FILTER(center)
{
    jv s = jarg_sstr(c, at, x);
    jcall b = { .npos = 1, .pos = jarg(a, 0, "width") };
    jv w80 = jv_int(80);
    if (!b.pos)
        b.pos = &w80;
    return jstr_pad(c, at, &s, &b, 'c');
}

FILTER(length)
{
    return jv_int((int64_t)jv_len(c, at, x));
}

FILTER(default)
{
    const jv *d = jarg(a, 0, "default_value");
    int boolean = jarg_bool(jarg(a, 1, "boolean"), 0);
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
    if (x->t == JT_UNDEF)
        return jv_list_new(c, 0);
    jv r = dict_pairs(c, at, x);
    r.flags = JF_GEN;
    return r;
}

FILTER(dictsort)
{
    int ci = !jarg_bool(jarg(a, 0, "case_sensitive"), 0);
    const jv *by = jarg(a, 1, "by");
    int rev = jarg_bool(jarg(a, 2, "reverse"), 0);
    int pos = 0;

    if (x->t == JT_UNDEF)
        jerr(c, KVG_JINJA_ERROR, at, "%s", jv_undef_msg(c, x));
    if (by) {
        jv b = jarg_str(c, at, by, "by");
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
    int rev = jarg_bool(jarg(a, 0, "reverse"), 0);
    int ci = !jarg_bool(jarg(a, 1, "case_sensitive"), 0);
    const jv *attr = jarg(a, 2, "attribute");
    size_t n;
    jv *items = jv_items(c, at, x, &n);
    sortkey *v = jalloc(c, (n + 1) * sizeof *v), *tmp = jalloc(c, (n + 1) * sizeof *tmp);

    for (size_t i = 0; i < n; i++) {
        v[i].val = items[i];
        v[i].key = attr && attr->t != JT_NONE ? jinja_get_path(c, &items[i], attr) : items[i];
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
    int ci = !jarg_bool(jarg(a, 0, "case_sensitive"), 0);
    const jv *attr = jarg(a, 1, "attribute");
    size_t n, k = 0;
    jv *items = jv_items(c, at, x, &n);
    jv *keys = jalloc(c, (n + 1) * sizeof(jv));
    jv r = jv_list_new(c, n);

    for (size_t i = 0; i < n; i++) {
        jv key = attr && attr->t != JT_NONE ? jinja_get_path(c, &items[i], attr) : items[i];
        key = lower_if(c, &key, ci);
        size_t j;
        jsteps(c, at, k);       /* unique is quadratic */
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
    int ci = !jarg_bool(jarg(a, 0, "case_sensitive"), 0);
    const jv *attr = jarg(a, 1, "attribute");
    size_t n;
    jv *items = jv_items(c, at, x, &n);
    jv best, bkey;

    if (!n)
        return jv_undef("No aggregated item, sequence was empty.");
    best = items[0];
    bkey = attr && attr->t != JT_NONE ? jinja_get_path(c, &best, attr) : best;
    bkey = lower_if(c, &bkey, ci);
    for (size_t i = 1; i < n; i++) {
        jv k = attr && attr->t != JT_NONE ? jinja_get_path(c, &items[i], attr) : items[i];
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
        jv v = attr && attr->t != JT_NONE ? jinja_get_path(c, &items[i], attr) : items[i];
        acc = jinja_binop(c, at, OP_ADD, &acc, &v);
    }
    return acc;
}

FILTER(first)
{
    size_t n;
    jv *items;

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

    memcpy(r.u.l->v, items, n * sizeof(jv));
    return r;
}

FILTER(reverse)
{
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

jv jinja_join(jctx *c, const jnode *at, const jv *sep, const jv *seq, const char *attr)
{
    size_t n;
    jv *items = jv_items(c, at, seq, &n);
    jsb b;
    jv av = attr ? jv_lit(attr) : jv_none();

    jsb_init(c, &b, 64);
    for (size_t i = 0; i < n; i++) {
        if (i)
            jsb_put_str(c, &b, sep);
        jv v = attr ? jinja_get_path(c, &items[i], &av) : items[i];
        jv_str_into(c, at, &b, &v);
    }
    return jsb_str(&b);
}

FILTER(join)
{
    const jv *d = jarg(a, 0, "d");
    const jv *attr = jarg(a, 1, "attribute");
    jv sep = d ? jv_to_str(c, at, d) : jv_lit("");
    return jinja_join(c, at, &sep, x, attr && attr->t == JT_STR ? jstr_z(c, attr) : NULL);
}

FILTER(string)
{
    return jv_to_str(c, at, x);
}

FILTER(safe)
{
    jv s = jv_to_str(c, at, x);
    s.flags |= JF_SAFE;
    return s;
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
    jv s = jarg_sstr(c, at, x);
    return jstr_strip(c, at, &s, jarg(a, 0, "chars"), 3);
}

FILTER(replace)
{
    jv s = jarg_sstr(c, at, x);
    jv o = jv_to_str(c, at, jarg(a, 0, "old") ? jarg(a, 0, "old") : &(jv){ .t = JT_UNDEF });
    jv nw = jv_to_str(c, at, jarg(a, 1, "new") ? jarg(a, 1, "new") : &(jv){ .t = JT_UNDEF });
    return jstr_replace(c, &s, &o, &nw, jarg_int(c, at, jarg(a, 2, "count"), -1, "count"));
}

FILTER(int)
{
    const jv *d = jarg(a, 0, "default");
    int64_t base = jarg_int(c, at, jarg(a, 1, "base"), 10, "base");
    jv dflt = d ? *d : jv_int(0);

    switch (x->t) {
    case JT_UNDEF:      /* Undefined.__int__ raises */
        jerr(c, KVG_JINJA_ERROR, at, "%s", jv_undef_msg(c, x));
    case JT_INT: case JT_BOOL:
        return jv_int(x->u.i);
    case JT_FLOAT:
        if (!isfinite(x->u.f) || fabs(x->u.f) >= 9.2e18)
            return dflt;
        return jv_int((int64_t)x->u.f);
    case JT_STR: {
        char buf[80];
        size_t o = 0;
        jv s = jstr_strip(c, at, x, NULL, 3);
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
    case JT_UNDEF:
        jerr(c, KVG_JINJA_ERROR, at, "%s", jv_undef_msg(c, x));
    case JT_INT: case JT_BOOL:
        return jv_float((double)x->u.i);
    case JT_FLOAT:
        return *x;
    case JT_STR: {
        jv s = jstr_strip(c, at, x, NULL, 3);
        const char *z = jstr_z(c, &s);
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
    int64_t prec = jarg_int(c, at, jarg(a, 0, "precision"), 0, "precision");
    const jv *m = jarg(a, 1, "method");
    double v;
    char buf[400];

    if ((x->t == JT_INT || x->t == JT_BOOL) && (!m || (m->t == JT_STR && m->u.s.n == 6 &&
                                                     !memcmp(m->u.s.p, "common", 6)))) {
        /* Python's round() of an int is an int (half to even below the units) */
        int64_t i = x->u.i, p10 = 1;
        if (prec >= 0)
            return jv_int(i);
        for (int64_t k = prec; k < 0 && p10 < INT64_MAX / 10; k++)
            p10 *= 10;
        int64_t q = i / p10, r = i % p10;
        if (r < 0) {
            q--;
            r += p10;
        }
        if (2 * r > p10 || (2 * r == p10 && (q & 1)))
            q++;
        return jv_int(q * p10);
    }
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
        return jv_float(prec < 0 ? nearbyint(v / pow(10, (double)-prec)) * pow(10, (double)-prec)
                                 : v);
    /* printf rounds the exact binary value half to even, as Python's round() */
    snprintf(buf, sizeof buf, "%.*f", (int)prec, v);
    return jv_float(strtod(buf, NULL));
}

FILTER(indent)
{
    const jv *w = jarg(a, 0, "width");
    int first = jarg_bool(jarg(a, 1, "first"), 0);
    int blank = jarg_bool(jarg(a, 2, "blank"), 0);
    jv ind;
    jsb b;

    if (w && w->t == JT_STR) {
        ind = *w;
    } else {
        int64_t n = jarg_int(c, at, w, 4, "width");
        if (n < 0)
            n = 0;
        if ((uint64_t)n > c->max_output)
            jerr(c, KVG_JINJA_LIMIT, at, "output limit (%zu bytes) reached", c->max_output);
        char *sp = jalloc(c, (size_t)n + 1);
        memset(sp, ' ', (size_t)n);
        ind = jv_strn(sp, (size_t)n, JS_CLEAN);
    }
    /* s + "\n", split into lines, as Jinja2 does (so anything but a string fails) */
    if (x->t != JT_STR)
        jerr(c, KVG_JINJA_ERROR, at, "unsupported operand type(s) for +=: '%s' and 'str'",
             jv_type_name(x));
    jv s = *x;
    jsb_init(c, &b, s.u.s.n + 1);
    jsb_put_str(c, &b, &s);
    jsb_putc(c, &b, '\n');
    jv s2 = jsb_str(&b);
    jv lines = jstr_splitlines(c, &s2, 0);
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
    jv s = jarg_sstr(c, at, x);
    int64_t n = 0;
    int in = 0;

    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp;
        i += jstr_cp_at(&s, i, &cp);
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
    jv s = jarg_sstr(c, at, x);
    int64_t len = jarg_int(c, at, jarg(a, 0, "length"), 255, "length");
    int killwords = jarg_bool(jarg(a, 1, "killwords"), 0);
    const jv *endp = jarg(a, 2, "end");
    int64_t leeway = jarg_int(c, at, jarg(a, 3, "leeway"), 5, "leeway");
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
    jv s = jarg_sstr(c, at, x);

    if (a->nkw && a->npos)
        jerr(c, KVG_JINJA_ERROR, at,
             "can't handle positional and keyword arguments at the same time");
    return jinja_percent(c, at, &s, a->pos, a->npos, 0);
}

jv jinja_percent(jctx *c, const jnode *at, const jv *fmt, const jv *args, int nargs,
                 int mapping_ok)
{
    jv s = *fmt;
    jsb b;
    int ai = 0;
    const jcall call = { .npos = nargs, .pos = args };
    const jcall *a = &call;

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
            jsb_put_sub(c, &b, &s, i, 1);     /* keeps a data format's taint */
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
    /* Python lets a mapping argument go unused ('x' % {} is 'x') */
    if (ai < a->npos && !(mapping_ok && ai == 0))
        jerr(c, KVG_JINJA_ERROR, at, "not all arguments converted during string formatting");
    return jsb_str(&b);
}

FILTER(batch)
{
    int64_t size = jarg_int(c, at, jarg(a, 0, "linecount"), 1, "linecount");
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
            jv v = jinja_get_path(c, &items[i], attr);
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

static jv select_impl(jctx *c, const jnode *at, const jv *x, const jcall *a, int attr_mode,
                      int want)
{
    size_t n = 0, k = 0;
    /* as map: a falsy value selects nothing, even none */
    jv *items = jv_truthy(x) ? jv_items(c, at, x, &n) : NULL;
    jv r = jv_list_new(c, n);
    int off = attr_mode ? 1 : 0;
    const jv *attr = attr_mode ? jarg(a, 0, NULL) : NULL;
    const jv *test = jarg(a, off, NULL);
    jcall rest = { .npos = a->npos > off + 1 ? a->npos - off - 1 : 0,
                   .pos = a->npos > off + 1 ? a->pos + off + 1 : NULL,
                   .nkw = a->nkw, .kwname = a->kwname, .kwval = a->kwval };

    if (attr_mode && !attr)
        jerr(c, KVG_JINJA_ERROR, at, "selectattr needs an attribute");
    for (size_t i = 0; i < n; i++) {
        jv v = attr ? jinja_get_path(c, &items[i], attr) : items[i];
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

/* x|attr('name'): the attribute only, never the item (a dict's keys are not) */
FILTER(attr)
{
    jv name = jarg_str(c, at, jarg(a, 0, "name"), "attr's name");
    const char *z = jstr_z(c, &name);
    unsigned mask = memchr(name.u.s.p, 0, name.u.s.n) ? 0 : jinja_method_mask(z);

    if (jv_is_dict(x) && !jinja_has_method(x, mask) && !jinja_unsafe_method(x, mask)) {
        jv u = jv_undef(NULL);
        u.u.undef.name = z;
        u.aux = x->t;
        return u;
    }
    return jinja_getattr(c, at, x, z, mask);
}

static const struct { const char *name; jfilter_fn fn; } FILTERS[] = {
    { "abs", f_abs }, { "attr", f_attr }, { "batch", f_batch }, { "capitalize", f_capitalize },
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
        jerr(c, KVG_JINJA_ERROR, at, "No filter named '%.*s'.",
             (int)(name->u.s.n > 40 ? 40 : name->u.s.n),
             name->u.s.p);
    jstep(c, at);
    return f(c, at, x, rest);
}
