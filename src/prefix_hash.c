#include "prefix_hash.h"
#include "errmsg.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/err.h>
#include <openssl/evp.h>

struct kvg_prefix_hasher {
    EVP_MD *md;
    EVP_MD_CTX *ctx;
};

/* Ids are serialized through a stack buffer this many at a time; a default block
 * (32-byte parent + 16 ids) then goes to OpenSSL in a single update. */
#define CHUNK_IDS 64

static int ssl_fail(char *err, size_t err_len, const char *what)
{
    char msg[160];

    ERR_error_string_n(ERR_get_error(), msg, sizeof(msg));
    kvg_set_err(err, err_len, "prefix hash: %s failed: %s", what, msg);
    return -1;
}

static void put_u32le(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

size_t kvg_prefix_default_salt(const void *name, size_t len, uint8_t *out, size_t cap)
{
    if (len >= cap || (len && !name))
        return 0;
    out[0] = KVG_PREFIX_DEFAULT_MARK;
    if (len)
        memcpy(out + 1, name, len);
    return len + 1;
}

int kvg_prefix_salt_is_default(const void *salt, size_t len, const void **name, size_t *name_len)
{
    const uint8_t *p = salt;
    int def = len > 0 && p[0] == KVG_PREFIX_DEFAULT_MARK;
    if (name)
        *name = def ? p + 1 : p;
    if (name_len)
        *name_len = def ? len - 1 : len;
    return def;
}

kvg_prefix_hasher *kvg_prefix_hasher_new(char *err, size_t err_len)
{
    kvg_prefix_hasher *h = calloc(1, sizeof(*h));

    if (!h) {
        kvg_set_err(err, err_len, "prefix hash: out of memory");
        return NULL;
    }
    h->md = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (!h->md) {
        ssl_fail(err, err_len, "fetching SHA256");
        kvg_prefix_hasher_free(h);
        return NULL;
    }
    h->ctx = EVP_MD_CTX_new();
    if (!h->ctx) {
        ssl_fail(err, err_len, "EVP_MD_CTX_new");
        kvg_prefix_hasher_free(h);
        return NULL;
    }
    return h;
}

void kvg_prefix_hasher_free(kvg_prefix_hasher *h)
{
    if (!h)
        return;
    EVP_MD_CTX_free(h->ctx);
    EVP_MD_free(h->md);
    free(h);
}

int kvg_prefix_root(kvg_prefix_hasher *h, const void *model_id, size_t model_len,
                    const void *salt, size_t salt_len,
                    uint8_t root[KVG_PREFIX_HASH_LEN], char *err, size_t err_len)
{
    uint8_t len_le[4];

    if (model_len > UINT32_MAX || salt_len > UINT32_MAX) {
        kvg_set_err(err, err_len, "prefix hash: model id or salt longer than 4 GiB");
        return -1;
    }
    if (!EVP_DigestInit_ex2(h->ctx, h->md, NULL))
        return ssl_fail(err, err_len, "EVP_DigestInit_ex2");
    put_u32le(len_le, (uint32_t)model_len);
    if (!EVP_DigestUpdate(h->ctx, KVG_PREFIX_TAG, strlen(KVG_PREFIX_TAG))
        || !EVP_DigestUpdate(h->ctx, len_le, 4)
        || (model_len && !EVP_DigestUpdate(h->ctx, model_id, model_len)))
        return ssl_fail(err, err_len, "EVP_DigestUpdate");
    put_u32le(len_le, (uint32_t)salt_len);
    if (!EVP_DigestUpdate(h->ctx, len_le, 4)
        || (salt_len && !EVP_DigestUpdate(h->ctx, salt, salt_len)))
        return ssl_fail(err, err_len, "EVP_DigestUpdate");
    if (!EVP_DigestFinal_ex(h->ctx, root, NULL))
        return ssl_fail(err, err_len, "EVP_DigestFinal_ex");
    return 0;
}

static int check_block_size(size_t block_size, char *err, size_t err_len)
{
    if (block_size < KVG_PREFIX_BLOCK_MIN || block_size > KVG_PREFIX_BLOCK_MAX) {
        kvg_set_err(err, err_len, "prefix hash: block size %zu out of range %d..%d", block_size,
                KVG_PREFIX_BLOCK_MIN, KVG_PREFIX_BLOCK_MAX);
        return -1;
    }
    return 0;
}

/* Index of the first negative id, or n. Branch-free accumulation first, since ids
 * are almost never negative. */
static size_t first_negative(const int32_t *ids, size_t n)
{
    int32_t any = 0;

    for (size_t i = 0; i < n; i++)
        any |= ids[i];
    if (any >= 0)
        return n;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0)
            return i;
    return n;
}

/* The link itself; ids already checked. */
static int link_block(kvg_prefix_hasher *h, const uint8_t *parent, const int32_t *ids,
                      size_t block_size, uint8_t *out, char *err, size_t err_len)
{
    uint8_t buf[KVG_PREFIX_HASH_LEN + 4 * CHUNK_IDS];
    size_t off = KVG_PREFIX_HASH_LEN;

    if (!EVP_DigestInit_ex2(h->ctx, h->md, NULL))
        return ssl_fail(err, err_len, "EVP_DigestInit_ex2");
    memcpy(buf, parent, KVG_PREFIX_HASH_LEN);
    for (size_t i = 0; i < block_size; i++) {
        put_u32le(buf + off, (uint32_t)ids[i]);
        off += 4;
        if (off == sizeof(buf)) {
            if (!EVP_DigestUpdate(h->ctx, buf, off))
                return ssl_fail(err, err_len, "EVP_DigestUpdate");
            off = 0;
        }
    }
    if (off && !EVP_DigestUpdate(h->ctx, buf, off))
        return ssl_fail(err, err_len, "EVP_DigestUpdate");
    if (!EVP_DigestFinal_ex(h->ctx, out, NULL))
        return ssl_fail(err, err_len, "EVP_DigestFinal_ex");
    return 0;
}

int kvg_prefix_next(kvg_prefix_hasher *h, const uint8_t parent[KVG_PREFIX_HASH_LEN],
                    const int32_t *ids, size_t block_size,
                    uint8_t out[KVG_PREFIX_HASH_LEN], char *err, size_t err_len)
{
    size_t bad;

    if (check_block_size(block_size, err, err_len) < 0)
        return -1;
    bad = first_negative(ids, block_size);
    if (bad < block_size) {
        kvg_set_err(err, err_len, "prefix hash: token id %d at index %zu is negative", (int)ids[bad],
                bad);
        return -1;
    }
    return link_block(h, parent, ids, block_size, out, err, err_len);
}

int kvg_prefix_chain(kvg_prefix_hasher *h, const uint8_t root[KVG_PREFIX_HASH_LEN],
                     const int32_t *ids, size_t n_ids, size_t block_size,
                     uint8_t (*out)[KVG_PREFIX_HASH_LEN], size_t out_cap, size_t *n_blocks,
                     char *err, size_t err_len)
{
    size_t nb, bad;

    if (check_block_size(block_size, err, err_len) < 0)
        return -1;
    nb = n_ids / block_size;
    if (nb > out_cap) {
        kvg_set_err(err, err_len, "prefix hash: %zu blocks do not fit in %zu slots", nb, out_cap);
        return -1;
    }
    bad = first_negative(ids, nb * block_size);
    if (bad < nb * block_size) {
        kvg_set_err(err, err_len, "prefix hash: token id %d at index %zu is negative", (int)ids[bad],
                bad);
        return -1;
    }
    for (size_t b = 0; b < nb; b++) {
        if (link_block(h, b ? out[b - 1] : root, ids + b * block_size, block_size, out[b], err,
                       err_len) < 0)
            return -1;
    }
    *n_blocks = nb;
    return 0;
}

char *kvg_prefix_hex(const uint8_t hash[KVG_PREFIX_HASH_LEN], char hex[2 * KVG_PREFIX_HASH_LEN + 1])
{
    static const char digits[] = "0123456789abcdef";

    for (int i = 0; i < KVG_PREFIX_HASH_LEN; i++) {
        hex[2 * i] = digits[hash[i] >> 4];
        hex[2 * i + 1] = digits[hash[i] & 15];
    }
    hex[2 * KVG_PREFIX_HASH_LEN] = '\0';
    return hex;
}
