/* The cache index; see cache_index.h and kvg_cache_index_page in proto.h. */
#include "cache_index.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "errmsg.h"

#define CAP_MIN 16u
#define CAP_MAX (1u << 30)

struct kvg_cache_index_writer {
    kvg_cache_index_page *p;
    uint32_t cap, mask;
    unsigned active;             /* the writer's copy of p->active */
    uint32_t count, tombs;       /* of the active table */
    uint64_t total, generation;
    uint32_t *refs[2];           /* per slot of each table: holders of its key */
};

uint64_t kvg_cache_index_key(const uint8_t hash[KVG_PREFIX_HASH_LEN])
{
    uint64_t k = 0;
    for (int i = 7; i >= 0; i--)
        k = k << 8 | hash[i];
    return k <= KVG_CACHE_INDEX_TOMB ? k + 2 : k;
}

uint32_t kvg_cache_index_capacity_for(int64_t n_blocks)
{
    uint32_t c = CAP_MIN;
    if (n_blocks < 0 || n_blocks > (int64_t)(CAP_MAX / 2))
        return 0;
    while ((int64_t)c < 2 * n_blocks)
        c <<= 1;
    return c;
}

size_t kvg_cache_index_page_bytes(uint32_t capacity)
{
    if (capacity < CAP_MIN || capacity > CAP_MAX || (capacity & (capacity - 1)))
        return 0;
    size_t b = offsetof(kvg_cache_index_page, slot) + 2 * (size_t)capacity * sizeof(uint64_t);
    return (b + 4095) & ~(size_t)4095;
}

static _Atomic uint64_t *table(kvg_cache_index_page *p, uint32_t cap, unsigned t)
{
    return p->slot + (size_t)t * cap;
}

static void publish_counts(kvg_cache_index_writer *w)
{
    atomic_store_explicit(&w->p->count, w->count, memory_order_relaxed);
    atomic_store_explicit(&w->p->tombstones, w->tombs, memory_order_relaxed);
}

kvg_cache_index_writer *kvg_cache_index_writer_new(void *page, size_t bytes, uint32_t capacity, char *err, size_t err_len)
{
    size_t need = kvg_cache_index_page_bytes(capacity);
    kvg_cache_index_writer *w;

    if (!need || !page || bytes < need) {
        kvg_set_err(err, err_len, "cache index: bad capacity %u or a page of %zu bytes", capacity, bytes);
        return NULL;
    }
    w = calloc(1, sizeof *w);
    if (!w || !(w->refs[0] = calloc(capacity, sizeof(uint32_t))) ||
        !(w->refs[1] = calloc(capacity, sizeof(uint32_t)))) {
        kvg_cache_index_writer_free(w);
        kvg_set_err(err, err_len, "cache index: out of memory for %u slots", capacity);
        return NULL;
    }
    memset(page, 0, need);
    w->p = page;
    w->cap = capacity;
    w->mask = capacity - 1;
    w->p->magic = KVG_CACHE_INDEX_MAGIC;
    w->p->version = KVG_PROTO_VERSION;
    w->p->capacity = capacity;
    atomic_store_explicit(&w->p->active, 0, memory_order_release);
    return w;
}

void kvg_cache_index_writer_free(kvg_cache_index_writer *w)
{
    if (!w)
        return;
    free(w->refs[0]);
    free(w->refs[1]);
    free(w);
}

/* The slot of key in table t, or -1; *first_free gets the first tombstone or empty
 * slot of the probe (where an insert goes), -1 when the probe met none. */
static int64_t find(const kvg_cache_index_writer *w, unsigned t, uint64_t key, int64_t *first_free)
{
    _Atomic uint64_t *s = table(w->p, w->cap, t);
    uint32_t i = (uint32_t)key & w->mask;
    *first_free = -1;
    for (uint32_t n = 0; n < w->cap; n++, i = (i + 1) & w->mask) {
        uint64_t v = atomic_load_explicit(&s[i], memory_order_relaxed);
        if (v == key)
            return i;
        if (v == KVG_CACHE_INDEX_EMPTY) {
            if (*first_free < 0)
                *first_free = i;
            return -1;
        }
        if (v == KVG_CACHE_INDEX_TOMB && *first_free < 0)
            *first_free = i;
    }
    return -1;
}

/* Copies the live keys of the active table into the other, then makes it the active
 * one. Readers that loaded `active` before the flip finish on the old table, which
 * stays untouched until the next rebuild. */
static void rebuild(kvg_cache_index_writer *w)
{
    unsigned from = w->active, to = from ^ 1u;
    _Atomic uint64_t *src = table(w->p, w->cap, from), *dst = table(w->p, w->cap, to);
    uint32_t *rsrc = w->refs[from], *rdst = w->refs[to];

    for (uint32_t i = 0; i < w->cap; i++)
        atomic_store_explicit(&dst[i], KVG_CACHE_INDEX_EMPTY, memory_order_relaxed);
    memset(rdst, 0, w->cap * sizeof *rdst);
    for (uint32_t i = 0; i < w->cap; i++) {
        uint64_t k = atomic_load_explicit(&src[i], memory_order_relaxed);
        if (k <= KVG_CACHE_INDEX_TOMB)
            continue;
        uint32_t j = (uint32_t)k & w->mask;
        while (atomic_load_explicit(&dst[j], memory_order_relaxed) != KVG_CACHE_INDEX_EMPTY)
            j = (j + 1) & w->mask;
        rdst[j] = rsrc[i];
        atomic_store_explicit(&dst[j], k, memory_order_relaxed);
    }
    /* The release publishes every store above to a reader that acquires the flip. */
    w->active = to;
    w->tombs = 0;
    w->generation++;
    atomic_store_explicit(&w->p->active, to, memory_order_release);
    atomic_store_explicit(&w->p->generation, w->generation, memory_order_release);
    publish_counts(w);
}

int kvg_cache_index_add(kvg_cache_index_writer *w, const uint8_t hash[KVG_PREFIX_HASH_LEN])
{
    uint64_t key = kvg_cache_index_key(hash);
    int64_t at, free_at;

    at = find(w, w->active, key, &free_at);
    if (at >= 0) {
        w->refs[w->active][at]++;
        w->total++;
        return 0;
    }
    /* Keep an empty slot in every probe: a new key may fill at most 3/4. */
    if ((uint64_t)w->count + 1 > (uint64_t)w->cap / 4 * 3)
        return -1;
    if (free_at < 0 || (uint64_t)w->count + w->tombs + 1 > (uint64_t)w->cap / 4 * 3) {
        rebuild(w);
        find(w, w->active, key, &free_at);
        if (free_at < 0)
            return -1;
    }
    _Atomic uint64_t *s = table(w->p, w->cap, w->active);
    if (atomic_load_explicit(&s[free_at], memory_order_relaxed) == KVG_CACHE_INDEX_TOMB)
        w->tombs--;
    w->refs[w->active][free_at] = 1;
    atomic_store_explicit(&s[free_at], key, memory_order_release);
    w->count++;
    w->total++;
    publish_counts(w);
    return 0;
}

void kvg_cache_index_remove(kvg_cache_index_writer *w, const uint8_t hash[KVG_PREFIX_HASH_LEN])
{
    uint64_t key = kvg_cache_index_key(hash);
    int64_t at, free_at;
    _Atomic uint64_t *s = table(w->p, w->cap, w->active);
    uint32_t i;

    at = find(w, w->active, key, &free_at);
    if (at < 0)
        return;
    w->total--;
    if (--w->refs[w->active][at] > 0)
        return;
    w->count--;
    i = (uint32_t)at;
    if (atomic_load_explicit(&s[(i + 1) & w->mask], memory_order_relaxed) == KVG_CACHE_INDEX_EMPTY) {
        /* Nothing is probed past an empty slot, so a slot followed by one can be
         * emptied instead of tombstoned, and so can the tombstones before it. */
        atomic_store_explicit(&s[i], KVG_CACHE_INDEX_EMPTY, memory_order_release);
        for (i = (i - 1) & w->mask;
             atomic_load_explicit(&s[i], memory_order_relaxed) == KVG_CACHE_INDEX_TOMB;
             i = (i - 1) & w->mask) {
            atomic_store_explicit(&s[i], KVG_CACHE_INDEX_EMPTY, memory_order_release);
            w->tombs--;
        }
    } else {
        atomic_store_explicit(&s[i], KVG_CACHE_INDEX_TOMB, memory_order_release);
        w->tombs++;
    }
    if (w->tombs > w->cap / 4)
        rebuild(w);
    publish_counts(w);
}

void kvg_cache_index_clear(kvg_cache_index_writer *w)
{
    for (unsigned t = 0; t < 2; t++) {
        _Atomic uint64_t *s = table(w->p, w->cap, t);
        for (uint32_t i = 0; i < w->cap; i++)
            atomic_store_explicit(&s[i], KVG_CACHE_INDEX_EMPTY, memory_order_release);
        memset(w->refs[t], 0, w->cap * sizeof *w->refs[t]);
    }
    w->count = w->tombs = 0;
    w->total = 0;
    publish_counts(w);
}

uint32_t kvg_cache_index_refs(const kvg_cache_index_writer *w, const uint8_t hash[KVG_PREFIX_HASH_LEN])
{
    int64_t free_at, at = find(w, w->active, kvg_cache_index_key(hash), &free_at);
    return at < 0 ? 0 : w->refs[w->active][at];
}

uint32_t kvg_cache_index_count(const kvg_cache_index_writer *w)
{
    return w->count;
}

uint64_t kvg_cache_index_total(const kvg_cache_index_writer *w)
{
    return w->total;
}

uint64_t kvg_cache_index_generation(const kvg_cache_index_writer *w)
{
    return w->generation;
}

/* ---- readers ---- */

int kvg_cache_index_attach(kvg_cache_index_reader *r, const void *page, size_t bytes, char *err, size_t err_len)
{
    const kvg_cache_index_page *p = page;
    size_t need;

    memset(r, 0, sizeof *r);
    if (!p || bytes < sizeof *p)
        return kvg_fail(err, err_len, "cache index", "a page of %zu bytes", bytes);
    if (p->magic != KVG_CACHE_INDEX_MAGIC || p->version != KVG_PROTO_VERSION)
        return kvg_fail(err, err_len, "cache index", "not a cache index page of protocol version %u", KVG_PROTO_VERSION);
    need = kvg_cache_index_page_bytes(p->capacity);
    if (!need || need > bytes)
        return kvg_fail(err, err_len, "cache index", "capacity %u does not fit a page of %zu bytes", p->capacity,
                        bytes);
    r->page = p;
    r->mask = p->capacity - 1;
    return 0;
}

int kvg_cache_index_contains(const kvg_cache_index_reader *r, const uint8_t hash[KVG_PREFIX_HASH_LEN])
{
    uint64_t key = kvg_cache_index_key(hash);
    uint32_t cap = r->mask + 1, i = (uint32_t)key & r->mask;
    unsigned t;
    const _Atomic uint64_t *s;

    if (!r->page)
        return 0;
    /* The page is writable by the engine alone; `& 1` and the bounded probe keep a
     * broken one from sending this reader outside its mapping or into a loop. */
    t = atomic_load_explicit(&r->page->active, memory_order_acquire) & 1u;
    s = r->page->slot + (size_t)t * cap;
    for (uint32_t n = 0; n < cap; n++, i = (i + 1) & r->mask) {
        uint64_t v = atomic_load_explicit(&s[i], memory_order_acquire);
        if (v == key)
            return 1;
        if (v == KVG_CACHE_INDEX_EMPTY)
            return 0;
    }
    return 0;
}

size_t kvg_cache_index_prefix(const kvg_cache_index_reader *r, const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], size_t n)
{
    size_t k = 0;
    while (k < n && kvg_cache_index_contains(r, hashes[k]))
        k++;
    return k;
}
