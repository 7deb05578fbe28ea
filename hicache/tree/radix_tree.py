"""The radix tree over token pages: pure structure, no pools and no policy.

Keys are ``array('i')`` of token ids. Matching compares whole slices (one
memcmp-speed comparison per node, a binary search over pages on a mismatch)
instead of looping per token or per page in Python, which is where a
pure-Python radix tree spends its time. Children are keyed by the raw bytes
of their first page, which hash faster than tuples of ints.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from hicache.tree.bad_token import all_nonnegative
from hicache.tree.token_ids import pack_into

MAX_TOKEN_ID = 2**31 - 1
Key = array  # array('i') of token ids


class TokenKey(array):
    """Token ids the cache has checked and copied (``MatchResult.key``,
    ``extend_key``): ``as_token_list`` takes one as is, so a request's ids are
    checked once however often it is passed back. Extend it with
    ``extend_key``; writing into it in place bypasses the check."""

    __slots__ = ()


ChildKey = bytes | tuple[str | None, bytes]
Tokens = Sequence[int] | torch.Tensor  # what callers may pass as token ids


class TreeNode:
    """One run of whole pages and where its KV lives in each tier.

    Mutated only by the owner thread through ``RadixTree`` and ``HiRadixCache``.
    """

    __slots__ = (
        "backup_op",
        "children",
        "created",
        "dev",
        "dev_children",
        "hit_count",
        "host",
        "host_ref",
        "id",
        "key",
        "last_access",
        "load_op",
        "lock_ref",
        "namespace",
        "page_keys",
        "parent",
        "priority",
        "tree",
    )

    def __init__(self, tree: RadixTree, key: Key, namespace: str | None) -> None:
        self.tree: RadixTree | None = tree
        self.id = tree.next_id()
        self.key = key
        self.namespace = namespace
        self.parent: TreeNode | None = None
        self.children: dict[ChildKey, TreeNode] = {}
        self.dev: np.ndarray | None = None  # device slots (int64); see ``device``
        # Children with a device copy, kept by the residency tree as ``dev``
        # changes: a shared prefix can have hundreds of children to scan.
        self.dev_children = 0
        self.host: torch.Tensor | None = None
        self.page_keys: list[bytes] | None = None
        self.lock_ref = 0
        self.host_ref = 0
        self.hit_count = 0
        self.last_access = 0
        self.created = tree.now()  # logical time of insertion (FIFO eviction)
        self.priority = 0  # highest priority of the requests that used it
        self.backup_op: int | None = None  # D2H copy in flight: host not yet reliable
        self.load_op: int | None = None  # H2D copy in flight: device not yet readable

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        tiers = ("D" if self.dev is not None else "") + ("H" if self.host is not None else "")
        return f"TreeNode(id={self.id}, len={len(self.key)}, {tiers or '-'}, lock={self.lock_ref})"

    @property
    def device(self) -> torch.Tensor | None:
        """Device slots as an int64 tensor: a view of ``dev``, which the tree
        keeps in numpy because numpy's per-call cost is a fraction of torch's
        on these small arrays. Read it; change residency through the tree."""
        dev = self.dev
        return None if dev is None else torch.from_numpy(dev)

    def has_device_child(self) -> bool:
        return self.dev_children > 0


class WalkResult(NamedTuple):
    """The deepest node whose whole key matches, and how many tokens matched."""

    node: TreeNode
    length: int
    path: list[TreeNode]


def as_token_list(tokens: Sequence[int] | torch.Tensor | np.ndarray | array) -> TokenKey:
    """Validate token ids (ints in [0, 2**31)) and return them as a ``TokenKey``.

    This is where token ids enter the cache, once per request: a ``TokenKey``
    (e.g. ``MatchResult.key``) was checked when it was made and is taken as
    is; a list, an ``array('i')``, a tensor or a numpy array is checked and
    copied once. Raises ValueError before anything is touched; the ids are
    hashed as int32.
    """
    if isinstance(tokens, TokenKey):
        return tokens
    if isinstance(tokens, list | tuple):
        return _packed(tokens)
    if isinstance(tokens, array):
        if tokens.typecode != "i":
            raise ValueError(f"token array must have typecode 'i', got {tokens.typecode!r}")
        return _nonnegative(TokenKey("i", tokens))
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 1 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise ValueError(f"token tensor must be 1-D integer, got {tokens.dtype} {tokens.shape}")
        return _from_numpy(tokens.detach().cpu().numpy())
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(f"token array must be 1-D integer, got {tokens.dtype} {tokens.shape}")
        return _from_numpy(tokens)
    if isinstance(tokens, str | bytes | Mapping | set | frozenset):
        raise ValueError(f"tokens must be a sequence of ints, not a {type(tokens).__name__}")
    return _packed(tokens)


def extend_key(key: Key, tokens: Sequence[int] | torch.Tensor | np.ndarray | array) -> TokenKey:
    """``key`` followed by ``tokens`` as one new ``TokenKey``; neither argument
    changes. Only ``tokens`` is checked when ``key`` is a ``TokenKey`` (a
    request's ``MatchResult.key`` extended by the tokens added since), so an
    engine checks each id once. ValueError as ``as_token_list``."""
    head = as_token_list(key)
    out = TokenKey("i", head)
    if isinstance(tokens, list | tuple):  # converted straight into the new key
        pack_into(out, tokens)
    else:
        out.extend(as_token_list(tokens))
    return out


def _packed(tokens: Sequence[int]) -> TokenKey:
    if not isinstance(tokens, list | tuple):
        try:
            tokens = list(tokens)
        except TypeError:
            kind = type(tokens).__name__
            raise ValueError(f"tokens must be a sequence of ints, not a {kind}") from None
    key = TokenKey("i")
    pack_into(key, tokens)
    return key


def _nonnegative(key: TokenKey) -> TokenKey:
    """``key``, or ValueError if an id is negative."""
    if not all_nonnegative(key):
        raise ValueError("token ids must be >= 0")
    return key


def _from_numpy(ids: np.ndarray) -> TokenKey:
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) > MAX_TOKEN_ID):
        raise ValueError("token ids must be in [0, 2**31)")
    return TokenKey("i", ids.astype(np.int32, copy=False).tobytes())


class RadixTree:
    """Page-aligned radix tree; children of a node are keyed by their first page.

    Root children are keyed by ``(namespace, *first_page)`` so that namespaces
    never share a node. Not thread-safe: the owner thread only.
    """

    def __init__(
        self, page_size: int, on_split: Callable[[TreeNode, TreeNode], None] | None = None
    ) -> None:
        """``on_split(upper, lower)`` is called after a node is split in two."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self._on_split = on_split
        self._ids = 0
        self._clock = 0
        self.root = TreeNode(self, array("i"), None)
        self.root.lock_ref = 1  # the root is never evicted

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def now(self) -> int:
        """The logical clock's current value (no tick)."""
        return self._clock

    def tick(self) -> int:
        """A logical clock for LRU: strictly increasing, identical across runs."""
        self._clock += 1
        return self._clock

    def child_key(self, parent: TreeNode, tokens: Key, start: int, ns: str | None) -> ChildKey:
        page = tokens[start : start + self.page_size].tobytes()
        return (ns, page) if parent is self.root else page

    def walk(
        self, tokens: Key, namespace: str | None, split: bool, start: TreeNode | None = None
    ) -> WalkResult:
        """Follow ``tokens`` (whole pages) down the tree.

        When the match ends inside a node and ``split`` is set, the node is split
        there so that the result ends on a node boundary; otherwise the walk
        stops at the last whole node. ``start``, a node the caller has checked
        to lie on the tokens' path (``door.check_on_path``), skips comparing
        the keys above it again.
        """
        node, pos, path, n, ps = self.root, 0, [], len(tokens), self.page_size
        if start is not None and start is not self.root:
            path = list(self.path_to_root(start))[::-1]
            node, pos = start, sum(len(p.key) for p in path)
        while pos + ps <= n:
            child = node.children.get(self.child_key(node, tokens, pos, namespace))
            if child is None:
                break
            klen = len(child.key)
            if pos + klen <= n and tokens[pos : pos + klen] == child.key:
                pos += klen
            else:
                if not split:
                    break
                matched = self.common_prefix(child.key, tokens, pos)
                child = self.split(child, matched)
                pos += matched
            node = child
            path.append(node)
        return WalkResult(node, pos, path)

    def common_prefix(self, key: Key, tokens: Key, pos: int) -> int:
        """Tokens (whole pages) shared by ``key`` and ``tokens[pos:]``; at least one page.

        Binary search over pages; each probe compares only the undecided range,
        so the total work is one pass over the shorter key, done in C.
        """
        ps = self.page_size
        lo, hi = 1, min(len(key), len(tokens) - pos) // ps
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if key[lo * ps : mid * ps] == tokens[pos + lo * ps : pos + mid * ps]:
                lo = mid
            else:
                hi = mid - 1
        return lo * ps

    def split(self, node: TreeNode, at: int) -> TreeNode:
        """Cut ``node`` at token ``at`` (page-aligned); returns the new upper part."""
        if at <= 0 or at >= len(node.key) or at % self.page_size:
            raise ValueError(f"cannot split a node of {len(node.key)} tokens at {at}")
        parent = node.parent
        assert parent is not None
        upper = TreeNode(self, node.key[:at], node.namespace)
        ckey = self.child_key(parent, node.key, 0, node.namespace)
        upper.parent = parent
        parent.children[ckey] = upper
        for name in (
            "lock_ref",
            "host_ref",
            "hit_count",
            "last_access",
            "created",
            "priority",
            "backup_op",
            "load_op",
        ):
            setattr(upper, name, getattr(node, name))
        if node.dev is not None:  # the parent's count stands: upper replaces node
            upper.dev, node.dev = node.dev[:at], node.dev[at:]
            upper.dev_children = 1
        if node.host is not None:
            upper.host, node.host = node.host[:at], node.host[at:]
        if node.page_keys is not None:
            pages = at // self.page_size
            upper.page_keys, node.page_keys = node.page_keys[:pages], node.page_keys[pages:]
        node.key = node.key[at:]
        node.parent = upper
        upper.children[self.child_key(upper, node.key, 0, node.namespace)] = node
        if self._on_split is not None:
            self._on_split(upper, node)
        return upper

    def add_child(self, parent: TreeNode, key: Key, namespace: str | None) -> TreeNode:
        node = TreeNode(self, key, namespace)
        node.parent = parent
        parent.children[self.child_key(parent, key, 0, namespace)] = node
        return node

    def remove_leaf(self, node: TreeNode) -> None:
        """Detach a childless node; it can no longer be locked or matched.

        ``node.parent`` is kept (read-only from now on), so that the page keys
        of a removed node can still be named in a removal event."""
        if node.children or node.parent is None or node.tree is not self:
            raise ValueError(f"{node!r} is not a removable leaf")
        del node.parent.children[self.child_key(node.parent, node.key, 0, node.namespace)]
        node.tree = None

    def nodes(self) -> Iterator[TreeNode]:
        """Every non-root node, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def render(self) -> str:
        """The tree as indented text, one node a line."""
        lines: list[str] = []
        stack = [(c, 1) for c in self.root.children.values()]
        while stack:
            node, depth = stack.pop()
            head = node.key[: min(4, len(node.key))]
            lines.append(f"{'  ' * depth}{node!r} ns={node.namespace!r} key={head}…")
            stack.extend((c, depth + 1) for c in node.children.values())
        return "\n".join(["root", *lines])

    def path_to_root(self, node: TreeNode) -> Iterator[TreeNode]:
        """``node`` and its ancestors, excluding the root."""
        while node is not self.root:
            yield node
            assert node.parent is not None
            node = node.parent

    def prefix_tokens(self, node: TreeNode) -> list[int]:
        """All tokens from the root down to and including ``node``."""
        out = array("i")
        for part in reversed([n.key for n in self.path_to_root(node)]):
            out.extend(part)
        return out.tolist()
