/* The one BPE merge (kvg_bpe_merge), every format's.
 *
 * A word is a list of symbols (token ids). The adjacent pair with the lowest
 * merge rank is merged, the leftmost among equal ranks, until no pair has a
 * merge: the order both SentencePiece (by score) and GPT-2 BPE (by merge rank)
 * define.
 *
 * Long words use a doubly linked list and a heap: every pair that has a merge
 * gets a heap entry keyed (rank, position of its left symbol); a merge only
 * changes the pairs on either side of it, so each costs O(log n) and a word of
 * n symbols O(n log n). Heap entries are bare 64-bit keys: each symbol
 * remembers the rank of the pair it currently starts (recomputed whenever that
 * pair changes), so a popped key is current exactly when its rank still equals
 * the remembered one; stale keys are skipped.
 *
 * Short words (most of them) take the same rule through a small array scanned
 * for the best pair: bounded work per word, and cheaper than the heap there. */
#include <stdlib.h>
#include <string.h>

#include "tok_merge.h"

/* Words of up to this many symbols skip the heap; tests set it to 0 to check
 * the heap path alone. */
int kvg_tok_small_word = 24;
#define SMALL_MAX 64

int kvg_tok_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (*cap >= need)
        return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

int kvg_ids_reserve(kvg_ids *a, size_t more)
{
    if (a->cap - a->n >= more)
        return 0;
    size_t cap = a->cap ? a->cap : 64;
    while (cap - a->n < more)
        cap *= 2;
    int32_t *v = realloc(a->v, cap * sizeof *v);
    if (!v)
        return -1;
    a->v = v;
    a->cap = cap;
    return 0;
}

int kvg_ids_push(kvg_ids *a, int32_t id)
{
    if (a->n == a->cap && kvg_ids_reserve(a, 1) < 0)
        return -1;
    a->v[a->n++] = id;
    return 0;
}

void kvg_bpe_reset_pairs(kvg_tok_scratch *s)
{
    if (s->pairs)
        memset(s->pairs, 0xff, KVG_PAIR_CACHE * sizeof *s->pairs);
}

void kvg_tok_scratch_free(kvg_tok_scratch *s)
{
    free(s->init);
    free(s->sym);
    free(s->heap);
    free(s->pairs);
    free(s->buf);
    free(s->frag);
    free(s->cache);
    free(s->cache_ids.v);
    free(s->keys);
    for (int b = 0; b < 65; b++)
        free(s->rq[b]);
    memset(s, 0, sizeof *s);
}

/* Rank of the merge of (a, b), -1 if none; *result gets what it makes. */
static inline int32_t pair_rank(kvg_tok_scratch *s, const struct kvg_tokenizer *t,
                                int32_t a, int32_t b, int32_t *result)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t h = key * 0x9E3779B97F4A7C15ULL;
    kvg_merge *c = &s->pairs[(h >> 40) & (KVG_PAIR_CACHE - 1)];

    if (c->key != key) {
        const kvg_merge *m = kvg_merges_get(&t->merges, a, b);
        c->key = key;
        c->rank = m ? m->rank : -1;
        c->result = m ? m->result : -1;
    }
    *result = c->result;
    return c->rank;
}

/* ---- short words: an array ---- */

typedef struct small_sym {
    int32_t id;
    int32_t rank;                /* of the pair (this, next); INT32_MAX if none */
    int32_t result;
} small_sym;

static inline void small_pair(kvg_tok_scratch *s, const struct kvg_tokenizer *t, small_sym *a, size_t i)
{
    int32_t r = pair_rank(s, t, a[i].id, a[i + 1].id, &a[i].result);
    a[i].rank = r >= 0 ? r : INT32_MAX;
}

static int merge_small(kvg_tok_scratch *s, const struct kvg_tokenizer *t, size_t n, kvg_ids *dst)
{
    small_sym a[SMALL_MAX];

    for (size_t i = 0; i < n; i++)
        a[i].id = s->init[i];
    a[n - 1].rank = INT32_MAX;
    for (size_t i = 0; i + 1 < n; i++)
        small_pair(s, t, a, i);
    while (n > 1) {
        int32_t best = INT32_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++)
            if (a[i].rank < best) {     /* strict: the leftmost of equal ranks */
                best = a[i].rank;
                at = i;
            }
        if (best == INT32_MAX)
            break;
        a[at].id = a[at].result;
        n--;
        for (size_t i = at + 1; i < n; i++)
            a[i] = a[i + 1];
        if (at > 0)
            small_pair(s, t, a, at - 1);
        if (at + 1 < n)
            small_pair(s, t, a, at);
        else
            a[at].rank = INT32_MAX;
    }
    if (kvg_ids_reserve(dst, n) < 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        dst->v[dst->n + i] = a[i].id;
    dst->n += n;
    return 0;
}

/* ---- long words: linked list and heap of (rank << 32 | left position) ----
 * The heap is 4-ary: half the depth of a binary heap, and the four children of
 * a node share a cache line, which is what matters once a long word's heap no
 * longer fits the cache. */

static inline void heap_sift_down(uint64_t *h, size_t n, size_t i, uint64_t x)
{
    for (;;) {
        size_t c = 4 * i + 1;
        if (c >= n)
            break;
        size_t end = c + 4 < n ? c + 4 : n, m = c;
        for (size_t k = c + 1; k < end; k++)
            if (h[k] < h[m])
                m = k;
        if (x <= h[m])
            break;
        h[i] = h[m];
        i = m;
    }
    h[i] = x;
}

static inline void heap_push(kvg_tok_scratch *s, uint64_t key)
{
    uint64_t *h = s->heap;
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (h[p] <= key)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = key;
}

static inline uint64_t heap_pop(kvg_tok_scratch *s)
{
    uint64_t top = s->heap[0], x = s->heap[--s->heap_n];
    if (s->heap_n)
        heap_sift_down(s->heap, s->heap_n, 0, x);
    return top;
}

/* ---- long words with monotone merges: a radix queue ----
 * When merges only create pairs of a later rank (t->merge_monotone), keys are
 * pushed in increasing order relative to the last one popped, which is what a
 * radix heap needs: bucket b holds keys whose highest bit differing from the
 * last popped key is bit b-1. Keys move only towards bucket 0, each bucket is
 * a plain array, and memory is touched sequentially: much faster than a heap
 * for words of a million symbols. Same keys out, in the same order. */

static inline int rq_bucket(uint64_t key, uint64_t last)
{
    return key == last ? 0 : 64 - __builtin_clzll(key ^ last);
}

static inline int rq_push(kvg_tok_scratch *s, uint64_t key)
{
    int b = rq_bucket(key, s->rq_last);
    if (s->rq_n[b] == s->rq_cap[b]
        && kvg_tok_grow((void **)&s->rq[b], &s->rq_cap[b], s->rq_n[b] + 1, sizeof(uint64_t)) < 0)
        return -1;
    s->rq[b][s->rq_n[b]++] = key;
    return 0;
}

/* Pops the smallest key into *key; 0 when empty, -1 out of memory. */
static int rq_pop(kvg_tok_scratch *s, uint64_t *key)
{
    if (s->rq_n[0] == 0) {
        int i = 1;
        while (i < 65 && s->rq_n[i] == 0)
            i++;
        if (i == 65)
            return 0;
        uint64_t *v = s->rq[i], m = v[0];
        size_t n = s->rq_n[i];
        for (size_t k = 1; k < n; k++)
            if (v[k] < m)
                m = v[k];
        s->rq_last = m;
        s->rq_n[i] = 0;
        /* Every key of bucket i lands in a lower bucket. */
        for (size_t k = 0; k < n; k++)
            if (rq_push(s, v[k]) < 0)
                return -1;
    }
    *key = s->rq[0][--s->rq_n[0]];
    return 1;
}

/* Looks up the pair starting at symbol i and queues it. */
static inline int pair_update(kvg_tok_scratch *s, const struct kvg_tokenizer *t, int32_t i, int radix)
{
    kvg_bpe_sym *y = s->sym;
    int32_t j = y[i].next;
    y[i].rank = j >= 0 ? pair_rank(s, t, y[i].id, y[j].id, &y[i].result) : -1;
    if (y[i].rank < 0)
        return 0;
    uint64_t key = (uint64_t)(uint32_t)y[i].rank << 32 | (uint32_t)i;
    if (radix)
        return rq_push(s, key);
    heap_push(s, key);
    return 0;
}

/* Words beyond this many symbols use the radix queue when merges allow. */
#define RADIX_MIN 512

static int merge_heap(kvg_tok_scratch *s, const struct kvg_tokenizer *t, size_t n, kvg_ids *dst)
{
    int radix = t->merge_monotone && n >= RADIX_MIN;

    /* Each merge queues at most two new pairs. */
    if (kvg_tok_grow((void **)&s->sym, &s->sym_cap, n, sizeof *s->sym) < 0
        || (!radix && kvg_tok_grow((void **)&s->heap, &s->heap_cap, 3 * n, sizeof *s->heap) < 0))
        return -1;
    kvg_bpe_sym *y = s->sym;
    for (size_t i = 0; i < n; i++) {
        y[i].id = s->init[i];
        y[i].prev = (int32_t)i - 1;
        y[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    if (radix) {
        s->rq_last = 0;
        for (int b = 0; b < 65; b++)
            s->rq_n[b] = 0;
        for (size_t i = 0; i < n; i++)
            if (pair_update(s, t, (int32_t)i, 1) < 0)
                return -1;
    } else {
        /* The initial pairs go in unordered and are heapified at once: O(n). */
        size_t m = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            y[i].rank = pair_rank(s, t, y[i].id, y[i + 1].id, &y[i].result);
            if (y[i].rank >= 0)
                s->heap[m++] = (uint64_t)(uint32_t)y[i].rank << 32 | (uint32_t)i;
        }
        y[n - 1].rank = -1;
        s->heap_n = m;
        for (size_t i = m / 4 + 1; i-- > 0;)
            if (i < m)
                heap_sift_down(s->heap, m, i, s->heap[i]);
    }
    for (;;) {
        uint64_t key;
        if (radix) {
            int got = rq_pop(s, &key);
            if (got < 0)
                return -1;
            if (!got)
                break;
        } else {
            if (!s->heap_n)
                break;
            key = heap_pop(s);
        }
        int32_t l = (int32_t)(uint32_t)key;
        int32_t rank = (int32_t)(key >> 32);
        if (y[l].id < 0 || y[l].rank != rank)
            continue;           /* stale: the pair at l changed since */
        int32_t r = y[l].next;
        y[l].id = y[l].result;
        y[l].next = y[r].next;
        if (y[r].next >= 0)
            y[y[r].next].prev = l;
        y[r].id = -1;
        if ((y[l].prev >= 0 && pair_update(s, t, y[l].prev, radix) < 0) || pair_update(s, t, l, radix) < 0)
            return -1;
    }
    if (kvg_ids_reserve(dst, n) < 0)
        return -1;
    for (int32_t i = 0; i >= 0; i = y[i].next)
        dst->v[dst->n++] = y[i].id;
    return 0;
}

int kvg_bpe_merge(kvg_tok_scratch *s, const struct kvg_tokenizer *t, size_t n, kvg_ids *dst)
{
    if (n == 0)
        return 0;
    if (n == 1)
        return kvg_ids_push(dst, s->init[0]);
    if (!s->pairs) {
        if (!(s->pairs = malloc(KVG_PAIR_CACHE * sizeof *s->pairs)))
            return -1;
        kvg_bpe_reset_pairs(s);
    }
    if (n <= (size_t)kvg_tok_small_word && n <= SMALL_MAX)
        return merge_small(s, t, n, dst);
    return merge_heap(s, t, n, dst);
}
