#include "gguf.h"
#include "gguf_testing.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Open addressing over names: slot holds an index or -1. */
typedef struct name_index {
    int32_t *slots;
    size_t mask;
} name_index;

struct kvg_gguf {
    const unsigned char *data;
    size_t len;
    void *map;                   /* set when kvg_gguf_open mapped the file */
    size_t map_len;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    kvg_gguf_kv *kv;
    size_t n_kv;
    kvg_gguf_tensor *tensors;
    size_t n_tensors;
    name_index kv_index, tensor_index;
};

/* Bounds-checked little-endian cursor over the file. */
typedef struct rd {
    const unsigned char *p;
    size_t len, off;
    const char *name;
    char *err;
    size_t err_len;
} rd;

__attribute__((format(printf, 2, 3)))
static int fail(rd *r, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (!r->err || r->err_len == 0)
        return -1;
    n = snprintf(r->err, r->err_len, "%s: ", r->name);
    if (n < 0 || (size_t)n >= r->err_len)
        return -1;
    va_start(ap, fmt);
    vsnprintf(r->err + n, r->err_len - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static size_t left(const rd *r)
{
    return r->len - r->off;
}

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static int rd_uint(rd *r, int n, uint64_t *v, const char *what)
{
    *v = 0;
    if (left(r) < (size_t)n)
        return fail(r, "truncated GGUF: file ends at offset %zu while reading %s", r->len, what);
    *v = le(r->p + r->off, n);
    r->off += (size_t)n;
    return 0;
}

static int rd_str(rd *r, kvg_gguf_str *s, const char *what)
{
    uint64_t n;
    if (rd_uint(r, 8, &n, what) < 0)
        return -1;
    if (n > left(r))
        return fail(r, "bad GGUF: %s at offset %zu has length %llu but only %zu bytes remain",
                    what, r->off - 8, (unsigned long long)n, left(r));
    s->s = (const char *)r->p + r->off;
    s->len = (size_t)n;
    r->off += (size_t)n;
    return 0;
}

/* Byte size of a fixed-size value type, 0 for STRING/ARRAY, -1 for unknown. */
static int type_size(uint32_t t)
{
    switch (t) {
    case KVG_GGUF_U8: case KVG_GGUF_I8: case KVG_GGUF_BOOL: return 1;
    case KVG_GGUF_U16: case KVG_GGUF_I16: return 2;
    case KVG_GGUF_U32: case KVG_GGUF_I32: case KVG_GGUF_F32: return 4;
    case KVG_GGUF_U64: case KVG_GGUF_I64: case KVG_GGUF_F64: return 8;
    case KVG_GGUF_STRING: case KVG_GGUF_ARRAY: return 0;
    default: return -1;
    }
}

static int is_signed(uint32_t t)
{
    return t == KVG_GGUF_I8 || t == KVG_GGUF_I16 || t == KVG_GGUF_I32 || t == KVG_GGUF_I64;
}

static int is_unsigned(uint32_t t)
{
    return t == KVG_GGUF_U8 || t == KVG_GGUF_U16 || t == KVG_GGUF_U32 || t == KVG_GGUF_U64;
}

static int64_t sign_extend(uint64_t v, int bytes)
{
    if (bytes == 8)
        return (int64_t)v;
    uint64_t m = 1ULL << (bytes * 8 - 1);
    return (int64_t)((v ^ m) - m);
}

static double to_float(uint64_t bits, int bytes)
{
    if (bytes == 4) {
        uint32_t b = (uint32_t)bits;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    double d;
    memcpy(&d, &bits, 8);
    return d;
}

/* ggml tensor types: elements per block and bytes per block. */
static const struct {
    const char *name;
    uint32_t blck, size;
} ggml_types[] = {
    [0] = {"F32", 1, 4},        [1] = {"F16", 1, 2},        [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},     [6] = {"Q5_0", 32, 22},     [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},     [9] = {"Q8_1", 32, 36},     [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},  [12] = {"Q4_K", 256, 144},  [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},  [15] = {"Q8_K", 256, 292},  [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74}, [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},  [21] = {"IQ3_S", 256, 110}, [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},       [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},       [27] = {"I64", 1, 8},       [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},  [30] = {"BF16", 1, 2},      [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},  [39] = {"MXFP4", 32, 17},
};

const char *kvg_gguf_ggml_type_name(uint32_t t)
{
    return t < sizeof ggml_types / sizeof ggml_types[0] ? ggml_types[t].name : NULL;
}

static char *dup_str(kvg_gguf_str s)
{
    char *d = malloc(s.len + 1);
    if (d) {
        memcpy(d, s.s, s.len);
        d[s.len] = '\0';
    }
    return d;
}

static int parse_value(rd *r, kvg_gguf_kv *kv, size_t idx)
{
    uint64_t v;
    int sz = type_size(kv->type);

    if (sz < 0)
        return fail(r, "bad GGUF: key '%s' (#%zu) has unknown value type %u", kv->key, idx, kv->type);
    if (kv->type == KVG_GGUF_STRING)
        return rd_str(r, &kv->v.str, "a string value");
    if (kv->type != KVG_GGUF_ARRAY) {
        if (rd_uint(r, sz, &v, "a metadata value") < 0)
            return -1;
        if (is_signed(kv->type))
            kv->v.i = sign_extend(v, sz);
        else if (kv->type == KVG_GGUF_F32 || kv->type == KVG_GGUF_F64)
            kv->v.f = to_float(v, sz);
        else
            kv->v.u = v;
        return 0;
    }

    uint64_t at, n;
    if (rd_uint(r, 4, &at, "an array type") < 0 || rd_uint(r, 8, &n, "an array length") < 0)
        return -1;
    kv->arr_type = (uint32_t)at;
    kv->arr_n = n;
    int esz = type_size(kv->arr_type);
    if (esz < 0 || kv->arr_type == KVG_GGUF_ARRAY || at > UINT32_MAX)
        return fail(r, "bad GGUF: array '%s' has unsupported element type %llu",
                    kv->key, (unsigned long long)at);
    kv->arr_data = r->p + r->off;
    if (esz > 0) {
        if (n > left(r) / (size_t)esz)
            return fail(r, "bad GGUF: array '%s' claims %llu elements of %d bytes but only %zu bytes remain",
                        kv->key, (unsigned long long)n, esz, left(r));
        r->off += (size_t)n * (size_t)esz;
        return 0;
    }
    /* Strings: every element takes at least its 8-byte length, which bounds the
     * offset table before it is allocated. */
    if (n > left(r) / 8)
        return fail(r, "bad GGUF: string array '%s' claims %llu elements but only %zu bytes remain",
                    kv->key, (unsigned long long)n, left(r));
    uint64_t *off = malloc((size_t)(n ? n : 1) * sizeof *off);
    if (!off)
        return fail(r, "out of memory for string array '%s'", kv->key);
    kv->arr_str_off = off;
    size_t base = r->off;
    for (uint64_t i = 0; i < n; i++) {
        kvg_gguf_str s;
        off[i] = r->off - base;
        if (rd_str(r, &s, "a string array element") < 0)
            return -1;
    }
    return 0;
}

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static int index_init(name_index *ix, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2)
        cap <<= 1;
    ix->slots = malloc(cap * sizeof *ix->slots);
    if (!ix->slots)
        return -1;
    memset(ix->slots, 0xff, cap * sizeof *ix->slots);
    ix->mask = cap - 1;
    return 0;
}

/* Finds `name`; names(i) gives the name of entry i. With insert >= 0 adds entry
 * `insert` when absent. Returns the index found, or -1. */
static int32_t index_probe(const name_index *ix, const char *name, const char *(*names)(const kvg_gguf *, int32_t),
                           const kvg_gguf *g, int32_t insert)
{
    size_t h;

    if (!ix->slots)
        return -1;
    h = (size_t)hash_name(name) & ix->mask;
    while (ix->slots[h] >= 0) {
        if (strcmp(names(g, ix->slots[h]), name) == 0)
            return ix->slots[h];
        h = (h + 1) & ix->mask;
    }
    if (insert >= 0)
        ix->slots[h] = insert;
    return -1;
}

static const char *kv_name(const kvg_gguf *g, int32_t i)
{
    return g->kv[i].key;
}

static const char *tensor_name(const kvg_gguf *g, int32_t i)
{
    return g->tensors[i].name;
}

static int parse_tensor(rd *r, kvg_gguf_tensor *t, size_t idx)
{
    kvg_gguf_str name;
    uint64_t v;

    if (rd_str(r, &name, "a tensor name") < 0)
        return -1;
    if (!(t->name = dup_str(name)))
        return fail(r, "out of memory");
    if (rd_uint(r, 4, &v, "tensor dimensions") < 0)
        return -1;
    if (v > KVG_GGUF_MAX_DIMS)
        return fail(r, "bad GGUF: tensor '%s' (#%zu) has %llu dimensions (at most %d)",
                    t->name, idx, (unsigned long long)v, KVG_GGUF_MAX_DIMS);
    t->n_dims = (uint32_t)v;
    for (int d = 0; d < KVG_GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    uint64_t n_elem = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (rd_uint(r, 8, &t->ne[d], "a tensor dimension") < 0)
            return -1;
        if (t->ne[d] > (uint64_t)INT64_MAX || (t->ne[d] && n_elem > (uint64_t)INT64_MAX / t->ne[d]))
            return fail(r, "bad GGUF: tensor '%s' has an impossible shape", t->name);
        n_elem *= t->ne[d];
    }
    if (rd_uint(r, 4, &v, "a tensor type") < 0)
        return -1;
    t->type = (uint32_t)v;
    if (rd_uint(r, 8, &t->offset, "a tensor offset") < 0)
        return -1;
    const char *tn = kvg_gguf_ggml_type_name(t->type);
    if (tn) {
        uint32_t blck = ggml_types[t->type].blck, size = ggml_types[t->type].size;
        if (t->ne[0] % blck != 0)
            return fail(r, "bad GGUF: tensor '%s' of type %s has %llu columns, not a multiple of %u",
                        t->name, tn, (unsigned long long)t->ne[0], blck);
        uint64_t blocks = n_elem / blck;
        if (blocks > UINT64_MAX / size)
            return fail(r, "bad GGUF: tensor '%s' is impossibly large", t->name);
        t->n_bytes = blocks * size;
    }
    return 0;
}

static int parse(rd *r, kvg_gguf *g)
{
    uint64_t v, n_tensors, n_kv;

    if (r->len < 4 || memcmp(r->p, "GGUF", 4) != 0)
        return fail(r, "not a GGUF file (no 'GGUF' magic)");
    r->off = 4;
    if (rd_uint(r, 4, &v, "the version") < 0)
        return -1;
    if ((v & 0xFFFF) == 0 && v != 0)
        return fail(r, "big-endian GGUF files are not supported");
    if (v < 2 || v > 3)
        return fail(r, "unsupported GGUF version %llu (2 and 3 are supported)", (unsigned long long)v);
    g->version = (uint32_t)v;
    if (rd_uint(r, 8, &n_tensors, "the tensor count") < 0 || rd_uint(r, 8, &n_kv, "the metadata count") < 0)
        return -1;
    /* A key/value takes at least 13 bytes and a tensor info at least 28. */
    if (n_kv > left(r) / 13)
        return fail(r, "bad GGUF: %llu metadata entries cannot fit in %zu bytes",
                    (unsigned long long)n_kv, r->len);
    if (n_tensors > left(r) / 28)
        return fail(r, "bad GGUF: %llu tensor infos cannot fit in %zu bytes",
                    (unsigned long long)n_tensors, r->len);
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors || index_init(&g->kv_index, n_kv) < 0
        || index_init(&g->tensor_index, n_tensors) < 0)
        return fail(r, "out of memory");

    g->alignment = KVG_GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < n_kv; i++) {
        kvg_gguf_kv *kv = &g->kv[i];
        kvg_gguf_str key;
        if (rd_str(r, &key, "a metadata key") < 0)
            return -1;
        if (!(kv->key = dup_str(key)))
            return fail(r, "out of memory");
        g->n_kv = i + 1;
        if (index_probe(&g->kv_index, kv->key, kv_name, g, (int32_t)i) >= 0)
            return fail(r, "bad GGUF: duplicate metadata key '%s'", kv->key);
        if (rd_uint(r, 4, &v, "a value type") < 0)
            return -1;
        kv->type = (uint32_t)v;
        if (v > UINT32_MAX)
            return fail(r, "bad GGUF: key '%s' has unknown value type", kv->key);
        if (parse_value(r, kv, i) < 0)
            return -1;
        if (strcmp(kv->key, "general.alignment") == 0) {
            if (kv->type != KVG_GGUF_U32 || kv->v.u == 0 || (kv->v.u & (kv->v.u - 1)) != 0)
                return fail(r, "bad GGUF: general.alignment must be a power-of-two u32");
            g->alignment = (uint32_t)kv->v.u;
        }
    }

    for (size_t i = 0; i < n_tensors; i++) {
        g->n_tensors = i + 1;
        if (parse_tensor(r, &g->tensors[i], i) < 0)
            return -1;
        if (index_probe(&g->tensor_index, g->tensors[i].name, tensor_name, g, (int32_t)i) >= 0)
            return fail(r, "bad GGUF: duplicate tensor name '%s'", g->tensors[i].name);
    }

    uint64_t data_off = ((uint64_t)r->off + g->alignment - 1) / g->alignment * g->alignment;
    g->data_offset = data_off;
    if (n_tensors == 0)
        return 0;
    if (data_off > r->len)
        return fail(r, "truncated GGUF: no data section after the tensor infos");
    uint64_t avail = r->len - data_off;
    for (size_t i = 0; i < n_tensors; i++) {
        kvg_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return fail(r, "bad GGUF: tensor '%s' offset %llu is not aligned to %u",
                        t->name, (unsigned long long)t->offset, g->alignment);
        if (t->offset > avail || t->n_bytes > avail - t->offset)
            return fail(r, "truncated GGUF: tensor '%s' (%llu bytes at data offset %llu) extends past the end of the file",
                        t->name, (unsigned long long)t->n_bytes, (unsigned long long)t->offset);
        if (t->n_bytes)
            t->data = r->p + data_off + t->offset;
    }
    return 0;
}

kvg_gguf *kvg_gguf_parse(const void *data, size_t len, const char *name, char *err, size_t err_len)
{
    rd r = { data, len, 0, name ? name : "(memory)", err, err_len };
    kvg_gguf *g = calloc(1, sizeof *g);

    if (!g) {
        fail(&r, "out of memory");
        return NULL;
    }
    g->data = data;
    g->len = len;
    if (parse(&r, g) < 0) {
        kvg_gguf_free(g);
        return NULL;
    }
    return g;
}

kvg_gguf *kvg_gguf_open(const char *path, char *err, size_t err_len)
{
    rd r = { NULL, 0, 0, path, err, err_len };
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        fail(&r, "cannot open: %s", strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
        fail(&r, "%s", st.st_size == 0 ? "empty file" : "not a regular file");
        close(fd);
        return NULL;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        fail(&r, "cannot map: %s", strerror(errno));
        return NULL;
    }
    kvg_gguf *g = kvg_gguf_parse(m, (size_t)st.st_size, path, err, err_len);
    if (!g) {
        munmap(m, (size_t)st.st_size);
        return NULL;
    }
    g->map = m;
    g->map_len = (size_t)st.st_size;
    return g;
}

void kvg_gguf_free(kvg_gguf *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n_kv; i++) {
        free((void *)g->kv[i].key);
        free((void *)g->kv[i].arr_str_off);
    }
    for (size_t i = 0; i < g->n_tensors; i++)
        free((void *)g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(g->kv_index.slots);
    free(g->tensor_index.slots);
    if (g->map)
        munmap(g->map, g->map_len);
    free(g);
}

uint32_t kvg_gguf_version(const kvg_gguf *g)
{
    return g->version;
}

uint32_t kvg_gguf_alignment(const kvg_gguf *g)
{
    return g->alignment;
}

size_t kvg_gguf_n_kv(const kvg_gguf *g)
{
    return g->n_kv;
}

const kvg_gguf_kv *kvg_gguf_kv_at(const kvg_gguf *g, size_t i)
{
    return i < g->n_kv ? &g->kv[i] : NULL;
}

const kvg_gguf_kv *kvg_gguf_find(const kvg_gguf *g, const char *key)
{
    int32_t i = index_probe(&g->kv_index, key, kv_name, g, -1);
    return i >= 0 ? &g->kv[i] : NULL;
}

int kvg_gguf_get_u64(const kvg_gguf *g, const char *key, uint64_t *out)
{
    const kvg_gguf_kv *kv = kvg_gguf_find(g, key);
    if (!kv)
        return -1;
    if (is_unsigned(kv->type)) {
        *out = kv->v.u;
        return 0;
    }
    if (is_signed(kv->type) && kv->v.i >= 0) {
        *out = (uint64_t)kv->v.i;
        return 0;
    }
    return -1;
}

int kvg_gguf_get_i64(const kvg_gguf *g, const char *key, int64_t *out)
{
    const kvg_gguf_kv *kv = kvg_gguf_find(g, key);
    if (!kv)
        return -1;
    if (is_signed(kv->type)) {
        *out = kv->v.i;
        return 0;
    }
    if (is_unsigned(kv->type) && kv->v.u <= (uint64_t)INT64_MAX) {
        *out = (int64_t)kv->v.u;
        return 0;
    }
    return -1;
}

int kvg_gguf_get_f64(const kvg_gguf *g, const char *key, double *out)
{
    const kvg_gguf_kv *kv = kvg_gguf_find(g, key);
    if (!kv)
        return -1;
    if (kv->type == KVG_GGUF_F32 || kv->type == KVG_GGUF_F64)
        *out = kv->v.f;
    else if (is_signed(kv->type))
        *out = (double)kv->v.i;
    else if (is_unsigned(kv->type))
        *out = (double)kv->v.u;
    else
        return -1;
    return 0;
}

int kvg_gguf_get_bool(const kvg_gguf *g, const char *key, int *out)
{
    const kvg_gguf_kv *kv = kvg_gguf_find(g, key);
    if (!kv || !(kv->type == KVG_GGUF_BOOL || is_signed(kv->type) || is_unsigned(kv->type)))
        return -1;
    *out = kv->v.u != 0;
    return 0;
}

int kvg_gguf_get_str(const kvg_gguf *g, const char *key, kvg_gguf_str *out)
{
    const kvg_gguf_kv *kv = kvg_gguf_find(g, key);
    if (!kv || kv->type != KVG_GGUF_STRING)
        return -1;
    *out = kv->v.str;
    return 0;
}

const kvg_gguf_kv *kvg_gguf_get_arr(const kvg_gguf *g, const char *key, int arr_type)
{
    const kvg_gguf_kv *kv = kvg_gguf_find(g, key);
    if (!kv || kv->type != KVG_GGUF_ARRAY || (arr_type >= 0 && kv->arr_type != (uint32_t)arr_type))
        return NULL;
    return kv;
}

int kvg_gguf_arr_str(const kvg_gguf_kv *kv, uint64_t i, kvg_gguf_str *out)
{
    if (!kv || kv->type != KVG_GGUF_ARRAY || kv->arr_type != KVG_GGUF_STRING || i >= kv->arr_n)
        return -1;
    const unsigned char *p = kv->arr_data + kv->arr_str_off[i];
    out->len = (size_t)le(p, 8);     /* checked against the file when parsed */
    out->s = (const char *)p + 8;
    return 0;
}

int kvg_gguf_arr_i64(const kvg_gguf_kv *kv, uint64_t i, int64_t *out)
{
    if (!kv || kv->type != KVG_GGUF_ARRAY || i >= kv->arr_n)
        return -1;
    int sz = type_size(kv->arr_type);
    if (sz <= 0)
        return -1;
    uint64_t v = le(kv->arr_data + i * (uint64_t)sz, sz);
    if (is_signed(kv->arr_type))
        *out = sign_extend(v, sz);
    else if (is_unsigned(kv->arr_type) || kv->arr_type == KVG_GGUF_BOOL) {
        if (v > (uint64_t)INT64_MAX)
            return -1;
        *out = (int64_t)v;
    } else
        return -1;
    return 0;
}

int kvg_gguf_arr_f64(const kvg_gguf_kv *kv, uint64_t i, double *out)
{
    if (!kv || kv->type != KVG_GGUF_ARRAY || i >= kv->arr_n)
        return -1;
    int sz = type_size(kv->arr_type);
    if (sz <= 0 || kv->arr_type == KVG_GGUF_BOOL)
        return -1;
    uint64_t v = le(kv->arr_data + i * (uint64_t)sz, sz);
    if (kv->arr_type == KVG_GGUF_F32 || kv->arr_type == KVG_GGUF_F64)
        *out = to_float(v, sz);
    else if (is_signed(kv->arr_type))
        *out = (double)sign_extend(v, sz);
    else
        *out = (double)v;
    return 0;
}

size_t kvg_gguf_n_tensors(const kvg_gguf *g)
{
    return g->n_tensors;
}

const kvg_gguf_tensor *kvg_gguf_tensor_at(const kvg_gguf *g, size_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const kvg_gguf_tensor *kvg_gguf_find_tensor(const kvg_gguf *g, const char *name)
{
    int32_t i = index_probe(&g->tensor_index, name, tensor_name, g, -1);
    return i >= 0 ? &g->tensors[i] : NULL;
}
