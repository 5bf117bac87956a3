/* int8 KV on the CUDA kernels (--kv-dtype int8; kernels/kvg_kernels.h's layout), run
 * through the emulated runtime under seeds 1, 2 and 3:
 *   - kv_write and the fused rope_kv_write store an int8 layer's rows as the CPU's
 *     kvg_kv_quantize does, bit for bit (int8 values and float scales; ties to even, a
 *     zero vector, outliers), the BF16 layers of the same pool as before, and nothing else;
 *   - attention over an int8 layer = a double-precision reference over the dequantized
 *     values (q * scale) within 5e-6 of the row-head's largest |output| (measured: under
 *     1e-6; F32 accumulation over 75 keys);
 *   - invariance, exact bits: a row alone as a decode item = the same row inside prefill
 *     tiles of 3 and 16 rows, with a window too; blocks copied by copy_blocks read as the
 *     source blocks; head_dim 8, 16, 128 and 256 (one or two words of 4 int8 a lane). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kv_cache.h"
#include "kvg_kernels.h"

static const cudaStream_t S0 = 0;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* uniform in [-1, 1) */
static float rnd_f(void)
{
    return (float)(rnd32() & 0xffffff) / 8388608.0f - 1.0f;
}

static void *dev_alloc(size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n ? n : 16) != cudaSuccess) {
        ok(0, "cudaMalloc(%zu)", n);
        exit(done_testing());
    }
    return p;
}

static void *dev_from(const void *h, size_t n)
{
    void *p = dev_alloc(n);
    if (n && cudaMemcpy(p, h, n, cudaMemcpyHostToDevice) != cudaSuccess) {
        ok(0, "cudaMemcpy to the device");
        exit(done_testing());
    }
    return p;
}

static void to_host(void *h, const void *d, size_t n)
{
    if (n && cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        ok(0, "cudaMemcpy to the host");
        exit(done_testing());
    }
}

static uint16_t bf16_rne(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The geometry the CUDA backend makes for n_layers with the last n_i8 int8. */
static kvg_k_kv_geom make_geom(int n_layers, int n_i8, int n_kv, int hd, int bt, int n_blocks)
{
    kvg_k_kv_geom g;
    memset(&g, 0, sizeof g);
    g.n_layers = n_layers;
    g.n_kv_heads = n_kv;
    g.head_dim = hd;
    g.block_tokens = bt;
    g.n_blocks = n_blocks;
    g.head_elems = 2 * (int64_t)bt * hd;
    g.layer_elems = n_kv * g.head_elems;
    g.n_i8 = n_i8;
    g.head_bytes_i8 = 2 * (int64_t)bt * hd + 8 * (int64_t)bt;
    g.i8_off = 2 * (int64_t)(n_layers - n_i8) * g.layer_elems;
    g.block_elems = (int64_t)(kvg_k_kv_block_bytes(n_layers, n_i8, n_kv, hd, bt) / 2);
    return g;
}

/* The host's view of an int8 (block, layer, head). */
static unsigned char *i8_head(const kvg_k_kv_geom *g, unsigned char *pool, int b, int layer, int h)
{
    return pool + 2 * (int64_t)b * g->block_elems + g->i8_off +
           ((int64_t)(layer - (g->n_layers - g->n_i8)) * g->n_kv_heads + h) * g->head_bytes_i8;
}

/* What the kernels must store for row r of k/v ([rows][n_kv * hd]) at slot on `layer`:
 * the CPU's kvg_kv_quantize of each (row, head) for an int8 layer, BF16 otherwise. */
static void ref_store(const kvg_k_kv_geom *g, unsigned char *pool, int layer, const float *k, const float *v,
                      int r, int32_t slot)
{
    const int hd = g->head_dim, bt = g->block_tokens, b = slot / bt, t = slot % bt;
    for (int h = 0; h < g->n_kv_heads; h++) {
        const float *kr = k + ((size_t)r * g->n_kv_heads + h) * hd, *vr = v + ((size_t)r * g->n_kv_heads + h) * hd;
        if (kvg_k_layer_int8(g, layer)) {
            unsigned char *base = i8_head(g, pool, b, layer, h);
            float ks = kvg_kv_quantize(kr, hd, (int8_t *)(base + (size_t)t * hd), 1);
            float vs = kvg_kv_quantize(vr, hd, (int8_t *)(base + (size_t)(bt + t) * hd), 1);
            memcpy(base + 2 * (size_t)bt * hd + 4 * (size_t)t, &ks, 4);
            memcpy(base + 2 * (size_t)bt * hd + 4 * (size_t)(bt + t), &vs, 4);
        } else {
            uint16_t *base = (uint16_t *)(void *)pool + (int64_t)b * g->block_elems + (int64_t)layer * g->layer_elems +
                             (int64_t)h * g->head_elems;
            for (int d = 0; d < hd; d++) {
                base[t * hd + d] = bf16_rne(kr[d]);
                base[(bt + t) * hd + d] = bf16_rne(vr[d]);
            }
        }
    }
}

/* Rows with the cases that matter: random, a zero vector, exact halves (ties to even:
 * max 127 makes scale 1), one outlier among tiny values, negative extremes. */
static void fill_rows(float *x, int rows, int w, int hd)
{
    for (int i = 0; i < rows * w; i++)
        x[i] = rnd_f() * 3.0f;
    if (rows < 4 || w < 2 * hd)
        return;
    memset(x + w, 0, sizeof(float) * (size_t)hd);                 /* row 1, head 0: zeros */
    for (int d = 0; d < hd; d++)                                   /* row 2, head 0: ties */
        x[2 * w + d] = d == 0 ? 127.0f : (float)(d % 9) - 4.5f;
    for (int d = 0; d < hd; d++)                                   /* row 3, head 1: outlier */
        x[3 * w + hd + d] = d == 5 ? -1000.0f : rnd_f() * 1e-3f;
}

static void test_write(void)
{
    /* 4 layers, the last 2 int8; head_dim 12 (3 words), 3 kv heads, 4 tokens a block */
    kvg_k_kv_geom g = make_geom(4, 2, 3, 12, 4, 6);
    const size_t bytes = (size_t)g.n_blocks * 2 * (size_t)g.block_elems;
    const int rows = 5, w = g.n_kv_heads * g.head_dim;
    int32_t slot[5] = { 2 * 4 + 1, 5 * 4 + 3, 0, 2 * 4 + 2, 3 * 4 + 0 };
    unsigned char *pool = malloc(bytes), *got = malloc(bytes);
    float *k = malloc(sizeof(float) * rows * w), *v = malloc(sizeof(float) * rows * w);
    float cs[5 * 6 * 2], q[5 * 6 * 12];
    for (size_t i = 0; i < bytes; i++)
        pool[i] = (unsigned char)rnd32();
    void *d_pool = dev_from(pool, bytes);
    int32_t *d_slot = dev_from(slot, sizeof slot);

    ok(kvg_k_kv_block_bytes(4, 2, 3, 12, 4) == 2u * 3u * 4u * 4u * 12u + 2u * 3u * (2u * 4u * 12u + 32u) &&
       kvg_k_kv_block_bytes(4, 0, 3, 12, 4) == 4u * 3u * 4u * 4u * 12u && kvg_k_kv_block_bytes(4, 1, 3, 10, 4) == 0,
       "block bytes: BF16 layers then int8 ones (K, V, two float scales a token); int8 needs head_dim %% 4");

    for (int layer = 0; layer < g.n_layers; layer++) {
        fill_rows(k, rows, w, g.head_dim);
        fill_rows(v, rows, w, g.head_dim);
        float *d_k = dev_from(k, sizeof(float) * rows * w), *d_v = dev_from(v, sizeof(float) * rows * w);
        cudaError_t e = kvg_k_kv_write(S0, d_pool, &g, layer, d_k, d_v, d_slot, rows);
        for (int r = 0; r < rows; r++)
            ref_store(&g, pool, layer, k, v, r, slot[r]);
        to_host(got, d_pool, bytes);
        ok(e == cudaSuccess && !memcmp(got, pool, bytes),
           "kv_write, layer %d (%s): the stored bytes are the CPU's (kvg_kv_quantize), nothing else touched", layer,
           kvg_k_layer_int8(&g, layer) ? "int8" : "BF16");
        cudaFree(d_k);
        cudaFree(d_v);
    }

    /* The fused RoPE + write: the rotated k quantized as kv_write would (identity rotation
     * with cos 1, sin 0 keeps k as given, so the reference is the CPU's quantize of k). */
    for (int i = 0; i < 5 * 6; i++) {
        cs[2 * i] = 1.0f;
        cs[2 * i + 1] = 0.0f;
    }
    for (int i = 0; i < 5 * 6 * 12; i++)
        q[i] = rnd_f();
    fill_rows(k, rows, w, g.head_dim);
    fill_rows(v, rows, w, g.head_dim);
    {
        float *d_k = dev_from(k, sizeof(float) * rows * w), *d_v = dev_from(v, sizeof(float) * rows * w);
        float *d_q = dev_from(q, sizeof q), *d_cs = dev_from(cs, sizeof cs);
        cudaError_t e = kvg_k_rope_kv_write(S0, d_q, d_k, d_cs, NULL, rows, 6, 12, 12, 0, d_pool, &g, 3, d_v, d_slot);
        for (int r = 0; r < rows; r++)
            ref_store(&g, pool, 3, k, v, r, slot[r]);
        to_host(got, d_pool, bytes);
        ok(e == cudaSuccess && !memcmp(got, pool, bytes), "rope_kv_write on an int8 layer: the CPU's bytes");
        cudaFree(d_k);
        cudaFree(d_v);
        cudaFree(d_q);
        cudaFree(d_cs);
    }
    {
        kvg_k_kv_geom bad = make_geom(2, 1, 1, 6, 4, 2);
        bad.block_elems = 64;
        ok(kvg_k_kv_write(S0, d_pool, &bad, 1, (float *)d_pool, (float *)d_pool, d_slot, 1) == cudaErrorInvalidValue,
           "kv_write refuses an int8 layer with head_dim %% 4 != 0");
        (void)cudaGetLastError();
    }
    cudaFree(d_pool);
    cudaFree(d_slot);
    free(pool);
    free(got);
    free(k);
    free(v);
}

/* ---- attention ------------------------------------------------------------------------ */

#define NH 4        /* query heads */
#define NKV 2       /* kv heads (GQA 2) */
static int HD = 16;  /* head_dim: each of test_attention's shapes */
#define BT 8
#define SPLIT 32
#define LEN 75      /* positions of the one sequence */
#define NBLK ((LEN + BT - 1) / BT)

typedef struct world {
    kvg_k_kv_geom g;
    int layer;
    unsigned char *pool;         /* host copy */
    void *d_pool;
    int32_t table[NBLK];
    float *q;                    /* [LEN][NH * HD] */
} world;

/* Runs rows [first, first + n) of the sequence as one step cut into tiles of `tile` rows;
 * out[n][NH * HD]. window: the layer's sliding window (0: none). */
static cudaError_t run_rows(const world *W, const int32_t *table, int first, int n, int tile, int window, float *out)
{
    int32_t pos[LEN], row_seq[LEN], row_part[LEN], table_off[1] = { 0 };
    kvg_k_attn_item items[LEN * 4];
    int n_items = 0, parts = 0;
    for (int i = 0; i < n; i++) {
        pos[i] = first + i;
        row_seq[i] = 0;
        row_part[i] = parts;
        parts += pos[i] / SPLIT + 1;
    }
    for (int r0 = 0; r0 < n; r0 += tile) {
        int nr = n - r0 < tile ? n - r0 : tile;
        for (int j = 0; j <= pos[r0 + nr - 1] / SPLIT; j++)
            items[n_items++] = (kvg_k_attn_item){ .seq = 0, .row0 = r0, .n_rows = nr, .split = j };
    }
    int32_t *d_pos = dev_from(pos, sizeof pos), *d_seq = dev_from(row_seq, sizeof row_seq);
    int32_t *d_part = dev_from(row_part, sizeof row_part), *d_off = dev_from(table_off, sizeof table_off);
    int32_t *d_tab = dev_from(table, sizeof(int32_t) * NBLK);
    kvg_k_attn_item *d_items = dev_from(items, sizeof(kvg_k_attn_item) * (size_t)n_items);
    float *d_q = dev_from(W->q + (size_t)first * NH * HD, sizeof(float) * (size_t)n * NH * HD);
    float *d_out = dev_alloc(sizeof(float) * (size_t)n * NH * HD);
    float *d_partials = dev_alloc(sizeof(float) * (size_t)parts * NH * (HD + 2));
    kvg_k_attn_args a;
    memset(&a, 0, sizeof a);
    a.pool = W->d_pool;
    a.g = W->g;
    a.layer = W->layer;
    a.q = d_q;
    a.n_heads = NH;
    a.n_rows = n;
    a.pos = d_pos;
    a.row_seq = d_seq;
    a.tables = d_tab;
    a.table_off = d_off;
    a.items = d_items;
    a.n_items = n_items;
    a.max_tile_rows = tile;
    a.split_tokens = SPLIT;
    a.row_part = d_part;
    a.partials = d_partials;
    a.scale = 1.0f / sqrtf((float)HD);
    a.window = window;
    a.out = d_out;
    cudaError_t e = kvg_k_attention(S0, &a);
    if (e == cudaSuccess)
        to_host(out, d_out, sizeof(float) * (size_t)n * NH * HD);
    cudaFree(d_pos);
    cudaFree(d_seq);
    cudaFree(d_part);
    cudaFree(d_off);
    cudaFree(d_tab);
    cudaFree(d_items);
    cudaFree(d_q);
    cudaFree(d_out);
    cudaFree(d_partials);
    return e;
}

/* The dequantized K or V (kind 0, 1) of (position, kv head, d). */
static double deq(const world *W, int kind, int p, int h, int d)
{
    unsigned char *base = i8_head(&W->g, W->pool, W->table[p / BT], W->layer, h);
    int t = p % BT;
    float s;
    memcpy(&s, base + 2 * BT * HD + 4 * (kind * BT + t), 4);
    return (double)(int8_t)base[(kind * BT + t) * HD + d] * (double)s;
}

/* max |got - ref| / max |ref| over the row's heads, ref in double over the dequantized
 * values. */
static double ref_err(const world *W, int p, int window, const float *got)
{
    double worst = 0.0;
    for (int h = 0; h < NH; h++) {
        int kvh = h / (NH / NKV), lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        double sc[LEN], m = -INFINITY, l = 0.0, o[256], big = 0.0, err = 0.0;
        memset(o, 0, sizeof o);
        for (int j = lo; j <= p; j++) {
            double s = 0.0;
            for (int d = 0; d < HD; d++)
                s += (double)W->q[(size_t)p * NH * HD + h * HD + d] * deq(W, 0, j, kvh, d);
            sc[j] = s / sqrt((double)HD);
            m = sc[j] > m ? sc[j] : m;
        }
        for (int j = lo; j <= p; j++) {
            double e = exp(sc[j] - m);
            l += e;
            for (int d = 0; d < HD; d++)
                o[d] += e * deq(W, 1, j, kvh, d);
        }
        for (int d = 0; d < HD; d++) {
            o[d] /= l;
            big = fabs(o[d]) > big ? fabs(o[d]) : big;
            err = fabs(o[d] - got[h * HD + d]) > err ? fabs(o[d] - got[h * HD + d]) : err;
        }
        err /= big > 0.0 ? big : 1.0;
        worst = err > worst ? err : worst;
    }
    return worst;
}

static void test_attention(int hd)
{
    world *W = calloc(1, sizeof *W);
    HD = hd;
    diag("head_dim %d", hd);
    W->q = malloc(sizeof(float) * LEN * NH * HD);
    const int n_blocks = NBLK * 2 + 1;
    W->g = make_geom(3, 2, NKV, HD, BT, n_blocks);
    W->layer = 2;
    const size_t bytes = (size_t)n_blocks * 2 * (size_t)W->g.block_elems;
    W->pool = calloc(1, bytes);
    W->d_pool = dev_from(W->pool, bytes);
    for (int i = 0; i < NBLK; i++)
        W->table[i] = 2 * i + 1;               /* scattered blocks */
    for (int p = 0; p < LEN; p++)
        for (int i = 0; i < NH * HD; i++)
            W->q[(size_t)p * NH * HD + i] = rnd_f() * 2.0f;

    /* K/V of every position through kv_write (the path the backend takes) */
    {
        const int w = NKV * HD;
        float *k = malloc(sizeof(float) * LEN * w), *v = malloc(sizeof(float) * LEN * w);
        int32_t slot[LEN];
        for (int i = 0; i < LEN * w; i++) {
            k[i] = rnd_f() * 2.0f;
            v[i] = rnd_f();
        }
        for (int p = 0; p < LEN; p++)
            slot[p] = W->table[p / BT] * BT + p % BT;
        float *d_k = dev_from(k, sizeof(float) * LEN * w), *d_v = dev_from(v, sizeof(float) * LEN * w);
        int32_t *d_slot = dev_from(slot, sizeof slot);
        ok(kvg_k_kv_write(S0, W->d_pool, &W->g, W->layer, d_k, d_v, d_slot, LEN) == cudaSuccess,
           "attention: %d positions written to the int8 layer", LEN);
        to_host(W->pool, W->d_pool, bytes);
        cudaFree(d_k);
        cudaFree(d_v);
        cudaFree(d_slot);
        free(k);
        free(v);
    }

    static const int windows[] = { 0, 21 };
    for (size_t wi = 0; wi < sizeof windows / sizeof *windows; wi++) {
        const int win = windows[wi];
        const size_t row = (size_t)NH * HD;
        float *alone = malloc(sizeof(float) * LEN * row), *tiled = malloc(sizeof(float) * LEN * row);
        int bad = 0;
        double worst = 0.0;
        for (int p = 0; p < LEN && !bad; p++) {
            bad |= run_rows(W, W->table, p, 1, 1, win, alone + p * row) != cudaSuccess;
            double e = ref_err(W, p, win, alone + p * row);
            worst = e > worst ? e : worst;
        }
        ok(!bad && worst <= 5e-6,
           "int8 attention (head_dim %d, window %d) = the dequantized reference (max rel err %.3g <= 5e-6)", HD, win,
           worst);
        static const int tiles[] = { 3, 16 };
        for (size_t ti = 0; ti < sizeof tiles / sizeof *tiles; ti++) {
            /* the sequence as a prefill from position 5 (rows 0..4 its cached prefix) */
            bad = run_rows(W, W->table, 5, LEN - 5, tiles[ti], win, tiled + 5 * row) != cudaSuccess;
            ok(!bad && !memcmp(tiled + 5 * row, alone + 5 * row, sizeof(float) * (LEN - 5) * row),
               "int8 attention (window %d): rows in prefill tiles of %d = each row alone, bit for bit", win,
               tiles[ti]);
        }
        /* copy-on-write: the blocks copied elsewhere read as the originals */
        if (wi == 0) {
            int32_t pairs[2 * NBLK], table2[NBLK];
            for (int i = 0; i < NBLK; i++) {
                table2[i] = i == NBLK - 1 ? 2 * NBLK : 2 * i;   /* the even blocks, and the spare */
                pairs[2 * i] = table2[i];
                pairs[2 * i + 1] = W->table[i];
            }
            int32_t *d_pairs = dev_from(pairs, sizeof pairs);
            cudaError_t e = kvg_k_copy_blocks(S0, W->d_pool, &W->g, d_pairs, NBLK);
            bad = e != cudaSuccess || run_rows(W, table2, 0, LEN, 16, 0, tiled) != cudaSuccess;
            ok(!bad && !memcmp(tiled, alone, sizeof(float) * LEN * row),
               "int8 attention on blocks copied by copy_blocks = on the originals");
            cudaFree(d_pairs);
        }
        free(alone);
        free(tiled);
    }
    cudaFree(W->d_pool);
    free(W->pool);
    free(W->q);
    free(W);
}

int main(void)
{
    static const char *const seeds[] = { "1", "2", "3" };
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) {
        diag("KVG_EMU_SEED=%s", seeds[i]);
        setenv("KVG_EMU_SEED", seeds[i], 1);
        test_write();
        test_attention(16);
        test_attention(8);
        test_attention(128);    /* 32 words a row: one per lane */
        test_attention(256);    /* two words a lane */
    }
    return done_testing();
}
