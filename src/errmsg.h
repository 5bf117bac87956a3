/* Error messages: every fallible function in kvgate takes (char *err, size_t err_len)
 * and writes one line into it. These two helpers are the only way they are written. */
#ifndef KVG_ERRMSG_H
#define KVG_ERRMSG_H

#include <stddef.h>

/* printf into err (when err is non-NULL and err_len > 0). */
void kvg_set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "name: message" into err; returns -1 so loaders can `return kvg_fail(...)`. */
int kvg_fail(char *err, size_t err_len, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
