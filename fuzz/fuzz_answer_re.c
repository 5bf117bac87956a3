/* libFuzzer target for kvgate.answer_pattern (answer_re.h): any pattern over any
 * text must give an answer inside the text, no answer, or a refusal, never a
 * crash, a leak or a hang. The input is split at its first NUL: the pattern,
 * then the text (a sample's tail). Small budgets keep every run short; the
 * steps counted may pass a budget by one step at most (a step is one item plus
 * the bytes moved over, at most the text's length). */
#include <stdint.h>
#include <string.h>

#include "answer_re.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *in = (const char *)data;
    const char *nul = memchr(in, '\0', size);
    size_t plen = nul ? (size_t)(nul - in) : size;
    const char *text = nul ? nul + 1 : "";
    size_t tlen = nul ? size - plen - 1 : 0;
    kvg_api_error err;
    kvg_answer_re *re;

    if (plen > 1024)
        return 0;
    re = kvg_answer_re_new(in, plen, 20000, 50000, &err);
    if (!re) {
        if (err.status != 400 && err.status != 500)
            __builtin_trap();
        return 0;
    }
    for (int sample = 0; sample < 4; sample++) {
        const char *ans = NULL;
        size_t n = 0;
        int rc = kvg_answer_re_last(re, text, tlen, &ans, &n, &err);

        if (rc == 1 && (ans < text || ans + n > text + tlen))
            __builtin_trap();
        if (rc == -1 && err.status != 422)
            __builtin_trap();
        if (kvg_answer_re_steps(re) > 50000 + 4 * (tlen + 2))
            __builtin_trap();
    }
    kvg_answer_re_free(re);
    return 0;
}
