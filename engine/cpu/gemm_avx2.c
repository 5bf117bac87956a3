/* AVX2 + FMA + F16C kernel, two paths with the same arithmetic (the canonical order of
 * gemm_kernels.h):
 *   small M (decode): the 16 lanes of one output are two 8-float registers (lanes 0-7
 *     and 8-15); a register block of MR X rows by NR W rows keeps 2*MR*NR accumulators
 *     and streams W once (gemm_small_m_x86.h, shared with the AVX-512 kernel). The
 *     tree's first step (lane i + lane i+8) is exactly the sum of the two halves.
 *   M >= PACKED_MIN_M (prefill): lane by lane over packed operands, 6 X rows x 16 W
 *     rows per micro-kernel (gemm_packed_x86.h, shared with the AVX-512 kernel). */

#include "cpu/gemm_kernels.h"

/* Off x86 this file defines nothing: gemm.c has only the generic level there. */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "cpu/gemm_pack_x86.h"

#define TGT __attribute__((target("avx2,fma,f16c")))
#define TGT_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

/* Largest register block: 2 * MR_MAX * NR_MAX accumulators must fit with the
 * operands in 16 registers. */
#define MR_MAX 3
#define NR_MAX 4

/* Small M streams W once, in blocks of rows that stay in L2 while every group of
 * X rows passes over them. */
#define W_BLOCK_BYTES (96 * 1024)

/* s = d[0] + d[1] of the canonical tree, from h = lanes i + i+8. */
TGT_INLINE float reduce8(__m256 h)
{
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

/* One MR x NR block over all of K. x: MR rows (stride K); w: NR rows starting at
 * element offset w0, cs rows apart; y: MR rows (stride ldy), NR columns cs apart. */
TGT_INLINE void block(const float *x, const void *w, size_t w0, size_t cs, kvg_dtype dt, int K,
                      const float *bias, float *y, size_t ldy, const int MR, const int NR)
{
    __m256 acc[MR_MAX][NR_MAX][2];
    int k = 0;

    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();

    for (; k + 16 <= K; k += 16) {
        for (int h = 0; h < 2; h++) {
            __m256 xv[MR_MAX];
            for (int r = 0; r < MR; r++)
                xv[r] = _mm256_loadu_ps(x + (size_t)r * (size_t)K + (size_t)(k + 8 * h));
            for (int c = 0; c < NR; c++) {
                __m256 wv = kvg_x86_load_w8(w, w0 + (size_t)c * cs * (size_t)K + (size_t)(k + 8 * h), dt);
                for (int r = 0; r < MR; r++)
                    acc[r][c][h] = _mm256_fmadd_ps(xv[r], wv, acc[r][c][h]);
            }
        }
    }
    if (k < K) {
        /* The tail as one more 16-wide step over zero-padded copies. */
        float xt[MR_MAX][16], wt[NR_MAX][16];
        int t = K - k;
        for (int r = 0; r < MR; r++) {
            for (int l = 0; l < 16; l++)
                xt[r][l] = l < t ? x[(size_t)r * (size_t)K + (size_t)(k + l)] : 0.0f;
        }
        for (int c = 0; c < NR; c++) {
            size_t off = w0 + (size_t)c * cs * (size_t)K + (size_t)k;
            for (int l = 0; l < 16; l++)
                wt[c][l] = l < t ? kvg_gemm_w_at(w, off + (size_t)l, dt) : 0.0f;
        }
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < NR; c++) {
                __m256 wv = _mm256_loadu_ps(&wt[c][8 * h]);
                for (int r = 0; r < MR; r++)
                    acc[r][c][h] = _mm256_fmadd_ps(_mm256_loadu_ps(&xt[r][8 * h]), wv, acc[r][c][h]);
            }
    }

    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) {
            float s = reduce8(_mm256_add_ps(acc[r][c][0], acc[r][c][1]));
            y[(size_t)r * ldy + (size_t)c * cs] = bias ? s + bias[(size_t)c * cs] : s;
        }
}

/* The block shapes instantiated (gemm_small_m_x86.h): all of 1..MR_MAX x 1..NR_MAX. */
#define SMALL_M_BLOCKS(F)                   \
    F(1, 1) F(1, 2) F(1, 3) F(1, 4)         \
    F(2, 1) F(2, 2) F(2, 3) F(2, 4)         \
    F(3, 1) F(3, 2) F(3, 3) F(3, 4)

/* W rows per block for a given row count: 3 X rows pair with 2 W rows (12
 * accumulators), 2 with 3, 1 with 4 (decode: 8 independent chains). */
static const int nr_for_mr[MR_MAX + 1] = { 0, 4, 3, 2 };

#include "cpu/gemm_small_m_x86.h"

/* ---- packed path (M >= PACKED_MIN_M): gemm_packed_x86.h, 6 X rows x 16 W rows ---- */

#define PK_ISA avx2
#define PK_V __m256
#define PK_VL 8
#define PK_ZERO() _mm256_setzero_ps()
#define PK_LOAD(p) _mm256_load_ps(p)
#define PK_STORE(p, v) _mm256_store_ps((p), (v))
#define PK_LOADU(p) _mm256_loadu_ps(p)
#define PK_STOREU(p, v) _mm256_storeu_ps((p), (v))
#define PK_ADD(a, b) _mm256_add_ps((a), (b))
#define PK_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define PK_BCAST(p) _mm256_broadcast_ss(p)
#define PMR 6
#define PK_ROWS(F) F(0) F(1) F(2) F(3) F(4) F(5)
#define WP_BYTES (128 * 1024)    /* packed W block: stays in L2 */
#define XB_BYTES (64 * 1024)     /* X panels per m-block (and their slots) near L1 */
/* With 16 registers the small-M kernel reuses W less than AVX-512's: measured on the
 * 110M shapes it was still 1.1-1.5x faster at 8 rows, but 1.2-1.5x slower at 32. */
#define PACKED_MIN_M 16
#include "cpu/gemm_packed_x86.h"

#endif
