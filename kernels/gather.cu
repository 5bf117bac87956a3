/* out[i][:] = x[rows[i]][:]: the rows that need logits. One block per output row, threads
 * striding over the row (float4 when width % 4 == 0 and both buffers are 16-byte
 * aligned). A copy: a row's result is its source row. */
#include "kvg_device.cuh"

#define GATHER_THREADS 256

__global__ void __launch_bounds__(GATHER_THREADS)
gather_x4(const float4 *__restrict__ x, int width4, const int32_t *__restrict__ rows,
          float4 *__restrict__ out)
{
    const float4 *src = x + (int64_t)rows[blockIdx.x] * width4;
    float4 *dst = out + (int64_t)blockIdx.x * width4;
    for (int i = threadIdx.x; i < width4; i += blockDim.x)
        dst[i] = src[i];
}

__global__ void __launch_bounds__(GATHER_THREADS)
gather_x1(const float *__restrict__ x, int width, const int32_t *__restrict__ rows,
          float *__restrict__ out)
{
    const float *src = x + (int64_t)rows[blockIdx.x] * width;
    float *dst = out + (int64_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        dst[i] = src[i];
}

extern "C" cudaError_t kvg_k_gather_rows(cudaStream_t s, const float *x, int width,
                                         const int32_t *rows, int n, float *out)
{
    if (n <= 0 || width <= 0)
        return cudaSuccess;
    if (!x || !rows || !out)
        return cudaErrorInvalidValue;
    const int vec = width % 4 == 0 && kvg_aligned(x, 16) && kvg_aligned(out, 16);
    const int steps = vec ? width / 4 : width;
    unsigned threads = ((unsigned)steps + 31u) / 32u * 32u;
    if (threads > GATHER_THREADS)
        threads = GATHER_THREADS;
    if (vec)
        KVG_LAUNCH(gather_x4, dim3((unsigned)n), dim3(threads), 0, s, (const float4 *)x,
                   width / 4, rows, (float4 *)out);
    else
        KVG_LAUNCH(gather_x1, dim3((unsigned)n), dim3(threads), 0, s, x, width, rows, out);
    return kvg_launch_result();
}
