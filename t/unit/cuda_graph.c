/* CUDA graphs for decode steps (engine/cuda/cuda_graph.c), emulated:
 *
 *   - a served workload (3 prompts prefilled together, decode steps at batch 3, one
 *     sequence finishing: batch 2, a new prompt joining: batch 3 again, contexts growing
 *     across blocks and attention splits) with KVGATE_CUDA_GRAPHS=0 and on: the same
 *     logits bit for bit at every step; with graphs the decode steps launch one graph and
 *     no kernel, and few graphs are made; in invariant mode, with --batch-invariant off
 *     (the split follows the context) and through cuDNN's attention;
 *   - the first decode step at a batch size needs bigger buffers: its capture is given up
 *     and the step runs eagerly (counted);
 *   - a step whose operations differ from the graph's (an argument changed, same
 *     signature): end_step says KVG_STEP_AGAIN, forward.c calls the operations again, a
 *     new graph is captured, the logits are the eager run's;
 *   - failures: cudaGraphInstantiate or cudaStreamEndCapture failing (injected) make the
 *     step run eagerly, correct; three such failures turn graphs off;
 *   - the same with int8 KV (--kv-dtype int8, layer 0 BF16, layer 1 int8), invariant and
 *     through cuDNN (which takes the BF16 layer, the own kernels the int8 one);
 *   - KVGATE_CUDA_GRAPHS=2 refused at creation; KVGATE_CUDA_SYNC=1 runs without graphs;
 *   - nothing left on the device. */
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

typedef struct rig {
    const kvg_model *m;
    kvg_backend *be;
    kvg_kv_pool *kv;
    kvg_forward *fw;
} rig;

/* The rigs' KV pool: int8 KV past the first layer when set (--kv-dtype int8
 * --kv-full-precision-layers 1). */
static int g_int8;

/* graphs: KVGATE_CUDA_GRAPHS at creation (NULL: unset); attention: KVGATE_CUDA_ATTENTION. */
static int rig_new(rig *r, const kvg_model *m, const char *graphs, const char *attention, int invariant,
                   char *err, size_t err_len)
{
    kvg_kv_geom g;
    kvg_backend_opts o;
    memset(r, 0, sizeof *r);
    memset(&o, 0, sizeof o);
    o.n_threads = 1;
    o.batch_invariant = invariant;
    if (graphs)
        setenv("KVGATE_CUDA_GRAPHS", graphs, 1);
    if (attention)
        setenv("KVGATE_CUDA_ATTENTION", attention, 1);
    r->m = m;
    r->be = kvg_backend_new_opts("cuda", m, &o, err, err_len);
    unsetenv("KVGATE_CUDA_GRAPHS");
    unsetenv("KVGATE_CUDA_ATTENTION");
    /* blocks of 8 positions: contexts cross blocks every few steps */
    kvg_forward_kv_geom(m, 8, &g);
    if (g_int8) {
        g.dtype = KVG_KV_INT8;
        g.full_layers = 1;
    }
    r->kv = r->be ? kvg_backend_kv_pool_new(r->be, &g, 96, err, err_len) : NULL;
    r->fw = r->kv ? kvg_forward_new(m, r->be, r->kv, err, err_len) : NULL;
    return r->fw ? 0 : -1;
}

static void rig_free(rig *r)
{
    kvg_forward_free(r->fw);
    kvg_kv_pool_free(r->kv);
    kvg_backend_free(r->be);
}

static kvg_cuda *cu_of(const rig *r)
{
    return r->be->ctx;
}

/* The workload: prompts of 5, 11 and 19 tokens in one step; 30 decode steps at batch 3;
 * sequence 1 leaves, 8 steps at batch 2; a 9-token prompt joins as sequence 1 (one step
 * with it alone), then 30 steps at batch 3. Every step's logits, in order, into rec
 * (n_steps x 3 x V, unused rows left zero). The decode steps' kernel launches and graph
 * launches counted. 0, or -1 (err). */
#define W_STEPS (1 + 30 + 8 + 1 + 30)
typedef struct counts {
    long decode_launches;        /* kernel launches made during the decode steps */
    long graph_launches;         /* cudaGraphLaunch calls, all steps */
    long decode_steps;
} counts;

/* An operation table whose rmsnorm uses another eps on every call when `skew` is set:
 * the same signature, other arguments. */
static kvg_backend_ops skewed_ops;
static const kvg_backend_ops *base_ops;
static int skew;
static void skewed_rmsnorm(kvg_backend *be, const float *x, const float *w, float eps, int rows, int dim, float *out)
{
    base_ops->rmsnorm(be, x, w, skew ? eps * 2.0f : eps, rows, dim, out);
}

static int workload(rig *r, float *rec, counts *n, int skew_from, char *err, size_t err_len)
{
    const int V = r->m->cfg.vocab_size;
    kvg_kv_seq seq[3];
    int32_t prompt[3][19], next[3], late[9];
    static const int lens[3] = { 5, 11, 19 };
    uint64_t s = 17;
    int step = 0, rc = 0;
    long l0, g0;

    memset(n, 0, sizeof *n);
    for (int i = 0; i < 3; i++) {
        kvg_kv_seq_init(&seq[i]);
        for (int t = 0; t < 19; t++)
            prompt[i][t] = (int32_t)(tm_rng(&s) % (uint32_t)V);
    }
    for (int t = 0; t < 9; t++)
        late[t] = (int32_t)(tm_rng(&s) % (uint32_t)V);
    g0 = kvg_emu_calls("cudaGraphLaunch");
    {
        kvg_fwd_seq b[3];
        for (int i = 0; i < 3; i++)
            b[i] = (kvg_fwd_seq){ &seq[i], prompt[i], lens[i], rec + ((size_t)step * 3 + i) * V };
        rc = kvg_forward_step(r->fw, b, 3, err, err_len);
        step++;
    }
    for (int k = 0; k < 30 + 8 + 1 + 30 && rc == 0; k++, step++) {
        kvg_fwd_seq b[3];
        int nb = 0, phase_two = k >= 30 && k < 38, join = k == 38;
        skew = step >= skew_from;
        if (join) {
            /* sequence 1 is gone; the late prompt takes its place, alone in its step */
            kvg_kv_seq_release(r->kv, &seq[1]);
            kvg_kv_seq_init(&seq[1]);
            b[0] = (kvg_fwd_seq){ &seq[1], late, 9, rec + ((size_t)step * 3 + 1) * V };
            rc = kvg_forward_step(r->fw, b, 1, err, err_len);
            continue;
        }
        for (int i = 0; i < 3; i++) {
            if (phase_two && i == 1)
                continue;
            /* the next token: a function of the step and the sequence (not of the logits,
             * so that both runs feed the same tokens whatever they compute) */
            next[i] = (int32_t)((step * 31 + i * 7) % V);
            b[nb++] = (kvg_fwd_seq){ &seq[i], &next[i], 1, rec + ((size_t)step * 3 + i) * V };
        }
        l0 = kvg_emu_calls("launch");
        rc = kvg_forward_step(r->fw, b, nb, err, err_len);
        n->decode_launches += kvg_emu_calls("launch") - l0;
        n->decode_steps++;
    }
    skew = 0;
    n->graph_launches = kvg_emu_calls("cudaGraphLaunch") - g0;
    for (int i = 0; i < 3; i++)
        kvg_kv_seq_release(r->kv, &seq[i]);
    return rc;
}

/* The workload eagerly and with graphs (each on a fresh backend), compared bit for bit. */
static void same_as_eager(const kvg_model *m, const char *name, const char *attention, int invariant)
{
    const size_t sz = (size_t)W_STEPS * 3 * (size_t)m->cfg.vocab_size * sizeof(float);
    float *a = calloc(1, sz), *b = calloc(1, sz);
    char err[512] = "";
    rig ra, rb;
    counts ca, cb;
    int rca = -1, rcb = -1;
    kvg_cu_graph_stats st;

    memset(&st, 0, sizeof st);
    if (rig_new(&ra, m, "0", attention, invariant, err, sizeof err) == 0) {
        rca = workload(&ra, a, &ca, W_STEPS, err, sizeof err);
        rig_free(&ra);
    }
    if (rca)
        diag("eager: %s", err);
    if (rig_new(&rb, m, NULL, attention, invariant, err, sizeof err) == 0) {
        rcb = workload(&rb, b, &cb, W_STEPS, err, sizeof err);
        st = cu_of(&rb)->gstats;
        ok(cu_of(&rb)->graphs == 1, "%s: graphs still on at the end", name);
        rig_free(&rb);
    } else {
        ok(0, "%s: rig (%s)", name, err);
    }
    if (rcb)
        diag("graphs: %s", err);
    ok(rca == 0 && rcb == 0 && memcmp(a, b, sz) == 0, "%s: %d steps' logits with KVGATE_CUDA_GRAPHS=0 and on: the "
       "same bits", name, W_STEPS);
    diag("%s: %ld decode steps; eager %ld kernel launches, with graphs %ld and %ld graph launches; %lld graphs "
         "made, %lld captures given up for a growing buffer, %lld refused replays, %lld failed", name,
         cb.decode_steps, ca.decode_launches, cb.decode_launches, cb.graph_launches, (long long)st.captured,
         (long long)st.grown, (long long)st.again, (long long)st.failed);
    ok(ca.graph_launches == 0, "%s: KVGATE_CUDA_GRAPHS=0 launches no graph", name);
    ok(st.failed == 0 && st.again == 0, "%s: no capture failed, no replay refused", name);
    /* Every decode step but the few that capture or run eagerly is one graph launch. */
    ok(cb.graph_launches == st.launched && cb.graph_launches >= cb.decode_steps - 2 * st.captured - st.grown,
       "%s: %ld of %ld decode steps ran as a graph", name, cb.graph_launches, cb.decode_steps);
    ok(st.captured >= 2 && st.captured <= 12, "%s: a few graphs made (%lld): per batch size and layout",
       name, (long long)st.captured);
    ok(cb.decode_launches * 4 < ca.decode_launches, "%s: the decode steps' kernel launches: %ld -> %ld", name,
       ca.decode_launches, cb.decode_launches);
    free(a);
    free(b);
}

/* A first step that is decode-shaped (three 1-token prompts): nothing ran before it, its
 * buffers must grow, which a capture cannot: given up, the step runs eagerly; the steps
 * after it replay. The same logits as eagerly. */
static void first_step_grows(const kvg_model *m)
{
    const int V = m->cfg.vocab_size;
    float *a = calloc((size_t)6 * 3 * V, sizeof(float)), *b = calloc((size_t)6 * 3 * V, sizeof(float));
    char err[512] = "";
    int rc[2] = { -1, -1 };
    kvg_cu_graph_stats st;
    memset(&st, 0, sizeof st);
    for (int k = 0; k < 2; k++) {
        rig r;
        kvg_kv_seq seq[3];
        float *rec = k ? b : a;
        if (rig_new(&r, m, k ? NULL : "0", NULL, 1, err, sizeof err) != 0)
            continue;
        for (int i = 0; i < 3; i++)
            kvg_kv_seq_init(&seq[i]);
        rc[k] = 0;
        for (int step = 0; step < 6 && rc[k] == 0; step++) {
            int32_t t[3];
            kvg_fwd_seq bt[3];
            for (int i = 0; i < 3; i++) {
                t[i] = (int32_t)((step * 13 + i * 5) % V);
                bt[i] = (kvg_fwd_seq){ &seq[i], &t[i], 1, rec + ((size_t)step * 3 + i) * V };
            }
            rc[k] = kvg_forward_step(r.fw, bt, 3, err, sizeof err);
        }
        if (k)
            st = cu_of(&r)->gstats;
        for (int i = 0; i < 3; i++)
            kvg_kv_seq_release(r.kv, &seq[i]);
        rig_free(&r);
    }
    ok(rc[0] == 0 && rc[1] == 0 && memcmp(a, b, (size_t)6 * 3 * V * sizeof(float)) == 0,
       "a decode-shaped first step: the same logits with graphs");
    ok(st.grown >= 1 && st.launched >= 4, "... its capture given up for growing buffers (%lld), the later steps "
       "graphs (%lld)", (long long)st.grown, (long long)st.launched);
    free(a);
    free(b);
}

/* A step whose operations differ from the graph captured for its signature: refused at
 * end_step, called again, captured anew; the logits those of the same skewed operations
 * run eagerly. */
static void refused_replay(const kvg_model *m)
{
    const size_t sz = (size_t)W_STEPS * 3 * (size_t)m->cfg.vocab_size * sizeof(float);
    float *a = calloc(1, sz), *b = calloc(1, sz);
    char err[512] = "";
    counts c;
    int rc[2] = { -1, -1 };
    kvg_cu_graph_stats st;
    memset(&st, 0, sizeof st);
    for (int k = 0; k < 2; k++) {
        rig r;
        if (rig_new(&r, m, k ? NULL : "0", NULL, 1, err, sizeof err) != 0)
            continue;
        base_ops = r.be->ops;
        skewed_ops = *r.be->ops;
        skewed_ops.rmsnorm = skewed_rmsnorm;
        r.be->ops = &skewed_ops;
        /* the eps changes from step 12 on: graphs made before hold the other eps */
        rc[k] = workload(&r, k ? b : a, &c, 12, err, sizeof err);
        if (k)
            st = cu_of(&r)->gstats;
        r.be->ops = base_ops;
        rig_free(&r);
    }
    ok(rc[0] == 0 && rc[1] == 0 && memcmp(a, b, sz) == 0,
       "operations that differ from the graph's (rmsnorm's eps from step 12): the eager run's logits");
    ok(st.again == 1, "... one replay refused (%lld), the step called again and captured", (long long)st.again);
    free(a);
    free(b);
}

/* Injected failures of the graph's calls: each step still right; three turn graphs off. */
static void failures(const kvg_model *m)
{
    const size_t sz = (size_t)W_STEPS * 3 * (size_t)m->cfg.vocab_size * sizeof(float);
    float *a = calloc(1, sz), *b = calloc(1, sz);
    char err[512] = "";
    counts c;
    rig r;
    int rc = -1;

    if (rig_new(&r, m, "0", NULL, 1, err, sizeof err) == 0) {
        rc = workload(&r, a, &c, W_STEPS, err, sizeof err);
        rig_free(&r);
    }
    ok(rc == 0, "eager reference");
    if (rig_new(&r, m, NULL, NULL, 1, err, sizeof err) == 0) {
        kvg_emu_fail("cudaGraphInstantiate", 1, cudaErrorMemoryAllocation);
        kvg_emu_fail("cudaStreamEndCapture", 2, cudaErrorStreamCaptureInvalidated);
        rc = workload(&r, b, &c, W_STEPS, err, sizeof err);
        ok(rc == 0 && memcmp(a, b, sz) == 0, "cudaGraphInstantiate and cudaStreamEndCapture failing once each: "
           "the same logits");
        is_int((int)cu_of(&r)->gstats.failed, 2, "... two captures failed");
        ok(cu_of(&r)->graphs == 1 && cu_of(&r)->gstats.captured >= 1, "... graphs still on, made after");
        rig_free(&r);
    }
    kvg_emu_reset();
    if (rig_new(&r, m, NULL, NULL, 1, err, sizeof err) == 0) {
        for (int i = 0; i < 3; i++)      /* the next three calls */
            kvg_emu_fail("cudaGraphInstantiate", 1, cudaErrorMemoryAllocation);
        rc = workload(&r, b, &c, W_STEPS, err, sizeof err);
        ok(rc == 0 && memcmp(a, b, sz) == 0, "three failed instantiations: the same logits");
        ok(cu_of(&r)->graphs == 0 && c.graph_launches == 0, "... graphs off after the third (%lld failed)",
           (long long)cu_of(&r)->gstats.failed);
        rig_free(&r);
    }
    kvg_emu_reset();
    free(a);
    free(b);
}

static void settings(const kvg_model *m)
{
    char err[512] = "";
    rig r;
    ok(rig_new(&r, m, "2", NULL, 1, err, sizeof err) != 0 && strstr(err, "KVGATE_CUDA_GRAPHS=2"),
       "KVGATE_CUDA_GRAPHS=2 refused (%s)", err);
    if (r.be)
        rig_free(&r);
    setenv("KVGATE_CUDA_SYNC", "1", 1);
    if (ok(rig_new(&r, m, NULL, NULL, 1, err, sizeof err) == 0, "KVGATE_CUDA_SYNC=1: rig")) {
        ok(cu_of(&r)->graphs == 0, "KVGATE_CUDA_SYNC=1: no graphs (each operation waited for)");
        rig_free(&r);
    }
    unsetenv("KVGATE_CUDA_SYNC");
}

int main(void)
{
    tm_model q;
    /* qwen2-like: biases, GQA 4:2, head_dim 16, F16/BF16/F32 weights side by side */
    tm_spec spec = { 48, 80, 2, 4, 2, 16, 97, 256, 1, 0, 1, 1, 1, 7 };

    if (!ok(tm_build(&q, &spec) == 0, "test model"))
        return done_testing();
    same_as_eager(&q.m, "invariant, own attention", NULL, 1);
    same_as_eager(&q.m, "--batch-invariant off, own attention", "own", 0);
    same_as_eager(&q.m, "--batch-invariant off, cuDNN attention", "cudnn", 0);
    g_int8 = 1;
    same_as_eager(&q.m, "int8 KV, invariant, own attention", NULL, 1);
    same_as_eager(&q.m, "int8 KV, --batch-invariant off, cuDNN attention", "cudnn", 0);
    g_int8 = 0;
    first_step_grows(&q.m);
    refused_replay(&q.m);
    failures(&q.m);
    settings(&q.m);
    tm_free(&q);
    is_int((long)kvg_emu_bytes_in_use(), 0, "nothing left on the device");
    return done_testing();
}
