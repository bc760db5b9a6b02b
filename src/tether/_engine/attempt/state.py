"""What one attempt knows while it drives the program: seqs issued, calls in flight, timings, failures.

What stopping knows (a stop under way, the write batch forming, the calls held) is the
attempt's Stops' own (_engine/calls/stops.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tether.errors import TetherError


class CallStat(NamedTuple):
    """One settled call's timing, as the diagnostics show it (built from ``AttemptState.stats`` when asked)."""

    seq: int
    op: str
    address: str
    kind: str
    state: str
    began: float  # time.perf_counter() when the call was taken up
    ended: float  # and when it settled


# What is recorded per settled call: CallStat's fields as a plain tuple (a tuple costs nothing to build; every
# host call makes one, and few runs ask for their diagnostics' per-call list).
CallTiming = tuple[int, str, str, str, str, float, float]


@dataclass(frozen=True)
class RaisedError:
    """An exception the boundary raised into the program: its code and the call it came from."""

    code: str
    exc_type: str
    seq: int
    address: str


@dataclass
class AttemptState:
    """What one attempt knows while it drives the program."""

    issued: int = 0  # seqs handed out so far
    writes_spent: int = 0
    inflight: int = 0
    approving: int = 0  # of those, calls waiting on an inline approver's answer (a person)
    host_seconds: float = 0.0
    inflight_since: float | None = None
    raised: dict[str, "RaisedError"] = field(default_factory=dict)  # message raised in program -> its call
    stats: list[CallTiming] = field(default_factory=list)  # see CallStat
    t0: float = field(default_factory=time.perf_counter)  # when the attempt began, what the stats are shown from
    checkpoint_at_seq: int = 0
    checkpoint_at_time: float = 0.0
    failure: TetherError | None = None
    unknown_writes: list[dict[str, Any]] = field(default_factory=list)
    # What had to change in tool results to make them JSON, by address (for the run's notes).
    conversions: dict[str, list[str]] = field(default_factory=dict)
