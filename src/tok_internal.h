/* Internal representation shared by the tokenizer loaders and encoders.
 *
 * Every format is loaded into the same struct. There is ONE BPE merge
 * (tok_bpe.c): a list of symbols merged pairwise, always taking the pair with the
 * lowest rank (leftmost among equal ranks), found through a merge table
 * (left id, right id) -> (rank, result id), with a heap so that cost is
 * O(n log n). The formats differ only in
 *   - where the merge table comes from:
 *       SentencePiece by scores (llama2.c .bin, GGUF "llama" without merges):
 *         derived at load time from the vocabulary: for every piece p and every
 *         split p = a + b with a and b in the vocabulary, (a, b) -> p with
 *         rank = dense rank of score[p] (higher score, lower rank), so equal
 *         scores tie and the leftmost pair wins, exactly like the reference.
 *       merge lists (GGUF "gpt2" tokenizer.ggml.merges, tokenizer.json "merges"):
 *         rank = line index.
 *   - the initial symbols: SPM mode splits the text into UTF-8 characters (after
 *     the dummy prefix and ' ' -> U+2581), unknown characters become byte-fallback
 *     pieces <0xNN> (or unk); byte-level mode maps every byte to its GPT-2
 *     printable code point first.
 *   - pre-tokenization (byte-level: the file's splits, on the hand-written
 *     GPT-2 / Llama-3 / Qwen2 scanners of pretok.c or on PCRE2, pretok_re.c;
 *     SPM: none semantically, the whole text is one sequence; the encoder still
 *     merges it run by run where the vocabulary proves no merge can cross, see
 *     spm_join_space and spm_isolated, which gives the same ids).
 * The merge is in tok_bpe.c, the encoding around it (added tokens, runs,
 * caches) in tok_encode.c, their shared working memory in tok_merge.h.
 */
#ifndef KVG_TOK_INTERNAL_H
#define KVG_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "text_span.h"
#include "tokenizer.h"

enum kvg_tok_mode {
    KVG_TOK_SPM = 1,             /* SentencePiece-style BPE over characters */
    KVG_TOK_BYTE_LEVEL = 2       /* GPT-2 style byte-level BPE */
};

/* Token types (values as in GGUF tokenizer.ggml.token_type / llama.cpp). */
enum kvg_tok_type {
    KVG_TT_UNDEFINED = 0,
    KVG_TT_NORMAL = 1,
    KVG_TT_UNKNOWN = 2,
    KVG_TT_CONTROL = 3,
    KVG_TT_USER_DEFINED = 4,
    KVG_TT_UNUSED = 5,
    KVG_TT_BYTE = 6
};

/* Pre-tokenizer for byte-level vocabularies (implemented in pretok.c). */
enum kvg_pretok {
    KVG_PRETOK_NONE = 0,
    KVG_PRETOK_GPT2 = 1,         /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    KVG_PRETOK_LLAMA3 = 2,       /* Llama 3 / cl100k-style, digits in runs of 1-3 */
    KVG_PRETOK_QWEN2 = 3         /* like Llama 3 but single digits */
};

/* Unicode normalization applied to the text between added tokens. */
enum kvg_tok_norm {
    KVG_NORM_NONE = 0,
    KVG_NORM_NFC,
    KVG_NORM_NFKC
};

/* When a HF Metaspace pre-tokenizer prepends its "▁" (prepend_scheme): never,
 * to the fragment at the very start of the text, or to every fragment; in both
 * cases not to a fragment that already starts with one. */
enum kvg_tok_prefix {
    KVG_PREFIX_NONE = 0,
    KVG_PREFIX_META_FIRST,
    KVG_PREFIX_META_ALWAYS
};

/* How a split treats the text its pattern matches (HF SplitDelimiterBehavior). */
enum kvg_split_behavior {
    KVG_SPLIT_ISOLATED = 0,      /* matches and the text between them are pieces */
    KVG_SPLIT_REMOVED,           /* matches are dropped */
    KVG_SPLIT_MERGED_PREV,       /* a match joins the text before it */
    KVG_SPLIT_MERGED_NEXT,       /* a match joins the text after it */
    KVG_SPLIT_CONTIGUOUS         /* consecutive matches form one piece */
};

/* One stage of a pre-tokenizer pipeline (pretok_re.c): exactly one of scanner,
 * re and lit is set. */
typedef struct kvg_pretok_stage {
    int scanner;                 /* enum kvg_pretok: a hand-written scanner (Isolated) */
    void *re;                    /* a compiled regex (pcre2_code_8 *) */
    void *re_ascii;              /* the same without the newer Unicode ranges (faster), for
                                    pieces with no such character, on which both match
                                    alike; NULL: use re */
    char *lit;                   /* a literal string (HF Split on a String) */
    size_t lit_len;
    uint8_t behavior;            /* enum kvg_split_behavior */
    uint8_t invert;              /* the pattern marks what is kept, not what splits */
    uint8_t has_first;           /* re: first[] and pair[] are filled in */
    uint8_t first[32];           /* bytes a match can start with */
    uint8_t pair[128][16];       /* ASCII a, ASCII b: a match can start with "ab" */
} kvg_pretok_stage;

/* Open-addressing hash from piece bytes to id. */
typedef struct kvg_piece_index {
    int32_t *slots;              /* id or -1 */
    uint32_t mask;               /* capacity - 1 (power of two) */
} kvg_piece_index;

/* Open-addressing hash from (left, right) id pair to (rank, result). */
typedef struct kvg_merge {
    uint64_t key;                /* (uint64_t)left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t result;
} kvg_merge;

typedef struct kvg_merge_table {
    kvg_merge *slots;
    uint32_t mask;
    uint32_t count;
} kvg_merge_table;

/* Word index slot, 16 bytes so that a lookup touches one cache line: words of
 * up to 8 bytes are compared in place, longer ones in `keys`. */
typedef struct kvg_word_slot {
    uint32_t hash;
    uint32_t id_len;             /* id << 8 | len; UINT32_MAX = empty */
    uint64_t key;                /* len <= 8: the bytes, zero-padded; else offset in keys */
} kvg_word_slot;

typedef struct kvg_word_index {
    kvg_word_slot *slots;
    uint32_t mask;
    char *keys;
} kvg_word_index;

/* An added/special token matched literally in the text (KVG_ENC_PARSE_SPECIAL,
 * and for HF added tokens with "special": false always). */
typedef struct kvg_added_token {
    int32_t id;
    int special;                 /* only matched with KVG_ENC_PARSE_SPECIAL */
    uint8_t lstrip, rstrip;      /* HF: the match takes the whitespace before / after it */
    uint8_t single_word;         /* HF: only where no word character touches it */
    const char *text;            /* points into the piece storage */
    uint32_t len;
} kvg_added_token;

struct kvg_tokenizer {
    const char *kind;            /* see kvg_tokenizer_kind() */
    int mode;                    /* enum kvg_tok_mode */
    int pretok;                  /* enum kvg_pretok (byte-level only), when n_stages == 0 */
    kvg_pretok_stage *stages;    /* else the pre-tokenizer pipeline, in order (owned) */
    size_t n_stages;

    int32_t n_vocab;
    char **piece;                /* raw pieces, NUL-terminated (may contain NULs only via len) */
    uint32_t *piece_len;
    float *score;                /* SPM scores (NULL when the format has none) */
    uint8_t *type;               /* enum kvg_tok_type per id */
    unsigned char **bytes;       /* decoded bytes per id (see kvg_tokenizer_token_bytes) */
    uint32_t *bytes_len;

    kvg_piece_index index;
    kvg_merge_table merges;

    kvg_added_token *added;      /* by first byte, then longest first (see added_from) */
    size_t n_added;

    int32_t bos, eos, unk, pad;  /* -1 when absent */
    int add_dummy_prefix;        /* SPM: prepend ' ' (as U+2581) to the text */
    int byte_fallback;           /* SPM: unknown chars become <0xNN> pieces */
    int32_t byte_piece[256];     /* SPM: id of <0xNN>, or -1;
                                    byte-level: id of the piece for byte b */

    /* Storage owned by the tokenizer (freed by kvg_tokenizer_free). The strings
     * piece[i] and added[j].text must live inside these blocks (never malloc'd
     * one by one); the per-id arrays, score and added are freed as arrays. */
    void *arena;                 /* loaders may put all strings in one block */
    void *mapping;               /* or keep the loaded file bytes here */
    size_t mapping_len;

    /* Set by loaders (defaults from kvg_tok_alloc: 0). */
    int add_bos;                 /* the vocabulary asks for BOS by default (GGUF add_bos_token) */
    int ignore_merges;           /* byte-level: a pre-token that is itself a piece is emitted
                                    without merging (HF "ignore_merges", Llama 3) */
    int norm;                    /* enum kvg_tok_norm */
    int meta_prefix;             /* SPM: enum kvg_tok_prefix; KVG_PREFIX_NONE keeps the
                                    SentencePiece rule (add_dummy_prefix: every fragment) */
    int meta_split;              /* SPM: HF Metaspace "split": a piece starts at every space */
    int bl_prefix_space;         /* byte-level: a space before each fragment that does not
                                    start with one (HF ByteLevel add_prefix_space) */

    /* Derived by kvg_tok_finish (tok_vocab.c, tok_encode.c); loaders leave these alone. */
    uint64_t uid;                /* unique per loaded tokenizer: tags per-thread encoder caches */
    void *bytes_arena;           /* storage of bytes[] */
    int32_t spm_space;           /* SPM: id of the space piece ("\u2581", or " " in llama2.c
                                    files), -1 if none */
    int spm_space_u2581;         /* SPM: the space piece is U+2581, so a literal U+2581 in the
                                    text is a space too */
    int merge_monotone;          /* every merge ranks after the merges that make its operands,
                                    so a merge only creates pairs of a later rank (true for
                                    trained merge lists): long words can use a radix queue */
    uint8_t spm_join_space[129]; /* SPM: some mergeable piece has ASCII character c (128: any
                                    other character) right before a space, so a merge may
                                    join them; where none does, a run ends before the space */
    int spm_split;               /* SPM: no mergeable piece has a space right after a non-space,
                                    so merges never cross the start of a space run and the text
                                    can be merged run by run (exactly the same result) */
    int32_t ascii_id[128];       /* SPM: initial symbol of each ASCII character, -1 if none */
    uint8_t spm_isolated[128];   /* SPM: ASCII characters in no mergeable piece of two or more
                                    characters (e.g. '\n' in Llama 2): they never merge, so a run
                                    also ends before and after them */
    kvg_word_index word_index;   /* decoded bytes -> id, for pieces that the merge turns
                                    back into exactly themselves: a whole word (pre-token or
                                    SPM space run) found here is one token, no merging */
    uint32_t added_from[257];    /* added[added_from[b] .. added_from[b + 1]) start with byte b */
    uint64_t added_pair[1024];   /* bit a << 8 | b: some added token starts with bytes a, b
                                    (a one-byte token sets every b): most positions are
                                    ruled out without a string compare */
    uint32_t max_token_text;     /* most input bytes one token can stand for, 0 when the
                                    encoder may drop text (see kvg_tokenizer_min_tokens) */
    int refs;                    /* references (kvg_tokenizer_ref); atomic */
};

/* ---- tok_vocab.c: allocation, indexes, shared loader helpers ---- */

/* Allocates the per-id arrays for n pieces (zeroed; bos/eos/unk/pad = -1,
 * byte_piece[] = -1). Returns 0 or -1 (out of memory). */
int kvg_tok_alloc(struct kvg_tokenizer *t, int32_t n);
/* Builds t->index from the pieces. */
int kvg_tok_build_index(struct kvg_tokenizer *t);
int32_t kvg_tok_find(const struct kvg_tokenizer *t, const char *s, size_t len);

int kvg_merges_init(kvg_merge_table *m, uint32_t expected);
int kvg_merges_put(kvg_merge_table *m, int32_t left, int32_t right, int32_t rank, int32_t result);
const kvg_merge *kvg_merges_get(const kvg_merge_table *m, int32_t left, int32_t right);

/* SPM by scores: derives the merge table from the vocabulary (see above). Only
 * NORMAL (or UNDEFINED) pieces take part. Needs the index (builds it if absent). */
int kvg_tok_merges_from_scores(struct kvg_tokenizer *t);
/* Fills bytes/bytes_len for every id from piece, type and mode, plus byte_piece[]
 * and the other derived fields above; builds the index if absent and sorts
 * `added` longest first (tok_vocab.c). */
int kvg_tok_finish_vocab(struct kvg_tokenizer *t, char *err, size_t err_len);
/* kvg_tok_finish_vocab, then the word index and the uid (tok_encode.c, since the
 * word index runs the encoder). kvg_tokenizer_load* calls it after every loader, so
 * loaders need not (calling it twice is harmless). */
int kvg_tok_finish(struct kvg_tokenizer *t, char *err, size_t err_len);
/* Frees everything the struct owns (not the struct). */
void kvg_tok_release(struct kvg_tokenizer *t);
/* Fills t->added from the token types: CONTROL and UNKNOWN pieces as special,
 * USER_DEFINED as always matched (GGUF vocabularies, llama.cpp semantics). */
int kvg_tok_added_from_types(struct kvg_tokenizer *t);

/* Pieces a text can be made of (initial symbols and merge operands/results):
 * NORMAL and UNDEFINED. */
static inline int kvg_tok_mergeable(uint8_t type)
{
    return type == KVG_TT_NORMAL || type == KVG_TT_UNDEFINED;
}

static inline uint64_t kvg_tok_load64(const unsigned char *s)
{
    uint64_t v;
    __builtin_memcpy(&v, s, 8);
    return v;
}

static inline uint64_t kvg_tok_load32(const unsigned char *s)
{
    uint32_t v;
    __builtin_memcpy(&v, s, 4);
    return v;
}

static inline uint64_t kvg_tok_mix(uint64_t h, uint64_t a, uint64_t b)
{
    h = (h ^ a) * 0xFF51AFD7ED558CCDULL;
    h ^= h >> 32;
    h = (h ^ b) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 29);
}

/* Fast hash of a byte string (piece indexes, encoder caches). Short strings,
 * the common case, take two overlapping loads and never read outside s[0..n). */
static inline __attribute__((always_inline)) uint64_t kvg_tok_hash(const void *p, size_t n)
{
    const unsigned char *s = (const unsigned char *)p;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xC2B2AE3D27D4EB4FULL);

    if (n > 16) {
        const unsigned char *end = s + n;
        for (; end - s > 16; s += 16)
            h = kvg_tok_mix(h, kvg_tok_load64(s), kvg_tok_load64(s + 8));
        return kvg_tok_mix(h, kvg_tok_load64(end - 16), kvg_tok_load64(end - 8));
    }
    if (n >= 8)
        return kvg_tok_mix(h, kvg_tok_load64(s), kvg_tok_load64(s + n - 8));
    if (n >= 4)
        return kvg_tok_mix(h, kvg_tok_load32(s), kvg_tok_load32(s + n - 4));
    if (n > 0)
        return kvg_tok_mix(h, (uint64_t)s[0] | (uint64_t)s[n >> 1] << 8 | (uint64_t)s[n - 1] << 16, 0);
    return kvg_tok_mix(h, 0, 0);
}

/* ---- loaders: each returns 0, or -1 with err naming `name` ----
 * `data` is only valid during the call: whatever the tokenizer keeps must be
 * copied (into t->arena, or the whole input into t->mapping). */
int kvg_tok_load_llama2c(struct kvg_tokenizer *t, const unsigned char *data, size_t len,
                         const char *name, char *err, size_t err_len);
int kvg_tok_load_gguf(struct kvg_tokenizer *t, const unsigned char *data, size_t len,
                      const char *name, char *err, size_t err_len);
int kvg_tok_load_hfjson(struct kvg_tokenizer *t, const unsigned char *data, size_t len,
                        const char *name, char *err, size_t err_len);

/* ---- encoders ---- */
/* A growable array of ids (kvg_ids_push is in tok_bpe.c). */
typedef struct kvg_ids {
    int32_t *v;
    size_t n, cap;
} kvg_ids;
int kvg_ids_push(kvg_ids *a, int32_t id);
/* Words of up to this many symbols skip the heap (an array scan, same
 * result); tests set it to 0 to check the heap path alone. */
extern int kvg_tok_small_word;
/* Encodes valid UTF-8 text (the caller checked it) with flags KVG_ENC_*, appending
 * to out; no special token is recognised that overlaps one of the n_data data
 * spans (sorted, not overlapping). Returns 0, or -1 when out of memory.
 * tok_encode.c. Thread-safe: each thread keeps its own working memory and caches
 * (bounded, a few MB at most). */
int kvg_tok_encode(const struct kvg_tokenizer *t, const char *text, size_t len,
                   unsigned flags, const kvg_text_span *data, size_t n_data, kvg_ids *out);

/* ---- pretok.c ---- */
/* Calls emit(ctx, start, len) for each pre-token of s[0..n) (valid UTF-8), in order,
 * covering the whole input. Returns 0, or the first non-zero value emit returned. */
typedef int (*kvg_pretok_emit)(void *ctx, const char *s, size_t len);
int kvg_pretok_split(int kind, const char *s, size_t n, kvg_pretok_emit emit, void *ctx);

/* ---- pretok_re.c: pipelines of splits ---- */
/* The scanner (enum kvg_pretok) implementing exactly this regex text, or 0. */
int kvg_pretok_scanner_for(const char *re, size_t len);
/* A stage splitting by a regex (HF/Oniguruma syntax): a scanner when one
 * implements it, else PCRE2. 0, or -1 with a message in err. */
int kvg_pretok_stage_regex(kvg_pretok_stage *st, const char *re, size_t len, int behavior,
                           int invert, char *err, size_t err_len);
/* A stage splitting on a literal string. 0 or -1 (out of memory). */
int kvg_pretok_stage_literal(kvg_pretok_stage *st, const char *s, size_t len, int behavior,
                             int invert);
/* Frees n stages and the array. */
void kvg_pretok_stages_free(kvg_pretok_stage *st, size_t n);
/* Runs the pipeline over s[0..n) (valid UTF-8: the regex engine does not check),
 * calling emit for every final piece (non-empty, in order). Returns 0, the first
 * non-zero emit result, or -1 (out of memory, regex match error). Thread-safe. */
int kvg_pretok_run(const kvg_pretok_stage *st, size_t n_st, const char *s, size_t n,
                   kvg_pretok_emit emit, void *ctx);
/* Installs a pipeline on t (taking ownership of st): a lone scanner stage
 * becomes t->pretok, the fast path. */
void kvg_tok_set_stages(struct kvg_tokenizer *t, kvg_pretok_stage *st, size_t n);

/* ---- tok_pre.c ---- */
/* Sets t's pre-tokenizer (and the flags that go with it) for a GGUF
 * tokenizer.ggml.pre name: 0, 1 when the name is unknown (t unchanged), or -1
 * with a message in err. */
int kvg_tok_gguf_pre(struct kvg_tokenizer *t, const char *pre, size_t len, char *err,
                     size_t err_len);

/* GPT-2 byte <-> printable code point mapping (bytes_to_unicode). */
uint32_t kvg_byte_to_cp(unsigned char b);
int kvg_cp_to_byte(uint32_t cp);     /* -1 if cp is not in the mapping */

#endif
