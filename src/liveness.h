/* Whether an engine is making progress: judged from its heartbeat (proto.h,
 * kvg_client_heartbeat) as the caller sees it over time. Plain C, no clock of its own
 * and no system call: the caller passes its own monotonic milliseconds (an nginx
 * worker its ngx_current_msec), so the same rule runs in the gateway and in tests.
 *
 * The rule: an engine is STALLED once its heartbeat has been seen unchanged for
 * deadline_ms, counted from the first look that saw the current value (a
 * conservative start: the value may have changed a little earlier). Any change of the
 * value ends a stall. An observer that looks rarely (a worker that was busy itself)
 * sees a changed value and judges nothing wrong: only the engine's silence counts,
 * never the observer's. Look at least every deadline_ms / 10 for a stall to be seen
 * within about 1.2 x deadline_ms of the last beat.
 *
 * The deadline must exceed the longest time the engine goes without a beat while
 * healthy: KVG_HEARTBEAT_IDLE_MS while idle, and its longest layer of a forward step
 * (a large prefill chunk of a large model on the CPU) while busy. */
#ifndef KVG_LIVENESS_H
#define KVG_LIVENESS_H

#include <stdint.h>

typedef struct kvg_liveness {
    uint64_t beat;               /* the heartbeat as last seen */
    int64_t seen_ms;             /* when that value was first seen */
    int stalled;
} kvg_liveness;

typedef enum kvg_liveness_change {
    KVG_LIVENESS_SAME = 0,       /* no change of state */
    KVG_LIVENESS_STALLED,        /* it just went silent for deadline_ms */
    KVG_LIVENESS_RESUMED         /* it was stalled and its heartbeat moved */
} kvg_liveness_change;

/* Starts watching (a new connection): not stalled, beat first seen now. */
void kvg_liveness_start(kvg_liveness *l, uint64_t beat, int64_t now_ms);

/* One look at the heartbeat at now_ms (never earlier than the last look's). */
kvg_liveness_change kvg_liveness_observe(kvg_liveness *l, uint64_t beat, int64_t now_ms,
                                         int64_t deadline_ms);

/* How long the heartbeat has been seen unchanged, at now_ms. */
int64_t kvg_liveness_silent_ms(const kvg_liveness *l, int64_t now_ms);

#endif
