/* kvg_tokenizer_min_tokens is a true lower bound: for every fixture string of the
 * shared vocabularies (and long texts of one repeated character, the worst case for
 * merges), encoding gives at least that many tokens; and references keep a tokenizer
 * alive until the last one is dropped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "tokenizer.h"

#define SEP "\n__ggml_vocab_test__\n"

static void check(const kvg_tokenizer *t, const char *name, const char *s, size_t len, int *bad)
{
    int32_t *ids;
    size_t n;
    char err[256];
    if (kvg_tokenizer_encode(t, s, len, 0, &ids, &n, err, sizeof err) != 0)
        return;   /* invalid UTF-8 fixtures: nothing to bound */
    if (n < kvg_tokenizer_min_tokens(t, len)) {
        diag("%s: %zu bytes gave %zu tokens, bound says %zu", name, len, n, kvg_tokenizer_min_tokens(t, len));
        (*bad)++;
    }
    free(ids);
}

int main(void)
{
    const char *files[] = { "tokenizers/vectors/ggml-vocab-llama-spm.gguf", "tokenizers/vectors/ggml-vocab-gpt-2.gguf",
                            "tokenizers/llama2/tokenizer.bin", "models/stories260K/tok512.bin" };
    char path[1024], err[256];
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        snprintf(path, sizeof path, "%s/%s", shared_dir(), files[f]);
        kvg_tokenizer *t = kvg_tokenizer_load(path, err, sizeof err);
        if (!ok(t != NULL, "%s loads", files[f])) {
            diag("%s", err);
            continue;
        }
        size_t most = kvg_tokenizer_max_token_bytes(t);
        ok(most >= 4, "%s: longest token text %zu bytes", files[f], most);
        int bad = 0;
        snprintf(path, sizeof path, "%s/%s.inp", shared_dir(), files[f]);
        size_t len;
        char *inp = slurp(path, &len);
        for (char *p = inp; p && p < inp + len;) {
            char *e = strstr(p, SEP);
            size_t l = e ? (size_t)(e - p) : strlen(p);
            check(t, files[f], p, l, &bad);
            p += l + (e ? strlen(SEP) : 0);
            if (!e)
                break;
        }
        free(inp);
        const char *runs[] = { " ", "a", "=", "\xe2\x96\x81", "\n", "-", "0", "\xe4\xb8\xad" };
        for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
            size_t rl = strlen(runs[r]), n = 5000;
            char *s = malloc(rl * n);
            for (size_t i = 0; i < n; i++)
                memcpy(s + i * rl, runs[r], rl);
            check(t, files[f], s, rl * n, &bad);
            free(s);
        }
        is_int(bad, 0, "%s: no text encodes to fewer tokens than the bound", files[f]);

        /* a second reference outlives the first */
        kvg_tokenizer *t2 = kvg_tokenizer_ref(t);
        kvg_tokenizer_free(t);
        int32_t *ids;
        size_t n;
        ok(kvg_tokenizer_encode(t2, "hello world", 11, 0, &ids, &n, err, sizeof err) == 0 && n > 0,
           "%s: usable through a second reference after the first is dropped", files[f]);
        free(ids);
        kvg_tokenizer_free(t2);
    }
    return done_testing();
}
