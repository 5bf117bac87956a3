
/*
 * The pages: the shared counters (ngx_http_kvgate_metrics.c) and what the
 * engine counts (KV blocks, cache hits, evictions, tenants: its statistics
 * page, read through the worker's engine connection), served as Prometheus
 * text (kvgate_metrics) and as JSON (kvgate_status). Reads only.
 */


#include "ngx_http_kvgate_metrics.h"
#include "route.h"
#include "utf8.h"

#include <jansson.h>


/* ---- Prometheus text ---- */

typedef struct {
    ngx_pool_t  *pool;
    ngx_chain_t *head;
    ngx_chain_t **last;
    ngx_buf_t   *b;
    size_t       total;
    ngx_uint_t   failed;
} ngx_http_kvgate_text_t;


/* Renders a page into t: NGX_OK, or NGX_ERROR. */
typedef ngx_int_t (*ngx_http_kvgate_render_pt)(ngx_http_request_t *r,
    ngx_http_kvgate_text_t *t);


static ngx_int_t ngx_http_kvgate_page(ngx_http_request_t *r, ngx_uint_t kind,
    ngx_http_kvgate_render_pt render, const char *type);
static ngx_int_t ngx_http_kvgate_send_str(ngx_http_request_t *r,
    ngx_str_t *page, const char *type);
static ngx_int_t ngx_http_kvgate_metrics_render(ngx_http_request_t *r,
    ngx_http_kvgate_text_t *text);
static ngx_int_t ngx_http_kvgate_status_render(ngx_http_request_t *r,
    ngx_http_kvgate_text_t *t);


static void
ngx_http_kvgate_printf(ngx_http_kvgate_text_t *t, const char *fmt, ...)
{
    va_list       args;
    u_char       *p;
    ngx_chain_t  *cl;

    if (t->failed) {
        return;
    }

    if (t->b == NULL || t->b->end - t->b->last < 1024) {
        t->b = ngx_create_temp_buf(t->pool, 16384);
        cl = ngx_alloc_chain_link(t->pool);

        if (t->b == NULL || cl == NULL) {
            t->failed = 1;
            return;
        }

        cl->buf = t->b;
        cl->next = NULL;
        *t->last = cl;
        t->last = &cl->next;
    }

    va_start(args, fmt);
    p = ngx_vslprintf(t->b->last, t->b->end, fmt, args);
    va_end(args);

    t->total += p - t->b->last;
    t->b->last = p;
}


/*
 * A label value with '\', '"' and newlines escaped (Prometheus text format).
 * A tenant is any bytes a client sent, but Prometheus rejects a whole scrape
 * whose label values are not UTF-8: a byte that is not part of a valid
 * sequence is written as the four characters \xHH (as nginx's access log
 * writes it), so one odd tenant cannot blind the scrape.
 */

static u_char *
ngx_http_kvgate_label(ngx_pool_t *pool, const char *s)
{
    int                   len;
    size_t                n, i;
    u_char               *out, *p;
    uint32_t              cp;
    const unsigned char  *u = (const unsigned char *) s;

    n = ngx_strlen(s);
    out = ngx_pnalloc(pool, 5 * n + 1);
    if (out == NULL) {
        return (u_char *) "";
    }

    for (p = out, i = 0; i < n; /* void */) {
        if (u[i] == '\\' || u[i] == '"') {
            *p++ = '\\';
            *p++ = u[i++];

        } else if (u[i] == '\n') {
            *p++ = '\\';
            *p++ = 'n';
            i++;

        } else if (u[i] < 0x80) {
            *p++ = u[i++];

        } else if ((len = kvg_utf8_decode(u + i, n - i, &cp)) > 0) {
            p = ngx_cpymem(p, u + i, len);
            i += len;

        } else {
            p = ngx_sprintf(p, "\\\\x%02xui", (ngx_uint_t) u[i++]);
        }
    }

    *p = '\0';

    return out;
}


static void
ngx_http_kvgate_histogram(ngx_http_kvgate_text_t *t, const char *name,
    const char *help, ngx_http_kvgate_hist_t *h)
{
    ngx_uint_t  i, cum;

    ngx_http_kvgate_printf(t, "# HELP %s %s\n# TYPE %s histogram\n", name,
                           help, name);

    cum = 0;

    for (i = 0; i < NGX_HTTP_KVGATE_N_HIST; i++) {
        cum += h->count[i];
        ngx_http_kvgate_printf(t, "%s_bucket{le=\"%ui.%06ui\"} %ui\n", name,
                               ngx_http_kvgate_hist_us[i] / 1000000,
                               ngx_http_kvgate_hist_us[i] % 1000000, cum);
    }

    cum += h->count[i];
    ngx_http_kvgate_printf(t, "%s_bucket{le=\"+Inf\"} %ui\n", name, cum);
    ngx_http_kvgate_printf(t, "%s_sum %ui.%06ui\n%s_count %ui\n", name,
                           h->sum_us / 1000000, h->sum_us % 1000000, name,
                           h->n);
}


static ngx_int_t
ngx_http_kvgate_send_text(ngx_http_request_t *r, ngx_http_kvgate_text_t *t,
    const char *type)
{
    if (t->failed || t->head == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_kvgate_send_response(r, NGX_HTTP_OK, type,
                                         (off_t) t->total, t->head);
}


/*
 * A page (metrics or status JSON) as render makes it, or as it was last
 * rendered for this location when that is less than kvgate_page_refresh ago:
 * many scrapers cost one rendering a refresh, not one each. The cache is in
 * the shared zone and rendering happens under its lock, so every worker
 * serves the same page and pages go out in the order they were rendered: a
 * counter never goes back from one scrape to the next, whichever worker
 * answers (a cache per worker would let it).
 */

static ngx_int_t
ngx_http_kvgate_page(ngx_http_request_t *r, ngx_uint_t kind,
    ngx_http_kvgate_render_pt render, const char *type)
{
    ngx_int_t                    rc;
    ngx_str_t                    page;
    ngx_http_kvgate_text_t       t;
    ngx_http_kvgate_page_key_t   key;
    ngx_http_kvgate_loc_conf_t  *klcf;

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);

    if (klcf->page_refresh == 0) {
        if (render(r, &t) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_kvgate_send_text(r, &t, type);
    }

    key.kind = kind;
    key.loc = (uintptr_t) klcf;

    ngx_http_kvgate_pages_lock();

    if (ngx_http_kvgate_page_copy(&key, klcf->page_refresh, r->pool, &page)
        == NGX_OK)
    {
        ngx_http_kvgate_pages_unlock();
        return ngx_http_kvgate_send_str(r, &page, type);
    }

    rc = render(r, &t);

    if (rc == NGX_OK) {
        ngx_http_kvgate_page_store(&key, t.head, t.total);
    }

    ngx_http_kvgate_pages_unlock();

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_kvgate_send_text(r, &t, type);
}


static ngx_int_t
ngx_http_kvgate_send_str(ngx_http_request_t *r, ngx_str_t *page,
    const char *type)
{
    ngx_http_kvgate_text_t  t;

    ngx_memzero(&t, sizeof(t));
    t.b = ngx_calloc_buf(r->pool);
    t.head = ngx_alloc_chain_link(r->pool);

    if (t.b == NULL || t.head == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    t.b->pos = page->data;
    t.b->last = page->data + page->len;
    t.b->memory = 1;
    t.head->buf = t.b;
    t.head->next = NULL;
    t.total = page->len;

    return ngx_http_kvgate_send_text(r, &t, type);
}


/* GET and HEAD only, body discarded, the zone there (it is whenever
   kvgate_engine is configured). NGX_OK to go on, else what to return. */

static ngx_int_t
ngx_http_kvgate_get_only(ngx_http_request_t *r, const char *what)
{
    ngx_int_t  rc;
    u_char     msg[128];

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    if (ngx_http_kvgate_metrics_zone() == NULL) {
        ngx_snprintf(msg, sizeof(msg) - 1, "%s needs kvgate_engine%Z", what);
        return ngx_http_kvgate_send_error(r, NGX_HTTP_NOT_FOUND, NULL, NULL,
                                          (char *) msg, 0);
    }

    return NGX_OK;
}


/*
 * The unlabelled engine metrics and the JSON status's "engine" object are
 * those of the configuration's first engine (with kvgate_engine alone, the
 * engine); every engine has its labelled lines and its entry in "engines".
 */

static ngx_http_kvgate_engine_t *
ngx_http_kvgate_engines_of(ngx_http_request_t *r, ngx_uint_t *n)
{
    ngx_http_kvgate_main_conf_t  *kmcf;

    kmcf = ngx_http_get_module_main_conf(r, ngx_http_kvgate_module);
    *n = kmcf->engines.nelts;

    return *n ? ((ngx_http_kvgate_engine_t **) kmcf->engines.elts)[0] : NULL;
}


#define NGX_HTTP_KVGATE_N_ROUTE_NAMES  ((ngx_uint_t) KVG_ROUTED_N)


static void
ngx_http_kvgate_engine_lines(ngx_http_request_t *r,
    ngx_http_kvgate_text_t *t, ngx_http_kvgate_shctx_t *sh)
{
    ngx_uint_t                     i, k, n;
    ngx_http_kvgate_engine_t     **all;
    ngx_http_kvgate_main_conf_t   *kmcf;

    kmcf = ngx_http_get_module_main_conf(r, ngx_http_kvgate_module);
    all = kmcf->engines.elts;
    n = kmcf->engines.nelts;

    ngx_http_kvgate_printf(t,
        "# HELP kvgate_engine_connected Whether the worker serving this "
        "scrape is connected to the engine, by engine.\n"
        "# TYPE kvgate_engine_connected gauge\n");

    for (i = 0; i < n; i++) {
        ngx_http_kvgate_printf(t, "kvgate_engine_connected{engine=\"%V\"} "
                               "%ui\n", &all[i]->name,
                               ngx_http_kvgate_engine_up(all[i]));
    }

    ngx_http_kvgate_printf(t,
        "# HELP kvgate_engine_stalled Whether the worker serving this scrape "
        "takes the engine for stalled (connected, its heartbeat still for "
        "kvgate_engine_stall: no requests go to it), by engine.\n"
        "# TYPE kvgate_engine_stalled gauge\n");

    for (i = 0; i < n; i++) {
        ngx_http_kvgate_printf(t, "kvgate_engine_stalled{engine=\"%V\"} "
                               "%ui\n", &all[i]->name,
                               ngx_http_kvgate_engine_stalled(all[i]));
    }

    ngx_http_kvgate_printf(t,
        "# HELP kvgate_engine_stalls_total Times each engine was taken for "
        "stalled (once a stall, however many workers saw it).\n"
        "# TYPE kvgate_engine_stalls_total counter\n");

    for (i = 0; i < n; i++) {
        ngx_http_kvgate_printf(t, "kvgate_engine_stalls_total{engine=\"%V\"} "
                               "%uA\n", &all[i]->name,
                               sh->engine_stalls_e[i]);
    }

    ngx_http_kvgate_printf(t,
        "# HELP kvgate_engine_load_tokens The engine's load in tokens (to "
        "prefill and decode), as its statistics page says.\n"
        "# TYPE kvgate_engine_load_tokens gauge\n");

    for (i = 0; i < n; i++) {
        ngx_http_kvgate_printf(t, "kvgate_engine_load_tokens{engine=\"%V\"} "
                               "%uL\n", &all[i]->name,
                               all[i]->up
                               ? ngx_http_kvgate_engine_load(all[i]) : 0);
    }

    ngx_http_kvgate_printf(t,
        "# HELP kvgate_engine_workers Workers connected, by engine.\n"
        "# TYPE kvgate_engine_workers gauge\n");

    for (i = 0; i < n; i++) {
        ngx_http_kvgate_printf(t, "kvgate_engine_workers{engine=\"%V\"} "
                               "%ui\n", &all[i]->name,
                               ngx_http_kvgate_metrics_workers_connected(i));
    }

    ngx_http_kvgate_printf(t,
        "# HELP kvgate_engine_connections_total Connections made to and lost "
        "from each engine.\n"
        "# TYPE kvgate_engine_connections_total counter\n");

    for (i = 0; i < n; i++) {
        ngx_http_kvgate_printf(t,
            "kvgate_engine_connections_total{engine=\"%V\",event=\"connect\"}"
            " %uA\n"
            "kvgate_engine_connections_total{engine=\"%V\",event=\"loss\"}"
            " %uA\n", &all[i]->name, sh->engine_connects_e[i],
            &all[i]->name, sh->engine_disconnects_e[i]);
    }

    ngx_http_kvgate_printf(t,
        "# HELP kvgate_route_requests_total Requests routed to each engine, "
        "by why it was chosen.\n"
        "# TYPE kvgate_route_requests_total counter\n");

    for (i = 0; i < n; i++) {
        for (k = 0; k < NGX_HTTP_KVGATE_N_ROUTE_NAMES; k++) {
            ngx_http_kvgate_printf(t, "kvgate_route_requests_total{engine="
                                   "\"%V\",reason=\"%s\"} %uA\n",
                                   &all[i]->name,
                                   kvg_route_reason_name(
                                       (kvg_route_reason) k),
                                   sh->routed[i][k]);
        }
    }
}


/*
 * The engines' own statistics (their pool, cache, queue and tokens), one
 * sample per engine whose statistics page this worker can read, labelled
 * engine="NAME" like the other per-engine series. A family's HELP and TYPE
 * come once, before its samples (the text format wants them together).
 */

typedef enum {
    NGX_HTTP_KVGATE_ST_I32,
    NGX_HTTP_KVGATE_ST_U64,
    NGX_HTTP_KVGATE_ST_I64,
    NGX_HTTP_KVGATE_ST_F64
} ngx_http_kvgate_stat_kind_e;

typedef struct {
    const char                  *name;
    const char                  *help;    /* NULL: the family of the row above */
    const char                  *type;
    const char                  *label;   /* a second label, or NULL */
    size_t                       offset;  /* in kvg_stats */
    ngx_http_kvgate_stat_kind_e  kind;
} ngx_http_kvgate_engine_stat_t;

#define ngx_http_kvgate_st(field)  offsetof(kvg_stats, field)

static const ngx_http_kvgate_engine_stat_t  ngx_http_kvgate_engine_stats[] = {
    { "kvgate_engine_samples_started_total",
      "Samples that began decoding in the engine.", "counter", NULL,
      ngx_http_kvgate_st(samples_started), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_engine_samples_cancelled_total",
      "Samples cancelled while running (a self-consistency vote was decided).",
      "counter", NULL,
      ngx_http_kvgate_st(samples_cancelled), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_engine_samples_dropped_total",
      "Samples dropped before they started (never drawn).", "counter", NULL,
      ngx_http_kvgate_st(samples_dropped), NGX_HTTP_KVGATE_ST_U64 },

    { "kvgate_kv_blocks", "KV pool blocks by state.", "gauge",
      "state=\"free\"", ngx_http_kvgate_st(blocks_free),
      NGX_HTTP_KVGATE_ST_I32 },
    { "kvgate_kv_blocks", NULL, NULL, "state=\"cached\"",
      ngx_http_kvgate_st(blocks_cached), NGX_HTTP_KVGATE_ST_I32 },
    { "kvgate_kv_blocks", NULL, NULL, "state=\"used\"",
      ngx_http_kvgate_st(blocks_used), NGX_HTTP_KVGATE_ST_I32 },
    { "kvgate_kv_blocks", NULL, NULL, "state=\"pinned\"",
      ngx_http_kvgate_st(blocks_pinned), NGX_HTTP_KVGATE_ST_I32 },
    { "kvgate_kv_pool_blocks", "KV pool size in blocks.", "gauge", NULL,
      ngx_http_kvgate_st(blocks_total), NGX_HTTP_KVGATE_ST_I32 },

    { "kvgate_prefix_cache_query_tokens_total",
      "Prompt tokens looked up in the prefix cache.", "counter", NULL,
      ngx_http_kvgate_st(query_tokens), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_prefix_cache_hit_tokens_total",
      "Of those, tokens served from the cache.", "counter", NULL,
      ngx_http_kvgate_st(hit_tokens), NGX_HTTP_KVGATE_ST_U64 },

    { "kvgate_kv_evictions_total", "Cached blocks evicted, by cause.",
      "counter", "cause=\"lru\"", ngx_http_kvgate_st(evictions_lru),
      NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_evictions_total", NULL, NULL, "cause=\"ttl\"",
      ngx_http_kvgate_st(evictions_ttl), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_evictions_total", NULL, NULL, "cause=\"quota\"",
      ngx_http_kvgate_st(evictions_quota), NGX_HTTP_KVGATE_ST_U64 },

    /* the KV host tier (engine --kv-host-memory): 0 without one */
    { "kvgate_kv_host_slots", "KV host memory tier slots (one block each), by state.",
      "gauge", "state=\"total\"", ngx_http_kvgate_st(host_slots_total),
      NGX_HTTP_KVGATE_ST_I64 },
    { "kvgate_kv_host_slots", NULL, NULL, "state=\"used\"",
      ngx_http_kvgate_st(host_slots_used), NGX_HTTP_KVGATE_ST_I64 },
    { "kvgate_kv_host_hit_tokens_total",
      "Prompt tokens served from the KV host memory tier.", "counter", NULL,
      ngx_http_kvgate_st(host_hit_tokens), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_host_blocks_total",
      "KV blocks copied between the device and host memory.",
      "counter", "direction=\"to_device\"", ngx_http_kvgate_st(host_blocks_in),
      NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_host_blocks_total", NULL, NULL, "direction=\"to_host\"",
      ngx_http_kvgate_st(host_blocks_out), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_host_bytes_total",
      "Bytes copied between the device and host memory.",
      "counter", "direction=\"to_device\"", ngx_http_kvgate_st(host_bytes_in),
      NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_host_bytes_total", NULL, NULL, "direction=\"to_host\"",
      ngx_http_kvgate_st(host_bytes_out), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_host_seconds_total",
      "Time the engine spent queueing host tier copies.", "counter", NULL,
      ngx_http_kvgate_st(host_seconds), NGX_HTTP_KVGATE_ST_F64 },
    { "kvgate_kv_host_events_total",
      "KV host tier events: slots given to newer blocks, and of those the "
      "blocks moved on to the disk tier.", "counter",
      "event=\"eviction\"", ngx_http_kvgate_st(host_evictions),
      NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_host_events_total", NULL, NULL, "event=\"to_disk\"",
      ngx_http_kvgate_st(host_spilled), NGX_HTTP_KVGATE_ST_U64 },

    /* the KV disk tier (engine --kv-disk): 0 without one */
    { "kvgate_kv_disk_slots", "KV disk tier slots (one block each), by state.",
      "gauge", "state=\"total\"", ngx_http_kvgate_st(disk_slots_total),
      NGX_HTTP_KVGATE_ST_I64 },
    { "kvgate_kv_disk_slots", NULL, NULL, "state=\"used\"",
      ngx_http_kvgate_st(disk_slots_used), NGX_HTTP_KVGATE_ST_I64 },
    { "kvgate_kv_disk_hit_tokens_total",
      "Prompt tokens served from the KV disk tier.", "counter", NULL,
      ngx_http_kvgate_st(disk_hit_tokens), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_disk_blocks_total", "KV blocks moved to and from disk.",
      "counter", "direction=\"read\"", ngx_http_kvgate_st(disk_blocks_read),
      NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_disk_blocks_total", NULL, NULL, "direction=\"write\"",
      ngx_http_kvgate_st(disk_blocks_written), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_disk_reader_blocks_total",
      "Of the blocks read from disk, those read by the disk tier's reader "
      "thread while the other requests ran (the rest came from the write "
      "queue's copies).", "counter", NULL,
      ngx_http_kvgate_st(disk_reader_blocks), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_disk_reads_in_flight",
      "Disk tier reads queued or being read now.", "gauge", NULL,
      ngx_http_kvgate_st(disk_reads_in_flight), NGX_HTTP_KVGATE_ST_I64 },
    { "kvgate_kv_disk_bytes_total", "Bytes moved to and from disk.",
      "counter", "direction=\"read\"", ngx_http_kvgate_st(disk_bytes_read),
      NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_disk_bytes_total", NULL, NULL, "direction=\"write\"",
      ngx_http_kvgate_st(disk_bytes_written), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_disk_seconds_total", "Time in disk reads and writes.",
      "counter", "direction=\"read\"", ngx_http_kvgate_st(disk_read_seconds),
      NGX_HTTP_KVGATE_ST_F64 },
    { "kvgate_kv_disk_seconds_total", NULL, NULL, "direction=\"write\"",
      ngx_http_kvgate_st(disk_write_seconds), NGX_HTTP_KVGATE_ST_F64 },
    { "kvgate_kv_disk_events_total",
      "KV disk tier events: blocks evicted by the size bound or a quota (and "
      "of those by a tenant at its quota), dropped past their expiry, not "
      "written (write queue full), reads not started (read staging full: "
      "recomputed), failing their checksum, I/O errors.", "counter",
      "event=\"eviction\"", ngx_http_kvgate_st(disk_evictions),
      NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_disk_events_total", NULL, NULL, "event=\"quota_eviction\"",
      ngx_http_kvgate_st(disk_quota_evictions), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_disk_events_total", NULL, NULL, "event=\"expired\"",
      ngx_http_kvgate_st(disk_expired), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_disk_events_total", NULL, NULL, "event=\"staging_full\"",
      ngx_http_kvgate_st(disk_staging_full), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_disk_events_total", NULL, NULL, "event=\"dropped\"",
      ngx_http_kvgate_st(disk_dropped), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_disk_events_total", NULL, NULL, "event=\"corrupt\"",
      ngx_http_kvgate_st(disk_corrupt), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_kv_disk_events_total", NULL, NULL, "event=\"io_error\"",
      ngx_http_kvgate_st(disk_io_errors), NGX_HTTP_KVGATE_ST_U64 },

    { "kvgate_engine_requests", "Requests in the engine now.", "gauge",
      "state=\"waiting\"", ngx_http_kvgate_st(waiting),
      NGX_HTTP_KVGATE_ST_I32 },
    { "kvgate_engine_requests", NULL, NULL, "state=\"running\"",
      ngx_http_kvgate_st(running), NGX_HTTP_KVGATE_ST_I32 },
    /* held: held in the engine's scheduler (kvg_sched_hold), paused by their
       gateway or backlogged (their output piles up unread in the engine) */
    { "kvgate_engine_requests", NULL, NULL, "state=\"held\"",
      ngx_http_kvgate_st(held), NGX_HTTP_KVGATE_ST_I32 },
    { "kvgate_engine_steps_total", "Forward steps run.", "counter", NULL,
      ngx_http_kvgate_st(steps), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_engine_preemptions_total",
      "Requests preempted when the pool ran out.", "counter", NULL,
      ngx_http_kvgate_st(preemptions), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_engine_tokens_total", "Tokens computed, by phase.", "counter",
      "phase=\"prefill\"", ngx_http_kvgate_st(prefill_tokens),
      NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_engine_tokens_total", NULL, NULL, "phase=\"decode\"",
      ngx_http_kvgate_st(decode_tokens), NGX_HTTP_KVGATE_ST_U64 },
    { "kvgate_engine_clients", "Processes connected to the engine.", "gauge",
      NULL, ngx_http_kvgate_st(clients), NGX_HTTP_KVGATE_ST_I32 },
    { "kvgate_engine_paused_requests",
      "Requests paused by their gateway now (their client is not reading; "
      "counted in state=\"held\" too).", "gauge", NULL,
      ngx_http_kvgate_st(paused), NGX_HTTP_KVGATE_ST_I32 },

    { "kvgate_tenant_cached_blocks_other",
      "Cached KV blocks of the tenants not listed.", "gauge", NULL,
      ngx_http_kvgate_st(other_cached_blocks), NGX_HTTP_KVGATE_ST_I32 },
    { "kvgate_tenants_other", "Tenants with cached blocks not listed.",
      "gauge", NULL, ngx_http_kvgate_st(other_tenants),
      NGX_HTTP_KVGATE_ST_I32 },
    { "kvgate_engine_tenants",
      "Tenants the engine holds state for (queued or running requests, or "
      "cached blocks).", "gauge", NULL, ngx_http_kvgate_st(live_tenants),
      NGX_HTTP_KVGATE_ST_I32 },
};


static void
ngx_http_kvgate_engine_stats_lines(ngx_http_request_t *r,
    ngx_http_kvgate_text_t *t)
{
    ngx_uint_t                            i, k, j, n;
    kvg_stats                            *st;
    ngx_uint_t                           *have;
    const u_char                         *p;
    ngx_http_kvgate_engine_t            **all;
    ngx_http_kvgate_main_conf_t          *kmcf;
    const ngx_http_kvgate_engine_stat_t  *m;

    kmcf = ngx_http_get_module_main_conf(r, ngx_http_kvgate_module);
    all = kmcf->engines.elts;
    n = kmcf->engines.nelts;

    if (n == 0) {
        return;
    }

    st = ngx_palloc(r->pool, n * sizeof(kvg_stats));
    have = ngx_pcalloc(r->pool, n * sizeof(ngx_uint_t));
    if (st == NULL || have == NULL) {
        return;
    }

    for (i = 0; i < n; i++) {
        have[i] = ngx_http_kvgate_engine_read_stats(all[i], &st[i]) == NGX_OK;
    }

    for (k = 0; k < sizeof(ngx_http_kvgate_engine_stats)
                    / sizeof(ngx_http_kvgate_engine_stats[0]); k++)
    {
        m = &ngx_http_kvgate_engine_stats[k];

        if (m->help) {
            ngx_http_kvgate_printf(t, "# HELP %s %s\n# TYPE %s %s\n",
                                   m->name, m->help, m->name, m->type);
        }

        for (i = 0; i < n; i++) {
            if (!have[i]) {
                continue;
            }

            p = (const u_char *) &st[i] + m->offset;

            ngx_http_kvgate_printf(t, "%s{engine=\"%V\"%s%s} ", m->name,
                                   &all[i]->name, m->label ? "," : "",
                                   m->label ? m->label : "");

            if (m->kind == NGX_HTTP_KVGATE_ST_I32) {
                ngx_http_kvgate_printf(t, "%D\n", *(const int32_t *) p);

            } else if (m->kind == NGX_HTTP_KVGATE_ST_I64) {
                ngx_http_kvgate_printf(t, "%L\n", *(const int64_t *) p);

            } else if (m->kind == NGX_HTTP_KVGATE_ST_F64) {
                ngx_http_kvgate_printf(t, "%.6f\n", *(const double *) p);

            } else {
                ngx_http_kvgate_printf(t, "%uL\n", *(const uint64_t *) p);
            }
        }

        /* the hit rate, a ratio of the two counters, after them */

        if (m->offset == ngx_http_kvgate_st(hit_tokens)) {
            ngx_http_kvgate_printf(t,
                "# HELP kvgate_prefix_cache_hit_rate Hit tokens / query "
                "tokens since the engine started.\n"
                "# TYPE kvgate_prefix_cache_hit_rate gauge\n");

            for (i = 0; i < n; i++) {
                if (have[i]) {
                    ngx_http_kvgate_printf(t,
                        "kvgate_prefix_cache_hit_rate{engine=\"%V\"} %.4f\n",
                        &all[i]->name, st[i].query_tokens
                        ? (double) st[i].hit_tokens / st[i].query_tokens
                        : 0.0);
                }
            }
        }

        /* the top tenants by cached blocks, before the rest of them */

        if (m->offset == ngx_http_kvgate_st(paused)) {
            ngx_http_kvgate_printf(t,
                "# HELP kvgate_tenant_cached_blocks Cached KV blocks of the "
                "%d tenants holding the most (others summed below).\n"
                "# TYPE kvgate_tenant_cached_blocks gauge\n",
                KVG_STATS_TENANTS);

            for (i = 0; i < n; i++) {
                for (j = 0; have[i] && j < (ngx_uint_t) st[i].n_tenants
                            && j < KVG_STATS_TENANTS; j++)
                {
                    st[i].tenant[j].name[KVG_PROTO_MAX_SALT] = '\0';
                    ngx_http_kvgate_printf(t,
                        "kvgate_tenant_cached_blocks{engine=\"%V\","
                        "tenant=\"%s\"} %D\n", &all[i]->name,
                        ngx_http_kvgate_label(r->pool, st[i].tenant[j].name),
                        st[i].tenant[j].cached_blocks);
                }
            }
        }
    }
}


ngx_int_t
ngx_http_kvgate_metrics_handler(ngx_http_request_t *r)
{
    ngx_int_t  rc;

    rc = ngx_http_kvgate_get_only(r, "kvgate_metrics");
    if (rc != NGX_OK) {
        return rc;
    }

    return ngx_http_kvgate_page(r, NGX_HTTP_KVGATE_METRICS,
                                ngx_http_kvgate_metrics_render,
                                "text/plain; version=0.0.4; charset=utf-8");
}


/*
 * kvgate_limit_tokens_zone: per zone and key, the tokens and requests of the
 * NGX_HTTP_KVGATE_LIMIT_KEYS keys that used the most tokens, the others
 * summed per zone in the kvgate_limit_other_* series (as the per-tenant cache
 * gauges are), so the cardinality stays bounded whatever keys clients send.
 */

static void
ngx_http_kvgate_limit_lines(ngx_http_request_t *r, ngx_http_kvgate_text_t *t)
{
    ngx_uint_t                      i, j, m;
    ngx_array_t                    *snaps;
    ngx_http_kvgate_limit_snap_t   *snap;
    ngx_http_kvgate_limit_counts_t *c;

    static const struct {
        const char  *name;
        const char  *other;
        const char  *help;
        size_t       offset;
    } metrics[] = {
        { "kvgate_limit_prompt_tokens_total",
          "kvgate_limit_other_prompt_tokens_total",
          "Prompt tokens of the requests admitted by kvgate_limit_tokens, "
          "by zone and key.",
          offsetof(ngx_http_kvgate_limit_counts_t, prompt) },
        { "kvgate_limit_cached_tokens_total",
          "kvgate_limit_other_cached_tokens_total",
          "Of those, prompt tokens served from the tenant's cache.",
          offsetof(ngx_http_kvgate_limit_counts_t, cached) },
        { "kvgate_limit_completion_tokens_total",
          "kvgate_limit_other_completion_tokens_total",
          "Completion tokens of the requests admitted by "
          "kvgate_limit_tokens.",
          offsetof(ngx_http_kvgate_limit_counts_t, completion) },
        { "kvgate_limit_requests_total",
          "kvgate_limit_other_requests_total",
          "Requests admitted by kvgate_limit_tokens.",
          offsetof(ngx_http_kvgate_limit_counts_t, requests) },
        { "kvgate_limit_refused_total",
          "kvgate_limit_other_refused_total",
          "Requests refused (429) by kvgate_limit_tokens.",
          offsetof(ngx_http_kvgate_limit_counts_t, refused) },
    };

    snaps = ngx_http_kvgate_limit_snapshot(r);

    if (snaps == NULL) {
        t->failed = 1;
        return;
    }

    if (snaps->nelts == 0) {
        return;
    }

    snap = snaps->elts;

    for (m = 0; m < sizeof(metrics) / sizeof(metrics[0]); m++) {
        ngx_http_kvgate_printf(t,
            "# HELP %s %s The %d keys with the most tokens per zone; the "
            "others summed in %s.\n"
            "# TYPE %s counter\n",
            metrics[m].name, metrics[m].help, NGX_HTTP_KVGATE_LIMIT_KEYS,
            metrics[m].other, metrics[m].name);

        for (i = 0; i < snaps->nelts; i++) {
            for (j = 0; j < snap[i].n_rows; j++) {
                c = &snap[i].rows[j].counts;
                ngx_http_kvgate_printf(t, "%s{zone=\"%V\",key=\"%s\"} %uL\n",
                    metrics[m].name, &snap[i].name,
                    ngx_http_kvgate_label(r->pool, snap[i].rows[j].key),
                    *(uint64_t *) ((u_char *) c + metrics[m].offset));
            }
        }

        ngx_http_kvgate_printf(t,
            "# HELP %s The same as %s, summed over the keys not listed.\n"
            "# TYPE %s counter\n", metrics[m].other, metrics[m].name,
            metrics[m].other);

        for (i = 0; i < snaps->nelts; i++) {
            c = &snap[i].other;
            ngx_http_kvgate_printf(t, "%s{zone=\"%V\"} %uL\n",
                metrics[m].other, &snap[i].name,
                *(uint64_t *) ((u_char *) c + metrics[m].offset));
        }
    }

    ngx_http_kvgate_printf(t,
        "# HELP kvgate_limit_keys Keys held by a kvgate_limit_tokens_zone.\n"
        "# TYPE kvgate_limit_keys gauge\n");

    for (i = 0; i < snaps->nelts; i++) {
        ngx_http_kvgate_printf(t, "kvgate_limit_keys{zone=\"%V\"} %ui\n",
                               &snap[i].name, snap[i].keys);
    }

    ngx_http_kvgate_printf(t,
        "# HELP kvgate_limit_keys_reclaimed_total Keys reclaimed (least "
        "recently used) when the zone was full.\n"
        "# TYPE kvgate_limit_keys_reclaimed_total counter\n");

    for (i = 0; i < snaps->nelts; i++) {
        ngx_http_kvgate_printf(t,
                               "kvgate_limit_keys_reclaimed_total{zone=\"%V\"} "
                               "%ui\n", &snap[i].name, snap[i].reclaimed);
    }
}


static json_t *
ngx_http_kvgate_limit_counts_json(ngx_http_kvgate_limit_counts_t *c)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:I}",
                     "prompt_tokens", (json_int_t) c->prompt,
                     "cached_tokens", (json_int_t) c->cached,
                     "completion_tokens", (json_int_t) c->completion,
                     "requests", (json_int_t) c->requests,
                     "refused", (json_int_t) c->refused);
}


static json_t *
ngx_http_kvgate_limit_json(ngx_http_request_t *r)
{
    ngx_uint_t                     i, j;
    json_t                        *zones, *z, *keys, *k, *v;
    ngx_array_t                   *snaps;
    ngx_http_kvgate_limit_snap_t  *snap;

    snaps = ngx_http_kvgate_limit_snapshot(r);
    if (snaps == NULL) {
        return NULL;
    }

    zones = json_array();
    snap = snaps->elts;

    for (i = 0; zones && i < snaps->nelts; i++) {
        keys = json_array();

        for (j = 0; keys && j < snap[i].n_rows; j++) {
            k = ngx_http_kvgate_limit_counts_json(&snap[i].rows[j].counts);
            if (k == NULL) {
                continue;
            }

            v = json_string(snap[i].rows[j].key);
            json_object_set_new(k, "key", v ? v : json_string("?"));
            json_object_set_new(k, "tokens_left",
                                json_real(snap[i].rows[j].level));
            json_array_append_new(keys, k);
        }

        z = json_pack("{s:s%, s:I, s:I, s:o, s:o, s:o}",
                      "zone", (char *) snap[i].name.data,
                      (size_t) snap[i].name.len,
                      "keys", (json_int_t) snap[i].keys,
                      "reclaimed", (json_int_t) snap[i].reclaimed,
                      "total",
                      ngx_http_kvgate_limit_counts_json(&snap[i].total),
                      "other",
                      ngx_http_kvgate_limit_counts_json(&snap[i].other),
                      "top", keys ? keys : json_array());
        if (z) {
            json_array_append_new(zones, z);
        }
    }

    return zones;
}


static ngx_int_t
ngx_http_kvgate_metrics_render(ngx_http_request_t *r,
    ngx_http_kvgate_text_t *text)
{
    ngx_uint_t                   e, b, s, i, any;
    const char                  *blabel;
    ngx_http_kvgate_text_t       t;
    ngx_http_kvgate_shctx_t     *sh = ngx_http_kvgate_metrics_zone();
    ngx_http_kvgate_loc_conf_t  *klcf;
    const kvg_engine_info       *info;
    ngx_uint_t                   n_engines;
    ngx_http_kvgate_engine_t    *e0;

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);

    ngx_memzero(&t, sizeof(t));
    t.pool = r->pool;
    t.last = &t.head;

    ngx_http_kvgate_printf(&t,
        "# HELP kvgate_requests_total Requests answered by the gateway, by "
        "endpoint, length bucket and HTTP status.\n"
        "# TYPE kvgate_requests_total counter\n");

    any = 0;

    for (e = 0; e < NGX_HTTP_KVGATE_EP_N; e++) {
        for (b = 0; b < NGX_HTTP_KVGATE_BUCKET_N; b++) {
            blabel = b == NGX_HTTP_KVGATE_BUCKET_NONE
                     ? "none" : kvg_bucket_label(&klcf->buckets, b);

            for (s = 0; s < NGX_HTTP_KVGATE_N_STATUSES; s++) {
                if (sh->requests[e][b][s] == 0) {
                    continue;
                }

                any = 1;

                if (ngx_http_kvgate_statuses[s]) {
                    ngx_http_kvgate_printf(&t,
                        "kvgate_requests_total{endpoint=\"%s\",bucket=\"%s\","
                        "status=\"%ui\"} %uA\n", ngx_http_kvgate_ep_names[e],
                        blabel, ngx_http_kvgate_statuses[s],
                        sh->requests[e][b][s]);

                } else {
                    ngx_http_kvgate_printf(&t,
                        "kvgate_requests_total{endpoint=\"%s\",bucket=\"%s\","
                        "status=\"other\"} %uA\n",
                        ngx_http_kvgate_ep_names[e], blabel,
                        sh->requests[e][b][s]);
                }
            }
        }
    }

    if (!any) {
        ngx_http_kvgate_printf(&t, "kvgate_requests_total{endpoint=\"chat\","
                               "bucket=\"none\",status=\"200\"} 0\n");
    }

#define ngx_http_kvgate_per_bucket(field, name, help)                         \
    ngx_http_kvgate_printf(&t, "# HELP " name " " help "\n"                   \
                           "# TYPE " name " counter\n");                      \
    for (b = 0; b <= kvg_buckets_count(&klcf->buckets) - 1; b++) {            \
        ngx_http_kvgate_printf(&t, name "{bucket=\"%s\"} %uA\n",              \
                               kvg_bucket_label(&klcf->buckets, b),           \
                               sh->field[b]);                                 \
    }

    ngx_http_kvgate_per_bucket(prompt_tokens, "kvgate_prompt_tokens_total",
                               "Prompt tokens of completed requests.")
    ngx_http_kvgate_per_bucket(cached_tokens, "kvgate_cached_tokens_total",
                               "Prompt tokens served from the caller's own "
                               "tenant's prefix cache.")
    ngx_http_kvgate_per_bucket(completion_tokens,
                               "kvgate_completion_tokens_total",
                               "Generated tokens of completed requests.")

#undef ngx_http_kvgate_per_bucket

    ngx_http_kvgate_printf(&t,
        "# HELP kvgate_cache_lookups_total Requests by how much of their "
        "prompt the cache served.\n# TYPE kvgate_cache_lookups_total counter\n");

    for (i = 0; i < NGX_HTTP_KVGATE_N_CACHE; i++) {
        ngx_http_kvgate_printf(&t, "kvgate_cache_lookups_total{result=\"%s\"} "
                               "%uA\n", ngx_http_kvgate_cache_names[i],
                               sh->cache_status[i]);
    }

    ngx_http_kvgate_histogram(&t, "kvgate_time_to_first_token_seconds",
                              "Time from the request's arrival to its first "
                              "generated token.", &sh->ttft);
    ngx_http_kvgate_histogram(&t, "kvgate_request_duration_seconds",
                              "Time from the request's arrival to its last "
                              "byte.", &sh->latency);

    e0 = ngx_http_kvgate_engines_of(r, &n_engines);
    info = e0 ? ngx_http_kvgate_engine_info(e0) : NULL;

    ngx_http_kvgate_engine_lines(r, &t, sh);

    ngx_http_kvgate_printf(&t,
        "# HELP kvgate_engine_up Whether the worker serving this scrape is "
        "connected to the (first) engine; kvgate_engine_connected has each.\n"
        "# TYPE kvgate_engine_up gauge\n"
        "kvgate_engine_up %ui\n"
        "# HELP kvgate_engine_workers_connected Workers connected to the "
        "engine.\n# TYPE kvgate_engine_workers_connected gauge\n"
        "kvgate_engine_workers_connected %ui\n"
        "# HELP kvgate_engine_connects_total Connections made to the engine.\n"
        "# TYPE kvgate_engine_connects_total counter\n"
        "kvgate_engine_connects_total %uA\n"
        "# HELP kvgate_engine_disconnects_total Connections to the engine "
        "lost.\n# TYPE kvgate_engine_disconnects_total counter\n"
        "kvgate_engine_disconnects_total %uA\n"
        "# HELP kvgate_submit_waits_total Requests that waited in a worker "
        "for room in its submission ring.\n"
        "# TYPE kvgate_submit_waits_total counter\n"
        "kvgate_submit_waits_total %uA\n",
        info ? 1 : 0, ngx_http_kvgate_metrics_workers_connected(0),
        sh->engine_connects,
        sh->engine_disconnects, sh->submit_waits);

    ngx_http_kvgate_printf(&t,
        "# HELP kvgate_backpressure_total Streams paused in the engine because "
        "their client did not read (kvgate_max_unsent), resumed when it "
        "drained, and closed at send_timeout.\n"
        "# TYPE kvgate_backpressure_total counter\n"
        "kvgate_backpressure_total{event=\"pause\"} %uA\n"
        "kvgate_backpressure_total{event=\"resume\"} %uA\n"
        "kvgate_backpressure_total{event=\"send_timeout\"} %uA\n",
        sh->backpressure[NGX_HTTP_KVGATE_BP_PAUSE],
        sh->backpressure[NGX_HTTP_KVGATE_BP_RESUME],
        sh->backpressure[NGX_HTTP_KVGATE_BP_TIMEOUT]);

    ngx_http_kvgate_printf(&t,
        "# HELP kvgate_tenant_wipes_total Tenant wipes answered by "
        "kvgate_admin: every engine of the group wiped (ok) or not "
        "(failed: an engine down, stalled, silent or refusing).\n"
        "# TYPE kvgate_tenant_wipes_total counter\n"
        "kvgate_tenant_wipes_total{result=\"ok\"} %uA\n"
        "kvgate_tenant_wipes_total{result=\"failed\"} %uA\n"
        "# HELP kvgate_tenant_wiped_blocks_total KV blocks the engines "
        "dropped for tenant wipes, by tier.\n"
        "# TYPE kvgate_tenant_wiped_blocks_total counter\n"
        "kvgate_tenant_wiped_blocks_total{tier=\"pool\"} %uA\n"
        "kvgate_tenant_wiped_blocks_total{tier=\"host\"} %uA\n"
        "kvgate_tenant_wiped_blocks_total{tier=\"disk\"} %uA\n",
        sh->wipes[1], sh->wipes[0], sh->wiped_blocks[0],
        sh->wiped_blocks[1], sh->wiped_blocks[2]);

    ngx_http_kvgate_printf(&t,
        "# HELP kvgate_sc_requests_total Self-consistency requests (with a "
        "kvgate.vote) whose samples ran to a vote.\n"
        "# TYPE kvgate_sc_requests_total counter\n"
        "kvgate_sc_requests_total %uA\n"
        "# HELP kvgate_sc_samples_asked_total Samples those requests asked "
        "for (n).\n"
        "# TYPE kvgate_sc_samples_asked_total counter\n"
        "kvgate_sc_samples_asked_total %uA\n"
        "# HELP kvgate_sc_samples_run_total Samples of those requests drawn "
        "(started in the engine).\n"
        "# TYPE kvgate_sc_samples_run_total counter\n"
        "kvgate_sc_samples_run_total %uA\n"
        "# HELP kvgate_sc_early_stops_total Those requests whose decided "
        "vote saved samples: some were cancelled or never drawn.\n"
        "# TYPE kvgate_sc_early_stops_total counter\n"
        "kvgate_sc_early_stops_total %uA\n"
        "# HELP kvgate_sc_answer_pattern_refusals_total Self-consistency "
        "requests refused (422) because their answer_pattern ran out of "
        "matching steps (kvgate_answer_pattern_steps).\n"
        "# TYPE kvgate_sc_answer_pattern_refusals_total counter\n"
        "kvgate_sc_answer_pattern_refusals_total %uA\n",
        sh->sc_requests, sh->sc_samples_asked, sh->sc_samples_run,
        sh->sc_early_stops, sh->sc_pattern_refusals);

    ngx_http_kvgate_engine_stats_lines(r, &t);
    ngx_http_kvgate_limit_lines(r, &t);

    *text = t;

    return t.failed ? NGX_ERROR : NGX_OK;
}


/* ---- JSON status ---- */

/* The engine's KV pool and prefix cache, as "kv" and "cache" say them (the
   top-level ones for the first engine, and each entry of "engines"). */

static json_t *
ngx_http_kvgate_status_kv(const kvg_stats *st)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i}",
                     "blocks_total", (json_int_t) st->blocks_total,
                     "free", (json_int_t) st->blocks_free,
                     "cached", (json_int_t) st->blocks_cached,
                     "used", (json_int_t) st->blocks_used,
                     "pinned", (json_int_t) st->blocks_pinned,
                     "block_tokens", (json_int_t) st->block_tokens);
}


static json_t *
ngx_http_kvgate_status_cache(const kvg_stats *st)
{
    json_t  *c;

    c = json_pack("{s:I, s:I, s:f, s:{s:I, s:I, s:I}}",
                     "query_tokens", (json_int_t) st->query_tokens,
                     "hit_tokens", (json_int_t) st->hit_tokens,
                     "hit_rate", st->query_tokens
                         ? (double) st->hit_tokens / st->query_tokens : 0.0,
                     "evictions", "lru", (json_int_t) st->evictions_lru,
                     "ttl", (json_int_t) st->evictions_ttl,
                     "quota", (json_int_t) st->evictions_quota);

    /* the host and disk tiers, only where the engine has them */

    if (c != NULL && st->host_slots_total > 0) {
        json_object_set_new(c, "host", json_pack(
            "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I}",
            "slots_total", (json_int_t) st->host_slots_total,
            "slots_used", (json_int_t) st->host_slots_used,
            "hit_tokens", (json_int_t) st->host_hit_tokens,
            "blocks_to_device", (json_int_t) st->host_blocks_in,
            "blocks_to_host", (json_int_t) st->host_blocks_out,
            "bytes_to_device", (json_int_t) st->host_bytes_in,
            "bytes_to_host", (json_int_t) st->host_bytes_out,
            "seconds", st->host_seconds,
            "evictions", (json_int_t) st->host_evictions,
            "to_disk", (json_int_t) st->host_spilled));
    }

    if (c != NULL && st->disk_slots_total > 0) {
        json_object_set_new(c, "disk", json_pack(
            "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I,"
            " s:I, s:I, s:I}",
            "slots_total", (json_int_t) st->disk_slots_total,
            "slots_used", (json_int_t) st->disk_slots_used,
            "hit_tokens", (json_int_t) st->disk_hit_tokens,
            "blocks_read", (json_int_t) st->disk_blocks_read,
            "blocks_written", (json_int_t) st->disk_blocks_written,
            "bytes_read", (json_int_t) st->disk_bytes_read,
            "bytes_written", (json_int_t) st->disk_bytes_written,
            "read_seconds", st->disk_read_seconds,
            "write_seconds", st->disk_write_seconds,
            "evictions", (json_int_t) st->disk_evictions,
            "dropped", (json_int_t) st->disk_dropped,
            "corrupt", (json_int_t) st->disk_corrupt,
            "io_errors", (json_int_t) st->disk_io_errors,
            "quota_evictions", (json_int_t) st->disk_quota_evictions,
            "expired", (json_int_t) st->disk_expired,
            "reader_blocks", (json_int_t) st->disk_reader_blocks,
            "staging_full", (json_int_t) st->disk_staging_full,
            "reads_in_flight", (json_int_t) st->disk_reads_in_flight));
    }

    return c;
}


/* The engine's chat template: which, from where (chat_template.h). */

static json_t *
ngx_http_kvgate_chat_template_json(const kvg_chat_template_info *t)
{
    return json_pack("{s:s, s:s, s:s}", "name", t->name, "source", t->source,
                     "sha256", t->sha256);
}


/* "engines": every engine of the configuration, as this worker sees it;
   with its statistics page readable, its pool, cache, queue and tokens too
   (the status page draws one panel per engine from these). */

static void
ngx_http_kvgate_status_engines(ngx_http_request_t *r, json_t *root)
{
    json_t                        *arr, *o, *routed;
    ngx_uint_t                     i, k;
    kvg_stats                      st;
    const kvg_engine_info         *info;
    ngx_http_kvgate_engine_t     **all;
    ngx_http_kvgate_main_conf_t   *kmcf;
    ngx_http_kvgate_shctx_t       *sh = ngx_http_kvgate_metrics_zone();

    kmcf = ngx_http_get_module_main_conf(r, ngx_http_kvgate_module);
    all = kmcf->engines.elts;

    arr = json_array();

    for (i = 0; i < kmcf->engines.nelts; i++) {
        info = ngx_http_kvgate_engine_info(all[i]);

        o = json_object();
        json_object_set_new(o, "name", json_stringn((char *) all[i]->name.data,
                                                    all[i]->name.len));
        json_object_set_new(o, "socket", json_string(all[i]->path));
        json_object_set_new(o, "up", json_boolean(info != NULL));
        json_object_set_new(o, "stalled", json_boolean(
            ngx_http_kvgate_engine_stalled(all[i])));
        json_object_set_new(o, "stalls", json_integer(
            (json_int_t) sh->engine_stalls_e[i]));
        json_object_set_new(o, "workers_connected", json_integer(
            (json_int_t) ngx_http_kvgate_metrics_workers_connected(i)));

        if (info == NULL || ngx_http_kvgate_engine_stalled(all[i])) {
            json_object_set_new(o, "reason", json_string(
                ngx_http_kvgate_engine_down_reason(all[i])));
        }

        if (info != NULL) {
            json_object_set_new(o, "model", json_string(info->model_name));
            json_object_set_new(o, "model_id",
                                json_string(info->model_id_hex));
            json_object_set_new(o, "context_length",
                                json_integer(info->context_length));
            json_object_set_new(o, "chat_template",
                ngx_http_kvgate_chat_template_json(&info->chat));
            json_object_set_new(o, "pid", json_integer(info->engine_pid));
            json_object_set_new(o, "load_tokens", json_integer(
                (json_int_t) ngx_http_kvgate_engine_load(all[i])));

            if (ngx_http_kvgate_engine_read_stats(all[i], &st) == NGX_OK) {
                json_object_set_new(o, "kv", ngx_http_kvgate_status_kv(&st));
                json_object_set_new(o, "cache",
                                    ngx_http_kvgate_status_cache(&st));
                json_object_set_new(o, "scheduler", json_pack(
                    "{s:i, s:i, s:i, s:I, s:I}",
                    "waiting", (json_int_t) st.waiting,
                    "running", (json_int_t) st.running,
                    "held", (json_int_t) st.held,
                    "prefill_tokens", (json_int_t) st.prefill_tokens,
                    "decode_tokens", (json_int_t) st.decode_tokens));
            }
        }

        /* kvgate_route_requests_total{engine=...}, by reason */
        if (i < NGX_HTTP_KVGATE_MAX_ENGINES) {
            routed = json_object();

            for (k = 0; k < NGX_HTTP_KVGATE_N_ROUTE_NAMES; k++) {
                json_object_set_new(routed,
                    kvg_route_reason_name((kvg_route_reason) k),
                    json_integer((json_int_t) sh->routed[i][k]));
            }

            json_object_set_new(o, "routed", routed);
        }

        json_array_append_new(arr, o);
    }

    json_object_set_new(root, "engines", arr);
}


/* "by_bucket": kvgate_requests_total summed over endpoints, by length bucket
   and status ({"none": {"200": 3}, "128-1024": {...}}: buckets with no
   request left out), and "buckets": the token counters of each bucket. */

static void
ngx_http_kvgate_status_buckets(ngx_http_request_t *r, json_t *gw,
    ngx_http_kvgate_shctx_t *sh)
{
    char                         num[NGX_INT_T_LEN + 1];
    json_t                      *by, *st, *arr;
    uint64_t                     n;
    ngx_uint_t                   e, b, k;
    const char                  *label;
    ngx_http_kvgate_loc_conf_t  *klcf;

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);
    by = json_object();

    for (b = 0; b < NGX_HTTP_KVGATE_BUCKET_N; b++) {
        label = b == NGX_HTTP_KVGATE_BUCKET_NONE
                ? "none" : kvg_bucket_label(&klcf->buckets, b);
        st = NULL;

        for (k = 0; k < NGX_HTTP_KVGATE_N_STATUSES; k++) {
            n = 0;

            for (e = 0; e < NGX_HTTP_KVGATE_EP_N; e++) {
                n += sh->requests[e][b][k];
            }

            if (n == 0) {
                continue;
            }

            if (st == NULL) {
                st = json_object();
            }

            ngx_snprintf((u_char *) num, sizeof(num), "%ui%Z",
                         ngx_http_kvgate_statuses[k]);
            json_object_set_new(st, ngx_http_kvgate_statuses[k]
                                    ? num : "other",
                                json_integer((json_int_t) n));
        }

        if (st) {
            /* a bucket the configuration has no label for adds to "?" */
            if (json_object_get(by, label)) {
                json_decref(st);
                continue;
            }

            json_object_set_new(by, label, st);
        }
    }

    json_object_set_new(gw, "by_bucket", by);

    arr = json_array();

    for (b = 0; b < kvg_buckets_count(&klcf->buckets); b++) {
        json_array_append_new(arr, json_pack("{s:s, s:I, s:I, s:I}",
            "bucket", kvg_bucket_label(&klcf->buckets, b),
            "prompt_tokens", (json_int_t) sh->prompt_tokens[b],
            "cached_tokens", (json_int_t) sh->cached_tokens[b],
            "completion_tokens", (json_int_t) sh->completion_tokens[b]));
    }

    json_object_set_new(gw, "buckets", arr);
}


/* A histogram as /metrics prints it: "le" the finite upper bounds in
   seconds, "cumulative" the counts at or under each, then the +Inf one. */

static json_t *
ngx_http_kvgate_status_hist(ngx_http_kvgate_hist_t *h)
{
    json_t      *le, *cum, *o;
    uint64_t     c;
    ngx_uint_t   i;

    le = json_array();
    cum = json_array();
    c = 0;

    for (i = 0; i < NGX_HTTP_KVGATE_N_HIST; i++) {
        c += h->count[i];
        json_array_append_new(le, json_real(ngx_http_kvgate_hist_us[i]
                                            / 1e6));
        json_array_append_new(cum, json_integer((json_int_t) c));
    }

    c += h->count[i];
    json_array_append_new(cum, json_integer((json_int_t) c));

    o = json_object();
    json_object_set_new(o, "le", le);
    json_object_set_new(o, "cumulative", cum);
    json_object_set_new(o, "sum_seconds", json_real(h->sum_us / 1e6));
    json_object_set_new(o, "count", json_integer((json_int_t) h->n));

    return o;
}


/*
 * The status page (ngx_http_kvgate_dashboard.c, made from
 * ngx_module/dashboard/index.html) for a browser: "?format=html", or an
 * Accept header naming text/html without "?format=json". Everything else
 * gets the JSON, as before the page existed; the page itself asks for
 * "?format=json".
 */

extern const char    ngx_http_kvgate_dashboard_html[];
extern const size_t  ngx_http_kvgate_dashboard_html_len;


static ngx_uint_t
ngx_http_kvgate_status_wants_html(ngx_http_request_t *r)
{
    ngx_str_t         v;
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    if (ngx_http_arg(r, (u_char *) "format", 6, &v) == NGX_OK) {
        return v.len == 4 && ngx_strncasecmp(v.data, (u_char *) "html", 4)
                             == 0;
    }

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {
        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len == 6
            && ngx_strncasecmp(h[i].key.data, (u_char *) "Accept", 6) == 0
            && ngx_strlcasestrn(h[i].value.data,
                                h[i].value.data + h[i].value.len,
                                (u_char *) "text/html", 9 - 1)
               != NULL)
        {
            return 1;
        }
    }

    return 0;
}


static ngx_int_t
ngx_http_kvgate_status_page(ngx_http_request_t *r)
{
    ngx_buf_t    *b;
    ngx_chain_t   out;

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->pos = (u_char *) ngx_http_kvgate_dashboard_html;
    b->last = b->pos + ngx_http_kvgate_dashboard_html_len;
    b->memory = 1;

    /* The page loads nothing but itself and the JSON from here; the policy
       makes the browser hold it to that. */
    if (ngx_http_kvgate_add_header(r, "Content-Security-Policy",
            "default-src 'none'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; img-src data:; connect-src 'self'; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
            != NGX_OK
        || ngx_http_kvgate_add_header(r, "X-Content-Type-Options",
                                         "nosniff") != NGX_OK
        || ngx_http_kvgate_add_header(r, "Cache-Control", "no-cache")
           != NGX_OK
        || ngx_http_kvgate_add_header(r, "Vary", "Accept") != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_kvgate_send_response(r, NGX_HTTP_OK,
                                         "text/html; charset=utf-8",
                                         ngx_http_kvgate_dashboard_html_len,
                                         &out);
}


ngx_int_t
ngx_http_kvgate_status_handler(ngx_http_request_t *r)
{
    ngx_int_t  rc;

    rc = ngx_http_kvgate_get_only(r, "kvgate_status");
    if (rc != NGX_OK) {
        return rc;
    }

    if (ngx_http_kvgate_status_wants_html(r)) {
        return ngx_http_kvgate_status_page(r);
    }

    return ngx_http_kvgate_page(r, NGX_HTTP_KVGATE_STATUS,
                                ngx_http_kvgate_status_render,
                                "application/json");
}


static ngx_int_t
ngx_http_kvgate_status_render(ngx_http_request_t *r,
    ngx_http_kvgate_text_t *t)
{
    char                    *s, hex[20];
    ngx_uint_t               e, b, k, i;
    uint64_t                 total, by[NGX_HTTP_KVGATE_N_STATUSES];
    kvg_stats                st;
    json_t                  *root, *eng, *o, *arr, *statuses, *name;
    ngx_http_kvgate_shctx_t  *sh = ngx_http_kvgate_metrics_zone();
    const kvg_engine_info   *info;
    ngx_uint_t               n_engines;
    ngx_http_kvgate_engine_t *e0;
    ngx_time_t              *tp;

    root = json_object();
    eng = json_object();
    json_object_set_new(root, "engine", eng);

    e0 = ngx_http_kvgate_engines_of(r, &n_engines);
    info = e0 ? ngx_http_kvgate_engine_info(e0) : NULL;

    ngx_http_kvgate_status_engines(r, root);

    json_object_set_new(eng, "up", json_boolean(info != NULL));
    json_object_set_new(eng, "stalled", json_boolean(
        ngx_http_kvgate_engine_stalled(e0)));

    if (info == NULL || ngx_http_kvgate_engine_stalled(e0)) {
        json_object_set_new(eng, "reason", json_string(
            e0 ? ngx_http_kvgate_engine_down_reason(e0) : "no engine"));
    }

    if (info != NULL) {
        ngx_snprintf((u_char *) hex, sizeof(hex), "%016xL%Z", info->instance);
        json_object_set_new(eng, "model", json_string(info->model_name));
        json_object_set_new(eng, "model_id", json_string(info->model_id_hex));
        json_object_set_new(eng, "context_length",
                            json_integer(info->context_length));
        json_object_set_new(eng, "block_tokens",
                            json_integer(info->block_tokens));
        json_object_set_new(eng, "chat_template",
                            ngx_http_kvgate_chat_template_json(&info->chat));
        json_object_set_new(eng, "pid", json_integer(info->engine_pid));
        json_object_set_new(eng, "instance", json_string(hex));
    }

    if (info && ngx_http_kvgate_engine_read_stats(e0, &st) == NGX_OK) {
        json_object_set_new(eng, "clients", json_integer(st.clients));
        json_object_set_new(eng, "started_unix_ms",
                            json_integer((json_int_t) st.start_unix_ms));

        json_object_set_new(root, "kv", ngx_http_kvgate_status_kv(&st));
        json_object_set_new(root, "cache", ngx_http_kvgate_status_cache(&st));

        json_object_set_new(root, "scheduler", json_pack(
            "{s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
            " s:I, s:I}",
            "waiting", (json_int_t) st.waiting,
            "running", (json_int_t) st.running,
            "held", (json_int_t) st.held,
            "paused", (json_int_t) st.paused,
            "steps", (json_int_t) st.steps,
            "preemptions", (json_int_t) st.preemptions,
            "prefill_tokens", (json_int_t) st.prefill_tokens,
            "decode_tokens", (json_int_t) st.decode_tokens,
            "submitted", (json_int_t) st.submitted,
            "completed", (json_int_t) st.completed,
            "cancelled", (json_int_t) st.cancelled,
            "client_cancels", (json_int_t) st.client_cancels,
            "pauses", (json_int_t) st.pauses,
            "resumes", (json_int_t) st.resumes));

        json_object_set_new(root, "samples", json_pack("{s:I, s:I, s:I}",
            "started", (json_int_t) st.samples_started,
            "cancelled", (json_int_t) st.samples_cancelled,
            "dropped", (json_int_t) st.samples_dropped));

        arr = json_array();

        for (i = 0; i < (ngx_uint_t) st.n_tenants && i < KVG_STATS_TENANTS;
             i++)
        {
            st.tenant[i].name[KVG_PROTO_MAX_SALT] = '\0';
            o = json_object();
            name = json_string(st.tenant[i].name);
            json_object_set_new(o, "tenant", name ? name : json_string("?"));
            json_object_set_new(o, "cached_blocks",
                json_integer((json_int_t) st.tenant[i].cached_blocks));
            json_array_append_new(arr, o);
        }

        json_object_set_new(root, "tenants", arr);
        json_object_set_new(root, "other_tenants", json_pack("{s:i, s:i}",
            "tenants", (json_int_t) st.other_tenants,
            "cached_blocks", (json_int_t) st.other_cached_blocks));
        json_object_set_new(root, "live_tenants",
                            json_integer((json_int_t) st.live_tenants));
    }

    total = 0;
    ngx_memzero(by, sizeof(by));

    for (e = 0; e < NGX_HTTP_KVGATE_EP_N; e++) {
        for (b = 0; b < NGX_HTTP_KVGATE_BUCKET_N; b++) {
            for (k = 0; k < NGX_HTTP_KVGATE_N_STATUSES; k++) {
                total += sh->requests[e][b][k];
                by[k] += sh->requests[e][b][k];
            }
        }
    }

    statuses = json_object();

    for (k = 0; k < NGX_HTTP_KVGATE_N_STATUSES; k++) {
        if (by[k]) {
            ngx_snprintf((u_char *) hex, sizeof(hex), "%ui%Z",
                         ngx_http_kvgate_statuses[k]);
            json_object_set_new(statuses, ngx_http_kvgate_statuses[k]
                                          ? hex : "other",
                                json_integer((json_int_t) by[k]));
        }
    }

    o = json_object();
    json_object_set_new(o, "requests", json_integer((json_int_t) total));
    json_object_set_new(o, "by_status", statuses);
    json_object_set_new(o, "workers_connected",
                        json_integer((json_int_t)
                            ngx_http_kvgate_metrics_workers_connected(0)));

    {
        uint64_t  pt = 0, ct = 0, gt = 0;

        for (b = 0; b < NGX_HTTP_KVGATE_BUCKET_N; b++) {
            pt += sh->prompt_tokens[b];
            ct += sh->cached_tokens[b];
            gt += sh->completion_tokens[b];
        }

        json_object_set_new(o, "prompt_tokens", json_integer((json_int_t) pt));
        json_object_set_new(o, "cached_tokens", json_integer((json_int_t) ct));
        json_object_set_new(o, "completion_tokens",
                            json_integer((json_int_t) gt));
    }

    ngx_http_kvgate_status_buckets(r, o, sh);
    json_object_set_new(o, "ttft", ngx_http_kvgate_status_hist(&sh->ttft));

    json_object_set_new(o, "backpressure", json_pack("{s:I, s:I, s:I}",
        "pauses", (json_int_t) sh->backpressure[NGX_HTTP_KVGATE_BP_PAUSE],
        "resumes", (json_int_t) sh->backpressure[NGX_HTTP_KVGATE_BP_RESUME],
        "send_timeouts",
        (json_int_t) sh->backpressure[NGX_HTTP_KVGATE_BP_TIMEOUT]));

    json_object_set_new(o, "self_consistency", json_pack(
        "{s:I, s:I, s:I, s:I, s:I}",
        "requests", (json_int_t) sh->sc_requests,
        "samples_asked", (json_int_t) sh->sc_samples_asked,
        "samples_run", (json_int_t) sh->sc_samples_run,
        "early_stops", (json_int_t) sh->sc_early_stops,
        "answer_pattern_refusals", (json_int_t) sh->sc_pattern_refusals));

    json_object_set_new(root, "gateway", o);

    o = ngx_http_kvgate_limit_json(r);
    if (o) {
        json_object_set_new(root, "token_limits", o);
    }

    tp = ngx_timeofday();
    json_object_set_new(root, "now_unix_ms", json_integer(
        (json_int_t) tp->sec * 1000 + (json_int_t) tp->msec));

    s = json_dumps(root, JSON_COMPACT);
    json_decref(root);

    if (s == NULL) {
        return NGX_ERROR;
    }

    ngx_memzero(t, sizeof(ngx_http_kvgate_text_t));
    t->pool = r->pool;
    t->last = &t->head;
    t->total = ngx_strlen(s) + 1;
    t->b = ngx_create_temp_buf(r->pool, t->total);
    t->head = ngx_alloc_chain_link(r->pool);

    if (t->b == NULL || t->head == NULL) {
        free(s);
        return NGX_ERROR;
    }

    t->b->last = ngx_cpymem(t->b->last, s, t->total - 1);
    *t->b->last++ = '\n';
    t->head->buf = t->b;
    t->head->next = NULL;

    free(s);

    return NGX_OK;
}
