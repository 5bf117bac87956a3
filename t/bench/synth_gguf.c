/* Writes a random-weight GGUF model file of one of the families llama.cpp runs, in the
 * synthetic shapes, with a real vocabulary, so that kvgate and llama.cpp can be
 * compared and timed on identical weights.
 *
 *   build/bench/synth_gguf [--arch llama|qwen2|qwen3|qwen3moe|gemma2|gemma3|phi3|mistral3|gpt-oss]
 *                          --shape 15M|110M|tiny --dtype f32|f16|bf16|q8_0|q4_0|q4_k|q6_k|mxfp4
 *                          --vocab VOCAB.gguf --out FILE.gguf [--seed N] [--ctx N]
 *                          [--chat-template FILE.jinja]
 *
 * --arch llama (the default) is the original file, unchanged byte for byte: the weights
 * of engine/model_synthetic.c's generator, reproduced here (a counter-based Weyl
 * sequence through the murmur3 finalizer, uniform in +-1/sqrt(fan_in), tensor k seeded
 * with fmix32(seed + k * 0x632be5ab), tensors in the same order), so that an F32 file of
 * the 15M or 110M shape holds bit for bit the weights of synthetic:15M / synthetic:110M;
 * norm weights 1; embeddings tied (no output.weight).
 *
 * The other families take the llama tensors they share from the same seed slots (slot
 * 0 token_embd; layer l's q, k, v, o, gate, down, up: 1 + 7l .. 7 + 7l, whether or not
 * the family has them), and every tensor llama has not (output.weight, biases, q/k
 * norms, routers, experts, ...) the slots after those, in file order. Their norm weights
 * are 1 + 0.2u (u uniform in +-1), not 1, so that a norm an engine skips shows; the
 * logits' matrix (output.weight, or the tied embedding) is scaled up (family.out_gain)
 * so that greedy decoding has clear top-1/top-2 margins; routers get logits of a few
 * units. What each writes, as llama.cpp's loader and converters have it (tiny: dim 256,
 * FFN 512, 4 heads / 2 KV heads; 15M/110M: the preset's heads, head = dim/heads):
 *   qwen2     untied; attn_q/k/v.bias; rope base 1e6, eps 1e-6; head 64.
 *   qwen3     untied; attn_q_norm/attn_k_norm [head]; rope base 1e6, eps 1e-6; head 64.
 *   qwen3moe  qwen3 with ffn_gate_inp [8][dim] (F32) and ffn_{gate,up,down}_exps 3-D
 *             ([8][256][dim], [8][dim][256] in tiny; FFN/2 wide otherwise), expert_count
 *             8, expert_used_count 2, expert_feed_forward_length.
 *   gemma2    tied; head 128 (key_length/value_length); post_attention_norm and
 *             post_ffw_norm; attention.sliding_window ctx/8 (32 in tiny) on even layers
 *             (llama.cpp's fixed pattern 2); attn_logit_softcapping 50,
 *             final_logit_softcapping 30.
 *   gemma3    gemma2's tensors plus attn_q_norm/attn_k_norm [head]; 6 layers at least
 *             (llama.cpp's fixed pattern 6: layers 5, 11, ... global); rope base 1e6 with
 *             linear scaling 8 (rope.scaling.type/factor, as Gemma 3 4B+) on the global
 *             layers, base 10000 unscaled on the sliding ones; no softcaps.
 *   phi3      untied; attn_qkv [q; k; v] and ffn_up [gate; up] fused (q, k, v, gate, up
 *             from their llama slots); partial rotary (rope.dimension_count 3/4 of the
 *             head, as Phi-4-mini); LongRoPE: rope_factors_long/short.weight [n_rot/2],
 *             rope.scaling.original_context_length ctx/4 (64 in tiny; llama.cpp takes the
 *             long factors when its context per sequence exceeds it), and
 *             rope.scaling.attn_factor sqrt(1 + ln(ctx/orig)/ln(orig)). No sliding_window
 *             key: llama.cpp disables Phi-3's window (and warns when the key is there).
 *   mistral3  llama's tensors, untied; YaRN (factor 4, original context ctx/4, betas 32/1,
 *             yarn_log_multiplier 1) and attention.temperature_scale 0.1, as Ministral 3.
 *   gpt-oss   untied; biases on q, k, v, o, the router and the experts
 *             (ffn_*_exps.bias [8][256] / [8][dim]); attn_sinks [heads];
 *             post_attention_norm as the experts' norm (no ffn_norm); 8 experts, 4 used;
 *             attention.sliding_window ctx/8 on even layers (pattern 2); YaRN (factor 4,
 *             original context ctx/4); rope base 150000.
 *
 * Dtypes: every matrix in --dtype, except the routers (F32, as the converters and
 * llama-quantize keep them); vectors (norms, biases, sinks, rope factors) are always F32.
 * F16 and BF16 round the F32 values to nearest even, the quantized types go through the
 * reference quantizers of src/quant.h. --dtype mxfp4 (gpt-oss only): the experts in
 * MXFP4 (GGML type 39), the other matrices BF16, general.file_type MOSTLY_MXFP4_MOE.
 *
 * --ctx N overrides the context length written (the 110M preset's 1,024 is too short for
 * a 1,000-token prompt plus the bench's headroom; RoPE models have no learned positions,
 * so only the limit changes; windows and original contexts stay those of the preset).
 *
 * "tiny" keeps the 32,000-piece vocabulary: ~36 MiB in F32 (llama), for the tests.
 *
 * The tokenizer: every tokenizer.* key of VOCAB.gguf (a vocabulary-only GGUF, e.g.
 * ../shared/tokenizers/vectors/ggml-vocab-llama-spm.gguf, which llama.cpp accepts under
 * every family here), copied value for value; --chat-template puts FILE's text in
 * tokenizer.chat_template instead of the vocabulary's (a model that carries its
 * template, for the gateway's tests).
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
    uint32_t file_type;          /* llama_ftype: ALL_F32, MOSTLY_F16, ... */
} dtype_info;

enum { DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_K, DT_Q6_K, DT_MXFP4 };
static const dtype_info dtypes[] = {
    { "f32", 0, 1, 4, -1, 0 },     { "f16", 1, 1, 2, -1, 1 },     { "bf16", 30, 1, 2, -1, 32 },
    { "q8_0", 8, 32, 34, 0, 7 },   { "q4_0", 2, 32, 18, 1, 2 },   { "q4_k", 12, 256, 144, 2, 15 },
    { "q6_k", 14, 256, 210, 3, 18 },
    /* gpt-oss only: the experts in MXFP4, the other matrices BF16 (MOSTLY_MXFP4_MOE) */
    { "mxfp4", 39, 32, 17, 4, 38 },
};

/* ---- the families ---- */

enum {
    F_UNTIED = 1 << 0,           /* output.weight of its own (else tied to token_embd) */
    F_QKV_BIAS = 1 << 1,         /* attn_q/k/v.bias */
    F_QK_NORM = 1 << 2,          /* attn_q_norm / attn_k_norm, RMS over head_dim */
    F_SANDWICH = 1 << 3,         /* post_attention_norm and post_ffw_norm (Gemma 2/3) */
    F_FUSED = 1 << 4,            /* attn_qkv and ffn_up = [gate; up] (Phi-3) */
    F_MOE = 1 << 5,              /* ffn_gate_inp + 3-D ffn_*_exps */
    F_OAI = 1 << 6,              /* gpt-oss: biases everywhere, attn_sinks, post_attention_norm as the FFN's norm */
};

typedef struct family {
    const char *name;            /* general.architecture, the keys' prefix */
    unsigned flags;
    float rms_eps, rope_base;
    int tiny_head_dim;           /* tiny's heads: 4 of it, 2 KV heads (llama keeps its shape) */
    int min_layers;              /* gemma3: 6, for one global layer at its fixed pattern 6 */
    int n_expert, n_expert_used;
    /* The logits' gain: output.weight's amplitude over the generator's 1/sqrt(dim), or
     * with tied embeddings the final norm's weights: large enough that greedy decoding
     * has clear top-1/top-2 margins (measured with llama.cpp; see the header); gemma2's
     * smaller, under its final softcap of 30. */
    float out_gain;
} family;

static const family families[] = {
    { "llama", 0, 1e-5f, 10000.0f, 0, 0, 0, 0, 1.0f },
    { "qwen2", F_UNTIED | F_QKV_BIAS, 1e-6f, 1000000.0f, 64, 0, 0, 0, 32.0f },
    { "qwen3", F_UNTIED | F_QK_NORM, 1e-6f, 1000000.0f, 64, 0, 0, 0, 32.0f },
    { "qwen3moe", F_UNTIED | F_QK_NORM | F_MOE, 1e-6f, 1000000.0f, 64, 0, 8, 2, 32.0f },
    { "gemma2", F_SANDWICH, 1e-6f, 10000.0f, 128, 0, 0, 0, 8.0f },
    { "gemma3", F_SANDWICH | F_QK_NORM, 1e-6f, 1000000.0f, 128, 6, 0, 0, 32.0f },
    { "phi3", F_UNTIED | F_FUSED, 1e-5f, 10000.0f, 64, 0, 0, 0, 32.0f },
    { "mistral3", F_UNTIED, 1e-5f, 1000000.0f, 64, 0, 0, 0, 32.0f },
    { "gpt-oss", F_UNTIED | F_MOE | F_OAI, 1e-5f, 150000.0f, 64, 0, 8, 4, 32.0f },
};
#define FAM_IS(f, n) (strcmp((f)->name, n) == 0)

/* The hyperparameters written. */
typedef struct hparams {
    int64_t D, H, L, heads, kv_heads, hd, n_rot, Q, KV, V;
    int64_t n_expert, n_used, ff_exp;
    int ctx, swa, orig_ctx;      /* swa: window (0: none); orig_ctx: YaRN's / LongRoPE's original context */
    float rope_scale;            /* YaRN / linear factor (0: none) */
} hparams;

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

/* What a tensor holds. */
typedef enum vkind {
    V_MAT,                       /* rows of uniform +-scale, from one or more generators (parts) */
    V_ONES,                      /* llama's norms */
    V_VEC,                       /* base + uniform +-scale: norms (base 1), biases, sinks, rope factors */
} vkind;

typedef struct part {
    int64_t rows;
    uint32_t seed;
    float scale;
} part;

typedef struct tensor {
    char name[64];
    int n_dims;
    int64_t ne[3];               /* GGML order: ne[0] the row length (cols) */
    vkind kind;
    int nparts;
    part parts[3];               /* V_MAT: row blocks in order (fused tensors), each its generator */
    float base, scale;           /* V_VEC */
    uint32_t seed;               /* V_VEC */
    const dtype_info *dt;
    uint64_t offset, bytes;
} tensor;

static uint64_t tensor_elems(const tensor *t)
{
    uint64_t n = 1;
    for (int d = 0; d < t->n_dims; d++)
        n *= (uint64_t)t->ne[d];
    return n;
}

/* ---- little-endian writer ---- */
static FILE *out;
static int wfail;
static uint64_t n_kv;            /* keys written so far (the header's count) */

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
    n_kv++;
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

/* The family's keys: ARCH.<rest>. */
static const char *arch_prefix;
static const char *ak(const char *rest)
{
    static char k[128];
    snprintf(k, sizeof k, "%s.%s", arch_prefix, rest);
    return k;
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

#if HAVE_QUANT
static const kvg_qtype qtypes[] = { KVG_Q8_0, KVG_Q4_0, KVG_Q4_K, KVG_Q6_K, KVG_MXFP4 };
#endif

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
        if (kvg_quant_row(qtypes[d->quant], src, dst, n) < 0)
            return -1;
#else
        (void)dst;
        return -1;
#endif
    }
    return 0;
}

/* ---- the tensor list ---- */

typedef struct builder {
    tensor *ts;
    int nt, cap;
    uint32_t seed;
    int n_extra, n_base;         /* seeds of tensors llama does not have: slots n_base + k */
    const dtype_info *mat_dt;    /* the matrices' dtype */
} builder;

/* Seed slot k: model_synthetic.c's fmix32(seed + k * 0x632be5ab). Slots 0 .. 7L: the
 * llama tensors (token_embd; per layer q, k, v, o, gate, down, up), whichever family;
 * other tensors take the following slots in the order they are listed. */
static uint32_t slot_seed(const builder *b, int k)
{
    return fmix32(b->seed + (uint32_t)k * 0x632be5abu);
}
static uint32_t extra_seed(builder *b)
{
    return slot_seed(b, b->n_base + b->n_extra++);
}

static tensor *add(builder *b, const char *name, int n_dims, int64_t ne0, int64_t ne1, int64_t ne2)
{
    if (b->nt == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        tensor *n = realloc(b->ts, (size_t)b->cap * sizeof *n);
        if (!n) {
            fprintf(stderr, "synth_gguf: out of memory\n");
            exit(1);
        }
        b->ts = n;
    }
    tensor *t = &b->ts[b->nt++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0, t->ne[1] = ne1, t->ne[2] = ne2;
    return t;
}

/* A matrix [rows][cols] (or [n][rows][cols] for n experts, ne2 > 1) from one generator:
 * uniform +-gain/sqrt(fan_in). */
static tensor *mat(builder *b, const char *name, int64_t rows, int64_t cols, int64_t n, float fan_in, float gain,
                   uint32_t seed)
{
    tensor *t = add(b, name, n > 1 ? 3 : 2, cols, rows, n);
    t->kind = V_MAT;
    t->nparts = 1;
    t->parts[0] = (part){ rows * n, seed, gain / sqrtf(fan_in) };
    t->dt = b->mat_dt;
    return t;
}

/* A vector-like tensor (norms, biases, ...) in F32, as every converter keeps them. */
static tensor *vec(builder *b, const char *name, int n_dims, int64_t ne0, int64_t ne1, vkind kind, float base,
                   float scale)
{
    tensor *t = add(b, name, n_dims, ne0, ne1, 1);
    t->kind = kind;
    t->base = base, t->scale = scale;
    if (kind == V_VEC)
        t->seed = extra_seed(b);
    t->dt = &dtypes[DT_F32];
    return t;
}

#define NORM_SPREAD 0.2f         /* norms 1 +- 0.2: a missing or misplaced one shows */
#define BIAS_SCALE 0.1f
#define ROUTER_GAIN 4.0f         /* router logits of a few units: clear top-k choices */
/* Sharp attention (scores of several units): with the diffuse softmax of random q and k
 * the attention output is a near-constant average over the context, which Gemma's
 * post-attention norm blows up to dominate the residual (greedy decoding then repeats
 * one token), and which would test positions (RoPE, windows) weakly in any family.
 * q and k weights at 4x, or the q/k norms at 2 where those normalize q and k. */
#define QK_GAIN 4.0f
#define QK_NORM_GAIN 2.0f

static void build(builder *b, const family *f, const hparams *hp)
{
    const int llama = FAM_IS(f, "llama");
    const float nb = llama ? 0 : NORM_SPREAD;
    const vkind nk = llama ? V_ONES : V_VEC;
    const int64_t D = hp->D, H = hp->H, Q = hp->Q, KV = hp->KV, E = hp->n_expert, F = hp->ff_exp;
    const dtype_info *mat_dt = b->mat_dt;
    const float qk = llama || f->flags & F_QK_NORM ? 1.0f : QK_GAIN;
    char nm[64];

    b->n_base = 1 + 7 * (int)hp->L;
    /* The logits' gain: on output.weight; with tied embeddings on the final norm
     * instead (a larger embedding would make the input token dominate the residual
     * stream: the model would echo it). */
    const float g = f->out_gain;
    mat(b, "token_embd.weight", hp->V, D, 1, (float)D, 1.0f, slot_seed(b, 0));
    if (f->flags & F_UNTIED || llama)
        vec(b, "output_norm.weight", 1, D, 0, nk, 1.0f, nb);
    else
        vec(b, "output_norm.weight", 1, D, 0, nk, g, g * nb);
    if (f->flags & F_UNTIED)
        mat(b, "output.weight", hp->V, D, 1, (float)D, g, extra_seed(b));
    if (FAM_IS(f, "phi3")) {
        /* LongRoPE: one divisor of the angle per rotated pair; long factors in [1, 7],
         * short ones in [1, 1.2], so that taking the wrong set shows */
        vec(b, "rope_factors_long.weight", 1, hp->n_rot / 2, 0, V_VEC, 4.0f, 3.0f);
        vec(b, "rope_factors_short.weight", 1, hp->n_rot / 2, 0, V_VEC, 1.1f, 0.1f);
    }
    for (int l = 0; l < hp->L; l++) {
        const int k0 = 1 + 7 * l;   /* this layer's llama slots: q k v o gate down up */
#define LN(x) (snprintf(nm, sizeof nm, "blk.%d." x, l), nm)
        vec(b, LN("attn_norm.weight"), 1, D, 0, nk, 1.0f, nb);
        if (f->flags & F_FUSED) {
            tensor *t = mat(b, LN("attn_qkv.weight"), Q + 2 * KV, D, 1, (float)D, qk, slot_seed(b, k0));
            t->nparts = 3;
            t->parts[0].rows = Q;
            t->parts[1] = (part){ KV, slot_seed(b, k0 + 1), t->parts[0].scale };
            t->parts[2] = (part){ KV, slot_seed(b, k0 + 2), 1.0f / sqrtf((float)D) };
        } else {
            mat(b, LN("attn_q.weight"), Q, D, 1, (float)D, qk, slot_seed(b, k0));
            mat(b, LN("attn_k.weight"), KV, D, 1, (float)D, qk, slot_seed(b, k0 + 1));
            mat(b, LN("attn_v.weight"), KV, D, 1, (float)D, 1.0f, slot_seed(b, k0 + 2));
        }
        mat(b, LN("attn_output.weight"), D, Q, 1, (float)Q, 1.0f, slot_seed(b, k0 + 3));
        if (f->flags & (F_QKV_BIAS | F_OAI)) {
            vec(b, LN("attn_q.bias"), 1, Q, 0, V_VEC, 0, BIAS_SCALE);
            vec(b, LN("attn_k.bias"), 1, KV, 0, V_VEC, 0, BIAS_SCALE);
            vec(b, LN("attn_v.bias"), 1, KV, 0, V_VEC, 0, BIAS_SCALE);
        }
        if (f->flags & F_OAI) {
            vec(b, LN("attn_output.bias"), 1, D, 0, V_VEC, 0, BIAS_SCALE);
            /* one logit per head that joins the softmax's denominator */
            vec(b, LN("attn_sinks.weight"), 1, hp->heads, 0, V_VEC, 0, 1.0f);
        }
        if (f->flags & F_QK_NORM) {
            vec(b, LN("attn_q_norm.weight"), 1, hp->hd, 0, V_VEC, QK_NORM_GAIN, QK_NORM_GAIN * nb);
            vec(b, LN("attn_k_norm.weight"), 1, hp->hd, 0, V_VEC, QK_NORM_GAIN, QK_NORM_GAIN * nb);
        }
        if (f->flags & F_SANDWICH)
            vec(b, LN("post_attention_norm.weight"), 1, D, 0, V_VEC, 1.0f, nb);
        /* gpt-oss's norm before the experts is named post_attention_norm */
        vec(b, f->flags & F_OAI ? LN("post_attention_norm.weight") : LN("ffn_norm.weight"), 1, D, 0, nk, 1.0f, nb);
        if (f->flags & F_MOE) {
            tensor *r = mat(b, LN("ffn_gate_inp.weight"), E, D, 1, (float)D, ROUTER_GAIN, extra_seed(b));
            r->dt = &dtypes[DT_F32];   /* the converters and llama-quantize keep the router F32 */
            mat(b, LN("ffn_gate_exps.weight"), F, D, E, (float)D, 1.0f, extra_seed(b));
            mat(b, LN("ffn_down_exps.weight"), D, F, E, (float)F, 1.0f, extra_seed(b));
            mat(b, LN("ffn_up_exps.weight"), F, D, E, (float)D, 1.0f, extra_seed(b));
            if (f->flags & F_OAI) {
                vec(b, LN("ffn_gate_inp.bias"), 1, E, 0, V_VEC, 0, 0.5f);
                vec(b, LN("ffn_gate_exps.bias"), 2, F, E, V_VEC, 0, BIAS_SCALE);
                vec(b, LN("ffn_down_exps.bias"), 2, D, E, V_VEC, 0, BIAS_SCALE);
                vec(b, LN("ffn_up_exps.bias"), 2, F, E, V_VEC, 0, BIAS_SCALE);
            }
        } else if (f->flags & F_FUSED) {
            /* ffn_up = [gate; up]: the gate's rows first, as Phi-3's gate_up_proj */
            mat(b, LN("ffn_down.weight"), D, H, 1, (float)H, 1.0f, slot_seed(b, k0 + 5));
            tensor *t = mat(b, LN("ffn_up.weight"), 2 * H, D, 1, (float)D, 1.0f, slot_seed(b, k0 + 4));
            t->nparts = 2;
            t->parts[0].rows = H;
            t->parts[1] = (part){ H, slot_seed(b, k0 + 6), t->parts[0].scale };
        } else {
            mat(b, LN("ffn_gate.weight"), H, D, 1, (float)D, 1.0f, slot_seed(b, k0 + 4));
            mat(b, LN("ffn_down.weight"), D, H, 1, (float)H, 1.0f, slot_seed(b, k0 + 5));
            mat(b, LN("ffn_up.weight"), H, D, 1, (float)D, 1.0f, slot_seed(b, k0 + 6));
        }
        if (f->flags & F_SANDWICH)
            vec(b, LN("post_ffw_norm.weight"), 1, D, 0, V_VEC, 1.0f, nb);
#undef LN
    }
    /* MXFP4 files: everything but the experts (and the F32 vectors and router) in BF16 */
    if (mat_dt == &dtypes[DT_MXFP4])
        for (int i = 0; i < b->nt; i++)
            if (b->ts[i].dt == mat_dt && !strstr(b->ts[i].name, "_exps."))
                b->ts[i].dt = &dtypes[DT_BF16];
}

/* ---- the keys ---- */

static void write_arch_keys(const family *f, const hparams *hp)
{
    kv_u32(ak("context_length"), (uint32_t)hp->ctx);
    kv_u32(ak("embedding_length"), (uint32_t)hp->D);
    kv_u32(ak("feed_forward_length"), (uint32_t)hp->H);
    kv_u32(ak("block_count"), (uint32_t)hp->L);
    kv_u32(ak("attention.head_count"), (uint32_t)hp->heads);
    kv_u32(ak("attention.head_count_kv"), (uint32_t)hp->kv_heads);
    if (!FAM_IS(f, "llama")) {
        kv_u32(ak("attention.key_length"), (uint32_t)hp->hd);
        kv_u32(ak("attention.value_length"), (uint32_t)hp->hd);
    }
    kv_u32(ak("rope.dimension_count"), (uint32_t)hp->n_rot);
    kv_f32(ak("attention.layer_norm_rms_epsilon"), f->rms_eps);
    kv_f32(ak("rope.freq_base"), f->rope_base);
    kv_u32(ak("vocab_size"), (uint32_t)hp->V);
    if (f->flags & F_MOE) {
        kv_u32(ak("expert_count"), (uint32_t)hp->n_expert);
        kv_u32(ak("expert_used_count"), (uint32_t)hp->n_used);
        kv_u32(ak("expert_feed_forward_length"), (uint32_t)hp->ff_exp);
    }
    if (hp->swa)
        kv_u32(ak("attention.sliding_window"), (uint32_t)hp->swa);
    if (FAM_IS(f, "gemma2")) {
        kv_f32(ak("attn_logit_softcapping"), 50.0f);
        kv_f32(ak("final_logit_softcapping"), 30.0f);
    } else if (FAM_IS(f, "gemma3")) {
        /* Gemma 3 4B and up: linear scaling 8 of the global layers' positions */
        kv_str(ak("rope.scaling.type"), "linear");
        kv_f32(ak("rope.scaling.factor"), hp->rope_scale);
    } else if (FAM_IS(f, "phi3")) {
        /* LongRoPE (Phi-3 128k): llama.cpp multiplies cos/sin by attn_factor =
         * sqrt(1 + ln(ctx / orig) / ln(orig)) */
        kv_u32(ak("rope.scaling.original_context_length"), (uint32_t)hp->orig_ctx);
        kv_f32(ak("rope.scaling.attn_factor"),
               sqrtf(1.0f + logf((float)hp->ctx / (float)hp->orig_ctx) / logf((float)hp->orig_ctx)));
    } else if (FAM_IS(f, "gpt-oss") || FAM_IS(f, "mistral3")) {
        kv_str(ak("rope.scaling.type"), "yarn");
        kv_f32(ak("rope.scaling.factor"), hp->rope_scale);
        kv_u32(ak("rope.scaling.original_context_length"), (uint32_t)hp->orig_ctx);
        if (FAM_IS(f, "mistral3")) {
            /* as Ministral 3's converter: YaRN's betas and log multiplier, and Llama 4's
             * position-dependent query temperature (its floor scale: orig_ctx) */
            kv_f32(ak("rope.scaling.yarn_beta_fast"), 32.0f);
            kv_f32(ak("rope.scaling.yarn_beta_slow"), 1.0f);
            kv_f32(ak("rope.scaling.yarn_log_multiplier"), 1.0f);
            kv_f32(ak("attention.temperature_scale"), 0.1f);
        }
    }
}

static int usage(void)
{
    fprintf(stderr, "usage: synth_gguf [--arch llama|qwen2|qwen3|qwen3moe|gemma2|gemma3|phi3|mistral3|gpt-oss] "
                    "--shape 15M|110M|tiny --dtype f32|f16|bf16|q8_0|q4_0|q4_k|q6_k|mxfp4 "
                    "--vocab VOCAB.gguf --out FILE.gguf [--seed N] [--ctx N] [--chat-template FILE]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *shape_name = "15M", *dtype_name = "f32", *vocab_path = NULL, *out_path = NULL;
    const char *template_path = NULL, *arch_name = "llama";
    char *template_text = NULL;
    uint32_t seed = DEFAULT_SEED;
    int ctx_len = 0;
    const shape *sh = NULL;
    const dtype_info *dt = NULL;
    const family *fam = NULL;
    char err[512];

    for (int i = 1; i < argc; i += 2) {
        const char *v = argv[i + 1];
        if (i + 1 >= argc)
            return usage();
        if (strcmp(argv[i], "--shape") == 0)
            shape_name = v;
        else if (strcmp(argv[i], "--dtype") == 0)
            dtype_name = v;
        else if (strcmp(argv[i], "--arch") == 0)
            arch_name = v;
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
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strcmp(families[i].name, arch_name) == 0)
            fam = &families[i];
    if (!sh || !dt || !fam || ctx_len < 0)
        return usage();
    if (dt == &dtypes[DT_MXFP4] && !FAM_IS(fam, "gpt-oss")) {
        fprintf(stderr, "synth_gguf: mxfp4 is gpt-oss's expert format only\n");
        return 2;
    }
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
        kvg_qtype t = qtypes[dt->quant];
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

    /* The shape, adapted to the family: llama keeps the preset; the others' tiny has 4
     * heads (2 KV) of the family's head size; gemma3 enough layers for a global one. */
    hparams hp = { .D = sh->dim, .H = sh->hidden, .L = sh->layers, .heads = sh->heads, .kv_heads = sh->kv_heads,
                   .V = (int64_t)toks->arr_n, .ctx = ctx_len };
    hp.hd = sh->dim / sh->heads;
    if (!FAM_IS(fam, "llama") && strcmp(sh->name, "tiny") == 0)
        hp.heads = 4, hp.kv_heads = 2, hp.hd = fam->tiny_head_dim;
    if (hp.L < fam->min_layers)
        hp.L = fam->min_layers;
    hp.Q = hp.heads * hp.hd, hp.KV = hp.kv_heads * hp.hd;
    /* Phi-4-mini's partial rotary (3/4 of each head) */
    hp.n_rot = FAM_IS(fam, "phi3") ? hp.hd * 3 / 4 / 2 * 2 : hp.hd;
    if (fam->flags & F_MOE) {
        hp.n_expert = fam->n_expert, hp.n_used = fam->n_expert_used;
        hp.ff_exp = strcmp(sh->name, "tiny") == 0 ? 256 : hp.H / 2;
    }
    /* windows and original contexts from the preset's context, --ctx or not: a
     * 100-token prompt crosses tiny's 32-token window */
    if (FAM_IS(fam, "gemma2") || FAM_IS(fam, "gemma3") || FAM_IS(fam, "gpt-oss"))
        hp.swa = sh->ctx / 8;
    if (FAM_IS(fam, "phi3") || FAM_IS(fam, "gpt-oss") || FAM_IS(fam, "mistral3"))
        hp.orig_ctx = sh->ctx / 4;
    if (FAM_IS(fam, "gpt-oss") || FAM_IS(fam, "mistral3"))
        hp.rope_scale = 4.0f;
    else if (FAM_IS(fam, "gemma3"))
        hp.rope_scale = 8.0f;

    builder b = { .seed = seed, .mat_dt = dt };
    build(&b, fam, &hp);
    tensor *ts = b.ts;
    const int nt = b.nt;
    uint64_t off = 0;
    size_t max_elems = 0;
    for (int i = 0; i < nt; i++) {
        tensor *t = &ts[i];
        uint64_t rows = tensor_elems(t) / (uint64_t)t->ne[0];
        if (t->ne[0] % t->dt->block) {
            fprintf(stderr, "synth_gguf: shape %s: %s's rows of %lld do not divide into %s blocks of %d\n", sh->name,
                    t->name, (long long)t->ne[0], t->dt->name, t->dt->block);
            return 1;
        }
        t->bytes = rows * row_bytes(t->dt, t->ne[0]);
        off = (off + ALIGN - 1) / ALIGN * ALIGN;
        t->offset = off;
        off += t->bytes;
        if (tensor_elems(t) > max_elems)
            max_elems = tensor_elems(t);
    }

    /* The keys go to memory first: the header counts them. */
    char *kv_buf = NULL;
    size_t kv_len = 0;
    out = open_memstream(&kv_buf, &kv_len);
    if (!out)
        return 1;
    char gname[128];
    /* Not the family's name: llama.cpp's vocabulary loader keys per-token fixes on
     * general.name (one containing "phi3" needs Phi-3's own added tokens). */
    snprintf(gname, sizeof gname, "kvgate-synthetic %s %s seed=%u", sh->name, dt->name, seed);
    arch_prefix = fam->name;
    kv_str("general.architecture", fam->name);
    kv_str("general.name", gname);
    kv_u32("general.alignment", ALIGN);
    kv_u32("general.file_type", dt->file_type);
    write_arch_keys(fam, &hp);
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
    if (fclose(out) != 0 || wfail) {
        fprintf(stderr, "synth_gguf: out of memory\n");
        return 1;
    }

    out = fopen(out_path, "wb");
    if (!out) {
        fprintf(stderr, "synth_gguf: %s: %s\n", out_path, strerror(errno));
        return 1;
    }
    wb("GGUF", 4);
    wle(3, 4);
    wle((uint64_t)nt, 8);
    wle(n_kv, 8);
    wb(kv_buf, kv_len);
    free(kv_buf);
    for (int i = 0; i < nt; i++) {
        wstr(ts[i].name, strlen(ts[i].name));
        wle((uint64_t)ts[i].n_dims, 4);
        for (int d = 0; d < ts[i].n_dims; d++)
            wle((uint64_t)ts[i].ne[d], 8);
        wle(ts[i].dt->ggml, 4);
        wle(ts[i].offset, 8);
    }
    long here = ftell(out);
    uint64_t pos = here < 0 ? 0 : (uint64_t)here;
    pad_to(&pos, ALIGN);

    float *mbuf = malloc(max_elems * sizeof *mbuf);
    void *cbuf = NULL;
    if (!mbuf) {
        fprintf(stderr, "synth_gguf: out of memory\n");
        return 1;
    }
    for (int i = 0; i < nt && !wfail; i++) {
        tensor *t = &ts[i];
        uint64_t n = tensor_elems(t);
        pad_to(&pos, ALIGN);         /* data0 is aligned: absolute and relative agree */
        if (t->kind == V_ONES) {
            for (uint64_t j = 0; j < n; j++)
                mbuf[j] = 1.0f;
        } else if (t->kind == V_VEC) {
            gen(mbuf, n, t->seed, t->scale);
            for (uint64_t j = 0; j < n; j++)
                mbuf[j] += t->base;
        } else {
            float *p = mbuf;
            for (int k = 0; k < t->nparts; k++) {
                gen(p, (uint64_t)t->parts[k].rows * (uint64_t)t->ne[0], t->parts[k].seed, t->parts[k].scale);
                p += (uint64_t)t->parts[k].rows * (uint64_t)t->ne[0];
            }
        }
        if (t->dt->ggml == 0) {
            wb(mbuf, (size_t)n * 4);
        } else {
            cbuf = realloc(cbuf, t->bytes);
            if (!cbuf) {
                fprintf(stderr, "synth_gguf: out of memory\n");
                return 1;
            }
            uint64_t rb = row_bytes(t->dt, t->ne[0]), rows = n / (uint64_t)t->ne[0];
            for (uint64_t r = 0; r < rows; r++)
                if (convert_row(t->dt, mbuf + r * (uint64_t)t->ne[0], (unsigned char *)cbuf + r * rb, t->ne[0]) < 0) {
                    fprintf(stderr, "synth_gguf: cannot convert %s to %s\n", t->name, t->dt->name);
                    return 1;
                }
            wb(cbuf, t->bytes);
        }
        pos += t->bytes;
    }
    free(mbuf);
    free(cbuf);
    if (fclose(out) != 0)
        wfail = 1;
    if (wfail) {
        fprintf(stderr, "synth_gguf: %s: write failed\n", out_path);
        return 1;
    }
    printf("synth_gguf: wrote %s: %s%s%s %s, %d tensors, %lld-piece vocabulary, %.1f MiB of weights\n", out_path,
           FAM_IS(fam, "llama") ? "" : fam->name, FAM_IS(fam, "llama") ? "" : " ", sh->name, dt->name, nt,
           (long long)hp.V, (double)off / 1048576.0);
    free(ts);
    free(template_text);
    kvg_gguf_free(vg);
    return 0;
}
