#include <stdarg.h>
#include <stdio.h>

#include "errmsg.h"

void kvg_set_err(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;

    if (!err || err_len == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

int kvg_fail(char *err, size_t err_len, const char *name, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (!err || err_len == 0)
        return -1;
    n = snprintf(err, err_len, "%s: ", name);
    if (n >= 0 && (size_t)n < err_len) {
        va_start(ap, fmt);
        vsnprintf(err + n, err_len - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}
