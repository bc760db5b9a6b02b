"""CPU a program costs on Postgres, two source trees paired: tether's process and the cluster's backends.

Serving ratios on this shared 2-core machine move by ±0.2 from one window to the next, which hides a
change of a few percent of a program's CPU. This bench counts the CPU instead: each sample is a fresh
process of one tree (``PYTHONPATH=<tree>/src``) that opens ``Runtime`` on a ``PostgresStore`` (its own
schema on one throwaway cluster, tests/pg.py), warms up, then runs ``--programs`` executes of the core
program two at a time and reports its own CPU (all threads: the loop, the store's threads) and the CPU
of its pooled connections' backends, per program. The trees alternate, the order swapped every round;
reported: p50 per tree and the after/before ratio paired by round. Only what both trees have
(``Runtime``, ``PostgresStore``), so both run the same bench code.

    python bench/pg_cpu_bench.py [--before COMMIT|DIR] [--after DIR] [--rounds 8] [--programs 600]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
_TICK = os.sysconf("SC_CLK_TCK")
WARMUP = 30


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def sample(url: str, schema: str, programs: int) -> None:
    """One tree's sample, in its own process: prints process and backend CPU ms a program."""
    # tether first, from this sample's tree (PYTHONPATH), before common.py could put this checkout's src first.
    from tether import Runtime  # noqa: I001 - tether before common (above)
    from tether._store.postgres import PostgresStore

    import common
    import psycopg

    store = PostgresStore(url, schema=schema)

    async def run() -> None:
        async with Runtime(store=store, tools=common.bench_tools()) as rt:
            async def one() -> None:
                r = await rt.execute(common.PROGRAM)
                assert r.status == "completed" and r.result == common.EXPECTED, r.error

            for _ in range(WARMUP):
                await asyncio.gather(one(), one())
            with psycopg.connect(url, autocommit=True) as conn:
                backends = [pid for (pid,) in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'tether'")]
            b0, t0 = sum(_cpu(p) for p in backends), time.process_time()
            for _ in range(programs // 2):
                await asyncio.gather(one(), one())
            own = (time.process_time() - t0) / programs * 1e3
            print(f"{own:.4f} {(sum(_cpu(p) for p in backends) - b0) / programs * 1e3:.4f}")

    asyncio.run(run())
    store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="3faa0f9", help="a commit (its src by git archive) or a folder holding src")
    p.add_argument("--after", default=str(ROOT), help="a folder holding src/tether (default: this checkout)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--programs", type=int, default=600, help="programs a sample")
    p.add_argument("--quick", action="store_true", help="4 rounds of 200 programs")
    p.add_argument("--sample", nargs=2, metavar=("URL", "SCHEMA"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sample:
        sample(*args.sample, args.programs)
        return
    rounds, programs = (4, 200) if args.quick else (args.rounds, args.programs)
    sys.path.insert(0, str(ROOT / "tests"))
    import common
    import pg
    from trees_bench import tree_of

    reason = pg.missing_reason()
    if reason:
        print(f"pg_cpu_bench skipped: {reason}")
        return
    with tempfile.TemporaryDirectory(prefix="tether-pg-cpu-") as tmp:
        trees = {"before": tree_of(args.before, Path(tmp)), "after": Path(args.after)}
        cluster = pg.start()
        try:
            got: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
            for r in range(rounds):
                for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(trees[name] / "src"), str(HERE)])}
                    done = subprocess.run([sys.executable, __file__, "--programs", str(programs), "--sample",
                                           cluster.url, f"cpu_{name}"], env=env, capture_output=True, text=True)
                    if done.returncode:
                        raise SystemExit(f"{name} failed: {done.stderr[-2000:]}")
                    own, backend = map(float, done.stdout.split()[-2:])
                    got[name].append((own, backend))
                    print(f"  round {r + 1} {name:<6} process {own:6.3f} ms  backends {backend:6.3f} ms a program",
                          flush=True)
        finally:
            cluster.stop()
    rows = []
    for name, samples in got.items():
        total = [a + b for a, b in samples]
        row = {"tree": name, "process_ms": statistics.median(a for a, _ in samples),
               "backend_ms": statistics.median(b for _, b in samples), "total_ms": statistics.median(total)}
        if name == "after":
            before = [a + b for a, b in got["before"]]
            row["x_before_paired"] = round(statistics.median(a / b for a, b in zip(total, before)), 3)
            row["x_before_process_paired"] = round(statistics.median(
                a / b for (a, _), (b, _) in zip(samples, got["before"])), 3)
        rows.append(row)
    print()
    print(common.table(rows, [("tree", "tree"), ("process_ms", "process CPU ms/program"),
                              ("backend_ms", "backends CPU ms/program"), ("total_ms", "total"),
                              ("x_before_process_paired", "process x before"), ("x_before_paired", "total x before")],
                       title=f"CPU a program on Postgres, p50 of {rounds} rounds of {programs} programs, 2 at a time"))
    common.emit("pg_cpu", args.quick, {"before": args.before, "rounds": rounds, "programs": programs, "rows": rows})


if __name__ == "__main__":
    main()
