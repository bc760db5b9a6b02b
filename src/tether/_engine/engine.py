"""The engine: the services a runtime is made of, built once (tether._engine.build) and handed to each.

A service (the launcher, an attempt, the approvals service, the worker, cells)
receives the :class:`Engine` and reads the parts it needs from it; none
receives the :class:`~tether.Runtime`, which is the public face over this. The
engine is frozen: its parts are fixed when it is built. What changes while it
serves lives inside named parts: :class:`Settings` (knobs a host may turn) and
:class:`Attempts` (the attempts running in this process).

Callbacks a caller gives a run (``on_approval``, ``on_progress``,
``on_question``) travel together as one :class:`Hooks`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from tether._engine.attempt.result import RunResult
from tether._engine.events import EventBus
from tether._engine.finish import Finisher
from tether._engine.lifecycle import Lifecycle
from tether._engine.notices import ENDED, wait_a_little
from tether._engine.ownership import owner_gone
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy
from tether._engine.rules.quotas import Quotas
from tether._engine.sessions import Sessions
from tether._engine.waits import Waits
from tether._sandbox.monty import SandboxPool
from tether._store.base import LOCAL_PRINCIPAL, AsyncStore, RunRecord, Store
from tether._store.states import RunStatus
from tether.errors import RunNotFound

if TYPE_CHECKING:
    from tether._config import Config
    from tether._engine.approvals.capabilities import Keyring
    from tether._engine.attempt.handle import RunHandle
    from tether._engine.calls.boundary import EffectBoundary
    from tether._sources.loader import SourceSet
    from tether._tools.catalog import Catalog

# Puts an upstream tool's question (an MCP elicitation) to the run's user:
# {"run_id","address","message","mode","schema","url"} -> {"action", "content"}.
Asker = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Hooks:
    """What the caller of one execute / resume is told or asked while the run goes on, here.

    ``on_approval(pending)`` decides a write at once instead of pausing;
    ``on_progress(done, message)`` hears progress; ``on_question(question)``
    answers an upstream MCP server's mid-call question. None of them is stored:
    an attempt continued elsewhere has none.
    """

    on_approval: Any = None  # tether._engine.approvals.model.Approver
    on_progress: Callable[[int, str], None] | None = None
    on_question: Asker | None = None


NO_HOOKS = Hooks()


@dataclass
class Settings:
    """The knobs an engine reads; a host (or a test) may turn one while it serves.

    An attempt takes a copy when it starts, so one attempt sees one set.
    """

    principal: str  # whose runs a call without an explicit principal starts and acts on
    check: str  # the pre-run check of a run started without one: "calls", "full" or "off"
    local_runs: str  # "private" or "shared": whether callers with a token may act on local runs
    approval_ttl_seconds: float
    checkpoint_every_calls: int
    checkpoint_every_seconds: float
    inline_sleep_seconds: float = 1.0
    # How long a forming write pause waits for more writes issued with it (P-27).
    batch_window_seconds: float = 0.05
    # How long a repeated keyed request waits for the run its key names to stop running
    # before it gets a `running` envelope (P-36).
    rejoin_wait_seconds: float = 310.0
    quotas: Quotas | None = None  # per-principal limits on starting runs ([quotas]); None: none
    run_signature: int = 2  # the format runs are signed in ([store] run_signature, D-55)

    @property
    def type_check(self) -> bool:
        """Whether the bundled type checker runs before programs (check mode "full")."""
        return self.check == "full"

    def copy(self) -> Settings:
        # A shallow copy, as dataclasses.replace made, without calling __init__ again field by field.
        return copy.copy(self)


@dataclass
class Attempts:
    """The attempts running in this process: their handles, and their effect boundaries while they run."""

    # By run id, from the launch of an attempt until its task ends (add() keeps and forgets them).
    handles: dict[str, RunHandle] = field(default_factory=dict)
    # By run id; each attempt adds its own while its program runs (upstream questions and
    # progress find their run through them; cancel stops it).
    live: dict[str, EffectBoundary] = field(default_factory=dict)

    def handle(self, run_id: str) -> RunHandle | None:
        return self.handles.get(run_id)

    def add(self, handle: RunHandle, task: asyncio.Task[Any], bus: EventBus) -> None:
        """Keep ``handle`` as its run's attempt here until ``task`` (its attempt's) ends, then forget it.

        Forgotten in the task's done callback, not in the attempt's own ``finally``: a task
        cancelled before its first step never runs its body, and its handle must go all the same.
        """
        self.handles[handle.run_id] = handle

        def ended(t: asyncio.Task[Any]) -> None:
            if self.handles.get(handle.run_id) is handle:
                del self.handles[handle.run_id]
            # Observers here were woken by the run's last event; later ones poll the store.
            bus.forget(handle.run_id)
            if not t.cancelled():
                t.exception()  # retrieved: whoever awaits the handle gets it; the store has the outcome

        task.add_done_callback(ended)

    def boundaries_calling(self, address: str) -> list[EffectBoundary]:
        """The effect boundaries of attempts here with a call to ``address`` on the wire now."""
        return [b for b in list(self.live.values()) if b.inflight_addresses.get(address, 0) > 0]


@dataclass(frozen=True)
class Engine:
    """Everything a run is executed, paused, continued and ended with, in one process."""

    store: Store
    # The store as code on the event loop awaits it: Postgres calls run off the loop (D-27).
    astore: AsyncStore
    # Signs and verifies runs, journals and snapshots (P-35); its current secret keys waits and sessions.
    keyring: Keyring
    clock: Callable[[], float]
    # Names this process's host and pid, so a runtime on the same host can tell it is gone.
    owner: str
    catalog: Catalog
    pool: SandboxPool
    policy: Policy
    limits: Limits
    # Every change of a run's status, owner and lease goes through it (_engine/lifecycle.py).
    lifecycle: Lifecycle
    waits: Waits
    sessions: Sessions
    # Stored run events, this process's observers, and the listeners told when a run pauses or ends.
    events: EventBus
    # Records how runs end (completed, failed, cancelled, refused, internal errors).
    finisher: Finisher
    settings: Settings
    attempts: Attempts
    # The sources loaded in this process, when it was opened from a config (tether._app.open_runtime).
    sources: SourceSet | None
    config: Config | None
    # How a RunHandle's cancel() stops its run (tether._engine.control.cancel; wired by build).
    cancel_run: Callable[[str, str], Awaitable[RunResult]]
    # Verdicts of the bundled type checker by (program, stubs): a resent program is not checked twice.
    verdicts: dict[str, bool] = field(default_factory=dict)
    # Recorded on every run; computed once (dataclasses.asdict deep-copies).
    policy_dict: dict[str, Any] = field(default_factory=dict)
    limits_dict: dict[str, Any] = field(default_factory=dict)

    @property
    def type_check(self) -> bool:
        """The check of runs that recorded only the older type_check flag."""
        return self.settings.type_check

    # -- who may act on a run -------------------------------------------------------

    def may_act_on(self, run: RunRecord, principal: str | None) -> bool:
        """Whether ``principal`` (None: the engine's own) may see and act on ``run``. Never skipped."""
        caller = principal if principal is not None else self.settings.principal
        # A row from before every run had an owner was started locally (migration 4).
        owner = run.principal if run.principal is not None else LOCAL_PRINCIPAL
        if owner == caller:
            return True
        return owner == LOCAL_PRINCIPAL and self.settings.local_runs == "shared"

    def get_run(self, run_id: str, principal: str | None = None) -> RunRecord:
        """The run, if ``principal`` may act on it; another principal's run does not exist for the caller."""
        run = self.store.get_run(run_id) if isinstance(run_id, str) else None
        if run is None or not self.may_act_on(run, principal):
            raise RunNotFound(f"no run {run_id!r}")
        return run

    def recorded(self, run: RunRecord) -> RunResult:
        """A run's last recorded envelope for whoever may see it: a parked wait's key recomputed (D-33)."""
        if run.result and (run.result.get("status") == run.status or not RunStatus(run.status).terminal):
            result = RunResult.from_dict(run.result)
        else:
            # Ended, its envelope not (yet) written by the process that ended it: the end as recorded (P-53, D-90).
            result = RunResult(status=run.status, run_id=run.run_id, error=run.error)
        if result.status == RunStatus.WAITING and result.pending:
            result = dataclasses.replace(result, pending=self.waits.reveal(run.run_id, result.pending))
        return result

    # -- waiting for a run, loading its sources ------------------------------------------

    async def wait_for_run(self, run_id: str, timeout: float = 300.0) -> RunResult:
        """Wait until the run is not running (here or in another process); return its recorded outcome."""
        handle = self.attempts.handle(run_id)
        if handle is not None:
            return await asyncio.shield(handle.task)
        with self.events.notices.watch(ENDED, run_id) as ended:
            self.events.listen()
            return await self._poll_run(run_id, timeout, ended)

    async def _poll_run(self, run_id: str, timeout: float, ended: asyncio.Event) -> RunResult:
        delay = 0.02
        deadline = time.monotonic() + timeout
        while True:
            run = await self.store.aio.get_run(run_id)
            if run is None:
                raise RunNotFound(f"no run {run_id}")
            # A run a process holds while it ends it (a cancel decided on its pause settles the pause's writes
            # first) still carries the envelope it paused with: its end is what the caller is to see (P-51).
            # So does a run a process holds while it ends it (an ended run still owned: a cancel's envelope not yet
            # written, D-90); once no live process holds it, the end it recorded is what the caller sees.
            held = run.lease_until is not None and run.lease_until >= self.clock()
            over = RunStatus(run.status).terminal
            ending = held and ((run.result is not None and run.result.get("status") != run.status)
                               or (over and run.owner is not None))
            if run.status != RunStatus.RUNNING and (run.result is not None or over) and not ending:
                return self.recorded(run)
            lapsed = run.lease_until is None or run.lease_until < self.clock()
            # Its owner a process on this host that has certainly ended (pid, host key and start time, never a
            # guess): nobody renews the lease, so waiting it out would only delay the same answer (D-92).
            if run.status == RunStatus.RUNNING and (lapsed or owner_gone(run.owner)):
                # Nobody is running it, so waiting would only time out: say so at once.
                return RunResult(status=run.status, run_id=run_id, error={
                    "code": "run_unowned",
                    "message": f"run {run_id} is marked running but no process owns it (its process stopped)",
                    "next_action": f"Continue it with `tether recover` (or a worker), or end it with "
                                   f"`tether runs cancel {run_id}`.",
                    "details": {"owner": run.owner, "how": "lease_lapsed" if lapsed else "process_gone"}})
            if time.monotonic() > deadline:
                return RunResult(status=run.status, run_id=run_id, error={
                    "code": "still_running",
                    "message": f"run {run_id} is still {run.status} in process {run.owner} after {timeout:g} s",
                    "next_action": f"Wait for it with `tether runs await {run_id}`.", "details": {}})
            # A notice that the run stopped running (another process) ends the wait early.
            await wait_a_little(ended, delay)
            delay = min(delay * 2, 0.5)

    async def require_sources(self, run: RunRecord, *, live: tuple[str, ...] = ()) -> None:
        """Load the sources ``run`` was started with, or raise ToolsUnavailable leaving the run as it is.

        ``live``: addresses the run will call at once (a paused write): their
        servers must be reachable now, not only their cached listings.
        """
        from tether._engine.integrity import verify_run

        recorded = (run.meta or {}).get("sources")
        if self.sources is None or recorded is None:
            return
        # The definitions name commands to spawn and modules to import: only a run whose
        # record verifies is trusted with that (P-35); RunTampered / WrongSecret otherwise.
        verify_run(self.keyring, run)
        await self.sources.require(recorded, live=tuple(a.split(".", 1)[0] for a in live),
                                   run_id=run.run_id, status=run.status)

    # -- the catalog as a program sees it -----------------------------------------------

    def search(self, query: str = "", namespace: str | None = None, limit: int = 12,
               offset: int = 0) -> dict[str, Any]:
        from tether._tools.search import search

        return search(self.catalog, query, namespace=namespace, limit=limit, offset=offset)

    def describe(self, addresses: str | list[str], detail: str = "default", offset: int = 0, *,
                 whole: bool = False) -> list[dict[str, Any]]:
        from tether._tools.describe import describe

        return describe(self.catalog, addresses, detail=detail, offset=offset, whole=whole)

    def list_sources(self) -> list[dict[str, Any]]:
        """The catalog's namespaces; a source that failed is listed with its error, so a program is not
        left guessing."""
        from tether._tools.describe import list_sources

        listed = list_sources(self.catalog)
        return listed + [{"namespace": ns, "tools": 0, "error": error}
                         for ns, error in sorted(self.source_failures().items())]

    def source_failures(self) -> dict[str, str]:
        """Sources configured here that failed to load, by namespace (a refusal names them)."""
        return self.sources.failures() if self.sources is not None else {}

    def model_description(self) -> str:
        """The ``execute`` tool's description: the sandbox API, the catalog, how to retry by key (P-36)."""
        from tether._tools.prompt import execute_description

        return execute_description(self.catalog, self.limits.to_dict())
