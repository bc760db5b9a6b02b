"""Drive one attempt of a run: build the sandbox, run or restore, record the end.

Kept apart from :mod:`runtime` so the lifecycle (execute/resume/recover) reads
on its own and this file holds the mechanics of one attempt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import json
import time
from typing import TYPE_CHECKING, Any

from ..errors import (
    ExecutionDiverged,
    LimitExceeded,
    RunTampered,
    SandboxCrashed,
    SnapshotTampered,
    TetherError,
    TypeCheckError,
    WriteOutcomeUnknown,
    WrongSecret,
)
from ..sandbox.monty import MONTY_VERSION, ProgramFailed, SandboxLimits, SandboxSpec, Stopped
from ..store.base import (
    CallRecord,
    RunRecord,
)
from ..store.states import CallState, RunStatus
from ..tools.precheck import EVERYTHING, Reach, check_program
from ..tools.stubs import stubs_for
from .boundary import (
    BUILTIN_OPS,
    SPENT_STATES,
    Approver,
    Cancelled,
    EffectBoundary,
    Parked,
    Paused,
    SnapshotMismatch,
)
from .integrity import sign_run, verify_calls
from .limits import Limits
from .policy import Policy
from .resend import resendable
from .result import RunResult, preview, to_json_value

if TYPE_CHECKING:
    from .runtime import Runtime

# Awaited built-ins the program reaches by bare name; emit is a plain call.
EMIT_BUDGET_BYTES = 4 * 1024 * 1024
BUILTINS = BUILTIN_OPS + ("wait_for", "wait_for_signal", "yield_control")
SYNC_BUILTINS = ("emit",)


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


def run_check_mode(rt: "Runtime", run: RunRecord) -> str:
    """The check mode recorded on the run (older runs recorded a type_check flag)."""
    mode = run.meta.get("check")
    if mode is None:
        return "full" if run.meta.get("type_check", rt.type_check) else "off"
    return mode


def precheck(rt: "Runtime", run: RunRecord) -> Reach:
    """The pre-run check of a fresh run (tools.precheck); raises what it finds, before any call.

    With the check off nothing is raised, but what the program reaches still
    decides how much of the `tools` module its sandbox gets.
    """
    if run_check_mode(rt, run) == "off":
        try:
            return check_program(run.program, rt.catalog)
        except TetherError:
            return EVERYTHING
    return check_program(run.program, rt.catalog)


def _namespaces(rt: "Runtime") -> dict[str, tuple[str, ...]]:
    def group() -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {}
        for tool in rt.catalog.tools():
            out.setdefault(tool.namespace, []).append(tool.name)
        return {ns: tuple(names) for ns, names in out.items()}

    memo = getattr(rt.catalog, "memo", None)
    return memo("sandbox-namespaces", group) if memo else group()


def build_spec(rt: "Runtime", run: RunRecord, limits: Limits, *, continuing: bool = False,
               reach: Reach | None = None) -> SandboxSpec:
    # A program that already passed the check at its first attempt is not
    # checked again when it continues (restore or replay).
    type_check = run_check_mode(rt, run) == "full" and not continuing
    stubs = None
    if continuing or run.session or reach is None:
        # A continuing program must find the module it started with, and a
        # session's globals may hold `tools` from an earlier execute.
        reach = EVERYTHING
    if type_check:
        stubs = stubs_for(rt.catalog, reach.addresses, reach.namespaces, reach.everything)
        if rt.verdicts.get(_verdict_key(run.program, stubs)) is True:
            # The same program against the same stubs passed before: the
            # checker would say the same again.
            type_check = False
    return SandboxSpec(
        namespaces=_namespaces(rt),
        builtins=BUILTINS,
        sync_builtins=SYNC_BUILTINS,
        limits=SandboxLimits(
            memory_bytes=limits.memory_bytes,
            run_seconds=limits.run_seconds,
            host_calls=limits.host_calls,
            recursion_depth=limits.recursion_depth,
        ),
        clock=_dt.datetime.fromisoformat(run.environment["clock"]),
        seed=int(run.environment["seed"]),
        type_check=type_check,
        prelude_stubs=getattr(stubs, "prelude", None),
        tools_stubs=getattr(stubs, "tools_module", None),
        namespace_stubs=dict(getattr(stubs, "namespace_modules", {}) or {}),
        modules_key=(id(rt.catalog), getattr(rt.catalog, "version", None)),
        reach=None if reach.everything else (reach.addresses, reach.namespaces),
    )


def _verdict_key(code: str, stubs: Any) -> str:
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for part in (code, stubs.prelude, stubs.tools_module, *sorted(stubs.namespace_modules.items())):
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def remember_verdict(rt: "Runtime", spec: SandboxSpec, code: str, passed: bool) -> None:
    """Record that the checker passed (or refused) this program against these stubs."""
    from ..tools.stubs import Stubs

    if not spec.type_check:
        return
    stubs = Stubs(prelude=spec.prelude_stubs or "", tools_module=spec.tools_stubs or "",
                  namespace_modules=spec.namespace_stubs, tool_stubs={})
    verdicts = rt.verdicts
    verdicts[_verdict_key(code, stubs)] = passed
    if len(verdicts) > 1024:
        verdicts.pop(next(iter(verdicts)))


def _builtins(rt: "Runtime", run_id: str) -> dict[str, Any]:
    async def search(args: tuple, kwargs: dict) -> Any:
        query = args[0] if args else kwargs.pop("query", "")
        return rt.search(query, **kwargs)

    async def describe(args: tuple, kwargs: dict) -> Any:
        target = args[0] if args else kwargs.get("address", kwargs.get("addresses", []))
        detail = args[1] if len(args) > 1 else kwargs.get("detail", "default")
        return rt.describe(target, detail=detail)

    async def sources(args: tuple, kwargs: dict) -> Any:
        return rt.sources()

    async def yield_control(args: tuple, kwargs: dict) -> Any:
        # Journaled like any call, so a replay does not yield twice.
        rt.event(run_id, "yielded", {})
        return None

    return {"search": _guarded(search), "describe": _guarded(describe), "sources": _guarded(sources),
            "yield_control": _guarded(yield_control)}


class Emitter:
    """emit(value): an output event, stored at once so any process can stream it (P-20).

    A replay re-runs the program from its first line; the outputs it already
    stored are not stored again.
    """

    def __init__(self, rt: "Runtime", run_id: str, skip: int, budget: int) -> None:
        self.rt, self.run_id, self.skip, self.budget = rt, run_id, skip, budget
        self.count = 0

    def __call__(self, name: str, args: tuple, kwargs: dict) -> Any:
        from ..sandbox.monty import GuestRaise

        if name != "emit":
            raise GuestRaise("NameError", f"name {name!r} is not defined")
        if len(args) + len(kwargs) != 1:
            raise GuestRaise("TypeError", "[invalid_arguments] emit takes one value: emit(value)")
        value = args[0] if args else next(iter(kwargs.values()))
        self.count += 1
        if self.count <= self.skip:
            return None
        value, notes = to_json_value(value)
        size = len(json.dumps(value, ensure_ascii=False).encode())
        if size > self.budget:
            value = {"type": "text", "text": f"[output of {size} bytes dropped: over the {self.budget}-byte budget]"}
        else:
            self.budget -= size
        self.rt.event(self.run_id, "output", {"value": value, "n": self.count})
        return None


def _guarded(fn: Any) -> Any:
    from ..sandbox.monty import GuestRaise

    async def call(args: tuple, kwargs: dict) -> Any:
        try:
            return await fn(args, dict(kwargs))
        except TypeError as exc:
            raise GuestRaise("TypeError", f"[invalid_arguments] {exc}") from None
        except TetherError as exc:
            raise GuestRaise("ValueError", f"[{exc.code}] {exc.message}") from None

    return call


async def drive(rt: "Runtime", run: RunRecord, *, mode: str, on_approval: Approver | None, t0: float,
                on_progress: Any = None, on_question: Any = None, span: Any = None) -> RunResult:
    """One attempt. ``mode`` is "fresh" or "continue" (restore, else replay)."""
    try:
        return await _drive(rt, run, mode=mode, on_approval=on_approval, t0=t0, on_progress=on_progress,
                            on_question=on_question, span=span)
    except (RunTampered, SnapshotTampered, WrongSecret) as exc:
        # P-35: refused before anything was sent; the run ends here instead of staying running.
        rt.revoke_waits(run_id=run.run_id)
        return rt._finish(run, RunStatus.FAILED, error=exc.to_dict())


async def _drive(rt: "Runtime", run: RunRecord, *, mode: str, on_approval: Approver | None, t0: float,
                 on_progress: Any, on_question: Any, span: Any) -> RunResult:
    rt.verify_run(run)
    limits = Limits.from_dict(run.limits)
    policy = Policy.from_dict(run.policy)
    stuck = rt.store.get_calls(run.run_id, states=[CallState.SENDING]) if mode != "fresh" else []
    verify_calls(rt.keyring, run.run_id, stuck)

    # P-11: a write left `sending` by a dead attempt is never re-sent, unless
    # its tool dedupes by idempotency key and has sends left (P-31): then the
    # program's call is re-sent with its recorded key when the run reaches it.
    for e in stuck:
        if e.state == CallState.SENDING and resendable(rt.catalog, e, limits) is None:
            rt.update_call_signed(e, [CallState.SENDING], state="unknown", finished_at=rt.clock(),
                                  error={"type": "TimeoutError",
                                         "message": f"[write_outcome_unknown] {e.address} may or may not have happened"})
            sent = (f" (sent {e.sends} times with idempotency key {e.idempotency_key})"
                    if e.sends > 1 and e.idempotency_key else "")
            err = WriteOutcomeUnknown(
                f"the write {e.address} (call {e.seq}) was being sent{sent} when the run's process stopped; whether "
                "it happened is unknown and it was not sent again",
                details={"seq": e.seq, "address": e.address, "args": e.args},
            )
            return rt._finish(run, RunStatus.FAILED, error=err.to_dict(), calls=e.seq)

    snapshot = None
    entries: list[CallRecord] = []
    writes_spent = None
    if mode != "fresh":
        snapshot = rt.store.latest_snapshot(run.run_id)
        if snapshot is not None:
            rt.verify_snapshot(snapshot)  # raises SnapshotTampered: refuse, do not replay past a forgery
            if snapshot.monty_version != MONTY_VERSION:
                snapshot = None  # another build cannot load it: replay from the journal (P-12)
        if snapshot is not None:
            # A restore never re-issues calls before its snapshot: read only the
            # calls it waits on and those after, so resuming does not slow down
            # with the length of the journal.
            low = min([p["seq"] for p in snapshot.pending] + [snapshot.seq + 1])
            # One entry more than needed: the first one's MAC chains to it.
            entries = rt.store.get_calls(run.run_id, after=low - 2)
            writes_spent = rt.store.count_calls(run.run_id, kind="write", states=SPENT_STATES)
        else:
            entries = rt.store.get_calls(run.run_id)
        verify_calls(rt.keyring, run.run_id, entries)

    t_setup = time.perf_counter()
    reach, refused = None, None
    if mode == "fresh":
        try:
            reach = precheck(rt, run)
        except TetherError as exc:
            refused = exc  # reported below, before the sandbox starts: nothing runs
    spec = build_spec(rt, run, limits, continuing=mode != "fresh", reach=reach)
    logs = LogBuffer(limits.log_bytes)
    if snapshot is not None and isinstance(run.result, dict):
        # A restore continues the program where it stopped: keep what it
        # printed before. A replay prints it all again by itself.
        for line in run.result.get("logs", []):
            logs("stdout", line + "\n")

    async def pause_sink(boundary: EffectBoundary, pending: dict[str, Any]) -> None:
        boundary.flush()
        st = boundary.state
        data = await boundary.execution.dump()
        if st.answering and st.restore_pending is not None:
            waits_on = list(st.restore_pending)
        else:
            waits_on = [pending_call(pending)] + list(st.held)
        waits_on.sort(key=lambda c: c["seq"])
        rt.store.put_snapshot(rt.snapshot_record(run.run_id, st.issued, data, waits_on, "pause"))
        now = rt.clock()
        if "kind" in pending:  # parked on a wait, a signal or a timer (P-18)
            public = {k: pending[k] for k in ("kind", "seq", "name", "key", "deadline")}
            envelope = waiting_envelope(run.run_id, public, logs, boundary, t0)
            status, expires = RunStatus.WAITING, pending["deadline"]
        else:
            expires = now + rt.approval_ttl_seconds
            writes = []
            for w in pending.get("writes") or [pending]:
                one = {k: w[k] for k in ("seq", "address", "args", "annotations")}
                # A paused write is also a durable wait (P-18): its key resolves it
                # like resume() does, from anywhere that holds the key.
                one["key"] = rt.approval_wait(run, w["seq"], expires)
                writes.append(one)
            # The first write at the top level, as before batches; every write
            # of the pause, that one included, under "writes" (P-27).
            public = {**next(w for w in writes if w["seq"] == pending["seq"]), "writes": writes}
            envelope = paused_envelope(run.run_id, public, expires, logs, boundary, t0)
            status = RunStatus.PAUSED
        # The run's MAC covers what it waits on (P-35).
        signed = sign_run(rt.keyring, dataclasses.replace(run, pending=public, expires_at=expires))
        rt.store.update_run(run.run_id, [RunStatus.RUNNING], status=status, pending=public, expires_at=expires,
                            owner=None, lease_until=None, updated_at=now, decision=None,
                            result=envelope.to_dict(), mac=signed)
        rt.event(run.run_id, "paused" if status == RunStatus.PAUSED else "waiting", {"pending": public})
        rt.announce(run.run_id, status, {"pending": public, "expires_at": expires})
        boundary.paused_envelope = envelope

    async def checkpoint_sink(boundary: EffectBoundary, entry: CallRecord) -> None:
        st = boundary.state
        now = rt.clock()
        if (st.issued - st.checkpoint_at_seq < rt.checkpoint_every_calls
                and now - (st.checkpoint_at_time or run.created_at) < rt.checkpoint_every_seconds):
            return
        boundary.flush()
        data = await boundary.execution.dump()
        st.checkpoint_at_seq, st.checkpoint_at_time = st.issued, now
        rt.store.put_snapshot(rt.snapshot_record(
            run.run_id, st.issued, data,
            [{"seq": entry.seq, "op": entry.op, "address": entry.address, "args": entry.args}], "checkpoint"))
        rt.store.update_run(run.run_id, [RunStatus.RUNNING], lease_until=now + rt.lease_seconds, updated_at=now)

    boundary = EffectBoundary(
        run_id=run.run_id,
        store=rt.store,
        catalog=rt.catalog,
        policy=policy,
        limits=limits,
        journal_entries=entries,
        writes_spent=writes_spent,
        on_approval=on_approval,
        builtins_impl=_builtins(rt, run.run_id),
        pause_sink=pause_sink,
        checkpoint_sink=checkpoint_sink,
        clock=rt.clock,
    )
    boundary.paused_envelope = None
    boundary.on_progress = on_progress
    boundary.on_question = on_question
    boundary.span = span
    boundary.secret = rt._secret
    boundary.keyring = rt.keyring
    boundary.session = run.session
    boundary.inline_sleep_seconds = rt.inline_sleep_seconds
    boundary.journaled_bytes = rt.store.journal_bytes(run.run_id) if mode != "fresh" else 0
    boundary.pauses.batch_window_seconds = rt.batch_window_seconds
    rt._boundaries[run.run_id] = boundary
    heartbeat = asyncio.ensure_future(_heartbeat(rt, run.run_id, boundary))
    setup_ms = (time.perf_counter() - t_setup) * 1000
    t_exec = time.perf_counter()
    attempt_kind = "fresh" if mode == "fresh" else ("restore" if snapshot is not None else "replay")
    already_emitted = 0
    if mode != "fresh":
        already_emitted = sum(1 for e in rt.store.get_events(run.run_id, limit=100_000) if e.type == "output")
    # One output budget per run: images and large values are cut, not dropped silently.
    emitter = Emitter(rt, run.run_id, 0, EMIT_BUDGET_BYTES)

    session_base = session_state_at_start(rt, run) if run.session else None

    async def run_once(kind: str) -> Any:
        # A restore continues past earlier emits; a replay repeats them.
        emitter.count, emitter.skip = (already_emitted, 0) if kind == "restore" else (0, already_emitted)
        async with rt.pool.execution(spec, boundary.host, logs, emitter) as execution:
            boundary.execution = execution
            try:
                if kind == "restore":
                    boundary.state.issued = snapshot.seq
                    boundary.state.restore_pending = list(snapshot.pending)
                    value = await execution.resume(snapshot.data, boundary.answer_restored)
                else:
                    try:
                        value = await execution.run(run.program, session_base)
                    except TypeCheckError:
                        remember_verdict(rt, spec, run.program, False)
                        raise
                    except (ProgramFailed, Stopped, LimitExceeded):
                        remember_verdict(rt, spec, run.program, True)  # it ran: the check passed
                        raise
                    remember_verdict(rt, spec, run.program, True)
                if run.session:
                    # The globals the next execute of this session starts from (P-21).
                    rt._save_session(run.session, run.principal, await execution.dump())
                return value
            finally:
                boundary.release_held()
                await boundary.drain()
                boundary.flush()

    try:
        try:
            if refused is not None:
                raise refused
            value = await run_once(attempt_kind)
        except SnapshotMismatch:
            # Nothing was sent: the mapping is checked before any dispatch.
            attempt_kind = "replay"
            boundary.reset_for_replay(rt.store.get_calls(run.run_id))
            logs.__init__(limits.log_bytes)
            value = await run_once("replay")
    except (Paused, Parked):
        return boundary.paused_envelope
    except Cancelled as exc:
        rt._settle_waits_cancelled(run.run_id)
        return rt._finish(run, RunStatus.CANCELLED, error={"code": "cancelled", "message": exc.reason,
                                                   "next_action": "Start a new run if the work is still needed.",
                                                   "details": {}},
                          logs=logs.lines(), calls=boundary.state.issued,
                          diagnostics=_diagnostics(boundary, setup_ms, t_exec, t0, attempt_kind))
    except (TetherError, ProgramFailed, Stopped) as exc:
        failure = boundary.state.failure if isinstance(exc, Stopped) and boundary.state.failure else exc
        return _failed(rt, run, boundary, failure, logs, setup_ms, t_exec, t0, attempt_kind)
    finally:
        heartbeat.cancel()
        rt._boundaries.pop(run.run_id, None)

    if boundary.state.failure is not None:
        return _failed(rt, run, boundary, boundary.state.failure, logs, setup_ms, t_exec, t0, attempt_kind)
    # P-13: a write the journal holds beyond what the program issued means
    # the replay took another path; report it, send nothing more.
    extra = [e for s, e in boundary.journal.items() if s > boundary.state.issued and e.kind == "write"
             and e.state in (CallState.APPROVED, CallState.SENDING, CallState.SENT)]
    if extra:
        err = ExecutionDiverged(
            f"the replay finished without repeating the recorded write {extra[0].address} (call {extra[0].seq})",
            details={"seq": extra[0].seq})
        return _failed(rt, run, boundary, err, logs, setup_ms, t_exec, t0, attempt_kind)

    result, notes = to_json_value(value)
    result, cut = preview(result, limits.result_bytes)
    if cut:
        notes.append(
            f"result truncated: {cut['kept_bytes']} of {cut['original_bytes']} bytes kept; the "
            f"{boundary.state.issued} calls this run made were made and are journaled (tether runs show {run.run_id})"
        )
    for address, changes in boundary.state.conversions.items():
        notes.append(f"results of {address} were converted to JSON: {'; '.join(changes[:5])}")
    if boundary.state.unknown_writes:
        notes.append("writes with unknown outcome (not re-sent): "
                     + ", ".join(f"{w['address']} (call {w['seq']})" for w in boundary.state.unknown_writes))
    diag = _diagnostics(boundary, setup_ms, t_exec, t0, attempt_kind)
    if cut:
        diag["result_truncated"] = cut
    return rt._finish(run, RunStatus.COMPLETED, result=result, logs=logs.lines(), calls=boundary.state.issued,
                      diagnostics=diag, notes=notes)


def session_state_at_start(rt: "Runtime", run: RunRecord) -> bytes | None:
    """The session globals this run started from, recorded on the run so a replay starts there too."""
    import base64

    base = (run.meta or {}).get("session_base")
    if not base:
        return None
    data = base64.b64decode(base["data"])
    if base.get("monty_version") != MONTY_VERSION:
        return None
    rt.verify_session_blob(run.session, run.principal, data, base["mac"])
    return data


def pending_call(pending: dict[str, Any]) -> dict[str, Any]:
    return {"seq": pending["seq"], "op": pending["op"], "address": pending["address"], "args": pending["args"]}


def paused_envelope(run_id: str, pending: dict, expires: float, logs: LogBuffer, boundary: EffectBoundary,
                    t0: float) -> RunResult:
    return RunResult(
        status=RunStatus.PAUSED,
        run_id=run_id,
        logs=logs.lines(),
        calls=boundary.state.issued,
        pending=pending,
        expires_at=expires,
        instructions=pause_instructions(run_id, pending),
        diagnostics={"calls": boundary.state.issued, "total_ms": round((time.perf_counter() - t0) * 1000, 3)},
    )


def pause_instructions(run_id: str, pending: dict) -> str:
    """What to do with a paused run, naming each write by its seq (P-27, P-28)."""
    writes = pending.get("writes") or [pending]

    def show(w: dict) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in (w.get("args") or {}).items())
        if len(args) > 600:  # instructions are read; the arguments are whole in `pending`
            args = args[:600] + "…"
        return f"call {w['seq']} {w['address']}({args})"

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


def waiting_envelope(run_id: str, pending: dict, logs: LogBuffer, boundary: EffectBoundary, t0: float) -> RunResult:
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


def _failed(rt, run, boundary, exc, logs, setup_ms, t_exec, t0, attempt_kind) -> RunResult:
    if isinstance(exc, ProgramFailed):
        text = f"{exc.exc_type}: {exc.message}"
        where = f" (line {exc.line})" if exc.line else ""
        # P-14: the code comes from the host's own record of what it raised
        # into the program, never from text the program made up.
        raised = boundary.state.raised.get(exc.message)
        if raised is not None and raised.exc_type == exc.exc_type:
            error = {
                "code": raised.code,
                "message": f"call {raised.seq} ({raised.address}) failed and the program did not catch it{where}: "
                           f"{exc.message}",
                "next_action": _CALL_HINTS.get(raised.code, "Handle the failure in the program (try/except on "
                                                            "the [code]) or fix the call; calls already made are "
                                                            "in the journal."),
                "details": {"type": exc.exc_type, "call": {"seq": raised.seq, "address": raised.address},
                            "traceback": exc.traceback},
            }
        else:
            sandbox_code, hint = _classify(rt, exc)
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
    return rt._finish(run, RunStatus.FAILED, error=error, logs=logs.lines(), calls=boundary.state.issued,
                      diagnostics=_diagnostics(boundary, setup_ms, t_exec, t0, attempt_kind))


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


def _classify(rt: "Runtime", exc: ProgramFailed) -> tuple[str | None, str | None]:
    """Name what the sandbox itself refused, so the model knows what to write instead."""
    msg = exc.message
    if exc.exc_type == "AttributeError" and msg.startswith("module 'tools"):
        # module 'tools.ns' has no attribute 'x' / module 'tools' has no attribute 'ns'
        parts = msg.split("'")
        if len(parts) >= 4:
            module, attr = parts[1], parts[3]
            address = (module[len("tools."):] + "." + attr) if module.startswith("tools.") else attr
            failed = rt.source_set.failures() if rt.source_set is not None else {}
            namespace = address.split(".", 1)[0]
            if namespace in failed:
                # Configured but not loaded: the tool may well exist; its source is what failed.
                return "source_unavailable", (f"The source {namespace!r} failed to load ({failed[namespace]}); "
                                              "nothing was sent to it. Fix the source or use another tool.")
            suggestions = rt.catalog.suggest(address) if hasattr(rt.catalog, "suggest") else []
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


def _diagnostics(boundary: EffectBoundary, setup_ms: float, t_exec: float, t0: float, attempt: str) -> dict[str, Any]:
    now = time.perf_counter()
    stats = boundary.state.stats
    return {
        "attempt": attempt,
        "setup_ms": round(setup_ms, 3),
        "execution_ms": round((now - t_exec) * 1000, 3),
        "total_ms": round((now - t0) * 1000, 3),
        "host_ms": round(boundary.state.host_seconds * 1000, 3),
        "calls": len(stats),
        "writes": sum(1 for s in stats if s.kind == "write"),
        "per_call": [
            {"seq": s.seq, "op": s.op, "address": s.address, "state": s.state, "ms": round(s.ms, 3),
             "start_ms": round(s.started * 1000, 3), "end_ms": round(s.ended * 1000, 3)}
            for s in stats
        ],
    }


async def _heartbeat(rt: "Runtime", run_id: str, boundary: EffectBoundary) -> None:
    """Keep this process's lease on the run while the attempt lives; see cancel requests."""
    interval = max(rt.lease_seconds / 3, 0.05)
    while True:
        await asyncio.sleep(interval)
        now = rt.clock()
        rt.store.update_run(run_id, [RunStatus.RUNNING], lease_until=now + rt.lease_seconds)
        run = rt.store.get_run(run_id)
        reason = (run.meta or {}).get("cancel_requested") if run else None
        if reason and boundary.execution is not None:
            boundary.execution.stop(Cancelled(reason))
            boundary.release_held()
