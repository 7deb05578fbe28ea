#!/usr/bin/env bash
# One-shot check of every CUDA path on a GPU machine (issue 14).
#
# Installs the Python modules the machine lacks (from a wheel directory: the
# GPU machine has no network), records the GPU, driver and library versions,
# then runs, each step bounded by a timeout and logged on its own:
#   1. pytest -m gpu                       (every GPU-marked test)
#   2. the engine correctness tests on CUDA (tests/hicache/engine/test_cuda.py)
#   3. hicache bench transfer --device cuda --json, io backends direct and
#      kernel (kernel only when cupy imports)
# Everything lands in one folder: --out DIR, else $OUT, else ./gpu-check-<time>.
# summary.txt has one "step rc=N" line per step; the script exits non-zero
# when any step failed. --dry-run writes the plan (commands.log) and runs nothing.
set -uo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/gpu_check.sh [--wheels DIR] [--out DIR] [--python PY] [--quick]
                            [--step-timeout S] [--dry-run]
  --wheels DIR       install missing modules from wheels in DIR (pip --no-index)
  --out DIR          output folder (default: $OUT, else ./gpu-check-<timestamp>)
  --python PY        interpreter to use (default: python3)
  --quick            smaller transfer bench (64 MiB ops, 3 repeats)
  --step-timeout S   seconds each step may run (default 240)
  --dry-run          write the plan to commands.log, run nothing
USAGE
}

WHEELS=""
OUT_DIR="${OUT:-}"
PY="python3"
QUICK=0
DRY=0
STEP_TIMEOUT=240
die() {
    echo "gpu_check.sh: $*" >&2
    exit 2
}
value() {  # value OPTION REMAINING_ARGS...: the option's value, or exit 2
    [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"
    printf '%s' "$2"
}
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels) WHEELS="$(value "$@")" || exit 2; shift 2 ;;
        --out) OUT_DIR="$(value "$@")" || exit 2; shift 2 ;;
        --python) PY="$(value "$@")" || exit 2; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --step-timeout) STEP_TIMEOUT="$(value "$@")" || exit 2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
case "$STEP_TIMEOUT" in
    ''|*[!0-9]*) die "--step-timeout must be whole seconds" ;;
esac
[ -z "$WHEELS" ] || [ -d "$WHEELS" ] || die "wheel directory not found: $WHEELS"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${OUT_DIR:-$REPO/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT_DIR" || exit 2
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
cd "$REPO" || exit 2
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
: >"$OUT_DIR/commands.log"
: >"$OUT_DIR/summary.txt"
FAILED=0

# step NAME CMD...: run CMD under the step timeout, output to NAME.log, rc to summary.txt.
step() {
    local name="$1"
    shift
    printf '%s: %s\n' "$name" "$*" >>"$OUT_DIR/commands.log"
    if [ "$DRY" = 1 ]; then
        echo "$name rc=skipped (dry run)" >>"$OUT_DIR/summary.txt"
        return 0
    fi
    echo "== $name"
    timeout --kill-after=10 "$STEP_TIMEOUT" "$@" >"$OUT_DIR/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc" | tee -a "$OUT_DIR/summary.txt"
    [ "$rc" = 0 ] || FAILED=1
    return 0
}

# Modules the suite imports, as "module:distribution".
MODULES="lmdb:lmdb zmq:pyzmq xxhash:xxhash msgpack:msgpack numpy:numpy \
prometheus_client:prometheus-client pytest:pytest pytest_timeout:pytest-timeout \
hypothesis:hypothesis"
MISSING=""
for pair in $MODULES; do
    if ! "$PY" -c "import ${pair%%:*}" >/dev/null 2>&1; then
        MISSING="$MISSING ${pair#*:}"
    fi
done
echo "missing:${MISSING:- none}" >>"$OUT_DIR/commands.log"
if [ -n "$MISSING" ]; then
    if [ -n "$WHEELS" ]; then
        # shellcheck disable=SC2086  # one word per distribution
        step install "$PY" -m pip install --no-index --find-links "$WHEELS" $MISSING
    else
        # shellcheck disable=SC2086
        step install "$PY" -m pip install $MISSING
    fi
fi

step environment "$PY" -c '
import platform, subprocess, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), "count", torch.cuda.device_count())
try:
    import cupy
    print("cupy", cupy.__version__)
except ImportError as exc:
    print("cupy missing:", exc)
try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    print("nvidia-smi", out.stdout.strip() or out.stderr.strip())
except (OSError, subprocess.SubprocessError) as exc:
    print("nvidia-smi unavailable:", exc)
'

step pytest_gpu "$PY" -m pytest -m gpu -rs -p no:cacheprovider \
    --junitxml="$OUT_DIR/pytest_gpu.xml" tests
step engine_cuda "$PY" -m pytest -m gpu -rs -p no:cacheprovider \
    --junitxml="$OUT_DIR/engine_cuda.xml" tests/hicache/engine/test_cuda.py

BENCH_ARGS=(--device cuda)
if [ "$QUICK" = 1 ]; then
    BENCH_ARGS+=(--op-mb 64 --repeat 3)
fi
step bench_transfer_direct "$PY" -m hicache.cli bench transfer "${BENCH_ARGS[@]}" \
    --io-backend direct --json "$OUT_DIR/transfer_direct.json"
if [ "$DRY" = 1 ] || "$PY" -c "import cupy" >/dev/null 2>&1; then
    step bench_transfer_kernel "$PY" -m hicache.cli bench transfer "${BENCH_ARGS[@]}" \
        --io-backend kernel --json "$OUT_DIR/transfer_kernel.json"
else
    echo "bench_transfer_kernel rc=skipped (no cupy)" >>"$OUT_DIR/summary.txt"
fi

echo "results in $OUT_DIR"
exit "$FAILED"
