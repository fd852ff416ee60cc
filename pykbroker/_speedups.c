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
 *
 * It also holds the log cleaner's offset map (OffsetMap, below: Kafka's SkimpyOffsetMap, 24 bytes a key)
 * and the SipHash-2-4 digest it keys that map with.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>

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

/* ------------------------------------------------------------------------------------------------
 * SipHash-2-4 with a 128-bit output ("SipHash-128"), written from the description in Aumasson and
 * Bernstein, "SipHash: a fast short-input PRF" (2012) and its 128-bit variant (v1 ^= 0xee at the start,
 * v2 ^= 0xee before the finalization, v1 ^= 0xdd before the second half of the output). The offset map
 * keys its entries by this digest of the record key under a random 128-bit secret drawn for each map:
 * SipHash is a PRF, so whoever produces to a compacted topic, without the secret, cannot choose a key
 * whose digest equals another key's (which would make the cleaner drop that key's latest record), as
 * they could with Kafka's MD5. Checked against the reference implementation's vectors_sip128. */

#define ROTL64(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                   \
    do {                                                                           \
        v0 += v1; v1 = ROTL64(v1, 13); v1 ^= v0; v0 = ROTL64(v0, 32);              \
        v2 += v3; v3 = ROTL64(v3, 16); v3 ^= v2;                                   \
        v0 += v3; v3 = ROTL64(v3, 21); v3 ^= v0;                                   \
        v2 += v1; v1 = ROTL64(v1, 17); v1 ^= v2; v2 = ROTL64(v2, 32);              \
    } while (0)

static inline uint64_t load_le64(const unsigned char *p)
{
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) | ((uint64_t)p[3] << 24)
           | ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) | ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

static void siphash128(uint64_t k0, uint64_t k1, const unsigned char *m, size_t len, uint64_t out[2])
{
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL ^ 0xee;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
    const unsigned char *whole_end = m + (len & ~(size_t)7);
    for (; m < whole_end; m += 8) {
        uint64_t word = load_le64(m);
        v3 ^= word;
        SIPROUND;
        SIPROUND;
        v0 ^= word;
    }
    uint64_t last = (uint64_t)len << 56; /* the length's low byte, then the 0-7 bytes left */
    for (size_t i = 0; i < (len & 7); i++)
        last |= (uint64_t)m[i] << (8 * i);
    v3 ^= last;
    SIPROUND;
    SIPROUND;
    v0 ^= last;
    v2 ^= 0xee; /* finalization: 4 rounds per 64-bit half of the output */
    for (int half = 0; half < 2; half++) {
        if (half)
            v1 ^= 0xdd;
        for (int round = 0; round < 4; round++)
            SIPROUND;
        out[half] = v0 ^ v1 ^ v2 ^ v3;
    }
}

static int parse_secret(Py_buffer *secret, uint64_t *k0, uint64_t *k1)
{
    if (secret->len != 16) {
        PyErr_Format(PyExc_ValueError, "the secret takes 16 bytes, not %zd", secret->len);
        return -1;
    }
    *k0 = load_le64((const unsigned char *)secret->buf);
    *k1 = load_le64((const unsigned char *)secret->buf + 8);
    return 0;
}

static void store_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* siphash128(secret, data) -> the 16-byte digest (tests check it against the reference vectors). */
static PyObject *py_siphash128(PyObject *self, PyObject *args)
{
    Py_buffer secret, data;
    uint64_t k0, k1, out[2];
    unsigned char digest[16];
    if (!PyArg_ParseTuple(args, "y*y*", &secret, &data))
        return NULL;
    if (parse_secret(&secret, &k0, &k1) < 0) {
        PyBuffer_Release(&secret);
        PyBuffer_Release(&data);
        return NULL;
    }
    siphash128(k0, k1, (const unsigned char *)data.buf, (size_t)data.len, out);
    PyBuffer_Release(&secret);
    PyBuffer_Release(&data);
    store_le64(digest, out[0]);
    store_le64(digest + 8, out[1]);
    return PyBytes_FromStringAndSize((const char *)digest, 16);
}

/* ------------------------------------------------------------------------------------------------
 * OffsetMap: the log cleaner's key -> latest offset map, Kafka's SkimpyOffsetMap in layout and bound.
 *
 * One buffer of ``slots`` entries of 24 bytes, allocated (zeroed) once at construction and freed with
 * the object: the key's SipHash-128 digest (two 64-bit words) and the offset + 1 (0 marks a free slot,
 * so a zeroed buffer is an empty map and its pages are only touched as keys land in them). Every key is
 * digested, whatever its length: the map never holds raw keys, so no key can pass for another's digest.
 * Open addressing with linear probing from digest word 0 modulo ``slots``. At most ``capacity`` keys
 * (< slots: a probe always meets a free slot), which the cleaner sets as Kafka does: slots = the dedupe
 * buffer per cleaner thread / 24, capacity = slots * log.cleaner.io.buffer.load.factor (0.9: expected
 * probes per lookup stay low; the full buffer is 24 / 0.9 = 26.7 bytes per key).
 * A put of a new key into a map holding ``capacity`` keys is refused; a put of a key already there
 * replaces its offset even then (the cleaner's "map full" rule).
 */

typedef struct {
    uint64_t h0, h1;
    int64_t stored; /* offset + 1; 0: free */
} map_entry;

typedef struct {
    PyObject_HEAD
    map_entry *entries;
    Py_ssize_t slots, capacity, size;
    uint64_t k0, k1;
    int64_t latest; /* the offset of the last put, -1 before any */
} OffsetMapObject;

/* sizeof(map_entry) == 24, checked without C11 (the extension is optional: a compiler without C11 must not
 * lose every accelerated function): the array's size is -1, a compile error, otherwise. */
typedef char map_entry_takes_24_bytes[sizeof(map_entry) == 24 ? 1 : -1];

static map_entry *map_find(OffsetMapObject *map, const unsigned char *key, Py_ssize_t length, uint64_t h[2])
{
    siphash128(map->k0, map->k1, key, (size_t)length, h);
    Py_ssize_t at = (Py_ssize_t)(h[0] % (uint64_t)map->slots);
    for (;;) {
        map_entry *entry = &map->entries[at];
        if (!entry->stored || (entry->h0 == h[0] && entry->h1 == h[1]))
            return entry;
        if (++at == map->slots)
            at = 0;
    }
}

/* 1: stored (*where: the key's entry, if where is not NULL); 0: refused (a new key, the map holds
 * ``capacity`` keys). An entry never moves once taken (no removal, no resizing). */
static int map_put(OffsetMapObject *map, const unsigned char *key, Py_ssize_t length, int64_t offset,
                   map_entry **where)
{
    uint64_t h[2];
    map_entry *entry = map_find(map, key, length, h);
    if (where != NULL)
        *where = entry;
    if (!entry->stored) {
        if (map->size >= map->capacity)
            return 0;
        entry->h0 = h[0];
        entry->h1 = h[1];
        map->size++;
    }
    entry->stored = offset + 1;
    map->latest = offset;
    return 1;
}

static int64_t map_get(OffsetMapObject *map, const unsigned char *key, Py_ssize_t length)
{
    uint64_t h[2];
    map_entry *entry = map_find(map, key, length, h);
    return entry->stored ? entry->stored - 1 : -1;
}

static PyObject *OffsetMap_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"slots", "capacity", "secret", NULL};
    Py_ssize_t slots, capacity;
    Py_buffer secret;
    uint64_t k0, k1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nny*", names, &slots, &capacity, &secret))
        return NULL;
    int bad_secret = parse_secret(&secret, &k0, &k1);
    PyBuffer_Release(&secret);
    if (bad_secret < 0)
        return NULL;
    if (slots < 2 || capacity < 1 || capacity >= slots) {
        PyErr_Format(PyExc_ValueError, "an offset map needs 1 <= capacity < slots (capacity %zd, slots %zd)",
                     capacity, slots);
        return NULL;
    }
    if ((size_t)slots > PY_SSIZE_T_MAX / sizeof(map_entry))
        return PyErr_NoMemory();
    OffsetMapObject *map = (OffsetMapObject *)type->tp_alloc(type, 0);
    if (map == NULL)
        return NULL;
    /* PyMem_RawCalloc: zeroed pages from the OS, visible to tracemalloc (tests measure the map with it). */
    map->entries = PyMem_RawCalloc((size_t)slots, sizeof(map_entry));
    if (map->entries == NULL) {
        Py_DECREF(map);
        return PyErr_NoMemory();
    }
    map->slots = slots;
    map->capacity = capacity;
    map->size = 0;
    map->k0 = k0;
    map->k1 = k1;
    map->latest = -1;
    return (PyObject *)map;
}

static void OffsetMap_dealloc(OffsetMapObject *map)
{
    PyMem_RawFree(map->entries);
    Py_TYPE(map)->tp_free((PyObject *)map);
}

static Py_ssize_t OffsetMap_len(OffsetMapObject *map)
{
    return map->size;
}

static PyObject *OffsetMap_put(OffsetMapObject *map, PyObject *args)
{
    Py_buffer key;
    long long offset;
    if (!PyArg_ParseTuple(args, "y*L", &key, &offset))
        return NULL;
    if (offset < 0 || offset == INT64_MAX) {
        PyBuffer_Release(&key);
        PyErr_Format(PyExc_ValueError, "offset %lld out of range", offset);
        return NULL;
    }
    int stored = map_put(map, (const unsigned char *)key.buf, key.len, (int64_t)offset, NULL);
    PyBuffer_Release(&key);
    return PyBool_FromLong(stored);
}

static PyObject *OffsetMap_get(OffsetMapObject *map, PyObject *args)
{
    Py_buffer key;
    PyObject *fallback = NULL;
    if (!PyArg_ParseTuple(args, "y*|O", &key, &fallback))
        return NULL;
    int64_t offset = map_get(map, (const unsigned char *)key.buf, key.len);
    PyBuffer_Release(&key);
    if (offset < 0 && fallback != NULL) {
        Py_INCREF(fallback);
        return fallback;
    }
    return PyLong_FromLongLong(offset);
}

/* One record of a batch's (decompressed) records section, as the cleaner needs it. */
typedef struct {
    Py_ssize_t start, end; /* the whole record, its length varint included */
    int32_t offset_delta;
    const unsigned char *key; /* NULL: a null key */
    int32_t key_length;
    int value_null;
} cleaner_record;

/* Reads record ``index`` at *pos (moved to its end); 0, or -1 with a ValueError set. Every length is
 * checked against the record's and the data's ends: files a crash damaged are read without overrun. A
 * negative key or value length means null, as for Kafka's DefaultRecord and scan_records (which accepted
 * the record on produce). */
static int read_cleaner_record(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos, long long index,
                               cleaner_record *record)
{
    int32_t size, value_length;
    int64_t timestamp_delta;
    record->start = *pos;
    if (read_int32(p, end, pos, &size) < 0) {
        PyErr_Format(PyExc_ValueError, "record %lld: malformed length varint at byte %zd", index, record->start);
        return -1;
    }
    if (size < 1 || size > end - *pos) {
        PyErr_Format(PyExc_ValueError, "record %lld: invalid record size %d with %zd bytes left", index, (int)size,
                     end - *pos);
        return -1;
    }
    const Py_ssize_t record_end = *pos + size;
    (*pos)++; /* attributes */
    if (read_int64(p, record_end, pos, &timestamp_delta) < 0 || read_int32(p, record_end, pos, &record->offset_delta) < 0
        || read_int32(p, record_end, pos, &record->key_length) < 0)
        goto past_end;
    record->key = NULL;
    if (record->key_length >= 0) {
        if (record->key_length > record_end - *pos)
            goto past_end;
        record->key = p + *pos;
        *pos += record->key_length;
    }
    if (read_int32(p, record_end, pos, &value_length) < 0 || (value_length >= 0 && value_length > record_end - *pos))
        goto past_end;
    record->value_null = value_length < 0;
    record->end = record_end;
    *pos = record_end;
    return 0;
past_end:
    PyErr_Format(PyExc_ValueError, "record %lld: a field runs past the record", index);
    return -1;
}

/* base_offset + delta into *offset; -1 with a ValueError set if that overflows (a damaged base offset). */
static int record_offset(long long base_offset, int32_t delta, long long index, long long *offset)
{
    if ((delta > 0 && base_offset > LLONG_MAX - delta) || (delta < 0 && base_offset < LLONG_MIN - delta)) {
        PyErr_Format(PyExc_ValueError, "record %lld: base offset %lld + delta %d overflows", index, base_offset,
                     (int)delta);
        return -1;
    }
    *offset = base_offset + delta;
    return 0;
}

/* Record ``index`` at *pos (read_cleaner_record) and its offset (record_offset); 0, or -1 with a ValueError. */
static int next_cleaner_record(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos, long long index,
                               long long base_offset, cleaner_record *record, long long *offset)
{
    if (read_cleaner_record(p, end, pos, index, record) < 0)
        return -1;
    return record_offset(base_offset, record->offset_delta, index, offset);
}

/* What the rewrite needs of one record to decide whether it stays, kept by map_records: its key's entry
 * (SUMMARY_NULL_KEY, or SUMMARY_UNMAPPED below start_offset), its offset delta, whether its value is null. */
typedef struct {
    int64_t slot;
    int32_t offset_delta;
    int32_t value_null;
} record_summary;

#define SUMMARY_NULL_KEY (-1)
#define SUMMARY_UNMAPPED (-2)

/* The loop of add_records and map_records: the keys of the records into the map; with ``summarize``, also
 * a bytes object of one record_summary per record (or None when the map filled up). */
static PyObject *add_records_impl(OffsetMapObject *map, PyObject *args, int summarize)
{
    Py_buffer view;
    long long count, base_offset, start_offset;
    int full = 0;
    if (!PyArg_ParseTuple(args, "y*LLL", &view, &count, &base_offset, &start_offset))
        return NULL;
    PyObject *summary = NULL;
    record_summary *out = NULL;
    if (summarize) {
        /* A record takes at least 2 bytes: more than len(data) records fail the walk before filling this. */
        Py_ssize_t entries = count < 0 ? 0 : (count < view.len ? (Py_ssize_t)count : view.len);
        summary = PyBytes_FromStringAndSize(NULL, entries * (Py_ssize_t)sizeof(record_summary));
        if (summary == NULL) {
            PyBuffer_Release(&view);
            return NULL;
        }
        out = (record_summary *)PyBytes_AS_STRING(summary);
    }
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t pos = 0;
    for (long long i = 0; i < count; i++) {
        cleaner_record record;
        long long offset;
        if (next_cleaner_record(p, view.len, &pos, i, base_offset, &record, &offset) < 0)
            goto failed;
        record_summary entry = {SUMMARY_UNMAPPED, record.offset_delta, record.value_null};
        if (record.key == NULL || offset < start_offset) {
            if (out != NULL) {
                entry.slot = record.key == NULL ? SUMMARY_NULL_KEY : SUMMARY_UNMAPPED;
                memcpy(&out[i], &entry, sizeof(entry));
            }
            continue;
        }
        if (offset < 0 || offset == INT64_MAX) {
            PyErr_Format(PyExc_ValueError, "record %lld: offset %lld out of range", i, offset);
            goto failed;
        }
        map_entry *where;
        if (!map_put(map, record.key, record.key_length, offset, &where)) {
            full = 1;
            break;
        }
        if (out != NULL) {
            entry.slot = (int64_t)(where - map->entries);
            memcpy(&out[i], &entry, sizeof(entry));
        }
    }
    PyBuffer_Release(&view);
    if (!summarize)
        return PyBool_FromLong(!full);
    if (full) {
        Py_DECREF(summary);
        Py_RETURN_NONE;
    }
    return summary;
failed:
    PyBuffer_Release(&view);
    Py_XDECREF(summary);
    return NULL;
}

/* add_records(data, count, base_offset, start_offset) -> True, or False when the map filled up before
 * the last record (the keys that fitted stay). Keyless records and offsets below start_offset are
 * skipped. */
static PyObject *OffsetMap_add_records(OffsetMapObject *map, PyObject *args)
{
    return add_records_impl(map, args, 0);
}

/* map_records(data, count, base_offset, start_offset) -> the records' summary (bytes, 16 a record) for
 * kept_records, or None when the map filled up: add_records, remembering where each key went. */
static PyObject *OffsetMap_map_records(OffsetMapObject *map, PyObject *args)
{
    return add_records_impl(map, args, 1);
}

/* kept_records(summary, base_offset, latest_in_map, retain_deletes) -> how many of the summarized records
 * filter_records would keep (the same rule, read from the keys' entries without the records), or -1 if a
 * record was not mapped (below start_offset: only filter_records can tell). */
static PyObject *OffsetMap_kept_records(OffsetMapObject *map, PyObject *args)
{
    Py_buffer view;
    long long base_offset, latest_in_map;
    int retain_deletes;
    if (!PyArg_ParseTuple(args, "y*LLp", &view, &base_offset, &latest_in_map, &retain_deletes))
        return NULL;
    if (view.len % (Py_ssize_t)sizeof(record_summary)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "not a record summary");
        return NULL;
    }
    const Py_ssize_t n = view.len / (Py_ssize_t)sizeof(record_summary);
    long long kept = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        record_summary entry;
        memcpy(&entry, (const char *)view.buf + i * (Py_ssize_t)sizeof(entry), sizeof(entry));
        long long offset;
        if (record_offset(base_offset, entry.offset_delta, i, &offset) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        if (offset > latest_in_map) {
            kept++;
        } else if (entry.slot == SUMMARY_NULL_KEY) {
            continue;
        } else if (entry.slot < 0 || entry.slot >= map->slots) {
            kept = -1;
            break;
        } else {
            int64_t latest = map->entries[entry.slot].stored - 1;
            kept += offset >= latest && (!entry.value_null || retain_deletes);
        }
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(kept);
}

/* filter_records(data, count, base_offset, latest_in_map, retain_deletes) -> (kept, records): which
 * records the cleaned batch keeps. A record is kept if its offset is past latest_in_map, or if it has a
 * key whose latest offset in the map is not above its own, and a value (a tombstone only with
 * retain_deletes). ``records`` is None when every record is kept, else the kept records' bytes. */
static PyObject *OffsetMap_filter_records(OffsetMapObject *map, PyObject *args)
{
    Py_buffer view;
    long long count, base_offset, latest_in_map;
    int retain_deletes;
    if (!PyArg_ParseTuple(args, "y*LLLp", &view, &count, &base_offset, &latest_in_map, &retain_deletes))
        return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    unsigned char *out = NULL; /* allocated at the first record dropped */
    Py_ssize_t pos = 0, written = 0, copied_to = 0; /* data[copied_to:record.start] is kept, not yet copied */
    long long kept = 0;
    PyObject *result = NULL;
    for (long long i = 0; i < count; i++) {
        cleaner_record record;
        long long offset;
        if (next_cleaner_record(p, view.len, &pos, i, base_offset, &record, &offset) < 0)
            goto done;
        int keep;
        if (offset > latest_in_map)
            keep = 1;
        else if (record.key == NULL)
            keep = 0;
        else
            keep = offset >= map_get(map, record.key, record.key_length) && (!record.value_null || retain_deletes);
        if (keep) {
            kept++;
            continue;
        }
        if (out == NULL && (out = PyMem_Malloc(view.len ? (size_t)view.len : 1)) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(out + written, p + copied_to, (size_t)(record.start - copied_to));
        written += record.start - copied_to;
        copied_to = record.end;
    }
    if (out == NULL) {
        result = Py_BuildValue("(LO)", kept, Py_None);
    } else {
        memcpy(out + written, p + copied_to, (size_t)(pos - copied_to));
        written += pos - copied_to;
        result = Py_BuildValue("(Ly#)", kept, (const char *)out, written);
    }
done:
    PyMem_Free(out);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *OffsetMap_sizeof(OffsetMapObject *map, PyObject *unused)
{
    return PyLong_FromSize_t(sizeof(OffsetMapObject) + (size_t)map->slots * sizeof(map_entry));
}

static PyObject *OffsetMap_get_nbytes(OffsetMapObject *map, void *closure)
{
    return PyLong_FromSize_t((size_t)map->slots * sizeof(map_entry));
}

static PyObject *OffsetMap_get_slots(OffsetMapObject *map, void *closure)
{
    return PyLong_FromSsize_t(map->slots);
}

static PyObject *OffsetMap_get_capacity(OffsetMapObject *map, void *closure)
{
    return PyLong_FromSsize_t(map->capacity);
}

static PyObject *OffsetMap_get_latest(OffsetMapObject *map, void *closure)
{
    return PyLong_FromLongLong(map->latest);
}

static PyMethodDef OffsetMap_methods[] = {
    {"put", (PyCFunction)OffsetMap_put, METH_VARARGS,
     "put(key, offset) -> True, or False if the key is new and the map holds capacity keys."},
    {"get", (PyCFunction)OffsetMap_get, METH_VARARGS, "get(key[, default]) -> the key's offset, or default (-1)."},
    {"add_records", (PyCFunction)OffsetMap_add_records, METH_VARARGS,
     "add_records(data, count, base_offset, start_offset) -> False if the map filled up before the last record."},
    {"map_records", (PyCFunction)OffsetMap_map_records, METH_VARARGS,
     "map_records(data, count, base_offset, start_offset) -> add_records' work and a summary for kept_records, "
     "or None if the map filled up."},
    {"kept_records", (PyCFunction)OffsetMap_kept_records, METH_VARARGS,
     "kept_records(summary, base_offset, latest_in_map, retain_deletes) -> records filter_records would keep, "
     "or -1 if unknown."},
    {"filter_records", (PyCFunction)OffsetMap_filter_records, METH_VARARGS,
     "filter_records(data, count, base_offset, latest_in_map, retain_deletes) -> (kept, kept bytes or None if all)."},
    {"__sizeof__", (PyCFunction)OffsetMap_sizeof, METH_NOARGS, "The object and its entry buffer, in bytes."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef OffsetMap_getset[] = {
    {"nbytes", (getter)OffsetMap_get_nbytes, NULL, "bytes of the entry buffer (slots * 24)", NULL},
    {"slots", (getter)OffsetMap_get_slots, NULL, "entries the buffer has room for", NULL},
    {"capacity", (getter)OffsetMap_get_capacity, NULL, "keys the map accepts (slots * load factor)", NULL},
    {"latest_offset", (getter)OffsetMap_get_latest, NULL, "the offset of the last put, -1 before any", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods OffsetMap_as_sequence = {
    .sq_length = (lenfunc)OffsetMap_len,
};

static PyTypeObject OffsetMapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pykbroker._speedups.OffsetMap",
    .tp_basicsize = sizeof(OffsetMapObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "OffsetMap(slots, capacity, secret): the log cleaner's key -> latest offset map, 24 bytes a slot, "
              "keys digested with SipHash-128 under the 16-byte secret.",
    .tp_new = OffsetMap_new,
    .tp_dealloc = (destructor)OffsetMap_dealloc,
    .tp_methods = OffsetMap_methods,
    .tp_getset = OffsetMap_getset,
    .tp_as_sequence = &OffsetMap_as_sequence,
};

static PyMethodDef methods[] = {
    {"siphash128", py_siphash128, METH_VARARGS, "siphash128(secret, data) -> SipHash-2-4 128-bit digest (16 bytes)."},
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
    if (PyType_Ready(&OffsetMapType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *entry_bytes = PyLong_FromSize_t(sizeof(map_entry));
    if (entry_bytes == NULL || PyDict_SetItemString(OffsetMapType.tp_dict, "ENTRY_BYTES", entry_bytes) < 0) {
        Py_XDECREF(entry_bytes);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(entry_bytes);
    PyType_Modified(&OffsetMapType); /* its dict changed after PyType_Ready: drop any cached lookup */
    Py_INCREF(&OffsetMapType);
    if (PyModule_AddObject(m, "OffsetMap", (PyObject *)&OffsetMapType) < 0) {
        Py_DECREF(&OffsetMapType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
