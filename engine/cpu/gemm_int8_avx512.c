/* The int8 products on AVX-512 VNNI (gemm_int8.h): X quantized 32 at a time, and
 * the kernels over the repacked layouts, vpdpbusd into one int32 per output column per
 * block, then the block's two float operations. gemm.c runs these only where the CPU
 * has AVX512_VNNI (else the AVX2 kernel). */
#include <float.h>
#include <string.h>

#include "cpu/gemm_int8.h"
#include "cpu/gemm_kernels.h"

/* Off x86 this file defines nothing: gemm.c has only the generic level there. */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

/* t/unit/gemm_int8_avx512_emu.c compiles this file against SIMDe's emulation of the
 * intrinsics, by overriding KVG_I8_AVX512_TARGET. */
#ifndef KVG_I8_AVX512_TARGET
#define KVG_I8_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
/* The quantizer of X runs without VNNI too. */
#define KVG_I8_AVX512_QTARGET "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
#else
#define KVG_I8_AVX512_QTARGET KVG_I8_AVX512_TARGET
#endif
#define I8TGT __attribute__((target(KVG_I8_AVX512_TARGET)))
#define I8INL static inline __attribute__((target(KVG_I8_AVX512_TARGET), always_inline))
#define I8UNROLL _Pragma("GCC unroll 16")
/* No software prefetch: each group's quants are one sequential stream, which the
 * hardware prefetchers follow; measured on AMD EPYC (Zen 4), prefetching 1 KiB ahead
 * made one-row decode 1.3x slower (Q8_0) and 1.4x (Q4_0). */

__attribute__((target(KVG_I8_AVX512_QTARGET))) void kvg_int8_quantize_x_avx512(const float *x, int K, int r0, int r1, unsigned char *xq)
{
    const __m512 big = _mm512_set1_ps(FLT_MAX);

    for (int r = r0; r < r1; r++) {
        const float *xr = x + (size_t)r * (size_t)K;
        kvg_int8_xrow row = kvg_int8_x_row(xq, K, r);
        for (int b = 0; b < K / 32; b++) {
            __m512 v0 = _mm512_loadu_ps(xr + 32 * b), v1 = _mm512_loadu_ps(xr + 32 * b + 16);
            __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
            /* Not <= FLT_MAX: infinite or NaN (unordered compares true). */
            __mmask16 bad = _mm512_cmp_ps_mask(a0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(a1, big, _CMP_NLE_UQ);
            float d, id;
            if (bad) {
                kvg_int8_x_bad_block(&row, b);
                continue;
            }
            d = kvg_int8_x_scale(_mm512_reduce_max_ps(_mm512_max_ps(a0, a1)), &id);
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
            __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
            _mm_storeu_si128((__m128i *)(row.q + 32 * b), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(row.q + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
            kvg_int8_x_block(&row, b, d, _mm512_reduce_add_epi32(q0), _mm512_reduce_add_epi32(q1));
        }
    }
}

I8INL __m512i bcast4(const unsigned char *p)
{
    return _mm512_set1_epi32(kvg_int8_load4(p));
}

/* A tile's pointers: its MR quantized X rows (their int8 values, block scales and
 * sums) and its NR groups of W. */
typedef struct tile_ptrs {
    const unsigned char *xr[4], *grp[8];
    const float *dx[4];
    const int32_t *sx[4];
} tile_ptrs;

/* A tile's start: its pointers (rows from m0; groups g0, g0 + gs, ..., gb bytes each)
 * and its accumulators at zero. */
I8INL void tile_begin(const kvg_gemm_job *job, int m0, int g0, int gs, size_t gb, const int MR, const int NR,
                      tile_ptrs *p, __m512 facc[4][8])
{
    const int K = job->K;
    const size_t rb = kvg_int8_x_row_bytes(K);
    I8UNROLL for (int r = 0; r < MR; r++) {
        p->xr[r] = job->xq + (size_t)(m0 + r) * rb;
        p->dx[r] = (const float *)(p->xr[r] + K);
        p->sx[r] = (const int32_t *)(p->xr[r] + K) + K / 32;
    }
    I8UNROLL for (int c = 0; c < NR; c++) {
        p->grp[c] = (const unsigned char *)job->w + (size_t)(g0 + c * gs) * gb;
        I8UNROLL for (int r = 0; r < MR; r++)
            facc[r][c] = _mm512_setzero_ps();
    }
}

/* A tile's outputs (+ bias): groups g0, g0 + gs, ...; only the matrix's last group
 * is partial. */
I8INL void store_tile(const kvg_gemm_job *job, int m0, int g0, int gs, __m512 facc[4][8], const int MR,
                      const int NR)
{
    I8UNROLL for (int c = 0; c < NR; c++) {
        int n = (g0 + c * gs) * 16, left = job->N - n;
        __mmask16 mk = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512 bias = job->bias ? _mm512_maskz_loadu_ps(mk, job->bias + n) : _mm512_setzero_ps();
        I8UNROLL for (int r = 0; r < MR; r++) {
            __m512 v = job->bias ? _mm512_add_ps(facc[r][c], bias) : facc[r][c];
            _mm512_mask_storeu_ps(job->y + (size_t)(m0 + r) * (size_t)job->N + (size_t)n, mk, v);
        }
    }
}

/* MR rows of quantized X (from row m0) x NR groups of 16 columns (groups g0, g0 + gs,
 * g0 + 2 gs, ...), over all of K. */
I8INL void tile(const kvg_gemm_job *job, int m0, int g0, int gs, int q8, const int MR, const int NR)
{
    const int K = job->K, nb = K / 32;
    const size_t gb = kvg_int8_group_bytes(job->dt, K);
    const kvg_dtype pdt = q8 ? KVG_DT_Q8_0_R16 : KVG_DT_Q4_0_R16;   /* a constant, inlined */
    const int off = q8 ? 128 : 8;
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    tile_ptrs pt;
    __m512 facc[4][8];

    tile_begin(job, m0, g0, gs, gb, MR, NR, &pt, facc);
    for (int b = 0; b < nb; b++) {
        const size_t soff = kvg_int8_scales_at(pdt, b), qoff = kvg_int8_quants_at(pdt, b);
        __m512i iacc[4][8];
        I8UNROLL for (int r = 0; r < MR; r++) {
            /* Start from -off * sx: the stored bytes are wq + off. */
            __m512i init = _mm512_set1_epi32(-off * pt.sx[r][b]);
            I8UNROLL for (int c = 0; c < NR; c++)
                iacc[r][c] = init;
        }
        if (q8) {
            I8UNROLL for (int t = 0; t < 8; t++)
                I8UNROLL for (int c = 0; c < NR; c++) {
                    __m512i w = _mm512_load_si512((const void *)(pt.grp[c] + qoff + 64 * t));
                    I8UNROLL for (int r = 0; r < MR; r++)
                        iacc[r][c] = _mm512_dpbusd_epi32(iacc[r][c], w, bcast4(pt.xr[r] + 32 * b + 4 * t));
                }
        } else {
            I8UNROLL for (int t = 0; t < 4; t++)
                I8UNROLL for (int c = 0; c < NR; c++) {
                    __m512i raw = _mm512_load_si512((const void *)(pt.grp[c] + qoff + 64 * t));
                    __m512i lo = _mm512_and_si512(raw, m0f);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m0f);
                    I8UNROLL for (int r = 0; r < MR; r++) {
                        iacc[r][c] = _mm512_dpbusd_epi32(iacc[r][c], lo, bcast4(pt.xr[r] + 32 * b + 4 * t));
                        iacc[r][c] = _mm512_dpbusd_epi32(iacc[r][c], hi, bcast4(pt.xr[r] + 32 * b + 16 + 4 * t));
                    }
                }
        }
        I8UNROLL for (int c = 0; c < NR; c++) {
            __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pt.grp[c] + soff)));
            I8UNROLL for (int r = 0; r < MR; r++)
                facc[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(pt.dx[r][b])),
                                             _mm512_cvtepi32_ps(iacc[r][c]), facc[r][c]);
        }
    }
    store_tile(job, m0, g0, gs, facc, MR, NR);
}

/* 16 E8M0 bytes as the floats 2^(e - 128) (kvg_mxfp4_scale): e >= 2 the normal float
 * of exponent e - 128, e = 1, 0 the subnormals 2^-127, 2^-128. */
I8INL __m512 mx_scales(const unsigned char *p)
{
    const __m512i one = _mm512_set1_epi32(1);
    __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, one), 23);
    __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(e, one), sub, normal));
}

/* tile() for MXFP4_R16: Q4_0's nibbles, each code looked up (vpshufb) as k + 12, the
 * offset removed as -12 * sx; the block's scale from its E8M0 bytes. */
I8INL void tile_mx(const kvg_gemm_job *job, int m0, int g0, int gs, const int MR, const int NR)
{
    const int K = job->K, nb = K / 32;
    const size_t gb = kvg_int8_group_bytes(KVG_DT_MXFP4_R16, K);
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(KVG_MX_LUT));
    tile_ptrs pt;
    __m512 facc[4][8];

    tile_begin(job, m0, g0, gs, gb, MR, NR, &pt, facc);
    for (int b = 0; b < nb; b++) {
        const size_t soff = kvg_int8_scales_at(KVG_DT_MXFP4_R16, b), qoff = kvg_int8_quants_at(KVG_DT_MXFP4_R16, b);
        __m512i iacc[4][8];
        I8UNROLL for (int r = 0; r < MR; r++) {
            __m512i init = _mm512_set1_epi32(-12 * pt.sx[r][b]);
            I8UNROLL for (int c = 0; c < NR; c++)
                iacc[r][c] = init;
        }
        I8UNROLL for (int t = 0; t < 4; t++)
            I8UNROLL for (int c = 0; c < NR; c++) {
                __m512i raw = _mm512_load_si512((const void *)(pt.grp[c] + qoff + 64 * t));
                __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(raw, m0f));
                __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m0f));
                I8UNROLL for (int r = 0; r < MR; r++) {
                    iacc[r][c] = _mm512_dpbusd_epi32(iacc[r][c], lo, bcast4(pt.xr[r] + 32 * b + 4 * t));
                    iacc[r][c] = _mm512_dpbusd_epi32(iacc[r][c], hi, bcast4(pt.xr[r] + 32 * b + 16 + 4 * t));
                }
            }
        I8UNROLL for (int c = 0; c < NR; c++) {
            __m512 dw = mx_scales(pt.grp[c] + soff);
            I8UNROLL for (int r = 0; r < MR; r++)
                facc[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(pt.dx[r][b])),
                                             _mm512_cvtepi32_ps(iacc[r][c]), facc[r][c]);
        }
    }
    store_tile(job, m0, g0, gs, facc, MR, NR);
}

/* tile() for Q4_K_R16: per sub-block of 32, the nibbles' integer sums (vpdpbusd, the
 * nibbles unsigned), then the definition's three float steps; ds and dm are made per
 * sub-block from the unpacked scale bytes (W only, shared by the MR rows). */
I8INL void tile_q4k(const kvg_gemm_job *job, int m0, int g0, int gs, const int MR, const int NR)
{
    const int K = job->K, nb = K / 32;
    const size_t gb = kvg_int8_group_bytes(KVG_DT_Q4_K_R16, K);
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    tile_ptrs pt;
    __m512 facc[4][8];

    tile_begin(job, m0, g0, gs, gb, MR, NR, &pt, facc);
    /* Sub-blocks in pairs, the low nibbles then the high ones of the same quants (the
     * second pass reads them from L1): the nibble's side stays a constant. */
    for (int b2 = 0; b2 < nb; b2 += 2)
        I8UNROLL for (int h = 0; h < 2; h++) {
            const int b = b2 + h, sub = b % 8;
            const size_t sbo = (size_t)(b / 8) * KVG_Q4K_SB_BYTES;
            const size_t qoff = sbo + KVG_Q4K_Q + 512 * (size_t)(sub / 2);
            __m512i iacc[4][8];
            I8UNROLL for (int r = 0; r < MR; r++)
                I8UNROLL for (int c = 0; c < NR; c++)
                    iacc[r][c] = _mm512_setzero_si512();
            I8UNROLL for (int t = 0; t < 8; t++)
                I8UNROLL for (int c = 0; c < NR; c++) {
                    __m512i raw = _mm512_load_si512((const void *)(pt.grp[c] + qoff + 64 * t));
                    __m512i w = h ? _mm512_and_si512(_mm512_srli_epi16(raw, 4), m0f) : _mm512_and_si512(raw, m0f);
                    I8UNROLL for (int r = 0; r < MR; r++)
                        iacc[r][c] = _mm512_dpbusd_epi32(iacc[r][c], w, bcast4(pt.xr[r] + 32 * b + 4 * t));
                }
            I8UNROLL for (int c = 0; c < NR; c++) {
                const unsigned char *sp = pt.grp[c] + sbo;
                __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(sp + KVG_Q4K_SC + 16 * sub))));
                __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(sp + KVG_Q4K_M + 16 * sub))));
                __m512 ds = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sp + KVG_Q4K_D))), sc);
                __m512 dm = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sp + KVG_Q4K_DMIN))), mn);
                I8UNROLL for (int r = 0; r < MR; r++) {
                    __m512 u = _mm512_mul_ps(dm, _mm512_set1_ps((float)pt.sx[r][b]));
                    __m512 st = _mm512_fmsub_ps(ds, _mm512_cvtepi32_ps(iacc[r][c]), u);
                    facc[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(pt.dx[r][b]), st, facc[r][c]);
                }
            }
        }
    store_tile(job, m0, g0, gs, facc, MR, NR);
}

/* tile() for Q6_K_R16: per sub-block of 16, the 6-bit values' integer sums against X
 * (the low 4 bits and the high 2 joined in registers, every shift a constant), then
 * the definition's step. */
I8INL void tile_q6k(const kvg_gemm_job *job, int m0, int g0, int gs, const int MR, const int NR)
{
    const int K = job->K, nb = K / 32;
    const size_t gb = kvg_int8_group_bytes(KVG_DT_Q6_K_R16, K);
    const __m512i m0f = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    tile_ptrs pt;
    __m512 facc[4][8];

    tile_begin(job, m0, g0, gs, gb, MR, NR, &pt, facc);
    for (int b = 0; b < nb; b++) {
        const int j = b % 8;
        const size_t sbo = (size_t)(b / 8) * KVG_Q6K_SB_BYTES, qo = sbo + KVG_Q6K_Q + 384 * (size_t)j;
        I8UNROLL for (int h = 0; h < 2; h++) {
            __m512i iacc[4][8];
            I8UNROLL for (int r = 0; r < MR; r++) {
                /* Start from -32 * sxh: the stored values are wq, the weights wq - 32. */
                __m512i init = _mm512_set1_epi32(-32 * pt.sx[r][nb + 2 * b + h]);
                I8UNROLL for (int c = 0; c < NR; c++)
                    iacc[r][c] = init;
            }
            I8UNROLL for (int t = 0; t < 4; t++)
                I8UNROLL for (int c = 0; c < NR; c++) {
                    __m512i lo = _mm512_load_si512((const void *)(pt.grp[c] + qo + 64 * t));
                    __m512i hb = _mm512_load_si512((const void *)(pt.grp[c] + qo + 256 + 64 * h));
                    __m512i nib = h ? _mm512_and_si512(_mm512_srli_epi16(lo, 4), m0f) : _mm512_and_si512(lo, m0f);
                    /* Bits 2t, 2t + 1 of each byte to bits 4, 5 (a 16-bit shift: the mask
                     * drops what crossed from the neighbouring byte). */
                    __m512i h2 = t == 3 ? _mm512_srli_epi16(hb, 2) : t == 2 ? hb : _mm512_slli_epi16(hb, 4 - 2 * t);
                    __m512i w = _mm512_or_si512(nib, _mm512_and_si512(h2, m30));
                    I8UNROLL for (int r = 0; r < MR; r++)
                        iacc[r][c] = _mm512_dpbusd_epi32(iacc[r][c], w, bcast4(pt.xr[r] + 32 * b + 16 * h + 4 * t));
                }
            I8UNROLL for (int c = 0; c < NR; c++) {
                const unsigned char *sp = pt.grp[c] + sbo;
                __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(sp + KVG_Q6K_SC + 16 * (2 * j + h)))));
                __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sp + KVG_Q6K_D)));
                I8UNROLL for (int r = 0; r < MR; r++)
                    facc[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(pt.dx[r][b])),
                                                 _mm512_mul_ps(_mm512_cvtepi32_ps(iacc[r][c]), sc), facc[r][c]);
            }
        }
    }
    store_tile(job, m0, g0, gs, facc, MR, NR);
}

typedef void (*tile_fn)(const kvg_gemm_job *job, int m0, int g0, int gs);

/* MR x NR: one X row (batch-1 decode) takes 2 groups at a time, i.e. 2 streams of W
 * per thread. Measured on AMD EPYC (Zen 4), 1 thread, decode GEMVs of the 110M shapes
 * (GB/s, NR = 1 / 2 / 3 / 4 / 8): Q8_0 21 / 24-26 / 23 / 26 / 21, Q4_0 18 / 25-27 /
 * 22 / 25 / 23, Q4_K 22 / 23 / 19 / 14 / 11; in cache every NR from 2 up runs alike. */
#define I8_TILES(F) F(1, 2) F(2, 6) F(3, 4) F(4, 3)
/* One function per layout and tile shape, so that each is compiled (unrolled, its
 * accumulators in registers) on its own. */
#define I8_TILE_FN(MR, NR)                                                                          \
    I8TGT __attribute__((noinline)) static void q8_##MR##x##NR(const kvg_gemm_job *j, int m0, int g0, int gs) \
    {                                                                                               \
        tile(j, m0, g0, gs, 1, MR, NR);                                                             \
    }                                                                                               \
    I8TGT __attribute__((noinline)) static void q4_##MR##x##NR(const kvg_gemm_job *j, int m0, int g0, int gs) \
    {                                                                                               \
        tile(j, m0, g0, gs, 0, MR, NR);                                                             \
    }                                                                                               \
    I8TGT __attribute__((noinline)) static void q4k_##MR##x##NR(const kvg_gemm_job *j, int m0, int g0, int gs) \
    {                                                                                               \
        tile_q4k(j, m0, g0, gs, MR, NR);                                                            \
    }                                                                                               \
    I8TGT __attribute__((noinline)) static void q6k_##MR##x##NR(const kvg_gemm_job *j, int m0, int g0, int gs) \
    {                                                                                               \
        tile_q6k(j, m0, g0, gs, MR, NR);                                                            \
    }                                                                                               \
    I8TGT __attribute__((noinline)) static void mx_##MR##x##NR(const kvg_gemm_job *j, int m0, int g0, int gs) \
    {                                                                                               \
        tile_mx(j, m0, g0, gs, MR, NR);                                                             \
    }                                                                                               \
    static void tile_##MR##x##NR(const kvg_gemm_job *j, int m0, int g0, int gs)                     \
    {                                                                                               \
        switch (j->dt) {                                                                            \
        case KVG_DT_Q8_0_R16: q8_##MR##x##NR(j, m0, g0, gs); break;                                 \
        case KVG_DT_Q4_0_R16: q4_##MR##x##NR(j, m0, g0, gs); break;                                 \
        case KVG_DT_Q4_K_R16: q4k_##MR##x##NR(j, m0, g0, gs); break;                                \
        case KVG_DT_MXFP4_R16: mx_##MR##x##NR(j, m0, g0, gs); break;                                \
        default: q6k_##MR##x##NR(j, m0, g0, gs); break;                                             \
        }                                                                                           \
    }
#define I8_TILE_PAIR(MR, NR) I8_TILE_FN(MR, NR) I8_TILE_FN(MR, 1)
I8_TILES(I8_TILE_PAIR)

#define I8_TILE_ROW(MR, NR) [MR] = { tile_##MR##x1, tile_##MR##x##NR, NR },
static const struct {
    tile_fn one, full;
    int nr;
} tiles[5] = { I8_TILES(I8_TILE_ROW) };

void kvg_int8_kernel_avx512(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s)
{
    int g0 = n0 / 16, g1 = (n1 + 15) / 16;

    if (!kvg_int8_dt_packed(job->dt)) {
        kvg_int8_kernel_generic(job, n0, n1, s);
        return;
    }
    /* Column tiles outside, all rows inside: a tile's W (NR groups, a few tens of KiB)
     * stays in L1/L2 while every row passes over it. kvg_gemm hands out whole groups,
     * so n0 is a multiple of 16 and only the last group is partial. The NR groups of
     * a tile come from NR equal slices of [g0, g1), not NR neighbours: each group is
     * then one front-to-back stream far from the others (neighbouring groups read in
     * lockstep share pages, and the hardware prefetchers lose them; gemm_avx512.c's
     * panel). The groups left over (fewer than NR) run last, one at a time. Which
     * groups share a tile changes no output bit. */
    int nr = job->M < 4 ? tiles[job->M].nr : tiles[4].nr;
    int per = (g1 - g0) / nr, rest = (g1 - g0) - per * nr;

    for (int i = 0; i < per; i++)
        for (int m0 = 0; m0 < job->M;) {
            int mr = job->M - m0 < 4 ? job->M - m0 : 4;
            /* The tile's width is that of the widest row block, so a narrower row
             * block (the last) runs the same groups, NR at once or one at a time. */
            if (tiles[mr].nr == nr) {
                tiles[mr].full(job, m0, g0 + i, per);
            } else {
                for (int c = 0; c < nr; c++)
                    tiles[mr].one(job, m0, g0 + i + c * per, 1);
            }
            m0 += mr;
        }
    for (int g = g0 + per * nr; g < g0 + per * nr + rest; g++)
        for (int m0 = 0; m0 < job->M;) {
            int mr = job->M - m0 < 4 ? job->M - m0 : 4;
            tiles[mr].one(job, m0, g, 1);
            m0 += mr;
        }
}

#endif
