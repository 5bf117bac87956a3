/* Token sampling: greedy, temperature, top-k, top-p, with a per-request seed.
 *
 * Every draw is a pure function of (logits, parameters, seed, sample index, position):
 * the uniform number comes from Philox4x32-10 keyed by the seed with the counter
 * (sample index, position), so a request's tokens never depend on what else was in
 * the batch, on the order requests were served or on cache state. `sample_index`
 * tells apart the n completions of one request (0..n-1); `position` is the position
 * of the token being chosen.
 *
 * Candidate order is a total order: logit descending, ties by lower id first. Greedy
 * (temperature 0) picks the highest logit, ties to the lowest id. NaN logits count as
 * -infinity.
 *
 * Logprob: the log-softmax of the temperature-scaled logits (logits / T) over the FULL
 * vocabulary, before top-k/top-p truncation, evaluated at the chosen token. For T == 0
 * it is the log-softmax of the raw logits (T = 1). That is the model's log-likelihood
 * of the token under the sampling temperature, comparable across requests whatever
 * their truncation settings (used to weight self-consistency votes). */
#ifndef KVG_SAMPLER_H
#define KVG_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvg_sampler_params {
    float temperature;           /* 0: greedy */
    int top_k;                   /* 0: off */
    float top_p;                 /* 1 (or >= 1, or <= 0): off */
    uint64_t seed;
} kvg_sampler_params;

/* Scratch for one sampler (one thread at a time), sized to the vocabulary and
 * allocated on first use: a candidate array, and each token's exp(logit/T - max) from
 * the pass that sums them, which the later passes reuse instead of calling exp()
 * again (the same values, so the same choices). Zero-initialise; release with _free. */
typedef struct kvg_sampler {
    int cap;
    int32_t *ids;
    double *e;
} kvg_sampler;

void kvg_sampler_free(kvg_sampler *s);

/* Checks parameters; 0, or -1 with a message (negative temperature, NaN, top_k < 0,
 * top_p NaN). */
int kvg_sampler_params_check(const kvg_sampler_params *p, char *err, size_t err_len);

/* Chooses a token from logits[0..vocab). *logprob (if non-NULL) receives the chosen
 * token's logprob as described above. Returns the id, or -1 when vocab <= 0 or out of
 * memory. */
int32_t kvg_sample(kvg_sampler *s, const kvg_sampler_params *p, const float *logits, int vocab,
                   uint64_t sample_index, uint64_t position, float *logprob);

/* The greedy choice's margin: the highest logit minus the second highest (NaN counts as
 * -infinity; 0 for a tie, +infinity when vocab < 2). Rounding that moves every logit by
 * less than half of it cannot change the greedy choice: the tests comparing greedy
 * continuations across engines check it (kvgate-generate --top2-gap). */
double kvg_top2_gap(const float *logits, int vocab);

#endif
