/* Routing a request over several engines: the policy (plain C, no nginx, no
 * allocation, O(n) per pick). The gateway fills one kvg_route_cand per engine of
 * the location's group and calls kvg_route_pick; the benchmark and the unit test
 * run exactly the same rule.
 *
 * ---- The bound (consistent hashing with bounded loads, Mirrokni et al.) ----
 * Over the ELIGIBLE candidates (n_e of them, loads summing to L, the smallest
 * load min_load) and the request's r = request_tokens:
 *
 *     cap = max( f x (L + r) / n_e,      the mean load after placing the request, x f
 *                f x r,                  a fleet with less than one request of work
 *                                         per engine is idle: it never spills
 *                min_load + r )          the least loaded engine always fits, so some
 *                                         engine is always under the cap
 *
 * with f = balance_factor (values below 1, and NaN, count as 1). An engine is UNDER
 * the cap when load + cost <= cap, cost being the work the request would add THERE:
 * r less the prompt tokens it already holds (cached_tokens), at least 1. A hit costs an
 * engine little, so the engine holding a long prefix keeps taking its requests until
 * the work they really add would overload it; the bound is on work, not on request
 * counts. Engines over the cap are skipped (the third term guarantees one under it
 * always exists: cost <= r). The load is whatever the caller measures (the engine's
 * load_tokens: prompt tokens still to compute + running samples).
 *
 * ---- The rendezvous score ----
 * score(route_key, id) = a 64-bit mix of both; the higher score wins a tie, a tie of
 * scores (equal ids) goes to the lower index. For one route key the order of the
 * engines is fixed and independent of which other engines exist: routing is stable,
 * and removing an engine moves only the keys that were on it.
 *
 * ---- The policies ----
 * prefix       Among the engines under the cap, the most cached_blocks; equal
 *              cached (> 0) by rendezvous score; cached 0 by least load, then
 *              rendezvous.
 *              Reason: prefix when the choice holds as many blocks as the best
 *              eligible holder; load when no eligible engine holds any; spill when
 *              the best holder(s) were over the cap and the choice holds fewer
 *              (the prefix then becomes cached there too).
 * hash         The highest rendezvous score under the cap. Reason hash, or spill
 *              when the highest score overall was over the cap.
 * least_load   The least load (no cap: the least loaded engine is always under
 *              it), ties by rendezvous score. Reason least_load.
 * round_robin  The first eligible index at or after *rr mod n, cyclically; *rr
 *              becomes that index + 1. No cap (a baseline). Reason round_robin.
 *
 * Ineligible candidates are never picked; -1 (and *why untouched) when none is
 * eligible. */
#ifndef KVG_ROUTE_H
#define KVG_ROUTE_H

#include <stddef.h>
#include <stdint.h>

typedef enum kvg_route_policy {
    KVG_ROUTE_PREFIX = 0,
    KVG_ROUTE_HASH,
    KVG_ROUTE_LEAST_LOAD,
    KVG_ROUTE_ROUND_ROBIN,
    KVG_ROUTE_N
} kvg_route_policy;

typedef enum kvg_route_reason {
    KVG_ROUTED_PREFIX = 0,   /* the most leading blocks held */
    KVG_ROUTED_LOAD,         /* no engine held any: least load (prefix policy) */
    KVG_ROUTED_SPILL,        /* the best holder was over the cap */
    KVG_ROUTED_HASH,
    KVG_ROUTED_LEAST_LOAD,
    KVG_ROUTED_ROUND_ROBIN,
    KVG_ROUTED_N
} kvg_route_reason;

/* "prefix", "load", "spill", "hash", "least_load", "round_robin"; "unknown" out of range. */
const char *kvg_route_reason_name(kvg_route_reason r);
/* The policy named s[0..len), exactly and case-sensitively: "prefix", "hash",
 * "least_load", "round_robin". 0, or -1 (and *out untouched). */
int kvg_route_policy_parse(const char *s, size_t len, kvg_route_policy *out);

typedef struct kvg_route_cand {
    int eligible;            /* up, not stalled, serving the request's model */
    uint64_t id;             /* stable per engine (e.g. a hash of its configured name/path) */
    uint32_t cached_blocks;  /* leading blocks of the request its cache holds (prefix policy) */
    uint64_t cached_tokens;  /* the prompt tokens of those blocks (0: the request costs
                                request_tokens there; the bound of every policy) */
    uint64_t load;           /* its load (tokens) */
} kvg_route_cand;

/* Index of the chosen candidate, -1 when none is eligible. request_tokens is added
 * to the chosen engine's load when computing the bound. rr: the caller's
 * round-robin counter (advanced by round_robin only; may be NULL for the others).
 * why: may be NULL. */
int kvg_route_pick(kvg_route_policy p, const kvg_route_cand *c, size_t n, uint64_t route_key,
                   uint64_t request_tokens, double balance_factor, uint64_t *rr,
                   kvg_route_reason *why);

#endif
