/* The paged KV pool: geometry and budget arithmetic, the block allocator with reference
 * counts, block tables (prepare / fork / copy-on-write / truncate / release), failure
 * leaving everything unchanged, and the layout accessors; the int8 layout (--kv-dtype int8)
 * and its quantization. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tap.h"
#include "kv_cache.h"
#include "kv_cache_testing.h"

static kvg_kv_geom geom(int layers, int heads, int hd, int bt)
{
    kvg_kv_geom g = { .n_layers = layers, .n_kv_heads = heads, .head_dim = hd, .block_tokens = bt };
    return g;
}

/* Fills the K and V of one block with a recognisable pattern. */
static void fill_block(kvg_kv_pool *p, int32_t b, float base)
{
    float *k = kvg_kv_k(p, b, 0, 0);
    for (size_t i = 0; i < (p->stride_bytes / sizeof(float)); i++)
        k[i] = base + (float)i;
}

static int block_has(const kvg_kv_pool *p, int32_t b, float base)
{
    const float *k = kvg_kv_k(p, b, 0, 0);
    for (size_t i = 0; i < (p->stride_bytes / sizeof(float)); i++)
        if (k[i] != base + (float)i)
            return 0;
    return 1;
}

static void test_geometry(void)
{
    char err[256];
    kvg_kv_geom g = geom(5, 4, 8, 0);
    kvg_kv_pool *p;

    /* payload layers*kv_heads*2*head_dim*16 = 5120 floats = 320 lines: padded to 321 */
    is_int(kvg_kv_block_bytes(&g), 321 * 64, "block bytes: payload padded to an odd number of lines");
    is_int(kvg_kv_blocks_for_budget(&g, 10 * kvg_kv_block_bytes(&g) + 5), 10, "budget -> 10 blocks");
    is_int(kvg_kv_blocks_for_budget(&g, 100), 0, "tiny budget -> 0 blocks");
    g.n_layers = 0;
    is_int(kvg_kv_block_bytes(&g), 0, "invalid geometry -> 0 bytes");
    p = kvg_kv_pool_new(&g, 4, err, sizeof err);
    ok(p == NULL && strstr(err, "geometry"), "invalid geometry rejected (%s)", err);
    g = geom(2, 2, 4, 0);
    p = kvg_kv_pool_new(&g, 0, err, sizeof err);
    ok(p == NULL && strstr(err, "positive"), "zero blocks rejected (%s)", err);
    g.head_dim = -1;
    ok(kvg_kv_pool_new(&g, 4, err, sizeof err) == NULL, "negative head_dim rejected");
    g = geom(2, 2, 4, 5000);
    ok(kvg_kv_pool_new(&g, 4, err, sizeof err) == NULL, "absurd block size rejected");

    g = geom(3, 2, 8, 16);
    p = kvg_kv_pool_new(&g, 4, err, sizeof err);
    ok(p != NULL, "pool of 4 blocks");
    is_int(p->geom.block_tokens, 16, "block_tokens kept");
    /* Layout: [layer][kv_head]{K [hd][bt], V [bt][hd]} */
    ok(kvg_kv_v(p, 0, 0, 0) - kvg_kv_k(p, 0, 0, 0) == 8 * 16, "V follows K of the same head");
    ok(kvg_kv_k(p, 0, 0, 1) - kvg_kv_k(p, 0, 0, 0) == 2 * 8 * 16, "next kv head after K and V");
    ok(kvg_kv_k(p, 0, 1, 0) - kvg_kv_k(p, 0, 0, 0) == 2 * 2 * 8 * 16, "next layer after all heads");
    ok(kvg_kv_k(p, 1, 0, 0) - kvg_kv_k(p, 0, 0, 0) == 3 * 2 * 2 * 8 * 16 + 16,
       "next block after all layers and one line of padding (1536 floats = 96 lines -> 97)");
    ok(kvg_kv_k(p, 3, 2, 1) + 2 * 8 * 16 + 16 == p->data + 4 * (p->stride_bytes / sizeof(float)), "last head + padding ends the pool");
    ok(((uintptr_t)p->data & 63) == 0, "pool storage is 64-byte aligned");
    kvg_kv_pool_free(p);

    g = geom(1, 1, 4, 0);
    p = kvg_kv_pool_new(&g, 1, err, sizeof err);
    is_int(p->geom.block_tokens, KVG_KV_BLOCK_TOKENS_DEFAULT, "block_tokens 0 -> default 16");
    kvg_kv_pool_free(p);
}

/* The int8 layout (--kv-dtype int8): the first full_layers layers as F32, the deeper
 * ones int8 K [hd][bt], V [bt][hd], then a float scale per token for each; the block
 * size; the geometry's checks; the quantization's rule. */
static void test_int8_layout(void)
{
    char err[256];
    kvg_kv_geom g = geom(3, 2, 8, 16);
    kvg_kv_pool *p;
    size_t f32_head = 2 * 8 * 16 * 4, i8_head = 2 * 8 * 16 + 2 * 16 * 4;

    g.dtype = KVG_KV_INT8;
    g.full_layers = 1;
    /* 1 layer x 2 heads x 1024 + 2 layers x 2 heads x 384 = 3584 bytes = 56 lines -> 57 */
    is_int(kvg_kv_block_bytes(&g), 57 * 64, "int8, 1 full layer of 3: block bytes (56 lines -> 57)");
    p = kvg_kv_pool_new(&g, 2, err, sizeof err);
    ok(p != NULL, "int8 pool");
    ok(!kvg_kv_layer_int8(p, 0) && kvg_kv_layer_int8(p, 1) && kvg_kv_layer_int8(p, 2),
       "layer 0 F32, layers 1 and 2 int8");
    ok((unsigned char *)kvg_kv_k(p, 0, 0, 1) - (unsigned char *)kvg_kv_k(p, 0, 0, 0) == (ptrdiff_t)f32_head,
       "F32 layer: heads of K and V floats");
    ok((unsigned char *)kvg_kv_k8(p, 0, 1, 0) - (unsigned char *)p->data == (ptrdiff_t)(2 * f32_head),
       "first int8 layer after the F32 layers");
    ok(kvg_kv_v8(p, 0, 1, 0) - kvg_kv_k8(p, 0, 1, 0) == 8 * 16, "int8 V after int8 K");
    ok((unsigned char *)kvg_kv_kscale(p, 0, 1, 0) - (unsigned char *)kvg_kv_k8(p, 0, 1, 0) == 2 * 8 * 16,
       "K scales after V");
    ok(kvg_kv_vscale(p, 0, 1, 0) - kvg_kv_kscale(p, 0, 1, 0) == 16, "V scales after K scales");
    ok(kvg_kv_k8(p, 0, 2, 1) - kvg_kv_k8(p, 0, 1, 0) == (ptrdiff_t)(3 * i8_head), "int8 heads back to back");
    ok((unsigned char *)kvg_kv_vscale(p, 0, 2, 1) + 16 * 4 <= (unsigned char *)kvg_kv_k(p, 1, 0, 0) &&
       (unsigned char *)kvg_kv_k(p, 1, 0, 0) - (unsigned char *)p->data == 57 * 64,
       "the last scales end inside the block; the next block at the stride");
    ok(((uintptr_t)kvg_kv_kscale(p, 1, 2, 1) & 3) == 0, "scales float-aligned");
    is_int((long)kvg_kv_xfer_bytes(p), 57 * 64, "a block's transfer is its stride");
    kvg_kv_pool_free(p);

    g.full_layers = 3;
    is_int(kvg_kv_block_bytes(&g), 97 * 64, "full_layers = n_layers: the F32 block");
    g.full_layers = 99;
    is_int(kvg_kv_block_bytes(&g), 97 * 64, "full_layers > n_layers: the F32 block");
    g.full_layers = 0;
    /* 6 x 384 = 2304 bytes = 36 lines -> 37 */
    is_int(kvg_kv_block_bytes(&g), 37 * 64, "full_layers 0: every layer int8");
    g.full_layers = -1;
    is_int(kvg_kv_block_bytes(&g), 0, "negative full_layers: invalid");
    g.full_layers = 0;
    g.dtype = 7;
    is_int(kvg_kv_block_bytes(&g), 0, "unknown dtype: invalid");
    ok(kvg_kv_pool_new(&g, 1, err, sizeof err) == NULL && strstr(err, "geometry"), "unknown dtype refused");

    /* head_dim 5, block 5: the int8 arrays are padded to 16 bytes */
    g = geom(1, 1, 5, 5);
    g.dtype = KVG_KV_INT8;
    p = kvg_kv_pool_new(&g, 1, err, sizeof err);
    ok(p && kvg_kv_v8(p, 0, 0, 0) - kvg_kv_k8(p, 0, 0, 0) == 32 &&
       (unsigned char *)kvg_kv_kscale(p, 0, 0, 0) - (unsigned char *)kvg_kv_k8(p, 0, 0, 0) == 64,
       "odd sizes: int8 arrays padded to 16 bytes");
    kvg_kv_pool_free(p);

    {
        /* scale = max|x| / 127, x / scale to nearest even, the extremes +-127 */
        float x[6] = { 1.27f, -1.27f, 0.005f, 0.015f, 0.635f, -0.0f }, s;
        int8_t q[12];
        memset(q, 0x55, sizeof q);
        s = kvg_kv_quantize(x, 6, q, 2);
        ok(s == 1.27f / 127.0f, "scale = max|x| / 127");
        ok(q[0] == 127 && q[2] == -127 && q[10] == 0 && q[1] == 0x55, "the extremes +-127, the stride kept");
        ok(q[4] == (int8_t)lrintf(0.005f / s) && q[6] == (int8_t)lrintf(0.015f / s) && q[8] == (int8_t)lrintf(0.635f / s),
           "x / scale rounded to nearest (%d %d %d)", q[4], q[6], q[8]);
        float z[4] = { 0.0f, -0.0f, 0.0f, 0.0f };
        memset(q, 0x55, sizeof q);
        s = kvg_kv_quantize(z, 4, q, 1);
        ok(s == 0.0f && q[0] == 0 && q[1] == 0 && q[2] == 0 && q[3] == 0, "the zero vector: scale 0, codes 0");
        /* ties to even: x / scale exactly k + 0.5 */
        float t[3] = { 127.0f, 2.5f, -3.5f };
        kvg_kv_quantize(t, 3, q, 1);
        ok(q[1] == 2 && q[2] == -4, "ties to even (2.5 -> 2, -3.5 -> -4)");
    }
}

static void test_allocator(void)
{
    char err[256];
    kvg_kv_geom g = geom(1, 1, 4, 4);
    kvg_kv_pool *p = kvg_kv_pool_new(&g, 3, err, sizeof err);
    int32_t a, b, c;

    is_int(kvg_kv_pool_free_blocks(p), 3, "3 free blocks");
    a = kvg_kv_block_alloc(p);
    b = kvg_kv_block_alloc(p);
    c = kvg_kv_block_alloc(p);
    ok(a == 0 && b == 1 && c == 2, "allocation order is deterministic (0, 1, 2)");
    is_int(kvg_kv_block_alloc(p), -1, "exhausted pool -> -1");
    is_int(kvg_kv_block_refcount(p, a), 1, "new block has refcount 1");
    is_int(kvg_kv_block_ref(p, a), 2, "ref -> 2");
    is_int(kvg_kv_block_unref(p, a), 1, "unref -> 1");
    is_int(kvg_kv_pool_free_blocks(p), 0, "still none free");
    is_int(kvg_kv_block_unref(p, b), 0, "unref -> 0 frees");
    is_int(kvg_kv_pool_free_blocks(p), 1, "one free");
    is_int(kvg_kv_block_unref(p, b), -1, "unref of a free block -> -1");
    is_int(kvg_kv_block_ref(p, b), -1, "ref of a free block -> -1");
    is_int(kvg_kv_block_ref(p, 7), -1, "ref out of range -> -1");
    is_int(kvg_kv_block_unref(p, -1), -1, "unref out of range -> -1");
    is_int(kvg_kv_block_refcount(p, 99), -1, "refcount out of range -> -1");
    is_int(kvg_kv_block_alloc(p), b, "freed block is reused");
    kvg_kv_block_unref(p, a);
    kvg_kv_block_unref(p, b);
    kvg_kv_block_unref(p, c);
    is_int(kvg_kv_pool_free_blocks(p), 3, "all free again");
    kvg_kv_pool_free(p);
}

static void test_sequences(void)
{
    char err[256];
    kvg_kv_geom g = geom(2, 1, 4, 4);
    kvg_kv_pool *p = kvg_kv_pool_new(&g, 6, err, sizeof err);
    kvg_kv_seq s, f, e;
    int32_t b0, b1;

    kvg_kv_seq_init(&s);
    kvg_kv_seq_init(&e);
    ok(kvg_kv_seq_prepare(p, &s, 0, err, sizeof err) == 0 && s.n_blocks == 0, "prepare 0: nothing");
    ok(kvg_kv_seq_prepare(p, &s, 6, err, sizeof err) == 0, "prepare 6 tokens");
    is_int(s.n_blocks, 2, "  2 blocks of 4");
    is_int(s.n_tokens, 0, "  n_tokens is advanced by the caller");
    s.n_tokens = 6;
    ok(kvg_kv_seq_prepare(p, &s, 2, err, sizeof err) == 0 && s.n_blocks == 2, "2 more fit the partial block");
    s.n_tokens = 8;
    ok(kvg_kv_seq_prepare(p, &s, 1, err, sizeof err) == 0 && s.n_blocks == 3, "the 9th token takes a block");
    s.n_tokens = 9;
    is_int(kvg_kv_pool_free_blocks(p), 3, "3 left");
    fill_block(p, s.blocks[2], 100.0f);

    /* Fork: shares every block. */
    kvg_kv_seq_init(&f);
    ok(kvg_kv_seq_fork(p, &s, &f, err, sizeof err) == 0, "fork");
    ok(f.n_blocks == 3 && f.n_tokens == 9 && memcmp(f.blocks, s.blocks, 3 * sizeof(int32_t)) == 0,
       "fork shares the same block table");
    for (int i = 0; i < 3; i++)
        is_int(kvg_kv_block_refcount(p, s.blocks[i]), 2, "  block %d refcount 2", i);
    is_int(kvg_kv_pool_free_blocks(p), 3, "fork takes no block");
    ok(kvg_kv_seq_fork(p, &s, &f, err, sizeof err) == -1 && strstr(err, "non-empty"),
       "fork into a non-empty sequence refused");

    /* Copy on write of the shared partial block. */
    b1 = s.blocks[2];
    ok(kvg_kv_seq_prepare(p, &f, 1, err, sizeof err) == 0, "prepare a write into the shared partial block");
    ok(f.blocks[2] != b1, "  the writer got its own copy");
    ok(f.blocks[0] == s.blocks[0] && f.blocks[1] == s.blocks[1], "  full blocks stay shared");
    ok(block_has(p, f.blocks[2], 100.0f), "  the copy has the contents");
    is_int(kvg_kv_block_refcount(p, b1), 1, "  original back to refcount 1");
    is_int(kvg_kv_block_refcount(p, f.blocks[2]), 1, "  copy refcount 1");
    f.n_tokens = 10;
    /* The other one now writes in place: its block is no longer shared. */
    ok(kvg_kv_seq_prepare(p, &s, 1, err, sizeof err) == 0 && s.blocks[2] == b1, "sole owner writes in place");
    s.n_tokens = 10;
    is_int(kvg_kv_pool_free_blocks(p), 2, "2 free");

    /* Appending at a block boundary never copies the shared full blocks. */
    b0 = s.blocks[0];
    f.n_tokens = 12;
    ok(kvg_kv_seq_prepare(p, &f, 4, err, sizeof err) == 0 && f.n_blocks == 4 && f.blocks[0] == b0,
       "append a block after shared full blocks");
    f.n_tokens = 16;
    is_int(kvg_kv_pool_free_blocks(p), 1, "1 free");

    /* Failure changes nothing. */
    {
        int32_t nb = f.n_blocks, first = f.blocks[0];
        ok(kvg_kv_seq_prepare(p, &f, 9, err, sizeof err) == -1 && strstr(err, "out of blocks"),
           "prepare past the pool fails (%s)", err);
        ok(f.n_blocks == nb && f.blocks[0] == first && f.n_tokens == 16, "  sequence unchanged");
        is_int(kvg_kv_pool_free_blocks(p), 1, "  pool unchanged");
        ok(kvg_kv_seq_prepare(p, &f, -1, err, sizeof err) == -1, "negative count refused");
    }

    /* Truncate into a shared block keeps it shared; the next write copies it. */
    kvg_kv_seq_truncate(p, &f, 6);
    ok(f.n_tokens == 6 && f.n_blocks == 2, "truncate to 6 keeps 2 blocks");
    is_int(kvg_kv_pool_free_blocks(p), 3, "  2 blocks released");
    is_int(kvg_kv_block_refcount(p, f.blocks[1]), 2, "  block 1 still shared with s");
    ok(kvg_kv_seq_prepare(p, &f, 1, err, sizeof err) == 0 && f.blocks[1] != s.blocks[1],
       "  writing into it copies");
    kvg_kv_seq_truncate(p, &f, 100);
    is_int(f.n_tokens, 6, "truncate past the end changes nothing");
    kvg_kv_seq_truncate(p, &f, 0);
    ok(f.n_tokens == 0 && f.n_blocks == 0, "truncate to 0 releases every block");

    kvg_kv_seq_release(p, &f);
    kvg_kv_seq_release(p, &s);
    kvg_kv_seq_release(p, &e);
    ok(s.blocks == NULL && s.n_blocks == 0 && s.n_tokens == 0, "release empties the sequence");
    is_int(kvg_kv_pool_free_blocks(p), 6, "every block back in the pool");
    kvg_kv_pool_free(p);
}

/* Many sequences sharing a prefix: refcounts add up, and releasing in any order
 * returns every block exactly once. */
static void test_many_forks(void)
{
    char err[256];
    kvg_kv_geom g = geom(1, 1, 2, 16);
    kvg_kv_pool *p = kvg_kv_pool_new(&g, 64, err, sizeof err);
    kvg_kv_seq root, kids[8];
    int all_ok = 1;

    kvg_kv_seq_init(&root);
    kvg_kv_seq_prepare(p, &root, 40, err, sizeof err);
    root.n_tokens = 40;
    for (int i = 0; i < 8; i++) {
        kvg_kv_seq_init(&kids[i]);
        all_ok &= kvg_kv_seq_fork(p, &root, &kids[i], err, sizeof err) == 0;
        all_ok &= kvg_kv_seq_prepare(p, &kids[i], 30, err, sizeof err) == 0;
        kids[i].n_tokens += 30;
    }
    ok(all_ok, "8 forks of a 40-token root, each appending 30");
    is_int(kvg_kv_block_refcount(p, root.blocks[0]), 9, "first block shared 9 ways");
    is_int(kvg_kv_block_refcount(p, root.blocks[2]), 1, "root's partial block: copied by every child");
    /* root: 3 blocks; each child: copy of block 2 + 2 new (tokens 48..69) = 3 */
    is_int(kvg_kv_pool_free_blocks(p), 64 - 3 - 8 * 3, "block count adds up");
    kvg_kv_seq_release(p, &root);
    for (int i = 7; i >= 0; i -= 2)
        kvg_kv_seq_release(p, &kids[i]);
    for (int i = 0; i < 8; i += 2)
        kvg_kv_seq_release(p, &kids[i]);
    is_int(kvg_kv_pool_free_blocks(p), 64, "all released");
    kvg_kv_pool_free(p);
}

static int copies;
static void count_copy(void *ctx, void *storage, size_t block_bytes, int32_t dst, int32_t src)
{
    (void)ctx;
    memcpy((char *)storage + (size_t)dst * block_bytes, (char *)storage + (size_t)src * block_bytes,
           block_bytes);
    copies++;
}

static void test_external_storage(void)
{
    char err[256];
    kvg_kv_geom g = geom(1, 1, 2, 4);
    static float storage[4 * 2 * 2 * 4] __attribute__((aligned(64)));
    kvg_kv_pool *p;
    kvg_kv_seq a, b;

    ok(kvg_kv_pool_new_ext(&g, 4, NULL, NULL, NULL, err, sizeof err) == NULL, "ext pool needs storage");
    p = kvg_kv_pool_new_ext(&g, 4, storage, count_copy, NULL, err, sizeof err);
    ok(p && p->data == storage, "pool over caller storage");
    kvg_kv_seq_init(&a);
    kvg_kv_seq_init(&b);
    kvg_kv_seq_prepare(p, &a, 2, err, sizeof err);
    a.n_tokens = 2;
    kvg_kv_seq_fork(p, &a, &b, err, sizeof err);
    kvg_kv_seq_prepare(p, &b, 1, err, sizeof err);
    is_int(copies, 1, "copy-on-write goes through the pool's copy function");
    kvg_kv_seq_release(p, &a);
    kvg_kv_seq_release(p, &b);
    kvg_kv_pool_free(p);
}

int main(void)
{
    test_geometry();
    test_int8_layout();
    test_allocator();
    test_sequences();
    test_many_forks();
    test_external_storage();
    return done_testing();
}
