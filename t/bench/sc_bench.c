/* Self-consistency figures (printed, never asserted), side by side in one run, through a
 * real kvgate-engine process and the client library:
 *
 *  (a) shared prefix: one request with n=5 over a 4,000-token document (synthetic:15M,
 *      its byte-level tokenizer, pseudo-random byte tokens) against five independent
 *      requests for the same document that share nothing (each under its own tenant,
 *      the cache key's salt, so no block is reused), submitted at once. Wall time and
 *      the engine's prefill tokens (its statistics page). Goal: <= 0.2x the time.
 *  (b) early stopping: n=16 with min_samples 3, agreement 0.6, waves of 3, driven by
 *      kvg_sc (src/vote.h, the gateway's own rule) with per-sample draw and cancel
 *      (kvg_client_samples), against n=16 all at once without early stopping, on a
 *      workload where samples agree: stories260K continuing a story prompt with a low
 *      temperature; each sample's answer is its first word (the bench's extractor;
 *      what an answer pattern would capture), while every sample runs up to
 *      max_tokens as a reasoning chain would. Completion tokens and wall time.
 *      Goal: <= 0.35x the completion tokens.
 *
 * Usage: sc_bench [--threads N]   (from the repository root; BUILD=dir for the engine,
 * KVGATE_SHARED for ../shared) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_proc.h"
#include "client.h"
#include "proto.h"
#include "tokenizer.h"
#include "vote.h"

static char err[512];

static void die(const char *what)
{
    fprintf(stderr, "sc_bench: %s: %s\n", what, err);
    exit(1);
}

/* ---- one request's events ---- */

#define MAX_S 16
#define TEXT_CAP 4096

typedef struct run {
    int done, error;
    uint64_t id;
    uint32_t prompt_tokens, cached_tokens, completion_tokens;
    unsigned finished, cancelled;
    char text[MAX_S][TEXT_CAP];
    size_t text_len[MAX_S];
    kvg_sc *sc;                  /* NULL: no early stopping */
    unsigned pending_draw;       /* an action the ring had no room for */
    uint32_t pending_mask;
} run;

/* The bench's extractor for (b): the first word of the completion. */
static size_t first_word(const char *t, size_t n, char *out, size_t cap)
{
    size_t a = 0, b;
    while (a < n && (t[a] == ' ' || t[a] == '\n' || t[a] == '\t'))
        a++;
    for (b = a; b < n && t[b] != ' ' && t[b] != '\n' && t[b] != '\t'; b++)
        ;
    return kvg_vote_normalize(t + a, b - a, out, cap);
}

static void send_action(kvg_client *c, run *r)
{
    if (!r->pending_draw && !r->pending_mask)
        return;
    int rc = kvg_client_samples(c, r->id, r->pending_draw, r->pending_mask);
    if (rc == 0) {
        r->pending_draw = 0;
        r->pending_mask = 0;
    } else if (rc < 0) {
        snprintf(err, sizeof err, "kvg_client_samples failed");
        die("samples");
    }
    /* KVG_CLIENT_AGAIN: retried on WRITABLE */
}

static void pump(kvg_client *c, run **rs, int n)
{
    for (;;) {
        int open_ = 0;
        for (int i = 0; i < n; i++)
            open_ += !rs[i]->done && !rs[i]->error;
        if (!open_)
            return;
        kvg_client_event ev;
        int got = 0;
        while (kvg_client_next_event(c, &ev) == 1) {
            run *r = ev.user;
            got = 1;
            if (ev.kind == KVG_CEV_WRITABLE) {
                for (int i = 0; i < n; i++)
                    send_action(c, rs[i]);
                continue;
            }
            if (ev.kind == KVG_CEV_DOWN) {
                snprintf(err, sizeof err, "%s", ev.message);
                die("engine down");
            }
            if (!r)
                continue;
            switch (ev.kind) {
            case KVG_CEV_TOKENS:
                if (ev.sample < MAX_S) {
                    size_t room = TEXT_CAP - 1 - r->text_len[ev.sample];
                    size_t l = ev.text_len < room ? ev.text_len : room;
                    memcpy(r->text[ev.sample] + r->text_len[ev.sample], ev.text, l);
                    r->text_len[ev.sample] += l;
                }
                break;
            case KVG_CEV_FINISHED: {
                int cancelled = ev.finish_reason == KVG_MSG_FINISH_CANCELLED;
                r->finished++;
                r->cancelled += (unsigned)cancelled;
                if (r->sc && ev.sample < MAX_S) {
                    char ans[KVG_VOTE_ANSWER_MAX + 1];
                    size_t l = first_word(r->text[ev.sample], r->text_len[ev.sample], ans, sizeof ans);
                    kvg_sc_action act;
                    kvg_sc_finished(r->sc, ev.sample, ans, l, 0.0, cancelled, &act);
                    r->pending_draw += act.draw;
                    r->pending_mask |= act.cancel_mask;
                    send_action(c, r);
                }
                break;
            }
            case KVG_CEV_DONE:
                r->done = 1;
                r->prompt_tokens = ev.prompt_tokens;
                r->cached_tokens = ev.cached_tokens;
                r->completion_tokens = ev.completion_tokens;
                break;
            case KVG_CEV_ERROR:
                r->error = 1;
                snprintf(err, sizeof err, "%d %s", ev.status, ev.message);
                die("request");
                break;
            default:
                break;
            }
        }
        if (!got)
            kvg_client_wait(c, 100);
    }
}

static void submit(kvg_client *c, kvg_client_req *q, run *r)
{
    if (kvg_client_submit(c, q, r, &r->id, err, sizeof err) != 0)
        die("submit");
}

static uint64_t prefill_now(kvg_client *c)
{
    kvg_stats st;
    if (kvg_client_stats(c, &st) != 0) {
        snprintf(err, sizeof err, "no statistics page");
        die("stats");
    }
    return st.prefill_tokens;
}

static void sample_stats(kvg_client *c, uint64_t v[3])
{
    kvg_stats st;
    if (kvg_client_stats(c, &st) != 0) {
        snprintf(err, sizeof err, "no statistics page");
        die("stats");
    }
    v[0] = st.samples_started;
    v[1] = st.samples_cancelled;
    v[2] = st.samples_dropped;
}

static kvg_client *connect_to(const char *sock)
{
    kvg_client *c = kvg_client_new(sock, NULL, err, sizeof err);
    if (!c || kvg_client_connect_wait(c, 30000, err, sizeof err) != 0)
        die("connect");
    return c;
}

static void stop_engine(pid_t pid)
{
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* ---- (a) one n=5 request vs five unshared requests ---- */

#define DOC 4000

static void part_a(const char *dir, const char *threads)
{
    char sock[300];
    snprintf(sock, sizeof sock, "%s/a.sock", dir);
    const char *args[] = { "--model", "synthetic:15M", "--context", "8192", "--kv-memory", "1G",
                           "--socket", sock, "--threads", threads, NULL };
    pid_t eng = bench_start_engine(args);
    if (eng < 0)
        exit(1);
    kvg_client *c = connect_to(sock);
    static int32_t doc[DOC + 8];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    /* BOS, then pseudo-random bytes (ids 3..258 are the bytes) */
    doc[0] = kvg_client_info(c)->bos >= 0 ? kvg_client_info(c)->bos : 1;
    for (int i = 1; i < DOC; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        doc[i] = 3 + (int32_t)(x % 256);
    }
    kvg_client_req q;
    memset(&q, 0, sizeof q);
    q.tokens = doc;
    q.n_tokens = DOC;
    q.temperature = 1.0f;
    q.top_p = 1.0f;
    q.max_tokens = 16;
    q.seed = 7;

    /* warm-up (page faults, thread start), under its own tenant */
    {
        run *w = calloc(1, sizeof *w);
        q.salt = "warmup";
        q.salt_len = 6;
        q.n = 1;
        submit(c, &q, w);
        pump(c, &w, 1);
        free(w);
    }

    enum { ROUNDS = 3 };
    double t1[ROUNDS], t5[ROUNDS];
    uint64_t pf_one = 0, pf_five = 0, ct_five = 0, ct_one = 0;
    for (int round = 0; round < ROUNDS; round++) {
        run *one = calloc(1, sizeof *one), *five[5];
        static char tn[32], tenants[5][32];
        /* fresh tenants every round: nothing cached from the round before */
        snprintf(tn, sizeof tn, "shared-n5-%d", round);
        q.salt = tn;
        q.salt_len = strlen(tn);
        q.n = 5;
        q.seed = 7;
        uint64_t p0 = prefill_now(c);
        double t0 = now_s();
        submit(c, &q, one);
        pump(c, &one, 1);
        t1[round] = now_s() - t0;
        pf_one = prefill_now(c) - p0;
        ct_one = one->completion_tokens;

        q.n = 1;
        p0 = prefill_now(c);
        t0 = now_s();
        for (int i = 0; i < 5; i++) {
            five[i] = calloc(1, sizeof *five[i]);
            snprintf(tenants[i], sizeof tenants[i], "independent-%d-%d", round, i);
            q.salt = tenants[i];
            q.salt_len = strlen(tenants[i]);
            q.seed = 100 + (uint64_t)i;
            submit(c, &q, five[i]);
        }
        pump(c, five, 5);
        t5[round] = now_s() - t0;
        pf_five = prefill_now(c) - p0;
        ct_five = 0;
        for (int i = 0; i < 5; i++) {
            ct_five += five[i]->completion_tokens;
            free(five[i]);
        }
        free(one);
    }
    double t_one = pct(t1, ROUNDS, 0.5), t_five = pct(t5, ROUNDS, 0.5);

    printf("(a) shared prefix: a %d-token document, 5 samples of up to %u tokens, synthetic:15M, "
           "%s thread(s), median of %d rounds (the five submitted at once)\n", DOC, q.max_tokens, threads,
           ROUNDS);
    printf("  %-44s %10s %14s %12s\n", "", "wall s", "prefill tok", "completion");
    printf("  %-44s %10.3f %14llu %12u\n", "one request, n=5 (prefilled once)", t_one,
           (unsigned long long)pf_one, (unsigned)ct_one);
    printf("  %-44s %10.3f %14llu %12llu\n", "five independent requests (nothing shared)", t_five,
           (unsigned long long)pf_five, (unsigned long long)ct_five);
    printf("  ratio: %.3fx the time (goal <= 0.2x: %s), %.3fx the prefill tokens\n\n", t_one / t_five,
           t_one / t_five <= 0.2 ? "met" : "NOT met", (double)pf_one / (double)pf_five);
    printf("RESULT part=a t_one=%.4f t_five=%.4f pf_one=%llu pf_five=%llu\n\n", t_one, t_five,
           (unsigned long long)pf_one, (unsigned long long)pf_five);
    kvg_client_free(c);
    stop_engine(eng);
}

/* ---- (b) early stopping vs all 16 ---- */

static void tally(const char *label, const kvg_sc *s)
{
    size_t l;
    const char *a = kvg_sc_answer(s, &l);
    printf("    %s: answer '%s', votes:", label, a ? a : "(none)");
    for (size_t i = 0; i < kvg_sc_n_answers(s) && i < 6; i++) {
        const char *t;
        unsigned cnt;
        kvg_sc_answer_at(s, i, &t, &l, &cnt, NULL);
        printf(" '%s'=%u", t, cnt);
    }
    printf("%s\n", kvg_sc_n_answers(s) > 6 ? " ..." : "");
}

static void part_b(const char *dir, const char *threads, const char *shared)
{
    char sock[300], model[1200], tok[1200];
    snprintf(sock, sizeof sock, "%s/b.sock", dir);
    snprintf(model, sizeof model, "%s/models/stories260K/stories260K.bin", shared);
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", shared);
    const char *args[] = { "--model", model, "--tokenizer", tok, "--kv-memory", "256M",
                           "--socket", sock, "--threads", threads, NULL };
    pid_t eng = bench_start_engine(args);
    if (eng < 0)
        exit(1);
    kvg_client *c = connect_to(sock);
    /* a story opening, in stories260K's tokenizer, after BOS */
    const kvg_engine_info *info = kvg_client_info(c);
    int32_t prompt[64];
    size_t np = 0;
    {
        const char *text = "Once upon a time, there was a little girl named Lily. She";
        kvg_tokenizer *tk = kvg_tokenizer_load(tok, err, sizeof err);
        int32_t *ids = NULL;
        size_t nids = 0;
        if (!tk || kvg_tokenizer_encode(tk, text, strlen(text), info->add_bos ? KVG_ENC_BOS : 0, &ids,
                                        &nids, err, sizeof err) != 0)
            die("tokenizer");
        for (size_t i = 0; i < nids && np < 64; i++)
            prompt[np++] = ids[i];
        free(ids);
        kvg_tokenizer_free(tk);
    }
    kvg_client_req q;
    memset(&q, 0, sizeof q);
    q.tokens = prompt;
    q.n_tokens = np;
    q.temperature = 0.6f;
    q.top_p = 1.0f;
    q.max_tokens = 96;
    q.n = 16;
    q.bypass = 1;                /* no cache effects between the two runs */
    q.stop_ids = NULL;

    const int reps = 5;
    uint64_t tok_es = 0, tok_all = 0;
    double t_es = 0, t_all = 0;
    unsigned run_es = 0, same = 0, early = 0;
    uint64_t eng_s[3] = { 0, 0, 0 };
    kvg_sc_config cfg = { KVG_VOTE_MAJORITY, 16, 3, 3, 0.6 };
    kvg_sc_config cfg_all = { KVG_VOTE_MAJORITY, 16, 0, 0, 0.6 };
    printf("(b) early stopping: stories260K, n=16, up to %u tokens a sample, temperature %.2f, "
           "answer = the first word, %d seeds\n", q.max_tokens, q.temperature, reps);
    for (int rep = 0; rep < reps; rep++) {
        run *es = calloc(1, sizeof *es), *all = calloc(1, sizeof *all);
        q.seed = 1000 + (uint64_t)rep;

        es->sc = kvg_sc_new(&cfg);
        q.n_active = kvg_sc_initial(es->sc);
        uint64_t s0[3], s1[3];
        sample_stats(c, s0);
        double t0 = now_s();
        submit(c, &q, es);
        pump(c, &es, 1);
        t_es += now_s() - t0;
        sample_stats(c, s1);
        for (int k = 0; k < 3; k++)
            eng_s[k] += s1[k] - s0[k];
        tok_es += es->completion_tokens;
        run_es += kvg_sc_samples_run(es->sc);
        early += (unsigned)kvg_sc_stopped_early(es->sc);

        /* all 16 at once; the vote is taken at the end, nothing is cancelled */
        q.n_active = 0;
        t0 = now_s();
        submit(c, &q, all);
        pump(c, &all, 1);
        t_all += now_s() - t0;
        tok_all += all->completion_tokens;
        kvg_sc *full = kvg_sc_new(&cfg_all);
        for (unsigned j = 0; j < 16; j++) {
            char ans[KVG_VOTE_ANSWER_MAX + 1];
            size_t l = first_word(all->text[j], all->text_len[j], ans, sizeof ans);
            kvg_sc_action act;
            kvg_sc_finished(full, j, ans, l, 0.0, 0, &act);
        }
        size_t la, lb;
        const char *a = kvg_sc_answer(es->sc, &la), *b = kvg_sc_answer(full, &lb);
        same += a && b && la == lb && !memcmp(a, b, la);
        printf("  seed %llu: early stop ran %u samples (%u tokens, %s), all 16: %u tokens\n",
               (unsigned long long)q.seed, kvg_sc_samples_run(es->sc), es->completion_tokens,
               kvg_sc_stopped_early(es->sc) ? "stopped early" : "not early", all->completion_tokens);
        tally("early", es->sc);
        tally("all 16", full);
        kvg_sc_free(full);
        kvg_sc_free(es->sc);
        free(es);
        free(all);
    }
    printf("  %-44s %10s %12s %10s\n", "", "wall s", "completion", "samples");
    printf("  %-44s %10.3f %12llu %10.1f\n", "min_samples 3, agreement 0.6, waves of 3", t_es,
           (unsigned long long)tok_es, (double)run_es / reps);
    printf("  %-44s %10.3f %12llu %10.1f\n", "all 16 at once, no early stopping", t_all,
           (unsigned long long)tok_all, 16.0);
    printf("  ratio: %.3fx the completion tokens (goal <= 0.35x: %s), %.3fx the time; "
           "same answer %u/%d, stopped early %u/%d\n", (double)tok_es / (double)tok_all,
           (double)tok_es / (double)tok_all <= 0.35 ? "met" : "NOT met", t_es / t_all, same, reps,
           early, reps);
    printf("  engine, early-stopping runs: %llu samples started, %llu cancelled running, %llu dropped "
           "undrawn\n", (unsigned long long)eng_s[0], (unsigned long long)eng_s[1],
           (unsigned long long)eng_s[2]);
    printf("  rule (vote.h): decided once min_samples finished, the lead holds >= agreement of the votes\n"
           "  and W(lead) - W(second) > the samples still running; undrawn samples are never drawn then\n");
    printf("RESULT part=b tok_es=%llu tok_all=%llu t_es=%.4f t_all=%.4f\n", (unsigned long long)tok_es,
           (unsigned long long)tok_all, t_es, t_all);
    kvg_client_free(c);
    stop_engine(eng);
}

int main(int argc, char **argv)
{
    const char *threads = "1", *sh = getenv("KVGATE_SHARED");
    char dir[] = "/tmp/kvgate-scbench-XXXXXX", shared[1024], nth[16];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = argv[++i];
        } else {
            fprintf(stderr, "usage: sc_bench [--threads N]\n");
            return 2;
        }
    }
    if (!strcmp(threads, "0")) {
        snprintf(nth, sizeof nth, "%ld", sysconf(_SC_NPROCESSORS_ONLN));
        threads = nth;
    }
    snprintf(shared, sizeof shared, "%s", sh && *sh ? sh : "../shared");
    if (!mkdtemp(dir))
        return 1;
    signal(SIGPIPE, SIG_IGN);
    part_a(dir, threads);
    part_b(dir, threads, shared);
    rmdir(dir);
    return 0;
}
