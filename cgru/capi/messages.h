/*
 * messages.h — libcgru's internal interface to the calling thread's last error message
 * (messages.c): used by the entry points (capi.c) and the Python runtime (runtime.c), so that
 * neither depends on the other for it.  Not installed, not public.
 */
#ifndef CGRU_CAPI_MESSAGES_H
#define CGRU_CAPI_MESSAGES_H

#include "cgru.h"

#if defined(__GNUC__) && __GNUC__ >= 4
#  define CGRU_INTERNAL __attribute__((visibility("hidden")))
#else
#  define CGRU_INTERNAL
#endif

/* Sets the calling thread's last error message (printf-style) and returns status. */
CGRU_INTERNAL cgru_status_t cgru__fail(cgru_status_t status, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Sets the calling thread's last error message to "". */
CGRU_INTERNAL void cgru__clear_message(void);

#endif /* CGRU_CAPI_MESSAGES_H */
