/* One row's K and V stored at its slot (F32 -> BF16, round-to-nearest-even): the block's
 * threads stride over the row's (kv head, element pair). A row writes only its own slot,
 * from its own k/v values: nothing depends on the launch. Shared by kv_write.cu and the
 * fused RoPE + write of rope.cu. */
#ifndef KVG_KV_WRITE_ROW_CUH
#define KVG_KV_WRITE_ROW_CUH

#include "kvg_device.cuh"

__device__ __forceinline__ void kvg_kv_write_row(__nv_bfloat16 *pool, const kvg_k_kv_geom &g, int layer,
                                                 const float2 *k, const float2 *v, const int32_t *row_slot,
                                                 int r)
{
    const int32_t slot = row_slot[r];
    const int hd2 = g.head_dim / 2, n_pairs = g.n_kv_heads * hd2;
    if (slot < 0 || slot / g.block_tokens >= g.n_blocks)
        return;              /* not a slot of this pool (the host never sends one) */
    const int32_t b = slot / g.block_tokens, t = slot - b * g.block_tokens;
    __nv_bfloat16 *blk = pool + (int64_t)b * g.block_elems + (int64_t)layer * g.layer_elems;
    const float2 *kr = k + (int64_t)r * n_pairs, *vr = v + (int64_t)r * n_pairs;

    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        const int h = p / hd2, w = p - h * hd2;
        __nv_bfloat16 *base = blk + (int64_t)h * g.head_elems;
        const float2 kk = kr[p], vv = vr[p];
        *(__nv_bfloat162 *)(base + (int64_t)t * g.head_dim + 2 * w) =
            __floats2bfloat162_rn(kk.x, kk.y);
        *(__nv_bfloat162 *)(base + (int64_t)(g.block_tokens + t) * g.head_dim + 2 * w) =
            __floats2bfloat162_rn(vv.x, vv.y);
    }
}

/* One (row, kv head)'s head_dim values x (4-aligned, hd % 4 == 0) quantized by one warp
 * into q (int8, 4-aligned) and *scale: the CPU's kvg_kv_quantize, bit for bit. amax is a
 * max (exact in any order); scale = amax / 127 and x / scale are IEEE divisions (nvcc's
 * default -prec-div=true; never __fdividef), rintf rounds to nearest even as lrintf does
 * in the default rounding mode. Each lane stores whole 32-bit words (4 elements). */
__device__ __forceinline__ void kvg_kv_quantize_warp(const float *x, int hd, int8_t *q, float *scale)
{
    const int lane = threadIdx.x % KVG_WARP, hw4 = hd / 4;
    float amax = 0.0f;
    for (int w = lane; w < hw4; w += KVG_WARP)
        for (int e = 0; e < 4; e++)
            amax = fmaxf(amax, fabsf(x[4 * w + e]));
    amax = kvg_warp_max(amax);
    const float s = amax / 127.0f;
    for (int w = lane; w < hw4; w += KVG_WARP) {
        unsigned word = 0;
        for (int e = 0; e < 4; e++) {
            float v = s > 0.0f ? rintf(x[4 * w + e] / s) : 0.0f;
            v = fminf(fmaxf(v, -127.0f), 127.0f);
            word |= ((unsigned)(int)v & 0xffu) << (8 * e);
        }
        ((unsigned *)q)[w] = word;
    }
    if (lane == 0)
        *scale = s;
}

/* Row r of an int8 layer: warp w of the block quantizes kv heads w, w + n_warps, ... (K
 * then V), each alone. */
__device__ __forceinline__ void kvg_kv_write_row_i8(unsigned char *pool, const kvg_k_kv_geom &g, int layer,
                                                    const float *k, const float *v, const int32_t *row_slot, int r)
{
    const int32_t slot = row_slot[r];
    if (slot < 0 || slot / g.block_tokens >= g.n_blocks)
        return;
    const int32_t b = slot / g.block_tokens, t = slot - b * g.block_tokens;
    const int hd = g.head_dim, bt = g.block_tokens;
    const int i8 = layer - (g.n_layers - g.n_i8);
    const int warp = threadIdx.x / KVG_WARP, n_warps = blockDim.x / KVG_WARP;
    unsigned char *blk = pool + 2 * (int64_t)b * g.block_elems + g.i8_off +
                         (int64_t)i8 * g.n_kv_heads * g.head_bytes_i8;
    const int64_t row = (int64_t)r * g.n_kv_heads * hd;
    for (int h = warp; h < g.n_kv_heads; h += n_warps) {
        unsigned char *base = blk + (int64_t)h * g.head_bytes_i8;
        float *scales = (float *)(base + 2 * (int64_t)bt * hd);
        kvg_kv_quantize_warp(k + row + (int64_t)h * hd, hd, (int8_t *)(base + (int64_t)t * hd), scales + t);
        kvg_kv_quantize_warp(v + row + (int64_t)h * hd, hd, (int8_t *)(base + (int64_t)(bt + t) * hd),
                             scales + bt + t);
    }
}

/* Either layout: the layer's kind is the same for the whole launch (block-uniform). */
__device__ __forceinline__ void kvg_kv_write_row_any(void *pool, const kvg_k_kv_geom &g, int layer,
                                                     const float2 *k, const float2 *v, const int32_t *row_slot,
                                                     int r)
{
    if (layer >= g.n_layers - g.n_i8)         /* kvg_k_layer_int8 (a host function) */
        kvg_kv_write_row_i8((unsigned char *)pool, g, layer, (const float *)k, (const float *)v, row_slot, r);
    else
        kvg_kv_write_row((__nv_bfloat16 *)pool, g, layer, k, v, row_slot, r);
}

#endif
