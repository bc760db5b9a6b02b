"""tether's own log lines: text for a terminal, or one JSON object per line for a log pipeline ([log]).

Lines about a run carry its ``run_id`` (and an internal error its
``correlation_id``, the one the caller's envelope names) as fields, passed
with ``extra=`` by the code that logs them, so a pipeline can join a caller's
report to the server's traceback without parsing messages.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# Fields a record may carry through `extra=` that a JSON line shows by name.
FIELDS = ("run_id", "correlation_id", "status", "code", "principal")
_HANDLER_NAME = "tether-log"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the known fields, and a traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure(fmt: str = "text", level: str = "info", stream: Any = None) -> logging.Handler:
    """Send the ``tether`` loggers to ``stream`` (stderr) as ``fmt``; replaces what an earlier call installed."""
    logger = logging.getLogger("tether")
    for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    # One place prints each line: not again through the root logger's handlers.
    logger.propagate = False
    return handler


def configure_from(log: Any) -> logging.Handler | None:
    """Apply a [log] section; the defaults (text, info) leave Python's own handling alone."""
    if log is None or (log.format, log.level) == ("text", "info"):
        return None
    return configure(log.format, log.level)


def say(line: str, *, level: int = logging.INFO, logger: str = "tether.server") -> None:
    """A line for the operator (what a server serves, a warning about its settings): through [log]'s handler
    when [log] configured one, so a pipeline reading JSON lines gets JSON lines from start to end; else on
    stderr as it is, as a terminal expects."""
    if any(h.get_name() == _HANDLER_NAME for h in logging.getLogger("tether").handlers):
        logging.getLogger(logger).log(level, line)
    else:
        print(line, file=sys.stderr, flush=True)


__all__ = ["FIELDS", "JsonFormatter", "configure", "configure_from", "say"]
