/* libFuzzer target for the shared-memory channel: the input is a region from a
 * hostile peer. Mode 0 takes the bytes as the whole region; mode 1 lays out a
 * valid region first and overwrites its indices and slots with the bytes, so
 * that most inputs get past attach and exercise pop. Either way attach + pop
 * (and a push) must end in success, empty/full or an error, never a bad access;
 * every accepted message must be within the ring's limits. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "shm_channel.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void drain(kvg_shm_ring *r)
{
    static unsigned char buf[1 << 12];
    kvg_shm_msg m;
    char err[160];

    for (int i = 0; i < 64; i++) {
        int rc = kvg_shm_try_pop(r, &m, buf, sizeof buf, err, sizeof err);
        if (rc != 0)
            break;
        if (m.body_len > KVG_SHM_BODY_MAX || m.payload_len > kvg_shm_max_payload(r))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const kvg_shm_caps caps = { 8, 4, 512, 256 };
    kvg_shm h;
    char err[160];
    unsigned char *mem;
    size_t n, in_size = size;

    if (size < 1)
        return 0;
    if (data[0] & 1) {
        size_t rs = kvg_shm_region_size(&caps), skip = sizeof(kvg_shm_header);
        mem = aligned_alloc(64, (rs + 63) & ~(size_t)63);
        if (!mem || kvg_shm_init(mem, rs, &caps, err, sizeof err) != 0)
            abort();
        n = size - 1 < rs - skip ? size - 1 : rs - skip;
        memcpy(mem + skip, data + 1, n);
        size = rs;
    } else {
        size -= 1;
        mem = aligned_alloc(64, (size + 64) & ~(size_t)63);
        if (!mem)
            return 0;
        memcpy(mem, data + 1, size);
    }
    if (kvg_shm_attach(&h, mem, size, err, sizeof err) == 0) {
        drain(&h.sq);
        drain(&h.cq);
        kvg_shm_try_push(&h.cq, KVG_MSG_ERROR, "x", 1, data, in_size < 100 ? in_size : 100, err, sizeof err);
        kvg_shm_try_push(&h.sq, KVG_MSG_CANCEL, "y", 1, NULL, 0, err, sizeof err);
        drain(&h.cq);
    }
    free(mem);
    return 0;
}
