"""The runner: executes queued runs, wakes timers and due waits, takes over orphans.

Any number of workers may share a store; every claim is a compare-and-set, so
each run executes in one place (on Postgres queued runs, due timers and
lapsed orphans with ``FOR UPDATE SKIP LOCKED``, so replicas polling at once
take different runs without waiting). A run whose worker died is taken over once its
lease expires (P-11, P-16).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Sequence

from tether._engine import launcher
from tether._engine.approvals.service import expire, finish_cuts
from tether._engine.notices import SETTLED
from tether._engine.outage import Outage
from tether._store.base import RunRecord

if TYPE_CHECKING:
    from tether._engine.attempt.result import RunResult
    from tether._engine.engine import Engine
    from tether._store.states import RunStatus

# How often a runner looks for parked runs whose wait was settled and nobody continued,
# when no notice named them (SQLite, or a notice lost).
SETTLED_SCAN_SECONDS = 2.0
# How often a runner without a config ([retention] every_seconds) forgets old quota counters: a server's
# default, and a minute or two of extra rows is nothing.
MAINTENANCE_SECONDS = 300.0


class Worker:
    """The runner of one Engine: its loop (:meth:`work`), and the same duties once (:meth:`recover`,
    :meth:`run_queued`).

    Made once by whatever runs the engine's background work: the Runtime (``recover``), ``tether
    serve`` and ``tether worker`` (the loop). It remembers the runs whose sources it could not load,
    so each is said once on stderr however many rounds pass.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.reported: set[str] = set()  # runs whose sources cannot be loaded here, said once
        # A failing store: each failure said once, repeats summarised, rounds backing off (D-92).
        self.outage = Outage(engine.clock)
        # Waits between rounds (stop, nudge, seconds); a test puts one that counts rounds instead of waiting.
        self.pause: Callable[[asyncio.Event, asyncio.Event, float], Awaitable[None]] = _pause

    async def work(self, *, stop: asyncio.Event | None = None, poll_seconds: float = 0.2,
                   idle_exit_seconds: float | None = None, concurrency: int | None = None) -> int:
        """Serve the store until ``stop`` is set (or idle for ``idle_exit_seconds``). Returns runs handled."""
        engine = self.engine
        stop = stop or asyncio.Event()
        slots = asyncio.Semaphore(concurrency or engine.pool.max_workers)
        tasks: set[asyncio.Task[None]] = set()
        handled = 0
        idle_since = time.monotonic()
        # Parked runs whose wait another process settled without continuing them (P-18): named by a
        # notice at once (Postgres), else found by a scan every SETTLED_SCAN_SECONDS.
        settled: set[str] = set()
        nudge = asyncio.Event()
        scanned = 0.0
        prune_at = 0.0  # maintenance ([retention], quota counters): a first batch at start, then every every_seconds

        def heard(kind: str, run_id: str) -> None:
            if kind == SETTLED:
                settled.add(run_id)
                nudge.set()
            elif self.outage.since is not None:
                nudge.set()  # the store spoke: try a round now rather than wait out the backoff (D-92)

        async def one(coro: Awaitable[Any]) -> None:
            async with slots:
                with contextlib.suppress(Exception):
                    await coro

        engine.events.notices.handlers.append(heard)
        engine.events.listen()
        try:
            while not stop.is_set():
                busy = bool(tasks)
                free = max(0, (concurrency or engine.pool.max_workers) - len(tasks))
                if free and time.monotonic() - scanned >= SETTLED_SCAN_SECONDS:
                    try:
                        settled.update(await engine.store.aio.runs_with_settled_wait())
                    except Exception as exc:  # noqa: BLE001 - reported, retried next scan
                        self._said("looking for settled waits", exc)
                    scanned = time.monotonic()
                if free:
                    for coro in await self._claims(free, settled):
                        task = asyncio.ensure_future(one(coro))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                        handled += 1
                        busy = True
                if time.monotonic() >= prune_at:
                    await self._finish_cuts()
                    delay = min(await self._prune_batch(), await self._forget_counts())
                    prune_at = time.monotonic() + delay
                    busy = busy or delay == 0  # more ended runs are due: not idle yet
                if busy:
                    idle_since = time.monotonic()
                elif idle_exit_seconds is not None and time.monotonic() - idle_since > idle_exit_seconds:
                    break
                wait, lines = self.outage.round_ended(poll_seconds)
                for line in lines:
                    print(line, file=sys.stderr, flush=True)
                await self.pause(stop, nudge, wait)
        finally:
            engine.events.notices.handlers.remove(heard)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        return handled

    async def _prune_batch(self) -> float:
        """Forget one batch of ended runs past their [retention] days; seconds until the next batch.

        One short transaction per batch; a full batch means more are due, so the next comes next round.
        A store failure here is the next round's business, never the worker's end.
        """
        from tether._store.retention import prune

        engine = self.engine
        retention = engine.config.retention if engine.config is not None else None
        if retention is None:
            return float("inf")
        try:
            report = await engine.store.aio.call(prune, engine.store, retention.rules(), engine.clock(),
                                                 limit=retention.batch)
        except Exception as exc:  # noqa: BLE001 - reported, retried next round
            print(f"tether worker: retention prune failed: {exc}", file=sys.stderr, flush=True)
            return retention.every_seconds
        return 0.0 if report.runs >= retention.batch else retention.every_seconds

    async def _finish_cuts(self) -> None:
        """Finish the ends whose process stopped half way (P-53); a store failure is the next round's business."""
        try:
            await finish_cuts(self.engine)
        except Exception as exc:  # noqa: BLE001 - reported, retried next round
            print(f"tether worker: finishing interrupted ends failed: {exc}", file=sys.stderr, flush=True)

    async def _forget_counts(self) -> float:
        """Delete one batch of quota counters no window reaches any more, with or without [retention]
        (usage.forget_counts); seconds until the next batch, 0 when more are due."""
        from tether._store import usage
        from tether._store._schema import SQLStore

        engine = self.engine
        if not isinstance(engine.store, SQLStore):
            return MAINTENANCE_SECONDS  # a backend without SQL keeps no quota counters (usage.create_counted)
        retention = engine.config.retention if engine.config is not None else None
        every = retention.every_seconds if retention is not None else MAINTENANCE_SECONDS
        quotas = engine.settings.quotas
        longest = quotas.longest_period() if quotas is not None else 0.0
        try:
            gone = await engine.store.aio.call(usage.forget_counts, engine.store, engine.clock(), longest)
        except Exception as exc:  # noqa: BLE001 - reported, retried next round
            print(f"tether worker: forgetting old quota counters failed: {exc}", file=sys.stderr, flush=True)
            return every
        return 0.0 if gone >= usage.FORGET_BATCH else every

    async def _settled_runs(self, settled: set[str], free: int) -> list[Awaitable[Any]]:
        """Wake-ups for parked runs whose wait was settled elsewhere; wake() claims each by compare-and-set."""
        from tether._store.states import RunStatus, WaitStatus

        engine = self.engine
        out: list[Awaitable[Any]] = []
        while settled and len(out) < free:
            run = await engine.store.aio.get_run(settled.pop())
            key = (run.pending or {}).get("key") if run is not None and run.status == RunStatus.WAITING else None
            wait = await engine.store.aio.get_wait(key) if key else None
            if (run is not None and wait is not None and wait.status != WaitStatus.PENDING
                    and await self._available(run)):
                out.append(launcher.wake(engine, run.run_id, key=key))
        return out

    async def _available(self, run: RunRecord) -> bool:
        """Whether this worker can load the run's sources; said once per run on stderr when not."""
        from tether.errors import RunTampered, ToolsUnavailable, WrongSecret

        try:
            await self.engine.require_sources(run)
            return True
        except (RunTampered, WrongSecret):
            # Nothing was loaded for it; claiming it takes the usual path, which vets the run
            # (a tampered run ends run_tampered, one signed with another secret is left alone).
            return True
        except ToolsUnavailable as exc:
            if run.run_id not in self.reported:
                self.reported.add(run.run_id)
                print(f"tether worker: {exc.message}", file=sys.stderr, flush=True)
            return False

    async def _orphans_taken(self, room: Callable[[], bool], usable: Callable[[RunRecord], Awaitable[bool]],
                             quarantined: Callable[[RunResult], None] | None = None) -> AsyncIterator[RunRecord]:
        """Running runs whose owner died, taken over here one at a time while there is ``room`` (P-11).

        Those whose lease lapsed are claimed by compare-and-set (Postgres: SKIP LOCKED) and
        handed back if not ``usable`` here; those of a process known gone from this host are
        taken from that owner at once, lease or not. Each is yielded as it is now, owned here,
        with this takeover recorded on it; one taken over too many times in a row is ended
        ``run_quarantined`` instead and handed to ``quarantined`` (P-39).
        """
        engine = self.engine
        life = engine.lifecycle
        async for before in claimed(room, life.claim_orphan, usable, life.release_orphan):
            run = await engine.store.aio.get_run(before.run_id)
            if run is not None:
                run = await self._counted(run, before.owner, "lease_lapsed", quarantined)
            if run is not None:
                yield run
        for gone in launcher.gone_owners(engine) if room() else []:
            if room() and await usable(gone) and life.take_over(gone.run_id, gone_owner=gone.owner):
                run = await engine.store.aio.get_run(gone.run_id)
                if run is not None:
                    run = await self._counted(run, gone.owner, "process_gone", quarantined)
                if run is not None:
                    yield run

    async def _counted(self, run: RunRecord, gone_owner: str | None, how: str,
                       quarantined: Callable[[RunResult], None] | None) -> RunRecord | None:
        from tether._engine.rules.quarantine import continue_or_quarantine

        going_on, ended = await continue_or_quarantine(self.engine, run, gone_owner=gone_owner, how=how)
        if ended is not None and (ended.error or {}).get("code") == "run_quarantined":
            error = ended.error or {}
            print(f"tether: run {run.run_id} quarantined ({error.get('code')}): "
                  f"{len(error.get('details', {}).get('attempts', []))} attempts in a row ended with their process "
                  "gone", file=sys.stderr, flush=True)
        if ended is not None and quarantined is not None:
            quarantined(ended)
        return going_on

    def _said(self, what: str, exc: Exception) -> None:
        """A failure of this round: on stderr with its error code the first time in an outage, else counted (D-92);
        the worker goes on."""
        line = self.outage.failed(what, exc)
        if line is not None:
            print(line, file=sys.stderr, flush=True)

    async def _claims(self, free: int, settled: set[str] | None = None) -> list[Awaitable[Any]]:
        """Coroutines for work this worker may take now, most urgent first.

        A run whose sources cannot be loaded here is left as it is (P-30) for a
        process that has them. A store that fails ends the round, never the worker: what was claimed
        before the failure is returned (its attempts have started), and the next round tries again.
        """
        out: list[Awaitable[Any]] = []
        try:
            await self._claim_into(out, free, settled)
        except Exception as exc:  # noqa: BLE001 - reported, retried next round
            self._said("claiming work", exc)
        return out

    async def _claim_into(self, out: list[Awaitable[Any]], free: int, settled: set[str] | None) -> None:
        from tether._store.states import RunStatus

        engine = self.engine
        life = engine.lifecycle
        try:
            expire(engine)
        except Exception as exc:  # noqa: BLE001 - reported, retried next round; the claims below go on
            self._said("expiring paused runs past their approval time to live", exc)
        # Runs a resolution is waiting for first: someone is waiting on them.
        if settled:
            out += await self._settled_runs(settled, free)

        def room() -> bool:
            return len(out) < free

        async def trusted_and_available(run: RunRecord) -> bool:
            # Vetted before it is taken (P-35): a tampered run ends failed here (giving it back then
            # changes nothing); one signed with a secret not held here, or whose sources are not here,
            # goes back as it was, for a process that has them. Every kind of claim below passes here.
            return launcher.vet(engine, run)[0] and await self._available(run)

        # Orphans first: their writes wait on us.
        async for run in self._orphans_taken(room, trusted_and_available):
            out.append(launcher.launch(engine, run, mode="continue").result())
        # Due timers and wait deadlines, the same way.
        async for run in claimed(room, life.claim_due, trusted_and_available,
                                 lambda r: life.unclaim(r, RunStatus.WAITING)):
            out.append(launcher.launch(engine, run, mode="continue").result())
        # Queued runs, oldest first; one this process cannot load the sources of goes back in the queue.
        async for run in claimed(room, life.claim_queued, trusted_and_available,
                                 lambda r: life.unclaim(r, RunStatus.QUEUED)):
            out.append(launcher.launch(engine, run, mode="fresh").result())

    # -- the same duties, once, on demand (Runtime.recover, tether recover; tests) --------------

    async def recover(self) -> list[RunResult]:
        """Continue runs whose owner died: lease expired, or its process on this host is gone (P-11); finish the
        ends such an owner left half done (P-53)."""
        engine = self.engine
        out: list[RunResult] = []

        async def usable(run: RunRecord) -> bool:
            return await self._usable(run, out)

        async for run in self._orphans_taken(lambda: True, usable, out.append):
            out.append(await launcher.launch(engine, run, mode="continue").result())
        # Ends cut in half (a cancel or an expiry recorded, the pause's writes not yet settled): finished (P-53).
        out += await finish_cuts(engine)
        return out

    async def _usable(self, run: RunRecord, out: list[RunResult], *, reported_as: RunStatus | None = None) -> bool:
        """Whether this process can run ``run``: a tampered run ends failed (its envelope into ``out``); one
        signed with another secret, or whose sources cannot be loaded here, is left to a process that can
        (noted in ``out`` as ``reported_as``, else as it is)."""
        trusted, ended = launcher.vet(self.engine, run)
        if not trusted:
            if ended is not None:
                out.append(ended)
            return False
        shown = run if reported_as is None else dataclasses.replace(run, status=reported_as)
        return await launcher.sources_or_note(self.engine, shown, out)

    async def run_queued(self, limit: int = 1) -> list[RunResult]:
        """Claim up to ``limit`` queued runs (oldest first) and run them here."""
        from tether._store.states import RunStatus

        engine = self.engine
        out: list[RunResult] = []

        async def usable(run: RunRecord) -> bool:
            # Reported as it stays: back in the queue for a process that can load its sources.
            return await self._usable(run, out, reported_as=RunStatus.QUEUED)

        async for run in claimed(lambda: len(out) < limit, engine.lifecycle.claim_queued, usable,
                                 lambda r: engine.lifecycle.unclaim(r, RunStatus.QUEUED)):
            out.append(await launcher.launch(engine, run, mode="fresh").result())
        return out


async def _pause(stop: asyncio.Event, nudge: asyncio.Event, seconds: float) -> None:
    """Until the next round: ``seconds``, or less if stopped or nudged by a notice."""
    waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(nudge.wait())}
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        nudge.clear()


async def claimed(room: Callable[[], bool], claim: Callable[[Sequence[str]], RunRecord | None],
                  usable: Callable[[RunRecord], Awaitable[bool]],
                  give_back: Callable[[RunRecord], object]) -> AsyncIterator[RunRecord]:
    """Runs claimed one at a time while there is ``room``, each one this process can run.

    ``claim(skip)`` is a compare-and-set claim (tether._engine.lifecycle), so
    replicas claiming at once never get the same run. A claimed run that is
    not ``usable`` here is given back and skipped for this round, for a
    process that can run it.
    """
    skip: list[str] = []
    while room():
        run = claim(skip)
        if run is None:
            return
        if not await usable(run):
            give_back(run)
            skip.append(run.run_id)
            continue
        yield run


# -- one worker per home, started on demand ---------------------------------------


def pid_file(home: Path) -> Path:
    return home / "worker.pid"


def worker_alive(home: Path) -> int | None:
    """The pid of a live worker for this home, if any."""
    try:
        pid = int(pid_file(home).read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid
