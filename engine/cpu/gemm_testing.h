/* For tests only: the GEMM run with an explicit ISA level, the levels this CPU has, and
 * the bytes a workspace holds (gemm.c), which the unit tests compare and the benchmarks
 * measure. Not the CPU backend's API: nothing outside t/ calls these (the backend
 * multiplies through kvg_gemm, with the level chosen once per process). */
#ifndef KVG_GEMM_TESTING_H
#define KVG_GEMM_TESTING_H

#include "cpu/gemm.h"
#include "cpu/gemm_kernels.h"

/* Whether this CPU (and OS) can run the ISA's kernel. */
int kvg_gemm_isa_supported(kvg_gemm_isa_id isa);
const char *kvg_gemm_isa_name(kvg_gemm_isa_id isa);
/* kvg_gemm with an explicit ISA; -1 also when this CPU lacks it. */
int kvg_gemm_with_isa(kvg_gemm_isa_id isa, kvg_threadpool *tp, kvg_gemm_ws *ws, const float *x,
                      int M, int K, const kvg_tensor *w, const float *bias, float *y);
/* kvg_gemm_multi with an explicit ISA. */
int kvg_gemm_multi_with_isa(kvg_gemm_isa_id isa, kvg_threadpool *tp, kvg_gemm_ws *ws,
                            const float *x, int M, int K, int n, const kvg_tensor *const *w,
                            const float *const *bias, float *const *y);

/* Bytes ws holds now (its shared X buffers and every thread's scratch). */
size_t kvg_gemm_ws_bytes(const kvg_gemm_ws *ws);

#endif
