/* kvgate.answer_pattern (src/answer_re.h): what a pattern is refused for, the
 * last match's capture as a global search finds it, and the step budget:
 * hostile patterns are abandoned with a 422 naming the field, whatever their
 * shape; the count is the same every time and for JIT and interpreter alike;
 * a request's samples share the request's budget. */
#include "answer_re.h"
#include "answer_re_testing.h"
#include "tap.h"

#define TAIL 4096

static char text[TAIL + 1];

/* 4 KiB of prose that ends with an answer, the length of a sample's tail. */
static void fill_text(void)
{
    static const char s[] = "Let me think step by step: 12 + 7 = 19, and 19 * 3 = 57. ";
    size_t n = sizeof s - 1;

    for (size_t i = 0; i < TAIL; i++)
        text[i] = s[i % n];
    memcpy(text + TAIL - 18, "The answer is 57.\n", 18);
    text[TAIL] = '\0';
}

static kvg_answer_re *compile(const char *pattern, uint64_t sample, uint64_t request,
                              kvg_api_error *err)
{
    memset(err, 0, sizeof *err);
    return kvg_answer_re_new(pattern, strlen(pattern), sample, request, err);
}

static void refused(const char *pattern, const char *why)
{
    kvg_api_error err;
    kvg_answer_re *re = compile(pattern, 0, 0, &err);

    ok(re == NULL && err.status == 400 && strcmp(err.param, "kvgate.answer_pattern") == 0
       && strstr(err.message, why) != NULL, "refused %s: %s", pattern, why);
    if (re || !strstr(err.message, why))
        diag("  got %d '%s'", err.status, err.message);
    kvg_answer_re_free(re);
}

/* The answer of pattern over t (no limits): 1 and the capture, 0, or -1. */
static int answer(const char *pattern, const char *t, char *out, size_t cap)
{
    kvg_api_error err;
    kvg_answer_re *re = compile(pattern, 0, 0, &err);
    const char *a = NULL;
    size_t n = 0;
    int rc;

    if (!re)
        return -2;
    rc = kvg_answer_re_last(re, t, strlen(t), &a, &n, &err);
    out[0] = '\0';
    if (rc == 1) {
        if (a < t || a + n > t + strlen(t) || n >= cap)
            rc = -3;
        else {
            memcpy(out, a, n);
            out[n] = '\0';
        }
    }
    kvg_answer_re_free(re);
    return rc;
}

static void answer_is(const char *pattern, const char *t, const char *want)
{
    char got[256], shown[256];
    int rc = answer(pattern, t, got, sizeof got);
    size_t k = 0;

    /* the test's name on one line */
    for (const char *c = t; *c && k + 3 < sizeof shown; c++) {
        if (*c == '\n') {
            shown[k++] = '\\';
            shown[k++] = 'n';
        } else
            shown[k++] = *c;
    }
    shown[k] = '\0';

    if (!want) {
        if (!ok(rc == 0, "%s over '%s': no answer", pattern, shown))
            diag("  rc %d, '%s'", rc, got);
        return;
    }
    if (!ok(rc == 1 && strcmp(got, want) == 0, "%s over '%s' -> '%s'", pattern, shown, want))
        diag("  rc %d, got '%s'", rc, got);
}

static void test_compile(void)
{
    kvg_api_error err;
    kvg_answer_re *re;

    refused("(unclosed", "missing closing parenthesis at offset 9");
    refused("\\d+", "exactly one capture group (the answer), it has 0");
    refused("(\\d+) (\\w+)", "it has 2");
    refused("(?<n>a)(b)", "it has 2");
    refused("a{2,1}(b)", "numbers out of order");
    refused("(?<=a+)(b)", "lookbehind");

    re = compile("(?:x|y)(\\d+)", KVG_ANSWER_RE_SAMPLE_STEPS, KVG_ANSWER_RE_REQUEST_STEPS, &err);
    ok(re != NULL, "one capture with non-capturing groups: compiles");
    diag("PCRE2 JIT: %s", re && kvg_answer_re_jit(re) ? "yes" : "no (interpreter)");
    kvg_answer_re_free(re);
    kvg_answer_re_free(NULL);
}

static void test_last_match(void)
{
    answer_is("answer is (\\d+)", "the answer is 3, no, the answer is 5.", "5");
    answer_is("answer is (\\d+)", "no digits here", NULL);
    /* the last match that sets the capture: y sets none */
    answer_is("(x)|y", "x then y", "x");
    /* a global search: ^ matches at the start of the text only */
    answer_is("^(\\w+)", "first second third", "first");
    answer_is("(\\w+)$", "first second third", "third");
    answer_is("(?m)^(\\w+)", "one\ntwo\nthree", "three");
    /* lookbehind sees the text before where the search resumed */
    answer_is("(?<=is )(\\w+)", "x is a, y is b", "b");
    /* after an empty match the search goes on one byte further */
    answer_is("(a*)b", "aab b ab", "a");
    answer_is("(\\d*)", "12 34", "");
    /* bytes, not characters; invalid UTF-8 is just bytes */
    answer_is("(.)$", "caf\xc3\xa9", "\xa9");
    answer_is("=(\\d)", "\xff\xfe=7\xff", "7");
    answer_is("(?i)ANSWER: (\\w+)", "answer: Paris", "Paris");
    /* \K can end a match where it began: the search stops there */
    answer_is("(a)\\K", "aaa", "a");
}

/* The steps a pattern takes over text, fresh, without limits. */
static uint64_t steps_of(const char *pattern)
{
    kvg_api_error err;
    kvg_answer_re *re = compile(pattern, 0, 0, &err);
    const char *a;
    size_t n;
    uint64_t s;

    if (!re)
        return 0;
    kvg_answer_re_last(re, text, TAIL, &a, &n, &err);
    s = kvg_answer_re_steps(re);
    kvg_answer_re_free(re);
    return s;
}

static void test_ordinary_cost(void)
{
    static const char *const patterns[] = {
        "answer is (\\d+)",
        "(?i)answer\\s*(?:is|:)\\s*\\**\\s*\\$?(-?[\\d,\\.]+)",
        "\\\\boxed\\{([^{}]*)\\}",
        "(?s).*\\b([A-D])\\b",
        "(\\d+)",
        "([A-Za-z]+)\\s*$",
        "(?m)^.*?(\\d+)[^\\d]*$",
    };

    for (size_t i = 0; i < sizeof patterns / sizeof *patterns; i++) {
        uint64_t s = steps_of(patterns[i]);
        ok(s < KVG_ANSWER_RE_SAMPLE_STEPS / 10,
           "%s over 4 KiB: %llu steps, a tenth of the default budget at most", patterns[i],
           (unsigned long long)s);
    }
}

/* Patterns that backtrack without end over the 4 KiB tail of prose, and over
 * 4 KiB of one letter: each is abandoned within the sample's budget, with
 * the 422 the gateway answers. */
static void test_hostile(void)
{
    static const struct { const char *pattern; int on_prose; } hostile[] = {
        { "(?s)(?:.|.){1,14}\\d{9}|(.)", 1 },     /* exponential at every start */
        { "(?s)(?:.|.){1,20}\\d{9}|(.)", 1 },
        { "(.*a){25}\\d{9}", 1 },                 /* PCRE2's own limit per call */
        { "(.*)\\1\\1\\d{9}", 1 },                /* back references compare runs */
        { "(*NO_JIT)(?s)(?:.|.){1,14}\\d{9}|(.)", 1 },  /* the interpreter alike */
        /* costly over long runs of word characters only: prose has short words */
        { "(\\w*)*\\d{9}", 0 },                   /* nested unbounded repeats */
        { "\\w*\\w*+(\\d{9})", 0 },                /* cheap in items, quadratic in bytes */
        { "(*NO_JIT)\\w*\\w*+(\\d{9})", 0 },
    };
    static char letters[TAIL + 1];

    memset(letters, 'a', TAIL);
    letters[TAIL] = '\0';

    /* none can match either text: \\d{9} is never there (nor a literal,
       which PCRE2 would look for first and fail at once) */
    for (size_t i = 0; i < sizeof hostile / sizeof *hostile; i++) {
        for (int which = !hostile[i].on_prose; which < 2; which++) {
            const char *pattern = hostile[i].pattern;
            const char *t = which ? letters : text;
            kvg_api_error err;
            kvg_answer_re *re = compile(pattern, KVG_ANSWER_RE_SAMPLE_STEPS,
                                        KVG_ANSWER_RE_REQUEST_STEPS, &err);
            const char *a;
            size_t n;
            int rc;

            if (!ok(re != NULL, "%s compiles", pattern))
                continue;
            rc = kvg_answer_re_last(re, t, TAIL, &a, &n, &err);
            ok(rc == -1 && err.status == 422 && strcmp(err.param, "kvgate.answer_pattern") == 0
               && err.code && strcmp(err.code, "answer_pattern_too_costly") == 0
               && strstr(err.message, "on one sample"),
               "%s over %s: abandoned, 422 on kvgate.answer_pattern", pattern,
               which ? "letters" : "prose");
            if (rc != -1)
                diag("  rc %d, %llu steps", rc, (unsigned long long)kvg_answer_re_steps(re));
            ok(kvg_answer_re_steps(re) > KVG_ANSWER_RE_SAMPLE_STEPS
               && kvg_answer_re_steps(re) <= KVG_ANSWER_RE_SAMPLE_STEPS + TAIL + 1,
               "  stopped just past the sample's budget (%llu steps)",
               (unsigned long long)kvg_answer_re_steps(re));
            /* once abandoned, always: the request is refused as a whole */
            ok(kvg_answer_re_last(re, "answer 1", 8, &a, &n, &err) == -1 && err.status == 422,
               "  a later sample is refused too");
            kvg_answer_re_free(re);
        }
    }
}

/* The count is a property of the pattern and the text, not of the run. */
static void test_deterministic(void)
{
    static const char *const patterns[] = {
        "answer is (\\d+)",
        "([A-Za-z]+)\\s*$",
        "(\\w+)\\W*$",
    };

    for (size_t i = 0; i < sizeof patterns / sizeof *patterns; i++) {
        char nojit[128];
        uint64_t a = steps_of(patterns[i]), b = steps_of(patterns[i]);

        snprintf(nojit, sizeof nojit, "(*NO_JIT)%s", patterns[i]);
        is_int(b, a, "%s: the same steps twice (%llu)", patterns[i], (unsigned long long)a);
        is_int(steps_of(nojit), a, "%s: the same steps interpreted", patterns[i]);
    }
}

static void test_request_budget(void)
{
    const char *pattern = "answer is (\\d+)";
    uint64_t s = steps_of(pattern);
    kvg_api_error err;
    kvg_answer_re *re;
    const char *a;
    size_t n;
    int rc;

    /* room for two samples and a half: the third runs out */
    re = compile(pattern, s + 10, 2 * s + s / 2, &err);
    ok(re != NULL, "compiled with a request budget of 2.5 samples (%llu steps each)",
       (unsigned long long)s);
    for (int j = 0; j < 2; j++) {
        rc = kvg_answer_re_last(re, text, TAIL, &a, &n, &err);
        ok(rc == 1 && n == 2 && memcmp(a, "57", 2) == 0, "sample %d answered 57", j);
    }
    rc = kvg_answer_re_last(re, text, TAIL, &a, &n, &err);
    ok(rc == -1 && err.status == 422 && strstr(err.message, "over this request's samples"),
       "sample 2: the request's budget ran out");
    diag("  %s", err.message);
    kvg_answer_re_free(re);

    /* a sample's own budget, around what this text takes */
    re = compile(pattern, s - 1, 100 * s, &err);
    rc = kvg_answer_re_last(re, text, TAIL, &a, &n, &err);
    ok(rc == -1 && strstr(err.message, "on one sample"), "one step short: refused on one sample");
    kvg_answer_re_free(re);
    re = compile(pattern, s, 100 * s, &err);
    ok(kvg_answer_re_last(re, text, TAIL, &a, &n, &err) == 1, "exactly enough: answered");
    kvg_answer_re_free(re);
}

int main(void)
{
    fill_text();
    test_compile();
    test_last_match();
    test_ordinary_cost();
    test_hostile();
    test_deterministic();
    test_request_budget();
    return done_testing();
}
