"""Starting runs and their attempts in this process: the one start path every caller goes through.

``begin`` records a new run (running, owned here) and launches its first
attempt; ``start`` queues one for a worker; ``launch`` starts an attempt of a
run this process owns (created running, claimed, woken or taken over) and
returns its :class:`RunHandle` at once. ``wake`` continues a parked run,
``rejoin`` answers a repeated keyed request with the run its key names
(P-36). Waiting for a run is ``Engine.wait_for_run``.

Each function takes the :class:`~tether._engine.engine.Engine`; none takes the runtime.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
import secrets
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tether._engine.approvals import service as approvals
from tether._engine.attempt.driver import Attempt
from tether._engine.attempt.handle import RunHandle
from tether._engine.attempt.inputs import check_code_size, check_session_name
from tether._engine.attempt.result import RunResult
from tether._engine.engine import NO_HOOKS, Hooks
from tether._engine.integrity import sign_run, verify_run
from tether._engine.lineage import words
from tether._engine.ownership import owner_gone
from tether._engine.rollback import runner as rollback
from tether._engine.rules import policy as policy_mod
from tether._engine.rules import run_keys
from tether._engine.rules.quarantine import continue_or_quarantine
from tether._engine.rules.quotas import check_run_start
from tether._engine.rules.run_keys import check_run_key, current_envelope, still_running
from tether._engine.waits import same_wait
from tether._store.base import LOCAL_PRINCIPAL, Conflict, RunRecord
from tether._store.states import TERMINAL_RUN_STATUSES, RunStatus, WaitStatus
from tether.errors import RunTampered, ToolsUnavailable, WrongSecret

if TYPE_CHECKING:
    from tether._engine.engine import Engine

# -- new runs -----------------------------------------------------------------------


async def begin(engine: Engine, code: str, *, check: str, hooks: Hooks = NO_HOOKS, principal: str | None = None,
                meta: dict[str, Any] | None = None, session: str | None = None, detached: bool = False,
                key: str | None = None, user_words: str | Sequence[str] | None = None) -> RunHandle:
    """Record ``code`` as a run owned here and start its first attempt; its handle at once.

    With ``key`` that already names a run (P-36), that run's handle (its result
    is the run's outcome) and never a second run.
    """
    t0 = time.perf_counter()
    check_code_size(code, engine.limits.code_bytes)
    if session is not None:
        check_session_name(session)
    if key is not None:
        check_run_key(key)
    # Created running and owned by this process: a queued row could be
    # claimed by another replica's runner first.
    run = new_run(engine, code, principal=principal, meta=meta, check=check, status=RunStatus.RUNNING,
                  user_words=user_words)
    notes: list[str] = []
    if session is not None:
        run.session = session
        # Off the event loop on Postgres, as every store read of this path (D-27).
        run.meta["session_base"] = await engine.astore.call(
            engine.sessions.base, session, run.principal or engine.settings.principal, notes)
    if key is not None:
        run_keys.mark(run, key, run_keys.request_fingerprint(code, session=session, check=check, meta=meta))
    quotas = engine.settings.quotas
    if key is None and (quotas is None or not quotas.reads_store(run.principal or LOCAL_PRINCIPAL, session)):
        # Nothing to read before the insert (the runs counts are made in its transaction, D-54): no hop.
        counted = check_run_start(quotas, engine.store, run, session, engine.clock())
    else:
        counted = await engine.astore.call(check_run_start, quotas, engine.store, run, session, engine.clock())
    run.mac = sign_run(engine.keyring, run, engine.settings.run_signature)
    if key is None:
        await engine.astore.call(engine.lifecycle.create, run, counted)
    else:
        existing = await engine.astore.call(run_keys.create_or_find, engine, run, counted)
        if existing is not None:
            # A repeat of the request that started it: its run, never a second one.
            task = asyncio.ensure_future(rejoin(engine, existing, wait_seconds=engine.settings.rejoin_wait_seconds,
                                                detached=detached))
            return RunHandle(existing.run_id, task, bus=engine.events, cancel=engine.cancel_run, detached=detached)
    return launch(engine, run, mode="fresh", hooks=hooks, t0=t0, notes=notes, detached=detached)


def start(engine: Engine, code: str, *, check: str, principal: str | None = None,
          meta: dict[str, Any] | None = None, key: str | None = None,
          user_words: str | Sequence[str] | None = None) -> str:
    """Queue ``code`` as a background run for a worker; its run id (with ``key``, the id of the run the key
    already names, if any)."""
    check_code_size(code, engine.limits.code_bytes)
    run = new_run(engine, code, principal=principal, meta=meta, check=check, status=RunStatus.QUEUED,
                  user_words=user_words)
    if key is not None:
        run_keys.mark(run, check_run_key(key), run_keys.request_fingerprint(code, session=None, check=check,
                                                                            meta=meta))
    counted = check_run_start(engine.settings.quotas, engine.store, run, None, engine.clock())
    run.mac = sign_run(engine.keyring, run, engine.settings.run_signature)
    if key is None:
        engine.lifecycle.create(run, counted)
        return run.run_id
    existing = run_keys.create_or_find(engine, run, counted)
    return run.run_id if existing is None else existing.run_id


def new_run(engine: Engine, code: str, *, principal: str | None, meta: dict[str, Any] | None,
            check: str, status: RunStatus, user_words: str | Sequence[str] | None = None) -> RunRecord:
    """A run record not yet stored: its environment (clock, seed), policy, limits, owner, sources and what
    ``writes = "guard"`` trusts as the user's words (D-75)."""
    words.refuse_in_meta(meta)
    said = words.record(user_words, guarded=engine.policy.writes == policy_mod.GUARD)
    now = engine.clock()
    clock = _dt.datetime.fromtimestamp(round(now, 3), _dt.timezone.utc)
    running = status == RunStatus.RUNNING
    # The id's 64 bits and the seed's 63 from one read of the OS's randomness, not two (each a system call,
    # ~10 µs under load); the same source and as many bits as secrets.token_hex(8) and secrets.randbits(63).
    random = secrets.token_bytes(16)
    return RunRecord(
        run_id=f"run_{random[:8].hex()}",
        status=status,
        program=code,
        environment={"clock": clock.isoformat(), "seed": int.from_bytes(random[8:], "big") >> 1},
        policy=engine.policy_dict,
        limits=engine.limits_dict,
        created_at=now,
        updated_at=now,
        principal=principal or engine.settings.principal,
        owner=engine.owner if running else None,
        lease_until=now + engine.lifecycle.lease_seconds if running else None,
        meta={**(meta or {}), "check": check,
              # What another process needs to load the same tools (P-30).
              **({"sources": engine.sources.recorded()} if engine.sources is not None else {}),
              **({words.FIELD: said} if said is not None else {})},
    )


# -- attempts -------------------------------------------------------------------------


def launch(engine: Engine, run: RunRecord, *, mode: str, hooks: Hooks = NO_HOOKS, t0: float | None = None,
           notes: list[str] | None = None, detached: bool = False) -> RunHandle:
    """Start an attempt of ``run``, which this process owns (created running, or claimed), here.

    The one start path: begin and cells (``mode="fresh"``), the worker,
    resume, recover and wake (``"fresh"`` for a claimed queued run,
    ``"continue"`` otherwise) all come through here.
    """
    t0 = time.perf_counter() if t0 is None else t0

    async def attempt() -> RunResult:
        if rollback.plan_of(run) is not None:
            # A rollback in progress (P-46): its compensations, not the program, whoever continues it; the decision
            # that began it recorded first, if the process that stored its plan stopped before (P-53).
            if _verifies(engine, run):
                await approvals.rollback_recorded(engine, run)
            return await rollback.run_to_end(engine, run, t0)
        result = await Attempt(run, engine, mode=mode, hooks=hooks, t0=t0).run_to_end()
        if result.status == RunStatus.WAITING:
            result = await _settled_while_parking(engine, run.run_id, result)
        if notes:
            result.notes = list(notes) + result.notes
        return result

    task = asyncio.ensure_future(attempt())
    handle = RunHandle(run.run_id, task, bus=engine.events, cancel=engine.cancel_run, detached=detached)
    # The registry of attempts here keeps the handle while its task runs and forgets it when it ends.
    engine.attempts.add(handle, task, engine.events)
    return handle


async def _settled_while_parking(engine: Engine, run_id: str, result: RunResult) -> RunResult:
    """Continue a run whose wait was settled while it was parking (P-18).

    A resolution from another process that lands after the run created its
    wait row but before it was recorded `waiting` finds the run still
    running, so wake() there leaves it; nothing else would wake it (a wait
    without a deadline is never due). Looked at again once parked, it
    continues here; if the resolver's wake got there first, that one runs it.
    """
    key = (result.pending or {}).get("key")
    wait = await engine.store.aio.get_wait(key) if key else None
    if wait is None or wait.status == WaitStatus.PENDING:
        return result
    continued = await wake(engine, run_id, key=key)
    return continued if continued is not None else result


async def wake(engine: Engine, run_id: str, key: str | None = None) -> RunResult | None:
    """Continue a waiting run in this process if it is parked on ``key`` (or its deadline came)."""
    run = await engine.store.aio.get_run(run_id)
    if run is None or run.status != RunStatus.WAITING:
        return None
    if key is not None and not same_wait((run.pending or {}).get("key"), key):
        return None  # parked elsewhere; the resolution is kept for when it gets there
    trusted, ended = vet(engine, run)
    if not trusted:
        return ended
    await engine.require_sources(run)
    if not engine.lifecycle.wake(run_id):
        return None  # another process took it
    run = await engine.store.aio.get_run(run_id)
    if run is None:  # deleted since it was woken
        return None
    return await launch(engine, run, mode="continue").result()


async def wake_due(engine: Engine) -> list[RunResult]:
    """Continue runs whose timer or wait deadline has come."""
    out = []
    for run in await engine.store.aio.runs_due(engine.clock()):
        result = await wake(engine, run.run_id)
        if result is not None:
            out.append(result)
    return out


# -- trust and sources (P-35, P-30) -----------------------------------------------------


def check_run(engine: Engine, run: RunRecord, *, t0: float | None = None) -> RunResult | None:
    """Verify a run before acting on it: None if it verifies; a tampered run ends failed (returned).

    ``WrongSecret`` propagates: the run is left as it was, for a process holding the right secret.
    """
    try:
        verify_run(engine.keyring, run)
    except RunTampered as exc:
        logging.getLogger("tether").error("run %s: %s", run.run_id, exc.message)
        return engine.finisher.refused(run, exc, t0=t0)
    return None


def _verifies(engine: Engine, run: RunRecord) -> bool:
    """Whether ``run``'s record verifies (P-35); what does not is refused by whatever acts on it next."""
    try:
        verify_run(engine.keyring, run)
    except (RunTampered, WrongSecret):
        return False
    return True


def vet(engine: Engine, run: RunRecord) -> tuple[bool, RunResult | None]:
    """Before a worker claims a run: (True, None) if it verifies; else (False, the failed envelope
    of a tampered run, or None for a run signed with a secret not held here, which is left alone)."""
    try:
        ended = check_run(engine, run)
    except WrongSecret as exc:
        logging.getLogger("tether").warning("run %s not taken: %s", run.run_id, exc.message)
        return False, None
    return ended is None, ended


async def sources_or_note(engine: Engine, run: RunRecord, out: list[RunResult]) -> bool:
    """For commands over many runs: one that cannot load its sources is left as it is and reported."""
    try:
        await engine.require_sources(run)
        return True
    except (RunTampered, WrongSecret):
        return True  # nothing was loaded for it; the attempt vets it and ends or leaves it (P-35)
    except ToolsUnavailable as exc:
        out.append(RunResult(status=run.status, run_id=run.run_id, error=exc.to_dict()))
        return False


# -- a repeated keyed request (P-36) --------------------------------------------------------


async def rejoin(engine: Engine, run: RunRecord, *, wait_seconds: float, detached: bool = False,
                 hooks: Hooks = NO_HOOKS, named_by: str = "this key") -> RunResult:
    """The outcome of a run a repeated request names: at once if it is not running, else once it ends.

    Running in this process: awaited. Running in another: watched through the
    store until it stops running. Its owner gone (lease lapsed, or its process
    on this host ended): taken over and continued here with ``hooks``, as ``recover``
    would. Past ``wait_seconds``: a ``running`` envelope naming the run (and what
    named it: a keyed request's key, P-36, or a repeated decision, D-90).
    """
    deadline = time.monotonic() + wait_seconds
    run_id = run.run_id
    while True:
        fresh = await engine.astore.get_run(run_id)
        if fresh is None:
            raise Conflict(f"run {run_id} was deleted while a request with its key waited on it")
        run = fresh
        done = current_envelope(engine, run)
        if done is not None:
            return done
        left = deadline - time.monotonic()
        if left <= 0:
            return still_running(run_id, str(run.status), wait_seconds, named_by=named_by)
        handle = engine.attempts.handle(run_id)
        if handle is not None:
            finished, _ = await asyncio.wait({handle.task}, timeout=left)
            if finished:
                return await asyncio.shield(handle.task)
            continue
        if run.status == RunStatus.RUNNING:
            continued = await _take_over(engine, run, detached, hooks)
            if continued is not None:
                return continued
        # Running in another process, or queued for a worker: watch the store.
        result = await engine.wait_for_run(run_id, timeout=min(left, 5.0))
        if result.status not in (RunStatus.RUNNING, RunStatus.QUEUED):
            return result
        if (result.error or {}).get("code") == "run_unowned":
            # Its owner is gone but it was not taken here (another process took it, or it is signed
            # with a secret this process does not hold): look again shortly, not at once.
            await asyncio.sleep(min(0.2, max(left, 0.0)))


async def _take_over(engine: Engine, run: RunRecord, detached: bool, hooks: Hooks = NO_HOOKS) -> RunResult | None:
    """Continue ``run`` here if its owner is gone; None if it has a live owner or another process took it."""
    gone = owner_gone(run.owner)
    if not gone and run.lease_until is not None and run.lease_until >= engine.clock():
        return None
    trusted, ended = vet(engine, run)
    if not trusted:
        return ended
    await engine.require_sources(run)
    if not engine.lifecycle.take_over(run.run_id, gone_owner=run.owner if gone else None):
        return None
    taken = await engine.astore.get_run(run.run_id)
    if taken is None or taken.status in TERMINAL_RUN_STATUSES:
        return None
    # A retry is a takeover like the worker's: it counts towards quarantine (P-39), so a run that
    # wedges every process cannot be revived forever by a client that keeps retrying its key.
    going_on, quarantined = await continue_or_quarantine(
        engine, taken, gone_owner=run.owner, how="process_gone" if gone else "lease_lapsed")
    if quarantined is not None:
        return quarantined
    if going_on is None:
        return None
    return await launch(engine, going_on, mode="continue", hooks=hooks, detached=detached).result()


def gone_owners(engine: Engine) -> list[RunRecord]:
    """Running runs whose owner was a process on this host that has ended (lease or not)."""
    return [r for r in engine.store.list_runs(status=RunStatus.RUNNING, limit=1000)
            if r.owner != engine.owner and owner_gone(r.owner)]

