"""The store contract under concurrency: threads, processes, a process killed mid-transaction, a broken connection; on
SQLite and Postgres."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from contract import Backend, make_call, make_run
from tether.errors import StoreError

# ---------------------------------------------------------------------------
# Concurrency: threads, processes, and a process killed mid-transaction

WORKER = r"""
import json, sys, time
spec, mode = json.loads(sys.argv[1]), sys.argv[2]

def open_store():
    if spec["kind"] == "sqlite":
        from tether._store.sqlite import SQLiteStore
        return SQLiteStore(spec["url"])
    from tether._store.postgres import PostgresStore
    return PostgresStore(spec["url"], schema=spec["schema"])

if mode == "cas":
    store = open_store()
    print("ready", flush=True)
    sys.stdin.readline()
    won = store.update_run("race", ["paused"], status="running", owner=sys.argv[3])
    print(json.dumps(won), flush=True)
elif mode == "open":
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(open_store().secret().hex()), flush=True)
elif mode == "hold":
    store = open_store()
    conn = store._connection()
    if spec["kind"] == "sqlite":
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE runs SET status = 'failed' WHERE run_id = 'held'")
    else:
        conn.execute("UPDATE runs SET status = 'failed' WHERE run_id = 'held'")
    print("ready", flush=True)
    time.sleep(600)
"""


def _spawn(backend: Backend, mode: str, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, backend.spec, mode, *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready", f"worker {mode} did not start"
    return proc


def _go_all(procs: list[subprocess.Popen]) -> list[Any]:
    # Release every worker at once so they contend, then collect their answers.
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    answers = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        answers.append(json.loads(out))
    return answers


@pytest.mark.slow
def test_processes_racing_one_cas_have_exactly_one_winner(backend):
    store = backend.open()
    store.create_run(make_run("race", status="paused"))
    procs = [_spawn(backend, "cas", f"worker-{i}") for i in range(8)]
    won = _go_all(procs)
    assert won.count(True) == 1, won
    run = store.get_run("race")
    assert run.status == "running" and run.owner == f"worker-{won.index(True)}"


@pytest.mark.slow
def test_processes_opening_a_new_store_at_once_agree_on_schema_and_secret(backend):
    procs = [_spawn(backend, "open") for _ in range(6)]
    secrets_seen = set(_go_all(procs))
    assert len(secrets_seen) == 1
    store = backend.open()
    assert secrets_seen == {store.secret().hex()} and store.schema_version() == len(store.migrations)


@pytest.mark.slow
def test_a_process_killed_mid_transaction_leaves_the_store_writable(backend):
    store = backend.open()
    store.create_run(make_run("held", status="paused"))
    proc = _spawn(backend, "hold")
    try:
        assert _write_lock_is_taken(backend), "the worker holds its transaction open"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert store.get_run("held").status == "paused", "the killed write was not committed"
    assert store.update_run("held", ["paused"], status="running")
    assert store.get_run("held").status == "running"


def _write_lock_is_taken(backend: Backend) -> bool:
    """Try the held run's lock without waiting, on a connection of our own."""
    if backend.kind == "sqlite":
        import sqlite3

        conn = sqlite3.connect(backend.url[len("sqlite:///") :], timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            return "locked" in str(exc)
        finally:
            conn.close()
        return False
    import psycopg

    with psycopg.connect(backend.url) as conn:
        try:
            conn.execute(f"SELECT 1 FROM {backend.schema}.runs WHERE run_id = 'held' FOR UPDATE NOWAIT")
        except psycopg.errors.LockNotAvailable:
            return True
    return False


def test_threads_share_one_store(store):
    store.create_run(make_run())
    errors: list[BaseException] = []

    def record(base: int) -> None:
        try:
            for i in range(25):
                store.record_call(make_call(seq=base + i))
                assert store.update_call("r1", base + i, ["pending"], state="done")
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=record, args=(n * 100,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    calls = store.get_calls("r1")
    assert len(calls) == 150 and all(c.state == "done" for c in calls)


def test_records_are_plain_dataclasses(store):
    # Callers copy records with dataclasses.replace; nothing store-specific rides along.
    store.create_run(make_run())
    run = store.get_run("r1")
    assert dataclasses.replace(run, status="running").status == "running"


def test_a_broken_postgres_connection_is_replaced_on_the_next_call(backend):
    if backend.kind != "postgres":
        pytest.skip("connections are Postgres's")
    import psycopg

    store = backend.open()
    store.create_run(make_run())
    pid = store._connection().info.backend_pid
    with psycopg.connect(backend.url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    # The call that meets the dead connection fails as a StoreError, and is not retried:
    # a lost answer to a commit would make a retry a second write.
    with pytest.raises(StoreError):
        store.get_run("r1")
    assert store.get_run("r1") == make_run()
