/* The library's version, logged by the nginx module when nginx loads it ("kvgate: module
 * loaded, libkvgate 0.1.0") so an operator can tell which build of libkvgate.a a running
 * nginx has linked in. Kept equal to debian/changelog's upstream version. */
#ifndef KVG_VERSION_H
#define KVG_VERSION_H

#define KVG_VERSION_STRING "0.1.0"

/* Returns KVG_VERSION_STRING as compiled into the library (not the caller's header). */
const char *kvg_version(void);

#endif
