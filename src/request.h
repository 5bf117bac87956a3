/* OpenAI request bodies (/v1/completions and /v1/chat/completions) parsed and
 * validated into one internal request.
 *
 * Accepted shapes (null anywhere means "absent", as the SDKs send nulls for
 * unset fields):
 *   model                  required non-empty string (<= 256 bytes)
 *   prompt (completions)   required: a string, an array of one string, an array
 *                          of token ids (integers 0..2^31-1; checked against the
 *                          vocabulary later), or an array of one such array.
 *                          Several prompts (batching) -> 400 "batched prompts are
 *                          not supported". Empty string/array -> 400.
 *   messages (chat)        required non-empty array of {"role","content"}:
 *                          role "system", "developer" (treated as system), "user",
 *                          "assistant"; "tool"/"function" -> 400 (no tool calls
 *                          here), anything else -> 400. content: a string (may be
 *                          empty) or a non-empty array of {"type":"text","text":..}
 *                          parts, joined with "\n" (as vLLM does); any other part
 *                          type -> 400 naming e.g. messages[1].content[0].type.
 *                          "name" is ignored; non-empty "tool_calls" -> 400.
 *   max_tokens             integer >= 1; in chat, max_completion_tokens wins over
 *                          max_tokens when both are set
 *   temperature            number 0..2 (default 1)
 *   top_p                  number in (0, 1] (default 1)
 *   top_k                  integer, -1 (disabled, the default) or >= 1 (vLLM's)
 *   n                      integer 1..128 (default 1; the gateway applies its cap)
 *   seed                   integer (int64)
 *   stop                   string or array of at most 4 strings; every stop
 *                          string non-empty; [] means none
 *   stream                 bool; stream_options {"include_usage": bool} only
 *                          allowed when stream is true
 *   logprobs               completions: integer 0..20 (number of alternatives);
 *                          chat: bool, with top_logprobs 0..20 allowed only when
 *                          logprobs is true. Both map to has_logprobs/top_logprobs.
 *   user                   string, kept for logs; never used for hashing
 *   kvgate                 kvgate's extension (self-consistency), an object or null:
 *                          {"vote": "majority"|"logprob", "answer_pattern": string,
 *                           "min_samples": int, "agreement": number, "wave": int}
 *                          vote             required when the object has any key;
 *                                           {} is the same as no object (no vote)
 *                          answer_pattern   1..1024 bytes (compiled by the gateway:
 *                                           ngx_regex, exactly one capture group)
 *                          min_samples      1..n (absent: all n samples at once)
 *                          agreement        in (0, 1] (default 0.5)
 *                          wave             >= 1 (absent: min_samples; more than
 *                                           what remains is clamped)
 *                          with vote, n is at most KVG_SC_MAX_N (32: the engine's
 *                          per-sample cancel mask), else 400 param "n".
 *                          Errors are 400 naming the key: "kvgate" (not an object),
 *                          "kvgate.KEY" (code "unknown_parameter"), "kvgate.vote",
 *                          "kvgate.answer_pattern", "kvgate.min_samples",
 *                          "kvgate.agreement", "kvgate.wave". Keys may be null
 *                          (= absent), like every other field.
 * Integer fields also accept a JSON number with no fractional part (2.0), as
 * vLLM's validation does.
 *
 * Unknown fields are ignored, as OpenAI does. In particular a client-sent
 * "cache_salt", "tenant", "prompt_cache_key" or any similar field has NO effect:
 * it is not stored, so it cannot reach the cache key, which the gateway derives
 * from its own configuration. Known OpenAI fields this server does not
 * implement are rejected (400, code "unsupported_parameter") when they carry a
 * non-default value, rather than silently changing the answer's meaning:
 * presence_penalty, frequency_penalty (non-zero), logit_bias (non-empty),
 * best_of (> 1), echo (true), suffix (non-empty), tools/functions (non-empty),
 * response_format (type other than "text").
 *
 * The body must be valid UTF-8 (checked before JSON parsing), a JSON object,
 * without duplicate keys (ambiguous, so refused) and without U+0000 in strings.
 *
 * Errors: kvg_request_parse() returns NULL and fills a kvg_api_error with the
 * HTTP status (400 for everything it detects, 500 when out of memory), an
 * OpenAI-style code ("invalid_type", "missing_required_parameter",
 * "integer_below_min_value", "decimal_above_max_value", "empty_array", ...) and
 * param naming the field ("temperature", "messages[2].content[0].type",
 * "stream_options.include_usage"). */
#ifndef KVG_REQUEST_H
#define KVG_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "api_error.h"
#include <jansson.h>

#include "vote.h"

typedef enum kvg_endpoint {
    KVG_ENDPOINT_COMPLETIONS = 1,    /* POST /v1/completions */
    KVG_ENDPOINT_CHAT = 2            /* POST /v1/chat/completions */
} kvg_endpoint;

typedef enum kvg_prompt_kind {
    KVG_PROMPT_NONE = 0,             /* chat requests */
    KVG_PROMPT_TEXT,
    KVG_PROMPT_TOKENS
} kvg_prompt_kind;

#define KVG_REQ_MAX_STOP        4
#define KVG_REQ_MAX_N           128
#define KVG_REQ_MAX_LOGPROBS    20
#define KVG_REQ_MAX_MODEL_LEN   256
#define KVG_REQ_MAX_PATTERN_LEN 1024    /* kvgate.answer_pattern, bytes */

/* All strings are valid UTF-8, NUL-terminated, with their length alongside
 * (lengths exclude the NUL). Everything is owned by the request. */
typedef struct kvg_request {
    kvg_endpoint endpoint;
    const char *model;
    size_t model_len;

    kvg_prompt_kind prompt_kind;
    const char *prompt;              /* KVG_PROMPT_TEXT */
    size_t prompt_len;
    const int32_t *prompt_tokens;    /* KVG_PROMPT_TOKENS */
    size_t n_prompt_tokens;

    json_t *chat_data;               /* chat: the template's data (chat_vars.h): messages,
                                        tools, chat_template_kwargs' keys */
    size_t n_messages;               /* chat: >= 1 */

    int has_max_tokens;
    int32_t max_tokens;
    double temperature;
    double top_p;
    int32_t top_k;                   /* -1: disabled */
    int32_t n;
    int has_seed;
    int64_t seed;
    size_t n_stop;
    const char *stop[KVG_REQ_MAX_STOP];
    size_t stop_len[KVG_REQ_MAX_STOP];
    int stream;
    int include_usage;               /* only ever set when stream is */
    int has_logprobs;                /* logprobs requested */
    int32_t top_logprobs;            /* alternatives per position, 0..20 */
    const char *user;                /* NULL when absent */
    size_t user_len;

    /* the "kvgate" object (self-consistency); all 0/NULL without a vote */
    int has_vote;                    /* the kvgate object had "vote" */
    kvg_vote_kind vote;              /* KVG_VOTE_MAJORITY | KVG_VOTE_LOGPROB */
    const char *answer_pattern;      /* NULL: the default extractor */
    size_t answer_pattern_len;
    int32_t min_samples;             /* 0: all n at once */
    double agreement;                /* default 0.5 (also without a vote) */
    int32_t wave;                    /* 0: = min_samples */

    void *mem_;                      /* private: the request's memory */
} kvg_request;

/* Parses body[0..len). Returns the request (free with kvg_request_free), or NULL
 * with *err filled (when err is not NULL). Never crashes on any input. */
kvg_request *kvg_request_parse(kvg_endpoint ep, const char *body, size_t len,
                               kvg_api_error *err);

void kvg_request_free(kvg_request *r);

#endif
