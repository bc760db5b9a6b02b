"""Auth and health against a real ``tether serve --http``, with raw sockets (P-23).

Raw sockets, because an HTTP client library may merge, reorder or refuse the
very headers these tests send.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from test_server_http import ALPHA, BETA, connect, start_server, stop_server
from tether._server.auth import principal_for_token

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("auth"), token=f"{ALPHA},{BETA}")
    try:
        yield s
    finally:
        stop_server(s.proc)
    assert s.proc.returncode == 0, s.log.read_text()


def raw(served, method: str, path: str, headers: list[str], body: dict | None = None) -> tuple[int, dict, str]:
    """One HTTP/1.1 exchange with exactly these header lines; (status, JSON body or {}, raw head)."""
    host, port = served.url.split("//")[1].split("/")[0].split(":")
    data = json.dumps(body).encode() if body is not None else b""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
             "Accept: application/json, text/event-stream", "Content-Type: application/json",
             "MCP-Protocol-Version: 2026-07-28", f"Content-Length: {len(data)}", *headers]
    if body is not None:  # the modern era repeats the method and tool name as headers
        lines += [f"Mcp-Method: {body['method']}", f"Mcp-Name: {body['params']['name']}"]
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    head, _, payload = b"".join(chunks).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    try:
        parsed = json.loads(payload) if payload else {}
    except ValueError:
        parsed = {}
    return status, parsed, head.decode("latin-1")


def resume_call(run_id: str, seq: int = 1, decision: str = "approve") -> dict:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "resume", "arguments": {"run_id": run_id, "decision": decision, "seq": seq},
                       "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                 "io.modelcontextprotocol/clientCapabilities": {},
                                 "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"}}}}


async def test_p23_duplicate_authorization_headers_never_reach_a_run(served):
    tag = "dup-victim"
    async with connect(served.url, ALPHA, "auto") as alice:
        paused = (await alice.call_tool(
            "execute", {"code": f"import tools\nawait tools.ledger.guarded_write(tag='{tag}')"})).structured_content
    assert paused["status"] == "paused"
    attacks = [
        ["Authorization: Basic eA==", f"Authorization: Bearer {BETA}"],
        [f"Authorization: Bearer {BETA}", "Authorization: Basic eA=="],
        [f"Authorization: Bearer {principal_for_token(ALPHA)}", f"Authorization: Bearer {BETA}"],
        [f"Authorization: Bearer {BETA}", f"Authorization: Bearer {ALPHA}"],
        [f"Authorization: Bearer {ALPHA}", f"Authorization: Bearer {BETA}"],
        [f"authorization: Bearer {BETA}", f"AUTHORIZATION: Bearer {ALPHA}"],
        [f"Authorization: Bearer {BETA}, Bearer {ALPHA}"],
        [f"Authorization: Bearer {BETA} {ALPHA}"],
    ]
    for headers in attacks:
        status, body, head = raw(served, "POST", "/mcp", headers, resume_call(paused["run_id"]))
        assert status in (400, 401), (headers, status, body)
        assert body["error"]["code"] in ("ambiguous_credentials", "malformed_credentials"), headers
        assert "www-authenticate: bearer" in head.lower()
    store = served.store()
    try:
        assert store.get_run(paused["run_id"]).status == "paused"
    finally:
        store.close()
    assert tag not in served.tags()
    # The only door left is the owner's own single token, and it declines or cancels:
    # approving is a person's, elsewhere (D-31).
    status, body, _ = raw(served, "POST", "/mcp", [f"authorization: bearer {BETA}"], resume_call(paused["run_id"]))
    assert status == 200 and body["result"]["structuredContent"]["error"]["code"] == "run_not_found"
    status, body, _ = raw(served, "POST", "/mcp", [f"Authorization: Bearer {ALPHA}"], resume_call(paused["run_id"]))
    assert status == 200 and body["result"]["structuredContent"]["error"]["code"] == "approval_elsewhere"
    status, body, _ = raw(served, "POST", "/mcp", [f"Authorization: Bearer {ALPHA}"],
                          resume_call(paused["run_id"], decision="cancel"))
    assert status == 200 and body["result"]["structuredContent"]["status"] == "cancelled"
    assert tag not in served.tags()


def test_healthz_and_readyz_answer_without_a_token(served):
    for path, expected in (("/healthz", {"status": "ok"}), ("/readyz", {"status": "ready"})):
        status, body, _ = raw(served, "GET", path, [])
        assert (status, body) == (200, expected)  # a status, and nothing about the deployment
    status, body, _ = raw(served, "GET", "/mcp", [])
    assert status == 401


def test_a_short_token_refuses_to_start_unless_dev(tmp_path):
    (tmp_path / "tether.toml").write_text("")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TETHER_TOKEN"}
    env.update(TETHER_HOME=str(tmp_path / "home"), TETHER_TOKEN="x")
    done = subprocess.run([sys.executable, "-m", "tether.cli", "--config", str(tmp_path / "tether.toml"),
                           "serve", "--http", "127.0.0.1:1"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "[token_too_short]" in done.stderr and "next:" in done.stderr and "'x'" not in done.stderr


# -- owners (P-24) -------------------------------------------------------------------------


def cli(served, *args: str) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "TETHER_STORE_URL")}
    env.update(TETHER_HOME=str(served.home), LEDGER=str(served.ledger))
    root = served.home.parent
    return subprocess.run([sys.executable, "-m", "tether.cli", "--config", str(root / "tether.toml"), *args],
                          env=env, capture_output=True, text=True, timeout=120)


async def test_p24_a_token_cannot_touch_a_run_started_from_the_cli(served):
    root = served.home.parent
    program = root / "local_write.py"
    program.write_text("import tools\nawait tools.ledger.guarded_write(tag='cli-owned')")
    done = cli(served, "run", str(program), "--tools", str(root / "ledger_tools.py"), "--no-prompt", "--json")
    assert done.returncode == 3, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    for token in (ALPHA, BETA):
        status, body, _ = raw(served, "POST", "/mcp", [f"Authorization: Bearer {token}"], resume_call(run_id))
        assert status == 200 and body["result"]["structuredContent"]["error"]["code"] == "run_not_found"
    assert "cli-owned" not in served.tags()
    # The CLI's own user decides it.
    done = cli(served, "resume", run_id, "--approve", "--json")
    assert done.returncode == 0, done.stderr
    assert served.tags().count("cli-owned") == 1


async def test_p24_the_cli_decides_only_local_runs_but_may_cancel_any(served):
    async with connect(served.url, ALPHA, "auto") as alice:
        paused = (await alice.call_tool(
            "execute", {"code": "import tools\nawait tools.ledger.guarded_write(tag='token-owned')"})).structured_content
    done = cli(served, "resume", paused["run_id"], "--approve")
    assert done.returncode == 2 and "run_not_found" in done.stderr
    done = cli(served, "runs", "cancel", paused["run_id"], "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "cancelled"
    assert "token-owned" not in served.tags()


async def test_p23_a_legacy_session_is_usable_only_with_the_token_that_opened_it(served):
    import httpx

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "raw", "version": "0"}}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
               "MCP-Protocol-Version": "2025-11-25"}
    async with httpx.AsyncClient(timeout=10) as http:
        opened = await http.post(served.url, json=init, headers={**headers, "Authorization": f"Bearer {ALPHA}"})
        session = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        for token, expected in ((BETA, 404), (ALPHA, 200)):
            r = await http.post(served.url, json=listing, headers={
                **headers, "Authorization": f"Bearer {token}", "Mcp-Session-Id": session})
            assert r.status_code == expected, (token, r.status_code, r.text)
        # The stream a legacy server asks its approval forms on is the session's too.
        async with http.stream("GET", served.url, headers={
                "Accept": "text/event-stream", "Authorization": f"Bearer {BETA}", "Mcp-Session-Id": session}) as r:
            assert r.status_code == 404
        r = await http.post(served.url, json=listing, headers=httpx.Headers([
            *headers.items(), ("Authorization", f"Bearer {ALPHA}"), ("Mcp-Session-Id", session),
            ("Mcp-Session-Id", "another")]))
        assert r.status_code == 400 and r.json()["error"]["code"] == "ambiguous_credentials"
        # The token was fine: the next action is about the session header, not a token to send.
        assert "Mcp-Session-Id" in r.json()["error"]["next_action"], r.json()
        assert "Authorization" not in r.json()["error"]["next_action"], r.json()
