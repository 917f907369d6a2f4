"""deepspeed.launcher.runner: the names programs import from DeepSpeed's launcher module.

`accelerate launch --use_deepspeed` imports DEEPSPEED_ENVIRONMENT_NAME (the env file it appends to for multi-node
runs); `main` is the `dsfast` launcher, which takes DeepSpeed's launcher options.
"""
import os
import sys

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


def parse_args(args=None):
    """DeepSpeed's launcher arguments as a Namespace (`args`: the argument list, sys.argv[1:] when None), without
    launching: user_script / user_args, num_nodes / num_gpus (-1: all), include / exclude, hostfile, master_addr /
    master_port, ... as DeepSpeed names them, unset ones with DeepSpeed's defaults ("" for include / exclude /
    master_addr). `launcher` is None where the user gave none (dsfast picks it from the hosts at launch). A bad
    option exits with the usage message, as argparse does."""
    parsed = cli.parse_launch_args(list(sys.argv[1:] if args is None else args))
    for name in ("include", "exclude", "master_addr"):
        if getattr(parsed, name, "") is None:
            setattr(parsed, name, "")
    return parsed


__all__ = ["main", "parse_args", "DEEPSPEED_ENVIRONMENT_NAME", "DEEPSPEED_ENVIRONMENT_PATHS", "DLTS_HOSTFILE",
           "EXPORT_ENVS"]
