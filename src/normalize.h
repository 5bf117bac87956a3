/* Prompt normalizer: optional clean-up steps applied to message content before it
 * is tokenized and hashed. The normalized text is what the model sees — the caller
 * must tokenize exactly the output, never hash one text and run another.
 *
 * Steps (each a flag; names as accepted in configuration, e.g. the nginx directive
 * `kvgate_normalize off | <step>...;`), applied in this fixed order:
 *
 *   nfc          Unicode NFC (canonical composition, via utf8proc's data).
 *   newlines     CRLF and lone CR become LF (before junk, so that "\r------\n" gives
 *                the same "\n\n" as "\n------\n", not a CRLF).
 *   junk         Drops every run of 6 or more of the same ASCII punctuation character
 *                (------, ======, ******, ......., ######), together with any combining
 *                marks attached right after it. Runs that only become 6 long once a
 *                run between them is dropped ("===------===") are dropped too.
 *   spaces       Every run of spaces and tabs becomes one space (this also flattens
 *                indentation, so leave it off for code-heavy prompts).
 *   trailing     Strips spaces and tabs at the end of every line and of the text.
 *   blank-lines  Any run of 3 or more LF (2 or more blank lines) becomes "\n\n" (one
 *                blank line); a line holding only spaces is not blank unless
 *                "trailing" is on.
 *
 * Only LF ends a line for the later steps: with "newlines" off a CR is an ordinary
 * character. "Whitespace" means space and tab only (no-break spaces and other
 * Unicode spaces are left alone).
 *
 * Properties (t/unit/normalize.c, fuzz/fuzz_normalize.c): for every combination of
 * steps the result is valid UTF-8 and normalizing it again changes nothing. The order
 * is what makes that hold: each step's output is left a fixed point of every earlier
 * step by the later ones — NFC runs first because it can create punctuation (U+037E
 * becomes ';') and absorb it ('=' + U+0338 becomes U+2260); junk runs before the
 * whitespace steps because dropping a run leaves spaces to collapse and lines to
 * strip; blank-lines runs last because stripping can empty a line. Dropping a junk
 * run can bring a Hangul leading consonant and vowel together; only then is NFC run
 * a second time.
 *
 * Invalid UTF-8 input is an error naming the byte offset. Cost is linear: one pass
 * per enabled step (nfc validates as it goes; without it one validation pass), each
 * skipping untouched stretches with memchr-like scans; all steps but nfc work in
 * place. */
#ifndef KVG_NORMALIZE_H
#define KVG_NORMALIZE_H

#include <stddef.h>

#define KVG_NORM_NFC          0x01u
#define KVG_NORM_NEWLINES     0x02u
#define KVG_NORM_JUNK         0x04u
#define KVG_NORM_SPACES       0x08u
#define KVG_NORM_TRAILING     0x10u
#define KVG_NORM_BLANK_LINES  0x20u
#define KVG_NORM_ALL          0x3Fu
#define KVG_NORM_DEFAULT      KVG_NORM_ALL

/* Parses one word: a step name, "all" (every step) or "off"/"none" (no step).
 * name need not be NUL-terminated. Returns 0 and sets *flags, or -1 with
 * "unknown normalize step 'xyz' (expected ...)". */
int kvg_normalize_parse_step(const char *name, size_t len, unsigned *flags,
                             char *err, size_t err_len);

/* Normalizes in[0..len) under flags into a malloc'd NUL-terminated buffer (*out_len
 * excludes the NUL); the caller frees *out. 0, or -1 with err (invalid UTF-8: "invalid
 * UTF-8 at byte offset N"; unknown flag bits; input too large; out of memory), *out
 * NULL then. */
int kvg_normalize(unsigned flags, const char *in, size_t len, char **out, size_t *out_len,
                  char *err, size_t err_len);

#endif
