"""Reconciling the outbox with the runs: no run's pause, park or end goes unannounced (D-81).

A listener is only told in the process that stored the transition, after it is stored; a process that
dies in between (or drops the hint) would leave the webhook untold. So the notifier also reads what is
stored: every run in an announced status changed since each webhook's watermark (``outbox_watermarks``), in pages,
and queues the events that are not in the outbox yet. Queueing is insert-or-ignore by (webhook, event
id) and the id is a function of the transition, so a run reconciled by two replicas, or both hinted and
reconciled, is one row, claimed by one deliverer at a time (``claim_outbox``): receivers get each event
at least once and drop repeats by its id (P-34).

The decisions are the pure functions below; :func:`reconcile` only reads and writes through the
store's awaitable face (D-27).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from tether._store.base import AsyncStore, RunChange

# Runs read per page; a pass reads at most this many pages and stops at its deadline, so a store full
# of changes (a notifier back after a long outage) is caught up over several passes, never in one.
PAGE = 200
PAGES_PER_PASS = 10
DEADLINE_SECONDS = 20.0
# How often a pass runs: the hint from the run's own process is what is quick; this is the safety net.
RECONCILE_SECONDS = 5.0
# A watermark stays this far behind the clock: a transition committed late, or stamped by a replica whose
# clock runs behind, is still read by the next pass. Reading it twice costs an outbox lookup, not a send.
SETTLE_SECONDS = 30.0
PARKED = ("paused", "waiting")


def event_id(run_id: str, kind: str, seq: Any) -> str:
    """The id of one transition's event: the same transition queued twice (a retried finish, a hint and a
    reconciliation, two replicas) is one event."""
    return "evt_" + hashlib.sha256(f"{run_id}:{kind}:{seq}".encode()).hexdigest()[:24]


class Refused(ValueError):
    """A stored run whose fields cannot be read as tether writes them: left unannounced."""


def stored_seq(kind: str, pending: str | None) -> Any:
    """The seq a run's event is named by: its pending call's, for a pause or park; None for an end."""
    if kind not in PARKED or pending is None:
        return None
    try:
        value = json.loads(pending)
    except (TypeError, ValueError):
        raise Refused("its pending call is not JSON") from None
    if not isinstance(value, dict):
        raise Refused("its pending call is not an object")
    return value.get("seq")


class Target(Protocol):
    """A webhook as reconciliation sees it (notify.Webhook): where, and which kinds it wants."""

    @property
    def url(self) -> str: ...

    @property
    def events(self) -> frozenset[str]: ...


@dataclass(frozen=True)
class Due:
    """A run whose event some webhooks want, by the stored row: queued unless the outbox has it."""

    run_id: str
    kind: str
    event_id: str
    targets: tuple[str, ...]
    updated_at: float


def planned(changes: Sequence[RunChange], hooks: Sequence[Target], watermarks: Mapping[str, float],
            refused: list[tuple[str, str]] | None = None) -> list[Due]:
    """The events ``changes`` call for: per run, the webhooks that want its status and whose watermark it is not
    before. A row that cannot be read is left out (and named in ``refused``), never raised."""
    out = []
    for change in changes:
        try:
            seq = stored_seq(change.status, change.pending)
        except Refused as exc:
            if refused is not None:
                refused.append((change.run_id, str(exc)))
            continue
        targets = tuple(h.url for h in hooks
                        if change.status in h.events and h.url in watermarks and change.updated_at >= watermarks[h.url])
        if targets:
            out.append(Due(change.run_id, change.status, event_id(change.run_id, change.status, seq), targets,
                           change.updated_at))
    return out


def next_watermark(since: float, last: float | None, exhausted: bool, now: float) -> float:
    """Where the next pass may start: past everything this pass read, never closer to ``now`` than the settle
    margin. ``last``: the newest change read (None: none); ``exhausted``: the last page was not full."""
    reached = now if exhausted else (since if last is None else last)
    return min(reached, now - SETTLE_SECONDS)


async def reconcile(aio: AsyncStore, hooks: Sequence[Target], now: float,
                    queue_stored: Callable[[str, str, str, list[str]], int],
                    refuse: Callable[[str, str], None], resume: tuple[float, str] | None = None,
                    deadline_seconds: float = DEADLINE_SECONDS) -> tuple[int, tuple[float, str] | None]:
    """One pass: queue what the stored runs call for and the outbox lacks. Returns the rows queued, and where
    the next pass goes on (None: from the watermarks again, once everything changed was read).

    ``queue_stored(run_id, kind, event_id, targets)`` queues one run's event from its row (a sync function of
    the store's, run off the loop); ``refuse(run_id, why)`` is told of a row that cannot be read; ``resume``:
    where the previous pass stopped, so a backlog larger than a pass is read to its end, not its first pages
    over and over.
    Terminates: at most ``PAGES_PER_PASS`` pages of ``PAGE`` runs, and no page is begun after the deadline.
    Each webhook's watermark moves forward only past what was read (never back: ``advance_outbox_watermark``).
    """
    statuses = sorted({kind for hook in hooks for kind in hook.events})
    if not statuses:
        return 0, None
    stored = await aio.outbox_watermarks([hook.url for hook in hooks], now)
    # A watermark is written no closer to the clock than the settle margin (a new webhook's aside): one edited
    # into the future is read as that, so it cannot hide the runs that change from then on.
    watermarks = {target: min(at, now - SETTLE_SECONDS) for target, at in stored.items()}
    if not watermarks:
        return 0, None
    since = min(watermarks.values())
    cursor, after = resume if resume is not None and resume[0] >= since else (since, "")
    last: float | None = None
    exhausted = False
    queued = 0
    ends = time.monotonic() + deadline_seconds
    for _ in range(PAGES_PER_PASS):
        page = await aio.run_changes(statuses, cursor, after, PAGE)
        refused: list[tuple[str, str]] = []
        due = planned(page, hooks, watermarks, refused)
        for run_id, why in refused:
            refuse(run_id, why)
        known = await aio.outbox_known([d.event_id for d in due]) if due else set()
        for d in due:
            missing = [t for t in d.targets if (t, d.event_id) not in known]
            if missing:
                queued += await aio.call(queue_stored, d.run_id, d.kind, d.event_id, missing)
        if page:
            last, cursor, after = page[-1].updated_at, page[-1].updated_at, page[-1].run_id
        if len(page) < PAGE:
            exhausted = True
            break
        if time.monotonic() > ends:
            break
    watermark = next_watermark(since, last, exhausted, now)
    for target, current in watermarks.items():
        if watermark > current:
            await aio.advance_outbox_watermark(target, watermark)
    return queued, None if exhausted else (cursor, after)
