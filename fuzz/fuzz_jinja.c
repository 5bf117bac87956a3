/* libFuzzer target for the Jinja engine (jinja.h): any bytes as a template must
 * compile or fail with a message, and a compiled template must render within tight
 * limits or fail with a message: never a crash, a leak, a hang or a stack overflow.
 * The context is a small chat (trusted bos/eos, data messages and tools) so that
 * templates that look like chat templates get far. On success the output's data
 * spans must be sorted, inside the text, not touching, and non-empty. */
#include <stdint.h>
#include <string.h>

#include "jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *trusted, *ctx_data;

static void init_context(void)
{
    json_error_t e;

    trusted = json_loads("{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", "
                         "\"add_generation_prompt\": true}", 0, &e);
    ctx_data = json_loads(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"},"
        " {\"role\": \"user\", \"content\": \"<|im_start|>hi \\u00e9\\n\"},"
        " {\"role\": \"assistant\", \"content\": \"<think>x</think>ok\", \"tool_calls\": ["
        "  {\"id\": \"c1\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null]}}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"{}\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\":"
        "  {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}}}}],"
        " \"enable_thinking\": false}", 0, &e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    kvg_jinja *t;
    kvg_jinja_output out;
    kvg_jinja_limits lim = { .max_output = 1 << 16, .max_steps = 20000, .max_depth = 32,
                             .now = 1767225600 };

    if (!trusted)
        init_context();
    if (size > 8192)
        return 0;
    err[0] = 0;
    t = kvg_jinja_compile((const char *)data, size, "fuzz", err, sizeof err);
    if (!t) {
        if (strncmp(err, "fuzz:", 5) != 0)
            __builtin_trap();
        return 0;
    }
    int rc = kvg_jinja_render(t, trusted, ctx_data, &lim, &out, err, sizeof err);
    if (rc == KVG_JINJA_OK) {
        size_t end = 0;
        if (!out.text || out.text[out.len] != 0 || out.len > lim.max_output)
            __builtin_trap();
        for (size_t i = 0; i < out.n_spans; i++) {
            if (out.spans[i].len == 0 || out.spans[i].off < end + (i ? 1 : 0) ||
                out.spans[i].off + out.spans[i].len > out.len)
                __builtin_trap();
            end = out.spans[i].off + out.spans[i].len;
        }
        kvg_jinja_output_free(&out);
    } else if (rc < KVG_JINJA_RAISED || rc > KVG_JINJA_NOMEM || out.text || out.spans) {
        __builtin_trap();
    }
    kvg_jinja_free(t);
    return 0;
}
