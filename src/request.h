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
 * Anthropic's Messages API (KVG_ENDPOINT_MESSAGES, POST /v1/messages) is parsed
 * into the same request, as a chat request (chat_data holds the template's
 * messages, exactly what /v1/chat/completions would give the template for the
 * same system prompt and turns):
 *   model                  as above
 *   max_tokens             required, integer >= 1
 *   system                 a string, or an array of {"type":"text","text":...}
 *                          blocks (joined with "\n", as chat content parts are);
 *                          becomes a leading {"role":"system"} message when
 *                          non-empty
 *   messages               required non-empty array of {"role","content"}, role
 *                          "user" or "assistant" (anything else -> 400), content a
 *                          string or a non-empty array of text blocks; other block
 *                          types (image, document, tool_use, tool_result,
 *                          thinking, ...) -> 400 "not supported". The last message
 *                          must be the user's (an assistant prefill -> 400).
 *   cache_control          on a text block: {"type":"ephemeral","ttl":"5m"|"1h"}
 *                          (ttl optional, "5m"), at most 4 in a request, else 400;
 *                          kept in cache_breakpoints
 *   temperature            number 0..1; top_p (0, 1]; top_k integer >= 1
 *   stop_sequences         array of at most 4 non-empty strings
 *   stream                 bool
 *   metadata               an object (user_id: a string or null), ignored
 *   tools (non-empty), tool_choice, thinking (enabled) -> 400 "not supported";
 *   other unknown fields are ignored. Error messages name the field Anthropic's
 *   way ("messages.1.content.0.type").
 *
 * Integer fields also accept a JSON number with no fractional part (2.0), as
 * vLLM's validation does.
 *
 * prompt_cache_key (string, at most 1024 bytes) and prompt_cache_retention
 * ("in_memory" | "24h"), completions and chat: kept for routing and the TTL the
 * blocks get (bounded by the operator); neither is part of the cache's key.
 *
 * Unknown fields are ignored, as OpenAI does. In particular a client-sent
 * "cache_salt", "tenant" or any similar field has NO effect: it is not stored, so
 * it cannot reach the cache key, which the gateway derives from its own
 * configuration (the tenant) and the prompt. Known OpenAI fields this server does not
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
    KVG_ENDPOINT_CHAT = 2,           /* POST /v1/chat/completions */
    KVG_ENDPOINT_MESSAGES = 3        /* POST /v1/messages (Anthropic; see below) */
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
#define KVG_REQ_MAX_CACHE_BREAKPOINTS 4 /* Anthropic's cache_control blocks */
#define KVG_REQ_MAX_CACHE_KEY_LEN 1024  /* prompt_cache_key, bytes */

/* One Anthropic cache_control breakpoint: the prefix up to and including the
 * block it is on, which the gateway asks the engine to hold for ttl_s
 * (docs/caching-apis.md). */
typedef struct kvg_cache_breakpoint {
    int32_t message;                 /* -1: the system prompt, else messages[i] */
    int32_t block;                   /* the content block's index in it */
    uint32_t ttl_s;                  /* 300 ("5m", the default) or 3600 ("1h") */
} kvg_cache_breakpoint;

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

    /* OpenAI's prompt caching fields (completions, chat) */
    const char *prompt_cache_key;    /* NULL when absent: routing affinity within the
                                        tenant, never part of the cache's key */
    size_t prompt_cache_key_len;
    uint32_t cache_retention_s;      /* prompt_cache_retention: 0 "in_memory" (the
                                        location's kvgate_cache_ttl), 86400 "24h" */

    /* /v1/messages: its cache_control breakpoints, in the order of the
       prompt (system blocks first, then the messages' blocks) */
    size_t n_cache_breakpoints;
    kvg_cache_breakpoint cache_breakpoints[KVG_REQ_MAX_CACHE_BREAKPOINTS];

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
