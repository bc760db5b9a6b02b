"""``GET /metrics``: Prometheus text that prometheus-client's own parser reads, behind the token, moving with runs."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import Recorder
from tether._engine.rules.policy import Policy, Rule
from tether._runtime import Runtime
from tether._server.metrics import MetricsApp, MetricsRoute
from tether._store import open_store

TOKEN = "metrics-token-0123456789"
SERIES = ("tether_runs_ended", "tether_calls", "tether_approval_latency_seconds", "tether_overloaded_answers",
          "tether_store_call_seconds", "tether_webhook_failures", "tether_sandbox_workers", "tether_runs",
          "tether_pauses_pending", "tether_pause_oldest_age_seconds", "tether_outbox_backlog",
          "tether_store_size_bytes")


async def _fallback(scope, receive, send):
    await send({"type": "http.response.start", "status": 418, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _families(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


async def _scrape(client: httpx.AsyncClient) -> str:
    r = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return r.text


@pytest.fixture
async def served(store_url):
    rec = Recorder()
    rt = Runtime(store=open_store(store_url), tools=rec.tools(), type_check=False,
                 policy=Policy(writes="allow", rules=(Rule("helpdesk.close_ticket", "ask"),)))
    async with rt:
        app = MetricsRoute(_fallback, rt, [TOKEN])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tether") as client:
            yield rt, client


async def test_metrics_need_the_token_and_other_paths_go_on(served):
    rt, client = served
    assert (await client.get("/metrics")).status_code == 401
    assert (await client.get("/metrics", headers={"Authorization": "Bearer wrong-token-0000000000"})).status_code == 401
    assert (await client.get("/mcp")).status_code == 418


async def test_every_series_is_parsed_and_moves_after_a_run(served):
    rt, client = served
    before_text = await _scrape(client)
    assert set(SERIES) <= _families(before_text)
    before = _samples(before_text)

    paused = await rt.execute("import tools\nawait tools.helpdesk.add_comment(id=1, body='x')\n"
                              "await tools.helpdesk.close_ticket(id=2)\n'done'")
    assert paused.status == "paused"
    during = _samples(await _scrape(client))
    assert during[("tether_pauses_pending", (("status", "paused"),))] == 1
    assert during[("tether_pause_oldest_age_seconds", (("status", "paused"),))] >= 0
    done = await rt.resume(paused.run_id, "approve")
    assert done.status == "completed"
    failed = await rt.execute("1/0")
    assert failed.status == "failed"
    # An answer `overloaded`: one slot, held, no queue.
    from tether._server.admission import Admission
    from tether.errors import Overloaded

    admission = Admission(1, queue_depth=0, queue_timeout=1)
    async with admission.slot():
        with pytest.raises(Overloaded):
            await admission.acquire()

    await rt.engine.pool.returned()  # an execute answers before its worker is back in the pool
    after_text = await _scrape(client)
    assert set(SERIES) <= _families(after_text)
    after = _samples(after_text)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("tether_runs_ended_total", status="completed", code="") == 1
    assert moved("tether_runs_ended_total", status="failed", code="program_error") == 1
    assert moved("tether_calls_total", kind="write", outcome="sent") == 2
    assert moved("tether_approval_latency_seconds_count") == 1
    assert moved("tether_overloaded_answers_total") == 1
    assert moved("tether_store_call_seconds_count", access="write") > 0
    assert moved("tether_store_call_seconds_count", access="read") > 0
    assert after[("tether_runs", (("status", "completed"),))] == 1
    assert after[("tether_pauses_pending", (("status", "paused"),))] == 0
    assert after[("tether_store_size_bytes", ())] > 0
    assert after[("tether_outbox_backlog", ())] == 0
    workers = {s: after[("tether_sandbox_workers", (("state", s),))] for s in ("busy", "idle")}
    assert workers == {"busy": 0, "idle": rt.engine.pool.max_workers}


async def test_the_separate_listener_app_needs_no_token_and_serves_only_metrics(served):
    rt, _ = served
    transport = httpx.ASGITransport(app=MetricsApp(rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://tether") as client:
        r = await client.get("/metrics")
        assert r.status_code == 200 and "tether_runs" in _families(r.text)
        assert (await client.get("/mcp")).status_code == 404
        assert (await client.post("/metrics")).status_code == 405


async def test_the_sample_dashboard_graphs_only_series_tether_exports(served):
    import json
    import re
    from pathlib import Path

    rt, client = served
    await rt.execute("1")
    names = {s.name for f in text_string_to_metric_families(await _scrape(client)) for s in f.samples}
    names |= {f.name for f in text_string_to_metric_families(await _scrape(client))}
    dashboard = json.loads((Path(__file__).parent.parent.parent / "deploy" / "grafana-tether.json").read_text())
    used = {m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"\btether_\w+", t["expr"])}
    assert len(used) >= 12
    # A _bucket series exists once a histogram has an observation; its family is what must exist.
    missing = {m for m in used if m not in names and m.removesuffix("_bucket") not in names}
    assert not missing
