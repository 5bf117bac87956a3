/* RoPE angles shared by every backend: the CPU backend and the CUDA backend (which
 * computes them on the host and uploads them with the step) must rotate by the very same
 * floats, so both call these.
 *
 * A model has one or two kinds of rotation: the global layers', and, when it differs,
 * the sliding-window layers' (Gemma 3: another base, no scaling). A layer's kind is
 * kvg_rope_kind; each kind has its own frequencies and table of cos/sin per row. */
#ifndef KVG_ROPE_H
#define KVG_ROPE_H

#include <stdint.h>

#include "model.h"

/* NULL when the model's Llama 3 / YaRN rope scaling and query temperature are consistent
 * (or absent), else what is wrong:
 * every backend refuses such a model at creation with this message. */
const char *kvg_rope_config_error(const kvg_model_config *cfg);

/* The leading dimensions of a head RoPE rotates (cfg.rope_dims, or all): the pairs are
 * (p, p + n/2) (rotate-half) or (2p, 2p + 1) for p < n/2; the rest pass unrotated. */
static inline int kvg_rope_dims(const kvg_model_config *cfg)
{
    return cfg->rope_dims > 0 ? cfg->rope_dims : cfg->head_dim;
}

/* 1 or 2: how many kinds of rotation the model's layers use. */
int kvg_rope_n_kinds(const kvg_model *m);
/* The kind of `layer`: 0 (global) or 1 (a sliding-window layer with its own RoPE). */
int kvg_rope_kind(const kvg_model *m, int layer);

/* f[p] (p < rope_dims/2) of kind `kind` = theta^(-2p/rope_dims) (theta: rope_theta, or
 * rope_theta_swa for kind 1), with Llama 3's rescaling of the long wavelengths when
 * configured, YaRN's blend of f / factor and f by a ramp over p (kind 0), times the
 * linear scale (kind 0), divided by the per-pair factors. */
void kvg_rope_frequencies(const kvg_model_config *cfg, int kind, float *f);
/* What cos and sin are multiplied by: the attention factor (LongRoPE's, or YaRN's as
 * the loader set it), times YaRN's 1 + 0.1 ln(factor); 1 when none. */
float kvg_rope_mscale(const kvg_model_config *cfg);
/* The attention factor a YaRN model's loader stores (cfg.rope_attn_factor), as llama.cpp
 * computes it from the factor, the file's yarn_log_multiplier (0: none) and
 * attn_factor (1: none): kvg_rope_mscale then gives llama.cpp's cos/sin magnitude,
 * 1 + 0.1 ln(factor) without a log multiplier (gpt-oss), 1 with a multiplier of 1
 * (Ministral 3). */
float kvg_rope_yarn_attn_factor(float factor, float log_mul, float attn_factor);
/* The query temperature of a row at `pos` (cfg.attn_temp_scale != 0): what its rotated
 * q is multiplied by. */
float kvg_rope_q_scale(const kvg_model_config *cfg, int32_t pos);

/* cs[2p], cs[2p+1] = mscale cos, mscale sin of pos * inv_freq[p] for p < half. */
void kvg_rope_cos_sin(const float *inv_freq, int half, int32_t pos, float mscale, float *cs);

#endif
