/* libFuzzer target for the OpenAI request parser: arbitrary bytes are parsed as
 * both endpoints. A failure must carry a 400/500 status and render as valid JSON
 * within KVG_API_ERROR_JSON_MAX; a success must hold only valid UTF-8 strings,
 * dump as valid JSON, and a chat request's data render through every built-in
 * chat template with sound data spans. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "jinja.h"
#include "request.h"
#include "../t/unit/request_dump.h"   /* kvg_request_to_json: test code, not the library */
#include "utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int valid_utf8(const char *s, size_t n)
{
    return kvg_utf8_invalid_at((const unsigned char *)s, n) == (size_t)-1 && strlen(s) == n;
}

static void check_error(const kvg_api_error *e)
{
    char buf[KVG_API_ERROR_JSON_MAX];
    size_t n;
    json_error_t je;
    json_t *j;

    if (e->status != 400 && e->status != 500)
        abort();
    n = kvg_api_error_render(e, buf, sizeof buf);
    if (n >= sizeof buf)
        abort();
    if (!(j = json_loadb(buf, n, 0, &je)))
        abort();
    json_decref(j);
}

/* Every built-in template renders the data (llama2 may refuse a conversation),
 * and the output is valid UTF-8 with its data spans sorted, apart and inside. */
static void check_render(const json_t *chat_data)
{
    static const char *const NAMES[] = { "plain", "chatml", "llama2", "llama3" };
    json_t *trusted = json_pack("{s:s, s:s, s:b}", "bos_token", "<s>", "eos_token", "</s>",
                                "add_generation_prompt", 1);
    char err[256];

    for (size_t t = 0; trusted && t < sizeof NAMES / sizeof NAMES[0]; t++) {
        const char *src = kvg_chat_builtin(NAMES[t]);
        kvg_jinja *j = kvg_jinja_compile(src, strlen(src), NAMES[t], err, sizeof err);
        kvg_jinja_output out;
        int rc;

        if (!j)
            abort();
        rc = kvg_jinja_render(j, trusted, chat_data, NULL, &out, err, sizeof err);
        kvg_jinja_free(j);
        if (rc == KVG_JINJA_RAISED && strcmp(NAMES[t], "llama2") == 0)
            continue;
        if (rc == KVG_JINJA_NOMEM)
            continue;
        if (rc != KVG_JINJA_OK || !valid_utf8(out.text, out.len))
            abort();
        for (size_t i = 0; i < out.n_spans; i++)
            if (out.spans[i].len == 0 || out.spans[i].off + out.spans[i].len > out.len
                || (i && out.spans[i].off <= out.spans[i - 1].off + out.spans[i - 1].len))
                abort();
        kvg_jinja_output_free(&out);
    }
    json_decref(trusted);
}

static void check_request(const kvg_request *r)
{
    char *dump;
    json_error_t je;
    json_t *j;

    if (!valid_utf8(r->model, r->model_len) || r->model_len == 0)
        abort();
    if (r->user && !valid_utf8(r->user, r->user_len))
        abort();
    for (size_t i = 0; i < r->n_stop; i++)
        if (r->stop_len[i] == 0 || !valid_utf8(r->stop[i], r->stop_len[i]))
            abort();
    if (r->n < 1 || r->n > KVG_REQ_MAX_N || r->temperature < 0 || r->temperature > 2
        || !(r->top_p > 0 && r->top_p <= 1) || r->top_k == 0 || r->top_k < -1
        || r->top_logprobs < 0 || r->top_logprobs > KVG_REQ_MAX_LOGPROBS
        || (r->include_usage && !r->stream) || (r->has_max_tokens && r->max_tokens < 1))
        abort();
    if ((dump = kvg_request_to_json(r))) {
        if (!(j = json_loads(dump, 0, &je)))
            abort();
        json_decref(j);
        free(dump);
    }
    if (r->endpoint == KVG_ENDPOINT_MESSAGES) {
        /* Anthropic's: max_tokens required, n 1, temperature 0..1, the breakpoints kept */
        if (!r->has_max_tokens || r->n != 1 || r->temperature > 1 || r->has_vote
            || r->n_cache_breakpoints > KVG_REQ_MAX_CACHE_BREAKPOINTS)
            abort();
        for (size_t i = 0; i < r->n_cache_breakpoints; i++)
            if ((r->cache_breakpoints[i].ttl_s != 300 && r->cache_breakpoints[i].ttl_s != 3600)
                || r->cache_breakpoints[i].message < -1 || r->cache_breakpoints[i].block < 0)
                abort();
    } else if (r->n_cache_breakpoints) {
        abort();
    }
    if (r->endpoint != KVG_ENDPOINT_COMPLETIONS) {
        if (r->n_messages == 0 || r->prompt_kind != KVG_PROMPT_NONE)
            abort();
        if (!json_is_array(json_object_get(r->chat_data, "messages")))
            abort();
        check_render(r->chat_data);
    } else if (r->prompt_kind == KVG_PROMPT_TEXT) {
        if (r->prompt_len == 0 || !valid_utf8(r->prompt, r->prompt_len))
            abort();
    } else if (r->prompt_kind == KVG_PROMPT_TOKENS) {
        if (r->n_prompt_tokens == 0)
            abort();
        for (size_t i = 0; i < r->n_prompt_tokens; i++)
            if (r->prompt_tokens[i] < 0)
                abort();
    } else {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const kvg_endpoint eps[] = { KVG_ENDPOINT_COMPLETIONS, KVG_ENDPOINT_CHAT,
                                        KVG_ENDPOINT_MESSAGES };

    for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
        kvg_api_error e;
        kvg_request *r = kvg_request_parse(eps[i], (const char *)data, size, &e);
        if (r) {
            if (r->endpoint != eps[i])
                abort();
            check_request(r);
            kvg_request_free(r);
        } else {
            check_error(&e);
        }
    }
    return 0;
}
