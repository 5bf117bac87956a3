/* Shared by the model loaders (model_llama2c.c, model_gguf.c, model_hf.c,
 * model_synthetic.c), implemented in model_common.c: storage ownership, error
 * formatting, tensor binding with the checks every format needs, the binding of a
 * model's weights through a loader's lookup (kvgm_source), and the model identity
 * hash. Not a public header. The loaders' entry points are in
 * model_formats.h, for model_load.c above them. */
#ifndef KVG_MODEL_INTERNAL_H
#define KVG_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "errmsg.h"

struct kvg_gguf;

/* Everything a model owns: read-only file mappings, anonymous mappings (big
 * generated or converted weights), small malloc'd buffers, and a parsed GGUF. */
typedef struct kvgm_block {
    void *p;
    size_t len;
    int kind;                    /* KVGM_MAP, KVGM_ANON, KVGM_HEAP */
} kvgm_block;

enum { KVGM_MAP = 0, KVGM_ANON = 1, KVGM_HEAP = 2 };

struct kvg_model_storage {
    kvgm_block *blocks;
    size_t n_blocks, cap_blocks;
    struct kvg_gguf *gguf;
};

/* A fresh model with its storage, format and name set; NULL when out of memory. */
kvg_model *kvgm_new(const char *format, const char *name);

/* Maps a whole regular file read-only into the model's storage. An empty file, a
 * directory or an unreadable path is an error naming `path`. */
int kvgm_map_file(kvg_model *m, const char *path, const unsigned char **data, size_t *len,
                  char *err, size_t err_len);
/* Owned, zeroed memory: 64-byte aligned heap for small things, anonymous mappings
 * (page aligned, returned to the system on free) for big ones. NULL when out of memory. */
void *kvgm_alloc(kvg_model *m, size_t n);

/* kvgm_new named after the base name of `path` (without its last extension when
 * drop_extension: a file's, not a directory's); NULL with "PATH: out of memory". */
kvg_model *kvgm_new_from_path(const char *format, const char *path, int drop_extension,
                              char *err, size_t err_len);
/* A model of a one-file format: kvgm_new_from_path(format, path, 1) holding the whole
 * file mapped (kvgm_map_file) at *data, *len. NULL with err. */
kvg_model *kvgm_new_mapped(const char *format, const char *path, const unsigned char **data,
                           size_t *len, char *err, size_t err_len);

/* Binds a matrix that lies in mapped memory; copies it into owned memory only when
 * it is misaligned for its dtype. -1 when out of memory. */
int kvgm_bind(kvg_model *m, kvg_tensor *t, const void *p, kvg_dtype dt, int64_t rows, int64_t cols,
              char *err, size_t err_len);

/* ---- a model's weights, looked up by every loader alike ---- */

/* The weights of a model: model-wide, then those of each layer. */
typedef enum kvgm_weight {
    KVGM_EMBEDDING, KVGM_OUTPUT, KVGM_FINAL_NORM,
    KVGM_ATTN_NORM, KVGM_WQ, KVGM_WK, KVGM_WV, KVGM_WO,
    KVGM_FFN_NORM, KVGM_W_GATE, KVGM_W_DOWN, KVGM_W_UP,
    KVGM_BQ, KVGM_BK, KVGM_BV,
    KVGM_Q_NORM, KVGM_K_NORM,            /* cfg.qk_norm */
    KVGM_POST_ATTN_NORM, KVGM_POST_FFN_NORM, /* cfg.post_norms */
    KVGM_WQKV,                           /* q, k and v in one matrix (Phi-3), when present */
    KVGM_W_GATE_UP,                      /* gate then up in one matrix (Phi-3), with
                                            kvgm_source.fused_gate_up */
    KVGM_MOE_ROUTER,                     /* cfg.n_experts: [n_experts][dim] */
    KVGM_MOE_GATE, KVGM_MOE_UP, KVGM_MOE_DOWN,   /* the experts' matrices, stacked */
    KVGM_BO,                             /* cfg.has_o_bias: [dim] */
    KVGM_ATTN_SINKS,                     /* cfg.attn_sinks: [n_heads] */
    KVGM_MOE_ROUTER_BIAS,                /* cfg.moe_biases: [n_experts] */
    KVGM_MOE_GATE_BIAS, KVGM_MOE_UP_BIAS, KVGM_MOE_DOWN_BIAS, /* [n_experts][rows] */
    KVGM_N_WEIGHTS
} kvgm_weight;

/* A loader's file(s), as kvgm_mat, kvgm_vec and kvgm_bind_layers see them. */
typedef struct kvgm_source kvgm_source;
struct kvgm_source {
    kvg_model *m;
    /* Weight w of `layer` (-1: a model-wide one), named `name` in the file (NULL when
     * the source has no names), with shape [rows][cols] (rows 0: a vector of cols), or
     * [mats][rows][cols] when mats > 1 (a stack of matrices, e.g. a MoE layer's experts,
     * each rows x cols, one after the other): its bytes and dtype, after the format's
     * checks of both. Missing and optional: 0 with *data NULL. Otherwise -1 with the
     * error in s->err. */
    int (*find)(const kvgm_source *s, const char *name, kvgm_weight w, int layer, int64_t mats,
                int64_t rows, int64_t cols, int optional, const void **data, kvg_dtype *dt);
    void *ctx;                   /* the loader's state, for find */
    const char *const *names;    /* [KVGM_N_WEIGHTS] the file's names, or NULL */
    const char *layer_prefix;    /* a layer's names are PREFIX<layer>.NAME */
    const char *where;           /* names the model in an out-of-memory error */
    char *err;
    size_t err_len;
    int fused_gate_up;           /* the FFN's gate and up are one [2 hidden][dim] matrix */
};

/* Finds a matrix and binds it (kvgm_bind). Missing and optional: 0, *out untouched. */
int kvgm_mat(const kvgm_source *s, kvg_tensor *out, kvgm_weight w, int layer, int64_t rows,
             int64_t cols, int optional);
/* Finds a stack of n matrices [n][rows][cols] and binds each as a matrix of its own:
 * *out = an owned array of n views (row slices of the stack). Not optional. */
int kvgm_stack(const kvgm_source *s, kvg_tensor **out, kvgm_weight w, int layer, int64_t n, int64_t rows,
               int64_t cols);
/* Finds a vector and makes an owned F32 copy of it, even of an F32 one: a step that
 * read it in the file's mapping would fault the released pages around it back in.
 * Missing and optional: 0, *out NULL. */
int kvgm_vec(const kvgm_source *s, const float **out, kvgm_weight w, int layer, int64_t n,
             int optional);
/* Allocates m->layers and binds every layer's weights with the config's shapes: the
 * norms, q/k/v/o (or one fused qkv matrix when the file has it), gate/down/up (or the
 * fused gate-up one), the q/k/v biases when cfg.has_qkv_bias, the o bias when
 * cfg.has_o_bias, the sinks when cfg.attn_sinks, q/k norms when cfg.qk_norm, the
 * post-norms when cfg.post_norms; with cfg.n_experts, the router and the stacked experts
 * (kvgm_stack) in place of gate/down/up, and their biases when cfg.moe_biases. */
int kvgm_bind_layers(const kvgm_source *s);

/* One piece of the identity: a label and bytes. */
typedef struct kvgm_part {
    const char *label;
    const void *data;
    size_t len;
} kvgm_part;

/* m->id = SHA-256("kvgate-model-id/1" || format || for each part: label, u64 length,
 * bytes); reports progress every 64 MiB. -1 (with err) only if OpenSSL fails. */
int kvgm_identity(kvg_model *m, const kvgm_part *parts, size_t n_parts,
                  const kvg_model_load_opts *opts, char *err, size_t err_len);

/* The checks and defaults every loader shares, run after the tensors are bound:
 * consistent hyperparameters, every tensor present with its expected shape, the
 * tokenizer's vocabulary fitting the embedding, bos/eos, the max_seq_len option.
 * `file` names the model in messages. */
int kvgm_finish(kvg_model *m, const kvg_model_load_opts *opts, const char *file,
                int allow_longer_ctx, char *err, size_t err_len);

/* Records where m->tokenizer came from (kvg_model.tokenizer_file / _blob): a file
 * path, or bytes that are copied into the model. -1 when out of memory. */
int kvgm_set_tokenizer_source(kvg_model *m, const char *file, const void *blob, size_t len,
                              char *err, size_t err_len);

/* Loads the tokenizer file `path` (returns 0 leaving m->tokenizer NULL when path
 * is NULL) and records its bytes for the identity in *bytes and *len (mapped into m). */
int kvgm_load_tokenizer_file(kvg_model *m, const char *path, const unsigned char **bytes,
                             size_t *len, char *err, size_t err_len);

#endif
