/* For tests only: the default bucket boundaries alone (buckets.c), which the unit test
 * checks. Not the library's API: nothing outside t/ calls it (a gateway takes them
 * through kvg_buckets_with_min). */
#ifndef KVG_BUCKETS_TESTING_H
#define KVG_BUCKETS_TESTING_H

#include "buckets.h"

/* Fills b with the default boundaries. */
void kvg_buckets_default(kvg_buckets *b);

#endif
