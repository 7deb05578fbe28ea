"""The two page tables (``device_pool/page_table.py``, numpy, and its compiled
twin ``page_table.pyx``) give the same results and the same errors.

Both are loaded side by side whatever path the run selected; a hypothesis
state machine drives them with the same calls, valid and not, and compares
every answer, every ``SlotError`` message and the counters after each step."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from device_pool.slot_error import SlotError
from tests.native_twins import twins


def _twins() -> tuple[ModuleType, ModuleType]:
    return twins("device_pool", "page_table")


def _call(table: object, method: str, *args: object) -> object:
    """The answer, or the SlotError's message, as a comparable value."""
    try:
        out = getattr(table, method)(*args)
    except SlotError as e:
        return ("SlotError", str(e))
    return out.tolist() if isinstance(out, np.ndarray) else out


EXPECT = st.sampled_from([1, 2, 3])  # REQUEST, TREE, ALLOCATED
TO = st.sampled_from([0, 1, 2])  # FREE, REQUEST, TREE


class Twins(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 3, 4, 16]), pages=st.integers(1, 24))
    def start(self, page_size: int, pages: int) -> None:
        pure, compiled = _twins()
        self.ps, self.pages = page_size, pages
        self.tables = (pure.PageTable(pages, page_size), compiled.PageTable(pages, page_size))
        self.handed: list[list[int]] = []  # slots alloc gave out, page by page

    def both(self, method: str, *args: object) -> object:
        pure, compiled = (_call(t, method, *args) for t in self.tables)
        assert pure == compiled, f"{method}{args}: numpy {pure!r} vs compiled {compiled!r}"
        return pure

    def slots(self, data: st.DataObject, valid_bias: bool) -> np.ndarray:
        """Slots drawn from pages handed out (whole, maybe repeated), or anything."""
        cap = self.pages * self.ps
        if valid_bias and self.handed:
            picks = data.draw(st.lists(st.sampled_from(self.handed), max_size=6))
            flat = [s for page in picks for s in page]
        else:
            flat = data.draw(st.lists(st.integers(-2, cap + 2), max_size=3 * self.ps))
        return np.array(flat, dtype=np.int64)

    @rule(n=st.integers(1, 8))
    def alloc(self, n: int) -> None:
        if n > self.tables[0].num_free:
            return
        out = self.both("alloc", n)
        assert isinstance(out, list)
        self.handed += [out[i : i + self.ps] for i in range(0, len(out), self.ps)]

    @rule(data=st.data(), expect=EXPECT, to=TO, whole=st.booleans(), valid=st.booleans())
    def move(self, data: st.DataObject, expect: int, to: int, whole: bool, valid: bool) -> None:
        if not whole and expect != 2:
            whole = True  # only tree pages are freed without the whole-page check
        self.both("move", self.slots(data, valid), expect, to, whole)

    @rule(data=st.data(), valid=st.booleans())
    def commit(self, data: st.DataObject, valid: bool) -> None:
        self.both("commit", self.slots(data, valid), self.slots(data, valid))

    @rule(data=st.data(), every=st.booleans())
    def whole_pages(self, data: st.DataObject, every: bool) -> None:
        self.both("whole_pages", self.slots(data, True), every)

    @invariant()
    def same_counters(self) -> None:
        if hasattr(self, "tables"):
            pure, compiled = self.tables
            counters = [(t.num_free, t.request_pages) for t in self.tables]
            assert counters[0] == counters[1]
            assert pure.counts() == compiled.counts()


Twins.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
test_page_tables_agree = Twins.TestCase


def test_a_refused_call_changes_nothing_in_either() -> None:
    for module in _twins():
        table = module.PageTable(4, 2)
        slots = table.alloc(3)
        with pytest.raises(SlotError, match="listed twice"):
            table.move(np.concatenate([slots, slots[:2]]), 1, 0, True)
        assert (table.num_free, table.request_pages, table.counts()) == (1, 3, (1, 3, 0))
        table.move(slots, 1, 0, True)  # the marks of the refused call are gone
        assert table.counts() == (4, 0, 0)


@pytest.mark.parametrize("pages", [1, 4])
def test_a_tree_page_freed_twice_in_one_call_is_refused(pages: int) -> None:
    """Tree pages are freed without the whole-page check (they were checked
    whole on entry), but a page listed twice is still refused, before
    anything changes, in both: whether or not the free stack has room for
    the extra entry (in C, where it has none, that would write past its end)."""
    for module in _twins():
        table = module.PageTable(4, 2)
        slots = table.alloc(pages)
        table.move(slots, 1, 2, True)  # to the tree
        twice = np.concatenate([slots, slots[:2]])
        free_before = table.num_free
        with pytest.raises(SlotError, match="listed twice"):
            table.move(twice, 2, 0, False)
        assert (table.num_free, table.counts()) == (free_before, (4 - pages, 0, pages))
        table.move(slots, 2, 0, False)
        assert (table.num_free, table.counts()) == (4, (4, 0, 0))


@pytest.mark.parametrize("n", [0, -1, 3])
def test_popping_more_pages_than_are_free_is_refused(n: int) -> None:
    for module in _twins():
        table = module.PageTable(2, 4)
        with pytest.raises(ValueError, match="cannot pop"):
            table.alloc(n)
        assert (table.num_free, table.counts()) == (2, (2, 0, 0))
