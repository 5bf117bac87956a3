/* Reference tokenizations from llama.cpp's test-tokenizer-0 fixtures: every
 * string of NAME.gguf.inp must encode (no BOS) to the ids on the matching line
 * of NAME.gguf.out, and decode back to itself. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"
#include "tokenizer.h"
#include "tokenizer_testing.h"

#define SEP "\n__ggml_vocab_test__\n"

typedef struct {
    char *s;
    size_t len;
} str;

/* The .inp file is each test string followed by SEP (so the last piece after
 * the final SEP is empty and is not a test). */
static size_t split_inputs(char *raw, size_t len, str *out, size_t max)
{
    size_t n = 0, pos = 0, sl = strlen(SEP);
    while (pos < len && n < max) {
        char *hit = memmem(raw + pos, len - pos, SEP, sl);
        size_t end = hit ? (size_t)(hit - raw) : len;
        out[n].s = raw + pos;
        out[n].len = end - pos;
        n++;
        if (!hit)
            break;
        pos = end + sl;
    }
    return n;
}

static char *show_ids(const int32_t *v, size_t n)
{
    static char buf[4096];
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o + 16 < sizeof buf; i++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%d", i ? " " : "", v[i]);
    return buf;
}

static void run(const char *vocab, const char *kind)
{
    char path[512], err[256];
    size_t inp_len, out_len;

    snprintf(path, sizeof path, "%s/tokenizers/vectors/%s", shared_dir(), vocab);
    kvg_tokenizer *t = kvg_tokenizer_load(path, err, sizeof err);
    if (!ok(t != NULL, "%s loads", vocab)) {
        diag("%s", err);
        return;
    }
    is_str(kvg_tokenizer_kind(t), kind, "%s kind", vocab);

    snprintf(path, sizeof path, "%s/tokenizers/vectors/%s.inp", shared_dir(), vocab);
    char *inp = slurp(path, &inp_len);
    snprintf(path, sizeof path, "%s/tokenizers/vectors/%s.out", shared_dir(), vocab);
    char *outf = slurp(path, &out_len);
    if (!ok(inp && outf, "%s fixtures readable", vocab)) {
        kvg_tokenizer_free(t);
        return;
    }
    str tests[256];
    size_t n = split_inputs(inp, inp_len, tests, 256);

    size_t line = 0;
    /* strtok_r would skip empty lines (the empty string's ids), so split by hand. */
    char *p = outf;
    while (p < outf + out_len && line < n) {
        char *nl = memchr(p, '\n', (size_t)(outf + out_len - p));
        if (nl)
            *nl = '\0';
        int32_t want[4096];
        size_t n_want = 0;
        char *q = p, *e;
        for (;;) {
            long v = strtol(q, &e, 10);
            if (e == q)
                break;
            want[n_want++] = (int32_t)v;
            q = e;
        }
        int32_t *ids;
        size_t n_ids;
        str s = tests[line];
        int rc = kvg_tokenizer_encode(t, s.s, s.len, 0, &ids, &n_ids, err, sizeof err);
        int same = rc == 0 && n_ids == n_want && memcmp(ids, want, n_ids * sizeof *ids) == 0;
        if (!ok(same, "%s string %zu (%zu bytes)", vocab, line, s.len)) {
            diag("  text '%.*s'", (int)s.len, s.s);
            diag("  want %s", show_ids(want, n_want));
            if (rc == 0)
                diag("  got  %s", show_ids(ids, n_ids));
            else
                diag("  error %s", err);
        }
        if (rc == 0) {
            char *text;
            size_t text_len;
            rc = kvg_tokenizer_decode(t, ids, n_ids, &text, &text_len, err, sizeof err);
            ok(rc == 0 && text_len == s.len && memcmp(text, s.s, s.len) == 0,
               "%s string %zu decodes back", vocab, line);
            if (rc == 0)
                free(text);
            free(ids);
        }
        line++;
        if (!nl)
            break;
        p = nl + 1;
    }
    is_int(line, n, "%s: one reference line per test string", vocab);
    ok(n >= 40, "%s: %zu test strings", vocab, n);
    free(inp);
    free(outf);
    kvg_tokenizer_free(t);
}

/* Vector files whose GGUF is not in the folder (upstream's is too large to
 * bring): named here so that a new one cannot go untested unnoticed. */
static const char *const no_gguf[] = { "command-r", "qwen35", "gemma-4", NULL };

static int listed(const char *name, size_t len)
{
    for (const char *const *n = no_gguf; *n; n++)
        if (strlen(*n) == len && memcmp(*n, name, len) == 0)
            return 1;
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every NAME.gguf.inp in the folder is tested against NAME.gguf, and every
 * GGUF there loads. */
int main(void)
{
    char dir[512], path[1024], err[256];
    char *names[128];
    size_t n = 0, tested = 0;

    snprintf(dir, sizeof dir, "%s/tokenizers/vectors", shared_dir());
    DIR *d = opendir(dir);
    if (!ok(d != NULL, "%s is readable", dir))
        return done_testing();
    struct dirent *de;
    while ((de = readdir(d)) && n < 128)
        if (de->d_name[0] != '.')
            names[n++] = strdup(de->d_name);
    closedir(d);
    qsort(names, n, sizeof *names, by_name);

    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        if (len > 9 && strcmp(names[i] + len - 9, ".gguf.inp") == 0) {
            char gguf[256];
            snprintf(gguf, sizeof gguf, "%.*s", (int)(len - 4), names[i]);
            snprintf(path, sizeof path, "%s/%s", dir, gguf);
            if (access(path, R_OK) == 0) {
                run(gguf, strncmp(gguf, "ggml-vocab-llama-spm", 20) == 0
                          || strncmp(gguf, "ggml-vocab-phi-3", 16) == 0 ? "gguf-llama" : "gguf-gpt2");
                tested++;
            } else {
                ok(listed(names[i] + 11, len - 11 - 9), "%s: vectors without a GGUF are known ones", names[i]);
            }
        } else if (len > 5 && strcmp(names[i] + len - 5, ".gguf") == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            kvg_tokenizer *t = kvg_tokenizer_load(path, err, sizeof err);
            if (!ok(t != NULL, "%s loads", names[i]))
                diag("%s", err);
            kvg_tokenizer_free(t);
        }
        free(names[i]);
    }
    ok(tested >= 11, "%zu vocabularies with vectors tested", tested);
    return done_testing();
}
