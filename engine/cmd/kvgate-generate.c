/* kvgate-generate: run one prompt through the engine offline and print the continuation.
 *
 * Exit status: 0 ok, 1 model/runtime error, 2 usage. */
#include <errno.h>
#include <float.h>
#include "monoclock.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "backend.h"
#include "cliargs.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "sampler.h"
#include "tokenizer.h"

static const char USAGE[] =
    "usage: kvgate-generate --model PATH [options] (--prompt TEXT | --prompt-file F | --prompt-ids IDS)\n"
    "\n"
    "Runs one prompt offline and prints the continuation on stdout; the prompt length,\n"
    "prefill and decode speeds go to stderr.\n"
    "\n"
    "  --model PATH        llama2.c .bin, GGUF file, Hugging Face directory or synthetic:NAME\n"
    "  --tokenizer PATH    tokenizer file (llama2.c models need one)\n"
    "  --backend NAME      cpu (default) or cuda (an NVIDIA GPU)\n"
    "  --device N          cuda: the GPU to use (default 0)\n"
    "  --batch-invariant on|off  cuda: pinned GEMM algorithms and fixed attention splits\n"
    "                      (on, default) or the fastest kernels for each shape (off)\n"
    "  --prompt TEXT       prompt text (BOS is prepended when the vocabulary asks for it)\n"
    "  --prompt-file F     prompt text read from a file\n"
    "  --prompt-ids IDS    prompt token ids, used verbatim (\"1 2 3\" or \"1,2,3\")\n"
    "  --no-bos            do not prepend BOS to a text prompt\n"
    "  --max-tokens N      generate at most N tokens (default 256)\n"
    "  --steps N           llama2.c run.c limit: at most N positions in total, prompt\n"
    "                      included; the token chosen at the last position is printed\n"
    "  --stop IDS          token ids that end generation (not printed); default: EOS, and\n"
    "                      BOS too for llama2.c models (as run.c); \"none\" for no stop ids\n"
    "  --temperature T     0 = greedy (default 1.0)\n"
    "  --top-p P           nucleus sampling (default 1 = off)\n"
    "  --top-k K           keep the K most likely tokens (default 0 = off)\n"
    "  --seed S            sampling seed (default 0)\n"
    "  --ids               print generated token ids instead of text\n"
    "  --logprobs          with --ids, print \"id logprob\" per line\n"
    "  --threads N         CPU threads (default: all online CPUs)\n"
    "  --prefill-chunk N   prefill the prompt N tokens per step (default: all at once)\n"
    "  --block-tokens N    tokens per KV block (default 16)\n"
    "  --kv-dtype auto|int8  the KV pool's storage (kvgate-engine's flag): auto (default)\n"
    "                      as the backend stores it; int8 past --kv-full-precision-layers\n"
    "  --kv-full-precision-layers N  with --kv-dtype int8: float32 (cpu) or BF16 (cuda)\n"
    "                      layers (default 3)\n"
    "  --prompt-logits F   write the logits at the last prompt position to F, one per line\n"
    "  --top2-gap          print on stderr each choice's margin, the top logit minus the\n"
    "                      second (\"top2-gap[K]: G\", K = 0 at the last prompt position),\n"
    "                      then the smallest (\"top2-gap: G at step K of N\")\n"
    "  --export-llama2c F  write the loaded model as a llama2.c checkpoint (F32) to F and\n"
    "                      exit (no prompt needed): identical weights for other engines\n"
    "  --help              show this help\n";

typedef struct opts {
    const char *model, *tokenizer, *backend, *prompt, *prompt_file, *prompt_ids;
    const char *stop, *prompt_logits, *export_path;
    long max_tokens, steps, threads, prefill_chunk, block_tokens, device, kv_full_layers;
    int batch_invariant, kv_int8;
    kvg_sampler_params sp;
    int ids, logprobs, no_bos, top2_gap;
} opts;

static int usage_error(const char *fmt, const char *a)
{
    return kvg_usage_error("kvgate-generate", fmt, a);
}

/* --seed: any unsigned 64-bit integer. */
static int parse_seed(const char *v, void *dst, char *msg, size_t msg_len)
{
    char *end;
    unsigned long long s;
    (void)msg, (void)msg_len;
    errno = 0;
    s = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-')
        return -1;
    *(uint64_t *)dst = (uint64_t)s;
    return 0;
}

/* --kv-dtype: auto (0) or int8 (1). */
static int parse_kv_dtype(const char *v, void *dst, char *msg, size_t msg_len)
{
    (void)msg, (void)msg_len;
    if (strcmp(v, "auto") && strcmp(v, "int8"))
        return -1;
    *(int *)dst = !strcmp(v, "int8");
    return 0;
}

static int parse_args(int argc, char **argv, opts *o)
{
    /* In USAGE's order. */
    const kvg_opt table[] = {
        { "--model", KVG_OPT_STR, &o->model, 0, 0, NULL, NULL },
        { "--tokenizer", KVG_OPT_STR, &o->tokenizer, 0, 0, NULL, NULL },
        { "--backend", KVG_OPT_STR, &o->backend, 0, 0, NULL, NULL },
        { "--device", KVG_OPT_LONG, &o->device, 0, 1024,
          "--device needs a device number in [0, 1024], got '%s'", NULL },
        { "--batch-invariant", KVG_OPT_ON_OFF, &o->batch_invariant, 0, 0,
          "--batch-invariant is on or off, got '%s'", NULL },
        { "--prompt", KVG_OPT_STR, &o->prompt, 0, 0, NULL, NULL },
        { "--prompt-file", KVG_OPT_STR, &o->prompt_file, 0, 0, NULL, NULL },
        { "--prompt-ids", KVG_OPT_STR, &o->prompt_ids, 0, 0, NULL, NULL },
        { "--no-bos", KVG_OPT_FLAG, &o->no_bos, 0, 0, NULL, NULL },
        { "--max-tokens", KVG_OPT_LONG, &o->max_tokens, 0, INT32_MAX,
          "--max-tokens needs an integer >= 0, got '%s'", NULL },
        { "--steps", KVG_OPT_LONG, &o->steps, 1, INT32_MAX, "--steps needs an integer >= 1, got '%s'", NULL },
        { "--stop", KVG_OPT_STR, &o->stop, 0, 0, NULL, NULL },
        { "--temperature", KVG_OPT_FLOAT, &o->sp.temperature, 0, 1e30,
          "--temperature needs a number >= 0, got '%s'", NULL },
        /* (0, 1]: a float is above 0 when it is at least the smallest positive one */
        { "--top-p", KVG_OPT_FLOAT, &o->sp.top_p, FLT_TRUE_MIN, 1, "--top-p needs a number in (0, 1], got '%s'",
          NULL },
        { "--top-k", KVG_OPT_INT, &o->sp.top_k, 0, INT32_MAX, "--top-k needs an integer >= 0, got '%s'", NULL },
        { "--seed", KVG_OPT_CUSTOM, &o->sp.seed, 0, 0, "--seed needs a non-negative integer, got '%s'",
          parse_seed },
        { "--ids", KVG_OPT_FLAG, &o->ids, 0, 0, NULL, NULL },
        { "--logprobs", KVG_OPT_FLAG, &o->logprobs, 0, 0, NULL, NULL },
        { "--threads", KVG_OPT_LONG, &o->threads, 1, 256, "--threads needs an integer in [1, 256], got '%s'",
          NULL },
        { "--prefill-chunk", KVG_OPT_LONG, &o->prefill_chunk, 1, INT32_MAX,
          "--prefill-chunk needs an integer >= 1, got '%s'", NULL },
        { "--block-tokens", KVG_OPT_LONG, &o->block_tokens, 1, 4096,
          "--block-tokens needs an integer in [1, 4096], got '%s'", NULL },
        { "--kv-dtype", KVG_OPT_CUSTOM, &o->kv_int8, 0, 0, "--kv-dtype: '%s' is not auto or int8",
          parse_kv_dtype },
        { "--kv-full-precision-layers", KVG_OPT_LONG, &o->kv_full_layers, 0, 4096,
          "--kv-full-precision-layers: '%s' is not an integer 0..4096", NULL },
        { "--prompt-logits", KVG_OPT_STR, &o->prompt_logits, 0, 0, NULL, NULL },
        { "--top2-gap", KVG_OPT_FLAG, &o->top2_gap, 0, 0, NULL, NULL },
        { "--export-llama2c", KVG_OPT_STR, &o->export_path, 0, 0, NULL, NULL },
    };
    int rc;

    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->batch_invariant = 1;
    o->max_tokens = 256;
    o->steps = -1;
    o->kv_full_layers = 3;
    o->sp.temperature = 1.0f;
    o->sp.top_p = 1.0f;
    rc = kvg_args_parse("kvgate-generate", USAGE, argc, argv, table, sizeof table / sizeof table[0]);
    if (rc != 0)
        return rc;
    if (!o->model)
        return usage_error("%s", "--model is required");
    if (o->export_path && !o->prompt && !o->prompt_file && !o->prompt_ids)
        return 0;
    if ((o->prompt != NULL) + (o->prompt_file != NULL) + (o->prompt_ids != NULL) != 1)
        return usage_error("%s", "give exactly one of --prompt, --prompt-file, --prompt-ids");
    if (o->logprobs && !o->ids)
        return usage_error("%s", "--logprobs goes with --ids");
    return 0;
}

typedef struct gen {
    opts o;
    kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
    kvg_kv_seq seq;
    kvg_sampler smp;
    int32_t *prompt, *stop;
    size_t n_prompt, n_stop;
    float *logits;
} gen;

static void gen_free(gen *g)
{
    if (g->kv)
        kvg_kv_seq_release(g->kv, &g->seq);
    kvg_forward_free(g->fw);
    kvg_kv_pool_free(g->kv);
    kvg_backend_free(g->be);
    kvg_model_free(g->m);
    kvg_sampler_free(&g->smp);
    free(g->prompt);
    free(g->stop);
    free(g->logits);
}

static int load_prompt(gen *g, char *err, size_t err_len)
{
    const opts *o = &g->o;
    kvg_tokenizer *tok = g->m->tokenizer;
    char *text = NULL;
    size_t len;
    int rc;

    if (o->prompt_ids) {
        if (kvg_arg_ids(o->prompt_ids, &g->prompt, &g->n_prompt) != 0) {
            snprintf(err, err_len, "--prompt-ids: not a list of token ids: '%s'", o->prompt_ids);
            return -1;
        }
        for (size_t i = 0; i < g->n_prompt; i++) {
            if (g->prompt[i] >= g->m->cfg.vocab_size) {
                snprintf(err, err_len, "--prompt-ids: id %d is out of the vocabulary (%d)",
                         (int)g->prompt[i], g->m->cfg.vocab_size);
                return -1;
            }
        }
        return 0;
    }
    if (!tok) {
        snprintf(err, err_len, "a text prompt needs a tokenizer (--tokenizer PATH)");
        return -1;
    }
    if (o->prompt_file) {
        text = kvg_read_file(o->prompt_file, &len);
        if (!text) {
            snprintf(err, err_len, "cannot read %s: %s", o->prompt_file, strerror(errno));
            return -1;
        }
    }
    {
        const char *t = text ? text : o->prompt;
        unsigned flags = !o->no_bos && kvg_tokenizer_add_bos(tok) ? KVG_ENC_BOS : 0;
        size_t tl = text ? len : strlen(o->prompt);
        rc = kvg_tokenizer_encode(tok, t, tl, flags, &g->prompt, &g->n_prompt, err, err_len);
    }
    free(text);
    return rc;
}

static int setup_stop(gen *g, char *err, size_t err_len)
{
    const char *s = g->o.stop;
    if (s && strcmp(s, "none") == 0)
        return 0;
    if (s) {
        if (kvg_arg_ids(s, &g->stop, &g->n_stop) != 0) {
            snprintf(err, err_len, "--stop: not a list of token ids: '%s'", s);
            return -1;
        }
        return 0;
    }
    g->stop = malloc(2 * sizeof *g->stop);
    if (!g->stop) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    if (g->m->eos >= 0)
        g->stop[g->n_stop++] = g->m->eos;
    /* llama2.c's run.c ends a story when the model starts the next one with BOS. */
    if (strcmp(g->m->format, "llama2c") == 0 && g->m->bos >= 0)
        g->stop[g->n_stop++] = g->m->bos;
    return 0;
}

static int is_stop(const gen *g, int32_t id)
{
    for (size_t i = 0; i < g->n_stop; i++)
        if (g->stop[i] == id)
            return 1;
    return 0;
}

static int write_logits(const char *path, const float *l, int n, char *err, size_t err_len)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, err_len, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++)
        fprintf(f, "%.9g\n", (double)l[i]);
    if (fclose(f) != 0) {
        snprintf(err, err_len, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Hashing a multi-GB checkpoint for its identity takes a while: show progress on a
 * terminal (a line per quarter otherwise, so logs stay short). */
static void load_progress(void *ctx, const char *what, uint64_t done, uint64_t total)
{
    static int last_quarter = -1;
    (void)ctx;
    if (total == 0)
        return;
    if (isatty(STDERR_FILENO)) {
        fprintf(stderr, "\r%s: %llu / %llu MB%s", what, (unsigned long long)(done >> 20),
                (unsigned long long)(total >> 20), done >= total ? "\n" : "");
        return;
    }
    int quarter = (int)(done * 4 / total);
    if (quarter != last_quarter) {
        last_quarter = quarter;
        fprintf(stderr, "%s: %d%%\n", what, quarter * 25);
    }
}

/* The startup line: what was loaded and its identity (the model id in prefix hashes). */
static void print_model(const kvg_model *m)
{
    const kvg_model_config *c = &m->cfg;
    fprintf(stderr, "model: %s (%s, %s, %d layers, dim %d, %d/%d heads, vocab %d, ctx %d, %s) id %s\n",
            m->name, m->format, c->arch, c->n_layers, c->dim, c->n_heads, c->n_kv_heads,
            c->vocab_size, c->max_seq_len, kvg_dtype_name(m->layers ? m->layers[0].wq.dtype : KVG_DT_F32),
            m->id_hex);
}

static int run(gen *g, char *err, size_t err_len)
{
    const opts *o = &g->o;
    kvg_model_load_opts lo;
    kvg_kv_geom geom;
    kvg_detok dt;
    long max_gen, n_gen = 0, n_decode = 0, gap_step = -1, n_choices = 0;
    double min_gap = INFINITY;
    int64_t max_pos;
    double t0, t1, t2;
    char out[1024];

    /* A missing GPU is known before a big model is read. */
    if (!strcmp(o->backend, "cuda") && kvg_backend_cuda_probe((int)o->device, err, err_len) != 0)
        return -1;
    memset(&lo, 0, sizeof lo);
    lo.tokenizer_path = o->tokenizer;
    lo.progress = load_progress;
    g->m = kvg_model_load(o->model, &lo, err, err_len);
    if (!g->m)
        return -1;
    print_model(g->m);
    if (o->export_path) {
        if (kvg_model_export_llama2c(g->m, o->export_path, err, err_len) != 0)
            return -1;
        fprintf(stderr, "exported %s to %s (llama2.c, F32)\n", g->m->name, o->export_path);
        if (!o->prompt && !o->prompt_file && !o->prompt_ids)
            return 0;
    }
    if (load_prompt(g, err, err_len) != 0 || setup_stop(g, err, err_len) != 0)
        return -1;
    if (g->n_prompt == 0) {
        snprintf(err, err_len, "the prompt is empty (no tokens)");
        return -1;
    }
    if ((int64_t)g->n_prompt > g->m->cfg.max_seq_len) {
        snprintf(err, err_len, "the prompt has %zu tokens, more than the context length %d",
                 g->n_prompt, g->m->cfg.max_seq_len);
        return -1;
    }
    if (!o->ids && !g->m->tokenizer) {
        snprintf(err, err_len, "printing text needs a tokenizer (--tokenizer PATH), or use --ids");
        return -1;
    }
    if (kvg_sampler_params_check(&o->sp, err, err_len) != 0)
        return -1;

    max_gen = o->max_tokens;
    if (o->steps > 0) {
        long by_steps = o->steps - (long)g->n_prompt + 1;
        if (by_steps < max_gen)
            max_gen = by_steps < 0 ? 0 : by_steps;
    }
    /* Positions that will hold K/V: the prompt and every generated token but the last. */
    max_pos = (int64_t)g->n_prompt + (max_gen > 0 ? max_gen - 1 : 0);
    if (max_pos > g->m->cfg.max_seq_len)
        max_pos = g->m->cfg.max_seq_len;

    {
        kvg_backend_opts bo;
        memset(&bo, 0, sizeof bo);
        bo.n_threads = (int)o->threads;
        bo.device = (int)o->device;
        bo.batch_invariant = o->batch_invariant;
        g->be = kvg_backend_new_opts(o->backend, g->m, &bo, err, err_len);
    }
    if (!g->be)
        return -1;
    kvg_forward_kv_geom(g->m, (int)o->block_tokens, &geom);
    geom.dtype = o->kv_int8 ? KVG_KV_INT8 : KVG_KV_F32;
    geom.full_layers = (int)o->kv_full_layers;
    {
        int bt = o->block_tokens ? (int)o->block_tokens : KVG_KV_BLOCK_TOKENS_DEFAULT;
        g->kv = kvg_backend_kv_pool_new(g->be, &geom, (int32_t)((max_pos + bt - 1) / bt + 1), err, err_len);
    }
    if (!g->kv)
        return -1;
    g->fw = kvg_forward_new(g->m, g->be, g->kv, err, err_len);
    if (!g->fw)
        return -1;
    g->logits = malloc((size_t)g->m->cfg.vocab_size * sizeof *g->logits);
    if (!g->logits) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }

    t0 = kvg_mono_s();
    for (size_t done = 0; done < g->n_prompt;) {
        size_t n = g->n_prompt - done;
        kvg_fwd_seq s;
        if (o->prefill_chunk && n > (size_t)o->prefill_chunk)
            n = (size_t)o->prefill_chunk;
        s.kv = &g->seq;
        s.tokens = g->prompt + done;
        s.n_tokens = (int)n;
        s.logits = done + n == g->n_prompt ? g->logits : NULL;
        if (kvg_forward_step(g->fw, &s, 1, err, err_len) != 0)
            return -1;
        done += n;
    }
    t1 = kvg_mono_s();
    if (o->prompt_logits &&
        write_logits(o->prompt_logits, g->logits, g->m->cfg.vocab_size, err, err_len) != 0)
        return -1;

    if (g->m->tokenizer) {
        kvg_detok_init(&dt, g->m->tokenizer);
        dt.at_start = 0;        /* a continuation: keep its leading space */
    }
    while (n_gen < max_gen) {
        float lp = 0.0f;
        int32_t pos = g->seq.n_tokens;
        if (o->top2_gap) {
            double gap = kvg_top2_gap(g->logits, g->m->cfg.vocab_size);
            if (gap < min_gap || gap_step < 0) {
                min_gap = gap;
                gap_step = n_choices;
            }
            fprintf(stderr, "top2-gap[%ld]: %.9g\n", n_choices, gap);
            n_choices++;
        }
        int32_t tok = kvg_sample(&g->smp, &o->sp, g->logits, g->m->cfg.vocab_size, 0,
                                 (uint64_t)pos, o->logprobs ? &lp : NULL);
        if (tok < 0) {
            snprintf(err, err_len, "sampling failed (out of memory)");
            return -1;
        }
        if (is_stop(g, tok))
            break;
        n_gen++;
        if (o->ids) {
            if (o->logprobs)
                printf("%d %.6f\n", (int)tok, (double)lp);
            else
                printf(n_gen > 1 ? " %d" : "%d", (int)tok);
        } else {
            long w = kvg_detok_push(&dt, tok, out, sizeof out);
            if (w > 0)
                fwrite(out, 1, (size_t)w, stdout);
        }
        fflush(stdout);
        if (n_gen >= max_gen || g->seq.n_tokens >= g->m->cfg.max_seq_len)
            break;
        {
            kvg_fwd_seq s = { &g->seq, &tok, 1, g->logits };
            if (kvg_forward_step(g->fw, &s, 1, err, err_len) != 0)
                return -1;
            n_decode++;
        }
    }
    t2 = kvg_mono_s();
    char bdesc[200];
    if (o->top2_gap)
        fprintf(stderr, "top2-gap: %.9g at step %ld of %ld\n", min_gap, gap_step, n_choices);
    if (!o->ids) {
        long w = kvg_detok_flush(&dt, out, sizeof out);
        if (w > 0)
            fwrite(out, 1, (size_t)w, stdout);
    }
    if (!o->ids || !o->logprobs)
        putchar('\n');
    fflush(stdout);
    fprintf(stderr, "prompt: %zu tokens; prefill: %.1f tok/s (%.3f s); generated: %ld tokens; "
            "decode: %.1f tok/s (%ld steps, %.3f s); backend %s, %d threads\n",
            g->n_prompt, (double)g->n_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9), t1 - t0, n_gen,
            n_decode > 0 ? (double)n_decode / (t2 - t1) : 0.0, n_decode, t2 - t1,
            kvg_backend_describe(g->be, bdesc, sizeof bdesc), g->be->n_threads);
    return 0;
}

int main(int argc, char **argv)
{
    gen g;
    char err[1024] = "";
    int rc;

    memset(&g, 0, sizeof g);
    rc = parse_args(argc, argv, &g.o);
    if (rc)
        return rc;
    rc = run(&g, err, sizeof err) == 0 ? 0 : 1;
    if (rc)
        fprintf(stderr, "kvgate-generate: %s\n", err);
    gen_free(&g);
    return rc;
}
