/* GGUF models of architecture "llama" (Llama 2/3, TinyLlama, Mistral, SmolLM2 as
 * llama.cpp converts them) and "qwen2".
 *
 * Hyperparameters come from the ARCH.* keys, tensors from llama.cpp's names
 * (token_embd, blk.N.attn_q, ..., output_norm, output; no output = tied). A GGUF
 * tensor's ne[0] is its row length, so [ne1][ne0] is our [rows][cols] unchanged and
 * the matrices stay in the mapping. llama.cpp's converter permutes Llama Q/K rows to
 * the adjacent RoPE pairing (its "normal" rope); Qwen2 keeps Hugging Face's
 * rotate-half pairing (its "neox" rope). The tokenizer is read from the same file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model_formats.h"
#include "model_internal.h"
#include "quant.h"

#define GGML_F32 0
#define GGML_F16 1
#define GGML_BF16 30

typedef struct ctx {
    kvg_model *m;
    const kvg_gguf *g;
    const char *path;
    const char *arch;
    char *err;
    size_t err_len;
} ctx;

static int get_int(ctx *c, const char *key, int required, int dflt, int *out)
{
    char k[128];
    int64_t v;
    snprintf(k, sizeof k, "%s.%s", c->arch, key);
    if (!kvg_gguf_find(c->g, k)) {
        if (required) {
            kvg_set_err(c->err, c->err_len, "%s: missing key %s", c->path, k);
            return -1;
        }
        *out = dflt;
        return 0;
    }
    if (kvg_gguf_get_i64(c->g, k, &v) < 0 || v <= 0 || v > INT32_MAX) {
        kvg_set_err(c->err, c->err_len, "%s: key %s is not a positive integer", c->path, k);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int get_float(ctx *c, const char *key, float dflt, float *out)
{
    char k[128];
    double v;
    snprintf(k, sizeof k, "%s.%s", c->arch, key);
    if (!kvg_gguf_find(c->g, k)) {
        *out = dflt;
        return 0;
    }
    if (kvg_gguf_get_f64(c->g, k, &v) < 0 || !(v > 0) || !isfinite(v)) {
        kvg_set_err(c->err, c->err_len, "%s: key %s is not a positive number", c->path, k);
        return -1;
    }
    *out = (float)v;
    return 0;
}

/* llama.cpp's names of the weights; a layer's are blk.N.NAME. */
static const char *const names[KVGM_N_WEIGHTS] = {
    [KVGM_EMBEDDING] = "token_embd.weight",  [KVGM_OUTPUT] = "output.weight",
    [KVGM_FINAL_NORM] = "output_norm.weight", [KVGM_ATTN_NORM] = "attn_norm.weight",
    [KVGM_WQ] = "attn_q.weight",             [KVGM_WK] = "attn_k.weight",
    [KVGM_WV] = "attn_v.weight",             [KVGM_WO] = "attn_output.weight",
    [KVGM_FFN_NORM] = "ffn_norm.weight",     [KVGM_W_GATE] = "ffn_gate.weight",
    [KVGM_W_DOWN] = "ffn_down.weight",       [KVGM_W_UP] = "ffn_up.weight",
    [KVGM_BQ] = "attn_q.bias",               [KVGM_BK] = "attn_k.bias",
    [KVGM_BV] = "attn_v.bias",
};

/* kvgm_source's find: the tensor `name`, its dtype and its shape checked ([rows][cols];
 * rows 0 = a vector of cols). */
static int find(const kvgm_source *s, const char *name, kvgm_weight w, int layer, int64_t rows, int64_t cols,
                int optional, const void **data, kvg_dtype *dt)
{
    ctx *c = s->ctx;
    kvg_qtype qt;
    const kvg_gguf_tensor *t = kvg_gguf_find_tensor(c->g, name);
    (void)w, (void)layer;
    *data = NULL;
    if (!t) {
        if (optional)
            return 0;
        kvg_set_err(c->err, c->err_len, "%s: missing tensor %s", c->path, name);
        return -1;
    }
    switch (t->type) {
    case GGML_F32: *dt = KVG_DT_F32; break;
    case GGML_F16: *dt = KVG_DT_F16; break;
    case GGML_BF16: *dt = KVG_DT_BF16; break;
    default:
        /* The block formats, for matrices only (norm vectors are F32 in every
         * converter's output); MXFP4 is known to src/quant.h but has no kernels here,
         * so it is refused below by name. */
        if (rows && kvg_quant_from_ggml(t->type, &qt) == 0 && qt <= KVG_QTYPE_ENGINE_LAST) {
            *dt = (kvg_dtype)(KVG_DT_Q8_0 + (int)qt);
            break;
        }
        {
        const char *tn = kvg_gguf_ggml_type_name(t->type);
        char num[16];
        snprintf(num, sizeof num, "type %u", t->type);
        kvg_set_err(c->err, c->err_len,
                    "%s: unsupported dtype %s for tensor %s (supported: F32, F16, BF16%s)", c->path,
                    tn ? tn : num, name, rows ? ", Q8_0, Q4_0, Q4_K, Q6_K" : "");
        return -1;
        }
    }
    uint64_t want_rows = rows ? (uint64_t)rows : 1;
    int bad = t->ne[0] != (uint64_t)cols || t->ne[1] != want_rows || t->ne[2] != 1 || t->ne[3] != 1;
    if (bad) {
        char got[96], want[64];
        if (t->n_dims <= 1)
            snprintf(got, sizeof got, "[%llu]", (unsigned long long)t->ne[0]);
        else
            snprintf(got, sizeof got, "[%llu][%llu]%s", (unsigned long long)t->ne[1],
                     (unsigned long long)t->ne[0], t->n_dims > 2 ? "[...]" : "");
        if (rows)
            snprintf(want, sizeof want, "[%lld][%lld]", (long long)rows, (long long)cols);
        else
            snprintf(want, sizeof want, "[%lld]", (long long)cols);
        kvg_set_err(c->err, c->err_len, "%s: tensor %s has shape %s (rows, cols), the hyperparameters need %s",
                 c->path, name, got, want);
        return -1;
    }
    if (cols % kvg_dtype_block(*dt) != 0) {
        /* src/gguf.c refuses such a tensor when it reads the file; this keeps the row
           arithmetic below safe on its own */
        kvg_set_err(c->err, c->err_len, "%s: tensor %s of type %s has %lld columns, not a multiple of its "
                    "block of %d", c->path, name, kvg_dtype_name(*dt), (long long)cols, kvg_dtype_block(*dt));
        return -1;
    }
    if (!t->data) {
        kvg_set_err(c->err, c->err_len, "%s: tensor %s has no data", c->path, name);
        return -1;
    }
    *data = t->data;
    return 0;
}

kvg_model *kvgm_load_gguf(const char *path, const kvg_model_load_opts *opts, char *err, size_t err_len)
{
    char tn[96];
    const unsigned char *d, *tok_bytes = NULL;
    size_t len, tok_len = 0;
    kvg_gguf_str s;

    kvg_model *m = kvgm_new_mapped("gguf", path, &d, &len, err, err_len);
    if (!m)
        return NULL;
    kvg_gguf *g = kvg_gguf_parse(d, len, path, err, err_len);
    if (!g)
        goto fail;
    m->storage->gguf = g;

    char arch[32];
    if (kvg_gguf_get_str(g, "general.architecture", &s) < 0) {
        kvg_set_err(err, err_len, "%s: no general.architecture key", path);
        goto fail;
    }
    snprintf(arch, sizeof arch, "%.*s", (int)(s.len < 31 ? s.len : 31), s.s);
    if (strcmp(arch, "llama") != 0 && strcmp(arch, "qwen2") != 0) {
        kvg_set_err(err, err_len, "%s: unknown architecture \"%.*s\" (supported: llama, qwen2)", path,
                 (int)(s.len < 64 ? s.len : 64), s.s);
        goto fail;
    }
    ctx c = { m, g, path, arch, err, err_len };
    kvg_model_config *cf = &m->cfg;
    snprintf(cf->arch, sizeof cf->arch, "%s", arch);
    int rope_dims;
    if (get_int(&c, "embedding_length", 1, 0, &cf->dim) < 0
        || get_int(&c, "feed_forward_length", 1, 0, &cf->hidden_dim) < 0
        || get_int(&c, "block_count", 1, 0, &cf->n_layers) < 0
        || get_int(&c, "attention.head_count", 1, 0, &cf->n_heads) < 0
        || get_int(&c, "attention.head_count_kv", 0, cf->n_heads, &cf->n_kv_heads) < 0
        || get_int(&c, "context_length", 1, 0, &cf->max_seq_len) < 0
        || get_int(&c, "attention.key_length", 0, cf->dim / cf->n_heads, &cf->head_dim) < 0
        || get_int(&c, "rope.dimension_count", 0, cf->head_dim, &rope_dims) < 0
        || get_float(&c, "attention.layer_norm_rms_epsilon", 1e-5f, &cf->norm_eps) < 0
        || get_float(&c, "rope.freq_base", 10000.0f, &cf->rope_theta) < 0)
        goto fail;
    if (cf->n_layers > 4096 || cf->n_heads % cf->n_kv_heads != 0) {
        kvg_set_err(err, err_len, "%s: bad hyperparameters (block_count %d, head_count %d, head_count_kv %d)", path,
                 cf->n_layers, cf->n_heads, cf->n_kv_heads);
        goto fail;
    }
    if (rope_dims != cf->head_dim) {
        kvg_set_err(err, err_len, "%s: partial RoPE (rope.dimension_count %d of head size %d) is not supported",
                 path, rope_dims, cf->head_dim);
        goto fail;
    }
    snprintf(tn, sizeof tn, "%s.rope.scaling.type", arch);
    if (kvg_gguf_get_str(g, tn, &s) == 0 && !(s.len == 4 && memcmp(s.s, "none", 4) == 0)) {
        kvg_set_err(err, err_len, "%s: rope scaling \"%.*s\" is not supported", path, (int)(s.len < 32 ? s.len : 32),
                 s.s);
        goto fail;
    }
    if (kvg_gguf_find_tensor(g, "rope_freqs.weight")) {
        kvg_set_err(err, err_len, "%s: per-dimension RoPE factors (rope_freqs.weight, Llama 3.1 scaling) are not "
                 "supported", path);
        goto fail;
    }
    cf->rope_layout = strcmp(arch, "qwen2") == 0 ? KVG_ROPE_HALF : KVG_ROPE_ADJACENT;
    cf->has_qkv_bias = strcmp(arch, "qwen2") == 0;

    const kvg_gguf_tensor *emb = kvg_gguf_find_tensor(g, "token_embd.weight");
    if (!emb) {
        kvg_set_err(err, err_len, "%s: missing tensor token_embd.weight", path);
        goto fail;
    }
    if (emb->ne[1] == 0 || emb->ne[1] > (1u << 24)) {
        kvg_set_err(err, err_len, "%s: tensor token_embd.weight has an implausible vocabulary of %llu rows", path,
                 (unsigned long long)emb->ne[1]);
        goto fail;
    }
    cf->vocab_size = (int)emb->ne[1];
    int64_t D = cf->dim, V = cf->vocab_size;
    kvgm_source src = { m, find, &c, names, "blk.", path, err, err_len };
    if (kvgm_mat(&src, &m->tok_embedding, KVGM_EMBEDDING, -1, V, D, 0) < 0
        || kvgm_mat(&src, &m->output, KVGM_OUTPUT, -1, V, D, 1) < 0
        || kvgm_vec(&src, &m->final_norm, KVGM_FINAL_NORM, -1, D, 0) < 0)
        goto fail;
    if (!m->output.data) {
        m->output = m->tok_embedding;
        cf->tied_embeddings = 1;
    }
    if (kvgm_bind_layers(&src) < 0)
        goto fail;

    if (opts->tokenizer_path) {
        if (kvgm_load_tokenizer_file(m, opts->tokenizer_path, &tok_bytes, &tok_len, err, err_len) < 0)
            goto fail;
    } else {
        if (!kvg_gguf_find(g, "tokenizer.ggml.tokens")) {
            kvg_set_err(err, err_len, "%s: the file has no tokenizer (tokenizer.ggml.tokens); set the tokenizer_path "
                     "option", path);
            goto fail;
        }
        m->tokenizer = kvg_tokenizer_load_mem(d, len, path, err, err_len);
        if (!m->tokenizer || kvgm_set_tokenizer_source(m, path, NULL, len, err, err_len) < 0)
            goto fail;
    }
    if (kvg_gguf_get_str(g, "tokenizer.chat_template", &s) == 0) {
        m->chat_template = malloc(s.len + 1);
        if (!m->chat_template) {
            kvg_set_err(err, err_len, "%s: out of memory", path);
            goto fail;
        }
        memcpy(m->chat_template, s.s, s.len);
        m->chat_template[s.len] = '\0';
        snprintf(m->chat_template_from, sizeof m->chat_template_from, "GGUF tokenizer.chat_template of %s",
                 path);
    }
    if (kvgm_finish(m, opts, path, 0, err, err_len) < 0)
        goto fail;
    kvgm_part parts[2] = { { "gguf", d, len }, { "tokenizer", tok_bytes, tok_len } };
    if (kvgm_identity(m, parts, tok_bytes ? 2 : 1, opts, err, err_len) < 0)
        goto fail;
    return m;
fail:
    kvg_model_free(m);
    return NULL;
}
