/* The emulated CUDA runtime: device queries, memory, copies, streams, events, errors and
 * fault injection (see cuda_emu_api.h for what each call does here). Kernels run in
 * cuda_emu_fiber.cc, cuBLASLt in cuda_emu_cublaslt.cc.
 *
 * "Device" memory is ordinary host memory from posix_memalign, recorded in a table of
 * address ranges, so ASan's redzones around each allocation catch a kernel reading or
 * writing past it. Copies check each side against the table: a device side must lie
 * inside one device allocation, a host side must not touch any. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_emu_internal.h"

namespace kvg_emu {

namespace {

struct Alloc {
    size_t size;
    bool device;
};

struct Fault {
    std::string call;
    int nth;
    int error;
};

struct State {
    bool inited = false;
    int devices = 1;
    bool old_driver = false;
    size_t memory = (size_t)2 << 30;
    uint64_t seed = 1;
    cudaError_t last = cudaSuccess;
    int device = 0;
    std::map<uintptr_t, Alloc> allocs;
    size_t device_bytes = 0, host_bytes = 0;
    std::vector<Fault> faults;
    std::map<std::string, long, std::less<>> calls;
};

State &st()
{
    static State s;
    return s;
}

size_t parse_size(const char *v)
{
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno || end == v)
        fatal("KVG_EMU_MEMORY=%s: not a size", v);
    switch (*end) {
    case 'k': case 'K': n <<= 10; end++; break;
    case 'm': case 'M': n <<= 20; end++; break;
    case 'g': case 'G': n <<= 30; end++; break;
    default: break;
    }
    if (*end)
        fatal("KVG_EMU_MEMORY=%s: not a size", v);
    return (size_t)n;
}

void add_fault(const char *call, int nth, int error)
{
    st().faults.push_back(Fault{call, nth, error});
}

/* KVG_EMU_FAIL=call:nth[:error][,...]. A malformed list aborts: a test that set it
 * expects the failure, and silently ignoring it would let that test pass vacuously. */
void parse_faults(const char *v)
{
    std::string all(v);
    size_t pos = 0;
    while (pos <= all.size()) {
        size_t comma = all.find(',', pos);
        std::string item = all.substr(pos, comma == std::string::npos ? std::string::npos
                                                                      : comma - pos);
        pos = comma == std::string::npos ? all.size() + 1 : comma + 1;
        if (item.empty())
            continue;
        size_t c1 = item.find(':');
        if (c1 == std::string::npos || c1 == 0)
            fatal("KVG_EMU_FAIL=%s: expected call:nth[:error]", v);
        std::string call = item.substr(0, c1);
        const char *rest = item.c_str() + c1 + 1;
        char *end;
        long nth = strtol(rest, &end, 10);
        long error = 0;
        if (end == rest || nth < 1)
            fatal("KVG_EMU_FAIL=%s: expected call:nth[:error] with nth >= 1", v);
        if (*end == ':') {
            const char *e = end + 1;
            error = strtol(e, &end, 10);
            if (end == e)
                fatal("KVG_EMU_FAIL=%s: expected call:nth[:error]", v);
        }
        if (*end)
            fatal("KVG_EMU_FAIL=%s: expected call:nth[:error]", v);
        add_fault(call.c_str(), (int)nth, (int)error);
    }
}

void init_locked()
{
    State &s = st();
    if (s.inited)
        return;
    s.inited = true;
    const char *v = getenv("KVG_EMU_DEVICES");
    s.devices = v && strcmp(v, "0") == 0 ? 0 : 1;
    v = getenv("KVG_EMU_DRIVER");
    s.old_driver = v && strcmp(v, "old") == 0;
    v = getenv("KVG_EMU_MEMORY");
    s.memory = v && *v ? parse_size(v) : (size_t)2 << 30;
    v = getenv("KVG_EMU_FAIL");
    if (v && *v)
        parse_faults(v);
    v = getenv("KVG_EMU_SEED");
    if (v && *v) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(v, &end, 10);
        if (errno || end == v || *end)
            fatal("KVG_EMU_SEED=%s: not a number", v);
        s.seed = n;
    } else {
        s.seed = 1;
    }
}

/* [p, p + n) inside one cudaMallocHost allocation (pinned: the device reads and writes
 * it when the copy runs, not at the call). */
bool in_pinned(const void *p, size_t n)
{
    auto &m = st().allocs;
    uintptr_t a = (uintptr_t)p;
    auto it = m.upper_bound(a);
    if (it == m.begin())
        return false;
    --it;
    return !it->second.device && a >= it->first && n <= it->second.size &&
           a - it->first <= it->second.size - n;
}

/* The side of a copy: 1 device, 0 host, -1 neither (straddles or is partly device). */
int side(const void *p, size_t n)
{
    if (in_device(p, n))
        return 1;
    return touches_device(p, n) ? -1 : 0;
}

/* A copy's work queued on `stream` (NULL: the legacy stream), as CUDA orders it:
 * - from pageable host memory, the bytes are taken at the call (the real runtime stages
 *   them before returning), so the caller may reuse its buffer at once;
 * - to pageable host memory, the call returns once the copy has run (the stream drained up
 *   to it): the caller may read its buffer;
 * - pinned host memory and device memory are read and written when the copy runs. */
cudaError_t enqueue_copy(void *dst, const void *src, size_t count, int ds, int ss_, cudaStream_t stream,
                         bool synchronous)
{
    bool src_pageable = ss_ == 0 && !in_pinned(src, count);
    bool dst_pageable = ds == 0 && !in_pinned(dst, count);
    if ((src_pageable || dst_pageable) && capturing(stream)) {
        invalidate_capture(stream);
        return cudaErrorStreamCaptureUnsupported;
    }
    if (src_pageable) {
        auto bytes = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                                  (const unsigned char *)src + count);
        on_stream(stream, [dst, bytes]() { memcpy(dst, bytes->data(), bytes->size()); });
    } else {
        /* memcpy, not memmove: overlapping copies are undefined in CUDA too, and ASan's
         * memcpy reports the overlap. */
        on_stream(stream, [dst, src, count]() { memcpy(dst, src, count); });
    }
    if (synchronous || dst_pageable)
        drain_upto(stream, stream_enqueued(stream));
    return cudaSuccess;
}

cudaError_t copy(void *dst, const void *src, size_t count, cudaMemcpyKind kind,
                 cudaStream_t stream, bool synchronous)
{
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return record(cudaErrorInvalidMemcpyDirection);
    if (count == 0)
        return cudaSuccess;
    if (!dst || !src)
        return record(cudaErrorInvalidValue);
    int ds = side(dst, count), ss = side(src, count);
    if (ds < 0 || ss < 0)
        return record(cudaErrorInvalidValue);
    bool ok;
    switch (kind) {
    case cudaMemcpyHostToHost: ok = ds == 0 && ss == 0; break;
    case cudaMemcpyHostToDevice: ok = ds == 1 && ss == 0; break;
    case cudaMemcpyDeviceToHost: ok = ds == 0 && ss == 1; break;
    case cudaMemcpyDeviceToDevice: ok = ds == 1 && ss == 1; break;
    default: ok = true; break;
    }
    if (!ok)
        return record(cudaErrorInvalidValue);
    return record(enqueue_copy(dst, src, count, ds, ss, stream, synchronous));
}

const char *default_name(cudaError_t e)
{
    switch (e) {
#define N(x) case x: return #x;
    N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation)
    N(cudaErrorInitializationError) N(cudaErrorCudartUnloading) N(cudaErrorInvalidConfiguration)
    N(cudaErrorInvalidPitchValue) N(cudaErrorInvalidSymbol) N(cudaErrorInvalidDevicePointer)
    N(cudaErrorInvalidMemcpyDirection) N(cudaErrorStubLibrary) N(cudaErrorInsufficientDriver)
    N(cudaErrorCallRequiresNewerDriver) N(cudaErrorDevicesUnavailable) N(cudaErrorNoDevice)
    N(cudaErrorInvalidDevice) N(cudaErrorInvalidKernelImage) N(cudaErrorNoKernelImageForDevice)
    N(cudaErrorInvalidResourceHandle) N(cudaErrorNotReady) N(cudaErrorIllegalAddress)
    N(cudaErrorLaunchOutOfResources) N(cudaErrorLaunchTimeout) N(cudaErrorAssert)
    N(cudaErrorMisalignedAddress) N(cudaErrorLaunchFailure) N(cudaErrorNotPermitted)
    N(cudaErrorNotSupported) N(cudaErrorUnknown) N(cudaErrorECCUncorrectable)
    N(cudaErrorHardwareStackError) N(cudaErrorIllegalInstruction) N(cudaErrorInvalidAddressSpace)
    N(cudaErrorInvalidPc) N(cudaErrorStreamCaptureUnsupported) N(cudaErrorStreamCaptureInvalidated)
    N(cudaErrorStreamCaptureImplicit)
#undef N
    }
    return nullptr;
}

}  // namespace

std::recursive_mutex &lock()
{
    static std::recursive_mutex m;
    return m;
}

int injected(const char *call, int dflt)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    State &s = st();
    init_locked();
    auto it = s.calls.find(std::string_view(call));
    if (it == s.calls.end())
        s.calls.emplace(call, 1);
    else
        it->second++;
    for (size_t i = 0; i < s.faults.size(); i++) {
        Fault &f = s.faults[i];
        if (f.call != call || --f.nth > 0)
            continue;
        int e = f.error ? f.error : dflt;
        s.faults.erase(s.faults.begin() + (long)i);
        return e;
    }
    return 0;
}

cudaError_t device_state()
{
    std::lock_guard<std::recursive_mutex> g(lock());
    init_locked();
    if (st().old_driver)
        return cudaErrorInsufficientDriver;
    return st().devices ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t record(cudaError_t e)
{
    if (e != cudaSuccess) {
        std::lock_guard<std::recursive_mutex> g(lock());
        st().last = e;
    }
    return e;
}

bool in_device(const void *p, size_t n)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    auto &m = st().allocs;
    uintptr_t a = (uintptr_t)p;
    auto it = m.upper_bound(a);
    if (it == m.begin())
        return false;
    --it;
    return it->second.device && a >= it->first && n <= it->second.size &&
           a - it->first <= it->second.size - n;
}

uint64_t schedule_seed()
{
    std::lock_guard<std::recursive_mutex> g(lock());
    init_locked();
    return st().seed;
}

bool device_allocation(uintptr_t a, uintptr_t *lo, size_t *size)
{
    auto &m = st().allocs;
    auto it = m.upper_bound(a);
    if (it == m.begin())
        return false;
    --it;
    if (!it->second.device || a - it->first >= it->second.size)
        return false;
    *lo = it->first;
    *size = it->second.size;
    return true;
}

bool pinned_allocation(uintptr_t a)
{
    auto &m = st().allocs;
    auto it = m.upper_bound(a);
    if (it == m.begin())
        return false;
    --it;
    return !it->second.device && a - it->first < it->second.size;
}

bool touches_device(const void *p, size_t n)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    auto &m = st().allocs;
    uintptr_t a = (uintptr_t)p, end = n > UINTPTR_MAX - a ? UINTPTR_MAX : a + n;
    auto it = m.upper_bound(a);
    if (it != m.begin()) {
        auto prev = std::prev(it);
        if (prev->second.device && a < prev->first + prev->second.size)
            return true;
    }
    for (; it != m.end() && it->first < end; ++it)
        if (it->second.device)
            return true;
    return false;
}

void fatal(const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fputs("kvg-emu: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

}  // namespace kvg_emu

using namespace kvg_emu;

extern "C" {

const char *cudaGetErrorName(cudaError_t error)
{
    const char *n = default_name(error);
    return n ? n : "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorCudartUnloading: return "driver shutting down";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchTimeout: return "the launch timed out and was terminated";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorIllegalInstruction: return "an illegal instruction was encountered";
    case cudaErrorECCUncorrectable: return "uncorrectable ECC error encountered";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorNotPermitted: return "operation not permitted";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
        return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorUnknown: return "unknown error";
    default: break;
    }
    return default_name(error) ? default_name(error) : "unrecognized error code";
}

cudaError_t cudaGetLastError(void)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    injected("cudaGetLastError", 0);
    cudaError_t e = st().last;
    st().last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    injected("cudaPeekAtLastError", 0);
    return st().last;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (count)
        *count = 0;
    if (cudaError_t e = device_state())
        return injected("cudaGetDeviceCount", 0), record(e);
    if (int i = injected("cudaGetDeviceCount", cudaErrorNoDevice))
        return record((cudaError_t)i);
    if (!count)
        return record(cudaErrorInvalidValue);
    *count = st().devices;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    EMU_CALL("cudaSetDevice", cudaErrorInvalidDevice);
    if (device < 0 || device >= st().devices)
        return record(cudaErrorInvalidDevice);
    st().device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    EMU_CALL("cudaGetDevice", cudaErrorInvalidValue);
    if (!device)
        return record(cudaErrorInvalidValue);
    *device = st().device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    EMU_CALL("cudaGetDeviceProperties", cudaErrorInvalidDevice);
    if (!prop)
        return record(cudaErrorInvalidValue);
    if (device < 0 || device >= st().devices)
        return record(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "kvgate emulated device (host)");
    prop->totalGlobalMem = st().memory;
    prop->sharedMemPerBlock = 48 << 10;
    prop->sharedMemPerBlockOptin = 227 << 10;
    prop->totalConstMem = 64 << 10;
    prop->regsPerBlock = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = 1024;
    prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647;
    prop->maxGridSize[1] = 65535;
    prop->maxGridSize[2] = 65535;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;
    prop->l2CacheSize = 50 << 20;
    prop->maxThreadsPerMultiProcessor = 2048;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    injected("cudaDriverGetVersion", 0);
    if (!driverVersion)
        return record(cudaErrorInvalidValue);
    /* An old driver still reports its version: that is how a program explains the error. */
    *driverVersion = device_state() == cudaErrorInsufficientDriver ? 11040 : 13000;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    injected("cudaRuntimeGetVersion", 0);
    if (!runtimeVersion)
        return record(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    EMU_CALL("cudaMalloc", cudaErrorMemoryAllocation);
    if (capture_refuses())
        return record(cudaErrorStreamCaptureUnsupported);
    if (!devPtr)
        return record(cudaErrorInvalidValue);
    *devPtr = nullptr;
    if (size == 0)
        return cudaSuccess;
    State &s = st();
    if (size > s.memory || s.device_bytes > s.memory - size)
        return record(cudaErrorMemoryAllocation);
    void *p;
    /* 256-byte aligned like the CUDA allocator; exactly `size` bytes so that ASan's
     * redzone starts right after the allocation. */
    if (posix_memalign(&p, 256, size))
        return record(cudaErrorMemoryAllocation);
    /* Fresh device memory is not zeros on a GPU either: here it is all 0xFF bytes, a NaN
     * as F32, F16 and BF16 (and -1 as an integer), so a kernel or GEMM that reads memory
     * nobody wrote spoils its results loudly instead of adding a tiny garbage value. */
    memset(p, 0xFF, size);
    s.allocs[(uintptr_t)p] = Alloc{size, true};
    s.device_bytes += size;
    *devPtr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr)
{
    EMU_CALL("cudaFree", cudaErrorInvalidValue);
    if (!devPtr)
        return cudaSuccess;
    if (capture_refuses())
        return record(cudaErrorStreamCaptureUnsupported);
    auto it = st().allocs.find((uintptr_t)devPtr);
    if (it == st().allocs.end() || !it->second.device)
        return record(cudaErrorInvalidValue);
    drain_all();               /* cudaFree waits for the device, as the real one does */
    forget_shadow(devPtr);
    st().device_bytes -= it->second.size;
    st().allocs.erase(it);
    free(devPtr);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    EMU_CALL("cudaMallocHost", cudaErrorMemoryAllocation);
    if (!ptr)
        return record(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (size == 0)
        return cudaSuccess;
    void *p;
    if (posix_memalign(&p, 64, size))
        return record(cudaErrorMemoryAllocation);
    st().allocs[(uintptr_t)p] = Alloc{size, false};
    st().host_bytes += size;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    EMU_CALL("cudaFreeHost", cudaErrorInvalidValue);
    if (!ptr)
        return cudaSuccess;
    auto it = st().allocs.find((uintptr_t)ptr);
    if (it == st().allocs.end() || it->second.device)
        return record(cudaErrorInvalidValue);
    drain_all();
    st().host_bytes -= it->second.size;
    st().allocs.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    EMU_CALL("cudaMemGetInfo", cudaErrorInvalidValue);
    if (!free_bytes || !total)
        return record(cudaErrorInvalidValue);
    *total = st().memory;
    *free_bytes = st().memory > st().device_bytes ? st().memory - st().device_bytes : 0;
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    EMU_CALL("cudaMemcpy", cudaErrorInvalidValue);
    if (capture_refuses())
        return record(cudaErrorStreamCaptureUnsupported);
    return copy(dst, src, count, kind, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    EMU_CALL("cudaMemcpyAsync", cudaErrorInvalidValue);
    if (!valid_stream(stream))
        return record(cudaErrorInvalidResourceHandle);
    return copy(dst, src, count, kind, stream, false);
}

/* Queued on the stream (cudaMemset: the legacy one); asynchronous for device memory, as
 * in CUDA. */
static cudaError_t set_bytes(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    if (!devPtr || !in_device(devPtr, count))
        return record(cudaErrorInvalidValue);
    on_stream(stream, [devPtr, value, count]() { memset(devPtr, value, count); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    EMU_CALL("cudaMemset", cudaErrorInvalidValue);
    return set_bytes(devPtr, value, count, nullptr);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    EMU_CALL("cudaMemsetAsync", cudaErrorInvalidValue);
    if (!valid_stream(stream))
        return record(cudaErrorInvalidResourceHandle);
    return set_bytes(devPtr, value, count, stream);
}

void kvg_emu_fail(const char *call, int nth, int error)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    init_locked();
    if (!call || nth < 1)
        fatal("kvg_emu_fail(%s, %d): needs a call name and nth >= 1", call ? call : "NULL", nth);
    add_fault(call, nth, error);
}

void kvg_emu_reset(void)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    drain_all();               /* nothing a test left queued runs into the next one */
    State &s = st();
    s.faults.clear();
    s.calls.clear();
    s.last = cudaSuccess;
    s.inited = false;
    init_locked();
    strict::reset();
}

size_t kvg_emu_bytes_in_use(void)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    return st().device_bytes + st().host_bytes;
}

long kvg_emu_calls(const char *call)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    auto it = st().calls.find(std::string_view(call));
    return it == st().calls.end() ? 0 : it->second;
}

}  // extern "C"
