/* A small thread pool for the CPU backend.
 *
 * Workers wait passively (condition variables; at most ~25 us of polling after a job):
 * these machines are shared, and spin-waiting barriers collapse 10-30x when another
 * process takes a core. A job is a function called on ranges of [0, n): the pool splits
 * [0, n) into min(n, 4 * threads) contiguous non-empty ranges in a FIXED way that
 * depends only on n and the thread count, runs each range exactly once, and returns
 * when all are done. Which thread runs a range is NOT fixed: threads claim ranges as
 * they go (the caller starts with range 0), so a descheduled worker never stalls a
 * job; key per-range scratch by the range (or by index), never by the thread. Callers make results
 * independent of the split (each index writes its own outputs), which is what keeps
 * kernels batch-invariant. */
#ifndef KVG_THREADPOOL_H
#define KVG_THREADPOOL_H

#include <stddef.h>

typedef struct kvg_threadpool kvg_threadpool;

/* n_threads <= 0: the number of online CPUs. The calling thread works too. */
kvg_threadpool *kvg_threadpool_new(int n_threads);
void kvg_threadpool_free(kvg_threadpool *tp);
int kvg_threadpool_size(const kvg_threadpool *tp);

/* Calls fn(ctx, begin, end) on the disjoint non-empty ranges covering [0, n), possibly
 * concurrently. tp NULL or of one thread: one inline call fn(ctx, 0, n). Not reentrant:
 * one job at a time per pool, and fn must not call kvg_threadpool_run on the same pool. */
typedef void (*kvg_range_fn)(void *ctx, size_t begin, size_t end);
void kvg_threadpool_run(kvg_threadpool *tp, size_t n, kvg_range_fn fn, void *ctx);

#endif
