"""Cells: observe a run while it runs (P-20)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from helpers import Recorder
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._store import open_store

LOOP = """
import asyncio
import tools
done = 0
for i in range(10):
    await tools.helpdesk.get_ticket(id=i)
    done += 1
    if done % 5 == 0:
        emit({"progress": done, "total": 10})
        await yield_control()
    await asyncio.sleep(0.02)
{"done": done}
"""


def runtime(store_url, rec=None, **kw) -> Runtime:
    return Runtime(store=open_store(store_url), tools=(rec or Recorder()).tools(), type_check=False, **kw)


async def test_p20_a_cell_yields_streams_and_completes(store_url):
    async with runtime(store_url) as rt:
        first = await rt.start_cell(LOOP, yield_after_ms=10_000)
        assert first["status"] == "running"
        assert [e["type"] for e in first["events"]] == ["output", "yielded"]
        assert first["events"][0]["value"] == {"progress": 5, "total": 10}
        ids = [e["id"] for e in first["events"]]
        assert ids == sorted(ids) and first["cursor"] == ids[-1]
        seen, cursor = [], first["cursor"]
        while True:
            nxt = await rt.wait_cell(first["cell_id"], after=cursor, timeout_ms=10_000)
            assert nxt["events"], "a long-poll returned nothing before its time was up"
            seen += [e["type"] for e in nxt["events"]]
            cursor = nxt["cursor"]
            if nxt["status"] != "running":
                break
            # Every observation ends at a stop (yield) or brings streamed output.
            assert nxt["events"][-1]["type"] in ("yielded", "output")
        assert seen == ["output", "yielded", "completed"]
        assert nxt["status"] == "completed" and nxt["result"] == {"done": 10}


async def test_p20_yield_after_ms_returns_while_the_program_runs(store_url):
    async with runtime(store_url) as rt:
        obs = await rt.start_cell("import asyncio\nawait asyncio.sleep(0.5)\nemit('late')\n1", yield_after_ms=50)
        assert obs["status"] == "running" and obs["events"] == []
        streamed = await rt.wait_cell(obs["cell_id"], after=obs["cursor"], timeout_ms=10_000)
        assert streamed["events"][0]["type"] == "output" and streamed["events"][0]["value"] == "late"
        done = streamed
        while done["status"] == "running":
            done = await rt.wait_cell(obs["cell_id"], after=done["cursor"], timeout_ms=10_000)
        assert done["status"] == "completed" and done["result"] == 1


async def test_p20_terminate_sends_nothing_further(store_url):
    rec = Recorder()
    code = "import asyncio\nimport tools\nfor i in range(100):\n    await tools.helpdesk.add_comment(id=i, body='x')\n    await asyncio.sleep(0.05)\n"
    # 200 host calls allowed: on a starved machine the terminate can arrive
    # late, and the run must still be running (not ended by call_limit) then.
    async with runtime(store_url, rec, policy=Policy(writes="allow", write_budget=1000),
                       limits=Limits(host_calls=400)) as rt:
        obs = await rt.start_cell(code, yield_after_ms=120)
        out = await rt.terminate_cell(obs["cell_id"])
        assert out["status"] == "terminated", out
        sent = len(rec.deliveries)
        await asyncio.sleep(0.2)
        assert len(rec.deliveries) == sent < 100
        assert out["events"][-1]["type"] == "terminated"


async def test_p20_a_write_needing_approval_shows_as_a_paused_event(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        obs = await rt.start_cell("import tools\nawait tools.helpdesk.close_ticket(id=1)\n'closed'", yield_after_ms=5000)
        assert obs["status"] == "paused" and obs["events"][-1]["type"] == "paused"
        assert obs["pending"]["address"] == "helpdesk.close_ticket"
        r = await rt.resume(obs["cell_id"], "approve")
        assert r.status == "completed"
        done = await rt.wait_cell(obs["cell_id"], after=obs["cursor"], timeout_ms=1000)
        assert done["status"] == "completed" and done["events"][-1]["type"] == "completed"


async def test_p20_a_cell_is_observed_from_a_second_process(store_url, tmp_path):
    async with runtime(store_url) as rt:
        obs = await rt.start_cell(LOOP, yield_after_ms=10_000)
        script = tmp_path / "observer.py"
        script.write_text(
            "import asyncio, json, os, sys\n"
            "from tether._runtime import Runtime\n"
            "from tether._store import open_store\n"
            "async def main():\n"
            "    rt = Runtime(store=open_store(sys.argv[1]), type_check=False)\n"
            "    cursor, types = int(sys.argv[3]), []\n"
            "    while True:\n"
            "        o = await rt.wait_cell(sys.argv[2], after=cursor, timeout_ms=10000)\n"
            "        types += [e['type'] for e in o['events']]\n"
            "        cursor = o['cursor']\n"
            "        if o['status'] != 'running':\n"
            "            print(json.dumps({'status': o['status'], 'types': types, 'result': o.get('result')}))\n"
            "            break\n"
            "asyncio.run(main())\n"
            "sys.stdout.flush()\n"
            "os._exit(0)\n"
        )
        proc = await asyncio.create_subprocess_exec(sys.executable, str(script), store_url, obs["cell_id"],
                                                    str(obs["cursor"]), stdout=subprocess.PIPE)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        seen = json.loads(out)
        assert seen == {"status": "completed", "types": ["output", "yielded", "completed"], "result": {"done": 10}}


async def test_p20_emit_budget_cuts_oversized_output(store_url):
    async with runtime(store_url) as rt:
        obs = await rt.start_cell("emit('x' * (5 * 1024 * 1024))\nemit('small')\n1", yield_after_ms=10_000)
        outs = [e for e in obs["events"] if e["type"] == "output"]
        assert "dropped" in outs[0]["value"]["text"] and outs[1]["value"] == "small"


async def test_p20_a_started_cell_is_never_offered_to_another_processs_runner(store_url):
    # Another replica's runner claims queued runs the moment they appear; a cell
    # this process started must not be one of them (it would fail cell_start).
    other = open_store(store_url)
    claimed = []
    async with runtime(store_url) as rt:
        create = rt.store.create_run

        def create_then_race(run):
            create(run)
            now = rt.engine.clock()
            got = other.claim_queued("other-replica", now + 30, now)
            claimed.append(got.run_id if got else None)

        rt.store.create_run = create_then_race
        obs = await rt.start_cell("emit('hi')\n1", yield_after_ms=5_000)
        assert obs["status"] == "completed" and obs["result"] == 1, obs
    other.close()
    assert claimed == [None]
