/* Shared-memory SPSC channel: order, wrap-around, full/empty, data-area wrap,
 * two-thread stress with checksummed payloads, and corrupt regions. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shm_channel.h"
#include "shm_channel_testing.h"
#include "tap.h"

static char err[256];

static void *region_new(const kvg_shm_caps *c, size_t *size)
{
    void *mem;
    *size = kvg_shm_region_size(c);
    mem = aligned_alloc(64, (*size + 63) & ~(size_t)63);
    if (!mem || kvg_shm_init(mem, *size, c, err, sizeof err) != 0) {
        diag("region_new: %s", err);
        abort();
    }
    return mem;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void test_sizes(void)
{
    kvg_shm_caps c = { 8, 8, 1024, 1024 };
    kvg_shm_caps bad = { 6, 8, 1024, 1024 };
    unsigned char small[64] __attribute__((aligned(64)));
    size_t n = kvg_shm_region_size(&c);

    ok(n >= 2 * 8 * KVG_SHM_SLOT_SIZE + 2048 + 256, "region size %zu covers the parts", n);
    is_int(kvg_shm_region_size(&bad), 0, "non-power-of-two slot count rejected");
    bad = (kvg_shm_caps){ 8, 8, 1000, 1024 };
    is_int(kvg_shm_region_size(&bad), 0, "non-power-of-two data size rejected");
    bad = (kvg_shm_caps){ 8, 8, 32, 1024 };
    is_int(kvg_shm_region_size(&bad), 0, "data area below minimum rejected");
    is_int(kvg_shm_init(small, sizeof small, &c, err, sizeof err), -1, "init into too little memory fails");
    ok(strstr(err, "smaller") != NULL, "  with a message: %s", err);
    is_int(kvg_shm_init((char *)small + 8, 1 << 20, &c, err, sizeof err), -1, "misaligned memory fails");
}

static void test_order_and_wrap(void)
{
    kvg_shm_caps c = { 8, 4, 256, 128 };
    size_t size;
    void *mem = region_new(&c, &size);
    kvg_shm h;
    kvg_shm_msg m;
    int bad = 0, rc;
    uint32_t next_push = 0, next_pop = 0;

    is_int(kvg_shm_attach(&h, mem, size, err, sizeof err), 0, "attach fresh region");
    is_int(kvg_shm_peek(&h.sq, &m, err, sizeof err), KVG_SHM_EMPTY, "fresh sq is empty");
    is_int(kvg_shm_peek(&h.cq, &m, err, sizeof err), KVG_SHM_EMPTY, "fresh cq is empty");
    is_int(kvg_shm_consume(&h.sq, err, sizeof err), -1, "consume without peek is an error");

    for (int i = 0; i < 8; i++)
        if (kvg_shm_try_push(&h.sq, 7, &next_push, 4, NULL, 0, err, sizeof err) == 0)
            next_push++;
    is_int(next_push, 8, "8 pushes fill an 8-slot ring");
    is_int(kvg_shm_try_push(&h.sq, 7, &next_push, 4, NULL, 0, err, sizeof err), KVG_SHM_FULL,
           "ninth push reports full");
    is_int(kvg_shm_peek(&h.sq, &m, err, sizeof err), 0, "peek");
    is_int(kvg_shm_peek(&h.sq, &m, err, sizeof err), 0, "peek again returns the same message");
    ok(m.type == 7 && m.body_len == 4 && memcmp(m.body, &next_pop, 4) == 0, "  oldest message first");

    /* Go many times around: random bursts of pushes and pops. */
    for (int round = 0; round < 20000; round++) {
        int np = (int)(rnd() % 6), nc = (int)(rnd() % 6);
        for (int i = 0; i < np; i++) {
            rc = kvg_shm_try_push(&h.sq, 7, &next_push, 4, NULL, 0, err, sizeof err);
            if (rc == 0)
                next_push++;
            else if (rc != KVG_SHM_FULL || next_push - next_pop != 8)
                bad++;
        }
        for (int i = 0; i < nc; i++) {
            uint32_t v;
            rc = kvg_shm_try_pop(&h.sq, &m, NULL, 0, err, sizeof err);
            if (rc == KVG_SHM_EMPTY) {
                if (next_push != next_pop)
                    bad++;
                continue;
            }
            memcpy(&v, m.body, 4);
            if (rc != 0 || v != next_pop || m.body_len != 4)
                bad++;
            next_pop++;
        }
    }
    is_int(bad, 0, "20000 rounds of bursts: order kept, full/empty exact");
    ok(next_push > 40000, "  went around the ring %u times", next_push / 8);
    free(mem);
}

static void test_data_wrap(void)
{
    kvg_shm_caps c = { 16, 16, 256, 256 };
    size_t size;
    void *mem = region_new(&c, &size);
    kvg_shm h;
    kvg_shm_msg m;
    unsigned char pay[256], buf[256];
    int bad = 0, pushed = 0, popped = 0;
    uint64_t max;

    kvg_shm_attach(&h, mem, size, err, sizeof err);
    max = kvg_shm_max_payload(&h.cq);
    is_int(max, 128, "max payload is half the data area");
    for (int i = 0; i < 256; i++)
        pay[i] = (unsigned char)(i * 7 + 1);
    is_int(kvg_shm_try_push(&h.cq, 1, NULL, 0, pay, 129, err, sizeof err), -1, "payload over the limit rejected");
    ok(strstr(err, "exceeds") != NULL, "  %s", err);
    is_int(kvg_shm_try_push(&h.cq, 1, NULL, 0, pay, 4096, err, sizeof err), -1, "payload larger than the area rejected");
    is_int(kvg_shm_try_push(&h.cq, 1, pay, KVG_SHM_BODY_MAX + 1, NULL, 0, err, sizeof err), -1, "oversized body rejected");

    /* Exactly filling: 128 + 128 fills the area; a third waits. */
    is_int(kvg_shm_try_push(&h.cq, 1, NULL, 0, pay, 128, err, sizeof err), 0, "max payload fits");
    is_int(kvg_shm_try_push(&h.cq, 2, NULL, 0, pay + 1, 128, err, sizeof err), 0, "second max payload fills the area exactly");
    is_int(kvg_shm_try_push(&h.cq, 3, NULL, 0, pay, 8, err, sizeof err), KVG_SHM_FULL, "area full: push reports full");
    is_int(kvg_shm_try_push(&h.cq, 3, NULL, 0, NULL, 0, err, sizeof err), 0, "payload-less message still fits");
    is_int(kvg_shm_try_pop(&h.cq, &m, buf, 64, err, sizeof err), -1, "pop into a small buffer fails");
    is_int(kvg_shm_try_pop(&h.cq, &m, buf, sizeof buf, err, sizeof err), 0, "then pops with a big one");
    ok(m.type == 1 && m.payload_len == 128 && memcmp(buf, pay, 128) == 0, "  first payload intact");
    is_int(kvg_shm_try_pop(&h.cq, &m, buf, sizeof buf, err, sizeof err), 0, "pop second");
    ok(m.type == 2 && memcmp(buf, pay + 1, 128) == 0, "  second payload intact");
    is_int(kvg_shm_try_pop(&h.cq, &m, buf, sizeof buf, err, sizeof err), 0, "pop empty-payload message");
    is_int(m.payload_len, 0, "  length 0");

    /* What the producer can tell of its messages: pushed 3, all read; one more, unread.
     * A consumer index that cannot be right reads as "all read". */
    ok(kvg_shm_pushed(&h.cq) == 3 && kvg_shm_released(&h.cq) == 3, "3 pushed, 3 released (%llu, %llu)",
       (unsigned long long)kvg_shm_pushed(&h.cq), (unsigned long long)kvg_shm_released(&h.cq));
    kvg_shm_try_push(&h.cq, 4, NULL, 0, NULL, 0, err, sizeof err);
    ok(kvg_shm_pushed(&h.cq) == 4 && kvg_shm_released(&h.cq) == 3, "  one more pushed: 4, still 3 released");
    uint64_t head = atomic_load(&h.cq.ctl->head);
    atomic_store(&h.cq.ctl->head, head + 5);
    ok(kvg_shm_released(&h.cq) == 4, "  a consumer index past the tail reads as all read");
    atomic_store(&h.cq.ctl->head, head);
    is_int(kvg_shm_try_pop(&h.cq, &m, buf, sizeof buf, err, sizeof err), 0, "  and the message is still there");
    ok(kvg_shm_released(&h.cq) == 4, "  read: 4 released");

    /* Varying sizes, including ones that must skip the area's tail. */
    {
        uint32_t lens[16];
        unsigned seq_push = 0, seq_pop = 0;
        for (int round = 0; round < 20000; round++) {
            uint32_t len = (uint32_t)(rnd() % (max + 1));
            if (rnd() % 8 == 0)
                len = (uint32_t)max;
            if (seq_push - seq_pop < 16) {
                for (uint32_t i = 0; i < len; i++)
                    pay[i] = (unsigned char)(seq_push * 31 + i);
                int rc = kvg_shm_try_push(&h.cq, seq_push, NULL, 0, pay, len, err, sizeof err);
                if (rc == 0) {
                    lens[seq_push % 16] = len;
                    seq_push++;
                    pushed++;
                } else if (rc != KVG_SHM_FULL) {
                    bad++;
                } else if (seq_push == seq_pop) {
                    bad++;                    /* full while empty: would wait forever */
                }
            }
            if (rnd() % 2) {
                int rc = kvg_shm_try_pop(&h.cq, &m, buf, sizeof buf, err, sizeof err);
                if (rc == 0) {
                    if (m.type != seq_pop || m.payload_len != lens[seq_pop % 16])
                        bad++;
                    for (uint32_t i = 0; i < m.payload_len; i++)
                        if (buf[i] != (unsigned char)(seq_pop * 31 + i))
                            bad++;
                    seq_pop++;
                    popped++;
                } else if (rc != KVG_SHM_EMPTY || seq_pop != seq_push) {
                    bad++;
                }
            }
        }
    }
    is_int(bad, 0, "varying payload sizes through a wrapping data area");
    ok(pushed > 5000 && popped > 5000, "  %d pushed, %d popped", pushed, popped);
    free(mem);
}

/* ---- two threads ---- */

#define STRESS_N 300000u

typedef struct stress { kvg_shm *h; int bad; } stress;

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

static void *producer(void *arg)
{
    stress *s = arg;
    uint32_t pay[64];
    char e[128];

    for (uint32_t i = 0; i < STRESS_N; i++) {
        uint32_t n = mix(i) % 64, body[2], sum = 0;
        for (uint32_t k = 0; k < n; k++) {
            pay[k] = mix(i * 64 + k);
            sum += pay[k];
        }
        body[0] = i;
        body[1] = sum;
        for (;;) {
            int rc = kvg_shm_try_push(&s->h->sq, 4, body, sizeof body, pay, n * 4, e, sizeof e);
            if (rc == 0)
                break;
            if (rc < 0) {
                s->bad++;
                return NULL;
            }
            sched_yield();
        }
    }
    return NULL;
}

static void *consumer(void *arg)
{
    stress *s = arg;
    uint32_t buf[64];
    kvg_shm_msg m;
    char e[128];

    for (uint32_t i = 0; i < STRESS_N;) {
        int rc = kvg_shm_try_pop(&s->h->sq, &m, buf, sizeof buf, e, sizeof e);
        uint32_t body[2], sum = 0;
        if (rc == KVG_SHM_EMPTY) {
            sched_yield();
            continue;
        }
        if (rc < 0) {
            s->bad++;
            return NULL;
        }
        memcpy(body, m.body, sizeof body);
        for (uint32_t k = 0; k < m.payload_len / 4; k++)
            sum += buf[k];
        if (body[0] != i || m.payload_len != (mix(i) % 64) * 4 || sum != body[1])
            s->bad++;
        i++;
    }
    return NULL;
}

static void test_threads(void)
{
    kvg_shm_caps c = { 64, 64, 4096, 4096 };
    size_t size;
    void *mem = region_new(&c, &size);
    kvg_shm hp, hc;
    stress sp, sc;
    pthread_t tp, tc;
    kvg_shm_msg m;

    /* Separate attachments, as two processes would have. */
    kvg_shm_attach(&hp, mem, size, err, sizeof err);
    kvg_shm_attach(&hc, mem, size, err, sizeof err);
    sp = (stress){ &hp, 0 };
    sc = (stress){ &hc, 0 };
    pthread_create(&tc, NULL, consumer, &sc);
    pthread_create(&tp, NULL, producer, &sp);
    pthread_join(tp, NULL);
    pthread_join(tc, NULL);
    is_int(sp.bad, 0, "producer thread: no errors");
    is_int(sc.bad, 0, "consumer thread: %u messages in order with intact payloads", STRESS_N);
    is_int(kvg_shm_peek(&hc.sq, &m, err, sizeof err), KVG_SHM_EMPTY, "ring drained");
    free(mem);
}

/* ---- corruption ---- */

static void test_corruption(void)
{
    kvg_shm_caps c = { 8, 8, 256, 256 };
    size_t size;
    unsigned char *mem = region_new(&c, &size), *copy = aligned_alloc(64, (size + 63) & ~(size_t)63);
    kvg_shm h;
    kvg_shm_msg m;
    kvg_shm_header *hd = (kvg_shm_header *)mem;
    kvg_shm_ctl *sqc;
    unsigned char pay[64] = { 1 }, buf[256];
    int crashed_not = 1, attach_fail = 0, pop_fail = 0;
    size_t meta_end;

    kvg_shm_attach(&h, mem, size, err, sizeof err);
    for (int i = 0; i < 5; i++)
        kvg_shm_try_push(&h.sq, 1, pay, 8, pay, (size_t)(i * 12), err, sizeof err);
    memcpy(copy, mem, size);
    sqc = (kvg_shm_ctl *)(mem + hd->sq.ctl_off);
    meta_end = hd->sq.data_off;         /* header, ctl blocks and slots lie before */

    is_int(kvg_shm_attach(&h, mem, size - 1, err, sizeof err), -1, "mapping shorter than total_size rejected");
    hd->magic ^= 1;
    is_int(kvg_shm_attach(&h, mem, size, err, sizeof err), -1, "bad magic rejected");
    memcpy(mem, copy, size);
    hd->version = 2;
    is_int(kvg_shm_attach(&h, mem, size, err, sizeof err), -1, "bad version rejected");
    memcpy(mem, copy, size);
    hd->cq.data_off = hd->sq.data_off + 64;
    is_int(kvg_shm_attach(&h, mem, size, err, sizeof err), -1, "overlapping parts rejected: %s", err);
    memcpy(mem, copy, size);
    hd->sq.slots_off = UINT64_MAX - 63;
    is_int(kvg_shm_attach(&h, mem, size, err, sizeof err), -1, "offset near 2^64 rejected: %s", err);
    memcpy(mem, copy, size);
    atomic_store(&sqc->tail, 1000);
    is_int(kvg_shm_attach(&h, mem, size, err, sizeof err), -1, "tail beyond capacity rejected at attach");

    /* Corruption after attach: the consumer must notice on pop. */
    memcpy(mem, copy, size);
    is_int(kvg_shm_attach(&h, mem, size, err, sizeof err), 0, "restored region attaches");
    atomic_store(&sqc->tail, 1000);
    is_int(kvg_shm_try_pop(&h.sq, &m, buf, sizeof buf, err, sizeof err), -1, "corrupt tail: pop fails");
    ok(strstr(err, "corrupt") != NULL, "  %s", err);
    atomic_store(&sqc->tail, 5);
    is_int(kvg_shm_try_pop(&h.sq, &m, buf, sizeof buf, err, sizeof err), -1, "ring stays failed");

    memcpy(mem, copy, size);
    kvg_shm_attach(&h, mem, size, err, sizeof err);
    {
        unsigned char *slot = mem + hd->sq.slots_off;
        uint32_t big = 1u << 30;
        memcpy(slot + 8, &big, 4);                         /* payload_len */
        is_int(kvg_shm_try_pop(&h.sq, &m, buf, sizeof buf, err, sizeof err), -1, "huge payload length: pop fails");
    }
    memcpy(mem, copy, size);
    kvg_shm_attach(&h, mem, size, err, sizeof err);
    kvg_shm_try_pop(&h.sq, &m, buf, sizeof buf, err, sizeof err);
    {
        unsigned char *slot = mem + hd->sq.slots_off + KVG_SHM_SLOT_SIZE;
        uint64_t pos = 1ull << 40;
        memcpy(slot + 16, &pos, 8);                        /* data_pos */
        is_int(kvg_shm_try_pop(&h.sq, &m, buf, sizeof buf, err, sizeof err), -1, "wild data position: pop fails");
    }
    memcpy(mem, copy, size);
    kvg_shm_attach(&h, mem, size, err, sizeof err);
    atomic_store(&sqc->head, 77);
    is_int(kvg_shm_try_push(&h.sq, 1, NULL, 0, NULL, 0, err, sizeof err), -1, "corrupt head: push fails");

    /* Random bytes into header, ctl blocks and slots: attach or pop errors, never crashes. */
    for (int iter = 0; iter < 20000; iter++) {
        int rc;
        memcpy(mem, copy, size);
        for (int k = 0, nk = 1 + (int)(rnd() % 4); k < nk; k++) {
            size_t at = (size_t)(rnd() % meta_end);
            mem[at] = (unsigned char)rnd();
        }
        if (kvg_shm_attach(&h, mem, size, err, sizeof err) != 0) {
            attach_fail++;
            continue;
        }
        for (int k = 0; k < 12; k++) {
            rc = kvg_shm_try_pop(&h.sq, &m, buf, sizeof buf, err, sizeof err);
            if (rc == 0 && m.payload_len > 128)
                crashed_not = 0;
            if (rc) {
                pop_fail += rc < 0;
                break;
            }
        }
        for (int k = 0; k < 12; k++)
            if ((rc = kvg_shm_try_pop(&h.cq, &m, buf, sizeof buf, err, sizeof err)) != 0)
                break;
        kvg_shm_try_push(&h.sq, 1, pay, 8, pay, 40, err, sizeof err);
    }
    ok(crashed_not, "random corruption: no out-of-range message accepted");
    ok(attach_fail > 1000 && pop_fail > 100, "  %d attaches and %d pops refused", attach_fail, pop_fail);
    free(copy);
    free(mem);
}

int main(void)
{
    test_sizes();
    test_order_and_wrap();
    test_data_wrap();
    test_threads();
    test_corruption();
    return done_testing();
}
