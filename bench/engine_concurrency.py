"""The engine's CPU a program in one process, by how many programs run at once (issue 24, session 8).

serve_probe.py found the engine's share of a served program larger than in one
process running programs one or two at a time. This runs the same core program
by ``Runtime.execute`` (tether's defaults as ``tether serve`` opens them, the
store chosen by ``--store``) and by bare Monty's ``feed_run`` (the floor's way),
``--concurrency`` at a time, alternating in rounds, and prints process CPU and
the main thread's CPU a program, and the collector's time a program.

    python bench/engine_concurrency.py [--store file|memory] [--rounds 4] [--programs 300] [--concurrency 1,2,16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402

_gc = [0, 0]  # collector ns, start stamp


def _watch(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc[1] = time.perf_counter_ns()
    else:
        _gc[0] += time.perf_counter_ns() - _gc[1]


async def load(run: Any, programs: int, concurrency: int) -> None:
    left = [programs]

    async def one() -> None:
        while left[0] > 0:
            left[0] -= 1
            await run()

    await asyncio.gather(*(one() for _ in range(concurrency)))


async def main_async(args: argparse.Namespace) -> None:
    import pydantic_monty as pm

    from tether._app import open_runtime, resolve_tool_spec
    from tether._config import load_config

    async with contextlib.AsyncExitStack() as stack:
        url = "sqlite:///:memory:" if args.store == "memory" else f"sqlite:///{stack.enter_context(tempfile.TemporaryDirectory())}/t.db"
        rt = await stack.enter_async_context(open_runtime(load_config(None), tools=[resolve_tool_spec(common.__file__)],
                                                          store_url=url))
        pool = await stack.enter_async_context(pm.AsyncMonty(min_processes=1, max_processes=2))
        modules = {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": common.get})})}

        async def tether_run() -> None:
            r = await rt.execute(common.PROGRAM)
            assert r.status == "completed", r.error

        async def bare_run() -> None:
            async with pool.checkout(external_modules=modules) as session:
                await session.feed_run(common.PROGRAM)

        gc.collect()
        gc.freeze()
        gc.callbacks.append(_watch)
        ways = {"bare": bare_run, "tether": tether_run}
        levels = [int(c) for c in args.concurrency.split(",")]
        for way in ways.values():
            await load(way, 30, 2)
        if args.stdin:
            await answer(ways, levels[-1])
            return
        out: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        for r in range(args.rounds):
            for c in levels:
                for name in (list(ways) if r % 2 == 0 else list(reversed(ways))):
                    cpu0, main0, gc0 = time.process_time(), time.thread_time(), _gc[0]
                    await load(ways[name], args.programs, c)
                    n = args.programs
                    out.setdefault((name, c), []).append(((time.process_time() - cpu0) / n * 1e3,
                                                          (time.thread_time() - main0) / n * 1e3,
                                                          (_gc[0] - gc0) / n / 1e6))
        print(f"store {args.store}, {args.programs} programs a sample, {args.rounds} rounds, load average "
              f"{os.getloadavg()[0]:.1f}; medians, ms a program")
        print(f"{'way':<8}{'at once':>8}{'process CPU':>13}{'main thread':>13}{'collector':>11}{'tether-bare (process)':>23}")
        for c in levels:
            for name in ways:
                med = [statistics.median(x[i] for x in out[(name, c)]) for i in range(3)]
                gap = "" if name == "bare" else f"{statistics.median(t[0] - b[0] for t, b in zip(out[(name, c)], out[('bare', c)])):23.3f}"
                print(f"{name:<8}{c:>8}{med[0]:13.3f}{med[1]:13.3f}{med[2]:11.3f}{gap}")


async def _until(run: Any, stop: float, done: list[int]) -> None:
    while time.perf_counter() < stop:
        await run()
        done[0] += 1


async def answer(ways: dict[str, Any], concurrency: int) -> None:
    """serve_probe.py's in-process contenders: each line ``WAY SECONDS`` runs WAY for that long, answered in JSON."""
    import json

    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        way, seconds = line.split()
        run, done = ways[way], [0]
        stop = time.perf_counter() + float(seconds)
        cpu0, main0, gc0 = time.process_time(), time.thread_time(), _gc[0]

        await asyncio.gather(*(_until(run, stop, done) for _ in range(concurrency)))
        print(json.dumps({"completed": done[0], "cpu": time.process_time() - cpu0,
                          "main": time.thread_time() - main0, "gc": (_gc[0] - gc0) / 1e9}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", choices=("file", "memory"), default="file")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--programs", type=int, default=300)
    p.add_argument("--concurrency", default="1,2,16")
    p.add_argument("--stdin", action="store_true", help="run what stdin asks (serve_probe.py's in-process contenders)")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
