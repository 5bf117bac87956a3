/* GGUF reader (versions 2 and 3, little-endian): header, metadata key/values of
 * every type (arrays included) and tensor infos.
 *
 * The reader never trusts the file: every count and length is checked against
 * the bytes that remain before anything is allocated or read, so a truncated or
 * hostile file gives an error, not a crash or a huge allocation. Values point
 * into the parsed bytes (no copies of big arrays); keys and tensor names are
 * copied as NUL-terminated strings for convenience. */
#ifndef KVG_GGUF_H
#define KVG_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum kvg_gguf_type {
    KVG_GGUF_U8 = 0,
    KVG_GGUF_I8 = 1,
    KVG_GGUF_U16 = 2,
    KVG_GGUF_I16 = 3,
    KVG_GGUF_U32 = 4,
    KVG_GGUF_I32 = 5,
    KVG_GGUF_F32 = 6,
    KVG_GGUF_BOOL = 7,
    KVG_GGUF_STRING = 8,
    KVG_GGUF_ARRAY = 9,
    KVG_GGUF_U64 = 10,
    KVG_GGUF_I64 = 11,
    KVG_GGUF_F64 = 12
};

#define KVG_GGUF_MAX_DIMS 4
#define KVG_GGUF_DEFAULT_ALIGNMENT 32

/* A string inside the file: not NUL-terminated. */
typedef struct kvg_gguf_str {
    const char *s;
    size_t len;
} kvg_gguf_str;

typedef struct kvg_gguf_kv {
    const char *key;             /* NUL-terminated copy */
    uint32_t type;               /* enum kvg_gguf_type */
    union {
        uint64_t u;              /* unsigned integers and bool */
        int64_t i;               /* signed integers */
        double f;                /* F32 and F64 */
        kvg_gguf_str str;        /* STRING */
    } v;
    /* ARRAY only: */
    uint32_t arr_type;           /* element type (never ARRAY: nested arrays are rejected) */
    uint64_t arr_n;              /* number of elements */
    const unsigned char *arr_data;   /* first element, packed little-endian */
    const uint64_t *arr_str_off;     /* STRING elements: offset of element i from arr_data */
} kvg_gguf_kv;

typedef struct kvg_gguf_tensor {
    const char *name;            /* NUL-terminated copy */
    uint32_t n_dims;
    uint64_t ne[KVG_GGUF_MAX_DIMS];  /* ne[0] varies fastest; unused dims are 1 */
    uint32_t type;               /* ggml type id (0 F32, 1 F16, 2 Q4_0, 8 Q8_0, 30 BF16, ...) */
    uint64_t offset;             /* from the start of the data section */
    uint64_t n_bytes;            /* 0 when the type is unknown to this reader */
    const void *data;            /* into the file; NULL when n_bytes is 0 */
} kvg_gguf_tensor;

typedef struct kvg_gguf kvg_gguf;

/* Parses data[0..len) without copying it: the caller keeps it alive until
 * kvg_gguf_free. `name` is used in error messages. NULL on error. */
kvg_gguf *kvg_gguf_parse(const void *data, size_t len, const char *name,
                         char *err, size_t err_len);
void kvg_gguf_free(kvg_gguf *g);

const kvg_gguf_kv *kvg_gguf_find(const kvg_gguf *g, const char *key);

/* Typed getters: 0 on success, -1 when the key is absent or its value has an
 * incompatible type (integers of any width are accepted when the value fits;
 * get_f64 accepts F32/F64 and integers; get_bool accepts BOOL and integers). */
int kvg_gguf_get_u64(const kvg_gguf *g, const char *key, uint64_t *out);
int kvg_gguf_get_i64(const kvg_gguf *g, const char *key, int64_t *out);
int kvg_gguf_get_f64(const kvg_gguf *g, const char *key, double *out);
int kvg_gguf_get_bool(const kvg_gguf *g, const char *key, int *out);
int kvg_gguf_get_str(const kvg_gguf *g, const char *key, kvg_gguf_str *out);
/* The array under key with elements of type `arr_type` (or any type when
 * arr_type is -1); NULL when absent or not such an array. */
const kvg_gguf_kv *kvg_gguf_get_arr(const kvg_gguf *g, const char *key, int arr_type);

/* Array element access (bounds-checked): 0, or -1 for a bad index or type. */
int kvg_gguf_arr_str(const kvg_gguf_kv *kv, uint64_t i, kvg_gguf_str *out);
int kvg_gguf_arr_i64(const kvg_gguf_kv *kv, uint64_t i, int64_t *out);   /* integer and bool arrays */
int kvg_gguf_arr_f64(const kvg_gguf_kv *kv, uint64_t i, double *out);    /* float and integer arrays */

const kvg_gguf_tensor *kvg_gguf_find_tensor(const kvg_gguf *g, const char *name);

/* "F32", "Q4_K", ... or NULL for a ggml type this reader does not know. */
const char *kvg_gguf_ggml_type_name(uint32_t type);

#endif
