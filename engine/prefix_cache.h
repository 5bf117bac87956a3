/* The prefix cache: reuse of computed KV blocks by chain hash.
 *
 * It sits on the paged KV pool (kv_cache.h) and decides the life of every block:
 *
 *   free (never used or expired) --alloc--> in use (refcount >= 1)
 *   in use --last unref, block has a hash--> cached (refcount 0, in the LRU list)
 *   in use --last unref, no hash (partial)--> free
 *   cached --hit--> in use             cached --evicted (LRU, TTL, quota)--> free
 *
 * Hashes are the shared library's chain (src/prefix_hash.h): h[i] covers blocks
 * 0..i of one (model id, tenant salt) root, so a hit on h[i] means the whole prefix
 * up to block i is the same text for the same tenant and model. A block is findable
 * only once it is full and its K/V are written (kvg_pc_commit).
 *
 * Allocation order: a never-used / freed block first; otherwise evict a cached block:
 * expired ones (TTL) first, then from tenants over their quota, then plain LRU
 * (least recently used first). Pinned blocks are never evicted. A request releasing
 * its chain queues the TAIL before the HEAD, so a block is never evicted before its
 * descendants (which would leave unreachable cached blocks).
 *
 * Time is passed in by the caller (milliseconds, monotonic), so tests control it.
 * Not thread-safe: the engine's scheduler thread owns it, like the pool. */
#ifndef KVG_PREFIX_CACHE_H
#define KVG_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kv_cache.h"
#include "prefix_hash.h"

typedef struct kvg_prefix_cache kvg_prefix_cache;

#define KVG_PC_TTL_PINNED   INT64_MAX      /* ttl value meaning "pinned, never expires" */

typedef struct kvg_pc_config {
    uint8_t model_id[KVG_PREFIX_HASH_LEN]; /* blocks made by another model id are never served */
    int64_t default_ttl_ms;                /* 0: 5 minutes */
    double pinned_share;                   /* max share of the pool pinned blocks may hold (0..1) */
    double default_quota;                  /* per-tenant share of the pool, 0 = no quota */
    int32_t tenant_pin_blocks;             /* most blocks one tenant may have pinned or held
                                              (kvg_pc_hold), 0 = only the pool's pinned share */
} kvg_pc_config;

/* Eviction causes, for metrics. */
enum kvg_pc_evict_cause { KVG_EVICT_LRU = 0, KVG_EVICT_TTL = 1, KVG_EVICT_QUOTA = 2, KVG_EVICT_N = 3 };

typedef struct kvg_pc_stats {
    int32_t blocks_total, blocks_free, blocks_cached, blocks_used, blocks_pinned;
    uint64_t query_tokens;                 /* prompt tokens looked up (once per request) */
    uint64_t hit_tokens;                   /* of those, served from the cache */
    uint64_t evictions[KVG_EVICT_N];
    uint64_t recompute_tokens;             /* prompt tokens of preempted requests readmitted */
    uint64_t recompute_hit_tokens;         /* of those, served from the cache */
    uint64_t disk_hit_tokens;              /* of hit_tokens and recompute_hit_tokens, those
                                              read back from the disk tier */
    uint64_t host_hit_tokens;              /* ... and those copied back from the host tier */
} kvg_pc_stats;

kvg_prefix_cache *kvg_pc_new(kvg_kv_pool *pool, const kvg_pc_config *cfg,
                             char *err, size_t err_len);
void kvg_pc_free(kvg_prefix_cache *pc);

/* Tenants. A tenant is the cache's record of one salt (what the hash root was made
 * with): its quota, its cached blocks, its LRU. It costs only what it holds: it lives
 * while someone holds a reference to it or it has a hashed block (in use or cached),
 * and is reclaimed the moment neither is true, so a client sending fresh salts costs
 * nothing once its requests are over and their blocks evicted. The table is a hash
 * map (keyed SipHash of the salt: a client cannot craft colliding salts) over slots
 * on a free list; it grows with memory and has no fixed cap. Its size is bounded by
 * what the tenants hold: live requests plus cached blocks.
 *
 * Ids are slot numbers and are REUSED after a reclaim: hold a reference for as long
 * as you keep an id. Blocks hold theirs implicitly (a hashed block's tenant is never
 * reclaimed); the scheduler takes one per queued request (kvg_pc_tenant_ref) and drops
 * it when the request is freed. */

/* The tenant of a salt, created if new, with a reference taken for the caller (drop
 * it with kvg_pc_tenant_put). quota: share of the pool (0 = the default; a non-zero
 * value also updates a live tenant's). -1 when the salt or quota is bad or memory for
 * the record cannot be had (nothing is taken then). */
int kvg_pc_tenant(kvg_prefix_cache *pc, const void *salt, size_t len, double quota);
/* Another reference to a live tenant (0), or -1 for an id that is not live. */
int kvg_pc_tenant_ref(kvg_prefix_cache *pc, int tenant);
/* Drops a reference; the tenant is reclaimed if that was the last one and it holds
 * no blocks. */
void kvg_pc_tenant_put(kvg_prefix_cache *pc, int tenant);
/* Whether an id names a live tenant. */
int kvg_pc_tenant_live(const kvg_prefix_cache *pc, int tenant);
/* Hashed blocks (in use or cached) of a live tenant, -1 for an id that is not. */
int32_t kvg_pc_tenant_cached_blocks(const kvg_prefix_cache *pc, int tenant);
/* Live tenants now. */
int kvg_pc_tenant_count(const kvg_prefix_cache *pc);
/* Ids are below this bound (some of them free slots): for iterating. */
int kvg_pc_tenant_slots(const kvg_prefix_cache *pc);
/* A live tenant's salt, or NULL for an id that is not live. */
const void *kvg_pc_tenant_salt(const kvg_prefix_cache *pc, int tenant, size_t *len);

/* The chain root of a salt under the cache's model id: hashes made from it are the only
 * ones this cache can hit, so a block of another model is never served. It needs no
 * tenant record: a request checks its hashes before it is given one. */
int kvg_pc_salt_root(const kvg_prefix_cache *pc, kvg_prefix_hasher *h, const void *salt,
                     size_t len, uint8_t root[KVG_PREFIX_HASH_LEN], char *err, size_t err_len);

/* Admission of a prompt of n_tokens tokens with the chain hashes of its full blocks
 * (n_hashes = n_tokens / block_tokens; tenant may be -1, no tenant, when n_hashes is 0:
 * a bypass request has no cache state). Walks the chain and takes every leading block
 * found (refcount +1, TTL refreshed) into the empty sequence `seq`, but never the
 * block holding the last prompt token (its logits are needed, so it is computed).
 * Then reserves fresh blocks for the rest of the prompt. Sets seq->n_tokens to the
 * cached token count and returns it (>= 0), or -1 with err when the pool cannot
 * supply the blocks (nothing is held then). Counts query/hit tokens unless
 * `recompute` (a preempted request coming back is not a cache hit). */
int32_t kvg_pc_admit(kvg_prefix_cache *pc, kvg_kv_seq *seq, int tenant,
                     const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], int32_t n_hashes,
                     int32_t n_tokens, int64_t ttl_ms, int64_t now_ms, int recompute,
                     char *err, size_t err_len);

/* Block `index` of seq is full and written: publish it under `hash` for `tenant`
 * (generated tokens are cached too: the engine extends the chain with
 * kvg_prefix_next). If another block already holds that hash, this one stays
 * private and is freed on release. */
void kvg_pc_commit(kvg_prefix_cache *pc, const kvg_kv_seq *seq, int32_t index,
                   const uint8_t hash[KVG_PREFIX_HASH_LEN], int tenant, int64_t ttl_ms,
                   int64_t now_ms);

/* Holds blocks [from, from + n_blocks) of seq (published: hits, or committed; others are
 * skipped) for hold_ms: pinned, never evicted, until now + hold_ms at least (a hold
 * already longer stays), within the pool's pinned share and cfg.tenant_pin_blocks; a
 * block a cap refuses stays an ordinary cached block. Their TTL becomes at least hold_ms
 * from now, so that when the hold ends unused the block expires with it. What Anthropic's
 * cache_control asks of a prefix: kept for its TTL, refreshed by each request that marks
 * it. Returns the blocks held now. */
int32_t kvg_pc_hold(kvg_prefix_cache *pc, const kvg_kv_seq *seq, int32_t from, int32_t n_blocks, int64_t hold_ms,
                    int64_t now_ms);

/* Blocks for appending n_new positions to seq (decode, prefill chunks), copy-on-write
 * of a shared partial block included; evicts as needed. -1 when the pool is out. */
int kvg_pc_prepare(kvg_prefix_cache *pc, kvg_kv_seq *seq, int32_t n_new, int64_t now_ms,
                   char *err, size_t err_len);

/* n > 1: dst shares every block of src (refcount +1); the partial last block is
 * copied on the first write. */
int kvg_pc_fork(kvg_prefix_cache *pc, const kvg_kv_seq *src, kvg_kv_seq *dst,
                char *err, size_t err_len);

/* Releases the sequence's blocks, tail first (finish, cancel, preemption). */
void kvg_pc_release(kvg_prefix_cache *pc, kvg_kv_seq *seq, int64_t now_ms);

/* Expires cached blocks whose TTL has passed (also done lazily on allocation). */
int32_t kvg_pc_sweep(kvg_prefix_cache *pc, int64_t now_ms);

void kvg_pc_get_stats(const kvg_prefix_cache *pc, kvg_pc_stats *out);

/* The cache index (src/cache_index.h, shared with clients for routing): from now on
 * every hash that enters the cache's table is added to w and every one that leaves it
 * (eviction, expiry, a model change) is removed, so w holds exactly the hashes of the
 * hashed blocks, in use or cached. w is emptied and filled with what the cache holds
 * now. NULL detaches. 0, or -1 when w is too small for the pool (nothing attached). */
typedef struct kvg_cache_index_writer kvg_cache_index_writer;
int kvg_pc_set_index(kvg_prefix_cache *pc, kvg_cache_index_writer *w);

/* The disk tier (kv_disk.h; NULL detaches): blocks evicted from the pool (LRU,
 * quota; not expired ones) are spilled there, and admission continues a chain the
 * pool misses there, reading the blocks found into the blocks it reserved. 0, or -1
 * with err (no hasher for the tenant tags). The store must outlive the cache's use. */
typedef struct kvg_kv_disk kvg_kv_disk;
int kvg_pc_set_disk(kvg_prefix_cache *pc, kvg_kv_disk *d, char *err, size_t err_len);
/* Asynchronous disk reads before admission (kv_disk.h's reader thread), so that a prefix
 * read from disk never holds up the other requests' steps. The scheduler starts the reads
 * of a waiting request (kvg_pc_fetch_start), leaves it waiting while any is in flight
 * (kvg_pc_fetch_pending; it may sleep on kvg_pc_disk_fd), then admits it with them
 * (kvg_pc_admit_fetched): blocks read and checked are copied into the blocks admission
 * reserves, on the scheduler's thread, as hits; a block whose read failed (corrupt, an I/O
 * error, gone) ends the run there and the rest is recomputed. kvg_pc_fetch_free releases
 * the reads (admitted, cancelled, expired). The chain is walked as admission walks it: past
 * the pool's hits, through blocks the host tier holds (copied at admission, as before), to
 * those only the disk holds. A block whose read cannot be staged (the reads' staging is
 * full) ends the run too: it and what follows are recomputed, never read synchronously. */
typedef struct kvg_pc_fetch kvg_pc_fetch;
/* The reads of a prompt's chain (arguments as kvg_pc_admit's), or NULL when the chain's
 * next block is in neither the host tier nor the disk (or its read cannot be staged), or
 * there is no disk tier, or synchronous reads were chosen. Without a read in flight (the
 * run is in host memory) it is not pending: admit at once, with it. */
kvg_pc_fetch *kvg_pc_fetch_start(kvg_prefix_cache *pc, int tenant,
                                 const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], int32_t n_hashes,
                                 int32_t n_tokens);
/* 1 while a read of f is still in flight, else 0. */
int kvg_pc_fetch_pending(kvg_prefix_cache *pc, const kvg_pc_fetch *f);
/* Releases f's reads (their staging) and f; NULL: nothing. The disk store must outlive
 * every fetch (its cache may detach it first). */
void kvg_pc_fetch_free(kvg_prefix_cache *pc, kvg_pc_fetch *f);
/* kvg_pc_admit with the reads of f: the disk tier serves what f read (f NULL: nothing),
 * and the blocks that were in a faster tier when f started (the pool, the host tier) but
 * that this admission's own evictions have just moved on to disk (from the write queue or
 * the page cache); it never waits for a block that was on disk only. With
 * kvg_pc_disk_sync_reads on this is kvg_pc_admit, which reads whatever it finds on disk. */
int32_t kvg_pc_admit_fetched(kvg_prefix_cache *pc, kvg_kv_seq *seq, int tenant,
                             const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], int32_t n_hashes,
                             int32_t n_tokens, int64_t ttl_ms, int64_t now_ms, int recompute,
                             const kvg_pc_fetch *f, char *err, size_t err_len);
/* sync != 0: kvg_pc_fetch_start starts nothing and admission reads the disk on the
 * scheduler's thread, as before the reader existed (KVGATE_KV_DISK_SYNC=1: for comparing). */
void kvg_pc_disk_sync_reads(kvg_prefix_cache *pc, int sync);
/* The disk tier's eventfd signalled when a read ends (kv_disk.h), or -1. */
int kvg_pc_disk_fd(const kvg_prefix_cache *pc);
/* For a loop stepping the scheduler by itself (warm-up, tests; the engine's loop has the fd
 * in its epoll set): sleeps until a disk read ends or timeout_ms pass, and clears the
 * signal. 1 when a read ended, else 0 (also without a disk tier: no sleep then). */
int kvg_pc_disk_wait(const kvg_prefix_cache *pc, int timeout_ms);

/* At a clean stop: the host tier's blocks, then every cached block (refcount 0) of the
 * pool, are queued for the disk tier, waiting for room in its queue, so the next engine
 * finds them. The pool's blocks queued. */
int32_t kvg_pc_persist(kvg_prefix_cache *pc);
/* Operator's wipe of one tenant (its salt) in every tier: its cached pool blocks are
 * freed, its blocks in use lose their hash (never found again), its host and disk blocks
 * are dropped. The number of blocks dropped. */
int64_t kvg_pc_wipe_tenant(kvg_prefix_cache *pc, const void *salt, size_t len);
/* The same, with the blocks dropped in each tier (any pointer may be NULL): pool (cached
 * ones freed and in-use ones unhashed), host, disk. */
int64_t kvg_pc_wipe_tenant_tiers(kvg_prefix_cache *pc, const void *salt, size_t len, int64_t *pool,
                                 int64_t *host, int64_t *disk);
/* The live tenant of a salt without taking a reference, or -1 (nothing is created). */
int kvg_pc_tenant_find(const kvg_prefix_cache *pc, const void *salt, size_t len);

/* The host-memory tier (kv_host.h; NULL detaches), between the pool and the disk tier:
 * blocks evicted from the pool go there first, a slot evicted from it goes on to the disk
 * (set the disk first), and admission looks there before the disk. The cache does not own
 * it. 0, or -1 with err. */
typedef struct kvg_kv_host kvg_kv_host;
int kvg_pc_set_host(kvg_prefix_cache *pc, kvg_kv_host *h, char *err, size_t err_len);
/* Its statistics (kv_host.h): 0, or -1 without a host tier. */
struct kvg_kv_host_stats;
int kvg_pc_host_stats(const kvg_prefix_cache *pc, struct kvg_kv_host_stats *out);
/* The disk tier's statistics (kv_disk.h): 0, or -1 without a disk tier. */
struct kvg_kv_disk_stats;
int kvg_pc_disk_stats(const kvg_prefix_cache *pc, struct kvg_kv_disk_stats *out);

/* Whether a block is findable under hash now (any tenant: hashes are salted). */
int kvg_pc_holds(const kvg_prefix_cache *pc, const uint8_t hash[KVG_PREFIX_HASH_LEN]);

#endif
