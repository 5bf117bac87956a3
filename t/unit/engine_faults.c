/* The engine daemon under faults: hostile clients (wrong protocol version, junk on the
 * socket, syntactically valid submissions with bad fields, random bytes written over
 * the shared region, malformed WIPEs) never crash it or disturb other clients; a client killed with
 * SIGKILL mid-stream has its requests cancelled and the block accounting returns to
 * its baseline; cancel and deadlines stop generation within a step; an engine killed
 * mid-stream fails every in-flight request at once and clients reconnect to its
 * successor, even when that one serves another model; SIGTERM drains, then stops; a
 * stale socket is replaced, a live one or a regular file is not. */
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "engine_proc.h"
#include "prefix_hash.h"
#include "client_testing.h"
#include "tokenizer_testing.h"

static char SOCK[300], model_path[1024], tok_path[1024];

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int raw_connect(const char *path)
{
    struct sockaddr_un sa;
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path)
        return -1;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(s);
        return -1;
    }
    return s;
}

/* Waits up to ms for the socket to become readable; then 1 when the peer closed. */
static int peer_closed(int s, int ms)
{
    struct pollfd p = { s, POLLIN, 0 };
    if (poll(&p, 1, ms) <= 0)
        return 0;
    char b[2048];
    ssize_t n = recv(s, b, sizeof b, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno == ECONNRESET);
}

static int recv_welcome_wait(int s, kvg_welcome *w, int fds[KVG_WELCOME_FDS], char *err, size_t len)
{
    struct pollfd p = { s, POLLIN, 0 };
    poll(&p, 1, 5000);
    return kvg_proto_recv_welcome(s, w, fds, err, len);
}

/* A raw client: our own view of a region the engine gave us. */
typedef struct raw {
    int sock, fds[KVG_WELCOME_FDS];
    void *region;
    size_t size;
    kvg_shm shm;
    kvg_welcome w;
} raw;

static int raw_open(raw *r)
{
    char err[256];
    memset(r, 0, sizeof *r);
    r->sock = raw_connect(SOCK);
    if (r->sock < 0 || kvg_proto_send_hello(r->sock, "hostile test", err, sizeof err) != 0 ||
        recv_welcome_wait(r->sock, &r->w, r->fds, err, sizeof err) != 0) {
        diag("raw handshake: %s", err);
        return -1;
    }
    r->size = (size_t)r->w.region_bytes;
    r->region = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fds[0], 0);
    if (r->region == MAP_FAILED || kvg_shm_attach(&r->shm, r->region, r->size, err, sizeof err) != 0) {
        diag("raw attach: %s", err);
        return -1;
    }
    return 0;
}

static void raw_close(raw *r)
{
    if (r->region && r->region != MAP_FAILED)
        munmap(r->region, r->size);
    for (int i = 0; i < KVG_WELCOME_FDS; i++)
        if (r->fds[i] > 0)
            close(r->fds[i]);
    close(r->sock);
}

static void raw_ring(raw *r)
{
    uint64_t one = 1;
    if (write(r->fds[1], &one, sizeof one) < 0) {
    }
}

/* Waits for one completion message; fills status/message for an ERROR. 1 got one. */
static int raw_next(raw *r, kvg_shm_msg *m, void *buf, size_t cap, int ms)
{
    char err[128];
    double until = ep_now() + ms / 1000.0;
    while (ep_now() < until) {
        int rc = kvg_shm_try_pop(&r->shm.cq, m, buf, cap, err, sizeof err);
        if (rc == 0)
            return 1;
        if (rc < 0)
            return -1;
        struct pollfd p = { r->fds[2], POLLIN, 0 };
        poll(&p, 1, 20);
        uint64_t v;
        if (read(r->fds[2], &v, sizeof v) < 0) {
        }
    }
    return 0;
}

/* A well-formed submission, for tests to spoil one field at a time. */
typedef struct good_submit {
    kvg_submit_view v;
    uint32_t tokens[64];
    uint8_t hashes[4][KVG_PREFIX_HASH_LEN];
    unsigned char payload[4096] __attribute__((aligned(8)));
    size_t plen;
} good_submit;

static void make_good(good_submit *g, raw *r, uint64_t id, int n_tokens)
{
    kvg_prefix_hasher *h = kvg_prefix_hasher_new(NULL, 0);
    uint8_t root[KVG_PREFIX_HASH_LEN];
    size_t nb;
    memset(g, 0, sizeof *g);
    for (int i = 0; i < n_tokens; i++)
        g->tokens[i] = (uint32_t)(i == 0 ? 1 : 300 + i);
    kvg_prefix_root(h, r->w.model_id, KVG_PREFIX_HASH_LEN, "t", 1, root, NULL, 0);
    kvg_prefix_chain(h, root, (const int32_t *)g->tokens, (size_t)n_tokens, 16, g->hashes, 4, &nb, NULL, 0);
    kvg_prefix_hasher_free(h);
    g->v.h.version = KVG_PROTO_VERSION;
    g->v.h.request_id = id;
    g->v.h.n = 1;
    g->v.h.max_tokens = 4;
    g->v.h.top_p = 1.0f;
    g->v.h.bucket = 1;
    g->v.h.salt_len = 1;
    g->v.h.n_tokens = (uint32_t)n_tokens;
    g->v.h.n_block_hashes = (uint32_t)nb;
    g->v.salt = (const uint8_t *)"t";
    g->v.tokens = g->tokens;
    g->v.hashes = (const uint8_t (*)[KVG_PREFIX_HASH_LEN])g->hashes;
}

static int push_submit(raw *r, good_submit *g)
{
    char err[128];
    g->plen = kvg_proto_encode_submit(&g->v, g->payload, sizeof g->payload);
    int rc = kvg_shm_try_push(&r->shm.sq, KVG_MSG_SUBMIT, &g->v.h, sizeof g->v.h, g->payload, g->plen, err,
                              sizeof err);
    raw_ring(r);
    return rc;
}

/* Sends a spoiled submission and expects ERROR status for it. */
static void expect_refusal(raw *r, good_submit *g, const char *what, const char *needle)
{
    static unsigned char buf[1 << 20] __attribute__((aligned(8)));
    kvg_shm_msg m;
    push_submit(r, g);
    int got = raw_next(r, &m, buf, sizeof buf, 3000);
    kvg_msg_error e;
    const char *msg = "";
    int okk = got == 1 && m.type == KVG_MSG_ERROR && kvg_proto_decode_error(&m, &e, &msg, NULL, 0) == 0 &&
              e.status == 400 && e.request_id == g->v.h.request_id;
    char text[300];
    snprintf(text, sizeof text, "%.*s", okk ? (int)e.message_len : 0, msg);
    ok(okk && strstr(text, needle), "%s: 400 \"%s\"", what, text);
}

static int engine_alive(const engine_proc *e)
{
    return e->pid > 0 && kill(e->pid, 0) == 0 && waitpid(e->pid, NULL, WNOHANG) == 0;
}

/* A normal client still gets a correct answer. */
static int healthy(void)
{
    kvg_client *c = ep_connect(SOCK);
    ep_result *r = calloc(1, sizeof *r);
    int okk = 0;
    if (c) {
        int32_t ids[] = { 1, 403, 407, 261, 378 };
        kvg_client_req q = ep_req(ids, 5, 10);
        q.bypass = 1;
        okk = ep_run(c, &q, r, 20) == 0 && r->n_tokens[0] == 10 && r->tokens[0][0] == 432;
    }
    kvg_client_free(c);
    free(r);
    return okk;
}

static void test_hostile(engine_proc *e)
{
    char err[256];
    /* Wrong version in the hello. */
    int s = raw_connect(SOCK);
    kvg_hello h;
    memset(&h, 0, sizeof h);
    h.magic = KVG_PROTO_MAGIC;
    h.version = 99;
    send(s, &h, sizeof h, 0);
    kvg_welcome w;
    int fds[KVG_WELCOME_FDS];
    int rc = recv_welcome_wait(s, &w, fds, err, sizeof err);
    ok(rc == -1 && strstr(err, "protocol version 99 is not supported"), "hello with version 99: refused (%s)", err);
    close(s);
    /* Junk instead of a hello. */
    s = raw_connect(SOCK);
    send(s, "GET / HTTP/1.0\r\n\r\n", 18, 0);
    ok(peer_closed(s, 3000), "junk instead of a hello: the engine hangs up");
    close(s);

    /* Well-formed messages with bad fields, one at a time. */
    raw r;
    if (raw_open(&r) != 0) {
        ok(0, "raw client");
        return;
    }
    good_submit g;
    make_good(&g, &r, 7, 40);
    g.tokens[3] = 512;
    expect_refusal(&r, &g, "a token id = vocabulary size", "outside the vocabulary");
    make_good(&g, &r, 8, 40);
    g.hashes[1][5] ^= 1;
    expect_refusal(&r, &g, "a block hash that does not match its tokens", "does not match its tokens");
    make_good(&g, &r, 9, 40);
    g.v.h.n = 0;
    expect_refusal(&r, &g, "n = 0", "n must be");
    make_good(&g, &r, 10, 40);
    g.v.h.n_block_hashes = 1;
    expect_refusal(&r, &g, "too few block hashes", "block hashes for 40 tokens");
    make_good(&g, &r, 11, 40);
    {
        static uint32_t sl[1] = { 3 };
        g.v.h.n_stop = 1;
        g.v.h.stop_bytes = 3;
        g.v.stop_len = sl;
        g.v.stop_bytes = "a\0b";
    }
    expect_refusal(&r, &g, "a stop string with a NUL", "NUL");
    make_good(&g, &r, 12, 40);
    g.v.h.flags = 0x80;
    expect_refusal(&r, &g, "unknown flags", "unknown flags");
    make_good(&g, &r, 13, 40);
    g.v.h.temperature = -1.0f;
    expect_refusal(&r, &g, "negative temperature", "temperature");
    {
        /* The payload length disagrees with the counts. */
        make_good(&g, &r, 14, 40);
        g.plen = kvg_proto_encode_submit(&g.v, g.payload, sizeof g.payload);
        kvg_shm_try_push(&r.shm.sq, KVG_MSG_SUBMIT, &g.v.h, sizeof g.v.h, g.payload, g.plen - 8, err, sizeof err);
        raw_ring(&r);
        static unsigned char buf[1 << 16] __attribute__((aligned(8)));
        kvg_shm_msg m;
        kvg_msg_error me;
        const char *msg = "";
        int okk = raw_next(&r, &m, buf, sizeof buf, 3000) == 1 && kvg_proto_decode_error(&m, &me, &msg, NULL, 0) == 0 &&
                  me.request_id == 14;
        ok(okk, "a payload shorter than its counts: refused");
    }
    make_good(&g, &r, 16, 40);
    g.v.h.bucket = 0;
    expect_refusal(&r, &g, "bypass (bucket 0) with block hashes", "carries no block hashes");
    make_good(&g, &r, 17, 40);
    g.v.h.flags = KVG_SUBMIT_OLD_BYPASS;
    expect_refusal(&r, &g, "the old bypass flag with a cached bucket", "bypass is bucket 0");
    {
        /* Bypass as earlier clients sent it (the old flag, bucket 0, no hashes) and as
         * clients send it now (bucket 0 alone): both complete. */
        static unsigned char buf[1 << 16] __attribute__((aligned(8)));
        for (int old = 0; old < 2; old++) {
            make_good(&g, &r, 18 + (uint64_t)old, 40);
            g.v.h.flags = old ? KVG_SUBMIT_OLD_BYPASS : 0;
            g.v.h.bucket = 0;
            g.v.h.n_block_hashes = 0;
            push_submit(&r, &g);
            kvg_shm_msg m;
            int done = 0, error = 0;
            while (!done && !error && raw_next(&r, &m, buf, sizeof buf, 3000) == 1) {
                done = m.type == KVG_MSG_DONE;
                error = m.type == KVG_MSG_ERROR;
            }
            ok(done, "bypass as bucket 0 %s the old flag: completes", old ? "with" : "without");
        }
    }
    /* A good one on the same connection works after all that. */
    make_good(&g, &r, 15, 40);
    push_submit(&r, &g);
    {
        static unsigned char buf[1 << 16] __attribute__((aligned(8)));
        kvg_shm_msg m;
        int done = 0, seen = 0;
        while (!done && raw_next(&r, &m, buf, sizeof buf, 3000) == 1) {
            seen++;
            done = m.type == KVG_MSG_DONE;
        }
        ok(done, "a valid request on the same connection then completes (%d messages)", seen);
    }
    /* WIPE: malformed ones are refused with ERROR 400 under their id, the connection
     * stays; a good one is answered with WIPED under its id. */
    {
        static unsigned char buf[1 << 16] __attribute__((aligned(8))), salt[300];
        static const struct { kvg_msg_wipe h; uint32_t plen; const char *what, *needle; } bad[] = {
            { { KVG_PROTO_VERSION, 1, 31, 4, 0 }, 4, "WIPE with a flag set", "must be 0" },
            { { KVG_PROTO_VERSION, 0, 32, 4, 0 }, 8, "WIPE whose payload is not its salt", "payload of 8 bytes" },
            { { KVG_PROTO_VERSION, 0, 33, 300, 0 }, 300, "WIPE of a 300-byte salt", "at most 256" },
        };
        memset(salt, 'w', sizeof salt);
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            kvg_shm_try_push(&r.shm.sq, KVG_MSG_WIPE, &bad[i].h, sizeof bad[i].h, salt, bad[i].plen, err, sizeof err);
            raw_ring(&r);
            kvg_shm_msg m;
            kvg_msg_error me;
            const char *msg = "";
            int okk = raw_next(&r, &m, buf, sizeof buf, 3000) == 1 &&
                      kvg_proto_decode_error(&m, &me, &msg, NULL, 0) == 0 && me.status == 400 &&
                      me.request_id == bad[i].h.request_id;
            char text[300];
            snprintf(text, sizeof text, "%.*s", okk ? (int)me.message_len : 0, msg);
            ok(okk && strstr(text, bad[i].needle), "%s: 400 \"%s\"", bad[i].what, text);
        }
        kvg_msg_wipe wh = { KVG_PROTO_VERSION, 0, 34, 4, 0 };
        kvg_shm_try_push(&r.shm.sq, KVG_MSG_WIPE, &wh, sizeof wh, "acme", 4, err, sizeof err);
        raw_ring(&r);
        kvg_shm_msg m;
        kvg_msg_wiped wd;
        ok(raw_next(&r, &m, buf, sizeof buf, 3000) == 1 && kvg_proto_decode_wiped(&m, &wd, err, sizeof err) == 0 &&
           wd.request_id == 34, "a good WIPE on the same connection: WIPED under its id");
    }
    /* Random bodies of every type (version right, everything else random). */
    for (int i = 0; i < 300; i++) {
        unsigned char body[KVG_SHM_BODY_MAX], payload[512] __attribute__((aligned(8)));
        for (size_t k = 0; k < sizeof body; k++)
            body[k] = (unsigned char)rnd();
        for (size_t k = 0; k < sizeof payload; k++)
            payload[k] = (unsigned char)rnd();
        uint32_t v = KVG_PROTO_VERSION;
        memcpy(body, &v, 4);
        uint32_t type = (uint32_t)(rnd() % 9);
        size_t bl = type == KVG_MSG_SUBMIT ? sizeof(kvg_msg_submit) : rnd() % sizeof body;
        if (kvg_shm_try_push(&r.shm.sq, type, body, bl, payload, rnd() % sizeof payload, err, sizeof err) != 0)
            break;
        raw_ring(&r);
        /* Drain what comes back. */
        static unsigned char buf[1 << 16] __attribute__((aligned(8)));
        kvg_shm_msg m;
        while (kvg_shm_try_pop(&r.shm.cq, &m, buf, sizeof buf, err, sizeof err) == 0) {
        }
        if (peer_closed(r.sock, 0))
            break;
    }
    ok(engine_alive(e), "300 random messages: the engine is alive");
    ok(healthy(), "  and serves another client correctly");
    raw_close(&r);

    /* Random bytes over the control words, the slots, everything. */
    int closed = 0;
    for (int round = 0; round < 40; round++) {
        if (raw_open(&r) != 0)
            break;
        unsigned char *p = r.region;
        size_t n = 1 + rnd() % 512;
        for (size_t k = 0; k < n; k++)
            p[rnd() % r.size] = (unsigned char)rnd();
        if (round % 4 == 0)
            for (size_t k = 0; k < 4096 && k < r.size; k++)
                p[k] = (unsigned char)rnd();
        raw_ring(&r);
        ep_sleep_ms(2);
        closed += peer_closed(r.sock, 20);
        raw_close(&r);
    }
    ok(engine_alive(e), "40 regions overwritten with random bytes: the engine is alive (%d hung up at once)", closed);
    ok(healthy(), "  and serves another client correctly");
}

/* A child that starts a long request, reports its first tokens, then waits to die. */
static pid_t long_request_child(int *ready_fd)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        kvg_client *c = ep_connect(SOCK);
        ep_result *r = calloc(1, sizeof *r);
        int32_t ids[] = { 1, 403, 407, 261, 378 };
        kvg_client_req q = ep_req(ids, 5, 500);
        q.n = 16;
        q.temperature = 1.0f;
        q.seed = 3;
        uint64_t id;
        char err[256];
        if (!c || kvg_client_submit(c, &q, r, &id, err, sizeof err) != 0)
            _exit(1);
        ep_wait_first(c, r);
        if (write(p[1], "x", 1) < 0) {
        }
        for (;;)
            pause();
    }
    close(p[1]);
    *ready_fd = p[0];
    return pid;
}

static void test_client_death_and_cancel(void)
{
    kvg_client *c = ep_connect(SOCK);
    kvg_stats base, st;
    if (!c) {
        ok(0, "connect");
        return;
    }
    ep_wait_idle(c, 10, &base);
    int fd = -1;
    pid_t child = long_request_child(&fd);
    char b;
    struct pollfd p = { fd, POLLIN, 0 };
    ok(poll(&p, 1, 20000) == 1 && read(fd, &b, 1) == 1, "a child client streams a 16 x 500-token request");
    kill(child, SIGKILL);
    double t0 = ep_now();
    waitpid(child, NULL, 0);
    close(fd);
    int idle = 0;
    for (double until = ep_now() + EP_WAIT_S; ep_now() < until && !idle; ep_sleep_ms(5))
        idle = ep_stats(c, &st) == 0 && st.cancelled == base.cancelled + 1 && st.running == 0 && st.waiting == 0;
    ok(idle && st.blocks_used == base.blocks_used && st.blocks_free + st.blocks_cached == base.blocks_free + base.blocks_cached,
       "SIGKILL of the client: blocks back to the baseline (%d used, %d free + %d cached) after %.0f ms",
       st.blocks_used, st.blocks_free, st.blocks_cached, (ep_now() - t0) * 1000);
    ok(st.cancelled == base.cancelled + 1 && st.decode_tokens - base.decode_tokens < 16 * 500 - 16,
       "  the request was cancelled, not run to the end (%llu of %d tokens decoded)",
       (unsigned long long)(st.decode_tokens - base.decode_tokens), 16 * 500);

    /* Cancel from a live client. */
    ep_result *r = calloc(1, sizeof *r);
    int32_t ids[] = { 1, 403, 407, 261, 378 };
    kvg_client_req q = ep_req(ids, 5, 500);
    q.n = 16;
    q.temperature = 1.0f;
    uint64_t id;
    char err[256];
    kvg_stats b2;
    ep_stats(c, &b2);
    kvg_client_submit(c, &q, r, &id, err, sizeof err);
    ep_wait_first(c, r);
    ok(kvg_client_cancel(c, id) == 0 && kvg_client_live(c) == 0, "cancel: the client forgets the request at once");
    t0 = ep_now();
    idle = 0;
    for (double until = ep_now() + EP_WAIT_S; ep_now() < until && !idle; ep_sleep_ms(2))
        idle = ep_stats(c, &st) == 0 && st.cancelled == b2.cancelled + 1 && st.running == 0 && st.waiting == 0;
    ok(idle && st.blocks_used == base.blocks_used && st.cancelled == b2.cancelled + 1 &&
       st.client_cancels == b2.client_cancels + 1,
       "  the engine stops it and releases its blocks (%.0f ms)", (ep_now() - t0) * 1000);
    uint32_t before = r->n_tokens[0];
    ep_sleep_ms(50);
    kvg_client_event ev;
    while (kvg_client_next_event(c, &ev) == 1)
        ep_record(&ev);
    ok(r->n_tokens[0] == before && !r->done, "  and no event for it arrives after the cancel");
    ok(kvg_client_cancel(c, id) == -1, "  a second cancel of the same id: -1");

    /* A deadline. */
    q.deadline_ms = 20;
    q.n = 8;
    memset(r, 0, sizeof *r);
    ep_run(c, &q, r, 20);
    int ended = r->done, n_deadline = 0;
    for (int j = 0; j < 8; j++) {
        ended &= r->finish[j] == KVG_MSG_FINISH_DEADLINE || r->finish[j] == KVG_MSG_FINISH_STOP;
        n_deadline += r->finish[j] == KVG_MSG_FINISH_DEADLINE;
    }
    ok(ended && n_deadline >= 1 && r->completion_tokens < 8 * 500,
       "a 20 ms deadline: %d of 8 samples end 'deadline', the others 'stop' (%u tokens)", n_deadline,
       r->completion_tokens);
    free(r);
    kvg_client_free(c);
}

/* Whether the process is stopped (state T in /proc/PID/stat). */
static int is_stopped(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] == 'T';
}

static int cancels_seen(const kvg_stats *s, const void *arg)
{
    const kvg_stats *base = arg;
    return s->client_cancels >= base->client_cancels + 3 && s->running == 0 && s->waiting == 0;
}

/* A silent engine (SIGSTOP): its heartbeat moves while it is idle and stands still while
 * it is stopped; kvg_client_fail_live fails the live requests at once and keeps the
 * connection; once the engine goes on it gets their CANCELs, and nothing it made for
 * them reaches the client. */
static void test_stall(engine_proc *e)
{
    kvg_client *c = ep_connect(SOCK);
    kvg_client_event ev;
    kvg_stats base, st;
    char err[256];
    if (!c) {
        ok(0, "connect");
        return;
    }
    ep_wait_idle(c, 10, &base);
    uint64_t h0 = kvg_client_heartbeat(c), h = h0;
    double t0 = ep_now();
    for (double until = t0 + EP_WAIT_S; ep_now() < until && h < h0 + 3; ep_sleep_ms(10))
        h = kvg_client_heartbeat(c);
    ok(h0 > 0 && h >= h0 + 3, "an idle engine's heartbeat moves by itself (%llu -> %llu in %.0f ms)",
       (unsigned long long)h0, (unsigned long long)h, (ep_now() - t0) * 1000);

    kill(e->pid, SIGSTOP);
    for (double until = ep_now() + EP_WAIT_S; ep_now() < until && !is_stopped(e->pid); ep_sleep_ms(2)) {
    }
    h0 = kvg_client_heartbeat(c);
    ep_sleep_ms(3 * KVG_HEARTBEAT_IDLE_MS);
    ok(is_stopped(e->pid) && kvg_client_heartbeat(c) == h0,
       "stopped (SIGSTOP): the heartbeat stands still over 3 idle periods");

    /* three requests the stopped engine cannot take yet */
    int32_t ids[] = { 1, 403, 407, 261, 378 };
    ep_result *r = calloc(3, sizeof *r);
    uint64_t id[3];
    for (int k = 0; k < 3; k++) {
        kvg_client_req q = ep_req(ids, 5, 400);
        q.n = 4;
        q.temperature = 1.0f;
        q.seed = (uint64_t)k;
        if (kvg_client_submit(c, &q, &r[k], &id[k], err, sizeof err) != 0)
            diag("submit: %s", err);
    }
    ok(kvg_client_live(c) == 3, "3 requests live in the stopped engine's ring");
    ok(kvg_client_fail_live(c, 503, "the engine stalled") == 3 && kvg_client_live(c) == 0,
       "fail_live: all 3 failed, none live any more");
    ok(kvg_client_cancel(c, id[1]) == 0, "  a cancel before its ERROR was handed out takes the ERROR back");
    while (kvg_client_next_event(c, &ev) == 1)
        ep_record(&ev);
    ok(r[0].error && r[0].status == 503 && strcmp(r[0].message, "the engine stalled") == 0 && !r[1].error &&
       r[2].error && r[2].status == 503,
       "  the other two get ERROR 503 with the message given (%s), before anything else", r[0].message);
    ok(kvg_client_cancel(c, id[0]) == -1 && kvg_client_pause(c, id[2], 1) == -1,
       "  and are no longer live (cancel, hold: -1)");
    ok(kvg_client_get_state(c) == KVG_CLIENT_UP, "  the connection stays up");

    kill(e->pid, SIGCONT);
    t0 = ep_now();
    int seen = ep_wait_stats(c, EP_WAIT_S, &st, cancels_seen, &base) == 0;
    ok(seen, "continued: the engine takes the 3 submissions and their CANCELs (%llu cancels, %d running) in %.0f ms",
       (unsigned long long)(st.client_cancels - base.client_cancels), st.running, (ep_now() - t0) * 1000);
    ep_sleep_ms(50);
    while (kvg_client_next_event(c, &ev) == 1)
        ep_record(&ev);
    int quiet = 1;
    for (int k = 0; k < 3; k++)
        quiet &= !r[k].done && !r[k].accepted && r[k].n_tokens[0] == 0;
    ok(quiet, "  nothing it made for them reaches the client");
    ok(kvg_client_heartbeat(c) != h0, "  its heartbeat moves again");
    ep_result *r2 = calloc(1, sizeof *r2);
    kvg_client_req q = ep_req(ids, 5, 10);
    q.bypass = 1;
    ok(ep_run(c, &q, r2, 20) == 0 && r2->n_tokens[0] == 10, "  and a new request on the same connection completes");
    free(r2);
    free(r);
    kvg_client_free(c);
}

static void test_engine_death(engine_proc *e)
{
    kvg_client *cs[3];
    ep_result *rs[3];
    int32_t ids[] = { 1, 403, 407, 261, 378 };
    char err[256];
    uint64_t id;
    uint8_t old_id[KVG_PREFIX_HASH_LEN];
    for (int k = 0; k < 3; k++) {
        cs[k] = ep_connect(SOCK);
        rs[k] = calloc(1, sizeof *rs[k]);
        kvg_client_req q = ep_req(ids, 5, 500);
        q.n = 16;
        q.temperature = 1.0f;
        kvg_client_submit(cs[k], &q, rs[k], &id, err, sizeof err);
    }
    memcpy(old_id, kvg_client_info(cs[0])->model_id, sizeof old_id);
    ep_wait_first(cs[0], rs[0]);
    kill(e->pid, SIGKILL);
    double t0 = ep_now();
    ep_stop(e, 0, 10);
    ep_pump(cs, 3, rs, 3, 5);
    int all = 1;
    double worst = 0;
    for (int k = 0; k < 3; k++) {
        all &= rs[k]->error && rs[k]->status == 503 && strstr(rs[k]->message, "connection lost") != NULL;
        if (rs[k]->t_end - t0 > worst)
            worst = rs[k]->t_end - t0;
    }
    ok(all && worst < 1.0, "SIGKILL of the engine: 3 clients fail their streams with 503 within %.0f ms (%s)",
       worst * 1000, rs[0]->message);
    ok(kvg_client_get_state(cs[0]) == KVG_CLIENT_DOWN, "  and are down");

    /* A successor with another model on the same (now stale) socket. */
    const char *a[] = { "--model", "synthetic:260K", "--socket", SOCK, "--threads", "1", "--kv-memory", "32M", NULL };
    ok(ep_start(e, a) == 0, "a new engine (synthetic:260K) starts on the stale socket");
    char *log = ep_stderr(e);
    ok(strstr(log, "replaced the stale socket") != NULL, "  saying it replaced the stale socket");
    free(log);
    int up = 0;
    double until = ep_now() + 10;
    while (ep_now() < until && up < 3) {
        up = 0;
        for (int k = 0; k < 3; k++) {
            kvg_client_event ev;
            if (kvg_client_get_state(cs[k]) == KVG_CLIENT_DOWN && kvg_client_retry_delay_ms(cs[k]) == 0)
                kvg_client_connect(cs[k], err, sizeof err);
            while (kvg_client_next_event(cs[k], &ev) == 1) {
            }
            up += kvg_client_get_state(cs[k]) == KVG_CLIENT_UP;
        }
        ep_sleep_ms(10);
    }
    ok(up == 3, "  all 3 clients reconnect on their own backoff");
    const kvg_engine_info *in = kvg_client_info(cs[1]);
    ok(in && memcmp(in->model_id, old_id, sizeof old_id) != 0 && strcmp(in->model_name, "synthetic:260K") == 0 &&
       strcmp(kvg_tokenizer_kind(in->tokenizer), "llama2c") == 0,
       "  and picked up the new model's identity and tokenizer (%s)", in ? in->model_name : "?");
    if (in) {
        size_t n;
        int32_t *t = ep_tokens(cs[1], "hello there", &n);
        kvg_client_req q = ep_req(t, n, 12);
        q.bypass = 1;
        ok(ep_run(cs[1], &q, rs[1], 20) == 0 && rs[1]->n_tokens[0] >= 1, "  a request to the new engine completes");
        free(t);
    }
    for (int k = 0; k < 3; k++) {
        kvg_client_free(cs[k]);
        free(rs[k]);
    }
}

static void test_stop_and_sockets(engine_proc *e)
{
    /* SIGTERM with a request in flight: it finishes, then the engine exits 0. */
    kvg_client *c = ep_connect(SOCK);
    ep_result *r = calloc(1, sizeof *r);
    size_t n;
    int32_t *ids = ep_tokens(c, "Once upon a time", &n);
    kvg_client_req q = ep_req(ids, n, 200);
    q.n = 4;
    q.bypass = 1;
    uint64_t id;
    char err[256];
    kvg_client_submit(c, &q, r, &id, err, sizeof err);
    ep_wait_first(c, r);
    kill(e->pid, SIGTERM);
    ep_pump(&c, 1, &r, 1, 20);
    int st = ep_stop(e, 0, 20);
    ok(r->done && r->completion_tokens > 0, "SIGTERM mid-stream: the request still completes (%u tokens)",
       r->completion_tokens);
    is_int(st, 0, "  then the engine exits 0");
    ok(access(SOCK, F_OK) != 0, "  and its socket is gone");
    kvg_client_free(c);
    free(ids);

    /* --drain-timeout 0: in-flight work is cancelled with an error at once. */
    const char *a[] = { "--model", model_path, "--tokenizer", tok_path, "--socket", SOCK, "--threads", "1",
                        "--drain-timeout", "0", NULL };
    if (ep_start(e, a) == 0) {
        c = ep_connect(SOCK);
        int32_t ids2[] = { 1, 403, 407, 261, 378 };
        q = ep_req(ids2, 5, 500);
        q.n = 16;
        q.bypass = 1;
        memset(r, 0, sizeof *r);
        kvg_client_submit(c, &q, r, &id, err, sizeof err);
        ep_wait_first(c, r);
        kill(e->pid, SIGTERM);
        ep_pump(&c, 1, &r, 1, 10);
        ok(r->error && r->status == 503 && strstr(r->message, "shut down"), "--drain-timeout 0: 503 (%s)", r->message);
        is_int(ep_stop(e, 0, 20), 0, "  and exit 0");
        kvg_client_free(c);
    }

    /* A live engine's socket is refused; a regular file is refused. */
    const char *a2[] = { "--model", model_path, "--tokenizer", tok_path, "--socket", SOCK, "--threads", "1", NULL };
    engine_proc other;
    if (ep_start(e, a2) == 0) {
        ep_quiet_start = 1;
        ok(ep_start(&other, a2) != 0, "a second engine on a live engine's socket does not start");
        ep_quiet_start = 0;
        char *log = ep_stderr(&other);
        ok(strstr(log, "another engine") != NULL, "  and says why");
        free(log);
        ok(healthy(), "  the first one keeps serving");
        ep_stop(e, SIGTERM, 20);
    }
    FILE *f = fopen(SOCK, "w");
    if (f)
        fclose(f);
    ep_quiet_start = 1;
    ok(ep_start(&other, a2) != 0, "a regular file at the socket path is not replaced");
    ep_quiet_start = 0;
    char *log = ep_stderr(&other);
    ok(strstr(log, "exists and is not a socket") != NULL, "  and the engine says so");
    free(log);
    unlink(SOCK);
    free(r);
}

int main(void)
{
    engine_proc e;
    snprintf(model_path, sizeof model_path, "%s/models/stories260K/stories260K.bin", shared_dir());
    snprintf(tok_path, sizeof tok_path, "%s/models/stories260K/tok512.bin", shared_dir());
    snprintf(SOCK, sizeof SOCK, "%s/faults.sock", ep_tmpdir());
    signal(SIGPIPE, SIG_IGN);
    const char *a[] = { "--model", model_path, "--tokenizer", tok_path, "--socket", SOCK, "--threads", "1",
                        "--kv-memory", "64M", NULL };
    if (ep_start(&e, a) != 0) {
        ok(0, "engine starts");
        return done_testing();
    }
    test_hostile(&e);
    test_client_death_and_cancel();
    test_stall(&e);
    test_engine_death(&e);
    ep_stop(&e, SIGTERM, 20);
    if (ep_start(&e, a) == 0)
        test_stop_and_sockets(&e);
    else
        ok(0, "engine restarts");
    return done_testing();
}
