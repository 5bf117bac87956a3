/* Device-side helpers shared by the kernels/ .cu files: the launch and dynamic-shared-memory macros
 * (real CUDA or the host emulation of kernels/emu/), BF16/F16 loads and stores, and warp /
 * block reductions whose tree is FIXED: the result of a reduction depends only on the
 * values reduced and the block size, never on timing, on the launch's other blocks or on
 * which warp finishes first (that is what keeps rmsnorm batch-invariant).
 *
 * Only the device surface listed in the design (kernels/emu/cuda_emu.h) is used here, so the
 * same source runs on a GPU and, compiled as host C++ with KVG_CUDA_EMU, on the emulator. */
#ifndef KVG_DEVICE_CUH
#define KVG_DEVICE_CUH

#include <stddef.h>
#include <stdint.h>

#ifndef KVG_CUDA_EMU
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "kvg_kernels.h"

#define KVG_WARP 32

/* `#pragma unroll` for nvcc; g++ (the emulated build) spells it differently and warns on
 * the CUDA spelling. */
#ifdef KVG_CUDA_EMU
#define KVG_UNROLL _Pragma("GCC unroll 16")
#else
#define KVG_UNROLL _Pragma("unroll")
#endif
#define KVG_FULL_MASK 0xffffffffu

/* KVG_LAUNCH(kernel, grid, block, smem, stream, args...) enqueues `kernel` (a plain
 * identifier: a template instance goes through a local function pointer, since a comma in
 * <...> would split the macro's arguments). Emulated, the arguments are evaluated and
 * copied at the call and the launch is queued on the stream, as on a GPU.
 * KVG_DYNAMIC_SMEM(type, name) declares `type *name` pointing at the block's dynamic
 * shared memory (16-byte aligned in both builds). */
#ifdef KVG_CUDA_EMU
#define KVG_LAUNCH(kernel, grid, block, smem, stream, ...)                                   \
    kvg_emu_launch_kernel(#kernel, __func__, (grid), (block), (size_t)(smem), (stream), kernel,    \
                          __VA_ARGS__)
#define KVG_DYNAMIC_SMEM(type, name) type *name = (type *)kvg_emu_dynamic_smem()
#else
#define KVG_LAUNCH(kernel, grid, block, smem, stream, ...)                                   \
    kernel<<<(grid), (block), (size_t)(smem), (stream)>>>(__VA_ARGS__)
/* float4 storage gives the 16-byte alignment without __align__ (not in the emulated
 * surface). */
#define KVG_DYNAMIC_SMEM(type, name)                                                         \
    extern __shared__ float4 kvg_dyn_smem_[];                                                \
    type *name = (type *)kvg_dyn_smem_
#endif

/* The launcher's return: the launch error (sticky or not) of what was just enqueued. */
static inline cudaError_t kvg_launch_result(void)
{
    return cudaGetLastError();
}

/* Blocks for a grid-stride loop over n work items with `threads` threads per block:
 * enough to cover n once, capped so a huge n does not make millions of tiny blocks (the
 * loop then strides). The cap never changes a result: every item is computed alone. */
static inline unsigned kvg_grid_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    const size_t cap = 132u * 16u;          /* 16 blocks per SM of an H100/H200 */
    if (b < 1)
        b = 1;
    return (unsigned)(b < cap ? b : cap);
}

static inline int kvg_aligned(const void *p, size_t a)
{
    return ((uintptr_t)p & (a - 1)) == 0;
}

/* ---- element conversions ------------------------------------------------------------ */

/* BF16 bits to float: exact (BF16 is the top half of an F32). */
__device__ __forceinline__ float kvg_bf16_bits_to_f32(unsigned bits16)
{
    return __uint_as_float(bits16 << 16);
}

/* The two BF16 of one 32-bit word (element 2i in the low half: little-endian). */
__device__ __forceinline__ float2 kvg_bf16x2_word_to_f32(unsigned w)
{
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

__device__ __forceinline__ float kvg_load_bf16(const __nv_bfloat16 *p)
{
    return __bfloat162float(*p);
}

__device__ __forceinline__ float kvg_load_f16(const __half *p)
{
    return __half2float(*p);
}

/* ---- a GEMM's input written beside an F32 output ---------------------------------- */

/* A kernel whose F32 output is a GEMM's input (rmsnorm before q/k/v, gate/up and the
 * classifier; SwiGLU/GeGLU before w_down) can write, in the same pass, the copy the GEMM
 * reads: each output value rounded to nearest even to BF16 or F16, the bits kvg_k_to_lowp
 * would give for the stored float (engine/cuda/cuda_gemm.c then skips its own rounding).
 * A template parameter of the kernel: kvg_lp_none writes nothing. one(p, i, a) stores
 * element i; two(p, i, a, b) elements i and i + 1 as one 32-bit store (i even, p 4-byte
 * aligned). */
struct kvg_lp_none {
    __device__ static void one(void *, size_t, float) {}
    __device__ static void two(void *, size_t, float, float) {}
};

struct kvg_lp_bf16 {
    __device__ static void one(void *p, size_t i, float a)
    {
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(a);
    }
    __device__ static void two(void *p, size_t i, float a, float b)
    {
        ((__nv_bfloat162 *)p)[i / 2] = __floats2bfloat162_rn(a, b);
    }
};

struct kvg_lp_f16 {
    __device__ static void one(void *p, size_t i, float a)
    {
        ((__half *)p)[i] = __float2half_rn(a);
    }
    __device__ static void two(void *p, size_t i, float a, float b)
    {
        ((__half2 *)p)[i / 2] = __halves2half2(__float2half_rn(a), __float2half_rn(b));
    }
};

/* ---- reductions with a fixed tree --------------------------------------------------- */

/* Butterfly (xor) sum over the 32 lanes: offsets 16, 8, 4, 2, 1. Every lane ends with the
 * same bits (a + b == b + a exactly), and the tree is the same for every call. All 32
 * lanes must call it. */
__device__ __forceinline__ float kvg_warp_sum(float v)
{
KVG_UNROLL
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(KVG_FULL_MASK, v, o, KVG_WARP);
    return v;
}

/* Max is exact in any order; the butterfly just gives every lane the result. */
__device__ __forceinline__ float kvg_warp_max(float v)
{
KVG_UNROLL
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(KVG_FULL_MASK, v, o, KVG_WARP));
    return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32, at most 1024): each warp reduces
 * its lanes with kvg_warp_sum, warp w's total goes to red[w], then warp 0 reduces red[0..31]
 * (missing warps read as 0.0f, and x + 0.0f == x) with the same butterfly. The tree depends
 * only on blockDim.x. Every thread of the block must call it; all get the result. `red` is
 * 33 floats of shared memory (32 warp totals + the result); it may be reused after the call returns. */
__device__ __forceinline__ float kvg_block_sum(float v, float *red)
{
    const int lane = threadIdx.x % KVG_WARP, warp = threadIdx.x / KVG_WARP;
    const int n_warps = blockDim.x / KVG_WARP;

    v = kvg_warp_sum(v);
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < n_warps ? red[lane] : 0.0f;
        t = kvg_warp_sum(t);
        if (lane == 0)
            red[KVG_WARP] = t;
    }
    __syncthreads();
    v = red[KVG_WARP];
    __syncthreads();            /* red may be rewritten by the caller's next reduction */
    return v;
}

#endif
