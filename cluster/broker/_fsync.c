/*
 * cluster.broker._fsync: fsync a group commit's files on a thread that never takes
 * the GIL, so the event loop keeps serving clients during the disk wait.
 *
 *   start(fds, wake_fd, sends=()) -> job
 *       Queues a job for the module's worker thread (started at the first
 *       job), which syncs every descriptor of the sequence `fds`:
 *       fdatasync(fd) for fd >= 0, and a full fsync(~fd) for a negative
 *       entry (a directory); a few one after the other, stopping at the
 *       first failure, three or more at once on helper threads. If every sync
 *       succeeded it then sends each (socket fd, bytes) of `sends` without
 *       blocking (MSG_DONTWAIT | MSG_NOSIGNAL): the group commit's held
 *       replies leave the moment their writes are durable, without waiting
 *       for the event loop to notice. Last, it writes 1 to the eventfd
 *       wake_fd. The caller keeps the `fds` open until wake_fd is
 *       signalled; each send's socket is dup'ed here, so the caller may
 *       close it meanwhile without its number reaching another client.
 *       At most SEND_DUPS_MAX such copies are open at once in the process
 *       (the module's constant): a send past it is not taken, and the
 *       caller sends it (descriptor use stays bounded whatever the number
 *       of clients a round covers; docs/guarantees.md).
 *
 *   add_send(job, (fd, bytes)) -> bool
 *       One more (socket fd, bytes) for a job already started, sent with
 *       the others if its thread has not finished sending (True); False:
 *       too late (or no descriptor to dup), the caller sends it. For a
 *       reply whose write the job's syncs cover but which was handed over
 *       after the job started (cluster/broker/durability.py): a deferred commit's
 *       writers hand over one by one, and a sync that ends before the last
 *       of them would otherwise leave their sends to the event loop.
 *
 *   done(job) -> bool
 *       Whether the thread has finished the job (its eventfd write may
 *       still be on its way): the loop ends a round as soon as it checks,
 *       without waiting for its poll to see wake_fd (cluster/broker/durability.py).
 *
 *   result(job) -> None | (fd, errno)
 *       After wake_fd was signalled: None if every sync succeeded, else the
 *       first descriptor (by position) that failed and its errno (nothing
 *       was sent then).
 *
 *   failures(job) -> [(fd, errno), ...]
 *       After wake_fd was signalled: every descriptor whose sync failed,
 *       by position (several only when the syncs ran at once; one after
 *       the other stops at the first). A caller must learn of each: the
 *       kernel reports a failed writeback to one fsync only.
 *
 *   sent(job) -> [int | None, ...]
 *       After wake_fd was signalled, per send: the bytes the socket took
 *       (the caller sends the rest), -errno if it failed (the peer is gone),
 *       or None if it was not taken (no descriptor left to dup it: the
 *       caller sends it all).
 *
 *   hold_worker(flag)
 *       For tests only: while held, the worker takes no new job (one
 *       already running finishes), so a test can act on a started job
 *       before its thread does (add_send) without racing it.
 *
 *   hold_sends(flag)
 *       For tests only: while held, a job's thread stops after each send
 *       but its first, so a test can hand a send over while it sends.
 *
 * Why not a Python worker thread (trio.to_thread.run_sync): when fdatasync
 * returns, that thread must take the GIL back from a busy event loop, which
 * gives it up only every switch interval (5 ms), and each hand-over costs
 * both threads wake-ups. This thread needs no Python object: the loop waits
 * for wake_fd like for any socket (cluster/broker/durability.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define CAPSULE_NAME "cluster.broker._fsync.job"

#define NOT_TAKEN PY_SSIZE_T_MIN /* a send whose socket could not be dup'ed */

/* Sockets dup'ed for sends and not yet closed, in every job: incremented by
 * the loop's thread (holding the GIL: one at a time), decremented by the
 * job's thread when it closes one. */
#define SEND_DUPS_MAX 64
static int send_dups = 0;

/* A copy of socket fd for a send, or -1 (past SEND_DUPS_MAX, or dup failed). */
static int
dup_for_send(int fd)
{
    if (__atomic_load_n(&send_dups, __ATOMIC_ACQUIRE) >= SEND_DUPS_MAX)
        return -1;
    int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd >= 0)
        __atomic_add_fetch(&send_dups, 1, __ATOMIC_ACQ_REL);
    return dup_fd;
}

static void
close_send_dup(int fd)
{
    close(fd);
    __atomic_sub_fetch(&send_dups, 1, __ATOMIC_ACQ_REL);
}

/* A reply to send once the job's syncs succeeded: on a descriptor of the
 * job's own (a dup, closed by the thread), from a bytes object the job keeps
 * a reference to. */
typedef struct Send {
    int fd;
    const char *buf;
    Py_ssize_t len;
    Py_ssize_t sent; /* bytes taken, -errno, or NOT_TAKEN (fd is -1) */
} Send;

typedef struct Job {
    struct Job *next;
    Py_ssize_t n;
    Py_ssize_t nsend;
    Py_ssize_t cap; /* room in sends */
    Send *sends;
    PyObject *keep; /* the payloads' list, released with the capsule */
    int closed; /* under sends_lock: the thread sent all it will, add_send refuses */
    int wake_fd;
    int failed_fd;
    int err;
    int finished;
    int fds[]; /* n descriptors, then n errnos (0: synced or not tried) */
} Job;

/* One worker thread for the process, started at the first job: a thread
 * per round would cost a clone, a stack mapping and an exit every few
 * milliseconds. Jobs run in the order they were started. */
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_ready = PTHREAD_COND_INITIALIZER;
static Job *queue_head = NULL;
static Job *queue_tail = NULL;
static int worker_started = 0;
static int worker_held = 0; /* hold_worker: tests only */

/* Guards a job's sends between add_send (the loop) and the thread taking
 * them: held only to append or to take one, never during a syscall. */
static pthread_mutex_t sends_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sends_resumed = PTHREAD_COND_INITIALIZER;
static int sends_held = 0; /* hold_sends: tests only */

/* A round of many partitions syncs many files: one fdatasync after the
 * other, 64 of them took 9.4 ms on this project's VM disk, 3.7-4.6 ms when
 * 4-16 threads issued them at once (the journal commits them together;
 * bench/RESULTS.md). So a job of PARALLEL_MIN descriptors or more is shared
 * with up to SYNC_HELPERS helper threads, started at the first such job.
 * Every item is taken and completed under pool_lock (cheap next to a sync),
 * so a helper waking late never touches a finished batch. */
#define PARALLEL_MIN 3
#define SYNC_HELPERS 7

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pool_done = PTHREAD_COND_INITIALIZER;
static const int *batch_fds = NULL;
static int *batch_errs = NULL;
static Py_ssize_t batch_n = 0;
static Py_ssize_t batch_next = 0; /* the next item to take */
static Py_ssize_t batch_done = 0; /* items finished */
static int helpers = 0;           /* helper threads running (the job thread only touches it) */

static int
sync_one(int fd)
{
    int r = fd < 0 ? fsync(~fd) : fdatasync(fd);
    return r == 0 ? 0 : errno;
}

/* Take and sync items of the current batch until none is left. Called with
 * pool_lock held; returns with it held. */
static void
drain_batch(void)
{
    while (batch_next < batch_n) {
        Py_ssize_t i = batch_next++;
        int fd = batch_fds[i];
        int *errs = batch_errs;
        pthread_mutex_unlock(&pool_lock);
        int err = sync_one(fd);
        pthread_mutex_lock(&pool_lock);
        errs[i] = err;
        if (++batch_done == batch_n)
            pthread_cond_signal(&pool_done);
    }
}

static void *
helper(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&pool_lock);
    for (;;) {
        while (batch_next >= batch_n)
            pthread_cond_wait(&pool_work, &pool_lock);
        drain_batch();
    }
    return NULL;
}

/* A detached thread with a small stack: 0, or the pthread_create error. */
static int
spawn(void *(*fn)(void *))
{
    pthread_attr_t attr;
    pthread_t tid;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    int rc = pthread_create(&tid, &attr, fn, NULL);
    pthread_attr_destroy(&attr);
    return rc;
}

static void
start_helpers(void)
{
    while (helpers < SYNC_HELPERS) {
        if (spawn(helper) != 0)
            break; /* fewer helpers (or none): the job thread does the rest */
        helpers++;
    }
}

static void
fail_at(Job *job, Py_ssize_t i, int err)
{
    int fd = job->fds[i];
    job->fds[job->n + i] = err;
    if (job->failed_fd >= 0)
        return; /* the first by position is the result */
    job->failed_fd = fd < 0 ? ~fd : fd;
    job->err = err;
}

/* Sync job->fds (with the helpers when there are several), recording the
 * first failure by position, as a sequential pass that stopped there would. */
static void
sync_all(Job *job)
{
    int *errs = job->n >= PARALLEL_MIN ? calloc((size_t)job->n, sizeof(int)) : NULL;
    if (errs == NULL) { /* few descriptors (or no memory): one after the other */
        /* Stopping at the first failure leaves the rest untried: their
         * errors, if any, are still to be reported to a later sync. */
        for (Py_ssize_t i = 0; i < job->n; i++) {
            int err = sync_one(job->fds[i]);
            if (err != 0) {
                fail_at(job, i, err);
                return;
            }
        }
        return;
    }
    if (helpers < SYNC_HELPERS)
        start_helpers();
    pthread_mutex_lock(&pool_lock);
    batch_fds = job->fds;
    batch_errs = errs;
    batch_n = job->n;
    batch_next = 0;
    batch_done = 0;
    pthread_cond_broadcast(&pool_work);
    drain_batch();
    while (batch_done < batch_n)
        pthread_cond_wait(&pool_done, &pool_lock);
    batch_fds = NULL;
    batch_errs = NULL;
    batch_n = batch_next = batch_done = 0;
    pthread_mutex_unlock(&pool_lock);
    for (Py_ssize_t i = 0; i < job->n; i++)
        if (errs[i] != 0)
            fail_at(job, i, errs[i]);
    free(errs);
}

static void
run_job(Job *job)
{
    sync_all(job);
    /* Sends handed over while this thread sends (add_send: the rest of a
     * deferred commit's writers) go out too; it stops taking them only when
     * it finds no new one, under the lock, and closes the job to add_send. */
    for (Py_ssize_t i = 0;; i++) {
        pthread_mutex_lock(&sends_lock);
        while (sends_held && i > 0)
            pthread_cond_wait(&sends_resumed, &sends_lock);
        if (i == job->nsend) {
            job->closed = 1;
            pthread_mutex_unlock(&sends_lock);
            break;
        }
        Send snd = job->sends[i]; /* a copy: add_send may move the array */
        pthread_mutex_unlock(&sends_lock);
        if (snd.fd < 0)
            continue;
        if (job->failed_fd < 0) {
            /* Never block: what the socket does not take now goes back to
             * the loop, which sends it under the output buffer limits. */
            while (snd.sent < snd.len) {
                ssize_t r = send(snd.fd, snd.buf + snd.sent, (size_t)(snd.len - snd.sent),
                                 MSG_DONTWAIT | MSG_NOSIGNAL);
                if (r < 0) {
                    if (errno == EINTR)
                        continue;
                    if (errno != EAGAIN && errno != EWOULDBLOCK)
                        snd.sent = -errno;
                    break;
                }
                snd.sent += r;
            }
        }
        close_send_dup(snd.fd);
        pthread_mutex_lock(&sends_lock);
        job->sends[i].sent = snd.sent;
        pthread_mutex_unlock(&sends_lock);
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
        while (queue_head == NULL || worker_held)
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
    if (job != NULL && __atomic_load_n(&job->finished, __ATOMIC_ACQUIRE)) {
        Py_XDECREF(job->keep);
        free(job->sends);
        free(job);
    }
}

/* Free a job that was never queued (its dups are closed). */
static void
discard_job(Job *job, Py_ssize_t dups)
{
    for (Py_ssize_t i = 0; i < dups; i++)
        if (job->sends[i].fd >= 0)
            close_send_dup(job->sends[i].fd);
    Py_XDECREF(job->keep);
    free(job->sends);
    free(job);
}

/* Take `sends` (a sequence of (fd, bytes)) into the job: each fd is dup'ed,
 * so a connection closed meanwhile cannot have its descriptor number reused
 * under the thread. Returns 0, or -1 with an exception set (the job is then
 * discarded). */
static PyObject *send_item(PyObject *item, int *fd);

static int
take_sends(Job *job, PyObject *sends)
{
    PyObject *keep = PySequence_List(sends);
    if (keep == NULL) {
        discard_job(job, 0);
        return -1;
    }
    job->keep = keep;
    Py_ssize_t n = PyList_GET_SIZE(keep);
    job->cap = n ? n : 1;
    job->sends = calloc((size_t)job->cap, sizeof(Send));
    if (job->sends == NULL) {
        discard_job(job, 0);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int fd;
        PyObject *payload = send_item(PyList_GET_ITEM(keep, i), &fd);
        if (payload == NULL) {
            discard_job(job, i);
            return -1;
        }
        /* No descriptor to spare (or a bad one): not taken, the caller sends it. */
        int dup_fd = dup_for_send(fd);
        job->sends[i].fd = dup_fd;
        job->sends[i].buf = PyBytes_AS_STRING(payload);
        job->sends[i].len = PyBytes_GET_SIZE(payload);
        job->sends[i].sent = dup_fd < 0 ? NOT_TAKEN : 0;
        job->nsend = i + 1;
    }
    return 0;
}

/* The payload of one (fd, bytes) send, its fd in *fd; NULL with an
 * exception set if it is not one. Bytes only: the thread reads the buffer
 * without the GIL, so it must not be one that can change or move. */
static PyObject *
send_item(PyObject *item, int *fd)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2
        || !PyLong_Check(PyTuple_GET_ITEM(item, 0)) || !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
        PyErr_SetString(PyExc_TypeError, "sends must be (fd, bytes) tuples");
        return NULL;
    }
    long v = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
    if ((v == -1 && PyErr_Occurred()) || v < INT_MIN || v > INT_MAX) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_OverflowError, "fd out of range");
        return NULL;
    }
    *fd = (int)v;
    return PyTuple_GET_ITEM(item, 1);
}

static PyObject *
fsync_add_send(PyObject *self, PyObject *args)
{
    PyObject *capsule;
    PyObject *item;
    int fd;
    if (!PyArg_ParseTuple(args, "OO", &capsule, &item))
        return NULL;
    Job *job = (Job *)PyCapsule_GetPointer(capsule, CAPSULE_NAME);
    if (job == NULL)
        return NULL;
    PyObject *payload = send_item(item, &fd);
    if (payload == NULL)
        return NULL;
    if (job->keep == NULL) { /* started without sends */
        job->keep = PyList_New(0);
        if (job->keep == NULL)
            return NULL;
    }
    /* The payload is kept before the thread can see it (a refused one is
     * kept too, harmlessly, until the job is freed). */
    if (PyList_Append(job->keep, item) < 0)
        return NULL;
    pthread_mutex_lock(&sends_lock);
    if (job->closed) {
        pthread_mutex_unlock(&sends_lock);
        Py_RETURN_FALSE;
    }
    if (job->nsend == job->cap) {
        Py_ssize_t cap = job->cap ? 2 * job->cap : 8;
        Send *grown = realloc(job->sends, (size_t)cap * sizeof(Send));
        if (grown == NULL) {
            pthread_mutex_unlock(&sends_lock);
            Py_RETURN_FALSE;
        }
        job->sends = grown;
        job->cap = cap;
    }
    int dup_fd = dup_for_send(fd);
    if (dup_fd < 0) {
        pthread_mutex_unlock(&sends_lock);
        Py_RETURN_FALSE;
    }
    Send *snd = &job->sends[job->nsend++];
    snd->fd = dup_fd;
    snd->buf = PyBytes_AS_STRING(payload);
    snd->len = PyBytes_GET_SIZE(payload);
    snd->sent = 0;
    pthread_mutex_unlock(&sends_lock);
    Py_RETURN_TRUE;
}

static PyObject *
fsync_start(PyObject *self, PyObject *args)
{
    PyObject *seq;
    PyObject *sends = NULL;
    int wake_fd;
    if (!PyArg_ParseTuple(args, "Oi|O", &seq, &wake_fd, &sends))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "fds must be a sequence of ints");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Job *job = calloc(1, sizeof(Job) + 2 * (size_t)n * sizeof(int));
    if (job == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    job->n = n;
    job->nsend = 0;
    job->cap = 0;
    job->sends = NULL;
    job->keep = NULL;
    job->closed = 0;
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
            discard_job(job, 0);
            return NULL;
        }
        job->fds[i] = (int)v;
    }
    Py_DECREF(fast);
    if (sends != NULL && sends != Py_None && take_sends(job, sends) < 0)
        return NULL;
    PyObject *capsule = PyCapsule_New(job, CAPSULE_NAME, job_destructor);
    if (capsule == NULL) {
        discard_job(job, job->nsend);
        return NULL;
    }
    job->next = NULL;
    pthread_mutex_lock(&queue_lock);
    if (!worker_started) {
        int rc = spawn(worker);
        if (rc != 0) {
            pthread_mutex_unlock(&queue_lock);
            for (Py_ssize_t i = 0; i < job->nsend; i++)
                if (job->sends[i].fd >= 0)
                    close_send_dup(job->sends[i].fd);
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

/* The job of a capsule from start(), or NULL (an exception set) if it is
 * not one or its thread has not finished it. */
static Job *
finished_job(PyObject *capsule)
{
    Job *job = (Job *)PyCapsule_GetPointer(capsule, CAPSULE_NAME);
    if (job != NULL && !__atomic_load_n(&job->finished, __ATOMIC_ACQUIRE)) {
        PyErr_SetString(PyExc_RuntimeError, "the fsync job has not finished");
        return NULL;
    }
    return job;
}

/* The test hooks: set a hold flag under its lock and wake its waiters. */
static PyObject *
set_hold(PyObject *flag, pthread_mutex_t *lock, pthread_cond_t *cond, int *held)
{
    int value = PyObject_IsTrue(flag);
    if (value < 0)
        return NULL;
    pthread_mutex_lock(lock);
    *held = value;
    pthread_cond_broadcast(cond);
    pthread_mutex_unlock(lock);
    Py_RETURN_NONE;
}

static PyObject *
fsync_hold_sends(PyObject *self, PyObject *flag)
{
    return set_hold(flag, &sends_lock, &sends_resumed, &sends_held);
}

static PyObject *
fsync_hold_worker(PyObject *self, PyObject *flag)
{
    return set_hold(flag, &queue_lock, &queue_ready, &worker_held);
}

static PyObject *
fsync_done(PyObject *self, PyObject *capsule)
{
    Job *job = (Job *)PyCapsule_GetPointer(capsule, CAPSULE_NAME);
    if (job == NULL)
        return NULL;
    return PyBool_FromLong(__atomic_load_n(&job->finished, __ATOMIC_ACQUIRE));
}

static PyObject *
fsync_result(PyObject *self, PyObject *capsule)
{
    Job *job = finished_job(capsule);
    if (job == NULL)
        return NULL;
    if (job->failed_fd < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(ii)", job->failed_fd, job->err);
}

static PyObject *
fsync_failures(PyObject *self, PyObject *capsule)
{
    Job *job = finished_job(capsule);
    if (job == NULL)
        return NULL;
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < job->n; i++) {
        int err = job->fds[job->n + i];
        if (err == 0)
            continue;
        int fd = job->fds[i];
        PyObject *item = Py_BuildValue("(ii)", fd < 0 ? ~fd : fd, err);
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
    }
    return list;
}

static PyObject *
fsync_sent(PyObject *self, PyObject *capsule)
{
    Job *job = finished_job(capsule);
    if (job == NULL)
        return NULL;
    PyObject *list = PyList_New(job->nsend);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < job->nsend; i++) {
        Py_ssize_t sent = job->sends[i].sent;
        PyObject *v = sent == NOT_TAKEN ? Py_NewRef(Py_None) : PyLong_FromSsize_t(sent);
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

static PyMethodDef methods[] = {
    {"start", fsync_start, METH_VARARGS, "Start fsyncing fds on a thread; signal wake_fd when done."},
    {"add_send", fsync_add_send, METH_VARARGS, "Add an (fd, bytes) send to a started job, if not too late."},
    {"hold_worker", fsync_hold_worker, METH_O, "Tests only: while true, the worker takes no new job."},
    {"hold_sends", fsync_hold_sends, METH_O, "Tests only: while true, a job's thread stops after each send but its first."},
    {"done", fsync_done, METH_O, "Whether the job's thread has finished it."},
    {"result", fsync_result, METH_O, "None, or (fd, errno) of the sync that failed."},
    {"failures", fsync_failures, METH_O, "[(fd, errno)] of every sync that failed."},
    {"sent", fsync_sent, METH_O, "Per send of the job: bytes the socket took, or -errno."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cluster.broker._fsync",
    "fsync a group commit's files on a thread that never takes the GIL.", -1, methods,
};

PyMODINIT_FUNC
PyInit__fsync(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "SEND_DUPS_MAX", SEND_DUPS_MAX) < 0)
        Py_CLEAR(m);
    return m;
}
