/* (Named scheduler.h, not sched.h: -Iengine would shadow the system <sched.h>.) */
/* The engine's scheduler: continuous batching over the prefix cache.
 *
 * Every kvg_sched_step runs one forward step over a batch made of
 *   - one decode token per running sample (streams never stall), then
 *   - prefill chunks (prompts, and samples recomputing after preemption) up to
 *     max_batch_tokens in total (chunked prefill), a bypass_share of that budget
 *     reserved for bypass requests (bucket 0) so they do not wait behind long prompts.
 * Requests wait until the blocks they need after cache hits can be had
 * (kvg_pc_blocks_needed / kvg_pc_admit), in priority order then arrival. When the
 * pool runs out during decode, the most recently admitted running request is
 * preempted: its blocks are released and it is recomputed later (state PREEMPTED, not
 * a cache hit) with its tokens so far kept, so nobody fails. A request that could never
 * fit (longer than the context, or than the pool) is rejected at submit.
 *
 * A request whose prompt goes on in the disk tier is not admitted until the store's
 * reader thread has read those blocks (prefix_cache.h kvg_pc_fetch_start): admission
 * passes it over meanwhile, so the reads never hold up the running requests' steps. A
 * step with nothing else to do computes nothing (0 rows); the caller may sleep on the
 * reader's eventfd (kvg_pc_disk_fd, kvg_pc_disk_wait) until a read ends.
 *
 * Bypass requests (bucket 0) are neither looked up nor inserted in the prefix cache.
 * Others hit their prompt's blocks, and every block filled during prefill or decode is
 * committed under its chain hash (the request's hashes for prompt blocks, then
 * kvg_prefix_next over the block's ids), so a later request extending this text
 * (the next chat turn) hits them.
 *
 * n > 1: the prompt is prefilled once, then forked into n samples (kvg_pc_fork).
 * Sampling: sample j of a request draws with kvg_sample(..., sample_index =
 * sample_base + j, position = the position of the token being chosen). So sample j
 * of a request with n samples produces exactly the tokens of a request with n = 1,
 * the same seed and sample_base + j: outputs never depend on batching, caching,
 * forking or preemption.
 *
 * Samples in waves (self-consistency): with n_active < n only samples 0..n_active-1
 * start when the prompt is in; the request keeps the prompt's KV (its own fork of the
 * prompt's blocks) and the prompt's last logits while samples remain undrawn, and
 * kvg_sched_samples starts further ones off them (no recompute) or cancels single
 * samples. A sample drawn later produces exactly the tokens it would have produced
 * had it started at once (its sampler index and positions are the same). Draws are
 * not held back by max_running (the request was admitted for all n). A preempted
 * request gives back the kept prompt too and recomputes it on readmission.
 *
 * Events are delivered through one callback, from inside kvg_sched_step / submit /
 * cancel / samples (the callback must not call back into the scheduler except
 * kvg_sched_cancel and kvg_sched_samples, whose work then waits for the step's end).
 * Not thread-safe: one engine thread owns the scheduler, cache, pool and forward pass. */
#ifndef KVG_SCHEDULER_H
#define KVG_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "forward.h"
#include "model.h"
#include "prefix_cache.h"
#include "prefix_hash.h"
#include "proto.h"
#include "sampler.h"
#include "stop_match.h"

/* Completions per request and length buckets are the protocol's (proto.h): whatever
 * a SUBMIT may carry, the scheduler takes. */
#define KVG_SCHED_MAX_N        KVG_PROTO_MAX_N
#define KVG_SCHED_MAX_STOP_IDS 8
#define KVG_SCHED_MAX_HOLDS    KVG_PROTO_MAX_HOLDS
#define KVG_SCHED_BUCKETS      KVG_STATS_BUCKETS

typedef struct kvg_sched kvg_sched;

typedef struct kvg_sched_config {
    int32_t max_batch_tokens;    /* tokens per forward step; 0: 512 */
    int32_t max_running;         /* running samples; 0: 64 */
    double bypass_share;         /* prefill budget kept for bypass requests; 0: 0.25 */
    int64_t default_ttl_ms;      /* for committed blocks; 0: the cache's default */
    /* The clock the prefix cache's TTLs are measured on (monotonic ms); NULL:
     * CLOCK_MONOTONIC. Lets tests move time, e.g. to expire blocks. */
    int64_t (*now_ms)(void *ctx);
    void *now_ctx;
} kvg_sched_config;

typedef struct kvg_sched_req {
    uint64_t id;                 /* caller's id, echoed in events; unique among live requests */
    void *user;                  /* echoed in events */
    const int32_t *prompt;       /* copied at submit; ids in [0, vocab_size) */
    int32_t n_prompt;
    /* Chain hashes of the prompt's full blocks: exactly n_prompt / block_tokens of
     * them (NULL when there are none), as the engine's intake recomputed them or
     * warm-up computed them; the scheduler never hashes a prompt. And the chain's
     * root (model id, the tenant's salt), from which generated tokens extend the
     * chain when the prompt has no full block. Both ignored for bypass requests. */
    const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN];
    int32_t n_hashes;
    uint8_t root[KVG_PREFIX_HASH_LEN];
    int tenant;                  /* from kvg_pc_tenant, live (the caller holds a reference; a
                                  * queued request takes its own); ignored for bypass */
    unsigned bucket;             /* length bucket; 0 = bypass the prefix cache */
    kvg_sampler_params sp;
    int n;                       /* completions, 1..KVG_SCHED_MAX_N (0: 1) */
    int n_active;                /* started once the prompt is in, 0..n (0: all n); the rest
                                    wait for kvg_sched_samples */
    uint64_t sample_base;        /* sampler index of completion 0 */
    int32_t max_tokens;          /* per completion; clipped to the context */
    int32_t stop_ids[KVG_SCHED_MAX_STOP_IDS];   /* e.g. EOS: ends without being emitted */
    int n_stop_ids;
    const char *stop[KVG_STOP_MAX];             /* stop strings (NUL-terminated) */
    int n_stop;
    int64_t ttl_ms;              /* 0: config default; KVG_PC_TTL_PINNED: pinned */
    /* cache_control: the prompt's first hold_blocks[i] blocks held for hold_ms[i]
     * (prefix_cache.h kvg_pc_hold), each block for the longest hold covering it */
    int n_holds;
    int32_t hold_blocks[KVG_SCHED_MAX_HOLDS];
    int64_t hold_ms[KVG_SCHED_MAX_HOLDS];
    int priority;                /* higher is admitted first */
    int logprobs;                /* report each token's log-probability (TOKEN events'
                                    logprob; NaN without): a softmax over the whole
                                    vocabulary per token, so only when asked */
} kvg_sched_req;

typedef enum kvg_sched_event_kind {
    KVG_SEV_ACCEPTED = 0,        /* admitted: cached_tokens known */
    KVG_SEV_TOKEN = 1,           /* one generated token of one sample, with its text */
    KVG_SEV_FINISHED = 2,        /* one sample is done: reason, and its held-back text */
    KVG_SEV_DONE = 3             /* the request is done (all samples): usage */
} kvg_sched_event_kind;

typedef enum kvg_finish_reason {
    KVG_FINISH_STOP = 0,         /* a stop id (EOS) or stop string */
    KVG_FINISH_LENGTH = 1,       /* max_tokens */
    KVG_FINISH_CONTEXT = 2,      /* the context is full ("length" for OpenAI) */
    KVG_FINISH_CANCELLED = 3,
    KVG_FINISH_ERROR = 4
} kvg_finish_reason;

typedef struct kvg_sched_event {
    kvg_sched_event_kind kind;
    uint64_t id;
    void *user;
    int sample;                  /* TOKEN, FINISHED: 0..n-1 */
    int32_t token;               /* TOKEN */
    float logprob;               /* TOKEN: with kvg_sched_req.logprobs, else NaN */
    const char *text;            /* TOKEN, FINISHED: bytes now visible (may be 0 long) */
    size_t text_len;
    kvg_finish_reason reason;    /* FINISHED */
    int32_t cached_tokens;       /* ACCEPTED, DONE */
    int32_t prompt_tokens;       /* DONE */
    int32_t completion_tokens;   /* DONE: over all samples */
    int32_t cache_write_tokens;  /* DONE: prompt tokens it computed and held (holds) */
    const char *error;           /* FINISHED with KVG_FINISH_ERROR */
} kvg_sched_event;

typedef void (*kvg_sched_cb)(void *ctx, const kvg_sched_event *ev);

typedef struct kvg_sched_bucket_stats {
    uint64_t requests, prompt_tokens, cached_tokens, completion_tokens;
} kvg_sched_bucket_stats;

typedef struct kvg_sched_stats {
    kvg_sched_bucket_stats bucket[KVG_SCHED_BUCKETS];
    uint64_t steps, preemptions, rejected, cancelled;
    uint64_t prefill_tokens, decode_tokens;
    double prefill_s, decode_s;  /* step time split by each kind's share of rows */
    uint64_t ttft_count;
    double ttft_sum_s, ttft_max_s;
    int32_t waiting, running;    /* requests */
    int32_t held;                /* of those, held (kvg_sched_hold) */
    uint64_t samples_started;    /* samples that began decoding (counted once each) */
    uint64_t samples_cancelled;  /* drawn samples ended by kvg_sched_samples' cancel_mask */
    uint64_t samples_dropped;    /* undrawn samples ended by kvg_sched_samples' cancel_mask */
    uint64_t load_tokens;        /* forward-pass tokens of the work queued now (the
                                    statistics page's load_tokens; proto.h defines it) */
} kvg_sched_stats;

/* Borrows everything; fw must run over pc's pool. NULL with err. */
kvg_sched *kvg_sched_new(const kvg_model *m, kvg_forward *fw, kvg_prefix_cache *pc,
                         kvg_kv_pool *pool, const kvg_sched_config *cfg,
                         kvg_sched_cb cb, void *cb_ctx, char *err, size_t err_len);
/* Releases every live request's blocks (no events). */
void kvg_sched_free(kvg_sched *s);

/* Queues a request (everything is copied). 0, or -1 with err when it is invalid or
 * could never fit; nothing is queued then. What the engine's intake guarantees (prompt
 * ids in the vocabulary, the hash count) is a precondition here, asserted, not an
 * error: callers taking ids from outside check them first. */
int kvg_sched_submit(kvg_sched *s, const kvg_sched_req *r, char *err, size_t err_len);

/* Cancels a live request: its samples finish with KVG_FINISH_CANCELLED and its
 * blocks are released now (or at the end of the current step when called from a
 * callback). 0, or -1 when no live request has that id. */
int kvg_sched_cancel(kvg_sched *s, uint64_t id);

/* Pauses (held != 0) or resumes a live request. A held request is left out of every
 * batch and of admission; it keeps its blocks and its place. The engine daemon holds
 * the requests of a client that stops reading its stream, so that client slows only
 * itself and the engine's buffers stay bounded. 0, or -1 when no live request has
 * that id. */
int kvg_sched_hold(kvg_sched *s, uint64_t id, int held);

/* Per-sample control of a live request: first the samples of cancel_mask (bit j =
 * sample j; bits >= n and those of finished samples are ignored) finish with
 * KVG_FINISH_CANCELLED: a drawn one with the tokens it has, its own blocks released
 * (the prompt's shared blocks stay for the others), an undrawn one with none
 * (dropped). Then the next `draw` undrawn samples (lowest index first; clamped to
 * what remains) are drawn: at once, off the kept prompt, when the request is
 * decoding, else when its prompt is in. Called from a callback, the work is done at
 * the end of the current step (like kvg_sched_cancel). DONE comes once every sample
 * is finished or dropped. 0, or -1 when no live request has that id. */
int kvg_sched_samples(kvg_sched *s, uint64_t id, int draw, uint32_t cancel_mask);

/* A tenant's cache was wiped (kvg_pc_wipe_tenant_tiers): every live request of tenant
 * (queued, running or held) goes on unchanged but commits no block from now on, so
 * nothing of a request that was live at the wipe enters the cache afterwards. Call it
 * before the wipe. The requests marked. */
int kvg_sched_forget_tenant(kvg_sched *s, int tenant);

/* One scheduling step and forward pass. Returns the number of rows computed (0 when
 * idle), or -1 with err on an engine failure (the requests in the failed batch are
 * finished with KVG_FINISH_ERROR; the scheduler stays usable). */
int kvg_sched_step(kvg_sched *s, char *err, size_t err_len);

/* Requests not finished yet (waiting + running). */
int kvg_sched_pending(const kvg_sched *s);

void kvg_sched_get_stats(const kvg_sched *s, kvg_sched_stats *out);
/* Its load_tokens alone (O(live requests)). */
uint64_t kvg_sched_load(const kvg_sched *s);

#endif
