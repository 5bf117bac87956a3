/* Stop-string matching over a stream; see stop_match.h. */
#include "stop_match.h"

#include <string.h>

#include "errmsg.h"

int kvg_stop_init(kvg_stop_match *m, const char *const *stops, const size_t *lens, int n,
                  char *err, size_t err_len)
{
    memset(m, 0, sizeof *m);
    m->matched = -1;
    if (n < 0 || n > KVG_STOP_MAX) {
        kvg_set_err(err, err_len, "at most %d stop strings, got %d", KVG_STOP_MAX, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        size_t l = stops[i] ? (lens ? lens[i] : strlen(stops[i])) : 0;
        if (l == 0) {
            kvg_set_err(err, err_len, "stop string %d is empty", i);
            return -1;
        }
        if (l > KVG_STOP_MAX_LEN) {
            kvg_set_err(err, err_len, "stop string %d is %zu bytes, more than %d", i, l,
                        KVG_STOP_MAX_LEN);
            return -1;
        }
        memcpy(m->str[i], stops[i], l);
        m->len[i] = l;
        if (l > m->max_len)
            m->max_len = l;
    }
    m->n = n;
    return 0;
}

long kvg_stop_feed(kvg_stop_match *m, const char *in, size_t len, char *out, size_t cap)
{
    size_t n, keep;

    if (m->matched >= 0)
        return 0;
    if (cap < m->n_hold + len)
        return -1;
    /* Work in out: the held tail then the new bytes. Every stop occurrence ending
     * before the held tail was ruled out by earlier calls. */
    memcpy(out, m->hold, m->n_hold);
    memcpy(out + m->n_hold, in, len);
    n = m->n_hold + len;
    m->n_hold = 0;
    /* Generation stops as soon as a stop string is complete, so the match is the
     * occurrence that ENDS first; at the same end, the longer one (it starts first). */
    for (size_t e = 1; e <= n; e++) {
        int best = -1;
        for (int i = 0; i < m->n; i++)
            if (m->len[i] <= e && memcmp(out + e - m->len[i], m->str[i], m->len[i]) == 0 &&
                (best < 0 || m->len[i] > m->len[best]))
                best = i;
        if (best >= 0) {
            m->matched = best;
            return (long)(e - m->len[best]);
        }
    }
    /* Hold the longest tail that is a proper prefix of some stop string. */
    keep = 0;
    for (size_t t = m->max_len > 1 ? m->max_len - 1 : 0; t > 0 && keep == 0; t--) {
        if (t > n)
            continue;
        for (int i = 0; i < m->n; i++) {
            if (t < m->len[i] && memcmp(out + n - t, m->str[i], t) == 0) {
                keep = t;
                break;
            }
        }
    }
    memcpy(m->hold, out + n - keep, keep);
    m->n_hold = keep;
    return (long)(n - keep);
}

long kvg_stop_flush(kvg_stop_match *m, char *out, size_t cap)
{
    size_t n = m->n_hold;
    if (m->matched >= 0)
        return 0;
    if (cap < n)
        return -1;
    memcpy(out, m->hold, n);
    m->n_hold = 0;
    return (long)n;
}
