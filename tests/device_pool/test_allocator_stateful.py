"""PagedAllocator (over whichever page table this run selected: numpy or compiled) against
a model of page ownership, with the promises of its docstrings as the check:

- ``alloc`` hands out whole free pages (slots of a page contiguous, in order), never a
  page that is not free, or None when too few are free (nothing changes);
- each transition (``to_tree``, ``free_request``, ``free_tree``, ``free``,
  ``commit_request``, ``check_request_held``) succeeds exactly when every page is in
  the state it expects, listed once (across both lists of a commit), whole and in range
  (``free_tree``: each page's first slot in range) -- otherwise SlotError and nothing
  changes, not even the order in which free pages are handed out later;
- ``counts``/``available``/``request_held`` always match the model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from device_pool import PagedAllocator, SlotError

FREE, REQUEST, TREE = "free", "request", "tree"
FORMS = st.sampled_from(["whole"] * 8 + ["partial", "reversed"])


def _page(pick: tuple[int, str]) -> int:
    return pick[0]


class AllocatorModel(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]), pages=st.integers(1, 10))
    def start(self, page_size: int, pages: int) -> None:
        self.ps, self.n = page_size, pages
        self.alloc = PagedAllocator(pages * page_size, page_size)
        self.state = {p: FREE for p in range(pages)}

    # --- slots, and what the allocator must make of them ------------------------------

    def draw(self, data: st.DataObject, state: str = REQUEST) -> list[int]:
        """Slots of pages mostly in ``state`` (the state the call expects, so that calls
        succeed often), sometimes any page or one out of range; pages may repeat; a page
        is now and then partial or out of order."""
        usual = [p for p, s in self.state.items() if s == state] or [self.n]
        page = st.one_of(st.sampled_from(usual), st.sampled_from(usual), st.integers(-1, self.n))
        once = data.draw(st.booleans())
        pairs = st.lists(st.tuples(page, FORMS), max_size=5, unique_by=_page if once else None)
        picks = data.draw(pairs)
        flat: list[int] = []
        for page_no, form in picks:
            slots = list(range(page_no * self.ps, (page_no + 1) * self.ps))
            if form == "partial" and self.ps > 1:
                slots = slots[:-1]
            elif form == "reversed" and self.ps > 1:
                slots = slots[::-1]
            flat += slots
        return flat

    def whole_pages(self, flat: list[int]) -> list[int] | None:
        """The pages if ``flat`` is whole in-order in-range pages, each once; else None."""
        ps = self.ps
        if len(flat) % ps:
            return None
        pages = []
        for i in range(0, len(flat), ps):
            first = flat[i]
            if first % ps or flat[i : i + ps] != list(range(first, first + ps)):
                return None
            pages.append(first // ps)
        if any(not 0 <= p < self.n for p in pages) or len(set(pages)) != len(pages):
            return None
        return pages

    def first_slot_pages(self, flat: list[int]) -> list[int] | None:
        """``free_tree``'s check: whole count, each page's first slot in range, each once."""
        if len(flat) % self.ps:
            return None
        pages = [s // self.ps for s in flat[:: self.ps]]
        if any(not 0 <= p < self.n for p in pages) or len(set(pages)) != len(pages):
            return None
        return pages

    def apply(self, call, flat_args, pages: list[int] | None, expect: set[str], to: str | None):
        """Call; it must succeed iff ``pages`` is not None and all are in ``expect``."""
        ok = pages is not None and all(self.state[p] in expect for p in pages)
        tensors = [torch.tensor(f, dtype=torch.int64) for f in flat_args]
        if not ok:
            with pytest.raises(SlotError):
                call(*tensors)
            return
        call(*tensors)
        assert pages is not None
        for p in pages:
            self.state[p] = to or self.state[p]

    # --- rules ------------------------------------------------------------------------

    @rule(n=st.integers(0, 11))
    def alloc_pages(self, n: int) -> None:
        free = sorted(p for p, s in self.state.items() if s == FREE)
        out = self.alloc.alloc(n * self.ps)
        if n > len(free):
            assert out is None
            return
        assert out is not None and out.dtype == torch.int64
        pages = self.whole_pages(out.tolist())
        assert pages is not None, f"not whole distinct pages: {out.tolist()}"
        assert set(pages) <= set(free), f"handed out pages that are not free: {pages}"
        for p in pages:
            self.state[p] = REQUEST

    @rule(data=st.data())
    def to_tree(self, data: st.DataObject) -> None:
        flat = self.draw(data)
        self.apply(self.alloc.to_tree, [flat], self.whole_pages(flat), {REQUEST}, TREE)

    @rule(data=st.data())
    def free_request(self, data: st.DataObject) -> None:
        flat = self.draw(data)
        self.apply(self.alloc.free_request, [flat], self.whole_pages(flat), {REQUEST}, FREE)

    @rule(data=st.data())
    def free_tree(self, data: st.DataObject) -> None:
        flat = self.draw(data, TREE)
        self.apply(self.alloc.free_tree, [flat], self.first_slot_pages(flat), {TREE}, FREE)

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        flat = self.draw(data, data.draw(st.sampled_from([REQUEST, TREE])))
        self.apply(self.alloc.free, [flat], self.whole_pages(flat), {REQUEST, TREE}, FREE)

    @rule(data=st.data())
    def check_request_held(self, data: st.DataObject) -> None:
        flat = self.draw(data)
        pages = self.whole_pages(flat)
        self.apply(self.alloc.check_request_held, [flat], pages, {REQUEST}, None)

    @rule(data=st.data())
    def commit_request(self, data: st.DataObject) -> None:
        to_tree, to_free = self.draw(data), self.draw(data)
        tree_pages, free_pages = self.whole_pages(to_tree), self.whole_pages(to_free)
        both = self.whole_pages(to_tree + to_free)
        ok = tree_pages is not None and free_pages is not None and both is not None
        ok = ok and all(self.state[p] == REQUEST for p in both or [])
        if not ok:
            self.apply(self.alloc.commit_request, [to_tree, to_free], None, set(), None)
            return
        self.alloc.commit_request(
            torch.tensor(to_tree, dtype=torch.int64), torch.tensor(to_free, dtype=torch.int64)
        )
        for p in tree_pages or []:
            self.state[p] = TREE
        for p in free_pages or []:
            self.state[p] = FREE

    @invariant()
    def counts_match(self) -> None:
        if not hasattr(self, "alloc"):
            return
        per = {s: sum(v == s for v in self.state.values()) * self.ps for s in (FREE, REQUEST, TREE)}
        assert tuple(self.alloc.counts()) == (per[FREE], per[REQUEST], per[TREE])
        assert self.alloc.available() == per[FREE]
        assert self.alloc.request_held() == per[REQUEST]


AllocatorModel.TestCase.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)
test_allocator_keeps_its_promises = AllocatorModel.TestCase


@pytest.mark.parametrize("call", ["free", "free_tree", "free_request", "to_tree"])
def test_a_refused_call_leaves_the_hand_out_order_as_it_was(call: str) -> None:
    """A refusal changes nothing, not even which free pages ``alloc`` gives out next."""
    order = []
    for refuse in (False, True):
        alloc = PagedAllocator(8 * 2, 2)
        held = alloc.alloc(6)
        assert held is not None
        if call == "free_tree":
            alloc.to_tree(held)
        alloc.free(held[:2])
        if refuse:
            with pytest.raises(SlotError):  # the last page listed twice
                getattr(alloc, call)(torch.cat([held[2:], held[-2:]]))
        again = alloc.alloc(16 - 4)
        assert again is not None
        order.append(np.asarray(again).tolist())
    assert order[0] == order[1]
