/* Paged causal attention on the CPU.
 *
 * One work item is one (query head, row). Its result depends only on the row's query
 * and the K/V at positions [0, pos] of its sequence, computed in an order fixed by
 * positions alone (never by blocks, chunks, the batch or threads):
 *
 *   s_j    = (q . k_j: one FMA chain over d = 0..hd-1) / sqrt(hd)
 *   m      = max_j s_j
 *   e_j    = kvg_attn_exp(s_j - m)  (attention_kernels.h)
 *   sum    = 16 lanes (lane = j mod 16, each a chain over j ascending), then the fixed
 *            pairwise reduction of the GEMM
 *   out[d] = (FMA chain over j ascending of e_j v_j[d]) / sum
 *
 * The kernels compute exactly these chains -- elementwise FMAs over 16 keys at once
 * from the dimension-major K of a block, over head_dim outputs at once for V, and a
 * polynomial exp built from exactly rounded operations -- so the AVX-512, AVX2 and
 * generic versions give the same bits (t/unit/engine_attention_kernels.c compares the
 * kernels, AVX-512 emulated where the CPU lacks it; t/unit/engine_forward.c whole
 * forward passes under every ISA the CPU has). The kernels contain no a*b+c expression
 * other than explicit fmaf, which the compiler could otherwise contract differently per
 * ISA.
 *
 * The family's variations keep these chains: a sliding-window layer starts them at the
 * 16-key group holding its first visible position (p - window + 1), the positions of
 * that group before it masked (-inf: weight exactly 0); soft-capping (Gemma 2) replaces
 * each scaled score s by cap tanh(s / cap) before the softmax, which then divides by 1;
 * the scale is 1/sqrt(attn_query_scalar) where the family sets one; an attention sink
 * (gpt-oss: a learned logit per head, on the scaled scores' scale) joins the maximum m
 * and adds exp(sink - m) to the sum after its lanes' reduction -- in the kernels' shared
 * scalar code, so every ISA computes it alike -- and weighs no value. All depend on the
 * position alone.
 *
 * An int8 layer of the KV pool (--kv-dtype int8, kv_cache.h) runs the same chains over
 * the stored int8 values made float (exactly), then s_j is that chain times K's scale of
 * position j (one multiply, before the division), and the V chain's weight is
 * e_j times V's scale of j (one multiply; the sum stays that of the e_j). The kernels
 * read the stored bytes themselves (the _i8 ones), so what attention sees is what the
 * block holds, whether it was written in this step or long ago: a cache hit gives a
 * miss's bits.
 *
 * The rows of one sequence in a step (a prefill, a cached prompt's recomputed tail) read
 * the same K and V. Done one item at a time, every load of them comes from L2 and the
 * FMAs wait on it; so KVG_ATTN_ROWS items of one head and consecutive rows of one
 * sequence go through the rows' kernels together (attend_rows), one load serving every
 * row, each row still computing exactly its own chains above. */
#include "cpu_context.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention_kernels.h"
#include "cpu/gemm.h"

/* A partial group of n < 16 keys: the same chains, one key at a time (k: floats, or
 * int8 when i8). */
static void scores_tail(const float *q, const void *k, int i8, int bt, int hd, int n, float *out)
{
    for (int l = 0; l < n; l++) {
        float a = 0.0f;
        for (int d = 0; d < hd; d++) {
            size_t at = (size_t)d * bt + (size_t)l;
            a = fmaf(q[d], i8 ? (float)((const int8_t *)k)[at] : ((const float *)k)[at], a);
        }
        out[l] = a;
    }
}

static kvg_attn_kernels kernels;
static pthread_once_t kernels_once = PTHREAD_ONCE_INIT;

/* The same ISA level as the GEMM (which honours KVG_GEMM_ISA), chosen once. */
static void pick_kernels(void)
{
    const kvg_attn_kernels *k = kvg_attn_kernels_isa(kvg_gemm_isa());
    kernels = *(k ? k : kvg_attn_kernels_isa("generic"));
}

const kvg_attn_kernels *kvg_cpu_kernels(void)
{
    pthread_once(&kernels_once, pick_kernels);
    return &kernels;
}

typedef struct attn_job {
    kvg_cpu *c;
    kvg_kv_pool *kv;
    int layer;
    const float *q;
    float *out;
    size_t n_items;              /* n_heads * n_rows */
    int n_chunks;
    kvg_attn_kernels k;
    int window;                  /* the layer's sliding window; 0: none */
    float div;                   /* scores are q.k / div */
    float softcap;               /* 0: none */
    const float *sinks;          /* [n_heads] the layer's sinks; NULL: none */
    int i8;                      /* the layer's K and V are int8 (kv_cache.h) */
} attn_job;

/* Column j0 of the K of (block, kv head g): float or int8 as the layer stores it. */
static const unsigned char *k_at(const attn_job *j, int32_t block, int g, int j0)
{
    return kvg_kv_head(j->kv, block, j->layer, g) + (size_t)j0 * (j->i8 ? 1u : sizeof(float));
}

/* The scores of n (4 or 1) groups of 16 keys (grp[i]: k_at's pointers). */
static void scores_n(const attn_job *j, const float *q, const unsigned char *const *grp, int n, float *out)
{
    int hd = j->c->m->cfg.head_dim, bt = j->kv->geom.block_tokens;
    if (j->i8) {
        const int8_t *k[4];
        for (int i = 0; i < n; i++)
            k[i] = (const int8_t *)grp[i];
        (n == 4 ? j->k.scores4_i8 : j->k.scores1_i8)(q, k, bt, hd, out);
    } else {
        const float *k[4];
        for (int i = 0; i < n; i++)
            k[i] = (const float *)(const void *)grp[i];
        (n == 4 ? j->k.scores4 : j->k.scores1)(q, k, bt, hd, out);
    }
}

/* x[t] *= the scale of position t (K's or V's: which = kvg_kv_kscale / vscale) for t in
 * [from, T): an int8 layer's scores and weights; nothing for an F32 layer. */
static void apply_scales(const attn_job *j, float *(*which)(const kvg_kv_pool *, int32_t, int, int),
                         const int32_t *blocks, int g, int from, int T, float *x)
{
    int bt = j->kv->geom.block_tokens;
    if (!j->i8)
        return;
    for (int b = from / bt; b * bt < T; b++) {
        const float *s = which(j->kv, blocks[b], j->layer, g);
        int lo = b * bt > from ? b * bt : from, hi = (b + 1) * bt < T ? (b + 1) * bt : T;
        for (int t = lo; t < hi; t++)
            x[t] = x[t] * s[t - b * bt];
    }
}

/* Scores sc[from..T) of one row (from: the first position of a 16-key group): full
 * groups four at a time where they cover consecutive positions, then the partial one. */
static void score_keys(const attn_job *j, const float *q, const int32_t *blocks, int g, int from, int T,
                       float *sc)
{
    int hd = j->c->m->cfg.head_dim, bt = j->kv->geom.block_tokens;
    const unsigned char *grp[4];
    int ng = 0, first = 0;
    for (int b = from / bt; b * bt < T; b++) {
        int n = T - b * bt < bt ? T - b * bt : bt;
        for (int j0 = b * bt < from ? from - b * bt : 0; j0 < n; j0 += 16) {
            int pos0 = b * bt + j0;
            const unsigned char *kj = k_at(j, blocks[b], g, j0);
            if (n - j0 < 16) {
                /* Inside a block the vector kernel may read the not yet written
                 * slots: every lane is its own chain, the extra ones are dropped
                 * (sc has room for them). */
                if (j0 + 16 <= bt)
                    scores_n(j, q, &kj, 1, sc + pos0);
                else
                    scores_tail(q, kj, j->i8, bt, hd, n - j0, sc + pos0);
                continue;
            }
            if (ng > 0 && pos0 != first + 16 * ng) {
                /* not contiguous (block size not a multiple of 16): flush */
                for (int i = 0; i < ng; i++)
                    scores_n(j, q, grp + i, 1, sc + first + 16 * i);
                ng = 0;
            }
            if (ng == 0)
                first = pos0;
            grp[ng++] = kj;
            if (ng == 4) {
                scores_n(j, q, grp, 4, sc + first);
                ng = 0;
            }
        }
    }
    for (int i = 0; i < ng; i++)
        scores_n(j, q, grp + i, 1, sc + first + 16 * i);
    apply_scales(j, kvg_kv_kscale, blocks, g, from, T, sc);
}

/* out += the weighted V of positions [from, T), block by block (an int8 layer's w
 * already times V's scales). */
static void vacc_keys(const attn_job *j, float *out, const float *w, const int32_t *blocks, int g, int from,
                      int T)
{
    int hd = j->c->m->cfg.head_dim, bt = j->kv->geom.block_tokens;
    for (int b = from / bt; b * bt < T; b++) {
        int lo = b * bt > from ? b * bt : from, hi = (b + 1) * bt < T ? (b + 1) * bt : T;
        size_t at = (size_t)(lo - b * bt) * hd;
        if (j->i8)
            j->k.vacc_i8(out, w + lo, kvg_kv_v8(j->kv, blocks[b], j->layer, g) + at, hi - lo, hd);
        else
            j->k.vacc(out, w + lo, kvg_kv_v(j->kv, blocks[b], j->layer, g) + at, hi - lo, hd);
    }
}

/* Head h's sink logit, or -INFINITY (a softmax without one, bit for bit). */
static float sink_of(const attn_job *j, int h)
{
    return j->sinks ? j->sinks[h] : -INFINITY;
}

/* The first position a row at `pos` sees in this layer: 0, or the window's start. */
static int first_visible(const attn_job *j, int32_t pos)
{
    return j->window && pos >= j->window ? pos - j->window + 1 : 0;
}

/* Scores sc[from..T) made ready for the softmax: [from, lo) masked, soft-capped when
 * the model caps; returns the divisor the softmax applies. */
static float prepare_scores(const attn_job *j, float *sc, int from, int lo, int T)
{
    for (int t = from; t < lo; t++)
        sc[t] = -INFINITY;
    if (j->softcap > 0.0f) {
        for (int t = lo; t < T; t++)
            sc[t] = j->softcap * tanhf(sc[t] / j->div / j->softcap);
        return 1.0f;
    }
    return j->div;
}

static void attend_one(const attn_job *j, int h, int r, float *sc)
{
    const kvg_cpu *c = j->c;
    const kvg_model_config *cfg = &c->m->cfg;
    int hd = cfg->head_dim;
    int g = h / (cfg->n_heads / cfg->n_kv_heads);
    const float *q = j->q + ((size_t)r * cfg->n_heads + (size_t)h) * hd;
    float *out = j->out + ((size_t)r * cfg->n_heads + (size_t)h) * hd;
    const int32_t *blocks = c->blocks + c->seq_blocks_off[c->row_seq[r]];
    int T = c->pos[r] + 1, lo = first_visible(j, c->pos[r]), from = lo / 16 * 16;
    float sum, div;

    score_keys(j, q, blocks, g, from, T, sc);
    div = prepare_scores(j, sc, from, lo, T);
    sum = j->k.softmax(sc + from, T - from, div, sink_of(j, h));
    apply_scales(j, kvg_kv_vscale, blocks, g, from, T, sc);
    memset(out, 0, (size_t)hd * sizeof(float));
    vacc_keys(j, out, sc, blocks, g, from, T);
    for (int d = 0; d < hd; d++)
        out[d] /= sum;
}

/* KVG_ATTN_ROWS rows r0.. of one sequence, one head: the keys below every row's
 * position go through the rows' kernels (one load of K or V for all the rows), the few
 * above the first row's position row by row. Each row computes the chains attend_one
 * would, so its bits are the same. Needs block_tokens % 16 == 0 (a 16-key group never
 * straddles blocks). */
static void attend_rows(const attn_job *j, int h, int r0, float *sc0)
{
    const kvg_cpu *c = j->c;
    const kvg_model_config *cfg = &c->m->cfg;
    int hd = cfg->head_dim, bt = j->kv->geom.block_tokens;
    int g = h / (cfg->n_heads / cfg->n_kv_heads);
    const int32_t *blocks = c->blocks + c->seq_blocks_off[c->row_seq[r0]];
    const float *q[KVG_ATTN_ROWS];
    float *out[KVG_ATTN_ROWS], *sc[KVG_ATTN_ROWS], sum[KVG_ATTN_ROWS];
    int T[KVG_ATTN_ROWS], t_min = INT32_MAX, shared;

    for (int i = 0; i < KVG_ATTN_ROWS; i++) {
        size_t at = ((size_t)(r0 + i) * cfg->n_heads + (size_t)h) * hd;
        q[i] = j->q + at;
        out[i] = j->out + at;
        sc[i] = sc0 + (size_t)i * c->att_stride;
        T[i] = c->pos[r0 + i] + 1;
        if (T[i] < t_min)
            t_min = T[i];
    }
    /* Scores: 64 keys at a time below every row's position, then each row's rest. */
    shared = t_min / 64 * 64;
    for (int p = 0; p < shared; p += 64) {
        const float *grp[4];
        const int8_t *grp8[4];
        float *o[KVG_ATTN_ROWS];
        for (int i = 0; i < 4; i++) {
            int pos = p + 16 * i;
            if (j->i8)
                grp8[i] = kvg_kv_k8(j->kv, blocks[pos / bt], j->layer, g) + pos % bt;
            else
                grp[i] = kvg_kv_k(j->kv, blocks[pos / bt], j->layer, g) + pos % bt;
        }
        for (int i = 0; i < KVG_ATTN_ROWS; i++)
            o[i] = sc[i] + p;
        if (j->i8)
            j->k.scores4_rows_i8(q, grp8, bt, hd, o);
        else
            j->k.scores4_rows(q, grp, bt, hd, o);
    }
    for (int i = 0; i < KVG_ATTN_ROWS; i++) {
        apply_scales(j, kvg_kv_kscale, blocks, g, 0, shared, sc[i]);
        score_keys(j, q[i], blocks, g, shared, T[i], sc[i]);
        sum[i] = j->k.softmax(sc[i], T[i], prepare_scores(j, sc[i], 0, 0, T[i]), sink_of(j, h));
        apply_scales(j, kvg_kv_vscale, blocks, g, 0, T[i], sc[i]);
        memset(out[i], 0, (size_t)hd * sizeof(float));
    }
    /* V: every position below t_min for all rows at once, block by block. */
    for (int b = 0; b * bt < t_min; b++) {
        int n = t_min - b * bt < bt ? t_min - b * bt : bt;
        const float *w[KVG_ATTN_ROWS];
        for (int i = 0; i < KVG_ATTN_ROWS; i++)
            w[i] = sc[i] + (size_t)b * bt;
        if (j->i8)
            j->k.vacc_rows_i8(out, w, kvg_kv_v8(j->kv, blocks[b], j->layer, g), n, hd);
        else
            j->k.vacc_rows(out, w, kvg_kv_v(j->kv, blocks[b], j->layer, g), n, hd);
    }
    for (int i = 0; i < KVG_ATTN_ROWS; i++) {
        vacc_keys(j, out[i], sc[i], blocks, g, t_min, T[i]);
        for (int d = 0; d < hd; d++)
            out[i][d] /= sum[i];
    }
}

/* Rows r.. r + KVG_ATTN_ROWS - 1 can go through attend_rows: the same sequence, and
 * enough keys below all of them for the shared part to pay. */
static int rows_share_keys(const attn_job *j, int r)
{
    const kvg_cpu *c = j->c;
    if (r + KVG_ATTN_ROWS > c->n_rows || j->kv->geom.block_tokens % 16 != 0 || j->window)
        return 0;
    for (int i = 1; i < KVG_ATTN_ROWS; i++)
        if (c->row_seq[r + i] != c->row_seq[r] || c->pos[r + i] < 64)
            return 0;
    return c->pos[r] >= 64;
}

static void attn_range(void *arg, size_t b, size_t e)
{
    attn_job *j = arg;
    size_t n_rows = (size_t)j->c->n_rows;
    for (size_t chunk = b; chunk < e; chunk++) {
        /* Chunk i owns scratch slices [i * KVG_ATTN_ROWS, (i + 1) * KVG_ATTN_ROWS),
         * whichever thread runs it. */
        float *sc = j->c->att_scratch + chunk * KVG_ATTN_ROWS * j->c->att_stride;
        size_t i0 = j->n_items * chunk / (size_t)j->n_chunks;
        size_t i1 = j->n_items * (chunk + 1) / (size_t)j->n_chunks;
        for (size_t i = i0; i < i1;) {
            /* Head-major: each thread gets whole heads (balanced under causal masking,
             * and a kv head's blocks stay in cache across rows). */
            int h = (int)(i / n_rows), r = (int)(i % n_rows);
            if (i + KVG_ATTN_ROWS <= i1 && (size_t)r + KVG_ATTN_ROWS <= n_rows && rows_share_keys(j, r)) {
                attend_rows(j, h, r, sc);
                i += KVG_ATTN_ROWS;
            } else {
                attend_one(j, h, r, sc);
                i++;
            }
        }
    }
}

void kvg_cpu_attention(kvg_cpu *c, kvg_kv_pool *kv, int layer, const float *q, float *out)
{
    attn_job j;
    double work = 0.0;

    j.k = *kvg_cpu_kernels();
    for (int r = 0; r < c->n_rows; r++)
        work += (double)(c->pos[r] + 1);
    work *= 4.0 * c->m->cfg.n_heads * c->m->cfg.head_dim;

    j.c = c;
    j.kv = kv;
    j.layer = layer;
    j.window = c->m->layers[layer].sliding ? c->m->cfg.swa_window : 0;
    j.div = sqrtf(c->m->cfg.attn_query_scalar > 0.0f ? c->m->cfg.attn_query_scalar : (float)c->m->cfg.head_dim);
    j.softcap = c->m->cfg.attn_softcap;
    j.sinks = c->m->layers[layer].attn_sinks;
    j.i8 = kvg_kv_layer_int8(kv, layer);
    j.q = q;
    j.out = out;
    j.n_items = (size_t)c->m->cfg.n_heads * (size_t)c->n_rows;
    j.n_chunks = c->n_threads;
    if (c->n_threads <= 1 || work < 32768.0) {
        j.n_chunks = 1;
        attn_range(&j, 0, 1);
    } else {
        kvg_threadpool_run(c->tp, (size_t)j.n_chunks, attn_range, &j);
    }
}
