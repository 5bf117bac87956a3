/* The sampler: Philox4x32-10 known answers, the uniform draw as a pure function of
 * (seed, sample index, position), greedy ties, temperature / top-k / top-p behaviour
 * on crafted logits, logprobs, and independence from whatever else is sampled. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tap.h"
#include "sampler.h"
#include "sampler_testing.h"

static void test_philox(void)
{
    /* Random123 tests/kat_vectors, "philox4x32 10": ctr[4] key[2] -> out[4]. */
    static const uint32_t kat[3][10] = {
        { 0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 },
        { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
          0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd },
        { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
          0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 },
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        kvg_philox4x32(kat[i], kat[i] + 4, out);
        ok(memcmp(out, kat[i] + 6, sizeof out) == 0, "philox4x32-10 known answer %d", i);
    }
}

static void test_uniform(void)
{
    double sum = 0.0, lo = 1.0, hi = 0.0;
    int n = 20000, distinct = 1;
    for (int i = 0; i < n; i++) {
        double u = kvg_sample_uniform(42, 0, (uint64_t)i);
        sum += u;
        if (u < lo)
            lo = u;
        if (u > hi)
            hi = u;
    }
    ok(lo >= 0.0 && hi < 1.0, "uniform in [0, 1)");
    ok(fabs(sum / n - 0.5) < 0.01, "uniform mean %.4f ~ 0.5", sum / n);
    ok(kvg_sample_uniform(1, 2, 3) == kvg_sample_uniform(1, 2, 3), "same (seed, index, position): same draw");
    distinct &= kvg_sample_uniform(1, 2, 3) != kvg_sample_uniform(2, 2, 3);
    distinct &= kvg_sample_uniform(1, 2, 3) != kvg_sample_uniform(1, 3, 3);
    distinct &= kvg_sample_uniform(1, 2, 3) != kvg_sample_uniform(1, 2, 4);
    distinct &= kvg_sample_uniform(1ull << 40, 0, 0) != kvg_sample_uniform(0, 0, 0);
    distinct &= kvg_sample_uniform(0, 1ull << 40, 0) != kvg_sample_uniform(0, 0, 0);
    distinct &= kvg_sample_uniform(0, 0, 1ull << 40) != kvg_sample_uniform(0, 0, 0);
    ok(distinct, "seed, index and position (all 64 bits) each change the draw");
}

static void test_greedy(void)
{
    kvg_sampler s = { 0 };
    kvg_sampler_params p = { 0.0f, 0, 1.0f, 0 };
    float l[6] = { 1.0f, 3.0f, -2.0f, 3.0f, NAN, 2.0f };
    float lp;
    double lse = 0.0;

    is_int(kvg_argmax(l, 6), 1, "argmax: tie between 1 and 3 goes to the lowest id");
    is_int(kvg_sample(&s, &p, l, 6, 0, 0, &lp), 1, "greedy sample = argmax");
    for (int i = 0; i < 6; i++)
        if (!isnan(l[i]))
            lse += exp(l[i]);
    ok(fabs(lp - (3.0 - log(lse))) < 1e-6, "greedy logprob is the log-softmax of the raw logits (%g)", lp);
    {
        float n[3] = { NAN, -1.0f, NAN };
        is_int(kvg_argmax(n, 3), 1, "NaN never wins");
        float m[3] = { -INFINITY, -INFINITY, -INFINITY };
        is_int(kvg_sample(&s, &p, m, 3, 0, 0, &lp), 0, "all -inf: id 0");
        ok(isinf(lp) && lp < 0, "  with logprob -inf");
    }
    is_int(kvg_argmax(l, 0), -1, "empty vocabulary: -1");
    is_int(kvg_sample(&s, &p, l, 0, 0, 0, &lp), -1, "sample with empty vocabulary: -1");
    kvg_sampler_free(&s);
}

/* Frequencies of `n` draws at positions 0..n-1 (seed fixed). */
static void freqs(kvg_sampler *s, const kvg_sampler_params *p, const float *l, int V, int n, double *f)
{
    int count[16] = { 0 };
    for (int i = 0; i < n; i++) {
        int32_t t = kvg_sample(s, p, l, V, 0, (uint64_t)i, NULL);
        if (t >= 0 && t < V)
            count[t]++;
    }
    for (int i = 0; i < V; i++)
        f[i] = (double)count[i] / n;
}

static void test_distributions(void)
{
    kvg_sampler s = { 0 };
    float l[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) };
    double f[5];
    int n = 20000;
    kvg_sampler_params p = { 1.0f, 0, 1.0f, 99 };

    freqs(&s, &p, l, 4, n, f);
    ok(fabs(f[0] - 0.5) < 0.015 && fabs(f[1] - 0.3) < 0.015 && fabs(f[2] - 0.15) < 0.015 &&
       fabs(f[3] - 0.05) < 0.01, "T=1 follows softmax: %.3f %.3f %.3f %.3f", f[0], f[1], f[2], f[3]);

    p.temperature = 0.5f;   /* p ~ q^2: .25 .09 .0225 .0025 -> normalised */
    freqs(&s, &p, l, 4, n, f);
    ok(fabs(f[0] - 0.25 / 0.365) < 0.015 && fabs(f[1] - 0.09 / 0.365) < 0.015,
       "T=0.5 sharpens: %.3f %.3f %.3f %.3f", f[0], f[1], f[2], f[3]);

    p.temperature = 1.0f;
    p.top_k = 2;
    freqs(&s, &p, l, 4, n, f);
    ok(f[2] == 0.0 && f[3] == 0.0, "top-k 2: only the two best");
    ok(fabs(f[0] - 0.625) < 0.015, "top-k 2 renormalises: %.3f %.3f", f[0], f[1]);

    p.top_k = 0;
    p.top_p = 0.7f;         /* 0.5 < 0.7 <= 0.8: tokens 0 and 1 */
    freqs(&s, &p, l, 4, n, f);
    ok(f[2] == 0.0 && f[3] == 0.0 && f[0] > 0.55 && f[1] > 0.3, "top-p 0.7: the nucleus {0, 1} (%.3f %.3f)",
       f[0], f[1]);
    p.top_p = 0.45f;
    freqs(&s, &p, l, 4, n, f);
    ok(f[0] == 1.0, "top-p 0.45: only the best token");
    p.top_p = 0.9f;         /* 0.5+0.3+0.15 = 0.95 >= 0.9 */
    freqs(&s, &p, l, 4, n, f);
    ok(f[3] == 0.0 && f[2] > 0.1, "top-p 0.9: three tokens (%.3f %.3f %.3f)", f[0], f[1], f[2]);
    p.top_k = 1;
    freqs(&s, &p, l, 4, 200, f);
    ok(f[0] == 1.0, "top-k 1 is greedy");

    {
        /* Ties: the total order keeps the lower ids. */
        float t[5] = { 1.0f, 2.0f, 2.0f, 2.0f, 2.0f };
        kvg_sampler_params q = { 1.0f, 2, 1.0f, 5 };
        freqs(&s, &q, t, 5, 2000, f);
        ok(f[0] == 0.0 && f[3] == 0.0 && f[4] == 0.0 && f[1] > 0.4 && f[2] > 0.4,
           "top-k 2 among four tied logits keeps ids 1 and 2 (%.3f %.3f)", f[1], f[2]);
        q.top_k = 0;
        q.top_p = 0.3f;     /* each tied token has 0.247 */
        freqs(&s, &q, t, 5, 2000, f);
        ok(f[1] > 0.4 && f[2] > 0.4 && f[1] + f[2] > 0.999, "top-p among ties keeps the lowest ids");
    }
    {
        /* p below 1/V: the (1-p)/(V-1) shortcut must still keep the best token. */
        float e2[2] = { 0.0f, 0.0f };
        kvg_sampler_params q = { 1.0f, 0, 0.1f, 5 };
        freqs(&s, &q, e2, 2, 500, f);
        ok(f[0] == 1.0, "top-p 0.1 over two equal tokens: the lower id");
        float one = 3.0f;
        q.top_p = 0.5f;
        is_int(kvg_sample(&s, &q, &one, 1, 0, 0, NULL), 0, "vocabulary of one: id 0");
    }
    {
        float m[4] = { 0.0f, -INFINITY, 0.0f, NAN };
        kvg_sampler_params q = { 1.0f, 0, 1.0f, 5 };
        freqs(&s, &q, m, 4, 2000, f);
        ok(f[1] == 0.0 && f[3] == 0.0 && fabs(f[0] - 0.5) < 0.05, "-inf and NaN logits are never drawn");
    }
    kvg_sampler_free(&s);
}

/* A bigger vocabulary: the top-p shortcut (filtering by (1-p)/(V-1)) must give the
 * exact nucleus; logprobs are over the whole vocabulary at temperature T. */
static void test_nucleus_large(void)
{
    enum { V = 3000 };
    static float l[V];
    static int order[V];
    kvg_sampler s = { 0 };
    uint64_t st = 7;
    int bad_nucleus = 0, bad_lp = 0;
    kvg_sampler_params p = { 0.8f, 0, 0.9f, 1234 };
    double mx = -1e30, tot = 0.0, acc = 0.0;
    int nucleus;

    for (int i = 0; i < V; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 8.0);
        if (i % 97 == 0)
            l[i] = l[0];     /* some exact ties */
    }
    /* Brute force: order by (logit desc, id asc), nucleus at T. */
    for (int i = 0; i < V; i++)
        order[i] = i;
    for (int i = 1; i < V; i++) {
        int x = order[i], j = i - 1;
        while (j >= 0 && (l[order[j]] < l[x] || (l[order[j]] == l[x] && order[j] > x))) {
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = x;
    }
    for (int i = 0; i < V; i++)
        if (l[i] / 0.8 > mx)
            mx = l[i] / 0.8;
    for (int i = 0; i < V; i++)
        tot += exp(l[i] / 0.8 - mx);
    for (nucleus = 0; nucleus < V; nucleus++) {
        acc += exp(l[order[nucleus]] / 0.8 - mx);
        if (acc >= 0.9 * tot)
            break;
    }
    nucleus++;
    for (int i = 0; i < 3000; i++) {
        float lp;
        int32_t t = kvg_sample(&s, &p, l, V, 3, (uint64_t)i, &lp);
        int rank = -1;
        for (int r = 0; r < V; r++)
            if (order[r] == t)
                rank = r;
        if (rank < 0 || rank >= nucleus)
            bad_nucleus++;
        if (fabs(lp - (l[t] / 0.8 - mx - log(tot))) > 1e-4)
            bad_lp++;
    }
    ok(bad_nucleus == 0, "3000 draws stay inside the brute-force nucleus of %d tokens", nucleus);
    ok(bad_lp == 0, "logprob = log-softmax(logits/T) over the full vocabulary at the chosen token");
    kvg_sampler_free(&s);
}

/* A request's draws depend only on its own (seed, index, position) and logits: the
 * same sequence of calls interleaved with other requests' calls gives the same tokens. */
static void test_independence(void)
{
    kvg_sampler s = { 0 }, s2 = { 0 };
    float l[50];
    int32_t alone[64], mixed[64];
    float lpa[64], lpm[64];
    kvg_sampler_params a = { 1.0f, 20, 0.95f, 777 }, b = { 0.7f, 0, 0.8f, 31337 };
    for (int i = 0; i < 50; i++)
        l[i] = sinf((float)i) * 3.0f;
    for (int i = 0; i < 64; i++)
        alone[i] = kvg_sample(&s, &a, l, 50, 1, (uint64_t)(100 + i), &lpa[i]);
    for (int i = 0; i < 64; i++) {
        for (int k = 0; k < i % 5; k++)
            kvg_sample(&s, &b, l, 50, (uint64_t)k, (uint64_t)(i * 3 + k), NULL);
        mixed[i] = kvg_sample(i % 2 ? &s : &s2, &a, l, 50, 1, (uint64_t)(100 + i), &lpm[i]);
    }
    ok(memcmp(alone, mixed, sizeof alone) == 0 && memcmp(lpa, lpm, sizeof lpa) == 0,
       "same tokens and logprobs when interleaved with another request, on another sampler");
    {
        int differ = 0;
        for (int i = 0; i < 64; i++)
            differ += kvg_sample(&s, &a, l, 50, 2, (uint64_t)(100 + i), NULL) != alone[i];
        ok(differ > 10, "another sample index gives another stream (%d of 64 differ)", differ);
    }
    kvg_sampler_free(&s);
    kvg_sampler_free(&s2);
}

static void test_params(void)
{
    char err[256];
    kvg_sampler_params p = { 0.7f, 0, 0.9f, 0 };
    ok(kvg_sampler_params_check(&p, err, sizeof err) == 0, "valid parameters");
    p.temperature = -0.1f;
    ok(kvg_sampler_params_check(&p, err, sizeof err) == -1 && strstr(err, "temperature"), "negative temperature: %s", err);
    p.temperature = NAN;
    ok(kvg_sampler_params_check(&p, err, sizeof err) == -1, "NaN temperature refused");
    p.temperature = INFINITY;
    ok(kvg_sampler_params_check(&p, err, sizeof err) == -1, "infinite temperature refused");
    p.temperature = 1.0f;
    p.top_k = -1;
    ok(kvg_sampler_params_check(&p, err, sizeof err) == -1 && strstr(err, "top_k"), "negative top_k: %s", err);
    p.top_k = 0;
    p.top_p = NAN;
    ok(kvg_sampler_params_check(&p, err, sizeof err) == -1 && strstr(err, "top_p"), "NaN top_p: %s", err);
}

int main(void)
{
    test_philox();
    test_uniform();
    test_greedy();
    test_distributions();
    test_nucleus_large();
    test_independence();
    test_params();
    return done_testing();
}
