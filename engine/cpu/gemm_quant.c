/* The quantized GEMM's portable part (see gemm_quant.h): the generic-ISA kernel. It
 * dequantizes through kvg_dequant_row, the definition itself, so its values are the
 * defined ones by construction. (The x86 packed path's W packing is in
 * gemm_quant_avx2.c.) */
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
