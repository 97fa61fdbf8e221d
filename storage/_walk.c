/*
 * storage._walk: the batch walk of Segment.read in C, for its common case.
 *
 *   batches(mv, p, size, cur, stop, left, chunks)
 *       -> (p, cur, count, nbytes, done)
 *
 * Walks the batches laid out in the buffer `mv` (a memoryview of a segment
 * file's mapping or of a pread buffer) from position p, as Segment.read's
 * Python loop does when no entry is deleted, no byte bound applies, entries
 * are not split one chunk each, no IDs are wanted and CRCs are not checked:
 * batches that end at or before offset `cur` are skipped; of each later
 * batch the entries in [cur, stop) are appended to the list `chunks` as ONE
 * memoryview slice of `mv` (their bytes are contiguous); at most `left`
 * entries in all (-1: no bound; `done` is true when the bound was reached,
 * as the Python loop sets acc.done).
 *
 * It returns (taking nothing it is unsure of) at the first batch it cannot
 * handle whole: one whose header or body is not entirely in [p, size), or
 * whose header is malformed. The Python loop then deals with that batch (a
 * refill, or the corruption error) and may call again. Returned: the
 * position of the first batch not walked, the next offset to read, the
 * entries and bytes appended.
 *
 * Batch layout (storage/records.py): a 72-byte header whose first 28 bytes
 * are base offset u64, length u32, crc u32, version u16, flags u16, epoch
 * u32, count u32 (little endian); then count IDs of 16 bytes, count u32
 * cumulative entry ends, then the entries.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#define HEADER_BYTES 72

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

static PyObject *
walk_batches(PyObject *self, PyObject *args)
{
    PyObject *mv, *chunks;
    Py_ssize_t p, size;
    long long cur, stop, left;
    if (!PyArg_ParseTuple(args, "OnnLLLO!", &mv, &p, &size, &cur, &stop, &left, &PyList_Type, &chunks))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(mv, &view, PyBUF_SIMPLE) != 0)
        return NULL;
    if (size > view.len)
        size = view.len;
    const unsigned char *buf = (const unsigned char *)view.buf;
    long long count = 0, nbytes = 0;
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
                PyBuffer_Release(&view);
                return NULL;
            }
            Py_DECREF(chunk);
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
    PyBuffer_Release(&view);
    return Py_BuildValue("(nLLLO)", p, cur, count, nbytes, done ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"batches", walk_batches, METH_VARARGS, "Walk whole batches of a buffer, appending entry ranges as slices."},
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
