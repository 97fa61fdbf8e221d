/*
 * storage.streams._ids: XACK's stream IDs parsed in C.
 *
 *   plain_ids(raws) -> [(ms, seq), ...], or None
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
        PyObject *a = PyLong_FromUnsignedLongLong(ms), *b = PyLong_FromUnsignedLongLong(seq);
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

static PyMethodDef methods[] = {
    {"plain_ids", plain_ids, METH_O, "Parse a list of <digits>-<digits> stream IDs, or None when one is not."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "storage.streams._ids", "XACK's stream IDs parsed in C.", -1, methods,
};

PyMODINIT_FUNC
PyInit__ids(void)
{
    return PyModule_Create(&module);
}
