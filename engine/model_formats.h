/* The format loaders, one per file (model_llama2c.c, model_gguf.c, model_hf.c,
 * model_synthetic.c), for kvg_model_load (model_load.c) to dispatch to. Each takes the
 * path (or spec) and the options of kvg_model_load and returns the same way: a model,
 * or NULL with err. Not a public header. */
#ifndef KVG_MODEL_FORMATS_H
#define KVG_MODEL_FORMATS_H

#include <stddef.h>

#include "model.h"

kvg_model *kvgm_load_llama2c(const char *path, const kvg_model_load_opts *opts,
                             char *err, size_t err_len);
kvg_model *kvgm_load_gguf(const char *path, const kvg_model_load_opts *opts,
                          char *err, size_t err_len);
kvg_model *kvgm_load_hf(const char *dir, const kvg_model_load_opts *opts,
                        char *err, size_t err_len);
/* spec: "synthetic:..." (see model.h). */
kvg_model *kvgm_load_synthetic(const char *spec, const kvg_model_load_opts *opts,
                               char *err, size_t err_len);

#endif
