/* The u64 -> pointer map: 200,000 random puts, gets and deletes against a plain
 * array, with the probe-run invariant (every key reachable from its home slot without
 * crossing an empty slot) checked along the way. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "u64map.h"

#define KEYS 4096

static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

static int reachable(const kvg_u64map *m)
{
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i])
            continue;
        void *v;
        if (!kvg_u64map_find(m, m->keys[i], &v) || v != m->vals[i])
            return 0;
    }
    return 1;
}

int main(void)
{
    kvg_u64map m = { 0 };
    static void *ref[KEYS + 1];
    static int present[KEYS + 1];
    int bad = 0, n = 0;

    ok(kvg_u64map_del(&m, 5) == NULL && !kvg_u64map_find(&m, 5, NULL),
       "an empty map finds nothing");
    ok(kvg_u64map_put(&m, 0, &m) == -1, "key 0 is refused");
    ok(kvg_u64map_put(&m, 7, NULL) == 0 && kvg_u64map_find(&m, 7, NULL) && m.n == 1,
       "a NULL value is stored and found");
    kvg_u64map_del(&m, 7);
    for (int i = 0; i < 200000; i++) {
        /* Small ids like a client's, or the same spread over 64 bits. */
        uint64_t k = 1 + rnd() % KEYS;
        uint64_t key = i < 100000 ? k : k * 0x100000001ull;
        int slot = (int)k;
        if (i == 100000) {
            /* switch key spaces: start from an empty map */
            while (kvg_u64map_any(&m, NULL))
                kvg_u64map_del(&m, kvg_u64map_any(&m, NULL));
            memset(present, 0, sizeof present);
            n = 0;
        }
        switch (rnd() % 3) {
        case 0:
            ref[slot] = (void *)(uintptr_t)(rnd() | 1);
            if (!present[slot])
                n++;
            present[slot] = 1;
            bad += kvg_u64map_put(&m, key, ref[slot]) != 0;
            break;
        case 1: {
            void *v = NULL;
            int f = kvg_u64map_find(&m, key, &v);
            bad += f != present[slot] || (f && v != ref[slot]);
            break;
        }
        default: {
            void *v = kvg_u64map_del(&m, key);
            bad += present[slot] ? v != ref[slot] : v != NULL;
            if (present[slot])
                n--;
            present[slot] = 0;
        }
        }
        if (i % 20000 == 0)
            bad += !reachable(&m);
        bad += m.n != (size_t)n;
    }
    is_int(bad, 0, "200,000 random operations agree with the reference");
    ok(reachable(&m), "every stored key is reachable after all the deletions");
    size_t left = m.n;
    while (kvg_u64map_any(&m, NULL)) {
        void *v;
        uint64_t k = kvg_u64map_any(&m, &v);
        if (kvg_u64map_del(&m, k) != v)
            bad++;
    }
    ok(m.n == 0 && bad == 0, "draining %zu entries with kvg_u64map_any empties the map", left);
    kvg_u64map_free(&m);
    return done_testing();
}
