/* Renders a template with kvg_jinja for t/tools/jinja_cmp.py:
 *   jinja_render TEMPLATE CONTEXT.json [ITERATIONS]
 * Not built by the Makefile; after `make build/libkvgate.a`:
 *   gcc -std=gnu11 -O2 -Isrc t/tools/jinja_render.c build/libkvgate.a \
 *       -ljansson -lutf8proc -lpcre2-8 -lcrypto -lm -o /tmp/jr
 * CONTEXT.json is {"trusted": {...}, "data": {...}, "now": SECONDS}. Prints the
 * output; exits 0 (ok), 1 (raised), 2 (error), 3 (limit), 4 (compile error), the
 * message on stderr. With ITERATIONS, prints the mean render time instead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja.h"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

int main(int argc, char **argv)
{
    size_t len;
    char err[1024];
    char *src;
    json_error_t jerr;
    json_t *ctx;
    kvg_jinja *t;
    kvg_jinja_output out;
    kvg_jinja_limits lim = { 0 };
    int rc = 0;

    if (argc < 3 || !(src = slurp(argv[1], &len))) {
        fprintf(stderr, "usage: jinja_render TEMPLATE CONTEXT.json [ITERATIONS]\n");
        return 9;
    }
    ctx = json_load_file(argv[2], 0, &jerr);
    if (!ctx) {
        fprintf(stderr, "%s: %s\n", argv[2], jerr.text);
        return 9;
    }
    t = kvg_jinja_compile(src, len, argv[1], err, sizeof err);
    if (!t) {
        fprintf(stderr, "%s\n", err);
        json_decref(ctx);
        free(src);
        return 4;
    }
    lim.now = (time_t)json_integer_value(json_object_get(ctx, "now"));
    if (argc > 3) {
        int iters = atoi(argv[3]);
        /* CPU time: the machine may be shared, wall time then says little */
        struct timespec a, b;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
        for (int i = 0; i < iters; i++) {
            rc = kvg_jinja_render(t, json_object_get(ctx, "trusted"), json_object_get(ctx, "data"),
                                  &lim, &out, err, sizeof err);
            kvg_jinja_output_free(&out);
        }
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
        printf("%.2f us/render, CPU time (rc %d)\n",
               ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e3 / iters, rc);
        kvg_jinja_free(t);
        json_decref(ctx);
        free(src);
        return 0;
    }
    rc = kvg_jinja_render(t, json_object_get(ctx, "trusted"), json_object_get(ctx, "data"), &lim,
                          &out, err, sizeof err);
    if (rc) {
        fprintf(stderr, "%s\n", err);
        kvg_jinja_free(t);
        json_decref(ctx);
        free(src);
        return rc;
    }
    fwrite(out.text, 1, out.len, stdout);
    if (getenv("JINJA_SPANS")) {
        FILE *f = fopen(getenv("JINJA_SPANS"), "w");
        for (size_t i = 0; f && i < out.n_spans; i++)
            fprintf(f, "%zu %zu\n", out.spans[i].off, out.spans[i].len);
        if (f)
            fclose(f);
    }
    kvg_jinja_output_free(&out);
    kvg_jinja_free(t);
    json_decref(ctx);
    free(src);
    return 0;
}
