/* What int8 KV (--kv-dtype int8, kv_cache.h) costs in quality and saves in memory,
 * against the float32 pool of the same model:
 *
 *   greedy agreement   the int8 pool's greedy continuation, token by token, against the
 *                      float32 one's: the steps until the first difference (of N)
 *   max |d logprob|    the float32 pool's greedy tokens fed to both pools (teacher
 *                      forcing), at every position from the last prompt token on: the
 *                      largest difference of a log-probability, over the whole vocabulary
 *                      ("all") and for the token float32 chose ("top")
 *   memory             bytes a KV block, and blocks in the same memory (256 MiB)
 *
 * Everything is deterministic (the engine's kernels fix every rounding), so the figures
 * are the same on every run and every ISA: the bounds asserted below are not chances.
 *
 * Without arguments, a test: the five golden prompts of stories260K (../shared) with
 * the default 3 float32 layers (their float32 greedy ids are the golden ones) and with
 * every layer int8, and synthetic:260K; before them, attention over an int8 pool against
 * attention over its dequantized values, and a device backend given the int8 geometry.
 * With arguments, a measuring tool:
 *
 *   build/t/kv_int8_quality --model synthetic:110M [--tokenizer T] [--full-layers N]
 *                           [--prompts K] [--prompt-len P] [--steps S] [--threads T]
 *   build/t/kv_int8_quality --geom LAYERS,KV_HEADS,HEAD_DIM [--full-layers N]
 *
 * (random prompt ids from a fixed seed; the second form prints only the memory). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "backend.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "logits.h"

static char err[512];

typedef struct side {
    kvg_kv_pool *kv;
    kvg_forward *fw;
} side;

static int side_new(side *s, const kvg_model *m, kvg_backend *be, int dtype, int full_layers, int n_tokens)
{
    kvg_kv_geom g;
    kvg_forward_kv_geom(m, 16, &g);
    g.dtype = dtype;
    g.full_layers = full_layers;
    s->kv = kvg_kv_pool_new(&g, n_tokens / 16 + 2, err, sizeof err);
    s->fw = s->kv ? kvg_forward_new(m, be, s->kv, err, sizeof err) : NULL;
    return s->fw ? 0 : -1;
}

static void side_free(side *s)
{
    kvg_forward_free(s->fw);
    kvg_kv_pool_free(s->kv);
}

static uint64_t seed = 0x6b76696e7438ull;
static int32_t rnd_id(int lo, int hi)
{
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (int32_t)((uint32_t)(seed >> 33) % (uint32_t)(hi - lo));
}

/* The prompt in one step, then `steps` tokens one at a time: forced[i] when forced,
 * else the argmax (ids[i]). rec gets the (steps + 1) logits rows when not NULL. */
static int run(side *s, const kvg_model *m, const int32_t *prompt, int np, int steps, const int32_t *forced,
               int32_t *ids, float *rec)
{
    int V = m->cfg.vocab_size, rc = 0;
    float *logits = malloc((size_t)V * sizeof(float));
    kvg_kv_seq seq;
    kvg_fwd_seq f;
    kvg_kv_seq_init(&seq);
    f.kv = &seq;
    f.tokens = prompt;
    f.n_tokens = np;
    f.logits = logits;
    for (int i = 0; rc == 0 && i <= steps; i++) {
        if (kvg_forward_step(s->fw, &f, 1, err, sizeof err) != 0) {
            rc = -1;
            break;
        }
        if (rec)
            memcpy(rec + (size_t)i * V, logits, (size_t)V * sizeof(float));
        if (i == steps)
            break;
        ids[i] = forced ? forced[i] : argmax(logits, V);
        f.tokens = ids + i;
        f.n_tokens = 1;
    }
    kvg_kv_seq_release(s->kv, &seq);
    free(logits);
    return rc;
}

typedef struct figures {
    int agree;                   /* greedy steps equal before the first difference */
    int steps;
    double dlp_all, dlp_top;     /* max |d logprob|: any token, float32's greedy token */
    double gap;                  /* float32's top-1 minus top-2 logprob where int8 first
                                    chose otherwise (0 when it never did) */
} figures;

/* One prompt: float32 greedy, int8 teacher-forced on it, int8 greedy. f32_ids gets the
 * float32 greedy ids (steps of them). */
static int measure(const kvg_model *m, kvg_backend *be, int full_layers, const int32_t *prompt, int np,
                   int steps, int32_t *f32_ids, figures *fg)
{
    int V = m->cfg.vocab_size, rc = -1;
    side f32 = { 0 }, i8 = { 0 };
    float *rf = malloc((size_t)(steps + 1) * V * sizeof(float));
    float *rq = malloc((size_t)(steps + 1) * V * sizeof(float));
    double *lf = malloc((size_t)V * sizeof(double)), *lq = malloc((size_t)V * sizeof(double));
    int32_t *ids = malloc((size_t)(steps + 1) * sizeof(int32_t));
    memset(fg, 0, sizeof *fg);
    fg->steps = steps;
    if (side_new(&f32, m, be, KVG_KV_F32, 0, np + steps) != 0 ||
        side_new(&i8, m, be, KVG_KV_INT8, full_layers, np + steps) != 0)
        goto out;
    if (run(&f32, m, prompt, np, steps, NULL, f32_ids, rf) != 0 ||
        run(&i8, m, prompt, np, steps, f32_ids, ids, rq) != 0)
        goto out;
    for (int i = 0; i <= steps; i++) {
        log_softmax(rf + (size_t)i * V, V, lf);
        log_softmax(rq + (size_t)i * V, V, lq);
        for (int t = 0; t < V; t++) {
            double d = fabs(lf[t] - lq[t]);
            fg->dlp_all = d > fg->dlp_all ? d : fg->dlp_all;
        }
        {
            int t = i < steps ? f32_ids[i] : argmax(rf + (size_t)i * V, V);
            double d = fabs(lf[t] - lq[t]);
            fg->dlp_top = d > fg->dlp_top ? d : fg->dlp_top;
        }
    }
    if (run(&i8, m, prompt, np, steps, NULL, ids, NULL) != 0)
        goto out;
    while (fg->agree < steps && ids[fg->agree] == f32_ids[fg->agree])
        fg->agree++;
    if (fg->agree < steps) {
        log_softmax(rf + (size_t)fg->agree * V, V, lf);
        fg->gap = top2_gap(lf, V);
    }
    rc = 0;
out:
    if (rc != 0)
        diag("measure: %s", err);
    side_free(&f32);
    side_free(&i8);
    free(rf);
    free(rq);
    free(lf);
    free(lq);
    free(ids);
    return rc;
}

/* Bytes a block: float32, and int8 with full_layers float32 layers. */
static void memory_line(const char *pfx, const char *name, int layers, int kv_heads, int head_dim, int full_layers)
{
    kvg_kv_geom g = { .n_layers = layers, .n_kv_heads = kv_heads, .head_dim = head_dim, .block_tokens = 16 };
    size_t f = kvg_kv_block_bytes(&g), q;
    g.dtype = KVG_KV_INT8;
    g.full_layers = full_layers;
    q = kvg_kv_block_bytes(&g);
    printf("%smemory %s (%d layers, %d kv heads x %d; %d float32 layers): %zu bytes a block (float32 %zu): "
           "%.2fx; blocks in 256 MiB: %zu (float32 %zu)\n", pfx, name, layers, kv_heads, head_dim,
           full_layers < layers ? full_layers : layers, q, f, (double)f / (double)q, ((size_t)256 << 20) / q,
           ((size_t)256 << 20) / f);
}

static int tool(int argc, char **argv)
{
    const char *model = NULL, *tok = NULL, *geom = NULL;
    int full = 3, n_prompts = 3, plen = 64, steps = 64, threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--tokenizer"))
            tok = v;
        else if (!strcmp(a, "--geom"))
            geom = v;
        else if (!strcmp(a, "--full-layers"))
            full = atoi(v);
        else if (!strcmp(a, "--prompts"))
            n_prompts = atoi(v);
        else if (!strcmp(a, "--prompt-len"))
            plen = atoi(v);
        else if (!strcmp(a, "--steps"))
            steps = atoi(v);
        else if (!strcmp(a, "--threads"))
            threads = atoi(v);
        else {
            fprintf(stderr, "kv_int8_quality: unknown option %s\n", a);
            return 2;
        }
    }
    if (geom) {
        int l, h, d;
        if (sscanf(geom, "%d,%d,%d", &l, &h, &d) != 3) {
            fprintf(stderr, "kv_int8_quality: --geom LAYERS,KV_HEADS,HEAD_DIM\n");
            return 2;
        }
        memory_line("", geom, l, h, d, full);
        return 0;
    }
    if (!model || full < 0 || n_prompts < 1 || plen < 1 || steps < 1) {
        fprintf(stderr, "kv_int8_quality: --model PATH [--tokenizer T] [--full-layers N] [--prompts K] "
                "[--prompt-len P] [--steps S] [--threads T] | --geom L,H,D [--full-layers N]\n");
        return 2;
    }
    kvg_model_load_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.tokenizer_path = tok;
    kvg_model *m = kvg_model_load(model, &lo, err, sizeof err);
    kvg_backend *be = m ? kvg_backend_cpu_new(m, threads, err, sizeof err) : NULL;
    if (!be) {
        fprintf(stderr, "kv_int8_quality: %s\n", err);
        kvg_model_free(m);
        return 1;
    }
    memory_line("", m->name, m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim, full);
    int32_t *prompt = malloc((size_t)plen * sizeof(int32_t)), *ids = malloc((size_t)steps * sizeof(int32_t));
    figures all = { 0 };
    int agree_all = 0, rc = 0;
    for (int p = 0; p < n_prompts; p++) {
        figures fg;
        for (int i = 0; i < plen; i++)
            prompt[i] = i == 0 && m->bos >= 0 ? m->bos : rnd_id(3, m->cfg.vocab_size);
        if (measure(m, be, full, prompt, plen, steps, ids, &fg) != 0) {
            rc = 1;
            break;
        }
        printf("prompt %d (%d tokens): greedy agreement %d/%d steps (float32's top-2 gap there %.3g), "
               "max |d logprob| %.4g (float32's token %.4g)\n", p, plen, fg.agree, steps, fg.gap, fg.dlp_all,
               fg.dlp_top);
        agree_all += fg.agree == steps;
        all.dlp_all = fg.dlp_all > all.dlp_all ? fg.dlp_all : all.dlp_all;
        all.dlp_top = fg.dlp_top > all.dlp_top ? fg.dlp_top : all.dlp_top;
    }
    if (rc == 0)
        printf("%s, %d float32 layers of %d: %d/%d prompts agree over all %d greedy steps; max |d logprob| %.4g "
               "(float32's token %.4g)\n", m->name, full < m->cfg.n_layers ? full : m->cfg.n_layers,
               m->cfg.n_layers, agree_all, n_prompts, steps, all.dlp_all, all.dlp_top);
    free(prompt);
    free(ids);
    kvg_backend_free(be);
    kvg_model_free(m);
    return rc;
}

/* The int8 layers' attention is attention over what they store: random K and V of T
 * positions quantized into an int8 pool (kvg_kv_quantize) and written dequantized
 * (q * scale) into a float32 pool; the backend's attention over both, for the last 6
 * rows (the 4-row kernels and the one-row ones), agrees to float rounding (the int8
 * kernels apply a scale once per score and weight, not per element); the float32
 * pool of the original values differs by the quantization's error. */
static void dequantized(const kvg_model *m, kvg_backend *be, int T)
{
    const kvg_model_config *cfg = &m->cfg;
    int hd = cfg->head_dim, nkv = cfg->n_kv_heads, bt = 16, R = 6, nb = (T + bt - 1) / bt;
    size_t qn = (size_t)R * cfg->n_heads * hd;
    kvg_kv_geom g;
    kvg_kv_pool *pi, *pd, *pf;
    float *q = be->ops->alloc(be, qn), *oi = be->ops->alloc(be, qn), *od = be->ops->alloc(be, qn);
    float *of = be->ops->alloc(be, qn), x[512];
    int32_t tokens[6] = { 0 }, pos[6], row_seq[6] = { 0 }, blocks[64], n_blocks[1] = { nb };
    const int32_t *tables[1] = { blocks };
    kvg_step st = { R, tokens, pos, row_seq, 1, bt, tables, n_blocks, 0, NULL };
    double d_deq = 0.0, d_f32 = 0.0, mx = 0.0;

    kvg_forward_kv_geom(m, bt, &g);
    pf = kvg_kv_pool_new(&g, nb, err, sizeof err);
    pd = kvg_kv_pool_new(&g, nb, err, sizeof err);
    g.dtype = KVG_KV_INT8;
    g.full_layers = 0;
    pi = kvg_kv_pool_new(&g, nb, err, sizeof err);
    if (!ok(pi && pd && pf && hd <= 512 && nb <= 64 && q && oi && od && of, "dequantized: pools of %d positions", T))
        goto out;
    for (int b = 0; b < nb; b++)
        blocks[b] = b;
    for (int r = 0; r < R; r++)
        pos[r] = T - R + r;
    for (size_t i = 0; i < qn; i++)
        q[i] = (float)rnd_id(0, 2001) / 500.0f - 2.0f;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nkv; h++)
            for (int kv = 0; kv < 2; kv++) {
                int b = t / bt, s = t % bt;
                int8_t *q8 = kv ? kvg_kv_v8(pi, b, 0, h) + (size_t)s * hd : kvg_kv_k8(pi, b, 0, h) + s;
                size_t stride = kv ? 1 : (size_t)bt;
                float *sc = kv ? kvg_kv_vscale(pi, b, 0, h) : kvg_kv_kscale(pi, b, 0, h);
                float *fd = kv ? kvg_kv_v(pd, b, 0, h) + (size_t)s * hd : kvg_kv_k(pd, b, 0, h) + s;
                float *ff = kv ? kvg_kv_v(pf, b, 0, h) + (size_t)s * hd : kvg_kv_k(pf, b, 0, h) + s;
                for (int d = 0; d < hd; d++)    /* a channel 8x the others, as trained K have */
                    x[d] = ((float)rnd_id(0, 2001) / 1000.0f - 1.0f) * (d == 1 ? 8.0f : 1.0f);
                sc[s] = kvg_kv_quantize(x, hd, q8, stride);
                for (int d = 0; d < hd; d++) {
                    fd[(size_t)d * stride] = (float)q8[(size_t)d * stride] * sc[s];
                    ff[(size_t)d * stride] = x[d];
                }
            }
    if (!ok(be->ops->begin_step(be, &st, err, sizeof err) == 0, "dequantized: a step of %d rows", R))
        goto out;
    be->ops->attention(be, pi, 0, q, oi);
    be->ops->attention(be, pd, 0, q, od);
    be->ops->attention(be, pf, 0, q, of);
    for (size_t i = 0; i < qn; i++) {
        double a = fabs((double)oi[i] - od[i]), b = fabs((double)oi[i] - of[i]);
        d_deq = a > d_deq ? a : d_deq;
        d_f32 = b > d_f32 ? b : d_f32;
        mx = fabs(of[i]) > mx ? fabs(of[i]) : mx;
    }
    ok(d_deq <= 1e-5 * (mx > 1.0 ? mx : 1.0) && d_f32 > 10.0 * d_deq,
       "%s, %d positions: int8 attention = attention over the dequantized K and V to rounding (max diff %.3g), "
       "over the original values %.3g (max |out| %.3g)", m->name, T, d_deq, d_f32, mx);
out:
    kvg_kv_pool_free(pi);
    kvg_kv_pool_free(pd);
    kvg_kv_pool_free(pf);
    be->ops->free(be, q);
    be->ops->free(be, oi);
    be->ops->free(be, od);
    be->ops->free(be, of);
}

/* stories260K's golden prompts: float32 gives the golden greedy ids; int8's agreement
 * and log-probs. */
static void golden(const char *dir)
{
    char path[600], tpath[600];
    kvg_model_load_opts lo;
    json_error_t je;
    json_t *doc, *cases;
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.bin", dir);
    snprintf(tpath, sizeof tpath, "%s/models/stories260K/tok512.bin", dir);
    memset(&lo, 0, sizeof lo);
    lo.tokenizer_path = tpath;
    kvg_model *m = kvg_model_load(path, &lo, err, sizeof err);
    kvg_backend *be = m ? kvg_backend_cpu_new(m, 1, err, sizeof err) : NULL;
    snprintf(path, sizeof path, "%s/models/stories260K/golden-greedy.json", dir);
    doc = json_load_file(path, 0, &je);
    cases = doc ? json_object_get(doc, "cases") : NULL;
    if (!ok(be && json_is_array(cases) && json_array_size(cases) >= 5, "stories260K and its golden prompts")) {
        diag("%s %s", err, je.text);
        goto out;
    }
    memory_line("# ", "stories260K", m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim, 3);
    dequantized(m, be, 37);
    dequantized(m, be, 150);
    for (int full = 3; full >= 0; full -= 3) {
        int golden_same = 1, n_agree = 0, min_agree = 1 << 30, steps_all = 0;
        double dall = 0.0, dtop = 0.0;
        for (size_t c = 0; c < json_array_size(cases); c++) {
            json_t *jc = json_array_get(cases, c), *jp = json_object_get(jc, "prompt_ids");
            json_t *jg = json_object_get(jc, "greedy_ids");
            int np = (int)json_array_size(jp), steps = (int)json_array_size(jg);
            int32_t *prompt = malloc((size_t)np * sizeof(int32_t)), *ids = malloc((size_t)steps * sizeof(int32_t));
            figures fg;
            for (int i = 0; i < np; i++)
                prompt[i] = (int32_t)json_integer_value(json_array_get(jp, (size_t)i));
            if (measure(m, be, full, prompt, np, steps, ids, &fg) != 0) {
                ok(0, "case %zu measured", c);
                free(prompt);
                free(ids);
                continue;
            }
            for (int i = 0; i < steps; i++)
                golden_same &= ids[i] == (int32_t)json_integer_value(json_array_get(jg, (size_t)i));
            diag("stories260K case %zu, %d float32 layers: greedy agreement %d/%d (float32's top-2 gap there "
                 "%.3g), max |d logprob| %.4g (float32's token %.4g)", c, full, fg.agree, steps, fg.gap,
                 fg.dlp_all, fg.dlp_top);
            n_agree += fg.agree == steps;
            min_agree = fg.agree < min_agree ? fg.agree : min_agree;
            steps_all += steps;
            dall = fg.dlp_all > dall ? fg.dlp_all : dall;
            dtop = fg.dlp_top > dtop ? fg.dlp_top : dtop;
            free(prompt);
            free(ids);
        }
        ok(golden_same, "stories260K: the float32 pool's greedy ids are the golden ones");
        diag("stories260K, %d float32 layers of 5: %d/5 golden prompts agree over all their greedy steps "
             "(the shortest agreement %d); max |d logprob| %.4g (float32's token %.4g)",
             full, n_agree, min_agree, dall, dtop);
        /* Measured (every ISA alike): 3 float32 layers, agreement 23..67 steps, each
         * divergence at a near tie of float32's (top-2 gap 0.004..0.05), |d logprob|
         * 0.17 (float32's token) / 1.6 (any); every layer int8: 24..148, 0.27 / 2.0. */
        ok(min_agree >= 20, "stories260K, %d float32 layers: every golden prompt agrees for its first 20 greedy "
           "steps at least (%d)", full, min_agree);
        ok(dtop < (full == 3 ? 0.25 : 0.4) && dall < 3.0,
           "  max |d logprob| of float32's token < %.2g (%.4g), of any token < 3 (%.4g)", full == 3 ? 0.25 : 0.4,
           dtop, dall);
        ok(dtop > 0.0, "  and int8 KV does change the logits (it is used)");
    }
out:
    json_decref(doc);
    kvg_backend_free(be);
    kvg_model_free(m);
}

/* A backend whose pool lives in its own memory (the CUDA one) has its own int8 layout
 * (kernels/kvg_kernels.h): kvg_backend_kv_pool_new hands it the int8 geometry as it is
 * (the backend refuses what it cannot store), and the float32 one too. */
static int stub_pool_calls, stub_dtype, stub_full;
static kvg_kv_pool *stub_pool_new(kvg_backend *be, const kvg_kv_geom *g, int32_t n_blocks, char *e, size_t el)
{
    (void)be;
    stub_pool_calls++;
    stub_dtype = g->dtype;
    stub_full = g->full_layers;
    return kvg_kv_pool_new(g, n_blocks, e, el);
}

static void device_pool_given(void)
{
    kvg_backend_ops ops;
    kvg_backend be;
    kvg_kv_geom g = { .n_layers = 4, .n_kv_heads = 2, .head_dim = 8, .dtype = KVG_KV_INT8, .full_layers = 3 };
    kvg_kv_pool *p;
    memset(&ops, 0, sizeof ops);
    memset(&be, 0, sizeof be);
    ops.name = "devicelike";
    ops.kv_pool_new = stub_pool_new;
    be.ops = &ops;
    err[0] = '\0';
    p = kvg_backend_kv_pool_new(&be, &g, 4, err, sizeof err);
    ok(p != NULL && stub_pool_calls == 1 && stub_dtype == KVG_KV_INT8 && stub_full == 3,
       "a device backend's pool: the int8 geometry goes to the backend as it is");
    kvg_kv_pool_free(p);
    g.full_layers = 4;
    p = kvg_backend_kv_pool_new(&be, &g, 4, err, sizeof err);
    ok(p != NULL && stub_pool_calls == 2, "  every layer float32: the same");
    kvg_kv_pool_free(p);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        return tool(argc, argv);
    const char *dir = getenv("KVGATE_SHARED_DIR") ? getenv("KVGATE_SHARED_DIR") : shared_dir();
    device_pool_given();
    golden(dir);
    {
        kvg_model_load_opts lo;
        memset(&lo, 0, sizeof lo);
        kvg_model *m = kvg_model_load("synthetic:260K", &lo, err, sizeof err);
        kvg_backend *be = m ? kvg_backend_cpu_new(m, 1, err, sizeof err) : NULL;
        int32_t prompt[40], ids[48];
        figures fg;
        if (ok(be != NULL, "synthetic:260K")) {
            for (int i = 0; i < 40; i++)
                prompt[i] = rnd_id(3, m->cfg.vocab_size);
            ok(measure(m, be, 3, prompt, 40, 48, ids, &fg) == 0, "synthetic:260K measured");
            diag("synthetic:260K, 3 float32 layers of 5: greedy agreement %d/48, max |d logprob| %.4g "
                 "(float32's token %.4g)", fg.agree, fg.dlp_all, fg.dlp_top);
            ok(fg.dlp_top < 0.5, "synthetic:260K: max |d logprob| of float32's token < 0.5 (%.4g)", fg.dlp_top);
        }
        kvg_backend_free(be);
        kvg_model_free(m);
    }
    return done_testing();
}
