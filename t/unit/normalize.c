/* Prompt normalizer: expected output of each step, configuration parsing, errors,
 * and a randomized check of the properties for every combination of steps: valid
 * UTF-8 out, idempotent, within the bound, and each enabled step's invariant holds
 * on the final text. KVG_SEED=<n> replays another random sequence. */
#include <stdint.h>
#include <utf8proc.h>

#include "normalize.h"
#include "normalize_testing.h"
#include "tap.h"
#include "utf8.h"

/* Normalizes a NUL-terminated string; the result is the caller's to free, NULL
 * on error (err filled). */
static char *norm(unsigned flags, const char *s, char *err, size_t err_len)
{
    char *out;
    size_t n;

    if (kvg_normalize(flags, s, strlen(s), &out, &n, err, err_len) < 0)
        return NULL;
    return out;
}

static void check(unsigned flags, const char *in, const char *want, const char *name)
{
    char err[200] = "";
    char *got = norm(flags, in, err, sizeof(err));

    if (!got)
        diag("  error: %s", err);
    is_str(got, want, "%s", name);
    free(got);
}

static void test_steps(void)
{
    check(KVG_NORM_NEWLINES, "a\r\nb\rc\n\r\n\r\r\n", "a\nb\nc\n\n\n\n", "newlines: CRLF and CR to LF");
    check(0, "a\r\nb", "a\r\nb", "no steps: unchanged");

    check(KVG_NORM_SPACES, "a  \t b\t\tc d", "a b c d", "spaces: runs of spaces/tabs collapse");
    check(KVG_NORM_SPACES, "\tx\t", " x ", "spaces: a lone tab becomes a space");
    check(KVG_NORM_SPACES, "a \n  b", "a \n b", "spaces: newlines are not spaces");

    check(KVG_NORM_TRAILING, "a  \nb\t\n \t\nc  ", "a\nb\n\nc", "trailing: per line and at the end");
    check(KVG_NORM_TRAILING, "  lead", "  lead", "trailing: leading whitespace kept");
    check(KVG_NORM_TRAILING, "a \r\n", "a \r\n", "trailing: with newlines off, CR is not whitespace");

    check(KVG_NORM_BLANK_LINES, "a\n\n\n\nb\n\nc\n\n\n", "a\n\nb\n\nc\n\n",
          "blank-lines: 3+ LF become 2, 2 stay");
    check(KVG_NORM_BLANK_LINES, "a\n \n\n\nb", "a\n \n\nb",
          "blank-lines: a line of spaces is not blank without 'trailing'");
    check(KVG_NORM_BLANK_LINES | KVG_NORM_TRAILING, "a\n \n\t\n\nb", "a\n\nb",
          "blank-lines + trailing: whitespace-only lines count as blank");

    check(KVG_NORM_JUNK, "a------b", "ab", "junk: 6 dashes dropped");
    check(KVG_NORM_JUNK, "a-----b", "a-----b", "junk: 5 dashes kept");
    check(KVG_NORM_JUNK, "x ====== y ******* z", "x  y  z", "junk: = and * runs");
    check(KVG_NORM_JUNK, "Wait.......end", "Waitend", "junk: dot runs");
    check(KVG_NORM_JUNK, "-=-=-=-=-=-=", "-=-=-=-=-=-=", "junk: alternating characters are not a run");
    check(KVG_NORM_JUNK, "===------===", "", "junk: runs joined by a dropped run are dropped too");
    check(KVG_NORM_JUNK, "ab===------==c", "ab=====c", "junk: ... but only when they reach 6");
    check(KVG_NORM_JUNK, "x------\xCC\x81\xCC\x96y", "xy", "junk: marks attached to the run go with it");
    check(KVG_NORM_JUNK, "x---\xCC\x81---y", "x---\xCC\x81---y", "junk: a mark splits a run");
    check(KVG_NORM_JUNK, "aaaaaaaa 11111111", "aaaaaaaa 11111111", "junk: letters and digits are not junk");
    check(KVG_NORM_JUNK, "\xE2\x80\x94\xE2\x80\x94\xE2\x80\x94\xE2\x80\x94\xE2\x80\x94\xE2\x80\x94",
          "\xE2\x80\x94\xE2\x80\x94\xE2\x80\x94\xE2\x80\x94\xE2\x80\x94\xE2\x80\x94",
          "junk: only ASCII punctuation (em dashes stay)");

    check(KVG_NORM_NFC, "Cafe\xCC\x81", "Caf\xC3\xA9", "nfc: e + U+0301 composes");
    check(KVG_NORM_NFC, "\xE2\x84\xAB", "\xC3\x85", "nfc: U+212B ANGSTROM SIGN -> U+00C5");
    check(KVG_NORM_NFC, "a\xCC\x81\xCC\x96", "\xC3\xA1\xCC\x96", "nfc: marks reordered, then composed");
    check(KVG_NORM_NFC, "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81", "nfc: Hangul jamo compose");
    check(KVG_NORM_NFC, "\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC", "nfc: composition exclusion U+0958 stays decomposed");
    check(KVG_NORM_NFC, "\xCD\xBE", ";", "nfc: U+037E GREEK QUESTION MARK -> ';'");

    /* Step interactions that fix the order. */
    check(KVG_NORM_NFC | KVG_NORM_JUNK, ";;;;;\xCD\xBE", "",
          "nfc before junk: U+037E completes a run of six ';'");
    check(KVG_NORM_NFC | KVG_NORM_JUNK, "======\xCC\xB8", "=====\xE2\x89\xA0",
          "nfc before junk: '=' + U+0338 is U+2260, leaving five '='");
    check(KVG_NORM_NFC | KVG_NORM_JUNK, "\xE1\x84\x80------\xE1\x85\xA1", "\xEA\xB0\x80",
          "junk then nfc again: jamo brought together compose");
    check(KVG_NORM_JUNK, "\xE1\x84\x80------\xE1\x85\xA1", "\xE1\x84\x80\xE1\x85\xA1",
          "... and without nfc they are left apart");
    check(KVG_NORM_NEWLINES | KVG_NORM_JUNK, "a\r------\nb", "a\n\nb",
          "newlines before junk: a CR and an LF around a run stay two line breaks");
    check(KVG_NORM_JUNK, "###### Heading", " Heading",
          "junk: six '#' are junk too (a Markdown h6 marker: a known cost of the rule)");
    check(KVG_NORM_JUNK | KVG_NORM_SPACES | KVG_NORM_TRAILING | KVG_NORM_BLANK_LINES,
          "a\n  ------  \n******\n\nb ====== c", "a\n\nb c",
          "junk before the whitespace steps: emptied lines collapse");
    check(KVG_NORM_ALL,
          "Title\r\n======\r\n\r\n\r\n\r\nSome  text\t \r\nCafe\xCC\x81 ;;;;;;\n",
          "Title\n\nSome text\nCaf\xC3\xA9\n", "all steps together");
    check(KVG_NORM_ALL, "", "", "empty input");
}

static void test_embedded_nul(void)
{
    char *out;
    size_t n;
    char err[200];

    ok(kvg_normalize(KVG_NORM_ALL, "a\0  b", 5, &out, &n, err, sizeof(err)) == 0 && n == 4
       && memcmp(out, "a\0 b", 4) == 0 && out[4] == '\0',
       "NUL bytes are ordinary characters; output NUL-terminated");
    free(out);
    ok(kvg_normalize_into(KVG_NORM_ALL, "", 0, NULL, 0, &n, err, sizeof(err)) == 0 && n == 0
       && kvg_normalize_into(KVG_NORM_JUNK, "", 0, NULL, 0, &n, err, sizeof(err)) == 0 && n == 0,
       "empty input into a NULL buffer of 0 bytes");
}

static void test_parse(void)
{
    unsigned f = 99;
    char err[256] = "";
    char buf[128];

    ok(kvg_normalize_parse("newlines spaces nfc", &f, err, sizeof(err)) == 0
       && f == (KVG_NORM_NEWLINES | KVG_NORM_SPACES | KVG_NORM_NFC), "parse a list");
    ok(kvg_normalize_parse(" junk,trailing ,\tblank-lines ", &f, err, sizeof(err)) == 0
       && f == (KVG_NORM_JUNK | KVG_NORM_TRAILING | KVG_NORM_BLANK_LINES),
       "commas, tabs and extra spaces separate words");
    ok(kvg_normalize_parse("all", &f, err, sizeof(err)) == 0 && f == KVG_NORM_ALL, "all");
    ok(kvg_normalize_parse("off", &f, err, sizeof(err)) == 0 && f == 0, "off");
    ok(kvg_normalize_parse("spaces nfcc", &f, err, sizeof(err)) < 0
       && strstr(err, "unknown normalize step 'nfcc'"), "unknown step named: %s", err);
    ok(kvg_normalize_parse("off nfc", &f, err, sizeof(err)) < 0 && strstr(err, "off"),
       "off with steps: %s", err);
    ok(kvg_normalize_parse("  ", &f, err, sizeof(err)) < 0 && strstr(err, "empty"),
       "empty list: %s", err);
    ok(kvg_normalize_parse_step("nfc", 3, &f, err, sizeof(err)) == 0 && f == KVG_NORM_NFC,
       "parse_step with a length (nginx ngx_str_t)");
    ok(kvg_normalize_parse_step("trailing-junk", 8, &f, err, sizeof(err)) == 0
       && f == KVG_NORM_TRAILING, "parse_step honours the length");
    ok(kvg_normalize_parse_step("bad\x01name", 8, &f, err, sizeof(err)) < 0
       && strstr(err, "'bad?name'"), "unprintable bytes are not echoed: %s", err);

    is_int(kvg_normalize_format(KVG_NORM_ALL, buf, sizeof(buf)), strlen(buf), "format length");
    is_str(buf, "nfc newlines junk spaces trailing blank-lines", "format all, pipeline order");
    kvg_normalize_format(0, buf, sizeof(buf));
    is_str(buf, "off", "format 0");
    kvg_normalize_format(KVG_NORM_JUNK | KVG_NORM_NFC, buf, sizeof(buf));
    is_str(buf, "nfc junk", "format two");
    {
        int round = 1;
        for (unsigned fl = 0; fl <= KVG_NORM_ALL; fl++) {
            unsigned back = 1234;
            kvg_normalize_format(fl, buf, sizeof(buf));
            round &= kvg_normalize_parse(buf, &back, err, sizeof(err)) == 0 && back == fl;
        }
        ok(round, "format then parse round-trips all 64 combinations");
    }
    is_int(kvg_normalize_format(KVG_NORM_ALL, buf, 5), 45, "format reports the needed length when truncated");
    is_str(buf, "nfc ", "... and truncates safely");
    is_str(kvg_normalize_step_name(KVG_NORM_BLANK_LINES), "blank-lines", "step name");
    ok(kvg_normalize_step_name(KVG_NORM_NFC | KVG_NORM_JUNK) == NULL, "no name for two flags");
}

static void test_errors(void)
{
    char err[200];
    char *out = (char *)"x";
    size_t n;
    char small[4];
    int all_ok = 1;

    for (unsigned fl = 0; fl <= KVG_NORM_ALL; fl++) {
        err[0] = '\0';
        all_ok &= kvg_normalize(fl, "abc  \xFF  def", 11, &out, &n, err, sizeof(err)) < 0
            && out == NULL && strstr(err, "invalid UTF-8 at byte offset 5") != NULL;
    }
    ok(all_ok, "invalid byte is an error naming offset 5 under every combination (%s)", err);
    ok(kvg_normalize(KVG_NORM_NFC, "e\xCC\x81\xED\xA0\x80", 6, &out, &n, err, sizeof(err)) < 0
       && strstr(err, "byte offset 3"), "surrogate after a mark: offset 3 (%s)", err);
    ok(kvg_normalize(0, "ab\xC0\xAF", 4, &out, &n, err, sizeof(err)) < 0
       && strstr(err, "byte offset 2"), "overlong: offset 2 (%s)", err);
    ok(kvg_normalize(KVG_NORM_ALL, "ab\xE2\x82", 4, &out, &n, err, sizeof(err)) < 0
       && strstr(err, "byte offset 2"), "truncated at the end: offset 2 (%s)", err);
    ok(kvg_normalize(0x40, "a", 1, &out, &n, err, sizeof(err)) < 0 && strstr(err, "0x40"),
       "unknown flag bits rejected (%s)", err);
    ok(kvg_normalize_into(0, "abcdef", 6, small, sizeof(small), &n, err, sizeof(err)) < 0,
       "buffer too small (no nfc): error");
    ok(kvg_normalize_into(KVG_NORM_NFC, "\xF0\x9D\x85\xA0", 4, small, sizeof(small), &n, err,
                          sizeof(err)) < 0, "buffer too small for nfc's expansion: error");
}

/* ---- randomized properties ---- */

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* Pieces in groups, a group drawn first, so that whitespace, line breaks, punctuation
 * runs and composing characters meet each other often. */
static const char *ws_pieces[] = { " ", "  ", "\t", " \t " };
static const char *nl_pieces[] = { "\n", "\n", "\r", "\r\n", "\n\n\n" };
static const char *punct_pieces[] = {
    "=", "==", "===", "-", "---", "------", "=======", "...", ".", "*****", "#", ";", ";;;",
    "`", ",", "_", "<",
};
static const char *text_pieces[] = { "a", "b", "e", "x", "\xC3\xA9", "\xE4\xB8\xAD",
                                     "\xF0\x9F\x98\x80", "\xC2\xA0", "\xE2\x80\x94" };
static const char *uni_pieces[] = {
    "e\xCC\x81",                    /* e + combining acute */
    "\xCC\x81", "\xCC\x96", "\xCC\xB8", /* lone marks: acute, grave below, long solidus */
    "\xCD\xBE",                     /* U+037E -> ';' */
    "\xE1\xBF\xAF",                 /* U+1FEF -> '`' */
    "\xE2\x84\xAB",                 /* U+212B -> U+00C5 */
    "\xE1\x84\x80", "\xE1\x85\xA1", "\xE1\x86\xA8", "\xEA\xB0\x80", /* jamo L, V, T; syllable */
    "\xCD\x84",                     /* U+0344: decomposes to two marks */
    "\xE0\xA5\x98",                 /* U+0958: composition exclusion */
    "\xF0\x9D\x85\xA0",             /* U+1D160: 3x expansion */
};
#define GROUP(a) { a, sizeof(a) / sizeof(a[0]) }
static const struct {
    const char **p;
    size_t n;
} groups[] = { GROUP(ws_pieces), GROUP(nl_pieces), GROUP(punct_pieces), GROUP(punct_pieces),
               GROUP(text_pieces), GROUP(uni_pieces) };

static size_t build(char *buf)
{
    size_t n = 0, k = rnd(30);

    for (size_t i = 0; i < k; i++) {
        size_t g = rnd(sizeof(groups) / sizeof(groups[0]));
        const char *p = groups[g].p[rnd((uint32_t)groups[g].n)];
        size_t l = strlen(p), reps = rnd(8) == 0 ? 2 + rnd(7) : 1;
        while (reps--) {
            memcpy(buf + n, p, l);
            n += l;
        }
    }
    return n;
}

static int is_nfc(const char *s, size_t n)
{
    utf8proc_uint8_t *d = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &d,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    int same = m >= 0 && (size_t)m == n && memcmp(d, s, n) == 0;
    free(d);
    return same;
}

/* ---- a reference model: the plainest byte loops, and utf8proc's own NFC ----
 * The library's steps skip untouched stretches with memchr/memmem/word tricks;
 * these do not, so agreement on random text checks the fast paths. After junk the
 * model always runs NFC again (the library only when a drop can matter). */

static size_t ref_nfc(char *s, size_t n)
{
    utf8proc_uint8_t *d = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &d,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (m < 0)
        return (size_t)-1;
    memcpy(s, d, (size_t)m);    /* callers give 3n bytes of room */
    free(d);
    return (size_t)m;
}

static int ref_punct(unsigned char c)
{
    return c > 0x20 && c < 0x7F && !(c >= '0' && c <= '9') && !(c >= 'a' && c <= 'z')
        && !(c >= 'A' && c <= 'Z');
}

static size_t ref_junk(char *s, size_t n)
{
    unsigned char *b = (unsigned char *)s;
    size_t w = 0, i = 0;

    while (i < n) {
        unsigned char c = b[i];
        size_t j = i, m = 0;
        if (!ref_punct(c)) {
            b[w++] = b[i++];
            continue;
        }
        while (j < n && b[j] == c)
            j++;
        while (m < w && b[w - 1 - m] == c)
            m++;
        if (m + (j - i) < 6) {
            while (i < j)
                b[w++] = b[i++];
            continue;
        }
        w -= m;
        i = j;
        for (;;) {              /* marks that follow the run go with it */
            uint32_t cp;
            int l = kvg_utf8_decode(b + i, n - i, &cp);
            const utf8proc_property_t *p;
            if (l <= 1)
                break;
            p = utf8proc_get_property((utf8proc_int32_t)cp);
            if (!p->combining_class && p->category != UTF8PROC_CATEGORY_MN
                && p->category != UTF8PROC_CATEGORY_MC && p->category != UTF8PROC_CATEGORY_ME)
                break;
            i += (size_t)l;
        }
    }
    return w;
}

static size_t ref_model(unsigned fl, char *s, size_t n)
{
    size_t w, i;

    if (fl & KVG_NORM_NFC)
        n = ref_nfc(s, n);
    if (fl & KVG_NORM_NEWLINES) {
        for (w = i = 0; i < n; i++) {
            if (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n')
                continue;
            s[w++] = s[i] == '\r' ? '\n' : s[i];
        }
        n = w;
    }
    if (fl & KVG_NORM_JUNK) {
        n = ref_junk(s, n);
        if (fl & KVG_NORM_NFC)
            n = ref_nfc(s, n);
    }
    if (fl & KVG_NORM_SPACES) {
        for (w = i = 0; i < n; i++) {
            int ws = s[i] == ' ' || s[i] == '\t';
            if (ws && w > 0 && s[w - 1] == ' ' && i > 0 && (s[i - 1] == ' ' || s[i - 1] == '\t'))
                continue;
            s[w++] = ws ? ' ' : s[i];
        }
        n = w;
    }
    if (fl & KVG_NORM_TRAILING) {
        for (w = i = 0; i < n; i++) {
            if (s[i] == '\n')
                while (w > 0 && (s[w - 1] == ' ' || s[w - 1] == '\t'))
                    w--;
            s[w++] = s[i];
        }
        while (w > 0 && (s[w - 1] == ' ' || s[w - 1] == '\t'))
            w--;
        n = w;
    }
    if (fl & KVG_NORM_BLANK_LINES) {
        for (w = i = 0; i < n; i++) {
            if (s[i] == '\n' && w >= 2 && s[w - 1] == '\n' && s[w - 2] == '\n')
                continue;
            s[w++] = s[i];
        }
        n = w;
    }
    return n;
}

/* The invariant each enabled step promises about the final text. */
static const char *broken_invariant(unsigned fl, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((fl & KVG_NORM_NEWLINES) && c == '\r')
            return "newlines: CR left";
        if ((fl & KVG_NORM_SPACES) && (c == '\t' || (c == ' ' && i + 1 < n && s[i + 1] == ' ')))
            return "spaces: tab or double space left";
        if ((fl & KVG_NORM_TRAILING) && (c == ' ' || c == '\t') && (i + 1 == n || s[i + 1] == '\n'))
            return "trailing: whitespace before a line end";
        if ((fl & KVG_NORM_BLANK_LINES) && c == '\n' && i + 2 < n && s[i + 1] == '\n' && s[i + 2] == '\n')
            return "blank-lines: three LF left";
        if ((fl & KVG_NORM_JUNK) && c > 0x20 && c < 0x7F && !((c >= '0' && c <= '9')
            || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) && i + 6 <= n
            && memcmp(s + i, s + i + 1, 5) == 0)
            return "junk: a run of 6 left";
    }
    if ((fl & KVG_NORM_NFC) && !is_nfc(s, n))
        return "nfc: output is not NFC";
    return NULL;
}

static void test_random(void)
{
    const char *seed_env = getenv("KVG_SEED");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : 20240601;
    char in[4096], err[200], again_in[4096];
    static char model[3 * 4096];
    long cases = 0, bad_utf8 = 0, not_idem = 0, over_bound = 0, failed = 0, broken = 0,
         inplace_diff = 0, model_diff = 0;

    rng_state = seed * 2654435761u + 1;
    diag("seed %llu (set KVG_SEED to replay another)", (unsigned long long)seed);
    for (int t = 0; t < 4000; t++) {
        size_t n = build(in);
        /* every string under all steps and under 7 random combinations; over the
         * run every combination is hit hundreds of times */
        for (int r = 0; r < 8; r++) {
            unsigned fl = r == 0 ? KVG_NORM_ALL : rnd(KVG_NORM_ALL + 1);
            char *a = NULL, *b = NULL;
            size_t na, nb;
            const char *why;

            cases++;
            if (kvg_normalize(fl, in, n, &a, &na, err, sizeof(err)) < 0) {
                if (!failed++)
                    diag("  case %d flags 0x%x: %s", t, fl, err);
                continue;
            }
            if (kvg_utf8_invalid_at((const unsigned char *)a, na) != (size_t)-1)
                bad_utf8++;
            if (na > kvg_normalize_bound(fl, in, n))
                over_bound++;
            memcpy(model, in, n);
            if (ref_model(fl, model, n) != na || memcmp(model, a, na) != 0) {
                if (!model_diff++)
                    diag("  case %d flags 0x%x differs from the reference model", t, fl);
            }
            why = broken_invariant(fl, a, na);
            if (why && !broken++)
                diag("  case %d flags 0x%x: %s", t, fl, why);
            if (kvg_normalize(fl, a, na, &b, &nb, err, sizeof(err)) < 0 || nb != na
                || memcmp(a, b, na) != 0) {
                if (!not_idem++) {
                    kvg_normalize_format(fl, err, sizeof(err));
                    diag("  case %d not idempotent under '%s'", t, err);
                }
            }
            if (!(fl & KVG_NORM_NFC)) {
                size_t ni;
                memcpy(again_in, in, n);
                if (kvg_normalize_into(fl, again_in, n, again_in, n, &ni, err, sizeof(err)) < 0
                    || ni != na || memcmp(again_in, a, na) != 0)
                    inplace_diff++;
            }
            free(a);
            free(b);
        }
    }
    diag("%ld random cases (4000 strings x 8 step combinations)", cases);
    is_int(failed, 0, "random: no valid input is rejected");
    is_int(bad_utf8, 0, "random: output is always valid UTF-8");
    is_int(over_bound, 0, "random: output within kvg_normalize_bound()");
    is_int(model_diff, 0, "random: same output as the plain reference model");
    is_int(broken, 0, "random: every enabled step's invariant holds on the output");
    is_int(not_idem, 0, "random: normalize(normalize(x)) == normalize(x) for every combination");
    is_int(inplace_diff, 0, "random: in-place (out == in) gives the same result without nfc");
}

/* Invalid bytes spliced into random valid text are reported at their offset. */
static void test_random_invalid(void)
{
    static const char *bad[] = { "\xFF", "\x80", "\xC3", "\xE2\x82", "\xED\xA0\x80", "\xC0\xAF",
                                 "\xF4\x90\x80\x80", "\xF0\x9F\x98" };
    char in[4200], err[200];
    long wrong = 0;

    for (int t = 0; t < 400; t++) {
        size_t n = build(in), cut, bl;
        const char *b = bad[rnd(sizeof(bad) / sizeof(bad[0]))];
        char want[64];
        char *out = NULL;
        size_t on;
        unsigned fl = rnd(KVG_NORM_ALL + 1);

        /* splice at a character boundary so the invalid bytes are the first error */
        cut = n ? rnd((uint32_t)n + 1) : 0;
        while (cut > 0 && cut < n && ((unsigned char)in[cut] & 0xC0) == 0x80)
            cut--;
        bl = strlen(b);
        memmove(in + cut + bl, in + cut, n - cut);
        memcpy(in + cut, b, bl);
        /* a truncated sequence followed by a continuation-looking byte stays invalid at cut */
        snprintf(want, sizeof(want), "byte offset %zu", cut);
        if (kvg_normalize(fl, in, n + bl, &out, &on, err, sizeof(err)) == 0 || !strstr(err, want)) {
            if (!wrong++)
                diag("  case %d flags 0x%x: wanted '%s', got '%s'", t, fl, want,
                     out ? "success" : err);
            free(out);
        }
    }
    is_int(wrong, 0, "random invalid UTF-8: rejected with the offset of the bad bytes");
}

int main(void)
{
    test_steps();
    test_embedded_nul();
    test_parse();
    test_errors();
    test_random();
    test_random_invalid();
    return done_testing();
}
