/* llama2.c checkpoints (karpathy/llama2.c), F32 only:
 *   - legacy "version 0": 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 *     vocab_size, seq_len; vocab_size < 0 means the classifier is stored at the end),
 *     then the tensors in run.c's order, with the unused freq_cis tables before the
 *     classifier;
 *   - "ak42" version 1 (export.py version1_export): magic, version, the 7 int32,
 *     uint8 shared_classifier, zero padding to 256 bytes, then norms first, then the
 *     embedding and the stacked matrices, then the classifier when not shared.
 * The file is mapped and the tensors point into it. The tokenizer is a separate file
 * (opts->tokenizer_path). Also the legacy writer, kvg_model_export_llama2c. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_formats.h"
#include "model_internal.h"

#define AK42_MAGIC 0x616b3432u
#define V1_HEADER 256
/* Sanity bounds that also keep every size computation far from overflow. */
#define MAX_DIM (1 << 20)
#define MAX_LAYERS 4096

static int32_t rd_i32(const unsigned char *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return (int32_t)v;
}

/* One stacked region of the file: n_layers (or 1) tensors of rows x cols floats. */
typedef struct region {
    const char *name;
    uint64_t count;              /* tensors in the stack */
    uint64_t rows, cols;
    uint64_t off;                /* byte offset in the file */
    const unsigned char *p;
} region;

enum { R_EMB, R_ATT_NORM, R_WQ, R_WK, R_WV, R_WO, R_FFN_NORM, R_W1, R_W2, R_W3, R_FINAL, R_FREQ_RE,
       R_FREQ_IM, R_CLS, R_N };

/* The region of each weight (a llama2.c model has no biases). */
static const int region_of[KVGM_N_WEIGHTS] = {
    [KVGM_EMBEDDING] = R_EMB, [KVGM_OUTPUT] = R_CLS,     [KVGM_FINAL_NORM] = R_FINAL,
    [KVGM_ATTN_NORM] = R_ATT_NORM, [KVGM_WQ] = R_WQ,     [KVGM_WK] = R_WK,
    [KVGM_WV] = R_WV,         [KVGM_WO] = R_WO,          [KVGM_FFN_NORM] = R_FFN_NORM,
    [KVGM_W_GATE] = R_W1,     [KVGM_W_DOWN] = R_W2,      [KVGM_W_UP] = R_W3,
    [KVGM_BQ] = -1,           [KVGM_BK] = -1,            [KVGM_BV] = -1,
};

/* kvgm_source's find: layer `layer` of the weight's stacked region, F32. The header
 * fixed every region's shape and the file was checked to hold them all, so nothing is
 * left to check; only weights the model has are asked for (no biases, the classifier
 * only when it is not shared). Offsets are multiples of 4 in a page-aligned mapping:
 * the matrices stay there (the norm vectors are copied, as every loader's are). */
static int find(const kvgm_source *s, const char *name, kvgm_weight w, int layer, int64_t mats, int64_t rows,
                int64_t cols, int optional, const void **data, kvg_dtype *dt)
{
    const region *r;
    (void)name, (void)mats, (void)rows, (void)cols, (void)optional;
    assert(region_of[w] >= 0);
    r = (const region *)s->ctx + region_of[w];
    assert(r->count > 0);
    *data = r->p + (uint64_t)(layer < 0 ? 0 : layer) * r->rows * r->cols * 4;
    *dt = KVG_DT_F32;
    return 0;
}

kvg_model *kvgm_load_llama2c(const char *path, const kvg_model_load_opts *opts, char *err, size_t err_len)
{
    const unsigned char *d, *tok_bytes;
    size_t len, tok_len;
    int32_t h[7];
    int version = 0, shared;
    uint64_t off;

    kvg_model *m = kvgm_new_mapped("llama2c", path, &d, &len, err, err_len);
    if (!m)
        return NULL;
    if (len >= 8 && rd_i32(d) == (int32_t)AK42_MAGIC) {
        version = rd_i32(d + 4);
        if (version == 2) {
            kvg_set_err(err, err_len, "%s: llama2.c checkpoint version 2 (int8 quantized) is not supported; "
                     "export version 0 or 1 (fp32)", path);
            goto fail;
        }
        if (version != 1) {
            kvg_set_err(err, err_len, "%s: unknown llama2.c checkpoint version %d (\"ak42\" magic)", path,
                     version);
            goto fail;
        }
        if (len < V1_HEADER) {
            kvg_set_err(err, err_len, "%s: truncated llama2.c version 1 checkpoint: %zu bytes, the header alone is "
                     "%d", path, len, V1_HEADER);
            goto fail;
        }
        for (int i = 0; i < 7; i++)
            h[i] = rd_i32(d + 8 + 4 * i);
        shared = d[36] != 0;
        off = V1_HEADER;
    } else {
        if (len < 28) {
            kvg_set_err(err, err_len, "%s: not a model file (%zu bytes; too short for a llama2.c checkpoint header)",
                     path, len);
            goto fail;
        }
        for (int i = 0; i < 7; i++)
            h[i] = rd_i32(d + 4 * i);
        shared = h[5] > 0;
        if (h[5] < 0 && h[5] != INT32_MIN)
            h[5] = -h[5];
        off = 28;
    }

    int dim = h[0], hidden = h[1], n_layers = h[2], n_heads = h[3], n_kv = h[4], vocab = h[5], seq = h[6];
    if (dim <= 0 || dim > MAX_DIM || hidden <= 0 || hidden > MAX_DIM || n_layers <= 0 || n_layers > MAX_LAYERS
        || n_heads <= 0 || n_heads > dim || n_kv <= 0 || n_kv > n_heads || vocab <= 0 || vocab > (1 << 24)
        || seq <= 0 || seq > (1 << 24)) {
        kvg_set_err(err, err_len, "%s: not a llama2.c checkpoint (no GGUF magic, not a directory, and the llama2.c "
                 "header is implausible: dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, "
                 "vocab_size %d, seq_len %d)", path, h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
        goto fail;
    }
    if (dim % n_heads != 0 || n_heads % n_kv != 0 || (dim / n_heads) % 2 != 0) {
        kvg_set_err(err, err_len, "%s: llama2.c header with inconsistent heads: dim %d, n_heads %d, n_kv_heads %d",
                 path, dim, n_heads, n_kv);
        goto fail;
    }
    uint64_t hs = (uint64_t)(dim / n_heads), kv_dim = hs * (uint64_t)n_kv, L = (uint64_t)n_layers;
    region r[R_N] = {
        [R_EMB] = { "token_embedding_table", 1, (uint64_t)vocab, (uint64_t)dim, 0, NULL },
        [R_ATT_NORM] = { "rms_att_weight", L, 1, (uint64_t)dim, 0, NULL },
        [R_WQ] = { "wq", L, (uint64_t)dim, (uint64_t)dim, 0, NULL },
        [R_WK] = { "wk", L, kv_dim, (uint64_t)dim, 0, NULL },
        [R_WV] = { "wv", L, kv_dim, (uint64_t)dim, 0, NULL },
        [R_WO] = { "wo", L, (uint64_t)dim, (uint64_t)dim, 0, NULL },
        [R_FFN_NORM] = { "rms_ffn_weight", L, 1, (uint64_t)dim, 0, NULL },
        [R_W1] = { "w1", L, (uint64_t)hidden, (uint64_t)dim, 0, NULL },
        [R_W2] = { "w2", L, (uint64_t)dim, (uint64_t)hidden, 0, NULL },
        [R_W3] = { "w3", L, (uint64_t)hidden, (uint64_t)dim, 0, NULL },
        [R_FINAL] = { "rms_final_weight", 1, 1, (uint64_t)dim, 0, NULL },
        [R_FREQ_RE] = { "freq_cis_real", version == 0, (uint64_t)seq, hs / 2, 0, NULL },
        [R_FREQ_IM] = { "freq_cis_imag", version == 0, (uint64_t)seq, hs / 2, 0, NULL },
        [R_CLS] = { "wcls", !shared, (uint64_t)vocab, (uint64_t)dim, 0, NULL },
    };
    static const int order0[R_N] = { R_EMB, R_ATT_NORM, R_WQ, R_WK, R_WV, R_WO, R_FFN_NORM, R_W1, R_W2, R_W3,
                                     R_FINAL, R_FREQ_RE, R_FREQ_IM, R_CLS };
    static const int order1[R_N] = { R_ATT_NORM, R_FFN_NORM, R_FINAL, R_EMB, R_WQ, R_WK, R_WV, R_WO, R_W1, R_W2,
                                     R_W3, R_CLS, R_FREQ_RE, R_FREQ_IM };
    const int *order = version == 0 ? order0 : order1;
    for (int i = 0; i < R_N; i++) {
        region *g = &r[order[i]];
        uint64_t bytes = g->count * g->rows * g->cols * 4;
        g->off = off;
        if (off + bytes > len) {
            kvg_set_err(err, err_len, "%s: truncated llama2.c checkpoint: tensor %s needs bytes [%llu, %llu) but the "
                     "file has %zu bytes", path, g->name, (unsigned long long)off,
                     (unsigned long long)(off + bytes), len);
            goto fail;
        }
        g->p = d + off;
        off += bytes;
    }
    if (off != len) {
        kvg_set_err(err, err_len, "%s: llama2.c checkpoint has %zu bytes but its header (dim %d, n_layers %d, "
                 "vocab_size %d%s) implies %llu", path, len, dim, n_layers, vocab,
                 shared ? ", shared classifier" : ", own classifier", (unsigned long long)off);
        goto fail;
    }

    kvg_model_config *c = &m->cfg;
    snprintf(c->arch, sizeof c->arch, "llama");
    c->dim = dim;
    c->hidden_dim = hidden;
    c->n_layers = n_layers;
    c->n_heads = n_heads;
    c->n_kv_heads = n_kv;
    c->head_dim = (int)hs;
    c->vocab_size = vocab;
    c->max_seq_len = seq;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->rope_layout = KVG_ROPE_ADJACENT;
    c->tied_embeddings = shared;

    kvgm_source src = { m, find, r, NULL, NULL, path, err, err_len, 0 };
    if (kvgm_mat(&src, &m->tok_embedding, KVGM_EMBEDDING, -1, vocab, dim, 0) < 0
        || (!shared && kvgm_mat(&src, &m->output, KVGM_OUTPUT, -1, vocab, dim, 0) < 0)
        || kvgm_vec(&src, &m->final_norm, KVGM_FINAL_NORM, -1, dim, 0) < 0
        || kvgm_bind_layers(&src) < 0)
        goto fail;
    if (shared)
        m->output = m->tok_embedding;

    if (!opts->tokenizer_path) {
        kvg_set_err(err, err_len, "%s: a llama2.c checkpoint has no tokenizer inside; set the tokenizer_path option "
                 "(--tokenizer) to its tokenizer.bin", path);
        goto fail;
    }
    if (kvgm_load_tokenizer_file(m, opts->tokenizer_path, &tok_bytes, &tok_len, err, err_len) < 0)
        goto fail;
    if (kvgm_finish(m, opts, path, 0, err, err_len) < 0)
        goto fail;
    kvgm_part parts[2] = { { "weights", d, len }, { "tokenizer", tok_bytes, tok_len } };
    if (kvgm_identity(m, parts, 2, opts, err, err_len) < 0)
        goto fail;
    return m;
fail:
    kvg_model_free(m);
    return NULL;
}

/* ---- export (legacy version 0) ---- */

typedef struct writer {
    FILE *f;
    float *row;
    int failed;
} writer;

static void put_f32(writer *w, const float *p, size_t n)
{
    if (!w->failed && fwrite(p, 4, n, w->f) != n)
        w->failed = 1;
}

/* Writes t as F32; with `half_hd` > 0 the rows of each head are reordered from
 * rotate-half pairs (i, i + hd/2) to adjacent pairs (2i, 2i + 1). */
static void put_tensor(writer *w, const kvg_tensor *t, int half_hd)
{
    for (int64_t r = 0; r < t->rows; r++) {
        int64_t src = r;
        if (half_hd > 0) {
            int64_t hd = 2 * (int64_t)half_hd, head = r / hd, j = r % hd;
            src = head * hd + (j % 2) * half_hd + j / 2;
        }
        kvg_tensor_row_f32(t, src, w->row);
        put_f32(w, w->row, (size_t)t->cols);
    }
}

int kvg_model_export_llama2c(const kvg_model *m, const char *path, char *err, size_t err_len)
{
    const kvg_model_config *c = &m->cfg;
    const char *why = NULL;

    if (c->has_qkv_bias)
        why = "it has q/k/v biases";
    else if (c->n_experts > 0)
        why = "it is a mixture-of-experts model";
    else if (c->rope_scale_factor != 0)
        why = "it uses rope scaling";
    else if (c->head_dim * c->n_heads != c->dim)
        why = "head_dim * n_heads != dim";
    else if (c->rope_theta != 10000.0f)
        why = "its rope_theta is not 10000";
    else if (c->norm_eps != 1e-5f)
        why = "its RMSNorm epsilon is not 1e-5";
    if (why) {
        kvg_set_err(err, err_len, "%s: cannot export %s as a llama2.c checkpoint: %s (the format cannot say so)",
                 path, m->name, why);
        return -1;
    }
    int64_t maxcols = c->dim > c->hidden_dim ? c->dim : c->hidden_dim;
    writer w = { fopen(path, "wb"), malloc((size_t)maxcols * 4), 0 };
    if (!w.f || !w.row) {
        kvg_set_err(err, err_len, "%s: cannot create: %s", path, w.f ? "out of memory" : strerror(errno));
        if (w.f)
            fclose(w.f);
        free(w.row);
        return -1;
    }
    int32_t h[7] = { c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                     c->tied_embeddings ? c->vocab_size : -c->vocab_size, c->max_seq_len };
    if (fwrite(h, 4, 7, w.f) != 7)
        w.failed = 1;
    int half = c->rope_layout == KVG_ROPE_HALF ? c->head_dim / 2 : 0;
    int L = c->n_layers;
    put_tensor(&w, &m->tok_embedding, 0);
    for (int l = 0; l < L; l++)
        put_f32(&w, m->layers[l].attn_norm, (size_t)c->dim);
    for (int l = 0; l < L; l++)
        put_tensor(&w, &m->layers[l].wq, half);
    for (int l = 0; l < L; l++)
        put_tensor(&w, &m->layers[l].wk, half);
    for (int l = 0; l < L; l++)
        put_tensor(&w, &m->layers[l].wv, 0);
    for (int l = 0; l < L; l++)
        put_tensor(&w, &m->layers[l].wo, 0);
    for (int l = 0; l < L; l++)
        put_f32(&w, m->layers[l].ffn_norm, (size_t)c->dim);
    for (int l = 0; l < L; l++)
        put_tensor(&w, &m->layers[l].w_gate, 0);
    for (int l = 0; l < L; l++)
        put_tensor(&w, &m->layers[l].w_down, 0);
    for (int l = 0; l < L; l++)
        put_tensor(&w, &m->layers[l].w_up, 0);
    put_f32(&w, m->final_norm, (size_t)c->dim);
    /* The legacy freq_cis_real and freq_cis_imag tables: readers skip them. */
    memset(w.row, 0, (size_t)maxcols * 4);
    for (int k = 0; k < 2 * c->max_seq_len; k++)
        put_f32(&w, w.row, (size_t)c->head_dim / 2);
    if (!c->tied_embeddings)
        put_tensor(&w, &m->output, 0);
    free(w.row);
    if (fclose(w.f) != 0)
        w.failed = 1;
    if (w.failed) {
        kvg_set_err(err, err_len, "%s: write failed: %s", path, strerror(errno));
        remove(path);
        return -1;
    }
    return 0;
}
