/* Internal to the GEMM: kvg_gemm over a GGUF Q6_K W. (Q8_0, Q4_0 and Q4_K take integer
 * products instead, gemm_int8.h, and never come here.)
 *
 * The numerics are those of the F32 GEMM over the dequantized W: every element is
 * first dequantized, in registers, to exactly the F32 value src/quant.h defines (the
 * same operations in the same order: products are never fused with the following
 * subtraction), and then the canonical order of gemm_kernels.h runs unchanged. So a
 * quantized product equals, bit for bit, the F32 product over kvg_dequant_row's output,
 * at every M, thread count and ISA. (Q4_K took this path too until its int8 product:
 * 1.5x this kernel's decode and 1.4-2.2x its prefill, measured.)
 *
 * Paths:
 *   small M (decode; no packed X): gemm_quant_x86.h's register-blocked kernels (AVX2,
 *     AVX-512), dequantizing 16 weights at a time in registers, the rows of a block
 *     spread over W as front-to-back streams; gemm_quant.c's plain C
 *     kernel for the generic ISA.
 *   prefill (packed X): the F32 packed path of gemm_packed_x86.h, whose W packing calls
 *     kvg_gemm_quant_pack_w (gemm_quant_avx2.c: vector dequantization of a block per
 *     row, then 8 x 8 transposes), as F16/BF16 are widened while
 *     packing. */
#ifndef KVG_GEMM_QUANT_H
#define KVG_GEMM_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

struct kvg_gemm_job;
struct kvg_gemm_scratch;

/* The quantized dtypes these float kernels take: Q6_K (Q8_0, Q4_0 and Q4_K take
 * gemm_int8.h's integer products). */
static inline int kvg_gemm_dt_quant(kvg_dtype dt)
{
    return dt == KVG_DT_Q6_K;
}

/* Elements and bytes per block of a quantized dtype. */
static inline int kvg_gemm_q_block(kvg_dtype dt)
{
    return dt == KVG_DT_Q8_0 || dt == KVG_DT_Q4_0 ? 32 : 256;
}

static inline size_t kvg_gemm_q_block_bytes(kvg_dtype dt)
{
    switch (dt) {
    case KVG_DT_Q8_0: return 34;
    case KVG_DT_Q4_0: return 18;
    case KVG_DT_Q4_K: return 144;
    case KVG_DT_Q6_K: return 210;
    default: return 0;
    }
}

/* Bytes of one row of K elements of W, any dtype. */
static inline size_t kvg_gemm_row_bytes(kvg_dtype dt, int K)
{
    if (kvg_gemm_dt_quant(dt))
        return (size_t)(K / kvg_gemm_q_block(dt)) * kvg_gemm_q_block_bytes(dt);
    return (size_t)K * (dt == KVG_DT_F32 ? 4 : 2);
}

/* The quantized kernels, one per ISA (same contract as kvg_gemm_kernel_*). With packed
 * X they run the ISA's F32 packed path. */
void kvg_gemm_qkernel_generic(const struct kvg_gemm_job *job, int n0, int n1,
                              const struct kvg_gemm_scratch *s);
void kvg_gemm_qkernel_avx2(const struct kvg_gemm_job *job, int n0, int n1,
                           const struct kvg_gemm_scratch *s);
void kvg_gemm_qkernel_avx512(const struct kvg_gemm_job *job, int n0, int n1,
                             const struct kvg_gemm_scratch *s);

/* Rows [n0, n0 + rows) of a quantized W dequantized into the packed layout of
 * gemm_pack_x86.h ([panel][lane][j][PN], zeros past the rows). */
void kvg_gemm_quant_pack_w(const void *w, kvg_dtype dt, int K, int n0, int rows, int panels, int J,
                           float *wp, int PN);

#endif
