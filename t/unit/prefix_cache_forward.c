/* The prefix cache is invisible in the results: prompts sharing random prefixes go
 * through admission (miss, partial hit, full hit, or a prefix evicted and recomputed),
 * their uncached rest is prefilled in random chunks on the sequences' block tables,
 * then a few tokens are decoded greedily with every filled block published; the
 * logits after the prompt and after each generated token, and the tokens, must be
 * BIT-identical to a run of the same prompt alone on a fresh pool with no cache.
 * Models: stories260K (../shared) and a hand-built GQA model with biases; each also with
 * int8 KV (--kv-dtype int8: the deep layers' K and V int8, kv_cache.h), where a hit
 * reads the stored int8 blocks and must still give the fresh run's bits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "backend.h"
#include "engine_testmodel.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "prefix_cache.h"
#include "prefix_cache_testing.h"
#include "prefix_hash.h"
#include "logits.h"

#define BT 8
#define GEN 4
#define MAXP 160

static char err[512];
static kvg_prefix_hasher *hasher;
static uint64_t rs = 4242;
static int rnd_in(int lo, int hi)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (int)((uint32_t)(rs >> 33) % (uint32_t)(hi - lo + 1));
}

/* Prefill `toks[from..n)` in random chunks, then GEN greedy tokens; logits into out
 * ((GEN + 1) * V), generated tokens into gen. Publishes filled blocks when pc. */
static int run_seq(kvg_forward *fw, const kvg_model *m, kvg_prefix_cache *pc, kvg_kv_seq *seq,
                   int tenant, int32_t *toks, int n, uint8_t (*h)[KVG_PREFIX_HASH_LEN],
                   float *out, int32_t *gen, int64_t now)
{
    int V = m->cfg.vocab_size, pos = seq->n_tokens;
    while (pos < n) {
        kvg_fwd_seq s;
        int c = rnd_in(1, 24);
        if (c > n - pos)
            c = n - pos;
        s.kv = seq;
        s.tokens = toks + pos;
        s.n_tokens = c;
        s.logits = pos + c == n ? out : NULL;
        if (kvg_forward_step(fw, &s, 1, err, sizeof err) != 0)
            return -1;
        pos += c;
    }
    for (int g = 0; g < GEN; g++) {
        kvg_fwd_seq s;
        int32_t t = argmax(out + (size_t)g * V, V);
        gen[g] = t;
        toks[n + g] = t;
        if (pc && (n + g) % BT == 0 && n + g > 0) {
            /* positions up to n+g are written: publish the block that just filled */
            int b = (n + g) / BT - 1;
            if (kvg_prefix_next(hasher, h[b - 1], toks + b * BT, BT, h[b], err, sizeof err) == 0)
                kvg_pc_commit(pc, seq, b, h[b], tenant, 0, now);
        }
        s.kv = seq;
        s.tokens = toks + n + g;
        s.n_tokens = 1;
        s.logits = out + (size_t)(g + 1) * V;
        if (kvg_forward_step(fw, &s, 1, err, sizeof err) != 0)
            return -1;
    }
    return 0;
}

static void property(const char *name, const kvg_model *m, int kv_dtype, int full_layers)
{
    enum { NP = 14 };
    int V = m->cfg.vocab_size;
    kvg_kv_geom g;
    kvg_backend *be = kvg_backend_cpu_new(m, 1, err, sizeof err);
    kvg_kv_pool *ref_pool = NULL, *pool = NULL;
    kvg_forward *ref_fw = NULL, *fw = NULL;
    kvg_prefix_cache *pc = NULL;
    kvg_pc_config cfg;
    int32_t fam[3][MAXP];
    int tenant, bad = 0, kinds[4] = { 0 };  /* miss, partial, full, after eviction */
    float *ref = calloc((size_t)(GEN + 1) * V, sizeof(float));
    float *got = calloc((size_t)(GEN + 1) * V, sizeof(float));
    kvg_pc_stats st;

    kvg_forward_kv_geom(m, BT, &g);
    g.dtype = kv_dtype;
    g.full_layers = full_layers;
    if (be) {
        ref_pool = kvg_kv_pool_new(&g, MAXP / BT + 4, err, sizeof err);
        pool = kvg_kv_pool_new(&g, 36, err, sizeof err);   /* ~2 prompts' worth: evictions */
    }
    if (ref_pool && pool) {
        ref_fw = kvg_forward_new(m, be, ref_pool, err, sizeof err);
        fw = kvg_forward_new(m, be, pool, err, sizeof err);
    }
    memset(&cfg, 0, sizeof cfg);
    memcpy(cfg.model_id, "prefix-cache-forward-test-model!", KVG_PREFIX_HASH_LEN);
    if (fw)
        pc = kvg_pc_new(pool, &cfg, err, sizeof err);
    if (!ok(pc != NULL, "%s: rig", name)) {
        diag("%s", err);
        goto out;
    }
    tenant = kvg_pc_tenant(pc, "t", 1, 0);
    for (int f = 0; f < 3; f++)
        for (int i = 0; i < MAXP; i++)
            fam[f][i] = i == 0 ? (m->bos >= 0 ? m->bos : 3) : rnd_in(3, V - 1);
    for (int k = 0; k < NP && !bad; k++) {
        int32_t toks[MAXP + GEN], gref[GEN], gget[GEN];
        uint8_t h[(MAXP + GEN) / BT + 1][KVG_PREFIX_HASH_LEN], root[KVG_PREFIX_HASH_LEN];
        int f = rnd_in(0, 2), share = rnd_in(0, 100), n = rnd_in(share + 1 > 20 ? share + 1 : 20, 130);
        size_t nh;
        kvg_kv_seq rs_, cs;
        int32_t hit, could;
        /* the first `share` tokens from the family, the rest random; every 4th prompt
         * repeats one family prefix exactly, for full hits */
        if (k % 4 == 3)
            share = n = 8 * BT + rnd_in(0, 1) * 3;
        for (int i = 0; i < n; i++)
            toks[i] = i < share ? fam[f][i] : rnd_in(3, V - 1);
        kvg_pc_tenant_root(pc, hasher, tenant, root, err, sizeof err);
        kvg_prefix_chain(hasher, root, toks, (size_t)n, BT, h, sizeof h / sizeof h[0], &nh,
                         err, sizeof err);
        /* reference: alone on a fresh pool, one chunk */
        kvg_kv_seq_init(&rs_);
        {
            int32_t rt[MAXP + GEN];
            memcpy(rt, toks, (size_t)n * sizeof *rt);
            if (run_seq(ref_fw, m, NULL, &rs_, 0, rt, n, NULL, ref, gref, 0) != 0) {
                ok(0, "%s: reference run: %s", name, err);
                bad++;
            }
        }
        kvg_kv_seq_release(ref_pool, &rs_);
        /* through the cache */
        could = (int32_t)((n - 1) / BT);
        if ((int32_t)nh < could)
            could = (int32_t)nh;
        kvg_kv_seq_init(&cs);
        {
            int64_t ev0;
            kvg_pc_get_stats(pc, &st);
            ev0 = (int64_t)st.evictions[KVG_EVICT_LRU];
            hit = kvg_pc_admit(pc, &cs, tenant, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])h,
                               (int32_t)nh, n, 0, k, 0, err, sizeof err);
            if (hit < 0) {
                ok(0, "%s: admit: %s", name, err);
                bad++;
                break;
            }
            kinds[hit == 0 ? 0 : hit / BT == could ? 2 : 1]++;
            if (ev0 > 0 && share > BT && hit / BT < share / BT)
                kinds[3]++;
        }
        /* prefill, decode (publishing generated blocks), then publish the prompt's blocks */
        if (run_seq(fw, m, pc, &cs, tenant, toks, n, h, got, gget, k) != 0) {
            ok(0, "%s: cached run: %s", name, err);
            bad++;
        }
        for (int b = hit / BT; b < (int)nh; b++)
            kvg_pc_commit(pc, &cs, b, h[b], tenant, 0, k);
        if (memcmp(ref, got, (size_t)(GEN + 1) * V * sizeof(float)) != 0 ||
            memcmp(gref, gget, sizeof gref) != 0) {
            ok(0, "%s: prompt %d (%d tokens, %d cached): logits differ from the fresh run",
               name, k, n, (int)hit);
            bad++;
        }
        kvg_pc_release(pc, &cs, k);
        if (kvg_pc_check(pc, NULL, 0, err, sizeof err) != 0) {
            ok(0, "%s: invariants: %s", name, err);
            bad++;
        }
    }
    ok(!bad, "%s: %d prompts: logits and tokens bit-identical with and without the cache",
       name, NP);
    diag("%s: misses %d, partial hits %d, full hits %d, prefix re-computed after eviction %d",
         name, kinds[0], kinds[1], kinds[2], kinds[3]);
    ok(kinds[1] > 0 && kinds[2] > 0 && kinds[0] > 0, "%s: misses, partial and full hits all seen", name);
    kvg_pc_get_stats(pc, &st);
    ok(st.evictions[KVG_EVICT_LRU] > 0, "%s: the pool evicted (%llu)", name,
       (unsigned long long)st.evictions[KVG_EVICT_LRU]);
out:
    kvg_pc_free(pc);
    kvg_forward_free(fw);
    kvg_forward_free(ref_fw);
    kvg_kv_pool_free(pool);
    kvg_kv_pool_free(ref_pool);
    kvg_backend_free(be);
    free(ref);
    free(got);
}

int main(void)
{
    char path[512], tpath[512];
    kvg_model_load_opts lo;
    kvg_model *stories;
    tm_model ta;
    tm_spec a = { 48, 80, 2, 4, 2, 16, 97, 256, 1, 0, 1, 1, 1, 7 };

    hasher = kvg_prefix_hasher_new(err, sizeof err);
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.bin", shared_dir());
    snprintf(tpath, sizeof tpath, "%s/models/stories260K/tok512.bin", shared_dir());
    memset(&lo, 0, sizeof lo);
    lo.tokenizer_path = tpath;
    stories = kvg_model_load(path, &lo, err, sizeof err);
    if (ok(stories != NULL, "load stories260K"))
    {
        property("stories260K", stories, KVG_KV_F32, 0);
        property("stories260K int8 KV (2 F32 layers of 5)", stories, KVG_KV_INT8, 2);
        property("stories260K int8 KV (every layer)", stories, KVG_KV_INT8, 0);
    } else
        diag("%s", err);
    if (ok(tm_build(&ta, &a) == 0, "build the test model (GQA, biases, mixed dtypes)"))
    {
        property("testmodel", &ta.m, KVG_KV_F32, 0);
        property("testmodel int8 KV (1 F32 layer)", &ta.m, KVG_KV_INT8, 1);
    }
    tm_free(&ta);
    kvg_model_free(stories);
    kvg_prefix_hasher_free(hasher);
    return done_testing();
}
