/* The paged KV cache: one preallocated pool of fixed-size blocks, a block allocator
 * with reference counts, and per-sequence block tables.
 *
 * Block layout. A block holds the keys and values of `block_tokens` consecutive
 * positions for ALL layers, so one block id names everything a prefix block needs (the
 * prefix cache shares, hashes and evicts whole blocks). Inside a block:
 *
 *     [layer][kv_head] { K: [head_dim][block_tokens]   V: [block_tokens][head_dim] }
 *
 * (plus padding to an odd number of 64-byte lines, so the same head of consecutive
 * blocks does not land in the same cache sets).
 *
 * int8 KV (geom.dtype KVG_KV_INT8, --kv-dtype int8): the first geom.full_layers layers
 * keep the F32 layout above, the deeper ones hold, per (layer, kv_head):
 *
 *     { K: int8 [head_dim][block_tokens]   V: int8 [block_tokens][head_dim]
 *       K scale: float [block_tokens]      V scale: float [block_tokens] }
 *
 * (each int8 array padded to 16 bytes). One scale per (token, kv head) for K and one for
 * V: symmetric, scale = max|x| / 127, q = x / scale rounded to nearest even (a zero
 * vector: scale 0, every q 0, so it dequantizes to exactly 0), x ~ q * scale. K stays
 * dimension-major for the same elementwise FMAs: a score is the FMA chain of q[d] times
 * the exact float of K's int8 over d, then one multiply by the key's scale; V's scale is
 * folded into the softmax weight (w_t * scale_t) before the V chain. Both depend on the
 * stored bytes only, so a cached block gives the bits it gave when it was written.
 * A block still holds all layers: one block id names everything a prefix block needs.
 * K is stored transposed (dimension-major): attention computes the scores of up to 16
 * keys at once as elementwise FMAs over head_dim (one vector of keys per dimension),
 * never needing a horizontal reduction, and the reduction order of every q.k dot stays
 * plain sequential over head_dim whatever the vector width. V stays token-major: the
 * output is accumulated as out[:] += p_j * V[j][:], again elementwise. The K and V of
 * one (layer, kv_head) sit next to each other, so the attention for one query head
 * streams one contiguous run per block.
 *
 * Sharing. Sequences may point at the same blocks (forks for n > 1 completions, and
 * in the next issue the prefix cache). A block with refcount > 1 is never written:
 * kvg_kv_seq_prepare copies it first (copy-on-write of the last partial block).
 * Full blocks are never written again because positions only append.
 *
 * Storage is host memory here; a device backend passes its own storage and copy
 * function (kvg_kv_pool_new_device). The pool and the sequences are not thread-safe:
 * one scheduler thread owns them. */
#ifndef KVG_KV_CACHE_H
#define KVG_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#define KVG_KV_BLOCK_TOKENS_DEFAULT 16

/* How a pool stores K and V (geom.dtype). */
#define KVG_KV_F32  0            /* every layer float32 (the default) */
#define KVG_KV_INT8 1            /* layers from full_layers on: int8 + a scale per token */

typedef struct kvg_kv_geom {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_tokens;            /* 0: KVG_KV_BLOCK_TOKENS_DEFAULT */
    int dtype;                   /* KVG_KV_F32 (0) or KVG_KV_INT8 */
    int full_layers;             /* KVG_KV_INT8: layers [0, full_layers) stay F32 (at
                                    least 0; n_layers or more: every layer F32) */
} kvg_kv_geom;

/* Copies block `src` to block `dst` in the pool's storage (device backends). */
typedef void (*kvg_kv_copy_fn)(void *ctx, void *storage, size_t block_bytes,
                               int32_t dst, int32_t src);

/* Copies one block's bytes out of the pool into a host buffer (export) or from a host
 * buffer into the pool (import): how a slower tier (the disk store, kv_disk.h) moves a
 * block without knowing where the pool lives. A device backend sets them with
 * kvg_kv_pool_set_xfer (bytes: kvg_kv_xfer_bytes); a host pool is a memcpy. */
typedef int (*kvg_kv_xfer_fn)(void *ctx, void *storage, size_t block_bytes, int32_t block,
                              void *host);

/* Fields are read-only outside kv_cache.c. */
typedef struct kvg_kv_pool {
    kvg_kv_geom geom;
    int32_t n_blocks;
    size_t stride_bytes;         /* bytes from one block to the next (padded) */
    int n_full;                  /* layers [0, n_full) in the F32 layout, the rest int8 */
    size_t head_bytes_f32;       /* bytes per (layer, kv_head), F32 layout: K then V */
    size_t head_bytes_i8;        /* int8 layout: K, V, K scales, V scales */
    size_t i8_v_off, i8_ks_off, i8_vs_off; /* offsets of V, K scales, V scales in it */
    float *data;                 /* n_blocks * stride_bytes */
    int owns_data;
    kvg_kv_copy_fn copy;
    void *copy_ctx;
    /* A device pool (kvg_kv_pool_new_device): data is the device address of the
     * storage, never dereferenced on the host; block_bytes is the device block size
     * (what copy is given) and release frees the storage with the pool. 0 / NULL for a
     * host pool. */
    size_t block_bytes;
    void (*release)(void *ctx, void *storage);
    /* A device pool's block export / import (kvg_kv_pool_set_xfer), NULL: none (then
     * kvg_kv_block_export fails); unused by a host pool. */
    kvg_kv_xfer_fn xfer_out, xfer_in;
    /* Waits until the transfers queued so far have run (a device pool whose transfers
     * into pinned host memory are asynchronous); NULL: they complete in the call. */
    void (*xfer_wait)(void *ctx);

    /* Allocator state. The next issue adds per-block chain hashes, a hash table
     * and an LRU list of refcount-0 cached blocks beside this free list. */
    int32_t *refcount;           /* [n_blocks] */
    int32_t *free_ids;           /* stack of free block ids */
    int32_t n_free;

    /* Owner hooks (the prefix cache sets them; NULL: plain pool). `keep` is called
     * when a block's count reaches 0: nonzero means the owner keeps the block (cached,
     * refcount 0, off the free list). `reclaim` is called when the free list is empty:
     * it returns a kept block to the free list (kvg_kv_block_put_free) and 0, or -1
     * when it has nothing to give. */
    int (*keep)(void *ctx, int32_t id);
    int (*reclaim)(void *ctx);
    void *hook_ctx;
} kvg_kv_pool;

/* A sequence's view of the cache: the blocks holding positions [0, n_tokens). */
typedef struct kvg_kv_seq {
    int32_t *blocks;             /* block table: blocks[i] holds positions
                                    [i*block_tokens, (i+1)*block_tokens) */
    int32_t n_blocks;
    int32_t cap;
    int32_t n_tokens;            /* positions whose K/V are written */
} kvg_kv_seq;

/* Bytes of one block for the geometry, padding included (0 for an invalid geometry:
 * also an unknown dtype or a negative full_layers). */
size_t kvg_kv_block_bytes(const kvg_kv_geom *g);

/* A pool of n_blocks blocks in host memory (zeroed lazily by the OS). NULL with err on
 * a bad geometry, a non-positive count or out of memory. */
kvg_kv_pool *kvg_kv_pool_new(const kvg_kv_geom *g, int32_t n_blocks, char *err, size_t err_len);
/* A pool whose storage is a device backend's (engine/backend.h kv_pool_new): the same
 * allocator, block ids and sequences over `storage` (n_blocks * block_bytes in the
 * backend's own layout, e.g. device memory). Blocks are copied only through `copy`
 * (required); `release` (may be NULL) frees storage when the pool is freed, also when
 * this call fails. */
kvg_kv_pool *kvg_kv_pool_new_device(const kvg_kv_geom *g, int32_t n_blocks, void *storage,
                                    size_t block_bytes, kvg_kv_copy_fn copy,
                                    void (*release)(void *ctx, void *storage), void *ctx,
                                    char *err, size_t err_len);
void kvg_kv_pool_free(kvg_kv_pool *p);

/* Block transfer to and from host memory (see kvg_kv_xfer_fn). Bytes of one block as
 * transferred: the padded block of a host pool, block_bytes of a device pool. */
size_t kvg_kv_xfer_bytes(const kvg_kv_pool *p);
/* Copies block id's bytes into host (kvg_kv_xfer_bytes of them) / from host into the
 * block. 0, or -1 for a bad id or a device pool without the hook. */
int kvg_kv_block_export(const kvg_kv_pool *p, int32_t id, void *host);
int kvg_kv_block_import(kvg_kv_pool *p, int32_t id, const void *host);
/* A device pool's hooks (ctx: the pool's copy ctx). A transfer into or out of pinned host
 * memory may be asynchronous (ordered with the backend's later work on the device, as
 * the CUDA backend's one stream orders them): the host reads such a buffer only after
 * kvg_kv_pool_xfer_wait. Transfers with pageable host memory complete in the call. */
void kvg_kv_pool_set_xfer(kvg_kv_pool *p, kvg_kv_xfer_fn out, kvg_kv_xfer_fn in);
void kvg_kv_pool_set_xfer_wait(kvg_kv_pool *p, void (*wait)(void *ctx));
/* Waits for the pool's queued transfers (nothing for a host pool or p NULL). */
void kvg_kv_pool_xfer_wait(const kvg_kv_pool *p);

/* Allocator: a new block has refcount 1; -1 when the pool is exhausted. */
int32_t kvg_kv_block_alloc(kvg_kv_pool *p);
/* +1 on a block's count: the new count, or -1 for an id that is out of range or not
 * allocated. (Counts drop as sequences release their blocks.) */
int32_t kvg_kv_block_ref(kvg_kv_pool *p, int32_t id);
int32_t kvg_kv_block_refcount(const kvg_kv_pool *p, int32_t id);
/* For the owner of kept blocks: a kept block (refcount 0, not free) is taken back into
 * use with refcount 1 / handed to the free list. -1 for a bad id or a block in use. */
int32_t kvg_kv_block_revive(kvg_kv_pool *p, int32_t id);
int kvg_kv_block_put_free(kvg_kv_pool *p, int32_t id);

/* Whether `layer` is stored as int8 (else float32). */
static inline int kvg_kv_layer_int8(const kvg_kv_pool *p, int layer)
{
    return layer >= p->n_full;
}

/* The start of (block, layer, kv_head) in a host pool. */
static inline unsigned char *kvg_kv_head(const kvg_kv_pool *p, int32_t block, int layer, int kv_head)
{
    size_t nh = (size_t)p->geom.n_kv_heads, off;
    if (layer < p->n_full)
        off = ((size_t)layer * nh + (size_t)kv_head) * p->head_bytes_f32;
    else
        off = (size_t)p->n_full * nh * p->head_bytes_f32
            + ((size_t)(layer - p->n_full) * nh + (size_t)kv_head) * p->head_bytes_i8;
    return (unsigned char *)p->data + (size_t)block * p->stride_bytes + off;
}

/* F32 layers. K of (block, layer, kv_head): head_dim rows of block_tokens floats. */
static inline float *kvg_kv_k(const kvg_kv_pool *p, int32_t block, int layer, int kv_head)
{
    return (float *)(void *)kvg_kv_head(p, block, layer, kv_head);
}

/* V of (block, layer, kv_head): block_tokens rows of head_dim floats. */
static inline float *kvg_kv_v(const kvg_kv_pool *p, int32_t block, int layer, int kv_head)
{
    return kvg_kv_k(p, block, layer, kv_head)
         + (size_t)p->geom.head_dim * (size_t)p->geom.block_tokens;
}

/* int8 layers. K: head_dim rows of block_tokens int8; V: block_tokens rows of head_dim
 * int8; one float scale per token for each. */
static inline int8_t *kvg_kv_k8(const kvg_kv_pool *p, int32_t block, int layer, int kv_head)
{
    return (int8_t *)kvg_kv_head(p, block, layer, kv_head);
}

static inline int8_t *kvg_kv_v8(const kvg_kv_pool *p, int32_t block, int layer, int kv_head)
{
    return (int8_t *)kvg_kv_head(p, block, layer, kv_head) + p->i8_v_off;
}

static inline float *kvg_kv_kscale(const kvg_kv_pool *p, int32_t block, int layer, int kv_head)
{
    return (float *)(void *)(kvg_kv_head(p, block, layer, kv_head) + p->i8_ks_off);
}

static inline float *kvg_kv_vscale(const kvg_kv_pool *p, int32_t block, int layer, int kv_head)
{
    return (float *)(void *)(kvg_kv_head(p, block, layer, kv_head) + p->i8_vs_off);
}

/* "f32" or "int8", for messages. */
const char *kvg_kv_dtype_name(int dtype);

/* The int8 layout's quantization of one vector x[0..n): q[i * stride] = x[i] / scale
 * rounded to nearest even (|q| <= 127), scale = max|x| / 127 returned; a zero vector
 * gives scale 0 and every q 0. */
float kvg_kv_quantize(const float *x, int n, int8_t *q, size_t stride);

/* Sequences. A zeroed kvg_kv_seq is an empty sequence. */
void kvg_kv_seq_init(kvg_kv_seq *s);
/* Makes positions [n_tokens, n_tokens + n_new) writable: appends fresh blocks and
 * copies any shared block in that range (copy-on-write). On failure (pool exhausted,
 * out of memory) nothing changes and -1 is returned with err. The caller advances
 * n_tokens once the K/V are written (kvg_forward_step does). */
int kvg_kv_seq_prepare(kvg_kv_pool *p, kvg_kv_seq *s, int32_t n_new, char *err, size_t err_len);
/* dst (empty) shares every block of src, refcounts +1; the first write into the
 * shared last partial block copies it. -1 with err when out of memory. */
int kvg_kv_seq_fork(kvg_kv_pool *p, const kvg_kv_seq *src, kvg_kv_seq *dst,
                    char *err, size_t err_len);
/* Keeps the first n_tokens positions and releases the blocks past them. */
void kvg_kv_seq_truncate(kvg_kv_pool *p, kvg_kv_seq *s, int32_t n_tokens);
/* Releases all blocks, the last first (so a cache owner queues a chain's tail before
 * its head), and the table; the sequence is empty again. */
void kvg_kv_seq_release(kvg_kv_pool *p, kvg_kv_seq *s);

#endif
