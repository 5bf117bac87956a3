
/*
 * kvgate: per-key token budgets (kvgate_limit_tokens_zone,
 * kvgate_limit_tokens), in the spirit of nginx's limit_req, counted in
 * tokens.
 *
 * Each key (normally $kvgate_tenant) has a token bucket in a shared zone: it
 * holds at most `burst` tokens and refills at `rate`. A request is admitted
 * when the bucket holds its prompt's tokens (or is full, for a prompt longer
 * than the burst); they are charged then, all as uncached. Completion tokens
 * are charged as the engine produces them (the bucket may go below zero: the
 * debt of requests already admitted, which later requests wait out). When the
 * request ends, the charge is set right with the engine's usage: cached prompt
 * tokens cost `cached` (a weight, default 1) instead of 1 each, and the
 * difference is given back.
 *
 * The keys are in a red-black tree by their crc32 with an LRU queue; when
 * the zone is full the least recently used keys are reclaimed (their bucket
 * and counters with them; the zone's totals keep their usage).
 */


#include "ngx_http_kvgate_module.h"


typedef struct {
    ngx_rbtree_node_t              node;          /* key: crc32 of the key */
    ngx_queue_t                    queue;         /* LRU, most recent first */
    ngx_msec_t                     last;          /* last refill */
    double                         level;         /* tokens in the bucket */
    ngx_http_kvgate_limit_counts_t counts;
    u_short                        len;
    u_char                         data[1];
} ngx_http_kvgate_limit_node_t;


typedef struct {
    ngx_rbtree_t                   rbtree;
    ngx_rbtree_node_t              sentinel;
    ngx_queue_t                    queue;
    ngx_uint_t                     keys;
    ngx_uint_t                     reclaimed;     /* keys reclaimed (LRU) */
    ngx_http_kvgate_limit_counts_t total;
} ngx_http_kvgate_limit_shctx_t;


struct ngx_http_kvgate_limit_zone_s {
    ngx_str_t                      name;
    ngx_http_complex_value_t       key;
    ngx_shm_zone_t                *shm_zone;
    ngx_http_kvgate_limit_shctx_t *sh;
    ngx_slab_pool_t               *shpool;
};


struct ngx_http_kvgate_limit_s {
    ngx_shm_zone_t                *shm_zone;
    ngx_str_t                      zone_name;
    double                         rate;          /* tokens per millisecond */
    double                         burst;         /* tokens */
    double                         cached;        /* a cached token's weight */
    ngx_str_t                      file;          /* where it is written */
    ngx_uint_t                     line;
};


static ngx_int_t ngx_http_kvgate_limit_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);
static void ngx_http_kvgate_limit_rbtree_insert(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel);
static ngx_http_kvgate_limit_node_t *ngx_http_kvgate_limit_lookup(
    ngx_http_kvgate_limit_zone_t *z, ngx_str_t *key, uint32_t hash);
static void ngx_http_kvgate_limit_refill(ngx_http_kvgate_limit_t *lim,
    ngx_http_kvgate_limit_node_t *n);


/* ---- configuration ---- */

char *
ngx_http_kvgate_limit_zone_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_kvgate_main_conf_t  *kmcf = conf;

    u_char                            *p;
    size_t                             size;
    ngx_str_t                         *value, name, s;
    ngx_uint_t                         i;
    ngx_http_kvgate_limit_zone_t      *z, **zp;
    ngx_http_compile_complex_value_t   ccv;

    value = cf->args->elts;

    z = ngx_pcalloc(cf->pool, sizeof(ngx_http_kvgate_limit_zone_t));
    if (z == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

    ccv.cf = cf;
    ccv.value = &value[1];
    ccv.complex_value = &z->key;

    if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    size = 0;
    name.len = 0;

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {
            name.data = value[i].data + 5;
            p = (u_char *) ngx_strchr(name.data, ':');

            if (p == NULL) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid zone size \"%V\" in \"%V\" "
                                   "directive, it must be zone=NAME:SIZE",
                                   &value[i], &cmd->name);
                return NGX_CONF_ERROR;
            }

            name.len = p - name.data;

            s.data = p + 1;
            s.len = value[i].data + value[i].len - s.data;

            size = ngx_parse_size(&s);

            if (size == (size_t) NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid zone size \"%V\" in \"%V\" "
                                   "directive", &value[i], &cmd->name);
                return NGX_CONF_ERROR;
            }

            if (size < (size_t) (8 * ngx_pagesize)) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "zone \"%V\" is too small in \"%V\" "
                                   "directive, it must be at least %uzk",
                                   &name, &cmd->name,
                                   (size_t) (8 * ngx_pagesize) / 1024);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" in \"%V\" directive",
                           &value[i], &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (name.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"zone\" parameter",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (kmcf->limit_zones.elts == NULL
        && ngx_array_init(&kmcf->limit_zones, cf->pool, 4,
                          sizeof(ngx_http_kvgate_limit_zone_t *))
           != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    zp = kmcf->limit_zones.elts;

    for (i = 0; i < kmcf->limit_zones.nelts; i++) {
        if (zp[i]->name.len == name.len
            && ngx_strncmp(zp[i]->name.data, name.data, name.len) == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "zone \"%V\" is already declared in \"%V\" "
                               "directive", &name, &cmd->name);
            return NGX_CONF_ERROR;
        }
    }

    z->name = name;
    z->shm_zone = ngx_shared_memory_add(cf, &name, size,
                                        &ngx_http_kvgate_module);
    if (z->shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    if (z->shm_zone->data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "zone \"%V\" is already used in \"%V\" directive",
                           &name, &cmd->name);
        return NGX_CONF_ERROR;
    }

    z->shm_zone->init = ngx_http_kvgate_limit_init_zone;
    z->shm_zone->data = z;

    zp = ngx_array_push(&kmcf->limit_zones);
    if (zp == NULL) {
        return NGX_CONF_ERROR;
    }

    *zp = z;

    return NGX_CONF_OK;
}


char *
ngx_http_kvgate_limit_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_kvgate_loc_conf_t  *klcf = conf;

    u_char                   *p;
    ngx_int_t                 n, burst, scale;
    ngx_str_t                *value, s;
    ngx_uint_t                i;
    ngx_http_kvgate_limit_t  *lim;

    if (klcf->limit != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    lim = ngx_pcalloc(cf->pool, sizeof(ngx_http_kvgate_limit_t));
    if (lim == NULL) {
        return NGX_CONF_ERROR;
    }

    lim->cached = 1.0;
    lim->file = cf->conf_file->file.name;
    lim->line = cf->conf_file->line;
    burst = -1;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {
            s.data = value[i].data + 5;
            s.len = value[i].len - 5;

            lim->shm_zone = ngx_shared_memory_add(cf, &s, 0,
                                                  &ngx_http_kvgate_module);
            if (lim->shm_zone == NULL) {
                return NGX_CONF_ERROR;
            }

            lim->zone_name = s;
            continue;
        }

        if (ngx_strncmp(value[i].data, "rate=", 5) == 0) {
            s.data = value[i].data + 5;
            s.len = value[i].len - 5;
            scale = 0;

            if (s.len > 2) {
                p = s.data + s.len - 2;

                if (ngx_strncmp(p, "/s", 2) == 0) {
                    scale = 1000;

                } else if (ngx_strncmp(p, "/m", 2) == 0) {
                    scale = 60000;
                }
            }

            n = scale ? ngx_atoi(s.data, s.len - 2) : NGX_ERROR;

            if (n <= 0) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid rate \"%V\" in \"%V\" directive, "
                                   "it must be N/s or N/m with N a positive "
                                   "integer", &value[i], &cmd->name);
                return NGX_CONF_ERROR;
            }

            lim->rate = (double) n / scale;

            if (burst < 0) {
                /* default: one period's tokens */
                lim->burst = (double) n;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "burst=", 6) == 0) {
            burst = ngx_atoi(value[i].data + 6, value[i].len - 6);

            if (burst <= 0) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid burst \"%V\" in \"%V\" directive, "
                                   "it must be a positive integer",
                                   &value[i], &cmd->name);
                return NGX_CONF_ERROR;
            }

            lim->burst = (double) burst;
            continue;
        }

        if (ngx_strncmp(value[i].data, "cached=", 7) == 0) {
            n = ngx_atofp(value[i].data + 7, value[i].len - 7, 3);

            if (n == NGX_ERROR || n > 1000) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid cached weight \"%V\" in \"%V\" "
                                   "directive, it must be a number from 0 "
                                   "to 1 (at most 3 decimals)",
                                   &value[i], &cmd->name);
                return NGX_CONF_ERROR;
            }

            lim->cached = (double) n / 1000;
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" in \"%V\" directive",
                           &value[i], &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (lim->shm_zone == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"zone\" parameter",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (lim->rate == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"rate\" parameter",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    klcf->limit = lim;

    /* checked once the http block is read (the zone may be declared after
       it): ngx_http_kvgate_limit_check */

    return ngx_http_kvgate_limit_ref(cf, lim);
}


/* The limits written, to check their zones once the http block is read. */

char *
ngx_http_kvgate_limit_ref(ngx_conf_t *cf, ngx_http_kvgate_limit_t *lim)
{
    ngx_http_kvgate_limit_t      **lp;
    ngx_http_kvgate_main_conf_t   *kmcf;

    kmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_kvgate_module);

    if (kmcf->limit_refs.elts == NULL
        && ngx_array_init(&kmcf->limit_refs, cf->pool, 4,
                          sizeof(ngx_http_kvgate_limit_t *))
           != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    lp = ngx_array_push(&kmcf->limit_refs);
    if (lp == NULL) {
        return NGX_CONF_ERROR;
    }

    *lp = lim;

    return NGX_CONF_OK;
}


ngx_int_t
ngx_http_kvgate_limit_check(ngx_conf_t *cf)
{
    ngx_uint_t                     i;
    ngx_http_kvgate_limit_t      **lp;
    ngx_http_kvgate_main_conf_t   *kmcf;

    kmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_kvgate_module);

    lp = kmcf->limit_refs.elts;

    for (i = 0; i < kmcf->limit_refs.nelts; i++) {
        if (lp[i]->shm_zone->data == NULL) {
            ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                          "unknown zone \"%V\" in \"kvgate_limit_tokens\" "
                          "directive (no kvgate_limit_tokens_zone declares "
                          "it) in %V:%ui", &lp[i]->zone_name, &lp[i]->file,
                          lp[i]->line);
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_kvgate_limit_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_kvgate_limit_zone_t  *oz = data;

    size_t                         len;
    ngx_http_kvgate_limit_zone_t  *z;

    z = shm_zone->data;

    if (oz) {
        /* a reload: the buckets and counters go on */
        z->sh = oz->sh;
        z->shpool = oz->shpool;
        return NGX_OK;
    }

    z->shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (shm_zone->shm.exists) {
        z->sh = z->shpool->data;
        return NGX_OK;
    }

    z->sh = ngx_slab_calloc(z->shpool, sizeof(ngx_http_kvgate_limit_shctx_t));
    if (z->sh == NULL) {
        return NGX_ERROR;
    }

    z->shpool->data = z->sh;

    ngx_rbtree_init(&z->sh->rbtree, &z->sh->sentinel,
                    ngx_http_kvgate_limit_rbtree_insert);
    ngx_queue_init(&z->sh->queue);

    len = sizeof(" in kvgate_limit_tokens_zone \"\"") + shm_zone->shm.name.len;

    z->shpool->log_ctx = ngx_slab_alloc(z->shpool, len);
    if (z->shpool->log_ctx == NULL) {
        return NGX_ERROR;
    }

    ngx_sprintf(z->shpool->log_ctx, " in kvgate_limit_tokens_zone \"%V\"%Z",
                &shm_zone->shm.name);

    z->shpool->log_nomem = 0;

    return NGX_OK;
}


static void
ngx_http_kvgate_limit_rbtree_insert(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel)
{
    ngx_rbtree_node_t             **p;
    ngx_http_kvgate_limit_node_t   *ln, *lnt;

    for ( ;; ) {

        if (node->key < temp->key) {
            p = &temp->left;

        } else if (node->key > temp->key) {
            p = &temp->right;

        } else {
            ln = (ngx_http_kvgate_limit_node_t *) node;
            lnt = (ngx_http_kvgate_limit_node_t *) temp;

            p = (ngx_memn2cmp(ln->data, lnt->data, ln->len, lnt->len) < 0)
                ? &temp->left : &temp->right;
        }

        if (*p == sentinel) {
            break;
        }

        temp = *p;
    }

    *p = node;
    node->parent = temp;
    node->left = sentinel;
    node->right = sentinel;
    ngx_rbt_red(node);
}


/* ---- the buckets (the zone's mutex held) ---- */

static ngx_http_kvgate_limit_node_t *
ngx_http_kvgate_limit_lookup(ngx_http_kvgate_limit_zone_t *z, ngx_str_t *key,
    uint32_t hash)
{
    ngx_int_t                      rc;
    ngx_rbtree_node_t             *node, *sentinel;
    ngx_http_kvgate_limit_node_t  *ln;

    node = z->sh->rbtree.root;
    sentinel = z->sh->rbtree.sentinel;

    while (node != sentinel) {

        if (hash < node->key) {
            node = node->left;
            continue;
        }

        if (hash > node->key) {
            node = node->right;
            continue;
        }

        ln = (ngx_http_kvgate_limit_node_t *) node;

        rc = ngx_memn2cmp(key->data, ln->data, key->len, (size_t) ln->len);

        if (rc == 0) {
            return ln;
        }

        node = (rc < 0) ? node->left : node->right;
    }

    return NULL;
}


static ngx_http_kvgate_limit_node_t *
ngx_http_kvgate_limit_create(ngx_http_kvgate_limit_zone_t *z,
    ngx_http_kvgate_limit_t *lim, ngx_str_t *key, uint32_t hash)
{
    size_t                         size;
    ngx_uint_t                     tries;
    ngx_queue_t                   *q;
    ngx_http_kvgate_limit_node_t  *ln;

    size = offsetof(ngx_http_kvgate_limit_node_t, data) + key->len;

    for (tries = 0; /* void */; tries++) {
        ln = ngx_slab_alloc_locked(z->shpool, size);
        if (ln != NULL) {
            break;
        }

        /* full: the least recently used key goes */

        if (tries == 64 || ngx_queue_empty(&z->sh->queue)) {
            return NULL;
        }

        q = ngx_queue_last(&z->sh->queue);
        ln = ngx_queue_data(q, ngx_http_kvgate_limit_node_t, queue);

        ngx_queue_remove(q);
        ngx_rbtree_delete(&z->sh->rbtree, &ln->node);
        ngx_slab_free_locked(z->shpool, ln);
        z->sh->keys--;
        z->sh->reclaimed++;
    }

    ngx_memzero(ln, size);

    ln->node.key = hash;
    ln->len = (u_short) key->len;
    ngx_memcpy(ln->data, key->data, key->len);
    ln->level = lim->burst;
    ln->last = ngx_current_msec;

    ngx_rbtree_insert(&z->sh->rbtree, &ln->node);
    ngx_queue_insert_head(&z->sh->queue, &ln->queue);
    z->sh->keys++;

    return ln;
}


static void
ngx_http_kvgate_limit_refill(ngx_http_kvgate_limit_t *lim,
    ngx_http_kvgate_limit_node_t *ln)
{
    ngx_msec_int_t  ms;

    ms = (ngx_msec_int_t) (ngx_current_msec - ln->last);

    if (ms > 0) {
        ln->level += lim->rate * ms;
        ln->last = ngx_current_msec;
    }

    if (ln->level > lim->burst) {
        ln->level = lim->burst;
    }
}


/* ---- a request ---- */

ngx_int_t
ngx_http_kvgate_limit_admit(ngx_http_request_t *r, ngx_http_kvgate_ctx_t *ctx,
    kvg_api_error *err)
{
    double                         need, prompt, wait, left;
    ngx_str_t                      key;
    ngx_http_kvgate_limit_t       *lim;
    ngx_http_kvgate_loc_conf_t    *klcf;
    ngx_http_kvgate_limit_zone_t  *z;
    ngx_http_kvgate_limit_node_t  *ln;

    if (ctx->limit != NULL) {
        /* admitted before (a retry of the submission) */
        return NGX_OK;
    }

    klcf = ngx_http_get_module_loc_conf(r, ngx_http_kvgate_module);
    lim = klcf->limit;

    if (lim == NULL) {
        return NGX_OK;
    }

    z = lim->shm_zone->data;

    if (ngx_http_complex_value(r, &z->key, &key) != NGX_OK) {
        return NGX_ERROR;
    }

    if (key.len == 0) {
        /* not limited, as with limit_req */
        return NGX_OK;
    }

    if (key.len > 65535) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "the value of the \"%V\" key is more than 65535 bytes: "
                      "\"%V\"", &z->key.value, &key);
        return NGX_OK;
    }

    ctx->limit_hash = ngx_crc32_short(key.data, key.len);

    prompt = (double) ctx->n_tokens;
    need = ngx_min(prompt, lim->burst);

    ngx_shmtx_lock(&z->shpool->mutex);

    ln = ngx_http_kvgate_limit_lookup(z, &key, ctx->limit_hash);

    if (ln == NULL) {
        ln = ngx_http_kvgate_limit_create(z, lim, &key, ctx->limit_hash);

        if (ln == NULL) {
            ngx_shmtx_unlock(&z->shpool->mutex);
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "could not allocate a key in "
                          "kvgate_limit_tokens_zone \"%V\"", &z->name);
            return NGX_OK;
        }

    } else {
        ngx_queue_remove(&ln->queue);
        ngx_queue_insert_head(&z->sh->queue, &ln->queue);
    }

    ngx_http_kvgate_limit_refill(lim, ln);

    if (ln->level < need) {
        wait = (need - ln->level) / lim->rate / 1000;
        left = ln->level > 0 ? ln->level : 0.0;
        ln->counts.refused++;
        z->sh->total.refused++;

        ngx_shmtx_unlock(&z->shpool->mutex);

        /* the seconds until the bucket holds enough, rounded up */

        ctx->limit_retry = (ngx_uint_t) wait;

        if ((double) ctx->limit_retry < wait || ctx->limit_retry == 0) {
            ctx->limit_retry++;
        }

        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "kvgate: token budget of \"%V\" in zone \"%V\" "
                      "exceeded: %.0f tokens left, %.0f needed",
                      &key, &z->name, left, need);

        kvg_api_error_set(err, 429, "rate_limit_exceeded", NULL,
                          "Rate limit reached for tokens: the budget of "
                          "\"%.*s\" allows %.0f more tokens now and the "
                          "prompt has %.0f; retry after %u s",
                          (int) ngx_min(key.len, 256), key.data, left, prompt,
                          (unsigned) ctx->limit_retry);
        return NGX_DECLINED;
    }

    ln->level -= prompt;
    ln->counts.requests++;
    z->sh->total.requests++;

    ngx_shmtx_unlock(&z->shpool->mutex);

    ctx->limit = lim;
    ctx->limit_key = key;
    ctx->limit_charged = prompt;

    return NGX_OK;
}


/* Charges tokens (negative: gives them back) to the request's key. */

static void
ngx_http_kvgate_limit_charge(ngx_http_kvgate_ctx_t *ctx, double tokens,
    ngx_http_kvgate_limit_counts_t *add)
{
    ngx_http_kvgate_limit_t       *lim = ctx->limit;
    ngx_http_kvgate_limit_zone_t  *z;
    ngx_http_kvgate_limit_node_t  *ln;

    z = lim->shm_zone->data;

    ngx_shmtx_lock(&z->shpool->mutex);

    ln = ngx_http_kvgate_limit_lookup(z, &ctx->limit_key, ctx->limit_hash);

    if (ln != NULL) {
        /* (a key reclaimed meanwhile starts over: full) */
        ngx_http_kvgate_limit_refill(lim, ln);
        ln->level -= tokens;

        if (ln->level > lim->burst) {
            ln->level = lim->burst;
        }

        if (add) {
            ln->counts.prompt += add->prompt;
            ln->counts.cached += add->cached;
            ln->counts.completion += add->completion;
        }
    }

    if (add) {
        z->sh->total.prompt += add->prompt;
        z->sh->total.cached += add->cached;
        z->sh->total.completion += add->completion;
    }

    ngx_shmtx_unlock(&z->shpool->mutex);

    ctx->limit_charged += tokens;
}


void
ngx_http_kvgate_limit_tokens(ngx_http_kvgate_ctx_t *ctx, ngx_uint_t n)
{
    if (ctx->limit == NULL || ctx->limit_closed || n == 0) {
        return;
    }

    ngx_http_kvgate_limit_charge(ctx, (double) n, NULL);
}


void
ngx_http_kvgate_limit_done(ngx_http_kvgate_ctx_t *ctx)
{
    double                          cost;
    uint32_t                        cached;
    ngx_http_kvgate_limit_counts_t  add;

    if (ctx->limit == NULL || ctx->limit_closed) {
        return;
    }

    ctx->limit_closed = 1;

    ngx_memzero(&add, sizeof(ngx_http_kvgate_limit_counts_t));

    if (!ctx->usage_set) {

        if (ctx->cache_status == NULL) {
            /* the engine never accepted it (down, saturated, the client
               left before): nothing was spent, the prompt goes back */
            ngx_http_kvgate_limit_charge(ctx, -ctx->limit_charged, &add);
            return;
        }

        /* accepted, then no usage (an error, the client left): what was
           charged stays */
        add.prompt = ctx->prompt_tokens;
        add.cached = ngx_min(ctx->cached_tokens, ctx->prompt_tokens);

        if (ctx->limit_charged > (double) ctx->n_tokens) {
            add.completion = (uint64_t) (ctx->limit_charged
                                         - (double) ctx->n_tokens);
        }

        ngx_http_kvgate_limit_charge(ctx, 0, &add);
        return;
    }

    cached = ngx_min(ctx->cached_tokens, ctx->prompt_tokens);

    cost = (double) (ctx->prompt_tokens - cached)
           + ctx->limit->cached * cached
           + (double) ctx->completion_tokens;

    add.prompt = ctx->prompt_tokens;
    add.cached = cached;
    add.completion = ctx->completion_tokens;

    ngx_http_kvgate_limit_charge(ctx, cost - ctx->limit_charged, &add);
}


/* ---- the pages ---- */

/* Whether key a goes before key b on the pages: more tokens, then more
   refusals. */

static ngx_uint_t
ngx_http_kvgate_limit_before(ngx_http_kvgate_limit_node_t *a,
    ngx_http_kvgate_limit_node_t *b)
{
    uint64_t  ta, tb;

    ta = a->counts.prompt + a->counts.completion;
    tb = b->counts.prompt + b->counts.completion;

    if (ta != tb) {
        return ta > tb;
    }

    return a->counts.refused > b->counts.refused;
}


ngx_array_t *
ngx_http_kvgate_limit_snapshot(ngx_http_request_t *r)
{
    u_char                         *p;
    ngx_uint_t                      i, j, n;
    ngx_queue_t                    *q;
    ngx_array_t                    *snaps;
    ngx_http_kvgate_limit_row_t    *rows, *row;
    ngx_http_kvgate_limit_snap_t   *snap;
    ngx_http_kvgate_limit_zone_t  **zp, *z;
    ngx_http_kvgate_main_conf_t    *kmcf;
    ngx_http_kvgate_limit_node_t   *ln, *top[NGX_HTTP_KVGATE_LIMIT_KEYS];

    kmcf = ngx_http_get_module_main_conf(r, ngx_http_kvgate_module);

    snaps = ngx_array_create(r->pool, kmcf->limit_zones.nelts + 1,
                             sizeof(ngx_http_kvgate_limit_snap_t));
    if (snaps == NULL) {
        return NULL;
    }

    zp = kmcf->limit_zones.elts;

    for (i = 0; i < kmcf->limit_zones.nelts; i++) {
        z = zp[i];

        if (z->sh == NULL) {
            continue;
        }

        snap = ngx_array_push(snaps);
        if (snap == NULL) {
            return NULL;
        }

        ngx_memzero(snap, sizeof(ngx_http_kvgate_limit_snap_t));
        snap->name = z->name;

        ngx_shmtx_lock(&z->shpool->mutex);

        snap->keys = z->sh->keys;
        snap->reclaimed = z->sh->reclaimed;
        snap->total = z->sh->total;

        /* the top keys, most tokens first (an insertion into at most
           NGX_HTTP_KVGATE_LIMIT_KEYS: one pass over the keys, whatever their
           number, and only the listed ones copied) */

        n = 0;

        for (q = ngx_queue_head(&z->sh->queue);
             q != ngx_queue_sentinel(&z->sh->queue);
             q = ngx_queue_next(q))
        {
            ln = ngx_queue_data(q, ngx_http_kvgate_limit_node_t, queue);

            if (n == NGX_HTTP_KVGATE_LIMIT_KEYS
                && !ngx_http_kvgate_limit_before(ln, top[n - 1]))
            {
                continue;
            }

            j = (n < NGX_HTTP_KVGATE_LIMIT_KEYS) ? n++ : n - 1;

            while (j > 0 && ngx_http_kvgate_limit_before(ln, top[j - 1])) {
                top[j] = top[j - 1];
                j--;
            }

            top[j] = ln;
        }

        rows = ngx_palloc(r->pool,
                          (n + 1) * sizeof(ngx_http_kvgate_limit_row_t));
        if (rows == NULL) {
            ngx_shmtx_unlock(&z->shpool->mutex);
            return NULL;
        }

        for (j = 0; j < n; j++) {
            ln = top[j];

            p = ngx_pnalloc(r->pool, ln->len + 1);
            if (p == NULL) {
                ngx_shmtx_unlock(&z->shpool->mutex);
                return NULL;
            }

            row = &rows[j];
            ngx_memcpy(p, ln->data, ln->len);
            p[ln->len] = '\0';
            row->key = (char *) p;
            row->counts = ln->counts;
            row->level = ln->level;
            row->last = ln->last;
        }

        ngx_shmtx_unlock(&z->shpool->mutex);

        snap->rows = rows;
        snap->n_rows = n;

        /* the keys not listed, summed: the zone's totals less the rows (the
           totals also hold the usage of keys reclaimed) */

        snap->other = snap->total;

        for (n = 0; n < snap->n_rows; n++) {
            snap->other.prompt -= rows[n].counts.prompt;
            snap->other.cached -= rows[n].counts.cached;
            snap->other.completion -= rows[n].counts.completion;
            snap->other.requests -= rows[n].counts.requests;
            snap->other.refused -= rows[n].counts.refused;
        }
    }

    return snaps;
}
