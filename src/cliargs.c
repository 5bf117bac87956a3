/* Command-line helpers; see cliargs.h. */
#include "cliargs.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* One option's value into its destination: 0; -1 for a bad value (the option's `bad`
 * says so); -2 when a custom parser wrote the usage error into msg. */
static int parse_value(const kvg_opt *o, const char *v, char *msg, size_t msg_len)
{
    long l;
    double d;

    switch (o->kind) {
    case KVG_OPT_STR:
        *(const char **)o->dst = v;
        return 0;
    case KVG_OPT_LONG:
    case KVG_OPT_INT:
        if (kvg_arg_long(v, (long)o->lo, (long)o->hi, &l) != 0)
            break;
        if (o->kind == KVG_OPT_LONG)
            *(long *)o->dst = l;
        else
            *(int *)o->dst = (int)l;
        return 0;
    case KVG_OPT_FLOAT:
        if (kvg_arg_double(v, -1e30, 1e30, &d) != 0 || !((float)d >= (float)o->lo && (float)d <= (float)o->hi))
            break;
        *(float *)o->dst = (float)d;
        return 0;
    case KVG_OPT_DOUBLE:
        if (kvg_arg_double(v, o->lo, o->hi, &d) != 0)
            break;
        *(double *)o->dst = d;
        return 0;
    case KVG_OPT_ON_OFF:
        if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0)
            break;
        *(int *)o->dst = strcmp(v, "on") == 0;
        return 0;
    case KVG_OPT_CUSTOM:
        msg[0] = '\0';
        if (o->parse(v, o->dst, msg, msg_len) == 0)
            return 0;
        return msg[0] ? -2 : -1;
    case KVG_OPT_FLAG:
        break;
    }
    return -1;
}

int kvg_args_parse(const char *prog, const char *usage, int argc, char **argv, const kvg_opt *opts,
                   size_t n_opts)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const kvg_opt *o = NULL;
        char msg[256];

        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            exit(0);
        }
        for (size_t j = 0; j < n_opts && !o; j++)
            if (strcmp(a, opts[j].name) == 0)
                o = &opts[j];
        if (o && o->kind == KVG_OPT_FLAG) {
            *(int *)o->dst = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0)
            return kvg_usage_error(prog, "unexpected argument '%s'", a);
        if (!v)
            return kvg_usage_error(prog, "%s needs a value", a);
        i++;
        if (!o)
            return kvg_usage_error(prog, "unknown option '%s'", a);
        switch (parse_value(o, v, msg, sizeof msg)) {
        case 0:
            break;
        case -1:
            return kvg_usage_error(prog, o->bad, v);
        default:
            return kvg_usage_error(prog, "%s", msg);
        }
    }
    return 0;
}
