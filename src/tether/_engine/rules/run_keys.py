"""Run keys: the caller's idempotency key for the request that starts a run (P-36).

A client whose request died (a replica killed, a balancer timeout, a laptop
asleep) cannot know whether its program ran; a durable workflow engine
retries a step after a crash. Either way the retry carries the key the first
request carried, and (principal, key) names one run for as long as the run is
kept: a repeat gets that run's current envelope, never a second run.

The store's unique index on (principal, run_key) decides which of two requests
racing with one key starts the run: each tries to insert, exactly one insert
succeeds, the other reads the winner's row. Nothing here reads before writing.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from tether._engine.attempt.result import RunResult
from tether._store.base import Conflict, RunRecord
from tether._store.states import RunStatus
from tether.errors import IdempotencyConflict, InvalidArguments

if TYPE_CHECKING:
    from tether._engine.engine import Engine
    from tether._engine.rules.quotas import CountedStart

# Long enough for a UUID with a prefix, or "<workflow id>:<step>" of a durable engine.
MAX_RUN_KEY_CHARS = 200
# Where a keyed run keeps what its request was, to tell a retry from a different request.
FINGERPRINT = "run_key_request"


def check_run_key(key: Any) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_RUN_KEY_CHARS or not key.isprintable():
        shown = f"{len(key)} characters" if isinstance(key, str) else type(key).__name__
        raise InvalidArguments(f"a run key is 1 to {MAX_RUN_KEY_CHARS} printable characters (got {shown}); "
                               "nothing was run",
                               next_action="Send a key such as a UUID made once per request and reused on its retries.")
    return key


# Recorded by the process that serves a request (its tool modules, its config file), not chosen by the
# caller: a retry served by another replica, configured from another path, is the same request.
HOST_META = frozenset({"tools", "config"})


def request_fingerprint(code: str, *, session: str | None, check: str, meta: dict[str, Any] | None) -> str:
    """What makes two requests the same request: the program, the session and the caller's options."""
    options = {k: v for k, v in (meta or {}).items() if k not in HOST_META}
    body = json.dumps({"program": code, "session": session, "check": check, "meta": options},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def mark(run: RunRecord, key: str, fingerprint: str) -> None:
    run.run_key = key
    run.meta[FINGERPRINT] = fingerprint


def create_or_find(engine: Engine, run: RunRecord, counted: CountedStart | None = None) -> RunRecord | None:
    """Record ``run``; None if it was recorded, else the run its key already names.

    Raises ``IdempotencyConflict`` when that run was started by a different request.
    """
    assert run.run_key is not None and run.principal is not None
    for _ in range(3):
        try:
            engine.lifecycle.create(run, counted)
            return None
        except Conflict:
            existing = engine.store.get_run_by_key(run.principal, run.run_key)
        if existing is None:
            continue  # the holder of the key was deleted between our insert and our read: try again
        if existing.meta.get(FINGERPRINT) != run.meta.get(FINGERPRINT):
            raise IdempotencyConflict(
                f"the key {run.run_key!r} already names run {existing.run_id} ({existing.status}), started with "
                "a different program, session or options; nothing was started or sent for this request",
                details={"run_id": existing.run_id, "status": str(existing.status), "key": run.run_key})
        return existing
    raise Conflict(f"run key {run.run_key!r} kept changing hands; nothing was started")


def current_envelope(engine: Engine, run: RunRecord) -> RunResult | None:
    """The envelope of a run that is not running now (ended, paused, waiting); None while it runs or waits in line."""
    if run.status in (RunStatus.RUNNING, RunStatus.QUEUED):
        return None
    if run.result is not None:
        return engine.recorded(run)  # a parked wait's key recomputed for the key's holder (D-33)
    return RunResult(status=run.status, run_id=run.run_id, error=run.error)


def still_running(run_id: str, status: str, waited: float, *, named_by: str = "this key") -> RunResult:
    again = "the same key" if named_by == "this key" else "the same decision"
    return RunResult(status=status, run_id=run_id, error={
        "code": "still_running",
        "message": f"run {run_id}, which {named_by} names, is still {status} after {waited:g} s; "
                   "no second run was started",
        "next_action": f"Call again with {again} to get its outcome, or wait with `tether runs await {run_id}`.",
        "details": {"run_id": run_id}})
