"""deepspeed.utils.logging: the module DeepSpeed programs and frameworks reach the program logger through
(Lightning's DeepSpeedStrategy sets `deepspeed.utils.logging.logger`'s level). It is dsfast.utils.log's logger."""
import logging as _logging

from .log import log_dist, logger, warning_once

_LEVELS = {"debug": _logging.DEBUG, "info": _logging.INFO, "warning": _logging.WARNING, "error": _logging.ERROR,
           "critical": _logging.CRITICAL}


def get_current_level():
    """The logger's effective level (a logging constant)."""
    return logger.getEffectiveLevel()


def should_log_le(max_log_level_str):
    """True when the logger's level is at or below the named level ("info", "warning", ...)."""
    if not isinstance(max_log_level_str, str) or max_log_level_str.lower() not in _LEVELS:
        raise ValueError(f"should_log_le: {max_log_level_str!r} is not a log level; use one of "
                         f"{', '.join(_LEVELS)}")
    return get_current_level() <= _LEVELS[max_log_level_str.lower()]


__all__ = ["logger", "log_dist", "get_current_level", "should_log_le", "warning_once"]
