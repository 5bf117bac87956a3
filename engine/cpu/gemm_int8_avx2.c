/* The int8 kernel on AVX2 (gemm_int8.h), for CPUs without AVX512_VNNI: the same
 * integers through vpmaddubsw (u8 x s8 pairs into s16) and vpmaddwd (pairs of s16
 * into int32), a group of 16 columns as two 8-column halves. vpmaddubsw saturates,
 * so Q8_0's products go as |w| x (x with w's sign), at most 2 * 128 * 127 < 2^15
 * per pair, and Q4_0's nibbles (<= 15) need nothing. */
#include <string.h>

#include "cpu/gemm_int8.h"
#include "cpu/gemm_kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define A2TGT __attribute__((target("avx2,fma,f16c")))
#define A2INL static inline __attribute__((target("avx2,fma,f16c"), always_inline))
#define A2UNROLL _Pragma("GCC unroll 16")

A2INL __m256i bcast4(const unsigned char *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* MR rows of X (from m0) x one group of 16 columns (g), over all of K. */
A2INL void tile(const kvg_gemm_job *job, int m0, int g, int q8, const int MR)
{
    const int K = job->K, nb = K / 32;
    const size_t rb = kvg_int8_x_row_bytes(K), qb = q8 ? 512 : 256;
    const unsigned char *grp = (const unsigned char *)job->w + (size_t)g * kvg_int8_group_bytes(job->dt, K);
    const __m256i m0f = _mm256_set1_epi8(0x0f), k80 = _mm256_set1_epi8((char)0x80);
    const __m256i ones = _mm256_set1_epi16(1);
    const unsigned char *xr[2];
    const float *dx[2];
    const int32_t *sx[2];
    __m256 facc[2][2];

    A2UNROLL for (int r = 0; r < MR; r++) {
        xr[r] = job->xq + (size_t)(m0 + r) * rb;
        dx[r] = (const float *)(xr[r] + K);
        sx[r] = (const int32_t *)(xr[r] + K) + nb;
        facc[r][0] = facc[r][1] = _mm256_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        const unsigned char *q = grp + (size_t)b * qb;
        __m256i iacc[2][2];
        A2UNROLL for (int r = 0; r < MR; r++)
            iacc[r][0] = iacc[r][1] = _mm256_set1_epi32(q8 ? 0 : -8 * sx[r][b]);
        if (q8) {
            A2UNROLL for (int t = 0; t < 8; t++)
                A2UNROLL for (int h = 0; h < 2; h++) {
                    /* The stored bytes are wq + 128: flip the top bit back to wq. */
                    __m256i ws = _mm256_xor_si256(_mm256_load_si256((const __m256i *)(q + 64 * t + 32 * h)), k80);
                    __m256i wa = _mm256_abs_epi8(ws);
                    A2UNROLL for (int r = 0; r < MR; r++) {
                        __m256i xs = _mm256_sign_epi8(bcast4(xr[r] + 32 * b + 4 * t), ws);
                        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xs), ones);
                        iacc[r][h] = _mm256_add_epi32(iacc[r][h], p);
                    }
                }
        } else {
            A2UNROLL for (int t = 0; t < 4; t++)
                A2UNROLL for (int h = 0; h < 2; h++) {
                    __m256i raw = _mm256_load_si256((const __m256i *)(q + 64 * t + 32 * h));
                    __m256i lo = _mm256_and_si256(raw, m0f);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m0f);
                    A2UNROLL for (int r = 0; r < MR; r++) {
                        __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xr[r] + 32 * b + 4 * t)),
                                                     _mm256_maddubs_epi16(hi, bcast4(xr[r] + 32 * b + 16 + 4 * t)));
                        iacc[r][h] = _mm256_add_epi32(iacc[r][h], _mm256_madd_epi16(p, ones));
                    }
                }
        }
        A2UNROLL for (int h = 0; h < 2; h++) {
            __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + (size_t)nb * qb + 32 * (size_t)b + 16 * h)));
            A2UNROLL for (int r = 0; r < MR; r++)
                facc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(dx[r][b])),
                                             _mm256_cvtepi32_ps(iacc[r][h]), facc[r][h]);
        }
    }
    A2UNROLL for (int r = 0; r < MR; r++) {
        float v[16];
        int n = g * 16, cols = job->N - n < 16 ? job->N - n : 16;
        _mm256_storeu_ps(v, facc[r][0]);
        _mm256_storeu_ps(v + 8, facc[r][1]);
        for (int c = 0; c < cols; c++)
            job->y[(size_t)(m0 + r) * (size_t)job->N + (size_t)(n + c)] = job->bias ? v[c] + job->bias[n + c] : v[c];
    }
}

A2TGT static void tile1(const kvg_gemm_job *job, int m0, int g)
{
    if (job->dt == KVG_DT_Q8_0_R16)
        tile(job, m0, g, 1, 1);
    else
        tile(job, m0, g, 0, 1);
}

A2TGT static void tile2(const kvg_gemm_job *job, int m0, int g)
{
    if (job->dt == KVG_DT_Q8_0_R16)
        tile(job, m0, g, 1, 2);
    else
        tile(job, m0, g, 0, 2);
}

void kvg_int8_kernel_avx2(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s)
{
    if (!kvg_int8_dt_packed(job->dt)) {
        kvg_int8_kernel_generic(job, n0, n1, s);
        return;
    }
    for (int g = n0 / 16; g < (n1 + 15) / 16; g++) {
        int m0 = 0;
        for (; m0 + 2 <= job->M; m0 += 2)
            tile2(job, m0, g);
        if (m0 < job->M)
            tile1(job, m0, g);
    }
}

#else

void kvg_int8_kernel_avx2(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s)
{
    kvg_int8_kernel_generic(job, n0, n1, s);
}

#endif
