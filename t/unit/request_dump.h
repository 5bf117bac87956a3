/* A parsed request as canonical JSON, for the tests and the request fuzzer only
 * (nothing shipped needs it, so it is not in the library): keys in a fixed order,
 * defaults filled in, so two parses compare as strings. Included by t/unit/request.c
 * and fuzz/fuzz_request.c. */
#ifndef KVG_T_REQUEST_DUMP_H
#define KVG_T_REQUEST_DUMP_H

#include <jansson.h>

#include "request.h"


static json_t *dump_str_or_null(const char *s, size_t n)
{
    return s ? json_stringn(s, n) : json_null();
}

/* Builds the canonical form; jansson's *_new setters take ownership even on
 * failure, so one NULL check at the end catches every allocation. */
static json_t *dump_build(const kvg_request *r)
{
    json_t *o = json_object(), *a;
    int bad = !o;

    if (bad)
        return NULL;
    bad |= json_object_set_new(o, "endpoint", json_string(r->endpoint == KVG_ENDPOINT_CHAT
                                                          ? "chat"
                                                          : r->endpoint == KVG_ENDPOINT_MESSAGES
                                                          ? "messages" : "completions"));
    bad |= json_object_set_new(o, "model", json_stringn(r->model, r->model_len));
    if (r->prompt_kind == KVG_PROMPT_TEXT) {
        bad |= json_object_set_new(o, "prompt", json_stringn(r->prompt, r->prompt_len));
    } else if (r->prompt_kind == KVG_PROMPT_TOKENS) {
        a = json_array();
        for (size_t i = 0; a && i < r->n_prompt_tokens; i++)
            bad |= json_array_append_new(a, json_integer(r->prompt_tokens[i]));
        bad |= json_object_set_new(o, "prompt", a);
    }
    if (r->endpoint != KVG_ENDPOINT_COMPLETIONS)
        bad |= json_object_set_new(o, "chat_data", json_deep_copy(r->chat_data));
    if (r->n_cache_breakpoints) {
        /* /v1/messages' cache_control blocks, only when given */
        a = json_array();
        for (size_t i = 0; a && i < r->n_cache_breakpoints; i++)
            bad |= json_array_append_new(a, json_pack("{s:i,s:i,s:i}",
                                                      "message", (int)r->cache_breakpoints[i].message,
                                                      "block", (int)r->cache_breakpoints[i].block,
                                                      "ttl_s", (int)r->cache_breakpoints[i].ttl_s));
        bad |= json_object_set_new(o, "cache_breakpoints", a);
    }
    bad |= json_object_set_new(o, "max_tokens",
                               r->has_max_tokens ? json_integer(r->max_tokens) : json_null());
    bad |= json_object_set_new(o, "temperature", json_real(r->temperature));
    bad |= json_object_set_new(o, "top_p", json_real(r->top_p));
    bad |= json_object_set_new(o, "top_k", json_integer(r->top_k));
    bad |= json_object_set_new(o, "n", json_integer(r->n));
    bad |= json_object_set_new(o, "seed", r->has_seed ? json_integer(r->seed) : json_null());
    a = json_array();
    for (size_t i = 0; a && i < r->n_stop; i++)
        bad |= json_array_append_new(a, json_stringn(r->stop[i], r->stop_len[i]));
    bad |= json_object_set_new(o, "stop", a);
    bad |= json_object_set_new(o, "stream", json_boolean(r->stream));
    bad |= json_object_set_new(o, "include_usage", json_boolean(r->include_usage));
    bad |= json_object_set_new(o, "logprobs", json_boolean(r->has_logprobs));
    bad |= json_object_set_new(o, "top_logprobs", json_integer(r->top_logprobs));
    bad |= json_object_set_new(o, "user", dump_str_or_null(r->user, r->user_len));
    if (r->has_vote) {
        /* the "kvgate" object, only with a vote: the other dumps stay as they were */
        json_t *k = json_object();
        bad |= k == NULL;
        if (k) {
            bad |= json_object_set_new(k, "vote", json_string(r->vote == KVG_VOTE_LOGPROB ? "logprob"
                                                                                          : "majority"));
            bad |= json_object_set_new(k, "answer_pattern",
                                       dump_str_or_null(r->answer_pattern, r->answer_pattern_len));
            bad |= json_object_set_new(k, "min_samples", json_integer(r->min_samples));
            bad |= json_object_set_new(k, "agreement", json_real(r->agreement));
            bad |= json_object_set_new(k, "wave", json_integer(r->wave));
            bad |= json_object_set_new(o, "kvgate", k);
        }
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* malloc'd and NUL-terminated; NULL when out of memory. */
static char *kvg_request_to_json(const kvg_request *r)
{
    json_t *o = dump_build(r);
    char *s;

    if (!o)
        return NULL;
    s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

#endif
