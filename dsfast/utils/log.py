"""deepspeed.utils.logger and log_dist: the logger DeepSpeed programs log through.

Like DeepSpeed's, it prints INFO and above to stdout with the source location, and does not propagate (dsfast's own
loggers, under "dsfast", stay as the program configures them).
"""
import logging
import sys
import threading

import torch.distributed as dist


class _Stdout(logging.StreamHandler):
    """Writes to whatever sys.stdout is at the time (a program or a test may replace it)."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):
        pass


logger = logging.getLogger("dsfast.program")
if not logger.handlers:
    _handler = _Stdout()
    _handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] "
                                            "%(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def log_dist(message, ranks=None, level=logging.INFO):
    """Log `message` on the given ranks (None or a list holding -1: every rank), prefixed with the rank."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if ranks is None or -1 in ranks or rank in ranks:
        logger.log(level, f"[Rank {rank}] {message}", stacklevel=2)


_warned = set()
_warned_lock = threading.Lock()


def warning_once(message, *args, **kwargs):
    """logger.warning, only the first time this message (with these arguments) is logged in the process."""
    key = (str(message), repr(args))
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    kwargs.setdefault("stacklevel", 2)
    logger.warning(message, *args, **kwargs)


logger.warning_once = warning_once   # DeepSpeed's logger has it as a method: logger.warning_once("...")
