/* A tokenizer.json's normalizer and pre_tokenizer, read into the encoder's
 * terms. What would change tokenization if ignored is refused with the JSON
 * path; the rest maps as follows:
 *   normalizer   NFC, NFKC (applied to each text fragment between added
 *                tokens, as HF does); Prepend("▁") and Replace(" " -> "▁"),
 *                the SentencePiece layout; Sequence of these.
 *   pre_tokenizer
 *                Split on a Regex (the file's own pattern: pretok_re.c) or a
 *                String, with any behavior and invert; Digits; Punctuation;
 *                Whitespace and WhitespaceSplit; ByteLevel (use_regex adds the
 *                GPT-2 split; add_prefix_space when it comes first, which makes
 *                it a space before each fragment); Metaspace; Sequence.
 * In SentencePiece mode the encoder keeps spaces as they are and reads them as
 * "▁", so a Split on a String holding a space after Replace(" " -> "▁") can
 * never match (Gemma 3 has one) and is dropped; other splits there are
 * refused. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_json.h"
#include "tok_hfpipe.h"

#define SPM_SPACE "\xe2\x96\x81"        /* U+2581 */

/* What HF's regex for ByteLevel(use_regex) and Whitespace are. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

__attribute__((format(printf, 4, 5)))
static int fail(char *err, size_t err_len, const char *path, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(err, err_len, "%s: %s", path, msg);
    return -1;
}


static int get_bool(const json_t *obj, const char *key, const char *path, int dflt, int *out,
                    char *err, size_t err_len)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return fail(err, err_len, path, "\"%s\" must be a boolean, not %s", key, kvg_api_json_type(v));
    *out = json_is_true(v);
    return 0;
}

/* The "type" string of a pipeline element. */
static const char *elem_type(const json_t *n, const char *path, char *err, size_t err_len)
{
    if (!json_is_object(n)) {
        fail(err, err_len, path, "expected an object, not %s", kvg_api_json_type(n));
        return NULL;
    }
    const json_t *type = json_object_get(n, "type");
    if (!json_is_string(type)) {
        fail(err, err_len, path, "missing \"type\"");
        return NULL;
    }
    return json_string_value(type);
}

/* ---------------- normalizer ---------------- */

int kvg_hf_parse_normalizer(kvg_hf_pipe *p, const json_t *n, const char *path, char *err,
                            size_t err_len)
{
    char sub[128];
    if (!n || json_is_null(n))
        return 0;
    const char *ty = elem_type(n, path, err, err_len);
    if (!ty)
        return -1;

    if (strcmp(ty, "Sequence") == 0) {
        const json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list))
            return fail(err, err_len, path, "Sequence without a \"normalizers\" array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
            if (kvg_hf_parse_normalizer(p, json_array_get(list, i), sub, err, err_len) != 0)
                return -1;
        }
        return 0;
    }
    if (strcmp(ty, "Prepend") == 0) {
        if (!kvg_api_is_str(json_object_get(n, "prepend"), SPM_SPACE))
            return fail(err, err_len, path, "Prepend of anything but \"" SPM_SPACE "\" is not supported");
        if (p->spm_replace)
            return fail(err, err_len, path, "Prepend after Replace is not supported");
        p->spm_prepend = 1;
        return 0;
    }
    if (strcmp(ty, "Replace") == 0) {
        const json_t *pat = json_object_get(n, "pattern");
        if (!json_is_object(pat) || !kvg_api_is_str(json_object_get(pat, "String"), " ")
            || !kvg_api_is_str(json_object_get(n, "content"), SPM_SPACE))
            return fail(err, err_len, path, "Replace other than \" \" -> \"" SPM_SPACE "\" is not supported");
        p->spm_replace = 1;
        return 0;
    }
    if (strcmp(ty, "NFC") == 0 || strcmp(ty, "NFKC") == 0) {
        int want = ty[2] == 'C' ? KVG_NORM_NFC : KVG_NORM_NFKC;
        /* NFC after NFKC changes nothing; NFKC after NFC is NFKC. */
        if (p->norm != KVG_NORM_NFKC)
            p->norm = want;
        if (p->spm_prepend || p->spm_replace)
            return fail(err, err_len, path, "%s after the SentencePiece normalizers is not supported", ty);
        return 0;
    }
    return fail(err, err_len, path, "normalizer type \"%s\" is not supported", ty);
}

/* ---------------- pre_tokenizer ---------------- */

static kvg_pretok_stage *new_stage(kvg_hf_pipe *p)
{
    if (p->n_st == p->cap_st) {
        size_t cap = p->cap_st ? p->cap_st * 2 : 4;
        kvg_pretok_stage *n = realloc(p->st, cap * sizeof *n);
        if (!n)
            return NULL;
        p->st = n;
        p->cap_st = cap;
    }
    return &p->st[p->n_st];
}

static int add_regex(kvg_hf_pipe *p, const char *re, size_t len, int behavior, int invert,
                     const char *path, char *err, size_t err_len)
{
    char why[200];
    kvg_pretok_stage *st = new_stage(p);
    if (!st)
        return fail(err, err_len, path, "out of memory");
    if (kvg_pretok_stage_regex(st, re, len, behavior, invert, why, sizeof why) < 0)
        return fail(err, err_len, path, "%s", why);
    p->n_st++;
    return 0;
}

static int parse_behavior(const json_t *n, const char *path, int *out, char *err, size_t err_len)
{
    static const struct {
        const char *name;
        int behavior;
    } names[] = {
        { "Isolated", KVG_SPLIT_ISOLATED }, { "Removed", KVG_SPLIT_REMOVED },
        { "MergedWithPrevious", KVG_SPLIT_MERGED_PREV }, { "MergedWithNext", KVG_SPLIT_MERGED_NEXT },
        { "Contiguous", KVG_SPLIT_CONTIGUOUS },
    };
    const json_t *b = json_object_get(n, "behavior");
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        /* Older files spell them in snake case. */
        char snake[32];
        size_t o = 0;
        for (const char *c = names[i].name; *c && o + 2 < sizeof snake; c++) {
            if (*c >= 'A' && *c <= 'Z') {
                if (o)
                    snake[o++] = '_';
                snake[o++] = (char)(*c - 'A' + 'a');
            } else {
                snake[o++] = *c;
            }
        }
        snake[o] = '\0';
        if (kvg_api_is_str(b, names[i].name) || kvg_api_is_str(b, snake)) {
            *out = names[i].behavior;
            return 0;
        }
    }
    return fail(err, err_len, path, "unknown Split behavior%s%s", json_is_string(b) ? " " : "",
                json_is_string(b) ? json_string_value(b) : "");
}

static int parse_split(kvg_hf_pipe *p, const json_t *n, const char *path, char *err,
                       size_t err_len)
{
    const json_t *pat = json_object_get(n, "pattern");
    const json_t *re = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
    const json_t *lit = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
    int behavior, invert;

    if (!json_is_string(re) && !json_is_string(lit))
        return fail(err, err_len, path, "Split needs a \"pattern\": {\"Regex\": ...} or {\"String\": ...}");
    if (parse_behavior(n, path, &behavior, err, err_len) != 0
        || get_bool(n, "invert", path, 0, &invert, err, err_len) != 0)
        return -1;
    if (!p->byte_level && (p->spm_replace || p->metaspace)) {
        /* SentencePiece: the split sees "▁" where the text has spaces. */
        if (json_is_string(lit) && memchr(json_string_value(lit), ' ', json_string_length(lit))
            && p->spm_replace && !invert) {
            p->n_dropped++;
            return 0;
        }
        return fail(err, err_len, path, "a Split in a SentencePiece-style pipeline is not supported");
    }
    if (json_is_string(re))
        return add_regex(p, json_string_value(re), json_string_length(re), behavior, invert,
                         path, err, err_len);
    kvg_pretok_stage *st = new_stage(p);
    if (!st || kvg_pretok_stage_literal(st, json_string_value(lit), json_string_length(lit),
                                        behavior, invert) < 0)
        return fail(err, err_len, path, "out of memory");
    p->n_st++;
    return 0;
}

int kvg_hf_parse_pretok(kvg_hf_pipe *p, const json_t *n, const char *path, char *err,
                        size_t err_len)
{
    char sub[128];
    if (!n || json_is_null(n))
        return 0;
    const char *ty = elem_type(n, path, err, err_len);
    if (!ty)
        return -1;

    if (strcmp(ty, "Sequence") == 0) {
        const json_t *list = json_object_get(n, "pretokenizers");
        if (!json_is_array(list))
            return fail(err, err_len, path, "Sequence without a \"pretokenizers\" array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
            if (kvg_hf_parse_pretok(p, json_array_get(list, i), sub, err, err_len) != 0)
                return -1;
        }
        return 0;
    }
    if (p->metaspace)
        return fail(err, err_len, path, "a pre-tokenizer after Metaspace is not supported");
    if (strcmp(ty, "Split") == 0)
        return parse_split(p, n, path, err, err_len);
    if (strcmp(ty, "Digits") == 0) {
        int single;
        if (get_bool(n, "individual_digits", path, 0, &single, err, err_len) != 0)
            return -1;
        /* HF: char::is_numeric, i.e. general category N*. */
        return single ? add_regex(p, "\\p{N}", 5, KVG_SPLIT_ISOLATED, 0, path, err, err_len)
                      : add_regex(p, "\\p{N}+", 6, KVG_SPLIT_ISOLATED, 0, path, err, err_len);
    }
    if (strcmp(ty, "Punctuation") == 0) {
        int behavior = KVG_SPLIT_ISOLATED;
        if (json_object_get(n, "behavior") && parse_behavior(n, path, &behavior, err, err_len) != 0)
            return -1;
        /* HF: Unicode punctuation or ASCII punctuation (some of which Unicode
         * calls symbols), one character per match. */
        static const char re[] = "[\\p{P}!-/:-@\\[-`{-~]";
        return add_regex(p, re, sizeof re - 1, behavior, 0, path, err, err_len);
    }
    if (strcmp(ty, "Whitespace") == 0) {
        /* HF: the pieces are the matches of \w+|[^\w\s]+ */
        static const char re[] = "\\w+|[^\\w\\s]+";
        return add_regex(p, re, sizeof re - 1, KVG_SPLIT_REMOVED, 1, path, err, err_len);
    }
    if (strcmp(ty, "WhitespaceSplit") == 0)
        return add_regex(p, "\\s+", 3, KVG_SPLIT_REMOVED, 0, path, err, err_len);
    if (strcmp(ty, "ByteLevel") == 0) {
        int prefix, use_regex;
        if (get_bool(n, "add_prefix_space", path, 1, &prefix, err, err_len) != 0
            || get_bool(n, "use_regex", path, 1, &use_regex, err, err_len) != 0)
            return -1;
        if (p->byte_level)
            return fail(err, err_len, path, "ByteLevel appears twice");
        if (prefix && p->n_st)
            return fail(err, err_len, path, "ByteLevel with \"add_prefix_space\": true after "
                        "another split is not supported");
        p->byte_level = 1;
        p->byte_level_prefix = prefix;
        return use_regex ? add_regex(p, RE_GPT2, sizeof RE_GPT2 - 1, KVG_SPLIT_ISOLATED, 0, path,
                                     err, err_len)
                         : 0;
    }
    if (strcmp(ty, "Metaspace") == 0) {
        const json_t *scheme = json_object_get(n, "prepend_scheme");
        int prefix, split;
        if (!kvg_api_is_str(json_object_get(n, "replacement"), SPM_SPACE))
            return fail(err, err_len, path, "Metaspace replacement other than \"" SPM_SPACE "\" is not supported");
        if (get_bool(n, "add_prefix_space", path, 1, &prefix, err, err_len) != 0
            || get_bool(n, "split", path, 1, &split, err, err_len) != 0)
            return -1;
        if (p->n_st || p->byte_level)
            return fail(err, err_len, path, "Metaspace after another pre-tokenizer is not supported");
        p->metaspace_prefix = prefix ? KVG_PREFIX_META_ALWAYS : KVG_PREFIX_NONE;
        if (scheme && !json_is_null(scheme)) {
            if (kvg_api_is_str(scheme, "never"))
                p->metaspace_prefix = KVG_PREFIX_NONE;
            else if (kvg_api_is_str(scheme, "first"))
                p->metaspace_prefix = KVG_PREFIX_META_FIRST;
            else if (kvg_api_is_str(scheme, "always"))
                p->metaspace_prefix = KVG_PREFIX_META_ALWAYS;
            else
                return fail(err, err_len, path, "unknown Metaspace prepend_scheme");
        }
        p->metaspace = 1;
        p->metaspace_split = split;
        return 0;
    }
    return fail(err, err_len, path, "pre_tokenizer type \"%s\" is not supported", ty);
}

void kvg_hf_pipe_free(kvg_hf_pipe *p)
{
    kvg_pretok_stages_free(p->st, p->n_st);
    p->st = NULL;
    p->n_st = p->cap_st = 0;
}
