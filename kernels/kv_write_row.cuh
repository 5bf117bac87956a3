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

#endif
