"""Cold (empty cache: JIT build) and warm (cache hit) load times of one op, each in a fresh process.

    python benchmarks/op_load_time.py [op_name] [--warm N]

Also prints each object file's compile time from ninja's log, to show where a cold build goes.
Times exclude `import torch`. A benchmark, not a test: numbers depend on the machine's load.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dsfast.ops import paths

CHILD = """
import sys, time, torch
from dsfast.ops import load, loaded_from
t = time.perf_counter()
load(sys.argv[1])
print(time.perf_counter() - t, loaded_from(sys.argv[1]))
"""


def timed_load(op, cache, csrc):
    env = dict(os.environ, DSFAST_CACHE_DIR=str(cache), DSFAST_CSRC_DIR=str(csrc), DSFAST_REQUIRE_OPS="1")
    out = subprocess.run([sys.executable, "-c", CHILD, op], env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"loading {op} failed:\n{out.stderr}")
    seconds, origin = out.stdout.split()
    return float(seconds), origin


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("op", nargs="?", default="cpu_optim")
    parser.add_argument("--warm", type=int, default=3, help="warm loads to time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dsfast-load-") as tmp:
        # A snapshot of the sources: an edit elsewhere during the run would (rightly) rebuild.
        csrc, cache = Path(tmp) / "csrc", Path(tmp) / "cache"
        shutil.copytree(paths.csrc_root(), csrc)
        cold, origin = timed_load(args.op, cache, csrc)
        if origin != "jit":
            sys.exit(f"{args.op} came from {origin!r}, not a JIT build; uninstall the prebuilt op to measure")
        warm = [timed_load(args.op, cache, csrc)[0] for _ in range(args.warm)]
        build_dir = next(Path(cache).glob(f"*/{args.op}-*"))
        objects = []
        for line in (build_dir / ".ninja_log").read_text().splitlines()[1:]:
            start, end, _, target, _ = line.split("\t")
            objects.append((target, (int(end) - int(start)) / 1000))
        info = json.loads((build_dir / "build.json").read_text())
    print(f"op {args.op}: cold load (JIT build) {cold:.1f} s; warm load "
          f"{min(warm) * 1000:.0f} ms best / {max(warm) * 1000:.0f} ms worst of {len(warm)}")
    print(f"  build recorded {info['build_seconds']} s; ninja per target (parallel, so they overlap):")
    for target, seconds in sorted(objects, key=lambda x: -x[1]):
        print(f"    {seconds:7.1f} s  {target}")


if __name__ == "__main__":
    main()
