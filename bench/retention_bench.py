"""Running for months: store growth and what retention gives back; metrics' cost; the largest state a pause saves.

1. Growth: R runs, each a 30-write program with 500 KB arguments (a long-running deployment's shape, halved to fit the
   default journal limits), on SQLite: store size, `store stats` time, pruning them all in batches of 2,
   the file before and after `VACUUM`.
2. Metrics: a `/metrics` rendering (counters plus the store read at scrape) on that store, and the cost
   of timing one store transaction.
3. Saving: the largest string a program can hold under the default 64 MiB limit and still pause
   (a dump needs room beside the state, P-41), found by bisection over fresh runs.

    python bench/retention_bench.py [--quick] [--json]   (--json: the JSON line alone)

Nothing here asserts on time; the figures are printed (and with --json, one JSON line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

_SRC = Path(__file__).resolve().parent.parent / "src"
if _SRC.is_dir() and str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))

from tether._engine.rules.policy import Policy, Rule  # noqa: E402
from tether._metrics import render, timed_store_call  # noqa: E402
from tether._runtime import Runtime  # noqa: E402
from tether._sources.python import tool  # noqa: E402
from tether._store import open_store  # noqa: E402
from tether._store.retention import DAY, RetentionRules, live_counts, prune_all, stats  # noqa: E402

WRITES = "import tools\nfor i in range(30):\n    await tools.bench.put(id=i, body='x' * 500000)\n'ok'"


@tool(namespace="bench")
async def put(id: int, body: str) -> int:
    """Store a record."""
    return len(body)


@tool(namespace="bench")
async def guarded(id: int) -> int:
    """A write that asks."""
    return id


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def growth(tmp: Path, runs: int) -> dict:
    clock = Clock()
    path = tmp / "growth.db"
    store = open_store(f"sqlite:///{path}")
    out: dict = {}
    async with Runtime(store=store, tools=[put], type_check=False, clock=clock,
                       policy=Policy(writes="allow", write_budget=100)) as rt:
        t = time.perf_counter()
        for _ in range(runs):
            r = await rt.execute(WRITES)
            assert r.status == "completed", r.error
        out["runs"], out["seconds"] = runs, round(time.perf_counter() - t, 2)
        out["store_mb"] = round(store.store_size_bytes() / 1e6, 1)
        scrapes = []
        for _ in range(20):
            t = time.perf_counter()
            render(rt, live_counts)
            scrapes.append(time.perf_counter() - t)
        out["scrape_ms_p50"] = round(statistics.median(scrapes) * 1000, 2)
        rules = RetentionRules({"completed": 30})
        later = clock.now + 31 * DAY
        t = time.perf_counter()
        s = stats(store, rules, later)
        out["stats_ms"] = round((time.perf_counter() - t) * 1000, 1)
        out["would_free_mb"] = round(s["prune"]["bytes"] / 1e6, 1)
        t = time.perf_counter()
        report = prune_all(store, rules, later, batch=2)
        out["prune_ms"] = round((time.perf_counter() - t) * 1000, 1)
        out["pruned_runs"], out["pruned_calls"] = report.runs, report.calls
    store.close()
    out["file_mb_after_prune"] = round(sum(os.path.getsize(f"{path}{s}") for s in ("", "-wal", "-shm")
                                           if os.path.exists(f"{path}{s}")) / 1e6, 1)
    conn = sqlite3.connect(path)
    t = time.perf_counter()
    conn.execute("VACUUM")
    conn.close()
    out["vacuum_ms"] = round((time.perf_counter() - t) * 1000, 1)
    out["file_mb_after_vacuum"] = round(os.path.getsize(path) / 1e6, 2)
    n = 200_000
    t = time.perf_counter()
    for _ in range(n):
        with timed_store_call(True):
            pass
    out["timed_transaction_us"] = round((time.perf_counter() - t) / n * 1e6, 2)
    return out


async def largest_pausable(tmp: Path) -> dict:
    """Bisect (in MB) the largest string a run holds and still pauses under the default limit."""
    policy = Policy(writes="allow", rules=(Rule("bench.guarded", "ask"),))

    async def pauses(mb: int) -> bool:
        store = open_store(f"sqlite:///{tmp}/pause-{mb}.db")
        async with Runtime(store=store, tools=[guarded], type_check=False, policy=policy) as rt:
            r = await rt.execute(f"import tools\nbig = 'x' * ({mb} * 1000 * 1000)\n"
                                 "await tools.bench.guarded(id=1)\nlen(big)")
        store.close()
        return r.status == "paused"

    lo, hi = 1, 64  # pauses at lo; not at hi (64 MB cannot even be held)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await pauses(mid):
            lo = mid
        else:
            hi = mid
    return {"largest_pausable_mb": lo, "first_refused_mb": hi}


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        result = {"growth": await growth(tmp, 2 if args.quick else 5), "saving": await largest_pausable(tmp)}
    g, s = result["growth"], result["saving"]
    if not args.json:
        print(f"growth: {g['runs']} runs x 30 writes x 500 KB in {g['seconds']} s -> {g['store_mb']} MB")
        print(f"store stats {g['stats_ms']} ms (would free {g['would_free_mb']} MB); prune {g['pruned_runs']} runs "
              f"/ {g['pruned_calls']} calls in batches of 2: {g['prune_ms']} ms")
        print(f"file after prune {g['file_mb_after_prune']} MB; VACUUM {g['vacuum_ms']} ms -> "
              f"{g['file_mb_after_vacuum']} MB")
        print(f"/metrics rendering p50 {g['scrape_ms_p50']} ms; timing one store transaction "
              f"{g['timed_transaction_us']} us")
        print(f"largest string that still pauses under 64 MiB: {s['largest_pausable_mb']} MB "
              f"({s['first_refused_mb']} MB fails memory_limit, nothing sent)")
    # Every bench ends with its JSON line (run_all reads it; a bench without one counts as crashed).
    print(json.dumps({"bench": "retention", "quick": args.quick, **result, "targets": []}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
