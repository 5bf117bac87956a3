/* The CUDA backend's GEMMs (engine/cuda/cuda_gemm.c, cuda_weights.c), emulated:
 *
 *   - q/k/v and gate/up uploaded as one matrix each where the parts share K and type: the
 *     parts back to back from part 0's copy, the q/k/v biases concatenated; not where the
 *     parts differ in type (a test model with F16 and BF16 parts);
 *   - matmul_n as one GEMM gives the bits of the separate matmuls, M = 1 .. 300, with and
 *     without biases, --batch-invariant on and off, in fewer launches; q/k/v asked without
 *     the biases they were fused with run one by one (invariant off);
 *   - the forward pass with matmul_n and without (forward.c's products one by one): the
 *     same logits bit for bit, prefill and decode; kernel launches and cuBLASLt calls per
 *     decode step counted (kvg_emu_calls);
 *   - --batch-invariant on: every GEMM shape pinned and self-tested at creation, none made
 *     or looked up by a step (a shape the startup did not make fails, named); off: none
 *     pinned, the heuristic asked by the steps;
 *   - the emulated cuBLASLt's M-dependent algorithm (kvg_emu_lt_m_dependent, and
 *     KVG_EMU_LT_ALGO=m-dependent): the self-test refuses --batch-invariant on at creation,
 *     naming the shape; off still runs. */
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

typedef struct rig {
    const kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
} rig;

static kvg_backend *cuda_new(const kvg_model *m, int invariant, char *err, size_t err_len)
{
    kvg_backend_opts o;
    memset(&o, 0, sizeof o);
    o.n_threads = 1;
    o.batch_invariant = invariant;
    return kvg_backend_new_opts("cuda", m, &o, err, err_len);
}

static int rig_new(rig *r, const kvg_model *m, int invariant)
{
    char err[512] = "";
    kvg_kv_geom g;
    memset(r, 0, sizeof *r);
    r->m = m;
    r->be = cuda_new(m, invariant, err, sizeof err);
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

/* n floats on the device, from host (NULL: uninitialized). */
static float *dev_floats(kvg_backend *be, const float *host, size_t n)
{
    float *d = be->ops->alloc(be, n);
    if (d && host && cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
        be->ops->free(be, d);
        return NULL;
    }
    return d;
}

static int read_floats(kvg_backend *be, const float *d, float *host, size_t n)
{
    return cudaStreamSynchronize(cu_of(be)->stream) == cudaSuccess &&
           cudaMemcpy(host, d, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

/* ---- kvg_k_split_cols ---- */

/* Widths with and without float4 groups (and an output 4 bytes off 16-byte alignment):
 * each part's rows are its columns of x, exactly. */
static void split_kernel(void)
{
    static const int32_t widths[3][3] = { { 64, 32, 32 }, { 3, 5, 1 }, { 8, 12, 4 } };
    for (int v = 0; v < 3; v++) {
        const int rows = 37, n = 3, W = widths[v][0] + widths[v][1] + widths[v][2];
        float *hx = malloc((size_t)rows * W * sizeof *hx), *x = NULL, *out = NULL, *h = NULL;
        kvg_k_split sp;
        int good = 1;
        uint64_t seed = 3 + (uint64_t)v;
        size_t at = 0;
        memset(&sp, 0, sizeof sp);
        sp.n = n;
        for (int i = 0; hx && i < rows * W; i++)
            hx[i] = tm_unif(&seed);
        if (!hx || cudaMalloc((void **)&x, (size_t)rows * W * 4) != cudaSuccess ||
            cudaMalloc((void **)&out, ((size_t)rows * W + 16) * 4) != cudaSuccess ||
            !(h = malloc((size_t)rows * W * 4 + 64))) {
            ok(0, "split_cols: buffers");
            break;
        }
        cudaMemcpy(x, hx, (size_t)rows * W * 4, cudaMemcpyHostToDevice);
        for (int i = 0; i < n; i++) {
            /* the last width set: part 1 at a 4-byte offset, so the launch takes the scalar way */
            at += v == 2 && i == 1 ? 1 : 0;
            sp.out[i] = out + at;
            sp.cols[i] = widths[v][i];
            at += (size_t)rows * widths[v][i];
        }
        good = kvg_k_split_cols(NULL, x, rows, &sp) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess &&
               cudaMemcpy(h, out, at * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
        for (int i = 0, c0 = 0; good && i < n; i++) {
            const float *o = h + (sp.out[i] - out);
            for (int r = 0; r < rows; r++)
                good &= memcmp(o + (size_t)r * sp.cols[i], hx + (size_t)r * W + c0, (size_t)sp.cols[i] * 4) == 0;
            c0 += sp.cols[i];
        }
        ok(good, "split_cols: %d rows of %d + %d + %d columns%s: each part's columns, exactly", rows,
           widths[v][0], widths[v][1], widths[v][2], v == 2 ? " (an output off 16-byte alignment)" : "");
        cudaFree(x);
        cudaFree(out);
        free(hx);
        free(h);
    }
    {
        kvg_k_split sp;
        memset(&sp, 0, sizeof sp);
        sp.n = KVG_K_SPLIT_MAX + 1;
        ok(kvg_k_split_cols(NULL, NULL, 1, &sp) == cudaErrorInvalidValue, "split_cols: more parts than it holds "
           "refused");
    }
}

/* ---- the weights' layout ---- */

static void layout(const kvg_model *m, const char *name, int expect_fused)
{
    const kvg_model_config *cfg = &m->cfg;
    char err[512] = "";
    kvg_backend *be = cuda_new(m, 1, err, sizeof err);
    kvg_cuda *c;
    int qkv = 1, gu = 1, biases = 1, none = 1;
    if (!ok(be != NULL, "%s: backend (%s)", name, err))
        return;
    c = cu_of(be);
    for (int l = 0; l < cfg->n_layers; l++) {
        const kvg_layer_weights *L = &m->layers[l];
        const kvg_cu_fused *f = &c->fused[2 * l], *g = &c->fused[2 * l + 1];
        const kvg_cu_weight *q = kvg_cu_weight_of(c, L->wq.data), *k = kvg_cu_weight_of(c, L->wk.data),
                            *v = kvg_cu_weight_of(c, L->wv.data), *wg = kvg_cu_weight_of(c, L->w_gate.data),
                            *wu = kvg_cu_weight_of(c, L->w_up.data);
        size_t K = (size_t)cfg->dim;
        none &= f->n == 0 && g->n == 0;
        qkv &= f->n == 3 && q && k && v && f->dev == q->dev &&
               (char *)k->dev == (char *)q->dev + L->wq.rows * K * 2 &&
               (char *)v->dev == (char *)k->dev + L->wk.rows * K * 2 && (uintptr_t)q->dev % 256 == 0 &&
               (uintptr_t)k->dev % 256 == 0 && (uintptr_t)v->dev % 256 == 0 &&
               f->N == (int)(L->wq.rows + L->wk.rows + L->wv.rows) && f->K == cfg->dim;
        gu &= g->n == 2 && wg && wu && g->dev == wg->dev &&
              (char *)wu->dev == (char *)wg->dev + L->w_gate.rows * K * 2 && g->bias == NULL;
        if (L->bq && f->n == 3) {
            /* the epilogue's vector: bq | bk | bv, the same floats */
            size_t nb = (size_t)f->N;
            float *h = malloc(nb * sizeof *h);
            biases &= h && read_floats(be, f->bias, h, nb) == 0 &&
                      memcmp(h, L->bq, L->wq.rows * 4) == 0 && memcmp(h + L->wq.rows, L->bk, L->wk.rows * 4) == 0 &&
                      memcmp(h + L->wq.rows + L->wk.rows, L->bv, L->wv.rows * 4) == 0;
            free(h);
        } else if (f->n == 3) {
            biases &= f->bias == NULL;
        }
    }
    if (expect_fused) {
        ok(qkv, "%s: each layer's wq, wk, wv back to back from wq's copy, each 256-byte aligned, N = the sum", name);
        ok(gu, "%s: w_gate, w_up back to back, no bias", name);
        ok(biases, "%s: the fused q/k/v bias is bq | bk | bv (or none without biases)", name);
    } else {
        ok(none, "%s: parts of different types (F16 wq, BF16 wk): nothing fused", name);
    }
    kvg_backend_free(be);
}

/* ---- matmul_n = the separate matmuls ---- */

static void products(const kvg_model *m, const char *name, int invariant)
{
    static const int Ms[] = { 1, 3, 8, 37, 300 };
    const kvg_model_config *cfg = &m->cfg;
    const kvg_layer_weights *L = &m->layers[cfg->n_layers - 1];
    char err[512] = "";
    kvg_backend *be = cuda_new(m, invariant, err, sizeof err);
    const int K = cfg->dim;
    int same = 1, ran = 1;
    long fused_calls = 0, sep_calls = 0, fused_gemms = 0, sep_gemms = 0;
    uint64_t seed = 77;
    if (!ok(be != NULL, "%s: backend (%s)", name, err))
        return;
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        const int M = Ms[mi];
        for (int kind = 0; kind < 2; kind++) {
            const kvg_tensor *w3[3] = { &L->wq, &L->wk, &L->wv }, *w2[2] = { &L->w_gate, &L->w_up };
            const float *b3[3] = { L->bq, L->bk, L->bv }, *b2[2] = { NULL, NULL };
            const kvg_tensor *const *w = kind ? w2 : w3;
            const float *const *b = kind ? b2 : b3;
            int n = kind ? 2 : 3;
            float *hx = malloc((size_t)M * K * sizeof *hx), *x, *yf[3] = { 0 }, *ys[3] = { 0 };
            for (size_t i = 0; hx && i < (size_t)M * K; i++)
                hx[i] = tm_unif(&seed) * 2.0f;
            x = hx ? dev_floats(be, hx, (size_t)M * K) : NULL;
            for (int i = 0; i < n; i++) {
                yf[i] = dev_floats(be, NULL, (size_t)M * w[i]->rows);
                ys[i] = dev_floats(be, NULL, (size_t)M * w[i]->rows);
            }
            if (x && yf[n - 1] && ys[n - 1]) {
                long l0 = kvg_emu_calls("launch"), g0 = kvg_emu_calls("cublasLtMatmul"), l1, g1;
                be->ops->matmul_n(be, x, M, K, n, w, b, yf);
                l1 = kvg_emu_calls("launch");
                g1 = kvg_emu_calls("cublasLtMatmul");
                for (int i = 0; i < n; i++)
                    be->ops->matmul(be, x, M, K, w[i], b[i], ys[i]);
                if (M == 8) {
                    fused_calls += l1 - l0;
                    fused_gemms += g1 - g0;
                    sep_calls += kvg_emu_calls("launch") - l1;
                    sep_gemms += kvg_emu_calls("cublasLtMatmul") - g1;
                }
                ran &= !cu_of(be)->failed;
                for (int i = 0; i < n; i++) {
                    size_t cnt = (size_t)M * w[i]->rows;
                    float *hf = malloc(cnt * sizeof *hf), *hs = malloc(cnt * sizeof *hs);
                    same &= hf && hs && read_floats(be, yf[i], hf, cnt) == 0 && read_floats(be, ys[i], hs, cnt) == 0 &&
                            memcmp(hf, hs, cnt * sizeof *hf) == 0;
                    free(hf);
                    free(hs);
                }
            } else {
                ran = 0;
            }
            for (int i = 0; i < n; i++) {
                be->ops->free(be, yf[i]);
                be->ops->free(be, ys[i]);
            }
            be->ops->free(be, x);
            free(hx);
        }
    }
    if (L->bq && !invariant) {
        /* q/k/v without their biases: not the fused matrix's products (its bias is part of
           it), so one GEMM each, as asked (invariant off: with it on, a shape the startup
           did not make, see pinned()) */
        const kvg_tensor *w3[3] = { &L->wq, &L->wk, &L->wv };
        const int M = 5;
        float *hx = malloc((size_t)M * K * sizeof *hx), *x, *yf[3], *ys[3];
        long g0;
        int fine = 1;
        for (size_t i = 0; hx && i < (size_t)M * K; i++)
            hx[i] = tm_unif(&seed);
        x = hx ? dev_floats(be, hx, (size_t)M * K) : NULL;
        for (int i = 0; i < 3; i++) {
            yf[i] = dev_floats(be, NULL, (size_t)M * w3[i]->rows);
            ys[i] = dev_floats(be, NULL, (size_t)M * w3[i]->rows);
        }
        g0 = kvg_emu_calls("cublasLtMatmul");
        be->ops->matmul_n(be, x, M, K, 3, w3, NULL, yf);
        fine &= kvg_emu_calls("cublasLtMatmul") - g0 == 3;
        for (int i = 0; i < 3; i++)
            be->ops->matmul(be, x, M, K, w3[i], NULL, ys[i]);
        for (int i = 0; i < 3; i++) {
            size_t cnt = (size_t)M * w3[i]->rows;
            float *hf = malloc(cnt * sizeof *hf), *hs = malloc(cnt * sizeof *hs);
            fine &= hf && hs && read_floats(be, yf[i], hf, cnt) == 0 && read_floats(be, ys[i], hs, cnt) == 0 &&
                    memcmp(hf, hs, cnt * sizeof *hf) == 0;
            free(hf);
            free(hs);
            be->ops->free(be, yf[i]);
            be->ops->free(be, ys[i]);
        }
        be->ops->free(be, x);
        free(hx);
        ok(fine && !cu_of(be)->failed, "%s (invariant %s): q/k/v asked without their biases: three GEMMs, the "
           "products without bias", name, invariant ? "on" : "off");
    }
    ok(ran, "%s (invariant %s): matmul_n and matmul ran (%s)", name, invariant ? "on" : "off", cu_of(be)->err);
    ok(same, "%s (invariant %s): q/k/v%s and gate/up by matmul_n = by one matmul each, bit for bit, M = 1, 3, 8, "
       "37, 300", name, invariant ? "on" : "off", L->bq ? " (with biases)" : "");
    diag("%s: M=8, q/k/v + gate/up: fused %ld kernel launches + %ld cuBLASLt calls, separate %ld + %ld", name,
         fused_calls, fused_gemms, sep_calls, sep_gemms);
    /* q/k/v: to_lowp + GEMM + split vs 3 x (to_lowp + GEMM); gate/up: 3 vs 2 x 2 */
    ok(fused_gemms == 2 && sep_gemms == 5 && fused_calls == 4 && sep_calls == 5,
       "%s: 2 GEMMs instead of 5, 4 kernels (two roundings, two splits) instead of 5", name);
    kvg_backend_free(be);
}

/* ---- the forward pass ---- */

static int forward(rig *r, float *rec, long *launches, long *gemms)
{
    return cuda_steps(r->fw, r->kv, r->m->cfg.vocab_size, rec, launches, gemms);
}

static void whole(const kvg_model *m, const char *name, int fused_expected)
{
    const int V = m->cfg.vocab_size, L = m->cfg.n_layers;
    float *a = malloc((size_t)4 * V * sizeof *a), *b = malloc((size_t)4 * V * sizeof *b);
    long la = 0, ga = 0, lb = 0, gb = 0;
    int rca = -1, rcb = -1, made;
    rig r;
    /* The GEMMs' own launches: without the kernels that round a GEMM's input as they write
       it (KVGATE_CUDA_FUSE, t/unit/cuda_fuse.c counts those). */
    setenv("KVGATE_CUDA_FUSE", "0", 1);
    made = rig_new(&r, m, 1) == 0;
    unsetenv("KVGATE_CUDA_FUSE");
    if (made) {
        kvg_backend_ops sep = *r.be->ops;
        const kvg_backend_ops *fused = r.be->ops;
        rca = forward(&r, a, &la, &ga);
        sep.matmul_n = NULL;
        r.be->ops = &sep;
        rcb = forward(&r, b, &lb, &gb);
        r.be->ops = fused;
        rig_free(&r);
    }
    ok(rca == 0 && rcb == 0 && memcmp(a, b, (size_t)4 * V * sizeof *a) == 0,
       "%s: logits with fused q/k/v, gate/up = with one GEMM per product, bit for bit (a 20-token prefill, 3 "
       "decode steps)", name);
    diag("%s: a decode step: fused %ld kernel launches + %ld cuBLASLt calls = %ld; separate %ld + %ld = %ld "
         "(%d layers)", name, la, ga, la + ga, lb, gb, lb + gb, L);
    /* per layer: q/k/v one rounding and a split for three roundings, 1 GEMM for 3; gate/up
       one rounding and a split for two roundings, 1 GEMM for 2 */
    if (fused_expected)
        ok(gb - ga == 3 * L && lb - la == L, "%s: %d fewer cuBLASLt calls (3 a layer) and %d fewer kernel "
           "launches (1 a layer) per decode step", name, 3 * L, L);
    else
        ok(gb == ga && lb == la, "%s: the same calls either way", name);
    free(a);
    free(b);
}

/* ---- --batch-invariant: pinned at startup, the self-test ---- */

static void pinned(const kvg_model *m, const char *name)
{
    float *rec = malloc((size_t)4 * m->cfg.vocab_size * sizeof *rec);
    for (int inv = 1; inv >= 0; inv--) {
        rig r;
        long h0, g0, heur, gemm, l = 0, g = 0;
        int all;
        h0 = kvg_emu_calls("cublasLtMatmulAlgoGetHeuristic");
        g0 = kvg_emu_calls("cublasLtMatmul");
        if (!ok(rig_new(&r, m, inv) == 0, "%s: invariant %s: backend", name, inv ? "on" : "off"))
            continue;
        heur = kvg_emu_calls("cublasLtMatmulAlgoGetHeuristic") - h0;
        gemm = kvg_emu_calls("cublasLtMatmul") - g0;
        all = kvg_cu_gemm_pinned(cu_of(r.be)) == (inv ? cu_of(r.be)->n_shapes : 0);
        if (inv) {
            /* each shape: rows 0, 1, 3, 6, 32, 63 alone and M = 2, 7, 64 (the emulated
               build's largest) */
            ok(all && heur == cu_of(r.be)->n_shapes && gemm == 9 * cu_of(r.be)->n_shapes,
               "%s: invariant on: %d shapes pinned at creation (%ld heuristic calls), each self-tested (%ld GEMMs)",
               name, cu_of(r.be)->n_shapes, heur, gemm);
        } else {
            ok(all && heur == 0 && gemm == 0 && cu_of(r.be)->n_shapes > 0,
               "%s: invariant off: %d shapes made at creation, none pinned, no heuristic call, no GEMM", name,
               cu_of(r.be)->n_shapes);
        }
        if (inv) {
            /* a shape the startup did not make (wq's rows but one): the GEMM fails, named */
            kvg_cuda *c = cu_of(r.be);
            const kvg_cu_weight *wq = kvg_cu_weight_of(c, m->layers[0].wq.data);
            float *x = dev_floats(r.be, NULL, (size_t)m->cfg.dim), *y = dev_floats(r.be, NULL, (size_t)m->cfg.dim);
            kvg_cu_gemm(c, x, 1, m->cfg.dim, wq, (int)m->layers[0].wq.rows - 1, NULL, y);
            ok(c->failed && strstr(c->err, "not pinned at startup"), "%s: invariant on: a GEMM of a shape not "
               "pinned at startup fails (%s)", name, c->err);
            c->failed = 0;
            c->err[0] = 0;
            r.be->ops->free(r.be, x);
            r.be->ops->free(r.be, y);
        }
        h0 = kvg_emu_calls("cublasLtMatmulAlgoGetHeuristic");
        ok(forward(&r, rec, &l, &g) == 0, "%s: invariant %s: a prefill and 3 decode steps", name, inv ? "on" : "off");
        heur = kvg_emu_calls("cublasLtMatmulAlgoGetHeuristic") - h0;
        ok(inv ? heur == 0 : heur > 0, "%s: invariant %s: the steps asked the heuristic %ld times", name,
           inv ? "on" : "off", heur);
        rig_free(&r);
    }
    free(rec);
}

static void refused(const kvg_model *m, const char *name)
{
    char err[512] = "";
    kvg_backend *be;
    rig r;
    float *rec = malloc((size_t)4 * m->cfg.vocab_size * sizeof *rec);
    long l = 0, g = 0;

    kvg_emu_lt_m_dependent(1);
    be = cuda_new(m, 1, err, sizeof err);
    ok(!be && strstr(err, "--batch-invariant off") && strstr(err, "layer 0 wqkv") && strstr(err, "N=") &&
       strstr(err, "K=") && strstr(err, "of 64"),
       "%s: an algorithm whose sum depends on M: invariant mode refused at creation, the shape named, the first "
       "k with 8+ rows (64) caught (%s)", name, err);
    kvg_backend_free(be);
    is_int(kvg_emu_bytes_in_use(), 0, "nothing left on the device after the refusal");
    ok(rig_new(&r, m, 0) == 0 && forward(&r, rec, &l, &g) == 0,
       "%s: the same algorithm with --batch-invariant off: the backend runs", name);
    rig_free(&r);
    kvg_emu_lt_m_dependent(0);

    setenv("KVG_EMU_LT_ALGO", "m-dependent", 1);
    err[0] = 0;
    be = cuda_new(m, 1, err, sizeof err);
    ok(!be && strstr(err, "--batch-invariant off"), "%s: KVG_EMU_LT_ALGO=m-dependent: refused too", name);
    kvg_backend_free(be);
    unsetenv("KVG_EMU_LT_ALGO");

    err[0] = 0;
    be = cuda_new(m, 1, err, sizeof err);
    ok(be != NULL, "%s: the default algorithm again: invariant mode accepted (%s)", name, err);
    kvg_backend_free(be);
    free(rec);
}

int main(void)
{
    char path[512], tpath[512], err[512];
    kvg_model_load_opts lo;
    kvg_model *stories;
    tm_model q, mixed;
    /* qwen2-like: q/k/v biases, GQA 4:2, F32 in the file (BF16 on the device: one type) */
    tm_spec qs = { 48, 80, 2, 4, 2, 16, 97, 256, 1, 0, 1, 0, 0, 11 };
    /* the same with F16 wq and BF16 wk (tm_build's mixed dtypes) */
    tm_spec ms = { 48, 80, 2, 4, 2, 16, 97, 256, 1, 0, 1, 0, 1, 12 };
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
    ok(tm_build(&q, &qs) == 0, "qwen2-like test model (biases, one type)");
    ok(tm_build(&mixed, &ms) == 0, "test model with F16 and BF16 parts");

    split_kernel();
    layout(&q.m, "qwen2-like", 1);
    layout(&mixed.m, "mixed types", 0);
    products(&q.m, "qwen2-like", 1);
    products(&q.m, "qwen2-like", 0);
    whole(&q.m, "qwen2-like", 1);
    if (stories) {
        layout(stories, "stories260K", 1);
        products(stories, "stories260K", 1);
        whole(stories, "stories260K", 1);
        pinned(stories, "stories260K");
        refused(stories, "stories260K");
    }
    whole(&mixed.m, "mixed types (nothing fused)", 0);

    kvg_model_free(stories);
    tm_free(&q);
    tm_free(&mixed);
    return done_testing();
}
