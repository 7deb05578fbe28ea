"""After a long outage the remote backend's hits come back within one cool-down of the daemon
(a PING probe on every cool-down), not after a back-off grown to many cool-downs."""

from __future__ import annotations

import time

from storage_backends import StorageConfig, create
from storage_backends.page_format import HEADER_BYTES

from .conftest import daemon_toml, page_key

COOLDOWN_S = 0.5
TIMEOUT_S = 0.2
OUTAGE_S = 8 * COOLDOWN_S  # long enough for a doubling back-off to reach 8 cool-downs
RECOVERY_BOUND_S = 2 * COOLDOWN_S + 2 * TIMEOUT_S


def test_hits_return_within_a_cool_down_after_a_long_outage(start_daemon, connect, tmp_path):
    daemon = start_daemon()
    daemon.wait_ping(connect(daemon.endpoint))
    config = StorageConfig(
        backend="remote",
        endpoint=daemon.endpoint,
        timeout_s=TIMEOUT_S,
        breaker_failures=1,
        breaker_cooldown_s=COOLDOWN_S,
    )
    backend = create("remote", config)
    key, payload = page_key(0), memoryview(b"p" * (4096 - HEADER_BYTES))
    try:
        assert backend.put([key], [payload]) == [True]
        daemon.kill9()
        end = time.monotonic() + OUTAGE_S
        while time.monotonic() < end:
            assert backend.exists([key]) == 0
        probes = backend.link_stats().timeouts
        while backend.link_stats().timeouts == probes:  # restart right after a failed probe
            assert backend.exists([key]) == 0
        restarted = daemon_toml(tmp_path / "store").replace("tcp://127.0.0.1:0", daemon.endpoint)
        daemon = start_daemon(restarted)
        daemon.wait_ping(connect(daemon.endpoint))
        back = time.monotonic()
        while backend.exists([key]) != 1:
            assert time.monotonic() - back < RECOVERY_BOUND_S * 5, "no hit after the restart"
        recovered_s = time.monotonic() - back
    finally:
        backend.close()
    print(f"hits back {recovered_s:.2f} s after the daemon answered")
    assert recovered_s <= RECOVERY_BOUND_S
