"""The message for token ids that are refused, shared by both token-id
converters (``hicache/token_ids.py`` and its compiled twin ``.pyx``), so that
they name a bad id in the same words."""

from __future__ import annotations

import operator
from collections.abc import Sequence

MAX_TOKEN_ID = 2**31 - 1


def first_bad(ids: Sequence[object]) -> str:
    """The message naming the first id that is not an int in [0, 2**31)."""
    for i, v in enumerate(ids):
        try:
            ok = 0 <= operator.index(v) <= MAX_TOKEN_ID  # type: ignore[arg-type]
        except TypeError:
            ok = False
        if not ok:
            return f"token ids must be integers in [0, 2**31): position {i} holds {v!r}"
    return "token ids must be integers in [0, 2**31)"
