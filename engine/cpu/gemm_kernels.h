/* Internal to the GEMM: the per-ISA kernels behind kvg_gemm (gemm.c); the entry
 * points that run one ISA explicitly are the tests' (gemm_testing.h).
 *
 * The canonical order. Every kernel computes every output element as follows, and
 * nothing else (no other association, no reordering, no fusing beyond this):
 *
 *   acc[l] = +0                                  l = 0..15 (16 lanes)
 *   for k0 = 0, 16, 32, ... while k0 < K:        (a K tail reads as zeros)
 *       for l in 0..15:  k = k0 + l
 *           acc[l] = fma(k < K ? x[k] : 0, k < K ? w[k] : 0, acc[l])
 *   h[i] = acc[i] + acc[i+8]   (i < 8)
 *   q[i] = h[i] + h[i+4]       (i < 4)
 *   d[i] = q[i] + q[i+2]       (i < 2)
 *   s    = d[0] + d[1]
 *   y    = bias ? s + bias[n] : s
 *
 * with W converted exactly to F32 first (F16 and BF16 widen without rounding). Each
 * lane is one FMA chain; the kernels get their instruction-level parallelism from
 * working on several outputs at once (several X rows x several W rows), which changes
 * nothing for any single output. IEEE addition is commutative, so only the pairing
 * above is fixed, not the operand order.
 *
 * Kernels compute y[m][n] for every m in [0, M) and n in [n0, n1) and may be called
 * concurrently on disjoint n ranges, each with its own scratch. They never allocate:
 * kvg_gemm hands them the workspaces the caller made (kvg_gemm_ws).
 *
 * The units, lowest first: this header (shared types and scalar helpers) <-
 * gemm_pack_x86.h (x86 packing) <- gemm_packed_x86.h and gemm_small_m_x86.h (the
 * packed and the small-M paths, templates each x86 ISA file instantiates) <-
 * gemm_generic.c, gemm_avx2.c, gemm_avx512.c <- gemm.c (dispatch, threads,
 * workspaces). */
#ifndef KVG_GEMM_KERNELS_H
#define KVG_GEMM_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu/gemm.h"

typedef struct kvg_gemm_job {
    const float *x;              /* M rows, stride K */
    const float *xp;             /* X packed by the kernel's pack_x: the packed path
                                    runs iff this is set (kvg_gemm sets it only when
                                    the plan packs and the workspace fits) */
    const unsigned char *xq;     /* X quantized for the int8 kernels (gemm_int8.h), rows
                                    of kvg_int8_x_row_bytes(K); NULL otherwise */
    const void *w;               /* N rows, stride K elements of dt */
    const float *bias;           /* N or NULL */
    float *y;                    /* M rows, stride N */
    int M, N, K;
    kvg_dtype dt;
} kvg_gemm_job;

/* One participant's scratch for the packed path (64-byte aligned, contents never read
 * before the kernel writes them, so which participant's scratch a range gets changes
 * no result). */
typedef struct kvg_gemm_scratch {
    float *wp;                   /* packed W block */
    float *slots;                /* the lane tree's partial sums */
} kvg_gemm_scratch;

/* s: scratch for the packed path (NULL when job->xp is NULL). */
typedef void (*kvg_gemm_kernel_fn)(const kvg_gemm_job *job, int n0, int n1,
                                   const kvg_gemm_scratch *s);

/* How a kernel will run a job: with `packed`, it packs X into x_panels panels
 * (xp_floats floats in all); kvg_gemm packs them once, in parallel, and hands them to
 * every thread through job->xp. n_group: W rows per thread share unit. wp_floats and
 * slots_floats: each participant's scratch, for any M and any column range (they
 * depend on K only). */
typedef struct kvg_gemm_plan {
    int packed;
    int x_panels;
    int n_group;
    size_t xp_floats;
    size_t wp_floats, slots_floats;
} kvg_gemm_plan;

typedef void (*kvg_gemm_plan_fn)(const kvg_gemm_job *job, kvg_gemm_plan *plan);
/* Packs X panels [p0, p1) into their places in xp (64-byte aligned). */
typedef void (*kvg_gemm_pack_x_fn)(const kvg_gemm_job *job, int p0, int p1, float *xp);

void kvg_gemm_kernel_generic(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s);
void kvg_gemm_kernel_avx2(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s);
void kvg_gemm_kernel_avx512(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s);
void kvg_gemm_plan_generic(const kvg_gemm_job *job, kvg_gemm_plan *plan);
void kvg_gemm_plan_avx2(const kvg_gemm_job *job, kvg_gemm_plan *plan);
void kvg_gemm_plan_avx512(const kvg_gemm_job *job, kvg_gemm_plan *plan);
void kvg_gemm_pack_x_avx2(const kvg_gemm_job *job, int p0, int p1, float *xp);
void kvg_gemm_pack_x_avx512(const kvg_gemm_job *job, int p0, int p1, float *xp);

typedef enum kvg_gemm_isa_id {
    KVG_ISA_GENERIC = 0,
    KVG_ISA_AVX2 = 1,            /* AVX2 + FMA + F16C */
    KVG_ISA_AVX512 = 2           /* AVX-512 F/BW/VL + FMA + F16C */
} kvg_gemm_isa_id;

/* Exact widenings, shared by the kernels' scalar tails and the generic kernel. */
static inline float kvg_gemm_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float kvg_gemm_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    float f;

    if (exp == 0x1f) {
        /* Inf, or NaN made quiet as the F16C instruction does. */
        u = sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {
        /* Subnormal half: normalise; every one is a normal float. */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Bytes of one row of K elements of a float W (F32, F16, BF16). */
static inline size_t kvg_gemm_row_bytes(kvg_dtype dt, int K)
{
    return (size_t)K * (dt == KVG_DT_F32 ? 4 : 2);
}

/* Element i of W widened exactly to F32 (scalar tails, packing edges, the generic
 * kernel). */
static inline float kvg_gemm_w_at(const void *w, size_t i, kvg_dtype dt)
{
    if (dt == KVG_DT_F32)
        return ((const float *)w)[i];
    if (dt == KVG_DT_F16)
        return kvg_gemm_f16_to_f32(((const uint16_t *)w)[i]);
    return kvg_gemm_bf16_to_f32(((const uint16_t *)w)[i]);
}

/* The fixed horizontal reduction of 16 lanes, scalar form. */
static inline float kvg_gemm_reduce16(const float *acc)
{
    float h[8], q[4], d[2];
    for (int i = 0; i < 8; i++)
        h[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++)
        q[i] = h[i] + h[i + 4];
    d[0] = q[0] + q[2];
    d[1] = q[1] + q[3];
    return d[0] + d[1];
}

#endif
