/* GEMMs through cuBLASLt: y[M][N] = x[M][K] W^T, W row-major [N][K] in BF16/F16.
 *
 * Column-major view (kernels/README.md, the design): D (N x M, ld N) = op(A) op(B) with
 * A = W as K x N (ld K) transposed and B = x as K x M (ld K); x is first rounded to W's
 * type (kvg_k_to_lowp), D is F32, compute 32F. An F32 weight (a MoE router, kept F32 as
 * the CPU keeps it) takes x as it is: a full-precision F32 GEMM (COMPUTE_32F, no TF32).
 *
 * Batch invariance (--batch-invariant on): one algorithm per weight shape (N, K, type),
 * chosen once from the heuristic for the largest M the engine runs, with no workspace and
 * split-K off, checked for M = 1 and M max, then used for every M: a row's dot products
 * are then computed by the same kernel with the same reduction over K whatever the number
 * of rows. Off: the heuristic's choice for each (shape, M), cached. */
#include "cuda_internal.h"
#include "errmsg.h"

#include <stdlib.h>
#include <string.h>

#define MAX_ALGOS 8

typedef struct per_m {
    int M;
    cublasLtMatmulAlgo_t algo;
} per_m;

struct kvg_cu_gemm_shape {
    int N, K;
    kvg_kt dt;
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

/* Pins one algorithm for every M: the first of the heuristic's for M max that, with
 * split-K off, is valid for both M = 1 and M max. */
static int pin(kvg_cuda *c, kvg_cu_gemm_shape *s)
{
    cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
    int n = 0;
    cublasStatus_t st = heuristic(c, s, c->gemm_max_m, res, &n);
    if (st != CUBLAS_STATUS_SUCCESS)
        return kvg_cu_fail_blas(c, "cublasLtMatmulAlgoGetHeuristic", st, "N=%d K=%d M=%d", s->N, s->K,
                                c->gemm_max_m);
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
                            "no algorithm without split-K valid for M=1 and M=%d, N=%d K=%d",
                            c->gemm_max_m, s->N, s->K);
}

static kvg_cu_gemm_shape *shape_of(kvg_cuda *c, int N, int K, kvg_kt dt)
{
    kvg_cu_gemm_shape *s;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasStatus_t st;
    for (int i = 0; i < c->n_shapes; i++)
        if (c->shapes[i].N == N && c->shapes[i].K == K && c->shapes[i].dt == dt)
            return &c->shapes[i];
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
    st = cublasLtMatmulDescCreate(&s->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
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
    if (c->batch_invariant && pin(c, s) != 0)
        return NULL;
    return s;
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

static int ensure_lowp(kvg_cuda *c, size_t bytes)
{
    cudaError_t e;
    if (bytes <= c->lowp_bytes)
        return 0;
    if (c->lowp)
        cudaFree(c->lowp);
    c->lowp = NULL;
    c->lowp_bytes = 0;
    if (bytes < ((size_t)1 << 20))
        bytes = (size_t)1 << 20;
    e = cudaMalloc(&c->lowp, bytes);
    if (e != cudaSuccess) {
        c->lowp = NULL;
        return kvg_cu_fail(c, "cudaMalloc", e, "GEMM input scratch of %zu bytes", bytes);
    }
    c->lowp_bytes = bytes;
    return 0;
}

void kvg_cu_gemm(kvg_cuda *c, const void *x, int M, int K, const kvg_cu_weight *dw, int N,
                 const kvg_cu_weight *db, float *y)
{
    kvg_cu_gemm_shape *s;
    const cublasLtMatmulAlgo_t *algo;
    cublasLtMatrixLayout_t b = NULL, d = NULL;
    cublasStatus_t st;
    cudaError_t e;
    float one = 1.0f, zero = 0.0f;

    if (c->failed || M <= 0)
        return;
    s = shape_of(c, N, K, dw->dt);
    if (!s)
        return;
    algo = algo_for(c, s, M);
    if (!algo)
        return;
    st = layouts(s, M, &b, &d);
    if (st != CUBLAS_STATUS_SUCCESS) {
        kvg_cu_fail_blas(c, "cublasLtMatrixLayoutCreate", st, "M=%d N=%d K=%d", M, N, K);
        return;
    }
    st = cublasLtMatmul((cublasLtHandle_t)c->lt, s->desc, &one, dw->dev, s->a, x, b, &zero, y, d, y, d,
                        algo, NULL, 0, c->stream);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(d);
    if (st != CUBLAS_STATUS_SUCCESS) {
        kvg_cu_fail_blas(c, "cublasLtMatmul", st, "M=%d N=%d K=%d", M, N, K);
        return;
    }
    if (c->sync_each && (e = cudaStreamSynchronize(c->stream)) != cudaSuccess) {
        kvg_cu_fail(c, "cublasLtMatmul", e, "M=%d N=%d K=%d", M, N, K);
        return;
    }
    if (db) {
        e = kvg_k_bias_add(c->stream, y, db->dev, M, N);
        if (e != cudaSuccess)
            kvg_cu_fail(c, "launch kvg_k_bias_add", e, "M=%d N=%d", M, N);
    }
}

void kvg_cu_matmul(kvg_cuda *c, const float *x, int M, int K, const kvg_tensor *w,
                   const float *bias, float *y)
{
    const kvg_cu_weight *dw, *db = NULL;
    cudaError_t e;

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
        return;
    }
    if (ensure_lowp(c, (size_t)M * (size_t)K * 2) != 0)
        return;
    e = kvg_k_to_lowp(c->stream, x, (size_t)M * K, dw->dt, c->lowp);
    if (e != cudaSuccess) {
        kvg_cu_fail(c, "launch kvg_k_to_lowp", e, "M=%d K=%d", M, K);
        return;
    }
    kvg_cu_gemm(c, c->lowp, M, K, dw, (int)w->rows, db, y);
}
