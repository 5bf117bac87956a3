/* The forward pass as a sequence of backend operations (see forward.h, backend.h). */
#include "forward.h"
#include "errmsg.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvg_forward {
    const kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;

    /* Activations in backend memory, for up to cap_rows rows (R: this step's rows,
     * qd = n_heads * head_dim, kvd = n_kv_heads * head_dim). In the last layer, when
     * only n_out < R rows produce logits, the gathered rows reuse q (attention) and xb
     * (residual), and x becomes the normed input. */
    int cap_rows;
    float *x;                    /* [R, dim]: the residual stream */
    float *xb;                   /* [R, dim]: rmsnorm(x), a matmul's input */
    float *ob;                   /* [R, dim]: the wo / w_down output, added to x;
                                    then [n_out, dim]: the final norm */
    float *q;                    /* [R, qd]: queries (rotated) */
    float *k, *v;                /* [R, kvd]: this step's keys and values, then in the cache */
    float *att;                  /* [R, qd]: attention output, heads side by side */
    float *hb, *hb2;             /* [R, hidden_dim]: FFN gate and up, swiglu into hb (a
                                    MoE model's backend keeps its own: 1 float per row) */
    int cap_out;
    float *logits;               /* [n_out, vocab_size] of [cap_out, vocab_size] */
    float *host_logits;          /* host copy of logits, read in one go: a device
                                    backend then makes one transfer per step */

    /* Host-side step description: tokens, pos, row_seq and out_rows share one
     * allocation of 4 * cap_host_rows. */
    int cap_host_rows, cap_host_seqs;
    int32_t *tokens;             /* [R]: each row's token id */
    int32_t *pos;                /* [R]: each row's position in its sequence */
    int32_t *row_seq;            /* [R]: each row's sequence, 0..n_seqs */
    int32_t *out_rows;           /* [n_out]: rows that produce logits (a sequence's last) */
    int32_t *n_blocks;           /* [n_seqs]: each sequence's block count */
    const int32_t **tables;      /* [n_seqs]: each sequence's block table */

    void (*progress)(void *arg); /* before each layer (kvg_forward_set_progress) */
    void *progress_arg;
};

void kvg_forward_kv_geom(const kvg_model *m, int block_tokens, kvg_kv_geom *g)
{
    memset(g, 0, sizeof *g);
    g->n_layers = m->cfg.n_layers;
    g->n_kv_heads = m->cfg.n_kv_heads;
    g->head_dim = m->cfg.head_dim;
    g->block_tokens = block_tokens;
}

kvg_forward *kvg_forward_new(const kvg_model *m, kvg_backend *be, kvg_kv_pool *kv,
                             char *err, size_t err_len)
{
    const kvg_model_config *c = &m->cfg;
    kvg_forward *f;
    if (c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->n_heads % c->n_kv_heads != 0 || c->head_dim <= 0 || c->hidden_dim <= 0 ||
        c->vocab_size <= 0 || c->max_seq_len <= 0) {
        kvg_set_err(err, err_len, "forward: inconsistent model configuration");
        return NULL;
    }
    if (kv->geom.n_layers != c->n_layers || kv->geom.n_kv_heads != c->n_kv_heads ||
        kv->geom.head_dim != c->head_dim) {
        kvg_set_err(err, err_len, "forward: the KV pool's geometry (%d layers, %d kv heads, head_dim %d) "
              "does not match the model (%d, %d, %d)", kv->geom.n_layers, kv->geom.n_kv_heads,
              kv->geom.head_dim, c->n_layers, c->n_kv_heads, c->head_dim);
        return NULL;
    }
    {
        /* The family's operations the backend must have. */
        const kvg_backend_ops *o = be->ops;
        const char *need = c->ffn_act == KVG_ACT_GELU_TANH && !o->geglu ? "GeGLU"
                           : c->embed_scale > 0.0f && !o->scale ? "the embedding scale"
                           : c->final_softcap > 0.0f && !o->softcap ? "logit soft-capping"
                           : c->n_experts > 0 && !o->moe ? "mixture-of-experts layers" : NULL;
        if (c->ffn_act == KVG_ACT_SWIGLU_OAI && c->n_experts == 0) {
            /* gpt-oss's clamped SwiGLU is its experts' (the backends' moe operation) */
            kvg_set_err(err, err_len, "forward: %s: the clamped SwiGLU outside mixture-of-experts layers is not "
                        "supported", c->arch);
            return NULL;
        }
        if (need) {
            kvg_set_err(err, err_len, "forward: the %s backend cannot run %s models yet (no %s)", o->name,
                        c->arch, need);
            return NULL;
        }
    }
    f = calloc(1, sizeof *f);
    if (!f) {
        kvg_set_err(err, err_len, "forward: out of memory");
        return NULL;
    }
    f->m = m;
    f->be = be;
    f->kv = kv;
    return f;
}

static void free_acts(kvg_forward *f)
{
    float **bufs[] = { &f->x, &f->xb, &f->ob, &f->q, &f->k, &f->v, &f->att, &f->hb, &f->hb2 };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i])
            f->be->ops->free(f->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    f->cap_rows = 0;
}

void kvg_forward_free(kvg_forward *f)
{
    if (!f)
        return;
    free_acts(f);
    if (f->logits)
        f->be->ops->free(f->be, f->logits);
    free(f->host_logits);
    free(f->tokens);
    free(f->n_blocks);
    free(f->tables);
    free(f);
}

static int ensure_acts(kvg_forward *f, int rows, int n_out, char *err, size_t err_len)
{
    const kvg_model_config *c = &f->m->cfg;
    size_t r, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t hw = c->n_experts > 0 ? 1 : (size_t)c->hidden_dim;
    if (rows > f->cap_rows) {
        int cap = f->cap_rows ? f->cap_rows : 16;
        while (cap < rows)
            cap = cap > (1 << 28) ? rows : cap * 2;
        free_acts(f);
        r = (size_t)cap;
        f->x = f->be->ops->alloc(f->be, r * c->dim);
        f->xb = f->be->ops->alloc(f->be, r * c->dim);
        f->ob = f->be->ops->alloc(f->be, r * c->dim);
        f->q = f->be->ops->alloc(f->be, r * qd);
        f->k = f->be->ops->alloc(f->be, r * kvd);
        f->v = f->be->ops->alloc(f->be, r * kvd);
        f->att = f->be->ops->alloc(f->be, r * qd);
        f->hb = f->be->ops->alloc(f->be, r * hw);
        f->hb2 = f->be->ops->alloc(f->be, r * hw);
        if (!f->x || !f->xb || !f->ob || !f->q || !f->k || !f->v || !f->att || !f->hb || !f->hb2) {
            free_acts(f);
            kvg_set_err(err, err_len, "forward: out of memory for activations of %d rows", cap);
            return -1;
        }
        f->cap_rows = cap;
    }
    if (n_out > f->cap_out) {
        int cap = f->cap_out ? f->cap_out : 4;
        while (cap < n_out)
            cap *= 2;
        if (f->logits)
            f->be->ops->free(f->be, f->logits);
        free(f->host_logits);
        f->logits = f->be->ops->alloc(f->be, (size_t)cap * c->vocab_size);
        f->host_logits = malloc((size_t)cap * c->vocab_size * sizeof(float));
        f->cap_out = f->logits && f->host_logits ? cap : 0;
        if (!f->cap_out) {
            kvg_set_err(err, err_len, "forward: out of memory for %d rows of logits", cap);
            return -1;
        }
    }
    return 0;
}

static int ensure_host(kvg_forward *f, int rows, int seqs)
{
    if (rows > f->cap_host_rows) {
        int32_t *t = realloc(f->tokens, (size_t)rows * 4 * sizeof *t);
        if (!t)
            return -1;
        f->tokens = t;
        f->cap_host_rows = rows;
    }
    f->pos = f->tokens + f->cap_host_rows;
    f->row_seq = f->pos + f->cap_host_rows;
    f->out_rows = f->row_seq + f->cap_host_rows;
    if (seqs > f->cap_host_seqs) {
        int32_t *nb = realloc(f->n_blocks, (size_t)seqs * sizeof *nb);
        const int32_t **tb;
        if (!nb)
            return -1;
        f->n_blocks = nb;
        tb = realloc(f->tables, (size_t)seqs * sizeof *tb);
        if (!tb)
            return -1;
        f->tables = tb;
        f->cap_host_seqs = seqs;
    }
    return 0;
}

static int check_batch(const kvg_forward *f, const kvg_fwd_seq *seqs, int n, int64_t *rows,
                       char *err, size_t err_len)
{
    const kvg_model_config *c = &f->m->cfg;
    *rows = 0;
    if (n <= 0) {
        kvg_set_err(err, err_len, "forward: empty batch");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const kvg_fwd_seq *s = &seqs[i];
        if (!s->kv || !s->tokens || s->n_tokens <= 0) {
            kvg_set_err(err, err_len, "forward: sequence %d of the batch has no tokens", i);
            return -1;
        }
        if ((int64_t)s->kv->n_tokens + s->n_tokens > c->max_seq_len) {
            kvg_set_err(err, err_len, "forward: sequence %d would reach %lld positions, past the "
                  "context length %d", i, (long long)s->kv->n_tokens + s->n_tokens, c->max_seq_len);
            return -1;
        }
        /* Precondition, not a check: every id is in the vocabulary. The engine's intake
         * (daemon_conn.c), warm-up files (warmup.c) and kvgate-generate check their
         * prompts; the sampler only draws ids below vocab_size. */
        for (int t = 0; t < s->n_tokens; t++)
            assert(s->tokens[t] >= 0 && s->tokens[t] < c->vocab_size);
        for (int o = 0; o < i; o++) {
            if (seqs[o].kv == s->kv) {
                kvg_set_err(err, err_len, "forward: sequence %d appears twice in the batch", i);
                return -1;
            }
        }
        *rows += s->n_tokens;
    }
    if (*rows > INT32_MAX / 8) {
        kvg_set_err(err, err_len, "forward: %lld rows in one step is too many", (long long)*rows);
        return -1;
    }
    return 0;
}

/* Products of one input: in one backend call when the backend has matmul_n (one
 * synchronisation point on the CPU), else one by one; the same values either way. */
static void matmuls(kvg_backend *be, const float *x, int M, int K, int n, const kvg_tensor *const *w,
                    const float *const *bias, float *const *y)
{
    if (be->ops->matmul_n) {
        be->ops->matmul_n(be, x, M, K, n, w, bias, y);
        return;
    }
    for (int i = 0; i < n; i++)
        be->ops->matmul(be, x, M, K, w[i], bias[i], y[i]);
}

/* x += y, then out = rmsnorm(x, w): one backend call when it has add_rmsnorm (the CUDA
 * backend: one kernel), else the two; the same values either way. */
static void add_norm(kvg_backend *be, float *x, const float *y, const float *w, float eps, int rows, int dim,
                     float *out)
{
    if (be->ops->add_rmsnorm) {
        be->ops->add_rmsnorm(be, x, y, w, eps, rows, dim, out);
        return;
    }
    be->ops->add(be, x, y, (size_t)rows * dim);
    be->ops->rmsnorm(be, x, w, eps, rows, dim, out);
}

/* The step's operations, from the embedding to the logits read back (begin_step made the
 * step's description). */
static void step_ops(kvg_forward *f, int R, int n_out)
{
    const kvg_model *m = f->m;
    const kvg_model_config *c = &m->cfg;
    const kvg_backend_ops *ops = f->be->ops;
    kvg_backend *be = f->be;
    int dim = c->dim, hid = c->hidden_dim;
    int qd = c->n_heads * c->head_dim;
    /* ob holds the last layer's FFN output, not yet added to x: the next layer's norm
     * adds it (add_rmsnorm) */
    int resid = 0;

    ops->embed(be, &m->tok_embedding, f->x);
    if (c->embed_scale > 0.0f)
        ops->scale(be, f->x, c->embed_scale, (size_t)R * dim);
    for (int l = 0; l < c->n_layers; l++) {
        const kvg_layer_weights *w = &m->layers[l];
        int last = l == c->n_layers - 1;
        float *x = f->x;
        int rows = R;

        if (f->progress)
            f->progress(f->progress_arg);
        if (resid)
            add_norm(be, x, f->ob, w->attn_norm, c->norm_eps, R, dim, f->xb);
        else
            ops->rmsnorm(be, x, w->attn_norm, c->norm_eps, R, dim, f->xb);
        resid = 0;
        {
            const kvg_tensor *wt[3] = { &w->wq, &w->wk, &w->wv };
            const float *bt[3] = { w->bq, w->bk, w->bv };
            float *yt[3] = { f->q, f->k, f->v };
            matmuls(be, f->xb, R, dim, 3, wt, bt, yt);
        }
        if (c->qk_norm) {
            /* Each head's q and k normed on its own: rows of head_dim floats. */
            ops->rmsnorm(be, f->q, w->q_norm, c->norm_eps, R * c->n_heads, c->head_dim, f->q);
            ops->rmsnorm(be, f->k, w->k_norm, c->norm_eps, R * c->n_kv_heads, c->head_dim, f->k);
        }
        if (ops->rope_kv_write) {
            ops->rope_kv_write(be, f->kv, l, f->q, f->k, f->v);
        } else {
            ops->rope(be, l, f->q, f->k);
            ops->kv_write(be, f->kv, l, f->k, f->v);
        }
        if (last && n_out == 0)
            break;          /* only this layer's K/V were needed */
        ops->attention(be, f->kv, l, f->q, f->att);
        float *att = f->att, *xn = f->xb;
        if (last && n_out < R) {
            /* Past the last attention only the rows that produce logits matter: carry
             * on with those alone (each row's values are the same either way). */
            ops->gather_out_rows(be, f->att, qd, f->q);
            ops->gather_out_rows(be, f->x, dim, f->xb);
            att = f->q;
            x = f->xb;
            xn = f->x;
            rows = n_out;
        }
        ops->matmul(be, att, rows, qd, &w->wo, w->bo, f->ob);
        if (c->post_norms)
            ops->rmsnorm(be, f->ob, w->post_attn_norm, c->norm_eps, rows, dim, f->ob);
        add_norm(be, x, f->ob, w->ffn_norm, c->norm_eps, rows, dim, xn);
        if (c->n_experts > 0) {
            ops->moe(be, l, xn, rows, f->ob);
        } else {
            const kvg_tensor *wt[2] = { &w->w_gate, &w->w_up };
            const float *bt[2] = { NULL, NULL };
            float *yt[2] = { f->hb, f->hb2 };
            matmuls(be, xn, rows, dim, 2, wt, bt, yt);
            if (c->ffn_act == KVG_ACT_GELU_TANH)
                ops->geglu(be, f->hb, f->hb2, (size_t)rows * hid);
            else
                ops->swiglu(be, f->hb, f->hb2, (size_t)rows * hid);
            ops->matmul(be, f->hb, rows, hid, &w->w_down, NULL, f->ob);
        }
        if (c->post_norms)
            ops->rmsnorm(be, f->ob, w->post_ffn_norm, c->norm_eps, rows, dim, f->ob);
        if (!last && ops->add_rmsnorm) {
            resid = 1;
        } else if (last && rows < R) {
            /* Final norm and classifier on the output rows, compact in x (rows == n_out). */
            add_norm(be, x, f->ob, m->final_norm, c->norm_eps, n_out, dim, f->ob);
        } else {
            ops->add(be, x, f->ob, (size_t)rows * dim);
        }
        if (last) {
            /* ... or gathered first when every row went through the layer. */
            if (rows == R) {
                ops->gather_out_rows(be, x, dim, xn);
                ops->rmsnorm(be, xn, m->final_norm, c->norm_eps, n_out, dim, f->ob);
            }
            ops->matmul(be, f->ob, n_out, dim, &m->output, NULL, f->logits);
            if (c->final_softcap > 0.0f)
                ops->softcap(be, f->logits, c->final_softcap, (size_t)n_out * c->vocab_size);
        }
    }
    if (n_out)
        ops->read(be, f->logits, f->host_logits, (size_t)n_out * c->vocab_size);
}

void kvg_forward_set_progress(kvg_forward *f, void (*fn)(void *arg), void *arg)
{
    f->progress = fn;
    f->progress_arg = arg;
}

int kvg_forward_step(kvg_forward *f, kvg_fwd_seq *seqs, int n, char *err, size_t err_len)
{
    const kvg_model *m = f->m;
    const kvg_model_config *c = &m->cfg;
    const kvg_backend_ops *ops = f->be->ops;
    kvg_backend *be = f->be;
    int64_t rows64;
    int R, n_out = 0;
    kvg_step st;

    if (check_batch(f, seqs, n, &rows64, err, err_len) != 0)
        return -1;
    R = (int)rows64;
    if (ensure_host(f, R, n) != 0) {
        kvg_set_err(err, err_len, "forward: out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (kvg_kv_seq_prepare(f->kv, seqs[i].kv, seqs[i].n_tokens, err, err_len) != 0) {
            /* Give back the blocks the earlier sequences just took. */
            for (int o = 0; o < i; o++)
                kvg_kv_seq_truncate(f->kv, seqs[o].kv, seqs[o].kv->n_tokens);
            return -1;
        }
    }
    {
        int r = 0;
        for (int i = 0; i < n; i++) {
            for (int t = 0; t < seqs[i].n_tokens; t++, r++) {
                f->tokens[r] = seqs[i].tokens[t];
                f->pos[r] = seqs[i].kv->n_tokens + t;
                f->row_seq[r] = i;
            }
            if (seqs[i].logits)
                f->out_rows[n_out++] = r - 1;
            f->n_blocks[i] = seqs[i].kv->n_blocks;
            f->tables[i] = seqs[i].kv->blocks;
        }
    }
    if (ensure_acts(f, R, n_out, err, err_len) != 0)
        goto fail;
    memset(&st, 0, sizeof st);
    st.n_rows = R;
    st.tokens = f->tokens;
    st.pos = f->pos;
    st.row_seq = f->row_seq;
    st.n_seqs = n;
    st.block_tokens = f->kv->geom.block_tokens;
    st.block_tables = f->tables;
    st.n_blocks = f->n_blocks;
    st.n_out = n_out;
    st.out_rows = f->out_rows;
    if (ops->begin_step(be, &st, err, err_len) != 0)
        goto fail;

    for (int attempt = 0;; attempt++) {
        int rc;
        if (attempt > 0 && ops->begin_step(be, &st, err, err_len) != 0)
            goto fail;
        step_ops(f, R, n_out);
        /* A device backend reports here what failed in the step (its operations are
         * void); then nothing has advanced: the blocks prepared for the step are given
         * back. KVG_STEP_AGAIN: nothing ran, the operations are called once more. */
        rc = ops->end_step ? ops->end_step(be, err, err_len) : 0;
        if (rc == KVG_STEP_AGAIN && attempt < 2)
            continue;
        if (rc != 0) {
            if (rc == KVG_STEP_AGAIN)
                kvg_set_err(err, err_len, "forward: the backend asked for the step a third time");
            goto fail;
        }
        break;
    }
    {
        int o = 0;
        for (int i = 0; i < n; i++) {
            if (seqs[i].logits) {
                memcpy(seqs[i].logits, f->host_logits + (size_t)o * c->vocab_size,
                       (size_t)c->vocab_size * sizeof(float));
                o++;
            }
            seqs[i].kv->n_tokens += seqs[i].n_tokens;
        }
    }
    return 0;
fail:
    for (int i = 0; i < n; i++)
        kvg_kv_seq_truncate(f->kv, seqs[i].kv, seqs[i].kv->n_tokens);
    return -1;
}
