/* Model load figures: load time, identity hashing speed, resident memory.
 *
 *   build/bench/model_load_bench [MODEL ...]     default: stories260K, synthetic:110M,
 *                                                synthetic:1B, and a 110M llama2.c file
 *                                                exported to /tmp (hashing speed, mmap RSS)
 * KVG_TOKENIZER=PATH supplies tokenizer_path for the models given as arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double rss_mb(void)
{
    long pages = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2)
            res = 0;
        fclose(f);
    }
    return (double)res * (double)sysconf(_SC_PAGESIZE) / 1048576.0;
}

typedef struct hash_prog {
    double start, end;
    uint64_t total;
} hash_prog;

static void on_progress(void *ctx, const char *what, uint64_t done, uint64_t total)
{
    hash_prog *h = ctx;
    (void)what;
    if (h->start == 0)
        h->start = now();
    if (done == total) {
        h->end = now();
        h->total = total;
    }
}

static void bench(const char *path, const char *tok, int repeat)
{
    char err[512];
    double best = 1e30, rss = 0, hash_s = 0;
    uint64_t hashed = 0;
    char id[17] = "";
    int dim = 0;
    for (int r = 0; r < repeat; r++) {
        hash_prog hp = { 0, 0, 0 };
        kvg_model_load_opts o = { 0 };
        o.tokenizer_path = tok;
        o.progress = on_progress;
        o.progress_ctx = &hp;
        double rss0 = rss_mb(), t0 = now();
        kvg_model *m = kvg_model_load(path, &o, err, sizeof err);
        double t = now() - t0;
        if (!m) {
            printf("%-28s ERROR %s\n", path, err);
            return;
        }
        if (t < best) {
            best = t;
            rss = rss_mb() - rss0;
            hashed = hp.total;
            /* Progress starts after the first 64 MiB; scale the measured span to all bytes. */
            hash_s = hp.end - hp.start;
        }
        snprintf(id, sizeof id, "%.16s", m->id_hex);
        dim = m->cfg.dim;
        kvg_model_free(m);
    }
    printf("%-28s dim %5d  load %8.3f s  RSS +%7.1f MB  hashed %8.1f MB", path, dim, best, rss,
           (double)hashed / 1e6);
    if (hashed > ((uint64_t)128 << 20) && hash_s > 0)
        printf("  (~%.0f MB/s)", (double)(hashed - ((uint64_t)64 << 20)) / 1e6 / hash_s);
    printf("  id %s...\n", id);
}

int main(int argc, char **argv)
{
    const char *shared = getenv("KVGATE_SHARED");
    char model[512], tok[512], err[512];
    if (!shared || !*shared)
        shared = "../shared";
    snprintf(model, sizeof model, "%s/models/stories260K/stories260K.bin", shared);
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", shared);
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            bench(argv[i], getenv("KVG_TOKENIZER"), 1);
        return 0;
    }
    bench(model, tok, 5);
    bench("synthetic:15M", NULL, 3);
    bench("synthetic:110M", NULL, 3);
    bench("synthetic:110M-bf16", NULL, 3);
    bench("synthetic:1B", NULL, 1);
    bench("synthetic:1B-bf16", NULL, 1);

    /* A real 440 MB file: hashing speed (warm page cache) and the mapped RSS. */
    char path[] = "/tmp/kvg-bench-110M-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return 1;
    close(fd);
    kvg_model *s = kvg_model_load("synthetic:110M", NULL, err, sizeof err);
    if (s && kvg_model_export_llama2c(s, path, err, sizeof err) == 0) {
        kvg_model_free(s);
        bench(path, tok, 3);
    } else {
        printf("export failed: %s\n", err);
        kvg_model_free(s);
    }
    unlink(path);
    return 0;
}
