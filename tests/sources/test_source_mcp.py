"""MCPSource against real MCP peers: mcp-server-time, mcp-server-git and the
fixture servers in tests/fixtures (stdio and streamable HTTP). No mocks.

Every test tags the upstream's environment with a unique marker and checks,
after close(), that no process carrying it is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tether._sources.mcp import ElicitationRequest, ElicitationResponse, MCPSource
from tether.errors import ConfigError, ToolError

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent.parent / "fixtures"
SERVER = str(FIXTURES / "mcp_fixture_server.py")
PAGED = str(FIXTURES / "mcp_paged_server.py")
FLOOD = str(FIXTURES / "mcp_flood_server.py")
BIN = Path(sys.executable).parent
PY = sys.executable


def _tagged(tag: str) -> list[int]:
    """Pids of live processes whose environment carries TETHER_TEST_TAG=tag."""
    needle = f"TETHER_TEST_TAG={tag}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        pids.append(int(entry))
    return pids


def _wait_gone(tag: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while _tagged(tag):
        assert time.monotonic() < deadline, f"upstream processes left behind: {_tagged(tag)}"
        time.sleep(0.02)


async def _gone(tag: str, timeout: float = 10.0) -> None:
    """Like _wait_gone, but lets the event loop run (and notice the exit) meanwhile."""
    deadline = time.monotonic() + timeout
    while _tagged(tag):
        assert time.monotonic() < deadline, f"upstream processes left behind: {_tagged(tag)}"
        await asyncio.sleep(0.02)


@pytest.fixture
def tag() -> str:
    value = uuid.uuid4().hex
    yield value
    _wait_gone(value)


def _fixture_source(tag: str, **kwargs) -> MCPSource:
    return MCPSource("fx", command=[PY, SERVER], env={"TETHER_TEST_TAG": tag}, **kwargs)


def _by_name(source: MCPSource) -> dict:
    return {t.name: t for t in source.tools()}


# --- real peers ------------------------------------------------------------------


async def test_time_server_tools_annotations_and_structured_call(tag):
    async with MCPSource(
        "time", command=[str(BIN / "mcp-server-time")], env={"TETHER_TEST_TAG": tag}
    ) as source:
        assert _tagged(tag)
        tools = _by_name(source)
        assert {"get_current_time", "convert_time"} <= tools.keys()
        # The namespace's one line comes from the server's own name.
        assert source.summary and "time" in source.summary
        now = tools["get_current_time"]
        assert now.source == "mcp" and now.address == "time.get_current_time"
        assert now.annotations.read_only and now.annotations.idempotent and not now.annotations.destructive
        assert not now.is_write
        assert now.input_schema["type"] == "object" and "timezone" in now.input_schema["properties"]
        assert now.output_schema is not None

        value = await now.handler({"timezone": "Asia/Tokyo"})
        assert value["timezone"] == "Asia/Tokyo"
        assert value["datetime"].endswith("+09:00")

        converted = await tools["convert_time"].handler(
            {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
        )
        assert "T21:00" in converted["target"]["datetime"]

        with pytest.raises(ToolError) as info:
            await now.handler({"timezone": "Not/AZone"})
        assert info.value.details["code"] == "upstream_error"
        assert "Not/AZone" in info.value.message
    await _gone(tag)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
async def test_git_server_reads_and_writes_once(tag, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.name", "Tether Test")
    _git(repo, "config", "user.email", "tether@example.com")
    (repo / "notes.txt").write_text("hello\n")

    source = MCPSource(
        "git", command=[str(BIN / "mcp-server-git"), "--repository", str(repo)], env={"TETHER_TEST_TAG": tag}
    )
    await source.start()
    try:
        tools = _by_name(source)
        assert tools["git_status"].annotations.read_only
        assert tools["git_add"].is_write and tools["git_commit"].is_write
        assert tools["git_reset"].annotations.destructive

        status = await tools["git_status"].handler({"repo_path": str(repo)})
        assert "notes.txt" in status

        await tools["git_add"].handler({"repo_path": str(repo), "files": ["notes.txt"]})
        committed = await tools["git_commit"].handler({"repo_path": str(repo), "message": "tether: add notes"})
        assert "Changes committed" in committed
    finally:
        await source.close()
    log = _git(repo, "log", "--format=%s")
    assert log.splitlines().count("tether: add notes") == 1
    assert len(log.splitlines()) == 1


# --- result mapping --------------------------------------------------------------


async def test_results_names_and_annotations_are_mapped(tag):
    async with _fixture_source(tag) as source:
        assert source.summary == "tether-fixture"
        tools = _by_name(source)
        # Structured content wins; the SDK wraps a bare `-> str` as {"result": ...}.
        assert await tools["echo"].handler({"text": "hi"}) == {"result": "hi"}
        assert await tools["add"].handler({"a": 2, "b": 3}) == {"total": 5}
        # Several text blocks: a list of texts. Text that looks like JSON stays text:
        # only structuredContent is data.
        assert await tools["lines"].handler({}) == ['{"n": 1}', "plain words"]
        assert await tools["picture"].handler({}) == {"type": "image", "mime_type": "image/png", "data": "iQ=="}

        weird = tools["weird_name_v2"]
        assert source.upstream_name("weird_name_v2") == "weird-name.v2"
        assert json.loads(await weird.handler({})) == {"ok": True}  # `-> dict` is text only
        assert weird.annotations.destructive and not weird.annotations.read_only

        # No annotations at all: every hint False, so the policy treats it as a write.
        assert tools["add"].annotations.to_dict() == dict.fromkeys(
            ("read_only", "destructive", "idempotent", "open_world"), False
        )
        assert tools["add"].is_write
        assert tools["echo"].annotations.read_only


async def test_upstream_error_message_is_carried_and_clipped(tag):
    async with _fixture_source(tag) as source:
        fail = _by_name(source)["fail"]
        with pytest.raises(ToolError) as info:
            await fail.handler({"message": "quota exceeded " + "x" * 5000})
        assert "quota exceeded" in info.value.message
        assert len(info.value.message) < 2200
        assert info.value.details["code"] == "upstream_error"
        assert info.value.details["upstream_tool"] == "fail"


async def test_pagination_is_followed(tag):
    async with MCPSource("paged", command=[PY, PAGED], env={"TETHER_TEST_TAG": tag}) as source:
        tools = _by_name(source)
        assert sorted(tools) == [f"tool_{i}" for i in range(5)]
        assert await tools["tool_3"].handler({}) == "tool_3"


# --- failures and recovery ----------------------------------------------------------


async def test_upstream_dying_mid_call_is_reported_not_resent(tag, tmp_path):
    log = tmp_path / "calls.log"
    async with _fixture_source(tag) as source:
        tools = _by_name(source)
        with pytest.raises(ToolError) as info:
            await tools["crash"].handler({"log": str(log)})
        assert info.value.details["code"] == "upstream_disconnected"
        assert info.value.details["outcome"] == "unknown"
        assert "unknown" in info.value.message
        await _gone(tag)  # the crashed server is reaped, not left as an orphan

        # The next call reconnects once and goes through.
        assert await tools["record"].handler({"log": str(log), "text": "after"}) == {"result": "recorded"}
        assert _tagged(tag)
    assert log.read_text().splitlines() == ["crash", "after"]


async def test_upstream_exiting_while_idle_reconnects_transparently(tag, tmp_path):
    log = tmp_path / "calls.log"
    async with _fixture_source(tag) as source:
        tools = _by_name(source)
        assert await tools["exit_soon"].handler({}) == {"result": "bye"}
        assert source.connected
        await _gone(tag)
        deadline = time.monotonic() + 10
        while source.connected:  # the source notices the exit on its own
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        # The request is never handed to the dead connection, so sending it on
        # a fresh one is safe and the caller sees no error.
        assert await tools["record"].handler({"log": str(log), "text": "once"}) == {"result": "recorded"}
    assert log.read_text().splitlines() == ["once"]


async def test_hung_call_honours_caller_timeout_and_source_recovers(tag):
    async with _fixture_source(tag) as source:
        tools = _by_name(source)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(tools["hang"].handler({}), 0.5)
        # A hung call never returns; the bound only tells "honoured" from "hung" (loaded machines are slow).
        assert time.monotonic() - started < 20
        assert await tools["echo"].handler({"text": "still here"}) == {"result": "still here"}


async def test_silent_upstream_connect_honours_timeouts(tag):
    silent = [PY, "-c", "import time; time.sleep(120)"]
    source = MCPSource("silent", command=silent, env={"TETHER_TEST_TAG": tag}, connect_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(ToolError) as info:
        await source.start()
    assert info.value.details["code"] == "connect_timeout"
    # A failed start has already stopped the server: 0.5s timeout plus the SDK's
    # 2s grace for a server to exit on stdin EOF before it is terminated (about
    # 2.5 s; the bound is far from that and far from the server's 120 s sleep).
    assert time.monotonic() - started < 30
    assert not _tagged(tag)
    await source.close()

    # With a long connect timeout the caller's own timeout still ends the wait.
    source = MCPSource("silent", command=silent, env={"TETHER_TEST_TAG": tag}, connect_timeout=60)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(source.start(), 0.5)
    await source.close()
    await _gone(tag)


async def test_missing_command_is_a_config_error():
    source = MCPSource("nope", command=["/nonexistent/tether-test-server"])
    with pytest.raises(ConfigError):
        await source.start()
    await source.close()


def test_config_is_checked_at_construction():
    with pytest.raises(ConfigError):
        MCPSource("x")
    with pytest.raises(ConfigError):
        MCPSource("x", command=["a"], url="http://127.0.0.1:1/mcp")
    with pytest.raises(ConfigError):
        MCPSource("x", command="mcp-server-time")  # a string, not argv
    with pytest.raises(ConfigError):
        MCPSource("not-an-identifier", command=["a"])
    with pytest.raises(ConfigError):
        MCPSource("x", command=["a"], headers={"A": "b"})


# --- elicitation -----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_elicitation_declined_without_handler_answered_with_one(tag, mode):
    async with _fixture_source(tag, mode=mode) as source:
        greet = _by_name(source)["greet"]
        assert await greet.handler({}) == {"result": "no name (decline)"}

        asked: list[ElicitationRequest] = []

        async def answer(request: ElicitationRequest) -> ElicitationResponse:
            asked.append(request)
            return ElicitationResponse("accept", {"name": "Ada"})

        source.elicitation_handler = answer
        assert await greet.handler({}) == {"result": "hello Ada"}
        (request,) = asked
        assert request.namespace == "fx" and request.tool == "greet" and request.mode == "form"
        assert request.message == "What is your name?"
        assert "name" in request.requested_schema["properties"]


# --- streamable HTTP -------------------------------------------------------------


@pytest.fixture
def http_server(tag):
    token = uuid.uuid4().hex
    env = {**os.environ, "FIXTURE_EXPECTED_TOKEN": token, "TETHER_TEST_TAG": tag}
    proc = subprocess.Popen([PY, SERVER, "--http"], stdout=subprocess.PIPE, env=env, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        port = int(line.split()[1])
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "fixture HTTP server did not start"
                time.sleep(0.02)
        yield f"http://127.0.0.1:{port}/mcp", token, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


async def test_http_source_sends_header_from_env(http_server, monkeypatch):
    url, token, _ = http_server
    monkeypatch.setenv("TETHER_TEST_MCP_TOKEN", token)
    source = MCPSource("remote", url=url, headers={"X-Fixture-Token": "${TETHER_TEST_MCP_TOKEN}"})
    assert token not in repr(source)
    async with source:
        tools = _by_name(source)
        assert await tools["echo"].handler({"text": "over http"}) == {"result": "over http"}
        assert await tools["add"].handler({"a": 1, "b": 1}) == {"total": 2}
        assert all(token not in str(t.input_schema) for t in tools.values())


async def test_http_source_rejected_without_the_right_header(http_server, monkeypatch):
    url, _, _ = http_server
    monkeypatch.setenv("TETHER_TEST_MCP_TOKEN", "wrong")
    source = MCPSource("remote", url=url, headers={"X-Fixture-Token": "${TETHER_TEST_MCP_TOKEN}"})
    with pytest.raises(ToolError):
        await source.start()
    await source.close()

    monkeypatch.delenv("TETHER_TEST_MCP_TOKEN")
    source = MCPSource("remote", url=url, headers={"X-Fixture-Token": "${TETHER_TEST_MCP_TOKEN}"})
    with pytest.raises(ConfigError) as info:
        await source.start()
    assert "TETHER_TEST_MCP_TOKEN" in info.value.message
    await source.close()


async def test_http_upstream_gone_is_a_tool_error_not_a_hang(http_server, monkeypatch):
    url, token, proc = http_server
    monkeypatch.setenv("TETHER_TEST_MCP_TOKEN", token)
    async with MCPSource("remote", url=url, headers={"X-Fixture-Token": "${TETHER_TEST_MCP_TOKEN}"}) as source:
        echo = _by_name(source)["echo"]
        assert await echo.handler({"text": "up"}) == {"result": "up"}
        proc.kill()
        proc.wait()
        for _ in range(2):  # the in-flight connection, then a fresh connect attempt
            with pytest.raises(ToolError) as info:
                await asyncio.wait_for(echo.handler({"text": "down"}), 10)
            assert info.value.details["code"] in ("upstream_disconnected", "upstream_unavailable")


# --- clean shutdown ----------------------------------------------------------------


def test_interpreter_exit_is_clean(tag, tmp_path):
    """No 'Task was destroyed', unretrieved exceptions or tracebacks at exit."""
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio
            from tether._sources.mcp import MCPSource

            async def main():
                source = MCPSource("fx", command=[{PY!r}, {SERVER!r}], env={{"TETHER_TEST_TAG": {tag!r}}})
                await source.start()
                tools = {{t.name: t for t in source.tools()}}
                await tools["echo"].handler({{"text": "x"}})
                try:
                    await asyncio.wait_for(tools["hang"].handler({{}}), 0.2)
                except TimeoutError:
                    pass
                try:
                    await tools["crash"].handler({{"log": {str(tmp_path / "log")!r}}})
                except Exception as exc:
                    print("crash:", exc.details["code"])
                await tools["echo"].handler({{"text": "y"}})
                await source.close()
                print("done")

            asyncio.run(main())
            """
        )
    )
    result = subprocess.run(
        [PY, "-X", "dev", str(script)], capture_output=True, text=True, timeout=60, env={**os.environ}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["crash: upstream_disconnected", "done"]
    for marker in ("Task was destroyed", "never retrieved", "Exception ignored", "Traceback", "ResourceWarning"):
        assert marker not in result.stderr, result.stderr


async def test_an_answer_over_the_message_limit_ends_the_connection_not_the_host(tag, tmp_path):
    # The SDK's stdio reader joined every chunk to the partial line before it: a 60 MB answer
    # held the event loop (every run and request of the host) for 34 of 38 s, and no size was
    # too large. tether's reader scans each chunk once and ends a connection past 64 MiB.
    errlog = (tmp_path / "server.log").open("w")
    try:
        async with MCPSource("flood", command=[PY, FLOOD], env={"TETHER_TEST_TAG": tag}, call_timeout=900,
                             errlog=errlog) as source:
            tools = _by_name(source)
            whole = await tools["big"].handler({"mb": 24})
            assert whole == "y" * (24 << 20)  # a large answer under the limit arrives intact
            with pytest.raises(ToolError) as caught:
                await tools["big"].handler({"mb": 70})
            assert "lost after the call was sent" in caught.value.message
            assert await tools["ping"].handler({"mb": 0}) == "pong"  # a new connection serves the next call
    finally:
        errlog.close()
    assert "over 64 MiB" in (tmp_path / "server.log").read_text()
