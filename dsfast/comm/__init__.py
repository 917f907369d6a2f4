"""deepspeed.comm for dsfast: process-group setup and environment discovery (torchrun, dsfast launcher, Open
MPI, Slurm), the job queries (queries.py) and the collectives (collectives.py), over torch.distributed."""
from . import collectives, queries
from .collectives import *  # noqa: F401,F403
from .env import DistEnv, DistributedEnvError, discover, first_slurm_host
from .init import default_backend, init_distributed
from .queries import *  # noqa: F401,F403

__all__ = ["init_distributed", "default_backend", "discover", "DistEnv", "DistributedEnvError", "first_slurm_host",
           *collectives.__all__, *queries.__all__]
