/* The small-M (decode) kernel over a quantized W, written once for the x86 ISAs:
 * gemm_quant_avx2.c and gemm_quant_avx512.c define a 16-lane float vector QV (one
 * register, or two halves for AVX2), a 16-lane int32 vector QI and these operations,
 * then include this file (no include guard: one instantiation per ISA):
 *   QTGT, QTGT_INLINE               target attributes
 *   QV qv_zero(void)  qv_loadx(const float *p)  qv_set1(float)
 *   QV qv_fma(QV a, QV b, QV c)     a * b + c, one rounding
 *   QV qv_mul(QV, QV)  qv_mulsub(QV a, QV b, QV c)  (a * b) - c, two roundings
 *   float qv_reduce(QV)             the canonical tree over the 16 lanes
 *   QI qi_u8(const uint8_t *p)  qi_s8(p)   16 bytes widened (zero / sign)
 *   QI qi_and(QI, int)  qi_srl(QI, int)  qi_sll(QI, int)  qi_or(QI, QI)  qi_sub(QI, int)
 *   QV qi_cvt(QI)                   exact int -> float
 *   float q_f16(const uint8_t *p)   a little-endian half at p, exactly
 *   MR_MAX, NR_MAX, QBLOCKS(F)      register blocking: F(MR, NR) for each full block
 *   QW_BLOCK_BYTES, QISA            W bytes per L2 block; the name suffix
 * Lane l of each accumulator gets k = k0 + l (16 consecutive weights dequantized into
 * one QV), in increasing k: the canonical order. */

/* One MR x NR block over all of K; w: NR rows of rowb bytes. */
QTGT_INLINE void qblock(const float *x, const uint8_t *w, size_t rowb, kvg_dtype dt, int K,
                        const float *bias, float *y, size_t ldy, const int MR, const int NR)
{
    QV acc[MR_MAX][NR_MAX];
    const int be = dt == KVG_DT_Q8_0 || dt == KVG_DT_Q4_0 ? 32 : 256;
    const size_t bb = dt == KVG_DT_Q8_0 ? 34 : dt == KVG_DT_Q4_0 ? 18 : dt == KVG_DT_Q4_K ? 144 : 210;

    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            acc[r][c] = qv_zero();

    for (int kb = 0; kb < K; kb += be) {
        const uint8_t *blk = w + (size_t)(kb / be) * bb;
        const float *xk = x + kb;
        for (int c = 0; c < NR; c++) {
            const uint8_t *b = blk + (size_t)c * rowb;
#define FMA16(off, wexpr)                                                               \
            do {                                                                        \
                QV wv_ = (wexpr);                                                       \
                for (int r = 0; r < MR; r++)                                            \
                    acc[r][c] = qv_fma(qv_loadx(xk + (size_t)r * (size_t)K + (off)), wv_, acc[r][c]); \
            } while (0)
            if (dt == KVG_DT_Q8_0) {
                QV d = qv_set1(q_f16(b));
                FMA16(0, qv_mul(d, qi_cvt(qi_s8(b + 2))));
                FMA16(16, qv_mul(d, qi_cvt(qi_s8(b + 18))));
            } else if (dt == KVG_DT_Q4_0) {
                QV d = qv_set1(q_f16(b));
                QI q = qi_u8(b + 2);
                FMA16(0, qv_mul(d, qi_cvt(qi_sub(qi_and(q, 15), 8))));
                FMA16(16, qv_mul(d, qi_cvt(qi_sub(qi_srl(q, 4), 8))));
            } else if (dt == KVG_DT_Q4_K) {
                float dd = q_f16(b), dmin = q_f16(b + 2);
                for (int ch = 0; ch < 4; ch++)
                    for (int h = 0; h < 2; h++) {
                        int sc, mn;
                        kvg_q4k_scale_min(b + 4, 2 * ch + h, &sc, &mn);
                        QV ds = qv_set1(dd * (float)sc), dm = qv_set1(dmin * (float)mn);
                        for (int hf = 0; hf < 2; hf++) {
                            QI q = qi_u8(b + 16 + 32 * ch + 16 * hf);
                            q = h ? qi_srl(q, 4) : qi_and(q, 15);
                            FMA16(64 * ch + 32 * h + 16 * hf, qv_mulsub(ds, qi_cvt(q), dm));
                        }
                    }
            } else {
                float d = q_f16(b + 208);
                for (int n = 0; n < 2; n++)
                    for (int g = 0; g < 4; g++)
                        for (int hh = 0; hh < 2; hh++) {
                            QI lo = qi_u8(b + 64 * n + 16 * hh + 32 * (g & 1));
                            lo = g >= 2 ? qi_srl(lo, 4) : qi_and(lo, 15);
                            QI hi = qi_and(qi_srl(qi_u8(b + 128 + 32 * n + 16 * hh), 2 * g), 3);
                            QI q = qi_sub(qi_or(lo, qi_sll(hi, 4)), 32);
                            QV ds = qv_set1(d * (float)(int8_t)b[192 + 8 * n + 2 * g + hh]);
                            FMA16(128 * n + 32 * g + 16 * hh, qv_mul(ds, qi_cvt(q)));
                        }
            }
#undef FMA16
        }
    }

    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) {
            float s = qv_reduce(acc[r][c]);
            y[(size_t)r * ldy + (size_t)c] = bias ? s + bias[c] : s;
        }
}

typedef void (*qblock_fn)(const float *x, const uint8_t *w, size_t rowb, kvg_dtype dt, int K,
                          const float *bias, float *y, size_t ldy);

#define QBLOCK_FN(MR, NR)                                                                     \
    QTGT static void qblock_##MR##x##NR(const float *x, const uint8_t *w, size_t rowb,        \
                                        kvg_dtype dt, int K, const float *bias, float *y,     \
                                        size_t ldy)                                           \
    {                                                                                         \
        switch (dt) {                                                                         \
        case KVG_DT_Q8_0: qblock(x, w, rowb, KVG_DT_Q8_0, K, bias, y, ldy, MR, NR); break;    \
        case KVG_DT_Q4_0: qblock(x, w, rowb, KVG_DT_Q4_0, K, bias, y, ldy, MR, NR); break;    \
        case KVG_DT_Q4_K: qblock(x, w, rowb, KVG_DT_Q4_K, K, bias, y, ldy, MR, NR); break;    \
        default: qblock(x, w, rowb, KVG_DT_Q6_K, K, bias, y, ldy, MR, NR); break;             \
        }                                                                                     \
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
    /* Rows of W per block, kept in L2 while every group of X rows passes over them. */
    nb = (int)(QW_BLOCK_BYTES / (rowb ? rowb : 1));
    nb = nb < 16 ? 16 : nb - nb % 8;
    for (int b0 = n0; b0 < n1; b0 += nb) {
        int b1 = n1 - b0 < nb ? n1 : b0 + nb;
        for (int m0 = 0; m0 < job->M; m0 += MR_MAX) {
            int mr = job->M - m0 < MR_MAX ? job->M - m0 : MR_MAX, nr = qblocks[mr].nr;
            const float *x = job->x + (size_t)m0 * (size_t)K;
            float *y = job->y + (size_t)m0 * (size_t)job->N;
            int n = b0;
            for (; n + nr <= b1; n += nr)
                qblocks[mr].full(x, (const uint8_t *)job->w + (size_t)n * rowb, rowb, job->dt, K,
                                 job->bias ? job->bias + n : NULL, y + n, (size_t)job->N);
            for (; n < b1; n++)
                qblocks[mr].one(x, (const uint8_t *)job->w + (size_t)n * rowb, rowb, job->dt, K,
                                job->bias ? job->bias + n : NULL, y + n, (size_t)job->N);
        }
    }
}

#undef QCAT
#undef QCAT2
