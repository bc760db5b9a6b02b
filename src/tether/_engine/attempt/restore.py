"""The restore plan: which journaled call each call a restored worker waits on is (P-9).

Pure: it maps, it sends nothing. Everything is mapped before anything is
sent, so a mismatch can still fall back to replay.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from tether._sandbox.monty import GuestRaise


class SnapshotMismatch(Exception):
    """A restored snapshot does not match its record: fall back to replay."""


class PlannedCall(NamedTuple):
    call_id: int  # the worker's id for the call
    seq: int
    op: str
    address: str
    args: dict[str, Any]
    error: GuestRaise | None  # a call refused as parsed (its arguments cannot be bound)


# (name, args, kwargs) from the worker -> (op, address, call args, error), as the boundary parses a call.
Parse = Callable[[str, tuple[Any, ...], dict[str, Any]], tuple[str, str, dict[str, Any], "GuestRaise | None"]]


def plan_restore(record: list[dict[str, Any]], call_ids: list[int], announced: list[Any], parse: Parse,
                 next_seq: Callable[[], int]) -> list[PlannedCall]:
    """Map the calls a restored worker waits on to the snapshot's record of them, in seq order.

    Calls the worker re-announced are matched to the record by what they are;
    a re-announced call the record lacks is new and gets ``next_seq()``. The
    rest are matched by order: seqs and call ids both grow in the order the
    program issued the calls. Raises :class:`SnapshotMismatch` if they cannot be.
    """
    left = sorted(record, key=lambda c: c["seq"])
    plan: list[PlannedCall] = []
    for ann in sorted(announced, key=lambda a: a.call_id):
        op, address, call_args, err = parse(ann.name, ann.args, ann.kwargs)
        match = next((r for r in left if r["op"] == op and r["address"] == address and r["args"] == call_args), None)
        if match is not None:
            left.remove(match)
            plan.append(PlannedCall(ann.call_id, match["seq"], op, address, call_args, err))
        else:
            plan.append(PlannedCall(ann.call_id, next_seq(), op, address, call_args, err))
    announced_ids = {a.call_id for a in announced}
    rest = sorted(cid for cid in call_ids if cid not in announced_ids)
    if len(rest) != len(left):
        raise SnapshotMismatch(f"snapshot waits on {len(rest)} earlier calls, the record names {len(left)}")
    plan += [PlannedCall(cid, r["seq"], r["op"], r["address"], r["args"], None) for cid, r in zip(rest, left)]
    plan.sort(key=lambda p: p.seq)
    return plan
