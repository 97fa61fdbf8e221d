/*
 * storage._walk: the batch walk of Segment.read in C, for its common case.
 *
 *   batches(mv, p, size, cur, stop, left, chunks)
 *       -> (p, cur, count, nbytes, done)
 *
 * and, below, read() (find an offset's batch, then batches()), find() (the
 * first offset at or above an ID), after() (find(), then batches()) and
 * map_file() (a segment file mapped longer than it is, for appends to come).
 *
 * Walks the batches laid out in the buffer `mv` (a memoryview of a segment
 * file's mapping or of a pread buffer) from position p, as Segment.read's
 * Python loop does when no entry is deleted, no byte bound applies, entries
 * are not split one chunk each and CRCs are not checked:
 * batches that end at or before offset `cur` are skipped; of each later
 * batch the entries in [cur, stop) are appended to the list `chunks` as ONE
 * memoryview slice of `mv` (their bytes are contiguous); at most `left`
 * entries in all (-1: no bound; `done` is true when the bound was reached,
 * as the Python loop sets acc.done). With a list `entries` as an extra
 * last argument (batches() and read()), each entry appended is also named
 * there as an (offset, ms, seq) tuple, as the Python loop's with_ids does;
 * with a true `pairs` after it as an (ms, seq) tuple (ReadAccumulator's
 * id_pairs: what a group's delivery journals and keeps pending).
 *
 * It returns (taking nothing it is unsure of) at the first batch it cannot
 * handle whole: one whose header or body is not entirely in [p, size), or
 * whose header is malformed. The Python loop then deals with that batch (a
 * refill, or the corruption error) and may call again. Returned: the
 * position of the first batch not walked, the next offset to read, the
 * entries and bytes appended.
 *
 * Batch layout (storage/records.py): a 72-byte header whose first 29 bytes
 * are base offset u64, length u32, crc u32, version u16, flags u16, epoch
 * u32, count u32 (little endian), entry format u8; then count IDs of 16
 * bytes, count u32 cumulative entry ends, then the entries. A batch whose
 * entry format is not stream-v1 (storage/entry_codec.py) is left to the
 * Python loop, which refuses it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HEADER_BYTES 72
/* The largest entry_format byte (header byte 28) read as stream-v1:
 * storage/entry_codec.py ENTRY_FORMAT_MAX_READABLE. */
#define ENTRY_FORMAT_MAX_READABLE 1

/* Fill item ``i`` of a new tuple with ``item`` (a new reference, or NULL for a
   failed constructor: -1, the item left NULL, which is fine to free). */
static inline int
fill(PyObject *tuple, Py_ssize_t i, PyObject *item)
{
    if (item == NULL)
        return -1;
    PyTuple_SET_ITEM(tuple, i, item);
    return 0;
}

static uint64_t
le64(const unsigned char *b)
{
    uint64_t v;
    memcpy(&v, b, 8);
    return v; /* x86-64 and aarch64 Linux: little endian, as stored */
}

static uint32_t
le32(const unsigned char *b)
{
    uint32_t v;
    memcpy(&v, b, 4);
    return v;
}

/* (offset, ms, seq) of the entries [i0, r1) of the batch of base offset
 * b_base whose IDs start at `ids`, appended to the list `entries`, or with
 * `pairs` (ms, seq) (the entries of one millisecond share its int); 0, or
 * -1 with an exception set. */
static int
append_ids(PyObject *entries, const unsigned char *ids, long long b_base, long long i0, long long r1, int pairs)
{
    PyObject *last_ms = NULL; /* pairs: the previous pair's ms, held by it (in `entries`) */
    uint64_t last_msv = 0;
    for (long long k = i0; k < r1; k++) {
        uint64_t msv = le64(ids + 16 * k);
        PyObject *t = PyTuple_New(pairs ? 2 : 3);
        if (t == NULL)
            return -1;
        PyObject *offset = NULL, *ms;
        if (pairs && last_ms != NULL && msv == last_msv) {
            ms = last_ms;
            Py_INCREF(ms);
        } else {
            ms = PyLong_FromUnsignedLongLong(msv);
        }
        PyObject *seq = PyLong_FromUnsignedLongLong(le64(ids + 16 * k + 8));
        /* SET_ITEM before the check: the tuple's dealloc drops whatever was made. */
        if (pairs) {
            PyTuple_SET_ITEM(t, 0, ms);
            PyTuple_SET_ITEM(t, 1, seq);
        } else {
            offset = PyLong_FromLongLong(b_base + k);
            PyTuple_SET_ITEM(t, 0, offset);
            PyTuple_SET_ITEM(t, 1, ms);
            PyTuple_SET_ITEM(t, 2, seq);
        }
        if ((!pairs && offset == NULL) || ms == NULL || seq == NULL || PyList_Append(entries, t) != 0) {
            Py_DECREF(t);
            return -1;
        }
        Py_DECREF(t);
        last_ms = ms;
        last_msv = msv;
    }
    return 0;
}

/* An optional list argument: NULL for None. */
static int
optional_list(PyObject *arg, PyObject **out)
{
    if (arg == Py_None) {
        *out = NULL;
        return 0;
    }
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "entries must be a list or None");
        return -1;
    }
    *out = arg;
    return 0;
}

/* The walk of batches() on an acquired buffer; returns 0, or -1 with an
 * exception set. */
static int
walk(PyObject *mv, const unsigned char *buf, Py_ssize_t *pp, Py_ssize_t size, long long *pcur,
     long long stop, long long left, PyObject *chunks, PyObject *entries, int pairs, long long *pcount,
     long long *pnbytes, int *pdone)
{
    Py_ssize_t p = *pp;
    long long cur = *pcur, count = 0, nbytes = 0;
    int done = 0;
    while (p >= 0 && p + HEADER_BYTES <= size && cur < stop) {
        const unsigned char *h = buf + p;
        uint64_t base = le64(h);
        uint32_t length = le32(h + 8);
        uint32_t n = le32(h + 24);
        if (n == 0 || (uint64_t)length < HEADER_BYTES + 20ULL * n || (Py_ssize_t)length > size - p)
            break; /* malformed or not whole in the buffer: the Python loop's case */
        if (base > (uint64_t)LLONG_MAX - n)
            break;
        long long b_base = (long long)base, b_end = b_base + (long long)n;
        if (b_end <= cur) {
            p += length;
            continue;
        }
        if (b_base > cur)
            break; /* a gap in the offsets: not a case of this walk */
        if (h[28] > ENTRY_FORMAT_MAX_READABLE)
            break; /* entries not in stream-v1: the Python loop refuses the batch */
        long long i0 = cur - b_base;
        long long i1 = b_end <= stop ? (long long)n : stop - b_base;
        long long r1 = i1;
        if (left >= 0 && r1 - i0 >= left - count) {
            r1 = i0 + (left - count);
            done = 1;
        }
        Py_ssize_t d = p + HEADER_BYTES + 20 * (Py_ssize_t)n;
        const unsigned char *ends = buf + d - 4 * (Py_ssize_t)n;
        if (r1 > i0) {
            uint32_t rel0 = i0 ? le32(ends + 4 * (i0 - 1)) : 0;
            uint32_t rel1 = le32(ends + 4 * (r1 - 1));
            if (rel1 < rel0 || (uint64_t)d + rel1 > (uint64_t)p + length)
                break; /* inconsistent ends: let the Python loop look */
            PyObject *chunk = PySequence_GetSlice(mv, d + rel0, d + rel1);
            if (chunk == NULL || PyList_Append(chunks, chunk) != 0) {
                Py_XDECREF(chunk);
                return -1;
            }
            Py_DECREF(chunk);
            if (entries != NULL && append_ids(entries, h + HEADER_BYTES, b_base, i0, r1, pairs) != 0)
                return -1;
            count += r1 - i0;
            nbytes += rel1 - rel0;
        }
        if (done) {
            cur = b_base + r1;
            break;
        }
        cur = b_base + i1;
        if (cur >= stop)
            break;
        p += length;
    }
    *pp = p;
    *pcur = cur;
    *pcount = count;
    *pnbytes = nbytes;
    *pdone = done;
    return 0;
}

static PyObject *
walk_batches(PyObject *self, PyObject *args)
{
    PyObject *mv, *chunks, *entries_arg = Py_None, *entries;
    Py_ssize_t p, size;
    long long cur, stop, left;
    int pairs = 0;
    if (!PyArg_ParseTuple(args, "OnnLLLO!|Op", &mv, &p, &size, &cur, &stop, &left, &PyList_Type, &chunks,
                          &entries_arg, &pairs) || optional_list(entries_arg, &entries) != 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(mv, &view, PyBUF_SIMPLE) != 0)
        return NULL;
    if (size > view.len)
        size = view.len;
    long long count, nbytes;
    int done;
    int rc = walk(mv, (const unsigned char *)view.buf, &p, size, &cur, stop, left, chunks, entries, pairs, &count,
                  &nbytes, &done);
    PyBuffer_Release(&view);
    if (rc != 0)
        return NULL;
    return Py_BuildValue("(nLLLO)", p, cur, count, nbytes, done ? Py_True : Py_False);
}

/* read(mv, size, keys, base, cur, stop, left, chunks[, entries[, pairs]])
 *     -> (p, cur, count, nbytes, done) or None
 *
 * Segment.read's start and walk in one call, for a segment whose file is
 * mapped (mv, the first `size` bytes valid): the batch holding offset `cur`
 * is found as Segment.locate finds it (the last entry of the offset index
 * `keys`, u64 values relative_offset << 32 | position, at or below it, then
 * the batch headers from there), then batches() walks from it. None when
 * that batch is not found whole in [0, size) or a header on the way is
 * malformed: the Python path then reads (and reports any damage). */
static PyObject *
walk_read(PyObject *self, PyObject *args)
{
    PyObject *mv, *keys, *chunks, *entries_arg = Py_None, *entries;
    Py_ssize_t size;
    long long base, cur, stop, left;
    int pairs = 0;
    if (!PyArg_ParseTuple(args, "OnOLLLLO!|Op", &mv, &size, &keys, &base, &cur, &stop, &left, &PyList_Type, &chunks,
                          &entries_arg, &pairs) || optional_list(entries_arg, &entries) != 0)
        return NULL;
    if (cur < base || cur - base > 0xFFFFFFFFLL)
        Py_RETURN_NONE;
    Py_buffer kv;
    if (PyObject_GetBuffer(keys, &kv, PyBUF_SIMPLE) != 0)
        return NULL;
    const unsigned char *kb = (const unsigned char *)kv.buf;
    Py_ssize_t lo = 0, hi = kv.len / 8;
    uint64_t probe = ((uint64_t)(cur - base) << 32) | 0xFFFFFFFFULL;
    while (lo < hi) { /* bisect_right */
        Py_ssize_t mid = (lo + hi) / 2;
        if (probe < le64(kb + 8 * mid))
            hi = mid;
        else
            lo = mid + 1;
    }
    Py_ssize_t p = lo ? (Py_ssize_t)(le64(kb + 8 * (lo - 1)) & 0xFFFFFFFFULL) : 0;
    PyBuffer_Release(&kv);
    Py_buffer view;
    if (PyObject_GetBuffer(mv, &view, PyBUF_SIMPLE) != 0)
        return NULL;
    if (size > view.len)
        size = view.len;
    const unsigned char *buf = (const unsigned char *)view.buf;
    for (;;) { /* the headers from the index's position to the batch holding cur */
        if (p + HEADER_BYTES > size)
            goto unsure;
        uint64_t b = le64(buf + p);
        uint32_t length = le32(buf + p + 8), n = le32(buf + p + 24);
        if (n == 0 || length < HEADER_BYTES || (Py_ssize_t)length > size - p || b > (uint64_t)cur)
            goto unsure;
        if ((uint64_t)cur < b + n)
            break;
        p += length;
    }
    long long count, nbytes;
    int done;
    int rc = walk(mv, buf, &p, size, &cur, stop, left, chunks, entries, pairs, &count, &nbytes, &done);
    PyBuffer_Release(&view);
    if (rc != 0)
        return NULL;
    return Py_BuildValue("(nLLLO)", p, cur, count, nbytes, done ? Py_True : Py_False);
unsure:
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* The lookup of find() and after(): the first offset whose ID is >= (ms,
 * seq) among the batches of [0, size) of the mapped buffer `buf` (view_len
 * bytes), given the ID index `ib` of n entries (24 bytes each: u64 first_ms,
 * u64 first_seq, u32 relative offset, u32 position). The headers from the
 * index's floor entry up to the next entry (or `size`) are walked as the
 * Python loop walks them. FOUND: *pfound and the position of its batch
 * *ppos; when no batch there reaches the ID, the next index entry's offset
 * and position, or (-1, -1) when none follows (the caller's end offset).
 * UNSURE when anything it needs lies past the mapping or a header is
 * malformed. */
enum { FOUND, UNSURE };

static int
find_id(const unsigned char *buf, Py_ssize_t view_len, Py_ssize_t size, const unsigned char *ib, Py_ssize_t n,
        long long base, unsigned long long ms, unsigned long long seq, long long *pfound, long long *ppos)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) { /* bisect_right on (first_ms, first_seq) */
        Py_ssize_t mid = (lo + hi) / 2;
        uint64_t m = le64(ib + 24 * mid), q = le64(ib + 24 * mid + 8);
        if (ms < m || (ms == m && seq < q))
            hi = mid;
        else
            lo = mid + 1;
    }
    Py_ssize_t i = lo - 1;
    long long start, stop_pos = size, after = -1, after_pos = -1;
    if (i >= 0)
        start = le32(ib + 24 * i + 20);
    else if (n && le32(ib + 20) == 0) {
        *pfound = base; /* the first batch starts above the ID */
        *ppos = 0;
        return FOUND;
    } else
        start = 0;
    if (i + 1 < n) {
        stop_pos = after_pos = le32(ib + 24 * (i + 1) + 20);
        after = base + le32(ib + 24 * (i + 1) + 16);
    }
    if (stop_pos > size || stop_pos > view_len)
        return UNSURE;
    Py_ssize_t p = (Py_ssize_t)start;
    while (p < stop_pos) {
        if (p + HEADER_BYTES > stop_pos)
            return UNSURE;
        const unsigned char *h = buf + p;
        uint32_t length = le32(h + 8), cnt = le32(h + 24);
        if (cnt == 0 || (uint64_t)length < HEADER_BYTES + 20ULL * cnt || (Py_ssize_t)length > stop_pos - p)
            return UNSURE;
        uint64_t lm = le64(h + 48), ls = le64(h + 56);
        if (lm > ms || (lm == ms && ls >= seq)) {
            const unsigned char *idp = h + HEADER_BYTES;
            uint32_t a = 0, b = cnt;
            while (a < b) { /* bisect_left on the batch's IDs */
                uint32_t mid = a + (b - a) / 2;
                uint64_t m = le64(idp + 16 * mid), q = le64(idp + 16 * mid + 8);
                if (m < ms || (m == ms && q < seq))
                    a = mid + 1;
                else
                    b = mid;
            }
            *pfound = (long long)le64(h) + a;
            *ppos = p;
            return FOUND;
        }
        p += length;
    }
    *pfound = after;
    *ppos = after_pos;
    return FOUND;
}

/* find_id() on the buffers of the mapping mv and the ID index ids: FOUND
 * or UNSURE with mv's buffer held in *view (the caller releases it), or -1
 * with an exception set and nothing held. */
static int
lookup(PyObject *mv, PyObject *ids, Py_ssize_t size, long long base, unsigned long long ms,
       unsigned long long seq, Py_buffer *view, long long *pfound, long long *ppos)
{
    Py_buffer iv;
    if (PyObject_GetBuffer(ids, &iv, PyBUF_SIMPLE) != 0)
        return -1;
    if (PyObject_GetBuffer(mv, view, PyBUF_SIMPLE) != 0) {
        PyBuffer_Release(&iv);
        return -1;
    }
    int rc = find_id((const unsigned char *)view->buf, view->len, size, (const unsigned char *)iv.buf,
                     iv.len / 24, base, ms, seq, pfound, ppos);
    PyBuffer_Release(&iv);
    return rc;
}

/* find(mv, size, ids, base, ms, seq) -> (offset, position), or None
 *
 * Segment.find_id for a mapped segment: find_id() above on the mapping mv
 * (the file's first `size` bytes valid) and its ID index `ids`. */
static PyObject *
walk_find(PyObject *self, PyObject *args)
{
    PyObject *mv, *ids;
    Py_ssize_t size;
    long long base, found, pos;
    unsigned long long ms, seq;
    if (!PyArg_ParseTuple(args, "OnOLKK", &mv, &size, &ids, &base, &ms, &seq))
        return NULL;
    Py_buffer view;
    int rc = lookup(mv, ids, size, base, ms, seq, &view, &found, &pos);
    if (rc < 0)
        return NULL;
    PyBuffer_Release(&view);
    if (rc != FOUND)
        Py_RETURN_NONE;
    return Py_BuildValue("(LL)", found, pos);
}

/* after(mv, size, ids, base, ms, seq, lo, stop, left, chunks)
 *     -> (next offset, count, done), or None
 *
 * XREAD's read in one segment, in one call: find()'s lookup of the first
 * offset whose ID is >= (ms, seq), then batches()'s walk from its batch up
 * to offset `stop` (at most `left` entries, -1: no bound), the entries
 * appended to `chunks` as slices of mv. None, with nothing appended, when
 * find() would be unsure, or the offset found is not in [lo, stop) (the
 * log's start, and the end of what may be read here): the caller then
 * takes the general path. The walk stops where batches() stops (the
 * mapping's end, a header it cannot take, `stop`, `left`); the caller goes
 * on from the next offset returned. */
static PyObject *
walk_after(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* METH_FASTCALL, its arguments converted one by one as the format
     * "OnOLKKLLLO!" converted them: every XREAD calls it, and the tuple and
     * the format's parse were a tenth of a poll's instructions
     * (bench/RESULTS.md "XREAD: the per-call Python"). */
    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError, "after() takes exactly 10 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *mv = args[0], *ids = args[2], *chunks = args[9];
    long long found, pos;
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    long long base = PyLong_AsLongLong(args[3]);
    unsigned long long ms = PyLong_AsUnsignedLongLongMask(args[4]);
    unsigned long long seq = PyLong_AsUnsignedLongLongMask(args[5]);
    long long lo = PyLong_AsLongLong(args[6]), stop = PyLong_AsLongLong(args[7]), left = PyLong_AsLongLong(args[8]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyList_Check(chunks)) {
        PyErr_SetString(PyExc_TypeError, "after(): chunks must be a list");
        return NULL;
    }
    Py_buffer view;
    int rc = lookup(mv, ids, size, base, ms, seq, &view, &found, &pos);
    if (rc < 0)
        return NULL;
    if (rc != FOUND || found < lo || found >= stop) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    Py_ssize_t p = (Py_ssize_t)pos, walk_size = size < view.len ? size : view.len;
    long long count, nbytes;
    int done;
    rc = walk(mv, (const unsigned char *)view.buf, &p, walk_size, &found, stop, left, chunks, NULL, 0, &count,
              &nbytes, &done);
    PyBuffer_Release(&view);
    if (rc != 0)
        return NULL;
    PyObject *result = PyTuple_New(3); /* (an item left NULL is fine to free) */
    if (result == NULL)
        return NULL;
    PyTuple_SET_ITEM(result, 2, Py_NewRef(done ? Py_True : Py_False));
    if (fill(result, 0, PyLong_FromLongLong(found)) != 0
        || fill(result, 1, PyLong_FromLongLong(count)) != 0)
        Py_CLEAR(result);
    return result;
}

/* map_file(m, fd) -> None
 *
 * Turn `m`, an anonymous read-only mmap.mmap (mmap.mmap(-1, length,
 * flags=MAP_PRIVATE, prot=PROT_READ): address space, no memory charged),
 * into a shared read-only mapping of the file `fd`
 * from its start, over the same addresses and length (mmap(2) MAP_FIXED
 * replaces the anonymous pages in one call). The length may exceed the
 * file's size, which mmap.mmap(fd, length) refuses: bytes appended to the
 * file later are read through the mapping without a new one (a shared
 * file mapping shows the page cache, which pwrite fills). Pages wholly
 * past the file's end fault with SIGBUS when touched: the caller reads
 * only bytes the file holds (storage/segment.py). `m` stays an mmap.mmap
 * (server._mapsend splices its slices; close() and the object's end unmap
 * the same range). OSError when the mapping fails: `m` must then be
 * closed, never read (its range may have been unmapped). */
static PyObject *
walk_map_file(PyObject *self, PyObject *args)
{
    PyObject *m;
    int fd;
    if (!PyArg_ParseTuple(args, "Oi", &m, &fd))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(m, &view, PyBUF_SIMPLE) != 0)
        return NULL;
    void *addr = view.buf;
    size_t length = (size_t)view.len;
    PyBuffer_Release(&view); /* m keeps the range mapped: only its address is used */
    long page = sysconf(_SC_PAGESIZE);
    if (length == 0 || page <= 0 || (uintptr_t)addr % (uintptr_t)page != 0) {
        PyErr_SetString(PyExc_ValueError, "map_file() needs a whole, non-empty mmap");
        return NULL;
    }
    if (mmap(addr, length, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"batches", walk_batches, METH_VARARGS, "Walk whole batches of a buffer, appending entry ranges as slices."},
    {"read", walk_read, METH_VARARGS, "Find the batch holding an offset in a mapped segment, then walk as batches()."},
    {"find", walk_find, METH_VARARGS, "The first offset of a mapped segment whose ID is at or above one, and its batch's position."},
    {"after", (PyCFunction)(void (*)(void))walk_after, METH_FASTCALL, "find() then batches() from the offset found, in one call: XREAD's read in a mapped segment."},
    {"map_file", walk_map_file, METH_VARARGS, "Map a file over an anonymous read-only mmap's range, past the file's end if longer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "storage._walk",
    "The batch walk of Segment.read in C, for its common case.", -1, methods,
};

PyMODINIT_FUNC
PyInit__walk(void)
{
    return PyModule_Create(&module);
}
