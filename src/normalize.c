#include "normalize.h"
#include "normalize_testing.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "nfc.h"
#include "utf8.h"
#include "errmsg.h"

#define JUNK_MIN 6

/* Pipeline order: kvg_normalize_format() lists steps in it. */
static const struct {
    const char *name;
    unsigned flag;
} steps[] = {
    { "nfc", KVG_NORM_NFC },
    { "newlines", KVG_NORM_NEWLINES },
    { "junk", KVG_NORM_JUNK },
    { "spaces", KVG_NORM_SPACES },
    { "trailing", KVG_NORM_TRAILING },
    { "blank-lines", KVG_NORM_BLANK_LINES },
};
#define N_STEPS (sizeof(steps) / sizeof(steps[0]))

const char *kvg_normalize_step_name(unsigned flag)
{
    for (size_t i = 0; i < N_STEPS; i++)
        if (steps[i].flag == flag)
            return steps[i].name;
    return NULL;
}

static int word_is(const char *s, size_t len, const char *w)
{
    return strlen(w) == len && memcmp(s, w, len) == 0;
}

int kvg_normalize_parse_step(const char *name, size_t len, unsigned *flags,
                             char *err, size_t err_len)
{
    if (word_is(name, len, "all")) {
        *flags = KVG_NORM_ALL;
        return 0;
    }
    if (word_is(name, len, "off") || word_is(name, len, "none")) {
        *flags = 0;
        return 0;
    }
    for (size_t i = 0; i < N_STEPS; i++) {
        if (word_is(name, len, steps[i].name)) {
            *flags = steps[i].flag;
            return 0;
        }
    }
    /* Quote at most 40 bytes, and nothing unprintable, of what the user wrote. */
    {
        char shown[41];
        size_t k = 0;
        for (; k < len && k < 40; k++) {
            unsigned char c = (unsigned char)name[k];
            shown[k] = c >= 0x20 && c < 0x7F ? (char)c : '?';
        }
        shown[k] = '\0';
        kvg_set_err(err, err_len,
                "unknown normalize step '%s%s' (expected off, all, nfc, newlines, junk, "
                "spaces, trailing or blank-lines)", shown, len > 40 ? "..." : "");
    }
    return -1;
}

int kvg_normalize_parse(const char *list, unsigned *flags, char *err, size_t err_len)
{
    unsigned acc = 0;
    int words = 0, off = 0;
    const char *p = list;

    while (*p) {
        const char *start;
        unsigned f;

        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (!*p)
            break;
        start = p;
        while (*p && *p != ' ' && *p != '\t' && *p != ',')
            p++;
        if (kvg_normalize_parse_step(start, (size_t)(p - start), &f, err, err_len) < 0)
            return -1;
        if (f == 0)
            off = 1;
        acc |= f;
        words++;
    }
    if (words == 0) {
        kvg_set_err(err, err_len, "empty normalize step list (use 'off' for none)");
        return -1;
    }
    if (off && words > 1) {
        kvg_set_err(err, err_len, "normalize 'off' cannot be combined with steps");
        return -1;
    }
    *flags = acc;
    return 0;
}

size_t kvg_normalize_format(unsigned flags, char *buf, size_t size)
{
    size_t need = 0;

    if (size)
        buf[0] = '\0';
    if ((flags & KVG_NORM_ALL) == 0) {
        if (size)
            snprintf(buf, size, "off");
        return 3;
    }
    for (size_t i = 0; i < N_STEPS; i++) {
        if (!(flags & steps[i].flag))
            continue;
        if (need < size)
            snprintf(buf + need, size - need, "%s%s", need ? " " : "", steps[i].name);
        need += (need ? 1 : 0) + strlen(steps[i].name);
    }
    return need;
}

size_t kvg_normalize_bound(unsigned flags, const char *in, size_t len)
{
    if (flags & KVG_NORM_NFC)
        return kvg_nfc_bound((const unsigned char *)in, len);
    return len;
}

/* ---- the in-place steps: each one pass, output never longer than input ----
 * Each step finds the next place where it has something to change with memchr or
 * eight bytes at a time, and moves the untouched stretch before it in one
 * memmove; clean text goes through at memory speed, and only the bytes around a
 * change are handled one by one. In place is safe because w <= i throughout. */

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull

static uint64_t load64(const unsigned char *p)
{
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

/* The high bit of every byte of x that is zero, exactly (no borrow between bytes). */
static uint64_t zero_bytes(uint64_t x)
{
    return ~(((x & ~HIGHS) + ~HIGHS) | x) & HIGHS;
}

static uint64_t bytes_eq(uint64_t x, unsigned char c)
{
    return zero_bytes(x ^ (ONES * c));
}

static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t';
}

static size_t step_newlines(unsigned char *b, size_t n)
{
    size_t w = 0, i = 0;

    for (;;) {
        const unsigned char *cr = memchr(b + i, '\r', n - i);
        size_t p = cr ? (size_t)(cr - b) : n;
        memmove(b + w, b + i, p - i);
        w += p - i;
        if (p == n)
            return w;
        if (p + 1 < n && b[p + 1] == '\n') {
            i = p + 1;          /* the LF is copied with the next stretch */
        } else {
            b[w++] = '\n';
            i = p + 1;
        }
    }
}

static int is_punct(unsigned char c)
{
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60)
        || (c >= 0x7B && c <= 0x7E);
}

static int is_mark(uint32_t cp)
{
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);

    return p->combining_class != 0 || p->category == UTF8PROC_CATEGORY_MN
        || p->category == UTF8PROC_CATEGORY_MC || p->category == UTF8PROC_CATEGORY_ME;
}

/* Start of the first run of JUNK_MIN or more equal punctuation bytes in b[i..n),
 * or n. Eight positions at a time are ruled out when no byte equals its successor. */
static size_t next_junk(const unsigned char *b, size_t i, size_t n)
{
    size_t p = i;

    while (p + JUNK_MIN <= n) {
        size_t j;
        if (p + 9 <= n && !zero_bytes(load64(b + p) ^ load64(b + p + 1))) {
            p += 8;
            continue;
        }
        if (b[p] != b[p + 1] || !is_punct(b[p])) {
            p++;
            continue;
        }
        for (j = p + 2; j < n && b[j] == b[p]; j++)
            ;
        if (j - p >= JUNK_MIN)
            return p;
        p = j;
    }
    return n;
}

/* Length of the run of c at the end of b[0..w): at most JUNK_MIN - 1, because the
 * output never holds a junk run. */
static size_t tail_run(const unsigned char *b, size_t w, unsigned char c)
{
    size_t m = 0;

    while (m < w && b[w - 1 - m] == c)
        m++;
    return m;
}

/* Drops the run b[i..) of its first byte together with the output's tail of the
 * same byte and the marks that follow the run. Returns the new input position. */
static size_t drop_run(unsigned char *b, size_t n, size_t i, size_t *w, int *renfc)
{
    unsigned char c = b[i];

    *w -= tail_run(b, *w, c);
    while (i < n && b[i] == c)
        i++;
    while (i < n && b[i] >= 0x80) {
        uint32_t cp;
        int l = kvg_utf8_decode(b + i, n - i, &cp);
        if (l == 0)
            break;              /* cannot happen: the input was validated */
        if (!is_mark(cp)) {
            /* A Hangul vowel or final consonant can now compose with what precedes
             * the run (marks cannot be here any more). */
            if (!kvg_nfc_boundary(cp))
                *renfc = 1;
            break;
        }
        i += (size_t)l;
    }
    return i;
}

/* The output never holds a junk run. Dropping a run can bring a short run of the
 * same character in the input next to a short run at the end of the output; when
 * together they reach JUNK_MIN both go, and so on ("===------===" leaves nothing,
 * not "======") -- that is what makes the step idempotent. Marks attached to a
 * dropped run go with it: left behind they would attach to whatever precedes it. */
static size_t step_junk(unsigned char *b, size_t n, int *renfc)
{
    size_t w = 0, i = 0;

    while (i < n) {
        size_t p = next_junk(b, i, n);
        memmove(b + w, b + i, p - i);
        w += p - i;
        if (p == n)
            break;
        i = drop_run(b, n, p, &w, renfc);
        while (i < n && is_punct(b[i])) {
            size_t k = 0;
            while (i + k < n && b[i + k] == b[i])
                k++;
            if (k + tail_run(b, w, b[i]) < JUNK_MIN)
                break;
            i = drop_run(b, n, i, &w, renfc);
        }
    }
    return w;
}

/* Start of the first tab, or of the first space or tab followed by another, in
 * b[i..n); n if none. */
static size_t next_space_fix(const unsigned char *b, size_t i, size_t n)
{
    size_t p = i;

    while (p < n) {
        if (p + 9 <= n) {
            uint64_t x = load64(b + p), y = load64(b + p + 1);
            uint64_t tabs = bytes_eq(x, '\t');
            uint64_t wsx = tabs | bytes_eq(x, ' ');
            uint64_t wsy = bytes_eq(y, '\t') | bytes_eq(y, ' ');
            if (!(tabs | (wsx & wsy))) {
                p += 8;
                continue;
            }
        }
        if (b[p] == '\t' || (b[p] == ' ' && p + 1 < n && is_ws(b[p + 1])))
            return p;
        p++;
    }
    return n;
}

static size_t step_spaces(unsigned char *b, size_t n)
{
    size_t w = 0, i = 0;

    while (i < n) {
        size_t p = next_space_fix(b, i, n);
        memmove(b + w, b + i, p - i);
        w += p - i;
        if (p == n)
            break;
        b[w++] = ' ';
        for (i = p + 1; i < n && is_ws(b[i]); i++)
            ;
    }
    return w;
}

/* Line by line: the whitespace before each LF (and at the very end) is left out
 * of the stretch that is moved. */
static size_t step_trailing(unsigned char *b, size_t n)
{
    size_t w = 0, i = 0;

    while (i < n) {
        const unsigned char *lf = memchr(b + i, '\n', n - i);
        size_t e = lf ? (size_t)(lf - b) : n, t = e;
        while (t > i && is_ws(b[t - 1]))
            t--;
        memmove(b + w, b + i, t - i);
        w += t - i;
        if (e == n)
            break;
        b[w++] = '\n';
        i = e + 1;
    }
    return w;
}

/* Start of the first "\n\n\n" in b[i..n), or n. */
static size_t next_lf3(const unsigned char *b, size_t i, size_t n)
{
    while (i + 3 <= n) {
        const unsigned char *lf = memchr(b + i, '\n', n - i - 2);
        size_t q;
        if (!lf)
            return n;
        q = (size_t)(lf - b);
        if (b[q + 1] != '\n')
            i = q + 2;
        else if (b[q + 2] != '\n')
            i = q + 3;
        else
            return q;
    }
    return n;
}

static size_t step_blank_lines(unsigned char *b, size_t n)
{
    size_t w = 0, i = 0;

    while (i < n) {
        /* the first "\n\n\n" from i starts a maximal run: b[i - 1] is never LF */
        size_t q = next_lf3(b, i, n), p = q < n ? q + 2 : n;
        memmove(b + w, b + i, p - i);
        w += p - i;
        for (i = p; i < n && b[i] == '\n'; i++)
            ;
    }
    return w;
}

/* kvg_utf8_invalid_at() with ASCII skipped eight bytes at a time (prompts are
 * mostly ASCII). Returns the offset of the first invalid byte or (size_t)-1. */
static size_t invalid_at(const unsigned char *s, size_t n)
{
    size_t i = 0;

    while (i < n) {
        uint32_t cp;
        int l;

        if (n - i >= 8 && !(load64(s + i) & HIGHS)) {
            i += 8;
            continue;
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        l = kvg_utf8_decode(s + i, n - i, &cp);
        if (l == 0)
            return i;
        i += (size_t)l;
    }
    return (size_t)-1;
}

int kvg_normalize_into(unsigned flags, const char *in, size_t len, char *out, size_t cap,
                       size_t *out_len, char *err, size_t err_len)
{
    const unsigned char *src = (const unsigned char *)in;
    unsigned char *b = (unsigned char *)out;
    size_t bad, n;
    int renfc = 0;

    if (flags & ~KVG_NORM_ALL) {
        kvg_set_err(err, err_len, "unknown normalize flags 0x%x", flags & ~KVG_NORM_ALL);
        return -1;
    }
    if (flags & KVG_NORM_NFC) {
        /* kvg_nfc validates as it decodes: no separate pass. */
        if (kvg_nfc(src, len, b, cap, &n, err, err_len) < 0)
            return -1;
    } else {
        bad = invalid_at(src, len);
        if (bad != (size_t)-1) {
            kvg_set_err(err, err_len, "invalid UTF-8 at byte offset %zu", bad);
            return -1;
        }
        if (cap < len) {
            kvg_set_err(err, err_len, "normalize: output buffer of %zu bytes, need %zu", cap, len);
            return -1;
        }
        if (len)
            memmove(b, src, len);
        n = len;
    }
    if (n == 0) {               /* out may be NULL when there is nothing to write */
        *out_len = 0;
        return 0;
    }
    if (flags & KVG_NORM_NEWLINES)
        n = step_newlines(b, n);
    if (flags & KVG_NORM_JUNK)
        n = step_junk(b, n, &renfc);
    if ((flags & KVG_NORM_NFC) && renfc) {
        unsigned char *tmp = malloc(n ? n : 1);
        int rc;
        if (!tmp) {
            kvg_set_err(err, err_len, "normalize: out of memory");
            return -1;
        }
        memcpy(tmp, b, n);
        rc = kvg_nfc(tmp, n, b, cap, &n, err, err_len);
        free(tmp);
        if (rc < 0)
            return -1;
    }
    if (flags & KVG_NORM_SPACES)
        n = step_spaces(b, n);
    if (flags & KVG_NORM_TRAILING)
        n = step_trailing(b, n);
    if (flags & KVG_NORM_BLANK_LINES)
        n = step_blank_lines(b, n);
    *out_len = n;
    return 0;
}

int kvg_normalize(unsigned flags, const char *in, size_t len, char **out, size_t *out_len,
                  char *err, size_t err_len)
{
    size_t bound = kvg_normalize_bound(flags, in, len);
    char *buf;

    *out = NULL;
    if (bound == SIZE_MAX) {
        kvg_set_err(err, err_len, "normalize: input too large");
        return -1;
    }
    buf = malloc(bound + 1);
    if (!buf) {
        kvg_set_err(err, err_len, "normalize: out of memory for %zu bytes", bound + 1);
        return -1;
    }
    if (kvg_normalize_into(flags, in, len, buf, bound, out_len, err, err_len) < 0) {
        free(buf);
        return -1;
    }
    buf[*out_len] = '\0';
    *out = buf;
    return 0;
}
