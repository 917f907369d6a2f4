"""Discover this process's place in the job from the environment.

Pure functions of an environment mapping (tested without processes). Sources, in order of precedence:
  1. RANK / WORLD_SIZE / LOCAL_RANK (dsfast launcher, torchrun, DeepSpeed's launcher)
  2. Open MPI: OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK (mpirun)
  3. Slurm: SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (srun)
  4. none of them: a world of one process.
The master address comes from MASTER_ADDR when set; otherwise MPI uses localhost on a single node and Slurm
uses SLURM_LAUNCH_NODE_IPADDR or the first host of SLURM_JOB_NODELIST.
"""
import re
from dataclasses import dataclass
from typing import Mapping, Optional

DEFAULT_MASTER_PORT = 29500


class DistributedEnvError(RuntimeError):
    """The environment describes a distributed job inconsistently."""


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: Optional[str]
    master_port: int
    source: str  # "env", "openmpi", "slurm" or "single"

    def as_environ(self):
        """The torch-style variables that describe this process (exported so user code can read them)."""
        out = {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank)}
        if self.master_addr is not None:
            out["MASTER_ADDR"] = self.master_addr
            out["MASTER_PORT"] = str(self.master_port)
        return out


def _int(env, key):
    value = env[key]
    try:
        return int(value)
    except ValueError:
        raise DistributedEnvError(f"environment variable {key}={value!r} is not an integer") from None


def _port(env, default):
    if "MASTER_PORT" in env:
        return _int(env, "MASTER_PORT")
    return default


def first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list: 'node[03-05,9],gpu1' -> 'node03'."""
    nodelist = nodelist.strip()
    m = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist)
    if not m or not m.group(1):
        raise DistributedEnvError(f"cannot read a host name from SLURM_JOB_NODELIST={nodelist!r}")
    prefix, ranges = m.group(1), m.group(3)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def discover(env: Mapping[str, str], default_port: int = DEFAULT_MASTER_PORT) -> DistEnv:
    """Read rank, world size, local rank and master from `env` (os.environ or a test dict)."""
    if "RANK" in env or "WORLD_SIZE" in env:
        missing = [k for k in ("RANK", "WORLD_SIZE") if k not in env]
        if missing:
            raise DistributedEnvError(
                f"{' and '.join(missing)} not set while {'RANK' if 'RANK' in env else 'WORLD_SIZE'} is; "
                "a launcher must set RANK, WORLD_SIZE (and MASTER_ADDR/MASTER_PORT) together")
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
        addr = env.get("MASTER_ADDR")
        if addr is None and world > 1:
            raise DistributedEnvError(
                f"RANK={rank} WORLD_SIZE={world} are set but MASTER_ADDR is not; set MASTER_ADDR (and MASTER_PORT) "
                "to the address of rank 0")
        out = DistEnv(rank, world, local, addr or "127.0.0.1", _port(env, default_port), "env")
    elif "OMPI_COMM_WORLD_RANK" in env:
        rank, world = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") if "OMPI_COMM_WORLD_LOCAL_RANK" in env else 0
        addr = env.get("MASTER_ADDR")
        if addr is None:
            local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE") if "OMPI_COMM_WORLD_LOCAL_SIZE" in env else None
            if local_size == world:
                addr = "127.0.0.1"  # every rank on this node
            else:
                raise DistributedEnvError(
                    f"Open MPI job of {world} ranks spans several nodes but MASTER_ADDR is not set; pass it with "
                    "`mpirun -x MASTER_ADDR=<rank-0 host> -x MASTER_PORT=<port> ...` (dsfast's launcher does this)")
        out = DistEnv(rank, world, local, addr, _port(env, default_port), "openmpi")
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        addr = env.get("MASTER_ADDR") or env.get("SLURM_LAUNCH_NODE_IPADDR")
        if addr is None:
            nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            if nodelist is None:
                if world > 1:
                    raise DistributedEnvError(
                        "Slurm job without MASTER_ADDR, SLURM_LAUNCH_NODE_IPADDR or SLURM_JOB_NODELIST; "
                        "set MASTER_ADDR to the host of rank 0")
                addr = "127.0.0.1"
            else:
                addr = first_slurm_host(nodelist)
        out = DistEnv(rank, world, local, addr, _port(env, default_port), "slurm")
    else:
        return DistEnv(0, 1, 0, None, _port(env, default_port), "single")
    if not 0 <= out.rank < out.world_size:
        raise DistributedEnvError(f"rank {out.rank} is outside world size {out.world_size} (from {out.source})")
    return out
