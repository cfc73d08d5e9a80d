/*
 * runtime.c — the Python runtime behind libcgru: start it (embedded) or join it, and call
 * cgru/capi.py.
 *
 * libcgru does not link libpython.  On the first call (once, under pthread_once) it looks for
 * the Python C API in the process (dlsym RTLD_DEFAULT): found when libcgru is loaded into a
 * Python process, or into a program linked with libpython.  Otherwise it dlopens libpython
 * (RTLD_GLOBAL, so that the extension modules numpy and cgru import resolve against it).  If that
 * interpreter is not initialised yet, libcgru initialises it with the program name set to the
 * python executable of cgru's environment, so that Python finds that environment's prefix,
 * site-packages and .pth files (a virtual environment included) exactly as if that python had
 * been started; it then puts the directory above libcgru's package on sys.path (so the cgru next
 * to libcgru is the one imported) and releases the GIL.  Every call then takes the GIL with
 * PyGILState_Ensure; the engine releases it inside its kernels, so calls from several threads
 * overlap.  The interpreter libcgru starts is never finalised (it lives until the process exits).
 *
 * An interpreter libcgru joined belongs to the host, which may finalise it (Py_Finalize) and
 * even initialise a new one later.  So every call checks Py_IsInitialized before it takes the
 * GIL (PyGILState_Ensure on a finalised runtime crashes) and returns
 * CGRU_STATUS_RUNTIME_UNAVAILABLE while there is none, and nothing Python-side outlives a
 * call: cgru.capi is looked up in sys.modules on each call (PyImport_ImportModule, which
 * imports it only the first time in each interpreter), never kept as a PyObject * that a
 * finalisation would leave dangling.  What is kept is the C API's addresses (libpython stays
 * mapped) and the paths found at start.
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
    X(PyStatus_Exception) X(PyEval_SaveThread) X(PyGILState_Ensure) X(PyGILState_Release)       \
    X(PyImport_ImportModule) X(PyObject_GetAttrString) X(PyObject_CallObject)                   \
    X(Py_VaBuildValue) X(Py_DecRef) X(PyTuple_Size) X(PyTuple_GetItem) X(PyLong_AsLongLong)     \
    X(PyUnicode_AsUTF8) X(PyErr_Occurred) X(PyErr_Fetch) X(PyErr_Clear) X(PyObject_Str)         \
    X(PySys_GetObject) X(PyList_Insert) X(PyList_Append) X(PyUnicode_DecodeFSDefault)           \
    X(PySequence_Contains) X(PyErr_ExceptionMatches) X(PyExc_MemoryError)

#define PY_DECLARE(name) __typeof__(name) *name;
static struct { PY_FUNCTIONS(PY_DECLARE) } py;
#undef PY_DECLARE

static pthread_once_t start_once = PTHREAD_ONCE_INIT;
static cgru_status_t start_status = CGRU_STATUS_SUCCESS;
static char start_message[1024];
static int embedded;               /* 1: libcgru initialised the interpreter */
static char package_parent[PATH_MAX]; /* the directory holding libcgru's package directory */

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

static void start(void)
{
    char package_dir[PATH_MAX], python[PATH_MAX];
    find_package_dir(package_dir, sizeof package_dir);
    snprintf(package_parent, sizeof package_parent, "%s", package_dir);
    strip_last_component(package_parent);

    void *handle = RTLD_DEFAULT;
    if (dlsym(RTLD_DEFAULT, "Py_IsInitialized") == NULL) {
        if (choose_python(package_dir, python, sizeof python) != CGRU_STATUS_SUCCESS)
            return;
        handle = open_libpython(python);
        if (handle == NULL)
            return;
    }
    if (load_symbols(handle) != CGRU_STATUS_SUCCESS)
        return;
    if (py.Py_IsInitialized())
        return;                          /* join the running interpreter */
    if (handle == RTLD_DEFAULT && choose_python(package_dir, python, sizeof python) !=
                                      CGRU_STATUS_SUCCESS)
        return;
    initialize_embedded(python);
}

/* cgru.capi (a new reference, imported if this interpreter has not yet) in *module, or a
 * failure status with the message set; needs the GIL. */
static cgru_status_t import_capi(PyObject **module)
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
        return cgru__fail(CGRU_STATUS_RUNTIME_UNAVAILABLE,
                          "cannot import " CAPI_MODULE " in the %s Python runtime: %s (set "
                          "CGRU_PYTHON to the python of the environment where cgru is "
                          "installed)", embedded ? "embedded" : "running", error);
    }
    *module = m;
    return CGRU_STATUS_SUCCESS;
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
    pthread_once(&start_once, start);
    if (start_status != CGRU_STATUS_SUCCESS)
        return cgru__fail(start_status, "%s", start_message);
    /* the host may have finalised the interpreter since: taking the GIL would crash */
    if (!py.Py_IsInitialized())
        return cgru__fail(CGRU_STATUS_RUNTIME_UNAVAILABLE,
                          "the Python runtime was finalised (Py_Finalize) after libcgru started "
                          "using it; expected a running interpreter: call cgru before "
                          "Py_Finalize, or initialise Python again first");

    PyGILState_STATE gil = py.PyGILState_Ensure();
    PyObject *module = NULL, *args = NULL, *fn = NULL, *result = NULL;
    cgru_status_t status = import_capi(&module);
    if (status == CGRU_STATUS_SUCCESS) {
        va_list ap;
        va_start(ap, format);
        args = py.Py_VaBuildValue(format, ap);
        va_end(ap);
        fn = args ? py.PyObject_GetAttrString(module, function) : NULL;
        result = fn ? py.PyObject_CallObject(fn, args) : NULL;
        if (result != NULL) {
            status = unpack_result(function, result, values, nvalues);
        } else {
            int oom = py.PyErr_ExceptionMatches(*py.PyExc_MemoryError);
            take_python_error(error, sizeof error);
            status = cgru__fail(oom ? CGRU_STATUS_ALLOC_FAILED : CGRU_STATUS_INTERNAL_ERROR,
                                "calling " CAPI_MODULE ".%s failed: %s", function, error);
        }
    }
    if (result) py.Py_DecRef(result);
    if (fn) py.Py_DecRef(fn);
    if (args) py.Py_DecRef(args);
    if (module) py.Py_DecRef(module);
    py.PyGILState_Release(gil);
    return status;
}
