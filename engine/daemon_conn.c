/* One client of the engine daemon: the handshake that hands it a region and its
 * doorbells, the intake of its submissions (validated field by field before anything
 * reaches the scheduler), and its teardown. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "buckets.h"
#include "daemon_conn.h"
#include "daemon_req.h"
#include "errmsg.h"
#include "log.h"

void kvgd_accept(kvg_daemon *d)
{
    for (;;) {
        int fd = accept4(d->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                kvg_log("accept: %s", strerror(errno));
            return;
        }
        dconn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            kvg_log("out of memory accepting a client");
            continue;
        }
        c->d = d;
        c->sock = fd;
        c->bell_in = c->bell_out = -1;
        c->serial = ++d->conn_serial;
        c->sock_tag = (dtag){ TAG_SOCK, c };
        c->bell_tag = (dtag){ TAG_BELL, c };
        struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = &c->sock_tag };
        if (epoll_ctl(d->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
            kvg_log("epoll: %s", strerror(errno));
            close(fd);
            free(c);
            continue;
        }
        c->next = d->conns;
        d->conns = c;
        d->n_conns++;
    }
}

static void refuse(dconn *c, uint32_t status, const char *msg)
{
    kvg_welcome w;
    char err[160];
    memset(&w, 0, sizeof w);
    w.magic = KVG_PROTO_MAGIC;
    w.version = KVG_PROTO_VERSION;
    w.status = status;
    w.engine_pid = (uint32_t)getpid();
    snprintf(w.message, sizeof w.message, "%s", msg);
    kvg_proto_send_welcome(c->sock, &w, NULL, 0, err, sizeof err);
    kvgd_conn_fail(c, "refused: %s", msg);
}

/* Creates the client's region and doorbells and sends the welcome. */
static void handshake(dconn *c, const kvg_hello *h)
{
    kvg_daemon *d = c->d;
    kvg_shm_caps caps = { d->sq_slots, d->cq_slots, d->sq_data, d->cq_data };
    kvg_welcome w;
    char err[256];
    int memfd = -1, fds[KVG_WELCOME_FDS];

    snprintf(c->name, sizeof c->name, "%s", h->name);
    c->pid = h->pid;
    if (h->version != KVG_PROTO_VERSION) {
        snprintf(err, sizeof err, "protocol version %u is not supported; this engine speaks version %u",
                 h->version, KVG_PROTO_VERSION);
        refuse(c, 400, err);
        return;
    }
    if (d->stopping) {
        refuse(c, 503, "the engine is shutting down");
        return;
    }
    c->region_size = kvg_shm_region_size(&caps);
    c->buf_cap = (size_t)(d->sq_data / 2);
    c->buf = aligned_alloc(64, (c->buf_cap + 63) & ~(size_t)63);
    c->unread_cap = d->cq_slots;
    c->unread = calloc(c->unread_cap, sizeof *c->unread);
    memfd = memfd_create("kvgate-region", MFD_CLOEXEC);
    if (!c->buf || !c->unread || memfd < 0 || ftruncate(memfd, (off_t)c->region_size) != 0) {
        refuse(c, 500, "the engine cannot create a region");
        goto out;
    }
    c->region = mmap(NULL, c->region_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (c->region == MAP_FAILED) {
        c->region = NULL;
        refuse(c, 500, "the engine cannot map a region");
        goto out;
    }
    if (kvg_shm_init(c->region, c->region_size, &caps, err, sizeof err) != 0 ||
        kvg_shm_attach(&c->shm, c->region, c->region_size, err, sizeof err) != 0) {
        refuse(c, 500, err);
        goto out;
    }
    c->bell_in = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->bell_out = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->bell_in < 0 || c->bell_out < 0) {
        refuse(c, 500, "the engine cannot create doorbells");
        goto out;
    }
    memset(&w, 0, sizeof w);
    w.magic = KVG_PROTO_MAGIC;
    w.version = KVG_PROTO_VERSION;
    w.engine_pid = (uint32_t)getpid();
    memcpy(w.model_id, d->m->id, sizeof w.model_id);
    snprintf(w.model_name, sizeof w.model_name, "%s", d->served_name);
    snprintf(w.chat_template, sizeof w.chat_template, "%s", d->chat.name);
    snprintf(w.chat_template_source, sizeof w.chat_template_source, "%s", d->chat.source);
    snprintf(w.chat_template_sha256, sizeof w.chat_template_sha256, "%s", d->chat.sha256);
    w.chat_template_origin = (uint32_t)d->chat.origin;
    w.template_bytes = d->chat_bytes;
    snprintf(w.tokenizer_name, sizeof w.tokenizer_name, "%s",
             d->m->tokenizer_file ? d->m->tokenizer_file : d->m->name);
    w.instance = d->instance;
    w.region_bytes = c->region_size;
    w.tokenizer_bytes = d->m->tokenizer_bytes;
    w.stats_bytes = d->stats_size;
    w.index_bytes = d->index_size;
    w.context_length = (uint32_t)d->m->cfg.max_seq_len;
    w.block_tokens = (uint32_t)d->pool->geom.block_tokens;
    w.vocab_size = (uint32_t)d->m->cfg.vocab_size;
    w.bos = d->m->bos;
    w.eos = d->m->eos;
    w.add_bos = (uint32_t)kvg_tokenizer_add_bos(d->m->tokenizer);
    w.max_n = KVG_PROTO_MAX_N;   /* the scheduler's KVG_SCHED_MAX_N is defined from it */
    fds[0] = memfd;
    fds[1] = c->bell_in;
    fds[2] = c->bell_out;
    fds[3] = d->tok_fd;
    fds[4] = d->stats_fd;
    fds[5] = d->index_fd;
    fds[6] = d->chat_fd;
    if (kvg_proto_send_welcome(c->sock, &w, fds, KVG_WELCOME_FDS, err, sizeof err) != 0) {
        kvgd_conn_fail(c, "%s", err);
        goto out;
    }
    {
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &c->bell_tag };
        if (epoll_ctl(d->ep, EPOLL_CTL_ADD, c->bell_in, &ev) != 0) {
            kvgd_conn_fail(c, "epoll: %s", strerror(errno));
            goto out;
        }
    }
    c->up = 1;
    d->counters.clients_total++;
    kvg_log("client %llu connected (%s, pid %u)", (unsigned long long)c->serial, c->name, c->pid);
out:
    if (memfd >= 0)
        close(memfd);            /* our mapping stays; the client got its own descriptor */
}

void kvgd_conn_readable(dconn *c)
{
    char err[256];
    if (c->closing)
        return;
    if (!c->up) {
        kvg_hello h;
        int rc = kvg_proto_recv_hello(c->sock, &h, err, sizeof err);
        if (rc == 1)
            return;
        if (rc != 0) {
            kvgd_conn_fail(c, "%s", err);
            return;
        }
        handshake(c, &h);
        return;
    }
    char b;
    ssize_t n = recv(c->sock, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0)
        kvgd_conn_fail(c, "disconnected");
    else if (n > 0)
        kvgd_conn_fail(c, "protocol violation: data on the socket after the handshake");
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        kvgd_conn_fail(c, "socket: %s", strerror(errno));
}

/* ---- intake ---- */

static void on_submit(dconn *c, const kvg_shm_msg *m)
{
    kvg_daemon *d = c->d;
    const kvg_model_config *mc = &d->m->cfg;
    kvg_submit_view v;
    kvg_sched_req q;
    uint64_t id;
    char err[256], stops[KVG_PROTO_MAX_STOP][KVG_PROTO_MAX_STOP_LEN + 1];
    uint32_t bt = (uint32_t)d->pool->geom.block_tokens;
    int bypass, tenant;

    d->counters.submitted++;
    if (kvg_proto_decode_submit(m, &v, &id, err, sizeof err) != 0) {
        d->counters.protocol_errors++;
        kvgd_reply_error(c, id, 400, "%s", err);
        return;
    }
    if (d->stopping) {
        kvgd_reply_error(c, id, 503, "the engine is shutting down");
        return;
    }
    if (kvg_u64map_find(&c->by_id, id, NULL)) {
        kvgd_reply_error(c, id, 400, "request id %llu is already live", (unsigned long long)id);
        return;
    }
    if (d->waiting >= d->cfg.max_waiting) {
        kvgd_reply_error(c, id, 429, "the engine is saturated: %d requests are waiting to start", d->waiting);
        return;
    }
    if (v.h.n_tokens > (uint32_t)mc->max_seq_len) {
        kvgd_reply_error(c, id, 400, "the prompt has %u tokens, more than the model's context length of %d",
                         v.h.n_tokens, mc->max_seq_len);
        return;
    }
    /* The engine's one vocabulary check: the ids come from another process's memory,
     * and an id past the vocabulary would index past the embedding table. */
    for (uint32_t i = 0; i < v.h.n_tokens; i++)
        if (v.tokens[i] >= (uint32_t)mc->vocab_size) {
            kvgd_reply_error(c, id, 400, "prompt token %u (id %u) is outside the vocabulary of %d", i,
                             v.tokens[i], mc->vocab_size);
            return;
        }
    for (uint32_t i = 0; i < v.h.n_stop_ids; i++)
        if (v.stop_ids[i] >= (uint32_t)mc->vocab_size) {
            kvgd_reply_error(c, id, 400, "stop id %u is outside the vocabulary of %d", v.stop_ids[i],
                             mc->vocab_size);
            return;
        }
    /* The one check of the hash count (the scheduler takes it as a precondition). */
    bypass = v.h.bucket == KVG_BUCKET_BYPASS;
    if (!bypass && v.h.n_block_hashes != v.h.n_tokens / bt) {
        kvgd_reply_error(c, id, 400, "%u block hashes for %u tokens (blocks of %u tokens need %u)",
                         v.h.n_block_hashes, v.h.n_tokens, bt, v.h.n_tokens / bt);
        return;
    }
    /* n_active is a count of samples to start, so at most n (0: all of them). */
    if (v.h.n_active > v.h.n) {
        kvgd_reply_error(c, id, 400, "n_active %u is more than n %u", v.h.n_active, v.h.n);
        return;
    }
    if (v.h.n_holds > KVG_PROTO_MAX_HOLDS || (bypass && v.h.n_holds)) {
        kvgd_reply_error(c, id, 400, "%u holds (at most %d, none when bypassing the cache)", v.h.n_holds,
                         KVG_PROTO_MAX_HOLDS);
        return;
    }
    for (uint32_t i = 0; i < v.h.n_holds; i++)
        if (v.h.hold_blocks[i] < 1 || v.h.hold_blocks[i] > v.h.n_block_hashes || v.h.hold_ms[i] < 1) {
            kvgd_reply_error(c, id, 400, "hold %u: %u blocks for %u ms (1..%u blocks, at least 1 ms)", i,
                             v.h.hold_blocks[i], v.h.hold_ms[i], v.h.n_block_hashes);
            return;
        }
    memset(&q, 0, sizeof q);
    /* The hashes are checked against the salt before the request gets a tenant: a
     * refused request leaves no cache state behind. A bypass request needs no root. */
    if (!bypass && kvg_pc_salt_root(d->pc, d->hasher, v.salt, v.h.salt_len, q.root, err, sizeof err) != 0) {
        kvgd_reply_error(c, id, 500, "%s", err);
        return;
    }
    if (!bypass && v.h.n_block_hashes) {
        /* The hashes are the cache's keys: never trust them, recompute them from the
         * tokens (about 0.3 us a block), so a client's mistake can never serve one
         * prompt's blocks to another. */
        size_t nb;
        if (v.h.n_block_hashes > d->hash_scratch_cap) {
            free(d->hash_scratch);
            d->hash_scratch_cap = 0;
            d->hash_scratch = malloc((size_t)v.h.n_block_hashes * sizeof *d->hash_scratch);
            if (!d->hash_scratch) {
                kvgd_reply_error(c, id, 500, "out of memory");
                return;
            }
            d->hash_scratch_cap = v.h.n_block_hashes;
        }
        if (kvg_prefix_chain(d->hasher, q.root, (const int32_t *)(const void *)v.tokens, v.h.n_tokens, bt,
                             d->hash_scratch, d->hash_scratch_cap, &nb, err, sizeof err) != 0) {
            kvgd_reply_error(c, id, 400, "%s", err);
            return;
        }
        for (size_t i = 0; i < nb; i++)
            if (memcmp(d->hash_scratch[i], v.hashes[i], KVG_PREFIX_HASH_LEN) != 0) {
                kvgd_reply_error(c, id, 400, "block %zu's hash does not match its tokens (a client hashing "
                                 "with another model id, tenant or block size)", i);
                return;
            }
        q.hashes = (const uint8_t (*)[KVG_PREFIX_HASH_LEN])d->hash_scratch;
        q.n_hashes = (int32_t)nb;
    }
    q.prompt = (const int32_t *)(const void *)v.tokens;
    q.n_prompt = (int32_t)v.h.n_tokens;
    /* A bypass request creates no cache state at all: no tenant. The others get one,
     * held by this reference until the scheduler has taken its own. */
    tenant = -1;
    if (!bypass) {
        tenant = kvg_pc_tenant(d->pc, v.salt, v.h.salt_len, 0.0);
        if (tenant < 0) {
            /* Only memory bounds the table, and tenants are reclaimed as their
             * requests end and their blocks go: this clears by itself. */
            kvgd_reply_error(c, id, 503, "the engine is out of memory for tenant records (%d tenants "
                             "live); retry when requests finish", kvg_pc_tenant_count(d->pc));
            return;
        }
    }
    q.tenant = tenant;
    q.bucket = v.h.bucket;
    q.sp.temperature = v.h.temperature;
    q.sp.top_k = (int)v.h.top_k;
    q.sp.top_p = v.h.top_p;
    q.sp.seed = v.h.seed;
    q.n = (int)v.h.n;
    q.n_active = (int)v.h.n_active;
    q.max_tokens = (int32_t)v.h.max_tokens;
    for (int i = 0; i < d->n_stop_ids; i++)
        q.stop_ids[q.n_stop_ids++] = d->stop_ids[i];
    for (uint32_t i = 0; i < v.h.n_stop_ids && q.n_stop_ids < KVG_SCHED_MAX_STOP_IDS; i++) {
        int dup = 0;
        for (int k = 0; k < q.n_stop_ids; k++)
            dup |= q.stop_ids[k] == (int32_t)v.stop_ids[i];
        if (!dup)
            q.stop_ids[q.n_stop_ids++] = (int32_t)v.stop_ids[i];
    }
    {
        size_t off = 0;
        for (uint32_t i = 0; i < v.h.n_stop; i++) {
            memcpy(stops[i], v.stop_bytes + off, v.stop_len[i]);
            stops[i][v.stop_len[i]] = '\0';
            off += v.stop_len[i];
            q.stop[i] = stops[i];
        }
        q.n_stop = (int)v.h.n_stop;
    }
    q.ttl_ms = v.h.cache_ttl_ms == KVG_TTL_PINNED ? KVG_PC_TTL_PINNED : (int64_t)v.h.cache_ttl_ms;
    q.n_holds = (int)v.h.n_holds;
    for (uint32_t i = 0; i < v.h.n_holds; i++) {
        q.hold_blocks[i] = (int32_t)v.h.hold_blocks[i];
        q.hold_ms[i] = (int64_t)v.h.hold_ms[i];
    }
    q.priority = v.h.priority;
    q.logprobs = (v.h.flags & KVG_SUBMIT_LOGPROBS) != 0;

    dreq *r = kvgd_req_new(c, id);
    if (!r) {
        kvg_pc_tenant_put(d->pc, tenant);
        kvgd_conn_fail(c, "out of memory");
        return;
    }
    r->n = (int)v.h.n;
    r->logprobs = (v.h.flags & KVG_SUBMIT_LOGPROBS) != 0;
    r->deadline_ms = v.h.deadline_ms ? kvg_mono_ms() + v.h.deadline_ms : 0;
    r->sched_id = ++d->next_sched_id;
    r->prompt_tokens = v.h.n_tokens;
    q.id = r->sched_id;
    q.user = r;
    int submitted = kvg_sched_submit(d->sched, &q, err, sizeof err);
    kvg_pc_tenant_put(d->pc, tenant);    /* a queued request holds the scheduler's own */
    if (submitted != 0) {
        d->counters.errors++;
        r->error = 1;
        r->err_status = 400;
        snprintf(r->err_msg, sizeof r->err_msg, "%s", err);
        c->dirty = 1;
        return;
    }
    if (kvg_u64map_put(&c->by_id, id, r) != 0) {
        kvgd_req_abort(d, r, 500, "out of memory");
        return;
    }
    r->in_sched = 1;
    d->waiting++;
}

static void on_cancel(dconn *c, const kvg_shm_msg *m)
{
    kvg_msg_cancel k;
    char err[160];
    void *v;

    if (kvg_proto_decode_fixed(m, KVG_MSG_CANCEL, &k, sizeof k, err, sizeof err) != 0) {
        c->d->counters.protocol_errors++;
        kvgd_reply_error(c, 0, 400, "%s", err);
        return;
    }
    if (!kvg_u64map_find(&c->by_id, k.request_id, &v))
        return;                  /* already over: the messages crossed */
    dreq *r = v;
    if (r->silent)
        return;
    r->silent = 1;
    c->d->counters.client_cancels++;
    if (r->in_sched)
        kvg_sched_cancel(c->d->sched, r->sched_id);
    c->dirty = 1;
}

/* PAUSE / RESUME: the client's own backpressure (its HTTP client stopped reading).
 * One of two reasons to hold a request in the scheduler, next to the engine's own
 * (r->backlogged, daemon_output.c): the request is held while either stands. */
static void on_pause(dconn *c, const kvg_shm_msg *m)
{
    kvg_daemon *d = c->d;
    kvg_msg_pause h;
    char err[160];
    int paused;
    void *v;

    if (kvg_proto_decode_pause(m, &h, &paused, err, sizeof err) != 0) {
        d->counters.protocol_errors++;
        kvgd_reply_error(c, 0, 400, "%s", err);
        return;
    }
    /* Not live (ended, cancelled: the messages crossed), or no longer in the
     * scheduler (only its last output is left to deliver): nothing to hold. */
    if (!kvg_u64map_find(&c->by_id, h.request_id, &v))
        return;
    dreq *r = v;
    if (r->silent || !r->in_sched || r->paused == paused)
        return;
    r->paused = paused;
    if (paused) {
        d->counters.pauses++;
        d->counters.paused++;
    } else {
        d->counters.resumes++;
        d->counters.paused--;
    }
    if (!r->backlogged)
        kvg_sched_hold(d->sched, r->sched_id, paused);
}

/* SAMPLES: draw or cancel single samples of a request (self-consistency waves). Like
 * PAUSE, an id that is not live any more is ignored: the messages crossed. */
static void on_samples(dconn *c, const kvg_shm_msg *m)
{
    kvg_daemon *d = c->d;
    kvg_msg_samples k;
    char err[160];
    void *v;

    if (kvg_proto_decode_samples(m, &k, err, sizeof err) != 0) {
        d->counters.protocol_errors++;
        kvgd_reply_error(c, 0, 400, "%s", err);
        return;
    }
    if (!kvg_u64map_find(&c->by_id, k.request_id, &v))
        return;
    dreq *r = v;
    if (r->silent || !r->in_sched)
        return;
    uint32_t mask = r->n >= 32 ? k.cancel_mask : k.cancel_mask & ((1u << r->n) - 1u);
    int draw = k.draw > (uint32_t)r->n ? r->n : (int)k.draw;
    if (draw || mask)
        kvg_sched_samples(d->sched, r->sched_id, draw, mask);
    c->dirty = 1;
}

/* WIPE: an operator's wipe of one tenant in every tier (proto.h kvg_msg_wipe). It runs
 * here, on the loop's thread, between two steps: the scheduler, the prefix cache and its
 * tiers are this thread's, so nothing else is in the middle of using them. The live
 * requests of the tenant are marked first (they commit nothing more), then the cache
 * drops what it holds. The answer is a record of its own, pushed in order with the
 * connection's other output (a full ring delays it, never loses it). */
static void on_wipe(dconn *c, const kvg_shm_msg *m)
{
    kvg_daemon *d = c->d;
    kvg_msg_wipe h;
    const uint8_t *salt;
    uint64_t id;
    int64_t n[3] = { 0, 0, 0 };
    char err[160];
    int marked = 0;

    if (kvg_proto_decode_wipe(m, &h, &salt, &id, err, sizeof err) != 0) {
        d->counters.protocol_errors++;
        kvgd_reply_error(c, id, 400, "%s", err);
        return;
    }
    int t = kvg_pc_tenant_find(d->pc, salt, h.salt_len);
    if (t >= 0)
        marked = kvg_sched_forget_tenant(d->sched, t);
    kvg_pc_wipe_tenant_tiers(d->pc, salt, h.salt_len, &n[0], &n[1], &n[2]);
    dreq *r = kvgd_req_new(c, id);
    if (!r) {
        kvgd_conn_fail(c, "out of memory answering wipe %llu", (unsigned long long)id);
        return;
    }
    r->wipe = 1;
    for (int i = 0; i < 3; i++)
        r->wiped[i] = (uint64_t)(n[i] > 0 ? n[i] : 0);
    c->dirty = 1;
    d->stats_written_ms = 0;     /* the statistics page shows the cache without them at once */
    kvg_log("client %llu wiped a tenant (salt of %u bytes): %lld pool blocks (%d live requests of it "
            "commit nothing more), %lld host, %lld disk", (unsigned long long)c->serial, h.salt_len,
            (long long)n[0], marked, (long long)n[1], (long long)n[2]);
}

void kvgd_conn_intake(dconn *c)
{
    char err[256];
    int popped = 0;

    if (!c->up || c->closing)
        return;
    /* A bounded number per loop iteration, so one busy client cannot keep the
     * scheduler from stepping. */
    for (int i = 0; i < 256; i++) {
        kvg_shm_msg m;
        int rc = kvg_shm_try_pop(&c->shm.sq, &m, c->buf, c->buf_cap, err, sizeof err);
        if (rc == KVG_SHM_EMPTY)
            break;
        if (rc < 0) {
            c->d->counters.protocol_errors++;
            kvgd_conn_fail(c, "corrupt submission ring: %s", err);
            return;
        }
        popped = 1;
        if (m.type == KVG_MSG_SUBMIT)
            on_submit(c, &m);
        else if (m.type == KVG_MSG_CANCEL)
            on_cancel(c, &m);
        else if (m.type == KVG_MSG_PAUSE || m.type == KVG_MSG_RESUME)
            on_pause(c, &m);
        else if (m.type == KVG_MSG_SAMPLES)
            on_samples(c, &m);
        else if (m.type == KVG_MSG_WIPE)
            on_wipe(c, &m);
        else {
            c->d->counters.protocol_errors++;
            kvgd_reply_error(c, 0, 400, "unknown message type %u", m.type);
        }
        if (c->closing)
            return;
    }
    if (popped && kvg_shm_consumer_take_waiter(&c->shm.sq)) {
        uint64_t one = 1;
        if (write(c->bell_out, &one, sizeof one) < 0) {
            /* saturated counter: the client is woken anyway */
        }
    }
}

void kvgd_conn_close(dconn *c)
{
    kvg_daemon *d = c->d;
    int cancelled = 0;

    for (dconn **p = &d->conns; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    d->n_conns--;
    epoll_ctl(d->ep, EPOLL_CTL_DEL, c->sock, NULL);
    if (c->bell_in >= 0)
        epoll_ctl(d->ep, EPOLL_CTL_DEL, c->bell_in, NULL);
    /* Orphan every request first, then cancel: the scheduler's events for them (sent
     * from inside kvg_sched_cancel) free them without touching the connection. */
    while (c->head) {
        dreq *r = c->head;
        c->head = r->next;
        r->conn = NULL;
        r->prev = r->next = NULL;
        if (r->in_sched) {
            cancelled++;
            kvg_sched_cancel(d->sched, r->sched_id);
        } else {
            kvgd_req_free(r);
        }
    }
    if (c->up || c->why[0])
        kvg_log("client %llu (%s, pid %u) %s%s", (unsigned long long)c->serial, c->name[0] ? c->name : "?",
                 c->pid, c->why[0] ? c->why : "closed",
                 cancelled ? "; its running requests were cancelled" : "");
    if (c->region)
        munmap(c->region, c->region_size);
    close(c->sock);
    if (c->bell_in >= 0)
        close(c->bell_in);
    if (c->bell_out >= 0)
        close(c->bell_out);
    kvg_u64map_free(&c->by_id);
    free(c->buf);
    free(c->out);
    free(c->unread);
    free(c);
}
