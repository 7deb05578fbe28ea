"""Token ids into the cache's int32 keys: the one step of a request that is
O(new tokens) in Python whatever the tree does.

Two implementations share this module name and behaviour (tested against
each other): this file, on ``array``'s own conversion, and ``token_ids.pyx``,
one typed C loop that converts and checks each id (~5× faster on a turn's few
hundred ids). The compiled one runs when built and current
(``device_pool.native``).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from hicache.tree.bad_token import all_nonnegative, first_bad


def pack_into(out: array, ids: Sequence[int]) -> None:
    """Append ``ids`` (a list or tuple of ints in [0, 2**31)) to ``out``, an
    ``array('i')``. ValueError naming the first id that is not such an int;
    ``out`` is then as it was."""
    try:
        part = array("i", ids)
    except (TypeError, OverflowError):
        raise ValueError(first_bad(ids)) from None
    if not all_nonnegative(part):
        raise ValueError(first_bad(ids))
    out.extend(part)
