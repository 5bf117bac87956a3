/* For tests only: the error type of a status alone (api_error.c), which the unit test
 * checks against the table in api_error.h. Not the library's API: nothing outside t/
 * calls it (kvg_api_error_set fills the type). */
#ifndef KVG_API_ERROR_TESTING_H
#define KVG_API_ERROR_TESTING_H

#include "api_error.h"

/* The "type" for an HTTP status (never NULL). */
const char *kvg_api_error_type(int status);

#endif
