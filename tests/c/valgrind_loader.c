/*
 * valgrind_loader.c — exercises glibc's dynamic loader the way a libcgru program does (dlopen
 * of a library with dependencies and RPATHs, a failing dlopen, dlsym misses whose messages are
 * never read, dlclose, a thread whose TLS the loader allocates), and allocates nothing itself:
 * every block left at exit belongs to the loader.  tests/test_capi.py runs it under the
 * repository's valgrind command counting every leak kind as an error, so that what
 * tests/c/valgrind.supp must cover does not depend on how a machine's glibc classifies those
 * blocks.  With "leak" as the first argument it also loses a block of its own, which must
 * still be reported.
 *
 *   cc -std=c99 valgrind_loader.c -o valgrind_loader -ldl -pthread
 *   ./valgrind_loader [leak] LIBRARY...
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *volatile lost;   /* the "leak" mode's block, overwritten so it is lost */

static void *thread_main(void *arg)
{
    return dlsym(arg, "cgru_no_such_symbol_in_a_thread");   /* a miss in another thread */
}

int main(int argc, char **argv)
{
    int first = 1, failures = 0;
    if (argc > 1 && strcmp(argv[1], "leak") == 0) {
        lost = malloc(123);
        lost = NULL;
        first = 2;
    }
    if (dlopen("libcgru-no-such-library.so.0", RTLD_NOW) != NULL)
        failures++;
    if (dlsym(RTLD_DEFAULT, "cgru_no_such_symbol") != NULL)   /* message never read */
        failures++;
    for (int i = first; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW | RTLD_GLOBAL);
        if (h == NULL) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        pthread_t thread;
        if (pthread_create(&thread, NULL, thread_main, h) != 0 ||
            pthread_join(thread, NULL) != 0)
            failures++;
        if (i == first)
            dlclose(h);                                       /* the others stay loaded */
    }
    void *m = dlopen("libm.so.6", RTLD_LAZY);
    if (m != NULL)
        dlclose(m);
    printf("loader: %s\n", failures ? "FAILED" : "OK");
    return failures != 0;
}
