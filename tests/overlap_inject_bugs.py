"""Removes each wait of the overlapped step (offload_optimizer.overlap_step, zero/step/overlap.py) in turn from a
copy of dsfast, and shows that its tests (tests/test_overlap_step.py, in-process, under the test placement and the
chaos delays) catch each: a removal counts as caught when they fail. The unmodified copy must pass first. Run on
demand (about a minute; not part of the pytest run):

    python tests/overlap_inject_bugs.py               # every removal; prints a markdown table
    python tests/overlap_inject_bugs.py per-module-wait settle-safe-get

Exit status 1 when a removal went uncaught or the clean copy failed."""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# (name, file under dsfast/, exact text, replacement, the wait it removes)
BUGS = [
    ("per-module-wait", "zero/step/overlap.py",
     "        if waits:\n            for u in units:\n                self.wait_unit(u)\n",
     "        if waits:\n            pass\n",
     "stages 1-2: a module's forward does not wait for the units holding its parameters"),
    ("stage3-gather-wait", "zero/params/partitioned_param.py",
     "        if self.step_unit is not None:\n            try:",
     "        if False:\n            try:",
     "stage 3: a shard is gathered before its unit's step wrote it"),
    ("stage3-publish-wait", "zero/owners/sharded.py",
     "            for u in self.store.units:\n                self.overlap.wait_unit(u)\n",
     "            pass\n",
     "stage 3, same-host ranks: the /dev/shm snapshot is published before every unit is stepped"),
    ("grad-event-wait", "zero/step/overlap.py",
     "                u.grad_event.wait()\n",
     "",
     "a unit is stepped before its gradient's host copy landed (copies' grad_event: DoneEvent until the copies "
     "helper's lanes land)"),
    ("settle-safe-get", "utils/__init__.py",
     "    if owner is not None:\n        owner.settle()\n",
     "",
     "safe_get_* / safe_set_* read the states while the worker writes them"),
    ("settle-eval-forward", "engine/engine.py",
     "            self._owner.settle()   # overlap_step: an evaluation reads every parameter",
     "            pass   # overlap_step: an evaluation reads every parameter",
     "an eval forward reads before the step ends (the module waits cover it too: expected uncaught alone)"),
    ("settle-checkpoint", "engine/engine.py",
     "        where.call(\"save_checkpoint\", self.global_steps, self.micro_steps)\n        self._owner.settle()\n",
     "        where.call(\"save_checkpoint\", self.global_steps, self.micro_steps)\n",
     "save_checkpoint writes the states while the worker updates them"),
    ("settle-gathered-parameters", "zero/params/gathered.py",
     "        for owner in self.owners.values():   # overlap_step: the values the step is writing, whole first\n"
     "            owner.settle()\n",
     "",
     "GatheredParameters reads the parameters before the step ends"),
    ("settle-zero-grads", "zero/owners/sharded.py",
     "        if not self.store.placement.copies_states:\n"
     "            self.overlap.wait_all()   # (a failure is raised by the next settle, where every rank agrees)\n",
     "",
     "the gradients are zeroed while the worker reads them in place (no host copy)"),
    ("settle-next-step-backward", "engine/engine.py",
     "        self._owner.settle(agree=True)   # overlap_step: the last step done; a failure there raised on every rank\n",
     "",
     "the next backward does not wait for the step (nor raise its failure)"),
]


TESTS = ["tests/test_overlap_step.py", "tests/distributed/test_overlap_step_dp.py"]


def run_tests(copy, timeout):
    env = dict(os.environ, PYTHONPATH=str(copy) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                           *[str(copy / t) for t in TESTS]], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=timeout)
    tail = (proc.stdout.strip().splitlines() or [""])[-1]
    return proc.returncode == 0, tail, time.monotonic() - started


def make_copy(dest):
    shutil.copytree(ROOT / "dsfast", dest / "dsfast", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copytree(HERE, dest / "tests", ignore=shutil.ignore_patterns("__pycache__", "data", "gpu", "launcher"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")   # (pytest's settings)


def apply(copy, bug):
    name, rel, old, new, _ = bug
    path = copy / "dsfast" / rel
    text = path.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"{name}: the text to replace is not exactly once in dsfast/{rel} (the code moved: update "
                         "this script)")
    path.write_text(text.replace(old, new))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="removals to run (default: all)")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    chosen = [b for b in BUGS if not args.names or b[0] in args.names]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        clean = Path(tmp) / "clean"
        make_copy(clean)
        passed, tail, secs = run_tests(clean, args.timeout)
        print(f"clean copy: {'pass' if passed else 'FAIL'} ({tail}, {secs:.0f} s)")
        if not passed:
            return 1
        print("\n| wait removed | what it lets happen | tests | caught |\n|---|---|---|---|")
        for bug in chosen:
            copy = Path(tmp) / bug[0]
            make_copy(copy)
            apply(copy, bug)
            passed, tail, _ = run_tests(copy, args.timeout)
            ok &= not passed
            print(f"| {bug[0]} | {bug[4]} | {tail} | {'no' if passed else 'yes'} |", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
