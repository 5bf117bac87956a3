/* llama.cpp timed through its C API on a GGUF file, with the workload of engine_bench
 * (the same prompt tokens, the same decode protocol), for t/bench/engine's side-by-side
 * table:
 *
 *   - prefill tokens/s for a P-token prompt (default 1000) in one llama_decode call
 *     (n_batch = n_ubatch = P, like kvgate's single step), median of R after a warm-up;
 *   - decode tokens/s at batch 1 with T threads (and with 1 thread: --t1), at batch 8 and
 *     32 (aggregate; one sequence each, in one context with n_seq_max = B), each
 *     sequence after a 32-token prompt, greedy (argmax of the logits, as engine_bench).
 *
 *   build/bench/llamacpp_bench --model F.gguf --lib DIR|libllama.so [--prompt 1000]
 *       [--threads 2] [--decode-steps 32] [--reps 3] [--batches 1,8,32] [--t1] [--verbose]
 *
 * The library is dlopened through llamacpp_api.h (the ABI declarations, the loader and
 * the version check, shared with llamacpp_ref); exit 3 when it is absent: the caller skips.
 *
 * Figures only: nothing asserts a speed. Prints "RESULT llamacpp=1 ..." for the script. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_stats.h"
#include "llamacpp_api.h"
#include "monoclock.h"
#include "sampler.h"
#include "sampler_testing.h"

static int single_thread_row;

/* Batch-B decode: B sequences after a dec_prompt-token prompt each (sequence b starts at
 * toks + b, as engine_bench), then `steps` greedy steps of B tokens. Seconds for the steps. */
static double decode_run(const lc_api *api, void *ctx, const int32_t *toks, int B, int dec_prompt, int steps,
                         int V, int32_t *first)
{
    lc_batch bt = api->batch_init(B * dec_prompt, 0, 1);
    int32_t next[64];
    api->memory_clear(api->get_memory(ctx), 1);
    bt.n_tokens = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < dec_prompt; i++) {
            int k = bt.n_tokens++;
            bt.token[k] = toks[b + i];
            bt.pos[k] = i;
            bt.n_seq_id[k] = 1;
            bt.seq_id[k][0] = b;
            bt.logits[k] = i == dec_prompt - 1;
        }
    if (api->decode(ctx, bt) != 0)
        lc_die("llama_decode (decode prompt) failed");
    for (int b = 0; b < B; b++)
        next[b] = kvg_argmax(api->get_logits_ith(ctx, (b + 1) * dec_prompt - 1), V);
    double t0 = kvg_mono_s();
    for (int st = 0; st < steps; st++) {
        bt.n_tokens = B;
        for (int b = 0; b < B; b++) {
            bt.token[b] = next[b];
            bt.pos[b] = dec_prompt + st;
            bt.n_seq_id[b] = 1;
            bt.seq_id[b][0] = b;
            bt.logits[b] = 1;
        }
        if (first && st < 8)
            first[st] = next[0];
        if (api->decode(ctx, bt) != 0)
            lc_die("llama_decode (decode step) failed");
        for (int b = 0; b < B; b++)
            next[b] = kvg_argmax(api->get_logits_ith(ctx, b), V);
    }
    api->synchronize(ctx);
    double t = kvg_mono_s() - t0;
    api->batch_free(bt);
    return t;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *lib = NULL;
    int prompt = 1000, threads = 2, steps = 32, reps = 3, dec_prompt = 32;
    int batches[8] = { 1, 8, 32 }, nb = 3;
    lc_api api;

    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--verbose") == 0 || strcmp(argv[i], "--t1") == 0) {
            *(argv[i][2] == 'v' ? &lc_verbose : &single_thread_row) = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "usage: llamacpp_bench --model F.gguf --lib DIR|libllama.so [--prompt N] [--threads N] "
                            "[--decode-steps N] [--reps N] [--batches 1,8,32] [--t1] [--verbose]\n");
            return 2;
        }
        if (strcmp(argv[i], "--model") == 0)
            model_path = v;
        else if (strcmp(argv[i], "--lib") == 0)
            lib = v;
        else if (strcmp(argv[i], "--prompt") == 0)
            prompt = atoi(v);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(v);
        else if (strcmp(argv[i], "--decode-steps") == 0)
            steps = atoi(v);
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(v);
        else if (strcmp(argv[i], "--batches") == 0) {
            char *e;
            const char *p = v;
            nb = 0;
            while (*p && nb < 8) {
                batches[nb] = (int)strtol(p, &e, 10);
                if (e == p || batches[nb] < 1 || batches[nb] > 64) {
                    fprintf(stderr, "llamacpp_bench: bad --batches\n");
                    return 2;
                }
                nb++;
                p = *e == ',' ? e + 1 : e;
            }
        } else {
            fprintf(stderr, "llamacpp_bench: unknown option %s\n", argv[i]);
            return 2;
        }
        i++;
    }
    if (!model_path || prompt < 1 || steps < 1 || reps < 1 || reps > 99 || threads < 1 || nb < 1) {
        fprintf(stderr, "llamacpp_bench: --model and sane numbers are needed\n");
        return 2;
    }
    lc_who = "llamacpp_bench";
    lc_load_api(&api, lib);

    lc_model_params mp = api.model_default_params();
    void *model = api.model_load_from_file(model_path, mp);
    if (!model)
        lc_die("llama_model_load_from_file failed (--verbose shows why)");
    const int V = api.vocab_n_tokens(api.model_get_vocab(model));

    int32_t *toks = malloc((size_t)(prompt + 64) * sizeof *toks);
    {
        uint64_t s = 2024;       /* engine_bench's prompt tokens */
        for (int i = 0; i < prompt + 64; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            toks[i] = i == 0 ? 1 : 3 + (int32_t)((s >> 33) % (uint64_t)(V - 3));
        }
    }
    printf("llama.cpp %s: %s, vocab %d; %d threads\n", api.version(), model_path, V, threads);
    fflush(stdout);

    /* ---- prefill ---- */
    double t_prefill;
    {
        uint32_t n_ctx = (uint32_t)(prompt + 64 + 255) / 256 * 256;
        void *ctx = lc_new_ctx(&api, model, n_ctx, (uint32_t)prompt, 1, threads, 0);
        double t[99];
        for (int r = -1; r < reps; r++) {       /* r = -1: warm-up (graph allocation) */
            api.memory_clear(api.get_memory(ctx), 1);
            double t0 = kvg_mono_s();
            if (api.decode(ctx, api.batch_get_one(toks, prompt)) != 0)
                lc_die("llama_decode (prefill) failed");
            api.synchronize(ctx);
            if (r >= 0)
                t[r] = kvg_mono_s() - t0;
        }
        t_prefill = bench_median(t, reps);
        api.free_ctx(ctx);
    }

    /* ---- decode ---- */
    double dec[8], dec1_t1 = -1;
    int32_t first[8] = { 0 };
    for (int bi = 0; bi < nb; bi++) {
        int B = batches[bi];
        uint32_t per_seq = (uint32_t)(dec_prompt + steps + 8);
        uint32_t n_ctx = ((uint32_t)B * per_seq + 255) / 256 * 256;
        void *ctx = lc_new_ctx(&api, model, n_ctx, (uint32_t)(B * dec_prompt), (uint32_t)B, threads, 0);
        double t[99];
        decode_run(&api, ctx, toks, B, dec_prompt, 2, V, NULL);   /* warm-up */
        for (int r = 0; r < reps; r++)
            t[r] = decode_run(&api, ctx, toks, B, dec_prompt, steps, V, B == 1 ? first : NULL);
        dec[bi] = (double)B * steps / bench_median(t, reps);
        if (B == 1 && threads > 1 && single_thread_row) {
            api.set_n_threads(ctx, 1, 1);
            decode_run(&api, ctx, toks, 1, dec_prompt, 2, V, NULL);
            for (int r = 0; r < reps; r++)
                t[r] = decode_run(&api, ctx, toks, 1, dec_prompt, steps, V, NULL);
            dec1_t1 = steps / bench_median(t, reps);
        } else if (B == 1 && threads == 1) {
            dec1_t1 = dec[bi];
        }
        api.free_ctx(ctx);
    }

    printf("%-34s %10.1f t/s\n", "prefill (tokens/s)", prompt / t_prefill);
    for (int bi = 0; bi < nb; bi++) {
        char label[64];
        snprintf(label, sizeof label, "decode batch %d (aggregate tok/s)", batches[bi]);
        printf("%-34s %10.1f t/s\n", label, dec[bi]);
        if (batches[bi] == 1 && dec1_t1 >= 0)
            printf("%-34s %10.1f t/s\n", "decode batch 1, 1 thread", dec1_t1);
    }
    printf("prefill: %d-token prompt in one llama_decode, median of %d; decode: %d steps after a %d-token prompt, "
           "greedy; first tokens:", prompt, reps, steps, dec_prompt);
    for (int i = 0; i < 8 && i < steps; i++)
        printf(" %d", first[i]);
    printf("\nRESULT llamacpp=1 prefill=%.1f", prompt / t_prefill);
    for (int bi = 0; bi < nb; bi++)
        printf(" dec%d=%.1f", batches[bi], dec[bi]);
    if (dec1_t1 >= 0)
        printf(" dec1_t1=%.1f", dec1_t1);
    printf(" threads=%d\n", threads);

    free(toks);
    api.model_free(model);
    return 0;
}
