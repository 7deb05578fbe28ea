"""What ``hicache bench storage`` measures a backend against, per backend kind.

A ``Target`` makes the backend's config for one page size and holds the
baseline: for the on-disk backends, one file per page (``open``/``write``,
``readinto``); for ``redis``, redis-py's own client doing plain SET/GET of the
same bytes through cluster pipelines of the same batches, into the same
buffers; for ``mooncake``, Mooncake's own client (``hicache.bench.storage.mooncake``).
Network targets start a local store unless given ``--endpoint``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from redis.cluster import RedisCluster

from hicache.bench.storage.pages import Pages, batches
from hicache.config.flags import at_least
from storage_backends import StorageConfig
from storage_backends.redis.backend import parse_endpoint
from storage_backends.redis.cluster import ClusterOptions, LocalRedisCluster

if TYPE_CHECKING:
    from hicache.bench.storage.mooncake import MooncakeBaseline


class Baseline(Protocol):
    """The plain way of storing the same pages, batch by batch (``span``).

    ``prepare`` runs once before the timed batches; ``clear`` removes what was written.
    """

    description: str

    def prepare(self, work: Pages) -> None: ...
    def write(self, work: Pages, span: slice) -> None: ...
    def read(self, work: Pages, span: slice) -> None: ...
    def clear(self, work: Pages) -> None: ...


class Target(NamedTuple):
    backend: str
    root: Path
    endpoint: str
    baseline: Baseline

    def config(self, page_bytes: int, max_bytes: int, sync: bool) -> StorageConfig:
        """The backend's config for the pages of one size (a fresh store)."""
        return StorageConfig(
            backend=self.backend,
            path=str(self.root / f"{self.backend}-{page_bytes}") if not self.endpoint else "",
            endpoint=self.endpoint,
            max_bytes=max_bytes,
            sync=sync,
            fingerprint=f"bench-{page_bytes}",
        )


class FileBaseline:
    description = "one file per page, open/write (no fsync) and readinto a buffer"

    def __init__(self, root: Path) -> None:
        self._root = root

    def _dir(self, work: Pages) -> Path:
        return self._root / f"plain-{len(work.src[0])}"

    def prepare(self, work: Pages) -> None:
        self._dir(work).mkdir(exist_ok=True)

    def write(self, work: Pages, span: slice) -> None:
        for i in range(*span.indices(len(work.src))):
            with open(self._dir(work) / str(i), "wb") as file:
                file.write(work.src[i])

    def read(self, work: Pages, span: slice) -> None:
        for i in range(*span.indices(len(work.dst))):
            with open(self._dir(work) / str(i), "rb", buffering=0) as file:
                file.readinto(work.dst[i])

    def clear(self, work: Pages) -> None:
        shutil.rmtree(self._dir(work), ignore_errors=True)


class RedisBaseline:
    description = "redis-py cluster pipelines of plain SET/GET, GET copied into the buffer"

    def __init__(self, endpoint: str) -> None:
        self._client = RedisCluster(startup_nodes=parse_endpoint(endpoint))

    @staticmethod
    def _names(keys: Sequence[bytes]) -> list[bytes]:
        return [b"bench-raw:" + key for key in keys]

    def prepare(self, work: Pages) -> None:
        pass

    def write(self, work: Pages, span: slice) -> None:
        pipe = self._client.pipeline()
        for name, view in zip(self._names(work.keys[span]), work.src[span], strict=True):
            pipe.set(name, view)
        pipe.execute()

    def read(self, work: Pages, span: slice) -> None:
        pipe = self._client.pipeline()
        for name in self._names(work.keys[span]):
            pipe.get(name)
        for view, value in zip(work.dst[span], pipe.execute(), strict=True):
            view[:] = value

    def clear(self, work: Pages) -> None:
        for span in batches(work):
            pipe = self._client.pipeline()
            for name in self._names(work.keys[span]):
                pipe.delete(name)
            pipe.execute()

    def close(self) -> None:
        self._client.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint", default="", help="redis, mooncake: use this store (default: start one)"
    )
    parser.add_argument(
        "--redis-masters", type=at_least(1), default=3, help="redis: masters of the local cluster"
    )


@contextlib.contextmanager
def open_target(args: argparse.Namespace, root: Path) -> Iterator[Target]:
    """The target of ``args.backend``; a local store started here lives as long as the context."""
    if args.backend not in ("redis", "mooncake"):
        yield Target(args.backend, root, "", FileBaseline(root))
        return
    with contextlib.ExitStack() as stack:
        endpoint = args.endpoint or stack.enter_context(_local_store(args, root))
        baseline: RedisBaseline | MooncakeBaseline
        if args.backend == "redis":
            baseline = RedisBaseline(endpoint)
        else:
            from hicache.bench.storage.mooncake import MooncakeBaseline

            baseline = MooncakeBaseline(endpoint)
        stack.callback(baseline.close)
        yield Target(args.backend, root, endpoint, baseline)


@contextlib.contextmanager
def _local_store(args: argparse.Namespace, root: Path) -> Iterator[str]:
    """Start a local redis cluster or mooncake master + holder; yield its endpoint."""
    if args.backend == "redis":
        options = ClusterOptions(masters=args.redis_masters)
        with LocalRedisCluster(options, root / "redis") as cluster:
            yield cluster.endpoint
        return
    from storage_backends.mooncake.local import LocalMooncake

    # Room for the backend's and the baseline's copies of every page size, below eviction.
    room = 6 * (args.total_mb << 20) + (64 << 20)
    with LocalMooncake(segment_bytes=room, lease_ms=10_000) as store:
        yield store.endpoint
