/* Chat-template rendering benchmark driver (run by t/bench/chat_render, not a test).
 *
 *   chat_render_bench TEMPLATE.jinja CONVERSATION.json LABEL
 *
 * Compiles TEMPLATE once, then repeatedly does what a chat request costs:
 * kvg_chat_vars_build on the conversation's messages/tools/kwargs, and
 * kvg_jinja_render with add_generation_prompt. Prints
 *   RESULT <label> <microseconds per request> <output bytes> <reps> <us of it building variables>
 * where the time is process CPU time (robust to a busy machine), the median of
 * batches after a warm-up batch: the same measure t/bench/chat_render_ref.py
 * takes of Jinja2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "chat_vars.h"
#include "jinja.h"

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    if (!f || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        if (f)
            fclose(f);
        return NULL;
    }
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    return buf;
}

/* One request: variables built, template rendered (t NULL: the variables
 * only). Output length, or -1. */
static long one(const kvg_jinja *t, const json_t *conv, const json_t *trusted)
{
    json_t *data;
    kvg_jinja_output out;
    char err[512], param[128];
    long n;

    if (kvg_chat_vars_build(json_object_get(conv, "messages"), json_object_get(conv, "tools"),
                            json_object_get(conv, "chat_template_kwargs"), &data, err, sizeof err,
                            param, sizeof param) != KVG_CHAT_VARS_OK) {
        fprintf(stderr, "chat_render_bench: %s\n", err);
        return -1;
    }
    if (!t) {
        json_decref(data);
        return 0;
    }
    if (kvg_jinja_render(t, trusted, data, NULL, &out, err, sizeof err) != KVG_JINJA_OK) {
        fprintf(stderr, "chat_render_bench: %s\n", err);
        json_decref(data);
        return -1;
    }
    n = (long)out.len;
    kvg_jinja_output_free(&out);
    json_decref(data);
    return n;
}

/* Median CPU seconds per call of one(t, ...) over BATCHES batches of reps. */
static double measure(const kvg_jinja *t, const json_t *conv, const json_t *trusted, int reps)
{
    enum { BATCHES = 7 };
    double per[BATCHES];

    for (int b = 0; b < BATCHES; b++) {
        double t0 = cpu_now();
        for (int r = 0; r < reps; r++)
            one(t, conv, trusted);
        per[b] = (cpu_now() - t0) / reps;
    }
    qsort(per, BATCHES, sizeof per[0], cmp_double);
    return per[BATCHES / 2];
}

int main(int argc, char **argv)
{
    char err[512];
    size_t len;
    char *src;
    json_error_t je;
    json_t *conv, *trusted;
    kvg_jinja *t;
    long n_out = 0;
    int reps = 1;

    if (argc != 4) {
        fprintf(stderr, "usage: chat_render_bench TEMPLATE.jinja CONVERSATION.json LABEL\n");
        return 2;
    }
    if (!(src = read_file(argv[1], &len))) {
        fprintf(stderr, "chat_render_bench: cannot read %s\n", argv[1]);
        return 1;
    }
    if (!(conv = json_load_file(argv[2], 0, &je))) {
        fprintf(stderr, "chat_render_bench: %s: %s\n", argv[2], je.text);
        return 1;
    }
    if (!(t = kvg_jinja_compile(src, len, argv[1], err, sizeof err))) {
        fprintf(stderr, "chat_render_bench: %s\n", err);
        return 1;
    }
    trusted = json_pack("{s:s, s:s, s:b}", "bos_token", "<s>", "eos_token", "</s>",
                        "add_generation_prompt", 1);
    /* size a batch to ~50 ms of CPU (the warm-up), then measure */
    for (double t0 = cpu_now(); cpu_now() - t0 < 0.05; reps++)
        if ((n_out = one(t, conv, trusted)) < 0)
            return 1;
    double whole = measure(t, conv, trusted, reps), vars = measure(NULL, conv, trusted, reps);
    printf("RESULT %s %.2f %ld %d %.2f\n", argv[3], whole * 1e6, n_out, reps * 7, vars * 1e6);
    json_decref(trusted);
    json_decref(conv);
    kvg_jinja_free(t);
    free(src);
    return 0;
}
