/* Portable kernel: the canonical order of gemm_kernels.h written out in plain C, with
 * fmaf for every step (a single rounding, like the vector FMA instructions; without
 * -mfma the compiler calls libm's fmaf, which is correctly rounded either in hardware
 * or in software). It is the reference the SIMD kernels must match bit for bit, and
 * the fallback on CPUs without AVX2; correctness comes before speed here. */
#include <math.h>

#include "cpu/gemm_kernels.h"

/* Elements [k0, k0+16) of row n of W widened to F32, zeros past K. */
static void generic_w16(const kvg_gemm_job *job, int n, int k0, float *out)
{
    size_t off = (size_t)n * (size_t)job->K;
    for (int l = 0; l < 16; l++) {
        int k = k0 + l;
        out[l] = k < job->K ? kvg_gemm_w_at(job->w, off + (size_t)k, job->dt) : 0.0f;
    }
}

void kvg_gemm_kernel_generic(const kvg_gemm_job *job, int n0, int n1,
                             const kvg_gemm_scratch *scratch)
{
    int K = job->K;

    (void)scratch;          /* nothing to pack */
    for (int n = n0; n < n1; n++) {
        for (int m = 0; m < job->M; m++) {
            const float *x = job->x + (size_t)m * (size_t)K;
            float acc[16] = { 0 }, wv[16], s;

            for (int k0 = 0; k0 < K; k0 += 16) {
                generic_w16(job, n, k0, wv);
                for (int l = 0; l < 16; l++) {
                    float xv = k0 + l < K ? x[k0 + l] : 0.0f;
                    acc[l] = fmaf(xv, wv[l], acc[l]);
                }
            }
            s = kvg_gemm_reduce16(acc);
            job->y[(size_t)m * (size_t)job->N + (size_t)n] = job->bias ? s + job->bias[n] : s;
        }
    }
}

void kvg_gemm_plan_generic(const kvg_gemm_job *job, kvg_gemm_plan *plan)
{
    (void)job;
    plan->packed = 0;
    plan->x_panels = 0;
    plan->n_group = 16;
    plan->xp_floats = 0;
    plan->wp_floats = 0;
    plan->slots_floats = 0;
}
