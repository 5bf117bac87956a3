/* The daemon's request records and error answers. See daemon_req.h. */
#include "daemon_req.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void kvgd_conn_fail(dconn *c, const char *fmt, ...)
{
    va_list ap;
    if (c->closing)
        return;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    c->closing = 1;
}

dreq *kvgd_req_new(dconn *c, uint64_t client_id)
{
    dreq *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->conn = c;
    r->client_id = client_id;
    r->n = 1;
    r->prev = c->tail;
    if (c->tail)
        c->tail->next = r;
    else
        c->head = r;
    c->tail = r;
    c->n_reqs++;
    return r;
}

static void unlink_req(dreq *r)
{
    dconn *c = r->conn;
    if (!c)
        return;
    if (r->prev)
        r->prev->next = r->next;
    else
        c->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        c->tail = r->prev;
    c->n_reqs--;
    void *v;
    if (kvg_u64map_find(&c->by_id, r->client_id, &v) && v == r)
        kvg_u64map_del(&c->by_id, r->client_id);
    r->prev = r->next = NULL;
    r->conn = NULL;
}

void kvgd_req_free(dreq *r)
{
    unlink_req(r);
    for (int j = 0; j < KVG_PROTO_MAX_N; j++) {
        free(r->smp[j].ids);
        free(r->smp[j].lps);
        free(r->smp[j].text_end);
        free(r->smp[j].text);
    }
    free(r);
}

void kvgd_req_set_error(dreq *r, uint32_t status, const char *msg)
{
    if (r->error)
        return;
    r->error = 1;
    r->err_status = status;
    snprintf(r->err_msg, sizeof r->err_msg, "%s", msg ? msg : "engine error");
}

void kvgd_reply_error(dconn *c, uint64_t client_id, uint32_t status, const char *fmt, ...)
{
    va_list ap;
    char msg[256];
    dreq *r;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->d->counters.errors++;
    r = kvgd_req_new(c, client_id);
    if (!r) {
        kvgd_conn_fail(c, "out of memory answering request %llu", (unsigned long long)client_id);
        return;
    }
    kvgd_req_set_error(r, status, msg);
    c->dirty = 1;
}

void kvgd_req_abort(kvg_daemon *d, dreq *r, uint32_t status, const char *msg)
{
    kvgd_req_set_error(r, status, msg);
    if (r->in_sched)
        kvg_sched_cancel(d->sched, r->sched_id);
    if (r->conn)
        r->conn->dirty = 1;
}
