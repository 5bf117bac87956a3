/* The forward pass over a batch of sequences against the paged KV cache.
 *
 * One step takes any mix of sequences, each contributing a chunk of prompt tokens
 * (prefill, any length >= 1) or one token (decode). Every row of the step goes through
 * each weight matrix in one GEMM; attention for a row covers its sequence's cached
 * positions plus the rows of its own chunk up to itself (causal). Logits are computed
 * only for the last token of the sequences that ask for them.
 *
 * Results are batch-invariant: a sequence's logits are bit-identical however its
 * prompt was chunked and whatever else shared its steps (see backend.h). */
#ifndef KVG_FORWARD_H
#define KVG_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "kv_cache.h"
#include "model.h"

typedef struct kvg_forward kvg_forward;

typedef struct kvg_fwd_seq {
    kvg_kv_seq *kv;              /* kv->n_tokens positions are cached already */
    const int32_t *tokens;       /* this step's tokens for the sequence */
    int n_tokens;                /* >= 1 */
    float *logits;               /* non-NULL: gets the vocab_size logits after the
                                    chunk's last token */
} kvg_fwd_seq;

/* The KV geometry the model needs (block_tokens 0: the default). */
void kvg_forward_kv_geom(const kvg_model *m, int block_tokens, kvg_kv_geom *g);

/* A forward pass of `m` on `be` using the pool `kv` (whose geometry must match the
 * model). Borrows all three. NULL with err. */
kvg_forward *kvg_forward_new(const kvg_model *m, kvg_backend *be, kvg_kv_pool *kv,
                             char *err, size_t err_len);
void kvg_forward_free(kvg_forward *f);

/* Has every later step call fn(arg) before each of the model's layers (fn NULL: none).
 * A step can take long (a large prefill chunk on the CPU); the engine's loop uses this
 * to advance its heartbeat within a step, so whoever watches it sees it move at least
 * once a layer. fn must be cheap and must not call into the forward pass. */
void kvg_forward_set_progress(kvg_forward *f, void (*fn)(void *arg), void *arg);

/* Runs one step over seqs[0..n). Each sequence appears at most once. Every token id
 * must be in [0, vocab_size): a precondition (asserted), the callers' intake checks
 * prompts. On success the tokens' K/V are in the cache, each kv->n_tokens has advanced
 * by its n_tokens and the requested logits are filled; returns 0. On error (context
 * full, pool exhausted, out of memory, a malformed batch) nothing has advanced and -1
 * is returned with err. */
int kvg_forward_step(kvg_forward *f, kvg_fwd_seq *seqs, int n, char *err, size_t err_len);

#endif
