/* For tests only: the bytes of one block of a dtype and the BF16 narrowing
 * (model_common.c), which the unit tests check against their own writers' and a
 * benchmark's model writer uses. Not the engine's API: nothing outside t/ calls these
 * (the engine reads rows through kvg_dtype_row_bytes, and never narrows to BF16 but
 * in a synthetic model's own vectorised copy, model_synthetic.c). */
#ifndef KVG_MODEL_TESTING_H
#define KVG_MODEL_TESTING_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

size_t kvg_dtype_block_bytes(kvg_dtype t);               /* 4, 2, 2, 34, 18, 144, 210 */
/* F32 to BF16, round to nearest even; NaN stays a (quiet) NaN. */
uint16_t kvgm_f32_to_bf16(float f);

#endif
