"""ReplyPool: buffers lent for store reads come back for reuse, within a bound."""

from __future__ import annotations

import ctypes

import pytest

from hicache.daemon.reply_pool import POISON, ReplyPool, poison_from
from storage_backends.page_format import HEADER_BYTES


def test_a_buffer_given_back_is_lent_again_for_the_same_size() -> None:
    pool = ReplyPool(keep_bytes=1 << 20)
    first = pool.take(4096)
    owner = first.obj
    pool.give_back(first)
    again = pool.take(4096)
    assert again.obj is owner and len(again) == 4096
    assert pool.take(4096).obj is not owner  # lent out: never handed out twice at once
    assert pool.take(8192).obj is not owner


def test_lent_out_names_only_the_pool_s_buffers_still_lent() -> None:
    pool = ReplyPool()
    lent, returned = pool.take(100), pool.take(100)
    pool.give_back(returned)
    foreign = memoryview(bytearray(100))
    assert pool.lent_out([lent, returned, foreign, b"x" * 100]) == [lent]
    assert pool.size().lent == 1


def test_free_buffers_kept_are_bounded_and_foreign_or_double_returns_are_ignored() -> None:
    pool = ReplyPool(keep_bytes=3 * 1000)
    views = [pool.take(1000) for _ in range(5)]
    pool.give_back_all(views)
    pool.give_back_all(views)  # twice: ignored
    pool.give_back(memoryview(bytearray(1000)))  # never lent: ignored
    assert pool.size() == (0, 3000, 0)
    owners = {id(view.obj) for view in views}
    reused = [pool.take(1000) for _ in range(4)]
    assert sum(id(view.obj) in owners for view in reused) == 3
    assert pool.size() == (4, 0, 0)


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="keep_bytes"):
        ReplyPool(keep_bytes=-1)


def test_poison_fills_every_buffer_given_back_and_finds_one_written_while_free() -> None:
    pool = ReplyPool(keep_bytes=1 << 20, poison=True)
    kept, let_go = pool.take(1000), pool.take(1 << 21)  # the second is over the bound
    kept[:] = b"r" * 1000
    let_go_owner = let_go.obj
    pool.give_back_all([kept, let_go])
    for owner in (kept.obj, let_go_owner):
        assert POISON in bytes(owner) and b"r" not in bytes(owner)
    kept[500] = 0  # a stale holder writes a buffer given back
    again = pool.take(1000)
    assert again.obj is kept.obj and pool.size().tampered == 1
    pool.give_back(again)
    pool.take(1000)  # poisoned whole again when given back: nothing more to report
    assert pool.size().tampered == 1


def test_without_poison_a_buffer_given_back_keeps_its_bytes() -> None:
    pool = ReplyPool()
    view = pool.take(64)
    view[:] = b"p" * 64
    pool.give_back(view)
    assert bytes(pool.take(64)) == b"p" * 64 and pool.size().tampered == 0


def test_the_poison_is_on_when_its_variable_is_set_and_not_0() -> None:
    assert not poison_from({}) and not poison_from({"HICACHE_DAEMON_POISON": "0"})
    assert poison_from({"HICACHE_DAEMON_POISON": "1"})


def _address(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


@pytest.mark.parametrize("size", [HEADER_BYTES, 4096 + HEADER_BYTES, (2 << 20) + HEADER_BYTES, 7])
def test_a_record_s_payload_starts_on_a_64_byte_boundary_new_or_reused(size: int) -> None:
    pool = ReplyPool(keep_bytes=8 << 20)
    views = [pool.take(size) for _ in range(3)]
    for view in views:
        assert len(view) == size and (_address(view) + HEADER_BYTES) % 64 == 0
    pool.give_back_all(views)
    again = pool.take(size)
    assert again.obj is views[-1].obj and (_address(again) + HEADER_BYTES) % 64 == 0
