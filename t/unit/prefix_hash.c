/* Prefix hashes: fixed vectors (computed with Python's hashlib, see
 * docs/prefix-hash.md), the layout re-assembled by hand and hashed with OpenSSL's
 * one-shot API, and the chain's properties. t/prefix-hash.t checks the CLI against
 * Perl's Digest::SHA on random inputs. */
#include <openssl/evp.h>
#include <stdint.h>

#include "prefix_hash.h"
#include "tap.h"

#define HL KVG_PREFIX_HASH_LEN

static kvg_prefix_hasher *H;
static char err[256];

static const char *hex(const uint8_t *h)
{
    static char buf[4][2 * HL + 1];
    static int k;
    k = (k + 1) % 4;
    return kvg_prefix_hex(h, buf[k]);
}

static void root_of(const char *model, const char *tenant, uint8_t *out)
{
    if (kvg_prefix_root(H, model, strlen(model), tenant, strlen(tenant), out, err, sizeof(err)) < 0)
        diag("root failed: %s", err);
}

/* Chain into a malloc'd array; returns the number of blocks (or (size_t)-1). */
static size_t chain_of(const uint8_t *root, const int32_t *ids, size_t n, size_t bs,
                       uint8_t (**out)[HL])
{
    size_t nb;
    *out = malloc((n / bs + 1) * HL);
    if (kvg_prefix_chain(H, root, ids, n, bs, *out, n / bs + 1, &nb, err, sizeof(err)) < 0) {
        diag("chain failed: %s", err);
        return (size_t)-1;
    }
    return nb;
}

static void test_vectors(void)
{
    /* python3: hashlib.sha256(b"kvgate-prefix-v1" + struct.pack("<I", 15) +
     * b"llama-2-7b-chat" + struct.pack("<I", 6) + b"org_42"), then ids 1..40 */
    static const char *want[] = {
        "f524f385494ed0ea0b7b164fb4e8dd4f72e5c2e728a538902b343098d6a5e184",
        "fb90f5f410bf7b955b5f924a975399c7347de4033cb17bc973f01e28e695b3c9",
        "9543d9ed5c7656fd2875dc2475aac344fc348eda0dc67618d396a1b1b40de56a",
    };
    uint8_t root[HL], (*ch)[HL];
    int32_t ids[40];
    size_t nb;

    for (int i = 0; i < 40; i++)
        ids[i] = i + 1;
    root_of("llama-2-7b-chat", "org_42", root);
    is_str(hex(root), want[0], "root vector (hashlib)");
    nb = chain_of(root, ids, 40, 16, &ch);
    is_int(nb, 2, "40 ids, block 16: two full blocks");
    is_str(hex(ch[0]), want[1], "h[0] vector (hashlib)");
    is_str(hex(ch[1]), want[2], "h[1] vector (hashlib)");
    free(ch);

    root_of("", "", root);
    is_str(hex(root), "3fef33d8769daee90f76e9de518e828bd9ab55d6f84ace7a8ef20f96dbee6995",
           "empty model and tenant vector");
    {
        int32_t big[4] = { 0, 1, INT32_MAX, 7 };
        root_of("m", "t", root);
        nb = chain_of(root, big, 4, 2, &ch);
        is_str(nb == 2 ? hex(ch[1]) : "", "f62bd7cbd3d87858780152f91e224aab983ca24566350e8fc119200b0aafcd05",
               "block size 2 with INT32_MAX vector");
        free(ch);
    }
}

/* The byte layout assembled by hand and hashed with EVP_Digest (one-shot). */
static void test_layout(void)
{
    uint8_t buf[256], want[HL], got[HL], link[HL];
    size_t n = 0;
    unsigned len;
    int32_t ids[3] = { 258, 0, 0x01020304 };

    memcpy(buf, "kvgate-prefix-v1", 16);
    n = 16;
    memcpy(buf + n, "\x05\x00\x00\x00" "org_1" "\x04\x00\x00\x00" "2345", 17);
    n += 17;
    EVP_Digest(buf, n, want, &len, EVP_sha256(), NULL);
    kvg_prefix_root(H, "org_1", 5, "2345", 4, got, err, sizeof(err));
    ok(memcmp(want, got, HL) == 0, "root = SHA-256(tag || u32le len || model || u32le len || tenant)");

    memcpy(buf, got, HL);
    memcpy(buf + HL, "\x02\x01\x00\x00" "\x00\x00\x00\x00" "\x04\x03\x02\x01", 12);
    EVP_Digest(buf, HL + 12, want, &len, EVP_sha256(), NULL);
    ok(kvg_prefix_next(H, got, ids, 3, link, err, sizeof(err)) == 0
       && memcmp(want, link, HL) == 0, "link = SHA-256(parent || ids as u32le)");
    ok(kvg_prefix_next(H, got, ids, 3, got, err, sizeof(err)) == 0 && memcmp(got, link, HL) == 0,
       "next() may write over its parent");
}

static uint64_t rng = 88172645463325252ull;

static int32_t rnd_id(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int32_t)(rng % 128000);
}

static void test_properties(void)
{
    enum { N = 16 * 20 + 7 };
    int32_t a[N], b[N];
    uint8_t root[HL], root2[HL], (*ca)[HL], (*cb)[HL];
    size_t na, nb;
    int good;

    for (int i = 0; i < N; i++)
        a[i] = rnd_id();
    root_of("llama-3-8b", "tenant-a", root);

    na = chain_of(root, a, N, 16, &ca);
    nb = chain_of(root, a, N, 16, &cb);
    ok(na == 20 && nb == 20 && memcmp(ca, cb, 20 * HL) == 0, "same prefix -> same chain");
    free(cb);

    nb = chain_of(root, a, 16 * 20, 16, &cb);
    ok(nb == 20 && memcmp(ca, cb, 20 * HL) == 0, "the partial trailing block is ignored");
    free(cb);
    nb = chain_of(root, a, 15, 16, &cb);
    is_int(nb, 0, "fewer ids than a block: no hashes");
    free(cb);

    /* prompts sharing exactly the first k blocks agree on exactly k hashes */
    good = 1;
    for (int k = 0; k <= 20; k++) {
        int agree = 0;
        memcpy(b, a, sizeof(a));
        if (k < 20)
            b[k * 16 + (int)(rng % 16)] ^= 1;       /* one token differs in block k */
        nb = chain_of(root, b, N, 16, &cb);
        while (agree < 20 && memcmp(ca[agree], cb[agree], HL) == 0)
            agree++;
        for (int i = agree; i < 20; i++)
            good &= memcmp(ca[i], cb[i], HL) != 0;
        good &= agree == k && nb == 20;
        free(cb);
    }
    ok(good, "sharing the first k blocks (k = 0..20) -> exactly k equal hashes, the rest differ");

    /* a different tenant or model: every hash differs */
    {
        const char *other[][2] = { { "llama-3-8b", "tenant-b" }, { "llama-3-8b-instruct", "tenant-a" },
                                   { "llama-3-8b", "" }, { "", "tenant-a" } };
        good = 1;
        for (size_t o = 0; o < 4; o++) {
            root_of(other[o][0], other[o][1], root2);
            good &= memcmp(root, root2, HL) != 0;
            nb = chain_of(root2, a, N, 16, &cb);
            for (size_t i = 0; i < nb; i++)
                for (size_t j = 0; j < na; j++)
                    good &= memcmp(cb[i], ca[j], HL) != 0;
            free(cb);
        }
        ok(good, "another tenant or model id: no hash equals any of the original chain's");
    }

    /* length prefixes: no aliasing between (model, tenant) splits */
    {
        const char *pairs[][2] = { { "org_1", "2345" }, { "org_12345", "" }, { "", "org_12345" },
                                   { "org_1234", "5" }, { "org_12345\x05", "" } };
        uint8_t r[5][HL];
        good = 1;
        for (int i = 0; i < 5; i++)
            root_of(pairs[i][0], pairs[i][1], r[i]);
        for (int i = 0; i < 5; i++)
            for (int j = i + 1; j < 5; j++)
                good &= memcmp(r[i], r[j], HL) != 0;
        ok(good, "(org_1, 2345), (org_12345, ''), ('', org_12345), ... all have distinct roots");
    }

    /* block size honoured */
    {
        uint8_t step[HL];
        nb = chain_of(root, a, N, 8, &cb);
        is_int(nb, N / 8, "block size 8: n / 8 blocks");
        kvg_prefix_next(H, root, a, 8, step, err, sizeof(err));
        ok(memcmp(step, cb[0], HL) == 0 && memcmp(cb[0], ca[0], HL) != 0,
           "block size 8: h[0] covers 8 ids, and differs from the 16-id h[0]");
        free(cb);
        nb = chain_of(root, a, N, 100, &cb);
        is_int(nb, 3, "block size 100 (not a power of two): 3 blocks of 327 ids");
        free(cb);
        nb = chain_of(root, a, N, 1, &cb);
        is_int(nb, N, "block size 1: one hash per token");
        free(cb);
    }

    /* the engine's use: extend a prompt's chain block by block with next() */
    {
        uint8_t cur[HL];
        memcpy(cur, root, HL);
        good = 1;
        for (int blk = 0; blk < 20; blk++) {
            good &= kvg_prefix_next(H, cur, a + 16 * blk, 16, cur, err, sizeof(err)) == 0;
            good &= memcmp(cur, ca[blk], HL) == 0;
        }
        ok(good, "next() block by block reproduces chain()");
    }
    free(ca);
}

static void test_errors(void)
{
    uint8_t root[HL], out[4][HL];
    int32_t ids[40] = { 0 };
    size_t nb = 12345;

    root_of("m", "t", root);
    ok(kvg_prefix_chain(H, root, ids, 40, 0, out, 4, &nb, err, sizeof(err)) < 0
       && strstr(err, "block size 0"), "block size 0 rejected: %s", err);
    ok(kvg_prefix_chain(H, root, ids, 40, 65537, out, 4, &nb, err, sizeof(err)) < 0
       && strstr(err, "65537"), "block size 65537 rejected: %s", err);
    ok(kvg_prefix_chain(H, root, ids, 40, 8, out, 4, &nb, err, sizeof(err)) < 0
       && strstr(err, "5 blocks"), "too little room for the output: %s", err);
    ids[21] = -3;
    ok(kvg_prefix_chain(H, root, ids, 40, 16, out, 4, &nb, err, sizeof(err)) < 0
       && strstr(err, "-3 at index 21"), "negative id named with its index: %s", err);
    ok(kvg_prefix_chain(H, root, ids, 20, 16, out, 4, &nb, err, sizeof(err)) == 0 && nb == 1,
       "a negative id in the ignored partial block is not looked at");
    ok(kvg_prefix_next(H, root, ids + 16, 16, out[0], err, sizeof(err)) < 0
       && strstr(err, "index 5"), "next(): negative id named: %s", err);
    ok(kvg_prefix_next(H, root, ids, 0, out[0], err, sizeof(err)) < 0, "next(): block size 0 rejected");
    {
        char h[2 * HL + 1];
        uint8_t x[HL];
        for (int i = 0; i < HL; i++)
            x[i] = (uint8_t)((i % 16) * 17);
        is_str(kvg_prefix_hex(x, h), "00112233445566778899aabbccddeeff"
               "00112233445566778899aabbccddeeff", "hex: lower case, 64 digits");
    }
}

int main(void)
{
    H = kvg_prefix_hasher_new(err, sizeof(err));
    if (!ok(H != NULL, "hasher created (%s)", H ? "SHA-256 fetched" : err))
        return done_testing();
    test_vectors();
    test_layout();
    test_properties();
    test_errors();
    kvg_prefix_hasher_free(H);
    kvg_prefix_hasher_free(NULL);
    return done_testing();
}
