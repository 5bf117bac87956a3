/* Warm-up files on stories260K: a file with a pinned entry (org_1) and TTL entries
 * (org_2) is parsed and prefilled; a request of org_1 with the pinned prefix reports
 * it cached, org_2 with the same text reports 0; after many other requests evict
 * everything evictable the pinned prefix still hits; a sweep far in the future
 * expires the TTL entries but not the pinned one; pins over the cap are counted and
 * cached as ordinary entries; every parse error names file:line: field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tap.h"
#include "monoclock.h"
#include "sched_rig.h"
#include "warmup.h"
#include "prefix_cache_testing.h"
#include "warmup_testing.h"

#define MAXR 256

static int32_t cached[MAXR];
static int done_[MAXR];

static void on_event(void *ctx, const kvg_sched_event *ev)
{
    (void)ctx;
    if (ev->id >= MAXR)
        return;
    if (ev->kind == KVG_SEV_ACCEPTED)
        cached[ev->id] = ev->cached_tokens;
    else if (ev->kind == KVG_SEV_DONE)
        done_[ev->id]++;
}

static kvg_model *M;
static kvg_backend *BE;

static int rig_new(sched_rig *r, int n_blocks, double pinned_share)
{
    sched_rig_opts o;
    memset(&o, 0, sizeof o);
    o.m = M;
    o.be = BE;
    o.n_blocks = n_blocks;
    o.pinned_share = pinned_share;
    o.sc.max_batch_tokens = 64;
    o.cb = on_event;
    return sched_rig_new(r, &o);
}

/* Submits prompt for the tenant with that salt, runs it; returns the cached tokens. */
static int32_t ask(sched_rig *r, uint64_t id, const char *tenant, const int32_t *p, int n)
{
    char err[256];
    kvg_sched_req q;
    kvg_prefix_hasher *h = kvg_prefix_hasher_new(err, sizeof err);
    sched_rig_req(r, &q, id, p, n);
    q.tenant = kvg_pc_tenant(r->pc, tenant, strlen(tenant), 0.0);
    kvg_pc_tenant_root(r->pc, h, q.tenant, q.root, err, sizeof err);
    kvg_prefix_hasher_free(h);
    q.max_tokens = 4;
    q.sp.top_p = 1.0f;
    cached[id] = -1;
    done_[id] = 0;
    if (sched_rig_submit(r, &q, err, sizeof err) != 0) {
        diag("submit %d: %s", (int)id, err);
        return -2;
    }
    if (sched_rig_drain(r, 100000) != 0)
        return -3;
    return done_[id] == 1 ? cached[id] : -4;
}

static uint64_t rs = 77;
static int32_t rnd_tok(void)
{
    return sched_rig_rnd_tok(&rs, M->cfg.vocab_size);
}

static const char *STORY =
    "Once upon a time, there was a little girl named Lily. She loved to play outside "
    "in the park with her friends and her big red ball.";

static int32_t ids2[40];

/* The test's warm-up file: a pinned text prompt for org_1, TTL entries for org_2. */
static char *make_file(size_t *len)
{
    char *f = malloc(8192);
    size_t n = 0;
    n += (size_t)snprintf(f + n, 8192 - n, "# warm-up for the test\r\n\n");
    n += (size_t)snprintf(f + n, 8192 - n, "{\"tenant\": \"org_1\", \"prompt\": \"%s\", \"ttl\": \"pinned\"}\n",
                          STORY);
    n += (size_t)snprintf(f + n, 8192 - n, "  # indented comment\n{\"tenant\": \"org_2\", \"ttl\": \"5m\", \"prompt_ids\": [");
    for (int i = 0; i < 40; i++)
        n += (size_t)snprintf(f + n, 8192 - n, "%s%d", i ? ", " : "", (int)ids2[i]);
    n += (size_t)snprintf(f + n, 8192 - n, "]}\r\n{\"tenant\": \"org_2\", \"prompt\": \"The cat sat on "
                          "the mat and looked at the dog.\", \"ttl\": 90}\n   \n");
    *len = n;
    return f;
}

static void parse_errors(void)
{
    static const struct { const char *text; const char *want; } cases[] = {
        { "{\"tenant\": 5, \"prompt\": \"x\"}", "w.jsonl:1: tenant: expected a string" },
        { "# c\n\n{\"tenant\": \"a\", \"prompt\": \"\"}", "w.jsonl:3: prompt: empty" },
        { "{\"tenant\": \"a\", \"promt\": \"x\"}", "w.jsonl:1: promt: unknown field" },
        { "{\"prompt\": \"x\"}", "w.jsonl:1: tenant: missing" },
        { "{\"tenant\": \"\", \"prompt\": \"x\"}", "w.jsonl:1: tenant: empty" },
        { "{\"tenant\": \"a\"}", "w.jsonl:1: prompt: missing" },
        { "{\"tenant\": \"a\", \"prompt\": \"x\", \"prompt_ids\": [1]}", "w.jsonl:1: prompt_ids: give prompt or prompt_ids, not both" },
        { "{\"tenant\": \"a\", \"prompt\": 3}", "w.jsonl:1: prompt: expected a string" },
        { "{\"tenant\": \"a\", \"prompt_ids\": [1, 600]}", "w.jsonl:1: prompt_ids[1]: id 600 is out of the vocabulary (512)" },
        { "{\"tenant\": \"a\", \"prompt_ids\": [1, -1]}", "w.jsonl:1: prompt_ids[1]: id -1 is out" },
        { "{\"tenant\": \"a\", \"prompt_ids\": [1, \"b\"]}", "w.jsonl:1: prompt_ids[1]: expected an integer" },
        { "{\"tenant\": \"a\", \"prompt_ids\": [1, 2.5]}", "w.jsonl:1: prompt_ids[1]: expected an integer" },
        { "{\"tenant\": \"a\", \"prompt_ids\": []}", "w.jsonl:1: prompt_ids: empty" },
        { "{\"tenant\": \"a\", \"prompt_ids\": 7}", "w.jsonl:1: prompt_ids: expected an array" },
        { "{\"tenant\": \"a\", \"prompt\": \"x\", \"ttl\": \"5x\"}", "w.jsonl:1: ttl: \"5x\" is not" },
        { "{\"tenant\": \"a\", \"prompt\": \"x\", \"ttl\": \"pinnd\"}", "w.jsonl:1: ttl: \"pinnd\" is not" },
        { "{\"tenant\": \"a\", \"prompt\": \"x\", \"ttl\": \"inf\"}", "w.jsonl:1: ttl: \"inf\" is not" },
        { "{\"tenant\": \"a\", \"prompt\": \"x\", \"ttl\": \" 5s\"}", "w.jsonl:1: ttl: \" 5s\" is not" },
        { "{\"tenant\": \"a\", \"prompt\": \"x\", \"ttl\": \"5\"}", "w.jsonl:1: ttl: \"5\" is not" },
        { "{\"tenant\": \"a\", \"prompt\": \"x\", \"ttl\": \"0s\"}", "w.jsonl:1: ttl: \"0s\" must be positive" },
        { "{\"tenant\": \"a\", \"prompt\": \"x\", \"ttl\": -3}", "w.jsonl:1: ttl: seconds must be in" },
        { "{\"tenant\": \"a\", \"prompt\": \"x\", \"ttl\": 1e12}", "w.jsonl:1: ttl: seconds must be in" },
        { "{\"tenant\": \"a\", \"prompt\": \"x\", \"ttl\": true}", "w.jsonl:1: ttl: expected \"pinned\"" },
        { "{\"tenant\": \"a\xff\", \"prompt\": \"x\"}", "w.jsonl:1: invalid UTF-8 at byte 14" },
        { "{\"tenant\": \"a\", \"prompt\": \"\xc3\x28\"}", "w.jsonl:1: invalid UTF-8" },
        { "{\"tenant\": \"a\", \"prompt\": \"x\"}\n{tenant: 1}", "w.jsonl:2: invalid JSON" },
        { "{\"tenant\": \"a\", \"prompt\": \"x\"} {}", "w.jsonl:1: invalid JSON" },
        { "{\"tenant\": \"a\", \"tenant\": \"b\", \"prompt\": \"x\"}", "w.jsonl:1: invalid JSON" },
        { "[1, 2]", "w.jsonl:1: expected a JSON object" },
    };
    char err[512];
    const kvg_tokenizer *tok = M->tokenizer;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvg_warmup *w = kvg_warmup_parse(cases[i].text, strlen(cases[i].text), "w.jsonl", tok, 0,
                                         err, sizeof err);
        ok(!w && strncmp(err, cases[i].want, strlen(cases[i].want)) == 0, "error %zu: %s", i, err);
        if (w) {
            diag("wanted: %s", cases[i].want);
            kvg_warmup_free(w);
        }
    }
    kvg_warmup *w = kvg_warmup_parse("{\"tenant\": \"a\", \"prompt\": \"x\"}", 30, "w.jsonl", NULL, 512,
                                     err, sizeof err);
    ok(!w && strstr(err, "w.jsonl:1: prompt: text needs a tokenizer"), "no tokenizer: %s", err);
    kvg_warmup_free(w);
    w = kvg_warmup_load("/nonexistent/warm.jsonl", tok, 0, err, sizeof err);
    ok(!w && strstr(err, "/nonexistent/warm.jsonl: cannot open"), "missing file: %s", err);

    const char *good = "{\"tenant\": \"a\", \"prompt_ids\": [1], \"ttl\": \"1.5h\"}\n"
                       "{\"tenant\": \"a\", \"prompt_ids\": [2], \"ttl\": \"500ms\"}\n"
                       "{\"tenant\": \"a\", \"prompt_ids\": [3], \"ttl\": \"1d\"}\n"
                       "{\"tenant\": \"a\", \"prompt_ids\": [4], \"ttl\": 2.5}\n"
                       "{\"tenant\": \"a\", \"prompt_ids\": [5]}";
    w = kvg_warmup_parse(good, strlen(good), "g.jsonl", NULL, 512, err, sizeof err);
    ok(w && w->n == 5 && w->e[0].ttl_ms == 5400000 && w->e[1].ttl_ms == 500 &&
       w->e[2].ttl_ms == 86400000 && w->e[3].ttl_ms == 2500 && w->e[4].ttl_ms == 0 &&
       w->e[4].line == 5 && w->e[4].ids[0] == 5, "durations: 1.5h, 500ms, 1d, 2.5 s, default");
    if (!w)
        diag("%s", err);
    kvg_warmup_free(w);
    w = kvg_warmup_parse("", 0, "e.jsonl", NULL, 512, err, sizeof err);
    ok(w && w->n == 0, "an empty file has no entries");
    kvg_warmup_free(w);
}

int main(void)
{
    char err[512], tmp[] = "/tmp/kvg-warmup-XXXXXX";
    kvg_warmup_opts wo = { 1000, 1 };
    kvg_warmup *w;
    kvg_warmup_result res;
    sched_rig r;
    int32_t p1[256];
    int n1, nb1;
    char *file;
    size_t flen;
    int fd;

    M = sched_rig_stories260k(err, sizeof err);
    if (!M) {
        diag("%s", err);
        ok(0, "load stories260K");
        return done_testing();
    }
    BE = kvg_backend_cpu_new(M, 1, err, sizeof err);
    for (int i = 0; i < 40; i++)
        ids2[i] = rnd_tok();

    parse_errors();

    /* The file, from disk. */
    file = make_file(&flen);
    fd = mkstemp(tmp);
    ok(fd >= 0 && write(fd, file, flen) == (ssize_t)flen, "write %s", tmp);
    close(fd);
    w = kvg_warmup_load(tmp, M->tokenizer, 0, err, sizeof err);
    unlink(tmp);
    if (!ok(w && w->n == 3, "parsed 3 entries")) {
        diag("%s", err);
        return done_testing();
    }
    ok(w->e[0].ttl_ms == KVG_PC_TTL_PINNED && w->e[1].ttl_ms == 300000 && w->e[2].ttl_ms == 90000 &&
       w->e[0].line == 3 && w->e[1].line == 5 && w->e[2].line == 6, "ttl and line of each entry");
    ok(strcmp(w->e[0].salt, "org_1") == 0 && w->e[0].ids[0] == M->bos && w->e[1].n_ids == 40 &&
       memcmp(w->e[1].ids, ids2, sizeof ids2) == 0, "tenant, BOS-led text prompt, ids as given");
    n1 = w->e[0].n_ids;
    nb1 = n1 / 8;
    ok(nb1 >= 3, "the pinned prompt covers %d full blocks (%d tokens)", nb1, n1);
    memcpy(p1, w->e[0].ids, (size_t)n1 * sizeof *p1);
    for (int i = n1; i < n1 + 11; i++)
        p1[i] = rnd_tok();

    /* 1. Load, hit by tenant, pool pressure. */
    if (rig_new(&r, 128, 0.5) == 0) {
        kvg_pc_stats st;
        int ok_all = 1;
        ok(kvg_warmup_run(w, r.s, r.pc, r.kv, &wo, &res, err, sizeof err) == 0, "warm-up runs") ? (void)0
            : diag("%s", err);
        diag("%s", res.summary);
        ok(res.entries == 3 && res.blocks_pinned == nb1 && res.pinned_requested == nb1 &&
           res.pinned_over_cap == 0 && res.blocks_cached >= nb1 + 5,
           "pinned %d blocks, %d cached in all", (int)res.blocks_pinned, (int)res.blocks_cached);
        {
            char want[64];
            snprintf(want, sizeof want, "pinned %d blocks; ", nb1);
            ok(strstr(res.summary, want) != NULL && !strstr(res.summary, "over the cap"),
               "summary: %s", res.summary);
        }
        is_int(kvg_sched_pending(r.s), 0, "nothing left pending");
        is_int(kvg_pc_tenant_cached_blocks(r.pc, kvg_pc_tenant(r.pc, "org_1", 5, 0.0)), nb1,
               "org_1 holds the pinned blocks");
        is_int(ask(&r, 1, "org_1", p1, n1 + 11), nb1 * 8, "org_1 with the pinned prefix: cached");
        is_int(ask(&r, 2, "org_2", p1, n1 + 11), 0, "org_2 with the same text: nothing cached");
        {
            int32_t p2[48];
            memcpy(p2, ids2, sizeof ids2);
            for (int i = 40; i < 48; i++)
                p2[i] = rnd_tok();
            is_int(ask(&r, 3, "org_2", p2, 48), 40, "org_2 with its TTL entry: cached");
        }
        /* Pressure: each prompt is new, together they overflow the pool many times. */
        for (int k = 0; k < 40; k++) {
            int32_t p[48];
            for (int i = 0; i < 48; i++)
                p[i] = rnd_tok();
            if (ask(&r, (uint64_t)(10 + k), "org_3", p, 48) != 0)
                ok_all = 0;
        }
        ok(ok_all, "40 unrelated requests ran");
        kvg_pc_get_stats(r.pc, &st);
        ok(st.evictions[KVG_EVICT_LRU] > 0 && st.blocks_pinned == nb1,
           "pressure: %llu evictions, %d blocks still pinned",
           (unsigned long long)st.evictions[KVG_EVICT_LRU], (int)st.blocks_pinned);
        is_int(ask(&r, 100, "org_1", p1, n1 + 11), nb1 * 8, "after pressure: the pinned prefix still hits");
        is_int(ask(&r, 101, "org_2", ids2, 40), 0, "after pressure: the TTL entry was evicted");
        err[0] = 0;
        ok(kvg_pc_check(r.pc, NULL, 0, err, sizeof err) == 0, "cache invariants (%s)", err);
        sched_rig_free(&r);
    }

    /* 2. Far in the future: TTL entries expire, the pinned one does not. */
    if (rig_new(&r, 128, 0.5) == 0) {
        int org1, org2;
        int32_t swept;
        kvg_warmup_run(w, r.s, r.pc, r.kv, &wo, &res, err, sizeof err);
        org1 = kvg_pc_tenant(r.pc, "org_1", 5, 0.0);
        org2 = kvg_pc_tenant(r.pc, "org_2", 5, 0.0);
        ok(kvg_pc_tenant_cached_blocks(r.pc, org2) >= 5, "org_2 cached %d blocks",
           (int)kvg_pc_tenant_cached_blocks(r.pc, org2));
        swept = kvg_pc_sweep(r.pc, kvg_mono_ms() + 60000);
        is_int(swept, 0, "a minute later nothing has expired");
        swept = kvg_pc_sweep(r.pc, kvg_mono_ms() + 10 * 3600 * 1000LL);
        ok(swept >= 5 && kvg_pc_tenant_cached_blocks(r.pc, org2) == 0,
           "10 h later the TTL entries expired (%d blocks)", (int)swept);
        is_int(kvg_pc_tenant_cached_blocks(r.pc, org1), nb1, "the pinned blocks are still there");
        is_int(ask(&r, 1, "org_1", p1, n1 + 11), nb1 * 8, "and still hit");
        sched_rig_free(&r);
    }

    /* 3. Over the pin cap: 2 blocks of 128 may be pinned; the rest are ordinary. */
    if (rig_new(&r, 128, 0.02) == 0) {
        char text[2048];
        size_t n = 0;
        kvg_warmup *w2;
        n += (size_t)snprintf(text + n, sizeof text - n, "{\"tenant\": \"org_1\", \"ttl\": \"pinned\", \"prompt_ids\": [");
        for (int i = 0; i < 48; i++)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s%d", i ? "," : "", (int)ids2[i % 40] ^ (i >= 40));
        n += (size_t)snprintf(text + n, sizeof text - n, "]}\n{\"tenant\": \"org_1\", \"ttl\": \"pinned\", \"prompt_ids\": [");
        for (int i = 0; i < 24; i++)      /* the same first 3 blocks: counted once */
            n += (size_t)snprintf(text + n, sizeof text - n, "%s%d", i ? "," : "", (int)ids2[i]);
        n += (size_t)snprintf(text + n, sizeof text - n, "]}\n");
        w2 = kvg_warmup_parse(text, n, "cap.jsonl", M->tokenizer, 0, err, sizeof err);
        ok(w2 && kvg_warmup_run(w2, r.s, r.pc, r.kv, &wo, &res, err, sizeof err) == 0, "over-cap warm-up runs (%s)",
           w2 ? res.summary : err);
        ok(res.blocks_pinned == 2 && res.pinned_requested == 6 && res.pinned_over_cap == 4 &&
           res.blocks_cached == 6 && strstr(res.summary, "pinned 2 blocks, 4 over the cap cached with the default TTL"),
           "pinned 2, requested 6, 4 over the cap: %s", res.summary);
        kvg_warmup_free(w2);

        /* A prompt the scheduler rejects: named by file and line, nothing pending. */
        {
            size_t big = (size_t)M->cfg.max_seq_len + 1;
            char *t = malloc(big * 4 + 128);
            size_t m = 0;
            m += (size_t)sprintf(t + m, "\n{\"tenant\": \"a\", \"prompt_ids\": [");
            for (size_t i = 0; i < big; i++)
                m += (size_t)sprintf(t + m, "%s5", i ? "," : "");
            m += (size_t)sprintf(t + m, "]}\n");
            w2 = kvg_warmup_parse(t, m, "big.jsonl", M->tokenizer, 0, err, sizeof err);
            ok(w2 && kvg_warmup_run(w2, r.s, r.pc, r.kv, &wo, &res, err, sizeof err) == -1 &&
               strncmp(err, "big.jsonl:2: prompt: ", 21) == 0, "rejected entry: %s", err);
            is_int(kvg_sched_pending(r.s), 0, "nothing pending after a rejection");
            kvg_warmup_free(w2);
            free(t);
        }
        sched_rig_free(&r);
    }

    kvg_warmup_free(w);
    free(file);
    kvg_backend_free(BE);
    kvg_model_free(M);
    return done_testing();
}
