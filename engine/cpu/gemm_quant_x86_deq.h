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

/* A Q4_K super-block's 12 scale bytes unpacked (as kvg_q4k_scale_min) to the 8
 * 6-bit scales in out[0..7] and the 8 6-bit mins in out[8..15], four at a time. */
KVG_QX_INLINE void kvg_x86_q4k_scales(const uint8_t *s, uint8_t *out)
{
    uint32_t u0, u1, u2, v[4];
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    v[0] = u0 & 0x3f3f3f3fu;
    v[1] = (u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4;
    v[2] = u1 & 0x3f3f3f3fu;
    v[3] = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4;
    memcpy(out, v, 16);
}

/* (a * b) - c with two roundings, as defined: never fused into an FMA. */
KVG_QX_INLINE __m256 kvg_x86_mulsub8(__m256 a, __m256 b, __m256 c)
{
    __m256 t = _mm256_mul_ps(a, b);
    __asm__("" : "+x"(t));
    return _mm256_sub_ps(t, c);
}

/* One super-block (256 elements) of dt (Q4_K, Q6_K) at b, dequantized to out
 * (32-byte aligned). */
KVG_QX_INLINE void kvg_x86_deq_block(kvg_dtype dt, const uint8_t *b, float *out)
{
    if (dt == KVG_DT_Q4_K) {
        float dd = kvg_x86_f16(b), dmin = kvg_x86_f16(b + 2);
        __m256i m = _mm256_set1_epi32(15);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            kvg_q4k_scale_min(b + 4, j, &sc, &mn);
            __m256 ds = _mm256_set1_ps(dd * (float)sc), dm = _mm256_set1_ps(dmin * (float)mn);
            const uint8_t *qs = b + 16 + 32 * (j / 2);
            for (int i = 0; i < 32; i += 8) {
                __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + i)));
                q = j & 1 ? _mm256_srli_epi32(q, 4) : _mm256_and_si256(q, m);
                _mm256_store_ps(out + 32 * j + i, kvg_x86_mulsub8(ds, _mm256_cvtepi32_ps(q), dm));
            }
        }
    } else {
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
}

#endif
