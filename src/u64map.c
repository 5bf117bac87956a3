/* Open-addressing u64 -> pointer map; see u64map.h. */
#include "u64map.h"

#include <stdlib.h>

static size_t slot_of(uint64_t key, size_t cap)
{
    /* Fibonacci hashing: request ids are sequential, the multiply spreads them. */
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 17) & (cap - 1);
}

void kvg_u64map_free(kvg_u64map *m)
{
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->cap = m->n = 0;
}

static int grow(kvg_u64map *m)
{
    size_t nc = m->cap ? m->cap * 2 : 16;
    uint64_t *nk = calloc(nc, sizeof *nk);
    void **nv = calloc(nc, sizeof *nv);
    if (!nk || !nv) {
        free(nk);
        free(nv);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i])
            continue;
        size_t j = slot_of(m->keys[i], nc);
        while (nk[j])
            j = (j + 1) & (nc - 1);
        nk[j] = m->keys[i];
        nv[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = nk;
    m->vals = nv;
    m->cap = nc;
    return 0;
}

int kvg_u64map_put(kvg_u64map *m, uint64_t key, void *val)
{
    if (!key)
        return -1;
    if ((m->n + 1) * 2 > m->cap && grow(m) != 0)
        return -1;
    size_t j = slot_of(key, m->cap);
    while (m->keys[j] && m->keys[j] != key)
        j = (j + 1) & (m->cap - 1);
    if (!m->keys[j])
        m->n++;
    m->keys[j] = key;
    m->vals[j] = val;
    return 0;
}

int kvg_u64map_find(const kvg_u64map *m, uint64_t key, void **val)
{
    if (!key || !m->cap)
        return 0;
    for (size_t j = slot_of(key, m->cap); m->keys[j]; j = (j + 1) & (m->cap - 1))
        if (m->keys[j] == key) {
            if (val)
                *val = m->vals[j];
            return 1;
        }
    return 0;
}

void *kvg_u64map_del(kvg_u64map *m, uint64_t key)
{
    size_t mask = m->cap - 1, j;
    void *val;

    if (!key || !m->cap)
        return NULL;
    for (j = slot_of(key, m->cap); m->keys[j] != key; j = (j + 1) & mask)
        if (!m->keys[j])
            return NULL;
    val = m->vals[j];
    /* Backward shift: pull later members of the probe run into the hole when their
     * home slot does not lie (cyclically) between the hole and them. */
    for (size_t k = (j + 1) & mask; m->keys[k]; k = (k + 1) & mask) {
        size_t home = slot_of(m->keys[k], m->cap);
        if (((k - home) & mask) >= ((k - j) & mask)) {
            m->keys[j] = m->keys[k];
            m->vals[j] = m->vals[k];
            j = k;
        }
    }
    m->keys[j] = 0;
    m->vals[j] = NULL;
    m->n--;
    return val;
}

uint64_t kvg_u64map_any(const kvg_u64map *m, void **val)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i]) {
            if (val)
                *val = m->vals[i];
            return m->keys[i];
        }
    return 0;
}
