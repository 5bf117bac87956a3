/* The AVX-512 attention kernels (interface in attention_kernels.h): one 16-key group
 * or 16 lanes per register; the softmax and the SwiGLU from attention_simd_x86.h, as
 * the AVX2 ones. The unit test also runs this file on CPUs without
 * AVX-512, through an emulation of the intrinsics, by overriding KVG_AVX512_TARGET. */
#include "cpu/attention_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#ifndef KVG_AVX512_TARGET
#define KVG_AVX512_TARGET "avx512f,fma"
#endif
#define AVX512 __attribute__((target(KVG_AVX512_TARGET)))

AVX512 void kvg_attn_scores4_avx512(const float *q, const float *const *k, int bt, int hd, float *out)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3];
    for (int d = 0; d < hd; d++) {
        __m512 qd = _mm512_set1_ps(q[d]);
        size_t o = (size_t)d * bt;
        a0 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k0 + o), a0);
        a1 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k1 + o), a1);
        a2 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k2 + o), a2);
        a3 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k3 + o), a3);
    }
    _mm512_storeu_ps(out, a0);
    _mm512_storeu_ps(out + 16, a1);
    _mm512_storeu_ps(out + 32, a2);
    _mm512_storeu_ps(out + 48, a3);
}

AVX512 void kvg_attn_scores1_avx512(const float *q, const float *const *k, int bt, int hd, float *out)
{
    __m512 a0 = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++)
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_loadu_ps(k[0] + (size_t)d * bt), a0);
    _mm512_storeu_ps(out, a0);
}

AVX512 void kvg_attn_vacc_avx512(float *out, const float *w, const float *v, int n, int hd)
{
    int d0 = 0;
    for (; d0 + 128 <= hd; d0 += 128) {
        __m512 a[8];
        for (int i = 0; i < 8; i++)
            a[i] = _mm512_loadu_ps(out + d0 + 16 * i);
        for (int t = 0; t < n; t++) {
            __m512 wt = _mm512_set1_ps(w[t]);
            const float *vt = v + (size_t)t * hd + d0;
            for (int i = 0; i < 8; i++)
                a[i] = _mm512_fmadd_ps(wt, _mm512_loadu_ps(vt + 16 * i), a[i]);
        }
        for (int i = 0; i < 8; i++)
            _mm512_storeu_ps(out + d0 + 16 * i, a[i]);
    }
    for (; d0 + 64 <= hd; d0 += 64) {
        __m512 a[4];
        for (int i = 0; i < 4; i++)
            a[i] = _mm512_loadu_ps(out + d0 + 16 * i);
        for (int t = 0; t < n; t++) {
            __m512 wt = _mm512_set1_ps(w[t]);
            const float *vt = v + (size_t)t * hd + d0;
            for (int i = 0; i < 4; i++)
                a[i] = _mm512_fmadd_ps(wt, _mm512_loadu_ps(vt + 16 * i), a[i]);
        }
        for (int i = 0; i < 4; i++)
            _mm512_storeu_ps(out + d0 + 16 * i, a[i]);
    }
    for (; d0 + 16 <= hd; d0 += 16) {
        __m512 a = _mm512_loadu_ps(out + d0);
        for (int t = 0; t < n; t++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(w[t]), _mm512_loadu_ps(v + (size_t)t * hd + d0), a);
        _mm512_storeu_ps(out + d0, a);
    }
    for (; d0 < hd; d0++)
        for (int t = 0; t < n; t++)
            out[d0] = fmaf(w[t], v[(size_t)t * hd + d0], out[d0]);
}

/* 4 rows x 4 groups: 16 accumulators; per dimension 4 loads of K serve 16 FMAs. */
AVX512 void kvg_attn_scores4_rows_avx512(const float *const *q, const float *const *k, int bt, int hd,
                                         float *const *out)
{
    __m512 a[4][4];
    const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++)
        a[0][g] = a[1][g] = a[2][g] = a[3][g] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        size_t o = (size_t)d * bt;
        __m512 k0 = _mm512_loadu_ps(k[0] + o), k1 = _mm512_loadu_ps(k[1] + o);
        __m512 k2 = _mm512_loadu_ps(k[2] + o), k3 = _mm512_loadu_ps(k[3] + o);
        __m512 qd;
        qd = _mm512_set1_ps(q0[d]);
        a[0][0] = _mm512_fmadd_ps(qd, k0, a[0][0]);
        a[0][1] = _mm512_fmadd_ps(qd, k1, a[0][1]);
        a[0][2] = _mm512_fmadd_ps(qd, k2, a[0][2]);
        a[0][3] = _mm512_fmadd_ps(qd, k3, a[0][3]);
        qd = _mm512_set1_ps(q1[d]);
        a[1][0] = _mm512_fmadd_ps(qd, k0, a[1][0]);
        a[1][1] = _mm512_fmadd_ps(qd, k1, a[1][1]);
        a[1][2] = _mm512_fmadd_ps(qd, k2, a[1][2]);
        a[1][3] = _mm512_fmadd_ps(qd, k3, a[1][3]);
        qd = _mm512_set1_ps(q2[d]);
        a[2][0] = _mm512_fmadd_ps(qd, k0, a[2][0]);
        a[2][1] = _mm512_fmadd_ps(qd, k1, a[2][1]);
        a[2][2] = _mm512_fmadd_ps(qd, k2, a[2][2]);
        a[2][3] = _mm512_fmadd_ps(qd, k3, a[2][3]);
        qd = _mm512_set1_ps(q3[d]);
        a[3][0] = _mm512_fmadd_ps(qd, k0, a[3][0]);
        a[3][1] = _mm512_fmadd_ps(qd, k1, a[3][1]);
        a[3][2] = _mm512_fmadd_ps(qd, k2, a[3][2]);
        a[3][3] = _mm512_fmadd_ps(qd, k3, a[3][3]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++)
            _mm512_storeu_ps(out[r] + 16 * g, a[r][g]);
}

/* 4 rows x 64 dimensions in 16 accumulators; per token 4 loads of V serve 16 FMAs. */
AVX512 void kvg_attn_vacc_rows_avx512(float *const *out, const float *const *w, const float *v, int n, int hd)
{
    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) {
        __m512 a[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                a[r][i] = _mm512_loadu_ps(out[r] + d0 + 16 * i);
        for (int t = 0; t < n; t++) {
            const float *vt = v + (size_t)t * hd + d0;
            __m512 v0 = _mm512_loadu_ps(vt), v1 = _mm512_loadu_ps(vt + 16);
            __m512 v2 = _mm512_loadu_ps(vt + 32), v3 = _mm512_loadu_ps(vt + 48);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                __m512 wt = _mm512_set1_ps(w[r][t]);
                a[r][0] = _mm512_fmadd_ps(wt, v0, a[r][0]);
                a[r][1] = _mm512_fmadd_ps(wt, v1, a[r][1]);
                a[r][2] = _mm512_fmadd_ps(wt, v2, a[r][2]);
                a[r][3] = _mm512_fmadd_ps(wt, v3, a[r][3]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                _mm512_storeu_ps(out[r] + d0 + 16 * i, a[r][i]);
    }
    for (; d0 + 16 <= hd; d0 += 16) {
        __m512 a[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            a[r] = _mm512_loadu_ps(out[r] + d0);
        for (int t = 0; t < n; t++) {
            __m512 vt = _mm512_loadu_ps(v + (size_t)t * hd + d0);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                a[r] = _mm512_fmadd_ps(_mm512_set1_ps(w[r][t]), vt, a[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            _mm512_storeu_ps(out[r] + d0, a[r]);
    }
    for (int r = 0; r < 4; r++)
        for (int d = d0; d < hd; d++)
            for (int t = 0; t < n; t++)
                out[r][d] = fmaf(w[r][t], v[(size_t)t * hd + d], out[r][d]);
}

/* The softmax and the SwiGLU, 16 lanes a register (attention_simd_x86.h). */
#define AV_TGT AVX512
#define AV_LINK
#define AV_SOFTMAX kvg_attn_softmax_avx512
#define AV_SWIGLU kvg_swiglu_avx512
#define AV_V __m512
#define AV_VL 16
#define AV_SET1(f) _mm512_set1_ps(f)
#define AV_ZERO() _mm512_setzero_ps()
#define AV_LOADU(p) _mm512_loadu_ps(p)
#define AV_STOREU(p, v) _mm512_storeu_ps((p), (v))
#define AV_ADD(a, b) _mm512_add_ps((a), (b))
#define AV_SUB(a, b) _mm512_sub_ps((a), (b))
#define AV_MUL(a, b) _mm512_mul_ps((a), (b))
#define AV_DIV(a, b) _mm512_div_ps((a), (b))
#define AV_MAX(a, b) _mm512_max_ps((a), (b))
#define AV_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define AV_POW2_ADD(y, t)                                                                 \
    _mm512_castsi512_ps(_mm512_add_epi32(                                                 \
        _mm512_castps_si512(y),                                                           \
        _mm512_slli_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000)), 23)))
#define AV_KEEP_GE(x, c, y) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask((x), (c), _CMP_GE_OQ), (y))
#define AV_SELECT_GE(x, c, a, b) _mm512_mask_mov_ps((b), _mm512_cmp_ps_mask((x), (c), _CMP_GE_OQ), (a))
/* (an integer OR: the float one needs AVX512DQ) */
#define AV_NEG_ABS(x) \
    _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)))
#include "cpu/attention_simd_x86.h"
#endif
