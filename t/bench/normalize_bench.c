/* Normalizer throughput on 1 MiB inputs: all steps, each step alone, and utf8proc's
 * own NFC for comparison. Figures only (median of 9 runs of thread CPU time, so
 * that other processes on a shared machine skew them less), never a pass/fail.
 *   build/bench/normalize_bench            (run from the repository root: reads ../shared/seeds)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "normalize.h"
#include "normalize_testing.h"

#define SIZE (1u << 20)
#define RUNS 9

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Repeats src to SIZE bytes, cut back to a character boundary. */
static char *fill(const char *src, size_t len, size_t *out_len)
{
    char *buf = malloc(SIZE);
    size_t n = 0;

    while (n + len <= SIZE) {
        memcpy(buf + n, src, len);
        n += len;
    }
    memcpy(buf + n, src, SIZE - n);
    n = SIZE;
    while (n > 0 && ((unsigned char)buf[n - 1] & 0xC0) == 0x80)
        n--;
    if (n > 0 && (unsigned char)buf[n - 1] >= 0xC0)
        n--;
    *out_len = n;
    return buf;
}

static char *load_seed(const char *name, size_t *len)
{
    const char *dir = getenv("KVGATE_SHARED");
    char path[512];
    FILE *f;
    char *buf;
    long n;

    snprintf(path, sizeof(path), "%s/seeds/%s", dir && *dir ? dir : "../shared", name);
    f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static double bench(unsigned flags, const char *in, size_t len, size_t *out_len)
{
    double t[RUNS];
    size_t cap = kvg_normalize_bound(flags, in, len);
    char *out = malloc(cap), err[200];

    for (int r = 0; r < RUNS; r++) {
        double t0 = now();
        if (kvg_normalize_into(flags, in, len, out, cap, out_len, err, sizeof(err)) < 0) {
            fprintf(stderr, "normalize failed: %s\n", err);
            exit(1);
        }
        t[r] = now() - t0;
    }
    free(out);
    qsort(t, RUNS, sizeof(double), cmp_d);
    return (double)len / t[RUNS / 2] / 1e6;
}

static double bench_utf8proc(const char *in, size_t len)
{
    double t[RUNS];

    for (int r = 0; r < RUNS; r++) {
        utf8proc_uint8_t *d;
        double t0 = now();
        utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)len,
                                          &d, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        t[r] = now() - t0;
        if (n < 0)
            exit(1);
        free(d);
    }
    qsort(t, RUNS, sizeof(double), cmp_d);
    return (double)len / t[RUNS / 2] / 1e6;
}

static void report(const char *label, const char *in, size_t len)
{
    static const unsigned one[] = { KVG_NORM_NFC, KVG_NORM_NEWLINES, KVG_NORM_JUNK,
                                    KVG_NORM_SPACES, KVG_NORM_TRAILING, KVG_NORM_BLANK_LINES };
    size_t out_len;
    double all = bench(KVG_NORM_ALL, in, len, &out_len);

    printf("%-34s %8zu B  all steps %7.0f MB/s (-> %zu B)\n", label, len, all, out_len);
    printf("    each step alone:");
    for (size_t i = 0; i < sizeof(one) / sizeof(one[0]); i++)
        printf(" %s %.0f", kvg_normalize_step_name(one[i]), bench(one[i], in, len, &out_len));
    printf(" MB/s\n    utf8proc_map NFC (reference): %.0f MB/s\n", bench_utf8proc(in, len));
}

int main(void)
{
    static const char dirty[] =
        "Title  \r\n=======\r\n\r\n\r\n\r\nSome\t\ttext with  spaces \t \r\n"
        "Cafe\xCC\x81 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xE2\x84\xAB ;;;;;;;;\r\n"
        "----------------------------------------\r\n"
        "A plain line of English prose, long enough to look like a prompt.\r\n";
    static const char prose[] =
        "Prompt caching stores the attention keys and values computed for a prefix, so a\n"
        "later request that starts with the same tokens skips that part of the prefill.\n"
        "It pays off for long system prompts, documents asked about several times, and\n"
        "chat histories that grow by one turn at a time; it does nothing for short,\n"
        "one-off prompts, which is why requests under a size threshold bypass it.\n\n";
    const char *names[] = { "000_a663fbc54f849fc4.txt", "003_58395e4441d178e7.txt" };
    const char *labels[] = { "seed 000 (zh+en, 42% ASCII)", "seed 003 (zh+en, 18% ASCII)" };
    size_t len;
    char *in;

    for (int i = 0; i < 2; i++) {
        size_t sl;
        char *seed = load_seed(names[i], &sl);
        if (!seed) {
            printf("%s: not found under ../shared/seeds (set KVGATE_SHARED)\n", names[i]);
            continue;
        }
        in = fill(seed, sl, &len);
        report(labels[i], in, len);
        free(in);
        free(seed);
    }
    in = fill(prose, sizeof(prose) - 1, &len);
    report("clean English prose", in, len);
    free(in);
    in = fill(dirty, sizeof(dirty) - 1, &len);
    report("synthetic dirty text (CRLF, junk)", in, len);
    free(in);
    return 0;
}
