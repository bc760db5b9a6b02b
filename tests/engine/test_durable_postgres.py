"""The durable path end to end on Postgres: the same runtime, the other backend."""

from __future__ import annotations

from helpers import Recorder
from tether._runtime import Runtime
from tether._store import open_store

PROGRAM = """
import tools
t = await tools.helpdesk.get_ticket(id=2)
c = await tools.helpdesk.close_ticket(id=2)
v = await wait_for("confirm", timeout=600)
[t["title"], c["status"], v]
"""


async def test_pause_resume_and_wait_across_runtimes_on_postgres(pg_url):
    rec = Recorder()
    async with Runtime(store=open_store(pg_url), tools=rec.tools(), type_check=False) as rt:
        paused = await rt.execute(PROGRAM)
        assert paused.status == "paused" and paused.pending["address"] == "helpdesk.close_ticket"
    async with Runtime(store=open_store(pg_url), tools=rec.tools(), type_check=False) as rt2:
        waiting = await rt2.resume(paused.run_id, "approve")
        assert waiting.status == "waiting" and waiting.pending["name"] == "confirm"
        assert rec.deliveries == [("close_ticket", {"id": 2})]
    async with Runtime(store=open_store(pg_url), tools=rec.tools(), type_check=False) as rt3:
        out = await rt3.resolve_wait(waiting.pending["key"], "yes")
        assert out["run"]["status"] == "completed"
        assert out["run"]["result"] == ["ticket 2", "closed", "yes"]
        assert len(rec.deliveries) == 1
        calls = rt3.store.get_calls(paused.run_id)
        assert [c.state for c in calls] == ["done", "sent", "done"]


