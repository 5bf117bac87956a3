/* Pre-tokenizer pipelines (pretok_re.c): the split behaviors and invert on a
 * literal and a regex (expected pieces from Hugging Face's documentation of
 * SplitDelimiterBehavior), PCRE2 against the hand-written scanners on the same
 * regex text (wrapped in a group so that the scanner is not chosen), the
 * Oniguruma semantics the regex path must keep (\s = White_Space, (?i) folding
 * U+017F, line anchors), sequences of splits, every GGUF pre name's regexes
 * compiling, and the same splits from several threads at once. */
#include <pthread.h>
#include <stdint.h>

#include "tap.h"
#include "tok_internal.h"

#define MAXP 256

struct pieces {
    char buf[4096];
    size_t o;
    size_t n;
    int empty;
};

static int collect(void *ctx, const char *s, size_t len)
{
    struct pieces *ps = ctx;
    if (len == 0)
        ps->empty = 1;
    if (ps->n && ps->o + 1 < sizeof ps->buf)
        ps->buf[ps->o++] = '|';
    for (size_t k = 0; k < len && ps->o + 1 < sizeof ps->buf; k++)
        ps->buf[ps->o++] = s[k];
    ps->buf[ps->o] = '\0';
    ps->n++;
    return 0;
}

static void split_to(const kvg_pretok_stage *st, size_t n_st, const char *in, size_t len,
                     struct pieces *ps)
{
    memset(ps, 0, sizeof *ps);
    if (kvg_pretok_run(st, n_st, in, len, collect, ps) != 0)
        snprintf(ps->buf, sizeof ps->buf, "(error)");
}

static void check_stages(const kvg_pretok_stage *st, size_t n_st, const char *in, const char *want,
                         const char *what)
{
    struct pieces ps;
    split_to(st, n_st, in, strlen(in), &ps);
    if (!ok(strcmp(ps.buf, want) == 0 && !ps.empty, "%s", what)) {
        diag("  in   %s", in);
        diag("  want %s", want);
        diag("  got  %s%s", ps.buf, ps.empty ? " (with an empty piece)" : "");
    }
}

static void check_lit(const char *lit, int behavior, int invert, const char *in, const char *want,
                      const char *what)
{
    kvg_pretok_stage *st = calloc(1, sizeof *st);
    if (!st || kvg_pretok_stage_literal(st, lit, strlen(lit), behavior, invert) != 0) {
        ok(0, "%s: literal stage", what);
        free(st);
        return;
    }
    check_stages(st, 1, in, want, what);
    kvg_pretok_stages_free(st, 1);
}

static void check_re(const char *re, int behavior, int invert, const char *in, const char *want,
                     const char *what)
{
    char err[256];
    kvg_pretok_stage *st = calloc(1, sizeof *st);
    if (!st || kvg_pretok_stage_regex(st, re, strlen(re), behavior, invert, err, sizeof err) != 0) {
        ok(0, "%s: regex compiles", what);
        diag("  %s", err);
        free(st);
        return;
    }
    check_stages(st, 1, in, want, what);
    kvg_pretok_stages_free(st, 1);
}

static void test_behaviors(void)
{
    const char *in = "the-final--countdown";
    check_lit("-", KVG_SPLIT_ISOLATED, 0, in, "the|-|final|-|-|countdown", "Isolated");
    check_lit("-", KVG_SPLIT_REMOVED, 0, in, "the|final|countdown", "Removed");
    check_lit("-", KVG_SPLIT_MERGED_PREV, 0, in, "the-|final-|-|countdown", "MergedWithPrevious");
    check_lit("-", KVG_SPLIT_MERGED_NEXT, 0, in, "the|-final|-|-countdown", "MergedWithNext");
    check_lit("-", KVG_SPLIT_CONTIGUOUS, 0, in, "the|-|final|--|countdown", "Contiguous");
    check_lit("-", KVG_SPLIT_REMOVED, 1, in, "-|-|-", "Removed, inverted");
    check_lit("-", KVG_SPLIT_MERGED_PREV, 0, "-a-", "-|a-", "MergedWithPrevious, match first");
    check_lit("-", KVG_SPLIT_MERGED_NEXT, 0, "a-", "a|-", "MergedWithNext, match last");
    check_lit("xyz", KVG_SPLIT_ISOLATED, 0, "no match here", "no match here", "no match");
    check_re("-+", KVG_SPLIT_MERGED_NEXT, 0, in, "the|-final|--countdown", "regex MergedWithNext");
    check_re("[a-z]+", KVG_SPLIT_ISOLATED, 1, in, "the|-|final|--|countdown", "regex inverted");
    /* Gemma 3's shape: a split on a space (after its normalizer, none is left) */
    check_lit(" ", KVG_SPLIT_MERGED_PREV, 0, "a b  c", "a |b | |c", "space MergedWithPrevious");
    /* An empty match splits nothing. */
    check_re("x*", KVG_SPLIT_ISOLATED, 0, "abxxc", "ab|xx|c", "empty matches skipped");
}

static void test_semantics(void)
{
    /* \s: the White_Space set, NEL and ideographic space in, U+001C out */
    check_re("\\s+", KVG_SPLIT_ISOLATED, 0, "a\xc2\x85" "b\xe3\x80\x80" "c\x1c" "d",
             "a|\xc2\x85|b|\xe3\x80\x80|c\x1c" "d", "\\s is White_Space");
    /* (?i) folds U+017F LATIN SMALL LETTER LONG S to s, as Oniguruma does */
    check_re("(?i:'s)|\\p{L}+", KVG_SPLIT_ISOLATED, 0, "it'\xc5\xbf", "it|'\xc5\xbf", "(?i) folds long s");
    /* Unicode 15 letters (Kawi U+11F04..) and a Unicode 16 one are letters, as in
     * the reference's tables, on PCRE2 (whose own tables are older) ... */
    check_re("\\p{L}+|[^\\p{L}]+", KVG_SPLIT_ISOLATED, 0, "a\xf0\x91\xbc\x84\xf0\x91\xbc\x85 b\xf0\x9e\x93\x90",
             "a\xf0\x91\xbc\x84\xf0\x91\xbc\x85| |b\xf0\x9e\x93\x90", "newer letters in \\p{L} and out of [^\\p{L}]");
    check_re("\\P{L}+", KVG_SPLIT_ISOLATED, 0, "1\xf0\x91\xbc\x84" "2", "1|\xf0\x91\xbc\x84|2", "\\P{L} outside a class");
    /* ... and on the scanners (utf8proc's tables, older still) */
    {
        struct pieces ps;
        memset(&ps, 0, sizeof ps);
        kvg_pretok_split(KVG_PRETOK_GPT2, " a\xf0\x91\xbc\x84 x", 8, collect, &ps);
        ok(strcmp(ps.buf, " a\xf0\x91\xbc\x84| x") == 0, "scanner: a newer letter is a letter (%s)", ps.buf);
    }
    /* $ is a line anchor (Ruby syntax), before \n only */
    check_re("\\s+$", KVG_SPLIT_ISOLATED, 0, "a  \nb \r", "a|  |\nb| \r", "$ before \\n");
    /* a lookahead sees only its piece: the earlier stage cut before the x */
    kvg_pretok_stage *two = calloc(2, sizeof *two), st[1];
    char err[200];
    int rc = !two || kvg_pretok_stage_regex(&two[0], "x", 1, KVG_SPLIT_ISOLATED, 0, err, sizeof err)
             || kvg_pretok_stage_regex(&two[1], "\\s+(?!\\S)|\\s+", 14, KVG_SPLIT_ISOLATED, 0, err,
                                       sizeof err);
    if (ok(rc == 0, "two stages compile"))
        check_stages(two, 2, "a  x", "a|  |x", "lookahead stops at the piece's end");
    kvg_pretok_stages_free(two, two ? 2 : 0);
    ok(kvg_pretok_stage_regex(&st[0], "[\\p{L}&&[^a]]", 13, KVG_SPLIT_ISOLATED, 0, err, sizeof err) < 0
       && strstr(err, "intersection"), "class intersection refused (%s)", err);
    ok(kvg_pretok_stage_regex(&st[0], "(", 1, KVG_SPLIT_ISOLATED, 0, err, sizeof err) < 0
       && strstr(err, "does not compile"), "bad regex refused (%s)", err);
}

/* Starcoder's two splits: digits one by one, then GPT-2's. */
static void test_sequence(void)
{
    char err[200];
    kvg_pretok_stage *st = calloc(2, sizeof *st);
    static const char gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
    if (!st || kvg_pretok_stage_regex(&st[0], "\\p{N}", 5, KVG_SPLIT_ISOLATED, 0, err, sizeof err)
        || kvg_pretok_stage_regex(&st[1], gpt2, sizeof gpt2 - 1, KVG_SPLIT_ISOLATED, 0, err, sizeof err)) {
        ok(0, "starcoder stages");
        free(st);
        return;
    }
    ok(st[1].scanner == KVG_PRETOK_GPT2 && !st[1].re, "GPT-2 regex runs on its scanner");
    ok(st[0].re && !st[0].scanner, "\\p{N} runs on PCRE2");
    check_stages(st, 2, "abc 12 x's", "abc| |1|2| x|'s", "digits then GPT-2");
    kvg_pretok_stages_free(st, 2);
}

/* ---- PCRE2 against the scanners ---- */

static const char *const scanner_re[] = {
    [KVG_PRETOK_GPT2] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    [KVG_PRETOK_LLAMA3] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
                          " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    [KVG_PRETOK_QWEN2] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                         " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

static const char *const tricky[] = {
    "", " ", "  ", "\t", "\n", "\n\n", " \n", "a \n b", "Hello world", " Hello  world ",
    "I'm they're WE'LL it'S o'\xc5\xbf", "'", "''s", "x'", "12345678 1,000.5", "\xd9\xa1\xd9\xa2\xd9\xa3",
    "a\r\n\r\nb", "  \t\n  x", "\xc2\xa0\xc2\xa0y", "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c",
    "\xf0\x9f\x98\x80\xf0\x9f\x98\x80 ok", "(x)=>{return 1;}", "   \n\n   \n", "a\xc2\x85" "b",
    "caf\x65\xcc\x81 na\xc3\xafve", ".,;!? ...", "x\n\n\n", " ?!\r\n", "\xe2\x80\x83\xe2\x80\x83z",
};

static void test_against_scanners(void)
{
    for (int kind = KVG_PRETOK_GPT2; kind <= KVG_PRETOK_QWEN2; kind++) {
        char wrapped[512], err[200];
        snprintf(wrapped, sizeof wrapped, "(?:%s)", scanner_re[kind]);
        kvg_pretok_stage *st = calloc(1, sizeof *st);
        if (!st || kvg_pretok_stage_regex(st, wrapped, strlen(wrapped), KVG_SPLIT_ISOLATED, 0, err,
                                          sizeof err) != 0 || !st->re) {
            ok(0, "kind %d compiles on PCRE2: %s", kind, err);
            free(st);
            continue;
        }
        ok(kvg_pretok_scanner_for(scanner_re[kind], strlen(scanner_re[kind])) == kind,
           "kind %d: its regex text picks its scanner", kind);
        int same = 1;
        for (size_t i = 0; i < sizeof tricky / sizeof *tricky; i++) {
            struct pieces a, b;
            split_to(st, 1, tricky[i], strlen(tricky[i]), &a);
            memset(&b, 0, sizeof b);
            kvg_pretok_split(kind, tricky[i], strlen(tricky[i]), collect, &b);
            if (strcmp(a.buf, b.buf) != 0) {
                same = 0;
                diag("  kind %d on '%s': regex %s, scanner %s", kind, tricky[i], a.buf, b.buf);
            }
        }
        ok(same, "kind %d: PCRE2 splits every tricky string as the scanner does", kind);
        kvg_pretok_stages_free(st, 1);
    }
}

/* ---- GGUF names ---- */

static void test_gguf_names(void)
{
    static const char *const names[] = {
        "gpt-2", "default", "mpt", "llama3", "llama-bpe", "llama-v3", "falcon3", "pixtral", "lfm2",
        "qwen2", "deepseek-r1-qwen", "qwen35", "gpt-4o", "llama4", "tekken", "kimi-k2", "glm4",
        "deepseek-v3", "deepseek-llm", "deepseek-coder", "falcon", "starcoder", "refact", "command-r",
        "dbrx", "smaug-bpe", "stablelm2", "olmo", "chatglm-bpe", "exaone", "smollm",
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        struct kvg_tokenizer t;
        char err[200] = "";
        memset(&t, 0, sizeof t);
        int rc = kvg_tok_gguf_pre(&t, names[i], strlen(names[i]), err, sizeof err);
        if (!ok(rc == 0 && (t.pretok || t.n_stages), "pre '%s' has a pipeline", names[i]))
            diag("  rc %d: %s", rc, err);
        kvg_pretok_stages_free(t.stages, t.n_stages);
    }
    struct kvg_tokenizer t;
    char err[200];
    memset(&t, 0, sizeof t);
    ok(kvg_tok_gguf_pre(&t, "no-such-model", 13, err, sizeof err) == 1, "unknown pre name -> 1");
    /* the flags llama.cpp sets with the names */
    static const struct {
        const char *name;
        int ignore_merges, add_bos, bos_cleared;
    } flags[] = {
        { "llama-bpe", 1, 1, 0 }, { "tekken", 1, 1, 0 }, { "qwen2", 0, 0, 0 },
        { "glm4", 0, 0, 1 }, { "dbrx", 0, 0, 0 }, { "gpt-4o", 0, 0, 0 },
    };
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        memset(&t, 0, sizeof t);
        t.bos = 7;
        kvg_tok_gguf_pre(&t, flags[i].name, strlen(flags[i].name), err, sizeof err);
        ok(t.ignore_merges == flags[i].ignore_merges && t.add_bos == flags[i].add_bos
           && (t.bos == -1) == flags[i].bos_cleared, "%s: ignore_merges %d, add_bos %d, bos %d",
           flags[i].name, t.ignore_merges, t.add_bos, t.bos);
        kvg_pretok_stages_free(t.stages, t.n_stages);
    }
    /* o200k splits words at case changes; tekken keeps digits single */
    memset(&t, 0, sizeof t);
    if (kvg_tok_gguf_pre(&t, "gpt-4o", 6, err, sizeof err) == 0) {
        check_stages(t.stages, t.n_stages, "HTTPServer getX I'M 12345 a/b\n",
                     "HTTPServer| get|X| I'M| |123|45| a|/b|\n", "o200k");
        kvg_pretok_stages_free(t.stages, t.n_stages);
    }
    memset(&t, 0, sizeof t);
    if (kvg_tok_gguf_pre(&t, "kimi-k2", 7, err, sizeof err) == 0) {
        check_stages(t.stages, t.n_stages, "Hi\xe4\xbd\xa0\xe5\xa5\xbd" "ab 123",
                     "Hi|\xe4\xbd\xa0\xe5\xa5\xbd|ab| |123", "kimi-k2: Han apart from letters");
        kvg_pretok_stages_free(t.stages, t.n_stages);
    }
}

/* ---- threads ---- */

typedef struct thr {
    const kvg_pretok_stage *st;
    size_t n_st;
    int same;
    const char *want[sizeof tricky / sizeof *tricky];
} thr;

static void *thread_main(void *p)
{
    thr *t = p;
    t->same = 1;
    for (int round = 0; round < 200; round++)
        for (size_t i = 0; i < sizeof tricky / sizeof *tricky; i++) {
            struct pieces ps;
            split_to(t->st, t->n_st, tricky[i], strlen(tricky[i]), &ps);
            if (strcmp(ps.buf, t->want[i]) != 0)
                t->same = 0;
        }
    return NULL;
}

static void test_threads(void)
{
    struct kvg_tokenizer t;
    char err[200];
    memset(&t, 0, sizeof t);
    if (kvg_tok_gguf_pre(&t, "deepseek-v3", 11, err, sizeof err) != 0) {
        ok(0, "deepseek-v3 pipeline");
        return;
    }
    static struct pieces want[sizeof tricky / sizeof *tricky];
    thr th[4];
    for (size_t i = 0; i < sizeof tricky / sizeof *tricky; i++)
        split_to(t.stages, t.n_stages, tricky[i], strlen(tricky[i]), &want[i]);
    pthread_t id[4];
    for (int k = 0; k < 4; k++) {
        th[k].st = t.stages;
        th[k].n_st = t.n_stages;
        for (size_t i = 0; i < sizeof tricky / sizeof *tricky; i++)
            th[k].want[i] = want[i].buf;
        pthread_create(&id[k], NULL, thread_main, &th[k]);
    }
    int same = 1;
    for (int k = 0; k < 4; k++) {
        pthread_join(id[k], NULL);
        same &= th[k].same;
    }
    ok(same, "4 threads split alike with one compiled pipeline");
    kvg_pretok_stages_free(t.stages, t.n_stages);
}

int main(void)
{
    test_behaviors();
    test_semantics();
    test_sequence();
    test_against_scanners();
    test_gguf_names();
    test_threads();
    return done_testing();
}
