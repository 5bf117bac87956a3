/* The library's version, reported by the tools and logged by the nginx module at start-up
 * so an operator can tell which build of libkvgate.a a running nginx has linked in. */
#ifndef KVG_VERSION_H
#define KVG_VERSION_H

#define KVG_VERSION_STRING "0.1.0"

/* Returns KVG_VERSION_STRING as compiled into the library (not the caller's header). */
const char *kvg_version(void);

#endif
