/* Tokenizer from GGUF metadata (tokenizer.ggml.*), as llama.cpp writes it:
 *   model "llama": SentencePiece BPE by scores (merges derived from the scores)
 *   model "gpt2":  byte-level BPE by merge rank; tokenizer.ggml.pre picks the
 *                  pre-tokenizer (tok_pre.c).
 *   model "gemma4": SentencePiece-style text merged by merge rank. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errmsg.h"
#include "gguf.h"
#include "tok_internal.h"

static int str_is(kvg_gguf_str s, const char *lit)
{
    return s.len == strlen(lit) && memcmp(s.s, lit, s.len) == 0;
}

static int is_byte_piece(const char *p, uint32_t len)
{
    static const char hex[] = "0123456789ABCDEFabcdef";
    return len == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>'
        && p[3] && strchr(hex, p[3]) && p[4] && strchr(hex, p[4]);
}

/* An id from key, or -1 when absent or out of range (llama.cpp ignores those too). */
static int32_t get_id(const kvg_gguf *g, const char *key, int32_t n, int32_t dflt)
{
    uint64_t v;
    if (kvg_gguf_get_u64(g, key, &v) < 0)
        return dflt;
    return v < (uint64_t)n ? (int32_t)v : -1;
}

static int load_pieces(struct kvg_tokenizer *t, const kvg_gguf *g, const char *name,
                       char *err, size_t err_len)
{
    const kvg_gguf_kv *tokens = kvg_gguf_get_arr(g, "tokenizer.ggml.tokens", KVG_GGUF_STRING);
    size_t total = 0;

    if (!tokens)
        return kvg_fail(err, err_len, name, "GGUF has no tokenizer.ggml.tokens string array");
    if (tokens->arr_n == 0 || tokens->arr_n > INT32_MAX / 4)
        return kvg_fail(err, err_len, name, "GGUF tokenizer.ggml.tokens has %llu entries",
                    (unsigned long long)tokens->arr_n);
    int32_t n = (int32_t)tokens->arr_n;
    for (int32_t i = 0; i < n; i++) {
        kvg_gguf_str s;
        kvg_gguf_arr_str(tokens, (uint64_t)i, &s);
        if (s.len > UINT32_MAX / 2)
            return kvg_fail(err, err_len, name, "GGUF token %d is too long", i);
        total += s.len + 1;
    }
    if (kvg_tok_alloc(t, n) < 0 || !(t->arena = malloc(total)))
        return kvg_fail(err, err_len, name, "out of memory");
    char *w = t->arena;
    for (int32_t i = 0; i < n; i++) {
        kvg_gguf_str s;
        kvg_gguf_arr_str(tokens, (uint64_t)i, &s);
        memcpy(w, s.s, s.len);
        w[s.len] = '\0';
        t->piece[i] = w;
        t->piece_len[i] = (uint32_t)s.len;
        w += s.len + 1;
    }

    const kvg_gguf_kv *types = kvg_gguf_find(g, "tokenizer.ggml.token_type");
    if (types) {
        if (types->type != KVG_GGUF_ARRAY || types->arr_n != (uint64_t)n)
            return kvg_fail(err, err_len, name, "GGUF tokenizer.ggml.token_type is not an array of %d entries", n);
        for (int32_t i = 0; i < n; i++) {
            int64_t v;
            if (kvg_gguf_arr_i64(types, (uint64_t)i, &v) < 0)
                return kvg_fail(err, err_len, name, "GGUF tokenizer.ggml.token_type is not an integer array");
            /* Unknown future types behave as ordinary pieces. */
            t->type[i] = v >= KVG_TT_UNDEFINED && v <= KVG_TT_BYTE ? (uint8_t)v : KVG_TT_UNDEFINED;
        }
    } else {
        for (int32_t i = 0; i < n; i++)
            t->type[i] = is_byte_piece(t->piece[i], t->piece_len[i]) ? KVG_TT_BYTE : KVG_TT_NORMAL;
    }
    return 0;
}

static int load_scores(struct kvg_tokenizer *t, const kvg_gguf *g, const char *name,
                       char *err, size_t err_len)
{
    const kvg_gguf_kv *scores = kvg_gguf_find(g, "tokenizer.ggml.scores");

    if (!(t->score = calloc((size_t)t->n_vocab, sizeof *t->score)))
        return kvg_fail(err, err_len, name, "out of memory");
    if (!scores)
        return 0;              /* all pieces tie: merges go left to right */
    if (scores->type != KVG_GGUF_ARRAY || scores->arr_n != (uint64_t)t->n_vocab)
        return kvg_fail(err, err_len, name, "GGUF tokenizer.ggml.scores is not an array of %d entries", t->n_vocab);
    for (int32_t i = 0; i < t->n_vocab; i++) {
        double d;
        if (kvg_gguf_arr_f64(scores, (uint64_t)i, &d) < 0)
            return kvg_fail(err, err_len, name, "GGUF tokenizer.ggml.scores is not a number array");
        if (isnan(d))
            return kvg_fail(err, err_len, name, "GGUF tokenizer.ggml.scores[%d] is NaN", i);
        t->score[i] = (float)d;
    }
    return 0;
}

static int load_merges(struct kvg_tokenizer *t, const kvg_gguf *g, const char *name,
                       char *err, size_t err_len)
{
    const kvg_gguf_kv *merges = kvg_gguf_get_arr(g, "tokenizer.ggml.merges", KVG_GGUF_STRING);
    char *buf = NULL;
    size_t buf_cap = 0;

    if (!merges)
        return kvg_fail(err, err_len, name, "GGUF byte-level vocabulary has no tokenizer.ggml.merges string array");
    if (merges->arr_n > INT32_MAX / 4)
        return kvg_fail(err, err_len, name, "GGUF tokenizer.ggml.merges has too many entries");
    if (kvg_merges_init(&t->merges, (uint32_t)merges->arr_n) < 0)
        return kvg_fail(err, err_len, name, "out of memory");
    for (uint64_t i = 0; i < merges->arr_n; i++) {
        kvg_gguf_str s;
        kvg_gguf_arr_str(merges, i, &s);
        /* "left right"; a piece never holds a plain space in byte-level text, but
         * the first character may be anything, so search from the second. */
        const char *sp = s.len > 1 ? memchr(s.s + 1, ' ', s.len - 1) : NULL;
        if (!sp) {
            free(buf);
            return kvg_fail(err, err_len, name, "GGUF merge %llu ('%.*s') is not two pieces separated by a space",
                        (unsigned long long)i, (int)(s.len > 40 ? 40 : s.len), s.s);
        }
        size_t ll = (size_t)(sp - s.s), rl = s.len - ll - 1;
        if (buf_cap < ll + rl) {
            buf_cap = (ll + rl) * 2;
            char *nb = realloc(buf, buf_cap);
            if (!nb) {
                free(buf);
                return kvg_fail(err, err_len, name, "out of memory");
            }
            buf = nb;
        }
        memcpy(buf, s.s, ll);
        memcpy(buf + ll, sp + 1, rl);
        int32_t a = kvg_tok_find(t, s.s, ll), b = kvg_tok_find(t, sp + 1, rl);
        int32_t r = kvg_tok_find(t, buf, ll + rl);
        /* A merge whose pieces are not all in the vocabulary can never apply. */
        if (a < 0 || b < 0 || r < 0)
            continue;
        if (kvg_merges_put(&t->merges, a, b, (int32_t)i, r) < 0) {
            free(buf);
            return kvg_fail(err, err_len, name, "out of memory");
        }
    }
    free(buf);
    return 0;
}

static int load(struct kvg_tokenizer *t, const kvg_gguf *g, const char *name, char *err, size_t err_len)
{
    kvg_gguf_str model, pre;
    int flag;

    if (kvg_gguf_get_str(g, "tokenizer.ggml.model", &model) < 0)
        return kvg_fail(err, err_len, name, "GGUF has no tokenizer (no tokenizer.ggml.model string)");
    int spm = str_is(model, "llama"), gemma4 = str_is(model, "gemma4");
    if (!spm && !gemma4 && !str_is(model, "gpt2"))
        return kvg_fail(err, err_len, name, "GGUF tokenizer model '%.*s' is not supported "
                        "(only llama, gpt2 and gemma4)",
                        (int)(model.len > 40 ? 40 : model.len), model.s);
    if (load_pieces(t, g, name, err, err_len) < 0)
        return -1;
    int32_t n = t->n_vocab;
    if (kvg_tok_build_index(t) < 0)
        return kvg_fail(err, err_len, name, "out of memory");

    if (gemma4) {
        /* Gemma 4: SentencePiece text (spaces as U+2581, byte fallback, no
         * dummy prefix) merged by a merge list, as Gemma 3's tokenizer.json
         * does; llama.cpp always adds BOS for it. */
        t->kind = "gguf-gemma4";
        t->mode = KVG_TOK_SPM;
        t->pretok = KVG_PRETOK_NONE;
        t->byte_fallback = 1;
        t->add_dummy_prefix = 0;
        t->add_bos = 1;
        t->unk = get_id(g, "tokenizer.ggml.unknown_token_id", n, -1);
        t->bos = get_id(g, "tokenizer.ggml.bos_token_id", n, -1);
        t->eos = get_id(g, "tokenizer.ggml.eos_token_id", n, -1);
        if (load_merges(t, g, name, err, err_len) < 0)
            return -1;
    } else if (spm) {
        t->kind = "gguf-llama";
        t->mode = KVG_TOK_SPM;
        t->pretok = KVG_PRETOK_NONE;
        t->byte_fallback = 1;
        t->add_dummy_prefix = kvg_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &flag) == 0 ? flag : 1;
        t->add_bos = kvg_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &flag) == 0 ? flag : 1;
        t->unk = get_id(g, "tokenizer.ggml.unknown_token_id", n, n > 0 ? 0 : -1);
        t->bos = get_id(g, "tokenizer.ggml.bos_token_id", n, n > 1 ? 1 : -1);
        t->eos = get_id(g, "tokenizer.ggml.eos_token_id", n, n > 2 ? 2 : -1);
        if (load_scores(t, g, name, err, err_len) < 0)
            return -1;
        if (kvg_tok_merges_from_scores(t) < 0)
            return kvg_fail(err, err_len, name, "out of memory");
    } else {
        t->kind = "gguf-gpt2";
        t->mode = KVG_TOK_BYTE_LEVEL;
        /* No name: the GPT-2 split (llama.cpp falls back to a cruder default
         * list and warns that quality degrades; files that old are GPT-2-like). */
        char why[200];
        int rc = kvg_tok_gguf_pre(t, "gpt-2", 5, why, sizeof why);
        if (rc == 0 && kvg_gguf_get_str(g, "tokenizer.ggml.pre", &pre) == 0)
            rc = kvg_tok_gguf_pre(t, pre.s, pre.len, why, sizeof why);
        if (rc < 0)
            return kvg_fail(err, err_len, name, "GGUF pre-tokenizer: %s", why);
        if (rc > 0)
            return kvg_fail(err, err_len, name, "GGUF pre-tokenizer '%.*s' is not supported "
                            "(no regex list is known for it)",
                            (int)(pre.len > 40 ? 40 : pre.len), pre.s);
        int32_t bos_default = t->bos;
        t->add_bos = kvg_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &flag) == 0 ? flag
                                                                                     : t->add_bos;
        t->unk = get_id(g, "tokenizer.ggml.unknown_token_id", n, -1);
        t->bos = get_id(g, "tokenizer.ggml.bos_token_id", n, bos_default);
        t->eos = get_id(g, "tokenizer.ggml.eos_token_id", n, -1);
        if (load_merges(t, g, name, err, err_len) < 0)
            return -1;
    }
    t->pad = get_id(g, "tokenizer.ggml.padding_token_id", n, -1);
    if (kvg_tok_added_from_types(t) < 0)
        return kvg_fail(err, err_len, name, "out of memory");
    return 0;
}

int kvg_tok_load_gguf(struct kvg_tokenizer *t, const unsigned char *data, size_t len,
                      const char *name, char *err, size_t err_len)
{
    kvg_gguf *g = kvg_gguf_parse(data, len, name, err, err_len);
    if (!g)
        return -1;
    int rc = load(t, g, name, err, err_len);
    kvg_gguf_free(g);
    return rc;
}
