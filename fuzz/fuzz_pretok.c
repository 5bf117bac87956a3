/* libFuzzer target for the pre-tokenizers.
 *
 * Scanners: for every kind, the pieces must be non-empty, contiguous and cover
 * the input exactly; on valid UTF-8 every piece must itself be valid UTF-8 (a
 * split never cuts a character). Invalid UTF-8 is outside the contract but
 * must not crash or lose bytes.
 *
 * Regex pipelines (valid UTF-8 only: that is their contract, the encoder checks
 * it first): each scanner's regex text run on PCRE2 must split exactly as the
 * scanner does (a differential check of both); the GGUF pipelines that are
 * all-Isolated (DeepSeek LLM / V3, o200k, Kimi K2, falcon, tekken) must cover
 * the input as the scanners do; and a literal split with every behavior must
 * yield pieces in order, inside the input, each byte at most once. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct walk {
    const char *base;
    size_t off;
    int valid;
};

static int check_piece(void *ctx, const char *s, size_t len)
{
    struct walk *w = ctx;
    if (len == 0 || s != w->base + w->off)
        abort();
    if (w->valid && kvg_utf8_invalid_at((const unsigned char *)s, len) != (size_t)-1)
        abort();
    w->off += len;
    return 0;
}

/* Pieces in order and inside the input (some bytes may be dropped). */
static int check_ordered(void *ctx, const char *s, size_t len)
{
    struct walk *w = ctx;
    if (len == 0 || s < w->base + w->off)
        abort();
    w->off = (size_t)(s - w->base) + len;
    return 0;
}

/* The pieces' offsets, to compare two splits. */
struct record {
    const char *base;
    size_t n;
    uint32_t end[4096];
    int overflow;
};

static int record_piece(void *ctx, const char *s, size_t len)
{
    struct record *r = ctx;
    if (r->n == sizeof r->end / sizeof *r->end) {
        r->overflow = 1;
        return 0;
    }
    r->end[r->n++] = (uint32_t)(s + len - r->base);
    return 0;
}

static const char *const scanner_re[] = {
    [KVG_PRETOK_GPT2] = "(?:'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+)",
    [KVG_PRETOK_LLAMA3] = "(?:(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
                          " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)",
    [KVG_PRETOK_QWEN2] = "(?:(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                         " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)",
};

static const char *const pre_names[] = {
    "deepseek-llm", "deepseek-coder", "deepseek-v3", "gpt-4o", "kimi-k2", "falcon", "tekken",
    "qwen35", "starcoder",
};

#define N_PRE (sizeof pre_names / sizeof *pre_names)

static kvg_pretok_stage *re_stage[4];
static struct kvg_tokenizer pre[N_PRE];
static kvg_pretok_stage *lit_stage[5];

static void init(void)
{
    static int done;
    char err[200];
    if (done)
        return;
    done = 1;
    for (int k = KVG_PRETOK_GPT2; k <= KVG_PRETOK_QWEN2; k++) {
        re_stage[k] = calloc(1, sizeof *re_stage[k]);
        if (!re_stage[k] || kvg_pretok_stage_regex(re_stage[k], scanner_re[k], strlen(scanner_re[k]),
                                                   KVG_SPLIT_ISOLATED, 0, err, sizeof err) != 0
            || !re_stage[k]->re)
            abort();
    }
    for (size_t i = 0; i < N_PRE; i++)
        if (kvg_tok_gguf_pre(&pre[i], pre_names[i], strlen(pre_names[i]), err, sizeof err) != 0)
            abort();
    for (int b = KVG_SPLIT_ISOLATED; b <= KVG_SPLIT_CONTIGUOUS; b++) {
        lit_stage[b] = calloc(1, sizeof *lit_stage[b]);
        if (!lit_stage[b] || kvg_pretok_stage_literal(lit_stage[b], "a", 1, b, b & 1) != 0)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int valid = kvg_utf8_invalid_at(data, size) == (size_t)-1;
    for (int kind = KVG_PRETOK_GPT2; kind <= KVG_PRETOK_QWEN2; kind++) {
        struct walk w = { (const char *)data, 0, valid };
        if (kvg_pretok_split(kind, (const char *)data, size, check_piece, &w) != 0
            || w.off != size)
            abort();
    }
    if (!valid)
        return 0;
    init();
    const char *s = (const char *)data;
    for (int kind = KVG_PRETOK_GPT2; kind <= KVG_PRETOK_QWEN2; kind++) {
        static struct record a, b;
        a.base = b.base = s;
        a.n = b.n = 0;
        a.overflow = b.overflow = 0;
        if (kvg_pretok_split(kind, s, size, record_piece, &a) != 0
            || kvg_pretok_run(re_stage[kind], 1, s, size, record_piece, &b) != 0)
            abort();
        if (!a.overflow && !b.overflow
            && (a.n != b.n || memcmp(a.end, b.end, a.n * sizeof *a.end) != 0))
            abort();
    }
    for (size_t i = 0; i < N_PRE; i++) {
        struct walk w = { s, 0, 1 };
        int rc = pre[i].n_stages ? kvg_pretok_run(pre[i].stages, pre[i].n_stages, s, size, check_piece, &w)
                                 : kvg_pretok_split(pre[i].pretok, s, size, check_piece, &w);
        if (rc != 0 || w.off != size)
            abort();
    }
    for (int b = KVG_SPLIT_ISOLATED; b <= KVG_SPLIT_CONTIGUOUS; b++) {
        struct walk w = { s, 0, 1 };
        if (kvg_pretok_run(lit_stage[b], 1, s, size, check_ordered, &w) != 0)
            abort();
    }
    return 0;
}
