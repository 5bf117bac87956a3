/* The disk tier of the KV cache: blocks evicted from the pool, kept in one file of
 * fixed-size slots in a directory (--kv-disk DIR, --kv-disk-size SIZE), found again by
 * their chain hash, also by the next engine started on the same directory.
 *
 * The file, DIR/kvgate-kv.slots, is n_slots = SIZE / slot_bytes slots:
 *
 *     slot i at offset i * slot_bytes:  [header: 4096 bytes][payload: block bytes, padded to 4096]
 *
 * The header (kvg_kv_disk_hdr below, little-endian) says whose block it is: the model
 * id, the KV geometry and dtype (kvg_kv_disk_ident: a slot of another model, geometry
 * or dtype is free space), the block's chain hash (prefix_hash.h), the tenant tag (the
 * chain root of the tenant's salt under the model: the hash already covers it, the tag
 * lets an operator wipe one tenant), a write sequence number (the LRU order after a
 * restart), the block's expiry (Unix ms: the store outlives the engine's monotonic
 * clock), a CRC32C of the header alone (a slot whose header does not check is free
 * space when the file is scanned) and a CRC32C of header + payload (checked on every
 * read: a torn or corrupt slot is dropped and its block recomputed, never used). A slot
 * of another format version (version 1 had no expiry) is free space.
 *
 * The pool's two rules span the store (as they span the host tier, kv_host.h):
 *   - expiry: a block keeps the expiry it had in the pool; one already past it is not
 *     written, an expired slot is never read (a miss; the slot is freed), the writer
 *     takes expired slots before evicting live ones, and opening the file drops them;
 *   - quota: a tenant with a quota (a share) holds at most that share of the slots;
 *     at its share, its own least recently used slot makes room, never another's.
 * Time is the store's clock (Unix ms; kvg_kv_disk_open_clock lets a test set it).
 *
 * Threads. The engine's scheduler thread calls spill (a cached block evicted from the
 * pool: its bytes are copied into a staging buffer at once, so the pool block can be
 * reused, and queued), the asynchronous reads below, and load (the synchronous read of
 * a lookup that missed the pool: read, checked, imported into a fresh pool block; the
 * engine uses it only with KVGATE_KV_DISK_SYNC=1). A writer thread of the store's own writes the queue out, so
 * the scheduler never waits for a disk write. The queue is bounded (staging bytes); a
 * spill that finds it full is dropped (the block is just not cached). One mutex guards
 * the index; the writer holds it only to pick a slot and to publish it, never across
 * its write. A load reads under the mutex (the writer then waits, at most one read).
 *
 * Asynchronous reads. A request whose prefix continues on disk does not read on the
 * scheduler thread: kvg_kv_disk_read_start queues the block for the store's reader
 * thread, which reads the slot outside the mutex (the slot is marked, so the writer never
 * rewrites it meanwhile) and checks it into a staging buffer of its own; the scheduler
 * polls the read (kvg_kv_disk_read_state, or sleeps on kvg_kv_disk_read_fd) and imports
 * the checked bytes into a pool block on its own thread (kvg_kv_disk_read_import). Two
 * requests wanting the same block share one read (a reference count). The staging of
 * reads is bounded like the write queue's (its own budget of the same size): a read that
 * finds it full is not started, and the block is recomputed.
 *
 * Failures never fail a request: an I/O error or a full disk (ENOSPC, EFBIG) on a write
 * drops that block, on a read it is a miss; each kind is logged once and counted. */
#ifndef KVG_KV_DISK_H
#define KVG_KV_DISK_H

#include <stddef.h>
#include <stdint.h>

#include "kv_cache.h"

#define KVG_KV_DISK_FILE        "kvgate-kv.slots"
#define KVG_KV_DISK_MAGIC       "KVGKVBLK"
#define KVG_KV_DISK_VERSION     2u    /* 2: + expires_unix_ms (1: free space) */
#define KVG_KV_DISK_HDR_BYTES   4096u
#define KVG_KV_DISK_ID_LEN      32

/* KV dtypes as stored (the pool's transfer layout, kv_cache.h kvg_kv_xfer_bytes). */
#define KVG_KV_DTYPE_F32_HOST   1u    /* the CPU pool: float32, kv_cache.h's block layout */
#define KVG_KV_DTYPE_BF16_CUDA  2u    /* the CUDA pool: BF16, kernels/kvg_kernels.h's layout */
/* The CPU pool with int8 KV (--kv-dtype int8, kv_cache.h): this plus the count of
 * float32 layers (--kv-full-precision-layers, < n_layers), so an engine restarted with
 * another dtype or another count never reads these blocks (nor they its). An int8 pool
 * whose every layer is float32 has the F32 layout, and F32_HOST. */
#define KVG_KV_DTYPE_INT8_HOST  0x49380000u    /* "I8" << 16 | full-precision layers */
/* The CUDA pool with int8 KV (kernels/kvg_kernels.h: BF16 layers, then int8 with a float
 * scale per (token, kv head)): this plus its BF16 layer count, for the same reason. A
 * pool with no int8 layer has BF16_CUDA. */
#define KVG_KV_DTYPE_INT8_CUDA  0x49430000u    /* "IC" << 16 | full-precision layers */

/* What a slot must match to be used. */
typedef struct kvg_kv_disk_ident {
    uint8_t model_id[KVG_KV_DISK_ID_LEN];
    int32_t n_layers, n_kv_heads, head_dim, block_tokens;
    uint32_t dtype;
    uint64_t payload_bytes;              /* one block as transferred */
} kvg_kv_disk_ident;

/* The slot header as stored (offsets fixed; the rest of the 4096 bytes is zero). */
typedef struct kvg_kv_disk_hdr {
    char magic[8];                       /*   0: KVG_KV_DISK_MAGIC */
    uint32_t version;                    /*   8: KVG_KV_DISK_VERSION */
    uint32_t hdr_bytes;                  /*  12: 4096 */
    uint8_t model_id[KVG_KV_DISK_ID_LEN];/*  16 */
    int32_t n_layers, n_kv_heads;        /*  48, 52 */
    int32_t head_dim, block_tokens;      /*  56, 60 */
    uint32_t dtype;                      /*  64 */
    uint32_t reserved;                   /*  68: 0 */
    uint64_t payload_bytes;              /*  72 */
    uint8_t hash[KVG_KV_DISK_ID_LEN];    /*  80: the block's chain hash */
    uint8_t tag[KVG_KV_DISK_ID_LEN];     /* 112: tenant tag (chain root) */
    uint64_t seq;                        /* 144: write sequence number (LRU order) */
    uint64_t written_unix_ms;            /* 152 */
    uint64_t expires_unix_ms;            /* 160: the block's expiry; UINT64_MAX: none */
    uint32_t hdr_crc;                    /* 168: CRC32C of bytes [0, 168) */
    uint32_t crc;                        /* 172: CRC32C of bytes [0, 172) then the payload */
} kvg_kv_disk_hdr;

/* A spill's ttl_ms for a block that never expires (pinned for good). */
#define KVG_KV_DISK_NO_EXPIRY   INT64_MAX

/* The store's clock: Unix ms. */
typedef int64_t (*kvg_kv_disk_clock_fn)(void *ctx);

typedef struct kvg_kv_disk kvg_kv_disk;

typedef struct kvg_kv_disk_stats {
    int64_t slots_total, slots_used;     /* slots, and those holding a block now */
    uint64_t slot_bytes;
    uint64_t restored;                   /* blocks found when the file was opened */
    uint64_t hits, misses;               /* load: blocks read back / lookups not found */
    uint64_t blocks_written, bytes_written, bytes_read;
    double write_seconds, read_seconds;  /* time in pwrite / pread + checks */
    uint64_t evictions;                  /* blocks overwritten by newer ones (LRU or quota) */
    uint64_t quota_evictions;            /* of those, the tenant's own (at its quota's share) */
    uint64_t expired;                    /* blocks dropped past their expiry: not written,
                                            found expired by a load, the writer or the scan */
    uint64_t dropped;                    /* spills not queued: staging full */
    uint64_t corrupt;                    /* slots dropped on a read: checksum or identity */
    uint64_t io_errors;                  /* failed reads and writes (ENOSPC included) */
    uint64_t wiped;                      /* slots dropped by kvg_kv_disk_wipe */
    int64_t pending;                     /* blocks queued for the writer now */
    uint64_t async_reads;                /* reads started for the reader thread */
    uint64_t read_staging_full;          /* reads not started: their staging was full */
    int64_t reads_in_flight;             /* reads queued or being read now */
    int64_t reads_live;                  /* reads held by requests (staged or in flight) */
} kvg_kv_disk_stats;

/* The dtype of a host pool's blocks for the ident: F32_HOST or INT8_HOST + its float32
 * layers. */
uint32_t kvg_kv_disk_host_dtype(const kvg_kv_pool *pool);
/* The same for a CUDA pool: BF16_CUDA or INT8_CUDA + its BF16 layers. */
uint32_t kvg_kv_disk_cuda_dtype(const kvg_kv_pool *pool);

/* Opens (creating DIR's file if needed) a store of size_bytes, scans the slot headers
 * and indexes those of this identity. staging_bytes bounds the write queue (0: a
 * quarter of size_bytes, at least 4 slots, at most 256 MiB). NULL with err (naming the
 * directory) when DIR is not a writable directory, the size holds no slot, or another
 * engine has the file open. A file that cannot be extended to its size is not an error
 * (logged; writes past its end fail later and are counted). */
kvg_kv_disk *kvg_kv_disk_open(const char *dir, uint64_t size_bytes, uint64_t staging_bytes,
                              const kvg_kv_disk_ident *id, char *err, size_t err_len);
/* The same with the store's clock (NULL: CLOCK_REALTIME), for tests: it is read from the
 * caller's thread and the writer's, under the store's lock. */
kvg_kv_disk *kvg_kv_disk_open_clock(const char *dir, uint64_t size_bytes, uint64_t staging_bytes,
                                    const kvg_kv_disk_ident *id, kvg_kv_disk_clock_fn clock,
                                    void *clock_ctx, char *err, size_t err_len);
/* Writes out what is queued, stops the writer, closes the file. */
void kvg_kv_disk_close(kvg_kv_disk *d);

/* Queues pool block `block` (bytes copied out now) under hash and tenant tag, with its
 * tenant's quota (a share of the slots, 0: none) and the time it has left (ms from now;
 * KVG_KV_DISK_NO_EXPIRY: none). wait: 0, drop it when the staging is full; 1, wait for
 * room (shutdown). 0 when queued or already stored (then its expiry is extended to this
 * one's, in the index only), -1 when dropped, expired (ttl_ms <= 0) or the export failed. */
int kvg_kv_disk_spill(kvg_kv_disk *d, const kvg_kv_pool *pool, int32_t block,
                      const uint8_t hash[KVG_KV_DISK_ID_LEN], const uint8_t tag[KVG_KV_DISK_ID_LEN],
                      double quota, int64_t ttl_ms, int wait);
/* The same from a block's payload in host memory (`bytes` of it: the pool's transfer
 * size; a slot of the host tier, kv_host.h), copied now. */
int kvg_kv_disk_spill_bytes(kvg_kv_disk *d, const void *payload, size_t bytes,
                            const uint8_t hash[KVG_KV_DISK_ID_LEN], const uint8_t tag[KVG_KV_DISK_ID_LEN],
                            double quota, int64_t ttl_ms, int wait);
/* Reads the block of hash (which must carry tag) into pool block `block`: 0, or -1
 * when it is not stored, has expired (the slot is freed), fails its checks (the slot is
 * dropped) or cannot be read. A block still queued is served from its staging copy. */
int kvg_kv_disk_load(kvg_kv_disk *d, kvg_kv_pool *pool, int32_t block,
                     const uint8_t hash[KVG_KV_DISK_ID_LEN], const uint8_t tag[KVG_KV_DISK_ID_LEN]);
/* An asynchronous read (see above): shared by the requests waiting for one block. */
typedef struct kvg_kv_disk_read kvg_kv_disk_read;
enum { KVG_KV_DISK_READ_PENDING = 0, KVG_KV_DISK_READ_DONE = 1, KVG_KV_DISK_READ_FAILED = 2 };
/* Starts reading the block of hash (which must carry tag), or joins the read of it already
 * started; a block still in the write queue is copied from its staging copy now (DONE at
 * once). The caller's reference (drop it with kvg_kv_disk_read_put), or NULL when the block
 * is not stored (a miss) or the reads' staging is full. */
kvg_kv_disk_read *kvg_kv_disk_read_start(kvg_kv_disk *d, const uint8_t hash[KVG_KV_DISK_ID_LEN],
                                         const uint8_t tag[KVG_KV_DISK_ID_LEN]);
/* PENDING (queued or being read), DONE (read and checked) or FAILED (gone meanwhile,
 * corrupt, an I/O error: the block is a miss and is recomputed). */
int kvg_kv_disk_read_state(kvg_kv_disk *d, const kvg_kv_disk_read *r);
/* A DONE read's bytes into pool block `block` (a memcpy into a host pool; a device pool's
 * transfer hook from pageable memory, complete when it returns): 0, or -1 (not DONE, or
 * the import failed: a miss). */
int kvg_kv_disk_read_import(kvg_kv_disk *d, const kvg_kv_disk_read *r, kvg_kv_pool *pool, int32_t block);
/* Drops a reference (NULL: nothing); the last one frees the staging, also of a read not
 * done yet (one being read is freed by the reader when it ends). */
void kvg_kv_disk_read_put(kvg_kv_disk *d, kvg_kv_disk_read *r);
/* An eventfd the reader signals each time a read ends (the scheduler's loop sleeps on it
 * with its other descriptors and reads it to clear it), or -1. */
int kvg_kv_disk_read_fd(const kvg_kv_disk *d);

/* Whether hash is stored or queued. */
int kvg_kv_disk_holds(kvg_kv_disk *d, const uint8_t hash[KVG_KV_DISK_ID_LEN]);
/* Drops every block of a tenant tag, stored or queued (their headers are zeroed, so a
 * restart cannot find them). The count of blocks dropped. */
int64_t kvg_kv_disk_wipe(kvg_kv_disk *d, const uint8_t tag[KVG_KV_DISK_ID_LEN]);
/* Waits until the writer has written everything queued before the call. */
void kvg_kv_disk_flush(kvg_kv_disk *d);
void kvg_kv_disk_get_stats(kvg_kv_disk *d, kvg_kv_disk_stats *out);
/* The store's file path. */
const char *kvg_kv_disk_path(const kvg_kv_disk *d);

#endif
