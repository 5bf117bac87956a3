/* The routing policy: see route.h for the rules. */
#include "route.h"
#include "route_testing.h"

#include <math.h>
#include <string.h>

static const char *const reason_names[KVG_ROUTED_N] = {
    [KVG_ROUTED_PREFIX] = "prefix",         [KVG_ROUTED_LOAD] = "load",
    [KVG_ROUTED_SPILL] = "spill",           [KVG_ROUTED_HASH] = "hash",
    [KVG_ROUTED_LEAST_LOAD] = "least_load", [KVG_ROUTED_ROUND_ROBIN] = "round_robin",
};

static const char *const policy_names[KVG_ROUTE_N] = {
    [KVG_ROUTE_PREFIX] = "prefix",         [KVG_ROUTE_HASH] = "hash",
    [KVG_ROUTE_LEAST_LOAD] = "least_load", [KVG_ROUTE_ROUND_ROBIN] = "round_robin",
};

const char *kvg_route_reason_name(kvg_route_reason r)
{
    return (unsigned)r < KVG_ROUTED_N ? reason_names[r] : "unknown";
}

const char *kvg_route_policy_name(kvg_route_policy p)
{
    return (unsigned)p < KVG_ROUTE_N ? policy_names[p] : "unknown";
}

int kvg_route_policy_parse(const char *s, size_t len, kvg_route_policy *out)
{
    if (!s)
        return -1;
    for (int i = 0; i < KVG_ROUTE_N; i++) {
        if (strlen(policy_names[i]) == len && memcmp(policy_names[i], s, len) == 0) {
            *out = (kvg_route_policy)i;
            return 0;
        }
    }
    return -1;
}

/* splitmix64's finalizer: a bijection with full avalanche, so scores of one key
 * over different ids (and of one id over different keys) look independent. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t kvg_route_score(uint64_t route_key, uint64_t id)
{
    /* The id is mixed on its own first so that keys and ids differing in the same
     * bits do not cancel (key ^ id alone would give (k, i) and (i, k) one score). */
    return mix64(route_key ^ mix64(id + 0x9e3779b97f4a7c15ull));
}

static double factor(double f)
{
    return f >= 1.0 ? f : 1.0;   /* NaN fails the comparison too */
}

double kvg_route_cap(const kvg_route_cand *c, size_t n, uint64_t request_tokens,
                     double balance_factor)
{
    double sum = 0, min_load = 0, r = (double)request_tokens, f = factor(balance_factor);
    size_t ne = 0;
    for (size_t i = 0; i < n; i++) {
        if (!c[i].eligible)
            continue;
        double l = (double)c[i].load;
        if (ne == 0 || l < min_load)
            min_load = l;
        sum += l;
        ne++;
    }
    if (ne == 0)
        return 0;
    double cap = f * (sum + r) / (double)ne;
    if (f * r > cap)
        cap = f * r;
    if (min_load + r > cap)
        cap = min_load + r;
    return cap;
}

/* The work the request adds to c: its tokens less those c holds, at least 1 (the
 * last prompt token is always computed). */
static double cost(const kvg_route_cand *c, double r)
{
    double left = r - (double)c->cached_tokens;
    if (left < 1)
        left = r < 1 ? r : 1;
    return left;
}

static int under(const kvg_route_cand *c, double r, double cap)
{
    return (double)c->load + cost(c, r) <= cap;
}

/* Does candidate a beat b by (score desc, index asc)? Scores are computed by the
 * caller once per candidate. */
static int score_beats(uint64_t sa, size_t ia, uint64_t sb, size_t ib)
{
    return sa != sb ? sa > sb : ia < ib;
}

int kvg_route_pick(kvg_route_policy p, const kvg_route_cand *c, size_t n, uint64_t route_key,
                   uint64_t request_tokens, double balance_factor, uint64_t *rr,
                   kvg_route_reason *why)
{
    if (!c || n == 0 || (unsigned)p >= KVG_ROUTE_N)
        return -1;
    if (p == KVG_ROUTE_ROUND_ROBIN) {
        uint64_t start = rr ? *rr % n : 0;
        for (size_t k = 0; k < n; k++) {
            size_t i = (size_t)((start + k) % n);
            if (c[i].eligible) {
                if (rr)
                    *rr = (uint64_t)i + 1;
                if (why)
                    *why = KVG_ROUTED_ROUND_ROBIN;
                return (int)i;
            }
        }
        return -1;
    }

    double cap = kvg_route_cap(c, n, request_tokens, balance_factor);
    double r = (double)request_tokens;
    uint32_t max_cached = 0;        /* over all eligible engines */
    int best = -1;                  /* the choice so far */
    uint64_t best_score = 0;
    int top = -1;                   /* hash: the highest score regardless of the cap */
    uint64_t top_score = 0;

    for (size_t i = 0; i < n; i++) {
        const kvg_route_cand *e = &c[i];
        if (!e->eligible)
            continue;
        uint64_t s = kvg_route_score(route_key, e->id);
        if (e->cached_blocks > max_cached)
            max_cached = e->cached_blocks;
        if (top < 0 || score_beats(s, i, top_score, (size_t)top)) {
            top = (int)i;
            top_score = s;
        }
        if (p != KVG_ROUTE_LEAST_LOAD && !under(e, r, cap))
            continue;
        int better;
        if (best < 0) {
            better = 1;
        } else {
            const kvg_route_cand *b = &c[best];
            switch (p) {
            case KVG_ROUTE_PREFIX:
                if (e->cached_blocks != b->cached_blocks)
                    better = e->cached_blocks > b->cached_blocks;
                else if (e->cached_blocks == 0 && e->load != b->load)
                    better = e->load < b->load;
                else
                    better = score_beats(s, i, best_score, (size_t)best);
                break;
            case KVG_ROUTE_LEAST_LOAD:
                better = e->load != b->load ? e->load < b->load
                                            : score_beats(s, i, best_score, (size_t)best);
                break;
            default: /* KVG_ROUTE_HASH */
                better = score_beats(s, i, best_score, (size_t)best);
                break;
            }
        }
        if (better) {
            best = (int)i;
            best_score = s;
        }
    }
    if (best < 0)
        return -1;   /* none eligible (the least loaded eligible engine is always under the cap) */
    if (why) {
        switch (p) {
        case KVG_ROUTE_PREFIX:
            *why = max_cached == 0 ? KVG_ROUTED_LOAD
                 : c[best].cached_blocks == max_cached ? KVG_ROUTED_PREFIX : KVG_ROUTED_SPILL;
            break;
        case KVG_ROUTE_LEAST_LOAD:
            *why = KVG_ROUTED_LEAST_LOAD;
            break;
        default:
            *why = best == top ? KVG_ROUTED_HASH : KVG_ROUTED_SPILL;
            break;
        }
    }
    return best;
}
