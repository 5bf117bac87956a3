/* A loaded model: configuration, weights and tokenizer, whatever the file format.
 *
 * Every loader (llama2.c .bin, GGUF, Hugging Face safetensors directory, synthetic)
 * fills this same struct; the forward pass only ever sees kvg_model. Big weight
 * matrices stay where the file put them (mmapped, in their dtype: F32, F16 or BF16);
 * only small vectors (norm weights, biases) are copied, as F32, at load, and a
 * matrix is converted/copied only when its layout must change (e.g. a transposed
 * or permuted tensor), never otherwise. */
#ifndef KVG_MODEL_H
#define KVG_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "tokenizer.h"

typedef enum kvg_dtype {
    KVG_DT_F32 = 0,
    KVG_DT_F16 = 1,
    KVG_DT_BF16 = 2,
    /* GGUF block formats (src/quant.h): `data` points at the raw blocks, rows
     * contiguous, cols a multiple of the block. */
    KVG_DT_Q8_0 = 3,
    KVG_DT_Q4_0 = 4,
    KVG_DT_Q4_K = 5,
    KVG_DT_Q6_K = 6,
    KVG_DT_MXFP4 = 7,            /* gpt-oss's experts: E8M0 scale, E2M1 codes */
    /* The CPU GEMM's own layouts of the quantized weights (engine/cpu/gemm_int8.h),
     * made from the file's blocks when the CPU backend starts; never in a file and
     * never seen by the loaders or the forward pass. */
    KVG_DT_Q8_0_R16 = 8,
    KVG_DT_Q4_0_R16 = 9,
    KVG_DT_Q4_K_R16 = 10,
    KVG_DT_Q6_K_R16 = 11,
    KVG_DT_MXFP4_R16 = 12
} kvg_dtype;

/* A row-major matrix [rows][cols] (a vector has rows == 1). Linear layers are stored
 * as [out_features][in_features], so y = x W^T (the llama2.c, GGUF and HF layout). */
typedef struct kvg_tensor {
    const void *data;
    kvg_dtype dtype;
    int64_t rows, cols;
} kvg_tensor;

/* The activation of the gated feed-forward network: act(gate) * up. */
typedef enum kvg_ffn_act {
    KVG_ACT_SILU = 0,            /* SwiGLU: Llama, Qwen, Mistral, Phi-3 */
    KVG_ACT_GELU_TANH = 1,       /* GeGLU with the tanh approximation: Gemma */
    KVG_ACT_SWIGLU_OAI = 2       /* gpt-oss's clamped SwiGLU: x = min(gate, 7),
                                    y = clamp(up, -7, 7), x sigmoid(1.702 x) (y + 1) */
} kvg_ffn_act;

/* How a mixture-of-experts layer turns its router's logits into the weights of the
 * experts it runs (each row: n_experts logits -> n_experts_used (expert, weight) pairs,
 * ties between equal values broken toward the lower expert index). */
typedef enum kvg_moe_gating {
    KVG_MOE_SOFTMAX = 0,         /* softmax over all n_experts logits, then the top k of
                                    those probabilities (Qwen MoE, Mixtral; llama.cpp's
                                    GATING_FUNC_TYPE_SOFTMAX) */
    KVG_MOE_TOPK_SOFTMAX = 1     /* the top k logits, then a softmax over those k alone
                                    (gpt-oss; llama.cpp's SOFTMAX_WEIGHT) */
} kvg_moe_gating;

/* How RoPE pairs the dimensions of a head. */
typedef enum kvg_rope_layout {
    KVG_ROPE_ADJACENT = 0,       /* (0,1),(2,3),...   llama2.c and GGUF */
    KVG_ROPE_HALF = 1            /* (i, i+head_dim/2) Hugging Face rotate_half */
} kvg_rope_layout;

typedef struct kvg_model_config {
    char arch[32];               /* "llama" (Llama 2/3, TinyLlama, SmolLM2, Mistral), "qwen2" */
    int dim;                     /* hidden size */
    int hidden_dim;              /* FFN intermediate size */
    int n_layers;
    int n_heads;
    int n_kv_heads;              /* GQA: n_heads % n_kv_heads == 0 */
    int head_dim;                /* usually dim / n_heads; HF may set it explicitly */
    int vocab_size;
    int max_seq_len;             /* context length */
    float norm_eps;              /* RMSNorm epsilon */
    float rope_theta;
    int rope_dims;               /* the leading dimensions of a head that RoPE rotates
                                    (Phi-4-mini: 3/4 of them); 0: all of head_dim */
    kvg_rope_layout rope_layout;
    /* Llama 3 rope scaling ("rope_type": "llama3"); factor == 0 means none. */
    float rope_scale_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int rope_orig_max_pos;
    int tied_embeddings;         /* output projection == token embedding */
    int has_qkv_bias;            /* Qwen2 */
    int has_o_bias;              /* gpt-oss: kvg_layer_weights.bo */

    /* ---- what sets the other families apart (model_family.c fills them from the
     * family's table; zero everywhere is the Llama forward pass) ---- */
    kvg_ffn_act ffn_act;         /* the gated FFN's activation */
    int qk_norm;                 /* Qwen3, Gemma 3: RMSNorm of each head of q and k (own
                                    [head_dim] weights, the model's eps) before RoPE */
    int post_norms;              /* Gemma 2/3: RMSNorm of the attention output and of the
                                    FFN output before each is added to the residual */
    float embed_scale;           /* 0: none; Gemma: the embeddings times sqrt(dim) */
    float attn_query_scalar;     /* scores are q.k / sqrt(this); 0: head_dim */
    float attn_softcap;          /* 0: none; Gemma 2: scores -> c tanh(scores / c) */
    float final_softcap;         /* 0: none; Gemma 2: logits -> c tanh(logits / c) */
    /* Sliding-window attention: a layer with kvg_layer_weights.sliding set attends to
     * the last swa_window positions only, itself included (query position p sees keys
     * p - swa_window + 1 .. p), as llama.cpp's standard SWA mask. */
    int swa_window;
    /* RoPE of the sliding-window layers when it differs (Gemma 3: base 10,000 there,
     * 1,000,000 with linear scaling on the global layers); 0: the global one. */
    float rope_theta_swa;
    /* Linear RoPE scaling (positions times this; "rope.scaling.type" linear); 0 or 1:
     * none. Applies to the global layers only, as llama.cpp's per-layer freq scale. */
    float rope_freq_scale;
    /* Per-pair divisors of the frequencies ([head_dim/2] F32, owned by the model):
     * Llama 3.1's rope_freqs, Phi-3's LongRoPE factors (the set chosen at load for the
     * context length); NULL: none. */
    const float *rope_freq_factors;
    float rope_attn_factor;      /* cos and sin times this (LongRoPE; with YaRN, llama.cpp's
                                    yarn_attn_factor: rope.h's kvg_rope_mscale); 0 or 1: none */
    /* YaRN ("rope.scaling.type" yarn); factor 0: none. Each pair's frequency blends the
     * interpolated one (f / factor) and the original one by a ramp over the pair index
     * between the correction dimensions of beta_fast and beta_slow at the original
     * context; cos and sin also take 1 + 0.1 ln(factor) (rope.h). */
    float rope_yarn_factor;
    int rope_yarn_orig_ctx;
    float rope_yarn_beta_fast, rope_yarn_beta_slow;
    /* Llama 4's query temperature (Ministral 3): after RoPE each row's q is multiplied by
     * 1 + attn_temp_scale * ln(floor((pos + attn_temp_offset) / attn_temp_floor) + 1)
     * (kvg_rope_q_scale); 0: none. */
    float attn_temp_scale;
    int attn_temp_floor;
    float attn_temp_offset;
    int attn_sinks;              /* gpt-oss: every layer has kvg_layer_weights.attn_sinks */

    /* Mixture-of-experts feed-forward (Qwen3-MoE): n_experts > 0 makes every layer's FFN
     * a router ([n_experts][dim]) choosing n_experts_used of n_experts gated FFNs of width
     * expert_hidden_dim (kvg_layer_weights.moe_*); hidden_dim is then unused by the
     * forward pass. 0: dense FFN. */
    int n_experts;
    int n_experts_used;
    int expert_hidden_dim;
    kvg_moe_gating moe_gating;
    int moe_norm_topk;           /* the k weights divided by their sum (at least 2^-14,
                                    as llama.cpp clamps it) after gating */
    int moe_biases;              /* gpt-oss: the router and every expert matrix have biases
                                    (kvg_layer_weights.moe_*_bias) */
} kvg_model_config;

typedef struct kvg_layer_weights {
    const float *attn_norm;      /* [dim] */
    kvg_tensor wq;               /* [n_heads*head_dim][dim] */
    kvg_tensor wk;               /* [n_kv_heads*head_dim][dim] */
    kvg_tensor wv;               /* [n_kv_heads*head_dim][dim] */
    kvg_tensor wo;               /* [dim][n_heads*head_dim] */
    const float *bq, *bk, *bv;   /* biases or NULL */
    const float *bo;             /* [dim] the output projection's bias, or NULL (gpt-oss) */
    /* [n_heads] when cfg.attn_sinks: one logit per head that joins each softmax's
     * maximum and denominator and carries no value (gpt-oss) */
    const float *attn_sinks;
    const float *ffn_norm;       /* [dim] */
    kvg_tensor w_gate;           /* w1: [hidden][dim] */
    kvg_tensor w_down;           /* w2: [dim][hidden] */
    kvg_tensor w_up;             /* w3: [hidden][dim] */
    const float *q_norm, *k_norm;            /* [head_dim] when cfg.qk_norm */
    const float *post_attn_norm, *post_ffn_norm; /* [dim] when cfg.post_norms */
    int sliding;                 /* attends to the last cfg.swa_window positions only */
    /* cfg.n_experts > 0: the router and each expert's matrices (owned arrays of
     * n_experts views, row slices of the file's stacked [n_experts][rows][cols]
     * tensors, so each expert is a matrix of its own). w_gate/w_up/w_down are unset. */
    kvg_tensor moe_router;       /* [n_experts][dim] */
    kvg_tensor *moe_gate;        /* [n_experts] of [expert_hidden][dim] */
    kvg_tensor *moe_up;          /* [n_experts] of [expert_hidden][dim] */
    kvg_tensor *moe_down;        /* [n_experts] of [dim][expert_hidden] */
    /* cfg.moe_biases: [n_experts], [n_experts][expert_hidden] (gate, up) and
     * [n_experts][dim] (down), F32 */
    const float *moe_router_bias, *moe_gate_bias, *moe_up_bias, *moe_down_bias;
} kvg_layer_weights;

typedef struct kvg_model {
    kvg_model_config cfg;
    kvg_tensor tok_embedding;    /* [vocab][dim] */
    kvg_layer_weights *layers;   /* [n_layers] */
    const float *final_norm;     /* [dim] */
    kvg_tensor output;           /* [vocab][dim]; == tok_embedding when tied */

    kvg_tokenizer *tokenizer;    /* NULL when none was found or given */
    int32_t bos, eos;            /* -1 when unknown */
    char *chat_template;         /* Jinja text from the file, or NULL */
    char chat_template_from[256];    /* where in the file: "GGUF tokenizer.chat_template of
                                        PATH", "PATH/tokenizer_config.json", ... */
    /* The bytes the tokenizer was loaded from, so another process (the gateway) can
     * load the very same tokenizer: tokenizer_file names the file (a tokenizer .bin,
     * tokenizer.json, or the GGUF model itself), else tokenizer_blob holds them
     * (built-in vocabularies). tokenizer_bytes is their length either way. */
    const char *tokenizer_file;
    const unsigned char *tokenizer_blob;
    size_t tokenizer_bytes;

    char name[128];              /* e.g. "stories260K", "synthetic:15M" */
    char format[16];             /* "llama2c", "gguf", "hf", "synthetic" */
    uint8_t id[32];              /* model identity: SHA-256 over weights + tokenizer */
    char id_hex[65];

    /* Storage owned by the model, released by kvg_model_free. */
    struct kvg_model_storage *storage;
} kvg_model;

/* Progress callback for long loads (hashing a multi-GB file): done/total bytes. */
typedef void (*kvg_progress_fn)(void *ctx, const char *what, uint64_t done, uint64_t total);

typedef struct kvg_model_load_opts {
    const char *tokenizer_path;  /* overrides / supplies the tokenizer (llama2.c needs one) */
    kvg_progress_fn progress;    /* may be NULL */
    void *progress_ctx;
    int max_seq_len;             /* 0: the model's own; synthetic models accept larger */
} kvg_model_load_opts;

/* Loads `path`, detecting the format: a directory with config.json (HF), a GGUF file,
 * "synthetic:NAME" (presets 260K, 15M, 110M, 1B), else a llama2.c checkpoint.
 * NULL on error with a message naming the file and, where relevant, the tensor. */
kvg_model *kvg_model_load(const char *path, const kvg_model_load_opts *opts,
                          char *err, size_t err_len);
void kvg_model_free(kvg_model *m);

/* Writes m (any format, any dtype) as a llama2.c checkpoint (version 0 legacy header,
 * F32), so other implementations can run identical weights. 0 or -1 with err. */
int kvg_model_export_llama2c(const kvg_model *m, const char *path, char *err, size_t err_len);

/* Tells the model that t's bytes will not be read for a long while (a backend keeps
 * its own copy in another layout). When they lie in a mapping of the model file, their
 * whole pages leave the process's resident set: they are read back from the file if
 * touched again (clean pages: same bytes), so nothing changes but the memory held.
 * Bytes in other storage are left alone. Returns the bytes released. */
size_t kvg_model_release_pages(const kvg_model *m, const kvg_tensor *t);
/* Whether t's bytes lie in a mapping of the model file (so kvg_model_release_pages can
 * hand them back: a backend's copy of them then costs no memory). */
int kvg_model_in_file(const kvg_model *m, const kvg_tensor *t);

/* What the model's family adds to the Llama forward pass, for a log line: e.g.
 * "gemma3: q/k norms, post-norms, GeGLU, embeddings x 45.25, sliding window 512 on 5 of
 * 6 layers (RoPE base 10000 there; at the full context they could give back 69% of the
 * KV)"; "llama: the plain Llama forward pass". Returns buf. */
const char *kvg_model_features(const kvg_model *m, char *buf, size_t len);

/* Bytes per element (F32, F16, BF16; 0 for the block formats) and row conversion
 * helpers shared by loaders and kernels. */
size_t kvg_dtype_size(kvg_dtype t);
const char *kvg_dtype_name(kvg_dtype t);
int kvg_dtype_is_quant(kvg_dtype t);                     /* Q8_0 .. MXFP4 */
int kvg_dtype_block(kvg_dtype t);                        /* elements per block: 1, 32 or 256 */
size_t kvg_dtype_row_bytes(kvg_dtype t, int64_t cols);   /* cols / block * block bytes */
/* Converts row r of t to F32 (cols floats); block formats to their defined values
 * (src/quant.h). */
void kvg_tensor_row_f32(const kvg_tensor *t, int64_t r, float *out);

#endif
