/* Hugging Face model directories: config.json, model.safetensors or shards listed in
 * model.safetensors.index.json, tokenizer.json, tokenizer_config.json.
 *
 * Architectures llama (Llama 2/3, TinyLlama, SmolLM2), mistral and qwen2 (q/k/v
 * biases). Q and K stay as stored: transformers pairs RoPE dimensions as
 * (i, i + head_dim/2) ("rotate_half"), so the config says KVG_ROPE_HALF and nothing
 * is permuted. Tensors point into the mapped shards; only norms and biases in
 * F16/BF16 are converted, and misaligned data is copied. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "model_formats.h"
#include "model_internal.h"
#include "safetensors.h"

#define MAX_SHARDS 1024

typedef struct shard {
    char path[4096];
    const unsigned char *data;
    size_t len;
    kvg_safetensors *st;
} shard;

typedef struct hf {
    kvg_model *m;
    const char *dir;
    shard *shards;
    size_t n_shards;
    char *err;
    size_t err_len;
} hf;

static void join(char *out, size_t cap, const char *dir, const char *file)
{
    snprintf(out, cap, "%s/%s", dir, file);
}

/* Loads DIR/FILE as JSON (mapped into the model so the identity can hash it). */
static json_t *load_json(kvg_model *m, const char *dir, const char *file, const unsigned char **bytes,
                         size_t *len, char *err, size_t err_len)
{
    char path[4096];
    json_error_t je;
    join(path, sizeof path, dir, file);
    if (kvgm_map_file(m, path, bytes, len, err, err_len) < 0)
        return NULL;
    json_t *j = json_loadb((const char *)*bytes, *len, 0, &je);
    if (!j || !json_is_object(j)) {
        kvg_set_err(err, err_len, "%s: bad JSON: %s (line %d)", path, j ? "not an object" : je.text, je.line);
        json_decref(j);
        return NULL;
    }
    return j;
}

/* Config readers: absent (or null) keys give the default; present ones must fit. */
static int cfg_int(json_t *c, const char *key, int required, int dflt, int *out, const char *path, char *err,
                   size_t err_len)
{
    json_t *v = json_object_get(c, key);
    if (!v || json_is_null(v)) {
        if (required) {
            kvg_set_err(err, err_len, "%s: missing %s", path, key);
            return -1;
        }
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > INT32_MAX) {
        kvg_set_err(err, err_len, "%s: %s is not a positive integer", path, key);
        return -1;
    }
    *out = (int)json_integer_value(v);
    return 0;
}

static int cfg_num(json_t *c, const char *key, float dflt, float *out, const char *path, char *err,
                   size_t err_len)
{
    json_t *v = json_object_get(c, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v))) {
        kvg_set_err(err, err_len, "%s: %s is not a positive number", path, key);
        return -1;
    }
    *out = (float)json_number_value(v);
    return 0;
}

static int cfg_bool(json_t *c, const char *key, int dflt)
{
    json_t *v = json_object_get(c, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int parse_rope_scaling(kvg_model_config *cf, json_t *c, const char *path, char *err, size_t err_len)
{
    json_t *rs = json_object_get(c, "rope_scaling");
    if (!rs || json_is_null(rs))
        return 0;
    json_t *t = json_object_get(rs, "rope_type");
    if (!json_is_string(t))
        t = json_object_get(rs, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "";
    if (strcmp(type, "default") == 0)
        return 0;
    if (strcmp(type, "llama3") != 0) {
        kvg_set_err(err, err_len, "%s: rope_scaling type \"%s\" is not supported (only llama3)", path, type);
        return -1;
    }
    if (cfg_num(rs, "factor", 0, &cf->rope_scale_factor, path, err, err_len) < 0
        || cfg_num(rs, "low_freq_factor", 0, &cf->rope_low_freq_factor, path, err, err_len) < 0
        || cfg_num(rs, "high_freq_factor", 0, &cf->rope_high_freq_factor, path, err, err_len) < 0
        || cfg_int(rs, "original_max_position_embeddings", 1, 0, &cf->rope_orig_max_pos, path, err, err_len) < 0)
        return -1;
    if (!(cf->rope_scale_factor > 0) || !(cf->rope_low_freq_factor > 0)
        || !(cf->rope_high_freq_factor > cf->rope_low_freq_factor)) {
        kvg_set_err(err, err_len, "%s: llama3 rope_scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0",
                 path);
        return -1;
    }
    return 0;
}

static int parse_config(kvg_model *m, json_t *c, const char *path, char *err, size_t err_len)
{
    kvg_model_config *cf = &m->cfg;
    const char *type = json_string_value(json_object_get(c, "model_type"));
    json_t *archs = json_object_get(c, "architectures");
    const char *a0 = json_string_value(json_array_get(archs, 0));
    if (!type && a0)
        type = strcmp(a0, "LlamaForCausalLM") == 0 ? "llama" : strcmp(a0, "MistralForCausalLM") == 0 ? "mistral"
             : strcmp(a0, "Qwen2ForCausalLM") == 0 ? "qwen2" : a0;
    if (!type) {
        kvg_set_err(err, err_len, "%s: no model_type or architectures", path);
        return -1;
    }
    if (strcmp(type, "llama") != 0 && strcmp(type, "mistral") != 0 && strcmp(type, "qwen2") != 0) {
        kvg_set_err(err, err_len, "%s: unknown architecture \"%.64s\" (supported: llama, mistral, qwen2)", path, type);
        return -1;
    }
    int qwen = strcmp(type, "qwen2") == 0;
    snprintf(cf->arch, sizeof cf->arch, "%s", qwen ? "qwen2" : "llama");
    if (cfg_int(c, "hidden_size", 1, 0, &cf->dim, path, err, err_len) < 0
        || cfg_int(c, "intermediate_size", 1, 0, &cf->hidden_dim, path, err, err_len) < 0
        || cfg_int(c, "num_hidden_layers", 1, 0, &cf->n_layers, path, err, err_len) < 0
        || cfg_int(c, "num_attention_heads", 1, 0, &cf->n_heads, path, err, err_len) < 0
        || cfg_int(c, "num_key_value_heads", 0, cf->n_heads, &cf->n_kv_heads, path, err, err_len) < 0
        || cfg_int(c, "head_dim", 0, cf->dim / cf->n_heads, &cf->head_dim, path, err, err_len) < 0
        || cfg_int(c, "vocab_size", 1, 0, &cf->vocab_size, path, err, err_len) < 0
        || cfg_int(c, "max_position_embeddings", 0, 2048, &cf->max_seq_len, path, err, err_len) < 0
        || cfg_num(c, "rms_norm_eps", 1e-6f, &cf->norm_eps, path, err, err_len) < 0
        || cfg_num(c, "rope_theta", 10000.0f, &cf->rope_theta, path, err, err_len) < 0
        || parse_rope_scaling(cf, c, path, err, err_len) < 0)
        return -1;
    if (cf->n_layers > 4096 || cf->n_heads % cf->n_kv_heads != 0) {
        kvg_set_err(err, err_len, "%s: bad num_hidden_layers %d or heads (%d attention, %d key/value)", path,
                 cf->n_layers, cf->n_heads, cf->n_kv_heads);
        return -1;
    }
    if (!qwen && (cfg_bool(c, "attention_bias", 0) || cfg_bool(c, "mlp_bias", 0))) {
        kvg_set_err(err, err_len, "%s: attention_bias / mlp_bias are not supported", path);
        return -1;
    }
    cf->has_qkv_bias = qwen;
    cf->tied_embeddings = cfg_bool(c, "tie_word_embeddings", 0);
    cf->rope_layout = KVG_ROPE_HALF;
    /* The engine attends to the whole context: with a sliding window, contexts up to
     * the window are exact, so that is the usable length. */
    json_t *sw = json_object_get(c, "sliding_window");
    int use_sw = qwen ? cfg_bool(c, "use_sliding_window", 0) : 1;
    if (use_sw && json_is_integer(sw) && json_integer_value(sw) > 0 && json_integer_value(sw) < cf->max_seq_len)
        cf->max_seq_len = (int)json_integer_value(sw);
    return 0;
}

static int shard_name_ok(const char *s)
{
    return *s && *s != '.' && !strchr(s, '/') && strlen(s) < 256;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Maps and parses the shards: model.safetensors, or every file the index names. */
static int open_shards(hf *h)
{
    char path[4096];
    const char **names = NULL;
    size_t n = 0;
    json_t *idx = NULL;

    join(path, sizeof path, h->dir, "model.safetensors");
    if (access(path, F_OK) == 0) {
        static const char *single = "model.safetensors";
        names = malloc(sizeof *names);
        if (!names)
            goto oom;
        names[n++] = single;
    } else {
        const unsigned char *b;
        size_t len;
        join(path, sizeof path, h->dir, "model.safetensors.index.json");
        if (access(path, F_OK) != 0) {
            kvg_set_err(h->err, h->err_len, "%s: no model.safetensors or model.safetensors.index.json", h->dir);
            return -1;
        }
        idx = load_json(h->m, h->dir, "model.safetensors.index.json", &b, &len, h->err, h->err_len);
        if (!idx)
            return -1;
        json_t *wm = json_object_get(idx, "weight_map");
        if (!json_is_object(wm) || json_object_size(wm) == 0) {
            kvg_set_err(h->err, h->err_len, "%s: no weight_map", path);
            goto fail;
        }
        names = malloc(json_object_size(wm) * sizeof *names);
        if (!names)
            goto oom;
        const char *key;
        json_t *v;
        json_object_foreach(wm, key, v) {
            const char *f = json_string_value(v);
            if (!f || !shard_name_ok(f)) {
                kvg_set_err(h->err, h->err_len, "%s: weight_map entry for %s is not a file name in the directory",
                         path, key);
                goto fail;
            }
            names[n++] = f;
        }
        qsort(names, n, sizeof *names, cmp_str);
        size_t u = 0;
        for (size_t i = 0; i < n; i++)
            if (u == 0 || strcmp(names[u - 1], names[i]) != 0)
                names[u++] = names[i];
        n = u;
        if (n > MAX_SHARDS) {
            kvg_set_err(h->err, h->err_len, "%s: %zu shards (at most %d)", path, n, MAX_SHARDS);
            goto fail;
        }
    }
    h->shards = calloc(n, sizeof *h->shards);
    if (!h->shards)
        goto oom;
    h->n_shards = n;
    for (size_t i = 0; i < n; i++) {
        shard *s = &h->shards[i];
        join(s->path, sizeof s->path, h->dir, names[i]);
        if (kvgm_map_file(h->m, s->path, &s->data, &s->len, h->err, h->err_len) < 0)
            goto fail;
        s->st = kvg_st_parse(s->data, s->len, s->path, h->err, h->err_len);
        if (!s->st)
            goto fail;
    }
    free(names);
    json_decref(idx);
    return 0;
oom:
    kvg_set_err(h->err, h->err_len, "%s: out of memory", h->dir);
fail:
    free(names);
    json_decref(idx);
    return -1;
}

/* transformers' names of the weights; a layer's are model.layers.N.NAME. */
static const char *const names[KVGM_N_WEIGHTS] = {
    [KVGM_EMBEDDING] = "model.embed_tokens.weight",
    [KVGM_OUTPUT] = "lm_head.weight",
    [KVGM_FINAL_NORM] = "model.norm.weight",
    [KVGM_ATTN_NORM] = "input_layernorm.weight",
    [KVGM_WQ] = "self_attn.q_proj.weight",
    [KVGM_WK] = "self_attn.k_proj.weight",
    [KVGM_WV] = "self_attn.v_proj.weight",
    [KVGM_WO] = "self_attn.o_proj.weight",
    [KVGM_FFN_NORM] = "post_attention_layernorm.weight",
    [KVGM_W_GATE] = "mlp.gate_proj.weight",
    [KVGM_W_DOWN] = "mlp.down_proj.weight",
    [KVGM_W_UP] = "mlp.up_proj.weight",
    [KVGM_BQ] = "self_attn.q_proj.bias",
    [KVGM_BK] = "self_attn.k_proj.bias",
    [KVGM_BV] = "self_attn.v_proj.bias",
};

/* kvgm_source's find: the tensor `name` in whichever shard holds it, its dtype and its
 * shape [rows][cols] (rows 0: a vector of cols) checked. */
static int find(const kvgm_source *src, const char *name, kvgm_weight w, int layer, int64_t mats, int64_t rows,
                int64_t cols, int optional, const void **data, kvg_dtype *dt)
{
    hf *h = src->ctx;
    const kvg_st_tensor *t = NULL;
    const shard *s = NULL;
    (void)w, (void)layer;
    /* No Hugging Face config read here sets n_experts, so nothing asks for a stack. */
    assert(mats == 1);
    *data = NULL;
    for (size_t i = 0; i < h->n_shards && !t; i++)
        if ((t = kvg_st_find(h->shards[i].st, name)))
            s = &h->shards[i];
    if (!t) {
        if (optional)
            return 0;
        kvg_set_err(h->err, h->err_len, "%s: missing tensor %s", h->n_shards == 1 ? h->shards[0].path : h->dir, name);
        return -1;
    }
    if (strcmp(t->dtype, "F32") == 0)
        *dt = KVG_DT_F32;
    else if (strcmp(t->dtype, "F16") == 0)
        *dt = KVG_DT_F16;
    else if (strcmp(t->dtype, "BF16") == 0)
        *dt = KVG_DT_BF16;
    else {
        kvg_set_err(h->err, h->err_len, "%s: unsupported dtype %s for tensor %s (supported: F32, F16, BF16)", s->path,
                 t->dtype, name);
        return -1;
    }
    int good = rows ? t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols
                    : t->n_dims == 1 && t->shape[0] == cols;
    if (!good) {
        char got[128], want[64];
        int o = snprintf(got, sizeof got, "[");
        for (int d = 0; d < t->n_dims && o < (int)sizeof got - 24; d++)
            o += snprintf(got + o, sizeof got - (size_t)o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        snprintf(got + o, sizeof got - (size_t)o, "]");
        if (rows)
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
        else
            snprintf(want, sizeof want, "[%lld]", (long long)cols);
        kvg_set_err(h->err, h->err_len, "%s: tensor %s has shape %s, config.json needs %s", s->path, name, got, want);
        return -1;
    }
    *data = t->data;
    return 0;
}

static int bind_all(hf *h)
{
    kvg_model *m = h->m;
    int64_t D = m->cfg.dim, V = m->cfg.vocab_size;
    kvgm_source src = { m, find, h, names, "model.layers.", h->dir, h->err, h->err_len, 0 };

    if (kvgm_mat(&src, &m->tok_embedding, KVGM_EMBEDDING, -1, V, D, 0) < 0
        || kvgm_vec(&src, &m->final_norm, KVGM_FINAL_NORM, -1, D, 0) < 0)
        return -1;
    /* Tied checkpoints often omit lm_head; when present, transformers ties it anyway. */
    if (m->cfg.tied_embeddings)
        m->output = m->tok_embedding;
    else if (kvgm_mat(&src, &m->output, KVGM_OUTPUT, -1, V, D, 0) < 0)
        return -1;
    return kvgm_bind_layers(&src);
}

/* The chat template as transformers finds it: chat_template.jinja when it
 * exists (it wins over the config's), else tokenizer_config.json's
 * "chat_template" (a string, or a list of {name, template}: the "default" one).
 * Absent is fine: the engine then serves no chat unless told a template. */
static int load_chat_template(kvg_model *m, const char *dir, char *err, size_t err_len)
{
    char path[4096];
    const unsigned char *b;
    size_t len;
    const char *tpl = NULL;
    json_t *j = NULL;

    join(path, sizeof path, dir, "chat_template.jinja");
    if (access(path, F_OK) == 0) {
        if (kvgm_map_file(m, path, &b, &len, err, err_len) < 0)
            return -1;
        m->chat_template = strndup((const char *)b, len);
        if (!m->chat_template) {
            kvg_set_err(err, err_len, "%s: out of memory", path);
            return -1;
        }
        snprintf(m->chat_template_from, sizeof m->chat_template_from, "%.190s", path);
        return 0;
    }
    join(path, sizeof path, dir, "tokenizer_config.json");
    if (access(path, F_OK) != 0)
        return 0;
    j = load_json(m, dir, "tokenizer_config.json", &b, &len, err, err_len);
    if (!j)
        return -1;
    json_t *ct = json_object_get(j, "chat_template");
    if (json_is_string(ct)) {
        tpl = json_string_value(ct);
    } else if (json_is_array(ct)) {
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            const char *t = json_string_value(json_object_get(e, "template"));
            if (t && nm && strcmp(nm, "default") == 0)
                tpl = t;
        }
    }
    if (tpl) {
        snprintf(m->chat_template_from, sizeof m->chat_template_from, "chat_template of %.180s", path);
        m->chat_template = strdup(tpl);
        if (!m->chat_template) {
            json_decref(j);
            kvg_set_err(err, err_len, "%s: out of memory", path);
            return -1;
        }
    }
    json_decref(j);
    return 0;
}

kvg_model *kvgm_load_hf(const char *dir, const kvg_model_load_opts *opts, char *err, size_t err_len)
{
    char path[4096];
    const unsigned char *cfg_bytes, *tok_bytes;
    size_t cfg_len, tok_len;
    kvgm_part *parts = NULL;
    hf h = { NULL, dir, NULL, 0, err, err_len };

    /* A directory name has no extension to drop ("TinyLlama-1.1B-Chat-v1.0"). */
    kvg_model *m = kvgm_new_from_path("hf", dir, 0, err, err_len);
    if (!m)
        return NULL;
    h.m = m;
    json_t *cfg = load_json(m, dir, "config.json", &cfg_bytes, &cfg_len, err, err_len);
    if (!cfg)
        goto fail;
    join(path, sizeof path, dir, "config.json");
    int rc = parse_config(m, cfg, path, err, err_len);
    json_decref(cfg);
    if (rc < 0 || open_shards(&h) < 0 || bind_all(&h) < 0)
        goto fail;

    const char *tok_path = opts->tokenizer_path;
    char tok_default[4096];
    if (!tok_path) {
        join(tok_default, sizeof tok_default, dir, "tokenizer.json");
        if (access(tok_default, F_OK) != 0) {
            kvg_set_err(err, err_len, "%s: no tokenizer.json; set the tokenizer_path option", dir);
            goto fail;
        }
        tok_path = tok_default;
    }
    if (kvgm_load_tokenizer_file(m, tok_path, &tok_bytes, &tok_len, err, err_len) < 0
        || load_chat_template(m, dir, err, err_len) < 0)
        goto fail;
    join(path, sizeof path, dir, "config.json");
    if (kvgm_finish(m, opts, path, 0, err, err_len) < 0)
        goto fail;

    parts = calloc(h.n_shards + 2, sizeof *parts);
    if (!parts) {
        kvg_set_err(err, err_len, "%s: out of memory", dir);
        goto fail;
    }
    parts[0] = (kvgm_part){ "config.json", cfg_bytes, cfg_len };
    for (size_t i = 0; i < h.n_shards; i++)
        parts[i + 1] = (kvgm_part){ "safetensors", h.shards[i].data, h.shards[i].len };
    parts[h.n_shards + 1] = (kvgm_part){ "tokenizer", tok_bytes, tok_len };
    if (kvgm_identity(m, parts, h.n_shards + 2, opts, err, err_len) < 0)
        goto fail;
    free(parts);
    for (size_t i = 0; i < h.n_shards; i++)
        kvg_st_free(h.shards[i].st);
    free(h.shards);
    return m;
fail:
    free(parts);
    for (size_t i = 0; i < h.n_shards; i++)
        kvg_st_free(h.shards[i].st);
    free(h.shards);
    kvg_model_free(m);
    return NULL;
}
