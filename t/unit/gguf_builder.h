/* Builds GGUF files in memory for the tests (little-endian, versions 2/3).
 *
 *   gb b; gb_init(&b, 3, n_tensors, n_kv);
 *   gb_key(&b, "general.name"); gb_u32(&b, KVG_GGUF_STRING); gb_str(&b, "x");
 *   ...
 *   gb_free(&b);
 *
 * The caller writes the header counts it promises; nothing here checks them, so
 * broken files are as easy to make as good ones. */
#ifndef KVG_GGUF_BUILDER_H
#define KVG_GGUF_BUILDER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct gb {
    unsigned char *p;
    size_t n, cap;
} gb;

__attribute__((unused)) static void gb_bytes(gb *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

__attribute__((unused)) static void gb_le(gb *b, uint64_t v, int n)
{
    unsigned char t[8];
    for (int i = 0; i < n; i++)
        t[i] = (unsigned char)(v >> (8 * i));
    gb_bytes(b, t, (size_t)n);
}

__attribute__((unused)) static void gb_u8(gb *b, uint8_t v) { gb_le(b, v, 1); }
__attribute__((unused)) static void gb_u16(gb *b, uint16_t v) { gb_le(b, v, 2); }
__attribute__((unused)) static void gb_u32(gb *b, uint32_t v) { gb_le(b, v, 4); }
__attribute__((unused)) static void gb_u64(gb *b, uint64_t v) { gb_le(b, v, 8); }

__attribute__((unused)) static void gb_f32(gb *b, float f)
{
    uint32_t v;
    memcpy(&v, &f, 4);
    gb_u32(b, v);
}

__attribute__((unused)) static void gb_f64(gb *b, double f)
{
    uint64_t v;
    memcpy(&v, &f, 8);
    gb_u64(b, v);
}

__attribute__((unused)) static void gb_strn(gb *b, const char *s, size_t n)
{
    gb_u64(b, n);
    gb_bytes(b, s, n);
}

__attribute__((unused)) static void gb_str(gb *b, const char *s)
{
    gb_strn(b, s, strlen(s));
}

__attribute__((unused)) static void gb_init(gb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    memset(b, 0, sizeof *b);
    gb_bytes(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}

/* A key and its value type. */
__attribute__((unused)) static void gb_key(gb *b, const char *key, uint32_t type)
{
    gb_str(b, key);
    gb_u32(b, type);
}

/* An array header (after gb_key(..., ARRAY)). */
__attribute__((unused)) static void gb_arr(gb *b, uint32_t elem_type, uint64_t n)
{
    gb_u32(b, elem_type);
    gb_u64(b, n);
}

__attribute__((unused)) static void gb_pad(gb *b, size_t align)
{
    while (b->n % align)
        gb_u8(b, 0);
}

__attribute__((unused)) static void gb_free(gb *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

#endif
