/* Writes a GGUF model file (arch llama) in the synthetic shapes, with the real Llama 2
 * vocabulary, so that kvgate and llama.cpp can be timed on identical weights.
 *
 *   build/bench/synth_gguf --shape 15M|110M|tiny --dtype f32|f16|bf16|q8_0|q4_0|q4_k|q6_k
 *                          --vocab VOCAB.gguf --out FILE.gguf [--seed N] [--ctx N]
 *                          [--chat-template FILE.jinja]
 *
 * Weights: the generator of engine/model_synthetic.c, reproduced here (a counter-based
 * Weyl sequence through the murmur3 finalizer, uniform in +-1/sqrt(fan_in), tensor k
 * seeded with fmix32(seed + k * 0x632be5ab), tensors in the same order), so that an
 * F32 file of the 15M or 110M shape holds bit for bit the weights of synthetic:15M /
 * synthetic:110M. Other dtypes are conversions of those F32 values: F16 and BF16 round
 * to nearest even, the quantized types go through the reference quantizers of
 * src/quant.h. Norm weights are 1 and stay F32 in every file (as llama.cpp's own
 * converters keep them). Embeddings are tied (no output.weight), as in the presets.
 *
 * --ctx N overrides the context length written (the 110M preset's 1,024 is too short for
 * a 1,000-token prompt plus the bench's headroom; RoPE models have no learned positions,
 * so only the limit changes).
 *
 * "tiny" (dim 256, hidden 512, 2 layers, 8/4 heads, context 256) keeps the 32,000-piece
 * vocabulary: ~40 MiB in F32, for the test that keeps this writer from rotting.
 *
 * The tokenizer: every tokenizer.* key of VOCAB.gguf (a vocabulary-only GGUF, e.g.
 * ../shared/tokenizers/vectors/ggml-vocab-llama-spm.gguf), copied value for value;
 * --chat-template puts FILE's text in tokenizer.chat_template instead of the
 * vocabulary's (a model that carries its template, for the gateway's tests).
 *
 * Exit status: 0 written, 1 error, 2 usage, 3 the dtype needs src/quant.h, which this
 * build does not have (the caller skips that row). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_testing.h"
#include "model_testing.h"

#if defined(__has_include)
#if __has_include("quant.h")
#include "quant.h"
#include "quant_testing.h"
#define HAVE_QUANT 1
#endif
#endif
#ifndef HAVE_QUANT
#define HAVE_QUANT 0
#endif

#define DEFAULT_SEED 0x6b766761u          /* "kvga", as model_synthetic.c */
#define ALIGN 32

typedef struct shape {
    const char *name;
    int dim, hidden, layers, heads, kv_heads, ctx;
} shape;

/* 15M and 110M: engine/model_synthetic.c's presets (vocab 32000, tied). */
static const shape shapes[] = {
    { "tiny", 256, 512, 2, 8, 4, 256 },   /* K dims multiples of 256: every block type */
    { "15M", 288, 768, 6, 6, 6, 256 },
    { "110M", 768, 2048, 12, 12, 12, 1024 },
};

typedef struct dtype_info {
    const char *name;
    uint32_t ggml;               /* GGML type id */
    int block;                   /* elements per block */
    size_t block_bytes;
    int quant;                   /* index into kvg_qtype when quantized, else -1 */
} dtype_info;

static const dtype_info dtypes[] = {
    { "f32", 0, 1, 4, -1 },   { "f16", 1, 1, 2, -1 },   { "bf16", 30, 1, 2, -1 },
    { "q8_0", 8, 32, 34, 0 }, { "q4_0", 2, 32, 18, 1 }, { "q4_k", 12, 256, 144, 2 },
    { "q6_k", 14, 256, 210, 3 },
};

static inline uint32_t fmix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}

/* model_synthetic.c's GEN_LOOP: 24 random bits give the odd integer 2u + 1 - 2^24,
 * exactly representable, scaled by scale * 2^-24 in one rounding. */
static void gen(float *dst, uint64_t n, uint32_t seed, float scale)
{
    float s = scale * 0x1p-24f;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t x = fmix32((uint32_t)i * 0x9e3779b9u + seed);
        int32_t v = (int32_t)(x >> 8) * 2 + 1 - (1 << 24);
        dst[i] = (float)v * s;
    }
}

typedef struct tensor {
    char name[64];
    int64_t rows, cols;          /* rows 0: a vector of cols */
    float fan_in;                /* 0: a norm (ones, F32) */
    uint32_t seed;
    uint64_t offset, bytes;
    uint32_t ggml;
} tensor;

/* ---- little-endian writer ---- */
static FILE *out;
static int wfail;

static void wb(const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, out) != n)
        wfail = 1;
}
static void wle(uint64_t v, int n)
{
    unsigned char t[8];
    for (int i = 0; i < n; i++)
        t[i] = (unsigned char)(v >> (8 * i));
    wb(t, (size_t)n);
}
static void wstr(const char *s, size_t n)
{
    wle(n, 8);
    wb(s, n);
}
static void wkey(const char *k, uint32_t type)
{
    wstr(k, strlen(k));
    wle(type, 4);
}
static void kv_u32(const char *k, uint32_t v)
{
    wkey(k, KVG_GGUF_U32);
    wle(v, 4);
}
static void kv_f32(const char *k, float f)
{
    uint32_t v;
    memcpy(&v, &f, 4);
    wkey(k, KVG_GGUF_F32);
    wle(v, 4);
}
static void kv_str(const char *k, const char *s)
{
    wkey(k, KVG_GGUF_STRING);
    wstr(s, strlen(s));
}

static size_t scalar_size(uint32_t t)
{
    switch (t) {
    case KVG_GGUF_U8: case KVG_GGUF_I8: case KVG_GGUF_BOOL: return 1;
    case KVG_GGUF_U16: case KVG_GGUF_I16: return 2;
    case KVG_GGUF_U32: case KVG_GGUF_I32: case KVG_GGUF_F32: return 4;
    case KVG_GGUF_U64: case KVG_GGUF_I64: case KVG_GGUF_F64: return 8;
    default: return 0;
    }
}

/* Re-serializes one key/value of the vocabulary file. The reader keeps scalars
 * decoded and arrays of scalars packed little-endian, so those are copied as bytes. */
static int copy_kv(const kvg_gguf_kv *kv)
{
    wkey(kv->key, kv->type);
    if (kv->type == KVG_GGUF_STRING) {
        wstr(kv->v.str.s, kv->v.str.len);
    } else if (kv->type == KVG_GGUF_ARRAY) {
        wle(kv->arr_type, 4);
        wle(kv->arr_n, 8);
        if (kv->arr_type == KVG_GGUF_STRING) {
            for (uint64_t i = 0; i < kv->arr_n; i++) {
                kvg_gguf_str s;
                if (kvg_gguf_arr_str(kv, i, &s) < 0)
                    return -1;
                wstr(s.s, s.len);
            }
        } else {
            size_t es = scalar_size(kv->arr_type);
            if (!es)
                return -1;
            wb(kv->arr_data, es * kv->arr_n);
        }
    } else {
        size_t es = scalar_size(kv->type);
        if (!es)
            return -1;
        if (kv->type == KVG_GGUF_F32) {
            float f = (float)kv->v.f;
            uint32_t v;
            memcpy(&v, &f, 4);
            wle(v, 4);
        } else if (kv->type == KVG_GGUF_F64) {
            uint64_t v;
            memcpy(&v, &kv->v.f, 8);
            wle(v, 8);
        } else {
            wle(kv->v.u, (int)es);   /* signed values: two's complement, same bytes */
        }
    }
    return 0;
}

static void pad_to(uint64_t *pos, uint64_t align)
{
    static const unsigned char zeros[ALIGN];
    uint64_t p = (*pos + align - 1) / align * align;
    wb(zeros, (size_t)(p - *pos));
    *pos = p;
}

static uint64_t row_bytes(const dtype_info *d, int64_t cols)
{
    return (uint64_t)(cols / d->block) * d->block_bytes;
}

/* Converts one row of F32 values into dtype d at dst. */
static int convert_row(const dtype_info *d, const float *src, void *dst, int64_t n)
{
    if (d->ggml == 0) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (d->ggml == 1 || d->ggml == 30) {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++)
            h[i] = d->ggml == 1 ? kvg_quant_f32_to_f16(src[i]) : kvgm_f32_to_bf16(src[i]);
    } else {
#if HAVE_QUANT
        static const kvg_qtype q[] = { KVG_Q8_0, KVG_Q4_0, KVG_Q4_K, KVG_Q6_K };
        if (kvg_quant_row(q[d->quant], src, dst, n) < 0)
            return -1;
#else
        (void)dst;
        return -1;
#endif
    }
    return 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: synth_gguf --shape 15M|110M|tiny --dtype f32|f16|bf16|q8_0|q4_0|q4_k|q6_k "
                    "--vocab VOCAB.gguf --out FILE.gguf [--seed N] [--ctx N] [--chat-template FILE]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *shape_name = "15M", *dtype_name = "f32", *vocab_path = NULL, *out_path = NULL;
    const char *template_path = NULL;
    char *template_text = NULL;
    uint32_t seed = DEFAULT_SEED;
    int ctx_len = 0;
    const shape *sh = NULL;
    const dtype_info *dt = NULL;
    char err[512];

    for (int i = 1; i < argc; i += 2) {
        const char *v = argv[i + 1];
        if (i + 1 >= argc)
            return usage();
        if (strcmp(argv[i], "--shape") == 0)
            shape_name = v;
        else if (strcmp(argv[i], "--dtype") == 0)
            dtype_name = v;
        else if (strcmp(argv[i], "--vocab") == 0)
            vocab_path = v;
        else if (strcmp(argv[i], "--out") == 0)
            out_path = v;
        else if (strcmp(argv[i], "--seed") == 0)
            seed = (uint32_t)strtoul(v, NULL, 0);
        else if (strcmp(argv[i], "--ctx") == 0)
            ctx_len = atoi(v);
        else if (strcmp(argv[i], "--chat-template") == 0)
            template_path = v;
        else
            return usage();
    }
    if (!vocab_path || !out_path)
        return usage();
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(shapes[i].name, shape_name) == 0)
            sh = &shapes[i];
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcasecmp(dtypes[i].name, dtype_name) == 0)
            dt = &dtypes[i];
    if (!sh || !dt || ctx_len < 0)
        return usage();
    if (!ctx_len)
        ctx_len = sh->ctx;
    if (template_path) {
        FILE *tf = fopen(template_path, "rb");
        long tn = -1;
        if (tf && fseek(tf, 0, SEEK_END) == 0 && (tn = ftell(tf)) >= 0 && fseek(tf, 0, SEEK_SET) == 0
            && (template_text = calloc(1, (size_t)tn + 1))
            && fread(template_text, 1, (size_t)tn, tf) != (size_t)tn)
            tn = -1;
        if (tf)
            fclose(tf);
        if (tn < 0 || !template_text) {
            fprintf(stderr, "synth_gguf: cannot read %s\n", template_path);
            return 1;
        }
    }
    if (dt->quant >= 0 && !HAVE_QUANT) {
        fprintf(stderr, "synth_gguf: %s needs src/quant.h (not in this build)\n", dt->name);
        return 3;
    }
#if HAVE_QUANT
    if (dt->quant >= 0) {
        /* This table and src/quant.h describe the same formats. */
        static const kvg_qtype q[] = { KVG_Q8_0, KVG_Q4_0, KVG_Q4_K, KVG_Q6_K };
        kvg_qtype t = q[dt->quant];
        if (kvg_quant_ggml_type(t) != dt->ggml || kvg_quant_block_bytes(t) != dt->block_bytes
            || kvg_quant_block_elems(t) != dt->block) {
            fprintf(stderr, "synth_gguf: %s: src/quant.h disagrees on the block format\n", dt->name);
            return 1;
        }
    }
#endif

    kvg_gguf *vg = kvg_gguf_open(vocab_path, err, sizeof err);
    if (!vg) {
        fprintf(stderr, "synth_gguf: %s\n", err);
        return 1;
    }
    const kvg_gguf_kv *toks = kvg_gguf_get_arr(vg, "tokenizer.ggml.tokens", KVG_GGUF_STRING);
    if (!toks) {
        fprintf(stderr, "synth_gguf: %s has no tokenizer.ggml.tokens\n", vocab_path);
        return 1;
    }
    const int64_t V = (int64_t)toks->arr_n, D = sh->dim, H = sh->hidden, HD = sh->dim / sh->heads,
                  Q = (int64_t)sh->heads * HD, KV = (int64_t)sh->kv_heads * HD;
    if (D % dt->block || H % dt->block || Q % dt->block) {
        fprintf(stderr, "synth_gguf: shape %s does not divide into %s blocks of %d\n", sh->name, dt->name,
                dt->block);
        return 1;
    }

    /* Tensors in model_synthetic.c's generation order (the seeds count matrices only);
     * norms interleaved where the GGUF naming puts them. */
    tensor *ts = calloc((size_t)(2 + 9 * sh->layers), sizeof *ts);
    int nt = 0, nmat = 0;
    if (!ts)
        return 1;
#define MAT(nm, r, c, fan) do {                                                            \
        snprintf(ts[nt].name, sizeof ts[nt].name, "%s", nm);                               \
        ts[nt].rows = (r), ts[nt].cols = (c), ts[nt].fan_in = (float)(fan);                \
        ts[nt].seed = fmix32(seed + (uint32_t)nmat++ * 0x632be5abu);                       \
        ts[nt].ggml = dt->ggml;                                                            \
        ts[nt].bytes = (uint64_t)(r) * row_bytes(dt, (c));                                 \
        nt++;                                                                              \
    } while (0)
#define NORM(nm) do {                                                                      \
        snprintf(ts[nt].name, sizeof ts[nt].name, "%s", nm);                               \
        ts[nt].rows = 0, ts[nt].cols = D, ts[nt].fan_in = 0, ts[nt].ggml = 0;              \
        ts[nt].bytes = (uint64_t)D * 4;                                                    \
        nt++;                                                                              \
    } while (0)
    char nm[64];
    MAT("token_embd.weight", V, D, D);
    NORM("output_norm.weight");
    for (int l = 0; l < sh->layers; l++) {
#define LN(x) (snprintf(nm, sizeof nm, "blk.%d." x, l), nm)
        NORM(LN("attn_norm.weight"));
        MAT(LN("attn_q.weight"), Q, D, D);
        MAT(LN("attn_k.weight"), KV, D, D);
        MAT(LN("attn_v.weight"), KV, D, D);
        MAT(LN("attn_output.weight"), D, Q, Q);
        NORM(LN("ffn_norm.weight"));
        MAT(LN("ffn_gate.weight"), H, D, D);
        MAT(LN("ffn_down.weight"), D, H, H);
        MAT(LN("ffn_up.weight"), H, D, D);
#undef LN
    }
#undef MAT
#undef NORM
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        off = (off + ALIGN - 1) / ALIGN * ALIGN;
        ts[i].offset = off;
        off += ts[i].bytes;
    }

    size_t n_tok_kv = template_text ? 1 : 0;
    for (size_t i = 0; i < kvg_gguf_n_kv(vg); i++)
        if (strncmp(kvg_gguf_kv_at(vg, i)->key, "tokenizer.", 10) == 0
            && !(template_text && strcmp(kvg_gguf_kv_at(vg, i)->key, "tokenizer.chat_template") == 0))
            n_tok_kv++;

    out = fopen(out_path, "wb");
    if (!out) {
        fprintf(stderr, "synth_gguf: %s: %s\n", out_path, strerror(errno));
        return 1;
    }
    char gname[96];
    snprintf(gname, sizeof gname, "kvgate-synthetic %s %s seed=%u", sh->name, dt->name, seed);
    static const uint32_t file_type[] = { 0, 1, 32, 7, 2, 15, 18 };  /* llama_ftype: ALL_F32, MOSTLY_F16, ... */
    wb("GGUF", 4);
    wle(3, 4);
    wle((uint64_t)nt, 8);
    wle(14 + n_tok_kv, 8);
    kv_str("general.architecture", "llama");
    kv_str("general.name", gname);
    kv_u32("general.alignment", ALIGN);
    kv_u32("general.file_type", file_type[dt - dtypes]);
    kv_u32("llama.context_length", (uint32_t)ctx_len);
    kv_u32("llama.embedding_length", (uint32_t)D);
    kv_u32("llama.feed_forward_length", (uint32_t)H);
    kv_u32("llama.block_count", (uint32_t)sh->layers);
    kv_u32("llama.attention.head_count", (uint32_t)sh->heads);
    kv_u32("llama.attention.head_count_kv", (uint32_t)sh->kv_heads);
    kv_u32("llama.rope.dimension_count", (uint32_t)HD);
    kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kv_f32("llama.rope.freq_base", 10000.0f);
    kv_u32("llama.vocab_size", (uint32_t)V);
    for (size_t i = 0; i < kvg_gguf_n_kv(vg); i++) {
        const kvg_gguf_kv *kv = kvg_gguf_kv_at(vg, i);
        if (template_text && strcmp(kv->key, "tokenizer.chat_template") == 0)
            continue;
        if (strncmp(kv->key, "tokenizer.", 10) == 0 && copy_kv(kv) < 0) {
            fprintf(stderr, "synth_gguf: cannot copy key %s\n", kv->key);
            return 1;
        }
    }
    if (template_text)
        kv_str("tokenizer.chat_template", template_text);
    for (int i = 0; i < nt; i++) {
        wstr(ts[i].name, strlen(ts[i].name));
        wle(ts[i].rows ? 2 : 1, 4);
        wle((uint64_t)ts[i].cols, 8);
        if (ts[i].rows)
            wle((uint64_t)ts[i].rows, 8);
        wle(ts[i].ggml, 4);
        wle(ts[i].offset, 8);
    }
    long here = ftell(out);
    uint64_t pos = here < 0 ? 0 : (uint64_t)here;
    pad_to(&pos, ALIGN);

    float *row = malloc((size_t)(H > D ? H : D) * sizeof *row);
    float *mbuf = NULL;
    void *cbuf = NULL;
    for (int i = 0; i < nt && !wfail; i++) {
        pad_to(&pos, ALIGN);         /* data0 is aligned: absolute and relative agree */
        if (!ts[i].rows) {
            for (int64_t j = 0; j < D; j++)
                row[j] = 1.0f;
            wb(row, (size_t)D * 4);
        } else {
            uint64_t n = (uint64_t)ts[i].rows * (uint64_t)ts[i].cols;
            mbuf = realloc(mbuf, n * sizeof *mbuf);
            cbuf = realloc(cbuf, ts[i].bytes);
            if (!mbuf || !cbuf) {
                fprintf(stderr, "synth_gguf: out of memory\n");
                return 1;
            }
            gen(mbuf, n, ts[i].seed, 1.0f / sqrtf(ts[i].fan_in));
            uint64_t rb = row_bytes(dt, ts[i].cols);
            for (int64_t r = 0; r < ts[i].rows; r++)
                if (convert_row(dt, mbuf + (uint64_t)r * (uint64_t)ts[i].cols, (unsigned char *)cbuf + (uint64_t)r * rb,
                                ts[i].cols) < 0) {
                    fprintf(stderr, "synth_gguf: cannot convert %s to %s\n", ts[i].name, dt->name);
                    return 1;
                }
            wb(cbuf, ts[i].bytes);
        }
        pos += ts[i].bytes;
    }
    free(mbuf);
    free(cbuf);
    free(row);
    if (fclose(out) != 0)
        wfail = 1;
    if (wfail) {
        fprintf(stderr, "synth_gguf: %s: write failed\n", out_path);
        return 1;
    }
    printf("synth_gguf: wrote %s: %s %s, %d tensors, %lld-piece vocabulary, %.1f MiB of weights\n", out_path,
           sh->name, dt->name, nt, (long long)V, (double)off / 1048576.0);
    free(ts);
    kvg_gguf_free(vg);
    return 0;
}
