/* The Jinja parser: tokens -> AST, with Jinja2's grammar and precedence:
 *
 *   expr     := or ['if' or ['else' expr]]
 *   or       := and ('or' and)*          and := not ('and' not)*
 *   not      := 'not' not | compare      compare := math1 (cmpop math1)*
 *   math1    := concat (('+'|'-') concat)*    concat := math2 ('~' math2)*
 *   math2    := pow (('*'|'/'|'//'|'%') pow)* pow := unary ('**' unary)*  (left assoc)
 *   unary    := ('-'|'+') unary_nofilter | primary postfix* (filter | test | call)*
 *
 * Node fields per kind (jnode in jinja_internal.h):
 *   N_CONST val; N_NAME name,id; N_LIST/N_TUPLE kids; N_DICT kids (key, value, ...)
 *   N_ATTR a.name; N_ITEM a[b]; N_SLICE a[b:c:d]; N_CALL a(kids, kw)
 *   N_FILTER a|name(kids, kw) (a NULL in a filter block: the body); N_TEST a is name(kids)
 *   N_BIN a op b; N_NEG/N_POS/N_NOT a; N_AND/N_OR a b; N_CMP kids, cmpops
 *   N_CONCAT kids; N_COND b if a else c (c NULL: undefined)
 *   N_BODY kids; N_TEXT val; N_PRINT a; N_IF a then b else c
 *   N_FOR a=target b=iter c=filter d=body e=else; N_SET a=target b=value
 *   N_SETBLOCK a=target b=body c=filter chain; N_MACRO name kids=params kwval=defaults b=body
 *   N_CALLBLOCK a=call b=body kids=caller params kwval=defaults; N_FILTERBLOCK a=chain b=body
 *   N_WITH kids=targets kwval=values b=body
 * Worked out here once so that rendering need not: N_ATTR's id (the name's length),
 * op (jinja_method_mask) and flag (jinja_loop_attr); N_ITEM's op for a literal key;
 * N_MACRO's flag (its body uses varargs or kwargs).
 *
 * Nesting is bounded (JINJA_PARSE_MAX_NEST): a template of 100k '(' is refused,
 * not a stack overflow. Unknown filters, tests and tags fail here. */
#include "jinja_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct parser {
    kvg_jinja *t;
    const jtok *tk;
    size_t pos, n;
    char *err;
    size_t err_len;
    int nest;
    int loops;                  /* for loops open (break/continue need one) */
    int names_cap;
    int *macro_uses;            /* while parsing a macro: varargs/kwargs seen */
    jmp_buf jb;
} parser;

__attribute__((noreturn, format(printf, 3, 4)))
static void pfail(parser *p, const jtok *at, const char *fmt, ...)
{
    char msg[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(p->err, p->err_len, "%u:%u: %s", at->line, at->col, msg);
    longjmp(p->jb, 1);
}

static void *palloc(parser *p, size_t n)
{
    void *r = ja_alloc(&p->t->arena, n);

    if (!r) {
        snprintf(p->err, p->err_len, "0:0: out of memory");
        longjmp(p->jb, 1);
    }
    memset(r, 0, n);
    return r;
}

static const jtok *cur(parser *p) { return &p->tk[p->pos]; }
static const jtok *peek(parser *p, size_t k)
{
    return &p->tk[p->pos + k < p->n ? p->pos + k : p->n - 1];
}
static const jtok *next(parser *p)
{
    const jtok *t = cur(p);
    if (p->pos + 1 < p->n)
        p->pos++;
    return t;
}

static int is_op(const jtok *t, int op) { return t->type == TK_OP && t->op == op; }
static int is_name(const jtok *t, const char *s)
{
    return t->type == TK_NAME && t->n == strlen(s) && memcmp(t->p, s, t->n) == 0;
}

static const char *tok_desc(const jtok *t)
{
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_TEXT: return "template text";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_NAME: return "a name";
    case TK_STRING: return "a string";
    case TK_INT: case TK_FLOAT: return "a number";
    default: return "an operator";
    }
}

static void expect_op(parser *p, int op, const char *what)
{
    if (!is_op(cur(p), op))
        pfail(p, cur(p), "expected '%s', got %s", what, tok_desc(cur(p)));
    next(p);
}

static void expect_type(parser *p, int type, const char *what)
{
    if (cur(p)->type != type)
        pfail(p, cur(p), "expected %s, got %s", what, tok_desc(cur(p)));
    next(p);
}

static void enter(parser *p)
{
    if (++p->nest > JINJA_PARSE_MAX_NEST)
        pfail(p, cur(p), "template nesting too deep (more than %d levels)", JINJA_PARSE_MAX_NEST);
}

static jnode *mk(parser *p, int kind, const jtok *at)
{
    jnode *n = palloc(p, sizeof *n);

    n->kind = (uint16_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static char *pstrdup(parser *p, const char *s, size_t n)
{
    char *r = palloc(p, n + 1);
    memcpy(r, s, n);
    return r;
}

static int intern(parser *p, const char *s, size_t n)
{
    kvg_jinja *t = p->t;

    for (int i = 0; i < t->n_names; i++)
        if (strlen(t->names[i]) == n && memcmp(t->names[i], s, n) == 0)
            return i;
    if (t->n_names == p->names_cap) {
        int cap = p->names_cap ? p->names_cap * 2 : 32;
        const char **nn = palloc(p, (size_t)cap * sizeof *nn);
        if (t->n_names)
            memcpy(nn, t->names, (size_t)t->n_names * sizeof *nn);
        t->names = nn;
        p->names_cap = cap;
    }
    t->names[t->n_names] = pstrdup(p, s, n);
    return t->n_names++;
}

/* growable node list */
typedef struct nlist { jnode **v; uint32_t n, cap; } nlist;

static void nl_push(parser *p, nlist *l, jnode *x)
{
    if (l->n == l->cap) {
        uint32_t cap = l->cap ? l->cap * 2 : 8;
        jnode **v = palloc(p, cap * sizeof *v);
        if (l->n)
            memcpy(v, l->v, l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

static jnode *parse_expr(parser *p);
static jnode *parse_unary(parser *p, int with_filter);
static jnode *parse_or(parser *p);
static jnode *parse_primary(parser *p);
static jnode *parse_postfix(parser *p, jnode *n);

static jnode *mk_name(parser *p, const jtok *t)
{
    jnode *n = mk(p, N_NAME, t);

    n->id = intern(p, t->p, t->n);
    n->name = p->t->names[n->id];
    if (p->macro_uses && (is_name(t, "varargs") || is_name(t, "kwargs")))
        *p->macro_uses = 1;
    return n;
}

/* call arguments after '(' : positional then keyword (name=expr) */
static void parse_args(parser *p, jnode *n)
{
    nlist pos = { 0 }, kwv = { 0 };
    const char **kwn = NULL;
    uint32_t nkw = 0, kwcap = 0;

    expect_op(p, P_LPAREN, "(");
    while (!is_op(cur(p), P_RPAREN)) {
        if (pos.n + nkw)
            expect_op(p, P_COMMA, ",");
        if (is_op(cur(p), P_RPAREN))
            break;
        if (is_op(cur(p), P_MUL) || is_op(cur(p), P_POW))
            pfail(p, cur(p), "*args and **kwargs in calls are not supported");
        if (cur(p)->type == TK_NAME && is_op(peek(p, 1), P_ASSIGN)) {
            const jtok *k = next(p);
            next(p);
            if (nkw == kwcap) {
                kwcap = kwcap ? kwcap * 2 : 4;
                const char **nk = palloc(p, kwcap * sizeof *nk);
                if (nkw)
                    memcpy(nk, kwn, nkw * sizeof *nk);
                kwn = nk;
            }
            kwn[nkw++] = pstrdup(p, k->p, k->n);
            nl_push(p, &kwv, parse_expr(p));
        } else {
            if (nkw)
                pfail(p, cur(p), "positional argument after keyword argument");
            nl_push(p, &pos, parse_expr(p));
        }
    }
    next(p);
    n->kids = pos.v;
    n->nkids = pos.n;
    n->kwname = kwn;
    n->kwval = kwv.v;
    n->nkw = nkw;
}

static jnode *parse_filter(parser *p, jnode *operand)
{
    const jtok *at = next(p);   /* '|' */
    const jtok *nm = cur(p);
    jnode *n;

    expect_type(p, TK_NAME, "a filter name");
    n = mk(p, N_FILTER, at);
    n->a = operand;
    n->name = pstrdup(p, nm->p, nm->n);
    n->filter = jinja_find_filter(nm->p, nm->n);
    if (!n->filter)
        pfail(p, nm, "no filter named '%s'", n->name);
    if (is_op(cur(p), P_LPAREN))
        parse_args(p, n);
    return n;
}

static jnode *parse_test(parser *p, jnode *operand)
{
    const jtok *at = next(p);   /* 'is' */
    int neg = 0;
    jnode *n;

    if (is_name(cur(p), "not")) {
        next(p);
        neg = 1;
    }
    const jtok *nm = cur(p);
    expect_type(p, TK_NAME, "a test name");
    n = mk(p, N_TEST, at);
    n->a = operand;
    n->name = pstrdup(p, nm->p, nm->n);
    n->test = jinja_find_test(nm->p, nm->n);
    if (!n->test)
        pfail(p, nm, "no test named '%s'", n->name);
    const jtok *t = cur(p);
    if (is_op(t, P_LPAREN)) {
        parse_args(p, n);
    } else if ((t->type == TK_NAME || t->type == TK_STRING || t->type == TK_INT ||
                t->type == TK_FLOAT || is_op(t, P_LPAREN) || is_op(t, P_LBRACKET) ||
                is_op(t, P_LBRACE)) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
        if (is_name(t, "is"))
            pfail(p, t, "You cannot chain multiple tests with is");
        jnode *arg = parse_postfix(p, parse_primary(p));
        n->kids = palloc(p, sizeof *n->kids);
        n->kids[0] = arg;
        n->nkids = 1;
    }
    if (neg) {
        jnode *m = mk(p, N_NOT, at);
        m->a = n;
        n = m;
    }
    return n;
}

static jnode *parse_subscript(parser *p, jnode *obj, const jtok *at)
{
    jnode *args[3] = { NULL, NULL, NULL };
    int colons = 0;

    /* [a], [a:b], [a:b:c], [:], [::-1], [a, b] (a tuple) */
    if (!is_op(cur(p), P_COLON)) {
        args[0] = parse_expr(p);
        if (is_op(cur(p), P_COMMA)) {
            jnode *tup = mk(p, N_TUPLE, at);
            nlist l = { 0 };
            nl_push(p, &l, args[0]);
            while (is_op(cur(p), P_COMMA)) {
                next(p);
                if (is_op(cur(p), P_RBRACKET))
                    break;
                nl_push(p, &l, parse_expr(p));
            }
            tup->kids = l.v;
            tup->nkids = l.n;
            args[0] = tup;
        }
    }
    while (is_op(cur(p), P_COLON) && colons < 2) {
        next(p);
        colons++;
        if (!is_op(cur(p), P_COLON) && !is_op(cur(p), P_RBRACKET))
            args[colons] = parse_expr(p);
    }
    expect_op(p, P_RBRACKET, "]");
    jnode *n = mk(p, colons ? N_SLICE : N_ITEM, at);
    n->a = obj;
    n->b = args[0];
    n->c = args[1];
    n->d = args[2];
    if (!colons && n->b->kind == N_CONST && n->b->val.t == JT_STR &&
        !memchr(n->b->val.u.s.p, 0, n->b->val.u.s.n))
        n->op = (uint16_t)jinja_method_mask(n->b->val.u.s.p);    /* x['name'] */
    return n;
}

static jnode *parse_postfix(parser *p, jnode *n)
{
    for (;;) {
        const jtok *t = cur(p);
        if (is_op(t, P_DOT)) {
            next(p);
            const jtok *nm = next(p);
            if (nm->type == TK_NAME) {
                jnode *m = mk(p, N_ATTR, t);
                m->a = n;
                m->name = pstrdup(p, nm->p, nm->n);
                m->op = (uint16_t)jinja_method_mask(m->name);
                m->id = (int)nm->n;     /* N_ATTR: the name's length */
                m->flag = jinja_loop_attr(m->name);
                n = m;
            } else if (nm->type == TK_INT) {
                jnode *m = mk(p, N_ITEM, t), *k = mk(p, N_CONST, nm);
                k->val = jv_int(nm->i);
                m->a = n;
                m->b = k;
                n = m;
            } else {
                pfail(p, nm, "expected a name after '.'");
            }
        } else if (is_op(t, P_LBRACKET)) {
            next(p);
            n = parse_subscript(p, n, t);
        } else if (is_op(t, P_LPAREN)) {
            jnode *m = mk(p, N_CALL, t);
            m->a = n;
            parse_args(p, m);
            n = m;
        } else {
            return n;
        }
    }
}

static jnode *parse_seq(parser *p, int kind, int close, const char *cs, const jtok *at)
{
    jnode *n = mk(p, kind, at);
    nlist l = { 0 };

    while (!is_op(cur(p), close)) {
        if (l.n)
            expect_op(p, P_COMMA, ",");
        if (is_op(cur(p), close))
            break;
        nl_push(p, &l, parse_expr(p));
        if (kind == N_DICT) {
            expect_op(p, P_COLON, ":");
            nl_push(p, &l, parse_expr(p));
        }
    }
    expect_op(p, close, cs);
    n->kids = l.v;
    n->nkids = l.n;
    return n;
}

static jnode *parse_primary(parser *p)
{
    const jtok *t = cur(p);
    jnode *n;

    enter(p);
    if (t->type == TK_NAME) {
        next(p);
        n = mk(p, N_CONST, t);
        if (is_name(t, "true") || is_name(t, "True"))
            n->val = jv_bool(1);
        else if (is_name(t, "false") || is_name(t, "False"))
            n->val = jv_bool(0);
        else if (is_name(t, "none") || is_name(t, "None"))
            n->val = jv_none();
        else
            n = mk_name(p, t);
    } else if (t->type == TK_STRING) {
        /* adjacent literals concatenate: "a" "b" */
        size_t len = 0, k = 0;
        while (peek(p, k)->type == TK_STRING)
            len += peek(p, k++)->n;
        char *s = palloc(p, len + 1);
        len = 0;
        while (cur(p)->type == TK_STRING) {
            memcpy(s + len, cur(p)->p, cur(p)->n);
            len += next(p)->n;
        }
        n = mk(p, N_CONST, t);
        n->val = jv_strn(s, len, JS_CLEAN);
    } else if (t->type == TK_INT) {
        next(p);
        n = mk(p, N_CONST, t);
        n->val = jv_int(t->i);
    } else if (t->type == TK_FLOAT) {
        next(p);
        n = mk(p, N_CONST, t);
        n->val = jv_float(t->f);
    } else if (is_op(t, P_LPAREN)) {
        next(p);
        if (is_op(cur(p), P_RPAREN)) {
            next(p);
            n = mk(p, N_TUPLE, t);
        } else {
            n = parse_expr(p);
            if (is_op(cur(p), P_COMMA)) {
                jnode *tup = mk(p, N_TUPLE, t);
                nlist l = { 0 };
                nl_push(p, &l, n);
                while (is_op(cur(p), P_COMMA)) {
                    next(p);
                    if (is_op(cur(p), P_RPAREN))
                        break;
                    nl_push(p, &l, parse_expr(p));
                }
                tup->kids = l.v;
                tup->nkids = l.n;
                n = tup;
            }
            expect_op(p, P_RPAREN, ")");
        }
    } else if (is_op(t, P_LBRACKET)) {
        next(p);
        n = parse_seq(p, N_LIST, P_RBRACKET, "]", t);
    } else if (is_op(t, P_LBRACE)) {
        next(p);
        n = parse_seq(p, N_DICT, P_RBRACE, "}", t);
    } else {
        pfail(p, t, "unexpected %s", tok_desc(t));
    }
    p->nest--;
    return n;
}

static jnode *parse_unary(parser *p, int with_filter)
{
    const jtok *t = cur(p);
    jnode *n;

    enter(p);
    if (is_op(t, P_SUB) || is_op(t, P_ADD)) {
        next(p);
        n = mk(p, is_op(t, P_SUB) ? N_NEG : N_POS, t);
        n->a = parse_unary(p, 0);
    } else {
        n = parse_postfix(p, parse_primary(p));
    }
    while (with_filter) {
        if (is_op(cur(p), P_PIPE))
            n = parse_filter(p, n);
        else if (is_name(cur(p), "is"))
            n = parse_test(p, n);
        else if (is_op(cur(p), P_LPAREN)) {
            jnode *m = mk(p, N_CALL, cur(p));
            m->a = n;
            parse_args(p, m);
            n = m;
        } else
            break;
    }
    p->nest--;
    return n;
}

static jnode *mk_bin(parser *p, const jtok *at, int op, jnode *a, jnode *b)
{
    jnode *n = mk(p, N_BIN, at);
    n->op = (uint16_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(parser *p)
{
    jnode *n = parse_unary(p, 1);
    while (is_op(cur(p), P_POW)) {
        const jtok *t = next(p);
        n = mk_bin(p, t, OP_POW, n, parse_unary(p, 1));
    }
    return n;
}

static jnode *parse_math2(parser *p)
{
    jnode *n = parse_pow(p);
    for (;;) {
        const jtok *t = cur(p);
        int op = is_op(t, P_MUL) ? OP_MUL : is_op(t, P_DIV) ? OP_DIV :
                 is_op(t, P_FLOORDIV) ? OP_FLOORDIV : is_op(t, P_MOD) ? OP_MOD : -1;
        if (op < 0)
            return n;
        next(p);
        n = mk_bin(p, t, op, n, parse_pow(p));
    }
}

static jnode *parse_concat(parser *p)
{
    jnode *n = parse_math2(p);
    if (!is_op(cur(p), P_TILDE))
        return n;
    jnode *c = mk(p, N_CONCAT, cur(p));
    nlist l = { 0 };
    nl_push(p, &l, n);
    while (is_op(cur(p), P_TILDE)) {
        next(p);
        nl_push(p, &l, parse_math2(p));
    }
    c->kids = l.v;
    c->nkids = l.n;
    return c;
}

static jnode *parse_math1(parser *p)
{
    jnode *n = parse_concat(p);
    for (;;) {
        const jtok *t = cur(p);
        int op = is_op(t, P_ADD) ? OP_ADD : is_op(t, P_SUB) ? OP_SUB : -1;
        if (op < 0)
            return n;
        next(p);
        n = mk_bin(p, t, op, n, parse_concat(p));
    }
}

static jnode *parse_compare(parser *p)
{
    jnode *first = parse_math1(p);
    nlist l = { 0 };
    uint8_t ops[64];
    const jtok *at = cur(p);

    for (;;) {
        const jtok *t = cur(p);
        int op = -1;
        if (t->type == TK_OP) {
            switch (t->op) {
            case P_EQ: op = OP_EQ; break;
            case P_NE: op = OP_NE; break;
            case P_LT: op = OP_LT; break;
            case P_LE: op = OP_LE; break;
            case P_GT: op = OP_GT; break;
            case P_GE: op = OP_GE; break;
            }
            if (op >= 0)
                next(p);
        } else if (is_name(t, "in")) {
            op = OP_IN;
            next(p);
        } else if (is_name(t, "not") && is_name(peek(p, 1), "in")) {
            op = OP_NOTIN;
            next(p);
            next(p);
        }
        if (op < 0)
            break;
        if (!l.n)
            nl_push(p, &l, first);
        if (l.n > 63)
            pfail(p, t, "comparison chain too long");
        ops[l.n] = (uint8_t)op;
        nl_push(p, &l, parse_math1(p));
    }
    if (!l.n)
        return first;
    jnode *n = mk(p, N_CMP, at);
    n->kids = l.v;
    n->nkids = l.n;
    n->cmpops = palloc(p, l.n);
    memcpy(n->cmpops, ops, l.n);
    n->line = first->line;
    n->col = first->col;
    return n;
}

static jnode *parse_not(parser *p)
{
    if (is_name(cur(p), "not")) {
        const jtok *t = next(p);
        jnode *n = mk(p, N_NOT, t);
        enter(p);
        n->a = parse_not(p);
        p->nest--;
        return n;
    }
    return parse_compare(p);
}

static jnode *parse_and(parser *p)
{
    jnode *n = parse_not(p);
    while (is_name(cur(p), "and")) {
        const jtok *t = next(p);
        jnode *m = mk(p, N_AND, t);
        m->a = n;
        m->b = parse_not(p);
        n = m;
    }
    return n;
}

static jnode *parse_or(parser *p)
{
    jnode *n = parse_and(p);
    while (is_name(cur(p), "or")) {
        const jtok *t = next(p);
        jnode *m = mk(p, N_OR, t);
        m->a = n;
        m->b = parse_and(p);
        n = m;
    }
    return n;
}

static jnode *parse_expr(parser *p)
{
    jnode *n;

    enter(p);
    n = parse_or(p);
    while (is_name(cur(p), "if")) {
        const jtok *t = next(p);
        jnode *c = mk(p, N_COND, t);
        c->b = n;
        c->a = parse_or(p);
        if (is_name(cur(p), "else")) {
            next(p);
            c->c = parse_expr(p);
        }
        n = c;
    }
    p->nest--;
    return n;
}

/* expr [, expr ...]: a tuple when there is a comma ({{ a, b }}, set x = a, b) */
static jnode *parse_tuple_expr(parser *p)
{
    const jtok *at = cur(p);
    jnode *n = parse_expr(p);

    if (!is_op(cur(p), P_COMMA))
        return n;
    jnode *tup = mk(p, N_TUPLE, at);
    nlist l = { 0 };
    nl_push(p, &l, n);
    while (is_op(cur(p), P_COMMA)) {
        next(p);
        if (cur(p)->type == TK_VAR_END || cur(p)->type == TK_BLOCK_END)
            break;
        nl_push(p, &l, parse_expr(p));
    }
    tup->kids = l.v;
    tup->nkids = l.n;
    return tup;
}

/* assignment targets: name, name.attr (set only), a, b / (a, b) */
static jnode *parse_target(parser *p, int allow_attr)
{
    const jtok *at = cur(p);
    nlist l = { 0 };
    int paren = 0;

    if (is_op(at, P_LPAREN)) {
        next(p);
        paren = 1;
    }
    for (;;) {
        const jtok *t = cur(p);
        expect_type(p, TK_NAME, "a variable name");
        jnode *n = mk_name(p, t);
        if (allow_attr && is_op(cur(p), P_DOT) && !paren && !l.n) {
            next(p);
            const jtok *a = cur(p);
            expect_type(p, TK_NAME, "an attribute name");
            jnode *m = mk(p, N_ATTR, t);
            m->a = n;
            m->name = pstrdup(p, a->p, a->n);
            return m;
        }
        nl_push(p, &l, n);
        if (!is_op(cur(p), P_COMMA))
            break;
        next(p);
        if (is_op(cur(p), P_RPAREN) || is_name(cur(p), "in") || is_op(cur(p), P_ASSIGN))
            break;
    }
    if (paren)
        expect_op(p, P_RPAREN, ")");
    if (l.n == 1 && !paren)
        return l.v[0];
    jnode *tup = mk(p, N_TUPLE, at);
    tup->kids = l.v;
    tup->nkids = l.n;
    return tup;
}

static jnode *parse_body(parser *p, const char *const *ends, const jtok **end_tok);

static void end_block(parser *p)
{
    expect_type(p, TK_BLOCK_END, "'%}'");
}

/* Parses "{% tag" ... up to the matching end, given the tag's name token. */
static jnode *parse_if(parser *p, const jtok *at)
{
    static const char *const ends[] = { "elif", "else", "endif", NULL };
    jnode *n = mk(p, N_IF, at);
    const jtok *e;

    n->a = parse_tuple_expr(p);
    end_block(p);
    n->b = parse_body(p, ends, &e);
    if (is_name(e, "elif")) {
        enter(p);
        n->c = parse_if(p, e);
        p->nest--;
        return n;
    }
    if (is_name(e, "else")) {
        static const char *const endif[] = { "endif", NULL };
        end_block(p);
        n->c = parse_body(p, endif, &e);
    }
    end_block(p);
    return n;
}

static jnode *parse_for(parser *p, const jtok *at)
{
    static const char *const ends[] = { "else", "endfor", NULL };
    static const char *const endfor[] = { "endfor", NULL };
    jnode *n = mk(p, N_FOR, at);
    const jtok *e;

    n->a = parse_target(p, 0);
    if (!is_name(cur(p), "in"))
        pfail(p, cur(p), "expected 'in'");
    next(p);
    /* the iterable: a tuple expression without the conditional 'if' */
    const jtok *it = cur(p);
    n->b = parse_or(p);
    if (is_op(cur(p), P_COMMA)) {
        jnode *tup = mk(p, N_TUPLE, it);
        nlist l = { 0 };
        nl_push(p, &l, n->b);
        while (is_op(cur(p), P_COMMA)) {
            next(p);
            nl_push(p, &l, parse_or(p));
        }
        tup->kids = l.v;
        tup->nkids = l.n;
        n->b = tup;
    }
    if (is_name(cur(p), "if")) {
        next(p);
        n->c = parse_expr(p);
    }
    if (is_name(cur(p), "recursive"))
        pfail(p, cur(p), "recursive loops are not supported");
    end_block(p);
    p->loops++;
    n->d = parse_body(p, ends, &e);
    p->loops--;
    if (is_name(e, "else")) {
        end_block(p);
        n->e = parse_body(p, endfor, &e);
    }
    end_block(p);
    return n;
}

/* A filter block's or set block's filters, "name(args) | name ...", applied to
 * the body: the innermost N_FILTER's operand is NULL. */
static jnode *parse_filter_chain(parser *p)
{
    jnode *n = NULL;

    for (;;) {
        const jtok *nm = cur(p);
        expect_type(p, TK_NAME, "a filter name");
        jnode *f = mk(p, N_FILTER, nm);
        f->a = n;
        f->name = pstrdup(p, nm->p, nm->n);
        f->filter = jinja_find_filter(nm->p, nm->n);
        if (!f->filter)
            pfail(p, nm, "no filter named '%s'", f->name);
        if (is_op(cur(p), P_LPAREN))
            parse_args(p, f);
        n = f;
        if (!is_op(cur(p), P_PIPE))
            return n;
        next(p);
    }
}

static jnode *parse_set(parser *p, const jtok *at)
{
    jnode *target = parse_target(p, 1);

    if (is_op(cur(p), P_ASSIGN)) {
        jnode *n = mk(p, N_SET, at);
        next(p);
        n->a = target;
        n->b = parse_tuple_expr(p);
        end_block(p);
        return n;
    }
    static const char *const ends[] = { "endset", NULL };
    const jtok *e;
    jnode *n = mk(p, N_SETBLOCK, at);
    if (target->kind != N_NAME)
        pfail(p, at, "a block set takes one name");
    n->a = target;
    if (is_op(cur(p), P_PIPE)) {
        next(p);
        n->c = parse_filter_chain(p);
    }
    end_block(p);
    n->b = parse_body(p, ends, &e);
    end_block(p);
    return n;
}

/* (a, b=default, ...) of a macro or a call block's caller */
static void parse_params(parser *p, jnode *n)
{
    nlist names = { 0 }, defs = { 0 };

    expect_op(p, P_LPAREN, "(");
    while (!is_op(cur(p), P_RPAREN)) {
        if (names.n)
            expect_op(p, P_COMMA, ",");
        if (is_op(cur(p), P_RPAREN))
            break;
        const jtok *t = cur(p);
        expect_type(p, TK_NAME, "a parameter name");
        nl_push(p, &names, mk_name(p, t));
        if (is_op(cur(p), P_ASSIGN)) {
            next(p);
            nl_push(p, &defs, parse_expr(p));
        } else {
            if (defs.n && defs.v[defs.n - 1])
                pfail(p, t, "parameter without a default after one with a default");
            nl_push(p, &defs, NULL);
        }
    }
    next(p);
    n->kids = names.v;
    n->nkids = names.n;
    n->kwval = defs.v;
    n->nkw = defs.n;
}

static jnode *parse_macro(parser *p, const jtok *at)
{
    static const char *const ends[] = { "endmacro", NULL };
    jnode *n = mk(p, N_MACRO, at);
    const jtok *nm = cur(p), *e;
    int uses = 0, *saved = p->macro_uses, loops = p->loops;

    expect_type(p, TK_NAME, "a macro name");
    n->id = intern(p, nm->p, nm->n);
    n->name = p->t->names[n->id];
    parse_params(p, n);
    end_block(p);
    p->macro_uses = &uses;
    p->loops = 0;
    n->b = parse_body(p, ends, &e);
    p->macro_uses = saved;
    p->loops = loops;
    n->flag = uses;
    if (cur(p)->type == TK_NAME)
        next(p);    /* {% endmacro name %} */
    end_block(p);
    return n;
}

static jnode *parse_callblock(parser *p, const jtok *at)
{
    static const char *const ends[] = { "endcall", NULL };
    jnode *n = mk(p, N_CALLBLOCK, at);
    const jtok *e;
    int loops = p->loops;

    if (is_op(cur(p), P_LPAREN))
        parse_params(p, n);
    n->a = parse_expr(p);
    if (n->a->kind != N_CALL)
        pfail(p, at, "expected a call");
    end_block(p);
    p->loops = 0;
    n->b = parse_body(p, ends, &e);
    p->loops = loops;
    end_block(p);
    return n;
}

static jnode *parse_statement(parser *p)
{
    const jtok *at = cur(p);        /* the tag's name */
    jnode *n;

    if (at->type != TK_NAME)
        pfail(p, at, "tag name expected");
    next(p);
    enter(p);
    if (is_name(at, "if")) {
        n = parse_if(p, at);
    } else if (is_name(at, "for")) {
        n = parse_for(p, at);
    } else if (is_name(at, "set")) {
        n = parse_set(p, at);
    } else if (is_name(at, "macro")) {
        n = parse_macro(p, at);
    } else if (is_name(at, "call")) {
        n = parse_callblock(p, at);
    } else if (is_name(at, "filter")) {
        static const char *const ends[] = { "endfilter", NULL };
        const jtok *e;
        n = mk(p, N_FILTERBLOCK, at);
        n->a = parse_filter_chain(p);
        end_block(p);
        n->b = parse_body(p, ends, &e);
        end_block(p);
    } else if (is_name(at, "with")) {
        static const char *const ends[] = { "endwith", NULL };
        nlist targets = { 0 }, values = { 0 };
        const jtok *e;
        n = mk(p, N_WITH, at);
        while (cur(p)->type != TK_BLOCK_END) {
            if (targets.n)
                expect_op(p, P_COMMA, ",");
            nl_push(p, &targets, parse_target(p, 0));
            expect_op(p, P_ASSIGN, "=");
            nl_push(p, &values, parse_expr(p));
        }
        n->kids = targets.v;
        n->nkids = targets.n;
        n->kwval = values.v;
        n->nkw = values.n;
        end_block(p);
        n->b = parse_body(p, ends, &e);
        end_block(p);
    } else if (is_name(at, "generation")) {
        static const char *const ends[] = { "endgeneration", NULL };
        const jtok *e;
        end_block(p);
        n = parse_body(p, ends, &e);
        end_block(p);
    } else if (is_name(at, "break") || is_name(at, "continue")) {
        if (!p->loops)
            pfail(p, at, "'%s' outside loop", is_name(at, "break") ? "break" : "continue");
        n = mk(p, is_name(at, "break") ? N_BREAK : N_CONTINUE, at);
        end_block(p);
    } else {
        pfail(p, at, "Encountered unknown tag '%.*s'", (int)(at->n > 40 ? 40 : at->n), at->p);
    }
    p->nest--;
    return n;
}

/* Statements until EOF (ends NULL) or "{% end" where end is in ends: then
 * *end_tok is that name token and the parser is just past it. */
static jnode *parse_body(parser *p, const char *const *ends, const jtok **end_tok)
{
    jnode *body = mk(p, N_BODY, cur(p));
    nlist l = { 0 };

    enter(p);
    for (;;) {
        const jtok *t = cur(p);
        if (t->type == TK_EOF) {
            if (ends)
                pfail(p, t, "unexpected end of template, expected '%s'", ends[0]);
            break;
        }
        if (t->type == TK_TEXT) {
            jnode *n = mk(p, N_TEXT, t);
            n->val = jv_strn(t->p, t->n, JS_CLEAN);
            nl_push(p, &l, n);
            next(p);
        } else if (t->type == TK_VAR_BEGIN) {
            next(p);
            jnode *n = mk(p, N_PRINT, t);
            n->a = parse_tuple_expr(p);
            expect_type(p, TK_VAR_END, "'}}'");
            nl_push(p, &l, n);
        } else if (t->type == TK_BLOCK_BEGIN) {
            const jtok *nm = peek(p, 1);
            int is_end = 0;
            for (int i = 0; ends && ends[i]; i++)
                is_end |= is_name(nm, ends[i]);
            if (is_end) {
                next(p);
                *end_tok = next(p);
                break;
            }
            if (nm->type == TK_NAME && nm->n > 3 && memcmp(nm->p, "end", 3) == 0) {
                if (ends)
                    pfail(p, nm, "unexpected '%.*s', expected '%s'", (int)(nm->n > 40 ? 40 : nm->n),
                          nm->p, ends[0]);
                pfail(p, nm, "unexpected '%.*s'", (int)(nm->n > 40 ? 40 : nm->n), nm->p);
            }
            if (nm->type == TK_NAME && (is_name(nm, "else") || is_name(nm, "elif")))
                pfail(p, nm, "unexpected '%.*s'", (int)nm->n, nm->p);
            next(p);
            nl_push(p, &l, parse_statement(p));
        } else {
            pfail(p, t, "unexpected %s", tok_desc(t));
        }
    }
    p->nest--;
    body->kids = l.v;
    body->nkids = l.n;
    return body;
}

static int find_name(const kvg_jinja *t, const char *name)
{
    for (int i = 0; i < t->n_names; i++)
        if (!strcmp(t->names[i], name))
            return i;
    return -1;
}

jnode *jinja_parse(kvg_jinja *t, const jtok *toks, size_t ntoks, char *err, size_t err_len)
{
    parser p = { .t = t, .tk = toks, .n = ntoks, .err = err, .err_len = err_len };
    jnode *root;

    if (setjmp(p.jb))
        return NULL;
    root = parse_body(&p, NULL, NULL);
    /* the names the renderer binds itself, if the template uses them */
    t->id_loop = find_name(t, "loop");
    t->id_caller = find_name(t, "caller");
    t->id_varargs = find_name(t, "varargs");
    t->id_kwargs = find_name(t, "kwargs");
    return root;
}
