/* The engine client: one connection from a process (an nginx worker, kvgate-cli) to
 * the co-located engine, over the protocol of proto.h.
 *
 * Non-blocking and event driven, so an nginx worker never waits on the engine:
 *
 *   c = kvg_client_new("/run/kvgate/engine.sock", &opts, err, sizeof err);
 *   kvg_client_connect(c, ...);         // starts the handshake
 *   // poll kvg_client_socket_fd(c) and kvg_client_doorbell_fd(c) for reading;
 *   // whenever either is readable (or after a submit), drain the events:
 *   while (kvg_client_next_event(c, &ev) == 1)
 *       switch (ev.kind) { case KVG_CEV_UP: ...; case KVG_CEV_TOKENS: ...; }
 *
 * The client keeps the table of its live requests (id -> the caller's pointer). When
 * the engine dies (EOF on the socket) or breaks the protocol, every live request gets
 * a KVG_CEV_ERROR (status 503) at once, then one KVG_CEV_DOWN; the caller reconnects
 * after kvg_client_retry_delay_ms() (exponential backoff), and the next KVG_CEV_UP
 * carries the new engine's model, which may differ (new id, tokenizer, template).
 *
 * Blocking helpers for simple programs: kvg_client_wait, kvg_client_connect_wait.
 * Not thread-safe: one thread uses one client. */
#ifndef KVG_CLIENT_H
#define KVG_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "chat_template.h"
#include "jinja.h"
#include "prefix_hash.h"
#include "proto.h"
#include "tokenizer.h"

typedef struct kvg_client kvg_client;

typedef struct kvg_client_opts {
    const char *name;            /* told to the engine for its log ("nginx worker") */
    int backoff_min_ms;          /* first reconnect delay; 0: 50 */
    int backoff_max_ms;          /* cap; 0: 2000 */
} kvg_client_opts;

typedef enum kvg_client_state {
    KVG_CLIENT_DOWN = 0,         /* not connected (kvg_client_connect to try) */
    KVG_CLIENT_CONNECTING = 1,   /* handshake in progress */
    KVG_CLIENT_UP = 2
} kvg_client_state;

/* What the engine announced, valid while UP (until the KVG_CEV_DOWN event). */
typedef struct kvg_engine_info {
    uint8_t model_id[KVG_PREFIX_HASH_LEN];
    char model_id_hex[2 * KVG_PREFIX_HASH_LEN + 1];
    char model_name[128];
    char tokenizer_name[160];
    kvg_chat_template_info chat;     /* which template, from where */
    const kvg_jinja *chat_template;  /* it, compiled; NULL when the model has none (chat
                                        is refused); owned by the client */
    uint32_t context_length;
    uint32_t block_tokens;
    uint32_t vocab_size;
    uint32_t max_n;
    int32_t bos, eos;
    int add_bos;
    uint32_t engine_pid;
    uint64_t instance;
    uint64_t max_submit_bytes;   /* largest submit payload the channel carries */
    const kvg_tokenizer *tokenizer;  /* the engine's own tokenizer, owned by the client */
} kvg_engine_info;

typedef struct kvg_client_req {
    const void *salt;            /* the tenant's salt (prefix_hash.h): trusted configuration,
                                    never request JSON */
    size_t salt_len;
    const int32_t *tokens;
    size_t n_tokens;
    /* The chain over the prompt's full blocks, rooted at (model id, salt): from
     * kvg_client_hash_prompt, or the caller's own computation of it (the gateway's,
     * which routes by it). NULL: kvg_client_submit calls kvg_client_hash_prompt
     * (callers that do not route: kvgate-cli, tests). Ignored (none sent) for
     * bypass requests. Sent as given: the engine refuses a count other
     * than n_tokens / block_tokens, or a hash that does not match (ERROR 400). */
    const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN];
    size_t n_hashes;
    int bypass;                  /* too short to be worth caching: sent as bucket 0 */
    unsigned bucket;             /* length bucket index for the engine's statistics
                                    (ignored with bypass; 0 otherwise: 1) */
    float temperature;           /* 0: greedy */
    float top_p;                 /* 1 (or 0): off */
    unsigned top_k;              /* 0: off */
    uint64_t seed;
    unsigned n;                  /* samples (0: 1) */
    unsigned n_active;           /* samples started when the prompt is ready (0: all n); the
                                    others wait for kvg_client_samples. Sent as given: the
                                    engine answers ERROR 400 when it is more than n */
    unsigned max_tokens;         /* per sample (0: up to the context) */
    const int32_t *stop_ids;     /* extra stop ids (EOS is implied) */
    size_t n_stop_ids;
    const char *const *stop;     /* stop strings */
    const size_t *stop_len;
    size_t n_stop;
    uint32_t cache_ttl_ms;       /* 0: the engine's default; KVG_TTL_PINNED */
    unsigned n_holds;            /* cache_control: the first hold_blocks[i] blocks held for
                                    hold_ms[i] (proto.h kvg_msg_submit) */
    uint32_t hold_blocks[KVG_PROTO_MAX_HOLDS];
    uint32_t hold_ms[KVG_PROTO_MAX_HOLDS];
    uint32_t deadline_ms;        /* 0: none */
    int priority;
    int logprobs;                /* report the chosen tokens' logprobs */
} kvg_client_req;

typedef enum kvg_client_event_kind {
    KVG_CEV_UP = 1,              /* handshake done: kvg_client_info() is valid */
    KVG_CEV_DOWN,                /* disconnected (message says why); reconnect later */
    KVG_CEV_WRITABLE,            /* the submission ring has room again after KVG_CLIENT_AGAIN */
    KVG_CEV_ACCEPTED,            /* prompt_tokens, cached_tokens */
    KVG_CEV_TOKENS,              /* sample, tokens, logprobs, text */
    KVG_CEV_FINISHED,            /* sample, finish_reason, completion_tokens (of the sample) */
    KVG_CEV_DONE,                /* prompt/cached/completion tokens; the request is over */
    KVG_CEV_ERROR,               /* status, message; the request is over */
    KVG_CEV_WIPED                /* a wipe's answer: wiped_pool, wiped_host, wiped_disk */
} kvg_client_event_kind;

/* One event. Pointers stay valid until the next kvg_client_next_event call. */
typedef struct kvg_client_event {
    kvg_client_event_kind kind;
    uint64_t id;                 /* the request (0 for UP/DOWN/WRITABLE) */
    void *user;                  /* the caller's pointer given at submit */
    uint32_t sample;
    const uint32_t *tokens;
    const float *logprobs;       /* NULL unless the request asked for them */
    uint32_t n_tokens;
    const char *text;
    size_t text_len;
    uint32_t finish_reason;      /* enum kvg_msg_finish */
    uint32_t prompt_tokens, cached_tokens, completion_tokens;
    uint32_t cache_write_tokens; /* DONE: prompt tokens computed and held for the holds */
    uint64_t wiped_pool, wiped_host, wiped_disk;   /* WIPED: blocks dropped per tier */
    int status;                  /* ERROR: HTTP-like status */
    const char *message;         /* ERROR, DOWN: NUL-terminated */
} kvg_client_event;

#define KVG_CLIENT_AGAIN 1       /* kvg_client_submit: the ring is full; wait for WRITABLE */

kvg_client *kvg_client_new(const char *socket_path, const kvg_client_opts *opts,
                           char *err, size_t err_len);
/* Closes the connection; live requests are dropped without events (the engine
 * cancels them when it sees the socket close). */
void kvg_client_free(kvg_client *c);

kvg_client_state kvg_client_get_state(const kvg_client *c);
/* Starts connecting (DOWN -> CONNECTING). 0 started, -1 failed now (still DOWN, err
 * says why: no engine at the path, permission denied...). Either way the backoff
 * advances; call again after kvg_client_retry_delay_ms(). */
int kvg_client_connect(kvg_client *c, char *err, size_t err_len);
/* Milliseconds to wait before the next kvg_client_connect (0 right after success). */
int kvg_client_retry_delay_ms(const kvg_client *c);
/* Descriptors to watch for readability; -1 when there is none in this state. */
int kvg_client_socket_fd(const kvg_client *c);
int kvg_client_doorbell_fd(const kvg_client *c);

/* Tell the client that its socket was reported readable (edge-triggered callers must:
 * it is how the engine's death is noticed without a system call on every drain). The
 * next kvg_client_next_event looks at the socket. kvg_client_wait does it by itself,
 * and the client also looks at least every 100 ms while events flow. */
void kvg_client_socket_readable(kvg_client *c);

/* The next event: 1 with *ev filled, 0 when nothing is pending right now. */
int kvg_client_next_event(kvg_client *c, kvg_client_event *ev);

/* NULL unless UP. */
const kvg_engine_info *kvg_client_info(const kvg_client *c);

/* The chain hashes of tokens' full blocks for a tenant's salt under the connected
 * engine's model (what kvg_client_submit sends). out holds cap hashes; *n gets
 * n_tokens / block_tokens. 0, or -1 with err (not connected, cap too small). */
int kvg_client_hash_prompt(kvg_client *c, const void *salt, size_t salt_len,
                           const int32_t *tokens, size_t n_tokens,
                           uint8_t (*out)[KVG_PREFIX_HASH_LEN], size_t cap, size_t *n,
                           char *err, size_t err_len);


/* Submits a request; *id gets its id. 0; KVG_CLIENT_AGAIN when the submission ring is
 * full right now (nothing was sent; retry after KVG_CEV_WRITABLE); -1 with err when
 * not connected or the request is invalid (empty, a prompt longer than the context,
 * n above the engine's max_n, more stops than the protocol carries, too large for
 * the channel, ...). Token ids are not checked here: the gateway checks the ids a
 * user gave, a tokenizer gives only ids of the engine's vocabulary, and the engine
 * refuses an id outside it with ERROR 400 (docs/architecture.md, "Which layer
 * validates what"). */
int kvg_client_submit(kvg_client *c, const kvg_client_req *r, void *user, uint64_t *id,
                      char *err, size_t err_len);
/* Asks the engine to wipe one tenant's blocks from every tier (WIPE, proto.h): salt is
 * exactly what kvg_client_req.salt is for that tenant. It is live under *id like a
 * request (the same id space): exactly one KVG_CEV_WIPED (the counts) or KVG_CEV_ERROR
 * (a refusal, or 503 when the engine goes away or is failed by kvg_client_fail_live)
 * comes for it; kvg_client_cancel forgets it (the wipe itself cannot be taken back).
 * 0; KVG_CLIENT_AGAIN when the submission ring is full right now (nothing sent; retry
 * after KVG_CEV_WRITABLE); -1 with err when not connected or the salt is too long. */
int kvg_client_wipe(kvg_client *c, const void *salt, size_t salt_len, void *user, uint64_t *id,
                    char *err, size_t err_len);
/* Cancels a live request: the engine stops it, and no more events come for it. -1
 * when the id is not live. A full ring delays the cancel message, never loses it. */
int kvg_client_cancel(kvg_client *c, uint64_t id);
/* Pauses (pause != 0) or resumes a live request in the engine (PAUSE, RESUME): a paused request
 * makes no progress and keeps its blocks (backpressure: the caller cannot pass its
 * output on). Events the engine produced before the pause still come. Idempotent on
 * the engine's side; messages go out in order with cancels, a full ring delays them.
 * 0; -1 when the id is not live, or the connection had to be dropped (out of memory:
 * the request then fails with it). */
int kvg_client_pause(kvg_client *c, uint64_t id, int pause);
/* Per-sample control of a live request (SAMPLES, proto.h): cancels the samples of
 * cancel_mask (bit j = sample j: a running one stops with FINISHED cancelled and its
 * tokens so far, one not started yet is dropped: FINISHED cancelled, 0 tokens), then
 * starts the next `draw` samples not started yet off the request's prompt. The
 * request ends with DONE once every sample finished or was dropped. 0; -1 when the id
 * is not live, or the connection had to be dropped (out of memory). Like cancel and
 * pause, a full ring delays the message (queued, sent in order), never loses it, so
 * this never returns KVG_CLIENT_AGAIN today; callers treat KVG_CLIENT_AGAIN as "retry
 * after KVG_CEV_WRITABLE" should a later version return it. */
int kvg_client_samples(kvg_client *c, uint64_t id, unsigned draw, uint32_t cancel_mask);
/* Fails every live request now as if the engine had died, but keeps the connection:
 * each gets a KVG_CEV_ERROR (status, why) from kvg_client_next_event before any other
 * event, and a CANCEL goes to the engine for each (a full ring delays it), so that an
 * engine that was only silent computes nothing more for them when it goes on; what it
 * still sends for them is dropped, as for any cancelled request. kvg_client_cancel of
 * such a request before its ERROR came takes the ERROR back. For an engine that
 * stopped making progress (liveness.h): its requests can go to another. Returns how
 * many requests were failed. (Requests failed by an earlier call and not yet handed
 * out get this call's status and message.) */
size_t kvg_client_fail_live(kvg_client *c, int status, const char *why);

/* The engine's heartbeat (proto.h): a counter its loop advances at every iteration,
 * every layer of a step, and at least every KVG_HEARTBEAT_IDLE_MS while idle. One
 * relaxed load from the statistics page, no system call; 0 when not connected. A
 * value that stays the same for long means a silent engine (liveness.h). */
uint64_t kvg_client_heartbeat(const kvg_client *c);

/* A snapshot of the engine's statistics page. 0, or -1 when not connected. */
int kvg_client_stats(const kvg_client *c, kvg_stats *out);

/* Routing (several engines behind one gateway). How many LEADING hashes of a chain
 * (from kvg_client_hash_prompt, under this engine's model and the request's salt)
 * the engine's prefix cache holds now: stops at the first one it does not. Reads the
 * engine's cache index (proto.h, kvg_cache_index_page) without a lock or a system call; a
 * lookup racing the engine's update may be off once (a worse routing choice, never
 * a wrong answer). 0 when not connected. */
size_t kvg_client_cached_prefix(const kvg_client *c, const uint8_t (*hashes)[KVG_PREFIX_HASH_LEN], size_t n);
/* The engine's load: load_tokens of its statistics page (proto.h defines it), 0 when
 * not connected. Cheap: one field under the page's seqlock. */
uint64_t kvg_client_load(const kvg_client *c);

/* Drops the connection as if the engine had died (live requests get ERROR 503 with
 * `why`, then DOWN). For protocol violations found by the caller and for tests. */
void kvg_client_disconnect(kvg_client *c, const char *why);

/* How much of a prompt the cache served, as the gateway reports it: "bypass" (not
 * looked up), "miss" (nothing), "hit" (every block that can be served: all full
 * blocks before the one holding the last prompt token, whose logits are always
 * computed) or "partial" (some). */
const char *kvg_cache_status(int bypass, uint32_t prompt_tokens, uint32_t cached_tokens,
                             uint32_t block_tokens);

/* ---- blocking helpers ---- */

/* Waits up to timeout_ms (-1: forever) until an event may be pending (a descriptor is
 * readable, or the reconnect delay passed while DOWN). 1 ready, 0 timeout. */
int kvg_client_wait(kvg_client *c, int timeout_ms);
/* Connects and completes the handshake, waiting up to timeout_ms. 0 UP, -1 with err. */
int kvg_client_connect_wait(kvg_client *c, int timeout_ms, char *err, size_t err_len);

#endif
