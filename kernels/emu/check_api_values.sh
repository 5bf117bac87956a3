#!/bin/sh
# Checks that kernels/emu/cuda_emu_api.h gives every enum and constant it declares the
# same value, and the opaque cuBLASLt structs the same size, as the real CUDA headers:
# compiles one printer against each and compares. Needs the CUDA headers only (no GPU,
# no driver, no CUDA library: nothing is called).
#   kernels/emu/check_api_values.sh [CUDA_HOME]      (default /usr/local/cuda)
set -eu
cuda=${1:-/usr/local/cuda}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/values.h" <<'EOV'
#define P(x) printf("%s %ld\n", #x, (long)(x));
int main(void)
{
P(cudaErrorInvalidValue) P(cudaErrorMemoryAllocation) P(cudaErrorInitializationError) P(cudaErrorInvalidConfiguration) P(cudaErrorInsufficientDriver) P(cudaErrorNoDevice) P(cudaErrorInvalidDevice) P(cudaErrorLaunchFailure) P(cudaErrorIllegalAddress) P(cudaErrorNotSupported) P(cudaErrorInvalidResourceHandle) P(cudaErrorLaunchOutOfResources) P(cudaErrorInvalidMemcpyDirection) P(cudaErrorNotReady) P(cudaErrorMisalignedAddress) P(cudaErrorAssert) P(cudaErrorLaunchTimeout) P(cudaErrorNotPermitted) P(cudaErrorUnknown) P(cudaErrorCudartUnloading) P(cudaErrorInvalidPitchValue) P(cudaErrorInvalidSymbol) P(cudaErrorInvalidDevicePointer) P(cudaErrorStubLibrary) P(cudaErrorCallRequiresNewerDriver) P(cudaErrorDevicesUnavailable) P(cudaErrorInvalidKernelImage) P(cudaErrorNoKernelImageForDevice) P(cudaErrorECCUncorrectable) P(cudaErrorHardwareStackError) P(cudaErrorIllegalInstruction) P(cudaErrorInvalidAddressSpace) P(cudaErrorInvalidPc)
P(cudaMemcpyHostToHost) P(cudaMemcpyHostToDevice) P(cudaMemcpyDeviceToHost) P(cudaMemcpyDeviceToDevice) P(cudaMemcpyDefault) P(cudaStreamNonBlocking) P(cudaEventDisableTiming) P(cudaEventBlockingSync)
P(CUDA_R_32F) P(CUDA_R_16F) P(CUDA_R_16BF) P(CUDA_R_64F) P(CUDA_R_8I) P(CUDA_R_32I)
P(CUBLAS_STATUS_SUCCESS) P(CUBLAS_STATUS_NOT_INITIALIZED) P(CUBLAS_STATUS_ALLOC_FAILED) P(CUBLAS_STATUS_INVALID_VALUE) P(CUBLAS_STATUS_ARCH_MISMATCH) P(CUBLAS_STATUS_MAPPING_ERROR) P(CUBLAS_STATUS_EXECUTION_FAILED) P(CUBLAS_STATUS_INTERNAL_ERROR) P(CUBLAS_STATUS_NOT_SUPPORTED) P(CUBLAS_STATUS_LICENSE_ERROR)
P(CUBLAS_OP_N) P(CUBLAS_OP_T) P(CUBLAS_OP_C) P(CUBLAS_COMPUTE_32F) P(CUBLAS_COMPUTE_32F_FAST_16F) P(CUBLAS_COMPUTE_32F_FAST_16BF) P(CUBLAS_COMPUTE_32F_FAST_TF32)
P(CUBLASLT_ORDER_COL) P(CUBLASLT_POINTER_MODE_HOST) P(CUBLASLT_MATRIX_LAYOUT_TYPE) P(CUBLASLT_MATRIX_LAYOUT_ORDER) P(CUBLASLT_MATRIX_LAYOUT_ROWS) P(CUBLASLT_MATRIX_LAYOUT_COLS) P(CUBLASLT_MATRIX_LAYOUT_LD) P(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT)
P(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE) P(CUBLASLT_MATMUL_DESC_SCALE_TYPE) P(CUBLASLT_MATMUL_DESC_POINTER_MODE) P(CUBLASLT_MATMUL_DESC_TRANSA) P(CUBLASLT_MATMUL_DESC_TRANSB) P(CUBLASLT_MATMUL_DESC_TRANSC) P(CUBLASLT_MATMUL_DESC_EPILOGUE) P(CUBLASLT_MATMUL_DESC_BIAS_POINTER) P(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE)
P(CUBLASLT_EPILOGUE_DEFAULT) P(CUBLASLT_EPILOGUE_RELU) P(CUBLASLT_EPILOGUE_BIAS) P(CUBLASLT_EPILOGUE_GELU) P(CUBLASLT_MATMUL_PREF_SEARCH_MODE) P(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
P(CUBLASLT_ALGO_CONFIG_ID) P(CUBLASLT_ALGO_CONFIG_TILE_ID) P(CUBLASLT_ALGO_CONFIG_SPLITK_NUM) P(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) P(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) P(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION) P(CUBLASLT_ALGO_CONFIG_STAGES_ID) P(CUBLASLT_MATMUL_TILE_UNDEFINED) P(CUBLASLT_REDUCTION_SCHEME_NONE) P(CUDART_VERSION)
P(sizeof(cublasLtMatmulAlgo_t)) P(sizeof(cublasLtMatmulHeuristicResult_t)) P(sizeof(cublasLtMatrixLayoutOpaque_t)) P(sizeof(cublasLtMatmulDescOpaque_t)) P(sizeof(cublasLtMatmulPreferenceOpaque_t))
return 0; }
EOV
printf '#include <stdio.h>\n#include <cuda_runtime_api.h>\n#include <cublasLt.h>\n#include "values.h"\n' > "$tmp/real.c"
printf '#include <stdio.h>\n#include "cuda_emu_api.h"\n#include "values.h"\n' > "$tmp/emu.c"
cc -std=gnu11 -w -I"$cuda/include" -I"$tmp" "$tmp/real.c" -o "$tmp/real"
cc -std=gnu11 -w -I"$here" -I"$tmp" "$tmp/emu.c" -o "$tmp/emu"
"$tmp/real" > "$tmp/real.txt"
"$tmp/emu" > "$tmp/emu.txt"
if diff "$tmp/real.txt" "$tmp/emu.txt"; then
    echo "cuda_emu_api.h: $(wc -l < "$tmp/real.txt") values and sizes as in $cuda/include"
else
    echo "cuda_emu_api.h differs from $cuda/include (< real, > emulation)" >&2
    exit 1
fi
