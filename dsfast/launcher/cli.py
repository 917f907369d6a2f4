"""`dsfast`: DeepSpeed's launcher command line, plus subcommands.

    dsfast [options] SCRIPT [script args]        launch SCRIPT on every slot (see --help)
    dsfast [options] -m MODULE [args]            launch a module
    dsfast report [args]                         subcommand: dsfast.report:main(argv)
    dsfast consolidate [args]                    subcommand: dsfast.checkpoint.consolidate:main(argv)
    dsfast plan [args]                           subcommand: dsfast.zero.planning.plan:main(argv)
    dsfast convert-deepspeed [args]              subcommand: dsfast.checkpoint.deepspeed_import:main(argv)
    dsfast alias install|remove|status           subcommand: dsfast.alias_install:main(argv)

Subcommand rule: a subcommand is recognised only as the FIRST argument and only when it is exactly one of the
names above. Anything else is launcher mode. To launch a user script whose name is a subcommand, write it as a
path (`dsfast ./report` or `dsfast report.py`) or put `--` first (`dsfast -- report args`). Options before the
name also mean launcher mode (`dsfast --num_procs 2 report` launches ./report).
"""
import argparse
import importlib
import json
import os
import re
import sys
from typing import List, Optional

from .errors import USAGE_EXIT_CODE, LaunchError
from .hostfile import DEFAULT_HOSTFILE
from .runners import LAUNCHERS, TOOL

SUBCOMMANDS = {
    "report": "dsfast.report:main",
    "consolidate": "dsfast.checkpoint.consolidate:main",
    "plan": "dsfast.zero.planning.plan:main",
    "convert-deepspeed": "dsfast.checkpoint.deepspeed_import:main",
    "alias": "dsfast.alias_install:main",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dsfast", allow_abbrev=False,
        description="Launch a training script on one or many machines (DeepSpeed-compatible options). "
                    f"Subcommands (first argument only): {', '.join(SUBCOMMANDS)}; "
                    "`dsfast -- NAME` runs a script called NAME instead.")
    p.add_argument("-H", "--hostfile", default=None,
                   help=f"'HOST slots=N' per line; default {DEFAULT_HOSTFILE} if it exists, else this machine")
    p.add_argument("-i", "--include", default=None, help="only these slots: 'host1:0,1@host2'")
    p.add_argument("-e", "--exclude", default=None, help="all but these slots: 'host1:0@host2'")
    p.add_argument("--num_nodes", type=int, default=-1, help="use the first N hosts")
    p.add_argument("--num_gpus", "--num_procs", dest="num_gpus", type=int, default=-1,
                   help="use the first K slots of each host; on a machine without GPU and hostfile, the number "
                        "of CPU processes (default 1)")
    p.add_argument("--master_addr", default=None, help="rank 0's address (default 127.0.0.1 on one node, "
                                                       "else the first host)")
    p.add_argument("--master_port", type=int, default=29500)
    p.add_argument("--launcher", default=None, choices=LAUNCHERS,
                   help="default: local for one host, ssh for several")
    p.add_argument("--launcher_args", default="", help="extra arguments for ssh/pdsh/mpirun/srun (one string)")
    p.add_argument("--force_multi", action="store_true", help="use the multi-node runner even for one host")
    p.add_argument("--no_ssh", action="store_true", help="run only this node's share (with --node_rank)")
    p.add_argument("--node_rank", type=int, default=None, help="with --no_ssh: which hostfile node this is")
    p.add_argument("--no_local_rank", action="store_true", help="do not pass --local_rank=N to the script")
    p.add_argument("--no_python", action="store_true", help="SCRIPT is an executable, not a Python file")
    p.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module name (python -m)")
    p.add_argument("--ssh_port", type=int, default=None)
    p.add_argument("--bind_cores_to_rank", action="store_true", help="give each local rank its share of cores")
    p.add_argument("--bind_core_list", default=None, help="cores to share out, e.g. 0-15,32-47")
    p.add_argument("--enable_each_rank_log", "--each_rank_log", dest="each_rank_log", default=None,
                   metavar="DIR", help="also write each rank's output to DIR/rank<N>.log")
    p.add_argument("--dry_run", action="store_true", help="print the plan as JSON and start nothing")
    p.usage = "dsfast [options] SCRIPT [script args]  |  dsfast [options] -m MODULE [args]  |  dsfast report ..."
    return p


def run_subcommand(name: str, argv: List[str]) -> int:
    target = SUBCOMMANDS[name]
    module_name, func_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            print(f"dsfast: error: `dsfast {name}` is not available in this install ({module_name} is missing). "
                  f"To run a script called {name!r}, use `dsfast ./{name}` or `dsfast -- {name}`.", file=sys.stderr)
            return USAGE_EXIT_CODE
        raise
    rc = getattr(module, func_name)(argv)
    return rc if isinstance(rc, int) else 0


def split_argv(parser: argparse.ArgumentParser, argv: List[str]):
    """Split into (launcher options, user script, user args) at the first non-option token or at `--`.

    Done by hand because argparse drops a `--` that belongs to the user's own arguments.
    """
    takes_value = {opt for a in parser._actions if a.nargs != 0 for opt in a.option_strings}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            rest = argv[i + 1:]
            return argv[:i], (rest[0] if rest else None), rest[1:]
        if not tok.startswith("-") or tok == "-":
            return argv[:i], tok, argv[i + 1:]
        if tok in takes_value:  # `--opt value`; `--opt=value` and `-iHOST` are one token
            i += 1
        i += 1
    return argv, None, []


def parse_launch_args(argv: List[str]):
    parser = build_parser()
    own, script, user_args = split_argv(parser, argv)
    args = parser.parse_args(own)
    args.user_script, args.user_args = script, user_args
    args.hostfile_given = args.hostfile is not None
    if args.hostfile is None:
        args.hostfile = DEFAULT_HOSTFILE
    if args.no_ssh:
        if args.launcher not in (None, "local"):
            parser.error(f"--no_ssh conflicts with --launcher {args.launcher}")
        args.launcher = "local"
    return args


def execute(plan) -> int:
    import shutil

    from .supervise import Child, Supervisor
    if plan.launcher == "local":
        from . import node
        return node.main(plan.commands[0][4:])  # same argv as `python -m dsfast.launcher.node`, run in-process
    tool = TOOL[plan.launcher]
    if shutil.which(tool) is None:
        raise LaunchError(f"--launcher {plan.launcher} needs `{tool}` on PATH and it is not there; install it "
                          "or pick another --launcher")
    if plan.launcher == "ssh":
        def hint(child, rc):
            return ("ssh could not connect or authenticate; check passwordless ssh "
                    "(`ssh -o BatchMode=yes HOST true`)") if rc == 255 else None
        children = [Child(argv=cmd, label=f"node {i} ({host})", stdin_pipe=True)
                    for i, (host, cmd) in enumerate(zip(plan.hosts, plan.commands))]
        return Supervisor(children, on_failure=hint).run()
    env = dict(os.environ)
    if plan.launcher == "pdsh":
        env.setdefault("PDSH_RCMD_TYPE", "ssh")
        if plan.ssh_port:
            env["PDSH_SSH_ARGS_APPEND"] = (env.get("PDSH_SSH_ARGS_APPEND", "") + f" -p {plan.ssh_port}").strip()
    child = Child(argv=plan.commands[0], label=plan.commands[0][0], env=env)
    sup = Supervisor([child])
    if plan.launcher == "pdsh":
        # pdsh waits for every node, so a rank failing on one node would leave the others running: watch the
        # node launchers' own failure line in pdsh's output and stop the whole job on the first one.
        child.prefix = ""
        child.on_line = lambda line: _watch_pdsh_line(line, sup)
    rc = sup.run()
    if plan.launcher == "pdsh" and rc != 0:
        from .runners import stop_pdsh_job
        stop_pdsh_job(plan, env)
    return rc


def format_plan(obj: dict) -> str:
    """One JSON object, one top-level key per line (readable, still plain JSON for tools)."""
    return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in obj.items()) + "\n}"


_FAILURE_LINE = re.compile(rb"dsfast: rank (\d+) exited with code (\d+)")


def _watch_pdsh_line(line: bytes, sup) -> None:
    m = _FAILURE_LINE.search(line)
    if m:
        sup.fail(int(m.group(2)), f"rank {int(m.group(1))} failed on a remote node (exit code {int(m.group(2))})")


def main(argv: Optional[List[str]] = None, raise_errors: bool = False) -> int:
    """raise_errors: a misuse raises LaunchError (a ValueError) instead of printing it and returning the usage
    exit code (deepspeed.launcher.runner.main, called from Python, raises as DeepSpeed's does)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        if os.path.exists(argv[0]):
            print(f"dsfast: note: running the `{argv[0]}` subcommand; to launch the file ./{argv[0]} use "
                  f"`dsfast ./{argv[0]}` or `dsfast -- {argv[0]}`", file=sys.stderr)
        return run_subcommand(argv[0], argv[1:])
    args = parse_launch_args(argv)
    try:
        from .plan import build_plan
        plan = build_plan(args)
        for warning in plan.warnings:
            print(f"dsfast: warning: {warning}", file=sys.stderr, flush=True)
        if args.dry_run:
            try:
                print(format_plan(plan.as_json()), flush=True)
            except BrokenPipeError:   # `dsfast --dry_run ... | head`: the reader took what it wanted
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        return execute(plan)
    except LaunchError as e:
        if raise_errors:
            raise
        print(f"dsfast: error: {e}", file=sys.stderr)
        return USAGE_EXIT_CODE
