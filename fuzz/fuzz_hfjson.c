/* libFuzzer target for the tokenizer.json loader: any bytes must give a
 * tokenizer or an error, never a crash, a leak or a hang.
 *
 * Raw JSON rarely gets past the first checks, so inputs that do not start with
 * '{' are used as building material for a structurally valid file instead:
 * fields separated by NUL bytes become vocabulary pieces, merges between them,
 * added tokens, the pipeline and the text to encode. Whatever loads is then
 * used: encode (with and without special tokens), decode and streaming decode,
 * which runs the BPE merge over fuzzed vocabularies too. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const regexes[] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "\\w+",
    /* regexes no scanner implements (PCRE2): o200k's shape, DeepSeek's digits
     * and CJK, an anchor, a lookahead */
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "\\s+$",
    "x*",
};

#define N_REGEXES (sizeof regexes / sizeof *regexes)

static const char *const behaviors[] = {
    "Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous",
};

typedef struct field {
    const char *s;
    size_t len;
} field;

static json_t *pipeline_pretok(unsigned sel)
{
    json_t *bl = json_pack("{s:s, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                           "use_regex", (sel & 4) == 0);
    switch (sel & 3) {
    case 0:
        return bl;
    case 1:
        /* a Split (regex or string, any behavior, maybe inverted), maybe Digits */
        if (sel & 128)
            return json_pack("{s:s, s:[{s:s, s:b}, {s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence",
                             "pretokenizers", "type", "Digits", "individual_digits", (sel & 8) != 0,
                             "type", "Split", "pattern", "String", (sel & 16) ? " " : "a",
                             "behavior", behaviors[(sel >> 4) % 5], "invert", (sel & 64) != 0, bl);
        return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence",
                         "pretokenizers", "type", "Split", "pattern", "Regex",
                         regexes[(sel >> 3) % N_REGEXES], "behavior", behaviors[(sel >> 2) % 5],
                         "invert", (sel & 64) != 0, bl);
    case 2:
        json_decref(bl);
        return json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement",
                         "\xe2\x96\x81", "prepend_scheme",
                         (sel & 8) ? "first" : (sel & 16) ? "always" : "never", "split", (sel & 32) != 0);
    default:
        json_decref(bl);
        return json_null();
    }
}

static char *build(const uint8_t *data, size_t size, field *text)
{
    field f[64];
    size_t nf = 0, start = 1;
    unsigned sel = data[0];
    for (size_t i = 1; i <= size && nf < 64; i++) {
        if (i == size || data[i] == 0) {
            f[nf].s = (const char *)data + start;
            f[nf].len = i - start;
            nf++;
            start = i + 1;
        }
    }
    if (nf == 0)
        return NULL;
    *text = f[nf - 1];          /* the last field is the text to encode */

    json_t *vocab = json_object();
    size_t nv = 0;
    for (size_t i = 0; i + 1 < nf; i++) {
        json_t *probe = json_stringn(f[i].s, f[i].len);   /* NULL unless valid UTF-8 */
        if (!probe || f[i].len == 0) {
            json_decref(probe);
            continue;
        }
        json_decref(probe);
        if (!json_object_getn(vocab, f[i].s, f[i].len))
            json_object_setn_new(vocab, f[i].s, f[i].len, json_integer((json_int_t)nv++));
    }
    /* Merges: every adjacent pair of pieces whose concatenation is a piece too,
     * plus one that may not be (bad merges must be refused, not crash). */
    json_t *merges = json_array();
    const char *key_a, *key_b;
    void *it_a = json_object_iter(vocab);
    char cat[512];
    while (it_a) {
        key_a = json_object_iter_key(it_a);
        size_t la = json_object_iter_key_len(it_a);
        void *it_b = json_object_iter(vocab);
        while (it_b) {
            key_b = json_object_iter_key(it_b);
            size_t lb = json_object_iter_key_len(it_b);
            if (la + lb < sizeof cat) {
                memcpy(cat, key_a, la);
                memcpy(cat + la, key_b, lb);
                if (json_object_getn(vocab, cat, la + lb)) {
                    if (sel & 16)
                        json_array_append_new(merges, json_pack("[s%, s%]", key_a, la, key_b, lb));
                    else if (!memchr(key_a, ' ', la) && !memchr(key_b, ' ', lb)) {
                        cat[la] = ' ';
                        memcpy(cat + la + 1, key_b, lb);
                        json_array_append_new(merges, json_stringn(cat, la + 1 + lb));
                    }
                }
            }
            it_b = json_object_iter_next(vocab, it_b);
        }
        it_a = json_object_iter_next(vocab, it_a);
    }
    if ((sel & 32) && nv > 0)
        json_array_append_new(merges, json_string("x y"));

    json_t *added = json_array();
    if (sel & 64)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b}", "id", (json_int_t)nv,
                                               "content", "<|special|>", "special", 1,
                                               "lstrip", (sel & 1) != 0, "rstrip", (sel & 4) != 0));
    if (sel & 128)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b}", "id", (json_int_t)nv + 1,
                                               "content", "<tool>", "special", 0,
                                               "single_word", (sel & 8) != 0, "rstrip", (sel & 2) != 0));
    json_t *normalizer = (sel & 3) == 3
        ? json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}", "type", "Sequence",
                    "normalizers", "type", "Prepend", "prepend", "\xe2\x96\x81",
                    "type", "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81")
        : (sel & 32) ? json_pack("{s:s}", "type", (sel & 16) ? "NFKC" : "NFC") : json_null();
    json_t *root = json_pack("{s:o, s:o, s:o, s:{s:s, s:b, s:o, s:o}}",
                             "added_tokens", added, "normalizer", normalizer,
                             "pre_tokenizer", pipeline_pretok(sel),
                             "model", "type", "BPE", "byte_fallback", (sel & 8) != 0,
                             "vocab", vocab, "merges", merges);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

static void exercise(const kvg_tokenizer *t, const char *text, size_t len)
{
    char err[256];
    if (kvg_utf8_invalid_at((const unsigned char *)text, len) != (size_t)-1)
        len = 0;
    for (unsigned flags = 0; flags < 4; flags++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (kvg_tokenizer_encode(t, text, len, flags, &ids, &n, err, sizeof err) != 0)
            abort();            /* valid UTF-8 must encode */
        char *out = NULL;
        size_t out_len = 0;
        if (kvg_tokenizer_decode(t, ids, n, &out, &out_len, err, sizeof err) == 0)
            free(out);
        kvg_detok d;
        char buf[4096];
        kvg_detok_init(&d, t);
        for (size_t i = 0; i < n; i++)
            if (kvg_detok_push(&d, ids[i], buf, sizeof buf) < 0)
                break;
        kvg_detok_flush(&d, buf, sizeof buf);
        free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    if (size == 0 || size > 1 << 16)
        return 0;
    if (data[0] == '{') {
        kvg_tokenizer *t = kvg_tokenizer_load_mem(data, size, "fuzz.json", err, sizeof err);
        if (t)
            exercise(t, "Hello, world! 123 \xe2\x96\x81x <tool>",
                     strlen("Hello, world! 123 \xe2\x96\x81x <tool>"));
        kvg_tokenizer_free(t);
        return 0;
    }
    field text;
    char *json = build(data, size, &text);
    if (!json)
        return 0;
    kvg_tokenizer *t = kvg_tokenizer_load_mem(json, strlen(json), "fuzz.json", err, sizeof err);
    free(json);
    if (t)
        exercise(t, text.s, text.len);
    kvg_tokenizer_free(t);
    return 0;
}
