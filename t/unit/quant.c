/* GGUF quantized weights (Q8_0, Q4_0, Q4_K, Q6_K, MXFP4):
 *   - src/quant.c's dequantization against a reference written here, independently,
 *     from the block layouts (random blocks, edge values);
 *   - quantize -> dequantize error bounds of the reference quantizers;
 *   - kvg_gemm on quantized W equals the int8 definition (engine/cpu/gemm_int8.h,
 *     re-derived here) bit for bit, within its bound of the F32 product over the
 *     dequantized W, at every M, thread count and ISA;
 *   - a small quantized GGUF model (Q4_K with Q6_K tensors, as a Q4_K_M file; and
 *     Q8_0 with Q4_0) loads, and its logits stay within 2% of the range of those of
 *     the F32 model written from its dequantized weights, with the same greedy token;
 *     chunking and batching change no bit; its id differs from the F32 file's (and
 *     MXFP4 with a Q8_0 matrix, the tied embedding MXFP4 too); an unsupported type is
 *     refused by name, and so is MXFP4 for a norm vector (matrices only);
 *   - MXFP4: a block dequantized against values worked out by hand from the OCP
 *     MX spec (E8M0 scale 2^(e-127), E2M1 elements), the scale byte's extremes, and
 *     the quantizer's round trip (exact on representable blocks, bounded otherwise);
 *   - the other layout the backend prepares: float matrices (F32, F16, BF16) that the
 *     file puts off a 64-byte boundary (GGUF aligns to 32) are copied onto one, the
 *     same bytes and the same products at every M and ISA; on a GGUF model whose
 *     tensors all start 32 bytes off, the file's pages of them leave the resident set
 *     (a tied embedding's rows are then read from the copy, so a step brings none
 *     back) and the logits are those of the same model from an aligned file. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"
#include "backend.h"
#include "cpu/gemm.h"
#include "cpu/gemm_kernels.h"
#include "cpu/gemm_testing.h"
#include "cpu/threadpool.h"
#include "engine_testmodel.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "model_testing.h"
#include "model_writers.h"
#include "quant.h"
#include "quant_testing.h"

static uint64_t rs = 0x1234567;
static uint32_t rnd32(void)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rs >> 32);
}

/* ---- the independent reference (from the ggml block layouts) ---- */

static float ref_half(const uint8_t *p)
{
    int h = p[0] | p[1] << 8, e = h >> 10 & 31, man = h & 1023;
    double v = e == 0 ? ldexp(man, -24) : ldexp(man + 1024, e - 25);
    return (float)(h & 0x8000 ? -v : v);
}

static void ref_q8_0(const uint8_t *b, float *y)
{
    float d = ref_half(b);
    for (int i = 0; i < 32; i++)
        y[i] = d * (float)(int8_t)b[2 + i];
}

static void ref_q4_0(const uint8_t *b, float *y)
{
    float d = ref_half(b);
    for (int i = 0; i < 32; i++) {
        int nib = i < 16 ? (b[2 + i] & 15) : (b[2 + i - 16] >> 4);
        y[i] = d * (float)(nib - 8);
    }
}

/* scales[12]: bytes 0-3 hold sc0-3 (low 6 bits) and the top 2 bits of sc4-7; bytes
 * 4-7 mins 0-3 and the top bits of mins 4-7; bytes 8-11 the low nibbles of sc4-7 (low)
 * and mins 4-7 (high). */
static void ref_q4_k_sub(const uint8_t *b, int sb, int *sc, int *mn)
{
    const uint8_t *s = b + 4;
    if (sb < 4) {
        *sc = s[sb] % 64;
        *mn = s[sb + 4] % 64;
    } else {
        *sc = s[sb + 4] % 16 + 16 * (s[sb - 4] / 64);
        *mn = s[sb + 4] / 16 + 16 * (s[sb] / 64);
    }
}

static void ref_q4_k(const uint8_t *b, float *y)
{
    float d = ref_half(b), dmin = ref_half(b + 2);
    const uint8_t *q = b + 16;
    for (int sb = 0; sb < 8; sb++) {
        int sc, mn;
        ref_q4_k_sub(b, sb, &sc, &mn);
        float a = d * (float)sc, c = dmin * (float)mn;
        for (int i = 0; i < 32; i++) {
            int byte = q[32 * (sb / 2) + i];
            int v = sb % 2 ? byte / 16 : byte % 16;
            float t = a * (float)v;
            y[32 * sb + i] = t - c;
        }
    }
}

/* ggml's loop: two halves of 128; ql advances 64, qh 32, scales 8 per half. */
static void ref_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = ref_half(b + 208);
    for (int half = 0; half < 2; half++) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32;
            int q2 = ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32;
            int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
            int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
            y[l] = (d * (float)sc[is]) * (float)q1;
            y[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
            y[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
            y[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* The 256 values q - 32 of a Q6_K block, by the same loop. */
static void ref_q6_k_ints(const uint8_t *b, int *q)
{
    const uint8_t *ql = b, *qh = b + 128;
    for (int half = 0; half < 2; half++) {
        for (int l = 0; l < 32; l++) {
            q[l] = ((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32;
            q[l + 32] = ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32;
            q[l + 64] = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
            q[l + 96] = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
        }
        q += 128;
        ql += 64;
        qh += 32;
    }
}

/* A random finite half: edge values now and then (zero, -0, subnormal, large, negative). */
static void rand_half(uint8_t *p)
{
    uint16_t h;
    switch (rnd32() % 8) {
    case 0: h = 0; break;
    case 1: h = 0x8000; break;
    case 2: h = (uint16_t)(rnd32() % 1024 | (rnd32() & 0x8000)); break;            /* subnormal */
    case 3: h = (uint16_t)(0x7bff | (rnd32() & 0x8000)); break;                     /* +-65504 */
    default: h = (uint16_t)(rnd32() % 0x7c00 | (rnd32() & 0x8000)); break;
    }
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static void rand_block(kvg_qtype t, uint8_t *b)
{
    size_t n = kvg_quant_block_bytes(t);
    int mode = (int)(rnd32() % 4);
    for (size_t i = 0; i < n; i++)
        /* 0: random; 1: all bits set (max nibbles/scales); 2: zeros; 3: random */
        b[i] = mode == 1 ? 0xff : mode == 2 ? 0 : (uint8_t)rnd32();
    switch (t) {
    case KVG_Q8_0: case KVG_Q4_0: rand_half(b); break;
    case KVG_Q4_K: rand_half(b); rand_half(b + 2); break;
    case KVG_Q6_K: rand_half(b + 208); break;
    case KVG_MXFP4: break;            /* any exponent byte is a value */
    }
}

static void test_dequant(void)
{
    static void (*const refs[4])(const uint8_t *, float *) = { ref_q8_0, ref_q4_0, ref_q4_k, ref_q6_k };
    for (int t = 0; t < 4; t++) {
        int be = kvg_quant_block_elems((kvg_qtype)t), bad = 0;
        size_t bb = kvg_quant_block_bytes((kvg_qtype)t);
        uint8_t blk[4][256];
        float a[4 * 256], r[4 * 256];
        for (int it = 0; it < 2000 && !bad; it++) {
            for (int i = 0; i < 4; i++)
                rand_block((kvg_qtype)t, blk[0] + i * bb);
            /* blocks are contiguous: blk is used as one row of 4 blocks */
            kvg_dequant_row((kvg_qtype)t, blk, a, 4 * be);
            for (int i = 0; i < 4; i++)
                refs[t](blk[0] + i * bb, r + i * be);
            if (memcmp(a, r, (size_t)(4 * be) * sizeof(float)) != 0)
                bad = 1;
        }
        ok(!bad, "%s: dequantization equals the reference on 8000 random blocks (edge values included)",
           kvg_quant_name((kvg_qtype)t));
    }
    ok(kvg_quant_block_bytes(KVG_Q8_0) == 34 && kvg_quant_block_bytes(KVG_Q4_0) == 18 &&
       kvg_quant_block_bytes(KVG_Q4_K) == 144 && kvg_quant_block_bytes(KVG_Q6_K) == 210 &&
       kvg_dtype_block_bytes(KVG_DT_Q4_K) == 144 && kvg_dtype_row_bytes(KVG_DT_Q6_K, 512) == 420 &&
       kvg_dtype_row_bytes(KVG_DT_F16, 10) == 20 && kvg_dtype_size(KVG_DT_Q8_0) == 0 &&
       kvg_dtype_is_quant(KVG_DT_Q4_0) && !kvg_dtype_is_quant(KVG_DT_BF16), "block sizes");
    kvg_qtype q;
    ok(kvg_quant_ggml_type(KVG_Q4_0) == 2 && kvg_quant_ggml_type(KVG_Q8_0) == 8 &&
       kvg_quant_ggml_type(KVG_Q4_K) == 12 && kvg_quant_ggml_type(KVG_Q6_K) == 14 &&
       kvg_quant_from_ggml(14, &q) == 0 && q == KVG_Q6_K && kvg_quant_from_ggml(7, &q) == -1 &&
       kvg_quant_from_ggml(39, &q) == 0 && q == KVG_MXFP4 && KVG_QTYPE_ENGINE_LAST == KVG_MXFP4 &&
       kvg_dtype_is_quant(KVG_DT_MXFP4) && kvg_dtype_row_bytes(KVG_DT_MXFP4, 2880) == 90 * 17 &&
       strcmp(kvg_dtype_name(KVG_DT_MXFP4), "MXFP4") == 0,
       "GGML type ids");
}

static float gauss(void);

/* One block by hand: e = 126 (scale 2^(126-127) = 1/2), qs[j] = j | (15 - j) << 4, so
 * element j < 16 holds E2M1 code j and element 16 + j code 15 - j. E2M1 (sign bit 3,
 * then 2 exponent bits with bias 1 and 1 mantissa bit): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
 * their negatives (code 8 is -0). Element = E2M1 value * 1/2. */
static void test_mxfp4(void)
{
    static const float want[32] = {
        0, 0.25f, 0.5f, 0.75f, 1, 1.5f, 2, 3, -0.0f, -0.25f, -0.5f, -0.75f, -1, -1.5f, -2, -3,
        -3, -2, -1.5f, -1, -0.75f, -0.5f, -0.25f, -0.0f, 3, 2, 1.5f, 1, 0.75f, 0.5f, 0.25f, 0,
    };
    uint8_t b[17 * 4], q[17 * 4];
    float y[128], z[128];
    b[0] = 126;
    for (int j = 0; j < 16; j++)
        b[1 + j] = (uint8_t)(j | (15 - j) << 4);
    kvg_dequant_row(KVG_MXFP4, b, y, 32);
    int same = 1;
    for (int j = 0; j < 32; j++)
        same &= y[j] == want[j];
    ok(same, "MXFP4: a block dequantizes to the values worked out from the spec");
    ok(kvg_quant_block_elems(KVG_MXFP4) == 32 && kvg_quant_block_bytes(KVG_MXFP4) == 17 &&
       kvg_quant_ggml_type(KVG_MXFP4) == 39 && strcmp(kvg_quant_name(KVG_MXFP4), "MXFP4") == 0,
       "MXFP4: 32 elements in 17 bytes, GGML type 39");
    ok(kvg_mxfp4_scale(0) == ldexpf(1, -128) && kvg_mxfp4_scale(1) == ldexpf(1, -127) &&
       kvg_mxfp4_scale(2) == ldexpf(1, -126) && kvg_mxfp4_scale(127) == 0.5f && kvg_mxfp4_scale(255) == ldexpf(1, 127),
       "MXFP4: the scale byte reads 2^(e-128) from 0 (a subnormal) to 255 (no NaN)");

    /* Representable blocks (dequantized random ones, exponents in the normal range)
     * quantize back to the same values. */
    int exact = 1;
    for (int it = 0; it < 2000; it++) {
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (uint8_t)rnd32();
        for (int k = 0; k < 4; k++)
            b[17 * k] = (uint8_t)(20 + rnd32() % 200);
        kvg_dequant_row(KVG_MXFP4, b, y, 128);
        exact &= kvg_quant_row(KVG_MXFP4, y, q, 128) == 0;
        kvg_dequant_row(KVG_MXFP4, q, z, 128);
        for (int i = 0; i < 128; i++)
            exact &= z[i] == y[i];
    }
    ok(exact, "MXFP4: 8000 representable blocks round-trip exactly");

    /* Any block: the scale puts max |x| = A in [4, 8) units, so the grid step is at most
     * 2 units up to 6 and values above 6 units clip: every error is at most A/4 below the
     * clip and A/2 above it; a block of zeros stays zeros. */
    double worst = 0;
    int bounded = 1;
    for (int it = 0; it < 500; it++) {
        float x[128];
        for (int i = 0; i < 128; i++)
            x[i] = it == 0 ? 0.0f : gauss() * (it % 3 ? 1.0f : 1e-3f);
        kvg_quant_row(KVG_MXFP4, x, q, 128);
        kvg_dequant_row(KVG_MXFP4, q, z, 128);
        for (int k = 0; k < 4; k++) {
            double A = 0;
            for (int i = 32 * k; i < 32 * k + 32; i++)
                A = fmax(A, fabs(x[i]));
            for (int i = 32 * k; i < 32 * k + 32; i++) {
                double e = fabs((double)z[i] - x[i]);
                if (A > 0)
                    worst = fmax(worst, e / A);
                bounded &= e <= A / 2 && (A > 0 || z[i] == 0);
            }
        }
    }
    ok(bounded, "MXFP4: quantize -> dequantize within half of each block's max |x| (worst %.3g)", worst);
}

static float gauss(void)
{
    double u = ((double)rnd32() + 1) / 4294967297.0, v = (double)rnd32() / 4294967296.0;
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* Round trip: per block of 32 (Q8_0, Q4_0) or 256 (Q4_K, Q6_K) with A = max |x| of the
 * block, |dequant(quant(x)) - x| <= A/254 (Q8_0: half a step of A/127), A/8 (Q4_0: one
 * step, the side opposite the largest element clips at +7), 0.09 A (Q4_K: half a step
 * of its sub-block's range/15 rounded up to a multiple of d, plus dmin), 0.021 A (Q6_K).
 * Each with 1% slack for the f16 scales. */
static void test_roundtrip(void)
{
    static const double bound[4] = { 1.0 / 254, 1.0 / 8, 0.09, 0.021 };
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint8_t *q = malloc(N * 2);
    for (int t = 0; t < 4; t++) {
        int be = kvg_quant_block_elems((kvg_qtype)t), okk = 1;
        double worst = 0, se = 0, sx = 0;
        for (int it = 0; it < 8; it++) {
            for (int i = 0; i < N; i++) {
                float g = gauss() * (it % 2 ? 0.02f : 1.0f);
                x[i] = i % 97 == 0 ? g * 8 : it == 7 && i % 512 < 32 ? 0.0f : g;   /* outliers, zero runs */
                if (it == 6)
                    x[i] = fabsf(x[i]) + 0.5f;                                      /* all positive */
            }
            okk &= kvg_quant_row((kvg_qtype)t, x, q, N) == 0;
            kvg_dequant_row((kvg_qtype)t, q, y, N);
            for (int b0 = 0; b0 < N; b0 += be) {
                double A = 0, e = 0;
                for (int i = b0; i < b0 + be; i++) {
                    A = fmax(A, fabs(x[i]));
                    e = fmax(e, fabs((double)y[i] - x[i]));
                    se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
                    sx += (double)x[i] * x[i];
                }
                if (A > 0 && e / A > worst)
                    worst = e / A;
                if (e > bound[t] * 1.01 * A)
                    okk = 0;
            }
        }
        ok(okk, "%s: round trip within %.3g of each block's max |x| (worst %.3g, relative RMS error %.3g)",
           kvg_quant_name((kvg_qtype)t), bound[t], worst, sqrt(se / sx));
    }
    ok(kvg_quant_row(KVG_Q4_K, x, q, 100) == -1, "a row that is not whole blocks is refused");
    free(x);
    free(y);
    free(q);
}

/* ---- GEMM ---- */

static kvg_dtype dt_of(kvg_qtype t)
{
    return (kvg_dtype)(KVG_DT_Q8_0 + (int)t);
}

/* The int8 product of Q8_0 / Q4_0 / Q4_K / Q6_K / MXFP4 (engine/cpu/gemm_int8.h's
 * definition), written here from that text alone: X rounded to int8 per block of 32,
 * exact integer block sums, one float chain per output (Q4_K: its three steps per
 * block; Q6_K: one step per sub-block of 16; MXFP4: the codes' E2M1 values doubled,
 * -12..12, and 2^(e - 128) for dw). Also the
 * bound on its distance from the F32 product over the dequantized W, per output: sum
 * over blocks of (amax / 254) * sum |w|, the most that rounding X can move it. */
static void ref_int8(const float *x, int M, int K, const uint8_t *wq, kvg_qtype t, int N, const float *bias,
                     float *y, double *bound)
{
    static const int e2m1x2[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };
    size_t bb = t == KVG_Q8_0 ? 34 : t == KVG_MXFP4 ? 17 : 18, rb = (size_t)(K / 32) * bb;
    if (t == KVG_Q4_K || t == KVG_Q6_K)
        rb = (size_t)(K / 256) * (t == KVG_Q4_K ? 144 : 210);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc = 0;
            double bnd = 0;
            for (int b = 0; b < K / 32; b++) {
                const float *xb = x + (size_t)m * K + 32 * b;
                const uint8_t *blk = wq + (size_t)n * rb + (size_t)b * bb;
                const uint8_t *sb = wq + (size_t)n * rb + (size_t)(b / 8) * (t == KVG_Q6_K ? 210 : 144);
                float amax = 0, d, id, ds = 0, dm = 0;
                int finite = 1, q[32], sc, mn;
                long isum = 0, sx = 0;
                double wsum = 0;
                if (t == KVG_Q4_K) {
                    ref_q4_k_sub(sb, b % 8, &sc, &mn);
                    ds = ref_half(sb) * (float)sc;
                    dm = ref_half(sb + 2) * (float)mn;
                }
                for (int k = 0; k < 32; k++) {
                    finite &= isfinite(xb[k]);
                    if (fabsf(xb[k]) > amax)
                        amax = fabsf(xb[k]);
                }
                d = finite ? amax / 127.0f : NAN;
                id = finite && d > 0 && isfinite(1.0f / d) ? 1.0f / d : 0.0f;
                for (int k = 0; k < 32; k++) {
                    int w = 0;
                    if (t == KVG_Q6_K) {
                        /* below, per sub-block of 16 */
                    } else if (t == KVG_Q4_K) {
                        int byte = sb[16 + 32 * (b % 8 / 2) + k];
                        w = b % 2 ? byte / 16 : byte % 16;
                    } else if (t == KVG_MXFP4) {
                        w = e2m1x2[k < 16 ? blk[1 + k] & 15 : blk[1 + k - 16] >> 4];
                    } else {
                        w = t == KVG_Q8_0 ? (int8_t)blk[2 + k] : (k < 16 ? blk[2 + k] & 15 : blk[2 + k - 16] >> 4) - 8;
                    }
                    q[k] = finite ? (int)nearbyintf(xb[k] * id) : 0;
                    isum += (long)w * q[k];
                    sx += q[k];
                    wsum += t == KVG_Q4_K ? fabs((double)ds * w - dm)
                            : t == KVG_MXFP4 ? fabs(ldexp(w, blk[0] - 128)) : fabs(ref_half(blk) * (double)w);
                }
                if (t == KVG_Q6_K) {
                    /* Per sub-block of 16: o = sum (q6 - 32) q, acc = fma(d * dx, sc * o). */
                    int q6[256];
                    ref_q6_k_ints(sb, q6);
                    wsum = 0;
                    for (int h = 0; h < 2; h++) {
                        int sc6 = (int8_t)sb[192 + 2 * (b % 8) + h];
                        long o = 0;
                        for (int k = 16 * h; k < 16 * h + 16; k++) {
                            o += (long)q6[32 * (b % 8) + k] * q[k];
                            wsum += fabs((double)ref_half(sb + 208) * sc6 * q6[32 * (b % 8) + k]);
                        }
                        acc = fmaf(ref_half(sb + 208) * d, (float)(sc6 * o), acc);
                    }
                } else if (t == KVG_Q4_K) {
                    float u = dm * (float)sx;
                    acc = fmaf(d, fmaf(ds, (float)isum, -u), acc);
                } else if (t == KVG_MXFP4) {
                    acc = fmaf(ldexpf(1.0f, blk[0] - 128) * d, (float)isum, acc);
                } else {
                    acc = fmaf(ref_half(blk) * d, (float)isum, acc);
                }
                bnd += amax / 254.0 * wsum;
            }
            y[(size_t)m * N + n] = bias ? acc + bias[n] : acc;
            if (bound)
                bound[(size_t)m * N + n] = bnd;
        }
}

/* memcmp, except that any NaN equals any NaN (a NaN's payload is not part of the
 * definition). */
static int same_floats(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(isnan(a[i]) && isnan(b[i])) && memcmp(a + i, b + i, sizeof(float)) != 0)
            return 0;
    return 1;
}

static void test_gemm(void)
{
    static const int Ms[] = { 1, 2, 3, 4, 5, 7, 8, 9, 31, 64 };
    const int N = 37;
    int n_isa = 0;
    for (int isa = 0; isa <= KVG_ISA_AVX512; isa++)
        n_isa += kvg_gemm_isa_supported((kvg_gemm_isa_id)isa);
    diag("ISAs on this CPU: %d (up to %s)", n_isa, kvg_gemm_isa_name((kvg_gemm_isa_id)(n_isa - 1)));
    for (int t = 0; t <= KVG_MXFP4; t++) {
        /* 160: five blocks (MXFP4's layout: a four and a last partial one) */
        int K = kvg_quant_block_elems((kvg_qtype)t) == 32 ? 160 : 512;
        kvg_dtype dt = dt_of((kvg_qtype)t);
        size_t rb = kvg_dtype_row_bytes(dt, K);
        float *wf = malloc((size_t)N * K * sizeof *wf), *x = malloc((size_t)64 * K * sizeof *x);
        float *bias = malloc((size_t)N * sizeof *bias);
        float *y0 = malloc((size_t)64 * N * sizeof *y0), *y1 = malloc((size_t)64 * N * sizeof *y1);
        float *y2 = malloc((size_t)64 * N * sizeof *y2), *yf = malloc((size_t)64 * N * sizeof *yf);
        double *bound = malloc((size_t)64 * N * sizeof *bound);
        uint8_t *wq = malloc((size_t)N * rb);
        for (int i = 0; i < N * K; i++)
            wf[i] = gauss();
        for (int n = 0; n < N; n++)
            kvg_quant_row((kvg_qtype)t, wf + (size_t)n * K, wq + (size_t)n * rb, K);
        /* Some raw blocks too: extreme nibbles and scales the quantizer never makes. */
        for (int n = 0; n < N; n += 5)
            rand_block((kvg_qtype)t, wq + (size_t)n * rb);
        for (int n = 0; n < N; n++)
            kvg_dequant_row((kvg_qtype)t, wq + (size_t)n * rb, wf + (size_t)n * K, K);
        for (int i = 0; i < 64 * K; i++)
            x[i] = gauss();
        /* X rows the int8 rounding must take in its stride: a zero block, a block of
         * subnormals (its scale's reciprocal overflows), exact halves (ties to even),
         * a non-finite value (that row's outputs are NaN). */
        for (int k = 0; k < 32; k++) {
            x[(size_t)5 * K + k] = 0;
            x[(size_t)6 * K + 32 + k] = 1e-42f * (float)(k - 16);
            x[(size_t)9 * K + k] = (float)(k - 16) * 0.5f + (k == 0 ? 127 : 0);
        }
        x[(size_t)7 * K + 40] = INFINITY;
        x[(size_t)8 * K + 70] = NAN;
        for (int n = 0; n < N; n++)
            bias[n] = gauss();
        /* Keep the products finite (random scales reach 65504). */
        for (int i = 0; i < N * K; i++)
            if (!isfinite(wf[i]))
                wf[i] = 0;
        kvg_tensor tq = { wq, dt, N, K }, tf = { wf, KVG_DT_F32, N, K }, tpre;
        int prep = kvg_gemm_prepare(NULL, &tq, &tpre);
        ok(prep == 1 && tpre.data != wq, "%s: kvg_gemm_prepare repacks it", kvg_quant_name((kvg_qtype)t));
        int same = 1, calls = 0, rc = 0;
        for (int th = 1; th <= 3; th++) {
            kvg_threadpool *tp = kvg_threadpool_new(th);
            kvg_gemm_ws *ws = kvg_gemm_ws_new(th, K, K);
            rc |= kvg_gemm_ws_reserve(ws, 64);
            for (int isa = 0; isa <= KVG_ISA_AVX512; isa++) {
                if (!kvg_gemm_isa_supported((kvg_gemm_isa_id)isa))
                    continue;
                for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                    int M = Ms[mi];
                    const float *b = mi % 2 ? bias : NULL;
                    size_t ny = (size_t)M * N;
                    /* The reference: the int8 definition. */
                    ref_int8(x, M, K, wq, (kvg_qtype)t, N, b, y0, NULL);
                    for (int lay = 0; lay < 2; lay++) {
                        const kvg_tensor *w = lay ? &tpre : &tq;
                        rc |= kvg_gemm_with_isa((kvg_gemm_isa_id)isa, tp, ws, x, M, K, w, b, y1);
                        same &= same_floats(y0, y1, ny);
                        /* Unpacked / no workspace (int8: X quantized on the stack). */
                        rc |= kvg_gemm_with_isa((kvg_gemm_isa_id)isa, tp, NULL, x, M, K, w, b, y1);
                        same &= same_floats(y0, y1, ny);
                        /* Two products of one X in one job (q/k/v, gate/up): each the same. */
                        const kvg_tensor *two[2] = { w, w };
                        const float *bs[2] = { b, NULL };
                        float *ys[2] = { y1, y2 };
                        rc |= kvg_gemm_multi_with_isa((kvg_gemm_isa_id)isa, tp, ws, x, M, K, 2, two, bs, ys);
                        same &= same_floats(y0, y1, ny);
                        ref_int8(x, M, K, wq, (kvg_qtype)t, N, NULL, yf, NULL);
                        same &= same_floats(yf, y2, ny);
                        calls += 4;
                    }
                }
            }
            kvg_gemm_ws_free(ws);
            kvg_threadpool_free(tp);
        }
        ok(!rc && same, "%s: kvg_gemm == the int8 definition, bit for bit, on the file's layout and the "
           "repacked one (%d products: M 1..64, threads 1-3, every ISA, with a workspace and without, "
           "alone and two in one job)", kvg_quant_name((kvg_qtype)t), calls);
        {
            /* Against the F32 product over the dequantized W, on the finite rows and
             * the finite weights (the raw random blocks excluded): within the bound
             * of X's rounding, plus 1e-5 of sum |x w| for float rounding. */
            int within = 1, nan_rows = 1;
            double worst = 0;
            ref_int8(x, 64, K, wq, (kvg_qtype)t, N, NULL, y1, bound);
            rc |= kvg_gemm_with_isa(KVG_ISA_GENERIC, NULL, NULL, x, 64, K, &tf, NULL, yf);
            for (int m = 0; m < 64; m++)
                for (int n = 0; n < N; n++) {
                    size_t i = (size_t)m * N + n;
                    double sxw = 0;
                    if (m == 7 || m == 8) {
                        nan_rows &= isnan(y1[i]);
                        continue;
                    }
                    if (n % 5 == 0)
                        continue;
                    for (int k = 0; k < K; k++)
                        sxw += fabs((double)x[(size_t)m * K + k] * wf[(size_t)n * K + k]);
                    double e = fabs((double)y1[i] - yf[i]);
                    if (e > bound[i] * 1.001 + 1e-5 * sxw + 1e-30)
                        within = 0;
                    if (bound[i] > 0 && e / bound[i] > worst)
                        worst = e / bound[i];
                }
            ok(within, "%s: the int8 product is within its bound of the F32 product over the dequantized W "
               "(worst %.2f of the bound)", kvg_quant_name((kvg_qtype)t), worst);
            ok(nan_rows, "%s: a row with an infinity or a NaN gives NaN outputs", kvg_quant_name((kvg_qtype)t));
        }
        {
            /* A workspace for int8 products only holds no packed-X buffer, and gives the
             * same bits; float products through it run unpacked, also the same bits. */
            kvg_threadpool *tp = kvg_threadpool_new(2);
            kvg_gemm_ws *both = kvg_gemm_ws_new(2, K, K), *only = kvg_gemm_ws_new(2, K, K);
            kvg_gemm_ws_kinds(only, 0, 1);
            rc |= kvg_gemm_ws_reserve(both, 64) | kvg_gemm_ws_reserve(only, 64);
            ref_int8(x, 64, K, wq, (kvg_qtype)t, N, bias, y0, NULL);
            rc |= kvg_gemm(tp, only, x, 64, K, &tpre, bias, y1);
            int same_only = same_floats(y0, y1, (size_t)64 * N);
            rc |= kvg_gemm(tp, only, x, 64, K, &tf, bias, y1);
            rc |= kvg_gemm(tp, both, x, 64, K, &tf, bias, y2);
            same_only &= memcmp(y1, y2, (size_t)64 * N * sizeof(float)) == 0;
            ok(!rc && same_only && kvg_gemm_ws_bytes(only) + (size_t)64 * K * 4 <= kvg_gemm_ws_bytes(both),
               "%s: a workspace for int8 products only: %zu bytes instead of %zu, the same bits (float "
               "products through it too)", kvg_quant_name((kvg_qtype)t), kvg_gemm_ws_bytes(only),
               kvg_gemm_ws_bytes(both));
            kvg_gemm_ws_free(both);
            kvg_gemm_ws_free(only);
            kvg_threadpool_free(tp);
        }
        kvg_tensor bad = { wq, dt, N, K - 16 };
        ok(kvg_gemm(NULL, NULL, x, 1, K - 16, &bad, NULL, y1) == -1, "%s: K not a multiple of the block: -1",
           kvg_quant_name((kvg_qtype)t));
        kvg_gemm_prepared_free(&tpre);
        free(wf);
        free(x);
        free(bias);
        free(y0);
        free(y1);
        free(y2);
        free(yf);
        free(bound);
        free(wq);
    }
}

/* ---- a quantized model ---- */

typedef struct rig {
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
} rig;

static int rig_new(rig *r, const kvg_model *m, int threads)
{
    char err[256];
    kvg_kv_geom g;
    memset(r, 0, sizeof *r);
    r->be = kvg_backend_cpu_new(m, threads, err, sizeof err);
    kvg_forward_kv_geom(m, 16, &g);
    r->kv = r->be ? kvg_kv_pool_new(&g, 64, err, sizeof err) : NULL;
    r->fw = r->kv ? kvg_forward_new(m, r->be, r->kv, err, sizeof err) : NULL;
    if (!r->fw)
        diag("rig: %s", err);
    return r->fw ? 0 : -1;
}

static void rig_free(rig *r)
{
    kvg_forward_free(r->fw);
    kvg_kv_pool_free(r->kv);
    kvg_backend_free(r->be);
}

enum { NP = 21, NC = 4 };

/* The prompt in chunks of `chunk` (0: whole), then NC tokens one at a time; logits
 * after the prompt and each continuation token into out[(NC + 1) * V]. With `other`,
 * every step also runs a second sequence (other tokens) in the same batch. */
static int run(const kvg_model *m, int threads, const int32_t *toks, int chunk, int other, float *out)
{
    rig r;
    char err[256];
    int V = m->cfg.vocab_size, rc = 0;
    kvg_kv_seq s = { 0 }, s2 = { 0 };
    float *scratch = malloc((size_t)V * sizeof(float));
    int32_t t2[NP + NC];
    for (int i = 0; i < NP + NC; i++)
        t2[i] = (toks[i] * 7 + 3) % V;
    if (rig_new(&r, m, threads) < 0) {
        free(scratch);
        return -1;
    }
    int fed = 0;
    while (fed < NP + NC && rc == 0) {
        int n = fed < NP ? (chunk == 0 ? NP : chunk) : 1;
        if (fed < NP && n > NP - fed)
            n = NP - fed;
        int end = fed + n;
        kvg_fwd_seq b[2] = { { &s, toks + fed, n, end >= NP ? out + (size_t)(end - NP) * V : NULL },
                             { &s2, t2 + fed, n, scratch } };
        rc = kvg_forward_step(r.fw, b, other ? 2 : 1, err, sizeof err);
        if (rc)
            diag("step: %s", err);
        fed = end;
    }
    kvg_kv_seq_release(r.kv, &s);
    kvg_kv_seq_release(r.kv, &s2);
    rig_free(&r);
    free(scratch);
    return rc;
}

/* Pages of [p, p + len) (whole pages only) mapped in this process, from
 * /proc/self/pagemap (bit 63: present); -1 when it cannot be read. */
static long present_pages(const void *p, size_t len, long *total)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) / page, hi = ((uintptr_t)p + len) / page;
    long n = 0;
    int fd = open("/proc/self/pagemap", O_RDONLY);
    *total = hi > lo ? (long)(hi - lo) : 0;
    if (fd < 0)
        return -1;
    for (uintptr_t i = lo; i < hi; i++) {
        uint64_t e;
        if (pread(fd, &e, sizeof e, (off_t)(i * sizeof e)) != (ssize_t)sizeof e) {
            close(fd);
            return -1;
        }
        n += (long)(e >> 63);
    }
    close(fd);
    return n;
}

/* The CPU backend repacks the quantized matrices and releases the file's copy (it
 * would otherwise hold the model twice): the pages leave the resident set, the
 * forward pass never touches them, and a later reader gets the same bytes back. */
static void test_released(const char *label, const kvg_model *mq)
{
    const kvg_tensor *w = &mq->layers[0].w_gate;
    size_t bytes = kvg_dtype_row_bytes(w->dtype, w->cols) * (size_t)w->rows;
    unsigned char *copy = malloc(bytes);
    long total, before, after, stepped;
    rig r;
    char err[256];
    kvg_kv_seq s = { 0 };
    int32_t toks[3] = { 1, 5, 9 };

    memcpy(copy, w->data, bytes);
    before = present_pages(w->data, bytes, &total);
    if (before < 0 || total < 4) {
        ok(1, "# SKIP %s: /proc/self/pagemap unreadable or the matrix spans under 4 pages", label);
        free(copy);
        return;
    }
    if (rig_new(&r, mq, 2) < 0) {
        ok(0, "%s: backend for the release check", label);
        free(copy);
        return;
    }
    after = present_pages(w->data, bytes, &total);
    kvg_fwd_seq b = { &s, toks, 3, NULL };
    int rc = kvg_forward_step(r.fw, &b, 1, err, sizeof err);
    stepped = present_pages(w->data, bytes, &total);
    kvg_kv_seq_release(r.kv, &s);
    rig_free(&r);
    ok(before == total && after == 0 && rc == 0 && stepped == 0,
       "%s: the file's copy of blk.0.ffn_gate leaves the resident set once repacked (%ld of %ld pages "
       "before, %ld after, %ld after a forward step)", label, before, total, after, stepped);
    ok(memcmp(copy, w->data, bytes) == 0, "%s: read again, the released bytes are the file's", label);
    free(copy);
}

/* ---- float matrices off a 64-byte boundary ---- */

static void test_float_prepare(void)
{
    static const kvg_dtype dts[] = { KVG_DT_F32, KVG_DT_F16, KVG_DT_BF16 };
    static const int Ms[] = { 1, 3, 7, 40 };
    enum { N = 37, K = 64 };
    float x[40 * K], y1[40 * N], y2[40 * N];
    for (int i = 0; i < 40 * K; i++)
        x[i] = (float)(rnd32() % 2001) / 1000.0f - 1.0f;
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        kvg_dtype dt = dts[d];
        size_t rb = kvg_dtype_row_bytes(dt, K), bytes = rb * N;
        unsigned char *buf = aligned_alloc(64, (bytes + 64 + 63) / 64 * 64);
        for (size_t e = 0; e < (size_t)N * K; e++) {
            float f = (float)(rnd32() % 2001) / 1000.0f - 1.0f;
            uint32_t u;
            uint16_t h;
            memcpy(&u, &f, 4);
            h = dt == KVG_DT_F16 ? mw_f32_to_f16(f) : (uint16_t)(u >> 16);
            if (dt == KVG_DT_F32)
                memcpy(buf + 32 + 4 * e, &f, 4);
            else
                memcpy(buf + 32 + 2 * e, &h, 2);
        }
        kvg_tensor off = { buf + 32, dt, N, K }, on = { buf, dt, N, K }, p, q;
        int rc = kvg_gemm_prepare(NULL, &off, &p);
        ok(rc == 1 && ((uintptr_t)p.data & 63) == 0 && p.dtype == dt && p.rows == N && p.cols == K &&
               memcmp(p.data, off.data, bytes) == 0,
           "%s 32 bytes off a 64-byte boundary: kvg_gemm_prepare copies it onto one, the same bytes",
           kvg_dtype_name(dt));
        int same = 1, calls = 0;
        for (int isa = 0; rc == 1 && isa <= KVG_ISA_AVX512; isa++) {
            if (!kvg_gemm_isa_supported((kvg_gemm_isa_id)isa))
                continue;
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                int M = Ms[mi];
                same &= kvg_gemm_with_isa((kvg_gemm_isa_id)isa, NULL, NULL, x, M, K, &off, NULL, y1) == 0;
                same &= kvg_gemm_with_isa((kvg_gemm_isa_id)isa, NULL, NULL, x, M, K, &p, NULL, y2) == 0;
                same &= same_floats(y1, y2, (size_t)M * N);
                calls++;
            }
        }
        ok(rc == 1 && same && calls >= 4, "%s: products on the copy = products in place (%d M/ISA cases)",
           kvg_dtype_name(dt), calls);
        ok(kvg_gemm_prepare(NULL, &on, &q) == 0 && q.data == on.data,
           "%s on a 64-byte boundary: used where it is", kvg_dtype_name(dt));
        if (rc == 1)
            kvg_gemm_prepared_free(&p);
        free(buf);
    }
}

/* The model side: a GGUF F32 model whose tensors all start 32 bytes off a 64-byte
 * boundary. The backend copies its matrices and hands the file's pages back; the
 * tied embedding's rows come from the classifier's copy; and the logits are the bits
 * of the same weights from a file where every tensor is on a boundary. */
static void test_float_model(const char *tok)
{
    tm_spec sp = { .dim = 256, .hidden = 512, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 64,
                   .vocab = 512, .ctx = 64, .tied = 1, .seed = 11 };
    tm_model tm;
    char err[512], path[2][64];
    kvg_model_load_opts lo = { 0 };
    kvg_model *m[2] = { NULL, NULL };
    int wr = tm_build(&tm, &sp);
    for (int i = 0; i < 2; i++) {
        mw_opts o = { .dtype = KVG_DT_F32, .tok_path = tok, .misalign = i == 0, .align64 = i == 1 };
        snprintf(path[i], sizeof path[i], "/tmp/kvg_quant_%d_%s.gguf", (int)getpid(), i ? "on" : "off");
        if (wr == 0)
            wr = mw_write_gguf(&tm.m, path[i], &o, err, sizeof err);
        m[i] = wr == 0 ? kvg_model_load(path[i], &lo, err, sizeof err) : NULL;
    }
    tm_free(&tm);
    ok(m[0] && m[1], "F32 GGUF, tensors off and on 64-byte boundaries: both load%s%s", m[0] && m[1] ? "" : ": ",
       m[0] && m[1] ? "" : err);
    if (!m[0] || !m[1])
        goto out;
    const kvg_tensor *w = &m[0]->layers[0].w_gate, *emb = &m[0]->tok_embedding;
    ok(((uintptr_t)w->data & 63) == 32 && ((uintptr_t)m[1]->layers[0].w_gate.data & 63) == 0 &&
           emb->data == m[0]->output.data,
       "the files put blk.0.ffn_gate 32 bytes off a boundary and on one; the embedding is tied");
    {
        size_t bytes = kvg_dtype_row_bytes(w->dtype, w->cols) * (size_t)w->rows;
        size_t ebytes = kvg_dtype_row_bytes(emb->dtype, emb->cols) * (size_t)emb->rows;
        long total, etotal, before, after, stepped, estepped;
        rig r;
        kvg_kv_seq s = { 0 };
        int32_t toks[5] = { 1, 5, 9, 300, 511 };
        int rc = -1;
        before = present_pages(w->data, bytes, &total);
        if (before < 0 || total < 4) {
            ok(1, "# SKIP /proc/self/pagemap unreadable or the matrix spans under 4 pages");
        } else if (rig_new(&r, m[0], 2) == 0) {
            after = present_pages(w->data, bytes, &total);
            kvg_fwd_seq b = { &s, toks, 5, NULL };
            rc = kvg_forward_step(r.fw, &b, 1, err, sizeof err);
            stepped = present_pages(w->data, bytes, &total);
            estepped = present_pages(emb->data, ebytes, &etotal);
            kvg_kv_seq_release(r.kv, &s);
            rig_free(&r);
            ok(before == total && after == 0 && rc == 0 && stepped == 0 && estepped == 0,
               "the file's copy of blk.0.ffn_gate leaves the resident set once copied (%ld of %ld pages before, "
               "%ld after, %ld after a step; the tied embedding: %ld of %ld after the step)",
               before, total, after, stepped, estepped, etotal);
        } else {
            ok(0, "backend on the misaligned file");
        }
    }
    {
        int V = m[0]->cfg.vocab_size;
        size_t nb = (size_t)(NC + 1) * V * sizeof(float);
        float *a = malloc(nb), *b = malloc(nb);
        int32_t toks[NP + NC];
        int same = 1;
        for (int i = 0; i < NP + NC; i++)
            toks[i] = i == 0 ? 1 : (int32_t)(3 + rnd32() % (uint32_t)(V - 3));
        for (int th = 1; th <= 2; th++)
            same &= run(m[0], th, toks, th == 1 ? 0 : 5, 0, a) == 0 && run(m[1], th, toks, 0, th - 1, b) == 0 &&
                    memcmp(a, b, nb) == 0;
        ok(same, "the logits of the copied matrices = those of the aligned file, 1 and 2 threads");
        free(a);
        free(b);
    }
out:
    for (int i = 0; i < 2; i++) {
        kvg_model_free(m[i]);
        unlink(path[i]);
    }
}

static void test_model_one(const char *label, kvg_dtype main_dt, kvg_dtype mix_dt, const char *mix, int tied,
                           const char *tok)
{
    tm_spec sp = { .dim = 256, .hidden = 512, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 64,
                   .vocab = 512, .ctx = 64, .tied = tied, .seed = 7 };
    tm_model tm;
    char err[512], qpath[64], fpath[64];
    kvg_model_load_opts lo = { 0 };
    snprintf(qpath, sizeof qpath, "/tmp/kvg_quant_%d_q.gguf", (int)getpid());
    snprintf(fpath, sizeof fpath, "/tmp/kvg_quant_%d_f.gguf", (int)getpid());
    if (tm_build(&tm, &sp) != 0) {
        ok(0, "%s: build the test model", label);
        return;
    }
    mw_opts oq = { .dtype = main_dt, .tok_path = tok, .mix_dtype = mix_dt, .mix_match = mix };
    int wr = mw_write_gguf(&tm.m, qpath, &oq, err, sizeof err);
    tm_free(&tm);
    kvg_model *mq = wr == 0 ? kvg_model_load(qpath, &lo, err, sizeof err) : NULL;
    ok(mq != NULL, "%s: the quantized GGUF loads%s%s", label, mq ? "" : ": ", mq ? "" : err);
    if (!mq)
        goto out;
    kvg_dtype want_down = strstr("blk.1.ffn_down.weight", mix) ? mix_dt : main_dt;
    ok(mq->layers[0].wq.dtype == main_dt && mq->layers[1].w_down.dtype == want_down &&
       mq->tok_embedding.dtype == main_dt && mq->cfg.tied_embeddings == tied,
       "%s: dtypes as written (wq %s, ffn_down %s)", label, kvg_dtype_name(mq->layers[0].wq.dtype),
       kvg_dtype_name(mq->layers[1].w_down.dtype));
    /* The F32 file of the dequantized weights (the writer reads rows through
     * kvg_tensor_row_f32, which dequantizes). */
    mw_opts of = { .dtype = KVG_DT_F32, .tok_path = tok };
    kvg_model *mf = mw_write_gguf(mq, fpath, &of, err, sizeof err) == 0 ? kvg_model_load(fpath, &lo, err, sizeof err)
                                                                         : NULL;
    ok(mf && mw_max_diff(mq, mf) == 0, "%s: the F32 model holds exactly the dequantized weights", label);
    if (!mf)
        goto out_q;
    ok(strcmp(mq->id_hex, mf->id_hex) != 0, "%s: model ids differ (%.12s vs %.12s)", label, mq->id_hex,
       mf->id_hex);
    test_released(label, mq);

    int V = mq->cfg.vocab_size;
    size_t nb = (size_t)(NC + 1) * V * sizeof(float);
    float *ref = malloc(nb), *got = malloc(nb);
    int32_t toks[NP + NC];
    for (int i = 0; i < NP + NC; i++)
        toks[i] = i == 0 ? 1 : (int32_t)(3 + rnd32() % (uint32_t)(V - 3));
    int rc = run(mf, 1, toks, 0, 0, ref);
    int finite = 1;
    for (size_t i = 0; i < (size_t)(NC + 1) * V; i++)
        finite &= isfinite(ref[i]);
    ok(rc == 0 && finite, "%s: F32 model runs (finite logits)", label);
    rc = run(mq, 1, toks, 0, 0, got);
    /* Quantized products round X to int8 (engine/cpu/gemm_int8.h): the logits
     * move a little from the F32 model's; the tolerance, documented in
     * docs/operations.md, is 2% of the logits' range, and the greedy token
     * after the prompt is the same. */
    double worst = 0, rlo = INFINITY, rhi = -INFINITY;
    int same_top = 1;
    for (int r = 0; r <= NC; r++) {
        int tr = 0, tg = 0;
        for (int v = 0; v < V; v++) {
            size_t i = (size_t)r * V + v;
            worst = fmax(worst, fabs((double)got[i] - ref[i]));
            rlo = fmin(rlo, ref[i]);
            rhi = fmax(rhi, ref[i]);
            if (ref[i] > ref[(size_t)r * V + tr])
                tr = v;
            if (got[i] > got[(size_t)r * V + tg])
                tg = v;
        }
        same_top &= r > 0 || tr == tg;
    }
    ok(rc == 0 && worst <= 0.02 * (rhi - rlo) && same_top,
       "%s: quantized logits within 2%% of the range of the F32 logits of the dequantized weights "
       "(worst %.4f of %.2f), the same greedy token", label, worst, rhi - rlo);
    /* Batch invariance is exact: the quantized model's own logits are the reference. */
    memcpy(ref, got, nb);
    int all = 1;
    static const int chunks[] = { 1, 5, 8, 13 };
    for (int th = 1; th <= 3; th++)
        for (int ci = 0; ci < 4; ci++) {
            memset(got, 0, nb);
            all &= run(mq, th, toks, chunks[ci], (th + ci) % 2, got) == 0 && memcmp(ref, got, nb) == 0;
        }
    ok(all, "%s: batch invariance: prompt chunked 1/5/8/13, batched with another sequence or not, 1-3 threads: "
       "the same bits", label);
    free(ref);
    free(got);
    kvg_model_free(mf);
out_q:
    kvg_model_free(mq);
out:
    unlink(qpath);
    unlink(fpath);
}

static void test_unsupported(const char *tok)
{
    tm_spec sp = { .dim = 64, .hidden = 128, .layers = 1, .heads = 2, .kv_heads = 2, .head_dim = 32,
                   .vocab = 512, .ctx = 32, .tied = 1, .seed = 3 };
    tm_model tm;
    char err[512], path[64];
    kvg_model_load_opts lo = { 0 };
    snprintf(path, sizeof path, "/tmp/kvg_quant_%d_bad.gguf", (int)getpid());
    tm_build(&tm, &sp);
    /* Q5_1 (type 7) blocks are 24 bytes per 32: the Q8_0 data written is larger, so
     * the file is well-formed and only the type is refused. */
    mw_opts o = { .dtype = KVG_DT_Q8_0, .tok_path = tok, .bad_match = "blk.0.ffn_up", .bad_type = 7 };
    int wr = mw_write_gguf(&tm.m, path, &o, err, sizeof err);
    tm_free(&tm);
    kvg_model *m = wr == 0 ? kvg_model_load(path, &lo, err, sizeof err) : NULL;
    ok(!m && strstr(err, "Q5_1") && strstr(err, "blk.0.ffn_up.weight"), "Q5_1 is refused naming type and tensor (%s)",
       err);
    kvg_model_free(m);
    unlink(path);

    /* MXFP4 (type 39, 17 bytes per 32: the F32 data written is larger) is for matrices:
     * a norm vector in it is refused by name, never read as another format. */
    tm_build(&tm, &sp);
    o.bad_type = 39;
    o.bad_match = "blk.0.ffn_norm";
    wr = mw_write_gguf(&tm.m, path, &o, err, sizeof err);
    tm_free(&tm);
    m = wr == 0 ? kvg_model_load(path, &lo, err, sizeof err) : NULL;
    ok(!m && strstr(err, "unsupported dtype MXFP4") && strstr(err, "blk.0.ffn_norm.weight"),
       "MXFP4 for a norm vector is refused naming type and tensor (%s)", err);
    kvg_model_free(m);
    unlink(path);
}

int main(void)
{
    const char *tok = "../shared/models/stories260K/tok512.bin";
    test_dequant();
    test_roundtrip();
    test_mxfp4();
    test_gemm();
    test_float_prepare();
    if (access(tok, R_OK) != 0) {
        ok(1, "# SKIP no %s", tok);
    } else {
        test_model_one("Q4_K_M-like (Q4_K, Q6_K ffn_down), tied", KVG_DT_Q4_K, KVG_DT_Q6_K, "ffn_down", 1, tok);
        test_model_one("Q8_0 with Q4_0 attn_v, untied", KVG_DT_Q8_0, KVG_DT_Q4_0, "attn_v", 0, tok);
        test_model_one("MXFP4 with Q8_0 attn_output, tied", KVG_DT_MXFP4, KVG_DT_Q8_0, "attn_output", 1, tok);
        test_unsupported(tok);
        test_float_model(tok);
    }
    return done_testing();
}
