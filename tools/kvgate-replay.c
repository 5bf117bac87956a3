/* kvgate-replay: replays a synthetic multi-tenant chat workload against any
 * OpenAI-compatible chat endpoint and reports what a cache-aware gateway is for:
 * the prompt-cache hit rate (tokens), time to first token, requests/s.
 *
 * The workload (all of it from --seed, so two runs send the same conversations):
 *   - --tenants T tenants, popularity Zipf(--zipf s): tenant k (0-based) is chosen
 *     with probability proportional to 1/(k+1)^s. Tenant k sends X-Tenant-Id:
 *     "tenant-k" (--tenant-header; "" sends none).
 *   - every tenant has one system prompt of --system-tokens LO..HI tokens' worth of
 *     text (words from a fixed list of common English words; 3 words per 4 tokens,
 *     the usual ratio of a large-vocabulary tokenizer; a small one, like
 *     stories260K's, makes more tokens of the same text);
 *   - --concurrency N clients, each running chats one after another: a chat picks a
 *     tenant, then sends --turns turns; turn 1 is [system, user], every later turn
 *     appends the previous answer (assistant) and a new user line of --user-tokens
 *     LO..HI, so the history grows and each turn's prompt extends the last one's.
 *     A chat also ends when its prompt would pass --context tokens (when given).
 *   - greedy (temperature 0), --max-tokens per answer, streamed with
 *     stream_options.include_usage (--no-stream: plain JSON answers, no TTFT).
 * Client c's sequence of chats depends only on (seed, c); which client sends how
 * many of --requests depends on timing.
 *
 * Figures: requests sent; answered 200 and errors by status (0 = transport);
 * prompt and cached tokens (usage.prompt_tokens and
 * usage.prompt_tokens_details.cached_tokens of the 200s) and their ratio, the hit
 * rate; TTFT (request written -> first content delta) p50/p99; latency p50/p99;
 * requests/s (200s per second of the run). --json prints them as one JSON object.
 * --warmup W sends W requests first (the same workload, going on) and leaves them out
 * of every figure: the caches start warm, so the figures are the steady state rather
 * than the cold start every configuration pays alike.
 *
 * Closed loop by default: each client sends its next turn as soon as the last one is
 * answered, so a faster server is also sent more (compare requests/s). --rate R makes
 * it open loop, as serving benchmarks compare latency: requests go out at the times of
 * a Poisson process of R per second (from the seed), whichever client is free taking
 * the next one; so every server under test gets the same offered load and TTFT
 * compares like with like. A request that finds every client busy goes out late; the
 * figures count those sent over 50 ms after their time ("late": the server, or the
 * client count, did not keep up with the rate), and "early" those sent before it (a
 * check of the replayer itself: always 0).
 *
 *   kvgate-replay --url http://127.0.0.1:8080 [--requests N | --duration S] ...
 */
#include "monoclock.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cliargs.h"

static const char *const prog = "kvgate-replay";

/* ---- options ---------------------------------------------------------------------- */

typedef struct opts {
    char host[256], port[16], path[512];
    const char *model, *tenant_header;
    long tenants, sys_lo, sys_hi, user_lo, user_hi, turns, max_tokens, concurrency, requests, context, warmup;
    double zipf, duration, timeout, rate;
    uint64_t seed;
    int stream, json;
} opts;

static opts O = {
    .tenant_header = "X-Tenant-Id", .tenants = 100, .sys_lo = 300, .sys_hi = 1000, .user_lo = 10,
    .user_hi = 40, .turns = 4, .max_tokens = 32, .concurrency = 8, .requests = 0, .context = 0,
    .zipf = 1.1, .duration = 0, .timeout = 60, .seed = 1, .stream = 1,
};

/* ---- deterministic randomness ------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static long uniform(uint64_t *s, long lo, long hi)
{
    return lo + (long)(splitmix(s) % (uint64_t)(hi - lo + 1));
}

static double unit(uint64_t *s)
{
    return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* Common words (short, frequent in the stories the tiny test models learned), so
 * every tokenizer splits them the same way each time. */
static const char *const words[] = {
    "the", "a", "little", "girl", "boy", "dog", "cat", "bird", "tree", "house", "garden", "sun", "moon",
    "happy", "sad", "big", "small", "red", "blue", "green", "park", "ball", "toy", "friend", "mom", "dad",
    "play", "run", "jump", "look", "see", "find", "went", "saw", "said", "was", "had", "very", "and",
    "then", "they", "she", "he", "it", "with", "to", "in", "on", "of", "day", "one", "time", "once",
    "upon", "there", "lived", "named", "lily", "tom", "ben", "sue", "max", "anna", "water", "sky",
    "flower", "cake", "book", "box", "car", "fish", "duck", "frog", "bear", "fox", "rabbit", "hill",
    "river", "rock", "star", "rain", "snow", "wind", "door", "window", "bed", "chair", "table", "cup",
    "hat", "shoe", "coat", "kind", "brave", "funny", "quiet", "loud", "fast", "slow", "warm", "cold",
    "soft", "hard", "new", "old", "good", "bad", "nice", "shiny", "bright", "dark", "long", "short",
    "help", "share", "smile", "laugh", "cry", "sing", "dance", "read", "walk", "swim", "climb", "sleep",
    "eat", "drink", "give", "take", "make", "build", "open", "close", "love", "like", "want", "need",
    "always", "never", "every", "some", "many", "all", "together", "again", "today", "night", "morning",
};
#define N_WORDS (sizeof words / sizeof words[0])

/* n words of text from s, into a malloc'd string; ends with '.'. */
static char *text(uint64_t *s, long n)
{
    size_t cap = (size_t)n * 10 + 16, len = 0;
    char *t = malloc(cap);
    if (!t)
        return NULL;
    for (long i = 0; i < n; i++) {
        const char *w = words[splitmix(s) % N_WORDS];
        size_t wl = strlen(w);
        if (len + wl + 3 > cap)
            break;
        if (i)
            t[len++] = (i % 12 == 0) ? '.' : ' ';
        if (i && i % 12 == 0)
            t[len++] = ' ';
        memcpy(t + len, w, wl);
        len += wl;
    }
    t[len++] = '.';
    t[len] = 0;
    return t;
}

static long words_for(long tokens)
{
    long w = tokens * 3 / 4;
    return w > 0 ? w : 1;
}

/* ---- the tenants ---------------------------------------------------------------------- */

static char **system_prompt;   /* per tenant */
static double *zipf_cdf;

static int make_tenants(void)
{
    system_prompt = calloc((size_t)O.tenants, sizeof *system_prompt);
    zipf_cdf = calloc((size_t)O.tenants, sizeof *zipf_cdf);
    if (!system_prompt || !zipf_cdf)
        return -1;
    double sum = 0;
    for (long k = 0; k < O.tenants; k++) {
        uint64_t s = O.seed * 0x100000001b3ull ^ (uint64_t)k * 0x2545f4914f6cdd1dull;
        long n = uniform(&s, O.sys_lo, O.sys_hi);
        char head[96];
        snprintf(head, sizeof head, "You are the story helper of tenant %ld. ", k);
        char *body = text(&s, words_for(n));
        if (!body)
            return -1;
        system_prompt[k] = malloc(strlen(head) + strlen(body) + 1);
        if (!system_prompt[k])
            return -1;
        strcpy(system_prompt[k], head);
        strcat(system_prompt[k], body);
        free(body);
        sum += pow((double)(k + 1), -O.zipf);
        zipf_cdf[k] = sum;
    }
    for (long k = 0; k < O.tenants; k++)
        zipf_cdf[k] /= sum;
    return 0;
}

static long pick_tenant(uint64_t *s)
{
    double u = unit(s);
    long lo = 0, hi = O.tenants - 1;
    while (lo < hi) {
        long mid = (lo + hi) / 2;
        if (zipf_cdf[mid] >= u)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* ---- HTTP/1.1 ------------------------------------------------------------------------ */

typedef struct conn {
    int fd;
    char buf[1 << 16];
    size_t have, off;
} conn;

static int conn_open(conn *c)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
    if (getaddrinfo(O.host, O.port, &hints, &res) != 0 || !res)
        return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = { .tv_sec = (time_t)O.timeout, .tv_usec = (suseconds_t)(fmod(O.timeout, 1) * 1e6) };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    c->fd = fd;
    c->have = c->off = 0;
    return 0;
}

static void conn_close(conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->have = c->off = 0;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* More bytes into the buffer (compacting it first). 0, or -1 on EOF/error. */
static int conn_fill(conn *c)
{
    if (c->off) {
        memmove(c->buf, c->buf + c->off, c->have - c->off);
        c->have -= c->off;
        c->off = 0;
    }
    if (c->have == sizeof c->buf)
        return -1;
    for (;;) {
        ssize_t r = recv(c->fd, c->buf + c->have, sizeof c->buf - c->have, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        c->have += (size_t)r;
        return 0;
    }
}

/* A line ending in CRLF from the buffer (NUL-terminated in place, without the CRLF). */
static char *conn_line(conn *c)
{
    for (;;) {
        char *p = c->buf + c->off, *e = memmem(p, c->have - c->off, "\r\n", 2);
        if (e) {
            *e = 0;
            c->off = (size_t)(e - c->buf) + 2;
            return p;
        }
        if (conn_fill(c) < 0)
            return NULL;
    }
}

/* Body bytes go to a sink: the SSE parser or a whole-body buffer. */
typedef struct sink {
    int (*put)(struct sink *, const char *, size_t);
} sink;

static int body_put(sink *k, const char *p, size_t n);

/* Reads one response; the status (0 on a transport error). *keep: the connection
 * may be reused. An answer other than 200 goes whole into the sink's body (an error
 * object, not an event stream). */
static int read_response(conn *c, sink *k, int *keep)
{
    *keep = 0;
    char *l = conn_line(c);
    if (!l || strncmp(l, "HTTP/1.", 7) != 0 || strlen(l) < 12)
        return 0;
    int status = atoi(l + 9), chunked = 0;
    long long clen = -1;
    *keep = l[7] == '1';
    while ((l = conn_line(c)) && *l) {
        if (!strncasecmp(l, "content-length:", 15))
            clen = atoll(l + 15);
        else if (!strncasecmp(l, "transfer-encoding:", 18) && strcasestr(l + 18, "chunked"))
            chunked = 1;
        else if (!strncasecmp(l, "connection:", 11) && strcasestr(l + 11, "close"))
            *keep = 0;
        else if (!strncasecmp(l, "connection:", 11) && strcasestr(l + 11, "keep-alive"))
            *keep = 1;
    }
    if (!l)
        return 0;
    if (status != 200)
        k->put = body_put;
    if (chunked) {
        for (;;) {
            if (!(l = conn_line(c)))
                return 0;
            unsigned long long n = strtoull(l, NULL, 16);
            if (n == 0) {
                while ((l = conn_line(c)) && *l)   /* trailers */
                    ;
                return l ? status : 0;
            }
            while (n) {
                if (c->off == c->have && conn_fill(c) < 0)
                    return 0;
                size_t take = c->have - c->off;
                if (take > n)
                    take = (size_t)n;
                if (k->put(k, c->buf + c->off, take) < 0)
                    return 0;
                c->off += take;
                n -= take;
            }
            if (!(l = conn_line(c)) || *l)
                return 0;
        }
    }
    if (clen < 0) {   /* until EOF */
        *keep = 0;
        for (;;) {
            if (c->off < c->have) {
                if (k->put(k, c->buf + c->off, c->have - c->off) < 0)
                    return 0;
                c->off = c->have;
            }
            if (conn_fill(c) < 0)
                return status;
        }
    }
    while (clen > 0) {
        if (c->off == c->have && conn_fill(c) < 0)
            return 0;
        size_t take = c->have - c->off;
        if ((long long)take > clen)
            take = (size_t)clen;
        if (k->put(k, c->buf + c->off, take) < 0)
            return 0;
        c->off += take;
        clen -= (long long)take;
    }
    return status;
}

/* ---- one request's answer ------------------------------------------------------------ */

typedef struct answer {
    sink k;
    char *body;          /* the whole body (non-streaming) or the pending SSE line */
    size_t len, cap;
    char *content;       /* the assistant's text */
    size_t clen, ccap;
    long prompt_tokens, cached_tokens, completion_tokens;
    int have_usage, done;
    double t0, ttft;     /* ttft < 0: no content yet */
} answer;

static int grow(char **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 256;
    while (n < need)
        n *= 2;
    char *q = realloc(*p, n);
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

static void take_usage(answer *a, json_t *u)
{
    if (!json_is_object(u))
        return;
    a->have_usage = 1;
    a->prompt_tokens = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
    a->completion_tokens = (long)json_integer_value(json_object_get(u, "completion_tokens"));
    a->cached_tokens = (long)json_integer_value(
        json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
}

static int add_content(answer *a, const char *s, size_t n)
{
    if (grow(&a->content, &a->ccap, a->clen + n + 1) < 0)
        return -1;
    memcpy(a->content + a->clen, s, n);
    a->clen += n;
    a->content[a->clen] = 0;
    return 0;
}

/* One SSE line: "data: {...}" carries a chunk; other lines (event:, comments,
 * blank separators) carry nothing this client needs. */
static int sse_line(answer *a, const char *l, size_t n)
{
    if (n < 5 || memcmp(l, "data:", 5) != 0)
        return 0;
    l += 5;
    n -= 5;
    while (n && *l == ' ')
        l++, n--;
    if (n == 6 && !memcmp(l, "[DONE]", 6)) {
        a->done = 1;
        return 0;
    }
    json_t *j = json_loadb(l, n, 0, NULL);
    if (!j)
        return 0;
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *c = json_object_get(json_object_get(ch, "delta"), "content");
    if (json_is_string(c) && json_string_length(c) > 0) {
        if (a->ttft < 0)
            a->ttft = kvg_mono_s() - a->t0;
        if (add_content(a, json_string_value(c), json_string_length(c)) < 0) {
            json_decref(j);
            return -1;
        }
    }
    take_usage(a, json_object_get(j, "usage"));
    json_decref(j);
    return 0;
}

static int sse_put(sink *k, const char *p, size_t n)
{
    answer *a = (answer *)k;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') {
            size_t len = a->len;
            if (len && a->body[len - 1] == '\r')
                len--;
            if (sse_line(a, a->body ? a->body : "", len) < 0)
                return -1;
            a->len = 0;
        } else {
            if (grow(&a->body, &a->cap, a->len + 2) < 0)
                return -1;
            a->body[a->len++] = p[i];
        }
    }
    return 0;
}

static int body_put(sink *k, const char *p, size_t n)
{
    answer *a = (answer *)k;
    if (grow(&a->body, &a->cap, a->len + n + 1) < 0)
        return -1;
    memcpy(a->body + a->len, p, n);
    a->len += n;
    a->body[a->len] = 0;
    return 0;
}

static void body_parse(answer *a)
{
    json_t *j = a->body ? json_loadb(a->body, a->len, 0, NULL) : NULL;
    if (!j)
        return;
    json_t *c = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"),
                                "content");
    if (json_is_string(c))
        add_content(a, json_string_value(c), json_string_length(c));
    take_usage(a, json_object_get(j, "usage"));
    json_decref(j);
}

/* ---- the clients ------------------------------------------------------------------------- */

typedef struct record {
    int status;
    long prompt_tokens, cached_tokens, completion_tokens;
    double ttft, latency;   /* seconds; ttft < 0 when not measured */
    double t0, t1;          /* sent, answered (kvg_mono_s) */
    long seq;               /* the order requests were sent in: < --warmup is warm-up */
} record;

typedef struct client {
    pthread_t th;
    int index;
    record *rec;
    size_t n, cap;
} client;

static atomic_int error_shown;   /* the first error's body went to stderr */
static atomic_long tickets;   /* requests left to send with --requests */
static double t_start, t_end;  /* t_end: no request starts after it (--duration) */

/* --rate: the arrival times, drawn in order from one seeded stream. */
static pthread_mutex_t arrival_lock = PTHREAD_MUTEX_INITIALIZER;
static double next_arrival, last_arrival;   /* seconds after t_start */
static uint64_t arrival_rs;
static atomic_long late;
static atomic_long early;       /* requests that went out before their arrival time (a bug: 0) */

/* Waits for the next arrival time (none without --rate); 1 when it had already
 * passed by more than 50 ms (the request goes out late). */
static int wait_arrival(void)
{
    if (O.rate <= 0)
        return 0;
    pthread_mutex_lock(&arrival_lock);
    double t = last_arrival = next_arrival;
    /* exponential gap of mean 1/rate; unit() is in [0, 1), so 1 - u is in (0, 1] */
    next_arrival += -log(1.0 - unit(&arrival_rs)) / O.rate;
    pthread_mutex_unlock(&arrival_lock);
    double now = kvg_mono_s() - t_start;
    if (t > now) {
        struct timespec ts = { (time_t)(t - now), (long)((t - now - (double)(time_t)(t - now)) * 1e9) };
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        if (kvg_mono_s() - t_start < t)
            atomic_fetch_add(&early, 1);
        return 0;
    }
    return now - t > 0.05;
}

static atomic_long sent;        /* requests sent so far: the next one's seq */

/* The next request's seq, or -1 when no more may start. */
static long take_ticket(void)
{
    if (O.duration > 0 && kvg_mono_s() >= t_end)
        return -1;
    if (O.requests > 0 && atomic_fetch_sub(&tickets, 1) <= 0)
        return -1;
    return atomic_fetch_add(&sent, 1);
}

static json_t *message(const char *role, const char *content)
{
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

static int send_request(conn *c, long tenant, const char *body, size_t len)
{
    char head[1024], th[400] = "";
    if (O.tenant_header[0])
        snprintf(th, sizeof th, "%s: tenant-%ld\r\n", O.tenant_header, tenant);
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                     "Accept: %s\r\n%sContent-Length: %zu\r\n\r\n",
                     O.path, O.host, O.port, O.stream ? "text/event-stream" : "application/json", th, len);
    if (n < 0 || (size_t)n >= sizeof head)
        return -1;
    if (write_all(c->fd, head, (size_t)n) < 0 || write_all(c->fd, body, len) < 0)
        return -1;
    return 0;
}

static int record_add(client *cl, const record *r)
{
    if (cl->n == cl->cap) {
        size_t ncap = cl->cap ? cl->cap * 2 : 256;
        record *p = realloc(cl->rec, ncap * sizeof *p);
        if (!p)
            return -1;
        cl->rec = p;
        cl->cap = ncap;
    }
    cl->rec[cl->n++] = *r;
    return 0;
}

static void *client_main(void *arg)
{
    client *cl = arg;
    conn c = { .fd = -1 };
    uint64_t rs = O.seed ^ (0xd1b54a32d192ed03ull * (uint64_t)(cl->index + 1));
    answer a;
    memset(&a, 0, sizeof a);
    int stop = 0;
    while (!stop) {
        /* A new chat. */
        long tenant = pick_tenant(&rs);
        json_t *msgs = json_array();
        json_array_append_new(msgs, message("system", system_prompt[tenant]));
        long last_prompt = 0;
        for (long turn = 0; turn < O.turns; turn++) {
            char *user = text(&rs, words_for(uniform(&rs, O.user_lo, O.user_hi)));
            if (!user)
                break;
            if (turn && O.context > 0 &&
                last_prompt + a.completion_tokens + 2 * O.user_hi + O.max_tokens > O.context) {
                free(user);
                break;
            }
            json_array_append_new(msgs, message("user", user));
            free(user);
            long seq = take_ticket();
            if (seq < 0) {
                stop = 1;
                break;
            }
            if (wait_arrival())
                atomic_fetch_add(&late, 1);
            json_t *req = json_pack("{s:O, s:I, s:i, s:b}", "messages", msgs, "max_tokens",
                                    (json_int_t)O.max_tokens, "temperature", 0, "stream", O.stream);
            json_object_set_new(req, "model", json_string(O.model));
            if (O.stream)
                json_object_set_new(req, "stream_options", json_pack("{s:b}", "include_usage", 1));
            char *body = json_dumps(req, JSON_COMPACT);
            json_decref(req);

            a.len = a.clen = 0;
            a.have_usage = a.done = 0;
            a.prompt_tokens = a.cached_tokens = a.completion_tokens = 0;
            a.ttft = -1;
            a.k.put = O.stream ? sse_put : body_put;
            record r = { .seq = seq };
            int keep = 0, status = 0;
            for (int attempt = 0; attempt < 2 && status == 0; attempt++) {
                /* A kept-alive connection the server closed meanwhile fails at once:
                 * one retry on a fresh connection. */
                int fresh = c.fd < 0;
                if (fresh && conn_open(&c) < 0)
                    break;
                a.t0 = kvg_mono_s();
                if (send_request(&c, tenant, body, strlen(body)) == 0)
                    status = read_response(&c, &a.k, &keep);
                if (status == 0 || !keep)
                    conn_close(&c);
                if (fresh || a.len || a.clen)
                    break;
            }
            free(body);
            double t1 = kvg_mono_s();
            if (!O.stream && status)
                body_parse(&a);
            r.status = status;
            r.latency = t1 - a.t0;
            r.t0 = a.t0;
            r.t1 = t1;
            r.ttft = O.stream && status == 200 ? (a.ttft >= 0 ? a.ttft : r.latency) : -1;
            if (status == 200) {
                r.prompt_tokens = a.prompt_tokens;
                r.cached_tokens = a.cached_tokens;
                r.completion_tokens = a.completion_tokens;
            }
            record_add(cl, &r);
            if (status != 200 && !atomic_exchange(&error_shown, 1))
                fprintf(stderr, "%s: first error: %s%d: %.*s\n", prog, status ? "HTTP " : "transport ", status,
                        (int)(a.len < 400 ? a.len : 400), a.body ? a.body : "");
            if (status != 200) {
                /* The chat is abandoned (its history would be wrong); a short pause
                 * keeps a failing server from being hammered. */
                usleep(status == 0 || status >= 500 ? 20000 : 0);
                break;
            }
            last_prompt = a.prompt_tokens;
            json_array_append_new(msgs, message("assistant", a.clen ? a.content : ""));
        }
        json_decref(msgs);
    }
    conn_close(&c);
    free(a.body);
    free(a.content);
    return NULL;
}

/* The first model of GET /v1/models (for a run without --model); NULL when none. */
static char *first_model(void)
{
    conn c = { .fd = -1 };
    answer a;
    memset(&a, 0, sizeof a);
    a.k.put = body_put;
    char req[700];
    int n = snprintf(req, sizeof req, "GET /v1/models HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n\r\n",
                     O.host, O.port);
    char *id = NULL;
    int keep;
    if (n > 0 && (size_t)n < sizeof req && conn_open(&c) == 0 && write_all(c.fd, req, (size_t)n) == 0 &&
        read_response(&c, &a.k, &keep) == 200 && a.body) {
        json_t *j = json_loadb(a.body, a.len, 0, NULL);
        json_t *m = json_object_get(json_array_get(json_object_get(j, "data"), 0), "id");
        if (json_is_string(m))
            id = strdup(json_string_value(m));
        json_decref(j);
    }
    conn_close(&c);
    free(a.body);
    return id;
}

/* ---- the report ---------------------------------------------------------------------------- */

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The q-quantile (nearest rank) of n sorted values; 0 when n == 0. */
static double quantile(const double *v, size_t n, double q)
{
    if (!n)
        return 0;
    size_t i = (size_t)ceil(q * (double)n);
    return v[i ? i - 1 : 0];
}

static int usage(FILE *f)
{
    fprintf(f,
            "usage: %s --url http://HOST:PORT[/PATH] [options]\n"
            "Replays a synthetic multi-tenant chat workload against an OpenAI-compatible chat endpoint\n"
            "(PATH defaults to /v1/chat/completions) and reports the cache hit rate, TTFT and requests/s.\n"
            "  --requests N          stop after N requests (all clients together; after the warm-up)\n"
            "  --warmup W            first send W requests left out of every figure (default 0)\n"
            "  --duration S          stop starting requests after S seconds (default 10 without --requests)\n"
            "  --concurrency N       clients, each one chat at a time (default 8)\n"
            "  --rate R              open loop: requests at Poisson times, R per second (default: closed loop)\n"
            "  --tenants N           tenants (default 100)\n"
            "  --zipf S              tenant popularity exponent (default 1.1; 0 = uniform)\n"
            "  --system-tokens A..B  each tenant's system prompt, in tokens' worth of text (default 300..1000)\n"
            "  --user-tokens A..B    each user line (default 10..40)\n"
            "  --turns N             turns per chat (default 4)\n"
            "  --context N           end a chat before its prompt passes N tokens (default: no limit)\n"
            "  --max-tokens N        tokens per answer (default 32)\n"
            "  --model NAME          the request's model (default: the first of GET /v1/models)\n"
            "  --tenant-header NAME  the tenant header (default X-Tenant-Id; \"\" sends none)\n"
            "  --seed N              the workload's seed (default 1)\n"
            "  --timeout S           per-request socket timeout (default 60)\n"
            "  --no-stream           plain JSON answers (no TTFT)\n"
            "  --json                the figures as one JSON object\n",
            prog);
    return f == stdout ? 0 : 2;
}

static int parse_range(const char *s, long *lo, long *hi)
{
    const char *dots = strstr(s, "..");
    char a[32];
    if (!dots)
        return kvg_arg_long(s, 1, 1000000, lo) == 0 ? (*hi = *lo, 0) : -1;
    size_t n = (size_t)(dots - s);
    if (n == 0 || n >= sizeof a)
        return -1;
    memcpy(a, s, n);
    a[n] = 0;
    if (kvg_arg_long(a, 1, 1000000, lo) < 0 || kvg_arg_long(dots + 2, 1, 1000000, hi) < 0 || *hi < *lo)
        return -1;
    return 0;
}

static int parse_url(const char *u)
{
    if (strncmp(u, "http://", 7) != 0)
        return -1;
    u += 7;
    const char *slash = strchr(u, '/');
    size_t hl = slash ? (size_t)(slash - u) : strlen(u);
    char hp[250];
    if (hl == 0 || hl >= sizeof hp)
        return -1;
    memcpy(hp, u, hl);
    hp[hl] = 0;
    char *colon = strrchr(hp, ':');
    if (hp[0] == '[') {   /* [v6]:port */
        char *close = strchr(hp, ']');
        if (!close)
            return -1;
        *close = 0;
        colon = close[1] == ':' ? close + 1 : NULL;
        snprintf(O.host, sizeof O.host, "%s", hp + 1);
    } else {
        if (colon)
            *colon = 0;
        snprintf(O.host, sizeof O.host, "%s", hp);
    }
    snprintf(O.port, sizeof O.port, "%s", colon ? colon + 1 : "80");
    snprintf(O.path, sizeof O.path, "%s", slash && strcmp(slash, "/") ? slash : "/v1/chat/completions");
    return O.host[0] ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *url = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return usage(stdout);
        if (!strcmp(a, "--json")) {
            O.json = 1;
            continue;
        }
        if (!strcmp(a, "--no-stream")) {
            O.stream = 0;
            continue;
        }
        if (!v)
            return kvg_usage_error(prog, "%s needs a value", a);
        i++;
        if (!strcmp(a, "--url"))
            url = v;
        else if (!strcmp(a, "--model"))
            O.model = v;
        else if (!strcmp(a, "--tenant-header"))
            O.tenant_header = v;
        else if (!strcmp(a, "--requests")) {
            if (kvg_arg_long(v, 1, 1000000000, &O.requests) < 0)
                return kvg_usage_error(prog, "--requests: '%s' is not an integer >= 1", v);
        } else if (!strcmp(a, "--warmup")) {
            if (kvg_arg_long(v, 0, 1000000000, &O.warmup) < 0)
                return kvg_usage_error(prog, "--warmup: '%s' is not an integer >= 0", v);
        } else if (!strcmp(a, "--duration")) {
            if (kvg_arg_double(v, 0.001, 1e7, &O.duration) < 0)
                return kvg_usage_error(prog, "--duration: '%s' is not a number of seconds > 0", v);
        } else if (!strcmp(a, "--rate")) {
            if (kvg_arg_double(v, 0.001, 1e6, &O.rate) < 0)
                return kvg_usage_error(prog, "--rate: '%s' is not a number of requests per second > 0", v);
        } else if (!strcmp(a, "--timeout")) {
            if (kvg_arg_double(v, 0.001, 1e6, &O.timeout) < 0)
                return kvg_usage_error(prog, "--timeout: '%s' is not a number of seconds > 0", v);
        } else if (!strcmp(a, "--concurrency")) {
            if (kvg_arg_long(v, 1, 4096, &O.concurrency) < 0)
                return kvg_usage_error(prog, "--concurrency: '%s' is not an integer 1..4096", v);
        } else if (!strcmp(a, "--tenants")) {
            if (kvg_arg_long(v, 1, 1000000, &O.tenants) < 0)
                return kvg_usage_error(prog, "--tenants: '%s' is not an integer 1..1000000", v);
        } else if (!strcmp(a, "--zipf")) {
            if (kvg_arg_double(v, 0, 10, &O.zipf) < 0)
                return kvg_usage_error(prog, "--zipf: '%s' is not a number 0..10", v);
        } else if (!strcmp(a, "--system-tokens")) {
            if (parse_range(v, &O.sys_lo, &O.sys_hi) < 0)
                return kvg_usage_error(prog, "--system-tokens: '%s' is not N or LO..HI", v);
        } else if (!strcmp(a, "--user-tokens")) {
            if (parse_range(v, &O.user_lo, &O.user_hi) < 0)
                return kvg_usage_error(prog, "--user-tokens: '%s' is not N or LO..HI", v);
        } else if (!strcmp(a, "--turns")) {
            if (kvg_arg_long(v, 1, 100000, &O.turns) < 0)
                return kvg_usage_error(prog, "--turns: '%s' is not an integer >= 1", v);
        } else if (!strcmp(a, "--context")) {
            if (kvg_arg_long(v, 1, 100000000, &O.context) < 0)
                return kvg_usage_error(prog, "--context: '%s' is not an integer >= 1", v);
        } else if (!strcmp(a, "--max-tokens")) {
            if (kvg_arg_long(v, 1, 1000000, &O.max_tokens) < 0)
                return kvg_usage_error(prog, "--max-tokens: '%s' is not an integer >= 1", v);
        } else if (!strcmp(a, "--seed")) {
            if (kvg_arg_long(v, 0, INT64_MAX, &l) < 0)
                return kvg_usage_error(prog, "--seed: '%s' is not an integer >= 0", v);
            O.seed = (uint64_t)l;
        } else
            return kvg_usage_error(prog, "unknown option '%s'", a);
    }
    if (!url)
        return kvg_usage_error(prog, "%s", "--url is required");
    if (parse_url(url) < 0)
        return kvg_usage_error(prog, "--url: '%s' is not http://HOST[:PORT][/PATH]", url);
    if (O.requests <= 0 && O.duration <= 0)
        O.duration = 10;
    char *model = NULL;
    if (!O.model) {
        O.model = model = first_model();
        if (!model) {
            fprintf(stderr, "%s: no --model, and GET /v1/models at %s:%s named none\n", prog, O.host, O.port);
            return 1;
        }
    }
    if (make_tenants() < 0) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return 1;
    }

    atomic_store(&tickets, O.requests + O.warmup);
    client *cl = calloc((size_t)O.concurrency, sizeof *cl);
    if (!cl) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return 1;
    }
    t_start = kvg_mono_s();
    t_end = t_start + O.duration;
    next_arrival = 0;
    arrival_rs = O.seed ^ 0x8cb92ba72f3d8dd7ull;
    for (long i = 0; i < O.concurrency; i++) {
        cl[i].index = (int)i;
        if (pthread_create(&cl[i].th, NULL, client_main, &cl[i]) != 0) {
            fprintf(stderr, "%s: pthread_create failed\n", prog);
            return 1;
        }
    }
    size_t total = 0, all = 0;
    for (long i = 0; i < O.concurrency; i++)
        pthread_join(cl[i].th, NULL);
    /* The measured window: from the first measured request sent to the last answered. */
    double first = 0, last = 0;
    for (long i = 0; i < O.concurrency; i++)
        for (size_t j = 0; j < cl[i].n; j++) {
            const record *r = &cl[i].rec[j];
            all++;
            if (r->seq < O.warmup)
                continue;
            if (!total || r->t0 < first)
                first = r->t0;
            if (!total || r->t1 > last)
                last = r->t1;
            total++;
        }
    double elapsed = last - first;

    /* Aggregate. Statuses: a short list of (status, count). */
    int st[64];
    long stn[64];
    size_t nst = 0, ok = 0, nt = 0;
    long long prompt = 0, cached = 0, completion = 0;
    double *ttft = malloc((all + 1) * sizeof *ttft), *lat = malloc((all + 1) * sizeof *lat);
    if (!ttft || !lat) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return 1;
    }
    for (long i = 0; i < O.concurrency; i++)
        for (size_t j = 0; j < cl[i].n; j++) {
            const record *r = &cl[i].rec[j];
            if (r->seq < O.warmup)
                continue;
            if (r->status == 200) {
                ok++;
                prompt += r->prompt_tokens;
                cached += r->cached_tokens;
                completion += r->completion_tokens;
                lat[ok - 1] = r->latency;
                if (r->ttft >= 0)
                    ttft[nt++] = r->ttft;
                continue;
            }
            size_t k = 0;
            while (k < nst && st[k] != r->status)
                k++;
            if (k == nst && nst < 64) {
                st[nst] = r->status;
                stn[nst++] = 0;
            }
            if (k < nst)
                stn[k]++;
        }
    qsort(ttft, nt, sizeof *ttft, cmp_double);
    qsort(lat, ok, sizeof *lat, cmp_double);
    double hit = prompt ? (double)cached / (double)prompt : 0;
    double rps = elapsed > 0 ? (double)ok / elapsed : 0;

    if (O.json) {
        json_t *errs = json_object();
        for (size_t k = 0; k < nst; k++) {
            char key[16];
            snprintf(key, sizeof key, "%d", st[k]);
            json_object_set_new(errs, key, json_integer(stn[k]));
        }
        json_t *j = json_pack("{s:I, s:I, s:o, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:f, s:I, s:I, s:f, s:I}",
                              "requests", (json_int_t)total, "ok", (json_int_t)ok, "errors", errs,
                              "prompt_tokens", (json_int_t)prompt, "cached_tokens", (json_int_t)cached,
                              "completion_tokens", (json_int_t)completion, "hit_rate", hit,
                              "ttft_p50_s", quantile(ttft, nt, 0.5), "ttft_p99_s", quantile(ttft, nt, 0.99),
                              "latency_p50_s", quantile(lat, ok, 0.5), "latency_p99_s", quantile(lat, ok, 0.99),
                              "requests_per_s", rps, "elapsed_s", elapsed, "concurrency",
                              (json_int_t)O.concurrency, "tenants", (json_int_t)O.tenants, "seed",
                              (json_int_t)O.seed, "rate", O.rate, "late", (json_int_t)atomic_load(&late),
                              "early", (json_int_t)atomic_load(&early), "arrival_span_s", last_arrival, "warmup", (json_int_t)O.warmup);
        char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
        puts(s);
        free(s);
        json_decref(j);
    } else {
        printf("requests        %zu (200: %zu", total, ok);
        for (size_t k = 0; k < nst; k++)
            printf(", %d: %ld", st[k], stn[k]);
        printf(")\n");
        printf("prompt tokens   %lld, cached %lld: hit rate %.1f%%\n", prompt, cached, 100 * hit);
        printf("completion      %lld tokens\n", completion);
        if (O.stream)
            printf("ttft            p50 %.1f ms, p99 %.1f ms\n", 1e3 * quantile(ttft, nt, 0.5),
                   1e3 * quantile(ttft, nt, 0.99));
        printf("latency         p50 %.1f ms, p99 %.1f ms\n", 1e3 * quantile(lat, ok, 0.5),
               1e3 * quantile(lat, ok, 0.99));
        printf("throughput      %.2f requests/s over %.2f s, %ld clients\n", rps, elapsed, O.concurrency);
        if (O.rate > 0)
            printf("offered         %.2f requests/s (Poisson), %ld sent over 50 ms late\n", O.rate,
                   atomic_load(&late));
    }
    for (long i = 0; i < O.concurrency; i++)
        free(cl[i].rec);
    free(cl);
    free(ttft);
    free(lat);
    for (long k = 0; k < O.tenants; k++)
        free(system_prompt[k]);
    free(system_prompt);
    free(zipf_cdf);
    free(model);
    return nst ? 1 : 0;
}
