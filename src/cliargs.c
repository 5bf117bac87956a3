/* Command-line helpers; see cliargs.h. */
#include "cliargs.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int kvg_arg_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int kvg_arg_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int kvg_arg_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v <= 0)
        return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end)
        return -1;
    v *= mul;
    if (v >= 18e18)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static int is_sep(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',';
}

int kvg_arg_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids)
        return -1;
    for (;;) {
        char *end;
        while (is_sep(*s))
            s++;
        if (!*s)
            return 0;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v > INT32_MAX || (*end && !is_sep(*end)))
            return -1;
        if (*n == cap) {
            int32_t *g = realloc(*ids, cap * 2 * sizeof **ids);
            if (!g)
                return -1;
            *ids = g;
            cap *= 2;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = end;
    }
}

char *kvg_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0;
    if (!f)
        return NULL;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            size_t nc = cap ? cap * 2 : 65536;
            char *g = realloc(buf, nc);
            if (!g) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = g;
            cap = nc;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        int e = errno;
        free(buf);
        fclose(f);
        errno = e ? e : EIO;
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

int kvg_usage_error(const char *prog, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see %s --help)\n", prog);
    return 2;
}

int kvg_arg_int_list(const char *s, int lo, int hi, int *out, int max, int *n)
{
    int32_t *ids = NULL;
    size_t k = 0;
    int rc = -1;
    if (kvg_arg_ids(s, &ids, &k) == 0 && k >= 1 && k <= (size_t)max) {
        rc = 0;
        for (size_t i = 0; i < k; i++) {
            if (ids[i] < lo || ids[i] > hi)
                rc = -1;
            out[i] = ids[i];
        }
        *n = (int)k;
    }
    free(ids);
    return rc;
}
