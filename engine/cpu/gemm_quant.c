/* The quantized GEMM's portable parts (see gemm_quant.h): the generic-ISA kernel and
 * the W packing of the x86 packed path. Both dequantize through kvg_dequant_row, the
 * definition itself, so their values are the defined ones by construction. */
#include <math.h>

#include "cpu/gemm_kernels.h"
#include "cpu/gemm_quant.h"
#include "quant.h"

/* Elements per chunk of a row dequantized at a time (a multiple of 256 and 16). */
#define QCHUNK 512
/* X rows per pass over a chunk. */
#define QMB 8

static kvg_qtype qtype(kvg_dtype dt)
{
    return (kvg_qtype)(dt - KVG_DT_Q8_0);
}

void kvg_gemm_qkernel_generic(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *scratch)
{
    int K = job->K;
    size_t rowb = kvg_gemm_row_bytes(job->dt, K), bb = kvg_gemm_q_block_bytes(job->dt);
    int be = kvg_gemm_q_block(job->dt);
    float wv[QCHUNK];

    (void)scratch;
    for (int n = n0; n < n1; n++) {
        const unsigned char *row = (const unsigned char *)job->w + (size_t)n * rowb;
        for (int m0 = 0; m0 < job->M; m0 += QMB) {
            int mr = job->M - m0 < QMB ? job->M - m0 : QMB;
            float acc[QMB][16] = { { 0 } };
            for (int c0 = 0; c0 < K; c0 += QCHUNK) {
                int cn = K - c0 < QCHUNK ? K - c0 : QCHUNK;
                kvg_dequant_row(qtype(job->dt), row + (size_t)(c0 / be) * bb, wv, cn);
                for (int r = 0; r < mr; r++) {
                    const float *x = job->x + (size_t)(m0 + r) * (size_t)K + (size_t)c0;
                    /* cn is a multiple of 32: no K tail within a chunk. */
                    for (int k = 0; k < cn; k += 16)
                        for (int l = 0; l < 16; l++)
                            acc[r][l] = fmaf(x[k + l], wv[k + l], acc[r][l]);
                }
            }
            for (int r = 0; r < mr; r++) {
                float s = kvg_gemm_reduce16(acc[r]);
                job->y[(size_t)(m0 + r) * (size_t)job->N + (size_t)n] = job->bias ? s + job->bias[n] : s;
            }
        }
    }
}

void kvg_gemm_quant_pack_w(const void *w, kvg_dtype dt, int K, int n0, int rows, int panels, int J,
                           float *wp, int PN)
{
    size_t lane_stride = (size_t)J * (size_t)PN;
    size_t rowb = kvg_gemm_row_bytes(dt, K), bb = kvg_gemm_q_block_bytes(dt);
    int be = kvg_gemm_q_block(dt);
    float t[8][256];

    for (int p = 0; p < panels; p++) {
        float *dst = wp + (size_t)p * 16 * lane_stride;
        for (int g = 0; g < PN; g += 8) {
            int r0 = p * PN + g;
            /* Eight rows, one block at a time: for each k the 8 rows are adjacent in
             * the packed layout. Rows past `rows` and k past K are zeros. */
            for (int k0 = 0; k0 < 16 * J; k0 += be) {
                int kn = 16 * J - k0 < be ? 16 * J - k0 : be;
                for (int c = 0; c < 8; c++) {
                    if (r0 + c < rows && k0 < K)
                        kvg_dequant_row(qtype(dt),
                                        (const unsigned char *)w + (size_t)(n0 + r0 + c) * rowb +
                                            (size_t)(k0 / be) * bb,
                                        t[c], be);
                    else
                        memset(t[c], 0, sizeof t[c]);
                }
                for (int i = 0; i < kn; i++) {
                    int k = k0 + i;
                    float *o = dst + (size_t)(k & 15) * lane_stride + (size_t)(k >> 4) * (size_t)PN + g;
                    for (int c = 0; c < 8; c++)
                        o[c] = t[c][i];
                }
            }
        }
    }
}
