/* Kernels with planted bugs, and their correct twins, for the strict emulator's test
 * (t/unit/cuda_emu_strict.c). Each bug is one a GPU has and the old emulator (threads in
 * index order, blocks in order, no access checks) did not see. */
#include "kvg_cuda_api.h"

#define LAUNCH(grid, block, smem, stream, call) \
    kvg_emu_launch(grid, block, smem, stream, [=]() { call; })

/* out[t] = x[t] + x[t-1] through shared memory. The bug: no __syncthreads between the
 * writes and the reads, so thread t may read s[t-1] before thread t-1 wrote it. */
__global__ void neighbour_sum(const float *x, float *out, int with_barrier)
{
    __shared__ float s[256];
    unsigned t = threadIdx.x;
    s[t] = x[t];
    if (with_barrier)
        __syncthreads();
    out[t] = s[t] + (t ? s[t - 1] : 0.0f);
}

/* Lanes of one warp exchanging through shared memory, ordered by __syncwarp: correct
 * without a block barrier (the race detector must not report it). */
__global__ void warp_exchange(const float *x, float *out)
{
    __shared__ float s[64];
    unsigned t = threadIdx.x, lane = t % 32, base = t - lane;
    s[t] = x[t];
    __syncwarp();
    out[t] = s[base + (lane + 1) % 32];
}

/* Block b adds block b-1's result: a cross-block read within one launch (blocks are not
 * ordered). */
__global__ void chain_blocks(float *out)
{
    unsigned b = blockIdx.x;
    if (threadIdx.x == 0)
        out[b] = (float)b + (b ? out[b - 1] : 0.0f);
}

/* Dereferences whatever it is given: a host pointer is the bug. */
__global__ void read_pointer(const float *p, float *out)
{
    out[threadIdx.x] = p[threadIdx.x];
}

/* Reads static shared memory no thread of the block wrote. */
__global__ void read_unwritten_shared(float *out)
{
    __shared__ float s[32];
    if (threadIdx.x == 0)
        s[1] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}

/* out[i] = v for i < n. */
__global__ void fill(float *out, int n, float v)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n)
        out[i] = v;
}

extern "C" {

cudaError_t strict_t_neighbour_sum(const float *x, float *out, int n, int with_barrier)
{
    LAUNCH(dim3(1), dim3((unsigned)n), 0, 0, neighbour_sum(x, out, with_barrier));
    return cudaGetLastError();
}

cudaError_t strict_t_warp_exchange(const float *x, float *out)
{
    LAUNCH(dim3(1), dim3(64), 0, 0, warp_exchange(x, out));
    return cudaGetLastError();
}

cudaError_t strict_t_chain_blocks(float *out, int blocks)
{
    LAUNCH(dim3((unsigned)blocks), dim3(32), 0, 0, chain_blocks(out));
    return cudaGetLastError();
}

cudaError_t strict_t_read_pointer(const float *p, float *out)
{
    LAUNCH(dim3(1), dim3(32), 0, 0, read_pointer(p, out));
    return cudaGetLastError();
}

cudaError_t strict_t_read_unwritten_shared(float *out)
{
    LAUNCH(dim3(1), dim3(32), 0, 0, read_unwritten_shared(out));
    return cudaGetLastError();
}

cudaError_t strict_t_fill(float *out, int n, float v, cudaStream_t s)
{
    LAUNCH(dim3((unsigned)(n + 127) / 128), dim3(128), 0, s, fill(out, n, v));
    return cudaGetLastError();
}

}  // extern "C"
