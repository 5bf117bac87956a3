/* llama2.c tokenizer.bin: int32 max_token_length, then one record per token
 * until the end of the file: float32 score, int32 length, the piece bytes.
 *
 * The format has no magic and no token types, so the loader is strict about
 * what it accepts (it is also the fallback when no other format matches):
 * lengths within max_token_length and the file, finite scores, no partial
 * record at the end. Pieces use a plain ' ' where SentencePiece has U+2581
 * (llama2.c's exporter replaced it). Ids 0, 1, 2 are <unk>, BOS and EOS;
 * "<0xNN>" pieces are the byte fallback. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errmsg.h"
#include "tok_internal.h"

/* Longest piece accepted: real vocabularies stay far below. */
#define MAX_PIECE 4096

static int32_t rd_i32(const unsigned char *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return (int32_t)v;
}

static float rd_f32(const unsigned char *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &v, 4);
    return f;
}

static int is_byte_piece(const char *p, uint32_t len)
{
    static const char hex[] = "0123456789ABCDEFabcdef";
    return len == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>'
        && strchr(hex, p[3]) && p[3] && strchr(hex, p[4]) && p[4];
}

int kvg_tok_load_llama2c(struct kvg_tokenizer *t, const unsigned char *data, size_t len,
                         const char *name, char *err, size_t err_len)
{
    if (len < 4)
        return kvg_fail(err, err_len, name, "not a tokenizer file (%zu bytes; too short for any known format)", len);
    int32_t max_len = rd_i32(data);
    if (max_len <= 0 || max_len > MAX_PIECE)
        return kvg_fail(err, err_len, name,
                    "not a tokenizer file (no GGUF magic, not JSON, and as a llama2.c tokenizer.bin "
                    "its max_token_length %d is out of range 1..%d)", max_len, MAX_PIECE);

    /* First pass: validate every record and size the arena. */
    size_t off = 4, n = 0, total = 0;
    while (off < len) {
        if (len - off < 8)
            return kvg_fail(err, err_len, name, "truncated llama2.c tokenizer: record %zu at offset %zu is cut short",
                        n, off);
        float sc = rd_f32(data + off);
        int32_t l = rd_i32(data + off + 4);
        if (!isfinite(sc))
            return kvg_fail(err, err_len, name, "bad llama2.c tokenizer: record %zu at offset %zu has a non-finite score",
                        n, off);
        if (l < 0 || l > max_len)
            return kvg_fail(err, err_len, name,
                        "bad llama2.c tokenizer: record %zu at offset %zu has length %d (max_token_length %d)",
                        n, off, l, max_len);
        if ((size_t)l > len - off - 8)
            return kvg_fail(err, err_len, name, "truncated llama2.c tokenizer: record %zu at offset %zu is cut short",
                        n, off);
        off += 8 + (size_t)l;
        total += (size_t)l + 1;
        n++;
        if (n > INT32_MAX / 2)
            return kvg_fail(err, err_len, name, "bad llama2.c tokenizer: too many records");
    }
    /* 3 special ids + at least one piece makes a usable vocabulary. */
    if (n < 4)
        return kvg_fail(err, err_len, name, "bad llama2.c tokenizer: only %zu records", n);

    if (kvg_tok_alloc(t, (int32_t)n) < 0 || !(t->score = calloc(n, sizeof *t->score))
        || !(t->arena = malloc(total)))
        return kvg_fail(err, err_len, name, "out of memory");
    char *w = t->arena;
    off = 4;
    for (size_t i = 0; i < n; i++) {
        uint32_t l = (uint32_t)rd_i32(data + off + 4);
        t->score[i] = rd_f32(data + off);
        memcpy(w, data + off + 8, l);
        w[l] = '\0';
        t->piece[i] = w;
        t->piece_len[i] = l;
        t->type[i] = is_byte_piece(w, l) ? KVG_TT_BYTE : KVG_TT_NORMAL;
        w += l + 1;
        off += 8 + l;
    }
    t->type[0] = KVG_TT_UNKNOWN;
    t->type[1] = KVG_TT_CONTROL;
    t->type[2] = KVG_TT_CONTROL;
    t->unk = 0;
    t->bos = 1;
    t->eos = 2;
    t->kind = "llama2c";
    t->mode = KVG_TOK_SPM;
    t->pretok = KVG_PRETOK_NONE;
    t->add_dummy_prefix = 1;
    t->byte_fallback = 1;
    t->add_bos = 1;
    if (kvg_tok_build_index(t) < 0 || kvg_tok_merges_from_scores(t) < 0
        || kvg_tok_added_from_types(t) < 0)
        return kvg_fail(err, err_len, name, "out of memory");
    return 0;
}
