"""Durable: resume and replay latency against journal length, the journal's cost, 10,000 paused runs.

(i)   resume(approve) of a run paused at a write after N = 1, 100, 1,000
      journaled reads, restored from its signed snapshot, to completion.
      Target: N=1,000 at most 1.5x N=1.
(ii)  the same when the snapshot cannot be loaded (re-signed as another Monty
      build): the program replays from its first line, reads answered from
      the journal.
(iii) the core program (10 awaited reads, type check off) with the journal in
      a SQLite file, against bare Monty (target <= 1.5x) and the in-memory
      store (the non-durable path).
(iv)  10,000 paused runs: store size on disk, and the monty worker processes
      alive — target: none held by paused runs (the pool's idle workers are
      the pool's, reported apart); then the pool is closed and a sample of the
      paused runs is resumed by a new runtime.
(v)   a rollback of 10 writes (P-46): `resume(run_id, "undo")` of an ended run
      whose 10 writes each declare an undo — 10 compensations, each journaled
      approved -> sending -> sent — against the run that made the 10 writes,
      in the same round on the same SQLite file. Reported, no target.

    python bench/durable_bench.py [--quick] [--rounds N] [--runs 10000] [--rollback-only]
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pydantic_monty as pm

import common
from common import EXPECTED, PROGRAM, get
from tether._engine.integrity import sign_snapshot_record
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._sources.python import tool
from tether._store import open_store
from tether._store.base import SnapshotRecord
from tether._tools.model import Tool
from tether._tools.undo import Undo

NS = (1, 100, 1000)
RESUME_TARGET = 1.5
JOURNAL_TARGET = 1.5
OTHER_BUILD = "pydantic-monty-0.0.0-bench"

WRITE_ONLY = 'import tools\nr = await tools.bench.put(id=1, value="x")\nr["stored"]\n'


def reads_then_write(n: int) -> str:
    return (
        "import tools\n"
        "total = 0\n"
        f"for i in range({n}):\n"
        "    r = await tools.bench.get(id=i)\n"
        '    total += r["value"]\n'
        f'w = await tools.bench.put(id={n}, value="done")\n'
        '{"total": total, "stored": w["stored"]}\n'
    )


ROLLBACK_WRITES = 10
TEN_WRITES = ("import tools\n"
              f"for i in range({ROLLBACK_WRITES}):\n"
              "    await tools.bench.put(id=i, value='x')\n")


@tool(namespace="bench", destructive=True)
async def unput(id: int) -> dict[str, Any]:
    """Undo a put (the rollback bench's compensation)."""
    return {"removed": id}


def undoable_tools() -> list[Tool]:
    """The bench tools, with put undone by unput."""
    undone = dataclasses.replace(common.put.__tether_tool__, undo=Undo("bench.unput", {"id": "args.id"}))
    return [common.get.__tether_tool__.to_tool(), undone.to_tool(), unput.__tether_tool__.to_tool()]


async def rollback_cost(tmp: Path, rounds: int, warmup: int) -> list[dict[str, Any]]:
    """(v): undoing an ended run's 10 writes against making them, paired per round."""
    rt = Runtime(store=open_store(f"sqlite:///{tmp}/rollback.db"), tools=undoable_tools(), type_check=False,
                 policy=Policy(writes="allow", write_budget=ROLLBACK_WRITES * 2 + 1))
    samples: dict[str, list[float]] = {"writes": [], "rollback": []}
    async with rt:
        for i in range(warmup + rounds):
            t0 = time.perf_counter()
            done = await rt.execute(TEN_WRITES)
            t1 = time.perf_counter()
            undone = await rt.resume(done.run_id, "undo")
            t2 = time.perf_counter()
            if done.status != "completed" or undone.status != "rolled_back" or not all(
                    x["undone"] for x in undone.rollback or []) or len(undone.rollback or []) != ROLLBACK_WRITES:
                raise RuntimeError(f"rollback bench: {done.status} then {undone.status}: {undone.error}")
            if i >= warmup:
                samples["writes"].append(t1 - t0)
                samples["rollback"].append(t2 - t1)
    return common.ratio_rows(samples, "writes", {
        "writes": f"the run making {ROLLBACK_WRITES} writes (baseline)",
        "rollback": f"resume(run, 'undo'): {ROLLBACK_WRITES} compensations",
    })


def runtime(url: str, type_check: bool, **kw: Any) -> Runtime:
    return Runtime(store=open_store(url), tools=common.bench_tools(), type_check=type_check,
                   limits=Limits(host_calls=max(NS) + 10), **kw)


async def paused_runs(rt: Runtime, n: int, count: int) -> list[str]:
    out = []
    for _ in range(count):
        r = await rt.execute(reads_then_write(n))
        if r.status != "paused":
            raise RuntimeError(f"expected a pause after {n} reads, got {r.status}: {r.error}")
        out.append(r.run_id)
    return out


def force_replay(rt: Runtime, run_id: str) -> None:
    """Re-sign the pause snapshot as another Monty build's: resume must fall back to replay (P-12)."""
    snap = rt.store.latest_snapshot(run_id)
    # Signed as the runtime signs (pending calls and kind included): only the build differs.
    mac = sign_snapshot_record(rt.engine.keyring, snap.run_id, snap.seq, OTHER_BUILD, snap.data, snap.pending,
                               snap.kind)
    rt.store.put_snapshot(SnapshotRecord(snap.run_id, snap.seq, OTHER_BUILD, snap.data, mac, snap.pending,
                                         rt.engine.clock(), snap.kind))


async def resume_latency(url: str, rounds: int, warmup: int, type_check: bool) -> dict[str, Any]:
    """(i) and (ii): resume after N journaled reads, restored and replayed, interleaved across N."""
    total = rounds + warmup
    t = time.perf_counter()
    async with runtime(url, type_check) as creator:
        runs = {(mode, n): await paused_runs(creator, n, total) for mode in ("restore", "replay") for n in NS}
        for run_id in (r for (mode, _), ids in runs.items() if mode == "replay" for r in ids):
            force_replay(creator, run_id)
        snap_bytes = {n: len(creator.store.latest_snapshot(runs[("restore", n)][0]).data) for n in NS}
        get_calls_ms = {}
        for n in NS:
            run_id = runs[("restore", n)][0]
            xs = []
            for _ in range(20):
                t1 = time.perf_counter()
                creator.store.get_calls(run_id)
                xs.append(time.perf_counter() - t1)
            get_calls_ms[n] = round(statistics.median(xs) * 1e3, 3)
    setup_s = time.perf_counter() - t

    diag: dict[str, list[dict[str, Any]]] = {}
    # Another runtime (another owner, its own warm pool) resumes: as another process would.
    async with runtime(url, type_check) as resumer:
        contenders = {}
        for (mode, n), ids in runs.items():
            it = iter(ids)

            async def resume(it: Any = it, mode: str = mode, n: int = n) -> Any:
                r = await resumer.resume(next(it), "approve")
                if r.status != "completed" or r.diagnostics.get("attempt") != mode:
                    raise RuntimeError(f"{mode} N={n}: {r.status} {r.diagnostics.get('attempt')} {r.error}")
                if r.result != {"total": sum(i * 2 for i in range(n)), "stored": True}:
                    raise RuntimeError(f"{mode} N={n} computed {r.result!r}")
                return r

            contenders[f"{mode}_{n}"] = resume

        def keep(name: str, r: Any) -> None:
            diag.setdefault(name, []).append(r.diagnostics)

        samples = await common.interleave(contenders, rounds, warmup, after_each=keep)

    rows = []
    for mode in ("restore", "replay"):
        base = f"{mode}_1"
        for r in common.ratio_rows({k: v for k, v in samples.items() if k.startswith(mode)}, base):
            n = int(r["contender"].split("_")[1])
            ds = diag[r["contender"]]
            r.update(label=f"{mode} after N={n}", N=n,
                     setup_ms=round(statistics.median(d["setup_ms"] for d in ds), 3),
                     execution_ms=round(statistics.median(d["execution_ms"] for d in ds), 3),
                     get_calls_ms=get_calls_ms[n], snapshot_kib=round(snap_bytes[n] / 1024, 1))
            rows.append(r)
    return {"rows": rows, "setup_s": round(setup_s, 1)}


async def journal_cost(tmp: Path, rounds: int, warmup: int) -> list[dict[str, Any]]:
    """(iii): the core program with the journal in a file against bare Monty and the in-memory store."""
    mem = Runtime(tools=common.bench_tools(), type_check=False)
    disk = Runtime(store=open_store(f"sqlite:///{tmp}/journal.db"), tools=common.bench_tools(), type_check=False)
    async with pm.AsyncMonty(min_processes=1, max_processes=2) as pool, mem, disk:
        modules = {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": get})})}

        async def bare() -> Any:
            async with pool.checkout(external_modules=modules) as session:
                return await session.feed_run(PROGRAM)

        async def tether(rt: Runtime) -> Any:
            r = await rt.execute(PROGRAM)
            if r.status != "completed" or r.result != EXPECTED:
                raise RuntimeError(f"{r.status}: {r.error}")
            return r

        samples = await common.interleave(
            {"bare": bare, "memory": lambda: tether(mem), "file": lambda: tether(disk)}, rounds, warmup)
    rows = common.ratio_rows(samples, "bare", {
        "bare": "bare Monty feed_run (baseline)",
        "memory": "tether, in-memory SQLite (non-durable path)",
        "file": "tether, SQLite file (journal on)",
    })
    by = {r["contender"]: r for r in rows}
    by["file"]["x_memory"] = round(common.paired_ratio(samples["file"], samples["memory"]), 3)
    return rows


async def many_paused(tmp: Path, count: int, resume_sample: int) -> dict[str, Any]:
    """(iv): create ``count`` paused runs, then look at disk and processes; resume a sample after closing the pool."""
    url = f"sqlite:///{tmp}/paused.db"
    out: dict[str, Any] = {"runs": count}
    rt = Runtime(store=open_store(url), tools=common.bench_tools(), type_check=False)
    lat: list[float] = []
    async with rt:
        await rt.execute("1")  # the pool's worker is up and warm
        out["workers_before"] = common.live(common.child_processes())
        t0 = time.perf_counter()
        ids = []
        for i in range(count):
            t = time.perf_counter()
            r = await rt.execute(WRITE_ONLY)
            lat.append(time.perf_counter() - t)
            if r.status != "paused":
                raise RuntimeError(f"run {i}: {r.status} {r.error}")
            ids.append(r.run_id)
        out["create_s"] = round(time.perf_counter() - t0, 2)
        procs = common.child_processes()
        out["workers_with_pool_open"] = common.live(procs)
        out["zombies"] = sum(1 for p in procs if p["state"] == "Z")
        out["pool_max_workers"] = rt.engine.pool.max_workers
        out["paused_in_store"] = rt.store.count_runs("paused")
        out["store_mb"] = round(rt.store.store_size_bytes() / 1e6, 2)
        db = Path(f"{tmp}/paused.db")
        out["db_file_mb"] = round(db.stat().st_size / 1e6, 2)
        wal = Path(f"{db}-wal")
        out["wal_file_mb"] = round(wal.stat().st_size / 1e6, 2) if wal.exists() else 0.0
        out["snapshot_bytes_p50"] = statistics.median(len(rt.store.latest_snapshot(x).data) for x in ids[:50])
    out["workers_after_pool_closed"] = common.live(common.child_processes())
    # Workers the pool keeps idle are the pool's. A worker held by a paused run
    # would add to them (and, past max_workers, block the next checkout).
    out["workers_held_by_paused_runs"] = max(0, out["workers_with_pool_open"] - out["workers_before"])
    out["pause_latency_p50_ms"] = round(statistics.median(lat) * 1e3, 3)
    out["bytes_per_paused_run"] = round(out["store_mb"] * 1e6 / max(1, count))
    out["db_bytes_per_paused_run"] = round(out["db_file_mb"] * 1e6 / max(1, count))

    out.update(await respawn_cost(url, 10 if count < 1000 else 30))
    sample = random.Random(11).sample(ids, k=min(resume_sample, len(ids)))
    async with Runtime(store=open_store(url), tools=common.bench_tools(), type_check=False) as fresh:
        done, took = 0, []
        for run_id in sample:
            t = time.perf_counter()
            r = await fresh.resume(run_id, "approve")
            took.append(time.perf_counter() - t)
            done += r.status == "completed" and r.result is True
        out["resumed_ok"] = f"{done}/{len(sample)}"
        out["resume_after_close_p50_ms"] = round(statistics.median(took) * 1e3, 3)
        out["workers_after_resumes_pool_open"] = common.live(common.child_processes())
    return out


async def respawn_cost(url: str, pairs: int) -> dict[str, Any]:
    """Does a pause end its worker? Time the next execute after a pause vs after a completed run."""
    after_pause, after_done, killed = [], [], 0
    async with Runtime(store=open_store(url), tools=common.bench_tools(), type_check=False) as rt:
        await rt.execute("1")
        for i in range(pairs):
            for first, into in ((WRITE_ONLY, after_pause), ("1", after_done))[:: 1 if i % 2 else -1]:
                before = {p["pid"] for p in common.child_processes() if p["state"] != "Z"}
                await rt.execute(first)
                t = time.perf_counter()
                await rt.execute("1")
                into.append(time.perf_counter() - t)
                if first is WRITE_ONLY:
                    now = {p["pid"] for p in common.child_processes() if p["state"] != "Z"}
                    killed += bool(before) and not (before & now)
    return {
        "pauses_that_ended_their_worker": f"{killed}/{pairs}",
        "next_execute_after_pause_p50_ms": round(statistics.median(after_pause) * 1e3, 3),
        "next_execute_after_completed_p50_ms": round(statistics.median(after_done) * 1e3, 3),
    }


def main() -> None:
    p = common.parser(__doc__.splitlines()[0], rounds=20, quick_rounds=3)
    p.add_argument("--runs", type=int, default=None, help="paused runs for (iv) (default 10,000; 100 with --quick)")
    p.add_argument("--type-check", choices=("on", "off"), default="on",
                   help="type check for the resume/replay runs of (i) and (ii) (default on, tether's default)")
    p.add_argument("--rollback-only", action="store_true", help="only (v), the rollback of 10 writes")
    args = p.parse_args()
    rounds, warmup = common.rounds_of(args)
    warmup = min(warmup, 2)
    runs = args.runs if args.runs is not None else (100 if args.quick else 10_000)
    tc = args.type_check == "on"

    if args.rollback_only:
        with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp_s:
            rollback = asyncio.run(rollback_cost(Path(tmp_s), rounds, warmup))
        print(common.table(rollback, common.RATIO_COLUMNS, title="(v) a rollback of 10 writes"))
        common.emit("durable_rollback", args.quick, {"rounds": rounds, "rollback": rollback})
        return

    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp_s:
        tmp = Path(tmp_s)
        res = asyncio.run(resume_latency(f"sqlite:///{tmp}/durable.db", rounds, warmup, tc))
        journal = asyncio.run(journal_cost(tmp, max(rounds * 10, 20), 5))
        paused = asyncio.run(many_paused(tmp, runs, 5 if args.quick else 20))
        rollback = asyncio.run(rollback_cost(tmp, rounds, warmup))

    print(common.table(res["rows"], [("label", f"(i)/(ii) resume(approve), type check {args.type_check}"),
                                     ("p50_ms", "p50 ms"), ("p90_ms", "p90 ms"), ("paired_ratio", "x N=1"),
                                     ("setup_ms", "setup ms"), ("execution_ms", "exec ms"),
                                     ("get_calls_ms", "get_calls ms"), ("snapshot_kib", "snap KiB")]))
    print(f"  ({rounds} interleaved rounds; creating the paused runs took {res['setup_s']} s)")
    print()
    print(common.table(journal, common.RATIO_COLUMNS + [("x_memory", "x memory")],
                       title="(iii) core program, type check off"))
    print()
    print(common.table([{"k": k, "v": v} for k, v in paused.items()], [("k", "(iv) paused runs"), ("v", "")]))
    print()
    print(common.table(rollback, common.RATIO_COLUMNS, title="(v) a rollback of 10 writes"))

    by = {r["contender"]: r for r in res["rows"]}
    jby = {r["contender"]: r for r in journal}
    targets = [
        common.target("resume after N=1,000 / N=1 (restore)", by["restore_1000"]["paired_ratio"], RESUME_TARGET, "x"),
        common.target("journal on (file) / bare Monty", jby["file"]["paired_ratio"], JOURNAL_TARGET, "x"),
        common.target("monty workers held by paused runs", paused["workers_held_by_paused_runs"], 0, "procs"),
    ]
    print()
    print(common.table(targets, common.TARGET_COLUMNS))
    common.emit("durable", args.quick, {"rounds": rounds, "type_check": tc, "resume": res["rows"],
                                        "journal": journal, "paused": paused, "rollback": rollback,
                                        "targets": targets})


if __name__ == "__main__":
    main()
