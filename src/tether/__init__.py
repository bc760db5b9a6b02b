"""tether: a durable code-mode execution engine for AI agents.

The public API is what this module exports (``__all__``), and the public
modules ``tether.errors``, ``tether.store`` (the backend interface) and
``tether.sources`` (the source interface); everything under a leading
underscore is private to the package and may change.
"""

import typing as _typing

from tether._engine.approvals.model import Decision, PendingWrite
from tether._engine.attempt.result import RunResult
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy, Rule
from tether._runtime import Runtime
from tether._sources.python import tool, tools_from_module
from tether._tools.catalog import Catalog
from tether._tools.context import CallContext, current_call
from tether._tools.model import Annotations, Tool
from tether.errors import (
    AlreadyDecided,
    ExecutionDiverged,
    IdempotencyConflict,
    LimitExceeded,
    RunExpired,
    RunNotFound,
    RunTampered,
    SeqRequired,
    SnapshotTampered,
    TetherError,
    ToolError,
    UsageError,
    WorldError,
    WriteNotPending,
    WriteOutcomeUnknown,
    WrongSecret,
)

# Names for the annotations only (strings below): every other name of this module is public.
if _typing.TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from contextlib import AbstractAsyncContextManager
    from pathlib import Path
    from typing import Any

    from tether._config import Config


def open_runtime(
    config: "Config | None" = None,
    *,
    config_path: "str | Path | None" = None,
    tools: "Sequence[str]" = (),
    type_check: "bool | None" = None,
    store_url: "str | None" = None,
    strict_sources: bool = False,
    sources: "list[dict[str, Any]] | None" = None,
    report: "Callable[[str], None] | None" = None,
) -> "AbstractAsyncContextManager[Runtime]":
    """A started Runtime over tether.toml (``config_path``, else ./tether.toml, else the defaults), as the
    CLI opens it: its store, sources, policy and limits; the sources are closed on exit.

    ``tools`` are modules or files of Python tools (the CLI's ``--tools``); ``sources`` are recorded
    definitions (a run's) to load instead of the config's own; ``report`` receives one line per source
    that failed to load (``strict_sources`` makes that an error instead).
    """
    # Here rather than in tether._app so that `import tether` does not import the app and its config
    # models: a program that only builds a Runtime, or the CLI's other commands, never needs them.
    from tether._app import open_runtime as _open_runtime

    return _open_runtime(config, config_path=config_path, tools=tools, type_check=type_check,
                         store_url=store_url, strict_sources=strict_sources, sources=sources, report=report)


__all__ = [
    "AlreadyDecided",
    "Annotations",
    "CallContext",
    "Catalog",
    "Decision",
    "ExecutionDiverged",
    "IdempotencyConflict",
    "LimitExceeded",
    "Limits",
    "PendingWrite",
    "Policy",
    "Rule",
    "RunExpired",
    "RunNotFound",
    "RunResult",
    "RunTampered",
    "Runtime",
    "SeqRequired",
    "SnapshotTampered",
    "TetherError",
    "Tool",
    "ToolError",
    "UsageError",
    "WorldError",
    "WriteNotPending",
    "WriteOutcomeUnknown",
    "WrongSecret",
    "current_call",
    "open_runtime",
    "tool",
    "tools_from_module",
]

# Every public name says it is tether's (httpx does the same): reprs, tracebacks and docs show
# tether.Runtime, not the private module that defines it, and pickles name the stable path.
for _name in __all__:
    globals()[_name].__module__ = "tether"
del _name
