/* The x86 attention kernels -- the scores of 4 or 1 groups of 16 keys and the V
 * accumulation, of one query row and of KVG_ATTN_ROWS (4) rows at once, the softmax --
 * and the SwiGLU, with the polynomial exp the last two share, written once:
 * attention_kernels.c (AVX2, 8 lanes a register) and attention_avx512.c (16 lanes) each
 * include this file once, after defining the vector type and the few operations it
 * needs (below), and get their own copy compiled for their own target. Not a normal header: no include guard, and it defines functions
 * (like gemm_packed_x86.h).
 *
 * Every lane runs exactly the scalar code's operations in the scalar code's order
 * (kvg_attn_exp, kvg_silu_mul and the generic kernels, attention_kernels.h and .c): the
 * same roundings, so every ISA gives the same bits. A group of 16 keys, and a softmax's
 * 16 lanes (positions t mod 16), are AV_REGS registers of AV_VL lanes each. The 4-row
 * kernels compute each row's chains exactly as the one-row kernels do; they only share
 * every load of K and V between the rows.
 *
 * The including file defines:
 *   AV_TGT                  the target attribute of every function here
 *   AV_LINK                 `static` where the kernels are file-local, else empty
 *   AV_SCORES4, AV_SCORES1, AV_VACC, AV_SCORES4_ROWS, AV_VACC_ROWS, AV_SOFTMAX,
 *   AV_SWIGLU, AV_SWIGLU_OAI, AV_GEGLU
 *                           the names of the functions it gets (kvg_attn_scores_fn,
 *                           kvg_attn_vacc_fn, kvg_attn_scores_rows_fn,
 *                           kvg_attn_vacc_rows_fn, kvg_attn_softmax_fn, kvg_swiglu_fn)
 *   AV_SCORES4_I8, AV_SCORES1_I8, AV_VACC_I8, AV_SCORES4_ROWS_I8, AV_VACC_ROWS_I8
 *                           the same over int8 K / V (an int8 KV layer: kvg_attn_*_i8_fn),
 *                           the same code with AV_LOAD_I8 for AV_LOADU
 *   AV_ROWS_GROUPS          groups of keys the 4-row scores take at once (1, 2 or 4)
 *   AV_ROWS_VREGS           registers of dimensions the 4-row V accumulation takes at
 *                           once (at most 4): the register budget of the 4-row kernels
 *   AV_V, AV_VL             the vector type and its floats (8 or 16)
 *   AV_SET1(f) AV_ZERO() AV_LOADU(p) AV_STOREU(p, v) AV_ADD(a, b) AV_SUB(a, b)
 *   AV_MUL(a, b) AV_DIV(a, b) AV_MAX(a, b) (a > b ? a : b, as the scalar code)
 *   AV_MIN(a, b)            a < b ? a : b
 *   AV_FMA(a, b, c)         a * b + c with one rounding
 *   AV_POW2_ADD(y, t)       y with (bits(t) - 0x4B400000) << 23 added to its bits: the
 *                           exp's 2^n, n being what the shifter left in t's low bits
 *   AV_KEEP_GE(x, c, y)     y in the lanes where x >= c (ordered), +0 elsewhere
 *   AV_SELECT_GE(x, c, a, b) a in the lanes where x >= c (ordered), b elsewhere
 *   AV_NEG_ABS(x)           x with its sign bit set (-|x|, NaN stays NaN)
 *   AV_LOAD_I8(p)           AV_VL int8 at p, each converted to float (exact) */

#define AV_REGS (16 / AV_VL)
/* AV_VL elements of K or V at element o of p: floats, or int8 made floats (I8, a
 * constant once the always-inline helpers below are inlined: no branch is left). */
#define AV_LOADKV(p, o, I8) \
    ((I8) ? AV_LOAD_I8((const int8_t *)(p) + (o)) : AV_LOADU((const float *)(p) + (o)))
/* Group g's K: kf[g] (floats) or k8[g] (int8), the other array NULL. */
#define AV_KGRP(g, I8) ((I8) ? (const void *)k8[g] : (const void *)kf[g])

/* Scores of NG groups of 16 keys (k[g]: column 0 of a group in a dimension-major K block,
 * row stride bt), 16 per group into out: each an FMA chain over d from +0. NG groups at
 * once give the core NG * AV_REGS independent chains. */
AV_TGT static inline __attribute__((always_inline)) void
av_scores(const float *q, const float *const *kf, const int8_t *const *k8, int bt, int hd, const int NG,
          const int I8, float *out)
{
    AV_V a[4][AV_REGS];
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 2
        for (int h = 0; h < AV_REGS; h++)
            a[g][h] = AV_ZERO();
    for (int d = 0; d < hd; d++) {
        AV_V qd = AV_SET1(q[d]);
        size_t o = (size_t)d * bt;
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++)
#pragma GCC unroll 2
            for (int h = 0; h < AV_REGS; h++)
                a[g][h] = AV_FMA(qd, AV_LOADKV(AV_KGRP(g, I8), o + AV_VL * h, I8), a[g][h]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 2
        for (int h = 0; h < AV_REGS; h++)
            AV_STOREU(out + 16 * g + AV_VL * h, a[g][h]);
}

AV_TGT AV_LINK void AV_SCORES4(const float *q, const float *const *k, int bt, int hd, float *out)
{
    av_scores(q, k, NULL, bt, hd, 4, 0, out);
}

AV_TGT AV_LINK void AV_SCORES1(const float *q, const float *const *k, int bt, int hd, float *out)
{
    av_scores(q, k, NULL, bt, hd, 1, 0, out);
}

AV_TGT AV_LINK void AV_SCORES4_I8(const float *q, const int8_t *const *k, int bt, int hd, float *out)
{
    av_scores(q, NULL, k, bt, hd, 4, 1, out);
}

AV_TGT AV_LINK void AV_SCORES1_I8(const float *q, const int8_t *const *k, int bt, int hd, float *out)
{
    av_scores(q, NULL, k, bt, hd, 1, 1, out);
}

/* NR registers of dimensions of out (v's columns from 0), each lane one chain
 * out[d] = fma(w[t], v[t][d], out[d]) over t ascending, held in registers across all n
 * tokens. */
AV_TGT static inline __attribute__((always_inline)) void
av_vacc_chunk(float *out, const float *w, const void *v, int n, int hd, const int NR, const int I8)
{
    AV_V a[8];
#pragma GCC unroll 8
    for (int i = 0; i < NR; i++)
        a[i] = AV_LOADU(out + AV_VL * i);
    for (int t = 0; t < n; t++) {
        AV_V wt = AV_SET1(w[t]);
        size_t vt = (size_t)t * hd;
#pragma GCC unroll 8
        for (int i = 0; i < NR; i++)
            a[i] = AV_FMA(wt, AV_LOADKV(v, vt + AV_VL * i, I8), a[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < NR; i++)
        AV_STOREU(out + AV_VL * i, a[i]);
}

/* out[d] = fmaf(w[t], v[t][d], out[d]) for t = 0..n-1 ascending: 8, then 4, then 1
 * register of dimensions at a time, the rest one by one. */
AV_TGT AV_LINK void AV_VACC(float *out, const float *w, const float *v, int n, int hd)
{
    int d0 = 0;
    for (; d0 + 8 * AV_VL <= hd; d0 += 8 * AV_VL)
        av_vacc_chunk(out + d0, w, v + d0, n, hd, 8, 0);
    for (; d0 + 4 * AV_VL <= hd; d0 += 4 * AV_VL)
        av_vacc_chunk(out + d0, w, v + d0, n, hd, 4, 0);
    for (; d0 + AV_VL <= hd; d0 += AV_VL)
        av_vacc_chunk(out + d0, w, v + d0, n, hd, 1, 0);
    kvg_attn_vacc_tail(out, w, v, n, hd, d0);
}

/* AV_VACC over int8 V (its scale already in w). */
AV_TGT AV_LINK void AV_VACC_I8(float *out, const float *w, const int8_t *v, int n, int hd)
{
    int d0 = 0;
    for (; d0 + 8 * AV_VL <= hd; d0 += 8 * AV_VL)
        av_vacc_chunk(out + d0, w, v + d0, n, hd, 8, 1);
    for (; d0 + 4 * AV_VL <= hd; d0 += 4 * AV_VL)
        av_vacc_chunk(out + d0, w, v + d0, n, hd, 4, 1);
    for (; d0 + AV_VL <= hd; d0 += AV_VL)
        av_vacc_chunk(out + d0, w, v + d0, n, hd, 1, 1);
    kvg_attn_vacc_tail_i8(out, w, v, n, hd, d0);
}

/* The 4-row kernels' step, an outer product: a[r][j] = fma(s[r][i], y[j], a[r][j]) for
 * the 4 rows and J registers y loaded once for all of them. */
AV_TGT static inline __attribute__((always_inline)) void
av_fma_rows(AV_V a[4][4], const float *const *s, size_t i, const AV_V *y, const int J)
{
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        AV_V sr = AV_SET1(s[r][i]);
#pragma GCC unroll 4
        for (int j = 0; j < J; j++)
            a[r][j] = AV_FMA(sr, y[j], a[r][j]);
    }
}

/* 4 rows against the same keys: AV_ROWS_GROUPS groups at a time, each register of K
 * loaded once for the 4 rows; row r's 16 scores of group g into out[r] + 16 g. */
AV_TGT static inline __attribute__((always_inline)) void
av_scores_rows(const float *const *q, const float *const *kf, const int8_t *const *k8, int bt, int hd,
               float *const *out, const int I8)
{
    enum { J = AV_ROWS_GROUPS * AV_REGS };      /* registers of K per dimension, <= 4 */
    for (int g0 = 0; g0 < 4; g0 += AV_ROWS_GROUPS) {
        AV_V a[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int j = 0; j < J; j++)
                a[r][j] = AV_ZERO();
        for (int d = 0; d < hd; d++) {
            size_t o = (size_t)d * bt;
            AV_V kd[J];
#pragma GCC unroll 4
            for (int j = 0; j < J; j++)
                kd[j] = AV_LOADKV(AV_KGRP(g0 + j / AV_REGS, I8), o + AV_VL * (j % AV_REGS), I8);
            av_fma_rows(a, q, (size_t)d, kd, J);
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int j = 0; j < J; j++)
                AV_STOREU(out[r] + 16 * (g0 + j / AV_REGS) + AV_VL * (j % AV_REGS), a[r][j]);
    }
}

AV_TGT AV_LINK void AV_SCORES4_ROWS(const float *const *q, const float *const *k, int bt, int hd,
                                    float *const *out)
{
    av_scores_rows(q, k, NULL, bt, hd, out, 0);
}

AV_TGT AV_LINK void AV_SCORES4_ROWS_I8(const float *const *q, const int8_t *const *k, int bt, int hd,
                                       float *const *out)
{
    av_scores_rows(q, NULL, k, bt, hd, out, 1);
}

/* 4 rows' outputs over NR registers of dimensions from d0, each register of V loaded
 * once for the 4 rows. */
AV_TGT static inline __attribute__((always_inline)) void
av_vacc_rows_chunk(float *const *out, const float *const *w, const void *v, int n, int hd, int d0,
                   const int NR, const int I8)
{
    AV_V a[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++)
            a[r][i] = AV_LOADU(out[r] + d0 + AV_VL * i);
    for (int t = 0; t < n; t++) {
        size_t vt = (size_t)t * hd + (size_t)d0;
        AV_V vv[4];
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++)
            vv[i] = AV_LOADKV(v, vt + AV_VL * i, I8);
        av_fma_rows(a, w, (size_t)t, vv, NR);
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++)
            AV_STOREU(out[r] + d0 + AV_VL * i, a[r][i]);
}

/* For each of 4 rows: out[r][d] = fmaf(w[r][t], v[t][d], out[r][d]), t ascending;
 * AV_ROWS_VREGS registers of dimensions at a time, then 1, the rest one by one. */
AV_TGT AV_LINK void AV_VACC_ROWS(float *const *out, const float *const *w, const float *v, int n, int hd)
{
    int d0 = 0;
    for (; d0 + AV_ROWS_VREGS * AV_VL <= hd; d0 += AV_ROWS_VREGS * AV_VL)
        av_vacc_rows_chunk(out, w, v, n, hd, d0, AV_ROWS_VREGS, 0);
    for (; d0 + AV_VL <= hd; d0 += AV_VL)
        av_vacc_rows_chunk(out, w, v, n, hd, d0, 1, 0);
    for (int r = 0; r < 4; r++)
        kvg_attn_vacc_tail(out[r], w[r], v, n, hd, d0);
}

/* AV_VACC_ROWS over int8 V (its scale already in each row's w). */
AV_TGT AV_LINK void AV_VACC_ROWS_I8(float *const *out, const float *const *w, const int8_t *v, int n, int hd)
{
    int d0 = 0;
    for (; d0 + AV_ROWS_VREGS * AV_VL <= hd; d0 += AV_ROWS_VREGS * AV_VL)
        av_vacc_rows_chunk(out, w, v, n, hd, d0, AV_ROWS_VREGS, 1);
    for (; d0 + AV_VL <= hd; d0 += AV_VL)
        av_vacc_rows_chunk(out, w, v, n, hd, d0, 1, 1);
    for (int r = 0; r < 4; r++)
        kvg_attn_vacc_tail_i8(out[r], w[r], v, n, hd, d0);
}

/* kvg_attn_exp on AV_VL lanes: the same operations in the same order. */
AV_TGT static inline __attribute__((always_inline)) AV_V av_exp(AV_V x)
{
    const AV_V shifter = AV_SET1(12582912.0f);
    AV_V t = AV_FMA(x, AV_SET1(1.44269504088896341f), shifter);
    AV_V n = AV_SUB(t, shifter);
    AV_V r = AV_FMA(n, AV_SET1(-0.693359375f), x);
    AV_V p, y;
    r = AV_FMA(n, AV_SET1(2.12194440e-4f), r);
    p = AV_SET1(1.9875691500e-4f);
    p = AV_FMA(p, r, AV_SET1(1.3981999507e-3f));
    p = AV_FMA(p, r, AV_SET1(8.3334519073e-3f));
    p = AV_FMA(p, r, AV_SET1(4.1665795894e-2f));
    p = AV_FMA(p, r, AV_SET1(1.6666665459e-1f));
    p = AV_FMA(p, r, AV_SET1(5.0000001201e-1f));
    y = AV_FMA(p, AV_MUL(r, r), r);
    y = AV_ADD(y, AV_SET1(1.0f));
    y = AV_POW2_ADD(y, t);
    return AV_KEEP_GE(x, AV_SET1(-86.0f), y);
}

/* kvg_silu_mul on AV_VL lanes: the same operations in the same order. */
AV_TGT AV_LINK void AV_SWIGLU(float *gate, const float *up, size_t n)
{
    const AV_V one = AV_SET1(1.0f);
    size_t i = 0;
    for (; i + AV_VL <= n; i += AV_VL) {
        AV_V g = AV_LOADU(gate + i);
        AV_V e = av_exp(AV_NEG_ABS(g));                                 /* exp(-|g|) */
        AV_V num = AV_SELECT_GE(g, AV_ZERO(), one, e);
        AV_V s = AV_DIV(num, AV_ADD(one, e));
        AV_STOREU(gate + i, AV_MUL(AV_MUL(g, s), AV_LOADU(up + i)));
    }
    for (; i < n; i++)
        gate[i] = kvg_silu_mul(gate[i], up[i]);
}

/* kvg_swiglu_oai on AV_VL lanes: the same operations in the same order. The clamps as
 * the scalar code's comparisons: x = g > 7 ? 7 : g is min(7, g) (a NaN g kept: MIN's
 * second operand), y = u < -7 ? -7 : (u > 7 ? 7 : u) is max(-7, min(7, u)). */
AV_TGT AV_LINK void AV_SWIGLU_OAI(float *gate, const float *up, size_t n)
{
    const AV_V one = AV_SET1(1.0f), lim = AV_SET1(KVG_SWIGLU_OAI_LIMIT);
    const AV_V nlim = AV_SET1(-KVG_SWIGLU_OAI_LIMIT), alpha = AV_SET1(KVG_SWIGLU_OAI_ALPHA);
    size_t i = 0;
    for (; i + AV_VL <= n; i += AV_VL) {
        AV_V x = AV_MIN(lim, AV_LOADU(gate + i));
        AV_V y = AV_MAX(nlim, AV_MIN(lim, AV_LOADU(up + i)));
        AV_V a = AV_MUL(alpha, x);
        AV_V e = av_exp(AV_NEG_ABS(a));                                 /* exp(-|a|) */
        AV_V num = AV_SELECT_GE(a, AV_ZERO(), one, e);
        AV_V s = AV_DIV(num, AV_ADD(one, e));
        AV_STOREU(gate + i, AV_MUL(AV_MUL(x, s), AV_ADD(y, one)));
    }
    for (; i < n; i++)
        gate[i] = kvg_swiglu_oai(gate[i], up[i]);
}

/* kvg_gelu_mul on AV_VL lanes: the same operations in the same order. */
AV_TGT AV_LINK void AV_GEGLU(float *gate, const float *up, size_t n)
{
    const AV_V one = AV_SET1(1.0f), a = AV_SET1(KVG_GELU_A), c2 = AV_SET1(KVG_GELU_2C);
    size_t i = 0;
    for (; i + AV_VL <= n; i += AV_VL) {
        AV_V g = AV_LOADU(gate + i);
        AV_V z2 = AV_MUL(c2, AV_FMA(AV_MUL(AV_MUL(a, g), g), g, g));
        AV_V e = av_exp(AV_NEG_ABS(z2));                                /* exp(-|2z|) */
        AV_V num = AV_SELECT_GE(z2, AV_ZERO(), one, e);
        AV_V s = AV_DIV(num, AV_ADD(one, e));
        AV_STOREU(gate + i, AV_MUL(AV_MUL(g, s), AV_LOADU(up + i)));
    }
    for (; i < n; i++)
        gate[i] = kvg_gelu_mul(gate[i], up[i]);
}

/* The generic softmax (attention_kernels.c) with the whole groups of 16 positions in
 * registers: lane l's maximum and sum take positions l, l + 16, ... ascending. */
AV_TGT AV_LINK float AV_SOFTMAX(float *sc, int T, float scale, float sink)
{
    float mxl[16], lanes[16], mx;
    int full = T & ~15;
    AV_V s = AV_SET1(scale), m[AV_REGS], a[AV_REGS], mv;
    for (int h = 0; h < AV_REGS; h++) {
        m[h] = AV_SET1(-INFINITY);
        a[h] = AV_ZERO();
    }
    for (int t0 = 0; t0 < full; t0 += 16)
        for (int h = 0; h < AV_REGS; h++) {
            AV_V v = AV_DIV(AV_LOADU(sc + t0 + AV_VL * h), s);
            AV_STOREU(sc + t0 + AV_VL * h, v);
            m[h] = AV_MAX(v, m[h]);
        }
    for (int h = 0; h < AV_REGS; h++)
        AV_STOREU(mxl + AV_VL * h, m[h]);
    mx = kvg_attn_softmax_max_tail(sc, full, T, scale, mxl, sink);
    mv = AV_SET1(mx);
    for (int t0 = 0; t0 < full; t0 += 16)
        for (int h = 0; h < AV_REGS; h++) {
            AV_V e = av_exp(AV_SUB(AV_LOADU(sc + t0 + AV_VL * h), mv));
            AV_STOREU(sc + t0 + AV_VL * h, e);
            a[h] = AV_ADD(a[h], e);
        }
    for (int h = 0; h < AV_REGS; h++)
        AV_STOREU(lanes + AV_VL * h, a[h]);
    return kvg_attn_softmax_sum_tail(sc, full, T, mx, lanes, sink);
}

#undef AV_REGS
#undef AV_LOADKV
#undef AV_KGRP
