/* Paged KV pool: block allocator with reference counts and per-sequence block tables.
 * See kv_cache.h for the block layout and the sharing rules. */
#include "kv_cache.h"
#include "kv_cache_testing.h"
#include "errmsg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static int geom_valid(const kvg_kv_geom *g)
{
    return g && g->n_layers > 0 && g->n_kv_heads > 0 && g->head_dim > 0 &&
           g->block_tokens >= 0 && g->block_tokens <= 4096 &&
           g->n_layers <= 4096 && g->n_kv_heads <= 4096 && g->head_dim <= 65536 &&
           (g->dtype == KVG_KV_F32 || g->dtype == KVG_KV_INT8) && g->full_layers >= 0;
}

const char *kvg_kv_dtype_name(int dtype)
{
    return dtype == KVG_KV_INT8 ? "int8" : dtype == KVG_KV_F32 ? "f32" : "?";
}

static int block_tokens_of(const kvg_kv_geom *g)
{
    return g->block_tokens ? g->block_tokens : KVG_KV_BLOCK_TOKENS_DEFAULT;
}

float kvg_kv_quantize(const float *x, int n, int8_t *q, size_t stride)
{
    float amax = 0.0f, scale;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    scale = amax / 127.0f;
    for (int i = 0; i < n; i++) {
        /* x / scale is within 127 (1 + 2^-23) of 0: rounds to at most 127 */
        long v = scale > 0.0f ? lrintf(x[i] / scale) : 0;
        q[(size_t)i * stride] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    return scale;
}

/* Layers [0, n_full) in the F32 layout. */
static int n_full_of(const kvg_kv_geom *g)
{
    return g->dtype == KVG_KV_INT8 && g->full_layers < g->n_layers ? g->full_layers : g->n_layers;
}

static size_t pad16(size_t n)
{
    return (n + 15) / 16 * 16;
}

/* Bytes of one (layer, kv_head) in the F32 layout: K then V. */
static size_t head_bytes_f32(const kvg_kv_geom *g)
{
    return 2u * (size_t)g->head_dim * (size_t)block_tokens_of(g) * sizeof(float);
}

/* In the int8 layout: K and V (int8, each padded to 16 bytes), then a float scale per
 * token for K and one for V (kv_cache.h). */
static size_t head_bytes_i8(const kvg_kv_geom *g)
{
    size_t bt = (size_t)block_tokens_of(g);
    return pad16(2u * pad16((size_t)g->head_dim * bt) + 2u * bt * sizeof(float));
}

/* Bytes from one block to the next. The payload is usually a large power of two
 * times something, which would put the same (layer, head) of every block in the same
 * cache sets and make attention, which walks one head across all blocks, thrash the
 * caches; padding the stride to an odd number of 64-byte lines spreads them. */
static size_t block_stride_bytes(const kvg_kv_geom *g)
{
    size_t nf = (size_t)n_full_of(g), nh = (size_t)g->n_kv_heads;
    size_t payload = nf * nh * head_bytes_f32(g) + ((size_t)g->n_layers - nf) * nh * head_bytes_i8(g);
    size_t lines = (payload + 63) / 64;
    if (lines % 2 == 0)
        lines++;
    return lines * 64;
}

size_t kvg_kv_block_bytes(const kvg_kv_geom *g)
{
    if (!geom_valid(g))
        return 0;
    return block_stride_bytes(g);
}

int32_t kvg_kv_blocks_for_budget(const kvg_kv_geom *g, size_t bytes)
{
    size_t bb = kvg_kv_block_bytes(g);
    size_t n;
    if (!bb)
        return 0;
    n = bytes / bb;
    return n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

static kvg_kv_pool *pool_new(const kvg_kv_geom *g, int32_t n_blocks, void *storage,
                             char *err, size_t err_len)
{
    kvg_kv_pool *p;
    size_t bb = kvg_kv_block_bytes(g);
    if (!bb) {
        kvg_set_err(err, err_len, "kv cache: invalid geometry");
        return NULL;
    }
    if (n_blocks <= 0) {
        kvg_set_err(err, err_len, "kv cache: block count must be positive (got %d)", (int)n_blocks);
        return NULL;
    }
    if ((size_t)n_blocks > SIZE_MAX / bb) {
        kvg_set_err(err, err_len, "kv cache: %d blocks of %zu bytes overflow", (int)n_blocks, bb);
        return NULL;
    }
    p = calloc(1, sizeof *p);
    if (!p) {
        kvg_set_err(err, err_len, "kv cache: out of memory");
        return NULL;
    }
    p->geom = *g;
    p->geom.block_tokens = block_tokens_of(g);
    p->n_blocks = n_blocks;
    p->n_full = n_full_of(g);
    p->head_bytes_f32 = head_bytes_f32(g);
    p->head_bytes_i8 = head_bytes_i8(g);
    p->i8_v_off = pad16((size_t)g->head_dim * (size_t)p->geom.block_tokens);
    p->i8_ks_off = 2u * p->i8_v_off;
    p->i8_vs_off = p->i8_ks_off + (size_t)p->geom.block_tokens * sizeof(float);
    p->stride_bytes = block_stride_bytes(g);
    p->refcount = calloc((size_t)n_blocks, sizeof *p->refcount);
    p->free_ids = malloc((size_t)n_blocks * sizeof *p->free_ids);
    if (storage) {
        p->data = storage;
    } else {
        /* Fresh anonymous pages: zeroed, page aligned, and resident only once written. */
        void *d = mmap(NULL, (size_t)n_blocks * bb, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        p->data = d == MAP_FAILED ? NULL : d;
        p->owns_data = 1;
    }
    if (!p->refcount || !p->free_ids || !p->data) {
        kvg_set_err(err, err_len, "kv cache: out of memory for %d blocks of %zu bytes",
               (int)n_blocks, bb);
        kvg_kv_pool_free(p);
        return NULL;
    }
    /* Stack with block 0 on top: allocation order is deterministic and starts low. */
    for (int32_t i = 0; i < n_blocks; i++)
        p->free_ids[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return p;
}

kvg_kv_pool *kvg_kv_pool_new(const kvg_kv_geom *g, int32_t n_blocks, char *err, size_t err_len)
{
    return pool_new(g, n_blocks, NULL, err, err_len);
}

kvg_kv_pool *kvg_kv_pool_new_ext(const kvg_kv_geom *g, int32_t n_blocks, void *storage,
                                 kvg_kv_copy_fn copy, void *copy_ctx,
                                 char *err, size_t err_len)
{
    kvg_kv_pool *p;
    if (!storage) {
        kvg_set_err(err, err_len, "kv cache: no storage given");
        return NULL;
    }
    p = pool_new(g, n_blocks, storage, err, err_len);
    if (p) {
        p->copy = copy;
        p->copy_ctx = copy_ctx;
    }
    return p;
}

kvg_kv_pool *kvg_kv_pool_new_device(const kvg_kv_geom *g, int32_t n_blocks, void *storage,
                                    size_t block_bytes, kvg_kv_copy_fn copy,
                                    void (*release)(void *ctx, void *storage), void *ctx,
                                    char *err, size_t err_len)
{
    kvg_kv_pool *p = NULL;
    if (!storage || !copy || !block_bytes)
        kvg_set_err(err, err_len, "kv cache: a device pool needs storage, a block size and a copy function");
    else
        p = pool_new(g, n_blocks, storage, err, err_len);
    if (!p) {
        if (release && storage)
            release(ctx, storage);
        return NULL;
    }
    p->copy = copy;
    p->copy_ctx = ctx;
    p->block_bytes = block_bytes;
    p->release = release;
    return p;
}

void kvg_kv_pool_free(kvg_kv_pool *p)
{
    if (!p)
        return;
    if (p->release && p->data)
        p->release(p->copy_ctx, p->data);
    if (p->owns_data && p->data)
        munmap(p->data, (size_t)p->n_blocks * p->stride_bytes);
    free(p->refcount);
    free(p->free_ids);
    free(p);
}

size_t kvg_kv_xfer_bytes(const kvg_kv_pool *p)
{
    return p->block_bytes ? p->block_bytes : p->stride_bytes;
}

int kvg_kv_block_export(const kvg_kv_pool *p, int32_t id, void *host)
{
    if (id < 0 || id >= p->n_blocks)
        return -1;
    if (p->block_bytes)
        return p->xfer_out ? p->xfer_out(p->copy_ctx, p->data, p->block_bytes, id, host) : -1;
    memcpy(host, (const char *)p->data + (size_t)id * p->stride_bytes, p->stride_bytes);
    return 0;
}

int kvg_kv_block_import(kvg_kv_pool *p, int32_t id, const void *host)
{
    if (id < 0 || id >= p->n_blocks)
        return -1;
    if (p->block_bytes)
        return p->xfer_in ? p->xfer_in(p->copy_ctx, p->data, p->block_bytes, id, (void *)host) : -1;
    memcpy((char *)p->data + (size_t)id * p->stride_bytes, host, p->stride_bytes);
    return 0;
}

void kvg_kv_pool_set_xfer(kvg_kv_pool *p, kvg_kv_xfer_fn out, kvg_kv_xfer_fn in)
{
    p->xfer_out = out;
    p->xfer_in = in;
}

void kvg_kv_pool_set_xfer_wait(kvg_kv_pool *p, void (*wait)(void *ctx))
{
    p->xfer_wait = wait;
}

void kvg_kv_pool_xfer_wait(const kvg_kv_pool *p)
{
    if (p && p->xfer_wait)
        p->xfer_wait(p->copy_ctx);
}

int32_t kvg_kv_pool_free_blocks(const kvg_kv_pool *p)
{
    return p->n_free;
}

/* Makes sure `need` blocks are on the free list, asking the owner to give kept
 * blocks back; 0, or -1 when even then there are too few. */
static int ensure_free(kvg_kv_pool *p, int32_t need)
{
    while (p->n_free < need) {
        if (!p->reclaim || p->reclaim(p->hook_ctx) != 0)
            return -1;
    }
    return 0;
}

int32_t kvg_kv_block_alloc(kvg_kv_pool *p)
{
    int32_t id;
    if (ensure_free(p, 1) != 0)
        return -1;
    id = p->free_ids[--p->n_free];
    p->refcount[id] = 1;
    return id;
}

int32_t kvg_kv_block_ref(kvg_kv_pool *p, int32_t id)
{
    if (id < 0 || id >= p->n_blocks || p->refcount[id] <= 0 || p->refcount[id] == INT32_MAX)
        return -1;
    return ++p->refcount[id];
}

int32_t kvg_kv_block_unref(kvg_kv_pool *p, int32_t id)
{
    if (id < 0 || id >= p->n_blocks || p->refcount[id] <= 0)
        return -1;
    if (--p->refcount[id] == 0 && !(p->keep && p->keep(p->hook_ctx, id)))
        p->free_ids[p->n_free++] = id;
    return p->refcount[id];
}

int32_t kvg_kv_block_revive(kvg_kv_pool *p, int32_t id)
{
    if (id < 0 || id >= p->n_blocks || p->refcount[id] != 0)
        return -1;
    p->refcount[id] = 1;
    return 1;
}

int kvg_kv_block_put_free(kvg_kv_pool *p, int32_t id)
{
    if (id < 0 || id >= p->n_blocks || p->refcount[id] != 0 || p->n_free >= p->n_blocks)
        return -1;
    p->free_ids[p->n_free++] = id;
    return 0;
}

int32_t kvg_kv_block_refcount(const kvg_kv_pool *p, int32_t id)
{
    if (id < 0 || id >= p->n_blocks)
        return -1;
    return p->refcount[id];
}

static void copy_block(kvg_kv_pool *p, int32_t dst, int32_t src)
{
    size_t bytes = p->block_bytes ? p->block_bytes : p->stride_bytes;
    if (p->copy)
        p->copy(p->copy_ctx, p->data, bytes, dst, src);
    else
        memcpy((char *)p->data + (size_t)dst * p->stride_bytes,
               (const char *)p->data + (size_t)src * p->stride_bytes, bytes);
}

void kvg_kv_seq_init(kvg_kv_seq *s)
{
    memset(s, 0, sizeof *s);
}

static int seq_reserve_table(kvg_kv_seq *s, int32_t n, char *err, size_t err_len)
{
    int32_t cap;
    int32_t *b;
    if (n <= s->cap)
        return 0;
    cap = s->cap ? s->cap : 8;
    while (cap < n)
        cap = cap > INT32_MAX / 2 ? n : cap * 2;
    b = realloc(s->blocks, (size_t)cap * sizeof *b);
    if (!b) {
        kvg_set_err(err, err_len, "kv cache: out of memory for a block table of %d", (int)cap);
        return -1;
    }
    s->blocks = b;
    s->cap = cap;
    return 0;
}

int kvg_kv_seq_prepare(kvg_kv_pool *p, kvg_kv_seq *s, int32_t n_new, char *err, size_t err_len)
{
    int32_t bt = p->geom.block_tokens;
    int32_t first, end_blocks, need = 0;
    int64_t end;

    if (n_new < 0 || s->n_tokens < 0) {
        kvg_set_err(err, err_len, "kv cache: negative token count");
        return -1;
    }
    if (n_new == 0)
        return 0;
    end = (int64_t)s->n_tokens + n_new;
    if (end > (int64_t)INT32_MAX - bt) {
        kvg_set_err(err, err_len, "kv cache: sequence too long");
        return -1;
    }
    first = s->n_tokens / bt;
    end_blocks = (int32_t)((end + bt - 1) / bt);
    /* Count the blocks this write needs before touching anything, so a failure leaves
     * the sequence and the pool as they were. */
    for (int32_t i = first; i < end_blocks; i++)
        if (i >= s->n_blocks || p->refcount[s->blocks[i]] > 1)
            need++;
    if (ensure_free(p, need) != 0) {
        kvg_set_err(err, err_len, "kv cache: out of blocks (need %d, %d free of %d)",
               (int)need, (int)p->n_free, (int)p->n_blocks);
        return -1;
    }
    if (seq_reserve_table(s, end_blocks, err, err_len) != 0)
        return -1;
    for (int32_t i = first; i < end_blocks; i++) {
        if (i >= s->n_blocks) {
            s->blocks[s->n_blocks++] = kvg_kv_block_alloc(p);
        } else if (p->refcount[s->blocks[i]] > 1) {
            int32_t nb = kvg_kv_block_alloc(p);
            copy_block(p, nb, s->blocks[i]);
            kvg_kv_block_unref(p, s->blocks[i]);
            s->blocks[i] = nb;
        }
    }
    return 0;
}

int kvg_kv_seq_fork(kvg_kv_pool *p, const kvg_kv_seq *src, kvg_kv_seq *dst,
                    char *err, size_t err_len)
{
    if (dst->n_blocks != 0 || dst->n_tokens != 0) {
        kvg_set_err(err, err_len, "kv cache: fork into a non-empty sequence");
        return -1;
    }
    if (seq_reserve_table(dst, src->n_blocks, err, err_len) != 0)
        return -1;
    for (int32_t i = 0; i < src->n_blocks; i++) {
        dst->blocks[i] = src->blocks[i];
        kvg_kv_block_ref(p, src->blocks[i]);
    }
    dst->n_blocks = src->n_blocks;
    dst->n_tokens = src->n_tokens;
    return 0;
}

void kvg_kv_seq_truncate(kvg_kv_pool *p, kvg_kv_seq *s, int32_t n_tokens)
{
    int32_t bt = p->geom.block_tokens, keep;
    if (n_tokens < 0)
        n_tokens = 0;
    if (n_tokens < s->n_tokens)
        s->n_tokens = n_tokens;
    keep = (s->n_tokens + bt - 1) / bt;
    while (s->n_blocks > keep)
        kvg_kv_block_unref(p, s->blocks[--s->n_blocks]);
}

void kvg_kv_seq_release(kvg_kv_pool *p, kvg_kv_seq *s)
{
    for (int32_t i = s->n_blocks - 1; i >= 0; i--)
        kvg_kv_block_unref(p, s->blocks[i]);
    free(s->blocks);
    kvg_kv_seq_init(s);
}
