"""The baseline of ``hicache bench storage --backend mooncake``: Mooncake's own client.

Plain ``batch_put_from`` / ``batch_get_into`` of the same bytes straight from
and into the bench's buffers (registered once per page size, zero-copy): no
header, no checksum, no staging copy.
"""

from __future__ import annotations

import numpy as np

from hicache.bench.storage.pages import Pages, batches
from storage_backends.mooncake.client import parse_endpoint


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def _span(views: list[memoryview]) -> tuple[int, int]:
    """(address, bytes) of the one buffer the bench's page views are consecutive slices of."""
    start = _address(views[0])
    return start, _address(views[-1]) + len(views[-1]) - start


class MooncakeBaseline:
    description = "mooncake's own client: batch_put_from / batch_get_into on registered buffers"

    def __init__(self, endpoint: str) -> None:
        from mooncake.store import MooncakeDistributedStore

        parsed = parse_endpoint(endpoint)
        self._client = MooncakeDistributedStore()
        status = self._client.setup(
            parsed.local_hostname, parsed.metadata, 0, 16 << 20, parsed.protocol, "", parsed.master
        )
        if status != 0:
            raise RuntimeError(f"mooncake setup failed: {status}")
        self._registered: list[int] = []

    def _register(self, views: list[memoryview]) -> None:
        address, size = _span(views)
        if address not in self._registered:
            if self._client.register_buffer(address, size) != 0:
                raise RuntimeError("mooncake could not register the bench buffers")
            self._registered.append(address)

    @staticmethod
    def _names(work: Pages, span: slice) -> list[str]:
        return ["bench-raw:" + key.hex() for key in work.keys[span]]

    def prepare(self, work: Pages) -> None:
        self._register(work.src)
        self._register(work.dst)

    def write(self, work: Pages, span: slice) -> None:
        ptrs = [_address(view) for view in work.src[span]]
        sizes = [len(view) for view in work.src[span]]
        codes = self._client.batch_put_from(self._names(work, span), ptrs, sizes)
        if any(code != 0 for code in codes):
            raise RuntimeError(f"mooncake put failed: {sorted(set(codes))}")

    def read(self, work: Pages, span: slice) -> None:
        ptrs = [_address(view) for view in work.dst[span]]
        sizes = [len(view) for view in work.dst[span]]
        codes = self._client.batch_get_into(self._names(work, span), ptrs, sizes)
        if codes != sizes:
            raise RuntimeError(f"mooncake get failed: {sorted(set(codes) - set(sizes))}")

    def clear(self, work: Pages) -> None:
        for span in batches(work):
            self._client.batch_remove(self._names(work, span))  # leased ones expire by themselves
        for address in self._registered:
            self._client.unregister_buffer(address)
        self._registered = []

    def close(self) -> None:
        self._client.close()
