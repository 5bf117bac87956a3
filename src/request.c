#include "request.h"

#include <jansson.h>
#include <math.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_json.h"
#include "chat_vars.h"
#include "utf8.h"

/* ---- memory: a chunk list, so the request and everything it points at go
 * away with one kvg_request_free() and parsing needs few mallocs. ---- */

typedef struct chunk {
    struct chunk *next;
    size_t cap, used;
    alignas(max_align_t) unsigned char data[];
} chunk;

#define CHUNK_MIN 4096

static void *arena_alloc(chunk **head, size_t n)
{
    chunk *c = *head, *nc;
    size_t off, cap;

    if (n > SIZE_MAX / 2)
        return NULL;
    n = n ? (n + 15) & ~(size_t)15 : 16;
    if (c && c->cap - c->used >= n) {
        off = c->used;
        c->used += n;
        return c->data + off;
    }
    cap = n > CHUNK_MIN ? n : CHUNK_MIN;
    if (!(nc = malloc(sizeof(chunk) + cap)))
        return NULL;
    nc->cap = cap;
    nc->used = n;
    if (c && n > CHUNK_MIN / 2) {
        /* a big block gets its own chunk behind the current one, whose free
         * space stays usable for the small allocations that follow */
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        *head = nc;
    }
    return nc->data;
}

static void arena_free(chunk *c)
{
    while (c) {
        chunk *next = c->next;
        free(c);
        c = next;
    }
}

/* ---- parse context and error helpers ---- */

typedef struct {
    chunk *mem;
    kvg_request *req;
    kvg_api_error *err;
    kvg_endpoint ep;
    size_t n_cache_control;          /* /v1/messages: cache_control blocks seen */
} pctx;

static int oom(pctx *p)
{
    return kvg_api_error_set(p->err, 500, NULL, NULL, "out of memory while parsing the request");
}

static void *alloc(pctx *p, size_t n)
{
    void *m = arena_alloc(&p->mem, n);
    if (!m)
        oom(p);
    return m;
}

static char *copy_str(pctx *p, const char *s, size_t n)
{
    char *d = alloc(p, n + 1);
    if (!d)
        return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static int type_error(pctx *p, const char *param, const char *expected, const json_t *got)
{
    return kvg_api_error_set(p->err, 400, "invalid_type", param,
                             "Invalid type for '%s': expected %s, but got %s instead.",
                             param, expected, kvg_api_json_type(got));
}

/* Shortest of %.15g / %.17g that reads back as the same double, so a message
 * never claims "got 2" for 2.0000000001. */
static void fmt_num(double d, char *buf, size_t cap)
{
    snprintf(buf, cap, "%.15g", d);
    if (strtod(buf, NULL) != d)
        snprintf(buf, cap, "%.17g", d);
}

static int get_int(pctx *p, const json_t *v, const char *param, int64_t lo, int64_t hi,
                   int64_t *out)
{
    int64_t x;
    char num[40];

    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != floor(d))
            return type_error(p, param, "an integer", v);
        if (d < -9223372036854775808.0 || d >= 9223372036854775808.0) {
            fmt_num(d, num, sizeof num);
            return kvg_api_error_set(p->err, 400,
                                     d < 0 ? "integer_below_min_value" : "integer_above_max_value",
                                     param, "Invalid '%s': integer %s. Expected a value %s %lld, "
                                     "but got %s instead.", param,
                                     d < 0 ? "below minimum value" : "above maximum value",
                                     d < 0 ? ">=" : "<=", (long long)(d < 0 ? lo : hi), num);
        }
        x = (int64_t)d;
    } else {
        return type_error(p, param, "an integer", v);
    }
    if (x < lo)
        return kvg_api_error_set(p->err, 400, "integer_below_min_value", param,
                                 "Invalid '%s': integer below minimum value. Expected a value "
                                 ">= %lld, but got %lld instead.", param, (long long)lo,
                                 (long long)x);
    if (x > hi)
        return kvg_api_error_set(p->err, 400, "integer_above_max_value", param,
                                 "Invalid '%s': integer above maximum value. Expected a value "
                                 "<= %lld, but got %lld instead.", param, (long long)hi,
                                 (long long)x);
    *out = x;
    return 0;
}

static int get_int32(pctx *p, const json_t *v, const char *param, int64_t lo, int64_t hi,
                     int32_t *out)
{
    int64_t x;
    if (get_int(p, v, param, lo, hi, &x) < 0)
        return -1;
    *out = (int32_t)x;
    return 0;
}

/* A number in [lo, hi], or (lo, hi] when lo_open. */
static int get_number(pctx *p, const json_t *v, const char *param, double lo, int lo_open,
                      double hi, double *out)
{
    double d;
    char got[40], lim[40];

    if (!json_is_number(v))
        return type_error(p, param, "a number", v);
    d = json_number_value(v) + 0.0;     /* -0.0 becomes 0.0 */
    fmt_num(d, got, sizeof got);
    if (lo_open ? d <= lo : d < lo) {
        fmt_num(lo, lim, sizeof lim);
        return kvg_api_error_set(p->err, 400, "decimal_below_min_value", param,
                                 "Invalid '%s': decimal below minimum value. Expected a value "
                                 "%s %s, but got %s instead.", param, lo_open ? ">" : ">=",
                                 lim, got);
    }
    if (d > hi) {
        fmt_num(hi, lim, sizeof lim);
        return kvg_api_error_set(p->err, 400, "decimal_above_max_value", param,
                                 "Invalid '%s': decimal above maximum value. Expected a value "
                                 "<= %s, but got %s instead.", param, lim, got);
    }
    *out = d;
    return 0;
}

static int get_bool(pctx *p, const json_t *v, const char *param, int *out)
{
    if (!json_is_boolean(v))
        return type_error(p, param, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

static int missing(pctx *p, const char *param)
{
    return kvg_api_error_set(p->err, 400, "missing_required_parameter", param,
                             "Missing required parameter: '%s'.", param);
}

static int empty_array(pctx *p, const char *param)
{
    return kvg_api_error_set(p->err, 400, "empty_array", param,
                             "Invalid '%s': empty array. Expected an array with minimum length 1, "
                             "but got an empty array instead.", param);
}

/* ---- fields ---- */

static int parse_model(pctx *p, const json_t *root)
{
    json_t *v = kvg_api_field(root, "model");
    size_t n;

    if (!v)
        return missing(p, "model");
    if (!json_is_string(v))
        return type_error(p, "model", "a string", v);
    n = json_string_length(v);
    if (n == 0)
        return kvg_api_error_set(p->err, 400, "invalid_value", "model",
                                 "Invalid 'model': empty string. Expected a model name.");
    if (n > KVG_REQ_MAX_MODEL_LEN)
        return kvg_api_error_set(p->err, 400, "string_above_max_length", "model",
                                 "Invalid 'model': string too long. Expected a string with maximum "
                                 "length %d, but got a string with length %zu instead.",
                                 KVG_REQ_MAX_MODEL_LEN, n);
    if (!(p->req->model = copy_str(p, json_string_value(v), n)))
        return -1;
    p->req->model_len = n;
    return 0;
}

static int parse_tokens(pctx *p, const json_t *arr, const char *param)
{
    size_t n = json_array_size(arr);
    int32_t *ids;
    char sub[KVG_API_ERROR_PARAM_MAX];

    if (n == 0)
        return empty_array(p, param);
    if (n > SIZE_MAX / sizeof(int32_t))
        return oom(p);
    if (!(ids = alloc(p, n * sizeof(int32_t))))
        return -1;
    for (size_t i = 0; i < n; i++) {
        kvg_api_param(sub, sizeof sub, "%s[%zu]", param, i);
        if (get_int32(p, json_array_get(arr, i), sub, 0, INT32_MAX, &ids[i]) < 0)
            return -1;
    }
    p->req->prompt_kind = KVG_PROMPT_TOKENS;
    p->req->prompt_tokens = ids;
    p->req->n_prompt_tokens = n;
    return 0;
}

static int set_text_prompt(pctx *p, const json_t *s, const char *param)
{
    size_t n = json_string_length(s);

    if (n == 0)
        return kvg_api_error_set(p->err, 400, "invalid_value", param,
                                 "Invalid '%s': empty string. Expected a non-empty prompt.", param);
    if (!(p->req->prompt = copy_str(p, json_string_value(s), n)))
        return -1;
    p->req->prompt_kind = KVG_PROMPT_TEXT;
    p->req->prompt_len = n;
    return 0;
}

static int batched(pctx *p)
{
    return kvg_api_error_set(p->err, 400, "unsupported_value", "prompt",
                             "Invalid 'prompt': batched prompts are not supported; send one "
                             "prompt per request.");
}

static int parse_prompt(pctx *p, const json_t *root)
{
    json_t *v = kvg_api_field(root, "prompt"), *first;
    size_t n;
    char sub[KVG_API_ERROR_PARAM_MAX];

    if (!v)
        return missing(p, "prompt");
    if (json_is_string(v))
        return set_text_prompt(p, v, "prompt");
    if (!json_is_array(v))
        return type_error(p, "prompt", "a string or an array", v);
    n = json_array_size(v);
    if (n == 0)
        return empty_array(p, "prompt");
    first = json_array_get(v, 0);
    if (json_is_number(first))
        return parse_tokens(p, v, "prompt");
    if (!json_is_string(first) && !json_is_array(first))
        return type_error(p, "prompt[0]", "a string, an integer or an array", first);
    /* an array of prompts: one is fine, several are a batch */
    for (size_t i = 1; i < n; i++) {
        json_t *e = json_array_get(v, i);
        if (json_typeof(e) != json_typeof(first)) {
            kvg_api_param(sub, sizeof sub, "prompt[%zu]", i);
            return type_error(p, sub, json_is_string(first) ? "a string" : "an array", e);
        }
    }
    if (n > 1)
        return batched(p);
    if (json_is_string(first))
        return set_text_prompt(p, first, "prompt[0]");
    return parse_tokens(p, first, "prompt[0]");
}

/* messages, tools and chat_template_kwargs become the chat template's data
 * (chat_vars.h validates them as the OpenAI API does). */
static int parse_messages(pctx *p, const json_t *root)
{
    json_t *v = kvg_api_field(root, "messages"), *tools = kvg_api_field(root, "tools"), *kw;
    char msg[512], param[KVG_API_ERROR_PARAM_MAX];
    int rc;

    if (!v)
        return missing(p, "messages");
    if (!json_is_array(v))
        return type_error(p, "messages", "an array", v);
    if (json_array_size(v) == 0)
        return empty_array(p, "messages");
    if ((kw = kvg_api_field(root, "chat_template_kwargs")) && !json_is_object(kw))
        return type_error(p, "chat_template_kwargs", "an object", kw);
    if (json_is_null(tools))
        tools = NULL;
    param[0] = '\0';
    rc = kvg_chat_vars_build(v, tools, kw, &p->req->chat_data, msg, sizeof msg, param, sizeof param);
    if (rc == KVG_CHAT_VARS_NOMEM)
        return oom(p);
    if (rc != KVG_CHAT_VARS_OK)
        return kvg_api_error_set(p->err, 400, kvg_chat_vars_error_code(msg),
                                 param[0] ? param : "messages", "%s", msg);
    p->req->n_messages = json_array_size(v);
    return 0;
}

static int parse_stop(pctx *p, const json_t *root)
{
    json_t *v = kvg_api_field(root, "stop");
    kvg_request *r = p->req;
    char param[KVG_API_ERROR_PARAM_MAX];
    size_t n;

    if (!v)
        return 0;
    if (json_is_string(v)) {
        n = 1;
    } else if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > KVG_REQ_MAX_STOP)
            return kvg_api_error_set(p->err, 400, "array_above_max_length", "stop",
                                     "Invalid 'stop': array too long. Expected an array with "
                                     "maximum length %d, but got an array with length %zu instead.",
                                     KVG_REQ_MAX_STOP, n);
    } else {
        return type_error(p, "stop", "a string or an array of strings", v);
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_string(v) ? v : json_array_get(v, i);

        if (json_is_string(v))
            kvg_api_param(param, sizeof param, "stop");
        else
            kvg_api_param(param, sizeof param, "stop[%zu]", i);
        if (!json_is_string(s))
            return type_error(p, param, "a string", s);
        if (json_string_length(s) == 0)
            return kvg_api_error_set(p->err, 400, "invalid_value", param,
                                     "Invalid '%s': empty string. Stop sequences must be "
                                     "non-empty.", param);
        r->stop_len[i] = json_string_length(s);
        if (!(r->stop[i] = copy_str(p, json_string_value(s), r->stop_len[i])))
            return -1;
    }
    r->n_stop = n;
    return 0;
}

static int parse_stream(pctx *p, const json_t *root)
{
    json_t *v = kvg_api_field(root, "stream"), *opts, *usage;

    if (v && get_bool(p, v, "stream", &p->req->stream) < 0)
        return -1;
    if (!(opts = kvg_api_field(root, "stream_options")))
        return 0;
    if (!p->req->stream)
        return kvg_api_error_set(p->err, 400, "invalid_value", "stream_options",
                                 "Invalid 'stream_options': only allowed when 'stream' is true.");
    if (!json_is_object(opts))
        return type_error(p, "stream_options", "an object", opts);
    usage = kvg_api_field(opts, "include_usage");
    if (usage && get_bool(p, usage, "stream_options.include_usage", &p->req->include_usage) < 0)
        return -1;
    return 0;
}

static int parse_logprobs(pctx *p, const json_t *root)
{
    kvg_request *r = p->req;
    json_t *v = kvg_api_field(root, "logprobs"), *top;

    if (p->ep == KVG_ENDPOINT_COMPLETIONS) {
        if (!v)
            return 0;
        if (get_int32(p, v, "logprobs", 0, KVG_REQ_MAX_LOGPROBS, &r->top_logprobs) < 0)
            return -1;
        r->has_logprobs = 1;
        return 0;
    }
    if (v && get_bool(p, v, "logprobs", &r->has_logprobs) < 0)
        return -1;
    if (!(top = kvg_api_field(root, "top_logprobs")))
        return 0;
    if (!r->has_logprobs)
        return kvg_api_error_set(p->err, 400, "invalid_value", "top_logprobs",
                                 "Invalid 'top_logprobs': requires 'logprobs' to be true.");
    return get_int32(p, top, "top_logprobs", 0, KVG_REQ_MAX_LOGPROBS, &r->top_logprobs);
}

/* OpenAI fields this server does not implement: accepted only at their
 * no-op value, because ignoring them would silently change the answer. */
static int is_default_value(const char *key, const json_t *v)
{
    if (!strcmp(key, "presence_penalty") || !strcmp(key, "frequency_penalty"))
        return json_is_number(v) && json_number_value(v) == 0.0;
    if (!strcmp(key, "logit_bias"))
        return json_is_object(v) && json_object_size(v) == 0;
    if (!strcmp(key, "best_of"))
        return json_is_number(v) && json_number_value(v) == 1.0;
    if (!strcmp(key, "echo"))
        return json_is_false(v);
    if (!strcmp(key, "suffix"))
        return json_is_string(v) && json_string_length(v) == 0;
    if (!strcmp(key, "tools") || !strcmp(key, "functions"))
        return json_is_array(v) && json_array_size(v) == 0;
    if (!strcmp(key, "response_format")) {
        json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        return json_is_string(t) && !strcmp(json_string_value(t), "text");
    }
    return 1;
}

static int check_unsupported(pctx *p, const json_t *root)
{
    static const char *const KEYS[] = { "presence_penalty", "frequency_penalty", "logit_bias",
                                        "best_of", "echo", "suffix", "tools", "functions",
                                        "response_format" };
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++) {
        json_t *v = kvg_api_field(root, KEYS[i]);
        /* chat passes tools to the template (parse_messages) */
        if (p->ep == KVG_ENDPOINT_CHAT && !strcmp(KEYS[i], "tools"))
            continue;
        if (v && !is_default_value(KEYS[i], v))
            return kvg_api_error_set(p->err, 400, "unsupported_parameter", KEYS[i],
                                     "Unsupported parameter: '%s' is not supported by this "
                                     "server (only its default value is accepted).", KEYS[i]);
    }
    return 0;
}

static int parse_sampling(pctx *p, const json_t *root)
{
    kvg_request *r = p->req;
    json_t *v;

    /* chat: max_completion_tokens supersedes the deprecated max_tokens */
    if (p->ep == KVG_ENDPOINT_CHAT && (v = kvg_api_field(root, "max_completion_tokens"))) {
        if (get_int32(p, v, "max_completion_tokens", 1, INT32_MAX, &r->max_tokens) < 0)
            return -1;
        r->has_max_tokens = 1;
    }
    if ((v = kvg_api_field(root, "max_tokens"))) {
        int32_t mt;
        if (get_int32(p, v, "max_tokens", 1, INT32_MAX, &mt) < 0)
            return -1;
        if (!r->has_max_tokens) {
            r->max_tokens = mt;
            r->has_max_tokens = 1;
        }
    }
    if ((v = kvg_api_field(root, "temperature")) && get_number(p, v, "temperature", 0, 0, 2, &r->temperature) < 0)
        return -1;
    if ((v = kvg_api_field(root, "top_p")) && get_number(p, v, "top_p", 0, 1, 1, &r->top_p) < 0)
        return -1;
    if ((v = kvg_api_field(root, "top_k"))) {
        if (get_int32(p, v, "top_k", -1, INT32_MAX, &r->top_k) < 0)
            return -1;
        if (r->top_k == 0)
            return kvg_api_error_set(p->err, 400, "invalid_value", "top_k",
                                     "Invalid 'top_k': expected -1 (disabled) or a value >= 1, "
                                     "but got 0 instead.");
    }
    if ((v = kvg_api_field(root, "n")) && get_int32(p, v, "n", 1, KVG_REQ_MAX_N, &r->n) < 0)
        return -1;
    if ((v = kvg_api_field(root, "seed"))) {
        if (get_int(p, v, "seed", INT64_MIN, INT64_MAX, &r->seed) < 0)
            return -1;
        r->has_seed = 1;
    }
    if ((v = kvg_api_field(root, "user"))) {
        if (!json_is_string(v))
            return type_error(p, "user", "a string", v);
        r->user_len = json_string_length(v);
        if (!(r->user = copy_str(p, json_string_value(v), r->user_len)))
            return -1;
    }
    return 0;
}

/* The "kvgate" extension object. n is parsed before (min_samples <= n). */
static int parse_kvgate(pctx *p, const json_t *root)
{
    static const char *const KEYS[] = { "vote", "answer_pattern", "min_samples", "agreement",
                                        "wave" };
    kvg_request *r = p->req;
    json_t *obj = kvg_api_field(root, "kvgate"), *v, *val;
    const char *key;
    char param[KVG_API_ERROR_PARAM_MAX];
    int any = 0;

    if (!obj)
        return 0;
    if (!json_is_object(obj))
        return type_error(p, "kvgate", "an object", obj);
    json_object_foreach(obj, key, val) {
        size_t i;
        for (i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++)
            if (!strcmp(key, KEYS[i]))
                break;
        if (i == sizeof KEYS / sizeof KEYS[0]) {
            kvg_api_param(param, sizeof param, "kvgate.%s", key);
            return kvg_api_error_set(p->err, 400, "unknown_parameter", param,
                                     "Unknown parameter: '%s'. The kvgate object accepts 'vote', "
                                     "'answer_pattern', 'min_samples', 'agreement' and 'wave'.",
                                     param);
        }
        if (!json_is_null(val))
            any = 1;
    }
    if (!any)
        return 0;
    if (!(v = kvg_api_field(obj, "vote")))
        return kvg_api_error_set(p->err, 400, "missing_required_parameter", "kvgate.vote",
                                 "Missing required parameter: 'kvgate.vote' ('majority' or "
                                 "'logprob') is required when the kvgate object is given.");
    if (!json_is_string(v))
        return type_error(p, "kvgate.vote", "a string", v);
    if (!strcmp(json_string_value(v), "majority")) {
        r->vote = KVG_VOTE_MAJORITY;
    } else if (!strcmp(json_string_value(v), "logprob")) {
        r->vote = KVG_VOTE_LOGPROB;
    } else {
        char q[80];
        kvg_api_quote(json_string_value(v), json_string_length(v), q, sizeof q);
        return kvg_api_error_set(p->err, 400, "invalid_value", "kvgate.vote",
                                 "Invalid value for 'kvgate.vote': %s. Supported values are: "
                                 "'majority' and 'logprob'.", q);
    }
    r->has_vote = 1;
    if ((v = kvg_api_field(obj, "answer_pattern"))) {
        size_t n;
        if (!json_is_string(v))
            return type_error(p, "kvgate.answer_pattern", "a string", v);
        n = json_string_length(v);
        if (n == 0)
            return kvg_api_error_set(p->err, 400, "invalid_value", "kvgate.answer_pattern",
                                     "Invalid 'kvgate.answer_pattern': empty string. Expected a "
                                     "regular expression with one capture group.");
        if (n > KVG_REQ_MAX_PATTERN_LEN)
            return kvg_api_error_set(p->err, 400, "string_above_max_length",
                                     "kvgate.answer_pattern", "Invalid 'kvgate.answer_pattern': "
                                     "string too long. Expected a string with maximum length %d, "
                                     "but got a string with length %zu instead.",
                                     KVG_REQ_MAX_PATTERN_LEN, n);
        if (!(r->answer_pattern = copy_str(p, json_string_value(v), n)))
            return -1;
        r->answer_pattern_len = n;
    }
    if ((v = kvg_api_field(obj, "min_samples"))
        && get_int32(p, v, "kvgate.min_samples", 1, r->n, &r->min_samples) < 0)
        return -1;
    if ((v = kvg_api_field(obj, "agreement"))
        && get_number(p, v, "kvgate.agreement", 0, 1, 1, &r->agreement) < 0)
        return -1;
    if ((v = kvg_api_field(obj, "wave")) && get_int32(p, v, "kvgate.wave", 1, INT32_MAX, &r->wave) < 0)
        return -1;
    if (r->n > KVG_SC_MAX_N)
        return kvg_api_error_set(p->err, 400, "integer_above_max_value", "n",
                                 "Invalid 'n': integer above maximum value. With 'kvgate.vote', "
                                 "expected a value <= %d, but got %d instead.", KVG_SC_MAX_N,
                                 (int)r->n);
    return 0;
}


/* ---- Anthropic's Messages API (/v1/messages) ----
 *
 * Its system prompt and turns become the OpenAI chat messages the template
 * renders (a leading system message, then user/assistant turns whose content
 * is the same string, or the same text parts), so both APIs give a template
 * the same data for the same conversation. Parameter paths are Anthropic's
 * ("messages.1.content.0.text"). */

/* "PARAM: WHAT are not supported by this server[; WHY]." */
static int not_supported(pctx *p, const char *param, const char *what, const char *why)
{
    return kvg_api_error_set(p->err, 400, "unsupported_value", param,
                             "%s: %s are not supported by this server%s%s.", param, what,
                             why ? "; " : "", why ? why : "");
}

static int parse_cache_control(pctx *p, const json_t *blk, const char *param, int32_t message,
                               int32_t block)
{
    json_t *cc = kvg_api_field(blk, "cache_control"), *t, *ttl;
    kvg_request *r = p->req;
    char sub[KVG_API_ERROR_PARAM_MAX], q[80];
    uint32_t ttl_s = 300;

    if (!cc)
        return 0;
    kvg_api_param(sub, sizeof sub, "%s.cache_control", param);
    if (!json_is_object(cc))
        return type_error(p, sub, "an object", cc);
    kvg_api_param(sub, sizeof sub, "%s.cache_control.type", param);
    if (!(t = kvg_api_field(cc, "type")))
        return missing(p, sub);
    if (!kvg_api_is_str(t, "ephemeral")) {
        if (!json_is_string(t))
            return type_error(p, sub, "a string", t);
        kvg_api_quote(json_string_value(t), json_string_length(t), q, sizeof q);
        return kvg_api_error_set(p->err, 400, "invalid_value", sub,
                                 "%s: Input should be 'ephemeral', but got %s.", sub, q);
    }
    if ((ttl = kvg_api_field(cc, "ttl"))) {
        kvg_api_param(sub, sizeof sub, "%s.cache_control.ttl", param);
        if (kvg_api_is_str(ttl, "5m")) {
            ttl_s = 300;
        } else if (kvg_api_is_str(ttl, "1h")) {
            ttl_s = 3600;
        } else if (!json_is_string(ttl)) {
            return type_error(p, sub, "a string", ttl);
        } else {
            kvg_api_quote(json_string_value(ttl), json_string_length(ttl), q, sizeof q);
            return kvg_api_error_set(p->err, 400, "invalid_value", sub,
                                     "%s: Input should be '5m' or '1h', but got %s.", sub, q);
        }
    }
    if (p->n_cache_control < KVG_REQ_MAX_CACHE_BREAKPOINTS) {
        kvg_cache_breakpoint *b = &r->cache_breakpoints[p->n_cache_control];
        b->message = message;
        b->block = block;
        b->ttl_s = ttl_s;
        r->n_cache_breakpoints = p->n_cache_control + 1;
    }
    p->n_cache_control++;
    return 0;
}

/* Anthropic content (a string, or an array of text blocks) as OpenAI content
 * (the same string, or the array of {"type":"text","text":...} parts): a new
 * reference in *out. */
static int messages_content(pctx *p, json_t *c, const char *param, int32_t message,
                            json_t **out)
{
    char sub[KVG_API_ERROR_PARAM_MAX], sub2[KVG_API_ERROR_PARAM_MAX];
    json_t *parts;
    size_t n;

    *out = NULL;
    if (json_is_string(c)) {
        *out = json_incref(c);
        return 0;
    }
    if (!json_is_array(c))
        return type_error(p, param, "a string or an array of content blocks", c);
    if ((n = json_array_size(c)) == 0)
        return empty_array(p, param);
    if (!(parts = json_array()))
        return oom(p);
    for (size_t i = 0; i < n; i++) {
        json_t *blk = json_array_get(c, i), *t, *text, *part;

        kvg_api_param(sub, sizeof sub, "%s.%zu", param, i);
        if (!json_is_object(blk)) {
            json_decref(parts);
            return type_error(p, sub, "an object", blk);
        }
        kvg_api_param(sub2, sizeof sub2, "%s.type", sub);
        if (!(t = kvg_api_field(blk, "type"))) {
            json_decref(parts);
            return missing(p, sub2);
        }
        if (!json_is_string(t)) {
            json_decref(parts);
            return type_error(p, sub2, "a string", t);
        }
        if (strcmp(json_string_value(t), "text") != 0) {
            char q[80], what[128];
            kvg_api_quote(json_string_value(t), json_string_length(t), q, sizeof q);
            snprintf(what, sizeof what, "content blocks of type %s", q);
            json_decref(parts);
            return not_supported(p, sub2, what, "it reads text blocks only");
        }
        kvg_api_param(sub2, sizeof sub2, "%s.text", sub);
        if (!(text = kvg_api_field(blk, "text"))) {
            json_decref(parts);
            return missing(p, sub2);
        }
        if (!json_is_string(text)) {
            json_decref(parts);
            return type_error(p, sub2, "a string", text);
        }
        if (parse_cache_control(p, blk, sub, message, (int32_t)i) < 0) {
            json_decref(parts);
            return -1;
        }
        part = json_pack("{s:s,s:O}", "type", "text", "text", text);
        if (!part || json_array_append_new(parts, part) < 0) {
            json_decref(parts);
            return oom(p);
        }
    }
    *out = parts;
    return 0;
}

static int append_message(pctx *p, json_t *msgs, const char *role, json_t *content)
{
    json_t *m = json_pack("{s:s,s:o}", "role", role, "content", content);

    if (!m || json_array_append_new(msgs, m) < 0)
        return oom(p);
    return 0;
}

static int parse_anthropic_messages(pctx *p, const json_t *root)
{
    json_t *sys = kvg_api_field(root, "system"), *v = kvg_api_field(root, "messages");
    json_t *msgs, *content;
    char msg[512], param[KVG_API_ERROR_PARAM_MAX], sub[KVG_API_ERROR_PARAM_MAX];
    size_t n;
    int rc;

    if (!v)
        return missing(p, "messages");
    if (!json_is_array(v))
        return type_error(p, "messages", "an array", v);
    if ((n = json_array_size(v)) == 0)
        return empty_array(p, "messages");
    if (!(msgs = json_array()))
        return oom(p);
    if (sys) {
        if (messages_content(p, sys, "system", -1, &content) < 0)
            goto fail;
        /* an empty system prompt is no system prompt */
        if (json_is_string(content) && json_string_length(content) == 0)
            json_decref(content);
        else if (append_message(p, msgs, "system", content) < 0)
            goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(v, i), *role, *c;
        const char *rs;

        kvg_api_param(sub, sizeof sub, "messages.%zu", i);
        if (!json_is_object(m)) {
            type_error(p, sub, "an object", m);
            goto fail;
        }
        kvg_api_param(param, sizeof param, "messages.%zu.role", i);
        if (!(role = kvg_api_field(m, "role"))) {
            missing(p, param);
            goto fail;
        }
        if (!json_is_string(role)) {
            type_error(p, param, "a string", role);
            goto fail;
        }
        rs = json_string_value(role);
        if (!strcmp(rs, "system")) {
            kvg_api_error_set(p->err, 400, "invalid_value", param,
                              "%s: Unexpected role \"system\". The Messages API accepts a "
                              "top-level `system` parameter, not \"system\" as an input message "
                              "role.", param);
            goto fail;
        }
        if (strcmp(rs, "user") != 0 && strcmp(rs, "assistant") != 0) {
            char q[80];
            kvg_api_quote(rs, json_string_length(role), q, sizeof q);
            kvg_api_error_set(p->err, 400, "invalid_value", param,
                              "%s: Input should be 'user' or 'assistant', but got %s.", param, q);
            goto fail;
        }
        kvg_api_param(param, sizeof param, "messages.%zu.content", i);
        if (!(c = kvg_api_field(m, "content"))) {
            missing(p, param);
            goto fail;
        }
        if (messages_content(p, c, param, (int32_t)i, &content) < 0
            || append_message(p, msgs, rs, content) < 0)
            goto fail;
        if (i == n - 1 && strcmp(rs, "assistant") == 0) {
            kvg_api_error_set(p->err, 400, "unsupported_value", sub,
                              "%s: the last message is the assistant's (a prefill of its "
                              "answer), which is not supported by this server; end with a user "
                              "message.", sub);
            goto fail;
        }
    }
    if (p->n_cache_control > KVG_REQ_MAX_CACHE_BREAKPOINTS) {
        kvg_api_error_set(p->err, 400, "invalid_value", NULL,
                          "A maximum of %d blocks with cache_control may be provided. Found %zu.",
                          KVG_REQ_MAX_CACHE_BREAKPOINTS, p->n_cache_control);
        goto fail;
    }
    param[0] = '\0';
    rc = kvg_chat_vars_build(msgs, NULL, NULL, &p->req->chat_data, msg, sizeof msg, param,
                             sizeof param);
    json_decref(msgs);
    if (rc == KVG_CHAT_VARS_NOMEM)
        return oom(p);
    if (rc != KVG_CHAT_VARS_OK)
        return kvg_api_error_set(p->err, 400, kvg_chat_vars_error_code(msg), "messages", "%s",
                                 msg);
    p->req->n_messages = n;
    return 0;

fail:
    json_decref(msgs);
    return -1;
}

static int parse_anthropic(pctx *p, const json_t *root)
{
    kvg_request *r = p->req;
    json_t *v, *e;
    char param[KVG_API_ERROR_PARAM_MAX];

    if (!(v = kvg_api_field(root, "max_tokens")))
        return missing(p, "max_tokens");
    if (get_int32(p, v, "max_tokens", 1, INT32_MAX, &r->max_tokens) < 0)
        return -1;
    r->has_max_tokens = 1;
    if (parse_anthropic_messages(p, root) < 0)
        return -1;
    /* Anthropic's temperature range is 0..1 */
    if ((v = kvg_api_field(root, "temperature"))
        && get_number(p, v, "temperature", 0, 0, 1, &r->temperature) < 0)
        return -1;
    if ((v = kvg_api_field(root, "top_p")) && get_number(p, v, "top_p", 0, 1, 1, &r->top_p) < 0)
        return -1;
    if ((v = kvg_api_field(root, "top_k")) && get_int32(p, v, "top_k", 1, INT32_MAX, &r->top_k) < 0)
        return -1;
    if ((v = kvg_api_field(root, "stop_sequences"))) {
        size_t n;
        if (!json_is_array(v))
            return type_error(p, "stop_sequences", "an array of strings", v);
        if ((n = json_array_size(v)) > KVG_REQ_MAX_STOP)
            return kvg_api_error_set(p->err, 400, "array_above_max_length", "stop_sequences",
                                     "stop_sequences: at most %d stop sequences are supported "
                                     "by this server, got %zu.", KVG_REQ_MAX_STOP, n);
        for (size_t i = 0; i < n; i++) {
            e = json_array_get(v, i);
            kvg_api_param(param, sizeof param, "stop_sequences.%zu", i);
            if (!json_is_string(e))
                return type_error(p, param, "a string", e);
            if (json_string_length(e) == 0)
                return kvg_api_error_set(p->err, 400, "invalid_value", param,
                                         "%s: stop sequences must be non-empty.", param);
            r->stop_len[i] = json_string_length(e);
            if (!(r->stop[i] = copy_str(p, json_string_value(e), r->stop_len[i])))
                return -1;
        }
        r->n_stop = n;
    }
    if ((v = kvg_api_field(root, "stream")) && get_bool(p, v, "stream", &r->stream) < 0)
        return -1;
    if ((v = kvg_api_field(root, "metadata"))) {
        if (!json_is_object(v))
            return type_error(p, "metadata", "an object", v);
        if ((e = kvg_api_field(v, "user_id")) && !json_is_string(e))
            return type_error(p, "metadata.user_id", "a string", e);
    }
    if ((v = kvg_api_field(root, "tools")) && !(json_is_array(v) && json_array_size(v) == 0))
        return not_supported(p, "tools", "tools", NULL);
    if ((v = kvg_api_field(root, "tool_choice")))
        return not_supported(p, "tool_choice", "tool choices", "no tools here");
    if ((v = kvg_api_field(root, "thinking")) && !(json_is_object(v)
                                                   && kvg_api_is_str(kvg_api_field(v, "type"),
                                                                     "disabled")))
        return not_supported(p, "thinking", "extended thinking settings", NULL);
    return 0;
}

/* OpenAI's prompt caching fields: prompt_cache_key (an affinity key: which engine, never
 * which cache) and prompt_cache_retention ("in_memory" or "24h"). */
static int parse_cache_fields(pctx *p, const json_t *root)
{
    kvg_request *r = p->req;
    json_t *v;
    if ((v = kvg_api_field(root, "prompt_cache_key"))) {
        if (!json_is_string(v))
            return type_error(p, "prompt_cache_key", "a string", v);
        r->prompt_cache_key_len = json_string_length(v);
        if (r->prompt_cache_key_len > KVG_REQ_MAX_CACHE_KEY_LEN)
            return kvg_api_error_set(p->err, 400, "string_above_max_length", "prompt_cache_key",
                                     "Invalid 'prompt_cache_key': string too long. Expected a string "
                                     "with maximum length %d, but got a string with length %zu instead.",
                                     KVG_REQ_MAX_CACHE_KEY_LEN, r->prompt_cache_key_len);
        if (!(r->prompt_cache_key = copy_str(p, json_string_value(v), r->prompt_cache_key_len)))
            return -1;
    }
    if ((v = kvg_api_field(root, "prompt_cache_retention"))) {
        const char *s = json_is_string(v) ? json_string_value(v) : NULL;
        if (!s)
            return type_error(p, "prompt_cache_retention", "a string", v);
        if (!strcmp(s, "in_memory"))
            r->cache_retention_s = 0;
        else if (!strcmp(s, "24h"))
            r->cache_retention_s = 24 * 3600;
        else
            return kvg_api_error_set(p->err, 400, "invalid_value", "prompt_cache_retention",
                                     "Invalid value: '%s'. Supported values are: 'in_memory' and "
                                     "'24h'.", s);
    }
    return 0;
}

static int parse_root(pctx *p, const json_t *root)
{
    if (parse_model(p, root) < 0)
        return -1;
    if (p->ep == KVG_ENDPOINT_MESSAGES)
        return parse_anthropic(p, root);
    if (p->ep == KVG_ENDPOINT_CHAT ? parse_messages(p, root) < 0 : parse_prompt(p, root) < 0)
        return -1;
    if (parse_sampling(p, root) < 0 || parse_stop(p, root) < 0 || parse_stream(p, root) < 0
        || parse_logprobs(p, root) < 0 || check_unsupported(p, root) < 0
        || parse_cache_fields(p, root) < 0 || parse_kvgate(p, root) < 0)
        return -1;
    return 0;
}

static int json_error(kvg_api_error *err, const json_error_t *je)
{
    switch (json_error_code(je)) {
    case json_error_out_of_memory:
        return kvg_api_error_set(err, 500, NULL, NULL, "out of memory while parsing the request");
    case json_error_duplicate_key:
        return kvg_api_error_set(err, 400, "invalid_json", NULL,
                                 "We could not parse the JSON body of your request: it repeats a "
                                 "key in one object (line %d, column %d).", je->line, je->column);
    case json_error_null_character:
    case json_error_null_byte_in_key:
        return kvg_api_error_set(err, 400, "invalid_json", NULL,
                                 "We could not parse the JSON body of your request: strings must "
                                 "not contain \\u0000 (line %d, column %d).", je->line, je->column);
    default:
        return kvg_api_error_set(err, 400, "invalid_json", NULL,
                                 "We could not parse the JSON body of your request: %s (line %d, "
                                 "column %d). The API expects a JSON object.", je->text, je->line,
                                 je->column);
    }
}

kvg_request *kvg_request_parse(kvg_endpoint ep, const char *body, size_t len,
                               kvg_api_error *err)
{
    kvg_api_error ignored;
    pctx p = { NULL, NULL, err ? err : &ignored, ep, 0 };
    json_error_t je;
    json_t *root;
    size_t bad;

    err = p.err;
    memset(err, 0, sizeof *err);
    if (ep != KVG_ENDPOINT_COMPLETIONS && ep != KVG_ENDPOINT_CHAT
        && ep != KVG_ENDPOINT_MESSAGES) {
        kvg_api_error_set(err, 500, NULL, NULL, "internal error: unknown endpoint %d", (int)ep);
        return NULL;
    }
    if (!body || len == 0) {
        kvg_api_error_set(err, 400, "invalid_json", NULL,
                          "The request body is empty. The API expects a JSON object.");
        return NULL;
    }
    /* jansson only checks UTF-8 inside strings it decodes; checking first gives
     * one clear answer for every malformed body. */
    if ((bad = kvg_utf8_invalid_at((const unsigned char *)body, len)) != (size_t)-1) {
        kvg_api_error_set(err, 400, "invalid_encoding", NULL,
                          "The request body is not valid UTF-8 (invalid byte at offset %zu).", bad);
        return NULL;
    }
    root = json_loadb(body, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        json_error(err, &je);
        return NULL;
    }
    if (!json_is_object(root)) {
        kvg_api_error_set(err, 400, "invalid_json", NULL,
                          "The request body must be a JSON object, but got %s instead.",
                          kvg_api_json_type(root));
        json_decref(root);
        return NULL;
    }
    if ((p.req = alloc(&p, sizeof *p.req))) {
        memset(p.req, 0, sizeof *p.req);
        p.req->endpoint = ep;
        p.req->temperature = 1.0;
        p.req->top_p = 1.0;
        p.req->top_k = -1;
        p.req->n = 1;
        p.req->agreement = 0.5;
        if (parse_root(&p, root) < 0) {
            json_decref(p.req->chat_data);
            p.req = NULL;
        }
    }
    json_decref(root);
    if (!p.req) {
        arena_free(p.mem);
        return NULL;
    }
    p.req->mem_ = p.mem;
    return p.req;
}

void kvg_request_free(kvg_request *r)
{
    if (r) {
        json_decref(r->chat_data);
        arena_free(r->mem_);
    }
}
