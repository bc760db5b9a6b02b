"""Can a host call skip pydantic-monty's async bridge while the program still ``await``s it? (issue 24, session 8)

Not a benchmark run by run_all.py: a probe kept so the figures in bench/README.md ("Issue 24, session 8: the
bridge") can be taken again. Session 6 measured that a plain (sync) host function costs ~30 µs a call against
an ``async def``'s ~88 (the bridge: the coroutine handed to the event loop and its answer handed back), but the
program called the sync one without ``await``, and tether's model-facing API awaits every tool. Two questions:

1. **What can a sync host function answer an awaited call with?** For each answer — a coroutine, a plain value,
   a done ``asyncio.Future``, a ``ClassInstance`` whose class has ``__await__`` — the program ``await f(1)``,
   ``f(1)`` without ``await``, and ``asyncio.gather`` of two calls; printed: the value or the sandbox's error.
2. **Does doing the host's work on Monty's thread, then answering with a coroutine, cost less than doing it in
   the coroutine on the loop?** The 10-call program with the host spinning ``SPIN_US`` per call: inside an
   ``async def`` (today's shape) against inside a sync function that returns a trivial coroutine; a no-op
   ``async def`` and a no-op sync-returning-coroutine as the floors. Rounds alternate, order reversed each
   round; p50 and the ratio to the no-op ``async def``.

    python bench/bridge_probe.py [--rounds 400] [--spin-us 45]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from typing import Any

import pydantic_monty as pm

PROGRAM = ("import tools\ntotal = 0\nfor i in range(10):\n    r = await tools.bench.get(id=i)\n"
           "    total += r['value']\ntotal\n")
EXPECTED = sum(i * 2 for i in range(10))
SPIN_S = 45e-6


class _Ready:
    """A host object that is awaitable in CPython (an empty ``__await__``)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Any:
        return iter(())


async def _value_of(value: Any) -> Any:
    return value


def _answers(loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    def coroutine(x: int) -> Any:
        return _value_of({"x": x, "thread": threading.current_thread().name})

    def value(x: int) -> Any:
        return {"x": x, "thread": threading.current_thread().name}

    def done_future(x: int) -> Any:
        future = loop.create_future()
        future.set_result({"x": x})
        return future

    def awaitable_proxy(x: int) -> Any:
        return pm.ClassInstance(_Ready({"x": x}), allowed_methods="all")

    return {"a coroutine": coroutine, "a plain value": value, "a done asyncio.Future": done_future,
            "a ClassInstance with __await__": awaitable_proxy}


async def what_answers(pool: Any) -> None:
    print("1. a sync host function's answer, by how the program calls it")
    programs = {"await f(1)": "await f(1)", "f(1)": "f(1)",
                "gather(f(1), f(2))": "import asyncio\nawait asyncio.gather(f(1), f(2))"}
    for name, fn in _answers(asyncio.get_running_loop()).items():
        for label, program in programs.items():
            try:
                async with pool.checkout() as session:
                    out = repr(await session.feed_run(program, external_lookup={"f": fn}))
            except pm.MontyError as exc:
                out = f"refused: {str(exc).splitlines()[-1][:110]}"
            print(f"   {name:32s} {label:20s} {out}")


def _spin() -> None:
    end = time.perf_counter() + SPIN_S
    while time.perf_counter() < end:
        pass


async def _async_noop(id: int) -> dict[str, int]:
    return {"id": id, "value": id * 2}


async def _async_spin(id: int) -> dict[str, int]:
    _spin()
    return {"id": id, "value": id * 2}


def _sync_noop(id: int) -> Any:
    return _value_of({"id": id, "value": id * 2})


def _sync_spin(id: int) -> Any:
    _spin()  # on Monty's thread, before the coroutine is handed to the loop
    return _value_of({"id": id, "value": id * 2})


async def where_work_runs(pool: Any, rounds: int) -> None:
    contenders = {"async def, no work (floor)": _async_noop, "async def, work in the coroutine": _async_spin,
                  "sync def returning a coroutine, no work": _sync_noop,
                  "sync def, work on Monty's thread, then a coroutine": _sync_spin}
    modules = {name: {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": fn})})}
               for name, fn in contenders.items()}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    warmup = max(rounds // 10, 5)
    for r in range(rounds + warmup):
        order = list(modules.items())
        for name, mods in (order if r % 2 else order[::-1]):
            t0 = time.perf_counter()
            async with pool.checkout(external_modules=mods) as session:
                if await session.feed_run(PROGRAM) != EXPECTED:
                    raise SystemExit(f"{name}: wrong result")
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["async def, no work (floor)"])
    print(f"\n2. where the host's work runs ({SPIN_S * 1e6:.0f} µs a call, 10 calls, {rounds} rounds)")
    for name, values in times.items():
        p50 = statistics.median(values)
        print(f"   {name:52s} p50 {p50 * 1e6:7.0f} µs  x{p50 / base:.3f}")


async def main(rounds: int) -> None:
    import os

    print(f"pydantic-monty {pm.__version__}, load {os.getloadavg()[0]:.1f}")
    async with pm.AsyncMonty(min_processes=1, max_processes=1) as pool:
        await what_answers(pool)
        await where_work_runs(pool, rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--spin-us", type=float, default=45.0)
    args = parser.parse_args()
    SPIN_S = args.spin_us / 1e6
    asyncio.run(main(args.rounds))
