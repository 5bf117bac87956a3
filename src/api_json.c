#include "api_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *kvg_api_json_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:  return "an object";
    case JSON_ARRAY:   return "an array";
    case JSON_STRING:  return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL:    return "a decimal number";
    case JSON_TRUE:
    case JSON_FALSE:   return "a boolean";
    default:           return "null";
    }
}

void kvg_api_quote(const char *s, size_t n, char *buf, size_t cap)
{
    size_t keep = n, max = cap > 8 ? cap - 8 : 0;

    if (keep > max) {
        keep = max;
        while (keep > 0 && ((unsigned char)s[keep] & 0xC0) == 0x80)
            keep--;
    }
    snprintf(buf, cap, "'%.*s'%s", (int)keep, s, keep < n ? "..." : "");
}

const char *kvg_api_param(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return buf;
}

json_t *kvg_api_field(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

int kvg_api_is_str(const json_t *v, const char *want)
{
    return json_is_string(v) && json_string_length(v) == strlen(want)
           && memcmp(json_string_value(v), want, strlen(want)) == 0;
}
