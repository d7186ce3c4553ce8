/* RecordWalker: a resumable byte-level walk over the records section of a RecordBatch v2.
 *
 * It checks every record as Kafka's DefaultRecord.readFrom and LogValidator do (see
 * walker.py for the rules and the pure-Python reference it must agree with), counts records
 * and null keys, and can stop at the first record whose timestamp reaches a target. It is fed
 * the (decompressed) bytes in chunks of any size and keeps O(1) state between them, so a batch
 * is never materialised whole. Every violation raises onceflow.records.errors.InvalidRecordError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MIN_RECORD_BODY 6 /* attributes, timestamp delta, offset delta, key, value, headers */

enum {
    S_LENGTH,
    S_ATTRIBUTES,
    S_TIMESTAMP,
    S_OFFSET,
    S_KEY_LENGTH,
    S_KEY,
    S_VALUE_LENGTH,
    S_VALUE,
    S_HEADER_COUNT,
    S_HEADER_KEY_LENGTH,
    S_HEADER_KEY,
    S_HEADER_VALUE_LENGTH,
    S_HEADER_VALUE,
    S_DONE,
};

static PyObject *InvalidRecordError = NULL;

typedef struct {
    PyObject_HEAD
    /* what the batch header says, and what to look for */
    int64_t count;
    int64_t base_timestamp;
    int64_t max_timestamp;
    int64_t target;
    int check_max;
    int has_target;
    /* results */
    int64_t records;
    int64_t null_keys;
    int found;
    int64_t found_delta;
    int64_t found_timestamp;
    int64_t consumed;
    /* the state machine */
    int state;
    int failed;
    uint64_t acc; /* the varint being read: bits so far and the shift of the next byte */
    int shift;
    int64_t body_left; /* bytes of the current record's body not read yet */
    int64_t skip_left; /* bytes of a key, value or header still to skip */
    int64_t headers_left;
    int64_t timestamp;
} Walker;

static int fail(Walker *w, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, args);
    va_end(args);
    if (msg != NULL) {
        PyErr_SetObject(InvalidRecordError, msg);
        Py_DECREF(msg);
    }
    w->failed = 1;
    return -1;
}

/* One byte of a zig-zag varint (bits 32) or varlong (bits 64), bounded as varint.py bounds
 * them: at most 5 / 10 bytes and no bits past the type. Returns 1 when the value is complete
 * (in *out), 0 when more bytes are needed, -1 on error. */
static inline int varint_byte(Walker *w, uint8_t byte, int bits, int64_t *out) {
    uint64_t payload = byte & 0x7F;
    if (bits == 64 && w->shift == 63 && payload > 1)
        return fail(w, "varlong out of the int64 range");
    w->acc |= payload << w->shift;
    if (byte < 0x80) {
        uint64_t u = w->acc;
        w->acc = 0;
        w->shift = 0;
        if (bits == 32 && (u >> 32))
            return fail(w, "varint out of the int32 range");
        *out = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
        return 1;
    }
    w->shift += 7;
    if (w->shift >= (bits == 32 ? 35 : 70))
        return fail(w, bits == 32 ? "varint longer than 5 bytes" : "varlong longer than 10 bytes");
    return 0;
}

static inline int end_record(Walker *w) {
    if (w->body_left != 0)
        return fail(w, "record %lld: its length does not match its content (%lld bytes left)",
                    (long long)w->records, (long long)w->body_left);
    w->records++;
    w->state = w->records == w->count ? S_DONE : S_LENGTH;
    return 0;
}

/* The four length-prefixed fields of a record: key, value, header key, header value. Each has
 * a state that reads its length and one that skips its bytes. */
typedef struct {
    const char *name;
    int nullable;
    const char *null_note; /* why -1 is refused, where it is */
    int bytes_state;
} LengthField;

static const LengthField LENGTH_FIELDS[S_DONE] = {
    [S_KEY_LENGTH] = {"key", 1, "", S_KEY},
    [S_VALUE_LENGTH] = {"value", 1, "", S_VALUE},
    [S_HEADER_KEY_LENGTH] = {"header key", 0, " (header keys may not be null)", S_HEADER_KEY},
    [S_HEADER_VALUE_LENGTH] = {"header value", 1, "", S_HEADER_VALUE},
};

/* Check a field's length, just read: -1 (null) where the field is nullable, else 0 or more
 * and within what is left of the record. Returns 1 when the field has bytes to skip (then in
 * w->skip_left), 0 when it is null or empty, -1 on error. */
static inline int field_length(Walker *w, const LengthField *field, int64_t v) {
    if (v < 0 && !(field->nullable && v == -1))
        return fail(w, "record %lld: invalid %s length %lld%s", (long long)w->records,
                    field->name, (long long)v, field->null_note);
    if (v > w->body_left)
        return fail(w, "record %lld: %s length %lld past the end of the record",
                    (long long)w->records, field->name, (long long)v);
    w->skip_left = v > 0 ? v : 0;
    return v > 0;
}

/* A field is over (null, empty or skipped; named by its bytes state): on to what follows it,
 * which after a header's value is the next header or the end of the record. */
static inline int after_field(Walker *w, int bytes_state) {
    switch (bytes_state) {
    case S_KEY:
        w->state = S_VALUE_LENGTH;
        return 0;
    case S_VALUE:
        w->state = S_HEADER_COUNT;
        return 0;
    case S_HEADER_KEY:
        w->state = S_HEADER_VALUE_LENGTH;
        return 0;
    default: /* S_HEADER_VALUE */
        if (--w->headers_left == 0)
            return end_record(w);
        w->state = S_HEADER_KEY_LENGTH;
        return 0;
    }
}

/* The fast path: a whole record lies in the chunk, so it is parsed with local variables and
 * no per-byte state. It accepts exactly what the state machine accepts; on anything else
 * (a record cut by the chunk's end, or any fault) it returns NULL and the state machine walks
 * the same record again from its start, to resume or to raise with the precise message. */
static inline int fast_varint(const uint8_t **pp, const uint8_t *end, int bits, int64_t *out) {
    const uint8_t *p = *pp;
    uint64_t acc = 0;
    int shift = 0;
    int max_shift = bits == 32 ? 35 : 70;
    while (p < end) {
        uint8_t byte = *p++;
        uint64_t payload = byte & 0x7F;
        if (bits == 64 && shift == 63 && payload > 1)
            return 0;
        acc |= payload << shift;
        if (byte < 0x80) {
            if (bits == 32 && (acc >> 32))
                return 0;
            *out = (int64_t)(acc >> 1) ^ -(int64_t)(acc & 1);
            *pp = p;
            return 1;
        }
        shift += 7;
        if (shift >= max_shift)
            return 0;
    }
    return 0;
}

static inline int fast_skip(const uint8_t **pp, const uint8_t *rec_end, int64_t length) {
    if (length < -1 || length > rec_end - *pp)
        return 0;
    if (length > 0)
        *pp += length;
    return 1;
}

static const uint8_t *fast_record(Walker *w, const uint8_t *p, const uint8_t *end) {
    int64_t length, delta, offset_delta, key_len, value_len, count, h_key_len, h_value_len;
    int64_t timestamp;
    if (!fast_varint(&p, end, 32, &length) || length < MIN_RECORD_BODY || length > end - p)
        return NULL;
    const uint8_t *rec_end = p + length;
    p++; /* attributes */
    if (!fast_varint(&p, rec_end, 64, &delta) ||
        __builtin_add_overflow(w->base_timestamp, delta, &timestamp))
        return NULL;
    if (!fast_varint(&p, rec_end, 32, &offset_delta) || offset_delta != w->records)
        return NULL;
    if (w->check_max && timestamp > w->max_timestamp)
        return NULL;
    if (!fast_varint(&p, rec_end, 32, &key_len) || !fast_skip(&p, rec_end, key_len))
        return NULL;
    if (!fast_varint(&p, rec_end, 32, &value_len) || !fast_skip(&p, rec_end, value_len))
        return NULL;
    if (!fast_varint(&p, rec_end, 32, &count) || count < 0 || count * 2 > rec_end - p)
        return NULL;
    for (int64_t i = 0; i < count; i++) {
        if (!fast_varint(&p, rec_end, 32, &h_key_len) || h_key_len < 0 ||
            !fast_skip(&p, rec_end, h_key_len))
            return NULL;
        if (!fast_varint(&p, rec_end, 32, &h_value_len) || !fast_skip(&p, rec_end, h_value_len))
            return NULL;
    }
    if (p != rec_end)
        return NULL;
    if (key_len == -1)
        w->null_keys++;
    w->records++;
    w->state = w->records == w->count ? S_DONE : S_LENGTH;
    return p;
}

/* Walk `n` bytes. Returns 1 when the target was found (the walk stops there), 0 when the bytes
 * were all consumed, -1 on error. */
static int walk(Walker *w, const uint8_t *p, Py_ssize_t n) {
    const uint8_t *start = p;
    const uint8_t *end = p + n;
    int64_t v = 0;
    int r;
#define BODY_BYTE()                                                                            \
    do {                                                                                       \
        if (w->body_left <= 0) {                                                               \
            fail(w, "record %lld: a field runs past the end of the record",                    \
                 (long long)w->records);                                                       \
            goto error;                                                                        \
        }                                                                                      \
        w->body_left--;                                                                        \
    } while (0)
#define READ_VARINT(bits)                                                                      \
    BODY_BYTE();                                                                               \
    r = varint_byte(w, *p++, bits, &v);                                                        \
    if (r < 0)                                                                                 \
        goto error;                                                                            \
    if (r == 0)                                                                                \
        continue;


    while (p < end) {
        if (w->state == S_LENGTH && w->shift == 0 && !w->has_target) {
            const uint8_t *next = fast_record(w, p, end);
            if (next != NULL) {
                p = next;
                continue;
            }
        }
        switch (w->state) {
        case S_DONE:
            fail(w, "%lld bytes left after the last of %lld records", (long long)(end - p),
                 (long long)w->count);
            goto error;
        case S_LENGTH:
            r = varint_byte(w, *p++, 32, &v);
            if (r < 0)
                goto error;
            if (r == 0)
                continue;
            if (v < MIN_RECORD_BODY) {
                fail(w, "record %lld: invalid record length %lld", (long long)w->records,
                     (long long)v);
                goto error;
            }
            w->body_left = v;
            w->state = S_ATTRIBUTES;
            break;
        case S_ATTRIBUTES:
            p++;
            w->body_left--;
            w->state = S_TIMESTAMP;
            break;
        case S_TIMESTAMP:
            READ_VARINT(64);
            if (__builtin_add_overflow(w->base_timestamp, v, &w->timestamp)) {
                fail(w, "record %lld: timestamp delta %lld overflows", (long long)w->records,
                     (long long)v);
                goto error;
            }
            w->state = S_OFFSET;
            break;
        case S_OFFSET:
            READ_VARINT(32);
            if (v != w->records) {
                fail(w, "record %lld has offset delta %lld", (long long)w->records, (long long)v);
                goto error;
            }
            if (w->check_max && w->timestamp > w->max_timestamp) {
                fail(w, "record %lld: timestamp %lld is past the batch's max timestamp %lld",
                     (long long)w->records, (long long)w->timestamp,
                     (long long)w->max_timestamp);
                goto error;
            }
            w->state = S_KEY_LENGTH;
            if (w->has_target && w->timestamp >= w->target) {
                w->found = 1;
                w->found_delta = v;
                w->found_timestamp = w->timestamp;
                w->consumed += p - start;
                return 1;
            }
            break;
        case S_KEY_LENGTH:
        case S_VALUE_LENGTH:
        case S_HEADER_KEY_LENGTH:
        case S_HEADER_VALUE_LENGTH: {
            const LengthField *field = &LENGTH_FIELDS[w->state];
            READ_VARINT(32);
            r = field_length(w, field, v);
            if (r < 0)
                goto error;
            if (w->state == S_KEY_LENGTH && v == -1)
                w->null_keys++;
            if (r)
                w->state = field->bytes_state;
            else if (after_field(w, field->bytes_state) < 0)
                goto error;
            break;
        }
        case S_KEY:
        case S_VALUE:
        case S_HEADER_KEY:
        case S_HEADER_VALUE: {
            Py_ssize_t avail = end - p;
            Py_ssize_t take = w->skip_left < avail ? (Py_ssize_t)w->skip_left : avail;
            p += take;
            w->skip_left -= take;
            w->body_left -= take;
            if (w->skip_left == 0 && after_field(w, w->state) < 0)
                goto error;
            break;
        }
        case S_HEADER_COUNT:
            READ_VARINT(32);
            if (v < 0) {
                fail(w, "record %lld: invalid header count %lld", (long long)w->records,
                     (long long)v);
                goto error;
            }
            if (v * 2 > w->body_left) {
                fail(w, "record %lld: %lld headers cannot fit in the record",
                     (long long)w->records, (long long)v);
                goto error;
            }
            w->headers_left = v;
            if (v == 0) {
                if (end_record(w) < 0)
                    goto error;
            } else {
                w->state = S_HEADER_KEY_LENGTH;
            }
            break;
        }
    }
    w->consumed += p - start;
    return 0;
error:
    w->consumed += p - start;
    return -1;
#undef BODY_BYTE
#undef READ_VARINT
}

static int Walker_init(Walker *w, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"count", "base_timestamp", "max_timestamp", "target", NULL};
    long long count, base_timestamp;
    PyObject *max_obj = Py_None, *target_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LL|OO", kwlist, &count, &base_timestamp,
                                     &max_obj, &target_obj))
        return -1;
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "count must not be negative");
        return -1;
    }
    memset((char *)w + sizeof(PyObject), 0, sizeof(Walker) - sizeof(PyObject));
    w->count = count;
    w->base_timestamp = base_timestamp;
    if (max_obj != Py_None) {
        w->max_timestamp = PyLong_AsLongLong(max_obj);
        if (w->max_timestamp == -1 && PyErr_Occurred())
            return -1;
        w->check_max = 1;
    }
    if (target_obj != Py_None) {
        w->target = PyLong_AsLongLong(target_obj);
        if (w->target == -1 && PyErr_Occurred())
            return -1;
        w->has_target = 1;
    }
    w->state = count == 0 ? S_DONE : S_LENGTH;
    return 0;
}

static PyObject *Walker_feed(Walker *w, PyObject *arg) {
    if (w->failed)
        return PyErr_Format(InvalidRecordError, "the walk already failed"), NULL;
    if (w->found)
        Py_RETURN_TRUE;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int r = walk(w, (const uint8_t *)view.buf, view.len);
    PyBuffer_Release(&view);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

static PyObject *Walker_finish(Walker *w, PyObject *Py_UNUSED(ignored)) {
    if (w->failed)
        return PyErr_Format(InvalidRecordError, "the walk already failed"), NULL;
    if (w->found || w->state == S_DONE)
        Py_RETURN_NONE;
    fail(w, "the records end inside record %lld of %lld", (long long)w->records,
         (long long)w->count);
    return NULL;
}

static PyObject *Walker_get_found(Walker *w, void *Py_UNUSED(closure)) {
    if (!w->found)
        Py_RETURN_NONE;
    return Py_BuildValue("(LL)", (long long)w->found_delta, (long long)w->found_timestamp);
}

static PyMethodDef Walker_methods[] = {
    {"feed", (PyCFunction)Walker_feed, METH_O,
     "feed(chunk) -> bool: walk the next bytes; True once the target timestamp is found."},
    {"finish", (PyCFunction)Walker_finish, METH_NOARGS,
     "finish(): the bytes are over; raises InvalidRecordError unless every record was read."},
    {NULL},
};

#include <structmember.h>
static PyMemberDef Walker_members[] = {
    {"records", T_LONGLONG, offsetof(Walker, records), READONLY, "records read completely"},
    {"null_keys", T_LONGLONG, offsetof(Walker, null_keys), READONLY, "records with a null key"},
    {"consumed", T_LONGLONG, offsetof(Walker, consumed), READONLY, "bytes walked"},
    {NULL},
};

static PyGetSetDef Walker_getset[] = {
    {"found", (getter)Walker_get_found, NULL,
     "(offset delta, timestamp) of the first record at or after the target, or None", NULL},
    {NULL},
};

static PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "onceflow.records._walker.RecordWalker",
    .tp_doc = "RecordWalker(count, base_timestamp, max_timestamp=None, target=None)",
    .tp_basicsize = sizeof(Walker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Walker_init,
    .tp_methods = Walker_methods,
    .tp_members = Walker_members,
    .tp_getset = Walker_getset,
};

static struct PyModuleDef walker_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "onceflow.records._walker",
    .m_doc = "The C record walker (see onceflow.records.walker).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__walker(void) {
    PyObject *errors = PyImport_ImportModule("onceflow.records.errors");
    if (errors == NULL)
        return NULL;
    InvalidRecordError = PyObject_GetAttrString(errors, "InvalidRecordError");
    Py_DECREF(errors);
    if (InvalidRecordError == NULL)
        return NULL;
    if (PyType_Ready(&WalkerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&walker_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&WalkerType);
    if (PyModule_AddObject(m, "RecordWalker", (PyObject *)&WalkerType) < 0) {
        Py_DECREF(&WalkerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
