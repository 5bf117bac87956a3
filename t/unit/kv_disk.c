/* The disk tier's store (engine/kv_disk.h) and its use by the prefix cache:
 *   - a block written and read back is the same bytes; a wrong tag or an unknown hash
 *     is a miss;
 *   - a reopened store (a restart) finds its blocks; a store of another model id or
 *     geometry ignores them;
 *   - a flipped payload byte is caught by the checksum (the slot is dropped for good),
 *     a flipped header byte makes the slot free space;
 *   - the size bound evicts the least recently used slot; a spill that finds the
 *     write queue full is dropped, never waited for;
 *   - a file that cannot grow (RLIMIT_FSIZE: EFBIG as a full disk would give ENOSPC)
 *     degrades to "not cached" and counts the error;
 *   - a tenant's blocks are wiped, on disk too, across a reopen;
 *   - expiry (the store's clock set by the test): a block past it is not written, not
 *     served, and its slot is taken before a live one is evicted; a reopen drops it; a
 *     version-1 slot (no expiry) is free space;
 *   - quota: a tenant at its share of the slots makes room from its own, never from
 *     another tenant's, also after a reopen;
 *   - the prefix cache spills evicted blocks and admission reads them back into fresh
 *     pool blocks (byte-identical), for the right tenant only, across a reopen; the
 *     block's time left goes with it, a disk hit is a use like a pool hit, a held
 *     block keeps at least its hold on disk.
 * Bad arguments (no directory, a size without a slot, a file in use) are errors. */
#include <fcntl.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "crc32c.h"
#include "kv_cache.h"
#include "kv_disk.h"
#include "prefix_cache.h"
#include "prefix_cache_testing.h"
#include "prefix_hash.h"

#define NO_EXP KVG_KV_DISK_NO_EXPIRY

static char err[512];
static char base[256];
static const kvg_kv_geom GEOM = { .n_layers = 2, .n_kv_heads = 2, .head_dim = 8, .block_tokens = 4 };

static void fill(kvg_kv_pool *p, int32_t id, uint32_t seed)
{
    size_t n = kvg_kv_xfer_bytes(p) / sizeof(float);
    float *f = p->data + (size_t)id * (p->stride_bytes / sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = (float)((seed * 2654435761u + (uint32_t)i * 40503u) % 100003u) * 0.25f;
}

static int same(const kvg_kv_pool *p, int32_t a, const kvg_kv_pool *q, int32_t b)
{
    return memcmp(p->data + (size_t)a * (p->stride_bytes / sizeof(float)), q->data + (size_t)b * (q->stride_bytes / sizeof(float)),
                  kvg_kv_xfer_bytes(p)) == 0;
}

static void hash_of(uint8_t h[32], uint32_t v)
{
    for (int i = 0; i < 32; i++)
        h[i] = (uint8_t)(v * 31u + (uint32_t)i * 7u + (v >> (i % 24)));
}

static kvg_kv_disk_ident ident_of(const kvg_kv_pool *p, uint8_t model)
{
    kvg_kv_disk_ident id;
    memset(&id, 0, sizeof id);
    memset(id.model_id, model, sizeof id.model_id);
    id.n_layers = p->geom.n_layers;
    id.n_kv_heads = p->geom.n_kv_heads;
    id.head_dim = p->geom.head_dim;
    id.block_tokens = p->geom.block_tokens;
    id.dtype = kvg_kv_disk_host_dtype(p);
    id.payload_bytes = kvg_kv_xfer_bytes(p);
    return id;
}

static kvg_kv_disk *open_in(const char *sub, uint64_t slots, const kvg_kv_disk_ident *id)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/%s", base, sub);
    uint64_t slot = KVG_KV_DISK_HDR_BYTES + (id->payload_bytes + 4095) / 4096 * 4096;
    kvg_kv_disk *d = kvg_kv_disk_open(dir, slots * slot, 0, id, err, sizeof err);
    if (!d)
        diag("open %s: %s", dir, err);
    return d;
}

static void flip_byte(const char *sub, off_t off)
{
    char path[400];
    unsigned char c;
    snprintf(path, sizeof path, "%s/%s/%s", base, sub, KVG_KV_DISK_FILE);
    int fd = open(path, O_RDWR);
    if (fd < 0 || pread(fd, &c, 1, off) != 1)
        diag("flip: %s", path);
    c ^= 0x40;
    if (fd >= 0 && pwrite(fd, &c, 1, off) != 1)
        diag("flip: write");
    if (fd >= 0)
        close(fd);
}

/* The stores' clock in the tests that set it (Unix ms; read by the writer thread too). */
static _Atomic int64_t clk;

static int64_t test_clock(void *ctx)
{
    (void)ctx;
    return atomic_load(&clk);
}

static kvg_kv_disk *open_clk(const char *sub, uint64_t slots, const kvg_kv_disk_ident *id)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/%s", base, sub);
    uint64_t slot = KVG_KV_DISK_HDR_BYTES + (id->payload_bytes + 4095) / 4096 * 4096;
    kvg_kv_disk *d = kvg_kv_disk_open_clock(dir, slots * slot, 0, id, test_clock, NULL, err, sizeof err);
    if (!d)
        diag("open %s: %s", dir, err);
    return d;
}

static kvg_kv_disk_stats stats(kvg_kv_disk *d)
{
    kvg_kv_disk_stats s;
    kvg_kv_disk_get_stats(d, &s);
    return s;
}

static void test_round_trip_restart(kvg_kv_pool *p)
{
    uint8_t h[32], h2[32], tag[32], tag2[32];
    kvg_kv_disk_ident id = ident_of(p, 1);
    kvg_kv_disk *d = open_in("rt", 16, &id);
    hash_of(h, 1);
    hash_of(h2, 2);
    memset(tag, 0xa1, 32);
    memset(tag2, 0xb2, 32);
    fill(p, 1, 11);
    ok(d != NULL, "a store of 16 slots opens");
    is_int(stats(d).restored, 0, "  a new file holds nothing");
    is_int(kvg_kv_disk_spill(d, p, 1, h, tag, 0, NO_EXP, 0), 0, "spill: queued");
    kvg_kv_disk_flush(d);
    is_int(stats(d).blocks_written, 1, "  written by the writer thread");
    is_int(kvg_kv_disk_spill(d, p, 1, h, tag, 0, NO_EXP, 0), 0, "spilling it again: already stored");
    kvg_kv_disk_flush(d);
    is_int(stats(d).blocks_written, 1, "  not written twice");
    is_int(kvg_kv_disk_load(d, p, 5, h, tag), 0, "load into another block");
    ok(same(p, 1, p, 5), "  the same bytes");
    is_int(kvg_kv_disk_load(d, p, 6, h, tag2), -1, "another tenant tag: a miss");
    is_int(kvg_kv_disk_load(d, p, 6, h2, tag), -1, "an unknown hash: a miss");
    {
        char e2[256];
        uint64_t slot = stats(d).slot_bytes;
        char dir[300];
        snprintf(dir, sizeof dir, "%s/rt", base);
        ok(kvg_kv_disk_open(dir, 4 * slot, 0, &id, e2, sizeof e2) == NULL && strstr(e2, "in use"),
           "a second store on the same directory: refused (%s)", e2);
    }
    kvg_kv_disk_close(d);

    d = open_in("rt", 16, &id);
    is_int(stats(d).restored, 1, "reopened: the block is found again");
    memset(p->data + 7 * (p->stride_bytes / sizeof(float)), 0, kvg_kv_xfer_bytes(p));
    is_int(kvg_kv_disk_load(d, p, 7, h, tag), 0, "  and loads");
    ok(same(p, 1, p, 7), "  the same bytes");
    kvg_kv_disk_close(d);

    kvg_kv_disk_ident other = ident_of(p, 2);
    d = open_in("rt", 16, &other);
    is_int(stats(d).restored, 0, "another model id: its slots are ignored");
    is_int(kvg_kv_disk_load(d, p, 7, h, tag), -1, "  a miss");
    kvg_kv_disk_close(d);
    other = ident_of(p, 1);
    other.dtype = 99;
    d = open_in("rt", 16, &other);
    is_int(stats(d).restored, 0, "another dtype: ignored");
    kvg_kv_disk_close(d);
    other = ident_of(p, 1);
    other.block_tokens = 8;
    d = open_in("rt", 16, &other);
    is_int(stats(d).restored, 0, "another geometry: ignored");
    kvg_kv_disk_close(d);
    d = open_in("rt", 16, &id);
    is_int(stats(d).restored, 1, "the original identity still finds its block");
    kvg_kv_disk_close(d);
}

/* int8 KV pools (--kv-dtype int8): their own dtype, with the count of float32 layers
 * in it, so a store written by an engine of one --kv-dtype / --kv-full-precision-layers
 * is free space for an engine of another; an int8 pool whose every layer is float32 is
 * an F32 pool. */
static void test_int8_ident(kvg_kv_pool *f32)
{
    kvg_kv_geom g = GEOM;
    kvg_kv_pool *p0, *p1, *pall;
    uint8_t h[32], tag[32];
    kvg_kv_disk *d;
    kvg_kv_disk_ident id1, id0, idf;

    g.dtype = KVG_KV_INT8;
    g.full_layers = 0;
    p0 = kvg_kv_pool_new(&g, 8, err, sizeof err);
    g.full_layers = 1;
    p1 = kvg_kv_pool_new(&g, 8, err, sizeof err);
    g.full_layers = 2;
    pall = kvg_kv_pool_new(&g, 8, err, sizeof err);
    if (!ok(p0 && p1 && pall, "int8 pools")) {
        kvg_kv_pool_free(p0);
        kvg_kv_pool_free(p1);
        kvg_kv_pool_free(pall);
        return;
    }
    is_int(kvg_kv_disk_host_dtype(f32), KVG_KV_DTYPE_F32_HOST, "F32 pool: F32_HOST");
    is_int(kvg_kv_disk_host_dtype(pall), KVG_KV_DTYPE_F32_HOST, "int8 with every layer float32: F32_HOST");
    is_int(kvg_kv_disk_host_dtype(p0), KVG_KV_DTYPE_INT8_HOST, "int8, no float32 layer: INT8_HOST + 0");
    is_int(kvg_kv_disk_host_dtype(p1), KVG_KV_DTYPE_INT8_HOST + 1, "int8, 1 float32 layer: INT8_HOST + 1");

    hash_of(h, 77);
    memset(tag, 0xc3, 32);
    id1 = ident_of(p1, 1);
    id0 = ident_of(p0, 1);
    idf = ident_of(f32, 1);
    id0.payload_bytes = id1.payload_bytes;    /* only the dtype tells these two apart */
    fill(p1, 2, 5);
    d = open_in("i8", 8, &id1);
    is_int(kvg_kv_disk_spill(d, p1, 2, h, tag, 0, NO_EXP, 0), 0, "int8 pool: a block spilled");
    kvg_kv_disk_close(d);
    d = open_in("i8", 8, &id0);
    is_int(stats(d).restored, 0, "another float32-layer count (same payload size): ignored");
    is_int(kvg_kv_disk_load(d, p0, 3, h, tag), -1, "  a miss");
    kvg_kv_disk_close(d);
    d = open_in("i8", 8, &idf);
    is_int(stats(d).restored, 0, "an F32 engine: ignored");
    is_int(kvg_kv_disk_load(d, f32, 3, h, tag), -1, "  a miss");
    kvg_kv_disk_close(d);
    d = open_in("i8", 8, &id1);
    is_int(stats(d).restored, 1, "the same int8 identity finds it again");
    is_int(kvg_kv_disk_load(d, p1, 4, h, tag), 0, "  and loads");
    ok(same(p1, 2, p1, 4), "  the same bytes");
    kvg_kv_disk_close(d);
    kvg_kv_pool_free(p0);
    kvg_kv_pool_free(p1);
    kvg_kv_pool_free(pall);
}

static void test_corrupt(kvg_kv_pool *p)
{
    uint8_t h[32], tag[32];
    kvg_kv_disk_ident id = ident_of(p, 1);
    kvg_kv_disk *d = open_in("bad", 4, &id);
    hash_of(h, 3);
    memset(tag, 0xa1, 32);
    fill(p, 2, 22);
    kvg_kv_disk_spill(d, p, 2, h, tag, 0, NO_EXP, 0);
    kvg_kv_disk_close(d);        /* closing writes the queue out */
    flip_byte("bad", KVG_KV_DISK_HDR_BYTES + 100);   /* slot 0's payload */
    d = open_in("bad", 4, &id);
    is_int(stats(d).restored, 1, "a flipped payload byte: the header still indexes it");
    fill(p, 3, 99);
    is_int(kvg_kv_disk_load(d, p, 3, h, tag), -1, "  but the checksum refuses it");
    is_int(stats(d).corrupt, 1, "  counted corrupt");
    is_int(kvg_kv_disk_holds(d, h), 0, "  and the slot is dropped");
    kvg_kv_disk_close(d);
    d = open_in("bad", 4, &id);
    is_int(stats(d).restored, 0, "  for good: not found after a reopen");
    kvg_kv_disk_spill(d, p, 2, h, tag, 0, NO_EXP, 0);
    kvg_kv_disk_close(d);
    flip_byte("bad", 90);        /* slot 0's header: inside the hash */
    d = open_in("bad", 4, &id);
    is_int(stats(d).restored, 0, "a flipped header byte: free space");
    kvg_kv_disk_close(d);
}

static void test_lru_and_queue(kvg_kv_pool *p)
{
    uint8_t h[8][32], tag[32];
    kvg_kv_disk_ident id = ident_of(p, 1);
    kvg_kv_disk *d = open_in("lru", 3, &id);
    memset(tag, 0xa1, 32);
    for (int i = 0; i < 8; i++)
        hash_of(h[i], 100u + (uint32_t)i);
    for (int i = 0; i < 3; i++) {
        kvg_kv_disk_spill(d, p, 1, h[i], tag, 0, NO_EXP, 0);
        kvg_kv_disk_flush(d);
    }
    is_int(kvg_kv_disk_load(d, p, 4, h[0], tag), 0, "3 slots full; the oldest read (used)");
    kvg_kv_disk_spill(d, p, 1, h[3], tag, 0, NO_EXP, 0);
    kvg_kv_disk_flush(d);
    ok(kvg_kv_disk_holds(d, h[0]) && !kvg_kv_disk_holds(d, h[1]) && kvg_kv_disk_holds(d, h[2]) &&
       kvg_kv_disk_holds(d, h[3]), "a 4th block evicts the least recently used (the 2nd)");
    is_int(stats(d).evictions, 1, "  one eviction");
    is_int(stats(d).slots_used, 3, "  3 slots used");
    kvg_kv_disk_close(d);

    /* The queue holds 4 slots (the minimum): 200 spills back to back are each either
     * written or dropped, never waited for. */
    d = open_in("queue", 256, &id);
    int dropped = 0;
    for (uint32_t i = 0; i < 200; i++) {
        uint8_t hh[32];
        hash_of(hh, 1000u + i);
        dropped += kvg_kv_disk_spill(d, p, 1, hh, tag, 0, NO_EXP, 0) != 0;
    }
    kvg_kv_disk_flush(d);
    kvg_kv_disk_stats s = stats(d);
    is_int(s.blocks_written + s.dropped, 200, "200 spills: written (%llu) + dropped (%llu)",
           (unsigned long long)s.blocks_written, (unsigned long long)s.dropped);
    is_int((long long)s.dropped, dropped, "  the dropped ones said so");
    is_int(s.pending, 0, "  nothing pending after a flush");
    kvg_kv_disk_close(d);
}

static void test_wipe(kvg_kv_pool *p)
{
    uint8_t h[6][32], ta[32], tb[32];
    kvg_kv_disk_ident id = ident_of(p, 1);
    kvg_kv_disk *d = open_in("wipe", 8, &id);
    memset(ta, 0xa1, 32);
    memset(tb, 0xb2, 32);
    for (int i = 0; i < 6; i++) {
        hash_of(h[i], 200u + (uint32_t)i);
        kvg_kv_disk_spill(d, p, 1, h[i], i < 4 ? ta : tb, 0, NO_EXP, 1);
    }
    kvg_kv_disk_flush(d);
    is_int(kvg_kv_disk_wipe(d, ta), 4, "wipe tenant A: its 4 blocks");
    ok(!kvg_kv_disk_holds(d, h[0]) && kvg_kv_disk_holds(d, h[4]), "  A's gone, B's kept");
    kvg_kv_disk_close(d);
    d = open_in("wipe", 8, &id);
    is_int(stats(d).restored, 2, "  after a reopen only B's 2 blocks are found");
    kvg_kv_disk_close(d);
}

/* A file that cannot grow past 1.5 slots: the first slot is written, the second
 * fails (EFBIG), both without failing anything. In a child, for the rlimit. */
static void test_full(kvg_kv_pool *p)
{
    pid_t pid = fork();
    if (pid == 0) {
        uint8_t h0[32], h1[32], tag[32];
        kvg_kv_disk_ident id = ident_of(p, 1);
        uint64_t slot = KVG_KV_DISK_HDR_BYTES + (id.payload_bytes + 4095) / 4096 * 4096;
        struct rlimit rl = { slot + slot / 2, slot + slot / 2 };
        int bad = 0;
        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &rl);
        kvg_kv_disk *d = open_in("full", 4, &id);
        if (!d)
            _exit(100);
        hash_of(h0, 300);
        hash_of(h1, 301);
        memset(tag, 0xa1, 32);
        bad |= kvg_kv_disk_spill(d, p, 1, h0, tag, 0, NO_EXP, 0) != 0;
        kvg_kv_disk_flush(d);
        bad |= (kvg_kv_disk_spill(d, p, 1, h1, tag, 0, NO_EXP, 0) != 0) << 1;
        kvg_kv_disk_flush(d);
        kvg_kv_disk_stats s = stats(d);
        bad |= (s.io_errors != 1) << 2;
        bad |= (kvg_kv_disk_load(d, p, 6, h0, tag) != 0) << 3;
        bad |= (kvg_kv_disk_load(d, p, 6, h1, tag) != -1) << 4;
        bad |= (s.blocks_written != 1) << 5;
        kvg_kv_disk_close(d);
        _exit(bad);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
       "a file that cannot grow: the first block written, the second an I/O error and a "
       "miss, nothing fails (child status %d)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* Expiry, on the store's clock (the test's). */
static void test_expiry(kvg_kv_pool *p)
{
    uint8_t h[8][32], tag[32];
    kvg_kv_disk_ident id = ident_of(p, 1);
    const int64_t t0 = 1700000000000;
    kvg_kv_disk *d;
    memset(tag, 0xa1, 32);
    for (int i = 0; i < 8; i++)
        hash_of(h[i], 400u + (uint32_t)i);
    atomic_store(&clk, t0);
    d = open_clk("ttl", 4, &id);
    if (!ok(d != NULL, "a store of 4 slots with the test's clock"))
        return;
    is_int(kvg_kv_disk_spill(d, p, 1, h[0], tag, 0, 1000, 0), 0, "a block with 1000 ms left: queued");
    is_int(kvg_kv_disk_spill(d, p, 1, h[1], tag, 0, 0, 0), -1, "a block with none left: not queued");
    is_int(kvg_kv_disk_spill(d, p, 1, h[2], tag, 0, -5, 0), -1, "  nor one past it");
    kvg_kv_disk_flush(d);
    is_int(stats(d).blocks_written, 1, "  only the live one written");
    is_int(stats(d).expired, 2, "  the two counted expired");
    atomic_store(&clk, t0 + 999);
    is_int(kvg_kv_disk_load(d, p, 5, h[0], tag), 0, "999 ms later it loads");
    {
        kvg_kv_disk_read *r = kvg_kv_disk_read_start(d, h[0], tag);
        ok(r != NULL, "  and the reader thread would read it");
        kvg_kv_disk_read_put(d, r);
    }
    atomic_store(&clk, t0 + 1000);
    is_int(kvg_kv_disk_holds(d, h[0]), 0, "at 1000 ms it is no longer held");
    ok(kvg_kv_disk_read_start(d, h[0], tag) == NULL, "  the reader is not asked to read it");
    is_int(stats(d).expired, 3, "  counted expired");
    is_int(kvg_kv_disk_load(d, p, 5, h[0], tag), -1, "  a load misses");
    is_int(stats(d).slots_used, 0, "  and its slot is free");
    /* A block queued with 1 ms left and read after it: a miss, whether the writer wrote
     * it before the clock moved or found it expired; either way it is gone (and counted)
     * by the writer's next slot choice. */
    kvg_kv_disk_spill(d, p, 1, h[6], tag, 0, 1, 0);
    atomic_store(&clk, t0 + 1001);
    ok(kvg_kv_disk_read_start(d, h[6], tag) == NULL, "a block past its expiry while queued: not read");
    is_int(kvg_kv_disk_load(d, p, 5, h[6], tag), -1, "  nor loaded: a miss");
    kvg_kv_disk_flush(d);

    /* The writer takes an expired slot before evicting a live one: 4 slots, the 2nd of
     * 4 (not the least recently used) expires, a 5th block takes its slot. */
    atomic_store(&clk, t0 + 2000);
    kvg_kv_disk_spill(d, p, 1, h[1], tag, 0, NO_EXP, 1);
    kvg_kv_disk_spill(d, p, 1, h[2], tag, 0, 500, 1);
    kvg_kv_disk_spill(d, p, 1, h[3], tag, 0, NO_EXP, 1);
    kvg_kv_disk_spill(d, p, 1, h[4], tag, 0, 100000, 1);
    kvg_kv_disk_flush(d);
    is_int(stats(d).slots_used, 4, "4 blocks fill the 4 slots");
    is_int(stats(d).expired, 4, "  the one queued past its expiry counted");
    ok(!kvg_kv_disk_holds(d, h[6]), "  and not held");
    atomic_store(&clk, t0 + 2500);
    kvg_kv_disk_spill(d, p, 1, h[5], tag, 0, NO_EXP, 1);
    kvg_kv_disk_flush(d);
    ok(kvg_kv_disk_holds(d, h[1]) && !kvg_kv_disk_holds(d, h[2]) && kvg_kv_disk_holds(d, h[3]) &&
       kvg_kv_disk_holds(d, h[4]) && kvg_kv_disk_holds(d, h[5]),
       "a 5th block takes the expired slot; the least recently used live one stays");
    is_int(stats(d).evictions, 0, "  no eviction");
    is_int(stats(d).expired, 5, "  one more expired");

    /* Spilling a stored block again extends its expiry (in the index: its header keeps
     * t0 + 102000). */
    kvg_kv_disk_spill(d, p, 1, h[4], tag, 0, 200000, 0);
    atomic_store(&clk, t0 + 102000);
    is_int(kvg_kv_disk_load(d, p, 5, h[4], tag), 0, "a block spilled again with more time: extended");
    /* Full: h7 evicts the least recently used, h1. */
    kvg_kv_disk_spill(d, p, 1, h[7], tag, 0, 5000, 1);
    kvg_kv_disk_flush(d);
    ok(!kvg_kv_disk_holds(d, h[1]) && kvg_kv_disk_holds(d, h[7]), "full: a live block evicts the least recently used");
    kvg_kv_disk_close(d);

    /* A restart drops what expired meanwhile: stored are h3, h5 (no expiry), h4 (its
     * header: t0 + 102000), h7 (t0 + 107000). */
    atomic_store(&clk, t0 + 105000);
    d = open_clk("ttl", 4, &id);
    is_int(stats(d).restored, 3, "reopened after h4's written expiry: 3 blocks restored");
    is_int(stats(d).expired, 1, "  h4 dropped as expired");
    ok(!kvg_kv_disk_holds(d, h[4]) && kvg_kv_disk_holds(d, h[7]), "  h4 gone, h7 kept");
    kvg_kv_disk_close(d);
    atomic_store(&clk, t0 + 107000);
    d = open_clk("ttl", 4, &id);
    is_int(stats(d).restored, 2, "reopened at h7's expiry: the 2 without one restored");
    ok(kvg_kv_disk_holds(d, h[3]) && kvg_kv_disk_holds(d, h[5]) && !kvg_kv_disk_holds(d, h[7]), "  h7 dropped");
    is_int(kvg_kv_disk_load(d, p, 5, h[5], tag), 0, "  a block without expiry still loads");
    kvg_kv_disk_close(d);
}

/* A slot written by the version-1 format (no expiry; its checksums at 160 and 164) with
 * this store's identity: free space, overwritten without an eviction. */
static void test_version1(kvg_kv_pool *p)
{
    uint8_t h[3][32], tag[32], img[KVG_KV_DISK_HDR_BYTES];
    kvg_kv_disk_ident id = ident_of(p, 1);
    uint64_t slot = KVG_KV_DISK_HDR_BYTES + (id.payload_bytes + 4095) / 4096 * 4096;
    char path[400];
    uint32_t c;
    int fd;
    kvg_kv_disk *d;
    memset(tag, 0xa1, 32);
    for (int i = 0; i < 3; i++)
        hash_of(h[i], 500u + (uint32_t)i);
    snprintf(path, sizeof path, "%s/v1", base);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/v1/%s", base, KVG_KV_DISK_FILE);
    memset(img, 0, sizeof img);
    memcpy(img, KVG_KV_DISK_MAGIC, 8);
    c = 1;
    memcpy(img + 8, &c, 4);
    c = KVG_KV_DISK_HDR_BYTES;
    memcpy(img + 12, &c, 4);
    memcpy(img + 16, id.model_id, 32);
    memcpy(img + 48, &id.n_layers, 4);
    memcpy(img + 52, &id.n_kv_heads, 4);
    memcpy(img + 56, &id.head_dim, 4);
    memcpy(img + 60, &id.block_tokens, 4);
    memcpy(img + 64, &id.dtype, 4);
    memcpy(img + 72, &id.payload_bytes, 8);
    memcpy(img + 80, h[0], 32);
    memcpy(img + 112, tag, 32);
    c = kvg_crc32c(0, img, 160);
    memcpy(img + 160, &c, 4);
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    ok(fd >= 0 && pwrite(fd, img, sizeof img, 0) == (ssize_t)sizeof img &&
       pwrite(fd, img, sizeof img, (off_t)slot) == (ssize_t)sizeof img, "a file of two version-1 slots");
    if (fd >= 0)
        close(fd);
    d = open_in("v1", 2, &id);
    is_int(stats(d).restored, 0, "version-1 slots of this identity: nothing restored");
    is_int(kvg_kv_disk_load(d, p, 5, h[0], tag), -1, "  their block is a miss");
    kvg_kv_disk_spill(d, p, 1, h[1], tag, 0, NO_EXP, 1);
    kvg_kv_disk_spill(d, p, 1, h[2], tag, 0, NO_EXP, 1);
    kvg_kv_disk_flush(d);
    is_int(stats(d).slots_used, 2, "  both slots are free space: two blocks written");
    is_int(stats(d).evictions, 0, "  without an eviction");
    kvg_kv_disk_close(d);
    d = open_in("v1", 2, &id);
    is_int(stats(d).restored, 2, "  and found after a reopen");
    kvg_kv_disk_close(d);
}

static int holds_all(kvg_kv_disk *d, uint8_t (*h)[32], int from, int to)
{
    for (int i = from; i < to; i++)
        if (!kvg_kv_disk_holds(d, h[i]))
            return 0;
    return 1;
}

static int holds_none(kvg_kv_disk *d, uint8_t (*h)[32], int from, int to)
{
    for (int i = from; i < to; i++)
        if (kvg_kv_disk_holds(d, h[i]))
            return 0;
    return 1;
}

/* Quota: tenant A at half of 8 slots (4). */
static void test_quota(kvg_kv_pool *p)
{
    uint8_t a[10][32], b[6][32], ta[32], tb[32];
    kvg_kv_disk_ident id = ident_of(p, 1);
    kvg_kv_disk *d = open_in("quota", 8, &id);
    kvg_kv_disk_stats s;
    memset(ta, 0xa1, 32);
    memset(tb, 0xb2, 32);
    for (int i = 0; i < 10; i++)
        hash_of(a[i], 600u + (uint32_t)i);
    for (int i = 0; i < 6; i++)
        hash_of(b[i], 700u + (uint32_t)i);
    /* B (no quota) holds 4; A writes 10: it gets the 4 free slots, then makes room
     * from its own. */
    for (int i = 0; i < 4; i++)
        kvg_kv_disk_spill(d, p, 1, b[i], tb, 0, NO_EXP, 1);
    for (int i = 0; i < 10; i++)
        kvg_kv_disk_spill(d, p, 1, a[i], ta, 0.5, NO_EXP, 1);
    kvg_kv_disk_flush(d);
    s = stats(d);
    ok(holds_all(d, b, 0, 4), "A filling the disk at its quota leaves B's 4 blocks");
    ok(holds_all(d, a, 6, 10) && holds_none(d, a, 0, 6), "  A holds its 4 most recent");
    ok(s.quota_evictions == 6 && s.evictions == 6, "  6 quota evictions (%llu, %llu evictions)",
       (unsigned long long)s.quota_evictions, (unsigned long long)s.evictions);
    kvg_kv_disk_close(d);

    /* B holds 6 (more than half): A under its share evicts the least recently used
     * (B's); at its share, its own. */
    d = open_in("quota2", 8, &id);
    for (int i = 0; i < 6; i++)
        kvg_kv_disk_spill(d, p, 1, b[i], tb, 0, NO_EXP, 1);
    for (int i = 0; i < 4; i++)
        kvg_kv_disk_spill(d, p, 1, a[i], ta, 0.5, NO_EXP, 1);
    kvg_kv_disk_flush(d);
    ok(holds_none(d, b, 0, 2) && holds_all(d, b, 2, 6) && holds_all(d, a, 0, 4),
       "A under its share: 2 free slots, then B's 2 least recently used");
    for (int i = 4; i < 6; i++)
        kvg_kv_disk_spill(d, p, 1, a[i], ta, 0.5, NO_EXP, 1);
    kvg_kv_disk_flush(d);
    s = stats(d);
    ok(holds_all(d, b, 2, 6) && holds_none(d, a, 0, 2) && holds_all(d, a, 2, 6),
       "  at its share: its own 2 least recently used");
    ok(s.evictions == 4 && s.quota_evictions == 2, "  4 evictions, 2 of them quota");
    kvg_kv_disk_close(d);
    d = open_in("quota2", 8, &id);
    kvg_kv_disk_spill(d, p, 1, a[6], ta, 0.5, NO_EXP, 1);
    kvg_kv_disk_flush(d);
    ok(holds_all(d, b, 2, 6) && !kvg_kv_disk_holds(d, a[2]) && holds_all(d, a, 3, 7),
       "after a reopen the counts are rebuilt: A at its share makes room from its own");
    /* A share below one slot is one slot. */
    kvg_kv_disk_spill(d, p, 1, b[0], tb, 0.01, NO_EXP, 1);
    kvg_kv_disk_spill(d, p, 1, b[1], tb, 0.01, NO_EXP, 1);
    kvg_kv_disk_flush(d);
    s = stats(d);
    ok(holds_all(d, b, 0, 2) && holds_none(d, b, 2, 4) && holds_all(d, b, 4, 6) && holds_all(d, a, 3, 7) &&
       s.slots_used == 8, "B with a quota under one slot (one), over it already: each new block "
       "replaces its own least recently used, none of A's");
    kvg_kv_disk_close(d);
}

static void test_bad_args(kvg_kv_pool *p)
{
    kvg_kv_disk_ident id = ident_of(p, 1);
    char path[300];
    snprintf(path, sizeof path, "%s/afile", base);
    FILE *f = fopen(path, "w");
    if (f)
        fclose(f);
    ok(kvg_kv_disk_open(path, 1 << 20, 0, &id, err, sizeof err) == NULL && strstr(err, "not a directory"),
       "a file as the directory: %s", err);
    snprintf(path, sizeof path, "%s/no/such/dir", base);
    ok(kvg_kv_disk_open(path, 1 << 20, 0, &id, err, sizeof err) == NULL && strstr(err, "cannot create"),
       "a missing parent directory: %s", err);
    snprintf(path, sizeof path, "%s/small", base);
    ok(kvg_kv_disk_open(path, 4096, 0, &id, err, sizeof err) == NULL && strstr(err, "hold no block"),
       "a size without one slot: %s", err);
}

/* The prefix cache over a 4-block pool with the disk tier: a 3-block chain of tenant A
 * is evicted by tenant B's prompt, spilled, and admitted again from disk. */
static void test_prefix_cache(void)
{
    kvg_prefix_hasher *hs = kvg_prefix_hasher_new(err, sizeof err);
    kvg_kv_pool *p = kvg_kv_pool_new(&GEOM, 4, err, sizeof err);
    kvg_kv_pool *ref = kvg_kv_pool_new(&GEOM, 4, err, sizeof err);
    kvg_pc_config cfg;
    memset(&cfg, 0, sizeof cfg);
    memset(cfg.model_id, 7, sizeof cfg.model_id);
    kvg_prefix_cache *pc = kvg_pc_new(p, &cfg, err, sizeof err);
    kvg_kv_disk_ident id = ident_of(p, 7);
    kvg_kv_disk *d = open_in("pc", 16, &id);
    int32_t toks[13], toksb[13];
    uint8_t ha[3][32], hb[3][32], hab[3][32], root[32];
    size_t nb;
    int ta = kvg_pc_tenant(pc, "A", 1, 0), tb = kvg_pc_tenant(pc, "B", 1, 0);
    for (int i = 0; i < 13; i++) {
        toks[i] = i + 1;
        toksb[i] = 100 + i;
    }
    kvg_pc_salt_root(pc, hs, "A", 1, root, err, sizeof err);
    kvg_prefix_chain(hs, root, toks, 13, 4, ha, 3, &nb, err, sizeof err);
    kvg_pc_salt_root(pc, hs, "B", 1, root, err, sizeof err);
    kvg_prefix_chain(hs, root, toksb, 13, 4, hb, 3, &nb, err, sizeof err);
    kvg_prefix_chain(hs, root, toks, 13, 4, hab, 3, &nb, err, sizeof err);   /* A's text, B's salt */
    ok(kvg_pc_set_disk(pc, d, err, sizeof err) == 0, "the disk tier attaches");

    kvg_kv_seq s;
    kvg_kv_seq_init(&s);
    is_int(kvg_pc_admit(pc, &s, ta, ha, 3, 13, 0, 1, 0, err, sizeof err), 0, "A's prompt: a miss");
    for (int i = 0; i < 3; i++) {
        fill(p, s.blocks[i], 500u + (uint32_t)i);
        fill(ref, i, 500u + (uint32_t)i);
    }
    s.n_tokens = 13;
    for (int i = 0; i < 3; i++)
        kvg_pc_commit(pc, &s, i, ha[i], ta, 0, 1);
    kvg_pc_release(pc, &s, 2);
    is_int(kvg_pc_admit(pc, &s, tb, hb, 3, 13, 0, 3, 0, err, sizeof err), 0,
           "B's prompt takes the whole pool (A's blocks evicted)");
    kvg_pc_release(pc, &s, 4);
    kvg_kv_disk_flush(d);
    is_int(stats(d).blocks_written, 3, "  A's 3 blocks were spilled to disk");

    is_int(kvg_pc_admit(pc, &s, tb, hab, 3, 13, 0, 5, 0, err, sizeof err), 0,
           "A's text under tenant B: a miss (the salt is in the hash)");
    kvg_pc_release(pc, &s, 6);
    is_int(kvg_pc_admit(pc, &s, ta, ha, 3, 13, 0, 7, 0, err, sizeof err), 12,
           "A's prompt again: 12 tokens hit, read back from disk");
    ok(same(p, s.blocks[0], ref, 0) && same(p, s.blocks[1], ref, 1) && same(p, s.blocks[2], ref, 2),
       "  the blocks hold the bytes that were computed");
    kvg_pc_stats ps;
    kvg_pc_get_stats(pc, &ps);
    is_int(ps.disk_hit_tokens, 12, "  counted as disk hits");
    {
        const kvg_kv_seq *ss[1] = { &s };
        ok(kvg_pc_check(pc, ss, 1, err, sizeof err) == 0, "  the cache's invariants hold (%s)", err);
    }
    kvg_pc_release(pc, &s, 8);

    /* A restart: persist the pool's cached blocks, reopen the store, new cache. */
    is_int(kvg_pc_persist(pc), 3, "persist at stop: the 3 cached blocks queued (already stored)");
    kvg_pc_tenant_put(pc, ta);
    kvg_pc_tenant_put(pc, tb);
    kvg_pc_free(pc);
    kvg_kv_disk_close(d);
    d = open_in("pc", 16, &id);
    is_int(stats(d).restored, 3, "restart: A's 3 blocks found again");
    pc = kvg_pc_new(p, &cfg, err, sizeof err);
    kvg_pc_set_disk(pc, d, err, sizeof err);
    ta = kvg_pc_tenant(pc, "A", 1, 0);
    tb = kvg_pc_tenant(pc, "B", 1, 0);
    memset(p->data, 0, 4 * (p->stride_bytes / sizeof(float)) * sizeof(float));
    is_int(kvg_pc_admit(pc, &s, tb, hab, 3, 13, 0, 1, 0, err, sizeof err), 0,
           "after the restart tenant B still misses A's blocks");
    kvg_pc_release(pc, &s, 2);
    is_int(kvg_pc_admit(pc, &s, ta, ha, 3, 13, 0, 3, 0, err, sizeof err), 12,
           "after the restart A's first request hits 12 tokens");
    ok(same(p, s.blocks[0], ref, 0) && same(p, s.blocks[2], ref, 2), "  the same bytes");
    kvg_pc_release(pc, &s, 4);
    ok(kvg_pc_wipe_tenant(pc, "A", 1) >= 6, "wiping tenant A drops its blocks in the pool and on disk");
    is_int(kvg_pc_admit(pc, &s, ta, ha, 3, 13, 0, 5, 0, err, sizeof err), 0, "  then A misses");
    kvg_pc_release(pc, &s, 6);
    kvg_pc_tenant_put(pc, ta);
    kvg_pc_tenant_put(pc, tb);
    kvg_pc_free(pc);
    kvg_kv_disk_close(d);
    kvg_kv_pool_free(p);
    kvg_kv_pool_free(ref);
    kvg_prefix_hasher_free(hs);
}

/* The prefix cache's expiry and quota on disk (a 4-block pool, TTL 1000 ms; the pool's
 * clock the ms passed in, the store's the test's): the time a block has left goes with
 * it; a disk hit is a use, as a pool hit is (the block's TTL runs again from it); a block
 * pinned for good has no expiry on disk; a tenant's quota spans the disk's slots. */
static void test_prefix_cache_ttl(void)
{
    kvg_prefix_hasher *hs = kvg_prefix_hasher_new(err, sizeof err);
    kvg_kv_pool *p = kvg_kv_pool_new(&GEOM, 4, err, sizeof err);
    kvg_pc_config cfg;
    const int64_t t0 = 1700000000000;
    memset(&cfg, 0, sizeof cfg);
    memset(cfg.model_id, 7, sizeof cfg.model_id);
    cfg.default_ttl_ms = 1000;
    cfg.pinned_share = 0.75;
    kvg_prefix_cache *pc = kvg_pc_new(p, &cfg, err, sizeof err);
    kvg_kv_disk_ident id = ident_of(p, 7);
    kvg_kv_disk *d;
    int32_t toks[13], toksb[13];
    uint8_t ha[3][32], hb[3][32], hq[3][32], root[32];
    size_t nb;
    kvg_kv_seq s;
    int ta, tb, tq;
    atomic_store(&clk, t0);
    d = open_clk("pcttl", 16, &id);
    kvg_pc_set_disk(pc, d, err, sizeof err);
    ta = kvg_pc_tenant(pc, "A", 1, 0);
    tb = kvg_pc_tenant(pc, "B", 1, 0);
    for (int i = 0; i < 13; i++) {
        toks[i] = i + 1;
        toksb[i] = 100 + i;
    }
    kvg_pc_salt_root(pc, hs, "A", 1, root, err, sizeof err);
    kvg_prefix_chain(hs, root, toks, 13, 4, ha, 3, &nb, err, sizeof err);
    kvg_pc_salt_root(pc, hs, "B", 1, root, err, sizeof err);
    kvg_prefix_chain(hs, root, toksb, 13, 4, hb, 3, &nb, err, sizeof err);
    kvg_pc_salt_root(pc, hs, "Q", 1, root, err, sizeof err);
    kvg_prefix_chain(hs, root, toks, 13, 4, hq, 3, &nb, err, sizeof err);

    kvg_kv_seq_init(&s);
    kvg_pc_admit(pc, &s, ta, ha, 3, 13, 0, 1, 0, err, sizeof err);
    s.n_tokens = 13;
    for (int i = 0; i < 3; i++)
        kvg_pc_commit(pc, &s, i, ha[i], ta, 0, 1);
    kvg_pc_release(pc, &s, 2);                     /* A's blocks expire at 1002 */
    kvg_pc_admit(pc, &s, tb, hb, 3, 13, 0, 3, 0, err, sizeof err);
    kvg_pc_release(pc, &s, 4);
    kvg_kv_disk_flush(d);
    is_int(stats(d).blocks_written, 3, "A's blocks evicted at 3 ms with 999 ms left: on disk");
    atomic_store(&clk, t0 + 998);
    is_int(kvg_pc_admit(pc, &s, ta, ha, 3, 13, 0, 5, 0, err, sizeof err), 12,
           "  998 ms later (the store's clock) they are read back");
    kvg_pc_release(pc, &s, 6);
    is_int(kvg_pc_sweep(pc, 1005), 0, "  in the pool their TTL runs from that use (released at 6 ms): "
           "kept at 1005 ms");
    is_int(kvg_pc_sweep(pc, 1006), 3, "  expired at 1006 ms (TTL evictions: not spilled)");
    atomic_store(&clk, t0 + 999);
    is_int(kvg_pc_admit(pc, &s, ta, ha, 3, 13, 0, 1007, 0, err, sizeof err), 0,
           "on disk they expired at 999 ms: a miss");
    ok(stats(d).expired >= 1, "  counted expired on disk");
    kvg_pc_release(pc, &s, 1008);

    /* Pinned for good: persisted at a clean stop without an expiry. */
    kvg_pc_admit(pc, &s, ta, ha, 3, 13, KVG_PC_TTL_PINNED, 2000, 0, err, sizeof err);
    s.n_tokens = 13;
    for (int i = 0; i < 3; i++)
        kvg_pc_commit(pc, &s, i, ha[i], ta, KVG_PC_TTL_PINNED, 2000);
    kvg_pc_release(pc, &s, 2001);
    is_int(kvg_pc_persist(pc), 3, "A's 3 pinned blocks persisted at a stop");
    kvg_kv_disk_flush(d);
    atomic_store(&clk, t0 + 3000000);
    kvg_kv_disk_close(d);
    d = open_clk("pcttl", 16, &id);
    ok(stats(d).restored == 3 && kvg_kv_disk_holds(d, ha[0]) && kvg_kv_disk_holds(d, ha[2]),
       "  found by a restart an hour later: no expiry on disk");
    kvg_kv_disk_close(d);
    kvg_pc_tenant_put(pc, ta);
    kvg_pc_tenant_put(pc, tb);
    kvg_pc_free(pc);

    /* A tenant with a quota of 1/16: one disk slot of 16. */
    memset(p->data, 0, 4 * (p->stride_bytes / sizeof(float)) * sizeof(float));
    cfg.pinned_share = 0;
    pc = kvg_pc_new(p, &cfg, err, sizeof err);
    d = open_clk("pcttl", 16, &id);
    kvg_pc_set_disk(pc, d, err, sizeof err);
    tq = kvg_pc_tenant(pc, "Q", 1, 1.0 / 16);
    tb = kvg_pc_tenant(pc, "B", 1, 0);
    kvg_pc_admit(pc, &s, tq, hq, 3, 13, 0, 1, 0, err, sizeof err);
    s.n_tokens = 13;
    for (int i = 0; i < 3; i++)
        kvg_pc_commit(pc, &s, i, hq[i], tq, 0, 1);
    kvg_pc_release(pc, &s, 2);
    kvg_pc_admit(pc, &s, tb, hb, 3, 13, 0, 3, 0, err, sizeof err);
    kvg_pc_release(pc, &s, 4);
    kvg_kv_disk_flush(d);
    ok(stats(d).quota_evictions == 2 && kvg_kv_disk_holds(d, ha[0]) && kvg_kv_disk_holds(d, ha[2]),
       "Q's 3 evicted blocks: its disk share is 1 slot, 2 quota evictions of its own, A's kept");
    kvg_pc_tenant_put(pc, tq);
    kvg_pc_tenant_put(pc, tb);
    kvg_pc_free(pc);
    kvg_kv_disk_close(d);
    kvg_kv_pool_free(p);
    kvg_prefix_hasher_free(hs);
}

int main(void)
{
    snprintf(base, sizeof base, "%s/kvg-disk-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(base)) {
        printf("Bail out! mkdtemp\n");
        return 1;
    }
    kvg_kv_pool *p = kvg_kv_pool_new(&GEOM, 8, err, sizeof err);
    if (!p) {
        printf("Bail out! %s\n", err);
        return 1;
    }
    test_round_trip_restart(p);
    test_int8_ident(p);
    test_corrupt(p);
    test_lru_and_queue(p);
    test_wipe(p);
    test_full(p);
    test_expiry(p);
    test_version1(p);
    test_quota(p);
    test_bad_args(p);
    test_prefix_cache();
    test_prefix_cache_ttl();
    kvg_kv_pool_free(p);
    {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
        if (system(cmd) != 0)
            diag("could not remove %s", base);
    }
    return done_testing();
}
