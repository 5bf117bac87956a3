/* The CUDA backend (emulated here, as every t/unit/cuda_*.c) has no mixture-of-experts
 * operation yet: it refuses a qwen3moe model when it is created, saying why, before it
 * touches the device. Nor has it MXFP4 kernels: a model with MXFP4 matrices (experts,
 * as gpt-oss's, or a dense model's) is refused naming the type and a tensor. */
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

    s.exp_dt = s.down_dt = KVG_DT_MXFP4;
    m = moe_load(&s, "cuda-mx", err, sizeof err);
    if (!ok(m != NULL, "a qwen3moe model with MXFP4 experts loads"))
        diag("%s", err);
    be = m ? kvg_backend_cuda_new(m, &o, err, sizeof err) : NULL;
    ok(m && !be && strstr(err, "blk.0.ffn_gate_exps") && strstr(err, "is MXFP4, which this backend does not run"),
       "the CUDA backend refuses MXFP4 experts by name (%s)", err);
    kvg_backend_free(be);
    /* Any matrix: layer 0's attn_v marked MXFP4 (the refusal reads no weight bytes;
     * the layer's matrices are looked at before its experts). */
    if (m) {
        kvg_tensor *v = &m->layers[0].wv;
        kvg_dtype keep = v->dtype;
        v->dtype = KVG_DT_MXFP4;
        be = kvg_backend_cuda_new(m, &o, err, sizeof err);
        ok(!be && strstr(err, "blk.0.attn_v") && strstr(err, "MXFP4"), "and an MXFP4 attn_v (%s)", err);
        kvg_backend_free(be);
        v->dtype = keep;
    }
    kvg_model_free(m);
    return done_testing();
}
