/* AVX2 + FMA + F16C kernel, two paths with the same arithmetic (the canonical order of
 * gemm_kernels.h):
 *   small M (decode): the 16 lanes of one output are two 8-float registers (lanes 0-7
 *     and 8-15); a register block of MR X rows by NR W rows keeps 2*MR*NR accumulators
 *     and streams W once. The tree's first step (lane i + lane i+8) is exactly the sum
 *     of the two halves.
 *   M >= PACKED_MIN_M (prefill): lane by lane over packed operands, 6 X rows x 16 W
 *     rows per micro-kernel (described below). */
#include <stdlib.h>

#include "cpu/gemm_kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "cpu/gemm_pack_x86.h"

#define TGT __attribute__((target("avx2,fma,f16c")))
#define TGT_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

/* Largest register block: 2 * MR_MAX * NR_MAX accumulators must fit with the
 * operands in 16 registers. */
#define MR_MAX 3
#define NR_MAX 4

/* Small M streams W once, in blocks of rows that stay in L2 while every group of
 * X rows passes over them. */
#define W_BLOCK_BYTES (96 * 1024)

/* s = d[0] + d[1] of the canonical tree, from h = lanes i + i+8. */
TGT_INLINE float reduce8(__m256 h)
{
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

/* One MR x NR block over all of K. x: MR rows (stride K); w: NR rows starting at
 * element offset w0 (stride K); y: MR rows (stride ldy), NR columns. */
TGT_INLINE void block(const float *x, const void *w, size_t w0, kvg_dtype dt, int K,
                      const float *bias, float *y, size_t ldy, const int MR, const int NR)
{
    __m256 acc[MR_MAX][NR_MAX][2];
    int k = 0;

    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();

    for (; k + 16 <= K; k += 16) {
        for (int h = 0; h < 2; h++) {
            __m256 xv[MR_MAX];
            for (int r = 0; r < MR; r++)
                xv[r] = _mm256_loadu_ps(x + (size_t)r * (size_t)K + (size_t)(k + 8 * h));
            for (int c = 0; c < NR; c++) {
                __m256 wv = kvg_x86_load_w8(w, w0 + (size_t)c * (size_t)K + (size_t)(k + 8 * h), dt);
                for (int r = 0; r < MR; r++)
                    acc[r][c][h] = _mm256_fmadd_ps(xv[r], wv, acc[r][c][h]);
            }
        }
    }
    if (k < K) {
        /* The tail as one more 16-wide step over zero-padded copies. */
        float xt[MR_MAX][16], wt[NR_MAX][16];
        int t = K - k;
        for (int r = 0; r < MR; r++) {
            for (int l = 0; l < 16; l++)
                xt[r][l] = l < t ? x[(size_t)r * (size_t)K + (size_t)(k + l)] : 0.0f;
        }
        for (int c = 0; c < NR; c++) {
            size_t off = w0 + (size_t)c * (size_t)K + (size_t)k;
            for (int l = 0; l < 16; l++) {
                float v = 0.0f;
                if (l < t)
                    v = dt == KVG_DT_F32 ? ((const float *)w)[off + (size_t)l]
                      : dt == KVG_DT_F16 ? kvg_gemm_f16_to_f32(((const uint16_t *)w)[off + (size_t)l])
                      : kvg_gemm_bf16_to_f32(((const uint16_t *)w)[off + (size_t)l]);
                wt[c][l] = v;
            }
        }
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < NR; c++) {
                __m256 wv = _mm256_loadu_ps(&wt[c][8 * h]);
                for (int r = 0; r < MR; r++)
                    acc[r][c][h] = _mm256_fmadd_ps(_mm256_loadu_ps(&xt[r][8 * h]), wv, acc[r][c][h]);
            }
    }

    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) {
            float s = reduce8(_mm256_add_ps(acc[r][c][0], acc[r][c][1]));
            y[(size_t)r * ldy + (size_t)c] = bias ? s + bias[c] : s;
        }
}

typedef void (*block_fn)(const float *x, const void *w, size_t w0, kvg_dtype dt, int K,
                         const float *bias, float *y, size_t ldy);

/* One function per block shape, each with the dtype branch hoisted out of its loop. */
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
BLOCK_FN(2, 1) BLOCK_FN(2, 2) BLOCK_FN(2, 3) BLOCK_FN(2, 4)
BLOCK_FN(3, 1) BLOCK_FN(3, 2) BLOCK_FN(3, 3) BLOCK_FN(3, 4)

static const block_fn blocks[MR_MAX + 1][NR_MAX + 1] = {
    [1] = { NULL, block_1x1, block_1x2, block_1x3, block_1x4 },
    [2] = { NULL, block_2x1, block_2x2, block_2x3, block_2x4 },
    [3] = { NULL, block_3x1, block_3x2, block_3x3, block_3x4 },
};

/* W rows per block for a given row count: 3 X rows pair with 2 W rows (12
 * accumulators), 2 with 3, 1 with 4 (decode: 8 independent chains). */
static const int nr_for_mr[MR_MAX + 1] = { 0, 4, 3, 2 };

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

/* ---- packed path (M >= PACKED_MIN_M) ---------------------------------------------
 *
 * The 16 lanes of the canonical order are 16 independent FMA chains, so they can be
 * computed one lane at a time: lane l of output (m, n) is the chain over
 * k = l, l+16, l+32, ... of fma(x[m][k], w[n][k], acc), zero-padded to a multiple of
 * 16. Computing lane l for a tile of PMR X rows x PNR W rows is then an outer-product
 * micro-kernel (broadcast one X value, multiply a vector of 8 W rows), which reuses
 * every load several times like a BLAS kernel does -- and each accumulator element
 * is still exactly one chain of one output.
 *
 * The fixed tree over the 16 lane results is folded into the micro-kernel's stores:
 * lanes run in the order 0..15 and each lane adds its chain into 8 slots per output
 * exactly where the tree pairs it (see lane_store), so the last lane yields the sum.
 *
 * Packed layouts, with Kp = K rounded up to 16 and J = Kp / 16 (zeros past K):
 *   Xp:    panels of PMR rows:  [panel][lane][j][PMR]
 *   Wp:    panels of PNR rows:  [panel][lane][j][PNR]
 *   slots: per X panel:         [slot 0..7][PMR][PNR] */
#define PMR 6
#define PNR 16
#define PACKED_MIN_M 8
#define WP_BYTES (128 * 1024)    /* packed W block: stays in L2 */
#define XB_BYTES (64 * 1024)     /* X panels per m-block (and their slots) near L1 */
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

/* Folds lane `l`'s chain result `a` (8 outputs) into the tree, with S(i) the 8
 * outputs' slot i:
 *   lanes 0-7:   S(l) = a_l
 *   lanes 8-11:  S(l-8) = a_{l-8} + a_l                      (h_0..h_3)
 *   lanes 12,13: S(l-12) = h_{l-12} + (a_{l-8} + a_l)        (q_0, q_1)
 *   lane 14:     S(0) = q_0 + (h_2 + (a_6 + a_14))           (d_0 = q_0 + q_2)
 *   lane 15:     s = d_0 + (q_1 + (h_3 + (a_7 + a_15)))      (d_0 + d_1)
 * which is exactly h_i = a_i + a_{i+8}, q_i = h_i + h_{i+4}, d_i = q_i + q_{i+2},
 * s = d_0 + d_1. Returns s for lane 15. */
TGT_INLINE __m256 lane_store(__m256 a, float *s0, int l)
{
#define S(i) (s0 + (size_t)(i) * TILE)
    if (l < 8) {
        _mm256_store_ps(S(l), a);
    } else if (l < 12) {
        _mm256_store_ps(S(l - 8), _mm256_add_ps(_mm256_load_ps(S(l - 8)), a));
    } else if (l < 14) {
        __m256 h = _mm256_add_ps(_mm256_load_ps(S(l - 8)), a);
        _mm256_store_ps(S(l - 12), _mm256_add_ps(_mm256_load_ps(S(l - 12)), h));
    } else if (l == 14) {
        __m256 h = _mm256_add_ps(_mm256_load_ps(S(6)), a);
        __m256 q = _mm256_add_ps(_mm256_load_ps(S(2)), h);
        _mm256_store_ps(S(0), _mm256_add_ps(_mm256_load_ps(S(0)), q));
    } else {
        __m256 h = _mm256_add_ps(_mm256_load_ps(S(7)), a);
        __m256 q = _mm256_add_ps(_mm256_load_ps(S(3)), h);
        __m256 d = _mm256_add_ps(_mm256_load_ps(S(1)), q);
        return _mm256_add_ps(_mm256_load_ps(S(0)), d);
    }
    return a;
#undef S
}

/* One lane of a PMR x PNR tile: J steps of the chains, folded into the slots. On the
 * last lane the sums (+ bias) go to y when the tile is whole (`y` non-NULL), else to
 * slot 0 for the caller to copy out. Named accumulators, not an array: GCC keeps an
 * array of vectors in memory. */
TGT static void micro(const float *xl, const float *wl, int J, float *slots, int l,
                      float *y, size_t ldy, const float *bias)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int j = 0; j < J; j++) {
        __m256 w0 = _mm256_load_ps(wl), w1 = _mm256_load_ps(wl + 8), b;
#define ROW(r)                                     \
        b = _mm256_broadcast_ss(xl + r);           \
        c##r##0 = _mm256_fmadd_ps(b, w0, c##r##0); \
        c##r##1 = _mm256_fmadd_ps(b, w1, c##r##1);
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
#undef ROW
        wl += PNR;
        xl += PMR;
    }
    if (l < 15) {
#define FOLD(r)                                             \
        lane_store(c##r##0, slots + r * PNR, l);            \
        lane_store(c##r##1, slots + r * PNR + 8, l);
        FOLD(0) FOLD(1) FOLD(2) FOLD(3) FOLD(4) FOLD(5)
#undef FOLD
    } else if (y) {
        __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
        __m256 b1 = bias ? _mm256_loadu_ps(bias + 8) : b0;
#define FINAL(r)                                                                     \
        {                                                                            \
            __m256 s0 = lane_store(c##r##0, slots + r * PNR, 15);                    \
            __m256 s1 = lane_store(c##r##1, slots + r * PNR + 8, 15);                \
            if (bias) {                                                              \
                s0 = _mm256_add_ps(s0, b0);                                          \
                s1 = _mm256_add_ps(s1, b1);                                          \
            }                                                                        \
            _mm256_storeu_ps(y + r * ldy, s0);                                       \
            _mm256_storeu_ps(y + r * ldy + 8, s1);                                   \
        }
        FINAL(0) FINAL(1) FINAL(2) FINAL(3) FINAL(4) FINAL(5)
#undef FINAL
    } else {
#define EDGE(r)                                                                          \
        _mm256_store_ps(slots + r * PNR, lane_store(c##r##0, slots + r * PNR, 15));      \
        _mm256_store_ps(slots + r * PNR + 8, lane_store(c##r##1, slots + r * PNR + 8, 15));
        EDGE(0) EDGE(1) EDGE(2) EDGE(3) EDGE(4) EDGE(5)
#undef EDGE
    }
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
        /* The next block's raw rows are prefetched while this one computes, so that
         * packing it does not wait for memory. */
        const char *next = (const char *)job->w + (size_t)(b0 + rows) * (size_t)K * wsz;
        size_t next_bytes = b0 + rows < n1 ? (size_t)(n1 - b0 - rows < nb ? n1 - b0 - rows : nb) *
                                                 (size_t)K * wsz : 0;
        size_t calls = (size_t)panels * 16 * (size_t)(x_panels < mb ? x_panels : mb);
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

void kvg_gemm_plan_avx2(const kvg_gemm_job *job, kvg_gemm_plan *plan)
{
    int J = (job->K + 15) / 16;
    plan->packed = job->M >= PACKED_MIN_M && job->K >= 16;
    plan->x_panels = (job->M + PMR - 1) / PMR;
    plan->n_group = PNR;
    plan->xp_floats = (size_t)plan->x_panels * 16 * (size_t)J * PMR;
}

void kvg_gemm_pack_x_avx2(const kvg_gemm_job *job, int p0, int p1, float *xp)
{
    pack_x(job->x, job->K, job->M, p0, p1, (job->K + 15) / 16, xp);
}

/* ---- entry ------------------------------------------------------------------------ */

static void direct_path(const kvg_gemm_job *job, int n0, int n1)
{
    size_t row_bytes = (size_t)(job->K > 0 ? job->K : 1) * sizeof(float);
    int nb = (int)(W_BLOCK_BYTES / row_bytes);

    nb = nb < 16 ? 16 : nb - nb % 4;
    for (int b0 = n0; b0 < n1; b0 += nb) {
        int b1 = n1 - b0 < nb ? n1 : b0 + nb;
        panel(job, b0, b1);
    }
}

void kvg_gemm_kernel_avx2(const kvg_gemm_job *job, int n0, int n1)
{
    if (n0 >= n1 || job->M <= 0)
        return;
    if (job->M >= PACKED_MIN_M && job->K >= 16)
        packed_path(job, n0, n1);
    else
        direct_path(job, n0, n1);
}

#else

void kvg_gemm_kernel_avx2(const kvg_gemm_job *job, int n0, int n1)
{
    kvg_gemm_kernel_generic(job, n0, n1);
}

void kvg_gemm_plan_avx2(const kvg_gemm_job *job, kvg_gemm_plan *plan)
{
    kvg_gemm_plan_generic(job, plan);
}

void kvg_gemm_pack_x_avx2(const kvg_gemm_job *job, int p0, int p1, float *xp)
{
    (void)job, (void)p0, (void)p1, (void)xp;
}

#endif
