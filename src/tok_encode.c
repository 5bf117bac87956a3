/* Encoding around the BPE merge (tok_bpe.c).
 *
 * Added/special tokens are cut out of the text first. SPM text is then split
 * into runs that no merge can cross (see spm_join_space and spm_isolated), byte-level
 * text into pre-tokens (pretok.c); each such word is merged on its own, with
 * exactly the result merging the whole text would give.
 *
 * Words repeat, so two shortcuts come before the merge, both exact:
 *   - t->word_index: words that are a single piece (checked at load time to be
 *     what the merge makes of them);
 *   - a word cache of merge results, kept per thread between calls (with the
 *     other working memory) and dropped when the thread moves to another
 *     tokenizer or the cache fills up. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "nfc.h"
#include "tok_merge.h"
#include "utf8.h"

/* Words longer than this are not cached: they rarely repeat. */
#define CACHE_MAX_LEN 64
/* Bounds on what one thread keeps between calls. */
#define CACHE_MAX_WORDS (1u << 15)
#define CACHE_MAX_IDS (1u << 18)
#define KEEP_MAX_SYMBOLS (1u << 16)

typedef struct enc {
    const struct kvg_tokenizer *t;
    kvg_ids *out;
    kvg_tok_scratch *s;
} enc;

/* ---- per-thread scratch ---- */

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;
static __thread kvg_tok_scratch *tls_scratch;

static void scratch_destroy(void *p)
{
    kvg_tok_scratch_free(p);
    free(p);
}

static void scratch_key_init(void)
{
    scratch_key_ok = pthread_key_create(&scratch_key, scratch_destroy) == 0;
}

static kvg_tok_scratch *thread_scratch(void)
{
    if (tls_scratch)
        return tls_scratch;
    pthread_once(&scratch_once, scratch_key_init);
    kvg_tok_scratch *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    /* The key frees it when the thread exits. */
    if (scratch_key_ok)
        pthread_setspecific(scratch_key, s);
    tls_scratch = s;
    return s;
}

static void cache_clear(kvg_tok_scratch *s)
{
    if (s->cache)
        memset(s->cache, 0xff, ((size_t)s->cache_mask + 1) * sizeof *s->cache);
    s->cache_count = 0;
    s->cache_ids.n = 0;
    s->keys_len = 0;
}

/* Points the caches of s at t, dropping what they knew about another tokenizer. */
static void scratch_bind(kvg_tok_scratch *s, const struct kvg_tokenizer *t)
{
    if (s->uid == t->uid)
        return;
    kvg_bpe_reset_pairs(s);
    cache_clear(s);
    s->uid = t->uid;
}

/* Big buffers from an unusually long word are not kept. */
static void scratch_trim(kvg_tok_scratch *s)
{
    if (s->sym_cap > KEEP_MAX_SYMBOLS) {
        free(s->sym);
        free(s->heap);
        s->sym = NULL;
        s->heap = NULL;
        s->sym_cap = s->heap_cap = 0;
    }
    if (s->init_cap > KEEP_MAX_SYMBOLS) {
        free(s->init);
        s->init = NULL;
        s->init_cap = 0;
    }
    for (int b = 0; b < 65; b++)
        if (s->rq_cap[b] > KEEP_MAX_SYMBOLS) {
            free(s->rq[b]);
            s->rq[b] = NULL;
            s->rq_cap[b] = s->rq_n[b] = 0;
        }
    if (s->buf_cap > KEEP_MAX_SYMBOLS) {
        free(s->buf);
        s->buf = NULL;
        s->buf_cap = 0;
    }
    if (s->frag_cap > KEEP_MAX_SYMBOLS) {
        free(s->frag);
        s->frag = NULL;
        s->frag_cap = 0;
    }
}

/* ---- word cache ---- */

static inline int same_bytes(const char *a, const char *b, size_t n)
{
    /* Words are short: comparing inline beats a call to memcmp. */
    while (n >= 8) {
        if (kvg_tok_load64((const unsigned char *)a) != kvg_tok_load64((const unsigned char *)b))
            return 0;
        a += 8;
        b += 8;
        n -= 8;
    }
    while (n--)
        if (*a++ != *b++)
            return 0;
    return 1;
}

/* The entry for w[0..n), or the empty slot where it belongs (NULL without a table). */
static inline kvg_word_cache_ent *cache_find(kvg_tok_scratch *s, const char *w, size_t n, uint32_t hash)
{
    if (!s->cache)
        return NULL;
    uint32_t h = hash & s->cache_mask;
    for (;;) {
        kvg_word_cache_ent *c = &s->cache[h];
        if (c->len == UINT32_MAX || (c->hash == hash && c->len == n && same_bytes(s->keys + c->key, w, n)))
            return c;
        h = (h + 1) & s->cache_mask;
    }
}

static int cache_grow(kvg_tok_scratch *s)
{
    uint32_t cap = s->cache ? (s->cache_mask + 1) * 2 : 1024;
    kvg_word_cache_ent *n = malloc((size_t)cap * sizeof *n);
    if (!n)
        return -1;
    memset(n, 0xff, (size_t)cap * sizeof *n);
    if (s->cache) {
        for (uint32_t i = 0; i <= s->cache_mask; i++) {
            kvg_word_cache_ent *c = &s->cache[i];
            if (c->len == UINT32_MAX)
                continue;
            uint32_t h = c->hash & (cap - 1);
            while (n[h].len != UINT32_MAX)
                h = (h + 1) & (cap - 1);
            n[h] = *c;
        }
        free(s->cache);
    }
    s->cache = n;
    s->cache_mask = cap - 1;
    return 0;
}

/* Appends the cached ids of w[0..n): 1, or 0 on a miss, -1 out of memory. */
static inline int cache_hit(enc *e, const char *w, size_t n, uint32_t hash)
{
    kvg_tok_scratch *s = e->s;
    kvg_word_cache_ent *c = cache_find(s, w, n, hash);
    if (!c || c->len == UINT32_MAX)
        return 0;
    if (kvg_ids_reserve(e->out, c->n) < 0)
        return -1;
    const int32_t *src = s->cache_ids.v + c->off;
    int32_t *dst = e->out->v + e->out->n;
    for (uint32_t i = 0; i < c->n; i++)
        dst[i] = src[i];
    e->out->n += c->n;
    return 1;
}

/* Remembers that w[0..n) encoded to out->v[from..]. */
static int cache_put(enc *e, const char *w, size_t n, uint32_t hash, size_t from)
{
    kvg_tok_scratch *s = e->s;
    size_t cnt = e->out->n - from;

    if (s->cache_count >= CACHE_MAX_WORDS || s->cache_ids.n + cnt > CACHE_MAX_IDS)
        cache_clear(s);
    if ((s->cache_count + 1) * 2 > (s->cache ? s->cache_mask + 1 : 0) && cache_grow(s) < 0)
        return -1;
    if (kvg_ids_reserve(&s->cache_ids, cnt + 1) < 0
        || kvg_tok_grow((void **)&s->keys, &s->keys_cap, s->keys_len + n, 1) < 0)
        return -1;
    kvg_word_cache_ent *c = cache_find(s, w, n, hash);
    memcpy(s->cache_ids.v + s->cache_ids.n, e->out->v + from, cnt * sizeof(int32_t));
    memcpy(s->keys + s->keys_len, w, n);
    c->hash = hash;
    c->len = (uint32_t)n;
    c->key = (uint32_t)s->keys_len;
    c->off = (uint32_t)s->cache_ids.n;
    c->n = (uint32_t)cnt;
    s->cache_ids.n += cnt;
    s->keys_len += n;
    s->cache_count++;
    return 0;
}

/* ---- initial symbols ---- */

static int is_spm_space(const struct kvg_tokenizer *t, const unsigned char *s, size_t n, size_t i)
{
    if (s[i] == ' ')
        return 1;
    return t->spm_space_u2581 && s[i] == 0xE2 && i + 2 < n && s[i + 1] == 0x96 && s[i + 2] == 0x81;
}

/* Appends the SPM initial symbols of s[0..n) to sc->init from position k;
 * returns the new count, or -1 when out of memory. */
static long spm_symbols(kvg_tok_scratch *sc, const struct kvg_tokenizer *t,
                        const unsigned char *s, size_t n, size_t k)
{
    /* A character yields at most one symbol per byte (byte fallback). */
    if (kvg_tok_grow((void **)&sc->init, &sc->init_cap, k + n + 1, sizeof *sc->init) < 0)
        return -1;
    int32_t *out = sc->init;
    for (size_t i = 0; i < n;) {
        int32_t id;
        size_t len;
        if (s[i] < 0x80) {
            id = t->ascii_id[s[i]];
            len = 1;
        } else {
            int l = kvg_utf8_seq_len(s[i]);
            len = l > 0 && (size_t)l <= n - i ? (size_t)l : 1;
            id = kvg_tok_find(t, (const char *)s + i, len);
            if (id >= 0 && !kvg_tok_mergeable(t->type[id]))
                id = -1;
        }
        if (id >= 0) {
            out[k++] = id;
        } else {
            int all = t->byte_fallback;
            for (size_t j = 0; j < len && all; j++)
                all = t->byte_piece[s[i + j]] >= 0;
            if (all) {
                for (size_t j = 0; j < len; j++)
                    out[k++] = t->byte_piece[s[i + j]];
            } else if (t->unk >= 0)
                out[k++] = t->unk;
        }
        i += len;
    }
    return (long)k;
}

/* ---- words ---- */

/* Appends what the merge itself makes of one word (no shortcuts). */
static int word_merge(kvg_tok_scratch *sc, const struct kvg_tokenizer *t, const char *w, size_t n,
                       kvg_ids *out)
{
    const unsigned char *u = (const unsigned char *)w;

    if (t->mode == KVG_TOK_SPM) {
        long k = spm_symbols(sc, t, u, n, 0);
        return k < 0 ? -1 : kvg_bpe_merge(sc, t, (size_t)k, out);
    }
    if (t->ignore_merges) {
        /* The word's own piece, if the vocabulary has it, wins over merging. */
        if (kvg_tok_grow((void **)&sc->buf, &sc->buf_cap, n * 2, 1) < 0)
            return -1;
        size_t b = 0;
        for (size_t i = 0; i < n; i++)
            b += (size_t)kvg_utf8_encode(kvg_byte_to_cp(u[i]), (unsigned char *)sc->buf + b);
        int32_t id = kvg_tok_find(t, sc->buf, b);
        if (id >= 0 && kvg_tok_mergeable(t->type[id]))
            return kvg_ids_push(out, id);
    }
    if (kvg_tok_grow((void **)&sc->init, &sc->init_cap, n, sizeof *sc->init) < 0)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_piece[u[i]];
        if (id < 0)
            id = t->unk;
        if (id >= 0)
            sc->init[k++] = id;
    }
    return kvg_bpe_merge(sc, t, k, out);
}

/* The first n <= 8 bytes of w, zero-padded. */
static inline uint64_t short_key(const char *w, size_t n)
{
    const unsigned char *u = (const unsigned char *)w;
    if (n >= 4) {
        /* Two overlapping loads; the second is shifted past what the first had. */
        uint64_t lo = kvg_tok_load32(u), hi = kvg_tok_load32(u + n - 4);
        return n == 4 ? lo : lo | hi >> (8 * (8 - n)) << 32;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)u[i] << (8 * i);
    return v;
}

static inline int32_t word_lookup(const struct kvg_tokenizer *t, const char *w, size_t n, uint32_t hash)
{
    const kvg_word_index *ix = &t->word_index;
    if (!ix->slots || n > 255)
        return -1;
    uint64_t key = n <= 8 ? short_key(w, n) : 0;
    uint32_t h = hash & ix->mask;
    for (;;) {
        const kvg_word_slot *sl = &ix->slots[h];
        if (sl->id_len == UINT32_MAX)
            return -1;
        if (sl->hash == hash && (sl->id_len & 0xFF) == n
            && (n <= 8 ? sl->key == key : same_bytes(ix->keys + sl->key, w, n)))
            return (int32_t)(sl->id_len >> 8);
        h = (h + 1) & ix->mask;
    }
}

static inline int push(kvg_ids *out, int32_t id)
{
    if (__builtin_expect(out->n == out->cap, 0) && kvg_ids_reserve(out, 1) < 0)
        return -1;
    out->v[out->n++] = id;
    return 0;
}

/* A word that is not one piece: the cache, else the merge. */
static __attribute__((noinline)) int encode_word_slow(enc *e, const char *w, size_t n, uint32_t hash)
{
    int cached = n <= CACHE_MAX_LEN;
    if (cached) {
        int hit = cache_hit(e, w, n, hash);
        if (hit)
            return hit < 0 ? -1 : 0;
    }
    size_t from = e->out->n;
    if (word_merge(e->s, e->t, w, n, e->out) < 0)
        return -1;
    return cached ? cache_put(e, w, n, hash, from) : 0;
}

/* One word: a byte-level pre-token, or an SPM run without the dummy prefix.
 * The common case, a word that is one piece, stays on this short path. */
static int encode_word(void *ctx, const char *w, size_t n)
{
    enc *e = ctx;
    const struct kvg_tokenizer *t = e->t;

    if (n == 1 && t->mode == KVG_TOK_BYTE_LEVEL && t->byte_piece[(unsigned char)w[0]] >= 0)
        return push(e->out, t->byte_piece[(unsigned char)w[0]]);
    if (n == 0)
        return 0;
    uint32_t hash = (uint32_t)kvg_tok_hash(w, n);
    int32_t id = word_lookup(t, w, n, hash);
    if (id >= 0)
        return push(e->out, id);
    return encode_word_slow(e, w, n, hash);
}

/* Builds t->word_index (called by kvg_tok_finish). */
static int build_word_index(struct kvg_tokenizer *t)
{
    kvg_word_index *ix = &t->word_index;
    kvg_tok_scratch sc;
    kvg_ids out = { NULL, 0, 0 };
    size_t keys_len = 0, n_words = 0;
    int32_t *words = NULL;
    int rc = -1;

    free(ix->slots);
    free(ix->keys);
    memset(ix, 0, sizeof *ix);
    /* Unsplit SPM text is never looked up by words; ids must fit in 24 bits. */
    if ((t->mode == KVG_TOK_SPM && t->spm_space < 0) || t->n_vocab >= (1 << 24))
        return 0;
    if (!(words = malloc((size_t)t->n_vocab * sizeof *words)))
        return -1;
    memset(&sc, 0, sizeof sc);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t n = t->bytes_len[id];
        if (!kvg_tok_mergeable(t->type[id]) || n == 0 || n > 255)
            continue;
        /* Only a piece the merge reproduces from its own text may stand in
         * for the merge, which keeps the shortcut exact. */
        out.n = 0;
        if (word_merge(&sc, t, (const char *)t->bytes[id], n, &out) < 0)
            goto done;
        if (out.n == 1 && out.v[0] == id) {
            words[n_words++] = id;
            if (n > 8)
                keys_len += n;
        }
    }

    /* Sized to the entries, at most 3/4 full: small enough to stay in cache. */
    uint64_t cap = 16;
    while (cap * 3 / 4 < n_words)
        cap <<= 1;
    ix->slots = malloc((size_t)cap * sizeof *ix->slots);
    ix->keys = malloc(keys_len ? keys_len : 1);
    if (!ix->slots || !ix->keys)
        goto done;
    memset(ix->slots, 0xff, (size_t)cap * sizeof *ix->slots);
    ix->mask = (uint32_t)cap - 1;
    keys_len = 0;
    for (size_t i = 0; i < n_words; i++) {
        int32_t id = words[i];
        const char *w = (const char *)t->bytes[id];
        size_t n = t->bytes_len[id];
        uint32_t hash = (uint32_t)kvg_tok_hash(w, n);
        if (word_lookup(t, w, n, hash) >= 0)
            continue;           /* same bytes as an earlier piece: the first wins */
        uint32_t h = hash & ix->mask;
        while (ix->slots[h].id_len != UINT32_MAX)
            h = (h + 1) & ix->mask;
        kvg_word_slot *sl = &ix->slots[h];
        sl->hash = hash;
        sl->id_len = (uint32_t)id << 8 | (uint32_t)n;
        if (n <= 8) {
            sl->key = short_key(w, n);
        } else {
            memcpy(ix->keys + keys_len, w, n);
            sl->key = keys_len;
            keys_len += n;
        }
    }
    rc = 0;
done:
    if (rc < 0) {
        free(ix->slots);
        free(ix->keys);
        memset(ix, 0, sizeof *ix);
    }
    free(words);
    free(out.v);
    kvg_tok_scratch_free(&sc);
    return rc;
}

/* Loading's last step: the vocabulary's derived tables (tok_vocab.c), then the word
 * index, which runs the encoder on every piece, then the identity that encoders'
 * per-thread caches are keyed by. */
int kvg_tok_finish(struct kvg_tokenizer *t, char *err, size_t err_len)
{
    static uint64_t next_uid;

    if (kvg_tok_finish_vocab(t, err, err_len) < 0)
        return -1;
    if (build_word_index(t) < 0) {
        snprintf(err, err_len, "out of memory building the tokenizer");
        return -1;
    }
    t->uid = __atomic_add_fetch(&next_uid, 1, __ATOMIC_RELAXED);
    return 0;
}

/* ---- SPM runs ---- */

/* What run_end needs to know of the character before: a space, or the class
 * of spm_join_space (an ASCII character, 128 for any other). */
#define PREV_SPACE 256

/* A run ends where a space follows a character that no piece joins to a space
 * (spm_join_space: in most vocabularies, any non-space) and around isolated
 * characters (no piece contains them). Returns the end of the run whose
 * characters from i on are scanned, given the character before i. */
static size_t run_end(const struct kvg_tokenizer *t, const unsigned char *s, size_t n, size_t i,
                      int prev, int prev_iso)
{
    while (i < n) {
        unsigned char c = s[i];
        int sp, iso = 0;
        size_t len = 1;
        if (c < 0x80) {
            sp = c == ' ';
            iso = t->spm_isolated[c];
        } else {
            sp = is_spm_space(t, s, n, i);
            if (sp)
                len = 3;
        }
        /* HF Metaspace split: a piece starts at every space. */
        if ((sp && (prev == PREV_SPACE ? t->meta_split : !t->spm_join_space[prev])) || iso || prev_iso)
            return i;
        prev = sp ? PREV_SPACE : c < 0x80 ? c : 128;
        prev_iso = iso;
        i += len;
    }
    return n;
}

static int encode_spm(enc *e, const char *text, size_t n, int prefix)
{
    const struct kvg_tokenizer *t = e->t;
    kvg_tok_scratch *sc = e->s;
    const unsigned char *s = (const unsigned char *)text;
    int with_prefix = prefix && t->spm_space >= 0;
    size_t start = 0;
    long k;

    /* init[0] is written before spm_symbols grows the array. */
    if (kvg_tok_grow((void **)&sc->init, &sc->init_cap, 1, sizeof *sc->init) < 0)
        return -1;
    if (t->spm_space < 0 && !t->meta_split) {
        if (with_prefix)
            sc->init[0] = t->spm_space;
        if ((k = spm_symbols(sc, t, s, n, with_prefix ? 1 : 0)) < 0)
            return -1;
        return kvg_bpe_merge(sc, t, (size_t)k, e->out);
    }
    if (with_prefix) {
        /* The dummy prefix is a space in front of the text: it opens the first run. */
        size_t end = run_end(t, s, n, 0, PREV_SPACE, 0);
        sc->init[0] = t->spm_space;
        if ((k = spm_symbols(sc, t, s, end, 1)) < 0 || kvg_bpe_merge(sc, t, (size_t)k, e->out) < 0)
            return -1;
        start = end;
    }
    while (start < n) {
        unsigned char c = s[start];
        size_t end;
        if (c < 0x80) {
            if (t->spm_isolated[c] && t->ascii_id[c] >= 0) {
                if (push(e->out, t->ascii_id[c]) < 0)
                    return -1;
                start++;
                continue;
            }
            end = run_end(t, s, n, start + 1, c == ' ' ? PREV_SPACE : c, t->spm_isolated[c]);
        } else {
            int sp = is_spm_space(t, s, n, start);
            end = run_end(t, s, n, start + (sp ? 3 : 1), sp ? PREV_SPACE : 128, 0);
        }
        if (encode_word(e, text + start, end - start) < 0)
            return -1;
        start = end;
    }
    return 0;
}

/* ---- fragments between added tokens ---- */

static int all_ascii(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        if (kvg_tok_load64(u + i) & 0x8080808080808080ULL)
            return 0;
    for (; i < n; i++)
        if (u[i] & 0x80)
            return 0;
    return 1;
}

/* The fragment as the model sees it: normalized (NFC/NFKC) and with the
 * byte-level prefix space, in sc->frag when that differs from the input.
 * Returns 0, or -1 when out of memory. */
static int prepare_fragment(enc *e, const char **s, size_t *n)
{
    const struct kvg_tokenizer *t = e->t;
    kvg_tok_scratch *sc = e->s;
    int norm = t->norm != KVG_NORM_NONE && !all_ascii(*s, *n);
    size_t pre = t->bl_prefix_space && (*s)[0] != ' ';

    if (!norm && !pre)
        return 0;
    if (t->norm == KVG_NORM_NFKC && norm) {
        utf8proc_uint8_t *m = NULL;
        utf8proc_ssize_t l = utf8proc_map((const utf8proc_uint8_t *)*s, (utf8proc_ssize_t)*n, &m,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
        if (l < 0 || kvg_tok_grow((void **)&sc->frag, &sc->frag_cap, pre + (size_t)l, 1) < 0) {
            free(m);
            return -1;
        }
        memcpy(sc->frag + pre, m, (size_t)l);
        free(m);
        *n = pre + (size_t)l;
    } else if (norm) {
        size_t bound = kvg_nfc_bound((const unsigned char *)*s, *n), len;
        char err[64];
        if (bound == SIZE_MAX || kvg_tok_grow((void **)&sc->frag, &sc->frag_cap, pre + bound, 1) < 0
            || kvg_nfc((const unsigned char *)*s, *n, (unsigned char *)sc->frag + pre, bound, &len,
                       err, sizeof err) < 0)
            return -1;
        *n = pre + len;
    } else {
        if (kvg_tok_grow((void **)&sc->frag, &sc->frag_cap, *n + 1, 1) < 0)
            return -1;
        memcpy(sc->frag + 1, *s, *n);
        *n += 1;
    }
    if (pre)
        sc->frag[0] = ' ';
    *s = sc->frag;
    return 0;
}

/* Whether the SPM dummy prefix goes before this fragment: SentencePiece's rule
 * (every fragment, as HF's Prepend normalizer), or Metaspace's prepend_scheme. */
static int spm_prefix(const struct kvg_tokenizer *t, const char *s, size_t n, int after_special,
                      int at_start)
{
    if (!t->add_dummy_prefix)
        return 0;
    if (t->meta_prefix == KVG_PREFIX_NONE)
        return after_special;
    if (t->meta_prefix == KVG_PREFIX_META_FIRST && !at_start)
        return 0;
    return !(s[0] == ' ' || (n >= 3 && memcmp(s, "\xE2\x96\x81", 3) == 0));
}

static int encode_fragment(enc *e, const char *s, size_t n, int after_special, int at_start)
{
    const struct kvg_tokenizer *t = e->t;

    if (n == 0)
        return 0;
    if (prepare_fragment(e, &s, &n) < 0)
        return -1;
    if (t->mode == KVG_TOK_SPM)
        return encode_spm(e, s, n, spm_prefix(t, s, n, after_special, at_start));
    if (t->n_stages)
        return kvg_pretok_run(t->stages, t->n_stages, s, n, encode_word, e) ? -1 : 0;
    return kvg_pretok_split(t->pretok, s, n, encode_word, e) ? -1 : 0;
}

/* HF's whitespace (char::is_whitespace: the White_Space property) at s[i];
 * its length, or 0. */
static size_t space_at(const char *s, size_t n, size_t i)
{
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80)
        return c == ' ' || (c >= '\t' && c <= '\r') ? 1 : 0;
    uint32_t cp;
    int l = kvg_utf8_decode((const unsigned char *)s + i, n - i, &cp);
    if (l <= 0)
        return 0;
    int ws = cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A)
             || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
    return ws ? (size_t)l : 0;
}

/* Start of the UTF-8 character that ends just before s[i] (i > 0). */
static size_t char_before(const char *s, size_t i)
{
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80 && i - j < 4)
        j--;
    return j;
}

/* HF single_word: a word character is alphanumeric or '_'. */
static int word_char_at(const char *s, size_t n, size_t i)
{
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80)
        return c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
    uint32_t cp;
    if (kvg_utf8_decode((const unsigned char *)s + i, n - i, &cp) <= 0)
        return 0;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO)
           || (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

/* The added token matching at text[i..) that flags allow, longest first; NULL
 * if none. A special token must also end within text[i..i+special_n): past that
 * is data. */
static const kvg_added_token *added_at(const struct kvg_tokenizer *t, const char *text, size_t len,
                                       size_t i, size_t special_n, unsigned flags)
{
    const char *s = text + i;
    size_t n = len - i;
    unsigned char c = (unsigned char)s[0];
    for (size_t j = t->added_from[c]; j < t->added_from[c + 1]; j++) {
        const kvg_added_token *a = &t->added[j];
        if (a->special && (!(flags & KVG_ENC_PARSE_SPECIAL) || a->len > special_n))
            continue;
        if (a->len > n || (a->len > 1 && a->text[1] != s[1]) || memcmp(a->text, s, a->len) != 0)
            continue;
        if (a->single_word && ((i > 0 && word_char_at(text, len, char_before(text, i)))
                               || (a->len < n && word_char_at(text, len, i + a->len))))
            continue;
        return a;
    }
    return NULL;
}

int kvg_tok_encode(const struct kvg_tokenizer *t, const char *text, size_t len,
                   unsigned flags, const kvg_text_span *data, size_t n_data, kvg_ids *out)
{
    enc e = { t, out, thread_scratch() };
    int rc = 0, use_added = 0;

    if (!e.s)
        return -1;
    scratch_bind(e.s, t);
    if (kvg_ids_reserve(out, len / 4 + 16) < 0)
        return -1;
    if ((flags & KVG_ENC_BOS) && t->bos >= 0 && kvg_ids_push(out, t->bos) < 0)
        return -1;
    for (size_t j = 0; j < t->n_added; j++)
        if (!t->added[j].special || (flags & KVG_ENC_PARSE_SPECIAL))
            use_added = 1;

    size_t frag = 0, k = 0;
    int after_special = 1;
    if (use_added) {
        for (size_t i = 0; i < len; i++) {
            unsigned pair = (unsigned char)text[i] << 8 | (i + 1 < len ? (unsigned char)text[i + 1] : 0);
            if (!(t->added_pair[pair >> 6] >> (pair & 63) & 1))
                continue;
            /* special tokens only between data spans: data[k] is the first span
             * not wholly before i */
            while (k < n_data && data[k].off + data[k].len <= i)
                k++;
            size_t special_n = k == n_data ? len - i
                             : data[k].off <= i ? 0 : data[k].off - i;
            const kvg_added_token *a = added_at(t, text, len, i, special_n, flags);
            if (!a)
                continue;
            size_t end = i;
            if (a->lstrip)
                while (end > frag) {
                    size_t b = char_before(text, end), l = space_at(text, len, b);
                    if (!l || b + l != end)
                        break;
                    end = b;
                }
            if (encode_fragment(&e, text + frag, end - frag, after_special, frag == 0) < 0
                || kvg_ids_push(out, a->id) < 0) {
                rc = -1;
                break;
            }
            after_special = 1;
            frag = i + a->len;
            if (a->rstrip)
                for (size_t l; frag < len && (l = space_at(text, len, frag)) != 0;)
                    frag += l;
            i = frag - 1;
        }
    }
    if (rc == 0 && encode_fragment(&e, text + frag, len - frag, after_special, frag == 0) < 0)
        rc = -1;
    scratch_trim(e.s);
    return rc;
}
