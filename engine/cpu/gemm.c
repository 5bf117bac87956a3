/* kvg_gemm: validates, picks the kernel once per process, packs X once into the
 * caller's workspace and splits the output columns (rows of W) across the pool; each
 * range claims a free participant's scratch from the workspace. Only N is ever
 * split, and every kernel follows the canonical order of cpu/gemm_kernels.h, so
 * neither the ISA, nor the thread count, nor M, nor the workspace (packed or not)
 * changes a single bit of any output. Nothing here allocates per call: the
 * workspaces are made by kvg_gemm_ws_new / kvg_gemm_ws_reserve. */
#include "cpu/gemm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "cpu/gemm_int8.h"
#include "cpu/gemm_kernels.h"
#include "cpu/gemm_testing.h"

/* Below this many multiply-adds a job costs less than waking a worker. */
#define KVG_GEMM_MIN_PARALLEL_MACS 65536.0

typedef void (*quantize_x_fn)(const float *x, int K, int r0, int r1, unsigned char *xq);

/* What each ISA level runs: float W (F32, F16, BF16) through the canonical order of
 * gemm_kernels.h, with the plan of a product and the packing of X (NULL: the level
 * never packs); quantized W (Q8_0, Q4_0, Q4_K, Q6_K) through integer products over X
 * quantized to int8 (gemm_int8.h) -- the AVX-512 int8 kernel needs VNNI, without it
 * the AVX2 one runs (the same bits). Off x86 only the generic level exists
 * (kvg_gemm_isa_supported never reports the others): their entries stay NULL. */
typedef struct isa_kernels {
    const char *name;
    kvg_gemm_kernel_fn gemm;
    kvg_gemm_plan_fn plan;
    kvg_gemm_pack_x_fn pack_x;
    kvg_gemm_kernel_fn int8;
    quantize_x_fn quantize_x;
} isa_kernels;

static const isa_kernels isas[] = {
    [KVG_ISA_GENERIC] = { "generic", kvg_gemm_kernel_generic, kvg_gemm_plan_generic, NULL,
                          kvg_int8_kernel_generic, kvg_int8_quantize_x_generic },
#if defined(__x86_64__) || defined(__i386__)
    [KVG_ISA_AVX2] = { "avx2", kvg_gemm_kernel_avx2, kvg_gemm_plan_avx2, kvg_gemm_pack_x_avx2,
                       kvg_int8_kernel_avx2, kvg_int8_quantize_x_avx2 },
    [KVG_ISA_AVX512] = { "avx512", kvg_gemm_kernel_avx512, kvg_gemm_plan_avx512, kvg_gemm_pack_x_avx512,
                         kvg_int8_kernel_avx512, kvg_int8_quantize_x_avx512 },
#else
    [KVG_ISA_AVX2] = { "avx2", NULL, NULL, NULL, NULL, NULL },
    [KVG_ISA_AVX512] = { "avx512", NULL, NULL, NULL, NULL, NULL },
#endif
};

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static int isa_best = KVG_ISA_GENERIC;   /* best the CPU supports */
static int isa_active = KVG_ISA_GENERIC; /* after KVG_GEMM_ISA */
static int has_vnni;                     /* AVX512_VNNI, for the int8 kernel */

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
        has_vnni = isa_best == KVG_ISA_AVX512 && __builtin_cpu_supports("avx512vnni");
    }
#endif
    isa_active = isa_best;

    const char *env = getenv("KVG_GEMM_ISA");
    if (env && *env) {
        for (int i = 0; i <= KVG_ISA_AVX512; i++)
            if (strcmp(env, isas[i].name) == 0) {
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

/* The ISA kvg_gemm uses (the best supported, lowered by KVG_GEMM_ISA). */
static kvg_gemm_isa_id isa_active_id(void)
{
    pthread_once(&isa_once, detect_isa);
    return (kvg_gemm_isa_id)isa_active;
}

const char *kvg_gemm_isa_name(kvg_gemm_isa_id isa)
{
    return (int)isa >= 0 && (int)isa <= KVG_ISA_AVX512 ? isas[isa].name : "?";
}

const char *kvg_gemm_isa(void)
{
    return kvg_gemm_isa_name(isa_active_id());
}

/* ---- workspaces ---- */

/* One participant's scratch, claimed for one range at a time. Padded to its own cache
 * line so that claiming it does not bounce a neighbour's. */
typedef struct ws_part {
    _Alignas(64) _Atomic int busy;
    kvg_gemm_scratch s;
} ws_part;

struct kvg_gemm_ws {
    int n;                       /* participants (the pool's threads) */
    int k_min, k_max;            /* inner dimensions the per-thread scratch covers */
    size_t wp_cap, slots_cap;    /* floats in each participant's wp and slots */
    float *xp;                   /* packed X, shared by a product's participants */
    size_t xp_cap;               /* floats */
    unsigned char *xq;           /* X quantized for the int8 kernels, shared likewise */
    size_t xq_cap;               /* bytes */
    int float_w, int8_w;         /* the products it serves (kvg_gemm_ws_kinds) */
    ws_part *parts;              /* n */
};

/* Largest per-participant need, over the ISAs this CPU runs, of a product with inner
 * dimension K in [k_min, k_max]. The plans depend on K only through Kp = K rounded up
 * to 16, so one K per multiple of 16 covers the range. */
static void ws_needs(int k_min, int k_max, size_t *wp, size_t *slots)
{
    *wp = *slots = 0;
    for (int isa = 0; isa <= KVG_ISA_AVX512; isa++) {
        if (!kvg_gemm_isa_supported((kvg_gemm_isa_id)isa))
            continue;
        for (int k = k_min < 16 ? 16 : (k_min + 15) / 16 * 16; k <= (k_max + 15) / 16 * 16; k += 16) {
            kvg_gemm_job job = { .M = 1 << 20, .K = k, .N = 1, .dt = KVG_DT_F32 };
            kvg_gemm_plan plan;
            isas[isa].plan(&job, &plan);
            if (!plan.packed)
                continue;
            if (plan.wp_floats > *wp)
                *wp = plan.wp_floats;
            if (plan.slots_floats > *slots)
                *slots = plan.slots_floats;
        }
    }
}

/* n floats, 64-byte aligned; NULL for 0 floats or out of memory. */
static float *alloc_floats(size_t n)
{
    void *p = NULL;
    if (n == 0 || n > SIZE_MAX / sizeof(float) || posix_memalign(&p, 64, n * sizeof(float)) != 0)
        return NULL;
    return p;
}

kvg_gemm_ws *kvg_gemm_ws_new(int threads, int k_min, int k_max)
{
    kvg_gemm_ws *ws;
    void *parts = NULL;

    if (threads < 1 || k_min < 0 || k_max < k_min)
        return NULL;
    ws = calloc(1, sizeof *ws);
    if (!ws || posix_memalign(&parts, 64, (size_t)threads * sizeof(ws_part)) != 0) {
        free(ws);
        return NULL;
    }
    memset(parts, 0, (size_t)threads * sizeof(ws_part));
    ws->parts = parts;
    ws->n = threads;
    ws->k_min = k_min;
    ws->k_max = k_max;
    ws->float_w = ws->int8_w = 1;
    ws_needs(k_min, k_max, &ws->wp_cap, &ws->slots_cap);
    for (int i = 0; i < threads; i++) {
        atomic_init(&ws->parts[i].busy, 0);
        if (ws->wp_cap == 0)
            continue;        /* no ISA here packs: nothing to hold */
        ws->parts[i].s.wp = alloc_floats(ws->wp_cap);
        ws->parts[i].s.slots = alloc_floats(ws->slots_cap);
        if (!ws->parts[i].s.wp || !ws->parts[i].s.slots) {
            ws->n = i + 1;
            kvg_gemm_ws_free(ws);
            return NULL;
        }
    }
    return ws;
}

int kvg_gemm_ws_reserve(kvg_gemm_ws *ws, int rows)
{
    size_t need = 0;
    float *p;

    if (!ws || rows <= 0)
        return 0;
    if (ws->int8_w && (size_t)rows * kvg_int8_x_row_bytes(ws->k_max) > ws->xq_cap) {
        size_t bytes = ((size_t)rows * kvg_int8_x_row_bytes(ws->k_max) + 63) / 64 * 64;
        void *q = NULL;
        if (posix_memalign(&q, 64, bytes) != 0)
            return -1;
        free(ws->xq);
        ws->xq = q;
        ws->xq_cap = bytes;
    }
    if (ws->wp_cap == 0 || !ws->float_w)
        return 0;
    for (int isa = 0; isa <= KVG_ISA_AVX512; isa++) {
        kvg_gemm_job job = { .M = rows, .K = ws->k_max, .N = 1, .dt = KVG_DT_F32 };
        kvg_gemm_plan plan;
        if (!kvg_gemm_isa_supported((kvg_gemm_isa_id)isa))
            continue;
        isas[isa].plan(&job, &plan);
        if (plan.packed && plan.xp_floats > need)
            need = plan.xp_floats;
    }
    if (need <= ws->xp_cap)
        return 0;
    p = alloc_floats(need);
    if (!p)
        return -1;
    free(ws->xp);
    ws->xp = p;
    ws->xp_cap = need;
    return 0;
}

void kvg_gemm_ws_free(kvg_gemm_ws *ws)
{
    if (!ws)
        return;
    for (int i = 0; ws->parts && i < ws->n; i++) {
        free(ws->parts[i].s.wp);
        free(ws->parts[i].s.slots);
    }
    free(ws->parts);
    free(ws->xp);
    free(ws->xq);
    free(ws);
}

void kvg_gemm_ws_kinds(kvg_gemm_ws *ws, int float_w, int int8_w)
{
    if (!ws)
        return;
    /* A kind dropped releases what it held: without float products no thread needs
     * packing scratch (ws_fits then sends any float product down the unpacked path). */
    if (!float_w && ws->float_w) {
        for (int i = 0; i < ws->n; i++) {
            free(ws->parts[i].s.wp);
            free(ws->parts[i].s.slots);
            ws->parts[i].s.wp = ws->parts[i].s.slots = NULL;
        }
        ws->wp_cap = ws->slots_cap = 0;
        free(ws->xp);
        ws->xp = NULL;
        ws->xp_cap = 0;
        ws->float_w = 0;
    }
    if (!int8_w && ws->int8_w) {
        free(ws->xq);
        ws->xq = NULL;
        ws->xq_cap = 0;
        ws->int8_w = 0;
    }
}

size_t kvg_gemm_ws_bytes(const kvg_gemm_ws *ws)
{
    if (!ws)
        return 0;
    return ws->xp_cap * sizeof(float) + ws->xq_cap +
           (size_t)ws->n * (ws->parts[0].s.wp ? (ws->wp_cap + ws->slots_cap) * sizeof(float) : 0);
}

/* Whether ws holds everything the plan asks for, for a pool of `threads`. */
static int ws_fits(const kvg_gemm_ws *ws, const kvg_gemm_plan *plan, int threads)
{
    return ws && plan->packed && threads <= ws->n && plan->xp_floats <= ws->xp_cap &&
           plan->wp_floats <= ws->wp_cap && plan->slots_floats <= ws->slots_cap;
}

/* A free participant's scratch. The pool runs at most `threads` ranges at once and
 * ws->n >= threads, so one is always free; which one a range gets does not matter
 * (scratch is written before it is read). `hint` spreads the first tries. */
static ws_part *ws_claim(kvg_gemm_ws *ws, size_t hint)
{
    for (size_t i = hint % (size_t)ws->n;; i = (i + 1) % (size_t)ws->n) {
        ws_part *p = &ws->parts[i];
        if (!atomic_load_explicit(&p->busy, memory_order_relaxed) &&
            !atomic_exchange_explicit(&p->busy, 1, memory_order_acquire))
            return p;
    }
}

static void ws_release(ws_part *p)
{
    atomic_store_explicit(&p->busy, 0, memory_order_release);
}

/* ---- the product ---- */

struct par_ctx {
    const kvg_gemm_job *job;
    kvg_gemm_kernel_fn fn;
    kvg_gemm_pack_x_fn pack;
    kvg_gemm_ws *ws;             /* non-NULL: the packed path, claim scratch */
    size_t group;                /* W rows per unit of the split */
};

/* Threads take whole groups of W rows (the kernel's panel height, so only the last
 * group has a tail). */
static void par_range(void *arg, size_t begin, size_t end)
{
    const struct par_ctx *p = arg;
    size_t n1 = end * p->group;
    ws_part *part = p->ws ? ws_claim(p->ws, begin) : NULL;

    if (n1 > (size_t)p->job->N)
        n1 = (size_t)p->job->N;
    p->fn(p->job, (int)(begin * p->group), (int)n1, part ? &part->s : NULL);
    if (part)
        ws_release(part);
}

static void pack_range(void *arg, size_t begin, size_t end)
{
    const struct par_ctx *p = arg;
    p->pack(p->job, (int)begin, (int)end, p->ws->xp);
}

/* Validates one product and fills its job, plan and context (X not packed yet).
 * -1: the caller's bug; 1: nothing to compute; 0: ready. */
static int setup(kvg_gemm_isa_id isa, const float *x, int M, int K, const kvg_tensor *w,
                 const float *bias, float *y, kvg_gemm_job *job, kvg_gemm_plan *plan,
                 struct par_ctx *p)
{
    /* The caller's bugs, refused without touching y (see gemm.h). */
    if (!w || (w->dtype != KVG_DT_F32 && w->dtype != KVG_DT_F16 && w->dtype != KVG_DT_BF16 &&
               !kvg_int8_dt(w->dtype)) ||
        K % kvg_gemm_k_multiple(w->dtype) != 0 || M < 0 || K < 0 || w->cols != K || w->rows < 0 || w->rows > 0x7fffffff ||
        !kvg_gemm_isa_supported(isa))
        return -1;
    if (M == 0 || w->rows == 0)
        return 1;
    if (!x || !y || !w->data)
        return -1;

    job->x = x;
    job->xp = NULL;
    job->xq = NULL;
    job->w = w->data;
    job->bias = bias;
    job->y = y;
    job->M = M;
    job->N = (int)w->rows;
    job->K = K;
    job->dt = w->dtype;

    p->job = job;
    p->ws = NULL;
    if (kvg_int8_dt(job->dt)) {
        /* No packing: X is quantized instead (run_int8); threads take groups of 16
         * columns, the repacked layout's unit. */
        memset(plan, 0, sizeof *plan);
        p->fn = isas[isa == KVG_ISA_AVX512 && !has_vnni ? KVG_ISA_AVX2 : isa].int8;
        p->pack = NULL;
        p->group = 16;
        return 0;
    }
    isas[isa].plan(job, plan);
    p->fn = isas[isa].gemm;
    p->pack = isas[isa].pack_x;
    /* Decode keeps finer groups: its kernel has no panels to fill. */
    p->group = plan->packed ? (size_t)plan->n_group : 16;
    return 0;
}

/* Packs X once into ws when the plan packs and ws fits (in parallel when the product
 * is), and points job->xp at it. */
static void pack_once(kvg_threadpool *tp, kvg_gemm_ws *ws, const kvg_gemm_plan *plan, int threads,
                      int parallel, kvg_gemm_job *job, struct par_ctx *p)
{
    if (!ws_fits(ws, plan, threads) || !p->pack)
        return;
    /* Packed X is the same for every thread: pack it once. */
    job->xp = ws->xp;
    p->ws = ws;
    if (parallel && plan->x_panels > 1)
        kvg_threadpool_run(tp, (size_t)plan->x_panels, pack_range, p);
    else
        pack_range(p, 0, (size_t)plan->x_panels);
}

/* ---- prepared weights ---- */

struct repack_ctx {
    const kvg_tensor *w;
    void *out;
    size_t row_bytes;            /* a float matrix's copy: bytes per row */
};

static void repack_range(void *arg, size_t begin, size_t end)
{
    const struct repack_ctx *r = arg;
    kvg_int8_repack(r->w->dtype, r->w->data, (int)r->w->rows, (int)r->w->cols, (int)begin, (int)end, r->out);
}

/* Rows [begin, end) of a float matrix, copied as they are. */
static void copy_range(void *arg, size_t begin, size_t end)
{
    const struct repack_ctx *r = arg;
    memcpy((char *)r->out + begin * r->row_bytes, (const char *)r->w->data + begin * r->row_bytes,
           (end - begin) * r->row_bytes);
}

/* A float matrix off a 64-byte boundary, copied onto one. */
static int prepare_aligned(kvg_threadpool *tp, const kvg_tensor *w, kvg_tensor *out)
{
    struct repack_ctx r = { w, NULL, 0 };
    size_t rows = (size_t)w->rows;

    if (((uintptr_t)w->data & 63) == 0 || rows == 0)
        return 0;
    r.row_bytes = kvg_dtype_row_bytes(w->dtype, w->cols);
    if (r.row_bytes == 0 || rows > SIZE_MAX / r.row_bytes || posix_memalign(&r.out, 64, rows * r.row_bytes) != 0)
        return -1;
    if (tp && kvg_threadpool_size(tp) > 1 && rows > 1)
        kvg_threadpool_run(tp, rows, copy_range, &r);
    else
        copy_range(&r, 0, rows);
    out->data = r.out;
    return 1;
}

int kvg_gemm_prepare(kvg_threadpool *tp, const kvg_tensor *w, kvg_tensor *out)
{
    struct repack_ctx r;
    size_t groups, bytes;
    kvg_dtype pdt;
    void *p = NULL;

    if (!w || !out)
        return -1;
    *out = *w;
    if (kvg_int8_dt_packed(w->dtype))
        return 0;
    if (!w->data || w->rows < 0 || w->rows > 0x7fffffff || w->cols <= 0 || w->cols > 0x7fffffff ||
        w->cols % kvg_gemm_k_multiple(w->dtype) != 0)
        return -1;
    if (!kvg_int8_dt(w->dtype))
        return prepare_aligned(tp, w, out);
    pdt = kvg_int8_packed_dt(w->dtype);
    groups = ((size_t)w->rows + 15) / 16;
    bytes = kvg_int8_packed_bytes(pdt, (int)w->rows, (int)w->cols);
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        return -1;
    r.w = w;
    r.out = p;
    if (tp && kvg_threadpool_size(tp) > 1 && groups > 1)
        kvg_threadpool_run(tp, groups, repack_range, &r);
    else
        repack_range(&r, 0, groups);
    out->data = p;
    out->dtype = pdt;
    return 1;
}

void kvg_gemm_prepared_free(kvg_tensor *t)
{
    if (t) {
        free((void *)t->data);
        t->data = NULL;
    }
}

/* ---- several products of one X in one job ---- */

struct multi_ctx {
    int n;
    struct par_ctx p[KVG_GEMM_MULTI_MAX];
    size_t start[KVG_GEMM_MULTI_MAX + 1];   /* each product's first group in the
                                                concatenation of their groups */
};

/* Groups [begin, end) of the concatenation: each product's share of it, as par_range
 * would run it alone. */
static void multi_range(void *arg, size_t begin, size_t end)
{
    struct multi_ctx *mc = arg;
    for (int i = 0; i < mc->n; i++) {
        size_t b = begin > mc->start[i] ? begin : mc->start[i];
        size_t e = end < mc->start[i + 1] ? end : mc->start[i + 1];
        if (b < e)
            par_range(&mc->p[i], b - mc->start[i], e - mc->start[i]);
    }
}

/* ---- int8 products (quantized W) ---- */

struct quant_ctx {
    quantize_x_fn fn;
    const float *x;
    int K;
    unsigned char *xq;
};

static void quant_range(void *arg, size_t begin, size_t end)
{
    const struct quant_ctx *q = arg;
    q->fn(q->x, q->K, (int)begin, (int)end, q->xq);
}

/* Bytes of quantized X kvg_gemm keeps on its own stack when the workspace has none
 * (or too little): enough for a row of K = 43,000. */
#define INT8_STACK_BYTES 65536

/* The products of mc (all int8, one X of M rows, jobs set up for all of it): X is
 * quantized once per slice of the rows the buffer holds (all of them, with a
 * workspace reserved for the step), in parallel, then the slice's products run as one
 * pool job. Slicing changes no bit: every row is quantized, and computed, alone. */
static int run_int8(kvg_gemm_isa_id isa, kvg_threadpool *tp, kvg_gemm_ws *ws, int parallel,
                    struct multi_ctx *mc)
{
    _Alignas(64) unsigned char stack_xq[INT8_STACK_BYTES];
    const kvg_gemm_job *j0 = mc->p[0].job;
    int M = j0->M, K = j0->K;
    size_t rb = kvg_int8_x_row_bytes(K);
    unsigned char *buf = ws && ws->xq_cap >= rb ? ws->xq : stack_xq;
    size_t cap = buf == stack_xq ? sizeof stack_xq : ws->xq_cap;
    int slice = rb == 0 || cap / rb > (size_t)M ? M : (int)(cap / rb);
    const float *x = j0->x;
    float *y[KVG_GEMM_MULTI_MAX];

    if (slice < 1)
        return -1;
    for (int i = 0; i < mc->n; i++)
        y[i] = mc->p[i].job->y;
    for (int m0 = 0; m0 < M; m0 += slice) {
        int ms = M - m0 < slice ? M - m0 : slice;
        struct quant_ctx q = { isas[isa].quantize_x, x + (size_t)m0 * (size_t)K, K, buf };
        for (int i = 0; i < mc->n; i++) {
            kvg_gemm_job *j = (kvg_gemm_job *)mc->p[i].job;
            j->x = q.x;
            j->xq = buf;
            j->M = ms;
            j->y = y[i] + (size_t)m0 * (size_t)j->N;
        }
        if (parallel && ms > 1 && (double)ms * K >= KVG_GEMM_MIN_PARALLEL_MACS / 4)
            kvg_threadpool_run(tp, (size_t)ms, quant_range, &q);
        else
            quant_range(&q, 0, (size_t)ms);
        if (parallel && mc->start[mc->n] > 1) {
            kvg_threadpool_run(tp, mc->start[mc->n], multi_range, mc);
        } else {
            for (int i = 0; i < mc->n; i++)
                mc->p[i].fn(mc->p[i].job, 0, mc->p[i].job->N, NULL);
        }
    }
    return 0;
}

int kvg_gemm_with_isa(kvg_gemm_isa_id isa, kvg_threadpool *tp, kvg_gemm_ws *ws, const float *x,
                      int M, int K, const kvg_tensor *w, const float *bias, float *y)
{
    kvg_gemm_job job;
    kvg_gemm_plan plan;
    struct par_ctx p;
    int threads, parallel, rc;

    rc = setup(isa, x, M, K, w, bias, y, &job, &plan, &p);
    if (rc != 0)
        return rc < 0 ? -1 : 0;
    threads = kvg_threadpool_size(tp);
    parallel = threads > 1 && (double)M * job.N * (K > 0 ? K : 1) >= KVG_GEMM_MIN_PARALLEL_MACS;
    if (kvg_int8_dt(job.dt)) {
        struct multi_ctx mc = { .n = 1, .start = { 0, ((size_t)job.N + 15) / 16 } };
        mc.p[0] = p;
        return run_int8(isa, tp, ws, parallel, &mc);
    }
    pack_once(tp, ws, &plan, threads, parallel, &job, &p);
    if (parallel) {
        size_t groups = ((size_t)job.N + p.group - 1) / p.group;
        if (groups > 1) {
            kvg_threadpool_run(tp, groups, par_range, &p);
            return 0;
        }
    }
    /* On the calling thread alone: participant 0's scratch is free. */
    p.fn(&job, 0, job.N, p.ws ? &ws->parts[0].s : NULL);
    return 0;
}

int kvg_gemm_multi_with_isa(kvg_gemm_isa_id isa, kvg_threadpool *tp, kvg_gemm_ws *ws, const float *x,
                             int M, int K, int n, const kvg_tensor *const *w,
                             const float *const *bias, float *const *y)
{
    kvg_gemm_job jobs[KVG_GEMM_MULTI_MAX];
    kvg_gemm_plan plans_[KVG_GEMM_MULTI_MAX];
    struct multi_ctx mc;
    double macs = 0;
    int threads = kvg_threadpool_size(tp), parallel, same = 1;

    if (n < 0 || n > KVG_GEMM_MULTI_MAX || (n > 0 && (!w || !y)))
        return -1;
    /* One dtype for all: one kernel, one plan for X. (Quantized W too: the small-M
     * kernels are per product like the F32 ones, and a packed plan packs X alike.) */
    for (int i = 0; i < n; i++)
        if (!w[i] || w[i]->dtype != w[0]->dtype)
            same = 0;
    if (!same) {
        /* Mixed weight types: one product at a time. */
        for (int i = 0; i < n; i++)
            if (kvg_gemm_with_isa(isa, tp, ws, x, M, K, w[i], bias ? bias[i] : NULL, y[i]) != 0)
                return -1;
        return 0;
    }
    mc.n = 0;
    mc.start[0] = 0;
    for (int i = 0; i < n; i++) {
        int rc = setup(isa, x, M, K, w[i], bias ? bias[i] : NULL, y[i], &jobs[mc.n], &plans_[mc.n],
                       &mc.p[mc.n]);
        if (rc < 0)
            return -1;
        if (rc > 0)
            continue;
        macs += (double)M * jobs[mc.n].N * (K > 0 ? K : 1);
        mc.start[mc.n + 1] = mc.start[mc.n] + ((size_t)jobs[mc.n].N + mc.p[mc.n].group - 1) /
                                                  mc.p[mc.n].group;
        mc.n++;
    }
    if (mc.n == 0)
        return 0;
    parallel = threads > 1 && macs >= KVG_GEMM_MIN_PARALLEL_MACS;
    if (kvg_int8_dt(jobs[0].dt))
        return run_int8(isa, tp, ws, parallel, &mc);
    /* X and K are the same for all, and so is the plan's packing of X (it depends on M
     * and K only): pack it once for all of them. */
    pack_once(tp, ws, &plans_[0], threads, parallel, &jobs[0], &mc.p[0]);
    for (int i = 1; i < mc.n; i++) {
        if (!jobs[0].xp || !plans_[i].packed)
            break;
        jobs[i].xp = jobs[0].xp;
        mc.p[i].ws = ws;
    }
    if (parallel && mc.start[mc.n] > 1) {
        kvg_threadpool_run(tp, mc.start[mc.n], multi_range, &mc);
        return 0;
    }
    for (int i = 0; i < mc.n; i++)
        mc.p[i].fn(&jobs[i], 0, jobs[i].N, mc.p[i].ws ? &ws->parts[0].s : NULL);
    return 0;
}

int kvg_gemm_multi(kvg_threadpool *tp, kvg_gemm_ws *ws, const float *x, int M, int K, int n,
                   const kvg_tensor *const *w, const float *const *bias, float *const *y)
{
    return kvg_gemm_multi_with_isa(isa_active_id(), tp, ws, x, M, K, n, w, bias, y);
}

int kvg_gemm(kvg_threadpool *tp, kvg_gemm_ws *ws, const float *x, int M, int K,
             const kvg_tensor *w, const float *bias, float *y)
{
    return kvg_gemm_with_isa(isa_active_id(), tp, ws, x, M, K, w, bias, y);
}
