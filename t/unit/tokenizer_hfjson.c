/* Hugging Face tokenizer.json loader.
 *
 * Round trip: tokenizer.json files are built here from the two GGUF
 * vocabularies of the test suite, the way Hugging Face's converters lay them out
 *   - Llama 2 (SentencePiece BPE): Prepend/Replace normalizer, byte_fallback,
 *     merges derived from the piece scores exactly as transformers'
 *     SentencePieceExtractor does (written as [left, right] pairs);
 *   - GPT-2 (byte-level BPE): ByteLevel pre-tokenizer, the GGUF merge list
 *     (written as "left right" strings); and the same vocabulary again behind a
 *     Llama-3-style Sequence[Split(regex), ByteLevel(use_regex=false)];
 * then loaded through kvg_tokenizer_load and checked to tokenize every
 * reference vector like the reference (.out) and like the GGUF path, and to
 * decode back to the input. Then small hand-written files for the other
 * shapes, and malformed ones, which must fail with a message naming the file. */
#include <jansson.h>
#include <stdint.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_testing.h"
#include "tap.h"
#include "tok_internal.h"
#include "tokenizer.h"
#include "tokenizer_testing.h"

static char tmpdir[] = "/tmp/kvg-hfjson-XXXXXX";

/* ---------------- reference vectors ---------------- */

typedef struct vectors {
    char *inp_buf, *out_buf;
    char *text[128];
    size_t text_len[128];
    char *ids[128];              /* space-separated expected ids */
    size_t n;
} vectors;

static int load_vectors(const char *gguf_path, vectors *v)
{
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char path[600];
    size_t len;
    memset(v, 0, sizeof *v);
    snprintf(path, sizeof path, "%s.inp", gguf_path);
    v->inp_buf = slurp(path, &len);
    snprintf(path, sizeof path, "%s.out", gguf_path);
    v->out_buf = slurp(path, NULL);
    if (!v->inp_buf || !v->out_buf)
        return -1;
    char *p = v->inp_buf, *end = p + len, *q;
    while (v->n < 128 && (q = memmem(p, (size_t)(end - p), sep, sizeof sep - 1))) {
        v->text[v->n] = p;
        v->text_len[v->n] = (size_t)(q - p);
        v->n++;
        p = q + sizeof sep - 1;
    }
    char *line = v->out_buf;
    for (size_t i = 0; i < v->n; i++) {
        if (!line)
            return -1;
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        v->ids[i] = line;
        line = nl ? nl + 1 : NULL;
    }
    return 0;
}

static void free_vectors(vectors *v)
{
    free(v->inp_buf);
    free(v->out_buf);
}

static void ids_to_str(const int32_t *ids, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && o + 12 < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, " %d", ids[i]);
}

/* ---------------- building tokenizer.json from GGUF ---------------- */

static int gguf_strings(const kvg_gguf *g, const char *key, const kvg_gguf_kv **kv)
{
    *kv = kvg_gguf_get_arr(g, key, KVG_GGUF_STRING);
    return *kv != NULL;
}

static json_t *vocab_object(const kvg_gguf_kv *tokens)
{
    json_t *vocab = json_object();
    for (uint64_t i = 0; i < tokens->arr_n; i++) {
        kvg_gguf_str s;
        if (kvg_gguf_arr_str(tokens, i, &s) != 0) {
            json_decref(vocab);
            return NULL;
        }
        json_object_setn_new_nocheck(vocab, s.s, s.len, json_integer((json_int_t)i));
    }
    return vocab;
}

static json_t *added_token(int32_t id, const char *content, size_t len, int special)
{
    return json_pack("{s:i, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
                     len, "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", !special,
                     "special", special);
}

static int write_json(json_t *root, const char *file, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", tmpdir, file);
    int rc = json_dump_file(root, path, JSON_COMPACT);
    json_decref(root);
    return rc;
}

typedef struct cand {
    int32_t l, r;
    float score;
    size_t seq;
} cand;

static int cmp_local(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    if (a->l != b->l)
        return a->l < b->l ? -1 : 1;
    return (a->r > b->r) - (a->r < b->r);
}

/* sorted(merges, key=score, reverse=True), which is stable. */
static int cmp_score(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return (a->seq > b->seq) - (a->seq < b->seq);
}

/* transformers' SentencePieceExtractor: for every piece in id order, every split
 * into two pieces of the vocabulary (at character boundaries), sorted by the ids
 * of the halves; then all of them stably sorted by the piece's score, best first. */
static json_t *merges_from_scores(const kvg_gguf_kv *tokens, const kvg_gguf_kv *scores,
                                  const kvg_tokenizer *vocab)
{
    size_t n = 0, cap = 1 << 16;
    cand *c = malloc(cap * sizeof *c);
    for (uint64_t id = 0; c && id < tokens->arr_n; id++) {
        kvg_gguf_str s;
        double score;
        if (kvg_gguf_arr_str(tokens, id, &s) != 0 || kvg_gguf_arr_f64(scores, id, &score) != 0)
            break;
        size_t first = n;
        for (size_t k = 1; k < s.len; k++) {
            if (((unsigned char)s.s[k] & 0xC0) == 0x80)
                continue;
            int32_t l = kvg_tokenizer_find_piece(vocab, s.s, k);
            int32_t r = kvg_tokenizer_find_piece(vocab, s.s + k, s.len - k);
            if (l < 0 || r < 0)
                continue;
            if (n == cap) {
                cand *nc = realloc(c, (cap *= 2) * sizeof *c);
                if (!nc) {
                    free(c);
                    return NULL;
                }
                c = nc;
            }
            c[n++] = (cand){ l, r, (float)score, 0 };
        }
        qsort(c + first, n - first, sizeof *c, cmp_local);
    }
    if (!c)
        return NULL;
    for (size_t i = 0; i < n; i++)
        c[i].seq = i;
    qsort(c, n, sizeof *c, cmp_score);
    json_t *merges = json_array();
    for (size_t i = 0; i < n; i++) {
        size_t ll, rl;
        const char *l = kvg_tokenizer_piece(vocab, c[i].l, &ll);
        const char *r = kvg_tokenizer_piece(vocab, c[i].r, &rl);
        json_array_append_new(merges, json_pack("[s%, s%]", l, ll, r, rl));
    }
    free(c);
    return merges;
}

/* Llama 2 layout (as in hf-internal-testing/llama-tokenizer). */
static int build_spm_json(const char *gguf_path, const kvg_tokenizer *gg, char *out, size_t cap)
{
    char err[256];
    kvg_gguf *g = kvg_gguf_open(gguf_path, err, sizeof err);
    if (!g) {
        diag("%s", err);
        return -1;
    }
    const kvg_gguf_kv *tokens, *scores = kvg_gguf_get_arr(g, "tokenizer.ggml.scores", -1);
    const kvg_gguf_kv *types = kvg_gguf_get_arr(g, "tokenizer.ggml.token_type", -1);
    if (!gguf_strings(g, "tokenizer.ggml.tokens", &tokens) || !scores || !types) {
        kvg_gguf_free(g);
        return -1;
    }
    json_t *added = json_array();
    for (uint64_t i = 0; i < tokens->arr_n; i++) {
        int64_t ty;
        kvg_gguf_str s;
        if (kvg_gguf_arr_i64(types, i, &ty) == 0 && (ty == KVG_TT_UNKNOWN || ty == KVG_TT_CONTROL)
            && kvg_gguf_arr_str(tokens, i, &s) == 0)
            json_array_append_new(added, added_token((int32_t)i, s.s, s.len, 1));
    }
    json_t *model = json_pack("{s:s, s:n, s:s, s:n, s:n, s:b, s:b, s:o, s:o}",
                              "type", "BPE", "dropout", "unk_token", "<unk>",
                              "continuing_subword_prefix", "end_of_word_suffix",
                              "fuse_unk", 1, "byte_fallback", 1,
                              "vocab", vocab_object(tokens),
                              "merges", merges_from_scores(tokens, scores, gg));
    json_t *root = json_pack(
        "{s:s, s:n, s:n, s:o, s:{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}, s:n,"
        " s:{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}]},"
        " s:{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]}, s:o}",
        "version", "1.0", "truncation", "padding", "added_tokens", added,
        "normalizer", "type", "Sequence", "normalizers",
        "type", "Prepend", "prepend", "\xe2\x96\x81",
        "type", "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81",
        "pre_tokenizer",
        "post_processor", "type", "TemplateProcessing", "single",
        "SpecialToken", "id", "<s>", "type_id", 0, "Sequence", "id", "A", "type_id", 0,
        "decoder", "type", "Sequence", "decoders",
        "type", "Replace", "pattern", "String", "\xe2\x96\x81", "content", " ",
        "type", "ByteFallback", "type", "Fuse",
        "type", "Strip", "content", " ", "start", 1, "stop", 0,
        "model", model);
    kvg_gguf_free(g);
    if (!root)
        return -1;
    return write_json(root, "llama-spm.json", out, cap);
}

/* GPT-2 layout; with `split` the regex comes from a Split pre-tokenizer
 * followed by ByteLevel(use_regex=false), as Llama 3 / Qwen2 files do. */
static int build_bpe_json(const char *gguf_path, int split, char *out, size_t cap)
{
    static const char gpt2_re[] =
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
    char err[256];
    kvg_gguf *g = kvg_gguf_open(gguf_path, err, sizeof err);
    if (!g) {
        diag("%s", err);
        return -1;
    }
    const kvg_gguf_kv *tokens, *merges_kv;
    const kvg_gguf_kv *types = kvg_gguf_get_arr(g, "tokenizer.ggml.token_type", -1);
    if (!gguf_strings(g, "tokenizer.ggml.tokens", &tokens)
        || !gguf_strings(g, "tokenizer.ggml.merges", &merges_kv) || !types) {
        kvg_gguf_free(g);
        return -1;
    }
    json_t *merges = json_array();
    for (uint64_t i = 0; i < merges_kv->arr_n; i++) {
        kvg_gguf_str s;
        if (kvg_gguf_arr_str(merges_kv, i, &s) == 0)
            json_array_append_new(merges, json_stringn(s.s, s.len));
    }
    json_t *added = json_array();
    for (uint64_t i = 0; i < tokens->arr_n; i++) {
        int64_t ty;
        kvg_gguf_str s;
        if (kvg_gguf_arr_i64(types, i, &ty) == 0 && ty == KVG_TT_CONTROL
            && kvg_gguf_arr_str(tokens, i, &s) == 0)
            json_array_append_new(added, added_token((int32_t)i, s.s, s.len, 1));
    }
    json_t *bytelevel = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                                  "add_prefix_space", 0, "trim_offsets", 1,
                                  "use_regex", !split);
    json_t *pretok = split
        ? json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence",
                    "pretokenizers", "type", "Split", "pattern", "Regex", gpt2_re,
                    "behavior", "Isolated", "invert", 0, bytelevel)
        : bytelevel;
    json_t *model = json_pack("{s:s, s:n, s:n, s:s, s:s, s:b, s:b, s:o, s:o}",
                              "type", "BPE", "dropout", "unk_token",
                              "continuing_subword_prefix", "", "end_of_word_suffix", "",
                              "fuse_unk", 0, "byte_fallback", 0,
                              "vocab", vocab_object(tokens), "merges", merges);
    json_t *root = json_pack(
        "{s:s, s:n, s:n, s:o, s:n, s:o, s:{s:s, s:b, s:b, s:b}, s:{s:s, s:b, s:b, s:b}, s:o}",
        "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
        "pre_tokenizer", pretok,
        "post_processor", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 0,
        "use_regex", 1,
        "decoder", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1,
        "use_regex", 1,
        "model", model);
    kvg_gguf_free(g);
    if (!root)
        return -1;
    return write_json(root, split ? "gpt2-split.json" : "gpt2.json", out, cap);
}

/* ---------------- round trip ---------------- */

static void check_against(const char *label, const kvg_tokenizer *hf, const kvg_tokenizer *gg,
                          const vectors *v)
{
    char err[256], got[4096], want_gg[4096];
    size_t ref_ok = 0, gguf_ok = 0, dec_ok = 0;
    for (size_t i = 0; i < v->n; i++) {
        int32_t *ids = NULL, *ids2 = NULL;
        size_t n = 0, n2 = 0;
        char *dec = NULL;
        size_t dec_len = 0;
        if (kvg_tokenizer_encode(hf, v->text[i], v->text_len[i], 0, &ids, &n, err,
                                 sizeof err) != 0) {
            diag("%s: vector %zu: %s", label, i, err);
            continue;
        }
        ids_to_str(ids, n, got, sizeof got);
        if (strcmp(got, v->ids[i]) == 0)
            ref_ok++;
        else
            diag("%s: vector %zu \"%.*s\":\n#   got  %s\n#   want %s", label, i,
                 (int)(v->text_len[i] > 40 ? 40 : v->text_len[i]), v->text[i], got, v->ids[i]);
        if (kvg_tokenizer_encode(gg, v->text[i], v->text_len[i], 0, &ids2, &n2, err,
                                 sizeof err) == 0) {
            ids_to_str(ids2, n2, want_gg, sizeof want_gg);
            if (strcmp(got, want_gg) == 0)
                gguf_ok++;
        }
        if (kvg_tokenizer_decode(hf, ids, n, &dec, &dec_len, err, sizeof err) == 0
            && dec_len == v->text_len[i] && memcmp(dec, v->text[i], dec_len) == 0)
            dec_ok++;
        else
            diag("%s: vector %zu does not decode back", label, i);
        free(ids);
        free(ids2);
        free(dec);
    }
    is_int(ref_ok, v->n, "%s: every vector tokenizes like the reference", label);
    is_int(gguf_ok, v->n, "%s: every vector tokenizes like the GGUF path", label);
    is_int(dec_ok, v->n, "%s: every vector decodes back to its text", label);
}

static void check_same_vocab(const char *label, const kvg_tokenizer *hf, const kvg_tokenizer *gg)
{
    is_int(kvg_tokenizer_vocab_size(hf), kvg_tokenizer_vocab_size(gg), "%s: vocab size", label);
    is_int(kvg_tokenizer_bos(hf), kvg_tokenizer_bos(gg), "%s: BOS as in the GGUF", label);
    is_int(kvg_tokenizer_eos(hf), kvg_tokenizer_eos(gg), "%s: EOS as in the GGUF", label);
    int32_t n = kvg_tokenizer_vocab_size(gg), bad_piece = 0, bad_bytes = 0;
    for (int32_t id = 0; id < n; id++) {
        size_t l1, l2;
        const char *p1 = kvg_tokenizer_piece(hf, id, &l1), *p2 = kvg_tokenizer_piece(gg, id, &l2);
        if (!p1 || !p2 || l1 != l2 || memcmp(p1, p2, l1) != 0)
            bad_piece++;
        const unsigned char *b1 = kvg_tokenizer_token_bytes(hf, id, &l1);
        const unsigned char *b2 = kvg_tokenizer_token_bytes(gg, id, &l2);
        if (!b1 || !b2 || l1 != l2 || memcmp(b1, b2, l1) != 0) {
            if (bad_bytes++ < 3)
                diag("%s: id %d decodes to %zu bytes, GGUF %zu", label, id, l1, l2);
        }
    }
    is_int(bad_piece, 0, "%s: every id has the GGUF piece", label);
    is_int(bad_bytes, 0, "%s: every id decodes to the GGUF bytes", label);
}

static void round_trip(const char *vocab_name, int which)
{
    char gguf_path[512], json_path[600], err[512];
    vectors v;
    snprintf(gguf_path, sizeof gguf_path, "%s/tokenizers/vectors/%s", shared_dir(), vocab_name);
    if (!ok(load_vectors(gguf_path, &v) == 0 && v.n > 0, "%s: reference vectors", vocab_name))
        return;
    kvg_tokenizer *gg = kvg_tokenizer_load(gguf_path, err, sizeof err);
    if (!ok(gg != NULL, "%s: GGUF loads", vocab_name)) {
        diag("%s", err);
        free_vectors(&v);
        return;
    }
    int built = which == 0 ? build_spm_json(gguf_path, gg, json_path, sizeof json_path)
                           : build_bpe_json(gguf_path, which == 2, json_path, sizeof json_path);
    const char *label = which == 0 ? "hf llama-spm" : which == 1 ? "hf gpt-2" : "hf gpt-2 (Split)";
    if (ok(built == 0, "%s: tokenizer.json written", label)) {
        kvg_tokenizer *hf = kvg_tokenizer_load(json_path, err, sizeof err);
        if (ok(hf != NULL, "%s: loads", label)) {
            is_str(kvg_tokenizer_kind(hf), which == 0 ? "hf-spm" : "hf-bpe", "%s: kind", label);
            if (which == 0)
                ok(hf->add_dummy_prefix && hf->byte_fallback && hf->add_bos,
                   "%s: dummy prefix, byte fallback, BOS by default", label);
            else
                ok(hf->pretok == KVG_PRETOK_GPT2 && !hf->add_bos,
                   "%s: GPT-2 pre-tokenizer, no BOS by default", label);
            check_same_vocab(label, hf, gg);
            check_against(label, hf, gg, &v);
            kvg_tokenizer_free(hf);
        } else {
            diag("%s", err);
        }
        unlink(json_path);
    }
    kvg_tokenizer_free(gg);
    free_vectors(&v);
}

/* ---------------- small hand-written files ---------------- */

static kvg_tokenizer *load_str(const char *json, const char *name, char *err, size_t err_len)
{
    err[0] = '\0';
    return kvg_tokenizer_load_mem(json, strlen(json), name, err, err_len);
}

/* A toy Llama-3-style byte-level file: regex recognised, ignore_merges, added
 * tokens special and not, BOS from the post-processor template. */
static void test_llama3_shape(void)
{
    static const char *fmt =
        "{\"added_tokens\":["
        " {\"id\":9,\"content\":\"<|begin_of_text|>\",\"special\":true},"
        " {\"id\":10,\"content\":\"<|end_of_text|>\",\"special\":true},"
        " {\"id\":11,\"content\":\"<tool>\",\"special\":false}],"
        "\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
        " {\"type\":\"Split\",\"pattern\":{\"Regex\":\"%s\"},\"behavior\":\"Isolated\",\"invert\":false},"
        " {\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]},"
        "\"post_processor\":{\"type\":\"Sequence\",\"processors\":["
        " {\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":false,\"use_regex\":true},"
        " {\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|begin_of_text|>\",\"type_id\":0}},"
        "  {\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]}]},"
        "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"byte_fallback\":false,"
        " \"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"\\u0120\":3,\"ab\":4,\"abc\":5,\"\\u0120a\":6,\"1\":7,\"<\":8},"
        " \"merges\":[\"a b\",[\"ab\",\"c\"],\"\\u0120 a\"]}}";
    static const char llama3_re[] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}|"
        " ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";
    static const char qwen2_re[] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}|"
        " ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";
    char json[4096], err[512];

    snprintf(json, sizeof json, fmt, llama3_re);
    kvg_tokenizer *t = load_str(json, "toy-llama3.json", err, sizeof err);
    if (!ok(t != NULL, "toy Llama 3 file loads")) {
        diag("%s", err);
        return;
    }
    is_str(kvg_tokenizer_kind(t), "hf-bpe", "kind hf-bpe");
    is_int(t->pretok, KVG_PRETOK_LLAMA3, "Llama 3 regex recognised");
    ok(t->ignore_merges, "ignore_merges carried");
    is_int(kvg_tokenizer_vocab_size(t), 12, "added tokens extend the vocabulary");
    is_int(kvg_tokenizer_bos(t), 9, "BOS from the TemplateProcessing");
    ok(t->add_bos, "BOS asked for by the template");
    is_int(kvg_tokenizer_eos(t), 10, "EOS <|end_of_text|>");
    is_int(t->type[9], KVG_TT_CONTROL, "special added token is CONTROL");
    is_int(t->type[11], KVG_TT_USER_DEFINED, "non-special added token is USER_DEFINED");

    int32_t *ids = NULL;
    size_t n = 0;
    char got[256];
    if (kvg_tokenizer_encode(t, "abc a<tool>", 11, 0, &ids, &n, err, sizeof err) == 0) {
        ids_to_str(ids, n, got, sizeof got);
        is_str(got, " 5 6 11", "merges in rank order, non-special added token always matched");
    } else
        ok(0, "encode: %s", err);
    free(ids);
    ids = NULL;
    if (kvg_tokenizer_encode(t, "<|begin_of_text|>a", 18, KVG_ENC_PARSE_SPECIAL, &ids, &n,
                             err, sizeof err) == 0) {
        ids_to_str(ids, n, got, sizeof got);
        is_str(got, " 9 0", "special token matched with KVG_ENC_PARSE_SPECIAL");
    } else
        ok(0, "encode: %s", err);
    free(ids);
    kvg_tokenizer_free(t);

    snprintf(json, sizeof json, fmt, qwen2_re);
    t = load_str(json, "toy-qwen2.json", err, sizeof err);
    ok(t && t->pretok == KVG_PRETOK_QWEN2, "Qwen2 regex recognised");
    kvg_tokenizer_free(t);
}

/* Older SentencePiece-BPE layout: Metaspace pre-tokenizer, no normalizer. */
static void test_metaspace_shape(void)
{
    char err[512];
    static const char json[] =
        "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
        " {\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":2,\"content\":\"</s>\",\"special\":true}],"
        "\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"add_prefix_space\":true},"
        "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,"
        " \"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0x41>\":3,\"\\u2581\":4,\"h\":5,\"i\":6,"
        "  \"hi\":7,\"\\u2581hi\":8},"
        " \"merges\":[\"h i\",\"\\u2581 hi\"]}}";
    kvg_tokenizer *t = load_str(json, "toy-metaspace.json", err, sizeof err);
    if (!ok(t != NULL, "Metaspace SentencePiece file loads")) {
        diag("%s", err);
        return;
    }
    is_str(kvg_tokenizer_kind(t), "hf-spm", "kind hf-spm");
    ok(t->add_dummy_prefix && t->byte_fallback, "dummy prefix and byte fallback");
    is_int(t->unk, 0, "unk from model.unk_token");
    is_int(t->type[3], KVG_TT_BYTE, "<0x41> is a byte piece");
    is_int(kvg_tokenizer_bos(t), 1, "BOS <s> by name");
    is_int(kvg_tokenizer_eos(t), 2, "EOS </s> by name");
    int32_t *ids = NULL;
    size_t n = 0;
    char got[256];
    if (kvg_tokenizer_encode(t, "hi hiA", 6, 0, &ids, &n, err, sizeof err) == 0) {
        ids_to_str(ids, n, got, sizeof got);
        is_str(got, " 8 8 3", "dummy prefix, merges, byte fallback");
    } else
        ok(0, "encode: %s", err);
    free(ids);
    kvg_tokenizer_free(t);
}

static void expect_error(const char *json, const char *want1, const char *want2, const char *what)
{
    char err[512];
    kvg_tokenizer *t = load_str(json, "bad.json", err, sizeof err);
    int good = !t && strstr(err, "bad.json") && strstr(err, want1)
               && (!want2 || strstr(err, want2));
    ok(good, "%s -> error", what);
    if (!good)
        diag("  message: %s", t ? "(loaded!)" : err);
    kvg_tokenizer_free(t);
}

#define SPM_PIPE "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[" \
    "{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"}," \
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},"
#define BL_PIPE "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},"

static void test_errors(void)
{
    expect_error("{\"model\": {\"type\": \"BPE\", ", "invalid JSON", NULL, "truncated JSON");
    expect_error("{\"model\": 5}", "model", "expected an object", "model not an object");
    expect_error("{\"version\":\"1.0\"}", "model", "missing", "missing model");
    expect_error("{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}",
                 "model.type", "unsupported model type \"Unigram\"", "Unigram");
    expect_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}",
                 "unsupported model type \"WordPiece\"", NULL, "WordPiece");
    expect_error("{" BL_PIPE "\"model\":{\"type\":\"BPE\",\"merges\":[]}}",
                 "model.vocab", "missing", "missing vocab");
    expect_error("{" BL_PIPE "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}",
                 "model.merges", "missing", "missing merges");
    expect_error("{" BL_PIPE "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":{}}}",
                 "model.merges", "expected an array", "merges not an array");
    expect_error("{" BL_PIPE "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"
                 "\"merges\":[\"a b\",\"ab\"]}}",
                 "model.merges[1]", "left right", "merge without a space");
    expect_error("{" BL_PIPE "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"
                 "\"merges\":[[\"a\",\"b\"],[\"a\",\"c\"]]}}",
                 "model.merges[1]", "\"c\" is not in the vocabulary", "merge of an unknown piece");
    expect_error("{" BL_PIPE "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},"
                 "\"merges\":[\"a b\"]}}",
                 "model.merges[0]", "\"ab\" is not in the vocabulary", "merge result not in vocab");
    expect_error("{" BL_PIPE "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},"
                 "\"merges\":[[\"a\"]]}}",
                 "model.merges[0]", NULL, "merge pair of one");
    expect_error("{" BL_PIPE "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"},\"merges\":[]}}",
                 "model.vocab", "not an integer", "id not an integer");
    expect_error("{" BL_PIPE "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}}",
                 "model.vocab", "used twice", "duplicate id");
    expect_error("{" BL_PIPE "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":2000000000},"
                 "\"merges\":[]}}",
                 "model.vocab", "out of range", "huge id");
    expect_error("{" BL_PIPE "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":9000000},"
                 "\"merges\":[]}}",
                 "model.vocab", "sparse", "sparse ids");
    expect_error("{" BL_PIPE "\"added_tokens\":[{\"id\":-1,\"content\":\"x\"}],"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                 "added_tokens[0]", "id", "bad added token id");
    expect_error("{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                 "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\\\\w+\"},\"behavior\":\"Isolated\"},"
                 "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                 "pre_tokenizer.pretokenizers[0]", "does not compile", "bad regex");
    expect_error("{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                 "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[\\\\p{L}&&[^a]]+\"},\"behavior\":\"Isolated\"},"
                 "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                 "pre_tokenizer.pretokenizers[0]", "intersection", "regex class intersection");
    expect_error("{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                 "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"},"
                 "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                 "pre_tokenizer.pretokenizers[0]", "unknown Split behavior Sideways", "bad behavior");
    expect_error("{\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                 "pre_tokenizer", "\"BertPreTokenizer\" is not supported", "BERT pre-tokenizer");
    expect_error("{\"pre_tokenizer\":{\"type\":\"Whitespace\"},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                 "pre_tokenizer", "neither byte-level", "Whitespace without ByteLevel");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                 "neither byte-level", NULL, "no pre-tokenizer or normalizer");
    expect_error("{\"normalizer\":{\"type\":\"Lowercase\"}," BL_PIPE
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                 "normalizer", "\"Lowercase\" is not supported", "Lowercase normalizer");
    expect_error("{" BL_PIPE "\"model\":{\"type\":\"BPE\",\"continuing_subword_prefix\":\"##\","
                 "\"vocab\":{\"a\":0},\"merges\":[]}}",
                 "continuing_subword_prefix", NULL, "subword prefix");
    expect_error("{" SPM_PIPE "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\","
                 "\"vocab\":{\"a\":0},\"merges\":[]}}",
                 "model.unk_token", "not in the vocabulary", "unknown unk_token");
    expect_error("{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                 "{\"type\":\"Digits\",\"individual_digits\":true},"
                 "{\"type\":\"ByteLevel\",\"add_prefix_space\":true}]},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                 "add_prefix_space", NULL, "ByteLevel add_prefix_space after a split");

    /* From a file: the message names the path. */
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/broken.json", tmpdir);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]", f);
        fclose(f);
    }
    kvg_tokenizer *t = kvg_tokenizer_load(path, err, sizeof err);
    ok(!t && strstr(err, path), "malformed file -> NULL, message names %s", path);
    if (t || !strstr(err, path))
        diag("  message: %s", err);
    kvg_tokenizer_free(t);
    unlink(path);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        ok(0, "mkdtemp");
        return done_testing();
    }
    round_trip("ggml-vocab-llama-spm.gguf", 0);
    round_trip("ggml-vocab-gpt-2.gguf", 1);
    round_trip("ggml-vocab-gpt-2.gguf", 2);
    test_llama3_shape();
    test_metaspace_shape();
    test_errors();
    rmdir(tmpdir);
    return done_testing();
}
