
/*
 * What the gateway counts: a shared memory zone of atomic counters and
 * histograms that all workers add to (once per request, in the log phase;
 * at every engine connect and loss; at every wait for ring room). Reading
 * them out as pages is ngx_http_kvgate_status.c's job, one layer up.
 */


#include "ngx_http_kvgate_metrics.h"


const ngx_uint_t  ngx_http_kvgate_statuses[NGX_HTTP_KVGATE_N_STATUSES] = {
    200, 400, 401, 404, 405, 408, 413, 429, 499, 500, 502, 503, 504, 0
};


/* upper bounds of the histogram buckets, in microseconds (+Inf last) */

const ngx_uint_t  ngx_http_kvgate_hist_us[NGX_HTTP_KVGATE_N_HIST] = {
    5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000,
    5000000, 10000000, 30000000, 60000000, 120000000, 300000000
};

const char *const  ngx_http_kvgate_ep_names[NGX_HTTP_KVGATE_EP_N] = {
    "completions", "chat", "models", "other", "messages"
};

const char *const  ngx_http_kvgate_cache_names[NGX_HTTP_KVGATE_N_CACHE] = {
    "hit", "partial", "miss", "bypass"
};


static ngx_http_kvgate_shctx_t  *ngx_http_kvgate_sh;
static ngx_slab_pool_t          *ngx_http_kvgate_shpool;

/* this configuration's id, keying its pages (a reload's workers and the old
   ones share the zone) */
static uint64_t                  ngx_http_kvgate_conf_id;


ngx_http_kvgate_shctx_t *
ngx_http_kvgate_metrics_zone(void)
{
    return ngx_http_kvgate_sh;
}


static ngx_int_t
ngx_http_kvgate_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_slab_pool_t  *shpool;

    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;
    ngx_http_kvgate_shpool = shpool;

    if (data) {
        /* a reload: the counters go on */
        shm_zone->data = data;
        ngx_http_kvgate_sh = data;
        return NGX_OK;
    }

    if (shm_zone->shm.exists) {
        shm_zone->data = shpool->data;
        ngx_http_kvgate_sh = shpool->data;
        return NGX_OK;
    }

    ngx_http_kvgate_sh = ngx_slab_calloc(shpool,
                                         sizeof(ngx_http_kvgate_shctx_t));
    if (ngx_http_kvgate_sh == NULL) {
        return NGX_ERROR;
    }

    shpool->data = ngx_http_kvgate_sh;
    shm_zone->data = ngx_http_kvgate_sh;

    return NGX_OK;
}


ngx_int_t
ngx_http_kvgate_metrics_init_zone(ngx_conf_t *cf,
    ngx_http_kvgate_main_conf_t *kmcf)
{
    ngx_str_t  name = ngx_string("kvgate_metrics");
    size_t     size;

    /* the counters, and room for the rendered pages (a few of them: a page
       is some tens of kilobytes) */
    size = sizeof(ngx_http_kvgate_shctx_t) + 16 * ngx_pagesize
           + 4 * NGX_HTTP_KVGATE_PAGE_MAX;

    ngx_http_kvgate_conf_id = ((uint64_t) ngx_random() << 32)
                              ^ (uint64_t) ngx_random() ^ (uintptr_t) kmcf;

    kmcf->shm_zone = ngx_shared_memory_add(cf, &name, size,
                                           &ngx_http_kvgate_module);
    if (kmcf->shm_zone == NULL) {
        return NGX_ERROR;
    }

    kmcf->shm_zone->init = ngx_http_kvgate_init_zone;

    return NGX_OK;
}


static ngx_uint_t
ngx_http_kvgate_status_index(ngx_uint_t status)
{
    ngx_uint_t  i;

    for (i = 0; ngx_http_kvgate_statuses[i]; i++) {
        if (ngx_http_kvgate_statuses[i] == status) {
            return i;
        }
    }

    return i;   /* "other" */
}


static void
ngx_http_kvgate_observe(ngx_http_kvgate_hist_t *h, ngx_uint_t us)
{
    ngx_uint_t  i;

    for (i = 0; i < NGX_HTTP_KVGATE_N_HIST; i++) {
        if (us <= ngx_http_kvgate_hist_us[i]) {
            break;
        }
    }

    (void) ngx_atomic_fetch_add(&h->count[i], 1);
    (void) ngx_atomic_fetch_add(&h->sum_us, us);
    (void) ngx_atomic_fetch_add(&h->n, 1);
}


void
ngx_http_kvgate_metrics_count(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx)
{
    ngx_uint_t               status, b, i;
    struct timeval           tv;
    ngx_http_kvgate_shctx_t  *sh = ngx_http_kvgate_sh;

    if (sh == NULL) {
        return;
    }

    status = ctx->status ? ctx->status : r->headers_out.status;

    if (r->connection->error && status == NGX_HTTP_OK && !ctx->usage_set) {
        status = NGX_HTTP_CLIENT_CLOSED_REQUEST;
    }

    b = ctx->bucket < NGX_HTTP_KVGATE_BUCKET_N ? ctx->bucket
                                               : NGX_HTTP_KVGATE_BUCKET_NONE;

    (void) ngx_atomic_fetch_add(
        &sh->requests[ctx->endpoint][b][ngx_http_kvgate_status_index(status)],
        1);

    if (ctx->usage_set) {
        (void) ngx_atomic_fetch_add(&sh->prompt_tokens[b], ctx->prompt_tokens);
        (void) ngx_atomic_fetch_add(&sh->cached_tokens[b], ctx->cached_tokens);
        (void) ngx_atomic_fetch_add(&sh->completion_tokens[b],
                                    ctx->completion_tokens);
    }

    if (ctx->answer_refused) {
        (void) ngx_atomic_fetch_add(&sh->sc_pattern_refusals, 1);
    }

    if (ctx->sc && ctx->usage_set) {
        (void) ngx_atomic_fetch_add(&sh->sc_requests, 1);
        (void) ngx_atomic_fetch_add(&sh->sc_samples_asked, ctx->n_choices);
        (void) ngx_atomic_fetch_add(&sh->sc_samples_run,
                                    kvg_sc_samples_run(ctx->sc));

        if (kvg_sc_stopped_early(ctx->sc)) {
            (void) ngx_atomic_fetch_add(&sh->sc_early_stops, 1);
        }
    }

    if (ctx->cache_status) {
        for (i = 0; i < NGX_HTTP_KVGATE_N_CACHE; i++) {
            if (ngx_strcmp(ctx->cache_status, ngx_http_kvgate_cache_names[i])
                == 0)
            {
                (void) ngx_atomic_fetch_add(&sh->cache_status[i], 1);
            }
        }
    }

    if (ctx->ttft_us >= 0) {
        ngx_http_kvgate_observe(&sh->ttft, (ngx_uint_t) ctx->ttft_us);
    }

    if (ctx->endpoint == NGX_HTTP_KVGATE_EP_COMPLETIONS
        || ctx->endpoint == NGX_HTTP_KVGATE_EP_CHAT
        || ctx->endpoint == NGX_HTTP_KVGATE_EP_MESSAGES)
    {
        ngx_gettimeofday(&tv);
        ngx_http_kvgate_observe(&sh->latency,
            (ngx_uint_t) ((tv.tv_sec - ctx->start_tv.tv_sec) * 1000000
                          + (tv.tv_usec - ctx->start_tv.tv_usec)));
    }
}


void
ngx_http_kvgate_metrics_engine_event(ngx_http_kvgate_engine_t *e,
    ngx_uint_t event)
{
    ngx_atomic_uint_t         key, old;
    ngx_http_kvgate_shctx_t  *sh = ngx_http_kvgate_sh;

    if (sh == NULL) {
        return;
    }

    if (ngx_process_slot < 0 || ngx_process_slot >= NGX_MAX_PROCESSES) {
        return;
    }

    if (event == NGX_HTTP_KVGATE_ENGINE_RESUMED) {
        return;
    }

    if (event == NGX_HTTP_KVGATE_ENGINE_STALLED) {
        /* every worker sees the stall; the first to report it counts it */

        key = (ngx_atomic_uint_t) e->stall_key;
        old = sh->stall_key[e->index];

        if (old != key
            && ngx_atomic_cmp_set(&sh->stall_key[e->index], old, key))
        {
            (void) ngx_atomic_fetch_add(&sh->engine_stalls_e[e->index], 1);
        }

        return;
    }

    if (event == NGX_HTTP_KVGATE_ENGINE_UP) {
        (void) ngx_atomic_fetch_add(&sh->engine_connects, 1);
        (void) ngx_atomic_fetch_add(&sh->engine_connects_e[e->index], 1);
        sh->worker_pid[e->index][ngx_process_slot] =
                                                (ngx_atomic_uint_t) ngx_pid;

    } else {
        (void) ngx_atomic_fetch_add(&sh->engine_disconnects, 1);
        (void) ngx_atomic_fetch_add(&sh->engine_disconnects_e[e->index], 1);
        sh->worker_pid[e->index][ngx_process_slot] = 0;
    }
}


void
ngx_http_kvgate_metrics_worker_clear(void)
{
    ngx_uint_t                i;
    ngx_http_kvgate_shctx_t  *sh = ngx_http_kvgate_sh;

    if (sh == NULL
        || ngx_process_slot < 0 || ngx_process_slot >= NGX_MAX_PROCESSES)
    {
        return;
    }

    /* at start: whatever the slot holds is a predecessor that was killed (a
       slot is reused only once its process has been reaped); at exit: this
       worker's connection closes with it */

    for (i = 0; i < NGX_HTTP_KVGATE_MAX_ENGINES; i++) {
        sh->worker_pid[i][ngx_process_slot] = 0;
    }
}


void
ngx_http_kvgate_metrics_route(ngx_uint_t engine, ngx_uint_t reason)
{
    ngx_http_kvgate_shctx_t  *sh = ngx_http_kvgate_sh;

    if (sh == NULL || engine >= NGX_HTTP_KVGATE_MAX_ENGINES
        || reason >= NGX_HTTP_KVGATE_ROUTE_REASONS)
    {
        return;
    }

    (void) ngx_atomic_fetch_add(&sh->routed[engine][reason], 1);
}


ngx_uint_t
ngx_http_kvgate_metrics_workers_connected(ngx_uint_t engine)
{
    ngx_uint_t                i, n;
    ngx_atomic_uint_t         pid;
    ngx_http_kvgate_shctx_t  *sh = ngx_http_kvgate_sh;

    if (sh == NULL || engine >= NGX_HTTP_KVGATE_MAX_ENGINES) {
        return 0;
    }

    n = 0;

    for (i = 0; i < NGX_MAX_PROCESSES; i++) {
        pid = sh->worker_pid[engine][i];

        if (pid == 0) {
            continue;
        }

        /* an old worker killed while it exited after a reload is never
           respawned into its slot: its pid is gone (EPERM: it exists) */

        if (kill((ngx_pid_t) pid, 0) == -1 && ngx_errno == NGX_ESRCH) {
            (void) ngx_atomic_cmp_set(&sh->worker_pid[engine][i], pid, 0);
            continue;
        }

        n++;
    }

    return n;
}


void
ngx_http_kvgate_metrics_submit_wait(void)
{
    if (ngx_http_kvgate_sh) {
        (void) ngx_atomic_fetch_add(&ngx_http_kvgate_sh->submit_waits, 1);
    }
}


void
ngx_http_kvgate_metrics_backpressure(ngx_uint_t what)
{
    if (ngx_http_kvgate_sh && what < 3) {
        (void) ngx_atomic_fetch_add(&ngx_http_kvgate_sh->backpressure[what], 1);
    }
}


void
ngx_http_kvgate_metrics_wipe(ngx_uint_t complete, const uint64_t *blocks)
{
    ngx_uint_t  i;

    if (ngx_http_kvgate_sh == NULL) {
        return;
    }

    (void) ngx_atomic_fetch_add(&ngx_http_kvgate_sh->wipes[complete ? 1 : 0],
                                1);

    for (i = 0; i < 3; i++) {
        (void) ngx_atomic_fetch_add(&ngx_http_kvgate_sh->wiped_blocks[i],
                                    (ngx_atomic_int_t) blocks[i]);
    }
}


/* ---- the rendered pages cache ---- */

void
ngx_http_kvgate_pages_lock(void)
{
    ngx_shmtx_lock(&ngx_http_kvgate_shpool->mutex);
}


void
ngx_http_kvgate_pages_unlock(void)
{
    ngx_shmtx_unlock(&ngx_http_kvgate_shpool->mutex);
}


static ngx_http_kvgate_page_t *
ngx_http_kvgate_page_find(ngx_http_kvgate_page_key_t *key)
{
    ngx_uint_t               i;
    ngx_http_kvgate_page_t  *pg;

    for (i = 0; i < NGX_HTTP_KVGATE_PAGE_SLOTS; i++) {
        pg = &ngx_http_kvgate_sh->pages[i];

        if (pg->data && pg->conf == ngx_http_kvgate_conf_id
            && pg->loc == key->loc && pg->kind == key->kind)
        {
            return pg;
        }
    }

    return NULL;
}


ngx_int_t
ngx_http_kvgate_page_copy(ngx_http_kvgate_page_key_t *key, ngx_msec_t refresh,
    ngx_pool_t *pool, ngx_str_t *page)
{
    ngx_http_kvgate_page_t  *pg;

    pg = ngx_http_kvgate_page_find(key);

    /* each worker's clock is its own cached ngx_current_msec: one a little
       behind the renderer's sees a page from its future, which is fresh */

    if (pg == NULL
        || (ngx_msec_int_t) (ngx_current_msec - pg->rendered)
           >= (ngx_msec_int_t) refresh)
    {
        return NGX_DECLINED;
    }

    page->data = ngx_pnalloc(pool, pg->len);
    if (page->data == NULL) {
        return NGX_DECLINED;
    }

    ngx_memcpy(page->data, pg->data, pg->len);
    page->len = pg->len;

    return NGX_OK;
}


void
ngx_http_kvgate_page_store(ngx_http_kvgate_page_key_t *key, ngx_chain_t *in,
    size_t len)
{
    u_char                  *p;
    ngx_uint_t               i;
    ngx_http_kvgate_page_t  *pg, *oldest;

    if (len > NGX_HTTP_KVGATE_PAGE_MAX) {
        return;
    }

    pg = ngx_http_kvgate_page_find(key);

    if (pg == NULL) {
        /* a free slot, else the one rendered longest ago (another
           configuration's first) */

        oldest = NULL;

        for (i = 0; i < NGX_HTTP_KVGATE_PAGE_SLOTS; i++) {
            pg = &ngx_http_kvgate_sh->pages[i];

            if (pg->data == NULL) {
                oldest = pg;
                break;
            }

            if (oldest == NULL
                || (pg->conf != ngx_http_kvgate_conf_id
                    && oldest->conf == ngx_http_kvgate_conf_id)
                || (ngx_msec_int_t) (pg->rendered - oldest->rendered) < 0)
            {
                oldest = pg;
            }
        }

        pg = oldest;
    }

    if (pg->data) {
        ngx_slab_free_locked(ngx_http_kvgate_shpool, pg->data);
        pg->data = NULL;
    }

    p = ngx_slab_alloc_locked(ngx_http_kvgate_shpool, len ? len : 1);
    if (p == NULL) {
        return;
    }

    pg->data = p;
    pg->len = len;
    pg->conf = ngx_http_kvgate_conf_id;
    pg->loc = key->loc;
    pg->kind = key->kind;
    pg->rendered = ngx_current_msec;

    for ( /* void */ ; in; in = in->next) {
        p = ngx_cpymem(p, in->buf->pos, in->buf->last - in->buf->pos);
    }
}
