"""tether: a durable code-mode execution engine for AI agents.

The public API is what this module exports; everything else is private to the
package and may change.
"""

from .approvals.model import Decision, PendingWrite
from .errors import (
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
from .runs.limits import Limits
from .runs.policy import Policy, Rule
from .runs.result import RunResult
from .runs.runtime import Runtime
from .sources.python import tool, tools_from_module
from .tools.catalog import Catalog
from .tools.context import CallContext, current_call
from .tools.model import Annotations, Tool

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
