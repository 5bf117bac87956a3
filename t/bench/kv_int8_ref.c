/* What an 8-bit KV cache costs in quality, kvgate's int8 KV (--kv-dtype int8) beside
 * llama.cpp's q8_0 KV cache (type_k = type_v = GGML_TYPE_Q8_0, flash attention on), on
 * the same GGUF weights, in one process (llama.cpp dlopened as llamacpp_ref does:
 * llamacpp_api.h):
 *
 *   build/bench/kv_int8_ref --model F.gguf --lib DIR|libllama.so [--prompts 4]
 *       [--prompt-len 64] [--steps 32] [--threads 2] [--full-layers 0,3] [--verbose]
 *
 * Each engine runs in several K/V settings ("configs"):
 *   lc-f32      llama.cpp, F32 K/V, flash attention off (its most precise CPU path)
 *   lc-f16      llama.cpp, F16 K/V, flash attention on (its default on the CPU)
 *   lc-q8       llama.cpp, q8_0 K and V, flash attention on: what a user of
 *               --cache-type-k q8_0 --cache-type-v q8_0 gets (with the Walsh-Hadamard
 *               rotation llama.cpp applies to a quantized cache whose head size is a
 *               multiple of 64)
 *   lc-q8-norot the same with LLAMA_ATTN_ROT_DISABLE=1: plain q8_0 (blocks of 32
 *               values, one F16 scale each), the scheme nearest kvgate's (given only when
 *               the rotation was on in lc-q8)
 *   kv-f32      kvgate, float32 K/V
 *   kv-i8-N     kvgate, int8 K/V with the first N layers float32
 *               (--kv-full-precision-layers N), for each N of --full-layers
 * and each (reference, candidate) pair below is measured, on every prompt:
 *   agree       the candidate's greedy continuation against the reference's, token by
 *               token: the steps until the first difference (of --steps), and there the
 *               reference's top-1 minus top-2 log-prob (a near tie diverges first); read
 *               off the teacher-forced run below, which is the candidate's greedy run up to
 *               its first other choice (both engines are deterministic)
 *   chosen      the reference's greedy tokens fed to the candidate (teacher forcing), at
 *               every position from the last prompt token on: the largest |d log-prob|
 *               of the token the reference chose
 *   any         the same over the whole vocabulary
 * Pairs: (a) llama.cpp's own cost of q8_0, lc-f16 -> lc-q8 (and -> lc-q8-norot), and
 * lc-f32 -> lc-q8, lc-f32 -> lc-f16 (F16 alone); (b) kvgate's cost of int8,
 * kv-f32 -> kv-i8-N; (c) the anchor, kv-f32 -> lc-f32 (the two engines at full
 * precision: rounding only) and kv-f32 -> lc-f16.
 *
 * Then the K/V rows themselves: the prompts' K and V at every layer as kvgate's float32
 * pool holds them, quantized both ways, kvgate's (one scale per token and KV head,
 * max|x| / 127, float32) and q8_0's (one F16 scale per 32 values), each row's error
 * against the float values: the RMS error over all rows as a share of the rows' RMS,
 * and the largest |error| of one value as a share of its row's max|x|.
 *
 * Prompts: the model's BOS, then random ids from a fixed seed (the same every run). A
 * greedy continuation runs all --steps steps (end-of-sequence is a token like another
 * here). llama.cpp's greedy choice is taken the way kvgate's is (highest logit, ties to
 * the lowest id), and both log-softmaxes in double. llama.cpp's head size must be a
 * multiple of 32 for q8_0 K (it refuses the context otherwise; stories260K's 8 is not).
 *
 * A benchmark, not a test: llama.cpp's F16 and q8_0 arithmetic is its own (flash
 * attention converts Q to the cache's type before the dot products), so only the
 * figures, side by side, are the result. t/bench/kv_int8_ref runs it on synth_gguf's
 * files (llama tiny and 110M, gemma3 110M); t/bench-kv-int8-ref.t checks it on the tiny
 * one (the caches llama.cpp made, the anchor, determinism).
 *
 * Exit status: 0 done, 1 error, 2 usage, 3 no usable library (llamacpp_api.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "forward.h"
#include "kv_cache.h"
#include "llamacpp_api.h"
#include "model.h"
#include "quant_testing.h"
#include "../unit/logits.h"

#define MAX_CONFIGS 12
#define MAX_PAIRS 16
#define MAX_RUNS 4               /* paths a config runs on for one prompt: the references' */

static const char USAGE[] =
    "usage: kv_int8_ref --model F.gguf --lib DIR|libllama.so [--prompts 4] [--prompt-len 64] [--steps 32]\n"
    "                   [--threads 2] [--full-layers 0,3] [--verbose]\n";

static char err[512];

/* One engine in one K/V setting. */
typedef struct config {
    char name[24];
    int is_lc;
    lc_kv kv;                    /* llama.cpp's cache */
    void *ctx;
    int rotated;                 /* llama.cpp's log said attn_rot_k/v */
    int full_layers;             /* kvgate: -1 float32, else int8 with N float32 layers */
    kvg_kv_pool *pool;
    kvg_forward *fw;
    /* This prompt's runs, each a path (steps ids fed after the prompt) and the steps + 1
     * logit rows along it; own: the entry of the config's greedy run, -1 none yet. */
    int n_runs, own;
    int32_t *path[MAX_RUNS];
    float *rows[MAX_RUNS];
} config;

typedef struct pair {
    int ref, cand;
    const char *what;
    /* over the prompts */
    int n_all, min_agree;
    double dlp_chosen, dlp_any;
} pair;

static int V, steps;
static const lc_api *lc;

/* The prompt in one step, then `steps` tokens one at a time: forced[i] when forced,
 * else the argmax; ids gets the tokens fed, rows the steps + 1 logit rows. */
static int run(config *c, const int32_t *prompt, int np, const int32_t *forced, int32_t *ids, float *rows)
{
    if (c->is_lc) {
        int32_t *p = malloc((size_t)np * sizeof *p);
        if (!p)
            return -1;
        memcpy(p, prompt, (size_t)np * sizeof *p);
        lc->memory_clear(lc->get_memory(c->ctx), 1);
        int rc = lc->decode(c->ctx, lc->batch_get_one(p, np));
        free(p);
        for (int i = 0; rc == 0; i++) {
            const float *l = lc->get_logits_ith(c->ctx, -1);
            if (!l) {
                snprintf(err, sizeof err, "llama_get_logits_ith: no logits");
                return -1;
            }
            memcpy(rows + (size_t)i * V, l, (size_t)V * sizeof(float));
            if (i == steps)
                return 0;
            ids[i] = forced ? forced[i] : argmax(l, V);
            rc = lc->decode(c->ctx, lc->batch_get_one(ids + i, 1));
        }
        snprintf(err, sizeof err, "llama_decode failed");
        return -1;
    }
    kvg_kv_seq seq;
    kvg_fwd_seq f;
    int rc = 0;
    kvg_kv_seq_init(&seq);
    f.kv = &seq;
    f.tokens = prompt;
    f.n_tokens = np;
    for (int i = 0; rc == 0; i++) {
        f.logits = rows + (size_t)i * V;
        if (kvg_forward_step(c->fw, &f, 1, err, sizeof err) != 0)
            rc = -1;
        else if (i == steps)
            break;
        else {
            ids[i] = forced ? forced[i] : argmax(f.logits, V);
            f.tokens = ids + i;
            f.n_tokens = 1;
        }
    }
    kvg_kv_seq_release(c->pool, &seq);
    return rc;
}

/* The entry of c's run along `path` (NULL: its own greedy run), run now unless this
 * prompt ran it already; -1 with err. Both engines are deterministic (the same tokens
 * give the same logits), so a run is never repeated: on a machine shared with others
 * the runs are what the time goes to. */
static int run_on(config *c, const int32_t *prompt, int np, const int32_t *path)
{
    if (!path && c->own >= 0)
        return c->own;
    for (int e = 0; path && e < c->n_runs; e++)
        if (memcmp(c->path[e], path, (size_t)steps * sizeof *path) == 0)
            return e;
    if (c->n_runs == MAX_RUNS) {
        snprintf(err, sizeof err, "more than %d paths for one prompt", MAX_RUNS);
        return -1;
    }
    int e = c->n_runs;
    if (!c->path[e]) {
        c->path[e] = malloc((size_t)steps * sizeof(int32_t));
        c->rows[e] = malloc((size_t)(steps + 1) * V * sizeof(float));
        if (!c->path[e] || !c->rows[e]) {
            snprintf(err, sizeof err, "out of memory");
            return -1;
        }
    }
    if (run(c, prompt, np, path, c->path[e], c->rows[e]) != 0)
        return -1;
    c->n_runs++;
    if (!path)
        c->own = e;
    return e;
}

/* One pair on one prompt: the reference's greedy run, the candidate along its path
 * (teacher forcing); the figures into *agree, *gap, *chosen, *any. The candidate's own
 * greedy run is that forced run up to the first position where its choice (argmax) is
 * not the reference's token, and differs there: so the greedy agreement is read off the
 * forced run, without running the candidate's greedy path. */
static int measure(config *r, config *c, const int32_t *prompt, int np, double *lr, double *lq, int *agree,
                   double *gap, double *chosen, double *any)
{
    int er = run_on(r, prompt, np, NULL), ec = er < 0 ? -1 : run_on(c, prompt, np, r->path[er]);
    if (ec < 0)
        return -1;
    const int32_t *ids = r->path[er];
    const float *rrows = r->rows[er], *crows = c->rows[ec];
    *chosen = *any = 0.0;
    *agree = -1;
    for (int i = 0; i <= steps; i++) {
        const float *rr = rrows + (size_t)i * V, *cr = crows + (size_t)i * V;
        log_softmax(rr, V, lr);
        log_softmax(cr, V, lq);
        for (int t = 0; t < V; t++)
            *any = fmax(*any, fabs(lr[t] - lq[t]));
        int t = i < steps ? ids[i] : argmax(rr, V);
        *chosen = fmax(*chosen, fabs(lr[t] - lq[t]));
        if (i < steps && *agree < 0 && argmax(cr, V) != t) {
            *agree = i;
            *gap = top2_gap(lr, V);
        }
    }
    if (*agree < 0) {
        *agree = steps;
        *gap = 0.0;
    }
    return 0;
}

/* Error figures of one way of quantizing: sums over all values and the largest share. */
typedef struct qerr {
    double se, sx, max_rel;
} qerr;

/* One row x[0..n) (n % 32 == 0), both ways. */
static void row_errors(const float *x, int n, qerr *i8, qerr *q8)
{
    int8_t q[1024];
    float d[1024];
    unsigned char blocks[34 * 32];
    float amax = 0.0f, s = kvg_kv_quantize(x, n, q, 1);
    for (int i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    kvg_quant_row(KVG_Q8_0, x, blocks, n);
    kvg_dequant_row(KVG_Q8_0, blocks, d, n);
    for (int i = 0; i < n; i++) {
        double e8 = (double)q[i] * s - x[i], eq = (double)d[i] - x[i];
        i8->se += e8 * e8;
        q8->se += eq * eq;
        i8->sx += (double)x[i] * x[i];
        q8->sx += (double)x[i] * x[i];
        if (amax > 0.0f) {
            i8->max_rel = fmax(i8->max_rel, fabs(e8) / amax);
            q8->max_rel = fmax(q8->max_rel, fabs(eq) / amax);
        }
    }
}

/* The K and V rows of the prompt's positions in a float32 pool, every layer and KV head,
 * quantized both ways. */
static int kv_rows(config *c, const kvg_model *m, const int32_t *prompt, int np, float *logits, qerr e[2][2])
{
    int hd = m->cfg.head_dim, bt = c->pool->geom.block_tokens;
    float x[1024];
    kvg_kv_seq seq;
    kvg_fwd_seq f = { &seq, prompt, np, logits };
    kvg_kv_seq_init(&seq);
    if (kvg_forward_step(c->fw, &f, 1, err, sizeof err) != 0)
        return -1;
    for (int t = 0; t < np; t++)
        for (int l = 0; l < m->cfg.n_layers; l++)
            for (int h = 0; h < m->cfg.n_kv_heads; h++) {
                int32_t b = seq.blocks[t / bt];
                const float *k = kvg_kv_k(c->pool, b, l, h), *v = kvg_kv_v(c->pool, b, l, h);
                for (int d = 0; d < hd; d++)    /* K: head_dim rows of block_tokens */
                    x[d] = k[(size_t)d * bt + t % bt];
                row_errors(x, hd, &e[0][0], &e[0][1]);
                row_errors(v + (size_t)(t % bt) * hd, hd, &e[1][0], &e[1][1]);
            }
    kvg_kv_seq_release(c->pool, &seq);
    return 0;
}

static uint64_t seed = 0x6b76383072656600ull;
static int32_t rnd_id(int lo, int hi)
{
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (int32_t)((uint32_t)(seed >> 33) % (uint32_t)(hi - lo));
}

static int usage(const char *msg)
{
    fprintf(stderr, "kv_int8_ref: %s\n%s", msg, USAGE);
    return 2;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *lib = NULL, *full_arg = "0,3";
    long n_prompts = 4, plen = 64, nsteps = 32, threads = 2;
    lc_api api;
    config cf[MAX_CONFIGS];
    pair pr[MAX_PAIRS];
    int nc = 0, np_ = 0, rc = 1;
    void *lm = NULL;
    int32_t *prompt = NULL;
    float *logits = NULL;
    double *lr = NULL, *lq = NULL;
    qerr qe[2][2];

    lc_who = "kv_int8_ref";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--verbose")) {
            lc_verbose = 1;
            continue;
        }
        if (!v)
            return usage(!strcmp(a, "--help") ? "" : "an option without its value, or an unknown one");
        long n = strtol(v, &end, 10);
        int num_ok = end && end != v && *end == '\0';
        if (!strcmp(a, "--model"))
            model_path = v;
        else if (!strcmp(a, "--lib"))
            lib = v;
        else if (!strcmp(a, "--full-layers"))
            full_arg = v;
        else if (!strcmp(a, "--prompts") && num_ok && n >= 1 && n <= 1000)
            n_prompts = n;
        else if (!strcmp(a, "--prompt-len") && num_ok && n >= 2 && n <= 4096)
            plen = n;
        else if (!strcmp(a, "--steps") && num_ok && n >= 1 && n <= 4096)
            nsteps = n;
        else if (!strcmp(a, "--threads") && num_ok && n >= 1 && n <= 256)
            threads = n;
        else
            return usage("unknown option, or a value out of range (--prompts 1..1000, --prompt-len 2..4096, "
                         "--steps 1..4096, --threads 1..256)");
        i++;
    }
    if (!model_path)
        return usage("--model is required");
    steps = (int)nsteps;

    /* The configs: llama.cpp's four, kvgate's float32 and int8 ones. */
    memset(cf, 0, sizeof cf);
    static const struct { const char *name; lc_kv kv; } lcs[] = {
        { "lc-f32", { LC_GGML_TYPE_F32, LC_GGML_TYPE_F32, LC_FLASH_ATTN_DISABLED, 1 } },
        { "lc-f16", { LC_GGML_TYPE_F16, LC_GGML_TYPE_F16, LC_FLASH_ATTN_ENABLED, 1 } },
        { "lc-q8", { LC_GGML_TYPE_Q8_0, LC_GGML_TYPE_Q8_0, LC_FLASH_ATTN_ENABLED, 1 } },
        { "lc-q8-norot", { LC_GGML_TYPE_Q8_0, LC_GGML_TYPE_Q8_0, LC_FLASH_ATTN_ENABLED, 0 } },
    };
    for (size_t i = 0; i < sizeof lcs / sizeof lcs[0]; i++) {
        snprintf(cf[nc].name, sizeof cf[nc].name, "%s", lcs[i].name);
        cf[nc].is_lc = 1;
        cf[nc].kv = lcs[i].kv;
        cf[nc++].full_layers = -1;
    }
    const int LC_F32 = 0, LC_F16 = 1, LC_Q8 = 2, LC_Q8N = 3, KV_F32 = nc;
    snprintf(cf[nc].name, sizeof cf[nc].name, "kv-f32");
    cf[nc++].full_layers = -1;
    for (const char *p = full_arg; *p;) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 0 || n > 4096 || (*end && *end != ',') || nc == MAX_CONFIGS)
            return usage("--full-layers: a comma-separated list of layer counts 0..4096 (at most 7)");
        snprintf(cf[nc].name, sizeof cf[nc].name, "kv-i8-%ld", n);
        cf[nc++].full_layers = (int)n;
        p = *end ? end + 1 : end;
    }

    kvg_model_load_opts lo;
    memset(&lo, 0, sizeof lo);
    kvg_model *m = kvg_model_load(model_path, &lo, err, sizeof err);
    kvg_backend *be = m ? kvg_backend_cpu_new(m, (int)threads, err, sizeof err) : NULL;
    if (!be) {
        fprintf(stderr, "kv_int8_ref: %s\n", err);
        kvg_model_free(m);
        return 1;
    }
    V = m->cfg.vocab_size;
    if (m->cfg.head_dim > 1024 || m->cfg.head_dim % 32 != 0) {
        fprintf(stderr, "kv_int8_ref: head size %d: q8_0 K needs a multiple of 32 (at most 1024 here)\n",
                m->cfg.head_dim);
        goto out;
    }
    lc_load_api(&api, lib);
    lc = &api;
    lm = api.model_load_from_file(model_path, api.model_default_params());
    if (!lm)
        lc_die("llama_model_load_from_file failed (--verbose shows why)");
    if (api.vocab_n_tokens(api.model_get_vocab(lm)) != V) {
        fprintf(stderr, "kv_int8_ref: llama.cpp's vocabulary is %d tokens, kvgate's %d\n",
                api.vocab_n_tokens(api.model_get_vocab(lm)), V);
        goto out;
    }
    uint32_t n_ctx = (uint32_t)((plen + steps + 1 + 255) / 256 * 256);
    for (int i = 0; i < nc; i++) {
        config *c = &cf[i];
        if (c->is_lc) {
            c->ctx = lc_new_ctx_kv(&api, lm, n_ctx, (uint32_t)plen, 1, (int32_t)threads, &c->kv);
            c->rotated = lc_last.rot_k > 0 || lc_last.rot_v > 0;
            fprintf(stderr, "kv_int8_ref: %s: K/V %s/%s, flash attention %s, rotated %s\n", c->name,
                    lc_last.type_k, lc_last.type_v, lc_last.flash ? "on" : "off", c->rotated ? "yes" : "no");
            continue;
        }
        kvg_kv_geom g;
        kvg_forward_kv_geom(m, 16, &g);
        if (c->full_layers >= 0 && c->full_layers < m->cfg.n_layers) {
            g.dtype = KVG_KV_INT8;
            g.full_layers = c->full_layers;
        } else if (c->full_layers >= 0) {
            fprintf(stderr, "kv_int8_ref: %s: the model has %d layers, so it is float32 throughout\n", c->name,
                    m->cfg.n_layers);
        }
        c->pool = kvg_kv_pool_new(&g, (int32_t)((plen + steps + 1) / 16 + 2), err, sizeof err);
        c->fw = c->pool ? kvg_forward_new(m, be, c->pool, err, sizeof err) : NULL;
        if (!c->fw) {
            fprintf(stderr, "kv_int8_ref: %s: %s\n", c->name, err);
            goto out;
        }
    }
    /* The pairs. lc-q8-norot only where the rotation made it another config. */
    pr[np_++] = (pair){ LC_F16, LC_Q8, "(a) llama.cpp q8_0 vs its F16", 0, 0, 0, 0 };
    if (cf[LC_Q8].rotated)
        pr[np_++] = (pair){ LC_F16, LC_Q8N, "(a) llama.cpp q8_0 unrotated vs its F16", 0, 0, 0, 0 };
    pr[np_++] = (pair){ LC_F32, LC_Q8, "(a) llama.cpp q8_0 vs its F32", 0, 0, 0, 0 };
    pr[np_++] = (pair){ LC_F32, LC_F16, "(a) llama.cpp F16 vs its F32", 0, 0, 0, 0 };
    for (int i = KV_F32 + 1; i < nc; i++)
        pr[np_++] = (pair){ KV_F32, i, "(b) kvgate int8 vs its float32", 0, 0, 0, 0 };
    pr[np_++] = (pair){ KV_F32, LC_F32, "(c) llama.cpp F32 vs kvgate float32", 0, 0, 0, 0 };
    pr[np_++] = (pair){ KV_F32, LC_F16, "(c) llama.cpp F16 vs kvgate float32", 0, 0, 0, 0 };
    for (int k = 0; k < np_; k++)
        pr[k].min_agree = steps;

    printf("model %s: %d layers, %d KV heads x %d, vocab %d; llama.cpp %s; %ld prompts of %ld tokens, %d greedy "
           "steps, %ld threads\n", m->name, m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim, V, api.version(),
           n_prompts, plen, steps, threads);
    prompt = malloc((size_t)plen * sizeof(int32_t));
    logits = malloc((size_t)V * sizeof(float));
    lr = malloc((size_t)V * sizeof(double));
    lq = malloc((size_t)V * sizeof(double));
    memset(qe, 0, sizeof qe);
    if (!prompt || !logits || !lr || !lq)
        lc_die("out of memory");
    for (long p = 0; p < n_prompts; p++) {
        for (long i = 0; i < plen; i++)
            prompt[i] = i == 0 && m->bos >= 0 ? m->bos : rnd_id(3, V);
        for (int i = 0; i < nc; i++)
            cf[i].n_runs = 0, cf[i].own = -1;
        if (kv_rows(&cf[KV_F32], m, prompt, (int)plen, logits, qe) != 0) {
            fprintf(stderr, "kv_int8_ref: K/V rows: %s\n", err);
            goto out;
        }
        for (int k = 0; k < np_; k++) {
            pair *q = &pr[k];
            int agree;
            double gap, chosen, any;
            if (measure(&cf[q->ref], &cf[q->cand], prompt, (int)plen, lr, lq, &agree, &gap, &chosen, &any) != 0) {
                fprintf(stderr, "kv_int8_ref: %s: %s\n", cf[q->cand].name, err);
                goto out;
            }
            printf("prompt %ld  %-12s -> %-12s agree %3d/%d", p, cf[q->ref].name, cf[q->cand].name, agree, steps);
            if (agree < steps)
                printf(" (top-2 gap there %.3g)", gap);
            printf("  max |d logprob| chosen %.4g, any %.4g\n", chosen, any);
            q->n_all += agree == steps;
            q->min_agree = agree < q->min_agree ? agree : q->min_agree;
            q->dlp_chosen = fmax(q->dlp_chosen, chosen);
            q->dlp_any = fmax(q->dlp_any, any);
        }
        fflush(stdout);
    }
    printf("\n| pair | reference | candidate | prompts agreeing all %d steps | shortest agreement | "
           "max \\|d logprob\\| chosen | any |\n| --- | --- | --- | ---: | ---: | ---: | ---: |\n", steps);
    for (int k = 0; k < np_; k++)
        printf("| %s | %s | %s | %d/%ld | %d | %.3g | %.3g |\n", pr[k].what, cf[pr[k].ref].name,
               cf[pr[k].cand].name, pr[k].n_all, n_prompts, pr[k].min_agree, pr[k].dlp_chosen, pr[k].dlp_any);
    printf("\nK/V rows of the prompts (every layer and KV head), quantized: RMS error / RMS value, "
           "largest |error| / its row's max|x|\n");
    for (int kv = 0; kv < 2; kv++)
        printf("  %s: kvgate int8 (a float scale per %d values) %.4g, %.4g; q8_0 (an F16 scale per 32) %.4g, %.4g\n",
               kv ? "V" : "K", m->cfg.head_dim, sqrt(qe[kv][0].se / qe[kv][0].sx), qe[kv][0].max_rel,
               sqrt(qe[kv][1].se / qe[kv][1].sx), qe[kv][1].max_rel);
    rc = 0;
out:
    free(prompt);
    free(logits);
    free(lr);
    free(lq);
    for (int i = 0; i < nc; i++) {
        if (cf[i].ctx)
            api.free_ctx(cf[i].ctx);
        kvg_forward_free(cf[i].fw);
        kvg_kv_pool_free(cf[i].pool);
        for (int e = 0; e < MAX_RUNS; e++) {
            free(cf[i].path[e]);
            free(cf[i].rows[e]);
        }
    }
    if (lm)
        api.model_free(lm);
    kvg_backend_free(be);
    kvg_model_free(m);
    return rc;
}
