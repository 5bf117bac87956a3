/* The engine's exactness properties on one model file and one backend, for each model
 * family (t/engine-families.t runs it on every family's tiny GGUF):
 *
 *   (a) chunked prefill: the logits after a 100-token prompt, and after each of 4 greedy
 *       tokens, are bit-identical whether the prompt goes in one step or in chunks of 7,
 *       of 16, of 33, or of 7, 16, 33 in turn;
 *   (b) batch 1 vs batch 8: 8 sequences with different prompts (58 to 100 tokens),
 *       prefilled together in one step then decoded together for 16 greedy steps, and
 *       again entering one step after the other (prefill chunks sharing steps with the
 *       others' decodes), give each sequence bit for bit the logits and tokens of that
 *       sequence run alone;
 *   (c) a prefix-cache hit: a sequence whose first 96 tokens (6 blocks of 16) are a
 *       published prefix of another is admitted through the prefix cache as the engine
 *       serves hits (kvg_pc_admit takes the cached blocks, the rest is prefilled, decode
 *       goes through kvg_pc_prepare) -- once while the other still holds the blocks
 *       (shared KV blocks), once after it released them (cached blocks) -- and gives
 *       the logits and the 16 greedy tokens of the same prompt computed from scratch on
 *       a fresh pool, bit for bit; the hit must cover the 96 tokens.
 *
 *   build/t/family_check --model F.gguf [--backend cpu|cuda] [--threads N] [--decode N]
 *   (--decode: greedy steps in (b) and (c), 16 by default; fewer keep the emulated
 *   backend's run short where the kernels' own tests cover the rest)
 *   (build/emu/t/family_check: the CUDA backend emulated on the host; build/asan/t/:
 *   the CPU backend under ASan+UBSan)
 *
 * TAP on stdout, one test point per check (a first mismatch named in a diag line).
 * Exit status: 0 all passed, 1 a check failed or the model/backend did not load, 2 usage. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "backend.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "prefix_cache.h"
#include "prefix_cache_testing.h"
#include "prefix_hash.h"
#include "sampler_testing.h"

#define BT 16                    /* KV block tokens (the engine's default) */
#define N_PROMPT 100
#define N_SEQS 8
#define N_DECODE n_decode     /* greedy steps after each prompt: 16, or --decode N (1..16) */
#define SHARED 96                /* (c): the cached prefix, 6 blocks */
#define MAX_TOKENS 160

static char err[1024];
static const char *backend_name = "cpu";
static int n_threads = 2;
static int n_decode = 16;

typedef struct rig {
    const kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
    kvg_prefix_cache *pc;        /* (c) only */
} rig;

static int rig_new(rig *r, const kvg_model *m, int n_blocks, int with_cache)
{
    kvg_kv_geom g;
    kvg_backend_opts o;
    memset(r, 0, sizeof *r);
    memset(&o, 0, sizeof o);
    o.n_threads = n_threads;
    o.batch_invariant = 1;
    r->m = m;
    r->be = kvg_backend_new_opts(backend_name, m, &o, err, sizeof err);
    kvg_forward_kv_geom(m, BT, &g);
    r->kv = r->be ? kvg_backend_kv_pool_new(r->be, &g, n_blocks, err, sizeof err) : NULL;
    r->fw = r->kv ? kvg_forward_new(m, r->be, r->kv, err, sizeof err) : NULL;
    if (r->fw && with_cache) {
        kvg_pc_config cfg;
        memset(&cfg, 0, sizeof cfg);
        memcpy(cfg.model_id, "family-check: one model per pool", KVG_PREFIX_HASH_LEN);
        r->pc = kvg_pc_new(r->kv, &cfg, err, sizeof err);
    }
    return r->fw && (!with_cache || r->pc) ? 0 : -1;
}

static void rig_free(rig *r)
{
    kvg_pc_free(r->pc);
    kvg_forward_free(r->fw);
    kvg_kv_pool_free(r->kv);
    kvg_backend_free(r->be);
}

/* A deterministic prompt: BOS (or 1), then ids in [3, vocab) from an LCG seeded `seed`. */
static void make_prompt(int32_t *t, int n, int vocab, int32_t bos, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = i == 0 ? (bos >= 0 ? bos : 1) : 3 + (int32_t)((s >> 33) % (uint64_t)(vocab - 3));
    }
}

/* One sequence's run: prompt toks[0..n_prompt), then n_gen greedy tokens appended to
 * toks. rec: n_gen + 1 logit vectors (after the prompt, after each generated token). */
typedef struct run {
    int32_t toks[MAX_TOKENS];
    int n_prompt, n_gen, fed;
    float *rec;
    kvg_kv_seq seq;
} run;

static int run_init(run *u, const kvg_model *m, int n_prompt, int n_gen, uint64_t seed)
{
    memset(u, 0, sizeof *u);
    u->n_prompt = n_prompt;
    u->n_gen = n_gen;
    make_prompt(u->toks, n_prompt, m->cfg.vocab_size, m->bos, seed);
    u->rec = calloc((size_t)(n_gen + 1) * (size_t)m->cfg.vocab_size, sizeof(float));
    kvg_kv_seq_init(&u->seq);
    return u->rec ? 0 : -1;
}

/* The next row of u: `n` tokens from u->fed (a prompt chunk, or the last chosen token),
 * with logits when they complete the prompt or are a decode. */
static void run_row(run *u, int n, int vocab, kvg_fwd_seq *row)
{
    int end = u->fed + n;
    row->kv = &u->seq;
    row->tokens = u->toks + u->fed;
    row->n_tokens = n;
    row->logits = end >= u->n_prompt ? u->rec + (size_t)(end - u->n_prompt) * (size_t)vocab : NULL;
}

/* After a step: u has consumed n tokens; when logits came, the greedy token is appended. */
static void run_advance(run *u, int n, int vocab)
{
    u->fed += n;
    if (u->fed >= u->n_prompt) {
        int k = u->fed - u->n_prompt;
        if (k < u->n_gen)
            u->toks[u->fed] = kvg_argmax(u->rec + (size_t)k * (size_t)vocab, vocab);
    }
}

static int run_done(const run *u)
{
    return u->fed >= u->n_prompt + u->n_gen;
}

/* Tokens u takes in its next step: a prompt chunk (chunks[] cycled; 0 = the rest) or 1. */
static int next_n(const run *u, const int *chunks, int n_chunks, int *ci)
{
    if (u->fed >= u->n_prompt)
        return 1;
    int c = chunks && n_chunks ? chunks[(*ci)++ % n_chunks] : 0;
    int left = u->n_prompt - u->fed;
    return c <= 0 || c > left ? left : c;
}

/* Runs u alone on r to the end (prompt in `chunks`, then the greedy tokens), through the
 * prefix cache's kvg_pc_prepare when r has one. */
static int run_alone(rig *r, run *u, const int *chunks, int n_chunks)
{
    int V = r->m->cfg.vocab_size, ci = 0;
    while (!run_done(u)) {
        kvg_fwd_seq row;
        int n = next_n(u, chunks, n_chunks, &ci);
        if (r->pc && kvg_pc_prepare(r->pc, &u->seq, n, 0, err, sizeof err) != 0)
            return -1;
        run_row(u, n, V, &row);
        if (kvg_forward_step(r->fw, &row, 1, err, sizeof err) != 0)
            return -1;
        run_advance(u, n, V);
    }
    return 0;
}

/* Whether b's logits and tokens are a's bit for bit; names the first difference. */
static int same(const run *a, const run *b, int vocab, const char *what)
{
    size_t nrec = (size_t)(a->n_gen + 1) * (size_t)vocab;
    for (size_t i = 0; i < nrec; i++)
        if (memcmp(&a->rec[i], &b->rec[i], sizeof(float)) != 0) {
            diag("%s: logit %zu of record %zu differs: %.9g vs %.9g", what, i % (size_t)vocab,
                 i / (size_t)vocab, (double)a->rec[i], (double)b->rec[i]);
            return 0;
        }
    for (int i = a->n_prompt; i < a->n_prompt + a->n_gen; i++)
        if (a->toks[i] != b->toks[i]) {
            diag("%s: generated token %d differs: %d vs %d", what, i - a->n_prompt, a->toks[i], b->toks[i]);
            return 0;
        }
    return 1;
}

static void run_free(run *u, kvg_kv_pool *kv)
{
    if (kv)
        kvg_kv_seq_release(kv, &u->seq);
    free(u->rec);
    u->rec = NULL;
}

/* (a) */
static void check_chunks(const kvg_model *m)
{
    static const int c7[] = { 7 }, c16[] = { 16 }, c33[] = { 33 }, mix[] = { 7, 16, 33 };
    static const struct { const char *name; const int *c; int n; } pat[] = {
        { "chunks of 7", c7, 1 }, { "chunks of 16", c16, 1 }, { "chunks of 33", c33, 1 },
        { "chunks of 7, 16, 33", mix, 3 },
    };
    int V = m->cfg.vocab_size, good = 1;
    rig r;
    run ref, got;
    if (rig_new(&r, m, 2 * (N_PROMPT + 8) / BT + 4, 0) != 0 || run_init(&ref, m, N_PROMPT, 4, 1) != 0
        || run_alone(&r, &ref, NULL, 0) != 0) {
        ok(0, "(a) %s: a %d-token prompt in one step: %s", backend_name, N_PROMPT, err);
        rig_free(&r);
        return;
    }
    for (size_t p = 0; p < sizeof pat / sizeof pat[0]; p++) {
        if (run_init(&got, m, N_PROMPT, 4, 1) != 0 || run_alone(&r, &got, pat[p].c, pat[p].n) != 0) {
            diag("(a) %s: %s", pat[p].name, err);
            good = 0;
        } else if (!same(&ref, &got, V, pat[p].name)) {
            good = 0;
        }
        run_free(&got, r.kv);
    }
    ok(good, "(a) %s: a %d-token prompt prefilled in one step or in chunks of 7, 16, 33 and 7/16/33: "
       "bit-identical logits (prompt and 4 greedy steps)", backend_name, N_PROMPT);
    run_free(&ref, r.kv);
    rig_free(&r);
}

/* (b): `stagger` 0: every sequence prefills in step 0; 1: sequence i enters at step i. */
static int batch_run(rig *r, run *u, int stagger)
{
    int V = r->m->cfg.vocab_size;
    for (int stepno = 0;; stepno++) {
        kvg_fwd_seq rows[N_SEQS];
        int n_of[N_SEQS], who[N_SEQS], n = 0, ci = 0;
        for (int i = 0; i < N_SEQS; i++) {
            if (run_done(&u[i]) || (stagger && i > stepno))
                continue;
            n_of[n] = next_n(&u[i], NULL, 0, &ci);
            run_row(&u[i], n_of[n], V, &rows[n]);
            who[n++] = i;
        }
        if (n == 0)
            return 0;
        if (kvg_forward_step(r->fw, rows, n, err, sizeof err) != 0)
            return -1;
        for (int k = 0; k < n; k++)
            run_advance(&u[who[k]], n_of[k], V);
    }
}

static void check_batch(const kvg_model *m)
{
    int V = m->cfg.vocab_size, good = 1;
    rig r;
    run alone[N_SEQS], got[N_SEQS];
    int per_seq = (N_PROMPT + N_DECODE + BT - 1) / BT + 1;
    memset(alone, 0, sizeof alone);
    memset(got, 0, sizeof got);
    if (rig_new(&r, m, 2 * N_SEQS * per_seq, 0) != 0) {
        ok(0, "(b) %s: rig: %s", backend_name, err);
        return;
    }
    for (int i = 0; i < N_SEQS && good; i++) {
        if (run_init(&alone[i], m, N_PROMPT - 6 * i, N_DECODE, 100 + (uint64_t)i) != 0
            || run_alone(&r, &alone[i], NULL, 0) != 0) {
            diag("(b) sequence %d alone: %s", i, err);
            good = 0;
        }
        kvg_kv_seq_release(r.kv, &alone[i].seq);
    }
    for (int stagger = 0; stagger < 2 && good; stagger++) {
        for (int i = 0; i < N_SEQS; i++)
            if (run_init(&got[i], m, N_PROMPT - 6 * i, N_DECODE, 100 + (uint64_t)i) != 0)
                good = 0;
        if (good && batch_run(&r, got, stagger) != 0) {
            diag("(b) batch of %d%s: %s", N_SEQS, stagger ? ", staggered" : "", err);
            good = 0;
        }
        for (int i = 0; i < N_SEQS; i++) {
            char what[96];
            snprintf(what, sizeof what, "(b) sequence %d in the batch%s", i, stagger ? " (staggered)" : "");
            if (good && !same(&alone[i], &got[i], V, what))
                good = 0;
            run_free(&got[i], r.kv);
        }
    }
    ok(good, "(b) %s: %d sequences (prompts of %d..%d tokens) prefilled and decoded together for %d greedy steps, "
       "and entering one step apart: bit-identical to each alone", backend_name, N_SEQS, N_PROMPT - 6 * (N_SEQS - 1),
       N_PROMPT, N_DECODE);
    for (int i = 0; i < N_SEQS; i++)
        run_free(&alone[i], NULL);
    rig_free(&r);
}

/* (c): admission through the cache; the hashes of u's full prompt blocks in h. */
static int32_t admit(rig *r, kvg_prefix_hasher *hs, int tenant, const uint8_t root[KVG_PREFIX_HASH_LEN], run *u,
                     uint8_t (*h)[KVG_PREFIX_HASH_LEN], size_t *nh)
{
    if (kvg_prefix_chain(hs, root, u->toks, (size_t)u->n_prompt, BT, h, MAX_TOKENS / BT, nh, err, sizeof err) != 0)
        return -1;
    int32_t hit = kvg_pc_admit(r->pc, &u->seq, tenant, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])h, (int32_t)*nh,
                               u->n_prompt, 0, 0, 0, err, sizeof err);
    if (hit >= 0)
        u->fed = hit;
    return hit;
}

static void check_cache(const kvg_model *m)
{
    int V = m->cfg.vocab_size, good = 1;
    rig r, fresh;
    kvg_prefix_hasher *hs = kvg_prefix_hasher_new(err, sizeof err);
    uint8_t root[KVG_PREFIX_HASH_LEN], ha[MAX_TOKENS / BT][KVG_PREFIX_HASH_LEN], hb[MAX_TOKENS / BT][KVG_PREFIX_HASH_LEN];
    size_t nha = 0, nhb = 0;
    int32_t hits[2] = { -1, -1 };
    int tenant = -1;
    run a, b[2], scratch[2];
    int per_seq = (N_PROMPT + 16 + N_DECODE + BT - 1) / BT + 1;

    memset(b, 0, sizeof b);
    memset(scratch, 0, sizeof scratch);
    memset(&a, 0, sizeof a);
    if (!hs || rig_new(&r, m, 4 * per_seq, 1) != 0 || rig_new(&fresh, m, 2 * per_seq, 0) != 0) {
        ok(0, "(c) %s: rig: %s", backend_name, err);
        kvg_prefix_hasher_free(hs);
        return;
    }
    tenant = kvg_pc_tenant(r.pc, "family", 6, 0);
    if (tenant < 0 || kvg_pc_salt_root(r.pc, hs, "family", 6, root, err, sizeof err) != 0) {
        diag("(c) tenant: %s", err);
        good = 0;
    }
    /* a: SHARED tokens then 4 of its own; its full blocks published once written. */
    if (good && (run_init(&a, m, SHARED + 4, N_DECODE, 7) != 0 || admit(&r, hs, tenant, root, &a, ha, &nha) != 0
                 || run_alone(&r, &a, (const int[]){ 40 }, 1) != 0)) {
        diag("(c) the first sequence: %s", err);
        good = 0;
    }
    for (size_t i = 0; good && i < nha; i++)
        kvg_pc_commit(r.pc, &a.seq, (int32_t)i, ha[i], tenant, 0, 0);
    /* b[0] while a holds the blocks, b[1] after a released them: SHARED tokens of a, then
     * 10 (b[0]) or 13 (b[1]) of their own; against the same prompts on a fresh pool. */
    for (int k = 0; k < 2 && good; k++) {
        int n = SHARED + 10 + 3 * k;
        if (k == 1)
            kvg_pc_release(r.pc, &a.seq, 0);
        if (run_init(&b[k], m, n, N_DECODE, 20 + (uint64_t)k) != 0 || run_init(&scratch[k], m, n, N_DECODE, 20 + (uint64_t)k) != 0) {
            good = 0;
            break;
        }
        memcpy(b[k].toks, a.toks, SHARED * sizeof(int32_t));
        memcpy(scratch[k].toks, a.toks, SHARED * sizeof(int32_t));
        hits[k] = admit(&r, hs, tenant, root, &b[k], hb, &nhb);
        if (hits[k] < 0 || run_alone(&r, &b[k], NULL, 0) != 0 || run_alone(&fresh, &scratch[k], NULL, 0) != 0) {
            diag("(c) %s: %s", k ? "after release" : "shared", err);
            good = 0;
            break;
        }
        if (hits[k] != SHARED) {
            diag("(c) %s: the cache served %d tokens, not the %d of the published prefix", k ? "after release" : "shared",
                 (int)hits[k], SHARED);
            good = 0;
        }
        if (!same(&scratch[k], &b[k], V, k ? "(c) hit on cached blocks" : "(c) hit on shared blocks"))
            good = 0;
        kvg_pc_release(r.pc, &b[k].seq, 0);
        kvg_kv_seq_release(fresh.kv, &scratch[k].seq);
    }
    if (good && kvg_pc_check(r.pc, NULL, 0, err, sizeof err) != 0) {
        diag("(c) the cache's invariants: %s", err);
        good = 0;
    }
    ok(good, "(c) %s: a %d-token prefix served from the prefix cache (blocks shared with a live sequence: %d tokens; "
       "cached after its release: %d): bit-identical logits and %d greedy tokens to computing it from scratch",
       backend_name, SHARED, (int)hits[0], (int)hits[1], N_DECODE);
    if (a.seq.n_tokens && r.pc)
        kvg_pc_release(r.pc, &a.seq, 0);
    run_free(&a, NULL);
    for (int k = 0; k < 2; k++) {
        run_free(&b[k], NULL);
        run_free(&scratch[k], NULL);
    }
    rig_free(&r);
    rig_free(&fresh);
    kvg_prefix_hasher_free(hs);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL;
    kvg_model_load_opts lo;
    kvg_model *m;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model_path = argv[i + 1];
        else if (!strcmp(argv[i], "--backend"))
            backend_name = argv[i + 1];
        else if (!strcmp(argv[i], "--threads"))
            n_threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--decode"))
            n_decode = atoi(argv[i + 1]);
        else
            model_path = NULL, i = argc;
    }
    if (!model_path || argc % 2 != 1 || n_threads < 1 || n_threads > 256 || n_decode < 1 || n_decode > 16
        || (strcmp(backend_name, "cpu") && strcmp(backend_name, "cuda"))) {
        fprintf(stderr, "usage: family_check --model F.gguf [--backend cpu|cuda] [--threads N] [--decode 1..16]\n");
        return 2;
    }
    memset(&lo, 0, sizeof lo);
    m = kvg_model_load(model_path, &lo, err, sizeof err);
    if (!ok(m != NULL, "load %s", model_path)) {
        diag("%s", err);
        return done_testing();
    }
    if (m->cfg.max_seq_len < N_PROMPT + 16 + N_DECODE + 4) {
        ok(0, "the model's context (%d) holds the checks' %d positions", m->cfg.max_seq_len, N_PROMPT + 36);
        kvg_model_free(m);
        return done_testing();
    }
    diag("%s: arch %s, %d layers, dim %d, %d/%d heads, vocab %d; backend %s, %d threads", model_path, m->cfg.arch,
         m->cfg.n_layers, m->cfg.dim, m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.vocab_size, backend_name, n_threads);
    check_chunks(m);
    check_batch(m);
    check_cache(m);
    kvg_model_free(m);
    return done_testing();
}
