#!/bin/sh
# Usage: ensure-deb.sh PACKAGE [COMMAND]
# Installs the Debian package PACKAGE when it is missing (when COMMAND is given:
# when COMMAND is not on PATH). `make test` uses it for redis-server (the redis
# backend tests start real servers), `make test-mooncake` for libibverbs1 (the
# library Mooncake's CPU build links). A service the package may start (on
# machines with systemd) is left alone: the tests start their own servers.
set -eu
package=$1
command_name=${2:-}
if [ -n "$command_name" ]; then
    command -v "$command_name" >/dev/null 2>&1 && exit 0
elif dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "ensure-deb: $package is missing and this user cannot install it;" >&2
    echo "  the tests that need it will be skipped (apt-get install $package to run them)" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-deb: no apt-get here; install $package by hand" >&2
    exit 0
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$package"
