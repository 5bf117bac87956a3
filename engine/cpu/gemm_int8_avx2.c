/* The int8 kernel on AVX2 (gemm_int8.h), for CPUs without AVX512_VNNI: the same
 * integers through vpmaddubsw (u8 x s8 pairs into s16) and vpmaddwd (pairs of s16
 * into int32), a group of 16 columns as two 8-column halves. vpmaddubsw saturates,
 * so Q8_0's products go as |w| x (x with w's sign), at most 2 * 128 * 127 < 2^15
 * per pair, and Q4_0's and Q4_K's nibbles (<= 15), MXFP4's looked-up k + 12 (<= 24)
 * and Q6_K's 6-bit values (<= 63) need nothing. */
#include <float.h>
#include <string.h>

#include "cpu/gemm_int8.h"
#include "cpu/gemm_kernels.h"

/* Off x86 this file defines nothing: gemm.c has only the generic level there. */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define A2TGT __attribute__((target("avx2,fma,f16c")))
#define A2INL static inline __attribute__((target("avx2,fma,f16c"), always_inline))
#define A2UNROLL _Pragma("GCC unroll 16")

A2INL float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* X quantized as kvg_int8_quantize_x_generic does (gemm_int8.h), 8 at a time: max is
 * exact in any order, and the product and its rounding (cvtps2dq, to nearest even)
 * are the same operations as the C code's. */
A2TGT void kvg_int8_quantize_x_avx2(const float *x, int K, int r0, int r1, unsigned char *xq)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);

    for (int r = r0; r < r1; r++) {
        const float *xr = x + (size_t)r * (size_t)K;
        kvg_int8_xrow row = kvg_int8_x_row(xq, K, r);
        for (int b = 0; b < K / 32; b++) {
            __m256 v[4], amax = _mm256_setzero_ps();
            int bad = 0;
            float d, id;
            for (int i = 0; i < 4; i++) {
                __m256 a;
                v[i] = _mm256_loadu_ps(xr + 32 * b + 8 * i);
                a = _mm256_andnot_ps(sign, v[i]);
                /* Not <= FLT_MAX: infinite or NaN (unordered compares true). */
                bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_NLE_UQ));
                amax = _mm256_max_ps(a, amax);
            }
            if (bad) {
                kvg_int8_x_bad_block(&row, b);
                continue;
            }
            d = kvg_int8_x_scale(hmax8(amax), &id);
            __m256i q[4], s;
            int32_t sxh[2];
            for (int i = 0; i < 4; i++)
                q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
            /* int32 -> int8 in element order: the packs interleave 128-bit lanes, the
             * permute puts them back. */
            __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
            __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(row.q + 32 * b), p8);
            for (int h = 0; h < 2; h++) {
                s = _mm256_add_epi32(q[2 * h], q[2 * h + 1]);
                __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
                sxh[h] = _mm_cvtsi128_si32(s4);
            }
            kvg_int8_x_block(&row, b, d, sxh[0], sxh[1]);
        }
    }
}

A2INL __m256i bcast4(const unsigned char *p)
{
    return _mm256_set1_epi32(kvg_int8_load4(p));
}

/* A tile's MR quantized X rows: their int8 values, block scales and sums. */
typedef struct tile_rows {
    const unsigned char *xr[2];
    const float *dx[2];
    const int32_t *sx[2];
} tile_rows;

/* A tile's start: its rows from m0, its accumulators at zero. */
A2INL void rows_begin(const kvg_gemm_job *job, int m0, const int MR, tile_rows *p, __m256 facc[2][2])
{
    const int K = job->K;
    A2UNROLL for (int r = 0; r < MR; r++) {
        p->xr[r] = job->xq + (size_t)(m0 + r) * kvg_int8_x_row_bytes(K);
        p->dx[r] = (const float *)(p->xr[r] + K);
        p->sx[r] = (const int32_t *)(p->xr[r] + K) + K / 32;
        facc[r][0] = facc[r][1] = _mm256_setzero_ps();
    }
}

/* Row m of group g's outputs (+ bias); only the matrix's last group is partial. */
A2INL void store_row(const kvg_gemm_job *job, int m, int g, const __m256 facc[2])
{
    float v[16];
    int n = g * 16, cols = job->N - n < 16 ? job->N - n : 16;
    _mm256_storeu_ps(v, facc[0]);
    _mm256_storeu_ps(v + 8, facc[1]);
    for (int c = 0; c < cols; c++)
        job->y[(size_t)m * (size_t)job->N + (size_t)(n + c)] = job->bias ? v[c] + job->bias[n + c] : v[c];
}

/* MR rows of X (from m0) x one group of 16 columns (g), over all of K. */
A2INL void tile(const kvg_gemm_job *job, int m0, int g, int q8, const int MR)
{
    const int K = job->K, nb = K / 32;
    const kvg_dtype pdt = q8 ? KVG_DT_Q8_0_R16 : KVG_DT_Q4_0_R16;   /* a constant, inlined */
    const unsigned char *grp = (const unsigned char *)job->w + (size_t)g * kvg_int8_group_bytes(job->dt, K);
    const __m256i m0f = _mm256_set1_epi8(0x0f), k80 = _mm256_set1_epi8((char)0x80);
    const __m256i ones = _mm256_set1_epi16(1);
    tile_rows rows;
    __m256 facc[2][2];

    rows_begin(job, m0, MR, &rows, facc);
    for (int b = 0; b < nb; b++) {
        const unsigned char *q = grp + kvg_int8_quants_at(pdt, b);
        __m256i iacc[2][2];
        A2UNROLL for (int r = 0; r < MR; r++)
            iacc[r][0] = iacc[r][1] = _mm256_set1_epi32(q8 ? 0 : -8 * rows.sx[r][b]);
        if (q8) {
            A2UNROLL for (int t = 0; t < 8; t++)
                A2UNROLL for (int h = 0; h < 2; h++) {
                    /* The stored bytes are wq + 128: flip the top bit back to wq. */
                    __m256i ws = _mm256_xor_si256(_mm256_load_si256((const __m256i *)(q + 64 * t + 32 * h)), k80);
                    __m256i wa = _mm256_abs_epi8(ws);
                    A2UNROLL for (int r = 0; r < MR; r++) {
                        __m256i xs = _mm256_sign_epi8(bcast4(rows.xr[r] + 32 * b + 4 * t), ws);
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
                        __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(rows.xr[r] + 32 * b + 4 * t)),
                                                     _mm256_maddubs_epi16(hi, bcast4(rows.xr[r] + 32 * b + 16 + 4 * t)));
                        iacc[r][h] = _mm256_add_epi32(iacc[r][h], _mm256_madd_epi16(p, ones));
                    }
                }
        }
        A2UNROLL for (int h = 0; h < 2; h++) {
            __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + kvg_int8_scales_at(pdt, b) + 16 * h)));
            A2UNROLL for (int r = 0; r < MR; r++)
                facc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(rows.dx[r][b])),
                                             _mm256_cvtepi32_ps(iacc[r][h]), facc[r][h]);
        }
    }
    A2UNROLL for (int r = 0; r < MR; r++)
        store_row(job, m0 + r, g, facc[r]);
}

/* 8 E8M0 bytes as the floats 2^(e - 128) (kvg_mxfp4_scale): e >= 2 the normal float
 * of exponent e - 128, e = 1, 0 the subnormals 2^-127, 2^-128. */
A2INL __m256 mx_scales(const unsigned char *p)
{
    const __m256i one = _mm256_set1_epi32(1);
    __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, one), 23);
    __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(sub, normal, _mm256_cmpgt_epi32(e, one)));
}

/* tile() for MXFP4_R16 (gemm_int8.h's definition): Q4_0's nibbles, each code looked up
 * (vpshufb) as k + 12, the offset removed as -12 * sx; four products of at most
 * 24 * 127 summed in int16 stay below 2^15. */
A2INL void tile_mx(const kvg_gemm_job *job, int m0, int g, const int MR)
{
    const int K = job->K, nb = K / 32;
    const unsigned char *grp = (const unsigned char *)job->w + (size_t)g * kvg_int8_group_bytes(job->dt, K);
    const __m256i m0f = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(KVG_MX_LUT));
    tile_rows rows;
    __m256 facc[2][2];

    rows_begin(job, m0, MR, &rows, facc);
    for (int b = 0; b < nb; b++) {
        const unsigned char *q = grp + kvg_int8_quants_at(KVG_DT_MXFP4_R16, b);
        const unsigned char *sp = grp + kvg_int8_scales_at(KVG_DT_MXFP4_R16, b);
        __m256i iacc[2][2];
        A2UNROLL for (int r = 0; r < MR; r++)
            iacc[r][0] = iacc[r][1] = _mm256_set1_epi32(-12 * rows.sx[r][b]);
        A2UNROLL for (int t = 0; t < 4; t++)
            A2UNROLL for (int h = 0; h < 2; h++) {
                __m256i raw = _mm256_load_si256((const __m256i *)(q + 64 * t + 32 * h));
                __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(raw, m0f));
                __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m0f));
                A2UNROLL for (int r = 0; r < MR; r++) {
                    __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(rows.xr[r] + 32 * b + 4 * t)),
                                                 _mm256_maddubs_epi16(hi, bcast4(rows.xr[r] + 32 * b + 16 + 4 * t)));
                    iacc[r][h] = _mm256_add_epi32(iacc[r][h], _mm256_madd_epi16(p, ones));
                }
            }
        A2UNROLL for (int h = 0; h < 2; h++) {
            __m256 dw = mx_scales(sp + 8 * h);
            A2UNROLL for (int r = 0; r < MR; r++)
                facc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(rows.dx[r][b])),
                                             _mm256_cvtepi32_ps(iacc[r][h]), facc[r][h]);
        }
    }
    A2UNROLL for (int r = 0; r < MR; r++)
        store_row(job, m0 + r, g, facc[r]);
}

/* tile() for Q4_K_R16 (gemm_int8.h's definition): per sub-block of 32, the nibbles'
 * integer sums, then its three float steps, ds and dm made from the scale bytes. */
A2INL void tile_q4k(const kvg_gemm_job *job, int m0, int g, const int MR)
{
    const int K = job->K, nb = K / 32;
    const unsigned char *grp = (const unsigned char *)job->w + (size_t)g * kvg_int8_group_bytes(job->dt, K);
    const __m256i m0f = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    tile_rows rows;
    __m256 facc[2][2];

    rows_begin(job, m0, MR, &rows, facc);
    for (int b = 0; b < nb; b++) {
        const unsigned char *sp = grp + (size_t)(b / 8) * KVG_Q4K_SB_BYTES;
        const int sub = b % 8;
        const unsigned char *q = sp + KVG_Q4K_Q + 512 * (sub / 2);
        __m256i iacc[2][2];
        A2UNROLL for (int r = 0; r < MR; r++)
            iacc[r][0] = iacc[r][1] = _mm256_setzero_si256();
        A2UNROLL for (int t = 0; t < 8; t++)
            A2UNROLL for (int h = 0; h < 2; h++) {
                __m256i raw = _mm256_load_si256((const __m256i *)(q + 64 * t + 32 * h));
                __m256i w = sub & 1 ? _mm256_and_si256(_mm256_srli_epi16(raw, 4), m0f) : _mm256_and_si256(raw, m0f);
                A2UNROLL for (int r = 0; r < MR; r++)
                    iacc[r][h] = _mm256_add_epi32(
                        iacc[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(w, bcast4(rows.xr[r] + 32 * b + 4 * t)), ones));
            }
        A2UNROLL for (int h = 0; h < 2; h++) {
            __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sp + KVG_Q4K_SC + 16 * sub + 8 * h))));
            __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sp + KVG_Q4K_M + 16 * sub + 8 * h))));
            __m256 ds = _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)(sp + KVG_Q4K_D + 16 * h))), sc);
            __m256 dm = _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)(sp + KVG_Q4K_DMIN + 16 * h))), mn);
            A2UNROLL for (int r = 0; r < MR; r++) {
                __m256 u = _mm256_mul_ps(dm, _mm256_set1_ps((float)rows.sx[r][b]));
                __m256 st = _mm256_fmsub_ps(ds, _mm256_cvtepi32_ps(iacc[r][h]), u);
                facc[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(rows.dx[r][b]), st, facc[r][h]);
            }
        }
    }
    A2UNROLL for (int r = 0; r < MR; r++)
        store_row(job, m0 + r, g, facc[r]);
}

/* tile() for Q6_K_R16 (gemm_int8.h's definition): per sub-block of 16, the 6-bit
 * values joined from their low and high bits (every shift a constant), their integer
 * sums, then its step. vpmaddubsw's pairs stay below 2 * 63 * 127 < 2^15. */
A2INL void tile_q6k(const kvg_gemm_job *job, int m0, int g, const int MR)
{
    const int K = job->K, nb = K / 32;
    const unsigned char *grp = (const unsigned char *)job->w + (size_t)g * kvg_int8_group_bytes(job->dt, K);
    const __m256i m0f = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
    tile_rows rows;
    __m256 facc[2][2];

    rows_begin(job, m0, MR, &rows, facc);
    for (int b = 0; b < nb; b++) {
        const int j = b % 8;
        const unsigned char *sp = grp + (size_t)(b / 8) * KVG_Q6K_SB_BYTES, *q = sp + KVG_Q6K_Q + 384 * j;
        A2UNROLL for (int sh = 0; sh < 2; sh++) {
            __m256i iacc[2][2];
            A2UNROLL for (int r = 0; r < MR; r++)
                iacc[r][0] = iacc[r][1] = _mm256_set1_epi32(-32 * rows.sx[r][nb + 2 * b + sh]);
            A2UNROLL for (int t = 0; t < 4; t++)
                A2UNROLL for (int ch = 0; ch < 2; ch++) {
                    __m256i lo = _mm256_load_si256((const __m256i *)(q + 64 * t + 32 * ch));
                    __m256i hb = _mm256_load_si256((const __m256i *)(q + 256 + 64 * sh + 32 * ch));
                    __m256i nib = sh ? _mm256_and_si256(_mm256_srli_epi16(lo, 4), m0f) : _mm256_and_si256(lo, m0f);
                    __m256i h2 = t == 3 ? _mm256_srli_epi16(hb, 2) : t == 2 ? hb : _mm256_slli_epi16(hb, 4 - 2 * t);
                    __m256i w = _mm256_or_si256(nib, _mm256_and_si256(h2, m30));
                    A2UNROLL for (int r = 0; r < MR; r++)
                        iacc[r][ch] = _mm256_add_epi32(
                            iacc[r][ch],
                            _mm256_madd_epi16(_mm256_maddubs_epi16(w, bcast4(rows.xr[r] + 32 * b + 16 * sh + 4 * t)), ones));
                }
            A2UNROLL for (int ch = 0; ch < 2; ch++) {
                __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sp + KVG_Q6K_SC + 16 * (2 * j + sh) + 8 * ch))));
                __m256 d = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(sp + KVG_Q6K_D + 16 * ch)));
                A2UNROLL for (int r = 0; r < MR; r++)
                    facc[r][ch] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(rows.dx[r][b])),
                                                  _mm256_mul_ps(_mm256_cvtepi32_ps(iacc[r][ch]), sc), facc[r][ch]);
            }
        }
    }
    A2UNROLL for (int r = 0; r < MR; r++)
        store_row(job, m0 + r, g, facc[r]);
}

/* One function per layout and row count, so that each is compiled (unrolled, its
 * accumulators in registers) on its own: inlined into one function the four ran
 * Q4_K's decode at a third of its speed. */
#define A2_TILE_FNS(MR)                                                                             \
    A2TGT __attribute__((noinline)) static void q8_##MR(const kvg_gemm_job *j, int m0, int g)       \
    {                                                                                               \
        tile(j, m0, g, 1, MR);                                                                      \
    }                                                                                               \
    A2TGT __attribute__((noinline)) static void q4_##MR(const kvg_gemm_job *j, int m0, int g)       \
    {                                                                                               \
        tile(j, m0, g, 0, MR);                                                                      \
    }                                                                                               \
    A2TGT __attribute__((noinline)) static void q4k_##MR(const kvg_gemm_job *j, int m0, int g)      \
    {                                                                                               \
        tile_q4k(j, m0, g, MR);                                                                     \
    }                                                                                               \
    A2TGT __attribute__((noinline)) static void q6k_##MR(const kvg_gemm_job *j, int m0, int g)      \
    {                                                                                               \
        tile_q6k(j, m0, g, MR);                                                                     \
    }                                                                                               \
    A2TGT __attribute__((noinline)) static void mx_##MR(const kvg_gemm_job *j, int m0, int g)       \
    {                                                                                               \
        tile_mx(j, m0, g, MR);                                                                      \
    }                                                                                               \
    static void tile##MR(const kvg_gemm_job *j, int m0, int g)                                      \
    {                                                                                               \
        switch (j->dt) {                                                                            \
        case KVG_DT_Q8_0_R16: q8_##MR(j, m0, g); break;                                             \
        case KVG_DT_Q4_0_R16: q4_##MR(j, m0, g); break;                                             \
        case KVG_DT_Q4_K_R16: q4k_##MR(j, m0, g); break;                                            \
        case KVG_DT_MXFP4_R16: mx_##MR(j, m0, g); break;                                            \
        default: q6k_##MR(j, m0, g); break;                                                         \
        }                                                                                           \
    }
A2_TILE_FNS(1)
A2_TILE_FNS(2)

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

#endif
