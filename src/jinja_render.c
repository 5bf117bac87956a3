/* Evaluation of a compiled template: kvg_jinja_compile and kvg_jinja_render.
 *
 * A tree walk over the AST. Variables live in scopes chained to their parent:
 * the root scope, one per for-loop iteration (a `set` inside a loop does not
 * leak out, as in Jinja2), one per macro call (parented to where the macro was
 * defined, so it sees that scope's variables as they are at call time). A name
 * found in no scope comes from `trusted`, then `data`, then the global
 * functions; the jansson values are wrapped, not converted.
 *
 * Output goes to a string builder that carries a taint byte per output byte;
 * macro calls, set blocks and filter blocks capture into their own builder and
 * yield a string that keeps those bytes' taint. */
#include "jinja_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

enum { F_RANGE = 1, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME };

static const struct { const char *name; int id; } FUNCS[] = {
    { "range", F_RANGE }, { "namespace", F_NAMESPACE }, { "dict", F_DICT },
    { "raise_exception", F_RAISE }, { "strftime_now", F_STRFTIME },
};

typedef struct jmacro {
    const jnode *def;           /* N_MACRO, or N_CALLBLOCK for a caller */
    jscope *scope;              /* where it was defined */
    const char *name;
} jmacro;

enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

static jv eval(jctx *c, const jnode *n);
static int exec(jctx *c, const jnode *n);

void jerr(jctx *c, int rc, const jnode *at, const char *fmt, ...)
{
    va_list ap;
    int k = 0;

    if (rc == KVG_JINJA_RAISED) {
        /* the message is the template's own */
        va_start(ap, fmt);
        vsnprintf(c->err, c->err_len, fmt, ap);
        va_end(ap);
        longjmp(c->jb, rc);
    }
    if (c->err_len) {
        if (at)
            k = snprintf(c->err, c->err_len, "%s:%u:%u: ", c->t->name, at->line, at->col);
        else
            k = snprintf(c->err, c->err_len, "%s: ", c->t->name);
        if (k < 0 || (size_t)k >= c->err_len)
            k = 0;
        va_start(ap, fmt);
        vsnprintf(c->err + k, c->err_len - (size_t)k, fmt, ap);
        va_end(ap);
    }
    longjmp(c->jb, rc);
}

void jstep(jctx *c, const jnode *at)
{
    if (++c->steps > c->max_steps)
        jerr(c, KVG_JINJA_LIMIT, at, "step limit (%llu) reached",
             (unsigned long long)c->max_steps);
}

/* Work hidden inside one operation (comparing long lists, membership, sorting)
 * counts too, so that a loop of cheap-looking steps stays bounded in time. */
void jsteps(jctx *c, const jnode *at, uint64_t k)
{
    if (k > c->max_steps - c->steps)
        jerr(c, KVG_JINJA_LIMIT, at, "step limit (%llu) reached",
             (unsigned long long)c->max_steps);
    c->steps += k;
}

void jstack_exceeded(jctx *c, const jnode *at)
{
    jerr(c, KVG_JINJA_LIMIT, at, "nesting depth limit reached (recursion too deep)");
}

/* ---- scopes ---- */

static jscope *scope_new(jctx *c, jscope *parent)
{
    /* room for a loop iteration's few names in the same allocation */
    enum { INLINE = 4 };
    jscope *s = jalloc(c, sizeof *s + INLINE * (sizeof(jv) + sizeof(int)));

    s->parent = parent;
    s->n = 0;
    s->cap = INLINE;
    s->vals = (jv *)(s + 1);
    s->ids = (int *)(s->vals + INLINE);
    return s;
}

static void scope_set(jctx *c, jscope *s, int id, const jv *v)
{
    for (int i = 0; i < s->n; i++) {
        if (s->ids[i] == id) {
            s->vals[i] = *v;
            return;
        }
    }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 4;
        int *ids = jalloc(c, (size_t)cap * sizeof *ids);
        jv *vals = jalloc(c, (size_t)cap * sizeof *vals);
        if (s->n) {
            memcpy(ids, s->ids, (size_t)s->n * sizeof *ids);
            memcpy(vals, s->vals, (size_t)s->n * sizeof *vals);
        }
        s->ids = ids;
        s->vals = vals;
        s->cap = cap;
    }
    s->ids[s->n] = id;
    s->vals[s->n++] = *v;
}

static jv global(jctx *c, int id)
{
    const char *name = c->t->names[id];
    json_t *j;

    if (c->gdone[id])
        return c->globals[id];
    c->gdone[id] = 1;
    if (c->trusted && (j = json_object_get(c->trusted, name))) {
        c->globals[id] = jv_from_json(j, 0);
    } else if (c->data && (j = json_object_get(c->data, name))) {
        c->globals[id] = jv_from_json(j, 1);
    } else {
        size_t i;
        for (i = 0; i < sizeof FUNCS / sizeof FUNCS[0]; i++) {
            if (strcmp(FUNCS[i].name, name) == 0) {
                jv f = { .t = JT_FUNC, .aux = (uint32_t)FUNCS[i].id };
                c->globals[id] = f;
                break;
            }
        }
        if (i == sizeof FUNCS / sizeof FUNCS[0]) {
            size_t len = strlen(name) + 20;
            char *msg = jalloc(c, len);
            snprintf(msg, len, "'%s' is undefined", name);
            c->globals[id] = jv_undef(msg);
        }
    }
    return c->globals[id];
}

static jv lookup(jctx *c, int id)
{
    for (jscope *s = c->scope; s; s = s->parent)
        for (int i = 0; i < s->n; i++)
            if (s->ids[i] == id)
                return s->vals[i];
    return global(c, id);
}

/* eval, with the leaves (constants, names) done in line: they are half the
 * nodes a template evaluates */
static inline jv ev(jctx *c, const jnode *n)
{
    if (n->kind == N_CONST)
        return n->val;
    if (n->kind == N_NAME)
        return lookup(c, n->id);
    return eval(c, n);
}

/* ---- calls ---- */

static void eval_args(jctx *c, const jnode *n, jcall *a, const jv *first)
{
    int off = first ? 1 : 0;

    if (!n->nkids && !n->nkw && !first) {
        memset(a, 0, sizeof *a);
        return;
    }
    jv *pos = jalloc(c, (n->nkids + (size_t)off + 1) * sizeof(jv));
    jv *kw = jalloc(c, (n->nkw + 1) * sizeof(jv));

    if (first)
        pos[0] = *first;
    for (uint32_t i = 0; i < n->nkids; i++)
        pos[i + (uint32_t)off] = ev(c, n->kids[i]);
    for (uint32_t i = 0; i < n->nkw; i++)
        kw[i] = ev(c, n->kwval[i]);
    a->npos = (int)n->nkids + off;
    a->pos = pos;
    a->nkw = (int)n->nkw;
    a->kwname = n->kwname;
    a->kwval = kw;
}

static jv capture_body(jctx *c, const jnode *body)
{
    jsb sb, *saved = c->out;

    jsb_init(c, &sb, 256);
    c->out = &sb;
    exec(c, body);
    c->out = saved;
    return jsb_str(&sb);
}

static jv call_macro(jctx *c, const jnode *at, const jmacro *m, const jcall *a, const jv *caller)
{
    const jnode *def = m->def;
    jscope *s = scope_new(c, m->scope), *saved = c->scope;
    jv r;
    int np = (int)def->nkids;
    int uses_extra = def->kind == N_MACRO && def->flag;

    jstep(c, at);
    if (++c->depth > c->max_depth)
        jerr(c, KVG_JINJA_LIMIT, at, "nesting depth limit (%u) reached (macro recursion)",
             c->max_depth);
    if (a->npos > np && !uses_extra)
        jerr(c, KVG_JINJA_ERROR, at, "macro '%s' takes not more than %d argument(s)", m->name, np);
    /* parameters: positional, then keywords, then defaults (evaluated in the
     * macro's scope, so they may use earlier parameters) */
    uint8_t *set = jalloc(c, (size_t)np + 1);
    memset(set, 0, (size_t)np + 1);
    for (int i = 0; i < np && i < a->npos; i++) {
        scope_set(c, s, def->kids[i]->id, &a->pos[i]);
        set[i] = 1;
    }
    jv kwargs = jv_dict_new(c, 4);
    for (int k = 0; k < a->nkw; k++) {
        int i;
        for (i = 0; i < np; i++)
            if (!strcmp(def->kids[i]->name, a->kwname[k]))
                break;
        if (i < np) {
            scope_set(c, s, def->kids[i]->id, &a->kwval[k]);
            set[i] = 1;
        } else if (uses_extra) {
            jv key = jv_lit(a->kwname[k]);
            jv_dict_set(c, kwargs.u.d, &key, &a->kwval[k]);
        } else {
            jerr(c, KVG_JINJA_ERROR, at, "macro '%s' takes no keyword argument '%s'", m->name,
                 a->kwname[k]);
        }
    }
    c->scope = s;
    for (int i = 0; i < np; i++) {
        if (set[i])
            continue;
        jv v;
        if (def->kwval[i]) {
            v = ev(c, def->kwval[i]);
        } else {
            size_t len = strlen(def->kids[i]->name) + 64;
            char *msg = jalloc(c, len);
            snprintf(msg, len, "parameter '%s' was not provided", def->kids[i]->name);
            v = jv_undef(msg);
        }
        scope_set(c, s, def->kids[i]->id, &v);
    }
    if (uses_extra) {
        jv va = jv_list_new(c, a->npos > np ? (size_t)(a->npos - np) : 0);
        va.flags = JF_TUPLE;
        for (int i = np; i < a->npos; i++)
            va.u.l->v[i - np] = a->pos[i];
        if (c->t->id_varargs >= 0)
            scope_set(c, s, c->t->id_varargs, &va);
        if (c->t->id_kwargs >= 0)
            scope_set(c, s, c->t->id_kwargs, &kwargs);
    }
    if (caller && c->t->id_caller >= 0)
        scope_set(c, s, c->t->id_caller, caller);
    r = capture_body(c, def->b);
    c->scope = saved;
    c->depth--;
    return r;
}

static jv call_func(jctx *c, const jnode *at, int id, const jcall *a)
{
    switch (id) {
    case F_RANGE: {
        int64_t v[3] = { 0, 0, 1 };
        if (a->npos < 1 || a->npos > 3 || a->nkw)
            jerr(c, KVG_JINJA_ERROR, at, "range expected 1 to 3 integer arguments");
        for (int i = 0; i < a->npos; i++)
            if (a->pos[i].t != JT_INT && a->pos[i].t != JT_BOOL)
                jerr(c, KVG_JINJA_ERROR, at, "'%s' object cannot be interpreted as an integer",
                     jv_type_name(&a->pos[i]));
        if (a->npos == 1) {
            v[1] = a->pos[0].u.i;
        } else {
            v[0] = a->pos[0].u.i;
            v[1] = a->pos[1].u.i;
            if (a->npos == 3)
                v[2] = a->pos[2].u.i;
        }
        if (!v[2])
            jerr(c, KVG_JINJA_ERROR, at, "range() arg 3 must not be zero");
        /* the count as Python computes it, in unsigned arithmetic: no overflow */
        uint64_t cnt = 0;
        if (v[2] > 0 && v[1] > v[0])
            cnt = ((uint64_t)v[1] - (uint64_t)v[0] - 1) / (uint64_t)v[2] + 1;
        else if (v[2] < 0 && v[0] > v[1])
            cnt = ((uint64_t)v[0] - (uint64_t)v[1] - 1) / (0 - (uint64_t)v[2]) + 1;
        if (cnt > c->max_steps - c->steps)
            jerr(c, KVG_JINJA_LIMIT, at, "step limit (%llu) reached (range too long)",
                 (unsigned long long)c->max_steps);
        c->steps += cnt;
        jv l = jv_list_new(c, (size_t)cnt);
        for (uint64_t i = 0; i < cnt; i++)
            l.u.l->v[i] = jv_int((int64_t)((uint64_t)v[0] + i * (uint64_t)v[2]));
        return l;
    }
    case F_NAMESPACE:
    case F_DICT: {
        jv d = jv_dict_new(c, (size_t)a->nkw + 4);
        if (a->npos > 1)
            jerr(c, KVG_JINJA_ERROR, at, "expected at most 1 positional argument");
        if (a->npos == 1) {
            const jv *src = &a->pos[0];
            if (!jv_is_dict(src) && src->t != JT_NS)
                jerr(c, KVG_JINJA_ERROR, at, "cannot make a dict from a %s", jv_type_name(src));
            jv *ks, *vs;
            size_t n;
            jv_dict_keys_vals(c, src, &ks, &vs, &n);
            for (size_t i = 0; i < n; i++)
                jv_dict_set(c, d.u.d, &ks[i], &vs[i]);
        }
        for (int i = 0; i < a->nkw; i++) {
            jv k = jv_lit(a->kwname[i]);
            jv_dict_set(c, d.u.d, &k, &a->kwval[i]);
        }
        if (id == F_NAMESPACE)
            d.t = JT_NS;
        return d;
    }
    case F_RAISE: {
        const jv *m = jarg(a, 0, "message");
        jv s = m ? jv_to_str(c, at, m) : jv_lit("");
        jerr(c, KVG_JINJA_RAISED, at, "%.*s", (int)(s.u.s.n > 4000 ? 4000 : s.u.s.n), s.u.s.p);
    }
    case F_STRFTIME: {
        const jv *f = jarg(a, 0, "format");
        char fmt[256], buf[512];
        struct tm tm;
        if (!f || f->t != JT_STR || f->u.s.n >= sizeof fmt)
            jerr(c, KVG_JINJA_ERROR, at, "strftime_now takes a format string");
        memcpy(fmt, f->u.s.p, f->u.s.n);
        fmt[f->u.s.n] = 0;
        localtime_r(&c->now, &tm);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        char *o = jalloc(c, n + 1);
        memcpy(o, buf, n);
        /* a format with data in it copies that data through: all of it is data then */
        return jv_strn(o, n, f->taint == JS_CLEAN ? JS_CLEAN : JS_DATA);
    }
    }
    jerr(c, KVG_JINJA_ERROR, at, "unknown function");
}

jv jinja_call_value(jctx *c, const jnode *at, const jv *fn, const jcall *a)
{
    switch (fn->t) {
    case JT_MACRO:
        return call_macro(c, at, fn->u.m, a, NULL);
    case JT_FUNC:
        return call_func(c, at, (int)fn->aux, a);
    case JT_METHOD:
        return jinja_call_method(c, at, fn->u.meth.recv, fn->u.meth.name, a);
    case JT_UNDEF:
        jinja_undef_error(c, at, fn);
    default:
        jerr(c, KVG_JINJA_ERROR, at, "'%s' object is not callable", jv_type_name(fn));
    }
}

/* ---- expressions ---- */

/* a + b + c + ...: the operands in order, then one copy when all are plain
 * strings (the common '<|im_start|>' + role + '\n' + content), else pairwise */
static jv add_chain(jctx *c, const jnode *n)
{
    const jnode *ops[32];
    jv v[32];
    int k = 0, plain = 1;
    size_t len = 0;
    const jnode *x = n;

    while (x->kind == N_BIN && x->op == OP_ADD && k < 31) {
        ops[k++] = x;
        x = x->a;
    }
    /* x is the leftmost operand; ops[k-1] is the innermost '+' */
    v[0] = ev(c, x);
    for (int i = 0; i < k; i++)
        v[i + 1] = ev(c, ops[k - 1 - i]->b);
    for (int i = 0; i <= k; i++) {
        plain &= v[i].t == JT_STR && !(v[i].flags & JF_SAFE);
        len += v[i].t == JT_STR ? v[i].u.s.n : 0;
    }
    if (plain) {
        jsb sb;
        jsb_init(c, &sb, len);
        for (int i = 0; i <= k; i++)
            jsb_put_str(c, &sb, &v[i]);
        return jsb_str(&sb);
    }
    jv acc = v[0];
    for (int i = 0; i < k; i++)
        acc = jinja_binop(c, ops[k - 1 - i], OP_ADD, &acc, &v[i + 1]);
    return acc;
}

static jv eval(jctx *c, const jnode *n)
{
    jv a, b, r;

    jstack_check(c, n);
    switch (n->kind) {
    case N_CONST:
        return n->val;
    case N_NAME:
        return lookup(c, n->id);
    case N_LIST:
    case N_TUPLE:
        r = jv_list_new(c, n->nkids);
        for (uint32_t i = 0; i < n->nkids; i++)
            r.u.l->v[i] = ev(c, n->kids[i]);
        if (n->kind == N_TUPLE)
            r.flags = JF_TUPLE;
        return r;
    case N_DICT:
        r = jv_dict_new(c, n->nkids / 2 + 1);
        for (uint32_t i = 0; i + 1 < n->nkids; i += 2) {
            a = ev(c, n->kids[i]);
            b = ev(c, n->kids[i + 1]);
            if (a.t != JT_STR && a.t != JT_INT && a.t != JT_BOOL && a.t != JT_NONE &&
                a.t != JT_FLOAT && !(a.t == JT_LIST && (a.flags & JF_TUPLE)))
                jerr(c, KVG_JINJA_ERROR, n, "unhashable type: '%s'", jv_type_name(&a));
            jv_dict_set(c, r.u.d, &a, &b);
        }
        return r;
    case N_ATTR:
        a = ev(c, n->a);
        return jinja_getattr(c, n, &a, n->name, n->op);
    case N_ITEM:
        a = ev(c, n->a);
        b = ev(c, n->b);
        return jinja_getitem(c, n, &a, &b);
    case N_SLICE: {
        jv s[3];
        a = ev(c, n->a);
        for (int i = 0; i < 3; i++) {
            const jnode *x = i == 0 ? n->b : i == 1 ? n->c : n->d;
            s[i] = x ? ev(c, x) : jv_none();
        }
        return jinja_slice(c, n, &a, &s[0], &s[1], &s[2]);
    }
    case N_CALL: {
        jcall args;
        if (n->a->kind == N_ATTR) {
            a = ev(c, n->a->a);
            if (a.t != JT_UNDEF && a.t != JT_NS && a.t != JT_LOOP &&
                (jinja_has_method(&a, n->a->op) || jinja_unsafe_method(&a, n->a->op))) {
                eval_args(c, n, &args, NULL);
                return jinja_call_method(c, n, &a, n->a->name, &args);
            }
            b = jinja_getattr(c, n->a, &a, n->a->name, n->a->op);
        } else {
            b = ev(c, n->a);
        }
        eval_args(c, n, &args, NULL);
        return jinja_call_value(c, n, &b, &args);
    }
    case N_FILTER: {
        jcall args;
        a = ev(c, n->a);
        eval_args(c, n, &args, NULL);
        jstep(c, n);
        return n->filter(c, n, &a, &args);
    }
    case N_TEST: {
        jcall args;
        a = ev(c, n->a);
        eval_args(c, n, &args, NULL);
        return jv_bool(n->test(c, n, &a, &args));
    }
    case N_BIN:
        if (n->op == OP_ADD && n->a->kind == N_BIN && n->a->op == OP_ADD)
            return add_chain(c, n);
        a = ev(c, n->a);
        b = ev(c, n->b);
        return jinja_binop(c, n, n->op, &a, &b);
    case N_NEG:
    case N_POS:
        a = ev(c, n->a);
        if (a.t == JT_UNDEF)
            jinja_undef_error(c, n, &a);
        if (a.t == JT_FLOAT)
            return jv_float(n->kind == N_NEG ? -a.u.f : a.u.f);
        if (a.t == JT_INT || a.t == JT_BOOL) {
            if (n->kind == N_POS)
                return jv_int(a.u.i);
            if (a.u.i == INT64_MIN)
                jerr(c, KVG_JINJA_ERROR, n, "integer overflow (beyond 64 bits)");
            return jv_int(-a.u.i);
        }
        jerr(c, KVG_JINJA_ERROR, n, "bad operand type for unary %s: '%s'",
             n->kind == N_NEG ? "-" : "+", jv_type_name(&a));
    case N_NOT:
        a = ev(c, n->a);
        return jv_bool(!jv_truthy(&a));
    case N_AND:
        a = ev(c, n->a);
        return jv_truthy(&a) ? ev(c, n->b) : a;
    case N_OR:
        a = ev(c, n->a);
        return jv_truthy(&a) ? a : ev(c, n->b);
    case N_CMP:
        a = ev(c, n->kids[0]);
        for (uint32_t i = 1; i < n->nkids; i++) {
            int ok;
            b = ev(c, n->kids[i]);
            switch (n->cmpops[i]) {
            case OP_EQ: ok = jv_eq(c, &a, &b); break;
            case OP_NE: ok = !jv_eq(c, &a, &b); break;
            case OP_LT: ok = jv_cmp(c, n, &a, &b) < 0; break;
            case OP_LE: ok = jv_cmp(c, n, &a, &b) <= 0; break;
            case OP_GT: ok = jv_cmp(c, n, &a, &b) > 0; break;
            case OP_GE: ok = jv_cmp(c, n, &a, &b) >= 0; break;
            case OP_IN: ok = jinja_contains(c, n, &a, &b); break;
            default: ok = !jinja_contains(c, n, &a, &b); break;
            }
            if (!ok)
                return jv_bool(0);
            a = b;
        }
        return jv_bool(1);
    case N_CONCAT: {
        jsb sb;
        jsb_init(c, &sb, 64);
        for (uint32_t i = 0; i < n->nkids; i++) {
            a = ev(c, n->kids[i]);
            jv_str_into(c, n, &sb, &a);
        }
        return jsb_str(&sb);
    }
    case N_COND:
        a = ev(c, n->a);
        if (jv_truthy(&a))
            return ev(c, n->b);
        if (n->c)
            return ev(c, n->c);
        return jv_undef("the inline if-expression evaluated to false and no else section was"
                        " defined");
    }
    jerr(c, KVG_JINJA_ERROR, n, "cannot evaluate this node");
}

/* ---- statements ---- */

static void assign(jctx *c, const jnode *target, const jv *v)
{
    if (target->kind == N_NAME) {
        scope_set(c, c->scope, target->id, v);
        return;
    }
    if (target->kind == N_ATTR) {
        jv ns = lookup(c, target->a->id);
        if (ns.t != JT_NS)
            jerr(c, KVG_JINJA_ERROR, target, "cannot assign attribute on non-namespace object");
        jv k = jv_lit(target->name);
        jv_dict_set(c, ns.u.d, &k, v);
        return;
    }
    /* a tuple of names: unpack */
    size_t n;
    jv *items = jv_items(c, target, v, &n);
    if (n != target->nkids)
        jerr(c, KVG_JINJA_ERROR, target, n < target->nkids ?
             "not enough values to unpack (expected %u, got %zu)" :
             "too many values to unpack (expected %u, got %zu)", target->nkids, n);
    for (size_t i = 0; i < n; i++)
        assign(c, target->kids[i], &items[i]);
}

static int exec_for(jctx *c, const jnode *n)
{
    jv seq = ev(c, n->b);
    size_t cnt;
    jv *items;
    jscope *saved = c->scope;

    if (seq.t == JT_DICT || seq.t == JT_JDICT || seq.t == JT_STR || seq.t == JT_UNDEF ||
        seq.t == JT_LIST || seq.t == JT_JLIST)
        items = jv_items(c, n->b, &seq, &cnt);
    else
        jerr(c, KVG_JINJA_ERROR, n->b, "'%s' object is not iterable", jv_type_name(&seq));
    if (n->c) {
        /* for x in xs if cond: filter first, so loop.length counts what is kept */
        jv *kept = jalloc(c, (cnt ? cnt : 1) * sizeof(jv));
        size_t k = 0;
        for (size_t i = 0; i < cnt; i++) {
            jstep(c, n);
            c->scope = scope_new(c, saved);
            assign(c, n->a, &items[i]);
            jv ok = ev(c, n->c);
            if (jv_truthy(&ok))
                kept[k++] = items[i];
        }
        c->scope = saved;
        items = kept;
        cnt = k;
    }
    jloop *lp = jalloc(c, sizeof *lp);
    jv lv = { .t = JT_LOOP };
    int loop_id = c->t->id_loop;

    lp->n = cnt;
    lp->items = items;
    lv.u.loop = lp;
    for (size_t i = 0; i < cnt; i++) {
        jstep(c, n);
        lp->i = i;
        c->scope = scope_new(c, saved);
        if (loop_id >= 0)
            scope_set(c, c->scope, loop_id, &lv);
        assign(c, n->a, &items[i]);
        int flow = exec(c, n->d);
        c->scope = saved;
        if (flow == FLOW_BREAK)
            break;
    }
    c->scope = saved;
    if (!cnt && n->e)
        return exec(c, n->e);
    return FLOW_NORMAL;
}

static jv apply_chain(jctx *c, const jnode *f, const jv *body)
{
    jv x;
    jcall args;

    if (!f)
        return *body;
    x = apply_chain(c, f->a, body);
    eval_args(c, f, &args, NULL);
    jstep(c, f);
    return f->filter(c, f, &x, &args);
}

static int exec(jctx *c, const jnode *n)
{
    jv v;

    jstack_check(c, n);
    switch (n->kind) {
    case N_BODY:
        for (uint32_t i = 0; i < n->nkids; i++) {
            int flow = exec(c, n->kids[i]);
            if (flow != FLOW_NORMAL)
                return flow;
        }
        return FLOW_NORMAL;
    case N_TEXT:
        jsb_put(c, c->out, n->val.u.s.p, n->val.u.s.n, 0);
        return FLOW_NORMAL;
    case N_PRINT:
        v = ev(c, n->a);
        jv_str_into(c, n, c->out, &v);
        return FLOW_NORMAL;
    case N_IF:
        v = ev(c, n->a);
        if (jv_truthy(&v))
            return exec(c, n->b);
        return n->c ? exec(c, n->c) : FLOW_NORMAL;
    case N_FOR:
        return exec_for(c, n);
    case N_SET:
        v = ev(c, n->b);
        assign(c, n->a, &v);
        return FLOW_NORMAL;
    case N_SETBLOCK:
        v = capture_body(c, n->b);
        v = apply_chain(c, n->c, &v);
        assign(c, n->a, &v);
        return FLOW_NORMAL;
    case N_MACRO: {
        jmacro *m = jalloc(c, sizeof *m);
        m->def = n;
        m->scope = c->scope;
        m->name = n->name;
        v.t = JT_MACRO;
        v.flags = 0;
        v.u.m = m;
        scope_set(c, c->scope, n->id, &v);
        return FLOW_NORMAL;
    }
    case N_CALLBLOCK: {
        jmacro *m = jalloc(c, sizeof *m);
        jv caller = { .t = JT_MACRO }, fn;
        jcall args;
        const jnode *call = n->a;

        m->def = n;
        m->scope = c->scope;
        m->name = "caller";
        caller.u.m = m;
        if (call->a->kind == N_ATTR) {
            jv recv = ev(c, call->a->a);
            fn = jinja_getattr(c, call->a, &recv, call->a->name, call->a->op);
        } else {
            fn = ev(c, call->a);
        }
        eval_args(c, call, &args, NULL);
        if (fn.t == JT_MACRO)
            v = call_macro(c, call, fn.u.m, &args, &caller);
        else
            v = jinja_call_value(c, call, &fn, &args);
        jv_str_into(c, n, c->out, &v);
        return FLOW_NORMAL;
    }
    case N_FILTERBLOCK:
        v = capture_body(c, n->b);
        v = apply_chain(c, n->a, &v);
        jv_str_into(c, n, c->out, &v);
        return FLOW_NORMAL;
    case N_WITH: {
        /* the values first, in the outer scope; then a scope of their own */
        jv *vals = jalloc(c, (n->nkids + 1) * sizeof(jv));
        jscope *saved = c->scope;
        for (uint32_t i = 0; i < n->nkids; i++)
            vals[i] = ev(c, n->kwval[i]);
        c->scope = scope_new(c, saved);
        for (uint32_t i = 0; i < n->nkids; i++)
            assign(c, n->kids[i], &vals[i]);
        int flow = exec(c, n->b);
        c->scope = saved;
        return flow;
    }
    case N_BREAK:
        return FLOW_BREAK;
    case N_CONTINUE:
        return FLOW_CONTINUE;
    }
    jerr(c, KVG_JINJA_ERROR, n, "cannot execute this node");
}

/* ---- API ---- */

kvg_jinja *kvg_jinja_compile(const char *src, size_t len, const char *name,
                             char *err, size_t err_len)
{
    kvg_jinja *t = calloc(1, sizeof *t);
    jtok *toks;
    size_t ntoks;
    char msg[512] = "";
    size_t bad;

    if (!name)
        name = "template";
    if (!t)
        goto nomem;
    t->name = strdup(name);
    if (!t->name)
        goto nomem;
    bad = kvg_utf8_invalid_at((const unsigned char *)src, len);
    if (bad != (size_t)-1) {
        uint32_t line = 1, col = 1;
        for (size_t i = 0; i < bad; i++) {
            if (src[i] == '\n') {
                line++;
                col = 1;
            } else if (((unsigned char)src[i] & 0xC0) != 0x80) {
                col++;
            }
        }
        snprintf(msg, sizeof msg, "%u:%u: invalid UTF-8", line, col);
        goto fail;
    }
    if (jinja_lex(&t->arena, src, len, &toks, &ntoks, msg, sizeof msg) < 0)
        goto fail;
    t->root = jinja_parse(t, toks, ntoks, msg, sizeof msg);
    if (!t->root)
        goto fail;
    return t;
nomem:
    snprintf(msg, sizeof msg, "0:0: out of memory");
fail:
    if (err_len)
        snprintf(err, err_len, "%s:%s", name, msg[0] ? msg : "0:0: out of memory");
    kvg_jinja_free(t);
    return NULL;
}

void kvg_jinja_free(kvg_jinja *t)
{
    if (!t)
        return;
    ja_free(&t->arena);
    free(t->name);
    free(t);
}

void kvg_jinja_output_free(kvg_jinja_output *out)
{
    if (!out)
        return;
    free(out->text);
    free(out->spans);
    memset(out, 0, sizeof *out);
}

/* The output and its data spans, found with memchr over the taint mask. */
static int finish(const jsb *b, kvg_jinja_output *out)
{
    size_t cap = 0, i = 0;

    out->text = malloc(b->n + 1);
    if (!out->text)
        return -1;
    memcpy(out->text, b->p, b->n);
    out->text[b->n] = 0;
    out->len = b->n;
    if (!b->m || !b->ndata)
        return 0;
    while (i < b->n) {
        const uint8_t *d = memchr(b->m + i, 1, b->n - i);
        if (!d)
            break;
        size_t start = (size_t)(d - b->m);
        const uint8_t *e = memchr(d, 0, b->n - start);
        size_t end = e ? (size_t)(e - b->m) : b->n;
        if (out->n_spans == cap) {
            cap = cap ? cap * 2 : 16;
            kvg_text_span *sp = realloc(out->spans, cap * sizeof *sp);
            if (!sp)
                return -1;
            out->spans = sp;
        }
        out->spans[out->n_spans].off = start;
        out->spans[out->n_spans++].len = end - start;
        i = end;
    }
    return 0;
}

int kvg_jinja_render(const kvg_jinja *t, const json_t *trusted, const json_t *data,
                     const kvg_jinja_limits *lim, kvg_jinja_output *out,
                     char *err, size_t err_len)
{
    jctx ctx;
    jctx *volatile c = &ctx;
    jsb sb;
    int rc;

    memset(out, 0, sizeof *out);
    memset(&ctx, 0, sizeof ctx);
    if (err_len)
        err[0] = 0;
    c->t = t;
    c->err = err;
    c->err_len = err_len;
    c->trusted = trusted && json_is_object(trusted) ? trusted : NULL;
    c->data = data && json_is_object(data) ? data : NULL;
    c->max_output = lim && lim->max_output ? lim->max_output : KVG_JINJA_DEFAULT_MAX_OUTPUT;
    if (c->max_output > (1u << 31))
        c->max_output = 1u << 31;     /* a string's data count is kept in 32 bits */
    c->max_steps = lim && lim->max_steps ? lim->max_steps : KVG_JINJA_DEFAULT_MAX_STEPS;
    c->max_depth = lim && lim->max_depth ? lim->max_depth : KVG_JINJA_DEFAULT_MAX_DEPTH;
    c->now = lim && lim->now ? lim->now : time(NULL);
    /* everything a render makes is bounded by a multiple of the output limit */
    c->arena.limit = c->max_output * 8 + (1u << 20);
    c->stack_base = (const char *)__builtin_frame_address(0);
    rc = setjmp(c->jb);
    if (rc) {
        ja_free(&c->arena);
        kvg_jinja_output_free(out);
        return rc;
    }
    c->globals = jalloc(c, ((size_t)t->n_names + 1) * sizeof(jv));
    c->gdone = jalloc(c, (size_t)t->n_names + 1);
    memset(c->gdone, 0, (size_t)t->n_names + 1);
    c->scope = scope_new(c, NULL);
    jsb_init(c, &sb, 4096);
    c->out = &sb;
    exec(c, t->root);
    if (finish(&sb, out) < 0) {
        ja_free(&c->arena);
        kvg_jinja_output_free(out);
        snprintf(err, err_len, "%s: out of memory", t->name);
        return KVG_JINJA_NOMEM;
    }
    ja_free(&c->arena);
    return KVG_JINJA_OK;
}
