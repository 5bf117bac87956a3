/* The disk tier's store: one file of fixed-size slots, an in-memory index (chain hash
 * -> slot) rebuilt from the slot headers when the file is opened, an LRU over the
 * slots, a writer thread draining a bounded queue of blocks to write, and a reader
 * thread serving a queue of asynchronous reads. See kv_disk.h for the format and the
 * threading rules. */
#include "kv_disk.h"
#include "kv_disk_testing.h"
#include "crc32c.h"
#include "errmsg.h"
#include "log.h"
#include "u64map.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NIL (-1)
#define HDR KVG_KV_DISK_HDR_BYTES
#define HLEN KVG_KV_DISK_ID_LEN

_Static_assert(offsetof(kvg_kv_disk_hdr, hash) == 80, "slot header layout");
_Static_assert(offsetof(kvg_kv_disk_hdr, seq) == 144, "slot header layout");
_Static_assert(offsetof(kvg_kv_disk_hdr, expires_unix_ms) == 160, "slot header layout");
_Static_assert(offsetof(kvg_kv_disk_hdr, hdr_crc) == 168, "slot header layout");
_Static_assert(sizeof(kvg_kv_disk_hdr) == 176, "slot header layout");

enum { SLOT_FREE = 0, SLOT_VALID = 1, SLOT_WRITING = 2 };

/* A block waiting for the writer: its slot image (header space, then the payload). */
typedef struct pending {
    struct pending *next;
    uint8_t hash[HLEN], tag[HLEN];
    uint8_t *buf;                /* slot_bytes */
    int64_t expires;             /* the store's clock; INT64_MAX: none */
    double quota;                /* its tenant's share of the slots, 0: none */
    int dead;                    /* wiped while queued or being written */
} pending;

/* An asynchronous read (kv_disk.h): queued for the reader, then DONE or FAILED; on the
 * store's list of reads while a request holds it (or the reader is reading it), so a
 * second request for the same block shares it. */
struct kvg_kv_disk_read {
    struct kvg_kv_disk_read *next;   /* the reader's queue */
    struct kvg_kv_disk_read *lprev, *lnext;  /* the store's list of reads */
    uint8_t hash[HLEN], tag[HLEN];
    uint8_t *buf;                /* slot_bytes: the slot as read (header, then payload) */
    int refs;                    /* requests holding it */
    int state;                   /* KVG_KV_DISK_READ_* */
};

struct kvg_kv_disk {
    char path[PATH_MAX];
    int fd;
    kvg_kv_disk_ident id;
    uint64_t slot_bytes;
    int64_t n_slots, n_valid;
    /* per slot */
    uint8_t *state;
    uint8_t *checked;            /* written or read back by this store (else only its
                                    header was seen, at open) */
    uint8_t (*hash)[HLEN], (*tag)[HLEN];
    uint64_t *seq;
    int64_t *expires;            /* the store's clock (Unix ms); INT64_MAX: none */
    int64_t *hnext, *prev, *next;
    /* index: hash -> VALID slot, chained through hnext */
    int64_t *buckets;
    uint64_t mask;
    int64_t lru_head, lru_tail;  /* VALID slots, least recently used at head */
    int64_t *free_slots, n_free;
    uint64_t next_seq;
    int64_t next_expiry;         /* no VALID slot expires before this (a lower bound) */
    kvg_u64map tags;             /* tag's first 8 bytes -> VALID slots (a quota's count) */
    kvg_kv_disk_clock_fn clock;
    void *clock_ctx;
    /* the writer's queue */
    pending *q_head, *q_tail, *writing;
    uint64_t staging_cap, staging_used;
    uint64_t submitted, completed;
    int stop;
    pthread_t writer;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    uint8_t *rbuf;               /* one slot, for loads (under mu) */
    /* the reader's queue (kvg_kv_disk_read_start) */
    kvg_kv_disk_read *rq_head, *rq_tail, *reading, *reads;  /* reads: every live one */
    uint64_t rd_cap, rd_used;    /* staging bytes of the reads */
    int64_t reading_slot;        /* the slot the reader reads outside mu (NIL: none): the
                                    writer never takes it, a drop leaves it off the free
                                    list until the read ends */
    int reading_dropped;         /* it was dropped meanwhile: the read is a miss */
    int hold_reads;              /* kvg_kv_disk_hold_reads (tests) */
    int efd;                     /* eventfd signalled when a read ends, -1: none */
    int writer_up, reader_up;
    pthread_t reader;
    pthread_cond_t cv_read;
    kvg_kv_disk_stats st;
    int logged_write, logged_read, logged_corrupt, logged_drop;
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t unix_ms(void *ctx)
{
    struct timespec ts;
    (void)ctx;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + (int64_t)ts.tv_nsec / 1000000;
}

static int64_t now_of(const kvg_kv_disk *d)
{
    return d->clock(d->clock_ctx);
}

/* An expiry as stored (UINT64_MAX: none) and back. */
static uint64_t expiry_to_disk(int64_t e)
{
    return e == INT64_MAX ? UINT64_MAX : e < 0 ? 0 : (uint64_t)e;
}

static int64_t expiry_from_disk(uint64_t e)
{
    return e > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)e;
}

/* Whole-buffer pread / pwrite: 0, or -1 with errno (a short read is EIO). */
static int pread_full(int fd, void *buf, size_t n, off_t off)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = EIO;
            return -1;
        }
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

static int pwrite_full(int fd, const void *buf, size_t n, off_t off)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t r = pwrite(fd, p, n, off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = ENOSPC;
            return -1;
        }
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

static off_t slot_off(const kvg_kv_disk *d, int64_t s)
{
    return (off_t)((uint64_t)s * d->slot_bytes);
}

/* ---- index and LRU (under mu) ---- */

static uint64_t bucket_of(const kvg_kv_disk *d, const uint8_t *h)
{
    uint64_t v;
    memcpy(&v, h, sizeof v);     /* SHA-256 output: any 8 bytes are uniform */
    return v & d->mask;
}

static int64_t index_find(const kvg_kv_disk *d, const uint8_t *h)
{
    for (int64_t s = d->buckets[bucket_of(d, h)]; s != NIL; s = d->hnext[s])
        if (memcmp(d->hash[s], h, HLEN) == 0)
            return s;
    return NIL;
}

static void index_insert(kvg_kv_disk *d, int64_t s)
{
    uint64_t k = bucket_of(d, d->hash[s]);
    d->hnext[s] = d->buckets[k];
    d->buckets[k] = s;
}

static void index_remove(kvg_kv_disk *d, int64_t s)
{
    int64_t *pp = &d->buckets[bucket_of(d, d->hash[s])];
    while (*pp != NIL && *pp != s)
        pp = &d->hnext[*pp];
    if (*pp == s)
        *pp = d->hnext[s];
    d->hnext[s] = NIL;
}

static void lru_push(kvg_kv_disk *d, int64_t s)
{
    d->next[s] = NIL;
    d->prev[s] = d->lru_tail;
    if (d->lru_tail != NIL)
        d->next[d->lru_tail] = s;
    else
        d->lru_head = s;
    d->lru_tail = s;
}

static void lru_remove(kvg_kv_disk *d, int64_t s)
{
    if (d->prev[s] != NIL) d->next[d->prev[s]] = d->next[s]; else d->lru_head = d->next[s];
    if (d->next[s] != NIL) d->prev[d->next[s]] = d->prev[s]; else d->lru_tail = d->prev[s];
    d->prev[s] = d->next[s] = NIL;
}

/* The map key of a tag: its first 8 bytes (0 is the map's empty mark: 1 then). */
static uint64_t tag_key(const uint8_t *tag)
{
    uint64_t k;
    memcpy(&k, tag, sizeof k);
    return k ? k : 1;
}

/* VALID slots of the tenant of tag. */
static int64_t tag_count(const kvg_kv_disk *d, const uint8_t *tag)
{
    void *v;
    return kvg_u64map_find(&d->tags, tag_key(tag), &v) ? (int64_t)(uintptr_t)v : 0;
}

static void tag_add(kvg_kv_disk *d, const uint8_t *tag, int64_t n)
{
    n += tag_count(d, tag);
    if (n > 0)
        (void)kvg_u64map_put(&d->tags, tag_key(tag), (void *)(uintptr_t)n);
    else
        kvg_u64map_del(&d->tags, tag_key(tag));
}

/* A VALID slot leaves the index (it is then being rewritten or dropped). */
static void unpublish(kvg_kv_disk *d, int64_t s)
{
    index_remove(d, s);
    lru_remove(d, s);
    tag_add(d, d->tag[s], -1);
    d->n_valid--;
}

/* A slot whose hash, tag and expiry are set becomes VALID, the most recently used. */
static void publish(kvg_kv_disk *d, int64_t s)
{
    d->state[s] = SLOT_VALID;
    index_insert(d, s);
    lru_push(d, s);
    tag_add(d, d->tag[s], 1);
    if (d->expires[s] < d->next_expiry)
        d->next_expiry = d->expires[s];
    d->n_valid++;
}

/* Drops a VALID slot; zero: also clear its magic on disk so a restart cannot find it
 * (a wipe, a corrupt slot). */
static void drop_slot(kvg_kv_disk *d, int64_t s, int zero)
{
    static const uint8_t zeros[8];
    unpublish(d, s);
    d->state[s] = SLOT_FREE;
    if (s == d->reading_slot)
        d->reading_dropped = 1;  /* freed when the reader is done with it */
    else
        d->free_slots[d->n_free++] = s;
    if (zero)
        (void)!pwrite(d->fd, zeros, sizeof zeros, slot_off(d, s));
}

/* Frees every VALID slot expired by now (their headers stay: expired, they are dropped
 * again by the next scan) and renews next_expiry. */
static void sweep_expired(kvg_kv_disk *d, int64_t now)
{
    int64_t next = INT64_MAX, s = d->lru_head;
    while (s != NIL) {
        int64_t nx = d->next[s];
        if (d->expires[s] <= now) {
            drop_slot(d, s, 0);
            d->st.expired++;
        } else if (d->expires[s] < next) {
            next = d->expires[s];
        }
        s = nx;
    }
    d->next_expiry = next;
}

/* The least recently used slot of tag not being read, or NIL. */
static int64_t lru_of_tag(const kvg_kv_disk *d, const uint8_t *tag)
{
    int64_t s = d->lru_head;
    while (s != NIL && (s == d->reading_slot || memcmp(d->tag[s], tag, HLEN) != 0))
        s = d->next[s];
    return s;
}

/* A slot for the writer to write p into, in this order: when p's tenant is at its
 * quota's share, its own least recently used slot (never another tenant's); a free one
 * (expired slots are freed first); the least recently used (evicted). */
static int64_t pick_slot(kvg_kv_disk *d, const pending *p, int64_t now)
{
    int64_t s = NIL;
    if (now >= d->next_expiry)
        sweep_expired(d, now);
    if (p->quota > 0.0) {
        int64_t share = (int64_t)(p->quota * (double)d->n_slots);
        if (share < 1)
            share = 1;
        if (tag_count(d, p->tag) >= share && (s = lru_of_tag(d, p->tag)) != NIL) {
            unpublish(d, s);
            d->st.evictions++;
            d->st.quota_evictions++;
        }
    }
    if (s == NIL && d->n_free > 0) {
        s = d->free_slots[--d->n_free];
    } else if (s == NIL && d->lru_head != NIL) {
        s = d->lru_head;
        if (s == d->reading_slot)    /* being read: the next least recently used */
            s = d->next[s];
        if (s == NIL)
            return NIL;
        unpublish(d, s);
        d->st.evictions++;
    }
    if (s != NIL)
        d->state[s] = SLOT_WRITING;
    return s;
}

static int ident_matches(const kvg_kv_disk *d, const kvg_kv_disk_hdr *h)
{
    return memcmp(h->magic, KVG_KV_DISK_MAGIC, 8) == 0 && h->version == KVG_KV_DISK_VERSION &&
           h->hdr_bytes == HDR && memcmp(h->model_id, d->id.model_id, HLEN) == 0 &&
           h->n_layers == d->id.n_layers && h->n_kv_heads == d->id.n_kv_heads &&
           h->head_dim == d->id.head_dim && h->block_tokens == d->id.block_tokens &&
           h->dtype == d->id.dtype && h->payload_bytes == d->id.payload_bytes &&
           h->hdr_crc == kvg_crc32c(0, h, offsetof(kvg_kv_disk_hdr, hdr_crc));
}

static uint32_t slot_crc(const kvg_kv_disk *d, const uint8_t *img)
{
    uint32_t c = kvg_crc32c(0, img, offsetof(kvg_kv_disk_hdr, crc));
    return kvg_crc32c(c, img + HDR, d->id.payload_bytes);
}

/* ---- the writer ---- */

static void fill_header(kvg_kv_disk *d, pending *p, uint64_t seq, int64_t now, int64_t expires)
{
    kvg_kv_disk_hdr h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, KVG_KV_DISK_MAGIC, 8);
    h.version = KVG_KV_DISK_VERSION;
    h.hdr_bytes = HDR;
    memcpy(h.model_id, d->id.model_id, HLEN);
    h.n_layers = d->id.n_layers;
    h.n_kv_heads = d->id.n_kv_heads;
    h.head_dim = d->id.head_dim;
    h.block_tokens = d->id.block_tokens;
    h.dtype = d->id.dtype;
    h.payload_bytes = d->id.payload_bytes;
    memcpy(h.hash, p->hash, HLEN);
    memcpy(h.tag, p->tag, HLEN);
    h.seq = seq;
    h.written_unix_ms = expiry_to_disk(now);
    h.expires_unix_ms = expiry_to_disk(expires);
    h.hdr_crc = kvg_crc32c(0, &h, offsetof(kvg_kv_disk_hdr, hdr_crc));
    memcpy(p->buf, &h, sizeof h);
    h.crc = slot_crc(d, p->buf);
    memcpy(p->buf, &h, sizeof h);
}

/* Writes one queued block; called and returns with mu held. */
static void write_one(kvg_kv_disk *d, pending *p)
{
    int64_t s, now = now_of(d), expires = p->expires;
    uint64_t seq;
    double t0;
    int rc, e;
    if (p->dead || index_find(d, p->hash) != NIL)
        return;                  /* wiped, or stored meanwhile */
    if (p->expires <= now) {     /* expired while queued */
        d->st.expired++;
        return;
    }
    s = pick_slot(d, p, now);
    if (s == NIL)
        return;                  /* every slot is being written: one slot only */
    seq = d->next_seq++;
    pthread_mutex_unlock(&d->mu);
    fill_header(d, p, seq, now, expires);    /* p->expires may grow meanwhile (a spill) */
    t0 = mono_s();
    rc = pwrite_full(d->fd, p->buf, (size_t)d->slot_bytes, slot_off(d, s));
    e = errno;
    t0 = mono_s() - t0;
    pthread_mutex_lock(&d->mu);
    d->st.write_seconds += t0;
    if (rc != 0) {
        d->st.io_errors++;
        if (!d->logged_write++)
            kvg_log("kv disk: cannot write %s (%s): blocks that do not fit are not cached "
                    "(logged once)", d->path, strerror(e));
        d->state[s] = SLOT_FREE;
        d->free_slots[d->n_free++] = s;
        return;
    }
    memcpy(d->hash[s], p->hash, HLEN);
    memcpy(d->tag[s], p->tag, HLEN);
    d->seq[s] = seq;
    d->expires[s] = p->expires;
    d->checked[s] = 1;
    publish(d, s);
    d->st.blocks_written++;
    d->st.bytes_written += d->slot_bytes;
    if (p->dead)                 /* wiped while being written */
        drop_slot(d, s, 1);
}

static void *writer_main(void *arg)
{
    kvg_kv_disk *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        pending *p;
        while (!d->q_head && !d->stop)
            pthread_cond_wait(&d->cv_work, &d->mu);
        if (!d->q_head)
            break;
        p = d->q_head;
        d->q_head = p->next;
        if (!d->q_head)
            d->q_tail = NULL;
        d->writing = p;
        write_one(d, p);
        d->writing = NULL;
        d->staging_used -= d->slot_bytes;
        d->completed++;
        pthread_cond_broadcast(&d->cv_done);
        pthread_mutex_unlock(&d->mu);
        free(p->buf);
        free(p);
        pthread_mutex_lock(&d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- the reader ---- */

/* A read leaves the store: its staging goes back (under mu). */
static void free_read(kvg_kv_disk *d, kvg_kv_disk_read *r)
{
    if (r->lprev)
        r->lprev->lnext = r->lnext;
    else
        d->reads = r->lnext;
    if (r->lnext)
        r->lnext->lprev = r->lprev;
    d->rd_used -= d->slot_bytes;
    free(r->buf);
    free(r);
}

/* Reads and checks one queued read's slot; called and returns with mu held, which it
 * drops for the pread and the checksum. Its slot stays out of the writer's reach
 * meanwhile (reading_slot), so what is read is what the index said. */
static void read_one(kvg_kv_disk *d, kvg_kv_disk_read *r)
{
    kvg_kv_disk_hdr h;
    int64_t s = index_find(d, r->hash);
    double t0;
    int rc, e = 0, bad = 0;
    if (s == NIL || memcmp(d->tag[s], r->tag, HLEN) != 0) {
        r->state = KVG_KV_DISK_READ_FAILED;     /* evicted or wiped since it was queued */
        d->st.misses++;
        return;
    }
    d->reading_slot = s;
    d->reading_dropped = 0;
    pthread_mutex_unlock(&d->mu);
    t0 = mono_s();
    rc = pread_full(d->fd, r->buf, (size_t)d->slot_bytes, slot_off(d, s));
    if (rc != 0) {
        e = errno;
    } else {
        memcpy(&h, r->buf, sizeof h);
        bad = !ident_matches(d, &h) || memcmp(h.hash, r->hash, HLEN) != 0 ||
              memcmp(h.tag, r->tag, HLEN) != 0 || h.crc != slot_crc(d, r->buf);
    }
    t0 = mono_s() - t0;
    pthread_mutex_lock(&d->mu);
    d->reading_slot = NIL;
    d->st.read_seconds += t0;
    r->state = KVG_KV_DISK_READ_FAILED;
    if (d->reading_dropped) {    /* wiped or replaced while being read: a miss */
        d->free_slots[d->n_free++] = s;
        d->st.misses++;
    } else if (rc != 0) {
        d->st.io_errors++;
        d->st.misses++;
        if (!d->logged_read++)
            kvg_log("kv disk: cannot read %s (%s): the block is recomputed (logged once)",
                    d->path, strerror(e));
        drop_slot(d, s, 0);
    } else if (bad) {
        d->st.corrupt++;
        d->st.misses++;
        if (!d->logged_corrupt++)
            kvg_log("kv disk: a corrupt block in %s (slot %lld: checksum or identity): dropped, "
                    "recomputed (logged once)", d->path, (long long)s);
        drop_slot(d, s, 1);
    } else {
        lru_remove(d, s);
        lru_push(d, s);
        d->checked[s] = 1;
        d->st.bytes_read += d->slot_bytes;
        r->state = KVG_KV_DISK_READ_DONE;
    }
}

static void *reader_main(void *arg)
{
    kvg_kv_disk *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        kvg_kv_disk_read *r;
        while ((!d->rq_head || d->hold_reads) && !d->stop)
            pthread_cond_wait(&d->cv_read, &d->mu);
        if (d->stop)
            break;               /* reads still queued are freed by close */
        r = d->rq_head;
        d->rq_head = r->next;
        if (!d->rq_head)
            d->rq_tail = NULL;
        r->next = NULL;
        d->reading = r;
        read_one(d, r);
        d->reading = NULL;
        if (r->refs == 0)        /* its requests went away meanwhile */
            free_read(d, r);
        if (d->efd >= 0) {
            uint64_t one = 1;
            (void)!write(d->efd, &one, sizeof one);
        }
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- open: scan the headers ---- */

static int cmp_seq(const void *a, const void *b, void *ctx)
{
    const uint64_t *seq = ctx;
    uint64_t x = seq[*(const int64_t *)a], y = seq[*(const int64_t *)b];
    return x < y ? -1 : x > y;
}

static void scan(kvg_kv_disk *d)
{
    int64_t *valid = malloc((size_t)d->n_slots * sizeof *valid), nv = 0, n_old = 0;
    int64_t now = now_of(d);
    for (int64_t s = 0; s < d->n_slots; s++) {
        kvg_kv_disk_hdr h;
        int64_t o;
        d->state[s] = SLOT_FREE;
        if (pread_full(d->fd, &h, sizeof h, slot_off(d, s)) != 0)
            continue;
        if (memcmp(h.magic, KVG_KV_DISK_MAGIC, 8) == 0 && h.version != KVG_KV_DISK_VERSION) {
            n_old++;             /* another format: free space */
            continue;
        }
        if (!ident_matches(d, &h))
            continue;
        if (expiry_from_disk(h.expires_unix_ms) <= now) {
            d->st.expired++;     /* its header stays; the slot is free space */
            continue;
        }
        o = index_find(d, h.hash);
        if (o != NIL) {          /* the same block twice (a crash mid-way): keep the newer */
            if (d->seq[o] >= h.seq)
                continue;
            index_remove(d, o);
            d->state[o] = SLOT_FREE;
        }
        memcpy(d->hash[s], h.hash, HLEN);
        memcpy(d->tag[s], h.tag, HLEN);
        d->seq[s] = h.seq;
        d->expires[s] = expiry_from_disk(h.expires_unix_ms);
        d->state[s] = SLOT_VALID;
        index_insert(d, s);
        if (h.seq >= d->next_seq)
            d->next_seq = h.seq + 1;
    }
    for (int64_t s = 0; s < d->n_slots; s++)
        if (d->state[s] == SLOT_VALID && valid)
            valid[nv++] = s;
    if (valid) {
        qsort_r(valid, (size_t)nv, sizeof *valid, cmp_seq, d->seq);
        for (int64_t i = 0; i < nv; i++) {
            int64_t s = valid[i];
            lru_push(d, s);
            tag_add(d, d->tag[s], 1);
            if (d->expires[s] < d->next_expiry)
                d->next_expiry = d->expires[s];
            d->n_valid++;
        }
    } else {                     /* no memory to order them: start empty */
        for (int64_t s = 0; s < d->n_slots; s++)
            if (d->state[s] == SLOT_VALID) {
                index_remove(d, s);
                d->state[s] = SLOT_FREE;
            }
    }
    free(valid);
    /* Free slots stacked so the lowest is taken first. */
    for (int64_t s = d->n_slots - 1; s >= 0; s--)
        if (d->state[s] == SLOT_FREE)
            d->free_slots[d->n_free++] = s;
    d->st.restored = (uint64_t)d->n_valid;
    if (n_old)
        kvg_log("kv disk: %s: %lld slots of another format version (this engine writes "
                "version %u): free space", d->path, (long long)n_old, KVG_KV_DISK_VERSION);
}

/* Extends (or shrinks) the file to n_slots slots; a failure is only logged. */
static void size_file(kvg_kv_disk *d)
{
    struct stat sb;
    off_t want = slot_off(d, d->n_slots);
    if (fstat(d->fd, &sb) != 0 || sb.st_size == want)
        return;
    if (sb.st_size > want) {
        (void)!ftruncate(d->fd, want);
        return;
    }
    if (fallocate(d->fd, 0, sb.st_size, want - sb.st_size) == 0)
        return;
    if (ftruncate(d->fd, want) != 0)
        kvg_log("kv disk: cannot extend %s to %lld bytes (%s): blocks past its end will not "
                "be cached", d->path, (long long)want, strerror(errno));
}

uint32_t kvg_kv_disk_host_dtype(const kvg_kv_pool *pool)
{
    if (pool->n_full >= pool->geom.n_layers)
        return KVG_KV_DTYPE_F32_HOST;
    return KVG_KV_DTYPE_INT8_HOST | (uint32_t)pool->n_full;
}

uint32_t kvg_kv_disk_cuda_dtype(const kvg_kv_pool *pool)
{
    if (pool->n_full >= pool->geom.n_layers)
        return KVG_KV_DTYPE_BF16_CUDA;
    return KVG_KV_DTYPE_INT8_CUDA | (uint32_t)pool->n_full;
}

kvg_kv_disk *kvg_kv_disk_open(const char *dir, uint64_t size_bytes, uint64_t staging_bytes,
                              const kvg_kv_disk_ident *id, char *err, size_t err_len)
{
    return kvg_kv_disk_open_clock(dir, size_bytes, staging_bytes, id, NULL, NULL, err, err_len);
}

kvg_kv_disk *kvg_kv_disk_open_clock(const char *dir, uint64_t size_bytes, uint64_t staging_bytes,
                                    const kvg_kv_disk_ident *id, kvg_kv_disk_clock_fn clock,
                                    void *clock_ctx, char *err, size_t err_len)
{
    kvg_kv_disk *d;
    struct stat sb;
    uint64_t payload_pad;
    if (!dir || !*dir || !id || id->payload_bytes == 0) {
        kvg_set_err(err, err_len, "kv disk: no directory or block size");
        return NULL;
    }
    if (stat(dir, &sb) != 0 && errno == ENOENT && mkdir(dir, 0700) != 0) {
        kvg_set_err(err, err_len, "%s: cannot create the directory: %s", dir, strerror(errno));
        return NULL;
    }
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        kvg_set_err(err, err_len, "%s: not a directory", dir);
        return NULL;
    }
    payload_pad = (id->payload_bytes + HDR - 1) / HDR * HDR;
    if (size_bytes / (HDR + payload_pad) < 1) {
        kvg_set_err(err, err_len, "%llu bytes hold no block (one slot is %llu bytes)",
                    (unsigned long long)size_bytes, (unsigned long long)(HDR + payload_pad));
        return NULL;
    }
    d = calloc(1, sizeof *d);
    if (!d) {
        kvg_set_err(err, err_len, "kv disk: out of memory");
        return NULL;
    }
    d->fd = -1;
    d->efd = -1;
    d->reading_slot = NIL;
    d->id = *id;
    d->slot_bytes = HDR + payload_pad;
    d->n_slots = (int64_t)(size_bytes / d->slot_bytes);
    d->lru_head = d->lru_tail = NIL;
    d->next_expiry = INT64_MAX;
    d->clock = clock ? clock : unix_ms;
    d->clock_ctx = clock_ctx;
    if ((size_t)snprintf(d->path, sizeof d->path, "%s/%s", dir, KVG_KV_DISK_FILE) >= sizeof d->path) {
        kvg_set_err(err, err_len, "%s: path too long", dir);
        free(d);
        return NULL;
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_work, NULL);
    pthread_cond_init(&d->cv_done, NULL);
    pthread_cond_init(&d->cv_read, NULL);
    d->fd = open(d->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (d->fd < 0) {
        kvg_set_err(err, err_len, "%s: cannot open: %s", d->path, strerror(errno));
        goto fail;
    }
    if (flock(d->fd, LOCK_EX | LOCK_NB) != 0) {
        kvg_set_err(err, err_len, "%s: in use by another engine", d->path);
        goto fail;
    }
    {
        uint64_t mb = 1;
        while (mb < (uint64_t)d->n_slots * 2)
            mb <<= 1;
        d->mask = mb - 1;
        d->buckets = malloc(mb * sizeof *d->buckets);
        if (d->buckets)
            for (uint64_t i = 0; i < mb; i++)
                d->buckets[i] = NIL;
    }
    {
        size_t n = (size_t)d->n_slots;
        d->state = calloc(n, 1);
        d->checked = calloc(n, 1);
        d->hash = calloc(n, HLEN);
        d->tag = calloc(n, HLEN);
        d->seq = calloc(n, sizeof *d->seq);
        d->expires = calloc(n, sizeof *d->expires);
        d->hnext = malloc(n * sizeof *d->hnext);
        d->prev = malloc(n * sizeof *d->prev);
        d->next = malloc(n * sizeof *d->next);
        d->free_slots = malloc(n * sizeof *d->free_slots);
        d->rbuf = aligned_alloc(HDR, (size_t)d->slot_bytes);
        if (!d->buckets || !d->state || !d->hash || !d->tag || !d->seq || !d->expires || !d->hnext ||
            !d->prev || !d->next || !d->free_slots || !d->rbuf || !d->checked) {
            kvg_set_err(err, err_len, "kv disk: out of memory for %lld slots", (long long)d->n_slots);
            goto fail;
        }
        for (size_t i = 0; i < n; i++)
            d->hnext[i] = d->prev[i] = d->next[i] = NIL;
    }
    if (staging_bytes == 0) {
        staging_bytes = size_bytes / 4;
        if (staging_bytes > ((uint64_t)256 << 20))
            staging_bytes = (uint64_t)256 << 20;
    }
    if (staging_bytes < 4 * d->slot_bytes)
        staging_bytes = 4 * d->slot_bytes;
    d->staging_cap = staging_bytes;
    d->rd_cap = staging_bytes;   /* the reads' own budget, as large */
    /* Without it the engine's loop polls for ended reads instead of sleeping on them. */
    d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    size_file(d);
    scan(d);
    d->st.slots_total = d->n_slots;
    d->st.slot_bytes = d->slot_bytes;
    if (pthread_create(&d->writer, NULL, writer_main, d) != 0) {
        kvg_set_err(err, err_len, "kv disk: cannot start the writer thread");
        goto fail;
    }
    d->writer_up = 1;
    if (pthread_create(&d->reader, NULL, reader_main, d) != 0) {
        kvg_set_err(err, err_len, "kv disk: cannot start the reader thread");
        goto fail;
    }
    d->reader_up = 1;
    return d;
fail:
    kvg_kv_disk_close(d);
    return NULL;
}

void kvg_kv_disk_close(kvg_kv_disk *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_signal(&d->cv_work);
    pthread_cond_signal(&d->cv_read);
    pthread_mutex_unlock(&d->mu);
    if (d->writer_up)
        pthread_join(d->writer, NULL);
    if (d->reader_up)
        pthread_join(d->reader, NULL);
    while (d->q_head) {          /* only when the writer never ran */
        pending *p = d->q_head;
        d->q_head = p->next;
        free(p->buf);
        free(p);
    }
    while (d->reads)             /* references still held become invalid */
        free_read(d, d->reads);
    if (d->fd >= 0)
        close(d->fd);
    if (d->efd >= 0)
        close(d->efd);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv_work);
    pthread_cond_destroy(&d->cv_done);
    pthread_cond_destroy(&d->cv_read);
    free(d->buckets);
    free(d->state);
    free(d->checked);
    free(d->hash);
    free(d->tag);
    free(d->seq);
    free(d->expires);
    kvg_u64map_free(&d->tags);
    free(d->hnext);
    free(d->prev);
    free(d->next);
    free(d->free_slots);
    free(d->rbuf);
    free(d);
}

/* ---- the scheduler's side ---- */

/* The queued block of hash (not wiped), or NULL; under mu. */
static pending *queued(kvg_kv_disk *d, const uint8_t *hash)
{
    if (d->writing && !d->writing->dead && memcmp(d->writing->hash, hash, HLEN) == 0)
        return d->writing;
    for (pending *p = d->q_head; p; p = p->next)
        if (!p->dead && memcmp(p->hash, hash, HLEN) == 0)
            return p;
    return NULL;
}

/* The payload from pool block `block`, or (pool NULL) from bytes. */
static int spill_from(kvg_kv_disk *d, const kvg_kv_pool *pool, int32_t block, const void *bytes,
                      const uint8_t hash[KVG_KV_DISK_ID_LEN], const uint8_t tag[KVG_KV_DISK_ID_LEN],
                      double quota, int64_t ttl_ms, int wait)
{
    pending *p, *q;
    int64_t s, now, expires;
    pthread_mutex_lock(&d->mu);
    now = now_of(d);
    if (ttl_ms <= 0) {           /* past its expiry: the tenant no longer wants it */
        d->st.expired++;
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    expires = now > 0 && ttl_ms > INT64_MAX - now ? INT64_MAX : now + ttl_ms;
    s = index_find(d, hash);
    if (s != NIL && d->expires[s] <= now) {
        drop_slot(d, s, 0);      /* expired: this copy replaces it */
        d->st.expired++;
        s = NIL;
    }
    if (s != NIL && !d->checked[s]) {
        /* Found at open and never read: the pool's copy replaces it (it may be one
         * of a chain whose corrupt block made this block be recomputed). */
        drop_slot(d, s, 0);
        s = NIL;
    }
    if (s != NIL || (q = queued(d, hash)) != NULL) {
        if (s != NIL) {          /* stored already: now the most recently used */
            lru_remove(d, s);
            lru_push(d, s);
            if (d->expires[s] < expires)
                d->expires[s] = expires;   /* the header keeps the written one */
        } else if (q->expires < expires) {
            q->expires = expires;
        }
        pthread_mutex_unlock(&d->mu);
        return 0;
    }
    while (d->staging_used + d->slot_bytes > d->staging_cap) {
        if (!wait) {
            d->st.dropped++;
            if (!d->logged_drop++)
                kvg_log("kv disk: the write queue is full (%llu bytes): evicted blocks are "
                        "dropped until it drains (logged once)", (unsigned long long)d->staging_cap);
            pthread_mutex_unlock(&d->mu);
            return -1;
        }
        pthread_cond_wait(&d->cv_done, &d->mu);
    }
    d->staging_used += d->slot_bytes;
    pthread_mutex_unlock(&d->mu);
    /* The copy out of the pool, outside the lock: the block is the caller's until
     * this returns, then it may be reused at once. */
    p = calloc(1, sizeof *p);
    if (p)
        p->buf = calloc(1, (size_t)d->slot_bytes);
    if (p && p->buf && !pool)
        memcpy(p->buf + HDR, bytes, (size_t)d->id.payload_bytes);
    if (!p || !p->buf || (pool && kvg_kv_block_export(pool, block, p->buf + HDR) != 0)) {
        if (p)
            free(p->buf);
        free(p);
        pthread_mutex_lock(&d->mu);
        d->staging_used -= d->slot_bytes;
        d->st.dropped++;
        pthread_cond_broadcast(&d->cv_done);
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    memcpy(p->hash, hash, HLEN);
    memcpy(p->tag, tag, HLEN);
    p->expires = expires;
    p->quota = quota;
    pthread_mutex_lock(&d->mu);
    if (d->q_tail)
        d->q_tail->next = p;
    else
        d->q_head = p;
    d->q_tail = p;
    d->submitted++;
    pthread_cond_signal(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

int kvg_kv_disk_spill(kvg_kv_disk *d, const kvg_kv_pool *pool, int32_t block,
                      const uint8_t hash[KVG_KV_DISK_ID_LEN], const uint8_t tag[KVG_KV_DISK_ID_LEN],
                      double quota, int64_t ttl_ms, int wait)
{
    if (kvg_kv_xfer_bytes(pool) != d->id.payload_bytes)
        return -1;
    return spill_from(d, pool, block, NULL, hash, tag, quota, ttl_ms, wait);
}

int kvg_kv_disk_spill_bytes(kvg_kv_disk *d, const void *payload, size_t bytes,
                            const uint8_t hash[KVG_KV_DISK_ID_LEN], const uint8_t tag[KVG_KV_DISK_ID_LEN],
                            double quota, int64_t ttl_ms, int wait)
{
    if (!d || bytes != d->id.payload_bytes)
        return -1;
    return spill_from(d, NULL, -1, payload, hash, tag, quota, ttl_ms, wait);
}

int kvg_kv_disk_load(kvg_kv_disk *d, kvg_kv_pool *pool, int32_t block,
                     const uint8_t hash[KVG_KV_DISK_ID_LEN], const uint8_t tag[KVG_KV_DISK_ID_LEN])
{
    kvg_kv_disk_hdr h;
    pending *p;
    int64_t s;
    double t0;
    int rc = -1;
    if (kvg_kv_xfer_bytes(pool) != d->id.payload_bytes)
        return -1;
    pthread_mutex_lock(&d->mu);
    p = queued(d, hash);
    if (p) {                     /* not written yet: its staging copy */
        if (memcmp(p->tag, tag, HLEN) == 0 && p->expires > now_of(d) &&
            kvg_kv_block_import(pool, block, p->buf + HDR) == 0) {
            d->st.hits++;
            rc = 0;
        } else {
            d->st.misses++;
        }
        pthread_mutex_unlock(&d->mu);
        return rc;
    }
    s = index_find(d, hash);
    if (s != NIL && d->expires[s] <= now_of(d)) {
        drop_slot(d, s, 0);      /* expired: never served; the slot is free */
        d->st.expired++;
        s = NIL;
    }
    if (s == NIL || memcmp(d->tag[s], tag, HLEN) != 0) {
        d->st.misses++;
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    t0 = mono_s();
    if (pread_full(d->fd, d->rbuf, (size_t)d->slot_bytes, slot_off(d, s)) != 0) {
        int e = errno;
        d->st.io_errors++;
        d->st.misses++;
        if (!d->logged_read++)
            kvg_log("kv disk: cannot read %s (%s): the block is recomputed (logged once)",
                    d->path, strerror(e));
        drop_slot(d, s, 0);
        goto out;
    }
    memcpy(&h, d->rbuf, sizeof h);
    if (!ident_matches(d, &h) || memcmp(h.hash, hash, HLEN) != 0 || memcmp(h.tag, tag, HLEN) != 0 ||
        h.crc != slot_crc(d, d->rbuf)) {
        d->st.corrupt++;
        d->st.misses++;
        if (!d->logged_corrupt++)
            kvg_log("kv disk: a corrupt block in %s (slot %lld: checksum or identity): dropped, "
                    "recomputed (logged once)", d->path, (long long)s);
        drop_slot(d, s, 1);
        goto out;
    }
    if (kvg_kv_block_import(pool, block, d->rbuf + HDR) != 0) {
        d->st.misses++;
        goto out;
    }
    lru_remove(d, s);
    lru_push(d, s);
    d->checked[s] = 1;
    d->st.hits++;
    d->st.bytes_read += d->slot_bytes;
    rc = 0;
out:
    d->st.read_seconds += mono_s() - t0;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

int kvg_kv_disk_holds(kvg_kv_disk *d, const uint8_t hash[KVG_KV_DISK_ID_LEN])
{
    int64_t s;
    int r;
    pthread_mutex_lock(&d->mu);
    s = index_find(d, hash);
    r = (s != NIL && d->expires[s] > now_of(d)) || queued(d, hash) != NULL;
    pthread_mutex_unlock(&d->mu);
    return r;
}

int64_t kvg_kv_disk_wipe(kvg_kv_disk *d, const uint8_t tag[KVG_KV_DISK_ID_LEN])
{
    int64_t n = 0;
    pthread_mutex_lock(&d->mu);
    for (int64_t s = 0; s < d->n_slots; s++)
        if (d->state[s] == SLOT_VALID && memcmp(d->tag[s], tag, HLEN) == 0) {
            drop_slot(d, s, 1);
            n++;
        }
    if (d->writing && !d->writing->dead && memcmp(d->writing->tag, tag, HLEN) == 0) {
        d->writing->dead = 1;
        n++;
    }
    for (pending *p = d->q_head; p; p = p->next)
        if (!p->dead && memcmp(p->tag, tag, HLEN) == 0) {
            p->dead = 1;
            n++;
        }
    /* Reads staged but not imported yet are never served now (one queued or being read
     * fails by itself: its slot is gone). */
    for (kvg_kv_disk_read *r = d->reads; r; r = r->lnext)
        if (r->state == KVG_KV_DISK_READ_DONE && memcmp(r->tag, tag, HLEN) == 0)
            r->state = KVG_KV_DISK_READ_FAILED;
    d->st.wiped += (uint64_t)n;
    pthread_mutex_unlock(&d->mu);
    return n;
}

void kvg_kv_disk_flush(kvg_kv_disk *d)
{
    pthread_mutex_lock(&d->mu);
    uint64_t target = d->submitted;
    while (d->completed < target)
        pthread_cond_wait(&d->cv_done, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

void kvg_kv_disk_get_stats(kvg_kv_disk *d, kvg_kv_disk_stats *out)
{
    pthread_mutex_lock(&d->mu);
    *out = d->st;
    out->slots_used = d->n_valid;
    out->pending = (int64_t)(d->submitted - d->completed);
    out->reads_in_flight = d->reading != NULL;
    for (const kvg_kv_disk_read *r = d->rq_head; r; r = r->next)
        out->reads_in_flight++;
    for (const kvg_kv_disk_read *r = d->reads; r; r = r->lnext)
        out->reads_live += r->refs > 0;
    pthread_mutex_unlock(&d->mu);
}

const char *kvg_kv_disk_path(const kvg_kv_disk *d)
{
    return d->path;
}

/* ---- asynchronous reads: the scheduler's side ---- */

kvg_kv_disk_read *kvg_kv_disk_read_start(kvg_kv_disk *d, const uint8_t hash[KVG_KV_DISK_ID_LEN],
                                         const uint8_t tag[KVG_KV_DISK_ID_LEN])
{
    kvg_kv_disk_read *r;
    pending *p;
    int64_t s;
    pthread_mutex_lock(&d->mu);
    for (r = d->reads; r; r = r->lnext)
        if (r->state != KVG_KV_DISK_READ_FAILED && memcmp(r->hash, hash, HLEN) == 0 &&
            memcmp(r->tag, tag, HLEN) == 0) {
            r->refs++;           /* another request waits for the same block */
            pthread_mutex_unlock(&d->mu);
            return r;
        }
    p = queued(d, hash);
    s = p ? NIL : index_find(d, hash);
    if (s != NIL && d->expires[s] <= now_of(d)) {
        drop_slot(d, s, 0);      /* expired: never served (as a load); the slot is free */
        d->st.expired++;
        s = NIL;
    }
    if (p ? memcmp(p->tag, tag, HLEN) != 0 || p->expires <= now_of(d)
          : (s == NIL || memcmp(d->tag[s], tag, HLEN) != 0)) {
        d->st.misses++;
        pthread_mutex_unlock(&d->mu);
        return NULL;
    }
    if (d->rd_used + d->slot_bytes > d->rd_cap) {
        d->st.read_staging_full++;
        pthread_mutex_unlock(&d->mu);
        return NULL;
    }
    d->rd_used += d->slot_bytes;
    pthread_mutex_unlock(&d->mu);
    r = calloc(1, sizeof *r);
    if (r)
        r->buf = aligned_alloc(HDR, (size_t)d->slot_bytes);
    pthread_mutex_lock(&d->mu);
    if (!r || !r->buf) {
        if (r)
            free(r);
        d->rd_used -= d->slot_bytes;
        d->st.read_staging_full++;
        pthread_mutex_unlock(&d->mu);
        return NULL;
    }
    memcpy(r->hash, hash, HLEN);
    memcpy(r->tag, tag, HLEN);
    r->refs = 1;
    r->lnext = d->reads;
    if (d->reads)
        d->reads->lprev = r;
    d->reads = r;
    p = queued(d, hash);         /* again: the writer may have taken it meanwhile */
    if (p && memcmp(p->tag, tag, HLEN) == 0 && p->expires > now_of(d)) {
        /* Not written yet: its staging copy, now (a memcpy, as a load does). */
        memcpy(r->buf + HDR, p->buf + HDR, (size_t)d->id.payload_bytes);
        r->state = KVG_KV_DISK_READ_DONE;
    } else {
        r->state = KVG_KV_DISK_READ_PENDING;
        if (d->rq_tail)
            d->rq_tail->next = r;
        else
            d->rq_head = r;
        d->rq_tail = r;
        d->st.async_reads++;
        pthread_cond_signal(&d->cv_read);
    }
    pthread_mutex_unlock(&d->mu);
    return r;
}

int kvg_kv_disk_read_state(kvg_kv_disk *d, const kvg_kv_disk_read *r)
{
    int st;
    pthread_mutex_lock(&d->mu);
    st = r->state;
    pthread_mutex_unlock(&d->mu);
    return st;
}

int kvg_kv_disk_read_import(kvg_kv_disk *d, const kvg_kv_disk_read *r, kvg_kv_pool *pool, int32_t block)
{
    int rc;
    if (kvg_kv_disk_read_state(d, r) != KVG_KV_DISK_READ_DONE)
        return -1;               /* a failed read was counted by the reader */
    /* Once DONE the buffer is never written again: the import runs outside mu. */
    rc = kvg_kv_xfer_bytes(pool) == d->id.payload_bytes &&
         kvg_kv_block_import(pool, block, r->buf + HDR) == 0 ? 0 : -1;
    pthread_mutex_lock(&d->mu);
    if (rc == 0)
        d->st.hits++;
    else
        d->st.misses++;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

void kvg_kv_disk_read_put(kvg_kv_disk *d, kvg_kv_disk_read *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&d->mu);
    if (--r->refs == 0 && r != d->reading) {   /* being read: the reader frees it */
        if (r->state == KVG_KV_DISK_READ_PENDING) {
            kvg_kv_disk_read **pp = &d->rq_head, *prev = NULL;
            while (*pp && *pp != r) {
                prev = *pp;
                pp = &(*pp)->next;
            }
            if (*pp) {
                *pp = r->next;
                if (d->rq_tail == r)
                    d->rq_tail = prev;
            }
        }
        free_read(d, r);
    }
    pthread_mutex_unlock(&d->mu);
}

int kvg_kv_disk_read_fd(const kvg_kv_disk *d)
{
    return d ? d->efd : -1;
}

void kvg_kv_disk_hold_reads(kvg_kv_disk *d, int hold)
{
    pthread_mutex_lock(&d->mu);
    d->hold_reads = hold != 0;
    pthread_cond_broadcast(&d->cv_read);
    pthread_mutex_unlock(&d->mu);
}
