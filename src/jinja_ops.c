/* The operators of Jinja expressions with Python's semantics: attribute and item
 * access (Jinja2's order: obj.name tries the attribute, then the item; obj[key] the
 * item, then the attribute), slices, membership, arithmetic with 64-bit overflow
 * checks, and the Undefined values a missing name or attribute gives. */
#include "jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void jinja_undef_error(jctx *c, const jnode *at, const jv *v)
{
    jerr(c, KVG_JINJA_ERROR, at, "%s", jv_undef_msg(c, v));
}

static jv undef_attr(jctx *c, const jv *obj, const char *name, int element, int64_t idx)
{
    if (!element) {
        jv u = jv_undef(NULL);
        u.u.undef.name = name;
        u.aux = obj->t;
        return u;
    }
    const char *tn = jv_type_name(obj);
    size_t len = strlen(tn) + (name ? strlen(name) : 0) + 64;
    char *msg = jalloc(c, len);

    if (obj->t == JT_NONE)
        snprintf(msg, len, "None has no attribute '%s'", name ? name : "");
    else if (element)
        snprintf(msg, len, "'%s object' has no element %lld", tn, (long long)idx);
    else
        snprintf(msg, len, "'%s object' has no attribute '%s'", tn, name);
    return jv_undef(msg);
}

enum { LA_INDEX = 1, LA_INDEX0, LA_REVINDEX, LA_REVINDEX0, LA_FIRST, LA_LAST, LA_LENGTH,
       LA_DEPTH, LA_DEPTH0, LA_PREVITEM, LA_NEXTITEM, LA_CYCLE, LA_CHANGED };
static const char *const LOOP_ATTRS[] = {
    NULL, "index", "index0", "revindex", "revindex0", "first", "last", "length", "depth",
    "depth0", "previtem", "nextitem", "cycle", "changed"
};

int jinja_loop_attr(const char *name)
{
    for (int i = 1; i < (int)(sizeof LOOP_ATTRS / sizeof LOOP_ATTRS[0]); i++)
        if (!strcmp(LOOP_ATTRS[i], name))
            return i;
    return 0;
}

/* loop.name; code: jinja_loop_attr(name) when known (the parser's), else -1 */
static jv loop_attr(jctx *c, const jv *lv, const char *name, int code)
{
    const jloop *l = lv->u.loop;

    if (code < 0)
        code = jinja_loop_attr(name);
    switch (code) {
    case LA_INDEX: return jv_int((int64_t)l->i + 1);
    case LA_INDEX0: return jv_int((int64_t)l->i);
    case LA_REVINDEX: return jv_int((int64_t)(l->n - l->i));
    case LA_REVINDEX0: return jv_int((int64_t)(l->n - l->i - 1));
    case LA_FIRST: return jv_bool(l->i == 0);
    case LA_LAST: return jv_bool(l->i + 1 == l->n);
    case LA_LENGTH: return jv_int((int64_t)l->n);
    case LA_DEPTH: return jv_int(1);
    case LA_DEPTH0: return jv_int(0);
    case LA_PREVITEM:
        return l->i ? l->items[l->i - 1] : jv_undef("there is no previous item");
    case LA_NEXTITEM:
        return l->i + 1 < l->n ? l->items[l->i + 1] : jv_undef("there is no next item");
    case LA_CYCLE:
    case LA_CHANGED: {
        jv m = { .t = JT_METHOD };
        jv *recv = jalloc(c, sizeof *recv);
        *recv = *lv;
        m.u.meth.recv = recv;
        m.u.meth.name = LOOP_ATTRS[code];
        return m;
    }
    }
    return undef_attr(c, lv, name, 0, 0);
}

/* obj.name (Jinja2: attribute first, then item); mask: jinja_method_mask(name) */
jv jinja_getattr(jctx *c, const jnode *at, const jv *obj, const char *name, unsigned mask)
{
    jv r;

    switch (obj->t) {
    case JT_UNDEF:
        jinja_undef_error(c, at, obj);
    case JT_LOOP:
        return loop_attr(c, obj, name, at && at->kind == N_ATTR ? at->flag : -1);
    case JT_NS:
        if (jv_dict_get_str(c, obj, name, at && at->kind == N_ATTR ? (size_t)at->id : strlen(name),
                            &r))
            return r;
        return undef_attr(c, obj, name, 0, 0);
    default:
        break;
    }
    if (jinja_unsafe_method(obj, mask)) {
        /* the sandbox's unsafe_undefined: prints as "", fails when called */
        size_t len = strlen(name) + 64;
        char *msg = jalloc(c, len);
        snprintf(msg, len, "access to attribute '%s' of '%s' object is unsafe.", name,
                 jv_type_name(obj));
        return jv_undef(msg);
    }
    if (jinja_has_method(obj, mask)) {
        jv m = { .t = JT_METHOD };
        jv *recv = jalloc(c, sizeof *recv);
        *recv = *obj;
        m.u.meth.recv = recv;
        m.u.meth.name = name;
        return m;
    }
    if (jv_is_dict(obj) &&
        jv_dict_get_str(c, obj, name, at && at->kind == N_ATTR ? (size_t)at->id : strlen(name), &r))
        return r;
    return undef_attr(c, obj, name, 0, 0);
}

static int64_t as_index(const jv *k)
{
    return k->u.i;
}

/* obj[key] (Jinja2: item first, then attribute for string keys) */
jv jinja_getitem(jctx *c, const jnode *at, const jv *obj, const jv *key)
{
    jv r;

    if (obj->t == JT_UNDEF)
        jinja_undef_error(c, at, obj);
    if (jv_is_dict(obj) || obj->t == JT_NS) {
        if (jv_dict_get(c, obj, key, &r))
            return r;
    } else if ((jv_is_list(obj) || obj->t == JT_STR) && (key->t == JT_INT || key->t == JT_BOOL)) {
        int64_t i = as_index(key);
        int64_t n = (int64_t)jv_len(c, at, obj);
        if (i < 0)
            i += n;
        if (i >= 0 && i < n) {
            if (obj->t == JT_STR) {
                size_t off = jv_cp_off(obj, (size_t)i), end = jv_cp_off(obj, (size_t)i + 1);
                return jv_substr(obj, off, end - off);
            }
            return jv_list_at(c, obj, (size_t)i);
        }
        return undef_attr(c, obj, NULL, 1, as_index(key));
    } else if (obj->t == JT_LOOP && key->t == JT_STR) {
        char *nm = jalloc(c, key->u.s.n + 1);
        memcpy(nm, key->u.s.p, key->u.s.n);
        nm[key->u.s.n] = 0;
        return loop_attr(c, obj, nm, -1);
    }
    if (key->t == JT_STR) {
        const char *nm;
        unsigned mask;
        if (at && at->kind == N_ITEM && at->b->kind == N_CONST) {
            /* x['name']: the parser worked the mask out (and the literal ends in NUL) */
            nm = key->u.s.p;
            mask = at->op;
        } else {
            char *z = jalloc(c, key->u.s.n + 1);
            memcpy(z, key->u.s.p, key->u.s.n);
            z[key->u.s.n] = 0;
            nm = z;
            mask = memchr(key->u.s.p, 0, key->u.s.n) ? 0 : jinja_method_mask(nm);
        }
        if (jinja_has_method(obj, mask) || jinja_unsafe_method(obj, mask))
            return jinja_getattr(c, at, obj, nm, mask);
        return undef_attr(c, obj, nm, 0, 0);
    }
    if (key->t == JT_INT)
        return undef_attr(c, obj, NULL, 1, key->u.i);
    return undef_attr(c, obj, "?", 0, 0);
}

/* Python's slice.indices(): start, stop, step -> the indices to take */
static size_t slice_indices(jctx *c, const jnode *at, int64_t len, const jv *b, const jv *e,
                            const jv *s, int64_t *start, int64_t *step)
{
    int64_t st = 1, lo, hi;

    if (s && s->t != JT_NONE) {
        if (s->t != JT_INT && s->t != JT_BOOL)
            jerr(c, KVG_JINJA_ERROR, at, "slice indices must be integers or None");
        st = s->u.i;
        if (st == 0)
            jerr(c, KVG_JINJA_ERROR, at, "slice step cannot be zero");
    }
    for (int k = 0; k < 2; k++) {
        const jv *x = k ? e : b;
        int64_t *out = k ? &hi : &lo;
        if (!x || x->t == JT_NONE) {
            *out = st < 0 ? (k ? -1 : len - 1) : (k ? len : 0);
            continue;
        }
        if (x->t != JT_INT && x->t != JT_BOOL)
            jerr(c, KVG_JINJA_ERROR, at, "slice indices must be integers or None");
        int64_t v = x->u.i;
        if (v < 0) {
            v += len;
            if (v < 0)
                v = st < 0 ? -1 : 0;
        } else if (v >= len) {
            v = st < 0 ? len - 1 : len;
        }
        *out = v;
    }
    *start = lo;
    *step = st;
    if (st > 0)
        return hi > lo ? (size_t)((hi - lo - 1) / st + 1) : 0;
    return lo > hi ? (size_t)((lo - hi - 1) / (-st) + 1) : 0;
}

jv jinja_slice(jctx *c, const jnode *at, const jv *obj, const jv *b, const jv *e, const jv *s)
{
    int64_t start, step;

    if (obj->t == JT_UNDEF)
        jinja_undef_error(c, at, obj);
    if (obj->t == JT_STR) {
        size_t ncp = jv_ncp(obj);
        size_t cnt = slice_indices(c, at, (int64_t)ncp, b, e, s, &start, &step);
        if (step == 1) {
            size_t off = jv_cp_off(obj, (size_t)start);
            size_t end = off + (cnt ? jv_cp_off(&(jv){ .t = JT_STR, .u.s = { obj->u.s.p + off,
                                                     obj->u.s.n - off, NULL } }, cnt) : 0);
            return jv_substr(obj, off, end - off);
        }
        /* code point offsets, then pick */
        size_t *offs = jalloc(c, (ncp + 1) * sizeof *offs), k = 0;
        for (size_t i = 0; i < obj->u.s.n; i++)
            if (((unsigned char)obj->u.s.p[i] & 0xC0) != 0x80)
                offs[k++] = i;
        offs[k] = obj->u.s.n;
        jsb sb;
        jsb_init(c, &sb, obj->u.s.n);
        for (size_t i = 0; i < cnt; i++) {
            size_t cp = (size_t)(start + (int64_t)i * step);
            jsb_put_sub(c, &sb, obj, offs[cp], offs[cp + 1] - offs[cp]);
        }
        return jsb_str(&sb);
    }
    if (jv_is_list(obj)) {
        size_t n = jv_len(c, at, obj);
        size_t cnt = slice_indices(c, at, (int64_t)n, b, e, s, &start, &step);
        jv r = jv_list_new(c, cnt);
        for (size_t i = 0; i < cnt; i++)
            r.u.l->v[i] = jv_list_at(c, obj, (size_t)(start + (int64_t)i * step));
        r.flags = obj->flags & JF_TUPLE;
        return r;
    }
    jerr(c, KVG_JINJA_ERROR, at, "'%s' object is not subscriptable", jv_type_name(obj));
}

int jinja_contains(jctx *c, const jnode *at, const jv *item, const jv *cont)
{
    switch (cont->t) {
    case JT_STR:
        if (item->t != JT_STR)
            jerr(c, KVG_JINJA_ERROR, at, "'in <string>' requires string as left operand, not %s",
                 jv_type_name(item));
        jsteps(c, at, cont->u.s.n / 256);
        if (!item->u.s.n)
            return 1;
        return memmem(cont->u.s.p, cont->u.s.n, item->u.s.p, item->u.s.n) != NULL;
    case JT_LIST:
    case JT_JLIST: {
        size_t n = jv_len(c, at, cont);
        jsteps(c, at, n);
        for (size_t i = 0; i < n; i++) {
            jv x = jv_list_at(c, cont, i);
            if (jv_eq(c, &x, item))
                return 1;
        }
        return 0;
    }
    case JT_DICT:
    case JT_JDICT:
    case JT_NS: {
        jv r;
        if (jv_is_list(item) && !(item->flags & JF_TUPLE))
            jerr(c, KVG_JINJA_ERROR, at, "unhashable type: 'list'");
        if (jv_is_dict(item) || item->t == JT_NS)
            jerr(c, KVG_JINJA_ERROR, at, "unhashable type: '%s'", jv_type_name(item));
        return jv_dict_get(c, cont, item, &r);
    }
    case JT_UNDEF:
        return 0;
    default:
        jerr(c, KVG_JINJA_ERROR, at, "argument of type '%s' is not iterable", jv_type_name(cont));
    }
}

static double as_f(const jv *v) { return v->t == JT_FLOAT ? v->u.f : (double)v->u.i; }
static int is_num(const jv *v) { return v->t == JT_INT || v->t == JT_BOOL || v->t == JT_FLOAT; }

static const char *const OPNAME[] = { "+", "-", "*", "/", "//", "%", "**" };

static jv repeat(jctx *c, const jnode *at, const jv *seq, int64_t k)
{
    if (k < 0)
        k = 0;
    if (seq->t == JT_STR) {
        jsb sb;
        if (seq->u.s.n && (uint64_t)k > c->max_output / seq->u.s.n)
            jerr(c, KVG_JINJA_LIMIT, at, "output limit (%zu bytes) reached", c->max_output);
        jsb_init(c, &sb, seq->u.s.n * (size_t)k);
        for (int64_t i = 0; i < k; i++)
            jsb_put_str(c, &sb, seq);
        return jsb_str(&sb);
    }
    size_t n = jv_len(c, at, seq);
    if (n && (uint64_t)k > c->max_steps / n)
        jerr(c, KVG_JINJA_LIMIT, at, "step limit reached (list repetition)");
    jv r = jv_list_new(c, n * (size_t)k);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < n; j++)
            r.u.l->v[(size_t)i * n + j] = jv_list_at(c, seq, j);
    r.flags = seq->flags & JF_TUPLE;
    return r;
}

jv jinja_binop(jctx *c, const jnode *at, int op, const jv *a, const jv *b)
{
    int64_t r;

    if (a->t == JT_UNDEF)
        jinja_undef_error(c, at, a);
    if (b->t == JT_UNDEF)
        jinja_undef_error(c, at, b);
    if ((a->t == JT_INT || a->t == JT_BOOL) && (b->t == JT_INT || b->t == JT_BOOL)) {
        int64_t x = a->u.i, y = b->u.i;
        switch (op) {
        case OP_ADD:
            if (__builtin_add_overflow(x, y, &r))
                goto overflow;
            return jv_int(r);
        case OP_SUB:
            if (__builtin_sub_overflow(x, y, &r))
                goto overflow;
            return jv_int(r);
        case OP_MUL:
            if (__builtin_mul_overflow(x, y, &r))
                goto overflow;
            return jv_int(r);
        case OP_DIV:
            if (!y)
                jerr(c, KVG_JINJA_ERROR, at, "division by zero");
            return jv_float((double)x / (double)y);
        case OP_FLOORDIV:
        case OP_MOD: {
            if (!y)
                jerr(c, KVG_JINJA_ERROR, at, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1)
                goto overflow;
            int64_t q = x / y, m = x % y;
            if (m && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return jv_int(op == OP_FLOORDIV ? q : m);
        }
        case OP_POW:
            if (y < 0)
                return jv_float(pow((double)x, (double)y));
            r = 1;
            while (y) {
                if (y & 1 && __builtin_mul_overflow(r, x, &r))
                    goto overflow;
                y >>= 1;
                if (y && __builtin_mul_overflow(x, x, &x))
                    goto overflow;
            }
            return jv_int(r);
        }
    }
    if (is_num(a) && is_num(b)) {
        double x = as_f(a), y = as_f(b);
        switch (op) {
        case OP_ADD: return jv_float(x + y);
        case OP_SUB: return jv_float(x - y);
        case OP_MUL: return jv_float(x * y);
        case OP_DIV:
            if (y == 0)
                jerr(c, KVG_JINJA_ERROR, at, "float division by zero");
            return jv_float(x / y);
        case OP_FLOORDIV:
        case OP_MOD: {
            if (y == 0)
                jerr(c, KVG_JINJA_ERROR, at, "float modulo");
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0)))
                m += y;
            if (op == OP_MOD)
                return jv_float(m);
            return jv_float(floor((x - m) / y + 0.5));
        }
        case OP_POW:
            return jv_float(pow(x, y));
        }
    }
    if (op == OP_ADD && a->t == JT_STR && b->t == JT_STR) {
        jsb sb;
        if ((a->flags | b->flags) & JF_SAFE) {
            /* Markup + str escapes the str (even with autoescape off) */
            jv x = a->flags & JF_SAFE ? *a : jinja_html_escape(c, a);
            jv y = b->flags & JF_SAFE ? *b : jinja_html_escape(c, b);
            jsb_init(c, &sb, x.u.s.n + y.u.s.n);
            jsb_put_str(c, &sb, &x);
            jsb_put_str(c, &sb, &y);
            x = jsb_str(&sb);
            x.flags |= JF_SAFE;
            return x;
        }
        jsb_init(c, &sb, a->u.s.n + b->u.s.n);
        jsb_put_str(c, &sb, a);
        jsb_put_str(c, &sb, b);
        return jsb_str(&sb);
    }
    if (op == OP_ADD && jv_is_list(a) && jv_is_list(b) &&
        (a->flags & JF_TUPLE) == (b->flags & JF_TUPLE)) {
        size_t na = jv_len(c, at, a), nb = jv_len(c, at, b);
        jv l = jv_list_new(c, na + nb);
        for (size_t i = 0; i < na; i++)
            l.u.l->v[i] = jv_list_at(c, a, i);
        for (size_t i = 0; i < nb; i++)
            l.u.l->v[na + i] = jv_list_at(c, b, i);
        l.flags = a->flags & JF_TUPLE;
        return l;
    }
    if (op == OP_MOD && a->t == JT_STR) {
        /* 'fmt' % x: a tuple gives the arguments, anything else is the one argument */
        if (b->t == JT_LIST && (b->flags & JF_TUPLE))
            return jinja_percent(c, at, a, b->u.l->v, (int)b->u.l->n, 0);
        return jinja_percent(c, at, a, b, 1, jv_is_dict(b));
    }
    if (op == OP_MUL && (a->t == JT_STR || jv_is_list(a)) && (b->t == JT_INT || b->t == JT_BOOL))
        return repeat(c, at, a, b->u.i);
    if (op == OP_MUL && (b->t == JT_STR || jv_is_list(b)) && (a->t == JT_INT || a->t == JT_BOOL))
        return repeat(c, at, b, a->u.i);
    jerr(c, KVG_JINJA_ERROR, at, "unsupported operand type(s) for %s: '%s' and '%s'",
         OPNAME[op], jv_type_name(a), jv_type_name(b));
overflow:
    jerr(c, KVG_JINJA_ERROR, at, "integer overflow (beyond 64 bits)");
}
