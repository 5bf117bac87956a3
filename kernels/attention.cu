/* Paged causal attention for a step mixing prefill tiles and decode rows (flash-decoding
 * style): pass 1 computes one partial softmax per (row, split, query head), pass 2 combines
 * a row's splits in split order. The contract is kvg_k_attn_args in kvg_kernels.h. The
 * families' variations (a layer's sliding window, score soft-capping, the score divisor)
 * are arguments of the same kernels.
 *
 * Pass 1: grid (item, kv head). The block loads the split's K and V for its kv head from the
 * pool (through the sequence's block table) into shared memory, in chunks of C keys, ONCE
 * for all the (row, query head) pairs of the item: the tile's rows times the GQA group's
 * query heads. Each pair is owned by one warp, which keeps its running {m, l, acc} in
 * registers across the chunks. For one pair and one chunk, with nk = the keys of the chunk
 * at or before the row's position:
 *   - scores: lane j computes key j's dot q.k alone, over head_dim in index order (two
 *     fmaf chains, even and odd elements, added at the end), times scale; soft-capped
 *     (cap * tanhf(s / cap)) when the model caps;
 *   - cmax = max of the nk scores (a warp max: exact in any order), m' = max(m, cmax);
 *   - p_j = expf(s_j - m'); alpha = expf(m - m'); l *= alpha, acc *= alpha;
 *   - then, for j = 0 .. nk-1 in key order: l += p_j, acc[d] = fmaf(p_j, v_j[d], acc[d])
 *     (lane = element pair of head_dim).
 * C depends only on head_dim and split_tokens, the keys visited only on the row's position:
 * the arithmetic of a pair is the same whether the row is a decode item alone or one of 16
 * rows of a prefill tile, and whatever the launch's other items (which warp owns the pair,
 * how many warps the block has, how many passes the tile needs: none of it enters a value).
 * A sliding window (keys [pos - W + 1, pos]) only moves where a pair starts: at j0, the
 * chunk's first key in the window; a chunk wholly before it is skipped (block-wide when it
 * is before the tile's first row's window). Both depend on the row's position alone.
 *
 * Pass 2: one warp per (row, query head): M = max_j m_j, L = sum_j exp(m_j - M) l_j and
 * out = sum_j exp(m_j - M) acc_j / L, the sums in split order (fmaf), for every row, one
 * split included; splits wholly before a row's window (m = -inf, l = 0: exact zeros) are
 * left out. An attention sink (gpt-oss: one logit per head, no value) joins here, once per
 * (row, head): M starts at the sink instead of -inf, and after the splits' sum L gains
 * exp(sink - M), as the CPU backend adds it after its lanes' reduction. Pass 1 does not
 * see it: a split's partial is its keys' alone, so a sink could not be counted once per
 * split, and the partials (and their invariance) are the same with or without sinks. */
#include "kvg_device.cuh"

#define ATT_MAX_WARPS 8
#define ATT_SMEM_BUDGET (46 * 1024)    /* dynamic shared memory per block, < 48 KiB */
#define ATT_COMBINE_WARPS 4

/* Shared memory of pass 1 for C keys and a K/V row stride of SW 32-bit words:
 *   int64_t key_off[C]          word offset of key j's K row in the pool
 *   unsigned k[C][SW], v[C][SW] the chunk's K and V (BF16 pairs, or 4 int8 a word), SW odd
 *                               so that 32 lanes reading word w of 32 consecutive keys hit
 *                               32 banks
 *   float ks[C], vs[C]          int8 layers only: each key's K and V scale
 *   float p[ATT_MAX_WARPS][C]   each warp's scores, then probabilities
 * Sized for ATT_MAX_WARPS whatever the block, so C never depends on the launch. Then, on
 * top of the chunk's budget (so that C stays what it was before it was added):
 *   float q[ATT_MAX_WARPS][head_dim]  the query of the pair each warp is on: its 32 lanes
 *                               read the same element at once (a broadcast), where they
 *                               used to read q from global memory inside the dot product. */
static inline size_t attn_smem_bytes(int C, int SW, bool i8)
{
    return (size_t)C * (sizeof(int64_t) + 2 * sizeof(unsigned) * (size_t)SW + (i8 ? 2 * sizeof(float) : 0) +
                        sizeof(float) * ATT_MAX_WARPS);
}

static inline size_t attn_q_bytes(int head_dim)
{
    return sizeof(float) * ATT_MAX_WARPS * (size_t)head_dim;
}

/* Element e of a pool word: BF16 (2 a word, element 2w + e in the low (e = 0) or high
 * half) or int8 (4 a word, element 4w + e in byte e: little-endian). Both conversions are
 * exact. */
template <bool I8>
__device__ __forceinline__ float kv_elem(unsigned w, int e)
{
    if (I8)
        return (float)(int)(signed char)(unsigned char)(w >> (8 * e));
    return __uint_as_float(e == 0 ? w << 16 : w & 0xffff0000u);
}

/* I8: the layer is int8 (kvg_kernels.h: int8 K and V rows, a float scale per token), whose
 * dequantization is exact conversion then scale:
 *   score_j = ((sum_d q[d] * (float)k8_j[d]) * kscale_j) * scale,
 *   acc[d] = fmaf(p_j * vscale_j, (float)v8_j[d], acc[d]), l += p_j;
 * every value a function of the stored bytes, the row's q and its position, as for BF16.
 * NW: 32-bit words of head_dim per lane, 1, 2 or 4 (BF16: head_dim <= 64, 128, 256; int8:
 * 1 or 2, head_dim <= 128, 256). PW = 16 / (elements a lane holds) pairs per warp per pass
 * keeps acc at 16 registers. */
template <bool I8, int NW>
__global__ void __launch_bounds__(ATT_MAX_WARPS * KVG_WARP, 2)
attn_pass1(kvg_k_attn_args a, int C, int SW)
{
    constexpr int EPW = I8 ? 4 : 2;      /* elements a 32-bit word holds */
    constexpr int PW = 16 / (EPW * NW);
    KVG_DYNAMIC_SMEM(unsigned char, smem);
    int64_t *key_off = (int64_t *)smem;
    unsigned *kw = (unsigned *)(key_off + C);
    unsigned *vw = kw + (size_t)C * SW;
    float *ksc = (float *)(vw + (size_t)C * SW);
    float *vsc = ksc + C;
    float *pbuf = I8 ? vsc + C : ksc;
    float *qbuf = pbuf + (size_t)ATT_MAX_WARPS * C;

    const kvg_k_attn_item it = a.items[a.item0 + blockIdx.x];
    const int kvh = blockIdx.y;
    const int G = a.n_heads / a.g.n_kv_heads;
    const int hd = a.g.head_dim, hw = hd / EPW, bt = a.g.block_tokens;
    const int lane = threadIdx.x % KVG_WARP, warp = threadIdx.x / KVG_WARP;
    const int n_warps = blockDim.x / KVG_WARP;
    float *ps = pbuf + (size_t)warp * C;
    float *qs = qbuf + (size_t)warp * hd;
    const int split_start = it.split * a.split_tokens;
    const int split_end = split_start + a.split_tokens;

    /* Keys past the tile's last position are never read (a load bound, not arithmetic). */
    int max_pos = -1;
    for (int i = 0; i < it.n_rows; i++)
        max_pos = max(max_pos, (int)a.pos[it.row0 + i]);
    const int kv_end = min(split_end, max_pos + 1);
    if (kv_end <= split_start)
        return;                      /* no row of the item has this split (whole block) */
    /* With a window, chunks before the first row's window are skipped (no row of the tile
     * sees them; the tile's rows have consecutive positions, the first is the lowest). The
     * first chunk kept is still at split_start + a multiple of C: chunk boundaries, hence
     * every row's arithmetic, stay functions of position. */
    int c_first = split_start;
    if (a.window > 0) {
        const int lo = (int)a.pos[it.row0] - a.window + 1;
        if (lo > split_start)
            c_first = split_start + (lo - split_start) / C * C;
    }

    const int32_t *table = a.tables + a.table_off[it.seq];
    const unsigned *pool = (const unsigned *)a.pool;
    /* The (layer, kv head)'s start in a block, in words: BF16 rows of head_dim elements;
     * int8 rows of head_dim bytes after the BF16 layers, then the scales (2 bt floats). */
    const int64_t head_base =
        I8 ? (a.g.i8_off + ((int64_t)(a.layer - (a.g.n_layers - a.g.n_i8)) * a.g.n_kv_heads + kvh) *
                               a.g.head_bytes_i8) / 4
           : ((int64_t)a.layer * a.g.layer_elems + (int64_t)kvh * a.g.head_elems) / 2;
    const int v_delta = bt * hw;     /* words from a key's K row to its V row */
    const int n_pairs = it.n_rows * G;
    const int per_pass = n_warps * PW;
    const int64_t q_stride = (int64_t)a.n_heads * hd;

    for (int pass0 = 0; pass0 < n_pairs; pass0 += per_pass) {
        float m[PW], l[PW], acc[PW][EPW * NW];
KVG_UNROLL
        for (int pi = 0; pi < PW; pi++) {
            m[pi] = -INFINITY;
            l[pi] = 0.0f;
KVG_UNROLL
            for (int e = 0; e < EPW * NW; e++)
                acc[pi][e] = 0.0f;
        }

        for (int c0 = c_first; c0 < kv_end; c0 += C) {
            const int clen = min(C, kv_end - c0);
            __syncthreads();         /* the previous chunk's readers are done */
            for (int j = threadIdx.x; j < clen; j += blockDim.x) {
                const int p = c0 + j, t = p % bt;
                /* the block's start in words (block_elems: 2-byte units) */
                const int64_t hb = (int64_t)table[p / bt] * a.g.block_elems / 2 + head_base;
                key_off[j] = hb + (int64_t)t * hw;
                if (I8) {
                    ksc[j] = __uint_as_float(pool[hb + 2 * v_delta + t]);
                    vsc[j] = __uint_as_float(pool[hb + 2 * v_delta + bt + t]);
                }
            }
            __syncthreads();
            /* Consecutive threads read consecutive words of a key row (and the rows of one
             * pool block are contiguous): coalesced. A BF16 row of head_dim % 8 == 0
             * elements starts on 16 bytes (the pool is 256-byte aligned, its rows whole
             * 16-byte multiples): 128-bit loads, four words stored apart (SW is odd). */
            if (!I8 && hw % 4 == 0) {
                const int hq = hw / 4;
                for (int idx = threadIdx.x; idx < clen * hq; idx += blockDim.x) {
                    const int j = idx / hq, w = (idx - j * hq) * 4;
                    const int64_t o = key_off[j] + w;
                    const uint4 kq = *(const uint4 *)(pool + o);
                    const uint4 vq = *(const uint4 *)(pool + o + v_delta);
                    unsigned *kd = kw + j * SW + w, *vd = vw + j * SW + w;
                    kd[0] = kq.x;
                    kd[1] = kq.y;
                    kd[2] = kq.z;
                    kd[3] = kq.w;
                    vd[0] = vq.x;
                    vd[1] = vq.y;
                    vd[2] = vq.z;
                    vd[3] = vq.w;
                }
            } else {
                for (int idx = threadIdx.x; idx < clen * hw; idx += blockDim.x) {
                    const int j = idx / hw, w = idx - j * hw;
                    const int64_t o = key_off[j] + w;
                    kw[j * SW + w] = pool[o];
                    vw[j * SW + w] = pool[o + v_delta];
                }
            }
            __syncthreads();

KVG_UNROLL
            for (int pi = 0; pi < PW; pi++) {
                const int pair = pass0 + warp + pi * n_warps;
                if (pair >= n_pairs)
                    continue;        /* warp-uniform */
                const int rr = pair / G;
                const int r = it.row0 + rr, h = kvh * G + (pair - rr * G);
                const int nk = min(clen, (int)a.pos[r] + 1 - c0);
                if (nk <= 0)
                    continue;        /* the row ends before this chunk (warp-uniform) */
                /* j0: the chunk's first key in the row's window (0 without one). */
                const int j0 = a.window > 0 ? max(0, (int)a.pos[r] - a.window + 1 - c0) : 0;
                if (j0 >= nk)
                    continue;        /* the chunk is before the row's window (warp-uniform) */
                /* The pair's q into the warp's slot: read from global memory once per
                 * chunk instead of once per key. (The slot's last readers finished at the
                 * __syncwarp that ends the previous pair, or the chunk's __syncthreads.) */
                const float *qg = a.q + r * q_stride + (int64_t)h * hd;
                for (int e = lane; e < hd; e += KVG_WARP)
                    qs[e] = qg[e];
                __syncwarp(KVG_FULL_MASK);

                float cmax = -INFINITY;
                for (int j = j0 + lane; j < nk; j += KVG_WARP) {
                    const unsigned *kr = kw + j * SW;
                    /* two chains, even and odd elements, each in index order */
                    float s0 = 0.0f, s1 = 0.0f;
                    for (int w = 0; w < hw; w++) {
                        const unsigned kq = kr[w];
KVG_UNROLL
                        for (int e = 0; e < EPW; e += 2) {
                            s0 = fmaf(qs[EPW * w + e], kv_elem<I8>(kq, e), s0);
                            s1 = fmaf(qs[EPW * w + e + 1], kv_elem<I8>(kq, e + 1), s1);
                        }
                    }
                    float sc = I8 ? __fmul_rn(__fmul_rn(s0 + s1, ksc[j]), a.scale) : (s0 + s1) * a.scale;
                    if (a.softcap > 0.0f)
                        sc = a.softcap * tanhf(sc / a.softcap);
                    ps[j] = sc;
                    cmax = fmaxf(cmax, sc);
                }
                cmax = kvg_warp_max(cmax);
                const float m_new = fmaxf(m[pi], cmax);
                for (int j = j0 + lane; j < nk; j += KVG_WARP)
                    ps[j] = expf(ps[j] - m_new);   /* the lane that wrote ps[j] */
                __syncwarp(KVG_FULL_MASK);
                const float alpha = expf(m[pi] - m_new);   /* 0 for the first chunk */
                l[pi] *= alpha;
KVG_UNROLL
                for (int e = 0; e < EPW * NW; e++)
                    acc[pi][e] *= alpha;
                for (int j = j0; j < nk; j++) {
                    const float p = ps[j];
                    const float pv = I8 ? __fmul_rn(p, vsc[j]) : p;   /* V's scale in the weight */
                    const unsigned *vr = vw + j * SW;
                    l[pi] += p;
KVG_UNROLL
                    for (int i = 0; i < NW; i++) {
                        const int w = lane + KVG_WARP * i;
                        if (w < hw) {
                            const unsigned vq = vr[w];
KVG_UNROLL
                            for (int e = 0; e < EPW; e++)
                                acc[pi][EPW * i + e] = fmaf(pv, kv_elem<I8>(vq, e), acc[pi][EPW * i + e]);
                        }
                    }
                }
                m[pi] = m_new;
                __syncwarp(KVG_FULL_MASK);   /* ps is rewritten by the next pair */
            }
        }

KVG_UNROLL
        for (int pi = 0; pi < PW; pi++) {
            const int pair = pass0 + warp + pi * n_warps;
            if (pair >= n_pairs)
                continue;
            const int rr = pair / G;
            const int r = it.row0 + rr, h = kvh * G + (pair - rr * G);
            if (a.pos[r] < split_start)
                continue;            /* the row has no such split: it writes nothing */
            float *dst = a.partials +
                         ((int64_t)(a.row_part[r] - a.part0 + it.split) * a.n_heads + h) * (hd + 2);
            if (lane == 0) {
                dst[0] = m[pi];
                dst[1] = l[pi];
            }
KVG_UNROLL
            for (int i = 0; i < NW; i++) {
                const int w = lane + KVG_WARP * i;
                if (w < hw) {
KVG_UNROLL
                    for (int k = 0; k < EPW / 2; k++)
                        ((float2 *)(dst + 2))[EPW / 2 * w + k] =
                            make_float2(acc[pi][EPW * i + 2 * k], acc[pi][EPW * i + 2 * k + 1]);
                }
            }
        }
    }
}

/* grid (row, group of ATT_COMBINE_WARPS query heads); warp = one (row, head). */
__global__ void __launch_bounds__(ATT_COMBINE_WARPS * KVG_WARP)
attn_combine(kvg_k_attn_args a)
{
    const int lane = threadIdx.x % KVG_WARP;
    const int r = a.row0 + blockIdx.x;
    const int h = blockIdx.y * ATT_COMBINE_WARPS + threadIdx.x / KVG_WARP;
    if (h >= a.n_heads)
        return;                      /* no barrier in this kernel */
    const int hd = a.g.head_dim, hw = hd / 2;
    const int n_splits = a.pos[r] / a.split_tokens + 1;
    const int64_t stride = (int64_t)a.n_heads * (hd + 2);
    const float *base = a.partials + ((int64_t)(a.row_part[r] - a.part0) * a.n_heads + h) * (hd + 2);
    /* Splits wholly before the row's window hold m = -inf, l = 0, acc = 0: they would add
     * exact zeros, so they are skipped (the same bits). */
    int j_lo = 0;
    if (a.window > 0 && a.pos[r] - a.window + 1 > 0)
        j_lo = (a.pos[r] - a.window + 1) / a.split_tokens;

    const float sink = a.sinks ? a.sinks[h] : -INFINITY;
    float M = sink;
    for (int j = j_lo; j < n_splits; j++)
        M = fmaxf(M, base[j * stride]);
    float L = 0.0f;
    for (int j = j_lo; j < n_splits; j++)
        L = fmaf(expf(base[j * stride] - M), base[j * stride + 1], L);
    if (a.sinks)
        L += expf(sink - M);

    float2 *o = (float2 *)(a.out + (int64_t)r * a.n_heads * hd + (int64_t)h * hd);
    for (int w = lane; w < hw; w += KVG_WARP) {
        float ox = 0.0f, oy = 0.0f;
        for (int j = j_lo; j < n_splits; j++) {
            const float *pj = base + j * stride;
            const float e = expf(pj[0] - M);
            const float2 v = ((const float2 *)(pj + 2))[w];
            ox = fmaf(e, v.x, ox);
            oy = fmaf(e, v.y, oy);
        }
        const float2 res = make_float2(ox / L, oy / L);
        o[w] = res;
        if (a.out_lowp) {
            /* wo's input, rounded here instead of by a launch of its own (the same bits) */
            const int64_t at = ((int64_t)r * a.n_heads * hd + (int64_t)h * hd) / 2 + w;
            if (a.out_lowp_dt == KVG_KT_BF16)
                ((__nv_bfloat162 *)a.out_lowp)[at] = __float22bfloat162_rn(res);
            else
                ((__half2 *)a.out_lowp)[at] = __float22half2_rn(res);
        }
    }
}

extern "C" cudaError_t kvg_k_attention(cudaStream_t s, const kvg_k_attn_args *a)
{
    if (!a)
        return cudaErrorInvalidValue;
    if (a->n_rows <= 0)
        return cudaSuccess;
    const kvg_k_kv_geom *g = &a->g;
    const int hd = g->head_dim;
    if (!a->pool || !a->q || !a->pos || !a->row_part || !a->partials || !a->out ||
        (a->n_items > 0 && (!a->items || !a->tables || !a->table_off)) || a->n_items < 0 ||
        hd <= 0 || hd % 2 || hd > KVG_K_ATTN_MAX_HEAD_DIM || g->n_kv_heads <= 0 ||
        a->n_heads <= 0 || a->n_heads % g->n_kv_heads || g->block_tokens <= 0 ||
        a->split_tokens <= 0 || a->split_tokens % g->block_tokens || a->layer < 0 ||
        a->layer >= g->n_layers || a->max_tile_rows < 1 || a->max_tile_rows > KVG_K_ATTN_MAX_TILE ||
        a->window < 0 || !(a->softcap >= 0.0f) || a->item0 < 0 || a->row0 < 0 || a->part0 < 0 ||
        (a->out_lowp && ((a->out_lowp_dt != KVG_KT_BF16 && a->out_lowp_dt != KVG_KT_F16) ||
                         !kvg_aligned(a->out_lowp, 4))))
        return cudaErrorInvalidValue;
    /* 4-byte pool words, float2 q/partials/out accesses */
    if (!kvg_aligned(a->pool, 4) || !kvg_aligned(a->q, 8) || !kvg_aligned(a->partials, 8) ||
        !kvg_aligned(a->out, 8))
        return cudaErrorInvalidValue;

    if (a->n_items > 0) {
        const bool i8 = kvg_k_layer_int8(g, a->layer);
        if (i8 && hd % 4)
            return cudaErrorInvalidValue;
        const int hw = i8 ? hd / 4 : hd / 2;     /* 32-bit words a row */
        const int SW = hw | 1;
        /* The chunk: as many keys as fit (a multiple of 32 when more than 32 fit), at most
         * the split. A function of head_dim, split_tokens and the layer's type only. */
        int C = (int)(ATT_SMEM_BUDGET / attn_smem_bytes(1, SW, i8));
        if (C >= KVG_WARP)
            C = C / KVG_WARP * KVG_WARP;
        if (C > a->split_tokens)
            C = a->split_tokens;
        const int G = a->n_heads / g->n_kv_heads;
        int warps = a->max_tile_rows * G;
        if (warps > ATT_MAX_WARPS)
            warps = ATT_MAX_WARPS;
        void (*k1)(kvg_k_attn_args, int, int) =
            i8 ? (hw <= 32 ? attn_pass1<true, 1> : attn_pass1<true, 2>)
               : (hw <= 32 ? attn_pass1<false, 1> : hw <= 64 ? attn_pass1<false, 2> : attn_pass1<false, 4>);
        const kvg_k_attn_args args = *a;
        const size_t smem = attn_smem_bytes(C, SW, i8) + attn_q_bytes(hd);
        if (smem > 48u * 1024u)
            return cudaErrorInvalidValue;   /* not for head_dim <= KVG_K_ATTN_MAX_HEAD_DIM */
        KVG_LAUNCH(k1, dim3((unsigned)a->n_items, (unsigned)g->n_kv_heads),
                   dim3((unsigned)warps * KVG_WARP), smem, s, args, C, SW);
    }
    {
        const kvg_k_attn_args args = *a;
        const unsigned groups = (unsigned)(a->n_heads + ATT_COMBINE_WARPS - 1) / ATT_COMBINE_WARPS;
        KVG_LAUNCH(attn_combine, dim3((unsigned)a->n_rows, groups),
                   dim3(ATT_COMBINE_WARPS * KVG_WARP), 0, s, args);
    }
    return kvg_launch_result();
}
