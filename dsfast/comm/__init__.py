"""Process-group setup and environment discovery (torchrun, dsfast launcher, Open MPI, Slurm)."""
from .env import DistEnv, DistributedEnvError, discover, first_slurm_host
from .init import default_backend, init_distributed

__all__ = ["init_distributed", "default_backend", "discover", "DistEnv", "DistributedEnvError", "first_slurm_host"]
