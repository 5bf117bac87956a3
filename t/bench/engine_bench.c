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
 *
 * --ref-prompt N times the reference on the first N prompt positions only (its speed
 * only falls with position, so its tokens/s is then an upper bound and the ratio a
 * lower bound); default: all P. Figures only: nothing here asserts a speed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "forward.h"
#include "gemm.h"
#include "kv_cache.h"
#include "model.h"
#include "sampler.h"
#include "../unit/ref_forward.h"

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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what, const char *err)
{
    fprintf(stderr, "engine_bench: %s: %s\n", what, err);
    exit(1);
}

int main(int argc, char **argv)
{
    const char *model = "synthetic:110M";
    int prompt = 1000, threads = 0, steps = 32, reps = 3, ref_prompt = -1, dec_prompt = 32;
    static const int batches[] = { 1, 8, 32 };
    enum { NB = 3 };
    char err[1024];
    kvg_model_load_opts lo;
    kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
    kvg_kv_geom geom;
    int32_t *toks;
    float *logits;
    double t_prefill, t_dec[NB], ref_prefill_tps, ref_decode_tps;
    long rss_kb, hwm_kb;
    int V, ref_n;

    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "usage: engine_bench [--model M] [--prompt N] [--threads N] "
                            "[--decode-steps N] [--reps N] [--ref-prompt N]\n");
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
        else {
            fprintf(stderr, "engine_bench: unknown option %s\n", argv[i]);
            return 2;
        }
        i++;
    }
    if (prompt < 1 || steps < 1 || reps < 1 || reps > 99) {
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
    be = kvg_backend_cpu_new(m, threads, err, sizeof err);
    if (!be)
        die("backend", err);
    kvg_forward_kv_geom(m, 0, &geom);
    {
        int need_prefill = (prompt + 15) / 16 + 1;
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
    {
        uint64_t s = 2024;
        for (int i = 0; i < prompt + 64; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            toks[i] = i == 0 ? (m->bos >= 0 ? m->bos : 1) : 3 + (int32_t)((s >> 33) % (uint64_t)(V - 3));
        }
    }
    printf("model %s: %s, %d layers, dim %d, hidden %d, heads %d/%d, vocab %d; %d threads, gemm %s\n",
           m->name, kvg_dtype_name(m->layers[0].wq.dtype), m->cfg.n_layers, m->cfg.dim,
           m->cfg.hidden_dim, m->cfg.n_heads, m->cfg.n_kv_heads, V, be->n_threads, kvg_gemm_isa());
    fflush(stdout);

    /* ---- engine prefill ---- */
    {
        double t[99];
        for (int r = 0; r < reps; r++) {
            kvg_kv_seq seq;
            kvg_fwd_seq s;
            double t0;
            kvg_kv_seq_init(&seq);
            s.kv = &seq;
            s.tokens = toks;
            s.n_tokens = prompt;
            s.logits = logits;
            t0 = now_s();
            if (kvg_forward_step(fw, &s, 1, err, sizeof err) != 0)
                die("prefill", err);
            t[r] = now_s() - t0;
            kvg_kv_seq_release(kv, &seq);
        }
        t_prefill = median(t, reps);
    }

    /* ---- engine decode at each batch size ---- */
    for (int bi = 0; bi < NB; bi++) {
        int B = batches[bi];
        double t[99];
        for (int r = 0; r < reps; r++) {
            kvg_kv_seq seqs[32];
            kvg_fwd_seq s[32];
            int32_t next[32];
            double t0;
            for (int b = 0; b < B; b++) {
                kvg_kv_seq_init(&seqs[b]);
                s[b].kv = &seqs[b];
                s[b].tokens = toks + b;     /* a different prompt per sequence */
                s[b].n_tokens = dec_prompt;
                s[b].logits = logits + (size_t)b * V;
            }
            if (kvg_forward_step(fw, s, B, err, sizeof err) != 0)
                die("decode prompt", err);
            t0 = now_s();
            for (int st = 0; st < steps; st++) {
                for (int b = 0; b < B; b++) {
                    next[b] = kvg_argmax(logits + (size_t)b * V, V);
                    s[b].tokens = &next[b];
                    s[b].n_tokens = 1;
                }
                if (kvg_forward_step(fw, s, B, err, sizeof err) != 0)
                    die("decode", err);
            }
            t[r] = now_s() - t0;
            for (int b = 0; b < B; b++)
                kvg_kv_seq_release(kv, &seqs[b]);
        }
        t_dec[bi] = median(t, reps);
    }
    rss_kb = status_kb("VmRSS");
    hwm_kb = status_kb("VmHWM");

    /* ---- reference ---- */
    {
        ref_model ref;
        double t0;
        if (ref_init(&ref, m, prompt + 64) != 0)
            die("reference", "out of memory");
        t0 = now_s();
        for (int p = 0; p < ref_prompt; p++)
            ref_forward(&ref, toks[p], p);
        ref_prefill_tps = ref_prompt / (now_s() - t0);
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
        ref_decode_tps = steps / (now_s() - t0);
        ref_free(&ref);
    }

    {
        double e_pre = prompt / t_prefill;
        printf("%-34s %14s %14s %9s\n", "", "engine", "reference", "ratio");
        printf("%-34s %10.1f t/s %10.1f t/s %8.1fx\n", "prefill (tokens/s)", e_pre, ref_prefill_tps,
               e_pre / ref_prefill_tps);
        for (int bi = 0; bi < NB; bi++) {
            char label[64];
            double e = (double)batches[bi] * steps / t_dec[bi];
            snprintf(label, sizeof label, "decode batch %d (aggregate tok/s)", batches[bi]);
            printf("%-34s %10.1f t/s %10.1f t/s %8.1fx\n", label, e, ref_decode_tps, e / ref_decode_tps);
        }
        printf("prefill: %d-token prompt in one step, median of %d: %.3f s; reference fed %d positions "
               "one by one%s\n", prompt, reps, t_prefill, ref_n,
               ref_n < prompt ? " (a partial run: its tok/s is an upper bound, the ratio a lower bound)" : "");
        printf("decode: %d steps after a %d-token prompt per sequence, greedy, median of %d\n", steps,
               dec_prompt, reps);
        printf("RSS after the engine runs: %.1f MiB (peak %.1f MiB); weights %.1f MiB\n", rss_kb / 1024.0,
               hwm_kb / 1024.0,
               (double)((size_t)m->cfg.n_layers *
                            ((size_t)m->layers[0].wq.rows * m->cfg.dim * 2 +
                             (size_t)m->layers[0].wk.rows * m->cfg.dim * 2 +
                             (size_t)m->cfg.hidden_dim * m->cfg.dim * 3) +
                        (size_t)V * m->cfg.dim * (m->cfg.tied_embeddings ? 1 : 2)) *
                   kvg_dtype_row_bytes(m->layers[0].wq.dtype, 256) / 256.0 / 1048576.0);
        printf("RESULT model=%s prefill=%.1f ref_prefill=%.2f dec1=%.1f dec8=%.1f dec32=%.1f ref_decode=%.2f "
               "rss_mib=%.1f hwm_mib=%.1f\n", m->name, e_pre, ref_prefill_tps,
               (double)batches[0] * steps / t_dec[0], (double)batches[1] * steps / t_dec[1],
               (double)batches[2] * steps / t_dec[2], ref_decode_tps, rss_kb / 1024.0, hwm_kb / 1024.0);
    }

    free(toks);
    free(logits);
    kvg_forward_free(fw);
    kvg_kv_pool_free(kv);
    kvg_backend_free(be);
    kvg_model_free(m);
    return 0;
}
