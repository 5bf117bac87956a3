/* The engine daemon through its shared-memory channel, as a real process with the
 * client library: the handshake hands over the engine's own model identity and
 * tokenizer; greedy answers equal the llama2.c reference; cached and uncached answers
 * are identical; tenants never share blocks; many concurrent clients with interleaved
 * requests get exactly what each request gets alone; tiny rings wrap thousands of
 * times; a client that stops reading is held (bounded engine memory) and then gets
 * everything, unchanged; a request its client pauses (PAUSE) stops generating and
 * resumes unchanged, stray PAUSE/RESUME messages change nothing; a request larger than the channel is refused cleanly; the
 * engine's own refusals (pool too small, saturation) come back as errors. */
#include <jansson.h>

#include "engine_proc.h"
#include "model.h"
#include "client_testing.h"
#include "tokenizer_testing.h"

static char sock1[300], sock2[300], sock3[300], sock4[300];
static const char *S;            /* ../shared/models/stories260K */
static char model_path[1024], tok_path[1024];

typedef struct gcase {
    int32_t *prompt, *greedy;
    int n_prompt, n_greedy;
    const char *text;
} gcase;

static int32_t *json_ints(json_t *a, int *n)
{
    *n = (int)json_array_size(a);
    int32_t *v = malloc(((size_t)*n + 1) * sizeof *v);
    for (int i = 0; i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

static ep_result R[48], REF[48];

static void test_handshake_and_golden(kvg_client *c)
{
    char path[600], err[256];
    const kvg_engine_info *in = kvg_client_info(c);
    ok(in != NULL, "client is UP after the handshake");
    if (!in)
        return;
    is_str(in->model_name, "stories260K", "served model name");
    is_int(in->context_length, 512, "context length");
    is_int(in->block_tokens, 16, "block size");
    is_int(in->vocab_size, 512, "vocabulary");
    ok(in->bos == 1 && in->eos == 2 && in->add_bos == 1, "BOS/EOS and the BOS policy (bos %d eos %d add %d)",
       in->bos, in->eos, in->add_bos);
    ok(in->chat.origin == KVG_CHAT_NONE && in->chat_template == NULL && strcmp(in->chat.name, "none") == 0,
       "chat template: none (llama2.c files carry none, and the test names none)");
    kvg_model_load_opts lo = { tok_path, NULL, NULL, 0 };
    kvg_model *m = kvg_model_load(model_path, &lo, err, sizeof err);
    ok(m && strcmp(m->id_hex, in->model_id_hex) == 0, "model id equals the model's own identity (%.16s)",
       in->model_id_hex);
    kvg_model_free(m);
    ok(in->tokenizer && strcmp(kvg_tokenizer_kind(in->tokenizer), "llama2c") == 0,
       "the engine's tokenizer (%s) reached the client", in->tokenizer_name);

    snprintf(path, sizeof path, "%s/golden-greedy.json", S);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    json_t *cases = json_object_get(root, "cases");
    ok(json_array_size(cases) == 5, "golden file: 5 cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *jc = json_array_get(cases, i);
        gcase g;
        g.prompt = json_ints(json_object_get(jc, "prompt_ids"), &g.n_prompt);
        g.greedy = json_ints(json_object_get(jc, "greedy_ids"), &g.n_greedy);
        size_t n;
        int32_t *ids = ep_tokens(c, json_string_value(json_object_get(jc, "prompt")), &n);
        ok(ids && (int)n == g.n_prompt && memcmp(ids, g.prompt, n * 4) == 0,
           "case %zu: the client tokenizes the prompt into the golden ids", i);
        free(ids);
        kvg_client_req q = ep_req(g.prompt, (size_t)g.n_prompt, (unsigned)g.n_greedy);
        q.bypass = 1;
        int rc = ep_run(c, &q, &R[0], 30);
        int same = rc == 0 && R[0].n_tokens[0] == (uint32_t)g.n_greedy;
        for (int k = 0; same && k < g.n_greedy; k++)
            same = R[0].tokens[0][k] == (uint32_t)g.greedy[k];
        ok(same, "case %zu: %d greedy tokens through the channel equal the reference", i, g.n_greedy);
        if (!same)
            diag("  rc %d, %u tokens, error %s", rc, R[0].n_tokens[0], R[0].message);
        ok(R[0].prompt_tokens == (uint32_t)g.n_prompt && R[0].cached_tokens == 0 &&
           R[0].completion_tokens == (uint32_t)g.n_greedy, "case %zu: usage %u/%u/%u", i, R[0].prompt_tokens,
           R[0].cached_tokens, R[0].completion_tokens);
        if (i == 0) {
            const char *full = json_string_value(json_object_get(jc, "full_text"));
            const char *want = full + strlen(json_string_value(json_object_get(jc, "prompt")));
            ok(R[0].text_len[0] == strlen(want) && memcmp(R[0].text[0], want, R[0].text_len[0]) == 0,
               "case 0: the streamed text is the reference continuation");
            ok(R[0].finish[0] == KVG_MSG_FINISH_LENGTH, "case 0: finish reason length");
        }
        free(g.prompt);
        free(g.greedy);
    }
    json_decref(root);
}

static const char *DOC =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high. Lily's mom "
    "said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do. She said, \"I want "
    "to play with your ball, but I can't find it.\" Lily was sad and didn't know what to do. Tim had a "
    "red ball. He liked to kick it very far. One day the ball went into the garden of an old man. Tim "
    "was scared. He wanted to help the ball. He wanted to play with the ball. He picked up the ball "
    "and put it in the ball. The little bird wanted to fly high in the sky, but it was too high.";

static void test_cache_and_tenants(kvg_client *c)
{
    size_t n;
    int32_t *ids = ep_tokens(c, DOC, &n);
    ok(n >= 128, "the document is %zu tokens (cached bucket)", n);
    kvg_client_req q = ep_req(ids, n, 24);
    q.temperature = 0.8f;
    q.seed = 11;
    q.n = 3;
    q.salt = "alpha";
    q.salt_len = 5;
    ep_run(c, &q, &R[1], 30);
    ep_run(c, &q, &R[2], 30);
    ok(R[1].done && R[1].cached_tokens == 0, "first request: nothing cached (%u)", R[1].cached_tokens);
    uint32_t servable = (uint32_t)((n - 1) / 16 * 16);
    ok(R[2].done && R[2].cached_tokens == servable, "second request: %u of %zu prompt tokens cached (all %u servable)",
       R[2].cached_tokens, n, servable);
    ok(ep_same(&R[1], &R[2], 3), "cached and uncached answers are identical, 3 samples, bit for bit");
    is_str(kvg_cache_status(0, R[2].prompt_tokens, R[2].cached_tokens, 16), "hit", "  which is a 'hit'");
    ok(!(R[1].n_tokens[0] == R[1].n_tokens[1] &&
         memcmp(R[1].tokens[0], R[1].tokens[1], R[1].n_tokens[0] * 4) == 0),
       "samples 0 and 1 differ (seeded sampling, sample index in the stream)");
    q.n = 1;
    ep_run(c, &q, &R[3], 30);
    ok(R[3].n_tokens[0] == R[1].n_tokens[0] && memcmp(R[3].tokens[0], R[1].tokens[0], R[3].n_tokens[0] * 4) == 0,
       "n=1 with the same seed is sample 0 of n=3");
    q.n = 3;
    q.salt = "beta";
    q.salt_len = 4;
    ep_run(c, &q, &R[4], 30);
    ok(R[4].done && R[4].cached_tokens == 0, "the same prompt under another tenant: 0 cached (%u)",
       R[4].cached_tokens);
    ok(ep_same(&R[1], &R[4], 3), "  and the same answer");
    /* The stats page saw it. */
    kvg_stats st;
    ep_stats(c, &st);
    ok(st.hit_tokens >= servable && st.query_tokens >= 3 * n, "stats: %llu of %llu queried tokens hit",
       (unsigned long long)st.hit_tokens, (unsigned long long)st.query_tokens);
    int found = 0;
    for (int i = 0; i < st.n_tenants; i++)
        found += !strcmp(st.tenant[i].name, "alpha") || !strcmp(st.tenant[i].name, "beta");
    ok(found == 2, "stats: both tenants listed with their cached blocks");
    ok(st.bucket[0].requests >= 5 && st.bucket[1].requests >= 4, "stats: bypass and cached buckets counted");
    free(ids);
}

/* A mix of requests: prompts of several lengths, greedy and seeded, n 1..4. */
static int N_MIX;
static int32_t *MIX_IDS[32];
static size_t MIX_N[32];
static kvg_client_req MIX[32];

static void make_mix(kvg_client *c)
{
    static const char *prompts[] = {
        "Once upon a time", "Lily and Tom went to the park. They saw a big dog.",
        "The little bird wanted to fly high in the sky, but", NULL, "Tim had a red ball.",
        "One day, a girl named Sue found a shiny key under her bed. She",
    };
    for (int i = 0; i < 18; i++) {
        const char *p = prompts[i % 6] ? prompts[i % 6] : DOC;
        MIX_IDS[i] = ep_tokens(c, p, &MIX_N[i]);
        MIX[i] = ep_req(MIX_IDS[i], MIX_N[i], (unsigned)(8 + 7 * i));
        MIX[i].bypass = MIX_N[i] < 128;
        MIX[i].temperature = i % 3 == 0 ? 0.0f : 0.9f;
        MIX[i].seed = (uint64_t)(100 + i);
        MIX[i].n = (unsigned)(1 + i % 4);
        MIX[i].top_k = i % 5 == 0 ? 40 : 0;
        MIX[i].salt = i % 2 ? "odd" : "even";
        MIX[i].salt_len = strlen(MIX[i].salt);
    }
    N_MIX = 18;
}

static void test_concurrent_clients(void)
{
    kvg_client *cs[6];
    ep_result *rs[32];
    int all = 1;
    for (int k = 0; k < 6; k++)
        cs[k] = ep_connect(sock1);
    for (int i = 0; i < N_MIX; i++) {
        ep_run(cs[0], &MIX[i], &REF[i], 30);
        all &= REF[i].done;
    }
    ok(all, "%d mixed requests, each alone: all complete", N_MIX);
    /* Now all at once: three per client, interleaved submission order. */
    for (int i = 0; i < N_MIX; i++) {
        char err[256];
        uint64_t id;
        memset(&R[i], 0, sizeof R[i]);
        rs[i] = &R[i];
        if (kvg_client_submit(cs[i % 6], &MIX[i], &R[i], &id, err, sizeof err) != 0)
            diag("submit %d: %s", i, err);
    }
    int open_ = ep_pump(cs, 6, rs, N_MIX, 60);
    ok(open_ == 0, "6 clients x 3 concurrent requests: all complete");
    int same = 0;
    for (int i = 0; i < N_MIX; i++) {
        int s = ep_same(&REF[i], &R[i], (int)MIX[i].n);
        same += s;
        if (!s)
            diag("request %d differs from its solo run", i);
    }
    is_int(same, N_MIX, "every concurrent result equals its solo run (tokens, logprobs, text, finish)");
    for (int k = 0; k < 6; k++)
        kvg_client_free(cs[k]);
}

static void test_small_rings(void)
{
    kvg_client *c = ep_connect(sock2);
    ep_result *rs[32];
    int same = 0;
    if (!c) {
        ok(0, "connect to the small-ring engine");
        return;
    }
    /* 8-slot rings with a 4 KiB completion area: every request wraps the rings. */
    for (int round = 0; round < 6; round++)
        for (int i = 0; i < N_MIX; i++) {
            ep_run(c, &MIX[i], &R[0], 30);
            same += ep_same(&REF[i], &R[0], (int)MIX[i].n);
        }
    is_int(same, 6 * N_MIX, "8-slot rings, 4 KiB data: %d sequential requests, all identical to the reference",
           6 * N_MIX);
    /* All at once through one client: the completion ring overflows constantly. */
    for (int i = 0; i < N_MIX; i++) {
        char err[256];
        uint64_t id;
        int rc;
        memset(&R[i], 0, sizeof R[i]);
        rs[i] = &R[i];
        while ((rc = kvg_client_submit(c, &MIX[i], &R[i], &id, err, sizeof err)) == KVG_CLIENT_AGAIN) {
            kvg_client_event ev;
            while (kvg_client_next_event(c, &ev) == 1)
                ep_record(&ev);
            kvg_client_wait(c, 10);
        }
    }
    ok(ep_pump(&c, 1, rs, N_MIX, 60) == 0, "18 concurrent requests through 8-slot rings complete");
    same = 0;
    for (int i = 0; i < N_MIX; i++)
        same += ep_same(&REF[i], &R[i], (int)MIX[i].n);
    is_int(same, N_MIX, "  every one identical to the reference");

    /* A reader that stops: its request is held, the engine's buffering stays bounded. */
    size_t n;
    int32_t *ids = ep_tokens(c, "Once upon a time", &n);
    kvg_client_req q = ep_req(ids, n, 480);
    q.n = 4;
    q.bypass = 1;
    q.temperature = 0.7f;
    q.seed = 5;
    ep_run(c, &q, &REF[40], 60);
    char err[256];
    uint64_t id;
    memset(&R[40], 0, sizeof R[40]);
    kvg_client_submit(c, &q, &R[40], &id, err, sizeof err);
    kvg_stats st;
    int held = 0, still_running = 0;
    double until = ep_now() + EP_WAIT_S;
    while (ep_now() < until && !held) {
        ep_sleep_ms(20);
        ep_stats(c, &st);
        held = st.held > 0;
        still_running = st.running == 1;
    }
    ok(held && still_running, "a client that does not read gets its request held (held %d, running %d)", st.held,
       st.running);
    ep_sleep_ms(200);
    kvg_stats st2;
    ep_stats(c, &st2);
    ok(st2.decode_tokens == st.decode_tokens || st2.held > 0,
       "  while held it does not generate (%llu -> %llu decode tokens)", (unsigned long long)st.decode_tokens,
       (unsigned long long)st2.decode_tokens);
    rs[0] = &R[40];
    ok(ep_pump(&c, 1, rs, 1, 60) == 0, "  reading again, it completes");
    ok(ep_same(&REF[40], &R[40], 4), "  with exactly the output it has when read at once (4 x %u tokens)",
       R[40].n_tokens[0]);
    free(ids);
    kvg_client_free(c);
}

/* Drains every event pending now into their results. */
static void drain_events(kvg_client *c)
{
    kvg_client_event ev;
    while (kvg_client_next_event(c, &ev) == 1)
        ep_record(&ev);
}

static uint32_t received(const ep_result *r, int n)
{
    uint32_t t = 0;
    for (int j = 0; j < n; j++)
        t += r->n_tokens[j];
    return t;
}

/* PAUSE and RESUME (the gateway's backpressure): a paused request is held with all of
 * its samples while its client keeps reading, then completes unchanged; hostile or
 * crossing messages (pause twice, resume without pause, an id the engine no longer
 * knows) change nothing and break nothing. */
static void test_pause_resume(void)
{
    kvg_client *c = ep_connect(sock1);
    char err[256];
    uint64_t id, id2;
    kvg_stats st, st0, st2;
    double until;
    if (!c) {
        ok(0, "connect for pause/resume");
        return;
    }
    size_t n;
    int32_t *ids = ep_tokens(c, "Once upon a time", &n);
    kvg_client_req q = ep_req(ids, n, 400);
    q.n = 3;
    q.bypass = 1;
    q.temperature = 0.8f;
    q.seed = 11;
    ep_run(c, &q, &REF[41], 60);
    ep_stats(c, &st0);

    memset(&R[41], 0, sizeof R[41]);
    ok(kvg_client_submit(c, &q, &R[41], &id, err, sizeof err) == 0, "a 3-sample request is submitted");
    until = ep_now() + EP_WAIT_S;
    while (ep_now() < until && received(&R[41], 3) < 3) {
        kvg_client_wait(c, 10);
        drain_events(c);
    }
    ok(kvg_client_pause(c, id, 1) == 0, "  PAUSE after its first tokens (%u)", received(&R[41], 3));
    ok(kvg_client_pause(c, id, 1) == 0, "  and PAUSE again (idempotent in the engine)");
    /* Read on while paused: the engine still delivers what it made before the pause,
     * then nothing more. */
    int paused = 0;
    until = ep_now() + EP_WAIT_S;
    while (ep_now() < until && !paused) {
        kvg_client_wait(c, 10);
        drain_events(c);
        ep_stats(c, &st);
        paused = st.paused == 1 && st.held >= 1 && st.running == 1;
    }
    ok(paused, "  the engine shows it paused and held (paused %d, held %d, running %d)", st.paused, st.held,
       st.running);
    ok(st.pauses == st0.pauses + 1, "  one pause counted for two PAUSEs (%llu -> %llu)",
       (unsigned long long)st0.pauses, (unsigned long long)st.pauses);
    /* Whatever was in flight has arrived within a few steps; then the count stays. */
    ep_sleep_ms(100);
    drain_events(c);
    uint32_t got = received(&R[41], 3);
    ep_stats(c, &st);
    ep_sleep_ms(300);
    drain_events(c);
    ep_stats(c, &st2);
    ok(received(&R[41], 3) == got && st2.decode_tokens == st.decode_tokens && !R[41].done,
       "  while paused no sample generates (%u tokens received, %llu -> %llu decode tokens)", got,
       (unsigned long long)st.decode_tokens, (unsigned long long)st2.decode_tokens);

    /* A second request runs meanwhile; RESUME without PAUSE on it changes nothing. */
    kvg_client_req q2 = ep_req(ids, n, 40);
    q2.bypass = 1;
    memset(&R[42], 0, sizeof R[42]);
    ok(kvg_client_submit(c, &q2, &R[42], &id2, err, sizeof err) == 0 && kvg_client_pause(c, id2, 0) == 0,
       "another request, with a RESUME it never needed");
    ep_result *rs[2] = { &R[42] };
    int rc = ep_pump(&c, 1, rs, 1, 60);
    ok(rc == 0 && R[42].done && R[42].completion_tokens == 40,
       "  completes beside the paused one (%u tokens)", R[42].completion_tokens);
    ep_stats(c, &st);
    ok(st.resumes == st0.resumes && st.paused == 1, "  the stray RESUME is not counted (resumes %llu, paused %d)",
       (unsigned long long)st.resumes, st.paused);
    /* Its id is over in the engine once its DONE was pushed; the client forgets it
     * when it reads the DONE: pause it in between (submit, wait for the engine to
     * finish it, then pause before reading) and the engine gets an id it does not
     * know any more. */
    uint64_t id3;
    memset(&R[43], 0, sizeof R[43]);
    kvg_client_submit(c, &q2, &R[43], &id3, err, sizeof err);
    until = ep_now() + EP_WAIT_S;
    do {
        ep_sleep_ms(5);
        ep_stats(c, &st2);
    } while (ep_now() < until && st2.completed < st.completed + 1);
    ok(kvg_client_pause(c, id3, 1) == 0, "PAUSE of a request the engine already finished (messages crossing)");
    rs[0] = &R[43];
    rc = ep_pump(&c, 1, rs, 1, 60);
    ok(rc == 0 && R[43].done && R[43].completion_tokens == 40, "  it is simply done");
    ok(kvg_client_pause(c, id3, 1) == -1 && kvg_client_pause(c, 123456789, 0) == -1,
       "  the client refuses to pause or resume ids that are not live");
    ep_stats(c, &st2);
    ok(st2.pauses == st0.pauses + 1 && st2.paused == 1 && st2.protocol_errors == st0.protocol_errors,
       "  ignored by the engine: no pause counted, no protocol error (pauses %llu, errors %llu)",
       (unsigned long long)st2.pauses, (unsigned long long)st2.protocol_errors);

    ok(kvg_client_pause(c, id, 0) == 0 && kvg_client_pause(c, id, 0) == 0, "RESUME the paused request (twice)");
    rs[0] = &R[41];
    rc = ep_pump(&c, 1, rs, 1, 60);
    ok(rc == 0 && R[41].done, "  it completes");
    ok(ep_same(&REF[41], &R[41], 3), "  with exactly the output of an unpaused run (3 x %u tokens)",
       R[41].n_tokens[0]);
    ep_stats(c, &st2);
    ok(st2.resumes == st0.resumes + 1 && st2.paused == 0 && st2.held == 0,
       "  one resume counted, nothing paused or held any more (resumes %llu, paused %d, held %d)",
       (unsigned long long)st2.resumes, st2.paused, st2.held);

    /* A paused request that is cancelled is gone, blocks and all. */
    memset(&R[44], 0, sizeof R[44]);
    kvg_client_submit(c, &q, &R[44], &id, err, sizeof err);
    until = ep_now() + EP_WAIT_S;
    while (ep_now() < until && received(&R[44], 3) < 1) {
        kvg_client_wait(c, 10);
        drain_events(c);
    }
    kvg_client_pause(c, id, 1);
    until = ep_now() + EP_WAIT_S;
    do {
        ep_sleep_ms(5);
        drain_events(c);
        ep_stats(c, &st);
    } while (ep_now() < until && st.paused != 1);
    ok(st.paused == 1 && st.blocks_used > 0, "a paused request holds its blocks (%d in use)", st.blocks_used);
    kvg_client_cancel(c, id);
    until = ep_now() + EP_WAIT_S;
    do {
        ep_sleep_ms(5);
        ep_stats(c, &st);
    } while (ep_now() < until && (st.paused != 0 || st.running != 0 || st.blocks_used != 0));
    ok(st.paused == 0 && st.running == 0 && st.blocks_used == 0,
       "  cancelled while paused: it is gone and its blocks are free (paused %d, running %d, used %d)", st.paused,
       st.running, st.blocks_used);
    free(ids);
    kvg_client_free(c);
}

/* A client that reads nothing: the engine makes at most --max-unread-tokens (256 by
 * default) tokens per sample ahead of it, though its completion ring (1024 slots) has
 * room for the whole answer. That is what bounds a paused stream's memory in the
 * gateway whatever the machine's scheduling: the ring's unread messages count, not
 * only what the engine still buffers. */
static void test_unread_bound(void)
{
    kvg_client *c = ep_connect(sock1);
    char err[256];
    uint64_t id;
    kvg_stats st0, st, st2;
    if (!c) {
        ok(0, "connect for the unread bound");
        return;
    }
    size_t n;
    int32_t *ids = ep_tokens(c, "Once upon a time", &n);
    kvg_client_req q = ep_req(ids, n, 480);
    q.n = 2;
    q.bypass = 1;
    ep_run(c, &q, &REF[45], 60);
    ep_stats(c, &st0);
    memset(&R[45], 0, sizeof R[45]);
    ok(kvg_client_submit(c, &q, &R[45], &id, err, sizeof err) == 0, "a 2 x 480-token request nobody reads");
    double until = ep_now() + EP_WAIT_S;
    do {
        ep_sleep_ms(5);
        ep_stats(c, &st);
    } while (ep_now() < until && st.held != 1);
    ep_sleep_ms(200);
    ep_stats(c, &st2);
    uint64_t made = st2.decode_tokens - st0.decode_tokens;
    ok(st.held == 1 && st2.held == 1 && st2.running == 1 && st2.decode_tokens == st.decode_tokens,
       "  held by the engine, generating nothing more (held %d, running %d, %llu -> %llu decode tokens)",
       st2.held, st2.running, (unsigned long long)st.decode_tokens, (unsigned long long)st2.decode_tokens);
    ok(made >= 2 * 255 && made <= 2 * 257,
       "  after 256 tokens a sample, not all %u of its answer, though its ring has room (%llu made)",
       REF[45].n_tokens[0], (unsigned long long)made);
    ep_result *rs[1] = { &R[45] };
    ok(ep_pump(&c, 1, rs, 1, 60) == 0 && R[45].done, "  read, it completes");
    ok(ep_same(&REF[45], &R[45], 2), "  with exactly the output it has when read at once (2 x %u tokens)",
       R[45].n_tokens[0]);
    ep_stats(c, &st2);
    ok(st2.held == 0 && st2.running == 0, "  nothing held or running after it (held %d, running %d)", st2.held,
       st2.running);
    free(ids);
    kvg_client_free(c);
}

static void test_channel_limits(void)
{
    kvg_client *c = ep_connect(sock3);
    char err[512];
    uint64_t id;
    if (!c) {
        ok(0, "connect to the small-sq engine");
        return;
    }
    ok(kvg_client_info(c)->max_submit_bytes == 2048, "--sq-data 4096: requests up to 2048 bytes (%llu)",
       (unsigned long long)kvg_client_info(c)->max_submit_bytes);
    size_t n, nd;
    int32_t *doc = ep_tokens(c, DOC, &nd), *ids = malloc(480 * sizeof *ids);
    for (n = 0; n < 480; n++)
        ids[n] = doc[n % nd];
    free(doc);
    kvg_client_req q = ep_req(ids, n, 8);
    memset(&R[0], 0, sizeof R[0]);
    err[0] = '\0';
    int rc = kvg_client_submit(c, &q, &R[0], &id, err, sizeof err);
    ok(rc == -1 && strstr(err, "larger than the channel carries"), "a %zu-token request is refused: %s", n, err);
    ok(kvg_client_get_state(c) == KVG_CLIENT_UP && kvg_client_live(c) == 0, "  the connection stays up (rc %d state %d live %zu)", rc, kvg_client_get_state(c), kvg_client_live(c));
    q = ep_req(ids, 20, 8);
    q.bypass = 1;
    ok(ep_run(c, &q, &R[0], 30) == 0, "  and a small request still works");
    /* The client sends ids and hash counts as given; the engine's intake is the one
     * place that checks them (the gateway checks a user's ids before). */
    {
        int32_t bad[3] = { 1, 512, 2 };
        q = ep_req(bad, 3, 4);
        q.bypass = 1;
        ep_run(c, &q, &R[0], 30);
        ok(R[0].error && R[0].status == 400 && strstr(R[0].message, "prompt token 1 (id 512) is outside the "
                                                      "vocabulary of 512"),
           "an id outside the vocabulary: the engine answers 400 (%s)", R[0].message);
        uint8_t hs[2][KVG_PREFIX_HASH_LEN];
        size_t nh = 0;
        ok(kvg_client_hash_prompt(c, "t", 1, ids, 40, hs, 2, &nh, err, sizeof err) == 0 && nh == 2,
           "hashes of a 40-token prompt: 2 blocks");
        q = ep_req(ids, 40, 4);
        q.bucket = 1;
        q.hashes = (const uint8_t (*)[KVG_PREFIX_HASH_LEN])hs;
        q.n_hashes = 1;
        ep_run(c, &q, &R[0], 30);
        ok(R[0].error && R[0].status == 400 && strstr(R[0].message, "1 block hashes for 40 tokens"),
           "one hash for two blocks: the engine answers 400 (%s)", R[0].message);
        q.n_hashes = 2;
        ok(ep_run(c, &q, &R[0], 30) == 0, "  with both hashes it completes");
    }
    /* The pool holds 4 blocks: a request that can never fit is refused by the engine. */
    q = ep_req(ids, n, 100);
    q.bypass = 1;
    kvg_client_free(c);
    c = ep_connect(sock4);
    if (c) {
        q.tokens = ids;
        q.n_tokens = 100;
        ep_run(c, &q, &R[0], 30);
        ok(R[0].error && R[0].status == 400 && strstr(R[0].message, "KV blocks"),
           "a request larger than the whole pool: 400 (%s)", R[0].message);
        /* --max-waiting 1 --max-running 1: a burst gets 429 for what cannot queue. */
        ep_result *rs[4];
        kvg_client_req b = ep_req(ids, 8, 40);
        b.bypass = 1;
        int n429 = 0, done = 0;
        for (int i = 0; i < 4; i++) {
            memset(&R[i], 0, sizeof R[i]);
            rs[i] = &R[i];
            kvg_client_submit(c, &b, &R[i], &id, err, sizeof err);
        }
        ep_pump(&c, 1, rs, 4, 30);
        for (int i = 0; i < 4; i++) {
            n429 += R[i].error && R[i].status == 429;
            done += R[i].done;
        }
        ok(n429 >= 1 && n429 + done == 4 && done >= 1, "a burst of 4 at --max-waiting 1: %d done, %d refused "
           "with 429", done, n429);
        if (n429)
            for (int i = 0; i < 4; i++)
                if (R[i].error) {
                    ok(strstr(R[i].message, "saturated") != NULL, "  429 says: %s", R[i].message);
                    break;
                }
        kvg_client_free(c);
    }
    free(ids);
}

int main(void)
{
    static char mp[512], tp[1024];
    engine_proc e1, e2, e3, e4;
    S = NULL;
    snprintf(mp, sizeof mp, "%s/models/stories260K", shared_dir());
    S = mp;
    snprintf(model_path, sizeof model_path, "%s/stories260K.bin", S);
    snprintf(tok_path, sizeof tok_path, "%s/tok512.bin", S);
    snprintf(tp, sizeof tp, "%s", tok_path);
    snprintf(sock1, sizeof sock1, "%s/e1.sock", ep_tmpdir());
    snprintf(sock2, sizeof sock2, "%s/e2.sock", ep_tmpdir());
    snprintf(sock3, sizeof sock3, "%s/e3.sock", ep_tmpdir());
    snprintf(sock4, sizeof sock4, "%s/e4.sock", ep_tmpdir());
    const char *a1[] = { "--model", model_path, "--tokenizer", tp, "--socket", sock1, "--threads", "1",
                         "--kv-memory", "64M", NULL };
    const char *a2[] = { "--model", model_path, "--tokenizer", tp, "--socket", sock2, "--threads", "1",
                         "--kv-memory", "64M", "--ring-slots", "8", "--cq-data", "4096", NULL };
    const char *a3[] = { "--model", model_path, "--tokenizer", tp, "--socket", sock3, "--threads", "1",
                         "--sq-data", "4096", NULL };
    const char *a4[] = { "--model", model_path, "--tokenizer", tp, "--socket", sock4, "--threads", "1",
                         "--kv-memory", "80K", "--max-waiting", "1", "--max-running", "1", NULL };
    if (ep_start(&e1, a1) != 0 || ep_start(&e2, a2) != 0 || ep_start(&e3, a3) != 0 || ep_start(&e4, a4) != 0) {
        ok(0, "engines start");
        return done_testing();
    }
    ok(strstr(e1.ready, "ready on") && strstr(e1.ready, "stories260K"), "readiness line: %.*s",
       (int)strcspn(e1.ready, "\n"), e1.ready);
    {
        const char *p = strstr(e4.ready, "KV pool ");
        int blocks = p ? atoi(p + 8) : -1;
        ok(blocks >= 2 && blocks <= 4, "--kv-memory 80K: a pool of %d blocks", blocks);
    }
    kvg_client *c = ep_connect(sock1);
    if (!c) {
        ok(0, "connect");
        return done_testing();
    }
    test_handshake_and_golden(c);
    test_cache_and_tenants(c);
    make_mix(c);
    kvg_client_free(c);
    test_concurrent_clients();
    test_small_rings();
    test_pause_resume();
    test_unread_bound();
    test_channel_limits();
    is_int(ep_stop(&e1, SIGTERM, 30), 0, "engine 1 exits 0 on SIGTERM");
    is_int(ep_stop(&e2, SIGTERM, 30), 0, "engine 2 exits 0 on SIGTERM");
    is_int(ep_stop(&e3, SIGTERM, 30), 0, "engine 3 exits 0 on SIGTERM");
    is_int(ep_stop(&e4, SIGTERM, 30), 0, "engine 4 exits 0 on SIGTERM");
    ok(access(sock1, F_OK) != 0, "the socket file is removed on stop");
    char *log = ep_stderr(&e1);
    ok(strstr(log, "AddressSanitizer") == NULL && strstr(log, "runtime error") == NULL, "engine stderr is clean");
    free(log);
    for (int i = 0; i < N_MIX; i++)
        free(MIX_IDS[i]);
    return done_testing();
}
