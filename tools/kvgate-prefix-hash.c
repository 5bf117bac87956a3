/* kvgate-prefix-hash: prints the prefix-hash chain of a token id sequence, so the
 * format (docs/prefix-hash.md) can be checked from outside, e.g. by a router.
 *
 *   kvgate-prefix-hash --model-id ID (--tenant T | --default-tenant NAME) [--block-size N] < ids
 *
 * --tenant is a tenant named by a request (kvgate_tenant); --default-tenant the tenant
 * a location falls back to (kvgate_default_tenant), whose salt is a 0x00 mark and then
 * the name, a namespace no request can name (prefix_hash.h).
 *
 * stdin: decimal token ids (0..2147483647) separated by any whitespace. stdout: the
 * root, then one hash per full block, 64 lower-case hex digits a line. Any error
 * (bad option, bad block size, bad id) exits 1 with a one-line message on stderr. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prefix_hash.h"

static const char *prog = "kvgate-prefix-hash";

static void usage(FILE *f)
{
    fprintf(f, "usage: %s --model-id ID (--tenant T | --default-tenant NAME) [--block-size N] < token-ids\n"
               "  prints the root and one SHA-256 per full block of N token ids (default %d)\n"
               "  --tenant T: a tenant named by the request (kvgate_tenant)\n"
               "  --default-tenant NAME: the location's default tenant (kvgate_default_tenant)\n",
            prog, KVG_PREFIX_BLOCK_DEFAULT);
}

static void die(const char *fmt, const char *arg)
    __attribute__((format(printf, 1, 0), noreturn));

static void die(const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    exit(1);
}

/* Strict decimal: digits only, no sign, no spaces, within max. */
static int parse_uint(const char *s, unsigned long long max, unsigned long long *v)
{
    unsigned long long x = 0;

    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        if (x > (max - (unsigned long long)(*s - '0')) / 10)
            return -1;
        x = x * 10 + (unsigned long long)(*s - '0');
    }
    *v = x;
    return 0;
}

/* "--name value" or "--name=value": returns the value and advances *i, or NULL. */
static const char *opt_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);

    if (strncmp(argv[*i], name, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != '\0')
        return NULL;
    if (*i + 1 >= argc)
        die("%s needs a value", name);
    return argv[++*i];
}

static int32_t *read_ids(size_t *n)
{
    size_t cap = 1024, count = 0, len = 0;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    char tok[32];
    int c;

    if (!ids)
        die("%s", "out of memory");
    do {
        c = getchar();
        if (c == EOF || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
            unsigned long long v;
            if (len == 0)
                continue;
            tok[len] = '\0';
            if (parse_uint(tok, INT32_MAX, &v) < 0) {
                char msg[96];
                snprintf(msg, sizeof(msg), "token id #%zu '%s' is not an integer in 0..2147483647",
                         count + 1, tok);
                die("%s", msg);
            }
            if (count == cap) {
                int32_t *p = realloc(ids, 2 * cap * sizeof(int32_t));
                if (!p)
                    die("%s", "out of memory");
                ids = p;
                cap *= 2;
            }
            ids[count++] = (int32_t)v;
            len = 0;
        } else if (len < sizeof(tok) - 1) {
            tok[len++] = (char)c;
        } else {
            tok[len] = '\0';
            die("token id '%s...' is too long", tok);
        }
    } while (c != EOF);
    if (ferror(stdin))
        die("reading stdin: %s", strerror(errno));
    *n = count;
    return ids;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *tenant = NULL, *def = NULL, *v;
    uint8_t salt[KVG_PREFIX_BLOCK_MAX];
    size_t salt_len = 0;
    unsigned long long bs = KVG_PREFIX_BLOCK_DEFAULT;
    char err[256], hex[2 * KVG_PREFIX_HASH_LEN + 1];
    uint8_t root[KVG_PREFIX_HASH_LEN], (*out)[KVG_PREFIX_HASH_LEN];
    kvg_prefix_hasher *h;
    int32_t *ids;
    size_t n, nb;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if ((v = opt_value(argc, argv, &i, "--model-id"))) {
            model = v;
        } else if ((v = opt_value(argc, argv, &i, "--tenant"))) {
            tenant = v;
        } else if ((v = opt_value(argc, argv, &i, "--default-tenant"))) {
            def = v;
        } else if ((v = opt_value(argc, argv, &i, "--block-size"))) {
            if (parse_uint(v, KVG_PREFIX_BLOCK_MAX, &bs) < 0 || bs < KVG_PREFIX_BLOCK_MIN)
                die("bad --block-size '%s' (expected an integer in 1..65536)", v);
        } else {
            usage(stderr);
            die("unknown argument '%s'", argv[i]);
        }
    }
    if (!model || (!tenant == !def)) {
        usage(stderr);
        die("%s", "--model-id and one of --tenant and --default-tenant are required (the tenant may be "
            "empty: --tenant '')");
    }
    if (tenant) {
        salt_len = strlen(tenant);
        if (salt_len > sizeof salt)
            die("%s", "--tenant is too long");
        memcpy(salt, tenant, salt_len);
    } else {
        salt_len = kvg_prefix_default_salt(def, strlen(def), salt, sizeof salt);
        if (salt_len == 0)
            die("%s", "--default-tenant is too long");
    }
    ids = read_ids(&n);
    h = kvg_prefix_hasher_new(err, sizeof(err));
    if (!h)
        die("%s", err);
    out = malloc((n / bs + 1) * KVG_PREFIX_HASH_LEN);
    if (!out)
        die("%s", "out of memory");
    if (kvg_prefix_root(h, model, strlen(model), salt, salt_len, root, err, sizeof(err)) < 0
        || kvg_prefix_chain(h, root, ids, n, (size_t)bs, out, n / bs + 1, &nb, err, sizeof(err)) < 0)
        die("%s", err);
    printf("%s\n", kvg_prefix_hex(root, hex));
    for (size_t b = 0; b < nb; b++)
        printf("%s\n", kvg_prefix_hex(out[b], hex));
    kvg_prefix_hasher_free(h);
    free(out);
    free(ids);
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}
