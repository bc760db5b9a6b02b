"""The runtime: execute programs, pause them, resume them anywhere, recover them.

A run's life (docs/protocol.md has the numbered clauses):

    execute ─> running ─┬─> completed | failed
                        ├─> paused ── resume(approve|decline) ─> running ...
                        │          └─ resume(cancel) / ttl ─> cancelled | failed
                        └─> (process dies) ── recover ─> running ...

Each stretch of running in one process is an *attempt*: fresh (the program
from its first line), restore (a signed snapshot loaded into a fresh worker)
or replay (the program from its first line, answered from the journal).

:class:`Runtime` is the small public face (its methods are what users call);
the work is done by the engine's services (tether._engine: the Engine built
once by tether._engine.build, the launcher, control, the approvals service,
the worker), which receive the Engine and never the Runtime.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from tether._engine import control, launcher
from tether._engine.approvals.model import Approver
from tether._engine.attempt.handle import RunHandle
from tether._engine.attempt.result import RunResult
from tether._engine.engine import Asker, Engine, Hooks, Settings
from tether._engine.ownership import new_owner
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy
from tether._engine.rules.quotas import Quotas
from tether._sandbox.monty import SandboxPool
from tether._store.base import LOCAL_PRINCIPAL, Store
from tether.errors import InvalidArguments, UsageError

if TYPE_CHECKING:
    from tether._config import Config
    from tether._engine.worker import Worker
    from tether._tools.catalog import Catalog

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

    The public face over the engine (tether._engine.engine.Engine): each
    method here checks its arguments and hands the work to the engine's
    services; ``rt.engine`` is what tether's own server, worker and CLI use.

    ``config`` (a loaded tether.toml) is what :func:`tether.open_runtime`
    passes: the runtime then has the config's sources set up (open_runtime
    loads them) and a worker on it reads the config's ``[retention]``.
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
        run_signature: int = 2,
        config: Config | None = None,
    ) -> None:
        from tether._engine.build import build_engine
        from tether._store import open_store
        from tether._tools.catalog import Catalog

        # Whose runs a call without an explicit principal starts and acts on
        # (the CLI's, the Python API's); and whether callers with a token may
        # act on those runs too ([server] local_runs).
        if not isinstance(principal, str) or not principal:
            raise InvalidArguments("principal must be a non-empty string")
        if local_runs not in ("private", "shared"):
            raise InvalidArguments(f"local_runs must be 'private' or 'shared', not {local_runs!r}")
        if run_signature not in (1, 2):
            raise InvalidArguments(f"run_signature must be 1 or 2 (D-55), not {run_signature!r}")
        limits = limits or Limits()
        self._own_pool = pool is None
        pool = pool or SandboxPool(
            min_workers=min_workers,
            max_workers=max_workers,
            # Above the run's own time limit: this watchdog only catches a
            # step the VM cannot interrupt.
            request_timeout=limits.run_seconds + 5.0,
        )
        settings = Settings(
            principal=principal,
            # The pre-run check (README "The pre-run check"): "calls" (default),
            # "full" (also the bundled type checker) or "off"; type_check=False/True
            # is the older spelling of "off"/"full".
            check=check_mode(check, type_check),
            local_runs=local_runs,
            approval_ttl_seconds=approval_ttl_seconds,
            checkpoint_every_calls=checkpoint_every_calls,
            checkpoint_every_seconds=checkpoint_every_seconds,
            # A repeated keyed request waits this long for its run to stop running (P-36):
            # the run's own time limit, and a margin.
            rejoin_wait_seconds=limits.run_seconds + 10.0,
            quotas=quotas,
            run_signature=run_signature,
        )
        self._engine = build_engine(
            store=store if store is not None else open_store("sqlite:///:memory:"),
            catalog=catalog if catalog is not None else Catalog(), pool=pool, policy=policy or Policy(),
            limits=limits, settings=settings, owner=owner or new_owner(), lease_seconds=lease_seconds, clock=clock,
            config=config)
        # Made on the first recover() (tether._engine.worker is not imported before it is needed).
        self._worker: Worker | None = None
        if tools:
            self.add_tools(*tools)

    # -- what it is made of (attributes, not methods) ----------------------------------

    @property
    def engine(self) -> Engine:
        """The services this runtime is made of; tether's own server, worker and CLI use them. Private API."""
        return self._engine

    @property
    def store(self) -> Store:
        """Where runs, their journals and events are kept."""
        return self._engine.store

    @property
    def catalog(self) -> Catalog:
        """The tools programs can call."""
        return self._engine.catalog

    @property
    def policy(self) -> Policy:
        return self._engine.policy

    @property
    def limits(self) -> Limits:
        return self._engine.limits

    @property
    def principal(self) -> str:
        """Whose runs a call without an explicit principal starts and acts on."""
        return self._engine.settings.principal

    # -- setup -------------------------------------------------------------------

    def add_tools(self, *items: Any) -> None:
        """Add Tools, @tool functions, modules or lists of them."""
        from tether._sandbox.monty import check_namespaces
        from tether._tools.model import Tool

        for item in items:
            if isinstance(item, Tool):
                check_namespaces([item])
                self.catalog.add(item)
            elif hasattr(item, "__tether_tool__"):
                self.add_tools(item.__tether_tool__.to_tool())
            elif isinstance(item, (list, tuple)):
                self.add_tools(*item)
            else:
                from tether._sources.python import module_summary, tools_from_module

                found = tools_from_module(item)
                check_namespaces(found)
                self.catalog.add_many(found)
                summary = module_summary(item)
                if summary:
                    for namespace in sorted({t.namespace for t in found}):
                        self.catalog.set_namespace_summary(namespace, summary)

    async def __aenter__(self) -> "Runtime":
        await self._engine.pool.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop runs begun and left to run on their own here, and the sandbox pool if this runtime made it."""
        # Runs begun and left to run on their own (cells, begin()) stop with the runtime;
        # an execute's attempt belongs to its caller, who is awaiting it.
        detached = [h for h in self._engine.attempts.handles.values() if h.detached]
        for handle in detached:
            handle.task.cancel()
        if detached:
            await asyncio.gather(*(h.task for h in detached), return_exceptions=True)
        self._engine.events.close()
        if self._own_pool:
            await self._engine.pool.close()

    # -- catalog -----------------------------------------------------------------

    def search(self, query: str = "", namespace: str | None = None, limit: int = 12, offset: int = 0) -> dict[str, Any]:
        """The tools matching ``query``, best first: what a program's ``search()`` returns."""
        return self._engine.search(query, namespace=namespace, limit=limit, offset=offset)

    def describe(self, addresses: str | list[str], detail: str = "default", offset: int = 0, *,
                 whole: bool = False) -> list[dict[str, Any]]:
        """Tools' signatures and schemas: what a program's ``describe()`` returns."""
        return self._engine.describe(addresses, detail=detail, offset=offset, whole=whole)

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
        user_words: str | Sequence[str] | None = None,
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

        ``user_words`` is what the person the run serves wrote (their messages,
        never a tool's result or the model's text): under ``writes = "guard"``
        a destination they hold is the user's own and goes without asking
        (D-75). Kept on the run, signed; no door the agent reaches sets it.
        """
        handle = await launcher.begin(
            self._engine, code, check=self._check_for(check, type_check), principal=principal, meta=meta,
            session=session, key=key, detached=False, user_words=user_words,
            hooks=Hooks(on_approval=on_approval, on_progress=on_progress, on_question=on_question))
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
        user_words: str | Sequence[str] | None = None,
    ) -> RunHandle:
        """Start ``code`` in this process and return its :class:`RunHandle` at once (``handle.run_id``).

        Takes what :meth:`execute` takes; ``await handle.result()`` is what
        ``execute`` returns. A run begun and not awaited is stopped when the
        runtime closes. With a ``key`` that already names a run, the handle is
        that run's (its ``result()`` as :meth:`execute` describes).
        """
        return await launcher.begin(
            self._engine, code, check=self._check_for(check, type_check), principal=principal, meta=meta,
            session=session, key=key, detached=True, user_words=user_words,
            hooks=Hooks(on_approval=on_approval, on_progress=on_progress, on_question=on_question))

    def start(self, code: str, *, principal: str | None = None, meta: dict[str, Any] | None = None,
              type_check: bool | None = None, check: str | None = None, key: str | None = None,
              user_words: str | Sequence[str] | None = None) -> str:
        """Queue ``code`` as a background run; a worker executes it. Returns the run id at once.

        With ``key`` (P-36): the id of the run the key already names, if any, instead of a second run.
        """
        return launcher.start(self._engine, code, check=self._check_for(check, type_check), principal=principal,
                              meta=meta, key=key, user_words=user_words)

    def running(self, run_id: str) -> RunHandle | None:
        """The handle of ``run_id``'s attempt if one is running in this process."""
        return self._engine.attempts.handle(run_id)

    def _check_for(self, check: str | None, type_check: bool | None) -> str:
        if check is None and type_check is None:
            return self._engine.settings.check
        return check_mode(check, type_check)

    # -- REPL sessions (P-21): tether._engine.sessions ----------------------------------

    def reset_session(self, name: str, *, principal: str | None = None) -> bool:
        """Forget a session's globals and revoke its waits (this principal's session only)."""
        caller = principal or self.principal
        self._engine.waits.revoke_session(name, caller)
        return self._engine.sessions.delete(name, caller)

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
        ``"decline_and_undo"`` declines the pause and undoes the writes the run
        applied; ``"undo"`` does the same for a run that has ended (P-46): the run
        ends ``rolled_back``, its ``rollback`` listing what was and was not undone.
        """
        return await control.resume(
            self._engine, run_id, decision, reason, seq=seq, principal=principal, actor=actor, via=via, origin=origin,
            hooks=Hooks(on_approval=on_approval, on_progress=on_progress, on_question=on_question))

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
        return await control.decide(self._engine, run_id, decisions, principal=principal, actor=actor, via=via, origin=origin,
                            hooks=Hooks(on_approval=on_approval, on_progress=on_progress, on_question=on_question))

    def pending(self, run_id: str, *, principal: str | None = None) -> list[Any]:
        """The writes a paused run waits on, each a :class:`~tether.PendingWrite` (empty when not paused)."""
        from tether._engine.approvals.service import pending

        return pending(self._engine, self._engine.get_run(run_id, principal))

    async def cancel(self, run_id: str, reason: str = "cancelled by the client", *,
                     principal: str | None = None) -> RunResult:
        """Stop a run: nothing further is sent; a write already on the wire finishes and is journaled."""
        return await control.cancel(self._engine, run_id, reason, principal=principal)

    async def recover(self) -> list[RunResult]:
        """Continue runs whose owner died: lease expired, or its process on this host is gone (P-11)."""
        if self._worker is None:
            from tether._engine.worker import Worker

            self._worker = Worker(self._engine)
        return await self._worker.recover()

    # -- waits, signals, timers (P-18): tether._engine.waits ------------------------------

    async def resolve_wait(self, key: str, value: Any = None, *, error: str | None = None,
                           continue_run: bool = True) -> dict[str, Any]:
        """Settle a wait: the first resolution wins; the run continues here if it was parked on it."""
        return await control.resolve_wait(self._engine, key, value, error=error, continue_run=continue_run)

    def list_waits(self, run_id: str | None = None, *, principal: str | None = None,
                   status: str | None = "pending") -> list[dict[str, Any]]:
        """Pending waits with their keys (capabilities: show them only to whoever may resolve them)."""
        if run_id is not None:
            self._engine.get_run(run_id, principal)
        return self._engine.waits.views(run_id, status)

    async def signal(self, run_id: str, name: str, value: Any = None, *, principal: str | None = None) -> dict[str, Any]:
        """Send a named signal; `await wait_for_signal(name)` receives it (kept if it comes first)."""
        self._engine.get_run(run_id, principal)
        return await control.signal(self._engine, run_id, name, value)

    # -- cells (P-20) ----------------------------------------------------------------

    async def start_cell(self, code: str, *, yield_after_ms: int = 1000, principal: str | None = None,
                         meta: dict[str, Any] | None = None, key: str | None = None) -> dict[str, Any]:
        """Start a program and return an observation as soon as it yields, ends, pauses or time passes.

        With ``key`` (P-36), a repeat observes the cell the key already names, from its first event.
        """
        from tether._engine.cells import start_cell

        return await start_cell(self._engine, code, yield_after_ms=yield_after_ms, principal=principal, meta=meta,
                                key=key)

    async def wait_cell(self, cell_id: str, *, after: int = 0, timeout_ms: int = 30_000,
                        principal: str | None = None) -> dict[str, Any]:
        """Long-poll a cell's events after ``after``; works from any process sharing the store."""
        from tether._engine.cells import wait_cell

        return await wait_cell(self._engine, cell_id, after=after, timeout_ms=timeout_ms, principal=principal)

    async def terminate_cell(self, cell_id: str, *, principal: str | None = None) -> dict[str, Any]:
        """Stop a cell: nothing further is sent; a write on the wire finishes and is journaled."""
        from tether._engine.cells import terminate_cell

        return await terminate_cell(self._engine, cell_id, principal=principal)
