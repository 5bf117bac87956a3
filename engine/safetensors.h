/* safetensors reader: an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}), then the data; offsets are relative to byte 8 + N.
 *
 * Nothing in the file is trusted: the header length, every shape, offset and size
 * is checked against the file (and for overflow) before any tensor is exposed.
 * Tensors point into the caller's bytes, which must outlive the reader. */
#ifndef KVG_SAFETENSORS_H
#define KVG_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define KVG_ST_MAX_DIMS 8

typedef struct kvg_st_tensor {
    char *name;
    char dtype[16];              /* as written: "F32", "BF16", "I8", ... */
    int n_dims;
    int64_t shape[KVG_ST_MAX_DIMS];
    const void *data;
    size_t n_bytes;
} kvg_st_tensor;

typedef struct kvg_safetensors kvg_safetensors;

/* Parses data[0..len); `name` is used in error messages. NULL on error. */
kvg_safetensors *kvg_st_parse(const void *data, size_t len, const char *name, char *err, size_t err_len);
void kvg_st_free(kvg_safetensors *st);

const kvg_st_tensor *kvg_st_find(const kvg_safetensors *st, const char *name);

#endif
