"""Token ids enter the cache once per request: ``TokenKey`` and ``extend_key``."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hicache.tree.radix_tree import MAX_TOKEN_ID, TokenKey, as_token_list, extend_key
from tests.hicache.helpers import device_only, run_request

IDS = st.lists(st.integers(min_value=0, max_value=MAX_TOKEN_ID), max_size=64)
BAD_IDS = st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), min_size=1).filter(
    lambda ids: min(ids) < 0
)


@given(IDS)
def test_every_input_form_gives_the_same_checked_key(ids: list[int]) -> None:
    forms = (
        ids,
        tuple(ids),
        array("i", ids),
        np.array(ids, dtype=np.int64),
        torch.tensor(ids, dtype=torch.int64),
    )
    for form in forms:
        key = as_token_list(form)  # type: ignore[arg-type]
        assert type(key) is TokenKey and key.tolist() == ids
        assert as_token_list(key) is key  # checked once: passed back as is


@given(BAD_IDS)
def test_a_negative_id_anywhere_is_refused_in_every_form(ids: list[int]) -> None:
    for form in (ids, array("i", ids), np.array(ids)):
        with pytest.raises(ValueError, match=r">= 0|\[0, 2\*\*31\)"):
            as_token_list(form)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [[2**31], [1.5], "ab", {1: 2}, {1, 2}, array("l", [1])])
def test_ids_that_are_not_int32_token_ids_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        as_token_list(bad)  # type: ignore[arg-type]


@given(IDS, IDS)
def test_extend_key_is_a_new_checked_key_and_changes_neither_argument(
    head: list[int], tail: list[int]
) -> None:
    key = as_token_list(head)
    out = extend_key(key, tail)
    assert type(out) is TokenKey and out.tolist() == head + tail
    assert key.tolist() == head and out is not key


@given(IDS, BAD_IDS)
def test_extend_key_checks_the_new_ids(head: list[int], tail: list[int]) -> None:
    key = as_token_list(head)
    with pytest.raises(ValueError):
        extend_key(key, tail)
    assert key.tolist() == head


def test_extend_key_checks_a_plain_head_too() -> None:
    with pytest.raises(ValueError):
        extend_key(array("i", [1, -1]), [2])


def test_a_match_key_extended_by_new_tokens_matches_like_the_whole_list() -> None:
    """The engine's path: convert once, extend by each turn's new tokens."""
    cache = device_only(4)
    first = list(range(12))
    run_request(cache, first)
    m = cache.match_prefix(first)
    assert type(m.key) is TokenKey
    turn = extend_key(m.key, [50, 51, 52, 53])
    whole = cache.match_prefix([*first, 50, 51, 52, 53])
    again = cache.match_prefix(turn)
    assert again.key is turn
    assert again.device_hit_length == whole.device_hit_length == 12
    assert torch.equal(again.device_indices, whole.device_indices)
    cache.check_integrity()
