#include "version.h"

/* A function rather than just the macro: a binary linked against an older library
 * reports the library's version, not the one in the header it was compiled with. */
const char *kvg_version(void)
{
    return KVG_VERSION_STRING;
}
