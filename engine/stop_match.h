/* Stop strings matched on the decoded text as it streams, across token boundaries.
 *
 * The engine feeds each token's decoded bytes (kvg_detok output, so whole UTF-8
 * characters) in order. Bytes that might still be the start of a stop string are
 * held back until the next bytes decide, so a client never sees part of a stop
 * string: output is exactly the text before the first stop string to complete
 * (generation halts there, so later text never exists; the stop string itself is
 * not returned, as in the OpenAI API). Of stops completing at the same byte, the
 * longest (earliest starting) wins, then the lower index. At most KVG_STOP_MAX strings of 1..KVG_STOP_MAX_LEN bytes. */
#ifndef KVG_STOP_MATCH_H
#define KVG_STOP_MATCH_H

#include <stddef.h>

#include "proto.h"

/* The protocol's limits (proto.h), not numbers of their own: every stop string a
 * SUBMIT carries fits the matcher. */
#define KVG_STOP_MAX      KVG_PROTO_MAX_STOP
#define KVG_STOP_MAX_LEN  KVG_PROTO_MAX_STOP_LEN

typedef struct kvg_stop_match {
    int n;
    size_t len[KVG_STOP_MAX];
    char str[KVG_STOP_MAX][KVG_STOP_MAX_LEN];
    size_t max_len;
    char hold[KVG_STOP_MAX_LEN];  /* held-back tail: a proper prefix of some stop */
    size_t n_hold;
    int matched;                  /* index of the stop string found, -1 while none */
} kvg_stop_match;

/* n strings (n may be 0: nothing ever matches or is held). lens[i] are byte
 * lengths (lens NULL: NUL-terminated). 0, or -1 with err (too many, empty, too long). */
int kvg_stop_init(kvg_stop_match *m, const char *const *stops, const size_t *lens, int n,
                  char *err, size_t err_len);

/* Output capacity kvg_stop_feed needs for `len` input bytes. */
static inline size_t kvg_stop_out_cap(size_t len) { return len + KVG_STOP_MAX_LEN; }

/* Feeds len bytes; writes the bytes now known to precede any stop to out (capacity
 * cap >= kvg_stop_out_cap(len)) and returns how many, or -1 when cap is too small
 * (nothing changes). Once a stop matched (m->matched >= 0) the rest is dropped and
 * feeding returns 0. */
long kvg_stop_feed(kvg_stop_match *m, const char *in, size_t len, char *out, size_t cap);

/* End of stream without a match: releases the held-back bytes (cap >= KVG_STOP_MAX_LEN). */
long kvg_stop_flush(kvg_stop_match *m, char *out, size_t cap);

#endif
