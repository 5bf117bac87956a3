/* An engine's liveness from its heartbeat (src/liveness.h), rule by rule, on a clock
 * the test sets: an idle engine that beats is never stalled, silence for the deadline
 * is, the deadline counts from the first look at the current value, a change resumes,
 * a rare observer judges only the engine's silence, and a new connection starts
 * afresh. Every time is fixed: the test is deterministic. */
#include <stdint.h>

#include "liveness.h"
#include "tap.h"

int main(void)
{
    kvg_liveness l;
    const int64_t D = 1000;

    /* an idle engine beats every 100 ms: looked at every 100 ms for a minute */
    kvg_liveness_start(&l, 7, 0);
    int changes = 0;
    for (int64_t t = 100; t <= 60000; t += 100)
        changes += kvg_liveness_observe(&l, 7 + (uint64_t)(t / 100), t, D) != KVG_LIVENESS_SAME;
    ok(changes == 0 && !l.stalled, "an engine whose heartbeat moves is never stalled");

    /* silent from here: stalled once the same value has been seen for the deadline */
    kvg_liveness_start(&l, 42, 5000);
    ok(kvg_liveness_observe(&l, 42, 5100, D) == KVG_LIVENESS_SAME, "silent 100 ms: not stalled");
    ok(kvg_liveness_observe(&l, 42, 5999, D) == KVG_LIVENESS_SAME, "silent 999 ms: not stalled");
    is_int((int)kvg_liveness_silent_ms(&l, 5999), 999, "silent_ms counts from the first look");
    ok(kvg_liveness_observe(&l, 42, 6000, D) == KVG_LIVENESS_STALLED, "silent for the deadline: stalled");
    ok(l.stalled, "  and it stays so");
    ok(kvg_liveness_observe(&l, 42, 9000, D) == KVG_LIVENESS_SAME, "a stall is reported once");
    ok(kvg_liveness_observe(&l, 43, 9100, D) == KVG_LIVENESS_RESUMED, "the heartbeat moves: resumed");
    ok(!l.stalled, "  no longer stalled");
    is_int((int)kvg_liveness_silent_ms(&l, 9100), 0, "  silent since the move: 0 ms");
    ok(kvg_liveness_observe(&l, 43, 10099, D) == KVG_LIVENESS_SAME, "the deadline counts afresh from the move");
    ok(kvg_liveness_observe(&l, 43, 10100, D) == KVG_LIVENESS_STALLED, "  and a second silence is a second stall");

    /* any change resumes, even one that goes backwards (a counter that wrapped) */
    ok(kvg_liveness_observe(&l, 1, 10200, D) == KVG_LIVENESS_RESUMED, "a smaller value is a change too");

    /* a rare observer: looks after 5 s, the engine moved meanwhile */
    kvg_liveness_start(&l, 100, 20000);
    ok(kvg_liveness_observe(&l, 350, 25000, D) == KVG_LIVENESS_SAME,
       "an observer that looks late sees a change: the engine was not silent");
    ok(kvg_liveness_observe(&l, 350, 25500, D) == KVG_LIVENESS_SAME,
       "  and the deadline counts from that look, not from the last one before it");
    ok(kvg_liveness_observe(&l, 350, 26000, D) == KVG_LIVENESS_STALLED, "  silent a deadline from that look: stalled");

    /* a new connection (the engine restarted: its counter starts again) */
    kvg_liveness_start(&l, 0, 30000);
    ok(!l.stalled && kvg_liveness_observe(&l, 0, 30500, D) == KVG_LIVENESS_SAME, "start: not stalled");
    ok(kvg_liveness_observe(&l, 0, 31000, D) == KVG_LIVENESS_STALLED, "  a connection that never beats stalls too");
    return done_testing();
}
