/* Scheduler events -> per-request output buffers -> the client's completion ring.
 *
 * Output is kept per request and per sample instead of as a queue of messages: the
 * tokens a sample produced while its client's ring was full coalesce into the next
 * TOKENS message, and the state (accepted? finished? done?) says which message comes
 * next.
 *
 * A request is held in the scheduler once one of its samples has hold_tokens tokens
 * its client has not read: buffered here (the ring was full) or pushed in TOKENS
 * messages still unread in the ring (c->unread remembers which). It is released once
 * the client has read them down to half of that. So a slow reader costs at most
 * hold_tokens tokens per sample however far the client falls behind, in the engine's
 * buffers and the client's together: the gateway's bound on a paused stream's memory
 * (kvgate_max_unsent) rests on it. A request is also held while its client paused it
 * (PAUSE: the client's own reader is slow); the scheduler holds it while either
 * reason holds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_output.h"
#include "daemon_req.h"

/* ---- buffering ---- */

static int grow_tokens(dsample *s)
{
    if (s->n < s->cap)
        return 0;
    uint32_t nc = s->cap ? s->cap * 2 : 16;
    uint32_t *ids = realloc(s->ids, nc * sizeof *ids);
    if (!ids)
        return -1;
    s->ids = ids;
    float *lps = realloc(s->lps, nc * sizeof *lps);
    if (!lps)
        return -1;
    s->lps = lps;
    uint32_t *te = realloc(s->text_end, nc * sizeof *te);
    if (!te)
        return -1;
    s->text_end = te;
    s->cap = nc;
    return 0;
}

static int append_text(dsample *s, const char *t, size_t n)
{
    if (!n)
        return 0;
    if ((uint64_t)s->text_len + n > UINT32_MAX / 2)
        return -1;
    if (s->text_len + n > s->text_cap) {
        uint32_t nc = s->text_cap ? s->text_cap : 256;
        while (nc < s->text_len + n)
            nc *= 2;
        char *g = realloc(s->text, nc);
        if (!g)
            return -1;
        s->text = g;
        s->text_cap = nc;
    }
    memcpy(s->text + s->text_len, t, n);
    s->text_len += (uint32_t)n;
    return 0;
}

static uint32_t wire_reason(const dreq *r, kvg_finish_reason why)
{
    switch (why) {
    case KVG_FINISH_STOP: return KVG_MSG_FINISH_STOP;
    case KVG_FINISH_LENGTH:
    case KVG_FINISH_CONTEXT: return KVG_MSG_FINISH_LENGTH;
    default: return r->expired ? KVG_MSG_FINISH_DEADLINE : KVG_MSG_FINISH_CANCELLED;
    }
}

void kvgd_sched_event(void *ctx, const kvg_sched_event *ev)
{
    kvg_daemon *d = ctx;
    dreq *r = ev->user;
    dsample *s;

    if (d->in_warmup || !r)
        return;
    switch (ev->kind) {
    case KVG_SEV_ACCEPTED:
        r->accepted = 1;
        r->cached_tokens = (uint32_t)ev->cached_tokens;
        d->waiting--;
        break;
    case KVG_SEV_TOKEN:
        if (ev->sample < 0 || ev->sample >= r->n)
            break;
        s = &r->smp[ev->sample];
        s->completion++;
        if (r->silent || r->error || !r->conn)
            break;
        if (grow_tokens(s) != 0 || append_text(s, ev->text, ev->text_len) != 0) {
            kvgd_req_abort(d, r, 500, "the engine ran out of memory buffering output");
            break;
        }
        s->ids[s->n] = (uint32_t)ev->token;
        s->lps[s->n] = ev->logprob;
        s->text_end[s->n] = s->text_len;
        s->n++;
        break;
    case KVG_SEV_FINISHED:
        if (ev->sample < 0 || ev->sample >= r->n)
            break;
        s = &r->smp[ev->sample];
        if (ev->reason == KVG_FINISH_ERROR) {
            kvgd_req_set_error(r, 500, ev->error);
            break;
        }
        if (append_text(s, ev->text, ev->text_len) != 0)
            kvgd_req_set_error(r, 500, "the engine ran out of memory buffering output");
        s->finished = 1;
        s->reason = wire_reason(r, ev->reason);
        break;
    case KVG_SEV_DONE:
        if (!r->accepted)
            d->waiting--;        /* cancelled before it was admitted */
        r->in_sched = 0;
        r->done = 1;
        if (r->paused) {
            r->paused = 0;       /* out of the scheduler: no longer held (the gauge) */
            d->counters.paused--;
        }
        r->prompt_tokens = (uint32_t)ev->prompt_tokens;
        r->cached_tokens = (uint32_t)ev->cached_tokens;
        r->completion_tokens = (uint32_t)ev->completion_tokens;
        r->cache_write_tokens = (uint32_t)ev->cache_write_tokens;
        d->counters.completed++;
        if (r->expired)
            d->counters.deadlines++;
        d->stats_written_ms = 0;     /* the statistics page is due before the DONE goes out */
        if (!r->conn) {
            kvgd_req_free(r);
            return;
        }
        break;
    }
    if (r->conn)
        r->conn->dirty = 1;
}

/* ---- pushing ---- */

static int push(dconn *c, uint32_t type, const void *body, size_t len, const void *payload, size_t plen)
{
    char err[160];
    int rc = kvg_shm_try_push(&c->shm.cq, type, body, len, payload, plen, err, sizeof err);
    if (rc == 0) {
        c->pushed++;
        return 0;
    }
    if (rc == KVG_SHM_FULL)
        return 1;
    kvgd_conn_fail(c, "completion ring: %s", err);
    return -1;
}

/* ---- what the client has not read ---- */

/* Forgets the TOKENS messages the client has read: their tokens no longer count
 * against their request. A request already gone is skipped. */
static void retire_read(dconn *c)
{
    uint64_t read = kvg_shm_released(&c->shm.cq);

    while (c->unread_n > 0) {
        dunread *u = &c->unread[c->unread_first];
        void *v;
        if (u->seq > read)
            break;
        if (kvg_u64map_find(&c->by_id, u->client_id, &v)) {
            dsample *s = &((dreq *)v)->smp[u->sample];
            s->unread -= u->tokens < s->unread ? u->tokens : s->unread;
        }
        c->unread_first = (c->unread_first + 1) & (c->unread_cap - 1);
        c->unread_n--;
    }
}

/* Remembers a TOKENS message just pushed. The ring holds at most unread_cap
 * messages, so once the read ones are retired there is room. */
static void note_unread(dconn *c, dreq *r, int j, uint32_t tokens)
{
    if (c->unread_n == c->unread_cap)
        retire_read(c);
    if (c->unread_n == c->unread_cap)
        return;              /* cannot happen while the client's indices are sane */
    dunread *u = &c->unread[(c->unread_first + c->unread_n) & (c->unread_cap - 1)];
    u->seq = kvg_shm_pushed(&c->shm.cq);
    u->client_id = r->client_id;
    u->sample = (uint32_t)j;
    u->tokens = tokens;
    c->unread_n++;
    r->smp[j].unread += tokens;
}

/* Holds the requests with hold_tokens tokens of a sample not read by the client;
 * releases them once it has read down to half. Returns the number held. */
static int update_holds(dconn *c)
{
    kvg_daemon *d = c->d;
    uint32_t hold = (uint32_t)d->cfg.hold_tokens;
    int held = 0;

    retire_read(c);
    for (dreq *r = c->head; r; r = r->next) {
        uint32_t behind = 0;
        if (!r->in_sched)
            continue;
        for (int j = 0; j < r->n; j++)
            if (r->smp[j].n + r->smp[j].unread > behind)
                behind = r->smp[j].n + r->smp[j].unread;
        if (!r->backlogged && behind >= hold) {
            r->backlogged = 1;
            kvg_sched_hold(d->sched, r->sched_id, 1);
        } else if (r->backlogged && behind <= hold / 2) {
            r->backlogged = 0;
            /* still held while its client has it paused (PAUSE, daemon_conn.c) */
            kvg_sched_hold(d->sched, r->sched_id, r->paused);
        }
        held += r->backlogged;
    }
    return held;
}

/* Pushes sample j's buffered tokens and text as TOKENS messages. */
static int push_tokens(dconn *c, dreq *r, int j)
{
    dsample *s = &r->smp[j];
    size_t limit = (size_t)kvg_shm_max_payload(&c->shm.cq);

    while (s->n > 0 || s->text_len > 0) {
        uint32_t k = s->n, tl = s->text_len;
        /* Everything at once when it fits, else the longest prefix of whole tokens. */
        while (kvg_proto_tokens_size(k, r->logprobs, tl) > limit && k > 1) {
            k = k / 2;
            tl = s->text_end[k - 1];
        }
        if (kvg_proto_tokens_size(k, r->logprobs, tl) > limit) {
            kvgd_conn_fail(c, "one token's output exceeds the completion ring's payload limit");
            return -1;
        }
        size_t plen = kvg_proto_tokens_size(k, r->logprobs, tl);
        if (plen > c->out_cap) {
            unsigned char *g = realloc(c->out, plen);
            if (!g) {
                kvgd_conn_fail(c, "out of memory");
                return -1;
            }
            c->out = g;
            c->out_cap = plen;
        }
        kvg_proto_encode_tokens(s->ids, r->logprobs ? s->lps : NULL, k, s->text, tl, c->out, c->out_cap);
        kvg_msg_tokens t = { KVG_PROTO_VERSION, r->logprobs ? KVG_TOKENS_LOGPROBS : 0, r->client_id,
                             (uint32_t)j, k, tl, 0 };
        int rc = push(c, KVG_MSG_TOKENS, &t, sizeof t, c->out, plen);
        if (rc != 0)
            return rc;
        note_unread(c, r, j, k);
        /* Drop what went out. A buffer may still be NULL (no logprobs asked for, no
         * text yet: tokens that decode to nothing) when nothing of it is left, and
         * memmove's pointers must not be NULL even for 0 bytes. */
        if (s->n > k) {
            memmove(s->ids, s->ids + k, (s->n - k) * sizeof *s->ids);
            if (s->lps)
                memmove(s->lps, s->lps + k, (s->n - k) * sizeof *s->lps);
        }
        for (uint32_t i = k; i < s->n; i++)
            s->text_end[i - k] = s->text_end[i] - tl;
        s->n -= k;
        if (s->text_len > tl)
            memmove(s->text, s->text + tl, s->text_len - tl);
        s->text_len -= tl;
    }
    return 0;
}

/* 0: everything of r went out (r may be freed), 1: the ring is full, -1: failed. */
static int flush_req(dconn *c, dreq *r)
{
    int rc;

    if (r->silent) {
        if (!r->in_sched)
            kvgd_req_free(r);
        return 0;
    }
    if (r->error) {
        size_t ml = strlen(r->err_msg);
        kvg_msg_error e = { KVG_PROTO_VERSION, r->err_status, r->client_id, (uint32_t)ml, 0 };
        rc = push(c, KVG_MSG_ERROR, &e, sizeof e, r->err_msg, ml);
        if (rc != 0)
            return rc;
        if (r->in_sched)
            r->silent = 1;       /* the scheduler still finishes it; nothing more goes out */
        else
            kvgd_req_free(r);
        return 0;
    }
    if (r->wipe) {
        kvg_msg_wiped w = { KVG_PROTO_VERSION, 0, r->client_id, r->wiped[0], r->wiped[1], r->wiped[2] };
        if ((rc = push(c, KVG_MSG_WIPED, &w, sizeof w, NULL, 0)) != 0)
            return rc;
        kvgd_req_free(r);
        return 0;
    }
    if (r->accepted && !r->accepted_sent) {
        kvg_msg_accepted a = { KVG_PROTO_VERSION, 0, r->client_id, r->prompt_tokens, r->cached_tokens };
        if ((rc = push(c, KVG_MSG_ACCEPTED, &a, sizeof a, NULL, 0)) != 0)
            return rc;
        r->accepted_sent = 1;
    }
    for (int j = 0; j < r->n; j++) {
        dsample *s = &r->smp[j];
        if ((rc = push_tokens(c, r, j)) != 0)
            return rc;
        if (s->finished && !s->finished_sent) {
            kvg_msg_finished f = { KVG_PROTO_VERSION, (uint32_t)j, r->client_id, s->reason, s->completion };
            if ((rc = push(c, KVG_MSG_FINISHED, &f, sizeof f, NULL, 0)) != 0)
                return rc;
            s->finished_sent = 1;
        }
    }
    if (r->done) {
        kvg_msg_done dn = { KVG_PROTO_VERSION, 0, r->client_id, r->prompt_tokens, r->cached_tokens,
                            r->completion_tokens, r->cache_write_tokens };
        if ((rc = push(c, KVG_MSG_DONE, &dn, sizeof dn, NULL, 0)) != 0)
            return rc;
        kvgd_req_free(r);
    }
    return 0;
}

static void ring_client(dconn *c)
{
    uint64_t one = 1;
    if (c->pushed && write(c->bell_out, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is saturated, the client is woken anyway. */
    }
    c->pushed = 0;
}

void kvgd_conn_flush(dconn *c)
{
    int full = 0;

    if (!c->up || c->closing)
        return;
    for (int attempt = 0; attempt < 2; attempt++) {
        full = 0;
        for (dreq *r = c->head, *next; r; r = next) {
            next = r->next;
            int rc = flush_req(c, r);
            if (rc < 0)
                return;
            if (rc == 1) {
                full = 1;
                break;
            }
        }
        if (!full || attempt == 1)
            break;
        /* Full: announce that we wait for room, then look once more (the client may
         * have drained in between and would not know to ring us). */
        ring_client(c);
        kvg_shm_producer_wait(&c->shm.cq);
    }
    c->blocked = full;
    c->dirty = full;
    /* While requests are held for their unread output, the client rings us as it
     * reads (the waiter flag), and each loop looks again (dirty). The flag is set
     * before the second look, so a read in between is not missed. */
    if (update_holds(c) > 0) {
        kvg_shm_producer_wait(&c->shm.cq);
        if (update_holds(c) > 0)
            c->dirty = 1;
    }
    ring_client(c);
}
