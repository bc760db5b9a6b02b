"""What migration 13's two run_counts indexes cost a start, and what one batch of forgetting old counters costs.

Migration 13 indexes ``run_counts`` on ``ends_at`` and on ``width`` so that the runner's maintenance can delete
the counters no window reaches (``usage.forget_counts``, D-56). An index is written when a counter
row is inserted, once per principal and bucket; the other starts only add to ``runs``, which no index holds.
This probe takes the worst case, every start a new row (each start a principal of its own), on two stores of
one backend side by side: ``before`` with the two indexes dropped, ``after`` as migrated. Alternating
batches, the first of each uncounted; per start the wall p50 and this process's CPU, medians over the batches.

Then the maintenance: ``--counters`` rows of 20 principals, all past every window, deleted by
``forget_counts`` one batch (1,000 rows, its own transaction) at a time: the median and worst batch.

    python bench/quota_forget_probe.py [--batches 8] [--starts 200] [--counters 200000] [--no-postgres]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

import common  # puts this checkout's src first on sys.path; postgres_cluster
from tether._engine.rules.quotas import CountedStart, Quota
from tether._store import open_store, usage
from tether._store.base import RunRecord

PERIOD = 3600.0
INDEXES = ("run_counts_ends_at", "run_counts_width")


def _run(principal: str) -> RunRecord:
    now = time.time()
    return RunRecord(run_id=f"run_{uuid.uuid4().hex[:16]}", status="queued", program="1", environment={}, policy={},
                     limits={}, created_at=now, updated_at=now, principal=principal, meta={})


def starts(stores: dict[str, Any], batches: int, n: int) -> dict[str, dict[str, float]]:
    quota = Quota(runs_per_period=10_000_000, period_seconds=PERIOD)
    got: dict[str, dict[str, list[float]]] = {w: {"wall": [], "cpu": []} for w in stores}
    for b in range(batches + 1):
        for name in (list(stores) if b % 2 else list(stores)[::-1]):
            store, runs, walls = stores[name], [_run(f"p-{uuid.uuid4().hex}") for _ in range(n)], []
            cpu0 = time.process_time()
            for run in runs:
                t0 = time.perf_counter()
                CountedStart(quota, time.time() - PERIOD).create(store, run)
                walls.append(time.perf_counter() - t0)
            cpu = time.process_time() - cpu0
            if b:
                got[name]["wall"].append(statistics.median(walls) * 1e6)
                got[name]["cpu"].append(cpu / n * 1e6)
    return {w: {k: statistics.median(v) for k, v in d.items()} for w, d in got.items()}


def forgetting(store: Any, counters: int) -> tuple[float, float, int]:
    old = time.time() - 30 * 86400
    with store._transaction(write=True) as tx:
        tx.run("DELETE FROM run_counts")
        for i in range(counters):
            tx.run(usage._BUMP, (f"p-{i % 20}", old + (i // 20) * 60.0, 60.0))
    times = []
    while True:
        t0 = time.perf_counter()
        gone = usage.forget_counts(store, time.time(), PERIOD)
        times.append(time.perf_counter() - t0)
        if gone < usage.FORGET_BATCH:
            return statistics.median(times) * 1e3, max(times) * 1e3, len(times)


def probe(kind: str, open_one: Any, args: argparse.Namespace) -> None:
    stores = {"before": open_one("before"), "after": open_one("after")}
    try:
        with stores["before"]._transaction(write=True) as tx:
            for index in INDEXES:
                tx.run(f"DROP INDEX {index}")
        res = starts(stores, args.batches, args.starts)
        b, a = res["before"], res["after"]
        print(f"{kind:8} a start making a new counter: wall p50 {b['wall']:6.0f} -> {a['wall']:6.0f} µs "
              f"({a['wall'] / b['wall']:.2f}), cpu {b['cpu']:6.0f} -> {a['cpu']:6.0f} µs ({a['cpu'] / b['cpu']:.2f})",
              flush=True)
        median, worst, n = forgetting(stores["after"], args.counters)
        print(f"{kind:8} forgetting {args.counters} old counters: {n} batches, median {median:.1f} ms, "
              f"worst {worst:.1f} ms", flush=True)
    finally:
        for store in stores.values():
            store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--starts", type=int, default=200)
    p.add_argument("--counters", type=int, default=200_000)
    p.add_argument("--no-postgres", action="store_true")
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.batches} batches of {args.starts} starts a way", flush=True)
    with tempfile.TemporaryDirectory(prefix="tether-forget-") as tmp:
        probe("sqlite", lambda name: open_store(f"sqlite:///{tmp}/{name}.db"), args)
    if args.no_postgres:
        return
    from tether._store.postgres import PostgresStore

    with common.postgres_cluster() as cluster:
        if cluster is None:
            return
        probe("postgres", lambda name: PostgresStore(cluster.url, schema=f"forget_{name}", pool_size=1), args)
    print(f"load average {os.getloadavg()[0]:.2f} at the end", flush=True)


if __name__ == "__main__":
    main()
