/* A map from non-zero 64-bit keys to pointers: open addressing with linear probing
 * and backward-shift deletion (no tombstones), so lookups stay short however many
 * insertions and deletions a long-lived connection sees. Key 0 is reserved (it marks
 * an empty slot). Used for request ids in the engine client and the engine daemon. */
#ifndef KVG_U64MAP_H
#define KVG_U64MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvg_u64map {
    uint64_t *keys;
    void **vals;
    size_t cap;                  /* power of two, or 0 before the first insertion */
    size_t n;
} kvg_u64map;

/* Zero-initialise; kvg_u64map_free releases the table (not the values). */
void kvg_u64map_free(kvg_u64map *m);
/* 0 inserted or replaced, -1 out of memory or key 0. */
int kvg_u64map_put(kvg_u64map *m, uint64_t key, void *val);
/* 1 with *val set when key is present, else 0. */
int kvg_u64map_find(const kvg_u64map *m, uint64_t key, void **val);
/* Removes key; returns its value, or NULL when absent. */
void *kvg_u64map_del(kvg_u64map *m, uint64_t key);
/* Any one entry (for draining the map): its key, or 0 when empty; *val gets the value. */
uint64_t kvg_u64map_any(const kvg_u64map *m, void **val);

#endif
