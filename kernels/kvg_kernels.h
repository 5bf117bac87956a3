/* The CUDA kernels of the engine's GPU backend, as the host side calls them: one C
 * launcher per kernel. Each launcher enqueues its kernel(s) on `s` and returns the launch's
 * error (cudaGetLastError), cudaSuccess when there is nothing to do (a count of 0).
 *
 * All pointers are device pointers. Activations are row-major F32 [rows][width], as in
 * engine/backend.h. The same sources compile with nvcc for the GPU and, with KVG_CUDA_EMU,
 * as host C++ against kernels/emu/ (the unit tests run every kernel that way).
 *
 * Batch invariance (see engine/backend.h): what a kernel computes for one row depends only
 * on that row's inputs, never on how many rows the launch has, where the row sits or how
 * the launch is shaped. Each kernel's README entry says how it keeps that promise. */
#ifndef KVG_KERNELS_H
#define KVG_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kvg_cuda_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of weights, GEMM inputs and the KV pool. */
typedef enum kvg_kt {
    KVG_KT_F32 = 0,
    KVG_KT_F16 = 1,
    KVG_KT_BF16 = 2
} kvg_kt;

/* The device KV pool: n_blocks blocks, no padding between them. A block holds all layers;
 * the first n_layers - n_i8 layers are BF16, the last n_i8 int8 (--kv-dtype int8; n_i8 = 0:
 * every layer BF16, the pool as it always was). Block b, BF16 layer l, kv head h (2-byte
 * elements):
 *     base = pool + b * block_elems + l * layer_elems + h * head_elems
 *     K of token t (0 <= t < block_tokens): base[t * head_dim + d]
 *     V of token t:                         base[(block_tokens + t) * head_dim + d]
 * Both token-major, so one warp reads one key's or value's head_dim in one coalesced run.
 * int8 layer l (l >= n_layers - n_i8, i = l - (n_layers - n_i8)), kv head h, in bytes:
 *     base = pool + 2 * b * block_elems + i8_off + (i * n_kv_heads + h) * head_bytes_i8
 *     K of token t: int8 base[t * head_dim + d]                        [block_tokens][head_dim]
 *     V of token t: int8 base[(block_tokens + t) * head_dim + d]       [block_tokens][head_dim]
 *     K scale of t: float at base + 2 * block_tokens * head_dim + 4 t  [block_tokens]
 *     V scale of t: float at base + 2 * block_tokens * head_dim + 4 (block_tokens + t)
 * head_bytes_i8 = 2 * block_tokens * head_dim + 8 * block_tokens, i8_off = the BF16 layers'
 * bytes (2 * (n_layers - n_i8) * layer_elems). int8 needs head_dim % 4 == 0 (a 32-bit word
 * is 4 elements of one row), which keeps every scale 4-byte aligned. One scale per (token,
 * kv head) for K and one for V: x ~ q * scale, scale = max|x| / 127 over head_dim, q =
 * x / scale rounded to nearest even (a zero vector: scale 0, q 0), the arithmetic of the
 * CPU's kvg_kv_quantize (engine/kv_cache.h), so both backends store the same bytes for
 * the same floats. F32 scales (not BF16): 4 bytes per 128-byte row are 3%, and a BF16
 * scale would add a second rounding the CPU does not have. K stays token-major here (the
 * CPU's is dimension-major): a lane computes one key's dot from shared memory, a warp
 * loads a key's row coalesced, as for BF16.
 * block_elems is the block's size in 2-byte units whatever its layers (what
 * kvg_k_copy_blocks copies). Block ids are the CPU pool's (engine/kv_cache.h): the prefix
 * cache never knows which backend holds the bytes. */
typedef struct kvg_k_kv_geom {
    int32_t n_layers, n_kv_heads, head_dim, block_tokens;
    int32_t n_blocks;
    int64_t head_elems;          /* 2 * block_tokens * head_dim */
    int64_t layer_elems;         /* n_kv_heads * head_elems (a BF16 layer) */
    int64_t block_elems;         /* the block in 2-byte units: n_layers * layer_elems
                                    when n_i8 = 0 */
    int32_t n_i8;                /* the last n_i8 layers are int8; 0: none */
    int64_t head_bytes_i8;       /* 2 * block_tokens * head_dim + 8 * block_tokens */
    int64_t i8_off;              /* bytes from a block's start to its first int8 layer */
} kvg_k_kv_geom;

/* Whether `layer` of the pool is stored as int8. */
static inline int kvg_k_layer_int8(const kvg_k_kv_geom *g, int layer)
{
    return layer >= g->n_layers - g->n_i8;
}

/* The block's bytes for this geometry (BF16 layers, then int8 ones): what the pool's
 * blocks are, in kvg_k_kv_geom's layout. 0 when the geometry is invalid (int8 layers with
 * head_dim % 4 != 0 included). */
static inline size_t kvg_k_kv_block_bytes(int n_layers, int n_i8, int n_kv_heads, int head_dim,
                                          int block_tokens)
{
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 || block_tokens <= 0 ||
        n_i8 < 0 || n_i8 > n_layers || (n_i8 > 0 && head_dim % 4))
        return 0;
    const size_t bt = (size_t)block_tokens, hd = (size_t)head_dim, nh = (size_t)n_kv_heads;
    return (size_t)(n_layers - n_i8) * nh * 4u * bt * hd +
           (size_t)n_i8 * nh * (2u * bt * hd + 8u * bt);
}

/* x[r][:] = row tokens[r] of the embedding table ([vocab][dim], of type dt) as F32. */
cudaError_t kvg_k_embed(cudaStream_t s, const void *table, kvg_kt dt, int dim,
                        const int32_t *tokens, int n_rows, float *x);

/* out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps): one thread block per row, the sum of
 * squares reduced in one fixed order for every row count. out may be x (in place). */
cudaError_t kvg_k_rmsnorm(cudaStream_t s, const float *x, const float *w, float eps,
                          int rows, int dim, float *out);
/* The same, and each output value rounded to nearest even to dt (BF16 or F16) at its index
 * in lowp ([rows][dim], 4-byte aligned), the bits kvg_k_to_lowp would give for out: the
 * next GEMM's input in the same pass. lowp NULL: kvg_k_rmsnorm. */
cudaError_t kvg_k_rmsnorm_lowp(cudaStream_t s, const float *x, const float *w, float eps,
                               int rows, int dim, float *out, kvg_kt dt, void *lowp);
/* The residual add and the next norm in one kernel: x[r] += y[r] (kvg_k_add's rounding),
 * then out[r] = rmsnorm(x[r]) as kvg_k_rmsnorm_lowp (the same variant and reduction tree;
 * lowp NULL: no copy): the bits of kvg_k_add followed by it. out may be x or y. (When the
 * float4 variant applies but y is not 16-byte aligned, the add is a launch of its own.) */
cudaError_t kvg_k_add_rmsnorm(cudaStream_t s, float *x, const float *y, const float *w, float eps,
                              int rows, int dim, float *out, kvg_kt dt, void *lowp);

/* x[i] += y[i] for i < n. */
cudaError_t kvg_k_add(cudaStream_t s, float *x, const float *y, size_t n);

/* gate[i] = silu(gate[i]) * up[i] for i < n. */
cudaError_t kvg_k_swiglu(cudaStream_t s, float *gate, const float *up, size_t n);

/* gpt-oss's clamped SwiGLU, for i < n: x = min(gate[i], 7), y = clamp(up[i], -7, 7),
 * gate[i] = x sigmoid(1.702 x) (y + 1), the CPU backend's kvg_swiglu_oai. */
cudaError_t kvg_k_swiglu_oai(cudaStream_t s, float *gate, const float *up, size_t n);

/* gate[i] = gelu_tanh(gate[i]) * up[i] for i < n (Gemma's GeGLU):
 * 0.5 g (1 + tanh(0.7978845608028654 (g + 0.044715 g^3))) * up, the CPU backend's expression. */
cudaError_t kvg_k_geglu(cudaStream_t s, float *gate, const float *up, size_t n);

/* kvg_k_swiglu and kvg_k_geglu, and each result rounded to nearest even to dt (BF16 or
 * F16) at lowp[i] (4-byte aligned), the bits kvg_k_to_lowp would give: w_down's input in
 * the same pass. lowp NULL: the plain kernels. */
cudaError_t kvg_k_swiglu_lowp(cudaStream_t s, float *gate, const float *up, size_t n, kvg_kt dt,
                              void *lowp);
cudaError_t kvg_k_geglu_lowp(cudaStream_t s, float *gate, const float *up, size_t n, kvg_kt dt,
                             void *lowp);

/* x[i] *= v for i < n (the embedding scale). */
cudaError_t kvg_k_scale(cudaStream_t s, float *x, float v, size_t n);

/* x[i] = cap * tanh(x[i] / cap) for i < n (final logit soft-capping); cap > 0. */
cudaError_t kvg_k_softcap(cudaStream_t s, float *x, float cap, size_t n);

/* out[i] = x[i] rounded to dt (F16 or BF16, round-to-nearest-even): a GEMM's input. */
cudaError_t kvg_k_to_lowp(cudaStream_t s, const float *x, size_t n, kvg_kt dt, void *out);


/* The n products of one fused GEMM (engine/cuda/cuda_gemm.c: q/k/v or gate/up, one
 * cuBLASLt call over weights concatenated at upload) back into their own buffers:
 *     out[i][r][:] = x[r][c_i .. c_i + cols[i])   for i < n, r < rows,
 * x [rows][width] with width = cols[0] + ... + cols[n - 1] and c_i the sum of the cols
 * before i; out[i] [rows][cols[i]]. n <= KVG_K_SPLIT_MAX. A copy. */
#define KVG_K_SPLIT_MAX 4
typedef struct kvg_k_split {
    float *out[KVG_K_SPLIT_MAX];
    int32_t cols[KVG_K_SPLIT_MAX];
    int32_t n;
} kvg_k_split;
cudaError_t kvg_k_split_cols(cudaStream_t s, const float *x, int rows, const kvg_k_split *o);

/* out[i] = x[i] (F16 or BF16, as dt says) as F32, exactly: cuDNN attention's output. */
cudaError_t kvg_k_from_lowp(cudaStream_t s, const void *x, size_t n, kvg_kt dt, float *out);

/* Rotates the leading `rot` dimensions of each head of q ([n_rows][n_heads*head_dim]) and
 * k ([n_rows][n_kv_heads*head_dim]) in place (rot = head_dim: all; Phi-4-mini: 3/4). cs
 * holds each row's cos and sin, [n_rows][head_dim/2][2], the first rot/2 pairs used (the
 * host computes them exactly as the CPU backend does). layout: 0 = adjacent pairs
 * (2i, 2i+1), 1 = halves (i, i + rot/2). q_scale ([n_rows], NULL: none): Llama 4's query
 * temperature, row r's whole q multiplied by q_scale[r] after its rotation (each rotated
 * value rounded, then multiplied, as the CPU backend does). */
cudaError_t kvg_k_rope(cudaStream_t s, float *q, float *k, const float *cs,
                       const float *q_scale, int n_rows, int n_heads, int n_kv_heads,
                       int head_dim, int rot, int layout);

/* kvg_k_rope (k's heads: g->n_kv_heads), then kvg_k_kv_write of the rotated k and v into
 * the pool's row slots, as one kernel: the same values as the two. */
cudaError_t kvg_k_rope_kv_write(cudaStream_t s, float *q, float *k, const float *cs, const float *q_scale,
                                int n_rows, int n_heads, int head_dim, int rot, int layout, void *pool,
                                const kvg_k_kv_geom *g, int layer, const float *v, const int32_t *row_slot);

/* Stores row r's k and v ([n_rows][n_kv_heads*head_dim], F32) at slot row_slot[r] (=
 * block id * block_tokens + position % block_tokens) of `layer`: as BF16 (nearest even),
 * or, on an int8 layer, each (row, kv head)'s head_dim values quantized as the layout
 * above says (the CPU's kvg_kv_quantize: the same int8 and scale bits). */
cudaError_t kvg_k_kv_write(cudaStream_t s, void *pool, const kvg_k_kv_geom *g, int layer,
                           const float *k, const float *v, const int32_t *row_slot, int n_rows);

/* Copy-on-write: block pairs[2i] = block pairs[2i+1], whole blocks, for i < n. */
cudaError_t kvg_k_copy_blocks(cudaStream_t s, void *pool, const kvg_k_kv_geom *g,
                              const int32_t *pairs, int n);

/* out[i][:] = x[rows[i]][:] (width floats) for i < n. */
cudaError_t kvg_k_gather_rows(cudaStream_t s, const float *x, int width, const int32_t *rows,
                              int n, float *out);

/* Paged attention for a step that mixes prefill chunks and decode rows.
 *
 * Row r (query q[r], position pos[r], sequence row_seq[r]) attends causally to positions
 * [0, pos[r]] of its sequence, or, with a sliding window W > 0, to [pos[r] - W + 1, pos[r]]
 * only (the positions before are skipped, as if masked to -inf). A score is q.k * scale,
 * then, with softcap > 0, softcap * tanh(score / softcap). The keys are cut into splits of split_tokens positions
 * (a multiple of block_tokens): split j covers [j*split_tokens, (j+1)*split_tokens), so row r
 * has pos[r] / split_tokens + 1 splits. Work is listed by the host as items: an item is
 * up to max_tile_rows consecutive rows of ONE sequence (consecutive positions) against ONE
 * split; the rows of an item share the split's K/V loads (a prefill chunk reads each block
 * once per tile, not once per row). A row for which the split lies past its position does
 * nothing in that item.
 *
 * Pass 1 writes, for each (row, split, head), the split's running max m, the sum of
 * exp(score - m) l and the unnormalized output acc[head_dim] at
 *     partials + ((row_part[r] - part0 + j) * n_heads + h) * (head_dim + 2)  {m, l, acc...}
 * Pass 2 combines row r's splits in split order into out[r][h*head_dim ...].
 * One call may do part of a step: items [item0, item0 + n_items) and rows [row0, row0 +
 * n_rows), the rows of exactly those items, whose partials start at part0 (the host cuts
 * a long step so, engine/cuda/step_plan.h kvg_step_plan_attn_groups, to bound the
 * partials' scratch; every row's values are the same as in one call for the step).
 *
 * Invariance: the partial of (row, split, head) is computed by the same arithmetic in
 * the same order whatever the item's other rows, its size or the launch's shape; splits
 * are fixed positions, not "enough splits to fill the GPU", and the combine always runs
 * (one split included). GQA: query head h reads kv head h / (n_heads / n_kv_heads).
 * A window changes which keys a row sees by its position alone: a split (or a chunk of
 * one) wholly before the window contributes nothing (m = -inf, l = 0), whatever the
 * batch. Sinks (gpt-oss) enter pass 2 only, once per (row, head): M = max(sink, m_j...),
 * L = sum_j exp(m_j - M) l_j + exp(sink - M); pass 1's partials are the keys' alone.
 * An int8 layer (kvg_k_layer_int8) is read as stored: a score is ((sum_d q[d] *
 * (float)k8[d]) * kscale) * scale, the sum in the BF16 path's order, and a key's weight in
 * the V accumulation is p * vscale (exact conversion, then the scales): the same
 * invariance, since every value still depends on the stored bytes and the row alone. */
typedef struct kvg_k_attn_item {
    int32_t seq;                 /* the sequence of the item's rows */
    int32_t row0;                /* first row of the step in the item */
    int32_t n_rows;              /* 1 .. max_tile_rows consecutive rows */
    int32_t split;               /* which split of the keys */
} kvg_k_attn_item;

typedef struct kvg_k_attn_args {
    const void *pool;            /* the KV pool (layer BF16 or int8, kvg_k_kv_geom) */
    kvg_k_kv_geom g;
    int layer;
    const float *q;              /* [n_rows][n_heads * head_dim], rotated */
    int n_heads;
    int n_rows;
    const int32_t *pos;          /* [n_rows] */
    const int32_t *row_seq;      /* [n_rows] */
    const int32_t *tables;       /* every sequence's block table, one after another */
    const int32_t *table_off;    /* [n_seqs] where sequence i's table starts in tables */
    const kvg_k_attn_item *items;
    int item0;                   /* this call's first item */
    int n_items;
    int max_tile_rows;           /* the most rows an item has (<= KVG_K_ATTN_MAX_TILE) */
    int split_tokens;
    const int32_t *row_part;     /* [step rows] the row's first entry in the step's partials */
    int row0;                    /* this call's first row (n_rows from it) */
    int32_t part0;               /* row_part of row0: partials holds this call's rows' only */
    float *partials;             /* [this call's rows' splits][n_heads][head_dim + 2] */
    float scale;                 /* 1 / sqrt(head_dim), or the model's divisor */
    int window;                  /* the layer's sliding window; 0: none */
    float softcap;               /* score soft-capping; 0: none */
    const float *sinks;          /* [n_heads] attention sinks (gpt-oss); NULL: none. Head h's
                                    softmax has one more logit, sinks[h] (on the scaled
                                    scores' scale), in its max and denominator, no value */
    float *out;                  /* [n_rows][n_heads * head_dim] */
    void *out_lowp;              /* NULL, or out's rows also rounded to out_lowp_dt (BF16 or
                                    F16, to nearest even) at the same indices: wo's input */
    kvg_kt out_lowp_dt;
} kvg_k_attn_args;

#define KVG_K_ATTN_MAX_TILE 16
#define KVG_K_ATTN_MAX_HEAD_DIM 256

cudaError_t kvg_k_attention(cudaStream_t s, const kvg_k_attn_args *a);

/* ---- the mixture-of-experts FFN (moe.cu); the experts' GEMMs are cuBLASLt's ---- */

#define KVG_K_MOE_MAX_EXPERTS 512

/* The gatings (engine/model.h kvg_moe_gating, same values). */
enum { KVG_K_MOE_SOFTMAX = 0, KVG_K_MOE_TOPK_SOFTMAX = 1 };

/* Each row's router logits ([rows][E], F32) into its K experts by rank, sel[rows][K], and
 * their weights wt[rows][K]: mode KVG_K_MOE_SOFTMAX, a softmax over all E (overwriting the
 * row's logits with the probabilities) then the K largest; KVG_K_MOE_TOPK_SOFTMAX, the K
 * largest logits then a softmax over those. Ties go to the lower expert. norm: the K
 * weights divided by their sum (floored at 2^-14). One thread per row, the CPU backend's
 * expressions (engine/cpu/moe_cpu.c); E <= KVG_K_MOE_MAX_EXPERTS. */
cudaError_t kvg_k_moe_gate(cudaStream_t s, float *logits, int rows, int E, int K, int mode,
                           int norm, int32_t *sel, float *wt);

/* Groups the n_pairs = rows * K (row, rank) pairs of sel by expert (a stable counting
 * sort; two launches). meta ([2E + 1] ints) gets meta[e] = expert e's count, meta[E + e]
 * = its first slot, meta[2E] = the slots used: each expert's slots start at a multiple of
 * `align` and are rounded up to one (the host picks align so that every expert's rows of
 * the GEMM buffers start 256-byte aligned). pos[i] = the slot of pair i (i = r * K + j),
 * slot_row[slot] = its row, ascending within an expert; padding slots name row 0.
 * slot_row holds n_pairs + E * (align - 1) entries. */
cudaError_t kvg_k_moe_group(cudaStream_t s, const int32_t *sel, int n_pairs, int K, int E,
                            int align, int32_t *meta, int32_t *slot_row, int32_t *pos);

/* out[i][:] = x[rows[i]][:] (width floats) rounded to dt (BF16 or F16, nearest even), for
 * i < n: the experts' GEMM input, gathered by slot. */
cudaError_t kvg_k_gather_lowp(cudaStream_t s, const float *x, int width, const int32_t *rows,
                              int n, kvg_kt dt, void *out);

/* out[r][:] = wt[r][0] y[pos[r][0]][:] + wt[r][1] y[pos[r][1]][:] + ... for r < rows: the
 * K expert outputs of the row in rank order, one fmaf chain per element. */
cudaError_t kvg_k_moe_combine(cudaStream_t s, const float *y, int width, const int32_t *pos,
                              const float *wt, int rows, int K, float *out);

#ifdef __cplusplus
}
#endif

#endif
