"""ReplyPool: buffers lent for store reads come back for reuse, within a bound."""

from __future__ import annotations

import pytest

from hicache.daemon.reply_pool import ReplyPool


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
    assert pool.size() == (0, 3000)
    owners = {id(view.obj) for view in views}
    reused = [pool.take(1000) for _ in range(4)]
    assert sum(id(view.obj) in owners for view in reused) == 3
    assert pool.size() == (4, 0)


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="keep_bytes"):
        ReplyPool(keep_bytes=-1)
