#include "buckets.h"
#include "buckets_testing.h"

#include <stdio.h>
#include <string.h>

static void make_label(uint32_t v, char *out, size_t cap)
{
    if (v % (1024u * 1024u) == 0)
        snprintf(out, cap, "%um", (unsigned)(v / (1024u * 1024u)));
    else if (v % 1024u == 0)
        snprintf(out, cap, "%uk", (unsigned)(v / 1024u));
    else
        snprintf(out, cap, "%u", (unsigned)v);
}

static int is_sep(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',';
}

int kvg_buckets_parse(kvg_buckets *b, const char *spec, char *err, size_t err_len)
{
    kvg_buckets nb;
    const char *s = spec;

    memset(&nb, 0, sizeof nb);
    if (!spec) {
        snprintf(err, err_len, "bucket boundaries: none given");
        return -1;
    }
    for (;;) {
        const char *start;
        uint64_t v = 0;

        while (is_sep(*s))
            s++;
        if (!*s)
            break;
        start = s;
        while (*s >= '0' && *s <= '9') {
            if (v <= KVG_BUCKETS_MAX_VALUE)
                v = v * 10 + (uint64_t)(*s - '0');
            s++;
        }
        if (s == start || (*s && !is_sep(*s))) {
            size_t n = strcspn(start, " \t\r\n,");
            snprintf(err, err_len, "bucket boundaries: '%.*s' is not a positive integer",
                     (int)(n > 32 ? 32 : n), start);
            return -1;
        }
        if (v == 0 || v > KVG_BUCKETS_MAX_VALUE) {
            snprintf(err, err_len, "bucket boundaries: '%.*s' is out of range (1..%u)",
                     (int)(s - start > 32 ? 32 : s - start), start, KVG_BUCKETS_MAX_VALUE);
            return -1;
        }
        if (nb.n_bounds == KVG_BUCKETS_MAX_BOUNDS) {
            snprintf(err, err_len, "bucket boundaries: more than %d values",
                     KVG_BUCKETS_MAX_BOUNDS);
            return -1;
        }
        if (nb.n_bounds > 0 && v <= nb.bound[nb.n_bounds - 1]) {
            snprintf(err, err_len, "bucket boundaries: %u after %u is not strictly increasing",
                     (unsigned)v, (unsigned)nb.bound[nb.n_bounds - 1]);
            return -1;
        }
        nb.bound[nb.n_bounds++] = (uint32_t)v;
    }
    if (nb.n_bounds == 0) {
        snprintf(err, err_len, "bucket boundaries: none given (expected e.g. \"%s\")",
                 KVG_BUCKETS_DEFAULT);
        return -1;
    }
    snprintf(nb.label[0], sizeof nb.label[0], "bypass");
    for (unsigned i = 0; i < nb.n_bounds; i++)
        make_label(nb.bound[i], nb.label[i + 1], sizeof nb.label[i + 1]);
    *b = nb;
    return 0;
}

void kvg_buckets_default(kvg_buckets *b)
{
    char err[8];
    (void)kvg_buckets_parse(b, KVG_BUCKETS_DEFAULT, err, sizeof err);
}

void kvg_buckets_with_min(kvg_buckets *b, uint32_t min_tokens, const kvg_buckets *bounds)
{
    kvg_buckets def, nb;
    uint32_t first = min_tokens ? min_tokens : 1;

    if (!bounds) {
        kvg_buckets_default(&def);
        bounds = &def;
    }
    if (first > KVG_BUCKETS_MAX_VALUE)
        first = KVG_BUCKETS_MAX_VALUE;
    memset(&nb, 0, sizeof nb);
    nb.bound[nb.n_bounds++] = first;
    for (unsigned i = 0; i < bounds->n_bounds && nb.n_bounds < KVG_BUCKETS_MAX_BOUNDS; i++)
        if (bounds->bound[i] > first)
            nb.bound[nb.n_bounds++] = bounds->bound[i];
    snprintf(nb.label[0], sizeof nb.label[0], "bypass");
    for (unsigned i = 0; i < nb.n_bounds; i++)
        make_label(nb.bound[i], nb.label[i + 1], sizeof nb.label[i + 1]);
    *b = nb;
}

unsigned kvg_buckets_count(const kvg_buckets *b)
{
    return b->n_bounds + 1;
}

unsigned kvg_bucket_index(const kvg_buckets *b, uint64_t n_tokens)
{
    unsigned i = 0;

    /* at most 16 boundaries: a linear scan beats a binary search's branches */
    while (i < b->n_bounds && n_tokens >= b->bound[i])
        i++;
    return i;
}

const char *kvg_bucket_label(const kvg_buckets *b, unsigned idx)
{
    return idx <= b->n_bounds ? b->label[idx] : "?";
}
