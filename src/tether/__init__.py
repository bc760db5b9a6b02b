"""tether: a durable code-mode execution engine for AI agents.

The public API is what this module exports (``__all__``), and the public
modules ``tether.errors``, ``tether.store`` (the backend interface) and
``tether.sources`` (the source interface); everything under a leading
underscore is private to the package and may change.
"""

from tether._app import open_runtime
from tether._engine.approvals.model import Decision, PendingWrite
from tether._engine.limits import Limits
from tether._engine.policy import Policy, Rule
from tether._engine.result import RunResult
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
