/* The CUDA execution model on the host: force-included (g++ -include) when a .cu file is
 * compiled as host C++17 with -DKVG_CUDA_EMU, so the same kernels that nvcc builds for a GPU
 * run here under the unit tests, ASan and UBSan.
 *
 * What a kernel may use is exactly the list in the design (docs: "Device-side surface"):
 * qualifiers, dim3/uint3 and the index variables, __syncthreads, warp shuffles and votes,
 * atomics, the math intrinsics, the BF16/F16 types and kvg_emu_launch / kvg_emu_dynamic_smem.
 *
 * The model: a launch is queued on its stream and runs when the host synchronizes with it
 * (kernels/emu/cuda_emu_stream.cc); its blocks run one after another in a seeded random
 * order, the threads of a block are fibers (kernels/emu/cuda_emu_fiber.cc) resumed in a
 * seeded random order between barriers, and every barrier
 * (__syncthreads, __syncwarp, a shuffle, a vote) is a real rendezvous: the fiber parks
 * until all the block's (or the mask's) live threads arrive. A thread that exited does
 * not count for __syncthreads, nor in a warp operation's mask (as on a GPU); a shuffle
 * reading an exited, absent (partial warp) or unmasked lane, threads waiting at different
 * __syncthreads, or a deadlock abort with a message naming the kernel: each is a bug that
 * would hang or read garbage on a GPU.
 *
 * Device memory is host memory (the allocations of cudaMalloc), so an out-of-bounds
 * access by a kernel is caught by AddressSanitizer in the ASan build: that is how the
 * emulated tests find them. `__shared__` is `static` (blocks run one at a time, so the
 * block's threads share it and no two blocks overlap). */
#ifndef KVG_CUDA_EMU_H
#define KVG_CUDA_EMU_H

#ifndef __cplusplus
#error "cuda_emu.h is the device side of the emulation: compile the .cu file as C++"
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_emu_api.h"

/* ---- qualifiers --------------------------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static

/* ---- index types and variables ------------------------------------------------------ */

struct uint3 {
    unsigned int x, y, z;
};

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

/* Set by the scheduler whenever it resumes a fiber (kernels/emu/cuda_emu_fiber.cc). The
 * barriers are calls into the runtime, so the compiler reloads these after each one. One
 * struct, so that the strict checks know a kernel may read it and never write it. */
struct kvg_emu_index {
    uint3 thread, block;
    dim3 block_dim, grid_dim;
};
extern kvg_emu_index kvg_emu_idx;
#define threadIdx (kvg_emu_idx.thread)
#define blockIdx (kvg_emu_idx.block)
#define blockDim (kvg_emu_idx.block_dim)
#define gridDim (kvg_emu_idx.grid_dim)
static constexpr int warpSize = 32;

/* ---- barriers, shuffles and votes --------------------------------------------------- */

/* The runtime side (kernels/emu/cuda_emu_fiber.cc). `line` tells __syncthreads call sites
 * apart: threads of one block waiting at different ones is a bug. */
void kvg_emu_syncthreads(const char *file, int line);

enum kvg_emu_warp_kind {
    KVG_EMU_WARP_SYNC = 0,
    KVG_EMU_WARP_SHFL_IDX,
    KVG_EMU_WARP_SHFL_XOR,
    KVG_EMU_WARP_SHFL_DOWN,
    KVG_EMU_WARP_SHFL_UP,
    KVG_EMU_WARP_BALLOT
};
/* One warp-synchronous operation of the calling lane: waits for every lane of `mask`,
 * then returns the value of the lane the operation names (shuffles) or the mask of lanes
 * whose value was non-zero (ballot). */
uint64_t kvg_emu_warp_op(int kind, unsigned mask, uint64_t value, int arg, int width);

#define __syncthreads() kvg_emu_syncthreads(__FILE__, __LINE__)

inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    kvg_emu_warp_op(KVG_EMU_WARP_SYNC, mask, 0, 0, 32);
}

template <class T>
inline T kvg_emu_shfl(int kind, unsigned mask, T var, int arg, int width)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "shuffles move values of up to 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &var, sizeof var);
    bits = kvg_emu_warp_op(kind, mask, bits, arg, width);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

template <class T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32)
{
    return kvg_emu_shfl(KVG_EMU_WARP_SHFL_IDX, mask, var, srcLane, width);
}

template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32)
{
    return kvg_emu_shfl(KVG_EMU_WARP_SHFL_XOR, mask, var, laneMask, width);
}

template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = 32)
{
    return kvg_emu_shfl(KVG_EMU_WARP_SHFL_DOWN, mask, var, (int)delta, width);
}

template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = 32)
{
    return kvg_emu_shfl(KVG_EMU_WARP_SHFL_UP, mask, var, (int)delta, width);
}

inline unsigned __ballot_sync(unsigned mask, int predicate)
{
    return (unsigned)kvg_emu_warp_op(KVG_EMU_WARP_BALLOT, mask, predicate != 0, 0, 32);
}

inline int __any_sync(unsigned mask, int predicate)
{
    return __ballot_sync(mask, predicate) != 0;
}

inline int __all_sync(unsigned mask, int predicate)
{
    /* exited lanes of the mask take no part: "all" means no live lane says no */
    return __ballot_sync(mask, !predicate) == 0;
}

/* ---- atomics: the threads of a launch run one at a time, so a plain read-modify-write
 * is atomic. Each returns the old value, as in CUDA. The race detector does not watch
 * them (KVG_EMU_ATOMIC: not instrumented); their address must still be device or shared
 * memory (kvg_emu_atomic_check). --------------------------------------------------- */

void kvg_emu_atomic_check(const void *p, size_t n);
#define KVG_EMU_ATOMIC __attribute__((no_sanitize_address))

template <class T>
KVG_EMU_ATOMIC inline T kvg_emu_atomic_add(T *address, T val)
{
    kvg_emu_atomic_check(address, sizeof *address);
    T old = *address;
    *address = old + val;
    return old;
}
inline float atomicAdd(float *address, float val) { return kvg_emu_atomic_add(address, val); }
inline int atomicAdd(int *address, int val) { return kvg_emu_atomic_add(address, val); }
inline unsigned int atomicAdd(unsigned int *address, unsigned int val)
{
    return kvg_emu_atomic_add(address, val);
}
inline unsigned long long atomicAdd(unsigned long long *address, unsigned long long val)
{
    return kvg_emu_atomic_add(address, val);
}

KVG_EMU_ATOMIC inline int atomicMax(int *address, int val)
{
    kvg_emu_atomic_check(address, sizeof *address);
    int old = *address;
    if (val > old)
        *address = val;
    return old;
}

KVG_EMU_ATOMIC inline int atomicMin(int *address, int val)
{
    kvg_emu_atomic_check(address, sizeof *address);
    int old = *address;
    if (val < old)
        *address = val;
    return old;
}

template <class T>
KVG_EMU_ATOMIC inline T kvg_emu_atomic_cas(T *address, T compare, T val)
{
    kvg_emu_atomic_check(address, sizeof *address);
    T old = *address;
    if (old == compare)
        *address = val;
    return old;
}
inline int atomicCAS(int *address, int compare, int val)
{
    return kvg_emu_atomic_cas(address, compare, val);
}
inline unsigned int atomicCAS(unsigned int *address, unsigned int compare, unsigned int val)
{
    return kvg_emu_atomic_cas(address, compare, val);
}
inline unsigned long long atomicCAS(unsigned long long *address, unsigned long long compare,
                                    unsigned long long val)
{
    return kvg_emu_atomic_cas(address, compare, val);
}

template <class T>
KVG_EMU_ATOMIC inline T kvg_emu_atomic_exch(T *address, T val)
{
    kvg_emu_atomic_check(address, sizeof *address);
    T old = *address;
    *address = val;
    return old;
}
inline int atomicExch(int *address, int val) { return kvg_emu_atomic_exch(address, val); }
inline unsigned int atomicExch(unsigned int *address, unsigned int val)
{
    return kvg_emu_atomic_exch(address, val);
}
inline unsigned long long atomicExch(unsigned long long *address, unsigned long long val)
{
    return kvg_emu_atomic_exch(address, val);
}
inline float atomicExch(float *address, float val) { return kvg_emu_atomic_exch(address, val); }

/* ---- math ----------------------------------------------------------------------------- */

/* glibc's <math.h> declares __expf, __logf, __sinf, __cosf (its internal aliases), so
 * the fast intrinsics are macros onto the precise functions rather than definitions that
 * would collide with those declarations. */
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __powf(x, y) powf(x, y)

/* A product or sum rounded on its own: the empty asm keeps g++ (built with
 * -ffp-contract=fast, as nvcc contracts) from fusing it into an FMA, as nvcc never fuses
 * the _rn intrinsics. */
#if defined(__x86_64__) || defined(__i386__)
#define KVG_EMU_UNFUSED(r) __asm__("" : "+x"(r))
#elif defined(__aarch64__)
#define KVG_EMU_UNFUSED(r) __asm__("" : "+w"(r))
#else
#define KVG_EMU_UNFUSED(r) __asm__("" : "+m"(r))
#endif
inline float __fmul_rn(float a, float b)
{
    float r = a * b;
    KVG_EMU_UNFUSED(r);
    return r;
}
inline float __fadd_rn(float a, float b)
{
    float r = a + b;
    KVG_EMU_UNFUSED(r);
    return r;
}

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }

inline float __int_as_float(int x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
inline int __float_as_int(float x)
{
    int i;
    memcpy(&i, &x, sizeof i);
    return i;
}
inline float __uint_as_float(unsigned int x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
inline unsigned int __float_as_uint(float x)
{
    unsigned int u;
    memcpy(&u, &x, sizeof u);
    return u;
}

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }

template <class T>
inline T __ldg(const T *p) { return *p; }

/* ---- vector types ------------------------------------------------------------------- */

struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };

inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline int2 make_int2(int x, int y) { return int2{x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w)
{
    return uint4{x, y, z, w};
}

/* ---- BF16 and F16 ----------------------------------------------------------------------
 * Conversions from float round to nearest, ties to even; a NaN stays a NaN (quiet, sign
 * and top payload bits kept); F16 handles subnormals and overflows to infinity. As in
 * CUDA the types convert implicitly from and to float. */

inline unsigned short kvg_emu_f32_to_bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)           /* NaN: keep it, make it quiet */
        return (unsigned short)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);               /* round half to even; carries into inf */
    return (unsigned short)(u >> 16);
}

inline float kvg_emu_bf16_bits_to_f32(unsigned short h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

inline unsigned short kvg_emu_f32_to_f16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)                           /* NaN: quiet, top payload bits kept */
        return (unsigned short)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u)                          /* >= 65520 rounds to infinity */
        return (unsigned short)(sign | 0x7c00u);
    if (a < 0x38800000u) {                         /* below 2^-14: an F16 subnormal or 0 */
        if (a < 0x33000000u)                       /* below 2^-25 (half the least) -> 0 */
            return (unsigned short)sign;
        uint32_t e = a >> 23;                      /* 102 .. 112 */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;  /* 24 significant bits */
        uint32_t shift = 126 - e;                  /* value = m * 2^(e-150), unit 2^-24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (q & 1u)))
            q++;
        return (unsigned short)(sign | q);
    }
    /* normal: rebias the exponent (127 -> 15), round the 13 dropped bits half to even;
     * a carry out of the mantissa bumps the exponent, which is right */
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (unsigned short)(sign | (r >> 13));
}

inline float kvg_emu_f16_bits_to_f32(unsigned short h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        u = sign | ((e + 112u) << 23) | (m << 13);
    } else if (m == 0) {
        u = sign;
    } else {                                       /* subnormal: normalise */
        int shift = 0;
        while (!(m & 0x400u)) {
            m <<= 1;
            shift++;
        }
        u = sign | ((uint32_t)(113 - shift) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(kvg_emu_f32_to_bf16_bits(f)) {}
    operator float() const { return kvg_emu_bf16_bits_to_f32(__x); }
};

struct __half {
    unsigned short __x;
    __half() = default;
    __half(float f) : __x(kvg_emu_f32_to_f16_bits(f)) {}
    operator float() const { return kvg_emu_f16_bits_to_f32(__x); }
};

struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

struct alignas(4) __half2 {
    __half x, y;
};

inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u)
{
    __nv_bfloat16 b;
    b.__x = u;
    return b;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __half __ushort_as_half(unsigned short u)
{
    __half h;
    h.__x = u;
    return h;
}
inline unsigned short __half_as_ushort(__half h) { return h.__x; }

inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    return __ushort_as_bfloat16(kvg_emu_f32_to_bf16_bits(f));
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return kvg_emu_bf16_bits_to_f32(b.__x); }
inline __half __float2half_rn(float f) { return __ushort_as_half(kvg_emu_f32_to_f16_bits(f)); }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) { return kvg_emu_f16_bits_to_f32(h.__x); }

inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
    return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return __floats2bfloat162_rn(v.x, v.y); }
inline float2 __bfloat1622float2(__nv_bfloat162 v)
{
    return float2{__bfloat162float(v.x), __bfloat162float(v.y)};
}
inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline __half2 __floats2half2_rn(float a, float b)
{
    return __half2{__float2half_rn(a), __float2half_rn(b)};
}
inline __half2 __float22half2_rn(float2 v) { return __floats2half2_rn(v.x, v.y); }
inline float2 __half22float2(__half2 v) { return float2{__half2float(v.x), __half2float(v.y)}; }
inline float __low2float(__half2 v) { return __half2float(v.x); }
inline float __high2float(__half2 v) { return __half2float(v.y); }

/* ---- launching -------------------------------------------------------------------------- */

/* The runtime side: validates the configuration like a GPU (block <= 1024 threads,
 * x, y <= 1024, z <= 64; dims > 0; grid.x < 2^31, grid.y, grid.z <= 65535; dyn_smem <=
 * 48 KiB; a known stream) and records a launch error for cudaGetLastError otherwise;
 * else queues the launch on the stream, to run fn(ctx) once per thread of every block when
 * the stream runs it, then release(ctx). ctx (ctx_size bytes: the launch's captured
 * arguments) belongs to the runtime from the call on. `name` names the kernel in
 * messages. */
void kvg_emu_launch_raw(const char *name, dim3 grid, dim3 block, size_t dyn_smem,
                        cudaStream_t stream, void (*fn)(void *), void *ctx,
                        void (*release)(void *), size_t ctx_size);

/* The current block's dynamic shared memory: dyn_smem bytes, 16-byte aligned, filled with
 * 0xA5 before each block so a kernel reading it before writing gets garbage in the tests. */
void *kvg_emu_dynamic_smem(void);

/* Queues body() to run once per thread of every block, the index variables set; body is
 * copied (its captures are the kernel's arguments, by value). The kernel's name in
 * messages is the launcher's (from the lambda's type). */
template <class F>
inline void kvg_emu_launch_named(const char *name, dim3 grid, dim3 block, size_t dyn_smem,
                                 cudaStream_t s, F body)
{
    kvg_emu_launch_raw(name, grid, block, dyn_smem, s,
                       [](void *p) { (*static_cast<F *>(p))(); }, new F(body),
                       [](void *p) { delete static_cast<F *>(p); }, sizeof(F));
}

template <class F>
inline void kvg_emu_launch(dim3 grid, dim3 block, size_t dyn_smem, cudaStream_t s, F body)
{
    kvg_emu_launch_named(__PRETTY_FUNCTION__, grid, block, dyn_smem, s, body);
}

/* "kernel (launched by launcher)", kept for the life of the process. */
const char *kvg_emu_kernel_name(const char *kernel, const char *launcher);

/* KVG_LAUNCH's emulation: the arguments converted to the kernel's parameter types and
 * copied AT THE CALL, as a real launch does (so `*g` in an argument list reads g now, not
 * when the queued launch runs). */
template <class... P, class... A>
inline void kvg_emu_launch_kernel(const char *kernel, const char *launcher, dim3 grid, dim3 block,
                                  size_t dyn_smem, cudaStream_t s, void (*fn)(P...), A &&...args)
{
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    kvg_emu_launch_named(kvg_emu_kernel_name(kernel, launcher), grid, block, dyn_smem, s,
                         [fn, params]() { std::apply(fn, params); });
}

#endif
