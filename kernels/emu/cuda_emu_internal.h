/* What the emulator's own .cc files share: the global lock, the call bookkeeping (call
 * counters, injected faults, the device checks of the environment) and the memory table.
 * Not for kernels or host code. */
#ifndef KVG_CUDA_EMU_INTERNAL_H
#define KVG_CUDA_EMU_INTERNAL_H

#include <functional>
#include <mutex>

#include "cuda_emu.h"

namespace kvg_emu {

/* One lock for the whole emulator: API calls may come from several host threads, and a
 * launch runs its kernel with the lock held (the kernel's static __shared__ storage and
 * the index variables are process-wide). Recursive: cublasLt calls the runtime. */
std::recursive_mutex &lock();

/* Counts a call of `call` and returns the error injected for it (kvg_emu_fail), 0 if
 * none. `dflt` is the error used when the injection did not name one. */
int injected(const char *call, int dflt);

/* The device state as the environment makes it: cudaSuccess, cudaErrorInsufficientDriver
 * (KVG_EMU_DRIVER=old) or cudaErrorNoDevice (KVG_EMU_DEVICES=0). */
cudaError_t device_state();

/* Records `e` as the last error (cudaGetLastError) unless it is cudaSuccess; returns it. */
cudaError_t record(cudaError_t e);

/* [p, p + n) lies inside one device allocation (n = 0: p is inside or at the end of one). */
bool in_device(const void *p, size_t n);

/* [p, p + n) overlaps some device allocation. */
bool touches_device(const void *p, size_t n);

/* A stream the runtime knows (NULL, the default stream, included). */
bool valid_stream(cudaStream_t s);

/* Runs `op` in `stream`'s order (the stream model of cuda_emu_runtime.cc): every
 * asynchronous operation of the emulated runtime and libraries (a copy, a memset, a
 * kernel, a cuBLASLt or cuDNN call) gives its work to this after checking its arguments
 * at the call, as the real APIs check theirs. `op` captures what it needs by value: it
 * may run after the call returned. */
void on_stream(cudaStream_t stream, std::function<void()> op);

/* Prints "kvg-emu: ..." and aborts: an emulated kernel did what would be a bug on a GPU. */
[[noreturn]] void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace kvg_emu

#endif
