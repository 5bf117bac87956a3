/* The int8 products' portable part (see gemm_int8.h): quantizing X, repacking W and
 * the plain C kernels, over the file's rows and over the repacked layout. These are
 * the definition written out; the vector kernels must match them bit for bit. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu/gemm_int8.h"
#include "cpu/gemm_kernels.h"
#include "quant.h"

/* ---- X ---- */

/* Block b of one row, by the definition: its quants, scale, sum and half sums. */
static void quantize_block(const float *x, const kvg_int8_xrow *xr, int b)
{
    int8_t *q = (int8_t *)xr->q + 32 * b;
    int32_t sxh[2] = { 0, 0 };
    float amax = 0, d, id;
    int bad = 0;

    for (int i = 0; i < 32; i++) {
        float a = fabsf(x[i]);
        bad |= !(a <= FLT_MAX);
        amax = a > amax ? a : amax;
    }
    if (bad) {
        kvg_int8_x_bad_block(xr, b);
        return;
    }
    d = kvg_int8_x_scale(amax, &id);
    for (int i = 0; i < 32; i++) {
        int v = (int)lrintf(x[i] * id);
        q[i] = (int8_t)v;
        sxh[i / 16] += v;
    }
    kvg_int8_x_block(xr, b, d, sxh[0], sxh[1]);
}

void kvg_int8_quantize_x_generic(const float *x, int K, int r0, int r1, unsigned char *xq)
{
    for (int r = r0; r < r1; r++) {
        kvg_int8_xrow xr = kvg_int8_x_row(xq, K, r);
        for (int b = 0; b < K / 32; b++)
            quantize_block(x + (size_t)r * (size_t)K + 32 * (size_t)b, &xr, b);
    }
}

/* ---- W: the repacked layout ---- */

kvg_dtype kvg_int8_packed_dt(kvg_dtype dt)
{
    switch (dt) {
    case KVG_DT_Q8_0: return KVG_DT_Q8_0_R16;
    case KVG_DT_Q4_0: return KVG_DT_Q4_0_R16;
    case KVG_DT_Q4_K: return KVG_DT_Q4_K_R16;
    case KVG_DT_MXFP4: return KVG_DT_MXFP4_R16;
    default: return KVG_DT_Q6_K_R16;
    }
}

size_t kvg_int8_packed_bytes(kvg_dtype packed_dt, int N, int K)
{
    return (size_t)((N + 15) / 16) * kvg_int8_group_bytes(packed_dt, K);
}

/* One Q4_K block (the file's 144 bytes) into column c of super-block sbp of a group:
 * the scales unpacked to bytes, the quants in rows of 4 (the file's byte order
 * within each row of 4 already pairs element e with e + 32). */
static void repack_q4k_block(const unsigned char *blk, int c, unsigned char *sbp)
{
    memcpy(sbp + KVG_Q4K_D + 2 * c, blk, 2);
    memcpy(sbp + KVG_Q4K_DMIN + 2 * c, blk + 2, 2);
    for (int s = 0; s < 8; s++) {
        int sc, m;
        kvg_q4k_scale_min(blk + 4, s, &sc, &m);
        sbp[KVG_Q4K_SC + 16 * s + c] = (unsigned char)sc;
        sbp[KVG_Q4K_M + 16 * s + c] = (unsigned char)m;
    }
    for (int p = 0; p < 4; p++)
        for (int t = 0; t < 8; t++)
            memcpy(sbp + KVG_Q4K_Q + 512 * p + 64 * t + 4 * c, blk + 16 + 32 * p + 4 * t, 4);
}

/* One Q6_K block (210 bytes) into column c of super-block sbp of a group. */
static void repack_q6k_block(const unsigned char *blk, int c, unsigned char *sbp)
{
    memcpy(sbp + KVG_Q6K_D + 2 * c, blk + 208, 2);
    for (int h = 0; h < 16; h++)
        sbp[KVG_Q6K_SC + 16 * h + c] = blk[192 + h];
    for (int j = 0; j < 8; j++) {
        unsigned char *q = sbp + KVG_Q6K_Q + 384 * j;
        const int e0 = 32 * j;
        for (int kk = 0; kk < 4; kk++) {
            for (int t = 0; t < 4; t++) {
                int lo = kvg_q6k_q6(blk, e0 + 4 * t + kk), hi = kvg_q6k_q6(blk, e0 + 16 + 4 * t + kk);
                q[64 * t + 4 * c + kk] = (unsigned char)((lo & 15) | (hi & 15) << 4);
            }
            for (int u = 0; u < 2; u++) {
                int v = 0;
                for (int i = 0; i < 4; i++)
                    v |= (kvg_q6k_q6(blk, e0 + 16 * u + 4 * i + kk) >> 4) << (2 * i);
                q[256 + 64 * u + 4 * c + kk] = (unsigned char)v;
            }
        }
    }
}

void kvg_int8_repack(kvg_dtype dt, const void *w, int N, int K, int g0, int g1, void *out)
{
    kvg_dtype pdt = kvg_int8_packed_dt(dt);
    size_t bb = dt == KVG_DT_Q8_0 ? 34 : dt == KVG_DT_Q4_0 ? 18 : dt == KVG_DT_Q4_K ? 144 : dt == KVG_DT_MXFP4 ? 17 : 210;
    int bk = dt == KVG_DT_Q4_K || dt == KVG_DT_Q6_K ? 256 : 32, nb = K / bk;
    size_t rowb = (size_t)nb * bb, gb = kvg_int8_group_bytes(pdt, K);

    for (int g = g0; g < g1; g++) {
        unsigned char *grp = (unsigned char *)out + (size_t)g * gb;
        memset(grp, 0, gb);
        for (int c = 0; c < 16 && g * 16 + c < N; c++) {
            const unsigned char *row = (const unsigned char *)w + (size_t)(g * 16 + c) * rowb;
            for (int b = 0; b < nb; b++) {
                const unsigned char *blk = row + (size_t)b * bb;
                if (dt == KVG_DT_Q4_K) {
                    repack_q4k_block(blk, c, grp + (size_t)b * KVG_Q4K_SB_BYTES);
                    continue;
                }
                if (dt == KVG_DT_Q6_K) {
                    repack_q6k_block(blk, c, grp + (size_t)b * KVG_Q6K_SB_BYTES);
                    continue;
                }
                size_t qb = kvg_int8_qbytes(pdt);
                unsigned char *q = grp + kvg_int8_quants_at(pdt, b);
                if (dt == KVG_DT_MXFP4) {
                    /* The E8M0 byte, then the codes as the file packs them. */
                    grp[kvg_int8_scales_at(pdt, b) + c] = blk[0];
                    for (int t = 0; t < 4; t++)
                        memcpy(q + 64 * t + 4 * c, blk + 1 + 4 * t, 4);
                    continue;
                }
                memcpy(grp + kvg_int8_scales_at(pdt, b) + 2 * c, blk, 2);
                for (int t = 0; t < (int)(qb / 64); t++)
                    for (int kk = 0; kk < 4; kk++)
                        q[64 * t + 4 * c + kk] = dt == KVG_DT_Q8_0 ? (unsigned char)(blk[2 + 4 * t + kk] ^ 0x80)
                                                                  : blk[2 + 4 * t + kk];
            }
        }
    }
}

/* ---- the plain C kernels ---- */

static float half_at(const unsigned char *p)
{
    return kvg_gemm_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

/* Block b (of 32) of output n as the definition names it: the weight integers and
 * dw (Q8_0, Q4_0, MXFP4: PLAIN), ds and dm (Q4_K), or dw and the two sub-block scales sc
 * (Q6_K). */
enum { PLAIN, Q4K, Q6K };
typedef struct wblock {
    int wq[32];
    int kind;
    float dw, ds, dm;
    int sc[2];
} wblock;

static void q4k_from(float d, float dmin, int sc, int m, wblock *wb)
{
    wb->kind = Q4K;
    wb->ds = d * (float)sc;
    wb->dm = dmin * (float)m;
}

static void w_block(const kvg_gemm_job *job, int n, int b, wblock *wb)
{
    int K = job->K, nb = K / 32;
    const unsigned char *w = job->w;

    wb->kind = PLAIN;
    switch (job->dt) {
    case KVG_DT_Q8_0: {
        const unsigned char *blk = w + ((size_t)n * (size_t)nb + (size_t)b) * 34;
        wb->dw = half_at(blk);
        for (int k = 0; k < 32; k++)
            wb->wq[k] = (int8_t)blk[2 + k];
        break;
    }
    case KVG_DT_Q4_0: {
        const unsigned char *blk = w + ((size_t)n * (size_t)nb + (size_t)b) * 18;
        wb->dw = half_at(blk);
        for (int k = 0; k < 16; k++) {
            wb->wq[k] = (blk[2 + k] & 15) - 8;
            wb->wq[k + 16] = (blk[2 + k] >> 4) - 8;
        }
        break;
    }
    case KVG_DT_MXFP4: {
        const unsigned char *blk = w + ((size_t)n * (size_t)nb + (size_t)b) * 17;
        wb->dw = kvg_mxfp4_scale(blk[0]);
        for (int k = 0; k < 16; k++) {
            wb->wq[k] = kvg_mxfp4_k(blk[1 + k] & 15);
            wb->wq[k + 16] = kvg_mxfp4_k(blk[1 + k] >> 4);
        }
        break;
    }
    case KVG_DT_MXFP4_R16: {
        const unsigned char *grp = w + (size_t)(n / 16) * kvg_int8_group_bytes(job->dt, K);
        const unsigned char *q = grp + kvg_int8_quants_at(job->dt, b);
        int c = n % 16;
        wb->dw = kvg_mxfp4_scale(grp[kvg_int8_scales_at(job->dt, b) + c]);
        for (int t = 0; t < 4; t++)
            for (int kk = 0; kk < 4; kk++) {
                unsigned char v = q[64 * t + 4 * c + kk];
                wb->wq[4 * t + kk] = kvg_mxfp4_k(v & 15);
                wb->wq[16 + 4 * t + kk] = kvg_mxfp4_k(v >> 4);
            }
        break;
    }
    case KVG_DT_Q4_K: {
        const unsigned char *blk = w + ((size_t)n * (size_t)(K / 256) + (size_t)(b / 8)) * 144;
        int s = b % 8, sc, m;
        const unsigned char *qs = blk + 16 + 32 * (s / 2);
        kvg_q4k_scale_min(blk + 4, s, &sc, &m);
        q4k_from(half_at(blk), half_at(blk + 2), sc, m, wb);
        for (int k = 0; k < 32; k++)
            wb->wq[k] = s % 2 ? qs[k] >> 4 : qs[k] & 15;
        break;
    }
    case KVG_DT_Q4_K_R16: {
        const unsigned char *sbp = w + (size_t)(n / 16) * kvg_int8_group_bytes(job->dt, K) +
                                   (size_t)(b / 8) * KVG_Q4K_SB_BYTES;
        int s = b % 8, c = n % 16;
        q4k_from(half_at(sbp + KVG_Q4K_D + 2 * c), half_at(sbp + KVG_Q4K_DMIN + 2 * c), sbp[KVG_Q4K_SC + 16 * s + c],
                 sbp[KVG_Q4K_M + 16 * s + c], wb);
        for (int t = 0; t < 8; t++)
            for (int kk = 0; kk < 4; kk++) {
                unsigned char v = sbp[KVG_Q4K_Q + 512 * (s / 2) + 64 * t + 4 * c + kk];
                wb->wq[4 * t + kk] = s % 2 ? v >> 4 : v & 15;
            }
        break;
    }
    case KVG_DT_Q6_K: {
        const unsigned char *blk = w + ((size_t)n * (size_t)(K / 256) + (size_t)(b / 8)) * 210;
        wb->kind = Q6K;
        wb->dw = half_at(blk + 208);
        wb->sc[0] = (int8_t)blk[192 + 2 * (b % 8)];
        wb->sc[1] = (int8_t)blk[192 + 2 * (b % 8) + 1];
        for (int k = 0; k < 32; k++)
            wb->wq[k] = kvg_q6k_q6(blk, 32 * (b % 8) + k);
        break;
    }
    case KVG_DT_Q6_K_R16: {
        const unsigned char *sbp = w + (size_t)(n / 16) * kvg_int8_group_bytes(job->dt, K) +
                                   (size_t)(b / 8) * KVG_Q6K_SB_BYTES;
        int j = b % 8, c = n % 16;
        wb->kind = Q6K;
        wb->dw = half_at(sbp + KVG_Q6K_D + 2 * c);
        wb->sc[0] = (int8_t)sbp[KVG_Q6K_SC + 16 * (2 * j) + c];
        wb->sc[1] = (int8_t)sbp[KVG_Q6K_SC + 16 * (2 * j + 1) + c];
        const unsigned char *q = sbp + KVG_Q6K_Q + 384 * j;
        for (int t = 0; t < 8; t++)
            for (int kk = 0; kk < 4; kk++) {
                unsigned char lo = q[64 * (t % 4) + 4 * c + kk], hi = q[256 + 64 * (t / 4) + 4 * c + kk];
                wb->wq[4 * t + kk] = (t < 4 ? lo & 15 : lo >> 4) | ((hi >> (2 * (t % 4))) & 3) << 4;
            }
        break;
    }
    default: {
        size_t qb = kvg_int8_qbytes(job->dt);
        const unsigned char *grp = w + (size_t)(n / 16) * kvg_int8_group_bytes(job->dt, K);
        const unsigned char *q = grp + kvg_int8_quants_at(job->dt, b);
        int c = n % 16;
        wb->dw = half_at(grp + kvg_int8_scales_at(job->dt, b) + 2 * c);
        for (int t = 0; t < (int)(qb / 64); t++)
            for (int kk = 0; kk < 4; kk++) {
                unsigned char v = q[64 * t + 4 * c + kk];
                if (job->dt == KVG_DT_Q8_0_R16) {
                    wb->wq[4 * t + kk] = (int)v - 128;
                } else {
                    wb->wq[4 * t + kk] = (v & 15) - 8;
                    wb->wq[16 + 4 * t + kk] = (v >> 4) - 8;
                }
            }
        break;
    }
    }
}

/* X rows per pass over a W row (each block's integers are unpacked once per pass). */
#define GMR 8

void kvg_int8_kernel_generic(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s)
{
    int K = job->K, nb = K / 32;
    size_t rb = kvg_int8_x_row_bytes(K);
    wblock wb;

    (void)s;
    for (int n = n0; n < n1; n++)
        for (int m0 = 0; m0 < job->M; m0 += GMR) {
            int mr = job->M - m0 < GMR ? job->M - m0 : GMR;
            float acc[GMR] = { 0 };
            for (int b = 0; b < nb; b++) {
                w_block(job, n, b, &wb);
                for (int r = 0; r < mr; r++) {
                    const unsigned char *row = job->xq + (size_t)(m0 + r) * rb;
                    const float *dx = (const float *)(row + K);
                    const int32_t *sx = (const int32_t *)(row + K) + nb, *sxh = sx + nb;
                    int32_t isum = 0;
                    if (wb.kind == Q6K) {
                        for (int h = 0; h < 2; h++) {
                            int32_t o = -32 * sxh[2 * b + h];
                            for (int k = 16 * h; k < 16 * h + 16; k++)
                                o += wb.wq[k] * (int8_t)row[32 * b + k];
                            acc[r] = fmaf(wb.dw * dx[b], (float)(wb.sc[h] * o), acc[r]);
                        }
                        continue;
                    }
                    for (int k = 0; k < 32; k++)
                        isum += wb.wq[k] * (int8_t)row[32 * b + k];
                    if (wb.kind == Q4K) {
                        float u = wb.dm * (float)sx[b];
                        acc[r] = fmaf(dx[b], fmaf(wb.ds, (float)isum, -u), acc[r]);
                    } else {
                        acc[r] = fmaf(wb.dw * dx[b], (float)isum, acc[r]);
                    }
                }
            }
            for (int r = 0; r < mr; r++)
                job->y[(size_t)(m0 + r) * (size_t)job->N + (size_t)n] = job->bias ? acc[r] + job->bias[n] : acc[r];
        }
}
