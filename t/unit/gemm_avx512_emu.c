/* The AVX-512 GEMM kernel on CPUs without AVX-512: engine/cpu/gemm_avx512.c is compiled
 * into this test against SIMDe (Debian's libsimde-dev), which implements the AVX-512
 * intrinsics with AVX2 + FMA, and its results must equal the generic kernel's bit for
 * bit -- so the kernel that CI machines with AVX-512 run is checked everywhere. SIMDe
 * 0.7.4 lacks four of the intrinsics used; they are written out below with the
 * instructions' documented semantics. Skipped when SIMDe or AVX2/FMA/F16C is missing. */
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
#if !defined(SIMDE_X86_FMA_NATIVE) || !defined(SIMDE_X86_AVX2_NATIVE)
#error "SIMDe must map the AVX-512 FMAs onto real FMA instructions"
#endif

/* Masked, zeroing loads read only the selected elements (as the hardware does). */
static inline simde__m512 emu_mm512_maskz_loadu_ps(uint16_t k, const void *p)
{
    float v[16];
    for (int i = 0; i < 16; i++)
        v[i] = (k >> i) & 1 ? ((const float *)p)[i] : 0.0f;
    return simde_mm512_loadu_ps(v);
}

static inline __m256i emu_mm256_maskz_loadu_epi16(uint16_t k, const void *p)
{
    uint16_t v[16];
    for (int i = 0; i < 16; i++)
        v[i] = (k >> i) & 1 ? ((const uint16_t *)p)[i] : 0;
    return _mm256_loadu_si256((const __m256i *)v);
}

/* 16 halves to floats with the F16C instruction, 8 at a time. */
static inline simde__m512 emu_mm512_cvtph_ps(__m256i h)
{
    float v[16];
    _mm256_storeu_ps(v, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
    _mm256_storeu_ps(v + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
    return simde_mm512_loadu_ps(v);
}

static inline simde__m512i emu_mm512_cvtepu16_epi32(__m256i h)
{
    uint16_t in[16];
    uint32_t out[16];
    _mm256_storeu_si256((__m256i *)in, h);
    for (int i = 0; i < 16; i++)
        out[i] = in[i];
    return simde_mm512_loadu_si512(out);
}

#define _mm512_maskz_loadu_ps emu_mm512_maskz_loadu_ps
#define _mm256_maskz_loadu_epi16 emu_mm256_maskz_loadu_epi16
#define _mm512_cvtph_ps emu_mm512_cvtph_ps
#define _mm512_cvtepu16_epi32 emu_mm512_cvtepu16_epi32

#include "cpu/gemm_kernels.h"
#define KVG_AVX512_TARGET "avx2,fma,f16c"
#define kvg_gemm_kernel_avx512 kvg_gemm_kernel_avx512_emulated
#define kvg_gemm_plan_avx512 kvg_gemm_plan_avx512_emulated
#define kvg_gemm_pack_x_avx512 kvg_gemm_pack_x_avx512_emulated
void kvg_gemm_kernel_avx512_emulated(const kvg_gemm_job *job, int n0, int n1,
                                     const kvg_gemm_scratch *s);
void kvg_gemm_plan_avx512_emulated(const kvg_gemm_job *job, kvg_gemm_plan *plan);
void kvg_gemm_pack_x_avx512_emulated(const kvg_gemm_job *job, int p0, int p1, float *xp);
#include "cpu/gemm_avx512.c"
#undef kvg_gemm_kernel_avx512
#undef kvg_gemm_plan_avx512
#undef kvg_gemm_pack_x_avx512
#pragma GCC pop_options

#else
#define HAVE_EMULATION 0
#include "cpu/gemm_kernels.h"
#endif
#include "cpu/gemm_testing.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;

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
/* The emulated kernel on [0, N) cut into `parts` ranges (as threads would) against
 * the generic kernel through kvg_gemm_with_isa. */
static int compare(kvg_dtype dt, int M, int N, int K, int with_bias, int parts)
{
    size_t nw = (size_t)N * (size_t)K;
    float *x = malloc(((size_t)M * K + 1) * sizeof(float));
    void *w = malloc((nw + 1) * (dt == KVG_DT_F32 ? 4 : 2));
    float *bias = malloc(((size_t)N + 1) * sizeof(float));
    float *y0 = malloc(((size_t)M * N + 1) * sizeof(float));
    float *y1 = malloc(((size_t)M * N + 1) * sizeof(float));
    kvg_tensor t = { w, dt, N, K };
    kvg_gemm_job job = { .x = x, .xp = NULL, .w = w, .bias = with_bias ? bias : NULL, .y = y1,
                         .M = M, .N = N, .K = K, .dt = dt };
    kvg_gemm_plan plan;
    kvg_gemm_scratch scratch = { NULL, NULL };
    float *xp = NULL;
    int same;

    for (size_t i = 0; i < (size_t)M * K; i++)
        x[i] = rnd_f();
    for (int i = 0; i < N; i++)
        bias[i] = rnd_f();
    for (size_t i = 0; i < nw; i++) {
        if (dt == KVG_DT_F32) {
            ((float *)w)[i] = rnd_f();
        } else if (dt == KVG_DT_BF16) {
            float f = rnd_f();
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)w)[i] = (uint16_t)(u >> 16);
        } else {
            uint16_t h = (uint16_t)(rnd32() & 0x83ff);
            if (rnd32() % 16)
                h |= (uint16_t)((10 + rnd32() % 7) << 10);
            ((uint16_t *)w)[i] = h;
        }
    }
    kvg_gemm_with_isa(KVG_ISA_GENERIC, NULL, NULL, x, M, K, &t, with_bias ? bias : NULL, y0);
    /* Split in several parts, X packed once, in pieces, and each part with its own
     * scratch of the plan's size, as kvg_gemm does. */
    kvg_gemm_plan_avx512_emulated(&job, &plan);
    if (plan.packed) {
        xp = aligned_alloc(64, (plan.xp_floats + 15) / 16 * 16 * sizeof(float));
        for (int p = 0; p < parts; p++)
            kvg_gemm_pack_x_avx512_emulated(&job, plan.x_panels * p / parts,
                                            plan.x_panels * (p + 1) / parts, xp);
        job.xp = xp;
        scratch.wp = aligned_alloc(64, (plan.wp_floats + 15) / 16 * 16 * sizeof(float));
        scratch.slots = aligned_alloc(64, (plan.slots_floats + 15) / 16 * 16 * sizeof(float));
    }
    for (int p = 0; p < parts; p++)
        kvg_gemm_kernel_avx512_emulated(&job, (int)((long)N * p / parts),
                                        (int)((long)N * (p + 1) / parts),
                                        plan.packed ? &scratch : NULL);
    free(xp);
    free(scratch.wp);
    free(scratch.slots);
    same = memcmp(y0, y1, (size_t)M * N * sizeof(float)) == 0;
    if (!same)
        for (size_t i = 0; i < (size_t)M * N; i++)
            if (memcmp(&y0[i], &y1[i], sizeof(float)) != 0) {
                diag("dt=%d M=%d N=%d K=%d: first difference at row %zu col %zu: %a vs %a",
                     (int)dt, M, N, K, i / (size_t)N, i % (size_t)N, (double)y0[i], (double)y1[i]);
                break;
            }
    free(x);
    free(w);
    free(bias);
    free(y0);
    free(y1);
    return same;
}
#endif

int main(void)
{
#if HAVE_EMULATION
    static const int shapes[][3] = {
        /* M, N, K: small-M path (M < 40), packed path, tails in N and K, K < 16 */
        { 1, 1, 1 },    { 1, 37, 5 },  { 1, 100, 64 }, { 2, 9, 33 },   { 3, 45, 100 },
        { 4, 17, 16 },  { 7, 70, 31 }, { 8, 32, 16 },  { 12, 32, 48 }, { 13, 65, 77 },
        { 24, 96, 288 }, { 37, 50, 130 }, { 48, 40, 100 }, { 64, 33, 15 }, { 70, 64, 200 },
    };
    if (!kvg_gemm_isa_supported(KVG_ISA_AVX2)) {
        ok(1, "AVX-512 kernel under emulation # SKIP this CPU lacks AVX2/FMA/F16C");
        return done_testing();
    }
    for (int d = 0; d < 3; d++) {
        int good = 1;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            good &= compare((kvg_dtype)d, shapes[s][0], shapes[s][1], shapes[s][2], (int)(s & 1),
                            1 + (int)(s % 3));
        ok(good, "AVX-512 kernel (emulated), %s weights: bit-identical to the generic kernel "
           "on %zu shapes, split in 1-3 column ranges", d == 0 ? "f32" : d == 1 ? "f16" : "bf16",
           sizeof shapes / sizeof shapes[0]);
    }
#else
    (void)rnd_f;
    ok(1, "AVX-512 kernel under emulation # SKIP needs GCC on x86-64 and SIMDe (libsimde-dev)");
#endif
    return done_testing();
}
