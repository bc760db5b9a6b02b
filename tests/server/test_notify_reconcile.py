"""P-49 (D-81): a webhook event is never lost and never blocks a run.

The listener in the run's process is only a hint; what is stored is reconciled into the outbox, so a
process that dies after a run's transition is stored, before its outbox row is written, still has the
event sent (at least once, the same id, P-34). The stores are real (SQLite, and Postgres from tests/pg.py),
the receiver a real HTTP server (test_notify.Receiver), the dying process a real one, SIGKILLed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from pathlib import Path

import httpx
import pytest

from helpers import own_database
from test_notify import SECRET, Receiver, refund
from tether import Runtime
from tether._config import Config
from tether._server import notify_reconcile
from tether._server.notify import Notifier, Webhook, notifications, verify
from tether._store import open_store
from tether._store.base import RunChange

PAUSING = "import tools\nawait tools.shop.refund(order_id='A1')"

# A process with [[notify]] whose run pauses: a listener told before the notifier kills it, so it dies
# after the pause is stored and before anything is queued for the webhook.
CHILD = '''
import asyncio, os, signal, sys
from tether import Runtime, tool
from tether._config import Config
from tether._server.notify import notifications
from tether._store import open_store


@tool(namespace="shop")
def refund(order_id: str) -> str:
    """Refund an order."""
    return "refunded " + order_id


async def main():
    config = Config.from_dict({"notify": [{"url": sys.argv[2], "secret_env": "HOOK_SECRET"}]},
                              env={"TETHER_HOME": sys.argv[3]})
    async with Runtime(store=open_store(sys.argv[1]), tools=[refund]) as rt:
        async with notifications(rt, config):
            rt.engine.events.listeners.insert(0, lambda *told: os.kill(os.getpid(), signal.SIGKILL))
            await rt.execute("import tools\\nawait tools.shop.refund(order_id='A1')")


asyncio.run(main())
'''


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/tether.db"
    return own_database(request.getfixturevalue("pg_url"), "notify")


def config_for(hook: Receiver, tmp_path: Path) -> Config:
    return Config.from_dict({"notify": [{"url": hook.url, "secret_env": "HOOK_SECRET"}]},
                            env={"TETHER_HOME": str(tmp_path / "home")})


async def test_p49_a_process_killed_between_the_pause_and_its_outbox_row_still_sends_the_event(url, tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    async with Receiver() as hook:
        env = {**os.environ, "HOOK_SECRET": SECRET}
        child = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, url, hook.url,
                                                     str(tmp_path / "home"), env=env)
        assert await asyncio.wait_for(child.wait(), 120) == -signal.SIGKILL
        store = open_store(url)
        try:
            [run] = [r for r in store.list_runs(limit=10)]
            assert run.status == "paused"
            assert store.list_outbox() == []  # it died before queueing anything
        finally:
            store.close()
        assert hook.requests == []

        # The next process with the same config sends the pause's event: once.
        for _ in range(2):
            async with Runtime(store=open_store(url), tools=[refund]) as rt:
                async with notifications(rt, config_for(hook, tmp_path), poll_seconds=0.02):
                    await hook.wait_for(1)
                    await asyncio.sleep(0.3)  # more passes: nothing more is sent
        [(headers, body)] = hook.requests
        assert verify(SECRET.encode(), headers["tether-signature"], body.decode(), tolerance=600)
        event = json.loads(body)
        assert (event["type"], event["run"]["run_id"], headers["tether-event-id"]) == ("run.paused", run.run_id,
                                                                                      event["id"])
        [write] = event["pending"]
        assert (write["seq"], write["address"]) == (1, "shop.refund")


@pytest.mark.postgres
async def test_p49_two_notifiers_on_one_postgres_store_send_each_event_once(pg_url, tmp_path):
    url = own_database(pg_url, "notify")
    async with Receiver() as hook:
        hooks = [Webhook(hook.url, SECRET.encode(), frozenset({"paused", "completed"}))]
        async with Runtime(store=open_store(url), tools=[refund]) as a, \
                Runtime(store=open_store(url), tools=[refund]) as b:
            first, second = (Notifier(rt, hooks, poll_seconds=0.02, reconcile_seconds=0.05) for rt in (a, b))
            await first.prepare()
            a.engine.events.listeners.append(first)  # a's runs are hinted to a's notifier; b's to no one
            stop = asyncio.Event()
            delivering = [asyncio.ensure_future(n.run(stop)) for n in (first, second)]
            try:
                paused = await a.execute(PAUSING)
                done = await b.execute("6 * 7")
                assert (paused.status, done.status) == ("paused", "completed")
                await hook.wait_for(2)
                await asyncio.sleep(1.0)  # both reconcile both runs, many times over
            finally:
                stop.set()
                first.wake()
                second.wake()
                await asyncio.gather(*delivering)
            rows = a.store.list_outbox()
        sent = sorted((json.loads(body)["run"]["run_id"], json.loads(body)["type"]) for _, body in hook.requests)
        assert sent == sorted([(paused.run_id, "run.paused"), (done.run_id, "run.completed")])
        assert len({h["tether-event-id"] for h, _ in hook.requests}) == 2
        assert sorted((r.status, r.attempts) for r in rows) == [("delivered", 1), ("delivered", 1)]


async def test_p49_a_tampered_or_unreadable_run_row_is_not_announced_and_stops_nothing(tmp_path, capsys):
    db = tmp_path / "t.db"
    async with Receiver() as hook, Runtime(store=open_store(f"sqlite:///{db}"), tools=[refund]) as rt:
        notifier = Notifier(rt, [Webhook(hook.url, SECRET.encode(), frozenset({"paused"}))])
        await notifier.prepare()
        bad_json, edited, bad_meta, intact = [(await rt.execute(PAUSING)).run_id for _ in range(4)]
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE runs SET pending = '{\"seq\": 1, ' WHERE run_id = ?", (bad_json,))
            conn.execute("UPDATE runs SET pending = replace(pending, 'A1', 'Z9') WHERE run_id = ?", (edited,))
            conn.execute("UPDATE runs SET meta = '{oops' WHERE run_id = ?", (bad_meta,))
        assert await notifier.reconcile() == 1
        assert await notifier.reconcile() == 0
        [row] = rt.store.list_outbox()
        assert json.loads(row.body)["run"]["run_id"] == intact
        err = capsys.readouterr().err
        for run_id in (bad_json, edited, bad_meta):
            assert err.count(f"run {run_id} is not announced to webhooks") == 1, err
        async with httpx.AsyncClient() as http:
            assert await notifier.deliver_due(http) == 1
        assert [json.loads(body)["run"]["run_id"] for _, body in hook.requests] == [intact]


def _store_transactions() -> float:
    from tether import _metrics

    return sum(sum(child.counts) for child in _metrics.STORE_SECONDS.children.values())


async def test_p49_the_listener_in_the_runs_step_touches_no_store(tmp_path):
    """The run's pausing step calls the listener on the event loop: it leaves a hint and nothing else (D-27);
    the store work happens when the notifier's own task queues it."""
    async with Runtime(store=open_store(f"sqlite:///{tmp_path}/t.db"), tools=[refund]) as rt:
        notifier = Notifier(rt, [Webhook("http://127.0.0.1:9/hook", SECRET.encode(), frozenset({"paused"}))])
        paused = await rt.execute(PAUSING)
        stored = rt.store.get_run(paused.run_id)
        before = _store_transactions()
        notifier(paused.run_id, "paused", {"pending": stored.pending, "expires_at": stored.expires_at})
        assert _store_transactions() == before and rt.store.list_outbox() == []
        assert await notifier.queue_hinted() == 1
        assert json.loads(rt.store.list_outbox()[0].body)["run"]["run_id"] == paused.run_id


async def test_p49_a_watermark_edited_into_the_future_hides_no_run(tmp_path):
    db = tmp_path / "t.db"
    async with Runtime(store=open_store(f"sqlite:///{db}"), tools=[refund]) as rt:
        notifier = Notifier(rt, [Webhook("http://127.0.0.1:9/hook", SECRET.encode(), frozenset({"paused"}))])
        await notifier.prepare()
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE outbox_watermarks SET watermark = 1e12")
        paused = await rt.execute(PAUSING)
        assert await notifier.reconcile() == 1
        assert json.loads(rt.store.list_outbox()[0].body)["run"]["run_id"] == paused.run_id


async def test_p49_a_backlog_larger_than_a_pass_is_read_to_its_end(tmp_path, monkeypatch):
    monkeypatch.setattr(notify_reconcile, "PAGE", 2)
    monkeypatch.setattr(notify_reconcile, "PAGES_PER_PASS", 2)
    async with Runtime(store=open_store(f"sqlite:///{tmp_path}/t.db"), tools=[refund]) as rt:
        notifier = Notifier(rt, [Webhook("http://127.0.0.1:9/hook", SECRET.encode(), frozenset({"completed"}))])
        await notifier.prepare()
        for i in range(7):
            assert (await rt.execute(str(i))).status == "completed"
        # Each pass reads at most two pages of two runs, and goes on where the last one stopped.
        assert [await notifier.reconcile() for _ in range(4)] == [4, 3, 0, 0]
        assert len({r.event_id for r in rt.store.list_outbox()}) == 7


def test_p49_each_webhook_is_reconciled_from_its_own_watermark():
    hooks = [Webhook("https://a.example/hook", b"s", frozenset({"paused", "completed"})),
             Webhook("https://b.example/hook", b"s", frozenset({"completed"}))]
    changes = [RunChange("r1", "completed", 10.0, None), RunChange("r2", "paused", 20.0, '{"seq": 3}'),
               RunChange("r3", "paused", 30.0, "{oops"), RunChange("r4", "completed", 40.0, '{"seq": 9}')]
    refused: list[tuple[str, str]] = []
    due = notify_reconcile.planned(changes, hooks, {"https://a.example/hook": 0.0, "https://b.example/hook": 15.0},
                                   refused)
    assert [(d.run_id, d.targets) for d in due] == [
        ("r1", ("https://a.example/hook",)), ("r2", ("https://a.example/hook",)),
        ("r4", ("https://a.example/hook", "https://b.example/hook"))]
    # The id is the transition's: a pause's names its call, an end's none (whatever its row still holds).
    assert due[1].event_id == notify_reconcile.event_id("r2", "paused", 3)
    assert due[2].event_id == notify_reconcile.event_id("r4", "completed", None)
    assert refused == [("r3", "its pending call is not JSON")]


def test_p49_a_watermark_never_passes_what_was_read_nor_the_settle_margin():
    settle = notify_reconcile.SETTLE_SECONDS
    assert notify_reconcile.next_watermark(100.0, None, True, 1000.0) == 1000.0 - settle
    assert notify_reconcile.next_watermark(100.0, 400.0, False, 1000.0) == 400.0
    assert notify_reconcile.next_watermark(100.0, 990.0, False, 1000.0) == 1000.0 - settle
    assert notify_reconcile.next_watermark(100.0, None, False, 1000.0) == 100.0


async def test_p49_an_unreadable_run_time_or_watermark_starves_no_later_run(url, tmp_path):
    """Someone who can write the tables stores a run's time or a webhook's watermark as something that is
    not a time (text on SQLite, NaN on Postgres, whose double precision takes it and sorts it above every
    number): later runs are still reconciled and announced, on every pass."""
    from helpers import direct_sql

    kind = "sqlite" if url.startswith("sqlite") else "postgres"
    bad = "'soon'" if kind == "sqlite" else "'NaN'::float8"
    edit = lambda sql: direct_sql(kind, url, "tether", sql)  # noqa: E731
    async with Runtime(store=open_store(url), tools=[refund]) as rt:
        notifier = Notifier(rt, [Webhook("http://127.0.0.1:9/hook", SECRET.encode(), frozenset({"paused"}))])
        await notifier.prepare()
        odd = (await rt.execute(PAUSING)).run_id
        edit(f"UPDATE runs SET updated_at = {bad} WHERE run_id = '{odd}'")
        later = (await rt.execute(PAUSING)).run_id
        assert await notifier.reconcile() == 1
        edit(f"UPDATE outbox_watermarks SET watermark = {bad}")
        latest = (await rt.execute(PAUSING)).run_id
        assert await notifier.reconcile() == 1
        assert await notifier.reconcile() == 0
        announced = {json.loads(r.body)["run"]["run_id"] for r in rt.store.list_outbox()}
        assert announced == {later, latest}


async def test_p49_a_hinted_pause_whose_stored_row_was_edited_is_not_announced(tmp_path, capsys):
    """The hint only says which run to look at; what is announced is read from the stored run, so it is checked
    as a reconciled one is (P-35): a pending write edited between the pause and the queueing of its hint is not
    posted, with tether's approval link, to a person."""
    db = tmp_path / "t.db"
    async with Runtime(store=open_store(f"sqlite:///{db}"), tools=[refund]) as rt:
        notifier = Notifier(rt, [Webhook("http://127.0.0.1:9/hook", SECRET.encode(), frozenset({"paused"}))],
                            public_url="https://tether.example")
        paused = await rt.execute(PAUSING)
        stored = rt.store.get_run(paused.run_id)
        notifier(paused.run_id, "paused", {"pending": stored.pending, "expires_at": stored.expires_at})
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE runs SET pending = replace(pending, 'A1', 'Z9') WHERE run_id = ?", (paused.run_id,))
        assert await notifier.queue_hinted() == 0
        assert rt.store.list_outbox() == []
        assert f"run {paused.run_id} is not announced to webhooks" in capsys.readouterr().err


@pytest.mark.parametrize("column", ["pending", "error", "program"])
async def test_p49_a_run_row_holding_text_that_is_not_utf8_starves_no_later_run(tmp_path, capsys, column):
    """SQLite stores whatever bytes it is given as text, and its driver fails the read of a value that is not
    UTF-8: such a row (edited outside tether) is refused, logged once, and the runs after it are announced;
    before, every pass ended at it."""
    db = tmp_path / "t.db"
    async with Runtime(store=open_store(f"sqlite:///{db}"), tools=[refund]) as rt:
        notifier = Notifier(rt, [Webhook("http://127.0.0.1:9/hook", SECRET.encode(), frozenset({"paused"}))])
        await notifier.prepare()
        odd = (await rt.execute(PAUSING)).run_id
        with sqlite3.connect(db) as conn:
            conn.execute(f"UPDATE runs SET {column} = CAST(x'7bff' AS TEXT) WHERE run_id = ?", (odd,))
        later = (await rt.execute(PAUSING)).run_id
        assert [await notifier.reconcile() for _ in range(2)] == [1, 0]
        assert [json.loads(r.body)["run"]["run_id"] for r in rt.store.list_outbox()] == [later]
        assert capsys.readouterr().err.count(f"run {odd} is not announced to webhooks") == 1
