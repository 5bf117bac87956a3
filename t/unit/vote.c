/* Self-consistency's vote library (src/vote.h), written from the documented rule:
 * the default extractor, normalization, the tally and its tie-break, the decision
 * rule (early stop only when no outcome of the rest can change the winner, and
 * the lead holds `agreement` of the votes), waves, and all-at-once mode. */
#include <math.h>

#include "tap.h"
#include "vote.h"
#include "vote_testing.h"

/* ---- the extractor ---- */

static void extract_is(const char *text, const char *want, const char *name)
{
    const char *a = NULL;
    size_t l = 0;
    int r = kvg_vote_default_answer(text, strlen(text), &a, &l);

    if (!want) {
        if (!ok(r == 0, "extract %s: no answer", name))
            diag("  got '%.*s'", (int)l, a);
        return;
    }
    ok(r == 1 && a >= text && a + l <= text + strlen(text) && l == strlen(want)
       && memcmp(a, want, l) == 0, "extract %s -> '%s'", name, want);
    if (r == 1 && (l != strlen(want) || memcmp(a, want, l) != 0))
        diag("  got '%.*s'", (int)l, a);
}

static void test_extractor(void)
{
    extract_is("The answer is 42.", "42", "sentence");
    extract_is("-3.5", "-3.5", "negative decimal");
    extract_is("x=7 then 12", "12", "last number");
    extract_is("total: 1,234 apples", "1,234", "thousands group");
    extract_is("1,234,567", "1,234,567", "two groups at the end");
    extract_is("1,2,3", "3", "a list is not a group");
    extract_is("12345,678", "678", "a long first run takes no group");
    extract_is("1,2345", "2345", "four digits after the comma");
    extract_is("pages 3-5", "5", "a dash between numbers is not a sign");
    extract_is("(-7)", "-7", "a sign after a bracket");
    extract_is("is 3.14.", "3.14", "trailing period");
    extract_is("about .5", "5", "a number starts with a digit");
    extract_is("+8", "8", "plus is no sign");
    extract_is("gpt4 says x", "4", "digits inside a word");
    extract_is("Paris\nLondon\n\n  \n", "London", "last non-empty line");
    extract_is("first\r\n  second  \r\n", "second", "CRLF lines, trimmed");
    extract_is("\xe3\x80\x80Tokyo\xe3\x80\x80", "Tokyo", "Unicode white space trimmed");
    extract_is("", NULL, "empty");
    extract_is(" \n\t \r\n", NULL, "white space only");
    extract_is("\xe3\x80\x80\n\xc2\xa0", NULL, "Unicode white space only");
    {
        const char *a;
        size_t l;
        ok(kvg_vote_default_answer(NULL, 0, &a, &l) == 0, "extract NULL: no answer");
    }
}

/* ---- normalization ---- */

static void norm_is(const char *in, const char *want, const char *name)
{
    char out[KVG_VOTE_ANSWER_MAX + 1];
    size_t n = kvg_vote_normalize(in, strlen(in), out, sizeof out);

    ok(n == strlen(want) && strcmp(out, want) == 0, "normalize %s", name);
    if (n != strlen(want) || strcmp(out, want) != 0)
        diag("  got '%s' (%zu), expected '%s'", out, n, want);
}

static void test_normalize(void)
{
    char out[KVG_VOTE_ANSWER_MAX + 1], big[1200];
    size_t n;

    norm_is("Paris", "paris", "case");
    norm_is("PARIS", "paris", "upper case");
    norm_is(" paris. ", "paris", "trim + period");
    norm_is("\"Paris.\"", "paris", "quotes around, period inside");
    norm_is("**42**", "42", "markdown bold");
    norm_is("\xe2\x80\x9cYes!\xe2\x80\x9d", "yes", "curly quotes");
    norm_is("(yes)", "yes", "brackets around");
    norm_is("f(x)", "f(x)", "a closing bracket alone stays");
    norm_is("(a) and (b)", "(a) and (b)", "brackets not around the whole");
    norm_is("New   York!?", "new york", "inner white space collapsed, punctuation run");
    norm_is("Stra\xc3\x9f" "e", "strasse", "full case folding");
    norm_is("STRASSE", "strasse", "full case folding (2)");
    norm_is("e\xcc\x81t\xc3\xa9", "\xc3\xa9t\xc3\xa9", "NFC after folding");
    norm_is("\xc3\x89T\xc3\x89", "\xc3\xa9t\xc3\xa9", "folded precomposed");
    norm_is("\xe7\xad\x94\xe6\xa1\x88\xe3\x80\x82", "\xe7\xad\x94\xe6\xa1\x88", "ideographic full stop");
    norm_is("\xe3\x80\x80x\xc2\xa0", "x", "Unicode white space trimmed");
    norm_is("1,234", "1234", "thousands groups lose their commas");
    norm_is("-1,234,567.50", "-1234567.50", "negative grouped decimal");
    norm_is("1,23", "1,23", "not a group");
    norm_is("a, b", "a, b", "commas elsewhere stay");
    norm_is("42.0", "42.0", "no numeric rewriting");
    norm_is("\xff", "\xef\xbf\xbd", "invalid UTF-8 becomes U+FFFD");
    norm_is("  \t ", "", "white space only is empty");
    norm_is("...", "", "punctuation only is empty");
    norm_is("\"\"", "", "empty quotes");

    n = kvg_vote_normalize("abc", 3, out, 0);
    ok(n == 0, "cap 0 writes nothing");
    memset(big, 'A', 1000);
    n = kvg_vote_normalize(big, 1000, out, sizeof out);
    ok(n == KVG_VOTE_ANSWER_MAX && strlen(out) == n && out[0] == 'a', "long answer cut at %d bytes",
       KVG_VOTE_ANSWER_MAX);
    n = kvg_vote_normalize(big, 1000, out, 10);
    ok(n == 9 && strlen(out) == 9, "cut to cap - 1");
    for (int i = 0; i < 600; i++)
        memcpy(big + 2 * i, "\xc3\x89", 2);
    n = kvg_vote_normalize(big, 1200, out, sizeof out);
    ok(n == KVG_VOTE_ANSWER_MAX && (unsigned char)out[0] == 0xc3 && (unsigned char)out[1] == 0xa9,
       "long multi-byte answer folded and cut on a character boundary (%zu)", n);
    n = kvg_vote_normalize(big, 1200, out, 8);
    ok(n == 6, "odd cap cut on a character boundary (%zu)", n);
    /* a long answer's real end is trimmed */
    memset(big, 'b', 1000);
    memcpy(big + 1000, " .", 2);
    n = kvg_vote_normalize(big, 1002, out, sizeof out);
    ok(n == KVG_VOTE_ANSWER_MAX, "long answer with trailing punctuation");
}

/* ---- the wave driver ---- */

static kvg_sc *mk(kvg_vote_kind v, unsigned n, unsigned min, unsigned wave, double agree)
{
    kvg_sc_config c = { v, n, min, wave, agree };
    return kvg_sc_new(&c);
}

/* Feeds one finished sample; returns the action. */
static kvg_sc_action fin(kvg_sc *s, unsigned j, const char *ans)
{
    kvg_sc_action a;
    kvg_sc_finished(s, j, ans, ans ? strlen(ans) : 0, 0.0, 0, &a);
    return a;
}

static kvg_sc_action fin_lp(kvg_sc *s, unsigned j, const char *ans, double lp)
{
    kvg_sc_action a;
    kvg_sc_finished(s, j, ans, strlen(ans), lp, 0, &a);
    return a;
}

static kvg_sc_action fin_cancel(kvg_sc *s, unsigned j, const char *ans)
{
    kvg_sc_action a;
    kvg_sc_finished(s, j, ans, ans ? strlen(ans) : 0, 0.0, 1, &a);
    return a;
}

static int none(kvg_sc_action a)
{
    return a.draw == 0 && a.cancel_mask == 0 && !a.decided;
}

static void answer_is(const kvg_sc *s, const char *want, const char *name)
{
    size_t l;
    const char *a = kvg_sc_answer(s, &l);
    if (!want)
        ok(a == NULL && l == 0, "%s: no answer", name);
    else
        ok(a && l == strlen(want) && strcmp(a, want) == 0, "%s: answer '%s' (got '%s')", name,
           want, a ? a : "(null)");
}

static void test_majority(void)
{
    kvg_sc *s = mk(KVG_VOTE_MAJORITY, 5, 0, 0, 0.5);
    const char *a;
    size_t l;
    unsigned cnt;
    double w;

    ok(s && kvg_sc_initial(s) == 5, "all at once: initial = n");
    ok(none(fin(s, 0, "a")), "one vote: undecided");
    ok(none(fin(s, 1, "b")), "two");
    ok(none(fin(s, 2, "a")), "three (a 2 - b 1 = 1, R 2)");
    ok(none(fin(s, 3, "c")), "four (margin 1, R 1: not > )");
    kvg_sc_action act = fin(s, 4, "a");
    ok(act.decided && act.cancel_mask == 0 && act.draw == 0, "the last decides, nothing to cancel");
    answer_is(s, "a", "majority");
    ok(!kvg_sc_stopped_early(s) && kvg_sc_samples_run(s) == 5, "not early, 5 run");
    is_int(kvg_sc_n_answers(s), 3, "three answers in the tally");
    kvg_sc_answer_at(s, 0, &a, &l, &cnt, &w);
    ok(!strcmp(a, "a") && cnt == 3 && w == 3.0, "tally[0] a: 3");
    kvg_sc_answer_at(s, 1, &a, &l, &cnt, &w);
    ok(!strcmp(a, "b") && cnt == 1 && w == 1.0, "tally[1] b (first vote from sample 1)");
    kvg_sc_answer_at(s, 2, &a, &l, &cnt, &w);
    ok(!strcmp(a, "c") && cnt == 1, "tally[2] c (first vote from sample 3)");
    kvg_sc_answer_at(s, 3, &a, &l, &cnt, &w);
    ok(a == NULL && l == 0 && cnt == 0, "out of range answer_at is empty");
    act = fin(s, 4, "z");
    kvg_sc_answer_at(s, 0, NULL, NULL, &cnt, NULL);
    ok(act.decided && cnt == 3 && kvg_sc_n_answers(s) == 3,
       "a second report for a finished sample is ignored");
    kvg_sc_free(s);
}

static void test_logprob(void)
{
    kvg_sc *s;
    double w;

    /* two votes of weight 0.2 against one of weight 0.9 */
    s = mk(KVG_VOTE_LOGPROB, 3, 0, 0, 0.5);
    ok(none(fin_lp(s, 0, "x", log(0.2))), "logprob: x 0.2");
    ok(none(fin_lp(s, 1, "x", log(0.2))), "logprob: x 0.4");
    ok(fin_lp(s, 2, "y", log(0.9)).decided, "logprob: y 0.9, all finished");
    answer_is(s, "y", "logprob weighting");
    kvg_sc_answer_at(s, 0, NULL, NULL, NULL, &w);
    ok(fabs(w - 0.9) < 1e-12, "y weighs 0.9");
    kvg_sc_answer_at(s, 1, NULL, NULL, NULL, &w);
    ok(fabs(w - 0.4) < 1e-12, "x weighs 0.4");
    kvg_sc_free(s);

    s = mk(KVG_VOTE_MAJORITY, 3, 0, 0, 0.5);
    fin_lp(s, 0, "x", log(0.2));
    fin_lp(s, 1, "x", log(0.2));
    fin_lp(s, 2, "y", log(0.9));
    answer_is(s, "x", "the same votes by majority");
    kvg_sc_free(s);

    /* W ties: larger count wins (b: 1 vote of 1.0; a: 1.0 + 0 from a -inf mean) */
    s = mk(KVG_VOTE_LOGPROB, 3, 0, 0, 0.5);
    fin_lp(s, 0, "b", 0.0);
    fin_lp(s, 1, "a", 0.0);
    fin_lp(s, 2, "a", -INFINITY);
    answer_is(s, "a", "equal weight: the larger count wins");
    kvg_sc_free(s);

    /* a positive mean counts as 0 (weight 1), NaN as weight 0 */
    s = mk(KVG_VOTE_LOGPROB, 2, 0, 0, 0.5);
    fin_lp(s, 0, "p", 3.0);
    fin_lp(s, 1, "q", NAN);
    kvg_sc_answer_at(s, 0, NULL, NULL, NULL, &w);
    ok(w == 1.0, "positive mean logprob: weight 1");
    kvg_sc_answer_at(s, 1, NULL, NULL, NULL, &w);
    ok(w == 0.0, "NaN mean logprob: weight 0");
    kvg_sc_free(s);
}

static void test_no_vote(void)
{
    kvg_sc *s = mk(KVG_VOTE_MAJORITY, 3, 0, 0, 0.5);
    size_t l = 9;

    ok(none(fin(s, 0, NULL)), "no answer: no vote");
    ok(none(fin_cancel(s, 1, "b")), "cancelled: no vote");
    ok(fin(s, 2, "c").decided, "last one decides");
    answer_is(s, "c", "only the voting sample counts");
    is_int(kvg_sc_n_answers(s), 1, "one answer");
    kvg_sc_free(s);

    s = mk(KVG_VOTE_MAJORITY, 2, 0, 0, 0.5);
    fin(s, 0, NULL);
    {
        kvg_sc_action a;
        kvg_sc_finished(s, 1, "x", 0, 0.0, 0, &a);
        ok(a.decided, "nobody voted, all finished: decided");
    }
    answer_is(s, NULL, "nobody voted");
    ok(kvg_sc_answer(s, NULL) == NULL && (kvg_sc_answer(s, &l), l == 0), "len 0 without answer");
    kvg_sc_free(s);
}

static void test_early(void)
{
    kvg_sc *s;
    kvg_sc_action a;
    unsigned cnt;

    /* all at once: three a's of five are certain (3 - 0 > 2) */
    s = mk(KVG_VOTE_MAJORITY, 5, 0, 0, 0.5);
    fin(s, 0, "a");
    fin(s, 1, "a");
    a = fin(s, 2, "a");
    ok(a.decided && a.draw == 0 && a.cancel_mask == 0x18u, "decided mid-way: cancel the running 3, 4");
    ok(kvg_sc_decided(s) && !kvg_sc_stopped_early(s) && kvg_sc_samples_run(s) == 5,
       "decided, all 5 drawn, no cancel reported yet: not stopped early");
    a = fin_cancel(s, 3, "a");
    ok(a.decided && a.cancel_mask == 0 && a.draw == 0, "the cancelled one reports: nothing more");
    ok(kvg_sc_stopped_early(s), "a sample finished cancelled: stopped early");
    a = fin(s, 4, "b");
    ok(a.decided && a.cancel_mask == 0, "one whose cancel crossed its end still votes");
    answer_is(s, "a", "the decision stands");
    kvg_sc_answer_at(s, 0, NULL, NULL, &cnt, NULL);
    is_int(cnt, 3, "the cancelled sample did not vote");
    is_int(kvg_sc_n_answers(s), 2, "the late one did");
    kvg_sc_free(s);

    /* decided mid-way, but both cancels cross their samples' ends: every
       sample ran in full, nothing was saved */
    s = mk(KVG_VOTE_MAJORITY, 5, 0, 0, 0.5);
    fin(s, 0, "a");
    fin(s, 1, "a");
    a = fin(s, 2, "a");
    ok(a.decided && a.cancel_mask == 0x18u, "decided with 3, 4 running: cancel both");
    fin(s, 3, "b");
    fin(s, 4, "a");
    ok(kvg_sc_decided(s) && !kvg_sc_stopped_early(s) && kvg_sc_samples_run(s) == 5,
       "both finished normally: not stopped early");
    kvg_sc_free(s);

    /* margin == R is not enough */
    s = mk(KVG_VOTE_MAJORITY, 4, 0, 0, 0.5);
    fin(s, 0, "a");
    ok(none(fin(s, 1, "a")), "2 - 0 = R 2: undecided");
    a = fin(s, 2, "a");
    ok(a.decided && a.cancel_mask == 0x8u, "3 - 0 > 1: decided");
    kvg_sc_free(s);

    /* agreement gates the early stop: b b then a x6 of 10 */
    for (int pass = 0; pass < 2; pass++) {
        double agree = pass ? 0.7 : 0.8;
        unsigned j = 0;
        s = mk(KVG_VOTE_MAJORITY, 10, 0, 0, agree);
        fin(s, j++, "b");
        fin(s, j++, "b");
        for (int k = 0; k < 5; k++)
            fin(s, j++, "a");
        a = fin(s, j++, "a");      /* a 6, b 2, R 2: margin 4 > 2; share 0.75 */
        if (pass)
            ok(a.decided && a.cancel_mask == 0x300u, "agreement 0.7: share 0.75 decides");
        else
            ok(!a.decided, "agreement 0.8: share 0.75 does not decide");
        if (!pass) {
            ok(!fin(s, j++, "a").decided, "agreement 0.8: 7/9 not yet");
            ok(fin(s, j++, "a").decided && !kvg_sc_stopped_early(s),
               "agreement 0.8: decided at the end, not early");
        }
        kvg_sc_free(s);
    }

    /* share exactly at the threshold (6 of 10 at 0.6): decided */
    s = mk(KVG_VOTE_MAJORITY, 11, 0, 0, 0.6);
    for (unsigned j = 0; j < 4; j++)
        fin(s, j, "b");
    for (unsigned j = 4; j < 9; j++)
        fin(s, j, "a");
    ok(!kvg_sc_decided(s), "a 5 b 4 R 2: undecided");
    a = fin(s, 9, "a");
    ok(a.decided && a.cancel_mask == 0x400u, "a 6 b 4 R 1, share exactly 0.6: decided");
    kvg_sc_free(s);

    /* agreement 1.0: any dissent means waiting for the end */
    s = mk(KVG_VOTE_MAJORITY, 5, 0, 0, 1.0);
    fin(s, 0, "a");
    fin(s, 1, "b");
    fin(s, 2, "a");
    ok(!fin(s, 3, "a").decided, "agreement 1.0: a 3 b 1 undecided");
    ok(fin(s, 4, "a").decided && !kvg_sc_stopped_early(s), "agreement 1.0: the end decides");
    answer_is(s, "a", "agreement 1.0");
    kvg_sc_free(s);
    s = mk(KVG_VOTE_MAJORITY, 5, 0, 0, 1.0);
    fin(s, 0, "a");
    fin(s, 1, "a");
    ok(fin(s, 2, "a").decided, "agreement 1.0, unanimous: decided");
    fin_cancel(s, 3, NULL);
    fin_cancel(s, 4, NULL);
    ok(kvg_sc_stopped_early(s), "agreement 1.0, unanimous: the rest cancelled, early");
    kvg_sc_free(s);
}

static void test_waves(void)
{
    kvg_sc *s;
    kvg_sc_action a;

    s = mk(KVG_VOTE_MAJORITY, 10, 3, 0, 0.6);
    is_int(kvg_sc_initial(s), 3, "waves: initial = min_samples");
    ok(kvg_sc_sample_drawn(s, 2) && !kvg_sc_sample_drawn(s, 3), "samples 0-2 drawn");
    ok(none(fin(s, 1, "a")), "others still run: no draw");
    ok(none(fin(s, 0, "a")), "a 2 - 0 > R 1, but 2 finished < min_samples 3: nothing");
    a = fin(s, 2, "a");
    ok(a.decided && a.draw == 0 && a.cancel_mask == 0x3F8u,
       "first wave unanimous, 3 - 0 > R 0: decided, the undrawn 3-9 dropped");
    ok(kvg_sc_stopped_early(s) && kvg_sc_samples_run(s) == 3 && !kvg_sc_sample_drawn(s, 3),
       "3 of 10 run");
    for (unsigned j = 3; j < 10; j++)
        ok(fin_cancel(s, j, NULL).decided, "dropped %u reported", j);
    ok(!kvg_sc_sample_drawn(s, 9) && kvg_sc_samples_run(s) == 3, "dropped ones were never drawn");
    answer_is(s, "a", "waves, unanimous");
    kvg_sc_free(s);

    /* a split first wave draws the next one; the second decides */
    s = mk(KVG_VOTE_MAJORITY, 10, 3, 0, 0.6);
    fin(s, 0, "a");
    fin(s, 1, "b");
    a = fin(s, 2, "c");
    ok(!a.decided && a.draw == 3 && a.cancel_mask == 0, "a b c: share 1/3 < 0.6, draw 3 (wave = min)");
    ok(kvg_sc_sample_drawn(s, 5) && !kvg_sc_sample_drawn(s, 6), "samples 3-5 drawn");
    ok(none(fin(s, 3, "a")), "a 2 b 1 c 1: share 0.5 < 0.6, nothing");
    a = fin(s, 4, "a");
    ok(a.decided && a.draw == 0 && a.cancel_mask == 0x3E0u,
       "a 3 b 1 c 1: share 0.6, 3 - 1 > R 1: decided, running 5 cancelled, 6-9 dropped");
    ok(fin_cancel(s, 5, NULL).decided, "the cancelled sample reported");
    ok(kvg_sc_stopped_early(s) && kvg_sc_samples_run(s) == 6, "6 of 10 run");
    kvg_sc_free(s);

    /* an undrawn sample reported as finished (not cancelled) is ignored */
    s = mk(KVG_VOTE_MAJORITY, 4, 1, 1, 0.5);
    ok(none(fin(s, 3, "x")) && kvg_sc_n_answers(s) == 0, "undrawn, not cancelled: ignored");
    ok(none(fin(s, 7, "x")), "out of range: ignored");
    kvg_sc_free(s);

    /* explicit wave, last wave clamped, ties by the lowest first sample */
    s = mk(KVG_VOTE_MAJORITY, 7, 2, 4, 0.5);
    is_int(kvg_sc_initial(s), 2, "min 2");
    fin(s, 1, "b");
    a = fin(s, 0, "a");
    is_int(a.draw, 4, "wave 4");
    fin(s, 2, "c");
    fin(s, 3, "d");
    fin(s, 5, "e");
    a = fin(s, 4, "f");
    is_int(a.draw, 1, "last wave clamped to the 1 left");
    a = fin(s, 6, "g");
    ok(a.decided && a.draw == 0 && a.cancel_mask == 0, "all finished: decided");
    answer_is(s, "a", "all tie at 1: the lowest first sample (0) wins, though b finished first");
    ok(!kvg_sc_stopped_early(s) && kvg_sc_samples_run(s) == 7, "7 run, not early");
    kvg_sc_free(s);

    /* a wave that decides nothing keeps drawing; undecided to the end */
    s = mk(KVG_VOTE_MAJORITY, 4, 2, 0, 0.5);
    fin(s, 0, "a");
    a = fin(s, 1, "b");
    ok(a.draw == 2 && !a.decided, "split wave: next wave");
    fin(s, 3, "b");
    a = fin(s, 2, "a");
    ok(a.decided && a.draw == 0, "end");
    answer_is(s, "a", "2-2 tie: a (first vote from sample 0)");
    kvg_sc_free(s);
}

static void test_n1_and_config(void)
{
    kvg_sc *s;
    kvg_sc_action a;
    static const kvg_sc_config bad[] = {
        { KVG_VOTE_MAJORITY, 0, 0, 0, 0.5 }, { KVG_VOTE_MAJORITY, KVG_SC_MAX_N + 1, 0, 0, 0.5 },
        { KVG_VOTE_MAJORITY, 3, 4, 0, 0.5 }, { KVG_VOTE_MAJORITY, 3, 0, 0, 0.0 },
        { KVG_VOTE_MAJORITY, 3, 0, 0, 1.5 }, { KVG_VOTE_MAJORITY, 3, 0, 0, NAN },
        { (kvg_vote_kind)0, 3, 0, 0, 0.5 }, { (kvg_vote_kind)3, 3, 0, 0, 0.5 },
    };

    for (int m = 0; m < 2; m++) {
        s = mk(KVG_VOTE_MAJORITY, 1, (unsigned)m, 0, 0.5);
        is_int(kvg_sc_initial(s), 1, "n = 1 (min %d): initial 1", m);
        a = fin(s, 0, "only");
        ok(a.decided && a.draw == 0 && a.cancel_mask == 0, "n = 1: decided by its sample");
        answer_is(s, "only", "n = 1");
        ok(!kvg_sc_stopped_early(s) && kvg_sc_samples_run(s) == 1, "n = 1: 1 run");
        kvg_sc_free(s);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ok(kvg_sc_new(&bad[i]) == NULL, "bad config %zu refused", i);
    ok(kvg_sc_new(NULL) == NULL, "NULL config refused");
    s = mk(KVG_VOTE_MAJORITY, KVG_SC_MAX_N, 0, 0, 1.0);
    ok(s != NULL, "n = %d accepted", KVG_SC_MAX_N);
    for (unsigned j = 0; j < 16; j++)
        fin(s, j, "k");
    a = fin(s, 16, "k");
    ok(a.decided && a.cancel_mask == 0xFFFE0000u, "n = 32: mask of the top 15 bits");
    kvg_sc_free(s);

    /* a stored answer is bounded */
    {
        char big[400];
        size_t l;
        memset(big, 'q', sizeof big);
        s = mk(KVG_VOTE_MAJORITY, 1, 0, 0, 0.5);
        kvg_sc_finished(s, 0, big, sizeof big, 0.0, 0, &a);
        ok(kvg_sc_answer(s, &l) && l == KVG_VOTE_ANSWER_MAX, "a long answer is stored cut");
        kvg_sc_free(s);
    }
    kvg_sc_free(NULL);
}

int main(void)
{
    test_extractor();
    test_normalize();
    test_majority();
    test_logprob();
    test_no_vote();
    test_early();
    test_waves();
    test_n1_and_config();
    return done_testing();
}
