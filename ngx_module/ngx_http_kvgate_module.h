
/*
 * kvgate: nginx side of the gateway. Shared types of the module's source
 * files, and the functions each offers the files above it. The files form
 * a stack; every call points down (a file never calls one above it):
 *
 *   ngx_http_kvgate_module.c     directives, configuration, content handler
 *                                dispatch, variables, the log phase, process
 *                                hooks
 *   ngx_http_kvgate_request.c    one completion request's lifecycle: body
 *                                read, checks, submission, parking, engine
 *                                events, finalization
 *   ngx_http_kvgate_status.c     the kvgate_metrics (Prometheus) and
 *                                kvgate_status (JSON) pages
 *   ngx_http_kvgate_admin.c      kvgate_admin: a tenant's wipe on every
 *                                engine of a group (beside status.c)
 *   ngx_http_kvgate_response.c   OpenAI response objects and SSE chunks
 *                                (status.c and response.c side by side:
 *                                neither calls the other)
 *   ngx_http_kvgate_prompt.c     body to parsed request, tenant, tokens,
 *                                block hashes and route key
 *   ngx_http_kvgate_metrics.c    the shared counters and histograms and
 *                                their updates
 *   ngx_http_kvgate_error.c      sending a response (headers, body), and
 *                                OpenAI error responses
 *   ngx_http_kvgate_engine.c     the worker's connection to the engine
 *                                (libkvgate's client), reconnects, events;
 *                                calls up only through handler pointers
 *                                (ngx_http_kvgate_engine.h)
 */


#ifndef _NGX_HTTP_KVGATE_MODULE_H_INCLUDED_
#define _NGX_HTTP_KVGATE_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "answer_re.h"
#include "api_error.h"
#include "buckets.h"
#include "client.h"
#include "request.h"
#include "vote.h"

#include "ngx_http_kvgate_engine.h"


#define NGX_HTTP_KVGATE_PASS      1
#define NGX_HTTP_KVGATE_METRICS   2
#define NGX_HTTP_KVGATE_STATUS    3
#define NGX_HTTP_KVGATE_ADMIN     4

/* endpoints, for metrics labels */
#define NGX_HTTP_KVGATE_EP_COMPLETIONS  0
#define NGX_HTTP_KVGATE_EP_CHAT         1
#define NGX_HTTP_KVGATE_EP_MODELS       2
#define NGX_HTTP_KVGATE_EP_OTHER        3
#define NGX_HTTP_KVGATE_EP_MESSAGES     4     /* Anthropic's /v1/messages */
#define NGX_HTTP_KVGATE_EP_N            5

/* bucket label slots: 0..16 the configured buckets, 17 "none" (not tokenized) */
#define NGX_HTTP_KVGATE_BUCKET_NONE     (KVG_BUCKETS_MAX_BOUNDS + 1)
#define NGX_HTTP_KVGATE_BUCKET_N        (KVG_BUCKETS_MAX_BOUNDS + 2)


/* kvgate_limit_tokens (ngx_http_kvgate_limit.c) */
typedef struct ngx_http_kvgate_limit_s       ngx_http_kvgate_limit_t;
typedef struct ngx_http_kvgate_limit_zone_s  ngx_http_kvgate_limit_zone_t;


typedef struct {
    /* "unix:/path" as written (kvgate_engine), for messages */
    ngx_str_t                  engine;

    /* every engine of the configuration (ngx_http_kvgate_engine_t *), each
       once however many groups name it; and the groups
       (ngx_http_kvgate_group_t *), the kvgate_engine one first when given */
    ngx_array_t                engines;
    ngx_array_t                groups;
    ngx_http_kvgate_group_t   *default_group;    /* kvgate_engine's, or NULL */

    /* kvgate_pass NAME references, resolved once the http block is read
       (a group may be defined after the location naming it) */
    ngx_array_t                refs;             /* ngx_http_kvgate_ref_t */

    /* First kvgate_pass seen, so a missing kvgate_engine can be reported
       where the need for it arises. */
    ngx_str_t                  pass_file;
    ngx_uint_t                 pass_line;

    ngx_shm_zone_t            *shm_zone;         /* shared counters */

    ngx_msec_t                 connect_wait;     /* kvgate_connect_wait */
    ngx_msec_t                 engine_stall;     /* kvgate_engine_stall */

    /* the servers holding a kvgate_pass location, each with the first such
       location's URI: nginx's own refusals before a location is chosen are
       sent there to become OpenAI errors (ngx_http_kvgate_server_t) */
    ngx_array_t                servers;

    /* kvgate_limit_tokens_zone's (ngx_http_kvgate_limit_zone_t *) */
    ngx_array_t                limit_zones;
    /* every kvgate_limit_tokens (ngx_http_kvgate_limit_t *), to check that
       their zones are declared once the http block is read */
    ngx_array_t                limit_refs;
} ngx_http_kvgate_main_conf_t;


typedef struct {
    ngx_uint_t                 handler;           /* NGX_HTTP_KVGATE_* or 0 */
    ngx_http_kvgate_group_t   *group;             /* kvgate_pass's */

    ngx_http_complex_value_t  *tenant;
    /* the request headers kvgate_tenant reads ($http_NAME: each NAME, as
       nginx compares it: lowercase, '-' written '_'); a request carrying
       one of them twice is refused */
    ngx_array_t               *tenant_headers;    /* ngx_str_t */
    ngx_flag_t                 tenant_required;
    ngx_str_t                  default_tenant;

    ngx_int_t                  cache_min_tokens;
    ngx_flag_t                 bounds_set;        /* kvgate_buckets given */
    kvg_buckets                bounds;            /* as given */
    kvg_buckets                buckets;           /* effective: min_tokens first */

    ngx_int_t                  normalize;         /* KVG_NORM_* flags */
    ngx_msec_t                 cache_ttl;
    ngx_msec_t                 cache_ttl_max;     /* the longest TTL a client may ask */
    ngx_msec_t                 timeout;
    ngx_int_t                  max_tokens;        /* 0: up to the context */
    ngx_int_t                  max_n;
    ngx_int_t                  route_blocks;
    /* kvgate_answer_pattern_steps: the matching steps one sample's and one
       request's answer_pattern may take (answer_re.h) */
    ngx_int_t                  answer_sample_steps;
    ngx_int_t                  answer_request_steps;
    off_t                      max_body;          /* client_max_body_size */
    ngx_msec_t                 page_refresh;      /* kvgate_page_refresh */
    size_t                     max_unsent;        /* kvgate_max_unsent */

    /* kvgate_thread_pool: bodies of at least thread_min_bytes are parsed
       and tokenized there (NULL: all in the worker's event loop) */
#if (NGX_THREADS)
    ngx_thread_pool_t         *thread_pool;
#endif
    ngx_str_t                  thread_pool_name;  /* "off": none */
    size_t                     thread_min_bytes;

    ngx_http_kvgate_limit_t   *limit;             /* kvgate_limit_tokens */
} ngx_http_kvgate_loc_conf_t;


/* A streamed sample's text is kept for answer extraction up to its last
   this many bytes (a non-streamed one is kept whole for the answer): the
   answer is looked for at the end of the text. */
#define NGX_HTTP_KVGATE_SC_TAIL         4096
/* The longest answer that votes (normalized); longer ones are cut. */
#define NGX_HTTP_KVGATE_SC_ANSWER_MAX   1024


typedef struct ngx_http_kvgate_ctx_s  ngx_http_kvgate_ctx_t;

/* One choice (sample) of a completion being produced. */
typedef struct {
    u_char                    *text;
    size_t                     len;
    size_t                     cap;
    uint32_t                  *ids;               /* with logprobs */
    float                     *lps;
    size_t                     n_ids;
    size_t                     ids_cap;
    size_t                     text_offset;       /* streamed logprobs */
    /* self-consistency: the sum and count of the sample's token logprobs
       (its mean weighs its vote with "vote": "logprob") */
    double                     lp_sum;
    uint32_t                   lp_n;
    ngx_uint_t                 finished;
    uint32_t                   finish_reason;     /* enum kvg_msg_finish */
    /* /v1/messages: the bytes of text sent or kept, and the request's stop
       sequence that ended the sample (-1: none; found at FINISHED from the
       ids kept in ids, whose decoded text goes on with it) */
    size_t                     visible;
    ngx_int_t                  stop_sequence;
} ngx_http_kvgate_choice_t;


struct ngx_http_kvgate_ctx_s {
    ngx_http_request_t        *request;
    ngx_event_t                deadline;

    ngx_uint_t                 endpoint;          /* NGX_HTTP_KVGATE_EP_* */
    ngx_uint_t                 status;            /* final HTTP status */
    ngx_uint_t                 bucket;            /* label slot */
    ngx_uint_t                 bypass;
    const char                *cache_status;      /* "hit", ... or NULL */

    /* the tenant: its name (a header's value or the location's
       kvgate_default_tenant: $kvgate_tenant, logs) and its salt, the bytes
       the block hashes are salted with (prefix_hash.h: a named tenant's is
       its name, a default tenant's a 0x00 mark then its name) */
    ngx_str_t                  tenant;
    ngx_str_t                  salt;
    ngx_uint_t                 default_tenant;

    kvg_request               *req;               /* the parsed body */
    int32_t                   *tokens;
    size_t                     n_tokens;
    uint8_t                  (*hashes)[KVG_PREFIX_HASH_LEN];
    size_t                     n_hashes;
    /* cache_control breakpoints (/v1/messages): the prompt tokens up to each
       (the prefix its rendering shares with the whole prompt's), its TTL */
    size_t                     n_breakpoints;
    size_t                     bp_tokens[KVG_PROTO_MAX_HOLDS];
    uint32_t                   bp_ttl_s[KVG_PROTO_MAX_HOLDS];
    u_char                     route_key[2 * KVG_PREFIX_HASH_LEN];
    ngx_uint_t                 route_key_set;
    int32_t                    stop_ids[KVG_PROTO_MAX_STOP_IDS];
    size_t                     n_stop_ids;
    const char                *stop[KVG_PROTO_MAX_STOP];
    size_t                     stop_len[KVG_PROTO_MAX_STOP];
    size_t                     n_stop;
    uint32_t                   max_tokens;

    /* its place in the engine connection, with the handlers it calls
       (ereq.engine: the engine it is prepared for or sent to) */
    ngx_http_kvgate_engine_req_t  ereq;

    /* routing: the location's group; the model id the prompt was tokenized
       and hashed for (only engines serving it may take the request); the
       engines (bits by position in the group) that went down under it; why
       the engine it went to was chosen (kvg_route_reason), and whether the
       pick is done */
    ngx_http_kvgate_group_t   *group;
    const kvg_engine_info     *tok_info;          /* while parsing */
    uint8_t                    model_id[KVG_PREFIX_HASH_LEN];
    uint32_t                   failed;
    ngx_uint_t                 route_reason;
    ngx_uint_t                 routed;

    ngx_uint_t                 parsed;            /* tokenized, hashed */
    ngx_uint_t                 prepared;          /* parsed, checked */
    ngx_http_event_handler_pt  body_reader;       /* nginx's, while reading */
    ngx_uint_t                 done;              /* answered */
    ngx_uint_t                 header_sent;
    ngx_uint_t                 front;             /* only the route key, for proxy_pass */
    ngx_uint_t                 prompt_timedout;   /* kvgate_timeout while in a thread */
    off_t                      body_limit;        /* the derived body limit, 0: none */
    off_t                      body_read;         /* bytes of it seen so far */

    uint32_t                   prompt_tokens;
    uint32_t                   cached_tokens;
    uint32_t                   completion_tokens;
    uint32_t                   cache_write_tokens; /* held for cache_control */
    ngx_uint_t                 usage_set;

    ngx_msec_t                 start;             /* ngx_current_msec at arrival */
    struct timeval             start_tv;
    ngx_int_t                  ttft_us;           /* -1 until the first token */
    u_char                     id[40];            /* "cmpl-..." / "chatcmpl-..." */
    size_t                     id_len;
    time_t                     created;

    ngx_uint_t                 n_choices;
    ngx_http_kvgate_choice_t  *choices;

    ngx_uint_t                 paused;            /* in the engine: the client
                                                     does not read */

    /* self-consistency (the body's "kvgate" object had a "vote"): the wave
       driver and the compiled answer_pattern with its step budget
       (libkvgate's kvg_sc and kvg_answer_re, both freed by the request's
       cleanup; answer_re NULL: the default extractor),
       and how many samples have been drawn (always a prefix of the indices:
       the engine starts samples in index order) */
    kvg_sc                    *sc;
    kvg_answer_re             *answer_re;
    ngx_uint_t                 sc_drawn;
    ngx_uint_t                 answer_refused;    /* out of steps: the 422 */

    /* a stream's output buffers (ngx_http_kvgate_response.c), recycled so
       that what the client has taken is reused, not kept in r->pool until
       the request ends: free (sent), busy (passed to nginx, not all sent),
       open (filled while the client is behind, not passed yet); and the
       scratch space each chunk is first written in */
    ngx_chain_t               *free;
    ngx_chain_t               *busy;
    ngx_chain_t               *open;
    u_char                    *scratch;
    size_t                     scratch_size;

    /* kvgate_limit_tokens: the limit the request was admitted under (NULL:
       none), its key, the tokens charged so far; the Retry-After of its 429 */
    ngx_http_kvgate_limit_t   *limit;
    ngx_str_t                  limit_key;
    uint32_t                   limit_hash;
    ngx_uint_t                 limit_closed;
    double                     limit_charged;
    ngx_uint_t                 limit_retry;
};


/* The functions, bottom up; ngx_http_kvgate_engine.c's are in
   ngx_http_kvgate_engine.h. */

/* ngx_http_kvgate_error.c */
/* Adds an output header (key and value are not copied: literals, or memory
   that lives as long as the request). */
ngx_int_t ngx_http_kvgate_add_header(ngx_http_request_t *r, const char *key,
    const char *value);
/*
 * Sends a response: status, Content-Type type and Content-Length length
 * (-1: none), the header (with what was added before), then out, the whole
 * body, whose last buffer it marks the request's last. out NULL: the header
 * alone (a stream's chunks follow). Returns what ngx_http_send_header() or
 * ngx_http_output_filter() returned.
 */
ngx_int_t ngx_http_kvgate_send_response(ngx_http_request_t *r,
    ngx_uint_t status, const char *type, off_t length, ngx_chain_t *out);
/*
 * Sends an OpenAI-style error:
 *   {"error":{"message":M,"type":T,"param":P,"code":C}}
 * or, for /v1/messages (the request's ctx says so), Anthropic's
 *   {"type":"error","error":{"type":T,"message":M}}
 * retry_after > 0 adds a Retry-After header. The request body must already be
 * read or discarded. Returns what the caller should finalize the request with;
 * it never finalizes the request itself.
 */
ngx_int_t ngx_http_kvgate_send_api_error(ngx_http_request_t *r,
    const kvg_api_error *e, ngx_uint_t retry_after);
ngx_int_t ngx_http_kvgate_send_error(ngx_http_request_t *r, ngx_uint_t status,
    const char *type, const char *code, const char *message,
    ngx_uint_t retry_after);
/* Retry-After for a status: 1 second for 429 and 503, else none. */
ngx_uint_t ngx_http_kvgate_retry_after(ngx_uint_t status);

/* ngx_http_kvgate_metrics.c (the zone's layout: ngx_http_kvgate_metrics.h) */
ngx_int_t ngx_http_kvgate_metrics_init_zone(ngx_conf_t *cf,
    ngx_http_kvgate_main_conf_t *kmcf);
/* once per request, in the log phase */
void ngx_http_kvgate_metrics_count(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx);
/* the engine connections' state hook (NGX_HTTP_KVGATE_ENGINE_*) */
void ngx_http_kvgate_metrics_engine_event(ngx_http_kvgate_engine_t *e,
    ngx_uint_t event);
/* a request routed to the engine of that index, for a reason
   (kvg_route_reason) */
void ngx_http_kvgate_metrics_route(ngx_uint_t engine, ngx_uint_t reason);
/* this worker starts (it takes over its process slot) or exits: its slot
   of the workers-connected gauge is cleared */
void ngx_http_kvgate_metrics_worker_clear(void);
/* a request starts waiting for ring room */
void ngx_http_kvgate_metrics_submit_wait(void);
/* backpressure: a stream paused or resumed in the engine, or closed at
   send_timeout */
#define NGX_HTTP_KVGATE_BP_PAUSE    0
#define NGX_HTTP_KVGATE_BP_RESUME   1
#define NGX_HTTP_KVGATE_BP_TIMEOUT  2
void ngx_http_kvgate_metrics_backpressure(ngx_uint_t what);

/* a tenant wipe answered (kvgate_admin): complete (every engine wiped) or
   not, and the blocks dropped in each tier (pool, host, disk) */
void ngx_http_kvgate_metrics_wipe(ngx_uint_t complete, const uint64_t *blocks);

/* ngx_http_kvgate_prompt.c */
/* Whether the client closed its connection (marks it; *err: the socket
   error, 0 for an EOF), without reading what it may still send. */
ngx_uint_t ngx_http_kvgate_client_gone(ngx_http_request_t *r, ngx_err_t *err);
/* Called in the event loop when a prompt posted to a thread pool is ready:
   rc NGX_OK, or NGX_ERROR with *err set (ctx as prompt_parse leaves it). The
   request is still referenced while it runs. */
typedef void (*ngx_http_kvgate_prompt_done_pt)(ngx_http_request_t *r,
    ngx_int_t rc, kvg_api_error *err);
/* As ngx_http_kvgate_prompt_parse, in the location's kvgate_thread_pool when
   the body is long enough (the tenant is resolved before, in the event loop):
   NGX_AGAIN, and done is called later; otherwise in the event loop, NGX_OK
   or NGX_ERROR with *err (done is not called). */
ngx_int_t ngx_http_kvgate_prompt_start(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, ngx_http_kvgate_loc_conf_t *klcf,
    const kvg_engine_info *info, ngx_http_kvgate_prompt_done_pt done,
    kvg_api_error *err);
/* The largest body a prompt that fits the engine's context can need
   (0: no bound); over it, the answer is 413. */
off_t ngx_http_kvgate_prompt_body_limit(const kvg_engine_info *info);
/* The 413 error naming the limit that refused the body. */
void ngx_http_kvgate_prompt_too_large(ngx_http_request_t *r,
    kvg_api_error *err);
/* Resolves the tenant (first: a request refused for it gets that answer
   whatever its body holds), then reads and parses the body, tokenizes,
   hashes: sets ctx's tenant and salt, req, tokens, stop ids and strings,
   bucket, bypass, hashes and route key. */
ngx_int_t ngx_http_kvgate_prompt_parse(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, ngx_http_kvgate_loc_conf_t *klcf,
    const kvg_engine_info *info, kvg_api_error *err);
/* The worker exits: frees the event loop's prefix hasher. */
void ngx_http_kvgate_prompt_exit_process(void);
/* Frees what parsing allocated outside the pool (idempotent). */
void ngx_http_kvgate_prompt_free(ngx_http_kvgate_ctx_t *ctx);
/* $kvgate_route_key in a front tier: NGX_OK with ctx->route_key set,
   NGX_DECLINED when there is none. */
ngx_int_t ngx_http_kvgate_route_key_from_body(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx);

/* The answer_pattern of a request with a vote, compiled into
   ctx->answer_re with the location's step budget (nothing when the request
   has none): NGX_OK, or NGX_ERROR with a 400 naming
   "kvgate.answer_pattern" in *err (it does not compile, or it has not
   exactly one capture group). */
ngx_int_t ngx_http_kvgate_answer_compile(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, kvg_api_error *err);
/* A finished sample's answer, extracted (capture 1 of the LAST match of
   ctx->answer_re in its text, else the default extractor) and normalized
   into out (NUL-terminated): NGX_OK with *len its length (0 when it has
   none), or NGX_ERROR with a 422 in *err when the pattern ran out of its
   budget (the request cannot be answered). */
ngx_int_t ngx_http_kvgate_answer_extract(ngx_http_kvgate_ctx_t *ctx,
    const u_char *text, size_t len, char *out, size_t cap, size_t *out_len,
    kvg_api_error *err);

/* ngx_http_kvgate_limit.c */
/* token counts of a key or a zone */
typedef struct {
    uint64_t                   prompt;
    uint64_t                   cached;
    uint64_t                   completion;
    uint64_t                   requests;          /* admitted */
    uint64_t                   refused;
} ngx_http_kvgate_limit_counts_t;
/* the keys the pages list per zone, by tokens (the others summed) */
#define NGX_HTTP_KVGATE_LIMIT_KEYS  32
typedef struct {
    char                      *key;
    ngx_http_kvgate_limit_counts_t  counts;
    double                     level;             /* at its last charge */
    ngx_msec_t                 last;
} ngx_http_kvgate_limit_row_t;
typedef struct {
    ngx_str_t                  name;
    ngx_uint_t                 keys;
    ngx_uint_t                 reclaimed;
    ngx_http_kvgate_limit_counts_t  total;
    ngx_http_kvgate_limit_counts_t  other;        /* keys not listed */
    ngx_http_kvgate_limit_row_t    *rows;
    ngx_uint_t                 n_rows;
} ngx_http_kvgate_limit_snap_t;
char *ngx_http_kvgate_limit_zone_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
char *ngx_http_kvgate_limit_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_kvgate_limit_ref(ngx_conf_t *cf, ngx_http_kvgate_limit_t *lim);
/* postconfiguration: every kvgate_limit_tokens names a declared zone */
ngx_int_t ngx_http_kvgate_limit_check(ngx_conf_t *cf);
/* Admission, before the request reaches the engine: NGX_OK (admitted, its
   prompt charged, or not limited), NGX_DECLINED (429 in *err,
   ctx->limit_retry its Retry-After), NGX_ERROR. */
ngx_int_t ngx_http_kvgate_limit_admit(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, kvg_api_error *err);
/* completion tokens produced */
void ngx_http_kvgate_limit_tokens(ngx_http_kvgate_ctx_t *ctx, ngx_uint_t n);
/* the request ends: the charge set right with the engine's usage */
void ngx_http_kvgate_limit_done(ngx_http_kvgate_ctx_t *ctx);
/* the zones' keys and counters (ngx_http_kvgate_limit_snap_t), in r->pool */
ngx_array_t *ngx_http_kvgate_limit_snapshot(ngx_http_request_t *r);

/* ngx_http_kvgate_status.c */
ngx_int_t ngx_http_kvgate_metrics_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_kvgate_status_handler(ngx_http_request_t *r);

/* ngx_http_kvgate_admin.c (beside status.c: kvgate_admin's tenant wipe) */
ngx_int_t ngx_http_kvgate_admin_handler(ngx_http_request_t *r);

/* ngx_http_kvgate_response.c */
ngx_int_t ngx_http_kvgate_send_models(ngx_http_request_t *r);
ngx_int_t ngx_http_kvgate_send_complete(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx);
ngx_int_t ngx_http_kvgate_stream_start(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx);
ngx_int_t ngx_http_kvgate_stream_tokens(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, const kvg_client_event *ev);
ngx_int_t ngx_http_kvgate_stream_finished(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, ngx_uint_t choice);
/* Self-consistency: chat streams open the samples [from, to) just drawn
   with the assistant's role (stream_start opened the first wave). */
ngx_int_t ngx_http_kvgate_stream_roles(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, ngx_uint_t from, ngx_uint_t to);
ngx_int_t ngx_http_kvgate_stream_end(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx, kvg_api_error *error);
ngx_int_t ngx_http_kvgate_add_cache_headers(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx);
/* The write handler's step: passes what waits in ctx->open (with what nginx
   still holds) and recycles the buffers the client has taken. */
ngx_int_t ngx_http_kvgate_stream_flush(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx);
/* The memory of a stream's buffers holding output its client has not taken
   yet (ctx->busy and ctx->open). */
size_t ngx_http_kvgate_stream_unsent(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx);
/* A paused stream gives back the memory of its idle buffers (ctx->free);
   they are allocated again when it resumes. */
void ngx_http_kvgate_stream_trim(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx);

/* ngx_http_kvgate_request.c */
ngx_int_t ngx_http_kvgate_completion_handler(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx);
/* Installs the request body filter that enforces the derived body limit
   (postconfiguration). */
ngx_int_t ngx_http_kvgate_request_init(ngx_conf_t *cf);


extern ngx_module_t  ngx_http_kvgate_module;


#endif /* _NGX_HTTP_KVGATE_MODULE_H_INCLUDED_ */
