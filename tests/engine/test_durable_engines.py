"""tether as a step of a durable workflow engine: DBOS (P-36; README "Inside a durable workflow").

A DBOS workflow (tests/durable/dbos_app.py, a process of its own on a SQLite
system database) runs a two-charge program in a step, with the workflow id and
the step id as tether's run key, against a payments API that dedupes by
idempotency key (tests/fixtures/keyed_api.py). The process is SIGKILLed with
the first charge done and the second on the wire; DBOS recovers the workflow in
a new process and runs the step again, and tether answers it with the run the
first attempt started: taken over from the dead process, the first charge not
sent again, the second re-sent with its own key and taking effect once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from dbos import DBOSClient

from helpers import KeyedApi
from tether._store import open_store

pytestmark = pytest.mark.slow

APP = Path(__file__).parent.parent / "durable" / "dbos_app.py"


def app(store_url: str, api: KeyedApi, sysdb: str, mode: str, workflow: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(APP), store_url, api.url, sysdb, mode, workflow, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def until(check, what: str, proc: subprocess.Popen | None = None, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the app exited {proc.returncode}: {proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def finished(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def runs_of(store_url: str) -> list:
    store = open_store(store_url)
    try:
        return store.list_runs()
    finally:
        store.close()


def test_dbos_workflow_killed_mid_write_is_recovered_without_a_second_run_or_charge(tmp_path):
    api = KeyedApi(tmp_path)
    store_url, sysdb, wf = f"sqlite:///{tmp_path}/tether.db", f"sqlite:///{tmp_path}/dbos.sqlite", "wf-pay-1"
    try:
        first = app(store_url, api, sysdb, "start", wf)
        until(lambda: any(e["order"] == f"{wf}-a" for e in api.effects()), "the first charge", first)
        # The next charge takes effect at once and answers late: it is on the wire when the process dies.
        api.control(slow_first=60, slow_phase="answer")
        until(lambda: any(e["order"] == f"{wf}-b" for e in api.effects()), "the second charge", first)
        first.send_signal(signal.SIGKILL)
        first.wait()
        api.control(slow_first=0)
        (run,) = runs_of(store_url)
        assert run.status == "running" and run.run_key and run.run_key.startswith(f"{wf}:")

        result = finished(app(store_url, api, sysdb, "recover", wf))

        assert result["status"] == "completed", result
        assert result["result"] == [f"{wf}-a", f"{wf}-b"] and result["run_id"] == run.run_id
        assert Counter(e["order"] for e in api.effects()) == {f"{wf}-a": 1, f"{wf}-b": 1}
        sent = Counter(r["order"] for r in api.requests())
        assert sent[f"{wf}-a"] == 1  # the first charge was not sent again
        # The second was re-sent once, with the key it first went out with, and answered from the API's record.
        keys = {r["key"] for r in api.requests() if r["order"] == f"{wf}-b"}
        assert sent[f"{wf}-b"] == 2 and len(keys) == 1
        (after,) = runs_of(store_url)
        assert after.run_id == run.run_id and after.status == "completed"
    finally:
        api.stop()


def test_dbos_workflow_waits_for_approval_on_recv_across_a_kill_and_resumes_the_run(tmp_path):
    # The documented pattern: the step returns the paused envelope; the workflow waits on DBOS.recv for
    # the decision and resumes the run in a step of its own. Killed while it waits, it waits again.
    api = KeyedApi(tmp_path)
    store_url, sysdb, wf = f"sqlite:///{tmp_path}/tether.db", f"sqlite:///{tmp_path}/dbos.sqlite", "wf-approve-1"
    client = None
    try:
        first = app(store_url, api, sysdb, "start", wf, "approval")
        until(lambda: any(r.status == "paused" for r in runs_of(store_url)) if Path(
            f"{tmp_path}/tether.db").exists() else False, "the first pause", first)
        client = DBOSClient(system_database_url=sysdb)
        paused = client.get_event(wf, "paused", timeout_seconds=60)
        assert paused is not None and api.effects() == []
        first.send_signal(signal.SIGKILL)
        first.wait()

        second = app(store_url, api, sysdb, "recover", wf, "approval")
        client.send(wf, "approve", "approval")
        seen = paused

        def next_pause() -> bool:
            nonlocal seen
            now = client.get_event(wf, "paused", timeout_seconds=0.1)
            if now is not None and now != seen:
                seen = now
                return True
            return False

        until(next_pause, "the second pause", second)
        assert [e["order"] for e in api.effects()] == [f"{wf}-a"]
        client.send(wf, "approve", "approval")
        result = finished(second)
        assert result["status"] == "completed" and result["result"] == [f"{wf}-a", f"{wf}-b"], result
        assert Counter(e["order"] for e in api.effects()) == {f"{wf}-a": 1, f"{wf}-b": 1}
        assert len(runs_of(store_url)) == 1
    finally:
        if client is not None:
            client.destroy()
        api.stop()
