"""DeepSpeed's own unit tests as a yardstick: run the CPU part of `tests/unit` against real DeepSpeed and against
dsfast (as `deepspeed`), and print the outcomes side by side.

    python benchmarks/deepspeed_unit_tests.py TESTS_DIR --deepspeed-python /work/venv-ds/bin/python \
        --dsfast-python /work/venv-x/bin/python --out /tmp/yardstick [--only unit/runtime/test_lr_schedulers.py]

TESTS_DIR is the `tests` folder of a DeepSpeed source tree (unit/, conftest.py, pytest.ini), e.g.
`git -C <mirror> archive <ref> tests/unit tests/conftest.py tests/pytest.ini | tar -x -C DIR` then DIR/tests.
--deepspeed-python: a Python with DeepSpeed 0.19.8 and pytest; --dsfast-python: one with dsfast and pytest and no
DeepSpeed (the script writes a `dsfast alias install --target` folder and puts it on PYTHONPATH for that side).
Each test file runs in its own pytest process (a hang or crash loses one file, not the run), with DS_ACCELERATOR=cpu
and LOCAL_SIZE=--ranks (DeepSpeed's harness counts that many CPU "devices"; tests needing more ranks skip) on the
gloo backend. Results are kept under --out per side; --reuse skips files already run there (so DeepSpeed's column
is measured once), --report-only just reads them back.

Counted: the tests that pass on DeepSpeed; of those, the ones listed out of scope in
deepspeed_unit_tests_out_of_scope.txt (they assert DeepSpeed-internal structure; the file gives the reason for each);
of the rest, how many pass on dsfast, and how many fail on dsfast only because a DeepSpeed import path is missing.
--stand-ins puts placeholder modules where dsfast lacks a path that the tests' shared helpers import at the top
(deepspeed.pipe in simple_model.py, deepspeed.git_version_info in util.py), so that one missing name does not hide a
whole folder; a test that then uses a placeholder fails, and is counted under "missing import path".
"""
import argparse
import collections
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_OF_SCOPE_FILE = os.path.join(HERE, "deepspeed_unit_tests_out_of_scope.txt")
STAND_INS_DIR = os.path.join(HERE, "deepspeed_unit_tests_stand_ins")
DEFAULT_SELECTION = ["unit/checkpoint", "unit/launcher", "unit/ops/adam", "unit/runtime/*.py", "unit/runtime/zero",
                     "unit/utils"]
SIDES = ("deepspeed", "dsfast")
# how a dsfast failure that is only a missing DeepSpeed name reads
MISSING_PATH_MARKS = ("No module named 'deepspeed", "cannot import name", "yardstick stand-in",
                      "is dsfast here, and dsfast has no", "module 'dsfast", "module 'deepspeed")


def test_files(tests_dir, selection):
    """The test files the selection names, in its order (a folder or glob: sorted), each once."""
    import glob
    files = []
    for pattern in selection:
        path = os.path.join(tests_dir, pattern)
        found = []
        if os.path.isdir(path):
            for root, _, names in os.walk(path):
                found += [os.path.join(root, n) for n in names if n.startswith("test_") and n.endswith(".py")]
        else:
            found = [p for p in glob.glob(path) if os.path.basename(p).startswith("test_")]
        files += sorted(os.path.relpath(f, tests_dir) for f in found)
    return list(dict.fromkeys(files))


def alias_dir(dsfast_python, out):
    """A folder where `deepspeed` is dsfast (dsfast's own `alias install --target`), and a bin folder whose
    `deepspeed` command is the dsfast launcher (what `dsfast alias install` writes into a venv)."""
    target = os.path.join(out, "dsfast-alias")
    # cwd: not the caller's, which may be the --out folder, whose deepspeed/ (the results) `-m` would put on the path
    subprocess.run([dsfast_python, "-m", "dsfast.launcher", "alias", "install", "--target", target], check=True,
                   stdout=subprocess.DEVNULL, cwd=HERE)
    bin_dir = os.path.join(out, "dsfast-bin")
    os.makedirs(bin_dir, exist_ok=True)
    script = os.path.join(bin_dir, "deepspeed")
    with open(script, "w") as f:
        f.write(f'#!/bin/sh\nexec "{dsfast_python}" -m dsfast.launcher "$@"\n')
    os.chmod(script, 0o755)
    return target, bin_dir


def run_file(side, python, tests_dir, rel, out, env, timeout, keyword=None):
    name = rel.replace("/", "__")[:-3]
    xml = os.path.join(out, side, name + ".xml")
    log = os.path.join(out, side, name + ".log")
    os.makedirs(os.path.dirname(xml), exist_ok=True)
    cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "console_output_style=classic",
           f"--junitxml={xml}", rel] + (["-k", keyword] if keyword else [])
    start = time.time()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=tests_dir, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                start_new_session=True).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
            with open(xml + ".timeout", "w") as t:
                t.write(f"{timeout}\n")
    return rc, time.time() - start


def side_env(side, args, out):
    env = dict(os.environ, DS_ACCELERATOR="cpu", LOCAL_SIZE=str(args.ranks), OMP_NUM_THREADS="1",
               DS_UNITTEST_TIMEOUT=str(args.test_timeout), DS_DISABLE_REUSE_DIST_ENV="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    python = args.deepspeed_python if side == "deepspeed" else args.dsfast_python
    bin_dir = os.path.dirname(os.path.abspath(python))      # the tests run `deepspeed` (the launcher) by name
    if side == "dsfast":
        target, alias_bin = alias_dir(args.dsfast_python, out)
        env["PYTHONPATH"] = os.pathsep.join([STAND_INS_DIR, target] if args.stand_ins else [target])
        bin_dir = alias_bin + os.pathsep + bin_dir
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


def read_results(out, side, rel):
    """{test id: (outcome, message)} for one file; a file that did not import or timed out is one entry."""
    name = rel.replace("/", "__")[:-3]
    xml = os.path.join(out, side, name + ".xml")
    if os.path.exists(xml + ".timeout"):
        return {rel: ("timeout", "the file's run timed out")}
    if not os.path.exists(xml):
        return None
    module = rel[:-3].replace("/", ".")
    results = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        cls, test = case.get("classname", ""), case.get("name", "")
        if not cls and not test:      # what pytest.exit ("Test hanged") leaves: the file's run did not finish
            results[rel] = ("hanged", "the file's run stopped: a test hanged past DS_UNITTEST_TIMEOUT")
            continue
        rest = cls[len(module):].lstrip(".") if cls.startswith(module) else cls
        tid = f"{rel}::{rest}::{test}" if rest else f"{rel}::{test}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or "") + "\n" + (child.text or "")
                break
        if not cls and test == module:           # a collection error: the whole file
            tid, outcome = rel, "import-error"
        results[tid] = (outcome, message.strip())
    return results


def out_of_scope():
    """{test id or prefix: reason} from the list file."""
    entries = {}
    if os.path.exists(OUT_OF_SCOPE_FILE):
        with open(OUT_OF_SCOPE_FILE) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    tid, _, reason = line.partition(" ")
                    entries[tid] = reason.strip()
    return entries


def scope_reason(tid, entries):
    for prefix, reason in entries.items():
        if tid == prefix or tid.startswith(prefix + "::") or tid.startswith(prefix + "["):
            return reason
    return None


def missing_path(message):
    return any(mark in message for mark in MISSING_PATH_MARKS)


def short(message):
    for line in message.splitlines():
        if line.startswith("E "):
            return line[1:].strip()[:110]
    return (message.splitlines() or [""])[0][:110]


def report(files, out, stream):
    entries = out_of_scope()
    rows, counts = [], collections.Counter()
    failures = collections.Counter()
    for rel in files:
        if rel in entries and read_results(out, "deepspeed", rel) is None:
            counts["files_not_run"] += 1
            rows.append((rel, "not run", "not run", "out of scope: " + entries[rel]))
            continue
        ds = read_results(out, "deepspeed", rel) or {}
        fast = read_results(out, "dsfast", rel)
        for tid, (outcome, _) in ds.items():
            if outcome != "passed":
                continue
            counts["deepspeed_passed"] += 1
            reason = scope_reason(tid, entries)
            if fast is None and not reason:     # not run on dsfast (yet): not counted either way
                counts["dsfast_not_run"] += 1
                rows.append((tid, "passed", "not run", ""))
                continue
            if fast is None:
                got, message = "not run", ""
            elif tid in fast:
                got, message = fast[tid]
            elif rel in fast:                       # the file did not import or timed out on dsfast
                got, message = fast[rel]
            else:
                got, message = "missing", "not collected on dsfast"
            if reason:
                counts["out_of_scope"] += 1
                counts["out_of_scope_passed"] += got == "passed"
                note = "out of scope: " + reason
            elif got == "passed":
                counts["dsfast_passed"] += 1
                note = ""
            elif missing_path(message):
                counts["missing_path"] += 1
                note = "missing import path: " + short(message)
                failures[note] += 1
            else:
                note = short(message)
                failures[note] += 1
            rows.append((tid, "passed", got, note))
    width = max([len(r[0]) for r in rows] + [10])
    for tid, a, b, note in rows:
        print(f"{tid:<{width}}  {a:<8} {b:<12} {note}", file=stream)
    in_scope = counts["deepspeed_passed"] - counts["out_of_scope"] - counts["dsfast_not_run"]
    print(f"\ntest files: {len(files)}, of which out of scope whole and not run: {counts['files_not_run']}"
          f"\npassed on DeepSpeed but not run on dsfast (not counted below): {counts['dsfast_not_run']}"
          f"\npassed on DeepSpeed: {counts['deepspeed_passed']}   out of scope: {counts['out_of_scope']} "
          f"(of which pass on dsfast anyway: {counts['out_of_scope_passed']})\n"
          f"in scope: {in_scope}   passed on dsfast: {counts['dsfast_passed']}   "
          f"failed only for a missing import path: {counts['missing_path']}   "
          f"other failures: {in_scope - counts['dsfast_passed'] - counts['missing_path']}", file=stream)
    print("\nmost common dsfast failures:", file=stream)
    for note, n in failures.most_common(25):
        print(f"  {n:4d}  {note}", file=stream)
    return counts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tests_dir", help="DeepSpeed's tests/ folder (unit/, conftest.py, pytest.ini)")
    p.add_argument("--deepspeed-python", help="a Python with DeepSpeed 0.19.8 and pytest")
    p.add_argument("--dsfast-python", help="a Python with dsfast and pytest (and no DeepSpeed)")
    p.add_argument("--out", required=True, help="folder for per-file results and logs")
    p.add_argument("--only", nargs="*", help=f"files or folders under tests_dir (default: {DEFAULT_SELECTION})")
    p.add_argument("--side", choices=SIDES, action="append", help="run only this side (default: both given)")
    p.add_argument("--ranks", type=int, default=2, help="CPU ranks DeepSpeed's harness may use (default 2)")
    p.add_argument("--file-timeout", type=int, default=1200, help="seconds for one test file")
    p.add_argument("--test-timeout", type=int, default=300, help="seconds for one distributed test")
    p.add_argument("--stand-ins", action="store_true", help="placeholders for import paths dsfast lacks")
    p.add_argument("--keyword", help="pytest -k for the files run (e.g. 'not dtype1': leave out fp16 cases, "
                   "which fail on DeepSpeed's CPU accelerator and so are not counted)")
    p.add_argument("--reuse", action="store_true", help="skip files that already have results under --out")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--run-out-of-scope", action="store_true", help="also run the files listed out of scope whole")
    args = p.parse_args(argv)
    tests_dir = os.path.abspath(args.tests_dir)
    if not os.path.isdir(os.path.join(tests_dir, "unit")):
        p.error(f"{tests_dir} has no unit/ folder: give the `tests` folder of a DeepSpeed source tree")
    out = os.path.abspath(args.out)
    files = test_files(tests_dir, args.only or DEFAULT_SELECTION)
    if not args.report_only:
        pythons = {"deepspeed": args.deepspeed_python, "dsfast": args.dsfast_python}
        sides = [s for s in (args.side or SIDES) if pythons[s]]
        if not sides:
            p.error("give --deepspeed-python and/or --dsfast-python (or --report-only)")
        skipped = set() if args.run_out_of_scope else set(out_of_scope()) & set(files)
        for side in sides:
            env = side_env(side, args, out)
            for rel in files:
                if rel in skipped or (args.reuse and read_results(out, side, rel) is not None):
                    continue
                rc, secs = run_file(side, pythons[side], tests_dir, rel, out, env, args.file_timeout, args.keyword)
                print(f"[{side}] {rel}: rc={rc} {secs:.0f}s", file=sys.stderr, flush=True)
    with open(os.path.join(out, "report.txt"), "w") as f:
        report(files, out, f)
    with open(os.path.join(out, "report.txt")) as f:
        sys.stdout.write(f.read())


if __name__ == "__main__":
    main()
