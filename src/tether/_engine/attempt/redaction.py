"""A pending write's arguments as people may see them: the one secret rule of ``_tools/shown.py``, applied to
what a pause recorded.

A write asks a person to approve it, so its arguments are shown; a password or
token among them should not be (P-38). Whether a value is a secret is
decided in one place, :mod:`tether._tools.shown` (by name, anywhere in an
argument, and by the tool's schema: ``format: password``, ``writeOnly``). A
pause also records the tool's secret argument names (``secret_args``), so a
surface that has no catalog at hand (another process, a later upgrade) still
hides them. The journal and ``pending.args`` keep the values: the write is sent
with them once approved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tether._tools.shown import REDACTED, secret_name, secret_paths

if TYPE_CHECKING:
    from tether._tools.model import Tool

__all__ = ["HIDDEN", "is_secret_name", "secret_args", "shown_args"]

HIDDEN = REDACTED
is_secret_name = secret_name


def secret_args(tool: Tool) -> list[str]:
    """The tool's top-level arguments its schema or their names mark secret (recorded with a pause)."""
    props = tool.input_schema.get("properties") or {}
    _, paths = secret_paths({name: "" for name in props}, tool.input_schema)
    return sorted({path[0] for path in paths if path})


def shown_args(write: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``write``'s arguments with every secret hidden: by the shared rule (names, ``schema``) and by the
    names its pause recorded (``secret_args``)."""
    shown, _ = secret_paths(write.get("args") or {}, schema)
    named = set(write.get("secret_args") or ())
    return {k: HIDDEN if k in named else v for k, v in shown.items()}
