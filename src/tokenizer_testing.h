/* For tests only: what a loaded tokenizer is, seen from outside (tokenizer.c). Not the
 * library's API: nothing outside t/ calls these. */
#ifndef KVG_TOKENIZER_TESTING_H
#define KVG_TOKENIZER_TESTING_H

#include "tokenizer.h"

/* "llama2c", "gguf-llama", "gguf-gpt2", "hf-bpe", "hf-spm" */
const char *kvg_tokenizer_kind(const kvg_tokenizer *t);


#endif
