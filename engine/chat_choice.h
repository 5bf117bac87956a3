/* Which chat template the engine offers its clients (chat_template.h says the
 * order): the operator's --chat-template (a built-in's name or a Jinja file),
 * else the model's own, else none. The choice is compiled here, once, so that a
 * template this project cannot render stops the engine at startup with the
 * file, line and column, never a request later. */
#ifndef KVG_CHAT_CHOICE_H
#define KVG_CHAT_CHOICE_H

#include <stddef.h>

#include "chat_template.h"
#include "model.h"

typedef struct kvg_chat_choice {
    kvg_chat_template_info info;
    char *src;                   /* the Jinja source (malloc'd), NULL for none */
    size_t len;
} kvg_chat_choice;

/* arg: the --chat-template value or NULL. 0, or -1 with err. */
int kvg_chat_choose(kvg_chat_choice *c, const char *arg, const kvg_model *m, char *err, size_t err_len);
void kvg_chat_choice_free(kvg_chat_choice *c);

#endif
