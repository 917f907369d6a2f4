"""Command lines for each launcher. Pure functions of the plan: --dry_run prints exactly what would run.

local         this process runs the node launcher (dsfast.launcher.node) in-process; the command shown is the
              standalone equivalent.
ssh           one `ssh HOST 'cd CWD && exec python -u -m dsfast.launcher.node --node_rank=I ...'` per node; the
              node launcher stops its ranks when the ssh connection closes (stdin EOF).
pdsh          one `pdsh -w HOSTS ... --node_rank=%n`; dsfast watches pdsh's output for a node launcher's failure
              line, and stopping runs a pkill of this job's unique --job_id on every host.
openmpi/mpich one `mpirun` with hosts and slots; every rank runs dsfast.launcher.rank, which maps the MPI rank to
              RANK/LOCAL_RANK/... and starts the user script.
slurm         one `srun` with nodes and tasks per node; same per-rank shim.
The environment to export travels as base64 JSON (--env_b64), so no value is ever parsed by a remote shell;
everything else that crosses a shell is quoted with shlex.quote.
"""
import json
import os
import shlex
import sys
from typing import List, Mapping, Sequence

from .errors import LaunchError

LAUNCHERS = ("local", "ssh", "pdsh", "openmpi", "mpich", "slurm")
TOOL = {"ssh": "ssh", "pdsh": "pdsh", "openmpi": "mpirun", "mpich": "mpirun", "slurm": "srun"}


def world_info_json(hosts: Mapping[str, Sequence[int]]) -> str:
    return json.dumps({h: list(s) for h, s in hosts.items()}, separators=(",", ":"))


def shared_args(plan) -> List[str]:
    """Options both the node launcher and the per-rank shim understand."""
    a = [f"--world_info={world_info_json(plan.hosts)}", f"--master_addr={plan.master_addr}",
         f"--master_port={plan.master_port}"]
    if plan.env:
        from .node import encode_env
        a.append(f"--env_b64={encode_env(plan.env)}")
    for flag in ("no_local_rank", "no_python", "module", "bind_cores_to_rank"):
        if getattr(plan, flag):
            a.append(f"--{flag}")
    if plan.bind_core_list:
        a.append(f"--bind_core_list={plan.bind_core_list}")
    if plan.each_rank_log:
        a.append(f"--each_rank_log={os.path.abspath(plan.each_rank_log)}")
    return a


def node_command(plan, node_rank, watch_stdin=False, job_id=None) -> List[str]:
    cmd = [sys.executable, "-u", "-m", "dsfast.launcher.node"] + shared_args(plan) + [f"--node_rank={node_rank}"]
    if watch_stdin:
        cmd.append("--watch_stdin")
    if job_id:
        cmd.append(f"--job_id={job_id}")
    return cmd + ["--"] + plan.user_command


def rank_shim_command(plan) -> List[str]:
    return [sys.executable, "-u", "-m", "dsfast.launcher.rank"] + shared_args(plan) + ["--"] + plan.user_command


def remote_shell_line(cwd: str, argv: List[str]) -> str:
    return f"cd {shlex.quote(cwd)} && exec " + " ".join(shlex.quote(a) for a in argv)


def _hosts_slots(plan, sep=":") -> str:
    return ",".join(f"{h}{sep}{len(s)}" for h, s in plan.hosts.items())


def build_commands(plan) -> List[List[str]]:
    la = shlex.split(plan.launcher_args) if plan.launcher_args else []
    kind = plan.launcher
    if kind == "local":
        return [node_command(plan, plan.node_rank)]
    if kind == "ssh":
        port = ["-p", str(plan.ssh_port)] if plan.ssh_port else []
        return [["ssh", "-o", "BatchMode=yes"] + port + la +
                [host, remote_shell_line(plan.cwd, node_command(plan, i, watch_stdin=True))]
                for i, host in enumerate(plan.hosts)]
    if kind == "pdsh":
        line = remote_shell_line(plan.cwd, node_command(plan, "%n", job_id=plan.job_id))
        return [["pdsh", "-S", "-f", "1024", "-w", ",".join(plan.hosts)] + la + [line]]
    if kind == "openmpi":
        cmd = ["mpirun", "-n", str(plan.world_size), "--host", _hosts_slots(plan), "--map-by", "slot",
               "--bind-to", "none"]
        if os.geteuid() == 0:  # Open MPI refuses root without it; the user already chose to run as root
            cmd.append("--allow-run-as-root")
        if plan.ssh_port:
            cmd += ["--mca", "plm_rsh_args", f"-p {plan.ssh_port}"]
        return [cmd + la + rank_shim_command(plan)]
    if kind == "mpich":
        if plan.ssh_port:
            raise LaunchError("--ssh_port is not supported with --launcher mpich; pass ssh options through "
                              "--launcher_args (e.g. \"-launcher-exec 'ssh -p 2222'\")")
        return [["mpirun", "-n", str(plan.world_size), "-hosts", _hosts_slots(plan)] + la + rank_shim_command(plan)]
    if kind == "slurm":
        counts = {len(s) for s in plan.hosts.values()}
        if len(counts) != 1:
            raise LaunchError("--launcher slurm needs the same number of slots on every host (srun "
                              "--ntasks-per-node); got " + ", ".join(f"{h}: {len(s)}" for h, s in plan.hosts.items()))
        if plan.ssh_port:
            raise LaunchError("--ssh_port does not apply to --launcher slurm")
        return [["srun", f"--nodes={len(plan.hosts)}", f"--ntasks={plan.world_size}",
                 f"--ntasks-per-node={counts.pop()}", f"--nodelist={','.join(plan.hosts)}", "--distribution=block",
                 "--export=ALL"] + la + rank_shim_command(plan)]
    raise LaunchError(f"unknown launcher {kind!r}; choose one of {', '.join(LAUNCHERS)}")


def pdsh_stop_command(plan) -> List[str]:
    """pdsh cannot close a remote command's stdin, so stopping a job kills its node launchers by their unique
    --job_id (the bracketed dots keep the pattern from matching the pkill command line itself)."""
    pattern = f"dsfast[.]launcher[.]node .*--job_id={plan.job_id}"
    return ["pdsh", "-f", "1024", "-w", ",".join(plan.hosts), f"pkill -TERM -f -- {shlex.quote(pattern)}"]


def stop_pdsh_job(plan, env) -> None:
    import subprocess
    try:
        subprocess.run(pdsh_stop_command(plan), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pass
