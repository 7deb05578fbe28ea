"""Device<->host KV transfer throughput (GB/s) against one contiguous copy.

For each host layout and page size, one op moves scattered random pages
(a realistic 128 KiB/token KV: 32 layers x 8 KV heads x 128 dims, fp16, by
default) through the real TransferEngine path (``submit`` + ``wait``; h2d
also ``start_loading``), device->host and host->device. The baseline, timed
right before each op in the same run, is a single contiguous ``copy_`` of the
same number of bytes between the same two memories. Reported: median GB/s of
both and the median of the per-repetition ratios, which cancels most of the
drift of a shared machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from device_pool.kv_pool import DeviceKVPool, resolve_device
from device_pool.shape import KVShape, dtype_from_name
from hicache.config.flags import at_least
from host_pool.kv_pool import LAYOUTS, HostKVPool
from transfer import TransferEngine, TransferOp, create_transfer_engine


class Result(NamedTuple):
    direction: str
    layout: str
    page_tokens: int
    gbps: float
    baseline_gbps: float
    ratio: float

    def as_dict(self) -> dict[str, str | int | float]:
        return {
            "direction": self.direction,
            "layout": self.layout,
            "page_tokens": self.page_tokens,
            "gbps": round(self.gbps, 3),
            "baseline_gbps": round(self.baseline_gbps, 3),
            "ratio": round(self.ratio, 3),
        }


class Setup(NamedTuple):
    device: DeviceKVPool
    host: HostKVPool
    engine: TransferEngine
    tokens: int  # per op


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", type=Path, help="write the results as a JSON list here (default: print only)"
    )
    parser.add_argument("--op-mb", type=at_least(1), default=256, help="bytes moved per op (MiB)")
    parser.add_argument(
        "--page-tokens", type=at_least(1), nargs="+", default=[1, 16, 64], help="page sizes"
    )
    parser.add_argument(
        "--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS), help="host layouts"
    )
    parser.add_argument("--layers", type=at_least(1), default=32, help="model layers")
    parser.add_argument("--kv-heads", type=at_least(1), default=8, help="KV heads")
    parser.add_argument("--head-dim", type=at_least(1), default=128, help="head dimension")
    parser.add_argument(
        "--dtype", choices=("float32", "float16", "bfloat16"), default="float16", help="KV dtype"
    )
    parser.add_argument("--device", default="auto", help="device pool: auto, cpu or cuda[:N]")
    parser.add_argument("--workers", type=at_least(1), default=2, help="CPU engine worker threads")
    parser.add_argument(
        "--io-backend",
        choices=("direct", "kernel"),
        default="direct",
        help="kernel: cupy gather/scatter (CUDA only)",
    )
    parser.add_argument("--repeat", type=at_least(1), default=5, help="timed ops per direction")
    parser.add_argument("--seed", type=at_least(0), default=0, help="page selection seed")


def run(args: argparse.Namespace) -> int:
    shape = KVShape(args.layers, args.kv_heads, args.head_dim, dtype_from_name(args.dtype))
    device = resolve_device(args.device)
    gen = torch.Generator().manual_seed(args.seed)
    results: list[Result] = []
    for page in args.page_tokens:
        for layout in args.layouts:
            setup = _setup(shape, device, page, layout, args)
            try:
                for direction in ("d2h", "h2d"):
                    results.append(_measure(setup, direction, args.repeat, gen))
            finally:
                setup.engine.close()
                setup.host.close()  # unpin now, before the next setup pins its pool
    _print_table(results, shape, device)
    if args.json is not None:
        args.json.write_text(json.dumps([r.as_dict() for r in results], indent=2) + "\n")
    return 0


def _setup(
    shape: KVShape, device: torch.device, page: int, layout: str, args: argparse.Namespace
) -> Setup:
    tokens = max(page, (args.op_mb << 20) // shape.bytes_per_token // page * page)
    # Pools twice the op size so that the chosen pages are scattered.
    dev = DeviceKVPool(shape, 2 * tokens, page, device=device)
    host = HostKVPool(
        shape, 2 * tokens, page, layout=layout, pin_memory=device.type == "cuda", reserve_bytes=0
    )
    engine = create_transfer_engine(dev, host, num_workers=args.workers, io_backend=args.io_backend)
    return Setup(dev, host, engine, tokens)


def _measure(setup: Setup, direction: str, repeat: int, gen: torch.Generator) -> Result:
    nbytes = setup.tokens * setup.device.shape.bytes_per_token
    baseline = _baseline(direction, nbytes, setup.device.device)
    baseline()
    _engine_op(setup, direction, gen)  # warm-up: allocators, threads, caches
    rates: list[tuple[float, float]] = []
    for _ in range(repeat):
        base_s = _timed(baseline)
        op_s = _engine_op(setup, direction, gen)
        rates.append((nbytes / op_s / 1e9, nbytes / base_s / 1e9))
    return Result(
        direction,
        setup.host.layout,
        setup.device.page_size,
        statistics.median(r[0] for r in rates),
        statistics.median(r[1] for r in rates),
        statistics.median(r[0] / r[1] for r in rates),
    )


def _engine_op(setup: Setup, direction: str, gen: torch.Generator) -> float:
    dev_slots = _scattered(setup.device.size, setup.device.page_size, setup.tokens, gen)
    host_slots = _scattered(setup.host.size, setup.host.page_size, setup.tokens, gen)
    start = time.perf_counter()
    op_id = setup.engine.submit(TransferOp(direction, dev_slots, host_slots))  # type: ignore[arg-type]
    if direction == "h2d":
        setup.engine.start_loading()
    done = setup.engine.wait(op_id)
    elapsed = time.perf_counter() - start
    if not done.ok:
        raise RuntimeError(f"transfer failed: {done.error}")
    return elapsed


def _scattered(capacity: int, page: int, tokens: int, gen: torch.Generator) -> torch.Tensor:
    pages = torch.randperm(capacity // page, generator=gen)[: tokens // page]
    return (pages[:, None] * page + torch.arange(page)).reshape(-1)


def _baseline(direction: str, nbytes: int, device: torch.device) -> Callable[[], None]:
    """One contiguous copy of ``nbytes`` from the source memory to the target memory."""
    pinned = device.type == "cuda"
    on_dev = torch.ones(nbytes, dtype=torch.uint8, device=device)
    on_host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned)
    src, dst = (on_dev, on_host) if direction == "d2h" else (on_host, on_dev)

    def copy() -> None:
        dst.copy_(src, non_blocking=pinned)
        if pinned:
            torch.cuda.synchronize(device)

    return copy


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _print_table(results: list[Result], shape: KVShape, device: torch.device) -> None:
    print(
        f"KV {shape.bytes_per_token >> 10} KiB/token ({shape.num_layers} layers), "
        f"device={device}, torch threads={torch.get_num_threads()}"
    )
    print(f"{'dir':<4} {'layout':<12} {'page':>5} {'GB/s':>7} {'copy_ GB/s':>11} {'ratio':>6}")
    for r in results:
        print(
            f"{r.direction:<4} {r.layout:<12} {r.page_tokens:>5} {r.gbps:>7.2f} "
            f"{r.baseline_gbps:>11.2f} {r.ratio:>6.2f}"
        )
