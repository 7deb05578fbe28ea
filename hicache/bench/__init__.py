"""Measure what the tiers buy (``bench tiering``) and how fast each part is.

Each benchmark prints a table and can write its figures as JSON; speeds are
given as ratios against a baseline measured in the same run. ``--config``
picks the cache config a benchmark reads (``--set`` changes one key); a
``--set`` key that a benchmark would ignore is refused.
"""

# For developers: each suite is a sub-package (``tiering/``, ``storage/``, ...;
# helpers two suites share in ``common/``), and each benchmark a module of it
# (``<suite>/bench.py``, or ``storage/store_open.py``, ``daemon/store.py``)
# exposing ``add_arguments(parser)`` and ``run(args) -> int``; its docstring's
# first line is its help. The table
# below says, per benchmark, the optional packages it needs (checked before it
# runs, with a hint to install the extra), which config keys it reads, and
# which kind of config its ``--config`` takes. A benchmark's module is imported
# only when that benchmark is parsed or run, so listing them is cheap.

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType, ModuleType
from typing import NamedTuple

from hicache.config.flags import add_config_flags, add_lazy_commands, module_doc
from hicache.config.loader import Scalar
from hicache.config.shipped import CACHE, DAEMON


class Benchmark(NamedTuple):
    """``reads``: config key prefixes the benchmark honours ("" = all) less
    ``ignores``; ``flags``: config keys it maps onto its own flags instead;
    ``configs``: the kind of config ``--config`` names (cache or daemon)."""

    module: str
    extras: tuple[str, ...] = ()
    reads: tuple[str, ...] = ("",)
    ignores: tuple[str, ...] = ()
    flags: Mapping[str, str] = MappingProxyType({})
    configs: str = CACHE


BENCH_EXTRA = "hicache[bench]"
BENCHMARKS: MappingProxyType[str, Benchmark] = MappingProxyType(
    {
        "tiering": Benchmark(
            "hicache.bench.tiering.bench",
            extras=("tqdm", "matplotlib"),
            ignores=("storage.path",),
        ),
        "tree": Benchmark(
            "hicache.bench.tree.bench",
            extras=("tqdm",),
            reads=("device.page_size", "device.num_tokens", "policy.eviction"),
        ),
        "transfer": Benchmark(
            "hicache.bench.transfer.bench",
            reads=(),
            flags=MappingProxyType(
                {
                    "model.num_layers": "--layers",
                    "model.kv_heads": "--kv-heads",
                    "model.head_dim": "--head-dim",
                    "model.dtype": "--dtype",
                    "device.device": "--device",
                    "transfer.workers": "--workers",
                    "transfer.io_backend": "--io-backend",
                }
            ),
        ),
        "storage": Benchmark(
            "hicache.bench.storage.bench",
            reads=(),
            flags=MappingProxyType(
                {"storage.backend": "--backend", "storage.endpoint": "--endpoint"}
            ),
        ),
        "storage-open": Benchmark("hicache.bench.storage.store_open", reads=()),
        "engine": Benchmark(
            "hicache.bench.engine.bench",
            ignores=(
                "host.enabled",
                "host.reserve_gb",
                "storage.",
                "policy.write_policy",
                "policy.prefetch_policy",
                "policy.prefetch_threshold",
                "policy.load_back_threshold",
            ),
        ),
        "daemon": Benchmark(
            "hicache.bench.daemon.bench",
            reads=("server.", "store.", "limits."),  # passed on to the daemon it starts
            ignores=("server.endpoint", "server.ready_file", "store.path"),
            configs=DAEMON,
        ),
        "daemon-store": Benchmark("hicache.bench.daemon.store", reads=(), configs=DAEMON),
        "vllm": Benchmark("hicache.bench.vllm.bench", reads=()),
        "sglang": Benchmark("hicache.bench.sglang.bench", reads=()),
    }
)


def load(name: str) -> ModuleType:
    """Import the module of benchmark ``name``; ValueError for an unknown name."""
    try:
        return importlib.import_module(BENCHMARKS[name].module)
    except KeyError:
        raise ValueError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}") from None


def missing_extras(name: str) -> list[str]:
    """The optional packages benchmark ``name`` needs that do not import."""
    return [m for m in BENCHMARKS[name].extras if not _imports(m)]


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _matches(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(p) or p == "" for p in prefixes)


def config_flags(name: str, overrides: Mapping[str, Scalar]) -> list[str]:
    """The flags that ``--set`` ``overrides`` stand for in benchmark ``name``,
    as ``[flag, value, ...]``; ValueError for a key it does not read."""
    bench = BENCHMARKS[name]
    out: list[str] = []
    for key, value in overrides.items():
        if key in bench.flags:
            out += [bench.flags[key], str(value)]
        elif not _matches(key, bench.reads) or _matches(key, bench.ignores):
            reads = [*bench.flags, *(p.rstrip(".") for p in bench.reads if p)]
            what = ", ".join(reads) if reads else "no config keys"
            raise ValueError(
                f"--set {key}: bench {name} does not read this key (it reads {what}); "
                f"refusing rather than ignoring it"
            )
    return out


def summaries() -> dict[str, str]:
    """Each benchmark's one-line help, read without importing its module."""
    return {name: module_doc(b.module) for name, b in BENCHMARKS.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``hicache bench <name>``: one sub-command per benchmark, built when used."""
    sub = add_lazy_commands(parser, "bench", "BENCHMARK")
    for name, doc in summaries().items():
        sub.add_lazy(name, doc, _builder(name))


def _builder(name: str) -> Callable[[argparse.ArgumentParser], None]:
    def build(parser: argparse.ArgumentParser) -> None:
        bench = BENCHMARKS[name]
        default = "daemon" if bench.configs == DAEMON else "default"
        add_config_flags(parser, bench.configs, default)
        load(name).add_arguments(parser)
        parser.set_defaults(run=_runner(name))

    return build


def _runner(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        return int(load(name).run(args))

    return run
