/* The BPE merge (tok_bpe.c) and the encoder's working memory (tok_encode.c).
 * Internal to the tokenizer ("engine" in this project is the inference process). */
#ifndef KVG_TOK_MERGE_H
#define KVG_TOK_MERGE_H

#include "tok_internal.h"

typedef struct kvg_bpe_sym {
    int32_t id;                  /* -1 once merged into its left neighbour */
    int32_t prev, next;
    int32_t rank;                /* rank of the pair (this, next), -1 if none */
    int32_t result;              /* id that pair merges into */
} kvg_bpe_sym;

/* A cached word: its bytes at keys[key..key+len), its ids at ids[off..off+n). */
typedef struct kvg_word_cache_ent {
    uint32_t hash, len, key, off, n;    /* len == UINT32_MAX: empty */
} kvg_word_cache_ent;

/* Working memory of one encoding thread, kept between calls (tok_encode.c holds
 * one per thread). The caches belong to the tokenizer whose uid is `uid`. */
typedef struct kvg_tok_scratch {
    uint64_t uid;
    int32_t *init;               /* initial symbols of the word being merged */
    size_t init_cap;
    kvg_bpe_sym *sym;
    size_t sym_cap;
    uint64_t *heap;
    size_t heap_n, heap_cap;
    kvg_merge *pairs;            /* KVG_PAIR_CACHE recent merge lookups, or NULL */
    char *buf;                   /* byte-level text of a word (ignore_merges) */
    size_t buf_cap;
    char *frag;                  /* a fragment normalized or given its prefix space */
    size_t frag_cap;
    uint64_t *rq[65];            /* radix queue buckets (long words, monotone merges) */
    size_t rq_n[65], rq_cap[65];
    uint64_t rq_last;
    kvg_word_cache_ent *cache;   /* word -> ids for words not in t->word_index */
    uint32_t cache_mask, cache_count;
    kvg_ids cache_ids;
    char *keys;
    size_t keys_len, keys_cap;
} kvg_tok_scratch;

/* The merge table of a big vocabulary outgrows the CPU cache while words keep
 * asking about the same few thousand pairs: a direct-mapped copy of recent
 * answers (including "no merge") saves most trips to it. */
#define KVG_PAIR_CACHE 4096

/* Grows *p (elements of `elem` bytes) to hold at least `need`. 0 or -1. */
int kvg_tok_grow(void **p, size_t *cap, size_t need, size_t elem);
/* Makes room for `more` ids. 0 or -1. */
int kvg_ids_reserve(kvg_ids *a, size_t more);

/* Merges s->init[0..n) by t's merge table and appends the final ids to dst.
 * The pair cache must hold answers for t only (see kvg_bpe_reset_pairs). */
int kvg_bpe_merge(kvg_tok_scratch *s, const struct kvg_tokenizer *t, size_t n, kvg_ids *dst);
/* Forgets the pair cache (when the scratch moves to another tokenizer). */
void kvg_bpe_reset_pairs(kvg_tok_scratch *s);
/* Frees the buffers of s (not s). */
void kvg_tok_scratch_free(kvg_tok_scratch *s);

#endif
