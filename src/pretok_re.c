/* Pre-tokenizer pipelines: a sequence of splits, each applied to every piece
 * the previous one produced, as Hugging Face's pre_tokenizers.Sequence of
 * Split (and llama.cpp's list of regexes per vocabulary) do.
 *
 * A stage is one of
 *   - a hand-written scanner (pretok.c) for the regexes it covers, which is
 *     many times faster than a regex engine: used whenever the file's regex is
 *     textually one of them and the split is Isolated;
 *   - the file's own regex on PCRE2 (UTF + UCP, JIT-compiled at load), so that
 *     the next model's pattern needs no code;
 *   - a literal string (HF Split on {"String": ...}).
 * Each stage sees only the piece it splits, as in HF: a lookahead such as
 * \s+(?!\S) cannot look past the end of its piece.
 *
 * HF's regex engine is Oniguruma (Ruby syntax). For the patterns real files
 * use, PCRE2 with PCRE2_UTF|PCRE2_UCP agrees with it: \s is the Unicode
 * White_Space set (U+0085 included, U+001C..U+001F not), \p{L}/\p{N}/\p{M}/
 * \p{P}/\p{S} are general categories, (?i:'s) folds U+017F to 's', and
 * leftmost-first alternation with greedy backtracking is the same. Ruby's ^
 * and $ are line anchors, hence PCRE2_MULTILINE with \n as the only newline.
 * Oniguruma's class intersection (&&) has no PCRE2 10.42 equivalent and is
 * refused rather than misread as literal '&'.
 *
 * Matching memory is per thread (match data and a JIT stack), so encoding stays
 * thread-safe: the compiled patterns are read-only once loaded. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "ucd_extra.h"
#include "utf8.h"

/* The JIT stack a thread may grow to: patterns with repeated groups (e.g.
 * (?:\p{L}\p{M}*)+) use a frame per repetition. Past it the interpreter
 * (heap-based) takes over for that match. */
#define JIT_STACK_START (32u << 10)
#define JIT_STACK_MAX (4u << 20)

/* ---------------- per-thread matching memory ---------------- */

typedef struct re_tls {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *stack;
} re_tls;

static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static int tls_key_ok;
static __thread re_tls *tls;

static void tls_destroy(void *p)
{
    re_tls *r = p;
    pcre2_match_data_free(r->md);
    pcre2_match_context_free(r->mctx);
    pcre2_jit_stack_free(r->stack);
    free(r);
}

static void tls_key_init(void)
{
    tls_key_ok = pthread_key_create(&tls_key, tls_destroy) == 0;
}

static re_tls *thread_re(void)
{
    if (tls)
        return tls;
    pthread_once(&tls_once, tls_key_init);
    re_tls *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    /* One pair is enough: only the whole match's offsets are read. */
    r->md = pcre2_match_data_create(1, NULL);
    r->mctx = pcre2_match_context_create(NULL);
    r->stack = pcre2_jit_stack_create(JIT_STACK_START, JIT_STACK_MAX, NULL);
    if (!r->md || !r->mctx) {
        tls_destroy(r);
        return NULL;
    }
    if (r->stack)
        pcre2_jit_stack_assign(r->mctx, NULL, r->stack);
    if (tls_key_ok)
        pthread_setspecific(tls_key, r);
    tls = r;
    return r;
}

/* ---------------- compiling ---------------- */

/* The hand-written scanners and the regex texts they implement. llama.cpp
 * spells the case-insensitive contractions out ('[sS]...), and its GPT-2
 * pattern drops the final \s+, which changes no split under Isolated (the
 * whitespace it would match is a gap piece of its own then). */
static const struct {
    int kind;
    const char *re;
} scanners[] = {
    { KVG_PRETOK_GPT2, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+" },
    { KVG_PRETOK_GPT2, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)" },
    { KVG_PRETOK_LLAMA3, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
                         " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
    { KVG_PRETOK_LLAMA3, "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
                         "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
                         " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
    { KVG_PRETOK_QWEN2, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                        " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
    { KVG_PRETOK_QWEN2, "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
                        "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                        " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
};

int kvg_pretok_scanner_for(const char *re, size_t len)
{
    for (size_t i = 0; i < sizeof scanners / sizeof *scanners; i++)
        if (strlen(scanners[i].re) == len && memcmp(scanners[i].re, re, len) == 0)
            return scanners[i].kind;
    return KVG_PRETOK_NONE;
}

/* Whether the pattern uses Oniguruma's class intersection "&&" inside a
 * bracket expression (outside one, && is two literal ampersands in both). */
static int has_class_intersection(const char *re, size_t len)
{
    int depth = 0;
    for (size_t i = 0; i < len; i++) {
        if (re[i] == '\\') {
            i++;
            continue;
        }
        if (re[i] == '[')
            depth++;
        else if (re[i] == ']' && depth > 0)
            depth--;
        else if (depth > 0 && re[i] == '&' && i + 1 < len && re[i + 1] == '&')
            return 1;
    }
    return 0;
}

/* Patterns that backtrack quadratically as written, and forms with the same
 * matches that do not. \s+$ (DeepSeek LLM) tries every start inside a long
 * whitespace run that does not end the line, each to the run's end; but a
 * match that starts inside a run could always start at the run's first
 * whitespace, which is further left, so leftmost-first only ever matches from
 * a run start: guarding the start with (?<!\s) keeps the matches and makes the
 * scan linear. */
static const struct {
    const char *from, *to;
} faster[] = {
    { "\\s+$", "(?<!\\s)\\s+$" },
};

/* A JIT-compiled regex (HF/Oniguruma syntax, see the top); NULL with err. */
static pcre2_code *compile(const char *re, size_t len, char *err, size_t err_len)
{
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, len, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE,
                                     &ec, &eo, cc);
    pcre2_compile_context_free(cc);
    if (!code) {
        PCRE2_UCHAR msg[120];
        pcre2_get_error_message(ec, msg, sizeof msg);
        snprintf(err, err_len, "regex \"%.60s\" does not compile at offset %zu: %s", re,
                 (size_t)eo, (const char *)msg);
        return NULL;
    }
    /* Without JIT (not built in, or no executable memory) the interpreter
     * gives the same matches, slower. */
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    return code;
}

/* A growable string. */
typedef struct sbuf {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

/* The pattern with each \p{X} widened by the characters that the reference's
 * Unicode tables have in X and PCRE2's do not yet (ucd_extra.c): inside a
 * class the extra ranges join it, outside \p{X} becomes [\p{X}...] and \P{X}
 * [^\p{X}...]. (\P{X} inside a class is left as it is.) NULL when out of
 * memory; *out_len is the new length. */
static char *widen_props(const char *re, size_t len, size_t *out_len)
{
    sbuf b = { 0 };
    int in_class = 0;
    sb_add(&b, "", 0);
    for (size_t i = 0; i < len;) {
        char c = re[i];
        if (c == '\\' && i + 1 < len && (re[i + 1] == 'p' || re[i + 1] == 'P') && i + 2 < len) {
            size_t name = i + 2, name_len = 1, end = i + 3;
            if (re[i + 2] == '{') {
                const char *close = memchr(re + i + 3, '}', len - i - 3);
                if (!close) {
                    sb_add(&b, re + i, len - i);
                    break;
                }
                name = i + 3;
                name_len = (size_t)(close - (re + name));
                end = (size_t)(close - re) + 1;
            }
            const char *extra = kvg_ucd_extra_class(re + name, name_len);
            if (!extra || (in_class && re[i + 1] == 'P')) {
                sb_add(&b, re + i, end - i);
            } else {
                if (!in_class)
                    sb_str(&b, re[i + 1] == 'P' ? "[^" : "[");
                sb_str(&b, "\\p{");
                sb_add(&b, re + name, name_len);
                sb_str(&b, "}");
                sb_str(&b, extra);
                if (!in_class)
                    sb_str(&b, "]");
            }
            i = end;
            continue;
        }
        if (c == '\\' && i + 1 < len && re[i + 1] == 'Q') {
            /* \Q...\E is literal text */
            const char *e = memmem(re + i + 2, len - i - 2, "\\E", 2);
            size_t end = e ? (size_t)(e - re) + 2 : len;
            sb_add(&b, re + i, end - i);
            i = end;
            continue;
        }
        if (c == '\\') {
            sb_add(&b, re + i, i + 1 < len ? 2 : 1);
            i += 2;
            continue;
        }
        if (!in_class && c == '[') {
            /* a ']' first in the class is literal */
            size_t j = i + 1;
            if (j < len && re[j] == '^')
                j++;
            if (j < len && re[j] == ']')
                j++;
            sb_add(&b, re + i, j - i);
            in_class = 1;
            i = j;
            continue;
        }
        if (in_class && c == '[' && i + 1 < len && re[i + 1] == ':') {
            const char *e = memmem(re + i + 2, len - i - 2, ":]", 2);
            size_t end = e ? (size_t)(e - re) + 2 : len;
            sb_add(&b, re + i, end - i);
            i = end;
            continue;
        }
        if (in_class && c == ']')
            in_class = 0;
        sb_add(&b, &c, 1);
        i++;
    }
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    *out_len = b.n;
    return b.s;
}

/* Which pieces can hold a match of `code` (the stage's pattern, or one whose
 * matches include the stage's): most pieces, for a digit, CJK or punctuation
 * split, cannot, and skip the matcher. For each ASCII byte a, and each pair of
 * ASCII bytes a b, an anchored partial match on that text alone says whether
 * some match can begin with it; characters beyond ASCII are assumed to begin
 * one. A lookbehind could see text before the match that this test does not
 * have, so patterns with one get no filter. */
static void build_filter(kvg_pretok_stage *st, const pcre2_code *code)
{
    uint32_t lookbehind = 1;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md || pcre2_pattern_info(code, PCRE2_INFO_MAXLOOKBEHIND, &lookbehind) != 0 || lookbehind) {
        pcre2_match_data_free(md);
        return;
    }
    memset(st->first + 16, 0xff, 16);
    for (unsigned a = 0; a < 128; a++) {
        unsigned char text[2] = { (unsigned char)a, 0 };
        int rc = pcre2_match(code, text, 1, 0, PCRE2_ANCHORED | PCRE2_PARTIAL_SOFT, md, NULL);
        if (rc < 0 && rc != PCRE2_ERROR_PARTIAL)
            continue;
        st->first[a >> 3] |= (uint8_t)(1u << (a & 7));
        for (unsigned b = 0; b < 128; b++) {
            text[1] = (unsigned char)b;
            rc = pcre2_match(code, text, 2, 0, PCRE2_ANCHORED | PCRE2_PARTIAL_SOFT, md, NULL);
            if (rc >= 0 || rc == PCRE2_ERROR_PARTIAL)
                st->pair[a][b >> 3] |= (uint8_t)(1u << (b & 7));
        }
    }
    st->has_first = 1;
    pcre2_match_data_free(md);
}

int kvg_pretok_stage_regex(kvg_pretok_stage *st, const char *re, size_t len, int behavior,
                           int invert, char *err, size_t err_len)
{
    const char *orig = re;
    size_t orig_len = len;
    for (size_t i = 0; i < sizeof faster / sizeof *faster; i++)
        if (strlen(faster[i].from) == len && memcmp(faster[i].from, re, len) == 0) {
            re = faster[i].to;
            len = strlen(re);
        }
    memset(st, 0, sizeof *st);
    st->behavior = (uint8_t)behavior;
    st->invert = (uint8_t)!!invert;
    if (behavior == KVG_SPLIT_ISOLATED && !invert
        && (st->scanner = kvg_pretok_scanner_for(re, len)) != KVG_PRETOK_NONE)
        return 0;
    if (has_class_intersection(re, len)) {
        snprintf(err, err_len, "regex class intersection (&&) is not supported: \"%.60s\"", re);
        return -1;
    }
    pcre2_code *code = compile(re, len, err, err_len), *plain = NULL;
    if (!code)
        return -1;
    size_t wide_len;
    char *wide = widen_props(re, len, &wide_len);
    if (!wide) {
        pcre2_code_free(code);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    if (wide_len != len) {
        /* The widened classes are slower to match: the pattern as written
         * stays for pieces without a newer character (has_newer_char). */
        plain = code;
        code = compile(wide, wide_len, err, err_len);
        if (!code) {
            pcre2_code_free(plain);
            free(wide);
            return -1;
        }
    }
    free(wide);
    st->re = code;
    st->re_ascii = plain;
    /* The filter of a faster rewrite comes from the pattern as the file has it
     * (the rewrite only adds a lookbehind, which rules matches out). ASCII
     * pairs match alike with and without the widened classes. */
    if (orig != re) {
        pcre2_code *o = compile(orig, orig_len, err, err_len);
        if (o) {
            build_filter(st, o);
            pcre2_code_free(o);
        }
    } else {
        build_filter(st, plain ? plain : code);
    }
    return 0;
}

int kvg_pretok_stage_literal(kvg_pretok_stage *st, const char *s, size_t len, int behavior,
                             int invert)
{
    memset(st, 0, sizeof *st);
    st->behavior = (uint8_t)behavior;
    st->invert = (uint8_t)!!invert;
    if (!(st->lit = malloc(len ? len : 1)))
        return -1;
    memcpy(st->lit, s, len);
    st->lit_len = len;
    return 0;
}

void kvg_pretok_stages_free(kvg_pretok_stage *st, size_t n)
{
    for (size_t i = 0; st && i < n; i++) {
        pcre2_code_free(st[i].re);
        pcre2_code_free(st[i].re_ascii);
        free(st[i].lit);
    }
    free(st);
}

/* ---------------- running ---------------- */

typedef struct run {
    const kvg_pretok_stage *st;
    size_t n_st;
    kvg_pretok_emit emit;
    void *ctx;
    re_tls *r;
} run;

static int run_stage(const run *R, size_t k, const char *s, size_t n);

/* A scanner's pieces go on to the next stage. */
typedef struct scan_next {
    const run *R;
    size_t k;
} scan_next;

static int scan_emit(void *ctx, const char *s, size_t n)
{
    const scan_next *sn = ctx;
    return run_stage(sn->R, sn->k, s, n);
}

/* Turns the stream of (gap | match) elements into pieces by the split
 * behaviour (HF SplitDelimiterBehavior), holding back at most one piece:
 *   Isolated     every element is a piece;
 *   Removed      matches are dropped;
 *   MergedWithPrevious  a match joins the gap before it;
 *   MergedWithNext      a match joins the gap after it;
 *   Contiguous   consecutive matches form one piece. */
typedef struct splitter {
    const run *R;
    size_t next;                 /* stage the pieces go to */
    int behavior;
    const char *base;
    size_t held_off, held_len;   /* the held piece, if have_held */
    int have_held, held_match;
    int prev_match;
} splitter;

static int sp_flush(splitter *sp)
{
    if (!sp->have_held)
        return 0;
    sp->have_held = 0;
    return sp->held_len ? run_stage(sp->R, sp->next, sp->base + sp->held_off, sp->held_len) : 0;
}

static int sp_hold(splitter *sp, size_t off, size_t len, int is_match)
{
    int rc = sp_flush(sp);
    sp->have_held = 1;
    sp->held_off = off;
    sp->held_len = len;
    sp->held_match = is_match;
    return rc;
}

static int sp_element(splitter *sp, size_t off, size_t len, int is_match)
{
    int rc = 0;
    switch (sp->behavior) {
    case KVG_SPLIT_REMOVED:
        if (!is_match && len)
            rc = run_stage(sp->R, sp->next, sp->base + off, len);
        break;
    case KVG_SPLIT_MERGED_PREV:
        if (is_match && !sp->prev_match && sp->have_held) {
            sp->held_len = off + len - sp->held_off;
        } else {
            rc = sp_hold(sp, off, len, is_match);
        }
        break;
    case KVG_SPLIT_MERGED_NEXT:
        if (!is_match && sp->have_held && sp->held_match) {
            sp->held_len = off + len - sp->held_off;
            rc = sp_flush(sp);
        } else {
            rc = sp_hold(sp, off, len, is_match);
        }
        break;
    case KVG_SPLIT_CONTIGUOUS:
        if (is_match == sp->prev_match && sp->have_held)
            sp->held_len = off + len - sp->held_off;
        else
            rc = sp_hold(sp, off, len, is_match);
        break;
    default:                    /* Isolated */
        if (len)
            rc = run_stage(sp->R, sp->next, sp->base + off, len);
        break;
    }
    sp->prev_match = is_match;
    return rc;
}

/* Next match of stage st in s[0..n) at or after `from`: 1 with [*ms, *me),
 * 0 when there is none, -1 on a matching error. */
static int next_match(const run *R, const kvg_pretok_stage *st, const pcre2_code *code,
                      const char *s, size_t n, size_t from, size_t *ms, size_t *me)
{
    if (st->lit) {
        if (st->lit_len == 0 || from >= n)
            return 0;
        const char *hit = memmem(s + from, n - from, st->lit, st->lit_len);
        if (!hit)
            return 0;
        *ms = (size_t)(hit - s);
        *me = *ms + st->lit_len;
        return 1;
    }
    int rc = pcre2_jit_match(code, (PCRE2_SPTR)s, n, from, 0, R->r->md, R->r->mctx);
    if (rc == PCRE2_ERROR_JIT_BADOPTION || rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, R->r->md, R->r->mctx);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0)
        return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(R->r->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* One char's length at s[i] (1 for a stray byte, so the scan always moves). */
static size_t char_len(const char *s, size_t n, size_t i)
{
    int l = kvg_utf8_seq_len((unsigned char)s[i]);
    return l > 0 && (size_t)l <= n - i ? (size_t)l : 1;
}

/* Whether a match of st can start anywhere in s[0..n) (see build_filter). */
static int may_match(const kvg_pretok_stage *st, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n; i++) {
        unsigned a = u[i];
        if (a >= 0x80)
            return 1;
        if (!(st->first[a >> 3] >> (a & 7) & 1))
            continue;
        if (i + 1 == n || u[i + 1] >= 0x80)
            return 1;
        unsigned b = u[i + 1];
        if (st->pair[a][b >> 3] >> (b & 7) & 1)
            return 1;
    }
    return 0;
}

/* Whether s[0..n) holds a character that the widened pattern classifies
 * differently (ucd_extra.c): without one, the pattern as written matches alike. */
static int has_newer_char(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int l = kvg_utf8_decode(u + i, n - i, &cp);
        if (l <= 0)
            return 1;
        if (kvg_ucd_extra_any(cp))
            return 1;
        i += (size_t)l;
    }
    return 0;
}

static int split_by(const run *R, size_t k, const char *s, size_t n)
{
    const kvg_pretok_stage *st = &R->st[k];
    /* No match: the piece is one gap, which every behavior keeps whole. */
    if (st->re && st->has_first && !st->invert && !may_match(st, s, n))
        return run_stage(R, k + 1, s, n);
    splitter sp = { .R = R, .next = k + 1, .behavior = st->behavior, .base = s };
    size_t pos = 0, from = 0;
    int rc = 0;
    const pcre2_code *code = st->re_ascii && !has_newer_char(s, n) ? st->re_ascii : st->re;

    while (from <= n) {
        size_t ms, me;
        int m = next_match(R, st, code, s, n, from, &ms, &me);
        if (m < 0)
            return -1;
        if (m == 0)
            break;
        if (me == ms) {
            /* An empty match splits nothing; look again one character on. */
            if (ms >= n)
                break;
            from = ms + char_len(s, n, ms);
            continue;
        }
        if (ms > pos && (rc = sp_element(&sp, pos, ms - pos, st->invert)) != 0)
            return rc;
        if ((rc = sp_element(&sp, ms, me - ms, !st->invert)) != 0)
            return rc;
        pos = from = me;
    }
    if (pos < n && (rc = sp_element(&sp, pos, n - pos, st->invert)) != 0)
        return rc;
    return sp_flush(&sp);
}

static int run_stage(const run *R, size_t k, const char *s, size_t n)
{
    if (n == 0)
        return 0;
    if (k == R->n_st)
        return R->emit(R->ctx, s, n);
    const kvg_pretok_stage *st = &R->st[k];
    if (st->scanner) {
        scan_next sn = { R, k + 1 };
        return kvg_pretok_split(st->scanner, s, n, scan_emit, &sn);
    }
    return split_by(R, k, s, n);
}

int kvg_pretok_run(const kvg_pretok_stage *st, size_t n_st, const char *s, size_t n,
                   kvg_pretok_emit emit, void *ctx)
{
    run R = { st, n_st, emit, ctx, NULL };
    for (size_t i = 0; i < n_st; i++)
        if (st[i].re && !(R.r = thread_re()))
            return -1;
    return run_stage(&R, 0, s, n);
}

void kvg_tok_set_stages(struct kvg_tokenizer *t, kvg_pretok_stage *st, size_t n)
{
    kvg_pretok_stages_free(t->stages, t->n_stages);
    t->stages = NULL;
    t->n_stages = 0;
    t->pretok = KVG_PRETOK_NONE;
    if (n == 1 && st[0].scanner) {
        t->pretok = st[0].scanner;
        kvg_pretok_stages_free(st, n);
        return;
    }
    t->stages = st;
    t->n_stages = n;
}
