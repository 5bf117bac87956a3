
/*
 * kvgate: an OpenAI-compatible gateway in front of the co-located kvgate
 * engine. This file holds the directives, their configuration and the
 * content handler.
 *
 * The engine connection does not exist yet: every kvgate_pass request is
 * answered 503 "engine not connected" in the OpenAI error format, so that
 * clients see an honest, retryable failure instead of a made-up answer.
 */


#include "ngx_http_kvgate_module.h"

#include "version.h"


static ngx_int_t ngx_http_kvgate_handler(ngx_http_request_t *r);

static void *ngx_http_kvgate_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_kvgate_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_http_kvgate_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_kvgate_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);

static char *ngx_http_kvgate_engine(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_kvgate_pass(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

static ngx_int_t ngx_http_kvgate_init_module(ngx_cycle_t *cycle);


static ngx_command_t  ngx_http_kvgate_commands[] = {

    { ngx_string("kvgate_engine"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_kvgate_engine,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kvgate_pass"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_kvgate_pass,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_kvgate_module_ctx = {
    NULL,                                  /* preconfiguration */
    NULL,                                  /* postconfiguration */

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
    NULL,                                  /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    NULL,                                  /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static ngx_int_t
ngx_http_kvgate_handler(ngx_http_request_t *r)
{
    ngx_int_t  rc;

    /*
     * Nothing can use the body until the engine is connected, but it must
     * still be consumed, or a keepalive connection would parse it as the
     * next request.
     */

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                  "kvgate: engine not connected");

    return ngx_http_kvgate_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                      "server_error", "engine_unavailable",
                                      "kvgate: engine not connected", 1);
}


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
     *     kmcf->engine_addr = NULL;
     *     kmcf->pass_file = { 0, NULL };
     *     kmcf->pass_line = 0;
     */

    return kmcf;
}


static char *
ngx_http_kvgate_init_main_conf(ngx_conf_t *cf, void *conf)
{
    ngx_http_kvgate_main_conf_t  *kmcf = conf;

    if (kmcf->pass_line && kmcf->engine_addr == NULL) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "\"kvgate_pass\" in %V:%ui requires \"kvgate_engine\" "
                      "in the http block",
                      &kmcf->pass_file, kmcf->pass_line);
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

    klcf->pass = NGX_CONF_UNSET;

    return klcf;
}


static char *
ngx_http_kvgate_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_kvgate_loc_conf_t  *conf = child;

    /*
     * kvgate_pass is not inherited, as with proxy_pass: the content handler
     * belongs to the location it is written in (nested locations get their
     * own core handler); the flag only records where it was set.
     */

    if (conf->pass == NGX_CONF_UNSET) {
        conf->pass = 0;
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_kvgate_engine(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_kvgate_main_conf_t  *kmcf = conf;

    ngx_str_t  *value;
    ngx_url_t   u;

    if (kmcf->engine.data != NULL) {
        return "is duplicate";
    }

    value = cf->args->elts;

    /*
     * The engine is always co-located: a unix socket keeps it off the
     * network and lets the file mode decide who may submit work to it.
     */

    if (value[1].len < sizeof("unix:") - 1
        || ngx_strncmp(value[1].data, "unix:", sizeof("unix:") - 1) != 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%V\" directive, "
                           "it must be \"unix:/path/to/socket\"",
                           &value[1], &cmd->name);
        return NGX_CONF_ERROR;
    }

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = value[1];
    u.no_resolve = 1;

    if (ngx_parse_url(cf->pool, &u) != NGX_OK || u.naddrs != 1) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%V\" directive: %s",
                           &value[1], &cmd->name,
                           u.err ? u.err : "not a unix socket path");
        return NGX_CONF_ERROR;
    }

    kmcf->engine = value[1];
    kmcf->engine_addr = &u.addrs[0];

    return NGX_CONF_OK;
}


static char *
ngx_http_kvgate_pass(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_kvgate_loc_conf_t  *klcf = conf;

    ngx_http_core_loc_conf_t     *clcf;
    ngx_http_kvgate_main_conf_t  *kmcf;

    if (klcf->pass != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    klcf->pass = 1;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_kvgate_handler;

    kmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_kvgate_module);

    if (kmcf->pass_line == 0) {
        kmcf->pass_file = cf->conf_file->file.name;
        kmcf->pass_line = cf->conf_file->line;
    }

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_kvgate_init_module(ngx_cycle_t *cycle)
{
    /* Says which libkvgate.a this .so carries; it also keeps the library
       linked in even while nothing else calls it. */

    ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                  "kvgate: module loaded, libkvgate %s", kvg_version());

    return NGX_OK;
}
