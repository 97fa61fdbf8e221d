/*
 * server._xaddrun: the pipelined XADD hot path in C.
 *
 * A producer that pipelines `XADD key * field value ...` sends runs of
 * commands that differ only in their field values. Done one by one in Python
 * (hiredis parse, dispatch, handler, ID, encoding, reply encoding) such a
 * command costs ~8 us of server CPU, four times Redis's whole XADD
 * (bench/RESULTS.md). This module takes a run of them straight from the
 * received bytes:
 *
 *   head_key(data, pos) -> the key of the `XADD key * ...` command whose
 *       header starts at data[pos], or None (any other command, any other
 *       form, an incomplete header).
 *
 *   scan(data, pos, key, last_ms, last_seq, now_ms, max_entry_bytes, budget)
 *       -> (end, entries, replies, last_ms, last_seq, used)
 *       Takes consecutive complete commands `XADD <key> * f v [f v ...]`
 *       from data[pos:], assigning each the ID Redis's `*` gives after
 *       (last_ms, last_seq) at wall-clock now_ms. entries: a list of
 *       (ms, seq, encoded entry) as storage.streams.Stream keeps deferred
 *       entries; replies: their bulk-string ID replies, concatenated;
 *       end: where the first command not taken starts; used: the bytes the
 *       entries count against the stream's deferred-bytes bound (the
 *       encoding + 20 each, as Stream.add counts them).
 *
 * It stops (taking nothing more) at the first command that is not exactly
 * that form in canonical RESP (every length in plain decimal, no leading
 * zeros: the only encoding Redis accepts and the one stored), names another
 * key, is incomplete, has fields and values of more than max_entry_bytes,
 * cannot get an ID (the ID space is exhausted), or once `used` reaches
 * budget. What it does not take goes through the general path, which gives
 * every error. The stored encoding of an entry is built from the request
 * bytes: `*2 $<id> *<2n>` then the field/value bulks exactly as received.
 *
 * The Python reference this is checked against: tests/server/test_xaddrun.py.
 *
 * Also here, for a consumer's poll (Dispatcher.read_poll): poll_xread(data)
 * reads `XREAD COUNT n STREAMS key id` straight from the received bytes
 * (see its comment); tests/server/test_xread_now.py checks the replies it
 * leads to against the parser and the handler's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MAX_ARGS 1000000LL
#define U64_MAX 0xFFFFFFFFFFFFFFFFULL

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

/* A canonical non-negative decimal ending in CRLF; returns the byte after
 * the CRLF, or NULL. */
static const char *
parse_len(const char *p, const char *end, long long *out)
{
    const char *start = p;
    long long v = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (p - start >= 12)
            return NULL;
        v = v * 10 + (*p - '0');
        p++;
    }
    if (p == start || (*start == '0' && p - start > 1))
        return NULL;
    if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
        return NULL;
    *out = v;
    return p + 2;
}

/* `*<n> $4 XADD $<k> <key> $1 *`: returns the byte after the `*` argument's
 * CRLF (the first field), or NULL. */
static const char *
parse_head(const char *p, const char *end, long long *nargs, const char **key, Py_ssize_t *klen)
{
    long long n, len;
    if (p >= end || *p != '*')
        return NULL;
    p = parse_len(p + 1, end, &n);
    if (p == NULL || n < 5 || !(n & 1) || n > MAX_ARGS)
        return NULL;
    if (end - p < 10 || memcmp(p, "$4\r\n", 4) != 0)
        return NULL;
    if ((p[4] | 0x20) != 'x' || (p[5] | 0x20) != 'a' || (p[6] | 0x20) != 'd'
        || (p[7] | 0x20) != 'd' || p[8] != '\r' || p[9] != '\n')
        return NULL;
    p += 10;
    if (p >= end || *p != '$')
        return NULL;
    p = parse_len(p + 1, end, &len);
    if (p == NULL || end - p < len + 2)
        return NULL;
    *key = p;
    *klen = (Py_ssize_t)len;
    p += len;
    if (p[0] != '\r' || p[1] != '\n')
        return NULL;
    p += 2;
    if (end - p < 7 || memcmp(p, "$1\r\n*\r\n", 7) != 0)
        return NULL;
    *nargs = n;
    return p + 7;
}

static PyObject *
head_key(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t pos;
    long long n;
    const char *key;
    Py_ssize_t klen;
    PyObject *result;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &pos))
        return NULL;
    if (pos < 0 || pos > buf.len) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "pos out of range");
        return NULL;
    }
    const char *data = (const char *)buf.buf;
    if (parse_head(data + pos, data + buf.len, &n, &key, &klen) == NULL) {
        PyBuffer_Release(&buf);
        Py_RETURN_NONE;
    }
    result = PyBytes_FromStringAndSize(key, klen);
    PyBuffer_Release(&buf);
    return result;
}

/* Decimal digits of v at out (no terminator); returns how many. */
static int
format_u64(char *out, unsigned long long v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

/* A growable byte buffer for the replies. */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
} outbuf;

static int
out_reserve(outbuf *o, Py_ssize_t more)
{
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : 1024;
    while (cap < o->len + more)
        cap *= 2;
    char *grown = PyMem_Realloc(o->data, cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->data = grown;
    o->cap = cap;
    return 0;
}

static PyObject *
scan(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t pos, max_entry_bytes, budget;
    PyObject *key_obj;
    unsigned long long last_ms, last_seq, now_ms;
    PyObject *entries = NULL, *replies = NULL, *result = NULL;
    outbuf out = {NULL, 0, 0};
    Py_ssize_t used = 0;
    PyObject *ms_obj = NULL; /* shared by the entries of one millisecond */
    unsigned long long ms_obj_value = 0;

    if (!PyArg_ParseTuple(args, "y*nSKKKnn", &buf, &pos, &key_obj, &last_ms, &last_seq,
                          &now_ms, &max_entry_bytes, &budget))
        return NULL;
    if (pos < 0 || pos > buf.len) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "pos out of range");
        return NULL;
    }
    const char *want_key = PyBytes_AS_STRING(key_obj);
    Py_ssize_t want_klen = PyBytes_GET_SIZE(key_obj);
    const char *data = (const char *)buf.buf;
    const char *end = data + buf.len;
    const char *p = data + pos;

    entries = PyList_New(0);
    if (entries == NULL)
        goto done;

    while (p < end && used < budget) {
        long long nargs, len;
        const char *key;
        Py_ssize_t klen;
        const char *fields = parse_head(p, end, &nargs, &key, &klen);
        if (fields == NULL || klen != want_klen || memcmp(key, want_key, klen) != 0)
            break;
        /* The field/value bulks: all complete and canonical. */
        const char *q = fields;
        long long entry_bytes = 0;
        long long i;
        for (i = 3; i < nargs; i++) {
            if (q >= end || *q != '$')
                break;
            q = parse_len(q + 1, end, &len);
            if (q == NULL || end - q < len + 2 || q[len] != '\r' || q[len + 1] != '\n')
                break;
            q += len + 2;
            entry_bytes += len;
        }
        if (i < nargs || entry_bytes > max_entry_bytes)
            break;
        /* Redis's `*`: the wall clock, or one more than the last ID. */
        unsigned long long ms, seq;
        if (now_ms > last_ms) {
            ms = now_ms;
            seq = 0;
        } else if (last_seq != U64_MAX) {
            ms = last_ms;
            seq = last_seq + 1;
        } else if (last_ms != U64_MAX) {
            ms = last_ms + 1;
            seq = 0;
        } else {
            break;
        }
        /* The ID as text, then the reply `$<len>\r\n<id>\r\n` and the
         * stored entry's head `*2\r\n$<len>\r\n<id>\r\n*<2n>\r\n`. */
        char id[48];
        int idlen = format_u64(id, ms);
        id[idlen++] = '-';
        idlen += format_u64(id + idlen, seq);
        char idhead[8];
        int ihlen = 0;
        idhead[ihlen++] = '$';
        ihlen += format_u64(idhead + ihlen, (unsigned long long)idlen);
        idhead[ihlen++] = '\r';
        idhead[ihlen++] = '\n';
        char count[24];
        int clen = 0;
        count[clen++] = '*';
        clen += format_u64(count + clen, (unsigned long long)(nargs - 3));
        count[clen++] = '\r';
        count[clen++] = '\n';
        int hlen = 4 + ihlen + idlen + 2 + clen;
        Py_ssize_t body = (Py_ssize_t)(q - fields);
        PyObject *enc = PyBytes_FromStringAndSize(NULL, hlen + body);
        if (enc == NULL)
            goto done;
        char *w = PyBytes_AS_STRING(enc);
        memcpy(w, "*2\r\n", 4);
        memcpy(w + 4, idhead, ihlen);
        memcpy(w + 4 + ihlen, id, idlen);
        memcpy(w + 4 + ihlen + idlen, "\r\n", 2);
        memcpy(w + 4 + ihlen + idlen + 2, count, clen);
        memcpy(w + hlen, fields, body);
        PyObject *entry = PyTuple_New(3);
        if (entry == NULL) {
            Py_DECREF(enc);
            goto done;
        }
        if (ms_obj == NULL || ms != ms_obj_value) {
            Py_XDECREF(ms_obj);
            ms_obj = PyLong_FromUnsignedLongLong(ms);
            ms_obj_value = ms;
        }
        PyObject *seq_obj = PyLong_FromUnsignedLongLong(seq);
        if (ms_obj == NULL || seq_obj == NULL) {
            Py_XDECREF(seq_obj);
            Py_DECREF(enc);
            Py_DECREF(entry);
            goto done;
        }
        Py_INCREF(ms_obj);
        PyTuple_SET_ITEM(entry, 0, ms_obj);
        PyTuple_SET_ITEM(entry, 1, seq_obj);
        PyTuple_SET_ITEM(entry, 2, enc);
        int failed = PyList_Append(entries, entry);
        Py_DECREF(entry);
        if (failed)
            goto done;
        if (out_reserve(&out, ihlen + idlen + 2) < 0)
            goto done;
        memcpy(out.data + out.len, idhead, ihlen);
        memcpy(out.data + out.len + ihlen, id, idlen);
        memcpy(out.data + out.len + ihlen + idlen, "\r\n", 2);
        out.len += ihlen + idlen + 2;
        used += hlen + body + 20;
        last_ms = ms;
        last_seq = seq;
        p = q;
    }
    replies = PyBytes_FromStringAndSize(out.data ? out.data : "", out.len);
    if (replies == NULL)
        goto done;
    result = Py_BuildValue("(nOOKKn)", (Py_ssize_t)(p - data), entries, replies, last_ms, last_seq, used);

done:
    Py_XDECREF(ms_obj);
    Py_XDECREF(entries);
    Py_XDECREF(replies);
    PyMem_Free(out.data);
    PyBuffer_Release(&buf);
    return result;
}

/* `$<len>\r\n<bytes>\r\n` with canonical len; returns the byte after the
 * final CRLF, the argument in *arg, *alen, or NULL. */
static const char *
parse_bulk(const char *p, const char *end, const char **arg, Py_ssize_t *alen)
{
    long long len;
    if (p >= end || *p != '$')
        return NULL;
    p = parse_len(p + 1, end, &len);
    if (p == NULL || end - p < len + 2 || p[len] != '\r' || p[len + 1] != '\n')
        return NULL;
    *arg = p;
    *alen = (Py_ssize_t)len;
    return p + len + 2;
}

/* The bulk argument `word` (upper case), in any letter case. */
static const char *
parse_word(const char *p, const char *end, const char *word)
{
    const char *arg;
    Py_ssize_t alen, n = (Py_ssize_t)strlen(word);
    p = parse_bulk(p, end, &arg, &alen);
    if (p == NULL || alen != n)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((arg[i] & ~0x20) != word[i])
            return NULL;
    return p;
}

/* Canonical decimal digits (no sign, no leading zero) of at most 20 digits
 * that fit in a u64: 0, else -1. */
static int
digits_u64(const char *s, Py_ssize_t n, unsigned long long *out)
{
    unsigned long long v = 0;
    if (n == 0 || n > 20 || (s[0] == '0' && n > 1))
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned d = (unsigned char)s[i] - '0';
        if (d > 9 || v > (U64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* poll_xread(data) -> (key, count, ms, seq) or None
 *
 * `data` as exactly one command `XREAD COUNT <n> STREAMS <key> <id>` in
 * canonical RESP (lengths in plain decimal; the three words in any letter
 * case; nothing after it), n in plain decimal below 2^63, the ID `ms` or
 * `ms-seq` in plain decimal u64s (`ms` means ms-0, as XREAD reads it).
 * Anything else is None: the parser and XREAD's handler take it (`$`,
 * `+`, `>`, a negative count, leading zeros, errors). */
static PyObject *
poll_xread(PyObject *self, PyObject *data)
{
    /* METH_O, and the result built without a format string: every poll
     * calls it (bench/RESULTS.md "XREAD: the per-call Python"). */
    Py_buffer buf;
    if (PyUnicode_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "poll_xread() argument must be a bytes-like object, not str");
        return NULL;
    }
    if (PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE) != 0)
        return NULL;
    const char *p = (const char *)buf.buf, *end = p + buf.len;
    const char *arg, *key, *id;
    Py_ssize_t alen, klen, idlen;
    unsigned long long count, ms, seq = 0;
    PyObject *result = NULL;
    if (end - p < 4 || memcmp(p, "*6\r\n", 4) != 0)
        goto none;
    p += 4;
    if ((p = parse_word(p, end, "XREAD")) == NULL || (p = parse_word(p, end, "COUNT")) == NULL)
        goto none;
    if ((p = parse_bulk(p, end, &arg, &alen)) == NULL || digits_u64(arg, alen, &count) != 0
        || count > 0x7FFFFFFFFFFFFFFFULL)
        goto none;
    if ((p = parse_word(p, end, "STREAMS")) == NULL || (p = parse_bulk(p, end, &key, &klen)) == NULL
        || (p = parse_bulk(p, end, &id, &idlen)) == NULL || p != end)
        goto none;
    const char *dash = memchr(id, '-', (size_t)idlen);
    if (dash == NULL) {
        if (digits_u64(id, idlen, &ms) != 0)
            goto none;
    } else if (digits_u64(id, dash - id, &ms) != 0 || digits_u64(dash + 1, id + idlen - dash - 1, &seq) != 0)
        goto none;
    result = PyTuple_New(4); /* (an item left NULL is fine to free) */
    if (result != NULL
        && (fill(result, 0, PyBytes_FromStringAndSize(key, klen)) != 0
            || fill(result, 1, PyLong_FromUnsignedLongLong(count)) != 0
            || fill(result, 2, PyLong_FromUnsignedLongLong(ms)) != 0
            || fill(result, 3, PyLong_FromUnsignedLongLong(seq)) != 0))
        Py_CLEAR(result);
    PyBuffer_Release(&buf);
    return result;
none:
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

/* poll_head(protocol, key, n) -> bytes, or None for a protocol other than 2 or 3
 *
 * The reply of a poll that found n entries of key up to the entries, as
 * encode_into writes it: RESP2 `*1 *2 $<len> key *<n>` ([[key, entries]]),
 * RESP3 `%1 $<len> key *<n>` ({key: entries}), each part ended by CRLF.
 * The format operator it stands in for was ~2% of a poll's instructions
 * (bench/RESULTS.md "XREAD: the per-call Python"). */
static PyObject *
poll_head(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "poll_head() takes exactly 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "poll_head(): key must be bytes");
        return NULL;
    }
    long protocol = PyLong_AsLong(args[0]);
    unsigned long long n = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    const char *open = protocol == 2 ? "*1\r\n*2\r\n" : protocol == 3 ? "%1\r\n" : NULL;
    if (open == NULL)
        Py_RETURN_NONE;
    Py_ssize_t klen = PyBytes_GET_SIZE(args[1]), olen = (Py_ssize_t)strlen(open);
    char len_part[32], count_part[32]; /* $<klen>CRLF, CRLF*<n>CRLF */
    char *e = len_part;
    *e++ = '$';
    e += format_u64(e, (unsigned long long)klen);
    *e++ = '\r';
    *e++ = '\n';
    Py_ssize_t llen = e - len_part;
    e = count_part;
    *e++ = '\r';
    *e++ = '\n';
    *e++ = '*';
    e += format_u64(e, n);
    *e++ = '\r';
    *e++ = '\n';
    Py_ssize_t clen = e - count_part;
    PyObject *out = PyBytes_FromStringAndSize(NULL, olen + llen + klen + clen);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    memcpy(p, open, (size_t)olen);
    memcpy(p + olen, len_part, (size_t)llen);
    memcpy(p + olen + llen, PyBytes_AS_STRING(args[1]), (size_t)klen);
    memcpy(p + olen + llen + klen, count_part, (size_t)clen);
    return out;
}

static PyMethodDef methods[] = {
    {"head_key", head_key, METH_VARARGS,
     "head_key(data, pos) -> the key of the `XADD key * ...` command at pos, or None."},
    {"scan", scan, METH_VARARGS,
     "scan(data, pos, key, last_ms, last_seq, now_ms, max_entry_bytes, budget)\n"
     "-> (end, entries, replies, last_ms, last_seq, used): a run of `XADD key * f v ...`."},
    {"poll_head", (PyCFunction)(void (*)(void))poll_head, METH_FASTCALL,
     "poll_head(protocol, key, n) -> the reply of a poll that found n entries of key, up to the entries."},
    {"poll_xread", poll_xread, METH_O,
     "poll_xread(data) -> (key, count, ms, seq): data as exactly `XREAD COUNT n STREAMS key id`, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "server._xaddrun",
    "The pipelined `XADD key * field value ...` hot path (see the source's header).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__xaddrun(void)
{
    return PyModule_Create(&module);
}
