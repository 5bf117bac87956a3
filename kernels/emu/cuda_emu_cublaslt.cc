/* The emulated cuBLASLt: descriptors that keep what was set, one fake algorithm from the
 * heuristic, and cublasLtMatmul as a host reference GEMM with cuBLAS's column-major
 * semantics:
 *     D (m x n) = alpha op(A) (m x k) op(B) (k x n) + beta C (m x n) [+ bias[i] per row i]
 * A and B both F32, F16 or BF16; C and D F32; the products summed in F32 over k in
 * increasing order, whatever the algorithm: SPLITK_NUM > 1 computes the same values (a GPU
 * would sum the k-slices in another order, so tests must not expect bit-equality with a
 * split-K run on real hardware). The exception is the test hook kvg_emu_lt_m_dependent:
 * its algorithm sums k in two halves once D has 8 columns or more, an order that depends
 * on the engine's M, for tests of the engine's invariance self-test. Arguments are validated as cuBLAS does: inconsistent
 * dimensions or leading dimensions and null pointers are CUBLAS_STATUS_INVALID_VALUE,
 * unsupported types or modes CUBLAS_STATUS_NOT_SUPPORTED. Additionally every matrix must
 * lie inside one device allocation (on a GPU a stray pointer is an illegal address later):
 * CUBLAS_STATUS_INVALID_VALUE with a line on stderr. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <set>
#include <vector>

#include "cuda_emu_internal.h"

struct cublasLtContext {
    uint64_t magic;
};

namespace kvg_emu {
namespace {

constexpr uint64_t LAYOUT_MAGIC = 0x4b56474c41594f55ull;   /* "KVGLAYOU" */
constexpr uint64_t DESC_MAGIC = 0x4b5647444553430aull;
constexpr uint64_t PREF_MAGIC = 0x4b56475052454600ull;
constexpr uint64_t ALGO_MAGIC = 0x4b5647414c474f00ull;
constexpr uint64_t HANDLE_MAGIC = 0x4b5647484e444c00ull;

/* Fields of the opaque structs (their data[] words). */
enum { L_MAGIC, L_TYPE, L_ROWS, L_COLS, L_LD, L_ORDER, L_BATCH };
enum { D_MAGIC, D_COMPUTE, D_SCALE, D_PMODE, D_TRANSA, D_TRANSB, D_TRANSC, D_EPILOGUE,
       D_BIAS, D_BIAS_TYPE };
enum { P_MAGIC, P_SEARCH, P_WORKSPACE };
enum { A_MAGIC, A_ID, A_TILE, A_SPLITK, A_REDUCTION, A_SWIZZLE, A_CUSTOM, A_STAGES };

/* The one algorithm the heuristic offers (numbers as a GPU might report them); with
 * kvg_emu_lt_m_dependent(1), one whose order of summation depends on the number of
 * columns (MDEP_ALGO_ID; MDEP_MIN_N columns and more: k in two halves). */
constexpr int32_t FAKE_ALGO_ID = 21;
constexpr uint32_t FAKE_TILE_ID = 20;
constexpr int32_t MDEP_ALGO_ID = 66;
constexpr uint64_t MDEP_MIN_N = 8;

int &m_dependent()
{
    static int on = 0;
    return on;
}

std::set<cublasLtHandle_t> &handles()
{
    static std::set<cublasLtHandle_t> h;
    return h;
}

size_t type_size(int64_t t)
{
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16F: return 2;
    case CUDA_R_16BF: return 2;
    }
    return 0;
}

struct Problem {
    int opa, opb;
    uint64_t m, n, k;
    int64_t ab_type;
    bool bias;
};

bool layout_ok(cublasLtMatrixLayout_t l) { return l && l->data[L_MAGIC] == LAYOUT_MAGIC; }

cublasStatus_t check_problem(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                             cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                             cublasLtMatrixLayout_t dd, Problem *p)
{
    if (!d || d->data[D_MAGIC] != DESC_MAGIC || !layout_ok(a) || !layout_ok(b) ||
        !layout_ok(c) || !layout_ok(dd))
        return CUBLAS_STATUS_INVALID_VALUE;
    if ((int64_t)d->data[D_SCALE] != CUDA_R_32F || d->data[D_PMODE] != CUBLASLT_POINTER_MODE_HOST ||
        d->data[D_TRANSC] != CUBLAS_OP_N)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    int64_t ta = (int64_t)a->data[L_TYPE], tb = (int64_t)b->data[L_TYPE];
    if (ta != tb || !type_size(ta) || (int64_t)c->data[L_TYPE] != CUDA_R_32F ||
        (int64_t)dd->data[L_TYPE] != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    for (cublasLtMatrixLayout_t l : {a, b, c, dd})
        if (l->data[L_ORDER] != CUBLASLT_ORDER_COL || l->data[L_BATCH] != 1)
            return CUBLAS_STATUS_NOT_SUPPORTED;
    uint64_t epi = d->data[D_EPILOGUE];
    if (epi != CUBLASLT_EPILOGUE_DEFAULT && epi != CUBLASLT_EPILOGUE_BIAS)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    p->bias = epi == CUBLASLT_EPILOGUE_BIAS;
    if (p->bias && (int64_t)d->data[D_BIAS_TYPE] != -1 &&
        (int64_t)d->data[D_BIAS_TYPE] != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* CUBLAS_OP_C is CUBLAS_OP_T for real types. */
    p->opa = d->data[D_TRANSA] != CUBLAS_OP_N;
    p->opb = d->data[D_TRANSB] != CUBLAS_OP_N;
    p->m = dd->data[L_ROWS];
    p->n = dd->data[L_COLS];
    p->k = p->opa ? a->data[L_ROWS] : a->data[L_COLS];
    p->ab_type = ta;
    uint64_t am = p->opa ? a->data[L_COLS] : a->data[L_ROWS];
    uint64_t bk = p->opb ? b->data[L_COLS] : b->data[L_ROWS];
    uint64_t bn = p->opb ? b->data[L_ROWS] : b->data[L_COLS];
    if (am != p->m || bk != p->k || bn != p->n || c->data[L_ROWS] != p->m ||
        c->data[L_COLS] != p->n)
        return CUBLAS_STATUS_INVALID_VALUE;
    for (cublasLtMatrixLayout_t l : {a, b, c, dd}) {
        int64_t ld = (int64_t)l->data[L_LD];
        uint64_t rows = l->data[L_ROWS];
        if (ld < 1 || (uint64_t)ld < rows)
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

bool handle_ok(cublasLtHandle_t h)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    return h && handles().count(h) && h->magic == HANDLE_MAGIC;
}

void fill_result(const Problem &p, const cublasLtMatmulAlgo_t &algo,
                 cublasLtMatmulHeuristicResult_t *r)
{
    memset(r, 0, sizeof *r);
    r->algo = algo;
    r->workspaceSize = 0;
    r->state = CUBLAS_STATUS_SUCCESS;
    double tiles = ceil((double)p.m / 128.0) * ceil((double)p.n / 128.0);
    r->wavesCount = (float)(tiles / 132.0);
}

/* The matrix's bytes as a column-major rows x cols array with leading dimension ld. */
bool matrix_in_device(const char *what, const void *ptr, cublasLtMatrixLayout_t l)
{
    uint64_t rows = l->data[L_ROWS], cols = l->data[L_COLS];
    if (!rows || !cols)
        return true;
    size_t bytes = (size_t)(((uint64_t)l->data[L_LD] * (cols - 1) + rows) *
                            type_size((int64_t)l->data[L_TYPE]));
    if (in_device(ptr, bytes))
        return true;
    fprintf(stderr, "kvg-emu: cublasLtMatmul: %s (%p, %zu bytes) is not inside one device "
            "allocation\n", what, ptr, bytes);
    return false;
}

/* rows x k of a column-major matrix (leading dimension ld) into dst as rows of k floats:
 * transposed (element (r, q) at q + r * ld) or not (at r + q * ld). The type's switch is
 * outside the loops: a logits product converts vocab x dim elements per call. */
template <typename Conv>
void gather_rows(float *dst, const void *src, bool trans, size_t rows, size_t k, size_t ld, Conv conv)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t q = 0; q < k; q++)
            dst[r * k + q] = conv(src, trans ? q + r * ld : r + q * ld);
}

/* The same rows in tiles of T: row r's element q at dst[(r / T) * k * T + q * T + r % T], so
 * that the product's T accumulators read T consecutive floats; the last tile's missing rows
 * are zeros. */
template <typename Conv>
void gather_tiles(float *dst, const void *src, bool trans, size_t rows, size_t k, size_t ld, size_t T, Conv conv)
{
    size_t tiles = (rows + T - 1) / T;
    memset(dst, 0, tiles * T * k * sizeof *dst);
    for (size_t r = 0; r < rows; r++) {
        float *o = dst + (r / T) * k * T + r % T;
        for (size_t q = 0; q < k; q++)
            o[q * T] = conv(src, trans ? q + r * ld : r + q * ld);
    }
}

/* tile 0: rows of k floats (gather_rows); tile T: tiles of T rows (gather_tiles). */
void load_rows(float *dst, const void *src, int64_t type, bool trans, size_t rows, size_t k, size_t ld,
               size_t tile = 0)
{
    auto f16 = [](const void *b, size_t i) { return kvg_emu_f16_bits_to_f32(((const unsigned short *)b)[i]); };
    auto bf16 = [](const void *b, size_t i) { return kvg_emu_bf16_bits_to_f32(((const unsigned short *)b)[i]); };
    auto f32 = [](const void *b, size_t i) { return ((const float *)b)[i]; };
    switch (type) {
    case CUDA_R_16F:
        tile ? gather_tiles(dst, src, trans, rows, k, ld, tile, f16) : gather_rows(dst, src, trans, rows, k, ld, f16);
        break;
    case CUDA_R_16BF:
        tile ? gather_tiles(dst, src, trans, rows, k, ld, tile, bf16)
             : gather_rows(dst, src, trans, rows, k, ld, bf16);
        break;
    default:
        tile ? gather_tiles(dst, src, trans, rows, k, ld, tile, f32) : gather_rows(dst, src, trans, rows, k, ld, f32);
        break;
    }
}

}  // namespace
}  // namespace kvg_emu

using namespace kvg_emu;

/* Attribute sizes must match exactly, as cuBLASLt checks. */
#define ATTR_IN(T, var)                                                         \
    do {                                                                        \
        if (sizeInBytes != sizeof(T))                                           \
            return CUBLAS_STATUS_INVALID_VALUE;                                 \
        T v_;                                                                   \
        memcpy(&v_, buf, sizeof v_);                                            \
        (var) = (uint64_t)(int64_t)v_;                                          \
    } while (0)

#define ATTR_OUT(T, val)                                                        \
    do {                                                                        \
        if (sizeWritten)                                                        \
            *sizeWritten = sizeof(T);                                           \
        if (!buf && !sizeInBytes && sizeWritten)                                \
            return CUBLAS_STATUS_SUCCESS;                                       \
        if (!buf || sizeInBytes < sizeof(T))                                    \
            return CUBLAS_STATUS_INVALID_VALUE;                                 \
        T v_ = (T)(val);                                                        \
        memcpy(buf, &v_, sizeof v_);                                            \
        return CUBLAS_STATUS_SUCCESS;                                           \
    } while (0)

extern "C" {

const char *cublasLtGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the license";
    }
    return "unknown error";
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (int e = injected("cublasLtCreate", CUBLAS_STATUS_NOT_INITIALIZED))
        return (cublasStatus_t)e;
    if (!lightHandle)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (device_state() != cudaSuccess)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasLtHandle_t h = new cublasLtContext{HANDLE_MAGIC};
    handles().insert(h);
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (int e = injected("cublasLtDestroy", CUBLAS_STATUS_NOT_INITIALIZED))
        return (cublasStatus_t)e;
    if (!handle_ok(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handles().erase(lightHandle);
    delete lightHandle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (int e = injected("cublasLtMatrixLayoutCreate", CUBLAS_STATUS_ALLOC_FAILED))
        return (cublasStatus_t)e;
    if (!matLayout)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatrixLayout_t l = new cublasLtMatrixLayoutOpaque_t;
    memset(l, 0, sizeof *l);
    l->data[L_MAGIC] = LAYOUT_MAGIC;
    l->data[L_TYPE] = (uint64_t)type;
    l->data[L_ROWS] = rows;
    l->data[L_COLS] = cols;
    l->data[L_LD] = (uint64_t)ld;
    l->data[L_ORDER] = CUBLASLT_ORDER_COL;
    l->data[L_BATCH] = 1;
    *matLayout = l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    injected("cublasLtMatrixLayoutDestroy", 0);
    if (!matLayout)
        return CUBLAS_STATUS_SUCCESS;
    if (!layout_ok(matLayout))
        return CUBLAS_STATUS_INVALID_VALUE;
    matLayout->data[L_MAGIC] = 0;
    delete matLayout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes)
{
    injected("cublasLtMatrixLayoutSetAttribute", 0);
    if (!layout_ok(matLayout) || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t *d = matLayout->data;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: ATTR_IN(uint32_t, d[L_TYPE]); break;
    case CUBLASLT_MATRIX_LAYOUT_ORDER: ATTR_IN(int32_t, d[L_ORDER]); break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS: ATTR_IN(uint64_t, d[L_ROWS]); break;
    case CUBLASLT_MATRIX_LAYOUT_COLS: ATTR_IN(uint64_t, d[L_COLS]); break;
    case CUBLASLT_MATRIX_LAYOUT_LD: ATTR_IN(int64_t, d[L_LD]); break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: ATTR_IN(int32_t, d[L_BATCH]); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType,
                                        cudaDataType_t scaleType)
{
    if (int e = injected("cublasLtMatmulDescCreate", CUBLAS_STATUS_ALLOC_FAILED))
        return (cublasStatus_t)e;
    if (!matmulDesc)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_16F &&
        computeType != CUBLAS_COMPUTE_32F_FAST_16BF && computeType != CUBLAS_COMPUTE_32F_FAST_TF32)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    cublasLtMatmulDesc_t d = new cublasLtMatmulDescOpaque_t;
    memset(d, 0, sizeof *d);
    d->data[D_MAGIC] = DESC_MAGIC;
    d->data[D_COMPUTE] = (uint64_t)computeType;
    d->data[D_SCALE] = (uint64_t)scaleType;
    d->data[D_PMODE] = CUBLASLT_POINTER_MODE_HOST;
    d->data[D_TRANSA] = CUBLAS_OP_N;
    d->data[D_TRANSB] = CUBLAS_OP_N;
    d->data[D_TRANSC] = CUBLAS_OP_N;
    d->data[D_EPILOGUE] = CUBLASLT_EPILOGUE_DEFAULT;
    d->data[D_BIAS] = 0;
    d->data[D_BIAS_TYPE] = (uint64_t)(int64_t)-1;
    *matmulDesc = d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    injected("cublasLtMatmulDescDestroy", 0);
    if (!matmulDesc)
        return CUBLAS_STATUS_SUCCESS;
    if (matmulDesc->data[D_MAGIC] != DESC_MAGIC)
        return CUBLAS_STATUS_INVALID_VALUE;
    matmulDesc->data[D_MAGIC] = 0;
    delete matmulDesc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes)
{
    injected("cublasLtMatmulDescSetAttribute", 0);
    if (!matmulDesc || matmulDesc->data[D_MAGIC] != DESC_MAGIC || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t *d = matmulDesc->data;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: ATTR_IN(int32_t, d[D_COMPUTE]); break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: ATTR_IN(int32_t, d[D_SCALE]); break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: ATTR_IN(int32_t, d[D_PMODE]); break;
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
    case CUBLASLT_MATMUL_DESC_TRANSC: {
        uint64_t op;
        ATTR_IN(int32_t, op);
        if (op > CUBLAS_OP_C)
            return CUBLAS_STATUS_INVALID_VALUE;
        d[attr == CUBLASLT_MATMUL_DESC_TRANSA ? D_TRANSA
          : attr == CUBLASLT_MATMUL_DESC_TRANSB ? D_TRANSB : D_TRANSC] = op;
        break;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ATTR_IN(uint32_t, d[D_EPILOGUE]); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: {
        if (sizeInBytes != sizeof(void *))
            return CUBLAS_STATUS_INVALID_VALUE;
        const void *p;
        memcpy(&p, buf, sizeof p);
        d[D_BIAS] = (uint64_t)(uintptr_t)p;
        break;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: ATTR_IN(int32_t, d[D_BIAS_TYPE]); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              void *buf, size_t sizeInBytes, size_t *sizeWritten)
{
    injected("cublasLtMatmulDescGetAttribute", 0);
    if (!matmulDesc || matmulDesc->data[D_MAGIC] != DESC_MAGIC)
        return CUBLAS_STATUS_INVALID_VALUE;
    const uint64_t *d = matmulDesc->data;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: ATTR_OUT(int32_t, d[D_COMPUTE]);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: ATTR_OUT(int32_t, d[D_SCALE]);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: ATTR_OUT(int32_t, d[D_PMODE]);
    case CUBLASLT_MATMUL_DESC_TRANSA: ATTR_OUT(int32_t, d[D_TRANSA]);
    case CUBLASLT_MATMUL_DESC_TRANSB: ATTR_OUT(int32_t, d[D_TRANSB]);
    case CUBLASLT_MATMUL_DESC_TRANSC: ATTR_OUT(int32_t, d[D_TRANSC]);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ATTR_OUT(uint32_t, d[D_EPILOGUE]);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ATTR_OUT(const void *, (uintptr_t)d[D_BIAS]);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: ATTR_OUT(int32_t, d[D_BIAS_TYPE]);
    default: break;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (int e = injected("cublasLtMatmulPreferenceCreate", CUBLAS_STATUS_ALLOC_FAILED))
        return (cublasStatus_t)e;
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulPreference_t p = new cublasLtMatmulPreferenceOpaque_t;
    memset(p, 0, sizeof *p);
    p->data[P_MAGIC] = PREF_MAGIC;
    *pref = p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    injected("cublasLtMatmulPreferenceDestroy", 0);
    if (!pref)
        return CUBLAS_STATUS_SUCCESS;
    if (pref->data[P_MAGIC] != PREF_MAGIC)
        return CUBLAS_STATUS_INVALID_VALUE;
    pref->data[P_MAGIC] = 0;
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes)
{
    injected("cublasLtMatmulPreferenceSetAttribute", 0);
    if (!pref || pref->data[P_MAGIC] != PREF_MAGIC || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: ATTR_IN(uint32_t, pref->data[P_SEARCH]); break;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: ATTR_IN(uint64_t, pref->data[P_WORKSPACE]); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                              cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc,
                                              cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc,
                                              cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference,
                                              int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount)
{
    if (int e = injected("cublasLtMatmulAlgoGetHeuristic", CUBLAS_STATUS_NOT_SUPPORTED))
        return (cublasStatus_t)e;
    if (!handle_ok(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (returnAlgoCount)
        *returnAlgoCount = 0;
    if (!preference || preference->data[P_MAGIC] != PREF_MAGIC || requestedAlgoCount < 1 ||
        !heuristicResultsArray || !returnAlgoCount)
        return CUBLAS_STATUS_INVALID_VALUE;
    Problem p;
    if (cublasStatus_t s = check_problem(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p))
        return s;
    cublasLtMatmulAlgo_t algo;
    const char *env = getenv("KVG_EMU_LT_ALGO");
    bool mdep;
    {
        std::lock_guard<std::recursive_mutex> g(lock());
        mdep = m_dependent() || (env && strcmp(env, "m-dependent") == 0);
    }
    memset(&algo, 0, sizeof algo);
    algo.data[A_MAGIC] = ALGO_MAGIC;
    algo.data[A_ID] = mdep ? MDEP_ALGO_ID : FAKE_ALGO_ID;
    algo.data[A_TILE] = FAKE_TILE_ID;
    algo.data[A_SPLITK] = 1;
    fill_result(p, algo, &heuristicResultsArray[0]);
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t lightHandle,
                                       cublasLtMatmulDesc_t operationDesc,
                                       cublasLtMatrixLayout_t Adesc,
                                       cublasLtMatrixLayout_t Bdesc,
                                       cublasLtMatrixLayout_t Cdesc,
                                       cublasLtMatrixLayout_t Ddesc,
                                       const cublasLtMatmulAlgo_t *algo,
                                       cublasLtMatmulHeuristicResult_t *result)
{
    if (int e = injected("cublasLtMatmulAlgoCheck", CUBLAS_STATUS_INVALID_VALUE))
        return (cublasStatus_t)e;
    if (!handle_ok(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!algo || algo->data[A_MAGIC] != ALGO_MAGIC || !result)
        return CUBLAS_STATUS_INVALID_VALUE;
    Problem p;
    if (cublasStatus_t s = check_problem(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p))
        return s;
    cublasLtMatmulAlgo_t copy = *algo;   /* algo may point into *result */
    fill_result(p, copy, result);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t *algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes)
{
    injected("cublasLtMatmulAlgoConfigSetAttribute", 0);
    if (!algo || algo->data[A_MAGIC] != ALGO_MAGIC || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t *d = algo->data;
    switch (attr) {
    case CUBLASLT_ALGO_CONFIG_ID: ATTR_IN(int32_t, d[A_ID]); break;
    case CUBLASLT_ALGO_CONFIG_TILE_ID: ATTR_IN(uint32_t, d[A_TILE]); break;
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM: {
        if (sizeInBytes != sizeof(int32_t))
            return CUBLAS_STATUS_INVALID_VALUE;
        int32_t v;
        memcpy(&v, buf, sizeof v);
        if (v < 1)
            return CUBLAS_STATUS_INVALID_VALUE;
        d[A_SPLITK] = (uint64_t)v;
        break;
    }
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME: ATTR_IN(uint32_t, d[A_REDUCTION]); break;
    case CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING: ATTR_IN(uint32_t, d[A_SWIZZLE]); break;
    case CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION: ATTR_IN(uint32_t, d[A_CUSTOM]); break;
    case CUBLASLT_ALGO_CONFIG_STAGES_ID: ATTR_IN(uint32_t, d[A_STAGES]); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t *algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    void *buf, size_t sizeInBytes,
                                                    size_t *sizeWritten)
{
    injected("cublasLtMatmulAlgoConfigGetAttribute", 0);
    if (!algo || algo->data[A_MAGIC] != ALGO_MAGIC)
        return CUBLAS_STATUS_INVALID_VALUE;
    const uint64_t *d = algo->data;
    switch (attr) {
    case CUBLASLT_ALGO_CONFIG_ID: ATTR_OUT(int32_t, d[A_ID]);
    case CUBLASLT_ALGO_CONFIG_TILE_ID: ATTR_OUT(uint32_t, d[A_TILE]);
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM: ATTR_OUT(int32_t, d[A_SPLITK]);
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME: ATTR_OUT(uint32_t, d[A_REDUCTION]);
    case CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING: ATTR_OUT(uint32_t, d[A_SWIZZLE]);
    case CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION: ATTR_OUT(uint32_t, d[A_CUSTOM]);
    case CUBLASLT_ALGO_CONFIG_STAGES_ID: ATTR_OUT(uint32_t, d[A_STAGES]);
    default: break;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (int e = injected("cublasLtMatmul", CUBLAS_STATUS_EXECUTION_FAILED))
        return (cublasStatus_t)e;
    if (!handle_ok(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    Problem p;
    if (cublasStatus_t s = check_problem(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p))
        return s;
    if (algo && (algo->data[A_MAGIC] != ALGO_MAGIC || algo->data[A_SPLITK] < 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!alpha || !beta || (workspaceSizeInBytes && !workspace) || !valid_stream(stream))
        return CUBLAS_STATUS_INVALID_VALUE;
    float a_scale, b_scale;
    memcpy(&a_scale, alpha, sizeof a_scale);
    memcpy(&b_scale, beta, sizeof b_scale);
    uint64_t m = p.m, n = p.n, k = p.k;
    if (!m || !n)
        return CUBLAS_STATUS_SUCCESS;
    const float *bias = (const float *)(uintptr_t)computeDesc->data[D_BIAS];
    bool read_c = b_scale != 0.0f;   /* beta == 0: C is not read, as in cuBLAS */
    if (!D || (k && (!A || !B)) || (read_c && !C) || (p.bias && !bias))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (C == D && read_c && Cdesc->data[L_LD] != Ddesc->data[L_LD])
        return CUBLAS_STATUS_INVALID_VALUE;
    if ((k && (!matrix_in_device("A", A, Adesc) || !matrix_in_device("B", B, Bdesc))) ||
        (read_c && !matrix_in_device("C", C, Cdesc)) || !matrix_in_device("D", D, Ddesc))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (p.bias && !in_device(bias, m * sizeof(float))) {
        fprintf(stderr, "kvg-emu: cublasLtMatmul: the bias (%p, %zu bytes) is not inside one "
                "device allocation\n", (const void *)bias, (size_t)(m * sizeof(float)));
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (workspaceSizeInBytes && !in_device(workspace, workspaceSizeInBytes))
        return CUBLAS_STATUS_INVALID_VALUE;
    size_t lda = (size_t)Adesc->data[L_LD], ldb = (size_t)Bdesc->data[L_LD];
    size_t ldc = (size_t)Cdesc->data[L_LD], ldd = (size_t)Ddesc->data[L_LD];

    /* The product itself runs in the stream's order; what it reads is captured by value
     * (the descriptors may be changed or destroyed once the call returns). */
    int64_t ab_type = p.ab_type;
    int opa = p.opa, opb = p.opb, has_bias = p.bias;
    /* The M-dependent algorithm (kvg_emu_lt_m_dependent) on a problem wide enough: k
     * summed as two halves. */
    bool halves = algo && (int32_t)algo->data[A_ID] == MDEP_ALGO_ID && n >= MDEP_MIN_N && k >= 2;
    on_stream(stream, [=]() {
        /* op(A) in tiles of TILE rows (gather_tiles), op(B) as columns of k floats. Each
         * output sums its k products in order q = 0, 1, ... (a rounding per multiply and per
         * add, as one at a time); a tile's TILE outputs advance together, reading TILE
         * consecutive floats of A, so that the host vectorizes across outputs, never along
         * k. A tile's rows (8 x k floats) stay in cache while every column of B passes. */
        const size_t TILE = 8, tiles = (m + TILE - 1) / TILE;
        std::vector<float> a(tiles * TILE * k), b(n * k);
        load_rows(a.data(), A, ab_type, opa, m, k, lda, TILE);
        /* op(B)'s column j is row j of B^T: B's "transposed" read is the untransposed op */
        load_rows(b.data(), B, ab_type, !opb, n, k, ldb);
        const float *c = (const float *)C;
        float *d = (float *)D;
        for (size_t i0 = 0; i0 < m; i0 += TILE) {
            const float *at = &a[(i0 / TILE) * k * TILE];
            size_t nt = m - i0 < TILE ? m - i0 : TILE;
            for (size_t j = 0; j < n; j++) {
                const float *bc = &b[j * k];
                float acc[TILE] = { 0 };
                if (halves) {
                    float lo[TILE] = { 0 }, hi[TILE] = { 0 };
                    for (size_t q = 0; q < k / 2; q++)
                        for (size_t t = 0; t < TILE; t++)
                            lo[t] += at[q * TILE + t] * bc[q];
                    for (size_t q = k / 2; q < k; q++)
                        for (size_t t = 0; t < TILE; t++)
                            hi[t] += at[q * TILE + t] * bc[q];
                    for (size_t t = 0; t < TILE; t++)
                        acc[t] = lo[t] + hi[t];
                } else {
                    for (size_t q = 0; q < k; q++)
                        for (size_t t = 0; t < TILE; t++)
                            acc[t] += at[q * TILE + t] * bc[q];
                }
                for (size_t t = 0; t < nt; t++) {
                    size_t i = i0 + t;
                    float v = a_scale * acc[t];
                    if (read_c)
                        v += b_scale * c[i + j * ldc];
                    if (has_bias)
                        v += bias[i];
                    d[i + j * ldd] = v;
                }
            }
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}

void kvg_emu_lt_m_dependent(int on)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    m_dependent() = on != 0;
}

}  // extern "C"
