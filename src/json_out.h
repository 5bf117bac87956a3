/* Writing JSON string contents fast, without building a document: the gateway streams
 * a chunk per token batch, so the text goes straight into its output buffer.
 *
 * Escaping: '"' and '\' get a backslash, control characters and DEL become \u00XX
 * (\n, \r, \t as themselves escaped), bytes that are not valid UTF-8 become \ufffd,
 * valid UTF-8 is copied as it is. So the output is always valid JSON, whatever the
 * bytes. */
#ifndef KVG_JSON_OUT_H
#define KVG_JSON_OUT_H

#include <stddef.h>

/* Bytes kvg_json_escape writes for s[0..len) (at most 6 * len). */
size_t kvg_json_escape_len(const char *s, size_t len);
/* Writes the escaped contents (no quotes) to out; returns the bytes written. */
size_t kvg_json_escape(char *out, const char *s, size_t len);

#endif
