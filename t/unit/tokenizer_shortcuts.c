/* The encoder's shortcuts are exact: on long mixed texts,
 *   - splitting SPM text into runs, the word index and the word cache give the
 *     same ids as one merge over the whole text;
 *   - the array path for short words gives the same ids as the heap;
 *   - the GGUF and llama2.c copies of the Llama 2 vocabulary agree;
 *   - threads encoding at once (switching tokenizers) agree with one thread. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "tok_internal.h"
#include "tokenizer.h"

static const char *const words[] = {
    "the", "of", "and", "to", "in", "is", "that", "tokenizer", "Hello", "world", "don't", "I'll",
    "1", "42", "2024", "3.14", "e.g.", "(see", "below)", "--", "...", "!!", "?", "\"quoted\"",
    "caf\xC3\xA9", "na\xC3\xAFve", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
    "\xF0\x9F\x98\x80", "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", "e\xCC\x81", "\xD0\x9F\xD1\x80\xD0\xB8",
    "\xE2\x96\x81", "x\xE2\x96\x81y", "<s>", "<|endoftext|>", "\x01", "\x7f", "zzyzx", "qwertyuiop",
    "antidisestablishmentarianism", "http://example.com/a/b?c=d",
};
static const char *const gaps[] = { " ", " ", " ", " ", "  ", "   ", "\n", "\n\n", "\t", " \n ", "", ", ", ". " };

static char *make_text(unsigned seed, size_t target, size_t *len)
{
    char *s = malloc(target + 256);
    size_t n = 0;
    while (n < target) {
        const char *w = words[((seed = seed * 1103515245 + 12345) >> 16) % (sizeof words / sizeof words[0])];
        const char *g = gaps[((seed = seed * 1103515245 + 12345) >> 16) % (sizeof gaps / sizeof gaps[0])];
        size_t wl = strlen(w), gl = strlen(g);
        memcpy(s + n, w, wl);
        n += wl;
        memcpy(s + n, g, gl);
        n += gl;
    }
    *len = n;
    return s;
}

static kvg_tokenizer *load(const char *rel)
{
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/%s", shared_dir(), rel);
    kvg_tokenizer *t = kvg_tokenizer_load(path, err, sizeof err);
    if (!ok(t != NULL, "load %s", rel))
        diag("%s", err);
    return t;
}

static int32_t *enc(const kvg_tokenizer *t, const char *s, size_t n, unsigned flags, size_t *n_ids)
{
    int32_t *ids;
    char err[256];
    if (kvg_tokenizer_encode(t, s, n, flags, &ids, n_ids, err, sizeof err) < 0) {
        diag("encode: %s", err);
        return NULL;
    }
    return ids;
}

static int same(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    if (!a || !b || na != nb)
        return 0;
    return memcmp(a, b, na * sizeof *a) == 0;
}

/* Ids with every shortcut off: no run splitting, no word index, heap only. */
static int32_t *enc_plain(const char *rel, const char *s, size_t n, size_t *n_ids)
{
    kvg_tokenizer *t = load(rel);       /* a fresh uid: nothing cached for it */
    if (!t)
        return NULL;
    kvg_word_index saved = t->word_index;
    int split = t->spm_split;
    t->word_index.slots = NULL;
    t->spm_split = 0;
    int small = kvg_tok_small_word;
    kvg_tok_small_word = 0;
    int32_t *ids = enc(t, s, n, 0, n_ids);
    kvg_tok_small_word = small;
    t->word_index = saved;
    t->spm_split = split;
    kvg_tokenizer_free(t);
    return ids;
}

static void shortcuts(const char *rel, const char *s, size_t n)
{
    kvg_tokenizer *t = load(rel);
    if (!t)
        return;
    size_t n1, n2, n3;
    int32_t *fast = enc(t, s, n, 0, &n1);
    int32_t *again = enc(t, s, n, 0, &n2);     /* now from the word cache */
    int32_t *plain = enc_plain(rel, s, n, &n3);
    ok(same(fast, n1, again, n2), "%s: a second encode (cached words) is identical", rel);
    ok(same(fast, n1, plain, n3), "%s: %zu bytes -> %zu ids, same as with every shortcut off", rel, n, n1);
    if (t->mode == KVG_TOK_SPM)
        ok(t->spm_split, "%s: run splitting is in use", rel);
    free(fast);
    free(again);
    free(plain);
    kvg_tokenizer_free(t);
}

/* Long single words take the radix queue when the merges are monotone; the
 * heap must give the same ids. */
static void long_words(void)
{
    kvg_tokenizer *t = load("tokenizers/vectors/ggml-vocab-gpt-2.gguf");
    if (!t)
        return;
    ok(t->merge_monotone, "GPT-2 merges are monotone");
    size_t n = 30000;
    char *s = malloc(n);
    unsigned seed = 5;
    for (int kind = 0; kind < 4; kind++) {
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245 + 12345;
            s[i] = kind == 0 ? (char)('0' + (seed >> 16) % 10)
                 : kind == 1 ? (char)('a' + (seed >> 16) % 26)
                 : kind == 2 ? "ab"[i % 2]
                 : "aaab"[(seed >> 16) % 4];
        }
        size_t n1, n2;
        t->merge_monotone = 1;
        int32_t *radix = enc(t, s, n, 0, &n1);
        t->merge_monotone = 0;
        int32_t *heap = enc(t, s, n, 0, &n2);
        ok(same(radix, n1, heap, n2), "one word of %zu bytes (kind %d): radix queue = heap (%zu ids)", n, kind, n1);
        free(radix);
        free(heap);
    }
    t->merge_monotone = 1;
    free(s);
    kvg_tokenizer_free(t);
}

/* ---- threads ---- */

typedef struct job {
    const kvg_tokenizer *t[2];
    const char *text;
    size_t len;
    int32_t *want[2];
    size_t n_want[2];
    int ok;
} job;

static void *worker(void *arg)
{
    job *j = arg;
    j->ok = 1;
    for (int r = 0; r < 6 && j->ok; r++) {
        int k = r & 1;          /* alternate tokenizers: the thread's caches switch */
        size_t n;
        int32_t *ids = enc(j->t[k], j->text, j->len, 0, &n);
        j->ok = same(ids, n, j->want[k], j->n_want[k]);
        free(ids);
    }
    return NULL;
}

static void threads(const char *text, size_t len)
{
    kvg_tokenizer *a = load("tokenizers/vectors/ggml-vocab-gpt-2.gguf");
    kvg_tokenizer *b = load("tokenizers/llama2/tokenizer.bin");
    if (!a || !b)
        return;
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].t[0] = i & 1 ? b : a;
        jobs[i].t[1] = i & 1 ? a : b;
        size_t at = (size_t)i * 1000;
        while (((unsigned char)text[at] & 0xC0) == 0x80)
            at++;               /* start on a character */
        jobs[i].text = text + at;
        jobs[i].len = len - at;
        for (int k = 0; k < 2; k++)
            jobs[i].want[k] = enc(jobs[i].t[k], jobs[i].text, jobs[i].len, 0, &jobs[i].n_want[k]);
    }
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    int all = 1;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        all = all && jobs[i].ok;
        free(jobs[i].want[0]);
        free(jobs[i].want[1]);
    }
    ok(all, "four threads encoding at once, switching tokenizers, agree with one thread");
    kvg_tokenizer_free(a);
    kvg_tokenizer_free(b);
}

int main(void)
{
    size_t len;
    char *text = make_text(2024, 60000, &len);

    shortcuts("tokenizers/llama2/tokenizer.bin", text, len);
    shortcuts("tokenizers/vectors/ggml-vocab-llama-spm.gguf", text, len);
    shortcuts("tokenizers/vectors/ggml-vocab-gpt-2.gguf", text, len);
    shortcuts("models/stories260K/tok512.bin", text, len);

    /* Same vocabulary and scores in two formats: same ids, except that the GGUF
     * copy treats a literal U+2581 as a space (its pieces spell spaces so). */
    kvg_tokenizer *g = load("tokenizers/vectors/ggml-vocab-llama-spm.gguf");
    kvg_tokenizer *l = load("tokenizers/llama2/tokenizer.bin");
    if (g && l) {
        size_t ng, nl, clean = 0;
        char *c = malloc(len);
        for (size_t i = 0; i < len; i++) {
            if (i + 2 < len && memcmp(text + i, "\xE2\x96\x81", 3) == 0) {
                c[clean++] = '_';
                i += 2;
            } else
                c[clean++] = text[i];
        }
        int32_t *a = enc(g, c, clean, KVG_ENC_BOS, &ng), *b = enc(l, c, clean, KVG_ENC_BOS, &nl);
        ok(same(a, ng, b, nl), "GGUF and llama2.c Llama 2 vocabularies agree on %zu bytes (%zu ids)", clean, ng);
        free(a);
        free(b);
        free(c);
    }
    kvg_tokenizer_free(g);
    kvg_tokenizer_free(l);

    long_words();
    threads(text, len);
    free(text);
    return done_testing();
}
