/* The CUDA backend (emulated here, as every t/unit/cuda_*.c) has no mixture-of-experts
 * operation yet: it refuses a qwen3moe model when it is created, saying why, before it
 * touches the device. */
#include <stdio.h>
#include <string.h>

#include "tap.h"
#include "backend.h"
#include "backend_testing.h"
#include "moe_model.h"

int main(void)
{
    moe_spec s = { 64, 4, 2, 16, 1, 4, 2, 32, 300, 64, KVG_DT_F32, KVG_DT_F32, 1, 0, 0, 3 };
    char err[512] = "";
    kvg_backend_opts o;
    kvg_backend *be;
    kvg_model *m;

    ok(kvg_backend_cuda_built(), "the emulated CUDA backend is linked");
    m = moe_load(&s, "cuda", err, sizeof err);
    if (!ok(m != NULL, "a qwen3moe model loads"))
        diag("%s", err);
    memset(&o, 0, sizeof o);
    o.batch_invariant = 1;
    be = m ? kvg_backend_cuda_new(m, &o, err, sizeof err) : NULL;
    ok(m && !be && strstr(err, "cuda: qwen3moe models need mixture-of-experts feed-forward layers"),
       "the CUDA backend refuses it by name (%s)", err);
    be = m ? kvg_backend_new_opts("cuda", m, &o, err, sizeof err) : NULL;
    ok(m && !be && strstr(err, "mixture-of-experts"), "so does --backend cuda (%s)", err);
    kvg_backend_free(be);
    kvg_model_free(m);
    return done_testing();
}
