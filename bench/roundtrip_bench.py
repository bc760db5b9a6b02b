"""Round trips: what one run asks of its store — transactions, statements and, on Postgres, round trips.

Counted by the store itself (``store.traffic``, held to the wire by
tests/store/test_store_traffic.py), as the difference across each step on a warm
runtime with nothing else running, so the figures are exact counts, not
timings: the machine's load does not move them. Steps:

- ``read x10``: the core program (10 sequential reads of a read-only tool);
- ``write asked → pause``: one write under the default policy (ask), executed until it pauses;
- ``resume (approve)``: that run resumed with an approval until it completes;
- ``approved write, whole run``: the two above together;
- ``write allowed``: the same write under a policy that allows it (no pause);
- ``cell``: the core program started as a cell (``start_cell``) and followed with ``wait_cell`` to its end.

On SQLite (a file, the default store) and on Postgres (a throwaway cluster,
tests/pg.py, when PostgreSQL's binaries are installed; ``--pg-url`` for
another). Target: a 10-call read-only run costs at most 4 round
trips on Postgres.

    python bench/roundtrip_bench.py [--quick] [--repeat N] [--pg-url URL] [--no-pg]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable

import common
from common import EXPECTED, PROGRAM
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

WRITE = 'import tools\nr = await tools.bench.put(id=1, value="x")\nr["stored"]\n'
TARGET_READ_ROUND_TRIPS = 4
KEYS = ("transactions", "statements", "round_trips")


async def count(store: Any, step: Callable[[], Awaitable[Any]]) -> tuple[dict[str, int], Any]:
    before = store.traffic.snapshot()
    value = await step()
    after = store.traffic.snapshot()
    return {k: after[k] - before[k] for k in KEYS}, value


async def measure(open_one: Callable[[], Any], repeat: int) -> dict[str, dict[str, float]]:
    """Median counts per step over ``repeat`` runs after as many warm-up runs (psycopg prepares a
    statement on its fifth use on a connection: one wait, once, that the store does not count).

    The runtime under another policy has a store object of its own (the same database), so neither
    counts the other's work."""
    per: dict[str, list[dict[str, int]]] = {}
    store, store_allow = open_one(), open_one()
    async with (
        Runtime(store=store, tools=common.bench_tools()) as rt,
        Runtime(store=store_allow, tools=common.bench_tools(), policy=Policy(writes="allow")) as rt_allow,
    ):

        async def read() -> Any:
            r = await rt.execute(PROGRAM)
            assert r.status == "completed" and r.result == EXPECTED, r.error
            return r

        async def write_paused() -> Any:
            r = await rt.execute(WRITE)
            assert r.status == "paused", r.error
            return r

        async def write_allowed() -> Any:
            r = await rt_allow.execute(WRITE)
            assert r.status == "completed" and r.result is True, r.error
            return r

        async def cell() -> Any:
            obs = await rt.start_cell(PROGRAM, yield_after_ms=1000)
            cursor = obs.get("cursor", 0)
            while obs["status"] == "running":
                obs = await rt.wait_cell(obs["cell_id"], after=cursor, timeout_ms=30_000)
                cursor = obs.get("cursor", cursor)
            assert obs["status"] == "completed", obs
            # The cell's attempt may still be storing its last event when wait_cell sees the end: wait for
            # the attempt to be over, so that write counts here and not in the next step (in CI, under
            # load, it landed in "read x10": 2 -> 7 round trips).
            for _ in range(5000):
                if not rt.engine.attempts.handles:
                    break
                await asyncio.sleep(0.001)
            return obs

        for i in range(2 * repeat):
            rows: dict[str, dict[str, int]] = {}
            rows["read x10"], _ = await count(store, read)
            rows["write asked -> pause"], paused = await count(store, write_paused)

            async def approve(run_id: str = paused.run_id) -> Any:
                r = await rt.resume(run_id, "approve")
                assert r.status == "completed" and r.result is True, r.error
                return r

            rows["resume (approve)"], _ = await count(store, approve)
            rows["approved write, whole run"] = {k: rows["write asked -> pause"][k] + rows["resume (approve)"][k]
                                                 for k in KEYS}
            rows["write allowed (policy allow)"], _ = await count(store_allow, write_allowed)
            rows["cell (start_cell + wait_cell to the end)"], _ = await count(store, cell)
            if i >= repeat:
                for name, c in rows.items():
                    per.setdefault(name, []).append(c)
    store.close()
    store_allow.close()
    return {name: {k: statistics.median(c[k] for c in cs) for k in KEYS} for name, cs in per.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    p.add_argument("--repeat", type=int, default=None, help="measured runs per step (default 7, 5 with --quick)")
    p.add_argument("--pg-url", default=None, help="a Postgres server to use instead of a throwaway cluster")
    p.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = p.parse_args()
    repeat = args.repeat or (5 if args.quick else 7)

    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite file"] = asyncio.run(measure(lambda: open_store(f"sqlite:///{tmp}/rt.db"), repeat))

    cluster = None
    pg_note = ""
    if not args.no_pg:
        import pg

        url = args.pg_url or os.environ.get("TETHER_TEST_PG_URL")
        if url is None and pg.missing_reason() is None:
            cluster = pg.start()
            url = cluster.url
        if url is None:
            pg_note = f"postgres skipped: {pg.missing_reason()}"
        else:
            from tether._store.postgres import PostgresStore

            schema = f"b_{uuid.uuid4().hex[:12]}"
            try:
                results["postgres"] = asyncio.run(measure(lambda: PostgresStore(url, schema=schema), repeat))
            finally:
                if cluster is not None:
                    cluster.stop()

    rows = []
    for backend, steps in results.items():
        for name, c in steps.items():
            rows.append({"backend": backend, "step": name, **c})
    print(common.table(rows, [("backend", "store"), ("step", "step"), ("transactions", "transactions"),
                              ("statements", "statements"), ("round_trips", "round trips")],
                       title=f"store work per step (median of {repeat} warm runs; exact counts, not timings)"))
    if pg_note:
        print(pg_note)
    targets = []
    if "postgres" in results:
        targets.append(common.target("Postgres round trips, 10-call read-only run",
                                     results["postgres"]["read x10"]["round_trips"], TARGET_READ_ROUND_TRIPS,
                                     "round trips"))
        print()
        print(common.table(targets, common.TARGET_COLUMNS))
    common.emit("roundtrip", args.quick, {"repeat": repeat, "rows": rows, "note": pg_note, "targets": targets})


if __name__ == "__main__":
    main()
