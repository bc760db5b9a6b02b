"""tether: a durable code-mode execution engine for AI agents.

The public API is what this module exports; everything else is private to the
package and may change.
"""

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
    "tool",
    "tools_from_module",
]
