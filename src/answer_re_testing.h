/* For tests only: whether PCRE2 compiled a pattern to machine code (answer_re.c),
 * which the unit test reports. Not the library's API: nothing outside t/ calls it. */
#ifndef KVG_ANSWER_RE_TESTING_H
#define KVG_ANSWER_RE_TESTING_H

#include "answer_re.h"

/* 1 when PCRE2 compiled the pattern to machine code (JIT). */
int kvg_answer_re_jit(const kvg_answer_re *re);

#endif
