/* Length buckets: the prompt's token count picks a bucket, which decides whether
 * the prefix cache is consulted at all and labels metrics and variables.
 *
 * Boundaries b1 < b2 < ... < bn (default 128 1024 8192 32768) give n+1 buckets:
 *   index 0          count < b1           label "bypass" (too short to be worth
 *                                          caching: the cache is not consulted)
 *   index i (1..n)   b_i <= count < b_i+1 (the last one open-ended)
 *                    label = b_i written compactly: a multiple of 1024 as "<k>k"
 *                    (1024 -> "1k", 32768 -> "32k"), of 1048576 as "<m>m",
 *                    otherwise the number ("128", "1000").
 * So the defaults are bypass | 128 | 1k | 8k | 32k, and bucket "1k" holds
 * 1024..8191 tokens. Labels name a bucket by its smallest member. */
#ifndef KVG_BUCKETS_H
#define KVG_BUCKETS_H

#include <stddef.h>
#include <stdint.h>

#define KVG_BUCKETS_MAX_BOUNDS  16
#define KVG_BUCKETS_MAX_VALUE   1000000000u  /* far beyond any context length */
#define KVG_BUCKETS_DEFAULT     "128 1024 8192 32768"
#define KVG_BUCKET_BYPASS       0u

typedef struct kvg_buckets {
    unsigned n_bounds;                          /* >= 1 */
    uint32_t bound[KVG_BUCKETS_MAX_BOUNDS];
    char label[KVG_BUCKETS_MAX_BOUNDS + 1][12];
} kvg_buckets;

/* Parses boundaries from spec: positive decimal integers (<= KVG_BUCKETS_MAX_VALUE),
 * strictly increasing, separated by whitespace or commas; 1 to 16 of them.
 * Returns 0, or -1 with err naming the offending value. b is left unchanged on
 * error. */
int kvg_buckets_parse(kvg_buckets *b, const char *spec, char *err, size_t err_len);

/* The buckets a gateway uses: the bypass threshold min_tokens first (0 means nothing
 * bypasses: a threshold of 1 no prompt is under), then the bounds of `bounds` above
 * it (NULL: the defaults). Always succeeds; bounds beyond the 16th are dropped. */
void kvg_buckets_with_min(kvg_buckets *b, uint32_t min_tokens, const kvg_buckets *bounds);

/* Number of buckets: n_bounds + 1 (bypass included). */
unsigned kvg_buckets_count(const kvg_buckets *b);

/* Bucket index of a token count: 0 (bypass) .. n_bounds. */
unsigned kvg_bucket_index(const kvg_buckets *b, uint64_t n_tokens);

/* Label of a bucket index; "?" when out of range. */
const char *kvg_bucket_label(const kvg_buckets *b, unsigned idx);

#endif
