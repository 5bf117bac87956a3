/* The AVX-512 VNNI int8 kernels on CPUs without AVX-512: engine/cpu/gemm_int8_avx512.c
 * is compiled into this test against SIMDe (Debian's libsimde-dev), which implements
 * the AVX-512 intrinsics (vpdpbusd, vpshufb on 512 bits, ...) with AVX2, as
 * gemm_avx512_emu.c does for the float kernel. X quantized by the emulated quantizer
 * must be the generic quantizer's bytes, and the emulated kernel over every repacked
 * layout (Q8_0, Q4_0, Q4_K, Q6_K, MXFP4) the generic kernel's outputs bit for bit, at
 * several M, N (a partial last group) and column splits (as threads take them). So
 * the kernel that machines with AVX-512 run is checked everywhere. Skipped when SIMDe
 * or AVX2/FMA/F16C is missing. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    defined(__has_include) && __has_include(<simde/x86/avx512.h>)
#define HAVE_EMULATION 1

#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <stdio.h>

/* Masked, zeroing loads read only the selected elements (as the hardware does). */
static inline simde__m512 emu_mm512_maskz_loadu_ps(uint16_t k, const void *p)
{
    float v[16];
    for (int i = 0; i < 16; i++)
        v[i] = (k >> i) & 1 ? ((const float *)p)[i] : 0.0f;
    return simde_mm512_loadu_ps(v);
}

/* Masked stores write only the selected elements. */
static inline void emu_mm512_mask_storeu_ps(void *p, uint16_t k, simde__m512 a)
{
    float v[16];
    simde_mm512_storeu_ps(v, a);
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1)
            ((float *)p)[i] = v[i];
}

/* 16 halves to floats with the F16C instruction, 8 at a time. */
static inline simde__m512 emu_mm512_cvtph_ps(__m256i h)
{
    float v[16];
    _mm256_storeu_ps(v, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
    _mm256_storeu_ps(v + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
    return simde_mm512_loadu_ps(v);
}

/* SIMDe 0.7.4 lacks these too; each by its documented semantics, element by element
 * (conversions round to nearest even, as the instructions under the default MXCSR). */
static inline simde__m512 emu_mm512_cvtepi32_ps(simde__m512i a)
{
    int32_t in[16];
    float out[16];
    simde_mm512_storeu_si512(in, a);
    for (int i = 0; i < 16; i++)
        out[i] = (float)in[i];
    return simde_mm512_loadu_ps(out);
}

static inline simde__m512i emu_mm512_cvtps_epi32(simde__m512 a)
{
    float in[16];
    int32_t out[16];
    simde_mm512_storeu_ps(in, a);
    _mm256_storeu_si256((__m256i *)out, _mm256_cvtps_epi32(_mm256_loadu_ps(in)));
    _mm256_storeu_si256((__m256i *)(out + 8), _mm256_cvtps_epi32(_mm256_loadu_ps(in + 8)));
    return simde_mm512_loadu_si512(out);
}

static inline __m128i emu_mm512_cvtepi32_epi8(simde__m512i a)
{
    int32_t in[16];
    int8_t out[16];
    simde_mm512_storeu_si512(in, a);
    for (int i = 0; i < 16; i++)
        out[i] = (int8_t)in[i];                    /* truncation, as vpmovdb */
    return _mm_loadu_si128((const __m128i *)out);
}

static inline simde__m512i emu_mm512_cvtepi8_epi32(__m128i a)
{
    int8_t in[16];
    int32_t out[16];
    _mm_storeu_si128((__m128i *)in, a);
    for (int i = 0; i < 16; i++)
        out[i] = in[i];
    return simde_mm512_loadu_si512(out);
}

static inline simde__m512i emu_mm512_cvtepu8_epi32(__m128i a)
{
    uint8_t in[16];
    int32_t out[16];
    _mm_storeu_si128((__m128i *)in, a);
    for (int i = 0; i < 16; i++)
        out[i] = in[i];
    return simde_mm512_loadu_si512(out);
}

static inline int32_t emu_mm512_reduce_add_epi32(simde__m512i a)
{
    int32_t in[16];
    uint32_t s = 0;
    simde_mm512_storeu_si512(in, a);
    for (int i = 0; i < 16; i++)
        s += (uint32_t)in[i];
    return (int32_t)s;
}

static inline float emu_mm512_reduce_max_ps(simde__m512 a)
{
    float in[16], m;
    simde_mm512_storeu_ps(in, a);
    m = in[0];
    for (int i = 1; i < 16; i++)
        m = in[i] > m ? in[i] : m;
    return m;
}

#define _mm512_maskz_loadu_ps emu_mm512_maskz_loadu_ps
#define _mm512_mask_storeu_ps emu_mm512_mask_storeu_ps
#define _mm512_cvtph_ps emu_mm512_cvtph_ps
#define _mm512_cvtepi32_ps emu_mm512_cvtepi32_ps
#define _mm512_cvtps_epi32 emu_mm512_cvtps_epi32
#define _mm512_cvtepi32_epi8 emu_mm512_cvtepi32_epi8
#define _mm512_cvtepi8_epi32 emu_mm512_cvtepi8_epi32
#define _mm512_cvtepu8_epi32 emu_mm512_cvtepu8_epi32
#define _mm512_reduce_add_epi32 emu_mm512_reduce_add_epi32
#define _mm512_reduce_max_ps emu_mm512_reduce_max_ps

#include "cpu/gemm_int8.h"
#include "cpu/gemm_kernels.h"
#define KVG_I8_AVX512_TARGET "avx2,fma,f16c"
#define kvg_int8_kernel_avx512 kvg_int8_kernel_avx512_emulated
#define kvg_int8_quantize_x_avx512 kvg_int8_quantize_x_avx512_emulated
void kvg_int8_kernel_avx512_emulated(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s);
void kvg_int8_quantize_x_avx512_emulated(const float *x, int K, int r0, int r1, unsigned char *xq);
#include "cpu/gemm_int8_avx512.c"
#undef kvg_int8_kernel_avx512
#undef kvg_int8_quantize_x_avx512
#pragma GCC pop_options

#else
#define HAVE_EMULATION 0
#endif
#include "cpu/gemm.h"
#include "cpu/gemm_testing.h"
#include "quant.h"
#include "quant_testing.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static float rnd_f(void)
{
    return (float)((double)(rnd32() & 0xffffff) / 8388608.0 - 1.0);
}

#if HAVE_EMULATION
/* memcmp, except that any NaN equals any NaN. */
static int same_floats(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (!(isnan(a[i]) && isnan(b[i])) && memcmp(a + i, b + i, sizeof(float)) != 0) {
            diag("%s: first difference at %zu: %a vs %a", what, i, (double)a[i], (double)b[i]);
            return 0;
        }
    return 1;
}

/* One matrix of type t, [N][K], repacked; M rows of X: the emulated quantizer's bytes
 * against the generic one's, and the emulated kernel over `parts` column ranges (whole
 * groups) against the generic kernel. */
static int compare(kvg_qtype t, int M, int N, int K, int with_bias, int parts)
{
    kvg_dtype dt = (kvg_dtype)(KVG_DT_Q8_0 + (int)t);
    size_t rb = kvg_dtype_row_bytes(dt, K), xb = kvg_int8_x_row_bytes(K) * (size_t)M;
    float *x = malloc((size_t)M * K * sizeof *x), *row = malloc((size_t)K * sizeof *row);
    float *bias = malloc((size_t)N * sizeof *bias);
    float *y0 = malloc((size_t)M * N * sizeof *y0), *y1 = malloc((size_t)M * N * sizeof *y1);
    unsigned char *wq = malloc((size_t)N * rb), *xq0 = malloc(xb), *xq1 = malloc(xb);
    kvg_tensor w = { wq, dt, N, K }, pw;
    int same;

    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++)
            row[k] = rnd_f() * (n % 3 ? 1.0f : 1e-3f);
        kvg_quant_row(t, row, wq + (size_t)n * rb, K);
        /* MXFP4: every E8M0 byte now and then (the subnormal scales 0 and 1 included). */
        if (t == KVG_MXFP4 && n % 4 == 1)
            for (int b = 0; b < K / 32; b++)
                wq[(size_t)n * rb + 17 * (size_t)b] = (uint8_t)(b % 2 ? rnd32() % 4 : rnd32() % 256);
    }
    for (size_t i = 0; i < (size_t)M * K; i++)
        x[i] = rnd_f() * (i % 37 == 0 ? 100.0f : 1.0f);
    if (M > 2) {
        x[(size_t)K + 3] = INFINITY;                  /* row 1: NaN outputs */
        for (int k = 0; k < 32; k++)
            x[2 * (size_t)K + k] = 0;                 /* row 2: a zero block */
    }
    for (int n = 0; n < N; n++)
        bias[n] = rnd_f();
    if (kvg_gemm_prepare(NULL, &w, &pw) != 1)
        return 0;
    memset(xq0, 0, xb);
    memset(xq1, 0, xb);
    kvg_int8_quantize_x_generic(x, K, 0, M, xq0);
    kvg_int8_quantize_x_avx512_emulated(x, K, 0, M, xq1);
    same = memcmp(xq0, xq1, xb) == 0;
    if (!same)
        diag("%s M=%d K=%d: the emulated quantizer's X differs", kvg_quant_name(t), M, K);

    kvg_gemm_job job = { .x = x, .xp = NULL, .xq = xq0, .w = pw.data, .bias = with_bias ? bias : NULL, .y = y0,
                         .M = M, .N = N, .K = K, .dt = pw.dtype };
    kvg_int8_kernel_generic(&job, 0, N, NULL);
    job.y = y1;
    int groups = (N + 15) / 16;
    for (int p = 0; p < parts; p++) {
        int g0 = groups * p / parts, g1 = groups * (p + 1) / parts;
        if (g1 > g0)
            kvg_int8_kernel_avx512_emulated(&job, 16 * g0, 16 * g1 < N ? 16 * g1 : N, NULL);
    }
    char what[96];
    snprintf(what, sizeof what, "%s M=%d N=%d K=%d parts=%d", kvg_quant_name(t), M, N, K, parts);
    same &= same_floats(y0, y1, (size_t)M * N, what);
    kvg_gemm_prepared_free(&pw);
    free(x);
    free(row);
    free(bias);
    free(y0);
    free(y1);
    free(wq);
    free(xq0);
    free(xq1);
    return same;
}
#endif

int main(void)
{
#if HAVE_EMULATION
    /* M, N, K (in blocks of 32: Q4_K and Q6_K take multiples of 8): every tile height
     * (1-4 rows and their mixtures), N with a partial group, groups not a multiple of a
     * tile's width. */
    static const int shapes[][3] = {
        { 1, 16, 8 }, { 1, 37, 16 }, { 2, 100, 8 }, { 3, 45, 24 }, { 4, 33, 8 },
        { 5, 64, 16 }, { 7, 150, 8 }, { 9, 17, 16 }, { 13, 96, 8 },
    };
    if (!kvg_gemm_isa_supported(KVG_ISA_AVX2)) {
        ok(1, "int8 AVX-512 kernel under emulation # SKIP this CPU lacks AVX2/FMA/F16C");
        return done_testing();
    }
    for (int t = 0; t <= KVG_MXFP4; t++) {
        int good = 1, n = 0;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int K = 32 * shapes[s][2];
            /* the block-of-32 types also at widths of 5 and 3 blocks (MXFP4's layout:
             * a four and a partial one; a partial one alone) */
            if (kvg_quant_block_elems((kvg_qtype)t) == 32 && s % 3 != 0)
                K = s % 3 == 1 ? 160 : 96;
            good &= compare((kvg_qtype)t, shapes[s][0], shapes[s][1], K, (int)(s & 1), 1 + (int)(s % 3));
            n++;
        }
        ok(good, "int8 AVX-512 kernel (emulated), %s weights: X's quantization and the products bit-identical to "
           "the generic ones on %d shapes, split in 1-3 column ranges", kvg_quant_name((kvg_qtype)t), n);
    }
#else
    (void)rnd_f;
    ok(1, "int8 AVX-512 kernel under emulation # SKIP needs GCC on x86-64 and SIMDe (libsimde-dev)");
#endif
    return done_testing();
}
