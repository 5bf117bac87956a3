/* The normalizer and pre_tokenizer of a Hugging Face tokenizer.json, read into
 * what the encoder does with them (tok_hfpipe.c; used by tok_hfjson.c). */
#ifndef KVG_TOK_HFPIPE_H
#define KVG_TOK_HFPIPE_H

#include <jansson.h>

#include "tok_internal.h"

typedef struct kvg_hf_pipe {
    /* normalizer */
    int norm;                    /* enum kvg_tok_norm */
    int spm_prepend;             /* Prepend("▁") */
    int spm_replace;             /* Replace(" " -> "▁") */
    /* pre_tokenizer */
    int byte_level;              /* a ByteLevel pre-tokenizer was seen */
    int byte_level_prefix;       /* ... with add_prefix_space (first in the pipeline) */
    int metaspace;               /* a Metaspace pre-tokenizer */
    int metaspace_prefix;        /* enum kvg_tok_prefix it asks for */
    int metaspace_split;         /* ... with "split": true */
    kvg_pretok_stage *st;        /* the splits, in order */
    size_t n_st, cap_st;
    size_t n_dropped;            /* SPM splits on " " that cannot match (spaces are "▁") */
} kvg_hf_pipe;

/* Each returns 0, or -1 with "PATH: message" in err. */
int kvg_hf_parse_normalizer(kvg_hf_pipe *p, const json_t *n, const char *path, char *err,
                            size_t err_len);
int kvg_hf_parse_pretok(kvg_hf_pipe *p, const json_t *n, const char *path, char *err,
                        size_t err_len);
/* Frees the stages still owned by p. */
void kvg_hf_pipe_free(kvg_hf_pipe *p);

#endif
