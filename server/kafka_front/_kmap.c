/*
 * server.kafka_front._kmap: the two loops per record of the Kafka mapping, in C.
 *
 * server/kafka_front/mapping.py has the mapping and its Python versions of
 * both (the reference tests/server/kafka/test_mapping.py compares these
 * with, byte for byte, and the fallback without a compiler):
 *
 *   produce_entries(records, count, ms=-1, seq=0) -> (entries, largest, refused, total)
 *       `records` holds `count` Kafka records (the part of a v2 record batch
 *       after its header, decompressed). largest: the field and value bytes
 *       of the largest entry; refused: the index of the first record the
 *       mapping refuses (a null key with a header named "key", a null value
 *       with one named "value"), else -1. With ms < 0 (or a refused record)
 *       that is all: entries is None. Else entries: each record as the
 *       stored stream-v1 entry of ID (ms, seq + i), `*2 $<ms>-<seq> *<n>
 *       $key $<key> $value $<value> $<hkey> $<hvalue> ...` (key and value
 *       left out when null, a null header value stored empty), in
 *       (ms, seq + i, entry) tuples as storage.streams.Stream keeps entries,
 *       and total: their bytes. The broker gives the IDs (the front-end's
 *       `make_entries`, cluster/broker/records.py). Raises ValueError for
 *       bytes that are not `count` well-formed records exactly (every length
 *       checked against what is left before it is used).
 *
 *   fetch_batches(out, chunk, entries, i, leader_epoch) -> (i, starts)
 *       `chunk` holds stored stream-v1 entries back to back (trusted: the
 *       log checked them), entries[i:] their (offset, ms, seq). Appends to
 *       bytearray `out` one record batch (magic 2, LogAppendTime, no
 *       producer, uncompressed) per run of entries with the same ms:
 *       offset deltas from the run's first offset, the ms as the batch's
 *       timestamps, each entry's first `key` field as the key, first
 *       `value` field as the value, every other field a header. The CRC is
 *       left 0: starts lists where each batch begins in `out`, for the
 *       caller to fill it (crc32c). Returns the index after the chunk's
 *       last entry.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* -- varints ------------------------------------------------------------ */

/* A zig-zag varint of at most `max_bytes` bytes; NULL when malformed or past end. */
static const unsigned char *
read_varlong(const unsigned char *p, const unsigned char *end, int max_bytes, int64_t *out)
{
    uint64_t z = 0;
    int shift = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (p >= end)
            return NULL;
        unsigned char b = *p++;
        z |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
            return p;
        }
        shift += 7;
    }
    return NULL;
}

static int
varint_size(int64_t v)
{
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static unsigned char *
write_varint(unsigned char *p, int64_t v)
{
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (z >= 0x80) {
        *p++ = (unsigned char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    *p++ = (unsigned char)z;
    return p;
}

static int
decimal_size(int64_t v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* -- produce ------------------------------------------------------------- */

typedef struct {
    const unsigned char *p;
    int64_t n; /* -1: null */
} Bytes;

#define MAX_HEADERS 100000

/* `<v>\r\n` in decimal. */
static char *
write_decimal(char *out, int64_t v)
{
    int n = decimal_size(v);
    for (int j = n - 1; j >= 0; j--) {
        out[j] = (char)('0' + v % 10);
        v /= 10;
    }
    out[n] = '\r';
    out[n + 1] = '\n';
    return out + n + 2;
}

/* One bulk string `$<n>\r\n<bytes>\r\n`. */
static char *
write_bulk(char *out, const unsigned char *p, int64_t n)
{
    *out++ = '$';
    out = write_decimal(out, n);
    if (n > 0)
        memcpy(out, p, (size_t)n);
    out += n;
    *out++ = '\r';
    *out++ = '\n';
    return out;
}

static int64_t
bulk_size(int64_t n)
{
    return 1 + decimal_size(n) + 2 + n + 2;
}

static const unsigned char *
read_bytes(const unsigned char *p, const unsigned char *end, Bytes *b)
{
    p = read_varlong(p, end, 5, &b->n);
    if (p == NULL || b->n < -1 || (b->n > 0 && b->n > end - p))
        return NULL;
    b->p = p;
    return b->n > 0 ? p + b->n : p;
}

/* One record at p (a record of index i, for messages): its key, value and
 * headers (into *headers, grown as needed). Returns the end of the record,
 * NULL with an exception set when it does not parse. */
typedef struct {
    Bytes key, value;
    int64_t nheaders;
    int64_t fields;  /* entry fields: 2 per key, value and header */
    int64_t size;    /* the body's bytes (`*<fields>` and the bulks) */
    int64_t data;    /* field and value bytes (what max-entry-bytes limits) */
    int refused;     /* the mapping refuses it (a null key with a header "key" ...) */
} Rec;

static const unsigned char *
parse_record(const unsigned char *p, const unsigned char *end, Py_ssize_t i, Rec *r,
             Bytes **headers, int64_t *cap)
{
    int64_t length, ts_delta, off_delta;
    p = read_varlong(p, end, 5, &length);
    if (p == NULL || length < 0 || length > end - p) {
        PyErr_Format(PyExc_ValueError, "record %zd: bad length", i);
        return NULL;
    }
    const unsigned char *rec_end = p + length;
    if (p >= rec_end) {
        PyErr_Format(PyExc_ValueError, "record %zd: empty", i);
        return NULL;
    }
    p++; /* attributes */
    if ((p = read_varlong(p, rec_end, 10, &ts_delta)) == NULL
            || (p = read_varlong(p, rec_end, 5, &off_delta)) == NULL
            || (p = read_bytes(p, rec_end, &r->key)) == NULL
            || (p = read_bytes(p, rec_end, &r->value)) == NULL
            || (p = read_varlong(p, rec_end, 5, &r->nheaders)) == NULL) {
        PyErr_Format(PyExc_ValueError, "record %zd: a field runs past its record", i);
        return NULL;
    }
    if (r->nheaders < 0 || r->nheaders > rec_end - p || r->nheaders > MAX_HEADERS) {
        PyErr_Format(PyExc_ValueError, "record %zd: %lld headers", i, (long long)r->nheaders);
        return NULL;
    }
    if (2 * r->nheaders > *cap) {
        PyMem_Free(*headers);
        *cap = 4 * r->nheaders;
        *headers = PyMem_Malloc(sizeof(Bytes) * (size_t)*cap);
        if (*headers == NULL) {
            *cap = 0;
            PyErr_NoMemory();
            return NULL;
        }
    }
    Bytes *h = *headers;
    r->fields = (r->key.n >= 0 ? 2 : 0) + (r->value.n >= 0 ? 2 : 0) + 2 * r->nheaders;
    r->size = 1 + decimal_size(r->fields) + 2;
    r->data = 0;
    r->refused = 0;
    if (r->key.n >= 0) {
        r->size += bulk_size(3) + bulk_size(r->key.n);
        r->data += 3 + r->key.n;
    }
    if (r->value.n >= 0) {
        r->size += bulk_size(5) + bulk_size(r->value.n);
        r->data += 5 + r->value.n;
    }
    for (int64_t k = 0; k < r->nheaders; k++) {
        Bytes *hk = &h[2 * k], *hv = &h[2 * k + 1];
        if ((p = read_bytes(p, rec_end, hk)) == NULL || hk->n < 0 || (p = read_bytes(p, rec_end, hv)) == NULL) {
            PyErr_Format(PyExc_ValueError, "record %zd: a bad header", i);
            return NULL;
        }
        if ((r->key.n < 0 && hk->n == 3 && memcmp(hk->p, "key", 3) == 0)
                || (r->value.n < 0 && hk->n == 5 && memcmp(hk->p, "value", 5) == 0))
            r->refused = 1;
        int64_t hvn = hv->n < 0 ? 0 : hv->n;
        r->size += bulk_size(hk->n) + bulk_size(hvn);
        r->data += hk->n + hvn;
    }
    if (p != rec_end) {
        PyErr_Format(PyExc_ValueError, "record %zd: %lld bytes after its fields", i, (long long)(rec_end - p));
        return NULL;
    }
    return p;
}

static char *
write_body(char *out, Rec *r, Bytes *h)
{
    *out++ = '*';
    out = write_decimal(out, r->fields);
    if (r->key.n >= 0) {
        out = write_bulk(out, (const unsigned char *)"key", 3);
        out = write_bulk(out, r->key.p, r->key.n);
    }
    if (r->value.n >= 0) {
        out = write_bulk(out, (const unsigned char *)"value", 5);
        out = write_bulk(out, r->value.p, r->value.n);
    }
    for (int64_t k = 0; k < r->nheaders; k++) {
        out = write_bulk(out, h[2 * k].p, h[2 * k].n);
        out = write_bulk(out, h[2 * k + 1].p, h[2 * k + 1].n < 0 ? 0 : h[2 * k + 1].n);
    }
    return out;
}

/* produce_entries(records, count, ms=-1, seq=0) -> (entries, largest, refused, total)
 * With ms < 0 the records are only checked: entries is None. Else each
 * record becomes the stored entry of ID (ms, seq + i): `*2 $<id> <body>`,
 * in a list of (ms, seq + i, entry) tuples, and total is their bytes. */
static PyObject *
produce_entries(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t count;
    long long ms = -1;
    unsigned long long seq = 0;
    if (!PyArg_ParseTuple(args, "y*n|LK", &view, &count, &ms, &seq))
        return NULL;
    const unsigned char *start = view.buf;
    const unsigned char *end = start + view.len;
    const unsigned char *p = start;
    PyObject *entries = NULL;
    Bytes *headers = NULL;
    int64_t cap = 0, largest = 0, total = 0;
    Py_ssize_t refused = -1;
    Rec r;
    if (count < 0 || count > view.len) {
        PyErr_Format(PyExc_ValueError, "%zd records in %zd bytes", count, view.len);
        goto fail;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if ((p = parse_record(p, end, i, &r, &headers, &cap)) == NULL)
            goto fail;
        if (r.refused && refused < 0)
            refused = i;
        if (r.data > largest)
            largest = r.data;
    }
    if (p != end) {
        PyErr_Format(PyExc_ValueError, "%zd bytes after the batch's %zd records", (Py_ssize_t)(end - p), count);
        goto fail;
    }
    if (ms < 0 || refused >= 0) {
        PyMem_Free(headers);
        PyBuffer_Release(&view);
        return Py_BuildValue("(OLnL)", Py_None, (long long)largest, refused, 0LL);
    }
    entries = PyList_New(count);
    if (entries == NULL)
        goto fail;
    p = start;
    for (Py_ssize_t i = 0; i < count; i++) {
        char id[48];
        unsigned long long s = seq + (unsigned long long)i;
        int idlen = snprintf(id, sizeof(id), "%lld-%llu", ms, s);
        p = parse_record(p, end, i, &r, &headers, &cap);  /* (checked above: cannot fail) */
        if (p == NULL)
            goto fail;
        int64_t size = 4 + 1 + decimal_size(idlen) + 2 + idlen + 2 + r.size;
        PyObject *entry = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
        if (entry == NULL)
            goto fail;
        char *out = PyBytes_AS_STRING(entry);
        memcpy(out, "*2\r\n", 4);
        out = write_bulk(out + 4, (const unsigned char *)id, idlen);
        out = write_body(out, &r, headers);
        if (out - PyBytes_AS_STRING(entry) != size) {
            Py_DECREF(entry);
            PyErr_SetString(PyExc_SystemError, "produce_entries: size mismatch");
            goto fail;
        }
        PyObject *item = Py_BuildValue("(LKN)", ms, s, entry);
        if (item == NULL)
            goto fail;
        PyList_SET_ITEM(entries, i, item);
        total += size;
    }
    PyMem_Free(headers);
    PyBuffer_Release(&view);
    return Py_BuildValue("(NLnL)", entries, (long long)largest, refused, (long long)total);
fail:
    PyMem_Free(headers);
    Py_XDECREF(entries);
    PyBuffer_Release(&view);
    return NULL;
}

/* -- fetch ----------------------------------------------------------------- */

#define BATCH_HEADER 61
#define ATTR_LOG_APPEND_TIME 0x08

/* A canonical decimal ending in CRLF at p (stored data: trusted, but bounded). */
static const char *
stored_len(const char *p, const char *end, int64_t *out)
{
    int64_t v = 0;
    const char *start = p;
    while (p < end && *p >= '0' && *p <= '9' && p - start < 18)
        v = v * 10 + (*p++ - '0');
    if (p == start || end - p < 2 || p[0] != '\r')
        return NULL;
    *out = v;
    return p + 2;
}

typedef struct {
    const char *p;
    int64_t n;
} Field;

/* The fields of the stored entry at p: `*2 $<n> <id> *<k>` then k bulks.
 * Returns the end of the entry, NULL when malformed. */
static const char *
entry_fields(const char *p, const char *end, Field **fields, int64_t *cap, int64_t *k)
{
    int64_t n;
    if (end - p < 5 || memcmp(p, "*2\r\n$", 5) != 0)
        return NULL;
    p = stored_len(p + 5, end, &n);
    if (p == NULL || n > end - p - 2)
        return NULL;
    p += n + 2;
    if (p >= end || *p != '*')
        return NULL;
    p = stored_len(p + 1, end, k);
    if (p == NULL || *k < 0 || *k > end - p)
        return NULL;
    if (*k > *cap) {
        PyMem_Free(*fields);
        *cap = *k * 2;
        *fields = PyMem_Malloc(sizeof(Field) * (size_t)*cap);
        if (*fields == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
    }
    for (int64_t j = 0; j < *k; j++) {
        if (p >= end || *p != '$')
            return NULL;
        p = stored_len(p + 1, end, &n);
        if (p == NULL || n > end - p - 2)
            return NULL;
        (*fields)[j].p = p;
        (*fields)[j].n = n;
        p += n + 2;
    }
    return p;
}

typedef struct {
    int64_t key, value; /* field index of the key's and value's values, -1: none */
    int64_t body;       /* the record's size after its length varint */
} Shape;

static void
shape_of(Field *f, int64_t k, int64_t offset_delta, Shape *s)
{
    s->key = s->value = -1;
    int64_t headers = 0, hbytes = 0;
    for (int64_t j = 0; j + 1 < k; j += 2) {
        if (s->key < 0 && f[j].n == 3 && memcmp(f[j].p, "key", 3) == 0)
            s->key = j + 1;
        else if (s->value < 0 && f[j].n == 5 && memcmp(f[j].p, "value", 5) == 0)
            s->value = j + 1;
        else {
            headers++;
            hbytes += varint_size(f[j].n) + f[j].n + varint_size(f[j + 1].n) + f[j + 1].n;
        }
    }
    int64_t body = 1 + 1 + varint_size(offset_delta);
    body += s->key < 0 ? 1 : varint_size(f[s->key].n) + f[s->key].n;
    body += s->value < 0 ? 1 : varint_size(f[s->value].n) + f[s->value].n;
    body += varint_size(headers) + hbytes;
    s->body = body;
}

static unsigned char *
write_record(unsigned char *o, Field *f, int64_t k, int64_t offset_delta, Shape *s)
{
    o = write_varint(o, s->body);
    *o++ = 0;    /* attributes */
    *o++ = 0;    /* timestamp delta: the batch's timestamp */
    o = write_varint(o, offset_delta);
    if (s->key < 0) {
        *o++ = 1;
    } else {
        o = write_varint(o, f[s->key].n);
        memcpy(o, f[s->key].p, (size_t)f[s->key].n);
        o += f[s->key].n;
    }
    if (s->value < 0) {
        *o++ = 1;
    } else {
        o = write_varint(o, f[s->value].n);
        memcpy(o, f[s->value].p, (size_t)f[s->value].n);
        o += f[s->value].n;
    }
    int64_t headers = (k / 2) - (s->key >= 0) - (s->value >= 0);
    o = write_varint(o, headers);
    for (int64_t j = 0; j + 1 < k; j += 2) {
        if (j + 1 == s->key || j + 1 == s->value)
            continue;
        o = write_varint(o, f[j].n);
        memcpy(o, f[j].p, (size_t)f[j].n);
        o += f[j].n;
        o = write_varint(o, f[j + 1].n);
        memcpy(o, f[j + 1].p, (size_t)f[j + 1].n);
        o += f[j + 1].n;
    }
    return o;
}

static void
put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void
put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static int
entry_at(PyObject *entries, Py_ssize_t i, int64_t *offset, int64_t *ms)
{
    if (i >= PyList_GET_SIZE(entries)) {
        PyErr_SetString(PyExc_ValueError, "more entries in the chunk than in the list");
        return -1;
    }
    PyObject *t = PyList_GET_ITEM(entries, i);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 2) {
        PyErr_SetString(PyExc_TypeError, "entries are (offset, ms, seq) tuples");
        return -1;
    }
    *offset = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 0));
    *ms = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 1));
    return PyErr_Occurred() ? -1 : 0;
}

/* One pass over the chunk: with `out` NULL it only measures (returns the
 * bytes the batches take), else it writes them at `out` and appends each
 * batch's start (`base` + its position) to `starts`. -1 on error. */
static int64_t
fetch_pass(const char *chunk, Py_ssize_t len, PyObject *entries, Py_ssize_t i0, int32_t epoch,
           unsigned char *out, Py_ssize_t base, PyObject *starts, Py_ssize_t *i_end)
{
    const char *p = chunk, *end = chunk + len;
    Field *fields = NULL;
    int64_t cap = 0, k;
    int64_t total = 0;
    Py_ssize_t i = i0;
    while (p < end) {
        /* a run: the entries from here with the same ms */
        int64_t base_offset, ms, offset, ms2;
        if (entry_at(entries, i, &base_offset, &ms) < 0)
            goto fail;
        Py_ssize_t n = 0;
        int64_t size = BATCH_HEADER, last_delta = 0;
        unsigned char *o = out != NULL ? out + total + BATCH_HEADER : NULL;
        while (p < end) {
            if (entry_at(entries, i + n, &offset, &ms2) < 0)
                goto fail;
            if (ms2 != ms)
                break;
            const char *next = entry_fields(p, end, &fields, &cap, &k);
            if (next == NULL) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "stored entry at byte %zd does not parse", (Py_ssize_t)(p - chunk));
                goto fail;
            }
            Shape s;
            last_delta = offset - base_offset;
            shape_of(fields, k, last_delta, &s);
            size += varint_size(s.body) + s.body;
            if (o != NULL)
                o = write_record(o, fields, k, last_delta, &s);
            p = next;
            n++;
        }
        if (out != NULL) {
            unsigned char *h = out + total;
            put64(h, (uint64_t)base_offset);
            put32(h + 8, (uint32_t)(size - 12));
            put32(h + 12, (uint32_t)epoch);
            h[16] = 2;                          /* magic */
            put32(h + 17, 0);                   /* crc: the caller's */
            h[21] = 0;
            h[22] = ATTR_LOG_APPEND_TIME;       /* attributes */
            put32(h + 23, (uint32_t)last_delta);
            put64(h + 27, (uint64_t)ms);        /* base timestamp */
            put64(h + 35, (uint64_t)ms);        /* max timestamp */
            put64(h + 43, UINT64_MAX);          /* producer id -1 */
            h[51] = 0xFF;                       /* producer epoch -1 */
            h[52] = 0xFF;
            put32(h + 53, 0xFFFFFFFFu);         /* base sequence -1 */
            put32(h + 57, (uint32_t)n);
            PyObject *start = PyLong_FromSsize_t(base + (Py_ssize_t)total);
            if (start == NULL || PyList_Append(starts, start) < 0) {
                Py_XDECREF(start);
                goto fail;
            }
            Py_DECREF(start);
        }
        total += size;
        i += n;
    }
    PyMem_Free(fields);
    *i_end = i;
    return total;
fail:
    PyMem_Free(fields);
    return -1;
}

static PyObject *
fetch_batches(PyObject *self, PyObject *args)
{
    PyObject *out, *entries;
    Py_buffer chunk;
    Py_ssize_t i;
    int epoch;
    if (!PyArg_ParseTuple(args, "Yy*O!ni", &out, &chunk, &PyList_Type, &entries, &i, &epoch))
        return NULL;
    Py_ssize_t i_end;
    PyObject *starts = NULL;
    int64_t size = fetch_pass(chunk.buf, chunk.len, entries, i, epoch, NULL, 0, NULL, &i_end);
    if (size < 0)
        goto fail;
    Py_ssize_t base = PyByteArray_GET_SIZE(out);
    if (PyByteArray_Resize(out, base + (Py_ssize_t)size) < 0)
        goto fail;
    starts = PyList_New(0);
    if (starts == NULL)
        goto fail;
    int64_t written = fetch_pass(chunk.buf, chunk.len, entries, i, epoch,
                                 (unsigned char *)PyByteArray_AS_STRING(out) + base, base, starts, &i_end);
    if (written != size) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "fetch_batches: size mismatch");
        goto fail;
    }
    PyBuffer_Release(&chunk);
    return Py_BuildValue("(nN)", i_end, starts);
fail:
    Py_XDECREF(starts);
    PyBuffer_Release(&chunk);
    return NULL;
}

static PyMethodDef methods[] = {
    {"produce_entries", produce_entries, METH_VARARGS, "Kafka records -> stored stream-v1 entries."},
    {"fetch_batches", fetch_batches, METH_VARARGS, "Stored entries -> Kafka record batches (CRC left 0)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kmap", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__kmap(void)
{
    return PyModule_Create(&module);
}
