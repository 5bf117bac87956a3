/* kvgate tokenizer: one API over three file formats, detected automatically:
 *   - llama2.c tokenizer .bin       (SentencePiece-style BPE by piece scores)
 *   - GGUF vocabulary               (tokenizer.ggml.model "llama" or "gpt2")
 *   - Hugging Face tokenizer.json   (byte-level BPE or SentencePiece-BPE)
 *
 * Errors: functions that can fail take (char *err, size_t err_len) and write a
 * one-line message naming the file and what is wrong. Encoding requires valid
 * UTF-8; invalid input is an error, never a crash. */
#ifndef KVG_TOKENIZER_H
#define KVG_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "text_span.h"

typedef struct kvg_tokenizer kvg_tokenizer;

/* Loads from a file, detecting the format from its contents. NULL on error. */
kvg_tokenizer *kvg_tokenizer_load(const char *path, char *err, size_t err_len);

/* Same from bytes in memory; `name` is used in error messages. The bytes are
 * copied (the caller may free them). */
kvg_tokenizer *kvg_tokenizer_load_mem(const void *data, size_t len, const char *name,
                                      char *err, size_t err_len);

/* Drops a reference: the tokenizer is freed with its last one (a loaded tokenizer
 * holds one). Thread-safe, as is every function here that takes a const
 * tokenizer: encoding keeps its working memory per thread. */
void kvg_tokenizer_free(kvg_tokenizer *t);

/* Takes another reference (for a thread that encodes while the owner may drop
 * the tokenizer); returns t. Thread-safe. */
kvg_tokenizer *kvg_tokenizer_ref(const kvg_tokenizer *t);

/* The most bytes of input text that one token of any encoding can stand for
 * (the longest piece, counting a literal U+2581 an SPM vocabulary reads as a
 * space as its 3 bytes, added tokens' text, an unknown character; times 3 or 4
 * when the file asks for NFC or NFKC, which can shorten the text), or 0 when the
 * encoder may drop text it has no piece for (no unknown token and no complete
 * byte fallback) or an added token takes the whitespace around it
 * (lstrip/rstrip), so that no such bound exists. */
size_t kvg_tokenizer_max_token_bytes(const kvg_tokenizer *t);

/* A lower bound on the tokens encoding len bytes of text gives (without BOS):
 * ceil(len / kvg_tokenizer_max_token_bytes(t)), 0 when there is no bound. Lets
 * a caller refuse a text too long for a context without encoding it. */
size_t kvg_tokenizer_min_tokens(const kvg_tokenizer *t, size_t len);

int32_t kvg_tokenizer_vocab_size(const kvg_tokenizer *t);
int32_t kvg_tokenizer_bos(const kvg_tokenizer *t);   /* -1 when the vocabulary has none */
int32_t kvg_tokenizer_eos(const kvg_tokenizer *t);   /* -1 when the vocabulary has none */
/* Whether the vocabulary asks for BOS at the start of a prompt (GGUF
 * tokenizer.ggml.add_bos_token; llama2.c files: yes) and has one. */
int kvg_tokenizer_add_bos(const kvg_tokenizer *t);

/* Encoding options. */
#define KVG_ENC_BOS            0x1   /* prepend BOS (when the vocabulary has one) */
#define KVG_ENC_PARSE_SPECIAL  0x2   /* recognise special/added token text like "<|im_start|>"
                                        (for chat templates; never for raw user text) */

/* Encodes text[0..len) (valid UTF-8) into token ids. On success returns 0 and
 * stores a malloc'd array in *ids (caller frees) and its length in *n_ids.
 * On error returns -1 and fills err. Cost is O(n log n) in len. */
int kvg_tokenizer_encode(const kvg_tokenizer *t, const char *text, size_t len,
                         unsigned flags, int32_t **ids, size_t *n_ids,
                         char *err, size_t err_len);

/* kvg_tokenizer_encode of a whole rendered prompt whose data spans (message
 * content, tool arguments: sorted, not overlapping; jinja.h's output) must not
 * produce special tokens: with KVG_ENC_PARSE_SPECIAL, special-token text is
 * recognised only where it overlaps no data span. Everything else (pre-
 * tokenization, merges) runs over the text as one, so the ids equal the
 * reference's (which tokenizes the rendered string whole) whenever the data
 * holds no special-token text. */
int kvg_tokenizer_encode_spans(const kvg_tokenizer *t, const char *text, size_t len,
                               unsigned flags, const kvg_text_span *data, size_t n_data,
                               int32_t **ids, size_t *n_ids, char *err, size_t err_len);

/* The bytes a token stands for when decoded (byte-fallback and byte-level pieces
 * mapped back to raw bytes, SentencePiece's U+2581 to a space). Control tokens
 * decode to nothing (len 0). NULL for an id out of range. */
const unsigned char *kvg_tokenizer_token_bytes(const kvg_tokenizer *t, int32_t id, size_t *len);

/* The raw piece as stored in the vocabulary (e.g. "<0x0A>", "\u2581the", "Ġthe",
 * "<|begin_of_text|>": what a chat template's bos_token is); NULL for an id out
 * of range. */
const char *kvg_tokenizer_piece(const kvg_tokenizer *t, int32_t id, size_t *len);

/* Looks a raw piece up; -1 when absent. */
int32_t kvg_tokenizer_find_piece(const kvg_tokenizer *t, const char *piece, size_t len);

/* Decodes ids into text bytes (malloc'd, NUL-terminated, *out_len excludes the NUL).
 * For SentencePiece vocabularies the dummy-prefix space of the first piece is
 * dropped, so decode(encode(s)) == s. Returns 0, or -1 with err on a bad id. */
int kvg_tokenizer_decode(const kvg_tokenizer *t, const int32_t *ids, size_t n_ids,
                         char **out, size_t *out_len, char *err, size_t err_len);

/* Streaming-safe incremental decoding: push ids one at a time, get back only
 * complete UTF-8 characters; bytes of a character split over several tokens are
 * held until it completes. A sequence that can never complete is emitted as
 * U+FFFD. Decoding token by token yields exactly kvg_tokenizer_decode()'s bytes
 * whenever those are valid UTF-8. */
typedef struct kvg_detok {
    const kvg_tokenizer *tok;
    unsigned char pending[8];    /* held-back bytes of an incomplete character */
    size_t n_pending;
    int at_start;                /* nothing emitted yet: strip the SPM dummy space */
} kvg_detok;

void kvg_detok_init(kvg_detok *d, const kvg_tokenizer *t);
/* Appends the newly complete bytes for `id` to out (capacity cap). Returns the
 * number of bytes written, or -1 for a bad id or if cap is too small (then
 * nothing changes). cap >= token length + 8 suffices while the text is valid
 * UTF-8; bytes that are not become U+FFFD (3 bytes each at worst), so
 * cap >= 3 * (token length + 4) always suffices. */
long kvg_detok_push(kvg_detok *d, int32_t id, char *out, size_t cap);
/* Flushes whatever is held at end of stream (as U+FFFD). Returns bytes written. */
long kvg_detok_flush(kvg_detok *d, char *out, size_t cap);

#endif
