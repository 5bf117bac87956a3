/* For tests only: a policy's name, the load cap and the rendezvous score (route.c),
 * which the unit test checks. Not the library's API: nothing outside t/ calls these
 * (the gateway routes with kvg_route_pick). */
#ifndef KVG_ROUTE_TESTING_H
#define KVG_ROUTE_TESTING_H

#include "route.h"

/* "prefix", "hash", "least_load", "round_robin"; "unknown" out of range. */
const char *kvg_route_policy_name(kvg_route_policy p);

/* The load cap of kvg_route_pick (0 when no candidate is eligible). */
double kvg_route_cap(const kvg_route_cand *c, size_t n, uint64_t request_tokens,
                     double balance_factor);

/* The rendezvous score of (route_key, id). */
uint64_t kvg_route_score(uint64_t route_key, uint64_t id);

#endif
