/* For tests only: what a loaded tokenizer is, seen from outside (tokenizer.c). Not the
 * library's API: nothing outside t/ calls these. */
#ifndef KVG_TOKENIZER_TESTING_H
#define KVG_TOKENIZER_TESTING_H

#include "tokenizer.h"

/* "llama2c", "gguf-llama", "gguf-gpt2", "hf-bpe", "hf-spm" */
const char *kvg_tokenizer_kind(const kvg_tokenizer *t);

/* The raw piece as stored in the vocabulary (e.g. "<0x0A>", "\u2581the", "Ġthe"). */
const char *kvg_tokenizer_piece(const kvg_tokenizer *t, int32_t id, size_t *len);

#endif
