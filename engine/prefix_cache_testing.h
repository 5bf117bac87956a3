/* For tests only: the prefix cache's invariant check and the lookups, admission
 * estimate and model change the unit tests and benchmarks use (prefix_cache.c). Not
 * the engine's API: nothing outside t/ calls these. */
#ifndef KVG_PREFIX_CACHE_TESTING_H
#define KVG_PREFIX_CACHE_TESTING_H

#include "prefix_cache.h"

/* The chain root of a live tenant: kvg_pc_salt_root of its salt. */
int kvg_pc_tenant_root(kvg_prefix_cache *pc, kvg_prefix_hasher *h, int tenant,
                       uint8_t root[KVG_PREFIX_HASH_LEN], char *err, size_t err_len);

/* Model change: every cached block is dropped (freed, not counted as an eviction) and
 * blocks in use lose their hash (freed on release); roots change with the model id. */
void kvg_pc_set_model(kvg_prefix_cache *pc, const uint8_t model_id[KVG_PREFIX_HASH_LEN]);

/* How many blocks admission would need to allocate now (after hits), without doing it. */
int32_t kvg_pc_blocks_needed(const kvg_prefix_cache *pc,
                             const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], int32_t n_hashes,
                             int32_t n_tokens);

/* Checks every invariant (free + cached + used == total, refcounts match the sequences
 * the caller passes, the hash table and LRU list agree, every live tenant is held or
 * holds blocks and is found by its salt, free slots are on the free list): 0, or -1
 * with err. For tests. */
int kvg_pc_check(const kvg_prefix_cache *pc, const kvg_kv_seq *const *seqs, size_t n_seqs,
                 char *err, size_t err_len);

#endif
