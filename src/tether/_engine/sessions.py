"""REPL sessions (P-21): a session's globals, signed and kept in the store between executes.

Sessions are per (name, principal); the state is a signed sandbox dump, so a
process sharing the store can continue a session another process left.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Callable, Sequence

from tether._engine.approvals.capabilities import mac_hex, same
from tether._sandbox.monty import MONTY_VERSION
from tether._store.base import SessionRecord, Store
from tether.errors import SnapshotTampered


def sign_snapshot(secret: bytes, run_id: str, seq: int, version: str, data: bytes) -> str:
    """HMAC over everything a restore trusts: whose state, at which call, which build (P-9)."""
    msg = b"\x00".join([run_id.encode(), str(seq).encode(), version.encode(), hashlib.sha256(data).digest()])
    return mac_hex(secret, msg)


class Sessions:
    """Load, save and forget sessions' globals; ``ttl_seconds``: an idle session is forgotten after this long."""

    def __init__(self, *, store: Store, secret: bytes, clock: Callable[[], float],
                 ttl_seconds: float = 3600.0, older: Sequence[bytes] = ()) -> None:
        self.store = store
        self._secret = secret
        # A rotated keyring's older secrets: state saved before the rotation still verifies.
        self._older = tuple(older)
        self.clock = clock
        self.ttl_seconds = ttl_seconds

    def _mac(self, name: str, principal: str, data: bytes, secret: bytes | None = None) -> str:
        return sign_snapshot(secret or self._secret, f"session:{principal}:{name}", 0, MONTY_VERSION, data)

    def verify(self, name: str, principal: str, data: bytes, mac: str) -> None:
        if not any(same(self._mac(name, principal, data, s), mac) for s in (self._secret, *self._older)):
            raise SnapshotTampered(f"the stored state of session {name!r} failed its signature check; nothing ran")

    def base(self, name: str, principal: str, notes: list[str]) -> dict[str, Any] | None:
        """The state an execute in session ``name`` starts from (None: empty); why it is empty goes to ``notes``."""
        rec = self.store.get_session(name, principal)
        if rec is None:
            return None
        if rec.expires_at is not None and rec.expires_at < self.clock():
            self.store.delete_session(name, principal)
            notes.append(f"session {name!r} had expired; it started empty")
            return None
        if rec.monty_version != MONTY_VERSION:
            notes.append(f"session {name!r} was saved by {rec.monty_version} and cannot be loaded; it started empty")
            return None
        self.verify(name, principal, rec.data, rec.mac)
        return {"data": base64.b64encode(rec.data).decode(), "mac": rec.mac, "monty_version": rec.monty_version}

    def save(self, name: str, principal: str, data: bytes) -> None:
        now = self.clock()
        self.store.put_session(SessionRecord(name, principal, MONTY_VERSION, data, self._mac(name, principal, data),
                                             now, now + self.ttl_seconds))

    def delete(self, name: str, principal: str) -> bool:
        return self.store.delete_session(name, principal)
