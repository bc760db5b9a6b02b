"""Several ``tether serve --http`` replicas on one Postgres (a helper, not a test).

Every replica is a real process with its own ``TETHER_HOME`` (so nothing is
shared through the file system but the ledger) and the same store URL. A
:class:`RoundRobin` transport sends each HTTP request of one client to the
next replica, as a balancer without sticky sessions would.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from tests.server.test_server_http import LEDGER_TOOLS, stop_server

from helpers import free_port

CONFIG = """\
[server]
max_concurrent_runs = 4
queue_depth = 8
queue_timeout_seconds = 30
{server_extra}

[sandbox]
max_workers = 2

[[policy.rules]]
match = "ledger.write"
action = "allow"
"""

TOOLS = ("--tools", "tether.demo.helpdesk")


class Replica:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/mcp"


class ReplicaSet:
    """N replicas sharing ``store_url`` and one ledger file under ``root``."""

    def __init__(self, root: Path, store_url: str, n: int, *, server_extra: str = "",
                 lease_seconds: float | None = None, env_of: dict[int, dict[str, str]] | None = None) -> None:
        self.root, self.store_url = root, store_url
        self.env_of = env_of or {}  # per replica, e.g. a secret file of its own
        root.mkdir(parents=True, exist_ok=True)
        (root / "ledger_tools.py").write_text(LEDGER_TOOLS)
        (root / "tether.toml").write_text(CONFIG.format(server_extra=server_extra))
        self.ledger = root / "ledger.txt"
        self.env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "TETHER_STORE_URL")}
        self.env.update(TETHER_STORE_URL=store_url, LEDGER=str(self.ledger))
        if lease_seconds is not None:
            self.env["TETHER_LEASE_SECONDS"] = str(lease_seconds)
        self.replicas: list[Replica] = []
        for i in range(n):
            self.replicas.append(self.start(i))
        for r in self.replicas:
            self._wait_ready(r)

    def tools_args(self) -> list[str]:
        return [*TOOLS, "--tools", str(self.root / "ledger_tools.py")]

    def start(self, i: int) -> Replica:
        port = free_port()
        env = dict(self.env, TETHER_HOME=str(self.root / f"home{i}"), **self.env_of.get(i, {}))
        log = self.root / f"replica{i}.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tether.cli", "--config", str(self.root / "tether.toml"), "serve",
                 "--http", f"127.0.0.1:{port}", "--dev", *self.tools_args()],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        return Replica(proc, port, log)

    def _wait_ready(self, r: Replica) -> None:
        wait_ready(r.proc, r.base, r.log)

    def tags(self) -> list[str]:
        return self.ledger.read_text().splitlines() if self.ledger.exists() else []

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``tether`` in another process on the same store: one more replica, without HTTP."""
        env = dict(self.env, TETHER_HOME=str(self.root / "home-cli"))
        return subprocess.run([sys.executable, "-m", "tether.cli", "--config", str(self.root / "tether.toml"),
                               *args], env=env, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        for r in self.replicas:
            stop_server(r.proc)


def wait_ready(proc: subprocess.Popen, base: str, log: Path, timeout: float = 60) -> None:
    """Until ``tether serve --http`` at ``base`` answers /readyz; its log in the error when it exits or never does."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {log.read_text()}")
        with contextlib.suppress(httpx2.HTTPError):
            if httpx2.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"server not ready: {log.read_text()}")
        time.sleep(0.1)


class RoundRobin(httpx2.AsyncBaseTransport):
    """Each request to the next replica; ``seen`` records which one got each POST."""

    def __init__(self, ports: list[int]) -> None:
        self.ports, self.i, self.seen = ports, 0, []
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = self.ports[self.i % len(self.ports)]
        self.i += 1
        if request.method == "POST":
            self.seen.append(port)
        request.url = request.url.copy_with(port=port)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Sticky(httpx2.AsyncBaseTransport):
    """A balancer with sticky sessions: a request carrying ``Mcp-Session-Id`` goes to the replica that
    issued that session; one without (an initialize) to the next replica in rotation that is up.
    ``down(port)`` takes a replica out of rotation, as a balancer's health check would."""

    def __init__(self, ports: list[int]) -> None:
        self.up, self.i = list(ports), 0
        self.sessions: dict[str, int] = {}
        self.seen: list[tuple[str | None, int]] = []  # (session, port) of each POST
        self.inner = httpx2.AsyncHTTPTransport()

    def down(self, port: int) -> None:
        self.up.remove(port)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        session = request.headers.get("mcp-session-id")
        if session is not None and session in self.sessions:
            port = self.sessions[session]
        else:
            port = self.up[self.i % len(self.up)]
            self.i += 1
        if request.method == "POST":
            self.seen.append((session, port))
        request.url = request.url.copy_with(port=port)
        response = await self.inner.handle_async_request(request)
        issued = response.headers.get("mcp-session-id")
        if issued is not None:
            self.sessions.setdefault(issued, port)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@contextlib.asynccontextmanager
async def connect(url: str, mode: str, *, transport: httpx2.AsyncBaseTransport | None = None,
                  headers: dict[str, str] | None = None, **kwargs):
    timeout = httpx2.Timeout(30, read=300)
    async with httpx2.AsyncClient(timeout=timeout, transport=transport, headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode, **kwargs) as client:
            yield client
