"""``sizes``: the stored payload length of each key, for readers that allocate before ``get``
(the daemon). The local stores behind the daemon (lmdb, disk) both answer it."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage_backends import StorageConfig
from storage_backends.disk import DiskBackend
from storage_backends.lmdb.backend import LmdbBackend


@pytest.mark.parametrize("kind", [LmdbBackend, DiskBackend])
def test_sizes_are_the_payload_lengths_and_absent_keys_are_none(
    kind: type[LmdbBackend] | type[DiskBackend], pages, tmp_path: Path
) -> None:
    config = StorageConfig(backend="lmdb", path=str(tmp_path / "store"), max_bytes=8 << 20)
    store = kind(config)
    try:
        lengths = [1, 4096, 5000]
        keys = pages.keys(range(4))
        assert store.put(keys[:3], [pages.payloads([i], n)[0] for i, n in enumerate(lengths)])
        assert store.sizes(keys) == [*lengths, None]
        dst = [memoryview(bytearray(n)) for n in lengths]
        assert store.get(keys[:3], dst) == [True] * 3  # a read sized by them hits
        assert [bytes(d) for d in dst] == [pages.payload(i, n) for i, n in enumerate(lengths)]
        assert store.delete(keys[1:2]) == 1
        assert store.sizes(keys) == [1, None, 5000, None]
        with pytest.raises(ValueError):
            store.sizes([b"short"])
    finally:
        store.close()
