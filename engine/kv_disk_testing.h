/* For tests only: a gate on the disk tier's reader thread (kv_disk.c). Not the engine's
 * API: nothing outside t/ calls it. */
#ifndef KVG_KV_DISK_TESTING_H
#define KVG_KV_DISK_TESTING_H

#include "kv_disk.h"

/* hold != 0: the reader starts no read (those queued stay PENDING) until called again
 * with 0. Lets a test keep a request waiting for its reads for as many steps as it likes,
 * without timing. */
void kvg_kv_disk_hold_reads(kvg_kv_disk *d, int hold);

#endif
