/* Scheduler policy on stories260K: priority decides admission when only one request
 * fits (running slots or pool blocks); a short bypass request submitted while a long
 * prompt is being chunked gets its first token within a few steps, not after the long
 * prefill; TTLs run on the scheduler's injected clock (a short-lived prefix is gone
 * after a sweep, a long-lived one is still hit); a failing forward step finishes its
 * requests with an error event and leaves the pool at its baseline, the scheduler
 * still usable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "sched_rig.h"
#include "prefix_cache_testing.h"

#define MAXR 16

typedef struct out {
    int accepted_at;             /* order of ACCEPTED among all requests, 0: not yet */
    int first_token_step;        /* step count at the first TOKEN, -1: none yet */
    int tokens, finished, done;
    kvg_finish_reason reason;
    int32_t cached;
    char error[256];
} out;

static out outs[MAXR];
static int n_accepted, cur_step;

static void on_event(void *ctx, const kvg_sched_event *ev)
{
    out *o = &outs[ev->id % MAXR];
    (void)ctx;
    switch (ev->kind) {
    case KVG_SEV_ACCEPTED:
        o->accepted_at = ++n_accepted;
        o->cached = ev->cached_tokens;
        break;
    case KVG_SEV_TOKEN:
        if (o->tokens++ == 0)
            o->first_token_step = cur_step;
        break;
    case KVG_SEV_FINISHED:
        o->finished++;
        o->reason = ev->reason;
        if (ev->error)
            snprintf(o->error, sizeof o->error, "%s", ev->error);
        break;
    case KVG_SEV_DONE:
        o->done++;
        break;
    }
}

static int64_t fake_now;
static int64_t fake_clock(void *ctx)
{
    (void)ctx;
    return fake_now;
}

static kvg_model *M;
static kvg_backend *BE;

/* fm: the model the forward pass runs (M unless a test gives it a shorter context). */
static int rig_new(sched_rig *r, const kvg_model *fm, int n_blocks, int batch_tokens, int max_running)
{
    sched_rig_opts o;
    memset(&o, 0, sizeof o);
    o.m = M;
    o.fwd_model = fm;
    o.be = BE;
    o.n_blocks = n_blocks;
    o.sc.max_batch_tokens = batch_tokens;
    o.sc.max_running = max_running;
    o.sc.now_ms = fake_clock;
    o.cb = on_event;
    o.tenant = "acme";
    if (sched_rig_new(r, &o) != 0)
        return -1;
    memset(outs, 0, sizeof outs);
    n_accepted = cur_step = 0;
    fake_now = 1000;
    return 0;
}

static int step(sched_rig *r)
{
    char err[256];
    cur_step++;
    int rc = kvg_sched_step(r->s, err, sizeof err);
    if (rc < 0)
        diag("step %d: %s", cur_step, err);
    return rc;
}

static int run_all(sched_rig *r)
{
    for (int guard = 0; kvg_sched_pending(r->s) > 0; guard++)
        if (guard > 20000 || step(r) < 0)
            return -1;
    return 0;
}

static void base_req(sched_rig *r, kvg_sched_req *q, uint64_t id, const int32_t *p, int n_p)
{
    sched_rig_req(r, q, id, p, n_p);
    q->max_tokens = 8;
    out *o = &outs[id % MAXR];
    memset(o, 0, sizeof *o);
    o->first_token_step = -1;
}

static int submit(sched_rig *r, const kvg_sched_req *q)
{
    char err[256];
    if (sched_rig_submit(r, q, err, sizeof err) != 0) {
        diag("submit %llu: %s", (unsigned long long)q->id, err);
        return -1;
    }
    return 0;
}

static uint64_t rs = 99;
static int32_t rnd_tok(void)
{
    return sched_rig_rnd_tok(&rs, M->cfg.vocab_size);
}

static void fill(int32_t *p, int n)
{
    p[0] = M->bos >= 0 ? M->bos : 1;
    for (int i = 1; i < n; i++)
        p[i] = rnd_tok();
}

/* Free + cached blocks equal the pool, none in use, invariants hold. */
static void pool_at_baseline(sched_rig *r, const char *what)
{
    char err[256];
    kvg_pc_stats st;
    kvg_pc_get_stats(r->pc, &st);
    ok(st.blocks_used == 0 && st.blocks_free + st.blocks_cached == st.blocks_total,
       "%s: pool at baseline (%d used, %d free + %d cached of %d)", what, (int)st.blocks_used,
       (int)st.blocks_free, (int)st.blocks_cached, (int)st.blocks_total);
    ok(kvg_pc_check(r->pc, NULL, 0, err, sizeof err) == 0, "%s: cache invariants hold", what)
        ? (void)0 : diag("%s", err);
}

static void test_priority(void)
{
    sched_rig r;
    kvg_sched_req q;
    int32_t p[3][40];
    for (int k = 0; k < 3; k++)
        fill(p[k], 40);

    /* One running slot: priorities 0, 5, 2 submitted in that order run 5, 2, 0. */
    if (rig_new(&r, M, 64, 64, 1) == 0) {
        static const int prio[3] = { 0, 5, 2 };
        for (int k = 0; k < 3; k++) {
            base_req(&r, &q, (uint64_t)k, p[k], 40);
            q.priority = prio[k];
            submit(&r, &q);
        }
        step(&r);
        ok(outs[1].accepted_at == 1 && outs[0].accepted_at == 0 && outs[2].accepted_at == 0,
           "one slot: the priority-5 request, submitted second, is admitted alone first");
        run_all(&r);
        ok(outs[1].accepted_at == 1 && outs[2].accepted_at == 2 && outs[0].accepted_at == 3,
           "one slot: admission order 5, 2, 0 (got %d, %d, %d)", outs[1].accepted_at,
           outs[2].accepted_at, outs[0].accepted_at);
        ok(outs[1].done && outs[2].done && outs[0].done, "one slot: all three finish");
        ok(outs[2].first_token_step > outs[1].first_token_step &&
           outs[0].first_token_step > outs[2].first_token_step,
           "one slot: first tokens in priority order (steps %d, %d, %d)",
           outs[1].first_token_step, outs[2].first_token_step, outs[0].first_token_step);
        sched_rig_free(&r);
    }

    /* The pool holds one request at a time: a 40-token prompt reserves 5 blocks of 8
     * at admission and grows to 6; 8 blocks cannot admit a second. */
    if (rig_new(&r, M, 8, 64, 0) == 0) {
        base_req(&r, &q, 3, p[0], 40);
        submit(&r, &q);
        base_req(&r, &q, 4, p[1], 40);
        q.priority = 1;
        submit(&r, &q);
        step(&r);
        ok(outs[4].accepted_at == 1 && outs[3].accepted_at == 0,
           "small pool: the later, higher-priority request is admitted, the other waits");
        run_all(&r);
        ok(outs[3].accepted_at == 2 && outs[3].done && outs[4].done &&
           outs[3].first_token_step > outs[4].first_token_step,
           "small pool: the lower-priority one runs after it (first tokens at steps %d, %d)",
           outs[4].first_token_step, outs[3].first_token_step);
        pool_at_baseline(&r, "small pool");
        sched_rig_free(&r);
    }
}

static void test_bypass_share(void)
{
    sched_rig r;
    kvg_sched_req q;
    int32_t longp[200], shortp[8];
    fill(longp, 200);
    fill(shortp, 8);
    /* 16 tokens a step: the long prompt needs 13 steps; bypass keeps a quarter (4). */
    if (rig_new(&r, M, 64, 16, 0) != 0)
        return;
    base_req(&r, &q, 1, longp, 200);
    submit(&r, &q);
    step(&r);
    step(&r);
    int submitted_at = cur_step;
    base_req(&r, &q, 2, shortp, 8);
    q.bucket = 0;
    submit(&r, &q);
    for (int i = 0; i < 40 && outs[2].first_token_step < 0; i++)
        step(&r);
    int waited = outs[2].first_token_step - submitted_at;
    ok(outs[2].first_token_step > 0 && waited <= 3,
       "bypass under load: first token %d step(s) after submit (8 tokens, 4 a step)", waited);
    ok(outs[1].tokens == 0, "bypass under load: the long prompt was still prefilling then "
       "(%d tokens out)", outs[1].tokens);
    run_all(&r);
    ok(outs[1].done && outs[2].done, "bypass under load: both finish");
    ok(outs[1].first_token_step > outs[2].first_token_step + 5,
       "bypass under load: the long prompt's first token comes much later (step %d vs %d)",
       outs[1].first_token_step, outs[2].first_token_step);
    pool_at_baseline(&r, "bypass under load");
    sched_rig_free(&r);
}

static void test_ttl(void)
{
    sched_rig r;
    kvg_sched_req q;
    int32_t p[2][48];
    fill(p[0], 48);
    fill(p[1], 48);
    if (rig_new(&r, M, 64, 64, 0) != 0)
        return;
    /* Ten minutes on the injected clock: past 100 ms and past the cache's 5-minute
     * default, within an hour; so only the request's own ttl can keep the blocks. */
    for (int pass = 0; pass < 2; pass++) {
        int64_t ttl = pass == 0 ? 100 : 3600 * 1000;
        base_req(&r, &q, (uint64_t)(1 + 2 * pass), p[pass], 48);
        q.ttl_ms = ttl;
        submit(&r, &q);
        run_all(&r);
        fake_now += 10 * 60 * 1000;
        int32_t swept = kvg_pc_sweep(r.pc, fake_now);
        base_req(&r, &q, (uint64_t)(2 + 2 * pass), p[pass], 48);
        submit(&r, &q);
        run_all(&r);
        if (pass == 0) {
            ok(swept >= 5, "ttl 100 ms: the sweep ten minutes later expires %d block(s)", (int)swept);
            is_int(outs[2].cached, 0, "ttl 100 ms: the identical request has nothing cached");
        } else {
            /* only the probe of pass 0 (default ttl) can have expired */
            ok(swept < 5 + 2, "ttl 1 h: the sweep ten minutes later leaves them (%d expired)",
               (int)swept);
            ok(outs[4].cached >= 40, "ttl 1 h: the identical request has %d cached tokens",
               (int)outs[4].cached);
        }
    }
    fake_now += 3600 * 1000 + 1;
    ok(kvg_pc_sweep(r.pc, fake_now) > 0, "an hour later on the injected clock they expire too");
    pool_at_baseline(&r, "ttl");
    sched_rig_free(&r);
}

static void test_errors(void)
{
    sched_rig r;
    kvg_sched_req q;
    char err[256];
    int32_t p[20];
    fill(p, 20);

    /* No out-of-vocabulary case: prompt ids in the vocabulary are a precondition of
     * kvg_sched_submit (asserted); the engine's intake rejects them (engine_faults.c,
     * t/gateway-errors.t), warm-up files as they are parsed (warmup.c). */

    /* A forward failure: the forward pass runs a copy of the model with a 64-token
     * context, the scheduler the real one (512), so the chunk crossing position 64
     * passes submit and fails inside the step. */
    kvg_model shorter = *M;
    shorter.cfg.max_seq_len = 64;
    int32_t longp[100];
    fill(longp, 100);
    /* 60 tokens a step: [0, 60) fits; [60, 100) plus the second request's prompt fail. */
    if (rig_new(&r, &shorter, 128, 60, 0) == 0) {
        int failed_rc = 0, steps = 0;
        base_req(&r, &q, 5, longp, 100);
        q.n = 2;
        q.max_tokens = 4;
        submit(&r, &q);
        base_req(&r, &q, 6, p, 20);   /* gets the failing step's leftover budget */
        q.max_tokens = 8;
        submit(&r, &q);
        while (kvg_sched_pending(r.s) > 0 && steps++ < 100) {
            cur_step++;
            if (kvg_sched_step(r.s, err, sizeof err) < 0) {
                failed_rc++;
                diag("the failing step: %s", err);
            }
        }
        ok(failed_rc == 1, "exactly one step fails (%d)", failed_rc);
        ok(outs[5].finished == 2 && outs[5].reason == KVG_FINISH_ERROR && outs[5].done == 1 &&
           strstr(outs[5].error, "context length"), "the failed request: both samples finish "
           "with an error event naming the cause (%s), then done", outs[5].error);
        /* documented: every request in the failed batch ends with an error */
        ok(outs[6].done == 1 && outs[6].finished == 1 && outs[6].reason == KVG_FINISH_ERROR,
           "its batch-mate (a prompt chunk in the same step) is finished with an error too");
        is_int(kvg_sched_pending(r.s), 0, "nothing left pending");
        pool_at_baseline(&r, "forward failure");
        base_req(&r, &q, 7, longp, 40);
        submit(&r, &q);
        run_all(&r);
        ok(outs[7].done == 1 && outs[7].tokens == 8 && outs[7].reason == KVG_FINISH_LENGTH,
           "the scheduler stays usable afterwards (%d tokens)", outs[7].tokens);
        ok(outs[7].cached == 32, "and the failed prompt's blocks committed before the failure "
           "serve hits (%d of 40 tokens cached)",
           (int)outs[7].cached);
        pool_at_baseline(&r, "after the failure");
        sched_rig_free(&r);
    }
}

int main(void)
{
    char err[512];
    M = sched_rig_stories260k(err, sizeof err);
    if (!M) {
        diag("%s", err);
        ok(0, "load stories260K");
        return done_testing();
    }
    BE = kvg_backend_cpu_new(M, 1, err, sizeof err);
    test_priority();
    test_bypass_share();
    test_ttl();
    test_errors();
    kvg_backend_free(BE);
    kvg_model_free(M);
    return done_testing();
}
