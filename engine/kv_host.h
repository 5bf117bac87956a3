/* The host-memory tier of the KV cache (--kv-host-memory SIZE, for a device pool): blocks
 * evicted from the device pool are copied into slots of a pinned host buffer instead of
 * being dropped, and a prefix that misses the pool but is found here is copied back into
 * fresh pool blocks: a PCIe copy instead of a prefill.
 *
 *     pool --evicted--> host slot --evicted (LRU)--> disk tier (kv_disk.h), or gone
 *     host slot --prefix hit--> pool block (the slot keeps its copy)
 *
 * The copies go through the pool's transfer hooks (kv_cache.h) and are asynchronous on
 * the backend's one stream, which orders them:
 *   - put: the device block's bytes are copied to a slot (queued); the pool block may be
 *     reused at once, since the kernels that will overwrite it run after the copy;
 *   - load: a slot's bytes are copied into a pool block (queued); the step that reads the
 *     block runs after the copy, and the slot is only ever rewritten by a later put,
 *     which runs after it too;
 *   - the host reads a slot's bytes only to move them to the disk tier: it first waits
 *     for the copies queued so far (kvg_kv_pool_xfer_wait), since that slot's copy from
 *     the device may not have run yet.
 * On the emulator an unordered copy shows up as wrong bytes (its stream model runs queued
 * work late), so the tests would see it.
 *
 * Slots are found by the block's chain hash (which covers the model and the tenant) and
 * also carry the tenant tag (the disk tier's: the chain root of the tenant's salt), which
 * a load must match and by which a tenant's blocks are wiped. LRU over slots, and the two
 * rules the pool's cache keeps, spanning both tiers: a block keeps the expiry it had in
 * the pool (an expired slot is never loaded, nor moved on to disk), and a tenant with a
 * quota (a share) holds at most that share of the slots (over it, its own least recently
 * used slot makes room).
 * Not thread-safe: the scheduler thread owns it, as it owns the pool and the cache. */
#ifndef KVG_KV_HOST_H
#define KVG_KV_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "kv_cache.h"

#define KVG_KV_HOST_HASH_LEN 32

typedef struct kvg_kv_host kvg_kv_host;

typedef struct kvg_kv_host_stats {
    int64_t slots_total, slots_used;
    uint64_t slot_bytes;
    uint64_t puts;                       /* blocks copied in from the pool */
    uint64_t hits, misses;               /* loads: blocks copied back / lookups not found */
    uint64_t bytes_out, bytes_in;        /* pool -> host, host -> pool */
    uint64_t evictions;                  /* slots given to a newer block (LRU or quota) */
    uint64_t quota_evictions;            /* of those, the tenant's own (its quota) */
    uint64_t expired;                    /* slots dropped past their expiry */
    uint64_t spilled;                    /* of those, handed to the next tier */
    uint64_t wiped;
    double seconds;                      /* time in put and load (queueing the copies) */
} kvg_kv_host_stats;

/* A slot leaving the host tier, to the next tier (the disk): its payload (bytes of one
 * block as the pool transfers it), hash and tag, its tenant's quota (as put was given it)
 * and the time its block has left (ms, > 0; INT64_MAX: no expiry), so that both rules go
 * on there. */
typedef void (*kvg_kv_host_spill_fn)(void *ctx, const void *payload, const uint8_t *hash, const uint8_t *tag,
                                     double quota, int64_t ttl_ms);

/* A tier of `bytes` of host memory at buf (pinned, the backend's; not freed here) in
 * slots of block_bytes (kvg_kv_xfer_bytes of the pool). NULL with err when not one slot
 * fits. */
kvg_kv_host *kvg_kv_host_new(void *buf, size_t bytes, size_t block_bytes, char *err, size_t err_len);
void kvg_kv_host_free(kvg_kv_host *h);
/* The next tier a slot goes to when it is evicted (NULL: none, the block is gone). */
void kvg_kv_host_set_spill(kvg_kv_host *h, kvg_kv_host_spill_fn fn, void *ctx);

/* Pool block `block` (a cached block being evicted) into a slot under hash and tag, with
 * its expiry (ms, the caller's clock; INT64_MAX: none) and its tenant's quota (a share of
 * the slots, 0: none): the tenant's own least recently used slot makes room when it is at
 * its share, else the least recently used slot when none is free. 0, or -1 when the copy
 * could not be queued (then the block is simply not kept). Already held: refreshed. */
int kvg_kv_host_put(kvg_kv_host *h, kvg_kv_pool *pool, int32_t block, const uint8_t *hash,
                    const uint8_t *tag, double quota, int64_t expires_ms, int64_t now_ms);
/* The block of hash (which must carry tag) into pool block `block`: 0 (the slot is now the
 * most recently used), or -1 when not held or expired by now_ms (then dropped). */
int kvg_kv_host_load(kvg_kv_host *h, kvg_kv_pool *pool, int32_t block, const uint8_t *hash,
                     const uint8_t *tag, int64_t now_ms);
int kvg_kv_host_holds(const kvg_kv_host *h, const uint8_t *hash);
/* Drops every block of a tenant tag; the count dropped. */
int64_t kvg_kv_host_wipe(kvg_kv_host *h, const uint8_t *tag);
/* Every slot to the next tier, least recently used first (a clean stop: the disk keeps
 * them for the next engine), after waiting for the pool's copies. */
void kvg_kv_host_drain(kvg_kv_host *h, kvg_kv_pool *pool);
void kvg_kv_host_get_stats(const kvg_kv_host *h, kvg_kv_host_stats *out);

#endif
