/* libFuzzer target for the OpenAI request parser: arbitrary bytes are parsed as
 * both endpoints. A failure must carry a 400/500 status and render as valid JSON
 * within KVG_API_ERROR_JSON_MAX; a success must hold only valid UTF-8 strings,
 * dump as valid JSON, and render through every chat template with segments that
 * are non-empty, cover the concatenated text exactly, and whose content
 * segments lie inside the messages (never in template text). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "chat_template_testing.h"
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

static void check_render(const kvg_chat_message *m, size_t n)
{
    size_t cap = kvg_chat_max_segments(n), nseg;
    kvg_chat_segment *segs = malloc(cap * sizeof *segs);
    char err[256];

    if (!segs)
        return;
    for (int t = 0; t < KVG_TPL_COUNT; t++) {
        for (int gen = 0; gen < 2; gen++) {
            char *text;
            size_t len, off = 0;

            if (kvg_chat_render((kvg_chat_template)t, m, n, gen, segs, cap, &nseg, err, sizeof err) < 0) {
                if (t != KVG_TPL_LLAMA2)  /* only llama2 has conversations it refuses */
                    abort();
                continue;
            }
            if (!(text = kvg_chat_segments_text(segs, nseg, &len)))
                continue;
            for (size_t i = 0; i < nseg; i++) {
                const kvg_chat_segment *s = &segs[i];
                int inside = 0;
                if (s->len == 0 || memcmp(text + off, s->text, s->len) != 0)
                    abort();
                off += s->len;
                for (size_t k = 0; k < n; k++)
                    if (s->text >= m[k].content && s->text + s->len <= m[k].content + m[k].content_len)
                        inside = 1;
                if ((s->kind == KVG_SEG_CONTENT) != inside)
                    abort();
            }
            if (off != len || !valid_utf8(text, len))
                abort();
            free(text);
        }
    }
    free(segs);
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
    if (r->endpoint == KVG_ENDPOINT_CHAT) {
        if (r->n_messages == 0 || r->prompt_kind != KVG_PROMPT_NONE)
            abort();
        for (size_t i = 0; i < r->n_messages; i++)
            if (!valid_utf8(r->messages[i].content, r->messages[i].content_len))
                abort();
        check_render(r->messages, r->n_messages);
    } else if (r->prompt_kind == KVG_PROMPT_TEXT) {
        kvg_chat_message m[2] = {
            { KVG_ROLE_SYSTEM, r->model, r->model_len },
            { KVG_ROLE_USER, r->prompt, r->prompt_len },
        };
        if (r->prompt_len == 0 || !valid_utf8(r->prompt, r->prompt_len))
            abort();
        check_render(m, 2);
        check_render(m + 1, 1);
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
    static const kvg_endpoint eps[] = { KVG_ENDPOINT_COMPLETIONS, KVG_ENDPOINT_CHAT };

    for (size_t i = 0; i < 2; i++) {
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
