# cython: language_level=3, boundscheck=False, wraparound=False
"""Token ids into the cache's int32 keys: the compiled twin of
``token_ids.py`` (read its docstring; same results and messages, tested
against each other). One pass converts and range-checks each id straight
into the array's buffer; a refused list leaves the array as it was."""

import operator

from cpython cimport array
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

from hicache.tree.bad_token import first_bad

cdef long long MAX_ID = 2**31 - 1


def pack_into(array.array out, ids):
    """Append ``ids`` (a list or tuple of ints in [0, 2**31)) to ``out``, an
    ``array('i')``. ValueError naming the first id that is not such an int;
    ``out`` is then as it was."""
    if type(ids) is not list and type(ids) is not tuple:
        ids = list(ids)
    cdef bint is_list = type(ids) is list
    cdef Py_ssize_t n = PyList_GET_SIZE(ids) if is_list else PyTuple_GET_SIZE(ids)
    cdef Py_ssize_t old = len(out), i
    cdef long long v
    cdef int overflow
    cdef object item
    array.resize_smart(out, old + n)
    for i in range(n):
        item = <object>(PyList_GET_ITEM(ids, i) if is_list else PyTuple_GET_ITEM(ids, i))
        if PyLong_CheckExact(item):
            v = PyLong_AsLongLongAndOverflow(item, &overflow)
            if overflow:
                v = -1
        else:  # bools, numpy ints (``__index__``, which may run any code); not floats
            v = _index(item)
            if is_list and PyList_GET_SIZE(ids) != n:
                array.resize(out, old)
                raise ValueError("token ids changed while being read")
        if v < 0 or v > MAX_ID:
            array.resize(out, old)
            raise ValueError(first_bad(ids))
        out.data.as_ints[old + i] = <int>v


cdef long long _index(object item):
    try:
        return operator.index(item)
    except (TypeError, OverflowError):
        return -1
