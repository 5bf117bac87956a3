/* What every model loader shares (model_internal.h): storage ownership, dtype
 * helpers, tensor binding, every weight of a model bound through a loader's lookup,
 * the checks run after loading, and the model identity hash. The lowest unit of model
 * loading: the format loaders (model_llama2c.c, model_gguf.c, model_hf.c,
 * model_synthetic.c) call it, and model_load.c picks the loader; nothing here calls
 * either (a loader's lookup comes in as kvgm_source's find). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "gguf.h"
#include "model_internal.h"
#include "model_testing.h"
#include "quant.h"

/* Allocations at least this big get their own anonymous mapping. */
#define BIG_ALLOC (1u << 20)
#define HASH_STEP ((size_t)64 << 20)

static int add_block(kvg_model *m, void *p, size_t len, int kind)
{
    struct kvg_model_storage *s = m->storage;
    if (s->n_blocks == s->cap_blocks) {
        size_t cap = s->cap_blocks ? s->cap_blocks * 2 : 16;
        kvgm_block *b = realloc(s->blocks, cap * sizeof *b);
        if (!b)
            return -1;
        s->blocks = b;
        s->cap_blocks = cap;
    }
    s->blocks[s->n_blocks].p = p;
    s->blocks[s->n_blocks].len = len;
    s->blocks[s->n_blocks].kind = kind;
    s->n_blocks++;
    return 0;
}

kvg_model *kvgm_new(const char *format, const char *name)
{
    kvg_model *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->storage = calloc(1, sizeof *m->storage);
    if (!m->storage) {
        free(m);
        return NULL;
    }
    snprintf(m->format, sizeof m->format, "%s", format);
    snprintf(m->name, sizeof m->name, "%s", name ? name : "");
    m->bos = m->eos = -1;
    return m;
}

void kvg_model_free(kvg_model *m)
{
    if (!m)
        return;
    kvg_tokenizer_free(m->tokenizer);
    free(m->chat_template);
    free(m->layers);
    if (m->storage) {
        struct kvg_model_storage *s = m->storage;
        for (size_t i = s->n_blocks; i-- > 0;) {
            kvgm_block *b = &s->blocks[i];
            if (b->kind == KVGM_HEAP)
                free(b->p);
            else
                munmap(b->p, b->len);
        }
        free(s->blocks);
        kvg_gguf_free(s->gguf);
        free(s);
    }
    free(m);
}

int kvgm_map_file(kvg_model *m, const char *path, const unsigned char **data, size_t *len,
                  char *err, size_t err_len)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kvg_set_err(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        kvg_set_err(err, err_len, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    if (st.st_size == 0) {
        kvg_set_err(err, err_len, "%s: empty file", path);
        close(fd);
        return -1;
    }
    /* Populated up front: the identity hash reads every byte anyway, and one batched
     * fault-in is much cheaper than a page fault per 4 KiB. */
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        kvg_set_err(err, err_len, "%s: cannot map: %s", path, strerror(errno));
        return -1;
    }
    if (add_block(m, p, (size_t)st.st_size, KVGM_MAP) < 0) {
        munmap(p, (size_t)st.st_size);
        kvg_set_err(err, err_len, "%s: out of memory", path);
        return -1;
    }
    *data = p;
    *len = (size_t)st.st_size;
    return 0;
}

void *kvgm_alloc(kvg_model *m, size_t n)
{
    void *p;
    if (n == 0)
        n = 1;
    if (n >= BIG_ALLOC) {
        p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
#ifdef MADV_HUGEPAGE
        /* Fewer page faults when gigabytes of weights are generated or converted. */
        madvise(p, n, MADV_HUGEPAGE);
#endif
        if (add_block(m, p, n, KVGM_ANON) < 0) {
            munmap(p, n);
            return NULL;
        }
        return p;
    }
    if (posix_memalign(&p, 64, n) != 0)
        return NULL;
    memset(p, 0, n);
    if (add_block(m, p, n, KVGM_HEAP) < 0) {
        free(p);
        return NULL;
    }
    return p;
}

/* t's bytes (*bytes of them) when they lie wholly in a mapping of the model file, else
 * 0. */
static uintptr_t file_bytes(const kvg_model *m, const kvg_tensor *t, size_t *bytes)
{
    const struct kvg_model_storage *s;

    if (!m || !m->storage || !t || !t->data || t->rows <= 0)
        return 0;
    s = m->storage;
    *bytes = kvg_dtype_row_bytes(t->dtype, t->cols) * (size_t)t->rows;
    for (size_t i = 0; i < s->n_blocks; i++) {
        const kvgm_block *b = &s->blocks[i];
        uintptr_t p = (uintptr_t)b->p, d = (uintptr_t)t->data;
        if (b->kind == KVGM_MAP && d >= p && d - p <= b->len && *bytes <= b->len - (d - p))
            return d;
    }
    return 0;
}

int kvg_model_in_file(const kvg_model *m, const kvg_tensor *t)
{
    size_t bytes;
    return file_bytes(m, t, &bytes) != 0;
}

size_t kvg_model_release_pages(const kvg_model *m, const kvg_tensor *t)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo, hi;
    size_t bytes;
    /* Only a file mapping: an anonymous private page released reads back as zeros. */
    uintptr_t d = file_bytes(m, t, &bytes);

    if (!d)
        return 0;
    /* Whole pages inside the tensor only: its neighbours keep theirs. */
    lo = (d + page - 1) / page * page;
    hi = (d + bytes) / page * page;
    if (hi <= lo || madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0)
        return 0;
    return hi - lo;
}

/* The base name of a path without directories (and without its last extension). */
static void name_from_path(char *out, size_t cap, const char *path, int drop_extension)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/')
        start--;
    size_t end = len;
    for (size_t i = len; drop_extension && i > start + 1; i--)
        if (path[i - 1] == '.') {
            end = i - 1;
            break;
        }
    snprintf(out, cap, "%.*s", (int)(end - start), path + start);
}

kvg_model *kvgm_new_from_path(const char *format, const char *path, int drop_extension,
                              char *err, size_t err_len)
{
    char name[128];
    kvg_model *m;
    name_from_path(name, sizeof name, path, drop_extension);
    m = kvgm_new(format, name);
    if (!m)
        kvg_set_err(err, err_len, "%s: out of memory", path);
    return m;
}

kvg_model *kvgm_new_mapped(const char *format, const char *path, const unsigned char **data,
                           size_t *len, char *err, size_t err_len)
{
    kvg_model *m = kvgm_new_from_path(format, path, 1, err, err_len);
    if (m && kvgm_map_file(m, path, data, len, err, err_len) < 0) {
        kvg_model_free(m);
        return NULL;
    }
    return m;
}

/* ---- dtypes ---- */

size_t kvg_dtype_size(kvg_dtype t)
{
    switch (t) {
    case KVG_DT_F32: return 4;
    case KVG_DT_F16: return 2;
    case KVG_DT_BF16: return 2;
    default: return 0;
    }
}

int kvg_dtype_is_quant(kvg_dtype t)
{
    return t >= KVG_DT_Q8_0 && t <= KVG_DT_MXFP4;
}

/* The block format of a quantized dtype (the enums list them in the same order). */
static kvg_qtype qtype_of(kvg_dtype t)
{
    return (kvg_qtype)(t - KVG_DT_Q8_0);
}

int kvg_dtype_block(kvg_dtype t)
{
    return kvg_dtype_is_quant(t) ? kvg_quant_block_elems(qtype_of(t)) : 1;
}

size_t kvg_dtype_block_bytes(kvg_dtype t)
{
    return kvg_dtype_is_quant(t) ? kvg_quant_block_bytes(qtype_of(t)) : kvg_dtype_size(t);
}

size_t kvg_dtype_row_bytes(kvg_dtype t, int64_t cols)
{
    return (size_t)(cols / kvg_dtype_block(t)) * kvg_dtype_block_bytes(t);
}

const char *kvg_dtype_name(kvg_dtype t)
{
    switch (t) {
    case KVG_DT_F32: return "F32";
    case KVG_DT_F16: return "F16";
    case KVG_DT_BF16: return "BF16";
    case KVG_DT_Q8_0: return "Q8_0";
    case KVG_DT_Q4_0: return "Q4_0";
    case KVG_DT_Q4_K: return "Q4_K";
    case KVG_DT_Q6_K: return "Q6_K";
    case KVG_DT_MXFP4: return "MXFP4";
    case KVG_DT_Q8_0_R16: return "Q8_0 (int8 layout)";
    case KVG_DT_Q4_0_R16: return "Q4_0 (int8 layout)";
    case KVG_DT_Q4_K_R16: return "Q4_K (int8 layout)";
    case KVG_DT_Q6_K_R16: return "Q6_K (int8 layout)";
    case KVG_DT_MXFP4_R16: return "MXFP4 (int8 layout)";
    }
    return "?";
}

/* Exact: a BF16 is the top half of an F32. */
static float bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kvgm_f32_to_bf16(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(b >> 16 | 0x40);          /* NaN stays a (quiet) NaN */
    b += 0x7fffu + (b >> 16 & 1);
    return (uint16_t)(b >> 16);
}

void kvg_tensor_row_f32(const kvg_tensor *t, int64_t r, float *out)
{
    size_t cols = (size_t)t->cols;
    const unsigned char *base = (const unsigned char *)t->data + (size_t)r * kvg_dtype_row_bytes(t->dtype, t->cols);
    if (kvg_dtype_is_quant(t->dtype)) {
        kvg_dequant_row(qtype_of(t->dtype), base, out, t->cols);
        return;
    }
    switch (t->dtype) {
    case KVG_DT_F32:
        memcpy(out, base, cols * 4);
        break;
    case KVG_DT_F16:
        for (size_t i = 0; i < cols; i++) {
            uint16_t h;
            memcpy(&h, base + 2 * i, 2);
            out[i] = kvg_quant_f16_to_f32(h);
        }
        break;
    case KVG_DT_BF16:
        for (size_t i = 0; i < cols; i++) {
            uint16_t h;
            memcpy(&h, base + 2 * i, 2);
            out[i] = bf16_to_f32(h);
        }
        break;
    default:
        break;
    }
}

/* An owned F32 copy of the n-element vector stored as `dt` at `p`, even when it already
 * is F32: the vectors are small, and a step that read them in the file's mapping would
 * fault their neighbours back in too (the kernel maps a file's pages around a fault, a
 * whole large folio at a time), the matrices a backend has copied and released among
 * them. NULL when out of memory. */
static const float *vec_f32(kvg_model *m, const void *p, kvg_dtype dt, size_t n)
{
    float *out = kvgm_alloc(m, n * sizeof(float));
    if (!out)
        return NULL;
    kvg_tensor t = { p, dt, 1, (int64_t)n };
    kvg_tensor_row_f32(&t, 0, out);
    return out;
}

int kvgm_bind(kvg_model *m, kvg_tensor *t, const void *p, kvg_dtype dt, int64_t rows, int64_t cols,
              char *err, size_t err_len)
{
    /* Block formats are read bytewise (their f16 scales sit at odd offsets anyway). */
    size_t es = kvg_dtype_is_quant(dt) ? 1 : kvg_dtype_size(dt);
    t->dtype = dt;
    t->rows = rows;
    t->cols = cols;
    if (((uintptr_t)p & (es - 1)) == 0) {
        t->data = p;
        return 0;
    }
    /* Kernels load whole elements; a misaligned tensor (possible in safetensors) is
     * the one case where an unchanged layout still needs a copy. */
    size_t n = (size_t)rows * kvg_dtype_row_bytes(dt, cols);
    void *c = kvgm_alloc(m, n);
    if (!c) {
        kvg_set_err(err, err_len, "out of memory copying a %zu-byte tensor", n);
        return -1;
    }
    memcpy(c, p, n);
    t->data = c;
    return 0;
}

/* ---- a model's weights through a loader's find ---- */

/* Calls s->find for weight w of `layer` (mats stacked matrices) under its name in the file. */
static int find_weight(const kvgm_source *s, kvgm_weight w, int layer, int64_t mats, int64_t rows, int64_t cols,
                       int optional, const void **data, kvg_dtype *dt)
{
    char name[128];
    *data = NULL;
    if (s->names && layer >= 0)
        snprintf(name, sizeof name, "%s%d.%s", s->layer_prefix, layer, s->names[w]);
    else if (s->names)
        snprintf(name, sizeof name, "%s", s->names[w]);
    return s->find(s, s->names ? name : NULL, w, layer, mats, rows, cols, optional, data, dt);
}

int kvgm_mat(const kvgm_source *s, kvg_tensor *out, kvgm_weight w, int layer, int64_t rows,
             int64_t cols, int optional)
{
    const void *p;
    kvg_dtype dt;
    if (find_weight(s, w, layer, 1, rows, cols, optional, &p, &dt) < 0)
        return -1;
    if (!p)
        return 0;
    return kvgm_bind(s->m, out, p, dt, rows, cols, s->err, s->err_len);
}

/* Rows [r0, r0 + n) of t, as a matrix of its own (rows are contiguous in every dtype). */
static kvg_tensor row_slice(const kvg_tensor *t, int64_t r0, int64_t n)
{
    kvg_tensor v = *t;
    v.data = (const unsigned char *)t->data + (size_t)r0 * kvg_dtype_row_bytes(t->dtype, t->cols);
    v.rows = n;
    return v;
}

int kvgm_stack(const kvgm_source *s, kvg_tensor **out, kvgm_weight w, int layer, int64_t n, int64_t rows,
               int64_t cols)
{
    const void *p;
    kvg_dtype dt;
    kvg_tensor all;
    kvg_tensor *v;
    *out = NULL;
    if (find_weight(s, w, layer, n, rows, cols, 0, &p, &dt) < 0)
        return -1;
    /* The stack is one [n rows][cols] matrix in memory: matrix i is its rows
       [i rows, (i + 1) rows). */
    v = kvgm_alloc(s->m, (size_t)n * sizeof *v);
    if (!v || kvgm_bind(s->m, &all, p, dt, n * rows, cols, s->err, s->err_len) < 0) {
        if (!v)
            kvg_set_err(s->err, s->err_len, "%s: out of memory", s->where);
        return -1;
    }
    for (int64_t i = 0; i < n; i++)
        v[i] = row_slice(&all, i * rows, rows);
    *out = v;
    return 0;
}

int kvgm_vec(const kvgm_source *s, const float **out, kvgm_weight w, int layer, int64_t n,
             int optional)
{
    const void *p;
    kvg_dtype dt;
    *out = NULL;
    if (find_weight(s, w, layer, 1, 0, n, optional, &p, &dt) < 0)
        return -1;
    if (!p)
        return 0;
    *out = vec_f32(s->m, p, dt, (size_t)n);
    if (!*out) {
        kvg_set_err(s->err, s->err_len, "%s: out of memory", s->where);
        return -1;
    }
    return 0;
}

/* n vectors of len ([n][len] in the file, e.g. a bias per expert) as one owned F32
 * array, as kvgm_vec. Not optional. */
static int kvgm_vecs(const kvgm_source *s, const float **out, kvgm_weight w, int layer, int64_t n, int64_t len)
{
    const void *p;
    kvg_dtype dt;
    *out = NULL;
    if (find_weight(s, w, layer, 1, n, len, 0, &p, &dt) < 0)
        return -1;
    *out = vec_f32(s->m, p, dt, (size_t)(n * len));
    if (!*out) {
        kvg_set_err(s->err, s->err_len, "%s: out of memory", s->where);
        return -1;
    }
    return 0;
}

/* q, k and v: three matrices, or one [Q + 2 KV][D] matrix split into three views. */
static int bind_qkv(const kvgm_source *s, kvg_layer_weights *w, int l, int64_t D, int64_t Q, int64_t KV)
{
    kvg_tensor qkv = { 0 };
    if (s->names && s->names[KVGM_WQKV] && kvgm_mat(s, &qkv, KVGM_WQKV, l, Q + 2 * KV, D, 1) < 0)
        return -1;
    if (qkv.data) {
        w->wq = row_slice(&qkv, 0, Q);
        w->wk = row_slice(&qkv, Q, KV);
        w->wv = row_slice(&qkv, Q + KV, KV);
        return 0;
    }
    if (kvgm_mat(s, &w->wq, KVGM_WQ, l, Q, D, 0) < 0 || kvgm_mat(s, &w->wk, KVGM_WK, l, KV, D, 0) < 0
        || kvgm_mat(s, &w->wv, KVGM_WV, l, KV, D, 0) < 0)
        return -1;
    return 0;
}

int kvgm_bind_layers(const kvgm_source *s)
{
    kvg_model *m = s->m;
    const kvg_model_config *c = &m->cfg;
    int64_t D = c->dim, H = c->hidden_dim, Q = (int64_t)c->n_heads * c->head_dim,
            KV = (int64_t)c->n_kv_heads * c->head_dim, HD = c->head_dim;

    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        kvg_set_err(s->err, s->err_len, "%s: out of memory", s->where);
        return -1;
    }
    for (int l = 0; l < c->n_layers; l++) {
        kvg_layer_weights *w = &m->layers[l];
        if (kvgm_vec(s, &w->attn_norm, KVGM_ATTN_NORM, l, D, 0) < 0
            || bind_qkv(s, w, l, D, Q, KV) < 0
            || kvgm_mat(s, &w->wo, KVGM_WO, l, D, Q, 0) < 0
            || kvgm_vec(s, &w->ffn_norm, KVGM_FFN_NORM, l, D, 0) < 0)
            return -1;
        if (c->n_experts > 0) {
            int64_t E = c->n_experts, EH = c->expert_hidden_dim;
            if (kvgm_mat(s, &w->moe_router, KVGM_MOE_ROUTER, l, E, D, 0) < 0
                || kvgm_stack(s, &w->moe_gate, KVGM_MOE_GATE, l, E, EH, D) < 0
                || kvgm_stack(s, &w->moe_up, KVGM_MOE_UP, l, E, EH, D) < 0
                || kvgm_stack(s, &w->moe_down, KVGM_MOE_DOWN, l, E, D, EH) < 0)
                return -1;
            if (c->moe_biases
                && (kvgm_vec(s, &w->moe_router_bias, KVGM_MOE_ROUTER_BIAS, l, E, 0) < 0
                    || kvgm_vecs(s, &w->moe_gate_bias, KVGM_MOE_GATE_BIAS, l, E, EH) < 0
                    || kvgm_vecs(s, &w->moe_up_bias, KVGM_MOE_UP_BIAS, l, E, EH) < 0
                    || kvgm_vecs(s, &w->moe_down_bias, KVGM_MOE_DOWN_BIAS, l, E, D) < 0))
                return -1;
        } else if (s->fused_gate_up) {
            kvg_tensor gu = { 0 };
            if (kvgm_mat(s, &gu, KVGM_W_GATE_UP, l, 2 * H, D, 0) < 0
                || kvgm_mat(s, &w->w_down, KVGM_W_DOWN, l, D, H, 0) < 0)
                return -1;
            w->w_gate = row_slice(&gu, 0, H);
            w->w_up = row_slice(&gu, H, H);
        } else if (kvgm_mat(s, &w->w_gate, KVGM_W_GATE, l, H, D, 0) < 0
                   || kvgm_mat(s, &w->w_down, KVGM_W_DOWN, l, D, H, 0) < 0
                   || kvgm_mat(s, &w->w_up, KVGM_W_UP, l, H, D, 0) < 0) {
            return -1;
        }
        if (c->has_qkv_bias
            && (kvgm_vec(s, &w->bq, KVGM_BQ, l, Q, 0) < 0 || kvgm_vec(s, &w->bk, KVGM_BK, l, KV, 0) < 0
                || kvgm_vec(s, &w->bv, KVGM_BV, l, KV, 0) < 0))
            return -1;
        if ((c->has_o_bias && kvgm_vec(s, &w->bo, KVGM_BO, l, D, 0) < 0)
            || (c->attn_sinks && kvgm_vec(s, &w->attn_sinks, KVGM_ATTN_SINKS, l, c->n_heads, 0) < 0))
            return -1;
        if (c->qk_norm
            && (kvgm_vec(s, &w->q_norm, KVGM_Q_NORM, l, HD, 0) < 0
                || kvgm_vec(s, &w->k_norm, KVGM_K_NORM, l, HD, 0) < 0))
            return -1;
        if (c->post_norms
            && (kvgm_vec(s, &w->post_attn_norm, KVGM_POST_ATTN_NORM, l, D, 0) < 0
                || kvgm_vec(s, &w->post_ffn_norm, KVGM_POST_FFN_NORM, l, D, 0) < 0))
            return -1;
    }
    return 0;
}

/* ---- identity ---- */

static void report(const kvg_model_load_opts *o, uint64_t done, uint64_t total)
{
    if (o && o->progress)
        o->progress(o->progress_ctx, "hashing", done, total);
}

int kvgm_identity(kvg_model *m, const kvgm_part *parts, size_t n_parts,
                  const kvg_model_load_opts *opts, char *err, size_t err_len)
{
    static const char hexd[] = "0123456789abcdef";
    uint64_t total = 0, done = 0, next = HASH_STEP;
    unsigned int out_len = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1;

    for (size_t i = 0; i < n_parts; i++)
        total += parts[i].len;
    ok = ok && EVP_DigestUpdate(c, "kvgate-model-id/1", 18) == 1
         && EVP_DigestUpdate(c, m->format, strlen(m->format) + 1) == 1;
    for (size_t i = 0; ok && i < n_parts; i++) {
        unsigned char lenb[8];
        uint64_t l = parts[i].len;
        for (int k = 0; k < 8; k++)
            lenb[k] = (unsigned char)(l >> (8 * k));
        ok = EVP_DigestUpdate(c, parts[i].label, strlen(parts[i].label) + 1) == 1
             && EVP_DigestUpdate(c, lenb, 8) == 1;
        const unsigned char *p = parts[i].data;
        size_t off = 0;
        while (ok && off < parts[i].len) {
            size_t n = parts[i].len - off;
            if (n > HASH_STEP)
                n = HASH_STEP;
            ok = EVP_DigestUpdate(c, p + off, n) == 1;
            off += n;
            done += n;
            if (done >= next && done < total) {
                report(opts, done, total);
                next = done + HASH_STEP;
            }
        }
    }
    ok = ok && EVP_DigestFinal_ex(c, m->id, &out_len) == 1 && out_len == 32;
    EVP_MD_CTX_free(c);
    if (!ok) {
        kvg_set_err(err, err_len, "%s: SHA-256 of the model failed (OpenSSL)", m->name);
        return -1;
    }
    report(opts, total, total);
    for (int i = 0; i < 32; i++) {
        m->id_hex[2 * i] = hexd[m->id[i] >> 4];
        m->id_hex[2 * i + 1] = hexd[m->id[i] & 15];
    }
    m->id_hex[64] = '\0';
    return 0;
}

/* ---- shared checks ---- */

static int check_t(const kvg_tensor *t, const char *what, int64_t rows, int64_t cols, const char *file,
                   char *err, size_t err_len)
{
    if (!t->data) {
        kvg_set_err(err, err_len, "%s: missing tensor %s", file, what);
        return -1;
    }
    if (t->rows != rows || t->cols != cols) {
        kvg_set_err(err, err_len, "%s: tensor %s has shape [%lld][%lld], the config needs [%lld][%lld]", file,
                 what, (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
        return -1;
    }
    return 0;
}

static int check_v(const float *v, const char *what, const char *file, char *err, size_t err_len)
{
    if (!v) {
        kvg_set_err(err, err_len, "%s: missing tensor %s", file, what);
        return -1;
    }
    return 0;
}

int kvgm_finish(kvg_model *m, const kvg_model_load_opts *opts, const char *file,
                int allow_longer_ctx, char *err, size_t err_len)
{
    kvg_model_config *c = &m->cfg;
    char w[64];

    if (c->dim <= 0 || c->hidden_dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0
        || c->head_dim <= 0 || c->vocab_size <= 0 || c->max_seq_len <= 0) {
        kvg_set_err(err, err_len, "%s: bad hyperparameters (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                 "n_kv_heads %d, head_dim %d, vocab_size %d, max_seq_len %d)", file, c->dim, c->hidden_dim,
                 c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, c->max_seq_len);
        return -1;
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        kvg_set_err(err, err_len, "%s: n_heads %d is not a multiple of n_kv_heads %d", file, c->n_heads,
                 c->n_kv_heads);
        return -1;
    }
    if (c->n_experts < 0 || (c->n_experts > 0 && (c->n_experts_used <= 0 || c->n_experts_used > c->n_experts
                                                 || c->expert_hidden_dim <= 0))) {
        kvg_set_err(err, err_len, "%s: bad mixture-of-experts hyperparameters (%d experts, %d used, expert "
                    "hidden size %d)", file, c->n_experts, c->n_experts_used, c->expert_hidden_dim);
        return -1;
    }
    if (c->head_dim % 2 != 0) {
        kvg_set_err(err, err_len, "%s: head_dim %d is odd (RoPE rotates pairs)", file, c->head_dim);
        return -1;
    }
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps) || !(c->rope_theta > 0) || !isfinite(c->rope_theta)) {
        kvg_set_err(err, err_len, "%s: bad norm_eps %g or rope_theta %g", file, c->norm_eps, c->rope_theta);
        return -1;
    }
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    if (check_t(&m->tok_embedding, "token embedding", c->vocab_size, c->dim, file, err, err_len) < 0
        || check_t(&m->output, "output", c->vocab_size, c->dim, file, err, err_len) < 0
        || check_v(m->final_norm, "final norm", file, err, err_len) < 0)
        return -1;
    if (!m->layers) {
        kvg_set_err(err, err_len, "%s: no layers", file);
        return -1;
    }
    for (int l = 0; l < c->n_layers; l++) {
        kvg_layer_weights *L = &m->layers[l];
#define T(f, r, cc) (snprintf(w, sizeof w, "layers.%d." #f, l), check_t(&L->f, w, r, cc, file, err, err_len) < 0)
#define V(f) (snprintf(w, sizeof w, "layers.%d." #f, l), check_v(L->f, w, file, err, err_len) < 0)
        if (T(wq, q, c->dim) || T(wk, kv, c->dim) || T(wv, kv, c->dim) || T(wo, c->dim, q)
            || V(attn_norm) || V(ffn_norm))
            return -1;
        if (c->n_experts > 0) {
            if (T(moe_router, c->n_experts, c->dim))
                return -1;
            if (!L->moe_gate || !L->moe_up || !L->moe_down) {
                kvg_set_err(err, err_len, "%s: missing the experts of layer %d", file, l);
                return -1;
            }
        } else if (T(w_gate, c->hidden_dim, c->dim) || T(w_down, c->dim, c->hidden_dim)
                   || T(w_up, c->hidden_dim, c->dim)) {
            return -1;
        }
        if (c->has_qkv_bias && (V(bq) || V(bk) || V(bv)))
            return -1;
        if ((c->has_o_bias && V(bo)) || (c->attn_sinks && V(attn_sinks)))
            return -1;
        if (c->n_experts > 0 && c->moe_biases
            && (V(moe_router_bias) || V(moe_gate_bias) || V(moe_up_bias) || V(moe_down_bias)))
            return -1;
#undef T
#undef V
    }
    if (m->tokenizer) {
        int32_t nv = kvg_tokenizer_vocab_size(m->tokenizer);
        if (nv > c->vocab_size) {
            kvg_set_err(err, err_len, "%s: the tokenizer has %d tokens but the model's vocabulary is %d", file, nv,
                     c->vocab_size);
            return -1;
        }
        m->bos = kvg_tokenizer_bos(m->tokenizer);
        m->eos = kvg_tokenizer_eos(m->tokenizer);
    }
    if (opts && opts->max_seq_len < 0) {
        kvg_set_err(err, err_len, "%s: max_seq_len %d is negative", file, opts->max_seq_len);
        return -1;
    }
    if (opts && opts->max_seq_len > 0) {
        if (opts->max_seq_len > c->max_seq_len && !allow_longer_ctx) {
            kvg_set_err(err, err_len, "%s: max_seq_len %d exceeds the model's context length %d", file,
                     opts->max_seq_len, c->max_seq_len);
            return -1;
        }
        c->max_seq_len = opts->max_seq_len;
    }
    return 0;
}

int kvgm_set_tokenizer_source(kvg_model *m, const char *file, const void *blob, size_t len,
                              char *err, size_t err_len)
{
    if (file) {
        char *f = kvgm_alloc(m, strlen(file) + 1);
        if (!f)
            return kvg_fail(err, err_len, file, "out of memory");
        strcpy(f, file);
        m->tokenizer_file = f;
    } else {
        unsigned char *b = kvgm_alloc(m, len);
        if (!b)
            return kvg_fail(err, err_len, m->name, "out of memory");
        memcpy(b, blob, len);
        m->tokenizer_blob = b;
    }
    m->tokenizer_bytes = len;
    return 0;
}

int kvgm_load_tokenizer_file(kvg_model *m, const char *path, const unsigned char **bytes,
                             size_t *len, char *err, size_t err_len)
{
    *bytes = NULL;
    *len = 0;
    if (!path)
        return 0;
    if (kvgm_map_file(m, path, bytes, len, err, err_len) < 0)
        return -1;
    m->tokenizer = kvg_tokenizer_load_mem(*bytes, *len, path, err, err_len);
    if (!m->tokenizer)
        return -1;
    return kvgm_set_tokenizer_source(m, path, NULL, *len, err, err_len);
}

/* ---- a model's family, in words ---- */

static void feature(char *buf, size_t len, size_t *o, int *n, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void feature(char *buf, size_t len, size_t *o, int *n, const char *fmt, ...)
{
    va_list ap;
    if (*o >= len)
        return;
    *o += (size_t)snprintf(buf + *o, len - *o, "%s", (*n)++ ? ", " : ": ");
    if (*o >= len)
        return;
    va_start(ap, fmt);
    *o += (size_t)vsnprintf(buf + *o, len - *o, fmt, ap);
    va_end(ap);
}

const char *kvg_model_features(const kvg_model *m, char *buf, size_t len)
{
    const kvg_model_config *c = &m->cfg;
    size_t o = 0;
    int n = 0, sliding = 0;
    if (len == 0)
        return buf;
    o = (size_t)snprintf(buf, len, "%s", c->arch);
    for (int l = 0; l < c->n_layers; l++)
        sliding += m->layers[l].sliding;
    if (c->has_qkv_bias)
        feature(buf, len, &o, &n, "q/k/v biases");
    if (c->qk_norm)
        feature(buf, len, &o, &n, "q/k norms");
    if (c->post_norms)
        feature(buf, len, &o, &n, "post-norms");
    if (c->has_o_bias)
        feature(buf, len, &o, &n, "o bias");
    if (c->attn_sinks)
        feature(buf, len, &o, &n, "attention sinks");
    if (c->ffn_act == KVG_ACT_GELU_TANH)
        feature(buf, len, &o, &n, "GeGLU");
    if (c->ffn_act == KVG_ACT_SWIGLU_OAI)
        feature(buf, len, &o, &n, "clamped SwiGLU");
    if (c->n_experts > 0)
        feature(buf, len, &o, &n, "%d of %d experts (%s%s)", c->n_experts_used, c->n_experts,
                c->moe_gating == KVG_MOE_TOPK_SOFTMAX ? "top-k, then softmax" : "softmax, then top-k",
                c->moe_biases ? ", biases" : "");
    if (c->embed_scale > 0.0f)
        feature(buf, len, &o, &n, "embeddings x %.4g", c->embed_scale);
    if (c->attn_query_scalar > 0.0f)
        feature(buf, len, &o, &n, "scores / sqrt(%g)", c->attn_query_scalar);
    if (c->attn_softcap > 0.0f)
        feature(buf, len, &o, &n, "attention soft-cap %g", c->attn_softcap);
    if (c->final_softcap > 0.0f)
        feature(buf, len, &o, &n, "logit soft-cap %g", c->final_softcap);
    if (c->rope_freq_scale > 0.0f && c->rope_freq_scale != 1.0f)
        feature(buf, len, &o, &n, "linear RoPE scaling x%g", 1.0f / c->rope_freq_scale);
    if (c->rope_freq_factors)
        feature(buf, len, &o, &n, "per-pair RoPE factors%s", c->rope_attn_factor > 0.0f ? " with an attention factor" : "");
    if (c->rope_yarn_factor > 0.0f)
        feature(buf, len, &o, &n, "YaRN x%g from %d", c->rope_yarn_factor, c->rope_yarn_orig_ctx);
    if (c->attn_temp_scale != 0.0f)
        feature(buf, len, &o, &n, "query temperature %g per %d positions", c->attn_temp_scale, c->attn_temp_floor);
    if (sliding && c->swa_window > 0) {
        /* Blocks hold every layer's K/V of their tokens, so the window layers' share of
         * the positions before their window stays allocated: what a per-layer-group
         * pool would give back at the full context. */
        double keep = c->max_seq_len > c->swa_window ? (double)c->swa_window / c->max_seq_len : 1.0;
        double back = 100.0 * sliding / c->n_layers * (1.0 - keep);
        feature(buf, len, &o, &n, "sliding window %d on %d of %d layers", c->swa_window, sliding, c->n_layers);
        if (c->rope_theta_swa > 0.0f && o < len)
            o += (size_t)snprintf(buf + o, len - o, " (RoPE base %g there)", c->rope_theta_swa);
        if (o < len)
            o += (size_t)snprintf(buf + o, len - o, "; at the full context of %d the window layers could give back "
                                  "%.0f%% of the KV", c->max_seq_len, back);
    }
    if (n == 0 && o < len)
        snprintf(buf + o, len - o, ": the plain Llama forward pass");
    return buf;
}
