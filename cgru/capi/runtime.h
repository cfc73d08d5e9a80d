/*
 * runtime.h — libcgru's internal interface to the Python runtime (not installed, not public).
 *
 * runtime.c starts the embedded interpreter of the environment where cgru is installed, or joins
 * the one already running in the process, and calls the functions of cgru/capi.py, which do the
 * work.  capi.c (the public entry points) only checks what it must dereference itself, packs the
 * arguments and calls cgru__py_call.
 */
#ifndef CGRU_CAPI_RUNTIME_H
#define CGRU_CAPI_RUNTIME_H

#include "cgru.h"
#include "messages.h"

/* Calls cgru.capi.<function>(*args), args built by Py_BuildValue(format, ...) (format must make
 * a tuple: "(...)").  The Python function returns (status, message, *values); the message becomes
 * the calling thread's last error message, and on success the nvalues values (ints) are stored in
 * values[].  Sets the runtime up on first use (runtime.c: SET-UP); safe from any thread, across
 * fork() and while the host finalises Python (runtime.c: FORK, FINALISATION). */
CGRU_INTERNAL cgru_status_t cgru__py_call(const char *function, long long *values, int nvalues,
                                          const char *format, ...);

#endif /* CGRU_CAPI_RUNTIME_H */
