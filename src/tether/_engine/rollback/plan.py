"""A rollback's plan and what to do next (P-46): pure, no store, no clock; every backend runs the same.

The plan is made once, when a person asks for the rollback, and recorded on the
run (its ``pending``, signed, P-35) before anything is sent: for each write the
run applied, newest first, either its compensation (the tool, the arguments
made from the original call, the journal seq it will be recorded at and its
idempotency key) or why it is not undone. After that, what happens is read off
the journal by :func:`next_move`, so a process that takes the run over after a
crash does exactly what the first would have done next.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping

from tether._engine.rules.policy import ALLOW, ASK, DENY, GUARD, OVER_BUDGET, Policy, decide_call
from tether._store.base import CallRecord
from tether._store.states import SETTLED_CALL_STATES, CallState
from tether._tools.undo import Undo, UndoArgsError

# The op of a compensation's journal entry: a write of its own, told apart from the program's calls.
UNDO_OP = "undo"
# Journal states of a write that was (or may have been) applied: what a rollback looks at.
_APPLIED = (CallState.SENT, CallState.UNKNOWN, CallState.SENDING)
# States a pause's write can be in before a rollback declines it (never sent).
UNSENT = (CallState.ASKED, CallState.APPROVED)


def undo_key(original_key: str) -> str:
    """The idempotency key of the compensation of a call whose key is ``original_key`` (P-25, P-46): derived
    from it, so every process and every attempt of the rollback sends the same key."""
    return f"tether-undo-{original_key}"


@dataclass(frozen=True)
class Step:
    """One applied write of the run and what the rollback does about it."""

    seq: int  # the original write
    address: str
    undo: str | None = None  # the compensation tool; None: not undone (``why``)
    args: dict[str, Any] = field(default_factory=dict)
    undo_seq: int | None = None  # where the compensation is journaled
    key: str | None = None  # its idempotency key
    why: str | None = None  # why it is not undone

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Step":
        return cls(int(data["seq"]), str(data["address"]), data.get("undo"), dict(data.get("args") or {}),
                   data.get("undo_seq"), data.get("key"), data.get("why"))


def make_plan(entries: Iterable[CallRecord], undo_of: Callable[[str], Undo | None], policy: Policy) -> list[Step]:
    """The steps for a run whose journal is ``entries``: every write it applied, newest first (P-46).

    ``undo_of(address)``: the declared compensation of a tool, or None. A write
    whose outcome is unknown, or whose tool declares no undo, or whose undo the
    policy denies or the write budget has no room for, is a step with ``why``:
    listed, never silently skipped. A rule that asks about the compensation's
    tool is answered by the person who asked for the rollback (D-68).
    """
    journal = sorted(entries, key=lambda e: e.seq)
    writes = [e for e in journal if e.kind == "write" and e.op == "tool"]
    spent = sum(1 for e in writes if e.state not in (CallState.ASKED, CallState.DECLINED, CallState.DENIED))
    spent += sum(1 for e in journal if e.op == UNDO_OP)
    next_seq = max((e.seq for e in journal), default=0) + 1
    # Undos an earlier rollback of this run sent (or may have): by their key, which names the original's.
    earlier = {e.idempotency_key: e.seq for e in journal
               if e.op == UNDO_OP and e.state in _APPLIED and e.idempotency_key}
    steps: list[Step] = []
    for entry in reversed(writes):
        if entry.state not in _APPLIED:
            continue  # never sent (declined, denied, asked) or failed: nothing of it to undo
        done = earlier.get(undo_key(entry.idempotency_key or f"{entry.run_id}-{entry.seq}"))
        if done is not None:
            steps.append(Step(entry.seq, entry.address, why=f"an earlier rollback sent its undo (call {done})"))
            continue
        if entry.state != CallState.SENT:
            steps.append(Step(entry.seq, entry.address, why="its outcome is unknown: it may or may not have "
                                                            "happened, so it is not undone"))
            continue
        undo = undo_of(entry.address)
        if undo is None:
            steps.append(Step(entry.seq, entry.address, why=f"{entry.address} declares no undo"))
            continue
        verdict = decide_call(policy, undo.address, True, spent)
        if verdict == DENY:
            steps.append(Step(entry.seq, entry.address, why=f"the policy denies its undo {undo.address}"))
            continue
        if verdict == OVER_BUDGET:
            steps.append(Step(entry.seq, entry.address,
                              why=f"its undo {undo.address} would pass the write budget ({policy.write_budget})"))
            continue
        # Under writes = "guard" (P-45) an undo left at the mode's default is sent as an asked one is: the person
        # who asked for the rollback decided it (D-68).
        assert verdict in (ALLOW, ASK, GUARD)
        try:
            args = undo.arguments(entry.args, entry.outcome)
        except UndoArgsError as exc:
            steps.append(Step(entry.seq, entry.address, why=f"its undo {undo.address} could not be made: {exc}"))
            continue
        key = undo_key(entry.idempotency_key or f"{entry.run_id}-{entry.seq}")
        steps.append(Step(entry.seq, entry.address, undo.address, args, next_seq, key))
        next_seq += 1
        spent += 1
    return steps


def undo_tools(entries: Iterable[CallRecord], undo_of: Callable[[str], Undo | None]) -> set[str]:
    """The compensation tools a rollback of a run whose journal is ``entries`` may send: the declared undo of
    each write it sent. A surface checks who may ask for the rollback against their rules (D-68)."""
    tools = set()
    for entry in entries:
        undo = undo_of(entry.address) if entry.kind == "write" and entry.op == "tool" else None
        if undo is not None and entry.state == CallState.SENT:
            tools.add(undo.address)
    return tools


@dataclass(frozen=True)
class Move:
    """What the rollback does next: ``record`` the step's compensation ``approved`` (write-ahead), ``send``
    it (``approved -> sending``), ``resend`` it by key (a tool that dedupes by key, P-31), ``lost`` (left
    ``sending`` by a process that stopped, to a tool that does not dedupe: ``unknown``, never sent again),
    or ``done``."""

    kind: str
    step: Step | None = None


DONE = Move("done")


def next_move(steps: Iterable[Step], journal: Mapping[int, CallRecord], dedupes: Callable[[str], bool],
              key_sends: int) -> Move:
    """The one decision of a rollback, from its plan and the journal as it is now (P-46).

    Newest first: a step is taken up only once every step before it is settled,
    so compensations are sent one at a time, in reverse order of the writes.
    """
    for step in steps:
        if step.undo_seq is None or step.undo is None:
            continue
        entry = journal.get(step.undo_seq)
        if entry is None:
            return Move("record", step)
        if entry.state == CallState.APPROVED:
            return Move("send", step)
        if entry.state == CallState.SENDING:
            if dedupes(step.undo) and max(entry.sends, 1) < key_sends:
                return Move("resend", step)
            return Move("lost", step)
        if entry.state not in SETTLED_CALL_STATES:
            return Move("lost", step)  # no compensation is ever in another state; never sent again
    return DONE


def report(steps: Iterable[Step], journal: Mapping[int, CallRecord]) -> list[dict[str, Any]]:
    """What was undone and what was not, newest first, as the run's result lists it (P-46)."""
    out = []
    for step in steps:
        line: dict[str, Any] = {"seq": step.seq, "address": step.address}
        entry = journal.get(step.undo_seq) if step.undo_seq is not None else None
        if step.undo is None or entry is None:
            line.update(undone=False, why=step.why or "its undo was not recorded")
        else:
            line["undo"] = {"seq": entry.seq, "address": entry.address, "args": entry.args, "state": str(entry.state)}
            line["undone"] = entry.state == CallState.SENT
            if entry.state == CallState.UNKNOWN:
                line["why"] = f"its undo {entry.address} was sent and its outcome is unknown"
            elif entry.state == CallState.FAILED:
                line["why"] = f"its undo {entry.address} failed: {(entry.error or {}).get('message', '')}"
            elif entry.state != CallState.SENT:
                line["why"] = f"its undo {entry.address} was left {entry.state}"
        out.append(line)
    return out


def summary(lines: list[dict[str, Any]]) -> str:
    """One sentence naming what was undone and what was not."""
    done = [f"call {x['seq']} {x['address']}" for x in lines if x.get("undone")]
    left = [f"call {x['seq']} {x['address']} ({x.get('why')})" for x in lines if not x.get("undone")]
    parts = ["undone: " + ", ".join(done) if done else "nothing was undone"]
    if left:
        parts.append("not undone: " + "; ".join(left))
    return "; ".join(parts)
