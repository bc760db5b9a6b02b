"""A run's envelopes as an attempt ends or stops: paused, waiting, failed; and its diagnostics.

Pure: they read the attempt's state and return values; recording them is
the attempt's job (driver.py) and the finisher's (finish.py).
"""

from __future__ import annotations

import ast
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol

from tether._engine.attempt.redaction import shown_args
from tether._engine.attempt.result import RunResult
from tether._engine.attempt.state import CallStat
from tether._sandbox.monty import LEFT_BEHIND_MESSAGE, ProgramFailed
from tether._store.states import RunStatus
from tether._tools.shown import show_call
from tether.errors import SandboxCrashed, TetherError

if TYPE_CHECKING:
    from tether._engine.attempt.state import AttemptState
    from tether._tools.catalog import Catalog


class Attempted(Protocol):
    """What an envelope reads of the attempt's boundary: its state and catalog (the boundary imports
    what stops it, which builds envelopes, so an envelope names this and not the boundary)."""

    @property
    def state(self) -> AttemptState: ...

    @property
    def catalog(self) -> Catalog: ...


class LogBuffer:

    """print() output, capped at ``limit`` bytes; what is dropped is counted."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.dropped = 0

    def __call__(self, stream: str, text: str) -> None:
        n = len(text.encode())
        if self.size + n > self.limit:
            room = max(0, self.limit - self.size)
            if room:
                self.parts.append(text.encode()[:room].decode("utf-8", "ignore"))
                self.size += room
            self.dropped += n - room
            return
        self.parts.append(text)
        self.size += n

    def lines(self) -> list[str]:
        text = "".join(self.parts)
        out = text.splitlines()
        if self.dropped:
            out.append(f"[logs truncated: {self.dropped} bytes dropped over the {self.limit}-byte limit]")
        return out


def paused_envelope(run_id: str, pending: dict[str, Any], expires: float, logs: LogBuffer, boundary: Attempted,
                    t0: float) -> RunResult:
    return RunResult(
        status=RunStatus.PAUSED,
        run_id=run_id,
        logs=logs.lines(),
        calls=boundary.state.issued,
        pending=pending,
        expires_at=expires,
        instructions=pause_instructions(run_id, pending, tool_schemas(boundary.catalog)),
        diagnostics={"calls": boundary.state.issued, "total_ms": round((time.perf_counter() - t0) * 1000, 3)},
    )


def tool_schemas(catalog: Any) -> Callable[[str], Any]:
    def schema(address: str) -> Any:
        # A tool's format: password / writeOnly fields are secrets (_tools/shown.py); unknown: names alone.
        return catalog.get(address).input_schema if address in catalog else None

    return schema


def pause_instructions(run_id: str, pending: dict[str, Any], schema: Callable[[str], Any] | None = None) -> str:
    """What to do with a paused run, naming each write by its seq (P-27, P-28).

    ``schema`` gives a tool's input schema by address, so the fields it marks secret are redacted too.
    """
    writes = pending.get("writes") or [pending]

    def show(w: dict[str, Any]) -> str:
        # Instructions are read: every argument named, the values sharing 600 characters, escaped and
        # secrets hidden (_tools/shown.py, and the names the pause recorded); the arguments are whole in `pending`.
        address = str(w["address"])
        return f"call {w['seq']} " + show_call(address, shown_args(w), budget=600 // len(writes),
                                               schema=schema(address) if schema else None).line()

    if len(writes) == 1:
        head = f"The program paused before the write {show(writes[0])}; nothing has been sent. "
    else:
        head = (f"The program paused before {len(writes)} writes issued together: "
                + "; ".join(show(w) for w in writes) + ". Nothing has been sent. ")
    return head + (
        f"Ask the user to approve or decline each, then resume run {run_id} naming the write by its seq, with "
        "decision 'approve', 'decline' (the program gets a PermissionError) or 'cancel' (the run stops); "
        "the run continues once every write of the pause is decided. "
        "Whoever holds a write's key may instead resolve it with {\"decision\": ...}."
    )


def waiting_envelope(run_id: str, pending: dict[str, Any], logs: LogBuffer, boundary: Attempted, t0: float) -> RunResult:
    kind = pending["kind"]
    if kind == "sleep":
        text = "The program sleeps; the run holds no worker and continues after its deadline."
    elif kind == "signal":
        text = (f"The program waits for the signal {pending['name'][len('signal:'):]!r}: "
                f"tether runs signal {run_id} NAME JSON")
    else:
        text = (f"The program waits for {pending['name']!r}; resolve it with its key: "
                f"tether waits resolve KEY --value JSON")
    return RunResult(status=RunStatus.WAITING, run_id=run_id, logs=logs.lines(), calls=boundary.state.issued,
                     pending=pending, expires_at=pending.get("deadline"), instructions=text,
                     diagnostics={"calls": boundary.state.issued,
                                  "total_ms": round((time.perf_counter() - t0) * 1000, 3)})


# What the sandbox's refusals are classified with: the sources that failed to load, and near addresses.
SourceFailures = Callable[[], dict[str, str]]
Suggest = Callable[[str], list[str]]


def failure_error(exc: BaseException, boundary: Attempted, failures: SourceFailures,
                  suggest: Suggest) -> dict[str, Any]:
    """The error of a run that failed with ``exc``: the call it came from (P-14), else what the program did."""
    if isinstance(exc, ProgramFailed):
        text = f"{exc.exc_type}: {exc.message}"
        where = f" (line {exc.line})" if exc.line else ""
        # P-14: the code comes from the host's own record of what it raised
        # into the program, never from text the program made up.
        message = _unquoted(exc) or exc.message
        raised = boundary.state.raised.get(message)
        if raised is not None and raised.exc_type == exc.exc_type:
            error = {
                "code": raised.code,
                "message": f"call {raised.seq} ({raised.address}) failed and the program did not catch it{where}: "
                           f"{message}",
                "next_action": _CALL_HINTS.get(raised.code, "Handle the failure in the program (try/except on "
                                                            "the [code]) or fix the call; calls already made are "
                                                            "in the journal."),
                "details": {"type": exc.exc_type, "call": {"seq": raised.seq, "address": raised.address},
                            "traceback": exc.traceback},
            }
        else:
            sandbox_code, hint = classify(exc, failures, suggest)
            error = {
                "code": sandbox_code or "program_error",
                "message": f"the program raised {_cap(text)}{where}",
                "next_action": hint or "Fix the program or handle the exception; calls already made are in the journal.",
                "details": {"type": exc.exc_type, "traceback": exc.traceback},
            }
    elif isinstance(exc, TetherError):
        error = exc.to_dict()
    else:
        error = SandboxCrashed(f"the run stopped: {exc}").to_dict()
    return error


def _unquoted(exc: ProgramFailed) -> str | None:
    """A KeyError's message as raised: str(KeyError(m)) is repr(m), quotes and escapes added."""
    if exc.exc_type != "KeyError" or exc.message[:1] not in ("'", '"'):
        return None
    try:
        found = ast.literal_eval(exc.message)
    except (ValueError, SyntaxError):
        return None
    return found if isinstance(found, str) else None


# What to do about a call's failure that ended the program, by its code.
_CALL_HINTS = {
    "tool_error": "Read the tool's message; fix the arguments, retry if it was transient, or catch it "
                  "(except Exception as e: the message starts with [tool_error]).",
    "invalid_arguments": "Call describe() on the tool and pass arguments matching its signature.",
    "unknown_tool": "Use search() to find the right address.",
    "call_timeout": "The tool was too slow; retry, ask for less, or raise limits.call_timeout_seconds.",
    "write_declined": "The user declined the write; it was not sent. Catch PermissionError to go on without it.",
    "write_denied": "Policy denies this write; it was not sent. Do without it or ask for the policy to change.",
    "call_denied": "Policy denies this tool; it was not called.",
    "budget_exceeded": "The run's write budget is spent; split the work into several runs.",
    "write_outcome_unknown": "Check whether the write happened before doing it again; tether will not re-send it.",
    "sleep_too_long": "Sleep at most limits.max_sleep_seconds, or raise it in [limits].",
}


# An error message is read by a model: past this it is data, not a reason.
MAX_ERROR_MESSAGE_CHARS = 2000


def _cap(text: str) -> str:
    if len(text) <= MAX_ERROR_MESSAGE_CHARS:
        return text
    return f"{text[:MAX_ERROR_MESSAGE_CHARS]}… [{len(text) - MAX_ERROR_MESSAGE_CHARS} characters cut]"


def classify(exc: ProgramFailed, failures: SourceFailures, suggest: Suggest) -> tuple[str | None, str | None]:
    """Name what the sandbox itself refused, so the model knows what to write instead."""
    if exc.raised:
        return None, None  # the program's own raise: what it says is the program's, not the sandbox's (P-14)
    msg = exc.message
    if exc.exc_type == "AttributeError" and msg.startswith("module 'tools"):
        # module 'tools.ns' has no attribute 'x' / module 'tools' has no attribute 'ns'
        parts = msg.split("'")
        if len(parts) >= 4:
            module, attr = parts[1], parts[3]
            address = (module[len("tools."):] + "." + attr) if module.startswith("tools.") else attr
            failed = failures()
            namespace = address.split(".", 1)[0]
            if namespace in failed:
                # Configured but not loaded: the tool may well exist; its source is what failed.
                return "source_unavailable", (f"The source {namespace!r} failed to load ({failed[namespace]}); "
                                              "nothing was sent to it. Fix the source or use another tool.")
            suggestions = suggest(address)
            hint = "Use search() to find the right address"
            if suggestions:
                hint += f"; did you mean {', '.join(suggestions[:3])}?"
            return "unknown_tool", hint + "."
    if exc.exc_type == "ModuleNotFoundError":
        return "module_unavailable", ("That module is not available in the sandbox; tools are the way to reach "
                                      "the outside world (import tools).")
    if "not supported in this environment" in msg or (exc.exc_type == "PermissionError" and "Permission denied" in msg):
        return "sandbox_denied", ("The sandbox has no files, environment, network or processes; use a tool "
                                  "for that.")
    if exc.message == LEFT_BEHIND_MESSAGE:
        return "task_left_behind", ("Await each task or call in the execute that starts it (or gather them); "
                                    "start the work again here if it is still needed.")
    if exc.exc_type == "RecursionError":
        return "recursion_limit", "Recurse less deeply, or iterate instead."
    if exc.exc_type == "NotImplementedError" and "cannot suspend in this synchronous context" in msg:
        # Monty issues a host call when the function is called; map(), sorted() and
        # the like call it from native code, which cannot wait. The program's own
        # error (nothing was sent), but the model needs the idiom that works.
        return None, ("A tool was called from inside map(), filter(), sorted() or another built-in, which cannot "
                      "wait for it; nothing was sent by that call. Call it in a comprehension or a loop instead: "
                      "await asyncio.gather(*[f(x) for x in xs]).")
    return None, None


def diagnostics(boundary: Attempted, setup_ms: float, t_exec: float, t0: float, attempt: str) -> dict[str, Any]:
    now = time.perf_counter()
    began = boundary.state.t0
    stats = [CallStat(*s) for s in boundary.state.stats]
    return {
        "attempt": attempt,
        "setup_ms": round(setup_ms, 3),
        "execution_ms": round((now - t_exec) * 1000, 3),
        "total_ms": round((now - t0) * 1000, 3),
        "host_ms": round(boundary.state.host_seconds * 1000, 3),
        "calls": len(stats),
        "writes": sum(1 for s in stats if s.kind == "write"),
        "per_call": [
            {"seq": s.seq, "op": s.op, "address": s.address, "state": s.state, "ms": round((s.ended - s.began) * 1000, 3),
             "start_ms": round((s.began - began) * 1000, 3), "end_ms": round((s.ended - began) * 1000, 3)}
            for s in stats
        ],
    }
