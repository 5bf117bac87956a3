/* Tenant-scoped prefix hashes: the keys of the KV prefix cache.
 *
 * A prompt's token ids are cut into blocks of B tokens (default 16); only full
 * blocks are hashed. Each block's key chains over everything before it:
 *
 *   root = SHA-256("kvgate-prefix-v1" || u32le(len(model_id)) || model_id
 *                                     || u32le(len(salt))     || salt)
 *   h[0] = SHA-256(root   || ids of block 0 as u32le)
 *   h[i] = SHA-256(h[i-1] || ids of block i as u32le)
 *
 * where salt is the tenant's salt (below), so two prompts share h[0..k) exactly when
 * they share their first k blocks, under the same model and tenant. Every variable-length field is length-prefixed, so no
 * two (model, tenant) pairs give the same root: ("org_1", "2345") is not
 * ("org_12345", ""). The byte layout, a worked example and a Python version are in
 * docs/prefix-hash.md; t/prefix-hash.t checks it against Perl's Digest::SHA.
 *
 * Cost: one SHA-256 of 32 + 4B bytes per block (~0.3 us for B = 16 with SHA-NI);
 * the hasher keeps one EVP_MD_CTX and a pre-fetched EVP_MD, since OpenSSL 3 looks
 * the algorithm up again on every one-shot SHA256() call. A hasher is not
 * thread-safe: use one per thread. */
#ifndef KVG_PREFIX_HASH_H
#define KVG_PREFIX_HASH_H

#include <stddef.h>
#include <stdint.h>

#define KVG_PREFIX_HASH_LEN 32
#define KVG_PREFIX_BLOCK_DEFAULT 16
/* Bounds on the block size (tokens). */
#define KVG_PREFIX_BLOCK_MIN 1
#define KVG_PREFIX_BLOCK_MAX 65536
/* The domain-separation tag that opens the root; bump on any format change. */
#define KVG_PREFIX_TAG "kvgate-prefix-v1"

/* Tenant salts. A tenant named by a request (kvgate_tenant: a header, a variable) is
 * salted with its name's bytes, which never hold a NUL (the gateway refuses one). The
 * tenant a location falls back to when the request names none (kvgate_default_tenant)
 * is salted with KVG_PREFIX_DEFAULT_MARK (one 0x00 byte) and then its configured name,
 * so it is a namespace of its own that no header value can name: "X-Tenant-Id:
 * default" is not the anonymous tenant "default". Two locations with the same default
 * name share it, as they did. */
#define KVG_PREFIX_DEFAULT_MARK 0x00
/* The longest default tenant name whose salt fits a salt of max_salt bytes. */
#define KVG_PREFIX_DEFAULT_NAME_MAX(max_salt) ((max_salt) - 1)

/* Writes the default tenant's salt for name into out (cap bytes); returns its length,
 * or 0 when it does not fit. */
size_t kvg_prefix_default_salt(const void *name, size_t len, uint8_t *out, size_t cap);
/* Whether a salt is a default tenant's; *name and *name_len get the name part (the
 * salt itself for a named tenant). */
int kvg_prefix_salt_is_default(const void *salt, size_t len, const void **name, size_t *name_len);

typedef struct kvg_prefix_hasher kvg_prefix_hasher;

/* NULL with err when OpenSSL cannot provide SHA-256. */
kvg_prefix_hasher *kvg_prefix_hasher_new(char *err, size_t err_len);
void kvg_prefix_hasher_free(kvg_prefix_hasher *h);

/* The chain's root for a model identity and a tenant's salt (any bytes, either may
 * be empty; at most 4 GiB - 1 each). Returns 0, or -1 with err. */
int kvg_prefix_root(kvg_prefix_hasher *h, const void *model_id, size_t model_len,
                    const void *salt, size_t salt_len,
                    uint8_t root[KVG_PREFIX_HASH_LEN], char *err, size_t err_len);

/* One link: out = SHA-256(parent || ids[0..block_size) as u32le). The engine calls
 * it to extend a request's chain as generated tokens fill blocks. out may be
 * parent. Token ids must be non-negative. Returns 0, or -1 with err. */
int kvg_prefix_next(kvg_prefix_hasher *h, const uint8_t parent[KVG_PREFIX_HASH_LEN],
                    const int32_t *ids, size_t block_size,
                    uint8_t out[KVG_PREFIX_HASH_LEN], char *err, size_t err_len);

/* The chain over ids[0..n_ids): writes n_ids / block_size hashes (the trailing
 * partial block is ignored) to out, which holds out_cap of them, and sets
 * *n_blocks. Returns 0, or -1 with err (bad block size, negative id naming its
 * index, out_cap too small). */
int kvg_prefix_chain(kvg_prefix_hasher *h, const uint8_t root[KVG_PREFIX_HASH_LEN],
                     const int32_t *ids, size_t n_ids, size_t block_size,
                     uint8_t (*out)[KVG_PREFIX_HASH_LEN], size_t out_cap, size_t *n_blocks,
                     char *err, size_t err_len);

/* Lower-case hex of a hash into hex (65 bytes, NUL-terminated); returns hex. */
char *kvg_prefix_hex(const uint8_t hash[KVG_PREFIX_HASH_LEN], char hex[2 * KVG_PREFIX_HASH_LEN + 1]);

#endif
