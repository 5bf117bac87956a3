/* RoPE angles shared by every backend: the CPU backend and the CUDA backend (which
 * computes them on the host and uploads them with the step) must rotate by the very same
 * floats, so both call these. */
#ifndef KVG_ROPE_H
#define KVG_ROPE_H

#include <stdint.h>

#include "model.h"

/* NULL when the model's Llama 3 rope scaling is consistent (or absent), else what is wrong:
 * every backend refuses such a model at creation with this message. */
const char *kvg_rope_config_error(const kvg_model_config *cfg);

/* f[p] (p < head_dim/2) = theta^(-2p/head_dim), with Llama 3's rescaling of the long
 * wavelengths when configured. */
void kvg_rope_frequencies(const kvg_model_config *cfg, float *f);

/* cs[2p], cs[2p+1] = cos, sin of pos * inv_freq[p] for p < half. */
void kvg_rope_cos_sin(const float *inv_freq, int half, int32_t pos, float *cs);

#endif
