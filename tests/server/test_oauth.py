"""tether as an OAuth 2.1 resource server, against a real identity provider (npm oidc-provider, tests/idp).

One IdP and one ``tether serve --http`` with an ``[auth]`` section serve the
module. Access tokens come from the IdP itself: through the official MCP SDK
client's OAuth flow (discovery from tether's Protected Resource Metadata,
dynamic registration, PKCE, the IdP's own sign-in pages), or from its token
endpoint (client credentials). Tokens the IdP would never issue (expired, a
foreign key, alg none) are signed here with the IdP's own key or another.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from tests.idp.run import IdP, log_in, new_key, start_idp
from tests.server.test_server_http import LEDGER_TOOLS, stop_server

from helpers import free_port

pytestmark = pytest.mark.slow

STATIC = "static-token-0123456789abcdef"
CONSOLE_SECRET = "console-secret-" + "x" * 32


class Served:
    def __init__(self, proc, base: str, idp: IdP, root: Path) -> None:
        self.proc, self.base, self.idp, self.root = proc, base, idp, root
        self.mcp = base + "/mcp"

    def show(self, run_id: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "tether.cli", "--config", str(self.root / "tether.toml"),
                              "runs", "show", run_id, "--json"], env=self.env(), capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "TETHER_STORE_URL")}
        env.update(TETHER_HOME=str(self.root / "home"), LEDGER=str(self.root / "ledger.txt"),
                   CONSOLE_SECRET=CONSOLE_SECRET, TETHER_TOKEN=STATIC)
        return env


def config_text(base: str, issuer: str) -> str:
    return f"""\
[server]
public_url = "{base}"

[auth]
issuer = "{issuer}"
console_client_id = "tether-console"
console_client_secret_env = "CONSOLE_SECRET"

[auth.rights.approve]
claim = "groups"
values = ["approvers"]

[[policy.rules]]
match = "ledger.write"
action = "allow"
"""


def start(root: Path, idp: IdP, port: int) -> Served:
    root.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{port}"
    (root / "ledger_tools.py").write_text(LEDGER_TOOLS)
    (root / "tether.toml").write_text(config_text(base, idp.issuer))
    served = Served(None, base, idp, root)
    log = root / "server.log"
    with open(log, "wb") as err:
        served.proc = subprocess.Popen(
            [sys.executable, "-m", "tether.cli", "--config", str(root / "tether.toml"), "serve",
             "--http", f"127.0.0.1:{port}", "--tools", str(root / "ledger_tools.py")],
            env=served.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 60
    while True:
        if served.proc.poll() is not None:
            raise AssertionError(f"server exited {served.proc.returncode}: {log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                break
        if time.monotonic() > deadline:
            stop_server(served.proc)
            raise AssertionError(f"server did not listen: {log.read_text()}")
        time.sleep(0.1)
    return served


def idp_clients(base: str) -> list[dict]:
    return [
        {"client_id": "agent-cc", "client_secret": "agent-secret-" + "y" * 32, "grant_types": ["client_credentials"],
         "redirect_uris": [], "response_types": []},
        {"client_id": "tether-console", "client_secret": CONSOLE_SECRET, "grant_types": ["authorization_code"],
         "redirect_uris": [f"{base}/console/oidc/callback"], "response_types": ["code"]},
    ]


OTHER_RESOURCE = "http://127.0.0.1:1/elsewhere"
OPAQUE_RESOURCE = "http://127.0.0.1:1/opaque"
OTHER_OPAQUE = "http://127.0.0.1:1/opaque-other/opaque"


@contextlib.contextmanager
def serving(root: Path):
    """A real IdP and a ``tether serve --http`` that trusts it."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    idp = start_idp(root / "idp", resources=[base + "/mcp", OTHER_RESOURCE, OPAQUE_RESOURCE, OTHER_OPAQUE],
                    clients=idp_clients(base))
    try:
        s = start(root / "tether", idp, port)
        try:
            yield s
        finally:
            stop_server(s.proc)
    finally:
        idp.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("oauth")) as s:
        yield s


class Memory:
    """The SDK client's token storage, in memory (one per simulated client application)."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, info):
        self.client = info


def oauth_for(url: str, user: str, storage: Memory) -> OAuthClientProvider:
    """The SDK's OAuth client; its browser step is ``user`` signing in on the IdP's own pages."""
    landed: dict[str, str] = {}

    async def redirect(authorization_url: str) -> None:
        import anyio

        landed["url"] = await anyio.to_thread.run_sync(log_in, authorization_url, user)

    async def callback() -> AuthorizationCodeResult:
        query = parse_qs(urlsplit(landed["url"]).query)
        return AuthorizationCodeResult(code=query["code"][0], state=query.get("state", [None])[0],
                                       iss=query.get("iss", [None])[0])

    metadata = OAuthClientMetadata(client_name="an MCP client", redirect_uris=["http://127.0.0.1:9/callback"],
                                   grant_types=["authorization_code", "refresh_token"], response_types=["code"],
                                   token_endpoint_auth_method="none")
    return OAuthClientProvider(url, metadata, storage, redirect_handler=redirect, callback_handler=callback)


@contextlib.asynccontextmanager
async def connect(url: str, *, auth=None, token: str | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with create_mcp_http_client(headers=headers, auth=auth) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            yield client


async def execute(client, code: str) -> dict:
    result = await client.call_tool("execute", {"code": code})
    assert not result.is_error, result.content
    return result.structured_content


# -- metadata and challenges ----------------------------------------------------------


def test_protected_resource_metadata_names_the_idp_and_the_scopes(served):
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        r = httpx.get(served.base + path)
        assert r.status_code == 200, (path, r.text)
        data = r.json()
        assert data["resource"] == served.mcp
        assert data["authorization_servers"] == [served.idp.issuer] or \
            [a.rstrip("/") for a in data["authorization_servers"]] == [served.idp.issuer]
        assert {"tether:run", "tether:approve", "tether:operate"} <= set(data["scopes_supported"])


def post_mcp(served, token: str | None) -> httpx.Response:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(served.mcp, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})


def test_a_request_without_a_token_is_told_where_to_get_one(served):
    r = post_mcp(served, None)
    assert r.status_code == 401
    challenge = r.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert f'resource_metadata="{served.base}/.well-known/oauth-protected-resource/mcp"' in challenge


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def claims_for(served, **over) -> dict:
    now = int(time.time())
    return {"iss": served.idp.issuer, "sub": "alice", "aud": served.mcp, "iat": now, "exp": now + 300,
            "scope": "tether:run", "client_id": "agent-cc", **over}


@pytest.mark.parametrize("case", ["another_audience", "expired", "unknown_key", "alg_none", "another_issuer",
                                  "hs256_with_the_public_key", "hostile_header"])
def test_tokens_that_are_not_for_tether_are_refused_with_invalid_token(served, case):
    idp = served.idp
    if case == "another_audience":
        # A real token from the IdP, for another resource server.
        token = idp.client_token(OTHER_RESOURCE, "tether:run")["access_token"]
    elif case == "expired":
        now = int(time.time())
        token = idp.sign(claims_for(served, iat=now - 3600, exp=now - 600))
    elif case == "unknown_key":
        key, _ = new_key("not-the-idps")
        token = idp.sign(claims_for(served), key=key, kid="not-the-idps")
    elif case == "another_issuer":
        token = idp.sign(claims_for(served, iss="http://127.0.0.1:2/evil"))
    elif case == "hs256_with_the_public_key":
        # The classic confusion: an HMAC keyed with the IdP's public key, which anyone has.
        public = idp.key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
        segments = [json.dumps({"alg": "HS256", "kid": idp.kid}), json.dumps(claims_for(served))]
        signing = ".".join(b64(x.encode()) for x in segments)
        mac = hmac.new(public, signing.encode(), hashlib.sha256).digest()
        token = signing + "." + b64(mac)
    elif case == "hostile_header":
        header = json.dumps({"alg": "RS256\r\nSet-Cookie: x=1 \u00e9\"", "kid": idp.kid})
        token = ".".join(b64(x.encode()) for x in (header, json.dumps(claims_for(served)), "sig"))
    else:
        token = idp.sign(claims_for(served), alg="none")
    r = post_mcp(served, token)
    assert r.status_code == 401, r.text
    challenge = r.headers["www-authenticate"]
    assert 'error="invalid_token"' in challenge and "resource_metadata=" in challenge, challenge
    assert challenge.isascii() and "\r" not in challenge and "set-cookie" not in r.headers
    assert r.json()["error"]["code"] == "invalid_token"


def test_a_token_without_tether_run_is_403_insufficient_scope_naming_it(served):
    token = served.idp.client_token(served.mcp, "tether:approve")["access_token"]
    r = post_mcp(served, token)
    assert r.status_code == 403, r.text
    challenge = r.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="tether:run"' in challenge, challenge
    assert "resource_metadata=" in challenge


def test_a_real_idp_token_with_tether_run_is_accepted(served):
    token = served.idp.client_token(served.mcp, "tether:run")["access_token"]
    assert post_mcp(served, token).status_code == 200


def test_static_tokens_keep_working_beside_oauth(served):
    assert post_mcp(served, STATIC).status_code == 200
    assert post_mcp(served, "static-token-but-wrong-0000").status_code == 401


# -- the MCP SDK client's OAuth flow ------------------------------------------------------


async def test_the_sdk_client_signs_in_at_the_idp_and_runs_a_program(served):
    storage = Memory()
    async with connect(served.mcp, auth=oauth_for(served.mcp, "alice", storage)) as client:
        out = await execute(client, "import tools\nawait tools.ledger.write(tag='from-oauth')\n'done'")
    assert out["status"] == "completed", out
    assert storage.tokens is not None and storage.client is not None  # registered itself, then got a token
    shown = served.show(out["run_id"])
    assert shown["principal"] == f"oauth:{served.idp.issuer}#alice"
    assert shown["principal_name"] == "Alice Agent-Owner <alice@example.test>"


async def test_the_principal_is_the_same_across_two_access_tokens_of_one_user(served):
    runs, tokens = [], []
    for _ in range(2):
        storage = Memory()  # a fresh client application: its own registration, sign-in and token
        async with connect(served.mcp, auth=oauth_for(served.mcp, "alice", storage)) as client:
            runs.append((await execute(client, "1 + 1"))["run_id"])
        tokens.append(storage.tokens.access_token)
    assert tokens[0] != tokens[1]
    principals = {served.show(r)["principal"] for r in runs}
    assert principals == {f"oauth:{served.idp.issuer}#alice"}
    # So the second token acts on a run the first one started (another principal would get run_not_found).
    async with connect(served.mcp, token=tokens[0]) as client:
        paused = await execute(client, "import tools\nawait tools.ledger.guarded_write(tag='never')")
    assert paused["status"] == "paused", paused
    async with connect(served.mcp, token=tokens[1]) as client:
        result = await client.call_tool("resume", {"run_id": paused["run_id"], "decision": "decline"})
    # The decline was taken: the run went on and its program saw the write refused.
    assert "write_declined" in result.content[0].text and "run_not_found" not in result.content[0].text
    # The timeline names the person the token stands for.
    decided = served.show(paused["run_id"])["decisions"]
    assert [(d["decision"], d["actor"], d["via"]) for d in decided] == \
        [("decline", "IdP user “Alice Agent-Owner <alice@example.test>”", "mcp")]


# -- opaque tokens: introspection --------------------------------------------------------


def test_an_opaque_token_is_checked_by_introspection(served):
    import asyncio

    from tether._server.credentials import CredentialProblem
    from tether._server.oauth import ResourceServer

    idp = served.idp
    discovery = httpx.get(idp.issuer + "/.well-known/openid-configuration").json()
    cc = idp.clients["agent-cc"]
    resource = ResourceServer(issuer=idp.issuer, audience=OPAQUE_RESOURCE, jwks_url=discovery["jwks_uri"],
                              algorithms=["RS256"], leeway=30, introspection_url=discovery["introspection_endpoint"],
                              client_id=cc["client_id"], client_secret=cc["client_secret"], discovery=discovery)
    token = idp.client_token(OPAQUE_RESOURCE, "tether:run tether:approve")["access_token"]
    assert token.count(".") != 2  # really opaque
    who = asyncio.run(resource.identify(token))
    assert who.principal == f"oauth-client:{idp.issuer}#agent-cc" and who.rights == {"run", "approve"}
    # The same check through the MCP SDK's TokenVerifier shape, for embeddings that use the SDK's middleware.
    checked = asyncio.run(resource.verify_token(token))
    assert checked is not None and checked.subject == "agent-cc" and checked.resource == OPAQUE_RESOURCE
    assert asyncio.run(resource.verify_token("not-a-token-the-idp-issued-0123456789")) is None
    # Active at the IdP, but issued for another resource: not a token for this one.
    other = idp.client_token(OTHER_OPAQUE, "tether:run")
    for refused_token in (other["access_token"], "not-a-token-the-idp-issued-0123456789"):
        with pytest.raises(CredentialProblem) as refused:
            asyncio.run(resource.identify(refused_token))
        assert refused.value.code == "invalid_token"


# -- start-up checks --------------------------------------------------------------------


def test_serve_refuses_an_auth_section_it_cannot_use_and_names_the_field(served, tmp_path):
    idp = served.idp
    cases = [
        (f'issuer = "http://127.0.0.1:{free_port()}"\naudience = "{served.mcp}"', "[auth] issuer"),
        (f'issuer = "{idp.issuer}"\naudience = "{served.mcp}"\njwks_url = "{idp.issuer}/no-keys-here"',
         "[auth] jwks_url"),
        (f'issuer = "{idp.issuer}"\naudience = "{served.mcp}"\nconsole_client_id = "c"\n'
         'console_client_secret_env = "UNSET_SECRET_FOR_TEST"', "console_client_secret_env"),
        (f'issuer = "{idp.issuer}"', "[auth] has no audience"),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "UNSET_SECRET_FOR_TEST")}
    env["TETHER_HOME"] = str(tmp_path / "home")
    for body, named in cases:
        (tmp_path / "tether.toml").write_text(f"[auth]\n{body}\n")
        done = subprocess.run([sys.executable, "-m", "tether.cli", "--config", str(tmp_path / "tether.toml"),
                               "serve", "--http", f"127.0.0.1:{free_port()}"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, (body, done.stderr)
        assert named in done.stderr and "nothing was started" in done.stderr and "next:" in done.stderr, done.stderr


# -- key rotation --------------------------------------------------------------------------


def public(jwk: dict) -> dict:
    return {k: v for k, v in jwk.items() if k not in ("d", "p", "q", "dp", "dq", "qi")}


def test_a_rotated_key_is_picked_up_and_made_up_key_ids_do_not_flood_the_idp():
    """The JWKS is served over real HTTP and changed under the server, as an IdP rotating its key does."""
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import jwt

    from tether._server.credentials import CredentialProblem
    from tether._server.oauth import ResourceServer

    old_key, old_jwk = new_key("2026-old")
    new_key_, new_jwk = new_key("2026-new")
    # What an IdP publishes: the public halves (a private key slipped in is ignored, below).
    private_too = dict(new_jwk, kid="2026-private")
    old_jwk, new_jwk = (public(j) for j in (old_jwk, new_jwk))
    published = {"keys": [old_jwk, private_too]}
    fetches = []

    class Jwks(BaseHTTPRequestHandler):
        def do_GET(self):
            fetches.append(self.path)
            body = json.dumps(published).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    issuer, audience = "http://issuer.test", "http://tether.test/mcp"
    resource = ResourceServer(issuer=issuer, audience=audience, jwks_url=f"http://127.0.0.1:{http.server_port}/jwks",
                              algorithms=["RS256"], leeway=0)

    def token(key, kid):
        now = int(time.time())
        return jwt.encode({"iss": issuer, "aud": audience, "sub": "alice", "iat": now, "exp": now + 60,
                           "scope": "tether:run"}, key, algorithm="RS256", headers={"kid": kid})

    async def scenario():
        await resource.refresh_keys()
        assert (await resource.identify(token(old_key, "2026-old"))).subject == "alice"
        with pytest.raises(CredentialProblem):
            await resource.identify(token(new_key_, "2026-private"))
        published["keys"] = [new_jwk]  # the IdP rotates
        # Within 30 s of the last fetch an unknown kid is refused without asking the IdP again,
        # however many arrive.
        for _ in range(20):
            with pytest.raises(CredentialProblem):
                await resource.identify(token(new_key_, "2026-new"))
        assert len(fetches) == 1
        resource._fetched_at -= 31  # half a minute later
        assert (await resource.identify(token(new_key_, "2026-new"))).subject == "alice"
        assert len(fetches) == 2
        # The withdrawn key no longer verifies.
        with pytest.raises(CredentialProblem):
            await resource.identify(token(old_key, "2026-old"))

    try:
        asyncio.run(scenario())
    finally:
        http.shutdown()


# -- console sign-in: the parts a browser test does not show ----------------------------------


def test_console_sign_in_leaves_for_the_idp_with_pkce_and_refuses_an_answer_it_did_not_ask_for(served):
    with httpx.Client(follow_redirects=False) as browser:
        assert 'id="oidc"' in browser.get(served.base + "/console/login").text
        r = browser.get(served.base + "/console/oidc/start", params={"next": "/console/runs/x"})
        assert r.status_code == 303
        sent = parse_qs(urlsplit(r.headers["location"]).query)
        assert r.headers["location"].startswith(served.idp.issuer + "/auth?")
        assert sent["code_challenge_method"] == ["S256"] and len(sent["code_challenge"][0]) >= 43
        assert sent["response_type"] == ["code"] and sent["client_id"] == ["tether-console"]
        assert sent["state"][0] and sent["nonce"][0] and "openid" in sent["scope"][0].split()
        flow = browser.cookies.get("tether_oidc")
        assert flow
        # An answer with another state (a login CSRF, or a code stolen from elsewhere) signs nobody in.
        r = browser.get(served.base + "/console/oidc/callback", params={"code": "stolen", "state": "other"})
        assert r.status_code == 401 and "does not belong to this sign-in" in r.text
        assert "tether_session" not in r.headers.get("set-cookie", "")
    # Without the flow cookie (another browser), or with one altered by a character, nobody is signed in.
    for cookie in (None, flow[:-1] + ("0" if flow[-1] != "0" else "1")):
        cookies = {"tether_oidc": cookie} if cookie else {}
        r = httpx.get(served.base + "/console/oidc/callback", params={"code": "x", "state": sent["state"][0]},
                      cookies=cookies)
        assert r.status_code == 401 and "another browser" in r.text
        assert "tether_session" not in r.headers.get("set-cookie", "")
