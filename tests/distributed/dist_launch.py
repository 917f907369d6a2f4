"""Start N local ranks of a script the way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*), with a timeout.

Used by the multi-process tests: every rank is a fresh `python` process on gloo, one thread each. A rank that
fails or a job that exceeds `timeout` kills all ranks and fails the test with every rank's output.
"""
import os
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script, args=(), nprocs=2, timeout=90, extra_env=None, env_style="torchrun", check=True):
    """Run `script` on `nprocs` ranks; returns [(returncode, output)] per rank."""
    port = free_port()
    procs = []
    for rank in range(nprocs):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMPI_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""), DSFAST_TIMEOUT_S=str(timeout))
        if env_style == "torchrun":
            env.update(RANK=str(rank), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank))
        elif env_style == "openmpi":
            env.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE=str(nprocs),
                       OMPI_COMM_WORLD_LOCAL_RANK=str(rank), OMPI_COMM_WORLD_LOCAL_SIZE=str(nprocs))
            del env["MASTER_ADDR"]
        elif env_style == "slurm":
            env.update(SLURM_PROCID=str(rank), SLURM_NTASKS=str(nprocs), SLURM_LOCALID=str(rank),
                       SLURM_JOB_NODELIST="localhost")
            del env["MASTER_ADDR"]
        else:
            raise ValueError(env_style)
        env.update(extra_env or {})
        procs.append(subprocess.Popen([sys.executable, script, *map(str, args)], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    outs = [None] * nprocs
    try:
        for i, p in enumerate(procs):
            outs[i] = p.communicate(timeout=max(deadline - time.monotonic(), 1))[0]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        text = "\n".join(f"--- rank {i} ---\n{p.communicate()[0]}" for i, p in enumerate(procs))
        raise AssertionError(f"{script} on {nprocs} ranks exceeded {timeout}s:\n{text[-6000:]}") from None
    results = [(p.returncode, o) for p, o in zip(procs, outs)]
    if check and any(rc != 0 for rc, _ in results):
        text = "\n".join(f"--- rank {i} (exit {rc}) ---\n{o}" for i, (rc, o) in enumerate(results))
        raise AssertionError(f"{script} failed on {nprocs} ranks:\n{text[-8000:]}")
    return results


def launch_runs(tmp_path_factory, script, runs, nprocs, timeout, extra_env=None):
    """All `runs` ({key: run text}) in one launch of `script` on `nprocs` ranks (the worker saves {text: records}
    to the path given first); returns {key: records}. Process start-up dominates on a small CPU, hence one launch."""
    import torch
    out = tmp_path_factory.mktemp(f"{os.path.splitext(os.path.basename(script))[0]}_{nprocs}") / "out.pt"
    launch(script, [out, *runs.values()], nprocs=nprocs, timeout=timeout, extra_env=extra_env)
    results = torch.load(out)
    return {key: results[text] for key, text in runs.items()}
