/* The backend interface: the forward pass as a sequence of operations on activation
 * buffers that live in the backend's memory (host memory for the CPU backend, device
 * memory for the CUDA one). forward.c drives every backend through this vtable and never
 * touches activations directly; it only reads results back with ->read.
 *
 * A step is described once (begin_step: tokens, positions, each row's sequence and
 * block table, the rows that need logits); the operations then refer to "the rows of
 * the step". Activations are row-major [n_rows][width] float arrays.
 *
 * Batch invariance is a contract of every implementation: the values computed for a
 * row depend only on that row's own inputs (its token, position and its sequence's KV
 * blocks) -- never on how many other rows there are, where the row sits, how a prompt
 * was chunked, or the thread count. Prefill and decode use the same operations.
 *
 * Weights are passed as the model's kvg_tensor / float pointers (host addresses); a
 * device backend uploads them at creation and looks them up by address. */
#ifndef KVG_BACKEND_H
#define KVG_BACKEND_H

/* end_step's answer: call the step's operations again (see end_step). */
#define KVG_STEP_AGAIN 1

#include <stddef.h>
#include <stdint.h>

#include "kv_cache.h"
#include "model.h"

typedef struct kvg_backend kvg_backend;

typedef struct kvg_step {
    int n_rows;
    const int32_t *tokens;               /* [n_rows] */
    const int32_t *pos;                  /* [n_rows] position of the row in its sequence */
    const int32_t *row_seq;              /* [n_rows] index of the row's sequence */
    int n_seqs;
    int block_tokens;                    /* the KV pool's tokens per block */
    const int32_t *const *block_tables;  /* [n_seqs] each sequence's block ids */
    const int32_t *n_blocks;             /* [n_seqs] */
    int n_out;
    const int32_t *out_rows;             /* [n_out] rows whose logits are wanted */
} kvg_step;

typedef struct kvg_backend_ops {
    const char *name;
    void (*destroy)(kvg_backend *be);

    /* Activation memory (n floats); NULL when out of memory. */
    float *(*alloc)(kvg_backend *be, size_t n);
    void (*free)(kvg_backend *be, float *p);
    /* Copies n floats of backend memory to the host. */
    void (*read)(kvg_backend *be, const float *src, float *host, size_t n);

    /* Takes (copies) the step description; -1 with err when it cannot. */
    int (*begin_step)(kvg_backend *be, const kvg_step *step, char *err, size_t err_len);

    /* x[r][:] = row tokens[r] of the embedding table, as F32 (dim wide). */
    void (*embed)(kvg_backend *be, const kvg_tensor *emb, float *x);
    /* out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps), rows of dim floats. */
    void (*rmsnorm)(kvg_backend *be, const float *x, const float *w, float eps,
                    int rows, int dim, float *out);
    /* y[M][N] = x[M][K] w^T (+ bias), N = w->rows, batch-invariant. */
    void (*matmul)(kvg_backend *be, const float *x, int M, int K, const kvg_tensor *w,
                   const float *bias, float *y);
    /* Rotates q ([n_rows][n_heads*head_dim]) and k ([n_rows][n_kv_heads*head_dim]) in
     * place for each row's position, as `layer` rotates (layout, theta, scaling and
     * factors from the model; rope.h: a layer's kind); then, when the model has a query
     * temperature (cfg.attn_temp_scale), multiplies each row's q by kvg_rope_q_scale of
     * its position. */
    void (*rope)(kvg_backend *be, int layer, float *q, float *k);
    /* Stores each row's k and v ([n_rows][n_kv_heads*head_dim]) at its position in its
     * sequence's blocks for `layer`. The blocks must be writable (refcount 1). */
    void (*kv_write)(kvg_backend *be, kvg_kv_pool *kv, int layer, const float *k, const float *v);
    /* out[r] = causal softmax attention of q[r] over positions [0, pos[r]] of the row's
     * sequence for `layer` (GQA: query head h uses kv head h / (n_heads/n_kv_heads)).
     * kv_write for the whole step comes first, so a prefill chunk sees its own tokens.
     * The model sets the rest: a sliding layer sees [pos[r] - swa_window + 1, pos[r]]
     * only, scores are divided by sqrt(attn_query_scalar or head_dim), and soft-capped
     * when attn_softcap > 0 (kvg_model_config); with cfg.attn_sinks, head h's softmax
     * has one more logit, the layer's attn_sinks[h], in its maximum and denominator,
     * with no value. */
    void (*attention)(kvg_backend *be, kvg_kv_pool *kv, int layer, const float *q, float *out);
    /* gate[i] = silu(gate[i]) * up[i] for i < n. */
    void (*swiglu)(kvg_backend *be, float *gate, const float *up, size_t n);
    /* x[i] += y[i] for i < n. */
    void (*add)(kvg_backend *be, float *x, const float *y, size_t n);

    /* The other families' operations; NULL in a backend that cannot run them yet
     * (kvg_forward_new then refuses a model that needs one, naming it). */
    /* gate[i] = gelu_tanh(gate[i]) * up[i] for i < n (Gemma's GeGLU). */
    void (*geglu)(kvg_backend *be, float *gate, const float *up, size_t n);
    /* x[i] *= s for i < n (Gemma's embedding scale). */
    void (*scale)(kvg_backend *be, float *x, float s, size_t n);
    /* x[i] = cap * tanh(x[i] / cap) for i < n (Gemma 2's final logits). */
    void (*softcap)(kvg_backend *be, float *x, float cap, size_t n);
    /* out[i][:] = x[out_rows[i]][:] (width floats) for the step's n_out rows. */
    void (*gather_out_rows)(kvg_backend *be, const float *x, int width, float *out);
    /* The mixture-of-experts FFN of `layer` (cfg.n_experts > 0) on `rows` rows of x
     * ([rows][dim], the normed FFN input; rows <= the step's rows): for each row, the
     * router's logits (moe_router x (+ moe_router_bias)), gated into n_experts_used
     * (expert, weight) pairs as cfg.moe_gating and moe_norm_topk say (ties toward the
     * lower expert index), and
     *   out[r] = sum over the pairs in rank order (the highest weight first) of
     *            weight * moe_down[e] (silu(moe_gate[e] x[r]) * moe_up[e] x[r]),
     * with gpt-oss's clamped SwiGLU for silu(g) * u when cfg.ffn_act says so and each
     * expert's biases after its three products when cfg.moe_biases,
     * out [rows][dim]. Batch-invariant like every operation: a row's result never depends
     * on which other rows chose the same experts. */
    void (*moe)(kvg_backend *be, int layer, const float *x, int rows, float *out);

    /* Optional ---- */

    /* y[i] = matmul(x, w[i], bias[i]) for i < n (n <= 4), exactly as n matmul calls;
     * a backend that can run them as one unit of work (the CPU backend: one
     * synchronisation point instead of n) sets it. NULL: forward.c calls matmul n
     * times. bias NULL or any entry NULL: no bias. */
    void (*matmul_n)(kvg_backend *be, const float *x, int M, int K, int n,
                     const kvg_tensor *const *w, const float *const *bias, float *const *y);

    /* x[i] += y[i] for i < rows * dim, then out = rmsnorm(x, w) as rmsnorm computes it:
     * the residual add and the next norm as one unit of work (the CUDA backend: one
     * kernel), the same values as add then rmsnorm. out may be y. NULL: forward.c calls
     * add and rmsnorm. */
    void (*add_rmsnorm)(kvg_backend *be, float *x, const float *y, const float *w, float eps,
                        int rows, int dim, float *out);
    /* rope(layer, q, k), then kv_write(kv, layer, k, v), as one unit of work (the CUDA
     * backend: one kernel), the same values. NULL: forward.c calls the two. */
    void (*rope_kv_write)(kvg_backend *be, kvg_kv_pool *kv, int layer, float *q, float *k, const float *v);

    /* Optional (NULL for the CPU backend, whose operations cannot fail) ---- */

    /* After the step's last operation and read: waits for the step and reports the
     * first failure of any of its operations (they are void: a device backend records
     * the failure, skips the step's later operations, and tells here). 0, or -1 with
     * err naming the call, the operation and the step; or KVG_STEP_AGAIN: nothing of
     * the step ran, the caller calls begin_step, the same operations and end_step once
     * more (the CUDA backend's graphs: a replay whose operations differ from the graph's,
     * a capture that failed; never more than twice in a row for one step). */
    int (*end_step)(kvg_backend *be, char *err, size_t err_len);
    /* The KV pool in the backend's memory: the bytes of one block of that geometry, and
     * a pool of n_blocks blocks (kv_cache.h kvg_kv_pool_new_device). NULL: host pool. */
    size_t (*kv_block_bytes)(kvg_backend *be, const kvg_kv_geom *g);
    kvg_kv_pool *(*kv_pool_new)(kvg_backend *be, const kvg_kv_geom *g, int32_t n_blocks,
                                char *err, size_t err_len);
    /* The backend's memory free for a KV pool now (weights and scratch allocated);
     * -1 when the backend has no memory of its own (the host's). */
    int (*mem_free)(kvg_backend *be, size_t *free_bytes, size_t *total_bytes);
    /* What the backend runs on, for a summary line ("NVIDIA H200, sm_90"); NULL: host. */
    const char *(*describe)(kvg_backend *be);
    /* Host memory its device copies can run asynchronously from (pinned): the KV host
     * tier's slots (kv_host.h). NULL on failure; host_free releases it. NULL ops: the
     * backend's pool is in host memory already (no host tier). */
    void *(*host_alloc)(kvg_backend *be, size_t bytes);
    void (*host_free)(kvg_backend *be, void *p);
} kvg_backend_ops;

struct kvg_backend {
    const kvg_backend_ops *ops;
    void *ctx;                   /* the implementation's state */
    const kvg_model *model;
    int n_threads;               /* host threads the backend uses */
};

/* What a backend is created with; a zeroed struct plus batch_invariant = 1 is the
 * default. */
typedef struct kvg_backend_opts {
    int n_threads;               /* host threads (cpu: <= 0 uses every online CPU) */
    int device;                  /* cuda: the device ordinal */
    int batch_invariant;         /* cuda: 1 = pinned GEMM algorithms and fixed attention
                                    splits (a row's values never depend on the batch);
                                    0 = whatever is fastest for each shape */
} kvg_backend_opts;

/* The CPU backend: n_threads <= 0 uses every online CPU. NULL with err. */
kvg_backend *kvg_backend_cpu_new(const kvg_model *m, int n_threads, char *err, size_t err_len);

/* The CUDA backend (engine/cuda/). In a build without nvcc it is a stub that fails with a
 * message saying so (engine/cuda/absent.c). NULL with err naming the CUDA error. */
kvg_backend *kvg_backend_cuda_new(const kvg_model *m, const kvg_backend_opts *o,
                                  char *err, size_t err_len);
/* Checks, before anything is loaded, that CUDA device `device` is there and usable (the
 * driver, the device count, cudaSetDevice): 0, or -1 with the same message
 * kvg_backend_cuda_new would give, so a command fails at once instead of after loading a
 * model of many gigabytes. */
int kvg_backend_cuda_probe(int device, char *err, size_t err_len);

/* "cpu" or "cuda". NULL with err for an unknown name. */
kvg_backend *kvg_backend_new_opts(const char *name, const kvg_model *m, const kvg_backend_opts *o,
                                  char *err, size_t err_len);

/* The KV pool for `be`: in the backend's memory when it has its own (kv_pool_new), a
 * host pool otherwise. */
kvg_kv_pool *kvg_backend_kv_pool_new(kvg_backend *be, const kvg_kv_geom *g, int32_t n_blocks,
                                     char *err, size_t err_len);
size_t kvg_backend_kv_block_bytes(kvg_backend *be, const kvg_kv_geom *g);
int32_t kvg_backend_kv_blocks_for_budget(kvg_backend *be, const kvg_kv_geom *g, size_t bytes);
/* The KV budget when --kv-memory is not given: `fraction` of the backend's free memory
 * when it has its own, else host_default. */
size_t kvg_backend_kv_default_budget(kvg_backend *be, double fraction, size_t host_default);
/* "cpu" or e.g. "cuda (NVIDIA H200, sm_90)" into buf. */
const char *kvg_backend_describe(kvg_backend *be, char *buf, size_t len);

/* ---- for the implementations (cpu/, cuda/) ---- */

/* The checks every backend makes of a model at creation: head_dim even and positive,
 * and at most max_head_dim when that is > 0 (a device kernel's limit); a consistent
 * RoPE scaling (rope.h). 0, or -1 with err starting "WHO: ". */
int kvg_backend_check_model(const kvg_model *m, const char *who, int max_head_dim,
                            char *err, size_t err_len);
/* A backend of `ops` for m whose ctx is ctx_size zeroed bytes (the implementation's
 * state, freed with the backend by its destroy). NULL with "WHO: out of memory". */
kvg_backend *kvg_backend_alloc(const kvg_backend_ops *ops, const kvg_model *m, size_t ctx_size,
                               const char *who, char *err, size_t err_len);

static inline void kvg_backend_free(kvg_backend *be)
{
    if (be)
        be->ops->destroy(be);
}

#endif
