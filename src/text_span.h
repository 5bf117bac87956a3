/* A run of bytes inside a text: [off, off + len). Used for the parts of a
 * rendered prompt that are data (jinja.h) and must be tokenized as such
 * (tokenizer.h's kvg_tokenizer_encode_spans). */
#ifndef KVG_TEXT_SPAN_H
#define KVG_TEXT_SPAN_H

#include <stddef.h>

typedef struct kvg_text_span {
    size_t off, len;
} kvg_text_span;

#endif
