/*
 * server._mapsend: a reply holding views of log files' mappings sent
 * without copying the mapped bytes.
 *
 *   send(fd, out) -> bytes sent
 *
 * `out` is a list of reply pieces (bytes, bytearray, memoryview), the
 * encoded replies of a batch in order, as Connection's gathering send
 * holds them. A zero-copy read (XREAD) answers with a small header and the
 * entries as memoryview slices of a segment file's mmap. `sendmsg` copies
 * every one of those bytes into the socket's buffers (an XREAD COUNT 1000
 * reply is ~150 KB: the copy and the caches it evicts were a third of the
 * call's server CPU, bench/RESULTS.md). Here the mapped slices are instead
 * vmspliced into a pipe (the kernel takes references to the page-cache
 * pages: no copy) and every other piece written into it (copied: small),
 * in order, then the pipe is spliced into the socket `fd` in one call: the
 * socket's buffers hold references to the file's pages, and the bytes are
 * copied once, by the receiver's read (over loopback) or by the NIC.
 *
 * Only slices of an mmap.mmap are spliced by reference: the pages must not
 * change until the peer has read them (or TCP no longer needs them for a
 * retransmit), which holds for the bytes of a log below its high watermark
 * (written once, never rewritten; a segment unmapped, truncated above them
 * or deleted keeps the referenced pages). Any other memory (a bytes object
 * that may be freed and reused once the call returns, a pread buffer) is
 * copied into the pipe.
 *
 * Not spliced, but sent as one gathering sendmsg of the pieces (what
 * socket.sendmsg(out) does, in this same call: a Python frame and the
 * socket module's wrapper less on every small reply, bench/RESULTS.md
 * "XREAD COUNT 10: the poll's CPU") when the mapped bytes are fewer than
 * MIN_MAPPED_BYTES (for a small reply three system calls cost more than
 * the copy saves), when the pieces are more than MAX_PIECES, when the
 * reply would not fit the pipe, and when the pipe cannot be made or filled
 * (the pipe emptied first: nothing of it reached the socket). Either way
 * the bytes the socket took, as sendmsg returns them (fewer when it would
 * block: what it did not take is dropped from the pipe, and the caller
 * keeps the rest of `out` as it keeps the rest of a gathering send); a
 * sendmsg that would block at once raises BlockingIOError, as
 * socket.sendmsg does; an error of the socket (reset, broken pipe) raises
 * OSError, with the pipe emptied.
 *
 * The pipe is one per process and always empty between calls; the GIL is
 * held throughout (every call is non-blocking: O_NONBLOCK pipe, and the
 * caller's socket is non-blocking), so two threads never share it at once.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Mapped bytes below which the reply is declined (sendmsg copies it). */
#define MIN_MAPPED_BYTES (32 * 1024)
/* Pieces of one reply at most (each may take a pipe slot of its own). */
#define MAX_PIECES 64
/* The pipe's size asked for (Linux's default /proc/sys/fs/pipe-max-size). */
#define PIPE_BYTES (1024 * 1024)

static PyObject *mmap_type; /* mmap.mmap */
static int pipe_r = -1, pipe_w = -1;
static Py_ssize_t pipe_bytes; /* the pipe's capacity */

/* The pipe, made on first use: 0, or -1 (no pipe: every call declines). */
static int
ensure_pipe(void)
{
    if (pipe_r >= 0)
        return 0;
    if (pipe_bytes < 0)
        return -1; /* failed before */
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
        pipe_bytes = -1;
        return -1;
    }
    int size = fcntl(fds[1], F_SETPIPE_SZ, PIPE_BYTES);
    if (size < 0)
        size = fcntl(fds[1], F_GETPIPE_SZ);
    if (size <= 0) {
        close(fds[0]);
        close(fds[1]);
        pipe_bytes = -1;
        return -1;
    }
    pipe_r = fds[0];
    pipe_w = fds[1];
    pipe_bytes = size;
    return 0;
}

/* Read and drop whatever the pipe holds (it is empty between calls). */
static void
drain(void)
{
    char scratch[16384];
    for (;;) {
        ssize_t r = read(pipe_r, scratch, sizeof scratch);
        if (r > 0)
            continue;
        if (r < 0 && errno == EINTR)
            continue;
        return; /* empty (EAGAIN), or an error that leaves nothing to read */
    }
}

/* Whether `piece` is a memoryview of an mmap.mmap (its pages may be spliced). */
static int
is_mapped(PyObject *piece)
{
    if (!PyMemoryView_Check(piece))
        return 0;
    PyObject *base = PyMemoryView_GET_BASE(piece);
    return base != NULL && PyObject_TypeCheck(base, (PyTypeObject *)mmap_type)
           && PyBuffer_IsContiguous(PyMemoryView_GET_BUFFER(piece), 'C');
}

/* vmsplice the iovecs [0, n) whole into the pipe: 0, or -1 (errno set; a
 * pipe too full to take them all is EAGAIN). */
static int
splice_in(struct iovec *iov, int n)
{
    while (n) {
        ssize_t r = vmsplice(pipe_w, iov, (unsigned long)n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0) {
            errno = EAGAIN;
            return -1;
        }
        while (n && (size_t)r >= iov->iov_len) {
            r -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n) {
            iov->iov_base = (char *)iov->iov_base + r;
            iov->iov_len -= (size_t)r;
        }
    }
    return 0;
}

/* write `len` bytes whole into the pipe: 0, or -1 (errno set). */
static int
write_in(const char *buf, Py_ssize_t len)
{
    while (len) {
        ssize_t r = write(pipe_w, buf, (size_t)len);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        buf += r;
        len -= r;
    }
    return 0;
}

/* The pieces sent as one gathering sendmsg, as socket.sendmsg(out) sends
 * them (at most IOV_MAX of them: the caller keeps what was not taken): the
 * bytes the socket took; would-block raises BlockingIOError, another error
 * OSError (errno's subclass), as socket.sendmsg raises them. */
static PyObject *
send_copied(int fd, Py_buffer *bufs, Py_ssize_t n)
{
    struct iovec small[MAX_PIECES], *iov = small;
    if (n > IOV_MAX)
        n = IOV_MAX;
    if (n > MAX_PIECES) {
        iov = PyMem_New(struct iovec, n);
        if (iov == NULL)
            return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        iov[i].iov_base = bufs[i].buf;
        iov[i].iov_len = (size_t)bufs[i].len;
    }
    struct msghdr msg = {0};
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)n;
    ssize_t r;
    while ((r = sendmsg(fd, &msg, 0)) < 0 && errno == EINTR) {
        if (PyErr_CheckSignals() != 0)
            break; /* a signal handler raised: socket.sendmsg raises it too */
    }
    int err = errno;
    if (iov != small)
        PyMem_Free(iov);
    if (r >= 0)
        return PyLong_FromSsize_t(r);
    if (PyErr_Occurred())
        return NULL;
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

static PyObject *
mapsend_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "send() takes exactly 2 arguments (%zd given)", nargs);
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "send(): bad file descriptor");
        return NULL;
    }
    PyObject *out = args[1];
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "send(): out must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(out);
    Py_buffer small_bufs[MAX_PIECES], *bufs = small_bufs;
    char mapped[MAX_PIECES];
    if (n > MAX_PIECES) {
        bufs = PyMem_New(Py_buffer, n);
        if (bufs == NULL)
            return PyErr_NoMemory();
    }
    Py_ssize_t got = 0, total = 0, mapped_bytes = 0, sent = 0;
    PyObject *result = NULL;
    for (; got < n; got++) {
        PyObject *piece = PyList_GET_ITEM(out, got);
        if (PyObject_GetBuffer(piece, &bufs[got], PyBUF_SIMPLE) != 0)
            goto done;
        total += bufs[got].len;
        if (n <= MAX_PIECES) {
            mapped[got] = (char)is_mapped(piece);
            if (mapped[got])
                mapped_bytes += bufs[got].len;
        }
    }
    /* Each piece may start a pipe slot of its own (a page each): half the
     * pipe for the bytes leaves room for MAX_PIECES of them. */
    if (n > MAX_PIECES || mapped_bytes < MIN_MAPPED_BYTES || ensure_pipe() != 0 || total > pipe_bytes / 2)
        goto copied;
    struct iovec iov[MAX_PIECES];
    int run = 0; /* mapped pieces waiting for one vmsplice */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer *b = &bufs[i];
        if (!b->len)
            continue;
        if (mapped[i]) {
            iov[run].iov_base = b->buf;
            iov[run].iov_len = (size_t)b->len;
            run++;
            continue;
        }
        if ((run && splice_in(iov, run) != 0) || write_in(b->buf, b->len) != 0)
            goto declined;
        run = 0;
    }
    if (run && splice_in(iov, run) != 0)
        goto declined;
    while (sent < total) {
        ssize_t r = splice(pipe_r, NULL, (int)fd, NULL, (size_t)(total - sent), SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (r > 0) {
            sent += r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno != EAGAIN) {
            int err = errno;
            drain();
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        break; /* the socket would block: the caller keeps the rest */
    }
    if (sent < total)
        drain();
    result = PyLong_FromSsize_t(sent);
    goto done;
declined:
    drain(); /* (nothing reached the socket) */
copied:
    result = send_copied((int)fd, bufs, n);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&bufs[i]);
    if (bufs != small_bufs)
        PyMem_Free(bufs);
    return result;
}

static PyMethodDef methods[] = {
    {"send", (PyCFunction)(void (*)(void))mapsend_send, METH_FASTCALL,
     "send(fd, out): a batch's replies sent, mmap views spliced into the socket without copying them; bytes sent."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "server._mapsend",
    "A reply holding views of log files' mappings sent without copying the mapped bytes.", -1, methods,
};

PyMODINIT_FUNC
PyInit__mapsend(void)
{
    PyObject *mmap = PyImport_ImportModule("mmap");
    if (mmap == NULL)
        return NULL;
    mmap_type = PyObject_GetAttrString(mmap, "mmap");
    Py_DECREF(mmap);
    if (mmap_type == NULL)
        return NULL;
    if (!PyType_Check(mmap_type)) {
        PyErr_SetString(PyExc_TypeError, "mmap.mmap is not a type");
        return NULL;
    }
    return PyModule_Create(&module);
}
