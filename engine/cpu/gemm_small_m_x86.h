/* The small-M path (decode: M < PACKED_MIN_M, W streamed once through registers) of the
 * x86 GEMM kernels, written once: gemm_avx2.c and gemm_avx512.c each include this file
 * once, after defining their register block, and get their own copy compiled for their
 * own target. Not a normal header: no include guard, and it defines static functions
 * (as gemm_packed_x86.h, the packed path, does).
 *
 * What stays in the ISA's file is the arithmetic: block() computes an MR x NR block of
 * outputs over all of K in the canonical order (gemm_kernels.h). What is here only
 * decides which block computes which outputs, which changes no output bit: the table of
 * block shapes, the walk over the rows of X MR at a time (panel), and the cut of W into
 * blocks of rows that stay in L2 while every group of X rows passes over them.
 *
 * The including file defines:
 *   TGT                     its target attribute
 *   block(x, w, w0, cs, dt, K, bias, y, ldy, MR, NR)
 *                           an always-inline MR x NR block (MR, NR constants): x is MR
 *                           rows (stride K); w holds NR rows starting at element offset
 *                           w0, cs rows apart; y is MR rows (stride ldy), NR columns cs
 *                           apart; the K tail zero-padded
 *   MR_MAX, NR_MAX          the largest block
 *   SMALL_M_BLOCKS(F)       F(MR, NR) for every block shape the kernel may run: at least
 *                           each MR in 1..MR_MAX with every NR in 1..nr_for_mr[MR]
 *   nr_for_mr[MR_MAX + 1]   W rows per block for MR X rows (the register budget)
 *   W_BLOCK_BYTES           bytes of W rows per L2-resident block
 * and gets small_m_path(job, n0, n1): outputs [n0, n1) of every row of X. */

typedef void (*block_fn)(const float *x, const void *w, size_t w0, size_t cs, kvg_dtype dt,
                         int K, const float *bias, float *y, size_t ldy);

/* One function per block shape, each with the dtype branch hoisted out of its loop. */
#define BLOCK_FN(MR, NR)                                                                  \
    TGT static void block_##MR##x##NR(const float *x, const void *w, size_t w0, size_t cs, \
                                      kvg_dtype dt, int K, const float *bias, float *y,   \
                                      size_t ldy)                                         \
    {                                                                                     \
        if (dt == KVG_DT_F32)                                                             \
            block(x, w, w0, cs, KVG_DT_F32, K, bias, y, ldy, MR, NR);                     \
        else if (dt == KVG_DT_F16)                                                        \
            block(x, w, w0, cs, KVG_DT_F16, K, bias, y, ldy, MR, NR);                     \
        else                                                                              \
            block(x, w, w0, cs, KVG_DT_BF16, K, bias, y, ldy, MR, NR);                    \
    }
SMALL_M_BLOCKS(BLOCK_FN)
#undef BLOCK_FN

/* blocks[MR][NR]: NULL for the shapes the kernel has none of. */
#define BLOCK_ENTRY(MR, NR) [MR][NR] = block_##MR##x##NR,
static const block_fn blocks[MR_MAX + 1][NR_MAX + 1] = { SMALL_M_BLOCKS(BLOCK_ENTRY) };
#undef BLOCK_ENTRY

/* Rows [nb0, nb1) of W against all of X. The NR W rows of a block are spread, not
 * adjacent: the panel is cut into NR equal slices and block i takes row i of each, so
 * each of the NR streams reads its slice front to back (the rows left over, fewer than
 * NR, go last as one adjacent block). Measured on AMD EPYC (Zen 4): NR adjacent rows
 * read in lockstep -- one page read back and forth -- ran F16 decode at a third of the
 * bandwidth of one stream, the hardware prefetchers losing track; spread streams get
 * it all. Which rows share a block changes no output bit. */
TGT static void panel(const kvg_gemm_job *job, int nb0, int nb1)
{
    int K = job->K;

    for (int m0 = 0; m0 < job->M; m0 += MR_MAX) {
        int mr = job->M - m0 < MR_MAX ? job->M - m0 : MR_MAX;
        int NR = nr_for_mr[mr];
        int per = (nb1 - nb0) / NR, rest = (nb1 - nb0) - per * NR;
        const float *x = job->x + (size_t)m0 * (size_t)K;
        float *y = job->y + (size_t)m0 * (size_t)job->N;
        for (int i = 0; i < per; i++) {
            int n = nb0 + i;
            blocks[mr][NR](x, job->w, (size_t)n * (size_t)K, (size_t)per, job->dt, K,
                           job->bias ? job->bias + n : NULL, y + n, (size_t)job->N);
        }
        if (rest > 0) {
            int n = nb0 + per * NR;
            blocks[mr][rest](x, job->w, (size_t)n * (size_t)K, 1, job->dt, K,
                             job->bias ? job->bias + n : NULL, y + n, (size_t)job->N);
        }
    }
}

static void small_m_path(const kvg_gemm_job *job, int n0, int n1)
{
    size_t row_bytes = (size_t)(job->K > 0 ? job->K : 1) * sizeof(float);
    int nb = (int)(W_BLOCK_BYTES / row_bytes);

    /* Up to MR_MAX rows of X pass over W once: no block need stay in L2. */
    if (job->M <= MR_MAX) {
        panel(job, n0, n1);
        return;
    }
    nb = nb < 16 ? 16 : nb - nb % NR_MAX;
    for (int b0 = n0; b0 < n1; b0 += nb) {
        int b1 = n1 - b0 < nb ? n1 : b0 + nb;
        panel(job, b0, b1);
    }
}
