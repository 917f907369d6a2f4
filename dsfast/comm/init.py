"""init_distributed: create the default process group from what the environment says (see env.py)."""
import datetime
import os
import warnings

import torch
import torch.distributed as dist

from .env import DEFAULT_MASTER_PORT, discover
from .teardown import exit_timeout, register_exit_teardown

# The process group's timeout, as DeepSpeed 0.19.8 (deepspeed/constants.py default_pg_timeout): 10 minutes, or
# DEEPSPEED_TIMEOUT whole minutes. dsfast's own DSFAST_TIMEOUT_S (seconds) wins over both; an explicit
# init_distributed(timeout=...) over everything.
DEFAULT_TIMEOUT_MIN = 10


def default_backend():
    """nccl when this process can use a GPU, gloo otherwise."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def default_timeout(env=None):
    """The timeout init_distributed gives the process group when the caller names none (see above)."""
    env = os.environ if env is None else env
    for name, unit, parse in (("DSFAST_TIMEOUT_S", "seconds", float), ("DEEPSPEED_TIMEOUT", "minutes", int)):
        text = env.get(name)
        if text is None:
            continue
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not value > 0 or value != value or value == float("inf"):
            kind = "a whole number" if parse is int else "a number"
            raise ValueError(f"{name}={text!r}: must be {kind} of {unit} > 0 (the process group's timeout; "
                             f"unset, it is {DEFAULT_TIMEOUT_MIN} minutes)")
        return datetime.timedelta(**{unit: value})
    return datetime.timedelta(minutes=DEFAULT_TIMEOUT_MIN)


def _timeout(timeout):
    if timeout is None:
        return default_timeout()
    if isinstance(timeout, (int, float)):
        timeout = datetime.timedelta(seconds=timeout)
    return timeout


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=DEFAULT_MASTER_PORT,
                     verbose=True, timeout=None, init_method=None, dist_init_required=None, config=None,
                     rank=-1, world_size=-1):
    """Join (or create) the default process group; returns the backend in use.

    Safe to call twice: an existing group is kept (a warning says so when a different backend was asked for).
    With no launcher variables in the environment this is a world of one process (no network, no mpi4py).
    `auto_mpi_discovery=False` ignores Open MPI / Slurm variables. `rank`/`world_size` override the environment.
    """
    if dist_init_required is False:
        return dist.get_backend() if dist.is_initialized() else None
    exit_timeout()          # a bad DSFAST_EXIT_TIMEOUT_S is an error now, not at the end of the run
    if dist.is_initialized():
        register_exit_teardown()     # a group the program made: still torn down in time at exit
        current = dist.get_backend()
        if dist_backend is not None and dist_backend != current:
            warnings.warn(f"init_distributed: the process group already uses {current!r}; "
                          f"ignoring dist_backend={dist_backend!r}")
        return current
    env = dict(os.environ)
    if not auto_mpi_discovery:
        env = {k: v for k, v in env.items() if not k.startswith(("OMPI_", "SLURM_"))}
    found = discover(env, default_port=distributed_port)
    if rank >= 0 or world_size > 0:
        found = type(found)(rank if rank >= 0 else found.rank, world_size if world_size > 0 else found.world_size,
                            found.local_rank, found.master_addr or "127.0.0.1", found.master_port, found.source)
    # user code (and torch helpers) read these; fill them in for MPI / Slurm starts
    for key, value in found.as_environ().items():
        os.environ.setdefault(key, value)
    backend = dist_backend or default_backend()
    if backend == "nccl" and torch.cuda.is_available():
        torch.cuda.set_device(found.local_rank % torch.cuda.device_count())
    kwargs = dict(backend=backend, rank=found.rank, world_size=found.world_size, timeout=_timeout(timeout))
    if init_method is not None:
        kwargs["init_method"] = init_method
    elif found.world_size == 1:
        kwargs["store"] = dist.HashStore()  # a world of one needs no rendezvous (and no free port)
    else:
        kwargs["init_method"] = f"tcp://{_url_host(found.master_addr)}:{found.master_port}"
    dist.init_process_group(**kwargs)
    register_exit_teardown()    # bounded meeting of the ranks, then the teardown
    if verbose and found.rank == 0 and found.world_size > 1:
        print(f"[dsfast] process group ready: backend={backend} world_size={found.world_size} "
              f"(from {found.source}), master={found.master_addr}:{found.master_port}", flush=True)
    return backend


def _url_host(addr):
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
