/* Quantized GEMM micro-benchmark: the weights of the 110M Llama shape (12 layers of
 * dim 768, hidden 2048, and the 32000 x 768 classifier) in every dtype, side by side:
 *   decode:  M = 1 products over all of them (one token's GEMVs) -> tok/s, and the
 *            weight bytes streamed per second (GB/s);
 *   hot:     M = 1 over the first 768 x 768 matrix again and again, so W stays in
 *            L2: the kernel's own ceiling (GB/s) when memory is not the limit;
 *   prefill: M = 128 products -> tok/s.
 * The weights are prepared as the CPU backend prepares them (kvg_gemm_prepare: Q8_0
 * Q4_0, Q4_K, Q6_K and MXFP4 repacked for the int8 kernels).
 * Usage: quant_bench [threads (2)] [decode reps (20)] [prefill reps (2)]. Figures
 * only: no assertions (tests check the numerics). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/gemm.h"
#include "cpu/threadpool.h"
#include "model.h"
#include "quant.h"
#include "quant_testing.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct mat {
    int rows, cols;
    kvg_tensor t;
} mat;

static uint64_t rs = 42;
static float rndf(void)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rs >> 40) / 16777216.0 - 0.5);
}

/* One layer's 7 matrices x 12, plus the classifier. */
static int make_mats(kvg_dtype dt, mat *m, size_t *bytes)
{
    static const int shapes[7][2] = { { 768, 768 }, { 768, 768 }, { 768, 768 }, { 768, 768 },
                                      { 2048, 768 }, { 2048, 768 }, { 768, 2048 } };
    int n = 0;
    *bytes = 0;
    for (int l = 0; l <= 12; l++)
        for (int i = 0; i < (l < 12 ? 7 : 1); i++) {
            int r = l < 12 ? shapes[i][0] : 32000, c = l < 12 ? shapes[i][1] : 768;
            size_t rb = kvg_dtype_row_bytes(dt, c);
            unsigned char *p = malloc((size_t)r * rb);
            float *row = malloc((size_t)c * sizeof *row);
            for (int y = 0; y < r; y++) {
                for (int k = 0; k < c; k++)
                    row[k] = rndf();
                if (kvg_dtype_is_quant(dt))
                    kvg_quant_row((kvg_qtype)(dt - KVG_DT_Q8_0), row, p + (size_t)y * rb, c);
                else if (dt == KVG_DT_F32)
                    memcpy(p + (size_t)y * rb, row, rb);
                else
                    for (int k = 0; k < c; k++) {
                        uint16_t h = (uint16_t)(((uint32_t)(row[k] * 1024.0f) & 0x3ff) | 0x3800);
                        memcpy(p + (size_t)y * rb + 2 * (size_t)k, &h, 2);
                    }
            }
            free(row);
            m[n].rows = r;
            m[n].cols = c;
            m[n].t = (kvg_tensor){ p, dt, r, c };
            {
                kvg_tensor prepared;
                int rc = kvg_gemm_prepare(NULL, &m[n].t, &prepared);
                if (rc < 0) {
                    fprintf(stderr, "quant_bench: out of memory\n");
                    exit(1);
                }
                if (rc > 0) {
                    free(p);
                    m[n].t = prepared;
                }
            }
            *bytes += (size_t)r * rb;
            n++;
        }
    return n;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2, dreps = argc > 2 ? atoi(argv[2]) : 20,
        preps = argc > 3 ? atoi(argv[3]) : 2;
    static const kvg_dtype dts[] = { KVG_DT_F32, KVG_DT_F16, KVG_DT_Q8_0, KVG_DT_Q4_0, KVG_DT_Q4_K, KVG_DT_Q6_K,
                                     KVG_DT_MXFP4 };
    const int PM = 128;
    kvg_threadpool *tp = kvg_threadpool_new(threads);
    kvg_gemm_ws *ws = kvg_gemm_ws_new(threads, 768, 2048);
    float *x = malloc((size_t)PM * 2048 * sizeof *x), *y = malloc((size_t)PM * 32000 * sizeof *y);
    mat m[13 * 7];

    if (!tp || !ws || kvg_gemm_ws_reserve(ws, PM) < 0)
        return 1;
    for (int i = 0; i < PM * 2048; i++)
        x[i] = rndf();
    printf("110M shapes, %d thread(s), GEMM ISA %s; decode = M 1 over all weights (tok/s, weight GB/s), "
           "prefill = M %d\n", threads, kvg_gemm_isa(), PM);
    printf("%-6s %10s %12s %10s %12s %14s\n", "dtype", "weights MB", "decode tok/s", "GB/s", "hot GB/s",
           "prefill tok/s");
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        size_t bytes;
        int n = make_mats(dts[d], m, &bytes);
        double best = 1e30, pbest = 1e30, hbest = 1e30;
        for (int r = 0; r < dreps + 2; r++) {
            double t0 = now();
            for (int i = 0; i < n; i++)
                kvg_gemm(tp, ws, x, 1, m[i].cols, &m[i].t, NULL, y);
            double t = now() - t0;
            if (r >= 2 && t < best)
                best = t;                  /* the first two warm up */
        }
        for (int r = 0; r < dreps + 2; r++) {
            double t0 = now();
            for (int i = 0; i < 100; i++)
                kvg_gemm(tp, ws, x, 1, m[0].cols, &m[0].t, NULL, y);
            double t = now() - t0;
            if (r >= 2 && t < hbest)
                hbest = t;
        }
        for (int r = 0; r < preps; r++) {
            double t0 = now();
            for (int i = 0; i < n; i++)
                kvg_gemm(tp, ws, x, PM, m[i].cols, &m[i].t, NULL, y);
            double t = now() - t0;
            if (t < pbest)
                pbest = t;
        }
        printf("%-6s %10.1f %12.1f %10.2f %12.2f %14.1f\n", kvg_dtype_name(dts[d]), (double)bytes / 1e6,
               1.0 / best, (double)bytes / best / 1e9,
               100.0 * (double)m[0].rows * (double)kvg_dtype_row_bytes(dts[d], m[0].cols) / hbest / 1e9, PM / pbest);
        fflush(stdout);
        for (int i = 0; i < n; i++)
            free((void *)m[i].t.data);   /* malloc'd, or prepared (posix_memalign) */
    }
    kvg_gemm_ws_free(ws);
    kvg_threadpool_free(tp);
    free(x);
    free(y);
    return 0;
}
