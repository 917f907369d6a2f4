"""`dsfast alias install | remove | status`: make `deepspeed` dsfast in the current Python environment.

Lightning and accelerate accept DeepSpeed only through package metadata (`importlib.metadata.version("deepspeed")`),
so a module alias alone is not enough for them. `install` writes, into the environment's site-packages:

    deepspeed/__init__.py                              `import deepspeed` gives dsfast (deepspeed.X is dsfast.X)
    deepspeed-0.19.8+dsfast.<v>.dist-info/             metadata: DeepSpeed's API level 0.19.8, provided by dsfast <v>
    <scripts>/deepspeed                                the `dsfast` launcher under DeepSpeed's command name

and lists them in the dist-info's RECORD, so `dsfast alias remove` (or `pip uninstall deepspeed`) removes exactly
those files. It refuses when a real DeepSpeed (anything not written by this command) is installed or importable.
`--target DIR` writes into DIR instead (no script): for a directory on PYTHONPATH.
No torch import: it only writes files.
"""
import argparse
import base64
import hashlib
import importlib.machinery
import importlib.metadata
import os
import sys
import sysconfig

from .version import API_LEVEL, __version__
from .version import DEEPSPEED_VERSION as VERSION

INSTALLER = "dsfast alias"         # the dist-info's INSTALLER file: how ours is told from a real DeepSpeed
DIST_INFO = f"deepspeed-{VERSION}.dist-info"

ALIAS_MODULE = f'''"""`deepspeed` is dsfast {__version__} here (DeepSpeed {API_LEVEL}'s API),
written by `dsfast alias install`; `dsfast alias remove` (or `pip uninstall deepspeed`) takes it away."""
import sys

import dsfast

sys.modules[__name__] = dsfast
'''

SCRIPT = '''#!{python}
# `deepspeed` is the dsfast launcher here (written by `dsfast alias install`)
import sys

from dsfast.launcher.cli import main

sys.exit(main())
'''


class AliasError(Exception):
    """A refusal; the message says why and what to do."""


def _metadata():
    return (f"Metadata-Version: 2.1\nName: deepspeed\nVersion: {VERSION}\n"
            f"Summary: alias: DeepSpeed {API_LEVEL}'s API provided by dsfast {__version__} (not DeepSpeed)\n"
            f"Requires-Dist: dsfast=={__version__}\n")


def _record_line(root, path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{os.path.relpath(path, root).replace(os.sep, '/')},sha256={digest},{len(data)}"


def _ours(dist_info_dir):
    try:
        with open(os.path.join(dist_info_dir, "INSTALLER")) as f:
            return f.read().strip() == INSTALLER
    except OSError:
        return False


def _deepspeed_dist_infos(directory):
    """deepspeed-*.dist-info / .egg-info directories (and egg-links) in `directory`."""
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, n) for n in os.listdir(directory)
                  if n.lower().replace("_", "-").startswith("deepspeed-") and
                  n.endswith((".dist-info", ".egg-info", ".egg-link")))


def _real_deepspeed(target):
    """Why a real DeepSpeed is present (None if it is not): metadata or a module not written by this command."""
    for dist in importlib.metadata.distributions():
        if (dist.metadata["Name"] or "").lower() == "deepspeed":
            where = getattr(dist, "_path", None)
            if where is None or not _ours(str(where)):
                return f"DeepSpeed {dist.version} is installed ({where or 'metadata found'})"
    for info in _deepspeed_dist_infos(target):
        if not _ours(info):
            return f"DeepSpeed is installed in {target} ({os.path.basename(info)})"
    for entry in [target] + [p for p in sys.path if p and os.path.abspath(p) != os.path.abspath(target)]:
        spec = importlib.machinery.PathFinder.find_spec("deepspeed", [entry]) if os.path.isdir(entry) else None
        if spec is not None and not _alias_file(spec.origin or ""):      # another dsfast alias is harmless
            return f"a `deepspeed` module is importable from {os.path.dirname(spec.origin or '') or entry}"
    return None


def _alias_file(path):
    try:
        with open(path) as f:
            return "written by `dsfast alias install`" in f.read()
    except OSError:
        return False


def default_target():
    return sysconfig.get_paths()["purelib"]


def install(target=None, script_dir=None):
    """Write the alias into `target` (default: this environment's site-packages); returns the written paths."""
    env_install = target is None
    target = os.path.abspath(target or default_target())
    script_dir = (script_dir or sysconfig.get_paths()["scripts"]) if env_install else None
    real = _real_deepspeed(target)
    if real:
        raise AliasError(f"{real}; the alias would hide it. Use that DeepSpeed, or `pip uninstall deepspeed` "
                         "first and run `dsfast alias install` again")
    for old in _deepspeed_dist_infos(target):       # ours, an older dsfast version: replace it
        remove_record(target, old)
    files = {os.path.join(target, "deepspeed", "__init__.py"): ALIAS_MODULE,
             os.path.join(target, DIST_INFO, "METADATA"): _metadata(),
             os.path.join(target, DIST_INFO, "INSTALLER"): INSTALLER + "\n",
             os.path.join(target, DIST_INFO, "top_level.txt"): "deepspeed\n"}
    script = None
    if script_dir is not None:
        script = os.path.join(script_dir, "deepspeed")
        if os.path.exists(script):
            raise AliasError(f"{script} exists and was not written by dsfast; remove it, or pass --target DIR")
        files[script] = SCRIPT.format(python=sys.executable)
    try:
        record = []
        for path, text in files.items():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            data = text.encode()
            with open(path, "wb") as f:
                f.write(data)
            if path == script:
                os.chmod(path, 0o755)
            record.append(_record_line(target, path, data))
        record.append(f"{DIST_INFO}/RECORD,,")
        with open(os.path.join(target, DIST_INFO, "RECORD"), "w") as f:
            f.write("\n".join(record) + "\n")
    except OSError as err:       # no permission, a file where a directory should be, a full disk
        raise AliasError(f"cannot write into {target} ({err.strerror or err}): run it with the permissions of this "
                         "environment, in a virtualenv, or with --target DIR (a writable directory)") from None
    return sorted(files)


def remove_record(target, dist_info):
    """Delete the files a dist-info's RECORD lists (ours only), then the emptied directories."""
    if not _ours(dist_info):
        raise AliasError(f"{dist_info} was not written by `dsfast alias install`; remove that DeepSpeed with pip")
    removed = []
    with open(os.path.join(dist_info, "RECORD")) as f:
        paths = [line.split(",")[0] for line in f if line.strip()]
    for rel in paths:
        path = os.path.normpath(os.path.join(target, rel))
        if os.path.isfile(path):
            os.remove(path)
            removed.append(path)
    for directory in (os.path.join(target, "deepspeed", "__pycache__"), os.path.join(target, "deepspeed"),
                      dist_info):
        if os.path.isdir(directory):
            for leftover in os.listdir(directory):
                if directory.endswith("__pycache__") and leftover.startswith("__init__."):
                    os.remove(os.path.join(directory, leftover))
            if not os.listdir(directory):
                os.rmdir(directory)
    return removed


def remove(target=None):
    """Remove the alias from `target` (default: this environment); returns the removed paths ([]: none there)."""
    target = os.path.abspath(target or default_target())
    removed = []
    for dist_info in _deepspeed_dist_infos(target):
        removed += remove_record(target, dist_info)
    return removed


def status(target=None):
    target = os.path.abspath(target or default_target())
    ours = [d for d in _deepspeed_dist_infos(target) if _ours(d)]
    if ours:
        return f"installed: {ours[0]} (`import deepspeed` is dsfast {__version__})"
    real = _real_deepspeed(target)
    return f"not installed in {target}" + (f"; {real}" if real else "")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="dsfast alias", description="Make `deepspeed` dsfast in this Python "
                                     "environment (module and package metadata, for Lightning and accelerate), "
                                     "or undo it.")
    parser.add_argument("action", choices=("install", "remove", "status"))
    parser.add_argument("--target", default=None, help="a directory (on PYTHONPATH) instead of this environment's "
                                                       "site-packages; no `deepspeed` command is written there")
    args = parser.parse_args(argv)
    try:
        if args.action == "install":
            for path in install(args.target):
                print(f"dsfast alias: wrote {path}")
            print(f"dsfast alias: `import deepspeed` is dsfast {__version__} (deepspeed version {VERSION}); "
                  "undo with `dsfast alias remove`")
        elif args.action == "remove":
            removed = remove(args.target)
            for path in removed:
                print(f"dsfast alias: removed {path}")
            if not removed:
                print(f"dsfast alias: nothing to remove in {os.path.abspath(args.target or default_target())}")
        else:
            print(f"dsfast alias: {status(args.target)}")
    except AliasError as err:
        print(f"dsfast alias: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
