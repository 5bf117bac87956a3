/* The subset of the CUDA 13 runtime and cuBLASLt host API that the engine uses, emulated
 * on the host (kernels/emu/ .cc files). Names, signatures, enum names and numeric values are
 * CUDA 13's (driver_types.h, cuda_runtime_api.h, library_types.h, cublas_api.h,
 * cublasLt.h), so host code compiles unchanged against either; only what is listed here
 * exists. Valid C (gnu11) and C++.
 *
 * The emulated device: one device, "kvgate emulated device (host)", sm 9.0, 132 SMs,
 * KVG_EMU_MEMORY bytes of memory (env, default 2 GiB; suffixes K, M, G). "Device" memory
 * is host memory the emulator tracks: cudaMemcpy* and cublasLtMatmul check that a device
 * range lies inside one device allocation; fresh cudaMalloc memory is 0xFF bytes (NaN as
 * F32/F16/BF16). Asynchronous work (kernels, async copies, memsets, cuBLASLt) is queued
 * on its stream and runs at the next synchronization point that waits for it, in stream
 * order (kernels/emu/cuda_emu_stream.cc): streams the program did not order stay
 * unordered, and the host sees a result only once it synchronized. Environment (read at the first call, again at
 * kvg_emu_reset()):
 *   KVG_EMU_DEVICES=0     no device: cudaGetDeviceCount and every device call fail with
 *                         cudaErrorNoDevice
 *   KVG_EMU_DRIVER=old    every runtime call fails with cudaErrorInsufficientDriver
 *   KVG_EMU_MEMORY=BYTES  the device's memory
 *   KVG_EMU_FAIL=call:nth[:error][,call:nth[:error]...]   as kvg_emu_fail() */
#ifndef KVG_CUDA_EMU_API_H
#define KVG_CUDA_EMU_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the runtime ---------------------------------------------------------------- */

#define CUDART_VERSION 13000

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorCudartUnloading = 4,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorInvalidSymbol = 13,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorStubLibrary = 34,
    cudaErrorInsufficientDriver = 35,
    cudaErrorCallRequiresNewerDriver = 36,
    cudaErrorDevicesUnavailable = 46,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidKernelImage = 200,
    cudaErrorECCUncorrectable = 214,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchTimeout = 702,
    cudaErrorAssert = 710,
    cudaErrorHardwareStackError = 714,
    cudaErrorIllegalInstruction = 715,
    cudaErrorMisalignedAddress = 716,
    cudaErrorInvalidAddressSpace = 717,
    cudaErrorInvalidPc = 718,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotPermitted = 800,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorUnknown = 999
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;

enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2
};

/* CUDA's struct has many more members; these are the ones the emulation fills in. */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    size_t totalConstMem;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int major;
    int minor;
    int multiProcessorCount;
    int l2CacheSize;
    int maxThreadsPerMultiProcessor;
};

const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDriverGetVersion(int *driverVersion);
cudaError_t cudaRuntimeGetVersion(int *runtimeVersion);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream);

cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);

/* Stream capture and graphs. While a stream captures, its asynchronous work is recorded,
 * not queued; a graph launch queues a copy of every recorded operation on its stream
 * (a kernel's arguments as they were at capture, as in CUDA). What CUDA refuses during a
 * capture is refused here and invalidates it (cudaStreamEndCapture then fails with
 * cudaErrorStreamCaptureInvalidated): synchronizing or querying the capturing stream,
 * cudaDeviceSynchronize, cudaMalloc, cudaFree, cudaMemcpy, a copy to or from pageable
 * host memory, and work on the legacy stream: in global mode from any thread, in
 * thread-local mode from the capturing thread, never in relaxed mode. */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

/* ---- library types and cuBLAS ---------------------------------------------------- */

enum cudaDataType_t {
    CUDA_R_16F = 2,
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_8I = 3,
    CUDA_R_32I = 10,
    CUDA_R_16BF = 14
};
typedef enum cudaDataType_t cudaDataType_t;
typedef enum cudaDataType_t cudaDataType;

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum {
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_OP_C = 2
} cublasOperation_t;

typedef enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77
} cublasComputeType_t;

/* ---- cuBLASLt --------------------------------------------------------------------- */

typedef struct cublasLtContext *cublasLtHandle_t;

/* Opaque descriptors: in cuBLASLt they are structs of uint64_t data[]; here the data
 * holds the emulator's own fields (the sizes are cuBLASLt's). */
typedef struct { uint64_t data[8]; } cublasLtMatrixLayoutOpaque_t;
typedef cublasLtMatrixLayoutOpaque_t *cublasLtMatrixLayout_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct { uint64_t data[32]; } cublasLtMatmulDescOpaque_t;
typedef cublasLtMatmulDescOpaque_t *cublasLtMatmulDesc_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulPreferenceOpaque_t;
typedef cublasLtMatmulPreferenceOpaque_t *cublasLtMatmulPreference_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum {
    CUBLASLT_ORDER_COL = 0
} cublasLtOrder_t;

typedef enum {
    CUBLASLT_POINTER_MODE_HOST = 0
} cublasLtPointerMode_t;

typedef enum {
    CUBLASLT_MATRIX_LAYOUT_TYPE = 0,        /* uint32_t (cudaDataType) */
    CUBLASLT_MATRIX_LAYOUT_ORDER = 1,       /* int32_t; only CUBLASLT_ORDER_COL */
    CUBLASLT_MATRIX_LAYOUT_ROWS = 2,        /* uint64_t */
    CUBLASLT_MATRIX_LAYOUT_COLS = 3,        /* uint64_t */
    CUBLASLT_MATRIX_LAYOUT_LD = 4,          /* int64_t */
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5  /* int32_t; only 1 */
} cublasLtMatrixLayoutAttribute_t;

typedef enum {
    CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,  /* int32_t */
    CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,    /* int32_t */
    CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,  /* int32_t; only CUBLASLT_POINTER_MODE_HOST */
    CUBLASLT_MATMUL_DESC_TRANSA = 3,        /* int32_t (cublasOperation_t) */
    CUBLASLT_MATMUL_DESC_TRANSB = 4,        /* int32_t */
    CUBLASLT_MATMUL_DESC_TRANSC = 5,        /* int32_t; only CUBLAS_OP_N */
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,      /* uint32_t (cublasLtEpilogue_t) */
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,  /* const void * */
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26 /* int32_t; -1 (default) = the type of D */
} cublasLtMatmulDescAttributes_t;

typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_RELU = 2,             /* not supported by the emulation */
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_GELU = 32             /* not supported by the emulation */
} cublasLtEpilogue_t;

typedef enum {
    CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,          /* uint32_t */
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1   /* uint64_t */
} cublasLtMatmulPreferenceAttributes_t;

typedef enum {
    CUBLASLT_ALGO_CONFIG_ID = 0,                /* int32_t */
    CUBLASLT_ALGO_CONFIG_TILE_ID = 1,           /* uint32_t */
    CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2,        /* int32_t */
    CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME = 3,  /* uint32_t */
    CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING = 4,     /* uint32_t */
    CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION = 5,     /* uint32_t */
    CUBLASLT_ALGO_CONFIG_STAGES_ID = 6          /* uint32_t */
} cublasLtMatmulAlgoConfigAttributes_t;

#define CUBLASLT_MATMUL_TILE_UNDEFINED 0
#define CUBLASLT_REDUCTION_SCHEME_NONE 0

const char *cublasLtGetStatusName(cublasStatus_t status);
const char *cublasLtGetStatusString(cublasStatus_t status);

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType,
                                        cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              void *buf, size_t sizeInBytes, size_t *sizeWritten);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes);

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                              cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc,
                                              cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc,
                                              cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference,
                                              int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount);
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t lightHandle,
                                       cublasLtMatmulDesc_t operationDesc,
                                       cublasLtMatrixLayout_t Adesc,
                                       cublasLtMatrixLayout_t Bdesc,
                                       cublasLtMatrixLayout_t Cdesc,
                                       cublasLtMatrixLayout_t Ddesc,
                                       const cublasLtMatmulAlgo_t *algo,
                                       cublasLtMatmulHeuristicResult_t *result);
cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t *algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t *algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    void *buf, size_t sizeInBytes,
                                                    size_t *sizeWritten);

/* D = alpha op(A) op(B) + beta C (+ bias per row of D), column-major. The emulation is a
 * host reference GEMM: A and B both F32, F16 or BF16, C and D F32, accumulation in F32
 * over k in increasing order whatever the algorithm (SPLITK_NUM > 1 computes the same
 * values). */
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream);

/* ---- emulator-only functions (no CUDA counterpart; tests use them) ----------------- */

/* Makes the nth next call (1 = the very next) of `call` fail with `error` (a cudaError_t,
 * or a cublasStatus_t for cublasLt* calls; 0 = a plausible one for that call). `call` is
 * an API function's name ("cudaMalloc", "cudaMemcpyAsync", "cublasLtMatmul", ...) or
 * "launch" for any kernel launch (the kernel does not run; the error is the launch's,
 * read by cudaGetLastError). Injected failures are not sticky: later calls succeed. */
void kvg_emu_fail(const char *call, int nth, int error);

/* Forgets injected faults and the last error, resets the call counters and re-reads the
 * environment (KVG_EMU_DEVICES, KVG_EMU_DRIVER, KVG_EMU_MEMORY, KVG_EMU_FAIL). Live
 * allocations, streams and handles stay valid. */
void kvg_emu_reset(void);

/* Bytes currently allocated by cudaMalloc and cudaMallocHost together (0 once a backend
 * freed everything). */
size_t kvg_emu_bytes_in_use(void);

/* How many times `call` (an API function's name, or "launch") was made since the start
 * or the last kvg_emu_reset(), failed calls included. */
long kvg_emu_calls(const char *call);

/* Operations queued on all streams that have not run yet. */
long kvg_emu_pending(void);

/* Fiber switches made by kernel launches so far (the emulator's own cost figure). */
long kvg_emu_switches(void);

/* The algorithm the emulated cuBLASLt's heuristic offers. 0 (the default): one whose
 * reduction over k is the same for every problem size (each output sums its k products
 * in order). 1: one whose order depends on n, the number of columns of D (the engine's
 * M), as a stream-K kernel's may, and which SPLITK_NUM = 1 does not change: from n = 8 on,
 * each output sums the two halves of k apart and adds them at the end. Stays until set
 * again (kvg_emu_reset does not touch it); KVG_EMU_LT_ALGO=m-dependent in the
 * environment, read at each heuristic call, also selects 1. */
void kvg_emu_lt_m_dependent(int on);

#ifdef __cplusplus
}
#endif

/* cuDNN's graph API (the attention's SDPA). */
#include "cuda_emu_cudnn.h"

#endif
