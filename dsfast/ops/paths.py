"""Where the kernel sources are: inside the installed package (wheel) or beside it (repo checkout)."""
import os
from pathlib import Path

from . import env

_PKG_DIR = Path(__file__).resolve().parent.parent          # .../dsfast
_CANDIDATES = (
    _PKG_DIR / "csrc",            # installed wheel: setup.py's build_py copies csrc/ here
    _PKG_DIR.parent / "csrc",     # repo checkout / editable install
)


def csrc_root():
    """The csrc/ directory to build from; a clear error when none is found."""
    override = os.environ.get(env.CSRC_DIR)
    if override:
        root = Path(override).expanduser().resolve()
        if not root.is_dir():
            raise ValueError(f"{env.CSRC_DIR}={override!r} is not a directory")
        return root
    for root in _CANDIDATES:
        if (root / "include").is_dir():
            return root
    raise FileNotFoundError(
        "dsfast kernel sources not found; looked in " + ", ".join(str(c) for c in _CANDIDATES)
        + ". Reinstall dsfast (pip install .) or set " + env.CSRC_DIR)


def include_dir(root):
    return Path(root) / "include"
