"""The two token-id converters (``hicache/tree/token_ids.py`` and its compiled twin
``token_ids.pyx``) accept the same ids, build the same keys and refuse the
same inputs with the same message, leaving the key as it was."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.native_twins import twins

ID = st.one_of(
    st.integers(0, 2**31 - 1),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.integers(-5, 2**31 + 5).map(np.int64),
    st.floats(allow_nan=False),
    st.text(max_size=2),
    st.none(),
)


def _pack(module: object, head: list[int], ids: list[object] | tuple[object, ...]) -> object:
    out = array("i", head)
    try:
        module.pack_into(out, ids)  # type: ignore[attr-defined]
    except ValueError as e:
        assert out.tolist() == head, "a refused call changed the key"
        return ("ValueError", str(e))
    return out.tolist()


@settings(max_examples=300, deadline=None)
@given(
    head=st.lists(st.integers(0, 2**31 - 1), max_size=4),
    ids=st.lists(st.one_of(st.integers(0, 2**31 - 1), ID), max_size=12),
    as_tuple=st.booleans(),
)
def test_both_converters_agree(head: list[int], ids: list[object], as_tuple: bool) -> None:
    pure, compiled = twins("hicache.tree", "token_ids")
    given_ids = tuple(ids) if as_tuple else ids
    assert _pack(pure, head, given_ids) == _pack(compiled, head, given_ids)


@pytest.mark.parametrize("bad", [-1, 2**31, 1.0, "7", None, 2**64])
def test_a_bad_id_is_named(bad: object) -> None:
    for module in twins("hicache.tree", "token_ids"):
        out = array("i", [5])
        with pytest.raises(ValueError, match=r"position 2 holds"):
            module.pack_into(out, [1, 2, bad, 3])
        assert out.tolist() == [5]
