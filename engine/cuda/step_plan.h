/* The CUDA backend's step plan: plain C (no CUDA), so it is tested like the rest.
 *
 * From a kvg_step and the pool's geometry it builds everything the step's kernels read
 * about the step, packed into ONE host buffer that begin_step copies to the device in
 * one transfer:
 *
 *     tokens[R] pos[R] row_seq[R] row_slot[R] out_rows[n_out] row_part[R]
 *     table_off[n_seqs] tables[sum of table lengths] items[n_items]
 *     cs[n_rope_kinds][R][half][2] q_scale[R]
 *
 * (each region starting on a 16-byte boundary; cs, the RoPE cos/sin of each kind of
 * rotation the model's layers use (engine/rope.h: 1, or 2 when the sliding-window layers
 * rotate with their own base), is left for the caller to fill: it needs the model's
 * frequencies; kind k's table is at kvg_step_plan_cs_off(p, k). So is q_scale, each
 * row's query temperature, filled only for a model that has one).
 *
 * Attention work (kernels/kvg_kernels.h kvg_k_attention): the rows are cut into tiles of
 * at most tile_rows consecutive rows of one sequence with consecutive positions; each
 * tile becomes one item per split of split_tokens positions that its last row reaches.
 * Row r has pos[r] / split_tokens + 1 splits; its partials start at row_part[r], the sum
 * of the splits of the rows before it; n_partials is the total. */
#ifndef KVG_CUDA_STEP_PLAN_H
#define KVG_CUDA_STEP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* Same layout as kvg_k_attn_item (backend_cuda.c checks it at compile time). */
typedef struct kvg_plan_item {
    int32_t seq, row0, n_rows, split;
} kvg_plan_item;

typedef struct kvg_step_plan {
    int n_rows, n_seqs, n_out;
    int n_items;                 /* items in the buffer (padding included) */
    int n_items_used;            /* of those, the step's; the rest have no rows */
    int64_t n_partials;          /* sum over rows of their splits */
    int64_t n_table;             /* block ids in tables */
    int64_t table_cap;           /* room for block ids in the buffer (padding included) */
    int max_tile_rows;           /* the largest item */
    int tile_rows;               /* the most rows a tile may have */
    int split_tokens, block_tokens;
    int cs_floats;               /* per row: head_dim (half pairs of cos, sin) */
    int n_rope_kinds;            /* cos/sin tables, one per kind, [n_rows][cs_floats] each */
    /* Byte offsets of the regions in the packed buffer, and its size. */
    size_t off_tokens, off_pos, off_row_seq, off_row_slot, off_out_rows, off_row_part;
    size_t off_table_off, off_tables, off_items, off_cs, off_q_scale;
    size_t bytes;
} kvg_step_plan;

/* Split size for a step: a multiple of block_tokens. batch_invariant: the first multiple
 * >= 256 (a constant: a row's splits never depend on the batch). Otherwise one chosen to
 * give about `target_items` items (e.g. 2 x the SM count) for this step's rows, as
 * block_tokens times a power of two (it changes only when the context doubles). */
int kvg_step_plan_split_tokens(const kvg_step *s, int batch_invariant, int target_items);

/* Checks the step against a pool of pool_blocks blocks (every block id of every table
 * in range, every row's position inside its table, rows of a sequence in order) and lays
 * out the buffer. 0, or -1 with err naming the sequence / row / id. */
int kvg_step_plan_layout(const kvg_step *s, int32_t pool_blocks, int split_tokens,
                         int tile_rows, int head_dim, int n_rope_kinds, kvg_step_plan *p,
                         char *err, size_t err_len);

/* The same with padded = 1: the items rounded up to a power of two (the rest items
 * without rows, which the attention's pass 1 returns from at once) and the tables' room
 * to a power of two (16 at least), so that the layout, the attention's grid and every
 * launch's arguments stay the same over many decode steps while contexts grow: what lets
 * a captured CUDA graph replay (cuda_graph.c). The padding goes to the last attention
 * group. */
int kvg_step_plan_layout_padded(const kvg_step *s, int32_t pool_blocks, int split_tokens,
                                int tile_rows, int head_dim, int n_rope_kinds, int padded,
                                kvg_step_plan *p, char *err, size_t err_len);

/* Byte offset of RoPE kind `kind`'s cos/sin table ([n_rows][cs_floats] floats). */
size_t kvg_step_plan_cs_off(const kvg_step_plan *p, int kind);

/* Fills the buffer (p->bytes, 16-byte aligned) laid out by kvg_step_plan_layout for the
 * same step; cs and q_scale are left untouched. */
void kvg_step_plan_fill(const kvg_step *s, const kvg_step_plan *p, void *buf);

/* One launch of the attention's two passes: the items [item0, item0 + n_items), which are
 * whole tiles, the rows they cover [row0, row0 + n_rows), and those rows' partials
 * [part0, part0 + n_parts) of the step's n_partials (row r's at row_part[r] - part0 in
 * the launch's scratch). */
typedef struct kvg_attn_group {
    int32_t item0, n_items, row0, n_rows;
    int64_t part0, n_parts;
} kvg_attn_group;

/* Cuts the step's attention into groups of consecutive whole tiles, in order, each with
 * at most max_parts partials, except a single tile that has more (a group of its own,
 * at most tile_rows x its splits). The scratch the attention needs is then the largest
 * group's, not the step's total (which grows with rows x context: a 32k prompt prefilled
 * in one step of an 8B shape would need ~35 GB). A row's partials and their combine do
 * not depend on the group: the bits are those of one launch. Writes at most cap groups
 * to g (g NULL: counts only); returns how many there are, and the largest group's
 * partials in *max_group_parts. */
int kvg_step_plan_attn_groups(const kvg_step *s, const kvg_step_plan *p, int64_t max_parts,
                              kvg_attn_group *g, int cap, int64_t *max_group_parts);

#endif
