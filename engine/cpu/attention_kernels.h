/* Internal to the CPU backend: the per-ISA kernels of attention (attention_cpu.c) and of
 * the SwiGLU (backend_cpu.c, which shares the softmax's exp), and the scalar pieces they
 * share. Every kernel computes the same chains in the same order (see attention_cpu.c),
 * so all ISAs give the same bits; t/unit/engine_attention_kernels.c compares them, the
 * AVX-512 ones through an emulation on CPUs without AVX-512. */
#ifndef KVG_ATTENTION_KERNELS_H
#define KVG_ATTENTION_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Scores of 4 (scores4) or 1 (scores1) groups of 16 keys: k[g] points at column 0 of a
 * 16-key group inside a dimension-major K block (row stride bt); out gets 16 per group.
 * Each score is one FMA chain over d = 0..hd-1 starting from +0. */
typedef void (*kvg_attn_scores_fn)(const float *q, const float *const *k, int bt, int hd, float *out);
/* out[d] = fmaf(w[t], v[t][d], out[d]) for t = 0..n-1 ascending (v rows of hd floats). */
typedef void (*kvg_attn_vacc_fn)(float *out, const float *w, const float *v, int n, int hd);
/* In place sc[t] = softmax_exp(sc[t] / scale - max); returns the 16-lane sum. `sink`
 * (gpt-oss's learned logit of the head, already on the scaled scores' scale; -INFINITY:
 * none) joins the max and, as exp(sink - max), the sum after the lanes' reduction: one
 * more term, computed by the shared scalar code below in every ISA's kernel. */
typedef float (*kvg_attn_softmax_fn)(float *sc, int T, float scale, float sink);


/* KVG_ATTN_ROWS query rows against the same keys. The rows of one sequence in a prefill
 * step read the same K and V; done a row at a time every load of them comes from L2
 * (a head's K and V outgrow L1 after a few hundred positions), and the kernels above
 * wait on it. Here one load serves every row. Each row's chains are exactly those of
 * scores4 and vacc, so a row's bits do not depend on whether it went through these. */
#define KVG_ATTN_ROWS 4
/* Scores of 4 rows (q[r]) x 4 groups of 16 keys: out[r] gets row r's 64 scores. */
typedef void (*kvg_attn_scores_rows_fn)(const float *const *q, const float *const *k, int bt, int hd,
                                        float *const *out);
/* For each of 4 rows: out[r][d] = fmaf(w[r][t], v[t][d], out[r][d]), t = 0..n-1 ascending. */
typedef void (*kvg_attn_vacc_rows_fn)(float *const *out, const float *const *w, const float *v, int n,
                                      int hd);

/* The same kernels over an int8 KV layer (kv_cache.h): K and V as int8, each loaded
 * value converted to float (exactly) where the float kernels load a float, so every
 * chain is the float kernel's over those values; the per-token scales are applied by
 * the caller (attention_cpu.c: the score times K's scale, V's scale in the weight). */
typedef void (*kvg_attn_scores_i8_fn)(const float *q, const int8_t *const *k, int bt, int hd, float *out);
typedef void (*kvg_attn_vacc_i8_fn)(float *out, const float *w, const int8_t *v, int n, int hd);
typedef void (*kvg_attn_scores_rows_i8_fn)(const float *const *q, const int8_t *const *k, int bt, int hd,
                                           float *const *out);
typedef void (*kvg_attn_vacc_rows_i8_fn)(float *const *out, const float *const *w, const int8_t *v, int n,
                                         int hd);

/* gate[i] = kvg_silu_mul(gate[i], up[i]) for i < n (below); the swiglu_oai and geglu
 * kernels kvg_swiglu_oai and kvg_gelu_mul alike. */
typedef void (*kvg_swiglu_fn)(float *gate, const float *up, size_t n);

typedef struct kvg_attn_kernels {
    kvg_attn_scores_fn scores4, scores1;
    kvg_attn_vacc_fn vacc;
    kvg_attn_softmax_fn softmax;
    kvg_attn_scores_rows_fn scores4_rows;
    kvg_attn_vacc_rows_fn vacc_rows;
    kvg_swiglu_fn swiglu;
    kvg_swiglu_fn swiglu_oai;
    kvg_swiglu_fn geglu;
    kvg_attn_scores_i8_fn scores4_i8, scores1_i8;
    kvg_attn_vacc_i8_fn vacc_i8;
    kvg_attn_scores_rows_i8_fn scores4_rows_i8;
    kvg_attn_vacc_rows_i8_fn vacc_rows_i8;
} kvg_attn_kernels;

/* The kernels of "generic", "avx2" or "avx512"; NULL when this CPU cannot run them. */
const kvg_attn_kernels *kvg_attn_kernels_isa(const char *isa);

void kvg_attn_scores4_avx512(const float *q, const float *const *k, int bt, int hd, float *out);
void kvg_attn_scores1_avx512(const float *q, const float *const *k, int bt, int hd, float *out);
void kvg_attn_vacc_avx512(float *out, const float *w, const float *v, int n, int hd);
float kvg_attn_softmax_avx512(float *sc, int T, float scale, float sink);
void kvg_attn_scores4_rows_avx512(const float *const *q, const float *const *k, int bt, int hd,
                                  float *const *out);
void kvg_attn_vacc_rows_avx512(float *const *out, const float *const *w, const float *v, int n, int hd);
void kvg_swiglu_avx512(float *gate, const float *up, size_t n);
void kvg_swiglu_oai_avx512(float *gate, const float *up, size_t n);
void kvg_geglu_avx512(float *gate, const float *up, size_t n);
void kvg_attn_scores4_i8_avx512(const float *q, const int8_t *const *k, int bt, int hd, float *out);
void kvg_attn_scores1_i8_avx512(const float *q, const int8_t *const *k, int bt, int hd, float *out);
void kvg_attn_vacc_i8_avx512(float *out, const float *w, const int8_t *v, int n, int hd);
void kvg_attn_scores4_rows_i8_avx512(const float *const *q, const int8_t *const *k, int bt, int hd,
                                     float *const *out);
void kvg_attn_vacc_rows_i8_avx512(float *const *out, const float *const *w, const int8_t *v, int n, int hd);

/* exp(x) for the softmax (x <= 0 there), from exactly rounded operations only --
 * explicit fmaf, one subtraction, one addition and integer exponent arithmetic -- so
 * scalar and vector code give the same bits and the compiler has no a*b+c left to
 * contract differently per ISA. x = n ln2 + r (Cody-Waite), e^r by a degree-7
 * polynomial (the Cephes expf coefficients), 2^n added to the exponent field. Relative
 * error ~1e-7; 0 below -86, where 2^n would leave the normal range (and for NaN). */
static inline __attribute__((always_inline)) float kvg_attn_exp(float x)
{
    float t = fmaf(x, 1.44269504088896341f, 12582912.0f);   /* 1.5 * 2^23 + round(x / ln2) */
    float n = t - 12582912.0f;
    float r = fmaf(n, -0.693359375f, x);
    float p, rr, y;
    uint32_t tb, yb;
    r = fmaf(n, 2.12194440e-4f, r);
    p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    rr = r * r;
    y = fmaf(p, rr, r);
    y = y + 1.0f;
    memcpy(&tb, &t, 4);
    memcpy(&yb, &y, 4);
    yb += (tb - 0x4B400000u) << 23;
    memcpy(&y, &yb, 4);
    return x >= -86.0f ? y : 0.0f;
}

/* silu(g) * u = g * sigmoid(g) * u, with sigmoid from exp(-|g|) only (never an
 * argument above 0, so nothing overflows): e = exp(-|g|) in (0, 1], then
 * sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) for g < 0, both exactly rounded
 * divisions; then (g * sigmoid) * u. Relative error a few 1e-7 (the exp's and two
 * roundings); for g below -86 the exp is 0 and so is the result (true: |g| e^g < 1e-35);
 * NaN stays NaN. Written without a*b+c, like the exp, so every ISA gives these bits. */
static inline __attribute__((always_inline)) float kvg_silu_mul(float g, float u)
{
    float e = kvg_attn_exp(-fabsf(g));
    float s = (g >= 0.0f ? 1.0f : e) / (1.0f + e);
    return (g * s) * u;
}

/* gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai, alpha 1.702, limit 7): the gate
 * clamped from above, the up from both sides, then
 *   x = min(g, 7), y = clamp(u, -7, 7), out = x sigmoid(1.702 x) (y + 1),
 * the sigmoid from exp(-|1.702 x|) as kvg_silu_mul's. A NaN gate stays NaN (the
 * comparisons keep it); a NaN up becomes -7 + 1, as std::clamp's comparisons give. */
#define KVG_SWIGLU_OAI_ALPHA 1.702f
#define KVG_SWIGLU_OAI_LIMIT 7.0f
static inline __attribute__((always_inline)) float kvg_swiglu_oai(float g, float u)
{
    float x = g > KVG_SWIGLU_OAI_LIMIT ? KVG_SWIGLU_OAI_LIMIT : g;
    float y = u < -KVG_SWIGLU_OAI_LIMIT ? -KVG_SWIGLU_OAI_LIMIT : u > KVG_SWIGLU_OAI_LIMIT ? KVG_SWIGLU_OAI_LIMIT : u;
    float a = KVG_SWIGLU_OAI_ALPHA * x;
    float e = kvg_attn_exp(-fabsf(a));
    float s = (a >= 0.0f ? 1.0f : e) / (1.0f + e);
    return (x * s) * (y + 1.0f);
}

/* GeGLU: gelu(g) * u with GELU's tanh form (llama.cpp's and Hugging Face's
 * gelu_pytorch_tanh), 0.5 g (1 + tanh z), z = sqrt(2/pi) (g + 0.044715 g^3), computed as
 * g sigmoid(2 z) (the same function: 0.5 (1 + tanh z) = 1 / (1 + e^-2z)) with the
 * sigmoid of kvg_silu_mul, so that it vectorizes with the same bits on every ISA (libm's
 * tanhf one element at a time took ~10% of a Gemma decode step). g + 0.044715 g^3 is
 * one explicit fmaf, so no ISA contracts it differently. Relative error a few 1e-7. */
#define KVG_GELU_2C 1.5957691216057308f     /* 2 sqrt(2 / pi) */
#define KVG_GELU_A 0.044715f
static inline __attribute__((always_inline)) float kvg_gelu_mul(float g, float u)
{
    float z2 = KVG_GELU_2C * fmaf(KVG_GELU_A * g * g, g, g);
    float e = kvg_attn_exp(-fabsf(z2));
    float s = (z2 >= 0.0f ? 1.0f : e) / (1.0f + e);
    return (g * s) * u;
}

/* The fixed pairwise reduction of 16 lanes (the GEMM's). */
static inline __attribute__((always_inline)) float kvg_attn_reduce16(const float *a)
{
    float h[8], q[4], d0, d1;
    for (int i = 0; i < 8; i++)
        h[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++)
        q[i] = h[i] + h[i + 4];
    d0 = q[0] + q[2];
    d1 = q[1] + q[3];
    return d0 + d1;
}

/* The V accumulation's scalar tail, shared by every ISA's kernel: dimensions [d0, hd),
 * each one chain out[d] = fmaf(w[t], v[t][d], out[d]) over t = 0..n-1 ascending. */
static inline __attribute__((always_inline)) void
kvg_attn_vacc_tail(float *out, const float *w, const float *v, int n, int hd, int d0)
{
    for (int d = d0; d < hd; d++)
        for (int t = 0; t < n; t++)
            out[d] = fmaf(w[t], v[(size_t)t * hd + d], out[d]);
}

/* kvg_attn_vacc_tail over int8 V. */
static inline __attribute__((always_inline)) void
kvg_attn_vacc_tail_i8(float *out, const float *w, const int8_t *v, int n, int hd, int d0)
{
    for (int d = d0; d < hd; d++)
        for (int t = 0; t < n; t++)
            out[d] = fmaf(w[t], (float)v[(size_t)t * hd + d], out[d]);
}

/* The softmax's scalar pieces, shared by every ISA's kernel (the generic one and
 * attention_simd_x86.h). The positions [full, T) past the last whole group of 16 are
 * scaled in place (sc[t] / scale) and folded into their lanes' maxima mxl[16]; returns
 * the maximum over the lanes and the sink. */
static inline __attribute__((always_inline)) float
kvg_attn_softmax_max_tail(float *sc, int full, int T, float scale, float *mxl, float sink)
{
    float mx = -INFINITY;
    for (int t = full; t < T; t++) {
        float v = sc[t] / scale;
        sc[t] = v;
        mxl[t & 15] = v > mxl[t & 15] ? v : mxl[t & 15];
    }
    for (int l = 0; l < 16; l++)
        mx = mxl[l] > mx ? mxl[l] : mx;
    return sink > mx ? sink : mx;
}

/* The positions [full, T) exponentiated in place (exp(sc[t] - mx)) and added to their
 * lanes' sums lanes[16]; returns the sum of all, the lanes reduced in the fixed order,
 * plus the sink's exp(sink - mx) (exactly 0 for a sink of -INFINITY: the sum's bits are
 * then those of a softmax without one). */
static inline __attribute__((always_inline)) float
kvg_attn_softmax_sum_tail(float *sc, int full, int T, float mx, float *lanes, float sink)
{
    for (int t = full; t < T; t++) {
        float e = kvg_attn_exp(sc[t] - mx);
        sc[t] = e;
        lanes[t & 15] += e;
    }
    return kvg_attn_reduce16(lanes) + kvg_attn_exp(sink - mx);
}

#endif
