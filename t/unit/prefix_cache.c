/* The prefix cache's bookkeeping, without a model: exact reference counts while
 * shared, exact eviction order (partial blocks first, then LRU with chains released
 * tail first), TTL expiry (sweep and lazy, hits refresh), tenant and model isolation,
 * quota-driven eviction, pinning under pressure and its cap, and thousands of random
 * admissions / decodes / forks / cancellations with every invariant checked after
 * each operation. Blocks of 4 tokens; "prefill" just marks the reserved positions
 * written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kv_cache.h"
#include "kv_cache_testing.h"
#include "prefix_cache.h"
#include "prefix_cache_testing.h"
#include "prefix_hash.h"
#include "cache_index.h"

#define BT 4
#define MAXT 96

static kvg_prefix_hasher *hasher;
static char err[256];

typedef struct req {
    kvg_kv_seq seq;
    int tenant;
    int32_t toks[MAXT];
    int n;                       /* tokens known (prompt, then generated) */
    uint8_t h[MAXT / BT][KVG_PREFIX_HASH_LEN];
    int n_h;
    int64_t ttl;
} req;

static kvg_kv_pool *pool_new(int n_blocks)
{
    kvg_kv_geom g = { .n_layers = 1, .n_kv_heads = 1, .head_dim = 1, .block_tokens = BT };
    return kvg_kv_pool_new(&g, n_blocks, err, sizeof err);
}

static kvg_prefix_cache *pc_new(kvg_kv_pool *p, double pin, double quota)
{
    kvg_pc_config c;
    memset(&c, 0, sizeof c);
    memcpy(c.model_id, "model-A-0123456789abcdef01234567", KVG_PREFIX_HASH_LEN);
    c.pinned_share = pin;
    c.default_quota = quota;
    return kvg_pc_new(p, &c, err, sizeof err);
}

static void chain(kvg_prefix_cache *pc, req *r)
{
    uint8_t root[KVG_PREFIX_HASH_LEN];
    size_t nb;
    if (kvg_pc_tenant_root(pc, hasher, r->tenant, root, err, sizeof err) != 0 ||
        kvg_prefix_chain(hasher, root, r->toks, (size_t)r->n, BT, r->h, MAXT / BT, &nb,
                         err, sizeof err) != 0)
        diag("chain: %s", err);
    r->n_h = (int)nb;
}

static void req_init(kvg_prefix_cache *pc, req *r, int tenant, const int32_t *toks, int n,
                     int64_t ttl)
{
    memset(r, 0, sizeof *r);
    r->tenant = tenant;
    memcpy(r->toks, toks, (size_t)n * sizeof *toks);
    r->n = n;
    r->ttl = ttl;
    chain(pc, r);
}

/* Admits r, marks the prompt written and publishes its full blocks. Returns the
 * cached token count or -1. */
static int32_t run_prompt(kvg_prefix_cache *pc, req *r, int64_t now)
{
    int32_t got = kvg_pc_admit(pc, &r->seq, r->tenant, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])r->h,
                               r->n_h, r->n, r->ttl, now, 0, err, sizeof err);
    if (got < 0)
        return -1;
    r->seq.n_tokens = r->n;
    for (int i = 0; i < r->n_h; i++)
        kvg_pc_commit(pc, &r->seq, i, r->h[i], r->tenant, r->ttl, now);
    return got;
}

static int32_t hits_of(kvg_prefix_cache *pc, req *r)
{
    int32_t total = (r->n + BT - 1) / BT;
    return total - kvg_pc_blocks_needed(pc, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])r->h, r->n_h, r->n);
}

static void seq_toks(int32_t *t, int n, int base)
{
    for (int i = 0; i < n; i++)
        t[i] = base + i;
}

static int check(kvg_prefix_cache *pc, const kvg_kv_seq *const *s, size_t n, const char *what)
{
    if (kvg_pc_check(pc, s, n, err, sizeof err) != 0) {
        ok(0, "invariants after %s: %s", what, err);
        return -1;
    }
    return 0;
}

static void test_refcounts(void)
{
    kvg_kv_pool *p = pool_new(16);
    kvg_prefix_cache *pc = pc_new(p, 0, 0);
    int t = kvg_pc_tenant(pc, "t", 1, 0);
    int32_t toks[32];
    req a, b, c, d;
    kvg_pc_stats st;
    seq_toks(toks, 32, 100);
    req_init(pc, &a, t, toks, 13, 0);   /* 3 full blocks + 1 token */
    req_init(pc, &b, t, toks, 16, 0);   /* 4 full blocks */
    req_init(pc, &c, t, toks, 12, 0);   /* exactly 3 blocks */
    is_int(run_prompt(pc, &a, 0), 0, "first request: a miss");
    is_int(run_prompt(pc, &b, 0), 12, "second: 3 blocks hit");
    for (int i = 0; i < 3; i++)
        is_int(kvg_kv_block_refcount(p, a.seq.blocks[i]), 2, "  block %d shared, refcount 2", i);
    ok(b.seq.blocks[3] != a.seq.blocks[3], "  the 4th block is b's own");
    is_int(run_prompt(pc, &c, 0), 8, "whole prompt cached: its last block is recomputed");
    is_int(kvg_kv_block_refcount(p, a.seq.blocks[0]), 3, "  refcount 3");
    is_int(kvg_kv_block_refcount(p, a.seq.blocks[2]), 2, "  block 2 not taken: refcount 2");
    ok(c.seq.blocks[2] != a.seq.blocks[2], "  the recomputed copy is private");
    {
        const kvg_kv_seq *s[] = { &a.seq, &b.seq, &c.seq };
        ok(check(pc, s, 3, "sharing") == 0, "invariants hold while shared");
        kvg_pc_release(pc, &c.seq, 1);
        is_int(kvg_kv_block_refcount(p, a.seq.blocks[0]), 2, "c released: refcount 2");
        ok(check(pc, s, 2, "release") == 0, "invariants hold");
    }
    /* fork: every block shared, the partial one copied on first write */
    req_init(pc, &d, t, toks, 1, 0);
    {
        kvg_kv_seq f;
        int32_t last = a.seq.blocks[3];
        kvg_kv_seq_init(&f);
        ok(kvg_pc_fork(pc, &a.seq, &f, err, sizeof err) == 0, "fork");
        is_int(kvg_kv_block_refcount(p, last), 2, "  the partial block is shared by the fork");
        ok(kvg_pc_prepare(pc, &f, 1, 1, err, sizeof err) == 0, "  fork appends");
        ok(f.blocks[3] != last, "  and gets its own copy of the partial block");
        is_int(kvg_kv_block_refcount(p, last), 1, "  the original is a's alone again");
        is_int(kvg_kv_block_refcount(p, a.seq.blocks[0]), 3, "  full blocks: refcount 3");
        kvg_pc_release(pc, &f, 2);
    }
    kvg_pc_get_stats(pc, &st);
    is_int(st.query_tokens, 13 + 16 + 12, "query tokens counted once per request");
    is_int(st.hit_tokens, 12 + 8, "hit tokens");
    kvg_pc_release(pc, &a.seq, 3);
    kvg_pc_release(pc, &b.seq, 3);
    kvg_pc_get_stats(pc, &st);
    is_int(st.blocks_used, 0, "all released: none in use");
    is_int(st.blocks_cached, 4, "4 hashed blocks cached");
    is_int(st.blocks_free, 12, "the rest free");
    is_int(kvg_pc_tenant_cached_blocks(pc, t), 4, "charged to the tenant");
    /* recompute (preemption) counts apart */
    req_init(pc, &c, t, toks, 12, 0);
    is_int(kvg_pc_admit(pc, &c.seq, t, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])c.h, c.n_h, c.n, 0,
                        4, 1, err, sizeof err), 8, "recompute admission hits");
    kvg_pc_get_stats(pc, &st);
    is_int(st.query_tokens, 41, "  not a query");
    is_int(st.recompute_tokens, 12, "  counted as a recompute");
    is_int(st.recompute_hit_tokens, 8, "  with its hit tokens");
    kvg_pc_release(pc, &c.seq, 5);
    ok(check(pc, NULL, 0, "end") == 0, "invariants at the end");
    kvg_pc_free(pc);
    is_int(kvg_kv_pool_free_blocks(p), 16, "freeing the cache returns its blocks to the pool");
    kvg_kv_pool_free(p);
}

static void test_eviction_order(void)
{
    kvg_kv_pool *p = pool_new(6);
    kvg_prefix_cache *pc = pc_new(p, 0, 0);
    int t = kvg_pc_tenant(pc, "", 0, 0);
    int32_t ta[16], tb[16];
    req a, b;
    kvg_kv_seq x;
    kvg_pc_stats st;
    seq_toks(ta, 16, 10);
    seq_toks(tb, 16, 500);
    req_init(pc, &a, t, ta, 9, 0);
    req_init(pc, &b, t, tb, 9, 0);
    run_prompt(pc, &a, 1);
    run_prompt(pc, &b, 1);
    kvg_pc_release(pc, &a.seq, 2);
    kvg_pc_release(pc, &b.seq, 3);
    kvg_pc_get_stats(pc, &st);
    is_int(st.blocks_free, 2, "the two partial blocks are free");
    is_int(st.blocks_cached, 4, "4 cached");
    kvg_kv_seq_init(&x);
    ok(kvg_pc_prepare(pc, &x, 2 * BT, 4, err, sizeof err) == 0, "2 blocks");
    x.n_tokens = 2 * BT;
    kvg_pc_get_stats(pc, &st);
    is_int(st.evictions[KVG_EVICT_LRU], 0, "partial blocks reused first: nothing evicted");
    is_int(hits_of(pc, &a), 2, "  a fully cached");
    int want_a[] = { 1, 0, 0, 0 }, want_b[] = { 2, 2, 1, 0 };
    for (int k = 0; k < 4; k++) {
        char what[64];
        ok(kvg_pc_prepare(pc, &x, BT, 4, err, sizeof err) == 0, "one more block (%d)", k + 3);
        x.n_tokens += BT;
        is_int(hits_of(pc, &a), want_a[k], "  a keeps %d blocks (tail evicted first)", want_a[k]);
        is_int(hits_of(pc, &b), want_b[k], "  b keeps %d blocks", want_b[k]);
        snprintf(what, sizeof what, "eviction %d", k);
        {
            const kvg_kv_seq *s[] = { &x };
            check(pc, s, 1, what);
        }
    }
    kvg_pc_get_stats(pc, &st);
    is_int(st.evictions[KVG_EVICT_LRU], 4, "4 LRU evictions");
    ok(kvg_pc_prepare(pc, &x, BT, 4, err, sizeof err) != 0, "pool exhausted: an error");
    kvg_pc_release(pc, &x, 5);
    kvg_pc_free(pc);
    kvg_kv_pool_free(p);
}

static void test_ttl(void)
{
    kvg_kv_pool *p = pool_new(16);
    kvg_prefix_cache *pc = pc_new(p, 0, 0);
    int t = kvg_pc_tenant(pc, "x", 1, 0);
    int32_t ta[16], tb[16];
    req a, b, c;
    kvg_pc_stats st;
    seq_toks(ta, 16, 7);
    seq_toks(tb, 16, 70);
    req_init(pc, &a, t, ta, 9, 100);
    run_prompt(pc, &a, 1000);
    kvg_pc_release(pc, &a.seq, 1000);
    is_int(kvg_pc_sweep(pc, 1050), 0, "sweep before the TTL: nothing");
    req_init(pc, &a, t, ta, 9, 100);
    is_int(run_prompt(pc, &a, 1080), 8, "a hit at 80 ms");
    kvg_pc_release(pc, &a.seq, 1080);
    is_int(kvg_pc_sweep(pc, 1150), 0, "the hit refreshed the TTL: still cached at 150 ms");
    is_int(kvg_pc_sweep(pc, 1181), 2, "expired at 181 ms: 2 blocks");
    kvg_pc_get_stats(pc, &st);
    is_int(st.evictions[KVG_EVICT_TTL], 2, "counted as TTL evictions");
    is_int(st.blocks_cached, 0, "nothing cached");
    is_int(hits_of(pc, &a), 0, "the chain is gone");
    /* lazy: an admission after the TTL expires it */
    req_init(pc, &b, t, tb, 9, 50);
    run_prompt(pc, &b, 2000);
    kvg_pc_release(pc, &b.seq, 2000);
    is_int(hits_of(pc, &b), 2, "b cached");
    req_init(pc, &c, t, ta, 5, 0);
    run_prompt(pc, &c, 2051);
    is_int(hits_of(pc, &b), 0, "an admission after b's TTL expired it lazily");
    kvg_pc_get_stats(pc, &st);
    is_int(st.evictions[KVG_EVICT_TTL], 4, "2 more TTL evictions");
    /* default TTL is 5 minutes */
    kvg_pc_release(pc, &c.seq, 2051);
    is_int(kvg_pc_sweep(pc, 2051 + 299999), 0, "default TTL: alive just before 5 min");
    is_int(kvg_pc_sweep(pc, 2051 + 300000), 1, "expired at 5 min");
    ok(check(pc, NULL, 0, "ttl") == 0, "invariants");
    kvg_pc_free(pc);
    kvg_kv_pool_free(p);
}

static void test_tenants_and_model(void)
{
    kvg_kv_pool *p = pool_new(16);
    kvg_prefix_cache *pc = pc_new(p, 0, 0);
    int t1 = kvg_pc_tenant(pc, "alice", 5, 0), t2 = kvg_pc_tenant(pc, "bob", 3, 0);
    int32_t tk[16];
    req a, b, c;
    uint8_t m2[KVG_PREFIX_HASH_LEN];
    ok(t1 >= 0 && t2 >= 0 && t1 != t2, "two tenants");
    is_int(kvg_pc_tenant(pc, "alice", 5, 0), t1, "same salt, same tenant");
    seq_toks(tk, 16, 3);
    req_init(pc, &a, t1, tk, 13, 0);
    run_prompt(pc, &a, 1);
    kvg_pc_release(pc, &a.seq, 1);
    req_init(pc, &b, t2, tk, 13, 0);
    ok(memcmp(a.h[0], b.h[0], KVG_PREFIX_HASH_LEN) != 0, "another salt, other hashes");
    is_int(run_prompt(pc, &b, 2), 0, "the other tenant misses");
    kvg_pc_release(pc, &b.seq, 2);
    /* alice's hashes presented for bob: refused */
    memset(&c, 0, sizeof c);
    is_int(kvg_pc_admit(pc, &c.seq, t2, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])a.h, a.n_h, 13, 0, 3,
                        0, err, sizeof err), 0, "a block is never handed to another tenant");
    kvg_pc_release(pc, &c.seq, 3);
    is_int(kvg_pc_tenant_cached_blocks(pc, t1), 3, "alice: 3 blocks");
    is_int(kvg_pc_tenant_cached_blocks(pc, t2), 3, "bob: 3 blocks");
    /* model change */
    memcpy(m2, "model-B-0123456789abcdef01234567", KVG_PREFIX_HASH_LEN);
    kvg_pc_set_model(pc, m2);
    req_init(pc, &c, t1, tk, 13, 0);
    ok(memcmp(a.h[0], c.h[0], KVG_PREFIX_HASH_LEN) != 0, "another model id, other hashes");
    is_int(hits_of(pc, &a), 0, "the old model's blocks are gone");
    is_int(kvg_pc_tenant_cached_blocks(pc, t1), 0, "nothing charged");
    ok(check(pc, NULL, 0, "model") == 0, "invariants");
    kvg_pc_free(pc);
    kvg_kv_pool_free(p);
}

static void test_quota(void)
{
    kvg_kv_pool *p = pool_new(12);
    kvg_prefix_cache *pc = pc_new(p, 0, 0);
    int q = kvg_pc_tenant(pc, "quiet", 5, 0), n = kvg_pc_tenant(pc, "noisy", 5, 0.25);
    int32_t tq[16], tn[3][16];
    req a, r[3];
    kvg_kv_seq x;
    kvg_pc_stats st;
    seq_toks(tq, 16, 1);
    req_init(pc, &a, q, tq, 9, 0);
    run_prompt(pc, &a, 1);
    kvg_pc_release(pc, &a.seq, 1);           /* quiet: 2 cached, the oldest */
    for (int i = 0; i < 3; i++) {
        seq_toks(tn[i], 16, 100 * (i + 1));
        req_init(pc, &r[i], n, tn[i], 9, 0);
        run_prompt(pc, &r[i], 2 + i);
        kvg_pc_release(pc, &r[i].seq, 2 + i);
    }
    kvg_pc_get_stats(pc, &st);
    is_int(st.blocks_cached, 8, "8 cached (noisy holds 6, its quota is 3)");
    kvg_kv_seq_init(&x);
    ok(kvg_pc_prepare(pc, &x, 7 * BT, 10, err, sizeof err) == 0, "7 blocks: 4 free + 3 evicted");
    x.n_tokens = 7 * BT;
    kvg_pc_get_stats(pc, &st);
    is_int(st.evictions[KVG_EVICT_QUOTA], 3, "3 quota evictions");
    is_int(st.evictions[KVG_EVICT_LRU], 0, "no plain LRU eviction");
    is_int(hits_of(pc, &a), 2, "the quiet tenant's older entry survives");
    is_int(kvg_pc_tenant_cached_blocks(pc, n), 3, "noisy is back at its quota");
    is_int(hits_of(pc, &r[0]), 0, "noisy's oldest chain went first");
    is_int(hits_of(pc, &r[1]), 1, "then the tail of its next one");
    ok(kvg_pc_prepare(pc, &x, 2 * BT, 11, err, sizeof err) == 0, "2 more");
    kvg_pc_get_stats(pc, &st);
    is_int(st.evictions[KVG_EVICT_LRU], 2, "within quota: plain LRU (the quiet tenant's oldest)");
    is_int(hits_of(pc, &a), 0, "  which was the quiet tenant's");
    {
        const kvg_kv_seq *s[] = { &x };
        ok(check(pc, s, 1, "quota") == 0, "invariants");
    }
    kvg_pc_release(pc, &x, 12);
    kvg_pc_free(pc);
    kvg_kv_pool_free(p);
}

static void test_pinned(void)
{
    kvg_kv_pool *p = pool_new(8);
    kvg_prefix_cache *pc = pc_new(p, 0.25, 0);   /* cap: 2 blocks */
    int t = kvg_pc_tenant(pc, "", 0, 0);
    int32_t tk[16];
    req a;
    kvg_kv_seq x;
    kvg_pc_stats st;
    seq_toks(tk, 16, 40);
    req_init(pc, &a, t, tk, 13, KVG_PC_TTL_PINNED);
    run_prompt(pc, &a, 1);
    kvg_pc_release(pc, &a.seq, 1);
    kvg_pc_get_stats(pc, &st);
    is_int(st.blocks_pinned, 2, "3 blocks asked to pin, the cap allows 2");
    is_int(st.blocks_cached, 3, "3 cached");
    kvg_kv_seq_init(&x);
    ok(kvg_pc_prepare(pc, &x, 6 * BT, 2, err, sizeof err) == 0, "6 blocks under pressure");
    ok(kvg_pc_prepare(pc, &x, 7 * BT, 2, err, sizeof err) != 0, "a 7th cannot evict a pinned one");
    is_int(hits_of(pc, &a), 2, "the pinned prefix survives");
    is_int(kvg_pc_sweep(pc, INT64_MAX / 2), 0, "pinned blocks never expire");
    is_int(hits_of(pc, &a), 2, "still there");
    {
        const kvg_kv_seq *s[] = { &x };
        ok(check(pc, s, 1, "pinned") == 0, "invariants");
    }
    kvg_pc_release(pc, &x, 3);
    kvg_pc_free(pc);
    kvg_kv_pool_free(p);
}

/* cache_control holds (kvg_pc_hold): a held prefix survives the pressure that evicts an
 * unheld one, a later hold extends it, it ends after its time (and then expires, nobody
 * having used it), the pool's pinned share and the tenant's cap bound it. */
static void test_holds(void)
{
    kvg_kv_pool *p = pool_new(8);
    kvg_prefix_cache *pc;
    kvg_pc_config c;
    int32_t tk[16], tu[16];
    req a, u, b;
    kvg_kv_seq x;
    kvg_pc_stats st;
    int t, t2;

    memset(&c, 0, sizeof c);
    memcpy(c.model_id, "model-A-0123456789abcdef01234567", KVG_PREFIX_HASH_LEN);
    c.pinned_share = 0.5;        /* 4 blocks */
    c.tenant_pin_blocks = 3;
    c.default_ttl_ms = 1000;     /* shorter than the holds: a hold sets how long A lives */
    pc = kvg_pc_new(p, &c, err, sizeof err);
    t = kvg_pc_tenant(pc, "acme", 4, 0);
    t2 = kvg_pc_tenant(pc, "other", 5, 0);
    seq_toks(tk, 16, 40);
    seq_toks(tu, 16, 400);
    req_init(pc, &a, t, tk, 13, 0);      /* 3 full blocks + 1 */
    req_init(pc, &u, t, tu, 13, 0);
    run_prompt(pc, &a, 1000);
    is_int(kvg_pc_hold(pc, &a.seq, 0, 2, 5000, 1000), 2, "the first 2 blocks of A held for 5 s");
    kvg_pc_release(pc, &a.seq, 1000);
    run_prompt(pc, &u, 1001);
    kvg_pc_release(pc, &u.seq, 1001);
    kvg_pc_get_stats(pc, &st);
    is_int(st.blocks_pinned, 2, "2 blocks pinned by the hold");
    kvg_kv_seq_init(&x);
    ok(kvg_pc_prepare(pc, &x, 6 * BT, 2000, err, sizeof err) == 0, "6 blocks under pressure (evicts the rest)");
    is_int(hits_of(pc, &a), 2, "A's held prefix survives");
    is_int(hits_of(pc, &u), 0, "U (no hold) was evicted");
    ok(kvg_pc_prepare(pc, &x, 7 * BT, 2000, err, sizeof err) != 0, "  a 7th block cannot take a held one");
    {
        const kvg_kv_seq *s[] = { &x };
        ok(check(pc, s, 1, "holds") == 0, "invariants under holds");
    }
    kvg_pc_release(pc, &x, 2000);

    /* a hit at 4 s holds again for 5 s: until 9 s */
    req_init(pc, &b, t, tk, 13, 0);
    is_int(run_prompt(pc, &b, 4000), 2 * BT, "A again at 4 s: its 2 held blocks hit");
    is_int(kvg_pc_hold(pc, &b.seq, 0, 2, 5000, 4000), 2, "  held again for 5 s");
    kvg_pc_release(pc, &b.seq, 4000);
    kvg_pc_sweep(pc, 6500);
    kvg_kv_seq_init(&x);
    ok(kvg_pc_prepare(pc, &x, 6 * BT, 6500, err, sizeof err) == 0, "pressure at 6.5 s");
    kvg_pc_release(pc, &x, 6500);
    is_int(hits_of(pc, &a), 2, "  past the first hold's end the refreshed hold keeps A");
    kvg_pc_sweep(pc, 9500);
    kvg_pc_get_stats(pc, &st);
    is_int(st.blocks_pinned, 0, "at 9.5 s the hold has ended");
    is_int(hits_of(pc, &a), 0, "  and A's blocks expired with it (unused since 4 s)");

    /* caps: the tenant's 3, then the pool's 4 */
    req_init(pc, &a, t, tk, 16, 0);
    run_prompt(pc, &a, 10000);
    is_int(kvg_pc_hold(pc, &a.seq, 0, 4, 60000, 10000), 3, "4 blocks asked, the tenant's cap holds 3");
    req_init(pc, &u, t2, tu, 13, 0);
    run_prompt(pc, &u, 10000);
    is_int(kvg_pc_hold(pc, &u.seq, 0, 3, 60000, 10000), 1, "another tenant: the pool's cap (4) leaves 1");
    kvg_pc_get_stats(pc, &st);
    is_int(st.blocks_pinned, 4, "4 pinned in all");
    {
        const kvg_kv_seq *s[] = { &a.seq, &u.seq };
        ok(check(pc, s, 2, "caps") == 0, "invariants at the caps");
    }
    kvg_pc_release(pc, &a.seq, 10000);
    kvg_pc_release(pc, &u.seq, 10000);
    kvg_pc_tenant_put(pc, t);
    kvg_pc_tenant_put(pc, t2);
    kvg_pc_free(pc);
    kvg_kv_pool_free(p);
}

static uint64_t rs = 99;
static uint32_t rnd(uint32_t n)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rs >> 33) % n;
}

/* The cache index against the cache: every hash in `seen` is in the set exactly when the
 * cache can find it. */
static int held_agrees(const kvg_prefix_cache *pc, const kvg_cache_index_reader *hr,
                       uint8_t (*seen)[KVG_PREFIX_HASH_LEN], int n_seen, const char *when)
{
    for (int i = 0; i < n_seen; i++)
        if (kvg_cache_index_contains(hr, seen[i]) != kvg_pc_holds(pc, seen[i])) {
            diag("%s: hash %d is %s the cache index but %s the cache", when, i,
                 kvg_cache_index_contains(hr, seen[i]) ? "in" : "not in", kvg_pc_holds(pc, seen[i]) ? "in" : "not in");
            return 0;
        }
    return 1;
}

/* with_held: the same workload with the engine's cache index attached (a capacity of 128
 * slots for 40 blocks, so tombstones force many rebuilds); kvg_pc_check then also
 * checks it, and a reader of the page is compared with the cache after every
 * operation on every hash the workload ever committed. */
static void test_random(int with_held)
{
    enum { NR = 12, OPS = 6000, SEEN = 2048 };
    kvg_kv_pool *p = pool_new(40);
    kvg_prefix_cache *pc = pc_new(p, 0.1, 0);
    uint32_t hcap = kvg_cache_index_capacity_for(40);
    size_t hbytes = kvg_cache_index_page_bytes(hcap);
    void *hpage = with_held ? aligned_alloc(4096, hbytes) : NULL;
    kvg_cache_index_writer *hw = with_held ? kvg_cache_index_writer_new(hpage, hbytes, hcap, err, sizeof err) : NULL;
    kvg_cache_index_reader hr;
    uint8_t (*seen)[KVG_PREFIX_HASH_LEN] = calloc(SEEN, KVG_PREFIX_HASH_LEN);
    int n_seen = 0, held_bad = 0, max_cached = 0;
    if (with_held) {
        ok(hw && kvg_cache_index_attach(&hr, hpage, hbytes, err, sizeof err) == 0, "cache index attached");
        ok(kvg_pc_set_index(pc, hw) == 0, "the cache keeps the cache index");
    }
    int tn[3];
    req *rq = calloc(NR, sizeof *rq);
    int live[NR] = { 0 };
    int64_t now = 0;
    int fails = 0, admitted = 0, hits = 0;
    kvg_pc_stats st;
    tn[0] = kvg_pc_tenant(pc, "a", 1, 0);
    tn[1] = kvg_pc_tenant(pc, "b", 1, 0.3);
    tn[2] = kvg_pc_tenant(pc, "c", 1, 0);
    for (int op = 0; op < OPS && !fails; op++) {
        int i = (int)rnd(NR), k = (int)rnd(10);
        req *r = &rq[i];
        now += rnd(50);
        if (!live[i]) {
            int32_t toks[MAXT];
            int pre = (int)rnd(4), n = 1 + (int)rnd(40);
            int64_t ttls[] = { 0, 200, 5000, KVG_PC_TTL_PINNED };
            for (int j = 0; j < n; j++)   /* shared prefixes: 4 families */
                toks[j] = j < 20 ? pre * 1000 + j : (int32_t)rnd(50);
            req_init(pc, r, tn[rnd(3)], toks, n, ttls[rnd(4)]);
            int32_t got = run_prompt(pc, r, now);
            for (int b = 0; got >= 0 && b < r->n_h && n_seen < SEEN; b++)
                memcpy(seen[n_seen++], r->h[b], KVG_PREFIX_HASH_LEN);
            if (got >= 0) {
                live[i] = 1;
                admitted++;
                hits += got > 0;
            }
        } else if (k < 5 && r->n < MAXT - 1) {
            /* decode one token; publish the block it fills */
            if (kvg_pc_prepare(pc, &r->seq, 1, now, err, sizeof err) == 0) {
                r->toks[r->n++] = (int32_t)rnd(50);
                r->seq.n_tokens++;
                if (r->n % BT == 0) {
                    int b = r->n / BT - 1;
                    kvg_prefix_next(hasher, r->h[b - 1 >= 0 ? b - 1 : 0], r->toks + b * BT, BT,
                                    r->h[b], err, sizeof err);
                    if (b == 0)
                        chain(pc, r);
                    r->n_h = b + 1;
                    kvg_pc_commit(pc, &r->seq, b, r->h[b], r->tenant, r->ttl, now);
                    if (n_seen < SEEN)
                        memcpy(seen[n_seen++], r->h[b], KVG_PREFIX_HASH_LEN);
                }
            }
        } else if (k < 6) {
            int j = (int)rnd(NR);
            if (!live[j]) {    /* n > 1: fork */
                rq[j] = *r;
                kvg_kv_seq_init(&rq[j].seq);
                if (kvg_pc_fork(pc, &r->seq, &rq[j].seq, err, sizeof err) == 0)
                    live[j] = 1;
            }
        } else if (k < 9) {
            kvg_pc_release(pc, &r->seq, now);
            live[i] = 0;
        } else {
            kvg_pc_sweep(pc, now);
        }
        {
            const kvg_kv_seq *s[NR];
            size_t ns = 0;
            for (int j = 0; j < NR; j++)
                if (live[j])
                    s[ns++] = &rq[j].seq;
            if (kvg_pc_check(pc, s, ns, err, sizeof err) != 0) {
                ok(0, "random op %d: %s", op, err);
                fails++;
            }
        }
        if (with_held) {
            char when[32];
            snprintf(when, sizeof when, "random op %d", op);
            if (!held_agrees(pc, &hr, seen, n_seen, when) && held_bad++ == 0)
                fails++;
            if ((int)kvg_cache_index_count(hw) > max_cached)
                max_cached = (int)kvg_cache_index_count(hw);
        }
    }
    ok(!fails, "%d random operations: invariants after every one", OPS);
    if (with_held) {
        ok(!held_bad, "the cache index's reader agrees with the cache on %d hashes after every operation", n_seen);
        ok(max_cached > 20 && kvg_cache_index_generation(hw) >= 1,
           "the set held up to %d keys and was rebuilt %llu times", max_cached,
           (unsigned long long)kvg_cache_index_generation(hw));
    }
    ok(admitted > 500 && hits > 50, "the workload admitted (%d) and hit (%d)", admitted, hits);
    for (int j = 0; j < NR; j++)
        if (live[j])
            kvg_pc_release(pc, &rq[j].seq, now);
    kvg_pc_get_stats(pc, &st);
    is_int(st.blocks_used, 0, "everything released: no block leaked");
    is_int(st.blocks_free + st.blocks_cached, 40, "free + cached == total");
    ok(st.evictions[KVG_EVICT_LRU] + st.evictions[KVG_EVICT_QUOTA] + st.evictions[KVG_EVICT_TTL] > 0,
       "evictions happened");
    ok(check(pc, NULL, 0, "random end") == 0, "invariants at the end");
    if (with_held) {
        uint8_t other[KVG_PREFIX_HASH_LEN];
        memset(other, 0x5a, sizeof other);
        ok(held_agrees(pc, &hr, seen, n_seen, "after release"), "released: cached blocks still held, none else");
        kvg_pc_set_model(pc, (const uint8_t *)other);
        is_int((int)kvg_cache_index_count(hw), 0, "a model change empties the cache index");
        ok(held_agrees(pc, &hr, seen, n_seen, "after the model change"), "no hash is found after it");
        kvg_pc_set_index(pc, NULL);
        kvg_cache_index_writer_free(hw);
        free(hpage);
    }
    free(seen);
    free(rq);
    kvg_pc_free(pc);
    kvg_kv_pool_free(p);
}

/* Tenants live while held or holding blocks: reclaimed at the last put when they hold
 * nothing, or when their last block is evicted / expired / dropped; ids are reused,
 * and nothing keeps a reclaimed id (a reused id starts empty, its old blocks gone). */
static void test_tenant_lifecycle(void)
{
    kvg_kv_pool *p = pool_new(8);
    kvg_prefix_cache *pc = pc_new(p, 0, 0);
    int32_t toks[MAXT];
    req a, b, c;
    int ta, tb, tc, t;

    ta = kvg_pc_tenant(pc, "alice", 5, 0);
    is_int(kvg_pc_tenant_count(pc), 1, "a tenant held: 1 live");
    is_int(kvg_pc_tenant_find(pc, "alice", 5), ta, "found by its salt");
    is_int(kvg_pc_tenant(pc, "alice", 5, 0), ta, "same salt, same id (a second reference)");
    kvg_pc_tenant_put(pc, ta);
    ok(kvg_pc_tenant_live(pc, ta), "one reference left: still live");
    kvg_pc_tenant_put(pc, ta);
    is_int(kvg_pc_tenant_count(pc), 0, "last reference dropped, no blocks: reclaimed");
    is_int(kvg_pc_tenant_find(pc, "alice", 5), -1, "  not found any more");
    ok(!kvg_pc_tenant_live(pc, ta) && kvg_pc_tenant_cached_blocks(pc, ta) == -1 &&
       kvg_pc_tenant_ref(pc, ta) == -1, "  its id is not live (no ref, no blocks count)");
    ok(check(pc, NULL, 0, "reclaim") == 0, "invariants after a reclaim");

    /* Blocks hold their tenant. */
    ta = kvg_pc_tenant(pc, "alice", 5, 0);
    seq_toks(toks, 13, 100);
    req_init(pc, &a, ta, toks, 13, 0);
    is_int(run_prompt(pc, &a, 1), 0, "alice's prompt: 3 blocks committed");
    kvg_pc_tenant_put(pc, ta);
    ok(kvg_pc_tenant_live(pc, ta), "no reference but blocks in use: live");
    kvg_pc_release(pc, &a.seq, 2);
    ok(kvg_pc_tenant_live(pc, ta) && kvg_pc_tenant_cached_blocks(pc, ta) == 3,
       "released, 3 blocks cached: live");
    ok(check(pc, NULL, 0, "cached") == 0, "invariants with a cached-only tenant");

    /* Pool pressure evicts alice's blocks: she is reclaimed with the last one. */
    tb = kvg_pc_tenant(pc, "bob", 3, 0);
    seq_toks(toks, 29, 500);
    req_init(pc, &b, tb, toks, 29, 0);     /* 8 blocks: the whole pool */
    is_int(run_prompt(pc, &b, 3), 0, "bob takes the whole pool");
    is_int(kvg_pc_tenant_find(pc, "alice", 5), -1, "alice's blocks evicted: alice reclaimed");
    is_int(kvg_pc_tenant_count(pc), 1, "only bob lives");
    {
        const kvg_kv_seq *sq[1] = { &b.seq };
        ok(check(pc, sq, 1, "eviction reclaim") == 0, "invariants after eviction reclaimed a tenant");
    }

    /* The id is reused, and starts empty: nothing of alice's is reachable through it. */
    tc = kvg_pc_tenant(pc, "carol", 5, 0);
    is_int(tc, ta, "carol gets alice's old id");
    is_int(kvg_pc_tenant_cached_blocks(pc, tc), 0, "  with nothing charged");
    kvg_pc_release(pc, &b.seq, 4);
    kvg_pc_tenant_put(pc, tb);
    seq_toks(toks, 13, 100);
    req_init(pc, &c, tc, toks, 13, 0);
    is_int(hits_of(pc, &c), 0, "carol's chain (alice's tokens) misses");
    kvg_pc_admit(pc, &c.seq, tc, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])a.h, a.n_h, a.n, 0, 5, 0,
                 err, sizeof err);
    is_int((int)c.seq.n_tokens, 0, "alice's old hashes under the reused id: no hit");
    kvg_pc_release(pc, &c.seq, 5);
    free(c.seq.blocks);
    memset(&c.seq, 0, sizeof c.seq);
    kvg_pc_tenant_put(pc, tc);
    is_int(kvg_pc_tenant_find(pc, "carol", 5), -1, "carol, holding nothing, reclaimed");

    /* A commit under a reclaimed id is ignored (it could only come from a stale id). */
    t = kvg_pc_tenant(pc, "dave", 4, 0);
    seq_toks(toks, 9, 900);
    req_init(pc, &c, t, toks, 9, 0);
    kvg_pc_tenant_put(pc, t);              /* dave reclaimed, c keeps the stale id */
    ok(kvg_pc_admit(pc, &c.seq, t, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])c.h, c.n_h, c.n, 0, 6, 0,
                    err, sizeof err) < 0, "admission under a reclaimed id with hashes: refused");
    ok(kvg_pc_admit(pc, &c.seq, -1, NULL, 0, c.n, 0, 6, 0, err, sizeof err) == 0,
       "a bypass admission needs no tenant (-1)");
    c.seq.n_tokens = c.n;
    kvg_pc_commit(pc, &c.seq, 0, c.h[0], t, 0, 6);
    is_int(kvg_pc_tenant_count(pc), 1, "a commit under a reclaimed id creates nothing");
    {
        const kvg_kv_seq *sq[1] = { &c.seq };
        ok(check(pc, sq, 1, "stale commit") == 0, "  and changes nothing");
    }
    kvg_pc_release(pc, &c.seq, 7);

    /* TTL expiry releases the tenant too. */
    kvg_pc_sweep(pc, 7 + 10 * 60 * 1000);
    is_int(kvg_pc_tenant_count(pc), 0, "the cached blocks expired: every tenant reclaimed");
    ok(check(pc, NULL, 0, "expiry") == 0, "invariants after expiry");

    /* A model change drops every cached block, and the tenants with them. */
    ta = kvg_pc_tenant(pc, "alice", 5, 0.5);
    seq_toks(toks, 13, 100);
    req_init(pc, &a, ta, toks, 13, 0);
    run_prompt(pc, &a, 8);
    kvg_pc_release(pc, &a.seq, 9);
    kvg_pc_tenant_put(pc, ta);
    ok(kvg_pc_tenant_live(pc, ta), "alice (with a quota) lives through her cached blocks");
    {
        uint8_t mid[KVG_PREFIX_HASH_LEN];
        memcpy(mid, "model-B-0123456789abcdef01234567", KVG_PREFIX_HASH_LEN);
        kvg_pc_set_model(pc, mid);
    }
    is_int(kvg_pc_tenant_count(pc), 0, "model change: cached blocks dropped, tenants reclaimed");
    t = kvg_pc_tenant(pc, "erin", 4, 0);
    ok(check(pc, NULL, 0, "quota slot reuse") == 0, "a slot reused without a quota: quota counts agree");
    kvg_pc_tenant_put(pc, t);

    /* Many tenants: the table grows with them and the slots come back. */
    {
        enum { N = 5000 };
        static int ids[N];
        char salt[32];
        int bad = 0, slots;
        for (int i = 0; i < 20000; i++) {
            int n = snprintf(salt, sizeof salt, "churn-%d", i);
            int x = kvg_pc_tenant(pc, salt, (size_t)n, 0);
            bad += x < 0;
            kvg_pc_tenant_put(pc, x);
        }
        ok(!bad && kvg_pc_tenant_count(pc) == 0, "20000 tenants one after another: none left");
        ok(kvg_pc_tenant_slots(pc) <= 64, "  and they reused one slot (%d slots)", kvg_pc_tenant_slots(pc));
        for (int i = 0; i < N; i++) {
            int n = snprintf(salt, sizeof salt, "held-%d", i);
            ids[i] = kvg_pc_tenant(pc, salt, (size_t)n, 0);
            bad += ids[i] < 0;
        }
        is_int(kvg_pc_tenant_count(pc), N, "5000 held at once: no fixed cap");
        for (int i = 0; i < N; i++) {
            int n = snprintf(salt, sizeof salt, "held-%d", i);
            bad += kvg_pc_tenant_find(pc, salt, (size_t)n) != ids[i];
        }
        ok(!bad, "  every one found by its salt");
        ok(check(pc, NULL, 0, "5000 tenants") == 0, "  invariants hold");
        slots = kvg_pc_tenant_slots(pc);
        for (int i = 0; i < N; i += 2)
            kvg_pc_tenant_put(pc, ids[i]);
        for (int i = 0; i < N; i += 2) {
            int n = snprintf(salt, sizeof salt, "again-%d", i);
            int x = kvg_pc_tenant(pc, salt, (size_t)n, 0);
            bad += x < 0 || x >= slots;
            ids[i] = x;
        }
        ok(!bad && kvg_pc_tenant_slots(pc) == slots, "freed slots are reused before the table grows");
        for (int i = 0; i < N; i++)
            kvg_pc_tenant_put(pc, ids[i]);
        is_int(kvg_pc_tenant_count(pc), 0, "all put: none live");
        ok(check(pc, NULL, 0, "all put") == 0, "  invariants hold");
    }
    free(a.seq.blocks);
    free(b.seq.blocks);
    free(c.seq.blocks);
    kvg_pc_free(pc);
    kvg_kv_pool_free(p);
}

int main(void)
{
    hasher = kvg_prefix_hasher_new(err, sizeof err);
    if (!hasher) {
        ok(0, "hasher: %s", err);
        return done_testing();
    }
    test_refcounts();
    test_eviction_order();
    test_ttl();
    test_tenants_and_model();
    test_quota();
    test_pinned();
    test_holds();
    test_random(0);
    test_random(1);
    test_tenant_lifecycle();
    kvg_prefix_hasher_free(hasher);
    return done_testing();
}
