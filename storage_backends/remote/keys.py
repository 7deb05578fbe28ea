"""CURVE key files: generate a key pair, read a pair or a public key (a file or 40 z85 chars).

Both ends read them: the daemon (its secret key, its tenants' public keys) and
the client backend (its pair, the server's public key), so they live here,
below both. Raises ValueError for an unreadable or unusable key.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import zmq
import zmq.auth

_Z85_KEY_CHARS = 40


class KeyFiles(NamedTuple):
    public: Path
    secret: Path


class KeyPair(NamedTuple):
    public: bytes  # z85
    secret: bytes  # z85


def keygen(directory: Path, name: str) -> KeyFiles:
    """Write ``name.key`` (public) and ``name.key_secret`` into ``directory`` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(str(directory), name)
    return KeyFiles(Path(public), Path(secret))


def load_key_pair(path: str | Path) -> KeyPair:
    """Both keys of a ``.key_secret`` file; ValueError if unreadable or without a secret key."""
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read key file {path}: {exc}") from None
    if secret is None:
        raise ValueError(f"{path} holds no secret key (use the .key_secret file)")
    return KeyPair(public, secret)


def load_public_key(spec: str) -> bytes:
    """A z85 public key given inline (40 characters) or as a key file; ValueError otherwise."""
    if len(spec) == _Z85_KEY_CHARS and not Path(spec).exists():
        try:
            zmq.utils.z85.decode(spec)
        except ValueError:
            raise ValueError(f"{spec!r} is neither a z85 public key nor a key file") from None
        return spec.encode()
    try:
        public, _ = zmq.auth.load_certificate(spec)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read public key file {spec}: {exc}") from None
    return public
