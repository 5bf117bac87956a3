/* tokenizer.json pipeline pieces on small hand-built files, ids worked out by
 * hand from Hugging Face's semantics:
 *   - NFC / NFKC normalizers applied to the text;
 *   - ByteLevel add_prefix_space (a space before each fragment not starting
 *     with one) and use_regex;
 *   - Split on a String with a behavior, Digits with and without
 *     individual_digits, a regex no scanner knows;
 *   - added tokens' lstrip / rstrip / single_word;
 *   - Metaspace prepend_scheme first / always / never and split;
 *   - Gemma 3's layout: Replace(" " -> "▁") and a Split on " " that can never
 *     match, no dummy prefix.
 * Byte-level vocabularies here give byte b the id b, so expected ids read as
 * bytes. */
#include <jansson.h>
#include <stdint.h>

#include "tap.h"
#include "tok_internal.h"
#include "tokenizer.h"
#include "utf8.h"

#define SP "\xe2\x96\x81"              /* U+2581 */

/* ---- byte-level files ---- */

static json_t *byte_vocab(const char *const *extra)
{
    json_t *v = json_object();
    for (int b = 0; b < 256; b++) {
        unsigned char u[4];
        int n = kvg_utf8_encode(kvg_byte_to_cp((unsigned char)b), u);
        json_object_setn_new(v, (const char *)u, (size_t)n, json_integer(b));
    }
    for (int i = 0; extra && extra[i]; i++)
        json_object_set_new(v, extra[i], json_integer(256 + i));
    return v;
}

static json_t *str_array(const char *const *s)
{
    json_t *a = json_array();
    for (int i = 0; s && s[i]; i++)
        json_array_append_new(a, json_string(s[i]));
    return a;
}

static kvg_tokenizer *load_json(json_t *root, const char *what)
{
    char err[400];
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    kvg_tokenizer *t = text ? kvg_tokenizer_load_mem(text, strlen(text), what, err, sizeof err) : NULL;
    free(text);
    if (!ok(t != NULL, "%s loads", what))
        diag("  %s", err);
    return t;
}

static kvg_tokenizer *byte_level(json_t *normalizer, json_t *pre, const char *const *pieces,
                                 const char *const *merges, json_t *added, const char *what)
{
    json_t *root = json_pack("{s:o, s:o, s:{s:s, s:o, s:o}}",
                             "normalizer", normalizer ? normalizer : json_null(),
                             "pre_tokenizer", pre,
                             "model", "type", "BPE", "vocab", byte_vocab(pieces),
                             "merges", str_array(merges));
    if (added)
        json_object_set_new(root, "added_tokens", added);
    return load_json(root, what);
}

static json_t *bl(int prefix, int use_regex)
{
    return json_pack("{s:s, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", prefix,
                     "use_regex", use_regex);
}

static json_t *seq(json_t *a, json_t *b)
{
    return json_pack("{s:s, s:[o,o]}", "type", "Sequence", "pretokenizers", a, b);
}

static json_t *added_tok(int id, const char *content, int special, int lstrip, int rstrip,
                         int single_word)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
                     "special", special, "lstrip", lstrip, "rstrip", rstrip,
                     "single_word", single_word, "normalized", 0);
}

static void expect(const kvg_tokenizer *t, const char *text, unsigned flags, const int32_t *want,
                   size_t n_want, const char *what)
{
    int32_t *ids = NULL;
    size_t n = 0;
    char err[200];
    if (!t) {
        ok(0, "%s (no tokenizer)", what);
        return;
    }
    int rc = kvg_tokenizer_encode(t, text, strlen(text), flags, &ids, &n, err, sizeof err);
    int same = rc == 0 && n == n_want && memcmp(ids, want, n * sizeof *ids) == 0;
    if (!ok(same, "%s", what)) {
        char buf[512];
        size_t o = 0;
        for (size_t i = 0; rc == 0 && i < n && o + 12 < sizeof buf; i++)
            o += (size_t)snprintf(buf + o, sizeof buf - o, " %d", ids[i]);
        buf[o] = '\0';
        diag("  got%s%s", rc == 0 ? buf : " error: ", rc == 0 ? "" : err);
    }
    free(ids);
}

#define EXPECT(t, text, flags, what, ...) do { \
        static const int32_t w_[] = { __VA_ARGS__ }; \
        expect(t, text, flags, w_, sizeof w_ / sizeof *w_, what); \
    } while (0)

static void test_normalizers(void)
{
    kvg_tokenizer *t = byte_level(json_pack("{s:s}", "type", "NFC"), bl(0, 0), NULL, NULL, NULL,
                                  "NFC file");
    EXPECT(t, "e\xcc\x81", 0, "NFC composes e + U+0301", 0xC3, 0xA9);
    EXPECT(t, "\xef\xac\x81", 0, "NFC keeps the fi ligature", 0xEF, 0xAC, 0x81);
    kvg_tokenizer_free(t);
    t = byte_level(json_pack("{s:s, s:[{s:s}]}", "type", "Sequence", "normalizers", "type", "NFKC"),
                   bl(0, 0), NULL, NULL, NULL, "NFKC file");
    EXPECT(t, "\xef\xac\x81" "e\xcc\x81", 0, "NFKC: ligature split, e + U+0301 composed",
           'f', 'i', 0xC3, 0xA9);
    kvg_tokenizer_free(t);
    t = byte_level(NULL, bl(0, 0), NULL, NULL, NULL, "no normalizer");
    EXPECT(t, "e\xcc\x81", 0, "without a normalizer the text stays", 'e', 0xCC, 0x81);
    kvg_tokenizer_free(t);
}

/* The encoder's lower bound on tokens must hold when NFC shortens the text:
 * Hangul jamo L V T (9 bytes) compose into one syllable, here one token. */
static void test_bound_nfc(void)
{
    unsigned char a[4], b[4], c[4];
    char p1[16], p2[24], m1[24], m2[32];
    int la = kvg_utf8_encode(kvg_byte_to_cp(0xEA), a), lb = kvg_utf8_encode(kvg_byte_to_cp(0xB0), b);
    int lc = kvg_utf8_encode(kvg_byte_to_cp(0x81), c);
    snprintf(p1, sizeof p1, "%.*s%.*s", la, a, lb, b);
    snprintf(p2, sizeof p2, "%s%.*s", p1, lc, c);
    snprintf(m1, sizeof m1, "%.*s %.*s", la, a, lb, b);
    snprintf(m2, sizeof m2, "%s %.*s", p1, lc, c);
    const char *pieces[] = { p1, p2, NULL }, *merges[] = { m1, m2, NULL };
    kvg_tokenizer *t = byte_level(json_pack("{s:s}", "type", "NFC"), bl(0, 0), pieces, merges, NULL,
                                  "NFC file with a Hangul syllable piece");
    static const char jamo2[] = "\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8";
    EXPECT(t, jamo2, 0, "two composed syllables, two tokens", 257, 257);
    ok(t && kvg_tokenizer_min_tokens(t, sizeof jamo2 - 1) <= 2, "min_tokens(18 bytes) = %zu <= 2",
       t ? kvg_tokenizer_min_tokens(t, sizeof jamo2 - 1) : 0);
    kvg_tokenizer_free(t);
}

static void test_byte_level_prefix(void)
{
    static const char *const pieces[] = { "\xc4\xa0h", NULL };     /* "Ġh" = 256 */
    static const char *const merges[] = { "\xc4\xa0 h", NULL };
    json_t *added = json_pack("[o]", added_tok(300, "<s>", 1, 0, 0, 0));
    kvg_tokenizer *t = byte_level(NULL, bl(1, 1), pieces, merges, added, "ByteLevel add_prefix_space");
    EXPECT(t, "hi", 0, "prefix space added", 256, 'i');
    EXPECT(t, " hi", 0, "no second prefix space", 256, 'i');
    EXPECT(t, "x<s>hi", KVG_ENC_PARSE_SPECIAL, "a prefix space on every fragment", ' ', 'x', 300, 256, 'i');
    kvg_tokenizer_free(t);
}

static void test_splits(void)
{
    static const char *const pieces[] = { "-a", "12", NULL };      /* 256, 257 */
    static const char *const merges[] = { "- a", "1 2", NULL };
    json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "String", "-",
                              "behavior", "MergedWithNext", "invert", 0);
    kvg_tokenizer *t = byte_level(NULL, seq(split, bl(0, 0)), pieces, merges, NULL,
                                  "Split String MergedWithNext");
    EXPECT(t, "x-a", 0, "the '-' joins the piece after it", 'x', 256);
    kvg_tokenizer_free(t);
    split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "String", "-",
                      "behavior", "Isolated", "invert", 0);
    t = byte_level(NULL, seq(split, bl(0, 0)), pieces, merges, NULL, "Split String Isolated");
    EXPECT(t, "x-a", 0, "the '-' is a piece of its own", 'x', '-', 'a');
    kvg_tokenizer_free(t);
    t = byte_level(NULL, seq(json_pack("{s:s, s:b}", "type", "Digits", "individual_digits", 1), bl(0, 0)),
                   pieces, merges, NULL, "Digits individual");
    EXPECT(t, "12", 0, "digits one by one", '1', '2');
    kvg_tokenizer_free(t);
    t = byte_level(NULL, seq(json_pack("{s:s, s:b}", "type", "Digits", "individual_digits", 0), bl(0, 0)),
                   pieces, merges, NULL, "Digits runs");
    EXPECT(t, "12", 0, "a digit run together", 257);
    kvg_tokenizer_free(t);
    /* a regex no scanner implements: runs on PCRE2 */
    split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", "[a-z]|\\d+",
                      "behavior", "Isolated", "invert", 0);
    t = byte_level(NULL, seq(split, bl(0, 0)), pieces, merges, NULL, "Split Regex");
    EXPECT(t, "x12-a", 0, "the file's own regex", 'x', 257, '-', 'a');
    kvg_tokenizer_free(t);
}

static void test_added_flags(void)
{
    json_t *added = json_pack("[o,o,o]", added_tok(300, "<a>", 0, 1, 0, 0),
                              added_tok(301, "<b>", 0, 0, 1, 0), added_tok(302, "cd", 0, 0, 0, 1));
    kvg_tokenizer *t = byte_level(NULL, bl(0, 0), NULL, NULL, added, "added token flags");
    EXPECT(t, "x <a> y", 0, "lstrip takes the space before", 'x', 300, ' ', 'y');
    EXPECT(t, "x <b>  y", 0, "rstrip takes the spaces after", 'x', ' ', 301, 'y');
    EXPECT(t, "cd cdx xcd cd", 0, "single_word only between non-word characters",
           302, ' ', 'c', 'd', 'x', ' ', 'x', 'c', 'd', ' ', 302);
    ok(t && kvg_tokenizer_max_token_bytes(t) == 0, "lstrip/rstrip tokens: no bound on bytes per token");
    kvg_tokenizer_free(t);
}

/* ---- SentencePiece-style files ---- */

static kvg_tokenizer *spm(json_t *normalizer, json_t *pre, const char *what)
{
    json_t *vocab = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i}", "<unk>", 0, SP, 1, "a", 2, "b", 3,
                              SP "a", 4, SP SP, 5);
    json_t *root = json_pack("{s:o, s:o, s:[o], s:{s:s, s:s, s:o, s:[s,s]}}",
                             "normalizer", normalizer ? normalizer : json_null(),
                             "pre_tokenizer", pre ? pre : json_null(),
                             "added_tokens", added_tok(6, "<x>", 1, 0, 0, 0),
                             "model", "type", "BPE", "unk_token", "<unk>", "vocab", vocab,
                             "merges", SP " " SP, SP " a");
    return load_json(root, what);
}

static json_t *metaspace(const char *scheme, int split)
{
    return json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", SP,
                     "prepend_scheme", scheme, "split", split);
}

static void test_metaspace(void)
{
    kvg_tokenizer *t = spm(NULL, metaspace("first", 0), "Metaspace first, no split");
    EXPECT(t, "a  b", 0, "merges across the spaces", 4, 5, 3);
    EXPECT(t, " a", 0, "no prefix before a leading space", 4);
    EXPECT(t, "<x>a", KVG_ENC_PARSE_SPECIAL, "first: no prefix after a leading token", 6, 2);
    kvg_tokenizer_free(t);
    t = spm(NULL, metaspace("first", 1), "Metaspace first, split");
    EXPECT(t, "a  b", 0, "split: a piece starts at every space", 4, 1, 1, 3);
    kvg_tokenizer_free(t);
    t = spm(NULL, metaspace("always", 1), "Metaspace always");
    EXPECT(t, "<x>a", KVG_ENC_PARSE_SPECIAL, "always: prefix after a token too", 6, 4);
    kvg_tokenizer_free(t);
    t = spm(NULL, metaspace("never", 1), "Metaspace never");
    EXPECT(t, "a b", 0, "never: no prefix", 2, 1, 3);
    kvg_tokenizer_free(t);
    /* Gemma 3 */
    t = spm(json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "String", " ", "content", SP),
            json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "String", " ",
                      "behavior", "MergedWithPrevious", "invert", 0),
            "Gemma 3 layout");
    EXPECT(t, "a  b", 0, "Gemma 3: no dummy prefix, one piece", 2, 5, 3);
    kvg_tokenizer_free(t);
}

int main(void)
{
    test_normalizers();
    test_bound_nfc();
    test_byte_level_prefix();
    test_splits();
    test_added_flags();
    test_metaspace();
    return done_testing();
}
