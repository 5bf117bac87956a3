/* Packing for the x86 GEMM kernels (AVX2 and AVX-512 include this; everything is
 * AVX2-level and always inlined, which GCC allows into AVX-512 functions too).
 *
 * The packed path computes the 16 lanes of the canonical order (gemm_kernels.h) one
 * lane at a time: lane l of output (m, n) is the FMA chain over k = l, l+16, ... So
 * both operands are packed lane-major, zero-padded to Kp = K rounded up to 16 (J =
 * Kp / 16 steps per lane), in panels of PM X rows or PN W rows:
 *   Xp: [panel][lane][j][PM]     Wp: [panel][lane][j][PN]
 * Padding rows and padding k are zeros, exactly the zeros the canonical order adds. */
#ifndef KVG_GEMM_PACK_X86_H
#define KVG_GEMM_PACK_X86_H

#include <immintrin.h>

#include "cpu/gemm_kernels.h"

#ifndef KVG_X86_AVX2_INLINE
#define KVG_X86_AVX2_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))
#endif

/* Eight W elements at w[off..off+8) widened to F32. dt is a constant after inlining. */
KVG_X86_AVX2_INLINE __m256 kvg_x86_load_w8(const void *w, size_t off, kvg_dtype dt)
{
    if (dt == KVG_DT_F32)
        return _mm256_loadu_ps((const float *)w + off);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + off));
    if (dt == KVG_DT_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8x8 transpose: v[i] becomes column i of the rows v[0..7]. */
KVG_X86_AVX2_INLINE void kvg_x86_transpose8(__m256 *v)
{
    __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
    v[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    v[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    v[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    v[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    v[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    v[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    v[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    v[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* The first n (4, 6 or 8) floats of v to o. */
KVG_X86_AVX2_INLINE void kvg_x86_store_n(float *o, __m256 v, int n)
{
    if (n == 8) {
        _mm256_storeu_ps(o, v);
        return;
    }
    _mm_storeu_ps(o, _mm256_castps256_ps128(v));
    if (n == 6)
        _mm_storel_pi((__m64 *)(o + 4), _mm256_extractf128_ps(v, 1));
}

/* Panels [p0, p1) of PM X rows each (PM even, <= 16) from X's `rows` rows; panel mp
 * goes to its place in xp whatever p0 is, so ranges can be packed in parallel. */
KVG_X86_AVX2_INLINE void kvg_x86_pack_x(const float *x, int K, int rows, int p0, int p1, int J,
                                        float *xp, const int PM)
{
    size_t lane_stride = (size_t)J * (size_t)PM;

    for (int mp = p0; mp < p1; mp++) {
        float *dst = xp + (size_t)mp * 16 * lane_stride;
        int m0 = mp * PM, k0 = 0;

        if (m0 + PM <= rows) {
            /* Groups of up to 8 rows (zero rows fill a group) transposed 8 k at a time. */
            for (; k0 + 8 <= K; k0 += 8)
                for (int g = 0; g < PM; g += 8) {
                    int n = PM - g < 8 ? PM - g : 8;
                    __m256 v[8];
                    for (int r = 0; r < 8; r++)
                        v[r] = r < n ? _mm256_loadu_ps(x + (size_t)(m0 + g + r) * (size_t)K + (size_t)k0)
                                     : _mm256_setzero_ps();
                    kvg_x86_transpose8(v);
                    for (int i = 0; i < 8; i++) {
                        int k = k0 + i;
                        kvg_x86_store_n(dst + (size_t)(k & 15) * lane_stride + (size_t)(k >> 4) * (size_t)PM + g,
                                        v[i], n);
                    }
                }
        }
        for (int k = k0; k < 16 * J; k++) {
            float *o = dst + (size_t)(k & 15) * lane_stride + (size_t)(k >> 4) * (size_t)PM;
            for (int r = 0; r < PM; r++)
                o[r] = m0 + r < rows && k < K ? x[(size_t)(m0 + r) * (size_t)K + (size_t)k] : 0.0f;
        }
    }
}

/* W rows [n0, n0 + rows) into `panels` panels of PN rows (a multiple of 8), widened. */
KVG_X86_AVX2_INLINE void kvg_x86_pack_w_dt(const void *w, kvg_dtype dt, int K, int n0, int rows,
                                           int panels, int J, float *wp, const int PN)
{
    size_t lane_stride = (size_t)J * (size_t)PN;

    for (int p = 0; p < panels; p++) {
        float *dst = wp + (size_t)p * 16 * lane_stride;
        for (int g = 0; g < PN; g += 8) {
            int r0 = p * PN + g, k0 = 0;
            if (r0 + 8 <= rows) {
                for (; k0 + 8 <= K; k0 += 8) {
                    __m256 v[8];
                    float *o = dst + (size_t)(k0 & 15) * lane_stride + (size_t)(k0 >> 4) * (size_t)PN + g;
                    for (int i = 0; i < 8; i++)
                        v[i] = kvg_x86_load_w8(w, (size_t)(n0 + r0 + i) * (size_t)K + (size_t)k0, dt);
                    kvg_x86_transpose8(v);
                    for (int i = 0; i < 8; i++)
                        _mm256_store_ps(o + (size_t)i * lane_stride, v[i]);
                }
            }
            for (int k = k0; k < 16 * J; k++) {
                float *o = dst + (size_t)(k & 15) * lane_stride + (size_t)(k >> 4) * (size_t)PN + g;
                for (int c = 0; c < 8; c++) {
                    int r = r0 + c;
                    o[c] = r < rows && k < K
                               ? kvg_gemm_w_at(w, (size_t)(n0 + r) * (size_t)K + (size_t)k, dt)
                               : 0.0f;
                }
            }
        }
    }
}

/* The valid part of an edge tile's sums ([PM][PN] at s), plus bias, into y. */
static inline void kvg_x86_edge_out(const float *s, int PN, const float *bias, float *y,
                                    size_t ldy, int rows, int cols)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float v = s[r * PN + c];
            y[(size_t)r * ldy + (size_t)c] = bias ? v + bias[c] : v;
        }
}

#endif
