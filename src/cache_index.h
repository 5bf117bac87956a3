/* The cache index: the engine's record of which chain hashes its prefix cache holds,
 * in shared memory that clients read without locks (the layout and its rules are
 * kvg_cache_index_page in proto.h). The engine is the one writer; every nginx worker
 * is a reader.
 *
 * The writer counts references per key in memory of its own (never shared): two
 * blocks whose hashes share their first 8 bytes keep the key until both are gone, so
 * the set stays exact even then. Lookups never allocate and never write. */
#ifndef KVG_CACHE_INDEX_H
#define KVG_CACHE_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "prefix_hash.h"
#include "proto.h"

/* The table's key of a chain hash (proto.h: first 8 bytes little-endian, 0 -> 2,
 * 1 -> 3). */
uint64_t kvg_cache_index_key(const uint8_t hash[KVG_PREFIX_HASH_LEN]);

/* Slots per table for a pool of n_blocks blocks: the next power of two >= 2 x
 * n_blocks, at least 16; 0 when that would pass 2^30. */
uint32_t kvg_cache_index_capacity_for(int64_t n_blocks);
/* Bytes of a page with that capacity (header and both tables), rounded up to 4096;
 * 0 when capacity is not a power of two in 16..2^30. */
size_t kvg_cache_index_page_bytes(uint32_t capacity);

/* ---- the writer (one thread) ---- */

typedef struct kvg_cache_index_writer kvg_cache_index_writer;

/* Formats the page (bytes >= kvg_cache_index_page_bytes(capacity), zeroed here) as an empty
 * set and returns its writer, or NULL with err. The writer borrows the page. */
kvg_cache_index_writer *kvg_cache_index_writer_new(void *page, size_t bytes, uint32_t capacity, char *err, size_t err_len);
void kvg_cache_index_writer_free(kvg_cache_index_writer *w);

/* One more holder of hash's key (a block committed under it). 0, or -1 when the
 * table is full: more distinct keys than 3/4 of the capacity, which a capacity from
 * kvg_cache_index_capacity_for never reaches. */
int kvg_cache_index_add(kvg_cache_index_writer *w, const uint8_t hash[KVG_PREFIX_HASH_LEN]);
/* One holder fewer (the block was evicted or lost its hash); the key leaves the set
 * with its last holder. A key not held is ignored. May rebuild the table. */
void kvg_cache_index_remove(kvg_cache_index_writer *w, const uint8_t hash[KVG_PREFIX_HASH_LEN]);
/* Empties the set (both tables; readers see it empty from the next lookup). */
void kvg_cache_index_clear(kvg_cache_index_writer *w);
/* Holders of hash's key (0: not held): the writer's exact view, for checks. */
uint32_t kvg_cache_index_refs(const kvg_cache_index_writer *w, const uint8_t hash[KVG_PREFIX_HASH_LEN]);
/* Distinct keys held, and holders over all keys. */
uint32_t kvg_cache_index_count(const kvg_cache_index_writer *w);
uint64_t kvg_cache_index_total(const kvg_cache_index_writer *w);
/* Rebuilds done (the page's generation). */
uint64_t kvg_cache_index_generation(const kvg_cache_index_writer *w);

/* ---- readers (any process, any thread) ---- */

typedef struct kvg_cache_index_reader {
    const kvg_cache_index_page *page;
    uint32_t mask;               /* capacity - 1, read once at attach: the page's own
                                    field is never trusted again (it is the engine's) */
} kvg_cache_index_reader;

/* Checks a mapped page (magic, version, a power-of-two capacity whose tables fit in
 * bytes) and points r at it. 0, or -1 with err. */
int kvg_cache_index_attach(kvg_cache_index_reader *r, const void *page, size_t bytes, char *err, size_t err_len);
/* Whether the engine holds hash (see proto.h for what a race may answer). */
int kvg_cache_index_contains(const kvg_cache_index_reader *r, const uint8_t hash[KVG_PREFIX_HASH_LEN]);
/* How many leading hashes of the chain are held: stops at the first miss. */
size_t kvg_cache_index_prefix(const kvg_cache_index_reader *r, const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], size_t n);

#endif
