/*
 * server._fsync: fsync a group commit's files on a thread that never takes
 * the GIL, so the event loop keeps serving clients during the disk wait.
 *
 *   start(fds, wake_fd) -> job
 *       Queues a job for the module's worker thread (started at the first
 *       job), which syncs every descriptor of the sequence `fds` in order, stopping at the first failure, then writes 1 to the
 *       eventfd wake_fd: fdatasync(fd) for fd >= 0, and a full fsync(~fd)
 *       for a negative entry (a directory). The caller keeps the descriptors
 *       open until wake_fd is signalled.
 *
 *   result(job) -> None | (fd, errno)
 *       After wake_fd was signalled: None if every sync succeeded, else the
 *       descriptor that failed and its errno. Call once per job.
 *
 * Why not a Python worker thread (trio.to_thread.run_sync): when fdatasync
 * returns, that thread must take the GIL back from a busy event loop, which
 * gives it up only every switch interval (5 ms), and each hand-over costs
 * both threads wake-ups. This thread needs no Python object: the loop waits
 * for wake_fd like for any socket (server/durability.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define CAPSULE_NAME "server._fsync.job"

typedef struct Job {
    struct Job *next;
    Py_ssize_t n;
    int wake_fd;
    int failed_fd;
    int err;
    int finished;
    int fds[];
} Job;

/* One worker thread for the process, started at the first job: a thread
 * per round would cost a clone, a stack mapping and an exit every few
 * milliseconds. Jobs run in the order they were started. */
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_ready = PTHREAD_COND_INITIALIZER;
static Job *queue_head = NULL;
static Job *queue_tail = NULL;
static int worker_started = 0;

static void
run_job(Job *job)
{
    for (Py_ssize_t i = 0; i < job->n; i++) {
        int fd = job->fds[i];
        int r = fd < 0 ? fsync(~fd) : fdatasync(fd);
        if (r != 0) {
            job->failed_fd = fd < 0 ? ~fd : fd;
            job->err = errno;
            break;
        }
    }
    int wake_fd = job->wake_fd;
    /* After this store the job may be freed: read nothing from it after. */
    __atomic_store_n(&job->finished, 1, __ATOMIC_RELEASE);
    uint64_t one = 1;
    ssize_t w;
    do {
        w = write(wake_fd, &one, sizeof one);
    } while (w < 0 && errno == EINTR);
}

static void *
worker(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&queue_lock);
        while (queue_head == NULL)
            pthread_cond_wait(&queue_ready, &queue_lock);
        Job *job = queue_head;
        queue_head = job->next;
        if (queue_head == NULL)
            queue_tail = NULL;
        pthread_mutex_unlock(&queue_lock);
        run_job(job);
    }
    return NULL;
}

static void
job_destructor(PyObject *capsule)
{
    Job *job = (Job *)PyCapsule_GetPointer(capsule, CAPSULE_NAME);
    /* A job dropped before its thread finished would be freed under it:
     * leak it instead (only on a caller bug or at interpreter exit). */
    if (job != NULL && __atomic_load_n(&job->finished, __ATOMIC_ACQUIRE))
        free(job);
}

static PyObject *
fsync_start(PyObject *self, PyObject *args)
{
    PyObject *seq;
    int wake_fd;
    if (!PyArg_ParseTuple(args, "Oi", &seq, &wake_fd))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "fds must be a sequence of ints");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Job *job = malloc(sizeof(Job) + (size_t)n * sizeof(int));
    if (job == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    job->n = n;
    job->wake_fd = wake_fd;
    job->failed_fd = -1;
    job->err = 0;
    job->finished = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if ((v == -1 && PyErr_Occurred()) || v < INT_MIN || v > INT_MAX) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_OverflowError, "fd out of range");
            Py_DECREF(fast);
            free(job);
            return NULL;
        }
        job->fds[i] = (int)v;
    }
    Py_DECREF(fast);
    PyObject *capsule = PyCapsule_New(job, CAPSULE_NAME, job_destructor);
    if (capsule == NULL) {
        free(job);
        return NULL;
    }
    job->next = NULL;
    pthread_mutex_lock(&queue_lock);
    if (!worker_started) {
        pthread_attr_t attr;
        pthread_t tid;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        int rc = pthread_create(&tid, &attr, worker, NULL);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            pthread_mutex_unlock(&queue_lock);
            job->finished = 1; /* never queued: the capsule may free it */
            Py_DECREF(capsule);
            errno = rc;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        worker_started = 1;
    }
    if (queue_tail != NULL)
        queue_tail->next = job;
    else
        queue_head = job;
    queue_tail = job;
    pthread_cond_signal(&queue_ready);
    pthread_mutex_unlock(&queue_lock);
    return capsule;
}

static PyObject *
fsync_result(PyObject *self, PyObject *capsule)
{
    Job *job = (Job *)PyCapsule_GetPointer(capsule, CAPSULE_NAME);
    if (job == NULL)
        return NULL;
    if (!__atomic_load_n(&job->finished, __ATOMIC_ACQUIRE)) {
        PyErr_SetString(PyExc_RuntimeError, "the fsync job has not finished");
        return NULL;
    }
    if (job->failed_fd < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(ii)", job->failed_fd, job->err);
}

static PyMethodDef methods[] = {
    {"start", fsync_start, METH_VARARGS, "Start fsyncing fds on a thread; signal wake_fd when done."},
    {"result", fsync_result, METH_O, "None, or (fd, errno) of the sync that failed."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "server._fsync",
    "fsync a group commit's files on a thread that never takes the GIL.", -1, methods,
};

PyMODINIT_FUNC
PyInit__fsync(void)
{
    return PyModule_Create(&module);
}
