/* Backend selection by name (--backend) and the KV pool's host fallbacks. What every
 * implementation does alike when it is created is in backend_create.c: a program that makes
 * a CPU backend only (a benchmark, a test) links that, not this file's reference to the
 * CUDA backend, and so never maps the CUDA libraries (libcublasLt alone is ~150 MiB of
 * resident pages once loaded). */
#include "backend.h"
#include "errmsg.h"

#include <stdio.h>
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
    if (be && be->ops->kv_pool_new) {
        return be->ops->kv_pool_new(be, g, n_blocks, err, err_len);
    }
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
