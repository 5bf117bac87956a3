/* The CUDA backend's mixture-of-experts FFN (backend.h's moe), for one layer and R rows;
 * the CPU backend's algorithm (engine/cpu/moe_cpu.c) with the rows grouped on the device:
 *
 *   1. logits[R][E] = x router^T (+ bias)    cuBLASLt, F32 weights and input when the file's
 *                                             router is F32 (kvg_cu_matmul; gpt-oss's bias)
 *   2. kvg_k_moe_gate                        per row: softmax / top-k (ties to the lower
 *                                             expert) / renormalization -> sel, wt [R][K]
 *   3. kvg_k_moe_group                       the R*K (row, rank) pairs grouped by expert,
 *                                             rows ascending: each pair's slot (pos), each
 *                                             slot's row; every expert's slots start at a
 *                                             multiple of `align` (256-byte aligned rows)
 *   4. the counts and first slots (2E + 1 ints) to the host, and a wait: cuBLASLt takes
 *      each GEMM's M from the host, so the per-expert GEMMs cannot be enqueued before
 *      the counts are known (one synchronisation per MoE layer)
 *   5. kvg_k_gather_lowp                     every slot's row of x, rounded to the experts'
 *                                             type once for all experts (xg)
 *   6. per expert e with n_e rows:           g, u [its slots][EH] = its rows of xg times
 *                                             gate_e^T, up_e^T (kvg_cu_gemm, M = n_e; with
 *                                             gpt-oss's biases, the expert's slices)
 *   7. kvg_k_swiglu (gpt-oss: kvg_k_swiglu_oai, clamped) over all slots, then
 *      kvg_k_to_lowp (down's type)
 *   8. per expert e:                         y [its slots][dim] = its rows times down_e^T
 *                                             (+ its down bias)
 *   9. kvg_k_moe_combine                     out[r] = w[r][0] y[pos[r][0]] + ... in rank order
 *
 * Batch invariance. The router GEMM and the expert GEMMs run with the shape's pinned
 * algorithm (cuda_gemm.c: one algorithm per (N, K, type), split-K off, for every M), so an
 * expert's output row has the same bits whether the expert runs over 1 row or 300, and
 * wherever the row sits among them; the gating is per row, the grouping integers, the
 * combine one fixed chain per element. So a row's result never depends on which other
 * rows chose its experts. With --batch-invariant off the GEMMs take the heuristic's
 * algorithm per M, as every other GEMM does.
 *
 * What a later version does better (kernels/README.md): the per-expert GEMMs as one
 * grouped GEMM (cuBLASLt's grouped GEMM, or a kernel of our own reading the counts on the
 * device, which also removes step 4's wait), and the gather, SwiGLU, biases and rounding
 * fused. */
#include "cuda_internal.h"
#include "errmsg.h"

#include <stdlib.h>
#include <string.h>

struct kvg_cu_moe {
    int E, K, EH, dim;
    int align;                   /* an expert's first slot is a multiple of this */
    int two_inputs;              /* some layer's gate and up differ in type (F16 vs BF16):
                                    the input is rounded into xu too */
    int cap_rows;                /* rows the buffers hold */
    size_t cap_slots;            /* cap_rows * K + E * (align - 1) */
    float *logits;               /* [cap_rows][E] */
    int32_t *sel;                /* [cap_rows][K] */
    float *wt;                   /* [cap_rows][K] */
    int32_t *pos;                /* [cap_rows][K] */
    int32_t *meta;               /* [2E + 1] counts, first slots, slots used */
    int32_t *slot_row;           /* [cap_slots] */
    void *xg, *xu;               /* [cap_slots][dim] 2-byte: the input in gate's, up's type
                                    (xu only with two_inputs) */
    float *g, *u;                /* [cap_slots][EH] */
    void *gl;                    /* [cap_slots][EH] 2-byte: g in down's type */
    float *y;                    /* [cap_slots][dim] */
    int32_t *h_meta;             /* pinned host copy of meta */
};

static int gcd(int a, int b)
{
    while (b) {
        int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int kvg_cu_moe_init(kvg_cuda *c, char *err, size_t err_len)
{
    const kvg_model_config *cfg = &c->m->cfg;
    kvg_cu_moe *mo;
    cudaError_t e;
    if (cfg->n_experts <= 0)
        return 0;
    mo = calloc(1, sizeof *mo);
    if (!mo) {
        kvg_set_err(err, err_len, "cuda: out of memory");
        return -1;
    }
    c->moe = mo;
    mo->E = cfg->n_experts;
    mo->K = cfg->n_experts_used;
    mo->EH = cfg->expert_hidden_dim;
    mo->dim = cfg->dim;
    /* Slot rows are 2 dim or 2 EH bytes (BF16/F16; the F32 buffers twice that): aligning
       each expert's first slot to `align` slots puts all its rows at 256 bytes, the
       alignment cuBLASLt's algorithms are chosen for. 1 for every real model. */
    mo->align = 256 / gcd(256, 2 * gcd(mo->dim, mo->EH));
    for (int l = 0; l < cfg->n_layers; l++) {
        const kvg_cu_weight *g = kvg_cu_weight_of(c, c->m->layers[l].moe_gate[0].data);
        const kvg_cu_weight *u = kvg_cu_weight_of(c, c->m->layers[l].moe_up[0].data);
        if (!g || !u) {
            kvg_set_err(err, err_len, "cuda: layer %d's experts were not uploaded", l);
            c->failed = 0;
            c->err[0] = 0;
            return -1;
        }
        mo->two_inputs |= g->dt != u->dt;
    }
    e = cudaMallocHost((void **)&mo->h_meta, (2 * (size_t)mo->E + 1) * sizeof(int32_t));
    if (e != cudaSuccess) {
        char what[200];
        mo->h_meta = NULL;
        kvg_cu_err_text(e, what, sizeof what);
        kvg_set_err(err, err_len, "cuda: pinned buffer for the MoE counts: %s", what);
        return -1;
    }
    e = cudaMalloc((void **)&mo->meta, (2 * (size_t)mo->E + 1) * sizeof(int32_t));
    if (e != cudaSuccess) {
        char what[200];
        mo->meta = NULL;
        kvg_cu_err_text(e, what, sizeof what);
        kvg_set_err(err, err_len, "cuda: device buffer for the MoE counts: %s", what);
        return -1;
    }
    return 0;
}

static void free_bufs(kvg_cu_moe *mo)
{
    void *b[] = { mo->logits, mo->sel, mo->wt, mo->pos, mo->slot_row, mo->xg, mo->xu, mo->g, mo->u, mo->gl, mo->y };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        if (b[i])
            cudaFree(b[i]);
    mo->logits = mo->wt = mo->g = mo->u = mo->y = NULL;
    mo->sel = mo->pos = mo->slot_row = NULL;
    mo->xg = mo->xu = mo->gl = NULL;
    mo->cap_rows = 0;
    mo->cap_slots = 0;
}

void kvg_cu_moe_free(kvg_cuda *c)
{
    kvg_cu_moe *mo = c->moe;
    if (!mo)
        return;
    free_bufs(mo);
    if (mo->meta)
        cudaFree(mo->meta);
    if (mo->h_meta)
        cudaFreeHost(mo->h_meta);
    free(mo);
    c->moe = NULL;
}

/* Buffers for `rows` rows (grown, never shrunk). 0, or -1 recorded. */
static int reserve(kvg_cuda *c, kvg_cu_moe *mo, int rows)
{
    struct {
        void **p;
        size_t bytes;
        const char *what;
    } b[11];
    size_t r, rk, slots;
    int n = 0;
    cudaError_t e;
    if (rows <= mo->cap_rows)
        return 0;
    if (!kvg_cu_alloc_ok(c, "the MoE buffers"))
        return -1;
    /* Work still queued may use the old buffers (cudaFree would wait for it anyway). */
    e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess)
        return kvg_cu_fail(c, "cudaStreamSynchronize", e, "before growing the MoE buffers");
    free_bufs(mo);
    r = (size_t)rows;
    rk = r * (size_t)mo->K;
    slots = rk + (size_t)mo->E * (size_t)(mo->align - 1);
#define BUF(ptr, n_bytes, name) (b[n].p = (void **)&(ptr), b[n].bytes = (n_bytes), b[n].what = (name), n++)
    BUF(mo->logits, r * (size_t)mo->E * 4, "router logits");
    BUF(mo->sel, rk * 4, "chosen experts");
    BUF(mo->wt, rk * 4, "expert weights");
    BUF(mo->pos, rk * 4, "slots");
    BUF(mo->slot_row, slots * 4, "slot rows");
    BUF(mo->xg, slots * (size_t)mo->dim * 2, "expert inputs");
    if (mo->two_inputs)
        BUF(mo->xu, slots * (size_t)mo->dim * 2, "expert inputs");
    BUF(mo->g, slots * (size_t)mo->EH * 4, "expert gate products");
    BUF(mo->u, slots * (size_t)mo->EH * 4, "expert up products");
    BUF(mo->gl, slots * (size_t)mo->EH * 2, "expert activations");
    BUF(mo->y, slots * (size_t)mo->dim * 4, "expert outputs");
#undef BUF
    for (int i = 0; i < n; i++) {
        e = cudaMalloc(b[i].p, b[i].bytes);
        if (e != cudaSuccess) {
            *b[i].p = NULL;
            free_bufs(mo);
            return kvg_cu_fail(c, "cudaMalloc", e, "MoE %s for %d rows, %zu bytes", b[i].what, rows, b[i].bytes);
        }
        /* Padding slots are computed on (the SwiGLU runs over every slot) but never read:
           they start as zeros rather than whatever the memory held. */
        e = cudaMemsetAsync(*b[i].p, 0, b[i].bytes, c->stream);
        if (e != cudaSuccess) {
            free_bufs(mo);
            return kvg_cu_fail(c, "cudaMemsetAsync", e, "MoE %s, %zu bytes", b[i].what, b[i].bytes);
        }
    }
    mo->cap_rows = rows;
    mo->cap_slots = slots;
    return 0;
}

/* The device copies of expert e's three matrices in `layer`, and with gpt-oss's biases
 * (biased) theirs in b (else NULLs); -1 (recorded) if unknown. */
static int expert_weights(kvg_cuda *c, const kvg_layer_weights *L, int e, int biased, const kvg_cu_weight **w,
                          const kvg_cu_weight **b)
{
    const int EH = (int)L->moe_gate[e].rows, dim = (int)L->moe_down[e].rows;
    w[0] = kvg_cu_weight_of(c, L->moe_gate[e].data);
    w[1] = kvg_cu_weight_of(c, L->moe_up[e].data);
    w[2] = kvg_cu_weight_of(c, L->moe_down[e].data);
    b[0] = b[1] = b[2] = NULL;
    if (!w[0] || !w[1] || !w[2])
        return -1;
    if (!biased)
        return 0;
    b[0] = kvg_cu_weight_of(c, L->moe_gate_bias + (size_t)e * EH);
    b[1] = kvg_cu_weight_of(c, L->moe_up_bias + (size_t)e * EH);
    b[2] = kvg_cu_weight_of(c, L->moe_down_bias + (size_t)e * dim);
    return b[0] && b[1] && b[2] ? 0 : -1;
}

void kvg_cu_moe_ffn(kvg_cuda *c, int layer, const float *x, int rows, float *out)
{
    kvg_cu_moe *mo = c->moe;
    const kvg_model_config *cfg = &c->m->cfg;
    const kvg_layer_weights *L = &c->m->layers[layer];
    const int E = mo->E, K = mo->K, EH = mo->EH, dim = mo->dim;
    const int32_t *cnt = mo->h_meta, *first = mo->h_meta + E;
    const kvg_cu_weight *w[3], *b[3];
    const int biased = cfg->moe_biases;
    int slots, e0 = -1;
    cudaError_t err;

    if (rows <= 0 || reserve(c, mo, rows) != 0)
        return;
    /* 1-3: router, gating, grouping */
    c->op = "moe_router";
    kvg_cu_matmul(c, x, rows, dim, &L->moe_router, cfg->moe_biases ? L->moe_router_bias : NULL, mo->logits);
    if (c->failed)
        return;
    c->op = "moe";
    KVG_CU_CHECK(c, "launch kvg_k_moe_gate",
                 kvg_k_moe_gate(c->stream, mo->logits, rows, E, K,
                                cfg->moe_gating == KVG_MOE_TOPK_SOFTMAX ? KVG_K_MOE_TOPK_SOFTMAX : KVG_K_MOE_SOFTMAX,
                                cfg->moe_norm_topk, mo->sel, mo->wt),
                 "rows=%d experts=%d k=%d", rows, E, K);
    KVG_CU_CHECK(c, "launch kvg_k_moe_group",
                 kvg_k_moe_group(c->stream, mo->sel, rows * K, K, E, mo->align, mo->meta, mo->slot_row, mo->pos),
                 "pairs=%d experts=%d", rows * K, E);
    if (c->failed)
        return;
    /* 4: the counts to the host */
    err = cudaMemcpyAsync(mo->h_meta, mo->meta, (2 * (size_t)E + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                        c->stream);
    if (err != cudaSuccess) {
        kvg_cu_fail(c, "cudaMemcpyAsync", err, "the MoE counts to the host");
        return;
    }
    err = cudaStreamSynchronize(c->stream);
    if (err != cudaSuccess) {
        kvg_cu_fail(c, "cudaStreamSynchronize", err, "the MoE counts");
        return;
    }
    slots = mo->h_meta[2 * E];
    if (slots < 0 || (size_t)slots > mo->cap_slots) {
        kvg_cu_fail(c, "kvg_k_moe_group", cudaErrorIllegalAddress, "%d slots for %d rows (at most %zu)", slots, rows,
                    mo->cap_slots);
        return;
    }
    for (int e = 0; e < E && e0 < 0; e++)
        if (cnt[e] > 0)
            e0 = e;
    if (e0 < 0 || expert_weights(c, L, e0, biased, w, b) != 0)
        return;                  /* rows > 0 chose some expert; an unknown weight is recorded */
    /* 5: the inputs, in the type of the gate and of the up matrices (every expert of a
       stack has its stack's type) */
    c->op = "moe";
    KVG_CU_CHECK(c, "launch kvg_k_gather_lowp",
                 kvg_k_gather_lowp(c->stream, x, dim, mo->slot_row, slots, w[0]->dt, mo->xg),
                 "slots=%d dim=%d", slots, dim);
    if (w[1]->dt != w[0]->dt)
        KVG_CU_CHECK(c, "launch kvg_k_gather_lowp",
                     kvg_k_gather_lowp(c->stream, x, dim, mo->slot_row, slots, w[1]->dt, mo->xu),
                     "slots=%d dim=%d", slots, dim);
    /* 6: gate and up, expert by expert over its rows */
    for (int e = e0; e < E && !c->failed; e++) {
        size_t f = (size_t)first[e];
        if (cnt[e] <= 0 || expert_weights(c, L, e, biased, w, b) != 0)
            continue;
        c->op = "moe_gate";
        kvg_cu_gemm(c, (const unsigned char *)mo->xg + f * dim * 2, cnt[e], dim, w[0], EH, b[0], mo->g + f * EH);
        c->op = "moe_up";
        kvg_cu_gemm(c, (const unsigned char *)(w[1]->dt != w[0]->dt ? mo->xu : mo->xg) + f * dim * 2, cnt[e], dim,
                    w[1], EH, b[1], mo->u + f * EH);
    }
    /* 7: SwiGLU (gpt-oss: the clamped one) over every slot, rounded to down's type */
    if (c->failed)
        return;
    c->op = "moe";
    if (cfg->ffn_act == KVG_ACT_SWIGLU_OAI)
        KVG_CU_CHECK(c, "launch kvg_k_swiglu_oai", kvg_k_swiglu_oai(c->stream, mo->g, mo->u, (size_t)slots * EH),
                     "n=%zu", (size_t)slots * EH);
    else
        KVG_CU_CHECK(c, "launch kvg_k_swiglu", kvg_k_swiglu(c->stream, mo->g, mo->u, (size_t)slots * EH),
                     "n=%zu", (size_t)slots * EH);
    KVG_CU_CHECK(c, "launch kvg_k_to_lowp", kvg_k_to_lowp(c->stream, mo->g, (size_t)slots * EH, w[2]->dt, mo->gl),
                 "n=%zu", (size_t)slots * EH);
    /* 8: down */
    for (int e = e0; e < E && !c->failed; e++) {
        size_t f = (size_t)first[e];
        if (cnt[e] <= 0 || expert_weights(c, L, e, biased, w, b) != 0)
            continue;
        c->op = "moe_down";
        kvg_cu_gemm(c, (const unsigned char *)mo->gl + f * EH * 2, cnt[e], EH, w[2], dim, b[2], mo->y + f * dim);
    }
    /* 9: each row's K outputs in rank order */
    if (c->failed)
        return;
    c->op = "moe";
    KVG_CU_CHECK(c, "launch kvg_k_moe_combine", kvg_k_moe_combine(c->stream, mo->y, dim, mo->pos, mo->wt, rows, K, out),
                 "rows=%d dim=%d k=%d", rows, dim, K);
}
