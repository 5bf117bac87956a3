/* GGUF models of the architectures in `families` below, as llama.cpp converts them:
 * "llama" (Llama 2/3, TinyLlama, Mistral Small, SmolLM2), "qwen2", "qwen3", "qwen3moe",
 * "gemma2", "gemma3", "phi3", "mistral3" (Ministral 3) and "gpt-oss".
 *
 * Hyperparameters come from the ARCH.* keys, tensors from llama.cpp's names
 * (token_embd, blk.N.attn_q, ..., output_norm, output; no output = tied). A GGUF
 * tensor's ne[0] is its row length, so [ne1][ne0] is our [rows][cols] unchanged and
 * the matrices stay in the mapping. A mixture-of-experts layer's experts come stacked in
 * one 3-D tensor per matrix (ne[2] = the expert count), each expert's matrix a row slice
 * of it. llama.cpp's converter permutes Llama Q/K rows to
 * the adjacent RoPE pairing (its "normal" rope); Qwen2 keeps Hugging Face's
 * rotate-half pairing (its "neox" rope), as do the other families. The tokenizer is read
 * from the same file.
 *
 * A family is a row of `families`: the RoPE pairing, a few flags that kvg_model_config
 * carries to the forward pass, and the defaults llama.cpp assumes where a file has no key
 * (its load_hparams). Everything else is common: the keys, the tensor names, the checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model_formats.h"
#include "model_internal.h"
#include "quant.h"
#include "rope.h"

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
    [KVGM_Q_NORM] = "attn_q_norm.weight",    [KVGM_K_NORM] = "attn_k_norm.weight",
    [KVGM_POST_ATTN_NORM] = "post_attention_norm.weight",
    [KVGM_POST_FFN_NORM] = "post_ffw_norm.weight",
    [KVGM_WQKV] = "attn_qkv.weight",         [KVGM_W_GATE_UP] = "ffn_up.weight",
    [KVGM_MOE_ROUTER] = "ffn_gate_inp.weight",
    [KVGM_MOE_GATE] = "ffn_gate_exps.weight", [KVGM_MOE_UP] = "ffn_up_exps.weight",
    [KVGM_MOE_DOWN] = "ffn_down_exps.weight",
    [KVGM_BO] = "attn_output.bias",          [KVGM_ATTN_SINKS] = "attn_sinks.weight",
    [KVGM_MOE_ROUTER_BIAS] = "ffn_gate_inp.bias",
    [KVGM_MOE_GATE_BIAS] = "ffn_gate_exps.bias", [KVGM_MOE_UP_BIAS] = "ffn_up_exps.bias",
    [KVGM_MOE_DOWN_BIAS] = "ffn_down_exps.bias",
};

/* What sets a family apart, as llama.cpp's graph for it computes. */
enum {
    F_QKV_BIAS = 1 << 0,         /* q/k/v biases (Qwen2) */
    F_QK_NORM = 1 << 1,          /* per-head RMSNorm of q and k before RoPE */
    F_POST_NORMS = 1 << 2,       /* RMSNorm of the attention and FFN outputs */
    F_GELU = 1 << 3,             /* GeGLU (tanh GELU) instead of SwiGLU */
    F_EMBED_SCALE = 1 << 4,      /* embeddings times sqrt(dim) */
    F_FUSED_GATE_UP = 1 << 5,    /* ffn_up holds gate then up */
    F_SOFTCAP = 1 << 6,          /* attention and final logit soft-capping */
    F_SWA_KEY_REQUIRED = 1 << 7, /* attention.sliding_window must be in the file */
    F_MOE = 1 << 8,              /* mixture-of-experts FFN: expert_count, expert_used_count,
                                    expert_feed_forward_length; router and stacked experts */
    F_ATTN_TEMP = 1 << 9,        /* Llama 4's query temperature: attention.temperature_scale,
                                    per attention.temperature_length or else
                                    rope.scaling.original_context_length positions */
    F_OAI = 1 << 10              /* gpt-oss: o bias, attention sinks, router and expert
                                    biases, the clamped SwiGLU, output.weight required */
};

typedef struct family {
    const char *arch;
    kvg_rope_layout rope;
    unsigned flags;
    int swa_period;              /* 0: no sliding window; P: of each P layers the first
                                    P - 1 slide and the last is global (llama.cpp's
                                    set_swa_pattern), unless the file gives the pattern */
    int swa_window;              /* the window when the file has no key */
    float swa_rope_theta;        /* RoPE base of the window layers (0: the global one) */
    float attn_softcap, final_softcap;   /* defaults for F_SOFTCAP */
    int big_layers;              /* the layer count llama.cpp takes for the 27B model,
                                    whose scores are scaled by 1/sqrt(dim / n_heads)
                                    instead of 1/sqrt(head_dim) */
    kvg_moe_gating moe_gating;   /* F_MOE: how the router's logits become weights */
    int moe_norm_topk;           /* F_MOE: the k weights renormalized to sum 1 (llama.cpp
                                    fixes it per family, whatever the file says) */
    const char *ffn_norm;        /* the FFN's norm when not ffn_norm.weight (gpt-oss:
                                    post_attention_norm.weight) */
    float attn_temp_offset;      /* F_ATTN_TEMP: added to the position before the floor
                                    (llama.cpp's Mistral 3: 0; its Llama 4: 1) */
} family;

static const family families[] = {
    { "llama", KVG_ROPE_ADJACENT, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL, 0 },
    { "qwen2", KVG_ROPE_HALF, F_QKV_BIAS, 0, 0, 0, 0, 0, 0, 0, 0, NULL, 0 },
    { "qwen3", KVG_ROPE_HALF, F_QK_NORM, 0, 0, 0, 0, 0, 0, 0, 0, NULL, 0 },
    { "qwen3moe", KVG_ROPE_HALF, F_QK_NORM | F_MOE, 0, 0, 0, 0, 0, 0, KVG_MOE_SOFTMAX, 1, NULL, 0 },
    { "gemma2", KVG_ROPE_HALF, F_POST_NORMS | F_GELU | F_EMBED_SCALE | F_SOFTCAP, 2, 4096, 0, 50.0f, 30.0f, 46, 0, 0,
      NULL, 0 },
    { "gemma3", KVG_ROPE_HALF, F_QK_NORM | F_POST_NORMS | F_GELU | F_EMBED_SCALE | F_SWA_KEY_REQUIRED, 6, 0,
      10000.0f, 0, 0, 62, 0, 0, NULL, 0 },
    { "phi3", KVG_ROPE_HALF, F_FUSED_GATE_UP, 0, 0, 0, 0, 0, 0, 0, 0, NULL, 0 },
    { "mistral3", KVG_ROPE_ADJACENT, F_ATTN_TEMP, 0, 0, 0, 0, 0, 0, 0, 0, NULL, 0 },
    { "gpt-oss", KVG_ROPE_HALF, F_QKV_BIAS | F_MOE | F_OAI | F_SWA_KEY_REQUIRED, 2, 0, 0, 0, 0, 0,
      KVG_MOE_TOPK_SOFTMAX, 0, "post_attention_norm.weight", 0 },
};

static const family *find_family(const char *arch)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strcmp(families[i].arch, arch) == 0)
            return &families[i];
    return NULL;
}

/* "llama, qwen2, ..." into buf. */
static const char *family_list(char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof families / sizeof families[0] && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", families[i].arch);
    return buf;
}

/* kvgm_source's find: the tensor `name`, its dtype and its shape checked ([rows][cols];
 * rows 0 = a vector of cols). */
static int find(const kvgm_source *s, const char *name, kvgm_weight w, int layer, int64_t mats, int64_t rows,
                int64_t cols, int optional, const void **data, kvg_dtype *dt)
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
         * converter's output), MXFP4 included (gpt-oss's expert stacks; any matrix). */
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
                    tn ? tn : num, name, rows ? ", Q8_0, Q4_0, Q4_K, Q6_K, MXFP4" : "");
        return -1;
        }
    }
    uint64_t want_rows = rows ? (uint64_t)rows : 1;
    int bad = t->ne[0] != (uint64_t)cols || t->ne[1] != want_rows || t->ne[2] != (uint64_t)mats || t->ne[3] != 1;
    if (bad) {
        char got[96], want[64];
        if (t->n_dims <= 1)
            snprintf(got, sizeof got, "[%llu]", (unsigned long long)t->ne[0]);
        else if (t->n_dims == 3)
            snprintf(got, sizeof got, "[%llu][%llu][%llu]", (unsigned long long)t->ne[2],
                     (unsigned long long)t->ne[1], (unsigned long long)t->ne[0]);
        else
            snprintf(got, sizeof got, "[%llu][%llu]%s", (unsigned long long)t->ne[1],
                     (unsigned long long)t->ne[0], t->n_dims > 2 ? "[...]" : "");
        if (mats > 1)
            snprintf(want, sizeof want, "[%lld][%lld][%lld]", (long long)mats, (long long)rows, (long long)cols);
        else if (rows)
            snprintf(want, sizeof want, "[%lld][%lld]", (long long)rows, (long long)cols);
        else
            snprintf(want, sizeof want, "[%lld]", (long long)cols);
        kvg_set_err(c->err, c->err_len, "%s: tensor %s has shape %s (%srows, cols), the hyperparameters need %s",
                 c->path, name, got, t->n_dims == 3 ? "matrices, " : "", want);
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

/* YaRN's keys, with llama.cpp's defaults (betas 32 and 1, no log multiplier, attention
 * factor 1); the original context is required. The attention factor stored is the one
 * llama.cpp's context computes (rope.h). */
static int read_yarn(ctx *c, kvg_model_config *cf)
{
    float log_mul, attn;
    if (get_float(c, "rope.scaling.factor", 1.0f, &cf->rope_yarn_factor) < 0
        || get_int(c, "rope.scaling.original_context_length", 1, 0, &cf->rope_yarn_orig_ctx) < 0
        || get_float(c, "rope.scaling.yarn_beta_fast", 32.0f, &cf->rope_yarn_beta_fast) < 0
        || get_float(c, "rope.scaling.yarn_beta_slow", 1.0f, &cf->rope_yarn_beta_slow) < 0
        || get_float(c, "rope.scaling.yarn_log_multiplier", 0.0f, &log_mul) < 0
        || get_float(c, "rope.scaling.attn_factor", 1.0f, &attn) < 0)
        return -1;
    cf->rope_attn_factor = kvg_rope_yarn_attn_factor(cf->rope_yarn_factor, log_mul, attn);
    return 0;
}

/* "ARCH.rope.scaling.*": none, linear (positions times 1 / factor) or YaRN. Llama 3's
 * per-pair factors come as a tensor (read_rope_factors). */
static int read_rope_scaling(ctx *c, kvg_model_config *cf)
{
    char k[96];
    kvg_gguf_str s;
    float factor;
    snprintf(k, sizeof k, "%s.rope.scaling.type", c->arch);
    if (kvg_gguf_get_str(c->g, k, &s) != 0 || (s.len == 4 && memcmp(s.s, "none", 4) == 0))
        return 0;
    if (s.len == 4 && memcmp(s.s, "yarn", 4) == 0)
        return read_yarn(c, cf);
    if (!(s.len == 6 && memcmp(s.s, "linear", 6) == 0)) {
        kvg_set_err(c->err, c->err_len, "%s: rope scaling \"%.*s\" is not supported (supported: none, linear, "
                    "yarn)", c->path, (int)(s.len < 32 ? s.len : 32), s.s);
        return -1;
    }
    if (get_float(c, "rope.scaling.factor", 1.0f, &factor) < 0)
        return -1;
    cf->rope_freq_scale = 1.0f / factor;
    return 0;
}

/* The sliding-window layers from "ARCH.attention.sliding_window_pattern": a period P
 * (of each P layers the first P - 1 slide) or one bool per layer (true: slides). */
static int read_swa_pattern(ctx *c, const family *fam, kvg_model *m)
{
    char k[96];
    int period = fam->swa_period;
    const kvg_gguf_kv *arr;
    snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", c->arch);
    arr = kvg_gguf_get_arr(c->g, k, KVG_GGUF_BOOL);
    if (arr) {
        if (arr->arr_n != (uint64_t)m->cfg.n_layers) {
            kvg_set_err(c->err, c->err_len, "%s: key %s has %llu entries for %d layers", c->path, k,
                        (unsigned long long)arr->arr_n, m->cfg.n_layers);
            return -1;
        }
        for (int l = 0; l < m->cfg.n_layers; l++) {
            int64_t b = 0;
            if (kvg_gguf_arr_i64(arr, (uint64_t)l, &b) < 0)
                return -1;
            m->layers[l].sliding = b != 0;
        }
        return 0;
    }
    if (kvg_gguf_find(c->g, k) && get_int(c, "attention.sliding_window_pattern", 1, 0, &period) < 0)
        return -1;
    for (int l = 0; l < m->cfg.n_layers; l++)
        m->layers[l].sliding = l % period < period - 1;
    return 0;
}

/* A mixture-of-experts family's keys, as llama.cpp's load_hparams reads them: the expert
 * width defaults to feed_forward_length / expert_used_count, and feed_forward_length
 * (the dense width, unused by such a model) to the expert width. */
static int read_moe(ctx *c, const family *fam, kvg_model_config *cf)
{
    if (get_int(c, "expert_count", 1, 0, &cf->n_experts) < 0
        || get_int(c, "expert_used_count", 1, 0, &cf->n_experts_used) < 0
        || get_int(c, "expert_feed_forward_length", 0, 0, &cf->expert_hidden_dim) < 0)
        return -1;
    if (cf->n_experts > 65536 || cf->n_experts_used > cf->n_experts) {
        kvg_set_err(c->err, c->err_len, "%s: bad hyperparameters (expert_count %d, expert_used_count %d)",
                    c->path, cf->n_experts, cf->n_experts_used);
        return -1;
    }
    if (!cf->expert_hidden_dim)
        cf->expert_hidden_dim = cf->hidden_dim / cf->n_experts_used;
    if (!cf->hidden_dim)
        cf->hidden_dim = cf->expert_hidden_dim;
    if (!cf->expert_hidden_dim) {
        kvg_set_err(c->err, c->err_len, "%s: no %s.expert_feed_forward_length (nor feed_forward_length)", c->path,
                    c->arch);
        return -1;
    }
    cf->moe_gating = fam->moe_gating;
    cf->moe_norm_topk = fam->moe_norm_topk;
    return 0;
}

/* The family's flags into the config, with its keys: the window, the soft caps, the
 * attention scale of the 27B Gemmas. */
static int read_family(ctx *c, const family *fam, kvg_model_config *cf)
{
    cf->rope_layout = fam->rope;
    cf->has_qkv_bias = (fam->flags & F_QKV_BIAS) != 0;
    cf->qk_norm = (fam->flags & F_QK_NORM) != 0;
    cf->post_norms = (fam->flags & F_POST_NORMS) != 0;
    cf->ffn_act = fam->flags & F_GELU ? KVG_ACT_GELU_TANH : KVG_ACT_SILU;
    if (fam->flags & F_EMBED_SCALE)
        cf->embed_scale = sqrtf((float)cf->dim);
    if (fam->flags & F_SOFTCAP) {
        if (get_float(c, "attn_logit_softcapping", fam->attn_softcap, &cf->attn_softcap) < 0
            || get_float(c, "final_logit_softcapping", fam->final_softcap, &cf->final_softcap) < 0)
            return -1;
    }
    if (fam->swa_period) {
        if (get_int(c, "attention.sliding_window", (fam->flags & F_SWA_KEY_REQUIRED) != 0, fam->swa_window,
                    &cf->swa_window) < 0)
            return -1;
        cf->rope_theta_swa = fam->swa_rope_theta;
    }
    if (fam->big_layers && cf->n_layers == fam->big_layers)
        cf->attn_query_scalar = (float)(cf->dim / cf->n_heads);
    if (fam->flags & F_ATTN_TEMP) {
        /* llama.cpp: the floor scale is the original context unless the file says */
        if (get_float(c, "attention.temperature_scale", 0.0f, &cf->attn_temp_scale) < 0
            || get_int(c, "attention.temperature_length", 0, cf->rope_yarn_orig_ctx, &cf->attn_temp_floor) < 0)
            return -1;
        if (cf->attn_temp_scale != 0.0f && cf->attn_temp_floor <= 0) {
            kvg_set_err(c->err, c->err_len, "%s: %s.attention.temperature_scale without an original context "
                        "(rope.scaling.original_context_length) for its floor", c->path, c->arch);
            return -1;
        }
        cf->attn_temp_offset = fam->attn_temp_offset;
    }
    if (fam->flags & F_OAI) {
        cf->has_o_bias = cf->attn_sinks = cf->moe_biases = 1;
        cf->ffn_act = KVG_ACT_SWIGLU_OAI;
    }
    if (fam->flags & F_MOE)
        return read_moe(c, fam, cf);
    return 0;
}

/* A [rope_dims / 2] F32 vector of RoPE factors, owned by the model; 0 when absent. */
static int rope_factor_vec(const kvgm_source *src, const char *name, const float **out)
{
    ctx *c = src->ctx;
    const kvg_gguf_tensor *t = kvg_gguf_find_tensor(c->g, name);
    int64_t half = kvg_rope_dims(&src->m->cfg) / 2;
    float *f;
    *out = NULL;
    if (!t)
        return 0;
    if (t->type != GGML_F32 || t->n_dims != 1 || t->ne[0] != (uint64_t)half || !t->data) {
        kvg_set_err(c->err, c->err_len, "%s: tensor %s must be F32 [%lld] (the rotated dimensions / 2)", c->path, name,
                    (long long)half);
        return -1;
    }
    f = kvgm_alloc(src->m, (size_t)half * sizeof *f);
    if (!f) {
        kvg_set_err(c->err, c->err_len, "%s: out of memory", c->path);
        return -1;
    }
    memcpy(f, t->data, (size_t)half * sizeof *f);
    *out = f;
    return 0;
}

/* Per-pair frequency divisors: Llama 3.1's rope_freqs, or Phi-3's LongRoPE pair, of
 * which llama.cpp takes the long one when the context exceeds the original one
 * (rope.scaling.original_context_length) -- here the engine's context, known once
 * kvgm_finish has applied the max_seq_len option -- with cos and sin scaled by
 * rope.scaling.attn_factor. */
static int read_rope_factors(ctx *c, const kvgm_source *src)
{
    kvg_model_config *cf = &src->m->cfg;
    const float *freqs, *lng, *shrt;
    int orig;
    if (rope_factor_vec(src, "rope_freqs.weight", &freqs) < 0
        || rope_factor_vec(src, "rope_factors_long.weight", &lng) < 0
        || rope_factor_vec(src, "rope_factors_short.weight", &shrt) < 0)
        return -1;
    if (freqs) {
        cf->rope_freq_factors = freqs;
        return 0;
    }
    if (!lng && !shrt)
        return 0;
    if (!lng || !shrt) {
        kvg_set_err(c->err, c->err_len, "%s: LongRoPE needs both rope_factors_long.weight and "
                    "rope_factors_short.weight", c->path);
        return -1;
    }
    if (get_int(c, "rope.scaling.original_context_length", 0, cf->max_seq_len, &orig) < 0
        || get_float(c, "rope.scaling.attn_factor", 1.0f, &cf->rope_attn_factor) < 0)
        return -1;
    cf->rope_freq_factors = cf->max_seq_len > orig ? lng : shrt;
    return 0;
}

kvg_model *kvgm_load_gguf(const char *path, const kvg_model_load_opts *opts, char *err, size_t err_len)
{
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
    const family *fam = find_family(arch);
    if (!fam) {
        char list[160];
        kvg_set_err(err, err_len, "%s: unknown architecture \"%.*s\" (supported: %s)", path,
                 (int)(s.len < 64 ? s.len : 64), s.s, family_list(list, sizeof list));
        goto fail;
    }
    ctx c = { m, g, path, arch, err, err_len };
    kvg_model_config *cf = &m->cfg;
    snprintf(cf->arch, sizeof cf->arch, "%s", arch);
    int rope_dims;
    if (get_int(&c, "embedding_length", 1, 0, &cf->dim) < 0
        || get_int(&c, "feed_forward_length", !(fam->flags & F_MOE), 0, &cf->hidden_dim) < 0
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
    {
        int v_len;
        if (get_int(&c, "attention.value_length", 0, cf->head_dim, &v_len) < 0)
            goto fail;
        if (v_len != cf->head_dim) {
            kvg_set_err(err, err_len, "%s: attention.value_length %d differs from attention.key_length %d, which "
                     "is not supported", path, v_len, cf->head_dim);
            goto fail;
        }
    }
    if (rope_dims > cf->head_dim || rope_dims % 2 != 0) {
        kvg_set_err(err, err_len, "%s: rope.dimension_count %d: not an even number up to the head size %d",
                 path, rope_dims, cf->head_dim);
        goto fail;
    }
    cf->rope_dims = rope_dims == cf->head_dim ? 0 : rope_dims;
    if (read_rope_scaling(&c, cf) < 0 || read_family(&c, fam, cf) < 0)
        goto fail;

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
    /* the family's names: llama.cpp's, but for a differently named FFN norm */
    const char *fam_names[KVGM_N_WEIGHTS];
    memcpy(fam_names, names, sizeof fam_names);
    if (fam->ffn_norm)
        fam_names[KVGM_FFN_NORM] = fam->ffn_norm;
    kvgm_source src = { m, find, &c, fam_names, "blk.", path, err, err_len, (fam->flags & F_FUSED_GATE_UP) != 0 };
    if (kvgm_mat(&src, &m->tok_embedding, KVGM_EMBEDDING, -1, V, D, 0) < 0
        || kvgm_mat(&src, &m->output, KVGM_OUTPUT, -1, V, D, !(fam->flags & F_OAI)) < 0
        || kvgm_vec(&src, &m->final_norm, KVGM_FINAL_NORM, -1, D, 0) < 0)
        goto fail;
    if (!m->output.data) {
        m->output = m->tok_embedding;
        cf->tied_embeddings = 1;
    }
    if (kvgm_bind_layers(&src) < 0 || (fam->swa_period && read_swa_pattern(&c, fam, m) < 0))
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
    if (kvgm_finish(m, opts, path, 0, err, err_len) < 0 || read_rope_factors(&c, &src) < 0)
        goto fail;
    kvgm_part parts[2] = { { "gguf", d, len }, { "tokenizer", tok_bytes, tok_len } };
    if (kvgm_identity(m, parts, tok_bytes ? 2 : 1, opts, err, err_len) < 0)
        goto fail;
    return m;
fail:
    kvg_model_free(m);
    return NULL;
}
