/*
 * common.h — helpers shared by the C test programs (not part of cgru's API).
 *
 *   CHECK(call)         run a cgru call; on failure print its status and message, exit(1)
 *   rng_next(&state)    a 64-bit LCG: uniform doubles in [-1, 1), the same on every machine
 *   fill_random(...)    fill n floats or doubles from the LCG
 *   dump_*(...)         append a named array to a results file (read by tests/test_capi.py):
 *                       char name[16], int32 kind (0 float32, 1 float64, 2 int32, 3 int64),
 *                       int64 count, then count elements, native byte order
 */
#ifndef CGRU_TEST_COMMON_H
#define CGRU_TEST_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgru.h"

#define CHECK(call)                                                                            \
    do {                                                                                       \
        cgru_status_t check_status_ = (call);                                                  \
        if (check_status_ != CGRU_STATUS_SUCCESS) {                                            \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,           \
                    cgru_get_error_string(check_status_), cgru_get_last_error_message());      \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static inline double rng_next(uint64_t *state)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*state >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* n elements of data_type at p, uniform in [-scale, scale) */
static inline void fill_random(void *p, size_t n, int32_t data_type, uint64_t *state,
                               double scale)
{
    for (size_t i = 0; i < n; i++) {
        double v = scale * rng_next(state);
        if (data_type == CGRU_DATA_DOUBLE)
            ((double *)p)[i] = v;
        else
            ((float *)p)[i] = (float)v;
    }
}

static inline void *xmalloc(size_t nbytes)
{
    void *p = malloc(nbytes ? nbytes : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory (%lu bytes)\n", (unsigned long)nbytes);
        exit(1);
    }
    return p;
}

static inline void dump(FILE *f, const char *name, int32_t kind, const void *data,
                        int64_t count)
{
    static const size_t item[] = {4, 8, 4, 8};
    char padded[16] = {0};
    strncpy(padded, name, sizeof padded - 1);
    if (fwrite(padded, 1, sizeof padded, f) != sizeof padded ||
        fwrite(&kind, sizeof kind, 1, f) != 1 || fwrite(&count, sizeof count, 1, f) != 1 ||
        (count > 0 && fwrite(data, item[kind], (size_t)count, f) != (size_t)count)) {
        fprintf(stderr, "cannot write %s\n", name);
        exit(1);
    }
}

/* n elements of data_type */
static inline void dump_real(FILE *f, const char *name, int32_t data_type, const void *data,
                             size_t n)
{
    dump(f, name, data_type == CGRU_DATA_DOUBLE ? 1 : 0, data, (int64_t)n);
}

#endif /* CGRU_TEST_COMMON_H */
