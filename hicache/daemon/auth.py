"""CURVE authentication and tenants: key files, the ZAP authenticator, User-Id → tenant."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from hicache.config.daemon import AuthConfig

logger = logging.getLogger(__name__)

# The tenant of every request when CURVE is off.
DEFAULT_TENANT = "default"
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


class _AllowList:
    """ZAP credentials provider: a client key is allowed iff it maps to a tenant."""

    def __init__(self, tenants: dict[bytes, str]) -> None:
        self._tenants = tenants

    def callback(self, domain: str, key: bytes) -> bool:
        allowed = key in self._tenants
        if not allowed:
            logger.warning("refused a CURVE client with an unknown key")
        return allowed


class CurveAuth:
    """Server-side CURVE: a ZAP authenticator thread plus the key → tenant map.

    ``tenant_of`` is called on the socket's thread with the ZAP User-Id of a
    request (the client's z85 key); ``stop`` ends the authenticator thread.
    Raises ValueError when a key file or key is unusable.
    """

    def __init__(self, context: zmq.Context, config: AuthConfig) -> None:
        self._keys = load_key_pair(config.server_secret_key)
        self._tenants = {load_public_key(t.public_key): t.name for t in config.tenants}
        self._authenticator = ThreadAuthenticator(context, log=logger)
        self._authenticator.start()
        self._authenticator.configure_curve_callback("*", _AllowList(self._tenants))

    def secure(self, socket: zmq.Socket) -> None:
        """Make ``socket`` a CURVE server (before bind)."""
        socket.curve_secretkey = self._keys.secret
        socket.curve_publickey = self._keys.public
        socket.curve_server = True

    def tenant_of(self, user_id: str | None) -> str | None:
        if user_id is None:
            return None
        return self._tenants.get(user_id.encode())

    def stop(self) -> None:
        self._authenticator.stop()
