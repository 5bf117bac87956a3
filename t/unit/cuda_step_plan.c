/* The CUDA backend's step plan (engine/cuda/step_plan.c, plain C): the packed layout,
 * row slots, block tables, attention tiles and splits, row_part and the partials count
 * on hand-made steps, and the validation of block ids and table lengths. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "cuda/step_plan.h"

#define I32(buf, p, field) ((const int32_t *)(const void *)((const unsigned char *)(buf) + (p)->field))

typedef struct mk {
    int32_t tokens[256], pos[256], row_seq[256], out_rows[16];
    int32_t tables[4][64];
    const int32_t *tp[4];
    int32_t nb[4];
    kvg_step s;
} mk;

/* Sequence i has n_new[i] rows starting at position start[i], blocks given per table. */
static void build(mk *k, int n_seqs, const int *start, const int *n_new, int bt)
{
    int r = 0;
    memset(k, 0, sizeof *k);
    for (int i = 0; i < n_seqs; i++) {
        int end = start[i] + n_new[i];
        k->nb[i] = (end + bt - 1) / bt;
        for (int b = 0; b < k->nb[i]; b++)
            k->tables[i][b] = 100 * i + b + 1;
        k->tp[i] = k->tables[i];
        for (int t = 0; t < n_new[i]; t++, r++) {
            k->tokens[r] = 7 + r;
            k->pos[r] = start[i] + t;
            k->row_seq[r] = i;
        }
        k->out_rows[i] = r - 1;
    }
    k->s.n_rows = r;
    k->s.tokens = k->tokens;
    k->s.pos = k->pos;
    k->s.row_seq = k->row_seq;
    k->s.n_seqs = n_seqs;
    k->s.block_tokens = bt;
    k->s.block_tables = k->tp;
    k->s.n_blocks = k->nb;
    k->s.n_out = n_seqs;
    k->s.out_rows = k->out_rows;
}

static void *plan(const mk *k, int pool, int split, int tile, kvg_step_plan *p, char *err, size_t len)
{
    void *buf;
    if (kvg_step_plan_layout(&k->s, pool, split, tile, 8, 1, p, err, len) != 0)
        return NULL;
    buf = aligned_alloc(16, (p->bytes + 15) / 16 * 16);
    kvg_step_plan_fill(&k->s, p, buf);
    return buf;
}

static void test_decode_and_prefill(void)
{
    char err[256];
    mk k;
    kvg_step_plan p;
    /* seq 0: a prefill chunk of 40 rows at positions 0..39; seq 1: one decode row at 300;
     * blocks of 16, splits of 32, tiles of 16. */
    int start[] = { 0, 300 }, n_new[] = { 40, 1 };
    build(&k, 2, start, n_new, 16);
    void *buf = plan(&k, 1000, 32, 16, &p, err, sizeof err);
    ok(buf != NULL, "plan built (%s)", buf ? "" : err);
    if (!buf)
        return;
    is_int(p.n_rows, 41, "rows");
    is_int(p.max_tile_rows, 16, "tiles of at most 16 rows");
    /* seq 0 tiles: rows 0-15 (pos 15: 1 split), 16-31 (pos 31: 1 split), 32-39 (pos 39: 2
     * splits); seq 1: one row at 300: 300/32 + 1 = 10 splits. */
    is_int(p.n_items, 1 + 1 + 2 + 10, "items: each tile times the splits its last row reaches");
    {
        int64_t want = 0;
        for (int r = 0; r < 40; r++)
            want += r / 32 + 1;
        want += 10;
        is_int(p.n_partials, want, "partials: every row's splits");
    }
    const kvg_plan_item *it = (const kvg_plan_item *)(const void *)((unsigned char *)buf + p.off_items);
    ok(it[0].seq == 0 && it[0].row0 == 0 && it[0].n_rows == 16 && it[0].split == 0, "item 0");
    ok(it[2].row0 == 32 && it[2].n_rows == 8 && it[2].split == 0 && it[3].split == 1, "last tile of the chunk: 2 splits");
    ok(it[4].seq == 1 && it[4].row0 == 40 && it[4].n_rows == 1 && it[4].split == 0 && it[13].split == 9,
       "decode row: splits 0..9");
    const int32_t *row_part = I32(buf, &p, off_row_part);
    is_int(row_part[0], 0, "row_part[0]");
    is_int(row_part[32], 32, "row_part: rows 0..31 have one split each");
    is_int(row_part[34], 32 + 2 * 2, "row_part: rows 32.. have two");
    is_int(row_part[40], 32 + 8 * 2, "row_part of the decode row");
    const int32_t *slot = I32(buf, &p, off_row_slot);
    is_int(slot[0], 1 * 16 + 0, "row slot: block 1, slot 0");
    is_int(slot[17], 2 * 16 + 1, "row slot: position 17 in block 2 slot 1");
    is_int(slot[40], (100 + 18 + 1) * 16 + 300 % 16, "decode row slot");
    const int32_t *toff = I32(buf, &p, off_table_off), *tab = I32(buf, &p, off_tables);
    is_int(toff[0], 0, "table_off[0]");
    is_int(toff[1], 3, "table_off[1]: after seq 0's 3 blocks");
    is_int(tab[4], 102, "flat tables: seq 1 block 1");
    is_int(p.n_table, 3 + 19, "table length");
    is_int(I32(buf, &p, off_tokens)[5], 12, "tokens copied");
    is_int(I32(buf, &p, off_pos)[40], 300, "positions copied");
    is_int(I32(buf, &p, off_out_rows)[1], 40, "out rows copied");
    ok(p.off_cs % 16 == 0 && p.bytes >= p.off_cs + 41 * 8 * sizeof(float), "cos/sin region: rows x head_dim");
    free(buf);
}

static void test_tiles_break(void)
{
    char err[256];
    mk k;
    kvg_step_plan p;
    int start[] = { 5, 0, 9 }, n_new[] = { 3, 1, 20 };
    build(&k, 3, start, n_new, 4);
    void *buf = plan(&k, 1000, 8, 4, &p, err, sizeof err);
    ok(buf != NULL, "three sequences (%s)", buf ? "" : err);
    if (!buf)
        return;
    /* seq 0: one tile (rows 0-2, last pos 7: 1 split); seq 1: one (pos 0); seq 2: 5 tiles of
     * 4 at positions 9..28. */
    const kvg_plan_item *it = (const kvg_plan_item *)(const void *)((unsigned char *)buf + p.off_items);
    int n0 = 0;
    for (int i = 0; i < p.n_items; i++)
        if (it[i].seq == 0)
            n0++;
    is_int(n0, 1, "a tile never spans two sequences");
    is_int(it[1].seq, 1, "the next sequence starts a tile");
    int ok_rows = 1;
    for (int i = 0; i < p.n_items; i++)
        if (it[i].n_rows > 4 || k.row_seq[it[i].row0] != it[i].seq ||
            k.row_seq[it[i].row0 + it[i].n_rows - 1] != it[i].seq)
            ok_rows = 0;
    ok(ok_rows, "every item: <= tile rows of its one sequence");
    /* A tile's splits reach its last row: rows of seq 2 at 25..28 -> 28/8 + 1 = 4 splits. */
    is_int(it[p.n_items - 1].split, 3, "last tile reaches split 3");
    free(buf);
}

static void test_validation(void)
{
    char err[256];
    mk k;
    kvg_step_plan p;
    int start[] = { 0, 20 }, n_new[] = { 5, 1 };
    build(&k, 2, start, n_new, 16);
    k.tables[1][1] = 200;
    ok(kvg_step_plan_layout(&k.s, 200, 256, 16, 8, 1, &p, err, sizeof err) == -1 &&
       strstr(err, "block id 200") && strstr(err, "sequence 1") && strstr(err, "200 blocks"),
       "block id past the pool rejected (%s)", err);
    k.tables[1][1] = -3;
    ok(kvg_step_plan_layout(&k.s, 200, 256, 16, 8, 1, &p, err, sizeof err) == -1 && strstr(err, "block id -3"),
       "negative block id rejected (%s)", err);
    k.tables[1][1] = 7;
    ok(kvg_step_plan_layout(&k.s, 200, 256, 16, 8, 1, &p, err, sizeof err) == 0, "valid again");
    k.nb[1] = 1;
    ok(kvg_step_plan_layout(&k.s, 200, 256, 16, 8, 1, &p, err, sizeof err) == -1 &&
       strstr(err, "row 5") && strstr(err, "position 20") && strstr(err, "1 blocks of 16"),
       "position past the table rejected (%s)", err);
    k.nb[1] = 2;
    ok(kvg_step_plan_layout(&k.s, 200, 24, 16, 8, 1, &p, err, sizeof err) == -1 && strstr(err, "multiple"),
       "a split that is not whole blocks rejected (%s)", err);
    k.out_rows[0] = 9;
    ok(kvg_step_plan_layout(&k.s, 200, 256, 16, 8, 1, &p, err, sizeof err) == -1 && strstr(err, "output 0"),
       "an output row past the step rejected (%s)", err);
}

/* Two kinds of RoPE (a model whose sliding-window layers rotate with their own base):
 * two cos/sin tables, one after the other, each [rows][head_dim]; the rest unchanged. */
static void test_rope_kinds(void)
{
    char err[256];
    mk k;
    kvg_step_plan p1, p2;
    int start[] = { 0, 30 }, n_new[] = { 9, 1 };
    build(&k, 2, start, n_new, 16);
    ok(kvg_step_plan_layout(&k.s, 200, 256, 16, 8, 1, &p1, err, sizeof err) == 0 &&
       kvg_step_plan_layout(&k.s, 200, 256, 16, 8, 2, &p2, err, sizeof err) == 0, "one and two kinds laid out");
    is_int(p2.n_rope_kinds, 2, "two tables");
    ok(p1.off_cs == p2.off_cs && p1.off_items == p2.off_items && p1.n_items == p2.n_items,
       "the regions before cos/sin do not move");
    ok(kvg_step_plan_cs_off(&p2, 0) == p2.off_cs &&
       kvg_step_plan_cs_off(&p2, 1) == p2.off_cs + 10 * 8 * sizeof(float) &&
       p2.bytes >= kvg_step_plan_cs_off(&p2, 1) + 10 * 8 * sizeof(float) && kvg_step_plan_cs_off(&p2, 1) % 8 == 0,
       "kind 1's table follows kind 0's: rows x head_dim floats each");
    ok(kvg_step_plan_layout(&k.s, 200, 256, 16, 8, 3, &p2, err, sizeof err) == -1 && strstr(err, "RoPE"),
       "three kinds refused (%s)", err);
}

/* Groups cover the items, rows and partials in order, each exactly once, and a group's
 * part0 is its first row's row_part. */
static int groups_tile(const kvg_attn_group *g, int n, const kvg_step_plan *p, const int32_t *row_part)
{
    int32_t items = 0, rows = 0;
    int64_t parts = 0;
    for (int i = 0; i < n; i++) {
        if (g[i].item0 != items || g[i].row0 != rows || g[i].part0 != parts || g[i].n_items < 1 ||
            g[i].n_rows < 1 || (row_part && row_part[g[i].row0] != g[i].part0))
            return 0;
        items += g[i].n_items;
        rows += g[i].n_rows;
        parts += g[i].n_parts;
    }
    return items == p->n_items && rows == p->n_rows && parts == p->n_partials;
}

static void test_attn_groups(void)
{
    char err[256];
    mk k;
    kvg_step_plan p;
    kvg_attn_group g[8];
    int64_t big = -1;
    int start[] = { 0, 300 }, n_new[] = { 40, 1 };
    build(&k, 2, start, n_new, 16);
    void *buf = plan(&k, 1000, 32, 16, &p, err, sizeof err);
    if (!buf) {
        ok(0, "plan built (%s)", err);
        return;
    }
    const int32_t *row_part = I32(buf, &p, off_row_part);
    /* tiles: rows 0-15 (16 partials, 1 item), 16-31 (16, 1), 32-39 (16, 2), row 40 (10, 10) */
    int n = kvg_step_plan_attn_groups(&k.s, &p, 1000, g, 8, &big);
    ok(n == 1 && big == p.n_partials && groups_tile(g, n, &p, row_part), "room for all: one group (%d, %lld)", n,
       (long long)big);
    n = kvg_step_plan_attn_groups(&k.s, &p, 40, g, 8, &big);
    ok(n == 2 && g[0].n_rows == 32 && g[0].n_items == 2 && g[0].n_parts == 32 && g[1].row0 == 32 &&
       g[1].n_items == 12 && g[1].n_parts == 26 && big == 32 && groups_tile(g, n, &p, row_part),
       "40 partials: tiles 1-2, then tile 3 with the decode row (%d groups, largest %lld)", n, (long long)big);
    n = kvg_step_plan_attn_groups(&k.s, &p, 1, g, 8, &big);
    ok(n == 4 && big == 16 && groups_tile(g, n, &p, row_part), "1 partial: every tile alone, each above it (%d)", n);
    is_int(kvg_step_plan_attn_groups(&k.s, &p, 1, NULL, 0, NULL), 4, "counted without writing");
    free(buf);

    /* The long cases, for an 8B shape (32 query heads, head_dim 128: 16,640 bytes per
     * partial) with the backend's default 256 MiB: a 512-row chunk at the end of a 128k
     * context, and a 32k prompt in one step. */
    static const struct {
        int rows, start;
        double total_gb;             /* what one launch's scratch would be */
    } cases[] = { { 512, 131072 - 512, 4.36 }, { 32768, 0, 35.1 } };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int R = cases[c].rows, nb = (cases[c].start + R + 15) / 16;
        int32_t *tok = calloc((size_t)R, 4), *pos = malloc((size_t)R * 4), *seq = calloc((size_t)R, 4);
        int32_t *tab = malloc((size_t)nb * 4), out = R - 1, nblocks = nb;
        const int32_t *tp = tab;
        const size_t per = (size_t)32 * (128 + 2) * 4, cap = (size_t)256 << 20;
        kvg_step s;
        kvg_step_plan lp;
        for (int r = 0; r < R; r++)
            pos[r] = cases[c].start + r;
        for (int b = 0; b < nb; b++)
            tab[b] = b;
        memset(&s, 0, sizeof s);
        s.n_rows = R, s.tokens = tok, s.pos = pos, s.row_seq = seq, s.n_seqs = 1, s.block_tokens = 16;
        s.block_tables = &tp, s.n_blocks = &nblocks, s.n_out = 1, s.out_rows = &out;
        if (kvg_step_plan_layout(&s, nb, 256, 16, 128, 1, &lp, err, sizeof err) != 0) {
            ok(0, "long case %zu: layout (%s)", c, err);
        } else {
            int cnt = kvg_step_plan_attn_groups(&s, &lp, (int64_t)(cap / per), NULL, 0, NULL);
            kvg_attn_group *lg = malloc((size_t)cnt * sizeof *lg);
            kvg_step_plan_attn_groups(&s, &lp, (int64_t)(cap / per), lg, cnt, &big);
            ok(groups_tile(lg, cnt, &lp, NULL) && (size_t)big * per <= cap &&
               (double)lp.n_partials * (double)per / 1e9 > cases[c].total_gb - 0.01,
               "%d rows from position %d: %.2f GB of partials in one launch; %d launches of at most %.0f MiB",
               R, cases[c].start, (double)lp.n_partials * (double)per / 1e9, cnt,
               (double)big * (double)per / 1048576.0);
            free(lg);
        }
        free(tok);
        free(pos);
        free(seq);
        free(tab);
    }
}

static void test_split_choice(void)
{
    mk k;
    int start[] = { 1000 }, n_new[] = { 1 };
    build(&k, 1, start, n_new, 16);
    is_int(kvg_step_plan_split_tokens(&k.s, 1, 264), 256, "invariant: 256 positions");
    k.s.block_tokens = 48;
    is_int(kvg_step_plan_split_tokens(&k.s, 1, 264), 288, "invariant: rounded up to whole blocks");
    k.s.block_tokens = 16;
    int sp = kvg_step_plan_split_tokens(&k.s, 0, 264);
    ok(sp % 16 == 0 && sp >= 16 && sp < 256, "off: a long decode is split finer (%d)", sp);
}

/* Padded (CUDA graphs): items and the tables' room rounded up to powers of two, the padding
 * items without rows, in the last group; the layout the same for decode steps whose
 * contexts grow inside those powers. */
static void test_padded(void)
{
    char err[256];
    mk k, k2;
    kvg_step_plan p, p2, q;
    kvg_attn_group g[4];
    int start[] = { 20, 33, 70 }, start2[] = { 21, 34, 71 }, one[] = { 1, 1, 1 };
    build(&k, 3, start, one, 8);
    build(&k2, 3, start2, one, 8);
    /* splits of 32: rows at 20, 33, 70 have 1 + 2 + 3 = 6 items; tables 3 + 5 + 9 = 17 ids */
    ok(kvg_step_plan_layout(&k.s, 1000, 32, 16, 8, 1, &q, err, sizeof err) == 0 &&
       kvg_step_plan_layout_padded(&k.s, 1000, 32, 16, 8, 1, 1, &p, err, sizeof err) == 0 &&
       kvg_step_plan_layout_padded(&k2.s, 1000, 32, 16, 8, 1, 1, &p2, err, sizeof err) == 0, "laid out (%s)", err);
    ok(q.n_items == 6 && q.n_items_used == 6 && q.table_cap == 17, "unpadded: 6 items, 17 table ids");
    ok(p.n_items == 8 && p.n_items_used == 6 && p.table_cap == 32 && p.n_table == 17,
       "padded: 8 items (6 used), room for 32 table ids");
    ok(p.bytes == p2.bytes && p.off_items == p2.off_items && p.off_cs == p2.off_cs && p.n_items == p2.n_items,
       "one position further (a new block for the third row): the same layout");
    {
        void *buf = aligned_alloc(16, (p.bytes + 15) / 16 * 16);
        const kvg_plan_item *it;
        memset(buf, 0xab, p.bytes);
        kvg_step_plan_fill(&k.s, &p, buf);
        it = (const kvg_plan_item *)(const void *)((unsigned char *)buf + p.off_items);
        ok(it[5].n_rows == 1 && it[6].n_rows == 0 && it[7].n_rows == 0 && it[7].seq == 0 && it[7].split == 0,
           "the padding items have no rows (pass 1 returns from them)");
        free(buf);
    }
    ok(kvg_step_plan_attn_groups(&k.s, &p, 1000, g, 4, NULL) == 1 && g[0].n_items == 8,
       "one group: the padding in it");
    ok(kvg_step_plan_attn_groups(&k.s, &p, 3, g, 4, NULL) == 2 && g[0].n_items == 3 && g[1].n_items == 3 + 2,
       "two groups (3 partials each at most): the padding in the last");
}

int main(void)
{
    test_decode_and_prefill();
    test_padded();
    test_tiles_break();
    test_validation();
    test_rope_kinds();
    test_split_choice();
    test_attn_groups();
    return done_testing();
}
