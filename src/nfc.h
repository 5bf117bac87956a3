/* Unicode NFC into a caller-provided buffer, in linear time, on top of utf8proc's
 * character data (decomposition, combining classes, composition).
 *
 * utf8proc's own utf8proc_map()/utf8proc_NFC() decode the whole text into a
 * malloc'd UTF-32 buffer (4-8x the input) and order combining marks with a bubble
 * sort, which is quadratic on a long run of marks (a cheap way to stall a worker).
 * Here the text is cut into segments at characters nothing can compose with or
 * reorder across (kvg_nfc_boundary), so each segment is normalized on its own in a
 * small scratch buffer, and runs of marks are ordered with a stable counting sort. */
#ifndef KVG_NFC_H
#define KVG_NFC_H

#include <stddef.h>
#include <stdint.h>

/* True when NFC never changes anything across the point just before cp: cp has
 * combining class 0, is not a mark, can never be the second half of a canonical
 * composition (Hangul medial vowels and final consonants can), and its own
 * decomposition starts with a starter. Every ASCII character qualifies.
 * t/unit/nfc.c checks this against utf8proc's data for every code point. */
int kvg_nfc_boundary(uint32_t cp);

/* Upper bound of NFC's output size for in[0..len): a character's canonical
 * decomposition is at most 3x its UTF-8 length and composition never grows text,
 * while ASCII maps to itself. Returns SIZE_MAX on overflow. */
size_t kvg_nfc_bound(const unsigned char *in, size_t len);

/* Writes NFC(in[0..len)) to out (cap bytes; kvg_nfc_bound() always suffices; in and
 * out must not overlap). Returns 0, or -1 with err: "invalid UTF-8 at byte offset
 * N" (every byte is checked), out of memory, output larger than cap. May malloc a
 * scratch buffer when a segment (a character and the marks and jamo that follow it)
 * is longer than a few hundred code points; frees it before returning. */
int kvg_nfc(const unsigned char *in, size_t len, unsigned char *out, size_t cap,
            size_t *out_len, char *err, size_t err_len);

#endif
