/* Shared by the CUDA backend's launch-counting tests (t/unit/cuda_gemm.c, cuda_fuse.c): a
 * 20-token prompt in one step, then 3 decode steps, on an emulated backend. Include after
 * tap.h, engine_testmodel.h, forward.h, kv_cache.h and kvg_cuda_api.h. */
#ifndef KVG_T_CUDA_STEPS_H
#define KVG_T_CUDA_STEPS_H

/* Logits of each step (4 x vocab) into rec; the kernel launches and cuBLASLt calls of the
 * last decode step. */
static int cuda_steps(kvg_forward *fw, kvg_kv_pool *kv, int V, float *rec, long *launches, long *gemms)
{
    int32_t p[20], t;
    uint64_t s = 5;
    kvg_kv_seq seq;
    char err[512] = "";
    int rc = 0;
    for (int i = 0; i < 20; i++)
        p[i] = (int32_t)(tm_rng(&s) % (uint32_t)V);
    kvg_kv_seq_init(&seq);
    {
        kvg_fwd_seq b = { &seq, p, 20, rec };
        rc = kvg_forward_step(fw, &b, 1, err, sizeof err);
    }
    for (int g = 1; g < 4 && rc == 0; g++) {
        long l0 = kvg_emu_calls("launch"), g0 = kvg_emu_calls("cublasLtMatmul");
        kvg_fwd_seq b = { &seq, &t, 1, rec + (size_t)g * V };
        t = (int32_t)((g * 7919) % V);
        rc = kvg_forward_step(fw, &b, 1, err, sizeof err);
        *launches = kvg_emu_calls("launch") - l0;
        *gemms = kvg_emu_calls("cublasLtMatmul") - g0;
    }
    if (rc)
        diag("forward: %s", err);
    kvg_kv_seq_release(kv, &seq);
    return rc;
}

#endif
