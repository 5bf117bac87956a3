/* Shared by the benchmarks that run the engine as a process (ipc_bench, gateway_bench):
 * a monotonic clock, percentiles, and starting $BUILD/bin/kvgate-engine until its
 * readiness line. Header-only. */
#ifndef KVG_BENCH_PROC_H
#define KVG_BENCH_PROC_H

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "monoclock.h"

__attribute__((unused)) static double now_s(void)
{
    return kvg_mono_s();
}

static int bench_cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The p-quantile of v[0..n) (sorts v). */
__attribute__((unused)) static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_d);
    return v[(int)(p * (n - 1) + 0.5)];
}

/* Starts the engine with args (NULL-terminated, after the binary name) and waits for
 * its readiness line on stdout; its stderr goes to /dev/null. It dies with us. The pid,
 * or -1. */
__attribute__((unused)) static pid_t bench_start_engine(const char *const *args)
{
    const char *b = getenv("BUILD");
    char bin[1024], line[1024];
    const char *argv[48];
    int p[2], n = 0;
    snprintf(bin, sizeof bin, "%s/bin/kvgate-engine", b && *b ? b : "build");
    argv[n++] = bin;
    for (int i = 0; args[i] && n < 47; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(p[1], 1);
        int dn = open("/dev/null", O_WRONLY);
        dup2(dn, 2);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    ssize_t r = read(p[0], line, sizeof line - 1);
    close(p[0]);
    if (r <= 0) {
        fprintf(stderr, "bench: %s did not start\n", bin);
        return -1;
    }
    return pid;
}

#endif
