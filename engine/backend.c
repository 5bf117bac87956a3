/* Backend selection by name (--backend), the KV pool's host fallbacks, and what every
 * implementation does alike when it is created. */
#include "backend.h"
#include "errmsg.h"
#include "rope.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvg_backend *kvg_backend_new_opts(const char *name, const kvg_model *m, const kvg_backend_opts *o,
                                  char *err, size_t err_len)
{
    if (name && strcmp(name, "cpu") == 0)
        return kvg_backend_cpu_new(m, o->n_threads, err, err_len);
    if (name && strcmp(name, "cuda") == 0)
        return kvg_backend_cuda_new(m, o, err, err_len);
    kvg_set_err(err, err_len, "unknown backend '%s' (available: cpu, cuda)", name ? name : "(null)");
    return NULL;
}

kvg_kv_pool *kvg_backend_kv_pool_new(kvg_backend *be, const kvg_kv_geom *g, int32_t n_blocks,
                                     char *err, size_t err_len)
{
    if (be && be->ops->kv_pool_new)
        return be->ops->kv_pool_new(be, g, n_blocks, err, err_len);
    return kvg_kv_pool_new(g, n_blocks, err, err_len);
}

size_t kvg_backend_kv_block_bytes(kvg_backend *be, const kvg_kv_geom *g)
{
    if (be && be->ops->kv_block_bytes)
        return be->ops->kv_block_bytes(be, g);
    return kvg_kv_block_bytes(g);
}

int32_t kvg_backend_kv_blocks_for_budget(kvg_backend *be, const kvg_kv_geom *g, size_t bytes)
{
    size_t bb = kvg_backend_kv_block_bytes(be, g);
    size_t n;
    if (!bb)
        return 0;
    n = bytes / bb;
    return n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

size_t kvg_backend_kv_default_budget(kvg_backend *be, double fraction, size_t host_default)
{
    size_t fr = 0, total = 0;
    if (!be || !be->ops->mem_free || be->ops->mem_free(be, &fr, &total) != 0)
        return host_default;
    return (size_t)((double)fr * fraction);
}

const char *kvg_backend_describe(kvg_backend *be, char *buf, size_t len)
{
    const char *d = be && be->ops->describe ? be->ops->describe(be) : NULL;
    if (d)
        snprintf(buf, len, "%s (%s)", be->ops->name, d);
    else
        snprintf(buf, len, "%s", be ? be->ops->name : "none");
    return buf;
}

int kvg_backend_check_model(const kvg_model *m, const char *who, int max_head_dim,
                            char *err, size_t err_len)
{
    int hd = m->cfg.head_dim;
    const char *rope;

    if (hd <= 0 || hd % 2 != 0 || (max_head_dim > 0 && hd > max_head_dim)) {
        if (max_head_dim > 0)
            kvg_set_err(err, err_len, "%s: head_dim %d must be even and at most %d", who, hd, max_head_dim);
        else
            kvg_set_err(err, err_len, "%s: head_dim %d must be even and positive", who, hd);
        return -1;
    }
    rope = kvg_rope_config_error(&m->cfg);
    if (rope) {
        kvg_set_err(err, err_len, "%s: %s", who, rope);
        return -1;
    }
    return 0;
}

kvg_backend *kvg_backend_alloc(const kvg_backend_ops *ops, const kvg_model *m, size_t ctx_size,
                               const char *who, char *err, size_t err_len)
{
    kvg_backend *be = calloc(1, sizeof *be);
    void *ctx = calloc(1, ctx_size);

    if (!be || !ctx) {
        free(be);
        free(ctx);
        kvg_set_err(err, err_len, "%s: out of memory", who);
        return NULL;
    }
    be->ops = ops;
    be->ctx = ctx;
    be->model = m;
    return be;
}
