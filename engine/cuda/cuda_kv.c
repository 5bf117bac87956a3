/* The KV pool in device memory: one cudaMalloc of n_blocks blocks in the layout of
 * kvg_k_kv_geom (no padding): every layer BF16, or with --kv-dtype int8 the first
 * full_layers BF16 and the deeper ones int8 with a float scale per (token, kv head);
 * under the same allocator, block ids and sequences as the host pool (kv_cache.c
 * kvg_kv_pool_new_device), so the prefix cache and the scheduler never know where the
 * bytes are.
 *
 * Copy-on-write: the pool's copy hook enqueues a device-to-device cudaMemcpyAsync of the
 * whole block on the backend's stream at once. kvg_kv_seq_prepare calls it before the
 * step is begun, so in stream order the copy lands after every earlier step's writes and
 * before this step's kernels; it is rare (the shared last block of a fork) and one block
 * long, so a separate kernel launch per step would buy nothing. A failed copy leaves a
 * sequence pointing at a block without its data: the backend is then marked unusable. */
#include "cuda_internal.h"
#include "errmsg.h"

#include <stdio.h>
#include <string.h>

static int block_tokens_of(const kvg_kv_geom *g)
{
    return g->block_tokens ? g->block_tokens : KVG_KV_BLOCK_TOKENS_DEFAULT;
}

/* The int8 layers of the geometry: the last n_layers - full_layers with --kv-dtype int8
 * (none when full_layers covers every layer), -1 for an unknown dtype. */
static int n_i8_of(const kvg_kv_geom *g)
{
    if (g->dtype == KVG_KV_F32)
        return 0;
    if (g->dtype != KVG_KV_INT8 || g->full_layers < 0)
        return -1;
    return g->full_layers < g->n_layers ? g->n_layers - g->full_layers : 0;
}

size_t kvg_cu_kv_block_bytes(const kvg_kv_geom *g)
{
    if (!g || n_i8_of(g) < 0)
        return 0;
    return kvg_k_kv_block_bytes(g->n_layers, n_i8_of(g), g->n_kv_heads, g->head_dim, block_tokens_of(g));
}

static void kv_copy(void *ctx, void *storage, size_t block_bytes, int32_t dst, int32_t src)
{
    kvg_cuda *c = ctx;
    unsigned char *base = storage;
    cudaError_t e;
    if (c->dead)
        return;
    e = cudaMemcpyAsync(base + (size_t)dst * block_bytes, base + (size_t)src * block_bytes, block_bytes,
                        cudaMemcpyDeviceToDevice, c->stream);
    if (e != cudaSuccess) {
        const char *op = c->op;
        c->op = "copy-on-write";
        kvg_cu_fail(c, "cudaMemcpyAsync", e, "block %d <- %d", (int)dst, (int)src);
        c->op = op;
        kvg_cu_mark_dead(c, c->err);
    }
}

/* A block to or from host memory (kv_cache.h's transfer hooks: the disk and host tiers):
 * cudaMemcpyAsync on the steps' stream. Ordered after every step enqueued before and
 * before every later one: a block exported while its pool slot is reused, or imported
 * just before the step that reads it, needs no wait. With pinned host memory (the host
 * tier's) the copy is asynchronous, and kv_xfer_wait is what the host waits on before it
 * reads the bytes; with pageable memory (the disk tier's staging) CUDA completes it in the
 * call. A failed copy is the transfer's (the block is not kept, or is recomputed), not a
 * step's; a sticky error marks the device lost. */
static int kv_xfer(kvg_cuda *c, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, int32_t block)
{
    cudaError_t e;
    if (c->dead)
        return -1;
    e = cudaMemcpyAsync(dst, src, bytes, kind, c->stream);
    if (e != cudaSuccess) {
        char what[200];
        kvg_cu_err_text(e, what, sizeof what);
        if (kvg_cu_sticky(e)) {
            char why[400];
            snprintf(why, sizeof why, "cuda: cudaMemcpyAsync (KV block %d %s the host) failed: %s", (int)block,
                     kind == cudaMemcpyDeviceToHost ? "to" : "from", what);
            kvg_cu_mark_dead(c, why);
        }
        (void)cudaGetLastError();
        return -1;
    }
    return 0;
}

static int kv_xfer_out(void *ctx, void *storage, size_t block_bytes, int32_t block, void *host)
{
    return kv_xfer(ctx, host, (unsigned char *)storage + (size_t)block * block_bytes, block_bytes,
                   cudaMemcpyDeviceToHost, block);
}

static int kv_xfer_in(void *ctx, void *storage, size_t block_bytes, int32_t block, void *host)
{
    return kv_xfer(ctx, (unsigned char *)storage + (size_t)block * block_bytes, host, block_bytes,
                   cudaMemcpyHostToDevice, block);
}

static void kv_xfer_wait(void *ctx)
{
    kvg_cuda *c = ctx;
    if (cudaStreamSynchronize(c->stream) != cudaSuccess) {
        cudaError_t e = cudaGetLastError();
        if (kvg_cu_sticky(e))
            kvg_cu_mark_dead(c, "cuda: cudaStreamSynchronize (waiting for KV block transfers) failed");
    }
}

static void kv_release(void *ctx, void *storage)
{
    kvg_cuda *c = ctx;
    cudaFree(storage);
    c->kv_pools--;
    c->kv_pool_blocks = 0;
    c->kv_block_bytes = 0;
}

kvg_kv_pool *kvg_cu_kv_pool_new(kvg_cuda *c, const kvg_kv_geom *g, int32_t n_blocks,
                                char *err, size_t err_len)
{
    size_t bb = kvg_cu_kv_block_bytes(g), bytes;
    void *d = NULL;
    cudaError_t e;
    if (!bb || n_blocks <= 0) {
        kvg_set_err(err, err_len, "cuda: invalid KV geometry or block count (%d)%s", (int)n_blocks,
                    g && n_i8_of(g) > 0 && g->head_dim % 4 ? ": int8 KV needs head_dim % 4 == 0" : "");
        return NULL;
    }
    if ((size_t)n_blocks > SIZE_MAX / bb) {
        kvg_set_err(err, err_len, "cuda: %d KV blocks of %zu bytes overflow", (int)n_blocks, bb);
        return NULL;
    }
    bytes = (size_t)n_blocks * bb;
    e = cudaMalloc(&d, bytes);
    /* Zeroed (no NaN garbage in a block's unwritten slots) on the steps' stream: that
     * stream is non-blocking, so a cudaMemset on the legacy default stream would not be
     * ordered before the first step's K/V writes, and could land after them. Waited for
     * here, so that a failure is this call's. */
    if (e == cudaSuccess)
        e = cudaMemsetAsync(d, 0, bytes, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        char what[200];
        kvg_cu_err_text(e, what, sizeof what);
        if (d)
            cudaFree(d);
        (void)cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        kvg_set_err(err, err_len, "cuda: cannot allocate the KV pool: cudaMalloc of %zu bytes (%.2f GB, "
                    "%d blocks of %zu) failed: %s; the device has %zu bytes (%.2f GB) free of %zu",
                    bytes, (double)bytes / 1e9, (int)n_blocks, bb, what, fr, (double)fr / 1e9, tot);
        return NULL;
    }
    c->kv_pools++;
    {
        kvg_kv_pool *p = kvg_kv_pool_new_device(g, n_blocks, d, bb, kv_copy, kv_release, c, err, err_len);
        if (p) {
            kvg_kv_pool_set_xfer(p, kv_xfer_out, kv_xfer_in);
            kvg_kv_pool_set_xfer_wait(p, kv_xfer_wait);
        }
        return p;
    }
}

int kvg_cu_kv_geom(kvg_cuda *c, const kvg_kv_pool *p, kvg_k_kv_geom *g)
{
    if (p->copy != kv_copy || p->copy_ctx != c) {
        return kvg_cu_fail(c, "kv pool", cudaErrorInvalidValue,
                           "the KV pool is not in this device's memory (create it with kvg_backend_kv_pool_new)");
    }
    memset(g, 0, sizeof *g);
    g->n_layers = p->geom.n_layers;
    g->n_kv_heads = p->geom.n_kv_heads;
    g->head_dim = p->geom.head_dim;
    g->block_tokens = p->geom.block_tokens;
    g->n_blocks = p->n_blocks;
    g->head_elems = 2 * (int64_t)g->block_tokens * g->head_dim;
    g->layer_elems = (int64_t)g->n_kv_heads * g->head_elems;
    g->n_i8 = n_i8_of(&p->geom);
    g->head_bytes_i8 = 2 * (int64_t)g->block_tokens * g->head_dim + 8 * (int64_t)g->block_tokens;
    g->i8_off = 2 * (int64_t)(g->n_layers - g->n_i8) * g->layer_elems;
    g->block_elems = (int64_t)(p->block_bytes / 2);   /* kvg_cu_kv_block_bytes, 2-byte units */
    return 0;
}
