/* GEMMs through cuBLASLt: y[M][N] = x[M][K] W^T (+ bias), W row-major [N][K] in BF16/F16.
 *
 * Column-major view (kernels/README.md, the design): D (N x M, ld N) = op(A) op(B) with
 * A = W as K x N (ld K) transposed and B = x as K x M (ld K); x is first rounded to W's
 * type (kvg_k_to_lowp; not when the kernel that wrote x left that copy in the scratch,
 * cuda_fuse.c), D is F32, compute 32F. An F32 weight (a MoE router, kept F32 as
 * the CPU keeps it) takes x as it is: a full-precision F32 GEMM (COMPUTE_32F, no TF32).
 * A bias is cuBLASLt's bias epilogue (D = acc + bias[i], the same float sum as adding it
 * after), so a shape is (N, K, type, bias or not): the epilogue is the descriptor's.
 *
 * Products of one input (q/k/v, gate/up: backend.h's matmul_n) whose weights were uploaded
 * as one [sum N][K] matrix (cuda_weights.c) run as one GEMM: x rounded once instead of n
 * times, one cuBLASLt call with the parts' biases as one epilogue vector, D [M][sum N] in a
 * scratch, then kvg_k_split_cols copies each part's columns into its own y[i]. A llama
 * layer's q/k/v is then 3 launches instead of 6 (qwen2, with biases: 9), gate/up 3 instead
 * of 4. The split is a copy of M x sum N floats; writing D straight into the y[i] would
 * need them to be one buffer with ld sum N, which backend.h's separate outputs are not (the
 * next kernels, rope and swiglu, read q/k and gate/up as [M][N_i] arrays). An output
 * element is the same dot product over K, in the same order, whichever rows of W are
 * beside its own, so the fused GEMM gives the separate GEMMs' bits wherever cuBLASLt's
 * reduction per output does not depend on N (the emulator's does not; on a GPU the pinned
 * algorithm of the fused shape is its own, and the engine always runs the fused one).
 *
 * Batch invariance (--batch-invariant on): at startup (kvg_cu_gemm_startup, before the
 * engine serves) every GEMM shape of the model gets one algorithm: the first of the
 * heuristic's for a decode-sized M (PIN_M) that, with split-K fixed at 1 and no workspace,
 * is valid for M = 1 and M = gemm_max_m; it is then used for every M, so a row's dot
 * products are computed by the same kernel with the same reduction over K whatever the
 * number of rows. Then a self-test per shape, on the shape's own weights and random
 * inputs: rows computed alone (M = 1) and among k rows (k = 2, 7, 64 and up to 512) must
 * have the same bits, else the engine refuses invariant mode at startup, naming the shape
 * (an algorithm whose order of summation depends on M, as a stream-K kernel's may, breaks
 * the promise silently otherwise). Off: the heuristic's choice for each (shape, M), cached,
 * shapes made at startup or at first use. */
#include "cuda_internal.h"
#include "errmsg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ALGOS 8
/* The M the pinned algorithms are chosen for: decode steps (a few to tens of rows) are
 * what the GPU runs most and where the kernel choice matters most (memory-bound, W read
 * once); a prefill's M runs with the same kernel, slower than its heuristic's but exact. */
#define PIN_M 16
/* The self-test's largest M: 512 rows, fewer when k rows of the shape's input or output
 * would pass this many bytes (the output's [k][vocab] of a 128k vocabulary: 130 rows).
 * The emulated cuBLASLt (kernels/emu) runs on the host at about 1 GMAC/s, where 512 rows
 * of a 32k vocabulary would add seconds to every backend's creation: there 64, past the
 * 8 columns from which its M-dependent test algorithm changes its order. */
#ifdef KVG_CUDA_EMU
#define TEST_MAX_M 64
#else
#define TEST_MAX_M 512
#endif
#define TEST_BYTES ((size_t)64 << 20)

typedef struct per_m {
    int M;
    cublasLtMatmulAlgo_t algo;
} per_m;

struct kvg_cu_gemm_shape {
    int N, K;
    kvg_kt dt;
    int bias;                    /* the descriptor's epilogue adds a bias */
    char what[64];               /* the first weight of the shape, for messages */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a;
    int pinned;                  /* algo valid */
    cublasLtMatmulAlgo_t algo;
    per_m *ms;                   /* --batch-invariant off */
    int n_ms, cap_ms;
};

static cudaDataType_t cuda_type(kvg_kt t)
{
    return t == KVG_KT_F16 ? CUDA_R_16F : t == KVG_KT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static const char *type_name(kvg_kt t)
{
    return t == KVG_KT_F16 ? "F16" : t == KVG_KT_BF16 ? "BF16" : "F32";
}

int kvg_cu_gemm_init(kvg_cuda *c, char *err, size_t err_len)
{
    cublasLtHandle_t h;
    cublasStatus_t st = cublasLtCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS) {
        kvg_set_err(err, err_len, "cuda: cublasLtCreate failed: %s (%s)", cublasLtGetStatusName(st),
                    cublasLtGetStatusString(st));
        return -1;
    }
    c->lt = h;
    if (c->gemm_max_m <= 0)
        c->gemm_max_m = 4096;
    return 0;
}

void kvg_cu_gemm_free(kvg_cuda *c)
{
    for (int i = 0; i < c->n_shapes; i++) {
        kvg_cu_gemm_shape *s = &c->shapes[i];
        if (s->a)
            cublasLtMatrixLayoutDestroy(s->a);
        if (s->desc)
            cublasLtMatmulDescDestroy(s->desc);
        free(s->ms);
    }
    free(c->shapes);
    c->shapes = NULL;
    c->n_shapes = c->cap_shapes = 0;
    if (c->lt)
        cublasLtDestroy((cublasLtHandle_t)c->lt);
    c->lt = NULL;
    if (c->lowp)
        cudaFree(c->lowp);
    c->lowp = NULL;
    c->lowp_bytes = 0;
    kvg_cu_lowp_clear(c);
    if (c->fused_out)
        cudaFree(c->fused_out);
    c->fused_out = NULL;
    c->fused_out_bytes = 0;
}

/* B (x, K x M) and D (y, N x M) layouts for one M. */
static cublasStatus_t layouts(const kvg_cu_gemm_shape *s, int M, cublasLtMatrixLayout_t *b,
                              cublasLtMatrixLayout_t *d)
{
    cublasStatus_t st = cublasLtMatrixLayoutCreate(b, cuda_type(s->dt), (uint64_t)s->K, (uint64_t)M, s->K);
    *d = NULL;
    if (st != CUBLAS_STATUS_SUCCESS) {
        *b = NULL;
        return st;
    }
    st = cublasLtMatrixLayoutCreate(d, CUDA_R_32F, (uint64_t)s->N, (uint64_t)M, s->N);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cublasLtMatrixLayoutDestroy(*b);
        *b = NULL;
        *d = NULL;
    }
    return st;
}

/* The heuristic's algorithms for M, without workspace; n found. */
static cublasStatus_t heuristic(kvg_cuda *c, kvg_cu_gemm_shape *s, int M,
                                cublasLtMatmulHeuristicResult_t *res, int *n)
{
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatrixLayout_t b = NULL, d = NULL;
    size_t ws = 0;
    cublasStatus_t st = cublasLtMatmulPreferenceCreate(&pref);
    *n = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = layouts(s, M, &b, &d);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)c->lt, s->desc, s->a, b, d, d, pref,
                                            MAX_ALGOS, res, n);
    if (st == CUBLAS_STATUS_SUCCESS && *n <= 0)
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (b)
        cublasLtMatrixLayoutDestroy(b);
    if (d)
        cublasLtMatrixLayoutDestroy(d);
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

static cublasStatus_t algo_check(kvg_cuda *c, kvg_cu_gemm_shape *s, int M, const cublasLtMatmulAlgo_t *algo)
{
    cublasLtMatrixLayout_t b = NULL, d = NULL;
    cublasLtMatmulHeuristicResult_t r;
    cublasStatus_t st = layouts(s, M, &b, &d);
    memset(&r, 0, sizeof r);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoCheck((cublasLtHandle_t)c->lt, s->desc, s->a, b, d, d, algo, &r);
    if (st == CUBLAS_STATUS_SUCCESS && r.workspaceSize > 0)
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (b)
        cublasLtMatrixLayoutDestroy(b);
    if (d)
        cublasLtMatrixLayoutDestroy(d);
    return st;
}

/* Pins one algorithm for every M: the first of the heuristic's for PIN_M that, with
 * split-K fixed at 1, is valid for both M = 1 and M max. */
static int pin(kvg_cuda *c, kvg_cu_gemm_shape *s)
{
    cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
    int n = 0, m = PIN_M < c->gemm_max_m ? PIN_M : c->gemm_max_m;
    cublasStatus_t st = heuristic(c, s, m, res, &n);
    if (st != CUBLAS_STATUS_SUCCESS)
        return kvg_cu_fail_blas(c, "cublasLtMatmulAlgoGetHeuristic", st, "%s, N=%d K=%d M=%d", s->what, s->N,
                                s->K, m);
    for (int i = 0; i < n; i++) {
        cublasLtMatmulAlgo_t a = res[i].algo;
        int32_t one = 1;
        if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one) !=
            CUBLAS_STATUS_SUCCESS)
            continue;
        if (algo_check(c, s, 1, &a) == CUBLAS_STATUS_SUCCESS &&
            algo_check(c, s, c->gemm_max_m, &a) == CUBLAS_STATUS_SUCCESS) {
            s->algo = a;
            s->pinned = 1;
            return 0;
        }
    }
    return kvg_cu_fail_blas(c, "cublasLtMatmulAlgoCheck", CUBLAS_STATUS_NOT_SUPPORTED,
                            "%s: no algorithm without split-K valid for M=1 and M=%d, N=%d K=%d", s->what,
                            c->gemm_max_m, s->N, s->K);
}

static kvg_cu_gemm_shape *find_shape(kvg_cuda *c, int N, int K, kvg_kt dt, int bias)
{
    for (int i = 0; i < c->n_shapes; i++)
        if (c->shapes[i].N == N && c->shapes[i].K == K && c->shapes[i].dt == dt && c->shapes[i].bias == bias)
            return &c->shapes[i];
    return NULL;
}

/* A new shape: its descriptor (transposes, the bias epilogue) and W's layout. */
static kvg_cu_gemm_shape *new_shape(kvg_cuda *c, int N, int K, kvg_kt dt, int bias, const char *what)
{
    kvg_cu_gemm_shape *s;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cudaDataType_t bias_type = CUDA_R_32F;
    cublasStatus_t st;
    if (c->n_shapes == c->cap_shapes) {
        int cap = c->cap_shapes ? c->cap_shapes * 2 : 8;
        kvg_cu_gemm_shape *ns = realloc(c->shapes, (size_t)cap * sizeof *ns);
        if (!ns) {
            kvg_cu_fail(c, "malloc", cudaErrorMemoryAllocation, "GEMM shape table");
            return NULL;
        }
        c->shapes = ns;
        c->cap_shapes = cap;
    }
    s = &c->shapes[c->n_shapes];
    memset(s, 0, sizeof *s);
    s->N = N;
    s->K = K;
    s->dt = dt;
    s->bias = bias;
    snprintf(s->what, sizeof s->what, "%s", what);
    st = cublasLtMatmulDescCreate(&s->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (st == CUBLAS_STATUS_SUCCESS && bias)
        st = cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (st == CUBLAS_STATUS_SUCCESS && bias)
        st = cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                            sizeof bias_type);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&s->a, cuda_type(dt), (uint64_t)K, (uint64_t)N, K);
    if (st != CUBLAS_STATUS_SUCCESS) {
        if (s->a)
            cublasLtMatrixLayoutDestroy(s->a);
        if (s->desc)
            cublasLtMatmulDescDestroy(s->desc);
        kvg_cu_fail_blas(c, "cublasLtMatmulDescCreate", st, "N=%d K=%d", N, K);
        return NULL;
    }
    c->n_shapes++;
    return s;
}

/* The shape of a step's GEMM: with --batch-invariant on, one pinned at startup (a shape
 * the startup did not see is a bug: it would run unpinned); off, made at first use. */
static kvg_cu_gemm_shape *shape_of(kvg_cuda *c, int N, int K, kvg_kt dt, int bias)
{
    kvg_cu_gemm_shape *s = find_shape(c, N, K, dt, bias);
    if (s)
        return s;
    if (c->batch_invariant) {
        kvg_cu_fail(c, "GEMM", cudaErrorInvalidValue, "N=%d K=%d %s%s: a shape not pinned at startup", N, K,
                    type_name(dt), bias ? " with bias" : "");
        return NULL;
    }
    return new_shape(c, N, K, dt, bias, "a weight");
}

/* The algorithm for M: the pinned one, or (off) the heuristic's for this M, cached. */
static const cublasLtMatmulAlgo_t *algo_for(kvg_cuda *c, kvg_cu_gemm_shape *s, int M)
{
    cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
    int n = 0;
    cublasStatus_t st;
    if (c->batch_invariant)
        return &s->algo;
    for (int i = 0; i < s->n_ms; i++)
        if (s->ms[i].M == M)
            return &s->ms[i].algo;
    st = heuristic(c, s, M, res, &n);
    if (st != CUBLAS_STATUS_SUCCESS) {
        kvg_cu_fail_blas(c, "cublasLtMatmulAlgoGetHeuristic", st, "M=%d N=%d K=%d", M, s->N, s->K);
        return NULL;
    }
    if (s->n_ms == s->cap_ms) {
        int cap = s->cap_ms ? s->cap_ms * 2 : 8;
        per_m *nm = realloc(s->ms, (size_t)cap * sizeof *nm);
        if (!nm) {
            kvg_cu_fail(c, "malloc", cudaErrorMemoryAllocation, "GEMM algorithm cache");
            return NULL;
        }
        s->ms = nm;
        s->cap_ms = cap;
    }
    s->ms[s->n_ms].M = M;
    s->ms[s->n_ms].algo = res[0].algo;
    return &s->ms[s->n_ms++].algo;
}

/* *p holds at least `bytes` (grown, never shrunk; at least 1 MiB). */
static int ensure(kvg_cuda *c, void **p, size_t *have, size_t bytes, const char *what)
{
    cudaError_t e;
    if (bytes <= *have)
        return 0;
    if (!kvg_cu_alloc_ok(c, what))
        return -1;
    if (*p)
        cudaFree(*p);
    *p = NULL;
    *have = 0;
    if (bytes < ((size_t)1 << 20))
        bytes = (size_t)1 << 20;
    e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        *p = NULL;
        return kvg_cu_fail(c, "cudaMalloc", e, "%s of %zu bytes", what, bytes);
    }
    *have = bytes;
    return 0;
}

/* y[M][s->N] = x[M][s->K] w^T (+ bias: the epilogue's, when the shape has one), x in the
 * shape's type. Records a failure on error. */
static void run_gemm(kvg_cuda *c, kvg_cu_gemm_shape *s, const void *x, int M, const void *w, const float *bias,
                     float *y)
{
    const cublasLtMatmulAlgo_t *algo = algo_for(c, s, M);
    cublasLtMatrixLayout_t b = NULL, d = NULL;
    cublasStatus_t st;
    cudaError_t e;
    float one = 1.0f, zero = 0.0f;

    if (!algo)
        return;
    if (s->bias) {
        /* Read at the call (the descriptor may be changed once cublasLtMatmul returns). */
        st = cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        if (st != CUBLAS_STATUS_SUCCESS) {
            kvg_cu_fail_blas(c, "cublasLtMatmulDescSetAttribute", st, "the bias, N=%d", s->N);
            return;
        }
    }
    st = layouts(s, M, &b, &d);
    if (st != CUBLAS_STATUS_SUCCESS) {
        kvg_cu_fail_blas(c, "cublasLtMatrixLayoutCreate", st, "M=%d N=%d K=%d", M, s->N, s->K);
        return;
    }
    st = cublasLtMatmul((cublasLtHandle_t)c->lt, s->desc, &one, w, s->a, x, b, &zero, y, d, y, d, algo, NULL, 0,
                        c->stream);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(d);
    if (st != CUBLAS_STATUS_SUCCESS) {
        kvg_cu_fail_blas(c, "cublasLtMatmul", st, "M=%d N=%d K=%d", M, s->N, s->K);
        return;
    }
    if (c->sync_each && (e = cudaStreamSynchronize(c->stream)) != cudaSuccess)
        kvg_cu_fail(c, "cublasLtMatmul", e, "M=%d N=%d K=%d", M, s->N, s->K);
}

void kvg_cu_gemm(kvg_cuda *c, const void *x, int M, int K, const kvg_cu_weight *dw, int N,
                 const kvg_cu_weight *db, float *y)
{
    kvg_cu_gemm_shape *s;
    if (c->failed || M <= 0)
        return;
    s = shape_of(c, N, K, dw->dt, db != NULL);
    if (s)
        run_gemm(c, s, x, M, dw->dev, db ? db->dev : NULL, y);
}

void kvg_cu_lowp_clear(kvg_cuda *c)
{
    c->lowp_src = NULL;
    c->lowp_n = 0;
    c->lowp_dt = KVG_KT_F32;
}

void *kvg_cu_lowp_scratch(kvg_cuda *c, size_t n)
{
    kvg_cu_lowp_clear(c);
    if (ensure(c, &c->lowp, &c->lowp_bytes, n * 2, "GEMM input scratch") != 0)
        return NULL;
    return c->lowp;
}

/* A GEMM wrote y[0 .. n): if that is (part of) what lowp was rounded from, lowp is stale. */
static void wrote(kvg_cuda *c, const float *y, size_t n)
{
    uintptr_t a = (uintptr_t)c->lowp_src, b = (uintptr_t)y;
    if (c->lowp_src && b < a + c->lowp_n * sizeof(float) && a < b + n * sizeof(float))
        kvg_cu_lowp_clear(c);
}

/* x rounded to dt in the lowp scratch (once for all the GEMMs that read it): nothing to do
 * when a fused kernel (cuda_fuse.c) left exactly that there, the same bits as rounding it
 * here. */
static const void *to_lowp(kvg_cuda *c, const float *x, int M, int K, kvg_kt dt)
{
    cudaError_t e;
    const size_t n = (size_t)M * (size_t)K;
    if (c->lowp_src == x && c->lowp_n == n && c->lowp_dt == dt)
        return c->lowp;
    if (!kvg_cu_lowp_scratch(c, n))
        return NULL;
    e = kvg_k_to_lowp(c->stream, x, n, dt, c->lowp);
    if (e != cudaSuccess) {
        kvg_cu_fail(c, "launch kvg_k_to_lowp", e, "M=%d K=%d", M, K);
        return NULL;
    }
    return c->lowp;
}

void kvg_cu_matmul(kvg_cuda *c, const float *x, int M, int K, const kvg_tensor *w,
                   const float *bias, float *y)
{
    const kvg_cu_weight *dw, *db = NULL;
    const void *xl;

    if (c->failed || M <= 0)
        return;
    dw = kvg_cu_weight_of(c, w->data);
    if (bias)
        db = kvg_cu_weight_of(c, bias);
    if (!dw || (bias && !db))
        return;
    if (dw->dt == KVG_KT_F32) {
        /* An F32 weight (a MoE router): x as it is, an F32 GEMM. */
        kvg_cu_gemm(c, x, M, K, dw, (int)w->rows, db, y);
        wrote(c, y, (size_t)M * (size_t)w->rows);
        return;
    }
    xl = to_lowp(c, x, M, K, dw->dt);
    if (xl)
        kvg_cu_gemm(c, xl, M, K, dw, (int)w->rows, db, y);
    wrote(c, y, (size_t)M * (size_t)w->rows);
}

void kvg_cu_matmul_n(kvg_cuda *c, const float *x, int M, int K, int n, const kvg_tensor *const *w,
                     const float *const *bias, float *const *y)
{
    const kvg_cu_fused *f;
    kvg_cu_gemm_shape *s;
    const void *xl;
    kvg_k_split sp;

    if (c->failed || M <= 0)
        return;
    f = kvg_cu_fused_of(c, n, w, bias);
    if (!f || f->K != K || n > KVG_K_SPLIT_MAX) {
        for (int i = 0; i < n; i++)
            kvg_cu_matmul(c, x, M, K, w[i], bias ? bias[i] : NULL, y[i]);
        return;
    }
    s = shape_of(c, f->N, K, f->dt, f->bias != NULL);
    if (!s || !(xl = to_lowp(c, x, M, K, f->dt)))
        return;
    if (ensure(c, (void **)&c->fused_out, &c->fused_out_bytes, (size_t)M * (size_t)f->N * 4,
               "fused GEMM output scratch") != 0)
        return;
    run_gemm(c, s, xl, M, f->dev, f->bias, c->fused_out);
    memset(&sp, 0, sizeof sp);
    sp.n = n;
    for (int i = 0; i < n; i++) {
        sp.out[i] = y[i];
        sp.cols[i] = f->rows[i];
    }
    if (!c->failed)
        KVG_CU_CHECK(c, "launch kvg_k_split_cols", kvg_k_split_cols(c->stream, c->fused_out, M, &sp), "M=%d N=%d",
                     M, f->N);
    for (int i = 0; i < n; i++)
        wrote(c, y[i], (size_t)M * (size_t)f->rows[i]);
}

int kvg_cu_gemm_pinned(const kvg_cuda *c)
{
    int n = 0;
    for (int i = 0; i < c->n_shapes; i++)
        n += c->shapes[i].pinned;
    return n;
}

/* ---- startup: every shape, pinned and self-tested with --batch-invariant on ---- */

/* A few rows of random inputs through the pinned algorithm alone (M = 1) and among k
 * rows (k = 2, 7, 64, kmax): rows 0, k/2 and k-1 of each must have the bits they have
 * alone. w (and bias) are the shape's first weight's, so the test runs the kernel on the
 * data and alignment it will run on. 0; -1 with c->err (a CUDA failure, or the rows that
 * differ). */
static int self_test(kvg_cuda *c, kvg_cu_gemm_shape *s, const void *w, const float *bias)
{
    const size_t N = (size_t)s->N, K = (size_t)s->K, es = s->dt == KVG_KT_F32 ? 4 : 2;
    const size_t sx = (K * es + 255) / 256 * 256, sy = (N * 4 + 255) / 256 * 256;
    int kmax = c->gemm_max_m < TEST_MAX_M ? c->gemm_max_m : TEST_MAX_M;
    int ks[4] = { 2, 7, 64, 0 }, n_ks = 0, rows[12], n_rows = 0, rc = -1;
    size_t wide = N > K ? N : K;
    float *xf = NULL, *y = NULL, *hx = NULL, *h1 = NULL, *hk = NULL;
    void *xl = NULL;
    unsigned char *x1 = NULL, *y1 = NULL;
    uint32_t seed = 0x9e3779b9u ^ (uint32_t)(s->N * 131 + s->K);
    cudaError_t e;

    if ((size_t)kmax * wide * 4 > TEST_BYTES)
        kmax = (int)(TEST_BYTES / (wide * 4));
    if (kmax < 64)
        kmax = c->gemm_max_m < 64 ? c->gemm_max_m : 64;
    ks[3] = kmax;
    for (int i = 0; i < 4; i++)
        if (ks[i] >= 2 && ks[i] <= kmax && (n_ks == 0 || ks[i] > ks[n_ks - 1]))
            ks[n_ks++] = ks[i];
    if (n_ks == 0)
        return 0;                /* gemm_max_m 1: nothing to compare */
    for (int i = 0; i < n_ks; i++) {
        int r3[3] = { 0, ks[i] / 2, ks[i] - 1 };
        for (int j = 0; j < 3; j++) {
            int seen = 0;
            for (int q = 0; q < n_rows; q++)
                seen |= rows[q] == r3[j];
            if (!seen)
                rows[n_rows++] = r3[j];
        }
    }
    hx = malloc((size_t)kmax * K * 4);
    h1 = malloc((size_t)n_rows * N * 4);
    hk = malloc(3 * N * 4);
    if (!hx || !h1 || !hk) {
        kvg_cu_fail(c, "malloc", cudaErrorMemoryAllocation, "the GEMM self-test");
        goto out;
    }
    /* Inputs in [-2, 2), an LCG: deterministic, and every bit of the mantissas in play. */
    for (size_t i = 0; i < (size_t)kmax * K; i++) {
        seed = seed * 1664525u + 1013904223u;
        hx[i] = (float)(seed >> 8) / (float)(1u << 22) - 2.0f;
    }
    if ((e = cudaMalloc((void **)&xf, (size_t)kmax * K * 4)) != cudaSuccess ||
        (es == 2 && (e = cudaMalloc(&xl, (size_t)kmax * K * 2)) != cudaSuccess) ||
        (e = cudaMalloc((void **)&x1, (size_t)n_rows * sx)) != cudaSuccess ||
        (e = cudaMalloc((void **)&y, (size_t)kmax * N * 4)) != cudaSuccess ||
        (e = cudaMalloc((void **)&y1, (size_t)n_rows * sy)) != cudaSuccess) {
        kvg_cu_fail(c, "cudaMalloc", e, "the GEMM self-test's buffers, %s", s->what);
        goto out;
    }
    if (es == 4)
        xl = xf;
    e = cudaMemcpyAsync(xf, hx, (size_t)kmax * K * 4, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess && es == 2)
        e = kvg_k_to_lowp(c->stream, xf, (size_t)kmax * K, s->dt, xl);
    /* Each row alone, from a buffer of its own (256-byte aligned, as a step's input is). */
    for (int i = 0; i < n_rows && e == cudaSuccess && !c->failed; i++) {
        e = cudaMemcpyAsync(x1 + (size_t)i * sx, (const unsigned char *)xl + (size_t)rows[i] * K * es, K * es,
                            cudaMemcpyDeviceToDevice, c->stream);
        if (e == cudaSuccess)
            run_gemm(c, s, x1 + (size_t)i * sx, 1, w, bias, (float *)(void *)(y1 + (size_t)i * sy));
        if (e == cudaSuccess && !c->failed)
            e = cudaMemcpyAsync(h1 + (size_t)i * N, y1 + (size_t)i * sy, N * 4, cudaMemcpyDeviceToHost, c->stream);
    }
    if (e == cudaSuccess && !c->failed)
        e = cudaStreamSynchronize(c->stream);
    for (int i = 0; i < n_ks && e == cudaSuccess && !c->failed; i++) {
        int k = ks[i], r3[3] = { 0, k / 2, k - 1 };
        run_gemm(c, s, xl, k, w, bias, y);
        for (int j = 0; j < 3 && e == cudaSuccess && !c->failed; j++)
            e = cudaMemcpyAsync(hk + (size_t)j * N, y + (size_t)r3[j] * N, N * 4, cudaMemcpyDeviceToHost,
                                c->stream);
        if (e == cudaSuccess && !c->failed)
            e = cudaStreamSynchronize(c->stream);
        for (int j = 0; j < 3 && e == cudaSuccess && !c->failed; j++) {
            const float *alone = NULL;
            int differ = 0;
            for (int q = 0; q < n_rows; q++)
                if (rows[q] == r3[j])
                    alone = h1 + (size_t)q * N;
            for (size_t o = 0; o < N; o++)
                differ += memcmp(&alone[o], &hk[(size_t)j * N + o], 4) != 0;
            if (differ) {
                int32_t id = -1;
                cublasLtMatmulAlgoConfigGetAttribute(&s->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, NULL);
                snprintf(c->err, sizeof c->err,
                         "cuda: --batch-invariant on: cuBLASLt's algorithm %d for the GEMM of %s (N=%d K=%d %s%s) "
                         "gives row %d of %d other bits than the same row alone (M=1): %d of %d outputs differ, so "
                         "a row's logits would depend on the batch; refusing invariant mode on this GPU and "
                         "cuBLASLt (run with --batch-invariant off)",
                         (int)id, s->what, s->N, s->K, type_name(s->dt), s->bias ? ", bias" : "", r3[j], k,
                         differ, s->N);
                c->failed = 1;
            }
        }
    }
    if (e != cudaSuccess)
        kvg_cu_fail(c, "the GEMM self-test", e, "%s, N=%d K=%d", s->what, s->N, s->K);
    rc = c->failed ? -1 : 0;
out:
    /* What is queued may still read the buffers (cudaFree waits for the device). */
    cudaStreamSynchronize(c->stream);
    if (xf)
        cudaFree(xf);
    if (xl && es == 2)
        cudaFree(xl);
    if (x1)
        cudaFree(x1);
    if (y)
        cudaFree(y);
    if (y1)
        cudaFree(y1);
    free(hx);
    free(h1);
    free(hk);
    return rc;
}

/* The shape of weight w (dev, N rows, type dt) with bias or not: made once; with
 * --batch-invariant on pinned and self-tested on w. 0, or -1 recorded. */
static int add_shape(kvg_cuda *c, int N, int K, kvg_kt dt, const void *w, const float *bias, const char *what)
{
    kvg_cu_gemm_shape *s;
    if (c->failed)
        return -1;
    if (find_shape(c, N, K, dt, bias != NULL))
        return 0;
    s = new_shape(c, N, K, dt, bias != NULL, what);
    if (!s)
        return -1;
    if (!c->batch_invariant)
        return 0;
    if (pin(c, s) != 0)
        return -1;
    return self_test(c, s, w, bias);
}

/* A weight's shape (nothing for a tensor the model does not have). */
static int add_weight(kvg_cuda *c, const kvg_tensor *t, const float *bias, int layer, const char *name)
{
    const kvg_cu_weight *dw, *db = NULL;
    char what[64];
    if (c->failed)
        return -1;
    if (!t->data)
        return 0;
    dw = kvg_cu_weight_of(c, t->data);
    if (bias)
        db = kvg_cu_weight_of(c, bias);
    if (!dw || (bias && !db))
        return -1;
    if (layer >= 0)
        snprintf(what, sizeof what, "layer %d %s", layer, name);
    else
        snprintf(what, sizeof what, "%s", name);
    return add_shape(c, (int)t->rows, (int)t->cols, dw->dt, dw->dev, db ? db->dev : NULL, what);
}

static int add_fused(kvg_cuda *c, const kvg_cu_fused *f)
{
    char what[64];
    if (f->n == 0)
        return 0;
    snprintf(what, sizeof what, "layer %d %s", f->layer, f->name);
    return add_shape(c, f->N, f->K, f->dt, f->dev, f->bias, what);
}

int kvg_cu_gemm_startup(kvg_cuda *c, char *err, size_t err_len)
{
    const kvg_model *m = c->m;
    const kvg_model_config *cfg = &m->cfg;
    int rc = 0;
    for (int l = 0; l < cfg->n_layers && rc == 0; l++) {
        const kvg_layer_weights *L = &m->layers[l];
        /* The fused products, and each part alone: a caller without matmul_n (a bench's
           A/B run) still finds its shapes. */
        rc |= add_fused(c, &c->fused[2 * l]);
        rc |= add_weight(c, &L->wq, L->bq, l, "wq");
        rc |= add_weight(c, &L->wk, L->bk, l, "wk");
        rc |= add_weight(c, &L->wv, L->bv, l, "wv");
        rc |= add_weight(c, &L->wo, L->bo, l, "wo");
        if (cfg->n_experts > 0) {
            /* cuda_moe.c's GEMMs: the router (gpt-oss: its bias), each expert's three
               (gpt-oss: each with its slice of the layer's biases). */
            int EH = cfg->expert_hidden_dim, biased = cfg->moe_biases;
            rc |= add_weight(c, &L->moe_router, biased ? L->moe_router_bias : NULL, l, "moe_router");
            for (int e = 0; e < cfg->n_experts && rc == 0; e++) {
                rc |= add_weight(c, &L->moe_gate[e], biased ? L->moe_gate_bias + (size_t)e * EH : NULL, l,
                                 "moe_gate");
                rc |= add_weight(c, &L->moe_up[e], biased ? L->moe_up_bias + (size_t)e * EH : NULL, l, "moe_up");
                rc |= add_weight(c, &L->moe_down[e], biased ? L->moe_down_bias + (size_t)e * cfg->dim : NULL, l,
                                 "moe_down");
            }
        } else {
            rc |= add_fused(c, &c->fused[2 * l + 1]);
            rc |= add_weight(c, &L->w_gate, NULL, l, "w_gate");
            rc |= add_weight(c, &L->w_up, NULL, l, "w_up");
            rc |= add_weight(c, &L->w_down, NULL, l, "w_down");
        }
    }
    if (rc == 0)
        rc = add_weight(c, &m->output, NULL, -1, "output");
    if (rc == 0 && !c->failed)
        return 0;
    kvg_set_err(err, err_len, "%s", c->failed ? c->err : "cuda: GEMM startup failed");
    c->failed = 0;
    c->err[0] = 0;
    return -1;
}
