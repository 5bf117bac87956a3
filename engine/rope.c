/* RoPE angles (see rope.h). */
#include "rope.h"

#include <math.h>

/* llama2.c computes the frequency in float the same way. */
void kvg_rope_frequencies(const kvg_model_config *cfg, float *f)
{
    int hd = cfg->head_dim;
    for (int p = 0; p < hd / 2; p++) {
        float freq = 1.0f / powf(cfg->rope_theta, (float)(2 * p) / (float)hd);
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
        f[p] = freq;
    }
}

void kvg_rope_cos_sin(const float *inv_freq, int half, int32_t pos, float *cs)
{
    float fp = (float)pos;
    for (int p = 0; p < half; p++) {
        float val = fp * inv_freq[p];
        cs[2 * p] = cosf(val);
        cs[2 * p + 1] = sinf(val);
    }
}

const char *kvg_rope_config_error(const kvg_model_config *cfg)
{
    if (cfg->rope_scale_factor > 0.0f &&
        (cfg->rope_orig_max_pos <= 0 || cfg->rope_low_freq_factor <= 0.0f ||
         cfg->rope_high_freq_factor <= cfg->rope_low_freq_factor))
        return "inconsistent llama3 rope scaling parameters";
    return NULL;
}
