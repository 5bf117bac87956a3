/* Vector dequantization helpers of the x86 quantized kernels, AVX2-level and always
 * inlined (GCC allows that into AVX-512 functions too): the W packing of the prefill
 * path and the Q6_K unpacking of the small-M kernels. Every value is computed by the
 * F32 operations of kvg_dequant_row (src/quant.c), in its order, so it has its bits. */
#ifndef KVG_GEMM_QUANT_X86_DEQ_H
#define KVG_GEMM_QUANT_X86_DEQ_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu/gemm_quant.h"
#include "quant.h"

#define KVG_QX_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

KVG_QX_INLINE float kvg_x86_f16(const uint8_t *p)
{
    return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
}

/* A Q6_K super-block's 256 values q - 32 (6-bit q: 4 low bits from ql, 2 from qh) as
 * bytes, 32 at a time: element 128n + 32g + l takes ql[64n + l + 32(g & 1)]'s low
 * (g < 2) or high nibble and bits 2g, 2g+1 of qh[32n + l] (as quant.c's q6k_q). The
 * 16-bit shifts move bits across bytes only where the masks then clear them. */
KVG_QX_INLINE void kvg_x86_q6k_bytes(const uint8_t *b, int8_t *out)
{
    const __m256i m0f = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    for (int n = 0; n < 2; n++) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * n));
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32));
        __m256i h = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
        __m256i v[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, m0f), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30)),
            _mm256_or_si256(_mm256_and_si256(l1, m0f), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m0f), _mm256_and_si256(h, m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m0f),
                            _mm256_and_si256(_mm256_srli_epi16(h, 2), m30)),
        };
        for (int g = 0; g < 4; g++)
            _mm256_storeu_si256((__m256i *)(out + 128 * n + 32 * g), _mm256_sub_epi8(v[g], k32));
    }
}

/* One Q6_K super-block (256 elements) at b, dequantized to out (32-byte aligned). */
KVG_QX_INLINE void kvg_x86_deq_q6k(const uint8_t *b, float *out)
{
    int8_t q[256] __attribute__((aligned(32)));
    float d = kvg_x86_f16(b + 208);
    kvg_x86_q6k_bytes(b, q);
    for (int s = 0; s < 16; s++) {
        __m256 ds = _mm256_set1_ps(d * (float)(int8_t)b[192 + s]);
        for (int i = 0; i < 16; i += 8) {
            __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 16 * s + i)));
            _mm256_store_ps(out + 16 * s + i, _mm256_mul_ps(ds, _mm256_cvtepi32_ps(v)));
        }
    }
}

#endif
