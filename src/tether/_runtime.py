"""The runtime: execute programs, pause them, resume them anywhere, recover them.

A run's life (docs/protocol.md has the numbered clauses):

    execute ─> running ─┬─> completed | failed
                        ├─> paused ── resume(approve|decline) ─> running ...
                        │          └─ resume(cancel) / ttl ─> cancelled | failed
                        └─> (process dies) ── recover ─> running ...

Each stretch of running in one process is an *attempt*: fresh (the program
from its first line), restore (a signed snapshot loaded into a fresh worker)
or replay (the program from its first line, answered from the journal).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable

from tether._engine import run_keys
from tether._engine.approvals.model import DECISIONS, Approver
from tether._engine.calls.boundary import Cancelled, EffectBoundary
from tether._engine.driver import Attempt, Collaborators, Settings
from tether._engine.events import EventBus
from tether._engine.finish import Finisher
from tether._engine.handle import RunHandle
from tether._engine.inputs import check_code_size, check_session_name
from tether._engine.lifecycle import Lifecycle
from tether._engine.limits import Limits
from tether._engine.notices import CANCEL, ENDED, SETTLED, Notices, wait_a_little
from tether._engine.ownership import new_owner, owner_gone
from tether._engine.policy import Policy
from tether._engine.quotas import Quotas, check_run_start
from tether._engine.result import RunResult
from tether._engine.run_keys import check_run_key
from tether._engine.sessions import Sessions
from tether._engine.waits import Waits, same_wait
from tether._sandbox.monty import MONTY_VERSION, SandboxPool
from tether._store.base import LOCAL_PRINCIPAL, RunRecord, SnapshotRecord, Store
from tether._store.states import TERMINAL_RUN_STATUSES, RunStatus, WaitStatus
from tether.errors import (
    InvalidArguments,
    NamespaceReserved,
    RunNotFound,
    RunTampered,
    SnapshotTampered,
    ToolsUnavailable,
    UsageError,
    WrongSecret,
)

if TYPE_CHECKING:
    from tether._config import Config
    from tether._sources.loader import SourceSet
    from tether._tools.catalog import Catalog

_log = logging.getLogger("tether.runs")

# Puts an upstream tool's question (an MCP elicitation) to the run's user:
# {"run_id","address","message","mode","schema","url"} -> {"action", "content"}.
Asker = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


CHECK_MODES = ("calls", "full", "off")


def check_mode(check: str | None, type_check: bool | None = None) -> str:
    """The check mode from ``check`` or the older ``type_check`` flag; "calls" by default."""
    if check is None:
        return "calls" if type_check is None else ("full" if type_check else "off")
    if check not in CHECK_MODES:
        raise UsageError(f"check must be one of {', '.join(CHECK_MODES)} (got {check!r})")
    return check


class Runtime:
    """Runs programs against a catalog of tools, durably.

    ``async with Runtime(tools=[...]) as rt: result = await rt.execute(code)``
    """

    def __init__(
        self,
        *,
        store: Store | None = None,
        catalog: Catalog | None = None,
        tools: Iterable[Any] = (),
        policy: Policy | None = None,
        limits: Limits | None = None,
        pool: SandboxPool | None = None,
        min_workers: int = 1,
        max_workers: int = 2,
        type_check: bool | None = None,
        check: str | None = None,
        approval_ttl_seconds: float = 86_400.0,
        lease_seconds: float = 30.0,
        checkpoint_every_calls: int = 100,
        checkpoint_every_seconds: float = 30.0,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
        principal: str = LOCAL_PRINCIPAL,
        local_runs: str = "private",
        quotas: Quotas | None = None,
    ) -> None:
        from tether._store import open_store
        from tether._tools.catalog import Catalog

        self.store: Store = store if store is not None else open_store("sqlite:///:memory:")
        # The store as code on the event loop awaits it: Postgres calls run off the loop (D-27).
        self.astore = self.store.aio
        self.catalog = catalog if catalog is not None else Catalog()
        self.policy = policy or Policy()
        self.limits = limits or Limits()
        # The pre-run check (README "The pre-run check"): "calls" (default),
        # "full" (also the bundled type checker) or "off"; type_check=False/True
        # is the older spelling of "off"/"full".
        self.check = check_mode(check, type_check)
        self.approval_ttl_seconds = approval_ttl_seconds
        self.quotas = quotas  # per-principal limits on starting runs ([quotas]); None: none
        self.checkpoint_every_calls = checkpoint_every_calls
        self.checkpoint_every_seconds = checkpoint_every_seconds
        self.clock = clock
        # Names this process's host and pid, so a runtime on the same host can tell it is gone.
        self.owner = owner or new_owner()
        # Whose runs a call without an explicit principal starts and acts on
        # (the CLI's, the Python API's); and whether callers with a token may
        # act on those runs too ([server] local_runs).
        if not isinstance(principal, str) or not principal:
            raise InvalidArguments("principal must be a non-empty string")
        if local_runs not in ("private", "shared"):
            raise InvalidArguments(f"local_runs must be 'private' or 'shared', not {local_runs!r}")
        self.principal = principal
        self.local_runs = local_runs
        self._own_pool = pool is None
        self.pool = pool or SandboxPool(
            min_workers=min_workers,
            max_workers=max_workers,
            # Above the run's own time limit: this watchdog only catches a
            # step the VM cannot interrupt.
            request_timeout=self.limits.run_seconds + 5.0,
        )
        from tether._engine.approvals.capabilities import keyring_for

        # Signs and verifies runs, journals and snapshots (P-35); its current secret keys waits and sessions.
        self.keyring = keyring_for(self.store)
        secret = self.keyring.current
        self._sessions = Sessions(store=self.store, secret=secret, clock=clock, older=self.keyring.previous)
        self._waits = Waits(store=self.store, secret=secret, clock=clock, wake=self.wake, resume=self.resume,
                            left=lambda run_id: self.notices.publish(SETTLED, run_id),
                            older=self.keyring.previous)
        # Stored run events, this process's observers, and the listeners told when a run pauses or ends.
        self.bus = EventBus(store=self.store, clock=clock)
        # Records how runs end (completed, failed, cancelled, refused, internal errors).
        # Every change of a run's status, owner and lease goes through it (_engine/lifecycle.py).
        self.lifecycle = Lifecycle(self.store, owner=self.owner, clock=clock, lease_seconds=lease_seconds)
        self.finisher = Finisher(store=self.store, lifecycle=self.lifecycle, bus=self.bus, clock=clock,
                                 cancel_waits=self._waits.cancel, revoke_waits=lambda run_id: self._waits.revoke(run_id=run_id))
        # The attempts running in this process, by run id (launch adds and removes them).
        self._running: dict[str, RunHandle] = {}
        # The effect boundaries of attempts running here, by run id (each attempt adds its own).
        self._live: dict[str, EffectBoundary] = {}
        # Verdicts of the bundled type checker by (program, stubs): a resent program is not checked twice.
        self.verdicts: dict[str, bool] = {}
        # Recorded on every run; computed once (dataclasses.asdict deep-copies).
        self._policy_dict = self.policy.to_dict()
        self._limits_dict = self.limits.to_dict()
        self.inline_sleep_seconds = 1.0
        # How long a repeated keyed request waits for the run its key names to stop running
        # before it gets a `running` envelope (P-36): the run's own time limit, and a margin.
        self.rejoin_wait_seconds = self.limits.run_seconds + 10.0
        # How long a forming write pause waits for more writes issued with it (P-27).
        self.batch_window_seconds = 0.05
        self.config: Config | None = None  # set by tether._app.open_runtime
        self.source_status: list[Any] = []
        # The sources loaded in this process (tether._sources.loader.SourceSet), if configured.
        self.source_set: SourceSet | None = None
        if tools:
            self.add_tools(*tools)

    @property
    def lease_seconds(self) -> float:
        """How long a claim on a run lasts without renewal; the lifecycle's, so the two never differ."""
        return self.lifecycle.lease_seconds

    @lease_seconds.setter
    def lease_seconds(self, seconds: float) -> None:
        self.lifecycle.lease_seconds = seconds

    # -- setup -------------------------------------------------------------------

    def add_tools(self, *items: Any) -> None:
        """Add Tools, @tool functions, modules or lists of them."""
        from tether._tools.model import Tool

        for item in items:
            if isinstance(item, Tool):
                self.check_namespaces([item])
                self.catalog.add(item)
            elif hasattr(item, "__tether_tool__"):
                self.add_tools(item.__tether_tool__.to_tool())
            elif isinstance(item, (list, tuple)):
                self.add_tools(*item)
            else:
                from tether._sources.python import module_summary, tools_from_module

                found = tools_from_module(item)
                self.check_namespaces(found)
                self.catalog.add_many(found)
                summary = module_summary(item)
                if summary:
                    for namespace in sorted({t.namespace for t in found}):
                        self.catalog.set_namespace_summary(namespace, summary)

    def check_namespaces(self, tools: Iterable[Any]) -> None:
        """Refuse namespaces the sandbox keeps for its own modules (`tools.time` cannot exist)."""
        from tether._sandbox.monty import reserved_module_names

        reserved = reserved_module_names()
        for ns in sorted({t.namespace for t in tools} & reserved):
            raise NamespaceReserved(
                f"namespace {ns!r} is the name of a module the sandbox provides, so tools.{ns} cannot exist",
                next_action=f"Give the source another namespace, e.g. {ns + '_tools'!r} "
                            "(namespace = ... in [[sources]], or TETHER_NAMESPACE / @tool(namespace=...)).",
            )

    async def __aenter__(self) -> "Runtime":
        await self.pool.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        # Runs begun and left to run on their own (cells, begin()) stop with the runtime;
        # an execute's attempt belongs to its caller, who is awaiting it.
        detached = [h for h in self._running.values() if h.detached]
        for handle in detached:
            handle.task.cancel()
        if detached:
            await asyncio.gather(*(h.task for h in detached), return_exceptions=True)
        self.bus.close()
        if self._own_pool:
            await self.pool.close()

    # -- catalog -----------------------------------------------------------------

    def search(self, query: str = "", namespace: str | None = None, limit: int = 12, offset: int = 0) -> dict[str, Any]:
        from tether._tools.search import search

        return search(self.catalog, query, namespace=namespace, limit=limit, offset=offset)

    def describe(self, addresses: str | list[str], detail: str = "default", offset: int = 0, *,
                 whole: bool = False) -> list[dict[str, Any]]:
        from tether._tools.describe import describe

        return describe(self.catalog, addresses, detail=detail, offset=offset, whole=whole)

    def sources(self) -> list[dict[str, Any]]:
        from tether._tools.describe import list_sources

        listed = list_sources(self.catalog)
        if self.source_set is not None:
            # A source that failed is listed with its error, so a program is not left guessing.
            listed += [{"namespace": ns, "tools": 0, "error": error}
                       for ns, error in sorted(self.source_set.failures().items())]
        return listed

    async def require_sources(self, run: RunRecord, *, live: tuple[str, ...] = ()) -> None:
        """Load the sources ``run`` was started with, or raise ToolsUnavailable leaving the run as it is.

        ``live``: addresses the run will call at once (a paused write): their
        servers must be reachable now, not only their cached listings.
        """
        recorded = (run.meta or {}).get("sources")
        if self.source_set is None or recorded is None:
            return
        # The definitions name commands to spawn and modules to import: only a run whose
        # record verifies is trusted with that (P-35); RunTampered / WrongSecret otherwise.
        self.verify_run(run)
        await self.source_set.require(recorded, live=tuple(a.split(".", 1)[0] for a in live),
                                      run_id=run.run_id, status=run.status)

    async def _sources_or_note(self, run: RunRecord, out: list[RunResult]) -> bool:
        """For commands over many runs: one that cannot load its sources is left as it is and reported."""
        try:
            await self.require_sources(run)
            return True
        except (RunTampered, WrongSecret):
            return True  # nothing was loaded for it; the attempt vets it and ends or leaves it (P-35)
        except ToolsUnavailable as exc:
            out.append(RunResult(status=run.status, run_id=run.run_id, error=exc.to_dict()))
            return False

    def model_description(self) -> str:
        """The ``execute`` tool's description: the sandbox API, the catalog, how to retry by key (P-36)."""
        from tether._tools.prompt import execute_description

        return execute_description(self.catalog, self.limits.to_dict())

    # -- execute -----------------------------------------------------------------

    async def execute(
        self,
        code: str,
        *,
        on_approval: Approver | None = None,
        principal: str | None = None,
        type_check: bool | None = None,
        check: str | None = None,
        meta: dict[str, Any] | None = None,
        on_progress: Callable[[int, str], None] | None = None,
        session: str | None = None,
        on_question: Asker | None = None,
        key: str | None = None,
    ) -> RunResult:
        """Run ``code``; returns completed, failed or paused.

        With ``session``, the program starts from the globals the session's
        last completed execute left (in any process) and leaves its own.

        With ``key`` (P-36), (principal, key) names one run: a repeat of the
        request gets that run's envelope (awaiting it if it still runs, here or
        in another process) and never starts a second run; the same key with
        another program, session or options raises ``IdempotencyConflict``.

        ``meta`` is recorded on the run (e.g. which tool modules it used, so a
        resume in another process can load the same ones).
        """
        handle = await self._begin(code, on_approval=on_approval, principal=principal, check=self._check_for(check, type_check),
                             meta=meta, on_progress=on_progress, session=session, on_question=on_question,
                             detached=False, key=key)
        return await handle.result()

    async def begin(
        self,
        code: str,
        *,
        on_approval: Approver | None = None,
        principal: str | None = None,
        type_check: bool | None = None,
        check: str | None = None,
        meta: dict[str, Any] | None = None,
        on_progress: Callable[[int, str], None] | None = None,
        session: str | None = None,
        on_question: Asker | None = None,
        key: str | None = None,
    ) -> RunHandle:
        """Start ``code`` in this process and return its :class:`RunHandle` at once (``handle.run_id``).

        Takes what :meth:`execute` takes; ``await handle.result()`` is what
        ``execute`` returns. A run begun and not awaited is stopped when the
        runtime closes. With a ``key`` that already names a run, the handle is
        that run's (its ``result()`` as :meth:`execute` describes).
        """
        return await self._begin(code, on_approval=on_approval, principal=principal, check=self._check_for(check, type_check),
                           meta=meta, on_progress=on_progress, session=session, on_question=on_question,
                           detached=True, key=key)

    async def _begin(self, code: str, *, on_approval: Approver | None, principal: str | None, check: str,
               meta: dict[str, Any] | None, on_progress: Callable[[int, str], None] | None, session: str | None,
               on_question: Asker | None, detached: bool, key: str | None = None) -> RunHandle:
        t0 = time.perf_counter()
        check_code_size(code, self.limits.code_bytes)
        if session is not None:
            check_session_name(session)
        if key is not None:
            check_run_key(key)
        # Created running and owned by this process: a queued row could be
        # claimed by another replica's runner first.
        run = self._new_run(code, principal=principal, meta=meta, check=check, status=RunStatus.RUNNING)
        notes: list[str] = []
        if session is not None:
            run.session = session
            run.meta["session_base"] = self._session_base(session, run.principal or self.principal, notes)
        if key is not None:
            run_keys.mark(run, key, run_keys.request_fingerprint(code, session=session, check=check, meta=meta))
        await self.astore.call(check_run_start, self.quotas, self.store, run, session, self.clock())
        self._sign(run)
        if key is None:
            await self.astore.call(self.lifecycle.create, run)
        else:
            existing = await self.astore.call(run_keys.create_or_find, self, run)
            if existing is not None:
                # A repeat of the request that started it: its run, never a second one.
                task = asyncio.ensure_future(run_keys.rejoin(self, existing, wait_seconds=self.rejoin_wait_seconds,
                                                             detached=detached))
                return RunHandle(existing.run_id, task, bus=self.bus, cancel=self._cancel_for_handle,
                                 detached=detached)
        return self.launch(run, mode="fresh", on_approval=on_approval, t0=t0, on_progress=on_progress,
                           on_question=on_question, notes=notes, detached=detached)

    def launch(self, run: RunRecord, *, mode: str, on_approval: Approver | None = None, t0: float | None = None,
               on_progress: Callable[[int, str], None] | None = None, on_question: Asker | None = None,
               notes: list[str] | None = None, detached: bool = False) -> RunHandle:
        """Start an attempt of ``run``, which this process owns (created running, or claimed), here.

        The one start path: execute/begin and cells (``mode="fresh"``), the
        worker, resume, recover and wake (``"fresh"`` for a claimed queued run,
        ``"continue"`` otherwise) all come through here.
        """
        t0 = time.perf_counter() if t0 is None else t0

        async def attempt() -> RunResult:
            result = await self._attempt(run, mode=mode, on_approval=on_approval, t0=t0, on_progress=on_progress,
                                         on_question=on_question)
            if notes:
                result.notes = list(notes) + result.notes
            return result

        task = asyncio.ensure_future(attempt())
        handle = RunHandle(run.run_id, task, bus=self.bus, cancel=self._cancel_for_handle, detached=detached)
        self._running[run.run_id] = handle
        run_id = run.run_id

        def ended(t: asyncio.Task[Any]) -> None:
            if self._running.get(run_id) is handle:
                del self._running[run_id]
            # Observers here were woken by the run's last event; later ones poll the store.
            self.bus.forget(run_id)
            if not t.cancelled():
                t.exception()  # retrieved: whoever awaits the handle gets it; the store has the outcome

        task.add_done_callback(ended)
        return handle

    def boundaries_calling(self, address: str) -> list[EffectBoundary]:
        """The effect boundaries of attempts here with a call to ``address`` on the wire now."""
        return [b for b in list(self._live.values()) if b.inflight_addresses.get(address, 0) > 0]

    def running(self, run_id: str) -> RunHandle | None:
        """The handle of ``run_id``'s attempt if one is running in this process."""
        return self._running.get(run_id)

    async def _cancel_for_handle(self, run_id: str, reason: str) -> RunResult:
        run = await self.store.aio.get_run(run_id)
        return await self.cancel(run_id, reason, principal=run.principal if run is not None else None)

    # -- REPL sessions (P-21): tether._engine.sessions ----------------------------------

    @property
    def session_ttl_seconds(self) -> float:
        """An idle REPL session is forgotten after this long."""
        return self._sessions.ttl_seconds

    @session_ttl_seconds.setter
    def session_ttl_seconds(self, seconds: float) -> None:
        self._sessions.ttl_seconds = seconds

    def verify_session_blob(self, name: str, principal: str | None, data: bytes, mac: str) -> None:
        self._sessions.verify(name, principal or self.principal, data, mac)

    def _session_base(self, name: str, principal: str, notes: list[str]) -> dict[str, Any] | None:
        return self._sessions.base(name, principal, notes)

    def reset_session(self, name: str, *, principal: str | None = None) -> bool:
        """Forget a session's globals and revoke its waits (this principal's session only)."""
        caller = principal or self.principal
        self._waits.revoke_session(name, caller)
        return self._sessions.delete(name, caller)

    @property
    def type_check(self) -> bool:
        """Whether the bundled type checker runs before programs (check mode "full")."""
        return self.check == "full"

    def _check_for(self, check: str | None, type_check: bool | None) -> str:
        return self.check if check is None and type_check is None else check_mode(check, type_check)

    def _new_run(self, code: str, *, principal: str | None, meta: dict[str, Any] | None,
                 check: str, status: RunStatus) -> RunRecord:
        now = self.clock()
        clock = _dt.datetime.fromtimestamp(round(now, 3), _dt.timezone.utc)
        running = status == RunStatus.RUNNING
        return RunRecord(
            run_id=f"run_{secrets.token_hex(8)}",
            status=status,
            program=code,
            environment={"clock": clock.isoformat(), "seed": secrets.randbits(63)},
            policy=self._policy_dict,
            limits=self._limits_dict,
            created_at=now,
            updated_at=now,
            principal=principal or self.principal,
            owner=self.owner if running else None,
            lease_until=now + self.lease_seconds if running else None,
            meta={**(meta or {}), "check": check,
                  # What another process needs to load the same tools (P-30).
                  **({"sources": self.source_set.recorded()} if self.source_set is not None else {})},
        )

    # -- resume ------------------------------------------------------------------

    async def resume(
        self,
        run_id: str,
        decision: str,
        reason: str | None = None,
        *,
        seq: int | None = None,
        principal: str | None = None,
        actor: str | None = None,
        via: str = "python",
        origin: str | None = None,
        on_approval: Approver | None = None,
        on_progress: Callable[[int, str], None] | None = None,
        on_question: Asker | None = None,
    ) -> RunResult:
        """Decide the paused write ``seq`` of ``run_id``; the run continues once its pause is decided (P-10).

        Without ``seq`` the decision is taken only when the run has asked about
        exactly one write in its life; otherwise it is refused (``seq_required``)
        with the pending writes, so it cannot land on a write nobody saw (P-28).
        """
        from tether._engine.approvals.service import decide, unnamed_target

        t0 = time.perf_counter()
        if decision not in DECISIONS:
            raise InvalidArguments(f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
        if seq is None:
            seq = unnamed_target(self, self._get_run(run_id, principal), decision)
        return await decide(self, run_id, {seq: (decision, reason)}, principal=principal, actor=actor, via=via,
                            origin=origin, on_approval=on_approval, on_progress=on_progress, on_question=on_question,
                            t0=t0)

    async def decide(
        self,
        run_id: str,
        decisions: dict[int, Any],
        *,
        principal: str | None = None,
        actor: str | None = None,
        via: str = "python",
        origin: str | None = None,
        on_approval: Approver | None = None,
        on_progress: Callable[[int, str], None] | None = None,
        on_question: Asker | None = None,
    ) -> RunResult:
        """Decide writes of a paused run, each by seq: ``{3: "approve", 4: ("decline", "why")}`` (P-27..P-29).

        Returns the paused envelope while writes of the pause are undecided,
        else the run's next result. ``actor`` (who), ``via`` (through what:
        python, cli, mcp, console, link, key, prompt) and ``origin`` (where the
        caller was, e.g. a client address) are recorded with each decision.
        """
        from tether._engine.approvals.service import decide

        return await decide(self, run_id, decisions, principal=principal, actor=actor, via=via, origin=origin,
                            on_approval=on_approval, on_progress=on_progress, on_question=on_question)

    def pending(self, run_id: str, *, principal: str | None = None) -> list[Any]:
        """The writes a paused run waits on, each a :class:`~tether.PendingWrite` (empty when not paused)."""
        from tether._engine.approvals.service import pending

        return pending(self, self._get_run(run_id, principal))

    async def wait_for_run(self, run_id: str, timeout: float = 300.0) -> RunResult:
        """Wait until the run is not running; return its recorded outcome."""
        handle = self._running.get(run_id)
        if handle is not None:
            return await asyncio.shield(handle.task)
        with self.notices.watch(ENDED, run_id) as ended:
            self.listen_for_events()
            return await self._poll_run(run_id, timeout, ended)

    async def _poll_run(self, run_id: str, timeout: float, ended: asyncio.Event) -> RunResult:
        delay = 0.02
        deadline = time.monotonic() + timeout
        while True:
            run = await self.store.aio.get_run(run_id)
            if run is None:
                raise RunNotFound(f"no run {run_id}")
            if run.status != RunStatus.RUNNING and run.result is not None:
                return self.recorded(run)
            if run.status == RunStatus.RUNNING and (run.lease_until is None or run.lease_until < self.clock()):
                # Nobody is running it, so waiting would only time out: say so at once.
                return RunResult(status=run.status, run_id=run_id, error={
                    "code": "run_unowned",
                    "message": f"run {run_id} is marked running but no process owns it (its process stopped)",
                    "next_action": f"Continue it with `tether recover` (or a worker), or end it with "
                                   f"`tether runs cancel {run_id}`.", "details": {}})
            if time.monotonic() > deadline:
                return RunResult(status=run.status, run_id=run_id, error={
                    "code": "still_running",
                    "message": f"run {run_id} is still {run.status} in process {run.owner} after {timeout:g} s",
                    "next_action": f"Wait for it with `tether runs await {run_id}`.", "details": {}})
            # A notice that the run stopped running (another process) ends the wait early.
            await wait_a_little(ended, delay)
            delay = min(delay * 2, 0.5)

    def _get_run(self, run_id: str, principal: str | None) -> RunRecord:
        run = self.store.get_run(run_id) if isinstance(run_id, str) else None
        # Another principal's run does not exist for this caller.
        if run is None or not self.may_act_on(run, principal):
            raise RunNotFound(f"no run {run_id!r}")
        return run

    def may_act_on(self, run: RunRecord, principal: str | None) -> bool:
        """Whether ``principal`` (None: this runtime's own) may see and act on ``run``. Never skipped."""
        caller = principal if principal is not None else self.principal
        # A row from before every run had an owner was started locally (migration 4).
        owner = run.principal if run.principal is not None else LOCAL_PRINCIPAL
        if owner == caller:
            return True
        return owner == LOCAL_PRINCIPAL and self.local_runs == "shared"

    def get_run(self, run_id: str, principal: str | None = None) -> RunRecord:
        return self._get_run(run_id, principal)

    # -- waits, signals, timers (P-18): tether._engine.waits ------------------------------

    def wait_key(self, run_id: str, name: str) -> str:
        return self._waits.key(run_id, name)

    def recorded(self, run: RunRecord) -> RunResult:
        """A run's last recorded envelope for whoever may see it: a parked wait's key recomputed (D-33)."""
        result = RunResult.from_dict(run.result) if run.result else RunResult(status=run.status, run_id=run.run_id)
        if result.status == RunStatus.WAITING and result.pending:
            result = dataclasses.replace(result, pending=self._waits.reveal(run.run_id, result.pending))
        return result

    def list_waits(self, run_id: str | None = None, *, principal: str | None = None,
                   status: str | None = "pending") -> list[dict[str, Any]]:
        """Pending waits with their keys (capabilities: show them only to whoever may resolve them)."""
        if run_id is not None:
            self._get_run(run_id, principal)
        return self._waits.views(run_id, status)

    async def resolve_wait(self, key: str, value: Any = None, *, error: str | None = None,
                           continue_run: bool = True) -> dict[str, Any]:
        """Settle a wait: the first resolution wins; the run continues here if it was parked on it."""
        return await self._waits.resolve(key, value, error=error, continue_run=continue_run)

    def approval_wait(self, run: RunRecord, seq: int, deadline: float) -> str:
        """Create the wait a paused write is (named approval:<seq>) and return its key."""
        from tether._engine.approvals.service import ask

        return ask(self._waits, run, seq, deadline)

    async def signal(self, run_id: str, name: str, value: Any = None, *, principal: str | None = None) -> dict[str, Any]:
        """Send a named signal; `await wait_for_signal(name)` receives it (kept if it comes first)."""
        self._get_run(run_id, principal)
        return await self._waits.signal(run_id, name, value)

    def revoke_waits(self, *, run_id: str | None = None, session: str | None = None) -> int:
        """Revoke every pending wait of a run or a session; their keys stop working."""
        return self._waits.revoke(run_id=run_id, session=session)

    async def wake(self, run_id: str, key: str | None = None) -> RunResult | None:
        """Continue a waiting run in this process if it is parked on ``key`` (or its deadline came)."""
        run = await self.store.aio.get_run(run_id)
        if run is None or run.status != RunStatus.WAITING:
            return None
        if key is not None and not same_wait((run.pending or {}).get("key"), key):
            return None  # parked elsewhere; the resolution is kept for when it gets there
        trusted, ended = self.vet(run)
        if not trusted:
            return ended
        await self.require_sources(run)
        if not self.lifecycle.wake(run_id):
            return None  # another process took it
        run = await self.store.aio.get_run(run_id)
        if run is None:  # deleted since it was woken
            return None
        return await self.launch(run, mode="continue").result()

    async def wake_due(self) -> list[RunResult]:
        """Continue runs whose timer or wait deadline has come."""
        out = []
        for run in await self.store.aio.runs_due(self.clock()):
            result = await self.wake(run.run_id)
            if result is not None:
                out.append(result)
        return out

    def expire_paused(self) -> list[str]:
        """End paused runs past their approval time to live (`run_expired`); nothing was sent for them."""
        from tether._engine.approvals.service import expire

        return expire(self)

    # -- background runs -----------------------------------------------------------

    def start(self, code: str, *, principal: str | None = None, meta: dict[str, Any] | None = None,
              type_check: bool | None = None, check: str | None = None, key: str | None = None) -> str:
        """Queue ``code`` as a background run; a worker executes it. Returns the run id at once.

        With ``key`` (P-36): the id of the run the key already names, if any, instead of a second run.
        """
        check_code_size(code, self.limits.code_bytes)
        mode = self._check_for(check, type_check)
        run = self._new_run(code, principal=principal, meta=meta, check=mode, status=RunStatus.QUEUED)
        if key is not None:
            run_keys.mark(run, check_run_key(key), run_keys.request_fingerprint(code, session=None, check=mode,
                                                                                meta=meta))
        check_run_start(self.quotas, self.store, run, None, self.clock())
        self._sign(run)
        if key is None:
            self.lifecycle.create(run)
            return run.run_id
        existing = run_keys.create_or_find(self, run)
        return run.run_id if existing is None else existing.run_id

    async def run_queued(self, limit: int = 1) -> list[RunResult]:
        """Claim up to ``limit`` queued runs (oldest first) and run them here."""
        from tether._engine.worker import claimed

        out: list[RunResult] = []

        async def usable(run: RunRecord) -> bool:
            trusted, ended = self.vet(run)
            if not trusted:
                if ended is not None:
                    out.append(ended)
                return False
            # Reported as it stays: back in the queue for a process that can load its sources.
            return await self._sources_or_note(dataclasses.replace(run, status=RunStatus.QUEUED), out)

        async for run in claimed(lambda: len(out) < limit, self.lifecycle.claim_queued, usable,
                                 lambda r: self.lifecycle.unclaim(r, RunStatus.QUEUED)):
            out.append(await self.launch(run, mode="fresh").result())
        return out

    # -- questions from upstream tools ------------------------------------------------

    def elicitation_handler(self, namespace: str) -> Callable[[Any], Awaitable[Any]]:
        """For an MCP source: put an upstream's mid-call question to the user of the run that made the call
        (_engine/questions.py)."""
        from tether._engine.questions import elicitation_handler

        return elicitation_handler(namespace, self._live, self.bus)

    # -- cells (P-20) ----------------------------------------------------------------

    async def start_cell(self, code: str, *, yield_after_ms: int = 1000, principal: str | None = None,
                         meta: dict[str, Any] | None = None, key: str | None = None) -> dict[str, Any]:
        """Start a program and return an observation as soon as it yields, ends, pauses or time passes.

        With ``key`` (P-36), a repeat observes the cell the key already names, from its first event.
        """
        from tether._engine.cells import start_cell

        return await start_cell(self, code, yield_after_ms=yield_after_ms, principal=principal, meta=meta, key=key)

    async def wait_cell(self, cell_id: str, *, after: int = 0, timeout_ms: int = 30_000,
                        principal: str | None = None) -> dict[str, Any]:
        """Long-poll a cell's events after ``after``; works from any process sharing the store."""
        from tether._engine.cells import wait_cell

        return await wait_cell(self, cell_id, after=after, timeout_ms=timeout_ms, principal=principal)

    async def terminate_cell(self, cell_id: str, *, principal: str | None = None) -> dict[str, Any]:
        """Stop a cell: nothing further is sent; a write on the wire finishes and is journaled."""
        from tether._engine.cells import terminate_cell

        return await terminate_cell(self, cell_id, principal=principal)

    # -- cancel ------------------------------------------------------------------

    async def cancel(self, run_id: str, reason: str = "cancelled by the client", *,
                     principal: str | None = None) -> RunResult:
        """Stop a run: nothing further is sent; a write already on the wire finishes and is journaled."""
        run = self._get_run(run_id, principal)
        if run.status == RunStatus.PAUSED:
            return await self.resume(run_id, "cancel", reason, seq=(run.pending or {}).get("seq"),
                                     principal=principal)
        if run.status in TERMINAL_RUN_STATUSES:
            return RunResult.from_dict(run.result) if run.result else RunResult(status=run.status, run_id=run_id)
        if run.status in (RunStatus.QUEUED, RunStatus.WAITING):
            # Nothing is executing: end it here. Its waits end with it.
            return self.finisher.cancel_now(run, reason) or await self.cancel(run_id, reason, principal=principal)
        if run_id in self._running:
            # Executing here: stop its program once its sandbox is up (a just-started
            # attempt may still be preparing), then report how it ended.
            result = await self._stop_here(run_id, reason)
            if result.status in (RunStatus.PAUSED, RunStatus.WAITING):  # it stopped at a pause first: cancel that
                return await self.cancel(run_id, reason, principal=principal)
            return result
        now = self.clock()
        gone = owner_gone(run.owner)
        if run.lease_until is None or run.lease_until < now or gone:
            # No process owns it (its process stopped): take it, so no recoverer starts it, and end it.
            if self.lifecycle.take_over(run_id, gone_owner=run.owner if gone else None):
                taken = await self.store.aio.get_run(run_id)
                return (self.finisher.cancel_now(taken, reason) if taken is not None else None) or await self.cancel(
                    run_id, reason, principal=principal)
        # Running in another process: a durable request its heartbeat sees, and a notice so it looks now.
        if not self.lifecycle.request_cancel(run, reason):
            return await self.cancel(run_id, reason, principal=principal)  # it stopped running meanwhile
        self.notices.publish(CANCEL, run_id)
        result = await self.wait_for_run(run_id, timeout=max(self.lease_seconds, 1.0) * 2)
        if result.status in (RunStatus.PAUSED, RunStatus.WAITING):
            # It paused or parked before its owner saw the request (a parked run has none): end it as it is.
            return await self.cancel(run_id, reason, principal=principal)
        return result

    async def _stop_here(self, run_id: str, reason: str) -> RunResult:
        handle = self._running[run_id]
        delay = 0.002
        while not handle.done():
            boundary = self._live.get(run_id)
            if boundary is not None and boundary.execution is not None:
                boundary.execution.stop(Cancelled(reason))
                boundary.release_held()
                break
            await asyncio.wait({handle.task}, timeout=delay)
            delay = min(delay * 2, 0.05)
        return await self.wait_for_run(run_id)

    # -- recover -----------------------------------------------------------------

    async def recover(self) -> list[RunResult]:
        """Continue runs whose owner died: lease expired, or its process on this host is gone (P-11)."""
        from tether._engine.worker import orphans_taken

        out: list[RunResult] = []

        async def usable(run: RunRecord) -> bool:
            # A tampered run ends failed; one signed with another secret, or whose sources
            # cannot be loaded here, is left to a process that can continue it.
            trusted, ended = self.vet(run)
            if not trusted:
                if ended is not None:
                    out.append(ended)
                return False
            return await self._sources_or_note(run, out)

        async for run in orphans_taken(self, lambda: True, usable, out.append):
            out.append(await self.launch(run, mode="continue").result())
        return out

    def gone_owners(self) -> list[RunRecord]:
        """Running runs whose owner was a process on this host that has ended (lease or not)."""
        return [r for r in self.store.list_runs(status=RunStatus.RUNNING, limit=1000)
                if r.owner != self.owner and owner_gone(r.owner)]

    # -- attempts ------------------------------------------------------------------

    async def _attempt(self, run: RunRecord, *, mode: str, on_approval: Approver | None, t0: float,
                       on_progress: Callable[[int, str], None] | None = None,
                       on_question: Asker | None = None) -> RunResult:
        attempt = Attempt(run, self._collaborators(), mode=mode, on_approval=on_approval, t0=t0,
                          on_progress=on_progress, on_question=on_question)
        result = await attempt.run_to_end()
        if result.status == RunStatus.WAITING:
            return await self._settled_while_parking(run.run_id, result)
        return result

    def _collaborators(self) -> Collaborators:
        """What an attempt works with; the knobs as they are now (tests and hosts set them after start)."""
        return Collaborators(
            store=self.store, keyring=self.keyring, clock=self.clock, catalog=self.catalog, pool=self.pool,
            bus=self.bus, finisher=self.finisher, waits=self._waits, sessions=self._sessions, lifecycle=self.lifecycle,
            settings=Settings(
                principal=self.principal, type_check=self.type_check,
                approval_ttl_seconds=self.approval_ttl_seconds, lease_seconds=self.lease_seconds,
                checkpoint_every_calls=self.checkpoint_every_calls,
                checkpoint_every_seconds=self.checkpoint_every_seconds,
                inline_sleep_seconds=self.inline_sleep_seconds, batch_window_seconds=self.batch_window_seconds),
            verdicts=self.verdicts, live=self._live, search=self.search, describe=self.describe,
            list_sources=self.sources,
            source_failures=lambda: self.source_set.failures() if self.source_set is not None else {},
        )

    async def _settled_while_parking(self, run_id: str, result: RunResult) -> RunResult:
        """Continue a run whose wait was settled while it was parking (P-18).

        A resolution from another process that lands after the run created its
        wait row but before it was recorded `waiting` finds the run still
        running, so wake() there leaves it; nothing else would wake it (a wait
        without a deadline is never due). Looked at again once parked, it
        continues here; if the resolver's wake got there first, that one runs it.
        """
        key = (result.pending or {}).get("key")
        wait = await self.store.aio.get_wait(key) if key else None
        if wait is None or wait.status == WaitStatus.PENDING:
            return result
        continued = await self.wake(run_id, key=key)
        return continued if continued is not None else result

    # -- events (P-20) and listeners: tether._engine.events ----------------------------------

    @property
    def listeners(self) -> list[Callable[[str, str, dict[str, Any]], None]]:
        """Told when a run pauses, parks, or ends: (run_id, kind, data); notifications use them."""
        return self.bus.listeners

    def announce(self, run_id: str, kind: str, data: dict[str, Any]) -> None:
        """Tell the listeners a run paused, parked or ended; nothing a listener does reaches the run."""
        self.bus.announce(run_id, kind, data)

    def listen_for_events(self) -> None:
        """Hear other processes' notices at once (Postgres); see EventBus.listen and tether._engine.notices."""
        self.bus.listen()

    @property
    def notices(self) -> Notices:
        """What other processes on the store say at once (Postgres LISTEN/NOTIFY); polling stays underneath."""
        return self.bus.notices

    def event(self, run_id: str, type: str, data: dict[str, Any]) -> int:
        """Store an event of ``run_id`` (P-20); observers here wake at once."""
        return self.bus.emit(run_id, type, data)

    def snapshot_record(self, run_id: str, seq: int, data: bytes, pending: list[dict[str, Any]], kind: str,
                        version: str = MONTY_VERSION) -> SnapshotRecord:
        from tether._engine.integrity import sign_snapshot_record

        mac = sign_snapshot_record(self.keyring, run_id, seq, version, data, pending, kind)
        return SnapshotRecord(run_id, seq, version, data, mac, pending, self.clock(), kind)

    # -- integrity (P-35) ------------------------------------------------------------

    def _sign(self, run: RunRecord) -> RunRecord:
        from tether._engine.integrity import sign_run

        run.mac = sign_run(self.keyring, run)
        return run

    def verify_run(self, run: RunRecord) -> None:
        """Raise ``RunTampered`` naming the changed fields, or ``WrongSecret``; nothing else."""
        from tether._engine.integrity import verify_run

        verify_run(self.keyring, run)

    def check_run(self, run: RunRecord, *, t0: float | None = None) -> RunResult | None:
        """Verify a run before acting on it: None if it verifies; a tampered run ends failed (returned).

        ``WrongSecret`` propagates: the run is left as it was, for a process holding the right secret.
        """
        try:
            self.verify_run(run)
        except RunTampered as exc:
            logging.getLogger("tether").error("run %s: %s", run.run_id, exc.message)
            return self.finisher.refused(run, exc, t0=t0)
        return None

    def vet(self, run: RunRecord) -> tuple[bool, RunResult | None]:
        """Before a worker claims a run: (True, None) if it verifies; else (False, the failed envelope
        of a tampered run, or None for a run signed with a secret not held here, which is left alone)."""
        try:
            ended = self.check_run(run)
        except WrongSecret as exc:
            logging.getLogger("tether").warning("run %s not taken: %s", run.run_id, exc.message)
            return False, None
        return ended is None, ended

    def verify_snapshot(self, snap: SnapshotRecord) -> None:
        from tether._engine.integrity import verify_snapshot_record

        if not verify_snapshot_record(self.keyring, snap):
            raise SnapshotTampered(
                f"the stored snapshot of run {snap.run_id} at call {snap.seq} failed its signature check; "
                "nothing was resumed or sent",
                details={"seq": snap.seq},
            )
