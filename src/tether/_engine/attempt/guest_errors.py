"""Errors the host raises into the program: a ``[code]`` message and a built-in exception type."""

from __future__ import annotations

import builtins
from typing import Any

from tether._engine.attempt.result import to_json_value
from tether._sandbox.monty import GuestRaise
from tether.errors import SourceUnavailable, TetherError


def guest_error(code: str, message: str, exc_type: str) -> GuestRaise:
    """An exception to raise in the program; its message starts with ``[code]``."""
    return GuestRaise(exc_type, f"[{code}] {message}")


def err_json(err: GuestRaise) -> dict[str, Any]:
    """A raised error as the journal keeps it."""
    return {"type": err.exc_type, "message": err.message}


class ToolAborted(RuntimeError):
    """A tool raised SystemExit or KeyboardInterrupt; reported as the tool's failure."""


def exit_detail(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    return f"({code!r})" if code is not None and isinstance(code, (int, str)) and len(str(code)) < 100 else ""


def _exc_type_for(exc: BaseException) -> str:
    """Keep a tool's built-in exception type (LookupError, ValueError...) for the program."""
    name = type(exc).__name__
    cls = getattr(builtins, name, None)
    # Only types the sandbox can raise with a message (UnicodeDecodeError cannot be).
    if isinstance(cls, type) and issubclass(cls, Exception) and name not in ("Exception",) \
            and not issubclass(cls, UnicodeError):
        return name
    return "RuntimeError"


def tool_error(address: str, exc: BaseException) -> GuestRaise:
    """A tool's failure as the program sees it: the tool's address, its message, its exception type."""
    if isinstance(exc, TetherError):
        message = exc.message
    else:
        try:
            message = str(exc) or type(exc).__name__
        except Exception:  # noqa: BLE001 - a hostile __str__ still names the failure
            message = type(exc).__name__
        message = to_json_value(message)[0] if isinstance(message, str) else type(exc).__name__
    if len(message) > 2000:
        message = message[:2000] + "…"
    # A source's own message may already start with the address: name it once.
    if not message.startswith(f"{address}:"):
        message = f"{address}: {message}"
    code = exc.code if isinstance(exc, SourceUnavailable) else "tool_error"
    return guest_error(code, message, _exc_type_for(exc))
