/* GPU figures (works on any backend: cuda on a GPU, the emulated cuda, cpu), through the
 * public backend API, for each model and each --batch-invariant mode side by side:
 *
 *   - prefill tokens/s for P-token prompts (default 4096 and 32768), one step each
 *     (--prefill-chunk N splits them as the scheduler's max_batch_tokens would);
 *   - decode tokens/s at batch 1, 8, 64 (aggregate), every sequence at --decode-ctx
 *     cached positions, greedy on the host;
 *   - time to first token for a --ttft-prefix prompt prefix (+ --ttft-suffix tokens):
 *     uncached (the whole prompt prefilled) vs cached (the prefix's blocks held by
 *     another sequence and shared with kvg_kv_seq_fork, as the prefix cache does; only
 *     the suffix is computed);
 *   - decode as a share of the HBM roofline and prefill as a share of dense BF16 peak,
 *     with the formulas printed.
 *
 *   build/bench/gpu_bench [--backend cuda] [--model synthetic:1B-bf16,synthetic:110M-bf16]
 *       [--batch-invariant on|off|both] [--quick] [--json FILE] [--device N] [--threads N]
 *       [--prefill 4096,32768] [--batches 1,8,64] [--decode-ctx 1024] [--decode-steps 32]
 *       [--ttft-prefix 32768] [--ttft-suffix 16] [--prefill-chunk 0] [--reps 3]
 *       [--hbm-tbs 4.8] [--peak-tflops 990] [--measured-tflops 790]
 *
 * --quick: small sizes (prefill 64,256; decode ctx 32, 4 steps; prefix 256; 1 rep) so it
 * runs in seconds on a CPU or the emulated backend with synthetic:260K. Figures only:
 * nothing asserts a speed. Each figure is the median of --reps runs after one warm-up. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cliargs.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "monoclock.h"
#include "sampler.h"
#include "sampler_testing.h"
#include "bench_stats.h"

#define MAX_LIST 8
#define MAX_MODELS 4

typedef struct opts {
    const char *backend, *json;
    const char *models[MAX_MODELS];
    int n_models;
    int modes[2], n_modes;       /* batch_invariant values to run */
    int device, threads, decode_ctx, decode_steps, ttft_prefix, ttft_suffix, prefill_chunk, reps;
    int prefill[MAX_LIST], n_prefill, batches[MAX_LIST], n_batches;
    double hbm_tbs, peak_tflops, measured_tflops;
} opts;

typedef struct bench {
    const opts *o;
    const kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
    float *logits;               /* [max batch][V] */
    int V;
    uint64_t rng;
} bench;

static void die(const char *what, const char *err)
{
    fprintf(stderr, "gpu_bench: %s: %s\n", what, err);
    exit(1);
}

static int usage(const char *why)
{
    fprintf(stderr, "gpu_bench: %s\n(see the comment at the top of t/bench/gpu_bench.c)\n", why);
    return 2;
}

static int parse_args(int argc, char **argv, opts *o)
{
    static char model_buf[512];
    int quick = 0;
    memset(o, 0, sizeof *o);
    o->backend = "cuda";
    o->models[0] = "synthetic:1B-bf16", o->models[1] = "synthetic:110M-bf16", o->n_models = 2;
    o->modes[0] = 1, o->modes[1] = 0, o->n_modes = 2;
    o->prefill[0] = 4096, o->prefill[1] = 32768, o->n_prefill = 2;
    o->batches[0] = 1, o->batches[1] = 8, o->batches[2] = 64, o->n_batches = 3;
    o->decode_ctx = 1024, o->decode_steps = 32, o->ttft_prefix = 32768, o->ttft_suffix = 16;
    o->reps = 3;
    o->hbm_tbs = 4.8, o->peak_tflops = 990, o->measured_tflops = 790;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
            o->prefill[0] = 64, o->prefill[1] = 256;
            o->decode_ctx = 32, o->decode_steps = 4, o->ttft_prefix = 256, o->ttft_suffix = 8;
            o->reps = 1;
        }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        double d;
        if (strcmp(a, "--quick") == 0)
            continue;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: gpu_bench [--backend cuda] [--model M[,M]] [--batch-invariant on|off|both]\n"
                   "    [--quick] [--json FILE] [--device N] [--threads N] [--prefill LIST]\n"
                   "    [--batches LIST] [--decode-ctx N] [--decode-steps N] [--ttft-prefix N]\n"
                   "    [--ttft-suffix N] [--prefill-chunk N] [--reps N] [--hbm-tbs X]\n"
                   "    [--peak-tflops X] [--measured-tflops X]\n");
            exit(0);
        }
        if (!v)
            return usage("an option needs a value");
        i++;
        if (strcmp(a, "--backend") == 0) {
            o->backend = v;
        } else if (strcmp(a, "--json") == 0) {
            o->json = v;
        } else if (strcmp(a, "--model") == 0) {
            snprintf(model_buf, sizeof model_buf, "%s", v);
            o->n_models = 0;
            for (char *save = NULL, *t = strtok_r(model_buf, ",", &save); t && o->n_models < MAX_MODELS;
                 t = strtok_r(NULL, ",", &save))
                o->models[o->n_models++] = t;
            if (o->n_models == 0)
                return usage("--model needs a model");
        } else if (strcmp(a, "--batch-invariant") == 0) {
            if (strcmp(v, "on") == 0)
                o->modes[0] = 1, o->n_modes = 1;
            else if (strcmp(v, "off") == 0)
                o->modes[0] = 0, o->n_modes = 1;
            else if (strcmp(v, "both") == 0)
                o->modes[0] = 1, o->modes[1] = 0, o->n_modes = 2;
            else
                return usage("--batch-invariant needs on, off or both");
        } else if (strcmp(a, "--prefill") == 0) {
            if (kvg_arg_int_list(v, 1, 1 << 22, o->prefill, MAX_LIST, &o->n_prefill))
                return usage("--prefill needs up to 8 lengths");
        } else if (strcmp(a, "--batches") == 0) {
            if (kvg_arg_int_list(v, 1, 4096, o->batches, MAX_LIST, &o->n_batches))
                return usage("--batches needs up to 8 sizes");
        } else if (strcmp(a, "--hbm-tbs") == 0 || strcmp(a, "--peak-tflops") == 0 ||
                   strcmp(a, "--measured-tflops") == 0) {
            if (kvg_arg_double(v, 1e-6, 1e9, &d))
                return usage("a bandwidth or peak needs a positive number");
            *(a[2] == 'h' ? &o->hbm_tbs : a[2] == 'p' ? &o->peak_tflops : &o->measured_tflops) = d;
        } else {
            int *dst = strcmp(a, "--device") == 0          ? &o->device
                     : strcmp(a, "--threads") == 0         ? &o->threads
                     : strcmp(a, "--decode-ctx") == 0      ? &o->decode_ctx
                     : strcmp(a, "--decode-steps") == 0    ? &o->decode_steps
                     : strcmp(a, "--ttft-prefix") == 0     ? &o->ttft_prefix
                     : strcmp(a, "--ttft-suffix") == 0     ? &o->ttft_suffix
                     : strcmp(a, "--prefill-chunk") == 0   ? &o->prefill_chunk
                     : strcmp(a, "--reps") == 0            ? &o->reps
                                                           : NULL;
            if (!dst)
                return usage("unknown option");
            if (kvg_arg_long(v, 0, 1 << 22, &l))
                return usage("a count needs an integer >= 0");
            *dst = (int)l;
        }
    }
    (void)quick;
    if (o->reps > 99)
        return usage("--reps is at most 99");
    if (o->reps < 1 || o->decode_steps < 1 || o->ttft_suffix < 1 || o->decode_ctx < 1)
        return usage("--reps, --decode-steps, --decode-ctx and --ttft-suffix need >= 1");
    return 0;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t *random_ids(bench *b, int n)
{
    int32_t *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    if (!p)
        die("memory", "out of memory");
    for (int i = 0; i < n; i++)
        p[i] = (int32_t)(3 + (int)(rng_next(&b->rng) % (uint64_t)(b->V - 3)));
    return p;
}

/* The device pool the backend's forward pass uses: host memory until the backend API
 * creates a device pool; the one place that changes. */
static kvg_kv_pool *pool_new(kvg_backend *be, const kvg_kv_geom *g, int32_t n_blocks, char *err,
                             size_t err_len)
{
    return kvg_backend_kv_pool_new(be, g, n_blocks, err, err_len);
}

/* Prefills `n` tokens of s in chunks (o->prefill_chunk, 0 = one step); the logits of the
 * last token into b->logits when want. */
static void prefill(bench *b, kvg_kv_seq *s, const int32_t *toks, int n, int want)
{
    char err[1024];
    int chunk = b->o->prefill_chunk;
    for (int done = 0; done < n;) {
        int k = chunk > 0 && n - done > chunk ? chunk : n - done;
        kvg_fwd_seq fs = { .kv = s, .tokens = toks + done, .n_tokens = k,
                           .logits = want && done + k == n ? b->logits : NULL };
        if (kvg_forward_step(b->fw, &fs, 1, err, sizeof err) != 0)
            die("prefill", err);
        done += k;
    }
}

/* ---- the model's sizes ---------------------------------------------------------- */

typedef struct sizes {
    double gemm_params;          /* weights every row multiplies (all layers) */
    double logit_params;         /* the output projection */
    double weight_bytes;         /* bytes read per decode step: GEMM weights + output */
    double kv_token_bytes;       /* K+V bytes of one position, all layers */
    double wbytes;               /* bytes per weight element (a quantized block's share) */
    int kvbytes;                 /* bytes per KV element */
} sizes;

static void model_sizes(const kvg_model *m, const char *backend, sizes *z)
{
    const kvg_model_config *c = &m->cfg;
    double qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    int dev = strcmp(backend, "cpu") != 0;
    /* The CUDA backend keeps weights and KV as BF16 (F16 stays F16): 2 bytes; the CPU one
     * keeps the file's dtype and an F32 pool. */
    z->wbytes = dev ? 2 : (double)kvg_dtype_row_bytes(m->layers[0].wq.dtype, 256) / 256;
    z->kvbytes = dev ? 2 : 4;
    z->gemm_params = (double)c->n_layers * (c->dim * (qd + 2 * kvd) + qd * c->dim + 3.0 * c->dim * c->hidden_dim);
    z->logit_params = (double)c->vocab_size * c->dim;
    z->weight_bytes = (z->gemm_params + z->logit_params) * z->wbytes;
    z->kv_token_bytes = 2.0 * c->n_layers * kvd * z->kvbytes;
}

/* Prefill FLOPs of P new tokens after `past` cached ones: the GEMMs (2 per multiply-add),
 * the logits of the last row, and causal attention (QK^T and PV: 4 * qd per attended
 * position). */
static double prefill_flops(const kvg_model *m, const sizes *z, double P, double past)
{
    const kvg_model_config *c = &m->cfg;
    double qd = (double)c->n_heads * c->head_dim;
    double attended = P * past + P * (P + 1) / 2;
    return 2 * P * z->gemm_params + 2 * z->logit_params + 4.0 * c->n_layers * qd * attended;
}

/* ---- measurements --------------------------------------------------------------- */

static json_t *bench_prefill(bench *b, const sizes *z, int P)
{
    double t[99];
    int32_t *toks = random_ids(b, P);
    json_t *j = json_object();
    double s, fl;
    for (int r = 0; r < b->o->reps; r++) {
        kvg_kv_seq sq;
        double t0;
        kvg_kv_seq_init(&sq);
        t0 = kvg_mono_s();
        prefill(b, &sq, toks, P, 1);    /* reading the logits back waits for the step */
        t[r] = kvg_mono_s() - t0;
        kvg_kv_seq_release(b->kv, &sq);
    }
    s = bench_median(t, b->o->reps);
    fl = prefill_flops(b->m, z, P, 0);
    json_object_set_new(j, "tokens", json_integer(P));
    json_object_set_new(j, "seconds", json_real(s));
    json_object_set_new(j, "tok_s", json_real(P / s));
    json_object_set_new(j, "tflops", json_real(fl / s * 1e-12));
    json_object_set_new(j, "share_peak", json_real(fl / s * 1e-12 / b->o->peak_tflops));
    json_object_set_new(j, "share_measured_peak", json_real(fl / s * 1e-12 / b->o->measured_tflops));
    free(toks);
    return j;
}

static json_t *bench_decode(bench *b, const sizes *z, int B)
{
    int ctx = b->o->decode_ctx, S = b->o->decode_steps, V = b->V;
    kvg_kv_seq *sq = calloc((size_t)B, sizeof *sq);
    kvg_fwd_seq *fs = calloc((size_t)B, sizeof *fs);
    int32_t *next = calloc((size_t)B, sizeof *next);
    int32_t *toks = random_ids(b, ctx);
    double t[99], s, bytes;
    char err[1024];
    json_t *j = json_object();
    if (!sq || !fs || !next)
        die("memory", "out of memory");
    for (int r = 0; r < b->o->reps; r++) {
        double t0 = 0;
        for (int i = 0; i < B; i++) {
            kvg_kv_seq_init(&sq[i]);
            toks[0] = (int32_t)(3 + i % (V - 3));     /* distinct sequences */
            prefill(b, &sq[i], toks, ctx, 1);
            next[i] = kvg_argmax(b->logits, V);
        }
        /* Step 0 is the warm-up (graph capture, first-touch), timed from step 1. */
        for (int k = 0; k <= S; k++) {
            if (k == 1)
                t0 = kvg_mono_s();
            for (int i = 0; i < B; i++)
                fs[i] = (kvg_fwd_seq){ .kv = &sq[i], .tokens = &next[i], .n_tokens = 1,
                                       .logits = b->logits + (size_t)i * V };
            if (kvg_forward_step(b->fw, fs, B, err, sizeof err) != 0)
                die("decode", err);
            for (int i = 0; i < B; i++)
                next[i] = kvg_argmax(b->logits + (size_t)i * V, V);
        }
        t[r] = (kvg_mono_s() - t0) / S;
        for (int i = 0; i < B; i++)
            kvg_kv_seq_release(b->kv, &sq[i]);
    }
    s = bench_median(t, b->o->reps);
    /* Bytes read per step: every weight once, plus each sequence's cached K/V (its mean
     * context over the timed steps). */
    bytes = z->weight_bytes + (double)B * (ctx + 1.0 + (S + 1) / 2.0) * z->kv_token_bytes;
    json_object_set_new(j, "batch", json_integer(B));
    json_object_set_new(j, "context", json_integer(ctx));
    json_object_set_new(j, "step_ms", json_real(s * 1e3));
    json_object_set_new(j, "tok_s", json_real(B / s));
    json_object_set_new(j, "bytes_per_step", json_real(bytes));
    json_object_set_new(j, "hbm_share", json_real(bytes / (b->o->hbm_tbs * 1e12) / s));
    free(sq), free(fs), free(next), free(toks);
    return j;
}

static json_t *bench_ttft(bench *b)
{
    int N = b->o->ttft_prefix, sfx = b->o->ttft_suffix, bt = b->kv->geom.block_tokens;
    int32_t *toks;
    double tu[99], tc[99], u, c;
    char err[1024];
    json_t *j = json_object();
    N = N / bt * bt;                    /* the prefix cache shares whole blocks */
    if (N < bt)
        N = bt;
    toks = random_ids(b, N + sfx);
    for (int r = 0; r < b->o->reps; r++) {
        kvg_kv_seq held, sq;
        double t0;
        kvg_kv_seq_init(&sq);
        kvg_kv_seq_init(&held);
        t0 = kvg_mono_s();
        prefill(b, &sq, toks, N + sfx, 1);
        tu[r] = kvg_mono_s() - t0;
        kvg_kv_seq_release(b->kv, &sq);

        prefill(b, &held, toks, N, 0);
        {
            kvg_fwd_seq fs;
            t0 = kvg_mono_s();
            if (kvg_kv_seq_fork(b->kv, &held, &sq, err, sizeof err) != 0)
                die("fork", err);
            fs = (kvg_fwd_seq){ .kv = &sq, .tokens = toks + N, .n_tokens = sfx, .logits = b->logits };
            if (kvg_forward_step(b->fw, &fs, 1, err, sizeof err) != 0)
                die("cached suffix", err);
            tc[r] = kvg_mono_s() - t0;
        }
        kvg_kv_seq_release(b->kv, &sq);
        kvg_kv_seq_release(b->kv, &held);
    }
    u = bench_median(tu, b->o->reps);
    c = bench_median(tc, b->o->reps);
    json_object_set_new(j, "prefix", json_integer(N));
    json_object_set_new(j, "suffix", json_integer(sfx));
    json_object_set_new(j, "uncached_ms", json_real(u * 1e3));
    json_object_set_new(j, "cached_ms", json_real(c * 1e3));
    json_object_set_new(j, "speedup", json_real(u / c));
    free(toks);
    return j;
}

static json_t *run_mode(const opts *o, const kvg_model *m, const sizes *z, int inv)
{
    bench b;
    kvg_backend_opts bo;
    kvg_kv_geom g;
    char err[2048];
    int maxB = 1, maxP = o->ttft_prefix + o->ttft_suffix, bt;
    int64_t need_pre, need_dec, need_ttft, nb;
    json_t *j = json_object(), *a;
    double t0 = kvg_mono_s();
    memset(&b, 0, sizeof b);
    b.o = o;
    b.m = m;
    b.V = m->cfg.vocab_size;
    b.rng = 2024;
    memset(&bo, 0, sizeof bo);
    bo.n_threads = o->threads;
    bo.device = o->device;
    bo.batch_invariant = inv;
    b.be = kvg_backend_new_opts(o->backend, m, &bo, err, sizeof err);
    if (!b.be)
        die(o->backend, err);
    kvg_forward_kv_geom(m, 0, &g);
    bt = g.block_tokens ? g.block_tokens : KVG_KV_BLOCK_TOKENS_DEFAULT;
    for (int i = 0; i < o->n_batches; i++)
        maxB = o->batches[i] > maxB ? o->batches[i] : maxB;
    for (int i = 0; i < o->n_prefill; i++)
        maxP = o->prefill[i] > maxP ? o->prefill[i] : maxP;
    need_pre = maxP / bt + 2;
    need_dec = (int64_t)maxB * ((o->decode_ctx + o->decode_steps + 2) / bt + 2);
    need_ttft = 2 * ((int64_t)(o->ttft_prefix + o->ttft_suffix) / bt + 2);
    nb = need_pre > need_dec ? need_pre : need_dec;
    nb = nb > need_ttft ? nb : need_ttft;
    b.kv = pool_new(b.be, &g, (int32_t)nb, err, sizeof err);
    if (!b.kv)
        die("kv pool", err);
    b.fw = kvg_forward_new(m, b.be, b.kv, err, sizeof err);
    if (!b.fw)
        die("forward", err);
    b.logits = malloc((size_t)maxB * b.V * sizeof *b.logits);
    if (!b.logits)
        die("memory", "out of memory");
    {
        /* Warm-up: a step of every kind once (handles, algorithms, first-touch). */
        kvg_kv_seq s;
        int32_t *w = random_ids(&b, 32);
        kvg_kv_seq_init(&s);
        prefill(&b, &s, w, 32, 1);
        kvg_kv_seq_release(b.kv, &s);
        free(w);
    }
    json_object_set_new(j, "batch_invariant", json_boolean(inv));
    json_object_set_new(j, "kv_blocks", json_integer(nb));
    a = json_array();
    for (int i = 0; i < o->n_prefill; i++)
        json_array_append_new(a, bench_prefill(&b, z, o->prefill[i]));
    json_object_set_new(j, "prefill", a);
    a = json_array();
    for (int i = 0; i < o->n_batches; i++)
        json_array_append_new(a, bench_decode(&b, z, o->batches[i]));
    json_object_set_new(j, "decode", a);
    json_object_set_new(j, "ttft", bench_ttft(&b));
    json_object_set_new(j, "seconds", json_real(kvg_mono_s() - t0));
    free(b.logits);
    kvg_forward_free(b.fw);
    kvg_kv_pool_free(b.kv);
    kvg_backend_free(b.be);
    return j;
}

static double num(json_t *j, const char *path)
{
    /* "prefill/1/tok_s": objects by key, arrays by index */
    char buf[128], *save = NULL;
    snprintf(buf, sizeof buf, "%s", path);
    for (char *t = strtok_r(buf, "/", &save); t && j; t = strtok_r(NULL, "/", &save))
        j = json_is_array(j) ? json_array_get(j, (size_t)atoi(t)) : json_object_get(j, t);
    return json_number_value(j);
}

static void row(json_t *modes, int n_modes, const char *label, const char *path, const char *fmt)
{
    printf("  %-36s", label);
    for (int k = 0; k < n_modes; k++) {
        char cell[32];
        snprintf(cell, sizeof cell, fmt, num(json_array_get(modes, (size_t)k), path));
        printf(" %14s", cell);
    }
    printf("\n");
}

int main(int argc, char **argv)
{
    opts o;
    int rc;
    json_t *root = json_object(), *models = json_array();
    if ((rc = parse_args(argc, argv, &o)) != 0)
        return rc;
    json_object_set_new(root, "tool", json_string("gpu_bench"));
    json_object_set_new(root, "backend", json_string(o.backend));
    json_object_set_new(root, "hbm_tbs", json_real(o.hbm_tbs));
    json_object_set_new(root, "peak_tflops", json_real(o.peak_tflops));
    json_object_set_new(root, "measured_tflops", json_real(o.measured_tflops));
    json_object_set_new(root, "prefill_chunk", json_integer(o.prefill_chunk));
    json_object_set_new(root, "models", models);
    printf("gpu_bench: backend %s; HBM %.2f TB/s, dense BF16 peak %.0f TFLOP/s (datasheet), %.0f (measured)\n",
           o.backend, o.hbm_tbs, o.peak_tflops, o.measured_tflops);
    printf("  decode roofline share = (W_bytes + B * ctx * kv_bytes_per_token) / (%.2f TB/s) / step time\n"
           "    W_bytes = (n_layers * (dim*(qd + 2*kvd) + qd*dim + 3*dim*hidden) + vocab*dim) * bytes/weight\n"
           "    kv_bytes_per_token = 2 * n_layers * kvd * bytes/element (BF16 on the GPU)\n"
           "  prefill share = FLOPs / time / peak, FLOPs = 2*P*gemm_params + 2*vocab*dim\n"
           "    + 4 * n_layers * qd * P*(P+1)/2 (causal attention: QK^T and PV)\n",
           o.hbm_tbs);
    for (int mi = 0; mi < o.n_models; mi++) {
        char err[2048];
        kvg_model_load_opts lo;
        kvg_model *m;
        sizes z;
        json_t *jm = json_object(), *modes = json_array();
        int maxP = o.ttft_prefix + o.ttft_suffix;
        double tl = kvg_mono_s();
        for (int i = 0; i < o.n_prefill; i++)
            maxP = o.prefill[i] > maxP ? o.prefill[i] : maxP;
        if (o.decode_ctx + o.decode_steps + 2 > maxP)
            maxP = o.decode_ctx + o.decode_steps + 2;
        memset(&lo, 0, sizeof lo);
        lo.max_seq_len = maxP + 64;     /* synthetic models take a longer context */
        m = kvg_model_load(o.models[mi], &lo, err, sizeof err);
        if (!m)
            die(o.models[mi], err);
        if (m->cfg.max_seq_len < lo.max_seq_len)
            die(o.models[mi], "the model's context is too short for these sizes (use --quick or smaller sizes)");
        model_sizes(m, o.backend, &z);
        printf("\n%s (%.2fM GEMM params, weights %.1f MiB as read per decode step, KV %.1f KiB/token), loaded in %.1f s\n",
               m->name, (z.gemm_params + z.logit_params) / 1e6, z.weight_bytes / 1048576.0,
               z.kv_token_bytes / 1024.0, kvg_mono_s() - tl);
        for (int k = 0; k < o.n_modes; k++) {
            json_array_append_new(modes, run_mode(&o, m, &z, o.modes[k]));
            fflush(stdout);
        }
        json_object_set_new(jm, "model", json_string(m->name));
        json_object_set_new(jm, "params", json_real(z.gemm_params + z.logit_params));
        json_object_set_new(jm, "weight_bytes", json_real(z.weight_bytes));
        json_object_set_new(jm, "kv_token_bytes", json_real(z.kv_token_bytes));
        json_object_set_new(jm, "modes", modes);
        json_array_append_new(models, jm);

        printf("  %-36s", "batch-invariant");
        for (int k = 0; k < o.n_modes; k++)
            printf(" %14s", o.modes[k] ? "on" : "off");
        printf("\n");
        for (int i = 0; i < o.n_prefill; i++) {
            char label[64], path[64];
            snprintf(label, sizeof label, "prefill %d tok/s", o.prefill[i]);
            snprintf(path, sizeof path, "prefill/%d/tok_s", i);
            row(modes, o.n_modes, label, path, "%.0f");
            snprintf(label, sizeof label, "  share of %.0f TFLOP/s", o.peak_tflops);
            snprintf(path, sizeof path, "prefill/%d/share_peak", i);
            row(modes, o.n_modes, label, path, "%.3g");
            snprintf(label, sizeof label, "  share of %.0f TFLOP/s", o.measured_tflops);
            snprintf(path, sizeof path, "prefill/%d/share_measured_peak", i);
            row(modes, o.n_modes, label, path, "%.3g");
        }
        for (int i = 0; i < o.n_batches; i++) {
            char label[64], path[64];
            snprintf(label, sizeof label, "decode batch %d tok/s (ctx %d)", o.batches[i], o.decode_ctx);
            snprintf(path, sizeof path, "decode/%d/tok_s", i);
            row(modes, o.n_modes, label, path, "%.1f");
            snprintf(label, sizeof label, "  step ms");
            snprintf(path, sizeof path, "decode/%d/step_ms", i);
            row(modes, o.n_modes, label, path, "%.3g");
            snprintf(label, sizeof label, "  HBM roofline share");
            snprintf(path, sizeof path, "decode/%d/hbm_share", i);
            row(modes, o.n_modes, label, path, "%.3g");
        }
        row(modes, o.n_modes, "TTFT uncached ms", "ttft/uncached_ms", "%.2f");
        row(modes, o.n_modes, "TTFT cached ms", "ttft/cached_ms", "%.2f");
        row(modes, o.n_modes, "  cached speedup (goal >= 50x)", "ttft/speedup", "%.1fx");
        kvg_model_free(m);
    }
    if (o.json && json_dump_file(root, o.json, JSON_INDENT(2)) != 0) {
        fprintf(stderr, "gpu_bench: cannot write %s\n", o.json);
        return 1;
    }
    json_decref(root);
    return 0;
}
