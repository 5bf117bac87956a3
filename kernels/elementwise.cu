/* Elementwise kernels: add, swiglu, swiglu_oai, geglu, scale, softcap, to_lowp (F32 ->
 * F16/BF16) and from_lowp (back). Grid-stride loops over the elements (float4 groups when
 * every pointer is 16-byte aligned, the last n % 4 elements by a scalar tail); each output
 * element is a function of the inputs at the same index only, so nothing depends on the
 * launch's shape or size. */
#include "kvg_device.cuh"

#define ELT_THREADS 256

/* ---- add ---------------------------------------------------------------------------- */

__global__ void __launch_bounds__(ELT_THREADS)
add_x4(float4 *__restrict__ x, const float4 *__restrict__ y, size_t n4)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 a = x[i], b = y[i];
        a.x += b.x;
        a.y += b.y;
        a.z += b.z;
        a.w += b.w;
        x[i] = a;
    }
}

__global__ void __launch_bounds__(ELT_THREADS)
add_x1(float *__restrict__ x, const float *__restrict__ y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

extern "C" cudaError_t kvg_k_add(cudaStream_t s, float *x, const float *y, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    if (!x || !y)
        return cudaErrorInvalidValue;
    size_t n4 = 0;
    if (kvg_aligned(x, 16) && kvg_aligned(y, 16)) {
        n4 = n / 4;
        if (n4)
            KVG_LAUNCH(add_x4, dim3(kvg_grid_for(n4, ELT_THREADS)), dim3(ELT_THREADS), 0, s,
                       (float4 *)x, (const float4 *)y, n4);
    }
    if (n > n4 * 4)
        KVG_LAUNCH(add_x1, dim3(kvg_grid_for(n - n4 * 4, ELT_THREADS)), dim3(ELT_THREADS), 0, s,
                   x + n4 * 4, y + n4 * 4, n - n4 * 4);
    return kvg_launch_result();
}

/* ---- swiglu ------------------------------------------------------------------------- */

/* g * (1 / (1 + exp(-g))), times up. expf, not __expf: the kernel is memory-bound, the
 * accurate exp costs nothing measurable. (The CPU backend computes the same function
 * with its own polynomial exp, engine/cpu/attention_kernels.h's kvg_silu_mul: the two
 * agree within a few ulp, not bit for bit.) */
__device__ __forceinline__ float kvg_swiglu1(float g, float u)
{
    g *= 1.0f / (1.0f + expf(-g));
    return g * u;
}

/* The gated activations: gate[i] = act(gate[i], up[i]), four at a time where both are
 * 16-byte aligned, the rest one by one. */
struct kvg_act_silu {
    __device__ static float f(float g, float u) { return kvg_swiglu1(g, u); }
};

/* ---- geglu ------------------------------------------------------------------------- */

/* GELU's tanh approximation times up, the CPU backend's expression term for term:
 * 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u, with tanhf (Gemma's GeGLU). */
__device__ __forceinline__ float kvg_geglu1(float g, float u)
{
    const float t = tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g));
    return 0.5f * g * (1.0f + t) * u;
}

struct kvg_act_gelu {
    __device__ static float f(float g, float u) { return kvg_geglu1(g, u); }
};

/* ---- gpt-oss's clamped SwiGLU -------------------------------------------------------- */

/* x = min(g, 7), y = clamp(u, -7, 7), x sigmoid(1.702 x) (y + 1): the CPU backend's
 * kvg_swiglu_oai (engine/cpu/attention_kernels.h) term for term, the sigmoid from
 * expf(-|a|) as there (nothing overflows), with expf where the CPU has its polynomial exp
 * (a few ulp apart). The comparisons are the CPU's, so a NaN gate stays NaN and a NaN up
 * becomes -7 + 1 on both. */
__device__ __forceinline__ float kvg_swiglu_oai1(float g, float u)
{
    const float x = g > 7.0f ? 7.0f : g;
    const float y = u < -7.0f ? -7.0f : u > 7.0f ? 7.0f : u;
    const float a = 1.702f * x;
    const float e = expf(-fabsf(a));
    const float sg = (a >= 0.0f ? 1.0f : e) / (1.0f + e);
    return (x * sg) * (y + 1.0f);
}

struct kvg_act_silu_oai {
    __device__ static float f(float g, float u) { return kvg_swiglu_oai1(g, u); }
};

/* LP (kvg_device.cuh's kvg_lp_*): also each result rounded to BF16/F16 at its index in
 * lowp, w_down's input; the F32 result is the same bits either way. */
template <class Act, class LP>
__global__ void __launch_bounds__(ELT_THREADS)
glu_x4(float4 *__restrict__ gate, const float4 *__restrict__ up, size_t n4, void *__restrict__ lowp)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 g = gate[i], u = up[i];
        const float4 r = make_float4(Act::f(g.x, u.x), Act::f(g.y, u.y), Act::f(g.z, u.z), Act::f(g.w, u.w));
        gate[i] = r;
        LP::two(lowp, 4 * i, r.x, r.y);
        LP::two(lowp, 4 * i + 2, r.z, r.w);
    }
}

template <class Act, class LP>
__global__ void __launch_bounds__(ELT_THREADS)
glu_x1(float *__restrict__ gate, const float *__restrict__ up, size_t n, void *__restrict__ lowp)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float r = Act::f(gate[i], up[i]);
        gate[i] = r;
        LP::one(lowp, i, r);
    }
}

/* lowp, when not NULL: element i's copy at lowp[i] (of dt's size; 4-byte aligned). */
template <class Act, class LP>
static void glu_launch_lp(cudaStream_t s, float *gate, const float *up, size_t n, void *lowp)
{
    size_t n4 = 0;
    if (kvg_aligned(gate, 16) && kvg_aligned(up, 16)) {
        n4 = n / 4;
        if (n4) {
            void (*k)(float4 *, const float4 *, size_t, void *) = glu_x4<Act, LP>;
            KVG_LAUNCH(k, dim3(kvg_grid_for(n4, ELT_THREADS)), dim3(ELT_THREADS), 0, s, (float4 *)gate,
                       (const float4 *)up, n4, lowp);
        }
    }
    if (n > n4 * 4) {
        /* the tail's lowp from its first element (2 bytes an element) */
        void *lt = lowp ? (void *)((unsigned char *)lowp + n4 * 4 * 2) : NULL;
        void (*k)(float *, const float *, size_t, void *) = glu_x1<Act, LP>;
        KVG_LAUNCH(k, dim3(kvg_grid_for(n - n4 * 4, ELT_THREADS)), dim3(ELT_THREADS), 0, s, gate + n4 * 4,
                   up + n4 * 4, n - n4 * 4, lt);
    }
}

template <class Act>
static cudaError_t glu_launch(cudaStream_t s, float *gate, const float *up, size_t n, kvg_kt dt, void *lowp)
{
    if (lowp && ((dt != KVG_KT_BF16 && dt != KVG_KT_F16) || !kvg_aligned(lowp, 4)))
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    if (!gate || !up)
        return cudaErrorInvalidValue;
    if (!lowp)
        glu_launch_lp<Act, kvg_lp_none>(s, gate, up, n, lowp);
    else if (dt == KVG_KT_BF16)
        glu_launch_lp<Act, kvg_lp_bf16>(s, gate, up, n, lowp);
    else
        glu_launch_lp<Act, kvg_lp_f16>(s, gate, up, n, lowp);
    return kvg_launch_result();
}

extern "C" cudaError_t kvg_k_swiglu(cudaStream_t s, float *gate, const float *up, size_t n)
{
    return glu_launch<kvg_act_silu>(s, gate, up, n, KVG_KT_F32, NULL);
}

extern "C" cudaError_t kvg_k_swiglu_oai(cudaStream_t s, float *gate, const float *up, size_t n)
{
    return glu_launch<kvg_act_silu_oai>(s, gate, up, n, KVG_KT_F32, NULL);
}

extern "C" cudaError_t kvg_k_geglu(cudaStream_t s, float *gate, const float *up, size_t n)
{
    return glu_launch<kvg_act_gelu>(s, gate, up, n, KVG_KT_F32, NULL);
}

extern "C" cudaError_t kvg_k_swiglu_lowp(cudaStream_t s, float *gate, const float *up, size_t n, kvg_kt dt,
                                         void *lowp)
{
    return glu_launch<kvg_act_silu>(s, gate, up, n, dt, lowp);
}

extern "C" cudaError_t kvg_k_geglu_lowp(cudaStream_t s, float *gate, const float *up, size_t n, kvg_kt dt,
                                        void *lowp)
{
    return glu_launch<kvg_act_gelu>(s, gate, up, n, dt, lowp);
}

/* ---- scale and softcap -------------------------------------------------------------- */

/* x * v (scale) or v * tanhf(x / v) (softcap: Gemma 2's final logits). */
__device__ __forceinline__ float kvg_unary1(float x, float v, int cap)
{
    return cap ? v * tanhf(x / v) : x * v;
}

__global__ void __launch_bounds__(ELT_THREADS)
unary_x4(float4 *__restrict__ x, float v, int cap, size_t n4)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 a = x[i];
        x[i] = make_float4(kvg_unary1(a.x, v, cap), kvg_unary1(a.y, v, cap),
                           kvg_unary1(a.z, v, cap), kvg_unary1(a.w, v, cap));
    }
}

__global__ void __launch_bounds__(ELT_THREADS)
unary_x1(float *__restrict__ x, float v, int cap, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = kvg_unary1(x[i], v, cap);
}

static cudaError_t unary(cudaStream_t s, float *x, float v, int cap, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    if (!x)
        return cudaErrorInvalidValue;
    size_t n4 = 0;
    if (kvg_aligned(x, 16)) {
        n4 = n / 4;
        if (n4)
            KVG_LAUNCH(unary_x4, dim3(kvg_grid_for(n4, ELT_THREADS)), dim3(ELT_THREADS), 0, s,
                       (float4 *)x, v, cap, n4);
    }
    if (n > n4 * 4)
        KVG_LAUNCH(unary_x1, dim3(kvg_grid_for(n - n4 * 4, ELT_THREADS)), dim3(ELT_THREADS), 0,
                   s, x + n4 * 4, v, cap, n - n4 * 4);
    return kvg_launch_result();
}

extern "C" cudaError_t kvg_k_scale(cudaStream_t s, float *x, float v, size_t n)
{
    return unary(s, x, v, 0, n);
}

extern "C" cudaError_t kvg_k_softcap(cudaStream_t s, float *x, float cap, size_t n)
{
    if (n && !(cap > 0.0f))
        return cudaErrorInvalidValue;
    return unary(s, x, cap, 1, n);
}

/* ---- to_lowp ------------------------------------------------------------------------ */

/* 4 floats -> 4 BF16 as two bf16x2 stores (out 8-byte aligned). */
__global__ void __launch_bounds__(ELT_THREADS)
to_bf16_x4(const float4 *__restrict__ x, size_t n4, __nv_bfloat162 *__restrict__ out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 v = x[i];
        out[2 * i] = __floats2bfloat162_rn(v.x, v.y);
        out[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
    }
}

__global__ void __launch_bounds__(ELT_THREADS)
to_bf16_x1(const float *__restrict__ x, size_t n, __nv_bfloat16 *__restrict__ out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(x[i]);
}

__global__ void __launch_bounds__(ELT_THREADS)
to_f16_x4(const float4 *__restrict__ x, size_t n4, __half2 *__restrict__ out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 v = x[i];
        out[2 * i] = __halves2half2(__float2half_rn(v.x), __float2half_rn(v.y));
        out[2 * i + 1] = __halves2half2(__float2half_rn(v.z), __float2half_rn(v.w));
    }
}

__global__ void __launch_bounds__(ELT_THREADS)
to_f16_x1(const float *__restrict__ x, size_t n, __half *__restrict__ out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2half_rn(x[i]);
}

extern "C" cudaError_t kvg_k_to_lowp(cudaStream_t s, const float *x, size_t n, kvg_kt dt,
                                     void *out)
{
    if (dt != KVG_KT_BF16 && dt != KVG_KT_F16)
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    if (!x || !out)
        return cudaErrorInvalidValue;
    size_t n4 = 0;
    if (kvg_aligned(x, 16) && kvg_aligned(out, 8))
        n4 = n / 4;
    const size_t done = n4 * 4;
    if (dt == KVG_KT_BF16) {
        __nv_bfloat16 *o = (__nv_bfloat16 *)out;
        if (n4)
            KVG_LAUNCH(to_bf16_x4, dim3(kvg_grid_for(n4, ELT_THREADS)), dim3(ELT_THREADS), 0, s,
                       (const float4 *)x, n4, (__nv_bfloat162 *)o);
        if (n > done)
            KVG_LAUNCH(to_bf16_x1, dim3(kvg_grid_for(n - done, ELT_THREADS)), dim3(ELT_THREADS),
                       0, s, x + done, n - done, o + done);
    } else {
        __half *o = (__half *)out;
        if (n4)
            KVG_LAUNCH(to_f16_x4, dim3(kvg_grid_for(n4, ELT_THREADS)), dim3(ELT_THREADS), 0, s,
                       (const float4 *)x, n4, (__half2 *)o);
        if (n > done)
            KVG_LAUNCH(to_f16_x1, dim3(kvg_grid_for(n - done, ELT_THREADS)), dim3(ELT_THREADS),
                       0, s, x + done, n - done, o + done);
    }
    return kvg_launch_result();
}

/* ---- from_lowp ---------------------------------------------------------------------- */

/* BF16/F16 -> F32 is exact: one element per thread and step, pairs would buy little on an
 * output this small (cuDNN attention's [rows][n_heads * head_dim]). */
__global__ void __launch_bounds__(ELT_THREADS)
from_bf16_x1(const __nv_bfloat16 *__restrict__ x, size_t n, float *__restrict__ out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(x[i]);
}

__global__ void __launch_bounds__(ELT_THREADS)
from_f16_x1(const __half *__restrict__ x, size_t n, float *__restrict__ out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __half2float(x[i]);
}

extern "C" cudaError_t kvg_k_from_lowp(cudaStream_t s, const void *x, size_t n, kvg_kt dt,
                                       float *out)
{
    if (dt != KVG_KT_BF16 && dt != KVG_KT_F16)
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    if (!x || !out)
        return cudaErrorInvalidValue;
    if (dt == KVG_KT_BF16)
        KVG_LAUNCH(from_bf16_x1, dim3(kvg_grid_for(n, ELT_THREADS)), dim3(ELT_THREADS), 0,
                   s, (const __nv_bfloat16 *)x, n, out);
    else
        KVG_LAUNCH(from_f16_x1, dim3(kvg_grid_for(n, ELT_THREADS)), dim3(ELT_THREADS), 0, s,
                   (const __half *)x, n, out);
    return kvg_launch_result();
}
