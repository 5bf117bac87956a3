/* Tiny in-memory models for the engine tests: a kvg_model filled by hand with random
 * weights from a fixed seed, in mixed dtypes, exercising what the shipped presets do
 * not: q/k/v biases, the rotate-half RoPE layout, Llama 3 rope scaling, head_dim !=
 * dim/n_heads, GQA, untied output; tm_apply_family adds the other families' features
 * (q/k norms, post-norms, GeGLU, embedding scale, soft-capping, sliding windows, a second
 * RoPE kind, linear scaling, per-pair factors, mscale, fused qkv / gate-up, the query
 * temperature, attention sinks, an output bias). Header-only;
 * free with tm_free (never kvg_model_free: the model has no loader storage). */
#ifndef KVG_ENGINE_TESTMODEL_H
#define KVG_ENGINE_TESTMODEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

typedef struct tm_spec {
    int dim, hidden, layers, heads, kv_heads, head_dim, vocab, ctx;
    int bias, tied, half_rope, llama3;
    int mixed_dtypes;            /* 0: all F32 */
    uint32_t seed;
} tm_spec;

typedef struct tm_model {
    kvg_model m;
    void **bufs;
    int n_bufs, cap_bufs;
} tm_model;

static uint32_t tm_rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 32);
}

/* Uniform in [-1, 1). */
static float tm_unif(uint64_t *s)
{
    return (float)((double)tm_rng(s) / 2147483648.0 - 1.0);
}

static void *tm_alloc(tm_model *t, size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p)
        return NULL;
    if (t->n_bufs == t->cap_bufs) {
        int cap = t->cap_bufs ? t->cap_bufs * 2 : 64;
        void **b = realloc(t->bufs, (size_t)cap * sizeof *b);
        if (!b) {
            free(p);
            return NULL;
        }
        t->bufs = b;
        t->cap_bufs = cap;
    }
    t->bufs[t->n_bufs++] = p;
    return p;
}

/* A random value of magnitude about `scale` that is exact in F16 and BF16 alike
 * (8 significant bits), so every dtype holds the same number. */
static float tm_weight(uint64_t *s, float scale)
{
    float v = tm_unif(s) * scale;
    /* keep 8 significant bits */
    int e;
    float m = frexpf(v, &e);
    m = roundf(m * 256.0f) / 256.0f;
    return ldexpf(m, e);
}

static uint16_t tm_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);      /* exact: f has 8 significant bits */
}

static uint16_t tm_to_f16(float f)
{
    /* f is 0 or a normal F16 with <= 8 significant bits (|f| in [2^-14, 65504)). */
    uint32_t u, sign, exp, man;
    memcpy(&u, &f, 4);
    sign = (u >> 16) & 0x8000u;
    if ((u & 0x7fffffffu) == 0)
        return (uint16_t)sign;
    exp = ((u >> 23) & 0xffu) - 127u + 15u;
    man = (u >> 13) & 0x3ffu;
    return (uint16_t)(sign | (exp << 10) | man);
}

/* Uniform weights with standard deviation gain / sqrt(cols): gains above 1 make the
 * attention peaky and every layer matter, so a wrong RoPE or mask changes the logits
 * by far more than rounding. */
static int tm_tensor(tm_model *t, kvg_tensor *out, int64_t rows, int64_t cols, kvg_dtype dt,
                     float gain, uint64_t *s)
{
    size_t n = (size_t)rows * (size_t)cols;
    float scale = gain * sqrtf(3.0f / (float)cols);
    void *p = tm_alloc(t, n * kvg_dtype_size(dt));
    if (!p)
        return -1;
    for (size_t i = 0; i < n; i++) {
        float w = tm_weight(s, scale);
        if (fabsf(w) < 1.0f / 16384.0f)
            w = 0.0f;        /* stay in the normal F16 range */
        if (dt == KVG_DT_F32)
            ((float *)p)[i] = w;
        else if (dt == KVG_DT_BF16)
            ((uint16_t *)p)[i] = tm_to_bf16(w);
        else
            ((uint16_t *)p)[i] = tm_to_f16(w);
    }
    out->data = p;
    out->dtype = dt;
    out->rows = rows;
    out->cols = cols;
    return 0;
}

static const float *tm_vec(tm_model *t, int n, float base, float spread, uint64_t *s)
{
    float *v = tm_alloc(t, (size_t)n * sizeof(float));
    if (!v)
        return NULL;
    for (int i = 0; i < n; i++)
        v[i] = base + spread * tm_unif(s);
    return v;
}

static void tm_free(tm_model *t)
{
    for (int i = 0; i < t->n_bufs; i++)
        free(t->bufs[i]);
    free(t->bufs);
    free(t->m.layers);
    memset(t, 0, sizeof *t);
}

static int tm_build(tm_model *t, const tm_spec *sp)
{
    kvg_model *m = &t->m;
    kvg_model_config *c = &m->cfg;
    uint64_t s = 0x9e3779b97f4a7c15ull ^ sp->seed;
    int qd = sp->heads * sp->head_dim, kvd = sp->kv_heads * sp->head_dim;
    kvg_dtype d16 = sp->mixed_dtypes ? KVG_DT_F16 : KVG_DT_F32;
    kvg_dtype db16 = sp->mixed_dtypes ? KVG_DT_BF16 : KVG_DT_F32;

    memset(t, 0, sizeof *t);
    snprintf(c->arch, sizeof c->arch, "%s", sp->bias ? "qwen2" : "llama");
    c->dim = sp->dim;
    c->hidden_dim = sp->hidden;
    c->n_layers = sp->layers;
    c->n_heads = sp->heads;
    c->n_kv_heads = sp->kv_heads;
    c->head_dim = sp->head_dim;
    c->vocab_size = sp->vocab;
    c->max_seq_len = sp->ctx;
    c->norm_eps = 1e-5f;
    c->rope_theta = sp->llama3 ? 500000.0f : 10000.0f;
    c->rope_layout = sp->half_rope ? KVG_ROPE_HALF : KVG_ROPE_ADJACENT;
    if (sp->llama3) {
        c->rope_scale_factor = 8.0f;
        c->rope_low_freq_factor = 1.0f;
        c->rope_high_freq_factor = 4.0f;
        c->rope_orig_max_pos = 64;
    }
    c->tied_embeddings = sp->tied;
    c->has_qkv_bias = sp->bias;
    m->bos = 1;
    m->eos = 2;
    snprintf(m->name, sizeof m->name, "test:%ux%d", sp->seed, sp->dim);
    snprintf(m->format, sizeof m->format, "test");

    m->layers = calloc((size_t)sp->layers, sizeof *m->layers);
    if (!m->layers)
        return -1;
    /* Embedding entries of magnitude ~1, like trained models. */
    if (tm_tensor(t, &m->tok_embedding, sp->vocab, sp->dim, db16, sqrtf((float)sp->dim), &s) != 0)
        return -1;
    if (sp->tied)
        m->output = m->tok_embedding;
    else if (tm_tensor(t, &m->output, sp->vocab, sp->dim, KVG_DT_F32, 1.0f, &s) != 0)
        return -1;
    for (int l = 0; l < sp->layers; l++) {
        kvg_layer_weights *w = &m->layers[l];
        if (!(w->attn_norm = tm_vec(t, sp->dim, 1.0f, 0.2f, &s)) ||
            !(w->ffn_norm = tm_vec(t, sp->dim, 1.0f, 0.2f, &s)) ||
            tm_tensor(t, &w->wq, qd, sp->dim, d16, 2.0f, &s) != 0 ||
            tm_tensor(t, &w->wk, kvd, sp->dim, db16, 2.0f, &s) != 0 ||
            tm_tensor(t, &w->wv, kvd, sp->dim, KVG_DT_F32, 1.5f, &s) != 0 ||
            tm_tensor(t, &w->wo, sp->dim, qd, d16, 1.5f, &s) != 0 ||
            tm_tensor(t, &w->w_gate, sp->hidden, sp->dim, db16, 1.0f, &s) != 0 ||
            tm_tensor(t, &w->w_down, sp->dim, sp->hidden, KVG_DT_F32, 1.0f, &s) != 0 ||
            tm_tensor(t, &w->w_up, sp->hidden, sp->dim, d16, 1.0f, &s) != 0)
            return -1;
        if (sp->bias) {
            if (!(w->bq = tm_vec(t, qd, 0.0f, 0.5f, &s)) || !(w->bk = tm_vec(t, kvd, 0.0f, 0.5f, &s)) ||
                !(w->bv = tm_vec(t, kvd, 0.0f, 0.5f, &s)))
                return -1;
        }
    }
    m->final_norm = tm_vec(t, sp->dim, 1.0f, 0.2f, &s);
    return m->final_norm ? 0 : -1;
}

/* What sets the other families apart (model.h kvg_model_config), on top of a built model:
 * each field 0 leaves the Llama/Qwen2 forward pass. */
typedef struct tm_family {
    int qk_norm;                 /* per-head q/k RMSNorm weights ([head_dim], ~1 +- 0.3) */
    int post_norms;              /* post-attention and post-FFN RMSNorm weights */
    int geglu;                   /* GeGLU instead of SwiGLU */
    int embed_scale;             /* embeddings times sqrt(dim) */
    float attn_softcap, final_softcap, attn_query_scalar;
    int swa_window, swa_period;  /* layer l slides when l % period < period - 1 */
    float rope_theta;            /* the global RoPE base; 0: tm_build's */
    float rope_theta_swa;        /* the sliding layers' own RoPE base (a second kind) */
    float rope_freq_scale;       /* linear RoPE scaling of the global layers */
    int freq_factors;            /* per-pair frequency divisors in [1, 4) */
    float rope_attn_factor;      /* cos/sin times this (LongRoPE's mscale) */
    int fused;                   /* wq/wk/wv and w_gate/w_up as row slices of one tensor each
                                    (F16 when the model mixes dtypes, else F32), as a fused
                                    attn_qkv / gate-up ffn_up loads */
    float attn_temp_scale;       /* Llama 4's query temperature (Ministral 3) ... */
    int attn_temp_floor;         /* ... per this many positions */
    int sinks;                   /* gpt-oss's attention sinks ([n_heads], ~0.5 +- 1) */
    int o_bias;                  /* gpt-oss's attention output bias ([dim], +- 0.5) */
} tm_family;

/* One [rows][cols] tensor holding a, b (and c) one after the other, in dtype dt; the
 * inputs' values are exact in every dtype (tm_weight), so the copy is too. The slices
 * are written back as views into it. */
static inline __attribute__((unused)) int tm_fuse(tm_model *t, kvg_dtype dt, kvg_tensor *const *parts, int n)
{
    int64_t rows = 0, cols = parts[0]->cols, r0 = 0;
    size_t es = kvg_dtype_size(dt);
    float *row = malloc((size_t)cols * sizeof *row);
    unsigned char *buf;
    for (int i = 0; i < n; i++)
        rows += parts[i]->rows;
    buf = tm_alloc(t, (size_t)rows * (size_t)cols * es);
    if (!buf || !row) {
        free(row);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        kvg_tensor v = { buf + (size_t)r0 * (size_t)cols * es, dt, parts[i]->rows, cols };
        for (int64_t r = 0; r < parts[i]->rows; r++) {
            unsigned char *dst = buf + (size_t)(r0 + r) * (size_t)cols * es;
            kvg_tensor_row_f32(parts[i], r, row);
            for (int64_t c = 0; c < cols; c++) {
                if (dt == KVG_DT_F32)
                    ((float *)(void *)dst)[c] = row[c];
                else
                    ((uint16_t *)(void *)dst)[c] = dt == KVG_DT_BF16 ? tm_to_bf16(row[c]) : tm_to_f16(row[c]);
            }
        }
        r0 += parts[i]->rows;
        *parts[i] = v;
    }
    free(row);
    return 0;
}

static inline __attribute__((unused)) int tm_apply_family(tm_model *t, const tm_family *f, uint32_t seed)
{
    kvg_model *m = &t->m;
    kvg_model_config *c = &m->cfg;
    uint64_t s = 0x51ed270b2b6f3a9dull ^ seed;
    c->qk_norm = f->qk_norm;
    c->post_norms = f->post_norms;
    c->ffn_act = f->geglu ? KVG_ACT_GELU_TANH : KVG_ACT_SILU;
    c->embed_scale = f->embed_scale ? sqrtf((float)c->dim) : 0.0f;
    c->attn_softcap = f->attn_softcap;
    c->final_softcap = f->final_softcap;
    c->attn_query_scalar = f->attn_query_scalar;
    c->swa_window = f->swa_window;
    if (f->rope_theta > 0.0f)
        c->rope_theta = f->rope_theta;
    c->rope_theta_swa = f->rope_theta_swa;
    c->rope_freq_scale = f->rope_freq_scale;
    c->rope_attn_factor = f->rope_attn_factor;
    c->attn_temp_scale = f->attn_temp_scale;
    c->attn_temp_floor = f->attn_temp_floor;
    c->attn_sinks = f->sinks;
    c->has_o_bias = f->o_bias;
    if (f->freq_factors) {
        float *ff = tm_alloc(t, (size_t)(c->head_dim / 2) * sizeof *ff);
        if (!ff)
            return -1;
        for (int i = 0; i < c->head_dim / 2; i++)
            ff[i] = 2.5f + 1.5f * tm_unif(&s);
        c->rope_freq_factors = ff;
    }
    for (int l = 0; l < c->n_layers; l++) {
        kvg_layer_weights *w = &m->layers[l];
        w->sliding = f->swa_window > 0 && f->swa_period > 0 && l % f->swa_period < f->swa_period - 1;
        if (f->qk_norm && (!(w->q_norm = tm_vec(t, c->head_dim, 1.0f, 0.3f, &s)) ||
                           !(w->k_norm = tm_vec(t, c->head_dim, 1.0f, 0.3f, &s))))
            return -1;
        if (f->post_norms && (!(w->post_attn_norm = tm_vec(t, c->dim, 1.0f, 0.3f, &s)) ||
                              !(w->post_ffn_norm = tm_vec(t, c->dim, 1.0f, 0.3f, &s))))
            return -1;
        if (f->sinks && !(w->attn_sinks = tm_vec(t, c->n_heads, 0.5f, 1.0f, &s)))
            return -1;
        if (f->o_bias && !(w->bo = tm_vec(t, c->dim, 0.0f, 0.5f, &s)))
            return -1;
        if (f->fused) {
            kvg_dtype dt = w->wq.dtype == KVG_DT_F32 ? KVG_DT_F32 : KVG_DT_F16;
            kvg_tensor *qkv[3] = { &w->wq, &w->wk, &w->wv }, *gu[2] = { &w->w_gate, &w->w_up };
            if (tm_fuse(t, dt, qkv, 3) != 0 || tm_fuse(t, dt, gu, 2) != 0)
                return -1;
        }
    }
    return 0;
}

#endif
