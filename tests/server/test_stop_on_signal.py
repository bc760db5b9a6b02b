"""``tether serve --stdio`` and ``tether worker`` stop on SIGTERM like ``tether serve --http`` (D-34):
a free loop stops cleanly at once, a loop held by a run is ended after the grace period, and a
worker's watchdog names the run and call holding its loop.

The held loop is operator code: a Python tool whose synchronous ``time.sleep`` runs on the loop.
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

pytestmark = pytest.mark.slow

GRACE = 3.0

WEDGE_TOOLS = (Path(__file__).parent.parent / "fixtures" / "wedge_tools.py").read_text()

CONFIG = f"""\
[server]
loop_stall_seconds = 1
shutdown_grace_seconds = {GRACE}
"""

HELD = "import tools\nawait tools.wedge.block(seconds=600)\n"


def _setup(root: Path) -> tuple[list[str], dict[str, str]]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "wedge_tools.py").write_text(WEDGE_TOOLS)
    (root / "tether.toml").write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["TETHER_HOME"] = str(root / "home")
    return [sys.executable, "-m", "tether.cli", "--config", str(root / "tether.toml")], env


def _until(predicate, seconds: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {log.read_text() if log.exists() else ''}")
        time.sleep(0.1)


def _stops(proc: subprocess.Popen, within: float) -> int:
    try:
        return proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
        raise AssertionError(f"still running {within:g} s after SIGTERM") from None


def _worker(root: Path, cli: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    log = root / "worker.err"
    with open(log, "wb") as err:
        proc = subprocess.Popen([*cli, "worker", "--tools", str(root / "wedge_tools.py")], env=env, cwd=root,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    # Listening once its pid file names it (and `tether start` then starts no other).
    _until(lambda: (root / "home" / "worker.pid").exists() or proc.poll() is not None, 60, "worker did not start", log)
    assert proc.poll() is None, log.read_text()
    return proc, log


def test_a_worker_names_the_run_holding_its_loop_and_sigterm_ends_it_within_the_grace(tmp_path):
    cli, env = _setup(tmp_path)
    proc, log = _worker(tmp_path, cli, env)
    try:
        (tmp_path / "held.py").write_text(HELD)
        started = subprocess.run([*cli, "start", "held.py", "--no-check", "--tools", str(tmp_path / "wedge_tools.py")],
                                 env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stderr
        run_id = started.stdout.strip()
        _until(lambda: "event loop stuck" in log.read_text(), 60, "the watchdog said nothing", log)
        said = log.read_text()
        assert f"run {run_id} call 1 (wedge.block)" in said, said
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _stops(proc, GRACE + 15)
        assert time.monotonic() - t >= GRACE - 0.5  # the loop was held: it was the grace timer that ended it
        assert "exiting now" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


def test_an_idle_worker_stops_cleanly_on_sigterm(tmp_path):
    cli, env = _setup(tmp_path)
    proc, log = _worker(tmp_path, cli, env)
    proc.send_signal(signal.SIGTERM)
    assert _stops(proc, GRACE + 15) == 0, log.read_text()
    said = log.read_text()
    assert "handled 0 runs" in said and "exiting now" not in said, said
    assert not (tmp_path / "home" / "worker.pid").exists()  # it cleaned up after itself


def _stdio(root: Path, cli: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    log = root / "serve.err"
    with open(log, "wb") as err:
        proc = subprocess.Popen([*cli, "serve", "--stdio", "--tools", str(root / "wedge_tools.py")], env=env,
                                cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    assert proc.stdin is not None and proc.stdout is not None
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
    proc.stdin.write((json.dumps(hello) + "\n").encode())
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline() or "{}")
    assert answer.get("id") == 1 and "result" in answer, (answer, log.read_text())
    proc.stdin.write((json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n").encode())
    proc.stdin.flush()
    return proc, log


def test_serve_stdio_ends_within_the_grace_when_a_run_holds_its_loop(tmp_path):
    cli, env = _setup(tmp_path)
    proc, log = _stdio(tmp_path, cli, env)
    try:
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "execute",
                                                                              "arguments": {"code": HELD}}}
        proc.stdin.write((json.dumps(call) + "\n").encode())
        proc.stdin.flush()
        _until(lambda: "event loop stuck" in log.read_text(), 60, "the watchdog said nothing", log)
        assert "call 1 (wedge.block)" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        _stops(proc, GRACE + 15)
        assert "exiting now" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


def test_serve_stdio_stops_cleanly_on_sigterm_while_its_client_stays_connected(tmp_path):
    cli, env = _setup(tmp_path)
    proc, log = _stdio(tmp_path, cli, env)
    try:
        proc.send_signal(signal.SIGTERM)
        assert _stops(proc, GRACE + 15) == 0, log.read_text()
        assert "exiting now" not in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


def test_http_stops_on_a_sigterm_sent_while_it_is_still_starting(tmp_path):
    """A SIGTERM between `serve --http` saying what it serves and uvicorn taking the signals over reached
    serve's own handler only: the server went on serving. A supervisor stops a server as soon as it likes."""
    import socket

    cmd, env = _setup(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([*cmd, "serve", "--http", f"127.0.0.1:{port}", "--dev"], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    _until(lambda: "serving MCP at" in log.read_text(), 30, "serve --http never said what it serves", log)
    proc.send_signal(signal.SIGTERM)
    assert _stops(proc, within=GRACE + 10) == 0, log.read_text()
