/* int8 KV on the whole CUDA backend, emulated (--kv-dtype int8; kernels/kvg_kernels.h's
 * layout, engine/cuda/cuda_kv.c):
 *
 *   - bit-identical logits however a prompt is chunked (one step, chunks of 5, token by
 *     token) and whatever shares the step, as t/unit/cuda_backend.c checks for BF16;
 *   - a prefix cache hit = a miss, bit for bit: a sequence sharing another's full blocks
 *     (what the prefix cache hands out) and computing the rest gives the logits of the
 *     one that computed everything; the same with the blocks moved out to host memory and
 *     back into other blocks (the host and disk tiers' hooks);
 *   - the pool's block size, and the disk tier's dtype (INT8_CUDA + the BF16 layers);
 *   - cuDNN's attention (--batch-invariant off) with int8: cuDNN takes the BF16 layers,
 *     the own kernels the int8 ones; the logits within BF16 tolerance of the own kernels';
 *   - quality against the BF16 pool of the same backend (figures as
 *     t/unit/kv_int8_quality.c defines them: greedy agreement, max |d logprob| over the
 *     vocabulary and for BF16's greedy token, teacher-forced) on stories260K (the five
 *     golden prompts' ids are not needed: random prompts from a fixed seed) and
 *     synthetic:260K-bf16, with bounds asserted (everything is deterministic: the same
 *     figures on every run).
 *
 * With arguments, a measuring tool:
 *   build/t/cuda_kv_int8 --model M [--tokenizer T] [--full-layers N] [--prompts K]
 *                        [--prompt-len P] [--steps S] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "backend.h"
#include "forward.h"
#include "kv_cache.h"
#include "kv_disk.h"
#include "model.h"
#include "kvg_kernels.h"
#include "logits.h"

static char err[512];

typedef struct rig {
    const kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
} rig;

/* A CUDA backend with a pool of n_blocks 16-token blocks: BF16 (full_layers < 0) or int8
 * past full_layers. */
static int rig_new(rig *r, const kvg_model *m, int full_layers, int n_blocks, int invariant)
{
    kvg_kv_geom g;
    kvg_backend_opts o;
    memset(r, 0, sizeof *r);
    memset(&o, 0, sizeof o);
    o.n_threads = 1;
    o.batch_invariant = invariant;
    r->m = m;
    r->be = kvg_backend_new_opts("cuda", m, &o, err, sizeof err);
    kvg_forward_kv_geom(m, 16, &g);
    if (full_layers >= 0) {
        g.dtype = KVG_KV_INT8;
        g.full_layers = full_layers;
    }
    r->kv = r->be ? kvg_backend_kv_pool_new(r->be, &g, n_blocks, err, sizeof err) : NULL;
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

static uint64_t seed = 0x637564613869ull;
static int32_t rnd_id(int lo, int hi)
{
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (int32_t)((uint32_t)(seed >> 33) % (uint32_t)(hi - lo));
}

static void prompt_of(const kvg_model *m, int32_t *p, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = rnd_id(3, m->cfg.vocab_size);
    p[0] = m->bos >= 0 ? m->bos : 1;
}

/* Feeds toks[0..n) to s from its current length in chunks of `chunk` (0: one step); the
 * last step's logits into out (V floats). */
static int feed(rig *r, kvg_kv_seq *s, const int32_t *toks, int n, int chunk, float *out)
{
    for (int fed = 0; fed < n;) {
        int k = chunk <= 0 || chunk > n - fed ? n - fed : chunk;
        kvg_fwd_seq b = { s, toks + fed, k, fed + k == n ? out : NULL };
        if (kvg_forward_step(r->fw, &b, 1, err, sizeof err) != 0) {
            diag("step: %s", err);
            return -1;
        }
        fed += k;
    }
    return 0;
}

/* The prompt in chunks, then steps tokens: forced ones when forced, else greedy (ids
 * gets them). rec: the (steps + 1) logits rows. */
static int run(rig *r, const int32_t *prompt, int np, int chunk, int steps, const int32_t *forced, int32_t *ids,
               float *rec)
{
    const int V = r->m->cfg.vocab_size;
    kvg_kv_seq s;
    int rc;
    kvg_kv_seq_init(&s);
    rc = feed(r, &s, prompt, np, chunk, rec);
    for (int i = 0; rc == 0 && i < steps; i++) {
        ids[i] = forced ? forced[i] : argmax(rec + (size_t)i * V, V);
        rc = feed(r, &s, ids + i, 1, 1, rec + (size_t)(i + 1) * V);
    }
    kvg_kv_seq_release(r->kv, &s);
    return rc;
}

/* ---- invariance, hit == miss, tiers ---------------------------------------------------- */

static void invariance(const kvg_model *m, const char *name, int full_layers)
{
    const int V = m->cfg.vocab_size, n = 37, steps = 3;
    const size_t sz = (size_t)(steps + 1) * V * sizeof(float);
    float *a = malloc(sz), *b = malloc(sz), *o = malloc((size_t)V * sizeof(float));
    int32_t p[64], q[64], ids[8], ids2[8];
    rig r;
    prompt_of(m, p, n);
    prompt_of(m, q, 40);
    if (rig_new(&r, m, full_layers, 64, 1) != 0) {
        ok(0, "%s: rig", name);
        goto out;
    }
    ok(run(&r, p, n, 0, steps, NULL, ids, a) == 0, "%s, int8 past %d layers: one chunk", name, full_layers);
    ok(run(&r, p, n, 5, steps, NULL, ids2, b) == 0 && !memcmp(a, b, sz), "%s: chunks of 5 bit-identical", name);
    ok(run(&r, p, n, 1, steps, NULL, ids2, b) == 0 && !memcmp(a, b, sz), "%s: token by token bit-identical", name);
    {
        kvg_kv_seq s[3];
        kvg_fwd_seq bt[3];
        int32_t one = 3;
        for (int i = 0; i < 3; i++)
            kvg_kv_seq_init(&s[i]);
        bt[0] = (kvg_fwd_seq){ &s[1], q, 40, NULL };
        bt[1] = (kvg_fwd_seq){ &s[0], p, n, o };
        bt[2] = (kvg_fwd_seq){ &s[2], &one, 1, NULL };
        ok(kvg_forward_step(r.fw, bt, 3, err, sizeof err) == 0 && !memcmp(o, a, (size_t)V * sizeof(float)),
           "%s: batched with two other sequences, bit-identical to alone", name);
        for (int i = 0; i < 3; i++)
            kvg_kv_seq_release(r.kv, &s[i]);
    }
    {
        /* hit == miss: B shares A's two full blocks (positions 0..31) and computes the
         * rest; then the same from copies of those blocks made through host memory */
        kvg_kv_seq A, B;
        size_t xb = kvg_kv_xfer_bytes(r.kv);
        unsigned char *host = malloc(2 * xb);
        int32_t copy[2] = { -1, -1 };
        int rc;
        kvg_kv_seq_init(&A);
        kvg_kv_seq_init(&B);
        rc = feed(&r, &A, p, n, 0, o);
        rc |= kvg_kv_seq_fork(r.kv, &A, &B, err, sizeof err);
        kvg_kv_seq_truncate(r.kv, &B, 32);
        rc |= feed(&r, &B, p + 32, n - 32, 0, b);
        ok(rc == 0 && B.blocks[0] == A.blocks[0] && B.blocks[1] == A.blocks[1] &&
           !memcmp(b, a, (size_t)V * sizeof(float)), "%s: a prefix hit (shared int8 blocks) = the miss, bit for bit",
           name);
        kvg_kv_seq_release(r.kv, &B);
        rc = 0;
        for (int i = 0; i < 2; i++) {
            copy[i] = kvg_kv_block_alloc(r.kv);
            rc |= copy[i] < 0 || kvg_kv_block_export(r.kv, A.blocks[i], host + (size_t)i * xb) != 0;
        }
        kvg_kv_pool_xfer_wait(r.kv);
        for (int i = 0; i < 2 && rc == 0; i++)
            rc |= kvg_kv_block_import(r.kv, copy[i], host + (size_t)i * xb) != 0;
        kvg_kv_seq_release(r.kv, &A);
        /* B: the two imported blocks as its table (refcount 1 each, released with B) */
        kvg_kv_seq_init(&B);
        B.blocks = malloc(4 * sizeof(int32_t));
        B.cap = 4;
        B.blocks[0] = copy[0];
        B.blocks[1] = copy[1];
        B.n_blocks = 2;
        B.n_tokens = 32;
        rc |= feed(&r, &B, p + 32, n - 32, 0, b);
        ok(rc == 0 && xb == r.kv->block_bytes && !memcmp(b, a, (size_t)V * sizeof(float)),
           "%s: blocks out to host memory and back into other blocks: the same bits", name);
        kvg_kv_seq_release(r.kv, &B);
        free(host);
    }
    rig_free(&r);
out:
    free(a);
    free(b);
    free(o);
}

static void sizes(const kvg_model *m)
{
    rig r8, r16;
    const kvg_model_config *c = &m->cfg;
    const size_t bt = 16, hd = (size_t)c->head_dim, nh = (size_t)c->n_kv_heads, L = (size_t)c->n_layers;
    if (rig_new(&r8, m, 2, 8, 1) != 0 || rig_new(&r16, m, -1, 8, 1) != 0) {
        ok(0, "sizes: rigs");
        return;
    }
    ok(r16.kv->block_bytes == L * nh * 4 * bt * hd &&
       r8.kv->block_bytes == 2 * nh * 4 * bt * hd + (L - 2) * nh * (2 * bt * hd + 8 * bt),
       "block bytes: BF16 %zu, int8 past 2 layers %zu (2 hd + 8 bytes a token and kv head)", r16.kv->block_bytes,
       r8.kv->block_bytes);
    ok(kvg_kv_disk_cuda_dtype(r16.kv) == KVG_KV_DTYPE_BF16_CUDA &&
       kvg_kv_disk_cuda_dtype(r8.kv) == (KVG_KV_DTYPE_INT8_CUDA | 2u) &&
       kvg_kv_disk_cuda_dtype(r8.kv) != (KVG_KV_DTYPE_INT8_HOST | 2u),
       "disk dtype: BF16_CUDA; INT8_CUDA + 2 BF16 layers (not the CPU's int8 code)");
    rig_free(&r8);
    rig_free(&r16);
    {
        kvg_backend_opts o;
        kvg_backend *be;
        kvg_kv_geom g;
        kvg_kv_pool *p;
        memset(&o, 0, sizeof o);
        o.batch_invariant = 1;
        be = kvg_backend_new_opts("cuda", m, &o, err, sizeof err);
        kvg_forward_kv_geom(m, 16, &g);
        g.dtype = KVG_KV_INT8;
        g.full_layers = c->n_layers;
        p = be ? kvg_backend_kv_pool_new(be, &g, 4, err, sizeof err) : NULL;
        ok(p && p->block_bytes == L * nh * 4 * bt * hd && kvg_kv_disk_cuda_dtype(p) == KVG_KV_DTYPE_BF16_CUDA,
           "int8 with every layer full precision: the BF16 pool and dtype");
        kvg_kv_pool_free(p);
        g.full_layers = 1;
        g.head_dim = 6;
        p = be ? kvg_backend_kv_pool_new(be, &g, 4, err, sizeof err) : NULL;
        ok(!p && strstr(err, "int8 KV needs head_dim % 4 == 0"), "int8 with head_dim 6: refused (%s)", err);
        kvg_kv_pool_free(p);
        kvg_backend_free(be);
    }
}

/* --batch-invariant off with cuDNN: the BF16 layers through cuDNN, the int8 ones through
 * the own kernels; against the own kernels for every layer. */
static void with_cudnn(const kvg_model *m)
{
    const int V = m->cfg.vocab_size, n = 37, steps = 4;
    const size_t sz = (size_t)(steps + 1) * V * sizeof(float);
    float *a = malloc(sz), *b = malloc(sz);
    int32_t p[64], ids[8];
    double maxd = 0.0, maxl = 0.0;
    rig r;
    int rc = -1;
    prompt_of(m, p, n);
    setenv("KVGATE_CUDA_ATTENTION", "own", 1);
    if (rig_new(&r, m, 1, 64, 0) == 0) {
        rc = run(&r, p, n, 0, steps, NULL, ids, a);
        rig_free(&r);
    }
    setenv("KVGATE_CUDA_ATTENTION", "cudnn", 1);
    if (rc == 0 && rig_new(&r, m, 1, 64, 0) == 0) {
        rc = run(&r, p, n, 0, steps, ids, ids, b);
        rig_free(&r);
    } else {
        rc = -1;
    }
    setenv("KVGATE_CUDA_ATTENTION", "own", 1);
    for (size_t i = 0; rc == 0 && i < (size_t)(steps + 1) * V; i++) {
        maxd = fmax(maxd, fabs((double)a[i] - b[i]));
        maxl = fmax(maxl, fabs((double)a[i]));
    }
    ok(rc == 0 && maxd <= 0.03 * fmax(maxl, 1.0),
       "int8 KV through cuDNN (BF16 layers) and the own kernels (int8 layers): logits within 0.03 of the largest "
       "of the own kernels' (max |d| %.4f of %.3f)", maxd, maxl);
    free(a);
    free(b);
}

/* ---- quality against the BF16 pool ----------------------------------------------------- */

typedef struct figures {
    int agree, steps;            /* greedy steps equal before the first difference */
    double dlp_all, dlp_top;     /* max |d logprob|: any token; BF16's greedy token */
} figures;

/* BF16 greedy, int8 teacher-forced on BF16's tokens, int8 greedy: one prompt. Each side
 * on its own backend (one pool per CUDA backend). */
static int measure(const kvg_model *m, int full_layers, const int32_t *prompt, int np, int steps, figures *fg)
{
    const int V = m->cfg.vocab_size;
    const size_t sz = (size_t)(steps + 1) * V * sizeof(float);
    float *rf = malloc(sz), *rq = malloc(sz);
    double *lf = malloc((size_t)V * sizeof(double)), *lq = malloc((size_t)V * sizeof(double));
    int32_t *bf_ids = malloc((size_t)(steps + 1) * sizeof(int32_t));
    int32_t *ids = malloc((size_t)(steps + 1) * sizeof(int32_t));
    int n_blocks = (np + steps) / 16 + 2, rc = -1;
    rig b16, i8;
    memset(fg, 0, sizeof *fg);
    fg->steps = steps;
    if (rig_new(&b16, m, -1, n_blocks, 1) != 0)
        goto out0;
    if (rig_new(&i8, m, full_layers, n_blocks, 1) != 0)
        goto out1;
    if (run(&b16, prompt, np, 0, steps, NULL, bf_ids, rf) != 0 || run(&i8, prompt, np, 0, steps, bf_ids, ids, rq) != 0)
        goto out2;
    for (int i = 0; i <= steps; i++) {
        log_softmax(rf + (size_t)i * V, V, lf);
        log_softmax(rq + (size_t)i * V, V, lq);
        for (int t = 0; t < V; t++)
            fg->dlp_all = fmax(fg->dlp_all, fabs(lf[t] - lq[t]));
        {
            int t = i < steps ? bf_ids[i] : argmax(rf + (size_t)i * V, V);
            fg->dlp_top = fmax(fg->dlp_top, fabs(lf[t] - lq[t]));
        }
    }
    if (run(&i8, prompt, np, 0, steps, NULL, ids, rq) != 0)
        goto out2;
    while (fg->agree < steps && ids[fg->agree] == bf_ids[fg->agree])
        fg->agree++;
    rc = 0;
out2:
    rig_free(&i8);
out1:
    rig_free(&b16);
out0:
    free(rf);
    free(rq);
    free(lf);
    free(lq);
    free(bf_ids);
    free(ids);
    return rc;
}

/* K prompts of np random ids: the figures' worst (dlp) and the agreements' total. */
static int quality(const kvg_model *m, const char *name, int full_layers, int K, int np, int steps, figures *worst)
{
    int32_t *p = malloc((size_t)np * sizeof(int32_t));
    int agree = 0, total = 0, rc = 0;
    memset(worst, 0, sizeof *worst);
    for (int k = 0; k < K && rc == 0; k++) {
        figures f;
        prompt_of(m, p, np);
        rc = measure(m, full_layers, p, np, steps, &f);
        if (rc != 0)
            break;
        agree += f.agree;
        total += f.steps;
        worst->dlp_all = fmax(worst->dlp_all, f.dlp_all);
        worst->dlp_top = fmax(worst->dlp_top, f.dlp_top);
        diag("%s, int8 past %d layers, prompt %d (%d ids): greedy agrees %d/%d steps, max |d logprob| %.4f (all), "
             "%.4f (BF16's token)", name, full_layers, k, np, f.agree, f.steps, f.dlp_all, f.dlp_top);
    }
    worst->agree = agree;
    worst->steps = total;
    if (rc == 0)
        diag("%s, int8 past %d layers: %d prompts x %d steps: greedy agreement %d/%d, max |d logprob| %.4f (all), "
             "%.4f (BF16's token)", name, full_layers, K, steps, agree, total, worst->dlp_all, worst->dlp_top);
    free(p);
    return rc;
}

static int tool(int argc, char **argv)
{
    const char *model = NULL, *tok = NULL;
    int full = 3, K = 5, np = 64, steps = 32;
    kvg_model_load_opts lo;
    kvg_model *m;
    figures w;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--tokenizer"))
            tok = argv[i + 1];
        else if (!strcmp(argv[i], "--full-layers"))
            full = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompts"))
            K = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt-len"))
            np = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "usage: %s --model M [--tokenizer T] [--full-layers N] [--prompts K] [--prompt-len P] "
                "[--steps S]\n", argv[0]);
        return 2;
    }
    setenv("KVGATE_CUDA_ATTENTION", "own", 1);
    memset(&lo, 0, sizeof lo);
    lo.tokenizer_path = tok;
    m = kvg_model_load(model, &lo, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    {
        kvg_kv_geom g;
        size_t b16, b8;
        kvg_forward_kv_geom(m, 16, &g);
        b16 = kvg_k_kv_block_bytes(g.n_layers, 0, g.n_kv_heads, g.head_dim, 16);
        b8 = kvg_k_kv_block_bytes(g.n_layers, full < g.n_layers ? g.n_layers - full : 0, g.n_kv_heads, g.head_dim, 16);
        printf("%s: block (16 tokens) BF16 %zu bytes, int8 past %d layers %zu bytes (%.2fx blocks in the same "
               "memory)\n", model, b16, full, b8, (double)b16 / (double)b8);
    }
    if (quality(m, model, full, K, np, steps, &w) != 0) {
        fprintf(stderr, "%s\n", err);
        kvg_model_free(m);
        return 1;
    }
    printf("%s: int8 past %d layers vs BF16 KV, %d prompts of %d ids x %d steps: greedy agreement %d/%d, max |d "
           "logprob| %.4f (all tokens), %.4f (BF16's greedy token)\n", model, full, K, np, steps, w.agree, w.steps,
           w.dlp_all, w.dlp_top);
    kvg_model_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    char path[512], tpath[512];
    kvg_model_load_opts lo;
    kvg_model *stories, *syn;
    figures w = { 0, 0, 0.0, 0.0 };

    if (argc > 1)
        return tool(argc, argv);
    setenv("KVGATE_CUDA_ATTENTION", "own", 1);
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.bin", shared_dir());
    snprintf(tpath, sizeof tpath, "%s/models/stories260K/tok512.bin", shared_dir());
    memset(&lo, 0, sizeof lo);
    lo.tokenizer_path = tpath;
    stories = kvg_model_load(path, &lo, err, sizeof err);
    if (!ok(stories != NULL, "load stories260K"))
        diag("%s", err);
    memset(&lo, 0, sizeof lo);
    syn = kvg_model_load("synthetic:260K-bf16", &lo, err, sizeof err);
    if (!ok(syn != NULL, "load synthetic:260K-bf16"))
        diag("%s", err);
    if (stories) {
        sizes(stories);
        invariance(stories, "stories260K", 1);
        invariance(stories, "stories260K", 0);
        with_cudnn(stories);
        /* Bounds: about twice the measured figures (diag lines), which are deterministic.
         * stories260K (head_dim 8, keys with large channels) changes greedy choices at
         * BF16's near ties, as on the CPU (docs/operations.md): its agreement is reported,
         * not bounded. */
        int rc = quality(stories, "stories260K", 3, 3, 40, 24, &w);
        ok(rc == 0 && w.dlp_all <= 1.0 && w.dlp_top <= 0.5,
           "stories260K, int8 past 3 layers vs BF16: max |d logprob| %.4f <= 1.0 (all), %.4f <= 0.5 (BF16's token); "
           "greedy agreement %d/%d", w.dlp_all, w.dlp_top, w.agree, w.steps);
        rc = quality(stories, "stories260K", 0, 3, 40, 24, &w);
        ok(rc == 0 && w.dlp_all <= 2.0 && w.dlp_top <= 0.5,
           "stories260K, every layer int8 vs BF16: max |d logprob| %.4f <= 2.0 (all), %.4f <= 0.5 (BF16's token); "
           "greedy agreement %d/%d", w.dlp_all, w.dlp_top, w.agree, w.steps);
    }
    if (syn) {
        invariance(syn, "synthetic:260K-bf16", 3);
        int rc = quality(syn, "synthetic:260K-bf16", 3, 3, 40, 24, &w);
        ok(rc == 0 && w.dlp_all <= 0.02 && w.agree == w.steps,
           "synthetic:260K-bf16, int8 past 3 layers vs BF16: max |d logprob| %.4f <= 0.02, greedy agreement %d/%d",
           w.dlp_all, w.agree, w.steps);
    }
    kvg_model_free(stories);
    kvg_model_free(syn);
    return done_testing();
}
