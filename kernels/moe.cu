/* The mixture-of-experts FFN's own kernels (the GEMMs go through cuBLASLt, per expert:
 * engine/cuda/cuda_moe.c):
 *
 *   kvg_k_moe_gate     each row's router logits -> K (expert, weight) pairs by rank
 *   kvg_k_moe_group    the (row, rank) pairs grouped by expert into slots (a stable
 *                      counting sort: two launches, counts then places)
 *   kvg_k_gather_lowp  each slot's input row, rounded to the experts' GEMM type
 *   kvg_k_moe_combine  each row's K expert outputs, weighted, added in rank order
 *
 * Nothing here depends on which other rows a launch has: the gating is one thread's loop
 * over its own row; the grouping computes integers (counts, prefix sums, positions: exact
 * whatever the block size); the gather is a copy with a rounding; the combine is one fixed
 * fmaf chain per element over the row's own K products. */
#include "kvg_device.cuh"

#define GATE_THREADS 64
#define GROUP_THREADS 256
#define ROW_THREADS 256

/* llama.cpp's floor under the sum of the top-k weights (the CPU backend's, moe_cpu.c):
 * 2^-14, the smallest normal F16. */
#define NORM_MIN_SUM 6.103515625e-5f

/* ---- gating --------------------------------------------------------------------------- */

/* The largest v[e] not yet taken, the lower index on a tie (a NaN compares false either
 * way: still one fixed index), as moe_cpu.c's argmax_free. */
__device__ __forceinline__ int argmax_free(const float *v, const unsigned *taken, int E)
{
    int best = -1;
    for (int e = 0; e < E; e++)
        if (!(taken[e / 32] >> (e % 32) & 1u) && (best < 0 || v[e] > v[best]))
            best = e;
    return best;
}

/* One thread per row, the CPU backend's gate_row expression for expression (the softmax
 * sums in index order; the probabilities overwrite the row's logits). */
__global__ void __launch_bounds__(GATE_THREADS)
moe_gate(float *__restrict__ logits, int rows, int E, int K, int mode, int norm,
         int32_t *__restrict__ sel, float *__restrict__ wt)
{
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows)
        return;
    float *l = logits + (int64_t)r * E;
    int32_t *s = sel + (int64_t)r * K;
    float *w = wt + (int64_t)r * K;
    unsigned taken[KVG_K_MOE_MAX_EXPERTS / 32];
    for (int i = 0; i < (E + 31) / 32; i++)
        taken[i] = 0;
    if (mode == KVG_K_MOE_SOFTMAX) {
        float mx = l[0], sum = 0.0f;
        for (int e = 1; e < E; e++)
            mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++) {
            l[e] = expf(l[e] - mx);
            sum += l[e];
        }
        for (int e = 0; e < E; e++)
            l[e] /= sum;
        for (int j = 0; j < K; j++) {
            int b = argmax_free(l, taken, E);
            taken[b / 32] |= 1u << (b % 32);
            s[j] = b;
            w[j] = l[b];
        }
    } else {
        float sum = 0.0f;
        for (int j = 0; j < K; j++) {
            int b = argmax_free(l, taken, E);
            taken[b / 32] |= 1u << (b % 32);
            s[j] = b;
            w[j] = l[b];
        }
        float mx = w[0];
        for (int j = 0; j < K; j++) {
            w[j] = expf(w[j] - mx);
            sum += w[j];
        }
        for (int j = 0; j < K; j++)
            w[j] /= sum;
    }
    if (norm) {
        float sum = 0.0f;
        for (int j = 0; j < K; j++)
            sum += w[j];
        if (sum < NORM_MIN_SUM)
            sum = NORM_MIN_SUM;
        for (int j = 0; j < K; j++)
            w[j] /= sum;
    }
}

extern "C" cudaError_t kvg_k_moe_gate(cudaStream_t s, float *logits, int rows, int E, int K, int mode,
                                      int norm, int32_t *sel, float *wt)
{
    if (rows <= 0)
        return cudaSuccess;
    if (!logits || !sel || !wt || E <= 0 || E > KVG_K_MOE_MAX_EXPERTS || K <= 0 || K > E ||
        (mode != KVG_K_MOE_SOFTMAX && mode != KVG_K_MOE_TOPK_SOFTMAX))
        return cudaErrorInvalidValue;
    KVG_LAUNCH(moe_gate, dim3(((unsigned)rows + GATE_THREADS - 1) / GATE_THREADS), dim3(GATE_THREADS), 0, s,
               logits, rows, E, K, mode, norm, sel, wt);
    return kvg_launch_result();
}

/* ---- grouping ------------------------------------------------------------------------- */

/* Inclusive prefix sum of v over the block's threads (Hillis-Steele in shared memory, sh
 * holds blockDim.x ints): integers, so exact in any order. Every thread must call it. */
__device__ __forceinline__ int block_scan_incl(int v, int *sh)
{
    const int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int o = 1; o < (int)blockDim.x; o <<= 1) {
        int a = t >= o ? sh[t - o] : 0;
        __syncthreads();
        sh[t] += a;
        __syncthreads();
    }
    v = sh[t];
    __syncthreads();
    return v;
}

/* Thread t's share of the n pairs: [*i0, *i1), consecutive, in thread order. */
__device__ __forceinline__ void share_of(int n, int *i0, int *i1)
{
    const int chunk = (n + (int)blockDim.x - 1) / (int)blockDim.x;
    int a = (int)threadIdx.x * chunk, b = a + chunk;
    *i0 = a < n ? a : n;
    *i1 = b < n ? b : n;
}

/* Block e: meta[e] = the number of pairs that chose expert e. */
__global__ void __launch_bounds__(GROUP_THREADS)
moe_count(const int32_t *__restrict__ sel, int n, int32_t *__restrict__ meta)
{
    __shared__ int sh[GROUP_THREADS];
    const int e = blockIdx.x;
    int i0, i1, c = 0;
    share_of(n, &i0, &i1);
    for (int i = i0; i < i1; i++)
        c += sel[i] == e;
    c = block_scan_incl(c, sh);
    if (threadIdx.x == blockDim.x - 1)
        meta[e] = c;
}

/* Block e: its first slot (the padded counts of the experts before it), then each of its
 * pairs' slot in pair order: pos[i] and slot_row[slot] = i / K; its padding slots name
 * row 0 (any valid row: the GEMMs never read them). */
__global__ void __launch_bounds__(GROUP_THREADS)
moe_place(const int32_t *__restrict__ sel, int n, int K, int E, int align, int32_t *__restrict__ meta,
          int32_t *__restrict__ slot_row, int32_t *__restrict__ pos)
{
    __shared__ int sh[GROUP_THREADS];
    __shared__ int start;
    const int e = blockIdx.x;
    const int cnt = meta[e];
    int i0, i1, c = 0, at;
    if (threadIdx.x == 0) {
        int o = 0;
        for (int f = 0; f < e; f++)
            o += (meta[f] + align - 1) / align * align;
        start = o;
        meta[E + e] = o;
        if (e == E - 1)
            meta[2 * E] = o + (cnt + align - 1) / align * align;
    }
    share_of(n, &i0, &i1);
    for (int i = i0; i < i1; i++)
        c += sel[i] == e;
    at = block_scan_incl(c, sh) - c;          /* barriers inside: `start` is visible after */
    at += start;
    for (int i = i0; i < i1; i++)
        if (sel[i] == e) {
            pos[i] = at;
            slot_row[at++] = i / K;
        }
    for (int p = cnt + (int)threadIdx.x; p < (cnt + align - 1) / align * align; p += blockDim.x)
        slot_row[start + p] = 0;
}

extern "C" cudaError_t kvg_k_moe_group(cudaStream_t s, const int32_t *sel, int n_pairs, int K, int E, int align,
                                       int32_t *meta, int32_t *slot_row, int32_t *pos)
{
    if (n_pairs <= 0)
        return cudaSuccess;
    if (!sel || !meta || !slot_row || !pos || E <= 0 || E > KVG_K_MOE_MAX_EXPERTS || K <= 0 || align <= 0)
        return cudaErrorInvalidValue;
    /* Threads by the number of pairs (a decode step's few need one warp): the integers
       computed are the same for any block size. */
    unsigned threads = ((unsigned)n_pairs + 31u) / 32u * 32u;
    if (threads > GROUP_THREADS)
        threads = GROUP_THREADS;
    KVG_LAUNCH(moe_count, dim3((unsigned)E), dim3(threads), 0, s, sel, n_pairs, meta);
    cudaError_t e = kvg_launch_result();
    if (e != cudaSuccess)
        return e;
    KVG_LAUNCH(moe_place, dim3((unsigned)E), dim3(threads), 0, s, sel, n_pairs, K, E, align, meta, slot_row, pos);
    return kvg_launch_result();
}

/* ---- gather with rounding ------------------------------------------------------------- */

__device__ __forceinline__ void store_lowp(__nv_bfloat16 *p, float v)
{
    *p = __float2bfloat16_rn(v);
}

__device__ __forceinline__ void store_lowp(__half *p, float v)
{
    *p = __float2half_rn(v);
}

/* One block per output row, threads striding over it. */
template <typename T>
__global__ void __launch_bounds__(ROW_THREADS)
gather_lowp(const float *__restrict__ x, int width, const int32_t *__restrict__ rows, T *__restrict__ out)
{
    const float *src = x + (int64_t)rows[blockIdx.x] * width;
    T *dst = out + (int64_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        store_lowp(dst + i, src[i]);
}

extern "C" cudaError_t kvg_k_gather_lowp(cudaStream_t s, const float *x, int width, const int32_t *rows, int n,
                                         kvg_kt dt, void *out)
{
    if (n <= 0 || width <= 0)
        return cudaSuccess;
    if (!x || !rows || !out || (dt != KVG_KT_BF16 && dt != KVG_KT_F16))
        return cudaErrorInvalidValue;
    unsigned threads = ((unsigned)width + 31u) / 32u * 32u;
    if (threads > ROW_THREADS)
        threads = ROW_THREADS;
    if (dt == KVG_KT_BF16) {
        void (*k)(const float *, int, const int32_t *, __nv_bfloat16 *) = gather_lowp<__nv_bfloat16>;
        KVG_LAUNCH(k, dim3((unsigned)n), dim3(threads), 0, s, x, width, rows, (__nv_bfloat16 *)out);
    } else {
        void (*k)(const float *, int, const int32_t *, __half *) = gather_lowp<__half>;
        KVG_LAUNCH(k, dim3((unsigned)n), dim3(threads), 0, s, x, width, rows, (__half *)out);
    }
    return kvg_launch_result();
}

/* ---- combine -------------------------------------------------------------------------- */

/* One block per row: out[r][d] = w0 y0[d], then fmaf(wj, yj[d], .) for j = 1 .. K-1. */
__global__ void __launch_bounds__(ROW_THREADS)
moe_combine(const float *__restrict__ y, int width, const int32_t *__restrict__ pos,
            const float *__restrict__ wt, int K, float *__restrict__ out)
{
    const int r = blockIdx.x;
    const int32_t *p = pos + (int64_t)r * K;
    const float *w = wt + (int64_t)r * K;
    float *o = out + (int64_t)r * width;
    for (int d = threadIdx.x; d < width; d += blockDim.x) {
        float acc = w[0] * y[(int64_t)p[0] * width + d];
        for (int j = 1; j < K; j++)
            acc = fmaf(w[j], y[(int64_t)p[j] * width + d], acc);
        o[d] = acc;
    }
}

extern "C" cudaError_t kvg_k_moe_combine(cudaStream_t s, const float *y, int width, const int32_t *pos,
                                         const float *wt, int rows, int K, float *out)
{
    if (rows <= 0 || width <= 0)
        return cudaSuccess;
    if (!y || !pos || !wt || !out || K <= 0)
        return cudaErrorInvalidValue;
    unsigned threads = ((unsigned)width + 31u) / 32u * 32u;
    if (threads > ROW_THREADS)
        threads = ROW_THREADS;
    KVG_LAUNCH(moe_combine, dim3((unsigned)rows), dim3(threads), 0, s, y, width, pos, wt, K, out);
    return kvg_launch_result();
}
