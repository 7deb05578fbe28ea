"""CURVE authentication and tenants: the ZAP authenticator, User-Id → tenant (key files:
``storage_backends.remote.keys``)."""

from __future__ import annotations

import logging

import zmq
from zmq.auth.thread import ThreadAuthenticator

from hicache.config.daemon import AuthConfig
from storage_backends.remote.keys import load_key_pair, load_public_key

logger = logging.getLogger(__name__)

# The tenant of every request when CURVE is off.
DEFAULT_TENANT = "default"


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
