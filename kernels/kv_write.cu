/* The KV pool's writers: kv_write stores the step's K and V rows (F32 -> BF16,
 * round-to-nearest-even, or int8 with a scale per (row, kv head) on an int8 layer) at
 * their slots; copy_blocks is the copy-on-write block copy.
 * Layout of the pool: kvg_kernels.h (kvg_k_kv_geom). */
#include "kvg_device.cuh"
#include "kv_write_row.cuh"

#define KVW_THREADS 256
#define COPY_THREADS 256
#define COPY_VECS_PER_THREAD 8       /* 16-byte vectors per thread: 32 KiB per block */

/* One block per row (kv_write_row.cuh). */
__global__ void __launch_bounds__(KVW_THREADS)
kv_write_kernel(void *__restrict__ pool, kvg_k_kv_geom g, int layer,
                const float2 *__restrict__ k, const float2 *__restrict__ v,
                const int32_t *__restrict__ row_slot)
{
    kvg_kv_write_row_any(pool, g, layer, k, v, row_slot, (int)blockIdx.x);
}

extern "C" cudaError_t kvg_k_kv_write(cudaStream_t s, void *pool, const kvg_k_kv_geom *g,
                                      int layer, const float *k, const float *v,
                                      const int32_t *row_slot, int n_rows)
{
    if (n_rows <= 0)
        return cudaSuccess;
    if (!pool || !g || !k || !v || !row_slot || g->head_dim <= 0 || g->head_dim % 2 ||
        g->block_tokens <= 0 || layer < 0 || layer >= g->n_layers || g->n_kv_heads <= 0 ||
        (kvg_k_layer_int8(g, layer) && g->head_dim % 4))
        return cudaErrorInvalidValue;
    if (!kvg_aligned(pool, 4) || !kvg_aligned(k, 8) || !kvg_aligned(v, 8))
        return cudaErrorInvalidValue;
    /* BF16: a thread per element pair; int8: a warp per kv head */
    const int n_pairs = kvg_k_layer_int8(g, layer) ? g->n_kv_heads * KVG_WARP : g->n_kv_heads * (g->head_dim / 2);
    unsigned threads = ((unsigned)n_pairs + 31u) / 32u * 32u;
    if (threads > KVW_THREADS)
        threads = KVW_THREADS;
    KVG_LAUNCH(kv_write_kernel, dim3((unsigned)n_rows), dim3(threads), 0, s,
               pool, *g, layer, (const float2 *)k, (const float2 *)v, row_slot);
    return kvg_launch_result();
}

/* grid (pair, chunk): block (i, c) copies chunk c of block pairs[2i+1] to pairs[2i]. A
 * chunk is COPY_THREADS * COPY_VECS_PER_THREAD 16-byte vectors (coalesced: consecutive
 * threads, consecutive vectors). */
__global__ void __launch_bounds__(COPY_THREADS)
copy_blocks_x16(int4 *__restrict__ pool, int64_t block_vecs, int32_t n_blocks,
                const int32_t *__restrict__ pairs)
{
    const int32_t dst = pairs[2 * blockIdx.x], src = pairs[2 * blockIdx.x + 1];
    if (dst == src || dst < 0 || src < 0 || dst >= n_blocks || src >= n_blocks)
        return;
    const int64_t c0 = (int64_t)blockIdx.y * COPY_THREADS * COPY_VECS_PER_THREAD;
    const int4 *from = pool + (int64_t)src * block_vecs;
    int4 *to = pool + (int64_t)dst * block_vecs;
KVG_UNROLL
    for (int j = 0; j < COPY_VECS_PER_THREAD; j++) {
        const int64_t i = c0 + (int64_t)j * COPY_THREADS + threadIdx.x;
        if (i < block_vecs)
            to[i] = from[i];
    }
}

/* Fallback for a block size that is not a multiple of 16 bytes: 2-byte elements. */
__global__ void __launch_bounds__(COPY_THREADS)
copy_blocks_x2(uint16_t *__restrict__ pool, int64_t block_elems, int32_t n_blocks,
               const int32_t *__restrict__ pairs)
{
    const int32_t dst = pairs[2 * blockIdx.x], src = pairs[2 * blockIdx.x + 1];
    if (dst == src || dst < 0 || src < 0 || dst >= n_blocks || src >= n_blocks)
        return;
    const int64_t c0 = (int64_t)blockIdx.y * COPY_THREADS * COPY_VECS_PER_THREAD;
    const uint16_t *from = pool + (int64_t)src * block_elems;
    uint16_t *to = pool + (int64_t)dst * block_elems;
    for (int j = 0; j < COPY_VECS_PER_THREAD; j++) {
        const int64_t i = c0 + (int64_t)j * COPY_THREADS + threadIdx.x;
        if (i < block_elems)
            to[i] = from[i];
    }
}

extern "C" cudaError_t kvg_k_copy_blocks(cudaStream_t s, void *pool, const kvg_k_kv_geom *g,
                                         const int32_t *pairs, int n)
{
    if (n <= 0)
        return cudaSuccess;
    if (!pool || !g || !pairs || g->block_elems <= 0)
        return cudaErrorInvalidValue;
    const int64_t per_chunk = (int64_t)COPY_THREADS * COPY_VECS_PER_THREAD;
    const int vec = g->block_elems % 8 == 0 && kvg_aligned(pool, 16);
    const int64_t units = vec ? g->block_elems / 8 : g->block_elems;
    const int64_t chunks = (units + per_chunk - 1) / per_chunk;
    if (chunks > 65535)
        return cudaErrorInvalidValue;     /* a block of more than 2 GiB (16-byte path) */
    const dim3 grid((unsigned)n, (unsigned)chunks);
    if (vec)
        KVG_LAUNCH(copy_blocks_x16, grid, dim3(COPY_THREADS), 0, s, (int4 *)pool, units,
                   g->n_blocks, pairs);
    else
        KVG_LAUNCH(copy_blocks_x2, grid, dim3(COPY_THREADS), 0, s, (uint16_t *)pool, units,
                   g->n_blocks, pairs);
    return kvg_launch_result();
}
