"""deepspeed.utils.logger and log_dist: the logger DeepSpeed programs log through.

Like DeepSpeed's, it prints INFO and above to stdout with the source location, and does not propagate (dsfast's own
loggers, under "dsfast", stay as the program configures them).
"""
import logging
import sys

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
