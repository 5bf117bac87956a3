/* Scheduler figures (printed, never asserted), synthetic:15M:
 * a self-consistency round -- one request with n = 5 over a 4,000-token document,
 * 64-token answers, seeded sampling at temperature 0.8 -- against five independent
 * requests for the same five answers, each under its own tenant so nothing is shared
 * (the same sample indices, so the outputs are the same tokens). Wall time, the
 * ratio (goal <= 0.3x), prefill tokens computed, and time to first token of the round.
 * Usage: sched_bench [threads]   (default: the online CPUs) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "prefix_cache.h"
#include "prefix_cache_testing.h"
#include "prefix_hash.h"
#include "scheduler.h"

enum { DOC = 4000, ANSWER = 64, N = 5, BT = 16 };

static char err[512];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct tally {
    double t_submit, t_first;
    int tokens, errors;
    int32_t ans[N][ANSWER];
    int n_ans[N];
} tally;

static void on_event(void *ctx, const kvg_sched_event *ev)
{
    tally *t = ctx;
    if (ev->kind == KVG_SEV_TOKEN) {
        if (t->tokens++ == 0)
            t->t_first = now_s();
        /* request id k of the independent run carries sample index k */
        int a = ev->id >= 100 ? (int)(ev->id - 100) : ev->sample;
        if (a < N && t->n_ans[a] < ANSWER)
            t->ans[a][t->n_ans[a]++] = ev->token;
    } else if (ev->kind == KVG_SEV_FINISHED && ev->reason == KVG_FINISH_ERROR) {
        t->errors++;
        fprintf(stderr, "request %llu: %s\n", (unsigned long long)ev->id, ev->error);
    }
}

typedef struct result {
    double wall, ttft;
    uint64_t prefill, decode;
    tally t;
} result;

/* independent = 0: one request, n = 5; 1: five requests with n = 1, five tenants. */
static int run(const kvg_model *m, kvg_backend *be, const int32_t *doc, int independent,
               result *res)
{
    kvg_kv_geom g;
    kvg_kv_pool *pool;
    kvg_forward *fw;
    kvg_prefix_cache *pc;
    kvg_sched *s;
    kvg_pc_config pcfg;
    kvg_sched_config sc;
    kvg_sched_stats st;
    kvg_prefix_hasher *h = kvg_prefix_hasher_new(err, sizeof err);
    int rc = 0;

    memset(res, 0, sizeof *res);
    memset(&pcfg, 0, sizeof pcfg);
    memset(&sc, 0, sizeof sc);
    memcpy(pcfg.model_id, m->id, sizeof pcfg.model_id);
    sc.max_running = 16;
    kvg_forward_kv_geom(m, BT, &g);
    pool = kvg_kv_pool_new(&g, N * ((DOC + ANSWER) / BT + 2), err, sizeof err);
    fw = pool ? kvg_forward_new(m, be, pool, err, sizeof err) : NULL;
    pc = fw ? kvg_pc_new(pool, &pcfg, err, sizeof err) : NULL;
    s = pc ? kvg_sched_new(m, fw, pc, pool, &sc, on_event, &res->t, err, sizeof err) : NULL;
    if (!s || !h) {
        fprintf(stderr, "setup: %s\n", err);
        rc = -1;
        goto out;
    }
    res->t.t_submit = now_s();
    for (int k = 0; k < (independent ? N : 1); k++) {
        kvg_sched_req q;
        char salt[16];
        /* the prompt's chain, as the engine's intake gives it to the scheduler */
        static uint8_t chain[DOC / BT][KVG_PREFIX_HASH_LEN];
        size_t nb;
        memset(&q, 0, sizeof q);
        snprintf(salt, sizeof salt, "tenant-%d", independent ? k : 0);
        q.tenant = kvg_pc_tenant(pc, salt, strlen(salt), 0.0);
        if (kvg_pc_tenant_root(pc, h, q.tenant, q.root, err, sizeof err) != 0 ||
            kvg_prefix_chain(h, q.root, doc, DOC, BT, chain, DOC / BT, &nb, err, sizeof err) != 0) {
            fprintf(stderr, "root: %s\n", err);
            rc = -1;
            goto out;
        }
        q.hashes = (const uint8_t (*)[KVG_PREFIX_HASH_LEN])chain;
        q.n_hashes = (int32_t)nb;
        q.id = independent ? 100 + (uint64_t)k : 1;
        q.prompt = doc;
        q.n_prompt = DOC;
        q.bucket = 1;
        q.sp.temperature = 0.8f;
        q.sp.top_p = 1.0f;
        q.sp.seed = 7;
        q.n = independent ? 1 : N;
        q.sample_base = independent ? (uint64_t)k : 0;
        q.max_tokens = ANSWER;
        if (kvg_sched_submit(s, &q, err, sizeof err) != 0) {
            fprintf(stderr, "submit: %s\n", err);
            rc = -1;
            goto out;
        }
    }
    while (kvg_sched_pending(s) > 0)
        if (kvg_sched_step(s, err, sizeof err) < 0) {
            fprintf(stderr, "step: %s\n", err);
            rc = -1;
            goto out;
        }
    res->wall = now_s() - res->t.t_submit;
    res->ttft = res->t.t_first - res->t.t_submit;
    kvg_sched_get_stats(s, &st);
    res->prefill = st.prefill_tokens;
    res->decode = st.decode_tokens;
out:
    kvg_sched_free(s);
    kvg_pc_free(pc);
    kvg_forward_free(fw);
    kvg_kv_pool_free(pool);
    kvg_prefix_hasher_free(h);
    return rc;
}

int main(int argc, char **argv)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = argc > 1 ? atoi(argv[1]) : (int)(cpus > 0 ? cpus : 1);
    kvg_model_load_opts lo;
    kvg_model *m;
    kvg_backend *be;
    static int32_t doc[DOC];
    static result a, b;
    uint64_t rs = 12345;

    memset(&lo, 0, sizeof lo);
    lo.max_seq_len = 4200;
    m = kvg_model_load("synthetic:15M", &lo, err, sizeof err);
    if (!m) {
        fprintf(stderr, "load: %s\n", err);
        return 1;
    }
    be = kvg_backend_cpu_new(m, threads > 0 ? threads : 1, err, sizeof err);
    if (!be) {
        fprintf(stderr, "backend: %s\n", err);
        kvg_model_free(m);
        return 1;
    }
    /* a deterministic pseudo-random document of ids */
    for (int i = 0; i < DOC; i++) {
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        doc[i] = 3 + (int32_t)((rs >> 33) % (uint64_t)(m->cfg.vocab_size - 3));
    }
    if (m->bos >= 0)
        doc[0] = m->bos;

    if (run(m, be, doc, 0, &a) == 0 && run(m, be, doc, 1, &b) == 0) {
        int same = 1, out_a = 0, out_b = 0;
        for (int k = 0; k < N; k++) {
            out_a += a.t.n_ans[k];
            out_b += b.t.n_ans[k];
            same &= a.t.n_ans[k] == b.t.n_ans[k] &&
                    memcmp(a.t.ans[k], b.t.ans[k], (size_t)a.t.n_ans[k] * sizeof(int32_t)) == 0;
        }
        printf("sched  synthetic:15M, %d thread(s), %d-token document, %d x %d-token answers, "
               "temperature 0.8\n", threads, DOC, N, ANSWER);
        printf("sched    n=5 round:          %8.0f ms wall, %6llu prefill + %4llu decode tokens "
               "computed, %d output tokens, ttft %.0f ms\n", a.wall * 1e3,
               (unsigned long long)a.prefill, (unsigned long long)a.decode, out_a, a.ttft * 1e3);
        printf("sched    5 independent:      %8.0f ms wall, %6llu prefill + %4llu decode tokens "
               "computed, %d output tokens, ttft (first of five) %.0f ms\n", b.wall * 1e3,
               (unsigned long long)b.prefill, (unsigned long long)b.decode, out_b, b.ttft * 1e3);
        printf("sched    ratio: %.3fx the time (goal <= 0.3x), %.3fx the prefill; answers %s\n",
               a.wall / b.wall, (double)a.prefill / (double)(b.prefill ? b.prefill : 1),
               same ? "identical" : "DIFFER");
    }
    kvg_backend_free(be);
    kvg_model_free(m);
    return 0;
}
