/* SPSC rings in a shared region: layout, validation, push/pop. See shm_channel.h. */
#include "shm_channel.h"
#include "shm_channel_testing.h"

#include <string.h>

#include "errmsg.h"

/* The counters are shared between processes: they must be real lock-free
 * atomics, not ones emulated with a process-local lock. */
_Static_assert(ATOMIC_LONG_LOCK_FREE == 2 || ATOMIC_LLONG_LOCK_FREE == 2,
               "64-bit atomics must be lock-free");
_Static_assert(sizeof(kvg_shm_header) % 8 == 0 && sizeof(kvg_shm_header) <= 4096, "header");
_Static_assert(sizeof(kvg_shm_ctl) == 192, "ctl is three cache lines");

/* Slot header as stored in the region (KVG_SHM_SLOT_HDR bytes). */
typedef struct slot_hdr {
    uint32_t type;
    uint32_t body_len;
    uint32_t payload_len;
    uint32_t reserved;
    uint64_t data_pos;       /* data sequence number of the payload's first byte */
} slot_hdr;
_Static_assert(sizeof(slot_hdr) == KVG_SHM_SLOT_HDR, "slot header size");

static int is_pow2_u64(uint64_t v)
{
    return v && !(v & (v - 1));
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) & ~(a - 1);
}

static int caps_ok(uint32_t slots, uint64_t data)
{
    return is_pow2_u64(slots) && slots <= KVG_SHM_SLOTS_MAX &&
           is_pow2_u64(data) && data >= KVG_SHM_DATA_MIN && data <= KVG_SHM_DATA_MAX;
}

/* Fills the two descriptors and returns the total size (capacities checked). */
static uint64_t plan(const kvg_shm_caps *c, kvg_shm_ring_desc *sq, kvg_shm_ring_desc *cq)
{
    uint64_t off = align_up(sizeof(kvg_shm_header), KVG_SHM_ALIGN);

    memset(sq, 0, sizeof *sq);
    memset(cq, 0, sizeof *cq);
    sq->slot_count = c->sq_slots;
    cq->slot_count = c->cq_slots;
    sq->data_cap = c->sq_data;
    cq->data_cap = c->cq_data;
    sq->ctl_off = off;
    off += sizeof(kvg_shm_ctl);
    cq->ctl_off = off;
    off += sizeof(kvg_shm_ctl);
    sq->slots_off = off;
    off = align_up(off + (uint64_t)c->sq_slots * KVG_SHM_SLOT_SIZE, KVG_SHM_ALIGN);
    cq->slots_off = off;
    off = align_up(off + (uint64_t)c->cq_slots * KVG_SHM_SLOT_SIZE, KVG_SHM_ALIGN);
    sq->data_off = off;
    off += c->sq_data;
    cq->data_off = off;
    off += c->cq_data;
    return off;
}

size_t kvg_shm_region_size(const kvg_shm_caps *caps)
{
    kvg_shm_ring_desc sq, cq;
    uint64_t n;

    if (!caps || !caps_ok(caps->sq_slots, caps->sq_data) || !caps_ok(caps->cq_slots, caps->cq_data))
        return 0;
    n = plan(caps, &sq, &cq);
    return n > SIZE_MAX ? 0 : (size_t)n;
}

int kvg_shm_init(void *mem, size_t size, const kvg_shm_caps *caps, char *err, size_t err_len)
{
    kvg_shm_header *h = mem;
    size_t need = kvg_shm_region_size(caps);
    kvg_shm_ctl *ctl[2];

    if (!need)
        return kvg_fail(err, err_len, "shm", "invalid capacities (slots: powers of two up to %u; "
                        "data: powers of two %u..%llu bytes)", KVG_SHM_SLOTS_MAX, KVG_SHM_DATA_MIN,
                        (unsigned long long)KVG_SHM_DATA_MAX);
    if (!mem || ((uintptr_t)mem % KVG_SHM_ALIGN))
        return kvg_fail(err, err_len, "shm", "region memory must be %u-byte aligned", KVG_SHM_ALIGN);
    if (size < need)
        return kvg_fail(err, err_len, "shm", "region of %zu bytes is smaller than the %zu needed",
                        size, need);
    memset(mem, 0, need);
    h->version = KVG_SHM_VERSION;
    h->total_size = need;
    h->header_size = sizeof *h;
    h->slot_size = KVG_SHM_SLOT_SIZE;
    plan(caps, &h->sq, &h->cq);
    ctl[0] = (kvg_shm_ctl *)((unsigned char *)mem + h->sq.ctl_off);
    ctl[1] = (kvg_shm_ctl *)((unsigned char *)mem + h->cq.ctl_off);
    for (int i = 0; i < 2; i++) {
        atomic_init(&ctl[i]->tail, 0);
        atomic_init(&ctl[i]->data_tail, 0);
        atomic_init(&ctl[i]->head, 0);
        atomic_init(&ctl[i]->data_head, 0);
        atomic_init(&ctl[i]->producer_waiting, 0);
    }
    /* The magic goes last with release order, so that a peer that sees it
     * (acquire in attach) also sees a complete layout. */
    atomic_store_explicit((_Atomic uint32_t *)&h->magic, KVG_SHM_MAGIC, memory_order_release);
    return 0;
}

/* ---- attach: validate everything the peer could have written ---- */

typedef struct span { uint64_t off, len; const char *what; } span;

static int span_in(const span *s, uint64_t total)
{
    return s->off <= total && s->len <= total - s->off;
}

static int spans_overlap(const span *a, const span *b)
{
    return a->off < b->off + b->len && b->off < a->off + a->len;
}

static int check_desc(const kvg_shm_ring_desc *d, const char *name, char *err, size_t err_len)
{
    if (!caps_ok(d->slot_count, d->data_cap))
        return kvg_fail(err, err_len, "shm", "%s: bad capacities (%u slots, %llu data bytes)", name,
                        d->slot_count, (unsigned long long)d->data_cap);
    if (d->ctl_off % KVG_SHM_ALIGN || d->slots_off % KVG_SHM_ALIGN || d->data_off % KVG_SHM_ALIGN)
        return kvg_fail(err, err_len, "shm", "%s: misaligned part offset", name);
    return 0;
}

/* The ring's counters as they stand now; the difference between the two
 * sides must be within capacity, whoever wrote them. */
static int check_counts(const kvg_shm_ctl *c, const kvg_shm_ring_desc *d, const char *name,
                        char *err, size_t err_len)
{
    uint64_t tail = atomic_load_explicit(&c->tail, memory_order_acquire);
    uint64_t head = atomic_load_explicit(&c->head, memory_order_acquire);
    uint64_t dtail = atomic_load_explicit(&c->data_tail, memory_order_acquire);
    uint64_t dhead = atomic_load_explicit(&c->data_head, memory_order_acquire);

    if (tail - head > d->slot_count)
        return kvg_fail(err, err_len, "shm", "%s: corrupt slot indices (head %llu, tail %llu)", name,
                        (unsigned long long)head, (unsigned long long)tail);
    if (dtail - dhead > d->data_cap || dtail % KVG_SHM_PAYLOAD_ALIGN || dhead % KVG_SHM_PAYLOAD_ALIGN)
        return kvg_fail(err, err_len, "shm", "%s: corrupt data indices (head %llu, tail %llu)", name,
                        (unsigned long long)dhead, (unsigned long long)dtail);
    return 0;
}

static void ring_view(kvg_shm_ring *r, unsigned char *base, const kvg_shm_ring_desc *d)
{
    memset(r, 0, sizeof *r);
    r->ctl = (kvg_shm_ctl *)(base + d->ctl_off);
    r->slots = base + d->slots_off;
    r->data = base + d->data_off;
    r->data_cap = d->data_cap;
    r->slot_mask = d->slot_count - 1;
    r->p_tail = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
    r->p_data_tail = atomic_load_explicit(&r->ctl->data_tail, memory_order_acquire);
    r->c_head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
    r->c_data_head = atomic_load_explicit(&r->ctl->data_head, memory_order_acquire);
}

int kvg_shm_attach(kvg_shm *out, void *mem, size_t size, char *err, size_t err_len)
{
    kvg_shm_header h;
    span s[7];

    if (!out || !mem)
        return kvg_fail(err, err_len, "shm", "no region");
    if ((uintptr_t)mem % KVG_SHM_ALIGN)
        return kvg_fail(err, err_len, "shm", "region memory must be %u-byte aligned", KVG_SHM_ALIGN);
    if (size < sizeof h)
        return kvg_fail(err, err_len, "shm", "region of %zu bytes is too small for a header", size);
    if (atomic_load_explicit((_Atomic uint32_t *)mem, memory_order_acquire) != KVG_SHM_MAGIC)
        return kvg_fail(err, err_len, "shm", "bad magic (not a kvgate region, or not initialised)");
    /* Work on a private copy: the peer may rewrite the header while we check. */
    memcpy(&h, mem, sizeof h);
    if (h.version != KVG_SHM_VERSION)
        return kvg_fail(err, err_len, "shm", "region version %u, expected %u", h.version,
                        KVG_SHM_VERSION);
    if (h.header_size != sizeof h || h.slot_size != KVG_SHM_SLOT_SIZE)
        return kvg_fail(err, err_len, "shm", "header size %u / slot size %u, expected %zu / %u",
                        h.header_size, h.slot_size, sizeof h, KVG_SHM_SLOT_SIZE);
    if (h.total_size > size)
        return kvg_fail(err, err_len, "shm", "region claims %llu bytes, %zu mapped",
                        (unsigned long long)h.total_size, size);
    if (check_desc(&h.sq, "sq", err, err_len) || check_desc(&h.cq, "cq", err, err_len))
        return -1;
    s[0] = (span){ 0, sizeof h, "header" };
    s[1] = (span){ h.sq.ctl_off, sizeof(kvg_shm_ctl), "sq ctl" };
    s[2] = (span){ h.cq.ctl_off, sizeof(kvg_shm_ctl), "cq ctl" };
    s[3] = (span){ h.sq.slots_off, (uint64_t)h.sq.slot_count * KVG_SHM_SLOT_SIZE, "sq slots" };
    s[4] = (span){ h.cq.slots_off, (uint64_t)h.cq.slot_count * KVG_SHM_SLOT_SIZE, "cq slots" };
    s[5] = (span){ h.sq.data_off, h.sq.data_cap, "sq data" };
    s[6] = (span){ h.cq.data_off, h.cq.data_cap, "cq data" };
    for (int i = 0; i < 7; i++) {
        if (!span_in(&s[i], h.total_size))
            return kvg_fail(err, err_len, "shm", "%s lies outside the region", s[i].what);
        for (int j = 0; j < i; j++)
            if (spans_overlap(&s[i], &s[j]))
                return kvg_fail(err, err_len, "shm", "%s overlaps %s", s[i].what, s[j].what);
    }
    {
        unsigned char *base = mem;
        if (check_counts((kvg_shm_ctl *)(base + h.sq.ctl_off), &h.sq, "sq", err, err_len) ||
            check_counts((kvg_shm_ctl *)(base + h.cq.ctl_off), &h.cq, "cq", err, err_len))
            return -1;
        ring_view(&out->sq, base, &h.sq);
        ring_view(&out->cq, base, &h.cq);
    }
    out->size = h.total_size;
    return 0;
}

uint64_t kvg_shm_max_payload(const kvg_shm_ring *r)
{
    return r->data_cap / 2;
}

/* ---- producer ---- */

int kvg_shm_try_push(kvg_shm_ring *r, uint32_t type, const void *body, size_t body_len,
                     const void *payload, size_t payload_len, char *err, size_t err_len)
{
    uint64_t head, dhead, need, start, pos;
    slot_hdr sh;
    unsigned char *slot;

    if (r->p_failed)
        return kvg_fail(err, err_len, "shm", "ring failed earlier (corrupt indices)");
    if (body_len > KVG_SHM_BODY_MAX || (body_len && !body))
        return kvg_fail(err, err_len, "shm", "message body of %zu bytes exceeds %u", body_len,
                        KVG_SHM_BODY_MAX);
    if (payload_len > kvg_shm_max_payload(r) || (payload_len && !payload))
        return kvg_fail(err, err_len, "shm", "payload of %zu bytes exceeds the ring's limit of %llu",
                        payload_len, (unsigned long long)kvg_shm_max_payload(r));

    /* Acquire pairs with the consumer's release of head: its reads of the slot
     * we are about to reuse are complete before we overwrite it. */
    head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
    if (r->p_tail - head > (uint64_t)r->slot_mask + 1) {
        r->p_failed = 1;
        return kvg_fail(err, err_len, "shm", "corrupt consumer slot index %llu (tail %llu)",
                        (unsigned long long)head, (unsigned long long)r->p_tail);
    }
    if (r->p_tail - head == (uint64_t)r->slot_mask + 1)
        return KVG_SHM_FULL;

    start = r->p_data_tail;
    need = align_up(payload_len, KVG_SHM_PAYLOAD_ALIGN);
    if (need) {
        /* Same pairing for the data area: the consumer is done with the bytes
         * it released. */
        dhead = atomic_load_explicit(&r->ctl->data_head, memory_order_acquire);
        if (r->p_data_tail - dhead > r->data_cap || dhead % KVG_SHM_PAYLOAD_ALIGN) {
            r->p_failed = 1;
            return kvg_fail(err, err_len, "shm", "corrupt consumer data index %llu (tail %llu)",
                            (unsigned long long)dhead, (unsigned long long)r->p_data_tail);
        }
        pos = start & (r->data_cap - 1);
        if (r->data_cap - pos < need)
            start += r->data_cap - pos;     /* skip to the area's start: payloads are contiguous */
        if (start + need - dhead > r->data_cap)
            return KVG_SHM_FULL;
        memcpy(r->data + (start & (r->data_cap - 1)), payload, payload_len);
    }

    sh.type = type;
    sh.body_len = (uint32_t)body_len;
    sh.payload_len = (uint32_t)payload_len;
    sh.reserved = 0;
    sh.data_pos = start;
    slot = r->slots + (size_t)(r->p_tail & r->slot_mask) * KVG_SHM_SLOT_SIZE;
    memcpy(slot, &sh, sizeof sh);
    if (body_len)
        memcpy(slot + KVG_SHM_SLOT_HDR, body, body_len);

    r->p_tail++;
    r->p_data_tail = start + need;
    /* data_tail is informative (attach checks it); only tail publishes. Its
     * release store makes the slot and payload writes above visible to a
     * consumer that acquires the new tail. */
    atomic_store_explicit(&r->ctl->data_tail, r->p_data_tail, memory_order_relaxed);
    atomic_store_explicit(&r->ctl->tail, r->p_tail, memory_order_release);
    return 0;
}

int kvg_shm_can_push(kvg_shm_ring *r, size_t payload_len)
{
    uint64_t head, dhead, need, start, pos;

    if (r->p_failed || payload_len > kvg_shm_max_payload(r))
        return 0;
    head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
    if (r->p_tail - head >= (uint64_t)r->slot_mask + 1)
        return 0;
    need = align_up(payload_len, KVG_SHM_PAYLOAD_ALIGN);
    if (!need)
        return 1;
    dhead = atomic_load_explicit(&r->ctl->data_head, memory_order_acquire);
    if (r->p_data_tail - dhead > r->data_cap)
        return 0;
    start = r->p_data_tail;
    pos = start & (r->data_cap - 1);
    if (r->data_cap - pos < need)
        start += r->data_cap - pos;
    return start + need - dhead <= r->data_cap;
}

uint64_t kvg_shm_pushed(const kvg_shm_ring *r)
{
    return r->p_tail;
}

uint64_t kvg_shm_released(const kvg_shm_ring *r)
{
    uint64_t head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);

    if (r->p_tail - head > (uint64_t)r->slot_mask + 1)
        return r->p_tail;
    return head;
}

/* ---- consumer ---- */

static int consumer_fail(kvg_shm_ring *r, char *err, size_t err_len, const char *what,
                         unsigned long long a, unsigned long long b)
{
    r->c_failed = 1;
    r->c_peeked = 0;
    return kvg_fail(err, err_len, "shm", "corrupt %s (%llu, %llu)", what, a, b);
}

int kvg_shm_can_pop(const kvg_shm_ring *r)
{
    return !r->c_failed && atomic_load_explicit(&r->ctl->tail, memory_order_acquire) != r->c_head;
}

int kvg_shm_peek(kvg_shm_ring *r, kvg_shm_msg *m, char *err, size_t err_len)
{
    uint64_t tail, off, need;
    slot_hdr sh;
    const unsigned char *slot;

    if (r->c_failed)
        return kvg_fail(err, err_len, "shm", "ring failed earlier (corrupt indices)");
    /* Acquire pairs with the producer's release of tail: the slot and payload
     * it published are visible before we read them. */
    tail = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
    if (tail - r->c_head > (uint64_t)r->slot_mask + 1)
        return consumer_fail(r, err, err_len, "producer slot index", tail, r->c_head);
    if (tail == r->c_head)
        return KVG_SHM_EMPTY;

    /* Validate a private copy; the peer may rewrite the slot meanwhile. */
    slot = r->slots + (size_t)(r->c_head & r->slot_mask) * KVG_SHM_SLOT_SIZE;
    memcpy(&sh, slot, sizeof sh);
    if (sh.body_len > KVG_SHM_BODY_MAX)
        return consumer_fail(r, err, err_len, "message body length", sh.body_len, KVG_SHM_BODY_MAX);
    if (sh.payload_len > kvg_shm_max_payload(r))
        return consumer_fail(r, err, err_len, "payload length", sh.payload_len,
                             kvg_shm_max_payload(r));
    m->type = sh.type;
    m->body_len = sh.body_len;
    m->payload_len = sh.payload_len;
    memcpy(m->body, slot + KVG_SHM_SLOT_HDR, sh.body_len);
    memset(m->body + sh.body_len, 0, KVG_SHM_BODY_MAX - sh.body_len);

    need = align_up(sh.payload_len, KVG_SHM_PAYLOAD_ALIGN);
    if (need) {
        /* The payload must lie in the unreleased part of the area, in order,
         * and not run past the area's end. Differences keep it overflow-proof. */
        off = sh.data_pos - r->c_data_head;
        if (sh.data_pos % KVG_SHM_PAYLOAD_ALIGN || off > r->data_cap || need > r->data_cap - off ||
            (sh.data_pos & (r->data_cap - 1)) + need > r->data_cap)
            return consumer_fail(r, err, err_len, "payload position", sh.data_pos, r->c_data_head);
        m->payload = r->data + (sh.data_pos & (r->data_cap - 1));
        r->c_peek_data_end = sh.data_pos + need;
    } else {
        m->payload = r->data;                    /* never read: length 0 */
        r->c_peek_data_end = r->c_data_head;
    }
    r->c_peeked = 1;
    return 0;
}

int kvg_shm_consume(kvg_shm_ring *r, char *err, size_t err_len)
{
    if (r->c_failed)
        return kvg_fail(err, err_len, "shm", "ring failed earlier (corrupt indices)");
    if (!r->c_peeked)
        return kvg_fail(err, err_len, "shm", "consume without a peeked message");
    r->c_peeked = 0;
    r->c_head++;
    r->c_data_head = r->c_peek_data_end;
    /* Release: our reads of the slot and payload happen before the producer,
     * acquiring these, reuses the space. */
    atomic_store_explicit(&r->ctl->data_head, r->c_data_head, memory_order_release);
    atomic_store_explicit(&r->ctl->head, r->c_head, memory_order_release);
    return 0;
}

int kvg_shm_try_pop(kvg_shm_ring *r, kvg_shm_msg *m, void *buf, size_t buf_cap,
                    char *err, size_t err_len)
{
    int rc = kvg_shm_peek(r, m, err, err_len);

    if (rc)
        return rc;
    if (m->payload_len > buf_cap) {
        r->c_peeked = 0;
        return kvg_fail(err, err_len, "shm", "payload of %u bytes exceeds the %zu-byte buffer",
                        m->payload_len, buf_cap);
    }
    if (m->payload_len)
        memcpy(buf, m->payload, m->payload_len);
    m->payload = buf;
    return kvg_shm_consume(r, err, err_len);
}

/* ---- waiting for room ---- */

void kvg_shm_producer_wait(kvg_shm_ring *r)
{
    /* seq_cst: the flag store is ordered before the producer's next load of
     * head (in the retry), pairing with the consumer's store of head followed
     * by its load of the flag. */
    atomic_store_explicit(&r->ctl->producer_waiting, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
}

int kvg_shm_consumer_take_waiter(kvg_shm_ring *r)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&r->ctl->producer_waiting, memory_order_relaxed) == 0)
        return 0;
    return atomic_exchange_explicit(&r->ctl->producer_waiting, 0, memory_order_seq_cst) != 0;
}
