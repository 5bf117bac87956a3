/* What the JSON readers (request.c, chat_vars.c, the tokenizer.json loaders) say about the JSON they
 * read: the words for a value's type, a client's string quoted, a parameter path,
 * and a member that is absent or null (the SDKs send null for unset). */
#ifndef KVG_API_JSON_H
#define KVG_API_JSON_H

#include <stddef.h>

#include <jansson.h>

/* "an object", "an array", "a string", "an integer", "a decimal number",
 * "a boolean", "null": as OpenAI's messages name them. */
const char *kvg_api_json_type(const json_t *v);

/* s[0..n) between single quotes, cut at a character boundary with "..." when it
 * does not fit cap. */
void kvg_api_quote(const char *s, size_t n, char *buf, size_t cap);

/* A parameter path such as "messages[3].content[0].type" into buf (a path cut
 * short by the buffer still names the field well enough); returns buf. */
__attribute__((format(printf, 3, 4)))
const char *kvg_api_param(char *buf, size_t cap, const char *fmt, ...);

/* Whether v is the string want (exactly, NULs included). */
int kvg_api_is_str(const json_t *v, const char *want);

/* obj's member key, or NULL when absent or null. */
json_t *kvg_api_field(const json_t *obj, const char *key);

#endif
