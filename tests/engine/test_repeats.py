"""A repeated decision on a run whose owner died continues the run, at every door (D-90, P-28, P-11).

A person approves a paused write; the process that continues the run sends the write, then is SIGKILLed in the
read after it (tests/crash/continued.py): the run is left `running`, owned by a process that is gone, its lease
(30 s) not yet lapsed. The person, seeing nothing happen, approves again. The repeat is accepted (the journal
holds that approval, P-28) and takes the run over and continues it here, as `tether recover` or a worker would:
the write is not sent again and the run completes. Before, the Python API, `tether resume` and MCP `resume` all
answered `running` with `run_unowned` (once the lease lapsed) and told the person to run another command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from mcp import Client

from tether._app import open_runtime
from tether._server.auth import principal_for_token
from tether._server.mcp import TetherServer
from tether.cli import main

HERE = Path(__file__).parent.parent
TOOLS = str(HERE / "fixtures" / "notes_tools.py")
PROGRAM = "import tools\nawait tools.notes.add_note(text='hello')\nawait tools.notes.stall()\n'sent'"
OWNER = principal_for_token("alice-token-0123456789")


def notes(root: Path) -> list[str]:
    path = root / "notes.jsonl"
    return [json.loads(line)["text"] for line in path.read_text().splitlines()] if path.exists() else []


@contextlib.contextmanager
def continuing(root: Path, store_url: str, run_id: str) -> Iterator[None]:
    """Approve write 1 of ``run_id`` in another process, which sends it and stalls in the read after it; it is
    SIGKILLed there on leaving the block."""
    stalled = root / "notes.jsonl.stalled"
    env = {**os.environ, "NOTES_STALL_SECONDS": "600",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(HERE / "crash" / "continued.py"), store_url, run_id, OWNER],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not stalled.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stalled.exists(), proc.communicate(timeout=5) if proc.poll() is not None else "never got there"
        yield
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    stalled.unlink()


def continued_then_killed(root: Path, store_url: str, run_id: str) -> None:
    """Approve write 1 of ``run_id`` in another process, which sends it and is SIGKILLed in the read after it."""
    with continuing(root, store_url, run_id):
        pass


async def repeat(door: str, rt, run_id: str, capsys) -> tuple[str, object, dict | None]:
    """The same approval again, through ``door``: (status, result, error)."""
    if door == "python":
        r = await rt.resume(run_id, "approve", seq=1, principal=OWNER)
        return r.status, r.result, r.error
    if door == "cli":
        await asyncio.to_thread(main, ["resume", run_id, "--approve", "--seq", "1", "--as", OWNER, "--json"])
        out = json.loads(capsys.readouterr().out)
        return out["status"], out.get("result"), out.get("error")
    async with Client(TetherServer(rt, principal_of=lambda ctx: OWNER).mcp) as c:
        r = await c.call_tool("resume", {"run_id": run_id, "decision": "approve", "seq": 1})
    out = r.structured_content
    return out["status"], out.get("result"), out.get("error")


@pytest.mark.parametrize("backend,door", [("sqlite", "python"), ("postgres", "python"), ("sqlite", "cli"),
                                          ("sqlite", "mcp")])
async def test_d90_p28_a_repeated_approval_continues_a_run_whose_owner_died(store_env, request, capsys, backend,
                                                                            door):
    url = os.environ["TETHER_STORE_URL"] if backend == "sqlite" else request.getfixturevalue("pg_url")
    os.environ["TETHER_STORE_URL"] = url  # the CLI's process opens the same store
    async with open_runtime(tools=[TOOLS], type_check=False, store_url=url) as rt:
        paused = await rt.execute(PROGRAM, principal=OWNER, meta={"tools": [TOOLS]})
        assert paused.status == "paused" and paused.pending["seq"] == 1
        continued_then_killed(store_env, url, paused.run_id)
        left = rt.store.get_run(paused.run_id)
        assert left.status == "running" and left.owner != rt.engine.owner and left.lease_until > time.time()
        assert rt.store.get_call(paused.run_id, 1).state == "sent" and notes(store_env) == ["hello"]
        status, result, error = await asyncio.wait_for(repeat(door, rt, paused.run_id, capsys), timeout=120)
        assert (status, result, error) == ("completed", "sent", None)
        run = rt.store.get_run(paused.run_id)
        assert run.status == "completed" and run.owner is None
        # Taken over as recovery takes a run over: counted towards quarantine (P-39) in the run's record.
        assert [t["ended"] for t in run.meta["takeovers"]] == ["process_gone"]
    assert notes(store_env) == ["hello"]  # sent once, by the process that died; never again


async def test_d90_two_processes_repeating_the_approval_at_once_continue_the_run_once(backend):
    """Two processes (here two runtimes, each its own owner) repeat the approval of a run whose owner's lease
    lapsed, at the same moment: one takes the run over by compare-and-set and continues it, the other waits for
    it; both get its outcome and the approved write is sent once."""
    from helpers import Clock, Recorder
    from tether._engine.calls import ledger
    from tether._runtime import Runtime

    rec = Recorder()
    clock = Clock()
    code = "import tools\nawait tools.helpdesk.close_ticket(id=1)\n(await tools.helpdesk.get_ticket(id=2))['title']"
    a = Runtime(store=backend.store(), tools=rec.tools(), clock=clock, type_check=False)
    b = Runtime(store=backend.store(), tools=rec.tools(), clock=clock, type_check=False)
    async with a, b:
        paused = await a.execute(code)
        # Approved, then the process continuing it stopped before sending: running, its lease gone.
        assert ledger.move(a.engine.store, a.engine.keyring, a.store.get_call(paused.run_id, 1), ["asked"],
                           state="approved")
        assert a.store.update_run(paused.run_id, ["paused"], status="running", owner="gone:1",
                                  lease_until=clock.now - 1, decision={"seq": 1, "decision": "approve"})
        one, two = await asyncio.wait_for(asyncio.gather(a.resume(paused.run_id, "approve", seq=1),
                                                         b.resume(paused.run_id, "approve", seq=1)), timeout=120)
        assert (one.status, one.result) == (two.status, two.result) == ("completed", "ticket 2"), (one, two)
        assert rec.deliveries == [("close_ticket", {"id": 1})]
        run = a.store.get_run(paused.run_id)
        assert [t["ended"] for t in run.meta["takeovers"]] == ["lease_lapsed"]


async def test_d92_p11_waiting_for_a_run_whose_owner_on_this_host_was_killed_answers_run_unowned_at_once(
        store_env, monkeypatch):
    """A caller waiting on a run whose owner, a process on this host, was SIGKILLed is told `run_unowned` (and to
    recover it) as soon as the process is known gone, not once its lease lapses. Before, the wait ran out its
    timeout (the lease here is 60 s, the wait 20 s) and answered `still_running`. The owner's own process, alive,
    is never judged gone: while it stalls in the run, the same wait answers `still_running`."""
    url = os.environ["TETHER_STORE_URL"]
    monkeypatch.setenv("TETHER_LEASE_SECONDS", "60")  # the continuing process's lease (tests/crash/continued.py)
    async with open_runtime(tools=[TOOLS], type_check=False, store_url=url) as rt:
        paused = await rt.execute(PROGRAM, principal=OWNER, meta={"tools": [TOOLS]})
        continued_then_killed(store_env, url, paused.run_id)
        left = rt.store.get_run(paused.run_id)
        assert left.status == "running" and left.lease_until > time.time() + 30
        waited = await asyncio.wait_for(rt.engine.wait_for_run(paused.run_id, timeout=20), timeout=60)
        assert (waited.status, (waited.error or {}).get("code")) == ("running", "run_unowned"), waited
        assert "tether recover" in waited.error["next_action"]
        assert waited.error["details"]["how"] == "process_gone"
        assert rt.store.get_run(paused.run_id).status == "running"  # waiting decides and continues nothing


async def test_d92_a_live_owner_on_this_host_is_waited_for(store_env, monkeypatch):
    """The other side of the test above: a run whose owner on this host is alive (stalled mid-run) is not judged
    gone; a short wait answers `still_running`."""
    url = os.environ["TETHER_STORE_URL"]
    monkeypatch.setenv("TETHER_LEASE_SECONDS", "60")
    async with open_runtime(tools=[TOOLS], type_check=False, store_url=url) as rt:
        paused = await rt.execute(PROGRAM, principal=OWNER, meta={"tools": [TOOLS]})
        with continuing(store_env, url, paused.run_id):
            waited = await rt.engine.wait_for_run(paused.run_id, timeout=1)
        assert (waited.status, (waited.error or {}).get("code")) == ("running", "still_running"), waited
