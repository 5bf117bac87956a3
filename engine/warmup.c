/* Warm-up file: parsing (JSON Lines) and prefill through the scheduler. */
#include "warmup.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errmsg.h"
#include "prefix_hash.h"
#include "proto.h"
#include "utf8.h"
#include "warmup_testing.h"

/* Upper bound on a TTL: keeps ms arithmetic far from overflow (about 31 years). */
#define MAX_TTL_S 1e9

static int line_err(char *err, size_t err_len, const char *name, int line, const char *field,
                    const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static int line_err(char *err, size_t err_len, const char *name, int line, const char *field,
                    const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (field)
        kvg_set_err(err, err_len, "%s:%d: %s: %s", name, line, field, msg);
    else
        kvg_set_err(err, err_len, "%s:%d: %s", name, line, msg);
    return -1;
}

static int64_t secs_to_ms(double s)
{
    int64_t ms = (int64_t)llround(s * 1000.0);
    return ms < 1 ? 1 : ms;
}

/* "pinned", "<number><unit>" or a number of seconds. */
static int parse_ttl(json_t *v, int64_t *out, const char *name, int line, char *err, size_t err_len)
{
    if (json_is_number(v)) {
        double s = json_number_value(v);
        if (!(s > 0.0 && s <= MAX_TTL_S))
            return line_err(err, err_len, name, line, "ttl", "seconds must be in (0, %.0f], got %g",
                            MAX_TTL_S, s);
        *out = secs_to_ms(s);
        return 0;
    }
    if (!json_is_string(v))
        return line_err(err, err_len, name, line, "ttl",
                        "expected \"pinned\", a duration such as \"5m\" or a number of seconds");
    const char *t = json_string_value(v), *unit;
    char *end;
    double x, mul;
    if (strcmp(t, "pinned") == 0) {
        *out = KVG_PC_TTL_PINNED;
        return 0;
    }
    /* strtod alone would take "inf", hex and leading blanks: require a digit first. */
    if (t[0] < '0' || t[0] > '9')
        goto bad;
    errno = 0;
    x = strtod(t, &end);
    if (errno || end == t)
        goto bad;
    unit = end;
    if (strcmp(unit, "ms") == 0)
        mul = 0.001;
    else if (strcmp(unit, "s") == 0)
        mul = 1.0;
    else if (strcmp(unit, "m") == 0)
        mul = 60.0;
    else if (strcmp(unit, "h") == 0)
        mul = 3600.0;
    else if (strcmp(unit, "d") == 0)
        mul = 86400.0;
    else
        goto bad;
    x *= mul;
    if (!(x > 0.0 && x <= MAX_TTL_S))
        return line_err(err, err_len, name, line, "ttl", "\"%s\" must be positive and at most %.0f s",
                        t, MAX_TTL_S);
    *out = secs_to_ms(x);
    return 0;
bad:
    return line_err(err, err_len, name, line, "ttl",
                    "\"%s\" is not \"pinned\" nor a duration (e.g. \"500ms\", \"30s\", \"5m\", "
                    "\"2h\", \"1d\")", t);
}

static int parse_ids(json_t *v, int32_t vocab, kvg_warmup_entry *e, const char *name, int line,
                     char *err, size_t err_len)
{
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_array(v))
        return line_err(err, err_len, name, line, "prompt_ids", "expected an array of token ids");
    if (n == 0)
        return line_err(err, err_len, name, line, "prompt_ids", "empty");
    if (n > INT32_MAX / 2)
        return line_err(err, err_len, name, line, "prompt_ids", "too long");
    e->ids = malloc(n * sizeof *e->ids);
    if (!e->ids)
        return line_err(err, err_len, name, line, "prompt_ids", "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        char field[48];
        snprintf(field, sizeof field, "prompt_ids[%zu]", i);
        if (!json_is_integer(x))
            return line_err(err, err_len, name, line, field, "expected an integer token id");
        json_int_t id = json_integer_value(x);
        if (vocab <= 0)
            return line_err(err, err_len, name, line, field, "no vocabulary size to check ids against");
        if (id < 0 || id >= vocab)
            return line_err(err, err_len, name, line, field, "id %lld is out of the vocabulary (%d)",
                            (long long)id, (int)vocab);
        e->ids[i] = (int32_t)id;
    }
    e->n_ids = (int32_t)n;
    return 0;
}

static int parse_prompt(json_t *v, const kvg_tokenizer *tok, kvg_warmup_entry *e, const char *name,
                        int line, char *err, size_t err_len)
{
    char terr[256];
    int32_t *ids = NULL;
    size_t n = 0;
    if (!json_is_string(v))
        return line_err(err, err_len, name, line, "prompt", "expected a string");
    if (json_string_length(v) == 0)
        return line_err(err, err_len, name, line, "prompt", "empty");
    if (!tok)
        return line_err(err, err_len, name, line, "prompt",
                        "text needs a tokenizer (give prompt_ids instead)");
    if (kvg_tokenizer_encode(tok, json_string_value(v), json_string_length(v),
                             kvg_tokenizer_add_bos(tok) ? KVG_ENC_BOS : 0, &ids, &n,
                             terr, sizeof terr) != 0)
        return line_err(err, err_len, name, line, "prompt", "%s", terr);
    if (n == 0 || n > INT32_MAX / 2) {
        free(ids);
        return line_err(err, err_len, name, line, "prompt", "tokenizes to %zu tokens", n);
    }
    e->ids = ids;
    e->n_ids = (int32_t)n;
    return 0;
}

/* One non-blank, non-comment line into e (freed by the caller on failure). */
static int parse_line(const char *s, size_t len, const kvg_tokenizer *tok, int32_t vocab,
                      kvg_warmup_entry *e, const char *name, int line, char *err, size_t err_len)
{
    json_error_t je;
    json_t *o, *v, *prompt = NULL, *ids = NULL, *tenant = NULL, *def = NULL;
    const char *key;
    size_t bad = kvg_utf8_invalid_at((const unsigned char *)s, len);
    int rc = -1;

    e->line = line;
    if (bad != (size_t)-1)
        return line_err(err, err_len, name, line, NULL, "invalid UTF-8 at byte %zu", bad + 1);
    o = json_loadb(s, len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return line_err(err, err_len, name, line, NULL, "invalid JSON at column %d: %s",
                        je.column, je.text);
    if (!json_is_object(o)) {
        line_err(err, err_len, name, line, NULL, "expected a JSON object");
        goto out;
    }
    json_object_foreach(o, key, v) {
        if (strcmp(key, "tenant") == 0)
            tenant = v;
        else if (strcmp(key, "default_tenant") == 0)
            def = v;
        else if (strcmp(key, "prompt") == 0)
            prompt = v;
        else if (strcmp(key, "prompt_ids") == 0)
            ids = v;
        else if (strcmp(key, "ttl") == 0) {
            if (parse_ttl(v, &e->ttl_ms, name, line, err, err_len) != 0)
                goto out;
        } else {
            line_err(err, err_len, name, line, key,
                     "unknown field (expected tenant or default_tenant, prompt or prompt_ids, ttl)");
            goto out;
        }
    }
    if (tenant && def) {
        line_err(err, err_len, name, line, "default_tenant", "give tenant or default_tenant, not both");
        goto out;
    }
    if (!tenant && !def) {
        line_err(err, err_len, name, line, "tenant", "missing (or default_tenant)");
        goto out;
    }
    if (def) {
        /* A location's default tenant (kvgate_default_tenant): salted with a mark no
         * tenant name holds (prefix_hash.h), as the gateway does. */
        if (!json_is_string(def)) {
            line_err(err, err_len, name, line, "default_tenant", "expected a string");
            goto out;
        }
        if (json_string_length(def) > KVG_PREFIX_DEFAULT_NAME_MAX(KVG_PROTO_MAX_SALT)) {
            line_err(err, err_len, name, line, "default_tenant", "longer than %d bytes",
                     KVG_PREFIX_DEFAULT_NAME_MAX(KVG_PROTO_MAX_SALT));
            goto out;
        }
    } else {
        if (!json_is_string(tenant)) {
            line_err(err, err_len, name, line, "tenant", "expected a string");
            goto out;
        }
        if (json_string_length(tenant) == 0) {
            line_err(err, err_len, name, line, "tenant", "empty");
            goto out;
        }
    }
    if (prompt && ids) {
        line_err(err, err_len, name, line, "prompt_ids", "give prompt or prompt_ids, not both");
        goto out;
    }
    if (!prompt && !ids) {
        line_err(err, err_len, name, line, "prompt", "missing (or prompt_ids)");
        goto out;
    }
    {
        json_t *t = def ? def : tenant;
        size_t n = json_string_length(t);
        e->salt = malloc(n + 2);
        if (!e->salt) {
            line_err(err, err_len, name, line, def ? "default_tenant" : "tenant", "out of memory");
            goto out;
        }
        if (def)
            e->salt_len = kvg_prefix_default_salt(json_string_value(t), n, (uint8_t *)e->salt, n + 2);
        else {
            memcpy(e->salt, json_string_value(t), n);
            e->salt_len = n;
        }
        e->salt[e->salt_len] = '\0';
    }
    rc = ids ? parse_ids(ids, vocab, e, name, line, err, err_len)
             : parse_prompt(prompt, tok, e, name, line, err, err_len);
out:
    json_decref(o);
    return rc;
}

static int skippable(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r'))
        i++;
    return i == len || s[i] == '#';
}

kvg_warmup *kvg_warmup_parse(const char *data, size_t len, const char *name,
                             const kvg_tokenizer *tok, int32_t vocab_size,
                             char *err, size_t err_len)
{
    kvg_warmup *w = calloc(1, sizeof *w);
    size_t cap = 0, pos = 0;
    int line = 0;

    if (!name)
        name = "warm-up";
    if (!w || !(w->name = strdup(name))) {
        kvg_set_err(err, err_len, "%s: out of memory", name);
        free(w);
        return NULL;
    }
    if (vocab_size <= 0 && tok)
        vocab_size = kvg_tokenizer_vocab_size(tok);
    while (pos < len) {
        const char *s = data + pos, *nl = memchr(s, '\n', len - pos);
        size_t l = nl ? (size_t)(nl - s) : len - pos;
        pos += l + (nl != NULL);
        line++;
        if (l > 0 && s[l - 1] == '\r')
            l--;
        if (skippable(s, l))
            continue;
        if (w->n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            kvg_warmup_entry *ne = realloc(w->e, nc * sizeof *ne);
            if (!ne) {
                line_err(err, err_len, name, line, NULL, "out of memory");
                goto fail;
            }
            w->e = ne;
            cap = nc;
        }
        memset(&w->e[w->n], 0, sizeof w->e[w->n]);
        if (parse_line(s, l, tok, vocab_size, &w->e[w->n], name, line, err, err_len) != 0) {
            free(w->e[w->n].salt);
            free(w->e[w->n].ids);
            goto fail;
        }
        w->n++;
    }
    return w;
fail:
    kvg_warmup_free(w);
    return NULL;
}

kvg_warmup *kvg_warmup_load(const char *path, const kvg_tokenizer *tok, int32_t vocab_size,
                            char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    kvg_warmup *w = NULL;
    if (!f) {
        kvg_set_err(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    for (;;) {
        if (cap - len < 65536) {
            char *nb = realloc(buf, cap ? cap * 2 : 65536);
            if (!nb) {
                kvg_set_err(err, err_len, "%s: out of memory", path);
                goto out;
            }
            buf = nb;
            cap = cap ? cap * 2 : 65536;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        kvg_set_err(err, err_len, "%s: read error", path);
        goto out;
    }
    w = kvg_warmup_parse(buf, len, path, tok, vocab_size, err, err_len);
out:
    free(buf);
    fclose(f);
    return w;
}

void kvg_warmup_free(kvg_warmup *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++) {
        free(w->e[i].salt);
        free(w->e[i].ids);
    }
    free(w->e);
    free(w->name);
    free(w);
}

static int cmp_hash(const void *a, const void *b)
{
    return memcmp(a, b, KVG_PREFIX_HASH_LEN);
}

/* Steps until nothing is pending; on a step failure, cancels what is left. A step that
 * ran nothing has requests waiting for disk reads: it sleeps until one ends. */
static int drain(kvg_sched *s, kvg_prefix_cache *pc, char *err, size_t err_len)
{
    char serr[256];
    while (kvg_sched_pending(s) > 0) {
        int rows = kvg_sched_step(s, serr, sizeof serr);
        if (rows < 0) {
            kvg_set_err(err, err_len, "step: %s", serr);
            return -1;
        }
        if (rows == 0)
            kvg_pc_disk_wait(pc, 10);
    }
    return 0;
}

int kvg_warmup_run(const kvg_warmup *w, kvg_sched *s, kvg_prefix_cache *pc,
                   const kvg_kv_pool *pool, const kvg_warmup_opts *opts,
                   kvg_warmup_result *res, char *err, size_t err_len)
{
    kvg_warmup_opts o = { 0, 1 };
    kvg_pc_stats st0, st1;
    kvg_prefix_hasher *h;
    /* Every entry's chain, computed once: the scheduler takes it (it never hashes a
     * prompt), and a pinned entry's stays here to be counted. hashes[0..n_pins) are
     * the pinned entries' so far, the entry at hand's follows them. */
    uint8_t (*hashes)[KVG_PREFIX_HASH_LEN] = NULL;
    size_t n_pins = 0, cap = 0;
    int32_t bt = pool->geom.block_tokens;
    int rc = -1;

    memset(res, 0, sizeof *res);
    if (opts)
        o = *opts;
    if (o.bucket == 0)
        o.bucket = 1;
    h = kvg_prefix_hasher_new(err, err_len);
    if (!h)
        return -1;
    kvg_pc_get_stats(pc, &st0);
    for (size_t i = 0; i < w->n; i++) {
        const kvg_warmup_entry *e = &w->e[i];
        kvg_sched_req q;
        char serr[256];
        size_t nb = (size_t)(e->n_ids / bt);
        memset(&q, 0, sizeof q);
        if (n_pins + nb > cap) {
            size_t nc = (n_pins + nb) * 2;
            void *np = realloc(hashes, nc * sizeof *hashes);
            if (!np) {
                kvg_set_err(err, err_len, "%s: out of memory", w->name);
                goto out;
            }
            hashes = np;
            cap = nc;
        }
        if (kvg_pc_salt_root(pc, h, e->salt, e->salt_len, q.root, serr, sizeof serr) != 0) {
            line_err(err, err_len, w->name, e->line, "tenant", "%s", serr);
            goto out;
        }
        if (nb) {
            if (kvg_prefix_chain(h, q.root, e->ids, (size_t)e->n_ids, (size_t)bt, hashes + n_pins,
                                 cap - n_pins, &nb, serr, sizeof serr) != 0) {
                line_err(err, err_len, w->name, e->line, "prompt", "%s", serr);
                goto out;
            }
            q.hashes = (const uint8_t (*)[KVG_PREFIX_HASH_LEN])(hashes + n_pins);
            q.n_hashes = (int32_t)nb;
        }
        /* Held until the request is queued (it takes its own reference); the tenant
         * then lives on through the blocks the entry caches. */
        q.tenant = kvg_pc_tenant(pc, e->salt, e->salt_len, 0.0);
        if (q.tenant < 0) {
            line_err(err, err_len, w->name, e->line, "tenant", "out of memory for the tenant's record");
            goto out;
        }
        q.id = o.id_base + i;
        q.user = (void *)w;
        q.prompt = e->ids;
        q.n_prompt = e->n_ids;
        q.bucket = o.bucket;
        q.n = 1;
        q.max_tokens = 1;
        q.ttl_ms = e->ttl_ms;
        q.sp.temperature = 0.0f;
        q.sp.top_p = 1.0f;
        {
            int sub = kvg_sched_submit(s, &q, serr, sizeof serr);
            kvg_pc_tenant_put(pc, q.tenant);
            if (sub != 0) {
                line_err(err, err_len, w->name, e->line, "prompt", "%s", serr);
                goto out;
            }
        }
        /* One at a time: a later entry sharing a prefix hits the earlier one's blocks
         * instead of racing it to commit the same hashes. */
        if (drain(s, pc, serr, sizeof serr) != 0) {
            for (size_t k = 0; k <= i; k++)
                kvg_sched_cancel(s, o.id_base + k);
            line_err(err, err_len, w->name, e->line, "prompt", "%s", serr);
            goto out;
        }
        res->entries++;
        res->prompt_tokens += e->n_ids;
        if (e->ttl_ms == KVG_PC_TTL_PINNED)
            n_pins += nb;        /* its chain stays, to be counted */
    }
    /* Entries may share blocks: count each pinned block once. */
    if (n_pins > 1) {
        size_t u = 1;
        qsort(hashes, n_pins, sizeof *hashes, cmp_hash);
        for (size_t i = 1; i < n_pins; i++)
            if (memcmp(hashes[i], hashes[u - 1], KVG_PREFIX_HASH_LEN) != 0)
                memcpy(hashes[u++], hashes[i], KVG_PREFIX_HASH_LEN);
        n_pins = u;
    }
    kvg_pc_get_stats(pc, &st1);
    res->blocks_cached = st1.blocks_cached - st0.blocks_cached;
    res->blocks_pinned = st1.blocks_pinned - st0.blocks_pinned;
    res->pinned_requested = (int32_t)n_pins;
    res->pinned_over_cap = res->pinned_requested - res->blocks_pinned;
    if (res->pinned_over_cap < 0)
        res->pinned_over_cap = 0;
    {
        int32_t ttl_blocks = res->blocks_cached - res->blocks_pinned;
        char over[96] = "";
        if (res->pinned_over_cap > 0)
            snprintf(over, sizeof over, ", %d over the cap cached with the default TTL",
                     (int)res->pinned_over_cap);
        snprintf(res->summary, sizeof res->summary,
                 "warm-up %s: %d entries, %lld tokens: pinned %d blocks%s; %d blocks cached "
                 "with a TTL", w->name, res->entries, (long long)res->prompt_tokens,
                 (int)res->blocks_pinned, over, (int)(ttl_blocks > 0 ? ttl_blocks : 0));
    }
    rc = 0;
out:
    free(hashes);
    kvg_prefix_hasher_free(h);
    return rc;
}
