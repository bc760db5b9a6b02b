"""Postgres 5 ms away: 50 concurrent read-only runs, store calls on the event loop against off it.

A throwaway Postgres (tests/pg.py, or --pg-url for a unix-socket or TCP
server) sits behind tests/latency_proxy.py, which delays every chunk 5 ms each
way. Each round starts 50 ``Runtime.execute`` calls at once, each program one
read of a Python tool marked read-only, and times until all have completed.

Contenders, measured in the same run, interleaved:

- ``inline``: every store call made on the event loop, as tether did before
  D-27 (the store's ``capabilities.offloads`` cleared): one run's round trip stalls all.
- ``offloaded_tx``: Postgres calls run in the store's thread pool, each
  thread on a connection of its own (D-27), every statement wrapped in BEGIN
  and COMMIT as before D-40 (the store's ``autocommit_single`` cleared; inline
  is so too);
- ``offloaded``: the default, as ``offloaded_tx`` but a store method that runs
  one statement runs it in autocommit (D-40): one round trip instead of three.

Targets, printed as met or missed, never asserted: offloaded ≥ 5× faster
than inline (D-27), i.e. inline/offloaded_tx p50 ≥ 5; round trips per run
are counted by the store (``store.traffic``) and shown beside the times.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import common  # noqa: E402
from latency_proxy import LatencyProxy, target_of  # noqa: E402
from tether._runtime import Runtime  # noqa: E402
from tether._store.postgres import PostgresStore  # noqa: E402

try:
    from tether._store.base import AsyncStore  # noqa: E402
except ImportError:  # a checkout from before D-27: only today's path exists
    AsyncStore = None  # type: ignore[assignment,misc]

RUNS = 50
LABELS = {"inline": "inline (before D-27)", "offloaded_tx": "offloaded, BEGIN/COMMIT each (before D-40)",
          "offloaded": "offloaded, one statement in autocommit"}
DELAY = 0.005
PROGRAM = """\
import tools
r = await tools.bench.get(id=7)
r["value"]
"""


async def one_round(rt: Runtime, runs: int) -> float:
    t = time.perf_counter()
    results = await asyncio.gather(*[rt.execute(PROGRAM) for _ in range(runs)])
    took = time.perf_counter() - t
    bad = [r for r in results if r.status != "completed" or r.result != 14]
    if bad:
        raise SystemExit(f"a run did not complete: {bad[0].status} {bad[0].error}")
    return took


async def main() -> None:
    p = common.parser(__doc__.splitlines()[0], rounds=5, quick_rounds=2)
    p.add_argument("--pg-url")
    p.add_argument("--runs", type=int, default=None, help=f"concurrent runs a round (default {RUNS}; 20 with --quick)")
    p.add_argument("--delay-ms", type=float, default=DELAY * 1000)
    args = p.parse_args()
    if args.runs is None:
        args.runs = 20 if args.quick else RUNS
    rounds, _ = common.rounds_of(args)
    warmup = 1
    cluster = None
    url = args.pg_url or os.environ.get("TETHER_TEST_PG_URL")
    if url is None:
        import pg

        reason = pg.missing_reason()
        if reason is not None:
            print(f"skipped: no Postgres to measure ({reason})")
            common.emit("store_latency", args.quick, {"skipped": reason, "targets": []})
            return
        cluster = pg.start()
        url = cluster.url
    proxy = LatencyProxy(target_of(url), args.delay_ms / 1000).start()
    stores, runtimes = [], {}
    try:
        contenders = ["inline", "offloaded_tx", "offloaded"] if AsyncStore is not None else ["inline"]
        traffic: dict[str, list[int]] = {n: [] for n in contenders}
        for name in contenders:
            store = PostgresStore(proxy.url(url), schema=f"bench_{name}")
            stores.append(store)
            rt = Runtime(store=store, tools=common.bench_tools(), max_workers=4)
            # Calls in place, on the loop, as before D-27; a store before D-43 read a flag.
            if hasattr(store, "capabilities"):
                store.capabilities = dataclasses.replace(store.capabilities, offloads=name != "inline")
            else:
                store.offload = name != "inline"
            # BEGIN and COMMIT around every statement, as before D-40.
            if hasattr(store, "autocommit_single"):
                store.autocommit_single = name == "offloaded"
            await rt.__aenter__()
            runtimes[name] = rt

        async def timed(name: str) -> float:
            store = runtimes[name].store
            before = store.traffic.snapshot()["round_trips"] if hasattr(store, "traffic") else 0
            took = await one_round(runtimes[name], args.runs)
            if hasattr(store, "traffic"):
                traffic[name].append(store.traffic.snapshot()["round_trips"] - before)
            return took

        samples = await common.interleave({n: (lambda n=n: timed(n)) for n in contenders}, rounds, warmup)
        peak = proxy.peak
    finally:
        for rt in runtimes.values():
            await rt.close()
        for store in stores:
            store.close()
        proxy.stop()
        if cluster is not None:
            cluster.stop()

    rows = common.ratio_rows(samples, "inline", LABELS)
    for row in rows:
        counted = traffic.get(row["contender"]) or []
        row["round_trips_per_run"] = round(statistics.median(counted) / args.runs, 2) if counted else None
    print(f"{args.runs} concurrent read-only runs, Postgres {args.delay_ms:g} ms away each way, "
          f"{rounds} rounds (+{warmup} warm-up); peak store requests in flight at once: {peak}")
    print(common.table(rows, [*common.RATIO_COLUMNS, ("round_trips_per_run", "round trips/run")],
                       title="=== seconds per round of runs, as ms"))
    targets = []
    if "offloaded" in samples:
        d30 = statistics.median(samples["offloaded_tx"]) / statistics.median(samples["offloaded"])
        print(f"speed-up of one statement in autocommit (offloaded_tx/offloaded p50): {d30:.2f}x")
        speedup = statistics.median(samples["inline"]) / statistics.median(samples["offloaded_tx"])
        paired = statistics.median(a / b for a, b in zip(samples["inline"], samples["offloaded_tx"]))
        print(f"speed-up inline/offloaded: {speedup:.1f}x (paired {paired:.1f}x); target >= 5x: "
              f"{'met' if speedup >= 5 else 'missed'}")
        targets.append({"target": "offloaded >= 5x faster than inline (inline/offloaded_tx p50)",
                        "value": round(speedup, 2), "limit": 5, "unit": "x", "met": speedup >= 5})
        targets.append({"target": "one statement in autocommit: offloaded_tx/offloaded p50 (how many times faster)",
                        "value": round(d30, 2), "limit": ">= 1.0", "unit": "x", "met": d30 >= 1.0})
    common.emit("store_latency", args.quick, {"runs": args.runs, "delay_ms": args.delay_ms, "peak_in_flight": peak,
                                              "rows": rows, "targets": targets})


if __name__ == "__main__":
    asyncio.run(main())
