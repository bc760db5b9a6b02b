"""OpenTelemetry spans: one per attempt of a run, one per call inside it.

Only the API is a dependency; with no SDK configured every span is a no-op.
Call spans are made after the fact from the boundary's own timings, and only
when the run's span is recording, so the hot path pays nothing otherwise.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace

tracer = trace.get_tracer("tether")


def run_span(run_id: str, mode: str) -> Any:
    return tracer.start_as_current_span("tether.run", attributes={"tether.run_id": run_id, "tether.attempt": mode})


def record_call(parent: Any, seq: int, op: str, address: str, kind: str, state: str, seconds: float) -> None:
    if parent is None or not parent.is_recording():
        return
    end = time.time_ns()
    span = tracer.start_span(
        "tether.call",
        context=trace.set_span_in_context(parent),
        start_time=end - int(seconds * 1e9),
        attributes={"tether.seq": seq, "tether.op": op, "tether.address": address, "tether.kind": kind,
                    "tether.state": state},
    )
    span.end(end_time=end)
