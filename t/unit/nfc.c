/* NFC: the segment-boundary predicate and size bound hold for every code point of
 * utf8proc's data, and kvg_nfc() agrees with utf8proc_NFC() on every code point
 * (in context) and on random mixed text, also when marks run long. */
#include <stdint.h>
#include <utf8proc.h>

#include "nfc.h"
#include "tap.h"
#include "utf8.h"

static char *ref_nfc(const unsigned char *s, size_t len, size_t *out_len)
{
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t n = utf8proc_map(s, (utf8proc_ssize_t)len, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (n < 0)
        return NULL;
    *out_len = (size_t)n;
    return (char *)dst;
}

/* kvg_nfc into a buffer of exactly the bound, compared with utf8proc's. */
static int same_as_ref(const unsigned char *s, size_t len, char *why, size_t why_len)
{
    size_t bound = kvg_nfc_bound(s, len), got_len, ref_len;
    unsigned char *got = malloc(bound ? bound : 1);
    char err[120];
    char *ref = ref_nfc(s, len, &ref_len);
    int ok_ = 0;

    if (!got || !ref) {
        snprintf(why, why_len, "allocation or reference failed");
    } else if (kvg_nfc(s, len, got, bound, &got_len, err, sizeof(err)) < 0) {
        snprintf(why, why_len, "kvg_nfc failed: %s", err);
    } else if (got_len != ref_len || memcmp(got, ref, got_len) != 0) {
        snprintf(why, why_len, "differs from utf8proc (%zu vs %zu bytes)", got_len, ref_len);
    } else {
        ok_ = 1;
    }
    free(got);
    free(ref);
    return ok_;
}

static void test_tables(void)
{
    static unsigned char is_second[0x110000];
    long bad_second = 0, bad_first = 0, bad_expand = 0, long_decomp = 0, boundaries = 0;
    uint32_t example = 0;

    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        utf8proc_int32_t d[16];
        int bc = 0;
        unsigned char enc[4];
        size_t in_bytes, out_bytes = 0;
        utf8proc_ssize_t n;

        if (cp >= 0xD800 && cp <= 0xDFFF)
            continue;
        n = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 16, UTF8PROC_COMPOSE, &bc);
        if (n < 1 || n > 4) {
            long_decomp++;
            continue;
        }
        for (utf8proc_ssize_t i = 1; i < n; i++)
            is_second[d[i]] = 1;
        in_bytes = (size_t)kvg_utf8_encode(cp, enc);
        for (utf8proc_ssize_t i = 0; i < n; i++)
            out_bytes += (size_t)kvg_utf8_encode((uint32_t)d[i], enc);
        if (cp >= 0x80 && out_bytes > 3 * in_bytes)
            bad_expand++;
        if (kvg_nfc_boundary(cp)) {
            boundaries++;
            if (utf8proc_get_property(d[0])->combining_class != 0)
                bad_first++;
        }
    }
    /* Anything that ever follows the first code point of a decomposition could be
     * the second half of a composition: none may be a boundary. */
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (is_second[cp] && kvg_nfc_boundary(cp)) {
            if (!bad_second)
                example = cp;
            bad_second++;
        }
    }
    is_int(long_decomp, 0, "every canonical decomposition is 1..4 code points");
    is_int(bad_expand, 0, "no character's decomposition exceeds 3x its UTF-8 length");
    is_int(bad_first, 0, "every boundary character decomposes to a leading starter");
    if (!ok(bad_second == 0, "no boundary character can be a composition's second half"))
        diag("  %ld such, e.g. U+%04X", bad_second, (unsigned)example);
    ok(boundaries > 1000000, "the predicate still cuts most characters (%ld)", boundaries);
    ok(!kvg_nfc_boundary(0x0301) && !kvg_nfc_boundary(0x1161) && !kvg_nfc_boundary(0x11A8)
       && kvg_nfc_boundary('a') && kvg_nfc_boundary(0xAC00) && kvg_nfc_boundary(0x4E2D),
       "boundary examples: marks and medial/final jamo are not, letters and syllables are");
}

/* Every code point, in runs of 48 consecutive ones after a base letter, so each is
 * checked both as a segment start and following other characters. */
static void test_all_code_points(void)
{
    unsigned char buf[48 * 4 + 4];
    char why[200];
    long fails = 0;
    uint32_t first_fail = 0;

    for (uint32_t start = 0; start < 0x110000; start += 48) {
        size_t n = 0;
        buf[n++] = 'a';
        for (uint32_t cp = start; cp < start + 48 && cp < 0x110000; cp++) {
            if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == 0)
                continue;
            n += (size_t)kvg_utf8_encode(cp, buf + n);
        }
        if (!same_as_ref(buf, n, why, sizeof(why))) {
            if (!fails++)
                first_fail = start;
        }
    }
    if (!ok(fails == 0, "kvg_nfc == utf8proc NFC over every code point"))
        diag("  %ld blocks differ, first at U+%04X", fails, (unsigned)first_fail);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static void test_random(void)
{
    static const char *pieces[] = {
        "a", "e", "A", " ", "\n", "=", "<", "e\xCC\x81", "\xCC\x81", "\xCC\x96", "\xCC\xB8",
        "\xCD\x84", "\xE0\xBD\xB3", "\xE1\x84\x80", "\xE1\x85\xA1", "\xE1\x86\xA8", "\xEA\xB0\x80",
        "\xE2\x84\xAB", "\xCD\xBE", "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80",
        "\xF0\x9D\x85\x9E", "\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC", "\xE3\x82\xAB\xE3\x82\x99",
    };
    const size_t np = sizeof(pieces) / sizeof(pieces[0]);
    char why[200];
    unsigned char buf[1024];
    long fails = 0;

    for (int t = 0; t < 3000; t++) {
        size_t n = 0, k = rnd(60);
        for (size_t i = 0; i < k; i++) {
            const char *p = pieces[rnd((uint32_t)np)];
            size_t l = strlen(p);
            memcpy(buf + n, p, l);
            n += l;
        }
        if (!same_as_ref(buf, n, why, sizeof(why)) && !fails++)
            diag("  case %d: %s", t, why);
    }
    is_int(fails, 0, "kvg_nfc == utf8proc NFC on 3000 random mixed strings");
}

static void test_long_mark_runs(void)
{
    /* a + (U+0301 U+0316) x N: ordering puts the 220s first, then a+U+0301 composes.
     * utf8proc's own bubble sort would be quadratic here; ours must not be. */
    const size_t pairs = 200000;
    size_t len = 1 + 4 * pairs, out_len;
    unsigned char *in = malloc(len), *out = malloc(len * 3);
    char err[200];
    int good;

    for (size_t i = 0; i < pairs; i++)
        memcpy(in + 1 + 4 * i, "\xCC\x81\xCC\x96", 4);
    in[0] = 'a';
    good = kvg_nfc(in, len, out, len * 3, &out_len, err, sizeof(err)) == 0;
    ok(good, "400k alternating marks normalize");
    if (good) {
        int shape = out_len == len - 1 && memcmp(out, "\xC3\xA1", 2) == 0;
        for (size_t i = 0; shape && i < pairs; i++)
            shape = memcmp(out + 2 + 2 * i, "\xCC\x96", 2) == 0;
        for (size_t i = 0; shape && i + 1 < pairs; i++)
            shape = memcmp(out + 2 + 2 * pairs + 2 * i, "\xCC\x81", 2) == 0;
        ok(shape, "... into U+00E1, all U+0316, then the remaining U+0301");
    }
    /* The same shape, short enough for utf8proc to check directly. */
    ok(same_as_ref(in, 1 + 4 * 40, err, sizeof(err)), "40 pairs agree with utf8proc");
    free(in);
    free(out);
}

static void test_errors(void)
{
    unsigned char out[64];
    size_t n;
    char err[200];

    ok(kvg_nfc((const unsigned char *)"ab\xC3(", 4, out, sizeof(out), &n, err, sizeof(err)) < 0
       && strstr(err, "byte offset 2"), "truncated sequence: error names offset 2 (%s)", err);
    ok(kvg_nfc((const unsigned char *)"\xE2\x82\xAC\x80", 4, out, sizeof(out), &n, err,
               sizeof(err)) < 0 && strstr(err, "byte offset 3"),
       "stray continuation byte: offset 3 (%s)", err);
    ok(kvg_nfc((const unsigned char *)"\xF0\x9D\x85\xA0", 4, out, 11, &n, err, sizeof(err)) < 0,
       "output larger than the buffer is an error, not an overflow");
    ok(kvg_nfc((const unsigned char *)"\xF0\x9D\x85\xA0", 4, out, 12, &n, err, sizeof(err)) == 0
       && n == 12, "U+1D160 expands exactly 3x, within the bound");
    is_int(kvg_nfc_bound((const unsigned char *)"ab\xC3\xA9", 4), 8, "bound: ASCII 1x, others 3x");
    ok(kvg_nfc((const unsigned char *)"", 0, out, 0, &n, err, sizeof(err)) == 0 && n == 0,
       "empty input");
}

int main(void)
{
    test_tables();
    test_all_code_points();
    test_random();
    test_long_mark_runs();
    test_errors();
    return done_testing();
}
