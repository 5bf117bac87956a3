/* The engine's log. See log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>

void kvg_log(const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    /* One write per line, so lines from a second thread never interleave mid-line. */
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvgate-engine: %s\n", line);
}
