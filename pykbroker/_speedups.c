/*
 * pykbroker._speedups: the C twin of pykbroker.protocol.records._scan_records_py.
 *
 * scan_records(data, count) walks the ``count`` records of one record batch v2 payload (uncompressed
 * bytes, after the 61-byte batch header) the way Kafka's DefaultRecord.readFrom does, and checks that:
 *   - each record's length varint is sane and the record fits in what is left;
 *   - the fields (attributes, timestamp delta, offset delta, key, value, headers) end exactly at the
 *     record's stated length; header counts and header key lengths are not negative;
 *   - record i has offset delta i (the broker assigns offsets in place, so deltas must be dense);
 *   - no bytes are left after the last record.
 * It returns (min timestamp delta, max timestamp delta) when every check passes, or a str describing the
 * first failure. The messages are the same, byte for byte, as the pure-Python twin's: tests compare them.
 * Varints follow Kafka's ByteUtils: zigzag, at most 5 bytes for int32 fields (bits past 32 dropped) and
 * 10 bytes for the int64 timestamp delta. Key, value and header value lengths below zero mean null.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Reads a zigzag varint of at most max_bytes from p[*pos..limit); 0 on success, -1 if malformed. */
static int read_varint(const unsigned char *p, Py_ssize_t limit, Py_ssize_t *pos, int max_bytes, uint64_t *raw_out)
{
    uint64_t raw = 0;
    int shift = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (*pos >= limit)
            return -1;
        unsigned char byte = p[(*pos)++];
        raw |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *raw_out = raw;
            return 0;
        }
        shift += 7;
    }
    return -1;
}

static int read_int32(const unsigned char *p, Py_ssize_t limit, Py_ssize_t *pos, int32_t *out)
{
    uint64_t raw;
    if (read_varint(p, limit, pos, 5, &raw) < 0)
        return -1;
    uint32_t value = (uint32_t)raw;
    *out = (int32_t)((value >> 1) ^ (0u - (value & 1u)));
    return 0;
}

static int read_int64(const unsigned char *p, Py_ssize_t limit, Py_ssize_t *pos, int64_t *out)
{
    uint64_t raw;
    if (read_varint(p, limit, pos, 10, &raw) < 0)
        return -1;
    *out = (int64_t)((raw >> 1) ^ (0ull - (raw & 1ull)));
    return 0;
}

/* Skips a length-prefixed field that may be null (negative length); -1 if it runs past the record. */
static int skip_nullable(Py_ssize_t limit, Py_ssize_t *pos, int32_t length)
{
    if (length < 0)
        return 0;
    if (length > limit - *pos)
        return -1;
    *pos += length;
    return 0;
}

#define FAIL(...) do { message = PyUnicode_FromFormat(__VA_ARGS__); goto done; } while (0)

static PyObject *scan_records(PyObject *self, PyObject *args)
{
    Py_buffer view;
    long long count;
    PyObject *message = NULL;
    if (!PyArg_ParseTuple(args, "y*L", &view, &count))
        return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t pos = 0;
    int64_t min_delta = 0, max_delta = 0;

    for (long long i = 0; i < count; i++) {
        int32_t size, offset_delta, length, header_count;
        int64_t timestamp_delta;
        if (read_int32(p, end, &pos, &size) < 0)
            FAIL("record %lld: malformed varint", i);
        if (size < 0 || size > end - pos)
            FAIL("record %lld: invalid record size %d with %zd bytes left in the batch", i, (int)size, end - pos);
        const Py_ssize_t record_start = pos, record_end = pos + size;
        if (pos >= record_end)
            FAIL("record %lld: a field runs past the record", i);
        pos++; /* attributes: unused in v2 */
        if (read_int64(p, record_end, &pos, &timestamp_delta) < 0 || read_int32(p, record_end, &pos, &offset_delta) < 0)
            FAIL("record %lld: a field runs past the record", i);
        if (offset_delta != i)
            FAIL("record %lld: offset delta %d, expected %lld", i, (int)offset_delta, i);
        if (read_int32(p, record_end, &pos, &length) < 0 || skip_nullable(record_end, &pos, length) < 0)
            FAIL("record %lld: a field runs past the record", i);
        if (read_int32(p, record_end, &pos, &length) < 0 || skip_nullable(record_end, &pos, length) < 0)
            FAIL("record %lld: a field runs past the record", i);
        if (read_int32(p, record_end, &pos, &header_count) < 0)
            FAIL("record %lld: a field runs past the record", i);
        if (header_count < 0)
            FAIL("record %lld: invalid number of headers %d", i, (int)header_count);
        for (int32_t h = 0; h < header_count; h++) {
            if (read_int32(p, record_end, &pos, &length) < 0)
                FAIL("record %lld: a field runs past the record", i);
            if (length < 0)
                FAIL("record %lld: invalid negative header key size %d", i, (int)length);
            if (skip_nullable(record_end, &pos, length) < 0 || read_int32(p, record_end, &pos, &length) < 0
                || skip_nullable(record_end, &pos, length) < 0)
                FAIL("record %lld: a field runs past the record", i);
        }
        if (pos != record_end)
            FAIL("record %lld: size %d does not match the %zd bytes its fields take", i, (int)size, pos - record_start);
        if (i == 0 || timestamp_delta < min_delta)
            min_delta = timestamp_delta;
        if (i == 0 || timestamp_delta > max_delta)
            max_delta = timestamp_delta;
    }
    if (pos != end)
        FAIL("%zd bytes remain after the declared %lld records", end - pos, count);
    PyBuffer_Release(&view);
    return Py_BuildValue("(LL)", (long long)min_delta, (long long)max_delta);

done:
    PyBuffer_Release(&view);
    return message;
}

/* count_null_keys(data, count): how many of the ``count`` records (already checked by scan_records) have a
 * null key; -1 if the data runs out (it cannot after scan_records). The C twin of null_key_indexes' count. */
static PyObject *count_null_keys(PyObject *self, PyObject *args)
{
    Py_buffer view;
    long long count, found = 0;
    if (!PyArg_ParseTuple(args, "y*L", &view, &count))
        return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t pos = 0;
    for (long long i = 0; i < count; i++) {
        int32_t size, offset_delta, key_length;
        int64_t timestamp_delta;
        if (read_int32(p, end, &pos, &size) < 0 || size < 0 || size > end - pos) {
            found = -1;
            break;
        }
        const Py_ssize_t record_end = pos + size;
        pos++; /* attributes */
        if (read_int64(p, record_end, &pos, &timestamp_delta) < 0 || read_int32(p, record_end, &pos, &offset_delta) < 0
            || read_int32(p, record_end, &pos, &key_length) < 0) {
            found = -1;
            break;
        }
        if (key_length < 0)
            found++;
        pos = record_end;
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(found);
}

static PyMethodDef methods[] = {
    {"count_null_keys", count_null_keys, METH_VARARGS,
     "count_null_keys(data, count) -> how many of the (well-formed) records have a null key, -1 if malformed."},
    {"scan_records", scan_records, METH_VARARGS,
     "scan_records(data, count) -> (min_timestamp_delta, max_timestamp_delta) or an error message (str)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pykbroker._speedups",
    "C twin of the record walk in pykbroker.protocol.records (see _scan_records_py).", -1, methods,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
