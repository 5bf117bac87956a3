/* A tiny qwen3moe GGUF for the tests, written as llama.cpp's converter lays one out:
 * q/k norms, router ffn_gate_inp [E][dim] (F32), experts stacked in 3-D
 * ffn_{gate,up}_exps [E][EH][dim] and ffn_down_exps [E][dim][EH] in the spec's dtypes, a
 * byte-fallback SentencePiece vocabulary. Random weights from spec.seed.
 *
 *   moe_spec s = { .dim = 64, ... };
 *   kvg_model *m = moe_load(&s, "tag", err, sizeof err);   (written to /tmp, loaded, removed)
 *
 * Header-only; needs quant_testing.h's quantizer. */
#ifndef KVG_MOE_MODEL_H
#define KVG_MOE_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_builder.h"
#include "model.h"
#include "quant.h"
#include "quant_testing.h"

typedef struct moe_spec {
    int dim, heads, kv_heads, head_dim, layers, E, K, EH, vocab, ctx;
    kvg_dtype exp_dt, down_dt;   /* the experts' gate/up and down dtypes */
    int write_ff;                /* write feed_forward_length (else the expert width is
                                    its only width) */
    int router_ties;             /* layer 0's router all zeros; layer 1's rows 2, 5, 6
                                    identical */
    int bad_stack;               /* ffn_up_exps of layer 0 with one expert too few */
    uint32_t seed;
} moe_spec;

static uint64_t moe_rs;
__attribute__((unused)) static float moe_unif(void)
{
    moe_rs = moe_rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(uint32_t)(moe_rs >> 32) / 2147483648.0 - 1.0);
}

typedef struct moe_tensor {
    char name[64];
    int n_dims;
    uint64_t ne[3];
    kvg_dtype dt;
    unsigned char *data;
    size_t len;
} moe_tensor;

__attribute__((unused)) static uint32_t moe_ggml_type(kvg_dtype dt)
{
    return dt == KVG_DT_F32 ? 0 : kvg_quant_ggml_type((kvg_qtype)(dt - KVG_DT_Q8_0));
}

/* A tensor of nmat x rows x cols (ne = cols, rows, nmat) of uniform values times scale
 * (or `fill` when non-NULL: rows of cols floats), encoded as dt. */
__attribute__((unused)) static void moe_make_tensor(moe_tensor *t, const char *name, int n_dims, int64_t nmat,
                                                    int64_t rows, int64_t cols, kvg_dtype dt, float scale, float add,
                                                    const float *fill)
{
    int64_t nrows = nmat * rows;
    float *row = malloc((size_t)cols * sizeof *row);
    size_t rb = kvg_dtype_is_quant(dt) ? kvg_dtype_row_bytes(dt, cols) : (size_t)cols * 4;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = (uint64_t)cols;
    t->ne[1] = (uint64_t)rows;
    t->ne[2] = (uint64_t)nmat;
    t->dt = dt;
    t->len = (size_t)nrows * rb;
    t->data = malloc(t->len);
    for (int64_t r = 0; r < nrows; r++) {
        for (int64_t k = 0; k < cols; k++)
            row[k] = fill ? fill[r * cols + k] : add + scale * moe_unif();
        if (kvg_dtype_is_quant(dt))
            kvg_quant_row((kvg_qtype)(dt - KVG_DT_Q8_0), row, t->data + (size_t)r * rb, cols);
        else
            memcpy(t->data + (size_t)r * rb, row, rb);
    }
    free(row);
}

__attribute__((unused)) static int moe_write(const moe_spec *s, const char *path)
{
    int nt_max = 3 + s->layers * 12, nt = 0;
    moe_tensor *ts = calloc((size_t)nt_max, sizeof *ts);
    int64_t D = s->dim, Q = (int64_t)s->heads * s->head_dim, KV = (int64_t)s->kv_heads * s->head_dim;
    float wscale = 1.0f / sqrtf((float)D), hscale = 1.0f / sqrtf((float)s->EH);
    char n[64];
    gb b;
    int n_vocab_kv = 7, n_kv = 15 + (s->write_ff ? 1 : 0) + n_vocab_kv;
    uint64_t off = 0;

    moe_rs = s->seed;
    moe_make_tensor(&ts[nt++], "token_embd.weight", 2, 1, s->vocab, D, KVG_DT_F32, 1.0f, 0, NULL);
    moe_make_tensor(&ts[nt++], "output_norm.weight", 1, 1, 1, D, KVG_DT_F32, 0.2f, 1.0f, NULL);
    moe_make_tensor(&ts[nt++], "output.weight", 2, 1, s->vocab, D, KVG_DT_F32, wscale, 0, NULL);
    for (int l = 0; l < s->layers; l++) {
#define NM(x) (snprintf(n, sizeof n, "blk.%d." x, l), n)
        moe_make_tensor(&ts[nt++], NM("attn_norm.weight"), 1, 1, 1, D, KVG_DT_F32, 0.2f, 1.0f, NULL);
        moe_make_tensor(&ts[nt++], NM("attn_q.weight"), 2, 1, Q, D, KVG_DT_F32, wscale, 0, NULL);
        moe_make_tensor(&ts[nt++], NM("attn_k.weight"), 2, 1, KV, D, KVG_DT_F32, wscale, 0, NULL);
        moe_make_tensor(&ts[nt++], NM("attn_v.weight"), 2, 1, KV, D, KVG_DT_F32, wscale, 0, NULL);
        moe_make_tensor(&ts[nt++], NM("attn_output.weight"), 2, 1, D, Q, KVG_DT_F32, wscale, 0, NULL);
        moe_make_tensor(&ts[nt++], NM("attn_q_norm.weight"), 1, 1, 1, s->head_dim, KVG_DT_F32, 0.2f, 1.0f, NULL);
        moe_make_tensor(&ts[nt++], NM("attn_k_norm.weight"), 1, 1, 1, s->head_dim, KVG_DT_F32, 0.2f, 1.0f, NULL);
        moe_make_tensor(&ts[nt++], NM("ffn_norm.weight"), 1, 1, 1, D, KVG_DT_F32, 0.2f, 1.0f, NULL);
        {
            float *rt = malloc((size_t)s->E * D * sizeof *rt);
            for (int64_t i = 0; i < s->E * D; i++)
                rt[i] = 3.0f * wscale * moe_unif();
            if (s->router_ties && l == 0)
                memset(rt, 0, (size_t)s->E * D * sizeof *rt);
            if (s->router_ties && l == 1) {
                memcpy(rt + 5 * D, rt + 2 * D, (size_t)D * sizeof *rt);
                memcpy(rt + 6 * D, rt + 2 * D, (size_t)D * sizeof *rt);
            }
            moe_make_tensor(&ts[nt++], NM("ffn_gate_inp.weight"), 2, 1, s->E, D, KVG_DT_F32, 0, 0, rt);
            free(rt);
        }
        moe_make_tensor(&ts[nt++], NM("ffn_gate_exps.weight"), 3, s->E, s->EH, D, s->exp_dt, 2 * wscale, 0, NULL);
        moe_make_tensor(&ts[nt++], NM("ffn_up_exps.weight"), 3, s->bad_stack && l == 0 ? s->E - 1 : s->E, s->EH, D,
                    s->exp_dt, 2 * wscale, 0, NULL);
        moe_make_tensor(&ts[nt++], NM("ffn_down_exps.weight"), 3, s->E, D, s->EH, s->down_dt, 2 * hscale, 0, NULL);
#undef NM
    }

    gb_init(&b, 3, (uint64_t)nt, (uint64_t)n_kv);
    gb_key(&b, "general.architecture", 8), gb_str(&b, "qwen3moe");
    gb_key(&b, "general.name", 8), gb_str(&b, "tiny-moe");
#define U32K(K, V) (gb_key(&b, "qwen3moe." K, 4), gb_u32(&b, (uint32_t)(V)))
#define F32K(K, V) (gb_key(&b, "qwen3moe." K, 6), gb_f32(&b, (V)))
    U32K("context_length", s->ctx);
    U32K("embedding_length", s->dim);
    U32K("block_count", s->layers);
    if (s->write_ff)
        U32K("feed_forward_length", 6 * s->EH);
    U32K("attention.head_count", s->heads);
    U32K("attention.head_count_kv", s->kv_heads);
    U32K("attention.key_length", s->head_dim);
    U32K("attention.value_length", s->head_dim);
    U32K("rope.dimension_count", s->head_dim);
    F32K("attention.layer_norm_rms_epsilon", 1e-6f);
    F32K("rope.freq_base", 1000000.0f);
    U32K("expert_count", s->E);
    U32K("expert_used_count", s->K);
    U32K("expert_feed_forward_length", s->EH);
#undef U32K
#undef F32K
    /* A vocabulary: <unk> <s> </s>, the 256 byte tokens, then plain pieces. */
    gb_key(&b, "tokenizer.ggml.model", 8), gb_str(&b, "llama");
    gb_key(&b, "tokenizer.ggml.tokens", 9), gb_arr(&b, 8, (uint64_t)s->vocab);
    for (int i = 0; i < s->vocab; i++) {
        char p[16];
        if (i < 3)
            snprintf(p, sizeof p, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259)
            snprintf(p, sizeof p, "<0x%02X>", i - 3);
        else
            snprintf(p, sizeof p, "p%d", i);
        gb_str(&b, p);
    }
    gb_key(&b, "tokenizer.ggml.scores", 9), gb_arr(&b, 6, (uint64_t)s->vocab);
    for (int i = 0; i < s->vocab; i++)
        gb_f32(&b, -(float)i);
    gb_key(&b, "tokenizer.ggml.token_type", 9), gb_arr(&b, 5, (uint64_t)s->vocab);
    for (int i = 0; i < s->vocab; i++)
        gb_u32(&b, i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);
    gb_key(&b, "tokenizer.ggml.bos_token_id", 4), gb_u32(&b, 1);
    gb_key(&b, "tokenizer.ggml.eos_token_id", 4), gb_u32(&b, 2);
    gb_key(&b, "tokenizer.ggml.unknown_token_id", 4), gb_u32(&b, 0);
    for (int i = 0; i < nt; i++) {
        gb_str(&b, ts[i].name);
        gb_u32(&b, (uint32_t)ts[i].n_dims);
        for (int d = 0; d < ts[i].n_dims; d++)
            gb_u64(&b, ts[i].ne[d]);
        gb_u32(&b, moe_ggml_type(ts[i].dt));
        gb_u64(&b, off);
        off += (ts[i].len + 31) / 32 * 32;
    }
    gb_pad(&b, 32);
    for (int i = 0; i < nt; i++) {
        gb_bytes(&b, ts[i].data, ts[i].len);
        gb_pad(&b, 32);
        free(ts[i].data);
    }
    free(ts);
    FILE *f = fopen(path, "wb");
    int rc = f && fwrite(b.p, 1, b.n, f) == b.n ? 0 : -1;
    if (f)
        fclose(f);
    gb_free(&b);
    return rc;
}

__attribute__((unused)) static kvg_model *moe_load(const moe_spec *s, const char *tag, char *err, size_t err_len)
{
    char path[128];
    kvg_model_load_opts o = { 0 };
    kvg_model *m;
    snprintf(path, sizeof path, "/tmp/kvg-moe-%d-%s.gguf", (int)getpid(), tag);
    if (moe_write(s, path) != 0) {
        snprintf(err, err_len, "cannot write %s", path);
        return NULL;
    }
    m = kvg_model_load(path, &o, err, err_len);
    unlink(path);
    return m;
}

#endif
