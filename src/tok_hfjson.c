/* Hugging Face tokenizer.json loader (model type BPE only).
 *
 * Two families, told apart by the pipeline (read by tok_hfpipe.c):
 *   byte-level BPE  a ByteLevel pre-tokenizer, after any splits (the file's own
 *                   regexes: GPT-2, Llama 3, Qwen2, o200k, DeepSeek V3 ...).
 *   SentencePiece   normalizer Prepend("▁") + Replace(" " -> "▁") (Llama 2,
 *                   Mistral), Replace alone (Gemma 3: no dummy prefix), or the
 *                   older Metaspace pre_tokenizer; usually with byte_fallback.
 * Merges come as "a b" strings or [a, b] pairs; rank = index, as in HF.
 * Added tokens are matched in the raw text, longest first, with their lstrip /
 * rstrip / single_word flags; "normalized" ones too (the same text unless the
 * normalizer changes it: NFC/NFKC leave the ASCII of real added tokens alone).
 * What would change tokenization if ignored is an error naming the file and
 * the JSON path. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_json.h"
#include "tok_hfpipe.h"
#include "tok_internal.h"

#define SPM_SPACE "\xe2\x96\x81"        /* U+2581, SentencePiece's visible space */

/* Ids above this many entries past the pieces we were given would only serve
 * to make us allocate: real vocabularies are dense. */
#define MAX_ID_SLACK 4096
#define MAX_VOCAB (1 << 24)

typedef struct hf_load {
    const char *name;
    char *err;
    size_t err_len;

    kvg_hf_pipe pipe;            /* what the normalizer and pre_tokenizer say */
} hf_load;

/* One id's text before it is copied into the tokenizer's arena. */
typedef struct hf_piece {
    const char *s;
    size_t len;
    int set;
} hf_piece;

__attribute__((format(printf, 3, 4)))
static int fail(hf_load *L, const char *path, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (L->err && L->err_len)
        snprintf(L->err, L->err_len, "%s: %s%s%s", L->name, path ? path : "",
                 path ? ": " : "", msg);
    return -1;
}


/* Optional boolean member: absent or null gives dflt. */
static int get_bool(hf_load *L, const json_t *obj, const char *key, const char *path,
                    int dflt, int *out)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return fail(L, path, "\"%s\" must be a boolean, not %s", key, kvg_api_json_type(v));
    *out = json_is_true(v);
    return 0;
}

/* Optional string member that must be null/absent or empty. */
static int require_empty_str(hf_load *L, const json_t *obj, const char *key,
                             const char *path)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0))
        return 0;
    return fail(L, path, "\"%s\" is not supported", key);
}

/* ---------------- vocabulary ---------------- */

static int put_piece(hf_load *L, hf_piece *pieces, size_t n, json_int_t id,
                     const char *s, size_t len, const char *path, const char *what)
{
    if (id < 0 || (uint64_t)id >= n)
        return fail(L, path, "id %lld of %s is out of range", (long long)id, what);
    hf_piece *p = &pieces[id];
    if (p->set && (p->len != len || memcmp(p->s, s, len) != 0))
        return -2;              /* caller decides: a clash */
    p->s = s;
    p->len = len;
    p->set = 1;
    return 0;
}

/* Highest id in vocab and added_tokens, validating their shapes on the way. */
static int scan_ids(hf_load *L, const json_t *vocab, const json_t *added, json_int_t *max_id,
                    size_t *count)
{
    const char *key;
    size_t key_len;
    json_t *val;
    char path[96];
    *max_id = -1;
    *count = 0;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, val) {
        if (!json_is_integer(val))
            return fail(L, "model.vocab", "the id of \"%.40s\" is %s, not an integer",
                        key, kvg_api_json_type(val));
        json_int_t id = json_integer_value(val);
        if (id < 0 || id >= MAX_VOCAB)
            return fail(L, "model.vocab", "id %lld of \"%.40s\" is out of range",
                        (long long)id, key);
        if (key_len == 0)
            return fail(L, "model.vocab", "empty piece (id %lld)", (long long)id);
        if (id > *max_id)
            *max_id = id;
        (*count)++;
    }
    for (size_t i = 0; added && i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        if (!json_is_object(a))
            return fail(L, path, "expected an object, not %s", kvg_api_json_type(a));
        const json_t *id = json_object_get(a, "id");
        const json_t *content = json_object_get(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0
            || json_integer_value(id) >= MAX_VOCAB)
            return fail(L, path, "missing or bad \"id\"");
        if (!json_is_string(content) || json_string_length(content) == 0)
            return fail(L, path, "missing or empty \"content\"");
        if (json_integer_value(id) > *max_id)
            *max_id = json_integer_value(id);
        (*count)++;
    }
    if (*max_id < 0)
        return fail(L, "model.vocab", "empty vocabulary");
    if ((uint64_t)*max_id >= *count + MAX_ID_SLACK)
        return fail(L, "model.vocab", "ids are too sparse (highest %lld for %zu pieces)",
                    (long long)*max_id, *count);
    return 0;
}

static int is_byte_piece(const char *s, size_t len)
{
    static const char hex[] = "0123456789ABCDEF";
    return len == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>'
           && memchr(hex, s[3], 16) && memchr(hex, s[4], 16);
}

/* ---------------- merges ---------------- */

static int merge_parts(hf_load *L, const json_t *m, const char *path, const char **a,
                       size_t *a_len, const char **b, size_t *b_len)
{
    if (json_is_string(m)) {
        /* "a b": split at the first space, as HF does. */
        const char *s = json_string_value(m);
        size_t len = json_string_length(m);
        const char *sp = memchr(s, ' ', len);
        if (!sp || sp == s || sp + 1 == s + len)
            return fail(L, path, "expected \"left right\", got \"%.60s\"", s);
        *a = s;
        *a_len = (size_t)(sp - s);
        *b = sp + 1;
        *b_len = len - *a_len - 1;
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0))
        && json_is_string(json_array_get(m, 1))) {
        const json_t *l = json_array_get(m, 0), *r = json_array_get(m, 1);
        *a = json_string_value(l);
        *a_len = json_string_length(l);
        *b = json_string_value(r);
        *b_len = json_string_length(r);
        if (*a_len && *b_len)
            return 0;
    }
    return fail(L, path, "expected a \"left right\" string or a [left, right] pair");
}

static int load_merges(hf_load *L, struct kvg_tokenizer *t, const json_t *merges)
{
    char path[64];
    size_t n = json_array_size(merges);
    char *buf = NULL;
    size_t cap = 0;
    int rc = 0;

    if (n > INT32_MAX || kvg_merges_init(&t->merges, (uint32_t)n) != 0)
        return fail(L, "model.merges", "out of memory");
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *a = NULL, *b = NULL;
        size_t a_len = 0, b_len = 0;
        snprintf(path, sizeof path, "model.merges[%zu]", i);
        if (merge_parts(L, json_array_get(merges, i), path, &a, &a_len, &b, &b_len) != 0) {
            rc = -1;
            break;
        }
        if (a_len + b_len > cap) {
            cap = (a_len + b_len) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                rc = fail(L, path, "out of memory");
                break;
            }
            buf = nb;
        }
        memcpy(buf, a, a_len);
        memcpy(buf + a_len, b, b_len);
        int32_t left = kvg_tok_find(t, a, a_len);
        int32_t right = kvg_tok_find(t, b, b_len);
        int32_t result = kvg_tok_find(t, buf, a_len + b_len);
        if (left < 0 || right < 0 || result < 0) {
            const char *which = left < 0 ? a : right < 0 ? b : buf;
            int wl = (int)(left < 0 ? a_len : right < 0 ? b_len : a_len + b_len);
            rc = fail(L, path, "\"%.*s\" is not in the vocabulary", wl > 60 ? 60 : wl, which);
            break;
        }
        /* A repeated pair keeps its first (best) rank. */
        if (!kvg_merges_get(&t->merges, left, right)
            && kvg_merges_put(&t->merges, left, right, (int32_t)i, result) != 0)
            rc = fail(L, path, "out of memory");
    }
    free(buf);
    return rc;
}

/* ---------------- special ids ---------------- */

static int32_t find_special(const struct kvg_tokenizer *t, const char *const *names)
{
    for (; *names; names++) {
        int32_t id = kvg_tok_find(t, *names, strlen(*names));
        if (id >= 0)
            return id;
    }
    return -1;
}

/* TemplateProcessing's "single" template: a special token before the sequence
 * is the BOS (and asked for by default), one after it the EOS. */
static void template_specials(const struct kvg_tokenizer *t, const json_t *pp,
                              int32_t *bos, int32_t *eos)
{
    if (!json_is_object(pp))
        return;
    const json_t *type = json_object_get(pp, "type");
    if (kvg_api_is_str(type, "Sequence")) {
        const json_t *list = json_object_get(pp, "processors");
        for (size_t i = 0; i < json_array_size(list); i++)
            template_specials(t, json_array_get(list, i), bos, eos);
        return;
    }
    if (!kvg_api_is_str(type, "TemplateProcessing"))
        return;
    const json_t *single = json_object_get(pp, "single");
    int seen_seq = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *e = json_array_get(single, i);
        const json_t *sp = json_object_get(e, "SpecialToken");
        if (json_object_get(e, "Sequence")) {
            seen_seq = 1;
            continue;
        }
        const json_t *name = json_object_get(sp, "id");
        if (!json_is_string(name))
            continue;
        int32_t id = kvg_tok_find(t, json_string_value(name), json_string_length(name));
        if (id < 0)
            continue;
        if (!seen_seq)
            *bos = id;
        else
            *eos = id;
    }
}

/* ---------------- the loader ---------------- */

static int load(hf_load *L, struct kvg_tokenizer *t, const json_t *root)
{
    if (!json_is_object(root))
        return fail(L, NULL, "not a tokenizer.json (top level is %s)", kvg_api_json_type(root));
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return fail(L, "model", "%s", model ? "expected an object" : "missing");
    const json_t *mtype = json_object_get(model, "type");
    if (mtype && !json_is_string(mtype))
        return fail(L, "model.type", "expected a string");
    if (mtype && !kvg_api_is_str(mtype, "BPE"))
        return fail(L, "model.type", "unsupported model type \"%s\" (only BPE is supported)",
                    json_string_value(mtype));
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab))
        return fail(L, "model.vocab", "%s", vocab ? "expected an object" : "missing");
    if (!json_is_array(merges))
        return fail(L, "model.merges", "%s", merges ? "expected an array" : "missing");
    const json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added))
        return fail(L, "added_tokens", "expected an array");
    if (!json_is_array(added))
        added = NULL;

    int byte_fallback, ignore_merges;
    if (require_empty_str(L, model, "continuing_subword_prefix", "model") != 0
        || require_empty_str(L, model, "end_of_word_suffix", "model") != 0
        || get_bool(L, model, "byte_fallback", "model", 0, &byte_fallback) != 0
        || get_bool(L, model, "ignore_merges", "model", 0, &ignore_merges) != 0)
        return -1;
    const json_t *unk_tok = json_object_get(model, "unk_token");
    if (unk_tok && !json_is_null(unk_tok) && !json_is_string(unk_tok))
        return fail(L, "model.unk_token", "expected a string");

    kvg_hf_pipe *P = &L->pipe;
    char why[320];
    if (kvg_hf_parse_normalizer(P, json_object_get(root, "normalizer"), "normalizer", why,
                                sizeof why) != 0
        || kvg_hf_parse_pretok(P, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", why,
                               sizeof why) != 0)
        return fail(L, NULL, "%s", why);

    int spm = P->spm_prepend || P->spm_replace || P->metaspace;
    if (P->byte_level && spm)
        return fail(L, "pre_tokenizer", "mixes ByteLevel with SentencePiece-style "
                    "\xe2\x96\x81 handling");
    if (!P->byte_level && !spm)
        return fail(L, "pre_tokenizer", "neither byte-level (ByteLevel) nor SentencePiece-"
                    "style (Metaspace, or Prepend/Replace \xe2\x96\x81 normalizers): "
                    "not supported");
    if (!P->byte_level && P->n_st)
        return fail(L, "pre_tokenizer", "a Split without ByteLevel is not supported");
    if (spm && !P->spm_replace && !P->metaspace)
        return fail(L, "normalizer", "Prepend(\"\xe2\x96\x81\") without Replace(\" \", "
                    "\"\xe2\x96\x81\") is not supported");

    json_int_t max_id;
    size_t count;
    if (scan_ids(L, vocab, added, &max_id, &count) != 0)
        return -1;
    size_t n = (size_t)max_id + 1;

    hf_piece *pieces = calloc(n, sizeof *pieces);
    if (!pieces)
        return fail(L, NULL, "out of memory");
    int rc = 0;
    {
        const char *key;
        size_t key_len;
        json_t *val;
        json_object_keylen_foreach((json_t *)vocab, key, key_len, val) {
            int r = put_piece(L, pieces, n, json_integer_value(val), key, key_len,
                              "model.vocab", "a piece");
            if (r == -2)
                r = fail(L, "model.vocab", "id %lld is used twice (\"%.40s\")",
                         (long long)json_integer_value(val), key);
            if (r != 0) {
                rc = -1;
                break;
            }
        }
    }
    /* An added token may restate a vocabulary piece or extend the vocabulary;
     * for an id it shares with a different piece, its text wins (as in HF). */
    for (size_t i = 0; rc == 0 && added && i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *c = json_object_get(a, "content");
        hf_piece *p = &pieces[json_integer_value(json_object_get(a, "id"))];
        p->s = json_string_value(c);
        p->len = json_string_length(c);
        p->set = 1;
    }

    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += pieces[i].len + 1;
    if (rc == 0 && kvg_tok_alloc(t, (int32_t)n) != 0)
        rc = fail(L, NULL, "out of memory");
    char *arena = rc == 0 ? malloc(total) : NULL;
    if (rc == 0 && !arena)
        rc = fail(L, NULL, "out of memory");
    if (rc != 0) {
        free(pieces);
        return -1;
    }
    t->arena = arena;
    for (size_t i = 0, off = 0; i < n; i++) {
        memcpy(arena + off, pieces[i].s ? pieces[i].s : "", pieces[i].len);
        arena[off + pieces[i].len] = '\0';
        t->piece[i] = arena + off;
        t->piece_len[i] = (uint32_t)pieces[i].len;
        t->type[i] = pieces[i].set ? KVG_TT_NORMAL : KVG_TT_UNUSED;
        off += pieces[i].len + 1;
    }
    free(pieces);

    t->norm = P->norm;
    if (P->byte_level) {
        t->kind = "hf-bpe";
        t->mode = KVG_TOK_BYTE_LEVEL;
        kvg_tok_set_stages(t, P->st, P->n_st);
        P->st = NULL;
        P->n_st = 0;
        t->bl_prefix_space = P->byte_level_prefix;
    } else {
        t->kind = "hf-spm";
        t->mode = KVG_TOK_SPM;
        t->pretok = KVG_PRETOK_NONE;
        if (P->metaspace) {
            t->add_dummy_prefix = P->metaspace_prefix != KVG_PREFIX_NONE;
            t->meta_prefix = P->metaspace_prefix;
            t->meta_split = P->metaspace_split;
        } else {
            t->add_dummy_prefix = P->spm_prepend;
        }
        t->byte_fallback = byte_fallback;
        if (byte_fallback)
            for (size_t i = 0; i < n; i++)
                if (t->type[i] == KVG_TT_NORMAL && is_byte_piece(t->piece[i], t->piece_len[i]))
                    t->type[i] = KVG_TT_BYTE;
    }
    t->ignore_merges = P->byte_level && ignore_merges;

    if (kvg_tok_build_index(t) != 0)
        return fail(L, NULL, "out of memory");

    if (unk_tok && json_is_string(unk_tok)) {
        t->unk = kvg_tok_find(t, json_string_value(unk_tok), json_string_length(unk_tok));
        if (t->unk < 0)
            return fail(L, "model.unk_token", "\"%.40s\" is not in the vocabulary",
                        json_string_value(unk_tok));
        t->type[t->unk] = KVG_TT_UNKNOWN;
    }

    if (added && json_array_size(added)) {
        size_t na = json_array_size(added);
        t->added = calloc(na, sizeof *t->added);
        if (!t->added)
            return fail(L, NULL, "out of memory");
        for (size_t i = 0; i < na; i++) {
            const json_t *a = json_array_get(added, i);
            int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
            int special, lstrip, rstrip, single_word;
            char path[64];
            snprintf(path, sizeof path, "added_tokens[%zu]", i);
            if (get_bool(L, a, "special", path, 0, &special) != 0
                || get_bool(L, a, "lstrip", path, 0, &lstrip) != 0
                || get_bool(L, a, "rstrip", path, 0, &rstrip) != 0
                || get_bool(L, a, "single_word", path, 0, &single_word) != 0)
                return -1;
            if (t->type[id] != KVG_TT_UNKNOWN)
                t->type[id] = special ? KVG_TT_CONTROL : KVG_TT_USER_DEFINED;
            t->added[t->n_added++] = (kvg_added_token){
                .id = id, .special = special, .text = t->piece[id], .len = t->piece_len[id],
                .lstrip = (uint8_t)lstrip, .rstrip = (uint8_t)rstrip,
                .single_word = (uint8_t)single_word,
            };
        }
    }

    if (load_merges(L, t, merges) != 0)
        return -1;

    static const char *const bos_names[] = {
        "<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "<|endoftext|>", NULL
    };
    static const char *const eos_names[] = {
        "</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "<|im_end|>", NULL
    };
    int32_t bos = -1, eos = -1;
    template_specials(t, json_object_get(root, "post_processor"), &bos, &eos);
    t->add_bos = bos >= 0;
    t->bos = bos >= 0 ? bos : find_special(t, bos_names);
    t->eos = eos >= 0 ? eos : find_special(t, eos_names);
    return 0;
}

int kvg_tok_load_hfjson(struct kvg_tokenizer *t, const unsigned char *data, size_t len,
                        const char *name, char *err, size_t err_len)
{
    hf_load L = { .name = name ? name : "tokenizer.json", .err = err, .err_len = err_len };
    json_error_t jerr;
    json_t *root = json_loadb((const char *)data, len, JSON_ALLOW_NUL, &jerr);
    if (!root)
        return fail(&L, NULL, "invalid JSON at line %d, column %d: %s", jerr.line,
                    jerr.column, jerr.text);
    int rc = load(&L, t, root);
    kvg_hf_pipe_free(&L.pipe);
    json_decref(root);
    return rc;
}
