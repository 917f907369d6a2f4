"""Removes each wait of the offloaded step (issue 28: its lanes, and the overlapped step's worker, module waits and
settles) in turn, in a copy of the package, and shows that the tests under the chaos mode catch it: a bug counts as caught when the named tests fail. The clean copy must pass
first. Run on demand (minutes; not part of the pytest run):

    python tests/lane_inject_bugs.py                 # all bugs; prints a markdown table
    python tests/lane_inject_bugs.py no-grad-wait    # some of them

Exit status 1 when a bug went uncaught or the clean copy failed. To add a bug: one more BUGS entry (the text must
occur exactly once in its file) naming the tests that should catch it.
"""
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
CHAOS = {"DSFAST_STREAM_CHAOS": "11", "DSFAST_STREAM_CHAOS_MS": "4"}   # (the tests set their own too)
LANE_TESTS = ["tests/test_offload_lanes.py", "tests/distributed/test_offload_lanes_dp.py"]
OVERLAP_TESTS = ["tests/test_overlap_step.py", "tests/distributed/test_overlap_step_dp.py"]
NVME_OVERLAP_TESTS = ["tests/test_overlap_step_nvme.py"]
PARAM_NVME_OVERLAP_TESTS = ["tests/test_overlap_step_param_nvme.py"]

# (name, file under dsfast/, exact text, replacement, what an author might have done, tests that should catch it).
# Not listed, being redundant where the tests can reach them: the eval forward's settle (its module waits read the
# same events; the settle is there to raise a worker failure at once) and stage 3's wait before a /dev/shm publish
# (shared memory runs only without the test placement, where zeroing the gradients already waits for every unit).
BUGS = [
    ("no-grad-wait", "zero/step/apply.py",
     "    for u in units:   # each unit's gradient copy to the host has landed (its own event, not the whole stream)\n"
     "        u.grad_event.wait()\n",
     "",
     "the step reads each unit's host gradient without waiting for its copy (the whole-stream sync removed, no "
     "per-unit wait put in its place)", LANE_TESTS),
    ("no-upload-wait", "zero/owners/sharded.py",
     "        self.store.wait_uploads()\n",
     "",
     "step() all-gathers and returns while the 16-bit uploads are still on the h2d lane", LANE_TESTS),
    ("no-stage3-gather-wait", "zero/params/partitioned_param.py",
     "            try:\n                self.unit.step_event.wait()",
     "            try:\n                pass",
     "stage 3 gathers a shard whose upload (or overlapped update) is still in flight", LANE_TESTS + OVERLAP_TESTS),
    ("no-nvme-window-wait", "zero/nvme/states.py",
     "        u.step_event.wait()\n        self.window.store(",
     "        self.window.store(",
     "the NVMe window parks a unit's buffer while its fp32 master is still being uploaded from it", LANE_TESTS),
    ("no-setter-wait", "zero/owners/sharded.py",
     "        unit.grad_event.wait()   # a host copy still in flight",
     "        pass   # a host copy still in flight",
     "safe_set_full_grad writes the host gradient while the reduction's copy to it is still in flight", LANE_TESTS),
    ("per-module-wait", "zero/step/overlap.py",
     "        if waits:\n            for u in units:\n                self.wait_unit(u)\n",
     "        if waits:\n            pass\n",
     "stages 1-2: a module's forward does not wait for the units holding its parameters", OVERLAP_TESTS),
    ("settle-safe-get", "utils/__init__.py",
     "    if owner is not None:\n        owner.settle()\n",
     "",
     "safe_get_* / safe_set_* read the states while the worker writes them", OVERLAP_TESTS),
    ("settle-checkpoint", "engine/engine.py",
     "        where.call(\"save_checkpoint\", self.global_steps, self.micro_steps)\n        self._owner.settle()\n",
     "        where.call(\"save_checkpoint\", self.global_steps, self.micro_steps)\n",
     "save_checkpoint writes the states while the worker updates them", OVERLAP_TESTS),
    ("settle-gathered-parameters", "zero/params/gathered.py",
     "        for owner in self.owners.values():   # overlap_step: the values the step is writing, whole first\n"
     "            owner.settle()\n",
     "",
     "GatheredParameters reads the parameters before the step ends", OVERLAP_TESTS),
    ("settle-zero-grads", "zero/owners/sharded.py",
     "        if not self.store.placement.copies_states:\n"
     "            self.overlap.wait_all()   # (a failure is raised by the next settle, where every rank agrees)\n",
     "",
     "the gradients are zeroed while the worker reads them in place (no host copy)", OVERLAP_TESTS),
    ("settle-next-step-backward", "engine/engine.py",
     "        self._owner.settle(agree=True)   # overlap_step: the last step done; a failure there raised on every rank\n",
     "",
     "the next backward does not wait for the step (nor raise its failure)", OVERLAP_TESTS),
    ("nvme-unit-events", "zero/step/overlap.py",
     "        for u in units:\n            u.step_event = events[u.index]\n",
     "",
     "states on NVMe: the walk's units get no step_event, so the next forward reads values not updated yet",
     NVME_OVERLAP_TESTS),
    ("nvme-walk-drain", "zero/step/overlap.py",
     "        try:   # (NVMe: every write-back of the step landed, so that readers find the states and shards on disk)\n"
     "            self._writes_landed.wait()\n",
     "        try:   # (NVMe: every write-back of the step landed, so that readers find the states and shards on disk)\n"
     "            pass\n",
     "states on NVMe: the settle returns while the worker still writes the window back (readers race it)",
     NVME_OVERLAP_TESTS),
    ("param-window-lock", "zero/nvme/params.py",
     "        self.lock = threading.RLock()",
     "        self.lock = contextlib.nullcontext()",
     "stage 3's shards on NVMe: the forward's gathers and the worker's writes use the parameters' window without "
     "its lock", PARAM_NVME_OVERLAP_TESTS),
    ("param-write-deferral", "zero/nvme/params.py",
     "                if self.write_failed is None or not getattr(err, \"write\", False):",
     "                if True:",
     "stage 3's shards on NVMe: a gather meeting the step's failed write raises it in one rank's forward",
     PARAM_NVME_OVERLAP_TESTS),
]


def run_tests(work, tests, timeout):
    # cwd = the copy: `python -m pytest` puts it first on sys.path, so its dsfast is the one imported
    env = dict(os.environ, **CHAOS, PYTHONPATH=str(work))
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *tests]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:   # a hang: the bug is seen, though not as a failing test
        out = e.output.decode() if isinstance(e.output, bytes) else (e.output or "")
        return 1, "", f"hung: no result within --timeout {timeout} s", time.time() - t0, out
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", r.stdout, re.M)
    err = re.search(r"^E +(.+)$", r.stdout, re.M)
    if err is None and r.returncode != 0:   # (a crash: no pytest report; its last words instead)
        crash = re.search(r"^(Fatal Python error: .+)$", r.stdout, re.M)
        how = f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
        err = [None, f"{how}: {crash[1] if crash else 'no pytest report'}"]
    return r.returncode, (failed[1].split("::")[-1] if failed else ""), (err[1].strip() if err else ""), \
        time.time() - t0, r.stdout


def copy_tree(work):
    for name in ("dsfast", "tests"):
        shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    for so in (ROOT / "dsfast").rglob("*.so"):   # built extensions, if any, as they are
        shutil.copy(so, work / so.relative_to(ROOT))
    where = subprocess.run([sys.executable, "-c", "import dsfast; print(dsfast.__file__)"], cwd=work,
                           env=dict(os.environ, PYTHONPATH=str(work)), stdout=subprocess.PIPE, text=True).stdout
    if not where.strip().startswith(str(work)):
        sys.exit(f"the copy's dsfast is not the one imported (got {where.strip()!r}): nothing would be tested")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bugs", nargs="*", help="names to run (default: all): " + ", ".join(b[0] for b in BUGS))
    ap.add_argument("--timeout", type=int, default=900, help="seconds per test run")
    args = ap.parse_args()
    unknown = [b for b in args.bugs if b not in {x[0] for x in BUGS}]
    if unknown:
        sys.exit(f"unknown bug(s) {unknown}: valid names are {[b[0] for b in BUGS]}")
    chosen = [b for b in BUGS if not args.bugs or b[0] in args.bugs]
    work = Path(tempfile.mkdtemp(prefix="dsfast-lane-bugs-"))
    try:
        copy_tree(work)
        every = sorted({t for b in chosen for t in b[5]})
        rc, failed, err, secs, out = run_tests(work, every, args.timeout)
        print(f"clean copy: tests {'pass' if rc == 0 else 'FAIL'} ({secs:.0f} s)", flush=True)
        if rc != 0:
            print(out[-4000:])
            sys.exit(1)
        rows, ok = [], True
        for name, fname, old, new, what, tests in chosen:
            path = work / "dsfast" / fname
            original = path.read_text()
            assert original.count(old) == 1, f"{name}: the text to replace is not found exactly once in {fname}"
            path.write_text(original.replace(old, new))
            try:
                rc, failed, err, secs, out = run_tests(work, tests, args.timeout)
            finally:
                path.write_text(original)
            caught = rc != 0
            ok &= caught
            rows.append((name, fname, what, caught, failed, err[:160]))
            print(f"{name}: {'caught' if caught else 'NOT CAUGHT'} by {failed or '-'} ({secs:.0f} s): {err[:160]}",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| bug | file | injected | caught | first failing test | message |")
    print("|---|---|---|---|---|---|")
    for name, fname, what, caught, failed, err in rows:
        print(f"| {name} | {fname} | {what} | {'yes' if caught else '**no**'} | {failed} | {err.replace('|', '/')} |")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
