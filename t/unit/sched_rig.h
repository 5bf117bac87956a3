/* The scheduler test rig of sched.c, sched_policy.c and warmup.c: a KV pool of 8-token
 * blocks, a forward pass, a prefix cache and a scheduler over one model, built in that
 * order and freed in reverse; a tenant with its chain root; a drain loop; the common
 * request fields; submitting with the prompt's chain; a seeded token stream;
 * stories260K with its tokenizer.
 *
 * Header-only like tap.h (every test is one .c file); static inline so that a test
 * using only part of it compiles without unused-function warnings. */
#ifndef KVG_SCHED_RIG_H
#define KVG_SCHED_RIG_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "backend.h"
#include "buckets.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "prefix_cache.h"
#include "prefix_cache_testing.h"
#include "prefix_hash.h"
#include "scheduler.h"

#define SCHED_RIG_BLOCK_TOKENS 8

typedef struct sched_rig {
    kvg_kv_pool *kv;
    kvg_forward *fw;
    kvg_prefix_cache *pc;
    kvg_sched *s;
    int tenant;                  /* opts.tenant's index in the cache, -1: none */
    uint8_t root[KVG_PREFIX_HASH_LEN];   /* its chain root */
} sched_rig;

typedef struct sched_rig_opts {
    const kvg_model *m;          /* the scheduler's model (and the cache's model id) */
    const kvg_model *fwd_model;  /* the forward pass's; NULL: m (a test may shorten its context) */
    kvg_backend *be;
    int n_blocks;                /* KV pool size */
    double pinned_share;         /* the prefix cache's; 0: its default */
    kvg_sched_config sc;         /* as kvg_sched_new takes it */
    kvg_sched_cb cb;
    const char *tenant;          /* registered with the cache, its root in r->root; NULL: none */
} sched_rig_opts;

static inline int sched_rig_new(sched_rig *r, const sched_rig_opts *o)
{
    char err[256];
    kvg_kv_geom g;
    kvg_pc_config pcfg;
    memset(r, 0, sizeof *r);
    r->tenant = -1;
    memset(&pcfg, 0, sizeof pcfg);
    memcpy(pcfg.model_id, o->m->id, sizeof pcfg.model_id);
    pcfg.pinned_share = o->pinned_share;
    kvg_forward_kv_geom(o->m, SCHED_RIG_BLOCK_TOKENS, &g);
    r->kv = kvg_kv_pool_new(&g, o->n_blocks, err, sizeof err);
    r->fw = r->kv ? kvg_forward_new(o->fwd_model ? o->fwd_model : o->m, o->be, r->kv, err, sizeof err)
                  : NULL;
    r->pc = r->fw ? kvg_pc_new(r->kv, &pcfg, err, sizeof err) : NULL;
    r->s = r->pc ? kvg_sched_new(o->m, r->fw, r->pc, r->kv, &o->sc, o->cb, NULL, err, sizeof err) : NULL;
    if (!r->s) {
        diag("rig: %s", err);
        return -1;
    }
    if (o->tenant) {
        kvg_prefix_hasher *h = kvg_prefix_hasher_new(err, sizeof err);
        r->tenant = kvg_pc_tenant(r->pc, o->tenant, strlen(o->tenant), 0.0);
        if (!h || kvg_pc_tenant_root(r->pc, h, r->tenant, r->root, err, sizeof err) != 0) {
            diag("rig: %s", err);
            kvg_prefix_hasher_free(h);
            return -1;
        }
        kvg_prefix_hasher_free(h);
    }
    return 0;
}

/* Safe on a rig sched_rig_new failed to build. */
static inline void sched_rig_free(sched_rig *r)
{
    kvg_sched_free(r->s);
    kvg_pc_free(r->pc);
    kvg_forward_free(r->fw);
    kvg_kv_pool_free(r->kv);
}

/* Steps until nothing is pending: 0, or -1 (with a diag) when a step fails or
 * max_steps pass without the scheduler draining. */
static inline int sched_rig_drain(sched_rig *r, int max_steps)
{
    char err[256];
    for (int guard = 0; kvg_sched_pending(r->s) > 0; guard++) {
        int rows = guard > max_steps ? -1 : kvg_sched_step(r->s, err, sizeof err);
        if (rows < 0) {
            diag("step: %s", guard > max_steps ? "no progress" : err);
            return -1;
        }
        if (rows == 0)           /* waiting for disk reads (a disk tier's): sleep on them */
            kvg_pc_disk_wait(r->pc, 100);
    }
    return 0;
}

/* A request of the rig's tenant for prompt p: bucket 1, one completion, greedy
 * (the sampler's defaults); the test sets the rest. */
static inline void sched_rig_req(const sched_rig *r, kvg_sched_req *q, uint64_t id, const int32_t *p,
                                 int n_p)
{
    memset(q, 0, sizeof *q);
    q->id = id;
    q->prompt = p;
    q->n_prompt = n_p;
    memcpy(q->root, r->root, sizeof q->root);
    q->tenant = r->tenant;
    q->bucket = 1;
    q->n = 1;
    q->logprobs = 1;             /* the tests compare them with the reference's */
}

/* Submits q as the engine's intake does: with the chain of its prompt's full blocks,
 * which the scheduler takes and never computes (kvg_sched_req). Unless q carries a
 * chain (or is bypass), it is computed here from q->root. kvg_sched_submit's 0, or -1
 * with err. */
static inline int sched_rig_submit(const sched_rig *r, const kvg_sched_req *q, char *err, size_t err_len)
{
    kvg_sched_req c = *q;
    uint8_t (*chain)[KVG_PREFIX_HASH_LEN] = NULL;
    size_t bt = (size_t)r->kv->geom.block_tokens;
    size_t nb = q->n_prompt > 0 ? (size_t)q->n_prompt / bt : 0;
    int rc;
    if (q->bucket != KVG_BUCKET_BYPASS && !q->hashes && nb) {
        kvg_prefix_hasher *h = kvg_prefix_hasher_new(err, err_len);
        chain = malloc(nb * sizeof *chain);
        rc = h && chain ? kvg_prefix_chain(h, q->root, q->prompt, (size_t)q->n_prompt, bt, chain, nb, &nb,
                                           err, err_len)
                        : -1;
        kvg_prefix_hasher_free(h);
        if (rc != 0) {
            if (h && !chain)
                snprintf(err, err_len, "rig: out of memory");
            free(chain);
            return -1;
        }
        c.hashes = (const uint8_t (*)[KVG_PREFIX_HASH_LEN])chain;
        c.n_hashes = (int32_t)nb;
    }
    rc = kvg_sched_submit(r->s, &c, err, err_len);
    free(chain);
    return rc;
}

/* The next of a seeded stream of ids in [3, vocab): above the special tokens. */
static inline int32_t sched_rig_rnd_tok(uint64_t *state, int vocab)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return 3 + (int32_t)((*state >> 33) % (uint64_t)(vocab - 3));
}

/* stories260K with its tokenizer from ../shared; NULL with err. */
static inline kvg_model *sched_rig_stories260k(char *err, size_t err_len)
{
    char path[512], tokp[512];
    kvg_model_load_opts lo;
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.bin", shared_dir());
    snprintf(tokp, sizeof tokp, "%s/models/stories260K/tok512.bin", shared_dir());
    memset(&lo, 0, sizeof lo);
    lo.tokenizer_path = tokp;
    return kvg_model_load(path, &lo, err, err_len);
}

#endif
