/* libFuzzer target for the prompt normalizer. The first byte picks the steps, the
 * rest is the text. Valid UTF-8 must normalize to valid UTF-8 within the bound, a
 * second pass must change nothing, and nfc must agree with utf8proc's own NFC;
 * invalid UTF-8 must be rejected with the offset of the first bad byte. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "nfc.h"
#include "normalize.h"
#include "normalize_testing.h"
#include "utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what, unsigned flags)
{
    if (!cond) {
        fprintf(stderr, "fuzz_normalize: %s (flags 0x%x)\n", what, flags);
        abort();
    }
}

static void check_nfc(const uint8_t *in, size_t n)
{
    utf8proc_uint8_t *ref = NULL;
    utf8proc_ssize_t rn = utf8proc_map(in, (utf8proc_ssize_t)n, &ref,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    size_t cap = kvg_nfc_bound(in, n), got_n;
    unsigned char *got = malloc(cap ? cap : 1);
    char err[200];

    check(rn >= 0, "utf8proc rejected valid UTF-8", KVG_NORM_NFC);
    check(kvg_nfc(in, n, got, cap, &got_n, err, sizeof(err)) == 0, "kvg_nfc failed", KVG_NORM_NFC);
    check(got_n == (size_t)rn && memcmp(got, ref, got_n) == 0, "kvg_nfc != utf8proc NFC",
          KVG_NORM_NFC);
    free(got);
    free(ref);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned flags;
    const char *in;
    size_t n, bad, out_n, again_n;
    char *out = NULL, *again = NULL, err[200];
    int rc;

    if (size == 0)
        return 0;
    flags = data[0] & KVG_NORM_ALL;
    in = (const char *)data + 1;
    n = size - 1;
    bad = kvg_utf8_invalid_at((const unsigned char *)in, n);
    rc = kvg_normalize(flags, in, n, &out, &out_n, err, sizeof(err));
    if (bad != (size_t)-1) {
        char want[64];
        snprintf(want, sizeof(want), "byte offset %zu", bad);
        check(rc < 0 && out == NULL, "invalid UTF-8 accepted", flags);
        check(strstr(err, want) != NULL, "error does not name the first bad byte", flags);
        return 0;
    }
    check(rc == 0, "valid UTF-8 rejected", flags);
    check(kvg_utf8_invalid_at((const unsigned char *)out, out_n) == (size_t)-1,
          "output is not valid UTF-8", flags);
    check(out_n <= kvg_normalize_bound(flags, in, n), "output exceeds the bound", flags);
    check(kvg_normalize(flags, out, out_n, &again, &again_n, err, sizeof(err)) == 0,
          "second pass failed", flags);
    check(again_n == out_n && memcmp(again, out, out_n) == 0, "not idempotent", flags);
    if (!(flags & KVG_NORM_NFC)) {
        char *copy = malloc(n ? n : 1);
        size_t copy_n;
        memcpy(copy, in, n);
        check(kvg_normalize_into(flags, copy, n, copy, n, &copy_n, err, sizeof(err)) == 0
              && copy_n == out_n && memcmp(copy, out, out_n) == 0, "in place differs", flags);
        free(copy);
    } else {
        check_nfc((const uint8_t *)in, n);
    }
    free(out);
    free(again);
    return 0;
}
