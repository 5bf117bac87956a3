/* libFuzzer target for chat_vars: arbitrary bytes read as a chat request (an
 * object with messages, tools and chat_template_kwargs, or a bare messages
 * value) and turned into a template's variables, with roomy and with tiny
 * message buffers. A refusal must name its param inside its message; a success
 * must hold one well-formed message per request message (role one of the four,
 * content a string, arguments objects), tools as given or null, and dump as
 * JSON. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_vars.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_message(const json_t *m)
{
    static const char *const ROLES[] = { "system", "user", "assistant", "tool" };
    const char *role = json_string_value(json_object_get(m, "role"));
    json_t *calls = json_object_get(m, "tool_calls");
    int known = 0;

    if (!role || !json_is_string(json_object_get(m, "content")))
        abort();
    for (size_t i = 0; i < sizeof ROLES / sizeof ROLES[0]; i++)
        known |= strcmp(role, ROLES[i]) == 0;
    if (!known)
        abort();
    if (calls) {
        if (strcmp(role, "assistant") != 0 || !json_is_array(calls) || json_array_size(calls) == 0)
            abort();
        for (size_t i = 0; i < json_array_size(calls); i++) {
            json_t *fn = json_object_get(json_array_get(calls, i), "function");
            if (!json_is_object(json_object_get(fn, "arguments")))
                abort();
        }
    }
    if (json_object_get(m, "tool_call_id") && strcmp(role, "tool") != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *req = json_loadb((const char *)data, size, JSON_DECODE_ANY, &je), *out;
    const json_t *messages, *tools = NULL, *kwargs = NULL;
    char err[512], param[128], tiny_err[6], tiny_param[3];
    int rc;

    if (!req)
        return 0;
    messages = req;
    if (json_is_object(req)) {
        messages = json_object_get(req, "messages");
        tools = json_object_get(req, "tools");
        kwargs = json_object_get(req, "chat_template_kwargs");
    }
    rc = kvg_chat_vars_build(messages, tools, kwargs, &out, err, sizeof err, param, sizeof param);
    if (rc == KVG_CHAT_VARS_INVALID) {
        if (out || !param[0] || !strstr(err, param))
            abort();
    } else if (rc == KVG_CHAT_VARS_OK) {
        json_t *list = json_object_get(out, "messages"), *t = json_object_get(out, "tools");
        char *dump;
        if (!json_is_array(list) || json_array_size(list) != json_array_size(messages))
            abort();
        for (size_t i = 0; i < json_array_size(list); i++)
            check_message(json_array_get(list, i));
        if (!t || (tools && !json_is_null(tools) ? !json_equal(t, tools) : !json_is_null(t)))
            abort();
        if (!(dump = json_dumps(out, JSON_COMPACT)))
            abort();
        free(dump);
        json_decref(out);
    } else if (rc != KVG_CHAT_VARS_NOMEM) {
        abort();
    }
    /* the same with buffers too small for anything: cut, terminated, same result */
    if (kvg_chat_vars_build(messages, tools, kwargs, &out, tiny_err, sizeof tiny_err, tiny_param,
                            sizeof tiny_param) != rc
        || strlen(tiny_err) >= sizeof tiny_err || strlen(tiny_param) >= sizeof tiny_param)
        abort();
    json_decref(out);
    json_decref(req);
    return 0;
}
