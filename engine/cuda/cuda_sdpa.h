/* Attention through cuDNN's scaled-dot-product-attention forward operation (the graph
 * API's CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, paged K/V and sequence lengths since
 * cuDNN 9.15), over the backend's KV pool, for `--batch-invariant off`. The own kernels
 * (kvg_k_attention) stay the invariant path, the fallback and the reference.
 *
 * How a step maps onto the operation. cuDNN 9.19's SDPA has no causal mask (a score
 * subgraph that could express one comes with 9.21); its only mask is the padding mask of
 * the sequence lengths. So every row of the step is a batch entry of its own with one
 * query: entry r has seq_len_q = 1 and seq_len_kv = pos[r] + 1, and its page table row is
 * its sequence's block table. Keys [0, pos[r]] are exactly what causal attention with the
 * query offset by the cached length lets row r see, for decode rows and prefill chunks
 * alike (a chunk's rows differ only in their lengths).
 *
 *     Q, O   [B, H_q, 1, D]  BF16, strides [H_q D, D, H_q D, 1]: the rows' q (rounded to
 *            BF16 from the F32 activations) and the output (back to F32 after)
 *     K, V   [N, H_kv, T, D] BF16, strides [block_elems, 2 T D, D, 1]: layer l's K (and V,
 *            T D elements further) in the pool itself, a strided view, no copy (the pool's
 *            block is [n_layers][n_kv_heads][K then V][T][D], kernels/kvg_kernels.h)
 *     PT     [B, 1, P, 1]    INT32: the page table, for K and V
 *     SEQ_Q, SEQ_KV [B, 1, 1, 1] INT32; SCALE: by value, 1 / sqrt(head_dim or the model's
 *            divisor)
 * B is the step's rows rounded up to a power of two and P its longest block table rounded
 * up the same way: the shape bucket an execution plan is built for (and cached); the
 * padding entries have lengths 0.
 *
 * What the operation cannot express falls back to the own kernels per layer: sliding
 * windows (Gemma 2/3, Mistral's SWA layers), soft-capped scores (Gemma 2), attention sinks
 * (gpt-oss), the int8 layers of --kv-dtype int8 (cuDNN reads the BF16 ones, whose K/V
 * block stride is then the whole block's, int8 layers included); a head_dim above 256 or
 * not a multiple of 8, all layers. The divisor variants
 * (Gemma 2 27B's attn_query_scalar) are a different SCALE. */
#ifndef KVG_CUDA_SDPA_H
#define KVG_CUDA_SDPA_H

#include "cuda_internal.h"

/* At backend creation: KVGATE_CUDA_ATTENTION (own | cudnn | auto, default auto) and what
 * the loaded cuDNN offers decide whether c->sdpa is made. auto falls back to the own
 * kernels with one log line naming why (cuDNN older than 9.15, no handle, a model it
 * cannot express); cudnn makes those a startup error instead. --batch-invariant on
 * keeps the own kernels either way. 0, or -1 with err. */
int kvg_cu_sdpa_init(kvg_cuda *c, char *err, size_t err_len);
void kvg_cu_sdpa_free(kvg_cuda *c);

/* begin_step, after the stream's last wait: the step's page table and sequence lengths
 * (one upload), the bucket's execution plan (built once per bucket; a build that fails,
 * e.g. no engine for the shape, turns cuDNN off for good with a log line) and the
 * scratch. -1 (recorded) on a CUDA failure. */
int kvg_cu_sdpa_begin_step(kvg_cuda *c, const kvg_step *s);

/* The step's cuDNN state that a CUDA graph's launches depend on (cuda_graph.c's
 * signature): the plan, its bucket, the buffers' addresses; all 0 without cuDNN. */
typedef struct kvg_cu_sdpa_signature {
    const void *plan;
    int64_t B, P, n_rows;
    const void *meta, *qo, *ws;
} kvg_cu_sdpa_signature;
void kvg_cu_sdpa_sig(const kvg_cuda *c, kvg_cu_sdpa_signature *out);

/* 1 when the layer's attention went to cuDNN (failures recorded as the step's), 0 when
 * the caller runs the own kernels (no cuDNN this step, or a layer it cannot express). */
int kvg_cu_sdpa_attention(kvg_cuda *c, const kvg_kv_pool *kv, int layer, const float *q, float *out);

#endif
