/*
 * messages.c — the calling thread's last error message (cgru_get_last_error_message), set by
 * the entry points (capi.c) and by the Python runtime's calls (runtime.c).
 */
#include <stdarg.h>
#include <stdio.h>

#include "cgru.h"
#include "messages.h"

static _Thread_local char last_message[1024];

cgru_status_t cgru__fail(cgru_status_t status, const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    vsnprintf(last_message, sizeof last_message, format, ap);
    va_end(ap);
    return status;
}

void cgru__clear_message(void)
{
    last_message[0] = '\0';
}

CGRU_API const char *cgru_get_last_error_message(void)
{
    return last_message;
}
