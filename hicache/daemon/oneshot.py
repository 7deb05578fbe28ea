"""One synchronous request to a daemon (``hicache stats``, tests).

Engines use the pipelined ``remote`` storage backend instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq

from storage_backends.remote.keys import KeyPair, load_key_pair, load_public_key
from storage_backends.remote.protocol import (
    ErrorReply,
    Frame,
    Op,
    ProtocolError,
    Reply,
    Request,
    decode_reply,
    encode_request,
)


class DaemonCallError(Exception):
    """No usable reply: timeout, an error reply, or a reply that breaks the protocol."""


def _hint(pair: KeyPair | None) -> str:
    # A CURVE daemon never answers a client whose handshake it refused: say so.
    if pair is None:
        return "if the daemon runs with auth.curve, pass --server-key and --client-key"
    return "check --server-key (the daemon's public key) and that the daemon lists this client"


def call(
    endpoint: str,
    op: Op,
    timeout_s: float,
    server_key: str | None = None,
    client_key: str | None = None,
    keys: Sequence[bytes] = (),
    pages: Sequence[Frame] = (),
) -> Reply:
    """Send one request on a fresh DEALER socket and wait up to ``timeout_s`` for its reply.

    ``server_key`` (the daemon's public key, z85 or file) and ``client_key``
    (a ``.key_secret`` file) switch CURVE on. Raises DaemonCallError.
    """
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    with context.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        pair = None
        if server_key or client_key:
            if not (server_key and client_key):
                raise DaemonCallError("CURVE needs both --server-key and --client-key")
            pair = load_key_pair(client_key)
            sock.curve_serverkey = load_public_key(server_key)
            sock.curve_publickey, sock.curve_secretkey = pair.public, pair.secret
        sock.connect(endpoint)
        # A DEALER whose CURVE handshake was refused has no peer: a blocking send would hang.
        if not sock.poll(int(timeout_s * 1000), zmq.POLLOUT):
            raise DaemonCallError(f"cannot reach {endpoint} within {timeout_s} s")
        sock.send_multipart(encode_request(Request(op, 1, tuple(keys), tuple(pages))), zmq.NOBLOCK)
        if not sock.poll(int(timeout_s * 1000)):
            raise DaemonCallError(f"no reply from {endpoint} within {timeout_s} s; {_hint(pair)}")
        try:
            reply = decode_reply(sock.recv_multipart(), op)
        except ProtocolError as exc:
            raise DaemonCallError(f"bad reply from {endpoint}: {exc}") from None
    if isinstance(reply, ErrorReply):
        raise DaemonCallError(f"{endpoint} answered {reply.code}: {reply.message}")
    return reply
