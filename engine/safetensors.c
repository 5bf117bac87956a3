/* safetensors header parsing with full bounds checks (see safetensors.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "safetensors.h"
#include "errmsg.h"

/* Real headers are a few hundred KiB at most; the format's own limit is 100 MB. */
#define MAX_HEADER ((uint64_t)100 << 20)

struct kvg_safetensors {
    kvg_st_tensor *t;
    size_t n;
};

/* Bytes per element of a safetensors dtype name, 0 when unknown. */
static size_t dtype_size(const char *d)
{
    static const struct { const char *n; size_t s; } tab[] = {
        { "BOOL", 1 }, { "U8", 1 }, { "I8", 1 }, { "F8_E4M3", 1 }, { "F8_E5M2", 1 },
        { "I16", 2 }, { "U16", 2 }, { "F16", 2 }, { "BF16", 2 },
        { "I32", 4 }, { "U32", 4 }, { "F32", 4 },
        { "I64", 8 }, { "U64", 8 }, { "F64", 8 },
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcmp(tab[i].n, d) == 0)
            return tab[i].s;
    return 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const kvg_st_tensor *)a)->name, ((const kvg_st_tensor *)b)->name);
}

void kvg_st_free(kvg_safetensors *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n; i++)
        free(st->t[i].name);
    free(st->t);
    free(st);
}

/* A JSON integer that is a non-negative int64. */
static int get_u(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

kvg_safetensors *kvg_st_parse(const void *data, size_t len, const char *name, char *err, size_t err_len)
{
    const unsigned char *p = data;
    json_error_t je;
    uint64_t hl = 0;

    if (len < 8)
        return kvg_fail(err, err_len, name, "truncated safetensors file: %zu bytes, no header length", len), NULL;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | p[i];
    if (hl < 2 || hl > MAX_HEADER || hl > len - 8)
        return kvg_fail(err, err_len, name, "bad safetensors header length %llu (file has %zu bytes)",
                    (unsigned long long)hl, len), NULL;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hl, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kvg_fail(err, err_len, name, "bad safetensors header JSON: %s (at byte %d)", je.text, je.position), NULL;
    kvg_safetensors *st = calloc(1, sizeof *st);
    if (!json_is_object(root) || !st) {
        json_decref(root);
        free(st);
        return kvg_fail(err, err_len, name, "%s", st ? "safetensors header is not a JSON object" : "out of memory"), NULL;
    }
    size_t cap = json_object_size(root);
    st->t = calloc(cap ? cap : 1, sizeof *st->t);
    if (!st->t) {
        json_decref(root);
        kvg_st_free(st);
        return kvg_fail(err, err_len, name, "out of memory"), NULL;
    }
    const unsigned char *base = p + 8 + hl;
    uint64_t avail = len - 8 - hl;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
               *offs = json_object_get(v, "data_offsets");
        if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs)
            || json_array_size(offs) != 2) {
            kvg_fail(err, err_len, name, "tensor %s: entry needs dtype, shape and data_offsets [begin, end]", key);
            goto bad;
        }
        kvg_st_tensor *t = &st->t[st->n];
        if (json_string_length(dt) >= sizeof t->dtype) {
            kvg_fail(err, err_len, name, "tensor %s: bad dtype", key);
            goto bad;
        }
        snprintf(t->dtype, sizeof t->dtype, "%s", json_string_value(dt));
        if (json_array_size(shape) > KVG_ST_MAX_DIMS) {
            kvg_fail(err, err_len, name, "tensor %s: %zu dimensions (at most %d)", key, json_array_size(shape),
                 KVG_ST_MAX_DIMS);
            goto bad;
        }
        t->n_dims = (int)json_array_size(shape);
        uint64_t n_elem = 1, b, e;
        for (int d = 0; d < t->n_dims; d++) {
            uint64_t x;
            if (get_u(json_array_get(shape, (size_t)d), &x) < 0 || x > (uint64_t)INT64_MAX) {
                kvg_fail(err, err_len, name, "tensor %s: bad shape", key);
                goto bad;
            }
            if (x && n_elem > UINT64_MAX / 16 / x) {
                kvg_fail(err, err_len, name, "tensor %s: shape too large", key);
                goto bad;
            }
            t->shape[d] = (int64_t)x;
            n_elem *= x;
        }
        if (get_u(json_array_get(offs, 0), &b) < 0 || get_u(json_array_get(offs, 1), &e) < 0 || b > e) {
            kvg_fail(err, err_len, name, "tensor %s: bad data_offsets", key);
            goto bad;
        }
        if (e > avail) {
            kvg_fail(err, err_len, name, "truncated safetensors file: tensor %s needs data bytes [%llu, %llu) but only "
                 "%llu follow the header", key, (unsigned long long)b, (unsigned long long)e,
                 (unsigned long long)avail);
            goto bad;
        }
        size_t es = dtype_size(t->dtype);
        if (es && e - b != n_elem * es) {
            kvg_fail(err, err_len, name, "tensor %s: data_offsets [%llu, %llu) hold %llu bytes but dtype %s and its "
                 "shape need %llu", key, (unsigned long long)b, (unsigned long long)e,
                 (unsigned long long)(e - b), t->dtype, (unsigned long long)(n_elem * es));
            goto bad;
        }
        t->name = strdup(key);
        if (!t->name) {
            kvg_fail(err, err_len, name, "out of memory");
            goto bad;
        }
        t->data = base + b;
        t->n_bytes = (size_t)(e - b);
        st->n++;
    }
    json_decref(root);
    qsort(st->t, st->n, sizeof *st->t, cmp_name);
    return st;
bad:
    json_decref(root);
    kvg_st_free(st);
    return NULL;
}

const kvg_st_tensor *kvg_st_find(const kvg_safetensors *st, const char *name)
{
    kvg_st_tensor key;
    key.name = (char *)name;
    return bsearch(&key, st->t, st->n, sizeof *st->t, cmp_name);
}
