
/*
 * kvgate: nginx side of the gateway. Shared declarations of the module's
 * source files (directives and handler, error responses, and later the
 * engine connection, request parsing and metrics).
 */


#ifndef _NGX_HTTP_KVGATE_MODULE_H_INCLUDED_
#define _NGX_HTTP_KVGATE_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


typedef struct {
    /* "unix:/path" as written, for messages; engine_addr is the parsed socket. */
    ngx_str_t                  engine;
    ngx_addr_t                *engine_addr;

    /* First kvgate_pass seen, so a missing kvgate_engine can be reported
       where the need for it arises. */
    ngx_str_t                  pass_file;
    ngx_uint_t                 pass_line;
} ngx_http_kvgate_main_conf_t;


typedef struct {
    ngx_flag_t                 pass;
} ngx_http_kvgate_loc_conf_t;


/*
 * Sends an OpenAI-style error:
 *   {"error":{"message":M,"type":T,"param":null,"code":C}}
 * code may be NULL (sent as null); retry_after > 0 adds a Retry-After
 * header. The request body must already be read or discarded. Returns
 * what the content handler should return; it never finalizes the request.
 */
ngx_int_t ngx_http_kvgate_send_error(ngx_http_request_t *r, ngx_uint_t status,
    const char *type, const char *code, const char *message,
    ngx_uint_t retry_after);


extern ngx_module_t  ngx_http_kvgate_module;


#endif /* _NGX_HTTP_KVGATE_MODULE_H_INCLUDED_ */
