/* The scheduler on stories260K: every output (tokens and logprobs) equals a plain
 * forward-pass run of the same request alone with a fresh cache, whatever the
 * batching, chunked prefill, cache hits, forks (n = 3) or preemption; the second
 * request of a shared prefix (and the next chat turn) reports cached tokens; cancel
 * returns the pool to its baseline; impossible requests are rejected at submit; a
 * bypass request never touches the cache. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "sampler.h"
#include "sched_rig.h"
#include "prefix_cache_testing.h"

#define MAXR 48
#define MAXT 256

typedef struct out {
    int32_t tok[KVG_SCHED_MAX_N][MAXT];
    float lp[KVG_SCHED_MAX_N][MAXT];
    int n[KVG_SCHED_MAX_N];
    char text[KVG_SCHED_MAX_N][4096];
    size_t tlen[KVG_SCHED_MAX_N];
    int finished[KVG_SCHED_MAX_N];
    kvg_finish_reason reason[KVG_SCHED_MAX_N];
    int accepted, done;
    int32_t cached, done_cached, prompt, completion;
} out;

static out outs[MAXR];

static void on_event(void *ctx, const kvg_sched_event *ev)
{
    out *o = &outs[ev->id];
    (void)ctx;
    switch (ev->kind) {
    case KVG_SEV_ACCEPTED:
        o->accepted++;
        o->cached = ev->cached_tokens;
        break;
    case KVG_SEV_TOKEN:
        if (o->n[ev->sample] < MAXT) {
            o->tok[ev->sample][o->n[ev->sample]] = ev->token;
            o->lp[ev->sample][o->n[ev->sample]++] = ev->logprob;
        }
        /* fallthrough */
    case KVG_SEV_FINISHED:
        if (o->tlen[ev->sample] + ev->text_len < sizeof o->text[0]) {
            memcpy(o->text[ev->sample] + o->tlen[ev->sample], ev->text, ev->text_len);
            o->tlen[ev->sample] += ev->text_len;
        }
        if (ev->kind == KVG_SEV_FINISHED) {
            o->finished[ev->sample]++;
            o->reason[ev->sample] = ev->reason;
        }
        break;
    case KVG_SEV_DONE:
        o->done++;
        o->done_cached = ev->cached_tokens;
        o->prompt = ev->prompt_tokens;
        o->completion = ev->completion_tokens;
        break;
    }
}

static kvg_model *M;
static kvg_backend *BE;

/* The reference: the request alone on its own pool, prompt in one chunk, then one
 * token per step, sampled with (seed, sample_index, position). */
static int ref_run(const int32_t *prompt, int n_prompt, const kvg_sampler_params *sp,
                   uint64_t sample_index, int max_tokens, int32_t eos, int32_t *tok, float *lp)
{
    char err[256];
    kvg_kv_geom g;
    kvg_forward_kv_geom(M, 8, &g);
    kvg_kv_pool *kv = kvg_kv_pool_new(&g, 128, err, sizeof err);
    kvg_forward *fw = kvg_forward_new(M, BE, kv, err, sizeof err);
    kvg_kv_seq seq = { 0 };
    kvg_sampler smp = { 0 };
    float *logits = malloc((size_t)M->cfg.vocab_size * sizeof *logits);
    int n = 0;
    kvg_fwd_seq f = { &seq, prompt, n_prompt, logits };
    if (!fw || kvg_forward_step(fw, &f, 1, err, sizeof err) != 0) {
        diag("ref: %s", err);
        n = -1;
    }
    while (n >= 0 && n < max_tokens) {
        int32_t t = kvg_sample(&smp, sp, logits, M->cfg.vocab_size, sample_index,
                               (uint64_t)seq.n_tokens, &lp[n]);
        if (t == eos)
            break;
        tok[n++] = t;
        if (n == max_tokens || seq.n_tokens >= M->cfg.max_seq_len)
            break;
        kvg_fwd_seq d = { &seq, &tok[n - 1], 1, logits };
        if (kvg_forward_step(fw, &d, 1, err, sizeof err) != 0) {
            diag("ref: %s", err);
            n = -1;
        }
    }
    kvg_kv_seq_release(kv, &seq);
    kvg_sampler_free(&smp);
    free(logits);
    kvg_forward_free(fw);
    kvg_kv_pool_free(kv);
    return n;
}

static int rig_new(sched_rig *r, int n_blocks, int batch_tokens)
{
    sched_rig_opts o;
    memset(&o, 0, sizeof o);
    o.m = M;
    o.be = BE;
    o.n_blocks = n_blocks;
    o.sc.max_batch_tokens = batch_tokens;
    o.cb = on_event;
    o.tenant = "acme";
    return sched_rig_new(r, &o);
}

static int run_all(sched_rig *r)
{
    return sched_rig_drain(r, 100000);
}

static void base_req(sched_rig *r, kvg_sched_req *q, uint64_t id, const int32_t *p, int n_p)
{
    sched_rig_req(r, q, id, p, n_p);
    q->max_tokens = 24;
    q->stop_ids[0] = M->eos;
    q->n_stop_ids = M->eos >= 0;
    memset(&outs[id], 0, sizeof outs[id]);
}

/* Compares sample j of outs[id] with the reference run. */
static int same_as_ref(uint64_t id, int j, const int32_t *p, int n_p, const kvg_sampler_params *sp,
                       uint64_t index, int max_tokens)
{
    int32_t tok[MAXT];
    float lp[MAXT];
    int n = ref_run(p, n_p, sp, index, max_tokens, M->eos, tok, lp);
    const out *o = &outs[id];
    if (n < 0 || n != o->n[j] || o->finished[j] != 1 || o->done != 1)
    {
        diag("request %d sample %d: %d tokens vs %d alone (finished %d, done %d)",
             (int)id, j, o->n[j], n, o->finished[j], o->done);
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (tok[i] != o->tok[j][i] || memcmp(&lp[i], &o->lp[j][i], sizeof(float)) != 0)
        {
            diag("request %d sample %d: token %d differs (%d vs %d)", (int)id, j, i,
                 (int)o->tok[j][i], (int)tok[i]);
            return 0;
        }
    return 1;
}

static uint64_t rs = 2024;
static int32_t rnd_tok(void)
{
    return sched_rig_rnd_tok(&rs, M->cfg.vocab_size);
}

/* Section 1 for the current model (M, BE): shared prefixes, two waves, greedy and
 * seeded, chunked prefill, several requests batched per step. */
static void shared_prefix_waves(const char *label, int32_t (*prompts)[200], const int *plen)
{
    char err[512];
    sched_rig r;
    kvg_sampler_params greedy = { 0.0f, 0, 1.0f, 0 }, seeded = { 1.0f, 0, 0.9f, 4242 };

    for (int mode = 0; mode < 2; mode++) {
        const kvg_sampler_params *sp = mode ? &seeded : &greedy;
        int good = 1, hits = 1;
        if (rig_new(&r, 256, 32) != 0)
            break;
        for (int wave = 0; wave < 2; wave++) {
            for (int k = wave * 4; k < wave * 4 + 4; k++) {
                kvg_sched_req q;
                base_req(&r, &q, (uint64_t)k, prompts[k], plen[k]);
                q.sp = *sp;
                ok(sched_rig_submit(&r, &q, err, sizeof err) == 0, "submit %d", k) ? (void)0 : diag("%s", err);
            }
            run_all(&r);
        }
        for (int k = 0; k < 8; k++) {
            good &= same_as_ref((uint64_t)k, 0, prompts[k], plen[k], sp, 0, 24);
            if (k >= 4)
                hits &= outs[k].cached >= 24 && outs[k].done_cached == outs[k].cached;
        }
        ok(good, "%s %s: 8 requests with shared prefixes equal their runs alone", label, mode ? "seeded" : "greedy");
        ok(hits, "%s %s: second-wave requests report cached tokens (%d)", label, mode ? "seeded" : "greedy",
           (int)outs[5].cached);
        is_int(outs[0].cached, 0, "the very first request has nothing cached");
        is_int(outs[3].prompt, plen[3], "usage: prompt tokens");
        is_int(outs[3].completion, outs[3].n[0], "usage: completion tokens");
        {
            kvg_pc_stats st;
            kvg_pc_get_stats(r.pc, &st);
            is_int(st.blocks_used, 0, "no block in use once all finished");
            ok(kvg_pc_check(r.pc, NULL, 0, err, sizeof err) == 0, "cache invariants hold") ? (void)0 : diag("%s", err);
        }
        sched_rig_free(&r);
    }

}

/* Without logprobs asked for, the tokens are the same and every logprob is NaN (greedy
 * then skips the softmax over the vocabulary). */
static void without_logprobs(const int32_t *prompt, int n_p)
{
    char err[512];
    sched_rig r;
    kvg_sampler_params greedy = { 0.0f, 0, 1.0f, 0 }, seeded = { 1.0f, 0, 0.9f, 4242 };

    for (int mode = 0; mode < 2; mode++) {
        const kvg_sampler_params *sp = mode ? &seeded : &greedy;
        kvg_sched_req q;
        int same = 1, nan = 1, n;
        int32_t tok[MAXT];
        float lp[MAXT];
        if (rig_new(&r, 256, 32) != 0)
            return;
        base_req(&r, &q, 1, prompt, n_p);
        q.sp = *sp;
        q.logprobs = 0;
        ok(sched_rig_submit(&r, &q, err, sizeof err) == 0, "submit without logprobs") ? (void)0 : diag("%s", err);
        run_all(&r);
        n = ref_run(prompt, n_p, sp, 0, 24, M->eos, tok, lp);
        same = n > 0 && n == outs[1].n[0];
        for (int i = 0; same && i < n; i++) {
            same &= tok[i] == outs[1].tok[0][i];
            nan &= isnan(outs[1].lp[0][i]);
        }
        ok(same && nan, "%s, no logprobs asked: the same %d tokens as the reference, every logprob NaN",
           mode ? "seeded" : "greedy", n);
        sched_rig_free(&r);
    }
}

int main(void)
{
    char err[512];
    kvg_model_load_opts lo;
    sched_rig r;
    int32_t base[200], prompts[8][200];
    int plen[8];
    kvg_sampler_params greedy = { 0.0f, 0, 1.0f, 0 }, seeded = { 1.0f, 0, 0.9f, 4242 };

    M = sched_rig_stories260k(err, sizeof err);
    if (!M) {
        diag("%s", err);
        ok(0, "load stories260K");
        return done_testing();
    }
    BE = kvg_backend_cpu_new(M, 1, err, sizeof err);
    base[0] = M->bos >= 0 ? M->bos : 1;
    for (int i = 1; i < 200; i++)
        base[i] = rnd_tok();
    for (int k = 0; k < 8; k++) {
        plen[k] = 37 + 9 * k;            /* shared 30-token start, then own tokens */
        memcpy(prompts[k], base, 30 * sizeof(int32_t));
        for (int i = 30; i < plen[k]; i++)
            prompts[k][i] = rnd_tok();
    }

    /* 1. Shared prefixes, two waves, greedy and seeded, chunked prefill. */
    shared_prefix_waves("stories260K", prompts, plen);
    without_logprobs(prompts[0], plen[0]);

    /* 2. The next chat turn hits the blocks generated by the previous one. */
    if (rig_new(&r, 256, 64) == 0) {
        kvg_sched_req q;
        int32_t turn2[300];
        int n2;
        base_req(&r, &q, 10, prompts[0], plen[0]);
        q.n_stop_ids = 0;
        q.max_tokens = 40;
        sched_rig_submit(&r, &q, err, sizeof err);
        run_all(&r);
        memcpy(turn2, prompts[0], (size_t)plen[0] * sizeof(int32_t));
        memcpy(turn2 + plen[0], outs[10].tok[0], (size_t)outs[10].n[0] * sizeof(int32_t));
        n2 = plen[0] + outs[10].n[0];
        for (int i = 0; i < 10; i++)
            turn2[n2++] = rnd_tok();
        base_req(&r, &q, 11, turn2, n2);
        sched_rig_submit(&r, &q, err, sizeof err);
        run_all(&r);
        /* positions [0, plen + 40 - 1) had K/V; full blocks of 8 of them are cached */
        int want = ((plen[0] + 40 - 1) / 8) * 8;
        ok(outs[11].cached >= want - 8 && outs[11].cached > plen[0],
           "next turn: %d cached tokens, beyond the %d-token first prompt", (int)outs[11].cached, plen[0]);
        ok(same_as_ref(11, 0, turn2, n2, &greedy, 0, 24), "next turn equals its run alone");
        sched_rig_free(&r);
    }

    /* 3. n = 3: one prefill, three forks; sample j == a single request with sample index j. */
    if (rig_new(&r, 256, 64) == 0) {
        kvg_sched_req q;
        kvg_pc_stats st;
        int good = 1, steps = 0;
        base_req(&r, &q, 12, prompts[7], plen[7]);
        q.sp = seeded;
        q.n = 3;
        q.max_tokens = 20;
        sched_rig_submit(&r, &q, err, sizeof err);
        while (outs[12].n[0] + outs[12].n[1] + outs[12].n[2] < 6 && steps++ < 50)
            kvg_sched_step(r.s, err, sizeof err);
        kvg_pc_get_stats(r.pc, &st);
        /* alone, three copies would need 3 * ceil(prompt / 8) blocks */
        ok(st.blocks_used <= (plen[7] + 2) / 8 + 3 * 2, "forks share the prompt blocks (%d in use, prompt %d blocks)",
           (int)st.blocks_used, (plen[7] + 7) / 8);
        run_all(&r);
        for (int j = 0; j < 3; j++)
            good &= same_as_ref(12, j, prompts[7], plen[7], &seeded, (uint64_t)j, 20);
        ok(good, "n=3: sample j equals a single request with sample_index j");
        ok(memcmp(outs[12].tok[0], outs[12].tok[1], 5 * sizeof(int32_t)) != 0 ||
           memcmp(outs[12].tok[1], outs[12].tok[2], 5 * sizeof(int32_t)) != 0, "the samples differ");
        is_int(outs[12].completion, outs[12].n[0] + outs[12].n[1] + outs[12].n[2], "usage sums the samples");
        sched_rig_free(&r);
    }

    /* 4. Preemption under a tiny pool: same outputs. Each request alone needs up to
     * ceil((plen + 39) / 8) <= 14 blocks; 24 blocks cannot hold four at once. */
    if (rig_new(&r, 24, 48) == 0) {
        kvg_sched_stats ss;
        int good = 1;
        for (int k = 0; k < 4; k++) {
            kvg_sched_req q;
            base_req(&r, &q, (uint64_t)(20 + k), prompts[k], plen[k]);
            q.sp = k & 1 ? seeded : greedy;
            q.n_stop_ids = 0;
            q.max_tokens = 40;
            ok(sched_rig_submit(&r, &q, err, sizeof err) == 0, "tiny pool: submit %d", k) ? (void)0 : diag("%s", err);
        }
        run_all(&r);
        for (int k = 0; k < 4; k++) {
            int32_t tok[MAXT];
            float lp[MAXT];
            int n = ref_run(prompts[k], plen[k], k & 1 ? &seeded : &greedy, 0, 40, -1, tok, lp);
            good &= n == outs[20 + k].n[0] && memcmp(tok, outs[20 + k].tok[0], (size_t)n * sizeof(int32_t)) == 0;
        }
        kvg_sched_get_stats(r.s, &ss);
        ok(ss.preemptions > 0, "tiny pool: %llu preemptions", (unsigned long long)ss.preemptions);
        ok(good, "tiny pool: outputs identical to the runs alone");
        sched_rig_free(&r);
    }

    /* 5. Cancel releases the blocks; 6. rejection; 7. bypass. */
    if (rig_new(&r, 48, 16) == 0) {
        kvg_sched_req q;
        kvg_pc_stats st0, st;
        kvg_pc_get_stats(r.pc, &st0);
        base_req(&r, &q, 30, prompts[2], plen[2]);
        q.max_tokens = 100;
        q.n = 2;
        q.n_stop_ids = 0;
        sched_rig_submit(&r, &q, err, sizeof err);
        for (int i = 0; i < 8; i++)
            kvg_sched_step(r.s, err, sizeof err);
        kvg_pc_get_stats(r.pc, &st);
        ok(st.blocks_used > 0 && outs[30].n[0] > 0, "running: %d blocks in use", (int)st.blocks_used);
        ok(kvg_sched_cancel(r.s, 30) == 0, "cancel");
        kvg_pc_get_stats(r.pc, &st);
        is_int(st.blocks_used, 0, "cancel: no block in use");
        is_int(st.blocks_free + st.blocks_cached, st0.blocks_free, "cancel: pool back to baseline");
        ok(outs[30].reason[0] == KVG_FINISH_CANCELLED && outs[30].reason[1] == KVG_FINISH_CANCELLED &&
           outs[30].done == 1, "cancel: both samples finish as cancelled, then done");
        is_int(kvg_sched_pending(r.s), 0, "nothing pending");
        ok(kvg_sched_cancel(r.s, 30) == -1, "cancelling an unknown id fails");

        int32_t *longp = malloc((size_t)(M->cfg.max_seq_len + 1) * sizeof *longp);
        for (int i = 0; i < M->cfg.max_seq_len + 1; i++)
            longp[i] = 5;
        base_req(&r, &q, 31, longp, M->cfg.max_seq_len + 1);
        ok(sched_rig_submit(&r, &q, err, sizeof err) == -1 && strstr(err, "context length"),
           "longer than the context: rejected (%s)", err);
        base_req(&r, &q, 31, longp, M->cfg.max_seq_len - 8);
        ok(sched_rig_submit(&r, &q, err, sizeof err) == -1 && strstr(err, "pool"),
           "larger than the pool: rejected (%s)", err);
        free(longp);
        base_req(&r, &q, 31, prompts[0], plen[0]);
        q.n = 17;
        ok(sched_rig_submit(&r, &q, err, sizeof err) == -1, "n = 17 rejected (%s)", err);
        is_int(kvg_sched_pending(r.s), 0, "rejected requests are not queued");

        /* bypass: run the same prompt twice; the cache sees nothing */
        kvg_pc_get_stats(r.pc, &st0);
        for (int k = 0; k < 2; k++) {
            base_req(&r, &q, (uint64_t)(32 + k), prompts[1], plen[1]);
            q.bucket = 0;
            sched_rig_submit(&r, &q, err, sizeof err);
            run_all(&r);
        }
        kvg_pc_get_stats(r.pc, &st);
        ok(st.query_tokens == st0.query_tokens && st.hit_tokens == st0.hit_tokens &&
           st.blocks_cached == st0.blocks_cached, "bypass: no lookup, no insert (cached %d -> %d)",
           (int)st0.blocks_cached, (int)st.blocks_cached);
        is_int(outs[33].cached, 0, "bypass: the repeat has nothing cached");
        ok(same_as_ref(33, 0, prompts[1], plen[1], &greedy, 0, 24), "bypass: output equals the run alone");
        {
            kvg_sched_stats ss;
            kvg_sched_get_stats(r.s, &ss);
            ok(ss.bucket[0].requests == 2 && ss.bucket[1].requests == 1 && ss.decode_tokens > 0 &&
               ss.prefill_tokens > 0 && ss.ttft_count == 3, "metrics per bucket, tokens, ttft");
        }
        sched_rig_free(&r);
    }

    /* 8. Stop strings: the text stops right before the stop string. */
    if (rig_new(&r, 128, 64) == 0) {
        kvg_sched_req q;
        char full[4096];
        size_t fl;
        base_req(&r, &q, 40, prompts[4], plen[4]);
        q.n_stop_ids = 0;
        q.max_tokens = 40;
        sched_rig_submit(&r, &q, err, sizeof err);
        run_all(&r);
        fl = outs[40].tlen[0];
        memcpy(full, outs[40].text[0], fl);
        full[fl] = 0;
        if (fl > 12) {
            char stop[8];
            memcpy(stop, full + fl / 2, 5);
            stop[5] = 0;
            const char *first = strstr(full, stop);
            size_t want = (size_t)(first - full);
            base_req(&r, &q, 41, prompts[4], plen[4]);
            q.n_stop_ids = 0;
            q.max_tokens = 40;
            q.stop[0] = stop;
            q.n_stop = 1;
            sched_rig_submit(&r, &q, err, sizeof err);
            run_all(&r);
            ok(outs[41].tlen[0] == want && memcmp(outs[41].text[0], full, want) == 0 &&
               outs[41].reason[0] == KVG_FINISH_STOP,
               "stop string '%s': text cut at byte %zu (got %zu)", stop, want, outs[41].tlen[0]);
        } else {
            ok(0, "generated text too short for the stop test (%zu bytes)", fl);
        }
        sched_rig_free(&r);
    }

    kvg_backend_free(BE);
    kvg_model_free(M);

    /* Section 1 again on a synthetic model (other weights, byte-level tokenizer). */
    memset(&lo, 0, sizeof lo);
    M = kvg_model_load("synthetic:260K", &lo, err, sizeof err);
    if (ok(M != NULL, "load synthetic:260K") && (BE = kvg_backend_cpu_new(M, 1, err, sizeof err))) {
        memset(outs, 0, sizeof outs);
        shared_prefix_waves("synthetic:260K", prompts, plen);
        kvg_backend_free(BE);
    }
    kvg_model_free(M);
    return done_testing();
}
