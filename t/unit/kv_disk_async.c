/* Asynchronous disk reads (kv_disk.h's reader thread, prefix_cache.h's kvg_pc_fetch_*)
 * through the scheduler on stories260K, a disk tier behind a pool of 8-token blocks:
 *   - a prompt whose blocks only the disk holds is admitted once the reader has read
 *     them, as hits (88 of its 96 tokens), with tokens and log-probs bit-identical to its
 *     first, computed answer; every block went through the reader (none read on the
 *     scheduler's thread);
 *   - while its reads are held (the reader's test gate, no timing), a request already
 *     running produces one token per step, 10 steps in a row, and the waiting request
 *     neither is accepted nor produces anything; released, it completes with the same
 *     answer, and so does the running one;
 *   - two requests waiting for the same blocks share the reads (issued once); cancelling
 *     one keeps them for the other; cancelling the last releases every staged read;
 *   - a corrupt slot found by the reader is a miss: the prompt is recomputed, the same
 *     answer, the slot counted corrupt;
 *   - reads beyond the staging bound are not started: those blocks are recomputed (the
 *     staged ones still hit), the same answer; a request none of whose reads can be staged
 *     is admitted at once and recomputes, nothing read on the scheduler's thread;
 *   - reads staged when their tenant is wiped are not served: recomputed.
 * The cache's invariants hold after each. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"
#include "kv_disk.h"
#include "kv_disk_testing.h"
#include "sched_rig.h"

#define MAXT 64
#define NP 96                    /* prompt A: 12 full blocks; 11 can hit (the last token's is computed) */

typedef struct out {
    int32_t tok[MAXT];
    float lp[MAXT];
    int n, accepted, done;
    int32_t cached;
    kvg_finish_reason reason;
} out;

static out outs[8];

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
        if (o->n < MAXT) {
            o->tok[o->n] = ev->token;
            o->lp[o->n++] = ev->logprob;
        }
        break;
    case KVG_SEV_FINISHED:
        o->reason = ev->reason;
        break;
    case KVG_SEV_DONE:
        o->done++;
        break;
    }
}

static kvg_model *M;
static kvg_backend *BE;
static sched_rig R;
static kvg_kv_disk *D;
static char err[512], base[256];
static int32_t A[NP], B[40], C[NP];
static uint8_t HA[NP / SCHED_RIG_BLOCK_TOKENS][KVG_PREFIX_HASH_LEN];
static out refA, refB, refC;

static kvg_kv_disk *open_disk(uint64_t staging)
{
    kvg_kv_disk_ident id;
    kvg_kv_disk *d;
    memset(&id, 0, sizeof id);
    memcpy(id.model_id, M->id, sizeof id.model_id);
    id.n_layers = R.kv->geom.n_layers;
    id.n_kv_heads = R.kv->geom.n_kv_heads;
    id.head_dim = R.kv->geom.head_dim;
    id.block_tokens = R.kv->geom.block_tokens;
    id.dtype = kvg_kv_disk_host_dtype(R.kv);
    id.payload_bytes = kvg_kv_xfer_bytes(R.kv);
    d = kvg_kv_disk_open(base, 256 * (KVG_KV_DISK_HDR_BYTES + id.payload_bytes + 4096), staging, &id,
                         err, sizeof err);
    if (!d || kvg_pc_set_disk(R.pc, d, err, sizeof err) != 0) {
        diag("disk: %s", err);
        kvg_kv_disk_close(d);
        return NULL;
    }
    return d;
}

static kvg_kv_disk_stats dstats(void)
{
    kvg_kv_disk_stats s;
    kvg_kv_disk_get_stats(D, &s);
    return s;
}

/* Every cached block to disk (written out), then out of the pool: A's prompt is on disk only. */
static int disk_only(void)
{
    static const uint8_t other[KVG_PREFIX_HASH_LEN] = { 0xee };
    kvg_pc_persist(R.pc);
    kvg_kv_disk_flush(D);
    kvg_pc_set_model(R.pc, other);   /* drops every cached block of the pool */
    kvg_pc_set_model(R.pc, M->id);
    return !kvg_pc_holds(R.pc, HA[0]) && kvg_kv_disk_holds(D, HA[0]) && kvg_kv_disk_holds(D, HA[10]);
}

/* bypass: B, which has no cache state, so it never waits for the disk. */
static int submit(uint64_t id, const int32_t *p, int n, int max_tokens, int bypass)
{
    kvg_sched_req q;
    sched_rig_req(&R, &q, id, p, n);
    q.max_tokens = max_tokens;     /* no stop id: always this many tokens */
    if (bypass)
        q.bucket = KVG_BUCKET_BYPASS;
    memset(&outs[id], 0, sizeof outs[id]);
    if (sched_rig_submit(&R, &q, err, sizeof err) != 0) {
        diag("submit %d: %s", (int)id, err);
        return -1;
    }
    return 0;
}

static int same(const out *a, const out *b, const char *what)
{
    if (a->n != b->n || a->done != 1) {
        diag("%s: %d tokens vs %d (done %d)", what, a->n, b->n, a->done);
        return 0;
    }
    for (int i = 0; i < a->n; i++)
        if (a->tok[i] != b->tok[i] || memcmp(&a->lp[i], &b->lp[i], sizeof(float)) != 0) {
            diag("%s: token %d differs (%d vs %d)", what, i, (int)a->tok[i], (int)b->tok[i]);
            return 0;
        }
    return 1;
}

static int check(void)
{
    if (kvg_pc_check(R.pc, NULL, 0, err, sizeof err) != 0) {
        diag("%s", err);
        return 0;
    }
    return 1;
}

static void test_hit(void)
{
    kvg_kv_disk_stats s0 = dstats(), s1;
    kvg_pc_stats ps0, ps1;
    ok(disk_only(), "A's prompt is on disk, not in the pool");
    kvg_pc_get_stats(R.pc, &ps0);
    submit(1, A, NP, 16, 0);
    sched_rig_drain(&R, 10000);
    s1 = dstats();
    kvg_pc_get_stats(R.pc, &ps1);
    is_int(outs[1].cached, 88, "A again: 88 tokens cached");
    ok(same(&outs[1], &refA, "A from disk"), "  tokens and log-probs bit-identical to the computed answer");
    is_int((int)(ps1.disk_hit_tokens - ps0.disk_hit_tokens), 88, "  all 88 read back from disk");
    is_int((int)(s1.async_reads - s0.async_reads), 11, "  by the reader thread: 11 reads");
    is_int((int)(s1.hits - s0.hits), 11, "  11 blocks imported");
    ok(s1.reads_live == 0 && s1.reads_in_flight == 0, "  no read left staged");
    ok(check(), "  the cache's invariants hold");
}

static void test_running_request_goes_on(void)
{
    kvg_sched_stats ss;
    kvg_kv_disk_stats s;
    int steady = 1, waited = 1;
    char e[256];
    ok(disk_only(), "A's prompt on disk only again");
    kvg_kv_disk_hold_reads(D, 1);
    submit(2, B, 40, 40, 1);
    for (int g = 0; g < 100 && outs[2].n < 1; g++)
        kvg_sched_step(R.s, e, sizeof e);
    ok(outs[2].n >= 1, "B runs (%d tokens)", outs[2].n);
    submit(3, A, NP, 16, 0);
    for (int i = 0; i < 10; i++) {
        int before = outs[2].n;
        if (kvg_sched_step(R.s, e, sizeof e) < 0)
            diag("step: %s", e);
        steady &= outs[2].n == before + 1;
        waited &= outs[3].accepted == 0 && outs[3].n == 0;
    }
    ok(steady, "while A's reads are held B produces a token every step, 10 steps");
    ok(waited, "  and A waits: not accepted, nothing produced");
    kvg_sched_get_stats(R.s, &ss);
    s = dstats();
    ok(ss.waiting == 1 && ss.running == 1, "  1 waiting, 1 running");
    is_int((int)s.reads_in_flight, 11, "  its 11 reads in flight");
    kvg_kv_disk_hold_reads(D, 0);
    sched_rig_drain(&R, 10000);
    is_int(outs[3].cached, 88, "released: A is admitted with 88 tokens cached");
    ok(same(&outs[3], &refA, "A after B"), "  the same answer as computed");
    ok(same(&outs[2], &refB, "B"), "  B's answer is the same as alone");
    ok(dstats().reads_live == 0, "  no read left staged");
    ok(check(), "  the cache's invariants hold");
}

static void test_shared_and_cancel(void)
{
    kvg_kv_disk_stats s0, s1;
    char e[256];
    ok(disk_only(), "A's prompt on disk only again");
    kvg_kv_disk_hold_reads(D, 1);
    s0 = dstats();
    submit(4, A, NP, 16, 0);
    submit(5, A, NP, 16, 0);
    kvg_sched_step(R.s, e, sizeof e);
    s1 = dstats();
    is_int((int)(s1.async_reads - s0.async_reads), 11, "two requests for A's blocks: each read issued once");
    is_int((int)s1.reads_live, 11, "  11 reads staged for both");
    is_int(kvg_sched_cancel(R.s, 4), 0, "one of them cancelled while waiting");
    ok(outs[4].done == 1 && outs[4].reason == KVG_FINISH_CANCELLED && outs[4].n == 0, "  finished: cancelled");
    is_int((int)dstats().reads_live, 11, "  the reads stay for the other");
    is_int(kvg_sched_cancel(R.s, 5), 0, "the other cancelled too");
    s1 = dstats();
    ok(s1.reads_live == 0 && s1.reads_in_flight == 0, "  every staged read released");
    is_int(kvg_sched_pending(R.s), 0, "  nothing pending");
    /* Cancelled with its reads done (staged, not imported) */
    kvg_kv_disk_hold_reads(D, 1);
    submit(6, A, NP, 16, 0);
    kvg_sched_step(R.s, e, sizeof e);    /* its reads queued */
    kvg_kv_disk_hold_reads(D, 0);
    for (int g = 0; g < 1000 && dstats().reads_in_flight > 0; g++)
        kvg_pc_disk_wait(R.pc, 100);     /* no step meanwhile: read, not admitted */
    ok(outs[6].accepted == 0, "  not admitted");
    is_int((int)dstats().reads_live, 11, "a request whose reads are done, not admitted yet, holds 11");
    kvg_sched_cancel(R.s, 6);
    ok(dstats().reads_live == 0, "  cancelled: released");
    ok(check(), "  the cache's invariants hold");
}

static void flip_payloads(void)
{
    char path[400];
    kvg_kv_disk_stats s = dstats();
    int fd;
    snprintf(path, sizeof path, "%s/%s", base, KVG_KV_DISK_FILE);
    fd = open(path, O_RDWR);
    for (int64_t i = 0; fd >= 0 && i < s.slots_total; i++) {
        unsigned char c;
        off_t off = (off_t)((uint64_t)i * s.slot_bytes + KVG_KV_DISK_HDR_BYTES + 100);
        if (pread(fd, &c, 1, off) == 1) {
            c ^= 0x40;
            if (pwrite(fd, &c, 1, off) != 1)
                diag("flip: write");
        }
    }
    if (fd >= 0)
        close(fd);
}

static void test_corrupt(void)
{
    kvg_kv_disk_stats s0, s1;
    ok(disk_only(), "A's prompt on disk only again");
    flip_payloads();
    s0 = dstats();
    submit(1, A, NP, 16, 0);
    sched_rig_drain(&R, 10000);
    s1 = dstats();
    is_int(outs[1].cached, 0, "every payload corrupt: A is recomputed (0 cached)");
    ok(same(&outs[1], &refA, "A recomputed"), "  the same answer");
    ok(s1.corrupt > s0.corrupt && s1.async_reads > s0.async_reads, "  the reader found the corrupt slot (%llu)",
       (unsigned long long)(s1.corrupt - s0.corrupt));
    ok(!kvg_kv_disk_holds(D, HA[0]), "  and dropped it");
    ok(dstats().reads_live == 0, "  no read left staged");
    ok(check(), "  the cache's invariants hold");
}

static void test_staging_bound(void)
{
    kvg_kv_disk_stats s0, s1;
    char e[256];
    submit(7, C, NP, 16, 0);     /* its slots were corrupted too: recomputed, kept in the pool */
    sched_rig_drain(&R, 10000);
    ok(outs[7].cached == 0 && same(&outs[7], &refC, "C"), "C recomputed after its corrupt slots, the same answer");
    ok(disk_only(), "A's and C's prompts (recomputed) on disk only again");
    kvg_pc_set_disk(R.pc, NULL, NULL, 0);
    kvg_kv_disk_close(D);
    D = open_disk(1);            /* the least staging: 4 slots */
    if (!D) {
        ok(0, "reopen with 4 slots of staging");
        return;
    }
    s0 = dstats();
    kvg_kv_disk_hold_reads(D, 1);
    submit(1, A, NP, 16, 0);
    kvg_sched_step(R.s, e, sizeof e);
    s1 = dstats();
    is_int((int)s1.reads_live, 4, "reads staged for 4 of A's 11 blocks only (the bound)");
    ok(s1.read_staging_full > s0.read_staging_full, "  the 5th found the staging full");
    /* C's blocks are on disk too, but no read of them can be staged now. */
    submit(7, C, NP, 16, 0);
    kvg_sched_step(R.s, e, sizeof e);
    s0 = dstats();
    ok(outs[7].accepted == 1 && outs[7].cached == 0, "C, whose reads cannot be staged, is admitted at once: recomputed");
    ok(s0.hits == s1.hits && s0.bytes_read == s1.bytes_read, "  nothing read on the scheduler's thread");
    kvg_kv_disk_hold_reads(D, 0);
    sched_rig_drain(&R, 10000);
    is_int(outs[1].cached, 32, "A: its 4 staged blocks hit (32 tokens), the rest recomputed");
    ok(same(&outs[1], &refA, "A staged in part"), "  the same answer");
    ok(same(&outs[7], &refC, "C"), "  C's answer is its computed one");
    ok(dstats().reads_live == 0, "  no read left staged");
    ok(check(), "  the cache's invariants hold");
}

static void test_wipe(void)
{
    char e[256];
    ok(disk_only(), "A's prompt on disk only again");
    kvg_kv_disk_hold_reads(D, 1);
    submit(1, A, NP, 16, 0);
    kvg_sched_step(R.s, e, sizeof e);    /* its reads queued */
    kvg_kv_disk_hold_reads(D, 0);
    for (int g = 0; g < 1000 && dstats().reads_in_flight > 0; g++)
        kvg_pc_disk_wait(R.pc, 100);     /* read and staged, not admitted */
    ok(outs[1].accepted == 0 && dstats().reads_live > 0, "A's reads staged, A not admitted yet");
    ok(kvg_pc_wipe_tenant(R.pc, "acme", 4) > 0, "its tenant wiped");
    sched_rig_drain(&R, 10000);
    is_int(outs[1].cached, 0, "  the staged blocks are not served: A recomputed");
    ok(same(&outs[1], &refA, "A after the wipe"), "  the same answer");
    ok(check(), "  the cache's invariants hold");
}

int main(void)
{
    sched_rig_opts o;
    uint64_t rs = 77;
    kvg_prefix_hasher *h;
    size_t nh = 0;
    M = sched_rig_stories260k(err, sizeof err);
    if (!M) {
        printf("Bail out! %s\n", err);
        return 1;
    }
    BE = kvg_backend_cpu_new(M, 1, err, sizeof err);
    snprintf(base, sizeof base, "%s/kvg-disk-async-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!BE || !mkdtemp(base)) {
        printf("Bail out! %s\n", BE ? "mkdtemp" : err);
        return 1;
    }
    memset(&o, 0, sizeof o);
    o.m = M;
    o.be = BE;
    o.n_blocks = 64;
    o.sc.max_batch_tokens = 64;
    o.cb = on_event;
    o.tenant = "acme";
    if (sched_rig_new(&R, &o) != 0 || !(D = open_disk(0))) {
        printf("Bail out! rig\n");
        return 1;
    }
    A[0] = B[0] = M->bos >= 0 ? M->bos : 1;
    for (int i = 1; i < NP; i++)
        A[i] = sched_rig_rnd_tok(&rs, M->cfg.vocab_size);
    for (int i = 1; i < 40; i++)
        B[i] = sched_rig_rnd_tok(&rs, M->cfg.vocab_size);
    C[0] = A[0];
    for (int i = 1; i < NP; i++)
        C[i] = sched_rig_rnd_tok(&rs, M->cfg.vocab_size);
    h = kvg_prefix_hasher_new(err, sizeof err);
    if (!h || kvg_prefix_chain(h, R.root, A, NP, SCHED_RIG_BLOCK_TOKENS, HA, NP / SCHED_RIG_BLOCK_TOKENS, &nh,
                               err, sizeof err) != 0) {
        printf("Bail out! chain: %s\n", err);
        return 1;
    }
    kvg_prefix_hasher_free(h);

    /* The references: A computed (a miss), B alone. */
    submit(0, A, NP, 16, 0);
    sched_rig_drain(&R, 10000);
    refA = outs[0];
    is_int(refA.cached, 0, "A computed first (a miss)");
    is_int(refA.n, 16, "  16 tokens");
    submit(0, B, 40, 40, 1);
    sched_rig_drain(&R, 10000);
    refB = outs[0];
    is_int(refB.n, 40, "B alone: 40 tokens");
    submit(0, C, NP, 16, 0);
    sched_rig_drain(&R, 10000);
    refC = outs[0];
    is_int(refC.cached, 0, "C computed (a miss)");

    test_hit();
    test_running_request_goes_on();
    test_shared_and_cancel();
    test_corrupt();
    test_staging_bound();
    test_wipe();

    sched_rig_free(&R);
    kvg_kv_disk_close(D);
    kvg_backend_free(BE);
    kvg_model_free(M);
    {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
        if (system(cmd) != 0)
            diag("could not remove %s", base);
    }
    return done_testing();
}
