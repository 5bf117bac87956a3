/* Gateway figures (printed, never asserted):
 *  1. a short cached completion (stories260K, a 170-token prompt served from the cache,
 *     4 new tokens, greedy): latency p50/p99 and requests/s through nginx (HTTP/1.1
 *     keep-alive, one worker) against the same request through the client library
 *     directly (what kvgate-cli does, minus its process start), sequentially and with
 *     4 requests in flight. Goal: gateway overhead < 10% at the median.
 *  2. worker CPU per request for a 1,000-token prompt (synthetic:15M with the Llama 2
 *     tokenizer, context 2048, cached, 1 new token): the nginx worker's CPU time from
 *     /proc/PID/schedstat over many requests, and the library work alone (parse,
 *     normalize, tokenize, hash) timed in this process. Goal: < 100 us per request.
 * Usage: gateway_bench [requests]   (from the repository root; BUILD=dir) */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_http.h"
#include "bench_proc.h"
#include "client.h"
#include "normalize.h"
#include "request.h"
#include "tokenizer.h"

static char err[512], dir[64], build[512], shared[512];

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(b);
        return NULL;
    }
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

/* ---- processes ---- */

static pid_t start_engine(const char *sock, char *const *model_args)
{
    const char *argv[32];
    int n = 0;
    for (int i = 0; model_args[i]; i++)
        argv[n++] = model_args[i];
    argv[n++] = "--socket";
    argv[n++] = sock;
    argv[n++] = "--socket-mode";
    argv[n++] = "0666";
    argv[n++] = "--threads";
    argv[n++] = "1";
    argv[n] = NULL;
    return bench_start_engine(argv);
}

static pid_t start_nginx(const char *sock)
{
    return bench_start_nginx(dir, build, sock, "",
                             "location /v1/ { kvgate_pass; } location = /status { kvgate_status; }");
}

/* The nginx worker's pid: the child of the master. */
static pid_t worker_pid(pid_t master)
{
    char path[128], buf[256];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)master, (int)master);
    (void)buf;
    for (int tries = 0; tries < 200; tries++) {
        FILE *f = fopen(path, "r");
        if (f) {
            int pid = 0;
            if (fgets(buf, sizeof buf, f) && sscanf(buf, "%d", &pid) == 1) {
                fclose(f);
                return pid;
            }
            fclose(f);
        }
        usleep(20000);
    }
    return -1;
}

/* Nanoseconds a process has run on a CPU (the first field of schedstat). */
static uint64_t cpu_ns(pid_t pid)
{
    char path[128];
    unsigned long long ns = 0;
    snprintf(path, sizeof path, "/proc/%d/schedstat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%llu", &ns) != 1)
            ns = 0;
        fclose(f);
    }
    return ns;
}

/* ---- the direct path: the client library as kvgate-cli uses it ---- */

typedef struct direct {
    kvg_client *c;
    const char *prompt;
    unsigned max_tokens;
} direct;

static int direct_request(direct *d)
{
    const kvg_engine_info *in = kvg_client_info(d->c);
    int32_t *ids;
    size_t n;
    if (kvg_tokenizer_encode(in->tokenizer, d->prompt, strlen(d->prompt), in->add_bos ? KVG_ENC_BOS : 0, &ids, &n,
                             err, sizeof err) != 0)
        return -1;
    kvg_client_req q;
    memset(&q, 0, sizeof q);
    q.salt = "bench";
    q.salt_len = 5;
    q.tokens = ids;
    q.n_tokens = n;
    q.bucket = 1;
    q.max_tokens = d->max_tokens;
    q.top_p = 1.0f;
    uint64_t id;
    int done = 0;
    if (kvg_client_submit(d->c, &q, &done, &id, err, sizeof err) != 0) {
        free(ids);
        return -1;
    }
    while (!done) {
        kvg_client_event ev;
        int got = 0;
        while (kvg_client_next_event(d->c, &ev) == 1) {
            got = 1;
            if (ev.kind == KVG_CEV_DONE || ev.kind == KVG_CEV_ERROR || ev.kind == KVG_CEV_DOWN)
                done = 1;
        }
        if (!got && !done)
            kvg_client_wait(d->c, 100);
    }
    free(ids);
    return 0;
}

typedef struct job {
    int n;
    const char *body, *prompt, *sock;
    size_t body_len;
    unsigned max_tokens;
    double *lat;
    int fails;
} job;

static void *http_worker(void *arg)
{
    job *j = arg;
    http *h = malloc(sizeof *h);
    if (http_open(h) != 0) {
        j->fails = j->n;
        free(h);
        return NULL;
    }
    for (int i = 0; i < j->n; i++) {
        double t0 = now_s();
        if (http_post(h, "/v1/completions", j->body, j->body_len) != 200)
            j->fails++;
        if (j->lat)
            j->lat[i] = now_s() - t0;
    }
    close(h->fd);
    free(h);
    return NULL;
}

static void *direct_worker(void *arg)
{
    job *j = arg;
    direct d = { kvg_client_new(j->sock, NULL, err, sizeof err), j->prompt, j->max_tokens };
    if (!d.c || kvg_client_connect_wait(d.c, 10000, err, sizeof err) != 0) {
        j->fails = j->n;
        return NULL;
    }
    for (int i = 0; i < j->n; i++) {
        double t0 = now_s();
        if (direct_request(&d) != 0)
            j->fails++;
        if (j->lat)
            j->lat[i] = now_s() - t0;
    }
    kvg_client_free(d.c);
    return NULL;
}

/* Runs k concurrent workers of n requests each; returns requests/s. */
static double run_jobs(void *(*fn)(void *), job *base, int k, int n)
{
    pthread_t th[16];
    job js[16];
    double t0 = now_s();
    for (int i = 0; i < k; i++) {
        js[i] = *base;
        js[i].n = n;
        js[i].lat = NULL;
        js[i].fails = 0;
        pthread_create(&th[i], NULL, fn, &js[i]);
    }
    for (int i = 0; i < k; i++)
        pthread_join(th[i], NULL);
    return (double)(k * n) / (now_s() - t0);
}

static char *json_body(const char *model, const char *prompt, unsigned max_tokens, size_t *len)
{
    /* the prompts here are plain text without quotes or backslashes */
    size_t n = strlen(prompt) + strlen(model) + 256;
    char *b = malloc(n);
    *len = (size_t)snprintf(b, n, "{\"model\":\"%s\",\"prompt\":\"%s\",\"max_tokens\":%u,\"temperature\":0}",
                            model, prompt, max_tokens);
    return b;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    const char *b = getenv("BUILD"), *sh = getenv("KVGATE_SHARED");
    char sock[128], prompt[4096], long_prompt[16384];
    size_t len;
    if (n < 50)
        n = 50;
    snprintf(build, sizeof build, "%s", b && *b ? b : "build");
    snprintf(shared, sizeof shared, "%s", sh && *sh ? sh : "../shared");
    snprintf(dir, sizeof dir, "/tmp/kvgate-gwbench-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    chmod(dir, 0755);
    signal(SIGPIPE, SIG_IGN);

    /* Prompts: English prose from the golden file, stripped of quotes and newlines. */
    char gpath[600];
    snprintf(gpath, sizeof gpath, "%s/models/stories260K/golden-greedy.json", shared);
    char *gold = slurp(gpath, &len);
    if (!gold) {
        fprintf(stderr, "gateway_bench: %s: %s\n", gpath, strerror(errno));
        return 1;
    }
    size_t w = 0;
    for (char *p = strstr(gold, "\"full_text\""); p && w < sizeof long_prompt - 1; p = strstr(p + 1, "\"full_text\"")) {
        char *q = strchr(p + 12, '"') + 1;
        for (; *q && *q != '"' && w < sizeof long_prompt - 1; q++) {
            if (*q == '\\') {
                q++;
                long_prompt[w++] = ' ';
                continue;
            }
            long_prompt[w++] = *q;
        }
        long_prompt[w++] = ' ';
    }
    long_prompt[w] = 0;
    memcpy(prompt, long_prompt, 520);
    prompt[520] = 0;

    /* ---- 1: stories260K, short cached completion ---- */
    snprintf(sock, sizeof sock, "%s/e1.sock", dir);
    char mp[700], tp[700];
    snprintf(mp, sizeof mp, "%s/models/stories260K/stories260K.bin", shared);
    snprintf(tp, sizeof tp, "%s/models/stories260K/tok512.bin", shared);
    char *m1[] = { "--model", mp, "--tokenizer", tp, NULL };
    pid_t eng = start_engine(sock, m1);
    pid_t ngx = eng > 0 ? start_nginx(sock) : -1;
    if (ngx < 0)
        return 1;
    size_t blen;
    char *body = json_body("stories260K", prompt, 4, &blen);
    usleep(300000);
    job base = { 0, body, prompt, sock, blen, 4, NULL, 0 };
    double *lh = malloc((size_t)n * sizeof *lh), *ld = malloc((size_t)n * sizeof *ld);
    /* warm-up: caches the prompt, connects the workers */
    job warm = base;
    warm.n = 50;
    http_worker(&warm);
    direct_worker(&warm);
    if (warm.fails) {
        fprintf(stderr, "gateway_bench: warm-up requests failed (is nginx up? see %s/logs)\n", dir);
        return 1;
    }
    job jh = base, jd = base;
    jh.n = jd.n = n;
    jh.lat = lh;
    jd.lat = ld;
    double ts = now_s();
    http_worker(&jh);
    double rh1 = n / (now_s() - ts);
    ts = now_s();
    direct_worker(&jd);
    double rd1 = n / (now_s() - ts);
    double h50 = pct(lh, n, 0.5), h99 = pct(lh, n, 0.99), d50 = pct(ld, n, 0.5), d99 = pct(ld, n, 0.99);
    double rh4 = run_jobs(http_worker, &base, 4, n / 4), rd4 = run_jobs(direct_worker, &base, 4, n / 4);
    printf("short cached completion, stories260K (%s...: ~170 prompt tokens, 160 cached, 4 new), %d requests\n",
           "Once upon a time", n);
    printf("  %-44s %9s %9s %12s %12s\n", "", "p50 ms", "p99 ms", "req/s (1)", "req/s (4)");
    printf("  %-44s %9.3f %9.3f %12.0f %12.0f\n", "client library directly (like kvgate-cli)", d50 * 1e3, d99 * 1e3,
           rd1, rd4);
    printf("  %-44s %9.3f %9.3f %12.0f %12.0f\n", "through nginx (HTTP keep-alive, 1 worker)", h50 * 1e3, h99 * 1e3,
           rh1, rh4);
    printf("  gateway overhead at the median: %+.1f%% (%.0f us; goal < 10%%)%s\n", (h50 / d50 - 1) * 100,
           (h50 - d50) * 1e6, jh.fails || jd.fails ? "  [some requests failed]" : "");
    {
        /* kvgate-cli as a process, for reference: process start and handshake included */
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "%s/bin/kvgate-cli --socket %s --tenant bench --prompt-file /dev/stdin "
                 "--temperature 0 --max-tokens 4 > /dev/null 2>&1 <<'EOF'\n%s\nEOF", build, sock, prompt);
        double t0 = now_s();
        int k = 20, bad = 0;
        for (int i = 0; i < k; i++)
            bad += system(cmd) != 0;
        printf("  (kvgate-cli as a process, start + handshake + request: %.1f ms each%s)\n\n",
               (now_s() - t0) * 1e3 / k, bad ? ", some failed" : "");
    }
    kill(ngx, SIGQUIT);
    waitpid(ngx, NULL, 0);
    kill(eng, SIGTERM);
    waitpid(eng, NULL, 0);

    /* ---- 2: worker CPU for a 1,000-token prompt ---- */
    snprintf(sock, sizeof sock, "%s/e2.sock", dir);
    char lp[700];
    snprintf(lp, sizeof lp, "%s/tokenizers/llama2/tokenizer.bin", shared);
    char *m2[] = { "--model", "synthetic:15M", "--tokenizer", lp, "--context", "2048", NULL };
    eng = start_engine(sock, m2);
    ngx = eng > 0 ? start_nginx(sock) : -1;
    if (ngx < 0)
        return 1;
    kvg_client *c = kvg_client_new(sock, NULL, err, sizeof err);
    if (!c || kvg_client_connect_wait(c, 20000, err, sizeof err) != 0) {
        fprintf(stderr, "gateway_bench: %s\n", err);
        return 1;
    }
    const kvg_engine_info *in = kvg_client_info(c);
    /* cut the prose to 1,000 tokens of this tokenizer */
    int32_t *ids;
    size_t nid, cut = strlen(long_prompt);
    while (kvg_tokenizer_encode(in->tokenizer, long_prompt, cut, KVG_ENC_BOS, &ids, &nid, err, sizeof err) == 0 &&
           nid > 1000) {
        free(ids);
        cut = cut * 1000 / nid - 1;
    }
    free(ids);
    long_prompt[cut] = 0;
    char *lbody = json_body(in->model_name, long_prompt, 1, &blen);
    /* the library work alone, as the worker does it */
    {
        int reps = 2000;
        double t0 = now_s();
        for (int i = 0; i < reps; i++) {
            kvg_api_error ae;
            kvg_request *rq = kvg_request_parse(KVG_ENDPOINT_COMPLETIONS, lbody, blen, &ae);
            char *norm;
            size_t nl, nb;
            kvg_normalize(KVG_NORM_NEWLINES | KVG_NORM_TRAILING, rq->prompt, rq->prompt_len, &norm, &nl, err,
                          sizeof err);
            kvg_tokenizer_encode(in->tokenizer, norm, nl, KVG_ENC_BOS, &ids, &nid, err, sizeof err);
            uint8_t (*hs)[32] = malloc((nid / 16 + 1) * 32);
            kvg_client_hash_prompt(c, "bench", 5, ids, nid, hs, nid / 16 + 1, &nb, err, sizeof err);
            free(hs);
            free(ids);
            free(norm);
            kvg_request_free(rq);
        }
        double per = (now_s() - t0) / reps;
        printf("worker CPU per request, a 1,000-token prompt (%zu bytes of JSON; synthetic:15M, Llama 2 tokenizer)\n",
               blen);
        printf("  parse + normalize + tokenize + hash, in this process:   %7.1f us\n", per * 1e6);
    }
    {
        pid_t wp = worker_pid(ngx);
        job lj = { 0, lbody, long_prompt, sock, blen, 1, NULL, 0 };
        lj.n = 20;
        http_worker(&lj);     /* caches it */
        int reqs = n;
        uint64_t c0 = cpu_ns(wp);
        lj.n = reqs;
        double t0 = now_s();
        http_worker(&lj);
        double dt = now_s() - t0;
        uint64_t c1 = cpu_ns(wp);
        printf("  the nginx worker's CPU (schedstat), all of the request:  %7.1f us  (%d requests, %.0f req/s, "
               "%d failed)\n", (double)(c1 - c0) / reqs / 1e3, reqs, reqs / dt, lj.fails);
        printf("  goal: < 100 us per request\n");
        /* the same cached 1,000-token request, latency through nginx vs directly: a
         * request that costs the engine more shows the gateway's fixed cost in proportion */
        int m = n / 4 > 50 ? n / 4 : 50;
        double *a = malloc((size_t)m * sizeof *a), *bb = malloc((size_t)m * sizeof *bb);
        job hj = lj, dj = lj;
        hj.n = dj.n = m;
        hj.lat = a;
        dj.lat = bb;
        http_worker(&hj);
        direct_worker(&dj);
        double a50 = pct(a, m, 0.5), b50 = pct(bb, m, 0.5);
        printf("  the same request's latency, p50: %.3f ms through nginx, %.3f ms directly: %+.1f%% (%.0f us)\n",
               a50 * 1e3, b50 * 1e3, (a50 / b50 - 1) * 100, (a50 - b50) * 1e6);
        free(a);
        free(bb);
    }
    kvg_client_free(c);
    kill(ngx, SIGQUIT);
    waitpid(ngx, NULL, 0);
    kill(eng, SIGTERM);
    waitpid(eng, NULL, 0);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm) != 0)
        return 1;
    free(gold);
    free(body);
    free(lbody);
    free(lh);
    free(ld);
    return 0;
}
