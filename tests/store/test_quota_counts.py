"""The runs_per_period quota counted from per-principal time buckets (D-54, store migration 12), on SQLite
and Postgres: it refuses at its limit and admits once the window has moved (a clock moved, never slept);
two starts racing for the last slot through two store connections let at most one through; a store
upgraded from schema version 11 keeps the count of the runs already in the period; a prune forgets old
buckets; concurrent_runs is refused in the same transaction; and the bucketed count is never below the
exact count of runs in the window, nor above it by more than one bucket's runs.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import Clock, Recorder, StoreBackend, each_store_backend, store_backend_params
from tether._engine.rules.policy import Policy
from tether._engine.rules.quotas import CountedStart, Quota, Quotas
from tether._runtime import Runtime
from tether._store import Conflict, _migrations, open_store, usage
from tether._store.base import RunRecord
from tether.errors import QuotaExceeded

T0 = 1_800_000_000.0


class Backend(StoreBackend):
    def runtime(self, quota: Quota, clock: Clock) -> Runtime:
        return Runtime(store=self.store(), tools=Recorder().tools(), type_check=False, clock=clock,
                       policy=Policy(writes="allow"), quotas=Quotas(default=quota))


@pytest.fixture(params=store_backend_params())
def backend(request, tmp_path, monkeypatch):
    yield from each_store_backend(request, tmp_path, monkeypatch, Backend)


def _run(at: float, principal: str = "local") -> RunRecord:
    return RunRecord(run_id=f"run_{uuid.uuid4().hex[:16]}", status="queued", program="1", environment={}, policy={},
                     limits={}, created_at=at, updated_at=at, principal=principal, meta={})


async def test_the_quota_refuses_at_its_limit_and_admits_once_the_window_moves(backend):
    clock = Clock(T0)
    async with backend.runtime(Quota(runs_per_period=3, period_seconds=60), clock) as rt:
        for step in range(3):
            clock.now = T0 + 10 * step
            rt.start("1")
        clock.now = T0 + 30
        with pytest.raises(QuotaExceeded) as exc:
            rt.start("1")
        assert exc.value.to_dict()["details"] == {"quota": "runs_per_period", "limit": 3, "used": 3}
        assert rt.store.count_runs() == 3
        # The refused start counted nothing: 3 runs in three 1 s buckets (60 s / 60).
        assert backend.sql("SELECT SUM(runs), COUNT(*) FROM run_counts") == [(3, 3)]
        # Half a second past the first run's 60 s its bucket [T0, T0 + 1) still overlaps the window:
        # counted (conservatively) though the exact count is 2.
        clock.now = T0 + 60.5
        with pytest.raises(QuotaExceeded):
            rt.start("1")
        # Once its whole bucket is out of the window, there is room again; another principal never waited.
        clock.now = T0 + 61
        rt.start("1")
        rt.start("1", principal="someone-else")
        with pytest.raises(QuotaExceeded):
            rt.start("1")
        assert rt.store.count_runs() == 5


def test_two_starts_racing_for_the_last_slot_let_one_through(backend):
    quota = Quota(runs_per_period=1, period_seconds=3600)
    counted = CountedStart(quota, T0 - 3600)
    width = usage.bucket_width(quota.period_seconds)
    first, second = backend.store(), backend.store()  # two connections, as two replicas have
    outcome: dict[str, Any] = {}

    def the_other_replica() -> None:
        try:
            counted.create(second, _run(T0))
            outcome["second"] = "created"
        except QuotaExceeded as exc:
            outcome["second"] = exc.to_dict()["details"]

    other = threading.Thread(target=the_other_replica)

    def admit_then_let_the_other_try(active: int, started: int) -> None:
        counted.admit(active, started)  # 0 runs: admitted; its run is not yet committed
        other.start()
        # The other start runs its whole check now unless it waits for this transaction (D-54's lock).
        other.join(timeout=1.0)

    try:
        usage.create_counted(first, _run(T0), counted.since, width, admit_then_let_the_other_try)
        other.join()
        assert outcome["second"] == {"quota": "runs_per_period", "limit": 1, "used": 1}
        assert first.count_runs() == 1
        assert backend.sql("SELECT runs FROM run_counts") == [(1,)]
    finally:
        first.close()
        second.close()


def test_a_counted_start_that_fails_or_is_refused_writes_nothing_and_leaves_the_store_usable(backend):
    # On Postgres the counted start is a pipeline of its own (BEGIN, the lock and the statement in one flight,
    # COMMIT or ROLLBACK in the next): a statement failing on the server, or a refusal, must end that
    # transaction and give the connection back as it found it.
    quota = Quota(runs_per_period=5, period_seconds=3600)
    counted = CountedStart(quota, T0 - 3600)
    width = usage.bucket_width(quota.period_seconds)
    store = backend.store()
    try:
        run = _run(T0)
        usage.create_counted(store, run, counted.since, width, counted.admit)
        with pytest.raises(Conflict):  # the same run id again: the insert fails on the server
            usage.create_counted(store, run, counted.since, width, counted.admit)

        def refuse(active: int, started: int) -> None:
            raise QuotaExceeded("refused by the test")

        with pytest.raises(QuotaExceeded):
            usage.create_counted(store, _run(T0), counted.since, width, refuse)
        assert store.count_runs() == 1
        assert backend.sql("SELECT runs FROM run_counts") == [(1,)]
        usage.create_counted(store, _run(T0), counted.since, width, counted.admit)  # the connection still works
        assert store.count_runs() == 2
    finally:
        store.close()


def test_a_version_11_store_upgrades_keeping_the_count_of_the_runs_in_its_period(backend):
    store = backend.store()
    try:
        for at in (T0 - 4000, T0 - 3630, T0 - 100, T0 - 99, T0 - 1):  # three in the last hour
            store.create_run(_run(at))
        store.create_run(_run(T0 - 50, principal="other"))
    finally:
        store.close()
    # Back to version 11, as the previous release left it: no run_counts table.
    backend.sql("DROP TABLE run_counts")
    # Later versions' tables and columns too (14: lineage, P-45), which are applied again.
    backend.sql("DROP TABLE lineage_marks")
    backend.sql("ALTER TABLE calls DROP COLUMN lineage")
    backend.sql("DROP TABLE outbox_watermarks")  # 15: webhook watermarks (D-81)
    backend.sql("DELETE FROM schema_version WHERE version >= 12")  # and 13's indexes, gone with the table
    store = backend.store()
    try:
        assert store.schema_version() == len(_migrations.MIGRATIONS)
        assert usage.started_in_window(store, "local", T0 - 3600) == 3
        assert usage.started_in_window(store, "other", T0 - 3600) == 1
        counted = CountedStart(Quota(runs_per_period=3), T0 - 3600)
        with pytest.raises(QuotaExceeded) as exc:
            counted.create(store, _run(T0))
        assert exc.value.to_dict()["details"]["used"] == 3
        CountedStart(Quota(runs_per_period=4), T0 - 3600).create(store, _run(T0))
        assert usage.started_in_window(store, "local", T0 - 3600) == 4
    finally:
        store.close()


def test_a_prune_forgets_the_buckets_past_the_shortest_retention(backend):
    from tether._store.retention import RetentionRules, prune, stats

    store = backend.store()
    try:
        counted = CountedStart(Quota(runs_per_period=100), 0.0)
        for at in (T0 - 3 * 86400, T0 - 60):
            counted.create(store, _run(at))
        rules = RetentionRules({"completed": 1})
        assert stats(store, rules, T0)["rows"]["run_counts"] == 2  # `tether store stats` shows the counters
        prune(store, rules, T0)
        assert backend.sql("SELECT ends_at FROM run_counts") == [(T0,)]
        assert stats(store, rules, T0)["rows"]["run_counts"] == 1
    finally:
        store.close()


NO_RETENTION = {"retention": {"completed_days": 0, "failed_days": 0, "cancelled_days": 0}}


async def test_without_retention_the_runners_maintenance_forgets_the_buckets_no_window_reaches(backend):
    """Months of starts with no [retention] days leave only the buckets a window can still count."""
    import dataclasses

    from tether._config import Config
    from tether._engine.worker import Worker

    clock = Clock(T0)
    async with backend.runtime(Quota(runs_per_period=3, period_seconds=60), clock) as rt:
        # The engine as `tether serve` opens it from a config with no [retention] days.
        worker = Worker(dataclasses.replace(rt.engine, config=Config.from_dict(NO_RETENTION)))
        for day in range(30, 0, -1):  # a month, a start a day: a bucket each
            clock.now = T0 - day * 86400
            rt.start("1")
        for step in range(3):
            clock.now = T0 + 10 * step
            rt.start("1")
        clock.now = T0 + 30
        await worker.work(idle_exit_seconds=0)
        # The three buckets inside the window are kept, so the quota refuses exactly as before ...
        assert backend.sql("SELECT ends_at FROM run_counts ORDER BY ends_at") == [(T0 + 1,), (T0 + 11,), (T0 + 21,)]
        with pytest.raises(QuotaExceeded) as exc:
            rt.start("1")
        assert exc.value.to_dict()["details"]["used"] == 3
        # ... and admits exactly as before once the first whole bucket has left the window.
        clock.now = T0 + 60.5
        with pytest.raises(QuotaExceeded):
            rt.start("1")
        clock.now = T0 + 61
        rt.start("1")
        # A month on, with no start since, nothing is left.
        clock.now = T0 + 30 * 86400
        await worker.work(idle_exit_seconds=0)
        assert backend.sql("SELECT COUNT(*) FROM run_counts") == [(0,)]
        assert rt.store.count_runs() == 34  # the runs are [retention]'s business: all kept


def test_forgetting_keeps_what_the_longest_window_of_any_replica_can_count(backend):
    """A bucket goes once it ended before this process's longest period and BUCKETS times the widest bucket
    stored (another replica's longer period), plus FORGET_SLACK; in batches of ``limit``."""
    store = backend.store()
    try:
        hourly = CountedStart(Quota(runs_per_period=100, period_seconds=3600), 0.0)
        for age in (3600 + usage.FORGET_SLACK + 61, 3600 + usage.FORGET_SLACK + 122, 3600 + usage.FORGET_SLACK - 60):
            hourly.create(store, _run(T0 - age))
        # This process counts in an hour: the two buckets past the hour and the slack go, one per batch.
        assert usage.forget_counts(store, T0, 3600.0, limit=1) == 1
        assert usage.forget_counts(store, T0, 3600.0, limit=1) == 1
        assert usage.forget_counts(store, T0, 3600.0, limit=1) == 0
        assert backend.sql("SELECT COUNT(*) FROM run_counts") == [(1,)]
        # A replica counting in days started a run: its wide bucket keeps the hourly ones a day.
        CountedStart(Quota(runs_per_period=100, period_seconds=86400), 0.0).create(store, _run(T0))
        hourly.create(store, _run(T0 - 7200))
        assert usage.forget_counts(store, T0, 3600.0) == 0
        assert usage.started_in_window(store, "local", T0 - 86400) == 3
        # A process with no runs_per_period quota (longest period 0) keeps them as long.
        assert usage.forget_counts(store, T0 + 86400 - 7200, 0.0) == 0
        assert usage.forget_counts(store, T0 + 2 * 86400 + usage.FORGET_SLACK, 0.0) == 3
    finally:
        store.close()


@pytest.fixture(scope="module")
def lite(tmp_path_factory):
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('buckets')}/tether.db")
    yield store
    store.close()


@settings(max_examples=200, deadline=None)
@given(period=st.floats(min_value=1.0, max_value=86400.0),
       ages=st.lists(st.floats(min_value=0.0, max_value=2 * 86400.0), max_size=40),
       widths=st.sampled_from([None, 60.0]))
def test_the_bucketed_count_is_never_below_the_exact_count(lite, period, ages, widths):
    """Ages are seconds before now; with ``widths`` 60 some runs were counted as a backfill counts them."""
    now = T0 + 0.37
    width = usage.bucket_width(period)
    with lite._transaction(write=True) as tx:
        tx.run("DELETE FROM run_counts")
        for i, age in enumerate(ages):
            w = widths if widths is not None and i % 2 else width
            tx.run(usage._BUMP, ("p", usage.bucket_end(now - age, w), w))
    since = now - period
    counted = usage.started_in_window(lite, "p", since)
    exact = sum(1 for age in ages if now - age >= since)
    widest = max(width, widths or 0.0)
    assert exact <= counted <= exact + sum(1 for age in ages if since - widest <= now - age < since)


async def test_concurrent_runs_is_checked_in_the_same_transaction_when_runs_per_period_is_set(backend):
    clock = Clock(T0)
    async with backend.runtime(Quota(concurrent_runs=2, runs_per_period=100), clock) as rt:
        rt.start("1")
        rt.start("2")
        with pytest.raises(QuotaExceeded) as exc:
            rt.start("3")
        assert exc.value.to_dict()["details"] == {"quota": "concurrent_runs", "limit": 2, "used": 2}
        assert rt.store.count_runs() == 2
        assert backend.sql("SELECT SUM(runs) FROM run_counts") == [(2,)]  # the refused start counted nothing
