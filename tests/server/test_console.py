"""The console and approval links in process (httpx over ASGI): tokens, sessions, CSRF, principals, the feed.

The browser tests (test_console_browser.py) drive the same pages in chromium
against a served process; these check the rules one by one, quickly.
"""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from tether import Policy, Runtime, tool
from tether._engine.approvals import APPROVE, RUN, Access, Grant
from tether._server.approvals import link_token, open_token
from tether._server.auth import principal_for_token
from tether._server.console import CAPABILITY_HOLDER, Console

sent: list[dict] = []


@tool(namespace="shop")
def refund(order_id: str, amount: float) -> dict:
    """Refund an order: sends money back to the customer."""
    sent.append({"order_id": order_id, "amount": amount})
    return {"refunded": amount}


PROGRAM = """import tools
try:
    out = await tools.shop.refund(order_id="A1", amount=12.5)
except Exception as e:
    out = "not sent: " + str(e)
out"""
ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789"
# A person who approves the agents' writes ([[server.tokens]] with rights = ["approve"], approves_for = ["*"]).
PAT = "pat-token-0123456789abc"


def access(*, self_approval: bool = False, links: str = "signed_in") -> Access:
    return Access.of([Grant(principal_for_token(ALICE), "alice", frozenset({RUN, APPROVE})),
                      Grant(principal_for_token(BOB), "bob", frozenset({RUN, APPROVE})),
                      Grant(principal_for_token(PAT), "pat", frozenset({APPROVE}), frozenset({"*"}))],
                     self_approval=self_approval, links=links)


def console_for(rt, **options) -> Console:
    return Console(rt, tokens=[ALICE, BOB, PAT], access=access(**options))


@pytest.fixture
async def rt():
    sent.clear()
    async with Runtime(tools=[refund]) as runtime:
        yield runtime


def client(console: Console) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app), base_url="http://127.0.0.1:8000")


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


async def sign_in(c: httpx.AsyncClient, token: str) -> httpx.Response:
    page = await c.get("/console/login")
    return await c.post("/console/login", data={"csrf": csrf_of(page.text), "token": token})


async def test_p33_a_link_token_altered_anywhere_by_one_character_opens_nothing():
    secret = b"k" * 32
    token = link_token(secret, "run_0123456789abcdef", 3, 1_900_000_000.0)
    claim = open_token(secret, token)
    assert (claim.run_id, claim.seq, claim.expires_at) == ("run_0123456789abcdef", 3, 1_900_000_000.0)
    for i, ch in enumerate(token):
        for other in {"A", "a", "0", "_", "."} - {ch}:
            assert open_token(secret, token[:i] + other + token[i + 1:]) is None, (i, other)
    assert open_token(b"x" * 32, token) is None  # another store's secret


async def test_signing_in_needs_one_of_the_servers_tokens_and_a_csrf_token(rt):
    console = Console(rt, tokens=[ALICE, BOB])
    async with client(console) as c:
        assert (await c.get("/console/")).headers["location"] == "/console/login"
        wrong = await sign_in(c, "nope")
        assert wrong.status_code == 401 and "not a token this server accepts" in wrong.text
        no_csrf = await c.post("/console/login", data={"token": ALICE})
        assert no_csrf.status_code == 403 and "tether_session" not in no_csrf.headers.get("set-cookie", "")
        ok = await sign_in(c, ALICE)
        assert ok.status_code == 303
        cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie
        assert (await c.get("/console/")).status_code == 200


async def test_a_session_ends_with_the_token_it_was_opened_with(rt):
    async with client(Console(rt, tokens=[ALICE])) as c:
        await sign_in(c, ALICE)
        cookies = c.cookies
    # The server restarted with another token: the old cookie opens nothing.
    async with client(Console(rt, tokens=[BOB])) as c:
        c.cookies = cookies
        assert (await c.get("/console/")).status_code == 303


async def test_a_principal_sees_and_decides_only_its_runs(rt):
    mine = await rt.execute(PROGRAM, principal=principal_for_token(ALICE))
    theirs = await rt.execute(PROGRAM, principal=principal_for_token(BOB))
    async with client(Console(rt, tokens=[ALICE, BOB])) as c:
        await sign_in(c, ALICE)
        listing = (await c.get("/console/")).text
        assert mine.run_id in listing and theirs.run_id not in listing
        page = await c.get(f"/console/runs/{theirs.run_id}")
        assert page.status_code == 404
        csrf = csrf_of((await c.get(f"/console/runs/{mine.run_id}")).text)
        refused = await c.post(f"/console/runs/{theirs.run_id}/decide",
                               data={"csrf": csrf, "seq": "1", "decision": "approve"})
        assert refused.status_code == 404 and "nothing was decided" in refused.text
    assert rt.store.get_run(theirs.run_id).status == "paused" and sent == []


async def test_every_decision_records_who_and_through_what(rt):
    paused = await rt.execute(PROGRAM, principal=principal_for_token(ALICE))
    async with client(console_for(rt)) as c:
        await sign_in(c, ALICE)
        csrf = csrf_of((await c.get(f"/console/runs/{paused.run_id}")).text)
        forged = await c.post(f"/console/runs/{paused.run_id}/decide",
                              data={"csrf": csrf[::-1], "seq": "1", "decision": "approve"})
        assert forged.status_code == 403 and rt.store.get_run(paused.run_id).status == "paused"
        done = await c.post(f"/console/runs/{paused.run_id}/decide",
                            data={"csrf": csrf, "seq": "1", "decision": "decline", "reason": "over the limit"})
        assert done.status_code == 303
        again = await c.post(f"/console/runs/{paused.run_id}/decide",
                             data={"csrf": csrf, "seq": "1", "decision": "approve"})
        assert again.status_code == 403 and "nothing was sent" in again.text
    result = await rt.engine.wait_for_run(paused.run_id)
    assert "over the limit" in result.result and sent == []
    decided = [e.data for e in rt.store.get_events(paused.run_id) if e.type == "decided"]
    # Who decided is the token's name with its kind (D-62), the person, never a channel.
    assert [(d["seq"], d["decision"], d["reason"], d["actor"], d["via"], d["origin"]) for d in decided] == [
        (1, "decline", "over the limit", "token “alice”", "console", "127.0.0.1")]


TWO_BATCHES = """import asyncio
import tools


async def one(order_id):
    try:
        return await tools.shop.refund(order_id=order_id, amount=1.0)
    except Exception as e:
        return "not sent: " + str(e)


first = await asyncio.gather(one("A1"), one("A2"))
second = await asyncio.gather(one("B1"), one("B2"))
[first, second]"""


async def test_p28_decide_all_covers_only_the_writes_the_page_showed(rt):
    alice = principal_for_token(ALICE)
    paused = await rt.execute(TWO_BATCHES, principal=alice)
    assert [w["seq"] for w in paused.pending["writes"]] == [1, 2]
    async with client(console_for(rt)) as c:
        await sign_in(c, PAT)  # a person who approves alice's runs
        page = (await c.get(f"/console/runs/{paused.run_id}")).text
        shown = re.search(r'name="shown" value="([^"]+)"', page).group(1)
        assert shown == "1,2"
        # Meanwhile someone else decides the shown batch and the run pauses on the next one.
        again = await rt.decide(paused.run_id, {1: "approve", 2: "approve"}, principal=alice)
        assert again.status == "paused" and [w["seq"] for w in again.pending["writes"]] == [3, 4]
        # The page's "approve all" repeats what was taken: accepted as every door accepts a repeat, it decides
        # nothing new (P-51); a "decline all" from it conflicts and is refused.
        stale = await c.post(f"/console/runs/{paused.run_id}/decide",
                             data={"csrf": csrf_of(page), "seq": "all", "shown": shown, "decision": "approve"})
        assert stale.status_code == 303
        assert [w.decision for w in rt.pending(paused.run_id, principal=alice)] == [None, None]
        conflict = await c.post(f"/console/runs/{paused.run_id}/decide",
                                data={"csrf": csrf_of(page), "seq": "all", "shown": shown, "decision": "decline"})
        assert conflict.status_code == 409 and "already decided: approve" in conflict.text
        assert "the decline changed nothing" in conflict.text
        assert [w.decision for w in rt.pending(paused.run_id, principal=alice)] == [None, None]
        no_list = await c.post(f"/console/runs/{paused.run_id}/decide",
                               data={"csrf": csrf_of(page), "seq": "all", "decision": "approve"})
        assert no_list.status_code == 400
        assert [w.decision for w in rt.pending(paused.run_id, principal=alice)] == [None, None]
        fresh = (await c.get(f"/console/runs/{paused.run_id}")).text
        assert re.search(r'name="shown" value="([^"]+)"', fresh).group(1) == "3,4"
        done = await c.post(f"/console/runs/{paused.run_id}/decide",
                            data={"csrf": csrf_of(fresh), "seq": "all", "shown": "3,4", "decision": "decline"})
        assert done.status_code == 303
    result = await rt.engine.wait_for_run(paused.run_id)
    assert result.result[0] == [{"refunded": 1.0}, {"refunded": 1.0}]
    assert all(r.startswith("not sent: ") for r in result.result[1])
    assert [s["order_id"] for s in sent] == ["A1", "A2"]


async def test_p33_an_approval_link_shows_its_write_and_decides_once_for_a_signed_in_approver(rt):
    paused = await rt.execute(PROGRAM, principal=principal_for_token(ALICE))
    token = link_token(rt.store.secret(), paused.run_id, 1, paused.expires_at)
    async with client(console_for(rt)) as c:
        page = await c.get(f"/approve/{token}")
        # Anyone holding the link sees the write; the form asks for a sign-in first.
        assert page.status_code == 200 and "sends money back to the customer" in page.text
        assert 'value="approve"' not in page.text and f"/console/login?next=/approve/{token}" in page.text
        unsigned = await c.post(f"/approve/{token}", data={"csrf": "x", "seq": "1", "decision": "approve"})
        assert unsigned.status_code == 403 and sent == []
        signed = await sign_in(c, PAT)
        assert signed.status_code == 303
        page = await c.get(f"/console/login?next=/approve/{token}")
        assert page.headers["location"] == f"/approve/{token}"
        page = await c.get(f"/approve/{token}")
        csrf = csrf_of(page.text)
        no_cookie = await httpx.AsyncClient(transport=httpx.ASGITransport(app=console_for(rt).app),
                                            base_url="http://127.0.0.1:8000").post(
            f"/approve/{token}", data={"csrf": csrf, "seq": "1", "decision": "approve"})
        assert no_cookie.status_code in (401, 403)
        other_seq = await c.post(f"/approve/{token}", data={"csrf": csrf, "seq": "2", "decision": "approve"})
        assert other_seq.status_code == 400
        ok = await c.post(f"/approve/{token}", data={"csrf": csrf, "seq": "1", "decision": "approve"})
        assert ok.status_code == 200 and "Approved call 1: sent." in ok.text
        # The same decision again is accepted as at every other door and changes nothing (P-51); the page
        # opened again says it was decided.
        twice = await c.post(f"/approve/{token}", data={"csrf": csrf, "seq": "1", "decision": "approve"})
        assert twice.status_code == 200 and "Approved call 1: sent." in twice.text
        assert (await c.get(f"/approve/{token}")).status_code == 409
        other = await c.post(f"/approve/{token}", data={"csrf": csrf, "seq": "1", "decision": "decline"})
        assert other.status_code == 409 and "already decided: approve" in other.text
    assert sent == [{"order_id": "A1", "amount": 12.5}]
    assert (await rt.engine.wait_for_run(paused.run_id)).result == {"refunded": 12.5}
    decided = [e.data for e in rt.store.get_events(paused.run_id) if e.type == "decided"]
    assert [(d["actor"], d["via"]) for d in decided] == [("token “pat”", "link")]


async def test_a_capability_link_decides_without_sign_in_only_when_configured_and_says_so(rt):
    paused = await rt.execute(PROGRAM, principal=principal_for_token(ALICE))
    token = link_token(rt.store.secret(), paused.run_id, 1, paused.expires_at)
    async with client(console_for(rt, links="capability")) as c:
        page = await c.get(f"/approve/{token}")
        assert 'value="approve"' in page.text
        ok = await c.post(f"/approve/{token}", data={"csrf": csrf_of(page.text), "seq": "1", "decision": "approve"})
        assert ok.status_code == 200 and "Approved call 1: sent." in ok.text
    decided = [e.data for e in rt.store.get_events(paused.run_id) if e.type == "decided"]
    assert [(d["actor"], d["via"]) for d in decided] == [(CAPABILITY_HOLDER, "link")]
    assert decided[0]["actor"] != "approval link"


async def test_p33_an_expired_link_decides_nothing(rt):
    paused = await rt.execute(PROGRAM)
    token = link_token(rt.store.secret(), paused.run_id, 1, rt.engine.clock() - 5)
    async with client(console_for(rt)) as c:
        page = await c.get(f"/approve/{token}")
        assert page.status_code == 410 and "expired" in page.text
        await sign_in(c, PAT)
        fresh = link_token(rt.store.secret(), paused.run_id, 1, paused.expires_at)
        csrf = csrf_of((await c.get(f"/approve/{fresh}")).text)
        late = await c.post(f"/approve/{token}", data={"csrf": csrf, "seq": "1", "decision": "approve"})
        assert late.status_code == 410
    assert rt.store.get_run(paused.run_id).status == "paused" and sent == []


async def test_the_feed_announces_a_pause_to_its_principal_only(rt, unused_port):
    import uvicorn

    console = Console(rt, tokens=[ALICE, BOB])
    # httpx's ASGI transport buffers whole bodies: an event stream needs a real server.
    server = uvicorn.Server(uvicorn.Config(console.app, host="127.0.0.1", port=unused_port, log_level="warning",
                                           lifespan="off"))
    serving = asyncio.ensure_future(server.serve())
    seen: list[dict] = []
    ready: list[str] = []

    async def listen(token: str) -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{unused_port}") as c:
            await sign_in(c, token)
            async with c.stream("GET", "/console/events") as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                async for line in response.aiter_lines():
                    if line.startswith("retry:"):
                        ready.append(token)
                    if line.startswith("data: "):
                        seen.append({"viewer": token, **json.loads(line[6:])})

    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.02)
    listeners = [asyncio.ensure_future(listen(t)) for t in (ALICE, BOB)]
    for _ in range(500):
        if len(ready) == 2 or any(t.done() for t in listeners):
            break
        await asyncio.sleep(0.02)
    assert len(ready) == 2, [t.exception() for t in listeners if t.done()]
    paused = await rt.execute(PROGRAM, principal=principal_for_token(ALICE))
    for _ in range(200):
        if any(s["run_id"] == paused.run_id and s["status"] == "paused" for s in seen):
            break
        await asyncio.sleep(0.05)
    for task in listeners:
        task.cancel()
    await asyncio.gather(*listeners, return_exceptions=True)
    server.should_exit = True
    await serving
    await console.close()
    assert {"viewer": ALICE, "run_id": paused.run_id, "status": "paused", "waits_on": "shop.refund"} in seen
    assert not [s for s in seen if s["viewer"] == BOB]


@pytest.fixture
def unused_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_over_tls_the_session_cookie_is_secure(rt):
    console = Console(rt, tokens=[ALICE], public_url="https://tether.example.com")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app),
                                 base_url="https://tether.example.com") as c:
        signed = await sign_in(c, ALICE)
    assert signed.status_code == 303 and "secure" in signed.headers["set-cookie"].lower()


async def test_runs_are_listed_by_status_and_principal(store_url):
    from tether._store import open_store

    async with Runtime(store=open_store(store_url), tools=[refund], local_runs="shared") as rt:
        mine = await rt.execute(PROGRAM, principal=principal_for_token(ALICE))
        local = await rt.execute(PROGRAM)
        done = await rt.execute("1", principal=principal_for_token(ALICE))
        async with client(Console(rt, tokens=[ALICE])) as c:
            await sign_in(c, ALICE)
            paused = (await c.get("/console/?status=paused")).text
            assert mine.run_id in paused and local.run_id in paused and done.run_id not in paused
            only_local = (await c.get("/console/?status=paused&principal=local")).text
            assert local.run_id in only_local and mine.run_id not in only_local


# -- console edges (P-33) ----------------------------------------------------------------------


async def raw(app, method: str, path: str, headers: dict[str, str], chunks: list[bytes] = ()) -> tuple[int, int]:
    """One request straight to the ASGI app: (status, body bytes the app pulled from the client)."""
    pulled = 0
    queue = list(chunks)
    status: list[int] = []

    async def receive():
        nonlocal pulled
        if queue:
            chunk = queue.pop(0)
            pulled += len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": bool(queue)}
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()], "scheme": "http",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5555), "http_version": "1.1",
             "root_path": ""}
    await app(scope, receive, send)
    return status[0], pulled


@pytest.mark.parametrize("tokens", [[ALICE], []], ids=["token", "dev"])
async def test_a_forged_host_reaches_no_console_page_in_any_mode(rt, tokens):
    # DNS rebinding: a web page under the attacker's name resolved to 127.0.0.1.
    paused = await rt.execute(PROGRAM)
    console = Console(rt, tokens=tokens, host="127.0.0.1")
    token = link_token(rt.store.secret(), paused.run_id, 1, paused.expires_at)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app),
                                 base_url="http://rebind.attacker.example:8000") as evil:
        for path in ("/console/login", "/console/", f"/approve/{token}"):
            assert (await evil.get(path)).status_code == 421, path
        posted = await evil.post(f"/approve/{token}", data={"seq": "1", "decision": "approve"})
        assert posted.status_code == 421 and posted.text == "Invalid Host header"
        signed = await evil.post("/console/login", data={"token": ALICE})
        assert signed.status_code == 421 and "set-cookie" not in signed.headers
    # The real names still work: loopback, and public_url's host.
    async with client(console) as c:
        assert (await c.get("/console/login")).status_code == 200
    public = Console(rt, tokens=tokens, host="127.0.0.1", public_url="https://tether.example.com")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=public.app),
                                 base_url="https://tether.example.com") as c:
        assert (await c.get("/console/login")).status_code == 200
    assert rt.store.get_run(paused.run_id).status == "paused" and sent == []


async def test_form_bodies_are_checked_before_they_are_read(rt):
    from tether._server.console import MAX_FORM_BYTES

    paused = await rt.execute(PROGRAM)
    console = Console(rt, tokens=[ALICE])
    token = link_token(rt.store.secret(), paused.run_id, 1, paused.expires_at)
    host = {"host": "127.0.0.1:8000"}
    form = {**host, "content-type": "application/x-www-form-urlencoded"}
    megabyte = [b"a" * 65536] * 16
    for path in ("/console/login", "/console/logout", f"/approve/{token}"):
        # Declared too large: refused before a byte is read.
        assert await raw(console.app, "POST", path, {**form, "content-length": str(2**28)}, megabyte) == (413, 0)
        # Not declared (chunked): read up to the cap and no further.
        status, pulled = await raw(console.app, "POST", path, form, megabyte)
        assert status == 413 and pulled <= MAX_FORM_BYTES + 65536, (path, pulled)
        # Not a form: refused unread.
        assert await raw(console.app, "POST", path, {**host, "content-type": "multipart/form-data; boundary=x"},
                         megabyte) == (415, 0)
        assert await raw(console.app, "POST", path, {**host, "content-type": "application/json"}, [b"{}"]) == (415, 0)
    assert rt.store.get_run(paused.run_id).status == "paused" and sent == []


async def test_a_cookie_reused_after_signing_out_opens_nothing_anywhere(store_url):
    from tether._store import open_store

    async with Runtime(store=open_store(store_url), tools=[refund]) as rt:
        paused = await rt.execute(PROGRAM, principal=principal_for_token(ALICE))
        async with client(Console(rt, tokens=[ALICE])) as c:
            await sign_in(c, ALICE)
            page = await c.get(f"/console/runs/{paused.run_id}")
            kept = dict(c.cookies)
            out = await c.post("/console/logout", data={"csrf": csrf_of(page.text)})
            assert out.status_code == 303
        # The same cookie, presented again, to this process and to another one on the same store.
        async with Runtime(store=open_store(store_url), tools=[refund]) as other:
            for console in (Console(rt, tokens=[ALICE]), Console(other, tokens=[ALICE])):
                async with client(console) as c:
                    c.cookies.update(kept)
                    assert (await c.get("/console/")).headers.get("location") == "/console/login"
                    decided = await c.post(f"/console/runs/{paused.run_id}/decide",
                                           data={"csrf": csrf_of(page.text), "seq": "1", "decision": "approve"})
                    assert decided.status_code == 303 and decided.headers["location"] == "/console/login"
            # Signing in again opens a new session.
            async with client(Console(other, tokens=[ALICE])) as c:
                await sign_in(c, ALICE)
                assert (await c.get("/console/")).status_code == 200
        assert rt.store.get_run(paused.run_id).status == "paused" and sent == []


async def test_another_principals_thousand_newest_runs_do_not_hide_yours(store_url):
    import dataclasses

    from tether._store import open_store

    async with Runtime(store=open_store(store_url), tools=[refund]) as rt:
        mine = await rt.execute(PROGRAM, principal=principal_for_token(ALICE))
        theirs = await rt.execute(PROGRAM, principal=principal_for_token(BOB))
        template = rt.store.get_run(theirs.run_id)
        for i in range(1000):  # newer than Alice's, paused, Bob's
            rt.store.create_run(dataclasses.replace(template, run_id=f"run_bob{i:06d}",
                                                    created_at=template.created_at + 1 + i))
        async with client(Console(rt, tokens=[ALICE, BOB])) as c:
            await sign_in(c, ALICE)
            for page in ("/console/", "/console/?status=paused"):
                listing = (await c.get(page)).text
                assert mine.run_id in listing and "run_bob" not in listing, page


async def test_d42_who_asked_is_the_configured_name_not_a_column_anyone_with_the_store_can_write(tmp_path):
    """A person approves a write partly on who asked: for a token the server names, that name comes from the
    configuration, never from the run's unsigned ``meta.principal_name`` (someone who can write the store but
    lacks the secret must not make alice's write look like the approver's own colleague's)."""
    import sqlite3

    from tether._store import open_store

    sent.clear()
    async with Runtime(store=open_store(f"sqlite:///{tmp_path}/t.db"), tools=[refund]) as rt:
        paused = await rt.execute(PROGRAM, principal=principal_for_token(ALICE))
        assert paused.status == "paused"
        with sqlite3.connect(tmp_path / "t.db") as db:
            db.execute("UPDATE runs SET meta = json_set(meta, '$.principal_name', 'the CFO') WHERE run_id = ?",
                       (paused.run_id,))
        async with client(console_for(rt)) as c:
            await sign_in(c, PAT)
            pages = [await c.get(f"/console/runs/{paused.run_id}"), await c.get("/console/")]
    for page in pages:
        assert page.status_code == 200
        assert "the CFO" not in page.text and "alice" in page.text


async def test_a_seq_past_any_column_is_refused_by_name_not_a_500(rt):
    """The seq of a console form is the caller's number: one too large for the store's column decides nothing
    and says so, as any seq the run does not wait on."""
    paused = await rt.execute(PROGRAM, principal=principal_for_token(ALICE))
    async with client(console_for(rt)) as c:
        await sign_in(c, PAT)
        page = await c.get(f"/console/runs/{paused.run_id}")
        for form in ({"seq": str(10**30)}, {"seq": "all", "shown": f"{paused.pending['seq']},{10**30}"}):
            r = await c.post(f"/console/runs/{paused.run_id}/decide",
                             data={"csrf": csrf_of(page.text), "decision": "approve", **form})
            assert r.status_code == 409 and "Nothing decided" in r.text, r.text[:300]
    assert sent == [] and rt.store.get_run(paused.run_id).status == "paused"


async def test_d62_an_idp_user_whose_name_is_a_tokens_name_is_not_shown_as_that_token(rt):
    """An access token's user named "pat" (no e-mail) asks for a write beside the token named "pat": where a
    person decides, "Asked by" says which is which, from the principal, whatever the name says."""
    mallory = "oauth:https://idp.example#mallory"
    runs = {}
    forged = "pat\u201d (token \u201cpat"
    for principal, name in ((mallory, "pat"), (mallory, forged), (principal_for_token(PAT), None)):
        meta = {"principal_name": name} if name else None
        paused = await rt.execute(PROGRAM, principal=principal, meta=meta)
        assert paused.status == "paused"
        runs[(principal, name)] = paused.run_id
    people = Access.of([*access().grants.values(), Grant(principal_for_token("op-token-0123456789"), "op",
                                                         frozenset({"operate"}))])
    async with client(Console(rt, tokens=[ALICE, BOB, PAT, "op-token-0123456789"], access=people)) as c:
        await sign_in(c, "op-token-0123456789")
        asked = {}
        for key, run_id in runs.items():
            page = (await c.get(f"/console/runs/{run_id}")).text
            asked[key] = re.search(r'<strong class="requester kind-([a-z-]+)">([^<]*)</strong>', page).groups()
    import html

    shown = {k: (kind, html.unescape(text)) for k, (kind, text) in asked.items()}
    assert shown[(mallory, "pat")] == ("oauth", "IdP user \u201cpat\u201d")
    assert shown[(principal_for_token(PAT), None)] == ("token", "token \u201cpat\u201d")
    # A name cannot close its quote and open a label of another kind.
    assert shown[(mallory, forged)] == ("oauth", "IdP user \u201cpat' (token 'pat\u201d")


@tool(namespace="shop", undo="shop.refund", undo_args={"order_id": "args.order_id", "amount": "args.amount"})
def charge(order_id: str, amount: float) -> dict:
    """Charge an order (undone by a refund)."""
    sent.append({"charge": order_id})
    return {"charged": amount}


async def test_p46_an_ended_runs_writes_are_undone_from_the_console_by_an_approver_only():
    sent.clear()
    async with Runtime(tools=[refund, charge], policy=Policy(writes="allow")) as rt:
        done = await rt.execute("import tools\nawait tools.shop.charge(order_id='A1', amount=3.0)\n",
                                principal=principal_for_token(ALICE))
        assert done.status == "completed"
        async with client(console_for(rt)) as c:
            await sign_in(c, ALICE)  # it ran the program: it may not undo its writes (an undo sends writes)
            page = await c.get(f"/console/runs/{done.run_id}")
            assert "Undo this run's writes" in page.text
            refused = await c.post(f"/console/runs/{done.run_id}/decide",
                                   data={"csrf": csrf_of(page.text), "seq": "run", "decision": "undo"})
            assert refused.status_code == 403 and "Nothing was undone" in refused.text
        async with client(console_for(rt)) as c:
            await sign_in(c, PAT)
            page = await c.get(f"/console/runs/{done.run_id}")
            undone = await c.post(f"/console/runs/{done.run_id}/decide",
                                  data={"csrf": csrf_of(page.text), "seq": "run", "decision": "undo",
                                        "reason": "charged twice"})
            assert undone.status_code == 303
            result = await rt.engine.wait_for_run(done.run_id)
            assert result.status == "rolled_back"
            page = await c.get(f"/console/runs/{done.run_id}")
            assert "undone by call 2" in page.text and "undone by #2" in page.text and "undoes #1" in page.text
            assert "Undo this run&#39;s writes" not in page.text and "Undo this run's writes" not in page.text
    assert sent == [{"charge": "A1"}, {"order_id": "A1", "amount": 3.0}]
    decided = [e.data for e in rt.store.get_events(done.run_id) if e.type == "decided"]
    assert [(d["decision"], d["reason"], d["actor"], d["via"]) for d in decided] == [
        ("undo", "charged twice", "token \u201cpat\u201d", "console")]
