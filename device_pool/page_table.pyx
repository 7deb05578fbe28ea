# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The allocator's page table as typed C loops: the compiled twin of
``page_table.py`` (read that module's docstring; same names, results and
``SlotError`` messages, tested against each other).

A call checks and moves each page in one pass; a page listed twice fails at
its second visit, which finds it moved already. When a page fails, the pages
already moved are put back before the SlotError, so a refused call changes
nothing, as in the numpy version; its message comes from the separate
checks, run in the numpy version's order. The rare calls where that does not
work (an expected state that is either of two, a check with no move) check
every page first, with a mark bit in the state byte for duplicates, then
apply. The loops read raw pointers held in locals: through the object's
fields, every byte store would make C reload them.
"""

import numpy as np

cimport cython
from libc.stdint cimport int8_t, int64_t

from device_pool.slot_error import SlotError

FREE, REQUEST, TREE, ALLOCATED = 0, 1, 2, 3
STATE_NAMES = ("free", "request-held", "tree-owned", "allocated")

cdef enum:
    MARK = 0x40  # set on a page while a call's check has passed it
    C_FREE = 0
    C_REQUEST = 1
    C_TREE = 2
    C_ALLOCATED = 3


cdef struct Run:
    # a 1-D int64 array: first element, byte stride, pages (len // page_size)
    const char* base
    Py_ssize_t stride
    Py_ssize_t pages


cdef inline int64_t at(Run r, Py_ssize_t i) noexcept nogil:
    return (<const int64_t*>(r.base + i * r.stride))[0]


cdef inline int64_t page_of(int64_t slot, int shift, Py_ssize_t ps) noexcept nogil:
    # a shift for power-of-two page sizes (1 included): no division per slot
    return slot >> shift if shift >= 0 else slot // ps


cdef inline bint bad_state(int8_t have, int expect) noexcept nogil:
    if expect < 0:
        return False
    return (have == C_FREE) if expect == C_ALLOCATED else (have != expect)


cdef inline bint bad_layout(Run r, Py_ssize_t i, Py_ssize_t ps, int64_t first) noexcept nogil:
    # page i's slots are not first, first + 1, ... of one page
    cdef Py_ssize_t j
    if first % ps:
        return True
    for j in range(1, ps):
        if at(r, i * ps + j) != first + j:
            return True
    return False


@cython.final  # direct calls to the cdef helpers (no vtable), which C then inlines
cdef class PageTable:
    """Page states and the free stack of one pool (see ``page_table.py``)."""

    cdef readonly Py_ssize_t page_size, num_pages
    cdef public Py_ssize_t num_free, request_pages
    cdef int8_t[::1] _state
    cdef int64_t[::1] _free_pages
    cdef int64_t[::1] _seen
    cdef int64_t _stamp
    cdef int _shift  # log2(page_size) when a power of two (a shift, not a division), else -1
    cdef object _state_arr

    def __init__(self, Py_ssize_t num_pages, Py_ssize_t page_size):
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_free = num_pages
        self.request_pages = 0
        self._state_arr = np.zeros(num_pages, dtype=np.int8)
        self._state = self._state_arr
        self._seen = np.zeros(num_pages, dtype=np.int64)
        self._stamp = 0
        self._shift = -1
        if page_size & (page_size - 1) == 0:
            self._shift = page_size.bit_length() - 1
        self._free_pages = np.arange(num_pages - 1, -1, -1, dtype=np.int64)

    def counts(self):
        """Pages per state (free, request, tree), counted from the table."""
        per = np.bincount(self._state_arr, minlength=3)
        return int(per[C_FREE]), int(per[C_REQUEST]), int(per[C_TREE])

    def alloc(self, Py_ssize_t n):
        """Pop ``n`` (1 <= n <= num_free) pages, now request-held; their slots."""
        if not 1 <= n <= self.num_free:
            raise ValueError(f"cannot pop {n} pages: {self.num_free} are free")
        cdef Py_ssize_t ps = self.page_size, i, j, top = self.num_free
        cdef int64_t page
        out_arr = np.empty(n * ps, dtype=np.int64)
        cdef int64_t[::1] out_view = out_arr
        cdef int64_t* out = &out_view[0]
        cdef int8_t* state = &self._state[0]
        cdef const int64_t* free = &self._free_pages[0]
        for i in range(n):
            page = free[top - 1 - i]
            state[page] = C_REQUEST
            if ps == 1:
                out[i] = page
            else:
                for j in range(ps):
                    out[i * ps + j] = page * ps + j
        self.num_free = top - n
        self.request_pages += n
        return out_arr

    def move(self, const int64_t[:] slots, int expect, int to, bint whole):
        """Pages of ``slots`` in state ``expect`` pass to state ``to``."""
        cdef Run r = self._run(slots)
        cdef Py_ssize_t top = self.num_free, done, held
        if expect == to or expect == C_ALLOCATED:
            held = self._check_move(r, slots, expect, to, whole)
        else:
            # one pass checks and moves; a page listed twice fails at its
            # second visit, which finds it moved already
            done = self._apply(r, expect, to, whole and self.page_size > 1, &top)
            if done < r.pages:
                self._undo(r, done, expect)
                self._diagnose(slots, None, expect, whole, True, r.pages)
            self.num_free = top
            held = r.pages if expect == C_REQUEST else 0
        self.request_pages += (r.pages if to == C_REQUEST else 0) - held

    cdef Py_ssize_t _check_move(
        self, Run r, const int64_t[:] slots, int expect, int to, bint whole
    ) except -1:
        """``move`` for the rare cases (an expected state that is either of
        two, or no change): check every page first, then apply; the
        request-held pages among them."""
        cdef Run none = Run(NULL, 0, 0)
        cdef bint distinct = whole or expect != to
        self._check(r, none, slots, None, expect, whole, distinct)
        cdef int8_t* state = &self._state[0]
        cdef int64_t* free = &self._free_pages[0]
        cdef Py_ssize_t i, held = 0, top = self.num_free, ps = self.page_size
        cdef int shift = self._shift
        cdef int64_t page
        for i in range(r.pages):
            page = page_of(at(r, i * ps), shift, ps)
            held += (state[page] & ~MARK) == C_REQUEST
            if expect == to:  # a check only: clear its marks
                state[page] = state[page] & ~MARK
                continue
            state[page] = to
            if to == C_FREE:
                free[top] = page
                top += 1
        self.num_free = top
        return held

    def commit(self, const int64_t[:] to_tree, const int64_t[:] to_free):
        """Request-held pages of ``to_tree`` pass to the tree, those of
        ``to_free`` are freed: one pass checks and moves both."""
        cdef Run a = self._run(to_tree), b = self._run(to_free)
        cdef Py_ssize_t top = self.num_free, done_a, done_b = 0
        cdef bint layout = self.page_size > 1
        done_a = self._apply(a, C_REQUEST, C_TREE, layout, &top)
        if done_a == a.pages:
            done_b = self._apply(b, C_REQUEST, C_FREE, layout, &top)
            if done_b == b.pages:
                self.num_free = top
                self.request_pages -= a.pages + b.pages
                return
        self._undo(b, done_b, C_REQUEST)
        self._undo(a, done_a, C_REQUEST)
        self._diagnose(to_tree, to_free, C_REQUEST, True, True, a.pages + b.pages)

    def whole_pages(self, const int64_t[:] slots, bint every_slot):
        """Page numbers of ``slots``, checked as in ``page_table.py``."""
        cdef Run r = self._run(slots)
        cdef Run none = Run(NULL, 0, 0)
        self._check(r, none, slots, None, -1, every_slot, every_slot)
        out_arr = np.empty(r.pages, dtype=np.int64)
        cdef int64_t[::1] out = out_arr
        cdef Py_ssize_t i
        for i in range(r.pages):
            out[i] = self._page(at(r, i * self.page_size))
        if every_slot:
            self._unmark(r, r.pages)
        return out_arr

    cdef Run _run(self, const int64_t[:] a) except *:
        cdef Py_ssize_t n = a.shape[0]
        if n % self.page_size:
            raise SlotError(f"{n} slots do not form whole pages of {self.page_size}")
        if n == 0:
            return Run(NULL, 0, 0)
        return Run(<const char*>&a[0], a.strides[0], n // self.page_size)

    cdef inline int64_t _page(self, int64_t slot) noexcept:
        return page_of(slot, self._shift, self.page_size)

    cdef void _unmark(self, Run r, Py_ssize_t upto) noexcept:
        cdef int8_t* state = &self._state[0]
        cdef Py_ssize_t i, ps = self.page_size
        cdef int shift = self._shift
        cdef int64_t page
        for i in range(upto):
            page = page_of(at(r, i * ps), shift, ps)
            state[page] = state[page] & ~MARK

    cdef int _check(
        self, Run a, Run b, const int64_t[:] va, const int64_t[:] vb, int expect, bint whole,
        bint distinct,
    ) except -1:
        """Pages of ``a`` then ``b``: in range, whole (``whole``), distinct
        (``distinct``), in ``expect`` (-1: any state); SlotError otherwise.
        With ``distinct`` the pages stay marked: the caller's next pass
        clears the marks."""
        cdef bint layout = whole and self.page_size > 1
        cdef Py_ssize_t done_a = self._scan(a, expect, layout, distinct), done_b = 0
        if done_a == a.pages:
            done_b = self._scan(b, expect, layout, distinct)
            if done_b == b.pages:
                return 0
        if distinct:
            self._unmark(a, done_a)
            self._unmark(b, done_b)
        self._diagnose(va, vb, expect, whole, distinct, a.pages + b.pages)
        return -1

    cdef Py_ssize_t _scan(self, Run r, int expect, bint layout, bint mark) noexcept:
        """Pages of ``r`` that pass every check, in order, up to the first that
        fails (marked when ``mark``: a page met marked is listed twice)."""
        cdef Py_ssize_t ps = self.page_size, i
        cdef int64_t first, page, cap = self.num_pages * ps
        cdef int8_t have
        cdef int8_t* state = &self._state[0]
        cdef int shift = self._shift
        for i in range(r.pages):
            first = at(r, i * ps)
            if first < 0 or first >= cap or (layout and bad_layout(r, i, ps, first)):
                return i
            page = page_of(first, shift, ps)
            have = state[page]
            if have & MARK or bad_state(have, expect):
                return i
            if mark:
                state[page] = have | MARK
        return r.pages

    cdef Py_ssize_t _apply(
        self, Run r, int expect, int to, bint layout, Py_ssize_t* top
    ) noexcept:
        """Check and move the pages of ``r`` in one pass (``expect`` one state,
        not ``to``; ``FREE`` pushes at ``top``), in order, up to the first
        that fails: out of range, not whole (``layout``), or not in
        ``expect``, which includes a page met a second time. The caller
        undoes the moved ones when it returns short."""
        cdef Py_ssize_t ps = self.page_size, i = 0, t = top[0]
        cdef int64_t first, page, cap = self.num_pages * ps
        cdef int8_t* state = &self._state[0]
        cdef int64_t* free = &self._free_pages[0]
        cdef int shift = self._shift
        while i < r.pages:
            first = at(r, i * ps)
            if first < 0 or first >= cap or (layout and bad_layout(r, i, ps, first)):
                break
            page = page_of(first, shift, ps)
            if state[page] != expect:
                break
            state[page] = to
            if to == C_FREE:
                free[t] = page
                t += 1
            i += 1
        top[0] = t
        return i

    cdef void _undo(self, Run r, Py_ssize_t done, int expect) noexcept:
        """Put the first ``done`` pages of ``r`` back in ``expect`` (their
        state before a refused ``_apply``; pushes are dropped by the caller
        keeping its top)."""
        cdef int8_t* state = &self._state[0]
        cdef Py_ssize_t i, ps = self.page_size
        cdef int shift = self._shift
        for i in range(done):
            state[page_of(at(r, i * ps), shift, ps)] = expect

    cdef int _diagnose(
        self, const int64_t[:] a, const int64_t[:] b, int expect, bint whole, bint distinct,
        Py_ssize_t n,
    ) except -1:
        """Raise the SlotError for a refused call, checks in the numpy order."""
        cdef Py_ssize_t ps = self.page_size
        self._check_range(a)
        if b is not None:
            self._check_range(b)
        if whole and ps > 1:
            self._check_layout(a)
            if b is not None:
                self._check_layout(b)
        if distinct:
            self._stamp += 1
            if n > self.num_pages:
                raise SlotError("a page is listed twice")
            self._check_distinct(a)
            if b is not None:
                self._check_distinct(b)
        if expect >= 0:
            self._check_state(a, expect)
            if b is not None:
                self._check_state(b, expect)
        raise AssertionError("page table: a refused call passed every check")

    # The separate checks, for messages only (a refused call) -------------------
    cdef int _check_range(self, const int64_t[:] a) except -1:
        cdef Py_ssize_t ps = self.page_size, i
        for i in range(a.shape[0] // ps):
            if a[i * ps] < 0 or a[i * ps] >= self.num_pages * ps:
                raise SlotError(f"slot index out of range [0, {self.num_pages * ps})")
        return 0

    cdef int _check_layout(self, const int64_t[:] a) except -1:
        cdef Py_ssize_t ps = self.page_size, i, j
        for i in range(a.shape[0] // ps):
            for j in range(ps):
                if a[i * ps + j] != a[i * ps] // ps * ps + j:
                    raise SlotError("slots are not whole pages in order")
        return 0

    cdef int _check_distinct(self, const int64_t[:] a) except -1:
        cdef Py_ssize_t ps = self.page_size, i
        cdef int64_t page
        for i in range(a.shape[0] // ps):
            page = self._page(a[i * ps])
            if self._seen[page] == self._stamp:
                raise SlotError("a page is listed twice")
            self._seen[page] = self._stamp
        return 0

    cdef int _check_state(self, const int64_t[:] a, int expect) except -1:
        cdef Py_ssize_t ps = self.page_size, i
        cdef int64_t page
        cdef int8_t have
        for i in range(a.shape[0] // ps):
            page = self._page(a[i * ps])
            have = self._state[page]
            if bad_state(have, expect):
                raise SlotError(
                    f"page {page} is {STATE_NAMES[have]}, expected {STATE_NAMES[expect]}"
                )
        return 0
