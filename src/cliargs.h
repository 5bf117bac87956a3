/* Command-line helpers shared by the kvgate commands (kvgate-engine, kvgate-cli,
 * kvgate-generate, kvgate-gpu-check): strict parsing of numbers, sizes and id lists,
 * whole files, the one way a usage error is reported, and a table-driven walk over a
 * command's options. */
#ifndef KVG_CLIARGS_H
#define KVG_CLIARGS_H

#include <stddef.h>
#include <stdint.h>

/* A decimal integer in [lo, hi], the whole string. 0, or -1. */
int kvg_arg_long(const char *s, long lo, long hi, long *out);
/* A finite number in [lo, hi], the whole string. 0, or -1. */
int kvg_arg_double(const char *s, double lo, double hi, double *out);
/* A size: "65536", "64K", "512M", "1.5G", "2T" (binary units; "MiB", "MB" accepted). */
int kvg_arg_size(const char *s, uint64_t *out);
/* Non-negative ids separated by whitespace or commas ("1 2 3", "1,2,3"); *ids is
 * malloc'd (free it even on error). 0 (maybe with *n == 0), or -1 when malformed. */
int kvg_arg_ids(const char *s, int32_t **ids, size_t *n);
/* 1..max integers in [lo, hi] in kvg_arg_ids' syntax, into out[]; *n their count. 0, or -1. */
int kvg_arg_int_list(const char *s, int lo, int hi, int *out, int max, int *n);
/* A whole file, NUL-terminated (*len excludes the NUL); NULL with errno set. */
char *kvg_read_file(const char *path, size_t *len);
/* Prints "PROG: message\n(see PROG --help)\n" to stderr; returns 2, the usage exit status. */
int kvg_usage_error(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A command's options as a table, for kvg_args_parse: each "--name VALUE" (or "--name"
 * flag) with where its value goes and the usage error for a bad one. */
typedef enum kvg_opt_kind {
    KVG_OPT_FLAG,                /* no value: *(int *)dst = 1 */
    KVG_OPT_STR,                 /* *(const char **)dst = the value */
    KVG_OPT_LONG,                /* *(long *)dst: an integer in [lo, hi] (kvg_arg_long) */
    KVG_OPT_INT,                 /* *(int *)dst: likewise */
    KVG_OPT_FLOAT,               /* *(float *)dst: a number within +-1e30 (kvg_arg_double)
                                    whose float is in [lo, hi] */
    KVG_OPT_DOUBLE,              /* *(double *)dst: a number in [lo, hi] (kvg_arg_double) */
    KVG_OPT_ON_OFF,              /* *(int *)dst = 1 for "on", 0 for "off" */
    KVG_OPT_CUSTOM               /* parse(value, dst, msg, msg_len) */
} kvg_opt_kind;

typedef struct kvg_opt {
    const char *name;            /* "--model" */
    kvg_opt_kind kind;
    void *dst;
    double lo, hi;               /* LONG, INT, FLOAT, DOUBLE (integers exactly) */
    const char *bad;             /* the usage error for a bad value: a format of one %s,
                                    the value */
    /* CUSTOM: 0, or -1 for a bad value, with the usage error in msg, or msg left empty
     * for `bad`. */
    int (*parse)(const char *v, void *dst, char *msg, size_t msg_len);
} kvg_opt;

/* Parses argv[1..] against opts[0..n_opts), in order: "--help" or "-h" prints `usage`
 * on stdout and exits 0; a FLAG is set; any other argument must start with "--"
 * ("unexpected argument 'A'"), have a value after it ("A needs a value") and be in
 * opts ("unknown option 'A'"), and its value must parse (`bad`). 0, or 2 (the usage
 * exit status) after reporting the first error through kvg_usage_error(prog, ...). */
int kvg_args_parse(const char *prog, const char *usage, int argc, char **argv, const kvg_opt *opts,
                   size_t n_opts);

#endif
