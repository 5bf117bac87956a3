/* The engine client; see client.h. */
#include "client.h"
#include "monoclock.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "buckets.h"
#include "errmsg.h"
#include "cache_index.h"
#include "u64map.h"
#include "client_testing.h"

enum { FD_REGION = 0, FD_TO_ENGINE = 1, FD_TO_CLIENT = 2, FD_TOKENIZER = 3, FD_STATS = 4, FD_INDEX = 5,
       FD_TEMPLATE = 6 };

struct kvg_client {
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char name[48];
    int backoff_min_ms, backoff_max_ms, backoff_ms;
    int64_t retry_at_ms;         /* monotonic; connect attempts wait until then */
    kvg_client_state state;

    int sock;
    int to_engine, to_client;    /* eventfds */
    void *region;
    size_t region_size;
    kvg_shm shm;
    kvg_stats_page *stats;
    size_t stats_size;
    void *index;                 /* the engine's cache index, mapped read-only */
    size_t index_size;
    kvg_cache_index_reader index_rd;
    kvg_tokenizer *tok;
    kvg_jinja *chat;             /* the engine's chat template, compiled (NULL: none) */
    kvg_engine_info info;
    kvg_prefix_hasher *hasher;

    kvg_u64map live;             /* request id -> user */
    uint64_t next_id;
    /* CANCEL, PAUSE and RESUME messages the full ring could not take yet, in order
     * (a PAUSE must never overtake the CANCEL after it, nor a RESUME its PAUSE). */
    struct kvg_client_ctl { uint64_t id; uint32_t type, draw, mask; } *ctl;
    size_t n_ctl, cap_ctl;
    int want_writable;
    size_t want_payload;
    int sock_readable;           /* the caller saw the socket readable: look at it */
    int64_t sock_checked_ms;

    /* Going down: every live request gets an ERROR, then one DOWN event. */
    int down_pending;
    char down_msg[320];
    /* Failed by kvg_client_fail_live while the connection stays: each gets an ERROR
     * before any other event (fail_status, fail_msg). */
    struct kvg_client_failed { uint64_t id; void *user; } *failed;
    size_t n_failed, cap_failed;
    int fail_status;
    char fail_msg[320];

    unsigned char *submit_buf;   /* payload scratch (8-byte aligned) */
    size_t submit_cap;
    unsigned char *recv_buf;     /* private copy of each received payload */
    size_t recv_cap;
    char msg[KVG_PROTO_MAX_ERROR_LEN + 1];
};

kvg_client *kvg_client_new(const char *socket_path, const kvg_client_opts *opts,
                           char *err, size_t err_len)
{
    kvg_client *c;

    if (!socket_path || !*socket_path) {
        kvg_set_err(err, err_len, "engine client: no socket path");
        return NULL;
    }
    if (strlen(socket_path) >= sizeof c->path) {
        kvg_set_err(err, err_len, "engine client: socket path longer than %zu bytes: %s",
                    sizeof c->path - 1, socket_path);
        return NULL;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        kvg_set_err(err, err_len, "engine client: out of memory");
        return NULL;
    }
    strcpy(c->path, socket_path);
    snprintf(c->name, sizeof c->name, "%s", opts && opts->name ? opts->name : "client");
    c->backoff_min_ms = opts && opts->backoff_min_ms > 0 ? opts->backoff_min_ms : 50;
    c->backoff_max_ms = opts && opts->backoff_max_ms > 0 ? opts->backoff_max_ms : 2000;
    if (c->backoff_max_ms < c->backoff_min_ms)
        c->backoff_max_ms = c->backoff_min_ms;
    c->sock = c->to_engine = c->to_client = -1;
    c->next_id = 1;
    c->hasher = kvg_prefix_hasher_new(err, err_len);
    if (!c->hasher) {
        free(c);
        return NULL;
    }
    return c;
}

/* Releases everything of the current connection (not the live table). */
static void teardown(kvg_client *c)
{
    if (c->sock >= 0)
        close(c->sock);
    if (c->to_engine >= 0)
        close(c->to_engine);
    if (c->to_client >= 0)
        close(c->to_client);
    c->sock = c->to_engine = c->to_client = -1;
    if (c->region)
        munmap(c->region, c->region_size);
    c->region = NULL;
    if (c->stats)
        munmap(c->stats, c->stats_size);
    c->stats = NULL;
    if (c->index)
        munmap(c->index, c->index_size);
    c->index = NULL;
    memset(&c->index_rd, 0, sizeof c->index_rd);
    kvg_tokenizer_free(c->tok);
    c->tok = NULL;
    kvg_jinja_free(c->chat);
    c->chat = NULL;
    memset(&c->shm, 0, sizeof c->shm);
    memset(&c->info, 0, sizeof c->info);
    c->n_ctl = 0;
    c->want_writable = 0;
    c->state = KVG_CLIENT_DOWN;
}

void kvg_client_free(kvg_client *c)
{
    if (!c)
        return;
    teardown(c);
    kvg_u64map_free(&c->live);
    kvg_prefix_hasher_free(c->hasher);
    free(c->failed);
    free(c->ctl);
    free(c->submit_buf);
    free(c->recv_buf);
    free(c);
}

kvg_client_state kvg_client_get_state(const kvg_client *c)
{
    return c->state;
}

int kvg_client_retry_delay_ms(const kvg_client *c)
{
    int64_t d = c->retry_at_ms - kvg_mono_ms();
    return d > 0 ? (int)d : 0;
}

int kvg_client_socket_fd(const kvg_client *c)
{
    return c->sock;
}

int kvg_client_doorbell_fd(const kvg_client *c)
{
    return c->state == KVG_CLIENT_UP ? c->to_client : -1;
}

const kvg_engine_info *kvg_client_info(const kvg_client *c)
{
    return c->state == KVG_CLIENT_UP ? &c->info : NULL;
}

size_t kvg_client_live(const kvg_client *c)
{
    return c->live.n;
}

static void advance_backoff(kvg_client *c)
{
    c->retry_at_ms = kvg_mono_ms() + c->backoff_ms;
    c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : c->backoff_min_ms;
    if (c->backoff_ms > c->backoff_max_ms)
        c->backoff_ms = c->backoff_max_ms;
}

/* The connection is gone: close it now, report the live requests and DOWN from
 * next_event. */
static void go_down(kvg_client *c, const char *why)
{
    int was_up = c->state == KVG_CLIENT_UP;
    teardown(c);
    snprintf(c->down_msg, sizeof c->down_msg, "%s", why);
    c->down_pending = 1;
    if (was_up) {
        /* A connection that worked and then broke: retry soon (the engine may just be
         * restarting), then back off if it stays away. */
        c->backoff_ms = c->backoff_min_ms;
        c->retry_at_ms = kvg_mono_ms() + c->backoff_min_ms;
    }
}

void kvg_client_socket_readable(kvg_client *c)
{
    c->sock_readable = 1;
}

void kvg_client_disconnect(kvg_client *c, const char *why)
{
    if (c->state != KVG_CLIENT_DOWN)
        go_down(c, why ? why : "disconnected");
}

int kvg_client_connect(kvg_client *c, char *err, size_t err_len)
{
    struct sockaddr_un sa;
    int s;

    if (c->state != KVG_CLIENT_DOWN)
        return 0;
    advance_backoff(c);
    s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return kvg_fail(err, err_len, c->path, "socket: %s", strerror(errno));
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    strcpy(sa.sun_path, c->path);
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(s);
        if (e == ENOENT || e == ECONNREFUSED)
            return kvg_fail(err, err_len, c->path, "no engine is listening (%s)", strerror(e));
        if (e == EAGAIN)
            return kvg_fail(err, err_len, c->path, "the engine's accept queue is full; retrying");
        return kvg_fail(err, err_len, c->path, "cannot connect: %s", strerror(e));
    }
    if (kvg_proto_send_hello(s, c->name, err, err_len) != 0) {
        close(s);
        return -1;
    }
    c->sock = s;
    c->state = KVG_CLIENT_CONNECTING;
    return 0;
}

static int map_fd(int fd, size_t want, int prot, int flags, void **out, const char *what,
                  char *err, size_t err_len)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < want || want == 0)
        return kvg_fail(err, err_len, "handshake", "the engine's %s descriptor is not %zu bytes", what, want);
    void *p = mmap(NULL, want, prot, flags, fd, 0);
    if (p == MAP_FAILED)
        return kvg_fail(err, err_len, "handshake", "cannot map the engine's %s: %s", what, strerror(errno));
    *out = p;
    return 0;
}

/* The template's source from fd, compiled; its description from w. The engine
 * compiled the same bytes at startup, so a failure here means a client and an
 * engine of different versions. */
static int load_chat_template(kvg_client *c, const kvg_welcome *w, int fd, char *err, size_t err_len)
{
    void *src = NULL;
    char name[300];

    kvg_jinja_free(c->chat);
    c->chat = NULL;
    if (w->chat_template_origin > KVG_CHAT_BUILTIN) {
        kvg_set_err(err, err_len, "unknown origin %u", w->chat_template_origin);
        return -1;
    }
    if (w->chat_template_origin == KVG_CHAT_NONE) {
        kvg_chat_template_describe(&c->info.chat, KVG_CHAT_NONE, NULL, NULL, NULL, 0);
        return 0;
    }
    if (w->template_bytes > ((uint64_t)1 << 24)) {
        kvg_set_err(err, err_len, "implausible size %llu", (unsigned long long)w->template_bytes);
        return -1;
    }
    if (map_fd(fd, (size_t)w->template_bytes, PROT_READ, MAP_PRIVATE, &src, "chat template", err,
               err_len) != 0)
        return -1;
    snprintf(name, sizeof name, "%s", w->chat_template_source);
    c->chat = kvg_jinja_compile(src, (size_t)w->template_bytes, name, err, err_len);
    kvg_chat_template_describe(&c->info.chat, (kvg_chat_origin)w->chat_template_origin,
                               w->chat_template, w->chat_template_source, src,
                               (size_t)w->template_bytes);
    munmap(src, (size_t)w->template_bytes);
    return c->chat ? 0 : -1;
}

/* The engine's answer arrived: map and check everything it passed. */
static int setup(kvg_client *c, const kvg_welcome *w, int fds[KVG_WELCOME_FDS], char *err, size_t err_len)
{
    void *tok_map = NULL, *stats_map = NULL;
    char local[256];
    int rc = -1;

    if (w->region_bytes > ((uint64_t)1 << 34) || w->tokenizer_bytes > ((uint64_t)1 << 40) ||
        w->stats_bytes < sizeof(kvg_stats_page) || w->stats_bytes > (1u << 20) ||
        w->index_bytes < sizeof(kvg_cache_index_page) || w->index_bytes > ((uint64_t)1 << 34)) {
        kvg_set_err(err, err_len, "handshake: implausible sizes in the engine's answer");
        goto out;
    }
    if (w->block_tokens < KVG_PREFIX_BLOCK_MIN || w->block_tokens > KVG_PREFIX_BLOCK_MAX ||
        w->context_length < 1 || w->vocab_size < 1 || w->max_n < 1) {
        kvg_set_err(err, err_len, "handshake: implausible model parameters in the engine's answer");
        goto out;
    }
    if (map_fd(fds[FD_REGION], (size_t)w->region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, &c->region,
               "region", err, err_len) != 0)
        goto out;
    c->region_size = (size_t)w->region_bytes;
    if (kvg_shm_attach(&c->shm, c->region, c->region_size, local, sizeof local) != 0) {
        kvg_set_err(err, err_len, "handshake: the engine's region: %s", local);
        goto out;
    }
    if (map_fd(fds[FD_STATS], (size_t)w->stats_bytes, PROT_READ, MAP_SHARED, &stats_map, "statistics page",
               err, err_len) != 0)
        goto out;
    c->stats = stats_map;
    c->stats_size = (size_t)w->stats_bytes;
    if (map_fd(fds[FD_INDEX], (size_t)w->index_bytes, PROT_READ, MAP_SHARED, &c->index, "cache index", err,
               err_len) != 0)
        goto out;
    c->index_size = (size_t)w->index_bytes;
    if (kvg_cache_index_attach(&c->index_rd, c->index, c->index_size, local, sizeof local) != 0) {
        kvg_set_err(err, err_len, "handshake: the engine's %s", local);
        goto out;
    }
    if (map_fd(fds[FD_TOKENIZER], (size_t)w->tokenizer_bytes, PROT_READ, MAP_PRIVATE, &tok_map, "tokenizer",
               err, err_len) != 0)
        goto out;
    c->tok = kvg_tokenizer_load_mem(tok_map, (size_t)w->tokenizer_bytes, w->tokenizer_name, local, sizeof local);
    munmap(tok_map, (size_t)w->tokenizer_bytes);
    if (!c->tok) {
        kvg_set_err(err, err_len, "handshake: the engine's tokenizer: %s", local);
        goto out;
    }
    if (kvg_tokenizer_vocab_size(c->tok) > (int32_t)w->vocab_size) {
        kvg_set_err(err, err_len, "handshake: the tokenizer has %d tokens, the model %u",
                    kvg_tokenizer_vocab_size(c->tok), w->vocab_size);
        goto out;
    }
    memset(&c->info, 0, sizeof c->info);
    if (load_chat_template(c, w, fds[FD_TEMPLATE], local, sizeof local) != 0) {
        kvg_set_err(err, err_len, "handshake: the engine's chat template: %s", local);
        goto out;
    }
    memcpy(c->info.model_id, w->model_id, sizeof c->info.model_id);
    kvg_prefix_hex(w->model_id, c->info.model_id_hex);
    snprintf(c->info.model_name, sizeof c->info.model_name, "%s", w->model_name);
    snprintf(c->info.tokenizer_name, sizeof c->info.tokenizer_name, "%s", w->tokenizer_name);
    c->info.context_length = w->context_length;
    c->info.block_tokens = w->block_tokens;
    c->info.vocab_size = w->vocab_size;
    c->info.max_n = w->max_n > KVG_PROTO_MAX_N ? KVG_PROTO_MAX_N : w->max_n;
    c->info.bos = w->bos;
    c->info.eos = w->eos;
    c->info.add_bos = w->add_bos != 0;
    c->info.engine_pid = w->engine_pid;
    c->info.instance = w->instance;
    c->info.max_submit_bytes = kvg_shm_max_payload(&c->shm.sq);
    c->info.tokenizer = c->tok;
    c->info.chat_template = c->chat;
    {
        uint64_t rcap = kvg_shm_max_payload(&c->shm.cq);
        free(c->recv_buf);
        c->recv_buf = aligned_alloc(8, (size_t)((rcap + 7) & ~(uint64_t)7) + 8);
        c->recv_cap = (size_t)rcap;
        if (!c->recv_buf) {
            kvg_set_err(err, err_len, "engine client: out of memory");
            goto out;
        }
    }
    /* The engine creates the doorbells non-blocking; the flag lives in the shared
     * file description, so setting it again here changes nothing for the engine. */
    for (int i = FD_TO_ENGINE; i <= FD_TO_CLIENT; i++) {
        int fl = fcntl(fds[i], F_GETFL);
        if (fl < 0 || (!(fl & O_NONBLOCK) && fcntl(fds[i], F_SETFL, fl | O_NONBLOCK) != 0)) {
            kvg_set_err(err, err_len, "handshake: the engine's doorbell descriptors are unusable");
            goto out;
        }
    }
    c->to_engine = fds[FD_TO_ENGINE];
    c->to_client = fds[FD_TO_CLIENT];
    fds[FD_TO_ENGINE] = fds[FD_TO_CLIENT] = -1;
    rc = 0;
out:
    for (int i = 0; i < KVG_WELCOME_FDS; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return rc;
}

static void ring_engine(kvg_client *c)
{
    uint64_t one = 1;
    if (c->to_engine >= 0 && write(c->to_engine, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is saturated, the engine is woken anyway. */
    }
}

static void flush_ctl(kvg_client *c)
{
    size_t k = 0;
    char err[128];
    for (; k < c->n_ctl; k++) {
        int rc;
        if (c->ctl[k].type == KVG_MSG_CANCEL) {
            kvg_msg_cancel m = { KVG_PROTO_VERSION, 0, c->ctl[k].id };
            rc = kvg_shm_try_push(&c->shm.sq, KVG_MSG_CANCEL, &m, sizeof m, NULL, 0, err, sizeof err);
        } else if (c->ctl[k].type == KVG_MSG_SAMPLES) {
            kvg_msg_samples m = { KVG_PROTO_VERSION, c->ctl[k].draw, c->ctl[k].id, c->ctl[k].mask, 0 };
            rc = kvg_shm_try_push(&c->shm.sq, KVG_MSG_SAMPLES, &m, sizeof m, NULL, 0, err, sizeof err);
        } else {
            kvg_msg_pause m = { KVG_PROTO_VERSION, 0, c->ctl[k].id };    /* PAUSE, RESUME */
            rc = kvg_shm_try_push(&c->shm.sq, c->ctl[k].type, &m, sizeof m, NULL, 0, err, sizeof err);
        }
        if (rc != 0)
            break;
    }
    if (k) {
        memmove(c->ctl, c->ctl + k, (c->n_ctl - k) * sizeof *c->ctl);
        c->n_ctl -= k;
        ring_engine(c);
    }
    if (c->n_ctl)
        kvg_shm_producer_wait(&c->shm.sq);
}

/* Queues a control message for a live request and sends what the ring takes. 0, or
 * -1 when even queueing failed (the connection was dropped: the engine then cancels
 * everything of ours, so nothing is left generating for nobody). */
static int queue_ctl(kvg_client *c, uint64_t id, uint32_t type, uint32_t draw, uint32_t mask)
{
    if (c->n_ctl == c->cap_ctl) {
        size_t nc = c->cap_ctl ? c->cap_ctl * 2 : 16;
        struct kvg_client_ctl *g = realloc(c->ctl, nc * sizeof *g);
        if (!g) {
            go_down(c, "out of memory queueing a control message");
            return -1;
        }
        c->ctl = g;
        c->cap_ctl = nc;
    }
    c->ctl[c->n_ctl].id = id;
    c->ctl[c->n_ctl].type = type;
    c->ctl[c->n_ctl].draw = draw;
    c->ctl[c->n_ctl].mask = mask;
    c->n_ctl++;
    flush_ctl(c);
    return 0;
}

/* Takes id off the failed list (its ERROR not handed out yet); 1 when it was there. */
static int unfail(kvg_client *c, uint64_t id)
{
    for (size_t i = 0; i < c->n_failed; i++) {
        if (c->failed[i].id == id) {
            c->failed[i] = c->failed[--c->n_failed];
            return 1;
        }
    }
    return 0;
}

int kvg_client_cancel(kvg_client *c, uint64_t id)
{
    if (!kvg_u64map_find(&c->live, id, NULL))
        return unfail(c, id) ? 0 : -1;   /* failed, not told yet: its ERROR never comes */
    kvg_u64map_del(&c->live, id);
    if (c->state != KVG_CLIENT_UP)
        return 0;
    (void)queue_ctl(c, id, KVG_MSG_CANCEL, 0, 0);
    return 0;
}

int kvg_client_pause(kvg_client *c, uint64_t id, int pause)
{
    if (!kvg_u64map_find(&c->live, id, NULL))
        return -1;
    if (c->state != KVG_CLIENT_UP)
        return 0;                /* the request fails with the connection anyway */
    return queue_ctl(c, id, pause ? KVG_MSG_PAUSE : KVG_MSG_RESUME, 0, 0);
}

int kvg_client_samples(kvg_client *c, uint64_t id, unsigned draw, uint32_t cancel_mask)
{
    if (!kvg_u64map_find(&c->live, id, NULL))
        return -1;
    if (c->state != KVG_CLIENT_UP)
        return 0;                /* the request fails with the connection anyway */
    if (!draw && !cancel_mask)
        return 0;                /* nothing to say */
    return queue_ctl(c, id, KVG_MSG_SAMPLES, draw, cancel_mask);
}

int kvg_client_hash_prompt(kvg_client *c, const void *salt, size_t salt_len,
                           const int32_t *tokens, size_t n_tokens,
                           uint8_t (*out)[KVG_PREFIX_HASH_LEN], size_t cap, size_t *n,
                           char *err, size_t err_len)
{
    uint8_t root[KVG_PREFIX_HASH_LEN];
    if (c->state != KVG_CLIENT_UP)
        return kvg_fail(err, err_len, "engine client", "not connected");
    if (kvg_prefix_root(c->hasher, c->info.model_id, KVG_PREFIX_HASH_LEN, salt, salt_len, root,
                        err, err_len) != 0)
        return -1;
    return kvg_prefix_chain(c->hasher, root, tokens, n_tokens, c->info.block_tokens, out, cap, n,
                            err, err_len);
}

/* Pushes a message that the engine answers under its id (c->next_id, already in the
 * header) and tracks the id with user: 0 sent; KVG_CLIENT_AGAIN the submission ring is
 * full (nothing sent, nothing tracked: called again once kvg_client_on_event says the
 * ring has room for payload_len); -1 the connection went down. The first push that
 * finds the ring full announces the wait, then tries once more: the engine may have
 * drained it in between, and would then ring no doorbell (shm_channel.h). */
static int push_tracked(kvg_client *c, uint32_t type, const void *hdr, size_t hdr_len, const void *payload,
                        size_t payload_len, void *user, char *err, size_t err_len)
{
    uint64_t id = c->next_id;
    int rc;
    if (kvg_u64map_put(&c->live, id, user) != 0)
        return kvg_fail(err, err_len, "engine client", "out of memory");
    if (c->n_ctl)
        flush_ctl(c);
    rc = c->n_ctl ? KVG_SHM_FULL
                  : kvg_shm_try_push(&c->shm.sq, type, hdr, hdr_len, payload, payload_len, err, err_len);
    if (rc == KVG_SHM_FULL) {
        kvg_shm_producer_wait(&c->shm.sq);
        rc = c->n_ctl ? KVG_SHM_FULL
                      : kvg_shm_try_push(&c->shm.sq, type, hdr, hdr_len, payload, payload_len, err, err_len);
    }
    if (rc != 0) {
        kvg_u64map_del(&c->live, id);
        if (rc == KVG_SHM_FULL) {
            c->want_writable = 1;
            c->want_payload = payload_len;
            return KVG_CLIENT_AGAIN;
        }
        go_down(c, err && *err ? err : "submission ring failed");
        return -1;
    }
    c->next_id++;
    ring_engine(c);
    return 0;
}

int kvg_client_submit(kvg_client *c, const kvg_client_req *r, void *user, uint64_t *id,
                      char *err, size_t err_len)
{
    kvg_submit_view v;
    uint8_t (*own_hashes)[KVG_PREFIX_HASH_LEN] = NULL;
    uint32_t stop_len[KVG_PROTO_MAX_STOP];
    char stop_bytes[KVG_PROTO_MAX_STOP * KVG_PROTO_MAX_STOP_LEN];
    size_t need, n_blocks;
    unsigned n = r->n ? r->n : 1;
    int rc;

    if (c->state != KVG_CLIENT_UP)
        return kvg_fail(err, err_len, "engine", "not connected");
    if (!r->tokens || r->n_tokens == 0)
        return kvg_fail(err, err_len, "request", "the prompt is empty");
    if (r->n_tokens > c->info.context_length)
        return kvg_fail(err, err_len, "request", "the prompt has %zu tokens, more than the model's context "
                        "length of %u", r->n_tokens, c->info.context_length);
    if (n > c->info.max_n)
        return kvg_fail(err, err_len, "request", "n is %u, the engine serves at most %u", n, c->info.max_n);
    if (r->salt_len > KVG_PROTO_MAX_SALT)
        return kvg_fail(err, err_len, "request", "salt of %zu bytes (at most %d)", r->salt_len,
                        KVG_PROTO_MAX_SALT);
    if (r->n_stop > KVG_PROTO_MAX_STOP || r->n_stop_ids > KVG_PROTO_MAX_STOP_IDS)
        return kvg_fail(err, err_len, "request", "at most %d stop strings and %d stop ids", KVG_PROTO_MAX_STOP,
                        KVG_PROTO_MAX_STOP_IDS);
    if (!(r->temperature >= 0.0f) || !(r->top_p >= 0.0f && r->top_p <= 1.0f))
        return kvg_fail(err, err_len, "request", "bad temperature or top_p");

    memset(&v, 0, sizeof v);
    v.h.version = KVG_PROTO_VERSION;
    v.h.flags = r->logprobs ? KVG_SUBMIT_LOGPROBS : 0;
    v.h.seed = r->seed;
    /* Bypass travels as bucket 0 and nothing else (proto.h); a cached request's
     * bucket is at least 1 so it never reads as bypass. */
    v.h.bucket = r->bypass ? KVG_BUCKET_BYPASS : (r->bucket ? r->bucket : 1);
    if (v.h.bucket >= KVG_STATS_BUCKETS)
        v.h.bucket = KVG_STATS_BUCKETS - 1;
    v.h.priority = r->priority;
    v.h.cache_ttl_ms = r->cache_ttl_ms;
    if (r->n_holds > KVG_PROTO_MAX_HOLDS)
        return kvg_fail(err, err_len, "request", "%u holds (at most %d)", r->n_holds, KVG_PROTO_MAX_HOLDS);
    v.h.n_holds = r->bypass ? 0 : r->n_holds;
    for (unsigned i = 0; i < v.h.n_holds; i++) {
        v.h.hold_blocks[i] = r->hold_blocks[i];
        v.h.hold_ms[i] = r->hold_ms[i];
    }
    v.h.deadline_ms = r->deadline_ms;
    v.h.n = n;
    v.h.n_active = r->n_active;
    v.h.max_tokens = r->max_tokens ? r->max_tokens : c->info.context_length;
    v.h.top_k = r->top_k;
    v.h.temperature = r->temperature;
    v.h.top_p = r->top_p > 0.0f ? r->top_p : 1.0f;
    v.h.salt_len = (uint32_t)r->salt_len;
    v.h.n_tokens = (uint32_t)r->n_tokens;
    v.h.n_stop_ids = (uint32_t)r->n_stop_ids;
    v.h.n_stop = (uint32_t)r->n_stop;
    v.salt = r->salt;
    v.tokens = (const uint32_t *)(const void *)r->tokens;
    v.stop_ids = (const uint32_t *)(const void *)r->stop_ids;
    for (size_t i = 0; i < r->n_stop; i++) {
        if (r->stop_len[i] < 1 || r->stop_len[i] > KVG_PROTO_MAX_STOP_LEN || memchr(r->stop[i], 0, r->stop_len[i]))
            return kvg_fail(err, err_len, "request", "stop string %zu must have 1..%d bytes and no NUL", i,
                            KVG_PROTO_MAX_STOP_LEN);
        memcpy(stop_bytes + v.h.stop_bytes, r->stop[i], r->stop_len[i]);
        stop_len[i] = (uint32_t)r->stop_len[i];
        v.h.stop_bytes += (uint32_t)r->stop_len[i];
    }
    v.stop_len = stop_len;
    v.stop_bytes = stop_bytes;
    if (!r->bypass) {
        n_blocks = r->n_tokens / c->info.block_tokens;
        if (r->hashes) {
            /* Sent as given: the engine checks the count and every hash (proto.h). */
            n_blocks = r->n_hashes;
            v.hashes = r->hashes;
        } else if (n_blocks) {
            own_hashes = malloc(n_blocks * sizeof *own_hashes);
            if (!own_hashes)
                return kvg_fail(err, err_len, "engine client", "out of memory");
            if (kvg_client_hash_prompt(c, r->salt, r->salt_len, r->tokens, r->n_tokens, own_hashes, n_blocks,
                                       &n_blocks, err, err_len) != 0) {
                free(own_hashes);
                return -1;
            }
            v.hashes = (const uint8_t (*)[KVG_PREFIX_HASH_LEN])own_hashes;
        }
        v.h.n_block_hashes = (uint32_t)n_blocks;
    }
    need = kvg_proto_submit_size(&v.h);
    if (!need || need > c->info.max_submit_bytes) {
        free(own_hashes);
        return kvg_fail(err, err_len, "request", "a request of %zu bytes is larger than the channel carries "
                        "(%llu bytes)", need, (unsigned long long)c->info.max_submit_bytes);
    }
    if (need > c->submit_cap) {
        free(c->submit_buf);
        c->submit_cap = 0;
        c->submit_buf = aligned_alloc(8, (need + 7) & ~(size_t)7);
        if (!c->submit_buf) {
            free(own_hashes);
            return kvg_fail(err, err_len, "engine client", "out of memory");
        }
        c->submit_cap = (need + 7) & ~(size_t)7;
    }
    v.h.request_id = c->next_id;
    kvg_proto_encode_submit(&v, c->submit_buf, c->submit_cap);
    free(own_hashes);

    rc = push_tracked(c, KVG_MSG_SUBMIT, &v.h, sizeof v.h, c->submit_buf, need, user, err, err_len);
    if (rc == 0)
        *id = v.h.request_id;
    return rc;
}

int kvg_client_wipe(kvg_client *c, const void *salt, size_t salt_len, void *user, uint64_t *id,
                    char *err, size_t err_len)
{
    kvg_msg_wipe h;
    int rc;

    if (c->state != KVG_CLIENT_UP)
        return kvg_fail(err, err_len, "engine client", "not connected");
    if (salt_len > KVG_PROTO_MAX_SALT)
        return kvg_fail(err, err_len, "wipe", "tenant salt of %zu bytes (at most %d)", salt_len,
                        KVG_PROTO_MAX_SALT);
    memset(&h, 0, sizeof h);
    h.version = KVG_PROTO_VERSION;
    h.request_id = c->next_id;
    h.salt_len = (uint32_t)salt_len;
    rc = push_tracked(c, KVG_MSG_WIPE, &h, sizeof h, salt, salt_len, user, err, err_len);
    if (rc == 0)
        *id = h.request_id;
    return rc;
}

size_t kvg_client_fail_live(kvg_client *c, int status, const char *why)
{
    size_t n = c->live.n;

    if (n == 0)
        return 0;
    if (c->n_failed + n > c->cap_failed) {
        struct kvg_client_failed *f = realloc(c->failed, (c->n_failed + n) * sizeof *f);
        if (!f) {
            /* they fail all the same, with the connection (the engine then cancels them) */
            go_down(c, "out of memory failing the live requests");
            return n;
        }
        c->failed = f;
        c->cap_failed = c->n_failed + n;
    }
    c->fail_status = status;
    snprintf(c->fail_msg, sizeof c->fail_msg, "%s", why ? why : "failed by the client");
    /* One pass over the table, then empty it: events for these ids are dropped from
     * now on, as for any cancelled request. */
    for (size_t i = 0; i < c->live.cap; i++) {
        if (!c->live.keys[i])
            continue;
        c->failed[c->n_failed].id = c->live.keys[i];
        c->failed[c->n_failed].user = c->live.vals[i];
        c->n_failed++;
    }
    kvg_u64map_free(&c->live);
    for (size_t i = c->n_failed - n; i < c->n_failed && c->state == KVG_CLIENT_UP; i++)
        (void)queue_ctl(c, c->failed[i].id, KVG_MSG_CANCEL, 0, 0);
    return n;
}

uint64_t kvg_client_heartbeat(const kvg_client *c)
{
    if (c->state != KVG_CLIENT_UP || !c->stats)
        return 0;
    return atomic_load_explicit(&c->stats->heartbeat, memory_order_relaxed);
}

int kvg_client_stats(const kvg_client *c, kvg_stats *out)
{
    if (c->state != KVG_CLIENT_UP || !c->stats)
        return -1;
    return kvg_stats_read(c->stats, out);
}

size_t kvg_client_cached_prefix(const kvg_client *c, const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], size_t n)
{
    if (c->state != KVG_CLIENT_UP || !c->index || !hashes)
        return 0;
    return kvg_cache_index_prefix(&c->index_rd, hashes, n);
}

uint64_t kvg_client_load(const kvg_client *c)
{
    kvg_stats s;
    if (c->state != KVG_CLIENT_UP || !c->stats)
        return 0;
    /* The seqlock's read of one field (kvg_stats_read copies the whole page, some
     * 10 KiB, and a worker asks every candidate engine on every request). */
    for (int attempt = 0; attempt < 100; attempt++) {
        uint64_t seq = atomic_load_explicit(&c->stats->seq, memory_order_acquire);
        if (seq & 1)
            continue;
        uint64_t v = __atomic_load_n(&c->stats->s.load_tokens, __ATOMIC_RELAXED);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&c->stats->seq, memory_order_relaxed) == seq)
            return v;
    }
    return kvg_stats_read(c->stats, &s) == 0 ? s.load_tokens : 0;
}

/* ---- events ---- */

/* Turns one received message into an event; 1 when *ev is one for a live request,
 * 0 when it was for a forgotten (cancelled) request, -1 on a protocol violation. */
static int decode(kvg_client *c, const kvg_shm_msg *m, kvg_client_event *ev, char *err, size_t err_len)
{
    void *user;
    uint64_t id;

    switch (m->type) {
    case KVG_MSG_ACCEPTED: {
        kvg_msg_accepted a;
        if (kvg_proto_decode_fixed(m, KVG_MSG_ACCEPTED, &a, sizeof a, err, err_len) != 0)
            return -1;
        id = a.request_id;
        ev->kind = KVG_CEV_ACCEPTED;
        ev->prompt_tokens = a.prompt_tokens;
        ev->cached_tokens = a.cached_tokens;
        break;
    }
    case KVG_MSG_TOKENS: {
        kvg_tokens_view t;
        if (kvg_proto_decode_tokens(m, &t, err, err_len) != 0)
            return -1;
        id = t.h.request_id;
        ev->kind = KVG_CEV_TOKENS;
        ev->sample = t.h.sample_index;
        ev->tokens = t.ids;
        ev->logprobs = t.logprobs;
        ev->n_tokens = t.h.n_tokens;
        ev->text = t.text;
        ev->text_len = t.h.text_len;
        break;
    }
    case KVG_MSG_FINISHED: {
        kvg_msg_finished f;
        if (kvg_proto_decode_fixed(m, KVG_MSG_FINISHED, &f, sizeof f, err, err_len) != 0)
            return -1;
        id = f.request_id;
        ev->kind = KVG_CEV_FINISHED;
        ev->sample = f.sample_index;
        ev->finish_reason = f.finish_reason;
        ev->completion_tokens = f.completion_tokens;
        break;
    }
    case KVG_MSG_DONE: {
        kvg_msg_done d;
        if (kvg_proto_decode_fixed(m, KVG_MSG_DONE, &d, sizeof d, err, err_len) != 0)
            return -1;
        id = d.request_id;
        ev->kind = KVG_CEV_DONE;
        ev->prompt_tokens = d.prompt_tokens;
        ev->cached_tokens = d.cached_tokens;
        ev->completion_tokens = d.completion_tokens;
        ev->cache_write_tokens = d.cache_write_tokens;
        break;
    }
    case KVG_MSG_WIPED: {
        kvg_msg_wiped w;
        if (kvg_proto_decode_wiped(m, &w, err, err_len) != 0)
            return -1;
        id = w.request_id;
        ev->kind = KVG_CEV_WIPED;
        ev->wiped_pool = w.pool_blocks;
        ev->wiped_host = w.host_blocks;
        ev->wiped_disk = w.disk_blocks;
        break;
    }
    case KVG_MSG_ERROR: {
        kvg_msg_error e;
        const char *text;
        if (kvg_proto_decode_error(m, &e, &text, err, err_len) != 0)
            return -1;
        id = e.request_id;
        memcpy(c->msg, text, e.message_len);
        c->msg[e.message_len] = '\0';
        ev->kind = KVG_CEV_ERROR;
        ev->status = e.status >= 400 && e.status <= 599 ? (int)e.status : 500;
        ev->message = c->msg;
        if (id == 0) {
            /* About the channel itself: the engine gave up on us. */
            kvg_set_err(err, err_len, "the engine reported: %s", c->msg);
            return -1;
        }
        break;
    }
    default:
        kvg_set_err(err, err_len, "unknown message type %u from the engine", m->type);
        return -1;
    }
    if (!kvg_u64map_find(&c->live, id, &user))
        return 0;
    ev->id = id;
    ev->user = user;
    if (ev->kind == KVG_CEV_DONE || ev->kind == KVG_CEV_ERROR || ev->kind == KVG_CEV_WIPED)
        kvg_u64map_del(&c->live, id);
    return 1;
}

/* The next message for a live request from the completion ring: 1 with *ev filled,
 * 0 when the ring is empty, -1 when the connection had to go down. */
static int pop_event(kvg_client *c, kvg_client_event *ev)
{
    char err[320], why[400];

    for (;;) {
        kvg_shm_msg m;
        int rc = kvg_shm_try_pop(&c->shm.cq, &m, c->recv_buf, c->recv_cap, err, sizeof err);
        if (rc == KVG_SHM_EMPTY)
            return 0;
        if (rc < 0) {
            snprintf(why, sizeof why, "corrupt completion ring: %s", err);
            go_down(c, why);
            return -1;
        }
        /* The engine may be waiting for this room (a slow reader's backlog). */
        if (kvg_shm_consumer_take_waiter(&c->shm.cq))
            ring_engine(c);
        int d = decode(c, &m, ev, err, sizeof err);
        if (d == 1)
            return 1;
        if (d < 0) {
            snprintf(why, sizeof why, "protocol violation by the engine: %s", err);
            go_down(c, why);
            return -1;
        }
        /* a message for a cancelled request: the next one */
    }
}

int kvg_client_next_event(kvg_client *c, kvg_client_event *ev)
{
    char err[320];

    memset(ev, 0, sizeof *ev);
    if (c->n_failed) {
        c->n_failed--;
        snprintf(c->msg, sizeof c->msg, "%s", c->fail_msg);
        ev->kind = KVG_CEV_ERROR;
        ev->id = c->failed[c->n_failed].id;
        ev->user = c->failed[c->n_failed].user;
        ev->status = c->fail_status;
        ev->message = c->msg;
        return 1;
    }
    if (c->down_pending) {
        void *user;
        uint64_t id = kvg_u64map_any(&c->live, &user);
        if (id) {
            kvg_u64map_del(&c->live, id);
            snprintf(c->msg, sizeof c->msg, "kvgate engine connection lost: %s", c->down_msg);
            ev->kind = KVG_CEV_ERROR;
            ev->id = id;
            ev->user = user;
            ev->status = 503;
            ev->message = c->msg;
            return 1;
        }
        c->down_pending = 0;
        snprintf(c->msg, sizeof c->msg, "%s", c->down_msg);
        ev->kind = KVG_CEV_DOWN;
        ev->message = c->msg;
        return 1;
    }
    if (c->state == KVG_CLIENT_CONNECTING) {
        kvg_welcome w;
        int fds[KVG_WELCOME_FDS];
        int rc = kvg_proto_recv_welcome(c->sock, &w, fds, err, sizeof err);
        if (rc == 1)
            return 0;
        if (rc != 0 || setup(c, &w, fds, err, sizeof err) != 0) {
            go_down(c, err);
            return kvg_client_next_event(c, ev);
        }
        c->state = KVG_CLIENT_UP;
        c->backoff_ms = 0;
        c->retry_at_ms = 0;
        ev->kind = KVG_CEV_UP;
        return 1;
    }
    if (c->state != KVG_CLIENT_UP)
        return 0;

    int rc = pop_event(c, ev);
    if (rc == 0) {
        /* Nothing queued: clear the doorbell, then look once more, so that a message
         * pushed between the pop and the read is not left unannounced. One read per
         * drain: a message pushed after it rings the doorbell again. */
        uint64_t v;
        if (read(c->to_client, &v, sizeof v) == (ssize_t)sizeof v)
            rc = pop_event(c, ev);
    }
    if (rc < 0)
        return kvg_client_next_event(c, ev);   /* the failed requests, then DOWN */
    if (rc == 1)
        return 1;
    if (c->n_ctl)
        flush_ctl(c);
    /* The socket only ever carries EOF (or a violation): look when the caller saw it
     * readable, and at least every 100 ms. */
    int64_t now = kvg_mono_ms();
    if (c->sock_readable || now - c->sock_checked_ms >= 100) {
        char b;
        c->sock_readable = 0;
        c->sock_checked_ms = now;
        ssize_t n = recv(c->sock, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            go_down(c, n == 0 ? "the engine closed the connection" : strerror(errno));
            return kvg_client_next_event(c, ev);
        }
        if (n > 0) {
            go_down(c, "unexpected data from the engine on the socket");
            return kvg_client_next_event(c, ev);
        }
    }
    if (c->want_writable && !c->n_ctl && kvg_shm_can_push(&c->shm.sq, c->want_payload)) {
        c->want_writable = 0;
        ev->kind = KVG_CEV_WRITABLE;
        return 1;
    }
    return 0;
}

const char *kvg_cache_status(int bypass, uint32_t prompt_tokens, uint32_t cached_tokens,
                             uint32_t block_tokens)
{
    if (bypass)
        return "bypass";
    if (cached_tokens == 0 || prompt_tokens == 0 || block_tokens == 0)
        return "miss";
    uint32_t servable = (prompt_tokens - 1) / block_tokens * block_tokens;
    return cached_tokens >= servable ? "hit" : "partial";
}

/* ---- blocking helpers ---- */

int kvg_client_wait(kvg_client *c, int timeout_ms)
{
    struct pollfd p[2];
    int n = 0;

    if (c->down_pending || c->n_failed)
        return 1;                /* events to hand out, no descriptor says so */
    if (c->state == KVG_CLIENT_DOWN) {
        int d = kvg_client_retry_delay_ms(c);
        if (timeout_ms >= 0 && d > timeout_ms) {
            struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };
            nanosleep(&ts, NULL);
            return 0;
        }
        struct timespec ts = { d / 1000, (long)(d % 1000) * 1000000L };
        nanosleep(&ts, NULL);
        return 1;
    }
    if (c->state == KVG_CLIENT_UP) {
        /* Something may already be queued (a reader that stopped early). */
        if (kvg_shm_can_push(&c->shm.sq, 0) && c->want_writable)
            return 1;
    }
    p[n].fd = c->sock;
    p[n].events = POLLIN;
    n++;
    if (c->state == KVG_CLIENT_UP) {
        p[n].fd = c->to_client;
        p[n].events = POLLIN;
        n++;
    }
    int rc;
    do
        rc = poll(p, (nfds_t)n, timeout_ms);
    while (rc < 0 && errno == EINTR);
    if (rc > 0 && p[0].revents)
        c->sock_readable = 1;
    return rc > 0;
}

int kvg_client_connect_wait(kvg_client *c, int timeout_ms, char *err, size_t err_len)
{
    int64_t deadline = kvg_mono_ms() + timeout_ms;
    kvg_client_event ev;

    if (c->state == KVG_CLIENT_UP)
        return 0;
    if (c->state == KVG_CLIENT_DOWN && kvg_client_connect(c, err, err_len) != 0)
        return -1;
    for (;;) {
        while (kvg_client_next_event(c, &ev) == 1) {
            if (ev.kind == KVG_CEV_UP)
                return 0;
            if (ev.kind == KVG_CEV_DOWN)
                return kvg_fail(err, err_len, c->path, "%s", ev.message);
        }
        int64_t left = deadline - kvg_mono_ms();
        if (left <= 0)
            return kvg_fail(err, err_len, c->path, "the engine did not complete the handshake within %d ms",
                            timeout_ms);
        kvg_client_wait(c, (int)left);
    }
}
