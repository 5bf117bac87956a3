/* Shared-memory channel figures (printed, never asserted):
 *  1. round-trip latency of a 1-token request (5-token prompt, greedy, bypass) through a
 *     real kvgate-engine process and the client library, against the same request as a
 *     direct call into an in-process scheduler on the same model: p50 / p90 / p99 and the
 *     median the channel adds (goal: < 50 us);
 *  2. streaming throughput through one channel: (a) with a trivial producer in place of a
 *     model (a thread speaking the engine protocol that emits tokens as fast as the ring
 *     takes them), one token per message as a decode step makes them, and 16 per message;
 *     (b) the real engine on stories260K, 8 requests x n=16 at once (model-bound).
 *     Goal: well above any model's decode rate, >= 1M tokens/s.
 * Usage: ipc_bench [round-trips]   (from the repository root; BUILD=dir for the engine) */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "bench_proc.h"
#include "client.h"
#include "forward.h"
#include "cache_index.h"
#include "kv_cache.h"
#include "kv_cache_testing.h"
#include "model.h"
#include "prefix_cache.h"
#include "proto.h"
#include "scheduler.h"

static char err[512];
static char model_path[1024], tok_path[1024];

/* ---- the real engine as a process ---- */

static pid_t start_engine(const char *sock, const char *busy_poll)
{
    const char *args[] = { "--model", model_path, "--tokenizer", tok_path, "--socket", sock, "--threads", "1",
                           "--kv-memory", "64M", "--busy-poll-us", busy_poll, NULL };
    return bench_start_engine(args);
}

typedef struct counter {
    int done, error;
    uint64_t tokens;
} counter;

static void pump_until(kvg_client *c, counter *cs, int n)
{
    for (;;) {
        int open_ = 0;
        for (int i = 0; i < n; i++)
            open_ += !cs[i].done && !cs[i].error;
        if (!open_)
            return;
        kvg_client_event ev;
        int got = 0;
        while (kvg_client_next_event(c, &ev) == 1) {
            counter *k = ev.user;
            got = 1;
            if (!k)
                continue;
            if (ev.kind == KVG_CEV_TOKENS)
                k->tokens += ev.n_tokens;
            else if (ev.kind == KVG_CEV_DONE)
                k->done = 1;
            else if (ev.kind == KVG_CEV_ERROR || ev.kind == KVG_CEV_DOWN) {
                k->error = 1;
                fprintf(stderr, "ipc_bench: %s\n", ev.message);
            }
        }
        if (!got)
            kvg_client_wait(c, 100);
    }
}

/* ---- direct library call ---- */

static int direct_done;

static void on_event(void *ctx, const kvg_sched_event *ev)
{
    (void)ctx;
    if (ev->kind == KVG_SEV_DONE)
        direct_done = 1;
}

static void direct_latency(double *lat, int n)
{
    kvg_model_load_opts lo = { tok_path, NULL, NULL, 0 };
    kvg_model *m = kvg_model_load(model_path, &lo, err, sizeof err);
    kvg_backend *be = m ? kvg_backend_cpu_new(m, 1, err, sizeof err) : NULL;
    kvg_kv_geom g;
    if (!be) {
        fprintf(stderr, "ipc_bench: %s\n", err);
        exit(1);
    }
    kvg_forward_kv_geom(m, 0, &g);
    kvg_kv_pool *pool = kvg_kv_pool_new(&g, kvg_kv_blocks_for_budget(&g, 64 << 20), err, sizeof err);
    kvg_forward *fw = kvg_forward_new(m, be, pool, err, sizeof err);
    kvg_pc_config pcfg;
    memset(&pcfg, 0, sizeof pcfg);
    memcpy(pcfg.model_id, m->id, 32);
    kvg_prefix_cache *pc = kvg_pc_new(pool, &pcfg, err, sizeof err);
    kvg_sched *s = kvg_sched_new(m, fw, pc, pool, NULL, on_event, NULL, err, sizeof err);
    int32_t prompt[] = { 1, 403, 407, 261, 378 };
    int tenant = kvg_pc_tenant(pc, "", 0, 0.0);
    for (int i = -200; i < n; i++) {
        kvg_sched_req q;
        memset(&q, 0, sizeof q);
        q.tenant = tenant;
        q.id = (uint64_t)(i + 1000);
        q.prompt = prompt;
        q.n_prompt = 5;
        q.bucket = 0;
        q.n = 1;
        q.max_tokens = 1;
        q.sp.top_p = 1.0f;
        q.stop_ids[0] = 2;
        q.stop_ids[1] = 1;
        q.n_stop_ids = 2;
        direct_done = 0;
        double t0 = now_s();
        if (kvg_sched_submit(s, &q, err, sizeof err) != 0) {
            fprintf(stderr, "ipc_bench: direct submit: %s\n", err);
            exit(1);
        }
        int steps = 0;
        while (!direct_done) {
            int rows = kvg_sched_step(s, err, sizeof err);
            if (++steps > 100000) {
                fprintf(stderr, "ipc_bench: direct request never finished (rows %d, pending %d): %s\n", rows,
                        kvg_sched_pending(s), err);
                exit(1);
            }
        }
        if (i >= 0)
            lat[i] = now_s() - t0;
    }
    kvg_sched_free(s);
    kvg_pc_free(pc);
    kvg_forward_free(fw);
    kvg_kv_pool_free(pool);
    kvg_backend_free(be);
    kvg_model_free(m);
}

/* ---- a trivial producer speaking the engine protocol ---- */

typedef struct fake {
    char path[256];
    int listen_fd;
    int per_msg;                 /* tokens per TOKENS message */
    uint64_t tokens;             /* tokens per request */
} fake;

static void *fake_engine(void *arg)
{
    fake *f = arg;
    int s = accept(f->listen_fd, NULL, NULL);
    kvg_hello h;
    struct pollfd p = { s, POLLIN, 0 };
    poll(&p, 1, 5000);
    if (kvg_proto_recv_hello(s, &h, err, sizeof err) != 0)
        return NULL;
    kvg_shm_caps caps = { 256, 1024, 1 << 16, 1 << 20 };
    size_t rsize = kvg_shm_region_size(&caps);
    int memfd = memfd_create("bench-region", MFD_CLOEXEC);
    if (ftruncate(memfd, (off_t)rsize) != 0)
        return NULL;
    void *region = mmap(NULL, rsize, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    kvg_shm shm;
    kvg_shm_init(region, rsize, &caps, err, sizeof err);
    kvg_shm_attach(&shm, region, rsize, err, sizeof err);
    int bell_in = eventfd(0, EFD_NONBLOCK), bell_out = eventfd(0, EFD_NONBLOCK);
    int tok_fd = open(tok_path, O_RDONLY);
    struct stat st;
    fstat(tok_fd, &st);
    size_t ssize = (sizeof(kvg_stats_page) + 4095) & ~(size_t)4095;
    int stats_fd = memfd_create("bench-stats", MFD_CLOEXEC);
    if (ftruncate(stats_fd, (off_t)ssize) != 0)
        return NULL;
    /* An empty cache index (protocol 3): the client maps and checks it. */
    size_t hsize = kvg_cache_index_page_bytes(16);
    int cidx_fd = memfd_create("bench-cache-index", MFD_CLOEXEC);
    void *cidx = MAP_FAILED;
    if (ftruncate(cidx_fd, (off_t)hsize) != 0 ||
        (cidx = mmap(NULL, hsize, PROT_READ | PROT_WRITE, MAP_SHARED, cidx_fd, 0)) == MAP_FAILED)
        return NULL;
    kvg_cache_index_writer_free(kvg_cache_index_writer_new(cidx, hsize, 16, err, sizeof err));
    kvg_welcome w;
    memset(&w, 0, sizeof w);
    w.magic = KVG_PROTO_MAGIC;
    w.version = KVG_PROTO_VERSION;
    snprintf(w.model_name, sizeof w.model_name, "trivial");
    snprintf(w.chat_template, sizeof w.chat_template, "none");
    w.chat_template_origin = 0;   /* KVG_CHAT_NONE: fd[6] is empty */
    int chat_fd = memfd_create("bench-chat-template", MFD_CLOEXEC);
    snprintf(w.tokenizer_name, sizeof w.tokenizer_name, "tok512.bin");
    w.region_bytes = rsize;
    w.tokenizer_bytes = (uint64_t)st.st_size;
    w.stats_bytes = ssize;
    w.index_bytes = hsize;
    w.context_length = 1 << 20;
    w.block_tokens = 16;
    w.vocab_size = 512;
    w.max_n = 1;
    int fds[KVG_WELCOME_FDS] = { memfd, bell_in, bell_out, tok_fd, stats_fd, cidx_fd, chat_fd };
    kvg_proto_send_welcome(s, &w, fds, KVG_WELCOME_FDS, err, sizeof err);
    static unsigned char buf[1 << 16] __attribute__((aligned(8)));
    static unsigned char out[1 << 16] __attribute__((aligned(8)));
    uint32_t ids[64];
    char text[256];
    for (int i = 0; i < 64; i++) {
        ids[i] = 300 + (uint32_t)i;
        text[2 * i] = 'a';
        text[2 * i + 1] = ' ';
    }
    for (;;) {
        kvg_shm_msg m;
        int rc = kvg_shm_try_pop(&shm.sq, &m, buf, sizeof buf, err, sizeof err);
        if (rc != 0) {
            struct pollfd q[2] = { { bell_in, POLLIN, 0 }, { s, POLLIN, 0 } };
            poll(q, 2, 1000);
            if (q[1].revents)
                break;
            uint64_t v;
            if (read(bell_in, &v, sizeof v) < 0) {
            }
            continue;
        }
        kvg_submit_view sv;
        uint64_t id;
        if (kvg_proto_decode_submit(&m, &sv, &id, err, sizeof err) != 0)
            continue;
        uint64_t sent = 0;
        unsigned since_bell = 0;
        while (sent < f->tokens) {
            uint32_t k = (uint32_t)f->per_msg;
            size_t pl = kvg_proto_encode_tokens(ids, NULL, k, text, 2 * k, out, sizeof out);
            kvg_msg_tokens t = { KVG_PROTO_VERSION, 0, id, 0, k, 2 * k, 0 };
            rc = kvg_shm_try_push(&shm.cq, KVG_MSG_TOKENS, &t, sizeof t, out, pl, err, sizeof err);
            if (rc == KVG_SHM_FULL) {
                uint64_t one = 1, v;
                if (write(bell_out, &one, 8) < 0) {
                }
                since_bell = 0;
                kvg_shm_producer_wait(&shm.cq);
                if (kvg_shm_can_push(&shm.cq, pl))
                    continue;
                struct pollfd q = { bell_in, POLLIN, 0 };
                poll(&q, 1, 100);
                if (read(bell_in, &v, 8) < 0) {
                }
                continue;
            }
            sent += k;
            /* The real engine rings once per step; ring every 64 messages here. */
            if (++since_bell == 64) {
                uint64_t one = 1;
                if (write(bell_out, &one, 8) < 0) {
                }
                since_bell = 0;
            }
        }
        kvg_msg_done d = { KVG_PROTO_VERSION, 0, id, sv.h.n_tokens, 0, (uint32_t)sent, 0 };
        while (kvg_shm_try_push(&shm.cq, KVG_MSG_DONE, &d, sizeof d, NULL, 0, err, sizeof err) == KVG_SHM_FULL) {
            uint64_t one = 1;
            if (write(bell_out, &one, 8) < 0) {
            }
            struct timespec ts = { 0, 10000 };
            nanosleep(&ts, NULL);
        }
        uint64_t one = 1;
        if (write(bell_out, &one, 8) < 0) {
        }
    }
    close(s);
    return NULL;
}

static double trivial_throughput(const char *dir, int per_msg, uint64_t tokens)
{
    fake f;
    struct sockaddr_un sa;
    pthread_t th;
    memset(&f, 0, sizeof f);
    snprintf(f.path, sizeof f.path, "%s/trivial-%d.sock", dir, per_msg);
    f.per_msg = per_msg;
    f.tokens = tokens;
    f.listen_fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, f.path, strlen(f.path) < sizeof sa.sun_path ? strlen(f.path) + 1 : sizeof sa.sun_path - 1);
    unlink(f.path);
    if (bind(f.listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(f.listen_fd, 4) != 0)
        return -1;
    pthread_create(&th, NULL, fake_engine, &f);
    kvg_client *c = kvg_client_new(f.path, NULL, err, sizeof err);
    if (!c || kvg_client_connect_wait(c, 5000, err, sizeof err) != 0) {
        fprintf(stderr, "ipc_bench: %s\n", err);
        return -1;
    }
    int32_t prompt[] = { 1, 2, 3 };
    kvg_client_req q;
    memset(&q, 0, sizeof q);
    q.tokens = prompt;
    q.n_tokens = 3;
    q.bypass = 1;
    q.max_tokens = 1;
    counter k = { 0, 0, 0 };
    uint64_t id;
    double t0 = now_s();
    kvg_client_submit(c, &q, &k, &id, err, sizeof err);
    pump_until(c, &k, 1);
    double dt = now_s() - t0;
    kvg_client_free(c);
    pthread_join(th, NULL);
    close(f.listen_fd);
    unlink(f.path);
    return k.error ? -1 : (double)k.tokens / dt;
}

/* n sequential 1-token requests; their latencies from submit to DONE. */
static int round_trips(kvg_client *c, double *lat, int n)
{
    int32_t prompt[] = { 1, 403, 407, 261, 378 };
    kvg_client_req q;
    memset(&q, 0, sizeof q);
    q.tokens = prompt;
    q.n_tokens = 5;
    q.bypass = 1;
    q.max_tokens = 1;
    q.top_p = 1.0f;
    for (int i = -200; i < n; i++) {
        counter k = { 0, 0, 0 };
        uint64_t id;
        double t0 = now_s();
        if (kvg_client_submit(c, &q, &k, &id, err, sizeof err) != 0)
            return -1;
        pump_until(c, &k, 1);
        if (k.error)
            return -1;
        if (i >= 0)
            lat[i] = now_s() - t0;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    const char *shared = getenv("KVGATE_SHARED");
    char dir[] = "/tmp/kvgate-ipc-XXXXXX", sock[300];
    if (n < 10)
        n = 10;
    snprintf(model_path, sizeof model_path, "%s/models/stories260K/stories260K.bin", shared ? shared : "../shared");
    snprintf(tok_path, sizeof tok_path, "%s/models/stories260K/tok512.bin", shared ? shared : "../shared");
    if (!mkdtemp(dir))
        return 1;
    snprintf(sock, sizeof sock, "%s/engine.sock", dir);
    signal(SIGPIPE, SIG_IGN);

    double *via = malloc((size_t)n * sizeof *via), *via0 = malloc((size_t)n * sizeof *via0),
           *direct = malloc((size_t)n * sizeof *direct);
    char sock0[300];
    snprintf(sock0, sizeof sock0, "%s/engine0.sock", dir);
    pid_t eng0 = start_engine(sock0, "0");
    kvg_client *c0 = eng0 > 0 ? kvg_client_new(sock0, NULL, err, sizeof err) : NULL;
    if (!c0 || kvg_client_connect_wait(c0, 10000, err, sizeof err) != 0 || round_trips(c0, via0, n) != 0) {
        fprintf(stderr, "ipc_bench: %s\n", err);
        return 1;
    }
    kvg_client_free(c0);
    kill(eng0, SIGTERM);
    waitpid(eng0, NULL, 0);
    pid_t eng = start_engine(sock, "50");
    if (eng < 0)
        return 1;
    kvg_client *c = kvg_client_new(sock, NULL, err, sizeof err);
    if (!c || kvg_client_connect_wait(c, 10000, err, sizeof err) != 0 || round_trips(c, via, n) != 0) {
        fprintf(stderr, "ipc_bench: %s\n", err);
        return 1;
    }
    direct_latency(direct, n);
    double v50 = pct(via, n, 0.5), v90 = pct(via, n, 0.9), v99 = pct(via, n, 0.99);
    double z50 = pct(via0, n, 0.5), z90 = pct(via0, n, 0.9), z99 = pct(via0, n, 0.99);
    double d50 = pct(direct, n, 0.5), d90 = pct(direct, n, 0.9), d99 = pct(direct, n, 0.99);
    printf("1-token request round trip, stories260K, %d requests (microseconds)\n", n);
    printf("  %-34s %8s %8s %8s\n", "", "p50", "p90", "p99");
    printf("  %-34s %8.1f %8.1f %8.1f\n", "direct scheduler call (in-process)", d50 * 1e6, d90 * 1e6, d99 * 1e6);
    printf("  %-34s %8.1f %8.1f %8.1f\n", "channel, engine sleeps at once", z50 * 1e6, z90 * 1e6, z99 * 1e6);
    printf("  %-34s %8.1f %8.1f %8.1f\n", "channel, engine busy-polls 50 us", v50 * 1e6, v90 * 1e6, v99 * 1e6);
    printf("  added by the channel at the median: %.1f us with the default busy-poll, %.1f us without "
           "(goal < 50 us)\n\n", (v50 - d50) * 1e6, (z50 - d50) * 1e6);

    /* Streaming. */
    printf("streaming throughput through one channel (tokens/s)\n");
    double t1 = trivial_throughput(dir, 1, 2000000), t16 = trivial_throughput(dir, 16, 8000000);
    printf("  trivial producer, 1 token per message:   %12.0f\n", t1);
    printf("  trivial producer, 16 tokens per message: %12.0f\n", t16);
    {
        counter ks[8];
        uint64_t id;
        int32_t prompt[] = { 1, 403, 407, 261, 378 };
        kvg_client_req q;
        memset(&q, 0, sizeof q);
        q.tokens = prompt;
        q.n_tokens = 5;
        q.bypass = 1;
        q.top_p = 1.0f;
        memset(ks, 0, sizeof ks);
        q.n = 16;
        q.max_tokens = 400;
        q.temperature = 1.0f;
        double t0 = now_s();
        for (int i = 0; i < 8; i++) {
            q.seed = (uint64_t)i;
            kvg_client_submit(c, &q, &ks[i], &id, err, sizeof err);
        }
        pump_until(c, ks, 8);
        double dt = now_s() - t0;
        uint64_t tot = 0;
        for (int i = 0; i < 8; i++)
            tot += ks[i].tokens;
        printf("  stories260K engine, 8 x n=16 requests:   %12.0f  (%llu tokens; model-bound)\n",
               (double)tot / dt, (unsigned long long)tot);
    }
    printf("  goal: >= 1M tokens/s through the channel, well above any model's decode rate\n");
    kvg_client_free(c);
    kill(eng, SIGTERM);
    waitpid(eng, NULL, 0);
    rmdir(dir);
    free(via);
    free(via0);
    free(direct);
    return 0;
}
