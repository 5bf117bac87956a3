/* What every backend does alike when it is created: the model checks each makes (head
 * size, RoPE scaling) and the allocation of the backend and its state. Apart from
 * backend.c, which names every backend (backend.c says why). */
#include "backend.h"
#include "errmsg.h"
#include "rope.h"

#include <stdlib.h>

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
