/* Shared-memory channel between the nginx workers (clients) and the engine.
 *
 * One region holds two single-producer single-consumer directions:
 *   sq  client -> engine  (submit, cancel)
 *   cq  engine -> client  (accepted, tokens, finished, error)
 * Each direction is a ring of fixed-size message slots plus a byte ring (the
 * "data area") for the variable-length payload of each message. No locks:
 * each shared index has exactly one writer, published with release stores and
 * read with acquire loads. Waiting is the caller's job (eventfd doorbells).
 *
 * Layout (all offsets from the region start, every part 64-byte aligned):
 *   kvg_shm_header | sq ctl | cq ctl | sq slots | cq slots | sq data | cq data
 * The region holds no pointers and only fixed-width types, so both processes
 * can map it anywhere. A region received from the other process is untrusted:
 * attach validates the whole layout, and every index or length read from it
 * later is validated again before use; a bad value yields -1, never an
 * out-of-bounds access. A ring that saw corruption stays failed.
 *
 * Payload contents live in shared memory the peer can still write to. Bounds
 * are checked on a private copy of the slot, so payload pointers are always in
 * range, but the bytes themselves may change under a hostile peer: parse them
 * from a private copy (kvg_shm_try_pop makes one). */
#ifndef KVG_SHM_CHANNEL_H
#define KVG_SHM_CHANNEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>

#define KVG_SHM_MAGIC        0x53475652u   /* "RVGS" little-endian: kvgate shm */
#define KVG_SHM_VERSION      1u
#define KVG_SHM_ALIGN        64u           /* cache line; every part starts on one */
#define KVG_SHM_SLOT_SIZE    256u
#define KVG_SHM_SLOT_HDR     24u
#define KVG_SHM_BODY_MAX     (KVG_SHM_SLOT_SIZE - KVG_SHM_SLOT_HDR)   /* 232 */
#define KVG_SHM_SLOTS_MAX    (1u << 20)
#define KVG_SHM_DATA_MIN     64u
#define KVG_SHM_DATA_MAX     ((uint64_t)1 << 31)
#define KVG_SHM_PAYLOAD_ALIGN 8u

/* Return values of try_push / peek / try_pop besides 0 and -1. */
#define KVG_SHM_FULL   1
#define KVG_SHM_EMPTY  1

/* ---- Shared layout (what lies in the region) ---- */

/* Where one direction's parts are. Counts are powers of two so that the
 * free-running 64-bit sequence numbers map to positions with a mask. */
typedef struct kvg_shm_ring_desc {
    uint64_t ctl_off;        /* kvg_shm_ctl */
    uint64_t slots_off;      /* slot_count * KVG_SHM_SLOT_SIZE bytes */
    uint64_t data_off;       /* data_cap bytes */
    uint64_t data_cap;       /* power of two, KVG_SHM_DATA_MIN..KVG_SHM_DATA_MAX */
    uint32_t slot_count;     /* power of two, 1..KVG_SHM_SLOTS_MAX */
    uint32_t reserved;
} kvg_shm_ring_desc;

typedef struct kvg_shm_header {
    uint32_t magic;
    uint32_t version;
    uint64_t total_size;     /* bytes of the whole region */
    uint32_t header_size;    /* sizeof(kvg_shm_header) */
    uint32_t slot_size;      /* KVG_SHM_SLOT_SIZE */
    uint32_t reserved[2];
    kvg_shm_ring_desc sq;
    kvg_shm_ring_desc cq;
} kvg_shm_header;

/* The indices of one direction: free-running 64-bit counters (they never wrap
 * in practice, and the arithmetic is done on differences so even a wrap would
 * be harmless). Producer-written and consumer-written counters sit on separate
 * cache lines so that the two processes don't bounce one line on every
 * message. */
typedef struct kvg_shm_ctl {
    _Alignas(64) _Atomic uint64_t tail;      /* slots published (producer) */
    _Atomic uint64_t data_tail;              /* bytes reserved (producer; informative) */
    _Alignas(64) _Atomic uint64_t head;      /* slots released (consumer) */
    _Atomic uint64_t data_head;              /* bytes released (consumer) */
    /* Set by a producer that found the ring full and waits for room; the consumer
     * clears it when it releases space and then rings the producer's doorbell
     * (kvg_shm_producer_wait / kvg_shm_consumer_take_waiter). A peer can only cause
     * a spurious or a missed wake-up with it, never a wrong index. */
    _Alignas(64) _Atomic uint32_t producer_waiting;
} kvg_shm_ctl;

/* ---- Process-private handles ---- */

/* A view of one direction. The side's own counters are kept here and only
 * written to the region, never read back from it: the peer could overwrite
 * them, and we must not trust our own index once it sits in shared memory.
 * A single handle can serve a producer thread and a consumer thread at once
 * (they touch disjoint fields). */
typedef struct kvg_shm_ring {
    kvg_shm_ctl *ctl;
    unsigned char *slots;
    unsigned char *data;
    uint64_t data_cap;
    uint32_t slot_mask;
    _Alignas(64) uint64_t p_tail;        /* producer side */
    uint64_t p_data_tail;
    int p_failed;
    _Alignas(64) uint64_t c_head;        /* consumer side */
    uint64_t c_data_head;
    uint64_t c_peek_data_end;            /* data_head after the peeked message */
    int c_peeked;
    int c_failed;
} kvg_shm_ring;

typedef struct kvg_shm {
    kvg_shm_ring sq;         /* client produces, engine consumes */
    kvg_shm_ring cq;         /* engine produces, client consumes */
    uint64_t size;
} kvg_shm;

typedef struct kvg_shm_caps {
    uint32_t sq_slots, cq_slots;         /* powers of two */
    uint64_t sq_data, cq_data;           /* data area bytes, powers of two */
} kvg_shm_caps;

/* A message as seen by the consumer. body is a private copy; payload points
 * into the caller's buffer after kvg_shm_try_pop (into the shared data area after
 * shm_channel_testing.h's kvg_shm_peek, valid until kvg_shm_consume). */
typedef struct kvg_shm_msg {
    uint32_t type;
    uint32_t body_len;
    uint32_t payload_len;
    _Alignas(8) unsigned char body[KVG_SHM_BODY_MAX];
    const unsigned char *payload;
} kvg_shm_msg;

/* Bytes needed for a region with these capacities; 0 if a capacity is invalid. */
size_t kvg_shm_region_size(const kvg_shm_caps *caps);

/* Lays out a fresh region in caller memory (64-byte aligned, at least
 * kvg_shm_region_size bytes; e.g. an mmap'ed memfd) with empty rings. */
int kvg_shm_init(void *mem, size_t size, const kvg_shm_caps *caps,
                 char *err, size_t err_len);

/* Validates a region of `size` mapped bytes and fills *h. Both sides attach
 * (the creator too). The own counters are taken from the region once, here. */
int kvg_shm_attach(kvg_shm *h, void *mem, size_t size, char *err, size_t err_len);

/* Largest payload a ring accepts: half its data area. A payload is stored
 * contiguously, and when it doesn't fit before the end of the area the space
 * up to the end is skipped; bounding payloads by half the area guarantees a
 * payload always fits once the consumer has drained, wherever the ring stands
 * (a larger one could wait forever). */
uint64_t kvg_shm_max_payload(const kvg_shm_ring *r);

/* Producer: 0 pushed, KVG_SHM_FULL when the slot ring or the data area has no
 * room now (wait for the doorbell, retry), -1 on error (body or payload too
 * large, corrupt indices). */
int kvg_shm_try_push(kvg_shm_ring *r, uint32_t type, const void *body, size_t body_len,
                     const void *payload, size_t payload_len, char *err, size_t err_len);

/* Producer: 1 when a message with payload_len bytes would fit now, else 0 (also
 * when the ring failed). Nothing is written. */
int kvg_shm_can_push(kvg_shm_ring *r, size_t payload_len);

/* Producer: messages pushed so far, and how many of them the consumer has
 * released (read). The i-th message pushed (counting from 1) has been read once
 * kvg_shm_released() >= i: a producer can tell which of its own messages are
 * still unread. released comes from the peer; a value that cannot be right (more
 * than pushed, or fewer than a full ring behind) reads as "all read". */
uint64_t kvg_shm_pushed(const kvg_shm_ring *r);
uint64_t kvg_shm_released(const kvg_shm_ring *r);

/* Consumer: 1 when a message is waiting (one atomic load; for busy-polling). */
int kvg_shm_can_pop(const kvg_shm_ring *r);

/* Consumer: the oldest message into *m with its payload copied into buf (buf_cap
 * bytes), then released. 0, KVG_SHM_EMPTY, or -1 on a corrupt ring; a payload larger
 * than buf_cap is an error and leaves the message in place. */
int kvg_shm_try_pop(kvg_shm_ring *r, kvg_shm_msg *m, void *buf, size_t buf_cap,
                    char *err, size_t err_len);

/* Waiting for room without losing a wake-up. A producer that got KVG_SHM_FULL
 * calls kvg_shm_producer_wait, then tries the push once more (the consumer may
 * have drained in between) before it sleeps on its doorbell. A consumer that
 * released messages calls kvg_shm_consumer_take_waiter: 1 means a producer was
 * waiting (the flag is now clear) and its doorbell must be rung. Both use
 * sequentially consistent ordering between the flag and the indices, so at
 * least one side sees the other. */
void kvg_shm_producer_wait(kvg_shm_ring *r);
int kvg_shm_consumer_take_waiter(kvg_shm_ring *r);

/* The messages carried in the slots (submit, tokens, ...) are defined by the
 * engine protocol, src/proto.h; this layer only moves typed bytes. */

#endif
