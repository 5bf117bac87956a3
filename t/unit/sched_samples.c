/* Samples in waves and per-sample cancel (kvg_sched_req.n_active, kvg_sched_samples) on
 * stories260K: with n_active 2 of n = 5 only two samples decode until a draw; samples
 * drawn later (even after every other sample finished) produce exactly the tokens and
 * logprobs of an n = 5 run all at once; cancelling one running sample gives its own
 * blocks back at once while the prompt's shared blocks stay, and leaves the other
 * samples' tokens unchanged; undrawn samples cancelled are dropped (FINISHED cancelled,
 * no tokens) and the request ends with DONE; the pool returns to its baseline; the
 * statistics count started, cancelled and dropped samples. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "sched_rig.h"
#include "prefix_cache_testing.h"

#define MAXR 16
#define MAXT 64
#define PLEN 37                  /* 4 full blocks of 8 and a partial one */
#define MAXTOK 20

typedef struct out {
    int32_t tok[KVG_SCHED_MAX_N][MAXT];
    float lp[KVG_SCHED_MAX_N][MAXT];
    int n[KVG_SCHED_MAX_N];
    int finished[KVG_SCHED_MAX_N];
    kvg_finish_reason reason[KVG_SCHED_MAX_N];
    int done, completion;
} out;

static out outs[MAXR];
static kvg_sched *S;
/* A cancel sent from inside the callback (a step is running): when sample hook_j of
 * request hook_id has hook_at tokens, cancel it. */
static uint64_t hook_id;
static int hook_j = -1, hook_at;

static void on_event(void *ctx, const kvg_sched_event *ev)
{
    out *o = &outs[ev->id];
    (void)ctx;
    switch (ev->kind) {
    case KVG_SEV_TOKEN:
        if (o->n[ev->sample] < MAXT) {
            o->tok[ev->sample][o->n[ev->sample]] = ev->token;
            o->lp[ev->sample][o->n[ev->sample]] = ev->logprob;
        }
        o->n[ev->sample]++;
        if (ev->id == hook_id && ev->sample == hook_j && o->n[ev->sample] == hook_at)
            kvg_sched_samples(S, ev->id, 0, 1u << hook_j);
        break;
    case KVG_SEV_FINISHED:
        o->finished[ev->sample]++;
        o->reason[ev->sample] = ev->reason;
        break;
    case KVG_SEV_DONE:
        o->done++;
        o->completion = ev->completion_tokens;
        break;
    default:
        break;
    }
}

static kvg_model *M;
static kvg_backend *BE;
static int32_t PROMPT[PLEN];
static const kvg_sampler_params SEEDED = { 1.0f, 0, 0.9f, 4242 };

static int rig_new(sched_rig *r, int n_blocks)
{
    sched_rig_opts o;
    memset(&o, 0, sizeof o);
    o.m = M;
    o.be = BE;
    o.n_blocks = n_blocks;
    o.sc.max_batch_tokens = 64;
    o.cb = on_event;
    o.tenant = "t";
    if (sched_rig_new(r, &o) != 0)
        return -1;
    S = r->s;
    return 0;
}

static void submit(sched_rig *r, uint64_t id, int n, int n_active)
{
    char err[256];
    kvg_sched_req q;
    memset(&outs[id], 0, sizeof outs[id]);
    sched_rig_req(r, &q, id, PROMPT, PLEN);
    q.sp = SEEDED;
    q.n = n;
    q.n_active = n_active;
    q.max_tokens = MAXTOK;
    if (sched_rig_submit(r, &q, err, sizeof err) != 0)
        diag("submit %llu: %s", (unsigned long long)id, err);
}

static int step(sched_rig *r)
{
    char err[256];
    int rows = kvg_sched_step(r->s, err, sizeof err);
    if (rows < 0)
        diag("step: %s", err);
    return rows;
}

/* Sample j of request id has exactly the tokens and logprobs of the reference's (ref),
 * or, with prefix, its first o->n[j] of them. */
static int same_sample(uint64_t id, uint64_t ref, int j, int prefix)
{
    const out *o = &outs[id], *w = &outs[ref];
    if (prefix ? o->n[j] > w->n[j] : o->n[j] != w->n[j])
        return 0;
    return memcmp(o->tok[j], w->tok[j], (size_t)o->n[j] * sizeof o->tok[0][0]) == 0 &&
           memcmp(o->lp[j], w->lp[j], (size_t)o->n[j] * sizeof o->lp[0][0]) == 0;
}

static int32_t used_blocks(const sched_rig *r)
{
    kvg_pc_stats st;
    kvg_pc_get_stats(r->pc, &st);
    return st.blocks_used;
}

/* Back to the baseline: nothing in use, every invariant holds. */
static void baseline(const sched_rig *r, const char *what)
{
    char err[256];
    is_int(used_blocks(r), 0, "%s: no block in use once it ended", what);
    ok(kvg_pc_check(r->pc, NULL, 0, err, sizeof err) == 0, "%s: cache invariants hold", what) ? (void)0
                                                                                               : diag("%s", err);
}

int main(void)
{
    char err[512];
    sched_rig r;
    kvg_sched_stats st0, st;
    uint64_t rng = 99;

    M = sched_rig_stories260k(err, sizeof err);
    if (!M) {
        diag("%s", err);
        ok(0, "load stories260K");
        return done_testing();
    }
    BE = kvg_backend_cpu_new(M, 1, err, sizeof err);
    PROMPT[0] = M->bos >= 0 ? M->bos : 1;
    for (int i = 1; i < PLEN; i++)
        PROMPT[i] = sched_rig_rnd_tok(&rng, M->cfg.vocab_size);
    if (rig_new(&r, 128) != 0) {
        ok(0, "rig");
        return done_testing();
    }

    /* 1. The reference: n = 5 all at once. */
    submit(&r, 1, 5, 0);
    ok(sched_rig_drain(&r, 200) == 0 && outs[1].done == 1, "reference n=5 completes");
    {
        int all = 1;
        for (int j = 0; j < 5; j++)
            all &= outs[1].n[j] == MAXTOK;
        ok(all, "  every sample has %d tokens", MAXTOK);
        ok(memcmp(outs[1].tok[0], outs[1].tok[1], 5 * sizeof(int32_t)) != 0, "  the samples differ");
    }
    baseline(&r, "reference");

    /* 2. n_active 2: two decode until a draw; the three drawn later equal the reference. */
    kvg_sched_get_stats(r.s, &st0);
    submit(&r, 2, 5, 2);
    {
        int rows_ok = 1;
        for (int k = 0; k < 30 && outs[2].n[0] < 6; k++) {
            int rows = step(&r);
            if (outs[2].n[0] >= 2)
                rows_ok &= rows == 2;   /* one decode row per drawn sample, nothing else */
        }
        ok(outs[2].n[0] == 6 && outs[2].n[1] == 6, "n_active 2: samples 0 and 1 decode (%d, %d tokens)",
           outs[2].n[0], outs[2].n[1]);
        ok(outs[2].n[2] == 0 && outs[2].n[3] == 0 && outs[2].n[4] == 0 && !outs[2].finished[2],
           "  samples 2..4 wait, undrawn");
        ok(rows_ok, "  each decode step computes exactly 2 rows");
        /* The prompt's 5 blocks stay for the undrawn samples; each drawn sample has its
         * copy of the partial block and its next block. */
        int32_t u = used_blocks(&r);
        ok(u == 5 + 2 * 2, "  blocks in use: the prompt's 5 + 2 per drawn sample (%d)", (int)u);
        kvg_sched_get_stats(r.s, &st);
        ok(st.samples_started == st0.samples_started + 2, "  samples_started counts the 2 started");
    }
    ok(kvg_sched_samples(r.s, 2, 1, 0) == 0, "draw 1 (from outside a step)");
    ok(outs[2].n[2] == 1 && outs[2].n[3] == 0, "  sample 2 starts at once with its first token off the kept prompt");
    for (int k = 0; k < 3; k++)
        step(&r);
    ok(kvg_sched_samples(r.s, 2, 9, 0) == 0, "draw 9 more: clamped to the 2 left");
    ok(sched_rig_drain(&r, 200) == 0 && outs[2].done == 1, "  the request completes with one DONE");
    {
        int same = 1;
        for (int j = 0; j < 5; j++)
            same &= same_sample(2, 1, j, 0);
        ok(same, "the 5 samples drawn in three waves equal the n=5 run at once, tokens and logprobs");
        is_int(outs[2].completion, 5 * MAXTOK, "  DONE counts every generated token");
        kvg_sched_get_stats(r.s, &st);
        ok(st.samples_started == st0.samples_started + 5 && st.samples_cancelled == st0.samples_cancelled &&
           st.samples_dropped == st0.samples_dropped, "  5 started, none cancelled or dropped");
    }
    baseline(&r, "waves");

    /* 3. A later wave after every drawn sample finished: the request lives on its kept
     * prompt alone, without DONE, until the next draw. */
    submit(&r, 3, 4, 1);
    for (int k = 0; k < 60 && !outs[3].finished[0]; k++)
        step(&r);
    ok(outs[3].finished[0] == 1 && !outs[3].done && kvg_sched_pending(r.s) == 1,
       "n=4, n_active 1: sample 0 finished, the request waits for a draw (no DONE)");
    ok(used_blocks(&r) == 5, "  it holds only the prompt's 5 blocks (%d)", (int)used_blocks(&r));
    is_int(step(&r), 0, "  and computes nothing");
    kvg_sched_samples(r.s, 3, 3, 0);
    ok(sched_rig_drain(&r, 200) == 0 && outs[3].done == 1, "draw 3: the request completes");
    {
        int same = 1;
        for (int j = 0; j < 4; j++)
            same &= same_sample(3, 1, j, 0);
        ok(same, "  samples started after the first one finished equal the reference");
    }
    baseline(&r, "late wave");

    /* 4. Cancel running samples: one from outside a step, one from inside (the event
     * callback); the others are unchanged. */
    kvg_sched_get_stats(r.s, &st0);
    submit(&r, 4, 5, 0);
    hook_id = 4;
    hook_j = 3;
    hook_at = 12;
    for (int k = 0; k < 30 && outs[4].n[1] < 8; k++)
        step(&r);
    {
        int32_t before = used_blocks(&r);
        /* its sequence: 37 prompt + 7 fed tokens = 44 positions in 6 blocks, of which
         * the 4 full prompt blocks are shared: 2 are its own */
        ok(kvg_sched_samples(r.s, 4, 0, 1u << 1) == 0, "cancel sample 1 at %d tokens", outs[4].n[1]);
        int32_t after = used_blocks(&r);
        ok(outs[4].finished[1] == 1 && outs[4].reason[1] == KVG_FINISH_CANCELLED && outs[4].n[1] == 8,
           "  FINISHED cancelled at once, with its 8 tokens");
        is_int(before - after, 2, "  blocks in use drop at once by its own 2 (%d -> %d); the shared prompt "
               "blocks stay", (int)before, (int)after);
        ok(!outs[4].done, "  the request goes on");
        ok(kvg_sched_samples(r.s, 4, 0, 1u << 1) == 0 && outs[4].finished[1] == 1,
           "  a second cancel of the finished sample is ignored");
    }
    ok(sched_rig_drain(&r, 200) == 0 && outs[4].done == 1, "the request completes");
    hook_j = -1;
    ok(outs[4].finished[3] == 1 && outs[4].reason[3] == KVG_FINISH_CANCELLED && outs[4].n[3] == 12,
       "sample 3 cancelled from the callback stops within its step (%d tokens)", outs[4].n[3]);
    ok(same_sample(4, 1, 0, 0) && same_sample(4, 1, 2, 0) && same_sample(4, 1, 4, 0),
       "samples 0, 2, 4 equal the run without cancels");
    ok(same_sample(4, 1, 1, 1) && same_sample(4, 1, 3, 1), "  the cancelled ones' tokens are its prefixes");
    is_int(outs[4].completion, 3 * MAXTOK + 8 + 12, "DONE counts the tokens really generated");
    kvg_sched_get_stats(r.s, &st);
    ok(st.samples_cancelled == st0.samples_cancelled + 2 && st.samples_started == st0.samples_started + 5,
       "samples_cancelled +2, samples_started +5");
    baseline(&r, "cancel");

    /* 5. Undrawn samples cancelled: dropped, with no tokens; the prompt's own blocks go. */
    kvg_sched_get_stats(r.s, &st0);
    submit(&r, 5, 5, 2);
    for (int k = 0; k < 5; k++)
        step(&r);
    {
        int32_t before = used_blocks(&r);
        ok(kvg_sched_samples(r.s, 5, 0, 0x1cu | (1u << 20)) == 0, "cancel undrawn samples 2..4 (and bit 20, past n)");
        int dropped = 1;
        for (int j = 2; j < 5; j++)
            dropped &= outs[5].finished[j] == 1 && outs[5].reason[j] == KVG_FINISH_CANCELLED && outs[5].n[j] == 0;
        ok(dropped, "  each gets FINISHED cancelled with 0 tokens");
        is_int(before - used_blocks(&r), 1, "  the prompt's partial block, kept for them, is freed (%d -> %d)",
               (int)before, (int)used_blocks(&r));
        ok(kvg_sched_samples(r.s, 5, 2, 0) == 0 && outs[5].n[2] == 0, "  a draw afterwards finds nothing to start");
    }
    ok(sched_rig_drain(&r, 200) == 0 && outs[5].done == 1, "the request ends with DONE");
    ok(same_sample(5, 1, 0, 0) && same_sample(5, 1, 1, 0), "  its two samples equal the reference");
    is_int(outs[5].completion, 2 * MAXTOK, "  DONE counts the 2 samples' tokens");
    kvg_sched_get_stats(r.s, &st);
    ok(st.samples_dropped == st0.samples_dropped + 3 && st.samples_started == st0.samples_started + 2 &&
       st.samples_cancelled == st0.samples_cancelled, "samples_dropped +3, samples_started +2");
    baseline(&r, "drop");

    /* 6. Everything cancelled at once, running and undrawn: DONE. A non-live id: -1. */
    submit(&r, 6, 4, 1);
    for (int k = 0; k < 3; k++)
        step(&r);
    kvg_sched_samples(r.s, 6, 0, 0xfu);
    ok(outs[6].done == 1 && outs[6].completion == outs[6].n[0] && outs[6].n[1] == 0,
       "cancelling every sample ends the request (DONE, %d tokens)", outs[6].completion);
    is_int(kvg_sched_samples(r.s, 6, 1, 0), -1, "SAMPLES for a request that ended: -1");
    is_int(kvg_sched_samples(r.s, 77, 1, 1), -1, "  and for an id never seen");
    baseline(&r, "cancel all");

    /* 6b. Drawn before the prompt is in (the request still waits): they start with it. */
    submit(&r, 10, 3, 1);
    ok(kvg_sched_samples(r.s, 10, 2, 0) == 0 && outs[10].n[1] == 0, "draw 2 while the request waits: nothing yet");
    ok(sched_rig_drain(&r, 200) == 0 && outs[10].done == 1 && same_sample(10, 1, 0, 0) && same_sample(10, 1, 1, 0) &&
       same_sample(10, 1, 2, 0), "  all 3 start with the prompt and equal the reference");
    baseline(&r, "early draw");

    /* 7. n_active out of range is refused at submit. */
    {
        kvg_sched_req q;
        sched_rig_req(&r, &q, 7, PROMPT, PLEN);
        q.n = 2;
        q.n_active = 3;
        ok(sched_rig_submit(&r, &q, err, sizeof err) != 0 && strstr(err, "n_active"), "n_active 3 of n=2: %s", err);
    }

    /* 8. Preemption while a sample is undrawn: the request's blocks (the kept prompt's
     * too) go, its prompt is recomputed, and the samples drawn before and after still
     * equal the reference. A pool of 20 cannot hold both requests at their longest. */
    sched_rig_free(&r);
    if (rig_new(&r, 20) == 0) {
        int32_t p2[45];
        kvg_sched_req q;
        p2[0] = PROMPT[0];
        for (int i = 1; i < 45; i++)
            p2[i] = sched_rig_rnd_tok(&rng, M->cfg.vocab_size);
        memset(&outs[9], 0, sizeof outs[9]);
        sched_rig_req(&r, &q, 9, p2, 45);
        q.sp = SEEDED;
        q.max_tokens = 40;
        ok(sched_rig_submit(&r, &q, err, sizeof err) == 0, "a 45-token request of 40 tokens") ? (void)0
                                                                                              : diag("%s", err);
        step(&r);
        step(&r);
        kvg_sched_get_stats(r.s, &st0);
        submit(&r, 8, 4, 1);
        for (int k = 0; k < 30 && outs[8].n[0] < 3; k++)
            step(&r);
        kvg_sched_samples(r.s, 8, 1, 0);
        for (int k = 0; k < 30 && outs[8].n[1] < 4; k++)
            step(&r);
        kvg_sched_samples(r.s, 8, 1, 0);
        for (int k = 0; k < 400 && !(outs[8].finished[0] && outs[8].finished[1] && outs[8].finished[2]); k++)
            step(&r);
        kvg_sched_get_stats(r.s, &st);
        ok(st.preemptions > st0.preemptions, "the later request was preempted (%llu times)",
           (unsigned long long)(st.preemptions - st0.preemptions));
        ok(outs[8].finished[2] && !outs[8].done && outs[8].n[3] == 0, "  its 3 drawn samples finished, one undrawn");
        kvg_sched_samples(r.s, 8, 1, 0);
        ok(sched_rig_drain(&r, 400) == 0 && outs[8].done == 1 && outs[9].done == 1, "  draw the last: both complete");
        int same = 1;
        for (int j = 0; j < 4; j++)
            same &= same_sample(8, 1, j, 0);
        ok(same, "  all 4 samples equal the reference despite the preemption");
        baseline(&r, "preemption");
    }
    sched_rig_free(&r);
    kvg_backend_free(BE);
    kvg_model_free(M);
    return done_testing();
}
