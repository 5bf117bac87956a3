/* kvgate.answer_pattern over PCRE2, under a step budget (answer_re.h). */
#define PCRE2_CODE_UNIT_WIDTH 8

#include "answer_re.h"
#include "answer_re_testing.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The backstop behind the step count: a sample whose matching has run this
 * long is abandoned whatever its count says. The count is the bound that
 * decides (deterministic, ~5-20 ns a step); this only catches work the count
 * does not see, should a pattern find some. The clock is read every
 * CLOCK_EVERY callouts (~1-5 us of matching apart). */
#define KVG_ANSWER_RE_SAMPLE_NS (100ull * 1000 * 1000)
#define CLOCK_EVERY 256

struct kvg_answer_re {
    pcre2_code *code;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;          /* NULL without JIT */
    pcre2_match_data *md;
    int jit;

    uint64_t sample_steps, request_steps; /* 0: no limit */
    uint64_t steps;                       /* over the request so far */

    /* the sample being matched, read and written by the callout */
    uint64_t sample_used, sample_limit;
    int limit_is_request;                 /* sample_limit is what the request had left */
    size_t last_position;                 /* subject offset at the last callout */
    unsigned calls;
    uint64_t started_ns;
    enum { RUN_OK, RUN_STEPS, RUN_TIME } stop;
    int failed;                           /* a call returned -1: every later one does */
};

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Called before every pattern item PCRE2 tries (PCRE2_AUTO_CALLOUT), at every
 * start position. A step is one item plus the subject bytes the match moved
 * over since the last callout, forward or back: an item that consumes a run
 * (\w*, a back reference) does that much work, and counting it keeps the
 * cost of a step within a few ns whatever the pattern (without the bytes,
 * \w*\w*+\d takes ~1 us a step over 4 KiB of letters). A negative return
 * abandons the match with that code. */
static int count_step(pcre2_callout_block *cb, void *data)
{
    kvg_answer_re *re = data;
    size_t pos = cb->current_position;
    size_t moved = pos > re->last_position ? pos - re->last_position : re->last_position - pos;

    re->last_position = pos;
    re->sample_used += 1 + moved;
    if (re->sample_limit && re->sample_used > re->sample_limit) {
        re->stop = RUN_STEPS;
        return PCRE2_ERROR_CALLOUT;
    }
    if (++re->calls % CLOCK_EVERY == 0 && now_ns() - re->started_ns > KVG_ANSWER_RE_SAMPLE_NS) {
        re->stop = RUN_TIME;
        return PCRE2_ERROR_CALLOUT;
    }
    return 0;
}

static void pattern_error(kvg_api_error *err, int code, size_t offset)
{
    PCRE2_UCHAR msg[256];

    if (pcre2_get_error_message(code, msg, sizeof msg) < 0)
        strcpy((char *)msg, "unknown error");
    kvg_api_error_set(err, 400, "invalid_value", "kvgate.answer_pattern",
                      "Invalid 'kvgate.answer_pattern': %s at offset %zu.", (const char *)msg,
                      offset);
}

kvg_answer_re *kvg_answer_re_new(const char *pattern, size_t len, uint64_t sample_steps,
                                 uint64_t request_steps, kvg_api_error *err)
{
    kvg_answer_re *re;
    int code;
    PCRE2_SIZE offset;
    uint32_t captures = 0;

    if (!(re = calloc(1, sizeof *re)))
        goto nomem;
    re->sample_steps = sample_steps;
    re->request_steps = request_steps;

    /* Byte-oriented (no PCRE2_UTF), as ngx_regex compiles: a sample's tail may
     * end inside a character, which UTF mode would refuse. */
    re->code = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_AUTO_CALLOUT, &code, &offset, NULL);
    if (!re->code) {
        if (code == PCRE2_ERROR_NOMEMORY)
            goto nomem;
        pattern_error(err, code, offset);
        kvg_answer_re_free(re);
        return NULL;
    }
    if (pcre2_pattern_info(re->code, PCRE2_INFO_CAPTURECOUNT, &captures) != 0 || captures != 1) {
        kvg_api_error_set(err, 400, "invalid_value", "kvgate.answer_pattern",
                          "Invalid 'kvgate.answer_pattern': it must have exactly one capture "
                          "group (the answer), it has %u.", (unsigned)captures);
        kvg_answer_re_free(re);
        return NULL;
    }

    if (!(re->mctx = pcre2_match_context_create(NULL)) ||
        !(re->md = pcre2_match_data_create(2, NULL)))    /* the match and capture 1 */
        goto nomem;
    pcre2_set_callout(re->mctx, count_step, re);
    pcre2_set_heap_limit(re->mctx, KVG_ANSWER_RE_HEAP_KIB);

    /* JIT where this PCRE2 has it (x86-64, arm64): ~4x fewer ns a step. Its
     * stack is a reservation; pages are touched only as deep as a match goes. */
    if (pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0) {
        re->jit_stack = pcre2_jit_stack_create(32 * 1024, KVG_ANSWER_RE_JIT_STACK, NULL);
        if (!re->jit_stack)
            goto nomem;
        pcre2_jit_stack_assign(re->mctx, NULL, re->jit_stack);
        re->jit = 1;
    }
    return re;

nomem:
    kvg_api_error_set(err, 500, NULL, NULL, "out of memory compiling 'kvgate.answer_pattern'");
    kvg_answer_re_free(re);
    return NULL;
}

void kvg_answer_re_free(kvg_answer_re *re)
{
    if (!re)
        return;
    pcre2_match_data_free(re->md);
    pcre2_jit_stack_free(re->jit_stack);
    pcre2_match_context_free(re->mctx);
    pcre2_code_free(re->code);
    free(re);
}

static int refuse(kvg_answer_re *re, int rc, kvg_api_error *err)
{
    int request = re->limit_is_request;

    re->failed = 1;
    if (rc == PCRE2_ERROR_CALLOUT && re->stop == RUN_STEPS)
        return kvg_api_error_set(
            err, 422, "answer_pattern_too_costly", "kvgate.answer_pattern",
            "'kvgate.answer_pattern' took more than %llu matching steps %s (the gateway's "
            "kvgate_answer_pattern_steps): the answer could not be extracted. Simplify the "
            "pattern, e.g. avoid nested or adjacent unbounded repeats such as (a+)+ or (.*a){20}.",
            (unsigned long long)(request ? re->request_steps : re->sample_steps),
            request ? "over this request's samples" : "on one sample");
    if (rc == PCRE2_ERROR_CALLOUT)
        return kvg_api_error_set(
            err, 422, "answer_pattern_too_costly", "kvgate.answer_pattern",
            "'kvgate.answer_pattern' ran for more than %llu ms on one sample: the answer could "
            "not be extracted. Simplify the pattern.",
            (unsigned long long)(KVG_ANSWER_RE_SAMPLE_NS / 1000000));
    {
        PCRE2_UCHAR msg[256];

        if (pcre2_get_error_message(rc, msg, sizeof msg) < 0)
            strcpy((char *)msg, "unknown error");
        return kvg_api_error_set(err, 422, "answer_pattern_too_costly", "kvgate.answer_pattern",
                                 "'kvgate.answer_pattern' could not be matched: %s. Simplify "
                                 "the pattern.", (const char *)msg);
    }
}

int kvg_answer_re_last(kvg_answer_re *re, const char *text, size_t len, const char **ans,
                       size_t *ans_len, kvg_api_error *err)
{
    size_t start = 0, next;
    PCRE2_SIZE *ov;
    int rc, found = 0;

    if (re->failed)
        return kvg_api_error_set(err, 422, "answer_pattern_too_costly", "kvgate.answer_pattern",
                                 "'kvgate.answer_pattern' was abandoned on an earlier sample.");

    /* this sample may take its own budget, or what the request has left */
    re->sample_limit = re->sample_steps;
    re->limit_is_request = 0;
    if (re->request_steps) {
        uint64_t left = re->request_steps > re->steps ? re->request_steps - re->steps : 0;
        if (!re->sample_limit || left < re->sample_limit) {
            re->sample_limit = left;
            re->limit_is_request = 1;
        }
        if (left == 0) {
            re->stop = RUN_STEPS;
            return refuse(re, PCRE2_ERROR_CALLOUT, err);
        }
    }
    re->sample_used = 0;
    re->calls = 0;
    re->stop = RUN_OK;
    re->started_ns = now_ns();

    while (start <= len) {
        re->last_position = start;
        rc = pcre2_match(re->code, (PCRE2_SPTR)text, len, start, 0, re->md, re->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            re->steps += re->sample_used;
            return refuse(re, rc, err);
        }
        ov = pcre2_get_ovector_pointer(re->md);
        if (rc >= 2 && ov[2] != PCRE2_UNSET) {
            *ans = text + ov[2];
            *ans_len = ov[3] - ov[2];
            found = 1;
        }
        next = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
        if (next <= start)
            break;     /* no progress (\K can end a match before it starts): the last one */
        start = next;
    }
    re->steps += re->sample_used;
    return found;
}

uint64_t kvg_answer_re_steps(const kvg_answer_re *re)
{
    return re->steps;
}

int kvg_answer_re_jit(const kvg_answer_re *re)
{
    return re->jit;
}
