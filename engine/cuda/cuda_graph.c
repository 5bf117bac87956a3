/* CUDA graphs for decode steps.
 *
 * A decode step of a dense model launches about 20 kernels and GEMMs per layer (a few
 * hundred for an 8B model); each costs the host microseconds to launch, and between small
 * kernels the GPU waits for the next launch. So the backend captures a decode step's work
 * as a CUDA graph once and, for the steps after it, launches the graph: one launch for the
 * step, its kernels back to back on the device.
 *
 * A graph replays exactly the work it captured: the kernels with the arguments they had,
 * the GEMMs with their pointers. What changes from one decode step to the next (tokens,
 * positions, block tables, RoPE's cos/sin, the attention's items) lives in the step's
 * device buffer (step_plan.h), uploaded by begin_step before the graph runs. Laid out
 * padded (kvg_step_plan_layout_padded), its layout stays the same while contexts grow.
 * A step replays a graph when
 *   - its signature is the graph's: the plan's layout and sizes, the attention's groups,
 *     the step buffer's and scratch's addresses (alloc_gen counts every device allocation
 *     of the backend), cuDNN's plan;
 *   - and the operations forward.c calls, each with every argument, are those the graph
 *     was captured from. Each operation appends its name and arguments to the step's
 *     record (kvg_cu_note); end_step compares the record with the graph's, byte for byte.
 * The second is known only at end_step: in a replayed step the operations only record.
 * When the record differs, end_step returns KVG_STEP_AGAIN and forward.c calls the step's
 * operations again, captured this time into a new graph. A capture that fails (an
 * operation needs a bigger buffer: cudaMalloc is refused in a capture; any other failure)
 * is discarded the same way, and the step runs again without a graph: nothing of it ran
 * (captured work runs only when the graph is launched).
 *
 * Only decode steps (one row per sequence) are captured: a prefill step's kernels are big
 * enough that launching them costs little, and its shapes rarely repeat. Graphs are kept
 * per signature, KVG_CU_GRAPHS_KEPT at most (the least recently used is replaced).
 * KVGATE_CUDA_GRAPHS=0 turns them off; KVGATE_CUDA_SYNC=1 and MoE models (whose step waits
 * for the experts' row counts) run without. */
#include "cuda_internal.h"
#include "cuda_sdpa.h"
#include "errmsg.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVG_CU_GRAPHS_KEPT 32
/* the most rows a captured step has (decode batches; larger ones run eagerly) */
#define KVG_CU_GRAPH_MAX_ROWS 512
/* failed captures (not for a buffer that had to grow) before graphs are turned off */
#define KVG_CU_GRAPH_MAX_FAILURES 3

struct kvg_cu_graph {
    unsigned char *rec;          /* signature (sig_len bytes), then the operations' record */
    size_t rec_len, sig_len;
    cudaGraphExec_t exec;
    int64_t used;                /* the step that last launched it */
};

int kvg_cu_graph_init(kvg_cuda *c, char *err, size_t err_len)
{
    const char *v = getenv("KVGATE_CUDA_GRAPHS");
    if (!v || !*v || strcmp(v, "1") == 0) {
        c->graphs = 1;
    } else if (strcmp(v, "0") == 0) {
        c->graphs = 0;
    } else {
        kvg_set_err(err, err_len, "cuda: KVGATE_CUDA_GRAPHS=%s: need 0 (off) or 1 (on, the default)", v);
        return -1;
    }
    if (c->graphs && (c->sync_each || c->m->cfg.n_experts > 0))
        c->graphs = 0;
    c->graph_cache = calloc(KVG_CU_GRAPHS_KEPT, sizeof *c->graph_cache);
    if (!c->graph_cache) {
        kvg_set_err(err, err_len, "cuda: out of memory");
        return -1;
    }
    return 0;
}

static void graph_drop(kvg_cu_graph *g)
{
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    free(g->rec);
    memset(g, 0, sizeof *g);
}

void kvg_cu_graph_free(kvg_cuda *c)
{
    if (c->graph_cache)
        for (int i = 0; i < c->n_graphs; i++)
            graph_drop(&c->graph_cache[i]);
    free(c->graph_cache);
    c->graph_cache = NULL;
    c->n_graphs = 0;
    free(c->rec);
    c->rec = NULL;
    c->rec_cap = c->rec_len = 0;
}

void kvg_cu_note(kvg_cuda *c, const void *p, size_t n)
{
    if (!c->recording || c->rec_oom)
        return;
    if (c->rec_len + n > c->rec_cap) {
        size_t cap = (c->rec_len + n) * 2 + 4096;
        unsigned char *r = realloc(c->rec, cap);
        if (!r) {
            c->rec_oom = 1;      /* never matches, never stored: the step runs again eagerly */
            return;
        }
        c->rec = r;
        c->rec_cap = cap;
    }
    memcpy(c->rec + c->rec_len, p, n);
    c->rec_len += n;
}

int kvg_cu_graph_padded(const kvg_cuda *c, const kvg_step *s)
{
    return c->graphs && c->step_again != KVG_CU_AGAIN_EAGER && s->n_rows == s->n_seqs &&
           s->n_rows <= KVG_CU_GRAPH_MAX_ROWS;
}

/* The graph with this step's signature (the record's first sig_len bytes), or NULL. */
static kvg_cu_graph *graph_find_sig(kvg_cuda *c)
{
    for (int i = 0; i < c->n_graphs; i++) {
        kvg_cu_graph *g = &c->graph_cache[i];
        if (g->sig_len == c->sig_len && memcmp(g->rec, c->rec, c->sig_len) == 0)
            return g;
    }
    return NULL;
}

int kvg_cu_graph_begin(kvg_cuda *c, const kvg_step *s)
{
    int again = c->step_again;
    kvg_step_plan p = c->plan;
    cudaError_t e;

    c->step_mode = KVG_CU_EAGER;
    c->recording = 0;
    c->step_again = 0;
    c->rec_len = 0;
    c->rec_oom = 0;
    c->graph = NULL;
    c->graph_grow = 0;
    if (!c->graphs || again == KVG_CU_AGAIN_EAGER || !kvg_cu_graph_padded(c, s))
        return 0;
    /* The signature: what the launches' arguments are made of besides the operations'
     * own (the counts that only size buffers left out: the buffer's addresses are in). */
    c->recording = 1;
    p.n_table = 0;
    p.n_items_used = 0;
    p.n_partials = 0;
    kvg_cu_note(c, &p, sizeof p);
    kvg_cu_note(c, &c->n_groups, sizeof c->n_groups);
    for (int i = 0; i < c->n_groups; i++) {
        kvg_attn_group g = c->groups[i];
        g.n_parts = 0;
        kvg_cu_note(c, &g, sizeof g);
    }
    kvg_cu_note(c, &c->d_plan, sizeof c->d_plan);
    kvg_cu_note(c, &c->d_partials, sizeof c->d_partials);
    kvg_cu_note(c, &c->alloc_gen, sizeof c->alloc_gen);
    {
        kvg_cu_sdpa_signature sg;
        kvg_cu_sdpa_sig(c, &sg);
        kvg_cu_note(c, &sg, sizeof sg);
    }
    c->sig_len = c->rec_len;
    if (again != KVG_CU_AGAIN_CAPTURE && (c->graph = graph_find_sig(c)) != NULL) {
        c->step_mode = KVG_CU_REPLAY;
        return 0;
    }
    e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        c->step_mode = KVG_CU_CAPTURE;
    } else {
        (void)cudaGetLastError();
        c->recording = 0;
        if (++c->graph_failures >= KVG_CU_GRAPH_MAX_FAILURES) {
            char what[200];
            kvg_cu_err_text(e, what, sizeof what);
            c->graphs = 0;
            kvg_log("cuda: CUDA graphs off: cudaStreamBeginCapture failed: %s", what);
        }
    }
    return 0;
}

/* The slot a new graph goes in: the one with its signature (replaced), a free one, or the
 * least recently used. */
static kvg_cu_graph *graph_slot(kvg_cuda *c)
{
    kvg_cu_graph *g = graph_find_sig(c);
    if (g)
        return g;
    if (c->n_graphs < KVG_CU_GRAPHS_KEPT)
        return &c->graph_cache[c->n_graphs++];
    g = &c->graph_cache[0];
    for (int i = 1; i < c->n_graphs; i++)
        if (c->graph_cache[i].used < g->used)
            g = &c->graph_cache[i];
    return g;
}

/* A capture or a replay could not be used: the step's operations are to be called again.
 * Nothing of the step ran; its recorded failure (if any) is forgotten, unless the device
 * is lost. */
static int again(kvg_cuda *c, int how, const char *why)
{
    c->step_mode = KVG_CU_EAGER;
    c->recording = 0;
    c->graph = NULL;
    if (c->dead)
        return -1;
    if (how == KVG_CU_AGAIN_EAGER && !c->graph_grow) {
        c->gstats.failed++;
        if (++c->graph_failures >= KVG_CU_GRAPH_MAX_FAILURES) {
            c->graphs = 0;
            kvg_log("cuda: CUDA graphs off after %d failed captures, the last: %s",
                    c->graph_failures, why);
        }
    }
    c->failed = 0;
    c->err[0] = 0;
    c->graph_grow = 0;
    c->step_again = how;
    return KVG_STEP_AGAIN;
}

int kvg_cu_graph_end(kvg_cuda *c)
{
    kvg_cu_graph *g = c->graph;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e;

    if (c->step_mode == KVG_CU_REPLAY) {
        if (c->failed || c->rec_oom || g->rec_len != c->rec_len || memcmp(g->rec, c->rec, c->rec_len) != 0) {
            /* Not the graph's operations: captured anew (replacing it). Refused again
             * right after means an argument outside the signature changes from step to
             * step: graphs would only cost, so they stop. */
            c->gstats.again++;
            if (++c->graph_mismatches >= 2 && c->graphs) {
                c->graphs = 0;
                kvg_log("cuda: CUDA graphs off: a decode step's operations keep differing from "
                        "the graph captured for them (step %lld)", (long long)c->step);
            }
            return again(c, c->graphs ? KVG_CU_AGAIN_CAPTURE : KVG_CU_AGAIN_EAGER, "operations differ");
        }
        exec = g->exec;
        c->graph_mismatches = 0;
    } else {
        e = cudaStreamEndCapture(c->stream, &graph);
        if (e != cudaSuccess || c->failed || c->rec_oom) {
            char why[sizeof c->err];
            if (c->failed)
                snprintf(why, sizeof why, "%s", c->err);
            else if (e != cudaSuccess)
                kvg_cu_err_text(e, why, sizeof why);
            else
                snprintf(why, sizeof why, "out of memory for the record");
            if (graph)
                cudaGraphDestroy(graph);
            (void)cudaGetLastError();
            if (c->graph_grow)
                c->gstats.grown++;
            return again(c, KVG_CU_AGAIN_EAGER, why);
        }
        e = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        if (e != cudaSuccess) {
            char why[200];
            kvg_cu_err_text(e, why, sizeof why);
            (void)cudaGetLastError();
            return again(c, KVG_CU_AGAIN_EAGER, why);
        }
        g = graph_slot(c);
        graph_drop(g);
        g->rec = malloc(c->rec_len ? c->rec_len : 1);
        if (!g->rec) {
            cudaGraphExecDestroy(exec);
            return again(c, KVG_CU_AGAIN_EAGER, "out of memory");
        }
        memcpy(g->rec, c->rec, c->rec_len);
        g->rec_len = c->rec_len;
        g->sig_len = c->sig_len;
        g->exec = exec;
        c->gstats.captured++;
    }
    g->used = c->step;
    c->step_mode = KVG_CU_EAGER;
    c->recording = 0;
    c->graph = NULL;
    e = cudaGraphLaunch(exec, c->stream);
    if (e != cudaSuccess)
        return kvg_cu_fail(c, "cudaGraphLaunch", e, "the step's graph");
    c->gstats.launched++;
    return 0;
}
