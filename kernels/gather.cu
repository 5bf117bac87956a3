/* Copies of rows. gather_rows: out[i][:] = x[rows[i]][:], the rows that need logits, one
 * block per output row, threads striding over the row (float4 when width % 4 == 0 and both
 * buffers are 16-byte aligned). split_cols: a fused GEMM's [rows][sum of cols] output into
 * its products' buffers, one block per (row, product). A copy: a row's result is its
 * source row. */
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

/* ---- split_cols ---------------------------------------------------------------------- */

/* Block (row, part): the part's columns of the row, threads striding over them (float4
 * groups when every width is a multiple of 4 and the buffers are 16-byte aligned). */
template <typename T>
__global__ void __launch_bounds__(GATHER_THREADS)
split_cols(const T *__restrict__ x, int width, kvg_k_split o)
{
    const int p = blockIdx.y, cols = o.cols[p];
    int c0 = 0;
    for (int i = 0; i < p; i++)
        c0 += o.cols[i];
    const T *src = x + (int64_t)blockIdx.x * width + c0;
    T *dst = (T *)o.out[p] + (int64_t)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        dst[i] = src[i];
}

extern "C" cudaError_t kvg_k_split_cols(cudaStream_t s, const float *x, int rows, const kvg_k_split *o)
{
    int width = 0, vec, widest = 0;
    if (!o || o->n < 1 || o->n > KVG_K_SPLIT_MAX)
        return cudaErrorInvalidValue;
    if (rows <= 0)
        return cudaSuccess;
    vec = kvg_aligned(x, 16);
    for (int i = 0; i < o->n; i++) {
        if (!o->out[i] || o->cols[i] <= 0)
            return cudaErrorInvalidValue;
        width += o->cols[i];
        widest = o->cols[i] > widest ? o->cols[i] : widest;
        vec &= o->cols[i] % 4 == 0 && kvg_aligned(o->out[i], 16);
    }
    if (!x)
        return cudaErrorInvalidValue;
    kvg_k_split v = *o;
    if (vec)
        for (int i = 0; i < v.n; i++)
            v.cols[i] /= 4;
    const int steps = vec ? widest / 4 : widest;
    unsigned threads = ((unsigned)steps + 31u) / 32u * 32u;
    if (threads > GATHER_THREADS)
        threads = GATHER_THREADS;
    if (vec)
        KVG_LAUNCH(split_cols<float4>, dim3((unsigned)rows, (unsigned)v.n), dim3(threads), 0, s,
                   (const float4 *)x, width / 4, v);
    else
        KVG_LAUNCH(split_cols<float>, dim3((unsigned)rows, (unsigned)v.n), dim3(threads), 0, s, x, width, v);
    return kvg_launch_result();
}
