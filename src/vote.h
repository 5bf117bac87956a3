/* Self-consistency: answer extraction, normalization, the tally, the decision
 * rule and the wave driver. Plain C (no nginx), shared by the gateway and the
 * benchmark t/bench/self_consistency, so both run exactly the same rule.
 *
 * A self-consistency request draws up to n samples of one prompt, extracts an
 * answer from each finished sample, votes, and stops drawing (and cancels what
 * still runs) as soon as the outcome is certain. The caller feeds every finished
 * sample to kvg_sc_finished and carries out the action it returns:
 *
 *   s = kvg_sc_new(&cfg);                       // NULL: bad config or no memory
 *   submit the request with n_active = kvg_sc_initial(s);
 *   on FINISHED of sample j:
 *       extract (kvg_vote_default_answer or the pattern), kvg_vote_normalize,
 *       kvg_sc_finished(s, j, ans, len, mean_logprob, cancelled, &act);
 *       if (act.draw || act.cancel_mask) kvg_client_samples(c, id, act.draw, act.cancel_mask);
 *   at DONE: kvg_sc_answer, kvg_sc_answer_at, kvg_sc_samples_run, kvg_sc_stopped_early.
 *
 * ---- The default extractor (kvg_vote_default_answer) ----
 * 1. The LAST number in the text. A number is a run of ASCII digits, with
 *    - a leading '-' when the '-' directly precedes the first digit and is not
 *      itself preceded by an ASCII letter or digit ("-3.5" -> "-3.5", but
 *      "pages 3-5" -> "5"); '+' is never part of the number;
 *    - thousands groups: when the first run has 1 to 3 digits, each ",ddd"
 *      (a comma and exactly three digits, not followed by a fourth) continues
 *      the number ("1,234,567" -> "1,234,567"; "1,2,3" -> "3"; "12345,678" ->
 *      "678"); the normalizer then removes the commas, so "1,234" and "1234"
 *      are the same answer;
 *    - a fraction: '.' followed by at least one digit ("42." -> "42",
 *      "3.14" -> "3.14"; ".5" -> "5": a number starts with a digit).
 *    No exponents, no non-ASCII digits. Digits inside words count ("x7" -> "7").
 *    "The answer is 42." -> "42"; "x=7 then 12" -> "12".
 * 2. Else the last line ('\n'-separated, a trailing '\r' dropped) that is not
 *    empty after trimming Unicode white space; the span returned is trimmed.
 * 3. Else (empty or white-space-only text) no answer.
 *
 * ---- Normalization (kvg_vote_normalize) ----
 * In this order, on code points (invalid UTF-8 bytes become U+FFFD):
 * 1. Trim Unicode white space at both ends (U+0009..U+000D, U+0085 and the
 *    categories Zs, Zl, Zp: U+0020, U+00A0, U+1680, U+2000..U+200A, U+2028,
 *    U+2029, U+202F, U+205F, U+3000).
 * 2. Repeat until nothing changes: trim white space; drop ONE trailing
 *    punctuation character among  . , ; : ! ?  and their full-width/CJK forms
 *    U+3002 。 U+FF0E ． U+FF0C ， U+3001 、 U+FF1B ； U+FF1A ： U+FF01 ！
 *    U+FF1F ？ and U+2026 …; or, when the whole answer is wrapped in a pair,
 *    drop the pair: the same character at both ends among  " ' ` *  (so
 *    "**Paris**" -> "Paris"), or one of the bracket pairs “” ‘’ «» () [] {} 「」
 *    where the opening bracket is closed only by the last character
 *    ("(a) and (b)" stays). Closing quotes or brackets alone are NOT stripped
 *    ("f(x)" stays "f(x)").
 * 3. Runs of white space inside the answer become one U+0020.
 * 4. Unicode case folding (utf8proc, full folding: "Straße" == "STRASSE"), then
 *    NFC, so "Paris" == "PARIS" == " paris. ".
 * 5. A number written with thousands groups (-?d{1,3}(,ddd)+(.d+)?) loses its
 *    commas: "1,234" -> "1234". Nothing else is rewritten ("42.0" != "42").
 * The result is cut at a character boundary to at most cap - 1 bytes and never
 * more than KVG_VOTE_ANSWER_MAX bytes: answers that agree on their first 256
 * bytes are the same answer.
 *
 * ---- The decision rule (kvg_sc_finished) ----
 * Every finished sample with an answer votes once: weight 1 (majority) or
 * exp(mean token logprob) in (0, 1] (logprob; a positive mean counts as 0, a NaN
 * or -inf mean gives weight 0). Samples without an answer and cancelled samples
 * do not vote. Let W(a) = the votes of answer a (count, or sum of weights),
 * T = the sum of W over all answers, lead = the first answer in the tally order
 * below, second = the next one (W = 0 when there is none), and R = the samples
 * drawn and still running. A sample adds at most 1 to W in both modes, so the
 * vote is DECIDED when
 *     every sample has finished, or
 *     at least min_samples samples have finished, T > 0,
 *     W(lead) >= agreement * T (up to 1e-9 of rounding) and W(lead) - W(second) > R
 * i.e. the lead holds the agreed share of the finished votes and no outcome of
 * the samples in flight can change the winner. Samples not yet drawn are the
 * budget, not votes: once decided they are never drawn (as in Adaptive- and
 * Early-Stopping Self-Consistency, which stop on the samples seen so far). With
 * min_samples = 0 every sample is drawn at once, so R is every sample not yet
 * finished: no outcome at all could change the winner. `agreement` only gates
 * early stopping: when every sample has finished, the lead wins whatever its
 * share. The winner is the lead; no sample voting = no answer.
 * Tally order (also the tie-break at the end): larger W first, then larger
 * count, then the answer whose first vote came from the lowest sample index.
 * (Counts and sums of 1.0 are exact in double, so majority ties are exact.)
 * Once decided the decision stands: a sample that finishes normally afterwards
 * (its cancel crossed its end) still votes, which cannot change the winner (the
 * margin exceeded what was in flight); cancelled ones do not vote.
 *
 * ---- Waves ----
 * min_samples = 0: all n samples start at submit (initial = n); the vote may
 * still be decided before the last finishes, and then the running ones are
 * cancelled. min_samples >= 1: initial = min_samples; when a sample finishes,
 * the vote is undecided, no drawn sample is still running and samples remain
 * undrawn, the next wave starts: draw = min(wave, undrawn) (wave 0 = min_samples).
 * On the call that decides while samples remain, cancel_mask = the bits of the
 * running AND the undrawn samples (the engine drops undrawn ones) and no draw.
 *
 * Limits: 1 <= n <= KVG_SC_MAX_N (32: the protocol's cancel_mask is 32 bits).
 * No allocation after kvg_sc_new; answers are copied into the kvg_sc. */
#ifndef KVG_VOTE_H
#define KVG_VOTE_H

#include <stddef.h>
#include <stdint.h>

#define KVG_VOTE_ANSWER_MAX 256      /* bytes of a normalized answer, without the NUL */
#define KVG_SC_MAX_N        32       /* samples of one self-consistency request */

typedef enum kvg_vote_kind { KVG_VOTE_MAJORITY = 1, KVG_VOTE_LOGPROB = 2 } kvg_vote_kind;

/* The default extractor (rules above). Returns 1 with [*ans, *ans + *ans_len)
 * inside text, 0 when the text has no answer. */
int kvg_vote_default_answer(const char *text, size_t len, const char **ans, size_t *ans_len);

/* Normalizes in[0..len) into out (cap bytes, NUL-terminated when cap >= 1).
 * Returns the length written; 0 = empty = no answer. Allocates nothing. */
size_t kvg_vote_normalize(const char *in, size_t len, char *out, size_t cap);

typedef struct kvg_sc kvg_sc;

typedef struct kvg_sc_config {
    kvg_vote_kind vote;
    unsigned n;                  /* 1..KVG_SC_MAX_N */
    unsigned min_samples;        /* 0: all n at once; else 1..n */
    unsigned wave;               /* 0: min_samples */
    double agreement;            /* (0, 1] */
} kvg_sc_config;

/* NULL when the config is out of range or memory is short. The initial samples
 * count as drawn from here on. */
kvg_sc *kvg_sc_new(const kvg_sc_config *c);
void kvg_sc_free(kvg_sc *s);

/* Samples to start at submit (the request's n_active): min_samples, or n. */
unsigned kvg_sc_initial(const kvg_sc *s);

typedef struct kvg_sc_action {
    unsigned draw;               /* start this many more samples (the next ones in index order) */
    uint32_t cancel_mask;        /* cancel these samples (bit j = sample j) */
    int decided;                 /* the vote is decided (stays 1 on every later call) */
} kvg_sc_action;

/* Sample `sample` finished: answer (already extracted and normalized; NULL or
 * len 0 = no answer; longer than KVG_VOTE_ANSWER_MAX is cut at a character
 * boundary), its mean token logprob (KVG_VOTE_LOGPROB only), cancelled = it was
 * stopped or dropped by a cancel (does not vote). Fills *act (always). Reports
 * for a sample that is out of range, already finished, or not drawn are
 * ignored (act = nothing to do), except a cancelled report for an undrawn
 * sample (the engine dropped it), which just marks it finished. */
void kvg_sc_finished(kvg_sc *s, unsigned sample, const char *answer, size_t len,
                     double mean_logprob, int cancelled, kvg_sc_action *act);

/* The winner (the current lead before the decision), NUL-terminated; NULL with
 * *len = 0 when no sample has voted. len may be NULL. */
const char *kvg_sc_answer(const kvg_sc *s, size_t *len);
/* The tally, in the tally order (index 0 = the winner). */
size_t kvg_sc_n_answers(const kvg_sc *s);
void kvg_sc_answer_at(const kvg_sc *s, size_t i, const char **ans, size_t *len,
                      unsigned *count, double *weight);
unsigned kvg_sc_samples_run(const kvg_sc *s);    /* samples drawn (started) so far */
/* The decision saved work: some sample was never drawn, or finished
 * cancelled. Not merely decided early: when every cancel crosses its sample's
 * end (all of them finish normally), nothing was saved and this is 0. Read
 * it once every sample has reported (at DONE). */
int kvg_sc_stopped_early(const kvg_sc *s);

#endif
