/* The step plan of the CUDA backend (see step_plan.h). Plain C. */
#include "step_plan.h"
#include "errmsg.h"

#include <string.h>

#define SPLIT_INVARIANT 256

static size_t align16(size_t x)
{
    return (x + 15) & ~(size_t)15;
}

static int round_up(int x, int m)
{
    return (x + m - 1) / m * m;
}

int kvg_step_plan_split_tokens(const kvg_step *s, int batch_invariant, int target_items)
{
    int bt = s->block_tokens > 0 ? s->block_tokens : 1;
    int32_t max_pos = 0;
    int64_t tiles = 0, split;
    if (batch_invariant)
        return round_up(SPLIT_INVARIANT, bt);
    /* Fastest for this step: enough splits over the longest context that the step's
     * tiles times its splits fill the GPU, never below one block. */
    for (int r = 0; r < s->n_rows; r++) {
        if (s->pos[r] > max_pos)
            max_pos = s->pos[r];
        if (r == 0 || s->row_seq[r] != s->row_seq[r - 1])
            tiles++;
    }
    if (target_items < 1)
        target_items = 1;
    split = ((int64_t)max_pos + 1) * tiles / target_items;
    if (split > SPLIT_INVARIANT * 16)
        split = SPLIT_INVARIANT * 16;
    /* block_tokens times a power of two: the split changes only when the context doubles,
     * so consecutive decode steps keep their launches' arguments (a CUDA graph replays) */
    {
        int64_t q = bt;
        while (q < split)
            q *= 2;
        return (int)q;
    }
}

static int64_t pow2_at_least(int64_t x)
{
    int64_t p = 1;
    while (p < x)
        p *= 2;
    return p;
}

/* Rows [r, end) form one tile: same sequence, consecutive positions, <= tile_rows. */
static int tile_end(const kvg_step *s, int r, int tile_rows)
{
    int e = r + 1;
    while (e < s->n_rows && e - r < tile_rows && s->row_seq[e] == s->row_seq[r] &&
           s->pos[e] == s->pos[e - 1] + 1)
        e++;
    return e;
}

int kvg_step_plan_layout(const kvg_step *s, int32_t pool_blocks, int split_tokens,
                         int tile_rows, int head_dim, int n_rope_kinds, kvg_step_plan *p,
                         char *err, size_t err_len)
{
    return kvg_step_plan_layout_padded(s, pool_blocks, split_tokens, tile_rows, head_dim, n_rope_kinds, 0, p, err,
                                       err_len);
}

int kvg_step_plan_layout_padded(const kvg_step *s, int32_t pool_blocks, int split_tokens,
                                int tile_rows, int head_dim, int n_rope_kinds, int padded,
                                kvg_step_plan *p, char *err, size_t err_len)
{
    int bt = s->block_tokens;
    int64_t items = 0, parts = 0, table = 0;
    size_t off = 0;

    memset(p, 0, sizeof *p);
    if (s->n_rows <= 0 || s->n_seqs <= 0 || s->n_out < 0 || s->n_out > s->n_rows) {
        kvg_set_err(err, err_len, "step plan: malformed step (%d rows, %d sequences, %d outputs)",
                    s->n_rows, s->n_seqs, s->n_out);
        return -1;
    }
    if (n_rope_kinds < 1 || n_rope_kinds > 2) {
        kvg_set_err(err, err_len, "step plan: %d kinds of RoPE (1 or 2)", n_rope_kinds);
        return -1;
    }
    if (bt <= 0 || split_tokens <= 0 || split_tokens % bt != 0 || tile_rows <= 0 || head_dim <= 0) {
        kvg_set_err(err, err_len, "step plan: split of %d positions is not a multiple of the "
                    "block size %d (tile %d rows, head_dim %d)", split_tokens, bt, tile_rows, head_dim);
        return -1;
    }
    for (int i = 0; i < s->n_seqs; i++) {
        if (s->n_blocks[i] < 0) {
            kvg_set_err(err, err_len, "step plan: sequence %d has a negative block count", i);
            return -1;
        }
        for (int32_t b = 0; b < s->n_blocks[i]; b++) {
            int32_t id = s->block_tables[i][b];
            if (id < 0 || id >= pool_blocks) {
                kvg_set_err(err, err_len, "step plan: block id %d at index %d of sequence %d's table "
                            "is out of range (the pool has %d blocks)", (int)id, (int)b, i, (int)pool_blocks);
                return -1;
            }
        }
        table += s->n_blocks[i];
    }
    for (int r = 0; r < s->n_rows; r++) {
        int q = s->row_seq[r];
        if (q < 0 || q >= s->n_seqs) {
            kvg_set_err(err, err_len, "step plan: row %d names sequence %d of %d", r, q, s->n_seqs);
            return -1;
        }
        if (s->pos[r] < 0 || (int64_t)s->pos[r] >= (int64_t)s->n_blocks[q] * bt) {
            kvg_set_err(err, err_len, "step plan: row %d (sequence %d, position %d) lies past its "
                        "block table (%d blocks of %d positions)", r, q, (int)s->pos[r],
                        (int)s->n_blocks[q], bt);
            return -1;
        }
        if (r > 0 && q < s->row_seq[r - 1]) {
            /* The kernels take a sequence's rows as one run (forward.c lays them out so). */
            kvg_set_err(err, err_len, "step plan: rows of sequence %d are not consecutive (row %d)", q, r);
            return -1;
        }
        parts += s->pos[r] / split_tokens + 1;
    }
    for (int i = 0; i < s->n_out; i++) {
        if (s->out_rows[i] < 0 || s->out_rows[i] >= s->n_rows) {
            kvg_set_err(err, err_len, "step plan: output %d names row %d of %d", i,
                        (int)s->out_rows[i], s->n_rows);
            return -1;
        }
    }
    for (int r = 0; r < s->n_rows;) {
        int e = tile_end(s, r, tile_rows);
        int n = e - r;
        items += s->pos[e - 1] / split_tokens + 1;
        if (n > p->max_tile_rows)
            p->max_tile_rows = n;
        r = e;
    }
    if (items > INT32_MAX / 2 || parts > INT32_MAX / 2 || table > INT32_MAX / 2) {
        kvg_set_err(err, err_len, "step plan: step too large (%lld items, %lld partials)",
                    (long long)items, (long long)parts);
        return -1;
    }
    p->n_rows = s->n_rows;
    p->n_seqs = s->n_seqs;
    p->n_out = s->n_out;
    p->n_items_used = (int)items;
    p->table_cap = table;
    if (padded) {
        items = pow2_at_least(items);
        p->table_cap = pow2_at_least(table > 16 ? table : 16);
    }
    p->n_items = (int)items;
    p->n_partials = parts;
    p->n_table = table;
    p->split_tokens = split_tokens;
    p->tile_rows = tile_rows;
    p->block_tokens = bt;
    p->cs_floats = head_dim / 2 * 2;
    p->n_rope_kinds = n_rope_kinds;
#define REGION(field, count, size) \
    do { p->field = off; off = align16(off + (size_t)(count) * (size)); } while (0)
    REGION(off_tokens, s->n_rows, 4);
    REGION(off_pos, s->n_rows, 4);
    REGION(off_row_seq, s->n_rows, 4);
    REGION(off_row_slot, s->n_rows, 4);
    REGION(off_out_rows, s->n_out, 4);
    REGION(off_row_part, s->n_rows, 4);
    REGION(off_table_off, s->n_seqs, 4);
    REGION(off_tables, p->table_cap, 4);
    REGION(off_items, items, sizeof(kvg_plan_item));
    REGION(off_cs, (size_t)n_rope_kinds * (size_t)s->n_rows * p->cs_floats, sizeof(float));
    REGION(off_q_scale, s->n_rows, sizeof(float));
#undef REGION
    p->bytes = off;
    return 0;
}

size_t kvg_step_plan_cs_off(const kvg_step_plan *p, int kind)
{
    return p->off_cs + (size_t)kind * (size_t)p->n_rows * (size_t)p->cs_floats * sizeof(float);
}

void kvg_step_plan_fill(const kvg_step *s, const kvg_step_plan *p, void *buf)
{
    unsigned char *b = buf;
    int32_t *row_slot = (int32_t *)(b + p->off_row_slot);
    int32_t *row_part = (int32_t *)(b + p->off_row_part);
    int32_t *table_off = (int32_t *)(b + p->off_table_off);
    int32_t *tables = (int32_t *)(b + p->off_tables);
    kvg_plan_item *items = (kvg_plan_item *)(b + p->off_items);
    int bt = p->block_tokens, sp = p->split_tokens;
    int32_t off = 0, part = 0;
    int n = 0;

    memcpy(b + p->off_tokens, s->tokens, (size_t)p->n_rows * 4);
    memcpy(b + p->off_pos, s->pos, (size_t)p->n_rows * 4);
    memcpy(b + p->off_row_seq, s->row_seq, (size_t)p->n_rows * 4);
    if (p->n_out)
        memcpy(b + p->off_out_rows, s->out_rows, (size_t)p->n_out * 4);
    for (int i = 0; i < p->n_seqs; i++) {
        table_off[i] = off;
        if (s->n_blocks[i])
            memcpy(tables + off, s->block_tables[i], (size_t)s->n_blocks[i] * 4);
        off += s->n_blocks[i];
    }
    for (int r = 0; r < p->n_rows; r++) {
        int q = s->row_seq[r];
        row_slot[r] = s->block_tables[q][s->pos[r] / bt] * bt + s->pos[r] % bt;
        row_part[r] = part;
        part += s->pos[r] / sp + 1;
    }
    /* Tile by tile, split by split: the order pass 2 does not depend on (it combines a
     * row's splits by row_part), but a fixed one keeps launches reproducible. */
    for (int r = 0; r < p->n_rows;) {
        int e = tile_end(s, r, p->tile_rows);
        for (int j = 0; j <= s->pos[e - 1] / sp; j++) {
            items[n].seq = s->row_seq[r];
            items[n].row0 = r;
            items[n].n_rows = e - r;
            items[n].split = j;
            n++;
        }
        r = e;
    }
    /* padding (kvg_step_plan_layout_padded): items without rows, which return at once */
    if (p->n_items > n)
        memset(items + n, 0, (size_t)(p->n_items - n) * sizeof *items);
}

int kvg_step_plan_attn_groups(const kvg_step *s, const kvg_step_plan *p, int64_t max_parts,
                              kvg_attn_group *g, int cap, int64_t *max_group_parts)
{
    int n = 0, sp = p->split_tokens;
    int32_t items = 0;
    int64_t parts = 0, biggest = 0;
    kvg_attn_group cur = { 0, 0, 0, 0, 0, 0 };

    for (int r = 0; r < p->n_rows;) {
        int e = tile_end(s, r, p->tile_rows);
        int32_t t_items = s->pos[e - 1] / sp + 1;
        int64_t t_parts = 0;
        for (int i = r; i < e; i++)
            t_parts += s->pos[i] / sp + 1;
        if (cur.n_rows > 0 && cur.n_parts + t_parts > max_parts) {
            /* the tile does not fit beside the group's: the group is closed */
            if (g && n < cap)
                g[n] = cur;
            if (cur.n_parts > biggest)
                biggest = cur.n_parts;
            n++;
            cur = (kvg_attn_group){ items, 0, r, 0, parts, 0 };
        }
        cur.n_items += t_items;
        cur.n_rows += e - r;
        cur.n_parts += t_parts;
        items += t_items;
        parts += t_parts;
        r = e;
    }
    if (cur.n_rows > 0) {
        cur.n_items += p->n_items - p->n_items_used;    /* the padding, in the last group */
        if (g && n < cap)
            g[n] = cur;
        if (cur.n_parts > biggest)
            biggest = cur.n_parts;
        n++;
    }
    if (max_group_parts)
        *max_group_parts = biggest;
    return n;
}
