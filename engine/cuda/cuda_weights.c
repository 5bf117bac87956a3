/* The model's weights on the device: uploaded once at creation into ONE arena. Matrices
 * as BF16 (F16 stays F16; F32 is rounded to nearest even on the host), norm weights (the
 * layers' q/k norms and post-norms included) and biases as F32. Conversion runs in chunks
 * through two pinned staging halves, so the host converts one while the other is in
 * flight. Lookup by host address.
 *
 * A fused matrix (Phi-3's attn_qkv, its gate-up ffn_up) reaches the backend as row
 * slices of one tensor: wq, wk, wv (w_gate, w_up) with data pointers at row boundaries
 * inside one buffer, adjacent host ranges. Each slice is an entry of its own, found by
 * its own address, with its own copy in the arena (aligned like any other), so a GEMM
 * reads exactly that slice's rows. Entries are merged only when they are the same
 * tensor (same address, size and type: tied embeddings); two different tensors at one
 * address are refused (the lookup could not tell them apart). Overlapping ranges are
 * harmless: each entry converts its own range.
 *
 * A mixture-of-experts layer's experts are such slices too: expert e's gate, up and down
 * matrices are rows [e * rows, (e + 1) * rows) of the file's stacked tensors
 * (model_common.c kvgm_stack), each an entry of its own. The whole stack is never an
 * entry, so it is uploaded once, as its experts (no second copy beside them), and since
 * the entries are laid out in host-address order the experts of a stack lie in expert
 * order, back to back whenever a slice is a multiple of 256 bytes (every real model's).
 * Quantized experts are dequantized as any quantized matrix. The router stays F32 when
 * the file has it so (add_mat_f32): the CPU backend's routing precision.
 *
 * Products of one input (a layer's wq, wk, wv; w_gate, w_up) are laid out back to back,
 * in that order, wherever their host copies are, so that together they are one [sum of
 * rows][K] matrix: cuda_gemm.c runs them as one GEMM (kvg_cu_fused). Each part is still
 * an entry of its own, at its place inside the matrix. They are fused when they share K
 * and the device type and every part but the last is a multiple of 256 bytes (then each
 * part starts 256-byte aligned, as if uploaded alone: true of every real model, whose K is
 * a multiple of 128); their biases (qwen2's, gpt-oss's q/k/v) all or none, copied once more
 * into one [sum of rows] vector for cuBLASLt's bias epilogue. Otherwise the parts are
 * uploaded as before and run one by one. Not fused: the experts of a MoE layer (their own
 * layout above) and its F32 router. */
#include "cuda_internal.h"
#include "errmsg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STAGE_BYTES ((size_t)16 << 20)     /* each of the two halves */
#define ALIGN 256
#define PROGRESS_MIN ((size_t)256 << 20)    /* smaller models load silently */

typedef struct src_weight {
    const void *host;
    kvg_dtype src;
    size_t n;                    /* elements */
    int64_t cols;                /* row length (quantized matrices convert by rows) */
    int vector;                  /* F32 on the device */
    size_t off, bytes;           /* in the arena */
    int layer;                   /* -1: not a layer's */
    const char *name;
} src_weight;

static int cmp_host(const void *a, const void *b)
{
    const char *x = ((const src_weight *)a)->host, *y = ((const src_weight *)b)->host;
    return x < y ? -1 : x > y;
}

static void add_mat(src_weight *w, int *n, const kvg_tensor *t, int layer, const char *name)
{
    if (!t->data)
        return;                  /* a MoE model's dense FFN matrices: none */
    w[*n].layer = layer;
    w[*n].name = name;
    w[*n].host = t->data;
    w[*n].src = t->dtype;
    w[*n].n = (size_t)t->rows * (size_t)t->cols;
    w[*n].cols = t->cols;
    w[*n].vector = 0;
    (*n)++;
}

/* A matrix kept in F32 on the device when the file has it in F32 (a MoE router: its
 * logits choose the experts, so it keeps the precision the CPU backend gives it; stored
 * and converted as a vector is, 4 bytes an element); other types as any matrix. */
static void add_mat_f32(src_weight *w, int *n, const kvg_tensor *t, int layer, const char *name)
{
    add_mat(w, n, t, layer, name);
    if (t->dtype == KVG_DT_F32)
        w[*n - 1].vector = 1;
}

static void add_vec(src_weight *w, int *n, const float *v, size_t count, int layer, const char *name)
{
    if (!v)
        return;
    w[*n].layer = layer;
    w[*n].name = name;
    w[*n].host = v;
    w[*n].src = KVG_DT_F32;
    w[*n].n = count;
    w[*n].vector = 1;
    (*n)++;
}

static kvg_kt dev_type(const src_weight *w)
{
    return w->vector ? KVG_KT_F32 : w->src == KVG_DT_F16 ? KVG_KT_F16 : KVG_KT_BF16;
}

/* The index of the entry at `host` in the sorted, unique w[0..n), or -1. */
static int find(const src_weight *w, int n, const void *host)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if ((const char *)w[mid].host == (const char *)host)
            return mid;
        if ((const char *)w[mid].host < (const char *)host)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* Where a fused group's parts and biases are in w[] and where its bias vector goes. */
typedef struct fuse_plan {
    int part[KVG_CU_FUSE_MAX], bias[KVG_CU_FUSE_MAX];
    int placed;
    size_t bias_off;
} fuse_plan;

/* Fuses np products of one input (t[i], biases b[i] or b NULL) into f when they can be
 * one matrix (the rules at the top), marking their entries in grp[] with g; else leaves
 * f->n = 0. w[] is sorted, unique, with bytes set. */
static void plan_fused(const src_weight *w, int n, int *grp, int g, int np, const kvg_tensor *const *t,
                       const float *const *b, int layer, const char *name, kvg_cu_fused *f, fuse_plan *pl)
{
    int n_bias = 0;
    memset(f, 0, sizeof *f);
    for (int i = 0; i < np; i++) {
        int k = t[i]->data ? find(w, n, t[i]->data) : -1;
        if (k < 0 || grp[k] >= 0 || w[k].vector || t[i]->cols != t[0]->cols ||
            w[k].n != (size_t)t[i]->rows * (size_t)t[i]->cols || (i > 0 && dev_type(&w[k]) != dev_type(&w[pl->part[0]])) ||
            (i < np - 1 && w[k].bytes % ALIGN != 0))
            return;
        for (int j = 0; j < i; j++)
            if (pl->part[j] == k)
                return;          /* one tensor twice: not two parts */
        pl->part[i] = k;
        pl->bias[i] = -1;
        if (b && b[i]) {
            pl->bias[i] = find(w, n, b[i]);
            if (pl->bias[i] < 0 || !w[pl->bias[i]].vector || w[pl->bias[i]].n != (size_t)t[i]->rows)
                return;
            n_bias++;
        }
    }
    if (n_bias != 0 && n_bias != np)
        return;                  /* a partial bias: the parts one by one, each with its own */
    for (int i = 0; i < np; i++) {
        grp[pl->part[i]] = g;
        f->host[i] = t[i]->data;
        f->bias_host[i] = n_bias ? b[i] : NULL;
        f->rows[i] = (int)t[i]->rows;
        f->N += (int)t[i]->rows;
    }
    f->n = np;
    f->K = (int)t[0]->cols;
    f->dt = dev_type(&w[pl->part[0]]);
    f->layer = layer;
    f->name = name;
}

static uint16_t bf16_rne(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);       /* NaN stays a (quiet) NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Elements [e0, e0 + n) of a quantized matrix (GGUF Q8_0, Q4_0, Q4_K, Q6_K) as BF16:
 * the GPU has no quantized kernels yet, so it gets the dequantized values (exactly
 * the CPU's, see src/quant.h) rounded to BF16. 0, or -1 out of memory. */
static int convert_quant(const src_weight *w, size_t e0, size_t n, uint16_t *o)
{
    size_t cols = (size_t)w->cols;
    kvg_tensor t = { w->host, w->src, (int64_t)(w->n / cols), w->cols };
    float *row = malloc(cols * sizeof *row);
    if (!row)
        return -1;
    for (size_t i = 0; i < n;) {
        size_t e = e0 + i, c = e % cols, take = cols - c < n - i ? cols - c : n - i;
        kvg_tensor_row_f32(&t, (int64_t)(e / cols), row);
        for (size_t j = 0; j < take; j++)
            o[i + j] = bf16_rne(row[c + j]);
        i += take;
    }
    free(row);
    return 0;
}

/* Converts elements [e0, e0 + n) of w into dst (device format). */
static int convert(const src_weight *w, size_t e0, size_t n, void *dst)
{
    if (kvg_dtype_is_quant(w->src))
        return convert_quant(w, e0, n, dst);
    size_t es = kvg_dtype_size(w->src);
    const unsigned char *s = (const unsigned char *)w->host + e0 * es;
    if (w->vector || w->src != KVG_DT_F32) {
        memcpy(dst, s, n * es);                    /* F32 vectors, F16 and BF16 matrices */
    } else {
        const float *f = (const float *)(const void *)s;
        uint16_t *o = dst;
        for (size_t i = 0; i < n; i++)
            o[i] = bf16_rne(f[i]);
    }
    return 0;
}

static void progress(size_t done, size_t total, int final)
{
    static int tty = -1;
    if (total < PROGRESS_MIN)
        return;
    if (tty < 0)
        tty = isatty(2);
    if (tty || final)
        fprintf(stderr, "%scuda: uploading weights %.1f/%.1f GB%s", tty ? "\r" : "",
                (double)done / 1e9, (double)total / 1e9, final ? "\n" : "");
}

int kvg_cu_weights_upload(kvg_cuda *c, char *err, size_t err_len)
{
    const kvg_model *m = c->m;
    const kvg_model_config *cfg = &m->cfg;
    size_t qd = (size_t)cfg->n_heads * cfg->head_dim, kvd = (size_t)cfg->n_kv_heads * cfg->head_dim;
    int cap = cfg->n_layers * (16 + 3 + 6 * (cfg->n_experts > 0 ? cfg->n_experts : 0) + 1) + 4, n = 0, u = 0;
    src_weight *w = calloc((size_t)cap, sizeof *w);
    int *grp = NULL, n_groups = 2 * cfg->n_layers;
    fuse_plan *plan = NULL;
    size_t total = 0, done = 0;
    unsigned char *stage = NULL;
    cudaEvent_t ev[2] = { NULL, NULL };
    cudaError_t e;
    int rc = -1, half = 0;

    if (!w) {
        kvg_set_err(err, err_len, "cuda: out of memory");
        return -1;
    }
    add_mat(w, &n, &m->tok_embedding, -1, "tok_embedding");
    add_mat(w, &n, &m->output, -1, "output");
    add_vec(w, &n, m->final_norm, (size_t)cfg->dim, -1, "final_norm");
    for (int l = 0; l < cfg->n_layers; l++) {
        const kvg_layer_weights *L = &m->layers[l];
        add_mat(w, &n, &L->wq, l, "wq");
        add_mat(w, &n, &L->wk, l, "wk");
        add_mat(w, &n, &L->wv, l, "wv");
        add_mat(w, &n, &L->wo, l, "wo");
        add_mat(w, &n, &L->w_gate, l, "w_gate");
        add_mat(w, &n, &L->w_up, l, "w_up");
        add_mat(w, &n, &L->w_down, l, "w_down");
        add_vec(w, &n, L->attn_norm, (size_t)cfg->dim, l, "attn_norm");
        add_vec(w, &n, L->ffn_norm, (size_t)cfg->dim, l, "ffn_norm");
        add_vec(w, &n, L->bq, qd, l, "bq");
        add_vec(w, &n, L->bk, kvd, l, "bk");
        add_vec(w, &n, L->bv, kvd, l, "bv");
        add_vec(w, &n, L->q_norm, (size_t)cfg->head_dim, l, "q_norm");
        add_vec(w, &n, L->k_norm, (size_t)cfg->head_dim, l, "k_norm");
        add_vec(w, &n, L->post_attn_norm, (size_t)cfg->dim, l, "post_attn_norm");
        add_vec(w, &n, L->post_ffn_norm, (size_t)cfg->dim, l, "post_ffn_norm");
        add_vec(w, &n, L->bo, (size_t)cfg->dim, l, "bo");
        add_vec(w, &n, L->attn_sinks, (size_t)cfg->n_heads, l, "attn_sinks");
        if (cfg->n_experts > 0) {
            size_t EH = (size_t)cfg->expert_hidden_dim, D = (size_t)cfg->dim;
            add_mat_f32(w, &n, &L->moe_router, l, "moe_router");
            add_vec(w, &n, L->moe_router_bias, (size_t)cfg->n_experts, l, "moe_router_bias");
            for (int x = 0; x < cfg->n_experts; x++) {
                add_mat(w, &n, &L->moe_gate[x], l, "moe_gate");
                add_mat(w, &n, &L->moe_up[x], l, "moe_up");
                add_mat(w, &n, &L->moe_down[x], l, "moe_down");
                /* gpt-oss: each expert's biases, its slice of the layer's [E][N] vectors,
                   an entry of its own (found by the slice's address), as its matrices */
                if (L->moe_gate_bias && L->moe_up_bias && L->moe_down_bias) {
                    add_vec(w, &n, L->moe_gate_bias + (size_t)x * EH, EH, l, "moe_gate_bias");
                    add_vec(w, &n, L->moe_up_bias + (size_t)x * EH, EH, l, "moe_up_bias");
                    add_vec(w, &n, L->moe_down_bias + (size_t)x * D, D, l, "moe_down_bias");
                }
            }
        }
    }
    /* One entry per address: tied embeddings upload once. */
    qsort(w, (size_t)n, sizeof *w, cmp_host);
    for (int i = 0; i < n; i++) {
        if (u > 0 && w[i].host == w[u - 1].host) {
            if (w[i].n == w[u - 1].n && w[i].src == w[u - 1].src && w[i].vector == w[u - 1].vector)
                continue;
            /* The lookup is by address: two different tensors there cannot both be found. */
            kvg_set_err(err, err_len, "cuda: weights %s (layer %d) and %s (layer %d) start at the same host "
                        "address with different shapes", w[u - 1].name, w[u - 1].layer, w[i].name, w[i].layer);
            goto out;
        }
        w[u++] = w[i];
    }
    n = u;
    for (int i = 0; i < n; i++)
        w[i].bytes = w[i].n * (w[i].vector ? 4 : 2);
    /* q/k/v and gate/up as one matrix each where they can be (the top of the file). */
    grp = malloc((size_t)(n ? n : 1) * sizeof *grp);
    plan = calloc((size_t)n_groups, sizeof *plan);
    c->fused = calloc((size_t)n_groups, sizeof *c->fused);
    if (!grp || !plan || !c->fused) {
        kvg_set_err(err, err_len, "cuda: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++)
        grp[i] = -1;
    for (int l = 0; l < cfg->n_layers; l++) {
        const kvg_layer_weights *L = &m->layers[l];
        const kvg_tensor *qkv[3] = { &L->wq, &L->wk, &L->wv }, *gu[2] = { &L->w_gate, &L->w_up };
        const float *qkv_b[3] = { L->bq, L->bk, L->bv };
        plan_fused(w, n, grp, 2 * l, 3, qkv, qkv_b, l, "wqkv", &c->fused[2 * l], &plan[2 * l]);
        plan_fused(w, n, grp, 2 * l + 1, 2, gu, NULL, l, "w_gate_up", &c->fused[2 * l + 1], &plan[2 * l + 1]);
    }
    /* Host order, except that a group's parts go together, in their order, where the
     * first of them in host order is: a part but the last fills whole 256-byte units, so
     * the parts are contiguous. */
    for (int i = 0; i < n; i++) {
        int g = grp[i];
        if (g >= 0 && plan[g].placed)
            continue;
        for (int p = 0; p < (g >= 0 ? c->fused[g].n : 1); p++) {
            int k = g >= 0 ? plan[g].part[p] : i;
            w[k].off = total;
            total += (w[k].bytes + ALIGN - 1) / ALIGN * ALIGN;
        }
        if (g >= 0)
            plan[g].placed = 1;
    }
    for (int g = 0; g < n_groups; g++) {
        if (c->fused[g].n > 0 && plan[g].bias[0] >= 0) {
            plan[g].bias_off = total;
            total += ((size_t)c->fused[g].N * 4 + ALIGN - 1) / ALIGN * ALIGN;
        }
    }
    e = cudaMalloc(&c->arena, total ? total : 1);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        char what[200];
        kvg_cu_err_text(e, what, sizeof what);
        (void)cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        c->arena = NULL;
        kvg_set_err(err, err_len, "cuda: out of device memory for the weights: cudaMalloc of %zu bytes "
                    "(%.2f GB) failed: %s; the device has %zu bytes (%.2f GB) free of %zu (%.2f GB)",
                    total, (double)total / 1e9, what, fr, (double)fr / 1e9, tot, (double)tot / 1e9);
        goto out;
    }
    c->arena_bytes = total;
    c->weights = calloc((size_t)n, sizeof *c->weights);
    if (!c->weights) {
        kvg_set_err(err, err_len, "cuda: out of memory");
        goto out;
    }
    e = cudaMallocHost((void **)&stage, 2 * STAGE_BYTES);
    if (e == cudaSuccess)
        e = cudaEventCreate(&ev[0]);
    if (e == cudaSuccess)
        e = cudaEventCreate(&ev[1]);
    if (e != cudaSuccess) {
        char what[200];
        kvg_cu_err_text(e, what, sizeof what);
        kvg_set_err(err, err_len, "cuda: pinned staging buffer for the weights (%zu bytes): %s",
                    2 * STAGE_BYTES, what);
        goto out;
    }
    progress(0, total, 0);
    for (int i = 0; i < n; i++) {
        size_t per = w[i].vector ? 4 : 2;         /* device bytes per element */
        size_t step = STAGE_BYTES / per;
        unsigned char *dev = (unsigned char *)c->arena + w[i].off;
        c->weights[i].host = w[i].host;
        c->weights[i].layer = w[i].layer;
        c->weights[i].name = w[i].name;
        c->weights[i].dev = dev;
        c->weights[i].dt = w[i].vector ? KVG_KT_F32 : w[i].src == KVG_DT_F16 ? KVG_KT_F16 : KVG_KT_BF16;
        for (size_t e0 = 0; e0 < w[i].n; e0 += step) {
            size_t cnt = w[i].n - e0 < step ? w[i].n - e0 : step;
            unsigned char *buf = stage + (size_t)half * STAGE_BYTES;
            /* The half's previous copy must have left before it is overwritten. */
            e = cudaEventSynchronize(ev[half]);
            if (e == cudaSuccess && convert(&w[i], e0, cnt, buf) < 0) {
                kvg_set_err(err, err_len, "cuda: out of memory converting %s", w[i].name);
                goto out;
            }
            if (e == cudaSuccess) {
                e = cudaMemcpyAsync(dev + e0 * per, buf, cnt * per, cudaMemcpyHostToDevice, c->stream);
            }
            if (e == cudaSuccess)
                e = cudaEventRecord(ev[half], c->stream);
            if (e != cudaSuccess) {
                char what[200];
                kvg_cu_err_text(e, what, sizeof what);
                kvg_set_err(err, err_len, "cuda: uploading the weights (%zu bytes at %zu): %s",
                            cnt * per, w[i].off + e0 * per, what);
                goto out;
            }
            half ^= 1;
            done += cnt * per;
            progress(done, total, 0);
        }
    }
    /* The fused matrices (their parts are in place) and their bias vectors, the parts'
     * biases copied device to device behind the upload. */
    for (int g = 0; g < n_groups; g++) {
        kvg_cu_fused *f = &c->fused[g];
        size_t at = 0;
        if (f->n == 0)
            continue;
        f->dev = (unsigned char *)c->arena + w[plan[g].part[0]].off;
        if (plan[g].bias[0] < 0)
            continue;
        f->bias = (float *)(void *)((unsigned char *)c->arena + plan[g].bias_off);
        for (int p = 0; p < f->n; p++) {
            e = cudaMemcpyAsync(f->bias + at, (unsigned char *)c->arena + w[plan[g].bias[p]].off,
                                (size_t)f->rows[p] * 4, cudaMemcpyDeviceToDevice, c->stream);
            if (e != cudaSuccess) {
                char what[200];
                kvg_cu_err_text(e, what, sizeof what);
                kvg_set_err(err, err_len, "cuda: copying layer %d's %s biases: %s", f->layer, f->name, what);
                goto out;
            }
            at += (size_t)f->rows[p];
        }
    }
    e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        char what[200];
        kvg_cu_err_text(e, what, sizeof what);
        kvg_set_err(err, err_len, "cuda: uploading the weights: cudaStreamSynchronize: %s", what);
        goto out;
    }
    progress(total, total, 1);
    c->n_weights = n;
    rc = 0;
out:
    if (ev[0])
        cudaEventDestroy(ev[0]);
    if (ev[1])
        cudaEventDestroy(ev[1]);
    if (stage) {
        cudaStreamSynchronize(c->stream);
        cudaFreeHost(stage);
    }
    free(w);
    free(grp);
    free(plan);
    return rc;
}

void kvg_cu_weights_free(kvg_cuda *c)
{
    if (c->arena)
        cudaFree(c->arena);
    c->arena = NULL;
    free(c->weights);
    c->weights = NULL;
    c->n_weights = 0;
    free(c->fused);
    c->fused = NULL;
}

const kvg_cu_weight *kvg_cu_weight_of(kvg_cuda *c, const void *host)
{
    int lo = 0, hi = c->n_weights - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const char *h = c->weights[mid].host;
        if (h == (const char *)host)
            return &c->weights[mid];
        if (h < (const char *)host)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    kvg_cu_fail(c, "weight lookup", cudaErrorInvalidValue, "a weight that was not uploaded");
    return NULL;
}

const kvg_cu_fused *kvg_cu_fused_of(kvg_cuda *c, int n, const kvg_tensor *const *w, const float *const *bias)
{
    const kvg_cu_weight *dw;
    if (!c->fused || n < 2 || n > KVG_CU_FUSE_MAX)
        return NULL;
    dw = kvg_cu_weight_of(c, w[0]->data);
    if (!dw || dw->layer < 0 || dw->layer >= c->m->cfg.n_layers)
        return NULL;
    for (int k = 0; k < 2; k++) {
        const kvg_cu_fused *f = &c->fused[2 * dw->layer + k];
        int same = f->n == n;
        for (int i = 0; same && i < n; i++)
            same = f->host[i] == w[i]->data && f->bias_host[i] == (bias ? bias[i] : NULL);
        if (same)
            return f;
    }
    return NULL;
}
