/* The CPU backend's mixture-of-experts FFN (backend.h's moe), for one layer and R rows:
 *
 *   1. logits[R][E] = x moe_router^T (+ router bias)      (kvg_gemm, F32 out)
 *   2. each row on its own: gating into k (expert, weight) pairs, by rank
 *   3. the (row, rank) pairs grouped by expert, rows ascending within an expert
 *   4. each expert that some row chose, over its n_e rows gathered into [n_e][dim]:
 *        g = xe gate_e^T, u = xe up_e^T   [n_e][EH] (+ the expert's biases, gpt-oss)
 *        g = silu(g) * u, or gpt-oss's clamped SwiGLU (kvg_swiglu_oai)
 *        y[its slots] = g down_e^T        [n_e][dim] (+ its bias)
 *   5. out[r] = w[r][0] y[r,0] + w[r][1] y[r,1] + ...     (rank order, left to right)
 *
 * Batch invariance: every GEMM row depends only on its own input row (gemm.h), the
 * SwiGLU and the gating are element- and row-wise, and step 5 adds a row's k products in
 * one fixed order. So a row's output is the same whatever other rows share its experts,
 * however many rows the step has, and whichever thread ran what. Only the experts some
 * row chose are read: a decode step streams k experts of E per layer. */
#include "cpu_context.h"
#include "moe_cpu.h"
#include "cpu/attention_kernels.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* llama.cpp's floor under the sum of the top-k weights before they are divided by it:
 * 2^-14, the smallest normal F16. */
#define NORM_MIN_SUM 6.103515625e-5f

struct kvg_cpu_moe {
    int cap;                     /* rows the buffers hold */
    int E, K, EH, dim;           /* experts, experts per row, expert width, model width */
    float *logits;               /* [cap][E] router logits, then row-wise probabilities */
    unsigned char *taken;        /* [cap][E] the experts a row has chosen so far */
    int32_t *sel;                /* [cap][K] each row's experts, by rank */
    float *wt;                   /* [cap][K] their weights */
    int32_t *pos;                /* [cap][K] where (row, rank)'s expert output lies in y */
    int32_t *off;                /* [E + 1] expert e's slots are off[e] .. off[e + 1] - 1 */
    int32_t *slot_row;           /* [cap * K] the row of each slot */
    float *xe;                   /* [cap][dim] one expert's input rows, gathered */
    float *g, *u;                /* [cap][EH] its gate and up products */
    float *y;                    /* [cap * K][dim] every slot's expert output */
};

kvg_cpu_moe *kvg_cpu_moe_new(const kvg_model *m)
{
    const kvg_model_config *c = &m->cfg;
    kvg_cpu_moe *mo;
    if (c->n_experts <= 0)
        return NULL;
    mo = calloc(1, sizeof *mo);
    if (!mo)
        return NULL;
    mo->E = c->n_experts;
    mo->K = c->n_experts_used;
    mo->EH = c->expert_hidden_dim;
    mo->dim = c->dim;
    mo->off = malloc(((size_t)mo->E + 1) * sizeof *mo->off);
    if (!mo->off) {
        free(mo);
        return NULL;
    }
    return mo;
}

static void free_bufs(kvg_cpu_moe *mo)
{
    void *b[] = { mo->logits, mo->taken, mo->sel, mo->wt, mo->pos, mo->slot_row, mo->xe, mo->g, mo->u, mo->y };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        free(b[i]);
    mo->logits = mo->wt = mo->xe = mo->g = mo->u = mo->y = NULL;
    mo->sel = mo->pos = mo->slot_row = NULL;
    mo->taken = NULL;
    mo->cap = 0;
}

void kvg_cpu_moe_free(kvg_cpu_moe *mo)
{
    if (!mo)
        return;
    free_bufs(mo);
    free(mo->off);
    free(mo);
}

/* 64-byte aligned floats (GEMM operands load faster from there). */
static float *falloc(size_t n)
{
    void *p = NULL;
    return posix_memalign(&p, 64, (n ? n : 1) * sizeof(float)) == 0 ? p : NULL;
}

int kvg_cpu_moe_reserve(kvg_cpu_moe *mo, int rows)
{
    size_t r, rk;
    if (!mo || rows <= mo->cap)
        return 0;
    free_bufs(mo);
    r = (size_t)rows;
    rk = r * (size_t)mo->K;
    mo->logits = falloc(r * (size_t)mo->E);
    mo->taken = malloc(r * (size_t)mo->E);
    mo->sel = malloc(rk * sizeof *mo->sel);
    mo->wt = malloc(rk * sizeof *mo->wt);
    mo->pos = malloc(rk * sizeof *mo->pos);
    mo->slot_row = malloc(rk * sizeof *mo->slot_row);
    mo->xe = falloc(r * (size_t)mo->dim);
    mo->g = falloc(r * (size_t)mo->EH);
    mo->u = falloc(r * (size_t)mo->EH);
    mo->y = falloc(rk * (size_t)mo->dim);
    if (!mo->logits || !mo->taken || !mo->sel || !mo->wt || !mo->pos || !mo->slot_row || !mo->xe || !mo->g || !mo->u
        || !mo->y) {
        free_bufs(mo);
        return -1;
    }
    mo->cap = rows;
    return 0;
}

/* ---- gating ---- */

/* The index of the largest v[e] not yet taken (taken[e] != 0), the lower index on a tie.
 * A NaN compares false either way: the answer is still one fixed index (a row of NaNs
 * takes the lowest free ones), and the NaN reaches the output through the weights. */
static int argmax_free(const float *v, const unsigned char *taken, int E)
{
    int best = -1;
    for (int e = 0; e < E; e++)
        if (!taken[e] && (best < 0 || v[e] > v[best]))
            best = e;
    return best;
}

/* One row: its E logits (overwritten) into K experts and weights by rank. */
static void gate_row(const kvg_model_config *c, float *l, unsigned char *taken, int32_t *sel, float *wt)
{
    int E = c->n_experts, K = c->n_experts_used;
    memset(taken, 0, (size_t)E);
    if (c->moe_gating == KVG_MOE_SOFTMAX) {
        /* softmax over all E, then the top K probabilities (llama.cpp selects on the
           probabilities: two logits that round to one probability tie there) */
        float mx = l[0], sum = 0.0f;
        for (int e = 1; e < E; e++)
            mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++) {
            l[e] = expf(l[e] - mx);
            sum += l[e];
        }
        for (int e = 0; e < E; e++)
            l[e] /= sum;
        for (int j = 0; j < K; j++) {
            int b = argmax_free(l, taken, E);
            taken[b] = 1;
            sel[j] = b;
            wt[j] = l[b];
        }
    } else {
        /* the top K logits, then a softmax over those K (rank 0 holds their max) */
        float sum = 0.0f;
        for (int j = 0; j < K; j++) {
            int b = argmax_free(l, taken, E);
            taken[b] = 1;
            sel[j] = b;
            wt[j] = l[b];
        }
        float mx = wt[0];
        for (int j = 0; j < K; j++) {
            wt[j] = expf(wt[j] - mx);
            sum += wt[j];
        }
        for (int j = 0; j < K; j++)
            wt[j] /= sum;
    }
    if (c->moe_norm_topk) {
        float sum = 0.0f;
        for (int j = 0; j < K; j++)
            sum += wt[j];
        if (sum < NORM_MIN_SUM)
            sum = NORM_MIN_SUM;
        for (int j = 0; j < K; j++)
            wt[j] /= sum;
    }
}

typedef struct gate_job {
    const kvg_model_config *c;
    kvg_cpu_moe *mo;
} gate_job;

static void gate_range(void *arg, size_t b, size_t e)
{
    gate_job *j = arg;
    kvg_cpu_moe *mo = j->mo;
    for (size_t r = b; r < e; r++)
        gate_row(j->c, mo->logits + r * (size_t)mo->E, mo->taken + r * (size_t)mo->E,
                 mo->sel + r * (size_t)mo->K, mo->wt + r * (size_t)mo->K);
}

/* ---- the experts ---- */

/* Slots grouped by expert: expert e's are off[e] .. off[e + 1] - 1, rows ascending;
 * pos[r][j] is (row r, rank j)'s slot. */
static void group_rows(kvg_cpu_moe *mo, int rows)
{
    int E = mo->E, K = mo->K;
    memset(mo->off, 0, ((size_t)E + 1) * sizeof *mo->off);
    for (int i = 0; i < rows * K; i++)
        mo->off[mo->sel[i] + 1]++;
    for (int e = 0; e < E; e++)
        mo->off[e + 1] += mo->off[e];
    /* off[e] advances as slots are handed out, ending at the old off[e + 1]; shifted
       back after */
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < K; j++) {
            int32_t p = mo->off[mo->sel[r * K + j]]++;
            mo->slot_row[p] = r;
            mo->pos[r * K + j] = p;
        }
    for (int e = E; e > 0; e--)
        mo->off[e] = mo->off[e - 1];
    mo->off[0] = 0;
}

typedef struct swiglu_job {
    float *g;
    const float *u;
    kvg_swiglu_fn fn;            /* the SwiGLU or gpt-oss's clamped one, this CPU's kernel:
                                    every ISA's gives the same bits */
} swiglu_job;

static void swiglu_range(void *arg, size_t b, size_t e)
{
    swiglu_job *j = arg;
    j->fn(j->g + b, j->u + b, e - b);
}

/* Expert e over its n rows: slots off[e] .. of y. */
static void run_expert(kvg_cpu *c, const kvg_layer_weights *L, int e, const float *x)
{
    kvg_cpu_moe *mo = c->moe;
    int n = mo->off[e + 1] - mo->off[e], dim = mo->dim, EH = mo->EH;
    const int32_t *rows = mo->slot_row + mo->off[e];
    const kvg_tensor *gu[2] = { kvg_cpu_weights_get(c->weights, &L->moe_gate[e]),
                                kvg_cpu_weights_get(c->weights, &L->moe_up[e]) };
    const int biased = c->m->cfg.moe_biases;
    const float *gu_bias[2] = { biased ? L->moe_gate_bias + (size_t)e * EH : NULL,
                                biased ? L->moe_up_bias + (size_t)e * EH : NULL };
    float *gu_out[2] = { mo->g, mo->u };
    swiglu_job sj = { mo->g, mo->u,
                      c->m->cfg.ffn_act == KVG_ACT_SWIGLU_OAI ? kvg_cpu_kernels()->swiglu_oai
                                                              : kvg_cpu_kernels()->swiglu };
    int rc;

    for (int i = 0; i < n; i++)
        memcpy(mo->xe + (size_t)i * dim, x + (size_t)rows[i] * dim, (size_t)dim * sizeof(float));
    /* The model's shapes (the loader checked them), n <= the step's rows: kvg_gemm
       cannot refuse (as cpu_matmul). */
    rc = kvg_gemm_multi(c->tp, c->gemm_ws, mo->xe, n, dim, 2, gu, gu_bias, gu_out);
    assert(rc == 0);
    kvg_cpu_par(c, (size_t)n * EH, 4.0 * n * EH, swiglu_range, &sj);
    rc = kvg_gemm(c->tp, c->gemm_ws, mo->g, n, EH, kvg_cpu_weights_get(c->weights, &L->moe_down[e]),
                  biased ? L->moe_down_bias + (size_t)e * dim : NULL, mo->y + (size_t)mo->off[e] * dim);
    assert(rc == 0);
    (void)rc;
}

typedef struct combine_job {
    const kvg_cpu_moe *mo;
    float *out;
} combine_job;

/* out[r] = sum of w[r][j] y[pos[r][j]], j = 0, 1, ... in that order (llama.cpp adds the
 * weighted experts in rank order too). Plain C of the baseline target, as the backend's
 * other row-wise operations: one code path, whatever the CPU. */
static void combine_range(void *arg, size_t b, size_t e)
{
    combine_job *j = arg;
    const kvg_cpu_moe *mo = j->mo;
    int K = mo->K, dim = mo->dim;
    for (size_t r = b; r < e; r++) {
        float *o = j->out + r * (size_t)dim;
        const float *wt = mo->wt + r * (size_t)K;
        const int32_t *pos = mo->pos + r * (size_t)K;
        const float *y0 = mo->y + (size_t)pos[0] * dim;
        for (int d = 0; d < dim; d++)
            o[d] = wt[0] * y0[d];
        for (int k = 1; k < K; k++) {
            const float *y = mo->y + (size_t)pos[k] * dim;
            float w = wt[k];
            for (int d = 0; d < dim; d++)
                o[d] += w * y[d];
        }
    }
}

void kvg_cpu_moe_ffn(kvg_cpu *c, int layer, const float *x, int rows, float *out)
{
    kvg_cpu_moe *mo = c->moe;
    const kvg_model_config *cf = &c->m->cfg;
    const kvg_layer_weights *L = &c->m->layers[layer];
    gate_job gj = { cf, mo };
    combine_job cj = { mo, out };
    int rc;

    /* begin_step reserved the step's rows; forward.c passes at most those. */
    assert(mo && rows <= mo->cap && rows <= c->n_rows);
    rc = kvg_gemm(c->tp, c->gemm_ws, x, rows, mo->dim, kvg_cpu_weights_get(c->weights, &L->moe_router),
                  L->moe_router_bias, mo->logits);
    assert(rc == 0);
    (void)rc;
    kvg_cpu_par(c, (size_t)rows, 20.0 * rows * mo->E, gate_range, &gj);
    group_rows(mo, rows);
    for (int e = 0; e < mo->E; e++)
        if (mo->off[e + 1] > mo->off[e])
            run_expert(c, L, e, x);
    kvg_cpu_par(c, (size_t)rows, 2.0 * rows * mo->K * mo->dim, combine_range, &cj);
}
