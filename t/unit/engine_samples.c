/* Samples in waves and per-sample cancel through the engine daemon (a real process,
 * the client library): SUBMIT's n_active starts only some samples, SAMPLES draws the
 * rest (their output equals an all-at-once run), drops undrawn ones (FINISHED
 * cancelled, no tokens, then DONE), and cancels a running one (FINISHED cancelled with
 * its tokens so far, its blocks released while the others go on unchanged); a SAMPLES
 * for a request the engine no longer has is ignored; n_active above n is ERROR 400;
 * the statistics page counts started, cancelled and dropped samples. */
#include "engine_proc.h"

static char sock1[300], sock2[300];
static ep_result REF, REF2, R;

static const char *P1 = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";

static int pump_until(kvg_client *c, ep_result *r, int (*cond)(const ep_result *))
{
    double deadline = ep_now() + EP_WAIT_S;
    while (!cond(r) && !r->error && !r->done) {
        if (ep_now() > deadline) {
            diag("timed out waiting");
            return -1;
        }
        kvg_client_event ev;
        while (kvg_client_next_event(c, &ev) == 1)
            ep_record(&ev);
        if (!cond(r))
            kvg_client_wait(c, 20);
    }
    return cond(r) ? 0 : -1;
}

static int first_two_finished(const ep_result *r) { return r->finish[0] && r->finish[1]; }
static int third_finished(const ep_result *r) { return r->finish[2] != 0; }
static int first_finished(const ep_result *r) { return r->finish[0] != 0; }

static int submit(kvg_client *c, const kvg_client_req *q, ep_result *r, uint64_t *id)
{
    char err[256];
    memset(r, 0, sizeof *r);
    if (kvg_client_submit(c, q, r, id, err, sizeof err) != 0) {
        diag("submit: %s", err);
        return -1;
    }
    return 0;
}

static int is_held(const kvg_stats *s, const void *arg)
{
    (void)arg;
    return s->held == 1;
}

static int cancelled_past(const kvg_stats *s, const void *arg)
{
    return s->samples_cancelled > *(const uint64_t *)arg;
}

static int completed_past(const kvg_stats *s, const void *arg)
{
    return s->completed > *(const uint64_t *)arg;
}

static void test_waves_and_drops(kvg_client *c)
{
    size_t n;
    uint64_t id;
    kvg_stats st0, st;
    int32_t *ids = ep_tokens(c, P1, &n);
    kvg_client_req q = ep_req(ids, n, 24);
    q.temperature = 0.8f;
    q.seed = 11;
    q.n = 5;
    ok(ep_run(c, &q, &REF, 30) == 0, "reference: n=5 all at once");

    /* n_active 2: samples 0 and 1 run to their end, the rest wait for a draw. */
    ep_stats(c, &st0);
    q.n_active = 2;
    submit(c, &q, &R, &id);
    ok(pump_until(c, &R, first_two_finished) == 0, "n_active 2: samples 0 and 1 finish");
    ok(R.n_tokens[2] == 0 && R.n_tokens[3] == 0 && R.n_tokens[4] == 0 && !R.done,
       "  samples 2..4 have produced nothing, no DONE yet");
    ok(kvg_client_samples(c, id, 1, 0) == 0, "draw 1");
    ok(pump_until(c, &R, third_finished) == 0 && R.n_tokens[3] == 0, "  sample 2 runs, sample 3 still waits");
    ok(kvg_client_samples(c, id, 7, 0) == 0, "draw 7 (clamped to the 2 left)");
    ep_pump(&c, 1, (ep_result *[]){ &R }, 1, 30);
    ok(R.done, "  DONE");
    ok(ep_same(&REF, &R, 5), "the 5 samples drawn in three waves equal the all-at-once run, bit for bit");
    is_int(R.completion_tokens, REF.completion_tokens, "  usage: %u completion tokens", R.completion_tokens);
    ep_stats(c, &st);
    ok(st.samples_started == st0.samples_started + 5 && st.samples_dropped == st0.samples_dropped,
       "stats: samples_started +5 (%llu -> %llu)", (unsigned long long)st0.samples_started,
       (unsigned long long)st.samples_started);

    /* Undrawn samples dropped: FINISHED cancelled with 0 tokens, then DONE. */
    st0 = st;
    q.n = 4;
    q.n_active = 1;
    submit(c, &q, &R, &id);
    ok(pump_until(c, &R, first_finished) == 0 && !R.done, "n=4, n_active 1: sample 0 finishes, the request waits");
    ok(kvg_client_samples(c, id, 0, 0xeu) == 0, "cancel the undrawn samples 1..3");
    ep_pump(&c, 1, (ep_result *[]){ &R }, 1, 30);
    int dropped = R.done;
    for (int j = 1; j < 4; j++)
        dropped &= R.finish[j] == KVG_MSG_FINISH_CANCELLED && R.sample_completion[j] == 0 && R.n_tokens[j] == 0;
    ok(dropped, "  each: FINISHED cancelled, 0 tokens; then DONE");
    ok(R.n_tokens[0] == REF.n_tokens[0] && memcmp(R.tokens[0], REF.tokens[0], R.n_tokens[0] * 4) == 0 &&
       R.completion_tokens == R.n_tokens[0], "  sample 0 equals the reference's; usage counts only its %u tokens",
       R.completion_tokens);
    ep_stats(c, &st);
    ok(st.samples_dropped == st0.samples_dropped + 3 && st.samples_started == st0.samples_started + 1 &&
       st.samples_cancelled == st0.samples_cancelled, "stats: samples_dropped +3, samples_started +1");

    /* SAMPLES for an id the engine is done with (the client has not read the DONE
     * yet: the messages cross) is ignored. */
    q.n = 2;
    q.n_active = 0;
    q.max_tokens = 2;
    ep_stats(c, &st0);
    submit(c, &q, &R, &id);
    ok(ep_wait_stats(c, EP_WAIT_S, &st, completed_past, &st0.completed) == 0, "a short request completes in the engine");
    ok(kvg_client_samples(c, id, 1, 0x3u) == 0, "  SAMPLES for it, sent before its DONE is read");
    ep_pump(&c, 1, (ep_result *[]){ &R }, 1, 30);
    ok(R.done && R.finish[0] != KVG_MSG_FINISH_CANCELLED && R.finish[1] != KVG_MSG_FINISH_CANCELLED,
       "  it ended normally");
    q.max_tokens = 24;
    q.n = 5;
    ok(ep_run(c, &q, &R, 30) == 0 && ep_same(&REF, &R, 5), "  the connection goes on: the next request is normal");
    ep_stats(c, &st);
    ok(st.protocol_errors == st0.protocol_errors && st.samples_cancelled == st0.samples_cancelled &&
       st.samples_dropped == st0.samples_dropped, "  no protocol error, nothing cancelled or dropped");
    is_int(kvg_client_samples(c, 987654321, 1, 0), -1, "kvg_client_samples of an id never submitted: -1");

    /* n_active above n: the engine's intake refuses it. */
    q.n = 2;
    q.n_active = 3;
    ep_run(c, &q, &R, 30);
    ok(R.error && R.status == 400 && strstr(R.message, "n_active"), "n_active 3 of n=2: ERROR 400 (%s)", R.message);
    free(ids);
}

/* A running sample cancelled: the client stops reading, so the engine holds the
 * request (nothing moves), then SAMPLES cancels one sample; its blocks go at once. */
static void test_cancel_running(kvg_client *c)
{
    size_t n;
    uint64_t id;
    kvg_stats st0, st, held;
    int32_t *ids = ep_tokens(c, "Once upon a time", &n);
    kvg_client_req q = ep_req(ids, n, 480);
    q.n = 4;
    q.bypass = 1;
    q.temperature = 0.7f;
    q.seed = 5;
    ok(ep_run(c, &q, &REF2, 60) == 0, "reference: n=4, up to 480 tokens");
    int j = 0;
    for (int k = 1; k < 4; k++)
        if (REF2.n_tokens[k] > REF2.n_tokens[j])
            j = k;
    ok(REF2.n_tokens[j] >= 320, "  sample %d runs longest (%u tokens)", j, REF2.n_tokens[j]);
    ep_stats(c, &st0);
    submit(c, &q, &R, &id);
    ok(ep_wait_stats(c, EP_WAIT_S, &held, is_held, NULL) == 0, "not reading: the request is held");
    ok(kvg_client_samples(c, id, 0, 1u << j) == 0, "cancel sample %d while it is held, mid-way", j);
    ok(ep_wait_stats(c, EP_WAIT_S, &st, cancelled_past, &st0.samples_cancelled) == 0 && st.running == 1,
       "  the engine counts it cancelled; the request still runs");
    int32_t drop = held.blocks_used - st.blocks_used;
    ep_pump(&c, 1, (ep_result *[]){ &R }, 1, 60);
    ok(R.done, "reading again: the request completes");
    ok(R.finish[j] == KVG_MSG_FINISH_CANCELLED && R.n_tokens[j] < REF2.n_tokens[j] && R.n_tokens[j] > 0 &&
       R.sample_completion[j] == R.n_tokens[j], "  sample %d: FINISHED cancelled after %u tokens", j,
       R.n_tokens[j]);
    ok(memcmp(R.tokens[j], REF2.tokens[j], R.n_tokens[j] * 4) == 0, "  its tokens are the reference's start");
    /* all of a sample's blocks are its own (the 5-token prompt fills no block) */
    int32_t own = (int32_t)((n + R.n_tokens[j] - 1 + 15) / 16);
    is_int(drop, own, "  blocks in use dropped by its own %d while held (%d -> %d)", own, held.blocks_used,
           st.blocks_used);
    int same = 1;
    for (int k = 0; k < 4; k++)
        if (k != j)
            same &= R.n_tokens[k] == REF2.n_tokens[k] && R.finish[k] == REF2.finish[k] &&
                    memcmp(R.tokens[k], REF2.tokens[k], R.n_tokens[k] * 4) == 0;
    ok(same, "  the other samples equal the reference");
    uint32_t want = 0;
    for (int k = 0; k < 4; k++)
        want += R.n_tokens[k];
    is_int(R.completion_tokens, want, "  usage: the tokens really generated (%u)", want);
    ep_wait_idle(c, EP_WAIT_S, &st);
    ok(st.samples_cancelled == st0.samples_cancelled + 1 && st.blocks_used == 0,
       "stats: samples_cancelled +1; the pool is back to no block in use");
    free(ids);
}

int main(void)
{
    static char mp[512], model_path[1024], tok_path[1024];
    engine_proc e1, e2;
    snprintf(mp, sizeof mp, "%s/models/stories260K", shared_dir());
    snprintf(model_path, sizeof model_path, "%s/stories260K.bin", mp);
    snprintf(tok_path, sizeof tok_path, "%s/tok512.bin", mp);
    snprintf(sock1, sizeof sock1, "%s/s1.sock", ep_tmpdir());
    snprintf(sock2, sizeof sock2, "%s/s2.sock", ep_tmpdir());
    const char *a1[] = { "--model", model_path, "--tokenizer", tok_path, "--socket", sock1, "--threads", "1",
                         "--kv-memory", "64M", NULL };
    const char *a2[] = { "--model", model_path, "--tokenizer", tok_path, "--socket", sock2, "--threads", "1",
                         "--kv-memory", "64M", "--ring-slots", "8", "--cq-data", "4096", NULL };
    if (ep_start(&e1, a1) != 0 || ep_start(&e2, a2) != 0) {
        ok(0, "engines start");
        return done_testing();
    }
    kvg_client *c = ep_connect(sock1);
    if (c) {
        test_waves_and_drops(c);
        kvg_client_free(c);
    } else {
        ok(0, "connect");
    }
    c = ep_connect(sock2);
    if (c) {
        test_cancel_running(c);
        kvg_client_free(c);
    } else {
        ok(0, "connect");
    }
    is_int(ep_stop(&e1, SIGTERM, 30), 0, "engine 1 exits 0 on SIGTERM");
    is_int(ep_stop(&e2, SIGTERM, 30), 0, "engine 2 exits 0 on SIGTERM");
    char *log = ep_stderr(&e1);
    ok(strstr(log, "AddressSanitizer") == NULL && strstr(log, "runtime error") == NULL, "engine stderr is clean");
    free(log);
    return done_testing();
}
