"""What a stopped attempt waits on: the writes of a pause, or the wait it parks on (P-18, P-27).

Built where the attempt stops (_engine/calls/stops.py), handed to the pause sink
(``driver.Attempt.pause``), which stores it on the run as plain JSON
(``runs.pending``): the record's type says pause or park, where a dict's keys
used to. What is stored, signed and returned is exactly the dict it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from tether._store.base import wait_digest

if TYPE_CHECKING:
    from tether._store.base import CallRecord
    from tether._tools.model import Tool


@dataclass(frozen=True)
class AskedWrite:
    """A write that asks for a decision, as a pause lists it."""

    seq: int
    address: str
    args: dict[str, Any]
    annotations: dict[str, Any]
    description: str | None = None
    secret_args: tuple[str, ...] = ()  # arguments shown as *** to people (_engine/attempt/redaction.py)
    # Under writes = "guard": why it asks, per destination (lineage/judge.py Reason.to_dict(), P-45).
    reasons: tuple[dict[str, Any], ...] = ()
    undo: str | None = None  # the tool that undoes it, when its tool declares one (P-46)
    op: ClassVar[str] = "tool"

    @classmethod
    def of(cls, seq: int, tool: "Tool", args: dict[str, Any],
           reasons: tuple[dict[str, Any], ...] = ()) -> "AskedWrite":
        from tether._engine.attempt.redaction import secret_args

        hidden = tuple(name for name in secret_args(tool) if name in args)
        return cls(seq, tool.address, args, tool.annotations.to_dict(), tool.description, hidden,
                   undo=tool.undo.address if tool.undo is not None else None, reasons=reasons)

    def for_approver(self) -> dict[str, Any]:
        """What an inline approver is given (``execute(on_approval=...)``)."""
        return {"seq": self.seq, "op": self.op, "address": self.address, "args": self.args,
                "annotations": self.annotations, "description": self.description,
                **({"undo": self.undo} if self.undo else {}),
                **({"reasons": list(self.reasons)} if self.reasons else {})}

    def call(self) -> dict[str, Any]:
        """The call a pause snapshot waits on."""
        return {"seq": self.seq, "op": self.op, "address": self.address, "args": self.args}

    def stored(self, key: str) -> dict[str, Any]:
        """As the run lists it, with its approval key (the durable wait it also is)."""
        return {"seq": self.seq, "address": self.address, "args": self.args, "annotations": self.annotations,
                "key": key, **({"secret_args": list(self.secret_args)} if self.secret_args else {}),
                **({"undo": self.undo} if self.undo else {}),
                **({"reasons": list(self.reasons)} if self.reasons else {})}


def reasons_of(entry: "CallRecord | None") -> tuple[dict[str, Any], ...]:
    """The reasons a guarded write's journal entry keeps with its verdict (P-45): what a person is shown."""
    lineage = entry.lineage if entry is not None else None
    reasons = lineage.get("reasons") if isinstance(lineage, dict) else None
    return tuple(r for r in reasons if isinstance(r, dict)) if isinstance(reasons, list) else ()


@dataclass(frozen=True)
class WritePause:
    """A pause: the write that asked first and every write of its batch, that one included, by seq (P-27)."""

    first: AskedWrite
    writes: tuple[AskedWrite, ...]

    def call(self) -> dict[str, Any]:
        return self.first.call()


@dataclass(frozen=True)
class ParkedWait:
    """The wait, signal or sleep a run parks on (P-18)."""

    kind: Literal["wait", "signal", "sleep"]
    seq: int
    op: str  # wait_for | wait_for_signal | sleep
    args: dict[str, Any]
    name: str
    key: str
    deadline: float | None

    def call(self) -> dict[str, Any]:
        return {"seq": self.seq, "op": self.op, "address": self.op, "args": self.args}

    def stored(self) -> dict[str, Any]:
        """As the run records what it waits on."""
        return {"kind": self.kind, "seq": self.seq, "name": self.name, "key": self.key, "deadline": self.deadline}


# Where an attempt stops.
Stop = WritePause | ParkedWait


def as_stored(pending: dict[str, Any]) -> dict[str, Any]:
    """What a stop leaves in the run's record, its envelope and its events: no capability (D-33).

    A pause loses its approval keys; a parked wait keeps only its key's digest, which still names
    the wait the run is parked on (the runners match a settled wait to the run by it) but resolves
    nothing. Whoever may see the run gets the key recomputed from the secret (``waits.reveal``).
    """
    if "writes" in pending:
        return without_approval_keys(pending)
    key = pending.get("key")
    if isinstance(key, str):
        return {**pending, "key": wait_digest(key)}
    return pending


def without_approval_keys(pending: dict[str, Any]) -> dict[str, Any]:
    """A pause as the store keeps it: every write but its approval key, a capability that decides it."""
    if "writes" not in pending:
        return pending
    writes = [{k: v for k, v in w.items() if k != "key"} for w in pending["writes"]]
    return {**{k: v for k, v in pending.items() if k != "key"}, "writes": writes}
