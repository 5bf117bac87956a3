/* Test helpers for the engine daemon as a real process: start build/bin/kvgate-engine
 * (the ASan build when this test is one), wait for its readiness line, stop it; and a
 * blocking way to run requests through the client library and collect everything they
 * produce. Header-only, like tap.h. */
#ifndef KVG_ENGINE_PROC_H
#define KVG_ENGINE_PROC_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "tap.h"

#if defined(__SANITIZE_ADDRESS__)
#define ENGINE_IS_ASAN 1
#else
#define ENGINE_IS_ASAN 0
#endif

__attribute__((unused)) static double ep_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

__attribute__((unused)) static void ep_sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* The deadline of a wait for something the engine does in its own time (a first token,
 * its statistics page): generous, since it only runs out when the test fails anyway. */
#define EP_WAIT_S (ENGINE_IS_ASAN ? 60.0 : 30.0)

/* The engine binary: KVGATE_ENGINE, else $BUILD/bin (or $BUILD/asan/bin for an ASan test). */
static const char *ep_engine_bin(void)
{
    static char path[4096];
    const char *e = getenv("KVGATE_ENGINE");
    if (e && *e)
        return e;
    const char *b = getenv("BUILD");
    snprintf(path, sizeof path, "%s/%sbin/kvgate-engine", b && *b ? b : "build", ENGINE_IS_ASAN ? "asan/" : "");
    if (access(path, X_OK) != 0)
        snprintf(path, sizeof path, "%s/bin/kvgate-engine", b && *b ? b : "build");
    return path;
}

typedef struct engine_proc {
    pid_t pid;
    int out_fd;                  /* its stdout */
    char ready[1024];            /* the readiness line */
    char errlog[256];            /* its stderr goes here */
} engine_proc;

/* A fresh private directory for sockets (removed by the OS's tmp cleaning; tests
 * remove what they create). */
static const char *ep_tmpdir(void)
{
    static char dir[256];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kvgate-test-XXXXXX");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            exit(1);
        }
    }
    return dir;
}

static int ep_quiet_start;     /* a start that is expected to fail: no diagnostics */

/* Starts the engine with the argument list (NULL-terminated) after the binary name.
 * Waits up to 60 s for the readiness line. 0, or -1 (the engine's stderr is shown). */
__attribute__((unused)) static int ep_start(engine_proc *e, const char *const *args)
{
    int out[2];
    const char *argv[64];
    int n = 0;

    memset(e, 0, sizeof *e);
    snprintf(e->errlog, sizeof e->errlog, "%s/engine-%d.err", ep_tmpdir(), (int)getpid());
    argv[n++] = ep_engine_bin();
    for (int i = 0; args[i] && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    if (pipe(out) != 0)
        return -1;
    e->pid = fork();
    if (e->pid == 0) {
        /* an engine never outlives the test that started it */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(e->errlog, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(out[1], 1);
        if (fd >= 0)
            dup2(fd, 2);
        close(out[0]);
        close(out[1]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(out[1]);
    e->out_fd = out[0];
    size_t len = 0;
    double deadline = ep_now() + (ENGINE_IS_ASAN ? 120 : 60);
    while (ep_now() < deadline) {
        struct pollfd p = { e->out_fd, POLLIN, 0 };
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t r = read(e->out_fd, e->ready + len, sizeof e->ready - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        e->ready[len] = '\0';
        if (strchr(e->ready, '\n'))
            return 0;
    }
    if (!ep_quiet_start) {
        diag("the engine did not become ready; its stderr:");
        char *log = slurp(e->errlog, &len);
        if (log)
            diag("%s", log);
        free(log);
    }
    kill(e->pid, SIGKILL);
    waitpid(e->pid, NULL, 0);
    e->pid = 0;
    return -1;
}

/* Sends sig and waits up to timeout_s; returns the exit status (128+signal for a
 * signal death), or -1 when it had to be killed. */
__attribute__((unused)) static int ep_stop(engine_proc *e, int sig, double timeout_s)
{
    int st = 0;
    if (!e->pid)
        return -1;
    if (sig)
        kill(e->pid, sig);
    double deadline = ep_now() + timeout_s;
    for (;;) {
        pid_t r = waitpid(e->pid, &st, WNOHANG);
        if (r == e->pid)
            break;
        if (ep_now() > deadline) {
            kill(e->pid, SIGKILL);
            waitpid(e->pid, &st, 0);
            e->pid = 0;
            close(e->out_fd);
            return -1;
        }
        ep_sleep_ms(5);
    }
    e->pid = 0;
    close(e->out_fd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *ep_stderr(const engine_proc *e)
{
    size_t len;
    char *s = slurp(e->errlog, &len);
    return s ? s : strdup("");
}

/* ---- requests ---- */

#define EP_MAXTOK 1024

typedef struct ep_result {
    int done, error, status;
    char message[512];
    int accepted;
    uint32_t prompt_tokens, cached_tokens, completion_tokens;
    uint32_t n_tokens[KVG_PROTO_MAX_N];
    uint32_t tokens[KVG_PROTO_MAX_N][EP_MAXTOK];
    float logprobs[KVG_PROTO_MAX_N][EP_MAXTOK];
    char text[KVG_PROTO_MAX_N][8192];
    size_t text_len[KVG_PROTO_MAX_N];
    uint32_t finish[KVG_PROTO_MAX_N];
    uint32_t sample_completion[KVG_PROTO_MAX_N];
    double t_first, t_end;
    int wiped;                   /* a wipe's answer came (done is set too) */
    uint64_t wiped_blocks[3];    /* pool, host, disk */
} ep_result;

/* Files an event into the result its user pointer names. */
__attribute__((unused)) static void ep_record(const kvg_client_event *ev)
{
    ep_result *r = ev->user;
    if (!r)
        return;
    switch (ev->kind) {
    case KVG_CEV_ACCEPTED:
        r->accepted = 1;
        break;
    case KVG_CEV_TOKENS:
        if (ev->sample >= KVG_PROTO_MAX_N)
            break;
        if (!r->t_first)
            r->t_first = ep_now();
        for (uint32_t i = 0; i < ev->n_tokens && r->n_tokens[ev->sample] < EP_MAXTOK; i++) {
            r->logprobs[ev->sample][r->n_tokens[ev->sample]] = ev->logprobs ? ev->logprobs[i] : 0.0f;
            r->tokens[ev->sample][r->n_tokens[ev->sample]++] = ev->tokens[i];
        }
        if (r->text_len[ev->sample] + ev->text_len < sizeof r->text[0]) {
            memcpy(r->text[ev->sample] + r->text_len[ev->sample], ev->text, ev->text_len);
            r->text_len[ev->sample] += ev->text_len;
        }
        break;
    case KVG_CEV_FINISHED:
        if (ev->sample < KVG_PROTO_MAX_N) {
            r->finish[ev->sample] = ev->finish_reason;
            r->sample_completion[ev->sample] = ev->completion_tokens;
        }
        break;
    case KVG_CEV_DONE:
        r->done = 1;
        r->prompt_tokens = ev->prompt_tokens;
        r->cached_tokens = ev->cached_tokens;
        r->completion_tokens = ev->completion_tokens;
        r->t_end = ep_now();
        break;
    case KVG_CEV_WIPED:
        r->done = r->wiped = 1;
        r->wiped_blocks[0] = ev->wiped_pool;
        r->wiped_blocks[1] = ev->wiped_host;
        r->wiped_blocks[2] = ev->wiped_disk;
        r->t_end = ep_now();
        break;
    case KVG_CEV_ERROR:
        r->error = 1;
        r->status = ev->status;
        snprintf(r->message, sizeof r->message, "%s", ev->message ? ev->message : "");
        r->t_end = ep_now();
        break;
    default:
        break;
    }
}

/* Pumps every client until each result is done or failed, or timeout_s passes.
 * Returns the number still open. */
__attribute__((unused)) static int ep_pump(kvg_client **cs, int n_clients, ep_result **rs, int n_results, double timeout_s)
{
    double deadline = ep_now() + timeout_s;
    for (;;) {
        int open_ = 0;
        for (int i = 0; i < n_results; i++)
            open_ += !rs[i]->done && !rs[i]->error;
        if (!open_ || ep_now() > deadline)
            return open_;
        int got = 0;
        for (int k = 0; k < n_clients; k++) {
            kvg_client_event ev;
            while (kvg_client_next_event(cs[k], &ev) == 1) {
                got = 1;
                ep_record(&ev);
            }
        }
        if (!got) {
            struct pollfd p[64];
            int np = 0;
            for (int k = 0; k < n_clients && np < 62; k++) {
                if (kvg_client_socket_fd(cs[k]) >= 0)
                    p[np++] = (struct pollfd){ kvg_client_socket_fd(cs[k]), POLLIN, 0 };
                if (kvg_client_doorbell_fd(cs[k]) >= 0)
                    p[np++] = (struct pollfd){ kvg_client_doorbell_fd(cs[k]), POLLIN, 0 };
            }
            if (poll(p, (nfds_t)np, 50) > 0)
                for (int k = 0; k < n_clients; k++)
                    for (int q = 0; q < np; q++)
                        if (p[q].revents && p[q].fd == kvg_client_socket_fd(cs[k]))
                            kvg_client_socket_readable(cs[k]);
        }
    }
}

static kvg_client *ep_connect(const char *sock)
{
    char err[512];
    kvg_client_opts o = { "test", 20, 200 };
    kvg_client *c = kvg_client_new(sock, &o, err, sizeof err);
    if (!c || kvg_client_connect_wait(c, 20000, err, sizeof err) != 0) {
        diag("connect %s: %s", sock, err);
        kvg_client_free(c);
        return NULL;
    }
    return c;
}

/* Tokenizes text with the engine's tokenizer (BOS per the vocabulary). */
static int32_t *ep_tokens(kvg_client *c, const char *text, size_t *n)
{
    int32_t *ids = NULL;
    char err[256];
    const kvg_engine_info *in = kvg_client_info(c);
    if (kvg_tokenizer_encode(in->tokenizer, text, strlen(text), in->add_bos ? KVG_ENC_BOS : 0, &ids, n, err,
                             sizeof err) != 0) {
        diag("encode: %s", err);
        return NULL;
    }
    return ids;
}

/* A request with the common defaults: greedy, not bypassed, tenant "t". */
__attribute__((unused)) static kvg_client_req ep_req(const int32_t *ids, size_t n, unsigned max_tokens)
{
    kvg_client_req q;
    memset(&q, 0, sizeof q);
    q.salt = "t";
    q.salt_len = 1;
    q.tokens = ids;
    q.n_tokens = n;
    q.max_tokens = max_tokens;
    q.top_p = 1.0f;
    q.bucket = 1;
    q.logprobs = 1;
    return q;
}

/* Submit (retrying while the ring is full) and wait. 0 when it completed. */
__attribute__((unused)) static int ep_run(kvg_client *c, const kvg_client_req *q, ep_result *r, double timeout_s)
{
    char err[512];
    uint64_t id;
    int rc;
    memset(r, 0, sizeof *r);
    double deadline = ep_now() + timeout_s;
    while ((rc = kvg_client_submit(c, q, r, &id, err, sizeof err)) == KVG_CLIENT_AGAIN) {
        kvg_client_event ev;
        while (kvg_client_next_event(c, &ev) == 1)
            ep_record(&ev);
        if (ep_now() > deadline)
            break;
        kvg_client_wait(c, 20);
    }
    if (rc != 0) {
        r->error = 1;
        r->status = -1;
        snprintf(r->message, sizeof r->message, "%s", err);
        return -1;
    }
    ep_pump(&c, 1, &r, 1, timeout_s);
    return r->done ? 0 : -1;
}

/* Pumps one client until r has its first tokens (or failed, or ended); 0 then, -1 when
 * EP_WAIT_S passed first (a diag says so; the test's own assertions then fail). */
__attribute__((unused)) static int ep_wait_first(kvg_client *c, ep_result *r)
{
    double deadline = ep_now() + EP_WAIT_S;
    while (!r->t_first && !r->error && !r->done) {
        if (ep_now() > deadline) {
            diag("no first token within %.0f s", EP_WAIT_S);
            return -1;
        }
        kvg_client_event ev;
        while (kvg_client_next_event(c, &ev) == 1)
            ep_record(&ev);
        kvg_client_wait(c, 50);
    }
    return 0;
}

/* Same outputs (tokens, logprobs bit for bit, text, finish reasons) for n samples. */
__attribute__((unused)) static int ep_same(const ep_result *a, const ep_result *b, int n)
{
    for (int j = 0; j < n; j++) {
        if (a->n_tokens[j] != b->n_tokens[j] || a->finish[j] != b->finish[j] ||
            a->text_len[j] != b->text_len[j])
            return 0;
        if (memcmp(a->tokens[j], b->tokens[j], a->n_tokens[j] * sizeof a->tokens[0][0]) ||
            memcmp(a->logprobs[j], b->logprobs[j], a->n_tokens[j] * sizeof a->logprobs[0][0]) ||
            memcmp(a->text[j], b->text[j], a->text_len[j]))
            return 0;
    }
    return 1;
}

__attribute__((unused)) static int ep_stats(kvg_client *c, kvg_stats *s)
{
    if (kvg_client_stats(c, s) != 0) {
        diag("stats page unreadable");
        memset(s, 0, sizeof *s);
        return -1;
    }
    return 0;
}

/* Reads the engine's statistics page every 5 ms until want(page, arg) holds: 0, with
 * the page in *s; -1 when timeout_s passed first (*s is the last page read). The page
 * is the engine's to write (before each DONE, else every 20 ms while busy): a test
 * waiting for anything else there (a cancel, an idle engine) polls it with this. */
__attribute__((unused)) static int ep_wait_stats(kvg_client *c, double timeout_s, kvg_stats *s,
                                                 int (*want)(const kvg_stats *, const void *), const void *arg)
{
    double deadline = ep_now() + timeout_s;
    for (;;) {
        if (ep_stats(c, s) == 0 && want(s, arg))
            return 0;
        if (ep_now() > deadline)
            return -1;
        ep_sleep_ms(5);
    }
}

__attribute__((unused)) static int ep_is_idle(const kvg_stats *s, const void *arg)
{
    (void)arg;
    return s->running == 0 && s->waiting == 0;
}

/* Waits until the engine has no request running or waiting and reports the block
 * counts; -1 on timeout. */
__attribute__((unused)) static int ep_wait_idle(kvg_client *c, double timeout_s, kvg_stats *s)
{
    return ep_wait_stats(c, timeout_s, s, ep_is_idle, NULL);
}

#endif
