/* A naive single-token forward pass in the style of llama2.c's run.c: one position at a
 * time, F32 weights, plain sequential dot products, no batching, no threads, no BLAS.
 * Written independently of the engine (its own RoPE, including the Llama 3 scaling and
 * both pair layouts, GQA, biases, head_dim != dim/n_heads), so tests can check the
 * engine against it and the benchmark can time it on the same kvg_model's weights.
 *
 * Header-only: included by t/unit tests and t/bench/engine_bench.c. */
#ifndef KVG_REF_FORWARD_H
#define KVG_REF_FORWARD_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

typedef struct ref_layer {
    const float *wq, *wk, *wv, *wo, *w1, *w2, *w3;
} ref_layer;

typedef struct ref_model {
    const kvg_model *m;
    int seq_len;
    const float *emb, *out;
    ref_layer *layers;
    void **owned;                /* F32 copies of non-F32 tensors */
    int n_owned;
    float *key_cache, *value_cache;      /* [layer][seq_len][kv_dim] */
    float *x, *xb, *xb2, *hb, *hb2, *q, *k, *v, *att, *logits, *freq;
} ref_model;

/* F32 view of a tensor: the data itself when F32, else a converted copy. */
static const float *ref_f32(ref_model *r, const kvg_tensor *t)
{
    float *p;
    if (t->dtype == KVG_DT_F32)
        return t->data;
    p = malloc((size_t)t->rows * (size_t)t->cols * sizeof(float));
    if (!p)
        return NULL;
    for (int64_t i = 0; i < t->rows; i++)
        kvg_tensor_row_f32(t, i, p + (size_t)i * (size_t)t->cols);
    r->owned[r->n_owned++] = p;
    return p;
}

/* RoPE frequency of pair p, following the Hugging Face definition of the llama3
 * rope type (wavelength bands, smooth interpolation in between). */
static float ref_rope_freq(const kvg_model_config *c, int p)
{
    float f = 1.0f / powf(c->rope_theta, (float)(2 * p) / (float)c->head_dim);
    if (c->rope_scale_factor > 0.0f) {
        float wavelen = 2.0f * 3.14159265358979f / f;
        float low_wl = (float)c->rope_orig_max_pos / c->rope_low_freq_factor;
        float high_wl = (float)c->rope_orig_max_pos / c->rope_high_freq_factor;
        if (wavelen < high_wl) {
            /* high frequencies: unchanged */
        } else if (wavelen > low_wl) {
            f /= c->rope_scale_factor;
        } else {
            float smooth = ((float)c->rope_orig_max_pos / wavelen - c->rope_low_freq_factor) /
                           (c->rope_high_freq_factor - c->rope_low_freq_factor);
            f = (1.0f - smooth) * f / c->rope_scale_factor + smooth * f;
        }
    }
    return f;
}

static void ref_free(ref_model *r)
{
    for (int i = 0; i < r->n_owned; i++)
        free(r->owned[i]);
    free(r->owned);
    free(r->layers);
    free(r->key_cache);
    free(r->value_cache);
    free(r->x); free(r->xb); free(r->xb2); free(r->hb); free(r->hb2);
    free(r->q); free(r->k); free(r->v); free(r->att); free(r->logits); free(r->freq);
    memset(r, 0, sizeof *r);
}

static int ref_init(ref_model *r, const kvg_model *m, int seq_len)
{
    const kvg_model_config *c = &m->cfg;
    size_t kvd = (size_t)c->n_kv_heads * c->head_dim, qd = (size_t)c->n_heads * c->head_dim;
    memset(r, 0, sizeof *r);
    r->m = m;
    r->seq_len = seq_len;
    r->owned = calloc((size_t)c->n_layers * 7 + 2, sizeof *r->owned);
    r->layers = calloc((size_t)c->n_layers, sizeof *r->layers);
    if (!r->owned || !r->layers)
        goto fail;
    if (!(r->emb = ref_f32(r, &m->tok_embedding)))
        goto fail;
    r->out = m->output.data == m->tok_embedding.data ? r->emb : ref_f32(r, &m->output);
    if (!r->out)
        goto fail;
    for (int l = 0; l < c->n_layers; l++) {
        const kvg_layer_weights *w = &m->layers[l];
        ref_layer *L = &r->layers[l];
        if (!(L->wq = ref_f32(r, &w->wq)) || !(L->wk = ref_f32(r, &w->wk)) ||
            !(L->wv = ref_f32(r, &w->wv)) || !(L->wo = ref_f32(r, &w->wo)) ||
            !(L->w1 = ref_f32(r, &w->w_gate)) || !(L->w2 = ref_f32(r, &w->w_down)) ||
            !(L->w3 = ref_f32(r, &w->w_up)))
            goto fail;
    }
    r->key_cache = calloc((size_t)c->n_layers * seq_len * kvd, sizeof(float));
    r->value_cache = calloc((size_t)c->n_layers * seq_len * kvd, sizeof(float));
    r->x = calloc((size_t)c->dim, sizeof(float));
    r->xb = calloc(qd > (size_t)c->dim ? qd : (size_t)c->dim, sizeof(float));
    r->xb2 = calloc((size_t)c->dim, sizeof(float));
    r->hb = calloc((size_t)c->hidden_dim, sizeof(float));
    r->hb2 = calloc((size_t)c->hidden_dim, sizeof(float));
    r->q = calloc(qd, sizeof(float));
    r->k = calloc(kvd, sizeof(float));
    r->v = calloc(kvd, sizeof(float));
    r->att = calloc((size_t)c->n_heads * seq_len, sizeof(float));
    r->logits = calloc((size_t)c->vocab_size, sizeof(float));
    r->freq = calloc((size_t)c->head_dim / 2, sizeof(float));
    if (!r->key_cache || !r->value_cache || !r->x || !r->xb || !r->xb2 || !r->hb || !r->hb2 ||
        !r->q || !r->k || !r->v || !r->att || !r->logits || !r->freq)
        goto fail;
    for (int p = 0; p < c->head_dim / 2; p++)
        r->freq[p] = ref_rope_freq(c, p);
    return 0;
fail:
    ref_free(r);
    return -1;
}

static void ref_rmsnorm(float *o, const float *x, const float *w, int n, float eps)
{
    float ss = 0.0f;
    for (int j = 0; j < n; j++)
        ss += x[j] * x[j];
    ss /= (float)n;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < n; j++)
        o[j] = w[j] * (ss * x[j]);
}

/* xout[d] = W[d][n] x[n] (+ b) */
static void ref_matmul(float *xout, const float *x, const float *w, const float *b, int n, int d)
{
    for (int i = 0; i < d; i++) {
        float val = 0.0f;
        const float *row = w + (size_t)i * n;
        for (int j = 0; j < n; j++)
            val += row[j] * x[j];
        xout[i] = b ? val + b[i] : val;
    }
}

static void ref_rope(const ref_model *r, float *vec, int n_heads, int pos)
{
    const kvg_model_config *c = &r->m->cfg;
    int hd = c->head_dim, half = hd / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * hd;
        for (int p = 0; p < half; p++) {
            float val = (float)pos * r->freq[p];
            float fcr = cosf(val), fci = sinf(val);
            int i0 = c->rope_layout == KVG_ROPE_HALF ? p : 2 * p;
            int i1 = c->rope_layout == KVG_ROPE_HALF ? p + half : 2 * p + 1;
            float v0 = v[i0], v1 = v[i1];
            v[i0] = v0 * fcr - v1 * fci;
            v[i1] = v0 * fci + v1 * fcr;
        }
    }
}

/* Logits after `token` at `pos` (positions must be fed in order from 0). */
static float *ref_forward(ref_model *r, int token, int pos)
{
    const kvg_model *m = r->m;
    const kvg_model_config *c = &m->cfg;
    int dim = c->dim, hd = c->head_dim, hidden = c->hidden_dim;
    int kvd = c->n_kv_heads * hd, qd = c->n_heads * hd, kv_mul = c->n_heads / c->n_kv_heads;
    float *x = r->x;

    memcpy(x, r->emb + (size_t)token * dim, (size_t)dim * sizeof(float));
    for (int l = 0; l < c->n_layers; l++) {
        const kvg_layer_weights *w = &m->layers[l];
        const ref_layer *L = &r->layers[l];
        size_t loff = (size_t)l * r->seq_len * kvd;
        float *kc = r->key_cache + loff + (size_t)pos * kvd;
        float *vc = r->value_cache + loff + (size_t)pos * kvd;

        ref_rmsnorm(r->xb, x, w->attn_norm, dim, c->norm_eps);
        ref_matmul(r->q, r->xb, L->wq, w->bq, dim, qd);
        ref_matmul(kc, r->xb, L->wk, w->bk, dim, kvd);
        ref_matmul(vc, r->xb, L->wv, w->bv, dim, kvd);
        ref_rope(r, r->q, c->n_heads, pos);
        ref_rope(r, kc, c->n_kv_heads, pos);

        for (int h = 0; h < c->n_heads; h++) {
            const float *q = r->q + (size_t)h * hd;
            float *att = r->att + (size_t)h * r->seq_len;
            float *xb = r->xb + (size_t)h * hd;
            float mx, sum = 0.0f;
            for (int t = 0; t <= pos; t++) {
                const float *k = r->key_cache + loff + (size_t)t * kvd + (size_t)(h / kv_mul) * hd;
                float score = 0.0f;
                for (int i = 0; i < hd; i++)
                    score += q[i] * k[i];
                att[t] = score / sqrtf((float)hd);
            }
            mx = att[0];
            for (int t = 1; t <= pos; t++)
                if (att[t] > mx)
                    mx = att[t];
            for (int t = 0; t <= pos; t++) {
                att[t] = expf(att[t] - mx);
                sum += att[t];
            }
            for (int t = 0; t <= pos; t++)
                att[t] /= sum;
            memset(xb, 0, (size_t)hd * sizeof(float));
            for (int t = 0; t <= pos; t++) {
                const float *v = r->value_cache + loff + (size_t)t * kvd + (size_t)(h / kv_mul) * hd;
                for (int i = 0; i < hd; i++)
                    xb[i] += att[t] * v[i];
            }
        }
        ref_matmul(r->xb2, r->xb, L->wo, NULL, qd, dim);
        for (int i = 0; i < dim; i++)
            x[i] += r->xb2[i];

        ref_rmsnorm(r->xb, x, w->ffn_norm, dim, c->norm_eps);
        ref_matmul(r->hb, r->xb, L->w1, NULL, dim, hidden);
        ref_matmul(r->hb2, r->xb, L->w3, NULL, dim, hidden);
        for (int i = 0; i < hidden; i++) {
            float val = r->hb[i];
            val *= 1.0f / (1.0f + expf(-val));
            r->hb[i] = val * r->hb2[i];
        }
        ref_matmul(r->xb2, r->hb, L->w2, NULL, hidden, dim);
        for (int i = 0; i < dim; i++)
            x[i] += r->xb2[i];
    }
    ref_rmsnorm(x, x, m->final_norm, dim, c->norm_eps);
    ref_matmul(r->logits, x, r->out, NULL, dim, c->vocab_size);
    return r->logits;
}

#endif
