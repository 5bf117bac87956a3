/* RoPE angles (see rope.h). */
#include "rope.h"

#include <math.h>

int kvg_rope_n_kinds(const kvg_model *m)
{
    if (m->cfg.rope_theta_swa > 0.0f)
        for (int l = 0; l < m->cfg.n_layers; l++)
            if (m->layers[l].sliding)
                return 2;
    return 1;
}

int kvg_rope_kind(const kvg_model *m, int layer)
{
    return m->cfg.rope_theta_swa > 0.0f && m->layers[layer].sliding ? 1 : 0;
}

/* llama2.c computes the frequency in float the same way. */
void kvg_rope_frequencies(const kvg_model_config *cfg, int kind, float *f)
{
    int hd = kvg_rope_dims(cfg);
    float theta = kind == 1 ? cfg->rope_theta_swa : cfg->rope_theta;
    /* llama.cpp's per-layer scale: the window layers of a model with their own base
     * are not scaled (Gemma 3). */
    float scale = kind == 0 && cfg->rope_freq_scale > 0.0f ? cfg->rope_freq_scale : 1.0f;
    for (int p = 0; p < hd / 2; p++) {
        float freq = 1.0f / powf(theta, (float)(2 * p) / (float)hd);
        if (cfg->rope_scale_factor > 0.0f) {
            float factor = cfg->rope_scale_factor;
            float lo = cfg->rope_low_freq_factor, hi = cfg->rope_high_freq_factor;
            float old = (float)cfg->rope_orig_max_pos;
            float low_wavelen = old / lo, high_wavelen = old / hi;
            float wavelen = 2.0f * (float)M_PI / freq;
            if (wavelen > low_wavelen) {
                freq = freq / factor;
            } else if (!(wavelen < high_wavelen)) {
                float smooth = (old / wavelen - lo) / (hi - lo);
                freq = (1.0f - smooth) * freq / factor + smooth * freq;
            }
        }
        if (scale != 1.0f)
            freq *= scale;
        if (cfg->rope_freq_factors)
            freq /= cfg->rope_freq_factors[p];
        f[p] = freq;
    }
}

float kvg_rope_mscale(const kvg_model_config *cfg)
{
    return cfg->rope_attn_factor > 0.0f ? cfg->rope_attn_factor : 1.0f;
}

void kvg_rope_cos_sin(const float *inv_freq, int half, int32_t pos, float mscale, float *cs)
{
    float fp = (float)pos;
    for (int p = 0; p < half; p++) {
        float val = fp * inv_freq[p];
        cs[2 * p] = cosf(val) * mscale;
        cs[2 * p + 1] = sinf(val) * mscale;
    }
}

const char *kvg_rope_config_error(const kvg_model_config *cfg)
{
    if (cfg->rope_scale_factor > 0.0f &&
        (cfg->rope_orig_max_pos <= 0 || cfg->rope_low_freq_factor <= 0.0f ||
         cfg->rope_high_freq_factor <= cfg->rope_low_freq_factor))
        return "inconsistent llama3 rope scaling parameters";
    if (cfg->rope_dims < 0 || cfg->rope_dims > cfg->head_dim || cfg->rope_dims % 2 != 0)
        return "the rotated dimensions of a head are not an even number up to head_dim";
    for (int p = 0; cfg->rope_freq_factors && p < kvg_rope_dims(cfg) / 2; p++)
        if (!(cfg->rope_freq_factors[p] > 0.0f) || !isfinite(cfg->rope_freq_factors[p]))
            return "a RoPE frequency factor is not a positive number";
    return NULL;
}
