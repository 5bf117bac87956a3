/* AVX2 instantiation of the quantized small-M kernel (gemm_quant_x86.h): the 16 lanes
 * are two 8-float halves (lanes 0-7, 8-15), as in gemm_avx2.c; the tree's first step is
 * the sum of the halves. */
#include "cpu/gemm_kernels.h"
#include "cpu/gemm_quant.h"
#include "quant.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define QTGT __attribute__((target("avx2,fma,f16c")))
#define QTGT_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

typedef struct { __m256 a, b; } QV;
typedef struct { __m256i a, b; } QI;

QTGT_INLINE QV qv_zero(void) { QV v = { _mm256_setzero_ps(), _mm256_setzero_ps() }; return v; }
QTGT_INLINE QV qv_loadx(const float *p) { QV v = { _mm256_loadu_ps(p), _mm256_loadu_ps(p + 8) }; return v; }
QTGT_INLINE QV qv_set1(float f) { QV v = { _mm256_set1_ps(f), _mm256_set1_ps(f) }; return v; }
QTGT_INLINE QV qv_fma(QV x, QV w, QV c)
{
    QV v = { _mm256_fmadd_ps(x.a, w.a, c.a), _mm256_fmadd_ps(x.b, w.b, c.b) };
    return v;
}
QTGT_INLINE QV qv_mul(QV x, QV y) { QV v = { _mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b) }; return v; }
QTGT_INLINE QV qv_mulsub(QV x, QV y, QV c)
{
    __m256 ta = _mm256_mul_ps(x.a, y.a), tb = _mm256_mul_ps(x.b, y.b);
    __asm__("" : "+x"(ta), "+x"(tb));   /* two roundings, as defined: never fused */
    QV v = { _mm256_sub_ps(ta, c.a), _mm256_sub_ps(tb, c.b) };
    return v;
}
QTGT_INLINE QI qi_u8(const uint8_t *p)
{
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    QI v = { _mm256_cvtepu8_epi32(b), _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)) };
    return v;
}
QTGT_INLINE QI qi_s8(const uint8_t *p)
{
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    QI v = { _mm256_cvtepi8_epi32(b), _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)) };
    return v;
}
QTGT_INLINE QI qi_and(QI x, int m)
{
    __m256i k = _mm256_set1_epi32(m);
    QI v = { _mm256_and_si256(x.a, k), _mm256_and_si256(x.b, k) };
    return v;
}
QTGT_INLINE QI qi_srl(QI x, int n) { QI v = { _mm256_srli_epi32(x.a, n), _mm256_srli_epi32(x.b, n) }; return v; }
QTGT_INLINE QI qi_sll(QI x, int n) { QI v = { _mm256_slli_epi32(x.a, n), _mm256_slli_epi32(x.b, n) }; return v; }
QTGT_INLINE QI qi_or(QI x, QI y) { QI v = { _mm256_or_si256(x.a, y.a), _mm256_or_si256(x.b, y.b) }; return v; }
QTGT_INLINE QI qi_sub(QI x, int s)
{
    __m256i k = _mm256_set1_epi32(s);
    QI v = { _mm256_sub_epi32(x.a, k), _mm256_sub_epi32(x.b, k) };
    return v;
}
QTGT_INLINE QV qi_cvt(QI x) { QV v = { _mm256_cvtepi32_ps(x.a), _mm256_cvtepi32_ps(x.b) }; return v; }
QTGT_INLINE float q_f16(const uint8_t *p) { return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8)); }

QTGT_INLINE float qv_reduce(QV v)
{
    __m256 h = _mm256_add_ps(v.a, v.b);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

#define MR_MAX 3
#define NR_MAX 4
#define QBLOCKS(F) F(1, 4) F(2, 3) F(3, 2)
#define QW_BLOCK_BYTES (96 * 1024)
#define QISA avx2
#include "cpu/gemm_quant_x86.h"

#else

void kvg_gemm_qkernel_avx2(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s)
{
    kvg_gemm_qkernel_generic(job, n0, n1, s);
}

#endif
