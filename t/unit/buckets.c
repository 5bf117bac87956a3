/* Length buckets: boundaries, the bypass bucket, labels and config errors. */
#include "tap.h"
#include "buckets.h"
#include "buckets_testing.h"

static void bad_spec(const char *spec, const char *want_in_err)
{
    kvg_buckets b;
    char err[256] = "";

    kvg_buckets_default(&b);
    int rc = kvg_buckets_parse(&b, spec, err, sizeof err);
    ok(rc == -1, "'%s' rejected", spec ? spec : "(null)");
    if (!ok(strstr(err, want_in_err) != NULL, "  error mentions '%s'", want_in_err))
        diag("  error was: %s", err);
    /* a failed parse leaves the previous configuration intact */
    is_int(b.n_bounds, 4, "  buckets unchanged after error");
}

int main(void)
{
    kvg_buckets b;
    char err[256];

    kvg_buckets_default(&b);
    is_int(b.n_bounds, 4, "default: 4 boundaries");
    is_int(kvg_buckets_count(&b), 5, "default: 5 buckets");
    {
        static const struct { uint64_t n; unsigned idx; } cases[] = {
            { 0, 0 }, { 1, 0 }, { 127, 0 }, { 128, 1 }, { 129, 1 }, { 1023, 1 }, { 1024, 2 },
            { 8191, 2 }, { 8192, 3 }, { 32767, 3 }, { 32768, 4 }, { 1000000, 4 },
            { UINT64_MAX, 4 },
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            is_int(kvg_bucket_index(&b, cases[i].n), cases[i].idx, "default: %llu tokens -> bucket %u",
                   (unsigned long long)cases[i].n, cases[i].idx);
    }
    is_int(KVG_BUCKET_BYPASS, 0, "bypass is index 0");
    is_str(kvg_bucket_label(&b, 0), "bypass", "label 0");
    is_str(kvg_bucket_label(&b, 1), "128", "label 1");
    is_str(kvg_bucket_label(&b, 2), "1k", "label 2");
    is_str(kvg_bucket_label(&b, 3), "8k", "label 3");
    is_str(kvg_bucket_label(&b, 4), "32k", "label 4");
    is_str(kvg_bucket_label(&b, 5), "?", "label out of range");
    is_str(kvg_bucket_label(&b, 1000), "?", "label far out of range");

    ok(kvg_buckets_parse(&b, "100, 200\t1000\n1536 2048,1048576 3145728", err, sizeof err) == 0,
       "mixed separators parse");
    is_int(b.n_bounds, 7, "  7 boundaries");
    is_str(kvg_bucket_label(&b, 1), "100", "  label 100");
    is_str(kvg_bucket_label(&b, 3), "1000", "  1000 is not a multiple of 1024: plain number");
    is_str(kvg_bucket_label(&b, 4), "1536", "  1536 plain number");
    is_str(kvg_bucket_label(&b, 5), "2k", "  2048 -> 2k");
    is_str(kvg_bucket_label(&b, 6), "1m", "  1048576 -> 1m");
    is_str(kvg_bucket_label(&b, 7), "3m", "  3145728 -> 3m");
    is_int(kvg_bucket_index(&b, 99), 0, "  99 -> bypass");
    is_int(kvg_bucket_index(&b, 100), 1, "  100 -> 1");
    is_int(kvg_bucket_index(&b, 1999), 4, "  1999 -> 4 (1536..2047)");
    is_int(kvg_bucket_index(&b, 2048), 5, "  2048 -> 5");
    is_int(kvg_bucket_index(&b, 5000000), 7, "  5M -> last");

    ok(kvg_buckets_parse(&b, "1", err, sizeof err) == 0, "single boundary 1");
    is_int(kvg_bucket_index(&b, 0), 0, "  0 tokens bypass");
    is_int(kvg_bucket_index(&b, 1), 1, "  1 token cached");
    ok(kvg_buckets_parse(&b, "  64  ", err, sizeof err) == 0, "surrounding spaces");
    is_int(b.bound[0], 64, "  value 64");
    ok(kvg_buckets_parse(&b, "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16", err, sizeof err) == 0,
       "16 boundaries allowed");
    is_int(kvg_buckets_count(&b), 17, "  17 buckets");
    ok(kvg_buckets_parse(&b, "1000000000", err, sizeof err) == 0, "maximum value allowed");

    bad_spec(NULL, "none given");
    bad_spec("", "none given");
    bad_spec(" ,\t ", "none given");
    bad_spec("0 128", "'0' is out of range");
    bad_spec("128 64", "64 after 128 is not strictly increasing");
    bad_spec("128 128", "128 after 128");
    bad_spec("128 12a", "'12a' is not a positive integer");
    bad_spec("-5", "'-5' is not a positive integer");
    bad_spec("+5", "'+5' is not a positive integer");
    bad_spec("1.5", "'1.5' is not a positive integer");
    bad_spec("1e3", "'1e3' is not a positive integer");
    bad_spec("128;1024", "'128;1024' is not a positive integer");
    bad_spec("1000000001", "out of range");
    bad_spec("99999999999999999999999", "out of range");
    bad_spec("1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17", "more than 16");

    /* the gateway's buckets: the bypass threshold, then the bounds above it */
    {
        kvg_buckets w, given;
        char e[128];
        kvg_buckets_with_min(&w, 128, NULL);
        ok(w.n_bounds == 4 && w.bound[0] == 128 && w.bound[3] == 32768, "with_min 128: the defaults");
        kvg_buckets_with_min(&w, 256, NULL);
        ok(w.n_bounds == 4 && w.bound[0] == 256 && w.bound[1] == 1024, "with_min 256: 256 1k 8k 32k");
        is_str(kvg_bucket_label(&w, 1), "256", "  labelled 256");
        is_int(kvg_bucket_index(&w, 200), 0, "  200 tokens bypass");
        kvg_buckets_with_min(&w, 0, NULL);
        is_int(kvg_bucket_index(&w, 1), 1, "with_min 0: a 1-token prompt does not bypass");
        kvg_buckets_parse(&given, "64 512 4096", e, sizeof e);
        kvg_buckets_with_min(&w, 600, &given);
        ok(w.n_bounds == 2 && w.bound[0] == 600 && w.bound[1] == 4096, "with_min 600 over 64 512 4096: 600 4096");
        is_str(kvg_bucket_label(&w, 2), "4k", "  labels recomputed");
        kvg_buckets_with_min(&w, 4000000000u, NULL);
        ok(w.n_bounds == 1 && w.bound[0] == KVG_BUCKETS_MAX_VALUE, "a huge threshold is clamped");
    }
    return done_testing();
}
