/* Prefix cache figures (printed, never asserted):
 *  1. time to first token on synthetic:15M for a request whose 2,000-token prefix is
 *     cached vs not (prefill in chunks of 512, one thread by default);
 *  2. token hit rate of a mixed workload -- 50 tenants, each with its own shared
 *     system prompt, plus one noisy tenant sending unique prompts -- under a pool that
 *     holds a third of the system prompts, LRU alone vs with per-tenant quotas.
 * Usage: prefix_bench [threads] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "prefix_cache.h"
#include "prefix_cache_testing.h"
#include "prefix_hash.h"

static char err[512];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rs = 1;
static uint32_t rnd(uint32_t n)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rs >> 33) % n;
}

/* Admits and prefills toks[0..n) through the cache; returns seconds to first logits. */
static double ttft(kvg_forward *fw, kvg_prefix_cache *pc, kvg_prefix_hasher *h, int tenant,
                   const int32_t *toks, int n, float *logits, int32_t *cached, kvg_kv_seq *seq)
{
    uint8_t root[KVG_PREFIX_HASH_LEN], (*hs)[KVG_PREFIX_HASH_LEN] = malloc((size_t)n / 16 * 32 + 32);
    size_t nh;
    double t0 = now_s();
    int pos;
    kvg_pc_tenant_root(pc, h, tenant, root, err, sizeof err);
    kvg_prefix_chain(h, root, toks, (size_t)n, 16, hs, (size_t)n / 16 + 1, &nh, err, sizeof err);
    *cached = kvg_pc_admit(pc, seq, tenant, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])hs,
                           (int32_t)nh, n, 0, 0, 0, err, sizeof err);
    if (*cached < 0) {
        fprintf(stderr, "admit: %s\n", err);
        free(hs);
        return -1;
    }
    pos = *cached;
    while (pos < n) {
        kvg_fwd_seq s;
        int c = n - pos > 512 ? 512 : n - pos;
        s.kv = seq;
        s.tokens = toks + pos;
        s.n_tokens = c;
        s.logits = pos + c == n ? logits : NULL;
        if (kvg_forward_step(fw, &s, 1, err, sizeof err) != 0) {
            fprintf(stderr, "forward: %s\n", err);
            break;
        }
        pos += c;
    }
    {
        double t = now_s() - t0;
        for (size_t b = (size_t)*cached / 16; b < nh; b++)
            kvg_pc_commit(pc, seq, (int32_t)b, hs[b], tenant, 0, 0);
        free(hs);
        return t;
    }
}

static void bench_ttft(int threads)
{
    kvg_model_load_opts lo;
    kvg_model *m;
    kvg_backend *be;
    kvg_kv_geom g;
    kvg_kv_pool *pool;
    kvg_forward *fw;
    kvg_prefix_cache *pc;
    kvg_prefix_hasher *h = kvg_prefix_hasher_new(err, sizeof err);
    kvg_pc_config cfg;
    int32_t toks[2100], cached;
    float *logits, *logits2;
    kvg_kv_seq s1, s2;
    double cold, warm;
    int tenant;

    memset(&lo, 0, sizeof lo);
    lo.max_seq_len = 4096;
    m = kvg_model_load("synthetic:15M", &lo, err, sizeof err);
    if (!m) {
        fprintf(stderr, "load: %s\n", err);
        return;
    }
    be = kvg_backend_cpu_new(m, threads, err, sizeof err);
    kvg_forward_kv_geom(m, 16, &g);
    pool = kvg_kv_pool_new(&g, 400, err, sizeof err);
    fw = kvg_forward_new(m, be, pool, err, sizeof err);
    memset(&cfg, 0, sizeof cfg);
    pc = kvg_pc_new(pool, &cfg, err, sizeof err);
    tenant = kvg_pc_tenant(pc, "bench", 5, 0);
    logits = malloc((size_t)m->cfg.vocab_size * sizeof(float));
    logits2 = malloc((size_t)m->cfg.vocab_size * sizeof(float));
    for (int i = 0; i < 2100; i++)
        toks[i] = 3 + (int32_t)rnd((uint32_t)m->cfg.vocab_size - 3);
    kvg_kv_seq_init(&s1);
    kvg_kv_seq_init(&s2);
    cold = ttft(fw, pc, h, tenant, toks, 2000, logits, &cached, &s1);
    printf("ttft  synthetic:15M, %d thread(s): 2000-token prompt, not cached: %.1f ms (%d cached)\n",
           threads, cold * 1e3, (int)cached);
    kvg_pc_release(pc, &s1, 1);
    /* same 2000-token prefix + a 20-token question */
    warm = ttft(fw, pc, h, tenant, toks, 2020, logits2, &cached, &s2);
    printf("ttft  2000-token prefix cached + 20 new tokens: %.2f ms (%d cached): %.0fx faster\n",
           warm * 1e3, (int)cached, cold / warm);
    kvg_pc_release(pc, &s2, 2);
    free(logits);
    free(logits2);
    kvg_pc_free(pc);
    kvg_forward_free(fw);
    kvg_kv_pool_free(pool);
    kvg_backend_free(be);
    kvg_model_free(m);
    kvg_prefix_hasher_free(h);
}

/* The workload, bookkeeping only (no model): hit rate in tokens. */
static double hit_rate(double quota, uint64_t *evq, uint64_t *evl)
{
    enum { TENANTS = 50, SYS_BLOCKS = 24, REQS = 20000 };
    kvg_kv_geom g = { .n_layers = 1, .n_kv_heads = 1, .head_dim = 1, .block_tokens = 16 };
    int32_t pool_blocks = TENANTS * SYS_BLOCKS / 3;
    kvg_kv_pool *pool = kvg_kv_pool_new(&g, pool_blocks, err, sizeof err);
    kvg_pc_config cfg;
    kvg_prefix_cache *pc;
    kvg_prefix_hasher *h = kvg_prefix_hasher_new(err, sizeof err);
    int ten[TENANTS + 1];
    int32_t toks[(SYS_BLOCKS + 2) * 16];
    uint8_t hs[SYS_BLOCKS + 2][KVG_PREFIX_HASH_LEN], root[KVG_PREFIX_HASH_LEN];
    kvg_pc_stats st;
    memset(&cfg, 0, sizeof cfg);
    cfg.default_quota = quota;
    pc = kvg_pc_new(pool, &cfg, err, sizeof err);
    for (int t = 0; t <= TENANTS; t++) {
        char salt[16];
        snprintf(salt, sizeof salt, "tenant-%d", t);
        ten[t] = kvg_pc_tenant(pc, salt, strlen(salt), 0);
    }
    rs = 7;
    for (int r = 0; r < REQS; r++) {
        /* half the traffic is the noisy tenant's unique prompts */
        /* the others: two thirds of their requests from the 10 busiest tenants */
        int noisy = rnd(2) == 0, t = noisy ? TENANTS : rnd(3) ? (int)rnd(10) : (int)rnd(TENANTS);
        int n = (SYS_BLOCKS + 1) * 16 + (int)rnd(16);
        size_t nh;
        kvg_kv_seq s;
        for (int i = 0; i < n; i++)
            toks[i] = noisy || i >= SYS_BLOCKS * 16 ? (int32_t)rnd(30000) : (int32_t)(t * 100 + i);
        kvg_pc_tenant_root(pc, h, ten[t], root, err, sizeof err);
        kvg_prefix_chain(h, root, toks, (size_t)n, 16, hs, SYS_BLOCKS + 2, &nh, err, sizeof err);
        kvg_kv_seq_init(&s);
        if (kvg_pc_admit(pc, &s, ten[t], (const uint8_t (*)[KVG_PREFIX_HASH_LEN])hs, (int32_t)nh,
                         n, 0, r, 0, err, sizeof err) < 0)
            continue;
        s.n_tokens = n;
        for (size_t b = 0; b < nh; b++)
            kvg_pc_commit(pc, &s, (int32_t)b, hs[b], ten[t], 0, r);
        kvg_pc_release(pc, &s, r);
    }
    kvg_pc_get_stats(pc, &st);
    *evq = st.evictions[KVG_EVICT_QUOTA];
    *evl = st.evictions[KVG_EVICT_LRU];
    kvg_pc_free(pc);
    kvg_kv_pool_free(pool);
    kvg_prefix_hasher_free(h);
    return st.query_tokens ? (double)st.hit_tokens / (double)st.query_tokens : 0.0;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    uint64_t q, l;
    double a, b;
    a = hit_rate(0.0, &q, &l);
    printf("hits  50 tenants x 24-block system prompts + a noisy tenant (half the traffic, "
           "unique prompts), pool = 1/3 of the prompts:\n");
    printf("hits    LRU alone:           %.1f%% of prompt tokens (evictions: %llu LRU)\n",
           a * 100, (unsigned long long)l);
    b = hit_rate(0.05, &q, &l);
    printf("hits    quota 5%% per tenant: %.1f%% of prompt tokens (evictions: %llu quota, %llu LRU)\n",
           b * 100, (unsigned long long)q, (unsigned long long)l);
    bench_ttft(threads > 0 ? threads : 1);
    return 0;
}
