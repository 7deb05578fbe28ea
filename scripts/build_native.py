"""Compile the hot path (device_pool.native.HOT_MODULES) with Cython into build/native/.

Each hot primitive's ``.pyx`` twin (typed C loops beside its ``.py``; see
device_pool/native.py). Writes build/native/manifest.json (each source's SHA-256)
last, so a build that fails half-way is never used. Exit status 1 with a message on failure: the
Makefile then goes on with the pure-Python modules.

Usage: python scripts/build_native.py [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from device_pool.native import (
    BUILD,
    HOT_MODULES,
    MANIFEST,
    ROOT,
    folder,
    source_digest,
    source_path,
)

# Each .pyx sets its own C-level directives; these only keep Python semantics
# where it does not (annotations are not turned into C type checks).
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True}


def build(jobs: int) -> None:
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension

    MANIFEST.unlink(missing_ok=True)
    for package in HOT_MODULES:  # no extension of a module no longer compiled stays
        shutil.rmtree(folder(BUILD, package), ignore_errors=True)
    os.chdir(ROOT)  # relative sources: build/native/c mirrors the packages
    names = [(p, m) for p, mods in HOT_MODULES.items() for m in mods]
    sources = {(p, m): str(source_path(p, m).relative_to(ROOT)) for p, m in names}
    exts = [Extension(f"{p}.{m}", [sources[p, m]], extra_compile_args=["-O2"]) for p, m in names]
    exts = cythonize(
        exts,
        build_dir=str(BUILD / "c"),
        compiler_directives=DIRECTIVES,
        quiet=True,
        nthreads=jobs,
        force=True,
    )
    args = ["build_ext", "--force", "--build-lib", str(BUILD), "--build-temp", str(BUILD / "tmp")]
    dist = Distribution({"ext_modules": exts, "script_args": [*args, "-j", str(jobs)]})
    dist.parse_command_line()
    try:
        dist.run_commands()
    finally:
        shutil.rmtree(BUILD / "tmp", ignore_errors=True)
    MANIFEST.write_text(json.dumps({f"{p}.{m}": source_digest(p, m) for p, m in names}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    start = time.monotonic()
    try:
        build(args.jobs)
    except Exception as e:  # any failure: the pure modules stay in use
        print(f"build_native: compiled hot path not built ({e}); hicache runs pure Python")
        return 1
    except SystemExit as e:  # setuptools reports a compiler failure this way
        print(f"build_native: compiled hot path not built ({e}); hicache runs pure Python")
        return 1
    print(
        f"build_native: compiled {sum(map(len, HOT_MODULES.values()))} modules into "
        f"{BUILD.relative_to(ROOT)} in {time.monotonic() - start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
