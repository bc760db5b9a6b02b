"""OpenTelemetry spans: one per attempt of a run, one per call inside it.

Only the API is a dependency; with no SDK configured every span is a no-op.
Call spans are made after the fact from the boundary's own timings, and only
when the run's span is recording, so the hot path pays nothing otherwise.

The API itself (~10 ms to import) is imported only when the process may be tracing: a tracer provider is
set by code that imported ``opentelemetry.trace`` first, or named by ``OTEL_PYTHON_TRACER_PROVIDER``
(what ``opentelemetry-instrument`` sets up); otherwise every span would be a no-op, so none is made.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any


class _NotTracing:
    """The run's span when nothing traces: never recording, as the API's no-op span."""

    @staticmethod
    def is_recording() -> bool:
        return False


_NOT_TRACING = _NotTracing()


def run_span(run_id: str, mode: str) -> Any:
    if "opentelemetry.trace" not in sys.modules and "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ:
        return contextlib.nullcontext(_NOT_TRACING)
    return _tracer().start_as_current_span("tether.run", attributes={"tether.run_id": run_id, "tether.attempt": mode})


tracer: Any = None  # tether's tracer, got on first use


def _tracer() -> Any:
    global tracer
    if tracer is None:
        from opentelemetry import trace

        # A proxy until a provider is set, then the provider's tracer (as a module-level get_tracer was).
        tracer = trace.get_tracer("tether")
    return tracer


def record_call(parent: Any, seq: int, op: str, address: str, kind: str, state: str, seconds: float) -> None:
    if parent is None or not parent.is_recording():
        return
    from opentelemetry import trace  # imported already: a span is recording

    end = time.time_ns()
    span = _tracer().start_span(
        "tether.call",
        context=trace.set_span_in_context(parent),
        start_time=end - int(seconds * 1e9),
        attributes={"tether.seq": seq, "tether.op": op, "tether.address": address, "tether.kind": kind,
                    "tether.state": state},
    )
    span.end(end_time=end)
