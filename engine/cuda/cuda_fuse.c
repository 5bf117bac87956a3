/* Kernels that also write the next GEMM's input (issue 30 §4: fewer launches and passes).
 *
 * Every GEMM reads its input rounded to the weight's BF16/F16 (cuda_gemm.c): on its own, a
 * kvg_k_to_lowp launch and a pass over x before each product. The kernels that compute
 * those inputs write the rounded copy themselves, in the same pass, into the GEMM's lowp
 * scratch:
 *
 *   rmsnorm(x, attn_norm) -> xb   + xb rounded to wq's type      (q/k/v read xb)
 *   rmsnorm(x, ffn_norm)  -> xb   + xb rounded to w_gate's type  (gate/up read xb)
 *   rmsnorm(x, final_norm)-> ob   + ob rounded to output's type  (the classifier)
 *   swiglu/geglu(hb, hb2) -> hb   + hb rounded to w_down's type  (w_down reads hb)
 *   attention (own kernels) -> att + att rounded to wo's type     (wo reads att)
 *   attention (cuDNN, wo BF16) -> its BF16 output in the scratch, att from it
 *
 * and the residual add before a norm joins the norm's kernel (backend.h's add_rmsnorm:
 * x += ob, then the norm of x; kvg_k_add_rmsnorm: the add's rounding, the norm's tree),
 *
 * and record what the scratch holds (kvg_cuda.lowp_src, lowp_n, lowp_dt). A GEMM whose
 * input is exactly that (the same pointer, element count and type) skips its rounding;
 * anything else (another input, a part of another type, a record cleared) rounds as
 * before. The copy is each F32 output value rounded to nearest even after it is computed,
 * so the GEMMs read the bits kvg_k_to_lowp would have given them: logits are the same bits
 * with KVGATE_CUDA_FUSE=0 (t/unit/cuda_fuse.c).
 *
 * The record is conservative: every backend operation but matmul and matmul_n clears it
 * (backend_cuda.c's op_begin; alloc, free, read, begin_step and end_step too), a GEMM
 * clears it when it writes over the source or rounds another input into the scratch, and
 * growing the scratch clears it. Which norm feeds which GEMM is only a guess of the type to
 * round to: a wrong guess costs a wasted copy (the GEMM then rounds), never a wrong value. */
#include "cuda_internal.h"
#include "errmsg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int kvg_cu_fuse_init(kvg_cuda *c, char *err, size_t err_len)
{
    const kvg_model_config *cfg = &c->m->cfg;
    const char *v = getenv("KVGATE_CUDA_FUSE");
    if (!v || !*v || strcmp(v, "1") == 0) {
        c->fuse = 1;
    } else if (strcmp(v, "0") == 0) {
        c->fuse = 0;
    } else {
        kvg_set_err(err, err_len, "cuda: KVGATE_CUDA_FUSE=%s: need 0 (off) or 1 (on, the default)", v);
        return -1;
    }
    /* The GLU is not told its layer: its copy has one type for the whole model. */
    c->glu_dt = KVG_KT_F32;
    for (int l = 0; cfg->n_experts == 0 && l < cfg->n_layers; l++) {
        const kvg_cu_weight *dw = kvg_cu_weight_of(c, c->m->layers[l].w_down.data);
        if (!dw) {
            kvg_set_err(err, err_len, "%s", c->err);
            return -1;
        }
        if (dw->dt == KVG_KT_F32 || (l > 0 && dw->dt != c->glu_dt)) {
            c->glu_dt = KVG_KT_F32;
            break;
        }
        c->glu_dt = dw->dt;
    }
    kvg_cu_lowp_clear(c);
    return 0;
}

/* The type of the GEMM that reads the output of the norm with weight w (host address) in
 * `layer`: wq's for the attention norm, w_gate's for a dense FFN norm, the classifier's for
 * the final norm; F32 for every other norm (q/k norms, post-norms: no GEMM reads them next;
 * a MoE layer rounds its own gathered rows). */
static kvg_kt norm_feeds(kvg_cuda *c, const float *w, int layer)
{
    const kvg_model *m = c->m;
    const kvg_tensor *t = NULL;
    const kvg_cu_weight *dw;
    if (w == m->final_norm) {
        t = &m->output;
    } else if (layer >= 0 && layer < m->cfg.n_layers) {
        const kvg_layer_weights *L = &m->layers[layer];
        if (w == L->attn_norm)
            t = &L->wq;
        else if (w == L->ffn_norm && m->cfg.n_experts == 0)
            t = &L->w_gate;
    }
    if (!t || !t->data)
        return KVG_KT_F32;
    dw = kvg_cu_weight_of(c, t->data);
    return dw ? dw->dt : KVG_KT_F32;
}

/* rmsnorm of x into out, after x += y when y is not NULL (the residual add); with fusing
 * on, one kernel, with the rounded copy when a GEMM reads out next. */
static void norm(kvg_cuda *c, float *x, const float *y, const float *w, const kvg_cu_weight *dw, float eps,
                 int rows, int dim, float *out)
{
    const size_t n = (size_t)rows * (size_t)dim;
    kvg_kt dt = c->fuse && rows > 0 ? norm_feeds(c, w, dw->layer) : KVG_KT_F32;
    void *lp = NULL;
    if (!c->fuse) {
        if (y)
            KVG_CU_CHECK(c, "launch kvg_k_add", kvg_k_add(c->stream, x, y, n), "n=%zu", n);
        if (!c->failed)
            KVG_CU_CHECK(c, "launch kvg_k_rmsnorm", kvg_k_rmsnorm(c->stream, x, dw->dev, eps, rows, dim, out),
                         "rows=%d dim=%d", rows, dim);
        return;
    }
    if (dt != KVG_KT_F32 && !(lp = kvg_cu_lowp_scratch(c, n)))
        return;
    if (y)
        KVG_CU_CHECK(c, "launch kvg_k_add_rmsnorm",
                     kvg_k_add_rmsnorm(c->stream, x, y, dw->dev, eps, rows, dim, out, dt, lp), "rows=%d dim=%d",
                     rows, dim);
    else
        KVG_CU_CHECK(c, "launch kvg_k_rmsnorm_lowp",
                     kvg_k_rmsnorm_lowp(c->stream, x, dw->dev, eps, rows, dim, out, dt, lp), "rows=%d dim=%d",
                     rows, dim);
    if (lp && !c->failed) {
        c->lowp_src = out;
        c->lowp_n = n;
        c->lowp_dt = dt;
    }
}

void kvg_cu_rmsnorm(kvg_cuda *c, const float *x, const float *w, const kvg_cu_weight *dw, float eps,
                    int rows, int dim, float *out)
{
    /* x is written only with a residual */
    norm(c, (float *)(uintptr_t)x, NULL, w, dw, eps, rows, dim, out);
}

void kvg_cu_add_rmsnorm(kvg_cuda *c, float *x, const float *y, const float *w, const kvg_cu_weight *dw,
                        float eps, int rows, int dim, float *out)
{
    norm(c, x, y, w, dw, eps, rows, dim, out);
}

void kvg_cu_glu(kvg_cuda *c, int gelu, float *gate, const float *up, size_t n)
{
    const kvg_kt dt = c->fuse && n > 0 ? c->glu_dt : KVG_KT_F32;
    void *lp = NULL;
    if (dt != KVG_KT_F32 && !(lp = kvg_cu_lowp_scratch(c, n)))
        return;
    if (gelu)
        KVG_CU_CHECK(c, "launch kvg_k_geglu", kvg_k_geglu_lowp(c->stream, gate, up, n, dt, lp), "n=%zu", n);
    else
        KVG_CU_CHECK(c, "launch kvg_k_swiglu", kvg_k_swiglu_lowp(c->stream, gate, up, n, dt, lp), "n=%zu", n);
    if (lp && !c->failed) {
        c->lowp_src = gate;
        c->lowp_n = n;
        c->lowp_dt = dt;
    }
}

void *kvg_cu_attn_lowp(kvg_cuda *c, int layer, size_t n, kvg_kt *dt)
{
    const kvg_cu_weight *dw;
    *dt = KVG_KT_F32;
    if (!c->fuse || n == 0 || layer < 0 || layer >= c->m->cfg.n_layers || !c->m->layers[layer].wo.data)
        return NULL;
    dw = kvg_cu_weight_of(c, c->m->layers[layer].wo.data);
    if (!dw || dw->dt == KVG_KT_F32)
        return NULL;
    *dt = dw->dt;
    return kvg_cu_lowp_scratch(c, n);
}

void kvg_cu_lowp_set(kvg_cuda *c, const float *src, size_t n, kvg_kt dt)
{
    c->lowp_src = src;
    c->lowp_n = n;
    c->lowp_dt = dt;
}
