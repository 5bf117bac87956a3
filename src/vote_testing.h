/* For tests only: a vote's state seen from outside (vote.c), which the unit test
 * checks. Not the library's API: nothing outside t/ calls these (the gateway acts on
 * kvg_sc_finished's actions). */
#ifndef KVG_VOTE_TESTING_H
#define KVG_VOTE_TESTING_H

#include "vote.h"

/* 1 once the vote is decided (it stays so). */
int kvg_sc_decided(const kvg_sc *s);

/* 1 when sample has been drawn (started); 0 too for one out of range. */
int kvg_sc_sample_drawn(const kvg_sc *s, unsigned sample);

#endif
