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

/* YaRN's correction dimension of a rotation count n_rot over the original context:
 * the pair index whose wavelength fits n_rot times into it (ggml's
 * ggml_rope_yarn_corr_dim, the same float operations). */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base)
{
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

/* The share of pair p's original ("extrapolated") frequency under YaRN: 1 below the
 * fast correction dimension (high-frequency pairs keep theirs), 0 above the slow one
 * (low-frequency pairs are interpolated), linear between; ggml's rope_yarn_corr_dims
 * (floor, ceil, clamped to [0, n_dims - 1]) and rope_yarn_ramp, with llama.cpp's
 * ext_factor of 1 for YaRN. */
static float yarn_ramp(const kvg_model_config *cfg, int n_dims, float theta, int p)
{
    float lo = floorf(yarn_corr_dim(n_dims, cfg->rope_yarn_orig_ctx, cfg->rope_yarn_beta_fast, theta));
    float hi = ceilf(yarn_corr_dim(n_dims, cfg->rope_yarn_orig_ctx, cfg->rope_yarn_beta_slow, theta));
    lo = lo > 0.0f ? lo : 0.0f;
    hi = hi < (float)(n_dims - 1) ? hi : (float)(n_dims - 1);
    float y = ((float)p - lo) / (hi - lo > 0.001f ? hi - lo : 0.001f);
    return 1.0f - (y < 0.0f ? 0.0f : y > 1.0f ? 1.0f : y);
}

/* llama2.c computes the frequency in float the same way. YaRN depends on the pair
 * only, so ggml's per-angle blend pos f s (1 - r) + pos f r (s = 1 / factor, r the
 * ramp) is the frequency f s (1 - r) + f r times the position. */
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
        if (kind == 0 && cfg->rope_yarn_factor > 0.0f) {
            float r = yarn_ramp(cfg, hd, theta, p);
            freq = freq * (1.0f / cfg->rope_yarn_factor) * (1.0f - r) + freq * r;
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
    float m = cfg->rope_attn_factor > 0.0f ? cfg->rope_attn_factor : 1.0f;
    /* ggml's rope_yarn: YaRN's magnitude correction, on top of the attention factor */
    if (cfg->rope_yarn_factor > 0.0f)
        m *= 1.0f + 0.1f * logf(1.0f / (1.0f / cfg->rope_yarn_factor));
    return m;
}

/* llama.cpp's llama_context: get_mscale(s, m) = 1 + 0.1 m ln(s) (1 for s <= 1); with a
 * log multiplier the factor is get_mscale(factor, 1) / get_mscale(factor, log_mul), else
 * get_mscale(factor, 1); then divided by the 1 + 0.1 ln(factor) that rope_yarn
 * multiplies back (kvg_rope_mscale), and times the file's attention factor. */
static float yarn_get_mscale(float scale, float m)
{
    return scale <= 1.0f ? 1.0f : 0.1f * m * logf(scale) + 1.0f;
}

float kvg_rope_yarn_attn_factor(float file_factor, float log_mul, float attn_factor)
{
    float factor = 1.0f / (1.0f / file_factor);   /* llama.cpp's, from its freq_scale */
    float a = log_mul != 0.0f ? yarn_get_mscale(factor, 1.0f) / yarn_get_mscale(factor, log_mul)
                              : yarn_get_mscale(factor, 1.0f);
    a *= 1.0f / (1.0f + 0.1f * logf(factor));
    return a * attn_factor;
}

float kvg_rope_q_scale(const kvg_model_config *cfg, int32_t pos)
{
    /* as llama.cpp's llm_graph_input_attn_temp: float position and floor, double log */
    float fl = floorf(((float)pos + cfg->attn_temp_offset) / (float)cfg->attn_temp_floor);
    return (float)(log((double)fl + 1.0) * cfg->attn_temp_scale + 1.0);
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
    if (cfg->rope_yarn_factor > 0.0f
        && (cfg->rope_yarn_orig_ctx <= 0 || !(cfg->rope_yarn_beta_fast > 0.0f) || !(cfg->rope_yarn_beta_slow > 0.0f)))
        return "inconsistent YaRN rope scaling parameters";
    if (cfg->attn_temp_scale != 0.0f && cfg->attn_temp_floor <= 0)
        return "a query temperature without its floor scale";
    if (cfg->rope_dims < 0 || cfg->rope_dims > cfg->head_dim || cfg->rope_dims % 2 != 0)
        return "the rotated dimensions of a head are not an even number up to head_dim";
    for (int p = 0; cfg->rope_freq_factors && p < kvg_rope_dims(cfg) / 2; p++)
        if (!(cfg->rope_freq_factors[p] > 0.0f) || !isfinite(cfg->rope_freq_factors[p]))
            return "a RoPE frequency factor is not a positive number";
    return NULL;
}
