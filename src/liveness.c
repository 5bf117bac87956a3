/* An engine's liveness from its heartbeat: see liveness.h for the rule. */
#include "liveness.h"

void kvg_liveness_start(kvg_liveness *l, uint64_t beat, int64_t now_ms)
{
    l->beat = beat;
    l->seen_ms = now_ms;
    l->stalled = 0;
}

kvg_liveness_change kvg_liveness_observe(kvg_liveness *l, uint64_t beat, int64_t now_ms,
                                         int64_t deadline_ms)
{
    if (beat != l->beat) {
        int was = l->stalled;
        kvg_liveness_start(l, beat, now_ms);
        return was ? KVG_LIVENESS_RESUMED : KVG_LIVENESS_SAME;
    }
    if (!l->stalled && now_ms - l->seen_ms >= deadline_ms) {
        l->stalled = 1;
        return KVG_LIVENESS_STALLED;
    }
    return KVG_LIVENESS_SAME;
}

int64_t kvg_liveness_silent_ms(const kvg_liveness *l, int64_t now_ms)
{
    return now_ms > l->seen_ms ? now_ms - l->seen_ms : 0;
}
