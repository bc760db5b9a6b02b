"""One identity per request (P-23) and the health endpoints, on the real ASGI stack in-process.

The middleware under test is the one ``tether serve --http`` runs; the app
behind it answers with the principal it was handed, so each case shows which
identity a request would act as. tests/server/test_server_auth.py repeats the attacks
with raw sockets against a real server.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tether._server.auth import (
    LOCAL,
    SCOPE_KEY,
    BearerAuth,
    HealthRoutes,
    bearer_token,
    principal_for_token,
)
from tether._server.credentials import CredentialProblem
from tether._server.start import check_http_auth
from tether.errors import UnsafeBind, UsageError

GOOD, OTHER = "good-token-0123456789", "other-token-0123456789"


async def whoami(scope, receive, send):
    body = json.dumps({"principal": scope.get(SCOPE_KEY)}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def always_ready() -> bool:
    return True


def client(tokens=(GOOD, OTHER), ready=always_ready) -> httpx.AsyncClient:
    app = HealthRoutes(BearerAuth(whoami, tokens), ready)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tether.test")


async def ask(headers: list[tuple[str, str]], **kw) -> httpx.Response:
    async with client(**kw) as http:
        return await http.post("/mcp", headers=httpx.Headers(headers), content=b"{}")


# Each pair of Authorization headers that once let the caller pick another principal.
DUPLICATES = [
    [("Authorization", "Basic eA=="), ("Authorization", f"Bearer {GOOD}")],
    [("Authorization", f"Bearer {GOOD}"), ("Authorization", "Basic eA==")],
    [("Authorization", "Bearer anything-at-all"), ("Authorization", f"Bearer {GOOD}")],
    [("Authorization", f"Bearer {GOOD}"), ("Authorization", "Bearer anything-at-all")],
    [("Authorization", f"Bearer {GOOD}"), ("Authorization", f"Bearer {OTHER}")],
    [("Authorization", f"Bearer {OTHER}"), ("Authorization", f"Bearer {GOOD}")],
    [("Authorization", f"Bearer {GOOD}"), ("Authorization", f"Bearer {GOOD}")],
    [("authorization", "Basic eA=="), ("AUTHORIZATION", f"Bearer {GOOD}")],
    [("AuThOrIzAtIoN", f"Bearer {GOOD}"), ("authorization", "Bearer x")],
]


@pytest.mark.parametrize("headers", DUPLICATES, ids=range(len(DUPLICATES)))
async def test_p23_two_authorization_headers_are_refused_in_either_order(headers):
    r = await ask(headers)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "ambiguous_credentials"
    assert "exactly one" in r.json()["error"]["next_action"]


MALFORMED = [
    f"Bearer {GOOD}, Bearer {OTHER}",   # what a proxy makes of two headers
    f"Bearer {GOOD},Basic eA==",
    f"Bearer {GOOD} {OTHER}",
    "Bearer ",
    f"Bearer\t{GOOD}",
]


@pytest.mark.parametrize("value", MALFORMED)
async def test_p23_a_malformed_authorization_header_is_refused(value):
    r = await ask([("Authorization", value)])
    assert r.status_code in (400, 401)
    assert r.json()["error"]["code"] in ("malformed_credentials", "missing_token")
    assert r.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("value", ["Basic eA==", "Digest x", "Token " + GOOD, GOOD])
async def test_p23_another_scheme_is_no_credential(value):
    r = await ask([("Authorization", value)])
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_token"


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
@pytest.mark.parametrize("name", ["Authorization", "authorization", "AUTHORIZATION"])
async def test_p23_the_principal_is_the_verified_token_whatever_the_case(scheme, name):
    r = await ask([(name, f"{scheme} {GOOD}"), ("X-Principal", "local")])
    assert r.status_code == 200
    assert r.json()["principal"] == principal_for_token(GOOD) != principal_for_token(OTHER)


async def test_p23_an_unknown_token_is_refused_and_never_becomes_a_principal():
    r = await ask([("Authorization", "Bearer not-a-token-of-this-server")])
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_token"
    r = await ask([])
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_token"


async def test_without_tokens_every_request_is_local():
    r = await ask([("Authorization", f"Bearer {GOOD}")], tokens=())
    assert r.json()["principal"] == LOCAL


def test_bearer_token_reads_raw_headers():
    assert bearer_token([(b"authorization", f"Bearer {GOOD}".encode())]) == GOOD
    with pytest.raises(CredentialProblem) as err:
        bearer_token([(b"authorization", b"Bearer \xff\xfe")])
    assert err.value.status == 400 and err.value.code == "malformed_credentials"


# -- tokens at start -----------------------------------------------------------------


def test_short_tokens_are_refused_unless_dev():
    with pytest.raises(UsageError) as err:
        check_http_auth("127.0.0.1", ("x",), dev=False)
    assert err.value.code == "token_too_short" and "'x'" not in err.value.message
    with pytest.raises(UsageError) as err:
        check_http_auth("127.0.0.1", (GOOD, "short-token"), dev=False)
    assert err.value.code == "token_too_short" and "11" in err.value.message
    check_http_auth("127.0.0.1", ("x",), dev=True)  # a warning on stderr, not a refusal
    check_http_auth("127.0.0.1", (GOOD,), dev=False)


def test_a_refusal_names_the_setting_that_dropped_the_token_not_a_flag_never_passed():
    with pytest.raises(UnsafeBind) as raised:
        check_http_auth("0.0.0.0", (), dev=True, dev_by="[server] allow_unauthenticated_loopback")
    assert raised.value.message.startswith("[server] allow_unauthenticated_loopback serves without a token")
    assert "--dev" not in raised.value.message + raised.value.next_action


def test_a_token_that_cannot_be_sent_as_one_credential_is_refused():
    with pytest.raises(UsageError) as err:
        check_http_auth("127.0.0.1", ("has space inside 0123456789",), dev=False)
    assert err.value.code == "token_invalid"


# -- health (P-23) ----------------------------------------------------------------------


async def test_healthz_answers_without_a_token_and_says_nothing_else():
    async with client() as http:
        r = await http.get("/healthz")
        head = await http.head("/healthz")
        post = await http.post("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert head.status_code == 200
    assert post.status_code == 405
    assert r.headers["cache-control"] == "no-store"


async def test_readyz_asks_the_store():
    async with client() as http:
        r = await http.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready"}

    async def broken() -> bool:
        raise RuntimeError("connection refused by db.internal:5432 password=hunter2")

    async with client(ready=broken) as http:
        r = await http.get("/readyz")
    assert r.status_code == 503 and r.json() == {"status": "unavailable"}
    assert "hunter2" not in r.text and "db.internal" not in r.text


async def test_other_paths_still_need_the_token():
    async with client() as http:
        r = await http.get("/healthz/../mcp")
        s = await http.get("/healthzz")
    assert r.status_code == 401 and s.status_code == 401


async def test_p23_a_websocket_is_refused_not_passed_through():
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "websocket.connect"}

    scope = {"type": "websocket", "path": "/mcp", "headers": [(b"authorization", f"Bearer {GOOD}".encode())]}
    await BearerAuth(app, (GOOD,))(scope, receive, send)
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]
    await BearerAuth(app, (GOOD,))({"type": "lifespan"}, receive, send)
    assert reached == ["lifespan"]
