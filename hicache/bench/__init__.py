"""Benchmarks behind ``hicache bench <name>``.

Each benchmark is a module exposing ``add_arguments(parser)`` and
``run(args) -> int``; the registry maps names to module paths so that a
benchmark's heavy imports happen only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Callable
from types import MappingProxyType, ModuleType

BENCHMARKS: MappingProxyType[str, str] = MappingProxyType(
    {
        "tiering": "hicache.bench.tiering",
        "tree": "hicache.bench.tree",
        "transfer": "hicache.bench.transfer",
        "storage": "hicache.bench.storage",
        "engine": "hicache.bench.engine",
        "daemon": "hicache.bench.daemon",
    }
)


def load(name: str) -> ModuleType:
    """Import the module of benchmark ``name``; ValueError for an unknown name."""
    try:
        return importlib.import_module(BENCHMARKS[name])
    except KeyError:
        raise ValueError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}") from None


def add_parsers(
    sub: argparse._SubParsersAction, common: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add one sub-command per benchmark whose module imports; ``common`` adds
    the flags every sub-command shares."""
    for name in BENCHMARKS:
        try:
            module = load(name)
        except ImportError as e:  # a benchmark whose optional deps are missing
            logging.getLogger(__name__).debug("benchmark %s unavailable: %s", name, e)
            continue
        p = sub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        common(p)
        module.add_arguments(p)
        run: Callable[[argparse.Namespace], int] = module.run
        p.set_defaults(bench_run=run)
