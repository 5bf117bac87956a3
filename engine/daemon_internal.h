/* The engine daemon's private structures, and the layers of its units. Each unit
 * calls only the units below it (and the scheduler, cache and shm channel, which know
 * nothing of the daemon):
 *
 *   daemon.c         the loop, the socket, stop, the statistics page       (top)
 *   daemon_conn.c    clients: handshake, region, intake, teardown
 *   daemon_output.c  scheduler events -> per-request buffers -> completion rings
 *   daemon_req.c     request records, error answers, marking a connection failed
 *   log.c            kvg_log                                               (bottom)
 *
 * daemon_conn.c and daemon_output.c sit side by side: neither calls the other; what
 * both need (a record, an ERROR answer, a connection to close) is in daemon_req.c.
 * The one call that goes up is the scheduler's event callback (kvgd_sched_event),
 * which daemon.c registers: kvg_sched_cancel and kvg_sched_step report through it,
 * as nginx's upstream reports through the handlers a module registers. */
#ifndef KVG_DAEMON_INTERNAL_H
#define KVG_DAEMON_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "daemon.h"
#include "monoclock.h"
#include "proto.h"
#include "shm_channel.h"
#include "u64map.h"

/* What epoll reports: which object and which of its descriptors. */
enum { TAG_LISTEN = 1, TAG_STOP, TAG_SOCK, TAG_BELL, TAG_DISK };
typedef struct dtag {
    int kind;
    struct dconn *conn;
} dtag;

/* Output of one sample not yet delivered: tokens, their logprobs, and the text. The
 * text of token i ends at text_end[i]; text after the last token's end is held-back
 * text released when the sample finished. */
typedef struct dsample {
    uint32_t *ids;
    float *lps;
    uint32_t *text_end;
    uint32_t n, cap;             /* tokens buffered */
    char *text;
    uint32_t text_len, text_cap;
    uint32_t completion;         /* tokens produced so far (delivered or not) */
    uint32_t unread;             /* tokens pushed in TOKENS messages the client has not read */
    int finished;                /* the FINISHED is known */
    int finished_sent;
    uint32_t reason;             /* kvg_msg_finish */
} dsample;

typedef struct dreq {
    struct dconn *conn;          /* NULL once the client is gone */
    struct dreq *prev, *next;    /* the client's requests, in arrival order */
    uint64_t client_id, sched_id;
    int n;
    int logprobs;
    int64_t deadline_ms;         /* monotonic; 0: none */
    int in_sched;                /* the scheduler still knows it */
    int silent;                  /* cancelled by the client: deliver nothing */
    int expired;                 /* cancelled by its deadline */
    /* Held in the scheduler (kvg_sched_hold: out of batches, blocks kept) while either
     * of two reasons stands: */
    int backlogged;              /* the engine's: its output piles up unread (hold_tokens) */
    int paused;                  /* the client's (PAUSE): its HTTP client is not reading */
    int accepted, accepted_sent;
    uint32_t prompt_tokens, cached_tokens;
    int done;                    /* the scheduler reported the request complete */
    uint32_t completion_tokens;
    uint32_t cache_write_tokens; /* prompt tokens computed and held for its holds */
    int wipe;                    /* not a request: a WIPE's answer (WIPED with wiped[]) */
    uint64_t wiped[3];           /* blocks dropped: pool, host, disk */
    int error;                   /* ends with ERROR instead of DONE */
    uint32_t err_status;
    char err_msg[256];
    dsample smp[KVG_PROTO_MAX_N];
} dreq;

/* A TOKENS message in the completion ring: it is read once the ring's released count
 * reaches seq. */
typedef struct dunread {
    uint64_t seq;                /* kvg_shm_pushed() right after it was pushed */
    uint64_t client_id;
    uint32_t sample, tokens;
} dunread;

typedef struct dconn {
    struct kvg_daemon *d;
    struct dconn *next;          /* all connections */
    dtag sock_tag, bell_tag;
    uint64_t serial;             /* for logs */
    int sock;
    int bell_in;                 /* the client rings it */
    int bell_out;                /* we ring it */
    int up;                      /* handshake done */
    int closing;                 /* tear down at the end of this loop iteration */
    char why[160];               /* reason for closing, for the log */
    char name[48];
    uint32_t pid;
    void *region;
    size_t region_size;
    kvg_shm shm;
    unsigned char *buf;          /* private copy of each submission payload */
    size_t buf_cap;
    unsigned char *out;          /* encoding scratch for TOKENS payloads */
    size_t out_cap;
    kvg_u64map by_id;            /* client request id -> dreq */
    dreq *head, *tail;
    int n_reqs;
    int dirty;                   /* output waits to be pushed */
    int pushed;                  /* messages pushed since the last doorbell */
    int blocked;                 /* the completion ring was full: wait for the client */
    /* The TOKENS messages the client has not read yet, oldest first: a FIFO of
     * unread_cap (the ring's slot count, a power of two) entries. */
    dunread *unread;
    uint32_t unread_cap, unread_first, unread_n;
} dconn;

struct kvg_daemon {
    kvg_daemon_config cfg;
    const kvg_model *m;
    kvg_forward *fw;
    kvg_prefix_cache *pc;
    kvg_kv_pool *pool;
    kvg_sched *sched;
    kvg_prefix_hasher *hasher;
    kvg_chat_template_info chat;
    char served_name[128];
    int32_t stop_ids[KVG_SCHED_MAX_STOP_IDS];   /* always stop on these (EOS, ...) */
    int n_stop_ids;

    int ep;                      /* epoll */
    int listen_fd;
    int stop_fd;                 /* eventfd written by kvg_daemon_request_stop */
    dtag listen_tag, stop_tag, disk_tag;
    int listening;
    uint64_t sock_ino, sock_dev;     /* the socket file we bound (removed on stop) */
    volatile int stop_requests;  /* written by the signal handler */
    int stopping;
    int64_t stop_deadline_ms;

    int tok_fd;                  /* the tokenizer's bytes, passed to every client */
    int chat_fd;                 /* the chat template's source (empty: none), the same */
    uint64_t chat_bytes;
    int stats_fd;
    kvg_stats_page *stats;
    size_t stats_size;
    kvg_stats counters;          /* the daemon's own counters (the page's last part) */
    int index_fd;                /* the cache index (proto.h kvg_cache_index_page), passed to
                                    every client */
    void *index;
    size_t index_size;
    kvg_cache_index_writer *index_w;   /* the prefix cache keeps it current (kvg_pc_set_index) */
    int64_t stats_written_ms;
    uint64_t beats;              /* the page's heartbeat, as last stored (the only writer) */
    uint64_t instance;
    uint64_t start_unix_ms;

    uint64_t sq_data, cq_data;
    uint32_t sq_slots, cq_slots;
    size_t max_submit;           /* payload bytes of the largest valid submission */

    dconn *conns;
    int n_conns;
    uint64_t conn_serial;
    uint64_t next_sched_id;
    int waiting;                 /* records not yet admitted (for max_waiting) */
    int in_warmup;
    int64_t last_sweep_ms;       /* TTL sweep of the prefix cache, once a second */
    uint8_t (*hash_scratch)[KVG_PREFIX_HASH_LEN];
    size_t hash_scratch_cap;
};

#endif
