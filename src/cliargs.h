/* Command-line helpers shared by the kvgate commands (kvgate-engine, kvgate-cli,
 * kvgate-generate): strict parsing of numbers, sizes and id lists, whole files, and
 * the one way a usage error is reported. */
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

#endif
