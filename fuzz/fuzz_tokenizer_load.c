/* libFuzzer target for the tokenizer loaders (llama2.c .bin, GGUF, and through
 * the same entry point tokenizer.json) and the GGUF reader underneath: any
 * bytes must give a tokenizer or an error naming the input, never a crash. A
 * tokenizer that loads must then encode, decode and stream a fixed text, with
 * every id in range. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_testing.h"
#include "tokenizer.h"
#include "utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char TEXT[] =
    "Hello world!  Two  spaces, a tab\tand\nnewlines\n\n caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD "
    "\xF0\x9F\x98\x80 <s> <|endoftext|> 123 it's";

static void walk_gguf(const uint8_t *data, size_t size)
{
    char err[256];
    kvg_gguf *g = kvg_gguf_parse(data, size, "fuzz", err, sizeof err);
    if (!g) {
        if (strncmp(err, "fuzz: ", 6) != 0)
            abort();
        return;
    }
    for (size_t i = 0; i < kvg_gguf_n_kv(g); i++) {
        const kvg_gguf_kv *kv = kvg_gguf_kv_at(g, i);
        if (kvg_gguf_find(g, kv->key) == NULL)
            abort();
        for (uint64_t e = 0; kv->type == KVG_GGUF_ARRAY && e < kv->arr_n && e < 64; e++) {
            kvg_gguf_str s;
            double d;
            int64_t v;
            if (kvg_gguf_arr_str(kv, e, &s) == 0 && s.len && (const uint8_t *)s.s + s.len > data + size)
                abort();
            (void)kvg_gguf_arr_f64(kv, e, &d);
            (void)kvg_gguf_arr_i64(kv, e, &v);
        }
    }
    for (size_t i = 0; i < kvg_gguf_n_tensors(g); i++) {
        const kvg_gguf_tensor *t = kvg_gguf_tensor_at(g, i);
        if (t->data && (const uint8_t *)t->data + t->n_bytes > data + size)
            abort();
        if (kvg_gguf_find_tensor(g, t->name) == NULL)
            abort();
    }
    kvg_gguf_free(g);
}

static void exercise(const kvg_tokenizer *t)
{
    int32_t n_vocab = kvg_tokenizer_vocab_size(t);
    static const unsigned flag_sets[] = { 0, KVG_ENC_BOS | KVG_ENC_PARSE_SPECIAL };

    for (size_t f = 0; f < 2; f++) {
        int32_t *ids;
        size_t n;
        char err[256];
        if (kvg_tokenizer_encode(t, TEXT, sizeof TEXT - 1, flag_sets[f], &ids, &n, err, sizeof err) < 0)
            abort();        /* valid UTF-8 always encodes */
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= n_vocab)
                abort();
        char *text;
        size_t len;
        if (kvg_tokenizer_decode(t, ids, n, &text, &len, err, sizeof err) < 0)
            abort();
        kvg_detok d;
        char buf[4096];
        kvg_detok_init(&d, t);
        for (size_t i = 0; i < n; i++) {
            size_t bl;
            const unsigned char *b = kvg_tokenizer_token_bytes(t, ids[i], &bl);
            if (!b)
                abort();
            long w = bl * 3 + 12 <= sizeof buf ? kvg_detok_push(&d, ids[i], buf, sizeof buf) : 0;
            if (w < 0 || kvg_utf8_invalid_at((const unsigned char *)buf, (size_t)w) != (size_t)-1)
                abort();
        }
        if (kvg_detok_flush(&d, buf, sizeof buf) < 0)
            abort();
        free(text);
        free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];

    walk_gguf(data, size);
    kvg_tokenizer *t = kvg_tokenizer_load_mem(data, size, "fuzz", err, sizeof err);
    if (!t) {
        if (strncmp(err, "fuzz: ", 6) != 0)
            abort();
        return 0;
    }
    exercise(t);
    kvg_tokenizer_free(t);
    return 0;
}
