/* The engine's cache index and load through a real engine process and the client
 * library (what a gateway routing over several engines reads): nothing is held before
 * a prompt ran; after its DONE every full block of it is (and a generated block the
 * chain extends to); a prefix of it is found as a prefix; the same tokens under
 * another tenant are not; a second client sees the same set; blocks evicted by
 * pressure in a small pool leave it. The load is 0 when idle, counts a request the
 * engine holds back (PAUSE before admission: its prompt), and goes back to 0. Every
 * wait has a deadline. */
#include "engine_proc.h"

static char sock1[300], sock2[300];
static char model_path[1024], tok_path[1024];

/* ids of a synthetic prompt: BOS then n - 1 ids from a family (distinct per seed). */
static void mk_prompt(int32_t *ids, int n, int seed)
{
    ids[0] = 1;
    for (int i = 1; i < n; i++)
        ids[i] = 3 + (int32_t)((seed * 131 + i * 17) % 500);
}

static size_t cached_of(kvg_client *c, const char *tenant, const int32_t *ids, size_t n,
                      uint8_t (*h)[KVG_PREFIX_HASH_LEN], size_t cap, size_t *nh)
{
    char err[256];
    if (kvg_client_hash_prompt(c, tenant, strlen(tenant), ids, n, h, cap, nh, err, sizeof err) != 0) {
        diag("hash: %s", err);
        return (size_t)-1;
    }
    return kvg_client_cached_prefix(c, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])h, *nh);
}

/* Polls until the held prefix of the chain is `want` (or, want_less, below it). */
static size_t wait_cached(kvg_client *c, const char *tenant, const int32_t *ids, size_t n, size_t want,
                        int want_less, double timeout_s)
{
    uint8_t h[64][KVG_PREFIX_HASH_LEN];
    size_t nh, got = 0;
    double deadline = ep_now() + timeout_s;
    for (;;) {
        got = cached_of(c, tenant, ids, n, h, 64, &nh);
        if (want_less ? got < want : got == want)
            return got;
        if (ep_now() > deadline)
            return got;
        ep_sleep_ms(10);
    }
}

static uint64_t wait_load(kvg_client *c, int want_zero, double timeout_s)
{
    double deadline = ep_now() + timeout_s;
    for (;;) {
        kvg_client_event ev;
        while (kvg_client_next_event(c, &ev) == 1)
            ep_record(&ev);
        uint64_t l = kvg_client_load(c);
        if (want_zero ? l == 0 : l > 0)
            return l;
        if (ep_now() > deadline)
            return l;
        kvg_client_wait(c, 10);
    }
}

static void test_held_and_tenants(void)
{
    kvg_client *c = ep_connect(sock1), *c2 = ep_connect(sock1);
    static ep_result r;
    int32_t ids[80];
    uint8_t h[64][KVG_PREFIX_HASH_LEN];
    size_t nh;
    if (!c || !c2) {
        ok(0, "connect");
        kvg_client_free(c);
        kvg_client_free(c2);
        return;
    }
    mk_prompt(ids, 70, 1);           /* 4 full blocks of 16 */
    is_int((int)cached_of(c, "t", ids, 70, h, 64, &nh), 0, "nothing held before the prompt ran");
    is_int((int)nh, 4, "the prompt has 4 full blocks");
    is_int((int)kvg_client_cached_prefix(c, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])h, 0), 0, "an empty chain: 0");
    kvg_client_req q = ep_req(ids, 70, 12);
    ok(ep_run(c, &q, &r, 30) == 0, "the prompt ran (%s)", r.message);
    /* Committed during prefill, so visible by DONE; the wait only guards the test. */
    is_int((int)wait_cached(c, "t", ids, 70, 4, 0, 5), 4, "after DONE every full block of the prompt is held");
    is_int((int)wait_cached(c2, "t", ids, 70, 4, 0, 5), 4, "a second client sees the same set");
    is_int((int)cached_of(c, "t", ids, 40, h, 64, &nh), 2, "a 40-token prefix of it: its 2 blocks held");
    is_int((int)cached_of(c, "other", ids, 70, h, 64, &nh), 0, "the same tokens under another tenant: nothing");
    {
        /* The chain extended by the generated tokens: the block they completed too. */
        int32_t all[96];
        size_t n = 70;
        memcpy(all, ids, sizeof ids[0] * 70);
        for (uint32_t i = 0; i < r.n_tokens[0] && n < 96; i++)
            all[n++] = (int32_t)r.tokens[0][i];
        /* greedy over this prompt, the model runs all 12 tokens (no end of text):
           a block of 16 is completed at token 10 */
        ok(n >= 80 && cached_of(c, "t", all, 80, h, 64, &nh) == 5,
           "the block completed by generated tokens is in the index (%zu generated)", n - 70);
    }
    {
        int32_t other[70];
        mk_prompt(other, 70, 1);
        other[20] ^= 1;              /* differs in block 1: blocks 1.. are another chain */
        is_int((int)cached_of(c, "t", other, 70, h, 64, &nh), 1, "a prompt diverging in block 1: 1 block held");
    }
    kvg_client_free(c2);
    kvg_client_free(c);
}

/* Submits q and pauses it; returns once the engine confirms the pause (its statistics
 * page counts it paused). The engine may finish the request between the SUBMIT and the
 * PAUSE messages (a busy machine can preempt the client there): then the pause never
 * takes and this tries again with a fresh request. 0, or -1 after every try lost. */
static int submit_paused(kvg_client *c, const kvg_client_req *q, ep_result *r, uint64_t *id)
{
    char err[256];
    for (int attempt = 0; attempt < 20; attempt++) {
        memset(r, 0, sizeof *r);
        if (kvg_client_submit(c, q, r, id, err, sizeof err) != 0 || kvg_client_pause(c, *id, 1) != 0) {
            diag("submit/pause: %s", err);
            return -1;
        }
        double deadline = ep_now() + 10;
        kvg_stats st;
        for (;;) {
            kvg_client_event ev;
            while (kvg_client_next_event(c, &ev) == 1)
                ep_record(&ev);
            if (kvg_client_stats(c, &st) == 0 && st.paused == 1)
                return 0;
            if (r->done || r->error || ep_now() > deadline)
                break;
            kvg_client_wait(c, 10);
        }
        if (!r->done)
            return -1;
        diag("the request finished before its pause reached the engine; again");
    }
    return -1;
}

static void test_load(void)
{
    kvg_client *c = ep_connect(sock1);
    static ep_result r;
    int32_t ids[100];
    uint64_t id;
    if (!c) {
        ok(0, "connect");
        return;
    }
    is_int((int)wait_load(c, 1, 10), 0, "idle: load 0");
    mk_prompt(ids, 100, 7);
    kvg_client_req q = ep_req(ids, 100, 200);
    ok(submit_paused(c, &q, &r, &id) == 0, "a request submitted and paused (the engine counts it paused)");
    uint64_t l = wait_load(c, 0, 10);
    ok(l > 0 && l <= 100 + 200, "the paused request is load: %llu tokens (at most its prompt and output)",
       (unsigned long long)l);
    ok(kvg_client_pause(c, id, 0) == 0, "resumed");
    ep_pump(&c, 1, (ep_result *[]){ &r }, 1, 30);
    ok(r.done, "it completed (%s)", r.message);
    is_int((int)wait_load(c, 1, 10), 0, "done: load back to 0");
    /* The same prompt again: its 6 full blocks are cached, so whether the engine
     * took it in before the pause (prefilling: the tokens left) or not (queued: the
     * prompt less what the cache held when it arrived), it is the 4 tokens of the
     * last partial block at most, not 100. */
    q.max_tokens = 8;
    ok(submit_paused(c, &q, &r, &id) == 0, "the same prompt submitted and paused");
    l = wait_load(c, 0, 10);
    ok(l >= 1 && l <= 4, "its load is the uncached rest: %llu tokens", (unsigned long long)l);
    ok(kvg_client_pause(c, id, 0) == 0, "resumed");
    ep_pump(&c, 1, (ep_result *[]){ &r }, 1, 30);
    ok(r.done && r.cached_tokens == 96, "it completed, 96 tokens cached (%u)", r.cached_tokens);
    kvg_client_free(c);
}

static void test_eviction(void)
{
    kvg_client *c = ep_connect(sock2);
    static ep_result r;
    int32_t a[40], b[400];
    kvg_stats st;
    if (!c || kvg_client_stats(c, &st) != 0) {
        ok(0, "connect / stats");
        kvg_client_free(c);
        return;
    }
    int total = st.blocks_total;
    mk_prompt(a, 40, 3);             /* 2 full blocks */
    kvg_client_req q = ep_req(a, 40, 2);
    ok(ep_run(c, &q, &r, 30) == 0, "prompt A ran in a pool of %d blocks", total);
    is_int((int)wait_cached(c, "t", a, 40, 2, 0, 5), 2, "A's 2 blocks are held");
    /* B needs every block of the pool: A's cached blocks are evicted for it. */
    int nb = (total - 1) * 16;
    if (nb > 400)
        nb = 400;
    mk_prompt(b, nb, 9);
    q = ep_req(b, (size_t)nb, 2);
    q.salt = "u";
    ok(ep_run(c, &q, &r, 30) == 0, "prompt B of %d tokens ran (%s)", nb, r.message);
    ok(wait_cached(c, "t", a, 40, 2, 1, 5) < 2, "A's evicted blocks left the cache index");
    kvg_client_stats(c, &st);
    ok(st.evictions_lru + st.evictions_quota + st.evictions_ttl > 0, "the engine counted evictions (%llu)",
       (unsigned long long)(st.evictions_lru + st.evictions_quota + st.evictions_ttl));
    kvg_client_free(c);
}

int main(void)
{
    static char mp[512];
    engine_proc e1, e2;
    (void)ep_tokens;             /* a helper of engine_proc.h this test does not need */
    snprintf(mp, sizeof mp, "%s/models/stories260K", shared_dir());
    snprintf(model_path, sizeof model_path, "%s/stories260K.bin", mp);
    snprintf(tok_path, sizeof tok_path, "%s/tok512.bin", mp);
    snprintf(sock1, sizeof sock1, "%s/h1.sock", ep_tmpdir());
    snprintf(sock2, sizeof sock2, "%s/h2.sock", ep_tmpdir());
    const char *a1[] = { "--model", model_path, "--tokenizer", tok_path, "--socket", sock1, "--threads", "1",
                         "--kv-memory", "16M", NULL };
    const char *a2[] = { "--model", model_path, "--tokenizer", tok_path, "--socket", sock2, "--threads", "1",
                         "--kv-memory", "300K", NULL };
    if (ep_start(&e1, a1) != 0 || ep_start(&e2, a2) != 0) {
        ok(0, "engines start");
        return done_testing();
    }
    test_held_and_tenants();
    test_load();
    test_eviction();
    is_int(ep_stop(&e1, SIGTERM, 30), 0, "engine 1 exits 0 on SIGTERM");
    is_int(ep_stop(&e2, SIGTERM, 30), 0, "engine 2 exits 0 on SIGTERM");
    char *log = ep_stderr(&e1);
    ok(strstr(log, "AddressSanitizer") == NULL && strstr(log, "runtime error") == NULL, "engine stderr is clean");
    free(log);
    return done_testing();
}
