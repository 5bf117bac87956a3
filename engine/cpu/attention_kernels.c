/* The generic and AVX2 attention kernels (interface in attention_kernels.h) and the
 * choice of kernels by ISA. The generic ones are plain C with fmaf (compiled for the
 * baseline ISA, where fmaf is a library call: slow but exact); the AVX2 ones are
 * intrinsics (compiled under a target attribute the plain C kept its accumulator
 * arrays on the stack), from attention_simd_x86.h as the AVX-512 ones are. */
#include "cpu/attention_kernels.h"

/* Scores of NG groups of 16 keys: k[g] points at column 0 of a 16-key group inside a
 * dimension-major K block (row stride bt). out gets 16 * NG scores. Each score is one
 * FMA chain over d; NG groups at once give the core 2*NG independent vector chains. */
/* Element i of K or V: a float, or an int8 made float (exact; I8 a constant once the
 * always-inline bodies are inlined). */
static inline __attribute__((always_inline)) float kv_at(const void *p, size_t i, const int I8)
{
    return I8 ? (float)((const int8_t *)p)[i] : ((const float *)p)[i];
}

static inline __attribute__((always_inline)) void
scores_body(const float *restrict q, const float *const *kf, const int8_t *const *k8, int bt, int hd,
            const int NG, const int I8, float *restrict out)
{
    float acc[4][16];
    for (int g = 0; g < NG; g++)
        for (int l = 0; l < 16; l++)
            acc[g][l] = 0.0f;
    for (int d = 0; d < hd; d++) {
        float qd = q[d];
        for (int g = 0; g < NG; g++) {
            if (I8) {
                const int8_t *kd = k8[g] + (size_t)d * bt;
                for (int l = 0; l < 16; l++)
                    acc[g][l] = fmaf(qd, (float)kd[l], acc[g][l]);
            } else {
                const float *kd = kf[g] + (size_t)d * bt;
                for (int l = 0; l < 16; l++)
                    acc[g][l] = fmaf(qd, kd[l], acc[g][l]);
            }
        }
    }
    for (int g = 0; g < NG; g++)
        for (int l = 0; l < 16; l++)
            out[g * 16 + l] = acc[g][l];
}

/* out[d] = fmaf(w[t], v[t][d], out[d]) for t < n ascending: one chain per d. The
 * output is held in registers W dims at a time across all n tokens. */
static inline __attribute__((always_inline)) void
vacc_chunk(float *restrict out, const float *restrict w, const void *restrict v, int n, int hd,
           const int W, const int I8)
{
    float acc[64];
    for (int l = 0; l < W; l++)
        acc[l] = out[l];
    for (int t = 0; t < n; t++) {
        float wt = w[t];
        for (int l = 0; l < W; l++)
            acc[l] = fmaf(wt, kv_at(v, (size_t)t * hd + (size_t)l, I8), acc[l]);
    }
    for (int l = 0; l < W; l++)
        out[l] = acc[l];
}

static inline __attribute__((always_inline)) void
vacc_body(float *restrict out, const float *restrict w, const float *restrict v, int n, int hd)
{
    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64)
        vacc_chunk(out + d0, w, v + d0, n, hd, 64, 0);
    for (; d0 + 16 <= hd; d0 += 16)
        vacc_chunk(out + d0, w, v + d0, n, hd, 16, 0);
    kvg_attn_vacc_tail(out, w, v, n, hd, d0);
}

static inline __attribute__((always_inline)) void
vacc_body_i8(float *restrict out, const float *restrict w, const int8_t *restrict v, int n, int hd)
{
    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64)
        vacc_chunk(out + d0, w, v + d0, n, hd, 64, 1);
    for (; d0 + 16 <= hd; d0 += 16)
        vacc_chunk(out + d0, w, v + d0, n, hd, 16, 1);
    kvg_attn_vacc_tail_i8(out, w, v, n, hd, d0);
}

/* In place: sc[t] = exp(sc[t] / scale - max); returns the sum, accumulated in 16
 * lanes (lane t mod 16, t ascending) and reduced in the fixed order, with the sink's
 * term (attention_kernels.h). */
static inline __attribute__((always_inline)) float softmax_body(float *restrict sc, int T, float scale,
                                                                float sink)
{
    float mxl[16], lanes[16], mx;
    int full = T & ~15;
    for (int l = 0; l < 16; l++) {
        mxl[l] = -INFINITY;
        lanes[l] = 0.0f;
    }
    for (int t0 = 0; t0 < full; t0 += 16)
        for (int l = 0; l < 16; l++) {
            float v = sc[t0 + l] / scale;
            sc[t0 + l] = v;
            mxl[l] = v > mxl[l] ? v : mxl[l];
        }
    mx = kvg_attn_softmax_max_tail(sc, full, T, scale, mxl, sink);
    for (int t0 = 0; t0 < full; t0 += 16)
        for (int l = 0; l < 16; l++) {
            float e = kvg_attn_exp(sc[t0 + l] - mx);
            sc[t0 + l] = e;
            lanes[l] += e;
        }
    return kvg_attn_softmax_sum_tail(sc, full, T, mx, lanes, sink);
}

static void swiglu_generic(float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++)
        gate[i] = kvg_silu_mul(gate[i], up[i]);
}

static void swiglu_oai_generic(float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++)
        gate[i] = kvg_swiglu_oai(gate[i], up[i]);
}

static void geglu_generic(float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++)
        gate[i] = kvg_gelu_mul(gate[i], up[i]);
}

static void scores4_generic(const float *q, const float *const *k, int bt, int hd, float *out)
{
    scores_body(q, k, NULL, bt, hd, 4, 0, out);
}

static void scores1_generic(const float *q, const float *const *k, int bt, int hd, float *out)
{
    scores_body(q, k, NULL, bt, hd, 1, 0, out);
}

static void scores4_i8_generic(const float *q, const int8_t *const *k, int bt, int hd, float *out)
{
    scores_body(q, NULL, k, bt, hd, 4, 1, out);
}

static void scores1_i8_generic(const float *q, const int8_t *const *k, int bt, int hd, float *out)
{
    scores_body(q, NULL, k, bt, hd, 1, 1, out);
}

static void vacc_i8_generic(float *out, const float *w, const int8_t *v, int n, int hd)
{
    vacc_body_i8(out, w, v, n, hd);
}

static void vacc_generic(float *out, const float *w, const float *v, int n, int hd)
{
    vacc_body(out, w, v, n, hd);
}

static float softmax_generic(float *sc, int T, float scale, float sink)
{
    return softmax_body(sc, T, scale, sink);
}

/* The rows' kernels here are the one-row ones row by row: the definition of their bits. */
static void scores4_rows_generic(const float *const *q, const float *const *k, int bt, int hd,
                                 float *const *out)
{
    for (int r = 0; r < KVG_ATTN_ROWS; r++)
        scores_body(q[r], k, NULL, bt, hd, 4, 0, out[r]);
}

static void scores4_rows_i8_generic(const float *const *q, const int8_t *const *k, int bt, int hd,
                                    float *const *out)
{
    for (int r = 0; r < KVG_ATTN_ROWS; r++)
        scores_body(q[r], NULL, k, bt, hd, 4, 1, out[r]);
}

static void vacc_rows_i8_generic(float *const *out, const float *const *w, const int8_t *v, int n, int hd)
{
    for (int r = 0; r < KVG_ATTN_ROWS; r++)
        vacc_body_i8(out[r], w[r], v, n, hd);
}

static void vacc_rows_generic(float *const *out, const float *const *w, const float *v, int n, int hd)
{
    for (int r = 0; r < KVG_ATTN_ROWS; r++)
        vacc_body(out[r], w[r], v, n, hd);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* AVX2 holds a 16-key group in two registers. */
#define AVX2 __attribute__((target("avx2,fma")))

/* The scores, the V accumulation (of one row and of 4), the softmax and the SwiGLU, 8
 * lanes a register (attention_simd_x86.h). 4 rows take one group of keys at a time
 * (2 registers each: 8 accumulators, 2 loads of K per 8 FMAs) and 16 dimensions (8
 * accumulators, 2 loads of V per 8 FMAs): AVX2's 16 registers hold no more. */
#define AV_TGT AVX2
#define AV_LINK static
#define AV_SCORES4 scores4_avx2
#define AV_SCORES1 scores1_avx2
#define AV_VACC vacc_avx2
#define AV_SCORES4_ROWS scores4_rows_avx2
#define AV_VACC_ROWS vacc_rows_avx2
#define AV_ROWS_GROUPS 1
#define AV_ROWS_VREGS 2
#define AV_SOFTMAX softmax_avx2
#define AV_SWIGLU swiglu_avx2
#define AV_SWIGLU_OAI swiglu_oai_avx2
#define AV_GEGLU geglu_avx2
#define AV_SCORES4_I8 scores4_i8_avx2
#define AV_SCORES1_I8 scores1_i8_avx2
#define AV_VACC_I8 vacc_i8_avx2
#define AV_SCORES4_ROWS_I8 scores4_rows_i8_avx2
#define AV_VACC_ROWS_I8 vacc_rows_i8_avx2
#define AV_V __m256
#define AV_VL 8
#define AV_SET1(f) _mm256_set1_ps(f)
#define AV_ZERO() _mm256_setzero_ps()
#define AV_LOADU(p) _mm256_loadu_ps(p)
#define AV_STOREU(p, v) _mm256_storeu_ps((p), (v))
#define AV_ADD(a, b) _mm256_add_ps((a), (b))
#define AV_SUB(a, b) _mm256_sub_ps((a), (b))
#define AV_MUL(a, b) _mm256_mul_ps((a), (b))
#define AV_DIV(a, b) _mm256_div_ps((a), (b))
#define AV_MAX(a, b) _mm256_max_ps((a), (b))
#define AV_MIN(a, b) _mm256_min_ps((a), (b))
#define AV_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define AV_POW2_ADD(y, t)                                                                 \
    _mm256_castsi256_ps(_mm256_add_epi32(                                                 \
        _mm256_castps_si256(y),                                                           \
        _mm256_slli_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000)), 23)))
#define AV_KEEP_GE(x, c, y) _mm256_and_ps(_mm256_cmp_ps((x), (c), _CMP_GE_OQ), (y))
#define AV_SELECT_GE(x, c, a, b) _mm256_blendv_ps((b), (a), _mm256_cmp_ps((x), (c), _CMP_GE_OQ))
#define AV_NEG_ABS(x) _mm256_or_ps((x), _mm256_set1_ps(-0.0f))
#define AV_LOAD_I8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p))))
#include "cpu/attention_simd_x86.h"

#endif

static const kvg_attn_kernels generic_kernels = { scores4_generic,      scores1_generic,
                                                  vacc_generic,         softmax_generic,
                                                  scores4_rows_generic, vacc_rows_generic,
                                                  swiglu_generic,       swiglu_oai_generic,
                                                  geglu_generic,        scores4_i8_generic,
                                                  scores1_i8_generic,   vacc_i8_generic,
                                                  scores4_rows_i8_generic, vacc_rows_i8_generic };
#if defined(__x86_64__) && defined(__GNUC__)
static const kvg_attn_kernels avx2_kernels = { scores4_avx2, scores1_avx2,      vacc_avx2,
                                               softmax_avx2, scores4_rows_avx2, vacc_rows_avx2,
                                               swiglu_avx2,  swiglu_oai_avx2,   geglu_avx2,
                                               scores4_i8_avx2, scores1_i8_avx2, vacc_i8_avx2,
                                               scores4_rows_i8_avx2, vacc_rows_i8_avx2 };
static const kvg_attn_kernels avx512_kernels = { kvg_attn_scores4_avx512,      kvg_attn_scores1_avx512,
                                                 kvg_attn_vacc_avx512,         kvg_attn_softmax_avx512,
                                                 kvg_attn_scores4_rows_avx512, kvg_attn_vacc_rows_avx512,
                                                 kvg_swiglu_avx512,            kvg_swiglu_oai_avx512,
                                                 kvg_geglu_avx512,             kvg_attn_scores4_i8_avx512,
                                                 kvg_attn_scores1_i8_avx512,   kvg_attn_vacc_i8_avx512,
                                                 kvg_attn_scores4_rows_i8_avx512, kvg_attn_vacc_rows_i8_avx512 };
#endif

const kvg_attn_kernels *kvg_attn_kernels_isa(const char *isa)
{
    if (strcmp(isa, "generic") == 0)
        return &generic_kernels;
#if defined(__x86_64__) && defined(__GNUC__)
    if (strcmp(isa, "avx2") == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return &avx2_kernels;
    if (strcmp(isa, "avx512") == 0 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma"))
        return &avx512_kernels;
#endif
    return NULL;
}
