"""A cancel asked of a running run whose process died before it saw the request is honoured by whoever takes the run
over (D-91, P-39, P-11).

A run's process is alive when a person cancels it from another process, so the cancel is a durable request on the run
its heartbeat reads (control.cancel); the process is SIGKILLed before its next look (tests/crash/continued.py). The
cancelling process gives up waiting (a CLI closed, a replica restarted). Whoever takes the run over next — a repeated
decision (D-90), `tether recover`, a worker — used to continue the program as if nothing had been asked: it ran on
and paused at its next write (or sent one its policy allows) before its own heartbeat read the request.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from tests.engine import test_repeats as repeats

from tether._app import open_runtime

PROGRAM = ("import tools\nawait tools.notes.add_note(text='hello')\nawait tools.notes.stall()\n"
           "await tools.notes.add_note(text='after')\n'sent'")


def cancelled_then_killed(rt, root, store_url: str, run_id: str) -> None:
    """Approve write 1 in another process; once it is in the read after it, ask it to cancel, then SIGKILL it."""
    stalled = root / "notes.jsonl.stalled"
    env = {**os.environ, "NOTES_STALL_SECONDS": "600",
           "PYTHONPATH": os.pathsep.join([str(repeats.HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(repeats.HERE / "crash" / "continued.py"), store_url, run_id,
                             repeats.OWNER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not stalled.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stalled.exists(), proc.communicate(timeout=5) if proc.poll() is not None else "never got there"
        # What control.cancel records for a run a live process holds; that process is killed before it looks.
        assert rt.engine.lifecycle.request_cancel(rt.store.get_run(run_id), "stop it, please")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    stalled.unlink()


@pytest.mark.parametrize("backend,how", [("sqlite", "repeat"), ("postgres", "repeat"), ("sqlite", "recover")])
async def test_d91_p39_a_cancel_its_dead_process_never_saw_ends_the_run_whoever_takes_it_over(store_env, request,
                                                                                              backend, how):
    url = os.environ["TETHER_STORE_URL"] if backend == "sqlite" else request.getfixturevalue("pg_url")
    async with open_runtime(tools=[repeats.TOOLS], type_check=False, store_url=url) as rt:
        paused = await rt.execute(PROGRAM, principal=repeats.OWNER, meta={"tools": [repeats.TOOLS]})
        assert paused.status == "paused" and paused.pending["seq"] == 1
        cancelled_then_killed(rt, store_env, url, paused.run_id)
        left = rt.store.get_run(paused.run_id)
        assert left.status == "running" and left.meta["cancel_requested"] == "stop it, please"
        if how == "repeat":
            r = await asyncio.wait_for(rt.resume(paused.run_id, "approve", seq=1, principal=repeats.OWNER), 120)
        else:
            (r,) = [x for x in await asyncio.wait_for(rt.recover(), 120) if x.run_id == paused.run_id]
        assert r.status == "cancelled", (r.status, r.error, r.pending)
        assert "stop it, please" in r.error["message"] and "nothing further was sent" in r.error["message"]
        run = rt.store.get_run(paused.run_id)
        assert run.status == "cancelled" and run.owner is None and run.pending is None
        assert [c.seq for c in rt.store.get_calls(paused.run_id)] == [1]  # the program went no further
    assert repeats.notes(store_env) == ["hello"]
