/* UTF-8 helpers shared by the tokenizers, the normalizer and the request parser. */
#ifndef KVG_UTF8_H
#define KVG_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the UTF-8 sequence announced by lead byte c (1..4), 0 if c cannot start one. */
int kvg_utf8_seq_len(unsigned char c);

/* Decodes one code point at s (n bytes available). Returns its byte length (1..4) and
 * stores the code point in *cp, or returns 0 when the bytes are not valid UTF-8
 * (truncated, overlong, surrogate, > U+10FFFF). */
int kvg_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Encodes cp (must be <= 0x10FFFF and not a surrogate) into out (>= 4 bytes); returns length. */
int kvg_utf8_encode(uint32_t cp, unsigned char *out);

/* Returns the offset of the first invalid byte, or (size_t)-1 when all of s[0..n) is valid. */
size_t kvg_utf8_invalid_at(const unsigned char *s, size_t n);

#endif
