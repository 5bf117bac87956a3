/* kvgate-gpu-check: checks a backend (normally cuda) against a reference backend
 * (normally cpu) and against itself, through the public backend API only, so the same
 * program checks a real GPU, the emulated CUDA backend, or cpu against cpu.
 *
 * Checks (--check, comma-separated, or all):
 *   golden      greedy generation equals the golden ids of the model's golden file
 *               (stories260K's golden-greedy.json: the llama2.c reference, F32). A BF16
 *               backend may diverge: a divergence is accepted when it is a near tie, that
 *               is when the reference backend's logits, at that very position and prefix
 *               (the prefix before the first divergence is the golden one), have the
 *               golden token as their argmax and the token the backend chose within the
 *               tie tolerance below it (--tie-tol, default = the logits tolerance). Any
 *               other divergence fails (so "late" means: wherever the F32 reference
 *               itself nearly hesitates, whatever the index).
 *               The first divergent index is reported either way.
 *   logits      the logits of a few prompts (the golden prompts, plus a random prompt of
 *               --prompt-len ids) at the last prompt position and after each of --decode
 *               teacher-forced decode steps, backend vs reference. Per logits vector:
 *               scale = max(1, max|ref|); the vector passes when max|diff| <= tol * scale
 *               (--tol, default 0.03: BF16 keeps 8 significant bits, 2^-9 relative per
 *               rounding, compounded over the layers), and the argmax agrees unless the
 *               reference's own margin between the two tokens is within the tie tolerance.
 *   invariance  the backend against itself: one prompt's logits (last prompt position
 *               and --decode teacher-forced steps) computed as a plain whole-prompt
 *               prefill at batch 1, then prefilled in chunks (--chunks, 0 = whole), as a
 *               cache hit (the prefix's blocks prefilled by another sequence and shared
 *               with kvg_kv_seq_fork: block-aligned, and not aligned so the shared last
 *               block is copied on write), and at batch B (--batches: the sequence
 *               prefilling in one step beside B-1 others that decode, then decoding
 *               with them). Counts the logits whose bits differ. With --batch-invariant
 *               on (the default) every count must be 0; off, the counts are reported.
 *
 * One JSON object of results goes to --json FILE, a short summary to stdout. Exit
 * status: 0 all checks passed, 1 a check failed or a runtime error, 2 usage. */
#include <jansson.h>
#include <math.h>
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

static const char USAGE[] =
    "usage: kvgate-gpu-check --model PATH [options]\n"
    "\n"
    "Checks a backend against a reference backend and against itself (batch invariance);\n"
    "a summary on stdout, the results as one JSON object with --json.\n"
    "\n"
    "  --model PATH          llama2.c .bin, GGUF, Hugging Face directory or synthetic:NAME\n"
    "  --tokenizer PATH      tokenizer file (not needed: every check works on token ids)\n"
    "  --backend NAME        backend under test (default cuda)\n"
    "  --reference NAME      reference backend (default cpu)\n"
    "  --check LIST          golden, logits, invariance or all (default), comma-separated\n"
    "  --golden FILE         golden greedy file (default: golden-greedy.json beside a .bin\n"
    "                        model; golden is skipped when there is none)\n"
    "  --json FILE           write the results there\n"
    "  --batch-invariant on|off  the backend's mode (default on); off: invariance reports\n"
    "                        the counts of differing logits instead of failing\n"
    "  --device N            CUDA device ordinal (default 0)\n"
    "  --threads N           CPU threads of a cpu backend (default: all online CPUs)\n"
    "  --prompt-len N        random prompt length for logits and invariance (default 300)\n"
    "  --decode N            teacher-forced decode steps compared (default 8)\n"
    "  --batches LIST        invariance batch sizes (default 1,8,64)\n"
    "  --chunks LIST         invariance prefill chunk sizes, 0 = whole (default 1,7,64,0)\n"
    "  --golden-cases N      golden prompts used (default: all)\n"
    "  --tol X               logits tolerance relative to max(1, max|ref|) (default 0.03)\n"
    "  --tie-tol X           near-tie margin, in logits (default: tol * scale)\n"
    "  --block-tokens N      tokens per KV block (default 16)\n"
    "  --kv-dtype auto|int8  both backends' KV pools (kvgate-engine's flag; default auto)\n"
    "  --kv-full-precision-layers N  with --kv-dtype int8: full-precision layers (default 3)\n"
    "  --seed N              seed of the random prompts (default 1)\n"
    "  --help                show this help\n";

#define MAX_LIST 16

typedef struct opts {
    const char *model, *tokenizer, *backend, *reference, *golden, *json;
    int do_golden, do_logits, do_invariance;
    int batch_invariant, device, threads, prompt_len, n_decode, block_tokens, golden_cases;
    int kv_int8, kv_full;        /* --kv-dtype int8, --kv-full-precision-layers */
    int batches[MAX_LIST], n_batches, chunks[MAX_LIST], n_chunks;
    double tol, tie_tol;
    uint64_t seed;
} opts;

/* One backend with its pool and forward pass. */
typedef struct runner {
    const char *name;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
    int V;
} runner;

static int usage_error(const char *fmt, const char *a)
{
    return kvg_usage_error("kvgate-gpu-check", fmt, a);
}

/* --check LIST: which checks run (each option's dst is the whole opts). */
static int parse_checks(const char *v, void *dst, char *msg, size_t msg_len)
{
    opts *o = dst;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    o->do_golden = o->do_logits = o->do_invariance = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "golden") == 0)
            o->do_golden = 1;
        else if (strcmp(t, "logits") == 0)
            o->do_logits = 1;
        else if (strcmp(t, "invariance") == 0)
            o->do_invariance = 1;
        else if (strcmp(t, "all") == 0)
            o->do_golden = o->do_logits = o->do_invariance = 1;
        else {
            snprintf(msg, msg_len, "--check: unknown check '%s' (golden, logits, invariance, all)", t);
            return -1;
        }
    }
    return 0;
}

static int parse_kv_dtype(const char *v, void *dst, char *msg, size_t msg_len)
{
    (void)msg, (void)msg_len;
    if (strcmp(v, "auto") && strcmp(v, "int8"))
        return -1;
    ((opts *)dst)->kv_int8 = !strcmp(v, "int8");
    return 0;
}

static int parse_seed(const char *v, void *dst, char *msg, size_t msg_len)
{
    long l;
    (void)msg, (void)msg_len;
    if (kvg_arg_long(v, 0, INT32_MAX, &l))
        return -1;
    ((opts *)dst)->seed = (uint64_t)l;
    return 0;
}

static int parse_batches(const char *v, void *dst, char *msg, size_t msg_len)
{
    opts *o = dst;
    (void)msg, (void)msg_len;
    return kvg_arg_int_list(v, 1, 4096, o->batches, MAX_LIST, &o->n_batches) ? -1 : 0;
}

static int parse_chunks(const char *v, void *dst, char *msg, size_t msg_len)
{
    opts *o = dst;
    (void)msg, (void)msg_len;
    return kvg_arg_int_list(v, 0, 1 << 20, o->chunks, MAX_LIST, &o->n_chunks) ? -1 : 0;
}

static int parse_args(int argc, char **argv, opts *o)
{
    /* In USAGE's order. */
    const kvg_opt table[] = {
        { "--model", KVG_OPT_STR, &o->model, 0, 0, NULL, NULL },
        { "--tokenizer", KVG_OPT_STR, &o->tokenizer, 0, 0, NULL, NULL },
        { "--backend", KVG_OPT_STR, &o->backend, 0, 0, NULL, NULL },
        { "--reference", KVG_OPT_STR, &o->reference, 0, 0, NULL, NULL },
        { "--check", KVG_OPT_CUSTOM, o, 0, 0, NULL, parse_checks },
        { "--golden", KVG_OPT_STR, &o->golden, 0, 0, NULL, NULL },
        { "--json", KVG_OPT_STR, &o->json, 0, 0, NULL, NULL },
        { "--batch-invariant", KVG_OPT_ON_OFF, &o->batch_invariant, 0, 0,
          "--batch-invariant needs on or off, got '%s'", NULL },
        { "--device", KVG_OPT_INT, &o->device, 0, 1024, "--device needs an integer >= 0, got '%s'", NULL },
        { "--threads", KVG_OPT_INT, &o->threads, 1, 256, "--threads needs an integer in [1, 256], got '%s'",
          NULL },
        { "--prompt-len", KVG_OPT_INT, &o->prompt_len, 1, 1 << 20,
          "--prompt-len needs an integer >= 1, got '%s'", NULL },
        { "--decode", KVG_OPT_INT, &o->n_decode, 0, 4096, "--decode needs an integer in [0, 4096], got '%s'",
          NULL },
        { "--batches", KVG_OPT_CUSTOM, o, 0, 0, "--batches needs up to 16 sizes in [1, 4096], got '%s'",
          parse_batches },
        { "--chunks", KVG_OPT_CUSTOM, o, 0, 0, "--chunks needs up to 16 sizes >= 0, got '%s'", parse_chunks },
        { "--golden-cases", KVG_OPT_INT, &o->golden_cases, 0, 1000,
          "--golden-cases needs an integer >= 0, got '%s'", NULL },
        { "--tol", KVG_OPT_DOUBLE, &o->tol, 0, 1e6, "--tol needs a number >= 0, got '%s'", NULL },
        { "--tie-tol", KVG_OPT_DOUBLE, &o->tie_tol, 0, 1e6, "--tie-tol needs a number >= 0, got '%s'", NULL },
        { "--block-tokens", KVG_OPT_INT, &o->block_tokens, 1, 4096,
          "--block-tokens needs an integer in [1, 4096], got '%s'", NULL },
        { "--seed", KVG_OPT_CUSTOM, o, 0, 0, "--seed needs an integer >= 0, got '%s'", parse_seed },
        { "--kv-dtype", KVG_OPT_CUSTOM, o, 0, 0, "--kv-dtype: '%s' is not auto or int8", parse_kv_dtype },
        { "--kv-full-precision-layers", KVG_OPT_INT, &o->kv_full, 0, 4096,
          "--kv-full-precision-layers needs an integer in [0, 4096], got '%s'", NULL },
    };
    int rc;

    memset(o, 0, sizeof *o);
    o->backend = "cuda";
    o->reference = "cpu";
    o->do_golden = o->do_logits = o->do_invariance = 1;
    o->batch_invariant = 1;
    o->prompt_len = 300;
    o->n_decode = 8;
    o->tol = 0.03;
    o->tie_tol = -1;
    o->seed = 1;
    o->kv_full = 3;
    o->golden_cases = -1;
    o->n_batches = 3;
    o->batches[0] = 1, o->batches[1] = 8, o->batches[2] = 64;
    o->n_chunks = 4;
    o->chunks[0] = 1, o->chunks[1] = 7, o->chunks[2] = 64, o->chunks[3] = 0;
    rc = kvg_args_parse("kvgate-gpu-check", USAGE, argc, argv, table, sizeof table / sizeof table[0]);
    if (rc != 0)
        return rc;
    if (!o->model)
        return usage_error("%s", "--model is required");
    return 0;
}

/* ---- backends ---------------------------------------------------------------- */

/* The KV pool a backend's forward pass uses. Host memory today; a device backend's own
 * pool (device memory) is created here once the backend API offers it, and this is the
 * only place that changes. */
static kvg_kv_pool *pool_new(kvg_backend *be, const kvg_kv_geom *g, int32_t n_blocks,
                             char *err, size_t err_len)
{
    return kvg_backend_kv_pool_new(be, g, n_blocks, err, err_len);
}

static void runner_free(runner *r)
{
    kvg_forward_free(r->fw);
    kvg_kv_pool_free(r->kv);
    kvg_backend_free(r->be);
    memset(r, 0, sizeof *r);
}

static int runner_new(runner *r, const char *name, const kvg_model *m, const opts *o,
                      int32_t n_blocks, char *err, size_t err_len)
{
    kvg_backend_opts bo;
    kvg_kv_geom g;
    char e[1024];
    memset(r, 0, sizeof *r);
    memset(&bo, 0, sizeof bo);
    bo.n_threads = o->threads;
    bo.device = o->device;
    bo.batch_invariant = o->batch_invariant;
    r->name = name;
    r->V = m->cfg.vocab_size;
    r->be = kvg_backend_new_opts(name, m, &bo, e, sizeof e);
    if (!r->be) {
        snprintf(err, err_len, "backend %s: %s", name, e);
        return -1;
    }
    kvg_forward_kv_geom(m, o->block_tokens, &g);
    if (o->kv_int8) {
        /* int8 KV past kv_full layers, in both backends' layouts (the same quantization) */
        g.dtype = KVG_KV_INT8;
        g.full_layers = o->kv_full;
    }
    r->kv = pool_new(r->be, &g, n_blocks, e, sizeof e);
    if (!r->kv) {
        snprintf(err, err_len, "backend %s: KV pool of %ld blocks: %s", name, (long)n_blocks, e);
        runner_free(r);
        return -1;
    }
    r->fw = kvg_forward_new(m, r->be, r->kv, e, sizeof e);
    if (!r->fw) {
        snprintf(err, err_len, "backend %s: %s", name, e);
        runner_free(r);
        return -1;
    }
    return 0;
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])             /* ties: the lowest id, as llama2.c */
            best = i;
    return best;
}

/* One step of one sequence. */
static int step1(runner *r, kvg_kv_seq *s, const int32_t *toks, int n, float *logits,
                 char *err, size_t err_len)
{
    kvg_fwd_seq fs = { .kv = s, .tokens = toks, .n_tokens = n, .logits = logits };
    char e[1024];
    if (kvg_forward_step(r->fw, &fs, 1, e, sizeof e) != 0) {
        snprintf(err, err_len, "%s: step at position %d (%d tokens): %s", r->name, s->n_tokens, n, e);
        return -1;
    }
    return 0;
}

/* A trace: the prompt prefilled in chunks of `chunk` tokens (0: whole), then n_dec decode
 * steps. out gets (n_dec + 1) logits vectors: after the prompt and after each decode
 * token. dec: the decode tokens (teacher forcing), or NULL for greedy, whose picks go to
 * picked[n_dec + 1] (the argmax of each vector; may be NULL). `s` starts as given (empty,
 * or a fork holding a cached prefix whose length is skip) and is released at the end. */
static int run_trace(runner *r, kvg_kv_seq *s, const int32_t *prompt, int L, int skip, int chunk,
                     const int32_t *dec, int n_dec, float *out, int32_t *picked,
                     char *err, size_t err_len)
{
    int rc = 0;
    for (int done = skip; done < L && rc == 0;) {
        int n = chunk > 0 && L - done > chunk ? chunk : L - done;
        rc = step1(r, s, prompt + done, n, done + n == L ? out : NULL, err, err_len);
        done += n;
    }
    for (int i = 0; i < n_dec && rc == 0; i++) {
        int32_t t = dec ? dec[i] : argmax(out + (size_t)i * r->V, r->V);
        rc = step1(r, s, &t, 1, out + (size_t)(i + 1) * r->V, err, err_len);
    }
    if (rc == 0 && picked)
        for (int i = 0; i <= n_dec; i++)
            picked[i] = argmax(out + (size_t)i * r->V, r->V);
    kvg_kv_seq_release(r->kv, s);
    return rc;
}

static int run_plain(runner *r, const int32_t *prompt, int L, int chunk, const int32_t *dec, int n_dec,
                     float *out, int32_t *picked, char *err, size_t err_len)
{
    kvg_kv_seq s;
    kvg_kv_seq_init(&s);
    return run_trace(r, &s, prompt, L, 0, chunk, dec, n_dec, out, picked, err, err_len);
}

/* ---- comparisons --------------------------------------------------------------- */

typedef struct cmp {
    double max_abs, max_rel;     /* max |diff|, and max |diff| / max(1, max|ref|) */
    int vectors, argmax_agree, argmax_tie, failed;
} cmp;

static void compare_vec(const float *got, const float *ref, int V, double tol, double tie_tol, cmp *c)
{
    double scale = 1, d = 0;
    int ag = argmax(got, V), ar = argmax(ref, V);
    for (int i = 0; i < V; i++)
        if (fabs(ref[i]) > scale)
            scale = fabs(ref[i]);
    for (int i = 0; i < V; i++) {
        double x = fabs((double)got[i] - ref[i]);
        if (!(x <= d))                  /* NaN counts as the worst */
            d = isnan(x) ? INFINITY : x;
    }
    c->vectors++;
    if (d > c->max_abs)
        c->max_abs = d;
    if (d / scale > c->max_rel)
        c->max_rel = d / scale;
    if (!(d <= tol * scale))
        c->failed++;
    if (ag == ar) {
        c->argmax_agree++;
    } else if ((double)ref[ar] - ref[ag] <= (tie_tol >= 0 ? tie_tol : tol * scale)) {
        c->argmax_tie++;                /* a near tie in the reference itself */
    } else {
        c->failed++;
    }
}

static long count_bits_differ(const float *a, const float *b, size_t n)
{
    long k = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0)
            k++;
    return k;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random ids in [3, V) (past the usual <unk>, BOS, EOS), BOS first when the model has one. */
static void random_prompt(uint64_t *st, const kvg_model *m, int32_t *p, int L)
{
    int V = m->cfg.vocab_size, lo = V > 8 ? 3 : 0;
    for (int i = 0; i < L; i++)
        p[i] = (int32_t)(lo + (int)(rng_next(st) % (uint64_t)(V - lo)));
    if (m->bos >= 0 && L > 0)
        p[0] = m->bos;
}

/* ---- golden ------------------------------------------------------------------ */

typedef struct gcase {
    int32_t *prompt, *ids;
    int n_prompt, n_ids;
} gcase;

static int ids_from_json(json_t *a, int32_t **out, int *n)
{
    size_t k = json_array_size(a);
    *out = NULL;
    *n = 0;
    if (!json_is_array(a) || k == 0)
        return -1;
    *out = malloc(k * sizeof **out);
    if (!*out)
        return -1;
    for (size_t i = 0; i < k; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v))
            return -1;
        (*out)[i] = (int32_t)json_integer_value(v);
    }
    *n = (int)k;
    return 0;
}

static void gcases_free(gcase *c, int n)
{
    for (int i = 0; i < n; i++) {
        free(c[i].prompt);
        free(c[i].ids);
    }
    free(c);
}

/* golden-greedy.json: { "cases": [ { "prompt_ids": [...], "greedy_ids": [...] }, ... ] } */
static int load_golden(const char *path, int V, gcase **out, int *n_out, char *err, size_t err_len)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je), *cases;
    gcase *c;
    size_t n;
    *out = NULL;
    *n_out = 0;
    if (!root) {
        snprintf(err, err_len, "%s: %s (line %d)", path, je.text, je.line);
        return -1;
    }
    cases = json_object_get(root, "cases");
    n = json_array_size(cases);
    c = calloc(n ? n : 1, sizeof *c);
    if (!c || n == 0) {
        snprintf(err, err_len, "%s: no \"cases\"", path);
        free(c);
        json_decref(root);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(cases, i);
        int bad = ids_from_json(json_object_get(e, "prompt_ids"), &c[i].prompt, &c[i].n_prompt) ||
                  ids_from_json(json_object_get(e, "greedy_ids"), &c[i].ids, &c[i].n_ids);
        for (int k = 0; !bad && k < c[i].n_prompt; k++)
            bad = c[i].prompt[k] < 0 || c[i].prompt[k] >= V;
        if (bad) {
            snprintf(err, err_len, "%s: case %zu: bad prompt_ids/greedy_ids", path, i);
            gcases_free(c, (int)n);
            json_decref(root);
            return -1;
        }
    }
    json_decref(root);
    *out = c;
    *n_out = (int)n;
    return 0;
}

/* Returns 0 passed, 1 failed, -1 runtime error; results into j. */
static int check_golden(const opts *o, const kvg_model *m, runner *be, runner *ref, const gcase *gc,
                        int n, const char *path, json_t *j, char *err, size_t err_len)
{
    int fails = 0, V = m->cfg.vocab_size;
    json_t *arr = json_array();
    json_object_set_new(j, "file", json_string(path));
    json_object_set_new(j, "cases", arr);
    for (int i = 0; i < n; i++) {
        const gcase *c = &gc[i];
        int n_dec = c->n_ids - 1, div = -1, near_tie = 0;
        double margin = 0;
        float *lg = malloc((size_t)c->n_ids * V * sizeof *lg);
        int32_t *got = malloc((size_t)c->n_ids * sizeof *got);
        json_t *jc = json_object();
        if (!lg || !got) {
            free(lg);
            free(got);
            json_decref(jc);
            snprintf(err, err_len, "out of memory");
            return -1;
        }
        if (c->n_prompt + n_dec > m->cfg.max_seq_len) {
            n_dec = m->cfg.max_seq_len - c->n_prompt;
        }
        if (run_plain(be, c->prompt, c->n_prompt, 0, NULL, n_dec, lg, got, err, err_len) != 0) {
            free(lg);
            free(got);
            json_decref(jc);
            return -1;
        }
        for (int k = 0; k <= n_dec && div < 0; k++)
            if (got[k] != c->ids[k])
                div = k;
        if (div >= 0) {
            /* The reference on the same prefix (the golden ids up to div). */
            if (run_plain(ref, c->prompt, c->n_prompt, 0, c->ids, div, lg, NULL, err, err_len) != 0) {
                free(lg);
                free(got);
                json_decref(jc);
                return -1;
            }
            {
                const float *r = lg + (size_t)div * V;
                double scale = 1;
                for (int v = 0; v < V; v++)
                    if (fabs(r[v]) > scale)
                        scale = fabs(r[v]);
                /* Accepted only when the reference reproduces the golden token there (else
                 * the model and the golden file do not belong together) and prefers it
                 * over the backend's pick by no more than the tie tolerance. */
                margin = (double)r[c->ids[div]] - r[got[div]];
                near_tie = argmax(r, V) == c->ids[div] &&
                           margin <= (o->tie_tol >= 0 ? o->tie_tol : o->tol * scale);
            }
            if (!near_tie)
                fails++;
        }
        json_object_set_new(jc, "prompt_len", json_integer(c->n_prompt));
        json_object_set_new(jc, "compared", json_integer(n_dec + 1));
        json_object_set_new(jc, "first_divergence", json_integer(div));
        if (div >= 0) {
            json_object_set_new(jc, "golden_id", json_integer(c->ids[div]));
            json_object_set_new(jc, "got_id", json_integer(got[div]));
            json_object_set_new(jc, "reference_margin", json_real(margin));
            json_object_set_new(jc, "near_tie", json_boolean(near_tie));
        }
        json_array_append_new(arr, jc);
        printf("  golden case %d: %d ids, %s", i, n_dec + 1, div < 0 ? "identical\n" : "");
        if (div >= 0)
            printf("first divergence at %d (golden %d, got %d; reference margin %.4g: %s)\n", div,
                   c->ids[div], got[div], margin, near_tie ? "a near tie, accepted" : "FAIL");
        free(lg);
        free(got);
    }
    return fails ? 1 : 0;
}

/* ---- logits vs the reference ---------------------------------------------------- */

static int check_logits(const opts *o, const kvg_model *m, runner *be, runner *ref, const gcase *gc,
                        int n_gc, json_t *j, char *err, size_t err_len)
{
    int V = m->cfg.vocab_size, n_dec = o->n_decode, fails = 0;
    int n_prompts = n_gc + 1, L_rand = o->prompt_len;
    cmp all;
    json_t *arr = json_array();
    uint64_t st = o->seed;
    int32_t *rand_p, *dec;
    float *a, *b;
    memset(&all, 0, sizeof all);
    if (L_rand + n_dec > m->cfg.max_seq_len)
        L_rand = m->cfg.max_seq_len - n_dec;
    rand_p = malloc((size_t)(L_rand > 0 ? L_rand : 1) * sizeof *rand_p);
    dec = malloc((size_t)(n_dec + 1) * sizeof *dec);
    a = malloc((size_t)(n_dec + 1) * V * sizeof *a);
    b = malloc((size_t)(n_dec + 1) * V * sizeof *b);
    if (!rand_p || !dec || !a || !b) {
        free(rand_p), free(dec), free(a), free(b);
        json_decref(arr);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    random_prompt(&st, m, rand_p, L_rand);
    json_object_set_new(j, "tol", json_real(o->tol));
    json_object_set_new(j, "prompts", arr);
    for (int p = 0; p < n_prompts; p++) {
        const int32_t *pr = p < n_gc ? gc[p].prompt : rand_p;
        int L = p < n_gc ? gc[p].n_prompt : L_rand;
        cmp c;
        json_t *jp = json_object();
        memset(&c, 0, sizeof c);
        if (L < 1 || L + n_dec > m->cfg.max_seq_len) {
            json_decref(jp);
            continue;
        }
        /* The reference picks the decode tokens; the backend is teacher-forced with them,
         * so both see the very same inputs at every position. */
        if (run_plain(ref, pr, L, 0, NULL, n_dec, b, dec, err, err_len) != 0 ||
            run_plain(be, pr, L, 0, dec, n_dec, a, NULL, err, err_len) != 0) {
            free(rand_p), free(dec), free(a), free(b);
            json_decref(jp);
            return -1;
        }
        for (int k = 0; k <= n_dec; k++)
            compare_vec(a + (size_t)k * V, b + (size_t)k * V, V, o->tol, o->tie_tol, &c);
        json_object_set_new(jp, "prompt_len", json_integer(L));
        json_object_set_new(jp, "vectors", json_integer(c.vectors));
        json_object_set_new(jp, "max_abs", json_real(c.max_abs));
        json_object_set_new(jp, "max_rel", json_real(c.max_rel));
        json_object_set_new(jp, "argmax_agree", json_integer(c.argmax_agree));
        json_object_set_new(jp, "argmax_near_tie", json_integer(c.argmax_tie));
        json_object_set_new(jp, "failed_vectors", json_integer(c.failed));
        json_array_append_new(arr, jp);
        printf("  logits prompt %d (%d ids, %d vectors): max|diff| %.3g, max rel %.3g, argmax %d/%d agree"
               "%s%s\n", p, L, c.vectors, c.max_abs, c.max_rel, c.argmax_agree, c.vectors,
               c.argmax_tie ? " (other: near ties)" : "", c.failed ? ": FAIL" : "");
        fails += c.failed;
        all.vectors += c.vectors;
        if (c.max_abs > all.max_abs)
            all.max_abs = c.max_abs;
        if (c.max_rel > all.max_rel)
            all.max_rel = c.max_rel;
        all.argmax_agree += c.argmax_agree;
    }
    json_object_set_new(j, "max_abs", json_real(all.max_abs));
    json_object_set_new(j, "max_rel", json_real(all.max_rel));
    json_object_set_new(j, "argmax_agree", json_integer(all.argmax_agree));
    json_object_set_new(j, "vectors", json_integer(all.vectors));
    free(rand_p), free(dec), free(a), free(b);
    return fails ? 1 : 0;
}

/* ---- invariance ----------------------------------------------------------------- */

static void variant_result(json_t *arr, const char *name, const float *got, const float *base,
                           int n_vec, int V, int strict, int *fails)
{
    long diff = count_bits_differ(got, base, (size_t)n_vec * V);
    int tok_same = 0;
    json_t *jv = json_object();
    for (int k = 0; k < n_vec; k++)
        tok_same += argmax(got + (size_t)k * V, V) == argmax(base + (size_t)k * V, V);
    json_object_set_new(jv, "name", json_string(name));
    json_object_set_new(jv, "differing_logits", json_integer(diff));
    json_object_set_new(jv, "logits", json_integer((json_int_t)n_vec * V));
    json_object_set_new(jv, "tokens_equal", json_integer(tok_same));
    json_object_set_new(jv, "tokens", json_integer(n_vec));
    json_array_append_new(arr, jv);
    printf("  invariance %-18s %ld of %ld logits differ, %d/%d tokens equal%s\n", name, diff,
           (long)n_vec * V, tok_same, n_vec, strict && (diff || tok_same != n_vec) ? ": FAIL" : "");
    if (strict && (diff || tok_same != n_vec))
        (*fails)++;
}

/* The target prefills its prompt in one step beside B-1 sequences that decode (their
 * prompts were prefilled in the step before), then all decode together. */
static int run_batch(runner *r, const kvg_model *m, const int32_t *prompt, int L, const int32_t *dec,
                     int n_dec, int B, uint64_t seed, float *out, char *err, size_t err_len)
{
    int V = m->cfg.vocab_size, t = B / 2, rc = 0, maxo = L;
    kvg_kv_seq *seqs = calloc((size_t)B, sizeof *seqs);
    kvg_fwd_seq *fs = calloc((size_t)B, sizeof *fs);
    int32_t *others = malloc((size_t)B * (L + 1) * sizeof *others);
    int32_t *next = malloc((size_t)B * sizeof *next);
    int *olen = malloc((size_t)B * sizeof *olen);
    float *lg = malloc((size_t)B * V * sizeof *lg);
    uint64_t st = seed;
    char e[1024];
    if (!seqs || !fs || !others || !next || !olen || !lg) {
        snprintf(err, err_len, "out of memory");
        rc = -1;
        goto out;
    }
    for (int i = 0; i < B; i++) {
        kvg_kv_seq_init(&seqs[i]);
        /* Other prompts of 1..L ids, so their lengths (and block counts) differ. */
        olen[i] = 1 + (int)(rng_next(&st) % (uint64_t)maxo);
        random_prompt(&st, m, others + (size_t)i * (L + 1), olen[i]);
    }
    /* Step 1: the others' prompts. */
    {
        int n = 0;
        for (int i = 0; i < B; i++)
            if (i != t)
                fs[n++] = (kvg_fwd_seq){ .kv = &seqs[i], .tokens = others + (size_t)i * (L + 1),
                                         .n_tokens = olen[i], .logits = lg + (size_t)i * V };
        if (n > 0 && kvg_forward_step(r->fw, fs, n, e, sizeof e) != 0) {
            snprintf(err, err_len, "%s: batch %d, prefill of the others: %s", r->name, B, e);
            rc = -1;
            goto out;
        }
        for (int i = 0; i < B; i++)
            next[i] = i == t ? 0 : (int32_t)argmax(lg + (size_t)i * V, V);
    }
    /* Step 2: the target's prompt beside the others' decode; then n_dec decode steps. */
    for (int k = 0; k <= n_dec && rc == 0; k++) {
        int n = 0;
        for (int i = 0; i < B; i++) {
            if (i != t && seqs[i].n_tokens + 1 > m->cfg.max_seq_len)
                continue;               /* that one is full: it just stops */
            fs[n++] = (kvg_fwd_seq){ .kv = &seqs[i],
                                     .tokens = i == t ? (k == 0 ? prompt : &dec[k - 1]) : &next[i],
                                     .n_tokens = i == t && k == 0 ? L : 1,
                                     .logits = i == t ? out + (size_t)k * V : lg + (size_t)i * V };
        }
        if (kvg_forward_step(r->fw, fs, n, e, sizeof e) != 0) {
            snprintf(err, err_len, "%s: batch %d, step %d: %s", r->name, B, k, e);
            rc = -1;
            break;
        }
        for (int i = 0; i < B; i++)
            if (i != t)
                next[i] = (int32_t)argmax(lg + (size_t)i * V, V);
    }
out:
    for (int i = 0; seqs && i < B; i++)
        kvg_kv_seq_release(r->kv, &seqs[i]);
    free(seqs), free(fs), free(others), free(next), free(olen), free(lg);
    return rc;
}

static int check_invariance(const opts *o, const kvg_model *m, runner *be, json_t *j, char *err,
                            size_t err_len)
{
    int V = m->cfg.vocab_size, n_dec = o->n_decode, L = o->prompt_len, fails = 0;
    int bt = be->kv->geom.block_tokens, nv;
    int strict = o->batch_invariant;
    uint64_t st = o->seed + 7;
    int32_t *prompt, *dec;
    float *base, *got;
    json_t *arr = json_array();
    char name[64];
    int rc = 0;
    if (L + n_dec > m->cfg.max_seq_len)
        L = m->cfg.max_seq_len - n_dec;
    if (L < 2) {
        json_decref(arr);
        snprintf(err, err_len, "invariance: the model's context is too short");
        return -1;
    }
    nv = n_dec + 1;
    prompt = malloc((size_t)L * sizeof *prompt);
    dec = malloc((size_t)nv * sizeof *dec);
    base = malloc((size_t)nv * V * sizeof *base);
    got = malloc((size_t)nv * V * sizeof *got);
    if (!prompt || !dec || !base || !got) {
        free(prompt), free(dec), free(base), free(got);
        json_decref(arr);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    random_prompt(&st, m, prompt, L);
    json_object_set_new(j, "batch_invariant", json_boolean(o->batch_invariant));
    json_object_set_new(j, "prompt_len", json_integer(L));
    json_object_set_new(j, "decode", json_integer(n_dec));
    json_object_set_new(j, "variants", arr);
    /* The baseline: whole prompt, batch 1, greedy; its picks are the decode tokens. */
    if (run_plain(be, prompt, L, 0, NULL, n_dec, base, dec, err, err_len) != 0) {
        rc = -1;
        goto out;
    }
    /* Repeating the baseline catches nondeterminism that is not about batches at all. */
    if (run_plain(be, prompt, L, 0, dec, n_dec, got, NULL, err, err_len) != 0) {
        rc = -1;
        goto out;
    }
    variant_result(arr, "repeat", got, base, nv, V, strict, &fails);
    for (int c = 0; c < o->n_chunks; c++) {
        if (o->chunks[c] == 0 || o->chunks[c] >= L)
            continue;                   /* whole: the baseline itself */
        if (run_plain(be, prompt, L, o->chunks[c], dec, n_dec, got, NULL, err, err_len) != 0) {
            rc = -1;
            goto out;
        }
        snprintf(name, sizeof name, "chunk:%d", o->chunks[c]);
        variant_result(arr, name, got, base, nv, V, strict, &fails);
    }
    /* Cache hits: a block-aligned prefix (what the prefix cache shares) and an unaligned
     * one (the fork shares a partial block, copied on the first write). */
    for (int pass = 0; pass < 2; pass++) {
        int pre = (L / 2 / bt) * bt;
        kvg_kv_seq src, dst;
        char e[1024];
        if (pass == 1)
            pre = pre + bt / 2 + 1 < L ? pre + bt / 2 + 1 : L - 1;
        if (pre < 1 || pre >= L)
            continue;
        kvg_kv_seq_init(&src);
        kvg_kv_seq_init(&dst);
        if (step1(be, &src, prompt, pre, NULL, err, err_len) != 0 ||
            kvg_kv_seq_fork(be->kv, &src, &dst, e, sizeof e) != 0) {
            if (!err[0])
                snprintf(err, err_len, "fork: %s", e);
            kvg_kv_seq_release(be->kv, &src);
            rc = -1;
            goto out;
        }
        /* The fork continues while the source still holds the shared blocks (the last
         * one copied on write when the prefix is not aligned) ... */
        rc = run_trace(be, &dst, prompt, L, pre, 0, dec, n_dec, got, NULL, err, err_len);
        if (rc != 0) {
            kvg_kv_seq_release(be->kv, &src);
            goto out;
        }
        snprintf(name, sizeof name, "cache-hit:%d%s", pre, pass ? "-cow" : "");
        variant_result(arr, name, got, base, nv, V, strict, &fails);
        /* ... then the source continues: the fork's writes must not have reached it. */
        rc = run_trace(be, &src, prompt, L, pre, 0, dec, n_dec, got, NULL, err, err_len);
        if (rc != 0)
            goto out;
        snprintf(name, sizeof name, "cache-src:%d%s", pre, pass ? "-cow" : "");
        variant_result(arr, name, got, base, nv, V, strict, &fails);
    }
    for (int b = 0; b < o->n_batches; b++) {
        if (o->batches[b] <= 1)
            continue;                   /* batch 1: the baseline */
        if (run_batch(be, m, prompt, L, dec, n_dec, o->batches[b], o->seed + 100 + (uint64_t)b, got, err,
                      err_len) != 0) {
            rc = -1;
            goto out;
        }
        snprintf(name, sizeof name, "batch:%d", o->batches[b]);
        variant_result(arr, name, got, base, nv, V, strict, &fails);
    }
out:
    free(prompt), free(dec), free(base), free(got);
    return rc < 0 ? -1 : fails ? 1 : 0;
}

/* ---- main ------------------------------------------------------------------------ */

static const char *status_name(int rc)
{
    return rc == 0 ? "pass" : rc == 1 ? "fail" : rc == 2 ? "skipped" : "error";
}

static char *golden_beside(const char *model)
{
    size_t n = strlen(model);
    const char *slash = strrchr(model, '/');
    char *p;
    FILE *f;
    if (n < 4 || strcmp(model + n - 4, ".bin") != 0)
        return NULL;
    n = slash ? (size_t)(slash - model) + 1 : 0;
    p = malloc(n + sizeof "golden-greedy.json");
    if (!p)
        return NULL;
    memcpy(p, model, n);
    strcpy(p + n, "golden-greedy.json");
    f = fopen(p, "r");
    if (!f) {
        free(p);
        return NULL;
    }
    fclose(f);
    return p;
}

/* A llama2.c checkpoint needs a tokenizer; the golden file names the one it was made
 * with ("tokenizer": "tok512.bin"), looked for beside the golden file. */
static char *golden_tokenizer(const char *golden)
{
    json_t *root = golden ? json_load_file(golden, 0, NULL) : NULL;
    const char *t = json_string_value(json_object_get(root, "tokenizer"));
    const char *slash = golden ? strrchr(golden, '/') : NULL;
    size_t n = slash ? (size_t)(slash - golden) + 1 : 0;
    char *p = NULL;
    FILE *f;
    if (t && !strchr(t, '/') && (p = malloc(n + strlen(t) + 1))) {
        memcpy(p, golden, n);
        strcpy(p + n, t);
        if ((f = fopen(p, "r")))
            fclose(f);
        else
            free(p), p = NULL;
    }
    json_decref(root);
    return p;
}

int main(int argc, char **argv)
{
    opts o;
    char err[2048] = "";
    kvg_model_load_opts lo;
    kvg_model *m;
    runner be, ref;
    int rc, failed = 0, n_gc = 0, need_ref, maxB = 1, bt;
    int32_t blocks;
    gcase *gc = NULL;
    char *golden = NULL, *tok = NULL;
    json_t *root = json_object();
    double t0 = kvg_mono_s();
    memset(&be, 0, sizeof be);
    memset(&ref, 0, sizeof ref);
    if ((rc = parse_args(argc, argv, &o)) != 0)
        return rc;

    golden = o.golden ? strdup(o.golden) : golden_beside(o.model);
    memset(&lo, 0, sizeof lo);
    lo.tokenizer_path = o.tokenizer ? o.tokenizer : (tok = golden_tokenizer(golden));
    m = kvg_model_load(o.model, &lo, err, sizeof err);
    free(tok);
    if (!m) {
        fprintf(stderr, "kvgate-gpu-check: %s\n", err);
        free(golden);
        return 1;
    }
    if (golden && load_golden(golden, m->cfg.vocab_size, &gc, &n_gc, err, sizeof err) != 0) {
        fprintf(stderr, "kvgate-gpu-check: golden: %s\n", err);
        kvg_model_free(m);
        free(golden);
        return 1;
    }
    if (o.golden_cases >= 0 && o.golden_cases < n_gc) {
        for (int i = o.golden_cases; i < n_gc; i++)
            free(gc[i].prompt), free(gc[i].ids);
        n_gc = o.golden_cases;
    }

    /* Pool sizes: the longest single trace (a golden case or the random prompt, plus the
     * decode steps, plus a cached prefix held beside it), or the largest batch. */
    bt = o.block_tokens ? o.block_tokens : KVG_KV_BLOCK_TOKENS_DEFAULT;
    for (int b = 0; b < o.n_batches; b++)
        if (o.batches[b] > maxB)
            maxB = o.batches[b];
    {
        int64_t per_seq = ((int64_t)m->cfg.max_seq_len < o.prompt_len + o.n_decode + 256
                               ? m->cfg.max_seq_len
                               : o.prompt_len + o.n_decode + 256) / bt + 2;
        int64_t nb = per_seq * ((maxB > 2 ? maxB : 2) + 1);
        blocks = nb > INT32_MAX ? INT32_MAX : (int32_t)nb;
    }
    need_ref = o.do_logits || (o.do_golden && n_gc > 0);

    json_object_set_new(root, "tool", json_string("kvgate-gpu-check"));
    json_object_set_new(root, "model", json_string(m->name));
    json_object_set_new(root, "model_path", json_string(o.model));
    json_object_set_new(root, "backend", json_string(o.backend));
    json_object_set_new(root, "reference", json_string(o.reference));
    json_object_set_new(root, "batch_invariant", json_boolean(o.batch_invariant));
    json_object_set_new(root, "kv_dtype", json_string(o.kv_int8 ? "int8" : "auto"));
    if (o.kv_int8)
        json_object_set_new(root, "kv_full_precision_layers", json_integer(o.kv_full));
    printf("kvgate-gpu-check: %s on %s (reference %s), batch-invariant %s\n", m->name, o.backend,
           o.reference, o.batch_invariant ? "on" : "off");

    if (runner_new(&be, o.backend, m, &o, blocks, err, sizeof err) != 0 ||
        (need_ref && runner_new(&ref, o.reference, m, &o, blocks / (maxB > 2 ? maxB : 2) + 8, err,
                                sizeof err) != 0)) {
        fprintf(stderr, "kvgate-gpu-check: %s\n", err);
        json_object_set_new(root, "error", json_string(err));
        json_object_set_new(root, "ok", json_false());
        if (o.json)
            json_dump_file(root, o.json, JSON_INDENT(2));
        failed = 1;
        goto done;
    }

    {
        static const char *names[3] = { "golden", "logits", "invariance" };
        int want[3] = { o.do_golden, o.do_logits, o.do_invariance };
        for (int c = 0; c < 3; c++) {
            json_t *j = json_object();
            double tc = kvg_mono_s();
            if (!want[c]) {
                json_decref(j);
                continue;
            }
            err[0] = 0;
            if (c == 0)
                rc = n_gc > 0 ? check_golden(&o, m, &be, &ref, gc, n_gc, golden, j, err, sizeof err) : 2;
            else if (c == 1)
                rc = check_logits(&o, m, &be, &ref, gc, n_gc, j, err, sizeof err);
            else
                rc = check_invariance(&o, m, &be, j, err, sizeof err);
            if (rc == 2)
                json_object_set_new(j, "reason", json_string("no golden file for this model"));
            if (rc < 0) {
                json_object_set_new(j, "error", json_string(err));
                fprintf(stderr, "kvgate-gpu-check: %s: %s\n", names[c], err);
            }
            json_object_set_new(j, "status", json_string(status_name(rc)));
            json_object_set_new(j, "seconds", json_real(kvg_mono_s() - tc));
            json_object_set_new(root, names[c], j);
            printf("%s: %s (%.2f s)\n", names[c], status_name(rc), kvg_mono_s() - tc);
            if (rc == 1 || rc < 0)
                failed = 1;
        }
    }
    json_object_set_new(root, "ok", json_boolean(!failed));
    json_object_set_new(root, "seconds", json_real(kvg_mono_s() - t0));
    if (o.json && json_dump_file(root, o.json, JSON_INDENT(2)) != 0) {
        fprintf(stderr, "kvgate-gpu-check: cannot write %s\n", o.json);
        failed = 1;
    }
    printf("%s\n", failed ? "FAILED" : "all checks passed");
done:
    runner_free(&be);
    runner_free(&ref);
    gcases_free(gc, n_gc);
    free(golden);
    json_decref(root);
    kvg_model_free(m);
    return failed ? 1 : 0;
}
