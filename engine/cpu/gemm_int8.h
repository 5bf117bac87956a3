/* Internal to the GEMM: integer products for the quantized weights (Q8_0, Q4_0, Q4_K,
 * Q6_K, MXFP4).
 *
 * Q8_0 and Q4_0 are 32 small integers and one F16 scale per block, so a block's
 * dot product with an activation block that is itself 32 int8 values and one scale
 * is one exact integer and two float operations: that is what VNNI (vpdpbusd: 64
 * u8 x s8 products per instruction into 16 int32) is for, about 4x the multiply-adds
 * of an F32 FMA. The price is the activations' rounding to int8 (as llama.cpp's
 * Q8_0 dot products do); the result is then no longer the F32 product over the
 * dequantized W, but it stays batch-invariant and ISA-invariant, because every step
 * below is exact or one fixed IEEE operation.
 *
 * The definition (every kernel, every ISA, every M computes exactly this):
 *
 *   X, per row, per block of 32 (b):
 *     amax  = max |x[k]|                       (exact)
 *     if some x[k] is not finite: dx = NaN, q[k] = 0   (the output becomes NaN)
 *     else dx = amax / 127                      (one IEEE division)
 *          id = dx > 0 ? 1 / dx : 0, and 0 if that is infinite
 *          q[k] = rint(x[k] * id)               (one product, round to nearest even;
 *                                                |q| <= 127)
 *     sx = sum q[k]                             (exact)
 *     sxh[0], sxh[1] = sums of q[k] over k < 16 and k >= 16   (exact; Q6_K's unit)
 *   W, per row n, per block b: the file's integers wq[k] (Q8_0: qs; Q4_0: nibble - 8;
 *     MXFP4: k = kvg_mxfp4_k(code), -12..12, E2M1 doubled) and dw = its F16 scale,
 *     widened exactly (MXFP4: its E8M0 byte e as dw = 2^(e - 128), kvg_mxfp4_scale:
 *     exact, a subnormal for e = 0, 1; so w = k dw is exactly src/quant.h's value).
 *   Y[m][n]:
 *     acc = +0
 *     for b = 0, 1, ...:
 *         isum = sum over the block of wq[k] * q[k]       (exact: |isum| < 2^20)
 *         acc  = fma(dw * dx, (float)isum, acc)           (the product rounded, then
 *                                                          one FMA; (float)isum exact)
 *     y = bias ? acc + bias[n] : acc
 *
 *   Q4_K W, per row n, per block b of 32 (sub-block s = b % 8 of super-block b / 8):
 *     wq[k] = the nibble (0..15), sc and m = the sub-block's 6-bit scale and min,
 *     d and dmin = the super-block's F16 scales, widened exactly; then
 *         ds = d * (float)sc,  dm = dmin * (float)m          (W only: one rounding each)
 *     and the block's step, in place of the Q8_0 / Q4_0 one:
 *         u   = dm * (float)sx                                (one rounding)
 *         acc = fma(dx, fma(ds, (float)isum, -u), acc)        (two roundings)
 *     that is dx * (sum of (ds wq[k] - dm) q[k]), the dequantized Q4_K weight
 *     ((d sc) wq - (dmin m), src/quant.h) against X's rounding, as for Q8_0.
 *   Q6_K W, per row n: its unit is the sub-block of 16 (two per X block b, h = 0, 1 in
 *     order): wq[k] = the 6-bit value (0..63), sc = the sub-block's int8 scale, d =
 *     the super-block's F16 scale; then
 *         o   = sum over the 16 of (wq[k] - 32) q[k]  = isum - 32 sxh[h]   (exact)
 *         acc = fma(d * dx, (float)(sc * o), acc)     (sc * o exact: |.| < 2^23)
 *
 * Integer sums are exact in any order, so a kernel may split and reorder isum as it
 * likes (vpdpbusd adds 4 products at a time; it sees W as unsigned bytes, so its
 * sums carry an offset that one exact subtraction removes: Q4_0 stores nibbles
 * wq + 8 and subtracts 8 * sx, Q8_0's layout stores wq + 128 and subtracts 128 * sx,
 * MXFP4's codes are looked up (vpshufb) as k + 12, 0..24, and 12 * sx subtracted;
 * Q4_K's nibbles and Q6_K's 6-bit values are unsigned already, Q6_K's - 32 coming
 * out as 32 sxh).
 * Only the float chain over blocks is fixed, one chain per output.
 *
 * Error, for the record (t/unit/quant.c checks it): rounding x to q moves each x by
 * at most dx / 2 = amax / 254, so |y - y_f32| <= sum_b (amax_b / 254) sum_k |w[k]|
 * plus float rounding, against the F32 product over the dequantized W.
 *
 * Layouts. The file's rows (KVG_DT_Q8_0, Q4_0, Q4_K, Q6_K, MXFP4) work everywhere, through
 * the plain C kernel here. kvg_gemm_prepare repacks them once into the _R16 layouts
 * the vector kernels stream. Q8_0_R16 / Q4_0_R16: rows in groups of 16 (the last padded with
 * zero rows), each group its blocks in pairs, [64 bytes: the 16 F16 scales of block
 * 2p, then of 2p + 1][quants of block 2p][quants of block 2p + 1] (an odd last block
 * alone, its pair's second 32 scale bytes zero), so a group is ONE front-to-back
 * stream: a separate stream of scales per group ran one-row decode 7-13% slower on
 * Zen 4 (twice the streams for the prefetchers to follow). A block's quants are
 * 64-byte rows t of 16 rows x 4 bytes: byte 4c + kk of row t belongs to W row c of
 * the group and holds, for Q8_0, wq[4t + kk] + 128 as an unsigned byte (t = 0..7);
 * for Q4_0, the file's byte 4t + kk unchanged, whose low nibble is element 4t + kk
 * and high nibble element 16 + 4t + kk (t = 0..3). So one 512-bit load is 16 output
 * columns x 4 k, and vpdpbusd against 4 bytes of X broadcast adds 4 products into
 * each column's int32: no horizontal sums at all.
 *
 * KVG_DT_MXFP4_R16: as Q4_0_R16's quants (the file's byte 4t + kk, its low nibble
 * the code of element 4t + kk, its high one that of element 16 + 4t + kk), but the
 * scales are one E8M0 byte per row and block, so the blocks go in fours: [64 bytes:
 * the 16 E8M0 bytes of block 4p, then of 4p + 1, 4p + 2, 4p + 3][quants of 4p]...
 * [quants of 4p + 3] = 1,088 bytes, exactly the file's 16 x 4 x 17 (a last partial
 * four: its 64 bytes of scales, the unused ones zero, then its blocks' quants), so a
 * group is one front-to-back stream and each 256 bytes of quants starts on a
 * 64-byte boundary.
 *
 * KVG_DT_Q4_K_R16, the same idea per super-block of 256 (2,368 bytes per group, 37
 * rows of 64; the file's 16 rows take 2,304): [the 16 d as F16][the 16 dmin]
 * [sc: 8 sub-blocks x 16 columns, one byte each][m: likewise][quants: for each pair
 * of sub-blocks p = 0..3, 8 rows t of 64 bytes, byte 4c + kk holding, as the file
 * does, element 64p + 4t + kk in its low nibble and element 64p + 32 + 4t + kk in its
 * high one]. The scales unpacked to bytes cost 256 bytes per group and save every
 * kernel the 6-bit unpacking.
 *
 * KVG_DT_Q6_K_R16, per super-block 3,392 bytes per group (the file's 16 rows: 3,360):
 * [the 16 d as F16][32 bytes of zeros][sc: 16 sub-blocks x 16 columns][then per block
 * of 32, 384 bytes: 4 rows t of 64 bytes holding, byte 4c + kk, the low 4 bits of
 * element 4t + kk in the low nibble and of element 16 + 4t + kk in the high one (as
 * Q4_0's quants); 2 rows u of 64 bytes holding, byte 4c + kk, bits 4-5 of element
 * 16u + 4i + kk in bits 2i, 2i + 1 (i = 0..3)]. A block's bytes are contiguous and
 * read in order, so a group is one front-to-back stream (two planes read side by
 * side ran one-row decode at 40% of the speed).
 *
 * Quantized X, per row (kvg_int8_x_row_bytes): K int8, then K/32 float dx, then K/32
 * int32 sx, then K/16 int32 sxh (block b's halves at 2b, 2b + 1). kvg_gemm quantizes
 * each row once per product (once per q/k/v triple), in parallel, into the
 * workspace. */
#ifndef KVG_GEMM_INT8_H
#define KVG_GEMM_INT8_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "model.h"

struct kvg_gemm_job;
struct kvg_gemm_scratch;

static inline int kvg_int8_dt_packed(kvg_dtype dt)
{
    return dt == KVG_DT_Q8_0_R16 || dt == KVG_DT_Q4_0_R16 || dt == KVG_DT_Q4_K_R16 || dt == KVG_DT_Q6_K_R16 ||
           dt == KVG_DT_MXFP4_R16;
}

static inline int kvg_int8_dt(kvg_dtype dt)
{
    return dt == KVG_DT_Q8_0 || dt == KVG_DT_Q4_0 || dt == KVG_DT_Q4_K || dt == KVG_DT_Q6_K || dt == KVG_DT_MXFP4 ||
           kvg_int8_dt_packed(dt);
}

/* What K must be a multiple of for W of dtype dt: its block (1 for F32/F16/BF16). */
static inline int kvg_gemm_k_multiple(kvg_dtype dt)
{
    if (dt == KVG_DT_Q4_K || dt == KVG_DT_Q4_K_R16 || dt == KVG_DT_Q6_K || dt == KVG_DT_Q6_K_R16)
        return 256;
    return kvg_int8_dt(dt) ? 32 : 1;
}

/* KVG_DT_Q4_K_R16: bytes of one super-block of one group, and where its parts start. */
#define KVG_Q4K_SB_BYTES 2368
#define KVG_Q4K_D 0          /* 16 F16 */
#define KVG_Q4K_DMIN 32      /* 16 F16 */
#define KVG_Q4K_SC 64        /* + 16 s + c */
#define KVG_Q4K_M 192        /* + 16 s + c */
#define KVG_Q4K_Q 320        /* + 512 p + 64 t */

/* KVG_DT_Q6_K_R16: likewise. */
#define KVG_Q6K_SB_BYTES 3392
#define KVG_Q6K_D 0          /* 16 F16 */
#define KVG_Q6K_SC 64        /* + 16 h + c (int8) */
#define KVG_Q6K_Q 320        /* + 384 (block in the super-block): rows 0-3 low, 4-5 high */

/* KVG_DT_MXFP4_R16: bytes of four blocks of one group (scales, then quants). */
#define KVG_MX_QUAD_BYTES 1088

/* The MXFP4 codes 0..15 as k + 12 (0..24: vpdpbusd's unsigned side), for vpshufb. */
#define KVG_MX_LUT 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0

/* Bytes of one quantized X row of K elements (K a multiple of 32). */
static inline size_t kvg_int8_x_row_bytes(int K)
{
    return (size_t)K + (size_t)(K / 32) * 16;
}

/* Row r of quantized X (rows of kvg_int8_x_row_bytes(K)), in its parts. */
typedef struct kvg_int8_xrow {
    unsigned char *q;            /* K int8 */
    float *dx;                   /* K/32 block scales */
    int32_t *sx, *sxh;           /* K/32 block sums, K/16 half sums */
} kvg_int8_xrow;

static inline kvg_int8_xrow kvg_int8_x_row(unsigned char *xq, int K, int r)
{
    kvg_int8_xrow x;
    x.q = xq + (size_t)r * kvg_int8_x_row_bytes(K);
    x.dx = (float *)(x.q + K);
    x.sx = (int32_t *)(x.q + K) + K / 32;
    x.sxh = x.sx + K / 32;
    return x;
}

/* What every ISA's quantizer of X shares, by the definition: a block's scale from its
 * largest |x|, d = amax / 127, and the factor *id = 1 / d its values are multiplied by
 * before rounding (0 when d is 0 or 1 / d overflows)... */
static inline float kvg_int8_x_scale(float amax, float *id)
{
    float d = amax / 127.0f;
    *id = d > 0 ? 1.0f / d : 0.0f;
    if (!(*id <= FLT_MAX))
        *id = 0;
    return d;
}

/* ... a block's scale and half sums stored, and its sum (exact in int32) ... */
static inline void kvg_int8_x_block(const kvg_int8_xrow *x, int b, float d, int32_t s0, int32_t s1)
{
    x->dx[b] = d;
    x->sxh[2 * b] = s0;
    x->sxh[2 * b + 1] = s1;
    x->sx[b] = s0 + s1;
}

/* ... and a block holding an infinity or a NaN: quants and sums 0, scale NaN (every
 * product over it is then NaN, as in F32). */
static inline void kvg_int8_x_bad_block(const kvg_int8_xrow *x, int b)
{
    memset(x->q + 32 * b, 0, 32);
    x->dx[b] = __builtin_nanf("");
    x->sx[b] = x->sxh[2 * b] = x->sxh[2 * b + 1] = 0;
}

/* 4 bytes of quants as one int32, for the vector kernels' broadcasts. */
static inline int32_t kvg_int8_load4(const unsigned char *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Bytes of the quants of one block of one group, and of one group of nb blocks. */
static inline size_t kvg_int8_qbytes(kvg_dtype dt)
{
    return dt == KVG_DT_Q8_0_R16 ? 512 : 256;
}

/* A pair of blocks: their scales (64 bytes) and quants. */
static inline size_t kvg_int8_pair_bytes(kvg_dtype dt)
{
    return 64 + 2 * kvg_int8_qbytes(dt);
}

static inline size_t kvg_int8_group_bytes(kvg_dtype dt, int K)
{
    size_t nb = (size_t)(K / 32);
    if (dt == KVG_DT_Q4_K_R16)
        return (size_t)(K / 256) * KVG_Q4K_SB_BYTES;
    if (dt == KVG_DT_Q6_K_R16)
        return (size_t)(K / 256) * KVG_Q6K_SB_BYTES;
    if (dt == KVG_DT_MXFP4_R16)
        return nb / 4 * KVG_MX_QUAD_BYTES + (nb & 3 ? 64 + (nb & 3) * 256 : 0);
    return nb / 2 * kvg_int8_pair_bytes(dt) + (nb & 1) * (64 + kvg_int8_qbytes(dt));
}

/* Where block b's 16 scales (MXFP4: 16 bytes) and its quants start in a group. */
static inline size_t kvg_int8_scales_at(kvg_dtype dt, int b)
{
    if (dt == KVG_DT_MXFP4_R16)
        return (size_t)(b / 4) * KVG_MX_QUAD_BYTES + 16 * (size_t)(b & 3);
    return (size_t)(b / 2) * kvg_int8_pair_bytes(dt) + 32 * (size_t)(b & 1);
}

static inline size_t kvg_int8_quants_at(kvg_dtype dt, int b)
{
    if (dt == KVG_DT_MXFP4_R16)
        return (size_t)(b / 4) * KVG_MX_QUAD_BYTES + 64 + 256 * (size_t)(b & 3);
    return (size_t)(b / 2) * kvg_int8_pair_bytes(dt) + 64 + (size_t)(b & 1) * kvg_int8_qbytes(dt);
}

/* Quantizes rows [r0, r1) of x (stride K) into xq (stride kvg_int8_x_row_bytes(K)),
 * by the definition above; one per ISA, all bit-identical. */
void kvg_int8_quantize_x_generic(const float *x, int K, int r0, int r1, unsigned char *xq);
void kvg_int8_quantize_x_avx2(const float *x, int K, int r0, int r1, unsigned char *xq);
void kvg_int8_quantize_x_avx512(const float *x, int K, int r0, int r1, unsigned char *xq);

/* The kernels (kvg_gemm_kernel_fn's contract; job->xq holds X quantized). The file's
 * layout always runs the generic one. */
void kvg_int8_kernel_generic(const struct kvg_gemm_job *job, int n0, int n1,
                             const struct kvg_gemm_scratch *s);
void kvg_int8_kernel_avx2(const struct kvg_gemm_job *job, int n0, int n1,
                          const struct kvg_gemm_scratch *s);
void kvg_int8_kernel_avx512(const struct kvg_gemm_job *job, int n0, int n1,
                            const struct kvg_gemm_scratch *s);

/* The repacked layout of a [N][K] Q8_0 / Q4_0 / Q4_K / Q6_K / MXFP4 matrix: its dtype and size. */
kvg_dtype kvg_int8_packed_dt(kvg_dtype dt);
size_t kvg_int8_packed_bytes(kvg_dtype packed_dt, int N, int K);
/* Repacks rows [g0 * 16, g1 * 16) of w (the file's rows; N of them) into `out`. */
void kvg_int8_repack(kvg_dtype dt, const void *w, int N, int K, int g0, int g1, void *out);

#endif
