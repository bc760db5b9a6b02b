"""Durable waits (P-18): their keys, and the service that settles and revokes them.

A wait key is a signed capability naming (run, wait name). It is a bearer
capability — whoever holds it may resolve the wait — so it is signed with the
store's secret and cannot be derived from the run id. It is deterministic for
a (run, name) pair, so a resolution can arrive, be checked and be kept before
the run reaches the wait.

The store keeps only a key's digest (``store.base.wait_digest``): a reader of
the ``waits`` table finds nothing that resolves a wait or decides a write.
Whoever may see a wait gets its key recomputed from the secret.

Once handed out, a wait's key stays its key: after the secret is rotated
(docs/security.md) the run finds its wait by (run, name) and keeps the key
made under the older secret, which verifies while that secret is kept for
verification; only waits made after the rotation get keys under the new one.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from tether._engine.approvals.capabilities import WAIT_KEY
from tether._engine.approvals.model import APPROVAL_PREFIX
from tether._engine.attempt.result import to_json_value
from tether._store.base import (
    LOCAL_PRINCIPAL,
    WAIT_DIGEST_PREFIX,
    ParkEvent,
    SnapshotRecord,
    Store,
    WaitRecord,
    wait_digest,
)
from tether._store.states import WAIT_TRANSITIONS, WaitStatus
from tether.errors import InvalidTransition

SIGNAL_PREFIX = "signal:"
SLEEP_PREFIX = "sleep:"
# Names tether gives its own waits. A key is HMAC(run, name), so a program's ``wait_for("approval:2")`` would be
# handed the approval key of its own write 2 (shown to the agent) and park on a wait only the approvals service
# settles: the run could never continue. A program's own wait names stay outside them.
RESERVED_PREFIXES = (APPROVAL_PREFIX, SIGNAL_PREFIX, SLEEP_PREFIX)


def reserved_name_problem(name: str) -> str | None:
    """Why a program's ``wait_for`` may not use ``name`` (it is in tether's own namespace), or None."""
    if name.startswith(RESERVED_PREFIXES):
        return (f"a wait's name may not start with {', '.join(map(repr, RESERVED_PREFIXES))}: those are reserved "
                "for tether's own waits (approvals, signals, sleeps); name it otherwise")
    return None


def wait_key(secret: bytes, run_id: str, name: str) -> str:
    return WAIT_KEY.mint(secret, [run_id, name])


def parse_wait_key(secret: bytes | Sequence[bytes], key: str) -> tuple[str, str] | None:
    """(run_id, name) for a genuine key; None for a forged or malformed one.

    ``secret`` may be several (a keyring's current and older ones): a key made under any of them verifies.
    """
    try:
        run_id, name = WAIT_KEY.open(secret, key)
    except (ValueError, TypeError):
        return None
    return run_id, name


def key_for(store: Store, secret: bytes, run_id: str, name: str, older: Sequence[bytes] = ()) -> str:
    """The key of the wait (run, name) under ``secret``, or, once the secret was rotated (``older`` ones
    kept), the key it was handed out with under an older one."""
    key = wait_key(secret, run_id, name)
    if older and store.get_wait(key) is None:
        for w in store.list_waits(run_id=run_id, status=None):
            if w.name == name:
                return key_of(w, [secret, *older]) or key
    return key


def key_of(w: WaitRecord, secrets: Sequence[bytes]) -> str | None:
    """The key a stored wait (which holds only its digest) was handed out with, under a secret held here."""
    for secret in secrets:
        key = wait_key(secret, w.run_id, w.name)
        if w.key in (wait_digest(key), key):
            return key
    return None


def same_wait(a: str | None, b: str | None) -> bool:
    """Whether two keys name one wait, each a key or its digest (a run's record keeps the digest, D-33)."""
    return isinstance(a, str) and isinstance(b, str) and wait_digest(a) == wait_digest(b)


def reveal(pending: dict[str, Any], run_id: str, secrets: Sequence[bytes]) -> dict[str, Any]:
    """A parked run's ``pending`` for whoever may see the run: its wait key recomputed from the secret.

    The record keeps only the key's digest (``pending.as_stored``); the key is found again under a
    secret held here (the one it was handed out with, rotations included). Under none, the key is
    None: the digest is not shown as if it were one. A record from before digests keeps its key.
    """
    key, name = pending.get("key"), pending.get("name")
    if "writes" in pending or not isinstance(key, str) or not key.startswith(WAIT_DIGEST_PREFIX):
        return pending
    found = None
    if isinstance(name, str):
        found = next((k for k in (wait_key(s, run_id, name) for s in secrets) if wait_digest(k) == key), None)
    return {**pending, "key": found}


def wait_view(w: WaitRecord, key: str | None = None) -> dict[str, Any]:
    return {"key": key, "run_id": w.run_id, "name": w.name, "status": w.status, "seq": w.seq,
            "deadline": w.deadline, "value": w.value, "error": w.error, "created_at": w.created_at,
            "resolved_at": w.resolved_at}


def create(store: Store, wait: WaitRecord) -> WaitRecord:
    """Write a new wait row, pending (or find the one already there): every wait row is created here."""
    if wait.status != WaitStatus.PENDING:
        raise InvalidTransition(f"wait {wait.name} of run {wait.run_id} cannot start {wait.status}; nothing was "
                                "written", details={"run_id": wait.run_id, "to": str(wait.status)})
    return store.create_wait(wait)


def create_parking(store: Store, waits: Sequence[WaitRecord], run_id: str, expect: Sequence[str],
                   snapshot: SnapshotRecord, event: ParkEvent | None, **fields: Any) -> bool:
    """``create`` for the new waits of a run stopping at a host call, written with its stop in one transaction
    (``store.park_run``: the run's compare-and-set, its snapshot, these waits, its event)."""
    for wait in waits:
        if wait.status != WaitStatus.PENDING:
            raise InvalidTransition(f"wait {wait.name} of run {wait.run_id} cannot start {wait.status}; nothing "
                                    "was written", details={"run_id": wait.run_id, "to": str(wait.status)})
    return store.park_run(run_id, expect, snapshot, waits, event, **fields)


def settle(store: Store, wait: WaitRecord) -> tuple[bool, WaitRecord]:
    """Settle a wait row (the first settlement wins, WAIT_TRANSITIONS): every wait row is settled here."""
    if wait.status not in WAIT_TRANSITIONS[WaitStatus.PENDING]:
        raise InvalidTransition(f"wait {wait.name} of run {wait.run_id} cannot settle as {wait.status}; nothing "
                                "was written", details={"run_id": wait.run_id, "from": [str(WaitStatus.PENDING)],
                                                        "to": str(wait.status)})
    return store.settle_wait(wait)


class Waits:
    """A store's waits, signals and timers (P-18): their keys, settling, revoking.

    Continuing a run once its wait settles is not done here: ``control.resolve_wait``
    settles through this service, then wakes the run or decides the paused write.
    """

    def __init__(self, *, store: Store, secret: bytes, clock: Callable[[], float],
                 older: Sequence[bytes] = ()) -> None:
        self.store = store
        self._secret = secret
        # Older secrets (a rotated keyring's): keys made under them still verify.
        self._verify_with = [secret, *older]
        self.clock = clock

    def key(self, run_id: str, name: str) -> str:
        return key_for(self.store, self._secret, run_id, name, self._verify_with[1:])

    def reveal(self, run_id: str, pending: dict[str, Any]) -> dict[str, Any]:
        return reveal(pending, run_id, self._verify_with)

    def views(self, run_id: str | None, status: str | None) -> list[dict[str, Any]]:
        return [wait_view(w, key_of(w, self._verify_with))
                for w in self.store.list_waits(run_id=run_id, status=status)]

    def parse(self, key: str) -> tuple[str, str] | None:
        """The (run id, wait name) a key made under a secret held here names; None for any other string."""
        return parse_wait_key(self._verify_with, key)

    def resolve(self, key: str, run_id: str, name: str, value: Any, error: str | None) -> tuple[bool, WaitRecord]:
        """Settle the wait ``key`` names with a resolution from outside the run (the first one wins)."""
        now = self.clock()
        status = WaitStatus.FAILED if error is not None else WaitStatus.RESOLVED
        err = {"message": error} if error is not None else None
        return settle(self.store, WaitRecord(key, run_id, name, status, now, value=to_json_value(value)[0],
                                             error=err, resolved_at=now))

    def reach(self, run_id: str, name: str, *, seq: int, deadline: float | None,
              session: str | None) -> tuple[str, WaitRecord]:
        """The wait a program reached (``wait_for``, ``wait_for_signal``, ``sleep``), created pending unless it
        exists (a resolution may have come first, or an earlier attempt reached it): its key and its row."""
        key = self.key(run_id, name)
        row = create(self.store, WaitRecord(key, run_id, name, WaitStatus.PENDING, self.clock(), seq=seq,
                                            deadline=deadline, session=session))
        return key, row

    def end(self, key: str, run_id: str, name: str, *, seq: int, status: WaitStatus) -> WaitRecord:
        """Settle a wait its run ends itself (its deadline passed, a short sleep waited out); the row after
        (a resolution that came first wins)."""
        now = self.clock()
        _, row = settle(self.store, WaitRecord(key, run_id, name, status, now, seq=seq, resolved_at=now))
        return row

    def view(self, key: str) -> dict[str, Any] | None:
        """A stored wait as a resolver is shown it; None once its row is gone."""
        row = self.store.get_wait(key)
        return wait_view(row, key) if row is not None else None

    def revoke(self, *, run_id: str | None = None, session: str | None = None) -> int:
        """Revoke every pending wait of a run or a session; their keys stop working."""
        now, n = self.clock(), 0
        for w in self.store.list_waits(run_id=run_id, session=session):
            revoked = WaitRecord(w.key, w.run_id, w.name, WaitStatus.REVOKED, now, resolved_at=now)
            accepted, _ = settle(self.store, revoked)
            n += accepted
        return n

    def revoke_session(self, name: str, principal: str) -> None:
        """Revoke the waits of ``principal``'s session ``name``.

        Sessions are per (name, principal): another principal's session of
        the same name, and its waits, are not this caller's to end.
        """
        for run_id in {w.run_id for w in self.store.list_waits(session=name)}:
            run = self.store.get_run(run_id)
            if run is not None and (run.principal or LOCAL_PRINCIPAL) == principal:
                self.revoke(run_id=run_id)

    def cancel(self, run_id: str) -> None:
        """End a cancelled run's waits with it."""
        now = self.clock()
        for w in self.store.list_waits(run_id=run_id):
            settle(self.store, WaitRecord(w.key, w.run_id, w.name, WaitStatus.CANCELLED, now, resolved_at=now))
