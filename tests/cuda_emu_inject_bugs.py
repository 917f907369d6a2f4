"""Injects realistic kernel bugs into a copy of csrc/cuda, one at a time, and shows that the
emulated kernel tests (tests/test_cuda_emulator.py) catch each: the copy is compiled against the
CPU emulation, the tests run on it, and a bug counts as caught when they fail. The unmodified
copy must pass first. Run on demand (minutes; not part of the pytest run):

    python tests/cuda_emu_inject_bugs.py            # all bugs; prints a markdown table
    python tests/cuda_emu_inject_bugs.py tail-off-by-one missing-syncthreads

Exit status 1 when a bug went uncaught or the clean copy failed. The last result is recorded in
benchmarks/RESULTS.md."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import _cuda_emu  # noqa: E402

# (name, file in csrc/cuda, exact text, replacement, what a real author might have done)
BUGS = [
    ("missing-syncthreads", "norm.cu",
     "  if (lane == 0) warp_totals[warp] = x;\n  __syncthreads();\n",
     "  if (lane == 0) warp_totals[warp] = x;\n",
     "the block reduction reads the per-warp totals without the barrier after writing them"),
    ("early-return-before-shuffle", "norm.cu",
     "  double acc = 0.0;\n  for (int64_t c = w.prefix[t] + lane;",
     "  double acc = 0.0;\n  if (w.prefix[t] + lane >= w.prefix[t + 1]) return;  // idle lane\n"
     "  for (int64_t c = w.prefix[t] + lane;",
     "lanes with no chunk to sum leave before the warp's shuffle reduction"),
    ("tail-off-by-one", "multi_tensor_apply.cuh",
     "for (int i = start + tid; i < n; i += nthreads)",
     "for (int i = start + tid; i <= n; i += nthreads)",
     "the scalar tail walks one element past the chunk"),
    ("vector-load-past-end", "multi_tensor_apply.cuh",
     "const int nv = n - n % W;",
     "const int nv = (n + W - 1) / W * W;",
     "the vector body is rounded up instead of down, loading and storing past the end"),
    ("truncating-bf16-store", "dtypes.cuh",
     "return __float2bfloat16_rn(x);",
     "return __float2bfloat16_rz(x);",
     "bf16 stores truncate instead of rounding to nearest even"),
    ("wrong-step-index", "adam.cu",
     "*static_cast<const float*>(meta.addr[4][t])",
     "*static_cast<const float*>(meta.addr[4][0])",
     "every tensor of a launch uses the first tensor's step count for its bias correction"),
    ("found-inf-from-one-thread", "scale.cu",
     "if (__syncthreads_or(b.bad) && threadIdx.x == 0)",
     "if (b.bad && threadIdx.x == 0)",
     "the overflow flag is raised only when thread 0 itself saw an inf/nan"),
]


def run_tests(lib, timeout):
    env = dict(os.environ, DSFAST_CUDA_EMU_LIB=str(lib), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(HERE / "test_cuda_emulator.py"),
           "-k", "not strict and not selftest"]
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", r.stdout, re.M)  # ERROR: the sentinel check after the test
    err = re.search(r"^E +(.+)$", r.stdout, re.M)
    return r.returncode, (failed[1].split("::")[-1] if failed else ""), (err[1].strip() if err else ""), \
        time.time() - t0, r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bugs", nargs="*", help="names to run (default: all): " + ", ".join(b[0] for b in BUGS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    args = ap.parse_args()
    why = _cuda_emu.missing_tools()
    if why:
        sys.exit(f"cannot build the emulator: {why}")
    chosen = [b for b in BUGS if not args.bugs or b[0] in args.bugs]
    work = Path(args.keep or tempfile.mkdtemp(prefix="dsfast-bugs-"))
    src = work / "cuda"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(ROOT / "csrc" / "cuda", src, ignore=shutil.ignore_patterns("emu", "tests"))
    build_dir = work / "build"

    def build_and_test():
        t0 = time.time()
        out = _cuda_emu.build(build_dir, sources=src, jobs=args.jobs, targets=("dsfast_cuda_emu",))
        return (time.time() - t0,) + run_tests(out / "libdsfast_cuda_emu.so", timeout=1800)

    rows, ok = [], True
    bt, rc, failed, err, secs, out = build_and_test()
    print(f"clean copy: build {bt:.0f} s, tests {'pass' if rc == 0 else 'FAIL'} ({secs:.0f} s)", flush=True)
    if rc != 0:
        print(out[-4000:])
        sys.exit(1)
    for name, fname, old, new, what in chosen:
        path = src / fname
        original = path.read_text()
        assert original.count(old) == 1, f"{name}: the text to replace is not found exactly once in {fname}"
        path.write_text(original.replace(old, new))
        try:
            bt, rc, failed, err, secs, out = build_and_test()
        except RuntimeError as e:  # a bug the compiler rejects is caught too, but say so
            bt, rc, failed, err, secs = 0.0, 1, "build", str(e).splitlines()[-1], 0.0
        finally:
            path.write_text(original)
        caught = rc != 0
        ok &= caught
        rows.append((name, fname, what, caught, failed, err[:160], secs))
        print(f"{name}: {'caught' if caught else 'NOT CAUGHT'} by {failed or '-'} ({secs:.0f} s): {err[:160]}",
              flush=True)
    print("\n| bug | file | injected | caught | first failing test | message |")
    print("|---|---|---|---|---|---|")
    for name, fname, what, caught, failed, err, _ in rows:
        print(f"| {name} | {fname} | {what} | {'yes' if caught else '**no**'} | {failed} | {err.replace('|', '/')} |")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
