/* libFuzzer target for the pre-tokenizers: for every kind, the pieces must be
 * non-empty, contiguous and cover the input exactly; on valid UTF-8 every
 * piece must itself be valid UTF-8 (a split never cuts a character). Invalid
 * UTF-8 is outside the contract but must not crash or lose bytes. */
#include <stdint.h>
#include <stdlib.h>

#include "tok_internal.h"
#include "utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct walk {
    const char *base;
    size_t off;
    int valid;
};

static int check_piece(void *ctx, const char *s, size_t len)
{
    struct walk *w = ctx;
    if (len == 0 || s != w->base + w->off)
        abort();
    if (w->valid && kvg_utf8_invalid_at((const unsigned char *)s, len) != (size_t)-1)
        abort();
    w->off += len;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int valid = kvg_utf8_invalid_at(data, size) == (size_t)-1;
    for (int kind = KVG_PRETOK_GPT2; kind <= KVG_PRETOK_QWEN2; kind++) {
        struct walk w = { (const char *)data, 0, valid };
        if (kvg_pretok_split(kind, (const char *)data, size, check_piece, &w) != 0
            || w.off != size)
            abort();
    }
    return 0;
}
