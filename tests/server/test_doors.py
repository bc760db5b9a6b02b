"""Every door of ``tether serve --http`` against the rights of every kind of principal (P-44).

One real server and one real identity provider (tests/idp) serve the module.
Principals: static tokens (``[[server.tokens]]``), access tokens the IdP
issues for a client (scopes), and people who sign in to the console at the IdP
(rights from their groups). Each has every right but one, in turn, or only
``operate``. Each door is tried by each: a door its rights do not open refuses
(403, or no console session) before anything else happens; a door they open
lets the request through to what lies behind it (which may then say, for
instance, that the run does not exist for this caller).

``DOORS`` below is docs/security.md's table "Doors and rights", written out
here rather than imported, so the server is checked against the table people
read.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from tests.idp.run import IdP, log_in, start_idp
from tests.server.test_server_http import LEDGER_TOOLS, stop_server

from helpers import free_port

pytestmark = pytest.mark.slow

RIGHTS = ("run", "approve", "metrics")
# docs/security.md, "Doors and rights": the rights that open each door (any one of them; operate opens all;
# none: every principal the server knows, shown only the runs it may see).
DOORS: dict[str, set[str]] = {
    "mcp:execute": {"run"}, "mcp:resume": {"run"}, "mcp:cell_start": {"run"}, "mcp:cell_wait": {"run"},
    "mcp:cell_terminate": {"run"},
    "metrics": {"metrics"},
    "console:runs": set(), "console:run": set(), "console:events": set(),
    "console:decline": set(), "console:approve": {"approve"},
    "link:decline": set(), "link:approve": {"approve"},
}
# Every right but one, in turn; and operate alone; and metrics alone (a scrape job's token).
RIGHT_SETS = {f"no-{r}": sorted(set(RIGHTS) - {r}) for r in RIGHTS} | {"operate": ["operate"],
                                                                       "metrics-only": ["metrics"]}
KINDS = ("token", "idp-token", "idp-person")
CONSOLE_SECRET = "console-secret-" + "z" * 32
CC_SECRET = "agent-secret-" + "w" * 32
# A second server's resource: [auth] alone, no static token.
ONLY_AUTH_PORT = free_port()
ONLY_AUTH = f"http://127.0.0.1:{ONLY_AUTH_PORT}/mcp"


def token_of(name: str) -> str:
    return f"{name}-token-0123456789abcdef"


def config(base: str, issuer: str) -> str:
    tokens = "".join(f'\n[[server.tokens]]\nname = "{n}"\ntoken_env = "T_{n.upper().replace("-", "_")}"\n'
                     f"rights = {json.dumps(r)}\napproves_for = [\"*\"]\n" for n, r in RIGHT_SETS.items())
    claims = "".join(f'\n[auth.rights.{r}]\nclaim = "groups"\nvalues = ["{r}"]\n' for r in (*RIGHTS, "operate"))
    return f"""[server]
public_url = "{base}"
{tokens}
[auth]
issuer = "{issuer}"
console_client_id = "tether-console"
console_client_secret_env = "CONSOLE_SECRET"
{claims}
[[policy.rules]]
match = "ledger.write"
action = "allow"
"""


class Served:
    def __init__(self, base: str, idp: IdP, root: Path) -> None:
        self.base, self.idp, self.root = base, idp, root
        self.proc: subprocess.Popen | None = None
        self.sessions: dict[str, httpx.Client] = {}

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "TETHER_STORE_URL")}
        env.update(TETHER_HOME=str(self.root / "home"), LEDGER=str(self.root / "ledger.txt"),
                   CONSOLE_SECRET=CONSOLE_SECRET)
        env.update({f"T_{n.upper().replace('-', '_')}": token_of(n) for n in RIGHT_SETS})
        return env

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tether.cli", "--config", str(self.root / "tether.toml"),
                               *args], env=self.env(), capture_output=True, text=True, timeout=120)


def start(s: "Served", port: int, text: str) -> None:
    """``tether serve --http`` on ``port`` with ``text`` as its config, listening when this returns."""
    s.root.mkdir(parents=True, exist_ok=True)
    (s.root / "ledger_tools.py").write_text(LEDGER_TOOLS)
    (s.root / "tether.toml").write_text(text)
    log = s.root / "server.log"
    with open(log, "wb") as err:
        s.proc = subprocess.Popen(
            [sys.executable, "-m", "tether.cli", "--config", str(s.root / "tether.toml"), "serve", "--http",
             f"127.0.0.1:{port}", "--tools", str(s.root / "ledger_tools.py")],
            env=s.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 60
    while True:
        assert s.proc.poll() is None, log.read_text()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(s.base + "/healthz", timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            stop_server(s.proc)
            raise AssertionError(log.read_text())
        time.sleep(0.1)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("doors")
    store = ""
    if request.param == "postgres":
        # A database of the module's own in the throwaway cluster: the server and `tether run` share it.
        import psycopg

        url = request.getfixturevalue("pg_url")
        name = f"doors_{os.getpid()}_{int(time.time())}"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        store = f'[store]\nurl = "{url.replace("/postgres?", f"/{name}?", 1)}"\n\n'
        assert name in store
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    users = {name: {"name": f"Person {name}", "email": f"{name}@example.test", "groups": rights}
             for name, rights in RIGHT_SETS.items()}
    clients = [{"client_id": "agent-cc", "client_secret": CC_SECRET, "grant_types": ["client_credentials"],
                "redirect_uris": [], "response_types": []},
               {"client_id": "tether-console", "client_secret": CONSOLE_SECRET,
                "grant_types": ["authorization_code"], "redirect_uris": [f"{base}/console/oidc/callback"],
                "response_types": ["code"]}]
    idp = start_idp(root / "idp", resources=[base + "/mcp", ONLY_AUTH], clients=clients, users=users)
    s = Served(base, idp, root / "tether")
    try:
        start(s, port, store + config(base, idp.issuer))
        yield s
    finally:
        for c in s.sessions.values():
            c.close()
        if s.proc is not None:
            stop_server(s.proc)
        idp.stop()


# -- who knocks ----------------------------------------------------------------------


def bearer(served: Served, kind: str, name: str) -> str:
    if kind == "token":
        return token_of(name)
    scope = " ".join(f"tether:{r}" for r in RIGHT_SETS[name])
    return served.idp.client_token(served.base + "/mcp", scope)["access_token"]


def console(served: Served, kind: str, name: str) -> httpx.Client:
    """A browser signed in to the console as this principal (token form, or the IdP's own pages)."""
    key = f"{kind}/{name}"
    if key in served.sessions:
        return served.sessions[key]
    c = httpx.Client(base_url=served.base, follow_redirects=False, timeout=30)
    if kind == "idp-person":
        start = c.get("/console/oidc/start")
        assert start.status_code == 303, start.text
        back = log_in(start.headers["location"], name)
        landed = urlsplit(back)
        done = c.get(landed.path + "?" + landed.query)
        assert done.status_code == 200, done.text
    else:
        page = c.get("/console/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        c.post("/console/login", data={"csrf": csrf, "token": bearer(served, kind, name)})
    served.sessions[key] = c
    return c


# -- the doors -----------------------------------------------------------------------

MCP_ARGS = {"execute": {"code": "1 + 1"}, "resume": {"run_id": "run_0000000000000000", "decision": "decline"},
            "cell_start": {"code": "1 + 1", "yield_after_ms": 60_000}, "cell_wait": {"cell_id": "run_0000000000000000", "timeout_ms": 0},
            "cell_terminate": {"cell_id": "run_0000000000000000"}}


def knock(served: Served, door: str, kind: str, name: str) -> tuple[bool, str]:
    """Whether ``door`` let this principal through, and what it answered (for the failure message)."""
    area, _, what = door.partition(":")
    if area == "mcp":
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": what, "arguments": MCP_ARGS[what],
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {},
                      "io.modelcontextprotocol/clientInfo": {"name": "doors", "version": "0"}}}}
        r = httpx.post(served.base + "/mcp", json=body, timeout=60, headers={
            "Authorization": f"Bearer {bearer(served, 'token' if kind == 'token' else 'idp-token', name)}",
            "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call", "Mcp-Name": what})
        if r.status_code == 403:
            assert r.json()["error"]["code"] == "insufficient_scope" and "tether:run" in r.headers["www-authenticate"]
            return False, r.text
        assert r.status_code == 200, r.text
        if what in ("execute", "cell_start"):  # let through, the program ran (a cell may still be running)
            status = r.json()["result"]["structuredContent"]["status"]
            assert status == "completed" or (what == "cell_start" and status == "running"), r.text
        return True, r.text
    if area == "metrics":
        token = bearer(served, "token" if kind == "token" else "idp-token", name)
        r = httpx.get(served.base + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert r.status_code in (200, 403), r.text
        return r.status_code == 200 and "tether_" in r.text, r.text[:200]
    c = console(served, "token" if kind == "token" else "idp-person", name)
    if door == "console:runs":
        r = c.get("/console/")
        return r.status_code == 200, r.text[:200]
    if door == "console:run":
        r = c.get("/console/runs/run_0000000000000000")
        assert r.status_code in (303, 404), r.text[:200]
        return r.status_code == 404, r.text[:200]  # let in, and told there is no such run for it
    if door == "console:events":
        with c.stream("GET", "/console/events") as r:
            return r.status_code == 200, str(r.status_code)
    csrf_page = c.get("/console/")
    found = re.search(r'name="csrf" value="([^"]+)"', csrf_page.text)
    csrf = found.group(1) if found else "none"
    form = {"csrf": csrf, "decision": what, "seq": "1"}
    path = "/console/runs/run_0000000000000000/decide" if area == "console" else "/approve/not-a-link"
    r = c.post(path, data=form)
    if r.status_code == 403:
        assert "Nothing was decided" in r.text and "lacks the right" in r.text, r.text
        return False, r.text[:200]
    # Let through: what lies behind says there is no such run or link (or, signed out, sends to sign-in).
    assert r.status_code in (303, 404), r.text[:300]
    return r.status_code == 404, r.text[:200]


CASES = [pytest.param(door, kind, name, id=f"{door}-{kind}-{name}")
         for door in DOORS for kind in KINDS for name in RIGHT_SETS
         # An IdP person has no bearer token (it signs in to the console); an IdP token no console session.
         if not (kind == "idp-person" and door.split(":")[0] in ("mcp", "metrics"))
         and not (kind == "idp-token" and door.split(":")[0] in ("console", "link"))]


@pytest.mark.parametrize(("door", "kind", "name"), CASES)
def test_p44_each_door_opens_to_the_rights_it_names_and_to_no_other(served, door, kind, name):
    rights = set(RIGHT_SETS[name])
    expected = "operate" in rights or not DOORS[door] or bool(rights & DOORS[door])
    admitted, answer = knock(served, door, kind, name)
    assert admitted == expected, (door, kind, name, answer)


# -- the findings, one by one ------------------------------------------------------------------


def test_p44_a_token_with_only_approve_runs_nothing_and_approves_nothing_of_its_own(served):
    """An approver's token leaked to an agent is not an agent: no program runs, nothing is written."""
    for kind in ("token", "idp-token"):
        token = bearer(served, kind, "no-run")
        r = httpx.post(served.base + "/mcp", headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"},
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {"form": {}}},
                "clientInfo": {"name": "leaked", "version": "1"}}}, timeout=30)
        assert r.status_code == 403, (kind, r.text)
    assert not (served.root / "ledger.txt").exists() or "leaked" not in (served.root / "ledger.txt").read_text()


def test_p44_metrics_is_never_open_while_authentication_is_configured(served):
    assert httpx.get(served.base + "/metrics", timeout=30).status_code == 401
    for bad in ("not-a-token-of-this-server-0000", token_of("no-metrics")):
        assert httpx.get(served.base + "/metrics", headers={"Authorization": f"Bearer {bad}"},
                         timeout=30).status_code in (401, 403)


def test_p44_local_runs_stay_the_operators_whatever_approves_for_says(served):
    """A run started with ``tether run`` pauses at a write; approvers for everyone, tokens and IdP people alike,
    neither list it, open it, follow it nor decide it (local_runs = "private", the default)."""
    program = served.root / "local.py"
    program.write_text("import tools\nawait tools.ledger.guarded_write(tag='local-secret')\n")
    out = served.cli("run", str(program), "--tools", str(served.root / "ledger_tools.py"), "--json")
    run = json.loads(out.stdout)
    assert run["status"] == "paused", out.stdout + out.stderr
    for kind in ("token", "idp-person"):
        c = console(served, kind, "no-metrics")  # run and approve, approves_for = ["*"] / every IdP approver
        listing = c.get("/console/")
        assert listing.status_code == 200 and run["run_id"] not in listing.text, kind
        assert c.get(f"/console/runs/{run['run_id']}").status_code == 404, kind
        page = c.get("/console/")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        r = c.post(f"/console/runs/{run['run_id']}/decide", data={"csrf": csrf, "decision": "approve", "seq": "1"})
        assert r.status_code == 404, (kind, r.text[:300])
    # operate is the operator's right: it sees the run (as the CLI on the store does).
    assert console(served, "token", "operate").get(f"/console/runs/{run['run_id']}").status_code == 200
    assert "local-secret" not in ((served.root / "ledger.txt").read_text()
                                  if (served.root / "ledger.txt").exists() else "")
    # The operator, on the store, decides it.
    assert "declined" in served.cli("resume", run["run_id"], "--decline").stderr


def test_d62_the_console_names_a_person_from_the_idp_and_a_token_by_their_kind(served):
    """Who is signed in is shown with its kind: an IdP user's name never reads as a configured token's."""
    assert "IdP user \u201cPerson" in console(served, "idp-person", "no-approve").get("/console/").text
    assert "token \u201cno-approve\u201d" in console(served, "token", "no-approve").get("/console/").text


def test_p44_metrics_is_not_open_when_only_an_identity_provider_is_configured(served, tmp_path):
    """[auth] and no static token: /metrics answers 401 without a token, 403 to an access token without the
    metrics right, and 200 to one with it."""
    only = Served(ONLY_AUTH.removesuffix("/mcp"), served.idp, tmp_path / "only-auth")
    text = f"""[server]\npublic_url = "{only.base}"\n\n[auth]\nissuer = "{served.idp.issuer}"\n"""
    start(only, ONLY_AUTH_PORT, text)
    try:
        assert httpx.get(only.base + "/metrics", timeout=30).status_code == 401
        assert httpx.get(only.base + "/mcp", timeout=30).status_code == 401
        for scope, status in (("tether:run tether:approve", 403), ("tether:metrics", 200), ("tether:operate", 200)):
            token = served.idp.client_token(ONLY_AUTH, scope)["access_token"]
            r = httpx.get(only.base + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
            assert r.status_code == status, (scope, r.text[:300])
    finally:
        assert only.proc is not None
        stop_server(only.proc)


def test_d62_a_client_acting_for_itself_is_not_a_user_of_the_same_name(served):
    """Client credentials: the client id is the subject, in the clients' own namespace."""
    import asyncio

    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    token = bearer(served, "idp-token", "no-approve")

    async def run() -> dict:
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
            async with Client(streamable_http_client(served.base + "/mcp", http_client=http), mode="legacy") as c:
                return (await c.call_tool("execute", {"code": "1"})).structured_content

    out = asyncio.run(run())
    shown = json.loads(served.cli("runs", "show", out["run_id"], "--json").stdout)
    assert shown["principal"] == f"oauth-client:{served.idp.issuer}#agent-cc"


@pytest.mark.parametrize("typ", ["logout+jwt", "secevent+jwt", "dpop+jwt", "id_token+jwt"])
def test_d62_a_jwt_of_another_type_signed_by_the_idp_is_not_an_access_token(served, typ):
    import jwt

    now = int(time.time())
    claims = {"iss": served.idp.issuer, "sub": "no-approve", "aud": served.base + "/mcp", "iat": now,
              "exp": now + 300, "scope": "tether:run"}
    token = jwt.encode(claims, served.idp.key, algorithm="RS256", headers={"kid": served.idp.kid, "typ": typ})
    r = httpx.post(served.base + "/mcp", headers={"Authorization": f"Bearer {token}",
                                                   "Accept": "application/json, text/event-stream"},
                   json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                       "protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_token", r.text
    # The same claims as an access token are accepted: only the type differs.
    good = jwt.encode(claims, served.idp.key, algorithm="RS256", headers={"kid": served.idp.kid, "typ": "at+jwt"})
    assert httpx.post(served.base + "/mcp", headers={"Authorization": f"Bearer {good}",
                                                      "Accept": "application/json, text/event-stream"},
                      json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                          "protocolVersion": "2025-11-25", "capabilities": {},
                          "clientInfo": {"name": "t", "version": "1"}}}, timeout=30).status_code == 200


def test_d62_unknown_opaque_tokens_are_asked_about_once_and_never_more_than_eight_at_a_time(served):
    """Introspection at the real IdP, through a forwarder that counts: a refused token is refused again without
    asking for a minute, and a flood of distinct made-up tokens never has more than 8 questions in flight."""
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tether._server.credentials import CredentialProblem
    from tether._server.oauth import MAX_INTROSPECTIONS, ResourceServer

    idp = served.idp
    discovery = httpx.get(idp.issuer + "/.well-known/openid-configuration").json()
    seen = {"calls": 0, "in_flight": 0, "most": 0}
    lock = threading.Lock()

    class Forward(BaseHTTPRequestHandler):
        def do_POST(self):
            with lock:
                seen["calls"] += 1
                seen["in_flight"] += 1
                seen["most"] = max(seen["most"], seen["in_flight"])
            try:
                body = self.rfile.read(int(self.headers["content-length"]))
                time.sleep(0.05)  # long enough for a flood to pile up behind the bound
                r = httpx.post(discovery["introspection_endpoint"], content=body, timeout=30, headers={
                    "content-type": self.headers["content-type"], "authorization": self.headers["authorization"]})
            finally:
                with lock:
                    seen["in_flight"] -= 1
            self.send_response(r.status_code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(r.content)))
            self.end_headers()
            self.wfile.write(r.content)

        def log_message(self, *args):
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    resource = ResourceServer(issuer=idp.issuer, audience=served.base + "/mcp", jwks_url=discovery["jwks_uri"],
                              algorithms=["RS256"], leeway=30,
                              introspection_url=f"http://127.0.0.1:{http.server_port}/introspect",
                              client_id="agent-cc", client_secret=CC_SECRET, discovery=discovery)

    async def refused(token: str) -> str:
        with pytest.raises(CredentialProblem) as problem:
            await resource.identify(token)
        return problem.value.code

    async def scenario() -> None:
        for _ in range(20):
            assert await refused("made-up-opaque-token-0123456789") == "invalid_token"
        assert seen["calls"] == 1
        codes = await asyncio.gather(*(refused(f"flood-{i}-0123456789abcdef") for i in range(40)))
        assert set(codes) == {"invalid_token"} and seen["calls"] == 41
        assert seen["most"] <= MAX_INTROSPECTIONS

    try:
        asyncio.run(scenario())
    finally:
        http.shutdown()


def test_d60_over_mcp_operate_reaches_only_its_own_runs(served):
    """MCP is the agent's door: an operate token there acts on its own runs; other principals' runs are the
    console's and the CLI's to act on (docs/mcp.md says so)."""
    def call(token: str, name: str, arguments: dict) -> dict:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": name, "arguments": arguments,
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {},
                      "io.modelcontextprotocol/clientInfo": {"name": "doors", "version": "0"}}}}
        r = httpx.post(served.base + "/mcp", json=body, timeout=60, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": name})
        assert r.status_code == 200, r.text
        return r.json()["result"]["structuredContent"]

    paused = call(token_of("no-approve"), "execute",
                  {"code": "import tools\nawait tools.ledger.guarded_write(tag='others')"})
    assert paused["status"] == "paused", paused
    other = call(token_of("operate"), "resume", {"run_id": paused["run_id"], "decision": "cancel"})
    assert other["error"]["code"] == "run_not_found", other
    # The console, signed in with the same operate token, does reach it.
    assert console(served, "token", "operate").get(f"/console/runs/{paused['run_id']}").status_code == 200
    assert call(token_of("no-approve"), "resume", {"run_id": paused["run_id"], "decision": "cancel"})["status"] \
        == "cancelled"
