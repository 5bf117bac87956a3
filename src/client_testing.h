/* For tests only: the client's state seen from outside (client.c). Not the library's
 * API: nothing outside t/ calls it. */
#ifndef KVG_CLIENT_TESTING_H
#define KVG_CLIENT_TESTING_H

#include "client.h"

/* Live requests (submitted, not yet DONE/ERROR/cancelled). */
size_t kvg_client_live(const kvg_client *c);

#endif
