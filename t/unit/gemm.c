/* kvg_gemm and the thread pool: results against a double-precision reference, the
 * canonical accumulation order (re-implemented here independently), bit-identical
 * rows whatever M, the row's position or the thread count, and bit-identical results
 * across the generic, AVX2 and AVX-512 kernels (those this CPU has). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tap.h"
#include "cpu/gemm.h"
#include "cpu/gemm_kernels.h"
#include "cpu/gemm_testing.h"
#include "cpu/threadpool.h"
#include "cpu/threadpool_testing.h"

/* ---- deterministic data ---------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* Uniform in [-1, 1) with full 24-bit mantissas. */
static float rnd_f(void)
{
    return (float)((double)(rnd32() & 0xffffff) / 8388608.0 - 1.0);
}

/* A weight matrix in one dtype plus its exact value as doubles, computed here from
 * the bit fields (independently of the library's converters). */
typedef struct wmat {
    kvg_tensor t;
    void *data;
    double *val;
} wmat;

static double f16_value(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    double v = exp ? ldexp(1.0 + man / 1024.0, exp - 15) : ldexp(man / 1024.0, -14);
    return sign ? -v : v;
}

static void wmat_make(wmat *m, kvg_dtype dt, int rows, int cols)
{
    size_t n = (size_t)rows * (size_t)cols;
    m->val = malloc((n ? n : 1) * sizeof(double));
    m->data = malloc((n ? n : 1) * (dt == KVG_DT_F32 ? 4 : 2));
    for (size_t i = 0; i < n; i++) {
        if (dt == KVG_DT_F32) {
            float f = rnd_f();
            ((float *)m->data)[i] = f;
            m->val[i] = f;
        } else if (dt == KVG_DT_BF16) {
            float f = rnd_f();
            uint32_t u;
            memcpy(&u, &f, 4);
            u &= 0xffff0000u;
            memcpy(&f, &u, 4);
            ((uint16_t *)m->data)[i] = (uint16_t)(u >> 16);
            m->val[i] = f;
        } else {
            /* Mostly normal halves around 2^-5..2^1, one in 16 subnormal. */
            uint16_t h = (uint16_t)(rnd32() & 0x83ff);
            if (rnd32() % 16)
                h |= (uint16_t)((10 + rnd32() % 7) << 10);
            ((uint16_t *)m->data)[i] = h;
            m->val[i] = f16_value(h);
        }
    }
    m->t.data = m->data;
    m->t.dtype = dt;
    m->t.rows = rows;
    m->t.cols = cols;
}

static void wmat_free(wmat *m)
{
    free(m->data);
    free(m->val);
}

static float *rnd_vec(size_t n)
{
    float *v = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        v[i] = rnd_f();
    return v;
}

/* The canonical order, from the specification in gemm_kernels.h. */
static float canon_dot(const float *x, const double *wv, int K)
{
    float acc[16] = { 0 }, h[8], q[4], d[2];
    for (int k0 = 0; k0 < K; k0 += 16)
        for (int l = 0; l < 16; l++) {
            int k = k0 + l;
            acc[l] = fmaf(k < K ? x[k] : 0.0f, k < K ? (float)wv[k] : 0.0f, acc[l]);
        }
    for (int i = 0; i < 8; i++)
        h[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++)
        q[i] = h[i] + h[i + 4];
    d[0] = q[0] + q[2];
    d[1] = q[1] + q[3];
    return d[0] + d[1];
}

static const kvg_dtype dtypes[] = { KVG_DT_F32, KVG_DT_F16, KVG_DT_BF16 };
static const char *const dt_names[] = { "f32", "f16", "bf16" };

static int n_isas;
static kvg_gemm_isa_id isas[3];

/* The workspace every product here runs with: pools of up to 3 threads, K up to 1000,
 * up to 140 rows (the largest shapes below), so M >= 40 (AVX-512; AVX2: 16) takes the packed path. */
static kvg_gemm_ws *tws;

/* TAP's "Bail out!": nothing after this could mean anything. */
#define BAIL_OUT(why) do {                      \
        printf("Bail out! %s\n", why);          \
        exit(1);                                \
    } while (0)

/* ---- thread pool -------------------------------------------------------------- */

struct cover {
    pthread_mutex_t mu;
    int *hits;
    size_t ranges[64][2];
    int n_ranges;
};

static void cover_fn(void *arg, size_t b, size_t e)
{
    struct cover *c = arg;
    for (size_t i = b; i < e; i++)
        __atomic_fetch_add(&c->hits[i], 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&c->mu);
    if (c->n_ranges < 64) {
        c->ranges[c->n_ranges][0] = b;
        c->ranges[c->n_ranges][1] = e;
    }
    c->n_ranges++;
    pthread_mutex_unlock(&c->mu);
}

static int cmp_range(const void *a, const void *b)
{
    const size_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Runs one job and checks: every index exactly once, no empty range, and the ranges
 * are exactly the fixed split: min(n, 4 * threads) near-equal contiguous ranges (one
 * call for a single thread). */
static int check_cover(kvg_threadpool *tp, size_t n)
{
    struct cover c;
    int good = 1, T = kvg_threadpool_size(tp), want_ranges = 0;
    size_t at = 0, R = n < (size_t)(4 * T) ? n : (size_t)(4 * T);

    if (T == 1)
        R = n ? 1 : 0;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    c.hits = calloc(n ? n : 1, sizeof(int));
    kvg_threadpool_run(tp, n, cover_fn, &c);
    for (size_t i = 0; i < n; i++)
        if (c.hits[i] != 1)
            good = 0;
    qsort(c.ranges, (size_t)(c.n_ranges < 64 ? c.n_ranges : 64), sizeof c.ranges[0], cmp_range);
    for (size_t t = 0; t < R; t++) {
        size_t len = n / R + (t < n % R ? 1 : 0);
        if (want_ranges >= c.n_ranges || c.ranges[want_ranges][0] != at ||
            c.ranges[want_ranges][1] != at + len)
            good = 0;
        want_ranges++;
        at += len;
    }
    if (want_ranges != c.n_ranges)
        good = 0;
    free(c.hits);
    pthread_mutex_destroy(&c.mu);
    return good;
}

struct counter {
    long sum;
};

static void count_fn(void *arg, size_t b, size_t e)
{
    struct counter *c = arg;
    __atomic_fetch_add(&c->sum, (long)(e - b), __ATOMIC_RELAXED);
}

/* Slow ranges: the caller's first (workers finish theirs and wait), or a worker's
 * (the caller may run it). Either way every index exactly once. */
struct slow {
    int *hits;
    size_t slow_begin;
};

static void slow_fn(void *arg, size_t b, size_t e)
{
    struct slow *s = arg;
    if (b == s->slow_begin)
        usleep(300);
    for (size_t i = b; i < e; i++)
        __atomic_fetch_add(&s->hits[i], 1, __ATOMIC_RELAXED);
}

static void test_threadpool_slow(void)
{
    kvg_threadpool *tp = kvg_threadpool_new(3);
    int good = 1;
    for (int j = 0; j < 60 && tp; j++) {
        int hits[24] = { 0 };
        /* n = 24 in 12 ranges of 2: range 0 (the caller's first), 4 (worker 1's
         * first) or 11 (the last). */
        struct slow s = { hits, j % 3 == 0 ? 0 : j % 3 == 1 ? 8 : 22 };
        kvg_threadpool_run(tp, 24, slow_fn, &s);
        for (int i = 0; i < 24; i++)
            if (hits[i] != 1)
                good = 0;
    }
    ok(tp && good, "pool of 3: a slow range (the caller's or a worker's) still runs exactly once");
    kvg_threadpool_free(tp);
}

/* Jobs issued back to back (the workers are still polling), after pauses shorter and
 * longer than the poll (a worker catches the next job while polling, or sleeps and is
 * woken), and the job counter: every index exactly once in each. */
static void test_threadpool_poll_sleep(void)
{
    static const long pauses_ns[] = { 0, 5000, 60000, 2000000 };
    for (int T = 2; T <= 3; T++) {
        kvg_threadpool *tp = kvg_threadpool_new(T);
        unsigned long long j0 = kvg_threadpool_jobs(tp);
        int good = tp != NULL, jobs = 0;
        for (size_t pi = 0; pi < sizeof pauses_ns / sizeof pauses_ns[0] && tp; pi++)
            for (int j = 0; j < 12; j++) {
                struct counter c = { 0 };
                struct timespec ts = { 0, pauses_ns[pi] };
                if (pauses_ns[pi])
                    nanosleep(&ts, NULL);
                kvg_threadpool_run(tp, (size_t)(17 + j), count_fn, &c);
                jobs++;
                if (c.sum != 17 + j)
                    good = 0;
            }
        ok(good, "pool of %d: jobs back to back and after pauses of 5 us, 60 us, 2 ms each cover "
           "their range once", T);
        {
            struct counter c = { 0 };
            kvg_threadpool_run(tp, 1, count_fn, &c);     /* inline: not a pool job */
            is_int((int)(kvg_threadpool_jobs(tp) - j0), jobs,
                   "pool of %d counts the %d jobs it handed out (not the inline one)", T, jobs);
        }
        kvg_threadpool_free(tp);
    }
    {
        kvg_threadpool *one = kvg_threadpool_new(1);
        struct counter c = { 0 };
        kvg_threadpool_run(one, 40, count_fn, &c);
        ok(c.sum == 40 && kvg_threadpool_jobs(one) == 0 && kvg_threadpool_jobs(NULL) == 0,
           "a pool of one thread (or none) runs inline and counts no jobs");
        kvg_threadpool_free(one);
    }
}

static void test_threadpool(void)
{
    static const int sizes[] = { 1, 2, 3, 5 };
    static const size_t ns[] = { 0, 1, 2, 3, 4, 5, 7, 64, 1000, 4099 };

    ok(kvg_threadpool_size(NULL) == 1, "NULL pool has size 1");
    ok(check_cover(NULL, 10), "NULL pool runs the job inline");
    {
        kvg_threadpool *d = kvg_threadpool_new(0);
        ok(d && kvg_threadpool_size(d) >= 1, "default pool sized to the CPUs (%d)",
           d ? kvg_threadpool_size(d) : -1);
        kvg_threadpool_free(d);
    }
    kvg_threadpool_free(NULL);

    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        kvg_threadpool *tp = kvg_threadpool_new(sizes[s]);
        int good = 1;
        if (!ok(tp != NULL, "pool of %d created", sizes[s]))
            continue;
        is_int(kvg_threadpool_size(tp), sizes[s], "pool of %d reports its size", sizes[s]);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            if (!check_cover(tp, ns[i])) {
                diag("pool %d, n=%zu: bad coverage or split", sizes[s], ns[i]);
                good = 0;
            }
        ok(good, "pool of %d: every index once, fixed contiguous split (up to 4 ranges per "
           "thread), n from 0 to 4099",
           sizes[s]);

        /* Many tiny jobs back to back: no lost wake-up, no stale job. */
        struct counter c = { 0 };
        long want = 0;
        for (int j = 0; j < 3000; j++) {
            size_t n = (size_t)(j % 7);
            kvg_threadpool_run(tp, n, count_fn, &c);
            want += (long)n;
        }
        is_int(c.sum, want, "pool of %d: 3000 small jobs all complete", sizes[s]);
        kvg_threadpool_free(tp);
    }
}

/* ---- GEMM correctness ---------------------------------------------------------- */

/* |y - exact| within the bound of 16-lane recursive summation with FMA. */
static int check_against_reference(kvg_gemm_isa_id isa, kvg_dtype dt, int M, int N, int K,
                                   int with_bias, kvg_threadpool *tp, double *worst)
{
    wmat w;
    float *x = rnd_vec((size_t)M * (size_t)K), *bias = with_bias ? rnd_vec((size_t)N) : NULL;
    float *y = malloc((size_t)M * (size_t)N * sizeof(float));
    int good = 1;
    const double eps = ldexp(1.0, -24);

    wmat_make(&w, dt, N, K);
    kvg_gemm_with_isa(isa, tp, tws, x, M, K, &w.t, bias, y);
    for (int m = 0; m < M && good; m++)
        for (int n = 0; n < N; n++) {
            double ref = bias ? bias[n] : 0.0, mag = bias ? fabs(bias[n]) : 0.0;
            for (int k = 0; k < K; k++) {
                double p = (double)x[(size_t)m * K + k] * w.val[(size_t)n * K + k];
                ref += p;
                mag += fabs(p);
            }
            double err = fabs((double)y[(size_t)m * N + n] - ref);
            double tol = ((double)K / 16.0 + 6.0) * eps * mag + 1e-30;
            if (mag > 0 && err / mag > *worst)
                *worst = err / mag;
            if (!(err <= tol)) {
                diag("%s %s M=%d N=%d K=%d: y[%d][%d]=%.9g ref=%.9g tol=%.3g",
                     kvg_gemm_isa_name(isa), dt_names[dt], M, N, K, m, n,
                     (double)y[(size_t)m * N + n], ref, tol);
                good = 0;
                break;
            }
        }
    wmat_free(&w);
    free(x);
    free(bias);
    free(y);
    return good;
}

static void test_reference(kvg_threadpool *tp2)
{
    static const int shapes[][3] = {
        /* M, N, K */
        { 1, 1, 1 }, { 1, 5, 15 }, { 1, 13, 16 }, { 2, 7, 17 }, { 3, 9, 31 }, { 4, 17, 33 },
        { 5, 3, 100 }, { 7, 37, 47 }, { 9, 20, 64 }, { 16, 33, 257 }, { 33, 40, 130 },
        { 70, 29, 77 }, { 1, 300, 512 }, { 64, 65, 96 },
    };
    for (int ii = 0; ii < n_isas; ii++)
        for (int d = 0; d < 3; d++) {
            int good = 1;
            double worst = 0;
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int b = 0; b < 2; b++)
                    good &= check_against_reference(isas[ii], dtypes[d], shapes[s][0], shapes[s][1],
                                                    shapes[s][2], b, (s & 1) ? tp2 : NULL, &worst);
            ok(good, "%s, %s weights: within the error bound of a double reference "
               "(odd shapes, bias on/off; worst relative error %.2g)",
               kvg_gemm_isa_name(isas[ii]), dt_names[d], worst);
        }
}

/* Every ISA gives exactly the canonical order of the specification. */
static void test_canonical(void)
{
    for (int d = 0; d < 3; d++) {
        int good = 1;
        for (int K = 0; K <= 70 && good; K++) {
            int M = 1 + K % 6, N = 1 + (K * 7) % 11;
            wmat w;
            float *x = rnd_vec((size_t)M * (size_t)K), *bias = rnd_vec((size_t)N);
            float *y = malloc((size_t)M * N * sizeof(float));
            wmat_make(&w, dtypes[d], N, K);
            for (int ii = 0; ii < n_isas && good; ii++) {
                const float *bb = (K & 1) ? bias : NULL;
                kvg_gemm_with_isa(isas[ii], NULL, tws, x, M, K, &w.t, bb, y);
                for (int m = 0; m < M && good; m++)
                    for (int n = 0; n < N && good; n++) {
                        float want = canon_dot(x + (size_t)m * K, w.val + (size_t)n * K, K);
                        if (bb)
                            want = want + bb[n];
                        if (memcmp(&want, &y[(size_t)m * N + n], sizeof want) != 0) {
                            diag("%s %s K=%d y[%d][%d]: got %a, canonical %a",
                                 kvg_gemm_isa_name(isas[ii]), dt_names[d], K, m, n,
                                 (double)y[(size_t)m * N + n], (double)want);
                            good = 0;
                        }
                    }
            }
            wmat_free(&w);
            free(x);
            free(bias);
            free(y);
        }
        ok(good, "%s weights: every ISA follows the canonical order bit for bit (K 0..70)",
           dt_names[d]);
    }
}

/* Every M from 1 to 70 (decode and packed paths, every panel remainder), with N and K
 * tails, bias on: bit-identical to the canonical order on every ISA. */
static void test_m_sweep(kvg_threadpool *tp)
{
    enum { N = 19, K = 37 };
    /* Packed X for 20 rows of K 64, one participant: M > 20 or a pool of 2 do not fit. */
    kvg_gemm_ws *small = kvg_gemm_ws_new(1, 16, 64);

    if (!small || kvg_gemm_ws_reserve(small, 20) != 0)
        BAIL_OUT("cannot make a workspace");
    for (int d = 0; d < 3; d++) {
        wmat w;
        float *x = rnd_vec((size_t)70 * K), *bias = rnd_vec(N), *y = malloc(70 * N * sizeof(float));
        float *want = malloc(70 * N * sizeof(float));
        int good = 1;

        wmat_make(&w, dtypes[d], N, K);
        for (int m = 0; m < 70; m++)
            for (int n = 0; n < N; n++)
                want[m * N + n] = canon_dot(x + (size_t)m * K, w.val + (size_t)n * K, K) + bias[n];
        /* With the workspace (packed from M = 40 on, AVX2 16) and without one, or with one too
         * small (the unpacked path then: the same bits). */
        for (int ii = 0; ii < n_isas; ii++)
            for (int M = 1; M <= 70 && good; M++)
                for (int wi = 0; wi < 3 && good; wi++) {
                    kvg_gemm_ws *ws = wi == 0 ? tws : wi == 1 ? NULL : small;
                    memset(y, 0, (size_t)M * N * sizeof(float));
                    kvg_gemm_with_isa(isas[ii], (M & 1) ? tp : NULL, ws, x, M, K, &w.t, bias, y);
                    if (memcmp(y, want, (size_t)M * N * sizeof(float)) != 0) {
                        diag("%s %s M=%d (workspace %s) differs from the canonical order",
                             kvg_gemm_isa_name(isas[ii]), dt_names[d], M,
                             wi == 0 ? "full" : wi == 1 ? "none" : "too small");
                        good = 0;
                    }
                }
        ok(good, "%s weights: M = 1..70 (N = %d, K = %d, bias), every ISA equals the canonical "
           "order, with a workspace, without one and with one too small", dt_names[d], N, K);
        wmat_free(&w);
        free(x);
        free(bias);
        free(y);
        free(want);
    }    kvg_gemm_ws_free(small);
}

/* Results must not change with K = 0 or a zero tail: y = bias, and -0 products. */
static void test_edges(void)
{
    float bias[3] = { 1.5f, -2.0f, 0.25f }, y[6];
    float x[2] = { 1.0f, 2.0f };
    kvg_tensor w0 = { x, KVG_DT_F32, 3, 0 };
    for (int ii = 0; ii < n_isas; ii++) {
        memset(y, 0xff, sizeof y);
        kvg_gemm_with_isa(isas[ii], NULL, tws, x, 2, 0, &w0, bias, y);
        ok(y[0] == 1.5f && y[1] == -2.0f && y[2] == 0.25f && y[3] == 1.5f && y[5] == 0.25f,
           "%s: K = 0 gives the bias", kvg_gemm_isa_name(isas[ii]));
        kvg_gemm_with_isa(isas[ii], NULL, tws, x, 2, 0, &w0, NULL, y);
        ok(y[0] == 0.0f && !signbit(y[0]) && y[4] == 0.0f, "%s: K = 0 without bias gives +0",
           kvg_gemm_isa_name(isas[ii]));
    }
    /* A call that breaks the rules is refused, never aborts, and leaves y alone. */
    {
        kvg_tensor bad = { x, KVG_DT_F32, 3, 2 }, baddt = { x, (kvg_dtype)99, 3, 0 };
        int r1, r2, r3;
        memset(y, 0x7f, sizeof y);
        r1 = kvg_gemm(NULL, tws, x, 2, 1, &bad, NULL, y);      /* K != w->cols */
        r2 = kvg_gemm(NULL, tws, x, 2, 0, &baddt, NULL, y);    /* unknown dtype */
        r3 = kvg_gemm(NULL, tws, NULL, 2, 2, &bad, NULL, y);   /* no X */
        ok(r1 == -1 && r2 == -1 && r3 == -1 && y[0] == y[5] && y[0] != 0.0f,
           "misuse (shape, dtype, NULL buffer) returns -1 and leaves y alone");
        is_int(kvg_gemm(NULL, tws, x, 0, 0, &w0, bias, y), 0, "M = 0 is a valid, empty product");
    }
    /* Exactly representable sums: integer weights, K = 1000 -> sum of k. */
    {
        enum { K = 1000 };
        static float xs[K], ws[K];
        float yy;
        kvg_tensor t = { ws, KVG_DT_F32, 1, K };
        for (int k = 0; k < K; k++) {
            xs[k] = 1.0f;
            ws[k] = (float)k;
        }
        kvg_gemm(NULL, tws, xs, 1, K, &t, NULL, &yy);
        ok(yy == 499500.0f, "exact integer dot product (got %.1f)", (double)yy);
    }
}

/* ---- batch invariance ---------------------------------------------------------- */

static int rows_equal(const float *a, const float *b, int N, int *first_diff)
{
    for (int n = 0; n < N; n++)
        if (memcmp(&a[n], &b[n], sizeof(float)) != 0) {
            *first_diff = n;
            return 0;
        }
    return 1;
}

static void test_invariance(kvg_threadpool **pools, int n_pools)
{
    static const int Ms[] = { 1, 2, 3, 7, 16, 37, 64, 128 };
    enum { ROWS = 140, N = 83, K = 300 };

    for (int ii = 0; ii < n_isas; ii++)
        for (int d = 0; d < 3; d++) {
            wmat w;
            float *x = rnd_vec((size_t)ROWS * K), *bias = rnd_vec(N);
            float *alone = malloc((size_t)ROWS * N * sizeof(float));
            float *y = malloc((size_t)ROWS * N * sizeof(float));
            int good = 1, checked = 0;
            /* The generic kernel is slow (a libm call per step): fewer sizes there. */
            int n_ms = isas[ii] == KVG_ISA_GENERIC ? 5 : (int)(sizeof Ms / sizeof Ms[0]);

            wmat_make(&w, dtypes[d], N, K);
            for (int r = 0; r < ROWS; r++)
                kvg_gemm_with_isa(isas[ii], NULL, tws, x + (size_t)r * K, 1, K, &w.t, bias,
                                  alone + (size_t)r * N);
            for (int p = 0; p < n_pools && good; p++)
                for (int mi = 0; mi < n_ms && good; mi++) {
                    int M = Ms[mi];
                    /* Two positions of the same rows: from row 0 and from row 11. */
                    for (int start = 0; start <= 11 && good; start += 11) {
                        if (start + M > ROWS)
                            continue;
                        kvg_gemm_with_isa(isas[ii], pools[p], tws, x + (size_t)start * K, M, K, &w.t,
                                          bias, y);
                        for (int m = 0; m < M && good; m++) {
                            int nd = -1;
                            checked++;
                            if (!rows_equal(y + (size_t)m * N, alone + (size_t)(start + m) * N,
                                            N, &nd)) {
                                diag("%s %s threads=%d M=%d start=%d row %d differs at n=%d",
                                     kvg_gemm_isa_name(isas[ii]), dt_names[d],
                                     kvg_threadpool_size(pools[p]), M, start, m, nd);
                                good = 0;
                            }
                        }
                    }
                }
            ok(good, "%s, %s: %d rows of M-row calls (threads 1,2,3) bit-identical to the "
               "row computed alone", kvg_gemm_isa_name(isas[ii]), dt_names[d], checked);
            wmat_free(&w);
            free(x);
            free(bias);
            free(alone);
            free(y);
        }
}

/* The ISAs agree bit for bit on bigger, threaded shapes (incl. the F16/BF16 widening
 * path taken when M exceeds the register block). */
static void test_isa_agreement(kvg_threadpool *tp)
{
    static const int shapes[][3] = { { 1, 130, 288 }, { 5, 61, 100 }, { 37, 100, 250 },
                                     { 64, 48, 64 } };
    if (n_isas < 2) {
        ok(1, "ISAs give identical bits # SKIP only one ISA on this CPU: nothing to compare");
        return;
    }
    for (int d = 0; d < 3; d++) {
        int good = 1;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            wmat w;
            float *x = rnd_vec((size_t)M * K), *bias = rnd_vec((size_t)N);
            float *y0 = malloc((size_t)M * N * sizeof(float));
            float *y1 = malloc((size_t)M * N * sizeof(float));
            wmat_make(&w, dtypes[d], N, K);
            kvg_gemm_with_isa(isas[0], tp, tws, x, M, K, &w.t, bias, y0);
            for (int ii = 1; ii < n_isas; ii++) {
                kvg_gemm_with_isa(isas[ii], tp, tws, x, M, K, &w.t, bias, y1);
                if (memcmp(y0, y1, (size_t)M * N * sizeof(float)) != 0) {
                    diag("%s differs from %s, %s M=%d N=%d K=%d", kvg_gemm_isa_name(isas[ii]),
                         kvg_gemm_isa_name(isas[0]), dt_names[d], M, N, K);
                    good = 0;
                }
            }
            wmat_free(&w);
            free(x);
            free(bias);
            free(y0);
            free(y1);
        }
        ok(good, "%s weights: %d ISAs give identical bits", dt_names[d], n_isas);
    }
}

/* kvg_gemm_multi: several products of one X in one job give, for every ISA, thread
 * count, M (decode and packed sizes) and dtype, exactly the bits of one kvg_gemm per
 * product; mixed dtypes fall back to one at a time; bad calls are refused. */
static void test_multi(kvg_threadpool **pools, int n_pools)
{
    static const int Ms[] = { 1, 3, 8, 13, 40 };
    /* Big enough that M = 1 already runs on the pool (the decode kernel's groups). */
    static const int Ns[3] = { 140, 47, 93 };
    enum { K = 300 };
    for (int ii = 0; ii < n_isas; ii++)
        for (int d = 0; d < 3; d++) {
            wmat w[3];
            const kvg_tensor *wt[3];
            float *x = rnd_vec((size_t)40 * K), *b0 = rnd_vec(140), *b2 = rnd_vec(93);
            const float *bias[3] = { b0, NULL, b2 };
            float *ya[3], *yb[3];
            int good = 1, n_ms = isas[ii] == KVG_ISA_GENERIC ? 3 : 5;
            for (int i = 0; i < 3; i++) {
                wmat_make(&w[i], dtypes[d], Ns[i], K);
                wt[i] = &w[i].t;
                ya[i] = malloc((size_t)40 * Ns[i] * sizeof(float));
                yb[i] = malloc((size_t)40 * Ns[i] * sizeof(float));
            }
            for (int p = 0; p < n_pools; p++)
                for (int mi = 0; mi < n_ms; mi++) {
                    int M = Ms[mi];
                    for (int n = 1; n <= 3; n++) {
                        for (int i = 0; i < n; i++) {
                            kvg_gemm_with_isa(isas[ii], pools[p], tws, x, M, K, wt[i], bias[i], ya[i]);
                            memset(yb[i], 0xff, (size_t)M * Ns[i] * sizeof(float));
                        }
                        if (kvg_gemm_multi_with_isa(isas[ii], pools[p], tws, x, M, K, n, wt, bias, yb) != 0)
                            good = 0;
                        for (int i = 0; i < n; i++)
                            if (memcmp(ya[i], yb[i], (size_t)M * Ns[i] * sizeof(float)) != 0) {
                                diag("%s %s threads=%d M=%d n=%d: product %d differs",
                                     kvg_gemm_isa_name(isas[ii]), dt_names[d],
                                     kvg_threadpool_size(pools[p]), M, n, i);
                                good = 0;
                            }
                    }
                }
            ok(good, "%s, %s: 1-3 products in one job bit-identical to one call each (threads 1-3, "
               "M 1..40)", kvg_gemm_isa_name(isas[ii]), dt_names[d]);
            for (int i = 0; i < 3; i++) {
                wmat_free(&w[i]);
                free(ya[i]);
                free(yb[i]);
            }
            free(x);
            free(b0);
            free(b2);
        }
    {
        /* Mixed dtypes, a product with no rows, and the refusals. */
        wmat a, b;
        kvg_tensor empty = { NULL, KVG_DT_F32, 0, 64 };
        float *x = rnd_vec((size_t)5 * 64), *ya = malloc(5 * 30 * sizeof(float));
        float *yb = malloc(5 * 20 * sizeof(float)), *r0 = malloc(5 * 30 * sizeof(float));
        float *r1 = malloc(5 * 20 * sizeof(float));
        const kvg_tensor *wt[3];
        float *ys[3] = { ya, yb, NULL };
        kvg_tensor bad;
        wmat_make(&a, KVG_DT_F32, 30, 64);
        wmat_make(&b, KVG_DT_BF16, 20, 64);
        wt[0] = &a.t;
        wt[1] = &b.t;
        kvg_gemm(pools[n_pools - 1], tws, x, 5, 64, &a.t, NULL, r0);
        kvg_gemm(pools[n_pools - 1], tws, x, 5, 64, &b.t, NULL, r1);
        ok(kvg_gemm_multi(pools[n_pools - 1], tws, x, 5, 64, 2, wt, NULL, ys) == 0 &&
               memcmp(ya, r0, 5 * 30 * sizeof(float)) == 0 && memcmp(yb, r1, 5 * 20 * sizeof(float)) == 0,
           "F32 and BF16 weights in one call: each as kvg_gemm (one at a time)");
        wt[1] = &empty;
        ok(kvg_gemm_multi(pools[n_pools - 1], tws, x, 5, 64, 2, wt, NULL, ys) == 0 &&
               memcmp(ya, r0, 5 * 30 * sizeof(float)) == 0,
           "a product with no rows is skipped, the others computed");
        ok(kvg_gemm_multi(pools[0], tws, x, 5, 64, 0, NULL, NULL, NULL) == 0, "no products: nothing to do");
        bad = a.t;
        bad.cols = 63;
        wt[1] = &bad;
        ok(kvg_gemm_multi(pools[0], tws, x, 5, 64, 2, wt, NULL, ys) == -1, "a product of the wrong K is refused");
        ok(kvg_gemm_multi(pools[0], tws, x, 5, 64, KVG_GEMM_MULTI_MAX + 1, wt, NULL, ys) == -1,
           "more than KVG_GEMM_MULTI_MAX products are refused");
        wmat_free(&a);
        wmat_free(&b);
        free(x);
        free(ya);
        free(yb);
        free(r0);
        free(r1);
    }
}

/* KVG_GEMM_ISA lowers the level (checked in a child: the choice is made once). */
static void test_env_override(void)
{
    int fds[2];
    pid_t pid;
    char buf[32] = { 0 };
    int status = 0;

    if (pipe(fds) != 0) {
        ok(0, "pipe");
        return;
    }
    pid = fork();
    if (pid == 0) {
        close(fds[0]);
        setenv("KVG_GEMM_ISA", "generic", 1);
        const char *s = kvg_gemm_isa();
        ssize_t wr = write(fds[1], s, strlen(s));
        _exit(wr > 0 ? 0 : 1);
    }
    close(fds[1]);
    ssize_t rd = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    waitpid(pid, &status, 0);
    (void)rd;
    is_str(buf, "generic", "KVG_GEMM_ISA=generic forces the generic kernel");
}

int main(void)
{
    kvg_threadpool *pools[3];

    test_env_override();
    for (int i = 0; i <= KVG_ISA_AVX512; i++)
        if (kvg_gemm_isa_supported((kvg_gemm_isa_id)i))
            isas[n_isas++] = (kvg_gemm_isa_id)i;
    diag("kvg_gemm uses %s; testing %d ISA(s)", kvg_gemm_isa(), n_isas);
    ok(n_isas >= 1 && isas[0] == KVG_ISA_GENERIC, "the generic kernel is always available");

    test_threadpool();
    test_threadpool_slow();
    test_threadpool_poll_sleep();
    for (int i = 0; i < 3; i++)
        pools[i] = kvg_threadpool_new(i + 1);
    tws = kvg_gemm_ws_new(3, 1, 1000);
    if (!tws || kvg_gemm_ws_reserve(tws, 140) != 0)
        BAIL_OUT("cannot make the GEMM workspace");
    test_edges();
    test_canonical();
    test_m_sweep(pools[1]);
    test_reference(pools[1]);
    test_invariance(pools, 3);
    test_isa_agreement(pools[2]);
    test_multi(pools, 3);
    for (int i = 0; i < 3; i++)
        kvg_threadpool_free(pools[i]);
    kvg_gemm_ws_free(tws);
    return done_testing();
}
