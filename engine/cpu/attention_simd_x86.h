/* The softmax and the SwiGLU of the x86 attention kernels, with the polynomial exp they
 * share, written once: attention_kernels.c (AVX2, 8 lanes a register) and
 * attention_avx512.c (16 lanes) each include this file once, after defining the vector
 * type and the few operations it needs (below), and get their own copy compiled for
 * their own target. Not a normal header: no include guard, and it defines functions
 * (like gemm_packed_x86.h).
 *
 * Every lane runs exactly the scalar code's operations in the scalar code's order
 * (kvg_attn_exp, kvg_silu_mul and the generic softmax, attention_kernels.h and .c): the
 * same roundings, so every ISA gives the same bits. A softmax's 16 lanes (positions
 * t mod 16) are AV_REGS registers of AV_VL lanes each.
 *
 * The including file defines:
 *   AV_TGT                  the target attribute of every function here
 *   AV_LINK                 `static` where the two kernels are file-local, else empty
 *   AV_SOFTMAX, AV_SWIGLU   the names of the two functions it gets (signatures of
 *                           kvg_attn_softmax_fn and kvg_swiglu_fn)
 *   AV_V, AV_VL             the vector type and its floats (8 or 16)
 *   AV_SET1(f) AV_ZERO() AV_LOADU(p) AV_STOREU(p, v) AV_ADD(a, b) AV_SUB(a, b)
 *   AV_MUL(a, b) AV_DIV(a, b) AV_MAX(a, b) (a > b ? a : b, as the scalar code)
 *   AV_FMA(a, b, c)         a * b + c with one rounding
 *   AV_POW2_ADD(y, t)       y with (bits(t) - 0x4B400000) << 23 added to its bits: the
 *                           exp's 2^n, n being what the shifter left in t's low bits
 *   AV_KEEP_GE(x, c, y)     y in the lanes where x >= c (ordered), +0 elsewhere
 *   AV_SELECT_GE(x, c, a, b) a in the lanes where x >= c (ordered), b elsewhere
 *   AV_NEG_ABS(x)           x with its sign bit set (-|x|, NaN stays NaN) */

#define AV_REGS (16 / AV_VL)

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

/* The generic softmax (attention_kernels.c) with the whole groups of 16 positions in
 * registers: lane l's maximum and sum take positions l, l + 16, ... ascending. */
AV_TGT AV_LINK float AV_SOFTMAX(float *sc, int T, float scale)
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
    mx = kvg_attn_softmax_max_tail(sc, full, T, scale, mxl);
    mv = AV_SET1(mx);
    for (int t0 = 0; t0 < full; t0 += 16)
        for (int h = 0; h < AV_REGS; h++) {
            AV_V e = av_exp(AV_SUB(AV_LOADU(sc + t0 + AV_VL * h), mv));
            AV_STOREU(sc + t0 + AV_VL * h, e);
            a[h] = AV_ADD(a[h], e);
        }
    for (int h = 0; h < AV_REGS; h++)
        AV_STOREU(lanes + AV_VL * h, a[h]);
    return kvg_attn_softmax_sum_tail(sc, full, T, mx, lanes);
}

#undef AV_REGS
