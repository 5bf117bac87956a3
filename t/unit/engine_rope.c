/* RoPE angles (engine/rope.c) against hand computations from the formulas, in double:
 * YaRN's per-pair frequencies and magnitude (as ggml's rope_yarn and llama.cpp's context
 * compute them), and Llama 4's query temperature (llama.cpp's llm_graph_input_attn_temp). */
#include <math.h>
#include <string.h>

#include "tap.h"
#include "rope.h"

/* YaRN's frequency of pair p, from the YaRN paper's definitions as ggml implements them:
 * the correction dimension of beta rotations over the original context,
 *   d(beta) = n ln(orig / (2 pi beta)) / (2 ln theta),
 * lo = max(0, floor(d(beta_fast))), hi = min(n - 1, ceil(d(beta_slow))), the ramp
 * r = 1 - clamp((p - lo) / max(0.001, hi - lo), 0, 1), and f r + (f / factor) (1 - r). */
static double yarn_freq(int n, double theta, double factor, int orig, double bf, double bs, int p)
{
    double d_fast = n * log(orig / (2 * M_PI * bf)) / (2 * log(theta));
    double d_slow = n * log(orig / (2 * M_PI * bs)) / (2 * log(theta));
    double lo = fmax(0.0, floor(d_fast)), hi = fmin(n - 1, ceil(d_slow));
    double r = 1.0 - fmin(1.0, fmax(0.0, (p - lo) / fmax(0.001, hi - lo)));
    double f = pow(theta, -2.0 * p / n);
    return f * r + f / factor * (1.0 - r);
}

static void check_yarn(const char *name, int hd, float theta, float factor, int orig, float bf, float bs)
{
    kvg_model_config c;
    float f[256];
    double worst = 0.0;
    int n_orig = 0, n_interp = 0;
    memset(&c, 0, sizeof c);
    c.head_dim = hd;
    c.rope_theta = theta;
    c.rope_yarn_factor = factor;
    c.rope_yarn_orig_ctx = orig;
    c.rope_yarn_beta_fast = bf;
    c.rope_yarn_beta_slow = bs;
    ok(kvg_rope_config_error(&c) == NULL, "%s: a consistent YaRN configuration", name);
    kvg_rope_frequencies(&c, 0, f);
    for (int p = 0; p < hd / 2; p++) {
        double want = yarn_freq(hd, theta, factor, orig, bf, bs, p);
        double base = pow(theta, -2.0 * p / hd);
        worst = fmax(worst, fabs(f[p] - want) / want);
        n_orig += fabs(want - base) < 1e-9 * base;
        n_interp += fabs(want - base / factor) < 1e-9 * base;
    }
    ok(worst < 2e-6, "%s: YaRN frequencies = the formula's (relative error %.2g; %d pairs keep their "
       "frequency, %d are interpolated, %d blend)", name, worst, n_orig, n_interp, hd / 2 - n_orig - n_interp);
    ok(n_orig > 0 && n_interp > 0, "%s: the ramp separates the fast pairs from the slow ones", name);
}

int main(void)
{
    kvg_model_config c;

    /* gpt-oss-20b / 120b: head 64, base 150000, factor 32 over 4096 positions, betas 32/1 */
    check_yarn("gpt-oss", 64, 150000.0f, 32.0f, 4096, 32.0f, 1.0f);
    /* the tiny test files (t/bench/synth_gguf.c): factor 4 over 64 positions */
    check_yarn("synth gpt-oss", 64, 150000.0f, 4.0f, 64, 32.0f, 1.0f);
    check_yarn("synth mistral3", 64, 1000000.0f, 4.0f, 64, 32.0f, 1.0f);
    /* Ministral 3 8B: head 128, base 1e9, factor 16 over 16384 */
    check_yarn("Ministral 3", 128, 1e9f, 16.0f, 16384, 32.0f, 1.0f);

    /* The magnitude on cos/sin: llama.cpp's yarn_attn_factor times ggml's 1 + 0.1 ln s. */
    memset(&c, 0, sizeof c);
    c.rope_yarn_factor = 32.0f;
    c.rope_attn_factor = kvg_rope_yarn_attn_factor(32.0f, 0.0f, 1.0f);
    ok(fabs(kvg_rope_mscale(&c) - (1.0 + 0.1 * log(32.0))) < 1e-6,
       "YaRN without a log multiplier (gpt-oss): cos/sin times 1 + 0.1 ln(factor) (%.7f)", kvg_rope_mscale(&c));
    c.rope_attn_factor = kvg_rope_yarn_attn_factor(32.0f, 1.0f, 1.0f);
    ok(fabs(kvg_rope_mscale(&c) - 1.0) < 1e-6, "YaRN with log multiplier 1 (Ministral 3): cos/sin unscaled (%.7f)",
       kvg_rope_mscale(&c));
    c.rope_attn_factor = kvg_rope_yarn_attn_factor(32.0f, 0.707f, 1.5f);
    ok(fabs(kvg_rope_mscale(&c) - 1.5 * (1.0 + 0.1 * log(32.0)) / (1.0 + 0.0707 * log(32.0))) < 1e-6,
       "YaRN with log multiplier 0.707 and attn_factor 1.5: 1.5 (1 + 0.1 ln s) / (1 + 0.0707 ln s) (%.7f)",
       kvg_rope_mscale(&c));
    c.rope_yarn_orig_ctx = 0;
    c.rope_yarn_beta_fast = 32.0f;
    c.rope_yarn_beta_slow = 1.0f;
    c.head_dim = 64;
    ok(kvg_rope_config_error(&c) != NULL, "YaRN without an original context: refused (%s)",
       kvg_rope_config_error(&c));

    /* Llama 4's query temperature as Ministral 3 has it: scale 0.1, floor 16384, offset 0:
     * 1 + 0.1 ln(floor(pos / 16384) + 1) */
    memset(&c, 0, sizeof c);
    c.head_dim = 64;
    c.attn_temp_scale = 0.1f;
    c.attn_temp_floor = 16384;
    {
        static const int32_t pos[] = { 0, 1, 16383, 16384, 32767, 32768, 40000, 262143 };
        double worst = 0.0;
        for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
            double want = 1.0 + 0.1 * log(floor(pos[i] / 16384.0) + 1.0);
            worst = fmax(worst, fabs(kvg_rope_q_scale(&c, pos[i]) - want));
        }
        ok(worst < 1e-7, "query temperature = 1 + 0.1 ln(floor(pos / 16384) + 1) (error %.2g)", worst);
        ok(kvg_rope_q_scale(&c, 16383) == 1.0f && kvg_rope_q_scale(&c, 16384) > 1.0f,
           "the temperature steps at the floor scale, not before");
    }
    c.attn_temp_offset = 1.0f;   /* Llama 4's offset: the step one position earlier */
    ok(kvg_rope_q_scale(&c, 16383) > 1.0f, "with offset 1 (Llama 4) it steps one position earlier");
    c.attn_temp_floor = 0;
    ok(kvg_rope_config_error(&c) != NULL, "a temperature without its floor: refused");
    return done_testing();
}
