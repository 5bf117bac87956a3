/* The packed path (M >= PACKED_MIN_M, prefill) of the x86 GEMM kernels, written once:
 * gemm_avx2.c and gemm_avx512.c each include this file once, after defining the
 * vector width and the few intrinsics it needs (below) and after including
 * gemm_small_m_x86.h, and get their own copy compiled for their own target. Not a
 * normal header: no include guard, and it defines static functions plus the ISA's
 * entry points kvg_gemm_plan_*, kvg_gemm_pack_x_* and kvg_gemm_kernel_* (which runs
 * this path or the small-M one).
 *
 * The 16 lanes of the canonical order (gemm_kernels.h) are 16 independent FMA chains,
 * so they can be computed one lane at a time: lane l of output (m, n) is the chain
 * over k = l, l+16, l+32, ... of fma(x[m][k], w[n][k], acc), zero-padded to a
 * multiple of 16. Computing lane l for a tile of PMR X rows x PNR W rows is then an
 * outer-product micro-kernel (broadcast one X value, multiply two vectors of W rows),
 * which reuses every load several times like a BLAS kernel does -- and each
 * accumulator element is still exactly one chain of one output.
 *
 * The fixed tree over the 16 lane results is folded into the micro-kernel's stores:
 * lanes run in the order 0..15 and each lane adds its chain into 8 slots per output
 * exactly where the tree pairs it (see lane_store), so the last lane yields the sum.
 *
 * Packed layouts, with Kp = K rounded up to 16 and J = Kp / 16 (zeros past K):
 *   Xp:    panels of PMR rows:  [panel][lane][j][PMR]   (packed once per product)
 *   Wp:    panels of PNR rows:  [panel][lane][j][PNR]   (per participant, a block)
 *   slots: per X panel:         [slot 0..7][PMR][PNR]   (per participant)
 * The scratch comes from the caller (kvg_gemm's workspace); nothing here allocates.
 *
 * The including file defines:
 *   TGT, TGT_INLINE         its target attribute (a function, an always-inline one)
 *   PK_V, PK_VL             the vector type and its floats (PNR = 2 * PK_VL)
 *   PK_ZERO() PK_LOAD(p) PK_STORE(p, v) PK_LOADU(p) PK_STOREU(p, v) PK_ADD(a, b)
 *   PK_FMA(a, b, c) (= a * b + c, one rounding) PK_BCAST(p) (*p in every lane)
 *   PMR                     X rows per micro-kernel tile
 *   PK_ROWS(F)              F(0) F(1) ... F(PMR - 1)
 *   WP_BYTES, XB_BYTES      packed W block (stays in L2), X panels per m-block (and
 *                           their slots) kept near L1
 *   PK_ISA                  the suffix of the exported names (avx2, avx512)
 *   PACKED_MIN_M            the fewest X rows that take this path: below it, the
 *                           ISA's small-M kernel (W streamed through registers, X rows
 *                           MR at a time over an L2-resident block of W) is faster,
 *                           as packing W is paid once per W block whatever M is. */

#define PNR (2 * PK_VL)
#define TILE (PMR * PNR)

#define PK_CAT2(a, b) a##b
#define PK_CAT(a, b) PK_CAT2(a, b)
#define PK_PLAN PK_CAT(kvg_gemm_plan_, PK_ISA)
#define PK_PACK_X PK_CAT(kvg_gemm_pack_x_, PK_ISA)
#define PK_KERNEL PK_CAT(kvg_gemm_kernel_, PK_ISA)

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

/* Folds lane `l`'s chain result `a` (PK_VL outputs) into the tree, with S(i) the
 * outputs' slot i:
 *   lanes 0-7:   S(l) = a_l
 *   lanes 8-11:  S(l-8) = a_{l-8} + a_l                      (h_0..h_3)
 *   lanes 12,13: S(l-12) = h_{l-12} + (a_{l-8} + a_l)        (q_0, q_1)
 *   lane 14:     S(0) = q_0 + (h_2 + (a_6 + a_14))           (d_0 = q_0 + q_2)
 *   lane 15:     s = d_0 + (q_1 + (h_3 + (a_7 + a_15)))      (d_0 + d_1)
 * which is exactly h_i = a_i + a_{i+8}, q_i = h_i + h_{i+4}, d_i = q_i + q_{i+2},
 * s = d_0 + d_1. Returns s for lane 15. */
TGT_INLINE PK_V lane_store(PK_V a, float *s0, int l)
{
#define S(i) (s0 + (size_t)(i) * TILE)
    if (l < 8) {
        PK_STORE(S(l), a);
    } else if (l < 12) {
        PK_STORE(S(l - 8), PK_ADD(PK_LOAD(S(l - 8)), a));
    } else if (l < 14) {
        PK_V h = PK_ADD(PK_LOAD(S(l - 8)), a);
        PK_STORE(S(l - 12), PK_ADD(PK_LOAD(S(l - 12)), h));
    } else if (l == 14) {
        PK_V h = PK_ADD(PK_LOAD(S(6)), a);
        PK_V q = PK_ADD(PK_LOAD(S(2)), h);
        PK_STORE(S(0), PK_ADD(PK_LOAD(S(0)), q));
    } else {
        PK_V h = PK_ADD(PK_LOAD(S(7)), a);
        PK_V q = PK_ADD(PK_LOAD(S(3)), h);
        PK_V d = PK_ADD(PK_LOAD(S(1)), q);
        return PK_ADD(PK_LOAD(S(0)), d);
    }
    return a;
#undef S
}

/* One lane of a PMR x PNR tile: J steps of the chains, folded into the slots. On the
 * last lane the sums (+ bias) go to y when the tile is whole (`y` non-NULL), else to
 * slot 0 for the caller to copy out. Named accumulators (c<row>0, c<row>1), not an
 * array: GCC keeps an array of vectors in memory. */
TGT static void micro(const float *xl, const float *wl, int J, float *slots, int l,
                      float *y, size_t ldy, const float *bias)
{
    PK_V z = PK_ZERO();
#define DECL(r) PK_V c##r##0 = z, c##r##1 = z;
    PK_ROWS(DECL)
#undef DECL
    for (int j = 0; j < J; j++) {
        PK_V w0 = PK_LOAD(wl), w1 = PK_LOAD(wl + PK_VL), b;
#define ROW(r)                                 \
        b = PK_BCAST(xl + r);                  \
        c##r##0 = PK_FMA(b, w0, c##r##0);      \
        c##r##1 = PK_FMA(b, w1, c##r##1);
        PK_ROWS(ROW)
#undef ROW
        wl += PNR;
        xl += PMR;
    }
    if (l < 15) {
#define FOLD(r)                                              \
        lane_store(c##r##0, slots + r * PNR, l);             \
        lane_store(c##r##1, slots + r * PNR + PK_VL, l);
        PK_ROWS(FOLD)
#undef FOLD
    } else if (y) {
        PK_V b0 = bias ? PK_LOADU(bias) : z;
        PK_V b1 = bias ? PK_LOADU(bias + PK_VL) : z;
#define FINAL(r)                                                               \
        {                                                                      \
            PK_V s0 = lane_store(c##r##0, slots + r * PNR, 15);                \
            PK_V s1 = lane_store(c##r##1, slots + r * PNR + PK_VL, 15);        \
            if (bias) {                                                        \
                s0 = PK_ADD(s0, b0);                                           \
                s1 = PK_ADD(s1, b1);                                           \
            }                                                                  \
            PK_STOREU(y + r * ldy, s0);                                        \
            PK_STOREU(y + r * ldy + PK_VL, s1);                                \
        }
        PK_ROWS(FINAL)
#undef FINAL
    } else {
#define EDGE(r)                                                                             \
        PK_STORE(slots + r * PNR, lane_store(c##r##0, slots + r * PNR, 15));                \
        PK_STORE(slots + r * PNR + PK_VL, lane_store(c##r##1, slots + r * PNR + PK_VL, 15));
        PK_ROWS(EDGE)
#undef EDGE
    }
}

/* W rows per packed block (before it is cut to the range) and X panels per m-block:
 * the plan sizes the scratch from these, packed_path uses them. */
static int packed_nb(int Kp)
{
    int nb = (int)(WP_BYTES / ((size_t)Kp * sizeof(float))) / PNR * PNR;
    return nb < PNR ? PNR : nb;
}

static int packed_mb(int J)
{
    int mb = (int)(XB_BYTES / ((size_t)16 * (size_t)J * PMR * sizeof(float)));
    return mb < 1 ? 1 : mb;
}

/* Columns [n0, n1) against all of X, already packed in job->xp; s is this
 * participant's scratch, as large as the plan asks. */
static void packed_path(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s)
{
    int K = job->K, J = (K + 15) / 16, Kp = 16 * J, M = job->M;
    int x_panels = (M + PMR - 1) / PMR;
    size_t xpanel = (size_t)16 * (size_t)J * PMR;
    size_t wpanel = (size_t)16 * (size_t)J * PNR;
    size_t rowb = kvg_gemm_row_bytes(job->dt, K);
    int nb = packed_nb(Kp), mb = packed_mb(J);
    const float *xp = job->xp;
    float *wp = s->wp, *slots = s->slots;

    if (nb > n1 - n0)
        nb = (n1 - n0 + PNR - 1) / PNR * PNR;
    if (mb > x_panels)
        mb = x_panels;
    for (int b0 = n0; b0 < n1; b0 += nb) {
        int rows = n1 - b0 < nb ? n1 - b0 : nb;
        int panels = (rows + PNR - 1) / PNR;
        /* The next block's raw rows are prefetched while this one computes, so that
         * packing it does not wait for memory. */
        const char *next = (const char *)job->w + (size_t)(b0 + rows) * rowb;
        size_t next_bytes = b0 + rows < n1 ? (size_t)(n1 - b0 - rows < nb ? n1 - b0 - rows : nb) *
                                                 rowb : 0;
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
}

void PK_PLAN(const kvg_gemm_job *job, kvg_gemm_plan *plan)
{
    int J = (job->K + 15) / 16;
    plan->packed = job->M >= PACKED_MIN_M && job->K >= 16;
    plan->x_panels = (job->M + PMR - 1) / PMR;
    plan->n_group = PNR;
    plan->xp_floats = (size_t)plan->x_panels * 16 * (size_t)J * PMR;
    /* Upper bounds: packed_path cuts nb to its range and mb to M, never raises them.
     * (K = 0 is never packed; J >= 1 only keeps the sizes defined.) */
    if (J < 1)
        J = 1;
    plan->wp_floats = (size_t)packed_nb(16 * J) * 16 * (size_t)J;
    plan->slots_floats = (size_t)packed_mb(J) * 8 * TILE;
}

void PK_PACK_X(const kvg_gemm_job *job, int p0, int p1, float *xp)
{
    pack_x(job->x, job->K, job->M, p0, p1, (job->K + 15) / 16, xp);
}

/* The ISA's kernel: this path when kvg_gemm packed X (the plan said so and the
 * workspace fits), the small-M path (gemm_small_m_x86.h) otherwise. */
void PK_KERNEL(const kvg_gemm_job *job, int n0, int n1, const kvg_gemm_scratch *s)
{
    if (n0 >= n1 || job->M <= 0)
        return;
    if (job->xp)
        packed_path(job, n0, n1, s);
    else
        small_m_path(job, n0, n1);
}

#undef PK_PLAN
#undef PK_PACK_X
#undef PK_KERNEL
#undef PK_CAT
#undef PK_CAT2
