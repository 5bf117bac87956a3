/* Test helpers: write a loaded kvg_model back out in the other formats, so one set
 * of weights (e.g. stories260K) can be loaded through every loader and the results
 * compared (weights here; greedy ids in the forward-pass tests).
 *
 *   mw_opts o = { .dtype = KVG_DT_F16, .tok_path = "tok512.bin" };
 *   mw_write_gguf(m, "/tmp/x.gguf", &o, err, sizeof err);
 *   mw_write_hf(m, "/tmp/hfdir", &o, err, sizeof err);          (a directory)
 *   mw_write_llama2c_v1(m, "/tmp/x.bin", err, sizeof err);      ("ak42" version 1)
 *   double d = mw_max_diff(a, b);       (0 when every weight is identical)
 *
 * The writers produce what the real converters produce: GGUF (llama.cpp naming,
 * ne[0] = columns, Q/K in the adjacent RoPE layout, norms in F32, tokenizer in the
 * file); HF safetensors with Q/K rows permuted to the rotate-half layout the way
 * transformers' convert_llama_weights_to_hf.py permutes Meta/llama2.c weights, a
 * config.json and (with tok_path) a SentencePiece-BPE tokenizer.json. The source
 * model may be in either RoPE layout. Header-only; needs jansson and model.h. */
#ifndef KVG_MODEL_WRITERS_H
#define KVG_MODEL_WRITERS_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "gguf_builder.h"
#include "quant.h"
#include "quant_testing.h"
#include "model.h"

typedef struct mw_opts {
    kvg_dtype dtype;             /* of the matrices (norms: F32 in GGUF, this dtype in HF) */
    const char *tok_path;        /* llama2.c tokenizer.bin: embedded in GGUF, tokenizer.json for HF */
    const char *chat_template;   /* GGUF tokenizer.chat_template / HF tokenizer_config.json */
    int n_shards;                /* HF: > 1 writes model-0000i-of-0000n.safetensors + index */
    int misalign;                /* HF: pad the safetensors header so tensor data is misaligned;
                                  * GGUF: the data section starts 32 bytes off a 64-byte boundary
                                  * (as GGUF's 32-byte alignment allows), and so does every
                                  * tensor at an offset that is a multiple of 64 */
    int align64;                 /* GGUF: the data section starts on a 64-byte boundary */
    int rope_half_override;      /* HF: 1 writes Q/K unpermuted (for negative tests) */
    /* GGUF, quantized dtypes (quantized with kvg_quant_row): matrices whose name
     * contains mix_match get mix_dtype instead (a Q4_K_M file's Q6_K tensors); a
     * quantized dtype whose block does not divide a matrix's columns falls back to
     * Q8_0 (as llama.cpp's quantizer falls back). bad_match: that tensor's header
     * names GGML type bad_type (its data unchanged), for negative tests. */
    kvg_dtype mix_dtype;
    const char *mix_match;
    const char *bad_match;
    uint32_t bad_type;
    /* GGUF: a "phi3" file, q/k/v as one attn_qkv.weight and gate and up as one ffn_up.weight
     * (gate rows first), as llama.cpp converts Phi-3. The model's wq/wk/wv and w_gate/w_up
     * must be consecutive row slices of one tensor each (engine_testmodel.h's
     * tm_family.fused) in the rotate-half layout; mw_write_gguf refuses others. */
    int fused;
} mw_opts;

/* ---- numbers ---- */

__attribute__((unused)) static uint16_t mw_f32_to_f16(float f)
{
    /* Independent of the engine's converter on purpose: via double and frexp. */
    if (isnan(f))
        return 0x7e00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a == 0)
        return sign;
    int e;
    frexp(a, &e);                /* a = m * 2^e, m in [0.5, 1) */
    int ue = e - 1;              /* a = 1.x * 2^ue */
    if (ue < -14)
        ue = -14;                /* subnormal spacing 2^-24 */
    double q = ldexp(a, 10 - ue);
    double r = nearbyint(q);     /* ties to even */
    if (r >= 2048) {
        r /= 2;
        ue++;
    }
    if (ue > 15)
        return sign | 0x7c00;
    if (r < 1024)
        return sign | (uint16_t)r;                       /* subnormal */
    return sign | (uint16_t)((ue + 15) << 10 | ((uint32_t)r - 1024));
}

__attribute__((unused)) static float mw_f16_to_f32(uint16_t h)
{
    int e = h >> 10 & 31, man = h & 1023;
    double v = e == 0 ? ldexp(man, -24) : e == 31 ? (man ? NAN : INFINITY) : ldexp(man + 1024, e - 25);
    return (float)(h & 0x8000 ? -v : v);
}

__attribute__((unused)) static uint16_t mw_f32_to_bf16(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    b += 0x7fff + (b >> 16 & 1);
    return (uint16_t)(b >> 16);
}

__attribute__((unused)) static float mw_bf16_to_f32(uint16_t h)
{
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* ---- layout ---- */

/* Row r of t in the adjacent RoPE layout (llama2.c, GGUF) when t is Q or K of a
 * model stored in rotate-half layout; otherwise row r itself. */
__attribute__((unused)) static void mw_row_adjacent(const kvg_model *m, const kvg_tensor *t, int is_qk,
                                                    int64_t r, float *out)
{
    int64_t src = r;
    if (is_qk && m->cfg.rope_layout == KVG_ROPE_HALF) {
        int64_t hd = m->cfg.head_dim, h = r / hd, j = r % hd;
        src = h * hd + (j % 2) * (hd / 2) + j / 2;
    }
    kvg_tensor_row_f32(t, src, out);
}

/* Row r in the rotate-half layout (HF): HF row p*hd/2 + i is adjacent row 2i + p. */
__attribute__((unused)) static void mw_row_half(const kvg_model *m, const kvg_tensor *t, int is_qk, int64_t r,
                                                float *out)
{
    if (!is_qk || m->cfg.rope_layout == KVG_ROPE_HALF) {
        kvg_tensor_row_f32(t, r, out);
        return;
    }
    int64_t hd = m->cfg.head_dim, h = r / hd, j = r % hd, half = hd / 2;
    int64_t p = j / half, i = j % half;
    kvg_tensor_row_f32(t, h * hd + 2 * i + p, out);
}

/* The tensors of a model, in a fixed order, with names in both conventions. */
typedef struct mw_tensor {
    char gguf[64], hf[96];
    const kvg_tensor *t;         /* a matrix, or NULL for a vector */
    kvg_tensor span;             /* a fused matrix: t points here */
    const float *v;              /* a vector (norms, biases) */
    int64_t n;                   /* vector length */
    int is_qk;
} mw_tensor;

/* The matrix spanning consecutive row slices a, then b (, then c), or -1 when they are not
 * consecutive slices of one buffer in one dtype. */
static inline __attribute__((unused)) int mw_span(const kvg_tensor *a, const kvg_tensor *b, const kvg_tensor *c,
                                                  kvg_tensor *out)
{
    size_t rb = kvg_dtype_row_bytes(a->dtype, a->cols);
    const unsigned char *pa = a->data, *pb = b->data;
    if (b->dtype != a->dtype || b->cols != a->cols || pb != pa + (size_t)a->rows * rb)
        return -1;
    if (c && (c->dtype != a->dtype || c->cols != a->cols ||
              (const unsigned char *)c->data != pb + (size_t)b->rows * rb))
        return -1;
    *out = *a;
    out->rows = a->rows + b->rows + (c ? c->rows : 0);
    return 0;
}

/* mw_list, with fused q/k/v and gate/up (mw_opts.fused); -1 when the model's are not. */
static inline __attribute__((unused)) int mw_list_x(const kvg_model *m, int fused, mw_tensor **out);

__attribute__((unused)) static int mw_list(const kvg_model *m, mw_tensor **out)
{
    return mw_list_x(m, 0, out);
}

static inline __attribute__((unused)) int mw_list_x(const kvg_model *m, int fused, mw_tensor **out)
{
    const kvg_model_config *c = &m->cfg;
    int cap = 3 + c->n_layers * 12, n = 0;
    mw_tensor *l = calloc((size_t)cap, sizeof *l);
#define MAT(G, H, T, QK) (snprintf(l[n].gguf, 64, "%s", G), snprintf(l[n].hf, 96, "%s", H), l[n].t = (T), \
                          l[n].is_qk = (QK), n++)
#define VEC(G, H, V, N) (snprintf(l[n].gguf, 64, "%s", G), snprintf(l[n].hf, 96, "%s", H), l[n].v = (V), \
                         l[n].n = (N), n++)
    MAT("token_embd.weight", "model.embed_tokens.weight", &m->tok_embedding, 0);
    for (int i = 0; i < c->n_layers; i++) {
        const kvg_layer_weights *w = &m->layers[i];
        char g[64], h[96];
        int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
#define NM(GS, HS) (snprintf(g, sizeof g, "blk.%d.%s", i, GS), snprintf(h, sizeof h, "model.layers.%d.%s", i, HS))
        NM("attn_norm.weight", "input_layernorm.weight"), VEC(g, h, w->attn_norm, c->dim);
        if (fused) {
            if (mw_span(&w->wq, &w->wk, &w->wv, &l[n].span) != 0)
                goto not_fused;
            NM("attn_qkv.weight", "self_attn.qkv_proj.weight"), MAT(g, h, &l[n].span, 0);
        } else {
            NM("attn_q.weight", "self_attn.q_proj.weight"), MAT(g, h, &w->wq, 1);
            NM("attn_k.weight", "self_attn.k_proj.weight"), MAT(g, h, &w->wk, 1);
            NM("attn_v.weight", "self_attn.v_proj.weight"), MAT(g, h, &w->wv, 0);
        }
        if (c->has_qkv_bias) {
            /* Biases of Q and K are permuted like their rows; handled in the writers. */
            NM("attn_q.bias", "self_attn.q_proj.bias"), VEC(g, h, w->bq, q);
            l[n - 1].is_qk = 1;
            NM("attn_k.bias", "self_attn.k_proj.bias"), VEC(g, h, w->bk, kv);
            l[n - 1].is_qk = 1;
            NM("attn_v.bias", "self_attn.v_proj.bias"), VEC(g, h, w->bv, kv);
        }
        NM("attn_output.weight", "self_attn.o_proj.weight"), MAT(g, h, &w->wo, 0);
        NM("ffn_norm.weight", "post_attention_layernorm.weight"), VEC(g, h, w->ffn_norm, c->dim);
        if (fused) {
            if (mw_span(&w->w_gate, &w->w_up, NULL, &l[n].span) != 0)
                goto not_fused;
            NM("ffn_up.weight", "mlp.gate_up_proj.weight"), MAT(g, h, &l[n].span, 0);
            NM("ffn_down.weight", "mlp.down_proj.weight"), MAT(g, h, &w->w_down, 0);
        } else {
            NM("ffn_gate.weight", "mlp.gate_proj.weight"), MAT(g, h, &w->w_gate, 0);
            NM("ffn_down.weight", "mlp.down_proj.weight"), MAT(g, h, &w->w_down, 0);
            NM("ffn_up.weight", "mlp.up_proj.weight"), MAT(g, h, &w->w_up, 0);
        }
#undef NM
    }
    VEC("output_norm.weight", "model.norm.weight", m->final_norm, c->dim);
    if (!c->tied_embeddings)
        MAT("output.weight", "lm_head.weight", &m->output, 0);
#undef MAT
#undef VEC
    *out = l;
    return n;
not_fused:
    free(l);
    *out = NULL;
    return -1;
}

/* Element k of a Q/K bias vector in the target layout. */
static inline __attribute__((unused)) float mw_bias_at(const kvg_model *m, const mw_tensor *e, int64_t k,
                                                       int to_half)
{
    if (!e->is_qk || (m->cfg.rope_layout == KVG_ROPE_HALF) == to_half)
        return e->v[k];
    int64_t hd = m->cfg.head_dim, h = k / hd, j = k % hd, half = hd / 2;
    if (to_half)
        return e->v[h * hd + 2 * (j % half) + j / half];
    return e->v[h * hd + (j % 2) * half + j / 2];
}

/* Bytes of tensor e in dtype dt and the target layout (to_half: HF), malloc'd. */
__attribute__((unused)) static unsigned char *mw_encode(const kvg_model *m, const mw_tensor *e, kvg_dtype dt,
                                                        int to_half, size_t *n_bytes)
{
    int64_t rows = e->t ? e->t->rows : 1, cols = e->t ? e->t->cols : e->n;
    if (kvg_dtype_is_quant(dt)) {
        size_t rb = kvg_dtype_row_bytes(dt, cols);
        unsigned char *q = malloc((size_t)rows * rb);
        float *rw = malloc((size_t)cols * sizeof(float));
        for (int64_t r = 0; r < rows; r++) {
            mw_row_adjacent(m, e->t, e->is_qk, r, rw);
            kvg_quant_row((kvg_qtype)(dt - KVG_DT_Q8_0), rw, q + (size_t)r * rb, cols);
        }
        free(rw);
        *n_bytes = (size_t)rows * rb;
        return q;
    }
    size_t es = dt == KVG_DT_F32 ? 4 : 2;
    unsigned char *b = malloc((size_t)(rows * cols) * es);
    float *row = malloc((size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        if (!e->t) {
            for (int64_t k = 0; k < cols; k++)
                row[k] = mw_bias_at(m, e, k, to_half);
        } else if (to_half) {
            mw_row_half(m, e->t, e->is_qk, r, row);
        } else {
            mw_row_adjacent(m, e->t, e->is_qk, r, row);
        }
        for (int64_t k = 0; k < cols; k++) {
            unsigned char *d = b + ((size_t)(r * cols + k)) * es;
            if (dt == KVG_DT_F32) {
                memcpy(d, &row[k], 4);
            } else {
                uint16_t h = dt == KVG_DT_F16 ? mw_f32_to_f16(row[k]) : mw_f32_to_bf16(row[k]);
                memcpy(d, &h, 2);
            }
        }
    }
    free(row);
    *n_bytes = (size_t)(rows * cols) * es;
    return b;
}

/* ---- llama2.c tokenizer.bin ---- */

typedef struct mw_vocab {
    int n;
    char **piece;                /* NUL-terminated; ' ' replaced by U+2581 when converted */
    float *score;
    int *type;                   /* GGUF token types */
} mw_vocab;

__attribute__((unused)) static void mw_vocab_free(mw_vocab *v)
{
    for (int i = 0; i < v->n; i++)
        free(v->piece[i]);
    free(v->piece);
    free(v->score);
    free(v->type);
    memset(v, 0, sizeof *v);
}

/* Reads a llama2.c tokenizer.bin, converting pieces to SentencePiece spelling. */
__attribute__((unused)) static int mw_vocab_read(const char *path, mw_vocab *v)
{
    FILE *f = fopen(path, "rb");
    int32_t maxlen;
    memset(v, 0, sizeof *v);
    if (!f || fread(&maxlen, 4, 1, f) != 1) {
        if (f)
            fclose(f);
        return -1;
    }
    for (;;) {
        float sc;
        int32_t len;
        if (fread(&sc, 4, 1, f) != 1)
            break;
        if (fread(&len, 4, 1, f) != 1 || len < 0 || len > 4096)
            break;
        char *raw = malloc((size_t)len + 1), *p = malloc((size_t)len * 3 + 1), *w = p;
        if (fread(raw, 1, (size_t)len, f) != (size_t)len) {
            free(raw);
            free(p);
            break;
        }
        for (int32_t i = 0; i < len; i++) {
            if (raw[i] == ' ') {
                memcpy(w, "\xe2\x96\x81", 3);
                w += 3;
            } else {
                *w++ = raw[i];
            }
        }
        *w = '\0';
        free(raw);
        v->piece = realloc(v->piece, (size_t)(v->n + 1) * sizeof *v->piece);
        v->score = realloc(v->score, (size_t)(v->n + 1) * sizeof *v->score);
        v->type = realloc(v->type, (size_t)(v->n + 1) * sizeof *v->type);
        int id = v->n++;
        int byte = strlen(p) == 6 && strncmp(p, "<0x", 3) == 0 && p[5] == '>';
        v->type[id] = id == 0 ? 2 : id <= 2 ? 3 : byte ? 6 : 1;
        if (id <= 2) {
            free(p);
            p = strdup(id == 0 ? "<unk>" : id == 1 ? "<s>" : "</s>");
        }
        v->piece[id] = p;
        v->score[id] = sc;
    }
    fclose(f);
    return v->n > 3 ? 0 : -1;
}

/* ---- GGUF ---- */

__attribute__((unused)) static int mw_write_gguf(const kvg_model *m, const char *path, const mw_opts *o,
                                                 char *err, size_t err_len)
{
    const kvg_model_config *c = &m->cfg;
    const char *arch = o->fused ? "phi3" : c->has_qkv_bias ? "qwen2" : "llama";
    mw_tensor *list;
    int nt = mw_list_x(m, o->fused, &list);
    mw_vocab v = { 0 };
    if (nt < 0 || (o->fused && (c->rope_layout != KVG_ROPE_HALF || c->has_qkv_bias))) {
        snprintf(err, err_len, "fused GGUF: q/k/v and gate/up must be consecutive slices, rotate-half, no biases");
        free(list);
        return -1;
    }
    if (o->tok_path && mw_vocab_read(o->tok_path, &v) < 0) {
        snprintf(err, err_len, "%s: cannot read the tokenizer", o->tok_path);
        free(list);
        return -1;
    }
    int place = o->misalign || o->align64;   /* where the data starts, mod 64: 32 or 0 */
    int n_kv = 11 + (v.n ? 8 : 0) + (o->chat_template ? 1 : 0) + place;
    gb b;
    char k[96];
    size_t pad_at = 0;           /* place: general.description's length field */
    gb_init(&b, 3, (uint64_t)nt, (uint64_t)n_kv);
    gb_key(&b, "general.architecture", 8), gb_str(&b, arch);
    gb_key(&b, "general.name", 8), gb_str(&b, m->name);
    if (place) {
        gb_key(&b, "general.description", 8);
        pad_at = b.n;
        gb_str(&b, "");
    }
#define U32K(K, V) (snprintf(k, sizeof k, "%s." K, arch), gb_key(&b, k, 4), gb_u32(&b, (uint32_t)(V)))
#define F32K(K, V) (snprintf(k, sizeof k, "%s." K, arch), gb_key(&b, k, 6), gb_f32(&b, (V)))
    U32K("context_length", c->max_seq_len);
    U32K("embedding_length", c->dim);
    U32K("block_count", c->n_layers);
    U32K("feed_forward_length", c->hidden_dim);
    U32K("rope.dimension_count", c->head_dim);
    U32K("attention.head_count", c->n_heads);
    U32K("attention.head_count_kv", c->n_kv_heads);
    F32K("attention.layer_norm_rms_epsilon", c->norm_eps);
    F32K("rope.freq_base", c->rope_theta);
#undef U32K
#undef F32K
    if (v.n) {
        gb_key(&b, "tokenizer.ggml.model", 8), gb_str(&b, "llama");
        gb_key(&b, "tokenizer.ggml.tokens", 9), gb_arr(&b, 8, (uint64_t)v.n);
        for (int i = 0; i < v.n; i++)
            gb_str(&b, v.piece[i]);
        gb_key(&b, "tokenizer.ggml.scores", 9), gb_arr(&b, 6, (uint64_t)v.n);
        for (int i = 0; i < v.n; i++)
            gb_f32(&b, v.score[i]);
        gb_key(&b, "tokenizer.ggml.token_type", 9), gb_arr(&b, 5, (uint64_t)v.n);
        for (int i = 0; i < v.n; i++)
            gb_u32(&b, (uint32_t)v.type[i]);
        gb_key(&b, "tokenizer.ggml.bos_token_id", 4), gb_u32(&b, 1);
        gb_key(&b, "tokenizer.ggml.eos_token_id", 4), gb_u32(&b, 2);
        gb_key(&b, "tokenizer.ggml.unknown_token_id", 4), gb_u32(&b, 0);
        gb_key(&b, "tokenizer.ggml.add_bos_token", 7), gb_u8(&b, 1);
    }
    if (o->chat_template)
        gb_key(&b, "tokenizer.chat_template", 8), gb_str(&b, o->chat_template);
    /* Tensor infos, then the data, each tensor aligned to 32. */
    unsigned char **data = calloc((size_t)nt, sizeof *data);
    size_t *len = calloc((size_t)nt, sizeof *len);
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        kvg_dtype dt = list[i].t ? o->dtype : KVG_DT_F32;
        if (list[i].t && o->mix_match && strstr(list[i].gguf, o->mix_match))
            dt = o->mix_dtype;
        if (list[i].t && list[i].t->cols % kvg_dtype_block(dt) != 0)
            dt = KVG_DT_Q8_0;
        data[i] = mw_encode(m, &list[i], dt, c->has_qkv_bias || o->fused, &len[i]);
        gb_str(&b, list[i].gguf);
        if (list[i].t) {
            gb_u32(&b, 2);
            gb_u64(&b, (uint64_t)list[i].t->cols);
            gb_u64(&b, (uint64_t)list[i].t->rows);
        } else {
            gb_u32(&b, 1);
            gb_u64(&b, (uint64_t)list[i].n);
        }
        if (o->bad_match && strstr(list[i].gguf, o->bad_match))
            gb_u32(&b, o->bad_type);
        else if (kvg_dtype_is_quant(dt))
            gb_u32(&b, kvg_quant_ggml_type((kvg_qtype)(dt - KVG_DT_Q8_0)));
        else
            gb_u32(&b, dt == KVG_DT_F32 ? 0 : dt == KVG_DT_F16 ? 1 : 30);
        gb_u64(&b, off);
        off += (len[i] + 31) / 32 * 32;
    }
    if (place && (b.n + 31) / 32 * 32 % 64 != (o->misalign ? 32u : 0u)) {
        /* 32 bytes of description more move the data section 32 bytes on. */
        size_t at = pad_at + 8, tail = b.n - at;
        gb_bytes(&b, "                                ", 32);
        memmove(b.p + at + 32, b.p + at, tail);
        memset(b.p + at, ' ', 32);
        b.p[pad_at] = 32;
    }
    gb_pad(&b, 32);
    for (int i = 0; i < nt; i++) {
        gb_bytes(&b, data[i], len[i]);
        gb_pad(&b, 32);
        free(data[i]);
    }
    free(data);
    free(len);
    free(list);
    mw_vocab_free(&v);
    FILE *f = fopen(path, "wb");
    int rc = f && fwrite(b.p, 1, b.n, f) == b.n ? 0 : -1;
    if (f && fclose(f) != 0)
        rc = -1;
    if (rc < 0)
        snprintf(err, err_len, "%s: cannot write: %s", path, strerror(errno));
    gb_free(&b);
    return rc;
}

/* ---- llama2.c version 1 ("ak42") ---- */

__attribute__((unused)) static int mw_write_llama2c_v1(const kvg_model *m, const char *path, char *err,
                                                       size_t err_len)
{
    const kvg_model_config *c = &m->cfg;
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, err_len, "%s: cannot create", path);
        return -1;
    }
    unsigned char hdr[256] = { 0 };
    uint32_t magic = 0x616b3432;
    int32_t ver = 1, p[7] = { c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                              c->max_seq_len };
    memcpy(hdr, &magic, 4);
    memcpy(hdr + 4, &ver, 4);
    memcpy(hdr + 8, p, 28);
    hdr[36] = (unsigned char)(c->tied_embeddings != 0);
    fwrite(hdr, 1, 256, f);
    int L = c->n_layers;
    float *row = malloc((size_t)(c->dim > c->hidden_dim ? c->dim : c->hidden_dim) * 4);
    for (int l = 0; l < L; l++)
        fwrite(m->layers[l].attn_norm, 4, (size_t)c->dim, f);
    for (int l = 0; l < L; l++)
        fwrite(m->layers[l].ffn_norm, 4, (size_t)c->dim, f);
    fwrite(m->final_norm, 4, (size_t)c->dim, f);
#define PUT(T, QK) for (int64_t r = 0; r < (T)->rows; r++) { \
        mw_row_adjacent(m, (T), (QK), r, row); fwrite(row, 4, (size_t)(T)->cols, f); }
    PUT(&m->tok_embedding, 0);
    for (int l = 0; l < L; l++) PUT(&m->layers[l].wq, 1);
    for (int l = 0; l < L; l++) PUT(&m->layers[l].wk, 1);
    for (int l = 0; l < L; l++) PUT(&m->layers[l].wv, 0);
    for (int l = 0; l < L; l++) PUT(&m->layers[l].wo, 0);
    for (int l = 0; l < L; l++) PUT(&m->layers[l].w_gate, 0);
    for (int l = 0; l < L; l++) PUT(&m->layers[l].w_down, 0);
    for (int l = 0; l < L; l++) PUT(&m->layers[l].w_up, 0);
    if (!c->tied_embeddings)
        PUT(&m->output, 0);
#undef PUT
    free(row);
    if (fclose(f) != 0) {
        snprintf(err, err_len, "%s: write failed", path);
        return -1;
    }
    return 0;
}

/* ---- Hugging Face directory ---- */

__attribute__((unused)) static int mw_write_file(const char *dir, const char *name, const void *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    int rc = f && fwrite(p, 1, n, f) == n ? 0 : -1;
    if (f && fclose(f) != 0)
        rc = -1;
    return rc;
}

__attribute__((unused)) static int mw_write_json(const char *dir, const char *name, json_t *j)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = json_dump_file(j, path, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(j);
    return rc;
}

typedef struct mw_cand {
    int l, r;
    float score;
    int seq;
} mw_cand;

static inline __attribute__((unused)) int mw_cmp_lr(const void *a, const void *b)
{
    const mw_cand *x = a, *y = b;
    return x->l != y->l ? (x->l > y->l) - (x->l < y->l) : (x->r > y->r) - (x->r < y->r);
}

static inline __attribute__((unused)) int mw_cmp_score(const void *a, const void *b)
{
    const mw_cand *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static inline __attribute__((unused)) int mw_find(const mw_vocab *v, const char *s, size_t n)
{
    for (int i = 3; i < v->n; i++)
        if (strlen(v->piece[i]) == n && memcmp(v->piece[i], s, n) == 0)
            return i;
    return -1;
}

/* A Llama-2-style tokenizer.json: BPE with byte fallback, merges ordered the way
 * transformers' SentencePiece converter orders them (every split of every piece into
 * two pieces, by the piece's score, best first). Quadratic lookups: small vocabs. */
__attribute__((unused)) static json_t *mw_tokenizer_json(const mw_vocab *v)
{
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    mw_cand *c = NULL;
    int n = 0, cap = 0;
    for (int i = 0; i < v->n; i++) {
        json_object_set_new(vocab, v->piece[i], json_integer(i));
        if (v->type[i] == 2 || v->type[i] == 3)
            json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", i, "content",
                                                   v->piece[i], "single_word", 0, "lstrip", 0, "rstrip", 0,
                                                   "normalized", 0, "special", 1));
        if (v->type[i] != 1)
            continue;
        size_t len = strlen(v->piece[i]);
        int first = n;
        for (size_t k = 1; k < len; k++) {
            if (((unsigned char)v->piece[i][k] & 0xC0) == 0x80)
                continue;
            int l = mw_find(v, v->piece[i], k), r = mw_find(v, v->piece[i] + k, len - k);
            if (l < 0 || r < 0 || v->type[l] != 1 || v->type[r] != 1)
                continue;
            if (n == cap)
                c = realloc(c, (size_t)(cap = cap * 2 + 64) * sizeof *c);
            c[n++] = (mw_cand){ l, r, v->score[i], 0 };
        }
        qsort(c + first, (size_t)(n - first), sizeof *c, mw_cmp_lr);
    }
    for (int i = 0; i < n; i++)
        c[i].seq = i;
    qsort(c, (size_t)n, sizeof *c, mw_cmp_score);
    for (int i = 0; i < n; i++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s %s", v->piece[c[i].l], v->piece[c[i].r]);
        json_array_append_new(merges, json_string(buf));
    }
    free(c);
    json_t *model = json_pack("{s:s, s:n, s:s, s:n, s:n, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
                              "unk_token", "<unk>", "continuing_subword_prefix", "end_of_word_suffix",
                              "fuse_unk", 1, "byte_fallback", 1, "vocab", vocab, "merges", merges);
    return json_pack(
        "{s:s, s:n, s:n, s:o, s:{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}, s:n,"
        " s:{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}]},"
        " s:{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]}, s:o}",
        "version", "1.0", "truncation", "padding", "added_tokens", added,
        "normalizer", "type", "Sequence", "normalizers",
        "type", "Prepend", "prepend", "\xe2\x96\x81",
        "type", "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81",
        "pre_tokenizer",
        "post_processor", "type", "TemplateProcessing", "single",
        "SpecialToken", "id", "<s>", "type_id", 0, "Sequence", "id", "A", "type_id", 0,
        "decoder", "type", "Sequence", "decoders",
        "type", "Replace", "pattern", "String", "\xe2\x96\x81", "content", " ",
        "type", "ByteFallback", "type", "Fuse",
        "type", "Strip", "content", " ", "start", 1, "stop", 0,
        "model", model);
}

/* One safetensors file holding tensors [from, to) of the list. */
__attribute__((unused)) static int mw_write_safetensors(const kvg_model *m, const char *dir, const char *name,
                                                        mw_tensor *list, int from, int to, const mw_opts *o)
{
    const char *dts = o->dtype == KVG_DT_F32 ? "F32" : o->dtype == KVG_DT_F16 ? "F16" : "BF16";
    json_t *h = json_object();
    unsigned char **data = calloc((size_t)(to - from), sizeof *data);
    size_t *len = calloc((size_t)(to - from), sizeof *len), off = 0;
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    for (int i = from; i < to; i++) {
        data[i - from] = mw_encode(m, &list[i], o->dtype, !o->rope_half_override, &len[i - from]);
        json_t *shape = list[i].t ? json_pack("[I, I]", (json_int_t)list[i].t->rows, (json_int_t)list[i].t->cols)
                                  : json_pack("[I]", (json_int_t)list[i].n);
        json_object_set_new(h, list[i].hf, json_pack("{s:s, s:o, s:[I, I]}", "dtype", dts, "shape", shape,
                                                     "data_offsets", (json_int_t)off,
                                                     (json_int_t)(off + len[i - from])));
        off += len[i - from];
    }
    char *hs = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    size_t hl = strlen(hs), padded = (hl + 7) / 8 * 8;
    if (o->misalign)
        padded = hl % 8 == 1 ? hl : (hl / 8) * 8 + 9;      /* 8 + padded is odd: F32 data misaligned */
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    uint64_t hl64 = padded;
    int rc = f ? 0 : -1;
    if (f) {
        fwrite(&hl64, 8, 1, f);
        fwrite(hs, 1, hl, f);
        for (size_t i = hl; i < padded; i++)
            fputc(' ', f);
        for (int i = 0; i < to - from; i++)
            if (fwrite(data[i], 1, len[i], f) != len[i])
                rc = -1;
        if (fclose(f) != 0)
            rc = -1;
    }
    for (int i = 0; i < to - from; i++)
        free(data[i]);
    free(data);
    free(len);
    free(hs);
    return rc;
}

__attribute__((unused)) static int mw_write_hf(const kvg_model *m, const char *dir, const mw_opts *o, char *err,
                                               size_t err_len)
{
    const kvg_model_config *c = &m->cfg;
    mw_tensor *list;
    int nt = mw_list(m, &list), rc = 0;
    mkdir(dir, 0755);
    const char *dts = o->dtype == KVG_DT_F32 ? "float32" : o->dtype == KVG_DT_F16 ? "float16" : "bfloat16";
    json_t *cfg = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:s, s:i, s:i}",
                            "architectures", c->has_qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM",
                            "model_type", c->has_qkv_bias ? "qwen2" : "llama",
                            "hidden_size", c->dim, "intermediate_size", c->hidden_dim,
                            "num_hidden_layers", c->n_layers, "num_attention_heads", c->n_heads,
                            "num_key_value_heads", c->n_kv_heads, "head_dim", c->head_dim,
                            "vocab_size", c->vocab_size, "max_position_embeddings", c->max_seq_len,
                            "rms_norm_eps", (double)c->norm_eps, "rope_theta", (double)c->rope_theta,
                            "tie_word_embeddings", c->tied_embeddings, "torch_dtype", dts,
                            "bos_token_id", 1, "eos_token_id", 2);
    if (c->rope_scale_factor > 0)
        json_object_set_new(cfg, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                      (double)c->rope_scale_factor, "low_freq_factor",
                                      (double)c->rope_low_freq_factor, "high_freq_factor",
                                      (double)c->rope_high_freq_factor, "original_max_position_embeddings",
                                      c->rope_orig_max_pos));
    if (mw_write_json(dir, "config.json", cfg) < 0)
        rc = -1;
    int shards = o->n_shards > 1 ? o->n_shards : 1;
    if (shards == 1) {
        if (mw_write_safetensors(m, dir, "model.safetensors", list, 0, nt, o) < 0)
            rc = -1;
    } else {
        json_t *wm = json_object();
        for (int s = 0; s < shards; s++) {
            char name[64];
            int from = nt * s / shards, to = nt * (s + 1) / shards;
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
            if (mw_write_safetensors(m, dir, name, list, from, to, o) < 0)
                rc = -1;
            for (int i = from; i < to; i++)
                json_object_set_new(wm, list[i].hf, json_string(name));
        }
        if (mw_write_json(dir, "model.safetensors.index.json",
                          json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", wm)) < 0)
            rc = -1;
    }
    if (o->tok_path) {
        mw_vocab v;
        if (mw_vocab_read(o->tok_path, &v) < 0)
            rc = -1;
        else {
            if (mw_write_json(dir, "tokenizer.json", mw_tokenizer_json(&v)) < 0)
                rc = -1;
            mw_vocab_free(&v);
        }
    }
    if (o->chat_template
        && mw_write_json(dir, "tokenizer_config.json",
                         json_pack("{s:s, s:s, s:s}", "chat_template", o->chat_template, "bos_token", "<s>",
                                   "eos_token", "</s>")) < 0)
        rc = -1;
    free(list);
    if (rc < 0)
        snprintf(err, err_len, "%s: writing the Hugging Face directory failed", dir);
    return rc;
}

/* ---- comparison ---- */

/* Largest |a - b| over every weight, both read in the adjacent RoPE layout; INFINITY
 * when the shapes differ. */
__attribute__((unused)) static double mw_max_diff(const kvg_model *a, const kvg_model *b)
{
    mw_tensor *la, *lb;
    int na = mw_list(a, &la), nb = mw_list(b, &lb);
    double worst = na == nb ? 0 : INFINITY;
    for (int i = 0; i < na && i < nb && isfinite(worst); i++) {
        mw_tensor *x = &la[i], *y = &lb[i];
        if (!x->t != !y->t || (x->t && (x->t->rows != y->t->rows || x->t->cols != y->t->cols))
            || (!x->t && x->n != y->n)) {
            worst = INFINITY;
            break;
        }
        int64_t rows = x->t ? x->t->rows : 1, cols = x->t ? x->t->cols : x->n;
        float *ra = malloc((size_t)cols * 4), *rb = malloc((size_t)cols * 4);
        for (int64_t r = 0; r < rows; r++) {
            if (x->t) {
                mw_row_adjacent(a, x->t, x->is_qk, r, ra);
                mw_row_adjacent(b, y->t, y->is_qk, r, rb);
            } else {
                for (int64_t k = 0; k < cols; k++) {
                    ra[k] = mw_bias_at(a, x, k, 0);
                    rb[k] = mw_bias_at(b, y, k, 0);
                }
            }
            for (int64_t k = 0; k < cols; k++) {
                double d = fabs((double)ra[k] - (double)rb[k]);
                if (!(d <= worst))
                    worst = isnan(d) ? INFINITY : d;
            }
        }
        free(ra);
        free(rb);
    }
    free(la);
    free(lb);
    return worst;
}

#endif
