/* The CUDA backend: the vtable of engine/backend.h on one device and one stream.
 *
 * Every operation is enqueued on the stream; a failing CUDA or cuBLAS call is recorded
 * (cuda_check.c) and the step's later operations are skipped; end_step synchronises and
 * reports. begin_step validates the step and sends its whole description (step_plan.h)
 * in one copy. Weights live in one arena (cuda_weights.c), the KV pool in device memory
 * (cuda_kv.c), GEMMs go through cuBLASLt (cuda_gemm.c). */
#include "cuda_internal.h"
#include "cuda_sdpa.h"
#include "backend_testing.h"
#include "errmsg.h"
#include "rope.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(kvg_plan_item) == sizeof(kvg_k_attn_item), "plan item = kernel item");
_Static_assert(offsetof(kvg_plan_item, split) == offsetof(kvg_k_attn_item, split), "plan item layout");
_Static_assert(offsetof(kvg_plan_item, n_rows) == offsetof(kvg_k_attn_item, n_rows), "plan item layout");
_Static_assert(offsetof(kvg_plan_item, row0) == offsetof(kvg_k_attn_item, row0), "plan item layout");
_Static_assert((int)KVG_KT_F16 == (int)KVG_DT_F16 && (int)KVG_KT_BF16 == (int)KVG_DT_BF16, "types");

int kvg_backend_cuda_built(void)
{
    return 1;
}

static kvg_cuda *cu(kvg_backend *be)
{
    return be->ctx;
}

/* An operation's argument, into the step's record (cuda_graph.c): a captured or replayed
 * step is known by its operations and every argument they were called with. */
#define NOTE(c, x)                                   \
    do {                                             \
        if ((c)->recording)   /* eager: nothing */   \
            kvg_cu_note((c), &(x), sizeof(x));       \
    } while (0)

/* A GEMM begins (matmul, matmul_n): skipped (0) when the step has failed already, or is a
 * graph's replay (the operations only record). The record of what the lowp scratch holds
 * stays (cuda_fuse.c): a GEMM may reuse it. */
static int op_begin_gemm(kvg_cuda *c, const char *op)
{
    NOTE(c, op);
    if (c->failed || c->step_mode == KVG_CU_REPLAY)
        return 0;
    c->op = op;
    return 1;
}

/* Any other operation begins: it may write what the lowp scratch was rounded from, or the
 * scratch, so the record is cleared (a fused kernel sets it again after its launch). */
static int op_begin(kvg_cuda *c, const char *op)
{
    kvg_cu_lowp_clear(c);
    return op_begin_gemm(c, op);
}

#define DEV(c, T, field) ((T *)(void *)((unsigned char *)(c)->d_plan + (c)->plan.field))

/* ---- memory ---- */

static float *cu_alloc(kvg_backend *be, size_t n)
{
    void *p = NULL;
    /* a new buffer may reuse a freed one's address: nothing rounded from the old one stays */
    kvg_cu_lowp_clear(cu(be));
    if (n > SIZE_MAX / sizeof(float) || !kvg_cu_alloc_ok(cu(be), "an activation"))
        return NULL;
    if (cudaMalloc(&p, (n ? n : 1) * sizeof(float)) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_free(kvg_backend *be, float *p)
{
    kvg_cu_lowp_clear(cu(be));
    if (p)
        cudaFree(p);
}

static void cu_read(kvg_backend *be, const float *src, float *host, size_t n)
{
    kvg_cuda *c = cu(be);
    cudaError_t e;
    NOTE(c, src);
    NOTE(c, host);
    NOTE(c, n);
    if (c->step_mode != KVG_CU_EAGER) {
        /* A graph's step: the copy follows the graph's launch (end_step); the host
         * buffer may be pageable, which a capture refuses. */
        kvg_cu_lowp_clear(c);
        c->read_src = src;
        c->read_host = host;
        c->read_n = n;
        return;
    }
    if (!n || !op_begin(c, "read"))
        return;
    c->layer = -1;
    e = cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost, c->stream);
    if (e != cudaSuccess)
        kvg_cu_fail(c, "cudaMemcpyAsync", e, "%zu floats to the host", n);
}

/* ---- the step ---- */

/* KVGATE_CUDA_ATTN_SCRATCH: bytes, with K, M or G (powers of 1024); unset: 256M. */
static int attn_scratch_of(const char *v, size_t *bytes, char *err, size_t err_len)
{
    char *end;
    unsigned long long n;
    int shift = 0;
    if (!v || !*v) {
        *bytes = (size_t)256 << 20;
        return 0;
    }
    errno = 0;
    n = strtoull(v, &end, 10);
    if (*end == 'K' || *end == 'k')
        shift = 10, end++;
    else if (*end == 'M' || *end == 'm')
        shift = 20, end++;
    else if (*end == 'G' || *end == 'g')
        shift = 30, end++;
    if (errno || end == v || *end || n == 0 || n > (1ULL << 40) >> shift) {
        kvg_set_err(err, err_len, "cuda: KVGATE_CUDA_ATTN_SCRATCH=%s: need a size in bytes, e.g. 64K, 256M or 1G",
                    v);
        return -1;
    }
    *bytes = (size_t)(n << shift);
    return 0;
}

static int cu_begin_step(kvg_backend *be, const kvg_step *s, char *err, size_t err_len)
{
    kvg_cuda *c = cu(be);
    const kvg_model_config *cfg = &c->m->cfg;
    int split, half = cfg->head_dim / 2;
    size_t partials;
    cudaError_t e;
    int buf;                     /* which host buffer this step's description goes in */
    void *hp;

    c->step++;
    c->op = "begin_step";
    kvg_cu_lowp_clear(c);
    c->layer = -1;
    if (c->dead) {
        kvg_set_err(err, err_len, "cuda: the device is unusable after an earlier failure: %s", c->dead_err);
        return -1;
    }
    if (c->failed)
        goto failed;
    if (c->kv_pools == 0) {
        kvg_set_err(err, err_len, "cuda: no KV pool in device memory (kvg_backend_kv_pool_new makes it)");
        return -1;
    }
    split = kvg_step_plan_split_tokens(s, c->batch_invariant, 2 * c->prop.multiProcessorCount);
    c->read_n = 0;
    if (kvg_step_plan_layout_padded(s, c->kv_pool_blocks, split, KVG_K_ATTN_MAX_TILE, cfg->head_dim,
                                    c->n_rope_kinds, kvg_cu_graph_padded(c, s), &c->plan, err, err_len) != 0) {
        /* Nothing was enqueued: the step is refused, the backend is fine. */
        char msg[400];
        snprintf(msg, sizeof msg, "cuda: %s", err);
        kvg_set_err(err, err_len, "%s", msg);
        return -1;
    }
    buf = c->plan_half ^ 1;
    if (c->plan.bytes > c->plan_cap) {
        size_t cap = c->plan.bytes + c->plan.bytes / 2;
        kvg_cu_alloc_ok(c, "the step buffer");          /* between steps: counted */
        /* The previous steps' uploads may still be reading the old pinned buffers. */
        e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess) {
            kvg_cu_fail(c, "cudaStreamSynchronize", e, "before growing the step buffer");
            goto failed;
        }
        for (int i = 0; i < 2; i++) {
            if (c->h_plan[i])
                cudaFreeHost(c->h_plan[i]);
            c->h_plan[i] = NULL;
        }
        if (c->d_plan)
            cudaFree(c->d_plan);
        c->d_plan = NULL;
        c->plan_cap = 0;
        for (int i = 0; i < 2; i++) {
            e = cudaMallocHost(&c->h_plan[i], cap);
            if (e != cudaSuccess) {
                c->h_plan[i] = NULL;
                kvg_cu_fail(c, "cudaMallocHost", e, "step buffer of %zu bytes", cap);
                goto failed;
            }
        }
        e = cudaMalloc(&c->d_plan, cap);
        if (e != cudaSuccess) {
            c->d_plan = NULL;
            kvg_cu_fail(c, "cudaMalloc", e, "step buffer of %zu bytes", cap);
            goto failed;
        }
        c->plan_cap = cap;
    } else {
        /* This buffer is rewritten: the upload out of it, two steps ago, must have left
         * (its event); the last step's work may go on meanwhile. */
        e = cudaEventSynchronize(c->plan_sent[buf]);
        if (e != cudaSuccess) {
            kvg_cu_fail(c, "cudaEventSynchronize", e, "before the step's upload");
            goto failed;
        }
    }
    hp = c->h_plan[buf];
    kvg_step_plan_fill(s, &c->plan, hp);
    /* cos/sin of each kind of rotation, once per step, shared by every layer. */
    for (int k = 0; k < c->n_rope_kinds; k++) {
        float *cs = (float *)(void *)((unsigned char *)hp + kvg_step_plan_cs_off(&c->plan, k));
        for (int r = 0; r < s->n_rows; r++)
            kvg_rope_cos_sin(c->inv_freq + (size_t)k * half, kvg_rope_dims(cfg) / 2, s->pos[r], kvg_rope_mscale(cfg),
                             cs + (size_t)r * c->plan.cs_floats);
    }
    /* Llama 4's query temperature of each row, by its position (rope.h), as the CPU's. */
    if (cfg->attn_temp_scale != 0.0f) {
        float *qs = (float *)(void *)((unsigned char *)hp + c->plan.off_q_scale);
        for (int r = 0; r < s->n_rows; r++)
            qs[r] = kvg_rope_q_scale(cfg, s->pos[r]);
    }
    {
        /* The attention in groups of whole tiles whose partials fit the scratch: the
         * scratch is the largest group's, not the step's total (rows x context). */
        int64_t per = (int64_t)cfg->n_heads * (cfg->head_dim + 2), biggest = 0;
        int64_t max_parts = (int64_t)(c->attn_scratch / sizeof(float)) / per;
        /* a group holds at least one tile, and a tile at least one row */
        if (s->n_rows > c->groups_cap) {
            kvg_attn_group *g = realloc(c->groups, (size_t)s->n_rows * sizeof *g);
            if (!g) {
                kvg_cu_fail(c, "realloc", cudaErrorMemoryAllocation, "%d attention groups", s->n_rows);
                goto failed;
            }
            c->groups = g;
            c->groups_cap = s->n_rows;
        }
        c->n_groups = kvg_step_plan_attn_groups(s, &c->plan, max_parts > 0 ? max_parts : 1, c->groups,
                                                c->groups_cap, &biggest);
        partials = (size_t)biggest * (size_t)per;
    }
    if (kvg_cu_grow_dev(c, (void **)&c->d_partials, &c->partials_cap, partials * sizeof(float),
                 "attention partials") != 0)
        goto failed;
    e = cudaMemcpyAsync(c->d_plan, hp, c->plan.bytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess)
        e = cudaEventRecord(c->plan_sent[buf], c->stream);
    if (e != cudaSuccess) {
        kvg_cu_fail(c, "cudaMemcpyAsync", e, "the step's description, %zu bytes", c->plan.bytes);
        goto failed;
    }
    /* cuDNN's page table and lengths (the stream was waited for above); the own kernels'
     * description stays complete: a layer cuDNN cannot express runs them */
    if (kvg_cu_sdpa_begin_step(c, s) != 0)
        goto failed;
    /* eager, captured into a CUDA graph or replayed from one (cuda_graph.c) */
    kvg_cu_graph_begin(c, s);
    return 0;
failed:
    /* Reported by end_step (forward.c calls it only after a successful begin_step). */
    kvg_set_err(err, err_len, "%s", c->err);
    c->failed = 0;
    c->err[0] = 0;
    return -1;
}

static int cu_end_step(kvg_backend *be, char *err, size_t err_len)
{
    kvg_cuda *c = cu(be);
    cudaError_t e;
    c->op = "end_step";
    kvg_cu_lowp_clear(c);
    c->layer = -1;
    if (c->step_mode != KVG_CU_EAGER) {
        int rc = kvg_cu_graph_end(c);
        if (rc == KVG_STEP_AGAIN) {
            c->op = NULL;
            return rc;
        }
        if (rc == 0 && c->read_n) {
            e = cudaMemcpyAsync(c->read_host, c->read_src, c->read_n * sizeof(float), cudaMemcpyDeviceToHost,
                                c->stream);
            if (e != cudaSuccess)
                kvg_cu_fail(c, "cudaMemcpyAsync", e, "%zu floats to the host", c->read_n);
        }
        c->read_n = 0;
    }
    e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess)
        kvg_cu_fail(c, "cudaStreamSynchronize", e, "the step's work");
    c->op = NULL;
    if (!c->failed)
        return 0;
    kvg_set_err(err, err_len, "%s", c->err);
    c->failed = 0;
    c->err[0] = 0;
    return -1;
}

/* ---- operations ---- */

static void cu_embed(kvg_backend *be, const kvg_tensor *emb, float *x)
{
    kvg_cuda *c = cu(be);
    const kvg_cu_weight *w;
    NOTE(c, emb);
    NOTE(c, x);
    if (!op_begin(c, "embed"))
        return;
    c->layer = -1;
    w = kvg_cu_weight_of(c, emb->data);
    if (w)
        KVG_CU_CHECK(c, "launch kvg_k_embed", kvg_k_embed(c->stream, w->dev, w->dt, (int)emb->cols,
                                                          DEV(c, int32_t, off_tokens), c->plan.n_rows, x),
                     "rows=%d dim=%d", c->plan.n_rows, (int)emb->cols);
}

/* rmsnorm, after x += y when y is not NULL (add_rmsnorm): cuda_fuse.c. */
static void cu_norm(kvg_backend *be, const char *op, float *x, const float *y, const float *w, float eps, int rows,
                    int dim, float *out)
{
    kvg_cuda *c = cu(be);
    const kvg_cu_weight *dw;
    NOTE(c, x);
    NOTE(c, y);
    NOTE(c, w);
    NOTE(c, eps);
    NOTE(c, rows);
    NOTE(c, dim);
    NOTE(c, out);
    if (!op_begin(c, op))
        return;
    dw = kvg_cu_weight_of(c, w);
    if (!dw)
        return;
    c->layer = dw->layer;
    c->op = dw->name;
    if (y)
        kvg_cu_add_rmsnorm(c, x, y, w, dw, eps, rows, dim, out);
    else
        kvg_cu_rmsnorm(c, x, w, dw, eps, rows, dim, out);
}

static void cu_rmsnorm(kvg_backend *be, const float *x, const float *w, float eps, int rows, int dim,
                       float *out)
{
    /* x is written only with a residual */
    cu_norm(be, "rmsnorm", (float *)(uintptr_t)x, NULL, w, eps, rows, dim, out);
}

static void cu_add_rmsnorm(kvg_backend *be, float *x, const float *y, const float *w, float eps, int rows, int dim,
                           float *out)
{
    cu_norm(be, "add_rmsnorm", x, y, w, eps, rows, dim, out);
}

/* One product, the operation begun. */
static void matmul_one(kvg_cuda *c, const float *x, int M, int K, const kvg_tensor *w, const float *bias,
                       float *y)
{
    const kvg_cu_weight *dw = kvg_cu_weight_of(c, w->data);
    if (!dw)
        return;
    c->layer = dw->layer;
    c->op = dw->name;
    kvg_cu_matmul(c, x, M, K, w, bias, y);
}

static void cu_matmul(kvg_backend *be, const float *x, int M, int K, const kvg_tensor *w,
                      const float *bias, float *y)
{
    kvg_cuda *c = cu(be);
    NOTE(c, x);
    NOTE(c, M);
    NOTE(c, K);
    NOTE(c, w);
    NOTE(c, bias);
    NOTE(c, y);
    if (op_begin_gemm(c, "matmul"))
        matmul_one(c, x, M, K, w, bias, y);
}

/* q/k/v, gate/up: one GEMM over the matrix they were uploaded as (cuda_gemm.c). */
static void cu_matmul_n(kvg_backend *be, const float *x, int M, int K, int n, const kvg_tensor *const *w,
                        const float *const *bias, float *const *y)
{
    kvg_cuda *c = cu(be);
    const kvg_cu_fused *f;
    NOTE(c, x);
    NOTE(c, M);
    NOTE(c, K);
    NOTE(c, n);
    for (int i = 0; i < n; i++) {
        const float *b = bias ? bias[i] : NULL;
        NOTE(c, w[i]);
        NOTE(c, b);
        NOTE(c, y[i]);
    }
    if (!op_begin_gemm(c, "matmul_n"))
        return;
    f = kvg_cu_fused_of(c, n, w, bias);
    if (f) {
        c->layer = f->layer;
        c->op = f->name;
        kvg_cu_matmul_n(c, x, M, K, n, w, bias, y);
        return;
    }
    for (int i = 0; i < n && !c->failed; i++)
        matmul_one(c, x, M, K, w[i], bias ? bias[i] : NULL, y[i]);
}

/* The step's cos/sin table for `layer`'s kind of rotation (rope.h: the sliding-window
 * layers may have their own), in the step's device buffer. */
static const float *rope_table(kvg_cuda *c, int layer)
{
    return (const float *)(const void *)((const unsigned char *)c->d_plan +
                                         kvg_step_plan_cs_off(&c->plan, kvg_rope_kind(c->m, layer)));
}

static void cu_rope(kvg_backend *be, int layer, float *q, float *k)
{
    kvg_cuda *c = cu(be);
    const kvg_model_config *cfg = &c->m->cfg;
    const float *cs;
    NOTE(c, layer);
    NOTE(c, q);
    NOTE(c, k);
    if (!op_begin(c, "rope"))
        return;
    c->layer = layer;
    cs = rope_table(c, layer);
    KVG_CU_CHECK(c, "launch kvg_k_rope",
                 kvg_k_rope(c->stream, q, k, cs,
                            cfg->attn_temp_scale != 0.0f ? DEV(c, const float, off_q_scale) : NULL,
                            c->plan.n_rows, cfg->n_heads, cfg->n_kv_heads, cfg->head_dim, kvg_rope_dims(cfg),
                            cfg->rope_layout == KVG_ROPE_HALF),
                 "rows=%d", c->plan.n_rows);
}

static void cu_kv_write(kvg_backend *be, kvg_kv_pool *kv, int layer, const float *k, const float *v)
{
    kvg_cuda *c = cu(be);
    kvg_k_kv_geom g;
    NOTE(c, kv);
    NOTE(c, layer);
    NOTE(c, k);
    NOTE(c, v);
    if (!op_begin(c, "kv_write"))
        return;
    c->layer = layer;
    if (kvg_cu_kv_geom(c, kv, &g) != 0)
        return;
    KVG_CU_CHECK(c, "launch kvg_k_kv_write",
                 kvg_k_kv_write(c->stream, kv->data, &g, layer, k, v, DEV(c, const int32_t, off_row_slot),
                                c->plan.n_rows),
                 "rows=%d", c->plan.n_rows);
}

/* rope then kv_write in one kernel (KVGATE_CUDA_FUSE, cuda_fuse.c's switch), or the two. */
static void cu_rope_kv_write(kvg_backend *be, kvg_kv_pool *kv, int layer, float *q, float *k, const float *v)
{
    kvg_cuda *c = cu(be);
    const kvg_model_config *cfg = &c->m->cfg;
    const float *cs;
    kvg_k_kv_geom g;
    if (!c->fuse) {
        cu_rope(be, layer, q, k);
        cu_kv_write(be, kv, layer, k, v);
        return;
    }
    NOTE(c, kv);
    NOTE(c, layer);
    NOTE(c, q);
    NOTE(c, k);
    NOTE(c, v);
    if (!op_begin(c, "rope_kv_write"))
        return;
    c->layer = layer;
    if (kvg_cu_kv_geom(c, kv, &g) != 0)
        return;
    cs = rope_table(c, layer);
    KVG_CU_CHECK(c, "launch kvg_k_rope_kv_write",
                 kvg_k_rope_kv_write(c->stream, q, k, cs,
                                     cfg->attn_temp_scale != 0.0f ? DEV(c, const float, off_q_scale) : NULL,
                                     c->plan.n_rows, cfg->n_heads, cfg->head_dim, kvg_rope_dims(cfg),
                                     cfg->rope_layout == KVG_ROPE_HALF, kv->data, &g, layer, v,
                                     DEV(c, const int32_t, off_row_slot)),
                 "rows=%d", c->plan.n_rows);
}

static void cu_attention(kvg_backend *be, kvg_kv_pool *kv, int layer, const float *q, float *out)
{
    kvg_cuda *c = cu(be);
    const kvg_model_config *cfg = &c->m->cfg;
    kvg_k_attn_args a;
    size_t n_out = 0;
    NOTE(c, kv);
    NOTE(c, layer);
    NOTE(c, q);
    NOTE(c, out);
    if (!op_begin(c, "attention"))
        return;
    c->layer = layer;
    if (kvg_cu_sdpa_attention(c, kv, layer, q, out))
        return;
    memset(&a, 0, sizeof a);
    if (kvg_cu_kv_geom(c, kv, &a.g) != 0)
        return;
    a.pool = kv->data;
    a.layer = layer;
    a.q = q;
    a.n_heads = cfg->n_heads;
    a.pos = DEV(c, const int32_t, off_pos);
    a.row_seq = DEV(c, const int32_t, off_row_seq);
    a.tables = DEV(c, const int32_t, off_tables);
    a.table_off = DEV(c, const int32_t, off_table_off);
    a.items = DEV(c, const kvg_k_attn_item, off_items);
    a.max_tile_rows = c->plan.max_tile_rows;
    a.split_tokens = c->plan.split_tokens;
    a.row_part = DEV(c, const int32_t, off_row_part);
    a.partials = c->d_partials;
    /* The model's divisor (Gemma 2 27B: attn_query_scalar), its sliding window on this
     * layer, its soft cap: as the CPU backend (attention_cpu.c). */
    a.scale = 1.0f / sqrtf(cfg->attn_query_scalar > 0.0f ? cfg->attn_query_scalar : (float)cfg->head_dim);
    a.window = c->m->layers[layer].sliding ? cfg->swa_window : 0;
    a.softcap = cfg->attn_softcap > 0.0f ? cfg->attn_softcap : 0.0f;
    if (cfg->attn_sinks) {
        /* gpt-oss: the layer's sinks join pass 2's max and denominator */
        const kvg_cu_weight *sw = kvg_cu_weight_of(c, c->m->layers[layer].attn_sinks);
        if (!sw)
            return;
        a.sinks = sw->dev;
    }
    a.out = out;
    if (c->n_groups > 0) {
        /* wo's input rounded by the combine kernels (cuda_fuse.c): every row of the step */
        const kvg_attn_group *last = &c->groups[c->n_groups - 1];
        n_out = (size_t)(last->row0 + last->n_rows) * (size_t)cfg->n_heads * (size_t)cfg->head_dim;
        a.out_lowp = kvg_cu_attn_lowp(c, layer, n_out, &a.out_lowp_dt);
        if (c->failed)
            return;
    }
    /* One launch per group; each reuses the scratch after the previous one's combine (the
     * same stream orders them). */
    for (int i = 0; i < c->n_groups && !c->failed; i++) {
        const kvg_attn_group *gr = &c->groups[i];
        a.item0 = gr->item0;
        a.n_items = gr->n_items;
        a.row0 = gr->row0;
        a.n_rows = gr->n_rows;
        a.part0 = (int32_t)gr->part0;
        KVG_CU_CHECK(c, "launch kvg_k_attention", kvg_k_attention(c->stream, &a),
                     "rows=%d..%d items=%d split=%d", a.row0, a.row0 + a.n_rows - 1, a.n_items, a.split_tokens);
    }
    if (a.out_lowp && !c->failed)
        kvg_cu_lowp_set(c, out, n_out, a.out_lowp_dt);
}

static void cu_swiglu(kvg_backend *be, float *gate, const float *up, size_t n)
{
    kvg_cuda *c = cu(be);
    NOTE(c, gate);
    NOTE(c, up);
    NOTE(c, n);
    if (op_begin(c, "swiglu"))
        kvg_cu_glu(c, 0, gate, up, n);
}

static void cu_geglu(kvg_backend *be, float *gate, const float *up, size_t n)
{
    kvg_cuda *c = cu(be);
    NOTE(c, gate);
    NOTE(c, up);
    NOTE(c, n);
    if (op_begin(c, "geglu"))
        kvg_cu_glu(c, 1, gate, up, n);
}

static void cu_scale(kvg_backend *be, float *x, float s, size_t n)
{
    kvg_cuda *c = cu(be);
    NOTE(c, x);
    NOTE(c, s);
    NOTE(c, n);
    if (op_begin(c, "scale")) {
        c->layer = -1;
        KVG_CU_CHECK(c, "launch kvg_k_scale", kvg_k_scale(c->stream, x, s, n), "n=%zu scale=%g", n, (double)s);
    }
}

static void cu_softcap(kvg_backend *be, float *x, float cap, size_t n)
{
    kvg_cuda *c = cu(be);
    NOTE(c, x);
    NOTE(c, cap);
    NOTE(c, n);
    if (op_begin(c, "softcap")) {
        c->layer = -1;
        KVG_CU_CHECK(c, "launch kvg_k_softcap", kvg_k_softcap(c->stream, x, cap, n), "n=%zu cap=%g", n,
                     (double)cap);
    }
}

static void cu_add(kvg_backend *be, float *x, const float *y, size_t n)
{
    kvg_cuda *c = cu(be);
    NOTE(c, x);
    NOTE(c, y);
    NOTE(c, n);
    if (op_begin(c, "add"))
        KVG_CU_CHECK(c, "launch kvg_k_add", kvg_k_add(c->stream, x, y, n), "n=%zu", n);
}

static void cu_gather_out_rows(kvg_backend *be, const float *x, int width, float *out)
{
    kvg_cuda *c = cu(be);
    NOTE(c, x);
    NOTE(c, width);
    NOTE(c, out);
    if (op_begin(c, "gather_out_rows"))
        KVG_CU_CHECK(c, "launch kvg_k_gather_rows",
                     kvg_k_gather_rows(c->stream, x, width, DEV(c, const int32_t, off_out_rows), c->plan.n_out,
                                       out),
                     "rows=%d width=%d", c->plan.n_out, width);
}

static void cu_moe(kvg_backend *be, int layer, const float *x, int rows, float *out)
{
    kvg_cuda *c = cu(be);
    NOTE(c, layer);
    NOTE(c, x);
    NOTE(c, rows);
    NOTE(c, out);
    if (!op_begin(c, "moe"))
        return;
    c->layer = layer;
    kvg_cu_moe_ffn(c, layer, x, rows, out);
}

/* ---- the KV pool, memory, description ---- */

static size_t cu_kv_block_bytes(kvg_backend *be, const kvg_kv_geom *g)
{
    (void)be;
    return kvg_cu_kv_block_bytes(g);
}

static kvg_kv_pool *cu_kv_pool_new(kvg_backend *be, const kvg_kv_geom *g, int32_t n_blocks,
                                   char *err, size_t err_len)
{
    kvg_cuda *c = cu(be);
    kvg_kv_pool *p;
    if (c->kv_pools > 0) {
        /* begin_step checks block ids against the one pool's size. */
        kvg_set_err(err, err_len, "cuda: one KV pool per backend");
        return NULL;
    }
    kvg_cu_alloc_ok(c, "the KV pool");                 /* between steps: counted */
    p = kvg_cu_kv_pool_new(c, g, n_blocks, err, err_len);
    if (p) {
        c->kv_pool_blocks = p->n_blocks;
        c->kv_block_bytes = p->block_bytes;
    }
    return p;
}

static int cu_mem_free(kvg_backend *be, size_t *fr, size_t *total)
{
    (void)be;
    if (cudaMemGetInfo(fr, total) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return 0;
}

static void *cu_host_alloc(kvg_backend *be, size_t bytes)
{
    void *p = NULL;
    (void)be;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_host_free(kvg_backend *be, void *p)
{
    kvg_cuda *c = cu(be);
    if (!p)
        return;
    /* copies queued from or into it must have run */
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    cudaFreeHost(p);
}

static const char *cu_describe(kvg_backend *be)
{
    return cu(be)->describe;
}

static void cu_destroy(kvg_backend *be)
{
    kvg_cuda *c;
    if (!be)
        return;
    c = be->ctx;
    if (c) {
        if (c->stream)
            cudaStreamSynchronize(c->stream);
        kvg_cu_graph_free(c);
        kvg_cu_gemm_free(c);
        kvg_cu_moe_free(c);
        kvg_cu_sdpa_free(c);
        kvg_cu_weights_free(c);
        for (int i = 0; i < 2; i++) {
            if (c->h_plan[i])
                cudaFreeHost(c->h_plan[i]);
            if (c->plan_sent[i])
                cudaEventDestroy(c->plan_sent[i]);
        }
        if (c->d_plan)
            cudaFree(c->d_plan);
        if (c->d_partials)
            cudaFree(c->d_partials);
        free(c->groups);
        if (c->stream)
            cudaStreamDestroy(c->stream);
        free(c->inv_freq);
        free(c);
    }
    free(be);
}

static const kvg_backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .free = cu_free,
    .read = cu_read,
    .begin_step = cu_begin_step,
    .embed = cu_embed,
    .rmsnorm = cu_rmsnorm,
    .matmul = cu_matmul,
    .matmul_n = cu_matmul_n,
    .add_rmsnorm = cu_add_rmsnorm,
    .rope = cu_rope,
    .kv_write = cu_kv_write,
    .rope_kv_write = cu_rope_kv_write,
    .attention = cu_attention,
    .swiglu = cu_swiglu,
    .geglu = cu_geglu,
    .scale = cu_scale,
    .softcap = cu_softcap,
    .add = cu_add,
    .gather_out_rows = cu_gather_out_rows,
    .moe = cu_moe,
    .end_step = cu_end_step,
    .kv_block_bytes = cu_kv_block_bytes,
    .kv_pool_new = cu_kv_pool_new,
    .mem_free = cu_mem_free,
    .describe = cu_describe,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
};

/* "cuda: no CUDA device: cudaGetDeviceCount: cudaErrorNoDevice (...)". */
static void rt_err(char *err, size_t err_len, const char *what, const char *call, cudaError_t e)
{
    char t[200];
    kvg_cu_err_text(e, t, sizeof t);
    kvg_set_err(err, err_len, "cuda: %s: %s: %s", what, call, t);
}

int kvg_backend_cuda_probe(int dev, char *err, size_t err_len)
{
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess) {
        rt_err(err, err_len, e == cudaErrorInsufficientDriver ? "the NVIDIA driver is too old or missing"
                             : "no CUDA device", "cudaGetDeviceCount", e);
        return -1;
    }
    if (n_dev <= 0) {
        kvg_set_err(err, err_len, "cuda: no CUDA device: cudaGetDeviceCount found none");
        return -1;
    }
    if (dev < 0 || dev >= n_dev) {
        kvg_set_err(err, err_len, "cuda: --device %d: this machine has %d CUDA device%s (0..%d)", dev, n_dev,
                    n_dev == 1 ? "" : "s", n_dev - 1);
        return -1;
    }
    e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        rt_err(err, err_len, "cannot use the device", "cudaSetDevice", e);
        return -1;
    }
    return 0;
}

/* What of the model's family this backend does not run yet, or NULL. */
static const char *cuda_family_error(const kvg_model *m)
{
    const kvg_model_config *c = &m->cfg;
    return c->n_experts > KVG_K_MOE_MAX_EXPERTS ? "a mixture of more than 512 experts" : NULL;
}

kvg_backend *kvg_backend_cuda_new(const kvg_model *m, const kvg_backend_opts *o,
                                  char *err, size_t err_len)
{
    const kvg_model_config *cfg = &m->cfg;
    kvg_backend *be;
    kvg_cuda *c;
    int dev = o ? o->device : 0;
    cudaError_t e;
    const char *missing = cuda_family_error(m);

    if (missing) {
        kvg_set_err(err, err_len, "cuda: %s models need %s, which this backend does not run yet", cfg->arch,
                    missing);
        return NULL;
    }
    if (kvg_backend_cuda_probe(dev, err, err_len) != 0)
        return NULL;
    if (kvg_backend_check_model(m, "cuda", KVG_K_ATTN_MAX_HEAD_DIM, err, err_len) != 0)
        return NULL;
    be = kvg_backend_alloc(&cuda_ops, m, sizeof *c, "cuda", err, err_len);
    if (!be)
        return NULL;
    c = be->ctx;
    be->n_threads = 1;
    c->m = m;
    c->device = dev;
    c->batch_invariant = o ? o->batch_invariant : 1;
    c->layer = -1;
    {
        const char *s = getenv("KVGATE_CUDA_SYNC");
        c->sync_each = s && strcmp(s, "1") == 0;
        if (attn_scratch_of(getenv("KVGATE_CUDA_ATTN_SCRATCH"), &c->attn_scratch, err, err_len) != 0)
            goto fail;
    }
    e = cudaGetDeviceProperties(&c->prop, dev);
    if (e != cudaSuccess) {
        rt_err(err, err_len, "cannot query the device", "cudaGetDeviceProperties", e);
        goto fail;
    }
    snprintf(c->describe, sizeof c->describe, "%s, sm_%d%d, device %d", c->prop.name, c->prop.major,
             c->prop.minor, dev);
    e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        c->stream = NULL;
        rt_err(err, err_len, "cannot create a stream", "cudaStreamCreateWithFlags", e);
        goto fail;
    }
    for (int i = 0; i < 2; i++) {
        e = cudaEventCreateWithFlags(&c->plan_sent[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            c->plan_sent[i] = NULL;
            rt_err(err, err_len, "cannot create an event", "cudaEventCreateWithFlags", e);
            goto fail;
        }
    }
    c->n_rope_kinds = kvg_rope_n_kinds(m);
    c->inv_freq = malloc((size_t)c->n_rope_kinds * (size_t)(cfg->head_dim / 2) * sizeof(float));
    if (!c->inv_freq) {
        kvg_set_err(err, err_len, "cuda: out of memory");
        goto fail;
    }
    for (int k = 0; k < c->n_rope_kinds; k++)
        kvg_rope_frequencies(cfg, k, c->inv_freq + (size_t)k * (cfg->head_dim / 2));
    /* Every GEMM shape made (with --batch-invariant on: pinned and self-tested) before
       the engine serves. */
    if (kvg_cu_weights_upload(c, err, err_len) != 0 || kvg_cu_fuse_init(c, err, err_len) != 0 ||
        kvg_cu_gemm_init(c, err, err_len) != 0
        || kvg_cu_moe_init(c, err, err_len) != 0 || kvg_cu_gemm_startup(c, err, err_len) != 0)
        goto fail;
    if (kvg_cu_sdpa_init(c, err, err_len) != 0 || kvg_cu_graph_init(c, err, err_len) != 0)
        goto fail;
    return be;
fail:
    cu_destroy(be);
    return NULL;
}
