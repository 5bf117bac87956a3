/* The one clock of the tree: monotonic time for deadlines, timeouts and latencies, and
 * wall-clock time where a protocol wants a date. Header-only so that the library, the
 * engine, the commands, the tests and the benchmarks read it the same way without a
 * link dependency. */
#ifndef KVG_MONOCLOCK_H
#define KVG_MONOCLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic nanoseconds: unaffected by settimeofday and NTP steps. */
static inline uint64_t kvg_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline int64_t kvg_mono_ms(void)
{
    return (int64_t)(kvg_mono_ns() / 1000000u);
}

static inline double kvg_mono_s(void)
{
    return (double)kvg_mono_ns() * 1e-9;
}

/* Milliseconds since the Unix epoch (wall clock: for "created" fields, never for timing). */
static inline uint64_t kvg_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#endif
