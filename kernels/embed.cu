/* Embedding gather: x[r][:] = row tokens[r] of the table, converted to F32.
 * One block per row; the threads stride over the row's columns with the widest load the
 * row's alignment allows. A pure copy/conversion: a row's result is its table row. */
#include "kvg_device.cuh"

#define EMBED_THREADS 256

/* BF16 rows, 8 elements (one 16-byte load) per step: dim % 8 == 0, table 16-byte aligned. */
__global__ void __launch_bounds__(EMBED_THREADS)
embed_bf16_x8(const int4 *__restrict__ table, int dim, const int32_t *__restrict__ tokens,
              float4 *__restrict__ x)
{
    const int n8 = dim / 8;
    const int4 *src = table + (int64_t)tokens[blockIdx.x] * n8;
    float4 *dst = x + (int64_t)blockIdx.x * (dim / 4);
    for (int i = threadIdx.x; i < n8; i += blockDim.x) {
        int4 v = src[i];
        float2 a = kvg_bf16x2_word_to_f32((unsigned)v.x), b = kvg_bf16x2_word_to_f32((unsigned)v.y);
        float2 c = kvg_bf16x2_word_to_f32((unsigned)v.z), d = kvg_bf16x2_word_to_f32((unsigned)v.w);
        dst[2 * i] = make_float4(a.x, a.y, b.x, b.y);
        dst[2 * i + 1] = make_float4(c.x, c.y, d.x, d.y);
    }
}

__global__ void __launch_bounds__(EMBED_THREADS)
embed_bf16_x1(const __nv_bfloat16 *__restrict__ table, int dim,
              const int32_t *__restrict__ tokens, float *__restrict__ x)
{
    const __nv_bfloat16 *src = table + (int64_t)tokens[blockIdx.x] * dim;
    float *dst = x + (int64_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        dst[i] = kvg_load_bf16(src + i);
}

/* F16 rows, 2 elements per step: dim even, table 4-byte aligned. */
__global__ void __launch_bounds__(EMBED_THREADS)
embed_f16_x2(const __half2 *__restrict__ table, int dim, const int32_t *__restrict__ tokens,
             float2 *__restrict__ x)
{
    const int n2 = dim / 2;
    const __half2 *src = table + (int64_t)tokens[blockIdx.x] * n2;
    float2 *dst = x + (int64_t)blockIdx.x * n2;
    for (int i = threadIdx.x; i < n2; i += blockDim.x)
        dst[i] = __half22float2(src[i]);
}

__global__ void __launch_bounds__(EMBED_THREADS)
embed_f16_x1(const __half *__restrict__ table, int dim, const int32_t *__restrict__ tokens,
             float *__restrict__ x)
{
    const __half *src = table + (int64_t)tokens[blockIdx.x] * dim;
    float *dst = x + (int64_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        dst[i] = kvg_load_f16(src + i);
}

__global__ void __launch_bounds__(EMBED_THREADS)
embed_f32_x4(const float4 *__restrict__ table, int dim, const int32_t *__restrict__ tokens,
             float4 *__restrict__ x)
{
    const int n4 = dim / 4;
    const float4 *src = table + (int64_t)tokens[blockIdx.x] * n4;
    float4 *dst = x + (int64_t)blockIdx.x * n4;
    for (int i = threadIdx.x; i < n4; i += blockDim.x)
        dst[i] = src[i];
}

__global__ void __launch_bounds__(EMBED_THREADS)
embed_f32_x1(const float *__restrict__ table, int dim, const int32_t *__restrict__ tokens,
             float *__restrict__ x)
{
    const float *src = table + (int64_t)tokens[blockIdx.x] * dim;
    float *dst = x + (int64_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        dst[i] = src[i];
}

/* Threads for `steps` loads per row: a multiple of 32, at most EMBED_THREADS. */
static unsigned embed_threads(int steps)
{
    unsigned t = ((unsigned)steps + 31u) / 32u * 32u;
    return t < EMBED_THREADS ? t : EMBED_THREADS;
}

extern "C" cudaError_t kvg_k_embed(cudaStream_t s, const void *table, kvg_kt dt, int dim,
                                   const int32_t *tokens, int n_rows, float *x)
{
    if (n_rows <= 0 || dim <= 0)
        return cudaSuccess;
    if (!table || !tokens || !x)
        return cudaErrorInvalidValue;
    const dim3 grid((unsigned)n_rows);
    switch (dt) {
    case KVG_KT_BF16:
        if (dim % 8 == 0 && kvg_aligned(table, 16) && kvg_aligned(x, 16))
            KVG_LAUNCH(embed_bf16_x8, grid, dim3(embed_threads(dim / 8)), 0, s,
                       (const int4 *)table, dim, tokens, (float4 *)x);
        else
            KVG_LAUNCH(embed_bf16_x1, grid, dim3(embed_threads(dim)), 0, s,
                       (const __nv_bfloat16 *)table, dim, tokens, x);
        break;
    case KVG_KT_F16:
        if (dim % 2 == 0 && kvg_aligned(table, 4) && kvg_aligned(x, 8))
            KVG_LAUNCH(embed_f16_x2, grid, dim3(embed_threads(dim / 2)), 0, s,
                       (const __half2 *)table, dim, tokens, (float2 *)x);
        else
            KVG_LAUNCH(embed_f16_x1, grid, dim3(embed_threads(dim)), 0, s,
                       (const __half *)table, dim, tokens, x);
        break;
    case KVG_KT_F32:
        if (dim % 4 == 0 && kvg_aligned(table, 16) && kvg_aligned(x, 16))
            KVG_LAUNCH(embed_f32_x4, grid, dim3(embed_threads(dim / 4)), 0, s,
                       (const float4 *)table, dim, tokens, (float4 *)x);
        else
            KVG_LAUNCH(embed_f32_x1, grid, dim3(embed_threads(dim)), 0, s,
                       (const float *)table, dim, tokens, x);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return kvg_launch_result();
}
