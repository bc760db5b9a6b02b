"""OpenTelemetry: a span per run and one per call, when an SDK is configured."""

from __future__ import annotations

import pytest

from helpers import Recorder
from tether._runtime import Runtime

sdk = pytest.importorskip("opentelemetry.sdk.trace")


async def test_runs_and_calls_become_spans():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tether._engine.attempt import telemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    old = telemetry.tracer
    telemetry.tracer = provider.get_tracer("tether")
    try:
        async with Runtime(tools=Recorder().tools(), type_check=False) as rt:
            r = await rt.execute("import tools\nawait tools.helpdesk.get_ticket(id=1)\nawait tools.helpdesk.get_ticket(id=-1)")
    finally:
        telemetry.tracer = old
    spans = exporter.get_finished_spans()
    (run,) = [s for s in spans if s.name == "tether.run"]
    calls = sorted((s for s in spans if s.name == "tether.call"), key=lambda s: s.attributes["tether.seq"])
    assert run.attributes["tether.run_id"] == r.run_id and run.attributes["tether.status"] == "failed"
    assert run.attributes["tether.error"] == "tool_error"
    assert [(c.attributes["tether.address"], c.attributes["tether.state"]) for c in calls] == [
        ("helpdesk.get_ticket", "done"), ("helpdesk.get_ticket", "failed")]
    assert all(c.parent.span_id == run.context.span_id for c in calls)
