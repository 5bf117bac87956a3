/* The routing policy (src/route.h), rule by rule: prefix (most leading blocks,
 * least load when none held, spill past the bound), bounded load over a stream of
 * hot-prefix requests, stable rendezvous ties and their spread, ineligible engines,
 * hash (consistent under removal), least_load, round_robin, names and parsing.
 * Every key and load is fixed: the test is deterministic. */
#include <stdint.h>
#include <string.h>

#include "route.h"
#include "route_testing.h"
#include "tap.h"

static kvg_route_cand cand(uint64_t id, uint32_t held, uint64_t load)
{
    kvg_route_cand c = { .eligible = 1, .id = id, .cached_blocks = held, .load = load };
    return c;
}

static int pick(kvg_route_policy p, const kvg_route_cand *c, size_t n, uint64_t key,
                uint64_t r, kvg_route_reason *why)
{
    uint64_t rr = 0;
    return kvg_route_pick(p, c, n, key, r, 1.25, &rr, why);
}

/* The cap as the header defines it, recomputed here independently. */
static double ref_cap(const kvg_route_cand *c, size_t n, uint64_t r, double f)
{
    double sum = 0, mn = -1;
    size_t ne = 0;
    for (size_t i = 0; i < n; i++)
        if (c[i].eligible) {
            sum += (double)c[i].load;
            if (mn < 0 || (double)c[i].load < mn)
                mn = (double)c[i].load;
            ne++;
        }
    if (!ne)
        return 0;
    double cap = f * (sum + (double)r) / (double)ne;
    if (f * (double)r > cap)
        cap = f * (double)r;
    if (mn + (double)r > cap)
        cap = mn + (double)r;
    return cap;
}

static void test_names(void)
{
    static const char *const pol[] = { "prefix", "hash", "least_load", "round_robin" };
    for (int i = 0; i < 4; i++) {
        kvg_route_policy p = KVG_ROUTE_N;
        is_int(kvg_route_policy_parse(pol[i], strlen(pol[i]), &p), 0, "parse %s", pol[i]);
        is_int(p, i, "parse %s -> %d", pol[i], i);
        is_str(kvg_route_policy_name((kvg_route_policy)i), pol[i], "policy name %d", i);
    }
    kvg_route_policy p = KVG_ROUTE_HASH;
    ok(kvg_route_policy_parse("prefixx", 7, &p) == -1 && p == KVG_ROUTE_HASH, "longer name rejected");
    ok(kvg_route_policy_parse("prefix", 5, &p) == -1, "prefix of a name rejected");
    ok(kvg_route_policy_parse("Prefix", 6, &p) == -1, "case matters");
    ok(kvg_route_policy_parse("", 0, &p) == -1, "empty rejected");
    ok(kvg_route_policy_parse("least_loadX", 10, &p) == 0 && p == KVG_ROUTE_LEAST_LOAD,
       "length bounds the name (not NUL)");
    static const char *const rs[] = { "prefix", "load", "spill", "hash", "least_load", "round_robin" };
    for (int i = 0; i < KVG_ROUTED_N; i++)
        is_str(kvg_route_reason_name((kvg_route_reason)i), rs[i], "reason name %d", i);
    is_str(kvg_route_reason_name(KVG_ROUTED_N), "unknown", "reason out of range");
    is_str(kvg_route_policy_name(KVG_ROUTE_N), "unknown", "policy out of range");
}

static void test_prefix_basic(void)
{
    kvg_route_reason why = KVG_ROUTED_N;
    /* The most leading blocks wins, even against a somewhat higher load. */
    kvg_route_cand c[3] = { cand(11, 2, 1000), cand(22, 7, 1100), cand(33, 0, 900) };
    is_int(pick(KVG_ROUTE_PREFIX, c, 3, 5, 100, &why), 1, "prefix: most held blocks");
    is_int(why, KVG_ROUTED_PREFIX, "reason prefix");

    /* None held: least load, reason load. */
    kvg_route_cand d[3] = { cand(11, 0, 500), cand(22, 0, 40), cand(33, 0, 90) };
    why = KVG_ROUTED_N;
    is_int(pick(KVG_ROUTE_PREFIX, d, 3, 5, 100, &why), 1, "none held: least load");
    is_int(why, KVG_ROUTED_LOAD, "reason load");

    /* An idle fleet never spills: everything at 0, a large request, the holder takes it. */
    kvg_route_cand e[3] = { cand(11, 0, 0), cand(22, 3, 0), cand(33, 0, 0) };
    why = KVG_ROUTED_N;
    is_int(pick(KVG_ROUTE_PREFIX, e, 3, 5, 100000, &why), 1, "idle fleet: holder");
    is_int(why, KVG_ROUTED_PREFIX, "idle fleet: no spill");
    /* ... and a fleet with less than (f - 1) x request of work on the holder. */
    e[1].load = 20000;
    is_int(pick(KVG_ROUTE_PREFIX, e, 3, 5, 100000, &why), 1, "nearly idle: holder");
    is_int(why, KVG_ROUTED_PREFIX, "nearly idle: no spill");

    /* The best holder over the cap: the next best under it, reason spill. */
    kvg_route_cand s[3] = { cand(11, 9, 10000), cand(22, 4, 1000), cand(33, 0, 0) };
    why = KVG_ROUTED_N;
    double cap = kvg_route_cap(s, 3, 100, 1.25);
    ok(cap > 1100 && cap < 10100, "cap %.1f between the holders", cap);
    is_int(pick(KVG_ROUTE_PREFIX, s, 3, 5, 100, &why), 1, "spill to the next best holder");
    is_int(why, KVG_ROUTED_SPILL, "reason spill");
    /* Both holders over: the non-holder under the cap. */
    s[1].load = 9000;
    is_int(pick(KVG_ROUTE_PREFIX, s, 3, 5, 100, &why), 2, "spill to the idle engine");
    is_int(why, KVG_ROUTED_SPILL, "reason spill (held 0)");

    /* Two holders with as many blocks, the rendezvous-first over the cap: the other one,
     * and that is still a prefix hit. */
    for (uint64_t key = 0; key < 16; key++) {
        kvg_route_cand t[3] = { cand(11, 5, 0), cand(22, 5, 0), cand(33, 0, 0) };
        int first = pick(KVG_ROUTE_PREFIX, t, 3, key, 100, NULL);
        ok(first == 0 || first == 1, "equal holders: one of them (key %llu)", (unsigned long long)key);
        t[first].load = 50000;
        is_int(pick(KVG_ROUTE_PREFIX, t, 3, key, 100, &why), 1 - first, "its twin when it is over (key %llu)",
               (unsigned long long)key);
        is_int(why, KVG_ROUTED_PREFIX, "equal holder: reason prefix");
    }

    /* Single engine: always it, whatever its load. */
    kvg_route_cand one[1] = { cand(11, 0, 1u << 30) };
    is_int(pick(KVG_ROUTE_PREFIX, one, 1, 1, 100, &why), 0, "a group of one");
    is_int(pick(KVG_ROUTE_HASH, one, 1, 1, 100, &why), 0, "a group of one (hash)");
    is_int(why, KVG_ROUTED_HASH, "a group of one never spills");
}

/* A hot prefix, requests of r tokens arriving faster than they finish: the first
 * lands on the holder; then it spreads, the chosen engine is never over the cap
 * while another is under it, and once the others hold it too, the loads stay within
 * the bound. */
static void test_bounded_load(void)
{
    const uint64_t r = 600;
    const double f = 1.25;
    kvg_route_cand c[3] = { cand(101, 8, 0), cand(202, 0, 0), cand(303, 0, 0) };
    int violations = 0, spills = 0, used[3] = { 0 };
    for (int k = 0; k < 300; k++) {
        kvg_route_reason why;
        uint64_t rr = 0;
        double cap = ref_cap(c, 3, r, f);
        int i = kvg_route_pick(KVG_ROUTE_PREFIX, c, 3, 77, r, f, &rr, &why);
        if (i < 0) {
            violations++;
            break;
        }
        if ((double)(c[i].load + r) > cap)
            for (int j = 0; j < 3; j++)
                if ((double)(c[j].load + r) <= cap)
                    violations++;
        if (k == 0 && (i != 0 || why != KVG_ROUTED_PREFIX))
            violations++;
        spills += why == KVG_ROUTED_SPILL;
        used[i]++;
        c[i].load += r;
        /* The prefix becomes cached where it was computed. */
        c[i].cached_blocks = 8;
        /* Some work finishes now and then, unevenly. */
        if (k % 7 == 3)
            for (int j = 0; j < 3; j++)
                c[j].load -= c[j].load / (uint64_t)(2 + j);
    }
    is_int(violations, 0, "no pick over the cap while another engine was under it");
    ok(spills > 0, "the hot prefix spilled (%d times)", spills);
    ok(used[0] > 0 && used[1] > 0 && used[2] > 0, "spread over all three (%d %d %d)", used[0], used[1],
       used[2]);
    uint64_t sum = c[0].load + c[1].load + c[2].load, mx = 0;
    for (int j = 0; j < 3; j++)
        mx = c[j].load > mx ? c[j].load : mx;
    ok((double)mx <= f * (double)sum / 3 + (double)r, "final loads within the bound (max %llu, sum %llu)",
       (unsigned long long)mx, (unsigned long long)sum);

    /* The cap itself: never below min_load + r nor f x r; the f x mean term when loads are high. */
    kvg_route_cand h[3] = { cand(1, 0, 100000), cand(2, 0, 200000), cand(3, 0, 300000) };
    double cap = kvg_route_cap(h, 3, 1000, 1.25);
    ok(cap > 1.25 * 601000 / 3 - 1 && cap < 1.25 * 601000 / 3 + 1, "cap = f x mean after (%.1f)", cap);
    is_int(pick(KVG_ROUTE_PREFIX, h, 3, 1, 1000, NULL), 0, "high loads: least load");
    kvg_route_cand u[3] = { cand(1, 0, 1500), cand(2, 0, 1500), cand(3, 0, 1500) };
    cap = kvg_route_cap(u, 3, 1000, 1.25);
    ok(cap >= 2500 - 1e-9, "cap >= min_load + r (%.1f)", cap);
    ok(kvg_route_cap(u, 3, 1000, 0.5) >= 2500 - 1e-9, "a factor below 1 counts as 1");
    u[0].eligible = u[1].eligible = u[2].eligible = 0;
    ok(kvg_route_cap(u, 3, 1000, 1.25) == 0, "cap 0 with none eligible");
}

static void test_ties_and_spread(void)
{
    /* All equal: the choice depends only on the key, and is the same every time and
     * whatever the order of the candidates. */
    kvg_route_cand c[3] = { cand(0xa1, 0, 0), cand(0xb2, 0, 0), cand(0xc3, 0, 0) };
    kvg_route_cand rev[3] = { c[2], c[1], c[0] };
    int counts[KVG_ROUTE_N][3] = { { 0 } }, unstable = 0, order = 0;
    for (uint64_t k = 0; k < 3000; k++) {
        uint64_t key = k * 0x100000001b3ull + 12345;
        for (int p = 0; p < KVG_ROUTE_LEAST_LOAD + 1; p++) {
            int a = pick((kvg_route_policy)p, c, 3, key, 50, NULL);
            int b = pick((kvg_route_policy)p, c, 3, key, 50, NULL);
            int r2 = pick((kvg_route_policy)p, rev, 3, key, 50, NULL);
            unstable += a != b || a < 0;
            order += r2 < 0 || rev[r2].id != c[a].id;
            if (a >= 0)
                counts[p][a]++;
        }
    }
    is_int(unstable, 0, "same key, same engine");
    is_int(order, 0, "same key, same engine in any candidate order");
    for (int p = 0; p < KVG_ROUTE_LEAST_LOAD + 1; p++)
        ok(counts[p][0] > 800 && counts[p][1] > 800 && counts[p][2] > 800,
           "%s: 3000 keys spread over 3 engines (%d %d %d)", kvg_route_policy_name((kvg_route_policy)p),
           counts[p][0], counts[p][1], counts[p][2]);

    /* Equal holders: a tie broken by the key, not the load, so a prefix cached twice keeps
     * going to one place for one key while that stays under the cap. */
    int stable = 1;
    for (uint64_t key = 0; key < 200; key++) {
        kvg_route_cand t[3] = { cand(0xa1, 3, 100), cand(0xb2, 3, 120), cand(0xc3, 0, 200) };
        int a = pick(KVG_ROUTE_PREFIX, t, 3, key, 10, NULL);
        t[0].load = 120;
        t[1].load = 100;
        stable &= pick(KVG_ROUTE_PREFIX, t, 3, key, 10, NULL) == a && (a == 0 || a == 1);
    }
    ok(stable, "equal held under the cap: the key decides, not small load changes");
    /* Equal loads with none held: the key decides too. */
    kvg_route_cand z[3] = { cand(0xa1, 0, 70), cand(0xb2, 0, 70), cand(0xc3, 0, 900) };
    int seen[3] = { 0 };
    for (uint64_t key = 0; key < 300; key++)
        seen[pick(KVG_ROUTE_PREFIX, z, 3, key, 10, NULL)]++;
    ok(seen[0] > 50 && seen[1] > 50 && seen[2] == 0, "least-load ties by key (%d %d %d)", seen[0], seen[1],
       seen[2]);
}

static void test_eligible(void)
{
    kvg_route_cand c[4] = { cand(1, 9, 0), cand(2, 3, 10), cand(3, 0, 0), cand(4, 0, 5) };
    c[0].eligible = 0;
    c[2].eligible = 0;
    int bad = 0;
    for (int p = 0; p < KVG_ROUTE_N; p++)
        for (uint64_t key = 0; key < 100; key++) {
            uint64_t rr = key;
            int i = kvg_route_pick((kvg_route_policy)p, c, 4, key, 100, 1.25, &rr, NULL);
            bad += i != 1 && i != 3;
        }
    is_int(bad, 0, "ineligible engines are never picked");
    kvg_route_reason why = KVG_ROUTED_N;
    is_int(pick(KVG_ROUTE_PREFIX, c, 4, 1, 100, &why), 1, "the eligible holder");
    is_int(why, KVG_ROUTED_PREFIX, "an ineligible engine's blocks do not make it a spill");
    for (int i = 0; i < 4; i++)
        c[i].eligible = 0;
    for (int p = 0; p < KVG_ROUTE_N; p++) {
        uint64_t rr = 3;
        why = KVG_ROUTED_N;
        is_int(kvg_route_pick((kvg_route_policy)p, c, 4, 1, 100, 1.25, &rr, &why), -1, "%s: none eligible",
               kvg_route_policy_name((kvg_route_policy)p));
        ok(rr == 3 && why == KVG_ROUTED_N, "nothing written when none is eligible");
    }
    is_int(kvg_route_pick(KVG_ROUTE_PREFIX, c, 0, 1, 1, 1.25, NULL, NULL), -1, "no candidates");
    is_int(kvg_route_pick(KVG_ROUTE_N, c, 4, 1, 1, 1.25, NULL, NULL), -1, "unknown policy");
}

static void test_hash(void)
{
    /* Consistent: with 5 engines, dropping one (ineligible) moves exactly its keys. */
    kvg_route_cand c[5];
    for (int i = 0; i < 5; i++)
        c[i] = cand(0x1000 + (uint64_t)i * 7919, 0, 0);
    static int before[2000];
    for (int k = 0; k < 2000; k++)
        before[k] = pick(KVG_ROUTE_HASH, c, 5, (uint64_t)k * 2654435761u, 100, NULL);
    c[2].eligible = 0;
    int moved_wrong = 0, moved = 0, on2 = 0;
    for (int k = 0; k < 2000; k++) {
        int now = pick(KVG_ROUTE_HASH, c, 5, (uint64_t)k * 2654435761u, 100, NULL);
        on2 += before[k] == 2;
        moved += now != before[k];
        moved_wrong += before[k] != 2 && now != before[k];
        moved_wrong += now == 2;
    }
    is_int(moved_wrong, 0, "removing one engine moves only its keys");
    is_int(moved, on2, "and all of its keys (%d)", on2);
    ok(on2 > 250 && on2 < 550, "it held about a fifth (%d)", on2);
    c[2].eligible = 1;
    int back = 0;
    for (int k = 0; k < 2000; k++)
        back += pick(KVG_ROUTE_HASH, c, 5, (uint64_t)k * 2654435761u, 100, NULL) == before[k];
    is_int(back, 2000, "it rejoins with the same keys");

    /* The first choice over the cap: the next in rendezvous order, reason spill. */
    kvg_route_reason why;
    uint64_t key = 42;
    int first = pick(KVG_ROUTE_HASH, c, 5, key, 100, &why);
    is_int(why, KVG_ROUTED_HASH, "reason hash");
    c[first].load = 100000;
    int second = pick(KVG_ROUTE_HASH, c, 5, key, 100, &why);
    ok(second >= 0 && second != first, "over the cap: another one");
    is_int(why, KVG_ROUTED_SPILL, "reason spill");
    /* ... the one that wins when the first is gone. */
    c[first].load = 0;
    c[first].eligible = 0;
    is_int(pick(KVG_ROUTE_HASH, c, 5, key, 100, NULL), second, "the next in rendezvous order");
    /* Held blocks do not matter to hash. */
    c[first].eligible = 1;
    c[(first + 1) % 5].cached_blocks = 50;
    is_int(pick(KVG_ROUTE_HASH, c, 5, key, 100, NULL), first, "hash ignores held blocks");
}

static void test_least_load(void)
{
    kvg_route_cand c[4] = { cand(1, 9, 300), cand(2, 0, 20), cand(3, 0, 21), cand(4, 5, 1000) };
    kvg_route_reason why;
    is_int(pick(KVG_ROUTE_LEAST_LOAD, c, 4, 9, 10, &why), 1, "least load, held ignored");
    is_int(why, KVG_ROUTED_LEAST_LOAD, "reason least_load");
    c[2].load = 20;
    int a = pick(KVG_ROUTE_LEAST_LOAD, c, 4, 9, 10, NULL);
    ok(a == 1 || a == 2, "a tie: one of the least");
    int same = 1;
    for (int i = 0; i < 10; i++)
        same &= pick(KVG_ROUTE_LEAST_LOAD, c, 4, 9, 10, NULL) == a;
    ok(same, "a tie: stable for the key");
}

static void test_round_robin(void)
{
    kvg_route_cand c[4] = { cand(1, 0, 0), cand(2, 0, 0), cand(3, 0, 0), cand(4, 0, 0) };
    c[2].eligible = 0;
    uint64_t rr = 0;
    int seq[8];
    kvg_route_reason why = KVG_ROUTED_N;
    for (int i = 0; i < 8; i++)
        seq[i] = kvg_route_pick(KVG_ROUTE_ROUND_ROBIN, c, 4, 0, 10, 1.25, &rr, &why);
    static const int want[8] = { 0, 1, 3, 0, 1, 3, 0, 1 };
    ok(memcmp(seq, want, sizeof want) == 0, "cycles through the eligible ones (%d %d %d %d %d %d)", seq[0],
       seq[1], seq[2], seq[3], seq[4], seq[5]);
    is_int(why, KVG_ROUTED_ROUND_ROBIN, "reason round_robin");
    /* Loads and holders do not matter; a huge counter wraps modulo n. */
    c[0].load = 1u << 30;
    c[3].cached_blocks = 100;
    rr = UINT64_MAX - 1;   /* mod 4 = 2: ineligible, so 3 */
    is_int(kvg_route_pick(KVG_ROUTE_ROUND_ROBIN, c, 4, 0, 10, 1.25, &rr, NULL), 3, "counter mod n");
    is_int(rr, 4, "counter advanced past the choice");
    is_int(kvg_route_pick(KVG_ROUTE_ROUND_ROBIN, c, 4, 0, 10, 1.25, &rr, NULL), 0,
           "then the overloaded one: no cap");
}

/* The bound is on the work a request adds: an engine holding most of a long prompt
 * adds only the rest, so it keeps the request where the full count would spill it;
 * once even the rest would overload it, it spills. Every policy with a bound
 * (prefix, hash) uses the same cost. */
static void test_cost_aware_bound(void)
{
    const uint64_t r = 1000;
    kvg_route_reason why;
    /* loads 3000 / 1000 / 1000: mean after placing 2000, cap 2500 at f = 1.25. */
    kvg_route_cand c[3] = { cand(101, 60, 3000), cand(202, 0, 1000), cand(303, 0, 1000) };
    double cap = kvg_route_cap(c, 3, r, 1.25);
    ok(cap > 2499.9 && cap < 2500.1, "cap %.1f", cap);
    is_int(kvg_route_pick(KVG_ROUTE_PREFIX, c, 3, 9, r, 1.25, NULL, &why), 1 + (kvg_route_score(9, 303) >
           kvg_route_score(9, 202)), "cached_tokens unset: 3000 + 1000 is over the cap, it spills");
    is_int((int)why, KVG_ROUTED_SPILL, "  reason spill");
    c[0].load = 2000;
    c[0].cached_tokens = 960;      /* 60 blocks of 16: the request adds 40 tokens there */
    cap = kvg_route_cap(c, 3, r, 1.25);
    is_int(kvg_route_pick(KVG_ROUTE_PREFIX, c, 3, 9, r, 1.25, NULL, &why), 0,
           "holding 960 of its 1000 tokens: 2000 + 40 is under the cap %.0f, it stays", cap);
    is_int((int)why, KVG_ROUTED_PREFIX, "  reason prefix");
    c[0].load = 2300;
    cap = kvg_route_cap(c, 3, r, 1.25);
    ok((double)c[0].load + 40 > cap, "  at load 2300 even 40 more is over the cap %.0f", cap);
    is_int((int)(kvg_route_pick(KVG_ROUTE_PREFIX, c, 3, 9, r, 1.25, NULL, &why) != 0), 1, "  then it spills");
    is_int((int)why, KVG_ROUTED_SPILL, "  reason spill");
    /* All held: the cost is at least 1 token (the last prompt token is computed). */
    kvg_route_cand one[2] = { cand(1, 63, 10), cand(2, 0, 0) };
    one[0].cached_tokens = 2000;
    cap = kvg_route_cap(one, 2, r, 1.0);
    ok(cap >= 11, "cap %.0f", cap);
    is_int(kvg_route_pick(KVG_ROUTE_PREFIX, one, 2, 5, r, 1.0, NULL, &why), 0,
           "cached_tokens past the request: cost 1, the holder is under the cap");
    /* hash: the same cost decides whether its rendezvous choice is under the cap. */
    kvg_route_cand h[2] = { cand(11, 0, 0), cand(12, 0, 0) };
    int top = kvg_route_score(3, 11) > kvg_route_score(3, 12) ? 0 : 1;
    h[top].load = 1200;
    h[!top].load = 0;
    is_int(kvg_route_pick(KVG_ROUTE_HASH, h, 2, 3, r, 1.25, NULL, &why), !top,
           "hash: the top engine at 1200 + 1000 is over the cap: spill");
    h[top].cached_tokens = 900;
    is_int(kvg_route_pick(KVG_ROUTE_HASH, h, 2, 3, r, 1.25, NULL, &why), top,
           "hash: holding 900 tokens it adds 100: it keeps the key");
}

int main(void)
{
    test_names();
    test_prefix_basic();
    test_bounded_load();
    test_cost_aware_bound();
    test_ties_and_spread();
    test_eligible();
    test_hash();
    test_least_load();
    test_round_robin();
    return done_testing();
}
