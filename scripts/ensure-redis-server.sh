#!/bin/sh
# Installs Debian's redis-server when it is missing: the redis backend tests and
# `hicache bench storage --backend redis` start real redis-server processes.
# A service the package may start (on machines with systemd) is left alone: the
# tests use their own servers on ports the OS picks.
set -eu
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "ensure-redis-server: redis-server is missing and this user cannot install it;" >&2
    echo "  the redis tests will be skipped (apt-get install redis-server to run them)" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-redis-server: no apt-get here; install redis-server (>= 7) by hand" >&2
    exit 0
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-server
