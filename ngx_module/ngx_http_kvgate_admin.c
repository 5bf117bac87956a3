
/*
 * kvgate_admin: an operator's location over the engines of a group.
 *
 *   POST <location>/tenants/<tenant>/wipe          the named tenant <tenant>
 *   POST <location>/default-tenants/<name>/wipe    the anonymous tenant of the
 *                                                  locations whose
 *                                                  kvgate_default_tenant is
 *                                                  <name>
 *
 * <tenant> is percent-decoded (so "a%2Fb" names "a/b"); it is the tenant as
 * its requests name it (the value of the kvgate_tenant header), and its salt
 * is what the completion locations salt that tenant's hashes with
 * (prefix_hash.h: a named tenant's salt is its name, a default tenant's a
 * 0x00 mark then its name). The location sends one WIPE (proto.h) to every
 * engine of its group (kvgate_admin [NAME]: as kvgate_pass, the http-level
 * kvgate_engine without a name) and answers once each engine replied, or
 * kvgate_timeout passed:
 *
 *   200 {"tenant":"acme","default_tenant":false,
 *        "wiped":{"pool":P,"host":H,"disk":D},            (the sums)
 *        "engines":[{"engine":"e1","ok":true,
 *                    "wiped":{"pool":..,"host":..,"disk":..}}, ...]}
 *   502 the same document when some engine could not wipe (down, stalled,
 *       no answer within kvgate_timeout, an error): its entry is
 *       {"engine":"e2","ok":false,"status":503,"error":"..."}. A wipe may be
 *       repeated at any time: run it again once the engine is back.
 *
 * Bad requests get OpenAI-style JSON errors: 405 for another method, 404 for
 * another path, 400 for a tenant that is empty, longer than the protocol's
 * salt (256 bytes) or holds a NUL byte.
 *
 * This location is an operator's: nothing here checks who asks. Protect it
 * with allow/deny (or auth) as any admin endpoint (docs/operations.md).
 *
 * The state of one wipe lives in the request's pool and is never the
 * module's request ctx (the log phase counts completions by that ctx); a
 * pool cleanup takes every engine request still out back, so no engine
 * event can reach freed memory.
 */


#include "ngx_http_kvgate_module.h"
#include "json_out.h"
#include "prefix_hash.h"


typedef struct ngx_http_kvgate_wipe_s  ngx_http_kvgate_wipe_t;

/* one engine's part of a wipe */
typedef struct {
    ngx_http_kvgate_engine_req_t   er;
    ngx_http_kvgate_wipe_t        *wipe;
    ngx_uint_t                     state;     /* NGX_HTTP_KVGATE_WS_* */
    ngx_uint_t                     status;    /* an error's */
    u_char                         error[320];
    uint64_t                       blocks[3]; /* pool, host, disk */
} ngx_http_kvgate_wipe_engine_t;

#define NGX_HTTP_KVGATE_WS_OUT     0          /* sent or waiting for room */
#define NGX_HTTP_KVGATE_WS_OK      1
#define NGX_HTTP_KVGATE_WS_FAILED  2

struct ngx_http_kvgate_wipe_s {
    ngx_http_request_t            *request;
    ngx_http_kvgate_group_t       *group;
    ngx_str_t                      tenant;    /* as named (decoded) */
    ngx_str_t                      tenant_log;   /* JSON-escaped: for logs */
    ngx_uint_t                     default_tenant;
    u_char                         salt[KVG_PROTO_MAX_SALT];
    size_t                         salt_len;
    ngx_http_kvgate_wipe_engine_t *engines;   /* [group->n] */
    ngx_uint_t                     pending;   /* engines not answered yet */
    ngx_uint_t                     sending;   /* in the loop that sends */
    ngx_uint_t                     answered;
    ngx_msec_t                     timeout;   /* kvgate_timeout */
    ngx_event_t                    deadline;
};


static u_char *ngx_http_kvgate_wipe_segment(u_char *start, u_char *end);
static ngx_int_t ngx_http_kvgate_wipe_parse(ngx_http_request_t *r,
    ngx_http_kvgate_wipe_t *w, kvg_api_error *err);
static ngx_int_t ngx_http_kvgate_wipe_send(ngx_http_kvgate_wipe_engine_t *we);
static ngx_int_t ngx_http_kvgate_wipe_retry(ngx_http_kvgate_engine_req_t *er);
static void ngx_http_kvgate_wipe_event(ngx_http_kvgate_engine_req_t *er,
    const kvg_client_event *ev);
static void ngx_http_kvgate_wipe_fail(ngx_http_kvgate_wipe_engine_t *we,
    ngx_uint_t status, const char *fmt, ...);
static void ngx_http_kvgate_wipe_check(ngx_http_kvgate_wipe_t *w);
static void ngx_http_kvgate_wipe_timeout(ngx_event_t *ev);
static void ngx_http_kvgate_wipe_cleanup(void *data);
static ngx_int_t ngx_http_kvgate_wipe_answer(ngx_http_kvgate_wipe_t *w);


ngx_int_t
ngx_http_kvgate_admin_handler(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_uint_t                   i;
    kvg_api_error                err;
    ngx_pool_cleanup_t          *cln;
    ngx_http_kvgate_wipe_t      *w;
    ngx_http_kvgate_loc_conf_t  *klcf;

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    if (r->method != NGX_HTTP_POST) {
        ngx_table_elt_t  *h;

        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->hash = 1;
        ngx_str_set(&h->key, "Allow");
        ngx_str_set(&h->value, "POST");

        return ngx_http_kvgate_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                          "invalid_request_error",
                                          "method_not_allowed",
                                          "kvgate_admin: a wipe is POST "
                                          "<location>/tenants/<tenant>/wipe",
                                          0);
    }

    w = ngx_pcalloc(r->pool, sizeof(ngx_http_kvgate_wipe_t));
    if (w == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    w->request = r;
    w->group = klcf->group;

    ngx_memzero(&err, sizeof(kvg_api_error));

    if (ngx_http_kvgate_wipe_parse(r, w, &err) != NGX_OK) {
        return ngx_http_kvgate_send_api_error(r, &err, 0);
    }

    w->engines = ngx_pcalloc(r->pool, w->group->n
                                      * sizeof(ngx_http_kvgate_wipe_engine_t));
    if (w->engines == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_kvgate_wipe_cleanup;
    cln->data = w;

    w->deadline.handler = ngx_http_kvgate_wipe_timeout;
    w->deadline.data = w;
    w->deadline.log = r->connection->log;

    ngx_log_error(NGX_LOG_NOTICE, r->connection->log, 0,
                  "kvgate: wiping the %stenant \"%V\" on %ui engine%s%s%V",
                  w->default_tenant ? "default " : "", &w->tenant_log,
                  w->group->n, w->group->n == 1 ? "" : "s",
                  w->group->name.len ? " of " : "", &w->group->name);

    /* every engine is asked at once; the answers come in any order */

    w->pending = w->group->n;
    w->sending = 1;

    for (i = 0; i < w->group->n; i++) {
        ngx_http_kvgate_wipe_engine_t  *we = &w->engines[i];

        we->wipe = w;
        we->er.engine = w->group->engines[i];
        we->er.event = ngx_http_kvgate_wipe_event;
        we->er.retry = ngx_http_kvgate_wipe_retry;
        we->er.data = we;
        we->er.log = r->connection->log;

        (void) ngx_http_kvgate_wipe_send(we);
    }

    w->sending = 0;

    if (w->pending == 0) {
        return ngx_http_kvgate_wipe_answer(w);
    }

    w->timeout = klcf->timeout;
    ngx_add_timer(&w->deadline, w->timeout);

    r->main->count++;

    return NGX_DONE;
}


/* The segment of path [start, end) that ends at end: its first byte (just
   after the slash before it), or NULL when no slash comes before it. */

static u_char *
ngx_http_kvgate_wipe_segment(u_char *start, u_char *end)
{
    u_char  *p;

    for (p = end; p > start; p--) {
        if (p[-1] == '/') {
            return p;
        }
    }

    return NULL;
}


/* The tenant from the path: its last three segments, raw (nginx's r->uri is
   decoded already, and a "%2F" in a tenant would split it there). */

static ngx_int_t
ngx_http_kvgate_wipe_parse(ngx_http_request_t *r, ngx_http_kvgate_wipe_t *w,
    kvg_api_error *err)
{
    u_char     *p, *end, *seg[3], *stop[3], *dst;
    size_t      len[3];
    ngx_int_t   k;
    static const char  usage[] =
        "kvgate_admin: the path is <location>/tenants/<tenant>/wipe or "
        "<location>/default-tenants/<name>/wipe";

    p = r->unparsed_uri.data;
    end = ngx_strlchr(p, p + r->unparsed_uri.len, '?');

    if (end == NULL) {
        end = p + r->unparsed_uri.len;
    }

    /* one trailing slash is allowed: ".../wipe/" */

    if (end > p && end[-1] == '/') {
        end--;
    }

    /* seg[0] the kind, seg[1] the tenant, seg[2] "wipe" */

    for (k = 2; k >= 0; k--) {
        stop[k] = end;
        seg[k] = ngx_http_kvgate_wipe_segment(p, end);

        if (seg[k] == NULL) {
            goto not_found;
        }

        len[k] = (size_t) (stop[k] - seg[k]);
        end = seg[k] - 1;          /* the slash before it */
    }

    if (len[2] != 4 || ngx_strncmp(seg[2], "wipe", 4) != 0) {
        goto not_found;
    }

    if (len[0] == sizeof("tenants") - 1
        && ngx_strncmp(seg[0], "tenants", len[0]) == 0)
    {
        w->default_tenant = 0;

    } else if (len[0] == sizeof("default-tenants") - 1
               && ngx_strncmp(seg[0], "default-tenants", len[0]) == 0)
    {
        w->default_tenant = 1;

    } else {
        goto not_found;
    }

    if (len[1] == 0) {
        kvg_api_error_set(err, 400, "invalid_tenant", NULL,
                          "kvgate_admin: the tenant is missing (%s)", usage);
        return NGX_ERROR;
    }

    /* decoded, it is at most as long */

    w->tenant.data = ngx_pnalloc(r->pool, len[1]);
    if (w->tenant.data == NULL) {
        kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
        return NGX_ERROR;
    }

    p = seg[1];
    dst = w->tenant.data;
    ngx_unescape_uri(&dst, &p, len[1], 0);
    w->tenant.len = dst - w->tenant.data;

    if (w->tenant.len == 0) {
        kvg_api_error_set(err, 400, "invalid_tenant", NULL,
                          "kvgate_admin: the tenant is missing (%s)", usage);
        return NGX_ERROR;
    }

    if (ngx_strlchr(w->tenant.data, w->tenant.data + w->tenant.len, '\0')
        != NULL)
    {
        kvg_api_error_set(err, 400, "invalid_tenant", NULL,
                          "kvgate_admin: the tenant contains a NUL byte");
        return NGX_ERROR;
    }

    /* logged escaped: a decoded path may hold any byte, a newline too */

    w->tenant_log.data = ngx_pnalloc(r->pool,
                             kvg_json_escape_len((char *) w->tenant.data,
                                                 w->tenant.len));
    if (w->tenant_log.data == NULL) {
        kvg_api_error_set(err, 500, NULL, NULL, "out of memory");
        return NGX_ERROR;
    }

    w->tenant_log.len = kvg_json_escape((char *) w->tenant_log.data,
                                        (char *) w->tenant.data, w->tenant.len);

    if (w->default_tenant) {
        w->salt_len = kvg_prefix_default_salt(w->tenant.data, w->tenant.len,
                                              w->salt, sizeof(w->salt));
        if (w->salt_len == 0) {
            kvg_api_error_set(err, 400, "invalid_tenant", NULL,
                              "kvgate_admin: a default tenant's name is at "
                              "most %d bytes, this one has %zu",
                              KVG_PROTO_MAX_SALT - 1, w->tenant.len);
            return NGX_ERROR;
        }

    } else {
        if (w->tenant.len > KVG_PROTO_MAX_SALT) {
            kvg_api_error_set(err, 400, "invalid_tenant", NULL,
                              "kvgate_admin: the tenant is longer than %d "
                              "bytes (%zu)", KVG_PROTO_MAX_SALT,
                              w->tenant.len);
            return NGX_ERROR;
        }

        ngx_memcpy(w->salt, w->tenant.data, w->tenant.len);
        w->salt_len = w->tenant.len;
    }

    return NGX_OK;

not_found:

    kvg_api_error_set(err, 404, "not_found", NULL, "%s", usage);
    return NGX_ERROR;
}


/* Sends one engine its WIPE: NGX_OK (out), NGX_AGAIN (waits for ring
   room: retried in order), or NGX_ERROR (the engine's part failed and is
   counted answered). */

static ngx_int_t
ngx_http_kvgate_wipe_send(ngx_http_kvgate_wipe_engine_t *we)
{
    ngx_int_t      rc;
    kvg_api_error  err;

    ngx_memzero(&err, sizeof(kvg_api_error));

    rc = ngx_http_kvgate_engine_wipe(&we->er, we->wipe->salt,
                                     we->wipe->salt_len, &err);

    if (rc == NGX_ERROR && we->state == NGX_HTTP_KVGATE_WS_OUT) {
        ngx_http_kvgate_wipe_fail(we, (ngx_uint_t) err.status, "%s",
                                  err.message[0] ? err.message
                                                 : "the engine refused");
    }

    return rc;
}


static ngx_int_t
ngx_http_kvgate_wipe_retry(ngx_http_kvgate_engine_req_t *er)
{
    ngx_int_t                       rc;
    ngx_http_kvgate_wipe_engine_t  *we = er->data;

    rc = ngx_http_kvgate_wipe_send(we);

    if (rc == NGX_ERROR) {
        ngx_http_kvgate_wipe_check(we->wipe);
    }

    return rc;
}


static void
ngx_http_kvgate_wipe_event(ngx_http_kvgate_engine_req_t *er,
    const kvg_client_event *ev)
{
    ngx_http_kvgate_wipe_engine_t  *we = er->data;

    if (we->state != NGX_HTTP_KVGATE_WS_OUT) {
        return;
    }

    if (ev->kind == KVG_CEV_WIPED) {
        we->state = NGX_HTTP_KVGATE_WS_OK;
        we->blocks[0] = ev->wiped_pool;
        we->blocks[1] = ev->wiped_host;
        we->blocks[2] = ev->wiped_disk;
        we->wipe->pending--;

        ngx_log_error(NGX_LOG_NOTICE, er->log, 0,
                      "kvgate: the engine \"%V\" wiped tenant \"%V\": %uL "
                      "pool, %uL host, %uL disk blocks", &er->engine->name,
                      &we->wipe->tenant_log, ev->wiped_pool, ev->wiped_host,
                      ev->wiped_disk);

    } else if (ev->kind == KVG_CEV_ERROR) {
        ngx_http_kvgate_wipe_fail(we, (ngx_uint_t) ev->status, "%s",
                                  ev->message ? ev->message : "error");

    } else {
        /* a request's event under a wipe's id: the engine broke the
           protocol */
        ngx_http_kvgate_engine_cancel(er);
        ngx_http_kvgate_wipe_fail(we, 502, "unexpected event %d for a wipe",
                                  (int) ev->kind);
    }

    ngx_http_kvgate_wipe_check(we->wipe);
}


static void
ngx_http_kvgate_wipe_fail(ngx_http_kvgate_wipe_engine_t *we,
    ngx_uint_t status, const char *fmt, ...)
{
    va_list  args;
    u_char  *p;

    if (we->state != NGX_HTTP_KVGATE_WS_OUT) {
        return;
    }

    va_start(args, fmt);
    p = ngx_vslprintf(we->error, we->error + sizeof(we->error) - 1, fmt, args);
    va_end(args);
    *p = '\0';

    we->state = NGX_HTTP_KVGATE_WS_FAILED;
    we->status = status ? status : 500;
    we->wipe->pending--;

    ngx_log_error(NGX_LOG_ERR, we->er.log, 0,
                  "kvgate: the engine \"%V\" did not wipe tenant \"%V\": %s",
                  &we->er.engine->name, &we->wipe->tenant_log, we->error);
}


/* Every engine answered: the response (not while the sending loop runs:
   it answers by itself). */

static void
ngx_http_kvgate_wipe_check(ngx_http_kvgate_wipe_t *w)
{
    if (w->pending || w->sending || w->answered) {
        return;
    }

    if (w->deadline.timer_set) {
        ngx_del_timer(&w->deadline);
    }

    ngx_http_finalize_request(w->request, ngx_http_kvgate_wipe_answer(w));
}


static void
ngx_http_kvgate_wipe_timeout(ngx_event_t *ev)
{
    ngx_uint_t                      i;
    ngx_http_kvgate_wipe_t         *w = ev->data;
    ngx_http_kvgate_wipe_engine_t  *we;

    for (i = 0; i < w->group->n; i++) {
        we = &w->engines[i];

        if (we->state == NGX_HTTP_KVGATE_WS_OUT) {
            ngx_http_kvgate_engine_cancel(&we->er);
            ngx_http_kvgate_wipe_fail(we, 504, "no answer within %M ms "
                                      "(kvgate_timeout)", w->timeout);
        }
    }

    ngx_http_kvgate_wipe_check(w);
}


static void
ngx_http_kvgate_wipe_cleanup(void *data)
{
    ngx_http_kvgate_wipe_t  *w = data;
    ngx_uint_t               i;

    if (w->deadline.timer_set) {
        ngx_del_timer(&w->deadline);
    }

    for (i = 0; i < w->group->n; i++) {
        if (w->engines[i].er.engine != NULL) {
            ngx_http_kvgate_engine_cancel(&w->engines[i].er);
        }
    }
}


static u_char *
ngx_http_kvgate_wipe_str(u_char *p, const u_char *s, size_t len)
{
    *p++ = '"';
    p += kvg_json_escape((char *) p, (const char *) s, len);
    *p++ = '"';

    return p;
}


static ngx_int_t
ngx_http_kvgate_wipe_answer(ngx_http_kvgate_wipe_t *w)
{
    u_char                         *p;
    size_t                          size;
    uint64_t                        sum[3];
    ngx_buf_t                      *b;
    ngx_uint_t                      i, failed, status;
    ngx_chain_t                     out;
    ngx_http_request_t             *r = w->request;
    ngx_http_kvgate_wipe_engine_t  *we;

    w->answered = 1;

    sum[0] = sum[1] = sum[2] = 0;
    failed = 0;

    size = sizeof("{\"tenant\":\"\",\"default_tenant\":false,\"wiped\":"
                  "{\"pool\":,\"host\":,\"disk\":},\"engines\":[]}")
           + 6 * w->tenant.len + 3 * NGX_INT64_LEN;

    for (i = 0; i < w->group->n; i++) {
        we = &w->engines[i];

        size += sizeof("{\"engine\":\"\",\"ok\":false,\"status\":,\"error\":"
                       "\"\",\"wiped\":{\"pool\":,\"host\":,\"disk\":}},")
                + 6 * we->er.engine->name.len + 6 * ngx_strlen(we->error)
                + 4 * NGX_INT64_LEN;

        if (we->state == NGX_HTTP_KVGATE_WS_OK) {
            sum[0] += we->blocks[0];
            sum[1] += we->blocks[1];
            sum[2] += we->blocks[2];

        } else {
            failed++;
        }
    }

    ngx_http_kvgate_metrics_wipe(failed == 0, sum);

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = b->last;
    p = ngx_cpymem(p, "{\"tenant\":", sizeof("{\"tenant\":") - 1);
    p = ngx_http_kvgate_wipe_str(p, w->tenant.data, w->tenant.len);
    p = ngx_sprintf(p, ",\"default_tenant\":%s,\"wiped\":{\"pool\":%uL,"
                    "\"host\":%uL,\"disk\":%uL},\"engines\":[",
                    w->default_tenant ? "true" : "false",
                    sum[0], sum[1], sum[2]);

    for (i = 0; i < w->group->n; i++) {
        we = &w->engines[i];

        p = ngx_cpymem(p, i ? ",{\"engine\":" : "{\"engine\":",
                       i ? sizeof(",{\"engine\":") - 1
                         : sizeof("{\"engine\":") - 1);
        p = ngx_http_kvgate_wipe_str(p, we->er.engine->name.data,
                                     we->er.engine->name.len);

        if (we->state == NGX_HTTP_KVGATE_WS_OK) {
            p = ngx_sprintf(p, ",\"ok\":true,\"wiped\":{\"pool\":%uL,"
                            "\"host\":%uL,\"disk\":%uL}}",
                            we->blocks[0], we->blocks[1], we->blocks[2]);

        } else {
            p = ngx_sprintf(p, ",\"ok\":false,\"status\":%ui,\"error\":",
                            we->status);
            p = ngx_http_kvgate_wipe_str(p, we->error,
                                         ngx_strlen(we->error));
            *p++ = '}';
        }
    }

    p = ngx_cpymem(p, "]}\n", 3);
    b->last = p;

    out.buf = b;
    out.next = NULL;

    status = failed ? NGX_HTTP_BAD_GATEWAY : NGX_HTTP_OK;

    return ngx_http_kvgate_send_response(r, status, "application/json",
                                         (off_t) (b->last - b->pos), &out);
}
