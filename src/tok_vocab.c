/* Vocabulary storage shared by every tokenizer format: per-id arrays, the piece
 * index, the merge table (and its derivation from SentencePiece scores), and the
 * derived decode bytes. The bottom of the tokenizer: tok_bpe.c and tok_encode.c call
 * into it, it calls neither (kvg_tok_finish, which also needs the encoder, is in
 * tok_encode.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "utf8.h"

static const char SPM_SPACE[] = "\xE2\x96\x81";   /* U+2581 */

int kvg_tok_alloc(struct kvg_tokenizer *t, int32_t n)
{
    if (n <= 0)
        return -1;
    t->n_vocab = n;
    t->piece = calloc((size_t)n, sizeof *t->piece);
    t->piece_len = calloc((size_t)n, sizeof *t->piece_len);
    t->type = calloc((size_t)n, sizeof *t->type);
    t->bytes = calloc((size_t)n, sizeof *t->bytes);
    t->bytes_len = calloc((size_t)n, sizeof *t->bytes_len);
    t->bos = t->eos = t->unk = t->pad = -1;
    t->spm_space = -1;
    for (int i = 0; i < 256; i++)
        t->byte_piece[i] = -1;
    for (int i = 0; i < 128; i++)
        t->ascii_id[i] = -1;
    if (!t->piece || !t->piece_len || !t->type || !t->bytes || !t->bytes_len)
        return -1;
    return 0;
}

static void merges_free(kvg_merge_table *m)
{
    free(m->slots);
    m->slots = NULL;
    m->mask = 0;
    m->count = 0;
}


void kvg_tok_release(struct kvg_tokenizer *t)
{
    free(t->piece);
    free(t->piece_len);
    free(t->score);
    free(t->type);
    free(t->bytes);
    free(t->bytes_len);
    free(t->index.slots);
    free(t->word_index.slots);
    free(t->word_index.keys);
    merges_free(&t->merges);
    free(t->added);
    free(t->arena);
    free(t->mapping);
    free(t->bytes_arena);
    kvg_pretok_stages_free(t->stages, t->n_stages);
    memset(t, 0, sizeof *t);
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint64_t c = 16;
    while (c < n)
        c <<= 1;
    return c > (1u << 31) ? 0 : (uint32_t)c;
}

int kvg_tok_build_index(struct kvg_tokenizer *t)
{
    uint32_t cap = pow2_at_least((uint64_t)t->n_vocab * 2);

    if (!cap)
        return -1;
    free(t->index.slots);
    t->index.slots = malloc((size_t)cap * sizeof *t->index.slots);
    if (!t->index.slots)
        return -1;
    memset(t->index.slots, 0xff, (size_t)cap * sizeof *t->index.slots);
    t->index.mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *p = t->piece[id];
        uint32_t len = t->piece_len[id];
        if (!p)
            continue;
        uint32_t h = (uint32_t)kvg_tok_hash(p, len) & t->index.mask;
        for (;;) {
            int32_t o = t->index.slots[h];
            if (o < 0) {
                t->index.slots[h] = id;
                break;
            }
            /* A duplicate piece keeps its lowest id. */
            if (t->piece_len[o] == len && memcmp(t->piece[o], p, len) == 0)
                break;
            h = (h + 1) & t->index.mask;
        }
    }
    return 0;
}

int32_t kvg_tok_find(const struct kvg_tokenizer *t, const char *s, size_t len)
{
    if (!t->index.slots)
        return -1;
    uint32_t h = (uint32_t)kvg_tok_hash(s, len) & t->index.mask;
    for (;;) {
        int32_t o = t->index.slots[h];
        if (o < 0)
            return -1;
        if (t->piece_len[o] == len && memcmp(t->piece[o], s, len) == 0)
            return o;
        h = (h + 1) & t->index.mask;
    }
}

/* ---- merge table ---- */

static inline uint32_t merge_slot(uint64_t key, uint32_t mask)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(h >> 32 ^ h) & mask;
}

int kvg_merges_init(kvg_merge_table *m, uint32_t expected)
{
    uint32_t cap = pow2_at_least((uint64_t)expected * 2);

    if (!cap)
        return -1;
    m->slots = malloc((size_t)cap * sizeof *m->slots);
    if (!m->slots)
        return -1;
    for (uint32_t i = 0; i < cap; i++)
        m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->count = 0;
    return 0;
}

static int merges_grow(kvg_merge_table *m)
{
    kvg_merge_table n;

    if (kvg_merges_init(&n, (m->mask + 1)) < 0)
        return -1;
    for (uint32_t i = 0; i <= m->mask; i++) {
        kvg_merge *e = &m->slots[i];
        if (e->key == UINT64_MAX)
            continue;
        uint32_t h = merge_slot(e->key, n.mask);
        while (n.slots[h].key != UINT64_MAX)
            h = (h + 1) & n.mask;
        n.slots[h] = *e;
        n.count++;
    }
    free(m->slots);
    *m = n;
    return 0;
}

/* Rebuilds the table at a load factor of up to 3/4: lookups in a table that
 * fits the cache beat shorter probe runs in one that does not. */
static int merges_compact(kvg_merge_table *m)
{
    kvg_merge_table n;
    uint64_t cap = 16;

    if (!m->slots)
        return 0;
    while (cap * 3 / 4 < m->count)
        cap <<= 1;
    if (cap >= (uint64_t)m->mask + 1)
        return 0;
    n.slots = malloc((size_t)cap * sizeof *n.slots);
    if (!n.slots)
        return -1;
    for (uint64_t i = 0; i < cap; i++)
        n.slots[i].key = UINT64_MAX;
    n.mask = (uint32_t)cap - 1;
    n.count = m->count;
    for (uint32_t i = 0; i <= m->mask; i++) {
        kvg_merge *e = &m->slots[i];
        if (e->key == UINT64_MAX)
            continue;
        uint32_t h = merge_slot(e->key, n.mask);
        while (n.slots[h].key != UINT64_MAX)
            h = (h + 1) & n.mask;
        n.slots[h] = *e;
    }
    free(m->slots);
    *m = n;
    return 0;
}

int kvg_merges_put(kvg_merge_table *m, int32_t left, int32_t right, int32_t rank, int32_t result)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;

    if (left < 0 || right < 0)
        return -1;
    if (!m->slots && kvg_merges_init(m, 64) < 0)
        return -1;
    if ((uint64_t)(m->count + 1) * 2 > (uint64_t)m->mask + 1 && merges_grow(m) < 0)
        return -1;
    uint32_t h = merge_slot(key, m->mask);
    while (m->slots[h].key != UINT64_MAX) {
        if (m->slots[h].key == key)
            return 0;           /* the first (best-ranked) definition of a pair wins */
        h = (h + 1) & m->mask;
    }
    m->slots[h].key = key;
    m->slots[h].rank = rank;
    m->slots[h].result = result;
    m->count++;
    return 0;
}

const kvg_merge *kvg_merges_get(const kvg_merge_table *m, int32_t left, int32_t right)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;

    if (!m->slots)
        return NULL;
    uint32_t h = merge_slot(key, m->mask);
    for (;;) {
        const kvg_merge *e = &m->slots[h];
        if (e->key == key)
            return e;
        if (e->key == UINT64_MAX)
            return NULL;
        h = (h + 1) & m->mask;
    }
}


/* ---- SentencePiece scores -> merge table ---- */

/* Splitting a piece costs O(len^2) (every split hashes both halves), so
 * absurdly long pieces, which no real SentencePiece vocabulary has (its limit
 * is 16 characters by default), are left out rather than letting a hostile
 * file make loading quadratic. */
#define MAX_SPLIT_PIECE 1024

static int cmp_float_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static float clean_score(float s)
{
    return isnan(s) ? -INFINITY : s;
}

int kvg_tok_merges_from_scores(struct kvg_tokenizer *t)
{
    int32_t n = t->n_vocab;
    size_t n_sorted = 0, n_pairs = 0;

    if (!t->score)
        return -1;
    if (!t->index.slots && kvg_tok_build_index(t) < 0)
        return -1;
    /* Distinct scores of the pieces that can be merge results, best first: the
     * rank of a merge is the position of its result's score, so equal scores
     * share a rank and the merge takes the leftmost pair, as SentencePiece does. */
    float *sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted)
        return -1;
    for (int32_t id = 0; id < n; id++)
        if (kvg_tok_mergeable(t->type[id]) && t->piece_len[id] >= 2 && t->piece_len[id] <= MAX_SPLIT_PIECE) {
            sorted[n_sorted++] = clean_score(t->score[id]);
            n_pairs += t->piece_len[id] - 1;
        }
    qsort(sorted, n_sorted, sizeof *sorted, cmp_float_desc);
    size_t n_distinct = 0;
    for (size_t i = 0; i < n_sorted; i++)
        if (n_distinct == 0 || sorted[n_distinct - 1] != sorted[i])
            sorted[n_distinct++] = sorted[i];

    merges_free(&t->merges);
    if (kvg_merges_init(&t->merges, (uint32_t)(n_pairs < (1u << 30) ? n_pairs : (1u << 30))) < 0) {
        free(sorted);
        return -1;
    }
    for (int32_t id = 0; id < n; id++) {
        const char *p = t->piece[id];
        uint32_t len = t->piece_len[id];
        if (!kvg_tok_mergeable(t->type[id]) || len < 2 || len > MAX_SPLIT_PIECE)
            continue;
        float sc = clean_score(t->score[id]);
        size_t lo = 0, hi = n_distinct;     /* first position with sorted[pos] <= sc */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (sorted[mid] > sc)
                lo = mid + 1;
            else
                hi = mid;
        }
        /* Symbols are whole characters, so only character boundaries can split. */
        for (uint32_t k = 1; k < len; k++) {
            if (((unsigned char)p[k] & 0xC0) == 0x80)
                continue;
            int32_t a = kvg_tok_find(t, p, k), b = kvg_tok_find(t, p + k, len - k);
            if (a < 0 || b < 0 || !kvg_tok_mergeable(t->type[a]) || !kvg_tok_mergeable(t->type[b]))
                continue;
            if (kvg_merges_put(&t->merges, a, b, (int32_t)lo, id) < 0) {
                free(sorted);
                return -1;
            }
        }
    }
    free(sorted);
    return 0;
}

/* ---- added tokens ---- */

int kvg_tok_added_from_types(struct kvg_tokenizer *t)
{
    size_t n = 0;

    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t ty = t->type[id];
        if ((ty == KVG_TT_CONTROL || ty == KVG_TT_UNKNOWN || ty == KVG_TT_USER_DEFINED)
            && t->piece_len[id] > 0)
            n++;
    }
    free(t->added);
    t->added = NULL;
    t->n_added = 0;
    if (n == 0)
        return 0;
    t->added = calloc(n, sizeof *t->added);
    if (!t->added)
        return -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t ty = t->type[id];
        if ((ty == KVG_TT_CONTROL || ty == KVG_TT_UNKNOWN || ty == KVG_TT_USER_DEFINED)
            && t->piece_len[id] > 0) {
            kvg_added_token *a = &t->added[t->n_added++];
            a->id = id;
            a->special = ty != KVG_TT_USER_DEFINED;
            a->text = t->piece[id];
            a->len = t->piece_len[id];
        }
    }
    return 0;
}

/* By first byte (empty ones last), then longest first: the encoder tries only
 * the tokens that start with the byte at hand, the longest match first. */
static int cmp_added(const void *a, const void *b)
{
    const kvg_added_token *x = a, *y = b;
    int fx = x->len ? (unsigned char)x->text[0] : 256, fy = y->len ? (unsigned char)y->text[0] : 256;
    if (fx != fy)
        return fx < fy ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* ---- decode bytes ---- */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* The byte of a "<0xNN>" piece, or -1. */
static int byte_piece_value(const char *p, uint32_t len)
{
    if (len != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>')
        return -1;
    int hi = hexval(p[3]), lo = hexval(p[4]);
    return hi < 0 || lo < 0 ? -1 : hi << 4 | lo;
}

/* Writes the decoded bytes of `id` to out (room for piece_len bytes: decoding
 * never grows a piece). Returns the length. */
static uint32_t decode_piece(const struct kvg_tokenizer *t, int32_t id, unsigned char *out)
{
    const unsigned char *p = (const unsigned char *)t->piece[id];
    uint32_t len = t->piece_len[id], o = 0;
    uint8_t ty = t->type[id];

    if (ty == KVG_TT_CONTROL || ty == KVG_TT_UNUSED || !p)
        return 0;
    if (ty == KVG_TT_BYTE) {
        int b = byte_piece_value((const char *)p, len);
        if (b >= 0) {
            out[0] = (unsigned char)b;
            return 1;
        }
    }
    if (ty == KVG_TT_UNKNOWN || (ty == KVG_TT_USER_DEFINED && t->mode == KVG_TOK_BYTE_LEVEL)) {
        memcpy(out, p, len);
        return len;
    }
    if (t->mode == KVG_TOK_SPM) {
        for (uint32_t i = 0; i < len;) {
            if (t->spm_space_u2581 && i + 3 <= len && memcmp(p + i, SPM_SPACE, 3) == 0) {
                out[o++] = ' ';
                i += 3;
            } else
                out[o++] = p[i++];
        }
        return o;
    }
    /* Byte-level: every code point stands for one byte. */
    for (uint32_t i = 0; i < len;) {
        uint32_t cp;
        int n = kvg_utf8_decode(p + i, len - i, &cp);
        int b = n > 0 ? kvg_cp_to_byte(cp) : -1;
        if (b >= 0) {
            out[o++] = (unsigned char)b;
            i += (uint32_t)n;
        } else if (n > 0) {
            memcpy(out + o, p + i, (size_t)n);
            o += (uint32_t)n;
            i += (uint32_t)n;
        } else
            out[o++] = p[i++];
    }
    return o;
}

/* SPM: whether merges can never join a non-space character to a following
 * space, which makes merging each space-led run separately exact. */
/* Fills t->spm_join_space from the pieces; returns whether no piece has a
 * space right after a non-space at all (spm_split). */
static int spm_runs_independent(struct kvg_tokenizer *t)
{
    const char *sp = t->piece[t->spm_space];
    uint32_t sl = t->piece_len[t->spm_space];
    int none = 1;

    memset(t->spm_join_space, 0, sizeof t->spm_join_space);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const unsigned char *p = (const unsigned char *)t->piece[id];
        uint32_t len = t->piece_len[id];
        int prev = -1;          /* -1 none yet or a space, else the class of the character */
        if (!kvg_tok_mergeable(t->type[id]) || !p)
            continue;
        for (uint32_t i = 0; i < len;) {
            if (i + sl <= len && memcmp(p + i, sp, sl) == 0) {
                if (prev >= 0) {
                    t->spm_join_space[prev] = 1;
                    none = 0;
                }
                prev = -1;
                i += sl;
            } else {
                int n = kvg_utf8_seq_len(p[i]);
                prev = p[i] < 0x80 ? p[i] : 128;
                i += n > 0 ? (uint32_t)n : 1;
            }
        }
    }
    return none;
}

static void mark_isolated(struct kvg_tokenizer *t)
{
    for (int c = 0; c < 128; c++)
        t->spm_isolated[c] = c != ' ';     /* a space is governed by the space-run rule */
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const unsigned char *p = (const unsigned char *)t->piece[id];
        uint32_t len = t->piece_len[id], chars = 0;
        if (!kvg_tok_mergeable(t->type[id]) || !p)
            continue;
        for (uint32_t i = 0; i < len; i++)
            chars += (p[i] & 0xC0) != 0x80;
        if (chars < 2)
            continue;
        for (uint32_t i = 0; i < len; i++)
            if (p[i] < 0x80)
                t->spm_isolated[p[i]] = 0;
    }
}

/* Whether every merge (a, b) ranks strictly after every merge that produces
 * a or b. Then merging at rank r only ever creates pairs ranked above r, and
 * the merge's queue pops keys in increasing order. */
static int merges_monotone(const struct kvg_tokenizer *t)
{
    const kvg_merge_table *m = &t->merges;
    int monotone = 1;

    if (!m->slots)
        return 0;
    int32_t *made = malloc((size_t)t->n_vocab * sizeof *made);
    if (!made)
        return 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        made[i] = -1;
    for (uint32_t i = 0; i <= m->mask; i++) {
        const kvg_merge *e = &m->slots[i];
        if (e->key != UINT64_MAX && e->result >= 0 && e->result < t->n_vocab && made[e->result] < e->rank)
            made[e->result] = e->rank;
    }
    for (uint32_t i = 0; i <= m->mask && monotone; i++) {
        const kvg_merge *e = &m->slots[i];
        if (e->key == UINT64_MAX)
            continue;
        uint32_t a = (uint32_t)(e->key >> 32), b = (uint32_t)e->key;
        if (a >= (uint32_t)t->n_vocab || b >= (uint32_t)t->n_vocab || e->rank <= made[a] || e->rank <= made[b])
            monotone = 0;
    }
    free(made);
    return monotone;
}

int kvg_tok_finish_vocab(struct kvg_tokenizer *t, char *err, size_t err_len)
{
    size_t total = 0;

    if (t->n_vocab <= 0 || !t->piece || !t->piece_len || !t->type || !t->bytes || !t->bytes_len) {
        snprintf(err, err_len, "tokenizer has no vocabulary");
        return -1;
    }
    if (!t->index.slots && kvg_tok_build_index(t) < 0)
        goto oom;

    if (t->mode == KVG_TOK_SPM) {
        int32_t sp = kvg_tok_find(t, SPM_SPACE, 3);
        t->spm_space_u2581 = sp >= 0 && kvg_tok_mergeable(t->type[sp]);
        if (!t->spm_space_u2581) {
            sp = kvg_tok_find(t, " ", 1);
            if (sp >= 0 && !kvg_tok_mergeable(t->type[sp]))
                sp = -1;
        }
        t->spm_space = sp;
        if (sp >= 0) {
            t->spm_split = spm_runs_independent(t);
        } else {
            t->spm_split = 0;
            memset(t->spm_join_space, 1, sizeof t->spm_join_space);
        }
        mark_isolated(t);
        for (int c = 0; c < 128; c++) {
            char ch = (char)c;
            int32_t id = c == ' ' ? sp : kvg_tok_find(t, &ch, 1);
            t->ascii_id[c] = id >= 0 && kvg_tok_mergeable(t->type[id]) ? id : -1;
        }
    }

    for (int i = 0; i < 256; i++)
        t->byte_piece[i] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++)
        total += (size_t)t->piece_len[id] + 1;
    free(t->bytes_arena);
    t->bytes_arena = malloc(total ? total : 1);
    if (!t->bytes_arena)
        goto oom;
    unsigned char *w = t->bytes_arena;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t n = decode_piece(t, id, w);
        w[n] = '\0';
        t->bytes[id] = w;
        t->bytes_len[id] = n;
        w += n + 1;
        if (t->mode == KVG_TOK_SPM && t->type[id] == KVG_TT_BYTE && n == 1 && t->byte_piece[t->bytes[id][0]] < 0)
            t->byte_piece[t->bytes[id][0]] = id;
    }
    if (t->mode == KVG_TOK_BYTE_LEVEL) {
        for (int b = 0; b < 256; b++) {
            unsigned char u[4];
            int n = kvg_utf8_encode(kvg_byte_to_cp((unsigned char)b), u);
            t->byte_piece[b] = kvg_tok_find(t, (const char *)u, (size_t)n);
        }
    }

    if (t->n_added > 1)
        qsort(t->added, t->n_added, sizeof *t->added, cmp_added);
    /* added_from[b] = first token starting with a byte >= b */
    for (unsigned b = 0, i = 0; b <= 256; b++) {
        while (i < t->n_added && t->added[i].len > 0 && (unsigned char)t->added[i].text[0] < b)
            i++;
        t->added_from[b] = i;
    }
    memset(t->added_pair, 0, sizeof t->added_pair);
    for (size_t i = 0; i < t->n_added; i++) {
        const kvg_added_token *a = &t->added[i];
        unsigned f = a->len ? (unsigned char)a->text[0] : 0;
        for (unsigned b = 0; a->len > 0 && b < 256; b++)
            if (a->len == 1 || (unsigned char)a->text[1] == b)
                t->added_pair[(f << 8 | b) >> 6] |= 1ULL << (b & 63);
    }
    if (merges_compact(&t->merges) < 0)
        goto oom;
    t->merge_monotone = merges_monotone(t);
    return 0;

oom:
    snprintf(err, err_len, "out of memory building the tokenizer");
    return -1;
}
