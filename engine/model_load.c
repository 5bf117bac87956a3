/* kvg_model_load: recognises the format of a path and hands it to its loader. The top
 * of model loading: it calls the format loaders (model_formats.h), which call the
 * shared helpers below them (model_internal.h, model_common.c). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errmsg.h"
#include "model.h"
#include "model_formats.h"

static int is_safetensors(const unsigned char *h, size_t n)
{
    return n >= 9 && h[8] == '{' && h[4] == 0 && h[5] == 0 && h[6] == 0 && h[7] == 0;
}

kvg_model *kvg_model_load(const char *path, const kvg_model_load_opts *opts, char *err, size_t err_len)
{
    static const kvg_model_load_opts none;
    struct stat st;
    char sink[8];

    if (!err || err_len == 0) {
        err = sink;
        err_len = sizeof sink;
    }
    if (!opts)
        opts = &none;
    if (!path || !*path) {
        kvg_set_err(err, err_len, "no model path");
        return NULL;
    }
    if (strncmp(path, "synthetic:", 10) == 0)
        return kvgm_load_synthetic(path, opts, err, err_len);
    if (stat(path, &st) < 0) {
        kvg_set_err(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        char cfg[4096];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        if (access(cfg, F_OK) != 0) {
            kvg_set_err(err, err_len, "%s: a directory without config.json (a Hugging Face model directory "
                     "needs one)", path);
            return NULL;
        }
        return kvgm_load_hf(path, opts, err, err_len);
    }
    if (!S_ISREG(st.st_mode)) {
        kvg_set_err(err, err_len, "%s: not a regular file or directory", path);
        return NULL;
    }
    unsigned char head[16] = { 0 };
    size_t n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        kvg_set_err(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    n = fread(head, 1, sizeof head, f);
    fclose(f);
    if (n >= 4 && memcmp(head, "GGUF", 4) == 0)
        return kvgm_load_gguf(path, opts, err, err_len);
    if (is_safetensors(head, n)) {
        kvg_set_err(err, err_len, "%s: a safetensors file; load the Hugging Face directory that holds it and "
                 "its config.json", path);
        return NULL;
    }
    return kvgm_load_llama2c(path, opts, err, err_len);
}
