/* The host-memory tier (engine/kv_host.h) and its use by the prefix cache, on a host pool
 * (whose transfers are memcpy; the CUDA backend's asynchronous ones are exercised by
 * t/engine-kv-host.t on the emulator):
 *   - a block put and loaded back is the same bytes; an unknown hash or another tenant's
 *     tag is a miss; putting a held hash again refreshes it, copies nothing;
 *   - when full, the least recently used slot goes to the spill hook (its payload, hash
 *     and tag), a load refreshing a slot's place; drain hands every slot over, oldest
 *     first; without a hook an evicted slot is just gone;
 *   - a tenant's slots are wiped; two hashes with the same first 8 bytes never mix;
 *   - a slot keeps its block's expiry (never loaded past it, nor moved on to disk); a
 *     tenant at its quota's share of the slots makes room from its own;
 *   - the prefix cache puts evicted blocks there, admission copies them back (byte
 *     identical, counted as host hits) for the right tenant only; with a disk tier behind
 *     it, a slot evicted from host memory goes on to the disk and is found there; through
 *     the disk's reader thread (kvg_pc_fetch_start) too, blocks the admission itself pushes
 *     from host memory on to disk included;
 *   - sizes that hold no slot are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"
#include "kv_cache.h"
#include "kv_disk.h"
#include "kv_host.h"
#include "prefix_cache.h"
#include "prefix_cache_testing.h"
#include "prefix_hash.h"

static char err[512];
#define NO_EXPIRY INT64_MAX

static const kvg_kv_geom GEOM = { .n_layers = 2, .n_kv_heads = 2, .head_dim = 8, .block_tokens = 4 };

static void fill(kvg_kv_pool *p, int32_t id, uint32_t seed)
{
    size_t n = kvg_kv_xfer_bytes(p) / sizeof(float);
    float *f = p->data + (size_t)id * (p->stride_bytes / sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = (float)((seed * 2654435761u + (uint32_t)i * 40503u) % 100003u) * 0.25f;
}

static int same(const kvg_kv_pool *p, int32_t a, const kvg_kv_pool *q, int32_t b)
{
    return memcmp(p->data + (size_t)a * (p->stride_bytes / sizeof(float)),
                  q->data + (size_t)b * (q->stride_bytes / sizeof(float)),
                  kvg_kv_xfer_bytes(p)) == 0;
}

static void hash_of(uint8_t h[32], uint32_t v)
{
    for (int i = 0; i < 32; i++)
        h[i] = (uint8_t)(v * 31u + (uint32_t)i * 7u + (v >> (i % 24)));
}

/* What the spill hook saw: the hashes' first bytes in order, and whether each payload
 * was the bytes of block seed `want[i]`. */
typedef struct spilled {
    int n;
    uint8_t first[16];
    uint8_t tag0[16];
    double quota[16];            /* the quota and time left handed on with each */
    int64_t ttl[16];
    const kvg_kv_pool *ref;      /* ref block i holds seed i's bytes */
    int32_t ref_block[16];
    int bytes_ok;
} spilled;

static void on_spill(void *ctx, const void *payload, const uint8_t *hash, const uint8_t *tag, double quota,
                     int64_t ttl_ms)
{
    spilled *s = ctx;
    if (s->n < 16) {
        s->quota[s->n] = quota;
        s->ttl[s->n] = ttl_ms;
        s->first[s->n] = hash[0];
        s->tag0[s->n] = tag[0];
        if (s->ref && s->ref_block[s->n] >= 0 &&
            memcmp(payload, s->ref->data + (size_t)s->ref_block[s->n] * (s->ref->stride_bytes / sizeof(float)),
                   kvg_kv_xfer_bytes(s->ref)) != 0)
            s->bytes_ok = 0;
    }
    s->n++;
}

static void test_store(void)
{
    kvg_kv_pool *p = kvg_kv_pool_new(&GEOM, 8, err, sizeof err);
    kvg_kv_pool *q = kvg_kv_pool_new(&GEOM, 8, err, sizeof err);
    size_t bb = kvg_kv_xfer_bytes(p);
    void *buf = malloc(3 * bb + 17);
    uint8_t h[6][32], tag_a[32], tag_b[32];
    kvg_kv_host_stats st;
    int rc;
    spilled sp;
    kvg_kv_host *k;

    memset(tag_a, 0xa, sizeof tag_a);
    memset(tag_b, 0xb, sizeof tag_b);
    for (int i = 0; i < 6; i++) {
        hash_of(h[i], (uint32_t)i + 1);
        fill(p, i, 100u + (uint32_t)i);
    }
    k = kvg_kv_host_new(buf, 3 * bb + 17, bb, err, sizeof err);
    if (!ok(k != NULL, "a tier of 3 slots (%s)", err))
        return;
    kvg_kv_host_get_stats(k, &st);
    ok(st.slots_total == 3 && st.slot_bytes == bb, "3 slots of %zu bytes", bb);
    memset(&sp, 0, sizeof sp);
    sp.ref = p;
    sp.bytes_ok = 1;
    for (int i = 0; i < 16; i++)
        sp.ref_block[i] = -1;
    kvg_kv_host_set_spill(k, on_spill, &sp);

    ok(kvg_kv_host_put(k, p, 0, h[0], tag_a, 0, NO_EXPIRY, 0) == 0 &&
       kvg_kv_host_put(k, p, 1, h[1], tag_a, 0, NO_EXPIRY, 0) == 0 &&
       kvg_kv_host_put(k, p, 2, h[2], tag_b, 0, NO_EXPIRY, 0) == 0, "three blocks in");
    ok(kvg_kv_host_holds(k, h[1]) && !kvg_kv_host_holds(k, h[3]), "held and not held");
    ok(kvg_kv_host_load(k, q, 5, h[1], tag_a, 0) == 0 && same(q, 5, p, 1), "block 1 back: the same bytes");
    ok(kvg_kv_host_load(k, q, 5, h[2], tag_a, 0) != 0, "tenant b's block under tenant a's tag: a miss");
    ok(kvg_kv_host_load(k, q, 5, h[4], tag_a, 0) != 0, "an unknown hash: a miss");
    fill(p, 0, 999);             /* the pool block changed; the same hash is not copied again */
    ok(kvg_kv_host_put(k, p, 0, h[0], tag_a, 0, NO_EXPIRY, 0) == 0 &&
       kvg_kv_host_load(k, q, 6, h[0], tag_a, 0) == 0 &&
       !same(q, 6, p, 0), "a held hash put again: refreshed, not copied");
    fill(p, 0, 100);
    /* LRU now (oldest first): 2, 1, 0; a fourth block evicts 2 to the hook */
    sp.ref_block[0] = 2;
    ok(kvg_kv_host_put(k, p, 3, h[3], tag_a, 0, NO_EXPIRY, 0) == 0 && sp.n == 1 && sp.first[0] == h[2][0] &&
       sp.tag0[0] == 0xb,
       "full: the least recently used (block 2, tenant b) to the spill hook");
    ok(sp.bytes_ok, "  with its bytes");
    ok(!kvg_kv_host_holds(k, h[2]), "  and gone from the tier");
    kvg_kv_host_get_stats(k, &st);
    ok(st.evictions == 1 && st.spilled == 1 && st.puts == 4 && st.hits == 2 && st.misses == 2 && st.slots_used == 3,
       "stats: 4 in, 2 hits, 2 misses, 1 evicted and spilled, 3 used");
    /* drain: oldest first: 1, 0, 3 */
    sp.ref_block[1] = 1;
    sp.ref_block[2] = 0;
    sp.ref_block[3] = 3;
    kvg_kv_host_drain(k, p);
    ok(sp.n == 4 && sp.first[1] == h[1][0] && sp.first[2] == h[0][0] && sp.first[3] == h[3][0] && sp.bytes_ok,
       "drain: every slot to the hook, least recently used first, with its bytes");
    kvg_kv_host_get_stats(k, &st);
    is_int(st.slots_used, 0, "  the tier is empty");

    /* wipe; no hook: evicted slots are gone */
    kvg_kv_host_set_spill(k, NULL, NULL);
    kvg_kv_host_put(k, p, 0, h[0], tag_a, 0, NO_EXPIRY, 0);
    kvg_kv_host_put(k, p, 1, h[1], tag_b, 0, NO_EXPIRY, 0);
    kvg_kv_host_put(k, p, 2, h[2], tag_a, 0, NO_EXPIRY, 0);
    is_int(kvg_kv_host_wipe(k, tag_a), 2, "wipe tenant a: 2 blocks");
    ok(!kvg_kv_host_holds(k, h[0]) && kvg_kv_host_holds(k, h[1]) && !kvg_kv_host_holds(k, h[2]),
       "  tenant b's block stays");
    kvg_kv_host_put(k, p, 3, h[3], tag_a, 0, NO_EXPIRY, 0);
    kvg_kv_host_put(k, p, 4, h[4], tag_a, 0, NO_EXPIRY, 0);
    ok(kvg_kv_host_put(k, p, 5, h[5], tag_a, 0, NO_EXPIRY, 0) == 0 && !kvg_kv_host_holds(k, h[1]) && sp.n == 4,
       "no hook: the evicted slot is gone, nothing spilled");
    {
        uint8_t twin[32];
        memcpy(twin, h[5], 32);
        twin[31] ^= 1;           /* the same first 8 bytes, another hash */
        ok(kvg_kv_host_put(k, p, 1, twin, tag_a, 0, NO_EXPIRY, 0) != 0 && kvg_kv_host_load(k, q, 7, twin, tag_a, 0) != 0,
           "a hash sharing another's first 8 bytes: not kept, never served the other's block");
    }
    /* expiry: a block keeps the expiry it had in the pool */
    kvg_kv_host_wipe(k, tag_a);
    kvg_kv_host_wipe(k, tag_b);
    kvg_kv_host_set_spill(k, on_spill, &sp);
    sp.n = 0;
    for (int i = 0; i < 16; i++)
        sp.ref_block[i] = -1;
    ok(kvg_kv_host_put(k, p, 0, h[0], tag_a, 0, 1000, 100) == 0, "a block expiring at 1000 ms in");
    ok(kvg_kv_host_load(k, q, 5, h[0], tag_a, 999) == 0, "  loaded at 999 ms");
    ok(kvg_kv_host_load(k, q, 5, h[0], tag_a, 1000) != 0 && !kvg_kv_host_holds(k, h[0]),
       "  at 1000 ms expired: a miss, and dropped");
    ok(kvg_kv_host_put(k, p, 1, h[1], tag_a, 0, 900, 1000) != 0, "a block already expired is not kept");
    kvg_kv_host_put(k, p, 2, h[2], tag_a, 0, 1500, 1000);
    kvg_kv_host_put(k, p, 3, h[3], tag_a, 0, NO_EXPIRY, 1000);
    kvg_kv_host_put(k, p, 4, h[4], tag_a, 0, NO_EXPIRY, 1000);
    ok(kvg_kv_host_put(k, p, 5, h[5], tag_a, 0, NO_EXPIRY, 2000) == 0 && sp.n == 0 && !kvg_kv_host_holds(k, h[2]),
       "an expired slot evicted is not moved on to disk (a TTL is how long the tenant wanted it)");
    kvg_kv_host_get_stats(k, &st);
    is_int(st.expired, 1, "  one expired at a load");

    /* quota: tenant a at a third of 3 slots holds 1; its own oldest makes room */
    kvg_kv_host_wipe(k, tag_a);
    sp.n = 0;
    kvg_kv_host_put(k, p, 0, h[0], tag_b, 0, NO_EXPIRY, 2000);
    kvg_kv_host_put(k, p, 1, h[1], tag_a, 0.34, NO_EXPIRY, 2000);
    ok(kvg_kv_host_put(k, p, 2, h[2], tag_a, 0.34, NO_EXPIRY, 2000) == 0 && !kvg_kv_host_holds(k, h[1]) &&
       kvg_kv_host_holds(k, h[2]) && kvg_kv_host_holds(k, h[0]) && sp.n == 1 && sp.first[0] == h[1][0],
       "a tenant at its quota: its own least recently used slot makes room (moved on), not another's");
    kvg_kv_host_get_stats(k, &st);
    ok(st.quota_evictions == 1 && st.slots_used == 2, "  counted as a quota eviction; a slot still free");
    ok(sp.quota[0] == 0.34 && sp.ttl[0] == NO_EXPIRY, "  handed on with its quota and no expiry");
    /* the time left, not the caller's clock, goes on to the next tier */
    kvg_kv_host_wipe(k, tag_a);
    kvg_kv_host_wipe(k, tag_b);
    kvg_kv_host_put(k, p, 0, h[0], tag_b, 0.5, 5000, 2000);
    kvg_kv_host_put(k, p, 3, h[3], tag_b, 0, NO_EXPIRY, 2000);
    kvg_kv_host_put(k, p, 4, h[4], tag_b, 0, NO_EXPIRY, 2000);
    rc = kvg_kv_host_put(k, p, 5, h[5], tag_b, 0, NO_EXPIRY, 2500);
    ok(rc == 0 && sp.n == 2 && sp.first[1] == h[0][0] && sp.ttl[1] == 2500 && sp.quota[1] == 0.5,
       "  a block expiring at 5000 ms moved on at 2500 ms: 2500 ms left (%lld), its quota", (long long)sp.ttl[1]);
    kvg_kv_host_free(k);
    ok(kvg_kv_host_new(buf, bb - 1, bb, err, sizeof err) == NULL && strstr(err, "--kv-host-memory"),
       "a size below one block refused (%s)", err);
    free(buf);
    kvg_kv_pool_free(p);
    kvg_kv_pool_free(q);
}

/* The prefix cache with a host tier (2 slots) and a disk tier behind it. */
static void test_prefix_cache(void)
{
    kvg_prefix_hasher *hs = kvg_prefix_hasher_new(err, sizeof err);
    kvg_kv_pool *p = kvg_kv_pool_new(&GEOM, 4, err, sizeof err);
    kvg_kv_pool *ref = kvg_kv_pool_new(&GEOM, 4, err, sizeof err);
    size_t bb = kvg_kv_xfer_bytes(p);
    void *buf = malloc(2 * bb);
    kvg_kv_host *k = kvg_kv_host_new(buf, 2 * bb, bb, err, sizeof err);
    kvg_pc_config cfg;
    char dir[] = "/tmp/kvg-kvhost-XXXXXX";
    kvg_kv_disk *d = NULL;
    kvg_kv_disk_ident id;
    kvg_kv_host_stats hst;
    kvg_pc_stats ps;
    int32_t toks[13], toksb[13];
    uint8_t ha[3][32], hb[3][32], hab[3][32], root[32];
    size_t nb;
    kvg_kv_seq s;

    memset(&cfg, 0, sizeof cfg);
    memset(cfg.model_id, 7, sizeof cfg.model_id);
    kvg_prefix_cache *pc = kvg_pc_new(p, &cfg, err, sizeof err);
    int ta = kvg_pc_tenant(pc, "A", 1, 0), tb = kvg_pc_tenant(pc, "B", 1, 0);
    if (!mkdtemp(dir))
        return;
    memset(&id, 0, sizeof id);
    memset(id.model_id, 7, sizeof id.model_id);
    id.n_layers = GEOM.n_layers;
    id.n_kv_heads = GEOM.n_kv_heads;
    id.head_dim = GEOM.head_dim;
    id.block_tokens = GEOM.block_tokens;
    id.dtype = KVG_KV_DTYPE_F32_HOST;
    id.payload_bytes = bb;
    d = kvg_kv_disk_open(dir, 64 * (bb + 8192), 0, &id, err, sizeof err);
    for (int i = 0; i < 13; i++) {
        toks[i] = i + 1;
        toksb[i] = 100 + i;
    }
    kvg_pc_salt_root(pc, hs, "A", 1, root, err, sizeof err);
    kvg_prefix_chain(hs, root, toks, 13, 4, ha, 3, &nb, err, sizeof err);
    kvg_pc_salt_root(pc, hs, "B", 1, root, err, sizeof err);
    kvg_prefix_chain(hs, root, toksb, 13, 4, hb, 3, &nb, err, sizeof err);
    kvg_prefix_chain(hs, root, toks, 13, 4, hab, 3, &nb, err, sizeof err);   /* A's text, B's salt */
    ok(d && kvg_pc_set_disk(pc, d, err, sizeof err) == 0 && kvg_pc_set_host(pc, k, err, sizeof err) == 0,
       "disk, then host tier attached (%s)", err);

    kvg_kv_seq_init(&s);
    is_int(kvg_pc_admit(pc, &s, ta, ha, 3, 13, 0, 1, 0, err, sizeof err), 0, "A's prompt: a miss");
    for (int i = 0; i < 3; i++) {
        fill(p, s.blocks[i], 500u + (uint32_t)i);
        fill(ref, i, 500u + (uint32_t)i);
    }
    s.n_tokens = 13;
    for (int i = 0; i < 3; i++)
        kvg_pc_commit(pc, &s, i, ha[i], ta, 0, 1);
    kvg_pc_release(pc, &s, 2);
    is_int(kvg_pc_admit(pc, &s, tb, hb, 3, 13, 0, 3, 0, err, sizeof err), 0,
           "B's prompt takes the whole pool (A's 3 blocks evicted)");
    kvg_pc_release(pc, &s, 4);
    kvg_kv_host_get_stats(k, &hst);
    ok(hst.puts == 3 && hst.spilled == 1 && hst.slots_used == 2,
       "  all 3 went to host memory, the first on to disk (2 slots)");
    is_int(kvg_pc_admit(pc, &s, tb, hab, 3, 13, 0, 5, 0, err, sizeof err), 0,
           "A's text under tenant B: a miss in every tier");
    kvg_pc_release(pc, &s, 6);
    is_int(kvg_pc_admit(pc, &s, ta, ha, 3, 13, 0, 7, 0, err, sizeof err), 12,
           "A's prompt again: 12 tokens hit");
    ok(same(p, s.blocks[0], ref, 0) && same(p, s.blocks[1], ref, 1) && same(p, s.blocks[2], ref, 2),
       "  the blocks hold the bytes that were computed");
    kvg_pc_get_stats(pc, &ps);
    ok(ps.host_hit_tokens + ps.disk_hit_tokens == 12 && ps.disk_hit_tokens >= 4 && ps.host_hit_tokens >= 4,
       "  from both tiers (host %llu, disk %llu tokens)", (unsigned long long)ps.host_hit_tokens,
       (unsigned long long)ps.disk_hit_tokens);
    {
        const kvg_kv_seq *ss[1] = { &s };
        ok(kvg_pc_check(pc, ss, 1, err, sizeof err) == 0, "  the cache's invariants hold (%s)", err);
    }
    kvg_pc_release(pc, &s, 8);
    {
        /* The same through the disk tier's reader, as the scheduler admits: A's block on
         * disk read ahead, those in host memory copied, except that A's admission evicts
         * C's fresh blocks from the pool into host memory, which pushes A's there on to
         * disk: those are loaded from the write queue (they were never cold). */
        kvg_pc_stats ps0;
        kvg_pc_fetch *f;
        const kvg_kv_seq *ss[1] = { &s };
        int32_t toksc[13];
        uint8_t hc[3][32];
        for (int i = 0; i < 13; i++)
            toksc[i] = 200 + i;
        kvg_prefix_chain(hs, root, toksc, 13, 4, hc, 3, &nb, err, sizeof err);
        is_int(kvg_pc_admit(pc, &s, tb, hc, 3, 13, 0, 9, 0, err, sizeof err), 0,
               "C's prompt (tenant B): a miss, A's blocks out of the pool");
        for (int i = 0; i < 3; i++)
            fill(p, s.blocks[i], 900u + (uint32_t)i);
        s.n_tokens = 13;
        for (int i = 0; i < 3; i++)
            kvg_pc_commit(pc, &s, i, hc[i], tb, 0, 9);
        kvg_pc_release(pc, &s, 9);
        kvg_kv_host_get_stats(k, &hst);
        ok(kvg_kv_host_holds(k, ha[0]) || kvg_kv_host_holds(k, ha[1]) || kvg_kv_host_holds(k, ha[2]),
           "  some of A in host memory");
        f = kvg_pc_fetch_start(pc, ta, ha, 3, 13);
        ok(f != NULL, "A's prompt through the reader thread: its reads started");
        for (int g = 0; g < 100 && kvg_pc_fetch_pending(pc, f); g++)
            kvg_pc_disk_wait(pc, 100);
        ok(!kvg_pc_fetch_pending(pc, f), "  and done");
        kvg_pc_get_stats(pc, &ps0);
        is_int(kvg_pc_admit_fetched(pc, &s, ta, ha, 3, 13, 0, 10, 0, f, err, sizeof err), 12, "  12 tokens hit");
        kvg_pc_fetch_free(pc, f);
        ok(same(p, s.blocks[0], ref, 0) && same(p, s.blocks[1], ref, 1) && same(p, s.blocks[2], ref, 2),
           "  the bytes that were computed");
        kvg_pc_get_stats(pc, &ps);
        ok(ps.disk_hit_tokens - ps0.disk_hit_tokens == 12, "  all from disk (%llu tokens): read ahead, or "
           "just pushed there from host memory", (unsigned long long)(ps.disk_hit_tokens - ps0.disk_hit_tokens));
        ok(kvg_pc_check(pc, ss, 1, err, sizeof err) == 0, "  the cache's invariants hold (%s)", err);
        kvg_pc_release(pc, &s, 10);
    }
    is_int(kvg_pc_host_stats(pc, &hst), 0, "host stats through the cache");
    {
        int64_t w = kvg_pc_wipe_tenant(pc, "A", 1);
        ok(w >= 5, "tenant A wiped in every tier (%lld blocks: the pool's 3, the host's, the disk's)",
           (long long)w);
    }
    kvg_kv_host_get_stats(k, &hst);
    ok(!kvg_kv_host_holds(k, ha[0]) && !kvg_kv_host_holds(k, ha[1]) && !kvg_kv_host_holds(k, ha[2]),
       "  none of A's left in host memory (%lld slots of B's)", (long long)hst.slots_used);
    is_int(kvg_pc_admit(pc, &s, ta, ha, 3, 13, 0, 9, 0, err, sizeof err), 0, "  A's prompt: a miss");
    kvg_pc_release(pc, &s, 10);
    kvg_pc_tenant_put(pc, ta);
    kvg_pc_tenant_put(pc, tb);
    kvg_pc_set_host(pc, NULL, NULL, 0);
    kvg_pc_set_disk(pc, NULL, NULL, 0);
    kvg_pc_free(pc);
    kvg_kv_host_free(k);
    if (d)
        kvg_kv_disk_close(d);
    {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, KVG_KV_DISK_FILE);
        unlink(path);
        rmdir(dir);
    }
    free(buf);
    kvg_kv_pool_free(p);
    kvg_kv_pool_free(ref);
    kvg_prefix_hasher_free(hs);
}

int main(void)
{
    test_store();
    test_prefix_cache();
    return done_testing();
}
