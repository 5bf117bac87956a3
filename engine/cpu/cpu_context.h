/* Internal to the CPU backend: its state (kvg_cpu) and the helpers its files share
 * (backend_cpu.c the operations, attention_cpu.c, moe_cpu.c, cpu_weights.c): the
 * prepared weights, the attention entry point, kvg_cpu_par and the float kernels' table.
 * Below the operations' files, which all point down to it. */
#ifndef KVG_CPU_CONTEXT_H
#define KVG_CPU_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cpu/gemm.h"
#include "cpu/threadpool.h"

/* The model's matrices in the layouts kvg_gemm runs fastest (cpu_weights.c). */
typedef struct kvg_cpu_weights kvg_cpu_weights;
kvg_cpu_weights *kvg_cpu_weights_new(const kvg_model *m, kvg_threadpool *tp, char *err, size_t err_len);
/* The prepared copy of the model's tensor w, or w itself when it has none (a tied
 * embedding's is its classifier's copy when that kept the layout). */
const kvg_tensor *kvg_cpu_weights_get(const kvg_cpu_weights *pw, const kvg_tensor *w);
/* Whether some matrix takes float products (F32, F16, BF16) and whether some takes
 * int8 ones (the quantized types): the GEMM workspace holds buffers for those only. */
void kvg_cpu_weights_kinds(const kvg_cpu_weights *pw, int *float_w, int *int8_w);
void kvg_cpu_weights_free(kvg_cpu_weights *pw);

typedef struct kvg_cpu {
    kvg_threadpool *tp;
    kvg_cpu_weights *weights;    /* prepared copies of the model's matrices */
    kvg_gemm_ws *gemm_ws;        /* the GEMMs' scratch: per thread from creation, packed
                                    X grown by begin_step to the step's rows */
    struct kvg_cpu_moe *moe;     /* the MoE layers' scratch (moe_cpu.c), grown by
                                    begin_step; NULL for a dense model */
    const kvg_model *m;
    int n_threads;
    int n_rope_kinds;            /* 1, or 2 with the window layers' own RoPE (rope.h) */
    float *inv_freq;             /* [n_rope_kinds][head_dim/2] RoPE frequency of each pair */

    /* The current step (copied by begin_step). */
    int n_rows, n_seqs, n_out;
    int32_t *tokens, *pos, *row_seq, *out_rows;   /* one allocation, cap_rows each */
    int32_t *seq_blocks_off;     /* [n_seqs + 1] offsets into blocks */
    int32_t *blocks;             /* every sequence's block table, concatenated */
    float *rope_cs;              /* [n_rope_kinds][cap_rows][head_dim/2][2] cos, sin */
    float *att_scratch;          /* n_threads * KVG_ATTN_ROWS slices of att_stride floats */
    size_t att_stride, att_cap;
    int cap_rows, cap_seqs, cap_blocks;
} kvg_cpu;

void kvg_cpu_attention(kvg_cpu *c, kvg_kv_pool *kv, int layer, const float *q, float *out);

/* Below this many scalar operations a job runs on the calling thread: waking the
 * workers costs a few microseconds, as much as ~20k simple operations. */
#define KVG_CPU_PAR_MIN_WORK 32768.0

/* Runs fn over [0, n) on the pool, or inline when the job is smaller than a thread
 * wake-up is worth (`work`: ~ scalar operations in all); the same results either way
 * (every index writes only its own outputs). */
static inline void kvg_cpu_par(kvg_cpu *c, size_t n, double work, kvg_range_fn fn, void *arg)
{
    if (n == 0)
        return;
    if (c->n_threads <= 1 || work < KVG_CPU_PAR_MIN_WORK || n == 1)
        fn(arg, 0, n);
    else
        kvg_threadpool_run(c->tp, n, fn, arg);
}

/* The attention and SwiGLU kernels of the GEMM's ISA level (attention_kernels.h),
 * chosen once per process. */
struct kvg_attn_kernels;
const struct kvg_attn_kernels *kvg_cpu_kernels(void);

#endif
