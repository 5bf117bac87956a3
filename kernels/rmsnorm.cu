/* RMSNorm: out[r] = w * (x[r] * 1 / sqrt(mean(x[r]^2) + eps)), the CPU backend's arithmetic
 * (ss / dim, + eps, 1 / sqrtf, w * (inv * x)).
 *
 * One block per row; the block size depends only on dim. Thread t accumulates, in index
 * order, the squares of the elements (or float4 groups) t, t + blockDim.x, ...; the block
 * then sums the per-thread values with kvg_block_sum's fixed tree. So the sum of squares
 * of a row is the same bits whatever the number of rows in the launch.
 *
 * In place (out == x) is allowed (the q/k norms and post-norms norm their buffer in
 * place): each thread writes only elements it has read, after the block's reduction, and
 * no thread reads another's; so x and out are not __restrict__.
 *
 * kvg_k_rmsnorm_lowp also writes each output value rounded to BF16/F16 into `lowp` (the
 * next GEMM's input, kvg_device.cuh's kvg_lp_*): the value is rounded after it is computed,
 * the F32 output and its arithmetic are the same bits, and which variant (x4, x1) runs does
 * not depend on lowp.
 *
 * kvg_k_add_rmsnorm first adds the residual (ADD): each thread, in its first loop, stores
 * x + y (one rounded add, kvg_k_add's) over its own elements of x and squares that; the second
 * loop reads back only what the same thread stored. The norm then sees exactly the x that
 * kvg_k_add followed by kvg_k_rmsnorm would, through the same variant and tree. out may be y
 * (each y element is read by the thread that later writes that out element). */
#include "kvg_device.cuh"

#define NORM_THREADS 256

/* dim % 4 == 0 and x, w, out (and y with ADD) 16-byte aligned (activation rows from
 * cudaMalloc are). */
template <class LP, bool ADD>
__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_x4(float4 *x, const float4 *y, const float4 *__restrict__ w, float eps, int dim,
           float4 *out, void *__restrict__ lowp)
{
    __shared__ float red[KVG_WARP + 1];
    const int n4 = dim / 4;
    float4 *xr = x + (int64_t)blockIdx.x * n4;
    float4 *o = out + (int64_t)blockIdx.x * n4;
    float ss = 0.0f;

    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
        float4 v = xr[i];
        if (ADD) {
            const float4 b = y[(int64_t)blockIdx.x * n4 + i];
            v.x += b.x;
            v.y += b.y;
            v.z += b.z;
            v.w += b.w;
            xr[i] = v;
        }
        ss += v.x * v.x;
        ss += v.y * v.y;
        ss += v.z * v.z;
        ss += v.w * v.w;
    }
    ss = kvg_block_sum(ss, red);
    ss /= (float)dim;
    ss += eps;
    const float inv = 1.0f / sqrtf(ss);
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
        float4 v = xr[i], g = w[i];
        const float4 r = make_float4(g.x * (inv * v.x), g.y * (inv * v.y), g.z * (inv * v.z),
                                     g.w * (inv * v.w));
        const size_t e = (size_t)blockIdx.x * dim + 4 * (size_t)i;
        o[i] = r;
        LP::two(lowp, e, r.x, r.y);
        LP::two(lowp, e + 2, r.z, r.w);
    }
}

template <class LP, bool ADD>
__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_x1(float *x, const float *y, const float *__restrict__ w, float eps, int dim, float *out,
           void *__restrict__ lowp)
{
    __shared__ float red[KVG_WARP + 1];
    float *xr = x + (int64_t)blockIdx.x * dim;
    float *o = out + (int64_t)blockIdx.x * dim;
    float ss = 0.0f;

    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        if (ADD)
            xr[i] += y[(int64_t)blockIdx.x * dim + i];
        ss += xr[i] * xr[i];
    }
    ss = kvg_block_sum(ss, red);
    ss /= (float)dim;
    ss += eps;
    const float inv = 1.0f / sqrtf(ss);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float r = w[i] * (inv * xr[i]);
        o[i] = r;
        LP::one(lowp, (size_t)blockIdx.x * dim + i, r);
    }
}

template <class LP, bool ADD>
static void rmsnorm_launch(cudaStream_t s, int vec, unsigned threads, float *x, const float *y,
                           const float *w, float eps, int rows, int dim, float *out, void *lowp)
{
    if (vec) {
        void (*k)(float4 *, const float4 *, const float4 *, float, int, float4 *, void *) =
            rmsnorm_x4<LP, ADD>;
        KVG_LAUNCH(k, dim3((unsigned)rows), dim3(threads), 0, s, (float4 *)x, (const float4 *)y,
                   (const float4 *)w, eps, dim, (float4 *)out, lowp);
    } else {
        void (*k)(float *, const float *, const float *, float, int, float *, void *) =
            rmsnorm_x1<LP, ADD>;
        KVG_LAUNCH(k, dim3((unsigned)rows), dim3(threads), 0, s, x, y, w, eps, dim, out, lowp);
    }
}

/* y NULL: the norm alone (x is only read). */
static cudaError_t norm(cudaStream_t s, float *x, const float *y, const float *w, float eps,
                        int rows, int dim, float *out, kvg_kt dt, void *lowp)
{
    if (lowp && ((dt != KVG_KT_BF16 && dt != KVG_KT_F16) || !kvg_aligned(lowp, 4)))
        return cudaErrorInvalidValue;
    if (rows <= 0 || dim <= 0)
        return cudaSuccess;
    if (!x || !w || !out)
        return cudaErrorInvalidValue;
    /* A function of dim and x, w, out's alignment alone, never of rows, y or lowp: the
     * fused add and the copy run the variant the plain norm would. */
    const int vec = dim % 4 == 0 && kvg_aligned(x, 16) && kvg_aligned(w, 16) &&
                    kvg_aligned(out, 16);
    const int steps = vec ? dim / 4 : dim;
    unsigned threads = ((unsigned)steps + 31u) / 32u * 32u;
    if (threads > NORM_THREADS)
        threads = NORM_THREADS;
    if (y && vec && !kvg_aligned(y, 16)) {
        /* the float4 norm with a y it cannot read as float4: the add on its own first */
        cudaError_t e = kvg_k_add(s, x, y, (size_t)rows * (size_t)dim);
        if (e != cudaSuccess)
            return e;
        y = NULL;
    }
    if (y) {
        if (!lowp)
            rmsnorm_launch<kvg_lp_none, true>(s, vec, threads, x, y, w, eps, rows, dim, out, lowp);
        else if (dt == KVG_KT_BF16)
            rmsnorm_launch<kvg_lp_bf16, true>(s, vec, threads, x, y, w, eps, rows, dim, out, lowp);
        else
            rmsnorm_launch<kvg_lp_f16, true>(s, vec, threads, x, y, w, eps, rows, dim, out, lowp);
    } else {
        if (!lowp)
            rmsnorm_launch<kvg_lp_none, false>(s, vec, threads, x, y, w, eps, rows, dim, out, lowp);
        else if (dt == KVG_KT_BF16)
            rmsnorm_launch<kvg_lp_bf16, false>(s, vec, threads, x, y, w, eps, rows, dim, out, lowp);
        else
            rmsnorm_launch<kvg_lp_f16, false>(s, vec, threads, x, y, w, eps, rows, dim, out, lowp);
    }
    return kvg_launch_result();
}

extern "C" cudaError_t kvg_k_rmsnorm_lowp(cudaStream_t s, const float *x, const float *w, float eps,
                                          int rows, int dim, float *out, kvg_kt dt, void *lowp)
{
    /* x is written only with a y */
    return norm(s, (float *)x, NULL, w, eps, rows, dim, out, dt, lowp);
}

extern "C" cudaError_t kvg_k_rmsnorm(cudaStream_t s, const float *x, const float *w, float eps,
                                     int rows, int dim, float *out)
{
    return norm(s, (float *)x, NULL, w, eps, rows, dim, out, KVG_KT_F32, NULL);
}

extern "C" cudaError_t kvg_k_add_rmsnorm(cudaStream_t s, float *x, const float *y, const float *w,
                                         float eps, int rows, int dim, float *out, kvg_kt dt,
                                         void *lowp)
{
    if (rows > 0 && dim > 0 && !y)
        return cudaErrorInvalidValue;
    return norm(s, x, y, w, eps, rows, dim, out, dt, lowp);
}
