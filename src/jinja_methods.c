/* The methods a template may call: str's (strip, split, startswith, format, ...),
 * dict's (items, keys, values, get) and list's (index, count), with Python's
 * semantics; the mutating ones (append, pop, update, ...) are refused as the
 * ImmutableSandboxedEnvironment refuses them. Which names are methods is worked
 * out per N_ATTR node at compile time (jinja_method_mask). */
#include "jinja_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "utf8.h"

static int affix(jctx *c, const jnode *at, const jv *s, const jv *arg, int end)
{
    if (arg && arg->t == JT_LIST && (arg->flags & JF_TUPLE)) {     /* a tuple of affixes */
        size_t n = jv_len(c, at, arg);
        for (size_t i = 0; i < n; i++) {
            jv x = jv_list_at(c, arg, i);
            if (affix(c, at, s, &x, end))
                return 1;
        }
        return 0;
    }
    jv p = jarg_str(c, at, arg, end ? "endswith's argument" : "startswith's argument");
    if (p.u.s.n > s->u.s.n)
        return 0;
    return !memcmp(s->u.s.p + (end ? s->u.s.n - p.u.s.n : 0), p.u.s.p, p.u.s.n);
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
                if (strlen(a->kwname[k]) == fe - fb &&
                    !memcmp(a->kwname[k], s->u.s.p + fb, fe - fb))
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

jv jstr_pad(jctx *c, const jnode *at, const jv *s, const jcall *a, int how)
{
    int64_t w = jarg_int(c, at, jarg(a, 0, "width"), 0, "width");
    const jv *f = jarg(a, 1, "fillchar");
    const char *fill = " ";
    int fill_data = 0;
    size_t fl = 1;
    int64_t n = (int64_t)jv_ncp(s);
    jsb b;

    if (f) {
        jv fs = jarg_str(c, at, f, "fillchar");
        if (jv_ncp(&fs) != 1)
            jerr(c, KVG_JINJA_ERROR, at, "The fill character must be exactly one character long");
        fill = fs.u.s.p;
        fill_data = fs.taint != JS_CLEAN;
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
        jsb_put(c, &b, fill, fl, fill_data);
    jsb_put_str(c, &b, s);
    for (int64_t i = left; i < total; i++)
        jsb_put(c, &b, fill, fl, fill_data);
    return jsb_str(&b);
}

static jv str_method(jctx *c, const jnode *at, const jv *s, const char *m, const jcall *a)
{
    if (!strcmp(m, "strip")) return jstr_strip(c, at, s, jarg(a, 0, "chars"), 3);
    if (!strcmp(m, "lstrip")) return jstr_strip(c, at, s, jarg(a, 0, "chars"), 1);
    if (!strcmp(m, "rstrip")) return jstr_strip(c, at, s, jarg(a, 0, "chars"), 2);
    if (!strcmp(m, "split") || !strcmp(m, "rsplit"))
        return jstr_split(c, at, s, jarg(a, 0, "sep"), jarg_int(c, at, jarg(a, 1, "maxsplit"), -1,
                        "maxsplit"), m[0] == 'r');
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith"))
        return jv_bool(affix(c, at, s, jarg(a, 0, NULL), m[0] == 'e'));
    if (!strcmp(m, "upper")) return jstr_case(c, s, CASE_UPPER);
    if (!strcmp(m, "lower") || !strcmp(m, "casefold")) return jstr_case(c, s, CASE_LOWER);
    if (!strcmp(m, "title")) return jstr_case(c, s, CASE_TITLE);
    if (!strcmp(m, "capitalize")) return jstr_case(c, s, CASE_CAPITALIZE);
    if (!strcmp(m, "swapcase")) return jstr_case(c, s, CASE_SWAP);
    if (!strcmp(m, "replace")) {
        jv o = jarg_str(c, at, jarg(a, 0, "old"), "replace's old");
        jv nw = jarg_str(c, at, jarg(a, 1, "new"), "replace's new");
        return jstr_replace(c, s, &o, &nw, jarg_int(c, at, jarg(a, 2, "count"), -1, "count"));
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex")) {
        jv sub = jarg_str(c, at, jarg(a, 0, NULL), "the substring");
        int64_t r = jstr_find(s, &sub, m[0] == 'r');
        if (r < 0 && strstr(m, "index"))
            jerr(c, KVG_JINJA_ERROR, at, "substring not found");
        return jv_int(r);
    }
    if (!strcmp(m, "count")) {
        jv sub = jarg_str(c, at, jarg(a, 0, NULL), "the substring");
        return jv_int(jstr_count(s, &sub));
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
        return jinja_join(c, at, s, seq, NULL);
    }
    if (!strcmp(m, "format")) return str_format(c, at, s, a);
    if (!strcmp(m, "isdigit")) return jv_bool(jstr_all(s, 'd'));
    if (!strcmp(m, "isdecimal")) return jv_bool(jstr_all(s, 'd'));
    if (!strcmp(m, "isnumeric")) return jv_bool(jstr_all(s, 'n'));
    if (!strcmp(m, "isalpha")) return jv_bool(jstr_all(s, 'a'));
    if (!strcmp(m, "isalnum")) return jv_bool(jstr_all(s, 'A'));
    if (!strcmp(m, "isspace")) return jv_bool(jstr_all(s, 's'));
    if (!strcmp(m, "isupper")) return jv_bool(jstr_all(s, 'u'));
    if (!strcmp(m, "islower")) return jv_bool(jstr_all(s, 'l'));
    if (!strcmp(m, "splitlines"))
        return jstr_splitlines(c, s, jarg_bool(jarg(a, 0, "keepends"), 0));
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        jv p = jarg_str(c, at, jarg(a, 0, NULL), "the affix");
        int end = m[6] == 's';
        if (p.u.s.n <= s->u.s.n &&
            !memcmp(s->u.s.p + (end ? s->u.s.n - p.u.s.n : 0), p.u.s.p, p.u.s.n))
            return jv_substr(s, end ? 0 : p.u.s.n, s->u.s.n - p.u.s.n);
        return *s;
    }
    if (!strcmp(m, "partition") || !strcmp(m, "rpartition")) {
        jv sep = jarg_str(c, at, jarg(a, 0, NULL), "the separator");
        jv r = jv_list_new(c, 3);
        int right = m[0] == 'r';
        if (!sep.u.s.n)
            jerr(c, KVG_JINJA_ERROR, at, "empty separator");
        r.flags = JF_TUPLE;
        int64_t cpi = jstr_find(s, &sep, right);
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
    if (!strcmp(m, "center")) return jstr_pad(c, at, s, a, 'c');
    if (!strcmp(m, "ljust")) return jstr_pad(c, at, s, a, 'l');
    if (!strcmp(m, "rjust")) return jstr_pad(c, at, s, a, 'r');
    if (!strcmp(m, "zfill")) {
        int64_t w = jarg_int(c, at, jarg(a, 0, NULL), 0, "width");
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
