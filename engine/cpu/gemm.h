/* Batch-invariant matrix multiplication for the CPU backend: Y[M][N] = X[M][K] W[N][K]^T
 * (+ bias), X and Y F32, W in F32, F16 or BF16 (converted on the fly).
 *
 * Batch invariance (see ../shared/notes/cpu-gemm-determinism.md): Y[m][n] depends only on
 * row m of X and row n of W -- never on M, on m's position in the batch, on the thread
 * count or on the ISA. Every output element is one fixed sequence of IEEE operations
 * (spelled out in cpu/gemm_kernels.h): 16 lanes, lane l an FMA chain over k = l, l+16,
 * ... (the K tail as zeros), one fixed tree over the lanes, then + bias. Small M
 * (decode) and large M (prefill: lane by lane over packed operands, like a BLAS kernel)
 * take different code paths with the same arithmetic. Threads split along N only.
 * Kernels: AVX-512, AVX2+FMA+F16C and portable C (fmaf), chosen once per process at
 * runtime; all three give the same bits.
 *
 * For callers:
 *  - Alignment: none required beyond the dtype's own (4 bytes F32, 2 F16/BF16); rows
 *    that start on 64-byte boundaries make decode (M < 8) faster.
 *  - x, w and y must not overlap; bias may be NULL. A shape that does not match the
 *    tensor (w->cols != K), an unsupported dtype or a NULL buffer is a caller bug:
 *    kvg_gemm returns -1 and leaves y alone (it never aborts).
 *  - BF16/F16 weights cost nothing extra: decode widens them in registers (and reads
 *    half the bytes of F32), prefill widens them while packing.
 *  - Threads: pass the backend's pool; tiny products (< 64k multiply-adds) run on the
 *    calling thread.
 *  - Memory: kvg_gemm never allocates. Prefill (M >= 8) packs its operands into a
 *    workspace the caller makes once (kvg_gemm_ws: a packed copy of X, about M*K*4
 *    bytes, plus a few hundred KiB per thread), as the activations are; Q8_0 and Q4_0
 *    products quantize X into it instead (about M*K*1.25 bytes). A product the
 *    workspace does not cover (ws NULL, too few rows or threads, K out of its range)
 *    takes the unpacked path instead, or quantizes X in slices on the stack: the same
 *    bits, only slower. */
#ifndef KVG_GEMM_H
#define KVG_GEMM_H

#include <stddef.h>
#include "model.h"
#include "cpu/threadpool.h"

/* Scratch for the packed path: one packed copy of X shared by the threads of a
 * product, and each thread's packed W block and partial sums. One product at a time
 * per workspace (a backend owns one, as it owns its pool). */
typedef struct kvg_gemm_ws kvg_gemm_ws;

/* Workspaces for pools of up to `threads` threads and products with inner dimension
 * K in [k_min, k_max]; the per-thread part is allocated here, once, sized for every
 * such K. The packed X copy starts empty (kvg_gemm_ws_reserve). NULL when out of
 * memory. */
kvg_gemm_ws *kvg_gemm_ws_new(int threads, int k_min, int k_max);
/* Grows the packed X copy to hold `rows` rows of k_max (never shrinks): then every
 * product with M <= rows runs packed. 0, or -1 when out of memory (the workspace is
 * unchanged and stays usable). */
int kvg_gemm_ws_reserve(kvg_gemm_ws *ws, int rows);
void kvg_gemm_ws_free(kvg_gemm_ws *ws);
/* Which products ws serves: float ones (W in F32, F16, BF16: packed X and per-thread
 * packing scratch) and int8 ones (Q8_0, Q4_0, Q4_K, Q6_K: quantized X); both, from
 * kvg_gemm_ws_new. It only narrows: a kind turned off frees its buffers and reserving
 * never grows them again, so a model of one kind holds none for the other. A product
 * of a kind turned off still runs as without a workspace: the same bits. */
void kvg_gemm_ws_kinds(kvg_gemm_ws *ws, int float_w, int int8_w);

/* Y = X W^T (+ bias if non-NULL, length N). x: M rows of K floats (row stride K),
 * y: M rows of N floats (row stride N). ws may be NULL (unpacked). 0, or -1 for a
 * call that breaks the rules above. */
int kvg_gemm(kvg_threadpool *tp, kvg_gemm_ws *ws, const float *x, int M, int K,
             const kvg_tensor *w, const float *bias, float *y);

/* Up to KVG_GEMM_MULTI_MAX products of the same X, y[i] = X w[i]^T (+ bias[i]; bias
 * may be NULL, or any entry of it), in ONE pool job: the output rows of all of them
 * are split together, so a layer's q, k, v (or gate, up) cost one synchronisation
 * point instead of three (two), and X is packed once. Every output is bit-identical
 * to kvg_gemm's for that product (the same kernels, the same canonical order; only
 * which thread computes a row changes). Weights of another type than F32, F16 or BF16,
 * or of mixed types, run as n kvg_gemm calls. 0, or -1 as kvg_gemm (then some y[i]
 * may have been written). */
#define KVG_GEMM_MULTI_MAX 4
int kvg_gemm_multi(kvg_threadpool *tp, kvg_gemm_ws *ws, const float *x, int M, int K, int n,
                   const kvg_tensor *const *w, const float *const *bias, float *const *y);

/* A copy of w in the layout its kernels stream fastest, for weights that are read
 * many times (a model's): Q8_0, Q4_0, Q4_K and Q6_K become the int8 kernels' layouts
 * (cpu/gemm_int8.h); F32, F16 and BF16 stay as they are but move to a 64-byte
 * boundary when they are not on one (a GGUF file aligns tensors to 32 bytes: in its
 * mapping each 64-byte load of W then spans two cache lines, and batch-1 decode read
 * F32 at 0.65-0.8x the speed). The products equal those on w bit for bit. 1: *out is
 * such a copy (64-byte aligned; release it with kvg_gemm_prepared_free); 0: w gains
 * nothing from one, *out = *w; -1: out of memory or not a matrix kvg_gemm takes. The
 * copying runs on the pool (tp may be NULL). */
int kvg_gemm_prepare(kvg_threadpool *tp, const kvg_tensor *w, kvg_tensor *out);
/* Frees a copy kvg_gemm_prepare made (only where it returned 1). */
void kvg_gemm_prepared_free(kvg_tensor *t);

/* "avx512", "avx2", "generic". KVG_GEMM_ISA=generic|avx2|avx512 in the environment
 * forces a lower level (for tests and benchmarks). */
const char *kvg_gemm_isa(void);

#endif
