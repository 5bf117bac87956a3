/* The CPU backend's prepared weights: each matrix of the model that has a faster
 * layout for kvg_gemm (gemm.h's kvg_gemm_prepare: the quantized types repacked for the
 * int8 kernels; float matrices that the file put off a 64-byte boundary, copied onto
 * one) is prepared once, when the backend starts, and the matmuls look it up by the
 * address of the model's tensor (the forward pass passes the model's own kvg_tensor
 * structs). Other matrices are used where they are. The products are the same bits
 * either way; only their speed differs. A MoE layer's experts are matrices of their own
 * here (the model's row slices of the stacked tensors), each prepared on its own: an
 * expert's int8 layout is then as a dense matrix's, and a decode step streams only the
 * experts it runs. */
#include <stdint.h>
#include <stdlib.h>

#include "cpu_context.h"
#include "cpu/gemm_int8.h"
#include "errmsg.h"

struct kvg_cpu_weights {
    int float_w, int8_w;         /* some matrix takes float / int8 products */
    size_t cap;                  /* slots, a power of two (more than twice the count) */
    struct {
        const kvg_tensor *key;   /* the model's tensor; NULL: empty slot */
        kvg_tensor prepared;
        int alias;               /* prepared belongs to another slot (a tied embedding) */
    } *slot;
};

static size_t slot_of(const kvg_cpu_weights *pw, const kvg_tensor *key)
{
    uintptr_t h = (uintptr_t)key;
    h ^= h >> 17;
    h *= (uintptr_t)0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 7) & (pw->cap - 1);
}

static void put(kvg_cpu_weights *pw, const kvg_tensor *key, const kvg_tensor *prepared, int alias)
{
    size_t i;
    for (i = slot_of(pw, key); pw->slot[i].key; i = (i + 1) & (pw->cap - 1))
        ;
    pw->slot[i].key = key;
    pw->slot[i].prepared = *prepared;
    pw->slot[i].alias = alias;
}

/* Prepares w when it has a faster layout; 0, or -1 out of memory. The model's tensor
 * structs are distinct objects, so no key comes twice. */
static int add(kvg_cpu_weights *pw, const kvg_model *m, kvg_threadpool *tp, const kvg_tensor *w)
{
    kvg_tensor t;
    int rc;

    if (kvg_int8_dt(w->dtype))
        pw->int8_w = 1;
    else
        pw->float_w = 1;
    /* A float matrix is only ever copied out of the file's mapping, whose pages are then
     * handed back (below): anywhere else the copy would double the memory it takes. */
    if (!kvg_int8_dt(w->dtype) && !kvg_model_in_file(m, w))
        return 0;
    rc = kvg_gemm_prepare(tp, w, &t);
    if (rc <= 0)
        return rc;
    /* The file's copy of a prepared matrix is read again only to build another backend,
     * for the rows of a tied embedding, or by the llama2.c exporter: without this the
     * process would hold both copies (released one matrix at a time, so the process
     * never holds two copies of the whole model either). */
    kvg_model_release_pages(m, w);
    put(pw, w, &t, 0);
    return 0;
}

/* A MoE layer's n experts of one matrix (row slices of one stacked tensor), each
 * prepared on its own. Each add() hands back the whole pages inside its slice; the page
 * two neighbouring slices share (one per boundary: ~75 MB over Qwen3-30B-A3B's 18k
 * slices) goes back here, with the whole stack, once every expert has its own copy. */
static int add_stack(kvg_cpu_weights *pw, const kvg_model *m, kvg_threadpool *tp, const kvg_tensor *x, size_t n)
{
    kvg_tensor all = x[0];
    int all_copied = 1;
    for (size_t e = 0; e < n; e++) {
        if (add(pw, m, tp, &x[e]) != 0)
            return -1;
        all_copied &= kvg_cpu_weights_get(pw, &x[e]) != &x[e];
    }
    all.rows = x[0].rows * (int64_t)n;
    if (all_copied)
        kvg_model_release_pages(m, &all);
    return 0;
}

kvg_cpu_weights *kvg_cpu_weights_new(const kvg_model *m, kvg_threadpool *tp, char *err, size_t err_len)
{
    size_t E = m->cfg.n_experts > 0 ? (size_t)m->cfg.n_experts : 0;
    size_t n = (size_t)m->cfg.n_layers * (7 + 1 + 3 * E) + 2, cap = 16;
    kvg_cpu_weights *pw = calloc(1, sizeof *pw);
    int rc = 0;

    while (cap < 2 * n + 1)
        cap *= 2;
    if (pw)
        pw->slot = calloc(cap, sizeof *pw->slot);
    if (!pw || !pw->slot) {
        free(pw);
        kvg_set_err(err, err_len, "cpu backend: out of memory for the weight table");
        return NULL;
    }
    pw->cap = cap;
    for (int l = 0; l < m->cfg.n_layers && rc == 0; l++) {
        const kvg_layer_weights *lw = &m->layers[l];
        const kvg_tensor *mats[7] = { &lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_down, &lw->w_up };
        for (int i = 0; i < 7 && rc == 0; i++)
            if (mats[i]->data)          /* a MoE layer has no dense gate/down/up */
                rc = add(pw, m, tp, mats[i]);
        if (E && rc == 0)
            rc = add(pw, m, tp, &lw->moe_router);
        if (E && rc == 0)
            rc = add_stack(pw, m, tp, lw->moe_gate, E);
        if (E && rc == 0)
            rc = add_stack(pw, m, tp, lw->moe_up, E);
        if (E && rc == 0)
            rc = add_stack(pw, m, tp, lw->moe_down, E);
    }
    if (rc == 0)
        rc = add(pw, m, tp, &m->output);
    if (rc != 0) {
        kvg_cpu_weights_free(pw);
        kvg_set_err(err, err_len, "cpu backend: out of memory preparing the weights");
        return NULL;
    }
    /* A tied embedding whose classifier was only moved (the same layout) reads its rows
     * from that copy: the file's pages of it were handed back, and each lookup would
     * fault some of them in again. A repacked classifier has another layout: the rows
     * then come from the file. */
    {
        const kvg_tensor *out = kvg_cpu_weights_get(pw, &m->output);
        if (out != &m->output && m->tok_embedding.data == m->output.data && out->dtype == m->tok_embedding.dtype)
            put(pw, &m->tok_embedding, out, 1);
    }
    return pw;
}

const kvg_tensor *kvg_cpu_weights_get(const kvg_cpu_weights *pw, const kvg_tensor *w)
{
    if (!pw)
        return w;
    for (size_t i = slot_of(pw, w); pw->slot[i].key; i = (i + 1) & (pw->cap - 1))
        if (pw->slot[i].key == w)
            return &pw->slot[i].prepared;
    return w;
}

void kvg_cpu_weights_kinds(const kvg_cpu_weights *pw, int *float_w, int *int8_w)
{
    *float_w = pw->float_w;
    *int8_w = pw->int8_w;
}

void kvg_cpu_weights_free(kvg_cpu_weights *pw)
{
    if (!pw)
        return;
    for (size_t i = 0; i < pw->cap; i++)
        if (pw->slot[i].key && !pw->slot[i].alias)
            kvg_gemm_prepared_free(&pw->slot[i].prepared);
    free(pw->slot);
    free(pw);
}
