/* AVX-512 instantiation of the quantized small-M kernel (gemm_quant_x86.h): one
 * 16-float register per 16 dequantized weights. */
#include "cpu/gemm_kernels.h"
#include "cpu/gemm_quant.h"
#include "quant.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "cpu/gemm_quant_x86_deq.h"

#define QTGT __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define QTGT_INLINE static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), always_inline))

typedef __m512 QV;
typedef __m512i QI;

QTGT_INLINE QV qv_zero(void) { return _mm512_setzero_ps(); }
QTGT_INLINE QV qv_loadx(const float *p) { return _mm512_loadu_ps(p); }
QTGT_INLINE QV qv_set1(float f) { return _mm512_set1_ps(f); }
QTGT_INLINE QV qv_fma(QV a, QV b, QV c) { return _mm512_fmadd_ps(a, b, c); }
QTGT_INLINE QV qv_mul(QV a, QV b) { return _mm512_mul_ps(a, b); }
QTGT_INLINE QI qi_u8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
QTGT_INLINE QI qi_s8(const uint8_t *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }
QTGT_INLINE QV qi_cvt(QI a) { return _mm512_cvtepi32_ps(a); }
QTGT_INLINE void qv_store(float *p, QV v) { _mm512_storeu_ps(p, v); }

QTGT_INLINE float q_f16(const uint8_t *p) { return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8)); }

/* The canonical tree: lanes i + i+8, then i + i+4, i + i+2, 0 + 1. */
QTGT_INLINE float qv_reduce(QV v)
{
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 h = _mm256_add_ps(lo, hi);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

#define MR_MAX 4
#define NR_MAX 8
#define QBLOCKS(F) F(1, 8) F(2, 6) F(3, 5) F(4, 4)
#define QW_BLOCK_BYTES (192 * 1024)
#define QISA avx512
#include "cpu/gemm_quant_x86.h"

#else

void kvg_gemm_qkernel_avx512(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s)
{
    kvg_gemm_qkernel_generic(job, n0, n1, s);
}

#endif
