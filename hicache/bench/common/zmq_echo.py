"""A plain pyzmq ROUTER/DEALER echo: the transport-only baseline of ``hicache bench daemon``.

``python -m hicache.bench.common.zmq_echo`` binds a ROUTER on an OS-picked loopback
port, prints ``hicache-echo listening on ENDPOINT`` and answers until SIGTERM:
a GET of ``n`` pages of ``size`` bytes with ``n`` ready-made payload frames,
a PUT (``n`` payload frames) and an EXISTS with a small header. No store, no
checksums: what the daemon adds on top of moving the same bytes is the ratio.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

import msgpack
import zmq

BANNER = "hicache-echo listening on"


def _answer(
    header: dict[str, int | str], nframes: int, cache: dict[int, bytes]
) -> list[bytes | memoryview]:
    reply = msgpack.packb({"id": header["id"], "ok": True, "n": nframes})
    if header["op"] != "GET":
        return [reply]
    size = int(header["size"])
    payload = cache.setdefault(size, bytes(size))
    return [reply, *[payload] * int(header["n"])]


def serve(endpoint: str) -> None:
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
    cache: dict[int, bytes] = {}
    while not stop:
        if not sock.poll(100, zmq.POLLIN):
            continue
        frames = sock.recv_multipart(copy=False)
        header = msgpack.unpackb(frames[1].buffer)
        reply = _answer(header, len(frames) - 2, cache)
        sock.send_multipart([frames[0], *reply], copy=False)
    sock.close()
    ctx.term()


def main() -> int:
    serve(sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
