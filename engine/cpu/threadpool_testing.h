/* For tests only: the thread pool's count of jobs (threadpool.c), which the GEMM test
 * checks and the engine benchmark's profile reports. Not the CPU backend's API:
 * nothing outside t/ calls it. */
#ifndef KVG_THREADPOOL_TESTING_H
#define KVG_THREADPOOL_TESTING_H

#include "cpu/threadpool.h"

/* Jobs handed to the workers so far (runs done inline are not counted): each is one
 * synchronisation point, which is what a benchmark's profile counts per token. Read
 * by the thread that calls kvg_threadpool_run. */
unsigned long long kvg_threadpool_jobs(const kvg_threadpool *tp);

#endif
