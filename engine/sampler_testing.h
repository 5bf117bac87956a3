/* For tests only: the sampler's random numbers and its greedy choice alone
 * (sampler.c), which the unit tests check and the benchmarks use. Not the engine's
 * API: nothing outside t/ calls these (the engine samples through kvg_sample). */
#ifndef KVG_SAMPLER_TESTING_H
#define KVG_SAMPLER_TESTING_H

#include "sampler.h"

/* Philox4x32-10: 4 x 32 random bits for (key, counter). */
void kvg_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The uniform number in [0, 1) (53 bits) used for (seed, sample_index, position). */
double kvg_sample_uniform(uint64_t seed, uint64_t sample_index, uint64_t position);

/* Greedy choice alone: highest logit, ties to the lowest id. */
int32_t kvg_argmax(const float *logits, int vocab);

#endif
