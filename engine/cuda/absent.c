/* The CUDA backend of a build made without nvcc (or with CUDA=0): --backend cuda names
 * the reason instead of failing as an unknown backend. */
#include "backend.h"
#include "backend_testing.h"
#include "errmsg.h"

kvg_backend *kvg_backend_cuda_new(const kvg_model *m, const kvg_backend_opts *o,
                                  char *err, size_t err_len)
{
    (void)m;
    (void)o;
    kvg_set_err(err, err_len, "this kvgate was built without CUDA (nvcc was not found, or CUDA=0): "
                "rebuild with the CUDA toolkit installed to use --backend cuda");
    return NULL;
}

int kvg_backend_cuda_probe(int device, char *err, size_t err_len)
{
    (void)device;
    kvg_backend_cuda_new(NULL, NULL, err, err_len);
    return -1;
}

int kvg_backend_cuda_built(void)
{
    return 0;
}
