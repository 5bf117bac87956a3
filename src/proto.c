/* The engine protocol: handshake I/O, message layouts, the statistics page. See proto.h. */
#include "proto.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "buckets.h"
#include "errmsg.h"

_Static_assert(sizeof(kvg_msg_submit) <= KVG_SHM_BODY_MAX, "submit fits a slot");
_Static_assert(sizeof(kvg_msg_tokens) <= KVG_SHM_BODY_MAX, "tokens fits a slot");
_Static_assert(sizeof(kvg_msg_finished) <= KVG_SHM_BODY_MAX, "finished fits a slot");
_Static_assert(sizeof(kvg_msg_done) <= KVG_SHM_BODY_MAX, "done fits a slot");
_Static_assert(sizeof(kvg_msg_error) <= KVG_SHM_BODY_MAX, "error fits a slot");
_Static_assert(sizeof(kvg_msg_pause) <= KVG_SHM_BODY_MAX, "pause fits a slot");
_Static_assert(sizeof(kvg_msg_wipe) <= KVG_SHM_BODY_MAX, "wipe fits a slot");
_Static_assert(sizeof(kvg_msg_wiped) <= KVG_SHM_BODY_MAX, "wiped fits a slot");
_Static_assert(sizeof(kvg_welcome) < 1024, "welcome is one small packet");
_Static_assert(sizeof(kvg_stats_page) <= 65536, "stats page size");
/* A bucket index (buckets.h: bypass, then one per bound) labels the page's buckets. */
_Static_assert(KVG_STATS_BUCKETS == KVG_BUCKETS_MAX_BOUNDS + 1, "one statistics bucket per length bucket");

static size_t pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* ---- handshake ---- */

int kvg_proto_send_hello(int sock, const char *name, char *err, size_t err_len)
{
    kvg_hello h;
    ssize_t n;

    memset(&h, 0, sizeof h);
    h.magic = KVG_PROTO_MAGIC;
    h.version = KVG_PROTO_VERSION;
    h.pid = (uint32_t)getpid();
    if (name)
        strncpy(h.name, name, sizeof h.name - 1);
    do
        n = send(sock, &h, sizeof h, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof h)
        return kvg_fail(err, err_len, "handshake", "cannot send hello: %s",
                        n < 0 ? strerror(errno) : "short write");
    return 0;
}

int kvg_proto_recv_hello(int sock, kvg_hello *h, char *err, size_t err_len)
{
    ssize_t n;

    do
        n = recv(sock, h, sizeof *h, MSG_DONTWAIT | MSG_TRUNC);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 1;
    if (n < 0)
        return kvg_fail(err, err_len, "handshake", "cannot read hello: %s", strerror(errno));
    if (n == 0)
        return kvg_fail(err, err_len, "handshake", "peer closed before hello");
    if (n != (ssize_t)sizeof *h)
        return kvg_fail(err, err_len, "handshake", "hello of %zd bytes, expected %zu (not a kvgate client?)",
                        n, sizeof *h);
    if (h->magic != KVG_PROTO_MAGIC)
        return kvg_fail(err, err_len, "handshake", "bad hello magic 0x%08x (not a kvgate client)", h->magic);
    h->name[sizeof h->name - 1] = '\0';
    return 0;
}

int kvg_proto_send_welcome(int sock, const kvg_welcome *w, const int *fds, int n_fds,
                           char *err, size_t err_len)
{
    struct iovec iov = { (void *)w, sizeof *w };
    union {
        char buf[CMSG_SPACE(sizeof(int) * KVG_WELCOME_FDS)];
        struct cmsghdr align;
    } ctl;
    struct msghdr mh;
    ssize_t n;

    if (n_fds < 0 || n_fds > KVG_WELCOME_FDS)
        return kvg_fail(err, err_len, "handshake", "bad descriptor count %d", n_fds);
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (n_fds > 0) {
        struct cmsghdr *c;
        memset(&ctl, 0, sizeof ctl);
        mh.msg_control = ctl.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n_fds);
        c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n_fds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n_fds);
    }
    do
        n = sendmsg(sock, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof *w)
        return kvg_fail(err, err_len, "handshake", "cannot send welcome: %s",
                        n < 0 ? strerror(errno) : "short write");
    return 0;
}

static void close_fds(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
}

static int nul_terminated(const char *s, size_t cap)
{
    return memchr(s, '\0', cap) != NULL;
}

int kvg_proto_recv_welcome(int sock, kvg_welcome *w, int fds[KVG_WELCOME_FDS],
                           char *err, size_t err_len)
{
    struct iovec iov = { w, sizeof *w };
    union {
        char buf[CMSG_SPACE(sizeof(int) * (KVG_WELCOME_FDS + 4))];
        struct cmsghdr align;
    } ctl;
    struct msghdr mh;
    int got[KVG_WELCOME_FDS + 4], n_got = 0;
    ssize_t n;

    for (int i = 0; i < KVG_WELCOME_FDS; i++)
        fds[i] = -1;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    do
        n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 1;
    if (n < 0)
        return kvg_fail(err, err_len, "handshake", "cannot read the engine's answer: %s", strerror(errno));
    if (n == 0)
        return kvg_fail(err, err_len, "handshake", "the engine closed the connection during the handshake");
    /* Collect every descriptor that came, so none leaks whatever else is wrong. */
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k && n_got < (int)(sizeof got / sizeof got[0]); i++)
            memcpy(&got[n_got++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
        close_fds(got, n_got);
        return kvg_fail(err, err_len, "handshake", "the engine's answer was truncated");
    }
    if (n != (ssize_t)sizeof *w || w->magic != KVG_PROTO_MAGIC) {
        close_fds(got, n_got);
        return kvg_fail(err, err_len, "handshake", "not a kvgate engine answer (%zd bytes)", n);
    }
    if (!nul_terminated(w->message, sizeof w->message) || !nul_terminated(w->model_name, sizeof w->model_name) ||
        !nul_terminated(w->chat_template, sizeof w->chat_template) ||
        !nul_terminated(w->chat_template_source, sizeof w->chat_template_source) ||
        !nul_terminated(w->chat_template_sha256, sizeof w->chat_template_sha256) ||
        !nul_terminated(w->tokenizer_name, sizeof w->tokenizer_name)) {
        close_fds(got, n_got);
        return kvg_fail(err, err_len, "handshake", "malformed engine answer (unterminated string)");
    }
    if (w->status != 0) {
        close_fds(got, n_got);
        return kvg_fail(err, err_len, "handshake", "the engine refused the connection (%u): %s",
                        w->status, w->message);
    }
    if (w->version != KVG_PROTO_VERSION) {
        close_fds(got, n_got);
        return kvg_fail(err, err_len, "handshake", "the engine speaks protocol version %u, this client %u",
                        w->version, KVG_PROTO_VERSION);
    }
    if (n_got != KVG_WELCOME_FDS) {
        close_fds(got, n_got);
        return kvg_fail(err, err_len, "handshake", "the engine passed %d descriptors, expected %d", n_got,
                        KVG_WELCOME_FDS);
    }
    memcpy(fds, got, sizeof(int) * KVG_WELCOME_FDS);
    return 0;
}

/* ---- submit ---- */

/* Offsets of the submit payload parts; returns the total, 0 on overflow. */
static size_t submit_layout(const kvg_msg_submit *h, size_t off[6])
{
    /* Counts are bounded before the products so that nothing overflows 64 bits. */
    if (h->salt_len > KVG_PROTO_MAX_SALT || h->n_tokens > (1u << 30) || h->n_block_hashes > (1u << 30) ||
        h->n_stop_ids > KVG_PROTO_MAX_STOP_IDS || h->n_stop > KVG_PROTO_MAX_STOP ||
        h->stop_bytes > KVG_PROTO_MAX_STOP * KVG_PROTO_MAX_STOP_LEN)
        return 0;
    size_t o = 0;
    off[0] = o;
    o += pad8(h->salt_len);
    off[1] = o;
    o += pad8((size_t)h->n_tokens * 4);
    off[2] = o;
    o += (size_t)h->n_block_hashes * KVG_PREFIX_HASH_LEN;
    off[3] = o;
    o += pad8((size_t)h->n_stop_ids * 4);
    off[4] = o;
    o += pad8((size_t)h->n_stop * 4);
    off[5] = o;
    o += h->stop_bytes;
    return o;
}

size_t kvg_proto_submit_size(const kvg_msg_submit *h)
{
    size_t off[6];
    return submit_layout(h, off);
}

size_t kvg_proto_encode_submit(const kvg_submit_view *v, void *buf, size_t cap)
{
    size_t off[6], total = submit_layout(&v->h, off);
    unsigned char *b = buf;

    if (!total || total > cap)
        return 0;
    memset(b, 0, total);
    if (v->h.salt_len)
        memcpy(b + off[0], v->salt, v->h.salt_len);
    if (v->h.n_tokens)
        memcpy(b + off[1], v->tokens, (size_t)v->h.n_tokens * 4);
    if (v->h.n_block_hashes)
        memcpy(b + off[2], v->hashes, (size_t)v->h.n_block_hashes * KVG_PREFIX_HASH_LEN);
    if (v->h.n_stop_ids)
        memcpy(b + off[3], v->stop_ids, (size_t)v->h.n_stop_ids * 4);
    if (v->h.n_stop)
        memcpy(b + off[4], v->stop_len, (size_t)v->h.n_stop * 4);
    if (v->h.stop_bytes)
        memcpy(b + off[5], v->stop_bytes, v->h.stop_bytes);
    return total;
}

static int check_body(const kvg_shm_msg *m, uint32_t type, size_t size, const char *what,
                      char *err, size_t err_len)
{
    uint32_t version;
    if (m->type != type)
        return kvg_fail(err, err_len, "protocol", "expected a %s message, got type %u", what, m->type);
    if (m->body_len != size)
        return kvg_fail(err, err_len, "protocol", "%s body of %u bytes, expected %zu", what, m->body_len, size);
    memcpy(&version, m->body, sizeof version);
    if (version != KVG_PROTO_VERSION)
        return kvg_fail(err, err_len, "protocol", "%s of protocol version %u, expected %u", what, version,
                        KVG_PROTO_VERSION);
    return 0;
}

int kvg_proto_decode_submit(const kvg_shm_msg *m, kvg_submit_view *v, uint64_t *id,
                            char *err, size_t err_len)
{
    size_t off[6], total;
    const kvg_msg_submit *h = &v->h;
    const unsigned char *p = m->payload;

    *id = 0;
    memset(v, 0, sizeof *v);
    if (check_body(m, KVG_MSG_SUBMIT, sizeof v->h, "submit", err, err_len) != 0)
        return -1;
    memcpy(&v->h, m->body, sizeof v->h);
    *id = h->request_id;
    if (h->request_id == 0)
        return kvg_fail(err, err_len, "submit", "request id 0 is reserved");
    if (h->flags & ~KVG_SUBMIT_FLAGS)
        return kvg_fail(err, err_len, "submit", "unknown flags 0x%x", h->flags & ~KVG_SUBMIT_FLAGS);
    if (h->n < 1 || h->n > KVG_PROTO_MAX_N)
        return kvg_fail(err, err_len, "submit", "n must be 1..%d, got %u", KVG_PROTO_MAX_N, h->n);
    if (h->max_tokens < 1 || h->max_tokens > (1u << 30))
        return kvg_fail(err, err_len, "submit", "max_tokens must be >= 1, got %u", h->max_tokens);
    if (!(h->temperature >= 0.0f && h->temperature <= 1e6f))
        return kvg_fail(err, err_len, "submit", "temperature must be a finite number >= 0");
    if (!(h->top_p >= 0.0f && h->top_p <= 1.0f))
        return kvg_fail(err, err_len, "submit", "top_p must be in [0, 1]");
    if (h->top_k > (1u << 30))
        return kvg_fail(err, err_len, "submit", "top_k %u is out of range", h->top_k);
    if (h->bucket >= KVG_STATS_BUCKETS)
        return kvg_fail(err, err_len, "submit", "bucket %u out of range", h->bucket);
    if (h->n_tokens < 1)
        return kvg_fail(err, err_len, "submit", "the prompt is empty");
    if (h->salt_len > KVG_PROTO_MAX_SALT)
        return kvg_fail(err, err_len, "submit", "tenant salt of %u bytes (at most %d)", h->salt_len,
                        KVG_PROTO_MAX_SALT);
    if (h->n_stop_ids > KVG_PROTO_MAX_STOP_IDS)
        return kvg_fail(err, err_len, "submit", "%u stop ids (at most %d)", h->n_stop_ids,
                        KVG_PROTO_MAX_STOP_IDS);
    if (h->n_stop > KVG_PROTO_MAX_STOP)
        return kvg_fail(err, err_len, "submit", "%u stop strings (at most %d)", h->n_stop, KVG_PROTO_MAX_STOP);
    if ((h->flags & KVG_SUBMIT_OLD_BYPASS) && h->bucket != KVG_BUCKET_BYPASS)
        return kvg_fail(err, err_len, "submit", "flag 0x%x (bypass) with bucket %u: bypass is bucket 0",
                        KVG_SUBMIT_OLD_BYPASS, h->bucket);
    if (h->bucket == KVG_BUCKET_BYPASS && h->n_block_hashes)
        return kvg_fail(err, err_len, "submit", "a bypass request (bucket 0) carries no block hashes");
    total = submit_layout(h, off);
    if (!total || total != m->payload_len)
        return kvg_fail(err, err_len, "submit", "payload of %u bytes does not match its counts (%zu expected)",
                        m->payload_len, total);
    if ((uintptr_t)p % 8)
        return kvg_fail(err, err_len, "submit", "payload is not 8-byte aligned");
    v->salt = p + off[0];
    v->tokens = (const uint32_t *)(const void *)(p + off[1]);
    v->hashes = (const uint8_t (*)[KVG_PREFIX_HASH_LEN])(p + off[2]);
    v->stop_ids = (const uint32_t *)(const void *)(p + off[3]);
    v->stop_len = (const uint32_t *)(const void *)(p + off[4]);
    v->stop_bytes = (const char *)(p + off[5]);
    {
        size_t sum = 0;
        for (uint32_t i = 0; i < h->n_stop; i++) {
            if (v->stop_len[i] < 1 || v->stop_len[i] > KVG_PROTO_MAX_STOP_LEN)
                return kvg_fail(err, err_len, "submit", "stop string %u has %u bytes (1..%d)", i, v->stop_len[i],
                                KVG_PROTO_MAX_STOP_LEN);
            sum += v->stop_len[i];
        }
        if (sum != h->stop_bytes)
            return kvg_fail(err, err_len, "submit", "stop string lengths sum to %zu, not %u", sum, h->stop_bytes);
        if (h->stop_bytes && memchr(v->stop_bytes, '\0', h->stop_bytes))
            return kvg_fail(err, err_len, "submit", "a stop string contains a NUL byte");
    }
    return 0;
}

/* ---- tokens ---- */

size_t kvg_proto_tokens_size(uint32_t n_tokens, int logprobs, uint32_t text_len)
{
    return pad8((size_t)n_tokens * 4) + (logprobs ? pad8((size_t)n_tokens * 4) : 0) + text_len;
}

size_t kvg_proto_encode_tokens(const uint32_t *ids, const float *logprobs, uint32_t n_tokens,
                               const char *text, uint32_t text_len, void *buf, size_t cap)
{
    size_t total = kvg_proto_tokens_size(n_tokens, logprobs != NULL, text_len), o = 0;
    unsigned char *b = buf;
    if (total > cap)
        return 0;
    memset(b, 0, total);
    if (n_tokens)
        memcpy(b, ids, (size_t)n_tokens * 4);
    o = pad8((size_t)n_tokens * 4);
    if (logprobs) {
        if (n_tokens)
            memcpy(b + o, logprobs, (size_t)n_tokens * 4);
        o += pad8((size_t)n_tokens * 4);
    }
    if (text_len)
        memcpy(b + o, text, text_len);
    return total ? total : 0;
}

int kvg_proto_decode_tokens(const kvg_shm_msg *m, kvg_tokens_view *v, char *err, size_t err_len)
{
    const unsigned char *p = m->payload;
    size_t o;

    memset(v, 0, sizeof *v);
    if (check_body(m, KVG_MSG_TOKENS, sizeof v->h, "tokens", err, err_len) != 0)
        return -1;
    memcpy(&v->h, m->body, sizeof v->h);
    if (v->h.flags & ~KVG_TOKENS_LOGPROBS)
        return kvg_fail(err, err_len, "tokens", "unknown flags 0x%x", v->h.flags);
    if (v->h.n_tokens > (1u << 28) || v->h.text_len > (1u << 30))
        return kvg_fail(err, err_len, "tokens", "counts out of range");
    if (kvg_proto_tokens_size(v->h.n_tokens, (v->h.flags & KVG_TOKENS_LOGPROBS) != 0, v->h.text_len) !=
        m->payload_len)
        return kvg_fail(err, err_len, "tokens", "payload of %u bytes does not match its counts", m->payload_len);
    if ((uintptr_t)p % 8)
        return kvg_fail(err, err_len, "tokens", "payload is not 8-byte aligned");
    v->ids = (const uint32_t *)(const void *)p;
    o = pad8((size_t)v->h.n_tokens * 4);
    if (v->h.flags & KVG_TOKENS_LOGPROBS) {
        v->logprobs = (const float *)(const void *)(p + o);
        o += pad8((size_t)v->h.n_tokens * 4);
    }
    v->text = (const char *)(p + o);
    return 0;
}

int kvg_proto_decode_fixed(const kvg_shm_msg *m, uint32_t type, void *out, size_t size,
                           char *err, size_t err_len)
{
    if (check_body(m, type, size, "fixed", err, err_len) != 0)
        return -1;
    if (m->payload_len != 0)
        return kvg_fail(err, err_len, "protocol", "message type %u carries an unexpected payload", type);
    memcpy(out, m->body, size);
    return 0;
}

int kvg_proto_decode_pause(const kvg_shm_msg *m, kvg_msg_pause *h, int *paused, char *err,
                           size_t err_len)
{
    uint32_t type = m->type == KVG_MSG_RESUME ? KVG_MSG_RESUME : KVG_MSG_PAUSE;
    const char *what = type == KVG_MSG_PAUSE ? "PAUSE" : "RESUME";
    if (check_body(m, type, sizeof *h, what, err, err_len) != 0)
        return -1;
    if (m->payload_len != 0)
        return kvg_fail(err, err_len, "protocol", "%s carries an unexpected payload", what);
    memcpy(h, m->body, sizeof *h);
    /* A new message: its spare field must stay free for a later meaning. */
    if (h->reserved != 0)
        return kvg_fail(err, err_len, "protocol", "%s with reserved field %u (must be 0)", what, h->reserved);
    *paused = type == KVG_MSG_PAUSE;
    return 0;
}

int kvg_proto_decode_samples(const kvg_shm_msg *m, kvg_msg_samples *out, char *err, size_t err_len)
{
    if (check_body(m, KVG_MSG_SAMPLES, sizeof *out, "SAMPLES", err, err_len) != 0)
        return -1;
    if (m->payload_len != 0)
        return kvg_fail(err, err_len, "protocol", "SAMPLES carries an unexpected payload");
    memcpy(out, m->body, sizeof *out);
    if (out->reserved != 0)
        return kvg_fail(err, err_len, "protocol", "SAMPLES with reserved field %u (must be 0)", out->reserved);
    return 0;
}

int kvg_proto_decode_wipe(const kvg_shm_msg *m, kvg_msg_wipe *h, const uint8_t **salt, uint64_t *id,
                          char *err, size_t err_len)
{
    *id = 0;
    *salt = NULL;
    if (check_body(m, KVG_MSG_WIPE, sizeof *h, "WIPE", err, err_len) != 0)
        return -1;
    memcpy(h, m->body, sizeof *h);
    *id = h->request_id;
    if (h->request_id == 0)
        return kvg_fail(err, err_len, "WIPE", "request id 0 is reserved");
    if (h->flags != 0 || h->reserved != 0)
        return kvg_fail(err, err_len, "WIPE", "flags 0x%x and reserved %u must be 0", h->flags, h->reserved);
    if (h->salt_len > KVG_PROTO_MAX_SALT)
        return kvg_fail(err, err_len, "WIPE", "tenant salt of %u bytes (at most %d)", h->salt_len,
                        KVG_PROTO_MAX_SALT);
    if (m->payload_len != h->salt_len)
        return kvg_fail(err, err_len, "WIPE", "payload of %u bytes for a salt of %u", m->payload_len,
                        h->salt_len);
    *salt = m->payload;
    return 0;
}

int kvg_proto_decode_wiped(const kvg_shm_msg *m, kvg_msg_wiped *h, char *err, size_t err_len)
{
    if (check_body(m, KVG_MSG_WIPED, sizeof *h, "WIPED", err, err_len) != 0)
        return -1;
    if (m->payload_len != 0)
        return kvg_fail(err, err_len, "protocol", "WIPED carries an unexpected payload");
    memcpy(h, m->body, sizeof *h);
    if (h->reserved != 0)
        return kvg_fail(err, err_len, "protocol", "WIPED with reserved field %u (must be 0)", h->reserved);
    return 0;
}

int kvg_proto_decode_error(const kvg_shm_msg *m, kvg_msg_error *h, const char **msg,
                           char *err, size_t err_len)
{
    if (check_body(m, KVG_MSG_ERROR, sizeof *h, "error", err, err_len) != 0)
        return -1;
    memcpy(h, m->body, sizeof *h);
    if (h->message_len > KVG_PROTO_MAX_ERROR_LEN || h->message_len != m->payload_len)
        return kvg_fail(err, err_len, "error", "message of %u bytes in a %u-byte payload", h->message_len,
                        m->payload_len);
    *msg = (const char *)m->payload;
    return 0;
}

/* ---- statistics page ---- */

void kvg_stats_write(kvg_stats_page *p, const kvg_stats *s)
{
    uint64_t q = atomic_load_explicit(&p->seq, memory_order_relaxed);
    atomic_store_explicit(&p->seq, q + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    memcpy(&p->s, s, sizeof *s);
    atomic_store_explicit(&p->seq, q + 2, memory_order_release);
}

void kvg_stats_write_load(kvg_stats_page *p, uint64_t load_tokens)
{
    uint64_t q = atomic_load_explicit(&p->seq, memory_order_relaxed);
    atomic_store_explicit(&p->seq, q + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    __atomic_store_n(&p->s.load_tokens, load_tokens, __ATOMIC_RELAXED);
    atomic_store_explicit(&p->seq, q + 2, memory_order_release);
}

int kvg_stats_read(const kvg_stats_page *p, kvg_stats *out)
{
    for (int attempt = 0; attempt < 10000; attempt++) {
        uint64_t a = atomic_load_explicit(&p->seq, memory_order_acquire);
        if (a & 1) {
            if (attempt > 100) {
                struct timespec ts = { 0, 10000 };
                nanosleep(&ts, NULL);
            }
            continue;
        }
        memcpy(out, (const void *)&p->s, sizeof *out);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&p->seq, memory_order_relaxed) == a)
            return out->magic == KVG_STATS_MAGIC ? 0 : -1;
    }
    return -1;
}
