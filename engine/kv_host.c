/* The host-memory tier of the KV cache (see kv_host.h). */
#include "kv_host.h"
#include "errmsg.h"
#include "u64map.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HLEN KVG_KV_HOST_HASH_LEN
#define NIL (-1)

struct kvg_kv_host {
    unsigned char *buf;          /* n_slots x slot_bytes, the backend's pinned memory */
    size_t slot_bytes;
    int32_t n_slots;
    uint8_t (*hash)[HLEN];       /* [n_slots] */
    uint8_t (*tag)[HLEN];
    unsigned char *used;
    uint64_t *put_seq;           /* the put that filled the slot: its copy from the pool has
                                    run once the copies up to waited_seq were waited for */
    int64_t *expires;            /* the block's expiry (the caller's ms) */
    double *quota;               /* its tenant's quota, for the next tier */
    int64_t now_ms;              /* the latest time a caller gave */
    kvg_u64map tags;             /* tag's first 8 bytes -> slots held (a quota's count) */
    uint64_t seq, waited_seq;
    int32_t *prev, *next;        /* LRU list of used slots: head the most recent */
    int32_t head, tail;
    int32_t *free_ids, n_free;
    kvg_u64map index;            /* hash's first 8 bytes -> slot + 1 */
    kvg_kv_host_spill_fn spill;
    void *spill_ctx;
    kvg_kv_host_stats st;
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The index key of a hash: its first 8 bytes (0 is the map's empty mark: 1 then). */
static uint64_t key_of(const uint8_t *hash)
{
    uint64_t k;
    memcpy(&k, hash, sizeof k);
    return k ? k : 1;
}

kvg_kv_host *kvg_kv_host_new(void *buf, size_t bytes, size_t block_bytes, char *err, size_t err_len)
{
    kvg_kv_host *h;
    size_t n = block_bytes ? bytes / block_bytes : 0;
    if (!buf || n == 0 || n > INT32_MAX / 2) {
        kvg_set_err(err, err_len, "--kv-host-memory: %zu bytes hold %zu blocks of %zu bytes (one at least)", bytes, n,
                    block_bytes);
        return NULL;
    }
    h = calloc(1, sizeof *h);
    if (!h)
        goto oom;
    h->buf = buf;
    h->slot_bytes = block_bytes;
    h->n_slots = (int32_t)n;
    h->hash = calloc(n, sizeof *h->hash);
    h->tag = calloc(n, sizeof *h->tag);
    h->used = calloc(n, 1);
    h->put_seq = calloc(n, sizeof *h->put_seq);
    h->expires = calloc(n, sizeof *h->expires);
    h->quota = calloc(n, sizeof *h->quota);
    h->prev = malloc(n * sizeof *h->prev);
    h->next = malloc(n * sizeof *h->next);
    h->free_ids = malloc(n * sizeof *h->free_ids);
    if (!h->hash || !h->tag || !h->used || !h->put_seq || !h->expires || !h->quota || !h->prev || !h->next ||
        !h->free_ids)
        goto oom;
    /* popped from the end: slot 0 first */
    for (int32_t i = 0; i < h->n_slots; i++)
        h->free_ids[i] = h->n_slots - 1 - i;
    h->n_free = h->n_slots;
    h->head = h->tail = NIL;
    h->st.slots_total = h->n_slots;
    h->st.slot_bytes = block_bytes;
    return h;
oom:
    kvg_kv_host_free(h);
    kvg_set_err(err, err_len, "--kv-host-memory: out of memory for the tier's index");
    return NULL;
}

void kvg_kv_host_free(kvg_kv_host *h)
{
    if (!h)
        return;
    kvg_u64map_free(&h->index);
    kvg_u64map_free(&h->tags);
    free(h->expires);
    free(h->quota);
    free(h->hash);
    free(h->tag);
    free(h->used);
    free(h->put_seq);
    free(h->prev);
    free(h->next);
    free(h->free_ids);
    free(h);
}

void kvg_kv_host_set_spill(kvg_kv_host *h, kvg_kv_host_spill_fn fn, void *ctx)
{
    h->spill = fn;
    h->spill_ctx = ctx;
}

static unsigned char *payload(const kvg_kv_host *h, int32_t s)
{
    return h->buf + (size_t)s * h->slot_bytes;
}

static int32_t find(const kvg_kv_host *h, const uint8_t *hash)
{
    void *v;
    int32_t s;
    if (!kvg_u64map_find(&h->index, key_of(hash), &v))
        return NIL;
    s = (int32_t)((uintptr_t)v - 1);
    return memcmp(h->hash[s], hash, HLEN) == 0 ? s : NIL;
}

static void lru_remove(kvg_kv_host *h, int32_t s)
{
    if (h->prev[s] != NIL)
        h->next[h->prev[s]] = h->next[s];
    else
        h->head = h->next[s];
    if (h->next[s] != NIL)
        h->prev[h->next[s]] = h->prev[s];
    else
        h->tail = h->prev[s];
}

static void lru_push(kvg_kv_host *h, int32_t s)
{
    h->prev[s] = NIL;
    h->next[s] = h->head;
    if (h->head != NIL)
        h->prev[h->head] = s;
    h->head = s;
    if (h->tail == NIL)
        h->tail = s;
}

/* Slots the tenant of tag holds. */
static int64_t tag_count(const kvg_kv_host *h, const uint8_t *tag)
{
    void *v;
    return kvg_u64map_find(&h->tags, key_of(tag), &v) ? (int64_t)(uintptr_t)v : 0;
}

static void tag_add(kvg_kv_host *h, const uint8_t *tag, int64_t d)
{
    int64_t n = tag_count(h, tag) + d;
    if (n > 0)
        kvg_u64map_put(&h->tags, key_of(tag), (void *)(uintptr_t)n);
    else
        kvg_u64map_del(&h->tags, key_of(tag));
}

/* The slot leaves the tier (to the next one when `spill`, there is one and the block has
 * not expired: a TTL is how long the tenant wanted it kept). */
static void drop(kvg_kv_host *h, kvg_kv_pool *pool, int32_t s, int spill)
{
    if (spill && h->spill && h->expires[s] > h->now_ms) {
        if (h->put_seq[s] > h->waited_seq) {
            /* its copy from the pool may still be queued on the stream */
            kvg_kv_pool_xfer_wait(pool);
            h->waited_seq = h->seq;
        }
        h->spill(h->spill_ctx, payload(h, s), h->hash[s], h->tag[s], h->quota[s],
                 h->expires[s] == INT64_MAX ? INT64_MAX : h->expires[s] - h->now_ms);
        h->st.spilled++;
    }
    kvg_u64map_del(&h->index, key_of(h->hash[s]));
    tag_add(h, h->tag[s], -1);
    lru_remove(h, s);
    h->used[s] = 0;
    h->free_ids[h->n_free++] = s;
    h->st.slots_used--;
}

int kvg_kv_host_put(kvg_kv_host *h, kvg_kv_pool *pool, int32_t block, const uint8_t *hash,
                    const uint8_t *tag, double quota, int64_t expires_ms, int64_t now_ms)
{
    double t0 = mono_s();
    int32_t s = find(h, hash);
    void *v;
    if (now_ms > h->now_ms)
        h->now_ms = now_ms;
    if (kvg_kv_xfer_bytes(pool) != h->slot_bytes || expires_ms <= h->now_ms)
        return -1;
    if (s != NIL) {
        /* the same chain hash: the same bytes; now the most recently used */
        if (h->expires[s] < expires_ms)
            h->expires[s] = expires_ms;
        lru_remove(h, s);
        lru_push(h, s);
        return 0;
    }
    if (kvg_u64map_find(&h->index, key_of(hash), &v))
        return -1;               /* another hash with the same first 8 bytes: not kept */
    if (quota > 0.0) {
        int64_t share = (int64_t)(quota * (double)h->n_slots);
        if (share < 1)
            share = 1;
        if (tag_count(h, tag) >= share) {
            /* at its share: its own least recently used slot makes room */
            int32_t victim = h->tail;
            while (victim != NIL && memcmp(h->tag[victim], tag, HLEN) != 0)
                victim = h->prev[victim];
            if (victim != NIL) {
                drop(h, pool, victim, 1);
                h->st.evictions++;
                h->st.quota_evictions++;
            }
        }
    }
    if (h->n_free == 0) {
        drop(h, pool, h->tail, 1);
        h->st.evictions++;
    }
    s = h->free_ids[--h->n_free];
    if (kvg_kv_block_export(pool, block, payload(h, s)) != 0 ||
        kvg_u64map_put(&h->index, key_of(hash), (void *)(uintptr_t)(s + 1)) != 0) {
        h->free_ids[h->n_free++] = s;
        return -1;
    }
    memcpy(h->hash[s], hash, HLEN);
    memcpy(h->tag[s], tag, HLEN);
    tag_add(h, tag, 1);
    h->expires[s] = expires_ms;
    h->quota[s] = quota;
    h->used[s] = 1;
    h->put_seq[s] = ++h->seq;
    lru_push(h, s);
    h->st.slots_used++;
    h->st.puts++;
    h->st.bytes_out += h->slot_bytes;
    h->st.seconds += mono_s() - t0;
    return 0;
}

int kvg_kv_host_load(kvg_kv_host *h, kvg_kv_pool *pool, int32_t block, const uint8_t *hash,
                     const uint8_t *tag, int64_t now_ms)
{
    double t0 = mono_s();
    int32_t s = find(h, hash);
    if (now_ms > h->now_ms)
        h->now_ms = now_ms;
    if (s != NIL && h->expires[s] <= h->now_ms) {
        drop(h, pool, s, 0);     /* expired: never served, never moved on */
        h->st.expired++;
        s = NIL;
    }
    if (s == NIL || memcmp(h->tag[s], tag, HLEN) != 0 || kvg_kv_xfer_bytes(pool) != h->slot_bytes ||
        kvg_kv_block_import(pool, block, payload(h, s)) != 0) {
        h->st.misses++;
        return -1;
    }
    lru_remove(h, s);
    lru_push(h, s);
    h->st.hits++;
    h->st.bytes_in += h->slot_bytes;
    h->st.seconds += mono_s() - t0;
    return 0;
}

int kvg_kv_host_holds(const kvg_kv_host *h, const uint8_t *hash)
{
    return find(h, hash) != NIL;
}

int64_t kvg_kv_host_wipe(kvg_kv_host *h, const uint8_t *tag)
{
    int64_t n = 0;
    for (int32_t s = 0; s < h->n_slots; s++) {
        if (h->used[s] && memcmp(h->tag[s], tag, HLEN) == 0) {
            drop(h, NULL, s, 0);
            n++;
        }
    }
    h->st.wiped += (uint64_t)n;
    return n;
}

void kvg_kv_host_drain(kvg_kv_host *h, kvg_kv_pool *pool)
{
    if (!h->spill)
        return;
    while (h->tail != NIL)
        drop(h, pool, h->tail, 1);
}

void kvg_kv_host_get_stats(const kvg_kv_host *h, kvg_kv_host_stats *out)
{
    *out = h->st;
}
