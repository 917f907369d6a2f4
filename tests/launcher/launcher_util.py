"""Shared helpers for the launcher tests (imported by name: pytest puts this folder on sys.path)."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from dsfast.launcher import cli

# A tiny worker: plain torch.distributed over gloo (independent of dsfast.engine), one all_reduce, one line out.
ALLREDUCE_WORKER = r'''
import os, sys, json
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
        "DS_TEST_MSG", "DS_TEST_Q"]
print("RESULT " + json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(),
                              "argv": sys.argv[1:], "pid": os.getpid(),
                              "env": {k: os.environ.get(k) for k in keys}}), flush=True)
dist.destroy_process_group()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def results(stdout: str):
    """The RESULT lines of a run, {rank: record}, each checked to carry its own rank prefix."""
    import json
    out = {}
    for line in stdout.splitlines():
        if "RESULT " in line:
            prefix, _, payload = line.partition("RESULT ")
            rec = json.loads(payload)
            assert prefix.endswith(f"[rank{rec['rank']}]: "), line
            out[rec["rank"]] = rec
    return out


def run(cmd, cwd, timeout=60, env=None, **kw):
    """Run a launcher command; on timeout kill its whole session so no rank is left behind."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"{cmd} did not finish in {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    return p.returncode, out, err


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def dry(argv, capsys):
    """cli.main in-process: (exit code, parsed JSON or None, stderr)."""
    import json
    rc = cli.main(["--dry_run"] + argv)
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


PY = sys.executable

# A worker that needs no torch: prints its pid (and a grandchild's) and, on the chosen rank, exits with a code.
SLEEP_WORKER = r'''
import os, subprocess, sys, time
rank = int(os.environ["RANK"])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(f"PID {os.getpid()} {child.pid}", flush=True)
fail_rank, code = (int(x) for x in os.environ.get("FAIL", "-1:0").split(":"))
if rank == fail_rank:
    time.sleep(float(os.environ.get("FAIL_AFTER", "0.5")))
    sys.exit(code)
time.sleep(120)
'''


def pids_in(text: str):
    return [int(p) for line in text.splitlines() if "PID " in line for p in line.split("PID ", 1)[1].split()]


def start(cmd, cwd, env=None):
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def read_pids(proc, n_ranks):
    """Read the launcher's stdout until n_ranks PID lines arrived (the per-test alarm bounds the wait)."""
    lines = []
    while sum(1 for line in lines if "PID " in line) < n_ranks:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"launcher ended early: {''.join(lines)}{proc.stderr.read()}")
        lines.append(line)
    return pids_in("".join(lines))


def cleanup(proc, pids=()):
    """Last-resort cleanup so a failing test never leaves processes behind."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in pids:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def cpu_env(**extra):
    """Environment for real runs: CPU ranks even on a GPU machine."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", **extra}
