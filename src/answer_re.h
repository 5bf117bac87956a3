/* kvgate.answer_pattern: the answer of a self-consistency sample is capture 1
 * of the LAST match of the request's pattern in the end of the sample's text.
 * Plain C over PCRE2 (no nginx), so the gateway and the unit tests run the
 * same matcher.
 *
 * The pattern is PCRE2 syntax, compiled byte-oriented as nginx compiles its
 * own regexes (no UTF mode: '.' is one byte, \w is ASCII). Matches are looked
 * for one after the other from the start of the text, each from where the one
 * before ended (one byte further after an empty match), so anchors and
 * lookbehinds see the whole text, as in a global search; the last match that
 * sets capture 1 gives the answer.
 *
 * ---- Why matching has a budget ----
 * The pattern comes from the client and runs in the nginx worker's event
 * loop, where nothing else runs while it does. A backtracking pattern such as
 * (?s)(?:.|.){1,14}\x00|(.) costs 2^14 steps at each of the 4,096 start
 * positions (6 s of CPU per sample interpreted); PCRE2's own match limit does
 * not help, as it counts per start position and the global search calls
 * pcre2_match once per match. So every pattern item PCRE2 tries is counted
 * (an automatic callout before each item), across every start position and
 * every call, and the match is abandoned when a sample's count passes
 * sample_steps or the request's total passes request_steps. The count is
 * exact and deterministic: the same pattern over the same text always takes
 * the same steps, so a request is refused or answered the same way each time.
 * Measured here (x86-64, PCRE2 10.42 with JIT): ~5 ns a step, so the default
 * 1,000,000 steps a sample hold the event loop for ~5 ms at most (~21 ms
 * where PCRE2 has no JIT); ordinary patterns over a 4 KiB tail take 300 to
 * 30,000 steps.
 *
 * Memory is bounded too: PCRE2's backtracking frames (interpreter) at
 * KVG_ANSWER_RE_HEAP_KIB, the JIT's stack at KVG_ANSWER_RE_JIT_STACK.
 * Running out of either is the same refusal as running out of steps. */
#ifndef KVG_ANSWER_RE_H
#define KVG_ANSWER_RE_H

#include <stddef.h>
#include <stdint.h>

#include "api_error.h"

#define KVG_ANSWER_RE_SAMPLE_STEPS  1000000    /* defaults of kvgate_answer_pattern_steps */
#define KVG_ANSWER_RE_REQUEST_STEPS 4000000
#define KVG_ANSWER_RE_HEAP_KIB      16384      /* interpreter's backtracking frames */
#define KVG_ANSWER_RE_JIT_STACK     (4u << 20) /* bytes, reserved; pages used on demand */

typedef struct kvg_answer_re kvg_answer_re;

/* Compiles pattern[0..len) (not NUL-terminated). NULL with *err set: 400
 * invalid_value on param "kvgate.answer_pattern" when it does not compile
 * (PCRE2's message and the offset) or has not exactly one capture group; 500
 * when memory is short. Steps of 0 mean no limit (tests only). */
kvg_answer_re *kvg_answer_re_new(const char *pattern, size_t len, uint64_t sample_steps,
                                 uint64_t request_steps, kvg_api_error *err);
void kvg_answer_re_free(kvg_answer_re *re);

/* The answer of one sample: 1 with [*ans, *ans + *ans_len) inside text, 0
 * when no match sets capture 1, -1 when the matching was abandoned (the
 * sample's or the request's steps ran out, or PCRE2's memory bounds): *err is
 * set (422 answer_pattern_too_costly on "kvgate.answer_pattern", saying
 * which bound) and every later call returns -1 as well. */
int kvg_answer_re_last(kvg_answer_re *re, const char *text, size_t len, const char **ans,
                       size_t *ans_len, kvg_api_error *err);

/* Steps taken so far, over every sample. */
uint64_t kvg_answer_re_steps(const kvg_answer_re *re);

#endif
