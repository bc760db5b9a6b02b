"""Background runs from the command line: start, a worker nobody started by hand, takeover after SIGKILL.

Workers and servers are processes of their own; the commands around them run through ``main()`` in this process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import run_cli

FIXTURES = Path(__file__).parent.parent / "fixtures"
TETHER = [sys.executable, "-m", "tether.cli"]

pytestmark = pytest.mark.slow


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    e["TETHER_HOME"] = str(tmp_path / "home")
    e["NOTES_FILE"] = str(tmp_path / "notes.jsonl")
    e["TETHER_LEASE_SECONDS"] = "1"
    e.pop("TETHER_STORE_URL", None)
    return e


def tether(args, env, cwd):
    return run_cli(args, env, cwd)


def stop_worker(env):
    pid_file = Path(env["TETHER_HOME"]) / "worker.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def test_p19_start_runs_without_anyone_starting_a_worker(tmp_path, env):
    prog = tmp_path / "job.py"
    prog.write_text("import tools\nawait tools.notes.add_note(text='bg')\nlen(await tools.notes.list_notes())\n")
    (tmp_path / "tether.toml").write_text('[policy]\nwrites = "allow"\n')
    try:
        started = tether(["start", str(prog), "--tools", str(FIXTURES / "notes_tools.py"), "--json"], env, tmp_path)
        assert started.returncode == 0, started.stderr
        run_id = json.loads(started.stdout)["run_id"]
        done = tether(["runs", "await", run_id, "--timeout", "60", "--json"], env, tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["result"] == 1
    finally:
        stop_worker(env)


def test_p19_a_run_whose_worker_was_killed_is_taken_over_without_resending(tmp_path, env):
    # Five slow writes; the first worker is SIGKILLed in the middle.
    prog = tmp_path / "slow.py"
    prog.write_text(
        "import asyncio\nimport tools\n"
        "for i in range(5):\n"
        "    await tools.notes.add_note(text='n' + str(i))\n"
        "    await asyncio.sleep(0.4)\n"
        "len(await tools.notes.list_notes())\n"
    )
    (tmp_path / "tether.toml").write_text('[policy]\nwrites = "allow"\n')
    tools = ["--tools", str(FIXTURES / "notes_tools.py")]
    started = tether(["start", str(prog), "--no-worker", "--json"] + tools, env, tmp_path)
    run_id = json.loads(started.stdout)["run_id"]
    first = subprocess.Popen(TETHER + ["worker"] + tools, env=env, cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    notes = Path(env["NOTES_FILE"])
    deadline = time.monotonic() + 60
    while not (notes.exists() and len(notes.read_text().splitlines()) >= 2):
        assert time.monotonic() < deadline, "the first worker never wrote"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    (Path(env["TETHER_HOME"]) / "worker.pid").unlink(missing_ok=True)
    second = subprocess.Popen(TETHER + ["worker", "--idle-exit", "3"] + tools, env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        done = tether(["runs", "await", run_id, "--timeout", "60", "--json"], env, tmp_path)
        out = json.loads(done.stdout)
    finally:
        second.kill()
        second.wait()
    texts = [json.loads(line)["text"] for line in notes.read_text().splitlines()]
    assert len(texts) == len(set(texts)), f"a write was delivered twice: {texts}"
    if out["status"] == "completed":
        assert texts == [f"n{i}" for i in range(5)] and out["result"] == 5
    else:
        # Killed between the sending mark and the outcome: reported, never re-sent.
        assert out["error"]["code"] == "write_outcome_unknown"


def test_p18_a_sleep_survives_a_worker_restart_with_only_the_remaining_time(tmp_path, env):
    from tether._store import open_store

    prog = tmp_path / "nap.py"
    prog.write_text("import asyncio\nawait asyncio.sleep(4)\n'woke'\n")
    started = tether(["start", str(prog), "--no-worker", "--json"], env, tmp_path)
    run_id = json.loads(started.stdout)["run_id"]
    # The first worker runs the program until it parks on the sleep, then exits idle.
    first = subprocess.run(TETHER + ["worker", "--idle-exit", "0.5"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    store = open_store(f"sqlite:///{env['TETHER_HOME']}/tether.db")
    run = store.get_run(run_id)
    assert run.status == "waiting" and run.pending["kind"] == "sleep"
    deadline = run.expires_at
    time.sleep(2)  # nothing is running the program now
    second = subprocess.Popen(TETHER + ["worker", "--idle-exit", "2"], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    restarted_at = time.time()
    try:
        done = tether(["runs", "await", run_id, "--timeout", "60", "--json"], env, tmp_path)
    finally:
        second.wait(timeout=60)
    assert json.loads(done.stdout)["result"] == "woke"
    finished = store.get_run(run_id).updated_at
    store.close()
    # Woken at its original deadline, not a full 4 s after the new worker started.
    assert deadline <= finished < restarted_at + 3.9  # a full 4 s restart would end after +4


def test_p19_tether_serve_is_also_a_runner(tmp_path, env):
    prog = tmp_path / "bg.py"
    prog.write_text("1 + 41\n")
    started = tether(["start", str(prog), "--no-worker", "--json"], env, tmp_path)
    run_id = json.loads(started.stdout)["run_id"]
    server = subprocess.Popen(TETHER + ["serve", "--stdio"], env=env, cwd=tmp_path, stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        done = tether(["runs", "await", run_id, "--timeout", "60", "--json"], env, tmp_path)
        assert json.loads(done.stdout)["result"] == 42
    finally:
        server.stdin.close()  # end of input ends a stdio server
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def test_waits_from_the_command_line(tmp_path, env):
    """run parks on a wait (exit 3, key shown); waits list/resolve continue it; a second resolve is refused."""
    prog = tmp_path / "w.py"
    prog.write_text("v = await wait_for('go-ahead')\nv['n'] * 2\n")
    r = tether(["run", str(prog), "--json"], env, tmp_path)
    assert r.returncode == 3
    parked = json.loads(r.stdout)
    assert parked["status"] == "waiting"
    listed = json.loads(tether(["waits", "list", "--json"], env, tmp_path).stdout)
    assert [w["key"] for w in listed] == [parked["pending"]["key"]]
    done = tether(["waits", "resolve", parked["pending"]["key"], "--value", '{"n": 21}', "--json"], env, tmp_path)
    assert done.returncode == 0
    out = json.loads(done.stdout)
    assert out["status"] == "accepted" and out["run"]["result"] == 42
    again = tether(["waits", "resolve", parked["pending"]["key"], "--value", '{"n": 1}', "--json"], env, tmp_path)
    assert json.loads(again.stdout)["status"] == "already_resolved"
    key = parked["pending"]["key"]
    forged_key = key[:-1] + ("0" if key[-1] != "0" else "1")
    forged = tether(["waits", "resolve", forged_key, "--value", "1"], env, tmp_path)
    assert forged.returncode == 1 and "unknown_or_revoked" in forged.stdout
    bad = tether(["waits", "resolve", parked["pending"]["key"], "--value", "{not json"], env, tmp_path)
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr


def test_the_readmes_long_job_starts_as_a_cell_and_is_watched_to_its_result(tmp_path, env):
    """README "Long work": `tether cells start examples/long_job.py --tools tether.demo.helpdesk --json`, then
    `tether cells watch CELL_ID` draws the progress and ends with the result."""
    job = Path(__file__).parent.parent.parent / "examples" / "long_job.py"
    try:
        started = tether(["cells", "start", str(job), "--tools", "tether.demo.helpdesk", "--json"], env, tmp_path)
        assert started.returncode == 0, started.stdout + started.stderr
        obs = json.loads(started.stdout)
        assert obs["status"] == "running" and obs["cell_id"].startswith("run_")
        watched = tether(["cells", "watch", obs["cell_id"]], env, tmp_path)
        assert watched.returncode == 0, watched.stdout + watched.stderr
        lines = watched.stdout.splitlines()
        assert "[##############################] 200/200 records" in lines
        assert lines[-2].startswith('result: {"flagged": [') and lines[-1] == f"[completed] cell {obs['cell_id']}"
    finally:
        stop_worker(env)
