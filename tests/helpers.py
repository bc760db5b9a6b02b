"""Small tool sets for runtime tests (real async functions, no mocks)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

from tether._tools.model import Annotations, Tool

ID_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
# Two writes issued together (one pause, two decisions), each task saying what became of its write.
CLOSE_TWO = """
import asyncio
import tools

async def close(i):
    try:
        await tools.helpdesk.close_ticket(id=i)
        return "closed"
    except PermissionError as e:
        return str(e)

await asyncio.gather(close(1), close(2))
"""


class Recorder:
    """Tools that record every delivery, in order, with start/end events."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.events: list[tuple[str, str, Any]] = []
        self.deliveries: list[tuple[str, dict]] = []

    def tools(self) -> list[Tool]:
        async def get_ticket(args: dict) -> Any:
            self.events.append(("start", "get_ticket", args["id"]))
            await asyncio.sleep(self.delay)
            self.events.append(("end", "get_ticket", args["id"]))
            if args["id"] < 0:
                raise LookupError(f"ticket {args['id']} does not exist")
            return {"id": args["id"], "title": f"ticket {args['id']}", "status": "open"}

        async def close_ticket(args: dict) -> Any:
            self.deliveries.append(("close_ticket", dict(args)))
            return {"id": args["id"], "status": "closed"}

        async def add_comment(args: dict) -> Any:
            self.deliveries.append(("add_comment", dict(args)))
            return {"ticket": args["id"], "comment": len(self.deliveries)}

        async def slow(args: dict) -> Any:
            await asyncio.sleep(args.get("seconds", 10))
            return "late"

        async def slow_write(args: dict) -> Any:
            self.deliveries.append(("slow_write", dict(args)))
            await asyncio.sleep(args.get("seconds", 10))
            return "late"

        comment_schema = {"type": "object", "properties": {"id": {"type": "integer"}, "body": {"type": "string"}},
                          "required": ["id", "body"]}
        slow_schema = {"type": "object", "properties": {"seconds": {"type": "number"}}}
        return [
            Tool("helpdesk", "get_ticket", "Get one ticket by id.", ID_SCHEMA, get_ticket,
                 annotations=Annotations(read_only=True)),
            Tool("helpdesk", "close_ticket", "Close a ticket.", ID_SCHEMA, close_ticket,
                 annotations=Annotations(destructive=True)),
            Tool("helpdesk", "add_comment", "Add a comment to a ticket.", comment_schema, add_comment),
            Tool("slowpoke", "wait", "Answers late.", slow_schema, slow, annotations=Annotations(read_only=True)),
            Tool("slowpoke", "write", "A write that answers late.", slow_schema, slow_write),
        ]


class Clock:
    """An injectable clock: durability tests move time instead of sleeping."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class KeyedApi:
    """tests/fixtures/keyed_api.py in its own process: a payments API that dedupes by idempotency key.

    ``effects()`` reads its ledger (one entry per charge that took effect),
    ``requests()`` every request it received.
    """

    FIXTURES = Path(__file__).parent / "fixtures"
    SPEC = FIXTURES / "keyed_api.json"

    def __init__(self, tmp) -> None:
        import subprocess
        import sys
        import time

        self.ledger, self.requests_file, port_file = tmp / "ledger.jsonl", tmp / "requests.jsonl", tmp / "port"
        self.proc = subprocess.Popen([sys.executable, str(self.FIXTURES / "keyed_api.py"), str(self.ledger),
                                      str(self.requests_file), str(port_file)])
        deadline = time.monotonic() + 10
        while not port_file.exists():
            assert time.monotonic() < deadline and self.proc.poll() is None, "keyed API did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{port_file.read_text()}"

    @staticmethod
    def _lines(path) -> list[dict]:
        import json

        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def effects(self) -> list[dict]:
        return self._lines(self.ledger)

    def requests(self) -> list[dict]:
        return self._lines(self.requests_file)

    def control(self, **settings: Any) -> None:
        import httpx

        httpx.post(self.url + "/_control", json=settings, timeout=5).raise_for_status()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_cli(args: list[str], env: dict[str, str], cwd: Any, stdin: str | bytes | None = None) -> Any:
    """``tether ARGS`` run inside this process: ``tether.cli.main`` with ``env`` as the whole environment
    and ``cwd`` as the working directory, both restored after. Returns what ``subprocess.run`` would
    (returncode, stdout, stderr as text), for commands whose point is not a process boundary.
    """
    import contextlib
    import io
    import os
    import subprocess
    import sys

    from tether.cli import main

    saved_env, saved_cwd, saved_stdin = dict(os.environ), os.getcwd(), sys.stdin
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        data = stdin.encode() if isinstance(stdin, str) else stdin or b""
        sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    finally:
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["tether", *args], code, out.getvalue(), err.getvalue())


class Gate:
    """A read tool, `gate.hold`, that answers only once the test opens the gate: the run's progress is the
    test's to decide (no sleeps)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.open = asyncio.Event()

    def tool(self) -> Tool:
        async def hold(args: dict) -> Any:
            self.entered.set()
            await self.open.wait()
            return "through"

        return Tool("gate", "hold", "Answers once the gate opens.", {"type": "object", "properties": {}}, hold,
                    annotations=Annotations(read_only=True))


def direct_sql(kind: str, url: str, schema: str, statement: str, params: tuple = ()) -> list[tuple]:
    """Rows read or written straight in a test's database, as an operator, an attacker with write access, or
    the previous release would: ``?`` placeholders on either backend, committed at once."""
    if kind == "sqlite":
        import sqlite3

        conn = sqlite3.connect(url[len("sqlite:///"):])
        try:
            with conn:
                return conn.execute(statement, params).fetchall()
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        cursor = conn.execute(statement.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description else []


# The two store backends a test runs on; Postgres only where tests/pg.py can start (or is given) a server.
def store_backend_params() -> list:
    import pytest

    return ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def each_store_backend(request: Any, tmp_path: Any, monkeypatch: Any, make: Any) -> Any:
    """A fixture's body: ``make(kind, url[, schema])`` for ``request.param``, the store's secret its own
    (no TETHER_SECRET from the environment); on Postgres in a schema of its own, dropped afterwards."""
    import uuid

    monkeypatch.delenv("TETHER_SECRET", raising=False)
    monkeypatch.delenv("TETHER_SECRET_FILE", raising=False)
    if request.param == "sqlite":
        yield make("sqlite", f"sqlite:///{tmp_path}/tether.db")
        return
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    made = make("postgres", request.getfixturevalue("pg_url"), schema)
    yield made
    # A Runtime leaves the store it was handed open (its caller's), so the stores a test opened close here:
    # left open, each keeps its pooled connections until the session ends, and the session's cluster
    # (max_connections 100) refuses a later test's replicas.
    for store in getattr(made, "opened", ()):
        with contextlib.suppress(Exception):
            store.close()
    with psycopg.connect(made.url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@dataclass
class StoreBackend:
    """One of the two store backends a test runs on (``each_store_backend`` makes it): its store, and its rows
    edited straight in the database."""

    kind: str
    url: str
    schema: str = "tether"  # Postgres: a schema per test keeps other tests' runs out of its way
    opened: list[Any] = field(default_factory=list)  # closed by each_store_backend after the test

    def store(self) -> Any:
        if self.kind == "sqlite":
            from tether._store import open_store

            return open_store(self.url)
        from tether._store.postgres import PostgresStore

        store = PostgresStore(self.url, schema=self.schema)
        self.opened.append(store)
        return store

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        """Rows read or written directly, as an operator, an attacker with write access, or the previous
        release would."""
        return direct_sql(self.kind, self.url, self.schema, statement, params)


@contextlib.contextmanager
def served_in_thread(app: Any) -> Iterator[str]:
    """A real uvicorn serving ``app`` on a free loopback port, in a thread stopped afterwards; its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    assert not thread.is_alive()


def own_database(url: str, prefix: str) -> str:
    """A database of a test's own on the session's Postgres cluster (its URL): processes a test starts see no
    other test's runs."""
    import uuid
    from urllib.parse import urlsplit

    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    # postgresql:///postgres?host=... : the database is the path; urlunsplit would drop the empty host.
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/{name}" + (f"?{parts.query}" if parts.query else "")


@contextlib.asynccontextmanager
async def own_pool_runtime(store: Any, tools: list[Tool], stream: bool, **kw: Any) -> AsyncIterator[Any]:
    """A runtime over ``store`` with a sandbox pool of its own that streams calls or not (D-80): what another
    process has."""
    from tether._runtime import Runtime
    from tether._sandbox.monty import SandboxPool

    pool = SandboxPool(max_workers=2, stream_async_calls=stream, request_timeout=30.0)
    kw.setdefault("type_check", False)
    try:
        async with Runtime(store=store, tools=tools, pool=pool, clock=kw.pop("clock", None) or Clock(), **kw) as rt:
            yield rt
    finally:
        await pool.close()


def signed_as_other_monty(rt: Any, run_id: str) -> None:
    """Store the run's snapshot signed as another Monty's: a resume can only replay the journal (P-12)."""
    from tether._engine.integrity import sign_snapshot_record
    from tether._store.base import SnapshotRecord

    snap = rt.store.latest_snapshot(run_id)
    mac = sign_snapshot_record(rt.engine.keyring, snap.run_id, snap.seq, "pydantic-monty-0.0.1", snap.data,
                               snap.pending, snap.kind)
    rt.store.put_snapshot(SnapshotRecord(snap.run_id, snap.seq, "pydantic-monty-0.0.1", snap.data, mac,
                                         snap.pending, rt.engine.clock(), snap.kind))


def batched_runtime(url: str, rec: Recorder, **kw: Any) -> Any:
    """A runtime over the store at ``url`` with ``rec``'s tools, whose write pauses form over a wider window:
    the decision tests are about what a batch means, and a starved machine must not split one (P-27)."""
    from tether._runtime import Runtime
    from tether._store import open_store

    kw.setdefault("type_check", False)
    rt = Runtime(store=open_store(url), tools=rec.tools(), **kw)
    rt.engine.settings.batch_window_seconds = 0.2
    return rt


def store_url_of(backend: str, request: Any) -> str:
    """The test's store URL for ``backend`` ("sqlite" or "postgres")."""
    return str(request.getfixturevalue("store_url" if backend == "sqlite" else "pg_url"))


def write_states(rt: Any, run_id: str) -> dict[int, str]:
    """Each write of the run's journal, by seq, in the state it is in."""
    return {c.seq: c.state for c in rt.store.get_calls(run_id) if c.kind == "write"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def npm_ci(folder: Path, *, installed: bool, need: str) -> None:
    """Install ``folder``'s pinned npm packages unless ``installed``: `make test` runs `npm ci` first, and this
    covers pytest run directly on a fresh clone. ``need`` names the tests that need Node, for the error."""
    if shutil.which("node") is None:
        raise RuntimeError(f"node is not installed; {need} need Node.js 20+")
    if not installed:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=folder, check=True, capture_output=True,
                       timeout=300)


def start_until(command: list[str], log: Path, ready: bytes, what: str, *, timeout: float = 30,
                **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``command`` with its output in ``log``; return once the log holds ``ready`` (else kill it, and raise
    naming ``what`` with what it logged)."""
    out = open(log, "wb")
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **popen)
    deadline = time.monotonic() + timeout
    while ready not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} did not start: {log.read_text()}")
        time.sleep(0.05)
    return proc


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc`` if it still runs; kill it if it will not go within 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
