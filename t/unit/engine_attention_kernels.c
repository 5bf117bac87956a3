/* The attention kernels of every ISA give the generic kernels' bits: scores (4 and 1
 * groups of 16 keys), the V accumulation, the same two for 4 query rows at once
 * (each row's bits those of the one-row kernel), and the softmax with its polynomial exp,
 * over head sizes, block sizes, token counts and awkward values. AVX2 and AVX-512 run
 * natively where the CPU has them; engine/cpu/attention_avx512.c is also compiled into
 * this test against SIMDe (AVX-512 intrinsics emulated with AVX2 + FMA), so the
 * AVX-512 kernels are checked on CPUs without AVX-512 too. The SwiGLU kernel (which
 * shares the exp) likewise, over lengths with and without a tail and awkward values
 * (+-0, infinities, NaN, values past the exp's range). And the exp and the SwiGLU are
 * accurate. The int8 KV kernels (an int8 layer's K and V) of every ISA give the float
 * kernels' bits over the same values as floats. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "cpu/attention_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    defined(__has_include) && __has_include(<simde/x86/avx512.h>)
#define HAVE_EMULATION 1
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#if !defined(SIMDE_X86_FMA_NATIVE) || !defined(SIMDE_X86_AVX2_NATIVE)
#error "SIMDe must map the AVX-512 FMAs onto real FMA instructions"
#endif
#define KVG_AVX512_TARGET "avx2,fma"
/* This SIMDe lacks the two conversions of the int8 KV load (vpmovsxbd, vcvtdq2ps):
 * emulated here, element by element, as the instructions define them. */
static inline simde__m512i emu_cvtepi8_epi32(simde__m128i a)
{
    int8_t b[16];
    int32_t w[16];
    simde_mm_storeu_si128((simde__m128i *)(void *)b, a);
    for (int i = 0; i < 16; i++)
        w[i] = b[i];
    return simde_mm512_loadu_si512(w);
}
static inline simde__m512 emu_cvtepi32_ps(simde__m512i a)
{
    int32_t w[16];
    float f[16];
    simde_mm512_storeu_si512(w, a);
    for (int i = 0; i < 16; i++)
        f[i] = (float)w[i];
    return simde_mm512_loadu_ps(f);
}
#define _mm512_cvtepi8_epi32 emu_cvtepi8_epi32
#define _mm512_cvtepi32_ps emu_cvtepi32_ps
void emu_scores4(const float *q, const float *const *k, int bt, int hd, float *out);
void emu_scores1(const float *q, const float *const *k, int bt, int hd, float *out);
void emu_vacc(float *out, const float *w, const float *v, int n, int hd);
float emu_softmax(float *sc, int T, float scale, float sink);
void emu_scores4_rows(const float *const *q, const float *const *k, int bt, int hd, float *const *out);
void emu_vacc_rows(float *const *out, const float *const *w, const float *v, int n, int hd);
void emu_swiglu(float *gate, const float *up, size_t n);
void emu_swiglu_oai(float *gate, const float *up, size_t n);
void emu_geglu(float *gate, const float *up, size_t n);
void emu_scores4_i8(const float *q, const int8_t *const *k, int bt, int hd, float *out);
void emu_scores1_i8(const float *q, const int8_t *const *k, int bt, int hd, float *out);
void emu_vacc_i8(float *out, const float *w, const int8_t *v, int n, int hd);
void emu_scores4_rows_i8(const float *const *q, const int8_t *const *k, int bt, int hd, float *const *out);
void emu_vacc_rows_i8(float *const *out, const float *const *w, const int8_t *v, int n, int hd);
#define kvg_attn_scores4_i8_avx512 emu_scores4_i8
#define kvg_attn_scores1_i8_avx512 emu_scores1_i8
#define kvg_attn_vacc_i8_avx512 emu_vacc_i8
#define kvg_attn_scores4_rows_i8_avx512 emu_scores4_rows_i8
#define kvg_attn_vacc_rows_i8_avx512 emu_vacc_rows_i8
#define kvg_swiglu_avx512 emu_swiglu
#define kvg_swiglu_oai_avx512 emu_swiglu_oai
#define kvg_geglu_avx512 emu_geglu
#define kvg_attn_scores4_rows_avx512 emu_scores4_rows
#define kvg_attn_vacc_rows_avx512 emu_vacc_rows
#define kvg_attn_scores4_avx512 emu_scores4
#define kvg_attn_scores1_avx512 emu_scores1
#define kvg_attn_vacc_avx512 emu_vacc
#define kvg_attn_softmax_avx512 emu_softmax
#include "cpu/attention_avx512.c"
#undef kvg_attn_scores4_avx512
#undef kvg_attn_scores1_avx512
#undef kvg_attn_vacc_avx512
#undef kvg_attn_softmax_avx512
#undef kvg_attn_scores4_rows_avx512
#undef kvg_attn_vacc_rows_avx512
#undef kvg_swiglu_avx512
#undef kvg_swiglu_oai_avx512
#undef kvg_geglu_avx512
#undef kvg_attn_scores4_i8_avx512
#undef kvg_attn_scores1_i8_avx512
#undef kvg_attn_vacc_i8_avx512
#undef kvg_attn_scores4_rows_i8_avx512
#undef kvg_attn_vacc_rows_i8_avx512
#undef _mm512_cvtepi8_epi32
#undef _mm512_cvtepi32_ps
#pragma GCC pop_options
#else
#define HAVE_EMULATION 0
#endif

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float rnd(float lo, float hi)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (hi - lo) * (float)((double)(rng >> 40) / 16777216.0);
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* The int8 KV kernels (an int8 layer, kv_cache.h): each ISA's give the bits of the
 * generic float kernels run over the same values as floats (the conversion is exact and
 * the chains are the same), for the 4- and 1-group scores, the V accumulation and their
 * 4-row forms, over head sizes, block sizes and token counts, with the extreme codes
 * -127 and 127 and with -128 (never stored, but read alike). */
static void compare_i8(const char *name, const kvg_attn_kernels *k, const kvg_attn_kernels *g)
{
    static const int hds[] = { 8, 16, 24, 48, 64, 80, 96, 128, 136, 192, 256 };
    static const int bts[] = { 16, 32, 48 };
    size_t nk = 256 * 48 * 4, nv = 16 * 256;
    int8_t *K8 = malloc(nk), *V8 = malloc(nv);
    float *K = malloc(nk * sizeof(float)), *V = malloc(nv * sizeof(float));
    float q[256], o1[64], o2[64], out1[256], out2[256], w[16];
    float q4[4][256], r1[4][64], r2[4][64], vo1[4][256], vo2[4][256], w4[4][16];
    int bad_s4 = 0, bad_s1 = 0, bad_v = 0, bad_sr = 0, bad_vr = 0, cases = 0;

    for (size_t i = 0; i < nk; i++) {
        K8[i] = (int8_t)(i % 97 == 5 ? 127 : i % 89 == 7 ? -127 : i % 211 == 3 ? -128 : (int)rnd(-127.0f, 128.0f));
        K[i] = (float)K8[i];
    }
    for (size_t i = 0; i < nv; i++) {
        V8[i] = (int8_t)(i % 31 == 5 ? 127 : i % 37 == 7 ? -127 : (int)rnd(-127.0f, 128.0f));
        V[i] = (float)V8[i];
    }
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++) {
        int hd = hds[h];
        for (int d = 0; d < hd; d++)
            q[d] = rnd(-1.5f, 1.5f);
        for (size_t b = 0; b < sizeof bts / sizeof bts[0]; b++) {
            int bt = bts[b];
            size_t off[4] = { 0, bt == 16 ? 3 * (size_t)hd * bt : (size_t)(16 % bt),
                              (size_t)hd * bt + (bt > 16 ? 16 : 0), 2 * (size_t)hd * bt };
            const float *grp[4];
            const int8_t *grp8[4];
            for (int i = 0; i < 4; i++) {
                grp[i] = K + off[i];
                grp8[i] = K8 + off[i];
            }
            memset(o2, 0xff, sizeof o2);
            g->scores4(q, grp, bt, hd, o1);
            k->scores4_i8(q, grp8, bt, hd, o2);
            bad_s4 += !same_bits(o1, o2, 64);
            g->scores1(q, grp + 2, bt, hd, o1);
            k->scores1_i8(q, grp8 + 2, bt, hd, o2);
            bad_s1 += !same_bits(o1, o2, 16);
            {
                const float *qr[4] = { q4[0], q4[1], q4[2], q4[3] };
                float *outr[4] = { r2[0], r2[1], r2[2], r2[3] };
                for (int r = 0; r < 4; r++)
                    for (int d = 0; d < hd; d++)
                        q4[r][d] = rnd(-1.5f, 1.5f);
                memset(r2, 0xff, sizeof r2);
                for (int r = 0; r < 4; r++)
                    g->scores4(q4[r], grp, bt, hd, r1[r]);
                k->scores4_rows_i8(qr, grp8, bt, hd, outr);
                bad_sr += !same_bits(r1[0], r2[0], 4 * 64);
            }
            cases++;
        }
        for (int n = 1; n <= 16; n += 5) {
            float *o2p[4] = { vo2[0], vo2[1], vo2[2], vo2[3] };
            const float *wp[4] = { w4[0], w4[1], w4[2], w4[3] };
            for (int t = 0; t < n; t++)
                w[t] = rnd(0.0f, 0.01f);
            for (int d = 0; d < hd; d++)
                out1[d] = out2[d] = rnd(-1.0f, 1.0f);
            g->vacc(out1, w, V, n, hd);
            k->vacc_i8(out2, w, V8, n, hd);
            bad_v += !same_bits(out1, out2, (size_t)hd);
            for (int r = 0; r < 4; r++) {
                for (int t = 0; t < n; t++)
                    w4[r][t] = rnd(0.0f, 0.01f);
                for (int d = 0; d < hd; d++)
                    vo1[r][d] = vo2[r][d] = rnd(-1.0f, 1.0f);
                g->vacc(vo1[r], w4[r], V, n, hd);
            }
            k->vacc_rows_i8(o2p, wp, V8, n, hd);
            for (int r = 0; r < 4; r++)
                bad_vr += !same_bits(vo1[r], vo2[r], (size_t)hd);
        }
    }
    ok(bad_s4 == 0, "%s int8: scores4 = the float kernel on the same values (%d/%d differ)", name, bad_s4, cases);
    ok(bad_s1 == 0, "%s int8: scores1 = the float kernel (%d/%d differ)", name, bad_s1, cases);
    ok(bad_sr == 0, "%s int8: 4-row scores = the one-row float kernel row by row (%d/%d differ)", name, bad_sr,
       cases);
    ok(bad_v == 0, "%s int8: V accumulation = the float kernel (%d differ)", name, bad_v);
    ok(bad_vr == 0, "%s int8: 4-row V accumulation = the float kernel row by row (%d differ)", name, bad_vr);
    free(K8);
    free(V8);
    free(K);
    free(V);
}

/* One ISA's kernels against the generic ones. */
static void compare(const char *name, const kvg_attn_kernels *k, const kvg_attn_kernels *g)
{
    static const int hds[] = { 8, 16, 24, 48, 64, 80, 96, 128, 136, 192, 256 };
    static const int bts[] = { 16, 32, 48 };
    static const int Ts[] = { 1, 2, 15, 16, 17, 31, 64, 100, 1000 };
    float *K = malloc(256 * 48 * 4 * sizeof(float)), *V = malloc(16 * 256 * sizeof(float));
    float q[256], o1[64], o2[64], out1[256], out2[256], w[16];
    float *s1 = malloc(1024 * sizeof(float)), *s2 = malloc(1024 * sizeof(float));
    float q4[4][256], *r1 = malloc(4 * 64 * sizeof(float)), *r2 = malloc(4 * 64 * sizeof(float));
    float vo1[4][256], vo2[4][256], w4[4][16];
    int bad_s4 = 0, bad_s1 = 0, bad_v = 0, bad_sm = 0, bad_sr = 0, bad_vr = 0, bad_sw = 0, bad_so = 0, bad_ge = 0, cases = 0;

    for (size_t i = 0; i < 256 * 48 * 4; i++)
        K[i] = rnd(-2.0f, 2.0f);
    for (size_t i = 0; i < 16 * 256; i++)
        V[i] = rnd(-3.0f, 3.0f);
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++) {
        int hd = hds[h];
        for (int d = 0; d < hd; d++)
            q[d] = rnd(-1.5f, 1.5f);
        for (size_t b = 0; b < sizeof bts / sizeof bts[0]; b++) {
            int bt = bts[b];
            /* four groups: two in one block, two in others */
            const float *grp[4] = { K, K + 16 % bt, K + (size_t)hd * bt + (bt > 16 ? 16 : 0),
                                    K + 2 * (size_t)hd * bt };
            if (bt == 16)
                grp[1] = K + 3 * (size_t)hd * bt;
            memset(o1, 0, sizeof o1);
            memset(o2, 0xff, sizeof o2);
            g->scores4(q, grp, bt, hd, o1);
            k->scores4(q, grp, bt, hd, o2);
            bad_s4 += !same_bits(o1, o2, 64);
            g->scores1(q, grp + 2, bt, hd, o1);
            k->scores1(q, grp + 2, bt, hd, o2);
            bad_s1 += !same_bits(o1, o2, 16);
            /* 4 rows: each row's 64 scores those of the generic one-row kernel */
            {
                const float *qr[4] = { q4[0], q4[1], q4[2], q4[3] };
                float *outr[4] = { r2, r2 + 64, r2 + 128, r2 + 192 };
                for (int r = 0; r < 4; r++)
                    for (int d = 0; d < hd; d++)
                        q4[r][d] = r == 2 ? q[d] : rnd(-1.5f, 1.5f);
                memset(r2, 0xff, 4 * 64 * sizeof(float));
                for (int r = 0; r < 4; r++)
                    g->scores4(q4[r], grp, bt, hd, r1 + 64 * r);
                k->scores4_rows(qr, grp, bt, hd, outr);
                bad_sr += !same_bits(r1, r2, 4 * 64);
            }
            cases++;
        }
        for (int n = 1; n <= 16; n += 5) {
            for (int t = 0; t < n; t++)
                w[t] = rnd(0.0f, 1.0f);
            for (int d = 0; d < hd; d++)
                out1[d] = out2[d] = rnd(-1.0f, 1.0f);
            g->vacc(out1, w, V, n, hd);
            k->vacc(out2, w, V, n, hd);
            bad_v += !same_bits(out1, out2, (size_t)hd);
            {
                float *o2p[4] = { vo2[0], vo2[1], vo2[2], vo2[3] };
                const float *wp[4] = { w4[0], w4[1], w4[2], w4[3] };
                for (int r = 0; r < 4; r++) {
                    for (int t = 0; t < n; t++)
                        w4[r][t] = r == 0 ? w[t] : rnd(0.0f, 1.0f);
                    for (int d = 0; d < hd; d++)
                        vo1[r][d] = vo2[r][d] = rnd(-1.0f, 1.0f);
                    g->vacc(vo1[r], w4[r], V, n, hd);
                }
                k->vacc_rows(o2p, wp, V, n, hd);
                for (int r = 0; r < 4; r++)
                    bad_vr += !same_bits(vo1[r], vo2[r], (size_t)hd);
            }
        }
    }
    for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) {
        int T = Ts[t];
        for (int variant = 0; variant < 3; variant++) {
            float sum1, sum2;
            for (int i = 0; i < T; i++) {
                s1[i] = variant == 0 ? rnd(-30.0f, 30.0f) : variant == 1 ? rnd(-2000.0f, 10.0f) : 1.25f;
                if (variant == 1 && i % 7 == 3)
                    s1[i] = -1e30f;          /* far below: exp underflows to 0 */
            }
            /* no sink, and a sink (gpt-oss) below, among and above the scores */
            float sink = variant == 0 ? -INFINITY : variant == 1 ? rnd(-5.0f, 5.0f) : 3.0f;
            memcpy(s2, s1, (size_t)T * sizeof(float));
            sum1 = g->softmax(s1, T, 8.0f, sink);
            sum2 = k->softmax(s2, T, 8.0f, sink);
            bad_sm += !same_bits(s1, s2, (size_t)T) || memcmp(&sum1, &sum2, sizeof sum1) != 0;
        }
    }
    {
        static const size_t lens[] = { 1, 7, 8, 15, 16, 17, 33, 2048, 4099 };
        static const float odd[] = { 0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 86.0f, -86.0f, 87.5f,
                                     -87.5f, 100.0f, -100.0f, 1e-40f, -1e-40f, 1e30f, -1e30f };
        float *g1 = malloc(4099 * sizeof(float)), *g2 = malloc(4099 * sizeof(float));
        float *up = malloc(4099 * sizeof(float));
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            size_t n = lens[l];
            for (size_t i = 0; i < n; i++) {
                g1[i] = i % 5 == 4 ? odd[(i / 5) % 16] : rnd(-12.0f, 12.0f);
                up[i] = rnd(-3.0f, 3.0f);
            }
            memcpy(g2, g1, n * sizeof(float));
            g->swiglu(g1, up, n);
            k->swiglu(g2, up, n);
            bad_sw += !same_bits(g1, g2, n);
            /* the clamped one: gates and ups across both clamps, the odd values in both */
            for (size_t i = 0; i < n; i++) {
                g1[i] = i % 5 == 4 ? odd[(i / 5) % 16] : rnd(-12.0f, 12.0f);
                up[i] = i % 7 == 6 ? odd[(i / 7) % 16] : rnd(-10.0f, 10.0f);
            }
            memcpy(g2, g1, n * sizeof(float));
            g->swiglu_oai(g1, up, n);
            k->swiglu_oai(g2, up, n);
            bad_so += !same_bits(g1, g2, n);
            for (size_t i = 0; i < n; i++)
                g1[i] = i % 5 == 4 ? odd[(i / 5) % 16] : rnd(-12.0f, 12.0f);
            memcpy(g2, g1, n * sizeof(float));
            g->geglu(g1, up, n);
            k->geglu(g2, up, n);
            bad_ge += !same_bits(g1, g2, n);
        }
        free(g1);
        free(g2);
        free(up);
    }
    ok(bad_s4 == 0, "%s: scores of 4 groups bit-identical (%d head/block-size cases)", name, cases);
    ok(bad_s1 == 0, "%s: scores of 1 group bit-identical", name);
    ok(bad_v == 0, "%s: V accumulation bit-identical (head sizes 8..256, 1..16 tokens)", name);
    ok(bad_sm == 0, "%s: softmax values and sums bit-identical (T = 1..1000, with and without a sink)", name);
    ok(bad_sr == 0, "%s: scores of 4 rows x 4 groups = the one-row kernel's, row by row", name);
    ok(bad_vr == 0, "%s: V accumulation of 4 rows = the one-row kernel's, row by row", name);
    ok(bad_sw == 0, "%s: SwiGLU bit-identical (lengths 1..4099, odd values)", name);
    ok(bad_so == 0, "%s: gpt-oss's clamped SwiGLU bit-identical (lengths 1..4099, odd values)", name);
    ok(bad_ge == 0, "%s: GeGLU bit-identical (lengths 1..4099, odd values)", name);
    free(r1);
    free(r2);
    free(K);
    free(V);
    free(s1);
    free(s2);
}

/* The generic kernels against plain arithmetic, so "all ISAs agree" is not "all ISAs
 * agree on something wrong". */
static void check_generic(const kvg_attn_kernels *g)
{
    float K[64 * 16], q[64], out[16], V[5 * 24], w[5], acc[24];
    float sc[40], ref[40], sum, want = 0.0f, mx = -INFINITY;
    int good = 1;
    const float *grp[1] = { K };
    for (int i = 0; i < 64 * 16; i++)
        K[i] = rnd(-1.0f, 1.0f);
    for (int d = 0; d < 64; d++)
        q[d] = rnd(-1.0f, 1.0f);
    g->scores1(q, grp, 16, 64, out);
    for (int l = 0; l < 16; l++) {
        double s = 0.0;
        for (int d = 0; d < 64; d++)
            s += (double)q[d] * K[d * 16 + l];
        good &= fabs(s - out[l]) < 1e-5;
    }
    ok(good, "generic scores = q.k (dimension-major K)");
    for (int i = 0; i < 5 * 24; i++)
        V[i] = rnd(-1.0f, 1.0f);
    for (int t = 0; t < 5; t++)
        w[t] = rnd(0.0f, 1.0f);
    memset(acc, 0, sizeof acc);
    g->vacc(acc, w, V, 5, 24);
    good = 1;
    for (int d = 0; d < 24; d++) {
        double s = 0.0;
        for (int t = 0; t < 5; t++)
            s += (double)w[t] * V[t * 24 + d];
        good &= fabs(s - acc[d]) < 1e-5;
    }
    ok(good, "generic V accumulation = sum_t w_t v_t");
    for (int i = 0; i < 40; i++)
        sc[i] = ref[i] = rnd(-20.0f, 20.0f);
    sum = g->softmax(sc, 40, 2.0f, -INFINITY);
    for (int i = 0; i < 40; i++)
        mx = fmaxf(mx, ref[i] / 2.0f);
    good = 1;
    for (int i = 0; i < 40; i++) {
        double e = exp((double)(ref[i] / 2.0f - mx));   /* the argument as the kernel rounds it */
        want += (float)e;
        good &= fabs(e - sc[i]) <= 3e-7 * e + 1e-30;
    }
    ok(good && fabsf(sum - want) < 1e-5f * want, "generic softmax = exp(s/scale - max), sum %g", sum);

    /* An attention sink (gpt-oss): softmax_i = exp(s_i) / (exp(sink) + sum_j exp(s_j)),
     * computed naively in double from the scaled scores, with the sink below the scores'
     * maximum (the max is theirs) and above it (the max is the sink's, every weight < 1). */
    static const float sinks[] = { 1.5f, 25.0f };
    for (size_t k = 0; k < sizeof sinks / sizeof sinks[0]; k++) {
        double den = exp((double)sinks[k]), worst = 0.0;
        for (int i = 0; i < 40; i++)
            den += exp((double)(ref[i] / 2.0f));
        for (int i = 0; i < 40; i++)
            sc[i] = ref[i];
        sum = g->softmax(sc, 40, 2.0f, sinks[k]);
        for (int i = 0; i < 40; i++) {
            double p = exp((double)(ref[i] / 2.0f)) / den, got = (double)sc[i] / sum;
            worst = fmax(worst, fabs(got - p));
        }
        ok(worst < 1e-6, "generic softmax with a sink of %g = exp(s_i) / (exp(sink) + sum exp(s_j)) (max error "
           "%.2g)", sinks[k], worst);
    }
    {
        /* without a sink (-INFINITY) the sum is the lanes' alone, bit for bit: the 16
         * lane chains over t ascending, reduced in the fixed order */
        float a[40], lanes[16] = { 0 }, sa, sb;
        for (int i = 0; i < 40; i++)
            a[i] = ref[i];
        sa = g->softmax(a, 40, 2.0f, -INFINITY);
        for (int t = 0; t < 40; t++)
            lanes[t & 15] += a[t];
        sb = kvg_attn_reduce16(lanes);
        ok(memcmp(&sa, &sb, sizeof sa) == 0, "no sink (-inf): the sum is the lanes' alone, bit for bit");
    }
}

/* GeGLU against 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u in double (the tanh
 * form kvg_gelu_mul computes as g sigmoid(2 z) u), and its edges. */
static void check_geglu(const kvg_attn_kernels *g)
{
    double worst = 0.0;
    int n = 0, edges = 1;
    float v[1];
    for (float x = -12.0f; x <= 40.0f; x += 0.00371f, n++) {
        double xd = x, want = 0.5 * xd * (1.0 + tanh(0.7978845608028654 * (xd + 0.044715 * xd * xd * xd))) * 1.5;
        float u = 1.5f;
        v[0] = x;
        g->geglu(v, &u, 1);
        /* relative where the value is not tiny: below x = -5 it falls under 1e-6 and
         * the float form's absolute error (~1e-13) is what counts */
        double err = fabs(v[0] - want) / fmax(fabs(want), 1e-6);
        if (err > worst)
            worst = err;
    }
    ok(worst < 2e-6, "GeGLU relative error %.3g over %d points of [-12, 40]", worst, n);
    {
        float in[] = { 0.0f, -0.0f, INFINITY, -100.0f, 100.0f, NAN }, u[] = { 2, 2, 2, 2, 2, 2 };
        g->geglu(in, u, 6);
        edges &= in[0] == 0.0f && in[1] == 0.0f && isinf(in[2]) && in[2] > 0;
        edges &= in[3] == 0.0f && in[4] == 200.0f && isnan(in[5]);
    }
    ok(edges, "GeGLU: gelu(+-0) = 0, gelu(inf) = inf, gelu(-100) = 0, gelu(100) = 100, NaN stays NaN");
}

/* gpt-oss's clamped SwiGLU against its formula in double: x = min(g, 7),
 * y = clamp(u, -7, 7), x sigmoid(1.702 x) (y + 1). */
static void check_swiglu_oai(void)
{
    static const float gs[] = { -30.0f, -7.5f, -1.0f, -0.25f, 0.0f, 0.3f, 2.0f, 6.99f, 7.0f, 7.01f, 50.0f };
    static const float us[] = { -20.0f, -7.0f, -1.0f, 0.0f, 0.5f, 6.5f, 7.5f, 1e6f };
    double worst = 0.0;
    for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
        for (size_t j = 0; j < sizeof us / sizeof us[0]; j++) {
            double x = fmin(gs[i], 7.0), y = fmin(fmax(us[j], -7.0), 7.0);
            double want = x / (1.0 + exp(-1.702 * x)) * (y + 1.0);
            double got = kvg_swiglu_oai(gs[i], us[j]);
            worst = fmax(worst, fabs(got - want) / fmax(fabs(want), 1e-3));
        }
    ok(worst < 1e-6, "clamped SwiGLU = min(g,7) sigmoid(1.702 min(g,7)) (clamp(u,-7,7) + 1) (relative error %.2g)",
       worst);
    ok(isnan(kvg_swiglu_oai(NAN, 1.0f)), "clamped SwiGLU: a NaN gate stays NaN");
}

static void check_exp(void)
{
    double worst = 0.0;
    int n = 0;
    for (float x = -86.0f; x <= 0.0f; x += 0.000731f, n++) {
        double e = exp((double)x), r = fabs(kvg_attn_exp(x) - e) / e;
        if (r > worst)
            worst = r;
    }
    ok(worst < 3e-7, "kvg_attn_exp relative error %.3g over %d points of [-86, 0]", worst, n);
    ok(kvg_attn_exp(0.0f) == 1.0f, "exp(0) = 1 exactly");
    ok(kvg_attn_exp(-86.5f) == 0.0f && kvg_attn_exp(-1e30f) == 0.0f && kvg_attn_exp(-INFINITY) == 0.0f,
       "below -86: 0");
    ok(kvg_attn_exp(NAN) == 0.0f, "NaN: 0");
    ok(fabs(kvg_attn_exp(5.0f) - exp(5.0)) < 3e-7 * exp(5.0), "positive arguments work too");
}

/* The SwiGLU against silu(g) * u in double: relative error, and the edges. */
static void check_swiglu(const kvg_attn_kernels *g)
{
    double worst = 0.0;
    int n = 0, edges = 1;
    float v[1];
    for (float x = -86.0f; x <= 86.0f; x += 0.00731f, n++) {
        double want = (double)x / (1.0 + exp(-(double)x)) * 1.5;
        float u = 1.5f, got;
        v[0] = x;
        g->swiglu(v, &u, 1);
        got = v[0];
        if (want != 0.0 && fabs(got - want) / fabs(want) > worst)
            worst = fabs(got - want) / fabs(want);
    }
    ok(worst < 1e-6, "SwiGLU relative error %.3g over %d points of [-86, 86]", worst, n);
    {
        float in[] = { 0.0f, -0.0f, INFINITY, -100.0f, 100.0f, NAN }, u[] = { 2, 2, 2, 2, 2, 2 };
        g->swiglu(in, u, 6);
        edges &= in[0] == 0.0f && in[1] == 0.0f && isinf(in[2]) && in[2] > 0;
        edges &= in[3] == 0.0f && in[4] == 200.0f && isnan(in[5]);
    }
    ok(edges, "SwiGLU: silu(+-0) = 0, silu(inf) = inf, silu(-100) = 0, silu(100) = 100, NaN stays NaN");
}

int main(void)
{
    const kvg_attn_kernels *g = kvg_attn_kernels_isa("generic"), *k;
    ok(g != NULL, "generic kernels exist");
    check_exp();
    check_generic(g);
    check_swiglu_oai();
    check_geglu(g);
    check_swiglu(g);
    compare("generic (its rows' kernels)", g, g);
    compare_i8("generic", g, g);
    if ((k = kvg_attn_kernels_isa("avx2"))) {
        compare("avx2", k, g);
        compare_i8("avx2", k, g);
    } else
        diag("no AVX2 + FMA on this CPU: avx2 kernels not run");
    if ((k = kvg_attn_kernels_isa("avx512"))) {
        compare("avx512 (native)", k, g);
        compare_i8("avx512 (native)", k, g);
    } else
        diag("no AVX-512 on this CPU: native avx512 kernels not run");
#if HAVE_EMULATION
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        kvg_attn_kernels emu = { emu_scores4,  emu_scores1,      emu_vacc,     emu_softmax,
                                 emu_scores4_rows, emu_vacc_rows, emu_swiglu, emu_swiglu_oai,
                                 emu_geglu, emu_scores4_i8, emu_scores1_i8, emu_vacc_i8,
                                 emu_scores4_rows_i8, emu_vacc_rows_i8 };
        compare("avx512 (emulated with SIMDe)", &emu, g);
        compare_i8("avx512 (emulated with SIMDe)", &emu, g);
    } else {
        diag("no AVX2 + FMA: the emulated avx512 kernels need them");
    }
#else
    diag("SIMDe not available: emulated avx512 kernels not run");
#endif
    ok(kvg_attn_kernels_isa("sse9") == NULL, "unknown ISA: NULL");
    return done_testing();
}
