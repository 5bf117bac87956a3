/* kvgate-cli: one request (or --repeat N of it) to a running kvgate-engine over its
 * socket, the way the gateway makes it: tokenize with the engine's own tokenizer, hash
 * the prompt's blocks for the tenant, submit, print the text as it streams.
 *
 * Exit status: 0 ok, 1 the engine refused or failed the request (or is not there),
 * 2 bad usage. */
#include <errno.h>
#include "monoclock.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buckets.h"
#include "cliargs.h"
#include "client.h"
#include "tokenizer.h"

static const char USAGE[] =
    "usage: kvgate-cli --socket PATH (--prompt TEXT | --prompt-file F | --prompt-ids IDS) [options]\n"
    "\n"
    "Sends one completion request to a running kvgate-engine and prints the text as it\n"
    "streams (stdout), then a summary line on stderr.\n"
    "\n"
    "  --socket PATH          the engine's unix socket\n"
    "  --tenant T             tenant (the cache salt; default: empty)\n"
    "  --prompt TEXT          prompt text (BOS is prepended when the vocabulary asks for it)\n"
    "  --prompt-file F        prompt text read from a file\n"
    "  --prompt-ids IDS       prompt token ids, used verbatim (\"1 2 3\" or \"1,2,3\")\n"
    "  --max-tokens N         tokens per completion (default 128)\n"
    "  --temperature T        0 = greedy (default 1.0)\n"
    "  --top-p P              nucleus sampling (default 1 = off)\n"
    "  --top-k K              keep the K most likely tokens (default 0 = off)\n"
    "  --seed S               sampling seed (default 0)\n"
    "  --n N                  completions off one shared prefill (default 1)\n"
    "  --stop TEXT            a stop string (repeatable, up to 4)\n"
    "  --cache-min-tokens N   prompts shorter than N tokens bypass the cache (default 128)\n"
    "  --cache-ttl SECONDS    TTL of the blocks this request caches (default: the engine's)\n"
    "  --timeout SECONDS      give up (and cancel) after this long (default 300)\n"
    "  --repeat N             send the request N times, one after the other over the one\n"
    "                         connection, each printed with its own summary (default 1)\n"
    "  --stream               print tokens as they arrive (the default; n > 1 prints each\n"
    "                         completion when it is complete)\n"
    "  --json                 print one JSON object: texts, finish reasons, usage (incl.\n"
    "                         cached_tokens), cache status, token ids and logprobs,\n"
    "                         ttft_ms, total_ms, max_gap_ms (longest wait between tokens)\n"
    "  --help                 show this help\n";

typedef struct sample_out {
    char *text;
    size_t len, cap;
    uint32_t *ids;
    float *lps;
    size_t n, ids_cap;
    const char *finish;
    int done;
} sample_out;

static int usage_error(const char *fmt, const char *a)
{
    return kvg_usage_error("kvgate-cli", fmt, a);
}

static int append(sample_out *o, const kvg_client_event *ev)
{
    if (o->len + ev->text_len + 1 > o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 256;
        while (nc < o->len + ev->text_len + 1)
            nc *= 2;
        char *g = realloc(o->text, nc);
        if (!g)
            return -1;
        o->text = g;
        o->cap = nc;
    }
    memcpy(o->text + o->len, ev->text, ev->text_len);
    o->len += ev->text_len;
    o->text[o->len] = '\0';
    if (o->n + ev->n_tokens > o->ids_cap) {
        size_t nc = o->ids_cap ? o->ids_cap * 2 : 64;
        while (nc < o->n + ev->n_tokens)
            nc *= 2;
        uint32_t *gi = realloc(o->ids, nc * sizeof *gi);
        if (!gi)
            return -1;
        o->ids = gi;
        float *gl = realloc(o->lps, nc * sizeof *gl);
        if (!gl)
            return -1;
        o->lps = gl;
        o->ids_cap = nc;
    }
    for (uint32_t i = 0; i < ev->n_tokens; i++) {
        o->ids[o->n] = ev->tokens[i];
        o->lps[o->n] = ev->logprobs ? ev->logprobs[i] : 0.0f;
        o->n++;
    }
    return 0;
}

static const char *finish_name(uint32_t r)
{
    switch (r) {
    case KVG_MSG_FINISH_STOP: return "stop";
    case KVG_MSG_FINISH_LENGTH: return "length";
    case KVG_MSG_FINISH_DEADLINE: return "deadline";
    default: return "cancelled";
    }
}

static void outs_clear(sample_out *outs)
{
    for (int j = 0; j < KVG_PROTO_MAX_N; j++) {
        free(outs[j].text);
        free(outs[j].ids);
        free(outs[j].lps);
    }
    memset(outs, 0, KVG_PROTO_MAX_N * sizeof *outs);
}

/* Sends req once and prints its completions (stdout) and summary (stderr, or one JSON
 * line with --json) into outs, which start empty. 0, or 1 when the request failed. */
static int run_request(kvg_client *c, const kvg_client_req *req, sample_out *outs, long n, int json, double timeout,
                       const kvg_engine_info *info, const kvg_buckets *buckets)
{
    char err[512];
    uint64_t id;
    double t0 = kvg_mono_s(), ttft = -1, last_tok = -1, max_gap = 0;
    int src;
    while ((src = kvg_client_submit(c, req, NULL, &id, err, sizeof err)) == KVG_CLIENT_AGAIN)
        kvg_client_wait(c, 100);
    if (src != 0) {
        fprintf(stderr, "kvgate-cli: %s\n", err);
        return 1;
    }
    uint32_t prompt_tokens = 0, cached = 0, completion = 0;
    int finished = 0, accepted_cached = -1;
    while (!finished) {
        kvg_client_event ev;
        int got = 0;
        while (!finished && kvg_client_next_event(c, &ev) == 1) {
            got = 1;
            switch (ev.kind) {
            case KVG_CEV_ACCEPTED:
                accepted_cached = (int)ev.cached_tokens;
                break;
            case KVG_CEV_TOKENS:
                if (ev.sample >= (uint32_t)n)
                    break;
                if (ttft < 0)
                    ttft = kvg_mono_s() - t0;
                /* the longest wait between tokens: how long decoding stalled */
                if (last_tok >= 0 && kvg_mono_s() - last_tok > max_gap)
                    max_gap = kvg_mono_s() - last_tok;
                last_tok = kvg_mono_s();
                if (append(&outs[ev.sample], &ev) != 0) {
                    fprintf(stderr, "kvgate-cli: out of memory\n");
                    return 1;
                }
                if (!json && n == 1) {
                    fwrite(ev.text, 1, ev.text_len, stdout);
                    fflush(stdout);
                }
                break;
            case KVG_CEV_FINISHED:
                if (ev.sample >= (uint32_t)n)
                    break;
                outs[ev.sample].finish = finish_name(ev.finish_reason);
                outs[ev.sample].done = 1;
                if (!json && n > 1) {
                    printf("--- completion %u (%s) ---\n%s\n", ev.sample, outs[ev.sample].finish,
                           outs[ev.sample].text ? outs[ev.sample].text : "");
                    fflush(stdout);
                }
                break;
            case KVG_CEV_DONE:
                prompt_tokens = ev.prompt_tokens;
                cached = ev.cached_tokens;
                completion = ev.completion_tokens;
                finished = 1;
                break;
            case KVG_CEV_ERROR:
                fprintf(stderr, "kvgate-cli: the engine answered %d: %s\n", ev.status, ev.message);
                return 1;
            case KVG_CEV_DOWN:
                fprintf(stderr, "kvgate-cli: %s\n", ev.message);
                return 1;
            default:
                break;
            }
        }
        if (finished)
            break;
        if (kvg_mono_s() - t0 > timeout) {
            kvg_client_cancel(c, id);
            fprintf(stderr, "kvgate-cli: no answer within %g s; cancelled\n", timeout);
            return 1;
        }
        if (!got)
            kvg_client_wait(c, 200);
    }
    double total = kvg_mono_s() - t0;
    const char *status = kvg_cache_status(req->bypass, prompt_tokens, cached, info->block_tokens);
    (void)accepted_cached;
    if (json) {
        json_t *o = json_object(), *choices = json_array();
        for (long j = 0; j < n; j++) {
            json_t *ch = json_object(), *jids = json_array(), *jlps = json_array();
            for (size_t k = 0; k < outs[j].n; k++) {
                json_array_append_new(jids, json_integer(outs[j].ids[k]));
                json_array_append_new(jlps, json_real(outs[j].lps[k]));
            }
            json_object_set_new(ch, "index", json_integer(j));
            json_object_set_new(ch, "text", json_stringn(outs[j].text ? outs[j].text : "", outs[j].len));
            json_object_set_new(ch, "finish_reason", json_string(outs[j].finish ? outs[j].finish : "stop"));
            json_object_set_new(ch, "token_ids", jids);
            json_object_set_new(ch, "logprobs", jlps);
            json_array_append_new(choices, ch);
        }
        json_t *usage = json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", (json_int_t)prompt_tokens,
                                  "completion_tokens", (json_int_t)completion, "total_tokens",
                                  (json_int_t)(prompt_tokens + completion), "prompt_tokens_details", "cached_tokens",
                                  (json_int_t)cached);
        json_object_set_new(o, "model", json_string(info->model_name));
        json_object_set_new(o, "choices", choices);
        json_object_set_new(o, "usage", usage);
        json_object_set_new(o, "cache", json_string(status));
        json_object_set_new(o, "bucket", json_string(kvg_bucket_label(buckets, req->bucket)));
        json_object_set_new(o, "ttft_ms", json_real(ttft < 0 ? 0 : ttft * 1000.0));
        json_object_set_new(o, "total_ms", json_real(total * 1000.0));
        json_object_set_new(o, "max_gap_ms", json_real(max_gap * 1000.0));
        char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        if (s)
            puts(s);
        free(s);
        json_decref(o);
    } else {
        if (n == 1) {
            fputc('\n', stdout);
            fflush(stdout);
        }
        fprintf(stderr, "kvgate-cli: %u prompt tokens (%u cached, %s), %u completion tokens; first token after "
                "%.1f ms, total %.1f ms\n", prompt_tokens, cached, status, completion,
                ttft < 0 ? 0 : ttft * 1000.0, total * 1000.0);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *socket_path = NULL, *tenant = "", *prompt = NULL, *prompt_file = NULL, *prompt_ids = NULL;
    const char *stops[KVG_PROTO_MAX_STOP];
    size_t stop_len[KVG_PROTO_MAX_STOP], n_stop = 0;
    long max_tokens = 128, top_k = 0, n = 1, min_tokens = 128, repeat = 1;
    double temperature = 1.0, top_p = 1.0, ttl = 0, timeout = 300;
    unsigned long long seed = 0;
    int json = 0;
    char err[512];

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "--stream"))
            continue;
        if (i + 1 >= argc)
            return usage_error("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--socket"))
            socket_path = v;
        else if (!strcmp(a, "--tenant"))
            tenant = v;
        else if (!strcmp(a, "--prompt"))
            prompt = v;
        else if (!strcmp(a, "--prompt-file"))
            prompt_file = v;
        else if (!strcmp(a, "--prompt-ids"))
            prompt_ids = v;
        else if (!strcmp(a, "--max-tokens")) {
            if (kvg_arg_long(v, 1, 1 << 30, &max_tokens) != 0)
                return usage_error("--max-tokens: '%s' is not a positive integer", v);
        } else if (!strcmp(a, "--temperature")) {
            if (kvg_arg_double(v, 0, 100, &temperature) != 0)
                return usage_error("--temperature: '%s' is not a number >= 0", v);
        } else if (!strcmp(a, "--top-p")) {
            if (kvg_arg_double(v, 0, 1, &top_p) != 0 || top_p <= 0)
                return usage_error("--top-p: '%s' is not a number in (0, 1]", v);
        } else if (!strcmp(a, "--top-k")) {
            if (kvg_arg_long(v, 0, 1 << 30, &top_k) != 0)
                return usage_error("--top-k: '%s' is not an integer >= 0", v);
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            seed = strtoull(v, &end, 10);
            if (errno || end == v || *end || *v == '-')
                return usage_error("--seed: '%s' is not a non-negative integer", v);
        } else if (!strcmp(a, "--n")) {
            if (kvg_arg_long(v, 1, KVG_PROTO_MAX_N, &n) != 0)
                return usage_error("--n: '%s' is not an integer 1..16", v);
        } else if (!strcmp(a, "--stop")) {
            if (n_stop == KVG_PROTO_MAX_STOP)
                return usage_error("%s", "at most 4 --stop strings");
            if (!*v || strlen(v) > KVG_PROTO_MAX_STOP_LEN)
                return usage_error("--stop: '%s' must have 1..128 bytes", v);
            stops[n_stop] = v;
            stop_len[n_stop++] = strlen(v);
        } else if (!strcmp(a, "--cache-min-tokens")) {
            if (kvg_arg_long(v, 0, 1 << 30, &min_tokens) != 0)
                return usage_error("--cache-min-tokens: '%s' is not an integer >= 0", v);
        } else if (!strcmp(a, "--cache-ttl")) {
            if (kvg_arg_double(v, 0.001, 4e6, &ttl) != 0)
                return usage_error("--cache-ttl: '%s' is not a number of seconds > 0", v);
        } else if (!strcmp(a, "--repeat")) {
            if (kvg_arg_long(v, 1, 1000000, &repeat) != 0)
                return usage_error("--repeat: '%s' is not a positive integer", v);
        } else if (!strcmp(a, "--timeout")) {
            if (kvg_arg_double(v, 0.001, 1e6, &timeout) != 0)
                return usage_error("--timeout: '%s' is not a number of seconds > 0", v);
        } else
            return usage_error("unknown option %s", a);
    }
    if (!socket_path)
        return usage_error("%s", "--socket is required");
    if (!!prompt + !!prompt_file + !!prompt_ids != 1)
        return usage_error("%s", "give exactly one of --prompt, --prompt-file, --prompt-ids");

    char *file_text = NULL;
    size_t file_len = 0;
    if (prompt_file) {
        file_text = kvg_read_file(prompt_file, &file_len);
        if (!file_text) {
            fprintf(stderr, "kvgate-cli: --prompt-file %s: %s\n", prompt_file, strerror(errno));
            return 2;
        }
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (prompt_ids && (kvg_arg_ids(prompt_ids, &ids, &n_ids) != 0 || n_ids == 0)) {
        free(ids);
        return usage_error("--prompt-ids: '%s' is not a list of non-negative integers", prompt_ids);
    }

    kvg_client_opts co = { "kvgate-cli", 0, 0 };
    kvg_client *c = kvg_client_new(socket_path, &co, err, sizeof err);
    int rc = 1;
    sample_out outs[KVG_PROTO_MAX_N];
    memset(outs, 0, sizeof outs);
    if (!c) {
        fprintf(stderr, "kvgate-cli: %s\n", err);
        goto out;
    }
    if (kvg_client_connect_wait(c, 10000, err, sizeof err) != 0) {
        fprintf(stderr, "kvgate-cli: %s\n", err);
        goto out;
    }
    const kvg_engine_info *info = kvg_client_info(c);
    if (!prompt_ids) {
        const char *text = prompt ? prompt : file_text;
        size_t len = prompt ? strlen(prompt) : file_len;
        unsigned flags = info->add_bos ? KVG_ENC_BOS : 0;
        if (kvg_tokenizer_encode(info->tokenizer, text, len, flags, &ids, &n_ids, err, sizeof err) != 0) {
            fprintf(stderr, "kvgate-cli: the prompt: %s\n", err);
            goto out;
        }
    }
    /* --prompt-ids are the user's: this tool is their gateway, so it checks them
     * against the vocabulary as the nginx module does (a tokenizer's ids are). */
    for (size_t i = 0; prompt_ids && i < n_ids; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= info->vocab_size) {
            fprintf(stderr, "kvgate-cli: request: prompt token %zu (id %d) is outside the vocabulary of %u\n", i,
                    ids[i], info->vocab_size);
            goto out;
        }
    /* the gateway's default buckets, with this bypass threshold */
    kvg_buckets buckets;
    kvg_buckets_with_min(&buckets, (uint32_t)min_tokens, NULL);
    unsigned bucket = kvg_bucket_index(&buckets, n_ids);
    int bypass = bucket == 0;

    kvg_client_req req;
    memset(&req, 0, sizeof req);
    req.salt = tenant;           /* a named tenant is salted with its name */
    req.salt_len = strlen(tenant);
    req.tokens = ids;
    req.n_tokens = n_ids;
    req.bypass = bypass;
    req.bucket = bucket;
    req.temperature = (float)temperature;
    req.top_p = (float)top_p;
    req.top_k = (unsigned)top_k;
    req.seed = seed;
    req.n = (unsigned)n;
    req.max_tokens = (unsigned)max_tokens;
    req.stop = stops;
    req.stop_len = stop_len;
    req.n_stop = n_stop;
    req.cache_ttl_ms = ttl > 0 ? (uint32_t)(ttl * 1000.0) : 0;
    req.logprobs = json;
    for (long r = 0; r < repeat; r++) {
        outs_clear(outs);
        if (run_request(c, &req, outs, n, json, timeout, info, &buckets) != 0)
            goto out;
    }
    rc = 0;
out:
    outs_clear(outs);
    kvg_client_free(c);
    free(ids);
    free(file_text);
    return rc;
}
