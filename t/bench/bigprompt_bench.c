/* Small requests while huge prompts arrive (printed, never asserted): a short
 * completion's latency p50/p99 through nginx (one worker), alone and while 4 clients
 * loop 7.5 MB prompts, with kvgate_thread_pool on (the default pool) and off.
 * The engine is synthetic:15M with the Llama 2 tokenizer and a context of 1,000,000
 * tokens, so that the big prompts pass the body limit and the byte-length bound
 * (7.5 MB / 27 bytes, the longest piece, is under the context), are tokenized in full
 * (~1.9M tokens) and only then refused as too long: the worst case for the worker.
 * Goal: p99 while loaded <= 2x p99 alone, with the pool on.
 * Usage: bigprompt_bench [requests]   (from the repository root; BUILD=dir) */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_http.h"
#include "bench_proc.h"

static char dir[64], build[512], shared[512];
static volatile int stop_big;

static pid_t start_nginx(const char *sock)
{
    return bench_start_nginx(dir, build, sock, "client_max_body_size 0; client_body_buffer_size 16m;",
                             "location /on/v1/ { kvgate_pass; kvgate_thread_pool default; }\n"
                             "  location /off/v1/ { kvgate_pass; kvgate_thread_pool off; }");
}

typedef struct big {
    const char *path, *body;
    size_t len;
    int done, by_status[6];
} big;

static void *big_loop(void *arg)
{
    big *b = arg;
    http *h = malloc(sizeof *h);
    if (http_open(h) != 0) {
        free(h);
        return NULL;
    }
    while (!stop_big) {
        int s = http_post(h, b->path, b->body, b->len);
        b->by_status[s / 100 < 6 ? s / 100 : 0]++;
        b->done++;
        if (s == 0) {
            close(h->fd);
            if (http_open(h) != 0)
                break;
        }
    }
    close(h->fd);
    free(h);
    return NULL;
}

/* Up to n small requests, one at a time, for at most 60 s (a stalled worker makes each
 * one slow); p50/p99 in ms into out[0..1] and the count into out[2]; returns failures. */
static int small_run(const char *path, const char *body, size_t len, int n, double *out)
{
    http *h = malloc(sizeof *h);
    double *lat = calloc((size_t)n, sizeof *lat), start = now_s();
    int fails = 0, i;
    if (http_open(h) != 0)
        return n;
    for (i = 0; i < n && now_s() - start < 60; i++) {
        double t0 = now_s();
        if (http_post(h, path, body, len) != 200)
            fails++;
        lat[i] = (now_s() - t0) * 1e3;
    }
    out[0] = pct(lat, i, 0.50);
    out[1] = pct(lat, i, 0.99);
    out[2] = i;
    close(h->fd);
    free(h);
    free(lat);
    return fails;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 400;
    const char *b = getenv("BUILD"), *sh = getenv("KVGATE_SHARED");
    char sock[128], tp[700];
    if (n < 50)
        n = 50;
    snprintf(build, sizeof build, "%s", b && *b ? b : "build");
    snprintf(shared, sizeof shared, "%s", sh && *sh ? sh : "../shared");
    snprintf(dir, sizeof dir, "/tmp/kvgate-bigbench-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    chmod(dir, 0755);
    signal(SIGPIPE, SIG_IGN);

    snprintf(sock, sizeof sock, "%s/e.sock", dir);
    snprintf(tp, sizeof tp, "%s/tokenizers/llama2/tokenizer.bin", shared);
    const char *eargs[] = { "--model", "synthetic:15M", "--tokenizer", tp, "--context", "1000000",
                            "--socket", sock, "--socket-mode", "0666", "--threads", "1", NULL };
    pid_t eng = bench_start_engine(eargs);
    pid_t ngx = eng > 0 ? start_nginx(sock) : -1;
    if (ngx < 0)
        return 1;

    /* 7.5 MB of prose-like words (about 4 bytes a token with this tokenizer) */
    static const char *words[] = { "the", "little", "girl", "saw", "a", "big", "red", "ball", "and",
                                   "she", "was", "very", "happy", "to", "play", "with", "it", "in",
                                   "park", "sun" };
    size_t want = 7500000, cap = want + 256, w = 0;
    char *big_body = malloc(cap);
    w += (size_t)snprintf(big_body, cap, "{\"model\":\"synthetic:15M\",\"max_tokens\":1,\"prompt\":\"");
    unsigned x = 12345;
    while (w < want) {
        x = x * 1103515245u + 12345u;
        const char *wd = words[(x >> 16) % 20];
        size_t l = strlen(wd);
        memcpy(big_body + w, wd, l);
        w += l;
        big_body[w++] = (x >> 8) % 13 == 0 ? '.' : ' ';
    }
    w += (size_t)snprintf(big_body + w, cap - w, "\"}");
    const char *small = "{\"model\":\"synthetic:15M\",\"prompt\":\"Once upon a time\",\"max_tokens\":1,"
                        "\"temperature\":0}";

    /* warm up (and wait until nginx and the engine are up) */
    double tmp[3];
    for (int tries = 0; tries < 100 && small_run("/on/v1/completions", small, strlen(small), 5, tmp); tries++)
        usleep(100000);

    printf("small completion p50 / p99 (ms), %d requests, alone and while 4 clients loop 7.5 MB prompts\n", n);
    printf("%-22s %16s %20s %10s %16s\n", "kvgate_thread_pool", "alone", "with 4 x 7.5 MB", "p99 ratio",
           "big: done 4xx");
    for (int mode = 0; mode < 2; mode++) {
        const char *loc = mode == 0 ? "/on/v1/completions" : "/off/v1/completions";
        double alone[3], loaded[3];
        int f1 = small_run(loc, small, strlen(small), n, alone);
        big bg[4];
        pthread_t th[4];
        stop_big = 0;
        for (int i = 0; i < 4; i++) {
            memset(&bg[i], 0, sizeof bg[i]);
            bg[i].path = loc;
            bg[i].body = big_body;
            bg[i].len = w;
            pthread_create(&th[i], NULL, big_loop, &bg[i]);
        }
        usleep(300000);
        int f2 = small_run(loc, small, strlen(small), n, loaded);
        stop_big = 1;
        int done = 0, c4 = 0;
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            done += bg[i].done;
            c4 += bg[i].by_status[4];
        }
        char a[40], l[40], d[40];
        snprintf(a, sizeof a, "%.2f / %.2f", alone[0], alone[1]);
        snprintf(l, sizeof l, "%.2f / %.2f%s", loaded[0], loaded[1], loaded[2] < n ? "*" : "");
        snprintf(d, sizeof d, "%d %d", done, c4);
        printf("%-22s %16s %20s %9.1fx %16s%s\n", mode == 0 ? "on (default pool)" : "off", a, l,
               loaded[1] / alone[1], d, f1 || f2 ? "  (some small requests failed)" : "");
        fflush(stdout);
    }

    printf("(* fewer requests: the 60 s budget ran out)\n");
    kill(ngx, SIGQUIT);
    waitpid(ngx, NULL, 0);
    kill(eng, SIGTERM);
    waitpid(eng, NULL, 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    free(big_body);
    return 0;
}
