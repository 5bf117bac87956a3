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

/* The stream model (cuda_emu_stream.cc): run `s`'s queued work (NULL: the legacy stream)
 * until `upto` operations of it have run; how many were ever queued; everything queued
 * on every stream (a device-wide synchronization). */
void drain_upto(cudaStream_t s, uint64_t upto);
uint64_t stream_enqueued(cudaStream_t s);
void drain_all();

/* Stream capture (cuda_emu_stream.cc): whether `s` captures; marks its capture failed;
 * whether a device-wide call (cudaMalloc, cudaFree, cudaMemcpy, cudaDeviceSynchronize) must
 * be refused now, a global-mode capture being active, which it then invalidates. */
bool capturing(cudaStream_t s);
void invalidate_capture(cudaStream_t s);
bool capture_refuses();

/* The race detector's shadow of a device allocation, dropped when it is freed
 * (cuda_emu_strict.cc). */
void forget_shadow(void *dev);

/* The runtime's memory table, read without the lock (only while a kernel runs, when no
 * allocation can change): the device allocation holding address a (its start and size),
 * and whether a lies in a cudaMallocHost allocation. */
bool device_allocation(uintptr_t a, uintptr_t *lo, size_t *size);
bool pinned_allocation(uintptr_t a);

/* KVG_EMU_SEED (default 1): the seed of the kernels' block and thread orders; 0 runs them
 * in index order. */
uint64_t schedule_seed();

/* The scheduler (cuda_emu_fiber.cc): whether a lies in some fiber's stack; a fatal
 * message naming the running kernel and block. */
bool in_fiber_stack(uintptr_t a);
[[noreturn]] void kernel_fatal_msg(const char *what);

/* The strict checks (cuda_emu_strict.cc), driven by the scheduler. */
namespace strict {
struct Now {
    bool in_kernel;              /* a fiber runs kernel code */
    bool checking;               /* this launch is checked (KVG_EMU_STRICT, not ASan) */
    uintptr_t stack_lo;          /* the running fiber's stack */
    size_t stack_size;
    unsigned tid;                /* its linear index in the block */
};
extern Now now;
void launch_begin(const void *ctx, size_t ctx_size, const void *smem, size_t smem_size);
void block_begin();
void barrier();                  /* a __syncthreads released the block */
void warp_op(unsigned warp);     /* a warp operation of that warp completed */
void launch_end();
void reset();                    /* kvg_emu_reset: the environment read again */
void access(uintptr_t a, size_t n, bool write);
}  // namespace strict

/* Every runtime API call starts with this: the lock, the call counted, an injected fault
 * or the environment's device state returned (and recorded as the last error). */
#define EMU_CALL(name, dflt)                                                    \
    std::lock_guard<std::recursive_mutex> guard_(lock());                       \
    if (cudaError_t e_ = device_state())                                        \
        return injected(name, 0), record(e_);                                   \
    if (int i_ = injected(name, dflt))                                          \
        return record((cudaError_t)i_)

/* Prints "kvg-emu: ..." and aborts: an emulated kernel did what would be a bug on a GPU. */
[[noreturn]] void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace kvg_emu

#endif
