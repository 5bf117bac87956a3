/* The engine protocol: what a client (an nginx worker, kvgate-cli) and the engine
 * say to each other. Nothing here knows nginx or the engine's internals.
 *
 * 1. The handshake, over the engine's unix socket (SOCK_SEQPACKET, so every
 *    message arrives whole, and either side's death reads as EOF on the other):
 *
 *      client -> engine   kvg_hello    magic, protocol version, pid, a name
 *      engine -> client   kvg_welcome  status; on success the model (id, served
 *                                      name, context length, block size,
 *                                      vocabulary, BOS/EOS, chat template) and,
 *                                      as SCM_RIGHTS, KVG_WELCOME_FDS descriptors:
 *        fd[0] the client's region (a memfd with the shm_channel.h layout)
 *        fd[1] the doorbell to the engine (eventfd): the client writes it after
 *              pushing to the submission ring, or after freeing completion-ring
 *              room the engine waits for
 *        fd[2] the doorbell to the client (eventfd), the same the other way
 *        fd[3] the tokenizer's bytes: the file the engine loaded it from, opened
 *              read-only, or a sealed memfd. The client maps it and loads the
 *              very tokenizer the engine uses, so the gateway never tokenizes or
 *              hashes with a tokenizer that disagrees with the model
 *        fd[4] the engine's statistics page (a memfd sealed against new writable
 *              mappings; kvg_stats below): map it read-only
 *        fd[5] the engine's cache index (a memfd sealed the same way;
 *              kvg_cache_index_page below): the chain hashes of the blocks its prefix cache holds, for
 *              routing. Map it read-only (src/cache_index.h reads it)
 *        fd[6] the chat template's Jinja source (a sealed memfd of template_bytes;
 *              empty when the model has none): the client compiles and renders
 *              it (jinja.h), so the prompt is built where the request is parsed
 *    Afterwards the socket carries nothing; it stays open only so that each side
 *    notices the other dying.
 *
 * 2. Messages in the region's rings (slot body = one of the structs below, payload in
 *    the data area). Client -> engine: SUBMIT, CANCEL, PAUSE, RESUME, SAMPLES, WIPE.
 *    Engine -> client, per request:
 *    ACCEPTED once (cached tokens known), TOKENS as they are produced (streamed, not
 *    at the end), FINISHED once per sample, then DONE (usage); or ERROR at any point,
 *    which ends the request. DONE and ERROR are always the last message of a request.
 *    A WIPE is answered by one WIPED (or one ERROR) under its id.
 *
 * Every body starts with its protocol version. The receiver checks type, body_len ==
 * sizeof(struct) and version before reading anything else, then the payload layout
 * against payload_len (kvg_proto_decode_*): each side treats the other as untrusted.
 * Payload parts follow one another in the documented order, each starting at a
 * multiple of 8 bytes from the payload start. */
#ifndef KVG_PROTO_H
#define KVG_PROTO_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "prefix_hash.h"
#include "shm_channel.h"

#define KVG_PROTO_MAGIC     0x6b766731u   /* "1gvk" little-endian */
#define KVG_PROTO_VERSION   8u   /* 2: SUBMIT's n_active, SAMPLES, the samples_* statistics;
                                    3: the cache index (fd[5], index_bytes), load_tokens;
                                    4: the statistics page's heartbeat;
                                    5: the chat template's source (fd[6]) and origin;
                                    6: the KV disk and host tiers' statistics;
                                    7: SUBMIT's holds (cache_control), DONE's
                                       cache_write_tokens;
                                    8: WIPE and WIPED (an operator's tenant wipe) */
#define KVG_WELCOME_FDS     7

/* Limits every side enforces. These are the one definition: the engine's scheduler
 * and stop matcher define theirs from them (KVG_SCHED_MAX_N, KVG_STOP_MAX,
 * KVG_STOP_MAX_LEN). */
#define KVG_PROTO_MAX_SALT       256      /* tenant salt bytes */
#define KVG_PROTO_MAX_N          16       /* samples per request */
#define KVG_PROTO_MAX_STOP       4        /* stop strings */
#define KVG_PROTO_MAX_STOP_LEN   128      /* bytes per stop string */
#define KVG_PROTO_MAX_STOP_IDS   6        /* extra stop token ids (EOS and BOS come on top) */
#define KVG_PROTO_MAX_ERROR_LEN  1024     /* error message bytes */

/* ---- handshake ---- */

typedef struct kvg_hello {
    uint32_t magic;              /* KVG_PROTO_MAGIC */
    uint32_t version;            /* KVG_PROTO_VERSION */
    uint32_t pid;
    uint32_t reserved;
    char name[48];               /* NUL-terminated: "nginx worker", "kvgate-cli" (for logs) */
} kvg_hello;

typedef struct kvg_welcome {
    uint32_t magic;
    uint32_t version;
    uint32_t status;             /* 0: accepted; else an HTTP-like status and message says why */
    uint32_t engine_pid;
    char message[256];           /* NUL-terminated; the reason of a refusal */
    uint8_t model_id[KVG_PREFIX_HASH_LEN];   /* the model identity (hash roots are made from it) */
    char model_name[128];        /* the served model name (the "model" of requests) */
    char chat_template[32];      /* chat_template.h's info: the name ("model", "file", a
                                    built-in's, "none") */
    char chat_template_source[200];  /* where it came from */
    char chat_template_sha256[24];   /* 16 hex digits of its SHA-256 */
    uint32_t chat_template_origin;   /* kvg_chat_origin */
    uint32_t reserved2;
    uint64_t template_bytes;     /* size of fd[6]: the source, 0 when none */
    char tokenizer_name[160];    /* where the tokenizer came from, for messages */
    uint64_t instance;           /* random per engine start: a restart is a new instance */
    uint64_t region_bytes;       /* size of fd[0] */
    uint64_t tokenizer_bytes;    /* size of fd[3] */
    uint64_t stats_bytes;        /* size of fd[4] */
    uint64_t index_bytes;        /* size of fd[5] */
    uint32_t context_length;     /* positions: prompt + completion */
    uint32_t block_tokens;       /* tokens per prefix-hash block */
    uint32_t vocab_size;
    int32_t bos, eos;            /* -1 when the vocabulary has none */
    uint32_t add_bos;            /* prompts start with BOS */
    uint32_t max_n;              /* samples per request the engine accepts */
    uint32_t reserved;
} kvg_welcome;

/* Handshake I/O on a connected SOCK_SEQPACKET socket. Non-blocking sockets are
 * fine: a return of 1 means "would block, call again when readable". */
int kvg_proto_send_hello(int sock, const char *name, char *err, size_t err_len);
/* 0 with *h filled and checked for magic (version is left to the caller, which
 * answers a mismatch with a refusal), 1 would block, -1 error or EOF. */
int kvg_proto_recv_hello(int sock, kvg_hello *h, char *err, size_t err_len);
/* Sends w with n_fds descriptors (0 for a refusal). */
int kvg_proto_send_welcome(int sock, const kvg_welcome *w, const int *fds, int n_fds,
                           char *err, size_t err_len);
/* 0 with *w and fds[KVG_WELCOME_FDS] (all -1 unless w->status == 0, then all
 * valid and owned by the caller), 1 would block, -1 error or EOF. Checks magic,
 * version, NUL-termination of the strings and the descriptor count. */
int kvg_proto_recv_welcome(int sock, kvg_welcome *w, int fds[KVG_WELCOME_FDS],
                           char *err, size_t err_len);

/* ---- messages ---- */

enum kvg_msg_type {
    KVG_MSG_SUBMIT   = 1,        /* sq */
    KVG_MSG_CANCEL   = 2,        /* sq */
    KVG_MSG_ACCEPTED = 3,        /* cq */
    KVG_MSG_TOKENS   = 4,        /* cq */
    KVG_MSG_FINISHED = 5,        /* cq */
    KVG_MSG_DONE     = 6,        /* cq */
    KVG_MSG_ERROR    = 7,        /* cq */
    KVG_MSG_PAUSE    = 8,        /* sq */
    KVG_MSG_RESUME   = 9,        /* sq */
    KVG_MSG_SAMPLES  = 10,       /* sq */
    KVG_MSG_WIPE     = 11,       /* sq */
    KVG_MSG_WIPED    = 12        /* cq */
};

/* Bypass (neither look up nor fill the prefix cache) is bucket 0, and only that: it
 * travels once. Bit 0x1 was a second bypass flag; clients leave it clear. The engine
 * still accepts it together with bucket 0 (what earlier clients sent) and ignores it,
 * and refuses it with any other bucket. */
#define KVG_SUBMIT_OLD_BYPASS 0x1u
#define KVG_SUBMIT_LOGPROBS  0x2u   /* send the chosen tokens' logprobs */
#define KVG_SUBMIT_FLAGS     0x3u   /* every bit a decoder accepts */

#define KVG_TTL_PINNED       UINT32_MAX   /* cache_ttl_ms: pin the committed blocks */
#define KVG_PROTO_MAX_HOLDS  4            /* Anthropic's cache_control breakpoints */

/* Payload: tenant salt (salt_len bytes) | token ids (uint32 x n_tokens) | block
 * hashes (KVG_PREFIX_HASH_LEN bytes x n_block_hashes: the chain over the full blocks
 * of the prompt, rooted at (model id, salt); none for bypass) | extra stop token ids
 * (uint32 x n_stop_ids; the engine always stops on EOS) | stop string lengths
 * (uint32 x n_stop) | stop string bytes (the strings back to back, stop_bytes).
 *
 * The block hashes are a consistency check, not cache keys. The engine recomputes
 * the chain from the tokens under its own model id, the salt and its block size (the
 * cache is keyed by what it computed, so no client can make one prompt's blocks
 * serve another), and refuses the request with ERROR 400 when
 *   - n_block_hashes != n_tokens / block_tokens ("N block hashes for M tokens"), or
 *   - any hash differs from its recomputed value ("block i's hash does not match
 *     its tokens").
 * Why send them at all: the gateway routes by the same chain (its route key, and a
 * front tier's choice of engine), so a gateway that hashes differently from the
 * engine (another model id after a restart, another block size, a different salt)
 * would route every prompt to the wrong cache in silence; the check turns that into
 * an error on the first request. Bypass requests (bucket 0) carry none (a decoder
 * refuses hashes with bucket 0). */
typedef struct kvg_msg_submit {
    uint32_t version;
    uint32_t flags;              /* KVG_SUBMIT_* */
    uint64_t request_id;         /* chosen by the client, unique among its live requests */
    uint64_t seed;               /* sample j draws with seed and sample index j (whenever it
                                    starts: at once or drawn later by SAMPLES) */
    uint32_t bucket;             /* length bucket index, < KVG_STATS_BUCKETS: labels the engine's
                                    stats; 0 = bypass the prefix cache */
    int32_t  priority;           /* higher is admitted first */
    uint32_t cache_ttl_ms;       /* TTL of the blocks it commits: 0 = engine default, KVG_TTL_PINNED */
    uint32_t deadline_ms;        /* the engine gives up this long after receiving it; 0 = never */
    uint32_t n;                  /* samples, 1..KVG_PROTO_MAX_N */
    uint32_t max_tokens;         /* per sample, >= 1 */
    uint32_t top_k;              /* 0 = off */
    float    temperature;        /* 0 = greedy */
    float    top_p;              /* 1 = off */
    uint32_t salt_len;
    uint32_t n_tokens;
    uint32_t n_block_hashes;
    uint32_t n_stop_ids;
    uint32_t n_stop;
    uint32_t stop_bytes;
    uint32_t n_active;           /* samples started once the prompt is ready: 0 = all n, else
                                    1..n (the engine's intake answers 400 otherwise); the
                                    others wait, undrawn, for SAMPLES */
    /* cache_control breakpoints: the prompt's first hold_blocks[i] blocks are held (pinned,
     * never evicted) for hold_ms[i] (kvg_pc_hold), a block for the longest hold covering
     * it. n_holds <= KVG_PROTO_MAX_HOLDS, each hold_blocks[i] in 1..n_block_hashes,
     * hold_ms[i] >= 1; none with bypass (the intake answers 400 otherwise). */
    uint32_t n_holds;
    uint32_t hold_blocks[KVG_PROTO_MAX_HOLDS];
    uint32_t hold_ms[KVG_PROTO_MAX_HOLDS];
} kvg_msg_submit;

/* No payload. The engine stops the request within one step and releases its blocks;
 * the client forgets it at once (later messages for the id are dropped). */
typedef struct kvg_msg_cancel {
    uint32_t version;
    uint32_t reserved;
    uint64_t request_id;
} kvg_msg_cancel;

/* PAUSE and RESUME (one body), no payload. The client cannot send the request's
 * output on as fast as the engine makes it (its HTTP client stops reading): PAUSE
 * takes the request out of the engine's batches and admission while it keeps its
 * blocks and its place (the scheduler holds it); RESUME puts it back. Both are idempotent and name a request by its id;
 * an id that is not live (the request ended, the messages crossed) is ignored, so
 * is RESUME without PAUSE. Output the engine made before the PAUSE still comes. A
 * CANCEL ends a paused request as any other. reserved must be 0. */
typedef struct kvg_msg_pause {
    uint32_t version;
    uint32_t reserved;
    uint64_t request_id;
} kvg_msg_pause;

/* SAMPLES, no payload: per-sample control of a live request with n > 1 (self-
 * consistency: samples drawn in waves off one prompt, stopped once the vote is
 * decided). The engine applies cancel_mask first, then draw:
 *   cancel_mask  bit j = sample j (bits >= n are ignored). A running sample stops
 *                within one step, its own blocks are released at once (the prompt's
 *                shared blocks stay for the others), and it gets FINISHED with
 *                KVG_MSG_FINISH_CANCELLED and its completion_tokens so far. A sample
 *                not started yet is dropped: FINISHED cancelled with 0 tokens. The bit
 *                of a finished (or dropped) sample is ignored.
 *   draw         starts the next `draw` samples not started yet (lowest index first;
 *                dropped ones are skipped) off the request's prompt: the request keeps
 *                the prompt's KV (and its last logits) while samples remain undrawn,
 *                so nothing is recomputed. A draw beyond what remains is clamped.
 * Sample j always draws with (seed, j), so its tokens are the same whether it started
 * at once or in a later wave. DONE comes once every sample is finished or dropped;
 * its completion_tokens counts the tokens really generated. An id that is not live
 * (the request ended, the messages crossed) is ignored. reserved must be 0. */
typedef struct kvg_msg_samples {
    uint32_t version;
    uint32_t draw;
    uint64_t request_id;
    uint32_t cancel_mask;
    uint32_t reserved;
} kvg_msg_samples;

/* WIPE, payload: the tenant's salt (salt_len bytes, 0..KVG_PROTO_MAX_SALT): exactly
 * the salt SUBMIT carries for that tenant, so the engine derives the same chain root
 * (the tag its host and disk tiers keep) and finds the same tenant record. An
 * operator's wipe of the tenant on a running engine, in every tier:
 *   pool  its cached blocks (refcount 0) are freed. Its blocks in use by live requests
 *         lose their hash at once: never found again, by anyone, and freed when their
 *         requests release them; those requests go on unchanged (their K/V stay, so
 *         their answers are what they would have been) but commit nothing more, so no
 *         block of a request that was live at the wipe enters the cache afterwards.
 *         Requests SUBMITted after the WIPE cache as usual.
 *   host  its slots are dropped.
 *   disk  its slots are dropped (their headers rewritten, so a restarted engine finds
 *         none), and its blocks still queued for writing are never written.
 * The cache index (fd[5]) loses the pool's hashes with them, so routing forgets the
 * tenant too. The engine answers WIPED with the counts under request_id (chosen by the
 * client, unique among its live ids, never 0), or ERROR 400 for a malformed WIPE.
 * flags and reserved must be 0. A salt no tenant has is no error: WIPED with zeros. */
typedef struct kvg_msg_wipe {
    uint32_t version;
    uint32_t flags;              /* none defined: 0 */
    uint64_t request_id;
    uint32_t salt_len;
    uint32_t reserved;
} kvg_msg_wipe;

/* No payload. The wipe of request_id is done: the blocks dropped in each tier (pool:
 * cached ones freed plus in-use ones unhashed). */
typedef struct kvg_msg_wiped {
    uint32_t version;
    uint32_t reserved;
    uint64_t request_id;
    uint64_t pool_blocks;
    uint64_t host_blocks;
    uint64_t disk_blocks;
} kvg_msg_wiped;

/* No payload. The request was admitted: its prompt is being computed. */
typedef struct kvg_msg_accepted {
    uint32_t version;
    uint32_t reserved;
    uint64_t request_id;
    uint32_t prompt_tokens;
    uint32_t cached_tokens;      /* prompt tokens served from the prefix cache */
} kvg_msg_accepted;

#define KVG_TOKENS_LOGPROBS 0x1u

/* Payload: token ids (uint32 x n_tokens) | with KVG_TOKENS_LOGPROBS their logprobs
 * (float x n_tokens) | text bytes (text_len): the text that became visible with these
 * tokens (complete UTF-8 characters; text that may still turn out to be a stop
 * string is held back until it is decided). n_tokens may be 0 (held-back text
 * released at the end). */
typedef struct kvg_msg_tokens {
    uint32_t version;
    uint32_t flags;              /* KVG_TOKENS_* */
    uint64_t request_id;
    uint32_t sample_index;       /* 0..n-1 */
    uint32_t n_tokens;
    uint32_t text_len;
    uint32_t reserved;
} kvg_msg_tokens;

enum kvg_msg_finish {
    KVG_MSG_FINISH_STOP      = 1,    /* EOS, a stop id or a stop string ("stop") */
    KVG_MSG_FINISH_LENGTH    = 2,    /* max_tokens or the context ("length") */
    KVG_MSG_FINISH_CANCELLED = 3,
    KVG_MSG_FINISH_DEADLINE  = 4     /* deadline_ms passed */
};

/* No payload. Sample sample_index is complete. */
typedef struct kvg_msg_finished {
    uint32_t version;
    uint32_t sample_index;
    uint64_t request_id;
    uint32_t finish_reason;      /* kvg_msg_finish */
    uint32_t completion_tokens;  /* of this sample */
} kvg_msg_finished;

/* No payload. All samples are complete; the request is gone from the engine. */
typedef struct kvg_msg_done {
    uint32_t version;
    uint32_t reserved;
    uint64_t request_id;
    uint32_t prompt_tokens;
    uint32_t cached_tokens;
    uint32_t completion_tokens;  /* over all samples */
    uint32_t cache_write_tokens; /* prompt tokens this request computed and held for its
                                    holds (Anthropic's cache_creation_input_tokens) */
} kvg_msg_done;

/* Payload: the message (message_len bytes of UTF-8, at most KVG_PROTO_MAX_ERROR_LEN).
 * status is HTTP-like: 400 invalid request (bad field, prompt longer than the context,
 * hashes that do not match the tokens), 429 the engine is saturated, 500 the engine
 * failed, 503 the engine is shutting down. request_id 0 concerns the channel, not a
 * request. */
typedef struct kvg_msg_error {
    uint32_t version;
    uint32_t status;
    uint64_t request_id;
    uint32_t message_len;
    uint32_t reserved;
} kvg_msg_error;

/* ---- encoding and decoding ---- */

/* A submission as its parts (what the client fills and the engine decodes into).
 * After kvg_proto_decode_submit the pointers point into the message's payload. */
typedef struct kvg_submit_view {
    kvg_msg_submit h;
    const uint8_t *salt;
    const uint32_t *tokens;
    const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN];
    const uint32_t *stop_ids;
    const uint32_t *stop_len;    /* n_stop lengths */
    const char *stop_bytes;      /* stop_bytes bytes */
} kvg_submit_view;

/* Payload bytes of a submission with these counts (h's count fields); 0 on overflow. */
size_t kvg_proto_submit_size(const kvg_msg_submit *h);
/* Writes the payload of v (counts in v->h) into buf (cap bytes, 8-byte aligned).
 * Returns the size, or 0 when cap is too small. */
size_t kvg_proto_encode_submit(const kvg_submit_view *v, void *buf, size_t cap);
/* Checks a SUBMIT message whose payload is a PRIVATE copy (8-byte aligned) and points
 * v into it: version, flags, counts within the protocol limits, the layout exactly
 * matching payload_len, stop strings of 1..KVG_PROTO_MAX_STOP_LEN bytes without NUL,
 * no block hashes with bucket 0. What needs the model (vocabulary, context, block
 * size, the hashes themselves) is the engine's to check (daemon_conn.c). 0, or -1 with err; *id gets the request id whenever the body
 * was readable (0 otherwise) so the refusal can name the request. */
int kvg_proto_decode_submit(const kvg_shm_msg *m, kvg_submit_view *v, uint64_t *id,
                            char *err, size_t err_len);

/* A decoded TOKENS message (pointers into the message's payload). */
typedef struct kvg_tokens_view {
    kvg_msg_tokens h;
    const uint32_t *ids;
    const float *logprobs;       /* NULL without KVG_TOKENS_LOGPROBS */
    const char *text;
} kvg_tokens_view;

size_t kvg_proto_tokens_size(uint32_t n_tokens, int logprobs, uint32_t text_len);
/* Writes ids, logprobs (may be NULL) and text into buf; returns the size or 0. */
size_t kvg_proto_encode_tokens(const uint32_t *ids, const float *logprobs, uint32_t n_tokens,
                               const char *text, uint32_t text_len, void *buf, size_t cap);
int kvg_proto_decode_tokens(const kvg_shm_msg *m, kvg_tokens_view *v, char *err, size_t err_len);

/* Fixed-size bodies without payload: type, size and version checked, *out filled. */
int kvg_proto_decode_fixed(const kvg_shm_msg *m, uint32_t type, void *out, size_t size,
                           char *err, size_t err_len);
/* PAUSE or RESUME: the fixed checks, reserved == 0; *paused is 1 for PAUSE. */
int kvg_proto_decode_pause(const kvg_shm_msg *m, kvg_msg_pause *h, int *paused, char *err,
                           size_t err_len);
/* SAMPLES: the fixed checks, reserved == 0 (draw and cancel_mask are any value: a
 * draw beyond what remains is clamped, bits past n are ignored). */
int kvg_proto_decode_samples(const kvg_shm_msg *m, kvg_msg_samples *out, char *err, size_t err_len);
/* WIPE: the fixed checks, request_id != 0, flags and reserved 0, salt_len within
 * KVG_PROTO_MAX_SALT and equal to payload_len; *salt points into the payload. *id gets
 * the request id whenever the body was readable (0 otherwise). */
int kvg_proto_decode_wipe(const kvg_shm_msg *m, kvg_msg_wipe *h, const uint8_t **salt, uint64_t *id,
                          char *err, size_t err_len);
/* WIPED: the fixed checks, reserved 0. */
int kvg_proto_decode_wiped(const kvg_shm_msg *m, kvg_msg_wiped *h, char *err, size_t err_len);
/* ERROR: *h and the message (validated UTF-8 is not required; length bounded). */
int kvg_proto_decode_error(const kvg_shm_msg *m, kvg_msg_error *h, const char **msg,
                           char *err, size_t err_len);

/* ---- the statistics page ----
 * The engine rewrites it after the steps that changed something (seqlock: seq is odd
 * while a write is in progress); clients read consistent snapshots with
 * kvg_stats_read. Counters are totals since the engine started. */

#define KVG_STATS_MAGIC    0x5453474bu   /* "KGST" */
#define KVG_STATS_TENANTS  32            /* tenants listed by cached blocks (the rest summed) */
#define KVG_STATS_BUCKETS  17            /* length buckets: bypass + KVG_BUCKETS_MAX_BOUNDS
                                            (asserted in proto.c); the scheduler's too */

typedef struct kvg_stats_tenant {
    char name[KVG_PROTO_MAX_SALT + 1];   /* the tenant's name, NUL-terminated: a named
                                            tenant's salt as is; a location's default
                                            tenant (salt 0x00 + name) as "NAME (default)" */
    uint8_t reserved[7];
    int32_t cached_blocks;
    int32_t reserved2;
} kvg_stats_tenant;

typedef struct kvg_stats_bucket {
    uint64_t requests, prompt_tokens, cached_tokens, completion_tokens;
} kvg_stats_bucket;

typedef struct kvg_stats {
    uint32_t magic;
    uint32_t version;            /* KVG_PROTO_VERSION */
    uint64_t instance;
    uint64_t start_unix_ms;
    uint64_t updated_unix_ms;
    /* KV pool */
    int32_t blocks_total, blocks_free, blocks_cached, blocks_used, blocks_pinned;
    int32_t block_tokens;
    /* prefix cache */
    uint64_t query_tokens, hit_tokens;
    uint64_t evictions_lru, evictions_ttl, evictions_quota;
    uint64_t recompute_tokens, recompute_hit_tokens;
    /* scheduler */
    uint64_t steps, preemptions, rejected, cancelled;
    uint64_t prefill_tokens, decode_tokens;
    double prefill_seconds, decode_seconds;
    uint64_t ttft_count;
    double ttft_sum_seconds, ttft_max_seconds;
    int32_t waiting, running;    /* requests now */
    int32_t held;                /* requests held in the scheduler: paused by their client, or
                                    backlogged (their output piles up unread) */
    int32_t clients;             /* connected clients */
    /* the daemon */
    uint64_t submitted, completed, errors, client_cancels, deadlines;
    uint64_t clients_total, protocol_errors;
    uint64_t pauses, resumes;    /* PAUSE / RESUME messages that changed a request */
    int32_t paused;              /* requests paused by their client now (of "held") */
    int32_t reserved3;
    /* samples of requests (n_active, SAMPLES) */
    uint64_t samples_started;    /* every sample that began decoding (once, even if preempted) */
    uint64_t samples_cancelled;  /* stopped by a SAMPLES cancel_mask after being drawn */
    uint64_t samples_dropped;    /* ended by a SAMPLES cancel_mask before being drawn */
    /* The work the engine has queued, in tokens of forward pass, for routing (an
     * engine's "load"). The sum over live requests of:
     *   waiting (never admitted, or preempted): its prompt tokens less those whose
     *     blocks the prefix cache held when it arrived (what admission will likely
     *     find; at least the last token counts), plus the tokens its samples had
     *     generated before a preemption (recomputed);
     *   prefilling: the prompt tokens not yet in its KV (cache hits are in), plus,
     *     after a preemption, its samples' generated tokens to recompute;
     *   decoding: per sample drawn and not finished, its tokens still to feed, at
     *     least 1 (one decode row per step); undrawn samples count nothing.
     * Paused (held) requests count as the others. */
    uint64_t load_tokens;
    kvg_stats_bucket bucket[KVG_STATS_BUCKETS];
    /* tenants with the most cached blocks */
    int32_t n_tenants;           /* entries used in tenant[] */
    int32_t other_tenants;       /* tenants not listed */
    int32_t other_cached_blocks; /* their cached blocks */
    int32_t live_tenants;        /* tenants the engine holds state for: with queued or
                                    running requests or cached blocks (bypass: none) */
    kvg_stats_tenant tenant[KVG_STATS_TENANTS];
    /* The KV disk tier (engine --kv-disk; all 0 without one). Its writes happen in the
     * background: the page shows them as of its last rewrite. */
    int64_t disk_slots_total, disk_slots_used;
    uint64_t disk_hit_tokens;    /* of hit_tokens + recompute_hit_tokens, read from disk */
    uint64_t disk_blocks_read, disk_blocks_written;
    uint64_t disk_bytes_read, disk_bytes_written;
    double disk_read_seconds, disk_write_seconds;
    uint64_t disk_evictions;     /* blocks overwritten by newer ones (the size bound) */
    uint64_t disk_dropped;       /* evicted blocks not written: the write queue was full */
    uint64_t disk_corrupt;       /* blocks that failed their checksum or identity: recomputed */
    uint64_t disk_io_errors;     /* failed reads and writes (a full disk included) */
    /* The KV host tier (engine --kv-host-memory, a GPU pool's evicted blocks in pinned
     * host memory; all 0 without one). */
    int64_t host_slots_total, host_slots_used;
    uint64_t host_hit_tokens;    /* of hit_tokens + recompute_hit_tokens, copied back */
    uint64_t host_blocks_in, host_blocks_out;    /* to the device (hits), from it */
    uint64_t host_bytes_in, host_bytes_out;
    double host_seconds;         /* time queueing the copies */
    uint64_t host_evictions;     /* slots given to newer blocks */
    uint64_t host_spilled;       /* of those, moved on to the disk tier */
    /* The KV disk tier's expiry and quota (kv_disk.h; 0 without one). */
    uint64_t disk_quota_evictions;   /* of disk_evictions, a tenant at its quota's share */
    uint64_t disk_expired;       /* blocks dropped past their expiry (not written, found
                                    expired by a read, the writer or a restart) */
    /* The disk tier's reader thread (kv_disk.h: a request's blocks read while the others
     * run). */
    uint64_t disk_reader_blocks;     /* of disk_blocks_read, read by the reader thread (the
                                        others came from the write queue's copies) */
    uint64_t disk_staging_full;      /* reads not started, their staging full: recomputed */
    int64_t disk_reads_in_flight;    /* reads queued or being read now */
} kvg_stats;

/* The engine's heartbeat: how a client tells an engine that makes progress from one
 * that went silent (stopped, hung in a step, starved of CPU) while its socket stays
 * open. The engine's loop adds 1 to it at every iteration, at every layer of a forward
 * step, and, when it has nothing to do, at least every KVG_HEARTBEAT_IDLE_MS (it wakes
 * up for that). A client that sees the value unchanged for longer than the longest
 * layer of a step plus this may take the engine for stalled. */
#define KVG_HEARTBEAT_IDLE_MS  100

/* The page as mapped: the sequence word on its own cache line, then the data, then
 * the heartbeat on a line of its own (outside the seqlock: one relaxed store by the
 * engine, one relaxed load by a client; it only ever needs to be seen to change). */
typedef struct kvg_stats_page {
    _Alignas(64) _Atomic uint64_t seq;
    _Alignas(64) kvg_stats s;
    _Alignas(64) _Atomic uint64_t heartbeat;
} kvg_stats_page;

/* Writer (the engine, one thread). */
void kvg_stats_write(kvg_stats_page *p, const kvg_stats *s);
/* Updates load_tokens alone (the same seqlock, one field): what the engine publishes
 * between full writes, as soon as new requests arrive. */
void kvg_stats_write_load(kvg_stats_page *p, uint64_t load_tokens);
/* Reader: a consistent copy, retrying while a write is in progress. 0, or -1 when
 * the page does not look like a stats page or stays busy (a writer that died
 * mid-write). */
int kvg_stats_read(const kvg_stats_page *p, kvg_stats *out);

/* ---- the cache index ----
 * Which chain hashes (prefix_hash.h) the engine's prefix cache holds right now: every
 * block committed under a hash and not yet evicted (in use or cached). The gateway
 * routes a request to the engine holding the most leading blocks of its chain.
 *
 * An open-addressing hash set of 64-bit keys, two tables of `capacity` slots each:
 *   key   = the first 8 bytes of the 32-byte chain hash, little-endian; 0 becomes 2
 *           and 1 becomes 3 (slot value 0 = empty, 1 = tombstone);
 *   probe = linear, from key & (capacity - 1), until the key or an empty slot.
 * One table is `active`; the writer (the engine's scheduler thread, alone) inserts
 * and tombstones in it with release stores. When tombstones pass capacity / 4 it
 * rebuilds the live keys into the other table, then flips `active` (release) and
 * bumps `generation`. capacity is a power of two >= 2 x the pool's blocks, so a
 * table is never more than 3/4 full and every probe ends.
 *
 * Readers take no lock: acquire-load active, probe that table, at most capacity
 * slots. A lookup racing a write, or a flip followed by the next rebuild, may
 * answer wrong once; that makes one routing choice worse, never an answer wrong
 * (the engine serves whatever its own cache really holds). Otherwise exact, but for
 * 64-bit key collisions (~n^2 / 2^65 over n held blocks). The hashes are tenant-
 * salted, so the page reveals no text and no tenant's chain finds another's. */

#define KVG_CACHE_INDEX_MAGIC   0x444c484bu     /* "KHLD": the value of protocol 3, when it was
                                                   called the held set */
#define KVG_CACHE_INDEX_EMPTY   0u
#define KVG_CACHE_INDEX_TOMB    1u

typedef struct kvg_cache_index_page {
    uint32_t magic;              /* KVG_CACHE_INDEX_MAGIC */
    uint32_t version;            /* KVG_PROTO_VERSION */
    uint32_t capacity;           /* slots per table, a power of two */
    _Atomic uint32_t active;     /* 0 | 1: the table readers probe */
    _Atomic uint64_t generation; /* flips so far */
    _Atomic uint32_t count;      /* distinct keys held (for statistics and tests) */
    _Atomic uint32_t tombstones; /* in the active table */
    /* table t is slot[t * capacity .. (t + 1) * capacity) */
    _Alignas(64) _Atomic uint64_t slot[];
} kvg_cache_index_page;

#endif
