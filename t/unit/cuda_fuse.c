/* The CUDA backend's fused producers of a GEMM's input (engine/cuda/cuda_fuse.c), emulated:
 *
 *   - kvg_k_rmsnorm_lowp, kvg_k_swiglu_lowp, kvg_k_geglu_lowp: the F32 output the plain
 *     kernel's bits, the copy the bits of kvg_k_to_lowp of that output, BF16 and F16, the
 *     float4 and the scalar variants (odd widths, a misaligned input, a scalar tail);
 *     a copy of type F32 or at an odd address refused;
 *   - kvg_k_add_rmsnorm: kvg_k_add then the norm, bit for bit (x, the output, the copy), in
 *     one launch; the output over y;
 *   - the record of what the GEMMs' scratch holds: a GEMM right after the norm skips its
 *     rounding; after an add over the norm's output, for fewer rows, or for a weight of
 *     another type it rounds again; the products are the bits of the unfused backend's;
 *   - whole forward passes (a 20-token prefill, 3 decode steps) with KVGATE_CUDA_FUSE=0 and
 *     on, with matmul_n and without: the same logits bit for bit, for stories260K, a
 *     qwen2-shaped model (biases), one with F16 and BF16 weights side by side, and a
 *     GeGLU one; the launches per decode step counted (kvg_emu_calls);
 *   - KVGATE_CUDA_FUSE=2 refused at creation. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "engine_testmodel.h"
#include "backend.h"
#include "backend_testing.h"
#include "cuda/cuda_internal.h"
#include "forward.h"
#include "kv_cache.h"
#include "kvg_cuda_api.h"
#include "model.h"
#include "cuda_steps.h"

/* ---- the kernels ---- */

static float *dev_copy(const float *h, size_t n)
{
    float *d = NULL;
    if (cudaMalloc((void **)&d, n * 4 + 64) != cudaSuccess)
        return NULL;
    if (h)
        cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice);
    return d;
}

static void rnd(float *v, size_t n, uint64_t *s, float scale)
{
    for (size_t i = 0; i < n; i++)
        v[i] = tm_unif(s) * scale;
}

/* Bytes a and b of n equal (device buffers, read back). */
static int dev_same(const void *a, const void *b, size_t n)
{
    unsigned char *ha = malloc(n), *hb = malloc(n);
    int same = ha && hb && cudaDeviceSynchronize() == cudaSuccess &&
               cudaMemcpy(ha, a, n, cudaMemcpyDeviceToHost) == cudaSuccess &&
               cudaMemcpy(hb, b, n, cudaMemcpyDeviceToHost) == cudaSuccess && memcmp(ha, hb, n) == 0;
    free(ha);
    free(hb);
    return same;
}

static void kernel_rmsnorm(void)
{
    /* dim 64: float4; 37: scalar; 48 from a float off 16-byte alignment: scalar */
    static const int dims[3] = { 64, 37, 48 }, offs[3] = { 0, 0, 1 };
    const int rows = 7;
    for (int v = 0; v < 3; v++) {
        for (int dt = KVG_KT_F16; dt <= KVG_KT_BF16; dt++) {
            const int dim = dims[v];
            const size_t n = (size_t)rows * dim;
            float *hx = malloc((n + 1) * 4), *hw = malloc((size_t)dim * 4);
            float *x, *w, *o1, *o2;
            void *l1 = NULL, *l2 = NULL;
            uint64_t s = 11 + (uint64_t)v * 2 + (uint64_t)dt;
            cudaError_t e1, e2;
            rnd(hx, n + 1, &s, 3.0f);
            rnd(hw, (size_t)dim, &s, 1.5f);
            x = dev_copy(hx, n + 1);
            w = dev_copy(hw, (size_t)dim);
            o1 = dev_copy(NULL, n);
            o2 = dev_copy(NULL, n);
            cudaMalloc(&l1, n * 2);
            cudaMalloc(&l2, n * 2);
            e1 = kvg_k_rmsnorm(NULL, x + offs[v], w, 1e-5f, rows, dim, o1);
            if (e1 == cudaSuccess)
                e1 = kvg_k_to_lowp(NULL, o1, n, (kvg_kt)dt, l1);
            e2 = kvg_k_rmsnorm_lowp(NULL, x + offs[v], w, 1e-5f, rows, dim, o2, (kvg_kt)dt, l2);
            ok(e1 == cudaSuccess && e2 == cudaSuccess && dev_same(o1, o2, n * 4) && dev_same(l1, l2, n * 2),
               "rmsnorm_lowp %s, %d rows of %d%s: the output is rmsnorm's, the copy to_lowp's, bit for bit",
               dt == KVG_KT_BF16 ? "BF16" : "F16", rows, dim, offs[v] ? " (input off 16-byte alignment)" : "");
            if (v == 0 && dt == KVG_KT_BF16) {
                is_int(kvg_k_rmsnorm_lowp(NULL, x, w, 1e-5f, rows, dim, o2, KVG_KT_F32, l2), cudaErrorInvalidValue,
                       "rmsnorm_lowp: an F32 copy refused");
                is_int(kvg_k_rmsnorm_lowp(NULL, x, w, 1e-5f, rows, dim, o2, KVG_KT_BF16, (char *)l2 + 2),
                       cudaErrorInvalidValue, "rmsnorm_lowp: a copy not 4-byte aligned refused");
            }
            cudaFree(x);
            cudaFree(w);
            cudaFree(o1);
            cudaFree(o2);
            cudaFree(l1);
            cudaFree(l2);
            free(hx);
            free(hw);
        }
    }
}

/* kvg_k_add_rmsnorm = kvg_k_add, kvg_k_rmsnorm_lowp (or kvg_k_rmsnorm), bit for bit: x after
 * the add, the output, the copy. v: dim 64 (float4), 37 (scalar), 64 with y off 16-byte
 * alignment (float4 norm, the add on its own), 64 with out = y. */
static void kernel_add_rmsnorm(void)
{
    static const int dims[4] = { 64, 37, 64, 64 };
    const int rows = 6;
    for (int v = 0; v < 4; v++) {
        for (int dt = KVG_KT_F32; dt <= KVG_KT_BF16; dt++) {
            const int dim = dims[v], yoff = v == 2;
            const size_t n = (size_t)rows * dim;
            float *hx = malloc(n * 4), *hy = malloc((n + 1) * 4), *hw = malloc((size_t)dim * 4);
            float *x1, *x2, *y1, *y2, *w, *o1, *o2;
            void *l1 = NULL, *l2 = NULL, *lp2;
            uint64_t s = 51 + (uint64_t)(v * 3 + dt);
            cudaError_t e1, e2;
            long k0, k1;
            rnd(hx, n, &s, 3.0f);
            rnd(hy, n + 1, &s, 1.0f);
            rnd(hw, (size_t)dim, &s, 1.5f);
            x1 = dev_copy(hx, n);
            x2 = dev_copy(hx, n);
            y1 = dev_copy(hy, n + 1);
            y2 = dev_copy(hy, n + 1);
            w = dev_copy(hw, (size_t)dim);
            o1 = dev_copy(NULL, n);
            o2 = v == 3 ? y2 : dev_copy(NULL, n);
            cudaMalloc(&l1, n * 2);
            cudaMalloc(&l2, n * 2);
            lp2 = dt == KVG_KT_F32 ? NULL : l2;
            e1 = kvg_k_add(NULL, x1, y1 + yoff, n);
            if (e1 == cudaSuccess)
                e1 = dt == KVG_KT_F32 ? kvg_k_rmsnorm(NULL, x1, w, 1e-5f, rows, dim, o1)
                                      : kvg_k_rmsnorm_lowp(NULL, x1, w, 1e-5f, rows, dim, o1, (kvg_kt)dt, l1);
            k0 = kvg_emu_calls("launch");
            e2 = kvg_k_add_rmsnorm(NULL, x2, y2 + yoff, w, 1e-5f, rows, dim, o2, (kvg_kt)dt, lp2);
            k1 = kvg_emu_calls("launch") - k0;
            ok(e1 == cudaSuccess && e2 == cudaSuccess && dev_same(x1, x2, n * 4) && dev_same(o1, o2, n * 4) &&
               (dt == KVG_KT_F32 || dev_same(l1, l2, n * 2)) && k1 == (v == 2 ? 2 : 1),
               "add_rmsnorm%s, %d rows of %d%s: x, the output%s = add then rmsnorm's, bit for bit, %ld launch%s",
               dt == KVG_KT_F32 ? "" : dt == KVG_KT_BF16 ? " + BF16" : " + F16", rows, dim,
               v == 2 ? " (y off 16-byte alignment: the add apart)" : v == 3 ? " (out = y)" : "",
               dt == KVG_KT_F32 ? "" : ", the copy", k1, k1 == 1 ? "" : "es");
            cudaFree(x1);
            cudaFree(x2);
            cudaFree(y1);
            cudaFree(y2);
            cudaFree(w);
            cudaFree(o1);
            if (v != 3)
                cudaFree(o2);
            cudaFree(l1);
            cudaFree(l2);
            free(hx);
            free(hy);
            free(hw);
        }
    }
    is_int(kvg_k_add_rmsnorm(NULL, NULL, NULL, NULL, 1e-5f, 2, 8, NULL, KVG_KT_F32, NULL), cudaErrorInvalidValue,
           "add_rmsnorm without y refused");
}

static void kernel_glu(void)
{
    /* 1000: float4 only; 1003: float4 and a scalar tail; 998 from an odd offset: scalar */
    static const int ns[3] = { 1000, 1003, 998 }, offs[3] = { 0, 0, 1 };
    for (int gelu = 0; gelu < 2; gelu++) {
        for (int v = 0; v < 3; v++) {
            for (int dt = KVG_KT_F16; dt <= KVG_KT_BF16; dt++) {
                const size_t n = (size_t)ns[v];
                float *hg = malloc((n + 1) * 4), *hu = malloc((n + 1) * 4);
                float *g1, *g2, *u;
                void *l1 = NULL, *l2 = NULL;
                uint64_t s = 31 + (uint64_t)(gelu * 8 + v * 2 + dt);
                cudaError_t e1, e2;
                rnd(hg, n + 1, &s, 6.0f);
                rnd(hu, n + 1, &s, 2.0f);
                g1 = dev_copy(hg, n + 1);
                g2 = dev_copy(hg, n + 1);
                u = dev_copy(hu, n + 1);
                cudaMalloc(&l1, n * 2);
                cudaMalloc(&l2, n * 2);
                e1 = gelu ? kvg_k_geglu(NULL, g1 + offs[v], u + offs[v], n)
                          : kvg_k_swiglu(NULL, g1 + offs[v], u + offs[v], n);
                if (e1 == cudaSuccess)
                    e1 = kvg_k_to_lowp(NULL, g1 + offs[v], n, (kvg_kt)dt, l1);
                e2 = gelu ? kvg_k_geglu_lowp(NULL, g2 + offs[v], u + offs[v], n, (kvg_kt)dt, l2)
                          : kvg_k_swiglu_lowp(NULL, g2 + offs[v], u + offs[v], n, (kvg_kt)dt, l2);
                ok(e1 == cudaSuccess && e2 == cudaSuccess && dev_same(g1, g2, (n + 1) * 4) &&
                   dev_same(l1, l2, n * 2),
                   "%s_lowp %s, n = %zu%s: the output is %s's, the copy to_lowp's, bit for bit",
                   gelu ? "geglu" : "swiglu", dt == KVG_KT_BF16 ? "BF16" : "F16", n,
                   offs[v] ? " (off 16-byte alignment)" : "", gelu ? "geglu" : "swiglu");
                if (v == 0 && dt == KVG_KT_BF16)
                    is_int(kvg_k_swiglu_lowp(NULL, g2, u, n, KVG_KT_F32, l2), cudaErrorInvalidValue,
                           "swiglu_lowp: an F32 copy refused");
                cudaFree(g1);
                cudaFree(g2);
                cudaFree(u);
                cudaFree(l1);
                cudaFree(l2);
                free(hg);
                free(hu);
            }
        }
    }
}

/* ---- the backend ---- */

typedef struct rig {
    const kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
} rig;

/* fuse: the value of KVGATE_CUDA_FUSE at creation (NULL: unset). */
static int rig_new(rig *r, const kvg_model *m, const char *fuse)
{
    char err[512] = "";
    kvg_backend_opts o;
    kvg_kv_geom g;
    memset(r, 0, sizeof *r);
    memset(&o, 0, sizeof o);
    o.n_threads = 1;
    o.batch_invariant = 1;
    if (fuse)
        setenv("KVGATE_CUDA_FUSE", fuse, 1);
    r->m = m;
    r->be = kvg_backend_new_opts("cuda", m, &o, err, sizeof err);
    unsetenv("KVGATE_CUDA_FUSE");
    kvg_forward_kv_geom(m, 16, &g);
    r->kv = r->be ? kvg_backend_kv_pool_new(r->be, &g, 32, err, sizeof err) : NULL;
    r->fw = r->kv ? kvg_forward_new(m, r->be, r->kv, err, sizeof err) : NULL;
    if (!r->fw)
        diag("rig: %s", err);
    return r->fw ? 0 : -1;
}

static void rig_free(rig *r)
{
    kvg_forward_free(r->fw);
    kvg_kv_pool_free(r->kv);
    kvg_backend_free(r->be);
}

static kvg_cuda *cu_of(kvg_backend *be)
{
    return be->ctx;
}

/* The products of a norm's output through the backend's operations, in both backends
 * (a: fused, b: KVGATE_CUDA_FUSE=0): 5 rows of random x, normed with layer 0's attention
 * norm; then `mode` 0: matmul by wq (and its bias); 1: an add over the norm's output
 * first; 2: matmul of the first 4 rows only. 1 when both ran and gave the same bits; the
 * launches of a's sequence into *la. */
static int norm_then_gemm(kvg_backend *a, kvg_backend *b, const kvg_model *m, int mode, long *la)
{
    const kvg_model_config *cfg = &m->cfg;
    const kvg_layer_weights *L = &m->layers[0];
    const int rows = 5, dim = cfg->dim, N = (int)L->wq.rows, M = mode == 2 ? rows - 1 : rows;
    float *hx = malloc((size_t)rows * dim * 4), *hy[2] = { malloc((size_t)rows * N * 4), malloc((size_t)rows * N * 4) };
    uint64_t s = 99 + (uint64_t)mode;
    int fine = 1;
    rnd(hx, (size_t)rows * dim, &s, 2.0f);
    for (int k = 0; k < 2; k++) {
        kvg_backend *be = k ? b : a;
        float *x = be->ops->alloc(be, (size_t)rows * dim), *xb = be->ops->alloc(be, (size_t)rows * dim);
        float *y = be->ops->alloc(be, (size_t)rows * N);
        long l0;
        cudaMemcpy(x, hx, (size_t)rows * dim * 4, cudaMemcpyHostToDevice);
        l0 = kvg_emu_calls("launch");
        be->ops->rmsnorm(be, x, L->attn_norm, cfg->norm_eps, rows, dim, xb);
        if (mode == 1)
            be->ops->add(be, xb, x, (size_t)rows * dim);
        be->ops->matmul(be, xb, M, dim, &L->wq, L->bq, y);
        if (k == 0)
            *la = kvg_emu_calls("launch") - l0;
        cudaStreamSynchronize(cu_of(be)->stream);
        cudaMemcpy(hy[k], y, (size_t)M * N * 4, cudaMemcpyDeviceToHost);
        fine &= !cu_of(be)->failed;
        be->ops->free(be, x);
        be->ops->free(be, xb);
        be->ops->free(be, y);
    }
    fine &= memcmp(hy[0], hy[1], (size_t)M * N * 4) == 0;
    free(hx);
    free(hy[0]);
    free(hy[1]);
    return fine;
}

static void record(const kvg_model *m, const char *name)
{
    rig a, b;
    long l = 0;
    int same;
    if (rig_new(&a, m, NULL) != 0 || rig_new(&b, m, "0") != 0) {
        ok(0, "%s: backends", name);
        return;
    }
    same = norm_then_gemm(a.be, b.be, m, 0, &l);
    ok(same && l == 1, "%s: rmsnorm then wq's GEMM: the unfused products' bits, 1 launch (the norm; no rounding): "
       "%ld", name, l);
    same = norm_then_gemm(a.be, b.be, m, 1, &l);
    ok(same && l == 3, "%s: an add over the norm's output before the GEMM: it rounds again (norm, add, rounding: "
       "%ld launches), the same bits", name, l);
    same = norm_then_gemm(a.be, b.be, m, 2, &l);
    ok(same && l == 2, "%s: a GEMM of fewer rows than the norm wrote: it rounds its own (%ld launches), the same "
       "bits", name, l);
    rig_free(&a);
    rig_free(&b);
}

static int forward(rig *r, float *rec, long *launches, long *gemms)
{
    return cuda_steps(r->fw, r->kv, r->m->cfg.vocab_size, rec, launches, gemms);
}

/* Logits with fusing off and on, each with matmul_n (q/k/v, gate/up as one GEMM) and
 * without (one GEMM per product): all four the same bits. With matmul_n, fusing saves per
 * layer the roundings before q/k/v (or wq alone when the parts differ in type), gate/up
 * (or w_gate), wo (the attention's combine rounds its output) and w_down, and the
 * classifier's: 4 a layer + 1; RoPE and the K/V write as one kernel (L); and the residual adds
 * before the FFN norm (L) and the next layer's attention norm (L - 1; a decode step's last
 * add is followed by the gather, not a norm). The 20-token prefill's last layer runs its
 * one output row alone: there the add joins the final norm, in place over ob. */
static void whole(const kvg_model *m, const char *name)
{
    const int V = m->cfg.vocab_size, L = m->cfg.n_layers;
    const size_t sz = (size_t)4 * V * sizeof(float);
    float *rec[4];
    long l[4] = { 0 }, g[4] = { 0 };
    int rc[4] = { -1, -1, -1, -1 }, same = 1;
    for (int i = 0; i < 4; i++) {
        rig r;
        rec[i] = malloc(sz);
        /* i: bit 0 fusing on, bit 1 without matmul_n */
        if (rig_new(&r, m, i & 1 ? NULL : "0") == 0) {
            kvg_backend_ops sep = *r.be->ops;
            const kvg_backend_ops *own = r.be->ops;
            if (i & 2) {
                sep.matmul_n = NULL;
                r.be->ops = &sep;
            }
            rc[i] = forward(&r, rec[i], &l[i], &g[i]);
            r.be->ops = own;
            rig_free(&r);
        }
        same &= rc[i] == 0 && memcmp(rec[0], rec[i], sz) == 0;
    }
    ok(same, "%s: logits with KVGATE_CUDA_FUSE=0 and on, with matmul_n and without: the same bits (a 20-token "
       "prefill, 3 decode steps)", name);
    diag("%s: a decode step (%d layers): fusing off %ld launches + %ld cuBLASLt calls, on %ld + %ld; without "
         "matmul_n: off %ld + %ld, on %ld + %ld", name, L, l[0], g[0], l[1], g[1], l[2], g[2], l[3], g[3]);
    ok(g[0] == g[1] && l[0] - l[1] == 7 * L, "%s: fusing saves %d launches per decode step (%ld -> %ld: the "
       "roundings before q/k/v, gate/up, wo, w_down and the classifier, 4 L + 1; the residual adds joined to the "
       "next norm, 2 L - 1; RoPE and the K/V write in one kernel, L)", name, 7 * L, l[0], l[1]);
    ok(g[2] == g[3] && l[3] < l[2], "%s: one GEMM per product: %ld -> %ld launches", name, l[2], l[3]);
    for (int i = 0; i < 4; i++)
        free(rec[i]);
}

int main(void)
{
    char path[512], tpath[512], err[512];
    kvg_model_load_opts lo;
    kvg_model *stories;
    tm_model q, mixed, ge;
    /* qwen2-like: q/k/v biases, GQA 4:2, F32 in the file (BF16 on the device: one type) */
    tm_spec qs = { 48, 80, 2, 4, 2, 16, 97, 256, 1, 0, 1, 0, 0, 11 };
    /* F16 wq, w_up, wo beside BF16 wk, w_gate (tm_build's mixed dtypes): nothing fused in
       the GEMMs, the norms' copies in F16 (wq) and BF16 (w_gate) */
    tm_spec ms = { 48, 80, 2, 4, 2, 16, 97, 256, 0, 0, 1, 0, 1, 12 };
    /* llama-shaped, 3 layers, made GeGLU below (Gemma's FFN) */
    tm_spec gs = { 64, 96, 3, 4, 4, 16, 83, 256, 0, 1, 0, 0, 0, 13 };
    rig bad;
    /* The step's launches and calls are counted as the operations make them: without
     * CUDA graphs (a replayed step makes none; t/unit/cuda_graph.c tests graphs). */
    setenv("KVGATE_CUDA_GRAPHS", "0", 1);

    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.bin", shared_dir());
    snprintf(tpath, sizeof tpath, "%s/models/stories260K/tok512.bin", shared_dir());
    memset(&lo, 0, sizeof lo);
    lo.tokenizer_path = tpath;
    stories = kvg_model_load(path, &lo, err, sizeof err);
    if (!ok(stories != NULL, "load stories260K"))
        diag("%s", err);
    ok(tm_build(&q, &qs) == 0, "qwen2-like test model (biases)");
    ok(tm_build(&mixed, &ms) == 0, "test model with F16 and BF16 weights");
    ok(tm_build(&ge, &gs) == 0, "GeGLU test model");
    ge.m.cfg.ffn_act = KVG_ACT_GELU_TANH;

    kernel_rmsnorm();
    kernel_glu();
    kernel_add_rmsnorm();
    record(&q.m, "qwen2-like");
    record(&mixed.m, "mixed types");
    if (stories)
        whole(stories, "stories260K");
    whole(&q.m, "qwen2-like");
    whole(&mixed.m, "mixed types");
    whole(&ge.m, "GeGLU");

    ok(rig_new(&bad, &q.m, "2") != 0, "KVGATE_CUDA_FUSE=2 refused at creation");
    rig_free(&bad);
    is_int(kvg_emu_bytes_in_use(), 0, "nothing left on the device");

    kvg_model_free(stories);
    tm_free(&q);
    tm_free(&mixed);
    tm_free(&ge);
    return done_testing();
}
