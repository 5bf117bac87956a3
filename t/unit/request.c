/* OpenAI request parsing: every accepted shape (incl. what the official SDKs
 * send), every error with its HTTP status, param and code, the non-influence of
 * client cache-salt fields, and the error JSON renderer; Anthropic's Messages
 * API (/v1/messages) into the same request, and its error objects. */
#include <jansson.h>

#include "tap.h"
#include "request.h"
#include "request_dump.h"
#include "utf8.h"
#include "api_error_testing.h"

#define CMPL KVG_ENDPOINT_COMPLETIONS
#define CHAT KVG_ENDPOINT_CHAT
#define MSGS KVG_ENDPOINT_MESSAGES

static kvg_request *parse(kvg_endpoint ep, const char *body, kvg_api_error *e)
{
    return kvg_request_parse(ep, body, strlen(body), e);
}

/* Parses, and expects success; diagnoses the error otherwise. */
static kvg_request *good(kvg_endpoint ep, const char *body, const char *name)
{
    kvg_api_error e;
    kvg_request *r = parse(ep, body, &e);
    if (!ok(r != NULL, "parses: %s", name))
        diag("  %d %s (param %s)", e.status, e.message, e.param);
    return r;
}

/* Expects a failure with this status, param ("" = null) and code (NULL = null);
 * msg, when given, must occur in the message. */
static void bad_len(kvg_endpoint ep, const char *body, size_t len, int status, const char *param,
                    const char *code, const char *msg, const char *name)
{
    kvg_api_error e;
    kvg_request *r = kvg_request_parse(ep, body, len, &e);
    int good_err = !r && e.status == status && strcmp(e.param, param) == 0
        && (code ? e.code && strcmp(e.code, code) == 0 : e.code == NULL)
        && (!msg || strstr(e.message, msg));
    if (!ok(good_err, "rejected: %s", name)) {
        if (r)
            diag("  parsed successfully");
        else
            diag("  got %d param='%s' code=%s msg=%s", e.status, e.param, e.code ? e.code : "null",
                 e.message);
        diag("  wanted %d param='%s' code=%s msg~%s", status, param, code ? code : "null",
             msg ? msg : "");
    }
    kvg_request_free(r);
}

static void bad(kvg_endpoint ep, const char *body, int status, const char *param, const char *code,
                const char *msg, const char *name)
{
    bad_len(ep, body, strlen(body), status, param, code, msg, name);
}

static int str_is(const char *s, size_t n, const char *want)
{
    return s && n == strlen(want) && memcmp(s, want, n) == 0 && s[n] == '\0';
}

static void test_completions_shapes(void)
{
    kvg_request *r;

    r = good(CMPL, "{\"model\":\"m\",\"prompt\":\"Hello\"}", "minimal completions");
    if (r) {
        is_int(r->endpoint, CMPL, "  endpoint");
        ok(str_is(r->model, r->model_len, "m"), "  model");
        is_int(r->prompt_kind, KVG_PROMPT_TEXT, "  text prompt");
        ok(str_is(r->prompt, r->prompt_len, "Hello"), "  prompt text");
        ok(!r->has_max_tokens && r->temperature == 1.0 && r->top_p == 1.0 && r->top_k == -1
           && r->n == 1 && !r->has_seed && r->n_stop == 0 && !r->stream && !r->include_usage
           && !r->has_logprobs && r->top_logprobs == 0 && r->user == NULL && r->chat_data == NULL,
           "  defaults");
    }
    kvg_request_free(r);

    /* openai-python's completions.create(model=..., prompt=..., max_tokens=16,
     * temperature=0.7, stream=False, n=1) plus explicit None for unset options */
    r = good(CMPL, "{\"model\":\"gpt-3.5-turbo-instruct\",\"prompt\":\"Say this is a test\","
                   "\"max_tokens\":16,\"temperature\":0.7,\"stream\":false,\"n\":1,"
                   "\"logprobs\":null,\"stop\":null,\"seed\":null,\"user\":null,\"suffix\":null,"
                   "\"echo\":false,\"best_of\":1,\"logit_bias\":null,\"presence_penalty\":0,"
                   "\"frequency_penalty\":0.0,\"stream_options\":null,\"top_p\":1}",
             "python SDK completions body with nulls");
    if (r) {
        ok(r->has_max_tokens && r->max_tokens == 16, "  max_tokens 16");
        ok(r->temperature == 0.7 && r->top_p == 1.0 && r->n == 1 && !r->stream, "  sampling");
        ok(!r->has_seed && r->n_stop == 0 && !r->user && !r->has_logprobs, "  nulls are absent");
    }
    kvg_request_free(r);

    r = good(CMPL, "{\"model\":\"m\",\"prompt\":[\"only one\"]}", "array of one string");
    ok(r && r->prompt_kind == KVG_PROMPT_TEXT && str_is(r->prompt, r->prompt_len, "only one"),
       "  text prompt from array");
    kvg_request_free(r);

    r = good(CMPL, "{\"model\":\"m\",\"prompt\":[1,15043,2.0,2147483647,0]}", "token ids");
    if (r) {
        is_int(r->prompt_kind, KVG_PROMPT_TOKENS, "  token prompt");
        is_int(r->n_prompt_tokens, 5, "  5 ids");
        ok(r->prompt_tokens[0] == 1 && r->prompt_tokens[1] == 15043 && r->prompt_tokens[2] == 2
           && r->prompt_tokens[3] == 2147483647 && r->prompt_tokens[4] == 0, "  ids (2.0 -> 2)");
        ok(r->prompt == NULL, "  no text");
    }
    kvg_request_free(r);

    r = good(CMPL, "{\"model\":\"m\",\"prompt\":[[7,8,9]]}", "array of one token array");
    ok(r && r->prompt_kind == KVG_PROMPT_TOKENS && r->n_prompt_tokens == 3 && r->prompt_tokens[2] == 9,
       "  tokens from nested array");
    kvg_request_free(r);

    r = good(CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":0}", "logprobs 0");
    ok(r && r->has_logprobs && r->top_logprobs == 0, "  logprobs on, 0 alternatives");
    kvg_request_free(r);
    r = good(CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":20}", "logprobs 20");
    ok(r && r->has_logprobs && r->top_logprobs == 20, "  20 alternatives");
    kvg_request_free(r);

    r = good(CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"max_completion_tokens\":0}",
             "max_completion_tokens is an unknown field for completions");
    ok(r && !r->has_max_tokens, "  and is ignored there");
    kvg_request_free(r);

    /* UTF-8 and escapes survive */
    r = good(CMPL, "{\"model\":\"m\",\"prompt\":\"h\xc3\xa9 \\ud83d\\ude00 \xe4\xb8\xad\\n\\\"\"}",
             "UTF-8 and escapes");
    ok(r && str_is(r->prompt, r->prompt_len, "h\xc3\xa9 \xf0\x9f\x98\x80 \xe4\xb8\xad\n\""),
       "  decoded prompt");
    kvg_request_free(r);
}

/* A field of the i-th message of a chat request's template data ("" when absent). */
static const char *msg_field(const kvg_request *r, size_t i, const char *key)
{
    const char *v = json_string_value(json_object_get(
        json_array_get(json_object_get(r->chat_data, "messages"), i), key));
    return v ? v : "";
}

static void test_chat_shapes(void)
{
    kvg_request *r;

    /* openai-node chat.completions.create({ model, messages, stream: true,
     * stream_options: { include_usage: true }, ... }) */
    r = good(CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"You are helpful.\"},"
                   "{\"role\":\"user\",\"content\":\"Hi\",\"name\":\"bob\"},"
                   "{\"role\":\"assistant\",\"content\":\"Hello!\",\"tool_calls\":[]},"
                   "{\"role\":\"developer\",\"content\":\"Be brief.\"},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Part one.\"},"
                   "{\"type\":\"text\",\"text\":\"Part two.\"}]}],"
                   "\"model\":\"llama-3-8b\",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                   "\"max_completion_tokens\":100,\"max_tokens\":50,\"temperature\":0,\"top_p\":0.9,"
                   "\"top_k\":40,\"n\":2,\"seed\":-9223372036854775808,\"stop\":[\"\\n\\n\",\"END\"],"
                   "\"logprobs\":true,\"top_logprobs\":3,\"user\":\"user-42\","
                   "\"tools\":null,\"tool_choice\":null,\"response_format\":{\"type\":\"text\"},"
                   "\"parallel_tool_calls\":true,\"metadata\":{\"a\":\"b\"},\"store\":false}",
             "full chat body");
    if (r) {
        is_int(r->endpoint, CHAT, "  endpoint");
        is_int(r->prompt_kind, KVG_PROMPT_NONE, "  no prompt");
        is_int(r->n_messages, 5, "  5 messages");
        is_str(msg_field(r, 0, "role"), "system", "  system message");
        is_str(msg_field(r, 0, "content"), "You are helpful.", "  its content");
        ok(!strcmp(msg_field(r, 1, "role"), "user") && !strcmp(msg_field(r, 1, "content"), "Hi")
           && !strcmp(msg_field(r, 1, "name"), "bob"), "  user message with its name");
        is_str(msg_field(r, 2, "role"), "assistant", "  assistant with empty tool_calls");
        is_str(msg_field(r, 3, "role"), "system", "  developer -> system");
        is_str(msg_field(r, 4, "content"), "Part one.\nPart two.", "  text parts joined with \\n");
        ok(r->has_max_tokens && r->max_tokens == 100, "  max_completion_tokens wins over max_tokens");
        ok(r->temperature == 0.0 && r->top_p == 0.9 && r->top_k == 40 && r->n == 2, "  sampling");
        ok(r->has_seed && r->seed == INT64_MIN, "  seed INT64_MIN");
        ok(r->n_stop == 2 && str_is(r->stop[0], r->stop_len[0], "\n\n") && str_is(r->stop[1], r->stop_len[1], "END"),
           "  stop array");
        ok(r->stream && r->include_usage, "  stream with usage");
        ok(r->has_logprobs && r->top_logprobs == 3, "  logprobs/top_logprobs");
        ok(str_is(r->user, r->user_len, "user-42"), "  user kept");
    }
    kvg_request_free(r);

    r = good(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\"}],\"max_tokens\":7,"
                   "\"stop\":\"###\",\"stream\":false,\"logprobs\":false,\"top_logprobs\":null,"
                   "\"temperature\":2,\"top_p\":1e-9,\"top_k\":-1,\"n\":128,\"seed\":9223372036854775807}",
             "chat boundaries");
    if (r) {
        is_str(msg_field(r, 0, "content"), "", "  empty content allowed");
        ok(r->has_max_tokens && r->max_tokens == 7, "  max_tokens used in chat");
        ok(r->n_stop == 1 && str_is(r->stop[0], r->stop_len[0], "###"), "  stop string");
        ok(r->temperature == 2.0 && r->top_p == 1e-9 && r->top_k == -1 && r->n == 128, "  limits accepted");
        ok(r->seed == INT64_MAX, "  seed INT64_MAX");
        ok(!r->has_logprobs, "  logprobs false");
    }
    kvg_request_free(r);

    r = good(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[],"
                   "\"stream\":true,\"stream_options\":{},\"n\":3.0,\"max_tokens\":1e2}",
             "empty stop, empty stream_options, integral reals");
    ok(r && r->n_stop == 0 && r->stream && !r->include_usage && r->n == 3 && r->max_tokens == 100,
       "  values");
    kvg_request_free(r);

    r = good(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                   "\"temperature\":-0.0}", "temperature -0.0");
    if (r) {
        char *j = kvg_request_to_json(r);
        ok(j && strstr(j, "\"temperature\":0.0,"), "  normalised to 0.0");
        free(j);
    }
    kvg_request_free(r);

    ok(kvg_request_parse(CHAT, "{}", 2, NULL) == NULL, "a NULL err pointer is tolerated");
}

static void test_cache_salt(void)
{
    static const char *const base_c = "{\"model\":\"m\",\"prompt\":\"secret prefix\",\"temperature\":0.5}";
    static const char *const salted_c[] = {
        "{\"model\":\"m\",\"prompt\":\"secret prefix\",\"temperature\":0.5,\"cache_salt\":\"tenant-b\"}",
        "{\"cache_salt\":\"x\",\"tenant\":\"evil\",\"prompt_cache_key\":\"k\",\"model\":\"m\","
        "\"prompt\":\"secret prefix\",\"temperature\":0.5,\"kv_cache_namespace\":{\"a\":[1,2]}}",
    };
    static const char *const base_chat =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    static const char *const salted_chat =
        "{\"model\":\"m\",\"cache_salt\":\"s\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\","
        "\"cache_salt\":\"s2\"}],\"tenant\":42}";
    kvg_api_error e;
    kvg_request *a = parse(CMPL, base_c, &e), *b;
    char *ja = a ? kvg_request_to_json(a) : NULL, *jb;

    ok(ja != NULL, "base request dumps");
    for (size_t i = 0; i < 2; i++) {
        b = parse(CMPL, salted_c[i], &e);
        jb = b ? kvg_request_to_json(b) : NULL;
        ok(ja && jb && strcmp(ja, jb) == 0, "cache_salt/tenant/prompt_cache_key change nothing the cache "
           "is keyed by (%zu)", i);
        if (jb && ja && strcmp(ja, jb))
            diag("  %s\n  %s", ja, jb);
        free(jb);
        kvg_request_free(b);
    }
    b = parse(CMPL, salted_c[1], &e);
    ok(b && str_is(b->prompt_cache_key, b->prompt_cache_key_len, "k") && b->cache_retention_s == 0,
       "prompt_cache_key kept (routing affinity only), retention in_memory by default");
    kvg_request_free(b);
    b = parse(CMPL, "{\"model\":\"m\",\"prompt\":\"p\",\"prompt_cache_retention\":\"24h\"}", &e);
    ok(b && b->cache_retention_s == 86400 && b->prompt_cache_key == NULL, "prompt_cache_retention 24h: 86400 s");
    kvg_request_free(b);
    b = parse(CMPL, "{\"model\":\"m\",\"prompt\":\"p\",\"prompt_cache_retention\":\"7d\"}", &e);
    ok(!b && e.status == 400 && !strcmp(e.param, "prompt_cache_retention"), "prompt_cache_retention 7d: 400");
    b = parse(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                    "\"prompt_cache_key\":[1]}", &e);
    ok(!b && e.status == 400 && !strcmp(e.param, "prompt_cache_key"), "chat: prompt_cache_key [1]: 400");
    is_str(ja, "{\"endpoint\":\"completions\",\"model\":\"m\",\"prompt\":\"secret prefix\","
               "\"max_tokens\":null,\"temperature\":0.5,\"top_p\":1.0,\"top_k\":-1,\"n\":1,"
               "\"seed\":null,\"stop\":[],\"stream\":false,\"include_usage\":false,"
               "\"logprobs\":false,\"top_logprobs\":0,\"user\":null}", "canonical dump");
    free(ja);
    kvg_request_free(a);

    a = parse(CHAT, base_chat, &e);
    b = parse(CHAT, salted_chat, &e);
    ja = a ? kvg_request_to_json(a) : NULL;
    jb = b ? kvg_request_to_json(b) : NULL;
    ok(ja && jb && strcmp(ja, jb) == 0, "chat: cache_salt at top level and in a message change nothing");
    is_str(jb, "{\"endpoint\":\"chat\",\"model\":\"m\",\"chat_data\":{\"messages\":[{\"role\":\"user\","
               "\"content\":\"hi\"}],\"tools\":null},"
               "\"max_tokens\":null,\"temperature\":1.0,\"top_p\":1.0,\"top_k\":-1,\"n\":1,"
               "\"seed\":null,\"stop\":[],\"stream\":false,\"include_usage\":false,"
               "\"logprobs\":false,\"top_logprobs\":0,\"user\":null}", "chat canonical dump");
    free(ja);
    free(jb);
    kvg_request_free(a);
    kvg_request_free(b);
}

static void test_body_errors(void)
{
    char deep[5000];
    size_t d = 0;

    bad(CMPL, "", 400, "", "invalid_json", "empty", "empty body");
    bad_len(CMPL, NULL, 0, 400, "", "invalid_json", "empty", "NULL body");
    bad(CMPL, "model=m&prompt=x", 400, "", "invalid_json", "could not parse the JSON body",
        "form-encoded body");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":\"x\"", 400, "", "invalid_json", NULL, "truncated JSON");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":\"x\"} {}", 400, "", "invalid_json", NULL, "trailing data");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":\"\xff\"}", 400, "", "invalid_encoding", "offset 23",
        "invalid UTF-8 byte in a string");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":\"x\"}\xc0\x80", 400, "", "invalid_encoding", NULL,
        "overlong NUL after the object");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":\"\xed\xa0\x80\"}", 400, "", "invalid_encoding", NULL,
        "UTF-8-encoded surrogate");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":\"\xe4\xb8\"}", 400, "", "invalid_encoding", NULL,
        "truncated sequence");
    bad(CMPL, "\xef\xbb\xbf{\"model\":\"m\",\"prompt\":\"x\"}", 400, "", "invalid_json", NULL,
        "UTF-8 BOM is not JSON");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":\"\\ud800\"}", 400, "", "invalid_json", NULL,
        "lone surrogate escape");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":\"a\\u0000b\"}", 400, "", "invalid_json", "\\u0000",
        "NUL in a string");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"a\\u0000\":1}", 400, "", "invalid_json", "\\u0000",
        "NUL in a key");
    bad(CMPL, "{\"model\":\"a\",\"model\":\"b\",\"prompt\":\"x\"}", 400, "", "invalid_json",
        "repeats a key", "duplicate key");
    bad(CHAT, "{\"model\":\"a\",\"messages\":[{\"role\":\"user\",\"role\":\"system\",\"content\":\"x\"}]}",
        400, "", "invalid_json", "repeats a key", "duplicate key in a message");
    bad(CMPL, "[{\"model\":\"m\",\"prompt\":\"x\"}]", 400, "", "invalid_json",
        "must be a JSON object, but got an array", "top-level array");
    bad(CMPL, "42", 400, "", "invalid_json", "got an integer", "top-level number");
    bad(CMPL, "null", 400, "", "invalid_json", "got null", "top-level null");
    bad(CMPL, "\"str\"", 400, "", "invalid_json", "got a string", "top-level string");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"n\":1e400}", 400, "", "invalid_json", NULL,
        "real overflow");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":\"x\",\"seed\":99999999999999999999}", 400, "", "invalid_json",
        NULL, "integer overflow");
    d += (size_t)snprintf(deep, sizeof deep, "{\"model\":\"m\",\"prompt\":\"x\",\"x\":");
    while (d < 4000)
        deep[d++] = '[';
    deep[d] = '\0';
    bad(CMPL, deep, 400, "", "invalid_json", NULL, "nesting 3,960 deep");
}

static void test_field_errors(void)
{
    /* model */
    bad(CMPL, "{\"prompt\":\"x\"}", 400, "model", "missing_required_parameter",
        "Missing required parameter: 'model'.", "missing model");
    bad(CMPL, "{\"model\":null,\"prompt\":\"x\"}", 400, "model", "missing_required_parameter", NULL,
        "null model");
    bad(CMPL, "{\"model\":5,\"prompt\":\"x\"}", 400, "model", "invalid_type",
        "Invalid type for 'model': expected a string, but got an integer instead.", "numeric model");
    bad(CMPL, "{\"model\":\"\",\"prompt\":\"x\"}", 400, "model", "invalid_value", NULL, "empty model");
    {
        char body[600];
        snprintf(body, sizeof body, "{\"model\":\"%0257d\",\"prompt\":\"x\"}", 0);
        bad(CMPL, body, 400, "model", "string_above_max_length", "257", "257-byte model name");
    }

    /* prompt */
    bad(CMPL, "{\"model\":\"m\"}", 400, "prompt", "missing_required_parameter", NULL, "missing prompt");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":null}", 400, "prompt", "missing_required_parameter", NULL,
        "null prompt");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":\"\"}", 400, "prompt", "invalid_value", "empty", "empty prompt");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":[]}", 400, "prompt", "empty_array", NULL, "empty prompt array");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":[\"\"]}", 400, "prompt[0]", "invalid_value", NULL,
        "array of one empty string");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":[[]]}", 400, "prompt[0]", "empty_array", NULL,
        "array of one empty token array");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", 400, "prompt", "unsupported_value",
        "batched prompts are not supported", "two string prompts");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":[[1],[2]]}", 400, "prompt", "unsupported_value",
        "batched prompts are not supported", "two token prompts");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":[\"a\",[1]]}", 400, "prompt[1]", "invalid_type", NULL,
        "string then array");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":[1,\"a\"]}", 400, "prompt[1]", "invalid_type",
        "expected an integer, but got a string", "id then string");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":[1,-1]}", 400, "prompt[1]", "integer_below_min_value",
        "Expected a value >= 0, but got -1", "negative token id");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":[2147483648]}", 400, "prompt[0]", "integer_above_max_value",
        NULL, "token id above int32");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":[1.5]}", 400, "prompt[0]", "invalid_type",
        "expected an integer, but got a decimal number", "fractional token id");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":[[1,null]]}", 400, "prompt[0][1]", "invalid_type", NULL,
        "null inside a token array");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":[null]}", 400, "prompt[0]", "invalid_type", NULL, "[null]");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":{}}", 400, "prompt", "invalid_type",
        "expected a string or an array, but got an object", "object prompt");
    bad(CMPL, "{\"model\":\"m\",\"prompt\":true}", 400, "prompt", "invalid_type", NULL, "bool prompt");

    /* messages */
    bad(CHAT, "{\"model\":\"m\"}", 400, "messages", "missing_required_parameter", NULL, "missing messages");
    bad(CHAT, "{\"model\":\"m\",\"prompt\":\"x\"}", 400, "messages", "missing_required_parameter", NULL,
        "prompt instead of messages");
    bad(CHAT, "{\"model\":\"m\",\"messages\":{}}", 400, "messages", "invalid_type", NULL, "object messages");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[]}", 400, "messages", "empty_array",
        "Invalid 'messages': empty array.", "empty messages");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[\"hi\"]}", 400, "messages[0]", "invalid_type", NULL,
        "string message");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role",
        "missing_required_parameter", NULL, "missing role");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":1,\"content\":\"x\"}]}", 400, "messages[0].role",
        "invalid_type", NULL, "numeric role");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\","
              "\"content\":\"r\"}]}", 400, "messages[1].tool_call_id", "missing_required_parameter",
        NULL, "tool message without tool_call_id");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}", 400,
        "messages[0].role", "invalid_value", NULL, "function role (deprecated; not accepted)");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400,
        "messages[0].role", "invalid_value", "'robot'", "unknown role");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"User\",\"content\":\"x\"}]}", 400,
        "messages[0].role", "invalid_value", NULL, "roles are case-sensitive");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content",
        "missing_required_parameter", NULL, "missing content");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":null}]}", 400,
        "messages[0].content", "missing_required_parameter", NULL, "null content");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
              "[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{x\"}}]}]}",
        400, "messages[0].tool_calls[0].function.arguments", "invalid_value", "not valid JSON",
        "assistant tool_calls with arguments that are not JSON");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
        "messages[0].content", "invalid_type", NULL, "numeric content");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[]}]}", 400,
        "messages[0].content", "empty_array", NULL, "empty content parts");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
              "\"content\":[{\"type\":\"text\",\"text\":\"look\"},{\"type\":\"image_url\",\"image_url\":"
              "{\"url\":\"https://x/y.png\"}}]}]}", 400, "messages[1].content[1].type", "invalid_value",
        "only 'text' content parts are supported, got 'image_url'", "image part");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\","
              "\"input_audio\":{}}]}]}", 400, "messages[0].content[0].type", "invalid_value", NULL,
        "audio part");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}", 400,
        "messages[0].content[0].type", "missing_required_parameter", NULL, "part without type");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400,
        "messages[0].content[0].text", "missing_required_parameter", NULL, "text part without text");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":5}]}]}",
        400, "messages[0].content[0].text", "invalid_type", NULL, "numeric text");
    bad(CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}", 400,
        "messages[0].content[0]", "invalid_type", NULL, "string part");
}

#define CBODY(extra) "{\"model\":\"m\",\"prompt\":\"x\"," extra "}"
#define HBODY(extra) "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," extra "}"

static void test_sampling_errors(void)
{
    bad(CMPL, CBODY("\"temperature\":3.5"), 400, "temperature", "decimal_above_max_value",
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3.5 instead.",
        "temperature 3.5");
    bad(CMPL, CBODY("\"temperature\":-0.1"), 400, "temperature", "decimal_below_min_value",
        "Expected a value >= 0, but got -0.1 instead.", "temperature -0.1");
    bad(CMPL, CBODY("\"temperature\":2.0000000001"), 400, "temperature", "decimal_above_max_value",
        "got 2.0000000001 instead", "temperature just above 2 is shown exactly");
    bad(CMPL, CBODY("\"temperature\":\"1\""), 400, "temperature", "invalid_type",
        "Invalid type for 'temperature': expected a number, but got a string instead.",
        "string temperature");
    bad(CMPL, CBODY("\"top_p\":0"), 400, "top_p", "decimal_below_min_value", "Expected a value > 0",
        "top_p 0");
    bad(CMPL, CBODY("\"top_p\":1.5"), 400, "top_p", "decimal_above_max_value", NULL, "top_p 1.5");
    bad(CMPL, CBODY("\"top_k\":0"), 400, "top_k", "invalid_value", "-1 (disabled)", "top_k 0");
    bad(CMPL, CBODY("\"top_k\":-2"), 400, "top_k", "integer_below_min_value", NULL, "top_k -2");
    bad(CMPL, CBODY("\"top_k\":\"5\""), 400, "top_k", "invalid_type", NULL, "string top_k");
    bad(CMPL, CBODY("\"n\":0"), 400, "n", "integer_below_min_value",
        "Invalid 'n': integer below minimum value. Expected a value >= 1, but got 0 instead.", "n 0");
    bad(CMPL, CBODY("\"n\":129"), 400, "n", "integer_above_max_value", "<= 128", "n 129");
    bad(CMPL, CBODY("\"n\":1.5"), 400, "n", "invalid_type",
        "Invalid type for 'n': expected an integer, but got a decimal number instead.", "n 1.5");
    bad(CMPL, CBODY("\"n\":\"2\""), 400, "n", "invalid_type",
        "Invalid type for 'n': expected an integer, but got a string instead.", "n \"2\"");
    bad(CMPL, CBODY("\"n\":true"), 400, "n", "invalid_type", "got a boolean", "n true");
    bad(CMPL, CBODY("\"max_tokens\":0"), 400, "max_tokens", "integer_below_min_value", NULL, "max_tokens 0");
    bad(CMPL, CBODY("\"max_tokens\":-5"), 400, "max_tokens", "integer_below_min_value", NULL, "max_tokens -5");
    bad(CMPL, CBODY("\"max_tokens\":2147483648"), 400, "max_tokens", "integer_above_max_value", NULL,
        "max_tokens above int32");
    bad(CMPL, CBODY("\"max_tokens\":\"10\""), 400, "max_tokens", "invalid_type", NULL, "string max_tokens");
    bad(CHAT, HBODY("\"max_completion_tokens\":0"), 400, "max_completion_tokens",
        "integer_below_min_value", NULL, "max_completion_tokens 0");
    bad(CHAT, HBODY("\"max_completion_tokens\":10,\"max_tokens\":0"), 400, "max_tokens",
        "integer_below_min_value", NULL, "a bad max_tokens is reported even when superseded");
    bad(CMPL, CBODY("\"seed\":1.5"), 400, "seed", "invalid_type", NULL, "seed 1.5");
    bad(CMPL, CBODY("\"seed\":\"1\""), 400, "seed", "invalid_type", NULL, "string seed");
    bad(CMPL, CBODY("\"seed\":1e19"), 400, "seed", "integer_above_max_value", "1e+19", "seed 1e19");
    bad(CMPL, CBODY("\"seed\":-1e19"), 400, "seed", "integer_below_min_value", NULL, "seed -1e19");
    bad(CMPL, CBODY("\"seed\":9223372036854775808.0"), 400, "seed", "integer_above_max_value", NULL,
        "seed 2^63 as a real");
    bad(CMPL, CBODY("\"stop\":5"), 400, "stop", "invalid_type", NULL, "numeric stop");
    bad(CMPL, CBODY("\"stop\":\"\""), 400, "stop", "invalid_value", "non-empty", "empty stop string");
    bad(CMPL, CBODY("\"stop\":[\"a\",\"\"]"), 400, "stop[1]", "invalid_value", NULL, "empty stop in array");
    bad(CMPL, CBODY("\"stop\":[\"a\",1]"), 400, "stop[1]", "invalid_type", NULL, "numeric stop in array");
    bad(CMPL, CBODY("\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]"), 400, "stop", "array_above_max_length",
        "maximum length 4, but got an array with length 5", "5 stop strings");
    bad(CMPL, CBODY("\"stream\":\"true\""), 400, "stream", "invalid_type", NULL, "string stream");
    bad(CMPL, CBODY("\"stream\":1"), 400, "stream", "invalid_type", NULL, "numeric stream");
    bad(CMPL, CBODY("\"stream_options\":{\"include_usage\":true}"), 400, "stream_options", "invalid_value",
        "only allowed when 'stream' is true", "stream_options without stream");
    bad(CMPL, CBODY("\"stream\":false,\"stream_options\":{\"include_usage\":true}"), 400,
        "stream_options", "invalid_value", NULL, "stream_options with stream false");
    bad(CMPL, CBODY("\"stream\":true,\"stream_options\":5"), 400, "stream_options", "invalid_type", NULL,
        "numeric stream_options");
    bad(CMPL, CBODY("\"stream\":true,\"stream_options\":{\"include_usage\":\"yes\"}"), 400,
        "stream_options.include_usage", "invalid_type", NULL, "string include_usage");
    bad(CMPL, CBODY("\"logprobs\":21"), 400, "logprobs", "integer_above_max_value", NULL, "logprobs 21");
    bad(CMPL, CBODY("\"logprobs\":-1"), 400, "logprobs", "integer_below_min_value", NULL, "logprobs -1");
    bad(CMPL, CBODY("\"logprobs\":true"), 400, "logprobs", "invalid_type",
        "expected an integer, but got a boolean", "completions logprobs true");
    bad(CHAT, HBODY("\"logprobs\":5"), 400, "logprobs", "invalid_type",
        "expected a boolean, but got an integer", "chat logprobs 5");
    bad(CHAT, HBODY("\"top_logprobs\":2"), 400, "top_logprobs", "invalid_value",
        "requires 'logprobs' to be true", "top_logprobs without logprobs");
    bad(CHAT, HBODY("\"logprobs\":false,\"top_logprobs\":0"), 400, "top_logprobs", "invalid_value", NULL,
        "top_logprobs with logprobs false");
    bad(CHAT, HBODY("\"logprobs\":true,\"top_logprobs\":21"), 400, "top_logprobs",
        "integer_above_max_value", NULL, "top_logprobs 21");
    bad(CHAT, HBODY("\"user\":5"), 400, "user", "invalid_type", NULL, "numeric user");

    /* known OpenAI fields this server does not implement */
    bad(CMPL, CBODY("\"presence_penalty\":0.5"), 400, "presence_penalty", "unsupported_parameter",
        "Unsupported parameter: 'presence_penalty'", "presence_penalty 0.5");
    bad(CHAT, HBODY("\"frequency_penalty\":-1"), 400, "frequency_penalty", "unsupported_parameter", NULL,
        "frequency_penalty -1");
    bad(CHAT, HBODY("\"logit_bias\":{\"50256\":-100}"), 400, "logit_bias", "unsupported_parameter", NULL,
        "logit_bias");
    bad(CMPL, CBODY("\"echo\":true"), 400, "echo", "unsupported_parameter", NULL, "echo true");
    bad(CMPL, CBODY("\"best_of\":3"), 400, "best_of", "unsupported_parameter", NULL, "best_of 3");
    bad(CMPL, CBODY("\"suffix\":\"end\""), 400, "suffix", "unsupported_parameter", NULL, "suffix");
    bad(CMPL, CBODY("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]"), 400, "tools",
        "unsupported_parameter", NULL, "tools on completions (chat passes them to the template)");
    bad(CHAT, HBODY("\"tools\":[{\"type\":\"function\"}]"), 400, "tools[0].function",
        "missing_required_parameter", NULL, "a tool without its function");
    bad(CHAT, HBODY("\"chat_template_kwargs\":[1]"), 400, "chat_template_kwargs", "invalid_type", NULL,
        "chat_template_kwargs not an object");
    bad(CHAT, HBODY("\"functions\":[{\"name\":\"f\"}]"), 400, "functions", "unsupported_parameter", NULL,
        "functions");
    bad(CHAT, HBODY("\"response_format\":{\"type\":\"json_object\"}"), 400, "response_format",
        "unsupported_parameter", NULL, "response_format json_object");
    {
        kvg_request *r = good(CHAT, HBODY("\"presence_penalty\":0,\"frequency_penalty\":0.0,\"logit_bias\":{},"
                                          "\"echo\":false,\"best_of\":1,\"suffix\":\"\",\"tools\":[],"
                                          "\"functions\":null,\"response_format\":{\"type\":\"text\"}"),
                              "unsupported fields at their default values are accepted");
        kvg_request_free(r);
    }
    /* first error wins, in a fixed order: model before messages before sampling */
    bad(CHAT, "{\"messages\":[],\"temperature\":9}", 400, "model", "missing_required_parameter", NULL,
        "model is checked first");
}

static void test_error_render(void)
{
    kvg_api_error e;
    char buf[KVG_API_ERROR_JSON_MAX];
    size_t n;

    kvg_api_error_set(&e, 400, "invalid_type", "n", "Invalid type for 'n': expected an integer, but got a string instead.");
    n = kvg_api_error_render(&e, buf, sizeof buf);
    is_str(buf, "{\"error\":{\"message\":\"Invalid type for 'n': expected an integer, but got a string "
                "instead.\",\"type\":\"invalid_request_error\",\"param\":\"n\",\"code\":\"invalid_type\"}}",
           "rendered 400");
    is_int(n, strlen(buf), "  length returned");

    kvg_api_error_set(&e, 503, NULL, NULL, "The engine is currently overloaded, please try again later");
    kvg_api_error_render(&e, buf, sizeof buf);
    is_str(buf, "{\"error\":{\"message\":\"The engine is currently overloaded, please try again later\","
                "\"type\":\"server_error\",\"param\":null,\"code\":null}}", "rendered 503 with nulls");

    static const struct { int status; const char *type; } types[] = {
        { 400, "invalid_request_error" }, { 401, "invalid_request_error" },
        { 403, "permission_error" }, { 404, "invalid_request_error" },
        { 405, "invalid_request_error" }, { 413, "invalid_request_error" },
        { 429, "rate_limit_error" }, { 500, "server_error" }, { 502, "server_error" },
        { 503, "server_error" }, { 504, "server_error" },
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        is_str(kvg_api_error_type(types[i].status), types[i].type, "type for %d", types[i].status);

    /* escaping, invalid bytes, round trip through a JSON parser */
    kvg_api_error_set(&e, 401, "invalid_api_key", "a\"b", "quote \" backslash \\ nl \n tab \t ctl \x01 "
                      "del \x7f bad \xff\xc3 ok \xc3\xa9");
    n = kvg_api_error_render(&e, buf, sizeof buf);
    {
        json_error_t je;
        json_t *j = json_loadb(buf, n, 0, &je), *err = json_object_get(j, "error");
        ok(j != NULL, "escaped body is valid JSON");
        is_str(json_string_value(json_object_get(err, "message")),
               "quote \" backslash \\ nl \n tab \t ctl \x01 del \x7f bad \xef\xbf\xbd\xef\xbf\xbd ok \xc3\xa9",
               "  message round-trips (invalid bytes -> U+FFFD)");
        is_str(json_string_value(json_object_get(err, "param")), "a\"b", "  param round-trips");
        is_str(json_string_value(json_object_get(err, "type")), "invalid_request_error", "  401 type");
        is_str(json_string_value(json_object_get(err, "code")), "invalid_api_key", "  401 code");
        json_decref(j);
    }
    /* truncation: snprintf-style */
    {
        char small[16];
        size_t full = kvg_api_error_render(&e, buf, sizeof buf);
        size_t got = kvg_api_error_render(&e, small, sizeof small);
        ok(got == full && strlen(small) == 15 && memcmp(small, buf, 15) == 0,
           "truncated render returns the full length and a NUL-terminated prefix");
        is_int(kvg_api_error_render(&e, NULL, 0), full, "cap 0 only measures");
    }
    /* worst case fits KVG_API_ERROR_JSON_MAX */
    memset(e.message, 1, sizeof e.message - 1);
    e.message[sizeof e.message - 1] = '\0';
    memset(e.param, 2, sizeof e.param - 1);
    e.param[sizeof e.param - 1] = '\0';
    ok(kvg_api_error_render(&e, buf, sizeof buf) < KVG_API_ERROR_JSON_MAX, "worst case fits the maximum");

    /* a parse error renders with its param */
    {
        kvg_request *r = parse(CMPL, CBODY("\"temperature\":3.5"), &e);
        ok(!r, "parse fails");
        kvg_api_error_render(&e, buf, sizeof buf);
        is_str(buf, "{\"error\":{\"message\":\"Invalid 'temperature': decimal above maximum value. Expected a "
                    "value <= 2, but got 3.5 instead.\",\"type\":\"invalid_request_error\",\"param\":"
                    "\"temperature\",\"code\":\"decimal_above_max_value\"}}", "temperature error body");
    }
    /* a long user-supplied value is cut at a character boundary */
    {
        char body[1200];
        size_t o = (size_t)snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"");
        for (int i = 0; i < 100; i++)
            o += (size_t)snprintf(body + o, sizeof body - o, "\xc3\xa9");
        snprintf(body + o, sizeof body - o, "\",\"content\":\"x\"}]}");
        kvg_request *r = parse(CHAT, body, &e);
        ok(!r && strstr(e.message, "...") && kvg_utf8_invalid_at((const unsigned char *)e.message,
                                                                strlen(e.message)) == (size_t)-1,
           "long role quoted, truncated on a character boundary");
    }
}

/* The "kvgate" extension object (self-consistency). */
static void test_kvgate(void)
{
    kvg_request *r;

#define KC "{\"model\":\"m\",\"prompt\":\"q\",\"n\":5,\"kvgate\":"
#define KH "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"n\":5," \
    "\"kvgate\":"
    r = good(CMPL, "{\"model\":\"m\",\"prompt\":\"q\"}", "no kvgate object");
    if (r)
        ok(!r->has_vote && r->vote == 0 && r->answer_pattern == NULL && r->min_samples == 0
           && r->agreement == 0.5 && r->wave == 0, "  kvgate defaults");
    kvg_request_free(r);

    r = good(CMPL, KC "{\"vote\":\"majority\",\"answer_pattern\":\"answer: (\\\\d+)\","
             "\"min_samples\":3,\"agreement\":0.6,\"wave\":2}}", "completions with every kvgate key");
    if (r) {
        ok(r->has_vote && r->vote == KVG_VOTE_MAJORITY, "  vote majority");
        ok(str_is(r->answer_pattern, r->answer_pattern_len, "answer: (\\d+)"), "  answer_pattern");
        ok(r->min_samples == 3 && r->agreement == 0.6 && r->wave == 2 && r->n == 5,
           "  min_samples, agreement, wave");
    }
    kvg_request_free(r);

    r = good(CHAT, KH "{\"vote\":\"logprob\"}}", "chat with a logprob vote");
    if (r)
        ok(r->has_vote && r->vote == KVG_VOTE_LOGPROB && r->answer_pattern == NULL
           && r->min_samples == 0 && r->agreement == 0.5 && r->wave == 0, "  logprob, defaults");
    kvg_request_free(r);

    r = good(CHAT, KH "{\"vote\":\"majority\",\"min_samples\":5,\"agreement\":1,"
             "\"wave\":100,\"answer_pattern\":null}}", "chat: min_samples = n, agreement 1, big wave");
    if (r)
        ok(r->has_vote && r->min_samples == 5 && r->agreement == 1.0 && r->wave == 100
           && r->answer_pattern == NULL, "  the bounds are inclusive; null = absent");
    kvg_request_free(r);

    r = good(CMPL, KC "null}", "kvgate null");
    if (r)
        ok(!r->has_vote, "  null: no vote");
    kvg_request_free(r);
    r = good(CMPL, KC "{}}", "kvgate {}");
    if (r)
        ok(!r->has_vote, "  {}: no vote");
    kvg_request_free(r);
    r = good(CMPL, KC "{\"vote\":null,\"wave\":null}}", "kvgate with only nulls");
    if (r)
        ok(!r->has_vote, "  only nulls: no vote");
    kvg_request_free(r);
    r = good(CMPL, "{\"model\":\"m\",\"prompt\":\"q\",\"n\":32,\"kvgate\":{\"vote\":\"majority\"}}",
             "n = 32 with a vote");
    kvg_request_free(r);
    r = good(CMPL, "{\"model\":\"m\",\"prompt\":\"q\",\"n\":64}", "n = 64 without a vote");
    kvg_request_free(r);
    r = good(CMPL, "{\"model\":\"m\",\"prompt\":\"q\",\"kvgate\":{\"vote\":\"majority\","
             "\"min_samples\":1,\"agreement\":1e-9,\"wave\":1.0}}", "n = 1, integral 1.0, tiny agreement");
    if (r)
        ok(r->n == 1 && r->min_samples == 1 && r->wave == 1, "  n 1, min_samples 1, wave 1");
    kvg_request_free(r);
    r = good(CMPL, "{\"model\":\"m\",\"prompt\":\"q\",\"n\":5,\"kvgate\":{\"vote\":\"logprob\","
             "\"answer_pattern\":\"= (\\\\d+)\",\"min_samples\":3,\"agreement\":0.75}}", "a logprob vote");
    if (r) {
        char *j = kvg_request_to_json(r);
        ok(j && strstr(j, ",\"kvgate\":{\"vote\":\"logprob\",\"answer_pattern\":\"= (\\\\d+)\","
                          "\"min_samples\":3,\"agreement\":0.75,\"wave\":0}}"),
           "  the dump (the fuzzer's canonical form) carries the kvgate object: %s", j ? j : "(null)");
        free(j);
    }
    kvg_request_free(r);

    for (int ep = CMPL; ep <= CHAT; ep++) {
        kvg_endpoint e = (kvg_endpoint)ep;
        char body[2048];
#define B(obj) (snprintf(body, sizeof body, "%s%s}", e == CMPL ? KC : KH, obj), body)
        bad(e, B("[]"), 400, "kvgate", "invalid_type", "expected an object", "kvgate an array");
        bad(e, B("\"majority\""), 400, "kvgate", "invalid_type", NULL, "kvgate a string");
        bad(e, B("{\"vote\":\"majority\",\"votes\":1}"), 400, "kvgate.votes", "unknown_parameter",
            "Unknown parameter", "unknown key");
        bad(e, B("{\"Vote\":\"majority\"}"), 400, "kvgate.Vote", "unknown_parameter", NULL,
            "keys are case-sensitive");
        bad(e, B("{\"vote\":\"mode\"}"), 400, "kvgate.vote", "invalid_value", "'mode'", "unknown vote");
        bad(e, B("{\"vote\":\"\"}"), 400, "kvgate.vote", "invalid_value", NULL, "empty vote");
        bad(e, B("{\"vote\":1}"), 400, "kvgate.vote", "invalid_type", NULL, "vote a number");
        bad(e, B("{\"min_samples\":3}"), 400, "kvgate.vote", "missing_required_parameter",
            "required", "a key without vote");
        bad(e, B("{\"vote\":null,\"agreement\":0.5}"), 400, "kvgate.vote",
            "missing_required_parameter", NULL, "vote null with another key");
        bad(e, B("{\"vote\":\"majority\",\"min_samples\":0}"), 400, "kvgate.min_samples",
            "integer_below_min_value", NULL, "min_samples 0");
        bad(e, B("{\"vote\":\"majority\",\"min_samples\":-1}"), 400, "kvgate.min_samples",
            "integer_below_min_value", NULL, "min_samples < 0");
        bad(e, B("{\"vote\":\"majority\",\"min_samples\":6}"), 400, "kvgate.min_samples",
            "integer_above_max_value", "<= 5", "min_samples > n");
        bad(e, B("{\"vote\":\"majority\",\"min_samples\":2.5}"), 400, "kvgate.min_samples",
            "invalid_type", NULL, "min_samples fractional");
        bad(e, B("{\"vote\":\"majority\",\"min_samples\":\"3\"}"), 400, "kvgate.min_samples",
            "invalid_type", NULL, "min_samples a string");
        bad(e, B("{\"vote\":\"majority\",\"agreement\":0}"), 400, "kvgate.agreement",
            "decimal_below_min_value", "> 0", "agreement 0");
        bad(e, B("{\"vote\":\"majority\",\"agreement\":-0.5}"), 400, "kvgate.agreement",
            "decimal_below_min_value", NULL, "agreement < 0");
        bad(e, B("{\"vote\":\"majority\",\"agreement\":1.01}"), 400, "kvgate.agreement",
            "decimal_above_max_value", NULL, "agreement > 1");
        bad(e, B("{\"vote\":\"majority\",\"agreement\":true}"), 400, "kvgate.agreement",
            "invalid_type", NULL, "agreement a boolean");
        bad(e, B("{\"vote\":\"majority\",\"wave\":0}"), 400, "kvgate.wave",
            "integer_below_min_value", NULL, "wave 0");
        bad(e, B("{\"vote\":\"majority\",\"wave\":{}}"), 400, "kvgate.wave", "invalid_type", NULL,
            "wave an object");
        bad(e, B("{\"vote\":\"majority\",\"answer_pattern\":\"\"}"), 400, "kvgate.answer_pattern",
            "invalid_value", "empty", "answer_pattern empty");
        bad(e, B("{\"vote\":\"majority\",\"answer_pattern\":[\"(x)\"]}"), 400,
            "kvgate.answer_pattern", "invalid_type", NULL, "answer_pattern an array");
        {
            char obj[1200];
            int o = snprintf(obj, sizeof obj, "{\"vote\":\"majority\",\"answer_pattern\":\"(");
            memset(obj + o, 'x', 1024);
            snprintf(obj + o + 1024, sizeof obj - (size_t)o - 1024, ")\"}");
            bad(e, B(obj), 400, "kvgate.answer_pattern", "string_above_max_length", "1024",
                "answer_pattern over 1024 bytes");
            obj[o + 1022] = ')';
            snprintf(obj + o + 1023, sizeof obj - (size_t)o - 1023, "\"}");
            r = good(e, B(obj), "answer_pattern of exactly 1024 bytes");
            if (r)
                is_int(r->answer_pattern_len, 1024, "  1024 bytes kept");
            kvg_request_free(r);
        }
#undef B
        snprintf(body, sizeof body, "%s", e == CMPL
                 ? "{\"model\":\"m\",\"prompt\":\"q\",\"n\":33,\"kvgate\":{\"vote\":\"logprob\"}}"
                 : "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                   "\"n\":33,\"kvgate\":{\"vote\":\"logprob\"}}");
        bad(e, body, 400, "n", "integer_above_max_value", "<= 32", "n over 32 with a vote");
    }
#undef KC
#undef KH
}


/* Anthropic's Messages API: the chat messages the template gets, cache_control
 * breakpoints kept, and every refusal. */
static void test_messages(void)
{
    kvg_request *r;
    kvg_api_error e;
    char buf[KVG_API_ERROR_JSON_MAX];

    /* what @anthropic-ai/sdk sends for messages.create({...}) */
    r = good(MSGS, "{\"model\":\"m\",\"max_tokens\":64,"
                   "\"system\":[{\"type\":\"text\",\"text\":\"You are helpful.\","
                   "\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}},"
                   "{\"type\":\"text\",\"text\":\"Be brief.\"}],"
                   "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                   "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Hello!\"}]},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"One.\"},"
                   "{\"type\":\"text\",\"text\":\"Two.\",\"cache_control\":{\"type\":\"ephemeral\"}}]}],"
                   "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"stop_sequences\":[\"END\",\"\\n\\n\"],"
                   "\"stream\":true,\"metadata\":{\"user_id\":\"u-1\"},\"tools\":[],\"thinking\":"
                   "{\"type\":\"disabled\"},\"tenant\":\"sneaky\"}",
             "a full Messages body");
    if (r) {
        is_int(r->endpoint, MSGS, "  endpoint");
        is_int(r->prompt_kind, KVG_PROMPT_NONE, "  no prompt");
        is_int(r->n_messages, 3, "  3 messages");
        is_str(msg_field(r, 0, "role"), "system", "  the system prompt first");
        is_str(msg_field(r, 0, "content"), "You are helpful.\nBe brief.", "  its blocks joined as chat parts are");
        is_str(msg_field(r, 1, "content"), "Hi", "  a string content");
        is_str(msg_field(r, 2, "role"), "assistant", "  the assistant's turn");
        is_str(msg_field(r, 3, "content"), "One.\nTwo.", "  text blocks");
        ok(r->has_max_tokens && r->max_tokens == 64, "  max_tokens");
        ok(r->temperature == 0.5 && r->top_p == 0.9 && r->top_k == 40 && r->n == 1, "  sampling");
        ok(r->n_stop == 2 && str_is(r->stop[0], r->stop_len[0], "END"), "  stop_sequences");
        ok(r->stream && !r->include_usage, "  stream");
        is_int(r->n_cache_breakpoints, 2, "  2 cache_control breakpoints");
        ok(r->cache_breakpoints[0].message == -1 && r->cache_breakpoints[0].block == 0
           && r->cache_breakpoints[0].ttl_s == 3600, "  system block 0, 1h");
        ok(r->cache_breakpoints[1].message == 2 && r->cache_breakpoints[1].block == 1
           && r->cache_breakpoints[1].ttl_s == 300, "  messages.2 block 1, 5m by default");
    }
    kvg_request_free(r);

    r = good(MSGS, "{\"model\":\"m\",\"max_tokens\":1,\"system\":\"\","
                   "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "an empty system prompt");
    if (r) {
        is_int(r->n_messages, 1, "  1 message");
        is_str(msg_field(r, 0, "role"), "user", "  no system message");
        is_int(r->n_cache_breakpoints, 0, "  no breakpoints");
    }
    kvg_request_free(r);

#define U "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]"
#define CC(x) "{\"type\":\"text\",\"text\":\"" x "\",\"cache_control\":{\"type\":\"ephemeral\"}}"
    bad(MSGS, "{\"model\":\"m\"," U "}", 400, "max_tokens", "missing_required_parameter",
        "max_tokens", "no max_tokens");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":0," U "}", 400, "max_tokens", "integer_below_min_value",
        NULL, "max_tokens 0");
    bad(MSGS, "{\"max_tokens\":4," U "}", 400, "model", "missing_required_parameter", NULL, "no model");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"messages\":[]}", 400, "messages", "empty_array", NULL,
        "messages []");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}",
        400, "messages.0.role", "invalid_value", "top-level `system`", "role system");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
        400, "messages.0.role", "invalid_value", "'user' or 'assistant'", "role tool");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":[]}]}",
        400, "messages.0.content", "empty_array", NULL, "content []");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
              "[{\"type\":\"image\",\"source\":{}}]}]}", 400, "messages.0.content.0.type",
        "unsupported_value", "content blocks of type 'image' are not supported", "an image block");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
              "[{\"type\":\"tool_result\",\"tool_use_id\":\"t\"}]}]}", 400, "messages.0.content.0.type",
        "unsupported_value", "'tool_result'", "a tool_result block");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
              "[{\"type\":\"text\",\"text\":3}]}]}", 400, "messages.0.content.0.text", "invalid_type", NULL,
        "text 3");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
              "{\"role\":\"assistant\",\"content\":\"b\"}]}", 400, "messages.1", "unsupported_value",
        "prefill", "an assistant prefill");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"system\":[" CC("a") "," CC("b") "],"
              "\"messages\":[{\"role\":\"user\",\"content\":[" CC("c") "," CC("d") "," CC("e") "]}]}",
        400, "", "invalid_value", "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        "5 breakpoints");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"system\":[{\"type\":\"text\",\"text\":\"a\","
              "\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"10m\"}}]," U "}", 400,
        "system.0.cache_control.ttl", "invalid_value", "'5m' or '1h'", "ttl 10m");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"system\":[{\"type\":\"text\",\"text\":\"a\","
              "\"cache_control\":{\"type\":\"persistent\"}}]," U "}", 400,
        "system.0.cache_control.type", "invalid_value", "'ephemeral'", "cache_control type persistent");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"system\":[{\"type\":\"text\",\"text\":\"a\","
              "\"cache_control\":\"yes\"}]," U "}", 400, "system.0.cache_control", "invalid_type", NULL,
        "cache_control a string");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"temperature\":1.5," U "}", 400, "temperature",
        "decimal_above_max_value", NULL, "temperature 1.5 (Anthropic's range is 0..1)");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"stop_sequences\":[\"a\",\"b\",\"c\",\"d\",\"e\"]," U "}",
        400, "stop_sequences", "array_above_max_length", "at most 4", "5 stop sequences");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"stop_sequences\":[\"\"]," U "}", 400,
        "stop_sequences.0", "invalid_value", NULL, "an empty stop sequence");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"metadata\":{\"user_id\":5}," U "}", 400,
        "metadata.user_id", "invalid_type", NULL, "metadata.user_id 5");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"tools\":[{\"name\":\"f\"}]," U "}", 400, "tools",
        "unsupported_value", "not supported", "tools");
    bad(MSGS, "{\"model\":\"m\",\"max_tokens\":4,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},"
              U "}", 400, "thinking", "unsupported_value", "not supported", "thinking enabled");
#undef U
#undef CC

    /* the error object */
    kvg_api_error_set(&e, 400, "invalid_value", "x", "x: bad \"value\".");
    kvg_api_error_render_anthropic(&e, buf, sizeof buf);
    is_str(buf, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\","
                "\"message\":\"x: bad \\\"value\\\".\"}}", "Anthropic's error object");
    static const struct { int status; const char *type; } types[] = {
        { 400, "invalid_request_error" }, { 401, "authentication_error" },
        { 403, "permission_error" }, { 404, "not_found_error" }, { 405, "invalid_request_error" },
        { 413, "request_too_large" }, { 429, "rate_limit_error" }, { 500, "api_error" },
        { 503, "overloaded_error" }, { 504, "api_error" }, { 529, "overloaded_error" },
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        is_str(kvg_api_error_anthropic_type(types[i].status), types[i].type, "  %d: %s",
               types[i].status, types[i].type);
}

int main(void)
{
    test_completions_shapes();
    test_chat_shapes();
    test_cache_salt();
    test_body_errors();
    test_field_errors();
    test_sampling_errors();
    test_error_render();
    test_kvgate();
    test_messages();
    return done_testing();
}
