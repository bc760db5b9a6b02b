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

from typing import Any, Awaitable, Callable, Sequence

from tether._engine.approvals.capabilities import WAIT_KEY

# A paused write is a wait named approval:<seq>; what resolves it is a decision.
from tether._engine.approvals.model import APPROVAL_PREFIX, DECISIONS, decision_of
from tether._engine.result import to_json_value
from tether._store.base import LOCAL_PRINCIPAL, WAIT_DIGEST_PREFIX, Store, WaitRecord, wait_digest
from tether._store.states import TERMINAL_RUN_STATUSES, RunStatus, WaitStatus
from tether.errors import AlreadyDecided, ToolsUnavailable, UsageError, WrongSecret

SIGNAL_PREFIX = "signal:"
SLEEP_PREFIX = "sleep:"


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


class Waits:
    """A store's waits, signals and timers (P-18): their keys, settling, revoking.

    Continuing a run once its wait settles is the runtime's work, handed in:
    ``wake(run_id, key=...)`` continues a parked run here, ``resume(run_id,
    decision, reason, seq=..., principal=..., via=...)`` decides a paused write.
    """

    def __init__(self, *, store: Store, secret: bytes, clock: Callable[[], float],
                 wake: Callable[..., Awaitable[Any]], resume: Callable[..., Awaitable[Any]],
                 left: Callable[[str], None] = lambda run_id: None, older: Sequence[bytes] = ()) -> None:
        self.store = store
        self._secret = secret
        # Older secrets (a rotated keyring's): keys made under them still verify.
        self._verify_with = [secret, *older]
        self.clock = clock
        self._wake = wake
        self._resume = resume
        # Told when a wait was settled and the run not continued here: a runner elsewhere may.
        self._left = left

    def key(self, run_id: str, name: str) -> str:
        return key_for(self.store, self._secret, run_id, name, self._verify_with[1:])

    def reveal(self, run_id: str, pending: dict[str, Any]) -> dict[str, Any]:
        return reveal(pending, run_id, self._verify_with)

    def views(self, run_id: str | None, status: str | None) -> list[dict[str, Any]]:
        return [wait_view(w, key_of(w, self._verify_with))
                for w in self.store.list_waits(run_id=run_id, status=status)]

    async def resolve(self, key: str, value: Any = None, *, error: str | None = None,
                      continue_run: bool = True) -> dict[str, Any]:
        """Settle a wait: the first resolution wins; the run continues here if it was parked on it."""
        parsed = parse_wait_key(self._verify_with, key)
        if (parsed is None and isinstance(key, str) and not key.startswith(WAIT_DIGEST_PREFIX)
                and self.store.get_wait(key) is not None):
            # tether made this key (it names a stored wait), under a secret no longer held here.
            raise WrongSecret("the wait key was made with a secret this process does not hold; nothing was "
                              "resolved or sent", details={"key": key})
        run = self.store.get_run(parsed[0]) if parsed else None
        existing = self.store.get_wait(key) if parsed else None
        if parsed is None or run is None or (existing is not None and existing.status == WaitStatus.REVOKED):
            return {"status": "unknown_or_revoked", "key": key,
                    "next_action": "Check the key (tether waits list); the wait may have been revoked."}
        run_id, name = parsed
        if name.startswith(APPROVAL_PREFIX):
            if not continue_run:
                # Settling the wait row alone would record a decision the journal never took, and a name in
                # the timeline nobody checked: an approval is decided by the approvals service, or not at all.
                raise UsageError(
                    f"{name} of run {run_id} is a paused write's approval; it is decided through the approvals "
                    "service, which continues the run, so it cannot be resolved with continue_run=False. Nothing "
                    "was decided or sent", code="invalid_arguments",
                    next_action="Resolve the key with continue_run=True, or decide with rt.decide / "
                                "`tether runs approve`.")
            # The key is the capability: whoever holds it decides as the run's owner.
            return await self._resolve_approval(key, run_id, name, value, error, run.principal)
        if existing is None and run.status in TERMINAL_RUN_STATUSES:
            return {"status": "unknown_or_revoked", "key": key, "next_action": f"Run {run_id} has ended."}
        now = self.clock()
        status = WaitStatus.FAILED if error is not None else WaitStatus.RESOLVED
        err = {"message": error} if error is not None else None
        value = to_json_value(value)[0]
        accepted, row = self.store.settle_wait(WaitRecord(key, run_id, name, status, now, value=value, error=err,
                                                          resolved_at=now))
        out = {"status": "accepted" if accepted else "already_resolved", "key": key, "wait": wait_view(row, key)}
        # A resolution kept while the run could not continue (tools_unavailable) wakes it on a later try.
        result = None
        if continue_run and (accepted or (row.status == WaitStatus.RESOLVED and run.status == RunStatus.WAITING)):
            try:
                result = await self._wake(run_id, key=key)
            except ToolsUnavailable as exc:
                self._left(run_id)
                raise ToolsUnavailable(
                    f"{exc.message}; the wait's resolution is kept: resolve it again where the sources load "
                    "(or let a worker that has them wake the run)",
                    details={**exc.details, "wait": out["status"]}) from None
            if result is not None:
                out["run"] = result.to_dict()
        if accepted and result is None:
            self._left(run_id)  # parked here on it, a runner continues it; running, it finds the value itself
        return out

    async def _resolve_approval(self, key: str, run_id: str, name: str, value: Any,
                                error: str | None, owner: str | None) -> dict[str, Any]:
        """Resolving an approval wait is deciding the paused write: resume() does the work."""
        seq = int(name.split(":", 1)[1])
        decision, reason = decision_of(value, error)
        if decision not in DECISIONS:
            return {"status": "invalid_value", "key": key,
                    "next_action": 'Resolve an approval with {"decision": "approve" | "decline" | "cancel", '
                                   '"reason": "..."}.'}
        row = self.store.get_wait(key)
        if row is not None and row.status != WaitStatus.PENDING:
            return {"status": "already_resolved", "key": key, "wait": wait_view(row, key)}
        try:
            result = await self._resume(run_id, decision, reason, seq=seq, principal=owner, via="key")
        except AlreadyDecided:
            return {"status": "already_resolved", "key": key, "wait": self._view(key)}
        return {"status": "accepted", "key": key, "wait": self._view(key), "run": result.to_dict()}

    def _view(self, key: str) -> dict[str, Any] | None:
        row = self.store.get_wait(key)  # an approval's wait row exists while its key does
        return wait_view(row, key) if row is not None else None

    async def signal(self, run_id: str, name: str, value: Any = None) -> dict[str, Any]:
        return await self.resolve(self.key(run_id, SIGNAL_PREFIX + name), value)

    def revoke(self, *, run_id: str | None = None, session: str | None = None) -> int:
        """Revoke every pending wait of a run or a session; their keys stop working."""
        now, n = self.clock(), 0
        for w in self.store.list_waits(run_id=run_id, session=session):
            revoked = WaitRecord(w.key, w.run_id, w.name, WaitStatus.REVOKED, now, resolved_at=now)
            accepted, _ = self.store.settle_wait(revoked)
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
            self.store.settle_wait(WaitRecord(w.key, w.run_id, w.name, WaitStatus.CANCELLED, now, resolved_at=now))
