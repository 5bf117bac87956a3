/* Minimal TAP producer for the C unit tests (run by prove).
 *
 *   ok(cond, "name %d", i);      is_int(got, want, "name");
 *   is_str(got, want, "name");   diag("note %s", s);
 *   return done_testing();
 *
 * Header-only on purpose: every test is one .c file linked against libkvgate.a. */
#ifndef KVG_TAP_H
#define KVG_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tap_count, tap_failed;

__attribute__((format(printf, 2, 3), unused))
static int ok(int cond, const char *fmt, ...)
{
    va_list ap;
    tap_count++;
    printf("%sok %d - ", cond ? "" : "not ", tap_count);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (!cond)
        tap_failed++;
    fflush(stdout);
    return cond;
}

__attribute__((format(printf, 1, 2), unused))
static void diag(const char *fmt, ...)
{
    va_list ap;
    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

#define is_int(got, want, ...) do {                                          \
        long long g_ = (long long)(got), w_ = (long long)(want);             \
        if (!ok(g_ == w_, __VA_ARGS__))                                      \
            diag("  got %lld, expected %lld", g_, w_);                       \
    } while (0)

#define is_str(got, want, ...) do {                                          \
        const char *g_ = (got), *w_ = (want);                                \
        int same_ = g_ && w_ ? strcmp(g_, w_) == 0 : g_ == w_;               \
        if (!ok(same_, __VA_ARGS__))                                         \
            diag("  got '%s', expected '%s'", g_ ? g_ : "(null)",            \
                 w_ ? w_ : "(null)");                                        \
    } while (0)

__attribute__((unused))
static int done_testing(void)
{
    printf("1..%d\n", tap_count);
    return tap_failed ? 1 : 0;
}

/* Tests read ../shared (the project's read-only fixtures) relative to the
 * repository root, where prove runs; KVGATE_SHARED overrides it. */
__attribute__((unused))
static const char *shared_dir(void)
{
    const char *d = getenv("KVGATE_SHARED");
    return d && *d ? d : "../shared";
}

/* Reads a whole file; returns NULL on error. *len gets the size. NUL-terminated. */
__attribute__((unused))
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

#endif
