/* The Jinja engine's internals, shared by its files only:
 *   jinja_lex.c      source -> tokens (whitespace control, trim/lstrip blocks, raw)
 *   jinja_parse.c    tokens -> AST (one generic node type), names interned
 *   jinja_value.c    arena, values, strings with per-byte taint, Python str/repr
 *   jinja_render.c   evaluation of the AST into an output with data spans
 *   jinja_ops.c      attribute/item access, slices, membership, arithmetic
 *   jinja_filters.c, jinja_tests.c, jinja_methods.c: filters, tests, methods (by
 *                    name, resolved at compile time); jinja_str.c: str operations;
 *                    jinja_json.c: tojson
 *
 * Errors while rendering unwind with longjmp to kvg_jinja_render: every value lives
 * in the render's arena, so nothing needs cleaning on the way out, and each of the
 * hundreds of places that can fail stays one line. */
#ifndef KVG_JINJA_INTERNAL_H
#define KVG_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdint.h>
#include <stddef.h>

#include <jansson.h>

#include "jinja.h"

/* ---- arena: bump allocation in chunks, freed all at once ---- */

typedef struct ja_chunk {
    struct ja_chunk *next;
    size_t cap, used;
    max_align_t data[];
} ja_chunk;

typedef struct jarena {
    ja_chunk *head;
    size_t total;       /* bytes of all chunks */
    size_t limit;       /* 0: none; else ja_alloc fails past it */
} jarena;

void *ja_alloc(jarena *a, size_t n);     /* NULL when out of memory or over limit */
void ja_free(jarena *a);

/* ---- values ---- */

enum {
    JT_UNDEF, JT_NONE, JT_BOOL, JT_INT, JT_FLOAT, JT_STR,
    JT_LIST,            /* native list (tuple when JF_TUPLE) */
    JT_DICT,            /* native dict, insertion ordered */
    JT_JLIST,           /* a jansson array, converted item by item on access */
    JT_JDICT,           /* a jansson object */
    JT_NS,              /* namespace(): the one mutable object */
    JT_LOOP,            /* the loop variable of a for */
    JT_MACRO,
    JT_FUNC,            /* a global function (range, namespace, ...) */
    JT_METHOD           /* a method bound to its receiver: recv.name */
};

#define JF_TUPLE 1u     /* list printed as a tuple */
#define JF_GEN   2u     /* an iterator (select, map, reverse): truthy, has no len */
#define JF_DATA  4u     /* jansson container from data: its strings are data */
#define JF_SAFE  8u     /* string marked |safe (kept for |escape) */

/* String taint: which bytes came from data. */
#define JS_CLEAN 0      /* none */
#define JS_DATA  1      /* all */
#define JS_MASK  2      /* per byte: mask[i] != 0 */

struct jlist;
struct jdict;
struct jloop;
struct jmacro;

typedef struct jv {
    uint8_t t, flags, taint;
    uint32_t aux;                   /* JT_FUNC: function id */
    union {
        int64_t i;                  /* JT_BOOL, JT_INT */
        double f;
        struct { const char *p; size_t n; const uint8_t *mask; } s;
        struct jlist *l;
        struct jdict *d;            /* JT_DICT, JT_NS */
        json_t *j;
        struct jloop *loop;
        struct jmacro *m;
        struct { const struct jv *recv; const char *name; } meth;
        struct {                    /* why it is undefined, for the error if used */
            const char *msg;        /* the message, or NULL: */
            const char *name;       /* "'<aux type> object' has no attribute 'name'" */
        } undef;
    } u;
} jv;

typedef struct jlist {
    size_t n;
    jv *v;
} jlist;

typedef struct jdict {
    size_t n, cap;
    jv *k, *v;
} jdict;

typedef struct jloop {          /* the state behind a for's `loop` */
    size_t i, n;
    const jv *items;
} jloop;

/* ---- AST ---- */

enum {
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL,
    N_FILTER, N_TEST, N_BIN, N_NEG, N_POS, N_NOT, N_AND, N_OR, N_CMP, N_CONCAT,
    N_COND,
    /* statements */
    N_BODY, N_TEXT, N_PRINT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK,
    N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_WITH
};

/* N_BIN ops and N_CMP ops */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

struct jctx;
typedef struct jnode jnode;

/* A filter or test: args[0] is the operand; kwargs by name. */
typedef struct jcall {
    int npos;
    const jv *pos;
    int nkw;
    const char *const *kwname;
    const jv *kwval;
} jcall;

typedef jv (*jfilter_fn)(struct jctx *c, const jnode *at, const jv *x, const jcall *a);
typedef int (*jtest_fn)(struct jctx *c, const jnode *at, const jv *x, const jcall *a);

struct jnode {
    uint16_t kind, op;
    uint32_t line, col;
    jnode *a, *b, *c, *d, *e;   /* children; meaning per kind (see jinja_parse.c) */
    jnode **kids;               /* list items, call args, body statements, cmp operands */
    uint32_t nkids;
    uint32_t nkw;               /* keyword args: kwname[i] = kwval[i] */
    const char **kwname;
    jnode **kwval;
    const char *name;           /* N_NAME, N_ATTR, N_FILTER/N_TEST name, macro name */
    int id;                     /* N_NAME: interned name id */
    uint8_t *cmpops;            /* N_CMP: op per kids[1..] */
    jv val;                     /* N_CONST; N_TEXT text */
    jfilter_fn filter;
    jtest_fn test;
    int flag;                   /* N_FOR: has filter (c); N_SET: namespace attr */
};

struct kvg_jinja {
    jarena arena;
    jnode *root;
    char *name;
    const char **names;         /* interned names, by id */
    int n_names;
    int id_loop, id_caller, id_varargs, id_kwargs;  /* their name ids, -1: unused */
};

/* ---- render context ---- */

typedef struct jsb {            /* string builder with taint mask (arena memory) */
    char *p;
    uint8_t *m;                 /* NULL until a data byte is appended */
    size_t n, cap;
    size_t ndata;               /* how many of the n bytes are data */
} jsb;

typedef struct jscope {
    struct jscope *parent;
    int n, cap;
    int *ids;
    jv *vals;
} jscope;

typedef struct jctx {
    const kvg_jinja *t;
    jarena arena;
    jmp_buf jb;
    int rc;
    char *err;
    size_t err_len;
    const json_t *trusted, *data;
    jv *globals;                /* by name id: resolved from trusted/data on demand */
    uint8_t *gdone;
    jscope *scope;
    jsb *out;                   /* where output goes now (captures swap it) */
    size_t max_output;
    uint64_t steps, max_steps;
    unsigned depth, max_depth;  /* macro calls and value recursion */
    const char *stack_base;     /* where the render's stack starts (jstack_check) */
    time_t now;
} jctx;

/* C stack a render may use below kvg_jinja_render's frame: evaluation recurses
 * over the AST and nested values; past this it stops with KVG_JINJA_LIMIT. */
#define JINJA_STACK_BUDGET (512u << 10)
#define JINJA_PARSE_MAX_NEST 200

__attribute__((noreturn, format(printf, 4, 5)))
void jerr(jctx *c, int rc, const jnode *at, const char *fmt, ...);
void *jalloc(jctx *c, size_t n);
void jstep(jctx *c, const jnode *at);
void jsteps(jctx *c, const jnode *at, uint64_t k);   /* k steps of work at once */

__attribute__((noreturn)) void jstack_exceeded(jctx *c, const jnode *at);
static inline void jstack_check(jctx *c, const jnode *at)
{
    if ((size_t)(c->stack_base - (const char *)__builtin_frame_address(0)) > JINJA_STACK_BUDGET)
        jstack_exceeded(c, at);
}

/* values (jinja_value.c) */
jv jv_undef(const char *msg);
const char *jv_undef_msg(jctx *c, const jv *v);  /* the message of an undefined */
static inline jv jv_none(void) { jv v = { .t = JT_NONE }; return v; }
static inline jv jv_bool(int b) { jv v = { .t = JT_BOOL }; v.u.i = !!b; return v; }
static inline jv jv_int(int64_t i) { jv v = { .t = JT_INT }; v.u.i = i; return v; }
static inline jv jv_float(double f) { jv v = { .t = JT_FLOAT }; v.u.f = f; return v; }
static inline jv jv_strn(const char *p, size_t n, int taint)
{
    jv v = { .t = JT_STR, .taint = (uint8_t)(n ? taint : JS_CLEAN) };
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
jv jv_lit(const char *s);                       /* static/arena C string, clean */
jv jv_substr(const jv *s, size_t off, size_t n);
jv jv_from_json(json_t *j, int data);
jv jv_list_new(jctx *c, size_t n);              /* n items, to be filled */
jv jv_dict_new(jctx *c, size_t cap);
void jv_dict_set(jctx *c, jdict *d, const jv *k, const jv *v);
int jv_dict_get(jctx *c, const jv *d, const jv *k, jv *out);
int jv_dict_get_str(jctx *c, const jv *d, const char *k, size_t kn, jv *out);
int jv_is_list(const jv *v);                    /* list, tuple, json array (not gen) */
int jv_is_dict(const jv *v);                    /* dict, json object (not namespace) */
size_t jv_len(jctx *c, const jnode *at, const jv *v);
jv jv_list_at(jctx *c, const jv *l, size_t i);
jv *jv_items(jctx *c, const jnode *at, const jv *v, size_t *n);   /* iteration */
void jv_dict_keys_vals(jctx *c, const jv *d, jv **keys, jv **vals, size_t *n);
int jv_truthy(const jv *v);
int jv_eq(jctx *c, const jv *a, const jv *b);
int jv_cmp(jctx *c, const jnode *at, const jv *a, const jv *b);   /* <0 0 >0, error if unordered */
const char *jv_type_name(const jv *v);
int jv_is_str(const jv *v);
size_t jv_ncp(const jv *s);                     /* code points of a string */
size_t jv_cp_off(const jv *s, size_t cp);       /* byte offset of code point cp */

/* string builder */
void jsb_init(jctx *c, jsb *b, size_t cap);
void jsb_put(jctx *c, jsb *b, const char *p, size_t n, int data);
void jsb_putc(jctx *c, jsb *b, char ch);
void jsb_put_str(jctx *c, jsb *b, const jv *s);
void jsb_put_sub(jctx *c, jsb *b, const jv *s, size_t off, size_t n);
void jsb_put_fmt(jctx *c, jsb *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
jv jsb_str(jsb *b);                             /* the builder's bytes as a string value */
/* Python str() and repr() of v appended to b (data bytes keep their taint). */
void jv_str_into(jctx *c, const jnode *at, jsb *b, const jv *v);
void jv_repr_into(jctx *c, const jnode *at, jsb *b, const jv *v);
jv jv_to_str(jctx *c, const jnode *at, const jv *v);
void jfmt_float(double f, char *buf, size_t n);     /* Python repr of a float */

/* lexer / parser */
typedef struct jtok {
    uint8_t type, op;
    uint32_t line, col;
    const char *p;              /* name, text, string (decoded) */
    size_t n;
    int64_t i;
    double f;
} jtok;

enum { TK_EOF, TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
       TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP };

/* operator tokens (TK_OP .op) */
enum { P_ADD, P_SUB, P_DIV, P_FLOORDIV, P_MUL, P_POW, P_MOD, P_TILDE, P_LBRACKET,
       P_RBRACKET, P_LPAREN, P_RPAREN, P_LBRACE, P_RBRACE, P_EQ, P_NE, P_LT, P_LE,
       P_GT, P_GE, P_ASSIGN, P_DOT, P_COLON, P_PIPE, P_COMMA, P_SEMI };

int jinja_lex(jarena *a, const char *src, size_t len, jtok **toks, size_t *ntoks,
              char *err, size_t err_len);       /* err: "LINE:COL: msg" */
jnode *jinja_parse(kvg_jinja *t, const jtok *toks, size_t ntoks, char *err, size_t err_len);

/* arguments of filters, tests and methods (jinja_filters.c): positional i or
 * keyword name; the typed ones fail the render on a wrong type */
const jv *jarg(const jcall *a, int i, const char *name);
jv jarg_str(jctx *c, const jnode *at, const jv *v, const char *what);
int64_t jarg_int(jctx *c, const jnode *at, const jv *v, int64_t dflt, const char *what);
int jarg_bool(const jv *v, int dflt);
jv jarg_sstr(jctx *c, const jnode *at, const jv *v);     /* str(v), undefined: "" */
const char *jstr_z(jctx *c, const jv *s);               /* a NUL-terminated copy */
jv jinja_join(jctx *c, const jnode *at, const jv *sep, const jv *seq, const char *attr);
/* fmt % args, Python's printf-style formatting (%s %r %d %i %x %o %f %e %g %%);
 * mapping_ok: the one argument is a mapping, which may go unused */
jv jinja_percent(jctx *c, const jnode *at, const jv *fmt, const jv *args, int nargs,
                 int mapping_ok);
jv jinja_get_path(jctx *c, const jv *x, const jv *attr);  /* x.a.b / x[0] for map & co */

/* Python str operations keeping taint (jinja_str.c) */
enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE, CASE_JTITLE, CASE_SWAP };
size_t jstr_cp_at(const jv *s, size_t i, uint32_t *cp);   /* code point at byte i: length */
int jstr_isspace(uint32_t cp);
jv jstr_strip(jctx *c, const jnode *at, const jv *s, const jv *chars, int which); /* 1 l 2 r 3 */
jv jstr_case(jctx *c, const jv *s, int mode);
jv jstr_split(jctx *c, const jnode *at, const jv *s, const jv *sep, int64_t maxsplit, int right);
jv jstr_splitlines(jctx *c, const jv *s, int keepends);
jv jstr_replace(jctx *c, const jv *s, const jv *old, const jv *nw, int64_t count);
int64_t jstr_find(const jv *s, const jv *sub, int right);  /* code point index, -1 */
int64_t jstr_count(const jv *s, const jv *sub);
int jstr_all(const jv *s, int kind);    /* isdigit 'd', isnumeric 'n', isalpha 'a',
                                           isalnum 'A', isspace 's', isupper 'u', islower 'l' */
jv jstr_pad(jctx *c, const jnode *at, const jv *s, const jcall *a, int how);  /* center 'c'
                                           ljust 'l' rjust 'r' (jinja_methods.c) */

/* filters, tests (jinja_filters.c, jinja_tests.c), methods (jinja_methods.c) */
jfilter_fn jinja_find_filter(const char *name, size_t n);
jtest_fn jinja_find_test(const char *name, size_t n);
jv jinja_call_method(jctx *c, const jnode *at, const jv *recv, const char *name,
                     const jcall *a);
/* What a name is as a method, computed once per N_ATTR node (its .op): */
#define JM_STR        1u    /* a str method */
#define JM_DICT       2u
#define JM_LIST       4u
#define JM_DICT_UNSAFE 8u   /* a mutating method the immutable sandbox refuses */
#define JM_LIST_UNSAFE 16u
unsigned jinja_method_mask(const char *name);
int jinja_has_method(const jv *recv, unsigned mask);
int jinja_unsafe_method(const jv *recv, unsigned mask);
/* HTML-escapes s (& < > " '), marked safe: Markup's escape() */
jv jinja_html_escape(jctx *c, const jv *s);
jv jinja_tojson(jctx *c, const jnode *at, const jv *x, const jcall *a);
/* Applies the filter or test named name (map('upper'), select('odd')). */
jv jinja_apply_filter_by_name(jctx *c, const jnode *at, const jv *name, const jv *x,
                              const jcall *rest);
int jinja_apply_test_by_name(jctx *c, const jnode *at, const jv *name, const jv *x,
                             const jcall *rest);

/* operators (jinja_ops.c): which loop.NAME name is (0: none), for N_ATTR's flag */
int jinja_loop_attr(const char *name);
/* a op b with Python's rules (OP_ADD ... OP_POW) */
jv jinja_binop(jctx *c, const jnode *at, int op, const jv *a, const jv *b);
/* obj.name (mask: jinja_method_mask(name)), obj[key], obj[b:e:s], item in cont */
jv jinja_getattr(jctx *c, const jnode *at, const jv *obj, const char *name, unsigned mask);
jv jinja_getitem(jctx *c, const jnode *at, const jv *obj, const jv *key);
jv jinja_slice(jctx *c, const jnode *at, const jv *obj, const jv *b, const jv *e, const jv *s);
int jinja_contains(jctx *c, const jnode *at, const jv *item, const jv *cont);
__attribute__((noreturn)) void jinja_undef_error(jctx *c, const jnode *at, const jv *v);

/* render (jinja_render.c) */
/* call a macro or global function */
jv jinja_call_value(jctx *c, const jnode *at, const jv *fn, const jcall *a);

#endif
