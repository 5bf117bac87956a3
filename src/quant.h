/* Block formats of GGUF (ggml) quantized tensors: Q8_0, Q4_0, Q4_K, Q6_K and MXFP4.
 *
 * kvg_dequant_row defines THE F32 value of every quantized element: what the engine reads
 * a quantized row as (kvg_tensor_row_f32: the CUDA backend's upload, the llama2.c export,
 * the tests' references), and what the CPU engine's integer products
 * (engine/cpu/gemm_int8.h, against int8-rounded activations) are bounded against. In F32 arithmetic, in this order (f16 -> f32 is exact):
 *   Q8_0  block 32:  { f16 d; int8 qs[32]; }                      w = d * q
 *   Q4_0  block 32:  { f16 d; uint8 qs[16]; }  j < 16: low nibble of qs[j],
 *                    j >= 16: high nibble of qs[j-16]              w = d * (nibble - 8)
 *   Q4_K  block 256: { f16 d, dmin; uint8 scales[12]; uint8 qs[128]; }
 *                    8 sub-blocks of 32 with 6-bit scale sc and min m (packed in
 *                    scales[12]); chunk c of 64: the first 32 elements are the low
 *                    nibbles of qs[32c..32c+31], the next 32 the high nibbles
 *                                                    w = (d * sc) * q - (dmin * m)
 *   Q6_K  block 256: { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d; }
 *                    q = (4 bits of ql | 2 bits of qh) - 32, 16 sub-blocks of 16
 *                                                    w = (d * scale) * q
 *   MXFP4 block 32:  { uint8 e; uint8 qs[16]; }  (OCP microscaling FP4: E8M0 shared
 *                    exponent, E2M1 elements; ggml type 39) codes as Q4_0's nibbles:
 *                    j < 16 the low nibble of qs[j], j >= 16 the high nibble of
 *                    qs[j-16]; code c -> k = {0,1,2,3,4,6,8,12, 0,-1,-2,-3,-4,-6,-8,-12}[c]
 *                    (E2M1 doubled: bit 3 the sign, 0 0.5 1 1.5 2 3 4 6), and
 *                                                    w = k * 2^(e - 128)
 *                    (ggml's "half" E8M0 scale, 2^(e-127) / 2, which undoes the
 *                    doubling; every e, 0 and 255 included, is a finite power of 2).
 * Plain C, no engine dependency (the benchmarks' GGUF writer quantizes with it too). */
#ifndef KVG_QUANT_H
#define KVG_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* Appended only: engine/model.h's kvg_dtype lists them in this order
 * (KVG_DT_Q8_0 + t), and the tests index tables by it. */
typedef enum kvg_qtype { KVG_Q8_0, KVG_Q4_0, KVG_Q4_K, KVG_Q6_K, KVG_MXFP4 } kvg_qtype;

/* The block formats the engine computes with (its kvg_dtype has all of them). */
#define KVG_QTYPE_ENGINE_LAST KVG_MXFP4

#define KVG_QK8_0 32
#define KVG_QK4_0 32
#define KVG_QK_K 256
#define KVG_Q8_0_BYTES 34
#define KVG_Q4_0_BYTES 18
#define KVG_Q4_K_BYTES 144
#define KVG_Q6_K_BYTES 210
#define KVG_QK_MXFP4 32
#define KVG_MXFP4_BYTES 17

/* Elements per block (32 or 256) and bytes per block (34, 18, 144, 210, 17); 0 for a
 * value outside the enum. */
int kvg_quant_block_elems(kvg_qtype t);
size_t kvg_quant_block_bytes(kvg_qtype t);

/* n elements (n % block == 0) of blocks at src to F32: the defined values above. */
void kvg_dequant_row(kvg_qtype t, const void *src, float *dst, int64_t n);

/* The type of a GGML tensor type id (Q4_0 = 2, Q8_0 = 8, Q4_K = 12, Q6_K = 14,
 * MXFP4 = 39): 0, or -1 for a type that is none of these. A reader that computes
 * only with some of them checks *t (the engine: t <= KVG_QTYPE_ENGINE_LAST). */
int kvg_quant_from_ggml(uint32_t ggml_type, kvg_qtype *t);

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K block's scales[12]. */
static inline void kvg_q4k_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The 6-bit value (0..63, before the - 32) of element e (0..255) of a Q6_K block:
 * 4 low bits from ql, 2 high bits from qh, in ggml's order (two halves of 128; in a
 * half, element 32g + l takes ql[l + 32 (g & 1)]'s low (g < 2) or high nibble and bits
 * 2g, 2g + 1 of qh[l]). */
static inline int kvg_q6k_q6(const uint8_t *b, int e)
{
    const uint8_t *ql = b, *qh = b + 128;
    int n = e / 128, r = e % 128, g = r / 32, l = r % 32;
    int lo = ql[64 * n + l + 32 * (g & 1)];
    lo = g >= 2 ? lo >> 4 : lo & 0xF;
    return lo | ((qh[32 * n + l] >> (2 * g)) & 3) << 4;
}

/* The value of an MXFP4 block's shared exponent byte: 2^(e - 128), exact. */
static inline float kvg_mxfp4_scale(uint8_t e)
{
    union { uint32_t u; float f; } v;
    /* e >= 2: the normal float of exponent e - 128; e = 1, 0: the subnormals 2^-127, 2^-128 */
    v.u = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00200000u << e;
    return v.f;
}

/* The integer k (-12..12) of an MXFP4 code c (0..15): the element is k * 2^(e - 128). */
static inline int kvg_mxfp4_k(int c)
{
    static const signed char k[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };
    return k[c & 15];
}

/* IEEE half to float (exact). */
float kvg_quant_f16_to_f32(uint16_t h);

#endif
