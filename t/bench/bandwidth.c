/* Memory read bandwidth: a plain streaming read of a buffer far larger than the
 * last-level cache, with 1 and with N threads (default: 1 and 2), in GB/s (1e9 bytes).
 * Batch-1 decode reads every weight once per token, so bandwidth / weight bytes per
 * token is the decode roofline that t/bench/engine compares both engines against.
 *
 *   build/bench/bandwidth [--mib 512] [--passes 7] [--threads 1,2]
 *
 * Each thread reads its own contiguous share with wide loads into several
 * accumulators (so the adds never bound the loop); a pass is timed from a barrier to
 * the last thread's end. The best pass is the figure (the others are disturbed by the
 * neighbours of a shared machine); the median is printed too.
 * Prints "RESULT bw1=... bw1_med=... bw2=... bw2_med=..." (best and median, GB/s).
 * Figures only. */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct share {
    const uint64_t *p;
    size_t n;                    /* uint64 words; a multiple of 32 */
    uint64_t sink;
    pthread_barrier_t *start;
    double begin, end;
} share;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint64_t *p, size_t n)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 32) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + i + 8)));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p + i + 16)));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p + i + 24)));
    }
    a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    return (uint64_t)_mm512_reduce_add_epi64(a0);
}

__attribute__((target("avx2"))) static uint64_t read_avx2(const uint64_t *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const void *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const void *)(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const void *)(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const void *)(p + i + 12)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t t[4];
    memcpy(t, &a0, sizeof t);
    return t[0] + t[1] + t[2] + t[3];
}

static uint64_t read_plain(const uint64_t *p, size_t n)
{
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i < n; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
    }
    return a0 + a1 + a2 + a3;
}

static int isa;                  /* 2 avx512, 1 avx2, 0 plain */

static void *reader(void *arg)
{
    share *s = arg;
    pthread_barrier_wait(s->start);
    s->begin = now_s();
    s->sink += isa == 2 ? read_avx512(s->p, s->n) : isa == 1 ? read_avx2(s->p, s->n) : read_plain(s->p, s->n);
    s->end = now_s();
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    size_t mib = 512;
    int passes = 7, tlist[8] = { 1, 2 }, nt = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--mib") == 0)
            mib = (size_t)atol(argv[i + 1]);
        else if (strcmp(argv[i], "--passes") == 0)
            passes = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0) {
            char *e;
            const char *p = argv[i + 1];
            nt = 0;
            while (*p && nt < 8) {
                tlist[nt] = (int)strtol(p, &e, 10);
                if (e == p || tlist[nt] < 1 || tlist[nt] > 64)
                    break;
                nt++;
                p = *e == ',' ? e + 1 : e;
            }
        } else {
            fprintf(stderr, "usage: bandwidth [--mib N] [--passes N] [--threads 1,2]\n");
            return 2;
        }
    }
    if (mib < 64 || passes < 1 || passes > 99 || nt < 1) {
        fprintf(stderr, "bandwidth: bad numbers (--mib at least 64)\n");
        return 2;
    }
    __builtin_cpu_init();
    isa = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;

    size_t bytes = mib << 20, words = bytes / 8;
    uint64_t *buf = aligned_alloc(64, bytes);
    if (!buf) {
        fprintf(stderr, "bandwidth: out of memory for %zu MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < words; i++)      /* touched: real pages, not the zero page */
        buf[i] = i;

    printf("bandwidth: streaming read of %zu MiB, %s loads, best and median of %d passes\n", mib,
           isa == 2 ? "AVX-512" : isa == 1 ? "AVX2" : "scalar", passes);
    double best[8], median[8];
    uint64_t sink = 0;
    for (int ti = 0; ti < nt; ti++) {
        int T = tlist[ti];
        share sh[64];
        pthread_t th[64];
        pthread_barrier_t bar;
        double gbs[99];
        size_t per = words / (size_t)T / 32 * 32;
        for (int pass = 0; pass < passes + 1; pass++) {     /* pass 0: warm-up */
            pthread_barrier_init(&bar, NULL, (unsigned)T + 1);
            for (int t = 0; t < T; t++) {
                sh[t] = (share){ buf + (size_t)t * per, per, 0, &bar, 0, 0 };
                if (pthread_create(&th[t], NULL, reader, &sh[t]) != 0) {
                    fprintf(stderr, "bandwidth: pthread_create failed\n");
                    return 1;
                }
            }
            double t0 = 0, t1 = 0;
            pthread_barrier_wait(&bar);
            /* From the first thread's start to the last one's end (this thread may be
             * descheduled at the barrier: its own clock would flatter the figure). */
            for (int t = 0; t < T; t++) {
                pthread_join(th[t], NULL);
                sink += sh[t].sink;
                if (t == 0 || sh[t].begin < t0)
                    t0 = sh[t].begin;
                if (sh[t].end > t1)
                    t1 = sh[t].end;
            }
            pthread_barrier_destroy(&bar);
            if (pass > 0)
                gbs[pass - 1] = (double)per * 8 * T / (t1 - t0) / 1e9;
        }
        qsort(gbs, (size_t)passes, sizeof *gbs, cmp_double);
        best[ti] = gbs[passes - 1];
        median[ti] = gbs[passes / 2];
        printf("  %2d thread%s %7.1f GB/s (median %.1f)\n", T, T > 1 ? "s" : " ", best[ti], median[ti]);
    }
    printf("RESULT");
    for (int ti = 0; ti < nt; ti++)
        printf(" bw%d=%.2f bw%d_med=%.2f", tlist[ti], best[ti], tlist[ti], median[ti]);
    printf(" sink=%llu\n", (unsigned long long)(sink & 1));
    free(buf);
    return 0;
}
