/* Continuous batching over the prefix cache; see scheduler.h. */
#include "scheduler.h"
#include "monoclock.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buckets.h"
#include "errmsg.h"
#include "tokenizer.h"

/* A request's life. Every request moves forward along
 *
 *   WAITING --admit--> PREFILLING --prompt in--> DECODING --last sample done--> FINISHED
 *                          ^                         |
 *                          +--admit-- PREEMPTED <----+ (preempt, from PREFILLING too)
 *
 * and may jump to FINISHED from any state (cancel, error). PREEMPTED is WAITING again
 * for a request that was admitted before: it is accepted already (no second ACCEPTED
 * event) and recomputes its prompt and tokens (never a cache lookup: its own blocks
 * were just released). A FINISHED request has sent DONE; it stays in s->live until
 * drop_finished frees it, so that the current step's batch may still point at it. */
typedef enum req_state {
    RQ_WAITING = 0,              /* never admitted: no blocks, no ACCEPTED yet */
    RQ_PREEMPTED,                /* admitted once, blocks given back: waits to recompute */
    RQ_PREFILLING,               /* admitted: the prompt goes into pr chunk by chunk */
    RQ_DECODING,                 /* the prompt is in: each live sample feeds its tokens */
    RQ_FINISHED                  /* every sample is done and DONE was sent */
} req_state;

typedef struct sample {
    int32_t *gen;                /* generated tokens (all emitted ones) */
    int32_t n_gen, cap;
    int32_t n_fed;               /* of gen, how many have K/V in seq */
    kvg_kv_seq seq;
    int done;
    uint8_t last_hash[KVG_PREFIX_HASH_LEN];
    int32_t n_hashed;            /* leading blocks of seq committed (or hits) */
    kvg_detok dt;
    kvg_stop_match sm;
    int drawn;                   /* started at the prompt (j < n_active) or by kvg_sched_samples */
    int started;                 /* got off the prompt once (samples_started counted) */
} sample;

typedef struct req {
    kvg_sched_req r;             /* r.prompt / r.hashes point at the copies below */
    int32_t *prompt;
    uint8_t (*hashes)[KVG_PREFIX_HASH_LEN];
    int32_t n_hashes;
    int n, n_live;               /* n_live: samples not done, the undrawn ones included */
    int n_undrawn;               /* samples neither drawn nor done */
    req_state state;
    /* Not states: each can be true in any live state. */
    int bypass;                  /* bucket 0 (fixed at submit): no cache lookup nor commit */
    int no_commit;               /* its tenant was wiped while it was live: commits nothing */
    int held;                    /* kvg_sched_hold: out of batches and admission, keeps its place */
    int cancel_pending;          /* kvg_sched_cancel during a step: finished at its end */
    int ttft_noted;              /* the first output's time is in the stats */
    int draw_pending;            /* kvg_sched_samples during a step: done at its end */
    uint32_t cancel_mask_pending;
    int32_t cached, max_gen;
    int32_t cache_written;       /* prompt tokens it computed and held (cache_control) */
    int32_t hint_cached;         /* prompt tokens whose blocks the cache held at submit: an
                                    estimate of `cached` for the load while queued */
    uint64_t arrival, admit_no;
    double t_submit;
    /* Its prompt's blocks being read from the disk tier before admission (prefix_cache.h
     * kvg_pc_fetch_start): while a read is in flight it is passed over by admission, the
     * others run; fetch_tried: started once per admission. */
    kvg_pc_fetch *fetch;
    int fetch_tried;
    /* The prompt's own sequence (only seq, n_hashed and last_hash are used): the prompt
     * is prefilled into it and every drawn sample forks it. It is released once the
     * prompt is in and no sample is left undrawn; until then it keeps the prompt's
     * blocks for later draws, and plogits the prompt's last logits, from which a
     * sample drawn later takes its first token exactly as it would have at once. */
    sample pr;
    float *plogits;              /* [vocab_size] when n_active < n, else NULL */
    sample smp[KVG_SCHED_MAX_N];
} req;

/* One row group of a step's batch: n consecutive tokens of one slot of a request. */
typedef struct item {
    req *q;
    int j;                       /* sample index, -1: the prompt (into pr) */
    int n;                       /* tokens (rows of the forward pass) */
    const int32_t *tokens;       /* [n], inside q->prompt or the sample's gen */
    int logits;                  /* row of s->logits, -1: none */
    int dead;                    /* its request was preempted in this step: not run */
} item;

/* A step's batch while it is built and run (the items themselves are in s->items). */
typedef struct step_batch {
    int64_t now;                 /* the cache's clock (TTLs) for the whole step */
    int n_items;                 /* s->items[0..n_items) */
    int n_decode;                /* s->items[0..n_decode) are the decode rows (n = 1) */
    int n_out;                   /* items with logits: rows of s->logits in use */
    int rows;                    /* tokens the forward pass computed */
} step_batch;

struct kvg_sched {
    const kvg_model *m;
    kvg_forward *fw;
    kvg_prefix_cache *pc;
    kvg_kv_pool *pool;
    kvg_sched_config cfg;
    kvg_sched_cb cb;
    void *cb_ctx;
    kvg_prefix_hasher *hasher;
    kvg_sampler smp;
    req **live;
    int n_live, cap_live;
    uint64_t arrivals, admits;
    int in_step;
    /* The batch scratch, grown as needed and kept between steps. */
    item *items;                 /* [cap_items]: the step's row groups, decode rows first */
    kvg_fwd_seq *fseq;           /* [cap_items]: the forward pass's view of the live items */
    int cap_items;
    float *logits;               /* [n_out, vocab_size] of cap_logits floats */
    size_t cap_logits;
    int32_t *ids;                /* [block_tokens]: one block's ids, to hash it */
    char *text;                  /* [cap_text]: event text scratch */
    size_t cap_text;
    kvg_sched_stats st;
};

static int64_t now_ms(const kvg_sched *s)
{
    if (s->cfg.now_ms)
        return s->cfg.now_ms(s->cfg.now_ctx);
    return kvg_mono_ms();
}

/* Not finished: counts as pending, its id is taken. */
static int is_live(const req *q)
{
    return q->state != RQ_FINISHED;
}

/* Waiting for admission, first time or after preemption. */
static int is_queued(const req *q)
{
    return q->state == RQ_WAITING || q->state == RQ_PREEMPTED;
}

/* Admitted and holding blocks: in batches unless held, a preemption candidate. */
static int is_running(const req *q)
{
    return q->state == RQ_PREFILLING || q->state == RQ_DECODING;
}

kvg_sched *kvg_sched_new(const kvg_model *m, kvg_forward *fw, kvg_prefix_cache *pc,
                         kvg_kv_pool *pool, const kvg_sched_config *cfg,
                         kvg_sched_cb cb, void *cb_ctx, char *err, size_t err_len)
{
    kvg_sched *s;
    if (!m || !fw || !pc || !pool || !cb) {
        kvg_set_err(err, err_len, "scheduler: model, forward pass, cache, pool and callback are required");
        return NULL;
    }
    s = calloc(1, sizeof *s);
    if (!s) {
        kvg_set_err(err, err_len, "scheduler: out of memory");
        return NULL;
    }
    s->m = m;
    s->fw = fw;
    s->pc = pc;
    s->pool = pool;
    s->cb = cb;
    s->cb_ctx = cb_ctx;
    if (cfg)
        s->cfg = *cfg;
    if (s->cfg.max_batch_tokens <= 0)
        s->cfg.max_batch_tokens = 512;
    if (s->cfg.max_running <= 0)
        s->cfg.max_running = 64;
    if (!(s->cfg.bypass_share > 0.0 && s->cfg.bypass_share < 1.0))
        s->cfg.bypass_share = 0.25;
    s->hasher = kvg_prefix_hasher_new(err, err_len);
    s->ids = malloc((size_t)pool->geom.block_tokens * sizeof *s->ids);
    if (!s->hasher || !s->ids) {
        if (s->hasher)
            kvg_set_err(err, err_len, "scheduler: out of memory");
        kvg_sched_free(s);
        return NULL;
    }
    return s;
}

static void req_free(kvg_sched *s, req *q)
{
    for (int j = 0; j < q->n; j++) {
        kvg_pc_release(s->pc, &q->smp[j].seq, now_ms(s));
        free(q->smp[j].seq.blocks);
        free(q->smp[j].gen);
    }
    kvg_pc_release(s->pc, &q->pr.seq, now_ms(s));
    free(q->pr.seq.blocks);
    kvg_pc_fetch_free(s->pc, q->fetch);  /* cancelled while its reads were in flight */
    free(q->plogits);
    free(q->prompt);
    free(q->hashes);
    /* After the blocks: a tenant whose blocks stay cached lives on through them. */
    kvg_pc_tenant_put(s->pc, q->r.tenant);
    free(q);
}

void kvg_sched_free(kvg_sched *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_live; i++)
        req_free(s, s->live[i]);
    free(s->live);
    kvg_prefix_hasher_free(s->hasher);
    kvg_sampler_free(&s->smp);
    free(s->items);
    free(s->fseq);
    free(s->logits);
    free(s->ids);
    free(s->text);
    free(s);
}

int kvg_sched_pending(const kvg_sched *s)
{
    int n = 0;
    for (int i = 0; i < s->n_live; i++)
        n += is_live(s->live[i]);
    return n;
}

/* KV positions one sample may hold at most: the prompt and every generated token
 * but the last (it is never fed). */
static int64_t max_positions(const req *q)
{
    return (int64_t)q->r.n_prompt + q->max_gen - 1;
}

static int validate(kvg_sched *s, const kvg_sched_req *r, int n, char *err, size_t err_len)
{
    const kvg_model_config *c = &s->m->cfg;
    if (!r->prompt || r->n_prompt <= 0) {
        kvg_set_err(err, err_len, "request %llu: the prompt is empty", (unsigned long long)r->id);
        return -1;
    }
    if (r->n_prompt > c->max_seq_len) {
        kvg_set_err(err, err_len, "request %llu: the prompt has %d tokens, more than the context "
                    "length %d", (unsigned long long)r->id, (int)r->n_prompt, c->max_seq_len);
        return -1;
    }
    /* Precondition: the ids are in the vocabulary. The engine's intake (daemon_conn.c)
     * checks every request's, warm-up files are checked as they are parsed (warmup.c). */
    for (int32_t i = 0; i < r->n_prompt; i++)
        assert(r->prompt[i] >= 0 && r->prompt[i] < c->vocab_size);
    if (n < 1 || n > KVG_SCHED_MAX_N) {
        kvg_set_err(err, err_len, "request %llu: n must be 1..%d, got %d",
                    (unsigned long long)r->id, KVG_SCHED_MAX_N, n);
        return -1;
    }
    if (r->n_active < 0 || r->n_active > n) {
        kvg_set_err(err, err_len, "request %llu: n_active must be 0..n (%d), got %d",
                    (unsigned long long)r->id, n, r->n_active);
        return -1;
    }
    if (r->max_tokens < 1) {
        kvg_set_err(err, err_len, "request %llu: max_tokens must be >= 1, got %d",
                    (unsigned long long)r->id, (int)r->max_tokens);
        return -1;
    }
    if (r->n_stop_ids < 0 || r->n_stop_ids > KVG_SCHED_MAX_STOP_IDS) {
        kvg_set_err(err, err_len, "request %llu: at most %d stop ids",
                    (unsigned long long)r->id, KVG_SCHED_MAX_STOP_IDS);
        return -1;
    }
    if (r->n_stop > 0 && !s->m->tokenizer) {
        kvg_set_err(err, err_len, "request %llu: stop strings need a tokenizer",
                    (unsigned long long)r->id);
        return -1;
    }
    if (kvg_sampler_params_check(&r->sp, err, err_len) != 0)
        return -1;
    /* A bypass request has no cache state and needs no tenant; the others must name a
     * live one (the caller holds a reference until submit has taken the request's). */
    if (r->bucket != KVG_BUCKET_BYPASS && !kvg_pc_tenant_live(s->pc, r->tenant)) {
        kvg_set_err(err, err_len, "request %llu: tenant %d is not known to the prefix cache (kvg_pc_tenant)",
                    (unsigned long long)r->id, r->tenant);
        return -1;
    }
    if (r->bucket >= KVG_SCHED_BUCKETS) {
        kvg_set_err(err, err_len, "request %llu: bucket %u out of range",
                    (unsigned long long)r->id, r->bucket);
        return -1;
    }
    for (int i = 0; i < s->n_live; i++)
        if (is_live(s->live[i]) && s->live[i]->r.id == r->id) {
            kvg_set_err(err, err_len, "request %llu: id already in use", (unsigned long long)r->id);
            return -1;
        }
    return 0;
}

int kvg_sched_submit(kvg_sched *s, const kvg_sched_req *r, char *err, size_t err_len)
{
    int32_t bt = s->pool->geom.block_tokens, ctx = s->m->cfg.max_seq_len;
    int n = r->n ? r->n : 1;
    req *q;
    kvg_stop_match sm;

    if (validate(s, r, n, err, err_len) != 0 ||
        kvg_stop_init(&sm, r->stop, NULL, r->n_stop, err, err_len) != 0) {
        s->st.rejected++;
        return -1;
    }
    q = calloc(1, sizeof *q);
    if (!q)
        goto oom;
    q->r = *r;
    q->n = q->n_live = n;
    q->bypass = r->bucket == KVG_BUCKET_BYPASS;
    /* Generation can go on while the last generated token still has a position. */
    q->max_gen = r->max_tokens;
    if ((int64_t)q->max_gen > (int64_t)ctx - r->n_prompt + 1)
        q->max_gen = ctx - r->n_prompt + 1;
    {
        int64_t pos = max_positions(q), per = (pos + bt - 1) / bt, shared = r->n_prompt / bt;
        int64_t need = n == 1 ? per : shared + (int64_t)n * (per - shared);
        /* Samples drawn later: the prompt's own partial block stays next to each
         * sample's copy of it. */
        if (r->n_active && r->n_active < n && r->n_prompt % bt)
            need++;
        if (need > s->pool->n_blocks) {
            kvg_set_err(err, err_len, "request %llu: needs up to %lld KV blocks (%d prompt + %d "
                        "new tokens, n=%d), more than the pool's %d", (unsigned long long)r->id,
                        (long long)need, (int)r->n_prompt, (int)q->max_gen, n,
                        (int)s->pool->n_blocks);
            free(q);
            s->st.rejected++;
            return -1;
        }
    }
    q->prompt = malloc((size_t)r->n_prompt * sizeof *q->prompt);
    if (!q->prompt)
        goto oom;
    memcpy(q->prompt, r->prompt, (size_t)r->n_prompt * sizeof *q->prompt);
    q->r.prompt = q->prompt;
    q->r.n = n;
    q->r.n_active = r->n_active ? r->n_active : n;
    q->n_undrawn = n - q->r.n_active;
    if (q->n_undrawn) {
        q->plogits = malloc((size_t)s->m->cfg.vocab_size * sizeof *q->plogits);
        if (!q->plogits)
            goto oom;
    }
    for (int i = 0; i < KVG_STOP_MAX; i++)
        q->r.stop[i] = NULL;     /* the matcher holds copies */
    if (!q->bypass) {
        q->n_hashes = r->n_prompt / bt;
        q->hashes = malloc((size_t)(q->n_hashes ? q->n_hashes : 1) * sizeof *q->hashes);
        if (!q->hashes)
            goto oom;
        /* Precondition: the chain, one hash per full block, always given: the
         * engine's intake (daemon_conn.c) recomputes it from the tokens and checks
         * the count, warm-up (warmup.c) computes it from its entry. The scheduler
         * only ever extends a chain (kvg_prefix_next over generated blocks). */
        assert(r->n_hashes == q->n_hashes && (r->hashes || q->n_hashes == 0));
        if (q->n_hashes)
            memcpy(q->hashes, r->hashes, (size_t)q->n_hashes * sizeof *q->hashes);
    }
    q->r.hashes = q->hashes;
    q->r.n_hashes = q->n_hashes;
    /* What admission will likely find cached (blocks may still be evicted before
     * then): routing compares engines by the work a request adds, and a hit adds
     * little. The last prompt token is always computed. */
    for (int32_t i = 0; i < q->n_hashes && kvg_pc_holds(s->pc, q->hashes[i]); i++)
        q->hint_cached = (i + 1) * bt;
    if (q->hint_cached >= r->n_prompt)
        q->hint_cached = r->n_prompt - 1;
    for (int j = 0; j < n; j++) {
        sample *p = &q->smp[j];
        p->drawn = j < q->r.n_active;
        p->sm = sm;
        if (s->m->tokenizer) {
            kvg_detok_init(&p->dt, s->m->tokenizer);
            p->dt.at_start = 0;  /* a continuation keeps its leading space */
        }
    }
    if (s->n_live == s->cap_live) {
        int nc = s->cap_live ? s->cap_live * 2 : 16;
        req **g = realloc(s->live, (size_t)nc * sizeof *g);
        if (!g)
            goto oom;
        s->live = g;
        s->cap_live = nc;
    }
    /* The request's own hold on its tenant, for as long as it is live (req_free drops
     * it): the id can never be reclaimed and reused under it. A bypass request has
     * none. Taken last, as nothing after it can fail. */
    if (q->bypass)
        q->r.tenant = -1;
    else if (kvg_pc_tenant_ref(s->pc, q->r.tenant) != 0)
        goto oom;                /* validated live above: cannot happen */
    q->arrival = ++s->arrivals;
    q->t_submit = kvg_mono_s();
    s->live[s->n_live++] = q;
    s->st.bucket[r->bucket].requests++;
    return 0;
oom:
    if (q) {
        free(q->prompt);
        free(q->hashes);
        free(q->plogits);
        free(q);
    }
    kvg_set_err(err, err_len, "scheduler: out of memory");
    return -1;
}

static void emit(kvg_sched *s, kvg_sched_event *ev, const req *q)
{
    ev->id = q->r.id;
    ev->user = q->r.user;
    s->cb(s->cb_ctx, ev);
}

static void note_first_output(kvg_sched *s, req *q)
{
    if (q->ttft_noted)
        return;
    double t = kvg_mono_s() - q->t_submit;
    q->ttft_noted = 1;
    s->st.ttft_count++;
    s->st.ttft_sum_s += t;
    if (t > s->st.ttft_max_s)
        s->st.ttft_max_s = t;
}

static int ensure_text(kvg_sched *s, size_t n)
{
    if (n <= s->cap_text)
        return 0;
    char *g = realloc(s->text, n);
    if (!g)
        return -1;
    s->text = g;
    s->cap_text = n;
    return 0;
}

static void take_token(kvg_sched *s, req *q, int j, const float *logits);

/* The prompt's sequence is given back once the prompt is in and no sample is left to
 * draw from it (the drawn samples hold the prompt's blocks themselves). */
static void release_prompt_if_unneeded(kvg_sched *s, req *q)
{
    if (q->n_undrawn == 0 && q->state == RQ_DECODING && q->pr.seq.n_blocks > 0)
        kvg_pc_release(s->pc, &q->pr.seq, now_ms(s));
}

static void finish_sample(kvg_sched *s, req *q, int j, kvg_finish_reason why, const char *error)
{
    sample *p = &q->smp[j];
    kvg_sched_event ev;
    long w = 0;
    if (p->done)
        return;
    memset(&ev, 0, sizeof ev);
    if (why != KVG_FINISH_CANCELLED && why != KVG_FINISH_ERROR && s->m->tokenizer &&
        ensure_text(s, 2 * KVG_STOP_MAX_LEN + 64) == 0) {
        /* The held-back text: an incomplete character, then an undecided stop prefix. */
        char tail[64];
        long d = kvg_detok_flush(&p->dt, tail, sizeof tail);
        long a = d > 0 ? kvg_stop_feed(&p->sm, tail, (size_t)d, s->text, s->cap_text) : 0;
        long b = kvg_stop_flush(&p->sm, s->text + (a > 0 ? a : 0),
                                s->cap_text - (size_t)(a > 0 ? a : 0));
        w = (a > 0 ? a : 0) + (b > 0 ? b : 0);
    }
    p->done = 1;
    q->n_live--;
    if (!p->drawn) {
        q->n_undrawn--;          /* dropped: it never had blocks */
        release_prompt_if_unneeded(s, q);
    }
    kvg_pc_release(s->pc, &p->seq, now_ms(s));
    ev.kind = KVG_SEV_FINISHED;
    ev.sample = j;
    ev.reason = why;
    ev.text = w > 0 ? s->text : "";
    ev.text_len = (size_t)w;
    ev.error = error;
    note_first_output(s, q);
    emit(s, &ev, q);
    if (q->n_live == 0) {
        int32_t comp = 0;
        for (int k = 0; k < q->n; k++)
            comp += q->smp[k].n_gen;
        memset(&ev, 0, sizeof ev);
        ev.kind = KVG_SEV_DONE;
        ev.cached_tokens = q->cached;
        ev.prompt_tokens = q->r.n_prompt;
        ev.completion_tokens = comp;
        ev.cache_write_tokens = q->cache_written;
        s->st.bucket[q->r.bucket].completion_tokens += (uint64_t)comp;
        q->state = RQ_FINISHED;
        emit(s, &ev, q);
    }
}

/* Frees the finished requests (outside a step's batch: it may point at them). */
static void drop_finished(kvg_sched *s)
{
    int k = 0;
    for (int i = 0; i < s->n_live; i++) {
        if (!is_live(s->live[i]))
            req_free(s, s->live[i]);
        else
            s->live[k++] = s->live[i];
    }
    s->n_live = k;
}

static void do_cancels(kvg_sched *s)
{
    for (int i = 0; i < s->n_live; i++) {
        req *q = s->live[i];
        if (!q->cancel_pending || !is_live(q))
            continue;
        s->st.cancelled++;
        for (int j = 0; j < q->n; j++)
            finish_sample(s, q, j, KVG_FINISH_CANCELLED, NULL);
    }
}

/* Gives sample j the prompt's blocks (shared; the partial last block is copied on
 * its first write) and the prompt's hash state. -1: the fork failed, the sample is
 * finished with the error. */
static int fork_from_prompt(kvg_sched *s, req *q, int j, char *err, size_t err_len)
{
    sample *p = &q->smp[j];
    if (kvg_pc_fork(s->pc, &q->pr.seq, &p->seq, err, err_len) != 0) {
        finish_sample(s, q, j, KVG_FINISH_ERROR, err);
        return -1;
    }
    p->n_hashed = q->pr.n_hashed;
    memcpy(p->last_hash, q->pr.last_hash, KVG_PREFIX_HASH_LEN);
    if (!p->started) {
        p->started = 1;
        s->st.samples_started++;
    }
    return 0;
}

/* kvg_sched_samples' work: the cancel mask first (a drawn sample stops and gives its
 * own blocks back, an undrawn one is dropped), then the draws. A sample drawn while
 * the request decodes starts at once off the kept prompt: its first token comes from
 * the prompt's saved logits, exactly as if it had started with the others. One drawn
 * earlier than that (the prompt is not in yet, or is recomputed after a preemption)
 * starts when the prompt is in (deliver_prompt). */
static void do_sample_ops(kvg_sched *s)
{
    char err[256];
    for (int i = 0; i < s->n_live; i++) {
        req *q = s->live[i];
        uint32_t mask = q->cancel_mask_pending;
        int draw = q->draw_pending;
        if (!is_live(q) || (!mask && !draw))
            continue;
        q->cancel_mask_pending = 0;
        q->draw_pending = 0;
        for (int j = 0; j < q->n && is_live(q); j++) {
            sample *p = &q->smp[j];
            if (!(mask >> j & 1u) || p->done)
                continue;
            if (p->drawn)
                s->st.samples_cancelled++;
            else
                s->st.samples_dropped++;
            finish_sample(s, q, j, KVG_FINISH_CANCELLED, NULL);
        }
        for (int j = 0; j < q->n && draw > 0 && is_live(q); j++) {
            sample *p = &q->smp[j];
            if (p->drawn || p->done)
                continue;
            p->drawn = 1;
            q->n_undrawn--;
            draw--;
            if (q->state != RQ_DECODING)
                continue;
            if (fork_from_prompt(s, q, j, err, sizeof err) == 0)
                take_token(s, q, j, q->plogits);
        }
        if (is_live(q))
            release_prompt_if_unneeded(s, q);
    }
}

/* Carries out the marked cancels and sample operations, and frees every finished
 * request. */
static void settle(kvg_sched *s)
{
    do_cancels(s);
    do_sample_ops(s);
    drop_finished(s);
}

int kvg_sched_cancel(kvg_sched *s, uint64_t id)
{
    for (int i = 0; i < s->n_live; i++) {
        req *q = s->live[i];
        if (!is_live(q) || q->r.id != id)
            continue;
        q->cancel_pending = 1;
        if (!s->in_step) {
            settle(s);
        }
        return 0;
    }
    return -1;
}

int kvg_sched_samples(kvg_sched *s, uint64_t id, int draw, uint32_t cancel_mask)
{
    for (int i = 0; i < s->n_live; i++) {
        req *q = s->live[i];
        if (!is_live(q) || q->r.id != id)
            continue;
        if (q->n < 32)
            cancel_mask &= (1u << q->n) - 1u;
        q->cancel_mask_pending |= cancel_mask;
        if (draw > 0)
            q->draw_pending += draw > q->n ? q->n : draw;
        if (!s->in_step)
            settle(s);
        return 0;
    }
    return -1;
}

int kvg_sched_hold(kvg_sched *s, uint64_t id, int held)
{
    for (int i = 0; i < s->n_live; i++) {
        req *q = s->live[i];
        if (!is_live(q) || q->r.id != id)
            continue;
        q->held = held != 0;
        return 0;
    }
    return -1;
}

int kvg_sched_forget_tenant(kvg_sched *s, int tenant)
{
    int n = 0;
    if (tenant < 0)
        return 0;
    for (int i = 0; i < s->n_live; i++) {
        req *q = s->live[i];
        if (!is_live(q) || q->bypass || q->r.tenant != tenant)
            continue;
        q->no_commit = 1;
        n++;
    }
    return n;
}

/* How long prompt block i is held: the longest of the request's holds covering it (0:
 * none). */
static int64_t hold_of(const req *q, int32_t i)
{
    int64_t ms = 0;
    for (int k = 0; k < q->r.n_holds; k++)
        if (i < q->r.hold_blocks[k] && q->r.hold_ms[k] > ms)
            ms = q->r.hold_ms[k];
    return ms;
}

/* Commits every block of sample j's sequence that became full. */
static void commit_blocks(kvg_sched *s, req *q, int j, int64_t now)
{
    sample *p = j < 0 ? &q->pr : &q->smp[j];   /* the prompt's own has no gen: positions < n_prompt */
    int32_t bt = s->pool->geom.block_tokens, full = p->seq.n_tokens / bt;
    char err[128];
    if (q->bypass || q->no_commit) {
        p->n_hashed = full;
        return;
    }
    while (p->n_hashed < full) {
        int32_t i = p->n_hashed;
        uint8_t h[KVG_PREFIX_HASH_LEN];
        if (i < q->n_hashes) {
            memcpy(h, q->hashes[i], sizeof h);
        } else {
            for (int32_t k = 0; k < bt; k++) {
                int32_t pos = i * bt + k;
                s->ids[k] = pos < q->r.n_prompt ? q->prompt[pos] : p->gen[pos - q->r.n_prompt];
            }
            if (kvg_prefix_next(s->hasher, p->last_hash, s->ids, (size_t)bt, h, err, sizeof err) != 0)
                return;          /* ids are valid: cannot happen; the block just stays private */
        }
        kvg_pc_commit(s->pc, &p->seq, i, h, q->r.tenant, q->r.ttl_ms ? q->r.ttl_ms : s->cfg.default_ttl_ms, now);
        if (j < 0 && hold_of(q, i) > 0 &&
            kvg_pc_hold(s->pc, &p->seq, i, 1, hold_of(q, i), now) == 1)
            q->cache_written += bt;          /* computed by this request and now held */
        memcpy(p->last_hash, h, sizeof h);
        p->n_hashed++;
    }
}

/* Chooses sample j's next token from logits and reports it. */
static void take_token(kvg_sched *s, req *q, int j, const float *logits)
{
    sample *p = &q->smp[j];
    int V = s->m->cfg.vocab_size;
    int32_t pos = q->r.n_prompt + p->n_gen;
    float lp = NAN;
    /* Without logprobs, greedy decoding is an argmax: no pass of exp() over the
     * vocabulary (about a tenth of a 15M model's decode step). */
    int32_t tok = kvg_sample(&s->smp, &q->r.sp, logits, V, q->r.sample_base + (uint64_t)j,
                             (uint64_t)pos, q->r.logprobs ? &lp : NULL);
    kvg_sched_event ev;
    long w = 0;

    if (tok < 0) {
        finish_sample(s, q, j, KVG_FINISH_ERROR, "sampling failed (out of memory)");
        return;
    }
    for (int k = 0; k < q->r.n_stop_ids; k++)
        if (q->r.stop_ids[k] == tok) {
            finish_sample(s, q, j, KVG_FINISH_STOP, NULL);
            return;
        }
    if (p->n_gen == p->cap) {
        int32_t nc = p->cap ? p->cap * 2 : 64;
        int32_t *g = realloc(p->gen, (size_t)nc * sizeof *g);
        if (!g) {
            finish_sample(s, q, j, KVG_FINISH_ERROR, "out of memory");
            return;
        }
        p->gen = g;
        p->cap = nc;
    }
    p->gen[p->n_gen++] = tok;
    size_t dcap = 0;
    if (s->m->tokenizer) {
        size_t tl = 0;
        kvg_tokenizer_token_bytes(s->m->tokenizer, tok, &tl);
        dcap = 3 * (tl + 4) + 16;
        /* detok output first, the stop matcher's output after it */
        if (ensure_text(s, dcap + kvg_stop_out_cap(dcap)) == 0) {
            long d = kvg_detok_push(&p->dt, tok, s->text, dcap);
            if (d > 0)
                w = kvg_stop_feed(&p->sm, s->text, (size_t)d, s->text + dcap, s->cap_text - dcap);
        }
    }
    memset(&ev, 0, sizeof ev);
    ev.kind = KVG_SEV_TOKEN;
    ev.sample = j;
    ev.token = tok;
    ev.logprob = lp;
    ev.text = w > 0 ? s->text + dcap : "";
    ev.text_len = w > 0 ? (size_t)w : 0;
    note_first_output(s, q);
    emit(s, &ev, q);
    if (p->sm.matched >= 0)
        finish_sample(s, q, j, KVG_FINISH_STOP, NULL);
    else if (p->n_gen >= q->max_gen)
        finish_sample(s, q, j, p->n_gen >= q->r.max_tokens ? KVG_FINISH_LENGTH : KVG_FINISH_CONTEXT, NULL);
}

static int running_samples(const kvg_sched *s)
{
    int n = 0;
    for (int i = 0; i < s->n_live; i++)
        if (is_running(s->live[i]))
            n += s->live[i]->n_live - s->live[i]->n_undrawn;
    return n;
}

static void admit(kvg_sched *s, int64_t now)
{
    char err[256];
    for (;;) {
        req *best = NULL;
        for (int i = 0; i < s->n_live; i++) {
            req *q = s->live[i];
            if (!is_queued(q) || q->held || kvg_pc_fetch_pending(s->pc, q->fetch))
                continue;        /* a request waiting for disk reads holds up nobody */
            if (!best || q->r.priority > best->r.priority ||
                (q->r.priority == best->r.priority && q->arrival < best->arrival))
                best = q;
        }
        /* A request wider than max_running still runs, alone: it must not
         * wait forever. */
        int running = running_samples(s);
        if (!best || (running > 0 && running + best->n_live - best->n_undrawn > s->cfg.max_running))
            return;
        sample *p = &best->pr;
        if (!best->bypass && !best->fetch_tried) {
            /* Blocks only the disk holds are read by the store's reader while the
             * others run; it is admitted once they are in (or failed: recomputed). */
            best->fetch_tried = 1;
            best->fetch = kvg_pc_fetch_start(s->pc, best->r.tenant,
                                             (const uint8_t (*)[KVG_PREFIX_HASH_LEN])best->hashes,
                                             best->n_hashes, best->r.n_prompt);
            if (kvg_pc_fetch_pending(s->pc, best->fetch))
                continue;
        }
        int32_t got = kvg_pc_admit_fetched(s->pc, &p->seq, best->r.tenant,
                                           best->bypass ? NULL : (const uint8_t (*)[KVG_PREFIX_HASH_LEN])best->hashes,
                                           best->bypass ? 0 : best->n_hashes, best->r.n_prompt,
                                           best->r.ttl_ms ? best->r.ttl_ms : s->cfg.default_ttl_ms, now,
                                           best->state == RQ_PREEMPTED || best->bypass, best->fetch,
                                           err, sizeof err);
        if (got < 0)
            return;              /* waits for blocks; later arrivals wait behind it */
        kvg_pc_fetch_free(s->pc, best->fetch);
        best->fetch = NULL;
        int first = best->state == RQ_WAITING;
        best->state = RQ_PREFILLING;
        best->admit_no = ++s->admits;
        p->n_hashed = got / s->pool->geom.block_tokens;
        /* the holds of the blocks it hit: refreshed (as a hit refreshes a TTL) */
        for (int32_t i = 0; i < p->n_hashed && best->r.n_holds > 0; i++)
            if (hold_of(best, i) > 0)
                kvg_pc_hold(s->pc, &p->seq, i, 1, hold_of(best, i), now);
        if (p->n_hashed > 0)
            memcpy(p->last_hash, best->hashes[p->n_hashed - 1], KVG_PREFIX_HASH_LEN);
        else
            memcpy(p->last_hash, best->r.root, KVG_PREFIX_HASH_LEN);
        if (first) {             /* a preempted request was accepted already */
            kvg_sched_event ev;
            best->cached = got;
            s->st.bucket[best->r.bucket].prompt_tokens += (uint64_t)best->r.n_prompt;
            s->st.bucket[best->r.bucket].cached_tokens += (uint64_t)got;
            memset(&ev, 0, sizeof ev);
            ev.kind = KVG_SEV_ACCEPTED;
            ev.cached_tokens = got;
            emit(s, &ev, best);
        }
    }
}

static void preempt(kvg_sched *s, req *q)
{
    int64_t now = now_ms(s);
    for (int j = 0; j < q->n; j++) {
        sample *p = &q->smp[j];
        kvg_pc_release(s->pc, &p->seq, now);
        p->n_fed = 0;
        p->n_hashed = 0;
    }
    kvg_pc_release(s->pc, &q->pr.seq, now);
    q->pr.n_hashed = 0;
    q->state = RQ_PREEMPTED;
    q->fetch_tried = 0;          /* its blocks may be on disk by its readmission */
    s->st.preemptions++;
}

/* Appends a row group to the batch; -1 when out of memory. */
static int add_item(kvg_sched *s, step_batch *b, req *q, int j, int n, const int32_t *toks)
{
    if (b->n_items == s->cap_items) {
        int nc = s->cap_items ? s->cap_items * 2 : 32;
        item *gi = realloc(s->items, (size_t)nc * sizeof *gi);
        if (!gi)
            return -1;
        s->items = gi;
        kvg_fwd_seq *gf = realloc(s->fseq, (size_t)nc * sizeof *gf);
        if (!gf)
            return -1;
        s->fseq = gf;
        s->cap_items = nc;
    }
    item *it = &s->items[b->n_items++];
    it->q = q;
    it->j = j;
    it->n = n;
    it->tokens = toks;
    it->logits = -1;
    it->dead = 0;
    return 0;
}

/* The sample whose sequence an item's tokens go into: the prompt fills its own. */
static sample *item_sample(const item *it)
{
    return it->j < 0 ? &it->q->pr : &it->q->smp[it->j];
}

/* Prefill work left for q's slot j (-1: the prompt). */
static int32_t prefill_left(const req *q, int j)
{
    if (j < 0)
        return q->r.n_prompt - q->pr.seq.n_tokens;
    return q->smp[j].n_gen - q->smp[j].n_fed;
}

/* Whether slot j of a running request (-1: the prompt) takes prefill chunks: the
 * prompt while PREFILLING; a sample with more than its one pending token to feed (the
 * tokens it regenerated before a preemption) once DECODING. A single pending token is
 * a decode row instead. */
static int wants_prefill(const req *q, int j)
{
    if (j < 0)
        return q->state == RQ_PREFILLING;
    return q->state == RQ_DECODING && !q->smp[j].done && prefill_left(q, j) > 1;
}

/* Phase 1, decode rows: one per running sample whose last token is its only unfed
 * one. They go first and are never cut, so a stream never stalls behind prefill. */
static int collect_decodes(kvg_sched *s, step_batch *b)
{
    for (int i = 0; i < s->n_live; i++) {
        req *q = s->live[i];
        if (q->state != RQ_DECODING || q->held)
            continue;
        for (int j = 0; j < q->n; j++) {
            sample *p = &q->smp[j];
            if (!p->done && p->n_gen - p->n_fed == 1) {
                if (add_item(s, b, q, j, 1, p->gen + p->n_fed) != 0)
                    return -1;
                b->n_decode++;
            }
        }
    }
    return 0;
}

/* The prefill budget split into share[0] for cached requests and share[1] for bypass
 * ones: bypass_share of it (at least one token) when both kinds want prefill, all of it
 * to whichever kind is alone, so a short uncached request never waits behind long
 * prompts. */
static void prefill_shares(const kvg_sched *s, int32_t budget, int32_t share[2])
{
    int have_bypass = 0, have_other = 0;
    for (int i = 0; i < s->n_live; i++) {
        const req *q = s->live[i];
        if (!is_running(q) || q->held)
            continue;
        int any = 0;
        for (int j = -1; j < q->n && !any; j++)
            any = wants_prefill(q, j);
        if (any)
            *(q->bypass ? &have_bypass : &have_other) = 1;
    }
    if (budget < 0)
        budget = 0;
    share[1] = have_bypass ? (have_other ? (int32_t)(budget * s->cfg.bypass_share) : budget) : 0;
    if (have_bypass && share[1] < 1 && budget > 0)
        share[1] = 1;
    share[0] = budget - share[1];
}

/* This step's prefill item of q's slot j, if pass 0 made one. */
static item *find_chunk(kvg_sched *s, const step_batch *b, const req *q, int j)
{
    item *ex = NULL;
    for (int k = b->n_decode; k < b->n_items; k++)
        if (s->items[k].q == q && s->items[k].j == j)
            ex = &s->items[k];
    return ex;
}

/* Phase 2, chunked prefill: prompts (and recomputed samples) in admission order,
 * within what the decode rows left of max_batch_tokens. Pass 0 spends each kind's own
 * share; pass 1 pools what is left, so what one kind did not use goes to the other
 * (extending pass 0's chunks rather than adding a second item per slot). */
static int plan_prefill(kvg_sched *s, step_batch *b)
{
    int32_t share[2];            /* [0]: cached requests, [1]: bypass */
    prefill_shares(s, s->cfg.max_batch_tokens - b->n_decode, share);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            share[0] += share[1];
            share[1] = share[0];
        }
        for (int a = 0; a < s->n_live; a++) {
            req *q = s->live[a];
            if (!is_running(q) || q->held)
                continue;
            for (int j = -1; j < q->n; j++) {
                int32_t left, take, *sh = &share[q->bypass];
                item *ex;
                if (!wants_prefill(q, j))
                    continue;
                ex = find_chunk(s, b, q, j);
                left = prefill_left(q, j) - (ex ? ex->n : 0);
                take = left < *sh ? left : *sh;
                if (take <= 0)
                    continue;
                *sh -= take;
                if (pass == 1)
                    share[0] = share[1] = *sh;
                if (ex) {
                    ex->n += take;
                } else {
                    const int32_t *toks = j < 0 ? q->prompt + q->pr.seq.n_tokens
                                                : q->smp[j].gen + q->smp[j].n_fed;
                    if (add_item(s, b, q, j, take, toks) != 0)
                        return -1;
                }
            }
        }
    }
    return 0;
}

/* The running request admitted last (held ones too): the one preemption costs least,
 * and the oldest requests keep their progress. */
static req *latest_admitted(kvg_sched *s)
{
    req *victim = NULL;
    for (int i = 0; i < s->n_live; i++) {
        req *q = s->live[i];
        if (is_running(q) && (!victim || q->admit_no > victim->admit_no))
            victim = q;
    }
    return victim;
}

/* Phase 3, blocks for every row, in batch order. While the pool cannot hold a row, the
 * latest admitted request is preempted and its rows leave the batch, until the row fits
 * or its own request was the one preempted. */
static void reserve_blocks(kvg_sched *s, step_batch *b)
{
    for (int k = 0; k < b->n_items; k++) {
        item *it = &s->items[k];
        if (it->dead)
            continue;
        sample *p = item_sample(it);
        while (kvg_pc_prepare(s->pc, &p->seq, it->n, b->now, NULL, 0) != 0) {
            req *victim = latest_admitted(s);
            preempt(s, victim);
            for (int m = 0; m < b->n_items; m++)
                if (s->items[m].q == victim)
                    s->items[m].dead = 1;
            if (victim == it->q)
                break;
        }
    }
}

/* Phase 4, logits: a row of s->logits for each item that feeds its slot's last pending
 * token (the next token is chosen from it); the other chunks only fill K/V. */
static int bind_logits(kvg_sched *s, step_batch *b)
{
    size_t V = (size_t)s->m->cfg.vocab_size;
    for (int k = 0; k < b->n_items; k++) {
        item *it = &s->items[k];
        if (!it->dead && it->n == prefill_left(it->q, it->j))
            it->logits = b->n_out++;
    }
    if ((size_t)b->n_out * V > s->cap_logits) {
        float *g = realloc(s->logits, (size_t)b->n_out * V * sizeof *g);
        if (!g)
            return -1;
        s->logits = g;
        s->cap_logits = (size_t)b->n_out * V;
    }
    return 0;
}

static float *item_logits(const kvg_sched *s, const item *it)
{
    return it->logits >= 0 ? s->logits + (size_t)it->logits * (size_t)s->m->cfg.vocab_size : NULL;
}

/* Phase 5, the forward pass over the items still in the batch. 1: it ran; 0: nothing
 * to run (every item was preempted); -1: it failed, and every sample of the batch's
 * requests is finished with the error (the scheduler stays usable). */
static int run_forward(kvg_sched *s, step_batch *b, char *err, size_t err_len)
{
    int nf = 0;
    for (int k = 0; k < b->n_items; k++) {
        item *it = &s->items[k];
        if (it->dead)
            continue;
        kvg_fwd_seq *f = &s->fseq[nf++];
        f->kv = &item_sample(it)->seq;
        f->tokens = it->tokens;
        f->n_tokens = it->n;
        f->logits = item_logits(s, it);
        b->rows += it->n;
    }
    if (nf == 0)
        return 0;
    if (kvg_forward_step(s->fw, s->fseq, nf, err, err_len) != 0) {
        for (int k = 0; k < b->n_items; k++)
            if (!s->items[k].dead)
                for (int j = 0; j < s->items[k].q->n; j++)
                    finish_sample(s, s->items[k].q, j, KVG_FINISH_ERROR, err);
        return -1;
    }
    s->st.steps++;
    return 1;
}

/* A prompt chunk is in: its full blocks are committed. After the last chunk every drawn
 * live sample forks the prompt, the request decodes, and each drawn sample without
 * tokens yet draws its first from the prompt's logits (a recomputed sample feeds its
 * old tokens first). While samples remain undrawn the request keeps the prompt's
 * sequence and logits for them; otherwise the prompt's sequence goes at once, before
 * any sample writes, so the samples alone hold the prompt's blocks. */
static void deliver_prompt(kvg_sched *s, req *q, const float *lg, int64_t now, char *err,
                           size_t err_len)
{
    commit_blocks(s, q, -1, now);
    if (q->pr.seq.n_tokens < q->r.n_prompt)
        return;
    /* The request is live (cancels wait for the step's end), so it may move on to
     * DECODING; a fork's error may finish it, which the loops below check. */
    q->state = RQ_DECODING;
    if (q->n_undrawn > 0)
        memcpy(q->plogits, lg, (size_t)s->m->cfg.vocab_size * sizeof *q->plogits);
    for (int j = 0; j < q->n && is_live(q); j++)
        if (q->smp[j].drawn && !q->smp[j].done)
            fork_from_prompt(s, q, j, err, err_len);
    if (!is_live(q))
        return;
    release_prompt_if_unneeded(s, q);
    for (int j = 0; j < q->n && is_live(q); j++)
        if (q->smp[j].drawn && !q->smp[j].done && q->smp[j].n_gen == 0)
            take_token(s, q, j, lg);
}

/* A sample's tokens are in: blocks committed, and once all are fed the next token. */
static void deliver_sample(kvg_sched *s, const item *it, const float *lg, int64_t now)
{
    req *q = it->q;
    sample *p = &q->smp[it->j];
    p->n_fed += it->n;
    commit_blocks(s, q, it->j, now);
    if (p->n_fed == p->n_gen && !p->done)
        take_token(s, q, it->j, lg);
}

/* Phase 6, results in batch order (so events come out in the same order every run).
 * A request finished by an earlier item's event (a stop, a cancel from the callback is
 * only marked) is skipped. */
static void deliver(kvg_sched *s, const step_batch *b, char *err, size_t err_len)
{
    for (int k = 0; k < b->n_items; k++) {
        const item *it = &s->items[k];
        if (it->dead || !is_live(it->q))
            continue;
        if (it->j < 0)
            deliver_prompt(s, it->q, item_logits(s, it), b->now, err, err_len);
        else
            deliver_sample(s, it, item_logits(s, it), b->now);
    }
}

/* Phase 7, statistics: the step's time split between decode and prefill by their
 * shares of the rows computed. */
static void note_step_time(kvg_sched *s, const step_batch *b, double t0)
{
    double dt = kvg_mono_s() - t0;
    int dec = 0;
    for (int k = 0; k < b->n_decode; k++)
        dec += !s->items[k].dead;
    s->st.decode_tokens += (uint64_t)dec;
    s->st.prefill_tokens += (uint64_t)(b->rows - dec);
    if (b->rows > 0) {
        s->st.decode_s += dt * dec / b->rows;
        s->st.prefill_s += dt * (b->rows - dec) / b->rows;
    }
}

/* Out of memory while the batch was built: nothing ran, nothing advanced; the next
 * step builds it again from the requests' state. */
static int step_oom(kvg_sched *s, char *err, size_t err_len)
{
    kvg_set_err(err, err_len, "scheduler: out of memory");
    s->in_step = 0;
    return -1;
}

int kvg_sched_step(kvg_sched *s, char *err, size_t err_len)
{
    step_batch b = { .now = now_ms(s) };
    double t0 = kvg_mono_s();
    int ran;

    s->in_step = 1;              /* from here cancels from callbacks are only marked */
    /* Cancels since the last step first, so that admission sees their blocks free. */
    settle(s);
    /* Waiting requests start while their blocks can be had, best priority first. */
    admit(s, b.now);
    /* Decode rows, then prefill chunks in what is left of the token budget. */
    if (collect_decodes(s, &b) != 0 || plan_prefill(s, &b) != 0)
        return step_oom(s, err, err_len);
    /* KV blocks for all of it, preempting the latest admitted requests if need be. */
    reserve_blocks(s, &b);
    /* Only the rows that choose a token produce logits. */
    if (bind_logits(s, &b) != 0)
        return step_oom(s, err, err_len);
    ran = run_forward(s, &b, err, err_len);
    if (ran > 0) {
        /* Commit blocks, fork prompts, sample, emit events. */
        deliver(s, &b, err, err_len);
        note_step_time(s, &b, t0);
    }
    /* Cancels marked during the step, then free what finished. */
    settle(s);
    s->in_step = 0;
    return ran < 0 ? -1 : b.rows;
}

/* The forward-pass tokens q still needs before its every drawn sample has nothing
 * but decode rows left: load_tokens in proto.h. */
static uint64_t req_load(const req *q)
{
    uint64_t t = 0;
    if (is_queued(q)) {
        t = (uint64_t)(q->r.n_prompt - q->hint_cached);
        for (int j = 0; j < q->n; j++)
            if (!q->smp[j].done)
                t += (uint64_t)q->smp[j].n_gen;
    } else if (q->state == RQ_PREFILLING) {
        t = (uint64_t)prefill_left(q, -1);
        for (int j = 0; j < q->n; j++)   /* after a preemption: tokens to recompute */
            if (!q->smp[j].done && prefill_left(q, j) > 0)
                t += (uint64_t)prefill_left(q, j);
    } else if (q->state == RQ_DECODING) {
        for (int j = 0; j < q->n; j++) {
            const sample *p = &q->smp[j];
            if (p->drawn && !p->done) {
                int32_t left = prefill_left(q, j);
                t += left > 1 ? (uint64_t)left : 1;
            }
        }
    }
    return t;
}

uint64_t kvg_sched_load(const kvg_sched *s)
{
    uint64_t t = 0;
    for (int i = 0; i < s->n_live; i++)
        if (is_live(s->live[i]))
            t += req_load(s->live[i]);
    return t;
}

void kvg_sched_get_stats(const kvg_sched *s, kvg_sched_stats *out)
{
    *out = s->st;
    out->waiting = out->running = out->held = 0;
    out->load_tokens = 0;
    for (int i = 0; i < s->n_live; i++) {
        if (!is_live(s->live[i]))
            continue;
        if (is_queued(s->live[i]))
            out->waiting++;
        else
            out->running++;
        out->held += s->live[i]->held;
        out->load_tokens += req_load(s->live[i]);
    }
}
