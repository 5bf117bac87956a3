/* The forward pass: correctness against a naive run.c-style reference, and batch
 * invariance -- a sequence's logits are BIT-identical whether its prompt is prefilled
 * in one chunk, in chunks of 1, 7 or 16, in random chunks, alongside other sequences in
 * random batch mixes, with 1 or 2 threads, and with other KV block sizes; forks share
 * blocks and copy on write. A 150-token prompt also, whose attention takes 4 rows of
 * a sequence at a time, against the same prompt fed a token at a time. Models: stories260K (../shared), synthetic:260K-bf16, and
 * two hand-built models covering biases, rotate-half RoPE, Llama 3 rope scaling,
 * head_dim != dim/n_heads, GQA and MHA, tied and untied output, F16/BF16/F32. The same
 * invariance (chunkings, batch mixes, threads, block sizes, forks, every ISA) with an
 * int8 KV pool (--kv-dtype int8, kv_cache.h: the first layer F32, the deeper ones int8). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"
#include "backend.h"
#include "cpu/gemm.h"
#include "engine_testmodel.h"
#include "forward.h"
#include "kv_cache.h"
#include "kv_cache_testing.h"
#include "model.h"
#include "ref_forward.h"

typedef struct rig {
    const kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
} rig;

/* The KV pool's dtype and F32 layers for the rigs (kv_cache.h). */
static int kv_dtype = KVG_KV_F32, kv_full_layers;

static int rig_new(rig *r, const kvg_model *m, int threads, int block_tokens, int n_blocks)
{
    char err[256];
    kvg_kv_geom g;
    memset(r, 0, sizeof *r);
    r->m = m;
    r->be = kvg_backend_cpu_new(m, threads, err, sizeof err);
    kvg_forward_kv_geom(m, block_tokens, &g);
    g.dtype = kv_dtype;
    g.full_layers = kv_full_layers;
    r->kv = r->be ? kvg_kv_pool_new(&g, n_blocks, err, sizeof err) : NULL;
    r->fw = r->kv ? kvg_forward_new(m, r->be, r->kv, err, sizeof err) : NULL;
    if (!r->fw) {
        diag("rig: %s", err);
        return -1;
    }
    return 0;
}

static void rig_free(rig *r)
{
    kvg_forward_free(r->fw);
    kvg_kv_pool_free(r->kv);
    kvg_backend_free(r->be);
}

/* A sequence script: a prompt, then tokens fed one at a time; logits are recorded
 * after the prompt and after every continuation token (n_cont + 1 records). */
typedef struct script {
    int32_t *toks;
    int n_prompt, n_cont;
    float *rec;                  /* (n_cont + 1) * vocab */
} script;

static uint64_t rng_state = 12345;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static int rnd_in(int lo, int hi)
{
    return lo + (int)(rnd() % (uint32_t)(hi - lo + 1));
}

static void script_init(script *s, const kvg_model *m, int n_prompt, int n_cont)
{
    int V = m->cfg.vocab_size;
    s->n_prompt = n_prompt;
    s->n_cont = n_cont;
    s->toks = malloc((size_t)(n_prompt + n_cont) * sizeof *s->toks);
    s->rec = calloc((size_t)(n_cont + 1) * V, sizeof(float));
    for (int i = 0; i < n_prompt + n_cont; i++)
        s->toks[i] = i == 0 && m->bos >= 0 ? m->bos : (int32_t)rnd_in(3, V - 1);
}

static void script_free(script *s)
{
    free(s->toks);
    free(s->rec);
}

/* Live state of one script in a run. */
typedef struct runner {
    script *sc;
    kvg_kv_seq seq;
    int fed;                     /* tokens consumed */
    float *out;                  /* where this run records (n_cont + 1) * vocab */
} runner;

/* Feeds `n` tokens of each selected runner in one step, in the order given. */
static int step(rig *r, runner **rs, const int *n_tok, int n, char *err, size_t err_len)
{
    kvg_fwd_seq b[16];
    int V = r->m->cfg.vocab_size;
    for (int i = 0; i < n; i++) {
        runner *u = rs[i];
        int end = u->fed + n_tok[i];
        b[i].kv = &u->seq;
        b[i].tokens = u->sc->toks + u->fed;
        b[i].n_tokens = n_tok[i];
        b[i].logits = end >= u->sc->n_prompt ? u->out + (size_t)(end - u->sc->n_prompt) * V : NULL;
    }
    if (kvg_forward_step(r->fw, b, n, err, err_len) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        rs[i]->fed += n_tok[i];
    return 0;
}

/* Runs one script alone: the prompt in chunks of `chunk` (0: whole; -1: random
 * sizes 1..20), then the continuation token by token. */
static int run_alone(rig *r, script *sc, int chunk, float *out)
{
    runner u = { sc, { 0 }, 0, out };
    char err[256];
    int rc = 0;
    while (u.fed < sc->n_prompt + sc->n_cont) {
        runner *p = &u;
        int n;
        if (u.fed < sc->n_prompt) {
            n = chunk == 0 ? sc->n_prompt : chunk < 0 ? rnd_in(1, 20) : chunk;
            if (n > sc->n_prompt - u.fed)
                n = sc->n_prompt - u.fed;
        } else {
            n = 1;
        }
        if (step(r, &p, &n, 1, err, sizeof err) != 0) {
            diag("run_alone: %s", err);
            rc = -1;
            break;
        }
    }
    kvg_kv_seq_release(r->kv, &u.seq);
    return rc;
}

/* Runs several scripts together with random batch mixes: each step takes a random
 * subset of the unfinished ones in random order; prompts advance by random chunks,
 * continuations by one token. */
static int run_mixed(rig *r, script *scs, int n_sc, float **outs)
{
    runner us[16];
    char err[256];
    int left = n_sc, rc = 0;
    for (int i = 0; i < n_sc; i++) {
        us[i].sc = &scs[i];
        kvg_kv_seq_init(&us[i].seq);
        us[i].fed = 0;
        us[i].out = outs[i];
    }
    while (left > 0) {
        runner *pick[16];
        int n_tok[16], n = 0;
        for (int i = 0; i < n_sc; i++) {
            runner *u = &us[i];
            if (u->fed == u->sc->n_prompt + u->sc->n_cont || rnd() % 3 == 0)
                continue;
            pick[n] = u;
            if (u->fed < u->sc->n_prompt) {
                n_tok[n] = rnd_in(1, 20);
                if (n_tok[n] > u->sc->n_prompt - u->fed)
                    n_tok[n] = u->sc->n_prompt - u->fed;
            } else {
                n_tok[n] = 1;
            }
            n++;
        }
        if (n == 0)
            continue;
        /* shuffle the batch order */
        for (int i = n - 1; i > 0; i--) {
            int j = rnd_in(0, i);
            runner *t = pick[i]; pick[i] = pick[j]; pick[j] = t;
            int tn = n_tok[i]; n_tok[i] = n_tok[j]; n_tok[j] = tn;
        }
        if (step(r, pick, n_tok, n, err, sizeof err) != 0) {
            diag("run_mixed: %s", err);
            rc = -1;
            break;
        }
        left = 0;
        for (int i = 0; i < n_sc; i++)
            left += us[i].fed < us[i].sc->n_prompt + us[i].sc->n_cont;
    }
    for (int i = 0; i < n_sc; i++)
        kvg_kv_seq_release(r->kv, &us[i].seq);
    return rc;
}

static size_t rec_bytes(const kvg_model *m, const script *s)
{
    return (size_t)(s->n_cont + 1) * (size_t)m->cfg.vocab_size * sizeof(float);
}

/* Engine vs the naive reference at every recorded position. */
static void check_reference(const kvg_model *m, const char *name, script *sc)
{
    ref_model ref;
    int V = m->cfg.vocab_size;
    double maxdiff = 0.0, maxabs = 0.0;
    int argmax_same = 1;
    if (kv_dtype != KVG_KV_F32)
        return;                  /* int8 KV: its error is measured by t/unit/kv_int8_quality.c */
    if (ref_init(&ref, m, sc->n_prompt + sc->n_cont) != 0) {
        ok(0, "%s: reference init", name);
        return;
    }
    for (int p = 0; p < sc->n_prompt + sc->n_cont; p++) {
        float *l = ref_forward(&ref, sc->toks[p], p);
        if (p >= sc->n_prompt - 1) {
            const float *e = sc->rec + (size_t)(p - (sc->n_prompt - 1)) * V;
            int ra = 0, ea = 0;
            for (int i = 0; i < V; i++) {
                double d = fabs((double)l[i] - (double)e[i]);
                if (d > maxdiff || d != d)
                    maxdiff = d != d ? 1e30 : d;
                if (fabs(l[i]) > maxabs)
                    maxabs = fabs(l[i]);
                if (l[i] > l[ra])
                    ra = i;
                if (e[i] > e[ea])
                    ea = i;
            }
            argmax_same &= ra == ea;
        }
    }
    ok(maxdiff <= 1e-4 * (maxabs > 1.0 ? maxabs : 1.0),
       "%s: logits match the naive reference at %d positions (max diff %.3g, max |logit| %.3g)",
       name, sc->n_cont + 1, maxdiff, maxabs);
    ok(argmax_same, "%s: same argmax as the reference at every position", name);
    ref_free(&ref);
}

static void invariance_suite(const kvg_model *m, const char *name)
{
    rig r1, r2, r5;
    script main_sc, others[4];
    float *buf;
    size_t rb;
    int n_prompt = 45, n_cont = 6;

    if (rig_new(&r1, m, 1, 16, 64) != 0 || rig_new(&r2, m, 2, 16, 64) != 0 ||
        rig_new(&r5, m, 2, 5, 200) != 0) {
        ok(0, "%s: rigs", name);
        return;
    }
    script_init(&main_sc, m, n_prompt, n_cont);
    rb = rec_bytes(m, &main_sc);
    buf = malloc(rb);

    /* Baseline: one chunk, 1 thread. */
    ok(run_alone(&r1, &main_sc, 0, main_sc.rec) == 0, "%s: baseline run", name);
    check_reference(m, name, &main_sc);

    {
        static const int chunks[] = { 1, 7, 16 };
        for (int t = 1; t <= 2; t++) {
            rig *r = t == 1 ? &r1 : &r2;
            for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
                memset(buf, 0xff, rb);
                run_alone(r, &main_sc, chunks[c], buf);
                ok(memcmp(buf, main_sc.rec, rb) == 0, "%s: chunks of %d, %d thread(s): bit-identical",
                   name, chunks[c], t);
            }
            memset(buf, 0xff, rb);
            run_alone(r, &main_sc, 0, buf);
            ok(memcmp(buf, main_sc.rec, rb) == 0, "%s: one chunk, %d thread(s): bit-identical", name, t);
            for (int k = 0; k < 3; k++) {
                memset(buf, 0xff, rb);
                run_alone(r, &main_sc, -1, buf);
                ok(memcmp(buf, main_sc.rec, rb) == 0, "%s: random chunking #%d, %d thread(s): "
                   "bit-identical", name, k, t);
            }
        }
        memset(buf, 0xff, rb);
        run_alone(&r5, &main_sc, 7, buf);
        ok(memcmp(buf, main_sc.rec, rb) == 0, "%s: KV blocks of 5 tokens: bit-identical", name);
    }

    /* Batch mixes: the main script and up to four others, each checked against its
     * own run alone. */
    for (int mix = 0; mix < 4; mix++) {
        rig *r = mix % 2 ? &r2 : &r1;
        int n_other = rnd_in(1, 4), all_same = 1, main_same;
        script scs[5];
        float *outs[5];
        scs[0] = main_sc;
        for (int i = 0; i < n_other; i++) {
            script_init(&others[i], m, rnd_in(1, 40), rnd_in(0, 8));
            run_alone(&r1, &others[i], 0, others[i].rec);
            scs[1 + i] = others[i];
        }
        for (int i = 0; i < 1 + n_other; i++) {
            outs[i] = malloc(rec_bytes(m, &scs[i]));
            memset(outs[i], 0xff, rec_bytes(m, &scs[i]));
        }
        ok(run_mixed(r, scs, 1 + n_other, outs) == 0, "%s: mix #%d runs", name, mix);
        main_same = memcmp(outs[0], main_sc.rec, rb) == 0;
        for (int i = 1; i < 1 + n_other; i++)
            all_same &= memcmp(outs[i], scs[i].rec, rec_bytes(m, &scs[i])) == 0;
        ok(main_same, "%s: mix #%d (%d sequences, %d thread(s)): main sequence bit-identical",
           name, mix, 1 + n_other, mix % 2 ? 2 : 1);
        ok(all_same, "%s: mix #%d: every other sequence bit-identical to its run alone", name, mix);
        for (int i = 0; i < 1 + n_other; i++)
            free(outs[i]);
        for (int i = 0; i < n_other; i++)
            script_free(&others[i]);
    }
    is_int(kvg_kv_pool_free_blocks(r1.kv), 64, "%s: every block returned to the pool", name);

    free(buf);
    script_free(&main_sc);
    rig_free(&r1);
    rig_free(&r2);
    rig_free(&r5);
}

/* A prompt long enough that the attention takes 4 rows of one sequence at a time
 * (attend_rows: every row past position 64) against the same prompt fed one token at a
 * time (never) and in other chunkings, threads and block sizes (5: never). */
static void long_prompt_suite(const kvg_model *m, const char *name)
{
    rig r1, r2, r5;
    script sc;
    float *buf;
    size_t rb;

    if (rig_new(&r1, m, 1, 16, 64) != 0 || rig_new(&r2, m, 2, 16, 64) != 0 ||
        rig_new(&r5, m, 2, 5, 200) != 0) {
        ok(0, "%s: rigs", name);
        return;
    }
    script_init(&sc, m, 150, 3);
    rb = rec_bytes(m, &sc);
    buf = malloc(rb);
    ok(run_alone(&r1, &sc, 0, sc.rec) == 0, "%s: 150-token prompt in one step", name);
    check_reference(m, name, &sc);
    {
        static const struct { int threads, chunk; } runs[] = { { 1, 1 }, { 2, 1 }, { 2, 0 }, { 1, 37 },
                                                               { 2, 70 }, { 2, -1 } };
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
            memset(buf, 0xff, rb);
            run_alone(runs[i].threads == 1 ? &r1 : &r2, &sc, runs[i].chunk, buf);
            ok(memcmp(buf, sc.rec, rb) == 0, "%s: 150-token prompt, chunks of %d, %d thread(s): bit-identical",
               name, runs[i].chunk, runs[i].threads);
        }
        memset(buf, 0xff, rb);
        run_alone(&r5, &sc, 0, buf);
        ok(memcmp(buf, sc.rec, rb) == 0, "%s: 150-token prompt, KV blocks of 5 tokens: bit-identical", name);
    }
    free(buf);
    script_free(&sc);
    rig_free(&r1);
    rig_free(&r2);
    rig_free(&r5);
}

/* Fork after a prompt whose last block is partial: both branches share the blocks,
 * the first write into the shared partial block copies it, and each branch gives the
 * same logits as the same tokens run alone. */
static void fork_suite(const kvg_model *m, const char *name)
{
    rig r;
    script a, b;
    int n_prompt = 21, n_cont = 5, V = m->cfg.vocab_size;
    kvg_kv_seq sa, sb;
    float *la, *lb;
    char err[256];
    int okk = 1;

    if (rig_new(&r, m, 2, 16, 32) != 0) {
        ok(0, "%s: fork rig", name);
        return;
    }
    script_init(&a, m, n_prompt, n_cont);
    script_init(&b, m, n_prompt, n_cont);
    memcpy(b.toks, a.toks, (size_t)n_prompt * sizeof *a.toks);
    b.toks[n_prompt] = a.toks[n_prompt] == 5 ? 6 : 5;   /* the branches differ at once */
    run_alone(&r, &a, 0, a.rec);
    run_alone(&r, &b, 0, b.rec);

    la = calloc((size_t)(n_cont + 1) * V, sizeof(float));
    lb = calloc((size_t)(n_cont + 1) * V, sizeof(float));
    kvg_kv_seq_init(&sa);
    kvg_kv_seq_init(&sb);
    {
        kvg_fwd_seq s = { &sa, a.toks, n_prompt, la };
        okk &= kvg_forward_step(r.fw, &s, 1, err, sizeof err) == 0;
    }
    okk &= kvg_kv_seq_fork(r.kv, &sa, &sb, err, sizeof err) == 0;
    memcpy(lb, la, (size_t)V * sizeof(float));
    ok(okk, "%s: prefill and fork", name);
    is_int(kvg_kv_block_refcount(r.kv, sa.blocks[0]), 2, "%s: full block shared after fork", name);
    is_int(kvg_kv_block_refcount(r.kv, sa.blocks[1]), 2, "%s: partial block shared after fork", name);
    for (int i = 0; i < n_cont; i++) {
        kvg_fwd_seq s[2] = {
            { &sb, b.toks + n_prompt + i, 1, lb + (size_t)(i + 1) * V },
            { &sa, a.toks + n_prompt + i, 1, la + (size_t)(i + 1) * V },
        };
        okk &= kvg_forward_step(r.fw, s, 2, err, sizeof err) == 0;
        if (i == 0) {
            ok(sa.blocks[1] != sb.blocks[1], "%s: first write copied the shared partial block", name);
            is_int(kvg_kv_block_refcount(r.kv, sa.blocks[0]), 2, "%s: full block still shared", name);
            is_int(kvg_kv_block_refcount(r.kv, sa.blocks[1]), 1, "%s: branch a owns its partial block", name);
            is_int(kvg_kv_block_refcount(r.kv, sb.blocks[1]), 1, "%s: branch b owns its partial block", name);
        }
    }
    ok(okk, "%s: branches decode together", name);
    ok(memcmp(la, a.rec, (size_t)(n_cont + 1) * V * sizeof(float)) == 0,
       "%s: branch a bit-identical to its run alone", name);
    ok(memcmp(lb, b.rec, (size_t)(n_cont + 1) * V * sizeof(float)) == 0,
       "%s: branch b bit-identical to its run alone", name);
    kvg_kv_seq_release(r.kv, &sa);
    kvg_kv_seq_release(r.kv, &sb);
    is_int(kvg_kv_pool_free_blocks(r.kv), 32, "%s: all blocks free after release", name);
    free(la);
    free(lb);
    script_free(&a);
    script_free(&b);
    rig_free(&r);
}

static void count_call(void *arg)
{
    (*(int *)arg)++;
}

/* The progress hook (the engine's heartbeat within a step): called once before each
 * layer, with or without logits, never once it is cleared. */
static void progress_suite(const kvg_model *m, const char *name)
{
    rig r;
    script a;
    kvg_kv_seq sa;
    char err[256];
    int calls = 0, okk = 1, L = m->cfg.n_layers;
    float *lg = calloc((size_t)m->cfg.vocab_size, sizeof(float));

    if (rig_new(&r, m, 1, 16, 32) != 0) {
        ok(0, "%s: progress rig", name);
        free(lg);
        return;
    }
    script_init(&a, m, 20, 2);
    kvg_kv_seq_init(&sa);
    kvg_forward_set_progress(r.fw, count_call, &calls);
    {
        kvg_fwd_seq s = { &sa, a.toks, 10, NULL };
        okk &= kvg_forward_step(r.fw, &s, 1, err, sizeof err) == 0;
    }
    is_int(calls, L, "%s: a prefill chunk without logits calls the hook once a layer", name);
    {
        kvg_fwd_seq s = { &sa, a.toks + 10, 10, lg };
        okk &= kvg_forward_step(r.fw, &s, 1, err, sizeof err) == 0;
    }
    is_int(calls, 2 * L, "%s: a step with logits, once a layer too", name);
    kvg_forward_set_progress(r.fw, NULL, NULL);
    {
        kvg_fwd_seq s = { &sa, a.toks + 20, 1, lg };
        okk &= kvg_forward_step(r.fw, &s, 1, err, sizeof err) == 0;
    }
    ok(okk && calls == 2 * L, "%s: cleared: not called any more", name);
    kvg_kv_seq_release(r.kv, &sa);
    script_free(&a);
    rig_free(&r);
    free(lg);
}

static void error_suite(const kvg_model *m)
{
    rig r;
    kvg_kv_seq s1, s2;
    int32_t toks[40];
    float *logits = malloc((size_t)m->cfg.vocab_size * sizeof(float));
    char err[256];
    int32_t free0;

    if (rig_new(&r, m, 1, 16, 3) != 0) {
        ok(0, "error rig");
        free(logits);
        return;
    }
    for (int i = 0; i < 40; i++)
        toks[i] = 5 + i;
    kvg_kv_seq_init(&s1);
    kvg_kv_seq_init(&s2);
    free0 = kvg_kv_pool_free_blocks(r.kv);
    {
        kvg_fwd_seq b = { &s1, toks, 40, logits };   /* 3 blocks: fits exactly */
        ok(kvg_forward_step(r.fw, &b, 1, err, sizeof err) == 0, "48-token pool takes 40 tokens");
        kvg_fwd_seq c[2] = { { &s2, toks, 5, NULL }, { &s1, toks, 9, NULL } };
        ok(kvg_forward_step(r.fw, c, 2, err, sizeof err) == -1 && strstr(err, "out of blocks"),
           "pool exhausted: error (%s)", err);
        is_int(s1.n_tokens, 40, "  nothing advanced");
        is_int(s2.n_tokens, 0, "  nothing advanced for the other sequence");
        is_int(s2.n_blocks, 0, "  the other sequence's new block was given back");
    }
    kvg_kv_seq_release(r.kv, &s1);
    is_int(kvg_kv_pool_free_blocks(r.kv), free0, "all blocks back");
    {
        /* No bad-token-id case: ids in the vocabulary are a precondition (asserted),
         * rejected where they enter (engine_faults.c, warmup.c, t/engine-golden.t). */
        kvg_fwd_seq d[2] = { { &s1, toks, 1, NULL }, { &s1, toks, 1, NULL } };
        ok(kvg_forward_step(r.fw, d, 2, err, sizeof err) == -1 && strstr(err, "twice"),
           "same sequence twice: error (%s)", err);
        kvg_fwd_seq e = { &s1, toks, 0, NULL };
        ok(kvg_forward_step(r.fw, &e, 1, err, sizeof err) == -1, "zero tokens: error (%s)", err);
        ok(kvg_forward_step(r.fw, &e, 0, err, sizeof err) == -1, "empty batch: error (%s)", err);
        s1.n_tokens = m->cfg.max_seq_len - 1;     /* pretend: context nearly full */
        kvg_fwd_seq f = { &s1, toks, 2, NULL };
        ok(kvg_forward_step(r.fw, &f, 1, err, sizeof err) == -1 && strstr(err, "context length"),
           "past the context length: error (%s)", err);
        s1.n_tokens = 0;
        is_int(kvg_kv_pool_free_blocks(r.kv), free0, "no block leaked by the errors");
    }
    {
        kvg_kv_geom g;
        kvg_kv_pool *p;
        kvg_forward_kv_geom(m, 16, &g);
        g.n_layers++;
        p = kvg_kv_pool_new(&g, 4, err, sizeof err);
        ok(kvg_forward_new(m, r.be, p, err, sizeof err) == NULL && strstr(err, "geometry"),
           "pool of another geometry rejected (%s)", err);
        kvg_kv_pool_free(p);
    }
    kvg_kv_seq_release(r.kv, &s1);
    free(logits);
    rig_free(&r);
}

/* FNV-1a over the logits of fixed scenarios (prefill in chunks of 7, then decode; a
 * long prompt in one step),
 * to compare processes running other kernel ISAs. */
static uint64_t digest(const kvg_model *m, uint64_t h)
{
    rig r;
    script sc;
    const unsigned char *b;
    if (rig_new(&r, m, 2, 16, 16) != 0)
        return 0;
    rng_state = 99;
    script_init(&sc, m, 40, 6);
    run_alone(&r, &sc, 7, sc.rec);
    b = (const unsigned char *)sc.rec;
    for (size_t i = 0; i < rec_bytes(m, &sc); i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    script_free(&sc);
    rig_free(&r);
    /* and 150 prompt tokens in one step: the attention's rows kernels */
    if (rig_new(&r, m, 2, 16, 16) != 0)
        return 0;
    script_init(&sc, m, 150, 2);
    run_alone(&r, &sc, 0, sc.rec);
    b = (const unsigned char *)sc.rec;
    for (size_t i = 0; i < rec_bytes(m, &sc); i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    script_free(&sc);
    rig_free(&r);
    return h;
}

/* The digest of models a and b with an F32 KV pool, then with an int8 one (the first
 * layer F32): the int8 attention kernels of each ISA too. */
static uint64_t digest_all(const kvg_model *a, const kvg_model *b)
{
    uint64_t h = digest(b, digest(a, 0xcbf29ce484222325ull));
    kv_dtype = KVG_KV_INT8;
    kv_full_layers = 1;
    h = digest(b, digest(a, h));
    kv_dtype = KVG_KV_F32;
    kv_full_layers = 0;
    return h;
}

/* The same logits bits with every kernel ISA this CPU has: children re-run this program
 * with KVG_GEMM_ISA forced (the attention kernels follow the GEMM's choice). */
static void isa_suite(const kvg_model *a, const kvg_model *b)
{
    static const char *isas[] = { "generic", "avx2", "avx512" };
    char self[512], cmd[700], line[256] = "";
    uint64_t mine = digest_all(a, b);
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        ok(0, "readlink /proc/self/exe");
        return;
    }
    self[n] = '\0';
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        FILE *f;
        char got_isa[32] = "";
        unsigned long long got = 0;
        snprintf(cmd, sizeof cmd, "KVG_GEMM_ISA=%s KVG_ENGINE_DIGEST=1 '%s'", isas[i], self);
        f = popen(cmd, "r");
        while (f && fgets(line, sizeof line, f) && strncmp(line, "DIGEST ", 7) != 0)
            ;
        if (!f || sscanf(line, "DIGEST %31s %llx", got_isa, &got) != 2) {
            ok(0, "digest child for %s", isas[i]);
            if (f)
                pclose(f);
            continue;
        }
        pclose(f);
        if (strcmp(got_isa, isas[i]) != 0) {
            diag("%s not supported here (child ran %s): skipped", isas[i], got_isa);
            continue;
        }
        ok(got == mine, "kernels %s: logits bit-identical to this process's (%s)", isas[i], kvg_gemm_isa());
    }
}

int main(void)
{
    char path[512], tpath[512], err[512];
    kvg_model_load_opts lo;
    kvg_model *stories, *syn;
    tm_model ta, tb;

    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.bin", shared_dir());
    snprintf(tpath, sizeof tpath, "%s/models/stories260K/tok512.bin", shared_dir());
    memset(&lo, 0, sizeof lo);
    lo.tokenizer_path = tpath;
    stories = kvg_model_load(path, &lo, err, sizeof err);
    if (!ok(stories != NULL, "load stories260K"))
        diag("%s", err);
    memset(&lo, 0, sizeof lo);
    syn = kvg_model_load("synthetic:260K-bf16", &lo, err, sizeof err);
    if (!ok(syn != NULL, "load synthetic:260K-bf16"))
        diag("%s", err);
    {
        tm_spec a = { 48, 80, 2, 4, 2, 16, 97, 256, 1, 0, 1, 1, 1, 7 };
        tm_spec b = { 40, 64, 3, 5, 5, 8, 61, 256, 0, 1, 0, 0, 0, 9 };
        ok(tm_build(&ta, &a) == 0, "build test model A (qwen2-like: biases, rotate-half, llama3 "
           "scaling, head_dim 16 != 48/4, GQA 4:2, untied, F16/BF16/F32)");
        ok(tm_build(&tb, &b) == 0, "build test model B (MHA, adjacent RoPE, tied, F32)");
    }

    if (getenv("KVG_ENGINE_DIGEST")) {
        printf("DIGEST %s %016llx\n", kvg_gemm_isa(),
               (unsigned long long)digest_all(&ta.m, &tb.m));
        tm_free(&ta);
        tm_free(&tb);
        kvg_model_free(stories);
        kvg_model_free(syn);
        return 0;
    }
    if (stories) {
        invariance_suite(stories, "stories260K");
        fork_suite(stories, "stories260K");
        progress_suite(stories, "stories260K");
        error_suite(stories);
    }
    if (syn)
        invariance_suite(syn, "synthetic:260K-bf16");
    invariance_suite(&ta.m, "test model A");
    fork_suite(&ta.m, "test model A");
    invariance_suite(&tb.m, "test model B");
    if (stories)
        long_prompt_suite(stories, "stories260K");
    long_prompt_suite(&ta.m, "test model A");
    long_prompt_suite(&tb.m, "test model B");
    isa_suite(&ta.m, &tb.m);

    /* int8 KV: the first layer F32, the deeper ones int8 */
    kv_dtype = KVG_KV_INT8;
    kv_full_layers = 1;
    if (stories) {
        invariance_suite(stories, "stories260K int8 KV");
        fork_suite(stories, "stories260K int8 KV");
        long_prompt_suite(stories, "stories260K int8 KV");
    }
    invariance_suite(&ta.m, "test model A int8 KV");
    long_prompt_suite(&ta.m, "test model A int8 KV");
    invariance_suite(&tb.m, "test model B int8 KV");
    {
        /* the family features that change which positions a row sees and how it weighs
         * them, on int8 layers: sliding windows (layers 0 and 2), soft-capped scores,
         * attention sinks */
        tm_spec fs = { 48, 80, 3, 4, 2, 16, 97, 256, 0, 0, 1, 0, 1, 21 };
        tm_family ff = { .swa_window = 20, .swa_period = 2, .attn_softcap = 30.0f, .sinks = 1 };
        tm_model tf;
        if (ok(tm_build(&tf, &fs) == 0 && tm_apply_family(&tf, &ff, fs.seed) == 0,
               "test model C (windows, soft-cap, sinks)")) {
            invariance_suite(&tf.m, "test model C int8 KV (windows, soft-cap, sinks)");
            long_prompt_suite(&tf.m, "test model C int8 KV (windows, soft-cap, sinks)");
        }
        tm_free(&tf);
    }
    kv_full_layers = 0;
    long_prompt_suite(&tb.m, "test model B int8 KV, every layer");
    kv_dtype = KVG_KV_F32;

    kvg_model_free(stories);
    kvg_model_free(syn);
    tm_free(&ta);
    tm_free(&tb);
    return done_testing();
}
