/* The prefix cache over the paged KV pool: see prefix_cache.h for the block life
 * cycle. The pool calls back here when a block's count reaches 0 (keep it cached if
 * it has a hash) and when its free list runs dry (evict one cached block). */
#include "prefix_cache.h"
#include "prefix_cache_testing.h"
#include "errmsg.h"
#include "cache_index.h"
#include "kv_disk.h"
#include "kv_host.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define NIL (-1)
#define DEFAULT_TTL_MS (5 * 60 * 1000)

typedef struct pc_block {
    uint8_t hash[KVG_PREFIX_HASH_LEN];
    int32_t hnext;               /* hash bucket chain */
    int32_t prev, next;          /* global LRU (refcount 0, hashed, unpinned) */
    int32_t tprev, tnext;        /* the tenant's LRU */
    int64_t touched_ms, ttl_ms;
    int64_t hold_until_ms;       /* pinned: until then (kvg_pc_hold); INT64_MAX: for good */
    int32_t tenant;
    uint8_t hashed, pinned, in_lru;
} pc_block;

/* A tenant slot: live (salt != NULL) or on the free list. */
typedef struct pc_tenant {
    uint8_t *salt;               /* NULL: a free slot */
    size_t salt_len;
    uint64_t key;                /* SipHash of the salt */
    int32_t tnext;               /* the map's bucket chain; the free list when free */
    int32_t refs;                /* holders of the id (requests, callers of kvg_pc_tenant) */
    double quota;                /* share of the pool, 0: none */
    int32_t charged;             /* hashed blocks of this tenant, in use or cached */
    int32_t n_pinned;            /* of those, pinned (for good or held) */
    int32_t head, tail;          /* its LRU, least recent at head */
    uint8_t tag[KVG_PREFIX_HASH_LEN];  /* the disk tier's tenant tag (its chain root) */
    uint8_t has_tag;
} pc_tenant;

struct kvg_prefix_cache {
    kvg_kv_pool *pool;
    kvg_pc_config cfg;
    pc_block *b;
    int32_t *buckets;
    uint32_t mask;
    int32_t head, tail;          /* global LRU, least recent at head */
    int32_t n_lru, n_kept_pinned, n_pinned, pin_cap;
    int64_t now_ms;
    int64_t next_expiry_ms;      /* no cached block expires before this */
    int64_t next_hold_ms;        /* no hold ends before this */
    pc_tenant *tenants;
    int n_slots, cap_slots;      /* slots ever used (ids < n_slots), allocated */
    int n_live;                  /* live tenants */
    int n_quota;                 /* live tenants with a quota */
    int32_t free_tenant;         /* free slots, a list through tnext */
    int32_t *tbuckets;           /* salt map: bucket heads */
    uint32_t tmask;
    uint64_t sip[2];             /* the map's random key */
    kvg_pc_stats st;
    uint64_t recompute_tokens, recompute_hit_tokens;
    kvg_cache_index_writer *index;   /* the shared cache index, kept equal to the table (or NULL) */
    kvg_kv_disk *disk;           /* the disk tier (kvg_pc_set_disk), or NULL */
    kvg_kv_host *host;           /* the host tier before it (kvg_pc_set_host), or NULL */
    kvg_prefix_hasher *hasher;   /* for tenant tags, with the disk tier */
    int disk_sync;               /* kvg_pc_disk_sync_reads */
};

/* A waiting request's disk reads (kvg_pc_fetch_start): rd[i] reads chain block from + i,
 * NULL where the host tier held the block when the reads started. */
struct kvg_pc_fetch {
    kvg_kv_disk *disk;           /* its store (the cache's may be detached before it is freed) */
    int32_t from, n;
    kvg_kv_disk_read *rd[];
};

static uint32_t bucket_of(const kvg_prefix_cache *pc, const uint8_t *h)
{
    uint32_t v;
    memcpy(&v, h, sizeof v);     /* SHA-256 output: any 4 bytes are uniform */
    return v & pc->mask;
}

static int32_t table_find(const kvg_prefix_cache *pc, const uint8_t *h)
{
    for (int32_t id = pc->buckets[bucket_of(pc, h)]; id != NIL; id = pc->b[id].hnext)
        if (memcmp(pc->b[id].hash, h, KVG_PREFIX_HASH_LEN) == 0)
            return id;
    return NIL;
}

static void table_insert(kvg_prefix_cache *pc, int32_t id)
{
    uint32_t k = bucket_of(pc, pc->b[id].hash);
    pc->b[id].hnext = pc->buckets[k];
    pc->buckets[k] = id;
    /* Every hash that enters the table enters the cache index, and leaves it with the
     * table (table_remove): the one place each happens, so the two stay equal. */
    if (pc->index)
        kvg_cache_index_add(pc->index, pc->b[id].hash);
}

static void table_remove(kvg_prefix_cache *pc, int32_t id)
{
    int32_t *pp = &pc->buckets[bucket_of(pc, pc->b[id].hash)];
    while (*pp != NIL && *pp != id)
        pp = &pc->b[*pp].hnext;
    if (*pp == id) {
        *pp = pc->b[id].hnext;
        if (pc->index)
            kvg_cache_index_remove(pc->index, pc->b[id].hash);
    }
    pc->b[id].hnext = NIL;
}

static void lru_push(kvg_prefix_cache *pc, int32_t id)
{
    pc_block *bl = &pc->b[id];
    pc_tenant *t = &pc->tenants[bl->tenant];
    bl->next = NIL;
    bl->prev = pc->tail;
    if (pc->tail != NIL)
        pc->b[pc->tail].next = id;
    else
        pc->head = id;
    pc->tail = id;
    bl->tnext = NIL;
    bl->tprev = t->tail;
    if (t->tail != NIL)
        pc->b[t->tail].tnext = id;
    else
        t->head = id;
    t->tail = id;
    bl->in_lru = 1;
    pc->n_lru++;
}

static void lru_remove(kvg_prefix_cache *pc, int32_t id)
{
    pc_block *bl = &pc->b[id];
    pc_tenant *t = &pc->tenants[bl->tenant];
    if (!bl->in_lru)
        return;
    if (bl->prev != NIL) pc->b[bl->prev].next = bl->next; else pc->head = bl->next;
    if (bl->next != NIL) pc->b[bl->next].prev = bl->prev; else pc->tail = bl->prev;
    if (bl->tprev != NIL) pc->b[bl->tprev].tnext = bl->tnext; else t->head = bl->tnext;
    if (bl->tnext != NIL) pc->b[bl->tnext].tprev = bl->tprev; else t->tail = bl->tprev;
    bl->prev = bl->next = bl->tprev = bl->tnext = NIL;
    bl->in_lru = 0;
    pc->n_lru--;
}

/* ---- the tenant map ---- */

/* SipHash-2-4 of the salt under the cache's random key: salts come from clients, and
 * a keyed hash leaves them no way to pile their tenants into one bucket. */
static uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

#define SIPROUND do { \
        v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32); \
        v2 += v3; v3 = rotl(v3, 16); v3 ^= v2; \
        v0 += v3; v3 = rotl(v3, 21); v3 ^= v0; \
        v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32); \
    } while (0)

static uint64_t siphash(const uint64_t k[2], const uint8_t *p, size_t len)
{
    uint64_t v0 = k[0] ^ 0x736f6d6570736575ull, v1 = k[1] ^ 0x646f72616e646f6dull;
    uint64_t v2 = k[0] ^ 0x6c7967656e657261ull, v3 = k[1] ^ 0x7465646279746573ull;
    uint64_t m, b = (uint64_t)len << 56;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        m = 0;
        for (int j = 0; j < 8; j++)
            m |= (uint64_t)p[i + j] << (8 * j);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    for (int j = 0; i + (size_t)j < len; j++)
        b |= (uint64_t)p[i + (size_t)j] << (8 * j);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

static int32_t tenant_lookup(const kvg_prefix_cache *pc, const void *salt, size_t len, uint64_t key)
{
    for (int32_t t = pc->tbuckets[key & pc->tmask]; t != NIL; t = pc->tenants[t].tnext) {
        const pc_tenant *tn = &pc->tenants[t];
        if (tn->key == key && tn->salt_len == len && (len == 0 || memcmp(tn->salt, salt, len) == 0))
            return t;
    }
    return NIL;
}

/* Doubles the bucket array when the map is full; a failed allocation only makes the
 * chains longer, so it is not an error. */
static void tenant_map_grow(kvg_prefix_cache *pc)
{
    uint32_t n = (pc->tmask + 1) * 2;
    int32_t *nb;
    if ((uint32_t)pc->n_live < pc->tmask + 1 || n > (1u << 28))
        return;
    nb = malloc((size_t)n * sizeof *nb);
    if (!nb)
        return;
    for (uint32_t i = 0; i < n; i++)
        nb[i] = NIL;
    for (int32_t t = 0; t < pc->n_slots; t++) {
        pc_tenant *tn = &pc->tenants[t];
        if (!tn->salt)
            continue;
        tn->tnext = nb[tn->key & (n - 1)];
        nb[tn->key & (n - 1)] = t;
    }
    free(pc->tbuckets);
    pc->tbuckets = nb;
    pc->tmask = n - 1;
}

/* Reclaims a tenant nothing holds: no reference, no hashed block. */
static void tenant_release(kvg_prefix_cache *pc, int32_t t)
{
    pc_tenant *tn = &pc->tenants[t];
    int32_t *pp;
    if (tn->refs > 0 || tn->charged > 0)
        return;
    for (pp = &pc->tbuckets[tn->key & pc->tmask]; *pp != t; pp = &pc->tenants[*pp].tnext)
        ;
    *pp = tn->tnext;
    if (tn->quota > 0.0)
        pc->n_quota--;
    free(tn->salt);
    memset(tn, 0, sizeof *tn);
    tn->head = tn->tail = NIL;
    tn->tnext = pc->free_tenant;
    pc->free_tenant = t;
    pc->n_live--;
}

static int tenant_is_live(const kvg_prefix_cache *pc, int t)
{
    return t >= 0 && t < pc->n_slots && pc->tenants[t].salt != NULL;
}

static int64_t expiry_of(const pc_block *bl)
{
    if (bl->ttl_ms > INT64_MAX - bl->touched_ms)
        return INT64_MAX;
    return bl->touched_ms + bl->ttl_ms;
}

/* Drops a block's hash (its chain entry is gone for good). */
static void unhash(kvg_prefix_cache *pc, int32_t id)
{
    pc_block *bl = &pc->b[id];
    if (!bl->hashed)
        return;
    lru_remove(pc, id);
    table_remove(pc, id);
    if (bl->pinned) {
        pc->n_pinned--;
        pc->tenants[bl->tenant].n_pinned--;
        if (kvg_kv_block_refcount(pc->pool, id) == 0)
            pc->n_kept_pinned--;
    }
    bl->hashed = bl->pinned = 0;
    /* The block's hold on its tenant ends with its hash: the tenant may go now. */
    pc->tenants[bl->tenant].charged--;
    tenant_release(pc, bl->tenant);
    bl->tenant = NIL;
}

/* The disk tier's tag of a live tenant: the chain root of its salt (computed once), or
 * NULL when it cannot be hashed. */
static const uint8_t *tenant_tag(kvg_prefix_cache *pc, int32_t t)
{
    pc_tenant *tn = &pc->tenants[t];
    if (!tn->has_tag) {
        if (!pc->hasher || kvg_prefix_root(pc->hasher, pc->cfg.model_id, KVG_PREFIX_HASH_LEN, tn->salt,
                                           tn->salt_len, tn->tag, NULL, 0) != 0)
            return NULL;
        tn->has_tag = 1;
    }
    return tn->tag;
}

/* The expiry a block takes to the tiers after the pool: its own; a pinned one (only a
 * clean stop moves those) none while pinned for good, else at least its hold's end. */
static int64_t tier_expiry(const pc_block *bl)
{
    int64_t exp = expiry_of(bl);
    if (bl->pinned && bl->hold_until_ms > exp)
        return bl->hold_until_ms;
    return exp;
}

/* A cached block leaves the pool: its bytes go to the next tier, the host tier's slots
 * (a copy queued now) or the disk's queue (the copy made now), with its expiry and its
 * tenant's quota. Not on expiry: a TTL is how long the tenant wanted it kept. wait: at a
 * clean stop, straight to the disk, waiting for room in its queue. */
static void spill(kvg_prefix_cache *pc, int32_t id, int wait)
{
    const uint8_t *tag;
    double quota;
    int64_t exp;
    if ((!pc->disk && !pc->host) || !pc->b[id].hashed || !(tag = tenant_tag(pc, pc->b[id].tenant)))
        return;
    quota = pc->tenants[pc->b[id].tenant].quota;
    exp = tier_expiry(&pc->b[id]);
    if (pc->host && !wait &&
        kvg_kv_host_put(pc->host, pc->pool, id, pc->b[id].hash, tag, quota, exp, pc->now_ms) == 0)
        return;
    if (pc->disk)    /* the disk keeps wall-clock time: the time left, not the pool's clock */
        kvg_kv_disk_spill(pc->disk, pc->pool, id, pc->b[id].hash, tag, quota,
                          exp == INT64_MAX ? KVG_KV_DISK_NO_EXPIRY : exp - pc->now_ms, wait);
}

/* A slot leaving the host tier goes on to the disk (kv_host.h's spill). */
static void host_to_disk(void *ctx, const void *payload, const uint8_t *hash, const uint8_t *tag,
                         double quota, int64_t ttl_ms)
{
    kvg_prefix_cache *pc = ctx;
    kvg_kv_disk_spill_bytes(pc->disk, payload, kvg_kv_xfer_bytes(pc->pool), hash, tag, quota,
                            ttl_ms == INT64_MAX ? KVG_KV_DISK_NO_EXPIRY : ttl_ms, 0);
}

/* A cached block (refcount 0) goes back to the pool's free list. */
static void evict(kvg_prefix_cache *pc, int32_t id, int cause)
{
    if (cause != KVG_EVICT_TTL)
        spill(pc, id, 0);
    unhash(pc, id);
    kvg_kv_block_put_free(pc->pool, id);
    pc->st.evictions[cause]++;
}

static int64_t ttl_or_default(const kvg_prefix_cache *pc, int64_t ttl_ms)
{
    return ttl_ms > 0 ? ttl_ms : pc->cfg.default_ttl_ms;
}

static void set_now(kvg_prefix_cache *pc, int64_t now_ms)
{
    if (now_ms > pc->now_ms)
        pc->now_ms = now_ms;
}

/* Pool hook: a block's count reached 0. */
static int on_zero(void *ctx, int32_t id)
{
    kvg_prefix_cache *pc = ctx;
    pc_block *bl = &pc->b[id];
    int64_t exp;
    if (!bl->hashed)
        return 0;
    /* Release counts as a touch: a block in use for longer than its TTL must not
     * expire the moment it is let go. */
    bl->touched_ms = pc->now_ms;
    if (bl->pinned) {
        pc->n_kept_pinned++;
        return 1;
    }
    lru_push(pc, id);
    exp = expiry_of(bl);
    if (exp < pc->next_expiry_ms)
        pc->next_expiry_ms = exp;
    return 1;
}

static int32_t sweep(kvg_prefix_cache *pc)
{
    int32_t n = 0, id = pc->head;
    int64_t next = INT64_MAX;
    while (id != NIL) {
        int32_t nx = pc->b[id].next;
        int64_t exp = expiry_of(&pc->b[id]);
        if (exp <= pc->now_ms) {
            evict(pc, id, KVG_EVICT_TTL);
            n++;
        } else if (exp < next) {
            next = exp;
        }
        id = nx;
    }
    pc->next_expiry_ms = next;
    return n;
}

/* Holds whose time has come end: the block is an ordinary cached one again, its TTL
 * (at least the hold's) counted from its last use, so a block nobody used meanwhile
 * expires at once. */
static void end_holds(kvg_prefix_cache *pc)
{
    int64_t next = INT64_MAX;
    for (int32_t id = 0; id < pc->pool->n_blocks; id++) {
        pc_block *bl = &pc->b[id];
        int64_t exp;
        if (!bl->hashed || !bl->pinned || bl->hold_until_ms == INT64_MAX)
            continue;
        if (bl->hold_until_ms > pc->now_ms) {
            if (bl->hold_until_ms < next)
                next = bl->hold_until_ms;
            continue;
        }
        bl->pinned = 0;
        bl->hold_until_ms = 0;
        pc->n_pinned--;
        pc->tenants[bl->tenant].n_pinned--;
        if (kvg_kv_block_refcount(pc->pool, id) == 0) {
            pc->n_kept_pinned--;
            lru_push(pc, id);
            exp = expiry_of(bl);
            if (exp < pc->next_expiry_ms)
                pc->next_expiry_ms = exp;
        }
    }
    pc->next_hold_ms = next;
}

static void sweep_if_due(kvg_prefix_cache *pc)
{
    if (pc->now_ms >= pc->next_hold_ms)
        end_holds(pc);
    if (pc->now_ms >= pc->next_expiry_ms)
        sweep(pc);
}

/* The tenant furthest over its quota that has something evictable, or -1. */
static int over_quota_tenant(const kvg_prefix_cache *pc)
{
    int best = -1;
    double best_over = 0.0;
    if (pc->n_quota == 0)
        return -1;               /* no tenant has a quota: nothing to scan */
    for (int t = 0; t < pc->n_slots; t++) {
        const pc_tenant *tn = &pc->tenants[t];
        double over;
        if (!tn->salt || tn->quota <= 0.0 || tn->head == NIL)
            continue;
        over = (double)tn->charged - tn->quota * (double)pc->pool->n_blocks;
        if (over > best_over) {
            best_over = over;
            best = t;
        }
    }
    return best;
}

/* Pool hook: the free list is empty; free one cached block. */
static int on_reclaim(void *ctx)
{
    kvg_prefix_cache *pc = ctx;
    int32_t before = pc->pool->n_free;
    int t;
    sweep_if_due(pc);
    if (pc->pool->n_free > before)
        return 0;
    t = over_quota_tenant(pc);
    if (t >= 0) {
        evict(pc, pc->tenants[t].head, KVG_EVICT_QUOTA);
        return 0;
    }
    if (pc->head != NIL) {
        evict(pc, pc->head, KVG_EVICT_LRU);
        return 0;
    }
    return -1;
}

kvg_prefix_cache *kvg_pc_new(kvg_kv_pool *pool, const kvg_pc_config *cfg,
                             char *err, size_t err_len)
{
    kvg_prefix_cache *pc;
    uint32_t nb = 16;
    if (!pool || !cfg) {
        kvg_set_err(err, err_len, "prefix cache: no pool or config");
        return NULL;
    }
    if (pool->keep || pool->reclaim) {
        kvg_set_err(err, err_len, "prefix cache: the pool already has an owner");
        return NULL;
    }
    if (!(cfg->pinned_share >= 0.0 && cfg->pinned_share <= 1.0) ||
        !(cfg->default_quota >= 0.0 && cfg->default_quota <= 1.0) || cfg->default_ttl_ms < 0) {
        kvg_set_err(err, err_len, "prefix cache: pinned share and quota must be in [0, 1], "
                    "the TTL non-negative");
        return NULL;
    }
    if (pool->n_free != pool->n_blocks) {
        kvg_set_err(err, err_len, "prefix cache: the pool must be unused");
        return NULL;
    }
    while (nb < (uint32_t)pool->n_blocks * 2u && nb < (1u << 30))
        nb <<= 1;
    pc = calloc(1, sizeof *pc);
    if (!pc) {
        kvg_set_err(err, err_len, "prefix cache: out of memory");
        return NULL;
    }
    pc->pool = pool;
    pc->cfg = *cfg;
    if (pc->cfg.default_ttl_ms == 0)
        pc->cfg.default_ttl_ms = DEFAULT_TTL_MS;
    pc->b = calloc((size_t)pool->n_blocks, sizeof *pc->b);
    pc->buckets = malloc((size_t)nb * sizeof *pc->buckets);
    pc->tmask = 63;
    pc->tbuckets = malloc((size_t)(pc->tmask + 1) * sizeof *pc->tbuckets);
    if (!pc->b || !pc->buckets || !pc->tbuckets) {
        kvg_set_err(err, err_len, "prefix cache: out of memory for %d blocks", (int)pool->n_blocks);
        kvg_pc_free(pc);
        return NULL;
    }
    pc->mask = nb - 1;
    for (uint32_t i = 0; i < nb; i++)
        pc->buckets[i] = NIL;
    for (uint32_t i = 0; i <= pc->tmask; i++)
        pc->tbuckets[i] = NIL;
    pc->free_tenant = NIL;
    if (getrandom(pc->sip, sizeof pc->sip, GRND_NONBLOCK) != (ssize_t)sizeof pc->sip) {
        /* No entropy yet (early boot): the clock and an address still keep the key
         * unknown to a remote client. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        pc->sip[0] = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
        pc->sip[1] = (uint64_t)(uintptr_t)pc * 0xc2b2ae3d27d4eb4full ^ (uint64_t)ts.tv_nsec;
    }
    for (int32_t i = 0; i < pool->n_blocks; i++) {
        pc_block *bl = &pc->b[i];
        bl->hnext = bl->prev = bl->next = bl->tprev = bl->tnext = NIL;
    }
    pc->head = pc->tail = NIL;
    pc->pin_cap = (int32_t)(cfg->pinned_share * (double)pool->n_blocks);
    pc->now_ms = 0;
    pc->next_expiry_ms = INT64_MAX;
    pc->next_hold_ms = INT64_MAX;
    pool->keep = on_zero;
    pool->reclaim = on_reclaim;
    pool->hook_ctx = pc;
    return pc;
}

void kvg_pc_free(kvg_prefix_cache *pc)
{
    if (!pc)
        return;
    if (pc->pool && pc->pool->hook_ctx == pc) {
        /* Cached blocks go back to the pool, which becomes a plain pool again. */
        for (int32_t i = 0; pc->b && i < pc->pool->n_blocks; i++)
            if (pc->b[i].hashed && kvg_kv_block_refcount(pc->pool, i) == 0)
                kvg_kv_block_put_free(pc->pool, i);
        pc->pool->keep = NULL;
        pc->pool->reclaim = NULL;
        pc->pool->hook_ctx = NULL;
    }
    for (int t = 0; pc->tenants && t < pc->n_slots; t++)
        free(pc->tenants[t].salt);
    kvg_prefix_hasher_free(pc->hasher);
    free(pc->tenants);
    free(pc->tbuckets);
    free(pc->b);
    free(pc->buckets);
    free(pc);
}

int kvg_pc_set_index(kvg_prefix_cache *pc, kvg_cache_index_writer *w)
{
    pc->index = NULL;
    if (!w)
        return 0;
    kvg_cache_index_clear(w);
    for (int32_t i = 0; i < pc->pool->n_blocks; i++)
        if (pc->b[i].hashed && kvg_cache_index_add(w, pc->b[i].hash) != 0) {
            kvg_cache_index_clear(w);
            return -1;
        }
    pc->index = w;
    return 0;
}

int kvg_pc_holds(const kvg_prefix_cache *pc, const uint8_t hash[KVG_PREFIX_HASH_LEN])
{
    return table_find(pc, hash) != NIL;
}

int kvg_pc_tenant(kvg_prefix_cache *pc, const void *salt, size_t len, double quota)
{
    pc_tenant *tn;
    uint64_t key;
    int32_t t;
    if (!(quota >= 0.0 && quota <= 1.0) || (len && !salt))
        return -1;
    key = siphash(pc->sip, salt, len);
    t = tenant_lookup(pc, salt, len, key);
    if (t != NIL) {
        tn = &pc->tenants[t];
        if (tn->refs == INT32_MAX)
            return -1;
        if (quota > 0.0) {
            pc->n_quota += tn->quota <= 0.0;
            tn->quota = quota;
        }
        tn->refs++;
        return t;
    }
    if (pc->free_tenant == NIL) {
        if (pc->n_slots == pc->cap_slots) {
            int nc = pc->cap_slots ? pc->cap_slots * 2 : 64;
            pc_tenant *nt;
            if (pc->cap_slots > INT32_MAX / 4)
                return -1;
            nt = realloc(pc->tenants, (size_t)nc * sizeof *nt);
            if (!nt)
                return -1;
            pc->tenants = nt;
            pc->cap_slots = nc;
        }
        memset(&pc->tenants[pc->n_slots], 0, sizeof pc->tenants[0]);
        pc->tenants[pc->n_slots].tnext = NIL;
        pc->free_tenant = pc->n_slots++;
    }
    t = pc->free_tenant;
    tn = &pc->tenants[t];
    {
        uint8_t *copy = malloc(len ? len : 1);
        if (!copy)
            return -1;
        if (len)
            memcpy(copy, salt, len);
        pc->free_tenant = tn->tnext;
        tn->salt = copy;
    }
    tn->salt_len = len;
    tn->key = key;
    tn->refs = 1;
    tn->charged = 0;
    tn->quota = quota > 0.0 ? quota : pc->cfg.default_quota;
    pc->n_quota += tn->quota > 0.0;
    tn->head = tn->tail = NIL;
    tn->tnext = pc->tbuckets[key & pc->tmask];
    pc->tbuckets[key & pc->tmask] = t;
    pc->n_live++;
    tenant_map_grow(pc);
    return t;
}

int kvg_pc_tenant_ref(kvg_prefix_cache *pc, int tenant)
{
    if (!tenant_is_live(pc, tenant) || pc->tenants[tenant].refs == INT32_MAX)
        return -1;
    pc->tenants[tenant].refs++;
    return 0;
}

void kvg_pc_tenant_put(kvg_prefix_cache *pc, int tenant)
{
    if (!tenant_is_live(pc, tenant) || pc->tenants[tenant].refs <= 0)
        return;
    pc->tenants[tenant].refs--;
    tenant_release(pc, tenant);
}

int kvg_pc_tenant_find(const kvg_prefix_cache *pc, const void *salt, size_t len)
{
    if (len && !salt)
        return -1;
    return tenant_lookup(pc, salt, len, siphash(pc->sip, salt, len));
}

int kvg_pc_tenant_live(const kvg_prefix_cache *pc, int tenant)
{
    return tenant_is_live(pc, tenant);
}

int kvg_pc_tenant_root(kvg_prefix_cache *pc, kvg_prefix_hasher *h, int tenant,
                       uint8_t root[KVG_PREFIX_HASH_LEN], char *err, size_t err_len)
{
    if (!tenant_is_live(pc, tenant)) {
        kvg_set_err(err, err_len, "prefix cache: no tenant %d", tenant);
        return -1;
    }
    return kvg_prefix_root(h, pc->cfg.model_id, KVG_PREFIX_HASH_LEN, pc->tenants[tenant].salt,
                           pc->tenants[tenant].salt_len, root, err, err_len);
}

int kvg_pc_salt_root(const kvg_prefix_cache *pc, kvg_prefix_hasher *h, const void *salt,
                     size_t len, uint8_t root[KVG_PREFIX_HASH_LEN], char *err, size_t err_len)
{
    return kvg_prefix_root(h, pc->cfg.model_id, KVG_PREFIX_HASH_LEN, salt, len, root, err, err_len);
}

int32_t kvg_pc_tenant_cached_blocks(const kvg_prefix_cache *pc, int tenant)
{
    if (!tenant_is_live(pc, tenant))
        return -1;
    return pc->tenants[tenant].charged;
}

int kvg_pc_tenant_count(const kvg_prefix_cache *pc)
{
    return pc->n_live;
}

int kvg_pc_tenant_slots(const kvg_prefix_cache *pc)
{
    return pc->n_slots;
}

const void *kvg_pc_tenant_salt(const kvg_prefix_cache *pc, int tenant, size_t *len)
{
    if (!tenant_is_live(pc, tenant))
        return NULL;
    *len = pc->tenants[tenant].salt_len;
    return pc->tenants[tenant].salt;
}

void kvg_pc_set_model(kvg_prefix_cache *pc, const uint8_t model_id[KVG_PREFIX_HASH_LEN])
{
    if (memcmp(pc->cfg.model_id, model_id, KVG_PREFIX_HASH_LEN) == 0)
        return;
    memcpy(pc->cfg.model_id, model_id, KVG_PREFIX_HASH_LEN);
    for (int32_t i = 0; i < pc->pool->n_blocks; i++) {
        if (!pc->b[i].hashed)
            continue;
        if (kvg_kv_block_refcount(pc->pool, i) == 0) {
            unhash(pc, i);
            kvg_kv_block_put_free(pc->pool, i);
        } else
            unhash(pc, i);   /* stays with its sequence, freed on release */
    }
}

/* Leading blocks of the chain that can be served: found, same tenant, and never the
 * block holding the last prompt token. */
static int32_t count_hits(const kvg_prefix_cache *pc, int tenant,
                          const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], int32_t n_hashes,
                          int32_t n_tokens, int32_t *ids, int32_t *n_kept)
{
    int32_t bt = pc->pool->geom.block_tokens;
    int32_t max = n_tokens > 0 ? (n_tokens - 1) / bt : 0, n = 0;
    if (n_hashes < max)
        max = n_hashes;
    if (n_kept)
        *n_kept = 0;
    for (; n < max; n++) {
        int32_t id = table_find(pc, hashes[n]);
        if (id == NIL || pc->b[id].tenant != tenant)
            break;
        if (ids)
            ids[n] = id;
        if (n_kept && kvg_kv_block_refcount(pc->pool, id) == 0 && pc->b[id].in_lru)
            (*n_kept)++;
    }
    return n;
}

int32_t kvg_pc_blocks_needed(const kvg_prefix_cache *pc,
                             const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], int32_t n_hashes,
                             int32_t n_tokens)
{
    /* Tenant-agnostic (the signature has none): hits are counted whoever owns them,
     * which can only under-estimate by the blocks of another tenant with the same
     * hash -- impossible, as the salt is in every hash. */
    int32_t bt = pc->pool->geom.block_tokens;
    int32_t max = n_tokens > 0 ? (n_tokens - 1) / bt : 0, n = 0;
    if (n_hashes < 0 || n_tokens < 0)
        return -1;
    if (n_hashes < max)
        max = n_hashes;
    while (n < max && table_find(pc, hashes[n]) != NIL)
        n++;
    return (n_tokens + bt - 1) / bt - n;
}

static void pin_or_ttl(kvg_prefix_cache *pc, pc_block *bl, int64_t ttl_ms);

/* Makes a block of seq findable under hash for tenant (it is full and written). */
static void publish(kvg_prefix_cache *pc, int32_t id, const uint8_t *hash, int tenant, int64_t ttl_ms)
{
    pc_block *bl = &pc->b[id];
    memcpy(bl->hash, hash, KVG_PREFIX_HASH_LEN);
    bl->hashed = 1;
    bl->tenant = tenant;
    bl->touched_ms = pc->now_ms;
    bl->pinned = 0;
    bl->hold_until_ms = 0;
    pin_or_ttl(pc, bl, ttl_ms);
    table_insert(pc, id);
    pc->tenants[tenant].charged++;
}

/* Block n of an admission with reads (kvg_pc_fetch_start) into pool block id from the
 * disk: what f's read brought in. Or a block that was in a faster tier when f started (a
 * pool hit before f->from, a host block f skipped) and is on disk now: this admission's
 * own evictions (pool -> host -> disk) moved it there a moment ago, so it is loaded
 * directly, from the write queue or the page cache (a block it was never going to wait
 * for). Anything else is a miss: admission never waits for the disk. 0 or -1. */
static int fetched(kvg_prefix_cache *pc, const kvg_pc_fetch *f, int32_t n, int32_t id, const uint8_t *hash,
                   const uint8_t *tag)
{
    if (!f || n >= f->from + f->n)
        return -1;
    if (n >= f->from && f->rd[n - f->from])
        return kvg_kv_disk_read_import(f->disk, f->rd[n - f->from], pc->pool, id);
    return kvg_kv_disk_load(f->disk, pc->pool, id, hash, tag);
}

/* Admission's slower tiers: the chain goes on from block `from` (the first the pool
 * missed) in host memory, else on disk, block by block. Each block found is copied into
 * the fresh block admission reserved for it (from the host tier: queued on the device's
 * stream, before the step that reads it) and published, as if it had been computed; the
 * first one missing in both (or failing its checks) ends the run. Returns the blocks
 * found. */
static int32_t tier_hits(kvg_prefix_cache *pc, kvg_kv_seq *seq, int tenant,
                         const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], int32_t n_hashes,
                         int32_t n_tokens, int32_t from, int64_t ttl_ms, int async, const kvg_pc_fetch *f)
{
    int32_t bt = pc->pool->geom.block_tokens;
    int32_t max = (n_tokens - 1) / bt, n = from;
    const uint8_t *tag;
    if ((!pc->disk && !pc->host) || n_hashes == 0 || !(tag = tenant_tag(pc, tenant)))
        return 0;
    if (n_hashes < max)
        max = n_hashes;
    for (; n < max; n++) {
        int32_t id = seq->blocks[n];
        if (table_find(pc, hashes[n]) != NIL)
            break;
        if (pc->host && kvg_kv_host_load(pc->host, pc->pool, id, hashes[n], tag, pc->now_ms) == 0) {
            pc->st.host_hit_tokens += (uint64_t)bt;
        } else if (async ? fetched(pc, f, n, id, hashes[n], tag) == 0
                         : (pc->disk && kvg_kv_disk_load(pc->disk, pc->pool, id, hashes[n], tag) == 0)) {
            pc->st.disk_hit_tokens += (uint64_t)bt;
        } else {
            break;
        }
        publish(pc, id, hashes[n], tenant, ttl_ms);
    }
    return n - from;
}

kvg_pc_fetch *kvg_pc_fetch_start(kvg_prefix_cache *pc, int tenant,
                                 const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], int32_t n_hashes,
                                 int32_t n_tokens)
{
    int32_t bt = pc->pool->geom.block_tokens, max, from, n;
    const uint8_t *tag;
    kvg_pc_fetch *f;
    if (!pc->disk || pc->disk_sync || n_hashes <= 0 || n_tokens <= 0 || !hashes ||
        !tenant_is_live(pc, tenant) || !(tag = tenant_tag(pc, tenant)))
        return NULL;
    max = (n_tokens - 1) / bt;
    if (n_hashes < max)
        max = n_hashes;
    from = count_hits(pc, tenant, hashes, n_hashes, n_tokens, NULL, NULL);
    if (from >= max)
        return NULL;
    f = calloc(1, sizeof *f + (size_t)(max - from) * sizeof f->rd[0]);
    if (!f)
        return NULL;             /* no memory: those blocks are recomputed */
    f->disk = pc->disk;
    f->from = from;
    /* The run admission would walk: host blocks are copied then, disk blocks read now;
     * it ends at the first block neither holds, or whose read cannot be staged. */
    for (n = from; n < max; n++) {
        if (pc->host && kvg_kv_host_holds(pc->host, hashes[n]))
            continue;
        if (!(f->rd[n - from] = kvg_kv_disk_read_start(pc->disk, hashes[n], tag)))
            break;
    }
    f->n = n - from;
    if (f->n == 0) {             /* nothing in host memory nor on disk */
        free(f);
        return NULL;
    }
    return f;                    /* with no read (all in host memory) it is not pending */
}

int kvg_pc_fetch_pending(kvg_prefix_cache *pc, const kvg_pc_fetch *f)
{
    (void)pc;
    for (int32_t i = 0; f && i < f->n; i++)
        if (f->rd[i] && kvg_kv_disk_read_state(f->disk, f->rd[i]) == KVG_KV_DISK_READ_PENDING)
            return 1;
    return 0;
}

void kvg_pc_fetch_free(kvg_prefix_cache *pc, kvg_pc_fetch *f)
{
    if (!f)
        return;
    (void)pc;
    for (int32_t i = 0; i < f->n; i++)
        kvg_kv_disk_read_put(f->disk, f->rd[i]);
    free(f);
}

void kvg_pc_disk_sync_reads(kvg_prefix_cache *pc, int sync)
{
    pc->disk_sync = sync != 0;
}

int kvg_pc_disk_fd(const kvg_prefix_cache *pc)
{
    return kvg_kv_disk_read_fd(pc->disk);
}

int kvg_pc_disk_wait(const kvg_prefix_cache *pc, int timeout_ms)
{
    struct pollfd p = { .fd = kvg_pc_disk_fd(pc), .events = POLLIN };
    uint64_t v;
    if (p.fd < 0 || poll(&p, 1, timeout_ms) <= 0)
        return 0;
    if (read(p.fd, &v, sizeof v) < 0) {
        /* EAGAIN: another waiter cleared it */
    }
    return 1;
}

/* Pins a hashed block that is not (until: INT64_MAX for good, else a hold's end) within
 * the pool's cap and its tenant's; 0 when a cap refuses. A cached block leaves the LRU. */
static int pin(kvg_prefix_cache *pc, int32_t id, int64_t until)
{
    pc_block *bl = &pc->b[id];
    pc_tenant *tn = &pc->tenants[bl->tenant];
    if (pc->n_pinned >= pc->pin_cap || (pc->cfg.tenant_pin_blocks > 0 && tn->n_pinned >= pc->cfg.tenant_pin_blocks))
        return 0;
    bl->pinned = 1;
    bl->hold_until_ms = until;
    pc->n_pinned++;
    tn->n_pinned++;
    if (bl->in_lru) {            /* cached (refcount 0) */
        lru_remove(pc, id);
        pc->n_kept_pinned++;
    }
    if (until < pc->next_hold_ms)
        pc->next_hold_ms = until;
    return 1;
}

static void pin_or_ttl(kvg_prefix_cache *pc, pc_block *bl, int64_t ttl_ms)
{
    if (ttl_ms == KVG_PC_TTL_PINNED) {
        if (!bl->pinned)
            pin(pc, (int32_t)(bl - pc->b), INT64_MAX);
        else
            bl->hold_until_ms = INT64_MAX;      /* a hold becomes a pin for good */
        if (bl->pinned)
            return;
        ttl_ms = 0;      /* over the pin cap: an ordinary entry */
    }
    if (!bl->pinned)
        bl->ttl_ms = ttl_or_default(pc, ttl_ms);
}

int32_t kvg_pc_hold(kvg_prefix_cache *pc, const kvg_kv_seq *seq, int32_t from, int32_t n_blocks, int64_t hold_ms,
                    int64_t now_ms)
{
    int32_t held = 0;
    int64_t until;
    set_now(pc, now_ms);
    if (hold_ms <= 0 || from < 0)
        return 0;
    until = hold_ms > INT64_MAX - pc->now_ms ? INT64_MAX - 1 : pc->now_ms + hold_ms;
    for (int32_t i = from; i < from + n_blocks && i < seq->n_blocks; i++) {
        int32_t id = seq->blocks[i];
        pc_block *bl = &pc->b[id];
        if (!bl->hashed)
            continue;            /* not published (a private copy): nothing to keep */
        /* after the hold, at least its TTL, so that it ends as the hold does */
        bl->touched_ms = pc->now_ms;
        if (bl->ttl_ms < hold_ms)
            bl->ttl_ms = hold_ms;
        if (bl->pinned) {
            if (bl->hold_until_ms < until)
                bl->hold_until_ms = until;
            held++;
        } else {
            held += pin(pc, id, until);
        }
    }
    return held;
}

/* Admission; async: the disk tier serves only f's reads (f may be NULL: nothing). */
static int32_t admit(kvg_prefix_cache *pc, kvg_kv_seq *seq, int tenant,
                     const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], int32_t n_hashes,
                     int32_t n_tokens, int64_t ttl_ms, int64_t now_ms, int recompute, int async,
                     const kvg_pc_fetch *f, char *err, size_t err_len)
{
    int32_t bt = pc->pool->geom.block_tokens;
    int32_t n_hit, n_kept, total, need, evictable;
    int32_t *ids = NULL;

    if (!seq || seq->n_blocks != 0 || seq->n_tokens != 0) {
        kvg_set_err(err, err_len, "prefix cache: admission into a non-empty sequence");
        return -1;
    }
    if (n_hashes > 0 ? !tenant_is_live(pc, tenant) : (tenant != -1 && !tenant_is_live(pc, tenant))) {
        kvg_set_err(err, err_len, "prefix cache: no tenant %d", tenant);
        return -1;
    }
    if (n_tokens <= 0 || n_hashes < 0 || n_hashes > n_tokens / bt || (n_hashes && !hashes)) {
        kvg_set_err(err, err_len, "prefix cache: bad prompt (%d tokens, %d hashes)",
                    (int)n_tokens, (int)n_hashes);
        return -1;
    }
    set_now(pc, now_ms);
    sweep_if_due(pc);
    total = (int32_t)(((int64_t)n_tokens + bt - 1) / bt);
    ids = malloc((size_t)total * sizeof *ids);
    if (!ids) {
        kvg_set_err(err, err_len, "prefix cache: out of memory");
        return -1;
    }
    n_hit = count_hits(pc, tenant, hashes, n_hashes, n_tokens, ids, &n_kept);
    need = total - n_hit;
    /* Check first, so a failure holds nothing: the blocks taken as hits leave the
     * evictable set. */
    evictable = pc->n_lru - n_kept;
    if (need > pc->pool->n_free + evictable) {
        kvg_set_err(err, err_len, "prefix cache: out of blocks (need %d, %d free, %d evictable "
                    "of %d)", (int)need, (int)pc->pool->n_free, (int)evictable,
                    (int)pc->pool->n_blocks);
        free(ids);
        return -1;
    }
    {
        /* Grow the table to its final size before taking anything. */
        int32_t *nb = realloc(seq->blocks, (size_t)total * sizeof *nb);
        if (!nb) {
            kvg_set_err(err, err_len, "prefix cache: out of memory");
            free(ids);
            return -1;
        }
        seq->blocks = nb;
        if (seq->cap < total)
            seq->cap = total;
    }
    for (int32_t i = 0; i < n_hit; i++) {
        int32_t id = ids[i];
        pc_block *bl = &pc->b[id];
        if (kvg_kv_block_refcount(pc->pool, id) == 0) {
            lru_remove(pc, id);
            if (bl->pinned)
                pc->n_kept_pinned--;
            kvg_kv_block_revive(pc->pool, id);
        } else {
            kvg_kv_block_ref(pc->pool, id);
        }
        bl->touched_ms = pc->now_ms;
        pin_or_ttl(pc, bl, ttl_ms);
        seq->blocks[seq->n_blocks++] = id;
    }
    for (int32_t i = n_hit; i < total; i++) {
        int32_t id = kvg_kv_block_alloc(pc->pool);
        if (id < 0) {        /* cannot happen after the check; stay safe anyway */
            kvg_set_err(err, err_len, "prefix cache: out of blocks");
            kvg_kv_seq_release(pc->pool, seq);
            free(ids);
            return -1;
        }
        seq->blocks[seq->n_blocks++] = id;
    }
    free(ids);
    n_hit += tier_hits(pc, seq, tenant, hashes, n_hashes, n_tokens, n_hit, ttl_ms, async, f);
    seq->n_tokens = n_hit * bt;
    if (recompute) {
        pc->recompute_tokens += (uint64_t)n_tokens;
        pc->recompute_hit_tokens += (uint64_t)seq->n_tokens;
    } else {
        pc->st.query_tokens += (uint64_t)n_tokens;
        pc->st.hit_tokens += (uint64_t)seq->n_tokens;
    }
    return seq->n_tokens;
}

int32_t kvg_pc_admit(kvg_prefix_cache *pc, kvg_kv_seq *seq, int tenant,
                     const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], int32_t n_hashes,
                     int32_t n_tokens, int64_t ttl_ms, int64_t now_ms, int recompute,
                     char *err, size_t err_len)
{
    return admit(pc, seq, tenant, hashes, n_hashes, n_tokens, ttl_ms, now_ms, recompute, 0, NULL, err, err_len);
}

int32_t kvg_pc_admit_fetched(kvg_prefix_cache *pc, kvg_kv_seq *seq, int tenant,
                             const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], int32_t n_hashes,
                             int32_t n_tokens, int64_t ttl_ms, int64_t now_ms, int recompute,
                             const kvg_pc_fetch *f, char *err, size_t err_len)
{
    return admit(pc, seq, tenant, hashes, n_hashes, n_tokens, ttl_ms, now_ms, recompute, !pc->disk_sync, f,
                 err, err_len);
}

void kvg_pc_commit(kvg_prefix_cache *pc, const kvg_kv_seq *seq, int32_t index,
                   const uint8_t hash[KVG_PREFIX_HASH_LEN], int tenant, int64_t ttl_ms,
                   int64_t now_ms)
{
    int32_t bt = pc->pool->geom.block_tokens, id;
    pc_block *bl;
    if (!seq || index < 0 || index >= seq->n_blocks || (int64_t)(index + 1) * bt > seq->n_tokens ||
        !tenant_is_live(pc, tenant) || !hash)
        return;
    set_now(pc, now_ms);
    id = seq->blocks[index];
    bl = &pc->b[id];
    if (bl->hashed) {
        if (memcmp(bl->hash, hash, KVG_PREFIX_HASH_LEN) == 0 && bl->tenant == tenant) {
            bl->touched_ms = pc->now_ms;
            pin_or_ttl(pc, bl, ttl_ms);
        }
        return;
    }
    if (table_find(pc, hash) != NIL)
        return;          /* someone else computed it first: this copy stays private */
    publish(pc, id, hash, tenant, ttl_ms);
}

int kvg_pc_prepare(kvg_prefix_cache *pc, kvg_kv_seq *seq, int32_t n_new, int64_t now_ms,
                   char *err, size_t err_len)
{
    set_now(pc, now_ms);
    sweep_if_due(pc);
    return kvg_kv_seq_prepare(pc->pool, seq, n_new, err, err_len);
}

int kvg_pc_fork(kvg_prefix_cache *pc, const kvg_kv_seq *src, kvg_kv_seq *dst,
                char *err, size_t err_len)
{
    return kvg_kv_seq_fork(pc->pool, src, dst, err, err_len);
}

void kvg_pc_release(kvg_prefix_cache *pc, kvg_kv_seq *seq, int64_t now_ms)
{
    set_now(pc, now_ms);
    kvg_kv_seq_release(pc->pool, seq);   /* tail first */
}

int32_t kvg_pc_sweep(kvg_prefix_cache *pc, int64_t now_ms)
{
    set_now(pc, now_ms);
    if (pc->now_ms >= pc->next_hold_ms)
        end_holds(pc);
    return sweep(pc);
}

void kvg_pc_get_stats(const kvg_prefix_cache *pc, kvg_pc_stats *out)
{
    /* Every block is free, cached (refcount 0, findable) or in use; counting the first
     * two is O(1), so the statistics cost nothing however large the pool
     * (kvg_pc_check verifies the identity). */
    int32_t used = pc->pool->n_blocks - pc->pool->n_free - (pc->n_lru + pc->n_kept_pinned);
    *out = pc->st;
    out->blocks_total = pc->pool->n_blocks;
    out->blocks_free = pc->pool->n_free;
    out->blocks_cached = pc->n_lru + pc->n_kept_pinned;
    out->blocks_used = used;
    out->blocks_pinned = pc->n_pinned;
    out->recompute_tokens = pc->recompute_tokens;
    out->recompute_hit_tokens = pc->recompute_hit_tokens;
}

int kvg_pc_check(const kvg_prefix_cache *pc, const kvg_kv_seq *const *seqs, size_t n_seqs,
                 char *err, size_t err_len)
{
    const kvg_kv_pool *p = pc->pool;
    int32_t n = p->n_blocks, used = 0, kept = 0, lru = 0, pinned = 0, kept_pinned = 0;
    int32_t *refs = calloc((size_t)n, sizeof *refs), *charged = NULL;
    uint8_t *on_free = calloc((size_t)n, 1);
    int rc = -1;
    if (!refs || !on_free || !(charged = calloc((size_t)pc->n_slots + 1, sizeof *charged))) {
        kvg_set_err(err, err_len, "check: out of memory");
        goto out;
    }
    for (size_t s = 0; s < n_seqs; s++)
        for (int32_t i = 0; i < seqs[s]->n_blocks; i++) {
            int32_t id = seqs[s]->blocks[i];
            if (id < 0 || id >= n) {
                kvg_set_err(err, err_len, "check: sequence %zu holds bad block %d", s, (int)id);
                goto out;
            }
            refs[id]++;
        }
    for (int32_t i = 0; i < p->n_free; i++) {
        int32_t id = p->free_ids[i];
        if (id < 0 || id >= n || on_free[id]) {
            kvg_set_err(err, err_len, "check: free list entry %d (block %d) bad or twice",
                        (int)i, (int)id);
            goto out;
        }
        on_free[id] = 1;
    }
    for (int32_t id = 0; id < n; id++) {
        const pc_block *bl = &pc->b[id];
        int32_t rcnt = p->refcount[id];
        if (rcnt != refs[id]) {
            kvg_set_err(err, err_len, "check: block %d refcount %d, sequences hold %d",
                        (int)id, (int)rcnt, (int)refs[id]);
            goto out;
        }
        if (rcnt > 0) {
            used++;
            if (on_free[id] || bl->in_lru) {
                kvg_set_err(err, err_len, "check: block %d in use yet free or in the LRU", (int)id);
                goto out;
            }
        } else if (on_free[id]) {
            if (bl->hashed || bl->in_lru) {
                kvg_set_err(err, err_len, "check: free block %d still hashed", (int)id);
                goto out;
            }
        } else {
            kept++;
            if (!bl->hashed || (!bl->pinned && !bl->in_lru) || (bl->pinned && bl->in_lru)) {
                kvg_set_err(err, err_len, "check: block %d neither free, used nor cached", (int)id);
                goto out;
            }
            kept_pinned += bl->pinned;
        }
        if (bl->hashed) {
            if (table_find(pc, bl->hash) != id || !tenant_is_live(pc, bl->tenant)) {
                kvg_set_err(err, err_len, "check: hashed block %d not in the table", (int)id);
                goto out;
            }
            charged[bl->tenant]++;
            pinned += bl->pinned;
        }
    }
    for (uint32_t k = 0; k <= pc->mask; k++)
        for (int32_t id = pc->buckets[k]; id != NIL; id = pc->b[id].hnext)
            if (!pc->b[id].hashed || bucket_of(pc, pc->b[id].hash) != k) {
                kvg_set_err(err, err_len, "check: table holds block %d wrongly", (int)id);
                goto out;
            }
    for (int32_t id = pc->head, prev = NIL; id != NIL; prev = id, id = pc->b[id].next) {
        if (pc->b[id].prev != prev || !pc->b[id].in_lru || ++lru > n) {
            kvg_set_err(err, err_len, "check: LRU list broken at block %d", (int)id);
            goto out;
        }
    }
    {
        /* The tenant map: every free slot on the free list once, every live one found
         * by its salt, held or holding blocks (an idle tenant is reclaimed at once). */
        int n_free = 0, n_live = 0, n_quota = 0;
        for (int32_t t = pc->free_tenant; t != NIL; t = pc->tenants[t].tnext)
            if (t < 0 || t >= pc->n_slots || pc->tenants[t].salt || ++n_free > pc->n_slots) {
                kvg_set_err(err, err_len, "check: tenant free list broken at %d", (int)t);
                goto out;
            }
        for (int t = 0; t < pc->n_slots; t++) {
            const pc_tenant *tn = &pc->tenants[t];
            if (!tn->salt) {
                if (tn->head != NIL || tn->charged || tn->refs || charged[t]) {
                    kvg_set_err(err, err_len, "check: free tenant slot %d holds something", t);
                    goto out;
                }
                continue;
            }
            n_live++;
            n_quota += tn->quota > 0.0;
            if (tenant_lookup(pc, tn->salt, tn->salt_len, siphash(pc->sip, tn->salt, tn->salt_len)) != t) {
                kvg_set_err(err, err_len, "check: tenant %d is not found by its salt", t);
                goto out;
            }
            if (tn->refs < 0 || (tn->refs == 0 && tn->charged == 0)) {
                kvg_set_err(err, err_len, "check: tenant %d is idle (refs %d, %d blocks) yet kept",
                            t, (int)tn->refs, (int)tn->charged);
                goto out;
            }
        }
        if (n_free + n_live != pc->n_slots || n_live != pc->n_live || n_quota != pc->n_quota) {
            kvg_set_err(err, err_len, "check: tenant counts disagree (%d free + %d live of %d slots, "
                        "%d live counted, %d/%d with quota)", n_free, n_live, pc->n_slots, pc->n_live,
                        n_quota, pc->n_quota);
            goto out;
        }
    }
    for (int t = 0; t < pc->n_slots; t++) {
        int32_t tl = 0;
        for (int32_t id = pc->tenants[t].head; id != NIL; id = pc->b[id].tnext)
            if (pc->b[id].tenant != t || ++tl > n) {
                kvg_set_err(err, err_len, "check: tenant %d LRU broken", t);
                goto out;
            }
        if (charged[t] != pc->tenants[t].charged) {
            kvg_set_err(err, err_len, "check: tenant %d charged %d, holds %d", t,
                        (int)pc->tenants[t].charged, (int)charged[t]);
            goto out;
        }
    }
    if (lru != pc->n_lru || kept != pc->n_lru + pc->n_kept_pinned ||
        kept_pinned != pc->n_kept_pinned || pinned != pc->n_pinned || pinned > pc->pin_cap) {
        kvg_set_err(err, err_len, "check: counts disagree (lru %d/%d, kept %d, pinned %d/%d, "
                    "kept pinned %d/%d)", (int)lru, (int)pc->n_lru, (int)kept, (int)pinned,
                    (int)pc->n_pinned, (int)kept_pinned, (int)pc->n_kept_pinned);
        goto out;
    }
    if (p->n_free + kept + used != n) {
        kvg_set_err(err, err_len, "check: free %d + cached %d + used %d != total %d",
                    (int)p->n_free, (int)kept, (int)used, (int)n);
        goto out;
    }
    if (pc->index) {
        /* The cache index: every hashed block's key is in, with as many holders in all
         * as there are hashed blocks (so nothing else is). */
        uint64_t hashed = 0;
        for (int32_t id = 0; id < n; id++) {
            if (!pc->b[id].hashed)
                continue;
            hashed++;
            if (kvg_cache_index_refs(pc->index, pc->b[id].hash) == 0) {
                kvg_set_err(err, err_len, "check: hashed block %d is not in the cache index", (int)id);
                goto out;
            }
        }
        if (kvg_cache_index_total(pc->index) != hashed) {
            kvg_set_err(err, err_len, "check: the cache index has %llu holders for %llu hashed blocks",
                        (unsigned long long)kvg_cache_index_total(pc->index), (unsigned long long)hashed);
            goto out;
        }
    }
    rc = 0;
out:
    free(refs);
    free(on_free);
    free(charged);
    return rc;
}

int kvg_pc_set_disk(kvg_prefix_cache *pc, kvg_kv_disk *d, char *err, size_t err_len)
{
    if (d && !pc->hasher && !(pc->hasher = kvg_prefix_hasher_new(err, err_len)))
        return -1;
    pc->disk = d;
    return 0;
}

int kvg_pc_set_host(kvg_prefix_cache *pc, kvg_kv_host *h, char *err, size_t err_len)
{
    if (h && !pc->hasher && !(pc->hasher = kvg_prefix_hasher_new(err, err_len)))
        return -1;
    pc->host = h;
    if (h)
        kvg_kv_host_set_spill(h, pc->disk ? host_to_disk : NULL, pc);
    return 0;
}

int32_t kvg_pc_persist(kvg_prefix_cache *pc)
{
    int32_t n = 0;
    if (!pc->disk)
        return 0;
    /* the host tier's blocks first: they are older than the pool's */
    if (pc->host)
        kvg_kv_host_drain(pc->host, pc->pool);
    for (int32_t id = 0; id < pc->pool->n_blocks; id++)
        if (pc->b[id].hashed && kvg_kv_block_refcount(pc->pool, id) == 0) {
            spill(pc, id, 1);
            n++;
        }
    return n;
}

int64_t kvg_pc_wipe_tenant(kvg_prefix_cache *pc, const void *salt, size_t len)
{
    return kvg_pc_wipe_tenant_tiers(pc, salt, len, NULL, NULL, NULL);
}

int64_t kvg_pc_wipe_tenant_tiers(kvg_prefix_cache *pc, const void *salt, size_t len, int64_t *pool,
                                 int64_t *host, int64_t *disk)
{
    int64_t n = 0, nh = 0, nd = 0;
    int32_t t = kvg_pc_tenant_find(pc, salt, len);
    if (t >= 0) {
        /* Its record may be reclaimed as its last block loses its hash: hold it. */
        pc->tenants[t].refs++;
        for (int32_t id = 0; id < pc->pool->n_blocks; id++) {
            if (!pc->b[id].hashed || pc->b[id].tenant != t)
                continue;
            n++;
            if (kvg_kv_block_refcount(pc->pool, id) == 0) {
                unhash(pc, id);
                kvg_kv_block_put_free(pc->pool, id);
            } else {
                unhash(pc, id);   /* stays with its sequence, freed on release */
            }
        }
        kvg_pc_tenant_put(pc, t);
    }
    if ((pc->disk || pc->host) && pc->hasher) {
        uint8_t tag[KVG_PREFIX_HASH_LEN];
        if (kvg_prefix_root(pc->hasher, pc->cfg.model_id, KVG_PREFIX_HASH_LEN, salt, len, tag,
                            NULL, 0) == 0) {
            if (pc->host)
                nh = kvg_kv_host_wipe(pc->host, tag);
            if (pc->disk)
                nd = kvg_kv_disk_wipe(pc->disk, tag);
        }
    }
    if (pool)
        *pool = n;
    if (host)
        *host = nh;
    if (disk)
        *disk = nd;
    return n + nh + nd;
}

int kvg_pc_host_stats(const kvg_prefix_cache *pc, struct kvg_kv_host_stats *out)
{
    if (!pc->host)
        return -1;
    kvg_kv_host_get_stats(pc->host, out);
    return 0;
}

int kvg_pc_disk_stats(const kvg_prefix_cache *pc, struct kvg_kv_disk_stats *out)
{
    if (!pc->disk)
        return -1;
    kvg_kv_disk_get_stats(pc->disk, out);
    return 0;
}
