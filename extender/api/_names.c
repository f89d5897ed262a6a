/* extender.api._names: the per-name passes of filter and prioritize, in C.

Why: kube-scheduler sends up to thousands of node names per request, and DESIGN.md §9 gives filter and
prioritize 1 ms each at 5,000 names. In Python, each pass over the names (checking them, looking up each one's
node key, grouping them by verdict, writing the prioritize answer) costs 0.1 to 0.2 ms even through C builtins,
and a verb makes several. Here each is one loop. Every decision (a verdict per distinct key, its reason, the
scores) stays in Python; these functions only move names between lists and bytes.

    first_bad(names, max_chars) -> int     the index of the first item that is not a str of 1 to max_chars
                                           characters, or -1
    lookup(items, table, fallback=None) -> list
                                           table.get(item) for each item; where the table has none,
                                           fallback[i] (a list as long as the items), or None
    lookup_few(items, table, make=None, last_items=None, last_values=None) -> list
                                           table.get(item) for items that are a few objects repeated (node
                                           keys): each distinct object looked up once; where the table has
                                           none, make(item), stored in the table (an exception from make
                                           ends the pass, what it stored before kept); where last_items[i]
                                           is items[i], last_values[i] (what an earlier pass gave)
    unique(items) -> list                  the items without repeats of one object (equal objects that are not
                                           one may repeat), in their order
    counts(items) -> dict                  each item and how many times it occurs (equal items that are not one
                                           object add up)
    group(items, labels, number_of, count) -> lists
                                           count lists; items[i] goes to lists[number_of[labels[i]]]
    scores_json(hosts, scores) -> bytes    the prioritize answer [{"Host":…,"Score":…},…]: each score less
                                           the least, hosts whose result is 0 left out (wire.py says why)
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_SCORE 10

static PyObject *
first_bad(PyObject *module, PyObject *args)
{
    PyObject *names;
    Py_ssize_t max_chars;
    if (!PyArg_ParseTuple(args, "O!n:first_bad", &PyList_Type, &names, &max_chars))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(names);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        if (!PyUnicode_Check(name))
            return PyLong_FromSsize_t(i);
        Py_ssize_t length = PyUnicode_GET_LENGTH(name);
        if (length < 1 || length > max_chars)
            return PyLong_FromSsize_t(i);
    }
    return PyLong_FromSsize_t(-1);
}

/* Objects by identity, in an open-addressing table that grows, each with a value or none. A request's node
   keys are interned and a few hundred distinct at most, so this costs a pointer hash per item where a dict or
   a set calls each key's hash and compares it. The keys are borrowed (the caller's list holds them for the
   call); the values are owned. */
typedef struct {
    PyObject **keys;
    PyObject **values; /* NULL for a table without values */
    size_t mask;
    size_t used;
} Identity;

#define IDENTITY_SLOTS 64

static int
identity_init(Identity *table, int with_values)
{
    table->keys = PyMem_Calloc(IDENTITY_SLOTS, sizeof(PyObject *));
    table->values = with_values ? PyMem_Calloc(IDENTITY_SLOTS, sizeof(PyObject *)) : NULL;
    table->mask = IDENTITY_SLOTS - 1;
    table->used = 0;
    if (table->keys == NULL || (with_values && table->values == NULL)) {
        PyMem_Free(table->keys);
        PyMem_Free(table->values);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
identity_free(Identity *table)
{
    if (table->values != NULL) {
        for (size_t i = 0; i <= table->mask; i++)
            Py_XDECREF(table->values[i]);
    }
    PyMem_Free(table->keys);
    PyMem_Free(table->values);
}

/* Where an object's search starts in a table of mask + 1 slots. Objects made one after another sit at addresses a
   few words apart, so their addresses' low bits alone would fill a run of neighbouring slots, and linear probing
   then walks the whole run (1,500 node keys: 0.86 ms a pass); multiplying by 2^64 / golden ratio spreads them
   (Knuth's multiplicative hashing), and the high bits, the best mixed, pick the slot. */
static size_t
identity_home(PyObject *key, size_t mask)
{
    return (size_t)(((uint64_t)(uintptr_t)key * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & mask;
}

/* The slot that holds `key`, or the empty one where it would go. */
static size_t
identity_slot(const Identity *table, PyObject *key)
{
    size_t at = identity_home(key, table->mask);
    while (table->keys[at] != NULL && table->keys[at] != key)
        at = (at + 1) & table->mask;
    return at;
}

static int
identity_grow(Identity *table)
{
    Identity larger = {PyMem_Calloc((table->mask + 1) * 2, sizeof(PyObject *)), NULL, table->mask * 2 + 1, 0};
    if (larger.keys == NULL)
        goto no_memory;
    if (table->values != NULL) {
        larger.values = PyMem_Calloc(larger.mask + 1, sizeof(PyObject *));
        if (larger.values == NULL) {
            PyMem_Free(larger.keys);
            goto no_memory;
        }
    }
    for (size_t i = 0; i <= table->mask; i++) {
        if (table->keys[i] != NULL) {
            size_t at = identity_slot(&larger, table->keys[i]);
            larger.keys[at] = table->keys[i];
            if (larger.values != NULL)
                larger.values[at] = table->values[i]; /* the reference moves */
        }
    }
    larger.used = table->used;
    PyMem_Free(table->keys);
    PyMem_Free(table->values);
    *table = larger;
    return 0;
no_memory:
    PyErr_NoMemory();
    return -1;
}

/* Put `key` (with a new reference to `value`, if the table has values) in `slot`, found empty by identity_slot. */
static int
identity_put(Identity *table, size_t slot, PyObject *key, PyObject *value)
{
    table->keys[slot] = key;
    if (table->values != NULL) {
        Py_INCREF(value);
        table->values[slot] = value;
    }
    if (++table->used * 2 > table->mask)
        return identity_grow(table);
    return 0;
}

/* table[key], each distinct object looked up in the dict once and then remembered in `seen`. Borrowed; NULL
   with an error set on failure, NULL without one when the dict has no such key. */
static PyObject *
recall(Identity *seen, PyObject *table, PyObject *key)
{
    size_t slot = identity_slot(seen, key);
    if (seen->keys[slot] != NULL)
        return seen->values[slot];
    PyObject *value = PyDict_GetItemWithError(table, key);
    if (value == NULL || identity_put(seen, slot, key, value) < 0)
        return NULL;
    return value;
}

static PyObject *
lookup(PyObject *module, PyObject *args)
{
    PyObject *items, *table, *fallback = Py_None;
    if (!PyArg_ParseTuple(args, "O!O!|O:lookup", &PyList_Type, &items, &PyDict_Type, &table, &fallback))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(items);
    if (fallback != Py_None && (!PyList_Check(fallback) || PyList_GET_SIZE(fallback) != count)) {
        PyErr_SetString(PyExc_ValueError, "lookup: fallback must be None or a list as long as the items");
        return NULL;
    }
    PyObject *values = PyList_New(count);
    if (values == NULL)
        return NULL;
    /* Every item's hash first (a str keeps it): the lookups then wait on no hash, and their reads of the table,
       cold by now, overlap (5,000 node names, the table out of the cache: 0.24-0.27 -> 0.22 ms). */
    for (Py_ssize_t i = 0; i < count; i++) {
        if (PyObject_Hash(PyList_GET_ITEM(items, i)) == -1) {
            Py_DECREF(values);
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = PyDict_GetItemWithError(table, PyList_GET_ITEM(items, i));
        if (value == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(values);
                return NULL;
            }
            value = fallback == Py_None ? Py_None : PyList_GET_ITEM(fallback, i);
        }
        Py_INCREF(value);
        PyList_SET_ITEM(values, i, value);
    }
    return values;
}

/* table[key] as `recall`; where the dict has none and `make` is a callable, make(key), stored in the dict first.
   Borrowed (the dict holds it); NULL with an error set on failure, NULL without one for a key with no value. */
static PyObject *
recall_or_make(Identity *seen, PyObject *table, PyObject *key, PyObject *make)
{
    PyObject *value = recall(seen, table, key);
    if (value != NULL || PyErr_Occurred() || make == Py_None)
        return value;
    PyObject *made = PyObject_CallOneArg(make, key);
    if (made == NULL)
        return NULL;
    int stored = PyDict_SetItem(table, key, made);
    Py_DECREF(made);
    if (stored < 0)
        return NULL;
    value = recall(seen, table, key);
    if (value == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "lookup_few: what make() gave was not kept in the table");
    return value;
}

static PyObject *
lookup_few(PyObject *module, PyObject *args)
{
    PyObject *items, *table, *make = Py_None, *last_items = Py_None, *last_values = Py_None;
    if (!PyArg_ParseTuple(args, "O!O!|OOO:lookup_few", &PyList_Type, &items, &PyDict_Type, &table, &make,
                          &last_items, &last_values))
        return NULL;
    if (make != Py_None && !PyCallable_Check(make)) {
        PyErr_SetString(PyExc_TypeError, "lookup_few: make must be None or a callable");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(items);
    /* The values of an earlier pass over a list of as many items: where an item is the one there, its value is the
       one there, read in order with no lookup (a request that repeats its names: most of their keys the same). */
    int with_last = last_items != Py_None;
    if (with_last && (!PyList_Check(last_items) || !PyList_Check(last_values)
                      || PyList_GET_SIZE(last_items) != count || PyList_GET_SIZE(last_values) != count)) {
        PyErr_SetString(PyExc_ValueError, "lookup_few: last_items and last_values must be lists as long as the items");
        return NULL;
    }
    PyObject *values = PyList_New(count);
    Identity seen;
    if (values == NULL || identity_init(&seen, 1) < 0) {
        Py_XDECREF(values);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (with_last && PyList_GET_ITEM(last_items, i) == item) {
            PyObject *same = PyList_GET_ITEM(last_values, i);
            Py_INCREF(same);
            PyList_SET_ITEM(values, i, same);
            continue;
        }
        Py_INCREF(item);  /* make() runs Python, which may drop the list's reference */
        PyObject *value = recall_or_make(&seen, table, item, make);
        Py_DECREF(item);
        if (value == NULL) {
            if (PyErr_Occurred()) {
                Py_CLEAR(values);
                break;
            }
            value = Py_None;
        }
        Py_INCREF(value);
        PyList_SET_ITEM(values, i, value);
    }
    identity_free(&seen);
    return values;
}

static PyObject *
unique(PyObject *module, PyObject *items)
{
    if (!PyList_Check(items)) {
        PyErr_Format(PyExc_TypeError, "unique: expected a list, got %.50s", Py_TYPE(items)->tp_name);
        return NULL;
    }
    PyObject *distinct = PyList_New(0);
    Identity seen;
    if (distinct == NULL || identity_init(&seen, 0) < 0) {
        Py_XDECREF(distinct);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        size_t slot = identity_slot(&seen, item);
        if (seen.keys[slot] != NULL)
            continue;
        if (identity_put(&seen, slot, item, NULL) < 0 || PyList_Append(distinct, item) < 0) {
            Py_CLEAR(distinct);
            break;
        }
    }
    identity_free(&seen);
    return distinct;
}

/* Each distinct object of `items` (by identity, as `unique`) and how many times it occurs, as a dict: filter counts
   the names that pass from its distinct keys' verdicts before it sorts them. */
static PyObject *
counts(PyObject *module, PyObject *items)
{
    if (!PyList_Check(items)) {
        PyErr_Format(PyExc_TypeError, "counts: expected a list, got %.50s", Py_TYPE(items)->tp_name);
        return NULL;
    }
    Py_ssize_t size = PyList_GET_SIZE(items);
    size_t slots = IDENTITY_SLOTS;
    while (slots < (size_t)size * 2 + 2)
        slots *= 2;
    PyObject **keys = PyMem_Calloc(slots, sizeof(PyObject *));
    Py_ssize_t *seen = PyMem_Calloc(slots, sizeof(Py_ssize_t));
    PyObject *found = NULL;
    if (keys == NULL || seen == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    size_t mask = slots - 1;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        size_t at = identity_home(item, mask);
        while (keys[at] != NULL && keys[at] != item)
            at = (at + 1) & mask;
        keys[at] = item;
        seen[at]++;
    }
    found = PyDict_New();
    for (size_t at = 0; found != NULL && at < slots; at++) {
        if (keys[at] == NULL)
            continue;
        /* Equal objects that are not one (two equal strings) share the dict's entry: their counts add up. */
        PyObject *before = PyDict_GetItemWithError(found, keys[at]);
        Py_ssize_t total = seen[at];
        if (before != NULL)
            total += PyLong_AsSsize_t(before);
        PyObject *count = PyErr_Occurred() ? NULL : PyLong_FromSsize_t(total);
        if (count == NULL || PyDict_SetItem(found, keys[at], count) < 0)
            Py_CLEAR(found);
        Py_XDECREF(count);
    }
done:
    PyMem_Free(keys);
    PyMem_Free(seen);
    return found;
}

static PyObject *
group(PyObject *module, PyObject *args)
{
    PyObject *items, *labels, *number_of, *room = Py_None;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "O!O!O!n|O:group", &PyList_Type, &items, &PyList_Type, &labels, &PyDict_Type,
                          &number_of, &count, &room))
        return NULL;
    Py_ssize_t size = PyList_GET_SIZE(items);
    if (PyList_GET_SIZE(labels) != size) {
        PyErr_SetString(PyExc_ValueError, "group: items and labels differ in length");
        return NULL;
    }
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "group: count must not be negative");
        return NULL;
    }
    if (room != Py_None && !(PyList_Check(room) && PyList_GET_SIZE(room) == count)) {
        PyErr_SetString(PyExc_ValueError, "group: room must be None or a list of count ints");
        return NULL;
    }
    /* First each item's number and each list's length, then the lists at their final length: no list grows. */
    Py_ssize_t *numbers = PyMem_Malloc((size > 0 ? (size_t)size : 1) * sizeof(Py_ssize_t));
    Py_ssize_t *filled = PyMem_Calloc(count > 0 ? (size_t)count : 1, sizeof(Py_ssize_t));
    Py_ssize_t *limit = PyMem_Malloc((count > 0 ? (size_t)count : 1) * sizeof(Py_ssize_t));
    PyObject *lists = NULL;
    Identity seen;
    if (numbers == NULL || filled == NULL || limit == NULL || identity_init(&seen, 1) < 0) {
        PyMem_Free(numbers);
        PyMem_Free(filled);
        PyMem_Free(limit);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    for (Py_ssize_t n = 0; n < count; n++) {
        limit[n] = room == Py_None ? PY_SSIZE_T_MAX : PyLong_AsSsize_t(PyList_GET_ITEM(room, n));
        if (limit[n] == -1 && PyErr_Occurred())
            goto fail;
        if (limit[n] < 0) {
            PyErr_Format(PyExc_ValueError, "group: room %zd is negative", limit[n]);
            goto fail;
        }
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *label = PyList_GET_ITEM(labels, i);
        PyObject *number = recall(&seen, number_of, label);
        if (number == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_KeyError, "group: no number for label %R", label);
            goto fail;
        }
        Py_ssize_t n = PyLong_AsSsize_t(number);
        if (n == -1 && PyErr_Occurred())
            goto fail;
        if (n < 0 || n >= count) {
            PyErr_Format(PyExc_ValueError, "group: number %zd is outside 0 to %zd", n, count - 1);
            goto fail;
        }
        numbers[i] = n;
        filled[n]++;
    }
    lists = PyList_New(count);
    if (lists == NULL)
        goto fail;
    for (Py_ssize_t n = 0; n < count; n++) {
        PyObject *list = PyList_New(filled[n] < limit[n] ? filled[n] : limit[n]);
        if (list == NULL)
            goto fail;
        PyList_SET_ITEM(lists, n, list);
        filled[n] = 0;
    }
    /* An item past its list's room is not read at all: filter's shortlist keeps K of thousands of names. */
    for (Py_ssize_t i = 0; i < size; i++) {
        Py_ssize_t n = numbers[i];
        if (filled[n] == limit[n])
            continue;
        PyObject *item = PyList_GET_ITEM(items, i);
        Py_INCREF(item);
        PyList_SET_ITEM(PyList_GET_ITEM(lists, n), filled[n]++, item);
    }
    goto done;
fail:
    Py_CLEAR(lists);
done:
    identity_free(&seen);
    PyMem_Free(numbers);
    PyMem_Free(filled);
    PyMem_Free(limit);
    return lists;
}

/* What escaping adds to `text` in JSON (RFC 8259: quote, backslash and U+0000 to U+001F escaped; the rest
   as UTF-8): 0 for any real node name. */
static Py_ssize_t
escaped_extra(const unsigned char *text, Py_ssize_t length)
{
    Py_ssize_t extra = 0;
    for (Py_ssize_t i = 0; i < length; i++) {
        unsigned char c = text[i];
        if (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t')
            extra += 1;
        else if (c < 0x20)
            extra += 5;
    }
    return extra;
}

static char *
write_escaped(char *out, const unsigned char *text, Py_ssize_t length)
{
    static const char hex[] = "0123456789abcdef";
    for (Py_ssize_t i = 0; i < length; i++) {
        unsigned char c = text[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *out++ = (char)c;
            continue;
        }
        *out++ = '\\';
        switch (c) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\b': *out++ = 'b'; break;
        case '\f': *out++ = 'f'; break;
        case '\n': *out++ = 'n'; break;
        case '\r': *out++ = 'r'; break;
        case '\t': *out++ = 't'; break;
        default:
            memcpy(out, "u00", 3);
            out[3] = hex[c >> 4];
            out[4] = hex[c & 15];
            out += 5;
        }
    }
    return out;
}

/* A str's UTF-8: an ASCII one's own characters, any other's UTF-8 as Python caches it; NULL (with the error
   set) for a lone surrogate, which is not UTF-8 and so not JSON. */
static const char *
utf8_of(PyObject *text, Py_ssize_t *length)
{
    if (PyUnicode_IS_COMPACT_ASCII(text)) {
        *length = PyUnicode_GET_LENGTH(text);
        return (const char *)PyUnicode_DATA(text);
    }
    return PyUnicode_AsUTF8AndSize(text, length);
}

static const char HOST[] = "{\"Host\":\"";
static const char SCORE[] = "\",\"Score\":";
#define HOST_SIZE (sizeof(HOST) - 1)
#define SCORE_SIZE (sizeof(SCORE) - 1)
#define ESCAPED 0x80 /* in a host's entry of `marks`: its name needs escaping */

static PyObject *
scores_json(PyObject *module, PyObject *args)
{
    PyObject *hosts, *scores;
    if (!PyArg_ParseTuple(args, "O!O!:scores_json", &PyList_Type, &hosts, &PyList_Type, &scores))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(hosts);
    if (PyList_GET_SIZE(scores) != count) {
        PyErr_SetString(PyExc_ValueError, "scores_json: hosts and scores differ in length");
        return NULL;
    }
    /* Per host, its score less the least, and ESCAPED where its name needs it. */
    unsigned char *marks = PyMem_Malloc(count > 0 ? (size_t)count : 1);
    if (marks == NULL)
        return PyErr_NoMemory();
    PyObject *answer = NULL;
    long least = MAX_SCORE;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *score = PyList_GET_ITEM(scores, i), *host = PyList_GET_ITEM(hosts, i);
        if (!PyLong_Check(score) || !PyUnicode_Check(host)) {
            PyErr_Format(PyExc_TypeError, "scores_json: entry %zd is (%.50s, %.50s), not (str, int)", i,
                         Py_TYPE(host)->tp_name, Py_TYPE(score)->tp_name);
            goto done;
        }
        int overflow;
        long value = PyLong_AsLongAndOverflow(score, &overflow);
        if (overflow || value < 0 || value > MAX_SCORE) {
            PyErr_SetString(PyExc_ValueError, "extender scores run from 0 to 10");
            goto done;
        }
        marks[i] = (unsigned char)value;
        if (value < least)
            least = value;
    }
    /* A bound on the size (two digits and a comma per entry), so the answer is written once. */
    Py_ssize_t size = 2;
    for (Py_ssize_t i = 0; i < count; i++) {
        marks[i] -= (unsigned char)least;
        if (marks[i] == 0)
            continue;
        Py_ssize_t length;
        const char *text = utf8_of(PyList_GET_ITEM(hosts, i), &length);
        if (text == NULL)
            goto done;
        Py_ssize_t extra = escaped_extra((const unsigned char *)text, length);
        if (extra)
            marks[i] |= ESCAPED;
        size += HOST_SIZE + length + extra + SCORE_SIZE + 2 + 1 + 1;
    }
    answer = PyBytes_FromStringAndSize(NULL, size);
    if (answer == NULL)
        goto done;
    char *start = PyBytes_AS_STRING(answer);
    char *out = start;
    *out++ = '[';
    for (Py_ssize_t i = 0; i < count; i++) {
        int value = marks[i] & ~ESCAPED;
        if (value == 0)
            continue;
        Py_ssize_t length;
        const char *text = utf8_of(PyList_GET_ITEM(hosts, i), &length);  /* cannot fail: it did not above */
        if (out != start + 1)
            *out++ = ',';
        memcpy(out, HOST, HOST_SIZE);
        out += HOST_SIZE;
        if (marks[i] & ESCAPED) {
            out = write_escaped(out, (const unsigned char *)text, length);
        } else {
            memcpy(out, text, (size_t)length);
            out += length;
        }
        memcpy(out, SCORE, SCORE_SIZE);
        out += SCORE_SIZE;
        if (value == MAX_SCORE) {
            *out++ = '1';
            *out++ = '0';
        } else {
            *out++ = (char)('0' + value);
        }
        *out++ = '}';
    }
    *out++ = ']';
    _PyBytes_Resize(&answer, out - start);  /* on failure, answer is NULL with the error set */
done:
    PyMem_Free(marks);
    return answer;
}

static PyMethodDef methods[] = {
    {"first_bad", first_bad, METH_VARARGS,
     "first_bad(names, max_chars): the index of the first item that is not a str of 1 to max_chars characters, "
     "or -1."},
    {"lookup", lookup, METH_VARARGS,
     "lookup(items, table, fallback=None): [table.get(item, fallback[i] if fallback else None) for each item]."},
    {"lookup_few", lookup_few, METH_VARARGS,
     "lookup_few(items, table, make=None, last_items=None, last_values=None): [table.get(item) for item in items],"
     " each distinct object looked up once; where the table has none, make(item), stored in the table; where"
     " last_items[i] is items[i], last_values[i]."},
    {"unique", unique, METH_O, "unique(items): the items without repeats of one object, in their order."},
    {"counts", counts, METH_O, "counts(items): {item: how many times it occurs}, items told apart by identity."},
    {"group", group, METH_VARARGS,
     "group(items, labels, number_of, count, room=None): count lists, items[i] in lists[number_of[labels[i]]]; with"
     " room, lists[n] holds only the first room[n] of its items."},
    {"scores_json", scores_json, METH_VARARGS,
     "scores_json(hosts, scores): the prioritize answer, each score less the least, hosts at the least left out."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "extender.api._names",
    "The per-name passes of filter and prioritize, in C (extender/api/_names.c says why).", -1, methods, NULL, NULL, NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__names(void)
{
    return PyModule_Create(&module);
}
