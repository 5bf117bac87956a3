/* AVX2 instantiation of the quantized small-M kernel (gemm_quant_x86.h): the 16 lanes
 * are two 8-float halves (lanes 0-7, 8-15), as in gemm_avx2.c; the tree's first step is
 * the sum of the halves. */
#include "cpu/gemm_kernels.h"
#include "cpu/gemm_quant.h"
#include "quant.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <string.h>

#include "cpu/gemm_quant_x86_deq.h"

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
QTGT_INLINE QV qi_cvt(QI x) { QV v = { _mm256_cvtepi32_ps(x.a), _mm256_cvtepi32_ps(x.b) }; return v; }
QTGT_INLINE void qv_store(float *p, QV v)
{
    _mm256_storeu_ps(p, v.a);
    _mm256_storeu_ps(p + 8, v.b);
}

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

#include "cpu/gemm_pack_x86.h"

/* The prefill path's W packing (both x86 ISAs call it; AVX2 code): eight rows at a
 * time, one block each dequantized in vector registers to a buffer, then 8 x 8
 * transposed into the packed layout exactly as the F32 packing does. K is a multiple
 * of the block and so of 16: no k padding. */
__attribute__((target("avx2,fma,f16c")))
void kvg_gemm_quant_pack_w(const void *w, kvg_dtype dt, int K, int n0, int rows, int panels, int J,
                           float *wp, int PN)
{
    size_t lane_stride = (size_t)J * (size_t)PN;
    size_t rowb = kvg_gemm_row_bytes(dt, K), bb = kvg_gemm_q_block_bytes(dt);
    int be = kvg_gemm_q_block(dt);
    float t[8][256] __attribute__((aligned(32)));

    for (int p = 0; p < panels; p++) {
        float *dst = wp + (size_t)p * 16 * lane_stride;
        for (int g = 0; g < PN; g += 8) {
            int r0 = p * PN + g, n = rows - r0 < 8 ? rows - r0 : 8;
            /* Rows past `rows` are zeros. */
            for (int c = n < 0 ? 0 : n; c < 8; c++)
                memset(t[c], 0, sizeof t[c]);
            for (int k0 = 0; k0 < K; k0 += be) {
                for (int c = 0; c < n; c++) {
                    const uint8_t *b = (const uint8_t *)w + (size_t)(n0 + r0 + c) * rowb + (size_t)(k0 / be) * bb;
                    kvg_x86_deq_q6k(b, t[c]);
                }
                for (int i = 0; i < be; i += 8) {
                    int k = k0 + i;
                    __m256 v[8];
                    float *o = dst + (size_t)(k & 15) * lane_stride + (size_t)(k >> 4) * (size_t)PN + g;
                    for (int c = 0; c < 8; c++)
                        v[c] = _mm256_load_ps(t[c] + i);
                    kvg_x86_transpose8(v);
                    for (int c = 0; c < 8; c++)
                        _mm256_store_ps(o + (size_t)c * lane_stride, v[c]);
                }
            }
        }
    }
}

#else

void kvg_gemm_qkernel_avx2(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s)
{
    kvg_gemm_qkernel_generic(job, n0, n1, s);
}

#endif
