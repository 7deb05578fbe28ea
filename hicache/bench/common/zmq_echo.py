"""A plain pyzmq ROUTER/DEALER echo: the transport-only baseline of ``hicache bench daemon``.

``python -m hicache.bench.common.zmq_echo`` binds a ROUTER on an OS-picked loopback
port, prints ``hicache-echo listening on ENDPOINT`` and answers until SIGTERM:
a GET of ``n`` pages of ``size`` bytes with ``n`` ready-made payload frames,
a PUT (``n`` payload frames) and an EXISTS with a small header. No store, no
checksums: what the daemon adds on top of moving the same bytes is the ratio.

The payloads a GET sends are distinct pages of random bytes, taken in turn from a
ring of ``RING_BYTES`` per page size (made when a PUT or GET of that size first
comes): more than a CPU's last-level cache, as the pages a server holds are. One
page sent again and again (or untouched zeroed memory, which the kernel maps to one
shared zero page) would be read from the cache on every send and make the baseline
a cache's speed. ``--hot`` keeps that old behaviour, for comparison.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType

import msgpack
import zmq

BANNER = "hicache-echo listening on"


RING_BYTES = 64 << 20  # per page size; twice this machine's 32 MiB last-level cache
MIN_RING = 4  # pages per ring, whatever their size


class Payloads:
    """GET payloads by page size: a ring of distinct random pages each (``hot``: one
    zeroed page, sent for every frame). Not thread-safe (the echo's one thread)."""

    def __init__(self, hot: bool = False) -> None:
        self._hot = hot
        self._rings: dict[int, Iterator[bytes]] = {}

    def take(self, size: int, count: int) -> list[bytes]:
        """``count`` payloads of ``size`` bytes (0: only make the ring of that size)."""
        ring = self._rings.get(size)
        if ring is None:
            pages = 1 if self._hot else max(MIN_RING, -(-RING_BYTES // max(size, 1)))
            made = [bytes(size) if self._hot else os.urandom(size) for _ in range(pages)]
            ring = self._rings[size] = itertools.cycle(made)
        return [next(ring) for _ in range(count)]


def _answer(header: dict[str, int | str], nframes: int, payloads: Payloads) -> list[bytes]:
    reply = msgpack.packb({"id": header["id"], "ok": True, "n": nframes})
    # A PUT makes the ring of its size (a GET of the same pages follows), outside its time.
    count = int(header["n"]) if header["op"] == "GET" else 0
    return [reply, *payloads.take(int(header.get("size", 0)), count)]


def serve(endpoint: str, hot: bool = False) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    print(BANNER, sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    stop = False

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    payloads = Payloads(hot)
    while not stop:
        if not sock.poll(100, zmq.POLLIN):
            continue
        frames = sock.recv_multipart(copy=False)
        header = msgpack.unpackb(frames[1].buffer)
        reply = _answer(header, len(frames) - 2, payloads)
        sock.send_multipart([frames[0], *reply], copy=False)
    sock.close()
    ctx.term()


def main() -> int:
    args = [arg for arg in sys.argv[1:] if arg != "--hot"]
    serve(args[0] if args else "tcp://127.0.0.1:*", hot="--hot" in sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
