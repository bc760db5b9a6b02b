"""What a start's quota check costs with N runs in the period: the exact count against the bucketed one (D-54).

One process, one store per backend (a SQLite file; Postgres on a throwaway cluster, tests/pg.py, its pool
one connection so its backend's CPU can be read from /proc). The store holds N runs of one principal spread
over the last hour, and the quota buckets filled from them by migration 12's own backfill statement (what an
upgrade does). Then, in alternating batches on the same store:

- ``exact``: the start as it was at eae4c22 — ``usage.start_counts`` (the active and the period's runs
  counted from the runs table) then ``create_run``: two transactions;
- ``bucketed``: ``CountedStart.create`` — the principal's lock (Postgres), the active count and the
  buckets' sum in one statement, the run's insert and its bucket's increment: one transaction.

Each batch's runs are deleted after it (untimed, and on Postgres vacuumed), so N stays N. Reported per start: wall p50 (µs), this
process's CPU (µs) and, on Postgres, the backend's CPU (µs), each the median over the batches.

``QUOTA_PROBE_VACUUM=runs`` leaves the counters' dead row versions to pile up between batches, as a busy
server's would until autovacuum.

    python bench/quota_probe.py [--runs 1000 10000] [--batches 8] [--starts 100] [--no-postgres]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import common  # puts this checkout's src first on sys.path; postgres_cluster
from tether._engine.rules.quotas import CountedStart, Quota
from tether._store import open_store, usage
from tether._store._migrations import backfill_run_counts
from tether._store._rows import _INSERT_RUN, RUN_COLUMNS, _encode
from tether._store.base import RunRecord

PERIOD = 3600.0
# Tables vacuumed between batches on Postgres (run_counts left out: its counter rows churn as a server's would).
VACUUMED = os.environ.get("QUOTA_PROBE_VACUUM", "runs run_counts").split()
BUCKET_END = {"sqlite": "(CAST(created_at / 60 AS INTEGER) + 1) * 60", "postgres": "(FLOOR(created_at / 60) + 1) * 60"}


def _run(at: float, status: str = "queued") -> RunRecord:
    return RunRecord(run_id=f"run_{uuid.uuid4().hex[:16]}", status=status, program="1", environment={}, policy={},
                     limits={}, created_at=at, updated_at=at, principal="local", meta={})


def fill(store: Any, kind: str, n: int, now: float) -> None:
    with store._transaction(write=True) as tx:
        tx.run("DELETE FROM run_counts")
        tx.run("DELETE FROM runs")
        for i in range(n):
            run = _run(now - 1 - i * (PERIOD - 100) / n, "completed")  # ended: not counted as active
            tx.run(_INSERT_RUN, [_encode(RUN_COLUMNS, c, getattr(run, c)) for c in RUN_COLUMNS])
        tx.run(backfill_run_counts(BUCKET_END[kind]))
    if kind == "postgres":
        with store._transaction(write=False) as tx:
            tx.run("ANALYZE runs")
            tx.run("ANALYZE run_counts")


def _backend_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(store: Any, kind: str, n: int, batches: int, starts: int) -> dict[str, dict[str, float]]:
    quota = Quota(concurrent_runs=10_000_000, runs_per_period=10_000_000, period_seconds=PERIOD)
    now = time.time()
    fill(store, kind, n, now)
    pid = None
    if kind == "postgres":
        with store._transaction(write=False, single=True) as tx:
            pid = int(tx.run("SELECT pg_backend_pid()").fetchone()[0])

    def exact(run: RunRecord) -> None:
        usage.start_counts(store, "local", time.time() - PERIOD)
        store.create_run(run)

    def bucketed(run: RunRecord) -> None:
        CountedStart(quota, time.time() - PERIOD).create(store, run)

    ways: dict[str, Callable[[RunRecord], None]] = {"exact": exact, "bucketed": bucketed}
    got: dict[str, dict[str, list[float]]] = {w: {"wall": [], "cpu": [], "backend": []} for w in ways}
    for b in range(batches + 1):  # the first batch of each warms up, uncounted
        for name in (list(ways) if b % 2 else list(ways)[::-1]):
            runs = [_run(time.time()) for _ in range(starts)]
            walls = []
            cpu0, back0 = time.process_time(), _backend_cpu(pid)
            for run in runs:
                t0 = time.perf_counter()
                ways[name](run)
                walls.append(time.perf_counter() - t0)
            cpu, back = time.process_time() - cpu0, _backend_cpu(pid) - back0
            with store._transaction(write=True) as tx:
                for run in runs:
                    tx.run("DELETE FROM runs WHERE run_id = ?", (run.run_id,))
            if kind == "postgres":
                # What autovacuum would do between batches: the deleted runs' index entries and the
                # counter's dead row versions are not left to slow the next batch (either way).
                for table in VACUUMED:
                    with store._transaction(write=True, single=True) as tx:
                        tx.run(f"VACUUM {table}")
            if b:
                got[name]["wall"].append(statistics.median(walls) * 1e6)
                got[name]["cpu"].append(cpu / starts * 1e6)
                got[name]["backend"].append(back / starts * 1e6)
    return {w: {k: statistics.median(v) for k, v in d.items()} for w, d in got.items()}


def report(kind: str, n: int, res: dict[str, dict[str, float]]) -> None:
    e, b = res["exact"], res["bucketed"]
    line = (f"{kind:8} {n:>6} runs: exact wall p50 {e['wall']:7.0f} µs, cpu {e['cpu']:6.0f} µs"
            f" | bucketed wall p50 {b['wall']:7.0f} µs, cpu {b['cpu']:6.0f} µs"
            f" | wall ratio {b['wall'] / e['wall']:.2f}")
    if kind == "postgres":
        line += f" | backend cpu {e['backend']:5.0f} -> {b['backend']:5.0f} µs"
    print(line, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--starts", type=int, default=100)
    p.add_argument("--no-postgres", action="store_true")
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.batches} batches of {args.starts} starts a way", flush=True)
    with tempfile.TemporaryDirectory(prefix="tether-quota-") as tmp:
        store = open_store(f"sqlite:///{tmp}/tether.db")
        try:
            for n in args.runs:
                report("sqlite", n, measure(store, "sqlite", n, args.batches, args.starts))
        finally:
            store.close()
    if args.no_postgres:
        return
    from tether._store.postgres import PostgresStore

    with common.postgres_cluster() as cluster:
        if cluster is None:
            return
        store = PostgresStore(cluster.url, schema="quota_probe", pool_size=1)
        try:
            for n in args.runs:
                report("postgres", n, measure(store, "postgres", n, args.batches, args.starts))
        finally:
            store.close()
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
