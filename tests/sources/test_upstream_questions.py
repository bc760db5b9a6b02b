"""An upstream MCP server asking a question mid-call (elicitation) reaches the run's user."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp import Client
from mcp_types import ElicitResult

from tether._engine.attempt.questions import elicitation_handler
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._server.mcp import TetherServer
from tether._sources.mcp import MCPSource

pytestmark = pytest.mark.slow
SERVER = str(Path(__file__).parent.parent / "fixtures" / "mcp_fixture_server.py")
GREET = "import tools\nawait tools.fx.greet()"


@pytest.fixture
async def rt():
    source = MCPSource("fx", command=[sys.executable, SERVER], env={"TETHER_TEST_TAG": "questions"})
    async with Runtime(type_check=False, policy=Policy(writes="allow")) as runtime:
        source.elicitation_handler = elicitation_handler("fx", runtime.engine.attempts.live, runtime.engine.events)
        await source.start()
        runtime.add_tools(*source.tools())
        try:
            yield runtime
        finally:
            await source.close()


async def test_a_question_goes_to_the_runs_asker_and_its_answer_to_the_upstream(rt):
    asked = []

    async def asker(question):
        asked.append(question)
        return {"action": "accept", "content": {"name": "Ada"}}

    r = await rt.execute(GREET, on_question=asker)
    assert r.status == "completed" and r.result == {"result": "hello Ada"}
    (q,) = asked
    assert q["address"] == "fx.greet" and q["message"] == "What is your name?" and q["run_id"] == r.run_id
    # Without anyone to ask, the question is declined and the tool goes on.
    r = await rt.execute(GREET)
    assert r.result == {"result": "no name (decline)"}


async def test_over_mcp_the_upstream_form_reaches_the_client_in_the_2025_era(rt):
    shown = []

    async def callback(context, params):
        shown.append(params)
        return ElicitResult(action="accept", content={"name": "Grace"})

    async with Client(TetherServer(rt).mcp, mode="legacy", elicitation_callback=callback) as c:
        r = await c.call_tool("execute", {"code": GREET})
    assert r.structured_content["result"] == {"result": "hello Grace"}
    (params,) = shown
    assert "What is your name?" in params.message and "name" in params.requested_schema["properties"]
