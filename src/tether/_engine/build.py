"""Building an Engine: every service made once, in order, and wired explicitly.

The one place that knows how the parts fit: a RunHandle's ``cancel`` goes to
``control.cancel`` (the waits service needs nothing handed back: continuing a
run once its wait settles is ``control.resolve_wait``'s); the sources (when a config names them) receive the catalog, the attempts running
here and the event bus. Each is handed the Engine it belongs to, never the
runtime over it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from tether._engine import control
from tether._engine.approvals.capabilities import keyring_for
from tether._engine.attempt.result import RunResult
from tether._engine.engine import Attempts, Engine, Settings
from tether._engine.events import EventBus
from tether._engine.finish import Finisher
from tether._engine.lifecycle import Lifecycle
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy
from tether._engine.sessions import Sessions
from tether._engine.waits import Waits
from tether._sandbox.monty import SandboxPool
from tether._store.base import Store

if TYPE_CHECKING:
    from tether._config import Config
    from tether._tools.catalog import Catalog


def build_engine(*, store: Store, catalog: Catalog, pool: SandboxPool, policy: Policy, limits: Limits,
                 settings: Settings, owner: str, lease_seconds: float = 30.0,
                 clock: Callable[[], float] = time.time, config: Config | None = None) -> Engine:
    """The engine over ``store``; with ``config``, its sources are set up (loaded by tether._app.open_runtime)."""
    keyring = keyring_for(store)
    secret = keyring.current
    events = EventBus(store=store, clock=clock)
    attempts = Attempts()
    engine: Engine  # assigned below; the callbacks read it when called, once it exists

    async def cancel_run(run_id: str, reason: str) -> RunResult:
        return await control.cancel_for_handle(engine, run_id, reason)

    sessions = Sessions(store=store, secret=secret, clock=clock, older=keyring.previous)
    waits = Waits(store=store, secret=secret, clock=clock, older=keyring.previous)
    lifecycle = Lifecycle(store, owner=owner, clock=clock, lease_seconds=lease_seconds)
    finisher = Finisher(store=store, lifecycle=lifecycle, bus=events, clock=clock, cancel_waits=waits.cancel,
                        revoke_waits=lambda run_id: waits.revoke(run_id=run_id))
    sources = None
    if config is not None:
        from tether._sources.loader import SourceSet, forward_progress

        sources = SourceSet(catalog, attempts=attempts, events=events, store=store, log_dir=config.home / "logs",
                            local=config.sources, progress=forward_progress(store, attempts, events),
                            default_call_timeout=config.limits.call_timeout_seconds)
    engine = Engine(
        store=store, astore=store.aio, keyring=keyring, clock=clock, owner=owner, catalog=catalog, pool=pool,
        policy=policy, limits=limits, lifecycle=lifecycle, waits=waits, sessions=sessions,
        events=events, finisher=finisher, settings=settings, attempts=attempts, sources=sources, config=config,
        cancel_run=cancel_run, policy_dict=policy.to_dict(), limits_dict=limits.to_dict(),
    )
    return engine
