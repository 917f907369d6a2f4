"""The per-node launcher: starts this node's ranks and supervises them.

    python -u -m dsfast.launcher.node --world_info='{"h0": [0, 1], "h1": [0, 1]}' --node_rank=1 \
        --master_addr=h0 --master_port=29500 [options] -- train.py [user args]

`dsfast` runs this in its own process for a one-node job, and once per node through ssh/pdsh for multi-node jobs.
Ranks are numbered in world_info order: node 0's slots first. The shared option parser and the per-rank
environment are also used by dsfast.launcher.rank (one rank started by mpirun/srun).
"""
import argparse
import base64
import json
import os
import sys
from collections import OrderedDict
from typing import Dict, List, Mapping, Optional, Tuple

from . import devices
from .devices import devices_for_slots, visible_devices
from .errors import USAGE_EXIT_CODE, LaunchError
from .supervise import Child, Supervisor


def encode_env(env: Mapping[str, str]) -> str:
    """Environment for remote ranks as base64 JSON: values never pass through a shell as text."""
    return base64.urlsafe_b64encode(json.dumps(dict(env), separators=(",", ":")).encode()).decode()


def decode_env(text: str) -> Dict[str, str]:
    try:
        env = json.loads(base64.urlsafe_b64decode(text.encode()).decode())
    except ValueError as e:
        raise LaunchError(f"--env_b64 is not base64 JSON: {e}") from None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise LaunchError("--env_b64 must encode a JSON object of strings")
    return env


def parse_world_info(text: str) -> "OrderedDict[str, List[int]]":
    try:
        info = json.loads(text, object_pairs_hook=OrderedDict)
    except ValueError as e:
        raise LaunchError(f"--world_info is not JSON: {e}") from None
    if not isinstance(info, dict) or not info or not all(
            isinstance(v, list) and v and all(isinstance(s, int) and s >= 0 for s in v) for v in info.values()):
        raise LaunchError(f"--world_info must be a JSON object {{host: [slot, ...]}} with non-empty slot lists, "
                          f"got {text!r}")
    return info


def common_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    p.add_argument("--world_info", required=True, help='JSON {host: [slots]} in rank order')
    p.add_argument("--master_addr", required=True)
    p.add_argument("--master_port", type=int, required=True)
    p.add_argument("--env_b64", default=None, help="base64 JSON of variables to set for every rank")
    p.add_argument("--no_local_rank", action="store_true")
    p.add_argument("--no_python", action="store_true")
    p.add_argument("--module", action="store_true")
    p.add_argument("--bind_cores_to_rank", action="store_true")
    p.add_argument("--bind_core_list", default=None)
    p.add_argument("--each_rank_log", default=None, metavar="DIR")
    return p


def split_user_command(argv: List[str]) -> Tuple[List[str], List[str]]:
    if "--" not in argv:
        raise LaunchError("expected '-- SCRIPT [ARGS]' after the launcher options")
    i = argv.index("--")
    if i == len(argv) - 1:
        raise LaunchError("no user script after '--'")
    return argv[:i], argv[i + 1:]


def parse_core_list(text: str) -> List[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cores = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise LaunchError(f"--bind_core_list {text!r}: {part!r} is not a core number or range like 4-7")
        cores.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return sorted(set(cores))


def core_sets(nlocal: int, core_list: Optional[str]) -> List[List[int]]:
    cores = parse_core_list(core_list) if core_list else sorted(os.sched_getaffinity(0))
    per = len(cores) // nlocal
    if per == 0:
        raise LaunchError(f"--bind_cores_to_rank: {nlocal} local ranks but only {len(cores)} core(s) to share "
                          f"({','.join(map(str, cores))})")
    return [cores[i * per:(i + 1) * per] for i in range(nlocal)]


def rank_child(opts, user: List[str], info, node_rank: int, local_rank: int, base_env: Mapping[str, str],
               cpus=None) -> Child:
    """The process for one rank: argv, environment, output prefix and log file."""
    hosts = list(info)
    slots = info[hosts[node_rank]]
    world = sum(len(s) for s in info.values())
    rank = sum(len(info[h]) for h in hosts[:node_rank]) + local_rank
    env = dict(base_env)
    if opts.env_b64:
        env.update(decode_env(opts.env_b64))
    visible = visible_devices(env, devices.physical_gpu_count())
    if visible:  # GPU node: all of this node's slots visible, LOCAL_RANK i uses cuda:i
        try:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices_for_slots(slots, visible))
        except IndexError as e:
            raise LaunchError(f"node {node_rank} ({hosts[node_rank]}): {e}") from None
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(len(slots)), "LOCAL_SIZE": str(len(slots)),
        "GROUP_RANK": str(node_rank), "NODE_RANK": str(node_rank),
        "CROSS_RANK": str(node_rank), "CROSS_SIZE": str(len(hosts)),
        "MASTER_ADDR": opts.master_addr, "MASTER_PORT": str(opts.master_port),
        "PYTHONUNBUFFERED": "1",
    })
    if cpus:
        env["OMP_NUM_THREADS"] = str(len(cpus))
    elif "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // len(slots)))
    script, args = user[0], user[1:]
    extra = [] if opts.no_local_rank else [f"--local_rank={local_rank}"]
    if opts.no_python:
        argv = [script] + extra + args
    elif opts.module:
        argv = [sys.executable, "-u", "-m", script] + extra + args
    else:
        argv = [sys.executable, "-u", script] + extra + args
    log = os.path.join(opts.each_rank_log, f"rank{rank}.log") if opts.each_rank_log else None
    return Child(argv=argv, label=f"rank {rank}", env=env, prefix=f"[rank{rank}]: ", log_path=log, cpus=cpus,
                 stdin_devnull=True)


def check_user_program(opts, user: List[str]):
    if opts.module or opts.no_python or os.path.exists(user[0]):
        return
    raise LaunchError(f"user script {user[0]!r} not found in {os.getcwd()}; "
                      "to run a module use -m/--module, to run an executable use --no_python")


def build_children(argv: List[str], environ: Mapping[str, str], check_script: bool = True):
    p = common_parser("python -m dsfast.launcher.node")
    p.add_argument("--node_rank", type=int, required=True)
    p.add_argument("--watch_stdin", action="store_true",
                   help="stop every rank when stdin closes (the ssh connection that started us ended)")
    p.add_argument("--job_id", default=None, help="marker in the command line so pdsh can stop this job")
    own, user = split_user_command(argv)
    opts = p.parse_args(own)
    info = parse_world_info(opts.world_info)
    if not 0 <= opts.node_rank < len(info):
        raise LaunchError(f"--node_rank {opts.node_rank} is outside 0..{len(info) - 1} ({', '.join(info)})")
    if check_script:
        check_user_program(opts, user)
    nlocal = len(info[list(info)[opts.node_rank]])
    cpus = core_sets(nlocal, opts.bind_core_list) if (opts.bind_cores_to_rank or opts.bind_core_list) else None
    if opts.each_rank_log:
        os.makedirs(opts.each_rank_log, exist_ok=True)
    children = [rank_child(opts, user, info, opts.node_rank, i, environ, cpus[i] if cpus else None)
                for i in range(nlocal)]
    return opts, children


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        opts, children = build_children(argv, os.environ)
    except LaunchError as e:
        print(f"dsfast: error: {e}", file=sys.stderr)
        return USAGE_EXIT_CODE
    return Supervisor(children, watch_stdin=opts.watch_stdin).run()


if __name__ == "__main__":
    sys.exit(main())
