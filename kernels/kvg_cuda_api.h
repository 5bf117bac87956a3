/* The CUDA runtime, cuBLASLt and cuDNN (graph) API as the engine's CUDA backend sees it: the real headers
 * in a CUDA build, the project's emulation (kernels/emu/) when built with KVG_CUDA_EMU.
 * Host code (the C files of engine/cuda/, the launchers in kernels/) includes this and nothing else of
 * CUDA, so one source compiles against either. Valid C and C++. */
#ifndef KVG_CUDA_API_H
#define KVG_CUDA_API_H

#ifdef KVG_CUDA_EMU
#include "cuda_emu_api.h"
#else
#include <cuda_runtime_api.h>
#include <cublasLt.h>
#include <cudnn_graph.h>
#endif

#endif
