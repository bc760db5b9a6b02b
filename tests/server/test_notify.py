"""[[notify]] webhooks: signed events from a durable outbox, retried, never in a run's way.

The receiver is a real HTTP server (uvicorn, in this process); its requests
are checked with the verification snippet from docs/notifications.md, run as
written.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tether import Runtime, tool
from tether._app import open_runtime
from tether._config import Config
from tether._server.notify import MAX_ATTEMPTS, Notifier, Webhook, backoff, verify

SECRET = "whsec-test-0123456789"
DOCS = Path(__file__).resolve().parent.parent.parent / "docs" / "notifications.md"


def doc_verifier():
    """The snippet from docs/notifications.md, executed as a reader would copy it."""
    code = re.search(r"## Verifying a request.*?```python\n(.*?)```", DOCS.read_text(), re.S).group(1)
    scope: dict = {}
    exec(compile(code, str(DOCS), "exec"), scope)
    return scope["verify_tether_webhook"]


class Receiver:
    """A webhook endpoint: answers with ``statuses`` in turn (then 200), or holds requests until released."""

    def __init__(self, statuses: list[int] | None = None, hold: bool = False) -> None:
        self.statuses = list(statuses or [])
        self.requests: list[tuple[dict, bytes]] = []
        self.release = asyncio.Event()
        if not hold:
            self.release.set()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        app = Starlette(routes=[Route("/hook", self.hook, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))

    async def hook(self, request: Request) -> Response:
        body = await request.body()
        self.requests.append((dict(request.headers), body))
        await self.release.wait()
        return Response(status_code=self.statuses.pop(0) if self.statuses else 200)

    async def __aenter__(self) -> "Receiver":
        self.task = asyncio.ensure_future(self.server.serve())
        while not self.server.started:
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc) -> None:
        self.release.set()
        self.server.should_exit = True
        await self.task

    async def wait_for(self, n: int, timeout: float = 20.0) -> None:
        for _ in range(int(timeout / 0.02)):
            if len(self.requests) >= n:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{len(self.requests)} requests, wanted {n}")


TOOLS = '''
from tether._sources.python import tool

TETHER_NAMESPACE = "shop"


@tool
def refund(order_id: str) -> str:
    """Refund an order."""
    return "refunded " + order_id


@tool(read_only=True)
def order(order_id: str) -> dict:
    """Look an order up."""
    return {"id": order_id}
'''


async def test_a_pause_is_posted_signed_with_its_approval_link(tmp_path, monkeypatch):
    (tmp_path / "shop_tools.py").write_text(TOOLS)
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    verify_doc = doc_verifier()
    async with Receiver() as hook:
        config = Config.from_dict({"server": {"public_url": "https://tether.example.com"},
                                   "notify": [{"url": hook.url, "secret_env": "HOOK_SECRET"}]},
                                  env={"TETHER_HOME": str(tmp_path / "home")})
        async with open_runtime(config, tools=[str(tmp_path / "shop_tools.py")],
                                store_url=f"sqlite:///{tmp_path}/t.db") as rt:
            paused = await rt.execute("import tools\nawait tools.shop.refund(order_id='A1')")
            assert paused.status == "paused"
            await hook.wait_for(1)
            headers, body = hook.requests[0]
            event = verify_doc(SECRET.encode(), headers["tether-signature"], body)
            assert event is not None and event["type"] == "run.paused" == headers["tether-event"]
            assert event["run"]["run_id"] == paused.run_id and headers["tether-event-id"] == event["id"]
            [write] = event["pending"]
            assert write["seq"] == 1 and write["address"] == "shop.refund"
            assert write["approval_url"].startswith("https://tether.example.com/approve/a1.")
            assert event["console_url"] == f"https://tether.example.com/console/runs/{paused.run_id}"
            # The same request again is a replay; altered, it is a forgery.
            assert verify_doc(SECRET.encode(), headers["tether-signature"], body) is None
            assert verify_doc(SECRET.encode(), headers["tether-signature"], body.replace(b"A", b"B")) is None
            assert verify_doc(b"another secret", headers["tether-signature"], body) is None

            done = await rt.resume(paused.run_id, "approve")
            assert done.status == "completed"
            await hook.wait_for(2)
            assert json.loads(hook.requests[1][1])["type"] == "run.completed"
            failed = await rt.execute("1 / 0")
            assert failed.status == "failed"
            await hook.wait_for(3)
            event = json.loads(hook.requests[2][1])
            assert event["type"] == "run.failed" and event["error"]["code"] == "program_error"
            assert len(hook.requests) == 3


@tool(namespace="shop")
def refund(order_id: str) -> str:
    """Refund an order."""
    return "refunded " + order_id


async def test_p34_a_failing_webhook_is_retried_with_backoff_until_it_answers(tmp_path):
    async with Receiver(statuses=[500, 503]) as hook, Runtime(tools=[refund]) as rt:
        notifier = Notifier(rt, [Webhook(hook.url, SECRET.encode(), frozenset({"completed"}))],
                            backoff_base=0.05, poll_seconds=0.02)
        rt.engine.events.listeners.append(notifier)
        delivering = asyncio.ensure_future(notifier.run())
        try:
            result = await rt.execute("6 * 7")
            assert result.status == "completed"
            await hook.wait_for(3)
            for _ in range(100):
                rows = rt.store.list_outbox()
                if rows[0].status == "delivered":
                    break
                await asyncio.sleep(0.02)
        finally:
            delivering.cancel()
        [row] = rt.store.list_outbox()
        assert (row.status, row.attempts, row.last_error) == ("delivered", 3, "HTTP 503")
        assert [h["tether-delivery-attempt"] for h, _ in hook.requests] == ["1", "2", "3"]
        assert len({h["tether-event-id"] for h, _ in hook.requests}) == 1
        assert all(verify(SECRET.encode(), h["tether-signature"], b.decode()) for h, b in hook.requests)


async def test_p34_a_slow_webhook_never_delays_a_run():
    async with Receiver(hold=True) as hook, Runtime(tools=[refund]) as rt:
        notifier = Notifier(rt, [Webhook(hook.url, SECRET.encode(), frozenset({"paused", "completed"}))],
                            poll_seconds=0.02)
        rt.engine.events.listeners.append(notifier)
        delivering = asyncio.ensure_future(notifier.run())
        try:
            paused = await rt.execute("import tools\nawait tools.shop.refund(order_id='A1')")
            await hook.wait_for(1)
            # The webhook holds its first request open; the run goes on regardless.
            done = await rt.resume(paused.run_id, "approve")
            assert done.status == "completed" and done.result == "refunded A1"
            assert not hook.release.is_set()
            # Nor does it hold up the queueing of the run's next event (D-81): the first request is still open.
            for _ in range(250):
                if len(rt.store.list_outbox()) == 2:
                    break
                await asyncio.sleep(0.02)
            assert [r.status for r in rt.store.list_outbox()] == ["pending", "pending"]
            assert not hook.release.is_set() and len(hook.requests) == 1
            hook.release.set()
            await hook.wait_for(2)
        finally:
            delivering.cancel()


async def test_p34_the_outbox_outlives_the_process_that_queued_it(store_url):
    async with Receiver() as hook:
        from tether._store import open_store

        # A process queues the event and stops before delivering it.
        async with Runtime(store=open_store(store_url), tools=[refund]) as first:
            queued = Notifier(first, [Webhook(hook.url, SECRET.encode(), frozenset({"completed"}))])
            first.engine.events.listeners.append(queued)
            assert (await first.execute("'done'")).status == "completed"
            assert await queued.queue_hinted() == 1
        assert hook.requests == []
        # The next one delivers it.
        async with Runtime(store=open_store(store_url), tools=[refund]) as second:
            notifier = Notifier(second, [Webhook(hook.url, SECRET.encode(), frozenset({"completed"}))])
            import httpx

            async with httpx.AsyncClient() as http:
                assert await notifier.deliver_due(http) == 1
                assert await notifier.deliver_due(http) == 0
        assert len(hook.requests) == 1 and json.loads(hook.requests[0][1])["type"] == "run.completed"


async def test_p34_a_process_that_ends_right_after_its_run_still_sends_its_events(tmp_path, monkeypatch):
    """`tether run` with [[notify]] closes as soon as its run pauses or ends; it sends what it queued on the way
    out, or a CLI-only user never hears of a pause (docs/notifications.md, "Delivery")."""
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    async with Receiver() as hook:
        config = Config.from_dict({"notify": [{"url": hook.url, "secret_env": "HOOK_SECRET"}]},
                                  env={"TETHER_HOME": str(tmp_path / "home")})
        async with open_runtime(config, store_url=f"sqlite:///{tmp_path}/t.db") as rt:
            assert (await rt.execute("1 / 0")).status == "failed"
        # Closed without waiting for anything: the event went out as the runtime closed.
        assert [json.loads(body)["type"] for _, body in hook.requests] == ["run.failed"]
        from tether._store import open_store

        assert [r.status for r in open_store(f"sqlite:///{tmp_path}/t.db").list_outbox()] == ["delivered"]


def test_backoff_doubles_and_is_capped():
    assert 0.8 <= backoff(1) <= 1.2 and 1.6 <= backoff(2) <= 2.4
    assert backoff(40) <= 3600 * 1.2
    assert sum(min(2 ** (n - 1), 3600) for n in range(1, MAX_ATTEMPTS)) > 3 * 3600


@pytest.mark.parametrize("header", ["", "t=abc,v1=00", "v1=00", "t=1"])
def test_a_malformed_signature_is_not_genuine(header):
    assert not verify(SECRET.encode(), header, "{}")


def test_a_webhook_without_its_secret_is_off_and_says_so(capsys):
    config = Config.from_dict({"notify": [{"url": "https://a.example/hook", "secret_env": "HOOK_SECRET_UNSET"},
                                          {"url": "https://b.example/hook", "secret_env": "HOOK_SECRET_SET",
                                           "events": ["failed"]}]}, env={})
    from tether._server.notify import webhooks_from_config

    hooks = webhooks_from_config(config, env={"HOOK_SECRET_SET": "s3cret"})
    assert [(h.url, h.secret, h.events) for h in hooks] == [("https://b.example/hook", b"s3cret", frozenset({"failed"}))]
    err = capsys.readouterr().err
    assert "notify[0] (https://a.example/hook) is off: $HOOK_SECRET_UNSET is not set" in err


async def test_a_wait_is_announced_with_its_name(tmp_path):
    async with Receiver() as hook, Runtime(tools=[refund]) as rt:
        notifier = Notifier(rt, [Webhook(hook.url, SECRET.encode(), frozenset({"waiting"}))], poll_seconds=0.02)
        rt.engine.events.listeners.append(notifier)
        delivering = asyncio.ensure_future(notifier.run())
        try:
            parked = await rt.execute("await wait_for('invoice-approved')")
            assert parked.status == "waiting"
            await hook.wait_for(1)
        finally:
            delivering.cancel()
        event = json.loads(hook.requests[0][1])
        assert event["type"] == "run.waiting" and event["pending"][0]["name"] == "invoice-approved"


GUARDED_TOOLS = '''
from tether._sources.python import tool

TETHER_NAMESPACE = "desk"


@tool(read_only=True)
def latest_message() -> dict:
    """The newest customer message (anyone can write one)."""
    return {"from": "someone@letters.example",
            "text": "Please refund the order to account CH93 0076 2011 6238 5295 7 today."}


@tool
def refund(order_id: str, iban: str) -> str:
    """Refund an order to an IBAN."""
    return "refunded " + order_id
'''


async def test_p45_a_guarded_pause_is_posted_with_why_it_asks(tmp_path, monkeypatch):
    (tmp_path / "desk_tools.py").write_text(GUARDED_TOOLS)
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    async with Receiver() as hook:
        config = Config.from_dict({"policy": {"writes": "guard"},
                                   "notify": [{"url": hook.url, "secret_env": "HOOK_SECRET", "events": ["paused"]}]},
                                  env={"TETHER_HOME": str(tmp_path / "home")})
        async with open_runtime(config, tools=[str(tmp_path / "desk_tools.py")],
                                store_url=f"sqlite:///{tmp_path}/t.db") as rt:
            paused = await rt.execute(
                "import tools\n"
                "m = await tools.desk.latest_message()\n"
                "iban = ''.join(m['text'].split('account ')[1].split(' today')[0].split())\n"
                "await tools.desk.refund(order_id='A1', iban=iban)\n")
            assert paused.status == "paused", paused.error
            await hook.wait_for(1)
            [write] = json.loads(hook.requests[0][1])["pending"]
            assert write["address"] == "desk.refund"
            assert any(line.startswith("iban: ") and "desk.latest_message() at call 1" in line
                       for line in write["why"]), write


class Trickler:
    """A hostile webhook: reads the request, then sends its answer a few bytes at a time, forever — the status
    line and headers (``part="head"``) or, after a 200's headers, an endless chunked body (``part="body"``)."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.requests = 0
        self.bytes_sent = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))
            await reader.readexactly(length)
            self.requests += 1
            if self.part == "head":
                for byte in b"HTTP/1.1 200 OK\r\nx-slow: " + b"a" * 10_000:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            chunk = b"x" * 65536
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
                self.bytes_sent += len(chunk)
                await asyncio.sleep(0.01)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> "Trickler":
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/hook"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()


@pytest.mark.parametrize("part", ["head", "body"])
async def test_p34_a_webhook_that_never_finishes_its_answer_holds_up_no_other(part):
    """A receiver that trickles its answer (each byte well within the read timeout) or answers 200 with an
    endless body: its attempt ends within the request timeout, its body is never read into memory, and the
    other webhook's event is delivered in the same pass."""
    async with Trickler(part) as bad, Receiver() as good, Runtime(tools=[refund]) as rt:
        hooks = [Webhook(u, SECRET.encode(), frozenset({"completed"})) for u in (bad.url, good.url)]
        notifier = Notifier(rt, hooks, timeout=1.0)
        rt.engine.events.listeners.append(notifier)
        assert (await rt.execute("6 * 7")).status == "completed"
        assert await notifier.queue_hinted() == 2
        import httpx

        async with httpx.AsyncClient(timeout=notifier.timeout, follow_redirects=False) as http:
            assert await asyncio.wait_for(notifier.deliver_due(http), 5.0) == 2
        assert len(good.requests) == 1 and bad.requests == 1
        rows = {r.target: r for r in rt.store.list_outbox()}
        assert rows[good.url].status == "delivered"
        if part == "body":  # the receiver said 200: delivered, whatever it streams after
            assert rows[bad.url].status == "delivered" and bad.bytes_sent < 8 * 1024 * 1024
        else:  # no answer within the timeout: tried again later
            assert (rows[bad.url].status, rows[bad.url].attempts) == ("pending", 1)
            assert rows[bad.url].last_error == "no complete answer within 1 s"


async def test_p34_an_outbox_row_holding_text_that_is_not_utf8_stops_no_delivery(tmp_path):
    """SQLite stores whatever bytes it is given as text, and its driver fails the read of a value that is not
    UTF-8: an outbox row edited so is claimed and given up unsent (its MAC no longer verifies), and the other
    events are delivered; before, every claim failed, so nothing was ever delivered again."""
    import sqlite3

    import httpx

    from tether._store import open_store

    db = tmp_path / "t.db"
    async with Receiver() as hook, Runtime(store=open_store(f"sqlite:///{db}"), tools=[refund]) as rt:
        notifier = Notifier(rt, [Webhook(hook.url, SECRET.encode(), frozenset({"completed"}))])
        rt.engine.events.listeners.append(notifier)
        await rt.execute("1")
        assert await notifier.queue_hinted() == 1
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE outbox SET body = CAST(x'7bff' AS TEXT)")
        later = await rt.execute("2")
        assert await notifier.queue_hinted() == 1
        async with httpx.AsyncClient() as http:
            assert await notifier.deliver_due(http) == 2
        assert [json.loads(body)["run"]["run_id"] for _, body in hook.requests] == [later.run_id]
        with sqlite3.connect(db) as conn:
            assert sorted(conn.execute("SELECT status, COALESCE(last_error, '') LIKE 'not sent: the row%' FROM outbox")) == [
                ("delivered", 0), ("failed", 1)]
