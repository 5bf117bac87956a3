/* The CUDA backend's state, shared by its files (backend_cuda.c: the vtable and the step;
 * cuda_check.c: errors; cuda_weights.c: the weight arena; cuda_gemm.c: cuBLASLt;
 * cuda_kv.c: the device KV pool; cuda_moe.c: the mixture-of-experts FFN; cuda_sdpa.c:
 * attention through cuDNN; cuda_fuse.c: kernels that also write the next GEMM's input;
 * cuda_graph.c: decode steps as CUDA graphs).
 * Host C against kernels/kvg_cuda_api.h, the real CUDA runtime or its emulation. */
#ifndef KVG_CUDA_INTERNAL_H
#define KVG_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "kvg_kernels.h"
#include "step_plan.h"

/* One uploaded weight: host address -> device address (sorted by host address). */
typedef struct kvg_cu_weight {
    const void *host;
    void *dev;
    kvg_kt dt;                   /* device type: F16/BF16 matrices, F32 vectors */
    int layer;                   /* for messages: the layer (-1: none) and the name */
    const char *name;
} kvg_cu_weight;

/* Products of one input uploaded as one matrix (cuda_weights.c): a layer's wq, wk, wv
 * (kind 0) or w_gate, w_up (kind 1) back to back in the arena, [N = sum of the parts'
 * rows][K], so that cuda_gemm.c runs them as one GEMM; each part stays an entry of its
 * own (kvg_cu_weight_of) at its place inside. n = 0: not fused (the parts differ in K or
 * type, a part's bytes are not a multiple of 256, the biases are partial). */
#define KVG_CU_FUSE_MAX 4
typedef struct kvg_cu_fused {
    int n;                       /* parts */
    const void *host[KVG_CU_FUSE_MAX];         /* the parts' host addresses */
    const float *bias_host[KVG_CU_FUSE_MAX];   /* their biases (all NULL: none) */
    int rows[KVG_CU_FUSE_MAX];
    int N, K;
    kvg_kt dt;
    void *dev;                   /* part 0's copy: the [N][K] matrix */
    float *bias;                 /* [N]: the parts' biases back to back, or NULL */
    int layer;
    const char *name;            /* "wqkv", "w_gate_up" */
} kvg_cu_fused;

typedef struct kvg_cu_gemm_shape kvg_cu_gemm_shape;
typedef struct kvg_cu_moe kvg_cu_moe;
typedef struct kvg_cu_sdpa kvg_cu_sdpa;
typedef struct kvg_cu_graph kvg_cu_graph;

/* How the step's work goes to the device (cuda_graph.c): launched as the operations are
 * called, captured into a CUDA graph, or replayed from one (the operations only record). */
enum { KVG_CU_EAGER = 0, KVG_CU_CAPTURE = 1, KVG_CU_REPLAY = 2 };
/* What the step called again after KVG_STEP_AGAIN does: run eagerly, or capture. */
enum { KVG_CU_AGAIN_EAGER = 1, KVG_CU_AGAIN_CAPTURE = 2 };

typedef struct kvg_cu_graph_stats {
    int64_t captured;            /* graphs made */
    int64_t launched;            /* steps run as a graph (captured or replayed) */
    int64_t again;               /* replays refused: the operations differed */
    int64_t grown;               /* captures given up for a buffer that had to grow */
    int64_t failed;              /* captures that failed otherwise */
} kvg_cu_graph_stats;

typedef struct kvg_cuda {
    const kvg_model *m;
    int device;
    int batch_invariant;
    struct cudaDeviceProp prop;
    char describe[160];
    cudaStream_t stream;

    /* Errors: the first failure of a step (sticky until end_step reports it); `dead`
     * once the device or the KV pool cannot be trusted any more (every later step fails). */
    int failed, dead;
    char err[512];
    char dead_err[512];
    int64_t step;                /* steps begun */
    const char *op;              /* the current operation, for messages */
    int sync_each;               /* KVGATE_CUDA_SYNC=1: wait for each kernel and GEMM, so
                                    that an asynchronous failure names its own launch */
    int layer;                   /* ... and its layer (-1: none) */

    /* Weights: one device arena, the lookup table. */
    void *arena;
    size_t arena_bytes;
    kvg_cu_weight *weights;
    int n_weights;
    kvg_cu_fused *fused;         /* [n_layers][2]: q/k/v, gate/up */

    /* cuBLASLt. */
    void *lt;                    /* cublasLtHandle_t */
    kvg_cu_gemm_shape *shapes;
    int n_shapes, cap_shapes;
    int gemm_max_m;              /* the largest M a GEMM runs with (pinned algorithms are
                                    checked valid up to it) */
    void *lowp;                  /* scratch: a GEMM's input rounded to the weight type */
    size_t lowp_bytes;
    /* What lowp holds when a fused kernel wrote it (cuda_fuse.c): lowp_src[0 .. lowp_n)
     * rounded to lowp_dt, so the GEMMs that read lowp_src skip their rounding. lowp_src
     * NULL: nothing to reuse. Cleared by every backend operation but matmul and matmul_n,
     * and by those when they round into lowp or write over lowp_src. */
    const float *lowp_src;
    size_t lowp_n;
    kvg_kt lowp_dt;
    int fuse;                    /* KVGATE_CUDA_FUSE (default 1): rmsnorm and SwiGLU/GeGLU
                                    write that copy in their own kernel; 0: the GEMMs round
                                    their input themselves (the same bits, more launches) */
    kvg_kt glu_dt;               /* w_down's device type when every layer's is the same
                                    BF16/F16 (the GLU's copy); F32: no copy */
    float *fused_out;            /* scratch: a fused GEMM's [M][sum N] before the split */
    size_t fused_out_bytes;

    /* The step: the packed plan on the host (pinned) and the device. Two host buffers,
     * used in turn: step n+1's is written while step n's upload may still be queued, and
     * plan_sent[i], recorded after the upload out of h_plan[i], says when it may be
     * rewritten, so begin_step never waits for the whole stream. */
    kvg_step_plan plan;
    void *h_plan[2], *d_plan;
    cudaEvent_t plan_sent[2];
    int plan_half;               /* the buffer of the last step */
    size_t plan_cap;
    float *d_partials;
    size_t partials_cap;         /* floats */
    /* The attention's launches for this step (step_plan.h kvg_step_plan_attn_groups): its
     * partials' scratch holds one group's, at most attn_scratch bytes (but one tile). */
    kvg_attn_group *groups;
    int n_groups, groups_cap;
    size_t attn_scratch;         /* KVGATE_CUDA_ATTN_SCRATCH_MB, default 256 MiB */
    int n_rope_kinds;            /* 1, or 2 when the window layers have their own (rope.h) */
    float *inv_freq;             /* [n_rope_kinds][head_dim/2] */
    int32_t kv_pool_blocks;      /* the pool's size: block ids are checked against it */
    size_t kv_block_bytes;       /* its block (cuDNN's K/V block stride: the int8 layers
                                    make it more than the BF16 layers') */

    int64_t kv_pools;            /* device pools alive (their bytes are theirs) */

    kvg_cu_moe *moe;             /* the MoE FFN's scratch (cuda_moe.c); NULL: a dense model */

    kvg_cu_sdpa *sdpa;           /* attention through cuDNN (cuda_sdpa.h); NULL: the own
                                    kernels (kvg_k_attention) for every layer */

    /* CUDA graphs (cuda_graph.c). */
    int graphs;                  /* KVGATE_CUDA_GRAPHS (default 1; off with SYNC, MoE) */
    int step_mode;               /* KVG_CU_EAGER / CAPTURE / REPLAY */
    int step_again;              /* 0, or what the step's second call does */
    int recording;               /* the operations append to rec */
    int graph_grow;              /* the capture was given up for a growing buffer */
    int graph_failures, graph_mismatches;
    int64_t alloc_gen;           /* device allocations made (addresses a graph may hold) */
    unsigned char *rec;          /* the step's signature, then its operations' record */
    size_t rec_len, rec_cap, sig_len;
    int rec_oom;
    kvg_cu_graph *graph;         /* the graph replayed */
    kvg_cu_graph *graph_cache;   /* [KVG_CU_GRAPHS_KEPT] */
    int n_graphs;
    kvg_cu_graph_stats gstats;
    /* read in a captured or replayed step: done after the graph's launch */
    const float *read_src;
    float *read_host;
    size_t read_n;
} kvg_cuda;

/* ---- errors (cuda_check.c) ---- */
/* Makes *p (cap bytes of device memory) hold at least `need` bytes: freed and allocated
 * again, with room to grow (half as much again, 4 KiB at least). -1 (kvg_cu_fail, naming
 * `what`) when cudaMalloc fails. Only between steps' work: the old buffer is freed at
 * once. */
int kvg_cu_grow_dev(kvg_cuda *c, void **p, size_t *cap, size_t need, const char *what);

/* Records the first failure of the step: "cuda: CALL (op, layer L, detail) failed:
 * NAME (meaning) in step S". Returns -1 so callers can `return kvg_cu_fail(...)`. */
int kvg_cu_fail(kvg_cuda *c, const char *call, cudaError_t e, const char *detail_fmt, ...)
    __attribute__((format(printf, 4, 5)));
int kvg_cu_fail_blas(kvg_cuda *c, const char *call, int status, const char *detail_fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same for a cuDNN call's cudnnStatus_t. */
int kvg_cu_fail_dnn(kvg_cuda *c, const char *call, int status, const char *detail_fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The device is lost (a sticky CUDA error, a failed copy-on-write): every later step
 * fails with this message. */
void kvg_cu_mark_dead(kvg_cuda *c, const char *why);
/* 1 for the errors that leave the context unusable (kvg_cu_fail marks the device dead). */
int kvg_cu_sticky(cudaError_t e);
/* "cudaErrorNoDevice (no CUDA-capable device is detected)". */
void kvg_cu_err_text(cudaError_t e, char *buf, size_t len);
/* Checked launch/call in an operation: skips when the step has failed already. */
#define KVG_CU_CHECK(c, call_name, expr, ...)                            \
    do {                                                                 \
        cudaError_t kvg_e_ = (expr);                                     \
        if (kvg_e_ == cudaSuccess && (c)->sync_each)                     \
            kvg_e_ = cudaStreamSynchronize((c)->stream);                 \
        if (kvg_e_ != cudaSuccess)                                       \
            kvg_cu_fail((c), (call_name), kvg_e_, __VA_ARGS__);          \
    } while (0)

/* ---- weights (cuda_weights.c) ---- */
int kvg_cu_weights_upload(kvg_cuda *c, char *err, size_t err_len);
void kvg_cu_weights_free(kvg_cuda *c);
/* The device copy of a model weight; NULL (and a recorded failure) when unknown. */
const kvg_cu_weight *kvg_cu_weight_of(kvg_cuda *c, const void *host);
/* The fused matrix of these n products with these biases (bias NULL: none), or NULL
 * (nothing recorded) when they were not uploaded as one. */
const kvg_cu_fused *kvg_cu_fused_of(kvg_cuda *c, int n, const kvg_tensor *const *w, const float *const *bias);

/* ---- GEMM (cuda_gemm.c) ---- */
int kvg_cu_gemm_init(kvg_cuda *c, char *err, size_t err_len);
/* Every GEMM shape of the model, made before the engine serves (after the weights and the
 * MoE scratch); with --batch-invariant on each shape's algorithm pinned and self-tested
 * (a row's bits at M = 1 and M = k). 0, or -1 with err naming the shape. */
int kvg_cu_gemm_startup(kvg_cuda *c, char *err, size_t err_len);
/* How many shapes are made, and pinned (for the tests). */
int kvg_cu_gemm_pinned(const kvg_cuda *c);
void kvg_cu_gemm_free(kvg_cuda *c);
/* y[M][N] = x[M][K] w^T (+ bias) on the device. Records a failure on error. */
void kvg_cu_matmul(kvg_cuda *c, const float *x, int M, int K, const kvg_tensor *w,
                   const float *bias, float *y);
/* backend.h's matmul_n: y[i] = x w[i]^T (+ bias[i]) for i < n, as one GEMM over the fused
 * matrix when the products were uploaded as one (kvg_cu_fused_of), else n kvg_cu_matmul;
 * the same bits either way. */
void kvg_cu_matmul_n(kvg_cuda *c, const float *x, int M, int K, int n, const kvg_tensor *const *w,
                     const float *const *bias, float *const *y);
/* The same with x already in dw's type (BF16/F16; F32 for an F32 weight) and the weight
 * (N rows) and bias (NULL: none) already looked up: what the MoE's expert GEMMs call on
 * their rows of a shared, once-rounded input. */
void kvg_cu_gemm(kvg_cuda *c, const void *x, int M, int K, const kvg_cu_weight *dw, int N,
                 const kvg_cu_weight *db, float *y);

/* The lowp scratch holding at least n 2-byte elements (grown as needed; NULL recorded on
 * failure). Its content is about to be replaced: the record of what it holds is cleared. */
void *kvg_cu_lowp_scratch(kvg_cuda *c, size_t n);
/* The record of what lowp holds (see kvg_cuda.lowp_src): set by a fused kernel, cleared. */
void kvg_cu_lowp_clear(kvg_cuda *c);

/* ---- fused producers of a GEMM's input (cuda_fuse.c) ---- */
/* KVGATE_CUDA_FUSE and the GLU's output type, at creation (after the upload). 0, or -1
 * with err. */
int kvg_cu_fuse_init(kvg_cuda *c, char *err, size_t err_len);
/* The scratch the attention's own kernels round their output into for layer's wo (n
 * floats), its type in *dt; NULL when fusing is off or wo is F32 (nothing to round). The
 * caller records it (kvg_cu_lowp_set) once the launches are made. */
void *kvg_cu_attn_lowp(kvg_cuda *c, int layer, size_t n, kvg_kt *dt);
void kvg_cu_lowp_set(kvg_cuda *c, const float *src, size_t n, kvg_kt dt);
/* backend.h's rmsnorm with the norm weight dw (of host address w): when its output is
 * the input of a GEMM (an attention or FFN norm, the final norm) and fusing is on, the same
 * kernel also rounds it into lowp for that GEMM's type. Records a failure on error. */
void kvg_cu_rmsnorm(kvg_cuda *c, const float *x, const float *w, const kvg_cu_weight *dw, float eps,
                    int rows, int dim, float *out);
/* backend.h's add_rmsnorm: x += y, then kvg_cu_rmsnorm of x; one kernel with fusing on,
 * kvg_k_add and kvg_k_rmsnorm with KVGATE_CUDA_FUSE=0 (the same bits). */
void kvg_cu_add_rmsnorm(kvg_cuda *c, float *x, const float *y, const float *w, const kvg_cu_weight *dw,
                        float eps, int rows, int dim, float *out);
/* backend.h's swiglu (gelu 0) or geglu (gelu 1); with fusing on, also the rounded copy
 * for w_down. Records a failure on error. */
void kvg_cu_glu(kvg_cuda *c, int gelu, float *gate, const float *up, size_t n);

/* ---- mixture of experts (cuda_moe.c) ---- */
/* The scratch of a MoE model (nothing for a dense one). 0, or -1 with err. */
int kvg_cu_moe_init(kvg_cuda *c, char *err, size_t err_len);
void kvg_cu_moe_free(kvg_cuda *c);
/* backend.h's moe: out[rows][dim] = the MoE FFN of `layer` on x. Records a failure on
 * error. Waits once for the device (the experts' row counts). */
void kvg_cu_moe_ffn(kvg_cuda *c, int layer, const float *x, int rows, float *out);

/* ---- CUDA graphs (cuda_graph.c) ---- */
/* KVGATE_CUDA_GRAPHS, at creation (after sync_each is known). 0, or -1 with err. */
int kvg_cu_graph_init(kvg_cuda *c, char *err, size_t err_len);
void kvg_cu_graph_free(kvg_cuda *c);
/* 1 when the step may be captured: its plan is then laid out padded. */
int kvg_cu_graph_padded(const kvg_cuda *c, const kvg_step *s);
/* begin_step's last act, after the uploads: the step's mode (c->step_mode) and, for a
 * graph, its signature. 0. */
int kvg_cu_graph_begin(kvg_cuda *c, const kvg_step *s);
/* Appends n bytes to the step's record (nothing when the step is eager): every operation
 * its name and arguments, before it enqueues anything. */
void kvg_cu_note(kvg_cuda *c, const void *p, size_t n);
/* Every device allocation of the backend asks first: 1 (and counted, alloc_gen), or 0
 * during a capture, which is then given up (recorded as the step's failure; end_step
 * calls the step again eagerly). */
int kvg_cu_alloc_ok(kvg_cuda *c, const char *what);
/* end_step, for a captured or replayed step: the graph made or checked, and launched.
 * 0; KVG_STEP_AGAIN when the step's operations must be called again (nothing of it ran);
 * -1 with the failure recorded. */
int kvg_cu_graph_end(kvg_cuda *c);

/* ---- KV pool (cuda_kv.c) ---- */
size_t kvg_cu_kv_block_bytes(const kvg_kv_geom *g);
kvg_kv_pool *kvg_cu_kv_pool_new(kvg_cuda *c, const kvg_kv_geom *g, int32_t n_blocks,
                                char *err, size_t err_len);
/* The kernels' view of a pool; -1 (recorded) when the pool is not this backend's. */
int kvg_cu_kv_geom(kvg_cuda *c, const kvg_kv_pool *p, kvg_k_kv_geom *g);

#endif
