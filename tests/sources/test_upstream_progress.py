"""Long upstream calls: progress is requested and forwarded, and keeps a call alive up to max_call_seconds.

A real MCP server over stdio (the fixture's `slow_steps` reports progress after
each step).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tether._app import open_runtime
from tether._config import Config

FIXTURES = Path(__file__).parent.parent / "fixtures"

pytestmark = pytest.mark.slow


def _config(tmp_path, limits=None, **timeouts) -> Config:
    source = {"type": "mcp", "namespace": "fx", "command": [sys.executable, str(FIXTURES / "mcp_fixture_server.py")],
              **timeouts}
    return Config.from_dict({"sources": [source], "store": {"url": f"sqlite:///{tmp_path}/t.db"},
                             "sandbox": {"check": "off"}, "limits": limits or {},
                             "policy": {"writes": "allow"}})


async def test_progress_restarts_call_timeout_and_reaches_the_caller(tmp_path):
    config = _config(tmp_path, call_timeout=0.8, max_call_seconds=20)
    seen: list[tuple[float, str]] = []
    async with open_runtime(config) as rt:
        # Five steps of 0.4 s: 2 s in all, never 0.8 s without progress.
        r = await rt.execute("import tools\nawait tools.fx.slow_steps(steps=5, delay=0.4)",
                             on_progress=lambda done, text: seen.append((done, text)))
    assert r.status == "completed", r.error
    assert r.result == {"result": "5 steps done"}
    steps = [text for _, text in seen if "step " in text]
    assert steps == [f"fx.slow_steps: step {i} of 5" for i in range(1, 6)]
    assert seen[-1] == (1, "fx.slow_steps")  # then the call itself is done
    counts = [done for done, _ in seen]
    assert counts == sorted(counts)  # progress only goes up


async def test_no_progress_for_call_timeout_is_a_call_timeout(tmp_path):
    config = _config(tmp_path, call_timeout=0.5, max_call_seconds=20)
    async with open_runtime(config) as rt:
        r = await rt.execute("import tools\nawait tools.fx.slow_steps(steps=1, delay=3)")
    assert r.status == "failed"
    assert r.error["code"] == "call_timeout", r.error
    assert "no answer or progress for 0.5 s" in r.error["message"]


async def test_without_call_timeout_the_no_progress_limit_is_the_runs(tmp_path):
    config = _config(tmp_path, limits={"call_timeout_seconds": 0.5}, max_call_seconds=20)
    async with open_runtime(config) as rt:
        r = await rt.execute("import tools\nawait tools.fx.slow_steps(steps=1, delay=3)")
    assert r.error["code"] == "call_timeout", r.error
    assert "no answer or progress for 0.5 s" in r.error["message"]


async def test_progress_does_not_extend_a_call_past_max_call_seconds(tmp_path):
    # Progress every 0.3 s against a 3 s no-progress limit: even a loaded machine
    # keeps the call alive by progress, so only the 5 s ceiling can end it.
    config = _config(tmp_path, call_timeout=3, max_call_seconds=5)
    async with open_runtime(config) as rt:
        r = await rt.execute("import tools\nawait tools.fx.slow_steps(steps=40, delay=0.3)")
    assert r.status == "failed"
    assert r.error["code"] == "call_timeout", r.error
    assert "no answer within 5 s" in r.error["message"]


async def test_a_cell_sees_upstream_progress_as_events(tmp_path):
    config = _config(tmp_path, call_timeout=5)
    async with open_runtime(config) as rt:
        obs = await rt.start_cell("import tools\nawait tools.fx.slow_steps(steps=3, delay=0.2)", yield_after_ms=10_000)
        events = list(obs["events"])
        while obs["status"] == "running":
            obs = await rt.wait_cell(obs["cell_id"], after=obs["cursor"], timeout_ms=10_000)
            events += obs["events"]
    progress = [e for e in events if e["type"] == "progress"]
    assert [e["progress"] for e in progress] == [1, 2, 3], json.dumps(events)
    assert progress[-1]["address"] == "fx.slow_steps" and progress[-1]["total"] == 3


async def test_tethers_own_mcp_client_sees_upstream_progress(tmp_path):
    from mcp import Client

    from tether._server.mcp import TetherServer

    seen: list[tuple[float, str | None]] = []

    async def progress(value, total, message):
        seen.append((value, message))

    async with open_runtime(_config(tmp_path, call_timeout=5)) as rt:
        async with Client(TetherServer(rt).mcp, mode="legacy") as c:
            r = await c.call_tool("execute", {"code": "import tools\nawait tools.fx.slow_steps(steps=3, delay=0.2)"},
                                  progress_callback=progress)
    assert r.structured_content["result"] == {"result": "3 steps done"}
    values = [v for v, _ in seen]
    assert values == sorted(set(values)) and values[-1] == 1  # rising, ending at the one call done
    assert any("fx.slow_steps: step 3 of 3" in (m or "") for _, m in seen), seen


async def test_an_upstream_error_names_the_address_once(tmp_path):
    async with open_runtime(_config(tmp_path)) as rt:
        r = await rt.execute("import tools\nawait tools.fx.fail(message='the disk is full')")
    assert r.status == "failed"
    message = r.error["message"]
    assert "the disk is full" in message and message.count("fx.fail:") == 1, message
