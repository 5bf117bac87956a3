/* libFuzzer target for encoding with the real vocabularies (loaded once from
 * $KVGATE_SHARED, default ../shared): invalid UTF-8 is an error; valid text
 * encodes to ids in range, decodes back to itself (for vocabularies where that
 * holds, see round_trips), and streams token by token as whole characters
 * adding up to the decoded text. */
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct {
    const char *path;
    int round_trips;            /* 2: always; 1: unless the text has U+2581 */
} vocabs[] = {
    { "tokenizers/llama2/tokenizer.bin", 2 },
    { "models/stories260K/tok512.bin", 2 },
    { "tokenizers/vectors/ggml-vocab-gpt-2.gguf", 2 },
    /* Its pieces spell spaces as U+2581, so a literal U+2581 decodes as a space. */
    { "tokenizers/vectors/ggml-vocab-llama-spm.gguf", 1 },
};
#define N_VOCABS (sizeof vocabs / sizeof vocabs[0])
static kvg_tokenizer *toks[N_VOCABS];

static void load_all(void)
{
    const char *dir = getenv("KVGATE_SHARED");
    if (!dir || !*dir)
        dir = "../shared";
    for (size_t i = 0; i < N_VOCABS; i++) {
        char path[1024], err[512];
        snprintf(path, sizeof path, "%s/%s", dir, vocabs[i].path);
        if (!(toks[i] = kvg_tokenizer_load(path, err, sizeof err))) {
            fprintf(stderr, "fuzz_tokenizer_encode: %s (set KVGATE_SHARED)\n", err);
            exit(1);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int loaded;
    if (!loaded) {
        load_all();
        loaded = 1;
    }
    const char *text = (const char *)data;
    int valid = kvg_utf8_invalid_at(data, size) == (size_t)-1;
    int has_lower_block = memmem(data, size, "\xE2\x96\x81", 3) != NULL;

    for (size_t v = 0; v < N_VOCABS; v++) {
        const kvg_tokenizer *t = toks[v];
        int32_t *ids;
        size_t n;
        char err[256];
        int rc = kvg_tokenizer_encode(t, text, size, 0, &ids, &n, err, sizeof err);
        if (!valid) {
            if (rc != -1 || strncmp(err, "invalid UTF-8 at byte offset ", 29) != 0)
                abort();
            continue;
        }
        if (rc != 0)
            abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= kvg_tokenizer_vocab_size(t))
                abort();
        char *dec;
        size_t len;
        if (kvg_tokenizer_decode(t, ids, n, &dec, &len, err, sizeof err) != 0)
            abort();
        if ((vocabs[v].round_trips == 2 || (vocabs[v].round_trips == 1 && !has_lower_block))
            && (len != size || memcmp(dec, data, size) != 0))
            abort();

        /* Streaming: whole characters at every step, adding up to the decode. */
        char *stream = malloc(len + 16), buf[1024];
        size_t o = 0;
        kvg_detok d;
        kvg_detok_init(&d, t);
        for (size_t i = 0; i < n; i++) {
            long w = kvg_detok_push(&d, ids[i], buf, sizeof buf);
            if (w < 0 || kvg_utf8_invalid_at((const unsigned char *)buf, (size_t)w) != (size_t)-1
                || o + (size_t)w > len)
                abort();
            memcpy(stream + o, buf, (size_t)w);
            o += (size_t)w;
        }
        if (kvg_detok_flush(&d, buf, sizeof buf) != 0 || o != len || memcmp(stream, dec, len) != 0)
            abort();
        free(stream);
        free(dec);
        free(ids);

        /* With BOS and special tokens: still ids in range. */
        if (kvg_tokenizer_encode(t, text, size, KVG_ENC_BOS | KVG_ENC_PARSE_SPECIAL, &ids, &n, err,
                                 sizeof err) != 0)
            abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= kvg_tokenizer_vocab_size(t))
                abort();
        free(ids);
    }
    return 0;
}
