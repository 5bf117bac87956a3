/* AVX-512 kernel, two paths with the same arithmetic (the canonical order of
 * gemm_kernels.h):
 *   small M (decode): one 16-float register holds the 16 lanes of one output; a
 *     register block of MR X rows by NR W rows streams W once. The K tail is a masked,
 *     zeroing load -- the same zero padding as the other kernels.
 *   M >= PACKED_MIN_M (prefill): lane by lane over packed operands, 12 X rows x 32 W
 *     rows per micro-kernel (see gemm_pack_x86.h and the AVX2 kernel).
 * The unit test also runs this file on CPUs without AVX-512, through an emulation of
 * the intrinsics, by overriding KVG_AVX512_TARGET. */
#include <stdlib.h>

#include "cpu/gemm_kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include "cpu/gemm_pack_x86.h"

#ifndef KVG_AVX512_TARGET
#define KVG_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
#endif
#define TGT __attribute__((target(KVG_AVX512_TARGET)))
#define TGT_INLINE static inline __attribute__((target(KVG_AVX512_TARGET), always_inline))

#define MR_MAX 4
#define NR_MAX 8
/* Small M: rows of W per block, kept in L2 while every group of X rows passes. */
#define W_BLOCK_BYTES (192 * 1024)

/* Sixteen W elements at w[off..), lanes outside `mask` zero. dt is a constant after
 * inlining; FULL selects the unmasked load. */
TGT_INLINE __m512 load_w16(const void *w, size_t off, kvg_dtype dt, __mmask16 mask, int full)
{
    if (dt == KVG_DT_F32)
        return full ? _mm512_loadu_ps((const float *)w + off)
                    : _mm512_maskz_loadu_ps(mask, (const float *)w + off);
    const uint16_t *p = (const uint16_t *)w + off;
    __m256i h = full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(mask, p);
    if (dt == KVG_DT_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The canonical tree: lanes i + i+8, then i + i+4, i + i+2, 0 + 1. */
TGT_INLINE float reduce16(__m512 v)
{
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 h = _mm256_add_ps(lo, hi);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

TGT_INLINE void block(const float *x, const void *w, size_t w0, kvg_dtype dt, int K,
                      const float *bias, float *y, size_t ldy, const int MR, const int NR)
{
    __m512 acc[MR_MAX][NR_MAX];
    int k = 0;

    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            acc[r][c] = _mm512_setzero_ps();

    for (; k + 16 <= K; k += 16) {
        __m512 xv[MR_MAX];
        for (int r = 0; r < MR; r++)
            xv[r] = _mm512_loadu_ps(x + (size_t)r * (size_t)K + (size_t)k);
        for (int c = 0; c < NR; c++) {
            __m512 wv = load_w16(w, w0 + (size_t)c * (size_t)K + (size_t)k, dt, 0xffff, 1);
            for (int r = 0; r < MR; r++)
                acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    if (k < K) {
        __mmask16 mask = (__mmask16)((1u << (K - k)) - 1u);
        __m512 xv[MR_MAX];
        for (int r = 0; r < MR; r++)
            xv[r] = _mm512_maskz_loadu_ps(mask, x + (size_t)r * (size_t)K + (size_t)k);
        for (int c = 0; c < NR; c++) {
            __m512 wv = load_w16(w, w0 + (size_t)c * (size_t)K + (size_t)k, dt, mask, 0);
            for (int r = 0; r < MR; r++)
                acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }

    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) {
            float s = reduce16(acc[r][c]);
            y[(size_t)r * ldy + (size_t)c] = bias ? s + bias[c] : s;
        }
}

typedef void (*block_fn)(const float *x, const void *w, size_t w0, kvg_dtype dt, int K,
                         const float *bias, float *y, size_t ldy);

#define BLOCK_FN(MR, NR)                                                                  \
    TGT static void block_##MR##x##NR(const float *x, const void *w, size_t w0,           \
                                      kvg_dtype dt, int K, const float *bias, float *y,   \
                                      size_t ldy)                                         \
    {                                                                                     \
        if (dt == KVG_DT_F32)                                                             \
            block(x, w, w0, KVG_DT_F32, K, bias, y, ldy, MR, NR);                         \
        else if (dt == KVG_DT_F16)                                                        \
            block(x, w, w0, KVG_DT_F16, K, bias, y, ldy, MR, NR);                         \
        else                                                                              \
            block(x, w, w0, KVG_DT_BF16, K, bias, y, ldy, MR, NR);                        \
    }
BLOCK_FN(1, 1) BLOCK_FN(1, 2) BLOCK_FN(1, 3) BLOCK_FN(1, 4)
BLOCK_FN(1, 5) BLOCK_FN(1, 6) BLOCK_FN(1, 7) BLOCK_FN(1, 8)
BLOCK_FN(2, 1) BLOCK_FN(2, 2) BLOCK_FN(2, 3) BLOCK_FN(2, 4) BLOCK_FN(2, 5) BLOCK_FN(2, 6)
BLOCK_FN(3, 1) BLOCK_FN(3, 2) BLOCK_FN(3, 3) BLOCK_FN(3, 4) BLOCK_FN(3, 5)
BLOCK_FN(4, 1) BLOCK_FN(4, 2) BLOCK_FN(4, 3) BLOCK_FN(4, 4)

static const block_fn blocks[MR_MAX + 1][NR_MAX + 1] = {
    [1] = { NULL, block_1x1, block_1x2, block_1x3, block_1x4,
            block_1x5, block_1x6, block_1x7, block_1x8 },
    [2] = { NULL, block_2x1, block_2x2, block_2x3, block_2x4, block_2x5, block_2x6 },
    [3] = { NULL, block_3x1, block_3x2, block_3x3, block_3x4, block_3x5 },
    [4] = { NULL, block_4x1, block_4x2, block_4x3, block_4x4 },
};

/* W rows per block for a given number of X rows (accumulators: 8, 12, 15, 16). */
static const int nr_for_mr[MR_MAX + 1] = { 0, 8, 6, 5, 4 };

/* Rows [nb0, nb1) of W against all of X. */
TGT static void panel(const kvg_gemm_job *job, int nb0, int nb1)
{
    int K = job->K;

    for (int m0 = 0; m0 < job->M; m0 += MR_MAX) {
        int mr = job->M - m0 < MR_MAX ? job->M - m0 : MR_MAX;
        int NR = nr_for_mr[mr];
        const float *x = job->x + (size_t)m0 * (size_t)K;
        float *y = job->y + (size_t)m0 * (size_t)job->N;
        for (int n = nb0; n < nb1; n += NR) {
            int nr = nb1 - n < NR ? nb1 - n : NR;
            blocks[mr][nr](x, job->w, (size_t)n * (size_t)K, job->dt, K,
                           job->bias ? job->bias + n : NULL, y + n, (size_t)job->N);
        }
    }
}

/* ---- packed path ------------------------------------------------------------------ */
#define PMR 12
#define PNR 32
#define PACKED_MIN_M 8
#define WP_BYTES (256 * 1024)
#define XB_BYTES (128 * 1024)
#define TILE (PMR * PNR)

TGT static void pack_w(const kvg_gemm_job *job, int n0, int rows, int panels, int J, float *wp)
{
    if (job->dt == KVG_DT_F32)
        kvg_x86_pack_w_dt(job->w, KVG_DT_F32, job->K, n0, rows, panels, J, wp, PNR);
    else if (job->dt == KVG_DT_F16)
        kvg_x86_pack_w_dt(job->w, KVG_DT_F16, job->K, n0, rows, panels, J, wp, PNR);
    else
        kvg_x86_pack_w_dt(job->w, KVG_DT_BF16, job->K, n0, rows, panels, J, wp, PNR);
}

TGT static void pack_x(const float *x, int K, int rows, int p0, int p1, int J, float *xp)
{
    kvg_x86_pack_x(x, K, rows, p0, p1, J, xp, PMR);
}

/* Lane l's chain results `a` (16 outputs) folded into slots S(0..7), exactly as the
 * AVX2 kernel's lane_store (h_i = a_i + a_{i+8}, q_i = h_i + h_{i+4},
 * d_i = q_i + q_{i+2}, s = d_0 + d_1). Returns s for lane 15. */
TGT_INLINE __m512 lane_store(__m512 a, float *s0, int l)
{
#define S(i) (s0 + (size_t)(i) * TILE)
    if (l < 8) {
        _mm512_store_ps(S(l), a);
    } else if (l < 12) {
        _mm512_store_ps(S(l - 8), _mm512_add_ps(_mm512_load_ps(S(l - 8)), a));
    } else if (l < 14) {
        __m512 h = _mm512_add_ps(_mm512_load_ps(S(l - 8)), a);
        _mm512_store_ps(S(l - 12), _mm512_add_ps(_mm512_load_ps(S(l - 12)), h));
    } else if (l == 14) {
        __m512 h = _mm512_add_ps(_mm512_load_ps(S(6)), a);
        __m512 q = _mm512_add_ps(_mm512_load_ps(S(2)), h);
        _mm512_store_ps(S(0), _mm512_add_ps(_mm512_load_ps(S(0)), q));
    } else {
        __m512 h = _mm512_add_ps(_mm512_load_ps(S(7)), a);
        __m512 q = _mm512_add_ps(_mm512_load_ps(S(3)), h);
        __m512 d = _mm512_add_ps(_mm512_load_ps(S(1)), q);
        return _mm512_add_ps(_mm512_load_ps(S(0)), d);
    }
    return a;
#undef S
}

/* One lane of a 12 x 32 tile: 24 named accumulators (GCC keeps arrays of vectors in
 * memory), each X value broadcast against two 16-row W vectors. */
TGT static void micro(const float *xl, const float *wl, int J, float *slots, int l,
                      float *y, size_t ldy, const float *bias)
{
    __m512 z = _mm512_setzero_ps();
    __m512 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z;
    __m512 c40 = z, c41 = z, c50 = z, c51 = z, c60 = z, c61 = z, c70 = z, c71 = z;
    __m512 c80 = z, c81 = z, c90 = z, c91 = z, c100 = z, c101 = z, c110 = z, c111 = z;
    for (int j = 0; j < J; j++) {
        __m512 w0 = _mm512_load_ps(wl), w1 = _mm512_load_ps(wl + 16), b;
#define ROW(r)                                     \
        b = _mm512_set1_ps(xl[r]);                 \
        c##r##0 = _mm512_fmadd_ps(b, w0, c##r##0); \
        c##r##1 = _mm512_fmadd_ps(b, w1, c##r##1);
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11)
#undef ROW
        wl += PNR;
        xl += PMR;
    }
#define ALL(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
    if (l < 15) {
#define FOLD(r)                                        \
        lane_store(c##r##0, slots + r * PNR, l);       \
        lane_store(c##r##1, slots + r * PNR + 16, l);
        ALL(FOLD)
#undef FOLD
    } else if (y) {
        __m512 b0 = bias ? _mm512_loadu_ps(bias) : z;
        __m512 b1 = bias ? _mm512_loadu_ps(bias + 16) : z;
#define FINAL(r)                                                                     \
        {                                                                            \
            __m512 s0 = lane_store(c##r##0, slots + r * PNR, 15);                    \
            __m512 s1 = lane_store(c##r##1, slots + r * PNR + 16, 15);               \
            if (bias) {                                                              \
                s0 = _mm512_add_ps(s0, b0);                                          \
                s1 = _mm512_add_ps(s1, b1);                                          \
            }                                                                        \
            _mm512_storeu_ps(y + r * ldy, s0);                                       \
            _mm512_storeu_ps(y + r * ldy + 16, s1);                                  \
        }
        ALL(FINAL)
#undef FINAL
    } else {
#define EDGE(r)                                                                           \
        _mm512_store_ps(slots + r * PNR, lane_store(c##r##0, slots + r * PNR, 15));       \
        _mm512_store_ps(slots + r * PNR + 16, lane_store(c##r##1, slots + r * PNR + 16, 15));
        ALL(EDGE)
#undef EDGE
    }
#undef ALL
}

static void packed_path(const kvg_gemm_job *job, int n0, int n1)
{
    int K = job->K, J = (K + 15) / 16, Kp = 16 * J, M = job->M;
    int x_panels = (M + PMR - 1) / PMR;
    size_t xpanel = (size_t)16 * (size_t)J * PMR;
    size_t wpanel = (size_t)16 * (size_t)J * PNR;
    size_t wsz = job->dt == KVG_DT_F32 ? 4 : 2;
    int nb = (int)(WP_BYTES / ((size_t)Kp * sizeof(float))) / PNR * PNR;
    int mb = (int)(XB_BYTES / (xpanel * sizeof(float)));
    const float *xp = job->xp;
    float *own_xp = NULL, *wp, *slots;

    if (nb < PNR)
        nb = PNR;
    if (nb > n1 - n0)
        nb = (n1 - n0 + PNR - 1) / PNR * PNR;
    if (mb < 1)
        mb = 1;
    if (mb > x_panels)
        mb = x_panels;
    if (!xp) {
        own_xp = aligned_alloc(64, (size_t)x_panels * xpanel * sizeof(float));
        if (!own_xp)
            abort();
        pack_x(job->x, K, M, 0, x_panels, J, own_xp);
        xp = own_xp;
    }
    wp = aligned_alloc(64, (size_t)(nb / PNR) * wpanel * sizeof(float));
    slots = aligned_alloc(64, (size_t)mb * 8 * TILE * sizeof(float));
    if (!wp || !slots)
        abort();
    for (int b0 = n0; b0 < n1; b0 += nb) {
        int rows = n1 - b0 < nb ? n1 - b0 : nb;
        int panels = (rows + PNR - 1) / PNR;
        /* Prefetch the next block's raw rows while this one computes. */
        const char *next = (const char *)job->w + (size_t)(b0 + rows) * (size_t)K * wsz;
        size_t next_bytes = b0 + rows < n1 ? (size_t)(n1 - b0 - rows < nb ? n1 - b0 - rows : nb) *
                                                 (size_t)K * wsz : 0;
        size_t calls = (size_t)panels * 16 * (size_t)mb;
        size_t per_call = (next_bytes / 64 + calls - 1) / calls, pf = 0;

        pack_w(job, b0, rows, panels, J, wp);
        for (int mp0 = 0; mp0 < x_panels; mp0 += mb) {
            int nmp = x_panels - mp0 < mb ? x_panels - mp0 : mb;
            for (int p = 0; p < panels; p++) {
                int c0 = p * PNR, cols = rows - c0 < PNR ? rows - c0 : PNR;
                const float *bias = job->bias ? job->bias + b0 + c0 : NULL;
                for (int l = 0; l < 16; l++) {
                    const float *wl = wp + (size_t)p * wpanel + (size_t)l * (size_t)J * PNR;
                    for (int i = 0; i < nmp; i++) {
                        int m0 = (mp0 + i) * PMR;
                        int whole = m0 + PMR <= M && cols == PNR;
                        micro(xp + (size_t)(mp0 + i) * xpanel + (size_t)l * (size_t)J * PMR, wl, J,
                              slots + (size_t)i * 8 * TILE, l,
                              whole ? job->y + (size_t)m0 * (size_t)job->N + (size_t)(b0 + c0) : NULL,
                              (size_t)job->N, bias);
                        for (size_t q = 0; q < per_call && pf < next_bytes; q++, pf += 64)
                            _mm_prefetch(next + pf, _MM_HINT_T1);
                    }
                }
                for (int i = 0; i < nmp; i++) {
                    int m0 = (mp0 + i) * PMR, mrows = M - m0 < PMR ? M - m0 : PMR;
                    if (mrows < PMR || cols < PNR)
                        kvg_x86_edge_out(slots + (size_t)i * 8 * TILE, PNR, bias,
                                         job->y + (size_t)m0 * (size_t)job->N + (size_t)(b0 + c0),
                                         (size_t)job->N, mrows, cols);
                }
            }
        }
    }
    free(own_xp);
    free(wp);
    free(slots);
}

void kvg_gemm_plan_avx512(const kvg_gemm_job *job, kvg_gemm_plan *plan)
{
    int J = (job->K + 15) / 16;
    plan->packed = job->M >= PACKED_MIN_M && job->K >= 16;
    plan->x_panels = (job->M + PMR - 1) / PMR;
    plan->n_group = PNR;
    plan->xp_floats = (size_t)plan->x_panels * 16 * (size_t)J * PMR;
}

void kvg_gemm_pack_x_avx512(const kvg_gemm_job *job, int p0, int p1, float *xp)
{
    pack_x(job->x, job->K, job->M, p0, p1, (job->K + 15) / 16, xp);
}

/* ---- entry ------------------------------------------------------------------------ */

void kvg_gemm_kernel_avx512(const kvg_gemm_job *job, int n0, int n1)
{
    size_t row_bytes = (size_t)(job->K > 0 ? job->K : 1) * sizeof(float);
    int nb = (int)(W_BLOCK_BYTES / row_bytes);

    if (n0 >= n1 || job->M <= 0)
        return;
    if (job->M >= PACKED_MIN_M && job->K >= 16) {
        packed_path(job, n0, n1);
        return;
    }
    nb = nb < 16 ? 16 : nb - nb % 8;
    for (int b0 = n0; b0 < n1; b0 += nb) {
        int b1 = n1 - b0 < nb ? n1 : b0 + nb;
        panel(job, b0, b1);
    }
}

#else

void kvg_gemm_kernel_avx512(const kvg_gemm_job *job, int n0, int n1)
{
    kvg_gemm_kernel_generic(job, n0, n1);
}

void kvg_gemm_plan_avx512(const kvg_gemm_job *job, kvg_gemm_plan *plan)
{
    kvg_gemm_plan_generic(job, plan);
}

void kvg_gemm_pack_x_avx512(const kvg_gemm_job *job, int p0, int p1, float *xp)
{
    (void)job, (void)p0, (void)p1, (void)xp;
}

#endif
