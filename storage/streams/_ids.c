/*
 * storage.streams._ids: stream IDs in C for the group operations' loops
 * over a batch (XACK's hundred IDs, a delivery's).
 *
 *   plain_ids(raws) -> [(ms, seq), ...], or None
 *   pack_ids(ids) -> bytes
 *   pending_ids(ids, pel) -> [(ms, seq), ...], or None
 *
 * raws: a list of bytes. Each must be `<digits>-<digits>` (ASCII digits
 * only, both sides non-empty, at most 127 bytes in all, each number at most
 * 2**64 - 1): the form storage/streams/ids.py `_plain_id` takes, for which
 * Redis's string2ull answers the number itself (leading zeros included).
 * None as soon as one is not (anything else: the Python path parses each
 * one and gives every error); no partial result.
 *
 * The Python reference this is checked against: parse_strict_id_tuples's
 * general path (tests/storage/streams/test_ids.py).
 *
 * pack_ids: a group journal record's ID list (storage/streams/groups.py
 * `_ids`): a u32 count, then each ID's ms and seq as u64, little-endian.
 * ids: a list or tuple of (ms, seq) pairs of ints (any sequence of two);
 * OverflowError for a number outside [0, 2**64 - 1], TypeError otherwise.
 *
 * pending_ids: `[sid for sid in dict.fromkeys(ids) if sid in pel]` when
 * ids is a list of tuples of two ints in [0, 2**64 - 1] in strictly
 * ascending order (so no two are the same: an XACK of what a consumer was
 * given); None otherwise (the Python path dedupes). pel: a dict.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* The number of digits [s, e) in *out: 0, or -1 when not all ASCII digits,
 * empty, or above 2**64 - 1. */
static int
parse_u64(const char *s, const char *e, uint64_t *out)
{
    if (s == e)
        return -1;
    uint64_t v = 0;
    for (; s < e; s++) {
        unsigned d = (unsigned char)*s - '0';
        if (d > 9)
            return -1;
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static PyObject *
plain_ids(PyObject *self, PyObject *raws)
{
    if (!PyList_Check(raws)) {
        PyErr_SetString(PyExc_TypeError, "plain_ids takes a list of bytes");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(raws);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    /* IDs of one millisecond share its int (a batch's IDs mostly do). */
    uint64_t last_ms = 0;
    PyObject *last_a = NULL; /* borrowed from the previous tuple */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i);
        if (!PyBytes_Check(raw))
            goto not_plain;
        const char *s = PyBytes_AS_STRING(raw);
        Py_ssize_t len = PyBytes_GET_SIZE(raw);
        if (len > 127)
            goto not_plain;
        const char *dash = memchr(s, '-', (size_t)len);
        uint64_t ms, seq;
        if (dash == NULL || parse_u64(s, dash, &ms) != 0 || parse_u64(dash + 1, s + len, &seq) != 0)
            goto not_plain;
        PyObject *t = PyTuple_New(2);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, t);
        PyObject *a, *b = PyLong_FromUnsignedLongLong(seq);
        if (last_a != NULL && ms == last_ms) {
            a = last_a;
            Py_INCREF(a);
        } else {
            a = PyLong_FromUnsignedLongLong(ms);
            last_a = a;
            last_ms = ms;
        }
        PyTuple_SET_ITEM(t, 0, a); /* the list's dealloc drops the tuple and what it holds */
        PyTuple_SET_ITEM(t, 1, b);
        if (a == NULL || b == NULL) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
not_plain:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* Write v as 8 little-endian bytes at p. */
static void
put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* The two numbers of an (ms, seq) pair; -1 with an exception set when it
 * is not a pair of ints in [0, 2**64 - 1]. */
static int
id_pair(PyObject *item, uint64_t *ms, uint64_t *seq)
{
    PyObject *pair = PySequence_Fast(item, "a stream ID must be a pair of ints");
    if (pair == NULL)
        return -1;
    int rc = -1;
    if (PySequence_Fast_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_TypeError, "a stream ID must be a pair of ints");
    } else {
        *ms = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(pair, 0));
        if (!(*ms == (uint64_t)-1 && PyErr_Occurred())) {
            *seq = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(pair, 1));
            if (!(*seq == (uint64_t)-1 && PyErr_Occurred()))
                rc = 0;
        }
    }
    Py_DECREF(pair);
    return rc;
}

static PyObject *
pack_ids(PyObject *self, PyObject *ids)
{
    PyObject *seq = PySequence_Fast(ids, "pack_ids takes a list of stream IDs");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > (Py_ssize_t)UINT32_MAX || n > (PY_SSIZE_T_MAX - 4) / 16) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_OverflowError, "too many stream IDs");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 + 16 * n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    p[0] = (unsigned char)n;
    p[1] = (unsigned char)(n >> 8);
    p[2] = (unsigned char)(n >> 16);
    p[3] = (unsigned char)(n >> 24);
    p += 4;
    for (Py_ssize_t i = 0; i < n; i++, p += 16) {
        uint64_t ms, sq;
        if (id_pair(PySequence_Fast_GET_ITEM(seq, i), &ms, &sq) != 0) {
            Py_DECREF(seq);
            Py_DECREF(out);
            return NULL;
        }
        put_u64(p, ms);
        put_u64(p + 8, sq);
    }
    Py_DECREF(seq);
    return out;
}

/* The numbers of an exact tuple of two exact ints in [0, 2**64 - 1]; 0, or
 * -1 (no exception set) when it is anything else. */
static int
plain_pair(PyObject *item, uint64_t *ms, uint64_t *seq)
{
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2)
        return -1;
    PyObject *a = PyTuple_GET_ITEM(item, 0), *b = PyTuple_GET_ITEM(item, 1);
    if (!PyLong_CheckExact(a) || !PyLong_CheckExact(b))
        return -1;
    *ms = PyLong_AsUnsignedLongLong(a);
    if (*ms == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    *seq = PyLong_AsUnsignedLongLong(b);
    if (*seq == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

static PyObject *
pending_ids(PyObject *self, PyObject *args)
{
    PyObject *ids, *pel;
    if (!PyArg_ParseTuple(args, "O!O!:pending_ids", &PyList_Type, &ids, &PyDict_Type, &pel))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(ids);
    uint64_t prev_ms = 0, prev_seq = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t ms, seq;
        if (plain_pair(PyList_GET_ITEM(ids, i), &ms, &seq) != 0)
            Py_RETURN_NONE;
        if (i > 0 && (ms < prev_ms || (ms == prev_ms && seq <= prev_seq)))
            Py_RETURN_NONE; /* not strictly ascending: maybe a duplicate */
        prev_ms = ms;
        prev_seq = seq;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *sid = PyList_GET_ITEM(ids, i);
        int found = PyDict_Contains(pel, sid);
        if (found < 0 || (found && PyList_Append(out, sid) != 0)) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyMethodDef methods[] = {
    {"plain_ids", plain_ids, METH_O, "Parse a list of <digits>-<digits> stream IDs, or None when one is not."},
    {"pack_ids", pack_ids, METH_O, "A group journal record's ID list: u32 count, then u64 ms and seq each, little-endian."},
    {"pending_ids", pending_ids, METH_VARARGS,
     "The IDs of an ascending list that are keys of a dict, in order; None when not strictly ascending."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "storage.streams._ids", "Stream IDs in C for the group operations' batches.", -1, methods,
};

PyMODINIT_FUNC
PyInit__ids(void)
{
    return PyModule_Create(&module);
}
