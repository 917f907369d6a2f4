"""Launcher overhead: how long `launch 2 ranks of a script` takes with dsfast, torchrun and DeepSpeed, and how a
failing rank is reported (exit code, time to exit).

Ceiling ("bare"): two `python noop.py` started in parallel with Popen and waited for: no launcher can be faster.
Peers: torchrun (python -m torch.distributed.run) and DeepSpeed's launcher (from /work/venv-ds when present, run
with DS_ACCELERATOR=cpu). Each number is the median wall time of --repeats runs.

    python benchmarks/launcher_overhead.py [--repeats 3]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

NOOP = "pass\n"
FAIL = ("import os, sys, time\n"
        "if os.environ.get('RANK') == '1': sys.exit(3)\n"
        "time.sleep(60)\n")
DS_PY = "/work/venv-ds/bin/python"


def timed(cmd, cwd, env, timeout=120):
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=timeout)
    return time.perf_counter() - t, p.returncode


def bare(cwd, script, env):
    t = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-u", script], cwd=cwd, env=dict(env, RANK=str(r)),
                              stdout=subprocess.DEVNULL) for r in range(2)]
    codes = [p.wait() for p in procs]
    return time.perf_counter() - t, max(codes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    port = [29800]

    def nextport():
        port[0] += 1
        return str(port[0])

    tools = {
        "dsfast": lambda s: [sys.executable, "-m", "dsfast.launcher", "--num_procs", "2", "--master_port",
                             nextport(), s],
        "torchrun": lambda s: [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                               "--master_port", nextport(), s],
    }
    if os.path.exists(DS_PY):
        tools["deepspeed"] = lambda s: [DS_PY, "-m", "deepspeed.launcher.runner", "--num_gpus", "2",
                                        "--master_port", nextport(), s]
    with tempfile.TemporaryDirectory() as d:
        for name, text in (("noop.py", NOOP), ("fail.py", FAIL)):
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        rows = []
        for scenario in ("noop.py", "fail.py"):
            runs = [bare(d, "noop.py", env) for _ in range(args.repeats)] if scenario == "noop.py" else None
            if runs:
                base = statistics.median(t for t, _ in runs)
                rows.append((scenario, "bare (ceiling)", base, 1.0, runs[0][1]))
            for tool, make in tools.items():
                tenv = dict(env, DS_ACCELERATOR="cpu") if tool == "deepspeed" else env
                res = [timed(make(scenario), d, tenv) for _ in range(args.repeats)]
                med = statistics.median(t for t, _ in res)
                rows.append((scenario, tool, med, med / base, sorted({c for _, c in res})))
    print(f"{'scenario':10} {'launcher':16} {'median s':>9} {'x bare':>7}  exit codes")
    for scenario, tool, med, ratio, codes in rows:
        print(f"{scenario:10} {tool:16} {med:9.2f} {ratio:7.1f}  {codes}")


if __name__ == "__main__":
    main()
