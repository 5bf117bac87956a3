/* The CPU backend: GEMMs through kvg_gemm, everything else in plain C over the thread
 * pool. Every operation computes each row (each element) on its own with a fixed order
 * of arithmetic, so results are independent of the batch, the chunking and the thread
 * count (see backend.h). Attention is in attention_cpu.c. */
#include "cpu_context.h"
#include "moe_cpu.h"
#include "cpu/attention_kernels.h"
#include "errmsg.h"
#include "rope.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvg_cpu *cpu_of(kvg_backend *be)
{
    return be->ctx;
}

/* ---- memory ---- */

static float *cpu_alloc(kvg_backend *be, size_t n)
{
    void *p = NULL;
    (void)be;
    if (n == 0)
        n = 1;
    if (n > SIZE_MAX / sizeof(float) - 64)
        return NULL;
    if (posix_memalign(&p, 64, n * sizeof(float)) != 0)
        return NULL;
    return p;
}

static void cpu_free(kvg_backend *be, float *p)
{
    (void)be;
    free(p);
}

static void cpu_read(kvg_backend *be, const float *src, float *host, size_t n)
{
    (void)be;
    if (n)
        memmove(host, src, n * sizeof(float));
}

/* ---- the step ---- */

typedef struct rope_table_job {
    kvg_cpu *c;
    int half;
} rope_table_job;

/* Row r's cos/sin of every kind: kind k's table follows kind k - 1's (cap_rows rows). */
static void rope_table_range(void *arg, size_t b, size_t e)
{
    rope_table_job *j = arg;
    kvg_cpu *c = j->c;
    float mscale = kvg_rope_mscale(&c->m->cfg);
    for (int k = 0; k < c->n_rope_kinds; k++)
        for (size_t r = b; r < e; r++)
            kvg_rope_cos_sin(c->inv_freq + (size_t)k * j->half, kvg_rope_dims(&c->m->cfg) / 2, c->pos[r], mscale,
                             c->rope_cs + ((size_t)k * c->cap_rows + r) * (size_t)j->half * 2);
}

static int grow(void **p, int *cap, int need, size_t elem)
{
    void *q;
    int nc;
    if (need <= *cap)
        return 0;
    nc = *cap ? *cap : 64;
    while (nc < need)
        nc = nc > (1 << 29) ? need : nc * 2;
    q = realloc(*p, (size_t)nc * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = nc;
    return 0;
}

static int cpu_begin_step(kvg_backend *be, const kvg_step *s, char *err, size_t err_len)
{
    kvg_cpu *c = cpu_of(be);
    const kvg_model_config *cfg = &c->m->cfg;
    int half = cfg->head_dim / 2;
    int64_t total_blocks = 0;

    /* The step's shape: forward.c's (a non-empty batch, at most one output per row). */
    assert(s->n_rows > 0 && s->n_seqs > 0 && s->n_out >= 0 && s->n_out <= s->n_rows);
    assert(s->block_tokens > 0);
    for (int i = 0; i < s->n_seqs; i++) {
        assert(s->n_blocks[i] >= 0);
        total_blocks += s->n_blocks[i];
    }
    /* Can happen (many long sequences in one step): the int sizes below would wrap. */
    if (total_blocks > INT32_MAX / 2) {
        kvg_set_err(err, err_len, "cpu backend: too many blocks in one step");
        return -1;
    }
    if (s->n_rows > c->cap_rows) {
        int cap = c->cap_rows;
        int32_t *ids = c->tokens;
        float *cs;
        if (grow((void **)&ids, &cap, s->n_rows, 4 * sizeof(int32_t)) != 0)
            goto oom;
        c->tokens = ids;
        cs = realloc(c->rope_cs, (size_t)c->n_rope_kinds * (size_t)cap * (size_t)(half > 0 ? half : 1) * 2 *
                                 sizeof(float));
        if (!cs)
            goto oom;
        c->rope_cs = cs;
        c->cap_rows = cap;
    }
    c->pos = c->tokens + c->cap_rows;
    c->row_seq = c->pos + c->cap_rows;
    c->out_rows = c->row_seq + c->cap_rows;
    if (grow((void **)&c->seq_blocks_off, &c->cap_seqs, s->n_seqs + 1, sizeof(int32_t)) != 0 ||
        grow((void **)&c->blocks, &c->cap_blocks, (int)total_blocks + 1, sizeof(int32_t)) != 0)
        goto oom;

    /* Preconditions, guaranteed by the forward pass (kvg_forward_step builds the step
     * from sequences whose tokens it has checked against the vocabulary, whose blocks
     * kvg_kv_seq_prepare has reserved for every position, and whose logits rows are
     * its own rows): not re-checked here, asserted. */
    for (int r = 0; r < s->n_rows; r++) {
        assert(s->tokens[r] >= 0 && s->tokens[r] < cfg->vocab_size);
        assert(s->pos[r] >= 0 && s->row_seq[r] >= 0 && s->row_seq[r] < s->n_seqs);
        assert((int64_t)s->pos[r] < (int64_t)s->n_blocks[s->row_seq[r]] * s->block_tokens);
    }
    for (int i = 0; i < s->n_out; i++)
        assert(s->out_rows[i] >= 0 && s->out_rows[i] < s->n_rows);
    memcpy(c->tokens, s->tokens, (size_t)s->n_rows * sizeof(int32_t));
    memcpy(c->pos, s->pos, (size_t)s->n_rows * sizeof(int32_t));
    memcpy(c->row_seq, s->row_seq, (size_t)s->n_rows * sizeof(int32_t));
    if (s->n_out)
        memcpy(c->out_rows, s->out_rows, (size_t)s->n_out * sizeof(int32_t));
    c->seq_blocks_off[0] = 0;
    for (int i = 0; i < s->n_seqs; i++) {
        int32_t off = c->seq_blocks_off[i];
        if (s->n_blocks[i])
            memcpy(c->blocks + off, s->block_tables[i], (size_t)s->n_blocks[i] * sizeof(int32_t));
        c->seq_blocks_off[i + 1] = off + s->n_blocks[i];
    }
    /* Attention scores: KVG_ATTN_ROWS slices per thread (attend_rows holds a row's
     * scores each), as long as the longest row's context. */
    {
        int32_t max_pos = 0;
        size_t stride, need;
        for (int r = 0; r < s->n_rows; r++)
            if (s->pos[r] > max_pos)
                max_pos = s->pos[r];
        stride = ((size_t)max_pos + 1 + 31) / 16 * 16;
        need = stride * KVG_ATTN_ROWS * (size_t)c->n_threads;
        if (need > c->att_cap) {
            float *p = NULL;
            if (posix_memalign((void **)&p, 64, need * sizeof(float)) != 0)
                goto oom;
            free(c->att_scratch);
            c->att_scratch = p;
            c->att_cap = need;
        }
        c->att_stride = stride;
    }
    /* The GEMMs pack X for up to n_rows rows (every matmul of a step has M <= n_rows). */
    if (kvg_gemm_ws_reserve(c->gemm_ws, s->n_rows) != 0 || kvg_cpu_moe_reserve(c->moe, s->n_rows) != 0)
        goto oom;
    c->n_rows = s->n_rows;
    c->n_seqs = s->n_seqs;
    c->n_out = s->n_out;

    /* cos/sin once per step, shared by every layer. */
    {
        rope_table_job j = { c, half };
        kvg_cpu_par(c, (size_t)s->n_rows, 40.0 * half * s->n_rows * c->n_rope_kinds, rope_table_range, &j);
    }
    return 0;
oom:
    kvg_set_err(err, err_len, "cpu backend: out of memory for a step of %d rows", s->n_rows);
    return -1;
}

/* ---- row-wise operations ---- */

typedef struct embed_job {
    kvg_cpu *c;
    const kvg_tensor *emb;
    float *x;
} embed_job;

static void embed_range(void *arg, size_t b, size_t e)
{
    embed_job *j = arg;
    int64_t dim = j->emb->cols;
    for (size_t r = b; r < e; r++)
        kvg_tensor_row_f32(j->emb, j->c->tokens[r], j->x + r * (size_t)dim);
}

static void cpu_embed(kvg_backend *be, const kvg_tensor *emb, float *x)
{
    kvg_cpu *c = cpu_of(be);
    embed_job j = { c, kvg_cpu_weights_get(c->weights, emb), x };
    kvg_cpu_par(c, (size_t)c->n_rows, (double)c->n_rows * (double)emb->cols, embed_range, &j);
}

typedef struct norm_job {
    const float *x, *w;
    float eps;
    int dim;
    float *out;
} norm_job;

static void rmsnorm_range(void *arg, size_t b, size_t e)
{
    norm_job *j = arg;
    for (size_t r = b; r < e; r++) {
        const float *x = j->x + r * (size_t)j->dim;
        float *o = j->out + r * (size_t)j->dim;
        float ss = 0.0f, inv;
        for (int i = 0; i < j->dim; i++)
            ss += x[i] * x[i];
        ss /= (float)j->dim;
        ss += j->eps;
        inv = 1.0f / sqrtf(ss);
        for (int i = 0; i < j->dim; i++)
            o[i] = j->w[i] * (inv * x[i]);
    }
}

static void cpu_rmsnorm(kvg_backend *be, const float *x, const float *w, float eps,
                        int rows, int dim, float *out)
{
    norm_job j = { x, w, eps, dim, out };
    kvg_cpu_par(cpu_of(be), (size_t)rows, 3.0 * rows * dim, rmsnorm_range, &j);
}

static void cpu_matmul(kvg_backend *be, const float *x, int M, int K, const kvg_tensor *w,
                       const float *bias, float *y)
{
    kvg_cpu *c = cpu_of(be);
    int rc;

    /* Shapes and dtypes are the model's (the loaders check every tensor against the
     * config), M <= the step's rows and the buffers are forward.c's activations, so
     * kvg_gemm cannot refuse; it cannot fail otherwise (its scratch was made by
     * kvg_backend_cpu_new and cpu_begin_step, which report running out of memory). */
    rc = kvg_gemm(c->tp, c->gemm_ws, x, M, K, kvg_cpu_weights_get(c->weights, w), bias, y);
    assert(rc == 0);
    (void)rc;
}

static void cpu_matmul_n(kvg_backend *be, const float *x, int M, int K, int n,
                         const kvg_tensor *const *w, const float *const *bias, float *const *y)
{
    kvg_cpu *c = cpu_of(be);
    const kvg_tensor *pw[KVG_GEMM_MULTI_MAX];
    int rc;

    /* As cpu_matmul: the model's shapes, n <= KVG_GEMM_MULTI_MAX (forward.c's 2 or 3). */
    assert(n <= KVG_GEMM_MULTI_MAX);
    for (int i = 0; i < n; i++)
        pw[i] = kvg_cpu_weights_get(c->weights, w[i]);
    rc = kvg_gemm_multi(c->tp, c->gemm_ws, x, M, K, n, pw, bias, y);
    assert(rc == 0);
    (void)rc;
}

typedef struct rope_job {
    kvg_cpu *c;
    const float *cs;             /* the layer's kind's table */
    float *q, *k;
} rope_job;

static void rotate_heads(float *x, int n_heads, int hd, int rot, const float *cs, kvg_rope_layout layout)
{
    int half = rot / 2;          /* the rotated pairs; dimensions from rot on stay */
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * hd;
        for (int p = 0; p < half; p++) {
            int i0 = layout == KVG_ROPE_HALF ? p : 2 * p;
            int i1 = layout == KVG_ROPE_HALF ? p + half : 2 * p + 1;
            float c = cs[2 * p], s = cs[2 * p + 1];
            float v0 = v[i0], v1 = v[i1];
            v[i0] = v0 * c - v1 * s;
            v[i1] = v0 * s + v1 * c;
        }
    }
}

/* Each row's q and k rotated; then, with Llama 4's query temperature (Ministral 3), the
 * row's q times its position's scale, as llama.cpp multiplies the rotated q. */
static void rope_range(void *arg, size_t b, size_t e)
{
    rope_job *j = arg;
    const kvg_model_config *cfg = &j->c->m->cfg;
    int hd = cfg->head_dim, rot = kvg_rope_dims(cfg);
    size_t qw = (size_t)cfg->n_heads * hd;
    for (size_t r = b; r < e; r++) {
        const float *cs = j->cs + r * (size_t)(hd / 2) * 2;
        float *q = j->q + r * qw;
        rotate_heads(q, cfg->n_heads, hd, rot, cs, cfg->rope_layout);
        rotate_heads(j->k + r * (size_t)cfg->n_kv_heads * hd, cfg->n_kv_heads, hd, rot, cs,
                     cfg->rope_layout);
        if (cfg->attn_temp_scale != 0.0f) {
            float t = kvg_rope_q_scale(cfg, j->c->pos[r]);
            for (size_t i = 0; i < qw; i++)
                q[i] *= t;
        }
    }
}

static void cpu_rope(kvg_backend *be, int layer, float *q, float *k)
{
    kvg_cpu *c = cpu_of(be);
    const kvg_model_config *cfg = &c->m->cfg;
    size_t kind = (size_t)kvg_rope_kind(c->m, layer);
    rope_job j = { c, c->rope_cs + kind * (size_t)c->cap_rows * (size_t)(cfg->head_dim / 2) * 2, q, k };
    kvg_cpu_par(c, (size_t)c->n_rows,
            3.0 * c->n_rows * (cfg->n_heads + cfg->n_kv_heads) * cfg->head_dim, rope_range, &j);
}

typedef struct kvw_job {
    kvg_cpu *c;
    kvg_kv_pool *kv;
    int layer;
    const float *k, *v;
} kvw_job;

static void kv_write_range(void *arg, size_t b, size_t e)
{
    kvw_job *j = arg;
    kvg_cpu *c = j->c;
    int hd = c->m->cfg.head_dim, nkv = c->m->cfg.n_kv_heads;
    int bt = j->kv->geom.block_tokens;
    for (size_t r = b; r < e; r++) {
        int32_t pos = c->pos[r];
        int32_t block = c->blocks[c->seq_blocks_off[c->row_seq[r]] + pos / bt];
        int slot = pos % bt;
        for (int g = 0; g < nkv; g++) {
            const float *ks = j->k + (r * (size_t)nkv + (size_t)g) * (size_t)hd;
            const float *vs = j->v + (r * (size_t)nkv + (size_t)g) * (size_t)hd;
            if (kvg_kv_layer_int8(j->kv, j->layer)) {
                /* K dimension-major like the F32 layout, V token-major; a scale each. */
                kvg_kv_kscale(j->kv, block, j->layer, g)[slot] =
                    kvg_kv_quantize(ks, hd, kvg_kv_k8(j->kv, block, j->layer, g) + slot, (size_t)bt);
                kvg_kv_vscale(j->kv, block, j->layer, g)[slot] =
                    kvg_kv_quantize(vs, hd, kvg_kv_v8(j->kv, block, j->layer, g) + (size_t)slot * hd, 1);
                continue;
            }
            float *kd = kvg_kv_k(j->kv, block, j->layer, g);
            float *vd = kvg_kv_v(j->kv, block, j->layer, g) + (size_t)slot * hd;
            /* K is dimension-major in a block (see kv_cache.h). */
            for (int d = 0; d < hd; d++)
                kd[(size_t)d * bt + slot] = ks[d];
            memcpy(vd, vs, (size_t)hd * sizeof(float));
        }
    }
}

static void cpu_kv_write(kvg_backend *be, kvg_kv_pool *kv, int layer, const float *k, const float *v)
{
    kvg_cpu *c = cpu_of(be);
    kvw_job j = { c, kv, layer, k, v };
    /* Rows of one step may share a block (a prefill chunk); each writes its own slot. */
    kvg_cpu_par(c, (size_t)c->n_rows, 2.0 * c->n_rows * c->m->cfg.n_kv_heads * c->m->cfg.head_dim,
            kv_write_range, &j);
}

static void cpu_attention(kvg_backend *be, kvg_kv_pool *kv, int layer, const float *q, float *out)
{
    kvg_cpu_attention(cpu_of(be), kv, layer, q, out);
}

typedef struct elt_job {
    float *a;
    const float *b;
} elt_job;

typedef struct swiglu_job {
    float *gate;
    const float *up;
    kvg_swiglu_fn fn;
} swiglu_job;

static void swiglu_range(void *arg, size_t b, size_t e)
{
    swiglu_job *j = arg;
    j->fn(j->gate + b, j->up + b, e - b);
}

/* silu(gate) * up with the softmax's exp (kvg_silu_mul, attention_kernels.h), 16 or 8
 * lanes at a time: libm's expf one element at a time took 11% of a 1,000-token
 * prefill of the 110M shape. */
static void cpu_swiglu(kvg_backend *be, float *gate, const float *up, size_t n)
{
    swiglu_job j = { gate, up, kvg_cpu_kernels()->swiglu };
    kvg_cpu_par(cpu_of(be), n, 4.0 * (double)n, swiglu_range, &j);
}

/* gelu(gate) * up, GELU's tanh approximation as llama.cpp and Hugging Face's
 * gelu_pytorch_tanh compute it (kvg_gelu_mul, attention_kernels.h), vectorized as the
 * SwiGLU. */
static void cpu_geglu(kvg_backend *be, float *gate, const float *up, size_t n)
{
    swiglu_job j = { gate, up, kvg_cpu_kernels()->geglu };
    kvg_cpu_par(cpu_of(be), n, 5.0 * (double)n, swiglu_range, &j);
}

typedef struct scale_job {
    float *x;
    float s;
} scale_job;

static void scale_range(void *arg, size_t b, size_t e)
{
    scale_job *j = arg;
    for (size_t i = b; i < e; i++)
        j->x[i] *= j->s;
}

static void cpu_scale(kvg_backend *be, float *x, float s, size_t n)
{
    scale_job j = { x, s };
    kvg_cpu_par(cpu_of(be), n, (double)n, scale_range, &j);
}

static void softcap_range(void *arg, size_t b, size_t e)
{
    scale_job *j = arg;
    for (size_t i = b; i < e; i++)
        j->x[i] = j->s * tanhf(j->x[i] / j->s);
}

static void cpu_softcap(kvg_backend *be, float *x, float cap, size_t n)
{
    scale_job j = { x, cap };
    kvg_cpu_par(cpu_of(be), n, 20.0 * (double)n, softcap_range, &j);
}

static void add_range(void *arg, size_t b, size_t e)
{
    elt_job *j = arg;
    for (size_t i = b; i < e; i++)
        j->a[i] += j->b[i];
}

static void cpu_add(kvg_backend *be, float *x, const float *y, size_t n)
{
    elt_job j = { x, y };
    kvg_cpu_par(cpu_of(be), n, (double)n, add_range, &j);
}

static void cpu_moe(kvg_backend *be, int layer, const float *x, int rows, float *out)
{
    kvg_cpu_moe_ffn(cpu_of(be), layer, x, rows, out);
}

static void cpu_gather_out_rows(kvg_backend *be, const float *x, int width, float *out)
{
    kvg_cpu *c = cpu_of(be);
    for (int i = 0; i < c->n_out; i++)
        memcpy(out + (size_t)i * width, x + (size_t)c->out_rows[i] * width, (size_t)width * sizeof(float));
}

/* ---- creation ---- */

static void cpu_destroy(kvg_backend *be)
{
    kvg_cpu *c;
    if (!be)
        return;
    c = be->ctx;
    if (c) {
        kvg_threadpool_free(c->tp);
        kvg_cpu_weights_free(c->weights);
        kvg_gemm_ws_free(c->gemm_ws);
        kvg_cpu_moe_free(c->moe);
        free(c->inv_freq);
        free(c->tokens);
        free(c->seq_blocks_off);
        free(c->blocks);
        free(c->rope_cs);
        free(c->att_scratch);
        free(c);
    }
    free(be);
}

static const kvg_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .read = cpu_read,
    .begin_step = cpu_begin_step,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .matmul_n = cpu_matmul_n,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .add = cpu_add,
    .gather_out_rows = cpu_gather_out_rows,
    .moe = cpu_moe,
};

kvg_backend *kvg_backend_cpu_new(const kvg_model *m, int n_threads, char *err, size_t err_len)
{
    const kvg_model_config *cfg = &m->cfg;
    kvg_backend *be;
    kvg_cpu *c;

    if (kvg_backend_check_model(m, "cpu backend", 0, err, err_len) != 0)
        return NULL;
    be = kvg_backend_alloc(&cpu_ops, m, sizeof *c, "cpu backend", err, err_len);
    if (!be)
        return NULL;
    c = be->ctx;
    c->m = m;
    c->n_rope_kinds = kvg_rope_n_kinds(m);
    c->inv_freq = malloc((size_t)c->n_rope_kinds * (size_t)(cfg->head_dim / 2) * sizeof(float));
    c->tp = kvg_threadpool_new(n_threads);
    if (!c->inv_freq || !c->tp) {
        kvg_set_err(err, err_len, "cpu backend: cannot start %d threads", n_threads);
        cpu_destroy(be);
        return NULL;
    }
    c->n_threads = kvg_threadpool_size(c->tp);
    be->n_threads = c->n_threads;
    {
        /* Each thread's GEMM scratch, once, for every inner dimension the forward pass
         * uses: dim (q/k/v, gate/up, router, logits), n_heads * head_dim (wo), the FFN's
         * width (down: hidden_dim, or expert_hidden_dim in a MoE model). */
        int qd = cfg->n_heads * cfg->head_dim, k_min = cfg->dim, k_max = cfg->dim;
        int ffn = cfg->n_experts > 0 ? cfg->expert_hidden_dim : cfg->hidden_dim;
        if (qd < k_min)
            k_min = qd;
        if (ffn < k_min)
            k_min = ffn;
        if (qd > k_max)
            k_max = qd;
        if (ffn > k_max)
            k_max = ffn;
        c->gemm_ws = kvg_gemm_ws_new(c->n_threads, k_min, k_max);
        if (!c->gemm_ws) {
            kvg_set_err(err, err_len, "cpu backend: out of memory for the GEMM workspaces");
            cpu_destroy(be);
            return NULL;
        }
    }
    c->moe = kvg_cpu_moe_new(m);
    if (cfg->n_experts > 0 && !c->moe) {
        kvg_set_err(err, err_len, "cpu backend: out of memory for the experts' scratch");
        cpu_destroy(be);
        return NULL;
    }
    c->weights = kvg_cpu_weights_new(m, c->tp, err, err_len);
    if (!c->weights) {
        cpu_destroy(be);
        return NULL;
    }
    {
        int float_w, int8_w;
        kvg_cpu_weights_kinds(c->weights, &float_w, &int8_w);
        kvg_gemm_ws_kinds(c->gemm_ws, float_w, int8_w);
    }
    for (int k = 0; k < c->n_rope_kinds; k++)
        kvg_rope_frequencies(cfg, k, c->inv_freq + (size_t)k * (cfg->head_dim / 2));
    return be;
}
