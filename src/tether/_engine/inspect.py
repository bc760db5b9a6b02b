"""Read-only views of a run for people: the timeline of `tether runs show`."""

from __future__ import annotations

import re
from typing import Any

from tether._engine.rules.quarantine import takeovers
from tether._store.base import Store
from tether.errors import RunNotFound


def run_timeline(store: Store, run_id: str) -> dict[str, Any]:
    run = store.get_run(run_id)
    if run is None:
        raise RunNotFound(f"no run {run_id!r}")
    calls = []
    rollback, undone_by = rollback_of(run.result, run.pending)
    undoes = {u: s for s, u in undone_by.items()}
    for c in store.get_calls(run_id):
        ms = None
        if c.started_at is not None and c.finished_at is not None:
            ms = round((c.finished_at - c.started_at) * 1000, 3)
        calls.append({
            "seq": c.seq, "op": c.op, "address": c.address, "args": c.args, "kind": c.kind, "state": c.state,
            "started_at": c.started_at, "finished_at": c.finished_at, "ms": ms,
            "error": c.error,
            # Each original write beside its compensation (P-46).
            **({"undone_by": undone_by[c.seq]} if c.seq in undone_by and c.op != "undo" else {}),
            **({"undoes": undoes[c.seq]} if c.op == "undo" and c.seq in undoes else {}),
            **({"lineage": _lineage_shown(c.lineage)} if c.lineage is not None else {}),
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
        "rollback": rollback,
    }


def _lineage_shown(lineage: dict[str, Any]) -> dict[str, Any]:
    """A journal entry's lineage as the timeline keeps it (P-45): an untrusted read's label and how many marks
    its result gave (the values stay in the journal), or a guarded write's verdict with every reason."""
    shown: dict[str, Any] = {}
    if "ask" in lineage:
        shown.update(asked=bool(lineage.get("ask")), reasons=lineage.get("reasons") or [])
    if "trust" in lineage:
        marks = lineage.get("marks")
        shown.update(trust=lineage.get("trust"), marks=len(marks) if isinstance(marks, list) else 0)
    return shown


def rollback_of(result: Any, pending: Any) -> tuple[list[dict[str, Any]] | None, dict[int, int]]:
    """A run's rollback (P-46) — the ended run's list, or the plan one in progress carries out — and, by the
    seq of each original write, the seq of its compensation."""
    lines = result.get("rollback") if isinstance(result, dict) else None
    if isinstance(lines, list):
        return lines, {x["seq"]: x["undo"]["seq"] for x in lines if isinstance(x, dict) and x.get("undo")}
    plan = pending.get("rollback") if isinstance(pending, dict) else None
    if isinstance(plan, dict):
        steps = [s for s in plan.get("steps") or [] if isinstance(s, dict)]
        return steps, {s["seq"]: s["undo_seq"] for s in steps if s.get("undo_seq") is not None}
    return None, {}


# Comment lines that say how to read the file, not what the program does.
_TOOLING_COMMENT = re.compile(r"^(-\*-|(vim?|ex):|coding[:=]|type:|noqa|pragma|fmt:|pyright|mypy|ruff)", re.I)
SUMMARY_CHARS = 120


def program_summary(program: str | None, limit: int = SUMMARY_CHARS) -> str | None:
    """What a program says it does, for a list of runs: its first comment line, else the first line
    that calls a tool, else its first statement; shortened to ``limit`` characters."""
    lines = [line.strip() for line in (program or "").splitlines()]
    for line in lines:
        if line.startswith("#") and not line.startswith("#!"):
            text = line.lstrip("#").strip()
            if text and not _TOOLING_COMMENT.match(text):
                return _cut(text, limit)
    code = [line for line in lines if line and not line.startswith("#")]
    pick = next((line for line in code if "tools." in line and not line.startswith(("import ", "from "))), None)
    pick = pick or next((line for line in code if not line.startswith(("import ", "from "))), None)
    return _cut(pick, limit) if pick else None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
