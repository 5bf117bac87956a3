/* GGUF reader: every value type, arrays, tensor infos and data, the real
 * vocabulary files, and hostile input (every truncation, corrupted fields,
 * random byte flips) giving errors instead of crashes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_testing.h"
#include "gguf_builder.h"
#include "tap.h"

/* A file with one key of every type, four arrays, alignment 64 and two tensors. */
static void build_full(gb *b, uint32_t version)
{
    gb_init(b, version, 2, 18);
    gb_key(b, "k.u8", KVG_GGUF_U8);      gb_u8(b, 200);
    gb_key(b, "k.i8", KVG_GGUF_I8);      gb_u8(b, (uint8_t)-5);
    gb_key(b, "k.u16", KVG_GGUF_U16);    gb_u16(b, 60000);
    gb_key(b, "k.i16", KVG_GGUF_I16);    gb_u16(b, (uint16_t)-300);
    gb_key(b, "k.u32", KVG_GGUF_U32);    gb_u32(b, 4000000000u);
    gb_key(b, "k.i32", KVG_GGUF_I32);    gb_u32(b, (uint32_t)-70000);
    gb_key(b, "k.f32", KVG_GGUF_F32);    gb_f32(b, 1.5f);
    gb_key(b, "k.bool", KVG_GGUF_BOOL);  gb_u8(b, 1);
    gb_key(b, "k.str", KVG_GGUF_STRING); gb_str(b, "hello gguf");
    gb_key(b, "k.u64", KVG_GGUF_U64);    gb_u64(b, 1ULL << 40);
    gb_key(b, "k.i64", KVG_GGUF_I64);    gb_u64(b, (uint64_t)-(1LL << 40));
    gb_key(b, "k.f64", KVG_GGUF_F64);    gb_f64(b, -2.25);
    gb_key(b, "a.i32", KVG_GGUF_ARRAY);  gb_arr(b, KVG_GGUF_I32, 3);
    gb_u32(b, 7); gb_u32(b, (uint32_t)-8); gb_u32(b, 9);
    gb_key(b, "a.f32", KVG_GGUF_ARRAY);  gb_arr(b, KVG_GGUF_F32, 2);
    gb_f32(b, 0.5f); gb_f32(b, -1e9f);
    gb_key(b, "a.str", KVG_GGUF_ARRAY);  gb_arr(b, KVG_GGUF_STRING, 3);
    gb_str(b, "one"); gb_str(b, ""); gb_str(b, "three");
    gb_key(b, "a.empty", KVG_GGUF_ARRAY); gb_arr(b, KVG_GGUF_U8, 0);
    gb_key(b, "general.alignment", KVG_GGUF_U32); gb_u32(b, 64);
    gb_key(b, "k.neg", KVG_GGUF_I32);    gb_u32(b, (uint32_t)-1);
    /* tensors: F32 [4, 2] at 0; Q8_0 [64, 3] (2 blocks of 34 bytes per row) at 64 */
    gb_str(b, "t.f32"); gb_u32(b, 2); gb_u64(b, 4); gb_u64(b, 2); gb_u32(b, 0); gb_u64(b, 0);
    gb_str(b, "t.q8"); gb_u32(b, 2); gb_u64(b, 64); gb_u64(b, 3); gb_u32(b, 8); gb_u64(b, 64);
    gb_pad(b, 64);
    for (int i = 0; i < 8; i++)
        gb_f32(b, (float)i);
    gb_pad(b, 64);                  /* the F32 tensor takes 32 bytes; Q8_0 starts at 64 */
    for (int i = 0; i < 3 * 68; i++)
        gb_u8(b, (uint8_t)i);
}

static void full(uint32_t version)
{
    gb b;
    char err[256];
    uint64_t u;
    int64_t i;
    double d;
    int flag;
    kvg_gguf_str s;

    build_full(&b, version);
    kvg_gguf *g = kvg_gguf_parse(b.p, b.n, "full.gguf", err, sizeof err);
    if (!ok(g != NULL, "v%u file parses", version)) {
        diag("%s", err);
        gb_free(&b);
        return;
    }
    is_int(kvg_gguf_version(g), version, "version");
    is_int(kvg_gguf_n_kv(g), 18, "18 keys");
    is_int(kvg_gguf_alignment(g), 64, "general.alignment");
    ok(kvg_gguf_get_u64(g, "k.u8", &u) == 0 && u == 200, "u8");
    ok(kvg_gguf_get_i64(g, "k.i8", &i) == 0 && i == -5, "i8 sign-extends");
    ok(kvg_gguf_get_u64(g, "k.u16", &u) == 0 && u == 60000, "u16");
    ok(kvg_gguf_get_i64(g, "k.i16", &i) == 0 && i == -300, "i16");
    ok(kvg_gguf_get_u64(g, "k.u32", &u) == 0 && u == 4000000000u, "u32");
    ok(kvg_gguf_get_i64(g, "k.i32", &i) == 0 && i == -70000, "i32");
    ok(kvg_gguf_get_f64(g, "k.f32", &d) == 0 && d == 1.5, "f32");
    ok(kvg_gguf_get_bool(g, "k.bool", &flag) == 0 && flag == 1, "bool");
    ok(kvg_gguf_get_str(g, "k.str", &s) == 0 && s.len == 10 && memcmp(s.s, "hello gguf", 10) == 0, "string");
    ok(kvg_gguf_get_u64(g, "k.u64", &u) == 0 && u == 1ULL << 40, "u64");
    ok(kvg_gguf_get_i64(g, "k.i64", &i) == 0 && i == -(1LL << 40), "i64");
    ok(kvg_gguf_get_f64(g, "k.f64", &d) == 0 && d == -2.25, "f64");
    ok(kvg_gguf_get_f64(g, "k.u32", &d) == 0 && d == 4000000000.0, "get_f64 takes integers");
    ok(kvg_gguf_get_u64(g, "k.neg", &u) < 0, "a negative value is not a u64");
    ok(kvg_gguf_get_u64(g, "k.str", &u) < 0, "a string is not a number");
    ok(kvg_gguf_get_str(g, "k.u8", &s) < 0, "a number is not a string");
    ok(kvg_gguf_get_u64(g, "missing", &u) < 0 && kvg_gguf_find(g, "missing") == NULL, "absent key");

    const kvg_gguf_kv *a = kvg_gguf_get_arr(g, "a.i32", KVG_GGUF_I32);
    ok(a && a->arr_n == 3, "i32 array");
    ok(kvg_gguf_arr_i64(a, 1, &i) == 0 && i == -8, "  element 1");
    ok(kvg_gguf_arr_f64(a, 2, &d) == 0 && d == 9, "  as a float");
    ok(kvg_gguf_arr_i64(a, 3, &i) < 0, "  index 3 is out of range");
    ok(kvg_gguf_get_arr(g, "a.i32", KVG_GGUF_F32) == NULL, "  is not an f32 array");
    a = kvg_gguf_get_arr(g, "a.f32", -1);
    ok(a && kvg_gguf_arr_f64(a, 1, &d) == 0 && d == -1e9, "f32 array");
    ok(kvg_gguf_arr_i64(a, 0, &i) < 0, "  floats are not integers");
    a = kvg_gguf_get_arr(g, "a.str", KVG_GGUF_STRING);
    ok(a && a->arr_n == 3, "string array");
    ok(kvg_gguf_arr_str(a, 0, &s) == 0 && s.len == 3 && memcmp(s.s, "one", 3) == 0, "  element 0");
    ok(kvg_gguf_arr_str(a, 1, &s) == 0 && s.len == 0, "  element 1 is empty");
    ok(kvg_gguf_arr_str(a, 2, &s) == 0 && s.len == 5 && memcmp(s.s, "three", 5) == 0, "  element 2");
    ok(kvg_gguf_arr_str(a, 3, &s) < 0, "  index 3 is out of range");
    a = kvg_gguf_get_arr(g, "a.empty", -1);
    ok(a && a->arr_n == 0 && a->arr_type == KVG_GGUF_U8, "empty u8 array");

    is_int(kvg_gguf_n_tensors(g), 2, "two tensors");
    const kvg_gguf_tensor *t = kvg_gguf_find_tensor(g, "t.f32");
    ok(t && t->n_dims == 2 && t->ne[0] == 4 && t->ne[1] == 2 && t->ne[2] == 1 && t->type == 0,
       "t.f32 shape and type");
    ok(t && t->n_bytes == 32 && t->data, "t.f32 size");
    if (t && t->data) {
        float f[8];
        memcpy(f, t->data, sizeof f);
        ok(f[0] == 0 && f[7] == 7, "t.f32 data");
    }
    t = kvg_gguf_find_tensor(g, "t.q8");
    ok(t && t->type == 8 && t->n_bytes == 3 * 68 && t->offset == 64, "t.q8 size from its block layout");
    ok(t && t->data && ((const unsigned char *)t->data)[5] == 5, "t.q8 data");
    ok(t && (size_t)((const unsigned char *)t->data - b.p) % 64 == 0, "tensor data is aligned in the file");
    ok(kvg_gguf_find_tensor(g, "nope") == NULL, "absent tensor");
    is_str(kvg_gguf_ggml_type_name(12), "Q4_K", "ggml type names");
    kvg_gguf_free(g);

    /* Every truncation fails cleanly and names the file. */
    int all = 1;
    for (size_t n = 0; n < b.n && all; n++) {
        err[0] = '\0';
        kvg_gguf *tg = kvg_gguf_parse(b.p, n, "cut.gguf", err, sizeof err);
        if (tg || strncmp(err, "cut.gguf: ", 10) != 0) {
            all = 0;
            diag("length %zu: %s", n, tg ? "parsed" : err);
            kvg_gguf_free(tg);
        }
    }
    ok(all, "v%u: all %zu truncations fail with a message naming the file", version, b.n);
    gb_free(&b);
}

/* Parses b and expects an error containing `want`. */
static void bad(gb *b, const char *want, const char *name)
{
    char err[256] = "";
    kvg_gguf *g = kvg_gguf_parse(b->p, b->n, "bad.gguf", err, sizeof err);
    if (!ok(!g && strstr(err, want) != NULL, "%s", name))
        diag("  got: %s", g ? "(parsed)" : err);
    kvg_gguf_free(g);
    gb_free(b);
}

static void corrupt(void)
{
    gb b;

    gb_init(&b, 3, 0, 0);
    memcpy(b.p, "GGUG", 4);
    bad(&b, "no 'GGUF' magic", "bad magic");
    gb_init(&b, 1, 0, 0);
    bad(&b, "version 1", "version 1");
    gb_init(&b, 4, 0, 0);
    bad(&b, "version 4", "version 4");
    gb_init(&b, 0x03000000, 0, 0);
    bad(&b, "big-endian", "byte-swapped version");
    gb_init(&b, 3, 0, 1ULL << 60);
    bad(&b, "cannot fit", "absurd key count");
    gb_init(&b, 3, 1ULL << 60, 0);
    bad(&b, "cannot fit", "absurd tensor count");
    gb_init(&b, 3, 0, 1);
    gb_u64(&b, 1ULL << 62);
    gb_u64(&b, 0);
    gb_u64(&b, 0);
    bad(&b, "only 16 bytes remain", "absurd key length");
    gb_init(&b, 3, 0, 1);
    gb_key(&b, "a", KVG_GGUF_ARRAY);
    gb_arr(&b, KVG_GGUF_U64, 1ULL << 61);
    bad(&b, "claims", "absurd array length");
    gb_init(&b, 3, 0, 1);
    gb_key(&b, "a", KVG_GGUF_ARRAY);
    gb_arr(&b, KVG_GGUF_STRING, 1ULL << 40);
    bad(&b, "claims", "absurd string array length");
    gb_init(&b, 3, 0, 1);
    gb_key(&b, "a", KVG_GGUF_ARRAY);
    gb_arr(&b, KVG_GGUF_ARRAY, 1);
    gb_arr(&b, KVG_GGUF_U8, 0);
    bad(&b, "unsupported element type", "nested array");
    gb_init(&b, 3, 0, 1);
    gb_key(&b, "k", 13);
    gb_u64(&b, 0);
    bad(&b, "unknown value type", "unknown value type");
    gb_init(&b, 3, 0, 2);
    gb_key(&b, "k", KVG_GGUF_U8);
    gb_u8(&b, 1);
    gb_key(&b, "k", KVG_GGUF_U8);
    gb_u8(&b, 2);
    bad(&b, "duplicate metadata key 'k'", "duplicate key");
    gb_init(&b, 3, 0, 1);
    gb_key(&b, "general.alignment", KVG_GGUF_U32);
    gb_u32(&b, 48);
    bad(&b, "power-of-two", "alignment not a power of two");
    gb_init(&b, 3, 1, 0);
    gb_str(&b, "t");
    gb_u32(&b, 5);
    for (int i = 0; i < 8; i++)
        gb_u64(&b, 1);
    bad(&b, "5 dimensions", "too many dimensions");
    gb_init(&b, 3, 1, 0);
    gb_str(&b, "t");
    gb_u32(&b, 2);
    gb_u64(&b, 1ULL << 62);
    gb_u64(&b, 1ULL << 62);
    gb_u32(&b, 0);
    gb_u64(&b, 0);
    bad(&b, "impossible shape", "element count overflow");
    gb_init(&b, 3, 1, 0);
    gb_str(&b, "t");
    gb_u32(&b, 1);
    gb_u64(&b, 33);
    gb_u32(&b, 2);              /* Q4_0: blocks of 32 */
    gb_u64(&b, 0);
    gb_pad(&b, 32);
    for (int i = 0; i < 64; i++)
        gb_u8(&b, 0);
    bad(&b, "not a multiple of 32", "row not a whole number of blocks");
    gb_init(&b, 3, 1, 0);
    gb_str(&b, "t");
    gb_u32(&b, 1);
    gb_u64(&b, 4);
    gb_u32(&b, 0);
    gb_u64(&b, 8);
    gb_pad(&b, 32);
    for (int i = 0; i < 64; i++)
        gb_u8(&b, 0);
    bad(&b, "not aligned", "misaligned tensor offset");
    gb_init(&b, 3, 1, 0);
    gb_str(&b, "t");
    gb_u32(&b, 1);
    gb_u64(&b, 1000);
    gb_u32(&b, 0);
    gb_u64(&b, 0);
    gb_pad(&b, 32);
    for (int i = 0; i < 64; i++)
        gb_u8(&b, 0);
    bad(&b, "extends past the end", "tensor data past the end");
    gb_init(&b, 3, 2, 0);
    for (int k = 0; k < 2; k++) {
        gb_str(&b, "same");
        gb_u32(&b, 1);
        gb_u64(&b, 1);
        gb_u32(&b, 0);
        gb_u64(&b, 0);
    }
    gb_pad(&b, 32);
    gb_u32(&b, 0);
    bad(&b, "duplicate tensor name 'same'", "duplicate tensor name");
}

/* Random byte flips over the full file: anything may come back, nothing may crash. */
static void flips(void)
{
    gb b;
    unsigned seed = 7;
    int parsed = 0, failed = 0;

    build_full(&b, 3);
    unsigned char *copy = malloc(b.n);
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(copy, b.p, b.n);
        int k = 1 + (int)((seed = seed * 1103515245 + 12345) >> 16) % 4;
        for (int j = 0; j < k; j++) {
            size_t at = ((seed = seed * 1103515245 + 12345) >> 8) % b.n;
            copy[at] ^= (unsigned char)(1u << (((seed = seed * 1103515245 + 12345) >> 16) % 8));
        }
        char err[256];
        kvg_gguf *g = kvg_gguf_parse(copy, b.n, "flip.gguf", err, sizeof err);
        if (g) {
            parsed++;
            /* Walk everything it claims to have. */
            for (size_t i = 0; i < kvg_gguf_n_kv(g); i++) {
                const kvg_gguf_kv *kv = kvg_gguf_kv_at(g, i);
                for (uint64_t e = 0; kv->type == KVG_GGUF_ARRAY && e < kv->arr_n && e < 16; e++) {
                    kvg_gguf_str s;
                    double d;
                    if (kvg_gguf_arr_str(kv, e, &s) == 0 && s.len)
                        (void)s.s[s.len - 1];
                    (void)kvg_gguf_arr_f64(kv, e, &d);
                }
            }
            for (size_t i = 0; i < kvg_gguf_n_tensors(g); i++) {
                const kvg_gguf_tensor *t = kvg_gguf_tensor_at(g, i);
                if (t->data && t->n_bytes)
                    (void)((const unsigned char *)t->data)[t->n_bytes - 1];
            }
            kvg_gguf_free(g);
        } else
            failed++;
    }
    ok(parsed > 0 && failed > 0, "3000 corrupted copies: %d parsed, %d rejected, no crash", parsed, failed);
    free(copy);
    gb_free(&b);
}

static void real_files(void)
{
    static const struct {
        const char *file;
        size_t n_kv;
        uint64_t n_tokens;
    } files[] = {
        { "ggml-vocab-llama-spm.gguf", 22, 32000 },
        { "ggml-vocab-gpt-2.gguf", 16, 50257 },
    };
    for (size_t i = 0; i < 2; i++) {
        char path[512], err[256];
        snprintf(path, sizeof path, "%s/tokenizers/vectors/%s", shared_dir(), files[i].file);
        kvg_gguf *g = kvg_gguf_open(path, err, sizeof err);
        if (!ok(g != NULL, "%s opens", files[i].file)) {
            diag("%s", err);
            continue;
        }
        is_int(kvg_gguf_n_kv(g), files[i].n_kv, "%s: metadata count", files[i].file);
        const kvg_gguf_kv *tok = kvg_gguf_get_arr(g, "tokenizer.ggml.tokens", KVG_GGUF_STRING);
        ok(tok && tok->arr_n == files[i].n_tokens, "%s: %llu tokens", files[i].file,
           (unsigned long long)files[i].n_tokens);
        kvg_gguf_str s;
        ok(kvg_gguf_get_str(g, "tokenizer.ggml.model", &s) == 0 && s.len > 0, "%s: model name", files[i].file);
        kvg_gguf_free(g);
    }
    char err[256] = "";
    ok(kvg_gguf_open("/nonexistent.gguf", err, sizeof err) == NULL
       && strstr(err, "/nonexistent.gguf: cannot open"), "missing file: error names it");
}

int main(void)
{
    full(3);
    full(2);
    corrupt();
    flips();
    real_files();
    return done_testing();
}
