/* For tests only: opening a GGUF file by path, its header fields, and walking its keys
 * and tensors by index (gguf.c), which the unit tests, the tokenizer-loading fuzz
 * target and a benchmark's model writer use. Not the library's API: nothing outside t/
 * and fuzz/ calls these (the engine and the tokenizers parse their own mapping with
 * kvg_gguf_parse and look keys and tensors up by name). */
#ifndef KVG_GGUF_TESTING_H
#define KVG_GGUF_TESTING_H

#include "gguf.h"

/* Maps the file read-only and parses it; the mapping is released by kvg_gguf_free. */
kvg_gguf *kvg_gguf_open(const char *path, char *err, size_t err_len);

uint32_t kvg_gguf_version(const kvg_gguf *g);
uint32_t kvg_gguf_alignment(const kvg_gguf *g);

/* Keys and tensors in file order; NULL for i past the last. */
size_t kvg_gguf_n_kv(const kvg_gguf *g);
const kvg_gguf_kv *kvg_gguf_kv_at(const kvg_gguf *g, size_t i);
size_t kvg_gguf_n_tensors(const kvg_gguf *g);
const kvg_gguf_tensor *kvg_gguf_tensor_at(const kvg_gguf *g, size_t i);

#endif
