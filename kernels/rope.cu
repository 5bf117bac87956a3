/* RoPE: rotates each head of q and k in place by the row's cos/sin table
 * (cs[r][i] = {cos, sin} of pair i, computed by the host exactly as the CPU backend does).
 * One block per row; its threads stride over the row's (head, pair) rotations, q's heads
 * then k's. Each rotation reads only its own two elements and the row's cos/sin, with the
 * CPU backend's expression (v0 c - v1 s, v0 s + v1 c): a row's result cannot depend on
 * the launch. Only the leading `rot` dimensions of a head rotate (partial RoPE: pairs
 * (i, i + rot/2) or (2i, 2i+1) for i < rot/2); the table keeps head_dim/2 pairs a row.
 * With q_scale (Llama 4's query temperature, Ministral 3) every element of row r's q is
 * then multiplied by q_scale[r]: the rotated value is rounded to float and multiplied, as
 * the CPU backend stores it and multiplies it (the dimensions left unrotated included). */
#include "kvg_device.cuh"
#include "kv_write_row.cuh"

#define ROPE_THREADS 256

/* Row r's rotations by the block's threads. */
__device__ __forceinline__ void rope_row(float *q, float *k, const float2 *cs, const float *q_scale,
                                         int n_heads, int n_kv_heads, int head_dim, int rot, int layout,
                                         int64_t r)
{
    const int half = rot / 2;
    const int n_q = n_heads * half, n_all = (n_heads + n_kv_heads) * half;
    const float2 *c = cs + r * (head_dim / 2);
    float *qr = q + r * (int64_t)n_heads * head_dim;
    float *kr = k + r * (int64_t)n_kv_heads * head_dim;
    const float ts = q_scale ? q_scale[r] : 1.0f;

    /* Each product rounded on its own (__fmul_rn: never fused into an FMA, which nvcc
     * would do to a*b - c*d by default), as the CPU backend computes them: the difference
     * of two near-equal products is where a fused one differs by many ulps. */
    for (int p = threadIdx.x; p < n_all; p += blockDim.x) {
        const int hp = p < n_q ? p : p - n_q;
        const int h = hp / half, i = hp - h * half;
        float *v = (p < n_q ? qr : kr) + (int64_t)h * head_dim;
        const float2 t = c[i];
        float o0, o1;
        if (layout == 0) {
            /* adjacent pairs (2i, 2i+1): one 8-byte access (head_dim is even) */
            float2 a = *(float2 *)(v + 2 * i);
            o0 = __fmul_rn(a.x, t.x) - __fmul_rn(a.y, t.y);
            o1 = __fmul_rn(a.x, t.y) + __fmul_rn(a.y, t.x);
        } else {
            const float v0 = v[i], v1 = v[i + half];
            o0 = __fmul_rn(v0, t.x) - __fmul_rn(v1, t.y);
            o1 = __fmul_rn(v0, t.y) + __fmul_rn(v1, t.x);
        }
        if (q_scale && p < n_q) {
            o0 *= ts;
            o1 *= ts;
        }
        if (layout == 0) {
            *(float2 *)(v + 2 * i) = make_float2(o0, o1);
        } else {
            v[i] = o0;
            v[i + half] = o1;
        }
    }
    /* the query temperature on q's unrotated dimensions (partial RoPE) */
    if (q_scale && rot < head_dim) {
        const int tail = head_dim - rot;
        for (int p = threadIdx.x; p < n_heads * tail; p += blockDim.x) {
            const int h = p / tail;
            qr[(int64_t)h * head_dim + rot + (p - h * tail)] *= ts;
        }
    }
}

__global__ void __launch_bounds__(ROPE_THREADS)
rope_kernel(float *__restrict__ q, float *__restrict__ k, const float2 *__restrict__ cs,
            const float *__restrict__ q_scale, int n_heads, int n_kv_heads, int head_dim, int rot,
            int layout)
{
    rope_row(q, k, cs, q_scale, n_heads, n_kv_heads, head_dim, rot, layout, blockIdx.x);
}

/* RoPE then the row's K and V into the pool, in one kernel: the rotated k is read back by
 * the threads that store it after the block's barrier (a pool word pairs elements 2w and
 * 2w + 1, which the rotation of the halves layout computes in different threads). The
 * same values as kvg_k_rope then kvg_k_kv_write. */
__global__ void __launch_bounds__(ROPE_THREADS)
rope_kv_write_kernel(float *__restrict__ q, float *__restrict__ k, const float2 *__restrict__ cs,
                     const float *__restrict__ q_scale, int n_heads, int n_kv_heads, int head_dim, int rot,
                     int layout, void *__restrict__ pool, kvg_k_kv_geom g, int layer,
                     const float *__restrict__ v, const int32_t *__restrict__ row_slot)
{
    rope_row(q, k, cs, q_scale, n_heads, n_kv_heads, head_dim, rot, layout, blockIdx.x);
    __syncthreads();
    kvg_kv_write_row_any(pool, g, layer, (const float2 *)k, (const float2 *)v, row_slot, (int)blockIdx.x);
}

extern "C" cudaError_t kvg_k_rope(cudaStream_t s, float *q, float *k, const float *cs,
                                  const float *q_scale, int n_rows, int n_heads, int n_kv_heads,
                                  int head_dim, int rot, int layout)
{
    if (n_rows <= 0)
        return cudaSuccess;
    if (!q || !k || !cs || head_dim <= 0 || head_dim % 2 || rot <= 0 || rot % 2 || rot > head_dim ||
        n_heads <= 0 || n_kv_heads < 0 || (layout != 0 && layout != 1))
        return cudaErrorInvalidValue;
    /* float2 accesses: q, k and cs rows are 8-byte aligned when the bases are (head_dim even) */
    if (!kvg_aligned(q, 8) || !kvg_aligned(k, 8) || !kvg_aligned(cs, 8))
        return cudaErrorInvalidValue;
    const int n_all = (n_heads + n_kv_heads) * (rot / 2);
    unsigned threads = ((unsigned)n_all + 31u) / 32u * 32u;
    if (threads > ROPE_THREADS)
        threads = ROPE_THREADS;
    KVG_LAUNCH(rope_kernel, dim3((unsigned)n_rows), dim3(threads), 0, s, q, k,
               (const float2 *)cs, q_scale, n_heads, n_kv_heads, head_dim, rot, layout);
    return kvg_launch_result();
}

extern "C" cudaError_t kvg_k_rope_kv_write(cudaStream_t s, float *q, float *k, const float *cs,
                                           const float *q_scale, int n_rows, int n_heads, int head_dim,
                                           int rot, int layout, void *pool, const kvg_k_kv_geom *g,
                                           int layer, const float *v, const int32_t *row_slot)
{
    if (n_rows <= 0)
        return cudaSuccess;
    if (!q || !k || !cs || !pool || !g || !v || !row_slot || head_dim <= 0 || head_dim % 2 || rot <= 0 ||
        rot % 2 || rot > head_dim || n_heads <= 0 || g->n_kv_heads <= 0 || (layout != 0 && layout != 1) ||
        g->head_dim != head_dim || g->block_tokens <= 0 || layer < 0 || layer >= g->n_layers ||
        (kvg_k_layer_int8(g, layer) && head_dim % 4))
        return cudaErrorInvalidValue;
    if (!kvg_aligned(q, 8) || !kvg_aligned(k, 8) || !kvg_aligned(cs, 8) || !kvg_aligned(v, 8) ||
        !kvg_aligned(pool, 4))
        return cudaErrorInvalidValue;
    /* the write: a thread per element pair (BF16), a warp per kv head (int8) */
    const int n_rope = (n_heads + g->n_kv_heads) * (rot / 2);
    const int n_kv = kvg_k_layer_int8(g, layer) ? g->n_kv_heads * KVG_WARP : g->n_kv_heads * (head_dim / 2);
    const int most = n_rope > n_kv ? n_rope : n_kv;
    unsigned threads = ((unsigned)most + 31u) / 32u * 32u;
    if (threads > ROPE_THREADS)
        threads = ROPE_THREADS;
    KVG_LAUNCH(rope_kv_write_kernel, dim3((unsigned)n_rows), dim3(threads), 0, s, q, k, (const float2 *)cs,
               q_scale, n_heads, g->n_kv_heads, head_dim, rot, layout, pool, *g, layer, v,
               row_slot);
    return kvg_launch_result();
}
