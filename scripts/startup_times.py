"""How long `hicache` takes to start: --help, --version, and `serve` until its banner.

    python scripts/startup_times.py [--runs 7] [--vs SOURCE_TREE]

Each figure is the median wall time of --runs starts, next to the bare interpreter's
start (`python -c pass`) measured in the same run, so a busy machine shows as a slow
baseline rather than a slow command. --vs SOURCE_TREE times the same commands from
another checkout (put first on PYTHONPATH; e.g. `git archive main | tar -x -C DIR`),
alternating with this one, and prints the ratio run by run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

CLI = "import sys; from hicache.cli.app import main; sys.exit(main())"
BANNER = b"hicache daemon listening on"
Timer = Callable[[dict[str, str]], float]


def _env(tree: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    return env


def exits(*argv: str) -> Timer:
    """Wall time of ``python -c CLI argv`` until it exits."""

    def run(env: dict[str, str]) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, *argv], env=env, capture_output=True, check=True)
        return time.perf_counter() - start

    return run


def serve_banner(env: dict[str, str]) -> float:
    """Wall time of ``hicache serve`` (fresh store, OS-picked port) until its banner."""
    with tempfile.TemporaryDirectory(prefix="hicache-startup-") as tmp:
        argv = [sys.executable, "-c", CLI, "serve", "--endpoint", "tcp://127.0.0.1:0"]
        argv += ["--metrics-port", "-1", "--store", str(Path(tmp) / "store")]
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert proc.stdout is not None
        elapsed = None
        for line in proc.stdout:
            if BANNER in line:
                elapsed = time.perf_counter() - start
                break
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        if elapsed is None:
            raise RuntimeError(f"hicache serve exited {proc.returncode} without its banner")
        return elapsed


CASES: dict[str, Timer] = {
    "python -c pass (baseline)": exits("-c", "pass"),
    "hicache --help": exits("-c", CLI, "--help"),
    "hicache --version": exits("-c", CLI, "--version"),
    "hicache serve, to its banner": serve_banner,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7, help="starts per command (default: 7)")
    parser.add_argument("--vs", help="another source tree to compare with (default: none)")
    args = parser.parse_args(argv)
    base = None
    print(
        f"{'command':<30}{'this tree':>11}{'× python':>10}"
        + (f"{'--vs':>9}{'ratio':>8}" if args.vs else "")
    )
    for name, timer in CASES.items():
        mine, theirs = [], []
        for _ in range(args.runs):
            mine.append(timer(_env(None)))
            if args.vs:
                theirs.append(timer(_env(args.vs)))
        median = statistics.median(mine)
        base = base or median
        line = f"{name:<30}{median:>10.3f}s{median / base:>9.1f}×"
        if args.vs:
            ratio = statistics.median(a / b for a, b in zip(mine, theirs, strict=True))
            line += f"{statistics.median(theirs):>8.3f}s{ratio:>8.2f}"
        print(line)
    print(f"(medians of {args.runs} starts; wall time, so a busy machine inflates every row alike)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
