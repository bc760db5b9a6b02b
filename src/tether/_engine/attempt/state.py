"""What one attempt knows while it drives the program: seqs issued, calls in flight, timings, failures.

What stopping knows (a stop under way, the write batch forming, the calls held) is the
attempt's Stops' own (_engine/calls/stops.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tether.errors import TetherError


@dataclass
class CallStat:
    seq: int
    op: str
    address: str
    kind: str
    state: str
    ms: float
    started: float  # seconds since the attempt began
    ended: float


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
    host_seconds: float = 0.0
    inflight_since: float | None = None
    raised: dict[str, "RaisedError"] = field(default_factory=dict)  # message raised in program -> its call
    stats: list[CallStat] = field(default_factory=list)
    checkpoint_at_seq: int = 0
    checkpoint_at_time: float = 0.0
    failure: TetherError | None = None
    unknown_writes: list[dict[str, Any]] = field(default_factory=list)
    # What had to change in tool results to make them JSON, by address (for the run's notes).
    conversions: dict[str, list[str]] = field(default_factory=dict)
