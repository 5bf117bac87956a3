/* OpenAI-style error responses:
 *
 *   {"error":{"message":"...","type":"invalid_request_error","param":"temperature","code":"..."}}
 *
 * The request parser fills a kvg_api_error; the gateway fills one for its own
 * refusals (auth, unknown model, overload, ...) and renders it as the body.
 *
 * HTTP status -> "type", following what api.openai.com returns (the official
 * SDKs pick their exception class from the status alone, so "type" is for humans
 * and log search):
 *   400, 404, 405, 409, 413, 415, 422 and other 4xx   "invalid_request_error"
 *       (OpenAI answers an unknown model with 404 code "model_not_found", an
 *       unknown URL with 404 "Invalid URL (POST /v1/x)", a wrong method with 405,
 *       all as invalid_request_error)
 *   401   "invalid_request_error" (OpenAI's own choice; code "invalid_api_key"
 *         for a wrong key, null for a missing one)
 *   403   "permission_error"
 *   429   "rate_limit_error" (code "rate_limit_exceeded")
 *   500, 502, 503, 504 and other 5xx   "server_error"
 *         (OpenAI's 503 is "The engine is currently overloaded, please try again later")
 * kvg_api_error_set fills the type from this table. */
#ifndef KVG_API_ERROR_H
#define KVG_API_ERROR_H

#include <stddef.h>

#define KVG_API_ERROR_MSG_MAX   512
#define KVG_API_ERROR_PARAM_MAX 128
/* Upper bound of kvg_api_error_render()'s output, NUL included: every byte of
 * message and param escaped as \u00XX plus the fixed text. */
#define KVG_API_ERROR_JSON_MAX  4096

typedef struct kvg_api_error {
    int status;                              /* HTTP status to answer with */
    const char *type;                        /* static string, see the table above */
    const char *code;                        /* static string, or NULL for JSON null */
    char param[KVG_API_ERROR_PARAM_MAX];     /* "" for JSON null */
    char message[KVG_API_ERROR_MSG_MAX];
} kvg_api_error;

/* Fills e: type from status; code may be NULL; param may be NULL or "".
 * Always returns -1 so callers can `return kvg_api_error_set(...)`. */
__attribute__((format(printf, 5, 6)))
int kvg_api_error_set(kvg_api_error *e, int status, const char *code, const char *param,
                      const char *fmt, ...);

/* Renders e as the JSON body into buf (capacity cap, NUL-terminated). Returns the
 * length of the full body (excluding the NUL), like snprintf: a return >= cap
 * means it was truncated; cap >= KVG_API_ERROR_JSON_MAX always suffices. Bytes of
 * message/param that are not valid UTF-8 are written as U+FFFD, so the body is
 * always valid JSON. No allocation. */
size_t kvg_api_error_render(const kvg_api_error *e, char *buf, size_t cap);

/* The same error as Anthropic's Messages API answers it (/v1/messages):
 *
 *   {"type":"error","error":{"type":T,"message":M}}
 *
 * T from the status: 400 and other 4xx "invalid_request_error", 401
 * "authentication_error", 403 "permission_error", 404 "not_found_error", 413
 * "request_too_large", 429 "rate_limit_error", 503 and 529 "overloaded_error",
 * other 5xx "api_error". param is not part of the shape: the message names the
 * field. Same contract as kvg_api_error_render. */
const char *kvg_api_error_anthropic_type(int status);
size_t kvg_api_error_render_anthropic(const kvg_api_error *e, char *buf, size_t cap);

#endif
