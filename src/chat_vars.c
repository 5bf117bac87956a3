/* chat_vars.h: an OpenAI chat request's messages, tools and
 * chat_template_kwargs checked and turned into a chat template's data. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_json.h"
#include "chat_vars.h"

typedef struct cv_ctx {
    char *err, *param;
    size_t err_len, param_len;
} cv_ctx;

/* Paths are built in a local buffer first: the message quotes the path too. */
#define PATH_MAX_LEN 128

__attribute__((format(printf, 3, 4)))
static int fail(cv_ctx *c, const char *param, const char *fmt, ...)
{
    va_list ap;

    if (c->param_len)
        snprintf(c->param, c->param_len, "%s", param);
    if (c->err_len) {
        va_start(ap, fmt);
        vsnprintf(c->err, c->err_len, fmt, ap);
        va_end(ap);
    }
    return KVG_CHAT_VARS_INVALID;
}

const char *kvg_chat_vars_error_code(const char *err)
{
    static const struct {
        const char *prefix, *code;
    } CODES[] = {
        { "Missing required parameter", "missing_required_parameter" },
        { "Invalid type for", "invalid_type" },
    };

    for (size_t i = 0; err && i < sizeof CODES / sizeof CODES[0]; i++)
        if (strncmp(err, CODES[i].prefix, strlen(CODES[i].prefix)) == 0)
            return CODES[i].code;
    if (err && strstr(err, "': empty array."))
        return "empty_array";
    return "invalid_value";
}

static int nomem(cv_ctx *c)
{
    if (c->param_len)
        c->param[0] = '\0';
    if (c->err_len)
        snprintf(c->err, c->err_len, "out of memory building the chat template's variables");
    return KVG_CHAT_VARS_NOMEM;
}

static int missing(cv_ctx *c, const char *param)
{
    return fail(c, param, "Missing required parameter: '%s'.", param);
}

static int type_error(cv_ctx *c, const char *param, const char *expected, const json_t *got)
{
    return fail(c, param, "Invalid type for '%s': expected %s, but got %s instead.",
                param, expected, kvg_api_json_type(got));
}

static int empty_array(cv_ctx *c, const char *param)
{
    return fail(c, param, "Invalid '%s': empty array. Expected an array with minimum length 1, "
                "but got an empty array instead.", param);
}

/* Parameter paths, built for every message and part (not only on errors, so
 * that the deeper checks can name them): by hand, since snprintf cost as much
 * as the rest of a message's conversion. A path cut by cap still ends in a NUL. */
static const char *append(char *buf, size_t cap, size_t at, const char *s, size_t n)
{
    if (at < cap) {
        size_t room = cap - 1 - at;
        memcpy(buf + at, s, n < room ? n : room);
        buf[at + (n < room ? n : room)] = '\0';
    }
    return buf;
}

/* "base.key" */
static const char *member(char *buf, size_t cap, const char *base, const char *key)
{
    size_t n = strlen(base);

    append(buf, cap, 0, base, n);
    append(buf, cap, n, ".", 1);
    return append(buf, cap, n + 1, key, strlen(key));
}

/* "base[i]" */
static const char *element(char *buf, size_t cap, const char *base, size_t i)
{
    char digits[24];
    size_t n = strlen(base), d = sizeof digits;

    digits[--d] = ']';
    do {
        digits[--d] = (char)('0' + i % 10);
        i /= 10;
    } while (i);
    digits[--d] = '[';
    append(buf, cap, 0, base, n);
    return append(buf, cap, n, digits + d, sizeof digits - d);
}

/* An optional string member: 0 when absent or a string (*out set, NULL when
 * absent), else the error. */
static int opt_string(cv_ctx *c, const json_t *obj, const char *key, const char *base,
                      json_t **out)
{
    char p[PATH_MAX_LEN];
    json_t *v = kvg_api_field(obj, key);

    *out = v;
    if (v && !json_is_string(v))
        return type_error(c, member(p, sizeof p, base, key), "a string", v);
    return 0;
}

static int req_string(cv_ctx *c, const json_t *obj, const char *key, const char *base,
                      json_t **out)
{
    char p[PATH_MAX_LEN];

    if (opt_string(c, obj, key, base, out) < 0)
        return KVG_CHAT_VARS_INVALID;
    if (!*out)
        return missing(c, member(p, sizeof p, base, key));
    return 0;
}

/* "type" must be the string want. */
static int check_type(cv_ctx *c, const json_t *obj, const char *base, const char *want)
{
    char p[PATH_MAX_LEN], q[80];
    json_t *v;

    if (req_string(c, obj, "type", base, &v) < 0)
        return KVG_CHAT_VARS_INVALID;
    if (strcmp(json_string_value(v), want) != 0) {
        kvg_api_quote(json_string_value(v), json_string_length(v), q, sizeof q);
        member(p, sizeof p, base, "type");
        return fail(c, p, "Invalid value for '%s': %s. Supported values are: '%s'.", p, q, want);
    }
    return 0;
}

/* content: a string, or a non-empty array of text parts joined with "\n".
 * *out is a new reference (to the request's own string when it is one). */
static int build_content(cv_ctx *c, const json_t *v, const char *base, json_t **out)
{
    char p[PATH_MAX_LEN], part_path[PATH_MAX_LEN], q[80];
    size_t n, total = 0, off = 0;
    char *buf;

    member(p, sizeof p, base, "content");
    if (json_is_string(v)) {
        *out = json_incref((json_t *)v);    /* shared: see the header */
        return 0;
    }
    if (!json_is_array(v))
        return type_error(c, p, "a string or an array of content parts", v);
    if ((n = json_array_size(v)) == 0)
        return empty_array(c, p);
    for (size_t j = 0; j < n; j++) {
        json_t *part = json_array_get(v, j), *type, *text;

        element(part_path, sizeof part_path, p, j);
        if (!json_is_object(part))
            return type_error(c, part_path, "an object", part);
        if (req_string(c, part, "type", part_path, &type) < 0)
            return KVG_CHAT_VARS_INVALID;
        if (strcmp(json_string_value(type), "text") != 0) {
            char tp[PATH_MAX_LEN];
            kvg_api_quote(json_string_value(type), json_string_length(type), q, sizeof q);
            member(tp, sizeof tp, part_path, "type");
            return fail(c, tp, "Invalid value for '%s': only 'text' content parts are "
                        "supported, got %s.", tp, q);
        }
        if (req_string(c, part, "text", part_path, &text) < 0)
            return KVG_CHAT_VARS_INVALID;
        total += json_string_length(text) + (j > 0);
    }
    if (!(buf = malloc(total + 1)))
        return nomem(c);
    for (size_t j = 0; j < n; j++) {
        json_t *text = json_object_get(json_array_get(v, j), "text");
        size_t l = json_string_length(text);
        if (j > 0)
            buf[off++] = '\n';
        memcpy(buf + off, json_string_value(text), l);
        off += l;
    }
    *out = json_stringn_nocheck(buf, off);
    free(buf);
    return *out ? 0 : nomem(c);
}

/* function.arguments: the JSON text of an object ("" for none) -> the object. */
static int parse_arguments(cv_ctx *c, const json_t *v, const char *p, json_t **out)
{
    json_error_t je;
    json_t *obj;

    if (json_string_length(v) == 0) {
        *out = json_object();
        return *out ? 0 : nomem(c);
    }
    obj = json_loadb(json_string_value(v), json_string_length(v), 0, &je);
    if (!obj)
        return fail(c, p, "Invalid '%s': not valid JSON (%s at character %d).", p, je.text,
                    je.position);
    if (!json_is_object(obj)) {
        const char *t = kvg_api_json_type(obj);
        json_decref(obj);
        return fail(c, p, "Invalid '%s': expected the JSON text of an object, but got %s "
                    "instead.", p, t);
    }
    *out = obj;
    return 0;
}

/* One assistant tool call, checked; *out is a copy with arguments parsed. */
static int build_call(cv_ctx *c, const json_t *call, const char *base, json_t **out)
{
    char fp[PATH_MAX_LEN], ap[PATH_MAX_LEN];
    json_t *fn, *name, *args, *id, *copy, *parsed = NULL;
    int rc;

    if (!json_is_object(call))
        return type_error(c, base, "an object", call);
    if (req_string(c, call, "id", base, &id) < 0 || check_type(c, call, base, "function") < 0)
        return KVG_CHAT_VARS_INVALID;
    member(fp, sizeof fp, base, "function");
    if (!(fn = kvg_api_field(call, "function")))
        return missing(c, fp);
    if (!json_is_object(fn))
        return type_error(c, fp, "an object", fn);
    if (req_string(c, fn, "name", fp, &name) < 0 || req_string(c, fn, "arguments", fp, &args) < 0)
        return KVG_CHAT_VARS_INVALID;
    member(ap, sizeof ap, fp, "arguments");
    if ((rc = parse_arguments(c, args, ap, &parsed)) < 0)
        return rc;
    /* json_object_set on a key it has keeps the key's place: the copy prints
     * in the request's order, as the reference's dict does */
    if (!(copy = json_deep_copy(call))
        || json_object_set_new(json_object_get(copy, "function"), "arguments", parsed) < 0) {
        json_decref(copy);
        json_decref(parsed);
        return nomem(c);
    }
    *out = copy;
    return 0;
}

static int build_calls(cv_ctx *c, const json_t *calls, const char *base, json_t **out)
{
    char p[PATH_MAX_LEN], cp[PATH_MAX_LEN];
    json_t *list;

    member(p, sizeof p, base, "tool_calls");
    if (!json_is_array(calls))
        return type_error(c, p, "an array", calls);
    if (json_array_size(calls) == 0)
        return 0;               /* clients send [] for none (OpenAI takes it) */
    if (!(list = json_array()))
        return nomem(c);
    for (size_t i = 0; i < json_array_size(calls); i++) {
        json_t *one = NULL;
        int rc = build_call(c, json_array_get(calls, i), element(cp, sizeof cp, p, i), &one);
        if (rc < 0) {
            json_decref(list);
            return rc;
        }
        if (json_array_append_new(list, one) < 0) {
            json_decref(list);
            return nomem(c);
        }
    }
    *out = list;
    return 0;
}

/* Sets key to v (stolen) on obj; v NULL means an allocation failed. */
static int put(cv_ctx *c, json_t *obj, const char *key, json_t *v)
{
    if (!v || json_object_set_new(obj, key, v) < 0)
        return nomem(c);
    return 0;
}

static int parse_role(cv_ctx *c, const json_t *msg, const char *base, const char **role)
{
    static const char *const ROLES[] = { "system", "developer", "user", "assistant", "tool" };
    char p[PATH_MAX_LEN], q[80];
    json_t *v;

    if (req_string(c, msg, "role", base, &v) < 0)
        return KVG_CHAT_VARS_INVALID;
    for (size_t i = 0; i < sizeof ROLES / sizeof ROLES[0]; i++) {
        if (strcmp(json_string_value(v), ROLES[i]) == 0) {
            /* developer is OpenAI's newer name for system; templates know system only */
            *role = i == 1 ? "system" : ROLES[i];
            return 0;
        }
    }
    kvg_api_quote(json_string_value(v), json_string_length(v), q, sizeof q);
    member(p, sizeof p, base, "role");
    return fail(c, p, "Invalid value for '%s': %s. Supported values are: 'system', 'developer', "
                "'user', 'assistant' and 'tool'.", p, q);
}

/* One message, checked and converted; *out is the new message object. */
static int build_message(cv_ctx *c, const json_t *msg, size_t i, json_t **out)
{
    char base[PATH_MAX_LEN], p[PATH_MAX_LEN];
    const char *role = NULL;
    json_t *m, *content = NULL, *calls = NULL, *name, *call_id = NULL, *reasoning = NULL, *v;
    int assistant, tool, rc, ok;

    element(base, sizeof base, "messages", i);
    if (!json_is_object(msg))
        return type_error(c, base, "an object", msg);
    if (parse_role(c, msg, base, &role) < 0)
        return KVG_CHAT_VARS_INVALID;
    assistant = strcmp(role, "assistant") == 0;
    tool = strcmp(role, "tool") == 0;
    if (opt_string(c, msg, "name", base, &name) < 0)
        return KVG_CHAT_VARS_INVALID;
    /* reasoning_content, or vLLM's newer name for it */
    if (assistant && (opt_string(c, msg, "reasoning_content", base, &reasoning) < 0
                      || (!reasoning && opt_string(c, msg, "reasoning", base, &reasoning) < 0)))
        return KVG_CHAT_VARS_INVALID;
    if (tool && req_string(c, msg, "tool_call_id", base, &call_id) < 0)
        return KVG_CHAT_VARS_INVALID;
    if (assistant && (v = kvg_api_field(msg, "tool_calls")) && (rc = build_calls(c, v, base, &calls)) < 0)
        return rc;
    if ((v = kvg_api_field(msg, "content"))) {
        if ((rc = build_content(c, v, base, &content)) < 0) {
            json_decref(calls);
            return rc;
        }
    } else if (calls) {
        if (!(content = json_string(""))) {
            json_decref(calls);
            return nomem(c);
        }
    } else {
        return missing(c, member(p, sizeof p, base, "content"));
    }
    /* json_object_set (not _new) takes its own reference: content and calls
     * are dropped once below whatever happened */
    ok = (m = json_object()) && json_object_set_new(m, "role", json_string(role)) == 0
         && json_object_set(m, "content", content) == 0
         && (!calls || json_object_set(m, "tool_calls", calls) == 0)
         && (!reasoning || (json_object_set(m, "reasoning", reasoning) == 0
                            && json_object_set(m, "reasoning_content", reasoning) == 0))
         && (!call_id || json_object_set(m, "tool_call_id", call_id) == 0)
         && (!name || json_object_set(m, "name", name) == 0);
    json_decref(content);
    json_decref(calls);
    if (!ok) {
        json_decref(m);
        return nomem(c);
    }
    *out = m;
    return 0;
}

static int check_tools(cv_ctx *c, const json_t *tools)
{
    char base[PATH_MAX_LEN], fp[PATH_MAX_LEN], pp[PATH_MAX_LEN];
    json_t *fn, *s, *params;

    if (!json_is_array(tools))
        return type_error(c, "tools", "an array", tools);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *t = json_array_get(tools, i);

        element(base, sizeof base, "tools", i);
        if (!json_is_object(t))
            return type_error(c, base, "an object", t);
        if (check_type(c, t, base, "function") < 0)
            return KVG_CHAT_VARS_INVALID;
        member(fp, sizeof fp, base, "function");
        if (!(fn = kvg_api_field(t, "function")))
            return missing(c, fp);
        if (!json_is_object(fn))
            return type_error(c, fp, "an object", fn);
        if (req_string(c, fn, "name", fp, &s) < 0 || opt_string(c, fn, "description", fp, &s) < 0)
            return KVG_CHAT_VARS_INVALID;
        if ((params = kvg_api_field(fn, "parameters")) && !json_is_object(params))
            return type_error(c, member(pp, sizeof pp, fp, "parameters"), "an object", params);
    }
    return 0;
}

static int add_kwargs(cv_ctx *c, json_t *data, const json_t *kwargs)
{
    const char *key;
    json_t *v;
    char p[PATH_MAX_LEN];

    if (!json_is_object(kwargs))
        return type_error(c, "chat_template_kwargs", "an object", kwargs);
    json_object_foreach((json_t *)kwargs, key, v) {
        if (strcmp(key, "messages") == 0 || strcmp(key, "tools") == 0) {
            member(p, sizeof p, "chat_template_kwargs", key);
            return fail(c, p, "Invalid '%s': the request's own %s cannot be replaced through "
                        "chat_template_kwargs.", p, key);
        }
        if (put(c, data, key, json_deep_copy(v)) < 0)
            return KVG_CHAT_VARS_NOMEM;
    }
    return 0;
}

int kvg_chat_vars_build(const json_t *messages, const json_t *tools,
                        const json_t *chat_template_kwargs, json_t **data_out,
                        char *err, size_t err_len, char *param, size_t param_len)
{
    cv_ctx c = { err, param, err_len, param_len };
    json_t *data, *list;
    int rc;

    *data_out = NULL;
    if (err_len)
        err[0] = '\0';
    if (param_len)
        param[0] = '\0';
    if (!messages || json_is_null(messages))
        return missing(&c, "messages");
    if (!json_is_array(messages))
        return type_error(&c, "messages", "an array", messages);
    if (json_array_size(messages) == 0)
        return empty_array(&c, "messages");
    if (tools && json_is_null(tools))
        tools = NULL;
    if (chat_template_kwargs && json_is_null(chat_template_kwargs))
        chat_template_kwargs = NULL;
    if (tools && check_tools(&c, tools) < 0)
        return KVG_CHAT_VARS_INVALID;

    if (!(data = json_object()) || !(list = json_array())) {
        json_decref(data);
        return nomem(&c);
    }
    if (put(&c, data, "messages", list) < 0) {
        json_decref(data);
        return KVG_CHAT_VARS_NOMEM;
    }
    for (size_t i = 0; i < json_array_size(messages); i++) {
        json_t *m;
        if ((rc = build_message(&c, json_array_get(messages, i), i, &m)) < 0) {
            json_decref(data);
            return rc;
        }
        if (json_array_append_new(list, m) < 0) {
            json_decref(data);
            return nomem(&c);
        }
    }
    rc = put(&c, data, "tools", tools ? json_deep_copy(tools) : json_null());
    if (rc == KVG_CHAT_VARS_OK && chat_template_kwargs)
        rc = add_kwargs(&c, data, chat_template_kwargs);
    if (rc < 0) {
        json_decref(data);
        return rc;
    }
    *data_out = data;
    return KVG_CHAT_VARS_OK;
}
