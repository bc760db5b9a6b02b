"""The error tree. Every failure tether reports carries a stable ``code``.

::

    TetherError                      code, message, next_action, details
    ├── UsageError                   you used tether wrong (bad input, bad config)
    │   ├── ConfigError              config_invalid
    │   ├── CodeTooLarge             code_too_large
    │   ├── ProgramSyntaxError       syntax_error
    │   ├── TypeCheckError           type_check_failed
    │   ├── UnknownTool              unknown_tool
    │   ├── InvalidArguments         invalid_arguments
    │   ├── RunNotFound              run_not_found
    │   ├── AlreadyDecided           already_decided
    │   ├── RunExpired               run_expired
    │   ├── NotPaused                not_paused
    │   ├── SeqRequired              seq_required
    │   ├── WriteNotPending          write_not_pending
    │   ├── IdempotencyConflict      idempotency_conflict
    │   └── ApprovalElsewhere        approval_elsewhere
    ├── LimitExceeded                a limit stopped the program
    │   ├── (codes) memory_limit, time_limit, call_limit, journal_limit, budget_exceeded,
    │   │           call_timeout, output_limit, log_limit, overloaded
    │   └── QuotaExceeded            quota_exceeded (a principal's [quotas]: nothing was started)
    └── WorldError                   the world failed (a tool, the sandbox, the store)
        ├── ToolError                tool_error
        │   └── SourceUnavailable    source_unavailable
        ├── ToolsUnavailable         tools_unavailable
        ├── SandboxCrashed           sandbox_crashed
        ├── SnapshotTampered         snapshot_tampered
        ├── RunTampered              run_tampered
        ├── WrongSecret              wrong_secret
        ├── ExecutionDiverged        execution_diverged
        ├── WriteOutcomeUnknown      write_outcome_unknown
        ├── StoreError               store_error
        ├── RunQuarantined           run_quarantined (its attempts kept ending with their process gone, P-39)
        └── InvalidTransition        invalid_transition (not in the run state table: a bug)

Errors that happen *inside* a program (a tool that failed, a write that was
declined) reach the program as ordinary Python exceptions whose message starts
with ``[code]`` so the program can branch on it; the run's own error code is
decided by the host's record of what happened, never by text the program
produced.
"""

from __future__ import annotations

from typing import Any


class TetherError(Exception):
    """Base of every error tether raises on purpose."""

    code: str = "internal_error"
    next_action: str = "Report this as a bug in tether."

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        next_action: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if next_action is not None:
            self.next_action = next_action
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "next_action": self.next_action,
            "details": self.details,
        }

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


# --- you used it wrong -------------------------------------------------------


class UsageError(TetherError):
    code = "usage_error"
    next_action = "Fix the input and try again."


class ConfigError(UsageError):
    code = "config_invalid"
    next_action = "Fix the named key in the config file."


class CodeTooLarge(UsageError):
    code = "code_too_large"
    next_action = "Send a shorter program: move data into tool calls instead of literals."


class ProgramSyntaxError(UsageError):
    code = "syntax_error"
    next_action = "Fix the syntax at the given line and column; nothing was run."


class TypeCheckError(UsageError):
    code = "type_check_failed"
    next_action = "Fix the calls the checker names (use describe() for signatures); nothing was run."


class UnknownTool(UsageError):
    code = "unknown_tool"
    next_action = "Use search() to find the right address."


class InvalidArguments(UsageError):
    code = "invalid_arguments"
    next_action = "Call describe() on the tool and pass arguments matching its signature (by position or keyword)."


class RunNotFound(UsageError):
    code = "run_not_found"
    next_action = "Check the run id (tether runs list)."


class AlreadyDecided(UsageError):
    code = "already_decided"
    next_action = "The pending call was already decided; read the run with `tether runs show`."


class RunExpired(UsageError):
    code = "run_expired"
    next_action = "Start the program again; the paused run passed its time to live."


class NotPaused(UsageError):
    code = "not_paused"
    next_action = "Only a paused run can be resumed; read its status with `tether runs show`."


class SeqRequired(UsageError):
    """A decision that does not name its write, on a run that asked about more than one (P-28)."""

    code = "seq_required"
    next_action = "Name the write the decision is for: --seq N (CLI), seq=N (Python, MCP resume)."


class WriteNotPending(UsageError):
    """A decision naming a write the run does not wait on; details.pending lists those it does (P-28)."""

    code = "write_not_pending"
    next_action = "Decide a write the run waits on now: list them with `tether runs show RUN` (or rt.pending)."


class IdempotencyConflict(UsageError):
    """A run key already names a run started with another program, session or options (P-36).

    ``details.run_id`` names that run; nothing was started or sent for this request.
    """

    code = "idempotency_conflict"
    next_action = ("Use a new key for a different program; reuse a key only to retry the very same request "
                   "(read the named run with `tether runs show RUN`).")


class ApprovalElsewhere(UsageError):
    """An approve that arrived where a person cannot be told from the agent (docs/security.md).

    Nothing was decided and nothing was sent; the message says where a person approves.
    """

    code = "approval_elsewhere"
    next_action = ("Tell the user a write waits for their approval on the console or the approval link delivered "
                   "to them; you may still call resume with decision 'decline' or 'cancel'.")


# --- a limit stopped it ------------------------------------------------------


class LimitExceeded(TetherError):
    """A configured limit stopped the program. ``code`` names the limit."""

    code = "limit_exceeded"
    next_action = "Do less work per run, or raise the limit in [limits]."


class Overloaded(LimitExceeded):
    code = "overloaded"
    next_action = "Retry after retry_after_ms."


class QuotaExceeded(LimitExceeded):
    """A principal's [quotas] entry refused a start; ``details`` names the quota, its limit and the use."""

    code = "quota_exceeded"
    next_action = "Free some of what the quota counts, or ask the operator to raise it in [quotas]."


# --- the world failed --------------------------------------------------------


class WorldError(TetherError):
    code = "world_error"
    next_action = "Retry later; the failure was outside the program."


class ToolError(WorldError):
    code = "tool_error"
    next_action = "Read the tool's message; fix the arguments or retry if the failure was transient."


class SourceUnavailable(ToolError):
    """A configured source could not be started or reached, so its tools cannot be called."""

    code = "source_unavailable"
    next_action = "Read the source's error (`tether sources list`); nothing was sent to it."


class ToolsUnavailable(WorldError):
    """A run cannot continue here: sources it was started with cannot be loaded in this process.

    The run is left as it was (paused, waiting, queued or orphaned); nothing was sent.
    """

    code = "tools_unavailable"
    next_action = ("Make the named sources loadable here (commands installed, environment variables set, "
                   "servers up), then repeat the command; the run is unchanged and nothing was sent.")


class SandboxCrashed(WorldError):
    code = "sandbox_crashed"
    next_action = "The sandbox worker died; retry the run. Calls already made are in the journal."


class SnapshotTampered(WorldError):
    code = "snapshot_tampered"
    next_action = "The stored snapshot failed verification; nothing was resumed. Start the program again."


class RunTampered(WorldError):
    """A signed field of a run or its journal changed outside tether (P-35); ``details.fields`` names it."""

    code = "run_tampered"
    next_action = ("The run's stored state was changed outside tether; nothing was resumed or sent. Find out who "
                   "can write the store, then start the program again.")


class WrongSecret(WorldError):
    """The run was signed with a secret this process does not hold: not tampering, another key (P-35)."""

    code = "wrong_secret"
    next_action = ("This store was signed with another key: give this process the secret it was signed with "
                   "(TETHER_SECRET, or TETHER_SECRET_FILE listing old secrets after the current one).")


class ExecutionDiverged(WorldError):
    code = "execution_diverged"
    next_action = "Replay did not match the journal; nothing further was sent. Start the program again."


class WriteOutcomeUnknown(WorldError):
    code = "write_outcome_unknown"
    next_action = (
        "Check with the tool's owner whether the write happened before doing it again; "
        "tether will not re-send it."
    )


class StoreError(WorldError):
    code = "store_error"
    next_action = "Check the store (TETHER_HOME or [store] url) is reachable and writable."


class RunQuarantined(WorldError):
    code = "run_quarantined"
    next_action = ("Read details.attempts and the run's last calls (`tether runs show RUN`): find what the program "
                   "or a tool does that stops its process, fix it, then start the program again as a new run.")


class InvalidTransition(WorldError):
    """A transition the run state table does not list (tether._store.states) was refused; nothing was written."""

    code = "invalid_transition"
    next_action = "Report this as a bug in tether; the run was left as it was (tether runs show)."
