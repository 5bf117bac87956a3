/* kvg_gemm: validates, picks the kernel once per process and splits the output
 * columns (rows of W) across the pool. Only N is ever split, and every kernel follows
 * the canonical order of cpu/gemm_kernels.h, so neither the ISA, nor the thread
 * count, nor M changes a single bit of any output. */
#include "gemm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "cpu/gemm_kernels.h"

/* Below this many multiply-adds a job costs less than waking a worker. */
#define KVG_GEMM_MIN_PARALLEL_MACS 65536.0

static const kvg_gemm_kernel_fn kernels[] = {
    [KVG_ISA_GENERIC] = kvg_gemm_kernel_generic,
    [KVG_ISA_AVX2] = kvg_gemm_kernel_avx2,
    [KVG_ISA_AVX512] = kvg_gemm_kernel_avx512,
};

static const kvg_gemm_plan_fn plans[] = {
    [KVG_ISA_GENERIC] = kvg_gemm_plan_generic,
    [KVG_ISA_AVX2] = kvg_gemm_plan_avx2,
    [KVG_ISA_AVX512] = kvg_gemm_plan_avx512,
};

static const kvg_gemm_pack_x_fn x_packers[] = {
    [KVG_ISA_GENERIC] = NULL,
    [KVG_ISA_AVX2] = kvg_gemm_pack_x_avx2,
    [KVG_ISA_AVX512] = kvg_gemm_pack_x_avx512,
};

static const char *const isa_names[] = {
    [KVG_ISA_GENERIC] = "generic",
    [KVG_ISA_AVX2] = "avx2",
    [KVG_ISA_AVX512] = "avx512",
};

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static int isa_best = KVG_ISA_GENERIC;   /* best the CPU supports */
static int isa_active = KVG_ISA_GENERIC; /* after KVG_GEMM_ISA */

static void detect_isa(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    int f16c = 0;

    __builtin_cpu_init();
    if (__get_cpuid(1, &a, &b, &c, &d))
        f16c = (c >> 29) & 1;
    /* libgcc's checks include the OS saving the YMM / ZMM state (XGETBV). */
    if (f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        isa_best = KVG_ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl"))
            isa_best = KVG_ISA_AVX512;
    }
#endif
    isa_active = isa_best;

    const char *env = getenv("KVG_GEMM_ISA");
    if (env && *env) {
        for (int i = 0; i <= KVG_ISA_AVX512; i++)
            if (strcmp(env, isa_names[i]) == 0) {
                if (i < isa_active)
                    isa_active = i;
                return;
            }
        fprintf(stderr, "kvgate: ignoring KVG_GEMM_ISA=%s (expected generic, avx2 or avx512)\n", env);
    }
}

int kvg_gemm_isa_supported(kvg_gemm_isa_id isa)
{
    pthread_once(&isa_once, detect_isa);
    return (int)isa >= 0 && (int)isa <= isa_best;
}

kvg_gemm_isa_id kvg_gemm_isa_id_active(void)
{
    pthread_once(&isa_once, detect_isa);
    return (kvg_gemm_isa_id)isa_active;
}

const char *kvg_gemm_isa_name(kvg_gemm_isa_id isa)
{
    return (int)isa >= 0 && (int)isa <= KVG_ISA_AVX512 ? isa_names[isa] : "?";
}

const char *kvg_gemm_isa(void)
{
    return kvg_gemm_isa_name(kvg_gemm_isa_id_active());
}

struct par_ctx {
    const kvg_gemm_job *job;
    kvg_gemm_kernel_fn fn;
    kvg_gemm_pack_x_fn pack;
    float *xp;
    size_t group;                /* W rows per unit of the split */
};

/* Threads take whole groups of W rows (the kernel's panel height, so only the last
 * group has a tail). */
static void par_range(void *arg, size_t begin, size_t end)
{
    const struct par_ctx *p = arg;
    size_t n1 = end * p->group;
    if (n1 > (size_t)p->job->N)
        n1 = (size_t)p->job->N;
    p->fn(p->job, (int)(begin * p->group), (int)n1);
}

static void pack_range(void *arg, size_t begin, size_t end)
{
    const struct par_ctx *p = arg;
    p->pack(p->job, (int)begin, (int)end, p->xp);
}

/* A call that does not match its tensor is a bug in the caller, not bad input:
 * stop loudly rather than compute garbage. */
static void misuse(const char *what, int M, int K, const kvg_tensor *w)
{
    fprintf(stderr, "kvg_gemm: %s (M=%d K=%d W=[%lld][%lld] dtype=%d)\n", what, M, K,
            w ? (long long)w->rows : -1LL, w ? (long long)w->cols : -1LL, w ? (int)w->dtype : -1);
    abort();
}

void kvg_gemm_with_isa(kvg_gemm_isa_id isa, kvg_threadpool *tp, const float *x, int M, int K,
                       const kvg_tensor *w, const float *bias, float *y)
{
    kvg_gemm_job job;
    int threads;

    if (!w || (w->dtype != KVG_DT_F32 && w->dtype != KVG_DT_F16 && w->dtype != KVG_DT_BF16))
        misuse("bad weight tensor", M, K, w);
    if (M < 0 || K < 0 || w->cols != K || w->rows < 0 || w->rows > 0x7fffffff)
        misuse("shape mismatch", M, K, w);
    if (M == 0 || w->rows == 0)
        return;
    if (!x || !y || !w->data)
        misuse("NULL buffer", M, K, w);
    if (!kvg_gemm_isa_supported(isa))
        misuse("ISA not supported by this CPU", M, K, w);

    job.x = x;
    job.xp = NULL;
    job.w = w->data;
    job.bias = bias;
    job.y = y;
    job.M = M;
    job.N = (int)w->rows;
    job.K = K;
    job.dt = w->dtype;

    threads = kvg_threadpool_size(tp);
    if (threads > 1 && (double)M * job.N * (K > 0 ? K : 1) >= KVG_GEMM_MIN_PARALLEL_MACS) {
        kvg_gemm_plan plan;
        struct par_ctx p = { &job, kernels[isa], x_packers[isa], NULL, 0 };
        size_t groups;

        plans[isa](&job, &plan);
        /* Decode keeps finer groups: its kernel has no panels to fill. */
        p.group = plan.packed ? (size_t)plan.n_group : 16;
        groups = ((size_t)job.N + p.group - 1) / p.group;
        if (groups > 1) {
            /* Packed X is the same for every thread: pack it once, in parallel. */
            if (plan.packed && p.pack && plan.x_panels > 1) {
                p.xp = aligned_alloc(64, plan.xp_floats * sizeof(float));
                if (p.xp) {
                    kvg_threadpool_run(tp, (size_t)plan.x_panels, pack_range, &p);
                    job.xp = p.xp;
                }
            }
            kvg_threadpool_run(tp, groups, par_range, &p);
            free(p.xp);
            return;
        }
    }
    kernels[isa](&job, 0, job.N);
}

void kvg_gemm(kvg_threadpool *tp, const float *x, int M, int K,
              const kvg_tensor *w, const float *bias, float *y)
{
    kvg_gemm_with_isa(kvg_gemm_isa_id_active(), tp, x, M, K, w, bias, y);
}
