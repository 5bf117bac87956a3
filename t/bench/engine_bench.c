/* Engine figures for one model, side by side in one run with a naive reference loop on
 * the very same weights (t/unit/ref_forward.h: llama2.c run.c style, one token at a
 * time, one thread, no BLAS):
 *
 *   - prefill tokens/s for a P-token prompt (default 1000) in one step;
 *   - decode tokens/s at batch 1, 8 and 32 (aggregate over the batch), each sequence
 *     after a short prompt, greedy;
 *   - the reference's prefill (P tokens fed one by one) and decode (one stream; it has
 *     no batching, so B streams take B times as long);
 *   - ratios, and the process RSS after the engine runs (before the reference, whose
 *     own KV cache would count).
 *
 *   build/bench/engine_bench [--model synthetic:110M] [--prompt 1000] [--threads N]
 *                            [--decode-steps 32] [--reps 3] [--ref-prompt N]
 *                            [--dtypes f32,f16,bf16] [--no-ref] [--profile] [--recompute 8]
 *                            [--cached-only]
 *
 * --dtypes: the weight types measured, each in turn on the same weights (the model's
 * F32 values converted to F16 / BF16 in the bench, round to nearest even); the first
 * one also gives the unsuffixed figures. Default: the model's own type, then f16 and
 * bf16 when it is F32.
 * Cached prefix: a sequence holds P - R positions (computed, untimed), then one step
 * feeds the last R tokens with logits -- the forward-pass part of the time to first
 * token of a cached prompt -- against a decode step at the same position and a step of
 * R rows of a fresh sequence.
 * --profile: the prefill and batch-1 decode broken down by operation (ms per prompt and
 * per token), thread-pool jobs
 * (synchronisation points) per token, and the cost of one pool job with the workers
 * hot (back to back) and asleep (after a pause).
 *
 * --cached-only: only the cached-prefix step, as an engine runs it for request after
 * request (the prefix held once, the last R positions fed again and again; the first
 * time untimed), median of --reps: t/bench/engine runs it between requests to
 * kvgate-engine, so that the time to first token through the engine is set against the
 * step measured at the same minute.
 *
 * A mixture-of-experts model (qwen3moe) runs without the reference (it has no experts)
 * and in its own weight type only, and adds the weight bytes a decode token reads (the
 * dense matrices, the router and k experts per layer) against its active and total
 * parameters.
 *
 * --ref-prompt N times the reference on the first N prompt positions only (its speed
 * only falls with position, so its tokens/s is then an upper bound and the ratio a
 * lower bound); default: all P. Figures only: nothing here asserts a speed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu/cpu_context.h"
#include "cpu/gemm.h"
#include "cpu/threadpool.h"
#include "cpu/threadpool_testing.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "sampler.h"
#include "sampler_testing.h"
#include "../unit/ref_forward.h"
#include "bench_stats.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':')
            v = strtol(line + kl + 1, NULL, 10);
    fclose(f);
    return v;
}

static void die(const char *what, const char *err)
{
    fprintf(stderr, "engine_bench: %s: %s\n", what, err);
    exit(1);
}

static double wall_since(double t0)
{
    return now_s() - t0;
}

/* ---- weights converted to another type (the bench's own copies) ---- */

static uint16_t to_f16(float f)
{
    _Float16 h = (_Float16)f;    /* round to nearest even, like F16C */
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);   /* finite values: round to nearest even */
    return (uint16_t)(u >> 16);
}

typedef struct wset {
    kvg_tensor *t[16 * 64 + 1];  /* the matmul weights of the model, as loaded */
    kvg_tensor orig[16 * 64 + 1];
    void *conv[16 * 64 + 1];
    int n;
} wset;

static void wset_init(wset *ws, kvg_model *m)
{
    ws->n = 0;
    for (int l = 0; l < m->cfg.n_layers && ws->n + 8 < (int)(sizeof ws->t / sizeof ws->t[0]); l++) {
        kvg_layer_weights *w = &m->layers[l];
        kvg_tensor *ts[] = { &w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down };
        for (int i = 0; i < 7; i++)
            if (ts[i]->data)     /* a MoE layer has no dense FFN */
                ws->t[ws->n++] = ts[i];
    }
    ws->t[ws->n++] = &m->output;
    for (int i = 0; i < ws->n; i++) {
        ws->orig[i] = *ws->t[i];
        ws->conv[i] = NULL;
    }
}

/* Every matmul weight as dt: the loaded tensors when dt is theirs, else converted
 * copies of their F32 values. */
static void wset_use(wset *ws, kvg_dtype dt)
{
    for (int i = 0; i < ws->n; i++) {
        const kvg_tensor *o = &ws->orig[i];
        size_t n = (size_t)o->rows * (size_t)o->cols;
        float *row;
        uint16_t *dst;
        free(ws->conv[i]);
        ws->conv[i] = NULL;
        *ws->t[i] = *o;
        if (o->dtype == dt)
            continue;
        row = malloc((size_t)o->cols * sizeof *row);
        if (dt == KVG_DT_F32) {
            float *d = malloc(n * sizeof *d);
            if (!row || !d)
                die("convert", "out of memory");
            for (int64_t r = 0; r < o->rows; r++)
                kvg_tensor_row_f32(o, r, d + (size_t)r * (size_t)o->cols);
            ws->conv[i] = d;
        } else {
            dst = malloc(n * sizeof *dst);
            if (!row || !dst)
                die("convert", "out of memory");
            for (int64_t r = 0; r < o->rows; r++) {
                kvg_tensor_row_f32(o, r, row);
                for (int64_t c = 0; c < o->cols; c++)
                    dst[(size_t)r * (size_t)o->cols + (size_t)c] =
                        dt == KVG_DT_F16 ? to_f16(row[c]) : to_bf16(row[c]);
            }
            ws->conv[i] = dst;
        }
        free(row);
        ws->t[i]->data = ws->conv[i];
        ws->t[i]->dtype = dt;
    }
}

static double mat_bytes(const kvg_tensor *t)
{
    return (double)t->rows * (double)kvg_dtype_row_bytes(t->dtype, t->cols);
}

/* A MoE model's decode: the weight bytes one token reads (every layer's attention
 * matrices and router, k of its E experts; the classifier) and its parameters, active
 * (the same matrices) and total (all E experts), in the file's types -- the CPU
 * backend's int8 layouts hold the same bytes, up to groups of 16 rows. */
static void moe_figures(const kvg_model *m, double *bytes, double *active, double *total)
{
    const kvg_model_config *c = &m->cfg;
    *bytes = mat_bytes(&m->output);
    *active = *total = (double)m->output.rows * (double)m->output.cols;
    for (int l = 0; l < c->n_layers; l++) {
        const kvg_layer_weights *w = &m->layers[l];
        const kvg_tensor *dense[] = { &w->wq, &w->wk, &w->wv, &w->wo, &w->moe_router };
        double eb = 0, ep = 0;
        for (int i = 0; i < 5; i++) {
            *bytes += mat_bytes(dense[i]);
            *active += (double)dense[i]->rows * (double)dense[i]->cols;
            *total += (double)dense[i]->rows * (double)dense[i]->cols;
        }
        for (int e = 0; e < c->n_experts; e++) {
            const kvg_tensor *x[] = { &w->moe_gate[e], &w->moe_up[e], &w->moe_down[e] };
            for (int i = 0; i < 3; i++) {
                eb += mat_bytes(x[i]);
                ep += (double)x[i]->rows * (double)x[i]->cols;
            }
        }
        /* every expert of a layer has one shape and type: k of them, on average */
        *bytes += eb * c->n_experts_used / c->n_experts;
        *active += ep * c->n_experts_used / c->n_experts;
        *total += ep;
    }
}

static double weight_mib(const wset *ws)
{
    double b = 0;
    for (int i = 0; i < ws->n; i++)
        if (i == ws->n - 1 || ws->t[i] != ws->t[ws->n - 1])
            b += (double)ws->t[i]->rows * (double)kvg_dtype_row_bytes(ws->t[i]->dtype, ws->t[i]->cols);
    return b / 1048576.0;
}

/* ---- the profile: every backend operation timed ---- */

enum { P_EMBED, P_NORM, P_QKV, P_WO, P_GATEUP, P_DOWN, P_LOGITS, P_ROPE, P_KVW, P_ATT, P_SWIGLU,
       P_ADD, P_OTHER, P_N };
static const char *const p_names[P_N] = { "embed", "rmsnorm", "matmul q,k,v", "matmul wo",
                                          "matmul gate,up", "matmul down", "matmul logits",
                                          "rope", "kv_write", "attention", "swiglu", "add",
                                          "begin/gather/read" };
static double p_time[P_N];
static int p_reset;              /* time_decode and time_prefill zero p_time when their
                                  * timed steps start */
static unsigned long long p_jobs0;
static kvg_threadpool *p_tp;
static const kvg_backend_ops *p_inner;
static const kvg_model *p_model;

#define PROF(slot, call)                  \
    do {                                  \
        double t0_ = now_s();             \
        call;                             \
        p_time[slot] += wall_since(t0_);  \
    } while (0)

static int prof_begin(kvg_backend *be, const kvg_step *st, char *e, size_t el)
{
    int rc;
    PROF(P_OTHER, rc = p_inner->begin_step(be, st, e, el));
    return rc;
}
static void prof_embed(kvg_backend *be, const kvg_tensor *emb, float *x)
{
    PROF(P_EMBED, p_inner->embed(be, emb, x));
}
static void prof_rmsnorm(kvg_backend *be, const float *x, const float *w, float eps, int rows, int dim,
                         float *out)
{
    PROF(P_NORM, p_inner->rmsnorm(be, x, w, eps, rows, dim, out));
}
static void prof_matmul(kvg_backend *be, const float *x, int M, int K, const kvg_tensor *w,
                        const float *bias, float *y)
{
    int slot = P_LOGITS;
    for (int l = 0; l < p_model->cfg.n_layers; l++) {
        const kvg_layer_weights *lw = &p_model->layers[l];
        if (w == &lw->wq || w == &lw->wk || w == &lw->wv)
            slot = P_QKV;
        else if (w == &lw->wo)
            slot = P_WO;
        else if (w == &lw->w_gate || w == &lw->w_up)
            slot = P_GATEUP;
        else if (w == &lw->w_down)
            slot = P_DOWN;
    }
    PROF(slot, p_inner->matmul(be, x, M, K, w, bias, y));
}
static void prof_matmul_n(kvg_backend *be, const float *x, int M, int K, int n, const kvg_tensor *const *w,
                          const float *const *bias, float *const *y)
{
    int slot = P_LOGITS;
    for (int l = 0; l < p_model->cfg.n_layers; l++) {
        const kvg_layer_weights *lw = &p_model->layers[l];
        if (w[0] == &lw->wq)
            slot = P_QKV;
        else if (w[0] == &lw->w_gate)
            slot = P_GATEUP;
    }
    PROF(slot, p_inner->matmul_n(be, x, M, K, n, w, bias, y));
}
static void prof_rope(kvg_backend *be, int layer, float *q, float *k)
{
    PROF(P_ROPE, p_inner->rope(be, layer, q, k));
}
static void prof_kv_write(kvg_backend *be, kvg_kv_pool *kv, int layer, const float *k, const float *v)
{
    PROF(P_KVW, p_inner->kv_write(be, kv, layer, k, v));
}
static void prof_attention(kvg_backend *be, kvg_kv_pool *kv, int layer, const float *q, float *out)
{
    PROF(P_ATT, p_inner->attention(be, kv, layer, q, out));
}
static void prof_swiglu(kvg_backend *be, float *g, const float *u, size_t n)
{
    PROF(P_SWIGLU, p_inner->swiglu(be, g, u, n));
}
static void prof_add(kvg_backend *be, float *x, const float *y, size_t n)
{
    PROF(P_ADD, p_inner->add(be, x, y, n));
}
static void prof_gather(kvg_backend *be, const float *x, int width, float *out)
{
    PROF(P_OTHER, p_inner->gather_out_rows(be, x, width, out));
}
static void prof_read(kvg_backend *be, const float *src, float *host, size_t n)
{
    PROF(P_OTHER, p_inner->read(be, src, host, n));
}

static void noop_range(void *ctx, size_t b, size_t e)
{
    (void)ctx, (void)b, (void)e;
}

/* One pool job's round trip with nothing to do: back to back (the workers poll) and
 * after a 2 ms pause (they sleep: a wake-up). Microseconds, medians of 9 batches. */
static void pool_job_cost(int threads, double *hot_us, double *cold_us)
{
    kvg_threadpool *tp = kvg_threadpool_new(threads);
    double hot[9], cold[9];
    if (!tp)
        die("pool", "cannot start threads");
    for (int r = 0; r < 9; r++) {
        double t0 = now_s(), sum = 0;
        for (int i = 0; i < 2000; i++)
            kvg_threadpool_run(tp, 8, noop_range, NULL);
        hot[r] = wall_since(t0) / 2000 * 1e6;
        for (int i = 0; i < 20; i++) {
            struct timespec ts = { 0, 2000000 };
            nanosleep(&ts, NULL);
            t0 = now_s();
            kvg_threadpool_run(tp, 8, noop_range, NULL);
            sum += wall_since(t0);
        }
        cold[r] = sum / 20 * 1e6;
    }
    *hot_us = bench_median(hot, 9);
    *cold_us = bench_median(cold, 9);
    kvg_threadpool_free(tp);
}

typedef struct ctx {
    kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
    const int32_t *toks;
    float *logits;
    int V, steps, reps, dec_prompt;
} ctx;

/* Seconds for one prefill of `prompt` tokens (median over reps), after one untimed
 * prefill: the first step of a process touches its activation buffers and KV pages for
 * the first time (page faults: a 1,000-token Q4_0 prefill ran at 0.8x its steady speed),
 * which a serving engine pays once, not per request. llamacpp_bench warms up the same way. */
static double time_prefill(ctx *c, int prompt)
{
    double t[99];
    char err[1024];
    for (int r = -1; r < c->reps; r++) {       /* r = -1: the warm-up */
        kvg_kv_seq seq;
        kvg_fwd_seq s;
        double t0;
        kvg_kv_seq_init(&seq);
        s.kv = &seq;
        s.tokens = c->toks;
        s.n_tokens = prompt;
        s.logits = c->logits;
        if (r == 0 && p_reset)
            memset(p_time, 0, sizeof p_time);
        t0 = now_s();
        if (kvg_forward_step(c->fw, &s, 1, err, sizeof err) != 0)
            die("prefill", err);
        if (r >= 0)
            t[r] = wall_since(t0);
        kvg_kv_seq_release(c->kv, &seq);
    }
    return bench_median(t, c->reps);
}

/* Seconds for `steps` decode steps of B sequences (median over reps). */
static double time_decode(ctx *c, int B)
{
    double t[99];
    char err[1024];
    for (int r = 0; r < c->reps; r++) {
        kvg_kv_seq seqs[32];
        kvg_fwd_seq s[32];
        int32_t next[32];
        double t0;
        for (int b = 0; b < B; b++) {
            kvg_kv_seq_init(&seqs[b]);
            s[b].kv = &seqs[b];
            s[b].tokens = c->toks + b;     /* a different prompt per sequence */
            s[b].n_tokens = c->dec_prompt;
            s[b].logits = c->logits + (size_t)b * c->V;
        }
        if (kvg_forward_step(c->fw, s, B, err, sizeof err) != 0)
            die("decode prompt", err);
        if (p_reset) {
            memset(p_time, 0, sizeof p_time);
            p_jobs0 = kvg_threadpool_jobs(p_tp);
        }
        t0 = now_s();
        for (int st = 0; st < c->steps; st++) {
            for (int b = 0; b < B; b++) {
                next[b] = kvg_argmax(c->logits + (size_t)b * c->V, c->V);
                s[b].tokens = &next[b];
                s[b].n_tokens = 1;
            }
            if (kvg_forward_step(c->fw, s, B, err, sizeof err) != 0)
                die("decode", err);
        }
        t[r] = wall_since(t0);
        for (int b = 0; b < B; b++)
            kvg_kv_seq_release(c->kv, &seqs[b]);
    }
    return bench_median(t, c->reps);
}

/* One forward step of n tokens of seq (logits of its last row into `logits`, or none),
 * in milliseconds. */
static double step_ms(ctx *c, kvg_kv_seq *seq, const int32_t *toks, int n, float *logits, const char *what)
{
    char err[1024];
    kvg_fwd_seq s = { seq, toks, n, logits };
    double t0 = now_s();
    if (kvg_forward_step(c->fw, &s, 1, err, sizeof err) != 0)
        die(what, err);
    return wall_since(t0) * 1e3;
}

/* The cached-prefix step: P - R positions held, the last R fed with logits. Also a
 * decode step at position P - 1 and R rows of a fresh sequence. Milliseconds. */
static void time_cached(ctx *c, int P, int R, double *ms_cached, double *ms_dec, double *ms_fresh)
{
    double tc[99], td[99], tf[99];
    for (int r = 0; r < c->reps; r++) {
        kvg_kv_seq seq;
        kvg_kv_seq_init(&seq);
        step_ms(c, &seq, c->toks, P - R, NULL, "cached prefix");
        tc[r] = step_ms(c, &seq, c->toks + P - R, R, c->logits, "cached step");
        kvg_kv_seq_truncate(c->kv, &seq, P - 1);
        td[r] = step_ms(c, &seq, c->toks + P - 1, 1, c->logits, "cached decode");
        kvg_kv_seq_release(c->kv, &seq);
        kvg_kv_seq_init(&seq);
        tf[r] = step_ms(c, &seq, c->toks + P - R, R, c->logits, "fresh step");
        kvg_kv_seq_release(c->kv, &seq);
    }
    *ms_cached = bench_median(tc, c->reps);
    *ms_dec = bench_median(td, c->reps);
    *ms_fresh = bench_median(tf, c->reps);
}

/* The backend's table with every operation wrapped in its timer. */
static void prof_ops(ctx *c, kvg_backend_ops *ops)
{
    *ops = *c->be->ops;
    p_inner = c->be->ops;
    p_model = c->m;
    p_tp = ((kvg_cpu *)c->be->ctx)->tp;
    ops->begin_step = prof_begin;
    ops->embed = prof_embed;
    ops->rmsnorm = prof_rmsnorm;
    ops->matmul = prof_matmul;
    if (ops->matmul_n)
        ops->matmul_n = prof_matmul_n;
    ops->rope = prof_rope;
    ops->kv_write = prof_kv_write;
    ops->attention = prof_attention;
    ops->swiglu = prof_swiglu;
    ops->add = prof_add;
    ops->gather_out_rows = prof_gather;
    ops->read = prof_read;
}

/* p_time as a table: per `unit` (ms each), and as a share of `wall` seconds. */
static void prof_print(const char *title, double wall, int units, const char *unit)
{
    double total = 0;
    printf("profile, %s (ms per %s):\n", title, unit);
    for (int i = 0; i < P_N; i++) {
        total += p_time[i];
        printf("  %-20s %8.3f ms  %5.1f%%\n", p_names[i], p_time[i] * 1e3 / units,
               100.0 * p_time[i] / (wall > 0 ? wall : 1));
    }
    printf("  %-20s %8.3f ms (wall %.3f ms)\n", "sum", total * 1e3 / units, wall * 1e3 / units);
}

/* Where a prefill of the whole prompt goes: large-M products and causal attention
 * over the prompt, the parts a decode profile never shows. */
static void profile_prefill(ctx *c, int prompt)
{
    kvg_backend_ops ops;
    const kvg_backend_ops *saved = c->be->ops;
    int reps = c->reps;
    double wall;

    prof_ops(c, &ops);
    c->reps = 1;
    c->be->ops = &ops;
    p_reset = 1;
    wall = time_prefill(c, prompt);
    p_reset = 0;
    c->be->ops = saved;
    c->reps = reps;
    {
        char title[64];
        snprintf(title, sizeof title, "prefill of %d tokens in one step", prompt);
        prof_print(title, wall, 1, "prompt");
    }
    printf("RESULT-PROFILE-PREFILL ms=%.1f matmul_ms=%.1f attention_ms=%.1f\n", wall * 1e3,
           (p_time[P_QKV] + p_time[P_WO] + p_time[P_GATEUP] + p_time[P_DOWN] + p_time[P_LOGITS]) * 1e3,
           p_time[P_ATT] * 1e3);
}

static void profile_decode(ctx *c)
{
    kvg_backend_ops ops;
    const kvg_backend_ops *saved = c->be->ops;
    unsigned long long jobs0;
    double wall, hot, cold;

    prof_ops(c, &ops);
    {
        int reps = c->reps;
        c->reps = 1;
        time_decode(c, 1);             /* warm */
        c->be->ops = &ops;
        p_reset = 1;
        wall = time_decode(c, 1);      /* the decode steps alone: p_time restarts there */
        jobs0 = p_jobs0;
        p_reset = 0;
        c->be->ops = saved;
        c->reps = reps;
    }
    {
        unsigned long long jobs = kvg_threadpool_jobs(p_tp) - jobs0;
        char title[64];
        snprintf(title, sizeof title, "decode batch 1 (%d steps)", c->steps);
        prof_print(title, wall, c->steps, "token");
        printf("  thread-pool jobs per token: %.1f\n", (double)jobs / c->steps);
        pool_job_cost(c->be->n_threads, &hot, &cold);
        printf("  one empty pool job (%d threads): %.2f us back to back, %.2f us after a 2 ms pause\n",
               c->be->n_threads, hot, cold);
        printf("RESULT-PROFILE jobs_per_token=%.1f job_hot_us=%.2f job_cold_us=%.2f\n",
               (double)jobs / c->steps, hot, cold);
    }
}

static void ab_fused(ctx *c)
{
    kvg_backend_ops sep = *c->be->ops;
    const kvg_backend_ops *saved = c->be->ops;
    double tf[15], ts[15], r[15];
    enum { N = 9 };
    int reps = c->reps;

    if (!saved->matmul_n)
        return;
    sep.matmul_n = NULL;
    c->reps = 1;
    for (int i = 0; i < N; i++) {
        c->be->ops = &sep;
        ts[i] = time_decode(c, 1);
        c->be->ops = saved;
        tf[i] = time_decode(c, 1);
        r[i] = ts[i] / tf[i];
    }
    c->reps = reps;
    printf("  fused q/k/v, gate/up vs one job per product (decode batch 1, %d interleaved pairs): "
           "%.1f vs %.1f tok/s, median ratio %.3f\n", N, c->steps / bench_median(tf, N), c->steps / bench_median(ts, N),
           bench_median(r, N));
    printf("RESULT-AB fused_dec1=%.1f separate_dec1=%.1f fused_ratio=%.3f\n", c->steps / bench_median(tf, N),
           c->steps / bench_median(ts, N), bench_median(r, N));
}

/* The cached-prefix step as a serving engine runs it request after request: P - R
 * positions held once, then the last R fed again and again (the sequence truncated back
 * to P - R in between), the first time untimed. Milliseconds, the median of reps. */
static double time_cached_again(ctx *c, int P, int R)
{
    double tc[99];
    kvg_kv_seq seq;

    kvg_kv_seq_init(&seq);
    step_ms(c, &seq, c->toks, P - R, NULL, "cached prefix");
    for (int r = -1; r < c->reps; r++) {
        double ms;
        kvg_kv_seq_truncate(c->kv, &seq, P - R);
        ms = step_ms(c, &seq, c->toks + P - R, R, c->logits, "cached step");
        if (r >= 0)
            tc[r] = ms;
    }
    kvg_kv_seq_release(c->kv, &seq);
    return bench_median(tc, c->reps);
}

static int parse_dtype(const char *s, kvg_dtype *dt)
{
    if (strcmp(s, "f32") == 0)
        *dt = KVG_DT_F32;
    else if (strcmp(s, "f16") == 0)
        *dt = KVG_DT_F16;
    else if (strcmp(s, "bf16") == 0)
        *dt = KVG_DT_BF16;
    else
        return -1;
    return 0;
}

static const char *dt_key(kvg_dtype dt)
{
    return dt == KVG_DT_F16 ? "f16" : dt == KVG_DT_BF16 ? "bf16" : "f32";
}

int main(int argc, char **argv)
{
    const char *model = "synthetic:110M", *dtypes_arg = NULL;
    int prompt = 1000, threads = 0, steps = 32, reps = 3, ref_prompt = -1, dec_prompt = 32;
    int no_ref = 0, profile = 0, recompute = 8, cached_only = 0;
    static const int batches[] = { 1, 8, 32 };
    enum { NB = 3, ND = 3 };
    char err[1024];
    kvg_model_load_opts lo;
    kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
    kvg_kv_geom geom;
    int32_t *toks;
    float *logits;
    double t_prefill[ND], t_dec[ND][NB], ref_prefill_tps = 0, ref_decode_tps = 0, wmib[ND];
    double ms_cached = 0, ms_dec = 0, ms_fresh = 0;
    kvg_dtype dts[ND];
    int n_dt = 0;
    long rss_kb, hwm_kb;
    int V, ref_n = 0;
    wset *ws;
    ctx c;

    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--no-ref") == 0) {
            no_ref = 1;
            continue;
        }
        if (strcmp(argv[i], "--profile") == 0) {
            profile = 1;
            continue;
        }
        if (strcmp(argv[i], "--cached-only") == 0) {
            cached_only = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "usage: engine_bench [--model M] [--prompt N] [--threads N] "
                            "[--decode-steps N] [--reps N] [--ref-prompt N] [--dtypes f32,f16,bf16] "
                            "[--no-ref] [--profile] [--recompute N] [--cached-only]\n");
            return 2;
        }
        if (strcmp(argv[i], "--model") == 0)
            model = v;
        else if (strcmp(argv[i], "--prompt") == 0)
            prompt = atoi(v);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(v);
        else if (strcmp(argv[i], "--decode-steps") == 0)
            steps = atoi(v);
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(v);
        else if (strcmp(argv[i], "--ref-prompt") == 0)
            ref_prompt = atoi(v);
        else if (strcmp(argv[i], "--dtypes") == 0)
            dtypes_arg = v;
        else if (strcmp(argv[i], "--recompute") == 0)
            recompute = atoi(v);
        else {
            fprintf(stderr, "engine_bench: unknown option %s\n", argv[i]);
            return 2;
        }
        i++;
    }
    if (prompt < 1 || steps < 1 || reps < 1 || reps > 99 || recompute < 1 || recompute >= prompt) {
        fprintf(stderr, "engine_bench: bad numbers\n");
        return 2;
    }
    if (ref_prompt < 0 || ref_prompt > prompt)
        ref_prompt = prompt;

    memset(&lo, 0, sizeof lo);
    lo.max_seq_len = prompt + 64 > dec_prompt + steps + 1 ? prompt + 64 : dec_prompt + steps + 1;
    m = kvg_model_load(model, &lo, err, sizeof err);
    if (!m)
        die("load", err);
    if (lo.max_seq_len > m->cfg.max_seq_len)
        m->cfg.max_seq_len = lo.max_seq_len;
    V = m->cfg.vocab_size;
    if (m->cfg.n_experts > 0) {
        /* neither the reference nor the weight conversions below know experts */
        no_ref = 1;
        dts[n_dt++] = m->layers[0].wq.dtype;
    } else if (dtypes_arg) {
        char buf[64], *save = NULL;
        snprintf(buf, sizeof buf, "%s", dtypes_arg);
        for (char *t = strtok_r(buf, ",", &save); t && n_dt < ND; t = strtok_r(NULL, ",", &save))
            if (parse_dtype(t, &dts[n_dt++]) != 0) {
                fprintf(stderr, "engine_bench: unknown dtype %s (f32, f16, bf16)\n", t);
                return 2;
            }
    } else {
        dts[n_dt++] = m->layers[0].wq.dtype;
        if (dts[0] == KVG_DT_F32) {
            dts[n_dt++] = KVG_DT_F16;
            dts[n_dt++] = KVG_DT_BF16;
        }
    }
    be = kvg_backend_cpu_new(m, threads, err, sizeof err);
    if (!be)
        die("backend", err);
    kvg_forward_kv_geom(m, 0, &geom);
    {
        int need_prefill = 2 * ((prompt + 15) / 16 + 1);
        int need_decode = batches[NB - 1] * ((dec_prompt + steps + 15) / 16 + 1);
        kv = kvg_kv_pool_new(&geom, need_prefill > need_decode ? need_prefill : need_decode, err, sizeof err);
    }
    if (!kv)
        die("kv pool", err);
    fw = kvg_forward_new(m, be, kv, err, sizeof err);
    if (!fw)
        die("forward", err);

    toks = malloc((size_t)(prompt + 64) * sizeof *toks);
    logits = malloc((size_t)batches[NB - 1] * V * sizeof *logits);
    ws = malloc(sizeof *ws);
    if (!toks || !logits || !ws)
        die("bench", "out of memory");
    {
        uint64_t s = 2024;
        for (int i = 0; i < prompt + 64; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            toks[i] = i == 0 ? (m->bos >= 0 ? m->bos : 1) : 3 + (int32_t)((s >> 33) % (uint64_t)(V - 3));
        }
    }
    wset_init(ws, m);
    c = (ctx){ m, be, kv, fw, toks, logits, V, steps, reps, dec_prompt };
    printf("model %s: %s, %d layers, dim %d, hidden %d, heads %d/%d, vocab %d; %d threads, gemm %s\n",
           m->name, kvg_dtype_name(m->layers[0].wq.dtype), m->cfg.n_layers, m->cfg.dim,
           m->cfg.hidden_dim, m->cfg.n_heads, m->cfg.n_kv_heads, V, be->n_threads, kvg_gemm_isa());
    fflush(stdout);

    if (cached_only) {
        ms_cached = time_cached_again(&c, prompt, recompute);
        printf("cached prefix of %d tokens, the last %d recomputed with logits: %.2f ms (median of %d)\n", prompt,
               recompute, ms_cached, c.reps);
        printf("RESULT cached_ms=%.2f cached_recompute=%d cached_prompt=%d\n", ms_cached, recompute, prompt);
        goto out;
    }

    /* ---- the engine, each weight type in turn on the same values ---- */
    for (int d = 0; d < n_dt; d++) {
        wset_use(ws, dts[d]);
        wmib[d] = weight_mib(ws);
        t_prefill[d] = time_prefill(&c, prompt);
        for (int bi = 0; bi < NB; bi++)
            t_dec[d][bi] = time_decode(&c, batches[bi]);
        if (d == 0) {
            time_cached(&c, prompt, recompute, &ms_cached, &ms_dec, &ms_fresh);
            if (profile) {
                profile_prefill(&c, prompt);
                profile_decode(&c);
                ab_fused(&c);
            }
        }
    }
    wset_use(ws, dts[0]);
    rss_kb = status_kb("VmRSS");
    hwm_kb = status_kb("VmHWM");

    /* ---- reference ---- */
    if (!no_ref) {
        ref_model ref;
        double t0;
        /* Positions up to the longer of the prompt and the decode stream. */
        int ref_len = prompt > dec_prompt + steps ? prompt : dec_prompt + steps;
        if (ref_init(&ref, m, ref_len + 1) != 0)
            die("reference", "out of memory");
        t0 = now_s();
        for (int p = 0; p < ref_prompt; p++)
            ref_forward(&ref, toks[p], p);
        ref_prefill_tps = ref_prompt / wall_since(t0);
        ref_n = ref_prompt;
        /* Decode: one stream after a dec_prompt-token prompt, like the engine's. */
        for (int p = 0; p < dec_prompt; p++)
            ref_forward(&ref, toks[p], p);
        t0 = now_s();
        {
            int32_t tok = kvg_argmax(ref.logits, V);
            for (int st = 0; st < steps; st++) {
                float *l = ref_forward(&ref, tok, dec_prompt + st);
                tok = kvg_argmax(l, V);
            }
        }
        ref_decode_tps = steps / wall_since(t0);
        ref_free(&ref);
    }

    {
        double e_pre = prompt / t_prefill[0];
        double rp = ref_prefill_tps > 0 ? ref_prefill_tps : 1, rd = ref_decode_tps > 0 ? ref_decode_tps : 1;
        printf("%-34s %14s %14s %9s\n", "", "engine", "reference", "ratio");
        printf("%-34s %10.1f t/s %10.1f t/s %8.1fx\n", "prefill (tokens/s)", e_pre, ref_prefill_tps,
               e_pre / rp);
        for (int bi = 0; bi < NB; bi++) {
            char label[64];
            double e = (double)batches[bi] * steps / t_dec[0][bi];
            snprintf(label, sizeof label, "decode batch %d (aggregate tok/s)", batches[bi]);
            printf("%-34s %10.1f t/s %10.1f t/s %8.1fx\n", label, e, ref_decode_tps, e / rd);
        }
        printf("prefill: %d-token prompt in one step, median of %d: %.3f s; reference fed %d positions "
               "one by one%s\n", prompt, reps, t_prefill[0], ref_n,
               ref_n < prompt ? " (a partial run: its tok/s is an upper bound, the ratio a lower bound)" : "");
        printf("decode: %d steps after a %d-token prompt per sequence, greedy, median of %d\n", steps,
               dec_prompt, reps);
        printf("\nby weight type (engine only; decode batch 1 also as GB/s of weights read per token):\n");
        printf("  %-5s %9s %12s %12s %12s %12s %9s\n", "type", "weights", "prefill t/s", "dec1 t/s",
               "dec8 t/s", "dec32 t/s", "dec1 GB/s");
        for (int d = 0; d < n_dt; d++) {
            double d1 = (double)steps / t_dec[d][0];
            printf("  %-5s %5.1f MiB %12.1f %12.1f %12.1f %12.1f %9.2f\n", dt_key(dts[d]), wmib[d],
                   prompt / t_prefill[d], d1, 8.0 * steps / t_dec[d][1], 32.0 * steps / t_dec[d][2],
                   d1 * wmib[d] * 1048576.0 / 1e9);
        }
        printf("\ncached prefix of %d tokens, the last %d recomputed with logits: %.2f ms; a decode step "
               "at position %d: %.2f ms; %d rows of a fresh sequence: %.2f ms\n", prompt, recompute,
               ms_cached, prompt - 1, ms_dec, recompute, ms_fresh);
        printf("RSS after the engine runs: %.1f MiB (peak %.1f MiB); weights %.1f MiB\n", rss_kb / 1024.0,
               hwm_kb / 1024.0, wmib[0]);
        if (m->cfg.n_experts > 0) {
            double bytes, active, total, d1 = (double)steps / t_dec[0][0];
            moe_figures(m, &bytes, &active, &total);
            printf("mixture of experts: %d of %d experts per token; a decode token reads %.1f MiB of weights "
                   "(%.3g active parameters of %.3g, %.1f%%; %.2f bytes per active parameter); decode batch 1: "
                   "%.2f GB/s of them\n", m->cfg.n_experts_used, m->cfg.n_experts, bytes / 1048576.0, active, total,
                   100.0 * active / total, bytes / active, d1 * bytes / 1e9);
            printf("RESULT-MOE experts=%d used=%d decode_token_mib=%.2f active_params=%.0f total_params=%.0f "
                   "dec1_gbps=%.2f\n", m->cfg.n_experts, m->cfg.n_experts_used, bytes / 1048576.0, active, total,
                   d1 * bytes / 1e9);
        }
        printf("RESULT model=%s prefill=%.1f ref_prefill=%.2f dec1=%.1f dec8=%.1f dec32=%.1f ref_decode=%.2f "
               "rss_mib=%.1f hwm_mib=%.1f", m->name, e_pre, ref_prefill_tps,
               (double)batches[0] * steps / t_dec[0][0], (double)batches[1] * steps / t_dec[0][1],
               (double)batches[2] * steps / t_dec[0][2], ref_decode_tps, rss_kb / 1024.0, hwm_kb / 1024.0);
        for (int d = 0; d < n_dt; d++)
            printf(" prefill_%s=%.1f dec1_%s=%.1f dec8_%s=%.1f dec32_%s=%.1f weights_mib_%s=%.1f",
                   dt_key(dts[d]), prompt / t_prefill[d], dt_key(dts[d]), (double)steps / t_dec[d][0],
                   dt_key(dts[d]), 8.0 * steps / t_dec[d][1], dt_key(dts[d]), 32.0 * steps / t_dec[d][2],
                   dt_key(dts[d]), wmib[d]);
        printf(" cached_ms=%.2f cached_recompute=%d cached_prompt=%d step_dec_ms=%.2f step_fresh_ms=%.2f\n",
               ms_cached, recompute, prompt, ms_dec, ms_fresh);
    }

out:
    wset_use(ws, KVG_DT_F32 == ws->orig[0].dtype ? KVG_DT_F32 : ws->orig[0].dtype);
    for (int i = 0; i < ws->n; i++)
        free(ws->conv[i]);
    free(ws);
    free(toks);
    free(logits);
    kvg_forward_free(fw);
    kvg_kv_pool_free(kv);
    kvg_backend_free(be);
    kvg_model_free(m);
    return 0;
}
