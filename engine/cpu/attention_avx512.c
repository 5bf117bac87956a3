/* The AVX-512 attention kernels (interface in attention_kernels.h): one 16-key group
 * or 16 lanes per register. The unit test also runs this file on CPUs without
 * AVX-512, through an emulation of the intrinsics, by overriding KVG_AVX512_TARGET. */
#include "cpu/attention_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#ifndef KVG_AVX512_TARGET
#define KVG_AVX512_TARGET "avx512f,fma"
#endif
#define AVX512 __attribute__((target(KVG_AVX512_TARGET)))

AVX512 void kvg_attn_scores4_avx512(const float *q, const float *const *k, int bt, int hd, float *out)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3];
    for (int d = 0; d < hd; d++) {
        __m512 qd = _mm512_set1_ps(q[d]);
        size_t o = (size_t)d * bt;
        a0 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k0 + o), a0);
        a1 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k1 + o), a1);
        a2 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k2 + o), a2);
        a3 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k3 + o), a3);
    }
    _mm512_storeu_ps(out, a0);
    _mm512_storeu_ps(out + 16, a1);
    _mm512_storeu_ps(out + 32, a2);
    _mm512_storeu_ps(out + 48, a3);
}

AVX512 void kvg_attn_scores1_avx512(const float *q, const float *const *k, int bt, int hd, float *out)
{
    __m512 a0 = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++)
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_loadu_ps(k[0] + (size_t)d * bt), a0);
    _mm512_storeu_ps(out, a0);
}

AVX512 void kvg_attn_vacc_avx512(float *out, const float *w, const float *v, int n, int hd)
{
    int d0 = 0;
    for (; d0 + 128 <= hd; d0 += 128) {
        __m512 a[8];
        for (int i = 0; i < 8; i++)
            a[i] = _mm512_loadu_ps(out + d0 + 16 * i);
        for (int t = 0; t < n; t++) {
            __m512 wt = _mm512_set1_ps(w[t]);
            const float *vt = v + (size_t)t * hd + d0;
            for (int i = 0; i < 8; i++)
                a[i] = _mm512_fmadd_ps(wt, _mm512_loadu_ps(vt + 16 * i), a[i]);
        }
        for (int i = 0; i < 8; i++)
            _mm512_storeu_ps(out + d0 + 16 * i, a[i]);
    }
    for (; d0 + 64 <= hd; d0 += 64) {
        __m512 a[4];
        for (int i = 0; i < 4; i++)
            a[i] = _mm512_loadu_ps(out + d0 + 16 * i);
        for (int t = 0; t < n; t++) {
            __m512 wt = _mm512_set1_ps(w[t]);
            const float *vt = v + (size_t)t * hd + d0;
            for (int i = 0; i < 4; i++)
                a[i] = _mm512_fmadd_ps(wt, _mm512_loadu_ps(vt + 16 * i), a[i]);
        }
        for (int i = 0; i < 4; i++)
            _mm512_storeu_ps(out + d0 + 16 * i, a[i]);
    }
    for (; d0 + 16 <= hd; d0 += 16) {
        __m512 a = _mm512_loadu_ps(out + d0);
        for (int t = 0; t < n; t++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(w[t]), _mm512_loadu_ps(v + (size_t)t * hd + d0), a);
        _mm512_storeu_ps(out + d0, a);
    }
    for (; d0 < hd; d0++)
        for (int t = 0; t < n; t++)
            out[d0] = fmaf(w[t], v[(size_t)t * hd + d0], out[d0]);
}

AVX512 static inline __m512 exp16_avx512(__m512 x)
{
    const __m512 shifter = _mm512_set1_ps(12582912.0f);
    __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shifter);
    __m512 n = _mm512_sub_ps(t, shifter);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
    __m512 p, y;
    __m512i e;
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    e = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000)), 23);
    y = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), e));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-86.0f), _CMP_GE_OQ), y);
}

AVX512 float kvg_attn_softmax_avx512(float *sc, int T, float scale)
{
    float mxl[16], lanes[16], mx = -INFINITY;
    int full = T & ~15;
    __m512 s = _mm512_set1_ps(scale), m = _mm512_set1_ps(-INFINITY), a = _mm512_setzero_ps(), mv;
    for (int t0 = 0; t0 < full; t0 += 16) {
        __m512 v = _mm512_div_ps(_mm512_loadu_ps(sc + t0), s);
        _mm512_storeu_ps(sc + t0, v);
        m = _mm512_max_ps(v, m);
    }
    _mm512_storeu_ps(mxl, m);
    for (int t = full; t < T; t++) {
        float v = sc[t] / scale;
        sc[t] = v;
        mxl[t & 15] = v > mxl[t & 15] ? v : mxl[t & 15];
    }
    for (int l = 0; l < 16; l++)
        mx = mxl[l] > mx ? mxl[l] : mx;
    mv = _mm512_set1_ps(mx);
    for (int t0 = 0; t0 < full; t0 += 16) {
        __m512 e = exp16_avx512(_mm512_sub_ps(_mm512_loadu_ps(sc + t0), mv));
        _mm512_storeu_ps(sc + t0, e);
        a = _mm512_add_ps(a, e);
    }
    _mm512_storeu_ps(lanes, a);
    for (int t = full; t < T; t++) {
        float e = kvg_attn_exp(sc[t] - mx);
        sc[t] = e;
        lanes[t & 15] += e;
    }
    return kvg_attn_reduce16(lanes);
}
#endif
