/* Mixture-of-experts layers (GGUF "qwen3moe") on the CPU backend. Tiny models are
 * written here as llama.cpp's converter lays them out (router ffn_gate_inp [E][dim],
 * experts stacked in 3-D ffn_{gate,up,down}_exps) and then:
 *   - they load, with the hyperparameters and each expert a row slice of its stack;
 *     bad stacks are refused naming the tensor;
 *   - the backend's moe operation equals a naive reference written here (plain loops,
 *     double sums) for F32 experts tightly, for Q8_0 / Q4_K / Q6_K / MXFP4 experts (the
 *     int8 path rounds activations) loosely, with the same experts chosen (MXFP4, as
 *     gpt-oss stores its experts: widths of 5 and 3 blocks, the int8 layout's blocks in
 *     a four and a partial one);
 *   - ties in the router go to the lower expert index (an all-zero router, and three
 *     identical router rows);
 *   - both gatings (softmax then top-k; top-k then softmax) with and without the
 *     renormalization of the k weights;
 *   - a row reads only its experts: the others' prepared (int8) copies poisoned, the
 *     same bits;
 *   - a row's output is bit-identical alone and among 8 rows, and the forward pass's
 *     logits are bit-identical for whole vs chunked prefill, batch 1 vs 8, 1 vs 2
 *     threads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"
#include "backend.h"
#include "cpu/cpu_context.h"
#include "cpu/gemm_int8.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "moe_model.h"

/* ---- the reference: plain loops, double sums ---- */

static double dot_row(const kvg_tensor *t, int64_t r, const double *x, float *buf)
{
    double s = 0;
    kvg_tensor_row_f32(t, r, buf);
    for (int64_t k = 0; k < t->cols; k++)
        s += (double)buf[k] * x[k];
    return s;
}

/* The experts row x chooses (sel) and out = its MoE output, for layer l; with force,
 * those experts instead of the top k (their weights from the same gating). */
static void ref_moe(const kvg_model *m, int l, const float *xf, const int *force, int *sel, double *wsel,
                    double *out)
{
    const kvg_model_config *c = &m->cfg;
    const kvg_layer_weights *L = &m->layers[l];
    int E = c->n_experts, K = c->n_experts_used, D = c->dim, EH = c->expert_hidden_dim;
    double *x = malloc((size_t)D * sizeof *x), *lg = malloc((size_t)E * sizeof *lg), *p = malloc((size_t)E * sizeof *p);
    double *h = malloc((size_t)EH * sizeof *h);
    float *buf = malloc((size_t)(D > EH ? D : EH) * sizeof *buf);
    char *taken = calloc((size_t)E, 1);
    for (int d = 0; d < D; d++)
        x[d] = xf[d];
    for (int e = 0; e < E; e++)
        lg[e] = dot_row(&L->moe_router, e, x, buf);
    if (c->moe_gating == KVG_MOE_SOFTMAX) {
        double mx = lg[0], sum = 0;
        for (int e = 0; e < E; e++)
            mx = lg[e] > mx ? lg[e] : mx;
        for (int e = 0; e < E; e++)
            sum += p[e] = exp(lg[e] - mx);
        for (int e = 0; e < E; e++)
            p[e] /= sum;
    } else {
        for (int e = 0; e < E; e++)
            p[e] = lg[e];
    }
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best]))
                best = e;
        if (force)
            best = force[j];
        taken[best] = 1;
        sel[j] = best;
        wsel[j] = p[best];
    }
    if (c->moe_gating == KVG_MOE_TOPK_SOFTMAX) {
        double sum = 0, mx = wsel[0];
        for (int j = 0; j < K; j++)
            sum += wsel[j] = exp(wsel[j] - mx);
        for (int j = 0; j < K; j++)
            wsel[j] /= sum;
    }
    if (c->moe_norm_topk) {
        double sum = 0;
        for (int j = 0; j < K; j++)
            sum += wsel[j];
        for (int j = 0; j < K; j++)
            wsel[j] /= sum;
    }
    for (int d = 0; d < D; d++)
        out[d] = 0;
    for (int j = 0; j < K; j++) {
        int e = sel[j];
        for (int i = 0; i < EH; i++) {
            double g = dot_row(&L->moe_gate[e], i, x, buf), u = dot_row(&L->moe_up[e], i, x, buf);
            h[i] = g / (1 + exp(-g)) * u;
        }
        for (int d = 0; d < D; d++)
            out[d] += wsel[j] * dot_row(&L->moe_down[e], d, h, buf);
    }
    free(x), free(lg), free(p), free(h), free(buf), free(taken);
}

/* ---- the backend's moe operation on its own ---- */

/* A step of n rows (one sequence, positions 0..n-1): the backend then holds scratch for
 * n rows. */
static int begin(kvg_backend *be, int n, char *err, size_t err_len)
{
    int32_t tok[64] = { 0 }, pos[64], seq[64] = { 0 }, blocks[8] = { 0, 1, 2, 3, 4, 5, 6, 7 }, nb = 8;
    const int32_t *tables[1] = { blocks };
    kvg_step st = { 0 };
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

/* n random rows of x (seeded), row i scaled like an RMS-normed activation. */
static float *rand_rows(int n, int dim, uint32_t seed)
{
    float *x = malloc((size_t)n * dim * sizeof *x);
    moe_rs = seed;
    for (int i = 0; i < n * dim; i++)
        x[i] = 1.5f * moe_unif();
    return x;
}

/* The backend's moe of layer l on n rows of x against the reference: the largest
 * difference relative to the largest reference value; *same_sel: every row chose the
 * reference's experts (as far as the output tells: checked by the caller through the
 * error). */
static double moe_vs_ref(kvg_backend *be, const kvg_model *m, int l, const float *x, int n, int *sel0)
{
    int D = m->cfg.dim, K = m->cfg.n_experts_used;
    float *out = malloc((size_t)n * D * sizeof *out);
    double *ref = malloc((size_t)D * sizeof *ref), wsel[64], maxd = 0, maxr = 0;
    int sel[64];
    be->ops->moe(be, l, x, n, out);
    for (int r = 0; r < n; r++) {
        ref_moe(m, l, x + (size_t)r * D, NULL, sel, wsel, ref);
        if (r == 0 && sel0)
            memcpy(sel0, sel, (size_t)K * sizeof *sel);
        for (int d = 0; d < D; d++) {
            double diff = fabs((double)out[(size_t)r * D + d] - ref[d]);
            maxd = diff > maxd ? diff : maxd;
            maxr = fabs(ref[d]) > maxr ? fabs(ref[d]) : maxr;
        }
    }
    free(out);
    free(ref);
    return maxr > 0 ? maxd / maxr : maxd;
}

/* Each of n rows through moe alone equals its value among all n: bit for bit. */
static int rows_invariant(kvg_backend *be, const kvg_model *m, int l, const float *x, int n)
{
    int D = m->cfg.dim, same = 1;
    float *all = malloc((size_t)n * D * sizeof *all), *one = malloc((size_t)D * sizeof *one);
    be->ops->moe(be, l, x, n, all);
    for (int r = 0; r < n; r++) {
        be->ops->moe(be, l, x + (size_t)r * D, 1, one);
        same &= memcmp(one, all + (size_t)r * D, (size_t)D * sizeof *one) == 0;
    }
    /* and in another order: the rows reversed */
    {
        float *xr = malloc((size_t)n * D * sizeof *xr), *rev = malloc((size_t)n * D * sizeof *rev);
        for (int r = 0; r < n; r++)
            memcpy(xr + (size_t)r * D, x + (size_t)(n - 1 - r) * D, (size_t)D * sizeof *xr);
        be->ops->moe(be, l, xr, n, rev);
        for (int r = 0; r < n; r++)
            same &= memcmp(rev + (size_t)r * D, all + (size_t)(n - 1 - r) * D, (size_t)D * sizeof *rev) == 0;
        free(xr);
        free(rev);
    }
    free(all);
    free(one);
    return same;
}

/* One row of quantized experts reads only the k experts it chose: every other expert of
 * the layer has its prepared int8 copy (the bytes the GEMMs stream) overwritten with
 * 0xff -- NaN scales -- and the row's output keeps its bits; poisoning a chosen one
 * makes it NaN. */
static void test_reads_chosen_only(kvg_backend *be, const kvg_model *m, int l, const float *x, const char *name)
{
    const kvg_cpu *c = be->ctx;
    const kvg_layer_weights *L = &m->layers[l];
    int D = m->cfg.dim, E = m->cfg.n_experts, K = m->cfg.n_experts_used, sel[64], chosen[64] = { 0 }, nan = 0;
    double w[64], *ref = malloc((size_t)D * sizeof *ref);
    float *before = malloc((size_t)D * sizeof *before), *after = malloc((size_t)D * sizeof *after);
    ref_moe(m, l, x, NULL, sel, w, ref);
    for (int j = 0; j < K; j++)
        chosen[sel[j]] = 1;
    be->ops->moe(be, l, x, 1, before);
    for (int e = 0; e <= E; e++) {
        /* e == E: then a chosen expert, sel[0] */
        int ex = e < E ? e : sel[0];
        const kvg_tensor *ts[3] = { &L->moe_gate[ex], &L->moe_up[ex], &L->moe_down[ex] };
        if (e < E && chosen[e])
            continue;
        if (e == E)
            be->ops->moe(be, l, x, 1, after);
        for (int i = 0; i < 3; i++) {
            const kvg_tensor *p = kvg_cpu_weights_get(c->weights, ts[i]);
            if (p == ts[i] || !kvg_int8_dt_packed(p->dtype)) {
                ok(0, "%s: expert %d has a prepared int8 copy", name, ex);
                goto out;
            }
            memset((void *)p->data, 0xff, kvg_int8_packed_bytes(p->dtype, (int)p->rows, (int)p->cols));
        }
    }
    ok(memcmp(before, after, (size_t)D * sizeof *after) == 0,
       "%s: layer %d: the %d experts a row did not choose poisoned: its output keeps its bits", name, l, E - K);
    be->ops->moe(be, l, x, 1, after);
    for (int d = 0; d < D; d++)
        nan |= isnan(after[d]);
    ok(nan, "%s: (poisoning a chosen expert makes the row NaN)", name);
out:
    free(ref);
    free(before);
    free(after);
}

/* ---- the forward pass ---- */

typedef struct rig {
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
} rig;

static int rig_new(rig *r, const kvg_model *m, int threads)
{
    char err[256];
    kvg_kv_geom g;
    memset(r, 0, sizeof *r);
    r->be = kvg_backend_cpu_new(m, threads, err, sizeof err);
    kvg_forward_kv_geom(m, 16, &g);
    r->kv = r->be ? kvg_kv_pool_new(&g, 256, err, sizeof err) : NULL;
    r->fw = r->kv ? kvg_forward_new(m, r->be, r->kv, err, sizeof err) : NULL;
    if (!r->fw)
        diag("rig: %s", err);
    return r->fw ? 0 : -1;
}

static void rig_free(rig *r)
{
    kvg_forward_free(r->fw);
    kvg_kv_pool_free(r->kv);
    kvg_backend_free(r->be);
}

#define N_SEQ 8
#define N_PROMPT 21
#define N_DEC 4

/* The tokens of sequence i. */
static int32_t tok_of(int i, int t, int V)
{
    return t == 0 ? 1 : (int32_t)(3 + (i * 131 + t * 37 + t * t * 11) % (V - 3));
}

/* Sequences `first` .. first + n - 1: the prompts in chunks of `chunk` (0: whole), each
 * sequence alone (batch 0) or all in one step per chunk (batch 1); then N_DEC decode
 * steps, all sequences in one step when batch. logits[i][(N_DEC + 1) * V]: after the
 * prompt and after each decoded token (the tokens fed are fixed, not sampled). */
static int run(rig *r, const kvg_model *m, int first, int n, int chunk, int batch, float *logits)
{
    int V = m->cfg.vocab_size, rc = 0;
    kvg_kv_seq seqs[N_SEQ];
    int32_t toks[N_SEQ][N_PROMPT + N_DEC];
    char err[256];
    memset(seqs, 0, sizeof seqs);
    for (int i = 0; i < n; i++)
        for (int t = 0; t < N_PROMPT + N_DEC; t++)
            toks[i][t] = tok_of(first + i, t, V);
    /* prompt */
    for (int fed = 0; fed < N_PROMPT && rc == 0;) {
        int c = chunk ? chunk : N_PROMPT;
        if (c > N_PROMPT - fed)
            c = N_PROMPT - fed;
        kvg_fwd_seq b[N_SEQ];
        for (int i = 0; i < n; i++) {
            b[i].kv = &seqs[i];
            b[i].tokens = toks[i] + fed;
            b[i].n_tokens = c;
            b[i].logits = fed + c == N_PROMPT ? logits + (size_t)i * (N_DEC + 1) * V : NULL;
        }
        if (batch)
            rc = kvg_forward_step(r->fw, b, n, err, sizeof err);
        for (int i = 0; i < n && !batch && rc == 0; i++)
            rc = kvg_forward_step(r->fw, &b[i], 1, err, sizeof err);
        fed += c;
    }
    for (int d = 0; d < N_DEC && rc == 0; d++) {
        kvg_fwd_seq b[N_SEQ];
        for (int i = 0; i < n; i++) {
            b[i].kv = &seqs[i];
            b[i].tokens = toks[i] + N_PROMPT + d;
            b[i].n_tokens = 1;
            b[i].logits = logits + ((size_t)i * (N_DEC + 1) + d + 1) * V;
        }
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

static void test_forward(const kvg_model *m, const char *name)
{
    int V = m->cfg.vocab_size;
    size_t per = (size_t)(N_DEC + 1) * V, all = N_SEQ * per;
    float *base = calloc(all, sizeof(float)), *other = calloc(all, sizeof(float));
    rig r1, r2;
    int finite = 1;
    if (!ok(rig_new(&r1, m, 2) == 0 && rig_new(&r2, m, 1) == 0, "%s: backend and forward pass", name))
        return;
    /* the reference run: each sequence alone, whole prompt, 2 threads */
    ok(run(&r1, m, 0, N_SEQ, 0, 0, base) == 0, "%s: prefill and decode, one sequence at a time", name);
    for (size_t i = 0; i < all; i++)
        finite &= isfinite(base[i]);
    ok(finite, "%s: logits finite", name);
    ok(run(&r1, m, 0, N_SEQ, 1, 0, other) == 0 && memcmp(base, other, all * sizeof(float)) == 0,
       "%s: prefill a token at a time: bit-identical logits", name);
    ok(run(&r1, m, 0, N_SEQ, 7, 0, other) == 0 && memcmp(base, other, all * sizeof(float)) == 0,
       "%s: prefill in chunks of 7: bit-identical logits", name);
    ok(run(&r1, m, 0, N_SEQ, 0, 1, other) == 0 && memcmp(base, other, all * sizeof(float)) == 0,
       "%s: 8 sequences in one step (prefill and decode): bit-identical logits", name);
    ok(run(&r1, m, 0, N_SEQ, 5, 1, other) == 0 && memcmp(base, other, all * sizeof(float)) == 0,
       "%s: 8 sequences batched, prefill chunks of 5: bit-identical logits", name);
    ok(run(&r2, m, 0, N_SEQ, 0, 1, other) == 0 && memcmp(base, other, all * sizeof(float)) == 0,
       "%s: 1 thread instead of 2: bit-identical logits", name);
    /* sequence 3 alone from a fresh start, vs its place in the batch */
    ok(run(&r2, m, 3, 1, 3, 0, other) == 0 && memcmp(base + 3 * per, other, per * sizeof(float)) == 0,
       "%s: one sequence alone vs in a batch of 8: bit-identical logits", name);
    rig_free(&r1);
    rig_free(&r2);
    free(base);
    free(other);
}

/* ---- the tests ---- */

static void test_load(void)
{
    moe_spec s = { 64, 4, 2, 16, 2, 8, 2, 32, 300, 256, KVG_DT_F32, KVG_DT_F32, 1, 0, 0, 7 };
    char err[512];
    kvg_model *m = moe_load(&s, "load", err, sizeof err);
    if (!ok(m != NULL, "qwen3moe GGUF loads")) {
        diag("%s", err);
        return;
    }
    is_str(m->cfg.arch, "qwen3moe", "architecture");
    is_int(m->cfg.n_experts, 8, "expert_count");
    is_int(m->cfg.n_experts_used, 2, "expert_used_count");
    is_int(m->cfg.expert_hidden_dim, 32, "expert_feed_forward_length");
    is_int(m->cfg.moe_gating, KVG_MOE_SOFTMAX, "gating: softmax, then top-k");
    is_int(m->cfg.moe_norm_topk, 1, "the top-k weights renormalized (llama.cpp's qwen3moe)");
    is_int(m->cfg.qk_norm, 1, "q/k norms (as qwen3)");
    {
        const kvg_layer_weights *L = &m->layers[1];
        size_t rb = (size_t)m->cfg.dim * 4;
        ok(L->moe_gate && L->moe_up && L->moe_down && L->moe_router.rows == 8 && L->moe_router.cols == 64,
           "router and experts bound");
        ok(L->moe_gate[3].rows == 32 && L->moe_gate[3].cols == 64 && L->moe_down[3].rows == 64
           && L->moe_down[3].cols == 32, "an expert's matrices have the expert's shape");
        ok((const char *)L->moe_gate[3].data == (const char *)L->moe_gate[0].data + 3 * 32 * rb
           && (const char *)L->moe_down[7].data == (const char *)L->moe_down[0].data + 7 * 64 * 32 * 4,
           "expert e is rows [e rows, (e + 1) rows) of its stack, in the mapping");
        ok(!L->w_gate.data && !L->w_up.data && !L->w_down.data, "no dense FFN");
    }
    kvg_model_free(m);

    s.write_ff = 0;
    m = moe_load(&s, "noff", err, sizeof err);
    ok(m && m->cfg.hidden_dim == 32, "no feed_forward_length: the expert width stands in");
    if (!m)
        diag("%s", err);
    kvg_model_free(m);

    s.bad_stack = 1;
    m = moe_load(&s, "bad", err, sizeof err);
    ok(!m && strstr(err, "blk.0.ffn_up_exps.weight") && strstr(err, "[7][32][64]") && strstr(err, "[8][32][64]"),
       "a stack with an expert missing is refused, naming the tensor and both shapes");
    diag("%s", err);
    kvg_model_free(m);
}

/* The moe operation against the reference, the ties, the gatings, per-row invariance. */
static void test_op(const char *name, const moe_spec *s, double tol)
{
    char err[512];
    kvg_model *m = moe_load(s, name, err, sizeof err);
    kvg_backend *be;
    int D = s->dim, n = 8;
    float *x;
    if (!ok(m != NULL, "%s: loads", name)) {
        diag("%s", err);
        return;
    }
    be = kvg_backend_cpu_new(m, 2, err, sizeof err);
    if (!ok(be && begin(be, n, err, sizeof err) == 0, "%s: cpu backend, a step of %d rows", name, n)) {
        diag("%s", err);
        kvg_model_free(m);
        return;
    }
    x = rand_rows(n, D, s->seed + 100);
    for (int l = 0; l < s->layers; l++) {
        double e = moe_vs_ref(be, m, l, x, n, NULL);
        ok(e <= tol, "%s: layer %d: moe of %d rows = the reference (relative error %.2g <= %.2g)", name, l, n, e,
           tol);
        ok(rows_invariant(be, m, l, x, n), "%s: layer %d: each row alone = among %d rows, any order, bit for bit",
           name, l, n);
    }
    if (s->router_ties) {
        int sel[64];
        double e;
        /* layer 0: every logit 0 -> experts 0 .. K-1, each weight 1/K */
        e = moe_vs_ref(be, m, 0, x, 1, sel);
        ok(e <= tol && sel[0] == 0 && sel[1] == 1, "%s: all logits equal: experts 0 and 1 chosen (error %.2g)",
           name, e);
        /* layer 1: rows 2, 5 and 6 identical; x along them makes them the top 3, tied */
        {
            const kvg_tensor *rt = &m->layers[1].moe_router;
            float *xt = malloc((size_t)D * sizeof *xt), *o_k = malloc((size_t)D * sizeof *o_k);
            double nrm = 0;
            kvg_tensor_row_f32(rt, 2, xt);
            for (int d = 0; d < D; d++)
                nrm += (double)xt[d] * xt[d];
            for (int d = 0; d < D; d++)
                xt[d] = (float)(xt[d] * 3.0 / sqrt(nrm / D));
            e = moe_vs_ref(be, m, 1, xt, 1, sel);
            ok(e <= tol && sel[0] == 2 && sel[1] == 5, "%s: three tied experts (2, 5, 6): 2 and 5 chosen (error %.2g)",
               name, e);
            /* the choice shows in the output: experts 5 and 6 would give another */
            {
                int other[2] = { 5, 6 }, osel[2];
                double w[2], *ref = malloc((size_t)D * sizeof *ref), maxd = 0;
                be->ops->moe(be, 1, xt, 1, o_k);
                ref_moe(m, 1, xt, other, osel, w, ref);
                for (int d = 0; d < D; d++)
                    maxd = fabs(o_k[d] - ref[d]) > maxd ? fabs(o_k[d] - ref[d]) : maxd;
                ok(maxd > 1e-3, "%s: (experts 5 and 6 would give another output: max difference %.3g)", name, maxd);
                free(ref);
            }
            free(xt);
            free(o_k);
        }
    }
    /* the other gating, with and without renormalization */
    {
        kvg_moe_gating g0 = m->cfg.moe_gating;
        int n0 = m->cfg.moe_norm_topk;
        m->cfg.moe_norm_topk = 0;
        ok(moe_vs_ref(be, m, s->layers - 1, x, n, NULL) <= tol, "%s: softmax then top-k, not renormalized", name);
        m->cfg.moe_gating = KVG_MOE_TOPK_SOFTMAX;
        ok(moe_vs_ref(be, m, s->layers - 1, x, n, NULL) <= tol, "%s: top-k then softmax over the k", name);
        m->cfg.moe_norm_topk = 1;
        ok(moe_vs_ref(be, m, s->layers - 1, x, n, NULL) <= tol, "%s: top-k then softmax, renormalized", name);
        ok(rows_invariant(be, m, s->layers - 1, x, n), "%s: top-k then softmax: rows invariant", name);
        m->cfg.moe_gating = g0;
        m->cfg.moe_norm_topk = n0;
    }
    /* last: it breaks the layer's experts */
    if (kvg_dtype_is_quant(s->exp_dt))
        test_reads_chosen_only(be, m, 0, x, name);
    free(x);
    kvg_backend_free(be);
    kvg_model_free(m);
}

static void test_model_forward(const char *name, const moe_spec *s)
{
    char err[512];
    kvg_model *m = moe_load(s, name, err, sizeof err);
    if (!ok(m != NULL, "%s: loads", name)) {
        diag("%s", err);
        return;
    }
    test_forward(m, name);
    kvg_model_free(m);
}

/* A backend without the moe operation: kvg_forward_new refuses the model, naming it. */
static void test_no_moe_op(void)
{
    moe_spec s = { 64, 4, 2, 16, 1, 4, 2, 32, 300, 64, KVG_DT_F32, KVG_DT_F32, 1, 0, 0, 5 };
    char err[512] = "";
    kvg_model *m = moe_load(&s, "noop", err, sizeof err);
    kvg_backend *be = m ? kvg_backend_cpu_new(m, 1, err, sizeof err) : NULL;
    kvg_kv_geom g;
    kvg_kv_pool *kv;
    kvg_forward *fw;
    kvg_backend_ops ops;
    const kvg_backend_ops *real;
    if (!ok(be != NULL, "no moe op: model and backend")) {
        diag("%s", err);
        kvg_model_free(m);
        return;
    }
    real = be->ops;
    ops = *real;
    ops.moe = NULL;
    be->ops = &ops;
    kvg_forward_kv_geom(m, 16, &g);
    kv = kvg_kv_pool_new(&g, 8, err, sizeof err);
    fw = kvg_forward_new(m, be, kv, err, sizeof err);
    ok(!fw && strstr(err, "cpu backend cannot run qwen3moe models") && strstr(err, "mixture-of-experts"),
       "a backend without moe refuses a MoE model by name (%s)", err);
    kvg_forward_free(fw);
    be->ops = real;
    kvg_kv_pool_free(kv);
    kvg_backend_free(be);
    kvg_model_free(m);
}

int main(void)
{
    /*            dim h kv hd  L  E  K  EH  V    ctx  gate/up      down         ff ties bad seed */
    moe_spec f32 = { 64, 4, 2, 16, 2, 8, 2, 32, 300, 256, KVG_DT_F32, KVG_DT_F32, 1, 1, 0, 11 };
    moe_spec q8 = { 64, 4, 2, 16, 2, 8, 3, 32, 300, 256, KVG_DT_Q8_0, KVG_DT_Q8_0, 1, 0, 0, 12 };
    moe_spec qk = { 256, 4, 2, 64, 1, 6, 2, 256, 300, 256, KVG_DT_Q4_K, KVG_DT_Q6_K, 1, 0, 0, 13 };
    moe_spec mx = { 160, 4, 2, 16, 2, 8, 2, 96, 300, 256, KVG_DT_MXFP4, KVG_DT_MXFP4, 1, 0, 0, 14 };

    test_load();
    test_no_moe_op();
    test_op("f32", &f32, 1e-5);
    test_op("q8_0", &q8, 3e-2);
    test_op("q4_k+q6_k", &qk, 5e-2);
    test_op("mxfp4", &mx, 3e-2);
    test_model_forward("f32", &f32);
    test_model_forward("q8_0", &q8);
    test_model_forward("mxfp4", &mx);
    return done_testing();
}
