/*
 * runtime.c — the Python runtime behind libcgru: start it (embedded) or join it, call
 * cgru/capi.py, and keep the process's fork() and the interpreter's finalisation from
 * stranding a call.
 *
 * SET-UP.  libcgru does not link libpython.  The first call sets the runtime up, once, while
 * every other call waits for it: it looks for the Python C API in the process (dlsym
 * RTLD_DEFAULT): found when libcgru is loaded into a Python process, or into a program linked
 * with libpython.  Otherwise it dlopens libpython (RTLD_GLOBAL, so that the extension modules
 * numpy and cgru import resolve against it).  If that interpreter is not initialised yet,
 * libcgru initialises it with the program name set to the python executable of cgru's
 * environment, so that Python finds that environment's prefix, site-packages and .pth files (a
 * virtual environment included) exactly as if that python had been started; it then puts the
 * directory above libcgru's package on sys.path (so the cgru next to libcgru is the one
 * imported) and releases the GIL.  Then, under the GIL, it imports cgru.capi (kept for the
 * process's life), registers the hooks below with the interpreter, and runs one forward of a
 * one-unit GRU, so that what cgru loads lazily on its first computation (SciPy's BLAS binding,
 * which registers fork handlers) is loaded during the set-up too.  A failed set-up is final:
 * every later call returns its status and message.  Every call then takes the GIL with
 * PyGILState_Ensure; the engine releases it inside its kernels, so calls from several threads
 * overlap.  The interpreter libcgru starts is never finalised by libcgru.
 *
 * THREAD STATES.  A host thread without a Python thread state gets one from libcgru at its first
 * call, kept until the thread ends (a pthread key's destructor clears it under the GIL and
 * deletes it): PyGILState_Ensure/Release would otherwise make and delete one in every call.
 * CPython makes and deletes thread states under a lock of its runtime that a fork must not
 * catch held: the child's PyOS_AfterFork_Child waits for it forever (CPython 3.11 and older do
 * not take it around a fork; a thread that made one per call hit it about once in a few
 * thousand forks).  libcgru therefore makes and deletes them only under thread_states_lock,
 * without the GIL, and every fork it sees (its interpreter handlers, and its os.register_at_fork
 * callbacks for Python's own forks) holds that lock, after the GIL, across the fork.  Threads
 * Python itself starts and ends are CPython's concern (3.12 takes its lock around a fork).
 *
 * FINALISATION.  An interpreter libcgru joined belongs to the host, which may finalise it
 * (Py_Finalize) while other threads are inside cgru calls.  CPython ends a thread that takes
 * the GIL once finalisation is under way, so such a call would never return.  libcgru counts
 * the calls in flight, and at set-up it registers a callback with the interpreter's atexit
 * module; Py_Finalize runs atexit callbacks first, while the interpreter is whole.  The
 * callback marks the runtime finalised (calls admitted from then on return
 * CGRU_STATUS_RUNTIME_UNAVAILABLE without touching Python) and waits, with the GIL released,
 * until every call in flight has returned; only then does Py_Finalize go on.  The finalised
 * state is final: NumPy cannot be initialised a second time in one process, so a later
 * interpreter (Py_Initialize again) is never used.  (atexit callbacks run last registered
 * first: those registered after libcgru's set-up may still call cgru, those registered before
 * it are refused.)  Not covered: a Py_Finalize that starts while the process's very first cgru call has not yet
 * taken the GIL (the callback is not registered yet), and finalisations that skip the atexit
 * callbacks; every call also checks Py_IsInitialized, so a call made after such a finalisation
 * still returns CGRU_STATUS_RUNTIME_UNAVAILABLE.
 *
 * FORK.  A C fork() copies only the forking thread.  Had another thread held the GIL (or been
 * half-way through the set-up), the child would wait for it forever.  libcgru does around a C
 * fork what CPython's os.fork does around its own, with two sets of pthread_atfork handlers:
 *  - the state handlers (registered when libcgru is loaded, so they see every fork) hold
 *    libcgru's lock across the fork, so the child's copy of the state is consistent; in the
 *    child they reset the count of calls in flight (the parent's other threads do not exist
 *    there) and, when another thread was setting the runtime up, mark the runtime failed: the
 *    child's calls return CGRU_STATUS_RUNTIME_UNAVAILABLE saying so (the half-started
 *    interpreter cannot be finished), they never wait for a thread that is not there.  A fork
 *    never waits for a set-up in progress (the set-up may need what the forking thread holds:
 *    the GIL, or the lock glibc before 2.36 holds while fork handlers run).
 *  - the interpreter handlers (registered at the end of the set-up, after the libraries cgru
 *    loads registered theirs, so that they run first before a fork and last after it, like
 *    os.fork's work around fork()): before the fork, take the GIL (PyGILState_Ensure: no other
 *    thread holds it at the fork, and a thread that already holds it takes it recursively) and
 *    run PyOS_BeforeFork; in the parent PyOS_AfterFork_Parent, in the child
 *    PyOS_AfterFork_Child (Python's public re-initialisation after a C-level fork: its locks, its
 *    thread states, the os.register_at_fork callbacks of the modules loaded); then release the
 *    GIL.  The fork counts as a call in flight, so a finalisation waits for it.
 * A fork Python itself performs (os.fork, or a C extension that calls PyOS_BeforeFork) already
 * does all this: a before-fork callback libcgru registers with os.register_at_fork marks the
 * forking thread, and the interpreter handlers leave that fork alone.  A C fork() called
 * through ctypes from a Python process releases the GIL first: it is a C fork and is handled.
 * Each fork is handled on its own thread (thread-local marks), so concurrent forks are safe.
 * Not covered: the GIL is taken inside a fork handler, so with a glibc older than 2.36 (which
 * holds its handler-list lock while handlers run) a fork deadlocks if another thread holds the
 * GIL and meanwhile registers fork handlers (dlopen of such a library, e.g. an import of a
 * BLAS-backed extension module) — in a program that is not Python itself, only the set-up
 * does that, and a fork never waits for the set-up.
 *
 * Which python:    $CGRU_PYTHON, else <prefix>/bin/python3.X when libcgru lives in
 *                  <prefix>/lib/python3.X/site-packages/cgru/, else the python that built it.
 * Which libpython: $CGRU_LIBPYTHON, else <that python's real prefix>/lib/<soname>, else the path
 *                  recorded at build time, else <soname> through the dynamic loader's search.
 */
#define _GNU_SOURCE
#include <Python.h>

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"

#ifndef CGRU_BUILD_PYTHON
#  define CGRU_BUILD_PYTHON ""          /* sys.executable of the build */
#endif
#ifndef CGRU_BUILD_LIBPYTHON
#  define CGRU_BUILD_LIBPYTHON ""       /* LIBDIR/INSTSONAME of the build's Python */
#endif
#ifndef CGRU_BUILD_LIBPYTHON_SONAME
#  define CGRU_BUILD_LIBPYTHON_SONAME "" /* INSTSONAME, e.g. libpython3.11.so.1.0 */
#endif

#define CAPI_MODULE "cgru.capi"

/* ---- the Python C API, resolved at run time ---------------------------------------------- */
#define PY_FUNCTIONS(X)                                                                        \
    X(Py_IsInitialized) X(Py_GetVersion) X(PyPreConfig_InitPythonConfig) X(Py_PreInitialize)    \
    X(PyConfig_InitPythonConfig)                                                               \
    X(PyConfig_SetBytesString) X(PyConfig_Clear) X(Py_InitializeFromConfig)                     \
    X(PyStatus_Exception) X(PyEval_SaveThread) X(PyEval_RestoreThread) X(PyGILState_Ensure)     \
    X(PyGILState_Release) X(PyGILState_Check) X(PyGILState_GetThisThreadState)                  \
    X(PyImport_ImportModule) X(PyObject_GetAttrString) X(PyObject_CallObject) X(PyObject_Call)  \
    X(Py_BuildValue) X(Py_VaBuildValue) X(Py_DecRef) X(PyTuple_Size) X(PyTuple_GetItem)         \
    X(PyLong_AsLongLong) X(PyUnicode_AsUTF8) X(PyErr_Occurred) X(PyErr_Fetch) X(PyErr_Clear)    \
    X(PyObject_Str) X(PySys_GetObject) X(PyList_Insert) X(PyList_Append)                        \
    X(PyUnicode_DecodeFSDefault) X(PySequence_Contains) X(PyErr_ExceptionMatches)               \
    X(PyExc_MemoryError) X(PyCMethod_New)                                                      \
    X(PyOS_BeforeFork) X(PyOS_AfterFork_Parent) X(PyOS_AfterFork_Child)                       \
    X(PyInterpreterState_Main) X(PyThreadState_New) X(PyThreadState_Clear)                     \
    X(PyThreadState_Delete)

#define PY_DECLARE(name) __typeof__(name) *name;
static struct { PY_FUNCTIONS(PY_DECLARE) } py;
#undef PY_DECLARE

/* ---- the runtime's state ------------------------------------------------------------------ */
/* NONE → STARTING (the first call sets up) → READY or FAILED; READY (or STARTING) → FINALISED
 * when the interpreter's finalisation begins.  FAILED and FINALISED are final. */
enum runtime_state {
    RUNTIME_NONE,
    RUNTIME_STARTING,
    RUNTIME_READY,
    RUNTIME_FAILED,
    RUNTIME_FINALISED
};

/* Lock order: the GIL before runtime_lock; nothing waits for the GIL holding runtime_lock. */
static pthread_mutex_t runtime_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t runtime_changed = PTHREAD_COND_INITIALIZER; /* state, calls_in_flight */
static enum runtime_state runtime_state = RUNTIME_NONE;
static pthread_t setup_thread;          /* the thread setting up (RUNTIME_STARTING) */
static int python_up;                   /* the set-up found or started the interpreter */
static long calls_in_flight;            /* admitted calls (and forks) not yet finished */
static int state_handlers_registered;   /* the fork state handlers (at load) */

static _Thread_local long calls_on_this_thread;  /* this thread's share of calls_in_flight */
static _Thread_local int python_forking;         /* Python's own fork protocol runs here */
static _Thread_local int fork_took_gil;          /* this thread's fork: the handlers' GIL */
static _Thread_local PyGILState_STATE fork_gil;
static _Thread_local int fork_made_thread_state; /* ... and this thread's Python thread state */
static _Thread_local int fork_holds_thread_states; /* this thread's fork holds thread_states_lock */

/* The Python thread states libcgru makes for the host's threads (see THREAD STATES).  Lock
 * order: the GIL before thread_states_lock; nothing waits for the GIL holding it. */
static pthread_mutex_t thread_states_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t thread_state_key;  /* a thread's own, deleted when the thread ends */

/* Written by the set-up thread before the state leaves STARTING (or by a forked child's state
 * handler), read under runtime_lock after. */
static cgru_status_t start_status = CGRU_STATUS_SUCCESS;
static char start_message[1024];
static int embedded;                  /* 1: libcgru initialised the interpreter */
static char package_parent[PATH_MAX]; /* the directory holding libcgru's package directory */
static PyObject *capi_module;         /* cgru.capi, imported by the set-up */

#define FINALISED_MESSAGE                                                                      \
    "the Python runtime libcgru was using is being finalised or was finalised (Py_Finalize); "  \
    "libcgru cannot use Python again in this process, even if it is initialised again (NumPy, " \
    "which cgru needs, cannot be loaded twice in one process): expected every cgru call "       \
    "before Py_Finalize"

#define FORKED_DURING_SETUP_MESSAGE                                                            \
    "this process was forked while another thread of its parent was setting up libcgru's "      \
    "Python runtime (the parent's first cgru call); the child cannot finish that half-started " \
    "runtime: expected the fork before the parent's first cgru call or after it returned"

/* ---- small helpers ------------------------------------------------------------------------ */
static void start_fail(cgru_status_t status, const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    vsnprintf(start_message, sizeof start_message, format, ap);
    va_end(ap);
    start_status = status;
}

static int is_file(const char *path, int mode)
{
    return path != NULL && path[0] != '\0' && access(path, mode) == 0;
}

/* dirname in place; "" when there is no '/' */
static void strip_last_component(char *path)
{
    char *slash = strrchr(path, '/');
    if (slash == NULL)
        path[0] = '\0';
    else if (slash == path)
        path[1] = '\0';
    else
        *slash = '\0';
}

static const char *last_component(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The package directory of libcgru (realpath of its directory), or "" if unknown. */
static void find_package_dir(char *out, size_t n)
{
    Dl_info info;
    char resolved[PATH_MAX];
    out[0] = '\0';
    if (dladdr((void *)&cgru_get_version, &info) == 0 || info.dli_fname == NULL)
        return;
    if (realpath(info.dli_fname, resolved) == NULL)
        return;
    strip_last_component(resolved);
    snprintf(out, n, "%s", resolved);
}

/* <prefix>/bin/python3.X when package_dir is <prefix>/lib/python3.X/site-packages/cgru. */
static int python_beside_package(const char *package_dir, char *out, size_t n)
{
    char path[PATH_MAX], version[64];
    snprintf(path, sizeof path, "%s", package_dir);
    strip_last_component(path);                       /* …/site-packages */
    if (strcmp(last_component(path), "site-packages") != 0)
        return 0;
    strip_last_component(path);                       /* …/lib/python3.X */
    snprintf(version, sizeof version, "%s", last_component(path));
    if (strncmp(version, "python", 6) != 0)
        return 0;
    strip_last_component(path);                       /* …/lib */
    strip_last_component(path);                       /* <prefix> */
    const char *names[] = {version, "python3", "python"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if ((size_t)snprintf(out, n, "%s/bin/%s", path, names[i]) < n && is_file(out, X_OK))
            return 1;
    }
    return 0;
}

/* The python executable whose environment to run; "" lets Python choose (its defaults). */
static cgru_status_t choose_python(const char *package_dir, char *out, size_t n)
{
    const char *env = getenv("CGRU_PYTHON");
    out[0] = '\0';
    if (env != NULL && env[0] != '\0') {
        if (!is_file(env, X_OK)) {
            start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE,
                       "CGRU_PYTHON=%s: not an executable file; expected the python of the "
                       "environment where cgru is installed", env);
            return start_status;
        }
        snprintf(out, n, "%s", env);
        return CGRU_STATUS_SUCCESS;
    }
    if (package_dir[0] != '\0' && python_beside_package(package_dir, out, n))
        return CGRU_STATUS_SUCCESS;
    if (is_file(CGRU_BUILD_PYTHON, X_OK))
        snprintf(out, n, "%s", CGRU_BUILD_PYTHON);
    return CGRU_STATUS_SUCCESS;
}

/* dlopen libpython (see the file comment for the order); NULL with start_message set. */
static void *open_libpython(const char *python)
{
    char path[PATH_MAX], real[PATH_MAX];
    const char *env = getenv("CGRU_LIBPYTHON");
    const char *soname = CGRU_BUILD_LIBPYTHON_SONAME;
    void *h;
    if (env != NULL && env[0] != '\0') {
        h = dlopen(env, RTLD_NOW | RTLD_GLOBAL);
        if (h == NULL)
            start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE, "CGRU_LIBPYTHON=%s: cannot load it (%s)",
                       env, dlerror());
        return h;
    }
    if (python[0] != '\0' && soname[0] != '\0' && realpath(python, real) != NULL) {
        strip_last_component(real);                   /* <real prefix>/bin */
        strip_last_component(real);                   /* <real prefix> */
        if ((size_t)snprintf(path, sizeof path, "%s/lib/%s", real, soname) < sizeof path &&
            is_file(path, R_OK) && (h = dlopen(path, RTLD_NOW | RTLD_GLOBAL)) != NULL)
            return h;
    }
    if (is_file(CGRU_BUILD_LIBPYTHON, R_OK) &&
        (h = dlopen(CGRU_BUILD_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL)) != NULL)
        return h;
    if (soname[0] != '\0' && (h = dlopen(soname, RTLD_NOW | RTLD_GLOBAL)) != NULL)
        return h;
    start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE,
               "cannot load the Python library (tried beside %s, %s and %s): %s; set "
               "CGRU_LIBPYTHON to the libpython of the environment where cgru is installed",
               python[0] ? python : "(no python found)",
               CGRU_BUILD_LIBPYTHON[0] ? CGRU_BUILD_LIBPYTHON : "(none recorded)",
               soname[0] ? soname : "(no soname recorded)", dlerror());
    return NULL;
}

/* str() of the pending Python exception, cleared; "" if none. */
static void take_python_error(char *out, size_t n)
{
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    out[0] = '\0';
    if (py.PyErr_Occurred() == NULL)
        return;
    py.PyErr_Fetch(&type, &value, &tb);
    PyObject *text = value ? py.PyObject_Str(value) : (type ? py.PyObject_Str(type) : NULL);
    const char *s = text ? py.PyUnicode_AsUTF8(text) : NULL;
    snprintf(out, n, "%s", s ? s : "(unprintable Python exception)");
    if (s == NULL)
        py.PyErr_Clear();
    if (text) py.Py_DecRef(text);
    if (type) py.Py_DecRef(type);
    if (value) py.Py_DecRef(value);
    if (tb) py.Py_DecRef(tb);
}

/* sys.path.insert(0, dir) (front) or sys.path.append(dir), unless dir is there already (a
 * joined interpreter keeps what an earlier call added); needs the GIL. */
static void add_to_sys_path(const char *dir, int front)
{
    PyObject *path = py.PySys_GetObject("path");    /* borrowed */
    PyObject *item = dir[0] ? py.PyUnicode_DecodeFSDefault(dir) : NULL;
    if (path != NULL && item != NULL && py.PySequence_Contains(path, item) == 0) {
        if ((front ? py.PyList_Insert(path, 0, item) : py.PyList_Append(path, item)) != 0)
            py.PyErr_Clear();
    } else {
        py.PyErr_Clear();
    }
    if (item) py.Py_DecRef(item);
}

/* ---- starting -------------------------------------------------------------------------- */
static cgru_status_t load_symbols(void *handle)
{
#define PY_LOAD(name)                                                                          \
    if ((*(void **)&py.name = dlsym(handle, #name)) == NULL) {                                 \
        start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE,                                            \
                   "the Python library lacks %s (built for Python %d.%d)", #name,              \
                   PY_MAJOR_VERSION, PY_MINOR_VERSION);                                        \
        return start_status;                                                                   \
    }
    PY_FUNCTIONS(PY_LOAD)
#undef PY_LOAD
    /* libcgru is compiled against this Python's headers (PyConfig's layout among them) */
    char want[32];
    snprintf(want, sizeof want, "%d.%d.", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    const char *have = py.Py_GetVersion();
    if (strncmp(have, want, strlen(want)) != 0) {
        start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE,
                   "libcgru was built for Python %d.%d but the Python in this process is %.20s",
                   PY_MAJOR_VERSION, PY_MINOR_VERSION, have);
        return start_status;
    }
    return CGRU_STATUS_SUCCESS;
}

static void initialize_embedded(const char *python)
{
    PyPreConfig preconfig;
    PyConfig config;
    PyStatus status;
    /* leave the host program's locale and environment alone (no setlocale, no LC_CTYPE
     * coercion); Python picks UTF-8 mode itself under the "C" locale */
    py.PyPreConfig_InitPythonConfig(&preconfig);
    preconfig.configure_locale = 0;
    preconfig.coerce_c_locale = 0;
    status = py.Py_PreInitialize(&preconfig);
    if (py.PyStatus_Exception(status)) {
        start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE, "cannot pre-initialise Python: %s",
                   status.err_msg ? status.err_msg : "?");
        return;
    }
    py.PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0;   /* the host program owns its signals */
    config.parse_argv = 0;
    if (python[0] != '\0') {
        status = py.PyConfig_SetBytesString(&config, &config.program_name, python);
        if (py.PyStatus_Exception(status)) {
            py.PyConfig_Clear(&config);
            start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE, "cannot configure Python: %s",
                       status.err_msg ? status.err_msg : "?");
            return;
        }
    }
    status = py.Py_InitializeFromConfig(&config);
    py.PyConfig_Clear(&config);
    if (py.PyStatus_Exception(status)) {
        start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE, "cannot start Python (%s): %s",
                   python[0] ? python : "default configuration",
                   status.err_msg ? status.err_msg : "?");
        return;
    }
    embedded = 1;
    add_to_sys_path(package_parent, 1);
    py.PyEval_SaveThread();              /* release the GIL; every call takes it again */
}


/* ---- the state's lock -------------------------------------------------------------------- */
static void lock_state(void) { pthread_mutex_lock(&runtime_lock); }
static void unlock_state(void) { pthread_mutex_unlock(&runtime_lock); }

/* runtime_state = state (with runtime_lock held) and wake the waiters. */
static void set_state(enum runtime_state state)
{
    runtime_state = state;
    pthread_cond_broadcast(&runtime_changed);
}

/* A call (or a fork) has finished: one fewer in flight. */
static void leave(void)
{
    lock_state();
    calls_in_flight--;
    calls_on_this_thread--;
    if (calls_in_flight == 0)
        pthread_cond_broadcast(&runtime_changed);
    unlock_state();
}

/* Count a call (or a fork, or a thread's end) in flight if the runtime is ready: 1, else 0. */
static int enter_if_ready(void)
{
    lock_state();
    int ready = runtime_state == RUNTIME_READY;
    if (ready) {
        calls_in_flight++;
        calls_on_this_thread++;
    }
    unlock_state();
    return ready;
}

/* ---- thread states ------------------------------------------------------------------------ */
/* Give this thread a Python thread state of its own unless it has one (a Python thread, the
 * thread that started the interpreter, or one libcgru made earlier): made outside the GIL, under
 * thread_states_lock, and kept until the thread ends.  0, or -1 when Python could not make
 * one (out of memory). */
static int have_thread_state(void)
{
    if (py.PyGILState_GetThisThreadState() != NULL)
        return 0;
    pthread_mutex_lock(&thread_states_lock);
    PyThreadState *thread_state = py.PyThreadState_New(py.PyInterpreterState_Main());
    pthread_mutex_unlock(&thread_states_lock);
    if (thread_state == NULL)
        return -1;
    /* PyThreadState_New bound it to this thread for PyGILState_Ensure, with the count that
     * keeps PyGILState_Release from deleting it */
    pthread_setspecific(thread_state_key, thread_state);
    return 0;
}

/* thread_state_key's destructor, when a thread with a thread state libcgru made ends: clear it
 * under the GIL, delete it under thread_states_lock without the GIL.  After the interpreter's
 * finalisation began there is nothing to do (it deletes every thread state itself); a
 * finalisation waits for this like for a call. */
static void drop_thread_state(void *state)
{
    PyThreadState *thread_state = state;
    if (!enter_if_ready())
        return;
    if (py.Py_IsInitialized()) {
        py.PyEval_RestoreThread(thread_state);
        py.PyThreadState_Clear(thread_state);
        py.PyEval_SaveThread();
        pthread_mutex_lock(&thread_states_lock);
        py.PyThreadState_Delete(thread_state);
        pthread_mutex_unlock(&thread_states_lock);
    }
    leave();
}

/* ---- finding or starting the interpreter (the set-up's first part, without the GIL) -------- */
static cgru_status_t start_interpreter(void)
{
    char package_dir[PATH_MAX], python[PATH_MAX];
    find_package_dir(package_dir, sizeof package_dir);
    snprintf(package_parent, sizeof package_parent, "%s", package_dir);
    strip_last_component(package_parent);

    void *handle = RTLD_DEFAULT;
    if (dlsym(RTLD_DEFAULT, "Py_IsInitialized") == NULL) {
        if (choose_python(package_dir, python, sizeof python) != CGRU_STATUS_SUCCESS)
            return start_status;
        handle = open_libpython(python);
        if (handle == NULL)
            return start_status;
    }
    if (load_symbols(handle) != CGRU_STATUS_SUCCESS)
        return start_status;
    if (!py.Py_IsInitialized()) {                /* else: join the running interpreter */
        if (handle == RTLD_DEFAULT && choose_python(package_dir, python, sizeof python) !=
                                          CGRU_STATUS_SUCCESS)
            return start_status;
        initialize_embedded(python);
        if (start_status != CGRU_STATUS_SUCCESS)
            return start_status;
    }
    lock_state();
    python_up = 1;             /* a call waiting with the host's GIL must now let go of it */
    pthread_cond_broadcast(&runtime_changed);
    unlock_state();
    return CGRU_STATUS_SUCCESS;
}

/* ---- the hooks registered with the interpreter -------------------------------------------- */
static PyObject *none(void)
{
    return py.Py_BuildValue("");
}

/* atexit callback (Py_Finalize runs it while the interpreter is whole): from now on calls are
 * refused; wait, with the GIL released, until every call in flight has returned. */
static PyObject *on_interpreter_exit(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    lock_state();
    if (runtime_state == RUNTIME_READY || runtime_state == RUNTIME_STARTING)
        set_state(RUNTIME_FINALISED);
    int others_in_flight = calls_in_flight > calls_on_this_thread;
    unlock_state();
    if (others_in_flight) {
        PyThreadState *thread_state = py.PyEval_SaveThread();
        lock_state();
        while (calls_in_flight > calls_on_this_thread)
            pthread_cond_wait(&runtime_changed, &runtime_lock);
        unlock_state();
        py.PyEval_RestoreThread(thread_state);
    }
    return none();
}

/* os.register_at_fork callbacks: mark the thread on which Python runs its own fork protocol
 * (os.fork, PyOS_BeforeFork), which the interpreter fork handlers then leave alone. */
static PyObject *on_python_fork_before(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    python_forking = 1;
    if (!fork_holds_thread_states) {        /* the GIL is held: the lock order allows it */
        pthread_mutex_lock(&thread_states_lock);
        fork_holds_thread_states = 1;
    }
    return none();
}

static void release_thread_states_after_fork(int in_child)
{
    if (!fork_holds_thread_states)
        return;
    fork_holds_thread_states = 0;
    if (in_child)
        pthread_mutex_init(&thread_states_lock, NULL);   /* held by this thread at the fork */
    else
        pthread_mutex_unlock(&thread_states_lock);
}

static PyObject *on_python_fork_parent(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    python_forking = 0;
    release_thread_states_after_fork(0);
    return none();
}

static PyObject *on_python_fork_child(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    python_forking = 0;
    release_thread_states_after_fork(1);
    return none();
}

static PyMethodDef exit_hook = {"libcgru_at_exit", on_interpreter_exit, METH_NOARGS,
                                "libcgru: refuse new calls, wait for the calls in flight"};
static PyMethodDef fork_before_hook = {"libcgru_before_fork", on_python_fork_before,
                                       METH_NOARGS, "libcgru: Python forks on this thread"};
static PyMethodDef fork_parent_hook = {"libcgru_after_fork_parent", on_python_fork_parent,
                                       METH_NOARGS, "libcgru: Python forked on this thread"};
static PyMethodDef fork_child_hook = {"libcgru_after_fork_child", on_python_fork_child,
                                      METH_NOARGS, "libcgru: the child of Python's fork"};

/* module.name(*args, **kwargs) for its success (args: a tuple, kwargs: a dict or NULL; both
 * references are taken); needs the GIL. */
static int call_and_drop(PyObject *module, const char *name, PyObject *args, PyObject *kwargs)
{
    PyObject *fn = module && args ? py.PyObject_GetAttrString(module, name) : NULL;
    PyObject *result = fn ? py.PyObject_Call(fn, args, kwargs) : NULL;
    if (result) py.Py_DecRef(result);
    if (fn) py.Py_DecRef(fn);
    if (args) py.Py_DecRef(args);
    if (kwargs) py.Py_DecRef(kwargs);
    return result != NULL;
}

/* atexit.register(exit hook); os.register_at_fork(before=…, after_in_parent=…,
 * after_in_child=…).  The function objects live as long as the interpreter. */
static cgru_status_t register_interpreter_hooks(void)
{
    char error[768];
    PyObject *at_exit = py.PyCMethod_New(&exit_hook, NULL, NULL, NULL);
    PyObject *before = py.PyCMethod_New(&fork_before_hook, NULL, NULL, NULL);
    PyObject *parent = py.PyCMethod_New(&fork_parent_hook, NULL, NULL, NULL);
    PyObject *child = py.PyCMethod_New(&fork_child_hook, NULL, NULL, NULL);
    PyObject *atexit_module = py.PyImport_ImportModule("atexit");
    PyObject *os_module = py.PyImport_ImportModule("os");
    int ok = at_exit && before && parent && child &&
             call_and_drop(atexit_module, "register", py.Py_BuildValue("(O)", at_exit), NULL) &&
             call_and_drop(os_module, "register_at_fork", py.Py_BuildValue("()"),
                           py.Py_BuildValue("{s:O,s:O,s:O}", "before", before,
                                            "after_in_parent", parent, "after_in_child", child));
    if (!ok)
        take_python_error(error, sizeof error);
    if (os_module) py.Py_DecRef(os_module);
    if (atexit_module) py.Py_DecRef(atexit_module);
    if (child) py.Py_DecRef(child);
    if (parent) py.Py_DecRef(parent);
    if (before) py.Py_DecRef(before);
    if (at_exit) py.Py_DecRef(at_exit);
    if (!ok)
        start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE, "cannot register libcgru's exit and fork "
                   "callbacks with the Python runtime: %s", error);
    return start_status;
}

/* ---- importing cgru.capi (the set-up's second part, under the GIL) ------------------------ */
static cgru_status_t import_capi(void)
{
    char error[768];
    PyObject *m = py.PyImport_ImportModule(CAPI_MODULE);
    if (m == NULL && !embedded && package_parent[0] != '\0') {
        /* joined a process whose sys.path lacks cgru: use the one beside libcgru */
        py.PyErr_Clear();
        add_to_sys_path(package_parent, 0);
        m = py.PyImport_ImportModule(CAPI_MODULE);
    }
    if (m == NULL) {
        take_python_error(error, sizeof error);
        start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE,
                   "cannot import " CAPI_MODULE " in the %s Python runtime: %s (set "
                   "CGRU_PYTHON to the python of the environment where cgru is installed)",
                   embedded ? "embedded" : "running", error);
        return start_status;
    }
    capi_module = m;
    return CGRU_STATUS_SUCCESS;
}

/* cgru.capi.<function>(*Py_BuildValue(format, ap)): a new reference, or NULL with a Python
 * error set; needs the GIL. */
static PyObject *call_capi(const char *function, const char *format, va_list ap)
{
    PyObject *args = py.Py_VaBuildValue(format, ap);
    PyObject *fn = args ? py.PyObject_GetAttrString(capi_module, function) : NULL;
    PyObject *result = fn ? py.PyObject_CallObject(fn, args) : NULL;
    if (fn) py.Py_DecRef(fn);
    if (args) py.Py_DecRef(args);
    return result;
}

static PyObject *call_capi_v(const char *function, const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    PyObject *result = call_capi(function, format, ap);
    va_end(ap);
    return result;
}

/* One inference forward of a one-unit float GRU (T = N = I = H = 1, one thread) on libcgru's
 * own buffers, result unused: what cgru loads on its first computation is loaded now, inside
 * the set-up (see the file comment).  A failure here is left to the real calls to report. */
static void warm_up(void)
{
    static float x[1], y[1], weights[64];
    const unsigned long long no = 0;
#define WARM_DESC 0, 1, 1, 1, 0, 0, 1, 1, 0.0, 0LL, 0LL, (int)CGRU_GRU, 0
    PyObject *size = call_capi_v("weight_space_size", "((iiiiiiiidLLii))", WARM_DESC);
    long long nbytes = -1;
    if (size != NULL && py.PyTuple_Size(size) == 3 &&
        py.PyLong_AsLongLong(py.PyTuple_GetItem(size, 0)) == CGRU_STATUS_SUCCESS)
        nbytes = py.PyLong_AsLongLong(py.PyTuple_GetItem(size, 2));
    if (size) py.Py_DecRef(size);
    PyObject *result = NULL;
    if (nbytes > 0 && (size_t)nbytes <= sizeof weights)
        result = call_capi_v("rnn_forward", "((iiiiiiiidLLii)iiiiKKKKKKKKKKKKK)", WARM_DESC,
                             0, 0, 1, 1, no, (unsigned long long)(uintptr_t)x,
                             (unsigned long long)(uintptr_t)y, no, no, no, no,
                             (unsigned long long)nbytes,
                             (unsigned long long)(uintptr_t)weights, no, no, no, no);
#undef WARM_DESC
    if (result) py.Py_DecRef(result);
    py.PyErr_Clear();
}

/* Under the GIL: import cgru.capi, register the interpreter hooks, warm up. */
static cgru_status_t join_interpreter(void)
{
    if (have_thread_state() != 0) {
        start_fail(CGRU_STATUS_ALLOC_FAILED, "cannot make a Python thread state (out of memory)");
        return start_status;
    }
    PyGILState_STATE gil = py.PyGILState_Ensure();
    cgru_status_t status = import_capi();
    if (status == CGRU_STATUS_SUCCESS)
        status = register_interpreter_hooks();
    if (status == CGRU_STATUS_SUCCESS)
        warm_up();
    py.PyGILState_Release(gil);
    return status;
}

/* ---- fork handlers ------------------------------------------------------------------------ */
/* The state handlers: runtime_lock across the fork; the child's own state. */
static void state_prepare(void) { lock_state(); }
static void state_parent(void) { unlock_state(); }

static void state_child(void)
{
    pthread_mutex_init(&runtime_lock, NULL);          /* held by this thread at the fork */
    pthread_cond_init(&runtime_changed, NULL);        /* its waiters are not in this process */
    calls_in_flight = calls_on_this_thread;
    if (runtime_state == RUNTIME_STARTING && !pthread_equal(setup_thread, pthread_self())) {
        start_status = CGRU_STATUS_RUNTIME_UNAVAILABLE;
        snprintf(start_message, sizeof start_message, "%s", FORKED_DURING_SETUP_MESSAGE);
        runtime_state = RUNTIME_FAILED;
    }
}

/* The interpreter handlers: what os.fork does around fork(), unless Python does it itself. */
static void interpreter_prepare(void)
{
    fork_took_gil = 0;
    if (python_forking || !enter_if_ready())   /* a finalisation waits until the fork is done */
        return;
    have_thread_state();        /* (if it cannot, PyGILState_Ensure makes one for the fork) */
    fork_made_thread_state = py.PyGILState_GetThisThreadState() == NULL;
    fork_gil = py.PyGILState_Ensure();
    pthread_mutex_lock(&thread_states_lock);
    fork_holds_thread_states = 1;
    py.PyOS_BeforeFork();
    fork_took_gil = 1;
}

static void interpreter_parent(void)
{
    if (!fork_took_gil)
        return;
    fork_took_gil = 0;
    py.PyOS_AfterFork_Parent();
    release_thread_states_after_fork(0);
    py.PyGILState_Release(fork_gil);
    leave();
}

static void interpreter_child(void)
{
    if (!fork_took_gil)
        return;
    fork_took_gil = 0;
    release_thread_states_after_fork(1);    /* the parent's other threads are not here */
    py.PyOS_AfterFork_Child();
    /* PyOS_AfterFork_Child deleted every thread state but this thread's, and CPython needs an
     * interpreter to keep one: a thread state made for the fork stays (this thread's, like
     * the one of the thread that starts an embedded interpreter); only the GIL is released. */
    if (fork_made_thread_state)
        py.PyEval_SaveThread();
    else
        py.PyGILState_Release(fork_gil);
    leave();                                /* the state handler kept this thread's count */
}

__attribute__((constructor)) static void register_state_handlers(void)
{
    state_handlers_registered = pthread_atfork(state_prepare, state_parent, state_child) == 0;
}

/* ---- the set-up ---------------------------------------------------------------------------- */
/* The first call's work (runtime_lock not held): the interpreter, cgru.capi, the hooks, the
 * interpreter fork handlers; then READY or FAILED (unless finalisation began meanwhile). */
static void set_up(void)
{
    cgru_status_t status = CGRU_STATUS_SUCCESS;
    if (!state_handlers_registered && !(state_handlers_registered =
            pthread_atfork(state_prepare, state_parent, state_child) == 0)) {
        start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE,
                   "cannot register libcgru's fork handlers (pthread_atfork failed)");
        status = start_status;
    }
    if (status == CGRU_STATUS_SUCCESS && pthread_key_create(&thread_state_key,
                                                           drop_thread_state) != 0) {
        start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE,
                   "cannot set up libcgru's thread states (pthread_key_create failed)");
        status = start_status;
    }
    if (status == CGRU_STATUS_SUCCESS)
        status = start_interpreter();
    if (status == CGRU_STATUS_SUCCESS)
        status = join_interpreter();
    if (status == CGRU_STATUS_SUCCESS &&
        pthread_atfork(interpreter_prepare, interpreter_parent, interpreter_child) != 0) {
        start_fail(CGRU_STATUS_RUNTIME_UNAVAILABLE,
                   "cannot register libcgru's fork handlers (pthread_atfork failed)");
        status = start_status;
    }
    lock_state();
    if (runtime_state == RUNTIME_STARTING)
        set_state(status == CGRU_STATUS_SUCCESS ? RUNTIME_READY : RUNTIME_FAILED);
    unlock_state();
}

/* Wait (runtime_lock held) until another thread's set-up is done.  A thread holding the host
 * interpreter's GIL lets go of it meanwhile: the set-up needs it. */
static void wait_for_set_up(void)
{
    while (runtime_state == RUNTIME_STARTING) {
        if (python_up && py.PyGILState_GetThisThreadState() != NULL && py.PyGILState_Check()) {
            unlock_state();
            PyThreadState *thread_state = py.PyEval_SaveThread();
            lock_state();
            while (runtime_state == RUNTIME_STARTING)
                pthread_cond_wait(&runtime_changed, &runtime_lock);
            unlock_state();
            py.PyEval_RestoreThread(thread_state);
            lock_state();
        } else {
            pthread_cond_wait(&runtime_changed, &runtime_lock);
        }
    }
}

/* Admit a call: CGRU_STATUS_SUCCESS with the call counted in flight (the caller then calls
 * leave()), or the status to return (the message set).  Sets the runtime up on first use. */
static cgru_status_t admit(void)
{
    lock_state();
    for (;;) {
        switch (runtime_state) {
        case RUNTIME_NONE:
            runtime_state = RUNTIME_STARTING;
            setup_thread = pthread_self();
            unlock_state();
            set_up();
            lock_state();
            break;
        case RUNTIME_STARTING:
            if (pthread_equal(setup_thread, pthread_self())) {
                unlock_state();
                return cgru__fail(CGRU_STATUS_INTERNAL_ERROR, "libcgru was called from inside "
                                  "its own set-up (please report)");
            }
            wait_for_set_up();
            break;
        case RUNTIME_FINALISED:
            unlock_state();
            return cgru__fail(CGRU_STATUS_RUNTIME_UNAVAILABLE, "%s", FINALISED_MESSAGE);
        case RUNTIME_READY:
            calls_in_flight++;
            calls_on_this_thread++;
            unlock_state();
            return CGRU_STATUS_SUCCESS;
        case RUNTIME_FAILED:
        default: {
            cgru_status_t status = start_status;
            unlock_state();
            return cgru__fail(status, "%s", start_message);
        }
        }
    }
}
/* ---- calling ---------------------------------------------------------------------------- */
static cgru_status_t unpack_result(const char *function, PyObject *result, long long *values,
                                   int nvalues)
{
    char error[768];
    Py_ssize_t n = py.PyTuple_Size(result);
    if (n < 2)
        goto bad;
    long long status = py.PyLong_AsLongLong(py.PyTuple_GetItem(result, 0));
    const char *message = py.PyUnicode_AsUTF8(py.PyTuple_GetItem(result, 1));
    if (message == NULL || py.PyErr_Occurred() != NULL)
        goto bad;
    if (status != CGRU_STATUS_SUCCESS)
        return cgru__fail((cgru_status_t)status, "%s", message);
    if (n != 2 + nvalues)
        goto bad;
    for (int i = 0; i < nvalues; i++)
        values[i] = py.PyLong_AsLongLong(py.PyTuple_GetItem(result, 2 + i));
    if (py.PyErr_Occurred() != NULL)
        goto bad;
    cgru__clear_message();
    return CGRU_STATUS_SUCCESS;
bad:
    take_python_error(error, sizeof error);
    return cgru__fail(CGRU_STATUS_INTERNAL_ERROR,
                      CAPI_MODULE ".%s returned an unexpected result (expected (status, message"
                      ", %d values)) %s", function, nvalues, error);
}


cgru_status_t cgru__py_call(const char *function, long long *values, int nvalues,
                            const char *format, ...)
{
    char error[768];
    cgru_status_t status = admit();
    if (status != CGRU_STATUS_SUCCESS)
        return status;
    /* a finalisation that skipped the atexit callbacks: taking the GIL would crash */
    if (!py.Py_IsInitialized()) {
        leave();
        return cgru__fail(CGRU_STATUS_RUNTIME_UNAVAILABLE, "%s", FINALISED_MESSAGE);
    }
    if (have_thread_state() != 0) {
        leave();
        return cgru__fail(CGRU_STATUS_ALLOC_FAILED, "cannot make a Python thread state for "
                          "this thread (out of memory)");
    }
    PyGILState_STATE gil = py.PyGILState_Ensure();
    va_list ap;
    va_start(ap, format);
    PyObject *result = call_capi(function, format, ap);
    va_end(ap);
    if (result != NULL) {
        status = unpack_result(function, result, values, nvalues);
        py.Py_DecRef(result);
    } else {
        int oom = py.PyErr_ExceptionMatches(*py.PyExc_MemoryError);
        take_python_error(error, sizeof error);
        status = cgru__fail(oom ? CGRU_STATUS_ALLOC_FAILED : CGRU_STATUS_INTERNAL_ERROR,
                            "calling " CAPI_MODULE ".%s failed: %s", function, error);
    }
    py.PyGILState_Release(gil);
    leave();
    return status;
}
