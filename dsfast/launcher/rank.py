"""One rank started by mpirun (Open MPI, MPICH) or srun: map the MPI/Slurm rank to our environment, run the script.

    mpirun ... python -u -m dsfast.launcher.rank --world_info=... --master_addr=... --master_port=... -- train.py

The global rank comes from OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID. Which node and local rank it is comes
from the plan (world_info, filled host by host in order, matching `--map-by slot` / `--distribution=block`), so
LOCAL_RANK, CUDA_VISIBLE_DEVICES and --local_rank are the same as with the ssh launcher. The user script runs as a
supervised child so its lines carry the same `[rankN]: ` prefix; the MPI launcher stops the other ranks when one
fails and returns its exit code.
"""
import os
import sys
from typing import List, Mapping, Optional, Tuple

from .errors import USAGE_EXIT_CODE, LaunchError
from .node import (check_user_program, core_sets, common_parser, parse_world_info, rank_child,
                   split_user_command)
from .supervise import Supervisor


_SOURCES = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
            ("PMI_RANK", "PMI_SIZE", "MPICH/Hydra"),
            ("SLURM_PROCID", "SLURM_NTASKS", "Slurm"))


def global_rank(environ: Mapping[str, str]) -> Tuple[int, int, str]:
    for rank_key, size_key, name in _SOURCES:
        if rank_key in environ and size_key in environ:
            try:
                return int(environ[rank_key]), int(environ[size_key]), name
            except ValueError:
                raise LaunchError(f"{rank_key}={environ[rank_key]!r} / {size_key}={environ[size_key]!r} "
                                  "are not integers") from None
    raise LaunchError("dsfast.launcher.rank must be started by mpirun or srun (none of OMPI_COMM_WORLD_RANK, "
                      "PMI_RANK, SLURM_PROCID is set); use `dsfast --launcher openmpi|mpich|slurm ...`")


def locate(info, rank: int) -> Tuple[int, int]:
    """(node index, local rank) of a global rank when ranks fill hosts in plan order."""
    start = 0
    for node, slots in enumerate(info.values()):
        if rank < start + len(slots):
            return node, rank - start
        start += len(slots)
    raise LaunchError(f"rank {rank} is beyond the plan's {start} slots")


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        own, user = split_user_command(argv)
        opts = common_parser("python -m dsfast.launcher.rank").parse_args(own)
        info = parse_world_info(opts.world_info)
        rank, size, source = global_rank(os.environ)
        world = sum(len(s) for s in info.values())
        if size != world:
            raise LaunchError(f"{source} started {size} ranks but the plan has {world} slots")
        node, local = locate(info, rank)
        check_user_program(opts, user)
        cpus = None
        if opts.bind_cores_to_rank or opts.bind_core_list:
            cpus = core_sets(len(list(info.values())[node]), opts.bind_core_list)[local]
        child = rank_child(opts, user, info, node, local, os.environ, cpus)
    except LaunchError as e:
        print(f"dsfast: error: {e}", file=sys.stderr)
        return USAGE_EXIT_CODE
    return Supervisor([child]).run()


if __name__ == "__main__":
    sys.exit(main())
