"""RemovalMap: the engine keys of announced pages, bounded, each removal named once."""

from __future__ import annotations

import pytest

from hicache.integrations.removals import RemovalMap


def test_removed_names_known_pages_once_and_skips_unknown_ones() -> None:
    announced: RemovalMap[str] = RemovalMap(capacity=8)
    announced.stored([b"a", b"b", b"c"], ["A", "B", "C"])
    assert announced.removed([b"b", b"x", b"a"]) == ["B", "A"]
    assert announced.removed([b"a", b"b"]) == []  # already announced as removed
    assert len(announced) == 1


def test_the_least_recently_stored_is_forgotten_past_capacity() -> None:
    announced: RemovalMap[str] = RemovalMap(capacity=2)
    announced.stored([b"a", b"b"], ["A", "B"])
    announced.stored([b"a"], ["A"])  # stored again: now the most recent
    announced.stored([b"c"], ["C"])
    assert announced.removed([b"a", b"b", b"c"]) == ["A", "C"]


def test_bad_arguments_change_nothing() -> None:
    with pytest.raises(ValueError):
        RemovalMap(capacity=0)
    announced: RemovalMap[str] = RemovalMap(capacity=4)
    with pytest.raises(ValueError):
        announced.stored([b"a", b"b"], ["A"])
    assert len(announced) == 0
