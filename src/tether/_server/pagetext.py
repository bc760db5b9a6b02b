"""Texts the console's pages compute from a run as they are drawn: what became of a decision, what a run does.

Read from the run and its journal at the moment the page is drawn, never
remembered from the moment of the decision: a run may have sent a write,
gone on and paused again between the two.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._engine.approvals.surface import batch
from tether._engine.inspect import program_summary
from tether._server.approvals import pending_writes
from tether._store.states import RunStatus
from tether._tools.shown import mask_source

if TYPE_CHECKING:
    from tether._runtime import Runtime
    from tether._store.base import RunRecord


_FLASHES = {"queued": "The decision waits for a free run slot; this page updates when it is taken.",
            "rolling_back": "Declined; the run's writes are being undone, newest first (see Calls below)."}


def flash_text(rt: Runtime, run: RunRecord, key: str | None, seqs: str | None) -> str | None:
    """What became of the writes just decided, read from the run and its journal as the page loads.

    The run may have sent the write, continued and paused again at another
    write before the page is drawn: the text says what is true now.
    """
    if key not in ("approved", "declined"):
        return _FLASHES.get(key or "")
    try:
        decided = [int(x) for x in (seqs or "").split(",") if x.strip()][:50]
    except ValueError:
        decided = []
    verb = "Approved" if key == "approved" else "Declined"
    calls = f"call{'s' if len(decided) > 1 else ''} {', '.join(map(str, decided))}" if decided else "the write"
    states = [c.state for s in decided if (c := rt.store.get_call(run.run_id, s)) is not None]
    if not states:  # the page was not told which writes (an old link, an edited address): say no more than known
        what = f"{verb}."
    elif key == "approved":
        if all(st in ("sent", "done") for st in states):
            what = f"{verb} {calls}: sent."
        elif any(st in ("failed", "unknown") for st in states):
            what = f"{verb} {calls}: sending did not succeed (see Calls below)."
        else:
            what = f"{verb} {calls}: not sent yet."
    else:
        what = f"{verb} {calls}: not sent; the program was told."
    if run.status == RunStatus.PAUSED:
        waiting = pending_writes(rt, run)
        same_pause = {w.get("seq") for w in batch(run)} & set(decided)
        names = ", ".join(f"call {w['seq']} ({w['address']})" for w in waiting[:5])
        if waiting and same_pause:
            return (f"{what} The run waits for the rest of this pause to be decided: {names}. "
                    "Nothing goes on until every one is.")
        if waiting:
            return f"{what} The run went on and has paused again, now at {names}."
        return f"{what} The run is paused."
    if run.status in (RunStatus.RUNNING, RunStatus.QUEUED):
        return f"{what} The run goes on ({run.status})."
    ended = {RunStatus.COMPLETED: "The run has completed.", RunStatus.FAILED: "The run has ended: failed.",
             RunStatus.CANCELLED: "The run was cancelled."}
    return f"{what} {ended.get(run.status, f'The run is {run.status}.')}"


def run_summary(program: str) -> str | None:
    # A summary may be a line of code: the literals it gives secret-named arguments are not shown.
    return program_summary(mask_source(program or ""))
