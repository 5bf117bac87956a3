/* Jinja tests ("x is defined", "x is divisibleby 3", ...), as Jinja2 3.1 defines
 * them; names resolve at compile time. */
#include "jinja_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "utf8.h"

#define UNUSED __attribute__((unused))

/* ---- tests ---- */

#define TEST(name) static int t_##name(UNUSED jctx *c, UNUSED const jnode *at, UNUSED const jv *x, \
                                   UNUSED const jcall *a)

TEST(defined) { return x->t != JT_UNDEF; }
TEST(undefined) { return x->t == JT_UNDEF; }
TEST(none) { return x->t == JT_NONE; }
TEST(string) { return x->t == JT_STR; }
TEST(number) { return x->t == JT_INT || x->t == JT_FLOAT || x->t == JT_BOOL; }
TEST(integer) { return x->t == JT_INT; }
TEST(float) { return x->t == JT_FLOAT; }
TEST(boolean) { return x->t == JT_BOOL; }
TEST(true) { return x->t == JT_BOOL && x->u.i; }
TEST(false) { return x->t == JT_BOOL && !x->u.i; }
TEST(mapping) { return jv_is_dict(x); }
TEST(iterable)
{
    return x->t == JT_STR || x->t == JT_LIST || x->t == JT_JLIST || jv_is_dict(x) ||
           x->t == JT_UNDEF;
}
TEST(sequence)
{
    return x->t == JT_STR || jv_is_list(x) || jv_is_dict(x) || x->t == JT_UNDEF;
}
TEST(callable)
{
    return x->t == JT_MACRO || x->t == JT_FUNC || x->t == JT_METHOD;
}
TEST(escaped) { return x->t == JT_STR && (x->flags & JF_SAFE); }

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

TEST(even) { return x->t == JT_FLOAT && x->u.f != floor(x->u.f) ? 0 : int_of(c, at, x) % 2 == 0; }
TEST(odd) { return x->t == JT_FLOAT && x->u.f != floor(x->u.f) ? 0 : int_of(c, at, x) % 2 != 0; }
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
    return jstr_all(&s, 'l');
}
TEST(upper)
{
    jv s = jv_to_str(c, at, x);
    return jstr_all(&s, 'u');
}
TEST(filter)
{
    return x->t == JT_STR && jinja_find_filter(x->u.s.p, x->u.s.n) != NULL;
}
TEST(test)
{
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
        jerr(c, KVG_JINJA_ERROR, at, "No test named '%.*s'.",
             (int)(name->u.s.n > 40 ? 40 : name->u.s.n),
             name->u.s.p);
    return t(c, at, x, rest);
}
