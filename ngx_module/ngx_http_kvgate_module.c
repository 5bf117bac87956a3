
/*
 * kvgate: an OpenAI-compatible gateway in front of the co-located kvgate
 * engine. This file holds the directives, their configuration, the content
 * handler's dispatch by endpoint, the variables and the log-phase handler
 * that counts every request once.
 */


#include "ngx_http_kvgate_module.h"

#include <dlfcn.h>

#include "normalize.h"
#include "route.h"
#include "version.h"


static ngx_int_t ngx_http_kvgate_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_kvgate_error_page(ngx_http_request_t *r,
    ngx_http_kvgate_ctx_t *ctx);
static ngx_int_t ngx_http_kvgate_log_handler(ngx_http_request_t *r);

static ngx_int_t ngx_http_kvgate_add_variables(ngx_conf_t *cf);
static ngx_int_t ngx_http_kvgate_postconfiguration(ngx_conf_t *cf);
static void *ngx_http_kvgate_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_kvgate_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_http_kvgate_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_kvgate_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);

/* the kvgate_engine* directives' handlers end in _directive:
   ngx_http_kvgate_engine_* are the engine connection's functions
   (ngx_http_kvgate_engine.h) */
static char *ngx_http_kvgate_engine_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_kvgate_engines_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_kvgate_engines_body(ngx_conf_t *cf, ngx_command_t *dummy,
    void *conf);
static char *ngx_http_kvgate_pass(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_kvgate_buckets(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_kvgate_normalize(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_kvgate_answer_steps(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_kvgate_tenant_slot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_uint_t ngx_http_kvgate_is_prefix_location(
    ngx_http_core_loc_conf_t *clcf);
static ngx_int_t ngx_http_kvgate_note_server(ngx_conf_t *cf,
    ngx_http_core_loc_conf_t *clcf);
static ngx_int_t ngx_http_kvgate_server_error_pages(ngx_conf_t *cf);
static char *ngx_http_kvgate_thread_pool(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_kvgate_engine_stall_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);

static ngx_int_t ngx_http_kvgate_init_module(ngx_cycle_t *cycle);
static void ngx_http_kvgate_pin_module(ngx_cycle_t *cycle);
static ngx_int_t ngx_http_kvgate_init_process(ngx_cycle_t *cycle);
static void ngx_http_kvgate_exit_process(ngx_cycle_t *cycle);


static char *ngx_http_kvgate_set_num_slot(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_kvgate_set_msec_slot(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_kvgate_check_num_bounds(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_kvgate_check_max_unsent(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_kvgate_check_timeout(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_kvgate_check_cache_ttl_max(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_kvgate_check_cache_ttl(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_kvgate_check_tenant(ngx_conf_t *cf, void *post,
    void *data);


/*
 * Directive bounds as nginx states them (ngx_conf_num_bounds_t and post
 * handlers, as ngx_conf_set_num_slot() runs them); the handlers are the
 * module's own only so that the messages name the value, the directive and
 * the range.
 */

static ngx_conf_num_bounds_t  ngx_http_kvgate_min_tokens_bounds = {
    ngx_http_kvgate_check_num_bounds, 0, KVG_BUCKETS_MAX_VALUE
};

static ngx_conf_num_bounds_t  ngx_http_kvgate_max_tokens_bounds = {
    ngx_http_kvgate_check_num_bounds, 0, 1 << 30
};

static ngx_conf_num_bounds_t  ngx_http_kvgate_max_n_bounds = {
    ngx_http_kvgate_check_num_bounds, 1, KVG_PROTO_MAX_N
};

static ngx_conf_num_bounds_t  ngx_http_kvgate_route_blocks_bounds = {
    ngx_http_kvgate_check_num_bounds, 1, 65536
};

static ngx_conf_post_t  ngx_http_kvgate_max_unsent_post = {
    ngx_http_kvgate_check_max_unsent
};

static ngx_conf_post_t  ngx_http_kvgate_timeout_post = {
    ngx_http_kvgate_check_timeout
};

static ngx_conf_post_t  ngx_http_kvgate_cache_ttl_max_post = {
    ngx_http_kvgate_check_cache_ttl_max
};

static ngx_conf_post_t  ngx_http_kvgate_cache_ttl_post = {
    ngx_http_kvgate_check_cache_ttl
};

static ngx_conf_post_t  ngx_http_kvgate_tenant_post = {
    ngx_http_kvgate_check_tenant
};


static ngx_command_t  ngx_http_kvgate_commands[] = {

    { ngx_string("kvgate_engine"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_engine_directive,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kvgate_engines"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_BLOCK|NGX_CONF_TAKE1,
      ngx_http_kvgate_engines_directive,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kvgate_connect_wait"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_kvgate_main_conf_t, connect_wait),
      NULL },

    { ngx_string("kvgate_engine_stall"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_engine_stall_directive,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_kvgate_main_conf_t, engine_stall),
      NULL },

    { ngx_string("kvgate_limit_tokens_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE2,
      ngx_http_kvgate_limit_zone_directive,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kvgate_limit_tokens"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_kvgate_limit_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kvgate_pass"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE1,
      ngx_http_kvgate_pass,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_HTTP_KVGATE_PASS,
      NULL },

    { ngx_string("kvgate_metrics"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_kvgate_pass,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_HTTP_KVGATE_METRICS,
      NULL },

    { ngx_string("kvgate_status"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_kvgate_pass,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_HTTP_KVGATE_STATUS,
      NULL },

    { ngx_string("kvgate_admin"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE1,
      ngx_http_kvgate_pass,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_HTTP_KVGATE_ADMIN,
      NULL },

    { ngx_string("kvgate_page_refresh"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_kvgate_loc_conf_t, page_refresh),
      NULL },

    { ngx_string("kvgate_tenant"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_tenant_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_kvgate_loc_conf_t, tenant),
      NULL },

    { ngx_string("kvgate_tenant_required"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_kvgate_loc_conf_t, tenant_required),
      NULL },

    { ngx_string("kvgate_default_tenant"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_kvgate_loc_conf_t, default_tenant),
      &ngx_http_kvgate_tenant_post },

    { ngx_string("kvgate_cache_min_tokens"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_kvgate_loc_conf_t, cache_min_tokens),
      &ngx_http_kvgate_min_tokens_bounds },

    { ngx_string("kvgate_buckets"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_kvgate_buckets,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kvgate_normalize"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_kvgate_normalize,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kvgate_cache_ttl"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_kvgate_loc_conf_t, cache_ttl),
      &ngx_http_kvgate_cache_ttl_post },

    { ngx_string("kvgate_cache_ttl_max"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_kvgate_loc_conf_t, cache_ttl_max),
      &ngx_http_kvgate_cache_ttl_max_post },

    { ngx_string("kvgate_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_kvgate_loc_conf_t, timeout),
      &ngx_http_kvgate_timeout_post },

    { ngx_string("kvgate_max_tokens"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_kvgate_loc_conf_t, max_tokens),
      &ngx_http_kvgate_max_tokens_bounds },

    { ngx_string("kvgate_max_n"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_kvgate_loc_conf_t, max_n),
      &ngx_http_kvgate_max_n_bounds },

    { ngx_string("kvgate_answer_pattern_steps"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_kvgate_answer_steps,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kvgate_max_unsent"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_kvgate_loc_conf_t, max_unsent),
      &ngx_http_kvgate_max_unsent_post },

    { ngx_string("kvgate_route_blocks"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_kvgate_loc_conf_t, route_blocks),
      &ngx_http_kvgate_route_blocks_bounds },

    { ngx_string("kvgate_thread_pool"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_kvgate_thread_pool,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_kvgate_module_ctx = {
    ngx_http_kvgate_add_variables,         /* preconfiguration */
    ngx_http_kvgate_postconfiguration,     /* postconfiguration */

    ngx_http_kvgate_create_main_conf,      /* create main configuration */
    ngx_http_kvgate_init_main_conf,        /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_kvgate_create_loc_conf,       /* create location configuration */
    ngx_http_kvgate_merge_loc_conf         /* merge location configuration */
};


ngx_module_t  ngx_http_kvgate_module = {
    NGX_MODULE_V1,
    &ngx_http_kvgate_module_ctx,           /* module context */
    ngx_http_kvgate_commands,              /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    ngx_http_kvgate_init_module,           /* init module */
    ngx_http_kvgate_init_process,          /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_kvgate_exit_process,          /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


/* ---- the content handler ---- */

static ngx_int_t
ngx_http_kvgate_endpoint(ngx_http_request_t *r)
{
    ngx_str_t  *u = &r->uri;

#define ngx_http_kvgate_ends(s)                                               \
    (u->len >= sizeof(s) - 1                                                  \
     && ngx_strncmp(u->data + u->len - (sizeof(s) - 1), s, sizeof(s) - 1) == 0)

    if (ngx_http_kvgate_ends("/chat/completions")) {
        return NGX_HTTP_KVGATE_EP_CHAT;
    }

    if (ngx_http_kvgate_ends("/completions")) {
        return NGX_HTTP_KVGATE_EP_COMPLETIONS;
    }

    if (ngx_http_kvgate_ends("/messages")) {
        return NGX_HTTP_KVGATE_EP_MESSAGES;
    }

    if (ngx_http_kvgate_ends("/models")
        || ngx_strlcasestrn(u->data, u->data + u->len, (u_char *) "/models/",
                            sizeof("/models/") - 2) != NULL)
    {
        return NGX_HTTP_KVGATE_EP_MODELS;
    }

#undef ngx_http_kvgate_ends

    return NGX_HTTP_KVGATE_EP_OTHER;
}


static ngx_int_t
ngx_http_kvgate_method_not_allowed(ngx_http_request_t *r, const char *allow)
{
    ngx_table_elt_t  *h;
    u_char            msg[256];

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "Allow");
    h->value.data = (u_char *) allow;
    h->value.len = ngx_strlen(allow);

    ngx_snprintf(msg, sizeof(msg) - 1, "Method %V not allowed for %V; use %s%Z",
                 &r->method_name, &r->uri, allow);

    return ngx_http_kvgate_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                      "invalid_request_error",
                                      "method_not_allowed", (char *) msg, 0);
}


static ngx_int_t
ngx_http_kvgate_handler(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_http_kvgate_ctx_t       *ctx;
    ngx_http_kvgate_loc_conf_t  *klcf;
    u_char                       msg[512];

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);

    if (klcf->handler == NGX_HTTP_KVGATE_METRICS) {
        return ngx_http_kvgate_metrics_handler(r);
    }

    if (klcf->handler == NGX_HTTP_KVGATE_STATUS) {
        return ngx_http_kvgate_status_handler(r);
    }

    if (klcf->handler == NGX_HTTP_KVGATE_ADMIN) {
        return ngx_http_kvgate_admin_handler(r);
    }

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_kvgate_ctx_t));
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->request = r;
    ctx->bucket = NGX_HTTP_KVGATE_BUCKET_NONE;
    ctx->ttft_us = -1;
    ctx->start = ngx_current_msec;
    ngx_gettimeofday(&ctx->start_tv);
    ctx->endpoint = ngx_http_kvgate_endpoint(r);

    ngx_http_set_ctx(r, ctx, ngx_http_kvgate_module);

    if (r->err_status >= NGX_HTTP_BAD_REQUEST) {
        /* nginx itself refused the request (body too large, bad chunked
           encoding, body timeout) and error_page brought it here */
        return ngx_http_kvgate_error_page(r, ctx);
    }

    switch (ctx->endpoint) {

    case NGX_HTTP_KVGATE_EP_MODELS:
        if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
            rc = ngx_http_discard_request_body(r);
            if (rc != NGX_OK) {
                return rc;
            }

            return ngx_http_kvgate_method_not_allowed(r, "GET");
        }

        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        return ngx_http_kvgate_send_models(r);

    case NGX_HTTP_KVGATE_EP_COMPLETIONS:
    case NGX_HTTP_KVGATE_EP_CHAT:
    case NGX_HTTP_KVGATE_EP_MESSAGES:
        if (r->method != NGX_HTTP_POST) {
            rc = ngx_http_discard_request_body(r);
            if (rc != NGX_OK) {
                return rc;
            }

            return ngx_http_kvgate_method_not_allowed(r, "POST");
        }

        return ngx_http_kvgate_completion_handler(r, ctx);

    default:
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        ngx_snprintf(msg, sizeof(msg) - 1, "Invalid URL (%V %V)%Z",
                     &r->method_name, &r->uri);

        return ngx_http_kvgate_send_error(r, NGX_HTTP_NOT_FOUND,
                                          "invalid_request_error", NULL,
                                          (char *) msg, 0);
    }
}


/*
 * Statuses nginx produces on its own in a kvgate location; kvgate_pass adds
 * error_page entries for them that lead back here, so that clients get an
 * OpenAI error object instead of an HTML page.
 */

static ngx_int_t  ngx_http_kvgate_core_errors[] = {
    NGX_HTTP_BAD_REQUEST,
    NGX_HTTP_REQUEST_TIME_OUT,
    NGX_HTTP_LENGTH_REQUIRED,
    NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
    NGX_HTTP_REQUEST_URI_TOO_LARGE,
    NGX_HTTP_REQUEST_HEADER_TOO_LARGE,
    NGX_HTTP_INTERNAL_SERVER_ERROR,
    0
};


static ngx_int_t
ngx_http_kvgate_error_page(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx)
{
    ngx_int_t                    rc;
    const char                  *msg, *code;
    kvg_api_error                err;

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK && rc != NGX_AGAIN) {
        return rc;
    }

    code = NULL;

    switch (r->err_status) {

    case NGX_HTTP_REQUEST_ENTITY_TOO_LARGE:
        /* client_max_body_size or the limit the context implies */
        ngx_http_kvgate_prompt_too_large(r, &err);
        ctx->status = r->err_status;
        return ngx_http_kvgate_send_api_error(r, &err, 0);

    case NGX_HTTP_REQUEST_TIME_OUT:
        msg = "The request body did not arrive in time";
        break;

    case NGX_HTTP_LENGTH_REQUIRED:
        msg = "A request body length is required";
        break;

    case NGX_HTTP_BAD_REQUEST:
        msg = "The HTTP request is malformed (its request line, its headers, "
              "or its chunked body)";
        break;

    case NGX_HTTP_REQUEST_URI_TOO_LARGE:
        msg = "The request line is too long";
        break;

    case NGX_HTTP_REQUEST_HEADER_TOO_LARGE:
        /* nginx's own code, answered as 400 on the wire, as nginx does */
        r->err_status = NGX_HTTP_BAD_REQUEST;
        msg = "The request's headers are too large";
        break;

    default:
        msg = "The server failed to process the request";
        break;
    }

    ctx->status = r->err_status;

    return ngx_http_kvgate_send_error(r, r->err_status, NULL, code, msg, 0);
}


/* ---- variables ---- */

typedef enum {
    NGX_HTTP_KVGATE_VAR_TENANT = 0,
    NGX_HTTP_KVGATE_VAR_BUCKET,
    NGX_HTTP_KVGATE_VAR_PROMPT_TOKENS,
    NGX_HTTP_KVGATE_VAR_CACHED_TOKENS,
    NGX_HTTP_KVGATE_VAR_COMPLETION_TOKENS,
    NGX_HTTP_KVGATE_VAR_CACHE_STATUS,
    NGX_HTTP_KVGATE_VAR_TTFT,
    NGX_HTTP_KVGATE_VAR_ROUTE_KEY,
    NGX_HTTP_KVGATE_VAR_SAMPLES,
    NGX_HTTP_KVGATE_VAR_VOTE_ANSWER,
    NGX_HTTP_KVGATE_VAR_ENGINE,
    NGX_HTTP_KVGATE_VAR_ANSWER_STEPS,
    NGX_HTTP_KVGATE_VAR_CACHE_WRITE_TOKENS
} ngx_http_kvgate_var_e;


static ngx_int_t
ngx_http_kvgate_variable(ngx_http_request_t *r, ngx_http_variable_value_t *v,
    uintptr_t data)
{
    u_char                      *p;
    uint32_t                     n;
    ngx_http_kvgate_ctx_t       *ctx;
    ngx_http_kvgate_loc_conf_t  *klcf;

    n = 0;
    ctx = ngx_http_get_module_ctx(r, ngx_http_kvgate_module);

    if (ctx == NULL && data == NGX_HTTP_KVGATE_VAR_ROUTE_KEY) {

        /* a front tier proxying by the key: compute it from the body read by
           proxy_pass (request buffering on) */

        if (r->request_body == NULL) {
            v->not_found = 1;
            return NGX_OK;
        }

        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_kvgate_ctx_t));
        if (ctx == NULL) {
            return NGX_ERROR;
        }

        ctx->request = r;
        ctx->bucket = NGX_HTTP_KVGATE_BUCKET_NONE;
        ctx->ttft_us = -1;
        ctx->endpoint = ngx_http_kvgate_endpoint(r);

        /* kept for later evaluations (the access log); the log phase does not
           count a request this module did not serve */

        ctx->front = 1;
        ngx_http_set_ctx(r, ctx, ngx_http_kvgate_module);

        (void) ngx_http_kvgate_route_key_from_body(r, ctx);
    }

    if (ctx == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->valid = 1;
    v->no_cacheable = 0;
    v->not_found = 0;

    switch (data) {

    case NGX_HTTP_KVGATE_VAR_TENANT:
        /* the salt is set with the name, once the tenant is resolved */

        if (ctx->salt.data == NULL) {
            v->not_found = 1;
            return NGX_OK;
        }

        v->data = ctx->tenant.data;
        v->len = ctx->tenant.len;
        return NGX_OK;

    case NGX_HTTP_KVGATE_VAR_BUCKET:
        if (ctx->bucket == NGX_HTTP_KVGATE_BUCKET_NONE) {
            v->not_found = 1;
            return NGX_OK;
        }

        klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);
        v->data = (u_char *) kvg_bucket_label(&klcf->buckets, ctx->bucket);
        v->len = ngx_strlen(v->data);
        return NGX_OK;

    case NGX_HTTP_KVGATE_VAR_PROMPT_TOKENS:
        if (!ctx->usage_set && ctx->n_tokens == 0) {
            v->not_found = 1;
            return NGX_OK;
        }

        n = ctx->usage_set ? ctx->prompt_tokens : (uint32_t) ctx->n_tokens;
        break;

    case NGX_HTTP_KVGATE_VAR_CACHED_TOKENS:
        if (ctx->cache_status == NULL) {
            v->not_found = 1;
            return NGX_OK;
        }

        n = ctx->cached_tokens;
        break;

    case NGX_HTTP_KVGATE_VAR_COMPLETION_TOKENS:
        if (!ctx->usage_set) {
            v->not_found = 1;
            return NGX_OK;
        }

        n = ctx->completion_tokens;
        break;

    case NGX_HTTP_KVGATE_VAR_CACHE_WRITE_TOKENS:
        /* prompt tokens the request wrote to the tenant's cache: those not
           served from it, when it went through the cache (0 for a bypass) */
        if (!ctx->usage_set) {
            v->not_found = 1;
            return NGX_OK;
        }

        n = ctx->bypass ? 0 : ctx->prompt_tokens
                              - ngx_min(ctx->cached_tokens, ctx->prompt_tokens);
        break;

    case NGX_HTTP_KVGATE_VAR_CACHE_STATUS:
        if (ctx->cache_status == NULL) {
            v->not_found = 1;
            return NGX_OK;
        }

        v->data = (u_char *) ctx->cache_status;
        v->len = ngx_strlen(ctx->cache_status);
        return NGX_OK;

    case NGX_HTTP_KVGATE_VAR_TTFT:
        if (ctx->ttft_us < 0) {
            v->not_found = 1;
            return NGX_OK;
        }

        break;

    case NGX_HTTP_KVGATE_VAR_ROUTE_KEY:
        if (!ctx->route_key_set) {
            v->not_found = 1;
            return NGX_OK;
        }

        v->data = ctx->route_key;
        v->len = sizeof(ctx->route_key);
        return NGX_OK;

    case NGX_HTTP_KVGATE_VAR_SAMPLES:
        /* self-consistency: the samples drawn (empty without a vote) */
        if (ctx->sc == NULL) {
            v->not_found = 1;
            return NGX_OK;
        }

        n = kvg_sc_samples_run(ctx->sc);
        break;

    case NGX_HTTP_KVGATE_VAR_ANSWER_STEPS:
        /* self-consistency: the answer_pattern's matching steps over the
           samples (empty without a pattern) */
        if (ctx->answer_re == NULL) {
            v->not_found = 1;
            return NGX_OK;
        }

        n = (ngx_uint_t) kvg_answer_re_steps(ctx->answer_re);
        break;

    case NGX_HTTP_KVGATE_VAR_ENGINE:
        /* the engine the request was routed to (its name) */
        if (!ctx->routed || ctx->ereq.engine == NULL) {
            v->not_found = 1;
            return NGX_OK;
        }

        v->data = ctx->ereq.engine->name.data;
        v->len = ctx->ereq.engine->name.len;
        return NGX_OK;

    case NGX_HTTP_KVGATE_VAR_VOTE_ANSWER:
        {
            size_t       len;
            const char  *a;

            a = ctx->sc ? kvg_sc_answer(ctx->sc, &len) : NULL;

            if (a == NULL) {
                v->not_found = 1;
                return NGX_OK;
            }

            /* the access log escapes it (escape=default or json) */
            v->data = (u_char *) a;
            v->len = len;
        }
        return NGX_OK;

    default:
        v->not_found = 1;
        return NGX_OK;
    }

    /* a number: n, or the ttft in microseconds when it is that variable */

    p = ngx_pnalloc(r->pool, NGX_INT64_LEN + 8);
    if (p == NULL) {
        return NGX_ERROR;
    }

    if (data == NGX_HTTP_KVGATE_VAR_TTFT) {
        v->len = ngx_sprintf(p, "%i.%06i", ctx->ttft_us / 1000000,
                             ctx->ttft_us % 1000000) - p;

    } else {
        v->len = ngx_sprintf(p, "%uD", n) - p;
    }

    v->data = p;

    return NGX_OK;
}


static ngx_http_variable_t  ngx_http_kvgate_vars[] = {

    { ngx_string("kvgate_tenant"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_TENANT, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kvgate_bucket"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_BUCKET, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kvgate_prompt_tokens"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_PROMPT_TOKENS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kvgate_cached_tokens"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_CACHED_TOKENS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kvgate_completion_tokens"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_COMPLETION_TOKENS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kvgate_cache_status"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_CACHE_STATUS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kvgate_ttft"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_TTFT, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kvgate_route_key"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_ROUTE_KEY, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kvgate_samples"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_SAMPLES, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kvgate_vote_answer"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_VOTE_ANSWER, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kvgate_engine"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_ENGINE, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kvgate_answer_steps"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_ANSWER_STEPS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kvgate_cache_write_tokens"), NULL, ngx_http_kvgate_variable,
      NGX_HTTP_KVGATE_VAR_CACHE_WRITE_TOKENS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


static ngx_int_t
ngx_http_kvgate_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_kvgate_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


/* ---- counting, once per request ---- */

static ngx_int_t
ngx_http_kvgate_log_handler(ngx_http_request_t *r)
{
    ngx_http_kvgate_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kvgate_module);

    if (ctx != NULL && !ctx->front) {
        ngx_http_kvgate_limit_done(ctx);
        ngx_http_kvgate_metrics_count(r, ctx);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_kvgate_postconfiguration(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_LOG_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_kvgate_log_handler;

    if (ngx_http_kvgate_limit_check(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_kvgate_server_error_pages(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_kvgate_request_init(cf);
}


/* ---- configuration ---- */

/* A server with a kvgate_pass location, and that location's URI. */

typedef struct {
    ngx_http_core_srv_conf_t    *cscf;
    ngx_str_t                    uri;
} ngx_http_kvgate_server_t;


/* A kvgate_pass (or kvgate_admin), to be given its group once the http
   block is read. */

typedef struct {
    ngx_str_t                    directive;   /* which of the two */
    ngx_str_t                    name;        /* empty: kvgate_engine's */
    ngx_http_kvgate_loc_conf_t  *klcf;
    ngx_str_t                    file;
    ngx_uint_t                   line;
} ngx_http_kvgate_ref_t;




static void *
ngx_http_kvgate_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_kvgate_main_conf_t  *kmcf;

    kmcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_kvgate_main_conf_t));
    if (kmcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     kmcf->engine = { 0, NULL };
     *     kmcf->default_group = NULL;
     *     kmcf->pass_file = { 0, NULL };
     *     kmcf->pass_line = 0;
     *     kmcf->shm_zone = NULL;
     */

    if (ngx_array_init(&kmcf->engines, cf->pool, 4,
                       sizeof(ngx_http_kvgate_engine_t *)) != NGX_OK
        || ngx_array_init(&kmcf->groups, cf->pool, 4,
                          sizeof(ngx_http_kvgate_group_t *)) != NGX_OK
        || ngx_array_init(&kmcf->refs, cf->pool, 4,
                          sizeof(ngx_http_kvgate_ref_t)) != NGX_OK
        || ngx_array_init(&kmcf->servers, cf->pool, 2,
                          sizeof(ngx_http_kvgate_server_t)) != NGX_OK)
    {
        return NULL;
    }

    kmcf->connect_wait = NGX_CONF_UNSET_MSEC;
    kmcf->engine_stall = NGX_CONF_UNSET_MSEC;

    return kmcf;
}


static char *
ngx_http_kvgate_init_main_conf(ngx_conf_t *cf, void *conf)
{
    ngx_http_kvgate_main_conf_t  *kmcf = conf;

    ngx_uint_t                 i, j;
    ngx_http_kvgate_ref_t     *ref;
    ngx_http_kvgate_group_t  **groups, *g;

    ref = kmcf->refs.elts;
    groups = kmcf->groups.elts;

    for (i = 0; i < kmcf->refs.nelts; i++) {

        if (ref[i].name.len == 0) {
            if (kmcf->default_group == NULL) {
                ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                              "\"%V\" in %V:%ui requires "
                              "\"kvgate_engine\" in the http block (or name "
                              "a \"kvgate_engines\" group)",
                              &ref[i].directive,
                              &ref[i].file, ref[i].line);
                return NGX_CONF_ERROR;
            }

            ref[i].klcf->group = kmcf->default_group;
            continue;
        }

        g = NULL;

        for (j = 0; j < kmcf->groups.nelts; j++) {
            if (groups[j]->name.len == ref[i].name.len
                && ngx_strncmp(groups[j]->name.data, ref[i].name.data,
                               ref[i].name.len) == 0)
            {
                g = groups[j];
                break;
            }
        }

        if (g == NULL) {
            ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                          "\"%V %V\" in %V:%ui: there is no "
                          "\"kvgate_engines %V\" block in the http block",
                          &ref[i].directive, &ref[i].name, &ref[i].file,
                          ref[i].line, &ref[i].name);
            return NGX_CONF_ERROR;
        }

        ref[i].klcf->group = g;
    }

    /* long enough for a handshake (milliseconds), short enough that a
       client never mistakes the wait for a hang */
    ngx_conf_init_msec_value(kmcf->connect_wait, 2000);

    /* well above the longest layer of a forward step on a CPU (the heartbeat
       moves once a layer) and the engine's 100 ms idle beat; far below the
       5 minutes of kvgate_timeout that a hung engine held requests before */
    ngx_conf_init_msec_value(kmcf->engine_stall, 2000);

    if (kmcf->engines.nelts == 0) {
        return NGX_CONF_OK;
    }

    if (ngx_http_kvgate_metrics_init_zone(cf, kmcf) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static void *
ngx_http_kvgate_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_kvgate_loc_conf_t  *klcf;

    klcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_kvgate_loc_conf_t));
    if (klcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     klcf->handler = 0;
     *     klcf->default_tenant = { 0, NULL };
     *     klcf->buckets = { 0 };
     */

    klcf->tenant = NGX_CONF_UNSET_PTR;
    klcf->limit = NGX_CONF_UNSET_PTR;
    klcf->tenant_required = NGX_CONF_UNSET;
    klcf->cache_min_tokens = NGX_CONF_UNSET;
    klcf->bounds_set = NGX_CONF_UNSET;
    klcf->normalize = NGX_CONF_UNSET;
    klcf->cache_ttl = NGX_CONF_UNSET_MSEC;
    klcf->cache_ttl_max = NGX_CONF_UNSET_MSEC;
    klcf->timeout = NGX_CONF_UNSET_MSEC;
    klcf->page_refresh = NGX_CONF_UNSET_MSEC;
    klcf->max_tokens = NGX_CONF_UNSET;
    klcf->max_n = NGX_CONF_UNSET;
    klcf->route_blocks = NGX_CONF_UNSET;
    klcf->answer_sample_steps = NGX_CONF_UNSET;
    klcf->answer_request_steps = NGX_CONF_UNSET;
    klcf->max_unsent = NGX_CONF_UNSET_SIZE;
    klcf->thread_min_bytes = NGX_CONF_UNSET_SIZE;

    return klcf;
}


/*
 * Adds error_page entries for the statuses nginx answers by itself to clcf,
 * pointing to uri, a kvgate_pass location (which then renders them as OpenAI
 * errors), unless the configuration has its own error_page for them. The
 * array may be inherited from the parent, so it is copied, never changed in
 * place.
 */

static char *
ngx_http_kvgate_add_error_pages(ngx_conf_t *cf, ngx_http_core_loc_conf_t *clcf,
    ngx_str_t *uri)
{
    ngx_int_t             *s;
    ngx_uint_t             i, have;
    ngx_array_t           *pages;
    ngx_http_err_page_t   *err, *old;

    pages = ngx_array_create(cf->pool, 8, sizeof(ngx_http_err_page_t));
    if (pages == NULL) {
        return NGX_CONF_ERROR;
    }

    if (clcf->error_pages) {
        old = clcf->error_pages->elts;

        for (i = 0; i < clcf->error_pages->nelts; i++) {
            err = ngx_array_push(pages);
            if (err == NULL) {
                return NGX_CONF_ERROR;
            }

            *err = old[i];
        }
    }

    for (s = ngx_http_kvgate_core_errors; *s; s++) {
        have = 0;
        old = pages->elts;

        for (i = 0; i < pages->nelts; i++) {
            if (old[i].status == *s) {
                have = 1;
                break;
            }
        }

        if (have) {
            continue;
        }

        err = ngx_array_push(pages);
        if (err == NULL) {
            return NGX_CONF_ERROR;
        }

        ngx_memzero(err, sizeof(ngx_http_err_page_t));
        err->status = *s;
        err->overwrite = -1;
        err->value.value = *uri;
    }

    clcf->error_pages = pages;

    return NGX_CONF_OK;
}


static char *
ngx_http_kvgate_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_kvgate_loc_conf_t *prev = parent;
    ngx_http_kvgate_loc_conf_t *conf = child;

    ngx_http_core_loc_conf_t  *clcf;

    /*
     * kvgate_pass is not inherited, as with proxy_pass: the content handler
     * belongs to the location it is written in.
     */

    if (conf->tenant == NGX_CONF_UNSET_PTR) {
        conf->tenant = prev->tenant == NGX_CONF_UNSET_PTR ? NULL
                                                          : prev->tenant;
        conf->tenant_headers = prev->tenant_headers;
    }

    ngx_conf_merge_ptr_value(conf->limit, prev->limit, NULL);
    ngx_conf_merge_value(conf->tenant_required, prev->tenant_required, 0);
    ngx_conf_merge_str_value(conf->default_tenant, prev->default_tenant,
                             "default");
    ngx_conf_merge_value(conf->cache_min_tokens, prev->cache_min_tokens, 128);
    if (conf->bounds_set == NGX_CONF_UNSET) {
        conf->bounds_set = prev->bounds_set == 1;
        conf->bounds = prev->bounds;
    }
    ngx_conf_merge_value(conf->normalize, prev->normalize, 0);
    ngx_conf_merge_msec_value(conf->cache_ttl, prev->cache_ttl, 0);
    ngx_conf_merge_msec_value(conf->cache_ttl_max, prev->cache_ttl_max, 3600000);
    ngx_conf_merge_msec_value(conf->timeout, prev->timeout, 300000);
    ngx_conf_merge_msec_value(conf->page_refresh, prev->page_refresh, 1000);
    ngx_conf_merge_value(conf->max_tokens, prev->max_tokens, 0);
    ngx_conf_merge_value(conf->max_n, prev->max_n, KVG_PROTO_MAX_N);
    ngx_conf_merge_value(conf->route_blocks, prev->route_blocks, 8);
    ngx_conf_merge_value(conf->answer_sample_steps, prev->answer_sample_steps,
                         KVG_ANSWER_RE_SAMPLE_STEPS);
    ngx_conf_merge_value(conf->answer_request_steps,
                         prev->answer_request_steps,
                         KVG_ANSWER_RE_REQUEST_STEPS);
    ngx_conf_merge_size_value(conf->max_unsent, prev->max_unsent, 32 * 1024);

    /*
     * kvgate_thread_pool: inherited; by default nginx's "default" pool (32
     * threads, created on demand) for bodies of 16k and more, when nginx has
     * thread pools at all.
     */

    if (conf->thread_pool_name.data == NULL) {
        conf->thread_pool_name = prev->thread_pool_name;
#if (NGX_THREADS)
        conf->thread_pool = prev->thread_pool;
#endif
    }

    ngx_conf_merge_size_value(conf->thread_min_bytes, prev->thread_min_bytes,
                              16384);

    if (conf->thread_pool_name.data == NULL
        && conf->handler == NGX_HTTP_KVGATE_PASS)
    {
#if (NGX_THREADS)
        ngx_str_set(&conf->thread_pool_name, "default");

        conf->thread_pool = ngx_thread_pool_add(cf, &conf->thread_pool_name);
        if (conf->thread_pool == NULL) {
            return NGX_CONF_ERROR;
        }
#else
        ngx_str_set(&conf->thread_pool_name, "off");
#endif
    }

    /* kvgate_default_tenant, kvgate_timeout and kvgate_cache_ttl were
       checked by their post handlers as they were read */

    /* the bypass threshold first, then the configured bounds above it */

    kvg_buckets_with_min(&conf->buckets, (uint32_t) conf->cache_min_tokens,
                         conf->bounds_set ? &conf->bounds : NULL);

    if (conf->handler == NGX_HTTP_KVGATE_PASS) {
        clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
        conf->max_body = clcf->client_max_body_size;

        if (ngx_http_kvgate_is_prefix_location(clcf)) {
            if (ngx_http_kvgate_add_error_pages(cf, clcf, &clcf->name)
                != NGX_CONF_OK)
            {
                return NGX_CONF_ERROR;
            }

            if (ngx_http_kvgate_note_server(cf, clcf) != NGX_OK) {
                return NGX_CONF_ERROR;
            }
        }
    }

    return NGX_CONF_OK;
}


/* A location error_page can send a request to: a plain prefix location. */

static ngx_uint_t
ngx_http_kvgate_is_prefix_location(ngx_http_core_loc_conf_t *clcf)
{
    return !(clcf->named || clcf->noname
#if (NGX_PCRE)
             || clcf->regex
#endif
             || clcf->name.len == 0 || clcf->name.data[0] != '/');
}


/*
 * The server of the kvgate_pass location being merged (while locations are
 * merged, cf->ctx's srv_conf is their server's), noted once with the
 * location's URI for ngx_http_kvgate_server_error_pages().
 */

static ngx_int_t
ngx_http_kvgate_note_server(ngx_conf_t *cf, ngx_http_core_loc_conf_t *clcf)
{
    ngx_uint_t                    i;
    ngx_http_kvgate_server_t     *srv;
    ngx_http_core_srv_conf_t     *cscf;
    ngx_http_kvgate_main_conf_t  *kmcf;

    kmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_kvgate_module);
    cscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_core_module);

    srv = kmcf->servers.elts;

    for (i = 0; i < kmcf->servers.nelts; i++) {
        if (srv[i].cscf == cscf) {
            return NGX_OK;
        }
    }

    srv = ngx_array_push(&kmcf->servers);
    if (srv == NULL) {
        return NGX_ERROR;
    }

    srv->cscf = cscf;
    srv->uri = clcf->name;

    return NGX_OK;
}


/*
 * nginx refuses some requests before it picks a location (a malformed
 * request line or headers, Content-Length and Transfer-Encoding together,
 * %00 in the URI, headers too large) and answers them with its server-level
 * error pages: HTML. In a server that holds a kvgate_pass location they go
 * to that location as error_page entries of the server itself, added once
 * every location is merged (so no location inherits them), unless the
 * server has its own error_page for the status.
 */

static ngx_int_t
ngx_http_kvgate_server_error_pages(ngx_conf_t *cf)
{
    ngx_uint_t                    i;
    ngx_http_kvgate_server_t     *srv;
    ngx_http_core_loc_conf_t     *clcf;
    ngx_http_kvgate_main_conf_t  *kmcf;

    kmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_kvgate_module);
    srv = kmcf->servers.elts;

    for (i = 0; i < kmcf->servers.nelts; i++) {
        clcf = srv[i].cscf->ctx->loc_conf[ngx_http_core_module.ctx_index];

        if (ngx_http_kvgate_add_error_pages(cf, clcf, &srv[i].uri)
            != NGX_CONF_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* kvgate_thread_pool off | name [min_bytes=size] */

static char *
ngx_http_kvgate_thread_pool(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_kvgate_loc_conf_t  *klcf = conf;

    ssize_t     n;
    ngx_str_t  *value, s;

    if (klcf->thread_pool_name.data != NULL) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (cf->args->nelts == 3) {
        if (ngx_strncmp(value[2].data, "min_bytes=", 10) != 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\" (expected "
                               "min_bytes=size)", &value[2]);
            return NGX_CONF_ERROR;
        }

        s.data = value[2].data + 10;
        s.len = value[2].len - 10;

        n = ngx_parse_size(&s);
        if (n == NGX_ERROR) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid min_bytes \"%V\" (a size such as "
                               "16k)", &s);
            return NGX_CONF_ERROR;
        }

        klcf->thread_min_bytes = (size_t) n;
    }

    klcf->thread_pool_name = value[1];

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {
        if (cf->args->nelts == 3) {
            return "takes no min_bytes with \"off\"";
        }

#if (NGX_THREADS)
        klcf->thread_pool = NULL;
#endif
        return NGX_CONF_OK;
    }

#if (NGX_THREADS)

    /* an undeclared name other than "default" fails at the end of the
       configuration (nginx's thread_pool module says which) */

    klcf->thread_pool = ngx_thread_pool_add(cf, &value[1]);
    if (klcf->thread_pool == NULL) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;

#else

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"kvgate_thread_pool %V\" needs nginx built with "
                       "thread pools (--with-threads); use \"off\"",
                       &value[1]);
    return NGX_CONF_ERROR;

#endif
}


/*
 * An engine named by kvgate_engine or an engine line of kvgate_engines: the
 * one object of that socket (a socket named twice, in two groups, is one
 * connection), made on first sight. name: name=, or empty (the path).
 */

static ngx_http_kvgate_engine_t *
ngx_http_kvgate_add_engine(ngx_conf_t *cf, ngx_http_kvgate_main_conf_t *kmcf,
    ngx_str_t *url, ngx_str_t *name, const char *directive)
{
    u_char                     *p;
    uint64_t                    h;
    ngx_url_t                   u;
    ngx_str_t                   path;
    ngx_uint_t                  i;
    ngx_http_kvgate_engine_t  **all, *e, **pe;

    /*
     * The engine is always co-located: a unix socket keeps it off the
     * network and lets the file mode decide who may submit work to it.
     */

    if (url->len < sizeof("unix:") - 1
        || ngx_strncmp(url->data, "unix:", sizeof("unix:") - 1) != 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%s\" directive, "
                           "it must be \"unix:/path/to/socket\"",
                           url, directive);
        return NULL;
    }

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = *url;
    u.no_resolve = 1;

    if (ngx_parse_url(cf->pool, &u) != NGX_OK || u.naddrs != 1) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%s\" directive: %s",
                           url, directive,
                           u.err ? u.err : "not a unix socket path");
        return NULL;
    }

    path.data = url->data + sizeof("unix:") - 1;
    path.len = url->len - (sizeof("unix:") - 1);

    all = kmcf->engines.elts;

    for (i = 0; i < kmcf->engines.nelts; i++) {
        e = all[i];

        if (ngx_strlen(e->path) == path.len
            && ngx_strncmp(e->path, path.data, path.len) == 0)
        {
            if (name->len
                && (name->len != e->name.len
                    || ngx_strncmp(name->data, e->name.data, name->len) != 0))
            {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "engine \"%V\" is named \"%V\" here and "
                                   "\"%V\" elsewhere", url, name, &e->name);
                return NULL;
            }

            return e;
        }

        if (name->len == e->name.len
            && ngx_strncmp(name->data, e->name.data, name->len) == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "duplicate engine name \"%V\" (\"%V\" and "
                               "\"unix:%s\")", name, url, e->path);
            return NULL;
        }
    }

    if (kmcf->engines.nelts >= NGX_HTTP_KVGATE_MAX_ENGINES) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "too many engines (at most %d in all groups)",
                           NGX_HTTP_KVGATE_MAX_ENGINES);
        return NULL;
    }

    e = ngx_pcalloc(cf->pool, sizeof(ngx_http_kvgate_engine_t));
    if (e == NULL) {
        return NULL;
    }

    e->url = *url;
    e->index = kmcf->engines.nelts;

    /* NUL-terminated copy of the path for the client library */

    e->path = ngx_pnalloc(cf->pool, path.len + 1);
    if (e->path == NULL) {
        return NULL;
    }

    ngx_cpystrn((u_char *) e->path, path.data, path.len + 1);

    if (name->len) {
        e->name = *name;

    } else {
        e->name.data = (u_char *) e->path;
        e->name.len = path.len;
    }

    /* the rendezvous id: FNV-1a of the name, stable across reloads and
       workers, so a tenant keeps its engine */

    h = 14695981039346656037ULL;

    for (p = e->name.data; p < e->name.data + e->name.len; p++) {
        h = (h ^ *p) * 1099511628211ULL;
    }

    e->id = h;

    pe = ngx_array_push(&kmcf->engines);
    if (pe == NULL) {
        return NULL;
    }

    *pe = e;

    return e;
}


static ngx_http_kvgate_group_t *
ngx_http_kvgate_add_group(ngx_conf_t *cf, ngx_http_kvgate_main_conf_t *kmcf,
    ngx_str_t *name)
{
    ngx_uint_t                 i;
    ngx_http_kvgate_group_t  **groups, *g, **pg;

    groups = kmcf->groups.elts;

    for (i = 0; i < kmcf->groups.nelts; i++) {
        if (groups[i]->name.len == name->len
            && ngx_strncmp(groups[i]->name.data, name->data, name->len) == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "duplicate \"kvgate_engines %V\" (first in "
                               "%V:%ui)", name, &groups[i]->file,
                               groups[i]->line);
            return NULL;
        }
    }

    g = ngx_pcalloc(cf->pool, sizeof(ngx_http_kvgate_group_t));
    if (g == NULL) {
        return NULL;
    }

    g->engines = ngx_pcalloc(cf->pool, NGX_HTTP_KVGATE_MAX_ENGINES
                                       * sizeof(ngx_http_kvgate_engine_t *));
    if (g->engines == NULL) {
        return NULL;
    }

    g->name = *name;
    g->policy = KVG_ROUTE_PREFIX;
    g->balance_factor = 1.25;
    g->file = cf->conf_file->file.name;
    g->line = cf->conf_file->line;

    pg = ngx_array_push(&kmcf->groups);
    if (pg == NULL) {
        return NULL;
    }

    *pg = g;

    return g;
}


static char *
ngx_http_kvgate_engine_directive(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_kvgate_main_conf_t  *kmcf = conf;

    ngx_str_t                 *value, none;
    ngx_http_kvgate_engine_t  *e;
    ngx_http_kvgate_group_t   *g;

    if (kmcf->engine.data != NULL) {
        return "is duplicate";
    }

    value = cf->args->elts;
    ngx_str_null(&none);

    e = ngx_http_kvgate_add_engine(cf, kmcf, &value[1], &none,
                                   "kvgate_engine");
    if (e == NULL) {
        return NGX_CONF_ERROR;
    }

    kmcf->engine = value[1];

    /* a group of one, named "" (no kvgate_engines block can be) */

    g = ngx_http_kvgate_add_group(cf, kmcf, &none);
    if (g == NULL) {
        return NGX_CONF_ERROR;
    }

    g->engines[g->n++] = e;
    kmcf->default_group = g;

    return NGX_CONF_OK;
}


/*
 * kvgate_engines NAME { engine unix:PATH [name=N]; route P; balance_factor F; }
 * The block's lines are read by ngx_http_kvgate_engines_body (as map's and
 * types' are), with the group as cf->handler_conf.
 */

static char *
ngx_http_kvgate_engines_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_kvgate_main_conf_t  *kmcf = conf;

    char                     *rv;
    ngx_str_t                *value;
    ngx_conf_t                save;
    ngx_http_kvgate_group_t  *g;

    value = cf->args->elts;

    if (value[1].len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"kvgate_engines\" needs a name");
        return NGX_CONF_ERROR;
    }

    g = ngx_http_kvgate_add_group(cf, kmcf, &value[1]);
    if (g == NULL) {
        return NGX_CONF_ERROR;
    }

    save = *cf;
    cf->handler = ngx_http_kvgate_engines_body;
    cf->handler_conf = (char *) g;

    rv = ngx_conf_parse(cf, NULL);

    *cf = save;

    if (rv != NGX_CONF_OK) {
        return rv;
    }

    if (g->n == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"kvgate_engines %V\" has no \"engine\"",
                           &g->name);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_kvgate_engines_body(ngx_conf_t *cf, ngx_command_t *dummy, void *conf)
{
    ngx_http_kvgate_group_t  *g = (ngx_http_kvgate_group_t *) cf->handler_conf;

    double                        f;
    ngx_int_t                     n, scale;
    kvg_route_policy              policy;
    ngx_str_t                    *value, name;
    ngx_uint_t                    i, nargs, dot;
    ngx_http_kvgate_engine_t     *e;
    ngx_http_kvgate_main_conf_t  *kmcf;

    value = cf->args->elts;
    nargs = cf->args->nelts;

    kmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_kvgate_module);

    if (value[0].len == sizeof("engine") - 1
        && ngx_strncmp(value[0].data, "engine", value[0].len) == 0)
    {
        ngx_str_null(&name);

        if (nargs < 2 || nargs > 3) {
            goto nargs;
        }

        if (nargs == 3) {
            if (value[2].len <= sizeof("name=") - 1
                || ngx_strncmp(value[2].data, "name=", sizeof("name=") - 1)
                   != 0)
            {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid parameter \"%V\" of \"engine\" in "
                                   "\"kvgate_engines %V\": only name=NAME",
                                   &value[2], &g->name);
                return NGX_CONF_ERROR;
            }

            name.data = value[2].data + sizeof("name=") - 1;
            name.len = value[2].len - (sizeof("name=") - 1);
        }

        e = ngx_http_kvgate_add_engine(cf, kmcf, &value[1], &name, "engine");
        if (e == NULL) {
            return NGX_CONF_ERROR;
        }

        for (i = 0; i < g->n; i++) {
            if (g->engines[i] == e) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "engine \"%V\" is duplicate in "
                                   "\"kvgate_engines %V\"", &value[1],
                                   &g->name);
                return NGX_CONF_ERROR;
            }
        }

        g->engines[g->n++] = e;

        return NGX_CONF_OK;
    }

    if (value[0].len == sizeof("route") - 1
        && ngx_strncmp(value[0].data, "route", value[0].len) == 0)
    {
        if (nargs != 2) {
            goto nargs;
        }

        if (kvg_route_policy_parse((char *) value[1].data, value[1].len,
                                   &policy) == 0)
        {
            g->policy = (ngx_uint_t) policy;
            return NGX_CONF_OK;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"route\" of "
                           "\"kvgate_engines %V\": it must be \"prefix\", "
                           "\"hash\", \"least_load\" or \"round_robin\"",
                           &value[1], &g->name);
        return NGX_CONF_ERROR;
    }

    if (value[0].len == sizeof("balance_factor") - 1
        && ngx_strncmp(value[0].data, "balance_factor", value[0].len) == 0)
    {
        if (nargs != 2) {
            goto nargs;
        }

        /* a decimal: digits, at most one point, up to 3 places */

        n = 0;
        scale = 1;
        dot = 0;

        for (i = 0; i < value[1].len; i++) {
            if (value[1].data[i] == '.' && !dot) {
                dot = 1;
                continue;
            }

            if (value[1].data[i] < '0' || value[1].data[i] > '9'
                || n > 1000000 || scale >= 1000)
            {
                n = -1;
                break;
            }

            n = n * 10 + (value[1].data[i] - '0');

            if (dot) {
                scale *= 10;
            }
        }

        f = n < 0 || value[1].len == 0 ? 0.0 : (double) n / (double) scale;

        if (f <= 1.0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid value \"%V\" in \"balance_factor\" of "
                               "\"kvgate_engines %V\": it must be a number "
                               "more than 1 (such as 1.25)", &value[1],
                               &g->name);
            return NGX_CONF_ERROR;
        }

        g->balance_factor = f;

        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "unknown directive \"%V\" in \"kvgate_engines %V\" "
                       "(engine, route, balance_factor)", &value[0],
                       &g->name);
    return NGX_CONF_ERROR;

nargs:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid number of arguments in \"%V\" of "
                       "\"kvgate_engines %V\"", &value[0], &g->name);
    return NGX_CONF_ERROR;
}


static char *
ngx_http_kvgate_pass(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_kvgate_loc_conf_t  *klcf = conf;

    ngx_str_t                    *value;
    ngx_http_kvgate_ref_t        *ref;
    ngx_http_core_loc_conf_t     *clcf;
    ngx_http_kvgate_main_conf_t  *kmcf;

    if (klcf->handler == cmd->offset) {
        return "is duplicate";
    }

    if (klcf->handler != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" cannot share a location with "
                           "kvgate_pass, kvgate_metrics, kvgate_status or "
                           "kvgate_admin",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    klcf->handler = cmd->offset;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_kvgate_handler;

    kmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_kvgate_module);

    if (kmcf->pass_line == 0) {
        kmcf->pass_file = cf->conf_file->file.name;
        kmcf->pass_line = cf->conf_file->line;
    }

    if (cmd->offset != NGX_HTTP_KVGATE_PASS
        && cmd->offset != NGX_HTTP_KVGATE_ADMIN)
    {
        return NGX_CONF_OK;
    }

    /* the group is found once the whole http block is read (kvgate_admin's
       as kvgate_pass's: the engines it wipes) */

    value = cf->args->elts;

    ref = ngx_array_push(&kmcf->refs);
    if (ref == NULL) {
        return NGX_CONF_ERROR;
    }

    if (cf->args->nelts == 2) {
        ref->name = value[1];

    } else {
        ngx_str_null(&ref->name);
    }

    ref->directive = cmd->name;
    ref->klcf = klcf;
    ref->file = cf->conf_file->file.name;
    ref->line = cf->conf_file->line;

    return NGX_CONF_OK;
}


/*
 * ngx_conf_set_num_slot() but for the message: a value that is no number
 * is left to the bounds handler (cmd->post), which names the range. As
 * ngx_atoi() returns no negative number but NGX_ERROR, the handler sees
 * NGX_ERROR for both "many" and "-1".
 */

static char *
ngx_http_kvgate_set_num_slot(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    ngx_int_t        *np;
    ngx_str_t        *value;
    ngx_conf_post_t  *post;

    np = (ngx_int_t *) (p + cmd->offset);

    if (*np != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;
    *np = ngx_atoi(value[1].data, value[1].len);

    if (cmd->post) {
        post = cmd->post;
        return post->post_handler(cf, post, np);
    }

    return *np == NGX_ERROR ? "invalid number" : NGX_CONF_OK;
}


static char *
ngx_http_kvgate_check_num_bounds(ngx_conf_t *cf, void *post, void *data)
{
    ngx_conf_num_bounds_t  *bounds = post;
    ngx_int_t              *np = data;

    ngx_str_t  *value;

    if (*np != NGX_ERROR && *np >= bounds->low && *np <= bounds->high) {
        return NGX_CONF_OK;
    }

    value = cf->args->elts;

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid value \"%V\" in \"%V\" directive, "
                       "it must be an integer from %i to %i",
                       &value[1], &value[0], bounds->low, bounds->high);

    return NGX_CONF_ERROR;
}


/*
 * kvgate_answer_pattern_steps SAMPLE [REQUEST]: the matching steps one
 * sample's answer_pattern may take, and all of a request's samples together
 * (answer_re.h: ~5 ns a step with PCRE2's JIT, so the default million holds
 * the event loop ~5 ms at most). REQUEST defaults to four samples' worth.
 */

static char *
ngx_http_kvgate_answer_steps(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_kvgate_loc_conf_t *klcf = conf;

    ngx_int_t   n[2];
    ngx_str_t  *value;
    ngx_uint_t  i;

    if (klcf->answer_sample_steps != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {
        n[i - 1] = ngx_atoi(value[i].data, value[i].len);

        if (n[i - 1] == NGX_ERROR || n[i - 1] < 1000
            || n[i - 1] > 1000000000)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid value \"%V\" in \"%V\" directive, "
                               "it must be an integer from 1000 to "
                               "1000000000", &value[i], &cmd->name);
            return NGX_CONF_ERROR;
        }
    }

    if (cf->args->nelts == 2) {
        n[1] = n[0] <= 250000000 ? 4 * n[0] : 1000000000;

    } else if (n[1] < n[0]) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%V\" directive, "
                           "a request's steps must be at least one "
                           "sample's (%i)", &value[2], &cmd->name, n[0]);
        return NGX_CONF_ERROR;
    }

    klcf->answer_sample_steps = n[0];
    klcf->answer_request_steps = n[1];

    return NGX_CONF_OK;
}


/* ngx_conf_set_msec_slot() with a message that says what a time looks like. */

static char *
ngx_http_kvgate_set_msec_slot(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    ngx_msec_t       *mp;
    ngx_str_t        *value;
    ngx_conf_post_t  *post;

    mp = (ngx_msec_t *) (p + cmd->offset);

    if (*mp != NGX_CONF_UNSET_MSEC) {
        return "is duplicate";
    }

    value = cf->args->elts;
    *mp = ngx_parse_time(&value[1], 0);

    if (*mp == (ngx_msec_t) NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%V\" directive, "
                           "it must be a time like 30s, 5m or 250ms",
                           &value[1], &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (cmd->post) {
        post = cmd->post;
        return post->post_handler(cf, post, mp);
    }

    return NGX_CONF_OK;
}


/* kvgate_engine_stall off | time: how long an engine's heartbeat may stand
   still. Its idle engine beats every KVG_HEARTBEAT_IDLE_MS (100 ms): a
   deadline of less than three of those could take an idle engine whose
   wake-up was late for a stalled one. */

static char *
ngx_http_kvgate_engine_stall_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    char  *p = conf;

    ngx_msec_t  *mp;
    ngx_str_t   *value;

    mp = (ngx_msec_t *) (p + cmd->offset);

    if (*mp != NGX_CONF_UNSET_MSEC) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {
        *mp = 0;
        return NGX_CONF_OK;
    }

    *mp = ngx_parse_time(&value[1], 0);

    if (*mp == (ngx_msec_t) NGX_ERROR || *mp < 3 * KVG_HEARTBEAT_IDLE_MS) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%V\" directive, "
                           "it must be \"off\" or a time of at least %dms "
                           "like 2s or 500ms", &value[1], &cmd->name,
                           3 * KVG_HEARTBEAT_IDLE_MS);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* kvgate_max_unsent: below a kilobyte a stream would pause at every chunk
   (one SSE chunk is a few hundred bytes); above 64m it bounds nothing. */

static char *
ngx_http_kvgate_check_max_unsent(ngx_conf_t *cf, void *post, void *data)
{
    size_t     *sp = data;
    ngx_str_t  *value;

    if (*sp >= 1024 && *sp <= 64 * 1024 * 1024) {
        return NGX_CONF_OK;
    }

    value = cf->args->elts;

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid value \"%V\" in \"%V\" directive, "
                       "it must be between 1k and 64m", &value[1], &value[0]);

    return NGX_CONF_ERROR;
}


static char *
ngx_http_kvgate_check_timeout(ngx_conf_t *cf, void *post, void *data)
{
    ngx_msec_t  *mp = data;

    ngx_str_t  *value;

    if (*mp > 0) {
        return NGX_CONF_OK;
    }

    value = cf->args->elts;

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid value \"%V\" in \"%V\" directive, "
                       "it must be greater than 0", &value[1], &value[0]);

    return NGX_CONF_ERROR;
}


static char *
ngx_http_kvgate_check_cache_ttl_max(ngx_conf_t *cf, void *post, void *data)
{
    ngx_msec_t  *mp = data;

    if (*mp <= 3600000000) {
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"kvgate_cache_ttl_max\" is longer than 1000 hours");

    return NGX_CONF_ERROR;
}


static char *
ngx_http_kvgate_check_cache_ttl(ngx_conf_t *cf, void *post, void *data)
{
    ngx_msec_t  *mp = data;

    if (*mp <= 3600000000) {
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"kvgate_cache_ttl\" is longer than 1000 hours");

    return NGX_CONF_ERROR;
}


/*
 * kvgate_tenant: a complex value, as ngx_http_set_complex_value_slot() makes
 * it; and the request headers it reads ($http_NAME or ${http_NAME}), noted so
 * that a request carrying one of them twice can be refused. nginx's
 * $http_NAME is the first such header: behind a proxy that appends its own
 * X-Tenant-Id, the client's copy would name the tenant.
 */

static char *
ngx_http_kvgate_tenant_slot(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_kvgate_loc_conf_t *klcf = conf;

    char       *rv;
    u_char     *p, *end, *name;
    ngx_str_t  *value, *h;

    rv = ngx_http_set_complex_value_slot(cf, cmd, conf);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    value = cf->args->elts;
    p = value[1].data;
    end = p + value[1].len;

    while (p < end) {
        p = ngx_strlchr(p, end, '$');
        if (p == NULL) {
            break;
        }

        p++;

        if (p < end && *p == '{') {
            p++;
        }

        if ((size_t) (end - p) <= sizeof("http_") - 1
            || ngx_strncmp(p, "http_", sizeof("http_") - 1) != 0)
        {
            continue;
        }

        p += sizeof("http_") - 1;
        name = p;

        while (p < end && (*p == '_' || (*p >= '0' && *p <= '9')
                           || (*p >= 'a' && *p <= 'z')
                           || (*p >= 'A' && *p <= 'Z')))
        {
            p++;
        }

        if (p == name) {
            continue;
        }

        if (klcf->tenant_headers == NULL) {
            klcf->tenant_headers = ngx_array_create(cf->pool, 1,
                                                    sizeof(ngx_str_t));
            if (klcf->tenant_headers == NULL) {
                return NGX_CONF_ERROR;
            }
        }

        h = ngx_array_push(klcf->tenant_headers);
        if (h == NULL) {
            return NGX_CONF_ERROR;
        }

        h->len = p - name;
        h->data = ngx_pnalloc(cf->pool, h->len);
        if (h->data == NULL) {
            return NGX_CONF_ERROR;
        }

        /* variable names are case-insensitive: nginx lowercases them */
        ngx_strlow(h->data, name, h->len);
    }

    return NGX_CONF_OK;
}


/* The default tenant goes into the engine's salt field after a mark byte
   (prefix_hash.h), so it must leave room for it. */

static char *
ngx_http_kvgate_check_tenant(ngx_conf_t *cf, void *post, void *data)
{
    ngx_str_t  *t = data;

    if (t->len <= KVG_PREFIX_DEFAULT_NAME_MAX(KVG_PROTO_MAX_SALT)) {
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"kvgate_default_tenant\" is longer than %d bytes",
                       KVG_PREFIX_DEFAULT_NAME_MAX(KVG_PROTO_MAX_SALT));

    return NGX_CONF_ERROR;
}


static char *
ngx_http_kvgate_buckets(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_kvgate_loc_conf_t  *klcf = conf;

    char         err[256];
    u_char       text[512], *p, *end;
    ngx_str_t   *value;
    ngx_uint_t   i;

    if (klcf->bounds_set != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;
    p = text;
    end = text + sizeof(text) - 1;

    for (i = 1; i < cf->args->nelts; i++) {
        p = ngx_slprintf(p, end, "%V ", &value[i]);
    }

    *p = '\0';

    if (p == end
        || kvg_buckets_parse(&klcf->bounds, (char *) text, err, sizeof(err))
           != 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value in \"%V\" directive: %s",
                           &cmd->name, p == end ? "too many bounds" : err);
        return NGX_CONF_ERROR;
    }

    klcf->bounds_set = 1;

    return NGX_CONF_OK;
}


static char *
ngx_http_kvgate_normalize(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_kvgate_loc_conf_t  *klcf = conf;

    char         err[256];
    unsigned     flags, all, f;
    ngx_str_t   *value;
    ngx_uint_t   i;

    if (klcf->normalize != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;
    all = 0;

    for (i = 1; i < cf->args->nelts; i++) {
        if (kvg_normalize_parse_step((char *) value[i].data, value[i].len, &f,
                                     err, sizeof(err))
            != 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid value \"%V\" in \"%V\" directive: %s",
                               &value[i], &cmd->name, err);
            return NGX_CONF_ERROR;
        }

        if (f == 0 && cf->args->nelts > 2) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\" in \"%V\" directive cannot be combined "
                               "with steps", &value[i], &cmd->name);
            return NGX_CONF_ERROR;
        }

        all |= f;
    }

    flags = all;
    klcf->normalize = (ngx_int_t) flags;

    return NGX_CONF_OK;
}


/* ---- process hooks ---- */

static ngx_int_t
ngx_http_kvgate_init_module(ngx_cycle_t *cycle)
{
    /* Says which libkvgate.a this .so carries. */

    ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                  "kvgate: module loaded, libkvgate %s", kvg_version());

    return NGX_OK;
}


static ngx_int_t
ngx_http_kvgate_init_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                     i;
    ngx_http_kvgate_engine_t     **e;
    ngx_http_kvgate_main_conf_t   *kmcf;

    ngx_http_kvgate_pin_module(cycle);

    kmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_kvgate_module);

    if (kmcf == NULL || kmcf->engines.nelts == 0) {
        return NGX_OK;
    }

    ngx_http_kvgate_metrics_worker_clear();

    /* one connection per engine; each counts its connects and losses
       through this hook: it knows nothing of the layers above it */

    e = kmcf->engines.elts;

    for (i = 0; i < kmcf->engines.nelts; i++) {
        if (ngx_http_kvgate_engine_init_process(cycle, e[i],
                kmcf->connect_wait, kmcf->engine_stall,
                ngx_http_kvgate_metrics_engine_event)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/*
 * Keeps the module mapped for the rest of this worker's life.
 *
 * A thread of a thread pool that tokenized a prompt holds per-thread tokenizer
 * memory, freed by a thread-specific-data destructor that is code of this
 * module (libkvgate is linked in). When a worker exits, nginx destroys its
 * thread pools, waiting only until each thread has taken its exit task, not
 * until the thread is gone, and then unloads the modules with the cycle's
 * pool: a thread still inside pthread_exit would call that destructor at an
 * address no longer mapped, and the worker would die on SIGSEGV. One more
 * reference, opened with RTLD_NODELETE and never closed, keeps the code
 * until the process ends. Only workers pin it: the master still unloads and
 * reloads the module on a configuration reload.
 */

static void
ngx_http_kvgate_pin_module(ngx_cycle_t *cycle)
{
    void     *handle;
    Dl_info   info;

    if (dladdr((void *) &ngx_http_kvgate_module, &info) == 0
        || info.dli_fname == NULL)
    {
        return;
    }

    handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);

    if (handle == NULL) {
        /* built into nginx rather than loaded: nothing is ever unmapped */
        ngx_log_debug2(NGX_LOG_DEBUG_CORE, cycle->log, 0,
                       "kvgate: module not pinned (%s): %s",
                       info.dli_fname, dlerror());
        return;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_CORE, cycle->log, 0,
                   "kvgate: module pinned for the worker's life: %s",
                   info.dli_fname);
}


static void
ngx_http_kvgate_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                     i;
    ngx_http_kvgate_engine_t     **e;
    ngx_http_kvgate_main_conf_t   *kmcf;

    ngx_http_kvgate_prompt_exit_process();

    kmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_kvgate_module);

    if (kmcf == NULL || kmcf->engines.nelts == 0) {
        return;
    }

    e = kmcf->engines.elts;

    for (i = 0; i < kmcf->engines.nelts; i++) {
        ngx_http_kvgate_engine_exit_process(e[i]);
    }

    ngx_http_kvgate_metrics_worker_clear();
}
