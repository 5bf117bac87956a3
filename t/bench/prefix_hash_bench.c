/* Prefix-hash cost: a 32k-token prompt (2048 blocks of 16), as kvg_prefix_chain()
 * does it, next to one-shot SHA256() per block (which re-fetches the algorithm in
 * OpenSSL 3) for comparison. Figures only: median of 15 runs of thread CPU time. */
#include <openssl/sha.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "prefix_hash.h"

#define N_TOKENS 32768
#define RUNS 15

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

static double median(double *t)
{
    qsort(t, RUNS, sizeof(double), cmp_d);
    return t[RUNS / 2];
}

int main(void)
{
    static int32_t ids[N_TOKENS];
    static uint8_t out[N_TOKENS][KVG_PREFIX_HASH_LEN];
    static const size_t sizes[] = { 16, 64, 256 };
    uint8_t root[KVG_PREFIX_HASH_LEN];
    char err[256];
    double t[RUNS];
    kvg_prefix_hasher *h = kvg_prefix_hasher_new(err, sizeof(err));
    size_t nb = 0;

    if (!h) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    for (int i = 0; i < N_TOKENS; i++)
        ids[i] = (int32_t)((i * 2654435761u) % 128000);
    kvg_prefix_root(h, "llama-3-8b", 10, "tenant", 6, root, err, sizeof(err));

    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t bs = sizes[s];
        for (int r = 0; r < RUNS; r++) {
            double t0 = now();
            if (kvg_prefix_chain(h, root, ids, N_TOKENS, bs, out, N_TOKENS, &nb, err, sizeof(err)) < 0) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            t[r] = now() - t0;
        }
        double m = median(t);
        printf("kvg_prefix_chain, block %3zu: %5zu blocks, %7.1f us per 32k tokens, %6.0f ns per block\n",
               bs, nb, m * 1e6, m * 1e9 / (double)nb);
    }

    /* the same 16-token chain with one-shot SHA256() per block */
    for (int r = 0; r < RUNS; r++) {
        uint8_t buf[32 + 64], prev[32];
        double t0 = now();
        memcpy(prev, root, 32);
        for (size_t b = 0; b < N_TOKENS / 16; b++) {
            memcpy(buf, prev, 32);
            memcpy(buf + 32, ids + 16 * b, 64);     /* little-endian host */
            SHA256(buf, sizeof(buf), prev);
        }
        t[r] = now() - t0;
    }
    {
        double m = median(t);
        printf("one-shot SHA256() per block 16:  %5d blocks, %7.1f us per 32k tokens, %6.0f ns per block\n",
               N_TOKENS / 16, m * 1e6, m * 1e9 / (N_TOKENS / 16));
    }
    {
        int32_t blk[16];
        uint8_t cur[KVG_PREFIX_HASH_LEN];
        memcpy(blk, ids, sizeof(blk));
        for (int r = 0; r < RUNS; r++) {
            double t0 = now();
            memcpy(cur, root, sizeof(cur));
            for (int i = 0; i < 2048; i++)
                kvg_prefix_next(h, cur, blk, 16, cur, err, sizeof(err));
            t[r] = now() - t0;
        }
        printf("kvg_prefix_next, block 16:        one block every %.0f ns (engine extending a chain)\n",
               median(t) * 1e9 / 2048);
    }
    kvg_prefix_hasher_free(h);
    return 0;
}
