"""What the engine's services call on the process that runs them (the Runtime), as an interface.

Approvals (approvals/service.py), takeover (quarantine.py), run keys (run_keys.py) and the worker
(worker.py) are imported by the Runtime; naming the Runtime back, even for types only, made one import
circle of the engine (tests/test_layout.py counts type-only imports). They name :class:`RunHost`
instead, which imports none of them: the members they use, with the Runtime's signatures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from tether._config import Config
    from tether._engine.approvals.capabilities import Keyring
    from tether._engine.approvals.model import Approver
    from tether._engine.finish import Finisher
    from tether._engine.handle import RunHandle
    from tether._engine.lifecycle import Lifecycle
    from tether._engine.notices import Notices
    from tether._engine.result import RunResult
    from tether._sandbox.monty import SandboxPool
    from tether._store.base import AsyncStore, RunRecord, Store
    from tether._tools.catalog import Catalog

__all__ = ["RunHost"]


class RunHost(Protocol):
    store: Store
    astore: AsyncStore
    catalog: Catalog
    clock: Callable[[], float]
    owner: str
    keyring: Keyring
    lifecycle: Lifecycle
    finisher: Finisher
    pool: SandboxPool
    config: Config | None

    @property
    def notices(self) -> Notices: ...

    def launch(self, run: RunRecord, *, mode: str, on_approval: Approver | None = None, t0: float | None = None,
               on_progress: Callable[[int, str], None] | None = None,
               on_question: Callable[..., Any] | None = None,
               notes: list[str] | None = None, detached: bool = False) -> RunHandle: ...

    def running(self, run_id: str) -> RunHandle | None: ...

    async def wait_for_run(self, run_id: str, timeout: float = 300.0) -> RunResult: ...

    def get_run(self, run_id: str, principal: str | None = None) -> RunRecord: ...

    def recorded(self, run: RunRecord) -> RunResult: ...

    async def require_sources(self, run: RunRecord, *, live: tuple[str, ...] = ()) -> None: ...

    def vet(self, run: RunRecord) -> tuple[bool, RunResult | None]: ...

    def verify_run(self, run: RunRecord) -> None: ...

    def wait_key(self, run_id: str, name: str) -> str: ...

    def revoke_waits(self, *, run_id: str | None = None, session: str | None = None) -> int: ...

    async def wake(self, run_id: str, key: str | None = None) -> RunResult | None: ...

    def expire_paused(self) -> list[str]: ...

    def gone_owners(self) -> list[RunRecord]: ...

    def listen_for_events(self) -> None: ...

    def event(self, run_id: str, type: str, data: dict[str, Any]) -> int: ...
