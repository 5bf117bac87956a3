/* For tests only: the writing side of the block formats (quant.c): reference
 * quantizers, GGML type ids, names and the F16 narrowing, with which the unit tests and
 * the benchmarks' model writers make quantized files. Not the library's API: nothing
 * outside t/ calls these (the engine only reads the formats). */
#ifndef KVG_QUANT_TESTING_H
#define KVG_QUANT_TESTING_H

#include "quant.h"

/* "Q8_0", "Q4_0", "Q4_K", "Q6_K", "MXFP4"; "?" outside the enum. */
const char *kvg_quant_name(kvg_qtype t);

/* Reference quantizers (deterministic, round to nearest; not tuned for quality):
 * n % block == 0, dst holds n / block blocks. 0, or -1 for a bad n or type. Q4_K and
 * Q6_K pick their sub-block scales with a simple rule (see quant.c), not llama.cpp's
 * search. */
int kvg_quant_row(kvg_qtype t, const float *src, void *dst, int64_t n);

/* The GGML tensor type id of t (kvg_quant_from_ggml's inverse); UINT32_MAX outside
 * the enum. */
uint32_t kvg_quant_ggml_type(kvg_qtype t);

/* IEEE float to half, rounding to nearest even. */
uint16_t kvg_quant_f32_to_f16(float f);

#endif
