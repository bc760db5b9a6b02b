"""A per-phase timeline of one warm execute: where the fixed cost outside the feed and the store goes.

Not a benchmark run by run_all.py: a measuring tool (no target, no ratio), kept so the phase tables in
bench/README.md ("Issue 24, session 7: the fixed cost") can be taken again. Wrappers put around tether's
functions from outside (no source edited, no profiler) stamp ``time.perf_counter_ns`` on entry (``name>``)
and exit (``<name``); a phase is the time between two consecutive stamps, named by them, summed over an
execute when it repeats (the 10-call program's round trips), p50 over the executes. The wrappers cost ~1 µs
a stamp, so the total is a little above an unwrapped execute's. Bare Monty (checkout, ``feed_run``,
return) runs in the same rounds, on the same pool, alternating with tether.

The worker's return (``SandboxPool.returning``) goes on after the answer; it is
stamped apart (not in the sequence), with when it ended relative to the execute's return.

    python bench/timeline_execute.py [--rounds 300] [--warmup 30] [--calls 0|1|10] [--store memory|file]
                                     [--check off|calls] [--settled]
    python bench/timeline_execute.py --probe 200 [--rounds 500]   # does a checkout move while Python runs?

By default each measured execute follows another at once (a client sending executes one after another:
the previous run's worker may still be on its way back); ``--settled`` waits for every worker first.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import pydantic_monty as pm

import common
import tether._engine.attempt.driver as driver
import tether._engine.calls.boundary as boundary
import tether._engine.integrity as integrity
import tether._engine.launcher as launcher
import tether._sandbox.monty as monty
import tether._store._schema as schema
from tether._engine.calls.ledger import Ledger
from tether._engine.finish import Finisher
from tether._engine.lifecycle import Lifecycle
from tether._runtime import Runtime
from tether._store import open_store

EVENTS: list[tuple[str, int]] = []
GIVE_BACK: list[tuple[int, int]] = []  # (start, end) of each worker's return


def _stamped(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):
        async def awrapped(*a: Any, **k: Any) -> Any:
            EVENTS.append((label + ">", time.perf_counter_ns()))
            try:
                return await fn(*a, **k)
            finally:
                EVENTS.append(("<" + label, time.perf_counter_ns()))

        return awrapped

    def wrapped(*a: Any, **k: Any) -> Any:
        EVENTS.append((label + ">", time.perf_counter_ns()))
        try:
            return fn(*a, **k)
        finally:
            EVENTS.append(("<" + label, time.perf_counter_ns()))

    return wrapped


# (owner, attribute, label): what is stamped, in about the order an execute reaches it.
STAMPED: list[tuple[Any, str, str]] = [
    (launcher, "new_run", "new_run"),
    (launcher, "check_run_start", "quota"),
    (launcher, "sign_run", "sign_run"),
    (Lifecycle, "create", "create"),
    (launcher, "launch", "launch"),
    (driver.Attempt, "__init__", "Attempt()"),
    (driver.Attempt, "run_to_end", "run_to_end"),
    (driver.Attempt, "prepare", "prepare"),
    (driver, "prepare", "spec.prepare"),
    (driver.Attempt, "_boundary", "boundary()"),
    (driver._Heartbeat, "__init__", "heartbeat"),
    (monty.SandboxPool, "start", "pool.start"),
    (monty.SandboxPool, "returned", "pool.returned"),
    (monty.SandboxPool, "reserve", "reserve"),
    (monty.SandboxPool, "tools_module", "tools_module"),
    (monty.Execution, "__aenter__", "checkout"),
    (monty.Execution, "run", "run"),
    (boundary.EffectBoundary, "host", "host"),
    (boundary.EffectBoundary, "close", "boundary.close"),
    (monty.Execution, "__aexit__", "give_back"),
    (driver.Attempt, "_completed", "completed"),
    (driver, "to_json_value", "to_json_value"),
    (Finisher, "end_attempt", "end_attempt"),
    # The end, piece by piece (issue 24, session 8): the journal batch signed, then the one transaction.
    (Ledger, "write_with", "write_with"),
    (integrity, "call_texts", "call_texts"),
    (integrity, "sign_call", "sign_call"),
    (Lifecycle, "finish", "finish"),
    (schema.SQLStore, "end_run", "end_run"),
    (schema, "_call_inserts", "rows"),
    (schema, "_run_update", "run_update"),
]


def install() -> None:
    for owner, attr, label in STAMPED:
        if not hasattr(owner, attr):
            continue  # a tree from before the function existed (a timeline of main, for comparison)
        setattr(owner, attr, _stamped(getattr(owner, attr), label))
    run = schema.Tx.run

    def statement(self: Any, sql: str, params: Any = ()) -> Any:
        """Each statement stamped by its verb and table (``INSERT INTO calls``, ``UPDATE runs``)."""
        label = " ".join(sql.split()[:3]) if sql.startswith("INSERT") else " ".join(sql.split()[:2])
        EVENTS.append((label + ">", time.perf_counter_ns()))
        try:
            return run(self, sql, params)
        finally:
            EVENTS.append(("<" + label, time.perf_counter_ns()))

    schema.Tx.run = statement  # type: ignore[method-assign]
    returning = monty.SandboxPool.returning
    seen: set[Any] = set()

    def stamped_returning(self: Any, cm: Any) -> None:
        start = time.perf_counter_ns()
        returning(self, cm)
        for back in self._returns - seen:
            seen.add(back)
            back.add_done_callback(lambda f: (seen.discard(f), GIVE_BACK.append((start, time.perf_counter_ns()))))

    monty.SandboxPool.returning = stamped_returning  # type: ignore[method-assign]


def program(calls: int) -> str:
    if calls == 0:
        return "import tools\ntotal = 0\nfor i in range(10):\n    total += i * 2\ntotal\n"
    return (f"import tools\ntotal = 0\nfor i in range({calls}):\n    r = await tools.bench.get(id=i)\n"
            "    total += r[\"value\"]\ntotal\n")


def phases(events: list[tuple[str, int]]) -> dict[str, int]:
    """Each consecutive pair of stamps as a phase ``a → b``, summed when it repeats, in ns."""
    out: dict[str, int] = {}
    for (a, ta), (b, tb) in zip(events, events[1:]):
        key = f"{a} → {b}"
        out[key] = out.get(key, 0) + (tb - ta)
    return out


async def main_async(args: argparse.Namespace) -> None:
    code = program(args.calls)
    tmp = tempfile.TemporaryDirectory()
    store = open_store(f"sqlite:///{os.path.join(tmp.name, 'runs.db')}") if args.store == "file" else None
    install()
    per: list[dict[str, int]] = []
    totals: list[int] = []
    cpu: list[int] = []
    back_after: list[int] = []
    back_took: list[int] = []
    bare: dict[str, list[int]] = {"checkout": [], "feed_run": [], "return": [], "total": []}
    order: list[str] = []
    async with Runtime(tools=common.bench_tools(), store=store) as rt:
        pool = rt.engine.pool._pool
        modules = {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": common.get})})}
        for i in range(args.warmup + args.rounds):
            # Bare Monty, the same pool, the same program.
            t0 = time.perf_counter_ns()
            async with pool.checkout(external_modules=modules) as session:
                t1 = time.perf_counter_ns()
                await session.feed_run(code)
                t2 = time.perf_counter_ns()
            t3 = time.perf_counter_ns()
            # tether: by default right after another execute, as a client sending one after another does
            # (the previous run's worker may still be on its way back); --settled waits for it first.
            if not args.settled:
                await rt.execute(code, check=args.check)
            EVENTS.clear()
            GIVE_BACK.clear()
            c0 = time.process_time_ns()
            EVENTS.append(("execute>", time.perf_counter_ns()))
            result = await rt.execute(code, check=args.check)
            EVENTS.append(("<execute", time.perf_counter_ns()))
            c1 = time.process_time_ns()
            if result.status != "completed":
                raise SystemExit(f"tether run {result.status}: {result.error}")
            events = list(EVENTS)
            # Let the worker's return land before the next round's bare Monty: what it costs is its own row.
            await rt.engine.pool.returned()
            if i < args.warmup:
                continue
            for k, v in zip(("checkout", "feed_run", "return", "total"), (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                bare[k].append(v)
            ph = phases(events)
            for key in ph:
                if key not in order:
                    order.append(key)
            per.append(ph)
            totals.append(events[-1][1] - events[0][1])
            cpu.append(c1 - c0)
            if GIVE_BACK:
                start, end = GIVE_BACK[-1]
                back_after.append(end - events[-1][1])
                back_took.append(end - start)
            if i % 50 == 0:
                gc.collect()
    tmp.cleanup()

    def p50(values: list[int]) -> float:
        return statistics.median(values) / 1000 if values else float("nan")

    n = len(per)
    print(f"timeline of one warm execute: {args.calls} calls, {args.store} store, check {args.check}, "
          f"{n} executes after {args.warmup} warm-up, load {os.getloadavg()[0]:.2f}")
    print(f"{'phase (stamp → stamp)':58} {'p50 µs':>9} {'seen':>6}")
    shown = 0.0
    for key in order:
        values = [ph[key] for ph in per if key in ph]
        if len(values) < n * 0.5:
            continue
        shown += p50(values)
        print(f"{key:58} {p50(values):9.1f} {len(values) / n:6.0%}")
    print(f"{'sum of the p50s above':58} {shown:9.1f}")
    print(f"{'execute, p50 (wall)':58} {p50(totals):9.1f}")
    print(f"{'execute, p50 (process CPU)':58} {p50(cpu):9.1f}")
    print(f"{'worker return: its own time':58} {p50(back_took):9.1f}")
    print(f"{'worker return: ended after the execute returned':58} {p50(back_after):9.1f}")
    print(f"bare Monty, same pool: checkout {p50(bare['checkout']):.1f}, feed_run {p50(bare['feed_run']):.1f}, "
          f"return {p50(bare['return']):.1f}, total {p50(bare['total']):.1f} µs")
    print(f"tether / bare (p50s): {p50(totals) / p50(bare['total']):.2f}")


async def probe_async(rounds: int, work_us: int) -> None:
    """Does a Monty checkout move while the loop runs Python? Started, then ``work_us`` of work, then awaited."""
    async with pm.AsyncMonty(min_processes=1, max_processes=2) as pool:
        left: dict[str, list[int]] = {"nothing": [], "python": [], "asleep": []}
        for i in range(rounds + 50):
            for how in left:
                cm = pool.checkout()
                started = asyncio.ensure_future(cm.__aenter__())
                t = time.perf_counter_ns()
                if how == "python":
                    while time.perf_counter_ns() < t + work_us * 1000:
                        pass
                elif how == "asleep":
                    time.sleep(work_us / 1e6)  # noqa: ASYNC251 - the GIL released on purpose, the loop held
                t1 = time.perf_counter_ns()
                await started
                t2 = time.perf_counter_ns()
                await cm.__aexit__(None, None, None)
                if i >= 50:
                    left[how].append(t2 - t1)
        print(f"checkout started, then {work_us} µs of: " + ", ".join(
            f"{how} -> {statistics.median(v) / 1000:.1f} µs left to wait" for how, v in left.items())
            + f" (p50, {rounds} rounds, load {os.getloadavg()[0]:.2f})")
    await monty._settle()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--store", choices=("memory", "file"), default="memory")
    p.add_argument("--check", choices=("off", "calls", "full"), default="off")
    p.add_argument("--settled", action="store_true", help="the measured execute starts with every worker back")
    p.add_argument("--probe", type=int, metavar="US", default=None,
                   help="instead: a checkout started, US µs of Python or of sleep, then awaited")
    args = p.parse_args()
    asyncio.run(probe_async(args.rounds, args.probe) if args.probe is not None else main_async(args))


if __name__ == "__main__":
    sys.exit(main())
