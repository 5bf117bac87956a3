/* llama2.c tokenizer.bin: the golden prompt ids of stories260K (tok512.bin),
 * decode(encode(s)) == s with the Llama 2 vocabulary, streaming decoding, and the
 * BPE merge against a naive reference of the same rules. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "tokenizer.h"
#include "utf8.h"
#include "tokenizer_testing.h"

static kvg_tokenizer *load(const char *rel)
{
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/%s", shared_dir(), rel);
    kvg_tokenizer *t = kvg_tokenizer_load(path, err, sizeof err);
    if (!ok(t != NULL, "load %s", rel))
        diag("%s", err);
    return t;
}

static void golden(void)
{
    char path[512];
    json_error_t jerr;
    kvg_tokenizer *t = load("models/stories260K/tok512.bin");
    if (!t)
        return;
    is_str(kvg_tokenizer_kind(t), "llama2c", "tok512 kind");
    is_int(kvg_tokenizer_vocab_size(t), 512, "tok512 has 512 pieces");
    is_int(kvg_tokenizer_bos(t), 1, "BOS is 1");
    is_int(kvg_tokenizer_eos(t), 2, "EOS is 2");
    ok(kvg_tokenizer_add_bos(t), "llama2.c vocabularies want BOS");

    snprintf(path, sizeof path, "%s/models/stories260K/golden-greedy.json", shared_dir());
    json_t *root = json_load_file(path, 0, &jerr);
    if (!ok(root != NULL, "golden-greedy.json parses")) {
        diag("%s", jerr.text);
        kvg_tokenizer_free(t);
        return;
    }
    json_t *cases = json_object_get(root, "cases");
    ok(json_array_size(cases) == 5, "five golden cases");
    for (size_t c = 0; c < json_array_size(cases); c++) {
        json_t *cs = json_array_get(cases, c);
        const char *prompt = json_string_value(json_object_get(cs, "prompt"));
        json_t *want = json_object_get(cs, "prompt_ids");
        int32_t *ids;
        size_t n;
        char err[256];
        int rc = kvg_tokenizer_encode(t, prompt, strlen(prompt), KVG_ENC_BOS, &ids, &n, err, sizeof err);
        int same = rc == 0 && n == json_array_size(want);
        for (size_t i = 0; same && i < n; i++)
            same = ids[i] == json_integer_value(json_array_get(want, i));
        ok(same, "golden prompt %zu ids (%zu tokens)", c, n);
        if (rc == 0) {
            char *text;
            size_t len;
            ok(kvg_tokenizer_decode(t, ids, n, &text, &len, err, sizeof err) == 0
               && strcmp(text, prompt) == 0, "golden prompt %zu decodes back", c);
            free(text);
            free(ids);
        }
    }
    json_decref(root);
    kvg_tokenizer_free(t);
}

static int valid_utf8(const char *s, size_t n)
{
    return kvg_utf8_invalid_at((const unsigned char *)s, n) == (size_t)-1;
}

/* Encodes, decodes whole and token by token; all three must agree with s. */
static void roundtrip(kvg_tokenizer *t, const char *s, size_t n, const char *what)
{
    int32_t *ids;
    size_t n_ids, len;
    char *text, err[256];

    if (!ok(kvg_tokenizer_encode(t, s, n, 0, &ids, &n_ids, err, sizeof err) == 0, "encode %s", what)) {
        diag("%s", err);
        return;
    }
    int rc = kvg_tokenizer_decode(t, ids, n_ids, &text, &len, err, sizeof err);
    if (!ok(rc == 0 && len == n && memcmp(text, s, n) == 0, "decode(encode(%s)) round-trips", what))
        diag("  got '%.*s'", rc == 0 ? (int)len : 0, rc == 0 ? text : "");

    /* Streaming: every step's output must be whole characters. */
    kvg_detok d;
    size_t cap = n + 64, o = 0;
    char *stream = malloc(cap);
    int step_ok = 1;
    kvg_detok_init(&d, t);
    for (size_t i = 0; i < n_ids; i++) {
        char piece[512];
        long w = kvg_detok_push(&d, ids[i], piece, sizeof piece);
        if (w < 0 || !valid_utf8(piece, (size_t)w) || o + (size_t)w > cap) {
            step_ok = 0;
            break;
        }
        memcpy(stream + o, piece, (size_t)w);
        o += (size_t)w;
    }
    long w = kvg_detok_flush(&d, stream + o, cap - o);
    ok(step_ok && w == 0, "%s: every streaming step is whole UTF-8, nothing left over", what);
    ok(step_ok && rc == 0 && o == len && memcmp(stream, text, len) == 0, "%s: streaming equals decode", what);
    free(stream);
    if (rc == 0)
        free(text);
    free(ids);
}

static const char *const tricky[] = {
    "Hello world",
    " leading space",
    "trailing space ",
    "  two  spaces  inside  ",
    "   ",
    " ",
    "\n",
    "line one\nline two\n\nline four\r\n",
    "tabs\tand\vcontrol\x01\x02\x1b[0m chars\x7f",
    "emoji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD and flags \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7",
    "CJK \xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
    "combining e\xCC\x81 a\xCC\x80\xCC\x81 Z\xCD\x91\xCD\x97\xCD\x83",
    "mixed \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xCE\xB3\xCE\xB5\xCE\xB9\xCE\xB1 \xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7",
    "literal lower block \xE2\x96\x81 and <0x41> and <s> </s> <unk>",
    "rare \xF4\x8F\xBF\xBF \xEE\x80\x80 \xEF\xBF\xBD",
    "x",
};

static void roundtrips(void)
{
    kvg_tokenizer *t = load("tokenizers/llama2/tokenizer.bin");
    char path[512], what[64];
    size_t len;
    json_error_t jerr;

    if (!t)
        return;
    is_int(kvg_tokenizer_vocab_size(t), 32000, "Llama 2 vocabulary size");
    for (size_t i = 0; i < sizeof tricky / sizeof tricky[0]; i++) {
        snprintf(what, sizeof what, "tricky %zu", i);
        roundtrip(t, tricky[i], strlen(tricky[i]), what);
    }
    roundtrip(t, "nul\0inside", 10, "embedded NUL");

    /* A known encoding: " Hello" is one piece, "\n" the byte fallback 13. */
    int32_t *ids;
    size_t n;
    char err[256];
    ok(kvg_tokenizer_encode(t, "Hello\n", 6, KVG_ENC_BOS, &ids, &n, err, sizeof err) == 0
       && n == 3 && ids[0] == 1 && ids[1] == 15043 && ids[2] == 13, "'Hello\\n' -> 1 15043 13");
    free(ids);
    ok(kvg_tokenizer_encode(t, "", 0, KVG_ENC_BOS, &ids, &n, err, sizeof err) == 0 && n == 1 && ids[0] == 1,
       "empty text with BOS is just BOS");
    free(ids);
    ok(kvg_tokenizer_encode(t, "", 0, 0, &ids, &n, err, sizeof err) == 0 && n == 0 && ids != NULL,
       "empty text encodes to nothing");
    free(ids);

    snprintf(path, sizeof path, "%s/models/stories260K/golden-greedy.json", shared_dir());
    json_t *root = json_load_file(path, 0, &jerr);
    json_t *cases = json_object_get(root, "cases");
    for (size_t c = 0; c < json_array_size(cases); c++) {
        json_t *cs = json_array_get(cases, c);
        const char *s = json_string_value(json_object_get(cs, "prompt"));
        snprintf(what, sizeof what, "golden prompt %zu", c);
        roundtrip(t, s, strlen(s), what);
        s = json_string_value(json_object_get(cs, "full_text"));
        snprintf(what, sizeof what, "golden full_text %zu", c);
        roundtrip(t, s, strlen(s), what);
    }
    json_decref(root);

    snprintf(path, sizeof path, "%s/tokenizers/vectors/ggml-vocab-llama-spm.gguf.inp", shared_dir());
    char *inp = slurp(path, &len);
    if (ok(inp != NULL, "vector strings readable")) {
        /* The whole fixture file at once, separators and all. */
        roundtrip(t, inp, len, "all vector strings");
        free(inp);
    }
    kvg_tokenizer_free(t);
}

/* ---- naive reference: llama2.c's rule, on strings, quadratic ---- */

static float *scores;            /* read straight from tokenizer.bin */

static int read_scores(void)
{
    char path[512];
    size_t len, off = 4, i = 0;
    snprintf(path, sizeof path, "%s/tokenizers/llama2/tokenizer.bin", shared_dir());
    unsigned char *d = (unsigned char *)slurp(path, &len);
    if (!d)
        return -1;
    scores = calloc(32000, sizeof *scores);
    while (off + 8 <= len && i < 32000) {
        int32_t l;
        memcpy(&scores[i++], d + off, 4);
        memcpy(&l, d + off + 4, 4);
        off += 8 + (size_t)l;
    }
    free(d);
    return i == 32000 ? 0 : -1;
}

typedef struct {
    char s[64];
    size_t n;
} nsym;

/* SentencePiece by scores, the obvious way: start from characters (unknown
 * ones as <0xNN> byte pieces), repeatedly merge the adjacent pair whose
 * concatenation is a piece with the best score, leftmost first. */
static size_t naive_encode(const kvg_tokenizer *t, const char *text, size_t len, int32_t *out)
{
    static nsym sy[1024];
    size_t n = 0;
    sy[n].s[0] = ' ';
    sy[n++].n = 1;
    for (size_t i = 0; i < len;) {
        int l = kvg_utf8_seq_len((unsigned char)text[i]);
        memcpy(sy[n].s, text + i, (size_t)l);
        sy[n++].n = (size_t)l;
        i += (size_t)l;
    }
    for (;;) {
        float best = 0;
        long at = -1;
        int32_t best_id = -1;
        for (size_t i = 0; i + 1 < n; i++) {
            char buf[128];
            if (sy[i].n + sy[i + 1].n > sizeof buf)
                continue;
            memcpy(buf, sy[i].s, sy[i].n);
            memcpy(buf + sy[i].n, sy[i + 1].s, sy[i + 1].n);
            int32_t id = kvg_tokenizer_find_piece(t, buf, sy[i].n + sy[i + 1].n);
            if (id < 3 || (id >= 3 && id < 259))
                continue;       /* unk/BOS/EOS and byte pieces are never merge results */
            float sc = scores[id];
            if (at < 0 || sc > best) {
                best = sc;
                at = (long)i;
                best_id = id;
            }
        }
        if (at < 0)
            break;
        (void)best_id;
        memcpy(sy[at].s + sy[at].n, sy[at + 1].s, sy[at + 1].n);
        sy[at].n += sy[at + 1].n;
        memmove(&sy[at + 1], &sy[at + 2], (n - (size_t)at - 2) * sizeof *sy);
        n--;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = kvg_tokenizer_find_piece(t, sy[i].s, sy[i].n);
        if (id >= 259) {
            out[k++] = id;
        } else {
            for (size_t j = 0; j < sy[i].n; j++)
                out[k++] = 3 + (unsigned char)sy[i].s[j];
        }
    }
    return k;
}

static void against_naive(void)
{
    kvg_tokenizer *t = load("tokenizers/llama2/tokenizer.bin");
    static const char *const alphabet[] = {
        " ", " ", " ", "e", "t", "a", "o", "n", "th", "in", "er", "s", "\n", "\t", ".", ",", "1", "2",
        "\xC3\xA9", "\xE4\xBD\xA0", "\xF0\x9F\x98\x80", "\xE2\x96\x81", "ing", "the", "Q", "z", "'", "-",
    };
    unsigned seed = 12345;
    int all = 1, checked = 0;

    if (!t)
        return;
    if (!ok(read_scores() == 0, "scores read from tokenizer.bin")) {
        kvg_tokenizer_free(t);
        return;
    }
    for (int iter = 0; iter < 400 && all; iter++) {
        char text[256];
        size_t len = 0;
        int words = 1 + (int)((seed = seed * 1103515245 + 12345) >> 16) % 40;
        for (int w = 0; w < words; w++) {
            const char *a = alphabet[((seed = seed * 1103515245 + 12345) >> 16) % (sizeof alphabet / sizeof alphabet[0])];
            size_t al = strlen(a);
            if (len + al >= sizeof text)
                break;
            memcpy(text + len, a, al);
            len += al;
        }
        int32_t want[1024], *ids;
        size_t n_want = naive_encode(t, text, len, want), n;
        char err[256];
        if (kvg_tokenizer_encode(t, text, len, 0, &ids, &n, err, sizeof err) < 0) {
            all = 0;
            break;
        }
        checked++;
        if (n != n_want || memcmp(ids, want, n * sizeof *ids) != 0) {
            all = 0;
            diag("mismatch for '%.*s'", (int)len, text);
        }
        free(ids);
    }
    ok(all && checked == 400, "engine equals the naive quadratic reference on %d random texts", checked);
    free(scores);
    kvg_tokenizer_free(t);
}

int main(void)
{
    golden();
    roundtrips();
    against_naive();
    return done_testing();
}
