/* Public tokenizer API: format detection, encode/decode, streaming decoding. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errmsg.h"
#include "tok_internal.h"
#include "utf8.h"
#include "tokenizer_testing.h"

/* Longest text encode accepts: symbol positions are int32. */
#define MAX_TEXT ((size_t)INT32_MAX / 4)

static int looks_like_json(const unsigned char *p, size_t n)
{
    size_t i = 0;
    if (n >= 3 && p[0] == 0xEF && p[1] == 0xBB && p[2] == 0xBF)
        i = 3;                  /* UTF-8 byte order mark */
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'))
        i++;
    return i < n && p[i] == '{';
}

/* See kvg_tokenizer_max_token_bytes. Every token the encoder emits stands for
 * a span of the text: a piece made of initial symbols (one per character, or
 * per byte with byte fallback or byte-level pieces), an added token's text, or
 * the unknown token for one character (at most 4 bytes of UTF-8). */
static uint32_t max_token_text(const struct kvg_tokenizer *t)
{
    uint32_t most = 4;
    int lossless = t->unk >= 0;

    if (!lossless) {
        /* every byte (or, for SPM, every character by its bytes) has a piece */
        lossless = t->mode == KVG_TOK_BYTE_LEVEL || t->byte_fallback;
        for (int b = 0; b < 256 && lossless; b++)
            lossless = t->byte_piece[b] >= 0;
    }
    if (!lossless)
        return 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t n = t->bytes_len[id];
        if (t->mode == KVG_TOK_SPM && t->spm_space_u2581) {
            /* a space in the piece may have been a 3-byte U+2581 in the text */
            for (uint32_t i = 0; i < t->bytes_len[id]; i++)
                n += t->bytes[id][i] == ' ' ? 2 : 0;
        }
        if (n > most)
            most = n;
    }
    for (size_t j = 0; j < t->n_added; j++) {
        /* a token that takes the whitespace around it can stand for any amount */
        if (t->added[j].lstrip || t->added[j].rstrip)
            return 0;
        if (t->added[j].len > most)
            most = (uint32_t)t->added[j].len;
    }
    /* Normalization can make the text shorter than what it encodes: NFC at most
     * 3 to 1 (Hangul jamo L V T into one syllable), NFKC 4 to 1 (a 4-byte
     * mathematical letter into ASCII). */
    if (t->norm == KVG_NORM_NFC)
        most *= 3;
    else if (t->norm == KVG_NORM_NFKC)
        most *= 4;
    return most;
}

kvg_tokenizer *kvg_tokenizer_load_mem(const void *data, size_t len, const char *name,
                                      char *err, size_t err_len)
{
    const unsigned char *p = data;
    char local[256], sink[8];
    int rc;

    if (!name)
        name = "(memory)";
    if (!err || err_len == 0) {
        err = sink;
        err_len = sizeof sink;
    }
    if (!p && len) {
        kvg_set_err(err, err_len, "%s: no data", name);
        return NULL;
    }
    kvg_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        kvg_set_err(err, err_len, "%s: out of memory", name);
        return NULL;
    }
    if (len == 0) {
        kvg_set_err(err, err_len, "%s: empty file", name);
        free(t);
        return NULL;
    }
    if (len >= 4 && memcmp(p, "GGUF", 4) == 0)
        rc = kvg_tok_load_gguf(t, p, len, name, err, err_len);
    else if (looks_like_json(p, len))
        rc = kvg_tok_load_hfjson(t, p, len, name, err, err_len);
    else
        rc = kvg_tok_load_llama2c(t, p, len, name, err, err_len);
    if (rc == 0 && t->mode != KVG_TOK_SPM && t->mode != KVG_TOK_BYTE_LEVEL) {
        kvg_set_err(err, err_len, "%s: tokenizer loaded without a known mode", name);
        rc = -1;
    }
    if (rc == 0 && kvg_tok_finish(t, local, sizeof local) < 0) {
        kvg_set_err(err, err_len, "%s: %s", name, local);
        rc = -1;
    }
    if (rc == 0 && !t->kind)
        t->kind = t->mode == KVG_TOK_SPM ? "spm" : "bpe";
    if (rc == 0)
        t->max_token_text = max_token_text(t);
    __atomic_store_n(&t->refs, 1, __ATOMIC_RELAXED);
    if (rc < 0) {
        kvg_tok_release(t);
        free(t);
        return NULL;
    }
    return t;
}

kvg_tokenizer *kvg_tokenizer_load(const char *path, char *err, size_t err_len)
{
    struct stat st;
    int fd;

    if (!path) {
        kvg_set_err(err, err_len, "(null): no tokenizer path");
        return NULL;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kvg_set_err(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        kvg_set_err(err, err_len, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size == 0) {
        kvg_set_err(err, err_len, "%s: empty file", path);
        close(fd);
        return NULL;
    }
    /* Mapped rather than read: a GGUF model file can be many gigabytes while
     * only its metadata is touched here. */
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        kvg_set_err(err, err_len, "%s: cannot map: %s", path, strerror(errno));
        return NULL;
    }
    kvg_tokenizer *t = kvg_tokenizer_load_mem(m, (size_t)st.st_size, path, err, err_len);
    munmap(m, (size_t)st.st_size);
    return t;
}

kvg_tokenizer *kvg_tokenizer_ref(const kvg_tokenizer *t)
{
    kvg_tokenizer *m = (kvg_tokenizer *)t;

    __atomic_add_fetch(&m->refs, 1, __ATOMIC_RELAXED);
    return m;
}

size_t kvg_tokenizer_max_token_bytes(const kvg_tokenizer *t)
{
    return t->max_token_text;
}

size_t kvg_tokenizer_min_tokens(const kvg_tokenizer *t, size_t len)
{
    return t->max_token_text ? len / t->max_token_text + (len % t->max_token_text != 0) : 0;
}

void kvg_tokenizer_free(kvg_tokenizer *t)
{
    if (!t)
        return;
    /* the last reference frees; acquire-release so its reads happen before */
    if (__atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    kvg_tok_release(t);
    free(t);
}

int32_t kvg_tokenizer_vocab_size(const kvg_tokenizer *t)
{
    return t->n_vocab;
}

int32_t kvg_tokenizer_bos(const kvg_tokenizer *t)
{
    return t->bos;
}

int32_t kvg_tokenizer_eos(const kvg_tokenizer *t)
{
    return t->eos;
}

int kvg_tokenizer_add_bos(const kvg_tokenizer *t)
{
    return t->add_bos && t->bos >= 0;
}

const char *kvg_tokenizer_kind(const kvg_tokenizer *t)
{
    return t->kind;
}

int kvg_tokenizer_encode(const kvg_tokenizer *t, const char *text, size_t len,
                         unsigned flags, int32_t **ids, size_t *n_ids,
                         char *err, size_t err_len)
{
    return kvg_tokenizer_encode_spans(t, text, len, flags, NULL, 0, ids, n_ids, err, err_len);
}

int kvg_tokenizer_encode_spans(const kvg_tokenizer *t, const char *text, size_t len,
                               unsigned flags, const kvg_text_span *data, size_t n_data,
                               int32_t **ids, size_t *n_ids, char *err, size_t err_len)
{
    kvg_ids out = { NULL, 0, 0 };
    size_t bad;

    *ids = NULL;
    *n_ids = 0;
    if (!text && len) {
        kvg_set_err(err, err_len, "no text to encode");
        return -1;
    }
    if (len > MAX_TEXT) {
        kvg_set_err(err, err_len, "text of %zu bytes is too long to encode (limit %zu)", len, MAX_TEXT);
        return -1;
    }
    if (len && (bad = kvg_utf8_invalid_at((const unsigned char *)text, len)) != (size_t)-1) {
        kvg_set_err(err, err_len, "invalid UTF-8 at byte offset %zu", bad);
        return -1;
    }
    for (size_t i = 0; i < n_data; i++)
        if (data[i].off > len || data[i].len > len - data[i].off
            || (i && data[i].off < data[i - 1].off + data[i - 1].len)) {
            kvg_set_err(err, err_len, "data span %zu is out of order or outside the text", i);
            return -1;
        }
    if (kvg_tok_encode(t, len ? text : "", len, flags, data, n_data, &out) < 0) {
        free(out.v);
        kvg_set_err(err, err_len, "out of memory (or a pre-tokenizer regex over its match "
                    "limit) encoding %zu bytes", len);
        return -1;
    }
    if (!out.v && !(out.v = malloc(sizeof *out.v))) {
        kvg_set_err(err, err_len, "out of memory");
        return -1;
    }
    *ids = out.v;
    *n_ids = out.n;
    return 0;
}

const unsigned char *kvg_tokenizer_token_bytes(const kvg_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = t->bytes_len[id];
    return t->bytes[id];
}

const char *kvg_tokenizer_piece(const kvg_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = t->piece_len[id];
    return t->piece[id];
}

int32_t kvg_tokenizer_find_piece(const kvg_tokenizer *t, const char *piece, size_t len)
{
    return piece ? kvg_tok_find(t, piece, len) : -1;
}

/* Whether decoding drops the leading space of the first non-empty piece. */
static int strips_dummy(const kvg_tokenizer *t)
{
    return t->mode == KVG_TOK_SPM && t->add_dummy_prefix;
}

int kvg_tokenizer_decode(const kvg_tokenizer *t, const int32_t *ids, size_t n_ids,
                         char **out, size_t *out_len, char *err, size_t err_len)
{
    size_t total = 0;

    *out = NULL;
    *out_len = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) {
            kvg_set_err(err, err_len, "token id %d at position %zu is out of range (vocabulary of %d)",
                    ids[i], i, t->n_vocab);
            return -1;
        }
        total += t->bytes_len[ids[i]];
    }
    char *buf = malloc(total + 1);
    if (!buf) {
        kvg_set_err(err, err_len, "out of memory");
        return -1;
    }
    size_t o = 0;
    int at_start = strips_dummy(t);
    for (size_t i = 0; i < n_ids; i++) {
        const unsigned char *b = t->bytes[ids[i]];
        size_t n = t->bytes_len[ids[i]];
        if (n && at_start) {
            at_start = 0;
            if (b[0] == ' ') {
                b++;
                n--;
            }
        }
        memcpy(buf + o, b, n);
        o += n;
    }
    buf[o] = '\0';
    *out = buf;
    *out_len = o;
    return 0;
}

/* ---- streaming ---- */

static const unsigned char REPLACEMENT[3] = { 0xEF, 0xBF, 0xBD };

/* Bytes still needed after the lead byte c, and the allowed range of the byte
 * that follows it (which excludes overlongs, surrogates and > U+10FFFF);
 * need < 0 when c cannot start a character. */
static void utf8_lead(unsigned char c, int *need, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        *need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        *need = 2;
        if (c == 0xE0)
            *lo = 0xA0;
        else if (c == 0xED)
            *hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        *need = 3;
        if (c == 0xF0)
            *lo = 0x90;
        else if (c == 0xF4)
            *hi = 0x8F;
    } else
        *need = -1;
}

/* Feeds b[0..n) through the held bytes; writes to out when out is non-NULL and
 * returns the number of bytes produced either way. `hold`/`n_hold` is updated
 * only when commit is set. */
static size_t detok_feed(unsigned char *hold, size_t *n_hold, const unsigned char *b, size_t n,
                         char *out, int commit)
{
    unsigned char h[8];
    size_t nh = *n_hold, o = 0;

    memcpy(h, hold, nh);
    for (size_t i = 0; i < n;) {
        unsigned char c = b[i];
        if (nh == 0) {
            if (c < 0x80) {
                if (out)
                    out[o] = (char)c;
                o++;
            } else {
                int need;
                unsigned char lo, hi;
                utf8_lead(c, &need, &lo, &hi);
                if (need < 0) {
                    if (out)
                        memcpy(out + o, REPLACEMENT, 3);
                    o += 3;
                } else
                    h[nh++] = c;
            }
            i++;
            continue;
        }
        int need;
        unsigned char lo, hi;
        utf8_lead(h[0], &need, &lo, &hi);
        if (nh > 1) {
            lo = 0x80;
            hi = 0xBF;
        }
        if (c < lo || c > hi) {
            /* The held bytes can never complete: one U+FFFD for all of them,
             * then c starts afresh. */
            if (out)
                memcpy(out + o, REPLACEMENT, 3);
            o += 3;
            nh = 0;
            continue;
        }
        h[nh++] = c;
        i++;
        if ((int)nh == need + 1) {
            if (out)
                memcpy(out + o, h, nh);
            o += nh;
            nh = 0;
        }
    }
    if (commit) {
        memcpy(hold, h, nh);
        *n_hold = nh;
    }
    return o;
}

void kvg_detok_init(kvg_detok *d, const kvg_tokenizer *t)
{
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->at_start = 1;
}

long kvg_detok_push(kvg_detok *d, int32_t id, char *out, size_t cap)
{
    const kvg_tokenizer *t = d->tok;

    if (!t || id < 0 || id >= t->n_vocab || d->n_pending > 3)
        return -1;
    const unsigned char *b = t->bytes[id];
    size_t n = t->bytes_len[id];
    if (n == 0)
        return 0;
    int strip = d->at_start && strips_dummy(t) && b[0] == ' ';
    if (strip) {
        b++;
        n--;
    }
    /* Size first, so that a too-small buffer leaves the state untouched. */
    if (detok_feed(d->pending, &d->n_pending, b, n, NULL, 0) > cap)
        return -1;
    d->at_start = 0;
    return (long)detok_feed(d->pending, &d->n_pending, b, n, out, 1);
}

long kvg_detok_flush(kvg_detok *d, char *out, size_t cap)
{
    if (d->n_pending == 0)
        return 0;
    if (cap < 3)
        return -1;
    memcpy(out, REPLACEMENT, 3);
    d->n_pending = 0;
    return 3;
}
