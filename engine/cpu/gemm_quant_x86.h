/* The small-M (decode) kernel over a Q6_K W, written once for the x86 ISAs:
 * gemm_quant_avx2.c and gemm_quant_avx512.c define a 16-lane float vector QV (one
 * register, or two halves for AVX2), a 16-lane int32 vector QI and these operations, then include this file (no include guard: one instantiation per
 * ISA):
 *   QTGT, QTGT_INLINE               target attributes
 *   QV qv_zero(void)  qv_loadx(const float *p)  qv_set1(float)  qv_store(float *, QV)
 *   QV qv_fma(QV a, QV b, QV c)     a * b + c, one rounding
 *   QV qv_mul(QV, QV)
 *   float qv_reduce(QV)             the canonical tree over the 16 lanes
 *   QI qi_u8(const uint8_t *p)  qi_s8(p)   16 bytes widened (zero / sign)
 *   QV qi_cvt(QI)                   exact int -> float
 *   float q_f16(const uint8_t *p)   a little-endian half at p, exactly
 *   MR_MAX, NR_MAX, QBLOCKS(F)      register blocking: F(MR, NR) for each full block
 *   QW_BLOCK_BYTES, QISA            W bytes per L2 block; the name suffix
 * Lane l of each accumulator gets k = k0 + l (16 consecutive weights dequantized into
 * one QV), in increasing k: the canonical order. Each weight vector is produced by the
 * same F32 operations, in the same order, as kvg_dequant_row's, so it has the same
 * bits.
 *
 * The loops over the MR x NR block are fully unrolled (constant trip counts) so that
 * the accumulators and per-row block state live in registers. */

#include "cpu/gemm_quant_x86_deq.h"

#define QUNROLL _Pragma("GCC unroll 16")

/* acc[r][c] += x[r][k0 .. k0+16) * wv, lane by lane. */
#define QFMA_ROWS(c, k0, wv)                                                       \
    do {                                                                           \
        QV wv_ = (wv);                                                             \
        QUNROLL for (int r = 0; r < MR; r++)                                       \
            acc[r][c] = qv_fma(qv_loadx(x + (size_t)r * (size_t)K + (size_t)(k0)), wv_, acc[r][c]); \
    } while (0)

/* One MR x NR block over all of K; w: NR rows of rowb bytes, cs rows apart (y and bias
 * columns too). */
QTGT_INLINE void qblock(const float *x, const uint8_t *w, size_t rowb, size_t cs, int K,
                        const float *bias, float *y, size_t ldy, const int MR, const int NR)
{
    QV acc[MR_MAX][NR_MAX];
    const size_t wstep = cs * rowb;

    QUNROLL for (int r = 0; r < MR; r++)
        QUNROLL for (int c = 0; c < NR; c++)
            acc[r][c] = qv_zero();

    for (int kb = 0; kb < K; kb += 256) {
        const uint8_t *b = w + (size_t)(kb / 256) * 210;
        /* Per row: the 256 six-bit values minus 32 as bytes, and the 16 sub-block
         * scales d * (float)scale, each computed once per super-block. */
        int8_t q[NR_MAX][256] __attribute__((aligned(32)));
        float ds[NR_MAX][16] __attribute__((aligned(64)));
        QUNROLL for (int c = 0; c < NR; c++) {
            const uint8_t *bc = b + (size_t)c * wstep;
            kvg_x86_q6k_bytes(bc, q[c]);
            qv_store(ds[c], qv_mul(qv_set1(q_f16(bc + 208)), qi_cvt(qi_s8(bc + 192))));
        }
        for (int s = 0; s < 16; s++)
            QUNROLL for (int c = 0; c < NR; c++)
                QFMA_ROWS(c, kb + 16 * s, qv_mul(qv_set1(ds[c][s]), qi_cvt(qi_s8((const uint8_t *)q[c] + 16 * s))));
    }

    QUNROLL for (int r = 0; r < MR; r++)
        QUNROLL for (int c = 0; c < NR; c++) {
            float s = qv_reduce(acc[r][c]);
            y[(size_t)r * ldy + (size_t)c * cs] = bias ? s + bias[(size_t)c * cs] : s;
        }
}
#undef QFMA_ROWS
typedef void (*qblock_fn)(const float *x, const uint8_t *w, size_t rowb, size_t cs, int K,
                          const float *bias, float *y, size_t ldy);

#define QBLOCK_FN(MR, NR)                                                                  \
    QTGT static void qblock_##MR##x##NR(const float *x, const uint8_t *w, size_t rowb,     \
                                        size_t cs, int K, const float *bias, float *y,     \
                                        size_t ldy)                                        \
    {                                                                                      \
        qblock(x, w, rowb, cs, K, bias, y, ldy, MR, NR);                                   \
    }
#define QBLOCK_PAIR(MR, NR) QBLOCK_FN(MR, NR) QBLOCK_FN(MR, 1)
QBLOCKS(QBLOCK_PAIR)
#undef QBLOCK_PAIR

#define QBLOCK_ROW(MR, NR) [MR] = { qblock_##MR##x1, qblock_##MR##x##NR, NR },
static const struct {
    qblock_fn one, full;
    int nr;
} qblocks[MR_MAX + 1] = { QBLOCKS(QBLOCK_ROW) };
#undef QBLOCK_ROW

#define QCAT2(a, b) a##b
#define QCAT(a, b) QCAT2(a, b)

void QCAT(kvg_gemm_qkernel_, QISA)(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s)
{
    int K = job->K;
    size_t rowb = kvg_gemm_row_bytes(job->dt, K);
    int nb;

    if (n0 >= n1 || job->M <= 0)
        return;
    if (job->xp) {
        /* Prefill: the F32 packed path, which dequantizes W while packing it. */
        QCAT(kvg_gemm_kernel_, QISA)(job, n0, n1, s);
        return;
    }
    /* Rows of W per block, kept in L2 while every group of X rows passes over them
     * (up to MR_MAX rows of X pass once: one block). */
    nb = (int)(QW_BLOCK_BYTES / (rowb ? rowb : 1));
    nb = nb < 16 ? 16 : nb - nb % 8;
    if (job->M <= MR_MAX)
        nb = n1 - n0;
    for (int b0 = n0; b0 < n1; b0 += nb) {
        int b1 = n1 - b0 < nb ? n1 : b0 + nb;
        for (int m0 = 0; m0 < job->M; m0 += MR_MAX) {
            int mr = job->M - m0 < MR_MAX ? job->M - m0 : MR_MAX, nr = qblocks[mr].nr;
            /* The nr rows of a block are spread over the W block, one from each of nr
             * equal slices, as in gemm_avx512.c's panel (each stream then reads its
             * slice front to back); the rows left over go one at a time. */
            int per = (b1 - b0) / nr;
            const float *x = job->x + (size_t)m0 * (size_t)K;
            float *y = job->y + (size_t)m0 * (size_t)job->N;
            for (int i = 0; i < per; i++) {
                int n = b0 + i;
                qblocks[mr].full(x, (const uint8_t *)job->w + (size_t)n * rowb, rowb, (size_t)per, K,
                                 job->bias ? job->bias + n : NULL, y + n, (size_t)job->N);
            }
            for (int n = b0 + per * nr; n < b1; n++)
                qblocks[mr].one(x, (const uint8_t *)job->w + (size_t)n * rowb, rowb, 1, K,
                                job->bias ? job->bias + n : NULL, y + n, (size_t)job->N);
        }
    }
}

#undef QCAT
#undef QCAT2
