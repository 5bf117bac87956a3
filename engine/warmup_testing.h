/* For tests only: a warm-up file parsed from memory (warmup.c). Not the engine's API:
 * nothing outside t/ calls it (the engine loads a file: kvg_warmup_load). */
#ifndef KVG_WARMUP_TESTING_H
#define KVG_WARMUP_TESTING_H

#include "warmup.h"

/* As kvg_warmup_load, from bytes in memory; name is used in messages. */
kvg_warmup *kvg_warmup_parse(const char *data, size_t len, const char *name,
                             const kvg_tokenizer *tok, int32_t vocab_size,
                             char *err, size_t err_len);

#endif
