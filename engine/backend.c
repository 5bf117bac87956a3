/* Backend selection by name (--backend). */
#include "backend.h"
#include "errmsg.h"

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

kvg_backend *kvg_backend_new(const char *name, const kvg_model *m, int n_threads,
                             char *err, size_t err_len)
{
    kvg_backend_opts o;
    memset(&o, 0, sizeof o);
    o.n_threads = n_threads;
    o.batch_invariant = 1;
    return kvg_backend_new_opts(name, m, &o, err, err_len);
}
