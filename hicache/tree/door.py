"""Checks at the cache's door that need the tree: a namespace's type, and a
node that must lie on a request's path. They raise before anything changes
(``ValueError``; ``CacheError`` for nodes and slots)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hicache.tree.errors import CacheError
from hicache.tree.radix_tree import Key, RadixTree, TreeNode


def check_namespace(namespace: object) -> None:
    """ValueError unless ``namespace`` is a str or None (it is hashed as text)."""
    if namespace is not None and not isinstance(namespace, str):
        raise ValueError(f"namespace must be a str or None, got {type(namespace).__name__}")


def check_count(value: object, arg: str) -> int:
    """ValueError naming ``arg`` unless ``value`` is an int >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{arg} must be an int >= 0, got {value!r}")
    return value


def check_request_id(request_id: object) -> None:
    """ValueError unless ``request_id`` is a str (prefetches are kept by it)."""
    if not isinstance(request_id, str):
        raise ValueError(f"request_id must be a str, got {type(request_id).__name__}")


def check_on_path(
    tree: RadixTree, node: TreeNode, key: Key, namespace: str | None, arg: str
) -> int:
    """CacheError unless ``node`` lies on the path of ``key`` in ``namespace``
    (the root always does); returns the tokens from the root to ``node``."""
    nodes = list(tree.path_to_root(node))
    depth = sum(len(n.key) for n in nodes)
    end = depth
    for n in nodes:
        start = end - len(n.key)
        if n.namespace != namespace or end > len(key) or key[start:end] != n.key:
            raise CacheError(f"{arg} {node!r} is not on the path of these tokens")
        end = start
    return depth


def check_tail_page(arr: np.ndarray, page_of: Callable[[int], np.ndarray]) -> np.ndarray:
    """The slots of a partial last page (1-D int64) must be the first slots
    of one page, in order (CacheError otherwise; SlotError from ``page_of``
    outside the pool). Returns that page's slots, ``page_of(arr[0])``: the
    page is freed whole, named by its first slot."""
    ids = arr.tolist()  # a few slots: Python compares them with fewer numpy calls
    first = ids[0]
    page = page_of(first)
    if first % len(page) or ids != list(range(first, first + len(ids))):
        raise CacheError("the partial last page's slots must run in order from a page start")
    return page
