"""Notifications: ``[[notify]]`` webhooks told when a run pauses, waits, fails, completes or is cancelled.

    run pauses/ends ──> EventBus.announce ──> a hint, in memory ─────┐
    stored runs changed since a webhook's watermark (reconciled) ──────┴─> outbox row per webhook
                                                                          │  (insert-or-ignore)
           deliverer (any tether process) ──claim─────────────────────────┘──> POST signed JSON ──> 2xx: delivered
                                                             └─ else: retried with backoff, then given up

The run pays for nothing but appending the hint: the outbox rows are written by
a background task, off the event loop (D-27), and delivered by another, with
its own timeout, so a slow or failing webhook never delays a run. No event is
lost: a process that dies after a run's transition is stored but before its
row is queued leaves the run as stored, and the next pass of any notifier on
the store queues its event from there (notify_reconcile.py, D-81). The outbox
is durable: a notification queued by a process that stops is delivered by the
next one (``tether serve``, ``tether worker``, or any process that runs with
the same config), at least once. Each event has an ``id``, the same however
often it is queued; receivers drop repeats by it.

Each request is signed: ``Tether-Signature: t=<unix seconds>,v1=<hex>`` where
``v1 = HMAC-SHA256(secret, f"{t}.{body}")``. docs/notifications.md shows how
to verify it (and :func:`verify` is the same check). The rules are P-34.

The outbox holds no live capability and signs nothing it did not queue: a row
carries the event as queued, MACed under the store's secret, and approval
links are minted only as the request is built. A row whose MAC does not
verify (inserted or edited by someone without the secret) is given up unsent,
so the webhook's secret never signs a body tether did not write.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from tether import _metrics as metrics
from tether._engine.approvals.capabilities import Keyring, mac_hex, same, secret_id
from tether._engine.attempt.redaction import shown_args
from tether._engine.integrity import verify_run
from tether._engine.lineage.why import why_lines
from tether._logs import say
from tether._server import notify_reconcile
from tether._server.approvals import approval_url, input_schema, pending_writes
from tether._store.base import OUTBOX_DELIVERED, OUTBOX_FAILED, OUTBOX_PENDING, OutboxRecord, RunRecord
from tether._tools.shown import show_call
from tether.errors import StoreError

if TYPE_CHECKING:
    from tether._runtime import Runtime

SCHEMA_VERSION = 1
# One attempt may take this long; a webhook slower than that is tried again later.
REQUEST_TIMEOUT_SECONDS = 10.0
# Retries double from one second up to an hour: fifteen attempts span about
# three hours, long enough to ride out a receiver's restart or an
# outage, short enough that a stale "approve this" is not delivered the next day.
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 3600.0
MAX_ATTEMPTS = 15
# A claimed notification is another deliverer's again after this long (a
# deliverer that died mid-attempt); above the request timeout.
CLAIM_SECONDS = 60.0
POLL_SECONDS = 0.5
# A process that closes (a `tether run` ending right after its run) sends what is due once more before it goes,
# for at most this long: a short-lived CLI would otherwise cancel every delivery it queued. What is not sent
# by then stays in the outbox for the next `tether serve` or `tether worker`.
FINAL_PASS_SECONDS = 3.0
# Hints kept for the queueing task; past this many (a store down for long) the oldest are dropped: the
# next reconciliation finds their runs in the store (D-81).
HINTS_KEPT = 10_000
# Hints queued per trip off the event loop.
HINTS_PER_TRIP = 50
# Runs refused (a row that does not verify or cannot be read) remembered so each is logged once.
REFUSALS_KEPT = 1_000
# Receivers should refuse a signature older than this (replay window).
TOLERANCE_SECONDS = 300
KINDS = ("paused", "waiting", "failed", "completed", "cancelled")
# What an outbox row's MAC is made for: it can never pass for another purpose's.
OUTBOX_PURPOSE = "tether/outbox/v1"


def sign(secret: bytes, timestamp: int, body: str) -> str:
    return mac_hex(secret, f"{timestamp}.{body}".encode())


def signature_header(secret: bytes, body: str, now: float) -> str:
    t = int(now)
    return f"t={t},v1={sign(secret, t, body)}"


def verify(secret: bytes, header: str, body: str, now: float | None = None,
           tolerance: int = TOLERANCE_SECONDS) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` within ``tolerance`` seconds of ``now``."""
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        t = int(parts["t"])
    except (ValueError, KeyError):
        return False
    if abs((time.time() if now is None else now) - t) > tolerance:
        return False
    return same(sign(secret, t, body), parts.get("v1", ""))


@dataclass(frozen=True)
class Webhook:
    url: str
    secret: bytes
    events: frozenset[str]


def shown_url(url: str) -> str:
    """A webhook URL as a log line may show it: no user, password, query or fragment.

    Many services put the webhook's own key in the URL (``?token=...``, ``https://key@host``), so the
    line names where, never the key (D-62).
    """
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(a URL that cannot be read)"
    hidden = " (query not shown)" if parts.query or parts.fragment else ""
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}{parts.path}{hidden}"


def webhooks_from_config(config: Any, env: Mapping[str, str] | None = None) -> list[Webhook]:
    """The configured webhooks whose secret is set; each one without is reported and left off."""
    env = os.environ if env is None else env
    out = []
    for i, hook in enumerate(getattr(config, "notify", None) or []):
        secret = env.get(hook.secret_env)
        if not secret:
            say(f"tether: notify[{i}] ({shown_url(hook.url)}) is off: ${hook.secret_env} is not set; "
                "nothing is sent to it unsigned", level=logging.WARNING, logger="tether.notify")
            continue
        out.append(Webhook(hook.url, secret.encode(), frozenset(hook.events)))
    return out


def backoff(attempts: int, base: float = BACKOFF_BASE_SECONDS) -> float:
    """Seconds before attempt ``attempts + 1``: doubling, capped, with jitter so receivers are not stampeded."""
    delay = min(base * (2 ** max(0, attempts - 1)), BACKOFF_CAP_SECONDS)
    return delay * random.uniform(0.8, 1.2)


class Notifier:
    """Queues events for the webhooks (hinted by a Runtime listener, reconciled from the store) and delivers
    them from the outbox."""

    def __init__(self, rt: Runtime, webhooks: list[Webhook], *, public_url: str | None = None,
                 backoff_base: float = BACKOFF_BASE_SECONDS, poll_seconds: float = POLL_SECONDS,
                 timeout: float = REQUEST_TIMEOUT_SECONDS,
                 reconcile_seconds: float = notify_reconcile.RECONCILE_SECONDS) -> None:
        self.rt = rt
        self.webhooks = {w.url: w for w in webhooks}
        self.public_url = public_url
        self.backoff_base = backoff_base
        self.poll_seconds = poll_seconds
        self.timeout = timeout
        self.reconcile_seconds = reconcile_seconds
        self._hints: collections.deque[tuple[str, str, dict[str, Any]]] = collections.deque(maxlen=HINTS_KEPT)
        self._refused: set[str] = set()
        self._resume: tuple[float, str] | None = None  # where the last reconciliation stopped, if it had more
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hinted: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None

    # -- queueing: the run's step leaves a hint; the store work is this notifier's own (D-81) ------------

    def __call__(self, run_id: str, kind: str, data: dict[str, Any]) -> None:
        """The listener: quick, no store I/O, never blocks the run. What it misses, reconciliation finds."""
        if any(kind in w.events for w in self.webhooks.values()):
            self._hints.append((run_id, kind, data))
            self._poke(self._hinted)

    def _poke(self, signal: asyncio.Event | None) -> None:
        """Set ``signal`` (an event of the loop ``run`` runs on) from that loop or from any thread."""
        loop = self._loop
        if signal is None or loop is None:
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            signal.set()
        else:
            with contextlib.suppress(RuntimeError):  # that loop has closed: the hint waits for the next pass
                loop.call_soon_threadsafe(signal.set)

    def wake(self) -> None:
        """Make both loops look now (hints to queue, rows to deliver)."""
        self._poke(self._hinted)
        self._poke(self._wake)

    async def prepare(self) -> None:
        """Store each webhook's watermark if it has none: a run that changes from now on is reconciled even if this
        process dies before its first pass."""
        await self.rt.store.aio.outbox_watermarks(list(self.webhooks), self.rt.engine.clock())

    async def queue_hinted(self) -> int:
        """Queue the events listeners were told of, off the event loop. Returns the rows added."""
        added = 0
        for _ in range(0, len(self._hints), HINTS_PER_TRIP):  # hints that arrive meanwhile wait for the next call
            trip = [self._hints.popleft() for _ in range(min(HINTS_PER_TRIP, len(self._hints)))]
            added += await self.rt.store.aio.call(self._queue_hints, trip)
        if added:
            self._poke(self._wake)
        return added

    async def reconcile(self) -> int:
        """One reconciliation pass (notify_reconcile.py): the stored runs' events the outbox lacks, queued."""
        added, self._resume = await notify_reconcile.reconcile(
            self.rt.store.aio, list(self.webhooks.values()), self.rt.engine.clock(), self.queue_stored, self.refuse,
            self._resume)
        if added:
            self._poke(self._wake)
        return added

    def _queue_hints(self, hints: list[tuple[str, str, dict[str, Any]]]) -> int:
        added = 0
        for run_id, kind, data in hints:
            try:
                added += self.queue(run_id, kind, data)
            except Exception as exc:  # this one is left to reconciliation; the others go on
                say(f"tether: the {kind} event of run {run_id} was not queued now ({type(exc).__name__}); "
                    "the next reconciliation queues it from the store", level=logging.WARNING,
                    logger="tether.notify")
        return added

    def queue(self, run_id: str, kind: str, data: dict[str, Any]) -> int:
        """Queue ``kind`` of ``run_id`` for each webhook that wants it (store I/O: called off the loop)."""
        wanted = [w.url for w in self.webhooks.values() if kind in w.events]
        run = self.rt.store.get_run(run_id) if wanted else None
        if run is None:
            return 0
        if kind in notify_reconcile.PARKED and not self._verified(run):
            # The hint names the run; what a pause's event shows a person, and links to, is read from its row,
            # which is checked as a reconciled one is (P-35). An end carries no capability: sent as stored.
            return 0
        return self._insert(self.event(run, kind, data), wanted)

    def _answers(self) -> bool:
        """Whether the store answers a read now (a run that does not exist)."""
        try:
            self.rt.store.get_run("")
        except Exception:
            return False
        return True

    def _verified(self, run: RunRecord) -> bool:
        """Whether ``run``'s signed fields verify (P-35); a run that does not is refused, logged once."""
        try:
            verify_run(self.rt.engine.keyring, run)
        except Exception as exc:  # RunTampered, WrongSecret: this row is not announced, never sent
            self.refuse(run.run_id, str(getattr(exc, "message", exc))[:200])
            return False
        return True

    def queue_stored(self, run_id: str, kind: str, event_id: str, targets: list[str]) -> int:
        """Queue the event of ``run_id`` as it is stored, for ``targets`` (reconciliation; called off the loop).

        Only a run whose signature verifies (P-35) is announced from its row, and only while it still stands
        where the row read said (``kind``, ``event_id``): anything else is refused or left to the next pass.
        """
        try:
            run = self.rt.store.get_run(run_id)
        except StoreError:
            if self._answers():
                # The store reads other rows but not this one (text that is not UTF-8 on SQLite): its row, not the
                # store, is what fails; ending the pass here would end every pass here.
                self.refuse(run_id, "the store cannot read it")
                return 0
            raise  # the store, not the row: this pass ends and the next one reads it again
        except Exception as exc:  # a column that is not JSON, a status tether has no name for
            self.refuse(run_id, f"it cannot be read: {type(exc).__name__}")
            return 0
        if run is None or run.status != kind or not self._verified(run):
            return 0
        data: dict[str, Any] = ({"pending": run.pending, "expires_at": run.expires_at} if kind in notify_reconcile.PARKED
                                else {"error": run.error} if run.error else {})
        event = self.event(run, kind, data)
        if event["id"] != event_id:  # it paused again since the page was read: the next pass reads that
            return 0
        return self._insert(event, targets)

    def _insert(self, event: dict[str, Any], targets: list[str]) -> int:
        body = json.dumps(event, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)
        now = self.rt.engine.clock()
        return sum(self.rt.store.add_outbox(url, event["id"], body, now, mac=self._mac(url, event["id"], body))
                   for url in targets)

    def refuse(self, run_id: str, why: str) -> None:
        """Say once per run that its stored row is not announced (it cannot be read, or does not verify)."""
        if run_id in self._refused:
            return
        if len(self._refused) >= REFUSALS_KEPT:
            self._refused.clear()
        self._refused.add(run_id)
        say(f"tether: run {run_id} is not announced to webhooks: its stored row is refused ({why}); "
            "nothing was queued for it", level=logging.WARNING, logger="tether.notify")

    def event(self, run: RunRecord, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        pending = data.get("pending") or {}
        seq = pending.get("seq")
        # Deterministic: the same transition queued twice (a retried finish, a reconciliation) is one event.
        event_id = notify_reconcile.event_id(run.run_id, kind, seq)
        out: dict[str, Any] = {
            "v": SCHEMA_VERSION, "id": event_id, "type": f"run.{kind}", "created_at": self.rt.engine.clock(),
            "run": {"run_id": run.run_id, "status": kind, "principal": run.principal, "created_at": run.created_at},
        }
        if self.public_url:
            out["console_url"] = f"{self.public_url.rstrip('/')}/console/runs/{run.run_id}"
        if kind == "paused":
            expires = data.get("expires_at")
            writes = pending_writes(self.rt, run) or [pending]
            out["expires_at"] = expires
            # Every argument named, values shortened evenly and control characters escaped
            # (_tools/shown.py): what a receiver shows a person is what the console shows.
            # "why": what made lineage ask (writes = "guard", P-45), escaped as the console shows it.
            out["pending"] = [{"seq": w.get("seq"), "address": w.get("address"),
                               **show_call(str(w.get("address")), shown_args(w),
                                           schema=input_schema(self.rt, w.get("address"))).to_dict(),
                               **({"why": why} if (why := why_lines(w.get("reasons") or (), w.get("args"))) else {})}
                              for w in writes]
        elif kind == "waiting":
            out["pending"] = [{"seq": seq, "name": pending.get("name"), "deadline": pending.get("deadline")}]
        error = data.get("error")
        if error:
            out["error"] = {"code": error.get("code"), "message": error.get("message")}
        return out

    def _mac(self, target: str, event_id: str, body: str, key: bytes | None = None) -> str:
        key = self.rt.engine.keyring.current if key is None else key
        return f"{secret_id(key)}.{Keyring.mac(key, OUTBOX_PURPOSE, target, event_id, body)}"

    def genuine(self, item: OutboxRecord) -> bool:
        """Whether tether queued this row as it is: its MAC verifies under a secret this process holds."""
        sid, _, _ = (item.mac or "").partition(".")
        key = self.rt.engine.keyring.get(sid)
        return key is not None and same(self._mac(item.target, item.event_id, item.body, key),
                                                       item.mac or "")

    def outgoing(self, item: OutboxRecord) -> str:
        """The body as sent: the queued event, with approval links minted now (never stored)."""
        if not self.public_url:
            return item.body
        event = json.loads(item.body)
        expires = event.get("expires_at")
        run_id = (event.get("run") or {}).get("run_id")
        if event.get("type") != "run.paused" or expires is None or not isinstance(run_id, str):
            return item.body
        for write in event.get("pending") or []:
            if isinstance(write, dict) and type(write.get("seq")) is int:
                write["approval_url"] = approval_url(self.public_url, self.rt.engine.keyring.current, run_id,
                                                     write["seq"], float(expires))
        return json.dumps(event, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)

    # -- delivering ----------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Queue and deliver notifications until ``stop`` is set (or the task is cancelled).

        Two loops: queueing (hints at once, reconciliation every ``reconcile_seconds``) and delivering, so a
        webhook that holds a request open delays neither the run nor the queueing of its later events.
        """
        import httpx

        self._loop = asyncio.get_running_loop()
        self._hinted, self._wake = asyncio.Event(), asyncio.Event()
        stop = stop or asyncio.Event()
        async with httpx.AsyncClient(timeout=self.timeout, follow_redirects=False) as http:
            queueing = asyncio.ensure_future(self._queue_loop(stop, self._hinted))
            try:
                await self._deliver_loop(http, stop, self._wake)
            finally:
                queueing.cancel()
                with contextlib.suppress(BaseException):
                    await queueing
            with contextlib.suppress(Exception):  # the final pass: what was hinted and queued since the last one
                await self.queue_hinted()
                await self.deliver_due(http)

    async def _queue_loop(self, stop: asyncio.Event, hinted: asyncio.Event) -> None:
        next_pass = 0.0
        while not stop.is_set():
            hinted.clear()
            with contextlib.suppress(Exception):  # a store hiccup must not end queueing: the next pass retries
                await self.queue_hinted()
            if time.monotonic() >= next_pass:
                behind = False
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.reconcile(), notify_reconcile.DEADLINE_SECONDS * 2)
                    behind = self._resume is not None  # a backlog: the next page at once
                next_pass = time.monotonic() + (0.0 if behind else self.reconcile_seconds)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(hinted.wait(), max(0.0, next_pass - time.monotonic()))

    async def _deliver_loop(self, http: Any, stop: asyncio.Event, wake: asyncio.Event) -> None:
        while not stop.is_set():
            wake.clear()
            with contextlib.suppress(Exception):  # a store hiccup must not end delivery
                await self.deliver_due(http)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), self.poll_seconds)

    async def deliver_due(self, http: Any) -> int:
        due = await self.rt.store.aio.claim_outbox(self.rt.engine.clock(), CLAIM_SECONDS)
        if due:
            await asyncio.gather(*(self._deliver(http, item) for item in due))
        return len(due)

    async def _deliver(self, http: Any, item: OutboxRecord) -> None:
        hook = self.webhooks.get(item.target)
        attempts = item.attempts + 1
        if hook is None:
            # The webhook was removed from the config: give this one up.
            await self.rt.store.aio.settle_outbox(item.id, status=OUTBOX_FAILED, attempts=item.attempts,
                                                  next_at=item.next_at,
                                                  last_error="the webhook is no longer configured")
            return
        if not self.genuine(item):
            # Not queued by tether (or altered since): the webhook's secret must not sign it.
            await self.rt.store.aio.settle_outbox(item.id, status=OUTBOX_FAILED, attempts=item.attempts,
                                                  next_at=item.next_at,
                                                  last_error="not sent: the row's signature does not verify under this "
                                                             "store's secret (inserted or altered outside tether)")
            return
        body = self.outgoing(item)
        event_type = json.loads(body).get("type", "")
        headers = {"content-type": "application/json", "user-agent": "tether-notify/1",
                   "tether-event": event_type, "tether-event-id": item.event_id,
                   "tether-delivery-attempt": str(attempts),
                   "tether-signature": signature_header(hook.secret, body, time.time())}
        error = None
        try:
            # The whole attempt is bounded, not each read: a receiver trickling its answer a byte at a time
            # would otherwise hold this pass (and every other webhook's deliveries) forever. Only the status
            # is read; a body is never taken into memory, however large or endless.
            async with asyncio.timeout(self.timeout):
                async with http.stream("POST", hook.url, content=body.encode(), headers=headers) as response:
                    status = response.status_code
            if 200 <= status < 300:
                # The last failure stays on the row: why it took more than one attempt.
                await self.rt.store.aio.settle_outbox(item.id, status=OUTBOX_DELIVERED, attempts=attempts,
                                                      next_at=item.next_at, last_error=item.last_error,
                                                      delivered_at=self.rt.engine.clock())
                return
            error = f"HTTP {status}"
        except TimeoutError:
            error = f"no complete answer within {self.timeout:g} s"
        except Exception as exc:  # the receiver is down, slow or refusing: try again later
            error = f"{type(exc).__name__}: {exc}"[:300]
        metrics.WEBHOOK_FAILURES.inc()
        now = self.rt.engine.clock()
        if attempts >= MAX_ATTEMPTS:
            await self.rt.store.aio.settle_outbox(item.id, status=OUTBOX_FAILED, attempts=attempts, next_at=now,
                                                  last_error=error)
        else:
            await self.rt.store.aio.settle_outbox(item.id, status=OUTBOX_PENDING, attempts=attempts,
                                                  next_at=now + backoff(attempts, self.backoff_base),
                                                  last_error=error)


@contextlib.asynccontextmanager
async def notifications(rt: Runtime, config: Any, **options: Any):
    """Queue and deliver ``config``'s webhooks for as long as the block runs (nothing when none are set)."""
    hooks = webhooks_from_config(config)
    if not hooks:
        yield None
        return
    notifier = Notifier(rt, hooks, public_url=getattr(getattr(config, "server", None), "public_url", None),
                        **options)
    # Each webhook's watermark before the first run: a run that changes from here on is reconciled even if this
    # process dies before its first pass (D-81). A store that cannot be reached now is tried again each pass.
    with contextlib.suppress(Exception):
        await notifier.prepare()
    rt.engine.events.listeners.append(notifier)
    stop = asyncio.Event()
    task = asyncio.ensure_future(notifier.run(stop))
    try:
        yield notifier
    finally:
        with contextlib.suppress(ValueError):
            rt.engine.events.listeners.remove(notifier)
        stop.set()
        notifier.wake()
        # One last pass, bounded; a delivery still in flight after it is abandoned: its claim lapses and the
        # next process sends it again.
        await asyncio.wait({task}, timeout=FINAL_PASS_SECONDS)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
