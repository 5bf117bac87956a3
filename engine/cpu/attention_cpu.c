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
 * forward passes under every ISA the CPU has). The kernels contain no a*b+c expression other than explicit fmaf, which
 * the compiler could otherwise contract differently per ISA. */
#include "backend_cpu_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention_kernels.h"
#include "gemm.h"

/* A partial group of n < 16 keys: the same chains, one key at a time. */
static void scores_tail(const float *q, const float *k, int bt, int hd, int n, float *out)
{
    for (int l = 0; l < n; l++) {
        float a = 0.0f;
        for (int d = 0; d < hd; d++)
            a = fmaf(q[d], k[(size_t)d * bt + l], a);
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

typedef struct attn_job {
    kvg_cpu *c;
    kvg_kv_pool *kv;
    int layer;
    const float *q;
    float *out;
    size_t n_items;              /* n_heads * n_rows */
    int n_chunks;
    kvg_attn_kernels k;
} attn_job;

static void attend_one(const attn_job *j, int h, int r, float *sc)
{
    const kvg_cpu *c = j->c;
    const kvg_model_config *cfg = &c->m->cfg;
    int hd = cfg->head_dim, bt = j->kv->geom.block_tokens;
    int g = h / (cfg->n_heads / cfg->n_kv_heads);
    const float *q = j->q + ((size_t)r * cfg->n_heads + (size_t)h) * hd;
    float *out = j->out + ((size_t)r * cfg->n_heads + (size_t)h) * hd;
    const int32_t *blocks = c->blocks + c->seq_blocks_off[c->row_seq[r]];
    int T = c->pos[r] + 1;
    float scale = sqrtf((float)hd), sum;

    /* Full groups of 16 keys, four at a time (they cover consecutive positions), then
     * the last partial group. */
    {
        const float *grp[4];
        int ng = 0, first = 0;
        for (int b = 0; b * bt < T; b++) {
            int n = T - b * bt < bt ? T - b * bt : bt;
            const float *kb = kvg_kv_k(j->kv, blocks[b], j->layer, g);
            for (int j0 = 0; j0 < n; j0 += 16) {
                int pos0 = b * bt + j0;
                if (n - j0 < 16) {
                    /* Inside a block the vector kernel may read the not yet written
                     * slots: every lane is its own chain, the extra ones are dropped
                     * (sc has room for them). */
                    if (j0 + 16 <= bt)
                        j->k.scores1(q, (const float *const *)&(const float *){ kb + j0 }, bt, hd,
                                     sc + pos0);
                    else
                        scores_tail(q, kb + j0, bt, hd, n - j0, sc + pos0);
                    continue;
                }
                if (ng > 0 && pos0 != first + 16 * ng) {
                    /* not contiguous (block size not a multiple of 16): flush */
                    for (int i = 0; i < ng; i++)
                        j->k.scores1(q, grp + i, bt, hd, sc + first + 16 * i);
                    ng = 0;
                }
                if (ng == 0)
                    first = pos0;
                grp[ng++] = kb + j0;
                if (ng == 4) {
                    j->k.scores4(q, grp, bt, hd, sc + first);
                    ng = 0;
                }
            }
        }
        for (int i = 0; i < ng; i++)
            j->k.scores1(q, grp + i, bt, hd, sc + first + 16 * i);
    }
    sum = j->k.softmax(sc, T, scale);

    memset(out, 0, (size_t)hd * sizeof(float));
    for (int b = 0; b * bt < T; b++) {
        int n = T - b * bt < bt ? T - b * bt : bt;
        j->k.vacc(out, sc + (size_t)b * bt, kvg_kv_v(j->kv, blocks[b], j->layer, g), n, hd);
    }
    for (int d = 0; d < hd; d++)
        out[d] /= sum;
}

static void attn_range(void *arg, size_t b, size_t e)
{
    attn_job *j = arg;
    for (size_t chunk = b; chunk < e; chunk++) {
        /* Chunk i owns scratch slice i, whichever thread runs it. */
        float *sc = j->c->att_scratch + chunk * j->c->att_stride;
        size_t i0 = j->n_items * chunk / (size_t)j->n_chunks;
        size_t i1 = j->n_items * (chunk + 1) / (size_t)j->n_chunks;
        for (size_t i = i0; i < i1; i++) {
            /* Head-major: each thread gets whole heads (balanced under causal masking,
             * and a kv head's blocks stay in cache across rows). */
            int h = (int)(i / (size_t)j->c->n_rows), r = (int)(i % (size_t)j->c->n_rows);
            attend_one(j, h, r, sc);
        }
    }
}

void kvg_cpu_attention(kvg_cpu *c, kvg_kv_pool *kv, int layer, const float *q, float *out)
{
    attn_job j;
    double work = 0.0;

    pthread_once(&kernels_once, pick_kernels);
    for (int r = 0; r < c->n_rows; r++)
        work += (double)(c->pos[r] + 1);
    work *= 4.0 * c->m->cfg.n_heads * c->m->cfg.head_dim;

    j.c = c;
    j.kv = kv;
    j.layer = layer;
    j.q = q;
    j.out = out;
    j.n_items = (size_t)c->m->cfg.n_heads * (size_t)c->n_rows;
    j.n_chunks = c->n_threads;
    j.k = kernels;
    if (c->n_threads <= 1 || work < 32768.0) {
        j.n_chunks = 1;
        attn_range(&j, 0, 1);
    } else {
        kvg_threadpool_run(c->tp, (size_t)j.n_chunks, attn_range, &j);
    }
}
