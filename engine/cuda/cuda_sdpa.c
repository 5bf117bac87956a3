/* Attention through cuDNN's SDPA forward operation (see cuda_sdpa.h for the mapping).
 *
 * Graph per shape bucket: 8 tensor descriptors, the SDPA operation, an operation graph,
 * the heuristics' engine configs and an execution plan, kept alive together until the
 * backend is destroyed. Per layer: q rounded to BF16, one variant pack (the layer's K/V
 * base pointers change, nothing else), cudnnBackendExecute on the backend's stream (the
 * handle's), the output back to F32. */
#include "cuda_sdpa.h"
#include "errmsg.h"
#include "log.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PLANS 32
#define MAX_DESCS 16
#define MAX_CFGS 4
#define MIN_VERSION 91500        /* paged K/V and sequence lengths in SDPA_FWD */

/* The tensors' unique ids in the graph and the variant pack. */
enum { U_Q = 1, U_K, U_V, U_O, U_SCALE, U_PT, U_SEQ_Q, U_SEQ_KV, N_UIDS = U_SEQ_KV };

typedef struct sdpa_plan {
    int64_t B, P;                /* the bucket: batch entries, pages per entry */
    cudnnBackendDescriptor_t plan;
    cudnnBackendDescriptor_t descs[MAX_DESCS];   /* everything the plan came from */
    int n_descs;
    int64_t workspace;
    int64_t used;                /* the step that last used it (eviction) */
} sdpa_plan;

struct kvg_cu_sdpa {
    cudnnHandle_t h;
    int on;                      /* 0 once a build failed: the own kernels from then on */
    int32_t pool_blocks;         /* the pool the plans' K/V containers describe */
    size_t pool_block_bytes;     /* ... and its block stride */
    float scale;
    sdpa_plan plans[MAX_PLANS];
    int n_plans;
    /* This step (begin_step): its plan, rows and buffers. */
    sdpa_plan *cur;
    int n_rows;
    int32_t *h_meta;             /* pinned: seq_q[B] seq_kv[B] table[B][P], each from a
                                    multiple of 4 entries */
    void *d_meta;
    size_t meta_cap;
    void *qo;                    /* q16 and o16, [B][n_heads * head_dim] BF16 each */
    void *q16, *o16;
    size_t qo_cap;
    void *ws;
    size_t ws_cap;
};

/* ---- what cuDNN can express ---- */

static const char *layer_unexpressible(const kvg_model *m, int layer)
{
    const kvg_model_config *cfg = &m->cfg;
    if (cfg->attn_softcap > 0.0f)
        return "soft-capped scores";
    if (cfg->attn_sinks)
        return "attention sinks";
    if (m->layers[layer].sliding && cfg->swa_window > 0)
        return "a sliding window";
    return NULL;
}

static const char *model_unexpressible(const kvg_model *m)
{
    const kvg_model_config *cfg = &m->cfg;
    const char *why = NULL;
    if (cfg->head_dim > 256 || cfg->head_dim % 8 != 0)
        return "its head_dim (cuDNN's SDPA takes multiples of 8 up to 256)";
    for (int l = 0; l < cfg->n_layers; l++) {
        why = layer_unexpressible(m, l);
        if (!why)
            return NULL;         /* at least one layer goes to cuDNN */
    }
    return why;
}

static void version_text(size_t v, char *buf, size_t len)
{
    snprintf(buf, len, "%zu.%zu.%zu", v / 10000, v % 10000 / 100, v % 100);
}

/* ---- init ---- */

/* KVGATE_CUDA_ATTENTION: 0 own, 1 cudnn, 2 auto; -1 invalid. */
static int mode_of(const char *v)
{
    if (!v || !*v || strcmp(v, "auto") == 0)
        return 2;
    if (strcmp(v, "own") == 0)
        return 0;
    if (strcmp(v, "cudnn") == 0)
        return 1;
    return -1;
}

int kvg_cu_sdpa_init(kvg_cuda *c, char *err, size_t err_len)
{
    const char *env = getenv("KVGATE_CUDA_ATTENTION");
    int mode = mode_of(env);
    size_t v;
    char ver[32], why[300] = "";
    const char *no;
    kvg_cu_sdpa *d;
    cudnnStatus_t st;

    if (mode < 0) {
        kvg_set_err(err, err_len, "cuda: KVGATE_CUDA_ATTENTION=%s: need own, cudnn or auto", env);
        return -1;
    }
    if (mode == 0)
        return 0;
    if (c->batch_invariant) {
        /* whether cuDNN keeps a row's bits independent of the batch is for a GPU to show */
        if (mode == 1)
            kvg_log("cuda: KVGATE_CUDA_ATTENTION=cudnn: --batch-invariant on keeps the own attention kernels");
        return 0;
    }
    v = cudnnGetVersion();
    version_text(v, ver, sizeof ver);
    no = model_unexpressible(c->m);
    if (v < MIN_VERSION)
        snprintf(why, sizeof why, "the loaded cuDNN %s has no paged SDPA (9.15.0 or newer has)", ver);
    else if (no)
        snprintf(why, sizeof why, "cuDNN's SDPA cannot express this model's attention (%s)", no);
    if (!*why) {
        d = calloc(1, sizeof *d);
        if (!d) {
            kvg_set_err(err, err_len, "cuda: out of memory");
            return -1;
        }
        st = cudnnCreate(&d->h);
        if (st == CUDNN_STATUS_SUCCESS) {
            st = cudnnSetStream(d->h, c->stream);
            if (st != CUDNN_STATUS_SUCCESS)
                snprintf(why, sizeof why, "cudnnSetStream failed: %s", cudnnGetErrorString(st));
        } else {
            d->h = NULL;
            snprintf(why, sizeof why, "cudnnCreate failed: %s", cudnnGetErrorString(st));
        }
        if (*why) {
            if (d->h)
                cudnnDestroy(d->h);
            free(d);
        } else {
            const kvg_model_config *cfg = &c->m->cfg;
            int own = 0;
            d->on = 1;
            d->scale = 1.0f / sqrtf(cfg->attn_query_scalar > 0.0f ? cfg->attn_query_scalar : (float)cfg->head_dim);
            c->sdpa = d;
            for (int l = 0; l < cfg->n_layers; l++)
                own += layer_unexpressible(c->m, l) != NULL;
            kvg_log("cuda: attention through cuDNN %s's SDPA%s%.0d%s", ver, own ? " (own kernels for " : "", own,
                    own ? " layers it cannot express)" : "");
            return 0;
        }
    }
    if (mode == 1) {
        kvg_set_err(err, err_len, "cuda: KVGATE_CUDA_ATTENTION=cudnn: %s", why);
        return -1;
    }
    kvg_log("cuda: attention through the own kernels: %s", why);
    return 0;
}

static void plan_free(sdpa_plan *p)
{
    for (int i = 0; i < p->n_descs; i++)
        cudnnBackendDestroyDescriptor(p->descs[i]);
    memset(p, 0, sizeof *p);
}

void kvg_cu_sdpa_free(kvg_cuda *c)
{
    kvg_cu_sdpa *d = c->sdpa;
    if (!d)
        return;
    for (int i = 0; i < d->n_plans; i++)
        plan_free(&d->plans[i]);
    if (d->h_meta)
        cudaFreeHost(d->h_meta);
    if (d->d_meta)
        cudaFree(d->d_meta);
    if (d->qo)
        cudaFree(d->qo);
    if (d->ws)
        cudaFree(d->ws);
    if (d->h)
        cudnnDestroy(d->h);
    free(d);
    c->sdpa = NULL;
}

/* ---- building a plan ---- */

/* One step of a build: on failure `what` and the status say which. */
typedef struct build {
    sdpa_plan *p;
    const char *what;
    cudnnStatus_t st;
} build;

static int ok(build *b, cudnnStatus_t st, const char *what)
{
    if (st == CUDNN_STATUS_SUCCESS)
        return 1;
    b->st = st;
    b->what = what;
    return 0;
}

static int new_desc(build *b, cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *out, const char *what)
{
    *out = NULL;
    if (b->p->n_descs == MAX_DESCS)
        return ok(b, CUDNN_STATUS_INTERNAL_ERROR, what);
    if (!ok(b, cudnnBackendCreateDescriptor(type, out), what))
        return 0;
    b->p->descs[b->p->n_descs++] = *out;
    return 1;
}

static int tensor(build *b, cudnnBackendDescriptor_t *t, int64_t uid, cudnnDataType_t type, const int64_t dims[4],
                  const int64_t strides[4], int by_value)
{
    int64_t align = by_value ? 4 : 16;
    bool bv = by_value != 0;
    return new_desc(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, t, "tensor descriptor") &&
           ok(b, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type),
              "tensor data type") &&
           ok(b, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims),
              "tensor dimensions") &&
           ok(b, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides),
              "tensor strides") &&
           ok(b, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid),
              "tensor unique id") &&
           ok(b, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align),
              "tensor alignment") &&
           (!by_value ||
            ok(b, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv),
               "tensor by value")) &&
           ok(b, cudnnBackendFinalize(*t), "cudnnBackendFinalize(tensor)");
}

static int set_desc(build *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                    cudnnBackendDescriptor_t v, const char *what)
{
    return ok(b, cudnnBackendSetAttribute(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v), what);
}

/* The handle attributes are deprecated in cuDNN 9 (the device is the current one) but
 * still honoured; set as cuDNN's own frontend sets them. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static const cudnnBackendAttributeName_t GRAPH_HANDLE = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
static const cudnnBackendAttributeName_t PLAN_HANDLE = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

static int build_plan(kvg_cuda *c, build *b, int64_t B, int64_t P)
{
    kvg_cu_sdpa *d = c->sdpa;
    const kvg_model_config *cfg = &c->m->cfg;
    int64_t H = cfg->n_heads, Hk = cfg->n_kv_heads, D = cfg->head_dim, T, N = c->kv_pool_blocks;
    int64_t ht = 0, n_cfg = 0, one[4] = { 1, 1, 1, 1 };
    cudnnBackendDescriptor_t tq, tk, tv, to, ts, tpt, tsq, tskv, op, graph, heur, cfgs[MAX_CFGS], plan;
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    sdpa_plan *p = b->p;

    T = c->plan.block_tokens;
    {
        /* the pool's block in BF16 elements: its int8 layers (kvg_kernels.h) included */
        int64_t head_elems = 2 * T * D, block_elems = (int64_t)(c->kv_block_bytes / 2);
        int64_t qd[4] = { B, H, 1, D }, qs[4] = { H * D, D, H * D, 1 };
        int64_t kd[4] = { N, Hk, T, D }, ks[4] = { block_elems, head_elems, D, 1 };
        int64_t ptd[4] = { B, 1, P, 1 }, pts[4] = { P, P, 1, 1 };
        int64_t sd[4] = { B, 1, 1, 1 };
        if (!tensor(b, &tq, U_Q, CUDNN_DATA_BFLOAT16, qd, qs, 0) ||
            !tensor(b, &tk, U_K, CUDNN_DATA_BFLOAT16, kd, ks, 0) ||
            !tensor(b, &tv, U_V, CUDNN_DATA_BFLOAT16, kd, ks, 0) ||
            !tensor(b, &to, U_O, CUDNN_DATA_BFLOAT16, qd, qs, 0) ||
            !tensor(b, &ts, U_SCALE, CUDNN_DATA_FLOAT, one, one, 1) ||
            !tensor(b, &tpt, U_PT, CUDNN_DATA_INT32, ptd, pts, 0) ||
            !tensor(b, &tsq, U_SEQ_Q, CUDNN_DATA_INT32, sd, one, 0) ||
            !tensor(b, &tskv, U_SEQ_KV, CUDNN_DATA_INT32, sd, one, 0))
            return -1;
    }
    if (!new_desc(b, CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, &op, "SDPA operation") ||
        !set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, tq, "SDPA Q") ||
        !set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, tk, "SDPA K") ||
        !set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, tv, "SDPA V") ||
        !set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, to, "SDPA O") ||
        !set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, ts, "SDPA scale") ||
        !set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_KDESC, tpt, "SDPA page table K") ||
        !set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_VDESC, tpt, "SDPA page table V") ||
        !set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC, tsq, "SDPA seq_len_q") ||
        !set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_KVDESC, tskv, "SDPA seq_len_kv") ||
        !ok(b, cudnnBackendFinalize(op), "cudnnBackendFinalize(SDPA operation)"))
        return -1;
    if (!new_desc(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph, "operation graph") ||
        !ok(b, cudnnBackendSetAttribute(graph, GRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &d->h), "graph handle") ||
        !set_desc(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, op, "graph operations") ||
        !ok(b, cudnnBackendFinalize(graph), "cudnnBackendFinalize(operation graph)"))
        return -1;
    if (!new_desc(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur, "heuristics") ||
        !set_desc(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph") ||
        !ok(b, cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode),
            "heuristics mode") ||
        !ok(b, cudnnBackendFinalize(heur), "cudnnBackendFinalize(heuristics)"))
        return -1;
    for (int i = 0; i < MAX_CFGS; i++)
        if (!new_desc(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i], "engine config"))
            return -1;
    if (!ok(b, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_CFGS,
                                        &n_cfg, cfgs), "heuristics results"))
        return -1;
    if (n_cfg < 1)
        return ok(b, CUDNN_STATUS_NOT_SUPPORTED, "heuristics (no engine)"), -1;
    /* The heuristics' configs in their order: the first whose plan finalizes. */
    for (int64_t i = 0; i < n_cfg && i < MAX_CFGS; i++) {
        if (!new_desc(b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan, "execution plan") ||
            !ok(b, cudnnBackendSetAttribute(plan, PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &d->h), "plan handle") ||
            !set_desc(b, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[i], "plan engine config"))
            return -1;
        if (ok(b, cudnnBackendFinalize(plan), "cudnnBackendFinalize(execution plan)")) {
            int64_t n = 0;
            if (!ok(b, cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                                &n, &ht), "plan workspace size"))
                return -1;
            p->plan = plan;
            p->workspace = ht;
            p->B = B;
            p->P = P;
            return 0;
        }
    }
    return -1;
}

static int64_t pow2_at_least(int64_t x)
{
    int64_t p = 1;
    while (p < x)
        p *= 2;
    return p;
}

/* The bucket's plan, built if new; NULL when cuDNN cannot (logged, cuDNN off). */
static sdpa_plan *plan_for(kvg_cuda *c, int64_t B, int64_t P)
{
    kvg_cu_sdpa *d = c->sdpa;
    sdpa_plan *p = NULL;
    build b;
    for (int i = 0; i < d->n_plans; i++)
        if (d->plans[i].B == B && d->plans[i].P == P)
            return &d->plans[i];
    if (d->n_plans < MAX_PLANS) {
        p = &d->plans[d->n_plans++];
    } else {
        /* the least recently used bucket makes room */
        p = &d->plans[0];
        for (int i = 1; i < d->n_plans; i++)
            if (d->plans[i].used < p->used)
                p = &d->plans[i];
        plan_free(p);
    }
    memset(&b, 0, sizeof b);
    b.p = p;
    if (build_plan(c, &b, B, P) == 0)
        return p;
    kvg_log("cuda: attention through the own kernels from now on: cuDNN SDPA for %lld rows x %lld pages: %s "
            "failed: %s", (long long)B, (long long)P, b.what ? b.what : "?", cudnnGetErrorString(b.st));
    plan_free(p);
    d->n_plans--;
    if (p != &d->plans[d->n_plans])
        *p = d->plans[d->n_plans];
    d->on = 0;
    return NULL;
}

/* ---- the step ---- */

int kvg_cu_sdpa_begin_step(kvg_cuda *c, const kvg_step *s)
{
    kvg_cu_sdpa *d = c->sdpa;
    const kvg_model_config *cfg = &c->m->cfg;
    int64_t B, P = 1, stride;
    size_t meta, qo;
    int32_t *seq_q, *seq_kv, *table;
    cudaError_t e;

    if (!d)
        return 0;
    d->cur = NULL;
    if (!d->on)
        return 0;
    if (d->pool_blocks != c->kv_pool_blocks || d->pool_block_bytes != c->kv_block_bytes) {
        /* a new pool: the plans' K/V containers describe the old one's size and stride */
        for (int i = 0; i < d->n_plans; i++)
            plan_free(&d->plans[i]);
        d->n_plans = 0;
        d->pool_blocks = c->kv_pool_blocks;
        d->pool_block_bytes = c->kv_block_bytes;
    }
    for (int i = 0; i < s->n_seqs; i++)
        if (s->n_blocks[i] > P)
            P = s->n_blocks[i];
    B = pow2_at_least(s->n_rows);
    P = pow2_at_least(P);
    d->cur = plan_for(c, B, P);
    if (!d->cur)
        return 0;
    d->cur->used = c->step;
    d->n_rows = s->n_rows;
    /* seq_q, seq_kv and the table each on 16 bytes (the alignment the tensors declare) */
    stride = (B + 3) / 4 * 4;
    meta = (size_t)(2 * stride + B * P) * sizeof(int32_t);
    if (meta > d->meta_cap) {
        size_t cap = meta + meta / 2;
        kvg_cu_alloc_ok(c, "cuDNN's page table");      /* before the step's capture: counted */
        /* begin_step waited for the stream: no copy reads the old buffers any more */
        if (d->h_meta)
            cudaFreeHost(d->h_meta);
        if (d->d_meta)
            cudaFree(d->d_meta);
        d->h_meta = NULL;
        d->d_meta = NULL;
        d->meta_cap = 0;
        e = cudaMallocHost((void **)&d->h_meta, cap);
        if (e != cudaSuccess) {
            d->h_meta = NULL;
            return kvg_cu_fail(c, "cudaMallocHost", e, "cuDNN page table, %zu bytes", cap);
        }
        e = cudaMalloc(&d->d_meta, cap);
        if (e != cudaSuccess) {
            d->d_meta = NULL;
            return kvg_cu_fail(c, "cudaMalloc", e, "cuDNN page table, %zu bytes", cap);
        }
        d->meta_cap = cap;
    }
    /* q and the output in one buffer (each a multiple of 16 bytes: head_dim % 8 == 0) */
    qo = (size_t)B * (size_t)cfg->n_heads * (size_t)cfg->head_dim * 2u;
    if (kvg_cu_grow_dev(c, &d->qo, &d->qo_cap, 2 * qo, "cuDNN attention's q and output") != 0)
        return -1;
    d->q16 = d->qo;
    d->o16 = (unsigned char *)d->qo + qo;
    if (d->cur->workspace > 0 &&
        kvg_cu_grow_dev(c, &d->ws, &d->ws_cap, (size_t)d->cur->workspace, "cuDNN attention workspace") != 0)
        return -1;
    /* Row r is batch entry r: one query, keys [0, pos[r]], its sequence's pages; the
     * entries past the rows have lengths 0 and page 0 (a valid id, never read). */
    seq_q = d->h_meta;
    seq_kv = seq_q + stride;
    table = seq_kv + stride;
    memset(d->h_meta, 0, meta);
    for (int r = 0; r < s->n_rows; r++) {
        int q = s->row_seq[r];
        seq_q[r] = 1;
        seq_kv[r] = s->pos[r] + 1;
        memcpy(table + (size_t)r * (size_t)P, s->block_tables[q], (size_t)s->n_blocks[q] * sizeof(int32_t));
    }
    e = cudaMemcpyAsync(d->d_meta, d->h_meta, meta, cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess)
        return kvg_cu_fail(c, "cudaMemcpyAsync", e, "cuDNN page table, %zu bytes", meta);
    return 0;
}

void kvg_cu_sdpa_sig(const kvg_cuda *c, kvg_cu_sdpa_signature *out)
{
    const kvg_cu_sdpa *d = c->sdpa;
    memset(out, 0, sizeof *out);
    if (!d)
        return;
    if (d->cur) {
        out->plan = (const void *)d->cur->plan;
        out->B = d->cur->B;
        out->P = d->cur->P;
    }
    out->n_rows = d->n_rows;
    out->meta = d->d_meta;
    out->qo = d->qo;
    out->ws = d->ws;
}

int kvg_cu_sdpa_attention(kvg_cuda *c, const kvg_kv_pool *kv, int layer, const float *q, float *out)
{
    kvg_cu_sdpa *d = c->sdpa;
    const kvg_model_config *cfg = &c->m->cfg;
    kvg_k_kv_geom g;
    sdpa_plan *p;
    size_t n;
    int64_t uids[N_UIDS] = { U_Q, U_K, U_V, U_O, U_SCALE, U_PT, U_SEQ_Q, U_SEQ_KV };
    void *ptrs[N_UIDS];
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t st;
    const char *what;
    int32_t *meta;
    void *o16, *lp;
    kvg_kt wo_dt;
    float scale;

    if (!d || !d->cur || layer_unexpressible(c->m, layer))
        return 0;
    if (kvg_cu_kv_geom(c, kv, &g) != 0)
        return 1;
    if (kvg_k_layer_int8(&g, layer))
        return 0;                /* an int8 layer (--kv-dtype int8): cuDNN reads BF16 only */
    p = d->cur;
    n = (size_t)d->n_rows * (size_t)cfg->n_heads * (size_t)cfg->head_dim;
    KVG_CU_CHECK(c, "launch kvg_k_to_lowp", kvg_k_to_lowp(c->stream, q, n, KVG_KT_BF16, d->q16),
                 "cuDNN attention's q, %zu elements", n);
    if (c->failed)
        return 1;
    meta = d->d_meta;
    scale = d->scale;
    ptrs[0] = d->q16;
    ptrs[1] = (unsigned char *)kv->data + (size_t)layer * (size_t)g.layer_elems * 2u;
    ptrs[2] = (unsigned char *)ptrs[1] + (size_t)g.block_tokens * (size_t)g.head_dim * 2u;
    /* wo reads the output rounded to BF16: when wo is BF16, cuDNN's BF16 output is that
     * (BF16 -> F32 -> BF16 is the identity), written straight into the GEMMs' scratch
     * (cuda_fuse.c). The scratch holds every entry of the plan, padding included. */
    o16 = d->o16;
    lp = kvg_cu_attn_lowp(c, layer, (size_t)p->B * (size_t)cfg->n_heads * (size_t)cfg->head_dim, &wo_dt);
    if (c->failed)
        return 1;
    if (lp && wo_dt == KVG_KT_BF16)
        o16 = lp;
    else
        lp = NULL;
    ptrs[3] = o16;
    ptrs[4] = &scale;            /* by value: read at the call */
    ptrs[5] = meta + 2 * ((p->B + 3) / 4 * 4);
    ptrs[6] = meta;
    ptrs[7] = meta + (p->B + 3) / 4 * 4;
    what = "cudnnBackendCreateDescriptor(variant pack)";
    st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st == CUDNN_STATUS_SUCCESS) {
        what = "cudnnBackendSetAttribute(variant pack)";
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, N_UIDS, uids);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, N_UIDS,
                                          ptrs);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &d->ws);
        if (st == CUDNN_STATUS_SUCCESS) {
            what = "cudnnBackendFinalize(variant pack)";
            st = cudnnBackendFinalize(pack);
        }
        if (st == CUDNN_STATUS_SUCCESS) {
            what = "cudnnBackendExecute";
            st = cudnnBackendExecute(d->h, p->plan, pack);
        }
        cudnnBackendDestroyDescriptor(pack);
    }
    if (st != CUDNN_STATUS_SUCCESS) {
        kvg_cu_fail_dnn(c, what, st, "SDPA, %d rows in a plan for %lld x %lld pages", d->n_rows, (long long)p->B,
                        (long long)p->P);
        return 1;
    }
    if (c->sync_each)
        KVG_CU_CHECK(c, "cudnnBackendExecute", cudaSuccess, "SDPA, %d rows", d->n_rows);
    KVG_CU_CHECK(c, "launch kvg_k_from_lowp", kvg_k_from_lowp(c->stream, o16, n, KVG_KT_BF16, out),
                 "cuDNN attention's output, %zu elements", n);
    if (lp && !c->failed)
        kvg_cu_lowp_set(c, out, n, KVG_KT_BF16);
    return 1;
}
