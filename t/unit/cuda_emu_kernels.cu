/* Test kernels for the emulator's self-test (t/unit/cuda_emu.c): ordinary CUDA kernels,
 * compiled here as host C++ against kernels/emu/cuda_emu.h, each with a C launcher that
 * returns the launch's error (cudaGetLastError). */
#include "kvg_cuda_api.h"

#define LAUNCH(grid, block, smem, stream, call) \
    kvg_emu_launch(grid, block, smem, stream, [=]() { call; })

/* out[b] = sum of block b's blockDim.x elements: static shared memory, a tree of
 * __syncthreads-separated steps (blockDim.x a power of 2, <= 1024). */
__global__ void block_sum(const float *x, int n, float *out)
{
    __shared__ float red[1024];
    unsigned t = threadIdx.x;
    int i = (int)(blockIdx.x * blockDim.x + t);
    red[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s)
            red[t] += red[t + s];
        __syncthreads();
    }
    if (t == 0)
        out[blockIdx.x] = red[0];
}

/* Block b stores its slice in dynamic shared memory, then writes it back reversed.
 * first[b] = the first byte of the shared memory as thread 0 found it (before any write)
 * and aligned[b] = whether it was 16-byte aligned. */
__global__ void dyn_reverse(const float *x, float *out, int *aligned)
{
    float *sm = (float *)kvg_emu_dynamic_smem();
    unsigned t = threadIdx.x, base = blockIdx.x * blockDim.x;
    if (t == 0)
        aligned[blockIdx.x] = ((uintptr_t)sm & 15) == 0;
    sm[t] = x[base + t];
    __syncthreads();
    out[base + t] = sm[blockDim.x - 1 - t];
}

/* Per thread t of warp w (blocks of whole warps):
 *   fx[t] = xor-reduced float sum of the warp (every lane has it)
 *   fd[w] = down-reduced float sum (lane 0)
 *   ix[t], id[w] = the same for ints
 *   h16[t] = xor-reduced float sum over the thread's half-warp (width 16)
 *   idx[t] = lane 3's int; up[t] = the int of lane - 1 (lane 0: its own)
 *   ballot[w] = lanes with xi > 0; anyall[w] = any(xi > 0) + 2 * all(xi > 0)
 *   usum[w] = xor-reduced unsigned sum */
__global__ void warp_ops(const float *xf, const int *xi, float *fx, float *fd, int *ix, int *id,
                         float *h16, int *idx, int *up, unsigned *ballot, int *anyall,
                         unsigned *usum)
{
    unsigned t = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x & 31;
    unsigned w = t / 32;
    float f = xf[t], g = f, h = f;
    int v = xi[t], u = v;
    unsigned uv = (unsigned)v * 3u;
    for (int o = 16; o > 0; o >>= 1) {
        f += __shfl_xor_sync(0xffffffffu, f, o);
        v += __shfl_xor_sync(0xffffffffu, v, o);
        uv += __shfl_xor_sync(0xffffffffu, uv, o);
    }
    for (unsigned o = 16; o > 0; o >>= 1) {
        g += __shfl_down_sync(0xffffffffu, g, o);
        u += __shfl_down_sync(0xffffffffu, u, o);
    }
    for (int o = 8; o > 0; o >>= 1)
        h += __shfl_xor_sync(0xffffffffu, h, o, 16);
    fx[t] = f;
    ix[t] = v;
    h16[t] = h;
    if (lane == 0) {
        fd[w] = g;
        id[w] = u;
        usum[w] = uv;
    }
    idx[t] = __shfl_sync(0xffffffffu, xi[t], 3);
    up[t] = __shfl_up_sync(0xffffffffu, xi[t], 1);
    unsigned b = __ballot_sync(0xffffffffu, xi[t] > 0);
    int any = __any_sync(0xffffffffu, xi[t] > 0), all = __all_sync(0xffffffffu, xi[t] > 0);
    __syncwarp();
    if (lane == 0) {
        ballot[w] = b;
        anyall[w] = any + 2 * all;
    }
}

/* Every thread of every block: counters, sums, max/min, a CAS-claimed slot, exchanges. */
__global__ void atomics(int *count, float *fsum, unsigned long long *usum, unsigned *ucount,
                        int *mx, int *mn, int *claimed, int *exch, int *won, int *olds)
{
    int gid = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    atomicAdd(count, 1);
    atomicAdd(fsum, 0.5f);
    atomicAdd(usum, (unsigned long long)gid);
    atomicAdd(ucount, 2u);
    atomicMax(mx, gid);
    atomicMin(mn, -gid);
    won[gid] = atomicCAS(claimed, -1, gid) == -1;   /* only the first thread finds -1 */
    olds[gid] = atomicExch(exch, gid);
}

/* Writes, for each thread of a 3-D grid of 3-D blocks, its indices and the launch's
 * dimensions at its linear position. */
__global__ void indices(unsigned *out)
{
    unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    unsigned block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    unsigned thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    unsigned *o = out + (size_t)(block * threads + thread) * 12;
    o[0] = blockIdx.x; o[1] = blockIdx.y; o[2] = blockIdx.z;
    o[3] = threadIdx.x; o[4] = threadIdx.y; o[5] = threadIdx.z;
    o[6] = gridDim.x; o[7] = gridDim.y; o[8] = gridDim.z;
    o[9] = blockDim.x; o[10] = blockDim.y; o[11] = blockDim.z;
}

__global__ void nothing(int *p)
{
    if (p && threadIdx.x + blockIdx.x + threadIdx.y + blockIdx.y + threadIdx.z + blockIdx.z == 0)
        *p = 1;
}

/* Conversions: to bits and back, with the pair helpers. */
__global__ void convert(const float *in, int n, unsigned short *bf, unsigned short *hf,
                        float *bf_back, float *hf_back)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n)
        return;
    __nv_bfloat16 b = __float2bfloat16(in[i]);
    __half h = __float2half(in[i]);
    bf[i] = __bfloat16_as_ushort(b);
    hf[i] = __half_as_ushort(h);
    float2 pb = __bfloat1622float2(__floats2bfloat162_rn(in[i], in[i]));
    float2 ph = __half22float2(__halves2half2(__float2half_rn(in[i]), h));
    /* the pair helpers' results, for the test to compare with the single conversions */
    bf_back[i] = pb.y;
    hf_back[i] = ph.y;
}

__global__ void from_bits(const unsigned short *in, int n, float *bf, float *hf)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n)
        return;
    bf[i] = __bfloat162float(__ushort_as_bfloat16(in[i]));
    hf[i] = __half2float(__ushort_as_half(in[i]));
}

/* Threads past `live` exit first; the rest meet at __syncthreads twice (an exited thread
 * does not count). out[t] = what thread t's neighbour wrote. */
__global__ void partial_exit(int live, int *out)
{
    __shared__ int v[1024];
    unsigned t = threadIdx.x;
    if ((int)t >= live)
        return;
    v[t] = (int)t * 10;
    __syncthreads();
    int got = v[(t + 1) % (unsigned)live];
    __syncthreads();
    out[t] = got;
}

/* A block of 48 threads (warp 1 is partial) whose threads >= 44 exit: votes with the full
 * mask count only the live lanes; a width-4 shuffle stays among live lanes.
 * out[t] = ballot | all << 31 for lane 0 of each warp, else the quad's sum of t. */
__global__ void partial_warp(unsigned *out)
{
    unsigned t = threadIdx.x;
    if (t >= 44)
        return;
    unsigned b = __ballot_sync(0xffffffffu, t & 1);
    int all = __all_sync(0xffffffffu, t < 44);
    unsigned v = t;
    v += __shfl_xor_sync(0xffffffffu, v, 1, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 2, 4);
    out[t] = (t & 31) == 0 ? (b & 0x7fffffffu) | (unsigned)all << 31 : v;
}

/* Bugs the emulator must catch: */
__global__ void divergent_sync(void)
{
    if (threadIdx.x < 16) {
        __syncthreads();
    } else {
        __syncthreads();
    }
}

__global__ void deadlock(void)
{
    if (threadIdx.x < 16)
        __syncthreads();
    else
        __syncwarp();
}

__global__ void shfl_exited_lane(float *out)
{
    if (threadIdx.x == 5)
        return;
    float v = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    out[threadIdx.x] = v;
}

/* The switch-rate figure: `iters` block barriers per thread. */
__global__ void sync_loop(int iters, int *out)
{
    int acc = 0;
    for (int i = 0; i < iters; i++) {
        acc += (int)threadIdx.x;
        __syncthreads();
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

extern "C" {

cudaError_t emu_t_block_sum(const float *x, int n, int threads, float *out);
cudaError_t emu_t_dyn_reverse(const float *x, int blocks, int threads, float *out, int *aligned);
cudaError_t emu_t_warp_ops(int warps, const float *xf, const int *xi, float *fx, float *fd,
                           int *ix, int *id, float *h16, int *idx, int *up, unsigned *ballot,
                           int *anyall, unsigned *usum);
cudaError_t emu_t_atomics(int blocks, int threads, int *count, float *fsum,
                          unsigned long long *usum, unsigned *ucount, int *mx, int *mn,
                          int *claimed, int *exch, int *won, int *olds);
cudaError_t emu_t_indices(const unsigned g[3], const unsigned b[3], unsigned *out);
cudaError_t emu_t_config(const unsigned g[3], const unsigned b[3], size_t smem,
                         cudaStream_t s, int *flag);
cudaError_t emu_t_convert(const float *in, int n, unsigned short *bf, unsigned short *hf,
                          float *bf_back, float *hf_back);
cudaError_t emu_t_from_bits(const unsigned short *in, int n, float *bf, float *hf);
cudaError_t emu_t_partial_exit(int threads, int live, int *out);
void emu_t_divergent_sync(void);
void emu_t_deadlock(void);
cudaError_t emu_t_partial_warp(unsigned *out);
void emu_t_shfl_exited_lane(float *out);
cudaError_t emu_t_sync_loop(int blocks, int threads, int iters, int *out);

cudaError_t emu_t_block_sum(const float *x, int n, int threads, float *out)
{
    LAUNCH(dim3((unsigned)((n + threads - 1) / threads)), dim3((unsigned)threads), 0, 0,
           block_sum(x, n, out));
    return cudaGetLastError();
}

cudaError_t emu_t_dyn_reverse(const float *x, int blocks, int threads, float *out, int *aligned)
{
    LAUNCH(dim3((unsigned)blocks), dim3((unsigned)threads), (size_t)threads * sizeof(float), 0,
           dyn_reverse(x, out, aligned));
    return cudaGetLastError();
}

cudaError_t emu_t_warp_ops(int warps, const float *xf, const int *xi, float *fx, float *fd,
                           int *ix, int *id, float *h16, int *idx, int *up, unsigned *ballot,
                           int *anyall, unsigned *usum)
{
    /* two blocks of warps/2 warps each, so lanes are numbered per block */
    LAUNCH(dim3(2), dim3((unsigned)(warps / 2 * 32)), 0, 0,
           warp_ops(xf, xi, fx, fd, ix, id, h16, idx, up, ballot, anyall, usum));
    return cudaGetLastError();
}

cudaError_t emu_t_atomics(int blocks, int threads, int *count, float *fsum,
                          unsigned long long *usum, unsigned *ucount, int *mx, int *mn,
                          int *claimed, int *exch, int *won, int *olds)
{
    LAUNCH(dim3((unsigned)blocks), dim3((unsigned)threads), 0, 0,
           atomics(count, fsum, usum, ucount, mx, mn, claimed, exch, won, olds));
    return cudaGetLastError();
}

cudaError_t emu_t_indices(const unsigned g[3], const unsigned b[3], unsigned *out)
{
    LAUNCH(dim3(g[0], g[1], g[2]), dim3(b[0], b[1], b[2]), 0, 0, indices(out));
    return cudaGetLastError();
}

cudaError_t emu_t_config(const unsigned g[3], const unsigned b[3], size_t smem,
                         cudaStream_t s, int *flag)
{
    LAUNCH(dim3(g[0], g[1], g[2]), dim3(b[0], b[1], b[2]), smem, s, nothing(flag));
    return cudaGetLastError();
}

cudaError_t emu_t_convert(const float *in, int n, unsigned short *bf, unsigned short *hf,
                          float *bf_back, float *hf_back)
{
    LAUNCH(dim3((unsigned)(n + 255) / 256), dim3(256), 0, 0,
           convert(in, n, bf, hf, bf_back, hf_back));
    return cudaGetLastError();
}

cudaError_t emu_t_from_bits(const unsigned short *in, int n, float *bf, float *hf)
{
    LAUNCH(dim3((unsigned)(n + 255) / 256), dim3(256), 0, 0, from_bits(in, n, bf, hf));
    return cudaGetLastError();
}

cudaError_t emu_t_partial_exit(int threads, int live, int *out)
{
    LAUNCH(dim3(1), dim3((unsigned)threads), 0, 0, partial_exit(live, out));
    return cudaGetLastError();
}

cudaError_t emu_t_partial_warp(unsigned *out)
{
    LAUNCH(dim3(1), dim3(48), 0, 0, partial_warp(out));
    return cudaGetLastError();
}

void emu_t_divergent_sync(void)
{
    LAUNCH(dim3(1), dim3(32), 0, 0, divergent_sync());
}

void emu_t_deadlock(void)
{
    LAUNCH(dim3(1), dim3(32), 0, 0, deadlock());
}

void emu_t_shfl_exited_lane(float *out)
{
    LAUNCH(dim3(1), dim3(32), 0, 0, shfl_exited_lane(out));
}

cudaError_t emu_t_sync_loop(int blocks, int threads, int iters, int *out)
{
    LAUNCH(dim3((unsigned)blocks), dim3((unsigned)threads), 0, 0, sync_loop(iters, out));
    return cudaGetLastError();
}

}  // extern "C"
