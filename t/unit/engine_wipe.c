/* An operator's tenant wipe on a running engine (WIPE, proto.h), through the client
 * library against the real engine process with a disk tier:
 *   - tenants A and B cache one long prompt; WIPE of A answers with its pool blocks,
 *     the cache index (what routing reads) forgets A's chain at once and keeps B's, A's
 *     repeat is computed afresh (0 cached tokens) with the very same output, B's still
 *     hits; a salt no tenant has is wiped with zeros;
 *   - blocks in use: a request of A keeps its prompt's blocks while a sample waits
 *     undrawn (n_active); the wipe unhashes them under it, the sample drawn afterwards
 *     gets exactly the reference output, and nothing of that request (neither its
 *     prompt nor its generated blocks) is cached afterwards;
 *   - the disk: after a clean stop (the pool persisted), WIPE of A on the restarted
 *     engine counts its disk blocks; after one more restart A still misses and B hits
 *     from disk. */
#include "engine_proc.h"

static char sock[300], model_path[1024], tok_path[1024], disk_dir[300];
static const char *const PROMPT =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park with her friends. One day, she saw a big red ball under a tree. She ran to the ball "
    "and picked it up. Her mom said she could keep it if she shared it with her friends. Lily "
    "was very happy and played with the ball all day long until the sun went down.";

static engine_proc E;

static int start_engine(void)
{
    const char *a[] = { "--model", model_path, "--tokenizer", tok_path, "--socket", sock, "--threads", "1",
                        "--kv-memory", "16M", "--kv-disk", disk_dir, "--kv-disk-size", "4M", NULL };
    return ep_start(&E, a);
}

/* Sends a WIPE of salt and waits for its answer into r. */
static int wipe(kvg_client *c, const char *salt, size_t len, ep_result *r)
{
    char err[256];
    uint64_t id;
    int rc;
    memset(r, 0, sizeof *r);
    double until = ep_now() + EP_WAIT_S;
    while ((rc = kvg_client_wipe(c, salt, len, r, &id, err, sizeof err)) == KVG_CLIENT_AGAIN &&
           ep_now() < until)
        kvg_client_wait(c, 20);
    if (rc != 0) {
        diag("wipe: %s", err);
        return -1;
    }
    ep_pump(&c, 1, &r, 1, EP_WAIT_S);
    return r->wiped ? 0 : -1;
}

static kvg_client_req req_for(const char *salt, const int32_t *ids, size_t n, unsigned max_tokens)
{
    kvg_client_req q = ep_req(ids, n, max_tokens);
    q.salt = salt;
    q.salt_len = strlen(salt);
    return q;
}

/* How many leading blocks of the prompt's chain under salt the engine's cache index holds. */
static size_t indexed(kvg_client *c, const char *salt, const int32_t *ids, size_t n)
{
    uint8_t h[64][KVG_PREFIX_HASH_LEN];
    size_t nb = 0;
    char err[256];
    if (kvg_client_hash_prompt(c, salt, strlen(salt), ids, n, h, 64, &nb, err, sizeof err) != 0) {
        diag("hash: %s", err);
        return 0;
    }
    return kvg_client_cached_prefix(c, (const uint8_t (*)[KVG_PREFIX_HASH_LEN])h, nb);
}

/* The statistics page's cached blocks of a named tenant (0 when not listed). */
static int32_t tenant_blocks(kvg_client *c, const char *name)
{
    kvg_stats s;
    if (ep_stats(c, &s) != 0)
        return -1;
    for (int i = 0; i < s.n_tenants && i < KVG_STATS_TENANTS; i++)
        if (strcmp(s.tenant[i].name, name) == 0)
            return s.tenant[i].cached_blocks;
    return 0;
}

int main(void)
{
    static ep_result first, again, r, w, ref;
    static char mp[512];
    size_t n;
    snprintf(mp, sizeof mp, "%s/models/stories260K", shared_dir());
    snprintf(model_path, sizeof model_path, "%s/stories260K.bin", mp);
    snprintf(tok_path, sizeof tok_path, "%s/tok512.bin", mp);
    snprintf(sock, sizeof sock, "%s/w.sock", ep_tmpdir());
    snprintf(disk_dir, sizeof disk_dir, "%s/kv", ep_tmpdir());
    if (start_engine() != 0) {
        ok(0, "the engine starts");
        return done_testing();
    }
    kvg_client *c = ep_connect(sock);
    if (!c) {
        ok(0, "connect");
        return done_testing();
    }
    int32_t *ids = ep_tokens(c, PROMPT, &n);
    uint32_t bt = kvg_client_info(c)->block_tokens;
    size_t nb = n / bt;                              /* the prompt's full blocks */
    uint32_t full = (uint32_t)((n - 1) / bt * bt);   /* what a hit serves */
    ok(n >= 64 && nb >= 4, "the prompt has %zu tokens, %zu full blocks", n, nb);

    /* ---- A and B cache it; A is wiped in the pool ---- */
    kvg_client_req qa = req_for("A", ids, n, 12), qb = req_for("B", ids, n, 12);
    ep_run(c, &qa, &first, EP_WAIT_S);
    ep_run(c, &qa, &again, EP_WAIT_S);
    ok(first.done && first.cached_tokens == 0 && again.cached_tokens == full,
       "A caches the prompt (%u, then %u cached)", first.cached_tokens, again.cached_tokens);
    ep_run(c, &qb, &r, EP_WAIT_S);
    ep_run(c, &qb, &r, EP_WAIT_S);
    is_int(r.cached_tokens, full, "B caches it too (its own blocks)");
    is_int(indexed(c, "A", ids, n), nb, "the cache index holds A's chain");

    is_int(wipe(c, "A", 1, &w), 0, "WIPE of A is answered");
    ok(w.wiped_blocks[0] >= nb && w.wiped_blocks[1] == 0 && w.wiped_blocks[2] == 0,
       "  %llu pool blocks (at least the prompt's %zu), 0 host, 0 disk", (unsigned long long)w.wiped_blocks[0], nb);
    is_int(indexed(c, "A", ids, n), 0, "  the cache index forgot A's chain at once");
    is_int(indexed(c, "B", ids, n), nb, "  and kept B's");
    ep_run(c, &qa, &r, EP_WAIT_S);
    ok(r.done && r.cached_tokens == 0, "A's repeat: computed afresh (%u cached tokens)", r.cached_tokens);
    ok(ep_same(&first, &r, 1), "  the same output as before the wipe");
    ep_run(c, &qb, &r, EP_WAIT_S);
    is_int(r.cached_tokens, full, "B's repeat still hits");
    int nrc = wipe(c, "nobody", 6, &w);
    ok(nrc == 0 && w.wiped_blocks[0] == 0 && w.wiped_blocks[1] == 0 && w.wiped_blocks[2] == 0,
       "WIPE of a tenant the engine never saw: answered with zeros");

    /* ---- blocks in use: a sample of A waits undrawn, holding the prompt's blocks ---- */
    {
        kvg_client_req qr = req_for("R", ids, n, 40);
        qr.n = 2;
        ep_run(c, &qr, &ref, EP_WAIT_S);             /* the reference: both samples at once */
        kvg_client_req qh = req_for("A", ids, n, 40);
        qh.n = 2;
        qh.n_active = 1;
        char err[256];
        uint64_t id;
        memset(&r, 0, sizeof r);
        ok(kvg_client_submit(c, &qh, &r, &id, err, sizeof err) == 0, "A's request with one sample undrawn");
        double until = ep_now() + EP_WAIT_S;
        while (!r.finish[0] && !r.error && ep_now() < until) {
            kvg_client_event ev;
            while (kvg_client_next_event(c, &ev) == 1)
                ep_record(&ev);
            kvg_client_wait(c, 20);
        }
        ok(r.finish[0] && !r.done && !r.error, "  sample 0 finished, the request lives on (its prompt kept)");
        is_int(r.accepted ? indexed(c, "A", ids, n) : 0, nb, "  the prompt's blocks are in the cache, in use");
        int wrc = wipe(c, "A", 1, &w);
        ok(wrc == 0 && w.wiped_blocks[0] >= nb, "WIPE of A while they are in use: %llu pool blocks",
           (unsigned long long)w.wiped_blocks[0]);
        is_int(indexed(c, "A", ids, n), 0, "  unhashed under the live request: not findable");
        ok(kvg_client_samples(c, id, 1, 0) == 0, "  then sample 1 is drawn");
        ep_result *rp = &r;
        ep_pump(&c, 1, &rp, 1, EP_WAIT_S);
        ok(r.done && ep_same(&ref, &r, 2), "  the request completes with exactly the reference output (%u + %u tokens)",
           r.n_tokens[0], r.n_tokens[1]);
        is_int(indexed(c, "A", ids, n), 0, "  nothing of it was cached afterwards: the prompt's chain");
        is_int(tenant_blocks(c, "A"), 0, "  nor its generated blocks (tenant A holds no block)");
        ep_run(c, &qa, &r, EP_WAIT_S);
        ok(r.done && r.cached_tokens == 0 && ep_same(&first, &r, 1), "A's next request: a miss, the same output");
    }

    /* ---- the disk: persisted at a clean stop, wiped on the next engine ---- */
    kvg_client_free(c);
    is_int(ep_stop(&E, SIGTERM, 30), 0, "the engine stops cleanly (its cached blocks go to disk)");
    if (start_engine() != 0 || !(c = ep_connect(sock))) {
        ok(0, "the engine restarts on the same disk");
        return done_testing();
    }
    int wrc = wipe(c, "A", 1, &w);
    ok(wrc == 0 && w.wiped_blocks[0] == 0 && w.wiped_blocks[2] >= nb,
       "WIPE of A on the restarted engine: %llu pool, %llu disk blocks", (unsigned long long)w.wiped_blocks[0],
       (unsigned long long)w.wiped_blocks[2]);
    kvg_client_free(c);
    is_int(ep_stop(&E, SIGTERM, 30), 0, "the engine stops again");
    if (start_engine() != 0 || !(c = ep_connect(sock))) {
        ok(0, "the engine restarts again");
        return done_testing();
    }
    ep_run(c, &qa, &r, EP_WAIT_S);
    ok(r.done && r.cached_tokens == 0 && ep_same(&first, &r, 1), "after another restart A still misses (%u cached)",
       r.cached_tokens);
    ep_run(c, &qb, &r, EP_WAIT_S);
    is_int(r.cached_tokens, full, "B hits, from disk");
    kvg_client_free(c);
    is_int(ep_stop(&E, SIGTERM, 30), 0, "the engine exits 0");
    char *log = ep_stderr(&E);
    ok(strstr(log, "wiped a tenant") != NULL, "the engine logs the wipe");
    ok(strstr(log, "AddressSanitizer") == NULL && strstr(log, "runtime error") == NULL, "engine stderr is clean");
    free(log);
    free(ids);
    /* the disk tier's file (4M) is this test's to remove */
    char f[400];
    snprintf(f, sizeof f, "%s/kvgate-kv.slots", disk_dir);
    unlink(f);
    rmdir(disk_dir);
    return done_testing();
}
