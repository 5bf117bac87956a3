/* Attention through cuDNN's SDPA (engine/cuda/cuda_sdpa.c) on the emulated CUDA backend,
 * whose cuDNN runs a host reference attention (kernels/emu/cuda_emu_cudnn.cc):
 *
 * - the emulated cuDNN's own checks (wrong attribute types and counts, shapes, layouts,
 *   types, unfinalized descriptors, pointers outside device memory) give cuDNN's statuses,
 *   and its paged attention matches a direct computation;
 * - with --batch-invariant off and KVGATE_CUDA_ATTENTION=cudnn the backend's logits against
 *   the own kernels' and the CPU backend's, within BF16 tolerance, on test model A (GQA,
 *   head_dim 16) and synthetic:260K-bf16: whole prompts, chunked prefill, decode, a step
 *   mixing a prefill chunk and decode rows of other sequences, page tables of interleaved
 *   (non-contiguous) and forked (shared) blocks; every layer went to cuDNN (its execute
 *   count);
 * - per-layer fallback: sliding-window layers run the own kernels, the others cuDNN;
 *   soft-capping or sinks keep the whole model on the own kernels (auto) or refuse
 *   (cudnn);
 * - fallback with one log line when the loaded cuDNN is older than 9.15
 *   (KVG_EMU_CUDNN_VERSION) or a finalize fails (kvg_emu_fail), the logits then the own
 *   kernels' bits; an execute failing fails one step only;
 * - --batch-invariant on never calls cuDNN. */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "tap.h"
#include "engine_testmodel.h"
#include "backend.h"
#include "backend_testing.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "kvg_cuda_api.h"

/* As t/unit/cuda_backend.c's: a logit may differ from the CPU's by this share of the
 * largest. cuDNN's path adds a BF16 rounding of q and of the attention's output. */
#define REL_TOL 0.03

typedef struct rig {
    const kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
} rig;

/* attention: KVGATE_CUDA_ATTENTION for the CUDA backend (NULL: unset). */
static int rig_new(rig *r, const kvg_model *m, const char *backend, const char *attention, int invariant,
                   int block_tokens, int n_blocks, char *err, size_t err_len)
{
    kvg_kv_geom g;
    kvg_backend_opts o;
    memset(r, 0, sizeof *r);
    memset(&o, 0, sizeof o);
    o.n_threads = 1;
    o.batch_invariant = invariant;
    if (attention)
        setenv("KVGATE_CUDA_ATTENTION", attention, 1);
    else
        unsetenv("KVGATE_CUDA_ATTENTION");
    r->m = m;
    r->be = kvg_backend_new_opts(backend, m, &o, err, err_len);
    unsetenv("KVGATE_CUDA_ATTENTION");
    kvg_forward_kv_geom(m, block_tokens, &g);
    r->kv = r->be ? kvg_backend_kv_pool_new(r->be, &g, n_blocks, err, err_len) : NULL;
    r->fw = r->kv ? kvg_forward_new(m, r->be, r->kv, err, err_len) : NULL;
    return r->fw ? 0 : -1;
}

static void rig_free(rig *r)
{
    kvg_forward_free(r->fw);
    kvg_kv_pool_free(r->kv);
    kvg_backend_free(r->be);
}

static void prompt_of(const kvg_model *m, int32_t *p, int n, uint32_t seed)
{
    uint64_t s = seed;
    for (int i = 0; i < n; i++)
        p[i] = (int32_t)(tm_rng(&s) % (uint32_t)m->cfg.vocab_size);
    p[0] = m->bos >= 0 ? m->bos : 1;
}

/* Prefill toks[0..n) in chunks of `chunk` (0: whole), then n_gen - 1 decode steps feeding
 * toks[n], toks[n + 1], ... (the same tokens on every rig, so their logits compare);
 * rec gets n_gen rows of logits (after the prompt, after each decoded token). */
static int run(rig *r, const int32_t *toks, int n, int chunk, int n_gen, float *rec)
{
    int V = r->m->cfg.vocab_size, fed = 0, rc = 0;
    kvg_kv_seq s;
    char err[512];
    kvg_kv_seq_init(&s);
    while (fed < n) {
        int k = chunk <= 0 || chunk > n - fed ? n - fed : chunk;
        kvg_fwd_seq b = { &s, toks + fed, k, fed + k == n ? rec : NULL };
        if (kvg_forward_step(r->fw, &b, 1, err, sizeof err) != 0) {
            diag("prefill: %s", err);
            rc = -1;
            goto out;
        }
        fed += k;
    }
    for (int g = 1; g < n_gen; g++) {
        kvg_fwd_seq b = { &s, toks + n + g - 1, 1, rec + (size_t)g * V };
        if (kvg_forward_step(r->fw, &b, 1, err, sizeof err) != 0) {
            diag("decode: %s", err);
            rc = -1;
            goto out;
        }
    }
out:
    kvg_kv_seq_release(r->kv, &s);
    return rc;
}

/* max |a - b| / max(1, max |a|) over n logits. */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0.0, m = 1.0;
    for (size_t i = 0; i < n; i++) {
        if (fabs((double)a[i] - (double)b[i]) > d)
            d = fabs((double)a[i] - (double)b[i]);
        if (fabs((double)a[i]) > m)
            m = fabs((double)a[i]);
    }
    return d / m;
}

static long executes(void)
{
    return kvg_emu_calls("cudnnBackendExecute");
}

/* ---- stderr capture (the fallback's log line) ---- */

typedef struct capture {
    int saved, fd;
    char path[64];
} capture;

static void capture_begin(capture *c)
{
    fflush(stderr);
    snprintf(c->path, sizeof c->path, "/tmp/kvg-sdpa-log-%d", (int)getpid());
    c->fd = open(c->path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    c->saved = dup(2);
    dup2(c->fd, 2);
}

/* The captured text into buf (NUL-terminated); stderr restored. */
static void capture_end(capture *c, char *buf, size_t len)
{
    ssize_t n;
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    lseek(c->fd, 0, SEEK_SET);
    n = read(c->fd, buf, len - 1);
    buf[n > 0 ? n : 0] = 0;
    close(c->fd);
    unlink(c->path);
}

static int count_lines(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

/* ---- the emulated cuDNN itself ---- */

static cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, const int64_t *dims, const int64_t *strides,
                                       int finalize)
{
    cudnnBackendDescriptor_t t = NULL;
    int64_t align = 16;
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (finalize)
        cudnnBackendFinalize(t);
    return t;
}

static cudnnStatus_t set_d(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendDescriptor_t v)
{
    return cudnnBackendSetAttribute(d, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

static uint16_t bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A paged problem through the whole API: B 2 entries, H_q 4, H_k 2, D 8, pages of T 4
 * tokens, 6 pages in the container, 3 per entry; lengths kv 9 and 5, q 1 each. The
 * output against a direct computation; then the checks' statuses. */
static void emulated_api(void)
{
    enum { B = 2, HQ = 4, HK = 2, D = 8, T = 4, N = 6, P = 3 };
    const int64_t qd[4] = { B, HQ, 1, D }, qs[4] = { HQ * D, D, HQ * D, 1 };
    const int64_t kd[4] = { N, HK, T, D }, ks[4] = { HK * T * D, T * D, D, 1 };
    const int64_t pd[4] = { B, 1, P, 1 }, ps[4] = { P, P, 1, 1 }, sd[4] = { B, 1, 1, 1 }, one[4] = { 1, 1, 1, 1 };
    static const int32_t table[B * P] = { 5, 0, 3, 2, 4, 1 };
    static const int32_t lq[B] = { 1, 1 }, lkv[B] = { 9, 5 };
    uint16_t hq[B * HQ * D], hk[N * HK * T * D], hv[N * HK * T * D], ho[B * HQ * D];
    void *dq, *dk, *dv, *dO, *dmeta, *ws = NULL;
    cudnnHandle_t h;
    cudnnBackendDescriptor_t tq, tk, tv, to, tp, tsq, tskv, op, graph, heur, cfg, plan, pack;
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    int64_t n_cfg = 0, wsz = -1, got;
    uint64_t s = 5;
    cudaStream_t st;
    float worst = 0.0f;
    cudnnStatus_t e;

    for (int i = 0; i < B * HQ * D; i++)
        hq[i] = bf16(tm_unif(&s));
    for (int i = 0; i < N * HK * T * D; i++) {
        hk[i] = bf16(tm_unif(&s));
        hv[i] = bf16(tm_unif(&s));
    }
    ok(cudnnGetVersion() == CUDNN_VERSION && CUDNN_VERSION == 91900, "cudnnGetVersion: 9.19.0");
    ok(cudnnCreate(&h) == CUDNN_STATUS_SUCCESS && cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess &&
       cudnnSetStream(h, st) == CUDNN_STATUS_SUCCESS, "handle on a stream");
    cudaMalloc(&dq, sizeof hq);
    cudaMalloc(&dk, sizeof hk);
    cudaMalloc(&dv, sizeof hv);
    cudaMalloc(&dO, sizeof ho);
    cudaMalloc(&dmeta, 64);
    cudaMemcpy(dq, hq, sizeof hq, cudaMemcpyHostToDevice);
    cudaMemcpy(dk, hk, sizeof hk, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, hv, sizeof hv, cudaMemcpyHostToDevice);
    cudaMemcpy(dmeta, table, sizeof table, cudaMemcpyHostToDevice);
    cudaMemcpy((char *)dmeta + 32, lq, sizeof lq, cudaMemcpyHostToDevice);
    cudaMemcpy((char *)dmeta + 48, lkv, sizeof lkv, cudaMemcpyHostToDevice);

    tq = tensor(1, CUDNN_DATA_BFLOAT16, qd, qs, 1);
    tk = tensor(2, CUDNN_DATA_BFLOAT16, kd, ks, 1);
    tv = tensor(3, CUDNN_DATA_BFLOAT16, kd, ks, 1);
    to = tensor(4, CUDNN_DATA_BFLOAT16, qd, qs, 1);
    tp = tensor(5, CUDNN_DATA_INT32, pd, ps, 1);
    tsq = tensor(6, CUDNN_DATA_INT32, sd, one, 1);
    tskv = tensor(7, CUDNN_DATA_INT32, sd, one, 1);
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, &op);
    {
        /* misuse first: a wrong type, a wrong count, a tensor that is not finalized, a
         * descriptor of the wrong kind */
        cudnnBackendDescriptor_t raw = tensor(9, CUDNN_DATA_BFLOAT16, qd, qs, 0);
        int64_t x = 3;
        is_int(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, CUDNN_TYPE_INT64, 1, &x),
               CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "an INT64 for a descriptor attribute: BAD_PARAM_ATTRIBUTE_TYPE");
        is_int(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 2, &tq),
               CUDNN_STATUS_BAD_PARAM, "two descriptors where one goes: BAD_PARAM");
        is_int(set_d(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, raw), CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
               "a tensor not finalized: BAD_PARAM_NOT_FINALIZED");
        is_int(cudnnBackendSetAttribute(tq, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &x), CUDNN_STATUS_BAD_PARAM,
               "setting a finalized tensor: BAD_PARAM");
        is_int(cudnnBackendFinalize(op), CUDNN_STATUS_BAD_PARAM, "an SDPA without Q, K, V, O: BAD_PARAM");
        cudnnBackendDestroyDescriptor(raw);
    }
    set_d(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, tq);
    set_d(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, tk);
    set_d(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, tv);
    set_d(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, to);
    set_d(op, CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_KDESC, tp);
    set_d(op, CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_VDESC, tp);
    is_int(cudnnBackendFinalize(op), CUDNN_STATUS_BAD_PARAM, "paged without sequence lengths: BAD_PARAM");
    set_d(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC, tsq);
    set_d(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_KVDESC, tskv);
    is_int(cudnnBackendFinalize(op), CUDNN_STATUS_SUCCESS, "paged SDPA finalized");
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph);
    set_d(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
    cudnnBackendFinalize(graph);
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
    set_d(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    is_int(cudnnBackendFinalize(heur), CUDNN_STATUS_BAD_PARAM, "heuristics without a mode: BAD_PARAM");
    cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    cudnnBackendFinalize(heur);
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg);
    ok(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n_cfg, &cfg) ==
       CUDNN_STATUS_SUCCESS && n_cfg == 1, "the heuristics offer an engine");
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
    set_d(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    is_int(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &wsz),
           CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "a plan's workspace before finalize: BAD_PARAM_NOT_FINALIZED");
    e = cudnnBackendFinalize(plan);
    if (e == CUDNN_STATUS_SUCCESS)
        e = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &wsz);
    ok(e == CUDNN_STATUS_SUCCESS && got == 1 && wsz > 0, "plan finalized, workspace %lld bytes", (long long)wsz);
    /* the graph, heuristics and config may go: the plan keeps what it needs */
    cudnnBackendDestroyDescriptor(cfg);
    cudnnBackendDestroyDescriptor(heur);
    cudnnBackendDestroyDescriptor(graph);
    cudaMalloc(&ws, (size_t)wsz);
    {
        int64_t uids[7] = { 1, 2, 3, 4, 5, 6, 7 };
        void *ptrs[7] = { dq, dk, dv, dO, dmeta, (char *)dmeta + 32, (char *)dmeta + 48 };
        void *no_ws = NULL;
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 7, uids);
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 7, ptrs);
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &no_ws);
        cudnnBackendFinalize(pack);
        is_int(cudnnBackendExecute(h, plan, pack), CUDNN_STATUS_BAD_PARAM, "execute without the workspace: BAD_PARAM");
        cudnnBackendDestroyDescriptor(pack);
        ptrs[0] = hq;            /* a host pointer */
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 7, uids);
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 7, ptrs);
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
        cudnnBackendFinalize(pack);
        is_int(cudnnBackendExecute(h, plan, pack), CUDNN_STATUS_BAD_PARAM, "Q in host memory: BAD_PARAM");
        cudnnBackendDestroyDescriptor(pack);
        ptrs[0] = dq;
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 7, uids);
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 7, ptrs);
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
        cudnnBackendFinalize(pack);
        e = cudnnBackendExecute(h, plan, pack);
        is_int(e, CUDNN_STATUS_SUCCESS, "execute");
        cudnnBackendDestroyDescriptor(pack);
    }
    cudaStreamSynchronize(st);
    cudaMemcpy(ho, dO, sizeof ho, cudaMemcpyDeviceToHost);
    /* direct: entry b, head h reads kv head h / 2, keys j < lkv[b] at page table[b][j / T] */
    for (int b = 0; b < B; b++)
        for (int hh = 0; hh < HQ; hh++) {
            float sc[16], m = -INFINITY, l = 0.0f, o[D] = { 0 };
            for (int j = 0; j < lkv[b]; j++) {
                const uint16_t *k = hk + (size_t)table[b * P + j / T] * HK * T * D + (size_t)(hh / 2) * T * D +
                                    (size_t)(j % T) * D;
                float dot = 0.0f;
                for (int d = 0; d < D; d++)
                    dot += from_bf16(hq[(b * HQ + hh) * D + d]) * from_bf16(k[d]);
                sc[j] = dot;   /* no SCALE tensor: 1 */
                m = sc[j] > m ? sc[j] : m;
            }
            for (int j = 0; j < lkv[b]; j++) {
                const uint16_t *v = hv + (size_t)table[b * P + j / T] * HK * T * D + (size_t)(hh / 2) * T * D +
                                    (size_t)(j % T) * D;
                float p = expf(sc[j] - m);
                l += p;
                for (int d = 0; d < D; d++)
                    o[d] += p * from_bf16(v[d]);
            }
            for (int d = 0; d < D; d++) {
                float x = fabsf(o[d] / l - from_bf16(ho[(b * HQ + hh) * D + d]));
                worst = x > worst ? x : worst;
            }
        }
    ok(worst <= 0.01f, "paged GQA attention as computed directly (worst %.5f, BF16 output)", (double)worst);

    {
        /* finalize's checks on fresh operations: 3 query heads over 2 kv heads, a D stride
         * of 2, F32 tensors */
        const int64_t q3[4] = { B, 3, 1, D }, q3s[4] = { 3 * D, D, 3 * D, 1 }, bad_s[4] = { HK * T * D * 2, T * D * 2, D * 2, 2 };
        struct {
            const char *what;
            cudnnBackendDescriptor_t q, k;
            cudnnStatus_t want;
        } c[3];
        cudnnBackendDescriptor_t q3t = tensor(11, CUDNN_DATA_BFLOAT16, q3, q3s, 1), o3t = tensor(14, CUDNN_DATA_BFLOAT16, q3, q3s, 1);
        cudnnBackendDescriptor_t kst = tensor(12, CUDNN_DATA_BFLOAT16, kd, bad_s, 1), qf = tensor(13, CUDNN_DATA_FLOAT, qd, qs, 1);
        c[0].what = "3 query heads over 2 kv heads: BAD_PARAM_SHAPE_MISMATCH";
        c[0].q = q3t, c[0].k = tk, c[0].want = CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        c[1].what = "K with a D stride of 2: NOT_SUPPORTED_LAYOUT";
        c[1].q = tq, c[1].k = kst, c[1].want = CUDNN_STATUS_NOT_SUPPORTED_LAYOUT;
        c[2].what = "an F32 Q: NOT_SUPPORTED_DATA_TYPE";
        c[2].q = qf, c[2].k = tk, c[2].want = CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
        for (int i = 0; i < 3; i++) {
            cudnnBackendDescriptor_t o2;
            cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, &o2);
            set_d(o2, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, c[i].q);
            set_d(o2, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, c[i].k);
            set_d(o2, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, tv);
            set_d(o2, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, i == 0 ? o3t : to);
            is_int(cudnnBackendFinalize(o2), c[i].want, "%s", c[i].what);
            cudnnBackendDestroyDescriptor(o2);
        }
        cudnnBackendDestroyDescriptor(q3t);
        cudnnBackendDestroyDescriptor(o3t);
        cudnnBackendDestroyDescriptor(kst);
        cudnnBackendDestroyDescriptor(qf);
    }
    {
        cudnnBackendDescriptor_t all[] = { tq, tk, tv, to, tp, tsq, tskv, op, plan };
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            cudnnBackendDestroyDescriptor(all[i]);
    }
    cudnnDestroy(h);
    cudaStreamDestroy(st);
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dO);
    cudaFree(dmeta);
    cudaFree(ws);
}

/* ---- the backend ---- */

enum { N_GEN = 4, MAX_PROMPT = 48 };

/* Whole prompts of 1, 7 and 37 tokens and 3 decode steps, and the 37 in chunks of 5: cuDNN
 * against the own kernels and the CPU; every layer of every step through cuDNN. */
static void prompts(const kvg_model *m, const char *name)
{
    static const int lens[] = { 1, 7, 37 };
    int V = m->cfg.vocab_size, L = m->cfg.n_layers;
    size_t n = (size_t)N_GEN * V;
    float *lc = malloc(n * sizeof(float)), *lo = malloc(n * sizeof(float)), *ld = malloc(n * sizeof(float));
    float *lk = malloc(n * sizeof(float));
    int32_t p[MAX_PROMPT + N_GEN];
    char err[512] = "";
    rig c, o, d;
    if (!ok(rig_new(&c, m, "cpu", NULL, 1, 16, 64, err, sizeof err) == 0 &&
            rig_new(&o, m, "cuda", "own", 0, 16, 64, err, sizeof err) == 0 &&
            rig_new(&d, m, "cuda", "cudnn", 0, 16, 64, err, sizeof err) == 0, "%s: rigs (%s)", name, err))
        goto out;
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        long e0;
        double dc, dov;
        prompt_of(m, p, lens[k] + N_GEN, 200u + (uint32_t)k);
        e0 = executes();
        if (!ok(run(&c, p, lens[k], 0, N_GEN, lc) == 0 && run(&o, p, lens[k], 0, N_GEN, lo) == 0 &&
                run(&d, p, lens[k], 0, N_GEN, ld) == 0, "%s: prompt of %d ran on the three", name, lens[k]))
            continue;
        is_int(executes() - e0, (long)N_GEN * L, "%s, %d tokens: each of the %d steps' %d layers through cuDNN", name,
               lens[k], N_GEN, L);
        dc = rel_diff(lc, ld, n);
        dov = rel_diff(lo, ld, n);
        ok(dc <= REL_TOL, "%s, %d tokens: cuDNN vs CPU %.4f of the largest logit", name, lens[k], dc);
        ok(dov <= REL_TOL, "%s, %d tokens: cuDNN vs own kernels %.4f", name, lens[k], dov);
    }
    /* chunked prefill: each chunk's rows see the cached positions and their own (ld, lo:
     * the 37-token prompt's) */
    {
        int ran = run(&d, p, 37, 5, N_GEN, lk) == 0;
        double dd = rel_diff(ld, lk, n), dov = rel_diff(lo, lk, n);
        ok(ran && dd <= REL_TOL && dov <= REL_TOL, "%s: prefill in chunks of 5 through cuDNN as in one (%.2g) and "
           "as the own kernels' whole prompt (%.4f)", name, dd, dov);
    }
    rig_free(&c);
    rig_free(&o);
    rig_free(&d);
out:
    free(lc);
    free(lo);
    free(ld);
    free(lk);
}

/* A script of mixed steps on 4-token blocks: two prefills in one step; a decode row, a
 * prefill chunk and a new prompt in one step; a fork (shared blocks); then 6 steps
 * decoding three sequences at once, whose blocks interleave in the pool. Every logit row
 * goes to out (23 rows); *noncontig / *shared tell whether the tables were so. */
static int script(rig *r, float *out, int *noncontig, int *shared)
{
    int V = r->m->cfg.vocab_size, row = 0, rc = -1;
    int32_t pa[16], pb[16], pc[8], t1 = 7, t2, t3;
    kvg_kv_seq a, b, c, f;
    char err[512];
    prompt_of(r->m, pa, 16, 31);
    prompt_of(r->m, pb, 16, 32);
    prompt_of(r->m, pc, 8, 33);
    kvg_kv_seq_init(&a);
    kvg_kv_seq_init(&b);
    kvg_kv_seq_init(&c);
    kvg_kv_seq_init(&f);
    {
        kvg_fwd_seq s[2] = { { &a, pa, 10, out + (size_t)row * V }, { &b, pb, 7, out + (size_t)(row + 1) * V } };
        if (kvg_forward_step(r->fw, s, 2, err, sizeof err) != 0)
            goto fail;
        row += 2;
    }
    {
        kvg_fwd_seq s[3] = { { &a, &t1, 1, out + (size_t)row * V }, { &b, pb + 7, 6, out + (size_t)(row + 1) * V },
                             { &c, pc, 5, out + (size_t)(row + 2) * V } };
        if (kvg_forward_step(r->fw, s, 3, err, sizeof err) != 0)
            goto fail;
        row += 3;
    }
    if (kvg_kv_seq_fork(r->kv, &a, &f, err, sizeof err) != 0)
        goto fail;
    *shared = a.n_blocks > 1 && f.blocks[0] == a.blocks[0] && f.blocks[1] == a.blocks[1];
    for (int i = 0; i < 6; i++) {
        t1 = pa[10 + i];
        t2 = pb[i];
        t3 = pc[5 + i % 3];
        kvg_fwd_seq s[3] = { { &a, &t1, 1, out + (size_t)row * V }, { &f, &t2, 1, out + (size_t)(row + 1) * V },
                             { &c, &t3, 1, out + (size_t)(row + 2) * V } };
        if (kvg_forward_step(r->fw, s, 3, err, sizeof err) != 0)
            goto fail;
        row += 3;
    }
    *noncontig = 0;
    for (int i = 0; i + 1 < a.n_blocks; i++)
        if (a.blocks[i + 1] != a.blocks[i] + 1)
            *noncontig = 1;
    rc = row;
    goto done;
fail:
    diag("script: %s", err);
done:
    kvg_kv_seq_release(r->kv, &a);
    kvg_kv_seq_release(r->kv, &b);
    kvg_kv_seq_release(r->kv, &c);
    kvg_kv_seq_release(r->kv, &f);
    return rc;
}

static void mixed(const kvg_model *m, const char *name)
{
    enum { ROWS = 23 };
    int V = m->cfg.vocab_size, nc = 0, sh = 0, x, y;
    size_t n = (size_t)ROWS * V;
    float *lc = calloc(n, sizeof(float)), *lo = calloc(n, sizeof(float)), *ld = calloc(n, sizeof(float));
    char err[512] = "";
    long e0;
    rig c, o, d;
    if (!ok(rig_new(&c, m, "cpu", NULL, 1, 4, 64, err, sizeof err) == 0 &&
            rig_new(&o, m, "cuda", "own", 0, 4, 64, err, sizeof err) == 0 &&
            rig_new(&d, m, "cuda", "cudnn", 0, 4, 64, err, sizeof err) == 0, "%s: rigs of 4-token blocks (%s)", name,
            err))
        goto out;
    e0 = executes();
    x = script(&d, ld, &nc, &sh);
    ok(x == ROWS && script(&c, lc, &nc, &sh) == ROWS && (y = script(&o, lo, &nc, &sh)) == ROWS,
       "%s: the mixed script ran on the three", name);
    is_int(executes() - e0, 8L * m->cfg.n_layers, "%s: its 8 steps through cuDNN", name);
    ok(nc && sh, "%s: the script's page tables have non-contiguous and shared blocks", name);
    ok(rel_diff(lc, ld, n) <= REL_TOL, "%s: mixed steps, cuDNN vs CPU %.4f", name, rel_diff(lc, ld, n));
    ok(rel_diff(lo, ld, n) <= REL_TOL, "%s: mixed steps, cuDNN vs own kernels %.4f", name, rel_diff(lo, ld, n));
    rig_free(&c);
    rig_free(&o);
    rig_free(&d);
out:
    free(lc);
    free(lo);
    free(ld);
}

/* The loaded cuDNN is 9.14 (no paged SDPA); then a finalize fails; then an execute. */
static void fallbacks(const kvg_model *m)
{
    int V = m->cfg.vocab_size, L = m->cfg.n_layers;
    size_t n = (size_t)N_GEN * V;
    float *lo = malloc(n * sizeof(float)), *ld = malloc(n * sizeof(float));
    int32_t p[20 + N_GEN];
    char err[512] = "", log[4096];
    capture cap;
    long e0;
    int made;
    rig o, d;
    prompt_of(m, p, 20 + N_GEN, 41);
    if (!ok(rig_new(&o, m, "cuda", "own", 0, 16, 64, err, sizeof err) == 0 && run(&o, p, 20, 0, N_GEN, lo) == 0,
            "fallbacks: the own kernels' reference (%s)", err))
        goto out;

    setenv("KVG_EMU_CUDNN_VERSION", "91400", 1);
    capture_begin(&cap);
    made = rig_new(&d, m, "cuda", NULL, 0, 16, 64, err, sizeof err) == 0;
    capture_end(&cap, log, sizeof log);
    e0 = executes();
    ok(made && run(&d, p, 20, 0, N_GEN, ld) == 0 && memcmp(ld, lo, n * sizeof(float)) == 0 && executes() == e0,
       "cuDNN 9.14 (auto): the own kernels' bits, no cuDNN call");
    ok(count_lines(log, "kvgate-engine: ") == 1 && strstr(log, "9.14.0") && strstr(log, "own kernels"),
       "... with one log line naming why: %s", log);
    if (made)
        rig_free(&d);
    ok(rig_new(&d, m, "cuda", "cudnn", 0, 16, 64, err, sizeof err) != 0 && strstr(err, "KVGATE_CUDA_ATTENTION=cudnn") &&
       strstr(err, "9.14.0"), "cuDNN 9.14 with KVGATE_CUDA_ATTENTION=cudnn: a startup error (%s)", err);
    unsetenv("KVG_EMU_CUDNN_VERSION");

    kvg_emu_fail("cudnnBackendFinalize", 1, CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
    capture_begin(&cap);
    made = rig_new(&d, m, "cuda", "cudnn", 0, 16, 64, err, sizeof err) == 0;
    e0 = executes();
    made = made && run(&d, p, 20, 0, N_GEN, ld) == 0;
    capture_end(&cap, log, sizeof log);
    ok(made && memcmp(ld, lo, n * sizeof(float)) == 0 && executes() == e0,
       "a failed finalize: the own kernels' bits, no execute");
    ok(count_lines(log, "kvgate-engine: ") == 2 && strstr(log, "cudnnBackendFinalize") &&
       strstr(log, "NOT_SUPPORTED_SHAPE") && strstr(log, "own kernels from now on"),
       "... with one log line naming the call and status: %s", log);
    ok(made && run(&d, p, 20, 0, N_GEN, ld) == 0 && executes() == e0, "... and no cuDNN for the later steps either");
    if (made)
        rig_free(&d);

    if (rig_new(&d, m, "cuda", "cudnn", 0, 16, 64, err, sizeof err) == 0) {
        kvg_kv_seq s;
        kvg_fwd_seq b;
        kvg_kv_seq_init(&s);
        kvg_emu_fail("cudnnBackendExecute", 2, CUDNN_STATUS_EXECUTION_FAILED);
        b = (kvg_fwd_seq){ &s, p, 20, ld };
        ok(kvg_forward_step(d.fw, &b, 1, err, sizeof err) != 0 && strstr(err, "cudnnBackendExecute") &&
           strstr(err, "layer 1") && strstr(err, "CUDNN_STATUS_EXECUTION_FAILED"),
           "an execute failing fails the step, naming call, layer and status (%s)", err);
        kvg_kv_seq_release(d.kv, &s);
        e0 = executes();
        ok(run(&d, p, 20, 0, N_GEN, ld) == 0 && executes() - e0 == (long)N_GEN * L && rel_diff(lo, ld, n) <= REL_TOL,
           "... the next steps run through cuDNN again");
        rig_free(&d);
    }
    rig_free(&o);
out:
    free(lo);
    free(ld);
}

/* --batch-invariant on: no cuDNN handle, no call; an unknown KVGATE_CUDA_ATTENTION. */
static void invariant_and_env(const kvg_model *m)
{
    int32_t p[12 + N_GEN];
    float *l = malloc((size_t)N_GEN * m->cfg.vocab_size * sizeof(float));
    char err[512] = "", log[2048];
    long c0 = kvg_emu_calls("cudnnCreate"), e0 = executes();
    capture cap;
    rig d;
    int made;
    prompt_of(m, p, 12 + N_GEN, 51);
    capture_begin(&cap);
    made = rig_new(&d, m, "cuda", "cudnn", 1, 16, 64, err, sizeof err) == 0;
    capture_end(&cap, log, sizeof log);
    ok(made && run(&d, p, 12, 0, N_GEN, l) == 0 && kvg_emu_calls("cudnnCreate") == c0 && executes() == e0,
       "--batch-invariant on with KVGATE_CUDA_ATTENTION=cudnn: no cuDNN handle, no cuDNN call");
    ok(strstr(log, "--batch-invariant on keeps the own attention kernels") != NULL, "... and a log line says so: %s",
       log);
    if (made)
        rig_free(&d);
    ok(rig_new(&d, m, "cuda", "fast", 0, 16, 64, err, sizeof err) != 0 && strstr(err, "KVGATE_CUDA_ATTENTION=fast") &&
       strstr(err, "own, cudnn or auto"), "an unknown KVGATE_CUDA_ATTENTION refused (%s)", err);
    free(l);
}

/* What cuDNN's SDPA cannot express stays on the own kernels: per layer for sliding
 * windows, the whole model for soft-capping and sinks; the divisor is its SCALE. */
static const tm_spec fam_base = { 48, 80, 3, 4, 2, 16, 97, 256, 0, 0, 1, 0, 1, 21 };

static void families(void)
{
    static const struct {
        const char *name;
        tm_family f;
        int layers_cudnn;            /* of 3 */
        const char *why;             /* the whole model on the own kernels: the reason */
    } fam[] = {
        { "sliding window 5 on layers 0 and 2", { .swa_window = 5, .swa_period = 2 }, 1, NULL },
        { "attention divisor sqrt(64)", { .attn_query_scalar = 64.0f }, 3, NULL },
        { "q/k norms, query temperature", { .qk_norm = 1, .attn_temp_scale = 0.25f, .attn_temp_floor = 3 }, 3, NULL },
        { "attention soft-capping 3", { .attn_softcap = 3.0f }, 0, "soft-capped scores" },
        { "attention sinks", { .sinks = 1 }, 0, "attention sinks" },
    };
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        tm_model t;
        int V, made;
        size_t n;
        float *lc, *ld;
        int32_t p[30 + N_GEN];
        char err[512] = "", log[2048];
        capture cap;
        long e0;
        rig c, d;
        if (!ok(tm_build(&t, &fam_base) == 0 && tm_apply_family(&t, &fam[i].f, fam_base.seed) == 0, "%s: model",
                fam[i].name)) {
            tm_free(&t);
            continue;
        }
        V = t.m.cfg.vocab_size;
        n = (size_t)N_GEN * V;
        lc = malloc(n * sizeof(float));
        ld = malloc(n * sizeof(float));
        prompt_of(&t.m, p, 30 + N_GEN, 61);
        capture_begin(&cap);
        made = rig_new(&d, &t.m, "cuda", NULL, 0, 16, 64, err, sizeof err) == 0;
        capture_end(&cap, log, sizeof log);
        if (ok(made && rig_new(&c, &t.m, "cpu", NULL, 1, 16, 64, err, sizeof err) == 0, "%s: rigs (%s)", fam[i].name,
               err)) {
            e0 = executes();
            ok(run(&c, p, 30, 0, N_GEN, lc) == 0 && run(&d, p, 30, 0, N_GEN, ld) == 0, "%s: ran", fam[i].name);
            is_int(executes() - e0, (long)N_GEN * fam[i].layers_cudnn, "%s: %d of 3 layers through cuDNN",
                   fam[i].name, fam[i].layers_cudnn);
            ok(rel_diff(lc, ld, n) <= REL_TOL, "%s: vs CPU %.4f", fam[i].name, rel_diff(lc, ld, n));
            rig_free(&c);
        }
        if (made)
            rig_free(&d);
        if (fam[i].why) {
            ok(strstr(log, fam[i].why) && strstr(log, "own kernels"), "%s: the log line names it: %s", fam[i].name, log);
            ok(rig_new(&d, &t.m, "cuda", "cudnn", 0, 16, 64, err, sizeof err) != 0 && strstr(err, fam[i].why),
               "%s: KVGATE_CUDA_ATTENTION=cudnn refuses (%s)", fam[i].name, err);
        }
        free(lc);
        free(ld);
        tm_free(&t);
    }
}

/* KVGATE_CUDA_FUSE: cuDNN's BF16 output is wo's input as it is (engine/cuda/cuda_sdpa.c):
 * the same logits with fusing off. With a BF16 wo (bf16_wo), fusing saves 7 launches per
 * layer and step, as on the own kernels (t/unit/cuda_fuse.c): the roundings before q/k/v,
 * wo, gate/up and w_down, two residual adds (the prompt's last layer: its add joins the
 * final norm, and the classifier's rounding is saved in its place), RoPE and the K/V
 * write as one kernel. */
static void fused_output(const kvg_model *m, const char *name, int bf16_wo)
{
    int V = m->cfg.vocab_size, L = m->cfg.n_layers;
    size_t n = (size_t)N_GEN * V;
    float *on = malloc(n * sizeof(float)), *off = malloc(n * sizeof(float));
    int32_t p[12 + N_GEN];
    long launches[2] = { 0, 0 };
    char err[512] = "";
    int ran = 1;
    prompt_of(m, p, 12 + N_GEN, 77u);
    for (int f = 0; f < 2; f++) {
        rig r;
        long l0;
        setenv("KVGATE_CUDA_FUSE", f ? "1" : "0", 1);
        if (rig_new(&r, m, "cuda", "cudnn", 0, 16, 64, err, sizeof err) != 0) {
            diag("%s", err);
            ran = 0;
            unsetenv("KVGATE_CUDA_FUSE");
            break;
        }
        unsetenv("KVGATE_CUDA_FUSE");
        l0 = kvg_emu_calls("launch");
        ran &= run(&r, p, 12, 0, N_GEN, f ? on : off) == 0;
        launches[f] = kvg_emu_calls("launch") - l0;
        rig_free(&r);
    }
    ok(ran && memcmp(on, off, n * sizeof(float)) == 0, "%s: through cuDNN, logits with KVGATE_CUDA_FUSE on and "
       "off: the same bits", name);
    diag("%s: through cuDNN, %d steps of %d layers: %ld launches with fusing off, %ld on", name, N_GEN, L,
         launches[0], launches[1]);
    if (bf16_wo)
        ok(ran && launches[0] - launches[1] == 7L * N_GEN * L, "%s: cuDNN's output is wo's input: 7 launches a "
           "layer and step saved, wo's rounding among them (%ld -> %ld)", name, launches[0], launches[1]);
    free(on);
    free(off);
}

int main(void)
{
    char err[512];
    kvg_model_load_opts lo;
    kvg_model *syn;
    tm_model ta;
    tm_spec a = { 48, 80, 2, 4, 2, 16, 97, 256, 1, 0, 1, 1, 1, 7 };
    /* The step's launches and calls are counted as the operations make them: without
     * CUDA graphs (a replayed step makes none; t/unit/cuda_graph.c tests graphs). */
    setenv("KVGATE_CUDA_GRAPHS", "0", 1);

    emulated_api();
    memset(&lo, 0, sizeof lo);
    syn = kvg_model_load("synthetic:260K-bf16", &lo, err, sizeof err);
    if (!ok(syn != NULL, "load synthetic:260K-bf16"))
        diag("%s", err);
    ok(tm_build(&ta, &a) == 0, "test model A (qwen2-like: biases, GQA 4:2, head_dim 16, F16/BF16/F32)");
    prompts(&ta.m, "test model A");
    mixed(&ta.m, "test model A");
    fused_output(&ta.m, "test model A", 0);    /* its wo is F16: cuDNN's output is rounded again */
    if (syn) {
        prompts(syn, "synthetic:260K-bf16");
        mixed(syn, "synthetic:260K-bf16");
        fused_output(syn, "synthetic:260K-bf16", 1);
    }
    fallbacks(&ta.m);
    invariant_and_env(&ta.m);
    families();
    is_int(kvg_emu_bytes_in_use(), 0, "no device byte left");
    kvg_model_free(syn);
    tm_free(&ta);
    return done_testing();
}
