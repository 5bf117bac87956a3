
/*
 * kvgate: the layout of the shared metrics zone, for the file that counts
 * into it (ngx_http_kvgate_metrics.c) and the one that renders it as pages
 * (ngx_http_kvgate_status.c). Nothing else needs to see inside.
 */


#ifndef _NGX_HTTP_KVGATE_METRICS_H_INCLUDED_
#define _NGX_HTTP_KVGATE_METRICS_H_INCLUDED_


#include "ngx_http_kvgate_module.h"


/* HTTP statuses with a label of their own; the last slot (0) is "other" */
#define NGX_HTTP_KVGATE_N_STATUSES  14

/* histogram buckets: these upper bounds, then +Inf */
#define NGX_HTTP_KVGATE_N_HIST      15

#define NGX_HTTP_KVGATE_N_CACHE     4

/* kvg_route_reason's count (KVG_ROUTED_N), with room */
#define NGX_HTTP_KVGATE_ROUTE_REASONS  8


/*
 * A page of kvgate_metrics or kvgate_status as last rendered, kept in the
 * zone so that every worker serves the same one until it is refresh old:
 * one location's page of one kind in one configuration (its id and the
 * location's conf, the same address in every worker of a configuration).
 */

#define NGX_HTTP_KVGATE_PAGE_SLOTS  8
#define NGX_HTTP_KVGATE_PAGE_MAX    (256 * 1024)    /* larger ones: rendered
                                                       every time */

typedef struct {
    uint64_t       conf;
    uintptr_t      loc;
    ngx_uint_t     kind;
    ngx_msec_t     rendered;
    size_t         len;
    u_char        *data;             /* in the zone's slab pool; NULL: free */
} ngx_http_kvgate_page_t;


typedef struct {
    ngx_atomic_t   count[NGX_HTTP_KVGATE_N_HIST + 1];
    ngx_atomic_t   sum_us;
    ngx_atomic_t   n;
} ngx_http_kvgate_hist_t;


typedef struct {
    ngx_atomic_t            requests[NGX_HTTP_KVGATE_EP_N]
                                    [NGX_HTTP_KVGATE_BUCKET_N]
                                    [NGX_HTTP_KVGATE_N_STATUSES];
    ngx_atomic_t            prompt_tokens[NGX_HTTP_KVGATE_BUCKET_N];
    ngx_atomic_t            cached_tokens[NGX_HTTP_KVGATE_BUCKET_N];
    ngx_atomic_t            completion_tokens[NGX_HTTP_KVGATE_BUCKET_N];
    ngx_atomic_t            cache_status[NGX_HTTP_KVGATE_N_CACHE];
    ngx_http_kvgate_hist_t  ttft;
    ngx_http_kvgate_hist_t  latency;
    ngx_atomic_t            engine_connects;
    ngx_atomic_t            engine_disconnects;
    ngx_atomic_t            submit_waits;

    /* The pid of the worker in each process slot (ngx_process_slot) while it
       is connected to the engine, else 0. Workers connected are counted from
       these, never kept as a running sum: a killed worker cannot take itself
       off, but its slot is taken over by the worker respawned into it (which
       clears it at start), and a pid that no longer exists is not counted
       (nor kept) when the gauge is read. */
    ngx_atomic_t            worker_pid[NGX_HTTP_KVGATE_MAX_ENGINES]
                                      [NGX_MAX_PROCESSES];
    /* by engine (its index): connects and losses, and the requests routed
       to it by reason (kvg_route_reason) */
    ngx_atomic_t            engine_connects_e[NGX_HTTP_KVGATE_MAX_ENGINES];
    ngx_atomic_t            engine_disconnects_e[NGX_HTTP_KVGATE_MAX_ENGINES];
    ngx_atomic_t            routed[NGX_HTTP_KVGATE_MAX_ENGINES]
                                  [NGX_HTTP_KVGATE_ROUTE_REASONS];
    /* stalls by engine (kvgate_engine_stall), each counted once however many
       workers see it: by the first that reports its stall_key (the engine's
       last heartbeat and instance), which stall_key holds afterwards */
    ngx_atomic_t            engine_stalls_e[NGX_HTTP_KVGATE_MAX_ENGINES];
    ngx_atomic_t            stall_key[NGX_HTTP_KVGATE_MAX_ENGINES];
    /* backpressure (NGX_HTTP_KVGATE_BP_*): counters only; the gauge of paused
       requests is the engine's (its statistics page), which cannot drift
       when a worker dies with paused requests */
    ngx_atomic_t            backpressure[3];
    /* self-consistency: requests with a vote answered after their samples
       ran, the samples they asked for (n), the samples drawn, and those
       decided before all n ran */
    ngx_atomic_t            sc_requests;
    ngx_atomic_t            sc_samples_asked;
    ngx_atomic_t            sc_samples_run;
    ngx_atomic_t            sc_early_stops;
    /* those refused because their answer_pattern ran out of its steps */
    ngx_atomic_t            sc_pattern_refusals;
    /* kvgate_admin's tenant wipes: answered with every engine wiped, or
       not; and the blocks they dropped by tier (pool, host, disk) */
    ngx_atomic_t            wipes[2];             /* [0] failed, [1] ok */
    ngx_atomic_t            wiped_blocks[3];

    /* the rendered pages cache (kvgate_page_refresh), under the zone's
       mutex */
    ngx_http_kvgate_page_t  pages[NGX_HTTP_KVGATE_PAGE_SLOTS];
} ngx_http_kvgate_shctx_t;


/* the labels, by slot */
extern const ngx_uint_t  ngx_http_kvgate_statuses[NGX_HTTP_KVGATE_N_STATUSES];
extern const ngx_uint_t  ngx_http_kvgate_hist_us[NGX_HTTP_KVGATE_N_HIST];
extern const char *const  ngx_http_kvgate_ep_names[NGX_HTTP_KVGATE_EP_N];
extern const char *const  ngx_http_kvgate_cache_names[NGX_HTTP_KVGATE_N_CACHE];


/* The zone's counters, NULL when there is no zone (no kvgate_engine). */
ngx_http_kvgate_shctx_t *ngx_http_kvgate_metrics_zone(void);
/* Worker processes connected to the engine of that index now. */
ngx_uint_t ngx_http_kvgate_metrics_workers_connected(ngx_uint_t engine);

/* The rendered pages cache. Between lock and unlock (the zone's mutex: every
   worker waits for the one that holds it): page_copy gives the page of key
   rendered less than refresh ago, copied into pool (NGX_OK), or NGX_DECLINED;
   page_store keeps a page just rendered (a chain of len bytes), replacing
   the key's or the oldest; too large, or no room in the zone: not kept. */
typedef struct {
    ngx_uint_t     kind;             /* NGX_HTTP_KVGATE_METRICS, _STATUS */
    uintptr_t      loc;
} ngx_http_kvgate_page_key_t;

void ngx_http_kvgate_pages_lock(void);
void ngx_http_kvgate_pages_unlock(void);
ngx_int_t ngx_http_kvgate_page_copy(ngx_http_kvgate_page_key_t *key,
    ngx_msec_t refresh, ngx_pool_t *pool, ngx_str_t *page);
void ngx_http_kvgate_page_store(ngx_http_kvgate_page_key_t *key,
    ngx_chain_t *in, size_t len);


#endif /* _NGX_HTTP_KVGATE_METRICS_H_INCLUDED_ */
