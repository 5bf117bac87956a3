/* The KV host tier's worth on a device (--kv-host-memory): time to first token of one
 * P-token prompt, through the engine's own prefix cache (prefix_cache.h), host tier
 * (kv_host.h) and forward pass (forward.h), in four states:
 *
 *   recompute   the cache holds nothing of the prompt: admission misses in the pool and
 *               the host tier, and all P tokens are prefilled (in --prefill-chunk steps,
 *               as the scheduler's max_batch_tokens chunks them; default 512, its default);
 *   device hit  the prompt's blocks are cached in the device pool: admission takes all
 *               but the block of the last token, which is computed;
 *   host hit    those blocks were evicted from the pool into the host tier (another
 *               prompt filled the whole pool: its admission evicts every cached block,
 *               the LRU spilling each into a host slot, the D2H copy queued; the tool then
 *               checks that the pool holds none of them and the host tier all): admission
 *               copies them back into fresh pool blocks (H2D, queued on the step's stream)
 *               and the last block is computed;
 *   H2D alone   the host hit's admission, then a wait for its copies, without the step:
 *               the copies' time, their bytes, and the effective bandwidth.
 *
 * Each figure is the median of --reps runs after a warm-up step; TTFT runs from the
 * admission to the first token's logits back in host memory. The host hit's logits (and
 * the device hit's) must equal the recompute's bit for bit: the tool runs the backend
 * batch-invariant (the property the prefix cache relies on) and fails otherwise, naming
 * the first differing logit; it fails too when the blocks did not go through the host
 * tier (its statistics: slots put, blocks copied back, the cache's host-hit tokens).
 * Figures only: no speed is asserted.
 *
 *   build/bench/tiers_gpu_bench [--backend cuda] [--model synthetic:8B4L-bf16]
 *       [--prompt 8192] [--prefill-chunk 512] [--reps 3] [--kv-memory SIZE]
 *       [--kv-host-memory SIZE] [--device N] [--threads N] [--seed N] [--json FILE]
 *
 * --kv-memory / --kv-host-memory (the engine's options; "512M", "1G"): the device pool and
 * the pinned host tier; by default each holds the prompt's blocks and a few more. The pool
 * must hold the prompt (ceil(P / block_tokens) blocks and the warm-up's), the host tier
 * its full blocks. A backend whose pool is in host memory (cpu) has no host tier: an
 * error. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cliargs.h"
#include "forward.h"
#include "kv_cache.h"
#include "kv_host.h"
#include "model.h"
#include "monoclock.h"
#include "prefix_cache.h"
#include "prefix_hash.h"
#include "sampler.h"
#include "sampler_testing.h"
#include "bench_stats.h"

#define PROG "tiers_gpu_bench"
#define MAX_REPS 99
#define WARMUP_TOKENS 32

typedef struct opts {
    const char *backend, *model, *json;
    int prompt, chunk, reps, device, threads, seed;
    uint64_t kv_bytes, host_bytes;           /* 0: sized for the prompt */
} opts;

typedef struct bench {
    const opts *o;
    const kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *pool;
    kvg_forward *fw;
    kvg_prefix_cache *pc;
    kvg_kv_host *host;
    void *host_buf;
    kvg_prefix_hasher *hasher;
    int32_t *toks;               /* the prompt, [P] */
    uint8_t (*hashes)[KVG_PREFIX_HASH_LEN];  /* its chain under the tenant, [P / bt] */
    int32_t n_hashes, bt, P, V;
    int tenant;
    float *logits, *ref;         /* [V]: this run's, the recompute's */
} bench;

static void die(const char *what, const char *err)
{
    fprintf(stderr, PROG ": %s: %s\n", what, err);
    exit(1);
}

static int parse_size(const char *v, void *dst, char *msg, size_t msg_len)
{
    (void)msg, (void)msg_len;
    return kvg_arg_size(v, (uint64_t *)dst) == 0 && *(uint64_t *)dst > 0 ? 0 : -1;
}

static int parse_args(int argc, char **argv, opts *o)
{
    static const char usage[] =
        "usage: " PROG " [--backend cuda] [--model synthetic:8B4L-bf16] [--prompt 8192]\n"
        "    [--prefill-chunk 512] [--reps 3] [--kv-memory SIZE] [--kv-host-memory SIZE]\n"
        "    [--device N] [--threads N] [--seed N] [--json FILE]\n"
        "TTFT of a P-token prompt: recomputed, from the device pool, from the host tier;\n"
        "the host hit's logits must equal the recompute's bit for bit (see t/bench/tiers_gpu_bench.c).\n";
    const kvg_opt t[] = {
        { "--backend", KVG_OPT_STR, &o->backend, 0, 0, NULL, NULL },
        { "--model", KVG_OPT_STR, &o->model, 0, 0, NULL, NULL },
        { "--json", KVG_OPT_STR, &o->json, 0, 0, NULL, NULL },
        { "--prompt", KVG_OPT_INT, &o->prompt, 2, 1 << 22, "--prompt: '%s' is not a token count 2..4194304", NULL },
        { "--prefill-chunk", KVG_OPT_INT, &o->chunk, 1, 1 << 22, "--prefill-chunk: '%s' is not a token count >= 1",
          NULL },
        { "--reps", KVG_OPT_INT, &o->reps, 1, MAX_REPS, "--reps: '%s' is not a count 1..99", NULL },
        { "--device", KVG_OPT_INT, &o->device, 0, 1024, "--device: '%s' is not a device ordinal", NULL },
        { "--threads", KVG_OPT_INT, &o->threads, 0, 4096, "--threads: '%s' is not a thread count", NULL },
        { "--seed", KVG_OPT_INT, &o->seed, 0, 1 << 30, "--seed: '%s' is not a seed >= 0", NULL },
        { "--kv-memory", KVG_OPT_CUSTOM, &o->kv_bytes, 0, 0, "--kv-memory: '%s' is not a size like 512M or 4G",
          parse_size },
        { "--kv-host-memory", KVG_OPT_CUSTOM, &o->host_bytes, 0, 0,
          "--kv-host-memory: '%s' is not a size like 512M or 4G", parse_size },
    };
    memset(o, 0, sizeof *o);
    o->backend = "cuda";
    o->model = "synthetic:8B4L-bf16";
    o->prompt = 8192, o->chunk = 512, o->reps = 3, o->seed = 2024;
    return kvg_args_parse(PROG, usage, argc, argv, t, sizeof t / sizeof t[0]);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Prefills toks[seq->n_tokens..n) in chunks of o->chunk; the last token's logits into
 * b->logits. */
static void prefill(bench *b, kvg_kv_seq *seq, const int32_t *toks, int n)
{
    char err[1024];
    while (seq->n_tokens < n) {
        int done = seq->n_tokens, k = n - done > b->o->chunk ? b->o->chunk : n - done;
        kvg_fwd_seq fs = { .kv = seq, .tokens = toks + done, .n_tokens = k,
                           .logits = done + k == n ? b->logits : NULL };
        if (kvg_forward_step(b->fw, &fs, 1, err, sizeof err) != 0)
            die("prefill", err);
    }
}

/* Admission of the prompt under `tenant` with its chain `hashes` (the engine's
 * kvg_pc_admit): the cached tokens. */
static int32_t admit(bench *b, kvg_kv_seq *seq, int tenant, const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN])
{
    char err[512];
    int32_t n;
    kvg_kv_seq_init(seq);
    n = kvg_pc_admit(b->pc, seq, tenant, hashes, b->n_hashes, b->P, 0, kvg_mono_ms(), 0, err, sizeof err);
    if (n < 0)
        die("admission", err);
    return n;
}

/* What the scheduler does as the blocks fill: each full block published under its hash. */
static void commit(bench *b, const kvg_kv_seq *seq, int tenant, const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN])
{
    for (int32_t i = 0; i < b->n_hashes; i++)
        kvg_pc_commit(b->pc, seq, i, hashes[i], tenant, 0, kvg_mono_ms());
}

/* The chain of the prompt under a tenant's salt (what the engine's intake computes). */
static void chain(bench *b, const char *salt, uint8_t (*out)[KVG_PREFIX_HASH_LEN])
{
    uint8_t root[KVG_PREFIX_HASH_LEN];
    size_t n = 0;
    char err[512];
    if (kvg_pc_salt_root(b->pc, b->hasher, salt, strlen(salt), root, err, sizeof err) != 0 ||
        kvg_prefix_chain(b->hasher, root, b->toks, (size_t)b->P, (size_t)b->bt, out, (size_t)b->n_hashes, &n, err,
                         sizeof err) != 0)
        die("prefix hash", err);
    if ((int32_t)n != b->n_hashes)
        die("prefix hash", "wrong block count");
}

/* The run's logits against the recompute's, bit for bit. */
static void same_bits(const bench *b, const char *what)
{
    for (int i = 0; i < b->V; i++)
        if (memcmp(&b->logits[i], &b->ref[i], sizeof(float)) != 0) {
            char msg[256];
            snprintf(msg, sizeof msg, "logit %d is %.9g, the recompute's %.9g (first token %d vs %d): FAIL", i,
                     (double)b->logits[i], (double)b->ref[i], kvg_argmax(b->logits, b->V), kvg_argmax(b->ref, b->V));
            die(what, msg);
        }
}

/* Evicts every cached block of the pool: another prompt, as long as the whole pool (no
 * tenant, no hashes: nothing looked up nor kept), is admitted and released; its admission
 * takes every block, so the cache evicts each cached one, the host tier taking it. Then
 * waits for the D2H copies queued. */
static void evict_all(bench *b)
{
    kvg_kv_seq filler;
    char err[512];
    kvg_kv_seq_init(&filler);
    if (kvg_pc_admit(b->pc, &filler, -1, NULL, 0, b->pool->n_blocks * b->bt, 0, kvg_mono_ms(), 0, err,
                     sizeof err) < 0)
        die("filling the pool", err);
    kvg_pc_release(b->pc, &filler, kvg_mono_ms());
    kvg_kv_pool_xfer_wait(b->pool);
}

/* After evict_all: none of the prompt's blocks in the pool, all of them in the host tier. */
static void check_in_host(const bench *b)
{
    for (int32_t i = 0; i < b->n_hashes; i++) {
        if (kvg_pc_holds(b->pc, b->hashes[i]))
            die("eviction", "a block of the prompt is still in the device pool: FAIL");
        if (!kvg_kv_host_holds(b->host, b->hashes[i]))
            die("eviction", "a block of the prompt is not in the host tier (too small? --kv-host-memory): FAIL");
    }
}

static json_t *run(bench *b)
{
    const opts *o = b->o;
    int R = o->reps;
    int32_t want = (b->P - 1) / b->bt * b->bt;   /* every block but the last token's */
    double t_cold[MAX_REPS], t_dev[MAX_REPS], t_host[MAX_REPS], t_h2d[MAX_REPS];
    double evict_s, t0;
    uint64_t put_blocks, h2d_bytes = 0, h2d_blocks = 0;
    kvg_kv_host_stats hs0, hs1;
    kvg_pc_stats ps0, ps1;
    kvg_kv_seq s;
    json_t *j = json_object();
    char err[512];

    /* warm-up: a step of each kind once (handles, algorithms, first-touch) */
    kvg_kv_seq_init(&s);
    prefill(b, &s, b->toks, b->P < WARMUP_TOKENS ? b->P : WARMUP_TOKENS);
    kvg_kv_seq_release(b->pool, &s);

    /* (1) recompute: each rep a tenant of its own (a chain nothing holds), its blocks not
     * published (so the next rep's pool is as empty) */
    for (int r = 0; r < R; r++) {
        char salt[64];
        uint8_t (*h)[KVG_PREFIX_HASH_LEN] = malloc((size_t)b->n_hashes * sizeof *h);
        int t;
        int32_t got;
        snprintf(salt, sizeof salt, "tiers-cold-%d", r);
        if (!h)
            die("memory", "out of memory");
        chain(b, salt, h);
        if ((t = kvg_pc_tenant(b->pc, salt, strlen(salt), 0)) < 0)
            die("tenant", salt);
        t0 = kvg_mono_s();
        got = admit(b, &s, t, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])h);
        prefill(b, &s, b->toks, b->P);
        t_cold[r] = kvg_mono_s() - t0;
        if (got != 0)
            die("recompute", "the cache held part of a prompt it never saw: FAIL");
        if (r == 0)
            memcpy(b->ref, b->logits, (size_t)b->V * sizeof *b->ref);
        else
            same_bits(b, "recompute (reps)");
        kvg_pc_release(b->pc, &s, kvg_mono_ms());
        kvg_pc_tenant_put(b->pc, t);
        free(h);
    }

    /* the prompt computed once under the bench's tenant and published, as a request would */
    admit(b, &s, b->tenant, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])b->hashes);
    prefill(b, &s, b->toks, b->P);
    same_bits(b, "first publication");
    commit(b, &s, b->tenant, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])b->hashes);
    kvg_pc_release(b->pc, &s, kvg_mono_ms());

    /* (2) device hit */
    for (int r = 0; r < R; r++) {
        int32_t got;
        t0 = kvg_mono_s();
        got = admit(b, &s, b->tenant, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])b->hashes);
        prefill(b, &s, b->toks, b->P);
        t_dev[r] = kvg_mono_s() - t0;
        if (got != want) {
            snprintf(err, sizeof err, "%d tokens cached, want %d: FAIL", (int)got, (int)want);
            die("device hit", err);
        }
        same_bits(b, "device hit");
        commit(b, &s, b->tenant, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])b->hashes);
        kvg_pc_release(b->pc, &s, kvg_mono_ms());
    }

    /* the first eviction copies the prompt's blocks out (D2H); later ones find them held */
    kvg_kv_host_get_stats(b->host, &hs0);
    t0 = kvg_mono_s();
    evict_all(b);
    evict_s = kvg_mono_s() - t0;
    kvg_kv_host_get_stats(b->host, &hs1);
    put_blocks = hs1.puts - hs0.puts;
    if (put_blocks < (uint64_t)b->n_hashes) {
        snprintf(err, sizeof err, "%llu blocks went to the host tier, want %d at least: FAIL",
                 (unsigned long long)put_blocks, (int)b->n_hashes);
        die("eviction", err);
    }
    check_in_host(b);

    /* (3) host hit; (4) its copies alone */
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < R; r++) {
            int32_t got;
            if (pass || r)
                evict_all(b);
            check_in_host(b);
            kvg_kv_host_get_stats(b->host, &hs0);
            kvg_pc_get_stats(b->pc, &ps0);
            t0 = kvg_mono_s();
            got = admit(b, &s, b->tenant, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])b->hashes);
            if (pass == 0)
                prefill(b, &s, b->toks, b->P);
            else
                kvg_kv_pool_xfer_wait(b->pool);
            (pass == 0 ? t_host : t_h2d)[r] = kvg_mono_s() - t0;
            kvg_kv_host_get_stats(b->host, &hs1);
            kvg_pc_get_stats(b->pc, &ps1);
            if (got != want || hs1.hits - hs0.hits != (uint64_t)(want / b->bt) ||
                ps1.host_hit_tokens - ps0.host_hit_tokens != (uint64_t)want) {
                snprintf(err, sizeof err, "%d tokens cached, %llu blocks copied back, %llu host-hit tokens; want "
                         "%d, %d, %d: FAIL", (int)got, (unsigned long long)(hs1.hits - hs0.hits),
                         (unsigned long long)(ps1.host_hit_tokens - ps0.host_hit_tokens), (int)want,
                         (int)(want / b->bt), (int)want);
                die("host hit", err);
            }
            h2d_blocks = hs1.hits - hs0.hits;
            h2d_bytes = hs1.bytes_in - hs0.bytes_in;
            if (pass == 0) {
                same_bits(b, "host hit");
                commit(b, &s, b->tenant, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])b->hashes);
            }
            kvg_pc_release(b->pc, &s, kvg_mono_ms());
        }

    {
        double cold = bench_median(t_cold, R), dev = bench_median(t_dev, R), host = bench_median(t_host, R),
               h2d = bench_median(t_h2d, R), slot = (double)kvg_kv_xfer_bytes(b->pool);
        json_object_set_new(j, "recompute_ms", json_real(cold * 1e3));
        json_object_set_new(j, "device_hit_ms", json_real(dev * 1e3));
        json_object_set_new(j, "host_hit_ms", json_real(host * 1e3));
        json_object_set_new(j, "h2d_ms", json_real(h2d * 1e3));
        json_object_set_new(j, "cached_tokens", json_integer(want));
        json_object_set_new(j, "computed_tokens", json_integer(b->P - want));
        json_object_set_new(j, "blocks_copied", json_integer((json_int_t)h2d_blocks));
        json_object_set_new(j, "bytes_copied", json_integer((json_int_t)h2d_bytes));
        json_object_set_new(j, "h2d_gbs", json_real((double)h2d_bytes / h2d * 1e-9));
        json_object_set_new(j, "evict_blocks", json_integer((json_int_t)put_blocks));
        json_object_set_new(j, "evict_ms", json_real(evict_s * 1e3));
        json_object_set_new(j, "d2h_gbs", json_real((double)put_blocks * slot / evict_s * 1e-9));
        json_object_set_new(j, "speedup_host", json_real(cold / host));
        json_object_set_new(j, "speedup_device", json_real(cold / dev));
        json_object_set_new(j, "first_token", json_integer(kvg_argmax(b->ref, b->V)));
        json_object_set_new(j, "logits_identical", json_true());
        printf("  TTFT recompute      %10.3f ms  (%d tokens prefilled, chunks of %d)\n", cold * 1e3, b->P, o->chunk);
        printf("  TTFT device hit     %10.3f ms  (%d cached, %d computed)  %.1fx\n", dev * 1e3, (int)want,
               (int)(b->P - want), cold / dev);
        printf("  TTFT host hit       %10.3f ms  (%llu blocks, %.1f MiB H2D)  %.1fx over recompute\n", host * 1e3,
               (unsigned long long)h2d_blocks, (double)h2d_bytes / 1048576.0, cold / host);
        printf("  H2D copies alone    %10.3f ms  %.2f GB/s effective\n", h2d * 1e3, (double)h2d_bytes / h2d * 1e-9);
        printf("  eviction (D2H)      %10.3f ms  %llu blocks, %.2f GB/s (the filler's admission and the copies)\n",
               evict_s * 1e3, (unsigned long long)put_blocks, (double)put_blocks * slot / evict_s * 1e-9);
        printf("  host hit logits == recompute logits, bit for bit (first token %d): pass\n",
               kvg_argmax(b->ref, b->V));
    }
    return j;
}

int main(int argc, char **argv)
{
    opts o;
    bench b;
    kvg_model_load_opts lo;
    kvg_backend_opts bo;
    kvg_kv_geom g;
    kvg_pc_config pcfg;
    size_t slot;
    int32_t pool_blocks, host_blocks;
    char err[2048];
    double t0 = kvg_mono_s();
    int rc;
    json_t *root, *res;

    if ((rc = parse_args(argc, argv, &o)) != 0)
        return rc;
    memset(&b, 0, sizeof b);
    b.o = &o;
    b.P = o.prompt;
    /* no device: say so now, not after building a model of gigabytes */
    if (strcmp(o.backend, "cuda") == 0 && kvg_backend_cuda_probe(o.device, err, sizeof err) != 0)
        die("backend", err);
    memset(&lo, 0, sizeof lo);
    lo.max_seq_len = b.P + 64;           /* synthetic models take a longer context */
    kvg_model *m = kvg_model_load(o.model, &lo, err, sizeof err);
    if (!m)
        die(o.model, err);
    if (m->cfg.max_seq_len < b.P)
        die(o.model, "the model's context is shorter than --prompt");
    b.m = m;
    b.V = m->cfg.vocab_size;
    memset(&bo, 0, sizeof bo);
    bo.n_threads = o.threads;
    bo.device = o.device;
    bo.batch_invariant = 1;              /* a hit's logits must equal a recompute's */
    if (!(b.be = kvg_backend_new_opts(o.backend, m, &bo, err, sizeof err)))
        die("backend", err);
    if (!b.be->ops->host_alloc)
        die(o.backend, "the backend's KV pool is in host memory already: it has no host tier (use --backend cuda)");
    kvg_forward_kv_geom(m, 0, &g);
    if (!g.block_tokens)
        g.block_tokens = KVG_KV_BLOCK_TOKENS_DEFAULT;
    b.bt = g.block_tokens;
    if (b.P <= b.bt)
        die("--prompt", "needs more tokens than one block (the last token's block is always computed)");
    b.n_hashes = b.P / b.bt;
    /* the prompt's blocks, the warm-up's and a few more */
    pool_blocks = o.kv_bytes ? kvg_backend_kv_blocks_for_budget(b.be, &g, (size_t)o.kv_bytes)
                             : (b.P + b.bt - 1) / b.bt + WARMUP_TOKENS / b.bt + 4;
    if (pool_blocks < (b.P + b.bt - 1) / b.bt + 1) {
        snprintf(err, sizeof err, "%llu bytes hold %d blocks of %zu bytes; the prompt needs %d", (unsigned long long)o.kv_bytes,
                 (int)pool_blocks, kvg_backend_kv_block_bytes(b.be, &g), (b.P + b.bt - 1) / b.bt + 1);
        die("--kv-memory", err);
    }
    if (!(b.pool = kvg_backend_kv_pool_new(b.be, &g, pool_blocks, err, sizeof err)))
        die("kv pool", err);
    if (!b.pool->xfer_out)
        die(o.backend, "the backend's KV pool has no transfer hooks: no host tier");
    if (!(b.fw = kvg_forward_new(m, b.be, b.pool, err, sizeof err)))
        die("forward", err);
    memset(&pcfg, 0, sizeof pcfg);
    memcpy(pcfg.model_id, m->id, sizeof pcfg.model_id);
    pcfg.pinned_share = 0.5;
    pcfg.default_ttl_ms = 3600 * 1000;   /* nothing expires within a run (the default is 5 min) */
    if (!(b.pc = kvg_pc_new(b.pool, &pcfg, err, sizeof err)))
        die("prefix cache", err);
    slot = kvg_kv_xfer_bytes(b.pool);
    if (!o.host_bytes)
        o.host_bytes = (uint64_t)(b.n_hashes + 4) * slot;
    host_blocks = (int32_t)(o.host_bytes / slot);
    if (host_blocks < b.n_hashes) {
        snprintf(err, sizeof err, "%llu bytes hold %d blocks of %zu bytes; the prompt has %d",
                 (unsigned long long)o.host_bytes, (int)host_blocks, slot, (int)b.n_hashes);
        die("--kv-host-memory", err);
    }
    if (!(b.host_buf = b.be->ops->host_alloc(b.be, (size_t)o.host_bytes)))
        die("--kv-host-memory", "cannot pin that much host memory");
    if (!(b.host = kvg_kv_host_new(b.host_buf, (size_t)o.host_bytes, slot, err, sizeof err)) ||
        kvg_pc_set_host(b.pc, b.host, err, sizeof err) != 0)
        die("host tier", err);
    if (!(b.hasher = kvg_prefix_hasher_new(err, sizeof err)))
        die("prefix hash", err);
    if ((b.tenant = kvg_pc_tenant(b.pc, "tiers", 5, 0)) < 0)
        die("tenant", "cannot create one");
    b.toks = malloc((size_t)b.P * sizeof *b.toks);
    b.hashes = malloc((size_t)b.n_hashes * sizeof *b.hashes);
    b.logits = malloc((size_t)b.V * sizeof *b.logits);
    b.ref = malloc((size_t)b.V * sizeof *b.ref);
    if (!b.toks || !b.hashes || !b.logits || !b.ref)
        die("memory", "out of memory");
    {
        uint64_t rng = (uint64_t)o.seed;
        for (int i = 0; i < b.P; i++)
            b.toks[i] = (int32_t)(3 + (int)(rng_next(&rng) % (uint64_t)(b.V - 3)));
    }
    chain(&b, "tiers", b.hashes);
    {
        char desc[256];
        kvg_backend_describe(b.be, desc, sizeof desc);
        printf(PROG ": %s on %s, batch-invariant; prompt %d tokens (%d blocks of %d), KV block %zu bytes; "
               "pool %d blocks, host tier %d slots (%.1f MiB pinned)\n", m->name, desc, b.P, (int)b.n_hashes,
               (int)b.bt, slot, (int)pool_blocks, (int)host_blocks, (double)o.host_bytes / 1048576.0);
    }

    res = run(&b);
    root = json_object();
    json_object_set_new(root, "tool", json_string(PROG));
    json_object_set_new(root, "backend", json_string(o.backend));
    json_object_set_new(root, "model", json_string(m->name));
    json_object_set_new(root, "batch_invariant", json_true());
    json_object_set_new(root, "prompt", json_integer(b.P));
    json_object_set_new(root, "prefill_chunk", json_integer(o.chunk));
    json_object_set_new(root, "reps", json_integer(o.reps));
    json_object_set_new(root, "block_tokens", json_integer(b.bt));
    json_object_set_new(root, "block_bytes", json_integer((json_int_t)slot));
    json_object_set_new(root, "pool_blocks", json_integer(pool_blocks));
    json_object_set_new(root, "host_slots", json_integer(host_blocks));
    json_object_update(root, res);
    json_decref(res);
    json_object_set_new(root, "seconds", json_real(kvg_mono_s() - t0));
    if (o.json && json_dump_file(root, o.json, JSON_INDENT(2)) != 0)
        die(o.json, "cannot write it");
    json_decref(root);

    kvg_pc_tenant_put(b.pc, b.tenant);
    kvg_pc_free(b.pc);
    kvg_kv_host_free(b.host);
    b.be->ops->host_free(b.be, b.host_buf);
    kvg_prefix_hasher_free(b.hasher);
    kvg_forward_free(b.fw);
    kvg_kv_pool_free(b.pool);
    kvg_backend_free(b.be);
    kvg_model_free(m);
    free(b.toks), free(b.hashes), free(b.logits), free(b.ref);
    return 0;
}
