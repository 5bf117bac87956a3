/* Tokenizer edge cases: broken files of each format, small hand-made GGUF
 * vocabularies whose encodings are worked out by hand (ties, byte fallback,
 * unknown characters, user-defined and special tokens, ignore_merges), invalid
 * UTF-8, bad ids, and the streaming decoder's corner cases. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_builder.h"
#include "tap.h"
#include "tok_internal.h"
#include "tokenizer.h"
#include "utf8.h"
#include "tokenizer_testing.h"

static int same_ids(const int32_t *got, size_t n, const int32_t *want, size_t n_want)
{
    return n == n_want && (n == 0 || memcmp(got, want, n * sizeof *got) == 0);
}

#define IDS(...) ((const int32_t[]){ __VA_ARGS__ }), (sizeof((const int32_t[]){ __VA_ARGS__ }) / sizeof(int32_t))

static void expect(const kvg_tokenizer *t, const char *text, unsigned flags, const int32_t *want, size_t n_want,
                   const char *name)
{
    int32_t *ids;
    size_t n;
    char err[256];
    if (kvg_tokenizer_encode(t, text, strlen(text), flags, &ids, &n, err, sizeof err) < 0) {
        ok(0, "%s", name);
        diag("  %s", err);
        return;
    }
    if (!ok(same_ids(ids, n, want, n_want), "%s", name)) {
        char buf[512];
        size_t o = 0;
        for (size_t i = 0; i < n && o < 400; i++)
            o += (size_t)snprintf(buf + o, sizeof buf - o, " %d", ids[i]);
        buf[o] = '\0';
        diag("  got%s", buf);
    }
    free(ids);
}

static void expect_decode(const kvg_tokenizer *t, const int32_t *ids, size_t n, const char *want, const char *name)
{
    char *text, err[256];
    size_t len;
    int rc = kvg_tokenizer_decode(t, ids, n, &text, &len, err, sizeof err);
    ok(rc == 0 && len == strlen(want) && memcmp(text, want, len) == 0, "%s", name);
    if (rc == 0)
        free(text);
}

/* ---- broken files ---- */

static int fails_naming(const void *data, size_t len, const char *name)
{
    char err[256] = "";
    kvg_tokenizer *t = kvg_tokenizer_load_mem(data, len, name, err, sizeof err);
    if (t) {
        kvg_tokenizer_free(t);
        return 0;
    }
    return strncmp(err, name, strlen(name)) == 0 && err[strlen(name)] == ':' && strlen(err) > strlen(name) + 5;
}

static void truncations(void)
{
    char path[512];
    size_t len;

    snprintf(path, sizeof path, "%s/models/stories260K/tok512.bin", shared_dir());
    unsigned char *bin = (unsigned char *)slurp(path, &len);
    if (!ok(bin != NULL, "tok512.bin readable"))
        return;
    /* Record ends: a llama2.c file is records until the end, so a cut exactly
     * there is a smaller, valid vocabulary. Everywhere else it is an error. */
    char *boundary = calloc(len + 1, 1);
    for (size_t off = 4; off + 8 <= len;) {
        int32_t l;
        memcpy(&l, bin + off + 4, 4);
        off += 8 + (size_t)l;
        boundary[off] = 1;
    }
    int all = 1;
    for (size_t n = 0; n < len && all; n++) {
        char err[256] = "";
        kvg_tokenizer *t = kvg_tokenizer_load_mem(bin, n, "cut.bin", err, sizeof err);
        if (t) {
            all = boundary[n] && kvg_tokenizer_vocab_size(t) < 512;
            kvg_tokenizer_free(t);
        } else
            all = strncmp(err, "cut.bin: ", 9) == 0;
        if (!all)
            diag("length %zu: %s", n, t ? "loaded" : err);
    }
    ok(all, "every truncation of tok512.bin fails naming the file (or is a whole-record prefix)");
    free(boundary);

    /* Bad records. */
    unsigned char *copy = malloc(len);
    memcpy(copy, bin, len);
    int32_t v = -3;
    memcpy(copy + 4 + 4, &v, 4);
    ok(fails_naming(copy, len, "neg.bin"), "negative piece length");
    memcpy(copy, bin, len);
    v = 100;
    memcpy(copy + 4 + 4, &v, 4);
    ok(fails_naming(copy, len, "long.bin"), "piece longer than max_token_length");
    memcpy(copy, bin, len);
    uint32_t nan_bits = 0x7FC00000;
    memcpy(copy + 4, &nan_bits, 4);
    ok(fails_naming(copy, len, "nan.bin"), "NaN score");
    memcpy(copy, bin, len);
    v = 0;
    memcpy(copy, &v, 4);
    ok(fails_naming(copy, len, "zero.bin"), "max_token_length 0");
    free(copy);
    free(bin);

    snprintf(path, sizeof path, "%s/tokenizers/vectors/ggml-vocab-gpt-2.gguf", shared_dir());
    unsigned char *gg = (unsigned char *)slurp(path, &len);
    if (!ok(gg != NULL, "gpt-2 GGUF readable"))
        return;
    all = 1;
    for (size_t n = 0; n < len && all; n += n < 256 ? 1 : 4099 + n / 7)
        if (!(all = fails_naming(gg, n, "cut.gguf")))
            diag("GGUF cut at %zu loaded or gave a bad message", n);
    ok(all, "truncated GGUF vocabularies fail naming the file");
    free(gg);

    const char *texts[] = {
        "", "hello world, this is plain text and not a tokenizer\n", "{", "{\"model\": ", "   {\"added_tokens\": [",
        "\x01\x00\x00\x00", "GGUF", "GGUF\x03\x00\x00\x00",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        size_t n = strlen(texts[i]);
        if (i == 5 || i == 7)
            n = i == 5 ? 4 : 8;
        ok(fails_naming(texts[i], n, "junk.file"), "junk input %zu fails naming the file", i);
    }
    unsigned seed = 99;
    unsigned char junk[4096];
    int junk_ok = 1;
    for (int iter = 0; iter < 200; iter++) {
        size_t n = 1 + ((seed = seed * 1103515245 + 12345) >> 8) % sizeof junk;
        for (size_t i = 0; i < n; i++)
            junk[i] = (unsigned char)((seed = seed * 1103515245 + 12345) >> 16);
        char err[256] = "";
        kvg_tokenizer *t = kvg_tokenizer_load_mem(junk, n, "rnd", err, sizeof err);
        if (t)
            kvg_tokenizer_free(t);      /* allowed: some junk is a valid llama2.c file */
        else if (strncmp(err, "rnd: ", 5) != 0)
            junk_ok = 0;
    }
    ok(junk_ok, "random junk never crashes and errors name the input");
    char err[256] = "";
    ok(kvg_tokenizer_load("/nonexistent/tokenizer.bin", err, sizeof err) == NULL
       && strstr(err, "/nonexistent/tokenizer.bin: cannot open"), "missing file");
}

/* ---- GGUF vocabularies built by hand ---- */

#define U2581 "\xE2\x96\x81"

typedef struct {
    const char *piece;
    float score;
    int type;
} tokdef;

/* A GGUF with the given tokens and extra string/bool keys. */
static void build_vocab(gb *b, const char *model, const tokdef *toks, size_t n, const char *const *merges,
                        size_t n_merges, const char *pre, int space_prefix)
{
    uint64_t kv = 4 + (merges ? 1 : 0) + (pre ? 1 : 0) + (space_prefix >= 0 ? 1 : 0);
    gb_init(b, 3, 0, kv);
    gb_key(b, "tokenizer.ggml.model", KVG_GGUF_STRING);
    gb_str(b, model);
    gb_key(b, "tokenizer.ggml.tokens", KVG_GGUF_ARRAY);
    gb_arr(b, KVG_GGUF_STRING, n);
    for (size_t i = 0; i < n; i++)
        gb_str(b, toks[i].piece);
    gb_key(b, "tokenizer.ggml.scores", KVG_GGUF_ARRAY);
    gb_arr(b, KVG_GGUF_F32, n);
    for (size_t i = 0; i < n; i++)
        gb_f32(b, toks[i].score);
    gb_key(b, "tokenizer.ggml.token_type", KVG_GGUF_ARRAY);
    gb_arr(b, KVG_GGUF_I32, n);
    for (size_t i = 0; i < n; i++)
        gb_u32(b, (uint32_t)toks[i].type);
    if (merges) {
        gb_key(b, "tokenizer.ggml.merges", KVG_GGUF_ARRAY);
        gb_arr(b, KVG_GGUF_STRING, n_merges);
        for (size_t i = 0; i < n_merges; i++)
            gb_str(b, merges[i]);
    }
    if (pre) {
        gb_key(b, "tokenizer.ggml.pre", KVG_GGUF_STRING);
        gb_str(b, pre);
    }
    if (space_prefix >= 0) {
        gb_key(b, "tokenizer.ggml.add_space_prefix", KVG_GGUF_BOOL);
        gb_u8(b, (uint8_t)space_prefix);
    }
}

static const tokdef spm_toks[] = {
    { "<unk>", 0, 2 }, { "<s>", 0, 3 }, { "</s>", 0, 3 }, { "<0x0A>", 0, 6 }, { "<0xC3>", 0, 6 },
    { "<0xA9>", 0, 6 }, { U2581, -10, 1 }, { "a", -11, 1 }, { "b", -12, 1 }, { "c", -13, 1 },
    { "ab", -1, 1 }, { "bc", -1, 1 }, { U2581 "ab", -2, 1 }, { U2581 "c", -3, 1 }, { "<tool>", 0, 4 },
};

static void spm_vocab(void)
{
    gb b;
    char err[256];

    build_vocab(&b, "llama", spm_toks, sizeof spm_toks / sizeof spm_toks[0], NULL, 0, NULL, -1);
    kvg_tokenizer *t = kvg_tokenizer_load_mem(b.p, b.n, "spm.gguf", err, sizeof err);
    if (!ok(t != NULL, "hand-made SPM vocabulary loads")) {
        diag("%s", err);
        gb_free(&b);
        return;
    }
    is_str(kvg_tokenizer_kind(t), "gguf-llama", "kind gguf-llama");
    is_int(kvg_tokenizer_bos(t), 1, "default BOS 1");
    expect(t, "abc", 0, IDS(12, 9), "ab and bc tie: the leftmost merges first");
    expect(t, "bc a", 0, IDS(6, 11, 6, 7), "no piece for ' a': two symbols stay");
    expect(t, "\xC3\xA9\n", 0, IDS(6, 4, 5, 3), "unknown characters fall back to bytes");
    expect(t, "x", 0, IDS(6, 0), "no byte piece for 'x': unk");
    expect(t, "a<tool>b", 0, IDS(6, 7, 14, 6, 8), "user-defined token matched without the flag");
    expect(t, "<s>ab", 0, IDS(6, 0, 0, 0, 10), "'<s>' is text without the flag");
    expect(t, "<s>ab", KVG_ENC_PARSE_SPECIAL, IDS(1, 12), "'<s>' is BOS with the flag; a dummy space follows");
    expect(t, "ab", KVG_ENC_BOS, IDS(1, 12), "KVG_ENC_BOS");
    expect(t, "", 0, NULL, 0, "empty text");
    expect_decode(t, IDS(12, 9), "abc", "decode drops the dummy space");
    expect_decode(t, IDS(1, 6, 4, 5, 3), "\xC3\xA9\n", "decode: control tokens vanish, bytes join");
    expect_decode(t, IDS(6, 6, 12), "  ab", "decode drops only one space");
    size_t len;
    const unsigned char *bytes = kvg_tokenizer_token_bytes(t, 13, &len);
    ok(bytes && len == 2 && memcmp(bytes, " c", 2) == 0, "token_bytes maps U+2581 to a space");
    bytes = kvg_tokenizer_token_bytes(t, 3, &len);
    ok(bytes && len == 1 && bytes[0] == '\n', "token_bytes of <0x0A> is a newline");
    ok(kvg_tokenizer_token_bytes(t, 1, &len) && len == 0, "control tokens have no bytes");
    const char *p = kvg_tokenizer_piece(t, 12, &len);
    ok(p && len == 5 && memcmp(p, U2581 "ab", 5) == 0, "piece is raw");
    is_int(kvg_tokenizer_find_piece(t, U2581 "c", 4), 13, "find_piece");
    is_int(kvg_tokenizer_find_piece(t, "zz", 2), -1, "find_piece: absent");
    ok(kvg_tokenizer_piece(t, 15, &len) == NULL && kvg_tokenizer_token_bytes(t, -1, &len) == NULL,
       "out-of-range ids give NULL");
    kvg_tokenizer_free(t);
    gb_free(&b);

    build_vocab(&b, "llama", spm_toks, sizeof spm_toks / sizeof spm_toks[0], NULL, 0, NULL, 0);
    t = kvg_tokenizer_load_mem(b.p, b.n, "spm-noprefix.gguf", err, sizeof err);
    if (ok(t != NULL, "add_space_prefix=false loads")) {
        expect(t, "abc", 0, IDS(10, 9), "no dummy prefix");
        expect_decode(t, IDS(6, 10), " ab", "and decode keeps a leading space");
        kvg_tokenizer_free(t);
    }
    gb_free(&b);
}

static void gpt2_vocab(void)
{
    tokdef toks[264];
    char pieces[256][4];
    gb b;
    char err[256];

    for (int i = 0; i < 256; i++) {
        int n = kvg_utf8_encode(kvg_byte_to_cp((unsigned char)i), (unsigned char *)pieces[i]);
        pieces[i][n] = '\0';
        toks[i] = (tokdef){ pieces[i], 0, 1 };
    }
    toks[256] = (tokdef){ "he", 0, 1 };
    toks[257] = (tokdef){ "ll", 0, 1 };
    toks[258] = (tokdef){ "hell", 0, 1 };
    toks[259] = (tokdef){ "hello", 0, 1 };
    toks[260] = (tokdef){ "<|endoftext|>", 0, 3 };
    toks[261] = (tokdef){ "lo", 0, 1 };        /* in the vocabulary, but no merge makes it */
    toks[262] = (tokdef){ "<tool>", 0, 4 };
    static const char *const merges[] = { "h e", "l l", "he ll", "hell o", "x y" };

    build_vocab(&b, "gpt2", toks, 263, merges, 5, "gpt-2", -1);
    kvg_tokenizer *t = kvg_tokenizer_load_mem(b.p, b.n, "gpt2.gguf", err, sizeof err);
    if (!ok(t != NULL, "hand-made GPT-2 vocabulary loads")) {
        diag("%s", err);
        gb_free(&b);
        return;
    }
    is_str(kvg_tokenizer_kind(t), "gguf-gpt2", "kind gguf-gpt2");
    is_int(kvg_tokenizer_bos(t), -1, "no BOS key: none");
    ok(!kvg_tokenizer_add_bos(t), "byte-level vocabularies do not ask for BOS by default");
    expect(t, "hello", 0, IDS(259), "merges by rank");
    expect(t, "hello hello", 0, IDS(259, 32, 259), "pre-tokens merge separately");
    expect(t, "lo", 0, IDS(108, 111), "'lo' is not reachable by merges");
    expect(t, "<|endoftext|>", KVG_ENC_PARSE_SPECIAL, IDS(260), "control token with the flag");
    expect(t, "hello<tool>", 0, IDS(259, 262), "user-defined token always");
    expect(t, "<|endoftext|>", KVG_ENC_BOS, IDS(60, 124, 101, 110, 100, 111, 102, 116, 101, 120, 116, 124, 62),
           "control token text without the flag; no BOS to add");
    expect_decode(t, IDS(259, 32, 260, 262), "hello <tool>", "decode: control vanishes, user-defined is raw");
    size_t len;
    const unsigned char *bytes = kvg_tokenizer_token_bytes(t, 32, &len);
    ok(bytes && len == 1 && bytes[0] == ' ', "byte-level piece for ' ' decodes to a space");
    kvg_tokenizer_free(t);
    gb_free(&b);

    build_vocab(&b, "gpt2", toks, 263, merges, 5, "llama-bpe", -1);
    t = kvg_tokenizer_load_mem(b.p, b.n, "llama3.gguf", err, sizeof err);
    if (ok(t != NULL, "pre llama-bpe loads")) {
        expect(t, "lo", 0, IDS(261), "Llama 3 pre-tokenizer ignores merges for whole pieces");
        kvg_tokenizer_free(t);
    }
    gb_free(&b);

    struct {
        const char *model, *pre;
        int with_merges;
        const char *want;
    } bad[] = {
        { "bert", NULL, 0, "'bert' is not supported" },
        { "gpt2", NULL, 0, "no tokenizer.ggml.merges" },
        { "gpt2", "mystery", 1, "pre-tokenizer 'mystery' is not supported" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        build_vocab(&b, bad[i].model, toks, 263, bad[i].with_merges ? merges : NULL, 5, bad[i].pre, -1);
        err[0] = '\0';
        t = kvg_tokenizer_load_mem(b.p, b.n, "bad.gguf", err, sizeof err);
        if (!ok(!t && strncmp(err, "bad.gguf: ", 10) == 0 && strstr(err, bad[i].want), "rejected: %s", bad[i].want))
            diag("  got: %s", t ? "(loaded)" : err);
        kvg_tokenizer_free(t);
        gb_free(&b);
    }
    static const char *const broken_merge[] = { "hello" };
    build_vocab(&b, "gpt2", toks, 263, broken_merge, 1, NULL, -1);
    t = kvg_tokenizer_load_mem(b.p, b.n, "bad.gguf", err, sizeof err);
    ok(!t && strstr(err, "not two pieces"), "a merge without a space is rejected");
    kvg_tokenizer_free(t);
    gb_free(&b);

    gb_init(&b, 3, 0, 1);
    gb_key(&b, "general.name", KVG_GGUF_STRING);
    gb_str(&b, "weights only");
    t = kvg_tokenizer_load_mem(b.p, b.n, "model.gguf", err, sizeof err);
    ok(!t && strstr(err, "model.gguf: GGUF has no tokenizer"), "GGUF without tokenizer metadata");
    kvg_tokenizer_free(t);
    gb_free(&b);

    build_vocab(&b, "llama", spm_toks, sizeof spm_toks / sizeof spm_toks[0], NULL, 0, NULL, -1);
    /* Point the scores array's element type at "string": a type mismatch. */
    unsigned char *at = memmem(b.p, b.n, "tokenizer.ggml.scores", 21);
    at += 21 + 4;               /* key, then the value type ARRAY */
    at[0] = KVG_GGUF_STRING;
    t = kvg_tokenizer_load_mem(b.p, b.n, "scores.gguf", err, sizeof err);
    ok(!t && strncmp(err, "scores.gguf: ", 13) == 0, "scores of the wrong type are rejected");
    kvg_tokenizer_free(t);
    gb_free(&b);
}

/* ---- text and ids ---- */

static void bad_text_and_ids(void)
{
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/tokenizers/llama2/tokenizer.bin", shared_dir());
    kvg_tokenizer *t = kvg_tokenizer_load(path, err, sizeof err);
    if (!ok(t != NULL, "llama2 loads"))
        return;
    static const struct {
        const char *s;
        size_t len, at;
    } bad[] = {
        { "ok\x80", 3, 2 },                 /* stray continuation byte */
        { "ab\xC3", 3, 2 },                 /* truncated at the end */
        { "\xC0\xAF", 2, 0 },               /* overlong */
        { "x\xED\xA0\x80", 4, 1 },          /* surrogate */
        { "xy\xF4\x90\x80\x80", 6, 2 },     /* above U+10FFFF */
        { "\xFF", 1, 0 },
        { "abc\xE4\xBDz", 6, 3 },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 99;
        char want[64];
        snprintf(want, sizeof want, "invalid UTF-8 at byte offset %zu", bad[i].at);
        int rc = kvg_tokenizer_encode(t, bad[i].s, bad[i].len, 0, &ids, &n, err, sizeof err);
        ok(rc == -1 && ids == NULL && n == 0 && strcmp(err, want) == 0, "invalid UTF-8 %zu: %s", i, want);
    }
    char *text = (char *)1;
    size_t len = 5;
    ok(kvg_tokenizer_decode(t, IDS(1, 32000), &text, &len, err, sizeof err) == -1 && text == NULL
       && strstr(err, "token id 32000 at position 1 is out of range"), "decode rejects id 32000");
    ok(kvg_tokenizer_decode(t, IDS(-1), &text, &len, err, sizeof err) == -1, "decode rejects -1");
    ok(kvg_tokenizer_decode(t, NULL, 0, &text, &len, err, sizeof err) == 0 && len == 0 && text && !text[0],
       "decoding nothing gives an empty string");
    free(text);

    /* ---- streaming ---- */
    kvg_detok d;
    char out[64];
    kvg_detok_init(&d, t);
    is_int(kvg_detok_push(&d, 1, out, sizeof out), 0, "BOS streams nothing");
    long w = kvg_detok_push(&d, 15043, out, sizeof out);      /* "▁Hello" */
    ok(w == 5 && memcmp(out, "Hello", 5) == 0, "first piece loses its dummy space");
    w = kvg_detok_push(&d, 3186, out, sizeof out);            /* "▁world" */
    ok(w == 6 && memcmp(out, " world", 6) == 0, "later pieces keep theirs");
    /* 你 = E4 BD A0 as three byte-fallback tokens (byte + 3). */
    ok(kvg_detok_push(&d, 3 + 0xE4, out, sizeof out) == 0 && kvg_detok_push(&d, 3 + 0xBD, out, sizeof out) == 0,
       "the first two bytes of a character are held back");
    ok(kvg_detok_push(&d, 3 + 0xA0, out, 2) == -1, "a buffer too small is refused");
    w = kvg_detok_push(&d, 3 + 0xA0, out, sizeof out);
    ok(w == 3 && memcmp(out, "\xE4\xBD\xA0", 3) == 0, "...and the state survived: the character completes");
    w = kvg_detok_push(&d, 3 + 0xFF, out, sizeof out);
    ok(w == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0, "a byte that can never start a character is U+FFFD");
    ok(kvg_detok_push(&d, 3 + 0xE4, out, sizeof out) == 0, "a lead byte is held");
    w = kvg_detok_push(&d, 3 + 'a', out, sizeof out);
    ok(w == 4 && memcmp(out, "\xEF\xBF\xBD" "a", 4) == 0, "interrupted: U+FFFD, then the new byte");
    ok(kvg_detok_push(&d, 3 + 0xF0, out, sizeof out) == 0 && kvg_detok_push(&d, 3 + 0x9F, out, sizeof out) == 0,
       "two bytes of a four-byte character held");
    w = kvg_detok_flush(&d, out, sizeof out);
    ok(w == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0, "flush turns the held bytes into U+FFFD");
    is_int(kvg_detok_flush(&d, out, sizeof out), 0, "a second flush has nothing");
    is_int(kvg_detok_push(&d, 32000, out, sizeof out), -1, "bad id");
    kvg_tokenizer_free(t);
}

int main(void)
{
    truncations();
    spm_vocab();
    gpt2_vocab();
    bad_text_and_ids();
    return done_testing();
}
