/* Persistent worker pool. A job's ranges are fixed by (n, thread count): up to
 * KVG_TP_RANGES_PER_THREAD per thread. Which thread runs a range is not: every range is
 * claimed once (an atomic compare-and-swap with the job's generation number), each
 * thread starts with its own share (the caller with range 0) and then claims whatever
 * is still unclaimed. So a worker that the OS has not scheduled yet (another process
 * holds the core) costs some parallelism, never a stall: the caller runs its share.
 *
 * Workers sleep on a condition variable between jobs. Before sleeping, a worker (and
 * the caller waiting for the last range) polls for about 25 microseconds, because a
 * forward pass issues dozens of short jobs back to back and a futex wake-up costs as
 * much as a small GEMM; the poll is bounded in time, so a busy machine loses at most
 * that per job. */
#include "cpu/threadpool.h"
#include "cpu/threadpool_testing.h"
#include "monoclock.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "cpu_relax.h"

#define KVG_TP_MAX_THREADS 256
/* How long a waiting thread polls before it sleeps: about what a futex wake-up costs
 * on these VMs (t/bench/engine_bench --profile measured ~21 us after a pause against
 * ~0.1 us back to back). Polling as long as a sleep would cost bounds the loss to 2x
 * either way (a busy machine loses at most this per job), and it covers the gaps
 * between the ~60 short jobs of a decode step, which are shorter. */
#define KVG_TP_SPIN_NS 25000
/* Ranges per thread: a thread slowed by another process holds back at most a small
 * range while the others share out the rest. */
#define KVG_TP_RANGES_PER_THREAD 4

struct kvg_worker {
    struct kvg_threadpool *tp;
    int index;                    /* 1..n-1; the caller is thread 0 */
    pthread_t thread;
};

struct kvg_threadpool {
    int n;                        /* threads including the caller */
    struct kvg_worker *workers;   /* n - 1 */
    _Atomic uint64_t *claim;      /* per range (n * RANGES_PER_THREAD): the generation
                                   * that claimed it */
    pthread_mutex_t mu;
    pthread_cond_t work_cv;       /* a new generation or stop */
    pthread_cond_t done_cv;       /* remaining reached 0 */
    _Atomic uint64_t gen;         /* bumped under mu; polled without it */
    _Atomic size_t remaining;     /* ranges of the current job not finished */
    int stop;
    unsigned long long jobs;      /* dispatched jobs: the caller's counter */
    /* The current job, written under mu before gen is bumped. */
    size_t job_n;
    kvg_range_fn job_fn;
    void *job_ctx;
};


/* Polls until *p != v, or *p == 0, or the spin budget is spent. */
static void spin_gen(const _Atomic uint64_t *p, uint64_t v)
{
    uint64_t start = kvg_mono_ns();
    for (int i = 1;; i++) {
        if (atomic_load_explicit(p, memory_order_acquire) != v)
            return;
        kvg_cpu_relax();
        if ((i & 31) == 0 && kvg_mono_ns() - start > KVG_TP_SPIN_NS)
            return;
    }
}

static void spin_zero(const _Atomic size_t *p)
{
    uint64_t start = kvg_mono_ns();
    for (int i = 1;; i++) {
        if (atomic_load_explicit(p, memory_order_acquire) == 0)
            return;
        kvg_cpu_relax();
        if ((i & 31) == 0 && kvg_mono_ns() - start > KVG_TP_SPIN_NS)
            return;
    }
}

static size_t n_ranges(const struct kvg_threadpool *tp, size_t n)
{
    size_t most = (size_t)tp->n * KVG_TP_RANGES_PER_THREAD;
    return n < most ? n : most;
}

/* Range i of [0, n) cut into `ranges` near-equal parts: depends on n and the thread
 * count only. */
static void split(size_t n, size_t ranges, size_t i, size_t *begin, size_t *end)
{
    size_t q = n / ranges, r = n % ranges;
    *begin = i * q + (i < r ? i : r);
    *end = *begin + q + (i < r ? 1 : 0);
}

/* Claims range i for generation g. A participant of an older job (a worker that woke
 * late) never wins: generations only grow, and every range of a finished job was
 * claimed by that job. */
static int claim(struct kvg_threadpool *tp, size_t i, uint64_t g)
{
    uint64_t v = atomic_load_explicit(&tp->claim[i], memory_order_relaxed);
    while (v < g)
        if (atomic_compare_exchange_weak_explicit(&tp->claim[i], &v, g, memory_order_acq_rel,
                                                  memory_order_relaxed))
            return 1;
    return 0;
}

/* Runs every unclaimed range, starting with thread t's share (thread 0, the caller,
 * starts at range 0); returns 1 if it finished the job's last range. */
static int work(struct kvg_threadpool *tp, uint64_t g, size_t n, kvg_range_fn fn, void *ctx,
                int t)
{
    size_t ranges = n_ranges(tp, n), first = ranges * (size_t)t / (size_t)tp->n;
    int last = 0;
    for (size_t k = 0; k < ranges; k++) {
        size_t i = (first + k) % ranges, b, e;
        split(n, ranges, i, &b, &e);
        if (!claim(tp, i, g))
            continue;
        fn(ctx, b, e);
        if (atomic_fetch_sub_explicit(&tp->remaining, 1, memory_order_acq_rel) == 1)
            last = 1;
    }
    return last;
}

static void *worker_main(void *arg)
{
    struct kvg_worker *w = arg;
    struct kvg_threadpool *tp = w->tp;
    uint64_t seen = 0;

    for (;;) {
        uint64_t g;
        size_t n;
        kvg_range_fn fn;
        void *ctx;

        spin_gen(&tp->gen, seen);
        pthread_mutex_lock(&tp->mu);
        while (atomic_load_explicit(&tp->gen, memory_order_relaxed) == seen && !tp->stop)
            pthread_cond_wait(&tp->work_cv, &tp->mu);
        if (tp->stop) {
            pthread_mutex_unlock(&tp->mu);
            return NULL;
        }
        g = seen = atomic_load_explicit(&tp->gen, memory_order_relaxed);
        n = tp->job_n;
        fn = tp->job_fn;
        ctx = tp->job_ctx;
        pthread_mutex_unlock(&tp->mu);

        if (work(tp, g, n, fn, ctx, w->index)) {
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->done_cv);
            pthread_mutex_unlock(&tp->mu);
        }
    }
}

static int online_cpus(void)
{
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
#endif
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

static void shutdown_workers(struct kvg_threadpool *tp, int started)
{
    pthread_mutex_lock(&tp->mu);
    tp->stop = 1;
    pthread_cond_broadcast(&tp->work_cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < started; i++)
        pthread_join(tp->workers[i].thread, NULL);
}

static void destroy(struct kvg_threadpool *tp, int sync_ready)
{
    if (sync_ready) {
        pthread_cond_destroy(&tp->done_cv);
        pthread_cond_destroy(&tp->work_cv);
        pthread_mutex_destroy(&tp->mu);
    }
    free(tp->claim);
    free(tp->workers);
    free(tp);
}

kvg_threadpool *kvg_threadpool_new(int n_threads)
{
    struct kvg_threadpool *tp;
    int started = 0, ok = 1;

    if (n_threads <= 0)
        n_threads = online_cpus();
    if (n_threads > KVG_TP_MAX_THREADS)
        n_threads = KVG_TP_MAX_THREADS;
    tp = calloc(1, sizeof *tp);
    if (!tp)
        return NULL;
    tp->n = n_threads;
    tp->claim = calloc((size_t)n_threads * KVG_TP_RANGES_PER_THREAD, sizeof *tp->claim);
    if (n_threads > 1)
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
    if (!tp->claim || (n_threads > 1 && !tp->workers)) {
        destroy(tp, 0);
        return NULL;
    }
    for (int i = 0; i < n_threads * KVG_TP_RANGES_PER_THREAD; i++)
        atomic_init(&tp->claim[i], 0);
    atomic_init(&tp->gen, 0);
    atomic_init(&tp->remaining, 0);
    if (pthread_mutex_init(&tp->mu, NULL) != 0) {
        destroy(tp, 0);
        return NULL;
    }
    if (pthread_cond_init(&tp->work_cv, NULL) != 0) {
        pthread_mutex_destroy(&tp->mu);
        destroy(tp, 0);
        return NULL;
    }
    if (pthread_cond_init(&tp->done_cv, NULL) != 0) {
        pthread_cond_destroy(&tp->work_cv);
        pthread_mutex_destroy(&tp->mu);
        destroy(tp, 0);
        return NULL;
    }

    for (int i = 1; i < n_threads; i++) {
        struct kvg_worker *w = &tp->workers[i - 1];
        w->tp = tp;
        w->index = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            ok = 0;
            break;
        }
        started++;
    }
    if (!ok) {
        shutdown_workers(tp, started);
        destroy(tp, 1);
        return NULL;
    }
    return tp;
}

void kvg_threadpool_free(kvg_threadpool *tp)
{
    if (!tp)
        return;
    shutdown_workers(tp, tp->n - 1);
    destroy(tp, 1);
}

int kvg_threadpool_size(const kvg_threadpool *tp)
{
    return tp ? tp->n : 1;
}

unsigned long long kvg_threadpool_jobs(const kvg_threadpool *tp)
{
    return tp ? tp->jobs : 0;
}

void kvg_threadpool_run(kvg_threadpool *tp, size_t n, kvg_range_fn fn, void *ctx)
{
    uint64_t g;

    if (n == 0)
        return;
    if (!tp || tp->n == 1 || n == 1) {
        fn(ctx, 0, n);
        return;
    }

    tp->jobs++;
    pthread_mutex_lock(&tp->mu);
    tp->job_n = n;
    tp->job_fn = fn;
    tp->job_ctx = ctx;
    atomic_store_explicit(&tp->remaining, n_ranges(tp, n), memory_order_relaxed);
    g = atomic_fetch_add_explicit(&tp->gen, 1, memory_order_release) + 1;
    pthread_cond_broadcast(&tp->work_cv);
    pthread_mutex_unlock(&tp->mu);

    if (work(tp, g, n, fn, ctx, 0))
        return;
    spin_zero(&tp->remaining);
    /* Even when the poll saw 0, taking the mutex orders us after the last worker's
     * signal, so nothing of this job still touches the pool. */
    pthread_mutex_lock(&tp->mu);
    while (atomic_load_explicit(&tp->remaining, memory_order_acquire) != 0)
        pthread_cond_wait(&tp->done_cv, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
}
