"""The pages ``hicache bench storage`` moves (``Pages``) and its batches over them: what the
targets and the Mooncake baseline share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol


class Pages(Protocol):
    """The bench's pages: keys, source views, destination views, batch size."""

    @property
    def keys(self) -> list[bytes]: ...
    @property
    def src(self) -> list[memoryview]: ...
    @property
    def dst(self) -> list[memoryview]: ...
    @property
    def batch(self) -> int: ...


def batches(work: Pages) -> Iterator[slice]:
    """The spans of the bench's batches."""
    for i in range(0, len(work.keys), work.batch):
        yield slice(i, i + work.batch)
