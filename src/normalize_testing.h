/* For tests only: the normalizer's step names, list parsing and formatting, and its
 * normalization into the caller's buffer (normalize.c), which the unit test, the fuzz
 * target and the benchmark use. Not the library's API: nothing outside t/ and fuzz/
 * calls these (the gateway parses one step at a time, kvg_normalize_parse_step, and
 * normalizes with kvg_normalize). */
#ifndef KVG_NORMALIZE_TESTING_H
#define KVG_NORMALIZE_TESTING_H

#include "normalize.h"

/* The configuration name of one step flag ("nfc", "newlines", "junk", "spaces",
 * "trailing", "blank-lines"); NULL when flag is not exactly one known step. */
const char *kvg_normalize_step_name(unsigned flag);

/* Parses a list of words separated by spaces, tabs or commas into the union of
 * their flags: "newlines spaces nfc", "all", "off". "off" cannot be combined with
 * steps; an empty list is an error. */
int kvg_normalize_parse(const char *list, unsigned *flags, char *err, size_t err_len);

/* Writes the step names of flags, space-separated in pipeline order ("off" for 0),
 * NUL-terminated and truncated to size. Returns the length it needed. */
size_t kvg_normalize_format(unsigned flags, char *buf, size_t size);

/* Upper bound of the output size for in[0..len) under flags: len without nfc, and
 * len plus twice the number of non-ASCII bytes with it (one cheap scan). SIZE_MAX
 * on overflow. */
size_t kvg_normalize_bound(unsigned flags, const char *in, size_t len);

/* Normalizes in[0..len) into out (capacity cap; kvg_normalize_bound() bytes always
 * suffice), for callers that allocate from their own pool. Not NUL-terminated.
 * out may equal in when nfc is off; otherwise they must not overlap. Returns 0
 * with *out_len set, or -1 with err: invalid UTF-8 ("invalid UTF-8 at byte offset
 * N"), unknown flag bits, cap too small, out of memory. Only nfc may malloc (a
 * scratch for very long runs of combining marks); it frees it before returning. */
int kvg_normalize_into(unsigned flags, const char *in, size_t len, char *out, size_t cap,
                       size_t *out_len, char *err, size_t err_len);

#endif
