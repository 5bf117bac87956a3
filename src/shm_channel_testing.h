/* For tests only: the consumer's two halves of kvg_shm_try_pop, peek and consume
 * (shm_channel.c), which the unit test drives apart. Not the library's API: nothing
 * outside t/ calls these (the engine and the client pop with kvg_shm_try_pop). */
#ifndef KVG_SHM_CHANNEL_TESTING_H
#define KVG_SHM_CHANNEL_TESTING_H

#include "shm_channel.h"

/* Consumer: 0 with the oldest message in *m (not released; peeking again
 * returns it again), KVG_SHM_EMPTY, or -1 on a corrupt ring. */
int kvg_shm_peek(kvg_shm_ring *r, kvg_shm_msg *m, char *err, size_t err_len);

/* Consumer: releases the message returned by the last kvg_shm_peek. */
int kvg_shm_consume(kvg_shm_ring *r, char *err, size_t err_len);

#endif
