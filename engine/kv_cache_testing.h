/* For tests only: the KV pool's budget arithmetic, a host pool over the caller's
 * storage, the free count and the unreference of one block (kv_cache.c), which the unit
 * tests and benchmarks use. Not the engine's API: nothing outside t/ calls these (the
 * engine sizes pools through the backend, backend.h, and drops blocks by releasing
 * sequences). */
#ifndef KVG_KV_CACHE_TESTING_H
#define KVG_KV_CACHE_TESTING_H

#include "kv_cache.h"

/* How many blocks fit in `bytes` (at least 0). */
int32_t kvg_kv_blocks_for_budget(const kvg_kv_geom *g, size_t bytes);

/* Same over caller-provided storage (n_blocks * kvg_kv_block_bytes, 64-byte aligned), copied
 * with `copy` (NULL: memcpy). The caller keeps ownership of storage. */
kvg_kv_pool *kvg_kv_pool_new_ext(const kvg_kv_geom *g, int32_t n_blocks, void *storage,
                                 kvg_kv_copy_fn copy, void *copy_ctx,
                                 char *err, size_t err_len);

/* Blocks on the free list. */
int32_t kvg_kv_pool_free_blocks(const kvg_kv_pool *p);

/* -1 on a block's count; a block reaching 0 returns to the free list. The new count,
 * or -1 for an id that is out of range or not allocated. */
int32_t kvg_kv_block_unref(kvg_kv_pool *p, int32_t id);

#endif
