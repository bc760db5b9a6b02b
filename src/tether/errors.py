"""The error tree. Every failure tether reports carries a stable ``code``.

::

    TetherError                          internal_error (tether itself failed: a bug)
    ├── UsageError                       usage_error: you used tether wrong (bad input, bad config)
    │   ├── ConfigError                  config_invalid
    │   │   ├── NamespaceReserved        namespace_reserved
    │   │   ├── NamespaceTaken           namespace_taken
    │   │   └── ToolsInvalid             tools_invalid
    │   ├── CodeTooLarge                 code_too_large
    │   ├── ProgramSyntaxError           syntax_error
    │   ├── TypeCheckError               type_check_failed
    │   ├── UnknownTool                  unknown_tool
    │   ├── InvalidArguments             invalid_arguments
    │   ├── InvalidToolDefinition        invalid_tool_definition
    │   ├── DuplicateTool                duplicate_tool
    │   ├── SourceNotStarted             source_not_started
    │   ├── RunNotFound                  run_not_found
    │   ├── AlreadyDecided               already_decided
    │   ├── RunExpired                   run_expired
    │   ├── NotPaused                    not_paused
    │   ├── SeqRequired                  seq_required
    │   ├── WriteNotPending              write_not_pending
    │   ├── IdempotencyConflict          idempotency_conflict
    │   ├── ApprovalElsewhere            approval_elsewhere
    │   ├── ApprovalRefused              approval_refused
    │   │   ├── SignInRequired           sign_in_required
    │   │   ├── NotAnApprover            not_an_approver
    │   │   └── SelfApproval             self_approval
    │   ├── InvalidApproval              invalid_approval
    │   ├── Unauthenticated              unauthenticated
    │   ├── TokenRequired                token_required
    │   ├── TokenTooShort                token_too_short
    │   ├── TokenInvalid                 token_invalid
    │   ├── UnsafeBind                   unsafe_bind
    │   ├── ProgramFileNotFound          file_not_found
    │   └── ProgramNotUtf8               program_not_utf8
    ├── LimitExceeded                    limit_exceeded: a limit stopped the program
    │   ├── MemoryLimit                  memory_limit
    │   ├── TimeLimit                    time_limit
    │   ├── CallLimit                    call_limit
    │   ├── JournalLimit                 journal_limit
    │   ├── HostWorkTimeout              host_work_timeout
    │   ├── Overloaded                   overloaded
    │   └── QuotaExceeded                quota_exceeded (a principal's [quotas]: nothing was started)
    └── WorldError                       world_error: the world failed (a tool, the sandbox, the store)
        ├── ToolError                    tool_error
        │   └── SourceUnavailable        source_unavailable
        ├── ToolsUnavailable             tools_unavailable
        ├── SandboxCrashed               sandbox_crashed
        ├── SnapshotTampered             snapshot_tampered
        ├── RunTampered                  run_tampered
        ├── WrongSecret                  wrong_secret
        ├── ExecutionDiverged            execution_diverged
        ├── WriteOutcomeUnknown          write_outcome_unknown
        ├── StoreError                   store_error
        ├── RunQuarantined               run_quarantined (its attempts kept ending with their process gone, P-39)
        └── InvalidTransition            invalid_transition (not in the run state table: a bug)

Each code is one class and each class one code, so ``except InvalidArguments``
catches every ``invalid_arguments`` (tests/shape/test_errors_tree.py walks the tree
against every raise site and this list). The code is the class's: a raise site
chooses the class, never a code.

Errors that happen *inside* a program (a tool that failed, a write that was
declined) reach the program as ordinary Python exceptions whose message starts
with ``[code]`` so the program can branch on it; the run's own error code is
decided by the host's record of what happened, never by text the program
produced. Those in-program codes (``call_timeout``, ``budget_exceeded``,
``write_declined``, ``arguments_too_large`` …, tether._engine.attempt.envelopes) are
not classes here: no tether call raises them.
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
        next_action: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
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


class NamespaceReserved(ConfigError):
    """A source took a namespace tether keeps for itself; nothing was loaded under it."""

    code = "namespace_reserved"
    next_action = "Give the source another namespace in the config."


class NamespaceTaken(ConfigError):
    """Two sources asked for the same namespace; the second was not loaded."""

    code = "namespace_taken"
    next_action = "Give each source its own namespace in the config."


class ToolsInvalid(ConfigError):
    """A ``tools`` module named in the config (or ``--tools``) could not be used as one."""

    code = "tools_invalid"
    next_action = "Fix the named tools module: it must import and define tools."


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


class InvalidToolDefinition(UsageError):
    """A tool as defined in Python (a decorator, a signature, a schema) that tether cannot serve."""

    code = "invalid_tool_definition"
    next_action = "Fix the tool's definition as the message says; no tool of it was registered."


class DuplicateTool(UsageError):
    code = "duplicate_tool"
    next_action = "Give each tool its own address (rename one, or load its source under another namespace)."


class SourceNotStarted(UsageError):
    """A source's tools were used before the source was started (a bug in the embedding code)."""

    code = "source_not_started"
    next_action = "Start the source (await source.start()) before calling or listing its tools."


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


class ApprovalRefused(UsageError):
    """A decision this principal may not take; nothing was decided and nothing was sent."""

    code = "approval_refused"
    next_action = "Ask a person whose token may approve this run's writes to decide it."


class SignInRequired(ApprovalRefused):
    """A decision on an approval link, which needs a signed-in approver."""

    code = "sign_in_required"


class NotAnApprover(ApprovalRefused):
    """A token that may run programs but not approve writes."""

    code = "not_an_approver"


class SelfApproval(ApprovalRefused):
    """The principal that ran the program approving its own write, where the config says it may not."""

    code = "self_approval"


class InvalidApproval(UsageError):
    """An approval rule or answer (a callback's return, a form) that is not one tether understands."""

    code = "invalid_approval"
    next_action = "Return or send one of the answers the message lists."


class Unauthenticated(UsageError):
    code = "unauthenticated"
    next_action = "Send a token this server accepts (Authorization: Bearer ...)."


class TokenRequired(UsageError):
    """A server that listens beyond this machine (or gives approval links) without a token configured."""

    code = "token_required"
    next_action = "Set TETHER_TOKEN (or [auth] tokens) before serving beyond localhost."


class TokenTooShort(UsageError):
    code = "token_too_short"
    next_action = "Use a token of at least the length the message names (e.g. `openssl rand -hex 32`)."


class TokenInvalid(UsageError):
    code = "token_invalid"
    next_action = "Use a token of printable characters without spaces."


class UnsafeBind(UsageError):
    """A bind beyond localhost that the config did not allow."""

    code = "unsafe_bind"
    next_action = "Bind 127.0.0.1, or put a token and TLS in front and allow the bind as the message says."


class ProgramFileNotFound(UsageError):
    code = "file_not_found"
    next_action = "Pass the path of a Python file, or - for standard input."


class ProgramNotUtf8(UsageError):
    code = "program_not_utf8"
    next_action = "Save the program as UTF-8 (Python's own default) and run it again."


# --- a limit stopped it ------------------------------------------------------


class LimitExceeded(TetherError):
    """A configured limit stopped the program. ``code`` names the limit."""

    code = "limit_exceeded"
    next_action = "Do less work per run, or raise the limit in [limits]."


class MemoryLimit(LimitExceeded):
    code = "memory_limit"
    next_action = "Hold less in the program's variables at once, or raise limits.memory_bytes."


class TimeLimit(LimitExceeded):
    code = "time_limit"
    next_action = "Do less work per run, or raise limits.run_seconds."


class CallLimit(LimitExceeded):
    code = "call_limit"
    next_action = "Make fewer host calls per run (batch them), or raise limits.host_calls."


class JournalLimit(LimitExceeded):
    code = "journal_limit"
    next_action = "Ask tools for less (filter, page, reduce upstream), or raise limits.journal_bytes."


class HostWorkTimeout(LimitExceeded):
    """Host work for the program (search, describe, the pre-run check, stubs) ran past its time (tether._hostwork)."""

    code = "host_work_timeout"
    next_action = ("Ask for less at once (one address to describe(), a narrower search), or raise limits.run_seconds; "
                   "the same request will take as long again.")


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
