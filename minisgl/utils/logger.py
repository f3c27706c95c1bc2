"""Loggers with a timestamp, a coloured level, and rank-0-only variants for tensor parallelism."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}
_COLOURS = {"DEBUG": "36", "INFO": "32", "WARNING": "33", "ERROR": "31", "CRITICAL": "35"}


class _Formatter(logging.Formatter):
    def __init__(self, suffix: str, use_tp_rank: bool | None, colour: bool) -> None:
        super().__init__()
        self.suffix = suffix
        self.use_tp_rank = use_tp_rank
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        from minisgl.distributed import try_get_tp_info

        suffix = self.suffix
        tp_info = try_get_tp_info()
        if tp_info is not None and self.use_tp_rank is not False:
            suffix += f"|rank={tp_info.rank}"
        stamp = self.formatTime(record, "%Y-%m-%d|%H:%M:%S")
        level = f"{record.levelname:<8}"
        if self.colour:
            level = f"\033[{_COLOURS.get(record.levelname, '0')}m{level}\033[0m"
        return f"[{stamp}{suffix}] {level} {record.getMessage()}"


if TYPE_CHECKING:

    class RankLogger(logging.Logger):
        """A logger whose *_rank0 methods log on tensor-parallel rank 0 only."""

        def debug_rank0(self, msg: object, *args: Any, **kwargs: Any) -> None: ...
        def info_rank0(self, msg: object, *args: Any, **kwargs: Any) -> None: ...
        def warning_rank0(self, msg: object, *args: Any, **kwargs: Any) -> None: ...
        def critical_rank0(self, msg: object, *args: Any, **kwargs: Any) -> None: ...


def init_logger(
    name: str,
    suffix: str = "",
    *,
    strip_file: bool = True,
    level: str | None = None,
    use_pid: bool | None = None,
    use_tp_rank: bool | None = None,
) -> RankLogger:
    """A logger for module `name`, writing to stdout.

    The level comes from `level` or $LOG_LEVEL (default INFO); $LOG_PID=1 adds the process id.
    """
    if strip_file:
        suffix = os.path.basename(suffix)
    suffix = f"|{suffix}" if suffix else ""
    if use_pid is None:
        use_pid = os.getenv("LOG_PID", "0").lower() in ("1", "true", "yes")
    if use_pid:
        suffix = f"|pid={os.getpid()}{suffix}"

    logger = logging.getLogger(name)
    logger.setLevel(_LEVELS.get((level or os.getenv("LOG_LEVEL", "")).upper(), logging.INFO))
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_Formatter(suffix, use_tp_rank, colour=sys.stdout.isatty()))
    logger.addHandler(handler)
    logger.propagate = False

    def on_rank0(method: str):
        def log(msg: object, *args: Any, **kwargs: Any) -> None:
            from minisgl.distributed import try_get_tp_info

            tp_info = try_get_tp_info()
            if tp_info is None or tp_info.is_primary():
                getattr(logger, method)(msg, *args, **kwargs)

        return log

    for method in ("debug", "info", "warning", "critical"):
        setattr(logger, f"{method}_rank0", on_rank0(method))
    return logger  # type: ignore[return-value]
