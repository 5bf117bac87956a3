/* chat_source.h: a model's chat template and BOS/EOS texts, from a GGUF's
 * metadata or a Hugging Face tokenizer's files. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "chat_source.h"
#include "gguf.h"

__attribute__((format(printf, 3, 4)))
static int fail(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;

    if (err_len) {
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

__attribute__((format(printf, 1, 2)))
static char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *s;
    int n;

    va_start(ap, fmt);
    n = vasprintf(&s, fmt, ap);
    va_end(ap);
    return n < 0 ? NULL : s;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

void kvg_chat_source_free(kvg_chat_source *s)
{
    free(s->template_src);
    free(s->where);
    free(s->tokenizer_path);
    free(s->bos_token);
    free(s->eos_token);
    memset(s, 0, sizeof *s);
}

/* ---- GGUF ---- */

/* The piece of the token whose id metadata key id_key holds; NULL when absent. */
static char *gguf_piece(const kvg_gguf *g, const char *id_key)
{
    const kvg_gguf_kv *tokens = kvg_gguf_get_arr(g, "tokenizer.ggml.tokens", KVG_GGUF_STRING);
    kvg_gguf_str s;
    uint64_t id;

    if (!tokens || kvg_gguf_get_u64(g, id_key, &id) < 0 || kvg_gguf_arr_str(tokens, id, &s) < 0)
        return NULL;
    return dup_n(s.s, s.len);
}

static int from_gguf(const char *path, const void *map, size_t size, kvg_chat_source *out,
                     char *err, size_t err_len)
{
    kvg_gguf *g = kvg_gguf_parse(map, size, path, err, err_len);
    kvg_gguf_str tpl;
    int rc = 0;

    if (!g)
        return -1;
    if (kvg_gguf_get_str(g, "tokenizer.chat_template", &tpl) < 0) {
        rc = fail(err, err_len, "%s: no chat template (the GGUF has no tokenizer.chat_template)", path);
    } else {
        out->template_src = dup_n(tpl.s, tpl.len);
        out->template_len = tpl.len;
        out->where = xasprintf("%s tokenizer.chat_template", path);
        out->tokenizer_path = strdup(path);
        out->bos_token = gguf_piece(g, "tokenizer.ggml.bos_token_id");
        out->eos_token = gguf_piece(g, "tokenizer.ggml.eos_token_id");
        if (!out->template_src || !out->where || !out->tokenizer_path)
            rc = fail(err, err_len, "%s: out of memory", path);
    }
    kvg_gguf_free(g);
    return rc;
}

/* ---- Hugging Face files ---- */

/* tokenizer_config.json's bos_token / eos_token: a string, or an added-token
 * object {"content": ...}; NULL when absent or null. */
static int special_text(const json_t *cfg, const char *key, char **out)
{
    json_t *v = json_object_get(cfg, key);

    *out = NULL;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return 0;
    *out = dup_n(json_string_value(v), json_string_length(v));
    return *out ? 0 : -1;
}

/* tokenizer_config.json's chat_template: a string, or the "default" entry of a
 * list of {"name", "template"}. 1 when found, 0 when the file has none, -1 on
 * an error. */
static int config_template(const char *cfg_path, const json_t *cfg, kvg_chat_source *out,
                           char *err, size_t err_len)
{
    json_t *t = json_object_get(cfg, "chat_template");
    const char *suffix = "chat_template";

    if (!t || json_is_null(t))
        return 0;
    if (json_is_array(t)) {
        json_t *found = NULL;
        for (size_t i = 0; i < json_array_size(t) && !found; i++) {
            json_t *e = json_array_get(t, i);
            if (json_is_string(json_object_get(e, "name"))
                && strcmp(json_string_value(json_object_get(e, "name")), "default") == 0)
                found = json_object_get(e, "template");
        }
        if (!found)
            return fail(err, err_len, "%s: chat_template is a list of named templates without "
                        "one named \"default\"", cfg_path);
        t = found;
        suffix = "chat_template \"default\"";
    }
    if (!json_is_string(t))
        return fail(err, err_len, "%s: chat_template is neither a string nor a list of "
                    "{\"name\", \"template\"}", cfg_path);
    out->template_src = dup_n(json_string_value(t), json_string_length(t));
    out->template_len = json_string_length(t);
    out->where = xasprintf("%s %s", cfg_path, suffix);
    if (!out->template_src || !out->where)
        return fail(err, err_len, "%s: out of memory", cfg_path);
    return 1;
}

/* Reads a whole file; NULL with errno when it cannot. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0;

    if (!f)
        return NULL;
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap ? cap * 2 : 65536);
            if (!nb)
                break;
            buf = nb;
            cap = cap ? cap * 2 : 65536;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f) || !buf) {
        int e = ferror(f) ? EIO : ENOMEM;
        fclose(f);
        free(buf);
        errno = e;
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int from_dir(const char *dir, kvg_chat_source *out, char *err, size_t err_len)
{
    char *cfg_path = xasprintf("%s/tokenizer_config.json", dir);
    char *jinja_path = xasprintf("%s/chat_template.jinja", dir);
    json_t *cfg = NULL;
    json_error_t je;
    int rc = 0, found = 0;

    if (!cfg_path || !jinja_path) {
        rc = fail(err, err_len, "%s: out of memory", dir);
        goto done;
    }
    if (access(cfg_path, F_OK) == 0) {
        /* every number as a double: model_max_length is often 1e30 written
         * out as an integer, which jansson's integers cannot hold */
        if (!(cfg = json_load_file(cfg_path, JSON_DECODE_INT_AS_REAL, &je))) {
            rc = fail(err, err_len, "%s:%d:%d: %s", cfg_path, je.line, je.column, je.text);
            goto done;
        }
        if (!json_is_object(cfg)) {
            rc = fail(err, err_len, "%s: not a JSON object", cfg_path);
            goto done;
        }
        if (special_text(cfg, "bos_token", &out->bos_token) < 0
            || special_text(cfg, "eos_token", &out->eos_token) < 0) {
            rc = fail(err, err_len, "%s: out of memory", cfg_path);
            goto done;
        }
    }
    if (access(jinja_path, F_OK) == 0) {
        if (!(out->template_src = read_file(jinja_path, &out->template_len))) {
            rc = fail(err, err_len, "%s: cannot read: %s", jinja_path, strerror(errno));
            goto done;
        }
        if (!(out->where = strdup(jinja_path))) {
            rc = fail(err, err_len, "%s: out of memory", jinja_path);
            goto done;
        }
        found = 1;
    } else if (cfg && (found = config_template(cfg_path, cfg, out, err, err_len)) < 0) {
        rc = -1;
        goto done;
    }
    if (!found) {
        rc = fail(err, err_len, "%s: no chat template (neither chat_template.jinja nor a "
                  "chat_template in tokenizer_config.json)", dir);
        goto done;
    }
    if (!out->tokenizer_path && !(out->tokenizer_path = xasprintf("%s/tokenizer.json", dir)))
        rc = fail(err, err_len, "%s: out of memory", dir);
done:
    json_decref(cfg);
    free(cfg_path);
    free(jinja_path);
    return rc;
}

/* ---- dispatch ---- */

static int from_file(const char *path, int fd, size_t size, kvg_chat_source *out, char *err,
                     size_t err_len)
{
    unsigned char head[4] = { 0 };
    ssize_t got = pread(fd, head, sizeof head, 0);
    size_t i = 0;

    if (got < 0)
        return fail(err, err_len, "%s: cannot read: %s", path, strerror(errno));
    if (got == 4 && memcmp(head, "GGUF", 4) == 0) {
        void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        int rc;
        if (map == MAP_FAILED)
            return fail(err, err_len, "%s: cannot map: %s", path, strerror(errno));
        rc = from_gguf(path, map, size, out, err, err_len);
        munmap(map, size);
        return rc;
    }
    while (i < (size_t)got && (head[i] == ' ' || head[i] == '\n' || head[i] == '\r' || head[i] == '\t'))
        i++;
    if (i < (size_t)got && head[i] == '{') {
        /* a tokenizer.json: its configuration lies beside it */
        const char *slash = strrchr(path, '/');
        char *dir = slash ? dup_n(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
        int rc;
        if (!dir || !(out->tokenizer_path = strdup(path))) {
            free(dir);
            return fail(err, err_len, "%s: out of memory", path);
        }
        rc = from_dir(dir, out, err, err_len);
        free(dir);
        return rc;
    }
    return fail(err, err_len, "%s: no chat template (neither a GGUF nor a Hugging Face "
                "tokenizer.json: a llama2.c tokenizer carries none)", path);
}

int kvg_chat_source_load(const char *path, kvg_chat_source *out, char *err, size_t err_len)
{
    struct stat st;
    int fd, rc;

    memset(out, 0, sizeof *out);
    if (stat(path, &st) < 0)
        return fail(err, err_len, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        rc = from_dir(path, out, err, err_len);
    else if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return fail(err, err_len, "%s: cannot open: %s", path, strerror(errno));
    else {
        rc = from_file(path, fd, (size_t)st.st_size, out, err, err_len);
        close(fd);
    }
    if (rc < 0)
        kvg_chat_source_free(out);
    return rc;
}
