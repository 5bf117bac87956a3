/* chat_vars.h: each conversion rule (developer -> system, text parts joined,
 * tool-call arguments parsed, fields kept, ignored and ordered, tools and
 * chat_template_kwargs) and each refusal with its message and param path. */
#include <jansson.h>

#include "tap.h"
#include "chat_vars.h"

static json_t *parse(const char *s)
{
    json_error_t je;
    json_t *v = json_loads(s, JSON_DECODE_ANY, &je);
    if (!v)
        diag("bad test JSON: %s: %s", je.text, s);
    return v;
}

/* Builds from JSON texts (NULL: not given); returns the data as compact JSON
 * in key order (malloc'd), or NULL after diagnosing the error. */
static char *build(const char *messages, const char *tools, const char *kwargs)
{
    json_t *m = parse(messages), *t = tools ? parse(tools) : NULL, *k = kwargs ? parse(kwargs) : NULL;
    json_t *data = NULL;
    char err[512], param[128];
    char *out = NULL;
    int rc = kvg_chat_vars_build(m, t, k, &data, err, sizeof err, param, sizeof param);

    if (rc == KVG_CHAT_VARS_OK)
        out = json_dumps(data, JSON_COMPACT | JSON_PRESERVE_ORDER);
    else
        diag("  refused: %s (param %s)", err, param);
    json_decref(data);
    json_decref(m);
    json_decref(t);
    json_decref(k);
    return out;
}

static void converts(const char *messages, const char *tools, const char *kwargs, const char *want,
                     const char *name)
{
    char *got = build(messages, tools, kwargs);
    is_str(got, want, "%s", name);
    free(got);
}

/* Expects a refusal with this param; msg must occur in the message. */
static void refuses(const char *messages, const char *tools, const char *kwargs, const char *param,
                    const char *msg, const char *name)
{
    json_t *m = messages ? parse(messages) : NULL, *t = tools ? parse(tools) : NULL;
    json_t *k = kwargs ? parse(kwargs) : NULL, *data = (json_t *)1;
    char err[512] = "unset", p[128] = "unset";
    int rc = kvg_chat_vars_build(m, t, k, &data, err, sizeof err, p, sizeof p);

    if (!ok(rc == KVG_CHAT_VARS_INVALID && data == NULL && strcmp(p, param) == 0 && strstr(err, msg),
            "refused: %s", name))
        diag("  rc %d, param '%s' (want '%s'), message '%s' (want it to hold '%s')", rc, p, param,
             err, msg);
    if (rc == KVG_CHAT_VARS_OK)
        json_decref(data);
    json_decref(m);
    json_decref(t);
    json_decref(k);
}

#define USER(c) "{\"role\":\"user\",\"content\":" c "}"
#define CALL(args) "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":" args "}}"
#define ASSIST_CALL(call) "{\"role\":\"assistant\",\"tool_calls\":[" call "]}"

static void test_roles(void)
{
    converts("[{\"role\":\"system\",\"content\":\"s\"}," USER("\"u\"") ","
             "{\"role\":\"assistant\",\"content\":\"a\"}]", NULL, NULL,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"u\"},"
             "{\"role\":\"assistant\",\"content\":\"a\"}],\"tools\":null}",
             "system, user, assistant as given; tools null without tools");
    converts("[{\"role\":\"developer\",\"content\":\"d\"}]", NULL, NULL,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"d\"}],\"tools\":null}", "developer becomes system");
    refuses("[{\"content\":\"x\"}]", NULL, NULL, "messages[0].role",
            "Missing required parameter: 'messages[0].role'", "no role");
    refuses("[" USER("\"u\"") ",{\"role\":7,\"content\":\"x\"}]", NULL, NULL, "messages[1].role",
            "expected a string, but got an integer", "a role that is not a string");
    refuses("[{\"role\":\"function\",\"content\":\"x\"}]", NULL, NULL, "messages[0].role",
            "Invalid value for 'messages[0].role': 'function'", "the deprecated function role");
    refuses("[{\"role\":\"User\",\"content\":\"x\"}]", NULL, NULL, "messages[0].role",
            "Supported values are: 'system', 'developer', 'user', 'assistant' and 'tool'",
            "roles are case-sensitive");
}

static void test_messages(void)
{
    refuses(NULL, NULL, NULL, "messages", "Missing required parameter: 'messages'", "no messages");
    refuses("null", NULL, NULL, "messages", "Missing required parameter", "messages null");
    refuses("{}", NULL, NULL, "messages", "expected an array, but got an object", "messages an object");
    refuses("[]", NULL, NULL, "messages", "empty array", "messages empty");
    refuses("[\"hi\"]", NULL, NULL, "messages[0]", "expected an object, but got a string",
            "a message that is not an object");
    refuses("[" USER("\"0\"") "," USER("\"1\"") "," USER("\"2\"") "," USER("\"3\"") "," USER("\"4\"") ","
            USER("\"5\"") "," USER("\"6\"") "," USER("\"7\"") "," USER("\"8\"") "," USER("\"9\"") ","
            USER("[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\"}]") "]", NULL, NULL,
            "messages[10].content[1].text", "Missing required parameter: 'messages[10].content[1].text'",
            "paths with indexes of two digits");
}

static void test_content(void)
{
    converts("[" USER("\"  spaced \\n\"") "]", NULL, NULL,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"  spaced \\n\"}],\"tools\":null}",
             "string content byte for byte");
    converts("[" USER("[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"},"
                      "{\"type\":\"text\",\"text\":\"\"}]") "]", NULL, NULL,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\nb\\n\"}],\"tools\":null}",
             "text parts joined with \\n");
    converts("[" USER("[{\"text\":\"x\",\"type\":\"text\",\"extra\":1}]") "]", NULL, NULL,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":null}", "a part's unknown fields ignored");
    refuses("[{\"role\":\"user\"}]", NULL, NULL, "messages[0].content",
            "Missing required parameter: 'messages[0].content'", "user without content");
    refuses("[{\"role\":\"user\",\"content\":null}]", NULL, NULL, "messages[0].content",
            "Missing required parameter", "null content counts as absent");
    refuses("[{\"role\":\"assistant\"}]", NULL, NULL, "messages[0].content",
            "Missing required parameter", "assistant without content or tool_calls");
    refuses("[" USER("3") "]", NULL, NULL, "messages[0].content",
            "expected a string or an array of content parts, but got an integer", "content a number");
    refuses("[" USER("[]") "]", NULL, NULL, "messages[0].content", "empty array", "no parts");
    refuses("[" USER("[\"x\"]") "]", NULL, NULL, "messages[0].content[0]",
            "expected an object, but got a string", "a part that is not an object");
    refuses("[" USER("[{\"text\":\"x\"}]") "]", NULL, NULL, "messages[0].content[0].type",
            "Missing required parameter: 'messages[0].content[0].type'", "a part without type");
    refuses("[" USER("[{\"type\":\"text\",\"text\":\"x\"},{\"type\":\"image_url\",\"image_url\":{}}]") "]",
            NULL, NULL, "messages[0].content[1].type",
            "only 'text' content parts are supported, got 'image_url'", "an image part");
    refuses("[" USER("[{\"type\":\"text\"}]") "]", NULL, NULL, "messages[0].content[0].text",
            "Missing required parameter: 'messages[0].content[0].text'", "a text part without text");
    refuses("[" USER("[{\"type\":\"text\",\"text\":[]}]") "]", NULL, NULL, "messages[0].content[0].text",
            "expected a string, but got an array", "a text part whose text is an array");
}

static void test_fields(void)
{
    converts("[{\"name\":\"bob\",\"content\":\"hi\",\"role\":\"user\",\"weird\":{\"x\":1},"
             "\"tool_calls\":[1],\"tool_call_id\":5,\"reasoning_content\":7}]", NULL, NULL,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"name\":\"bob\"}],\"tools\":null}",
             "name kept, unknown and other roles' fields ignored, fixed key order");
    converts("[{\"name\":\"n\",\"reasoning_content\":\"r\",\"tool_calls\":[" CALL("\"\"") "],\"content\":\"c\","
             "\"role\":\"assistant\"},{\"name\":\"t\",\"tool_call_id\":\"c1\",\"content\":\"x\",\"role\":\"tool\"}]",
             NULL, NULL,
             "{\"messages\":[{\"role\":\"assistant\",\"content\":\"c\",\"tool_calls\":[{\"id\":\"c1\","
             "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}],\"reasoning\":\"r\","
             "\"reasoning_content\":\"r\",\"name\":\"n\"},{\"role\":\"tool\",\"content\":\"x\",\"tool_call_id\":\"c1\","
             "\"name\":\"t\"}],\"tools\":null}",
             "vLLM's key order: role, content, tool_calls, reasoning(_content), tool_call_id, name");
    refuses("[{\"role\":\"user\",\"content\":\"x\",\"name\":1}]", NULL, NULL, "messages[0].name",
            "expected a string, but got an integer", "name not a string");
    converts("[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":\"why\"}]", NULL, NULL,
             "{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning\":\"why\","
             "\"reasoning_content\":\"why\"}],\"tools\":null}",
             "assistant reasoning_content passed through, as reasoning too");
    converts("[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning\":\"r\"}]", NULL, NULL,
             "{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning\":\"r\","
             "\"reasoning_content\":\"r\"}],\"tools\":null}",
             "assistant reasoning (vLLM's newer name) the same");
    converts("[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning\":\"r\",\"reasoning_content\":\"rc\"}]",
             NULL, NULL,
             "{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning\":\"rc\","
             "\"reasoning_content\":\"rc\"}],\"tools\":null}",
             "both: reasoning_content wins");
    refuses("[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning\":1}]", NULL, NULL,
            "messages[0].reasoning", "expected a string, but got an integer", "reasoning not a string");
    converts("[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":null}]", NULL, NULL,
             "{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\"}],\"tools\":null}", "reasoning_content null: absent");
    refuses("[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":{}}]", NULL, NULL,
            "messages[0].reasoning_content", "expected a string, but got an object",
            "reasoning_content not a string");
}

static void test_tool_calls(void)
{
    converts("[" ASSIST_CALL(CALL("\"{\\\"b\\\": [1, 2], \\\"a\\\": \\\"x\\\"}\"")) "]", NULL, NULL,
             "{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\","
             "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"b\":[1,2],\"a\":\"x\"}}}]}],\"tools\":null}",
             "tool call: arguments parsed in their order, content \"\" when absent");
    converts("[{\"role\":\"assistant\",\"content\":\"calling\",\"tool_calls\":[{\"function\":{\"arguments\":"
             "\"{}\",\"name\":\"g\",\"x\":1},\"type\":\"function\",\"id\":\"c2\",\"index\":0}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"42\"}]", NULL, NULL,
             "{\"messages\":[{\"role\":\"assistant\",\"content\":\"calling\",\"tool_calls\":[{\"function\":"
             "{\"arguments\":{},\"name\":\"g\",\"x\":1},\"type\":\"function\",\"id\":\"c2\",\"index\":0}]},"
             "{\"role\":\"tool\",\"content\":\"42\",\"tool_call_id\":\"c2\"}],\"tools\":null}",
             "a call as given (its order, unknown fields); a tool result with its tool_call_id");
    converts("[" ASSIST_CALL(CALL("\"\"")) "]", NULL, NULL,
             "{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\","
             "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]}],\"tools\":null}",
             "empty arguments become {}");
    refuses("[" ASSIST_CALL(CALL("\"{\\\"a\\\": \"")) "]", NULL, NULL,
            "messages[0].tool_calls[0].function.arguments", "not valid JSON", "arguments not JSON");
    refuses("[" ASSIST_CALL(CALL("\"[1]\"")) "]", NULL, NULL,
            "messages[0].tool_calls[0].function.arguments",
            "expected the JSON text of an object, but got an array", "arguments not an object");
    refuses("[" ASSIST_CALL(CALL("{\"a\":1}")) "]", NULL, NULL,
            "messages[0].tool_calls[0].function.arguments", "expected a string, but got an object",
            "arguments given as an object, not its text");
    refuses("[" ASSIST_CALL("{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}") "]",
            NULL, NULL, "messages[0].tool_calls[0].id", "Missing required parameter", "call without id");
    refuses("[" ASSIST_CALL("{\"id\":\"c\",\"type\":\"custom\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}") "]",
            NULL, NULL, "messages[0].tool_calls[0].type", "Invalid value for 'messages[0].tool_calls[0].type': 'custom'",
            "call of another type");
    refuses("[" ASSIST_CALL("{\"id\":\"c\",\"type\":\"function\"}") "]", NULL, NULL,
            "messages[0].tool_calls[0].function", "Missing required parameter", "call without function");
    refuses("[" ASSIST_CALL("{\"id\":\"c\",\"type\":\"function\",\"function\":{\"arguments\":\"{}\"}}") "]",
            NULL, NULL, "messages[0].tool_calls[0].function.name", "Missing required parameter",
            "call without a name");
    refuses("[" ASSIST_CALL("{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\"}}") "]",
            NULL, NULL, "messages[0].tool_calls[0].function.arguments", "Missing required parameter",
            "call without arguments");
    refuses("[" ASSIST_CALL("7") "]", NULL, NULL, "messages[0].tool_calls[0]",
            "expected an object, but got an integer", "call not an object");
    refuses("[{\"role\":\"assistant\",\"tool_calls\":[]}]", NULL, NULL, "messages[0].content",
            "Missing required parameter", "tool_calls [] is none: content required");
    converts("[{\"role\":\"assistant\",\"content\":\"a\",\"tool_calls\":[]}]", NULL, NULL,
             "{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\"}],\"tools\":null}", "tool_calls [] dropped");
    refuses("[{\"role\":\"assistant\",\"tool_calls\":{}}]", NULL, NULL, "messages[0].tool_calls",
            "expected an array, but got an object", "tool_calls an object");
    refuses("[" USER("\"u\"") ",{\"role\":\"tool\",\"content\":\"r\"}]", NULL, NULL,
            "messages[1].tool_call_id", "Missing required parameter: 'messages[1].tool_call_id'",
            "tool message without tool_call_id");
    refuses("[{\"role\":\"tool\",\"tool_call_id\":\"c\"}]", NULL, NULL, "messages[0].content",
            "Missing required parameter", "tool message without content");
}

static void test_tools(void)
{
    static const char tools[] =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"description\":\"d\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{}}},\"extra\":true}]";

    converts("[" USER("\"u\"") "]", tools, NULL,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"tools\":[{\"type\":\"function\","
             "\"function\":{\"name\":\"get\",\"description\":\"d\",\"parameters\":{\"type\":\"object\","
             "\"properties\":{}}},\"extra\":true}]}", "tools passed as given");
    converts("[" USER("\"u\"") "]", "null", NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"tools\":null}",
             "tools null: null");
    converts("[" USER("\"u\"") "]", "[]", NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"tools\":[]}",
             "tools empty: given, empty");
    refuses("[" USER("\"u\"") "]", "{}", NULL, "tools", "expected an array, but got an object",
            "tools an object");
    refuses("[" USER("\"u\"") "]", "[{\"type\":\"function\"}]", NULL, "tools[0].function",
            "Missing required parameter: 'tools[0].function'", "tool without function");
    refuses("[" USER("\"u\"") "]", "[{\"function\":{\"name\":\"f\"}}]", NULL, "tools[0].type",
            "Missing required parameter", "tool without type");
    refuses("[" USER("\"u\"") "]", "[{\"type\":\"function\",\"function\":{}}]", NULL,
            "tools[0].function.name", "Missing required parameter", "tool without a name");
    refuses("[" USER("\"u\"") "]", "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":1}}]",
            NULL, "tools[0].function.description", "expected a string", "description not a string");
    refuses("[" USER("\"u\"") "]", "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]",
            NULL, "tools[0].function.parameters", "expected an object, but got an array",
            "parameters not an object");
    refuses("[" USER("\"u\"") "]", "[1]", NULL, "tools[0]", "expected an object", "tool not an object");
}

static void test_kwargs(void)
{
    converts("[" USER("\"u\"") "]", NULL, "{\"enable_thinking\":false,\"reasoning_effort\":\"low\"}",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"tools\":null,\"enable_thinking\":false,"
             "\"reasoning_effort\":\"low\"}", "kwargs become top-level variables");
    converts("[" USER("\"u\"") "]", "[]", "{}",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"tools\":[]}", "empty kwargs");
    refuses("[" USER("\"u\"") "]", NULL, "[]", "chat_template_kwargs", "expected an object, but got an array",
            "kwargs an array");
    refuses("[" USER("\"u\"") "]", NULL, "{\"messages\":[]}", "chat_template_kwargs.messages",
            "cannot be replaced", "kwargs cannot replace messages");
    refuses("[" USER("\"u\"") "]", "[]", "{\"tools\":[]}", "chat_template_kwargs.tools",
            "cannot be replaced", "kwargs cannot replace tools");
}

/* Buffers too small for the message still end in a NUL; a zero-sized one is
 * not written. */
static void test_small_buffers(void)
{
    json_t *m = parse("[{\"role\":\"nobody\",\"content\":\"x\"}]"), *data;
    char err[8], param[4];
    int rc = kvg_chat_vars_build(m, NULL, NULL, &data, err, sizeof err, param, sizeof param);

    ok(rc == KVG_CHAT_VARS_INVALID && strlen(err) == 7 && strcmp(param, "mes") == 0,
       "small buffers: cut, NUL-terminated");
    rc = kvg_chat_vars_build(m, NULL, NULL, &data, NULL, 0, NULL, 0);
    ok(rc == KVG_CHAT_VARS_INVALID && data == NULL, "no buffers at all");
    json_decref(m);
}

int main(void)
{
    test_roles();
    test_messages();
    test_content();
    test_fields();
    test_tool_calls();
    test_tools();
    test_kwargs();
    test_small_buffers();
    return done_testing();
}
