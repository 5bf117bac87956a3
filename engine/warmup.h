/* Warm-up file: prompts prefilled at startup so their KV blocks are in the prefix
 * cache before the first request (common system prompts, few-shot preambles).
 *
 * Format: JSON Lines, UTF-8, one object per line:
 *
 *   # comment
 *   {"tenant": "org_1", "prompt": "You are a helpful assistant...", "ttl": "pinned"}
 *   {"tenant": "org_2", "prompt_ids": [1, 403, 28], "ttl": "30m"}
 *   {"tenant": "org_2", "prompt": "Translate to French:", "ttl": 600}
 *
 *   tenant      string, required, non-empty: the tenant's salt, exactly as the gateway
 *               hashes it (a prompt warmed for "org_1" is only ever served to "org_1").
 *   default_tenant  string (0..255 bytes), in place of tenant: a location's default
 *               tenant of that name (kvgate_default_tenant), the one requests naming no
 *               tenant get; its salt is the name after a mark no tenant name holds
 *               (prefix_hash.h), so "tenant": "default" does not warm it.
 *   prompt      string, non-empty: text, tokenized with the model's tokenizer (BOS
 *               prepended when the vocabulary asks for it, like a raw completion prompt;
 *               special-token text is not parsed).
 *   prompt_ids  array of token ids (0 <= id < vocabulary size), non-empty: used as is.
 *               Exactly one of prompt / prompt_ids.
 *   ttl         optional. "pinned": the blocks are never evicted nor expired, up to the
 *               cache's pinned share of the pool (kvg_pc_config.pinned_share); blocks
 *               beyond that cap become ordinary entries with the cache's default TTL.
 *               A duration string: a positive number and a unit, "500ms", "30s", "5m",
 *               "2h", "1d" (fractions allowed: "1.5h"). A positive number: seconds.
 *               Absent: the engine's default TTL.
 *
 * Blank lines and lines whose first non-blank character is '#' are ignored. Any other
 * line that is not such an object is an error; every error reads "FILE:LINE: FIELD:
 * what is wrong" (unknown fields are errors, to catch typos such as "promt"). Only the
 * prompt's full blocks (n_tokens / block_tokens) can be cached.
 *
 * Loading prefills each entry as a request of max_tokens 1 (the scheduler's minimum;
 * the token is sampled and thrown away), one entry after the other, so an entry
 * sharing a prefix with an earlier one hits it (and a pinned entry pins the shared
 * blocks it hits). */
#ifndef KVG_WARMUP_H
#define KVG_WARMUP_H

#include <stddef.h>
#include <stdint.h>

#include "kv_cache.h"
#include "prefix_cache.h"
#include "scheduler.h"
#include "tokenizer.h"

typedef struct kvg_warmup_entry {
    char *salt;                  /* the tenant's salt, NUL-terminated (a default tenant's
                                  * opens with a NUL: use salt_len) */
    size_t salt_len;
    int32_t *ids;                /* the prompt's tokens */
    int32_t n_ids;
    int64_t ttl_ms;              /* 0: default; KVG_PC_TTL_PINNED: pinned */
    int line;                    /* 1-based, for messages */
} kvg_warmup_entry;

typedef struct kvg_warmup {
    char *name;                  /* file name, for messages */
    kvg_warmup_entry *e;
    size_t n;
} kvg_warmup;

/* Parses a warm-up file. tok tokenizes "prompt" entries (NULL: they are an error);
 * vocab_size bounds "prompt_ids" (0: tok's vocabulary size): pass the model's, since this
 * parse is where a warm-up file's ids are checked and the scheduler takes in-vocabulary ids
 * as a precondition (scheduler.h). NULL with err
 * ("FILE:LINE: FIELD: ...") on the first bad line or when the file cannot be read. */
kvg_warmup *kvg_warmup_load(const char *path, const kvg_tokenizer *tok, int32_t vocab_size,
                            char *err, size_t err_len);
void kvg_warmup_free(kvg_warmup *w);

typedef struct kvg_warmup_opts {
    uint64_t id_base;            /* entry i is request id_base + i (user = the kvg_warmup),
                                    so the scheduler's callback can tell them apart */
    unsigned bucket;             /* stats bucket, 1.. (0: 1; bypass would cache nothing) */
} kvg_warmup_opts;

typedef struct kvg_warmup_result {
    int entries;
    int64_t prompt_tokens;
    int32_t blocks_cached;       /* new cached blocks, pinned ones included */
    int32_t blocks_pinned;       /* newly pinned */
    int32_t pinned_requested;    /* distinct blocks asked to be pinned */
    int32_t pinned_over_cap;     /* of those, not pinned: cached with the default TTL */
    char summary[192];           /* one line, e.g. "warm-up w.jsonl: 3 entries, 410
                                    tokens: pinned 40 blocks, 12 over the cap cached with
                                    the default TTL; 9 blocks cached with a TTL" */
} kvg_warmup_result;

/* Prefills every entry through the scheduler (which must be otherwise idle: it is
 * stepped until nothing is pending) so that each prompt's full blocks are committed
 * under its tenant (kvg_pc_tenant with the entry's salt, default quota) with its TTL,
 * or pinned. pc and pool are the scheduler's. Going over the pinned cap is not a
 * failure: res->pinned_over_cap says how many blocks it concerned (counted against a
 * cache where none of them was pinned before). -1 with err when an entry is rejected
 * by the scheduler ("FILE:LINE: prompt: ...", e.g. longer than the context or the
 * pool), the tenant's record cannot be allocated, or a step fails; nothing is left pending then. */
int kvg_warmup_run(const kvg_warmup *w, kvg_sched *s, kvg_prefix_cache *pc,
                   const kvg_kv_pool *pool, const kvg_warmup_opts *opts,
                   kvg_warmup_result *res, char *err, size_t err_len);

#endif
