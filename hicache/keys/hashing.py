"""Page keys: chained sha256 over (parent key, namespace, page tokens).

Keys must be identical across processes and machines, so nothing here uses
``hash()`` or a random seed. sha256 (not a fast hash) because keys are shared
between tenants in one store and must resist crafted collisions.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections.abc import Sequence

from hicache.config.cache import ModelConfig
from hicache.tree.radix_tree import TreeNode

LAYOUT_VERSION = 1
KEY_BYTES = 32


def model_fingerprint(model: ModelConfig, page_size: int) -> bytes:
    """The root parent key: everything that changes the bytes of a page."""
    fields = (
        f"hicache-kv-v{LAYOUT_VERSION}",
        model.model_id,
        model.dtype,
        model.attention,
        str(model.num_layers),
        str(model.kv_heads),
        str(model.head_dim),
        str(model.kv_lora_rank),
        str(model.rope_dim),
        str(page_size),
        f"tp{model.tp_rank}/{model.tp_size}",
    )
    return hashlib.sha256("\x1f".join(fields).encode()).digest()


def _namespace_bytes(namespace: str | None) -> bytes:
    # Length-prefixed so that (namespace, tokens) pairs can never run together;
    # None and "" are distinct namespaces.
    if namespace is None:
        return b"\xff\xff\xff\xff"
    raw = namespace.encode()
    return struct.pack("<I", len(raw)) + raw


def page_keys(
    parent_key: bytes, namespace: str | None, tokens: Sequence[int], page_size: int
) -> list[bytes]:
    """Keys of each whole page of ``tokens``, chained from ``parent_key``.

    ``tokens`` must hold whole pages of ids in [0, 2**31); ValueError otherwise.
    """
    if len(tokens) % page_size:
        raise ValueError(f"{len(tokens)} tokens are not whole pages of {page_size}")
    packed = array("i", tokens)
    if packed.itemsize != 4:  # pragma: no cover - every supported platform has 4-byte int
        raise RuntimeError("array('i') is not 32-bit on this platform")
    raw = packed.tobytes() if struct.pack("=i", 1) == struct.pack("<i", 1) else _le(packed)
    ns = _namespace_bytes(namespace)
    step = page_size * 4
    keys: list[bytes] = []
    key = parent_key
    for off in range(0, len(raw), step):
        key = hashlib.sha256(key + ns + raw[off : off + step]).digest()
        keys.append(key)
    return keys


def _le(packed: array) -> bytes:
    swapped = array("i", packed)
    swapped.byteswap()
    return swapped.tobytes()


class NodeKeys:
    """Storage keys of tree nodes: the one home for "the page key of a node's
    parent". Keys are computed once per node and kept on ``node.page_keys``
    (a split divides them); stateless otherwise. Owner thread only."""

    def __init__(self, fingerprint: bytes, page_size: int) -> None:
        self.fingerprint = fingerprint
        self.page_size = page_size

    def of(self, node: TreeNode) -> list[bytes]:
        """Keys of ``node``'s pages (also for a node removed from the tree)."""
        if node.page_keys is None:
            node.page_keys = page_keys(
                self.parent_of(node), node.namespace, node.key, self.page_size
            )
        return node.page_keys

    def assign(self, node: TreeNode, keys: list[bytes]) -> None:
        """Keys already computed for ``node`` (a prefetch carries them)."""
        assert len(keys) * self.page_size == len(node.key), "one key per page"
        node.page_keys = keys

    def parent_of(self, node: TreeNode) -> bytes:
        """The key ``node``'s first page chains from: the parent's last page
        key, or the model fingerprint below the root."""
        parent = node.parent
        assert parent is not None, "the root has no page keys"
        return self.chain_from(parent)

    def chain_from(self, node: TreeNode) -> bytes:
        """The key that pages hung below ``node`` chain from."""
        if node.parent is None:  # the root
            return self.fingerprint
        return self.of(node)[-1]

    def event_parent(self, node: TreeNode) -> bytes | None:
        """The parent block hash a KV event names (None below the root)."""
        parent = node.parent
        assert parent is not None
        return None if parent.parent is None else self.of(parent)[-1]
