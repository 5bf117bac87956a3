/* For tests only: which CUDA backend this build links (engine/cuda/backend_cuda.c or
 * engine/cuda/absent.c), which the emulated backend's test checks. Not the engine's
 * API: nothing outside t/ calls it (a command learns it from kvg_backend_cuda_new's
 * error). */
#ifndef KVG_BACKEND_TESTING_H
#define KVG_BACKEND_TESTING_H

#include "backend.h"

/* 1 when this build has the CUDA backend (real or emulated), 0 for the stub. */
int kvg_backend_cuda_built(void);

#endif
