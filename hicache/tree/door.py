"""Checks at the cache's door that need the tree: a namespace's type, a node
that must lie on a request's path, an insert's arguments. They raise before
anything changes (``ValueError``; ``CacheError`` for nodes and slots)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from hicache.tree.errors import CacheError
from hicache.tree.paging import align_down
from hicache.tree.radix_tree import Key, RadixTree, Tokens, TreeNode, as_token_list

_NO_SLOTS = np.empty(0, dtype=np.int64)  # never written: numpy views of it are read only


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


class InsertArgs(NamedTuple):
    """An insert's checked arguments: the key, its whole-page length, and
    where the slots must become the request's own (past a locked
    ``last_node``; None when no node was locked)."""

    key: Key
    aligned: int
    own_from: int | None
    slots: np.ndarray  # the device slots' numpy view: cheaper slicing than torch
    tail: np.ndarray  # the whole page under a partial last page's slots (or none)
    last_node: TreeNode | None  # checked on the key's path: the insert's walk starts there


def check_insert(
    tree: RadixTree,
    tokens: Tokens,
    slots: torch.Tensor,
    namespace: str | None,
    last_node: TreeNode | None,
    page_of: Callable[[int], np.ndarray],
) -> InsertArgs:
    """Every check of an insert's arguments that needs no walk; ``last_node``
    (checked locked by the caller) must lie on the tokens' path. That the
    slots past it are the request's own is checked by the insert's one
    allocator check (``own_from``), before anything but a content-neutral
    split changes. ``page_of``: a slot's whole page (the device allocator's)."""
    check_namespace(namespace)
    key = as_token_list(tokens)
    if not isinstance(slots, torch.Tensor) or slots.dtype != torch.int64 or slots.dim() != 1:
        raise ValueError("device_slots must be a 1-D int64 tensor")
    if slots.numel() != len(key):
        raise ValueError(f"{len(key)} tokens but {slots.numel()} device slots")
    aligned = align_down(len(key), tree.page_size)
    arr = slots.numpy() if slots.is_cpu else slots.cpu().numpy()
    tail = _NO_SLOTS
    if aligned < len(key):
        tail = check_tail_page(arr[aligned:], page_of)
    depth = None
    if last_node is not None:
        depth = check_on_path(tree, last_node, key, namespace, "last_node")
    return InsertArgs(key, aligned, depth, arr, tail, last_node)
