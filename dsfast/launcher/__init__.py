"""The dsfast launcher: `dsfast [options] script.py [args]` (see dsfast.launcher.cli).

Layout: hostfile / selection / envfile / devices parse the inputs, plan resolves them, runners turn the plan into
command lines, node (one machine's ranks) and rank (one rank under mpirun/srun) start the user program, supervise
keeps a group of processes alive together or stops them together.
"""
from .errors import LaunchError

__all__ = ["LaunchError"]
