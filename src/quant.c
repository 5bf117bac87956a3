/* GGUF block formats: the defined dequantized values and reference quantizers (see
 * quant.h). The dequantizers are THE definition the engine's kernels reproduce in
 * registers, so every product below is rounded on its own: GCC would otherwise be
 * free (-ffp-contract=fast, its gnu11 default) to fuse Q4_K's (d*sc)*q - dmin*m into
 * one FMA when a build targets FMA, and the kernels' values would differ. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#include "quant.h"
#include "quant_testing.h"

#include <math.h>
#include <string.h>

int kvg_quant_block_elems(kvg_qtype t)
{
    switch (t) {
    case KVG_Q8_0: return KVG_QK8_0;
    case KVG_Q4_0: return KVG_QK4_0;
    case KVG_Q4_K: return KVG_QK_K;
    case KVG_Q6_K: return KVG_QK_K;
    case KVG_MXFP4: return KVG_QK_MXFP4;
    }
    return 0;
}

size_t kvg_quant_block_bytes(kvg_qtype t)
{
    switch (t) {
    case KVG_Q8_0: return KVG_Q8_0_BYTES;
    case KVG_Q4_0: return KVG_Q4_0_BYTES;
    case KVG_Q4_K: return KVG_Q4_K_BYTES;
    case KVG_Q6_K: return KVG_Q6_K_BYTES;
    case KVG_MXFP4: return KVG_MXFP4_BYTES;
    }
    return 0;
}

const char *kvg_quant_name(kvg_qtype t)
{
    switch (t) {
    case KVG_Q8_0: return "Q8_0";
    case KVG_Q4_0: return "Q4_0";
    case KVG_Q4_K: return "Q4_K";
    case KVG_Q6_K: return "Q6_K";
    case KVG_MXFP4: return "MXFP4";
    }
    return "?";
}

uint32_t kvg_quant_ggml_type(kvg_qtype t)
{
    switch (t) {
    case KVG_Q8_0: return 8;
    case KVG_Q4_0: return 2;
    case KVG_Q4_K: return 12;
    case KVG_Q6_K: return 14;
    case KVG_MXFP4: return 39;
    }
    return UINT32_MAX;
}

int kvg_quant_from_ggml(uint32_t ggml_type, kvg_qtype *t)
{
    switch (ggml_type) {
    case 8: *t = KVG_Q8_0; return 0;
    case 2: *t = KVG_Q4_0; return 0;
    case 12: *t = KVG_Q4_K; return 0;
    case 14: *t = KVG_Q6_K; return 0;
    case 39: *t = KVG_MXFP4; return 0;
    }
    return -1;
}

float kvg_quant_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
    float f;
    if (e == 0) {
        f = (float)man * 0x1p-24f;          /* zero or subnormal: exact in F32 */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (e == 31) {
        /* Inf, or NaN made quiet as the F16C instruction does. */
        bits = sign | 0x7f800000u | man << 13 | (man ? 0x00400000u : 0);
    } else {
        bits = sign | (e + 112) << 23 | man << 13;
    }
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kvg_quant_f32_to_f16(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    uint16_t sign = (uint16_t)(b >> 16 & 0x8000u);
    uint32_t a = b & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00;
    if (a >= 0x477ff000u)
        return sign | 0x7c00;
    if (a < 0x38800000u) {
        float v;
        memcpy(&v, &a, 4);
        return sign | (uint16_t)nearbyintf(v * 0x1p24f);
    }
    uint32_t e = (a >> 23) - 112, man = a & 0x7fffffu;
    uint32_t h = e << 10 | man >> 13, rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
        h++;
    return sign | (uint16_t)h;
}

static float rd_f16(const uint8_t *p)
{
    return kvg_quant_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static void wr_f16(uint8_t *p, float f)
{
    uint16_t h = kvg_quant_f32_to_f16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* ---- dequantization: the defined values ---- */

static void dq_q8_0(const uint8_t *b, float *y)
{
    float d = rd_f16(b);
    for (int j = 0; j < 32; j++)
        y[j] = d * (float)(int8_t)b[2 + j];
}

static void dq_q4_0(const uint8_t *b, float *y)
{
    float d = rd_f16(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((b[2 + j] & 0xF) - 8);
        y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
    }
}

static void dq_q4_k(const uint8_t *b, float *y)
{
    float d = rd_f16(b), dmin = rd_f16(b + 2);
    const uint8_t *sc = b + 4, *qs = b + 16;
    for (int c = 0; c < 4; c++) {
        for (int h = 0; h < 2; h++) {
            int s, m;
            kvg_q4k_scale_min(sc, 2 * c + h, &s, &m);
            float ds = d * (float)s, dm = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int q = h ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xF;
                float t = ds * (float)q;
                y[64 * c + 32 * h + l] = t - dm;
            }
        }
    }
}

/* Element e (0..255) of a Q6_K block: its 6-bit value minus 32. */
static int q6k_q(const uint8_t *b, int e)
{
    return kvg_q6k_q6(b, e) - 32;
}

static void dq_q6_k(const uint8_t *b, float *y)
{
    float d = rd_f16(b + 208);
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int s = 0; s < 16; s++) {
        float ds = d * (float)sc[s];
        for (int i = 0; i < 16; i++)
            y[16 * s + i] = ds * (float)q6k_q(b, 16 * s + i);
    }
}

/* E2M1 codes, doubled so that they are integers (bit 3 is the sign; -0 reads as 0). */
static void dq_mxfp4(const uint8_t *b, float *y)
{
    float d = kvg_mxfp4_scale(b[0]);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)kvg_mxfp4_k(b[1 + j] & 0xF) * d;
        y[j + 16] = (float)kvg_mxfp4_k(b[1 + j] >> 4) * d;
    }
}

void kvg_dequant_row(kvg_qtype t, const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    int be = kvg_quant_block_elems(t);
    size_t bb = kvg_quant_block_bytes(t);
    if (be <= 0)
        return;
    for (int64_t i = 0; i + be <= n; i += be, b += bb, dst += be) {
        switch (t) {
        case KVG_Q8_0: dq_q8_0(b, dst); break;
        case KVG_Q4_0: dq_q4_0(b, dst); break;
        case KVG_Q4_K: dq_q4_k(b, dst); break;
        case KVG_Q6_K: dq_q6_k(b, dst); break;
        case KVG_MXFP4: dq_mxfp4(b, dst); break;
        }
    }
}

/* ---- reference quantizers ---- */

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Rounds to nearest (ties away from zero) and clamps, NaN to 0. */
static int qround(float v, int lo, int hi)
{
    if (!(v == v))
        return 0;
    if (v < (float)lo)
        return lo;
    if (v > (float)hi)
        return hi;
    return clampi((int)roundf(v), lo, hi);
}

static void q_q8_0(const float *x, uint8_t *b)
{
    float amax = 0;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    wr_f16(b, amax / 127.0f);
    float d = rd_f16(b), id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++)
        b[2 + j] = (uint8_t)(int8_t)qround(x[j] * id, -128, 127);
}

/* As ggml: the element of largest magnitude maps to -8 exactly, so the scale carries
 * its sign and the other side may clip at +7 (an error of up to one step). */
static void q_q4_0(const float *x, uint8_t *b)
{
    float amax = 0, mx = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            mx = x[j];
        }
    wr_f16(b, mx / -8.0f);
    float d = rd_f16(b), id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; j++) {
        int lo = qround(x[j] * id, -8, 7) + 8, hi = qround(x[j + 16] * id, -8, 7) + 8;
        b[2 + j] = (uint8_t)(lo | hi << 4);
    }
}

/* Each sub-block of 32 covers [min(0, min x), max x] in 15 steps; the super-block
 * scales d and dmin are the largest step and offset over 63, the 6-bit sub-block
 * factors round up (the step) and to nearest (the offset), so the top rarely clips. */
static void q_q4_k(const float *x, uint8_t *b)
{
    float step[8], off[8], smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = -INFINITY;
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        if (hi < lo)
            hi = lo;
        step[j] = (hi - lo) / 15.0f;
        off[j] = -lo;
        smax = fmaxf(smax, step[j]);
        mmax = fmaxf(mmax, off[j]);
    }
    memset(b, 0, KVG_Q4_K_BYTES);
    wr_f16(b, smax / 63.0f);
    wr_f16(b + 2, mmax / 63.0f);
    float d = rd_f16(b), dmin = rd_f16(b + 2);
    uint8_t *s = b + 4, *qs = b + 16;
    int sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = d > 0 ? clampi((int)ceilf(step[j] / d), 0, 63) : 0;
        mn[j] = dmin > 0 ? qround(off[j] / dmin, 0, 63) : 0;
    }
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4);
    }
    for (int j = 0; j < 8; j++) {
        float ds = d * (float)sc[j], dm = dmin * (float)mn[j];
        for (int l = 0; l < 32; l++) {
            int q = ds > 0 ? qround((x[32 * j + l] + dm) / ds, 0, 15) : 0;
            int c = j / 2, at = 32 * c + l;
            qs[at] = (uint8_t)(j & 1 ? (qs[at] & 0xF) | q << 4 : (qs[at] & 0xF0) | q);
        }
    }
}

/* Each sub-block of 16: step = max |x| / 31 (q in [-32, 31]); d = the largest step /
 * 127, int8 factors to nearest. */
static void q_q6_k(const float *x, uint8_t *b)
{
    float step[16], smax = 0;
    for (int s = 0; s < 16; s++) {
        float amax = 0;
        for (int i = 0; i < 16; i++)
            amax = fmaxf(amax, fabsf(x[16 * s + i]));
        step[s] = amax / 31.0f;
        smax = fmaxf(smax, step[s]);
    }
    memset(b, 0, KVG_Q6_K_BYTES);
    wr_f16(b + 208, smax / 127.0f);
    float d = rd_f16(b + 208);
    uint8_t *ql = b, *qh = b + 128;
    int8_t *sc = (int8_t *)(b + 192);
    for (int s = 0; s < 16; s++)
        sc[s] = (int8_t)(d > 0 ? qround(step[s] / d, -128, 127) : 0);
    for (int e = 0; e < 256; e++) {
        float ds = d * (float)sc[e / 16];
        int u = (ds != 0 ? qround(x[e] / ds, -32, 31) : 0) + 32;
        int n = e / 128, r = e % 128, g = r / 32, l = r % 32;
        uint8_t *p = &ql[64 * n + l + 32 * (g & 1)];
        *p = (uint8_t)(g >= 2 ? (*p & 0xF) | (u & 0xF) << 4 : (*p & 0xF0) | (u & 0xF));
        qh[32 * n + l] |= (uint8_t)((u >> 4) << (2 * g));
    }
}

/* The OCP MX rule: the shared exponent puts the block's largest magnitude in E2M1's top
 * binade (2^(floor(log2 amax) - 2), E2M1's largest exponent being 2), so values up to
 * 1.5x that binade's start are representable and the rest clip at 6 (code 12 here);
 * every element then takes its nearest code, the first (smaller magnitude, positive)
 * on a tie. As ggml's reference quantizer. */
static void q_mxfp4(const float *x, uint8_t *b)
{
    float amax = 0;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    int e = 0;
    if (amax > 0 && isfinite(amax))
        e = clampi((int)floorf(log2f(amax)) - 2 + 127, 0, 254);
    b[0] = (uint8_t)e;
    float d = kvg_mxfp4_scale(b[0]);
    for (int j = 0; j < 32; j++) {
        int best = 0;
        float best_err = fabsf(x[j]);
        for (int c = 1; c < 16; c++) {
            float err = fabsf((float)kvg_mxfp4_k(c) * d - x[j]);
            if (err < best_err) {
                best_err = err;
                best = c;
            }
        }
        if (j < 16)
            b[1 + j] = (uint8_t)best;
        else
            b[1 + j - 16] |= (uint8_t)(best << 4);
    }
}

int kvg_quant_row(kvg_qtype t, const float *src, void *dst, int64_t n)
{
    int be = kvg_quant_block_elems(t);
    size_t bb = kvg_quant_block_bytes(t);
    uint8_t *b = dst;
    if (be <= 0 || n < 0 || n % be != 0)
        return -1;
    for (int64_t i = 0; i < n; i += be, b += bb, src += be) {
        switch (t) {
        case KVG_Q8_0: q_q8_0(src, b); break;
        case KVG_Q4_0: q_q4_0(src, b); break;
        case KVG_Q4_K: q_q4_k(src, b); break;
        case KVG_Q6_K: q_q6_k(src, b); break;
        case KVG_MXFP4: q_mxfp4(src, b); break;
        }
    }
    return 0;
}
