/* Mixture-of-experts layers (qwen3moe) on the CUDA backend, emulated (kernels/emu/), as
 * every t/unit/cuda_*.c, against the CPU backend on tiny models written as llama.cpp's
 * converter lays them out (moe_model.h):
 *   - the weights: the router kept F32, each expert's matrices a slice of its stack,
 *     uploaded once and back to back in expert order;
 *   - the moe operation alone on 8 rows against the CPU backend's, for both gatings with
 *     and without the renormalization, router ties (an all-zero router, identical router
 *     rows), expert widths that need the slots padded (align 4 and 16) and none;
 *     each row alone, among 8 and in reverse order: bit for bit;
 *   - the forward pass: logits within t/unit/cuda_backend.c's tolerance of the CPU's (the
 *     CUDA backend rounds GEMM inputs and K/V to BF16), F32 and Q8_0 experts (dequantized
 *     to BF16 at upload); bit-identical logits for whole vs chunked prefill and 8
 *     sequences alone vs in one step (prefill and decode);
 *   - an injected failure inside the MoE fails one step with the call named, the next
 *     step has the logits of a run that never failed; no device byte left after
 *     destroy;
 *   - gpt-oss's MoE on the same model made gpt-oss-like (oai_make: router and expert
 *     biases, top-k then softmax without renormalization, the clamped SwiGLU with gate and
 *     up biases wide enough that both clamps engage, sinks and an o bias in attention):
 *     the op and the forward pass, the same checks;
 *   - MXFP4 experts (gpt-oss's): dequantized to BF16 at upload, as every quantized
 *     matrix, then the same checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "backend.h"
#include "backend_testing.h"
#include "cuda/cuda_internal.h"
#include "forward.h"
#include "kv_cache.h"
#include "kvg_cuda_api.h"
#include "model.h"
#include "moe_model.h"

/* t/unit/cuda_backend.c's bound: a logit within this share of the largest logit. */
#define REL_TOL 0.03

typedef struct rig {
    const kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
} rig;

static int rig_new(rig *r, const kvg_model *m, const char *backend)
{
    char err[512];
    kvg_kv_geom g;
    kvg_backend_opts o;
    memset(r, 0, sizeof *r);
    memset(&o, 0, sizeof o);
    o.n_threads = 1;
    o.batch_invariant = 1;
    r->m = m;
    r->be = kvg_backend_new_opts(backend, m, &o, err, sizeof err);
    kvg_forward_kv_geom(m, 16, &g);
    r->kv = r->be ? kvg_backend_kv_pool_new(r->be, &g, 256, err, sizeof err) : NULL;
    r->fw = r->kv ? kvg_forward_new(m, r->be, r->kv, err, sizeof err) : NULL;
    if (!r->fw)
        diag("rig %s: %s", backend, err);
    return r->fw ? 0 : -1;
}

static void rig_free(rig *r)
{
    kvg_forward_free(r->fw);
    kvg_kv_pool_free(r->kv);
    kvg_backend_free(r->be);
}

/* ---- the weights ---- */

static void test_weights(const kvg_model *m, const char *name)
{
    const kvg_model_config *c = &m->cfg;
    size_t eb = (size_t)c->expert_hidden_dim * c->dim * 2, experts = 0;
    int back_to_back = 1, f32_router = 1;
    rig g;
    kvg_cuda *cu;
    if (!ok(rig_new(&g, m, "cuda") == 0, "%s: the CUDA backend takes a qwen3moe model", name))
        return;
    cu = g.be->ctx;
    for (int l = 0; l < c->n_layers; l++) {
        const kvg_layer_weights *L = &m->layers[l];
        const kvg_cu_weight *r = kvg_cu_weight_of(cu, L->moe_router.data);
        const kvg_cu_weight *g0 = kvg_cu_weight_of(cu, L->moe_gate[0].data);
        const kvg_cu_weight *d0 = kvg_cu_weight_of(cu, L->moe_down[0].data);
        f32_router &= r && r->dt == KVG_KT_F32;
        for (int e = 0; e < c->n_experts; e++) {
            const kvg_cu_weight *ge = kvg_cu_weight_of(cu, L->moe_gate[e].data);
            const kvg_cu_weight *de = kvg_cu_weight_of(cu, L->moe_down[e].data);
            back_to_back &= g0 && d0 && ge && de && (char *)ge->dev == (char *)g0->dev + e * eb
                            && (char *)de->dev == (char *)d0->dev + e * eb && ge->dt == KVG_KT_BF16;
        }
        experts += 3 * (size_t)c->n_experts * eb;
    }
    ok(f32_router, "%s: the routers stay F32 on the device", name);
    ok(back_to_back, "%s: expert e's matrices at expert 0's + e x its size (each stack once, in expert order)", name);
    /* a second copy of the stacks would make it at least twice the experts */
    ok(cu->arena_bytes > experts && cu->arena_bytes < 2 * experts,
       "%s: the arena (%zu bytes) holds the experts (%zu bytes) once", name, cu->arena_bytes, experts);
    rig_free(&g);
}

/* ---- the moe operation alone ---- */

/* A step of n rows (one sequence at positions 0..n-1): the backend's step for moe. */
static int begin(kvg_backend *be, int n, char *err, size_t err_len)
{
    static int32_t tok[128], pos[128], seq[128], blocks[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    int32_t nb = 8;
    const int32_t *tables[1] = { blocks };
    kvg_step st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < n; i++)
        pos[i] = i;
    st.n_rows = n;
    st.tokens = tok;
    st.pos = pos;
    st.row_seq = seq;
    st.n_seqs = 1;
    st.block_tokens = 16;
    st.block_tables = tables;
    st.n_blocks = &nb;
    return be->ops->begin_step(be, &st, err, err_len);
}

/* out[n][dim] = the CUDA backend's moe of layer l on x[n][dim] (host memory). */
static int cuda_moe(rig *g, int l, const float *x, int n, float *out)
{
    int D = g->m->cfg.dim;
    char err[512];
    float *dx, *dout;
    if (begin(g->be, n, err, sizeof err) != 0) {
        diag("begin_step: %s", err);
        return -1;
    }
    dx = g->be->ops->alloc(g->be, (size_t)n * D);
    dout = g->be->ops->alloc(g->be, (size_t)n * D);
    cudaMemcpy(dx, x, (size_t)n * D * sizeof(float), cudaMemcpyHostToDevice);
    g->be->ops->moe(g->be, l, dx, n, dout);
    g->be->ops->read(g->be, dout, out, (size_t)n * D);
    int rc = g->be->ops->end_step(g->be, err, sizeof err);
    if (rc != 0)
        diag("end_step: %s", err);
    g->be->ops->free(g->be, dx);
    g->be->ops->free(g->be, dout);
    return rc;
}

static float *rand_rows(int n, int dim, uint32_t seed)
{
    float *x = malloc((size_t)n * dim * sizeof *x);
    moe_rs = seed;
    for (int i = 0; i < n * dim; i++)
        x[i] = 1.5f * moe_unif();
    return x;
}

/* CUDA vs CPU on 8 rows of every layer (the largest difference as a share of the largest
 * CPU output), and the CUDA rows alone / among 8 / reversed, bit for bit. */
static void test_op(kvg_model *m, const char *name)
{
    int D = m->cfg.dim, n = 8;
    float *x = rand_rows(n, D, 99), *xr = malloc((size_t)n * D * sizeof *xr);
    float *cpu = malloc((size_t)n * D * sizeof *cpu), *all = malloc((size_t)n * D * sizeof *all);
    float *one = malloc((size_t)D * sizeof *one), *rev = malloc((size_t)n * D * sizeof *rev);
    char err[512];
    kvg_backend *cb = kvg_backend_cpu_new(m, 1, err, sizeof err);
    rig g;
    if (!ok(cb && rig_new(&g, m, "cuda") == 0, "%s: backends", name)) {
        kvg_backend_free(cb);
        goto out;
    }
    for (int r = 0; r < n; r++)
        memcpy(xr + (size_t)r * D, x + (size_t)(n - 1 - r) * D, (size_t)D * sizeof *xr);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        double maxd = 0, maxv = 0;
        int same = 1;
        if (begin(cb, n, err, sizeof err) != 0 || cuda_moe(&g, l, x, n, all) != 0) {
            ok(0, "%s: layer %d ran", name, l);
            continue;
        }
        cb->ops->moe(cb, l, x, n, cpu);
        for (int i = 0; i < n * D; i++) {
            double d = fabs((double)cpu[i] - (double)all[i]);
            maxd = d > maxd ? d : maxd;
            maxv = fabs((double)cpu[i]) > maxv ? fabs((double)cpu[i]) : maxv;
        }
        ok(maxd <= 0.02 * maxv, "%s: layer %d: 8 rows within 0.02 of the largest output of the CPU's (%.5f)", name, l,
           maxv > 0 ? maxd / maxv : maxd);
        for (int r = 0; r < n; r++)
            same &= cuda_moe(&g, l, x + (size_t)r * D, 1, one) == 0
                    && memcmp(one, all + (size_t)r * D, (size_t)D * sizeof *one) == 0;
        same &= cuda_moe(&g, l, xr, n, rev) == 0;
        for (int r = 0; r < n; r++)
            same &= memcmp(rev + (size_t)r * D, all + (size_t)(n - 1 - r) * D, (size_t)D * sizeof *rev) == 0;
        ok(same, "%s: layer %d: each row alone, among 8 and in reverse order: the same bits", name, l);
    }
    rig_free(&g);
    kvg_backend_free(cb);
out:
    free(x), free(xr), free(cpu), free(all), free(one), free(rev);
}

/* ---- gpt-oss ---- */

/* What gpt-oss adds, on a loaded qwen3moe model m (its vectors in *bufs, freed by
 * oai_free): the router's bias (+-1), each expert's gate and up biases (+-8, so that some
 * gate products pass the clamp at 7 and some up products leave [-7, 7]) and down bias
 * (+-0.5), the clamped SwiGLU, top-k then softmax without renormalization; in attention,
 * sinks (0.5 +- 1) and an o bias (+-0.5). */
static float *oai_vec(float **bufs, int *nb, size_t n, float base, float spread, uint64_t *st)
{
    float *v = malloc(n * sizeof *v);
    if (!v)
        abort();
    for (size_t i = 0; i < n; i++) {
        *st = *st * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = base + spread * (float)((double)(*st >> 40) / 8388608.0 - 1.0);
    }
    bufs[(*nb)++] = v;
    return v;
}

#define OAI_MAX_BUFS 64

static void oai_make(kvg_model *m, float **bufs, int *nb)
{
    kvg_model_config *c = &m->cfg;
    uint64_t st = 0x6f61692d6d6f65ull;
    const size_t E = (size_t)c->n_experts, EH = (size_t)c->expert_hidden_dim, D = (size_t)c->dim;
    *nb = 0;
    c->moe_biases = 1;
    c->ffn_act = KVG_ACT_SWIGLU_OAI;
    c->moe_gating = KVG_MOE_TOPK_SOFTMAX;
    c->moe_norm_topk = 0;
    c->attn_sinks = 1;
    c->has_o_bias = 1;
    for (int l = 0; l < c->n_layers; l++) {
        kvg_layer_weights *L = &m->layers[l];
        L->moe_router_bias = oai_vec(bufs, nb, E, 0.0f, 1.0f, &st);
        L->moe_gate_bias = oai_vec(bufs, nb, E * EH, 0.0f, 8.0f, &st);
        L->moe_up_bias = oai_vec(bufs, nb, E * EH, 0.0f, 8.0f, &st);
        L->moe_down_bias = oai_vec(bufs, nb, E * D, 0.0f, 0.5f, &st);
        L->attn_sinks = oai_vec(bufs, nb, (size_t)c->n_heads, 0.5f, 1.0f, &st);
        L->bo = oai_vec(bufs, nb, D, 0.0f, 0.5f, &st);
    }
}

static void oai_free(float **bufs, int nb)
{
    for (int i = 0; i < nb; i++)
        free(bufs[i]);
}

/* ---- the forward pass ---- */

#define N_SEQ 8
#define N_PROMPT 21
#define N_DEC 4

static int32_t tok_of(int i, int t, int V)
{
    return t == 0 ? 1 : (int32_t)(3 + (i * 131 + t * 37 + t * t * 11) % (V - 3));
}

/* Sequences first .. first + n - 1: the prompts in chunks of `chunk` (0: whole), each
 * sequence alone or all in one step per chunk (batch), then N_DEC decode steps (fixed
 * tokens). logits[i][(N_DEC + 1) * V]. */
static int run(rig *r, int first, int n, int chunk, int batch, float *logits)
{
    int V = r->m->cfg.vocab_size, rc = 0;
    kvg_kv_seq seqs[N_SEQ];
    int32_t toks[N_SEQ][N_PROMPT + N_DEC];
    char err[512];
    for (int i = 0; i < n; i++) {
        kvg_kv_seq_init(&seqs[i]);
        for (int t = 0; t < N_PROMPT + N_DEC; t++)
            toks[i][t] = tok_of(first + i, t, V);
    }
    for (int fed = 0; fed < N_PROMPT && rc == 0;) {
        int c = chunk ? chunk : N_PROMPT;
        kvg_fwd_seq b[N_SEQ];
        if (c > N_PROMPT - fed)
            c = N_PROMPT - fed;
        for (int i = 0; i < n; i++)
            b[i] = (kvg_fwd_seq){ &seqs[i], toks[i] + fed, c,
                                  fed + c == N_PROMPT ? logits + (size_t)i * (N_DEC + 1) * V : NULL };
        if (batch)
            rc = kvg_forward_step(r->fw, b, n, err, sizeof err);
        for (int i = 0; i < n && !batch && rc == 0; i++)
            rc = kvg_forward_step(r->fw, &b[i], 1, err, sizeof err);
        fed += c;
    }
    for (int d = 0; d < N_DEC && rc == 0; d++) {
        kvg_fwd_seq b[N_SEQ];
        for (int i = 0; i < n; i++)
            b[i] = (kvg_fwd_seq){ &seqs[i], toks[i] + N_PROMPT + d, 1,
                                  logits + ((size_t)i * (N_DEC + 1) + d + 1) * V };
        if (batch)
            rc = kvg_forward_step(r->fw, b, n, err, sizeof err);
        for (int i = 0; i < n && !batch && rc == 0; i++)
            rc = kvg_forward_step(r->fw, &b[i], 1, err, sizeof err);
    }
    if (rc != 0)
        diag("run: %s", err);
    for (int i = 0; i < n; i++)
        kvg_kv_seq_release(r->kv, &seqs[i]);
    return rc;
}

/* CUDA vs CPU (every logit of the 8 sequences' prompts and decode steps, against the
 * largest), then the CUDA backend's invariance. */
static void test_forward(const kvg_model *m, const char *name)
{
    int V = m->cfg.vocab_size;
    size_t per = (size_t)(N_DEC + 1) * V, all = N_SEQ * per;
    float *cpu = calloc(all, sizeof(float)), *base = calloc(all, sizeof(float)), *other = calloc(all, sizeof(float));
    double maxd = 0, maxl = 0;
    rig c, g;
    if (!ok(rig_new(&c, m, "cpu") == 0 && rig_new(&g, m, "cuda") == 0, "%s: rigs", name))
        goto out;
    ok(run(&c, 0, N_SEQ, 0, 0, cpu) == 0 && run(&g, 0, N_SEQ, 0, 0, base) == 0,
       "%s: 8 sequences, prefill and decode, on both backends", name);
    for (size_t i = 0; i < all; i++) {
        double d = fabs((double)cpu[i] - (double)base[i]);
        maxd = d > maxd ? d : maxd;
        maxl = fabs((double)cpu[i]) > maxl ? fabs((double)cpu[i]) : maxl;
    }
    diag("%s: max |logit cuda - cpu| = %.5f, largest |logit| %.3f: %.4f of it", name, maxd, maxl,
         maxd / (maxl > 1 ? maxl : 1));
    ok(maxd <= REL_TOL * (maxl > 1 ? maxl : 1), "%s: logits within %g of the largest logit of the CPU's", name,
       REL_TOL);
    ok(run(&g, 0, N_SEQ, 1, 0, other) == 0 && memcmp(base, other, all * sizeof(float)) == 0,
       "%s: prefill a token at a time: bit-identical logits", name);
    ok(run(&g, 0, N_SEQ, 7, 0, other) == 0 && memcmp(base, other, all * sizeof(float)) == 0,
       "%s: prefill in chunks of 7: bit-identical logits", name);
    ok(run(&g, 0, N_SEQ, 0, 1, other) == 0 && memcmp(base, other, all * sizeof(float)) == 0,
       "%s: 8 sequences in one step (prefill and decode): bit-identical logits", name);
    ok(run(&g, 0, N_SEQ, 5, 1, other) == 0 && memcmp(base, other, all * sizeof(float)) == 0,
       "%s: 8 sequences batched, prefill chunks of 5: bit-identical logits", name);
    ok(run(&g, 3, 1, 3, 0, other) == 0 && memcmp(base + 3 * per, other, per * sizeof(float)) == 0,
       "%s: one sequence alone vs in a batch of 8: bit-identical logits", name);
    rig_free(&c);
    rig_free(&g);
out:
    free(cpu);
    free(base);
    free(other);
}

/* One injected failure inside the MoE fails the step, naming the call; the next step
 * works, with the logits of a run that never failed. */
static void test_faults(const kvg_model *m)
{
    static const struct {
        const char *call;
        int nth, error;
        const char *want;
    } f[] = {
        /* the step's description is copy 1, layer 0's MoE counts copy 2 */
        { "cudaMemcpyAsync", 2, cudaErrorInvalidValue, "MoE counts" },
        /* q, k, v, wo, router: the 6th GEMM is layer 0's first expert's gate */
        { "cublasLtMatmul", 6, CUBLAS_STATUS_EXECUTION_FAILED, "moe_gate" },
        /* begin_step waits for no stream (its double buffer's event): the first is the counts' */
        { "cudaStreamSynchronize", 1, cudaErrorInvalidResourceHandle, "MoE counts" },
    };
    int V = m->cfg.vocab_size;
    int32_t p[9];
    float *ref = malloc((size_t)V * sizeof(float)), *l = malloc((size_t)V * sizeof(float));
    char err[512];
    rig g;
    for (int i = 0; i < 9; i++)
        p[i] = tok_of(2, i, V);
    if (!ok(rig_new(&g, m, "cuda") == 0, "faults: rig"))
        goto out;
    {
        kvg_kv_seq s;
        kvg_fwd_seq b;
        kvg_kv_seq_init(&s);
        b = (kvg_fwd_seq){ &s, p, 9, ref };
        ok(kvg_forward_step(g.fw, &b, 1, err, sizeof err) == 0, "faults: reference run");
        kvg_kv_seq_release(g.kv, &s);
    }
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        kvg_kv_seq s;
        kvg_fwd_seq b;
        err[0] = 0;
        kvg_kv_seq_init(&s);
        b = (kvg_fwd_seq){ &s, p, 9, l };
        kvg_emu_fail(f[i].call, f[i].nth, f[i].error);
        ok(kvg_forward_step(g.fw, &b, 1, err, sizeof err) == -1 && strstr(err, f[i].call) && strstr(err, f[i].want)
           && strstr(err, "layer 0"), "injected %s failure fails the step (%s)", f[i].call, err);
        ok(kvg_forward_step(g.fw, &b, 1, err, sizeof err) == 0 && memcmp(l, ref, (size_t)V * sizeof(float)) == 0,
           "the next step works, same logits (%s)", f[i].call);
        kvg_kv_seq_release(g.kv, &s);
    }
    rig_free(&g);
out:
    kvg_emu_reset();
    free(ref);
    free(l);
}

int main(void)
{
    /* dim, heads, kv heads, head_dim, layers, E, K, EH, vocab, ctx, experts' dtypes,
       feed_forward_length, router ties, bad stack, seed */
    moe_spec base = { 64, 4, 2, 16, 2, 8, 2, 32, 300, 256, KVG_DT_F32, KVG_DT_F32, 1, 0, 0, 3 };
    moe_spec odd = { 48, 3, 1, 16, 2, 6, 3, 24, 300, 256, KVG_DT_F32, KVG_DT_F32, 1, 0, 0, 5 };
    moe_spec wide = { 128, 4, 2, 32, 2, 8, 2, 128, 300, 256, KVG_DT_F32, KVG_DT_F32, 1, 0, 0, 11 };
    moe_spec ties = base, q8 = base;
    char err[512] = "";
    kvg_model *m;

    ok(kvg_backend_cuda_built(), "the emulated CUDA backend is linked");
    ties.router_ties = 1;
    ties.seed = 4;
    q8.exp_dt = KVG_DT_Q8_0;
    q8.down_dt = KVG_DT_Q8_0;
    q8.seed = 6;

    m = moe_load(&base, "cuda", err, sizeof err);
    if (!ok(m != NULL, "a qwen3moe model loads")) {
        diag("%s", err);
        return done_testing();
    }
    test_weights(m, "F32 experts");
    /* align 4 (dim 64, width 32): padding slots between the experts */
    test_op(m, "softmax, top-k, renormalized");
    m->cfg.moe_norm_topk = 0;
    test_op(m, "softmax, top-k");
    m->cfg.moe_gating = KVG_MOE_TOPK_SOFTMAX;
    test_op(m, "top-k, softmax");
    m->cfg.moe_norm_topk = 1;
    test_op(m, "top-k, softmax, renormalized");
    m->cfg.moe_gating = KVG_MOE_SOFTMAX;
    test_forward(m, "F32 experts");
    test_faults(m);
    kvg_model_free(m);

    m = moe_load(&ties, "ties", err, sizeof err);
    if (ok(m != NULL, "router ties: loads")) {
        /* layer 0's router is all zeros (every row takes experts 0 and 1, weights 1/2),
           layer 1's rows 2, 5 and 6 are one row */
        test_op(m, "router ties");
        kvg_model_free(m);
    }
    m = moe_load(&odd, "odd", err, sizeof err);
    if (ok(m != NULL, "dim 48, expert width 24, 6 experts, 3 used: loads")) {
        test_op(m, "align 16");
        test_forward(m, "align 16");
        kvg_model_free(m);
    }
    m = moe_load(&wide, "wide", err, sizeof err);
    if (ok(m != NULL, "dim 128, expert width 128: loads")) {
        test_op(m, "align 1");
        kvg_model_free(m);
    }
    m = moe_load(&q8, "q8", err, sizeof err);
    if (ok(m != NULL, "Q8_0 experts: loads")) {
        test_weights(m, "Q8_0 experts");
        test_op(m, "Q8_0 experts");
        test_forward(m, "Q8_0 experts");
        kvg_model_free(m);
    }
    {
        /* gpt-oss-like: base and the align-16 shape, F32 and Q8_0 experts */
        const moe_spec *specs[3] = { &base, &odd, &q8 };
        static const char *const names[3] = { "gpt-oss-like", "gpt-oss-like align 16", "gpt-oss-like Q8_0" };
        for (int i = 0; i < 3; i++) {
            float *bufs[OAI_MAX_BUFS];
            int nb = 0;
            m = moe_load(specs[i], "oai", err, sizeof err);
            if (!ok(m != NULL && m->cfg.n_layers * 6 <= OAI_MAX_BUFS, "%s: loads", names[i]))
                continue;
            oai_make(m, bufs, &nb);
            test_op(m, names[i]);
            test_forward(m, names[i]);
            kvg_model_free(m);
            oai_free(bufs, nb);
        }
    }
    {
        /* MXFP4 experts (gpt-oss's released format): dequantized to BF16 at upload as
           every quantized matrix (exactly: an E2M1 code times a power of two has 3
           significant bits), then the same GEMMs. */
        moe_spec mxs = base;
        mxs.exp_dt = mxs.down_dt = KVG_DT_MXFP4;
        mxs.seed = 9;
        m = moe_load(&mxs, "cuda-mx", err, sizeof err);
        if (ok(m != NULL, "MXFP4 experts: loads")) {
            test_weights(m, "MXFP4 experts");
            test_op(m, "MXFP4 experts");
            test_forward(m, "MXFP4 experts");
            kvg_model_free(m);
        } else {
            diag("%s", err);
        }
    }
    is_int(kvg_emu_bytes_in_use(), 0, "every device byte freed");
    return done_testing();
}
