"""Resolve the command line into a launch plan: hosts and slots, master, exported env and the commands to run."""
import os
import socket
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional

from .devices import visible_devices
from .envfile import exported_env, read_env_files
from .errors import LaunchError
from .hostfile import find_hostfile
from .runners import LAUNCHERS, build_commands
from .selection import select_resources
from .this_machine import is_this_machine

LOCAL_HOST = "localhost"


@dataclass
class Plan:
    hosts: "OrderedDict[str, List[int]]"
    master_addr: str
    master_port: int
    launcher: str
    env: Dict[str, str]
    user_command: List[str]
    cwd: str
    env_files: List[str] = field(default_factory=list)
    launcher_args: str = ""
    ssh_port: Optional[int] = None
    no_local_rank: bool = False
    no_python: bool = False
    module: bool = False
    bind_cores_to_rank: bool = False
    bind_core_list: Optional[str] = None
    each_rank_log: Optional[str] = None
    node_rank: int = 0
    job_id: str = ""
    commands: List[List[str]] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)     # for stderr, before anything starts

    @property
    def world_size(self) -> int:
        return sum(len(s) for s in self.hosts.values())

    def as_json(self) -> dict:
        return {"hosts": {h: list(s) for h, s in self.hosts.items()}, "world_size": self.world_size,
                "master_addr": self.master_addr, "master_port": self.master_port, "launcher": self.launcher,
                "env": dict(self.env), "commands": self.commands}


def resolve_hosts(args, environ: Mapping[str, str]) -> "OrderedDict[str, List[int]]":
    counts = find_hostfile(args.hostfile, explicit=args.hostfile_given)
    if counts is not None:
        source = f"hostfile {args.hostfile}"
    else:
        visible = visible_devices(environ)
        if visible:
            counts = OrderedDict([(LOCAL_HOST, len(visible))])
            source = f"this machine ({len(visible)} visible GPU(s), no hostfile at {args.hostfile})"
        else:  # CPU machine: --num_gpus/--num_procs is the process count
            n = args.num_gpus if args.num_gpus != -1 else 1
            if n < 1:
                raise LaunchError(f"--num_gpus/--num_procs must be a positive integer, got {n}")
            counts = OrderedDict([(LOCAL_HOST, n)])
            source = f"this machine (no GPU, {n} CPU process(es), no hostfile at {args.hostfile})"
    return select_resources(counts, include=args.include, exclude=args.exclude, num_nodes=args.num_nodes,
                            num_gpus=args.num_gpus, source=source)


def build_plan(args, environ: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None) -> Plan:
    environ = os.environ if environ is None else environ
    cwd = os.getcwd() if cwd is None else cwd
    if not 1 <= args.master_port <= 65535:
        raise LaunchError(f"--master_port must be in 1..65535, got {args.master_port}")
    if args.ssh_port is not None and not 1 <= args.ssh_port <= 65535:
        raise LaunchError(f"--ssh_port must be in 1..65535, got {args.ssh_port}")
    hosts = resolve_hosts(args, environ)
    launcher = args.launcher
    warnings = []
    if launcher is None:
        launcher = "ssh" if (len(hosts) > 1 or args.force_multi) else "local"
        if launcher == "local" and not is_this_machine(next(iter(hosts))):
            warnings.append(_runs_here_warning(next(iter(hosts))))
    if launcher not in LAUNCHERS:
        raise LaunchError(f"--launcher {launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    node_rank = 0
    if args.node_rank is not None:
        if launcher != "local":
            raise LaunchError("--node_rank runs one node's share by hand; it needs --launcher local (or --no_ssh)")
        if not 0 <= args.node_rank < len(hosts):
            raise LaunchError(f"--node_rank {args.node_rank} is outside 0..{len(hosts) - 1} "
                              f"(hosts: {', '.join(hosts)})")
        node_rank = args.node_rank
    elif launcher == "local" and len(hosts) > 1:
        raise LaunchError(f"--launcher local runs one node but the plan has {len(hosts)} hosts "
                          f"({', '.join(hosts)}); use --launcher ssh|pdsh|openmpi|mpich|slurm, narrow it with "
                          "--include/--num_nodes 1, or run each node's share with --no_ssh --node_rank=N")
    if args.master_addr:
        master = args.master_addr
    elif launcher == "local" and args.node_rank is None:
        master = "127.0.0.1"
    else:  # every node must be able to reach the first host under the name the hostfile uses
        master = next(iter(hosts))
        if master == LOCAL_HOST and len(hosts) > 1:
            raise LaunchError("the first host is 'localhost', which other nodes cannot reach; pass --master_addr")
    file_vars, files = read_env_files(cwd=cwd, environ=environ)
    if not args.user_script:
        raise LaunchError("no user script given; usage: dsfast [options] SCRIPT [args] or dsfast -m MODULE [args]")
    user = [args.user_script] + args.user_args
    plan = Plan(hosts=hosts, master_addr=master, master_port=args.master_port, launcher=launcher,
                env=exported_env(environ, file_vars), user_command=user, cwd=cwd, env_files=files,
                launcher_args=args.launcher_args or "", ssh_port=args.ssh_port, no_local_rank=args.no_local_rank,
                no_python=args.no_python, module=bool(args.module), bind_cores_to_rank=args.bind_cores_to_rank,
                bind_core_list=args.bind_core_list, each_rank_log=args.each_rank_log, node_rank=node_rank,
                job_id=uuid.uuid4().hex[:12], warnings=warnings)
    plan.commands = build_commands(plan)
    return plan


def _runs_here_warning(host: str) -> str:
    # DeepSpeed starts a one-host job locally whatever the host's name; so do we, but not silently.
    return (f"the selection leaves one host, {host!r}, which is not this machine ({socket.gethostname()}); as "
            f"DeepSpeed does, a one-host job runs here, on this machine, with {host}'s slots. To start it on {host} "
            "instead, pass --force_multi (it then goes through ssh, or the --launcher you name)")
