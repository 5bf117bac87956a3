/* For tests only: the rendered segments' text (chat_template.c), which the unit test
 * compares with the reference templates' output and the request fuzz target
 * exercises. Not the library's API: nothing outside t/ and fuzz/ calls these (the
 * gateway tokenizes the segments one by one). */
#ifndef KVG_CHAT_TEMPLATE_TESTING_H
#define KVG_CHAT_TEMPLATE_TESTING_H

#include "chat_template.h"

/* Length of the segments' concatenated text. */
size_t kvg_chat_segments_len(const kvg_chat_segment *segs, size_t n);

/* The concatenated text, malloc'd and NUL-terminated (for logs/debugging);
 * *len (may be NULL) gets its length. NULL when out of memory. */
char *kvg_chat_segments_text(const kvg_chat_segment *segs, size_t n, size_t *len);

#endif
