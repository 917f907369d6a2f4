"""deepspeed.launcher.runner: the names programs import from DeepSpeed's launcher module.

`accelerate launch --use_deepspeed` imports DEEPSPEED_ENVIRONMENT_NAME (the env file it appends to for multi-node
runs); `main` is the `dsfast` launcher, which takes DeepSpeed's launcher options.
"""
import os

from . import cli
from .envfile import ENV_FILE_NAMES, EXPORT_PREFIXES
from .hostfile import DEFAULT_HOSTFILE as DLTS_HOSTFILE

# As DeepSpeed 0.19.8: $DS_ENV_FILE if set, else ".deepspeed_env", looked for in the home directory and the
# current one (dsfast reads ".dsfast_env" there too: envfile.py)
DEEPSPEED_ENVIRONMENT_NAME = os.getenv("DS_ENV_FILE", ENV_FILE_NAMES[0])
DEEPSPEED_ENVIRONMENT_PATHS = [os.path.expanduser("~"), "."]
EXPORT_ENVS = list(EXPORT_PREFIXES)


def main(args=None):
    """DeepSpeed's launcher entry point: `args` is the argument list (sys.argv[1:] when None); returns the job's
    exit code. Called from Python, a misuse (e.g. --num_nodes with --include) raises LaunchError, a ValueError, as
    DeepSpeed's raises ValueError; the `dsfast` / `deepspeed` commands print it instead."""
    return cli.main(args, raise_errors=True)

__all__ = ["main", "DEEPSPEED_ENVIRONMENT_NAME", "DEEPSPEED_ENVIRONMENT_PATHS", "DLTS_HOSTFILE", "EXPORT_ENVS"]
