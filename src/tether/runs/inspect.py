"""Read-only views of a run for people: the timeline of `tether runs show`."""

from __future__ import annotations

from typing import Any

from ..errors import RunNotFound
from ..store.base import Store
from .quarantine import takeovers


def run_timeline(store: Store, run_id: str) -> dict[str, Any]:
    run = store.get_run(run_id)
    if run is None:
        raise RunNotFound(f"no run {run_id!r}")
    calls = []
    for c in store.get_calls(run_id):
        ms = None
        if c.started_at is not None and c.finished_at is not None:
            ms = round((c.finished_at - c.started_at) * 1000, 3)
        calls.append({
            "seq": c.seq, "op": c.op, "address": c.address, "args": c.args, "kind": c.kind, "state": c.state,
            "started_at": c.started_at, "finished_at": c.finished_at, "ms": ms,
            "error": c.error,
        })
    snap = store.latest_snapshot(run_id)
    # Who decided each paused write, and from where (P-29).
    decisions = [{k: e.data.get(k) for k in ("seq", "address", "decision", "reason", "actor", "via", "origin", "at")}
                 for e in store.get_events(run_id, limit=100_000) if e.type == "decided"]
    pending = run.pending
    if pending and pending.get("writes"):
        by_seq = {d["seq"]: d for d in decisions}
        pending = {**pending, "writes": [{**w, "decision": by_seq.get(w["seq"])} for w in pending["writes"]]}
    return {
        "run_id": run.run_id,
        "status": run.status,
        # Whose run it is (P-24): what an operator names with `--as` to act on it from the command line.
        "principal": run.principal or "local",
        # The name or e-mail an access token gave for it, when the run was started with one.
        "principal_name": (run.meta or {}).get("principal_name"),
        "program": run.program,
        "environment": run.environment,
        "policy": run.policy,
        "limits": run.limits,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "pending": pending,
        "expires_at": run.expires_at,
        "decision": run.decision,
        "decisions": decisions,
        # The attempts in a row that ended with their process gone (P-39): seen while the run still runs.
        "takeovers": takeovers(run),
        "calls": calls,
        "snapshot": None if snap is None else {"seq": snap.seq, "kind": snap.kind, "bytes": len(snap.data),
                                               "monty_version": snap.monty_version},
        "outcome": run.result,
    }
