/* The engine daemon: socket, loop, stop, statistics page; the top of the daemon's
 * layers (daemon_internal.h). See daemon.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cpu_relax.h"
#include "daemon_conn.h"
#include "daemon_output.h"
#include "daemon_req.h"
#include "errmsg.h"
#include "cache_index.h"
#include "kv_disk.h"
#include "kv_host.h"
#include "log.h"
#include "monoclock.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

static uint64_t next_pow2(uint64_t v)
{
    uint64_t p = 1;
    while (p < v)
        p <<= 1;
    return p;
}

/* A memfd holding bytes, sealed so that no one can change them. */
static int sealed_memfd(const char *name, const void *bytes, size_t len)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    const unsigned char *p = bytes;
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, p + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)n;
    }
    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
    return fd;
}

/* The heartbeat (proto.h): the loop went round once more, or a step reached its next
 * layer (the forward pass calls this). A relaxed store: clients only look for a change. */
static void heartbeat(void *arg)
{
    kvg_daemon *d = arg;
    atomic_store_explicit(&d->stats->heartbeat, ++d->beats, memory_order_relaxed);
}

kvg_daemon *kvg_daemon_new(const kvg_model *m, kvg_forward *fw, kvg_prefix_cache *pc,
                           kvg_kv_pool *pool, const kvg_sched_config *scfg,
                           const kvg_daemon_config *cfg, char *err, size_t err_len)
{
    kvg_daemon *d;

    if (!m || !fw || !pc || !pool || !cfg || !cfg->socket_path) {
        kvg_set_err(err, err_len, "engine daemon: model, forward pass, cache, pool and socket are required");
        return NULL;
    }
    if (!m->tokenizer || (!m->tokenizer_file && !m->tokenizer_blob)) {
        kvg_set_err(err, err_len, "%s: the engine needs a tokenizer to serve clients (--tokenizer)", m->name);
        return NULL;
    }
    d = calloc(1, sizeof *d);
    if (!d) {
        kvg_set_err(err, err_len, "engine daemon: out of memory");
        return NULL;
    }
    d->cfg = *cfg;
    d->m = m;
    d->fw = fw;
    d->pc = pc;
    d->pool = pool;
    d->ep = d->listen_fd = d->stop_fd = d->tok_fd = d->chat_fd = d->stats_fd = d->index_fd = -1;
    if (d->cfg.socket_mode < 0)
        d->cfg.socket_mode = 0660;
    if (d->cfg.max_waiting <= 0)
        d->cfg.max_waiting = 256;
    if (d->cfg.drain_timeout_ms == 0)
        d->cfg.drain_timeout_ms = 10000;
    if (d->cfg.hold_tokens <= 0)
        d->cfg.hold_tokens = 256;
    if (d->cfg.busy_poll_us == 0)
        d->cfg.busy_poll_us = 50;
    snprintf(d->served_name, sizeof d->served_name, "%s", cfg->served_name ? cfg->served_name : m->name);
    if (cfg->chat)
        d->chat = *cfg->chat;
    else
        kvg_chat_template_describe(&d->chat, KVG_CHAT_NONE, NULL, NULL, NULL, 0);
    /* Generation always ends at EOS; llama2.c models also end at BOS, as run.c does
     * (their training data separates stories with BOS). */
    if (m->eos >= 0)
        d->stop_ids[d->n_stop_ids++] = m->eos;
    if (m->bos >= 0 && strcmp(m->format, "llama2c") == 0 && m->bos != m->eos)
        d->stop_ids[d->n_stop_ids++] = m->bos;

    /* The largest valid submission: the whole context, every hash, every stop. */
    {
        kvg_msg_submit h;
        memset(&h, 0, sizeof h);
        h.salt_len = KVG_PROTO_MAX_SALT;
        h.n_tokens = (uint32_t)m->cfg.max_seq_len;
        h.n_block_hashes = (uint32_t)(m->cfg.max_seq_len / pool->geom.block_tokens);
        h.n_stop_ids = KVG_PROTO_MAX_STOP_IDS;
        h.n_stop = KVG_PROTO_MAX_STOP;
        h.stop_bytes = KVG_PROTO_MAX_STOP * KVG_PROTO_MAX_STOP_LEN;
        d->max_submit = kvg_proto_submit_size(&h);
    }
    d->sq_data = cfg->sq_data_bytes ? cfg->sq_data_bytes : next_pow2(2 * (uint64_t)d->max_submit);
    if (d->sq_data < 65536 && !cfg->sq_data_bytes)
        d->sq_data = 65536;
    d->cq_data = cfg->cq_data_bytes ? cfg->cq_data_bytes : ((uint64_t)1 << 20);
    d->sq_slots = cfg->ring_slots ? cfg->ring_slots : 256;
    d->cq_slots = cfg->ring_slots ? cfg->ring_slots : 1024;
    {
        kvg_shm_caps caps = { d->sq_slots, d->cq_slots, d->sq_data, d->cq_data };
        if (!kvg_shm_region_size(&caps)) {
            kvg_set_err(err, err_len, "engine daemon: ring sizes must be powers of two (slots up to %u, data "
                        "%u bytes to 2 GiB)", KVG_SHM_SLOTS_MAX, KVG_SHM_DATA_MIN);
            goto fail;
        }
        if (d->cq_data < 4096) {
            kvg_set_err(err, err_len, "engine daemon: the completion ring's data area must be >= 4096 bytes");
            goto fail;
        }
    }
    d->hasher = kvg_prefix_hasher_new(err, err_len);
    if (!d->hasher)
        goto fail;
    d->sched = kvg_sched_new(m, fw, pc, pool, scfg, kvgd_sched_event, d, err, err_len);
    if (!d->sched)
        goto fail;

    /* The tokenizer clients load: the very file the model loaded it from (opened
     * now, so a later change on disk cannot make the two disagree), or its bytes. */
    if (m->tokenizer_file) {
        struct stat st;
        d->tok_fd = open(m->tokenizer_file, O_RDONLY | O_CLOEXEC);
        if (d->tok_fd < 0 || fstat(d->tok_fd, &st) != 0 || (uint64_t)st.st_size != m->tokenizer_bytes) {
            kvg_set_err(err, err_len, "%s: cannot reopen the tokenizer file (or it changed since loading)",
                        m->tokenizer_file);
            goto fail;
        }
    } else {
        d->tok_fd = sealed_memfd("kvgate-tokenizer", m->tokenizer_blob, m->tokenizer_bytes);
        if (d->tok_fd < 0) {
            kvg_set_err(err, err_len, "engine daemon: cannot create the tokenizer memfd: %s", strerror(errno));
            goto fail;
        }
    }
    /* The chat template's source, the same way (empty when there is none). */
    d->chat_bytes = d->chat.origin != KVG_CHAT_NONE && cfg->chat_src ? cfg->chat_len : 0;
    d->chat_fd = sealed_memfd("kvgate-chat-template", cfg->chat_src, (size_t)d->chat_bytes);
    if (d->chat_fd < 0) {
        kvg_set_err(err, err_len, "engine daemon: cannot create the chat template memfd: %s", strerror(errno));
        goto fail;
    }
    /* The statistics page: clients map it read-only; the seal forbids any new
     * writable mapping, so only this process can write it. */
    d->stats_size = (sizeof(kvg_stats_page) + 4095) & ~(size_t)4095;
    d->stats_fd = memfd_create("kvgate-stats", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (d->stats_fd < 0 || ftruncate(d->stats_fd, (off_t)d->stats_size) != 0) {
        kvg_set_err(err, err_len, "engine daemon: cannot create the statistics page: %s", strerror(errno));
        goto fail;
    }
    d->stats = mmap(NULL, d->stats_size, PROT_READ | PROT_WRITE, MAP_SHARED, d->stats_fd, 0);
    if (d->stats == MAP_FAILED) {
        d->stats = NULL;
        kvg_set_err(err, err_len, "engine daemon: cannot map the statistics page: %s", strerror(errno));
        goto fail;
    }
    fcntl(d->stats_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
    /* A long step moves the heartbeat too, once a layer. */
    kvg_forward_set_progress(fw, heartbeat, d);
    /* The cache index: which chain hashes the cache holds, for a gateway routing over
     * several engines. Sealed like the statistics page; the prefix cache keeps it
     * equal to its table from here on. */
    {
        uint32_t cap = kvg_cache_index_capacity_for(pool->n_blocks);
        d->index_size = kvg_cache_index_page_bytes(cap);
        d->index_fd = memfd_create("kvgate-cache-index", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (!d->index_size || d->index_fd < 0 || ftruncate(d->index_fd, (off_t)d->index_size) != 0) {
            kvg_set_err(err, err_len, "engine daemon: cannot create the cache index for %d blocks: %s",
                        (int)pool->n_blocks, d->index_size ? strerror(errno) : "too many");
            goto fail;
        }
        d->index = mmap(NULL, d->index_size, PROT_READ | PROT_WRITE, MAP_SHARED, d->index_fd, 0);
        if (d->index == MAP_FAILED) {
            d->index = NULL;
            kvg_set_err(err, err_len, "engine daemon: cannot map the cache index: %s", strerror(errno));
            goto fail;
        }
        fcntl(d->index_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
        d->index_w = kvg_cache_index_writer_new(d->index, d->index_size, cap, err, err_len);
        if (!d->index_w)
            goto fail;
        if (kvg_pc_set_index(pc, d->index_w) != 0) {
            kvg_set_err(err, err_len, "engine daemon: the cache index cannot take the cache's blocks");
            goto fail;
        }
    }
    if (getrandom(&d->instance, sizeof d->instance, 0) != (ssize_t)sizeof d->instance)
        d->instance = (uint64_t)kvg_unix_ms() ^ ((uint64_t)getpid() << 32);
    d->start_unix_ms = kvg_unix_ms();

    d->ep = epoll_create1(EPOLL_CLOEXEC);
    d->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (d->ep < 0 || d->stop_fd < 0) {
        kvg_set_err(err, err_len, "engine daemon: epoll/eventfd: %s", strerror(errno));
        goto fail;
    }
    d->stop_tag = (dtag){ TAG_STOP, NULL };
    d->listen_tag = (dtag){ TAG_LISTEN, NULL };
    {
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &d->stop_tag };
        if (epoll_ctl(d->ep, EPOLL_CTL_ADD, d->stop_fd, &ev) != 0) {
            kvg_set_err(err, err_len, "engine daemon: epoll: %s", strerror(errno));
            goto fail;
        }
    }
    /* The disk tier's reader signals each read that ends: a request waiting for its
     * blocks is admitted at once, not at the next poll. */
    d->disk_tag = (dtag){ TAG_DISK, NULL };
    if (kvg_pc_disk_fd(pc) >= 0) {
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &d->disk_tag };
        if (epoll_ctl(d->ep, EPOLL_CTL_ADD, kvg_pc_disk_fd(pc), &ev) != 0) {
            kvg_set_err(err, err_len, "engine daemon: epoll: %s", strerror(errno));
            goto fail;
        }
    }
    return d;
fail:
    kvg_daemon_free(d);
    return NULL;
}

static void close_listener(kvg_daemon *d)
{
    struct stat now;
    if (d->listen_fd < 0)
        return;
    /* Remove the socket file only if it still is the one we bound. */
    if (lstat(d->cfg.socket_path, &now) == 0 && now.st_ino == d->sock_ino && now.st_dev == d->sock_dev)
        unlink(d->cfg.socket_path);
    epoll_ctl(d->ep, EPOLL_CTL_DEL, d->listen_fd, NULL);
    close(d->listen_fd);
    d->listen_fd = -1;
    d->listening = 0;
}

void kvg_daemon_free(kvg_daemon *d)
{
    if (!d)
        return;
    while (d->conns)
        kvgd_conn_close(d->conns);
    close_listener(d);
    if (d->stats)
        kvg_forward_set_progress(d->fw, NULL, NULL);   /* the forward pass outlives the daemon */
    kvg_sched_free(d->sched);
    kvg_prefix_hasher_free(d->hasher);
    if (d->index_w) {
        kvg_pc_set_index(d->pc, NULL);   /* the cache outlives the daemon */
        kvg_cache_index_writer_free(d->index_w);
    }
    if (d->index)
        munmap(d->index, d->index_size);
    if (d->index_fd >= 0)
        close(d->index_fd);
    if (d->stats)
        munmap(d->stats, d->stats_size);
    if (d->stats_fd >= 0)
        close(d->stats_fd);
    if (d->tok_fd >= 0)
        close(d->tok_fd);
    if (d->chat_fd >= 0)
        close(d->chat_fd);
    if (d->stop_fd >= 0)
        close(d->stop_fd);
    if (d->ep >= 0)
        close(d->ep);
    free(d->hash_scratch);
    free(d);
}

int kvg_daemon_warmup(kvg_daemon *d, const kvg_warmup *w, kvg_warmup_result *res, char *err, size_t err_len)
{
    kvg_warmup_opts o = { (uint64_t)1 << 62, 1 };
    d->in_warmup = 1;
    int rc = kvg_warmup_run(w, d->sched, d->pc, d->pool, &o, res, err, err_len);
    d->in_warmup = 0;
    return rc;
}

int kvg_daemon_listen(kvg_daemon *d, char *err, size_t err_len)
{
    const char *path = d->cfg.socket_path;
    struct sockaddr_un sa;
    struct stat st;
    int s;

    if (strlen(path) >= sizeof sa.sun_path)
        return kvg_fail(err, err_len, path, "socket path longer than %zu bytes", sizeof sa.sun_path - 1);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    strcpy(sa.sun_path, path);
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return kvg_fail(err, err_len, path, "exists and is not a socket; refusing to replace it");
        s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (s < 0)
            return kvg_fail(err, err_len, path, "socket: %s", strerror(errno));
        int rc = connect(s, (struct sockaddr *)&sa, sizeof sa), e = errno;
        close(s);
        if (rc == 0 || e == EPROTOTYPE || e == EAGAIN)
            return kvg_fail(err, err_len, path, "another engine (or another program) is listening on this socket; "
                            "stop it first or choose another --socket");
        if (e != ECONNREFUSED)
            return kvg_fail(err, err_len, path, "cannot check the existing socket: %s", strerror(e));
        /* Nobody answers: the file was left by an engine that died. */
        if (unlink(path) != 0)
            return kvg_fail(err, err_len, path, "cannot remove the stale socket: %s", strerror(errno));
        kvg_log("replaced the stale socket %s", path);
    }
    s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return kvg_fail(err, err_len, path, "socket: %s", strerror(errno));
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(s);
        return kvg_fail(err, err_len, path, "bind: %s", strerror(e));
    }
    if (chmod(path, (mode_t)d->cfg.socket_mode) != 0 ||
        (d->cfg.socket_gid >= 0 && chown(path, (uid_t)-1, (gid_t)d->cfg.socket_gid) != 0)) {
        int e = errno;
        close(s);
        unlink(path);
        return kvg_fail(err, err_len, path, "cannot set the socket's mode or group: %s", strerror(e));
    }
    if (lstat(path, &st) == 0) {
        d->sock_ino = st.st_ino;
        d->sock_dev = st.st_dev;
    }
    if (listen(s, 128) != 0) {
        int e = errno;
        close(s);
        unlink(path);
        return kvg_fail(err, err_len, path, "listen: %s", strerror(e));
    }
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &d->listen_tag };
    if (epoll_ctl(d->ep, EPOLL_CTL_ADD, s, &ev) != 0) {
        int e = errno;
        close(s);
        unlink(path);
        return kvg_fail(err, err_len, path, "epoll: %s", strerror(e));
    }
    d->listen_fd = s;
    d->listening = 1;
    return 0;
}

void kvg_daemon_request_stop(kvg_daemon *d)
{
    uint64_t one = 1;
    d->stop_requests++;
    if (write(d->stop_fd, &one, sizeof one) < 0) {
        /* counter saturated: a stop is pending anyway */
    }
}

/* ---- statistics ---- */

/* A tenant's name for the statistics page, NUL-terminated in out: a named tenant's
 * salt as it is; a location's default tenant (its salt opens with
 * KVG_PREFIX_DEFAULT_MARK, which no name holds) as its configured name marked
 * " (default)", so the page stays readable and tells the two apart. */
static void tenant_label(char *out, size_t cap, const void *salt, size_t len)
{
    static const char mark[] = " (default)";
    const void *name;
    size_t n;
    int def = kvg_prefix_salt_is_default(salt, len, &name, &n);
    size_t room = cap - 1 - (def ? sizeof mark - 1 : 0);
    if (n > room)
        n = room;
    memcpy(out, name, n);
    if (def)
        memcpy(out + n, mark, sizeof mark - 1);
    out[n + (def ? sizeof mark - 1 : 0)] = '\0';
}

static void write_stats(kvg_daemon *d)
{
    kvg_stats s = d->counters;
    kvg_pc_stats pcs;
    kvg_sched_stats ss;
    int nt;

    kvg_pc_get_stats(d->pc, &pcs);
    kvg_sched_get_stats(d->sched, &ss);
    s.magic = KVG_STATS_MAGIC;
    s.version = KVG_PROTO_VERSION;
    s.instance = d->instance;
    s.start_unix_ms = d->start_unix_ms;
    s.updated_unix_ms = kvg_unix_ms();
    s.blocks_total = pcs.blocks_total;
    s.blocks_free = pcs.blocks_free;
    s.blocks_cached = pcs.blocks_cached;
    s.blocks_used = pcs.blocks_used;
    s.blocks_pinned = pcs.blocks_pinned;
    s.block_tokens = d->pool->geom.block_tokens;
    s.query_tokens = pcs.query_tokens;
    s.hit_tokens = pcs.hit_tokens;
    s.evictions_lru = pcs.evictions[KVG_EVICT_LRU];
    s.evictions_ttl = pcs.evictions[KVG_EVICT_TTL];
    s.evictions_quota = pcs.evictions[KVG_EVICT_QUOTA];
    s.recompute_tokens = pcs.recompute_tokens;
    s.recompute_hit_tokens = pcs.recompute_hit_tokens;
    {
        kvg_kv_disk_stats ds;
        if (kvg_pc_disk_stats(d->pc, &ds) == 0) {
            s.disk_slots_total = ds.slots_total;
            s.disk_slots_used = ds.slots_used;
            s.disk_hit_tokens = pcs.disk_hit_tokens;
            s.disk_blocks_read = ds.hits;
            s.disk_blocks_written = ds.blocks_written;
            s.disk_bytes_read = ds.bytes_read;
            s.disk_bytes_written = ds.bytes_written;
            s.disk_read_seconds = ds.read_seconds;
            s.disk_write_seconds = ds.write_seconds;
            s.disk_evictions = ds.evictions;
            s.disk_dropped = ds.dropped;
            s.disk_corrupt = ds.corrupt;
            s.disk_io_errors = ds.io_errors;
            s.disk_quota_evictions = ds.quota_evictions;
            s.disk_expired = ds.expired;
            s.disk_reader_blocks = ds.async_reads;
            s.disk_staging_full = ds.read_staging_full;
            s.disk_reads_in_flight = ds.reads_in_flight;
        }
    }
    {
        kvg_kv_host_stats hs;
        if (kvg_pc_host_stats(d->pc, &hs) == 0) {
            s.host_slots_total = hs.slots_total;
            s.host_slots_used = hs.slots_used;
            s.host_hit_tokens = pcs.host_hit_tokens;
            s.host_blocks_in = hs.hits;
            s.host_blocks_out = hs.puts;
            s.host_bytes_in = hs.bytes_in;
            s.host_bytes_out = hs.bytes_out;
            s.host_seconds = hs.seconds;
            s.host_evictions = hs.evictions;
            s.host_spilled = hs.spilled;
        }
    }
    s.steps = ss.steps;
    s.preemptions = ss.preemptions;
    s.rejected = ss.rejected;
    s.cancelled = ss.cancelled;
    s.prefill_tokens = ss.prefill_tokens;
    s.decode_tokens = ss.decode_tokens;
    s.prefill_seconds = ss.prefill_s;
    s.decode_seconds = ss.decode_s;
    s.ttft_count = ss.ttft_count;
    s.ttft_sum_seconds = ss.ttft_sum_s;
    s.ttft_max_seconds = ss.ttft_max_s;
    s.waiting = ss.waiting;
    s.running = ss.running;
    s.held = ss.held;
    s.samples_started = ss.samples_started;
    s.samples_cancelled = ss.samples_cancelled;
    s.samples_dropped = ss.samples_dropped;
    s.load_tokens = ss.load_tokens;
    s.clients = 0;
    for (dconn *c = d->conns; c; c = c->next)
        s.clients += c->up;
    /* the scheduler's buckets are the page's (KVG_SCHED_BUCKETS is defined from it) */
    for (int b = 0; b < KVG_STATS_BUCKETS; b++) {
        s.bucket[b].requests = ss.bucket[b].requests;
        s.bucket[b].prompt_tokens = ss.bucket[b].prompt_tokens;
        s.bucket[b].cached_tokens = ss.bucket[b].cached_tokens;
        s.bucket[b].completion_tokens = ss.bucket[b].completion_tokens;
    }
    /* The tenants holding the most cached blocks (a bounded label set for metrics). */
    s.n_tenants = 0;
    s.other_tenants = 0;
    s.other_cached_blocks = 0;
    s.live_tenants = kvg_pc_tenant_count(d->pc);
    /* Ids are slots, some free (a reclaimed tenant's): the names are copied now, so
     * the page never holds an id that could be reused. */
    nt = kvg_pc_tenant_slots(d->pc);
    for (int t = 0; t < nt; t++) {
        int32_t blocks = kvg_pc_tenant_cached_blocks(d->pc, t);
        size_t len;
        const void *salt = kvg_pc_tenant_salt(d->pc, t, &len);
        if (blocks <= 0 || !salt)
            continue;
        int pos = s.n_tenants;
        while (pos > 0 && s.tenant[pos - 1].cached_blocks < blocks)
            pos--;
        if (pos >= KVG_STATS_TENANTS) {
            s.other_tenants++;
            s.other_cached_blocks += blocks;
            continue;
        }
        if (s.n_tenants == KVG_STATS_TENANTS) {
            s.other_tenants++;
            s.other_cached_blocks += s.tenant[KVG_STATS_TENANTS - 1].cached_blocks;
        } else {
            s.n_tenants++;
        }
        memmove(&s.tenant[pos + 1], &s.tenant[pos], (size_t)(s.n_tenants - 1 - pos) * sizeof s.tenant[0]);
        memset(&s.tenant[pos], 0, sizeof s.tenant[pos]);
        tenant_label(s.tenant[pos].name, sizeof s.tenant[pos].name, salt, len);
        s.tenant[pos].cached_blocks = blocks;
    }
    kvg_stats_write(d->stats, &s);
    d->stats_written_ms = kvg_mono_ms();
}

/* ---- the loop ---- */

static void begin_stop(kvg_daemon *d)
{
    int64_t now = kvg_mono_ms();
    if (!d->stopping) {
        d->stopping = 1;
        d->stop_deadline_ms = d->cfg.drain_timeout_ms < 0 ? now : now + d->cfg.drain_timeout_ms;
        close_listener(d);
        kvg_log("stopping: %d request(s) in flight, draining for up to %d ms", kvg_sched_pending(d->sched),
                 d->cfg.drain_timeout_ms < 0 ? 0 : d->cfg.drain_timeout_ms);
    } else {
        d->stop_deadline_ms = now;
    }
}


/* Spins up to us microseconds for a client to push something; 1 when one did. */
static int busy_poll(kvg_daemon *d, int us)
{
    uint64_t t0 = kvg_mono_ns();
    for (;;) {
        for (dconn *c = d->conns; c; c = c->next)
            if (c->up && !c->closing && kvg_shm_can_pop(&c->shm.sq))
                return 1;
        if (d->stop_requests)
            return 1;
        if (kvg_mono_ns() - t0 >= (uint64_t)us * 1000u)
            return 0;
        kvg_cpu_relax();
    }
}

static void check_deadlines(kvg_daemon *d, int64_t now)
{
    for (dconn *c = d->conns; c; c = c->next)
        for (dreq *r = c->head, *next; r; r = next) {
            next = r->next;
            if (r->in_sched && r->deadline_ms && now >= r->deadline_ms && !r->expired) {
                r->expired = 1;
                kvg_sched_cancel(d->sched, r->sched_id);
            }
        }
}

static void abort_all(kvg_daemon *d, const char *why)
{
    for (dconn *c = d->conns; c; c = c->next)
        for (dreq *r = c->head, *next; r; r = next) {
            next = r->next;
            if (r->in_sched)
                kvgd_req_abort(d, r, 503, why);
        }
}

int kvg_daemon_run(kvg_daemon *d, char *err, size_t err_len)
{
    struct epoll_event evs[64];
    int last_rows = 0, finishing = 0, did_work = 0;

    write_stats(d);
    for (;;) {
        int pending = kvg_sched_pending(d->sched);
        int timeout;
        heartbeat(d);
        if (pending && last_rows > 0)
            timeout = 0;
        else if (pending)
            timeout = 10;        /* everything is held or waiting for blocks: poll gently
                                    (a disk read that ends wakes it at once: TAG_DISK) */
        else if (d->stopping)
            timeout = 0;
        else
            timeout = KVG_HEARTBEAT_IDLE_MS;   /* an idle engine is not a silent one; cached
                                                  blocks expire while idle too */
        if (d->stopping && timeout != 0) {
            int64_t left = d->stop_deadline_ms - kvg_mono_ms();
            timeout = left <= 0 ? 0 : (timeout < 0 || left < timeout ? (int)left : timeout);
        }
        /* Going to sleep right after work: a client answering at once (the next
         * request of a conversation, a benchmark) is caught without a wake-up. */
        if (timeout != 0 && did_work && d->cfg.busy_poll_us > 0 && busy_poll(d, d->cfg.busy_poll_us))
            timeout = 0;
        int n = epoll_wait(d->ep, evs, 64, timeout);
        if (n < 0 && errno != EINTR)
            return kvg_fail(err, err_len, "engine daemon", "epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            dtag *t = evs[i].data.ptr;
            uint64_t v;
            switch (t->kind) {
            case TAG_LISTEN:
                kvgd_accept(d);
                break;
            case TAG_STOP:
                if (read(d->stop_fd, &v, sizeof v) == (ssize_t)sizeof v)
                    for (uint64_t k = 0; k < v && k < 2; k++)
                        begin_stop(d);
                break;
            case TAG_SOCK:
                kvgd_conn_readable(t->conn);
                break;
            case TAG_DISK:
                if (read(kvg_pc_disk_fd(d->pc), &v, sizeof v) < 0) {
                    /* EAGAIN: already cleared */
                }
                break;
            case TAG_BELL:
                if (read(t->conn->bell_in, &v, sizeof v) < 0) {
                    /* EAGAIN: already cleared */
                }
                break;
            }
        }
        /* Every client's submissions (a peek per client when there are none). */
        uint64_t submitted = d->counters.submitted;
        for (dconn *c = d->conns; c; c = c->next)
            kvgd_conn_intake(c);
        /* New work's load goes on the page before the step runs (a long prefill can
         * take many milliseconds): gateways route the next requests by it, and a
         * stale one sends a burst to the engine that only looks idle. The one field,
         * not the whole page: this runs for every arrival. */
        if (d->counters.submitted != submitted)
            kvg_stats_write_load(d->stats, kvg_sched_load(d->sched));

        int64_t now = kvg_mono_ms();
        check_deadlines(d, now);
        if (now - d->last_sweep_ms >= 1000) {
            if (kvg_pc_sweep(d->pc, now) > 0)
                d->stats_written_ms = 0;
            d->last_sweep_ms = now;
        }
        if (d->stopping && !finishing && (kvg_sched_pending(d->sched) == 0 || now >= d->stop_deadline_ms)) {
            abort_all(d, "the engine shut down before the request finished");
            finishing = 1;
        }
        last_rows = 0;
        if (kvg_sched_pending(d->sched) > 0) {
            char serr[256];
            last_rows = kvg_sched_step(d->sched, serr, sizeof serr);
            if (last_rows < 0) {
                /* The batch's requests were failed with this error; the engine goes on. */
                kvg_log("step failed: %s", serr);
                last_rows = 0;
            }
        }
        /* The page is due before a DONE goes out (a client reading statistics right
         * after its answer sees them), and otherwise every 20 ms while busy. */
        now = kvg_mono_ms();
        if (d->stats_written_ms == 0 || now - d->stats_written_ms >= 20 ||
            (kvg_sched_pending(d->sched) == 0 && last_rows == 0))
            write_stats(d);
        did_work = last_rows > 0;
        for (dconn *c = d->conns; c; c = c->next)
            if (c->dirty || c->blocked) {
                kvgd_conn_flush(c);
                did_work = 1;
            }
        for (dconn *c = d->conns, *next; c; c = next) {
            next = c->next;
            if (c->closing)
                kvgd_conn_close(c);
        }
        if (d->stats_written_ms == 0)
            write_stats(d);      /* closing a client cancelled requests */
        if (finishing && kvg_sched_pending(d->sched) == 0) {
            int left = 0;
            for (dconn *c = d->conns; c; c = c->next)
                left += c->blocked;
            /* Give slow readers the drain time to take their last messages. */
            if (!left || kvg_mono_ms() >= d->stop_deadline_ms + 1000)
                break;
        }
    }
    write_stats(d);
    while (d->conns)
        kvgd_conn_close(d->conns);
    kvg_log("stopped");
    return 0;
}
