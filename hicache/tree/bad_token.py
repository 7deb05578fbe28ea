"""What makes token ids refused, shared by the token-id converters
(``hicache/tree/token_ids.py`` and its compiled twin ``.pyx``) and the radix
tree's array path: the sign check on int32 ids, and the message naming the
first bad id in the same words everywhere."""

from __future__ import annotations

import operator
import sys
from array import array
from collections.abc import Sequence

MAX_TOKEN_ID = 2**31 - 1
# An int32's sign is the top bit of its most significant byte.
_SIGN_BYTES = slice(3, None, 4) if sys.byteorder == "little" else slice(0, None, 4)


def all_nonnegative(ids: array) -> bool:
    """Whether every id of an ``array('i')`` is >= 0: exactly when the ids'
    sign bytes are all ASCII. Three C calls, none through numpy's dispatch,
    which costs more than the scan on a request's few thousand ids."""
    return ids.tobytes()[_SIGN_BYTES].isascii()


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
