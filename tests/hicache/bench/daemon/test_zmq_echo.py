"""The echo baseline's GET payloads: distinct pages from a ring larger than a CPU cache."""

from __future__ import annotations

from hicache.bench.common.zmq_echo import MIN_RING, RING_BYTES, Payloads


def test_get_payloads_are_distinct_pages_from_a_bounded_ring() -> None:
    payloads = Payloads()
    size = 4 << 20
    first = payloads.take(size, RING_BYTES // size)
    assert len({bytes(page[:64]) for page in first}) == len(first)  # all different pages
    assert all(len(page) == size and any(page[:4096]) for page in first)  # not zero pages
    again = payloads.take(size, len(first))
    assert all(a is b for a, b in zip(first, again, strict=True))  # a ring: no more memory
    assert len(payloads.take(64 << 20, MIN_RING + 1)) == MIN_RING + 1  # at least MIN_RING


def test_a_put_makes_the_ring_of_its_size_and_hot_sends_one_page() -> None:
    payloads = Payloads()
    assert payloads.take(8192, 0) == []  # made now, nothing sent
    hot = Payloads(hot=True).take(8192, 3)
    assert hot[0] is hot[1] is hot[2]
