"""ByteLRU's two segments: pages stored by a PUT (new) make room before pages read again
(reused), which keep at most PROTECTED_SHARE of the capacity; the bound always holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.daemon.memory_lru import ENTRY_OVERHEAD, PROTECTED_SHARE, ByteLRU

PAGE = 100
SLOT = PAGE + ENTRY_OVERHEAD


def _page(tag: int) -> bytes:
    return bytes([tag % 256]) * PAGE


def test_a_stream_of_new_pages_evicts_new_pages_not_the_ones_read_again() -> None:
    lru = ByteLRU(capacity=8 * SLOT)  # the reused segment may hold 6 of the 8
    assert lru.put(b"a", _page(0))  # read twice from the store: reused
    assert lru.put(b"b", _page(0), new=True)  # stored by a PUT ...
    assert lru.get(b"b") == _page(0)  # ... and read once since: reused too
    for i in range(50):  # a bulk PUT's pages, each admitted as new and never read
        assert lru.put(b"new%d" % i, _page(i), new=True)
    assert b"a" in lru and b"b" in lru
    assert lru.size().entries == 8 and lru.size().evictions == 44
    assert all(b"new%d" % i in lru for i in range(44, 50))


def test_reading_a_new_page_makes_it_reused_and_the_reused_share_is_capped() -> None:
    lru = ByteLRU(capacity=8 * SLOT)
    cap = int(8 * SLOT * PROTECTED_SHARE) // SLOT  # reused pages the segment may hold: 6
    for i in range(8):
        lru.put(b"p%d" % i, _page(i), new=True)
    for i in range(8):  # every one read: the oldest reused ones go back to the new segment
        assert lru.get(b"p%d" % i) == _page(i)
    lru.put(b"late", _page(9), new=True)  # room comes from the new segment: p0 (demoted)
    assert b"p0" not in lru and b"late" in lru
    assert all(b"p%d" % i in lru for i in range(8 - cap, 8))
    assert lru.size().bytes_used <= 8 * SLOT


def test_a_page_put_again_replaces_the_old_record_in_either_segment() -> None:
    lru = ByteLRU(capacity=4 * SLOT)
    lru.put(b"k", _page(1), new=True)
    lru.put(b"k", _page(2))
    assert lru.get(b"k") == _page(2) and lru.size().entries == 1
    lru.put(b"k", _page(3), new=True)
    assert lru.get(b"k") == _page(3) and lru.size() == (1, SLOT, 0)
    assert lru.pop(b"k") and not lru.pop(b"k") and lru.size() == (0, 0, 0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "put_new", "get", "pop"]),
            st.integers(0, 15),
            st.integers(1, 4),
        ),
        max_size=80,
    )
)
def test_the_byte_bound_holds_and_every_cached_page_is_the_last_one_put(ops) -> None:
    lru = ByteLRU(capacity=10 * SLOT)
    model: dict[bytes, bytes] = {}
    for op, k, scale in ops:
        key, record = b"k%d" % k, bytes([k]) * (PAGE * scale)
        if op in ("put", "put_new"):
            assert lru.put(key, record, new=op == "put_new")
            model[key] = record
        elif op == "get":
            got = lru.get(key)
            assert got is None or got == model[key]
        else:
            lru.pop(key)
            model.pop(key, None)
        size = lru.size()
        assert size.bytes_used <= 10 * SLOT
        cached = [key for key in model if key in lru]
        assert size.entries == len(cached)
        assert size.bytes_used == sum(len(model[key]) + ENTRY_OVERHEAD for key in cached)
