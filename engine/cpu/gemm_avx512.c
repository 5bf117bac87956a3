/* AVX-512 kernel, two paths with the same arithmetic (the canonical order of
 * gemm_kernels.h):
 *   small M (decode): one 16-float register holds the 16 lanes of one output; a
 *     register block of MR X rows by NR W rows (spread over the panel: see
 *     gemm_small_m_x86.h) streams W once. The K tail is a masked, zeroing load -- the
 *     same zero padding as the other kernels.
 *   M >= PACKED_MIN_M (prefill): lane by lane over packed operands, 12 X rows x 32 W
 *     rows per micro-kernel (gemm_packed_x86.h, shared with the AVX2 kernel).
 * The unit test also runs this file on CPUs without AVX-512, through an emulation of
 * the intrinsics, by overriding KVG_AVX512_TARGET. */
#include "cpu/gemm_kernels.h"

/* Off x86 this file defines nothing: gemm.c has only the generic level there. */
#if defined(__x86_64__) || defined(__i386__)

#include "cpu/gemm_pack_x86.h"

#ifndef KVG_AVX512_TARGET
#define KVG_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
#endif
#define TGT __attribute__((target(KVG_AVX512_TARGET)))
#define TGT_INLINE static inline __attribute__((target(KVG_AVX512_TARGET), always_inline))

#define MR_MAX 4
#define NR_MAX 8
/* Small M: rows of W per block, kept in L2 while every group of X rows passes. */
#define W_BLOCK_BYTES (192 * 1024)

/* Sixteen W elements at w[off..), lanes outside `mask` zero. dt is a constant after
 * inlining; FULL selects the unmasked load. */
TGT_INLINE __m512 load_w16(const void *w, size_t off, kvg_dtype dt, __mmask16 mask, int full)
{
    if (dt == KVG_DT_F32)
        return full ? _mm512_loadu_ps((const float *)w + off)
                    : _mm512_maskz_loadu_ps(mask, (const float *)w + off);
    const uint16_t *p = (const uint16_t *)w + off;
    __m256i h = full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(mask, p);
    if (dt == KVG_DT_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The canonical tree: lanes i + i+8, then i + i+4, i + i+2, 0 + 1. */
TGT_INLINE float reduce16(__m512 v)
{
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 h = _mm256_add_ps(lo, hi);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

TGT_INLINE void block(const float *x, const void *w, size_t w0, size_t cs, kvg_dtype dt, int K,
                      const float *bias, float *y, size_t ldy, const int MR, const int NR)
{
    __m512 acc[MR_MAX][NR_MAX];
    int k = 0;

    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            acc[r][c] = _mm512_setzero_ps();

    for (; k + 16 <= K; k += 16) {
        __m512 xv[MR_MAX];
        for (int r = 0; r < MR; r++)
            xv[r] = _mm512_loadu_ps(x + (size_t)r * (size_t)K + (size_t)k);
        for (int c = 0; c < NR; c++) {
            __m512 wv = load_w16(w, w0 + (size_t)c * cs * (size_t)K + (size_t)k, dt, 0xffff, 1);
            for (int r = 0; r < MR; r++)
                acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    if (k < K) {
        __mmask16 mask = (__mmask16)((1u << (K - k)) - 1u);
        __m512 xv[MR_MAX];
        for (int r = 0; r < MR; r++)
            xv[r] = _mm512_maskz_loadu_ps(mask, x + (size_t)r * (size_t)K + (size_t)k);
        for (int c = 0; c < NR; c++) {
            __m512 wv = load_w16(w, w0 + (size_t)c * cs * (size_t)K + (size_t)k, dt, mask, 0);
            for (int r = 0; r < MR; r++)
                acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }

    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) {
            float s = reduce16(acc[r][c]);
            y[(size_t)r * ldy + (size_t)c * cs] = bias ? s + bias[(size_t)c * cs] : s;
        }
}

/* The block shapes instantiated (gemm_small_m_x86.h): those nr_for_mr uses. */
#define SMALL_M_BLOCKS(F)                                               \
    F(1, 1) F(1, 2) F(1, 3) F(1, 4) F(1, 5) F(1, 6) F(1, 7) F(1, 8)     \
    F(2, 1) F(2, 2) F(2, 3) F(2, 4) F(2, 5) F(2, 6)                     \
    F(3, 1) F(3, 2) F(3, 3) F(3, 4) F(3, 5)                             \
    F(4, 1) F(4, 2) F(4, 3) F(4, 4)

/* W rows per block for a given number of X rows (accumulators: 4, 12, 15, 16). One X
 * row takes 4 streams: memory-bound, 4 FMA chains keep up, and fewer streams ran
 * decode a little faster than 8 on Zen 4. */
static const int nr_for_mr[MR_MAX + 1] = { 0, 4, 6, 5, 4 };

#include "cpu/gemm_small_m_x86.h"

/* ---- packed path (M >= PACKED_MIN_M): gemm_packed_x86.h, 12 X rows x 32 W rows ---- */

#define PK_ISA avx512
#define PK_V __m512
#define PK_VL 16
#define PK_ZERO() _mm512_setzero_ps()
#define PK_LOAD(p) _mm512_load_ps(p)
#define PK_STORE(p, v) _mm512_store_ps((p), (v))
#define PK_LOADU(p) _mm512_loadu_ps(p)
#define PK_STOREU(p, v) _mm512_storeu_ps((p), (v))
#define PK_ADD(a, b) _mm512_add_ps((a), (b))
#define PK_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define PK_BCAST(p) _mm512_set1_ps(*(p))
#define PMR 12
#define PK_ROWS(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
#define WP_BYTES (256 * 1024)
#define XB_BYTES (128 * 1024)
/* Measured on the 110M shapes (engine_bench, AVX-512 on AMD EPYC, 2 threads): the
 * small-M kernel ran a batch of 8 decode rows 1.5-2.5x faster than this path (F32 to
 * Q4_0: packing W, with its dequantization, served only 8 rows), 32 rows as fast in
 * F32 and 1.2x faster in F16 and Q4_0; from about 48 rows on this path wins. */
#define PACKED_MIN_M 40
#include "cpu/gemm_packed_x86.h"

#endif
