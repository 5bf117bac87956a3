#include "chat_choice.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errmsg.h"
#include "jinja.h"

/* The largest template file accepted (real ones are under 20 KB). */
#define MAX_TEMPLATE_FILE (1u << 20)

static char *read_file(const char *path, size_t *len, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;

    if (!f) {
        kvg_set_err(err, err_len, "--chat-template %s: not a built-in (" KVG_CHAT_BUILTIN_NAMES ") and "
                    "not a readable file: %s", path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        kvg_set_err(err, err_len, "--chat-template %s: cannot read it", path);
    } else if ((unsigned long)n > MAX_TEMPLATE_FILE) {
        kvg_set_err(err, err_len, "--chat-template %s: %ld bytes is more than a template (%u at most)",
                    path, n, MAX_TEMPLATE_FILE);
    } else if (!(buf = malloc((size_t)n + 1))) {
        kvg_set_err(err, err_len, "--chat-template %s: out of memory", path);
    } else if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        kvg_set_err(err, err_len, "--chat-template %s: cannot read it", path);
        free(buf);
        buf = NULL;
    } else {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    fclose(f);
    return buf;
}

int kvg_chat_choose(kvg_chat_choice *c, const char *arg, const kvg_model *m, char *err, size_t err_len)
{
    const char *builtin = kvg_chat_builtin(arg);
    char local[512];
    kvg_jinja *j;

    memset(c, 0, sizeof *c);
    if (builtin) {
        c->len = strlen(builtin);
        c->src = strdup(builtin);
        kvg_chat_template_describe(&c->info, KVG_CHAT_BUILTIN, arg, "built-in", builtin, c->len);
    } else if (arg) {
        if (!(c->src = read_file(arg, &c->len, err, err_len)))
            return -1;
        kvg_chat_template_describe(&c->info, KVG_CHAT_FILE, "file", arg, c->src, c->len);
    } else if (m->chat_template) {
        c->len = strlen(m->chat_template);
        c->src = strdup(m->chat_template);
        kvg_chat_template_describe(&c->info, KVG_CHAT_MODEL, "model", m->chat_template_from,
                                   m->chat_template, c->len);
    } else {
        kvg_chat_template_describe(&c->info, KVG_CHAT_NONE, NULL, NULL, NULL, 0);
        return 0;
    }
    if (!c->src) {
        kvg_set_err(err, err_len, "out of memory");
        return -1;
    }
    j = kvg_jinja_compile(c->src, c->len, c->info.source, local, sizeof local);
    if (!j) {
        kvg_set_err(err, err_len, "the chat template cannot be used: %s%s", local,
                    c->info.origin == KVG_CHAT_MODEL
                        ? " (name another with --chat-template FILE.jinja or " KVG_CHAT_BUILTIN_NAMES ")" : "");
        kvg_chat_choice_free(c);
        return -1;
    }
    kvg_jinja_free(j);
    return 0;
}

void kvg_chat_choice_free(kvg_chat_choice *c)
{
    free(c->src);
    memset(c, 0, sizeof *c);
}
