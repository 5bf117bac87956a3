/* llama.cpp as the reference of a greedy continuation (t/engine-families.t): a prompt
 * given as token ids is evaluated in one llama_decode, then N tokens are chosen greedily,
 * each fed back one at a time; the output is kvgate-generate's for
 *
 *   build/bin/kvgate-generate --model F.gguf --prompt-ids IDS --ids --logprobs
 *       --temperature 0 --max-tokens N [--stop none] [--prompt-logits F] [--top2-gap]
 *
 * line for line: "id logprob" per generated token on stdout (the log-softmax of the
 * logits over the whole vocabulary at the chosen token, "%.6f"; the first line is the
 * choice at the last prompt position), the logits at the last prompt position one per
 * line ("%.9g") into --prompt-logits F, and with --top2-gap on stderr each choice's margin
 * (top-1 minus top-2 logit: "top2-gap[K]: G", K = 0 at the last prompt position) then the
 * smallest ("top2-gap: G at step K of N"). The choice
 * and its logprob are kvgate's own (kvg_sample at temperature 0: highest logit, ties to
 * the lowest id; the log-softmax in double), so the two outputs differ only where the
 * logits do. Generation stops at the vocabulary's end-of-sequence id (not printed), as
 * kvgate-generate's does, unless --stop none.
 *
 *   build/bench/llamacpp_ref --model F.gguf --lib DIR|libllama.so --prompt-ids "1 2 3"
 *       [--steps 64] [--threads 2] [--prompt-logits F] [--top2-gap] [--stop none]
 *       [--default-ctx] [--type-k T] [--type-v T] [--flash-attn on|off|auto]
 *       [--kv-rotation on|off] [--verbose]
 *
 * kvgate-generate's spellings are taken too, so that one argument list runs either:
 * --max-tokens N is --steps N, and --ids, --logprobs and --temperature 0 say what this
 * program does anyway (another temperature is refused).
 *
 * llama.cpp's settings, chosen for the most precise result on the CPU: one sequence,
 * n_ctx = prompt + steps rounded up to 256, n_batch = n_ubatch = the prompt (one ubatch,
 * like kvgate's single prefill step), the K/V cache in F32 and no flash attention (the
 * plain attention path, F32 throughout); --default-ctx keeps llama.cpp's defaults for
 * those two (F16 cache, flash attention automatic) instead, to see what they cost.
 * --type-k / --type-v (f32, f16 or q8_0) and --flash-attn pick the cache and the
 * attention path one by one, over those defaults: llama.cpp's quantized KV cache is
 * --type-k q8_0 --type-v q8_0 --flash-attn on (a quantized V needs flash attention, so
 * it is asked for, not left to "auto"). A quantized cache whose head size is a multiple
 * of 64 is rotated by llama.cpp (a Walsh-Hadamard rotation of K and V before they are
 * quantized); --kv-rotation off sets LLAMA_ATTN_ROT_DISABLE=1 for the plain per-block
 * quantization. The context's log must say it made what was asked for
 * (llamacpp_api.h's lc_new_ctx_kv), else exit 1. The model is loaded with llama.cpp's default model parameters (mmap; F32 weights are used
 * as stored).
 *
 * Exit status: 0 done, 1 error, 2 usage, 3 no usable library (llamacpp_api.h). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cliargs.h"
#include "llamacpp_api.h"
#include "sampler.h"

static const char USAGE[] =
    "usage: llamacpp_ref --model F.gguf --lib DIR|libllama.so --prompt-ids IDS [--steps 64] [--threads 2]\n"
    "                    [--prompt-logits F] [--top2-gap] [--stop none] [--default-ctx]\n"
    "                    [--type-k f32|f16|q8_0] [--type-v f32|f16|q8_0] [--flash-attn on|off|auto]\n"
    "                    [--kv-rotation on|off] [--verbose]\n";

/* ggml type of a --type-k / --type-v value; -1 for another. */
static int32_t kv_type(const char *v)
{
    return !strcmp(v, "f32") ? LC_GGML_TYPE_F32 : !strcmp(v, "f16") ? LC_GGML_TYPE_F16
         : !strcmp(v, "q8_0") ? LC_GGML_TYPE_Q8_0 : -1;
}

static int usage(const char *msg)
{
    fprintf(stderr, "llamacpp_ref: %s\n%s", msg, USAGE);
    return 2;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *lib = NULL, *ids_arg = NULL, *logits_path = NULL;
    long steps = 64, threads = 2;
    int top2 = 0, stop_eos = 1, exact = 1;
    const char *type_k = NULL, *type_v = NULL, *flash = NULL, *rot = "on";
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    lc_api api;

    lc_who = "llamacpp_ref";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--top2-gap"))
            top2 = 1;
        else if (!strcmp(a, "--default-ctx"))
            exact = 0;
        else if (!strcmp(a, "--verbose"))
            lc_verbose = 1;
        if (!strcmp(a, "--top2-gap") || !strcmp(a, "--default-ctx") || !strcmp(a, "--verbose")
            || !strcmp(a, "--ids") || !strcmp(a, "--logprobs"))
            continue;
        if (!strcmp(a, "--temperature") && v && strtod(v, NULL) == 0.0) {
            i++;
            continue;
        }
        if (!v)
            return usage(!strcmp(a, "--help") ? "" : "an option without its value, or an unknown one");
        if (!strcmp(a, "--model"))
            model_path = v;
        else if (!strcmp(a, "--lib"))
            lib = v;
        else if (!strcmp(a, "--prompt-ids"))
            ids_arg = v;
        else if (!strcmp(a, "--prompt-logits"))
            logits_path = v;
        else if (!strcmp(a, "--steps") || !strcmp(a, "--max-tokens"))
            steps = strtol(v, NULL, 10);
        else if (!strcmp(a, "--threads"))
            threads = strtol(v, NULL, 10);
        else if (!strcmp(a, "--stop") && !strcmp(v, "none"))
            stop_eos = 0;
        else if (!strcmp(a, "--type-k") && kv_type(v) >= 0)
            type_k = v;
        else if (!strcmp(a, "--type-v") && kv_type(v) >= 0)
            type_v = v;
        else if (!strcmp(a, "--flash-attn") && (!strcmp(v, "on") || !strcmp(v, "off") || !strcmp(v, "auto")))
            flash = v;
        else if (!strcmp(a, "--kv-rotation") && (!strcmp(v, "on") || !strcmp(v, "off")))
            rot = v;
        else
            return usage("unknown option or value");
        i++;
    }
    if (!model_path || !ids_arg)
        return usage("--model and --prompt-ids are required");
    if (steps < 1 || steps > 1 << 20 || threads < 1 || threads > 256)
        return usage("--steps is in [1, 2^20], --threads in [1, 256]");
    if (kvg_arg_ids(ids_arg, &prompt, &n_prompt) != 0 || n_prompt == 0 || n_prompt > 1 << 20)
        return usage("--prompt-ids: not a list of token ids");
    lc_kv kv = exact ? (lc_kv){ LC_GGML_TYPE_F32, LC_GGML_TYPE_F32, LC_FLASH_ATTN_DISABLED, 1 }
                     : (lc_kv){ LC_GGML_TYPE_F16, LC_GGML_TYPE_F16, LC_FLASH_ATTN_AUTO, 1 };
    if (type_k)
        kv.type_k = kv_type(type_k);
    if (type_v)
        kv.type_v = kv_type(type_v);
    if (flash)
        kv.flash_attn = !strcmp(flash, "on") ? LC_FLASH_ATTN_ENABLED
                      : !strcmp(flash, "off") ? LC_FLASH_ATTN_DISABLED : LC_FLASH_ATTN_AUTO;
    kv.rot = !strcmp(rot, "on");
    if (kv.type_v == LC_GGML_TYPE_Q8_0 && kv.flash_attn != LC_FLASH_ATTN_ENABLED) {
        free(prompt);
        return usage("--type-v q8_0 needs --flash-attn on (llama.cpp quantizes V only under flash attention)");
    }

    lc_load_api(&api, lib);
    void *model = api.model_load_from_file(model_path, api.model_default_params());
    if (!model)
        lc_die("llama_model_load_from_file failed (--verbose shows why)");
    const void *vocab = api.model_get_vocab(model);
    const int V = api.vocab_n_tokens(vocab);
    const int32_t eos = stop_eos ? api.vocab_eos(vocab) : -1;
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V) {
            fprintf(stderr, "llamacpp_ref: --prompt-ids: id %d is out of the vocabulary (%d)\n", (int)prompt[i], V);
            return 1;
        }
    uint32_t n_ctx = (uint32_t)(((long)n_prompt + steps + 255) / 256 * 256);
    void *ctx = lc_new_ctx_kv(&api, model, n_ctx, (uint32_t)n_prompt, 1, (int32_t)threads, &kv);
    fprintf(stderr, "llamacpp_ref: llama.cpp %s, vocab %d, prompt %zu tokens, n_ctx %u, K/V cache %s/%s "
            "(rotated: %s), flash attention %s\n", api.version(), V, n_prompt, n_ctx, lc_last.type_k, lc_last.type_v,
            lc_last.rot_k > 0 || lc_last.rot_v > 0 ? "yes" : "no",
            lc_last.flash < 0 ? "auto" : lc_last.flash ? "on" : "off");

    /* The prompt in one batch (llama_batch_get_one: positions from 0, one sequence, the
     * last token's logits only). */
    if (api.decode(ctx, api.batch_get_one(prompt, (int32_t)n_prompt)) != 0)
        lc_die("llama_decode (prompt) failed");
    const float *logits = api.get_logits_ith(ctx, -1);
    if (!logits)
        lc_die("llama_get_logits_ith: no logits");
    if (logits_path) {
        FILE *f = fopen(logits_path, "w");
        if (!f) {
            fprintf(stderr, "llamacpp_ref: cannot write %s: %s\n", logits_path, strerror(errno));
            return 1;
        }
        for (int i = 0; i < V; i++)
            fprintf(f, "%.9g\n", (double)logits[i]);
        if (fclose(f) != 0) {
            fprintf(stderr, "llamacpp_ref: cannot write %s: %s\n", logits_path, strerror(errno));
            return 1;
        }
    }

    kvg_sampler smp = { 0 };
    kvg_sampler_params greedy = { 0.0f, 0, 1.0f, 0 };
    double min_gap = INFINITY;
    long gap_step = -1, n_choices = 0;
    for (long n = 0; n < steps; n++) {
        float lp = 0.0f;
        double gap = kvg_top2_gap(logits, V);
        if (gap < min_gap || gap_step < 0) {
            min_gap = gap;
            gap_step = n_choices;
        }
        if (top2)
            fprintf(stderr, "top2-gap[%ld]: %.9g\n", n_choices, gap);
        n_choices++;
        int32_t tok = kvg_sample(&smp, &greedy, logits, V, 0, 0, &lp);
        if (tok < 0)
            lc_die("sampling failed (out of memory)");
        if (tok == eos)
            break;
        printf("%d %.6f\n", (int)tok, (double)lp);
        if (n + 1 == steps)
            break;
        if (api.decode(ctx, api.batch_get_one(&tok, 1)) != 0)
            lc_die("llama_decode (step) failed");
        logits = api.get_logits_ith(ctx, -1);
        if (!logits)
            lc_die("llama_get_logits_ith: no logits");
    }
    fflush(stdout);
    if (top2)
        fprintf(stderr, "top2-gap: %.9g at step %ld of %ld\n", min_gap, gap_step, n_choices);
    kvg_sampler_free(&smp);
    api.free_ctx(ctx);
    api.model_free(model);
    free(prompt);
    return 0;
}
