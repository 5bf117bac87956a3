/* The AVX-512 attention kernels (interface in attention_kernels.h): one 16-key group
 * or 16 lanes per register, from attention_simd_x86.h as the AVX2 ones are. The unit
 * test also runs this file on CPUs without AVX-512, through an emulation of the
 * intrinsics, by overriding KVG_AVX512_TARGET. */
#include "cpu/attention_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#ifndef KVG_AVX512_TARGET
#define KVG_AVX512_TARGET "avx512f,fma"
#endif
#define AVX512 __attribute__((target(KVG_AVX512_TARGET)))

/* The scores, the V accumulation (of one row and of 4), the softmax and the SwiGLU, 16
 * lanes a register (attention_simd_x86.h). 4 rows take 4 groups of keys at once (16
 * accumulators; per dimension 4 loads of K serve 16 FMAs) and 64 dimensions (16
 * accumulators; per token 4 loads of V serve 16 FMAs). */
#define AV_TGT AVX512
#define AV_LINK
#define AV_SCORES4 kvg_attn_scores4_avx512
#define AV_SCORES1 kvg_attn_scores1_avx512
#define AV_VACC kvg_attn_vacc_avx512
#define AV_SCORES4_ROWS kvg_attn_scores4_rows_avx512
#define AV_VACC_ROWS kvg_attn_vacc_rows_avx512
#define AV_ROWS_GROUPS 4
#define AV_ROWS_VREGS 4
#define AV_SOFTMAX kvg_attn_softmax_avx512
#define AV_SWIGLU kvg_swiglu_avx512
#define AV_SWIGLU_OAI kvg_swiglu_oai_avx512
#define AV_GEGLU kvg_geglu_avx512
#define AV_SCORES4_I8 kvg_attn_scores4_i8_avx512
#define AV_SCORES1_I8 kvg_attn_scores1_i8_avx512
#define AV_VACC_I8 kvg_attn_vacc_i8_avx512
#define AV_SCORES4_ROWS_I8 kvg_attn_scores4_rows_i8_avx512
#define AV_VACC_ROWS_I8 kvg_attn_vacc_rows_i8_avx512
#define AV_V __m512
#define AV_VL 16
#define AV_SET1(f) _mm512_set1_ps(f)
#define AV_ZERO() _mm512_setzero_ps()
#define AV_LOADU(p) _mm512_loadu_ps(p)
#define AV_STOREU(p, v) _mm512_storeu_ps((p), (v))
#define AV_ADD(a, b) _mm512_add_ps((a), (b))
#define AV_SUB(a, b) _mm512_sub_ps((a), (b))
#define AV_MUL(a, b) _mm512_mul_ps((a), (b))
#define AV_DIV(a, b) _mm512_div_ps((a), (b))
#define AV_MAX(a, b) _mm512_max_ps((a), (b))
#define AV_MIN(a, b) _mm512_min_ps((a), (b))
#define AV_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define AV_POW2_ADD(y, t)                                                                 \
    _mm512_castsi512_ps(_mm512_add_epi32(                                                 \
        _mm512_castps_si512(y),                                                           \
        _mm512_slli_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000)), 23)))
#define AV_KEEP_GE(x, c, y) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask((x), (c), _CMP_GE_OQ), (y))
#define AV_SELECT_GE(x, c, a, b) _mm512_mask_mov_ps((b), _mm512_cmp_ps_mask((x), (c), _CMP_GE_OQ), (a))
/* (an integer OR: the float one needs AVX512DQ) */
#define AV_NEG_ABS(x) \
    _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)))
#define AV_LOAD_I8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))))
#include "cpu/attention_simd_x86.h"
#endif
