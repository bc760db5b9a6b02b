"""The hop from Monty's host callback to tether's host function, measured apart (issue 24, session 6).

Not a benchmark run by run_all.py: a one-off measurement kept so the figures in bench/README.md ("Issue 24,
session 6: the hop to the host function") can be taken again. One Monty pool (tether's ``SandboxPool``),
the 10-call program, a host function that does nothing (it answers ``{"id": i, "value": 2 * i}``), no type
check; the contenders differ only in how the host function is reached:

* ``bare``: ``checkout(external_modules=...)`` + ``feed_run(code)``, the function itself in the module
  (core_bench's baseline);
* ``bare_sync``: ``bare`` with ``get`` a plain function (the program calls it without ``await``): Monty calls
  it on its own threads, no event-loop turn — what the async bridge itself costs;
* ``bare_spin`` / ``bare_sync_spin``: ``bare`` / ``bare_sync`` with ``get`` spinning ``BUSY_US`` first;
* ``opts``: the same with the checkout options tether passes (limits, ``os_policy`` with ``sleep: call_host``);
* ``kwargs``: ``opts`` plus the ``feed_run`` keywords tether passes (``external_lookup``, ``print_callback``,
  ``os``);
* ``routed``: ``kwargs`` with tether's module functions (``_routed``: a context variable, ``Execution._call``);
* ``exec``: tether's ``Execution`` itself (``run``: the feed in its own task, shielded);
* ``exec_busy``: ``exec`` with a host function that spins ``BUSY_US`` of plain Python (JSON encodes) per
  call, about what tether's own host function spends: does work inside the call lengthen the gap around it?
* ``exec_sleep`` / ``exec_spin``: the same time asleep (GIL released) / in a loop that touches no memory;
* ``exec_split``: ``exec_busy``'s work, its last ``SPLIT_US`` run after the answer, during Monty's trip;
* ``exec_churn``: the same time spent allocating many small dicts and lists instead;
* ``tether``: a whole ``Runtime.execute`` (in-memory store, defaults), the same pool; the gap is taken
  around ``EffectBoundary.host`` (stamped by a wrapper put around it from outside), and ``feed`` is its
  ``Execution.run`` alone.

Each round runs every contender once, order rotated; per contender the wall time of the whole run and the
gap between one host call's return and the next one's entry (what Monty and the hop spend between calls).

    python bench/hop_probe.py [ROUNDS]              # default 300
    python bench/hop_probe.py --segments [ROUNDS]   # a gap split: loop callbacks, Monty's trip, main-thread CPU
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

import pydantic_monty as pm

import tether._engine.calls.boundary as boundary
import tether._sandbox.monty as monty
from common import EXPECTED, PROGRAM  # the program every core contender runs
from tether._runtime import Runtime
from tether._store import open_store

_stamps: list[int] = []


async def get(id: int) -> dict[str, int]:
    _stamps.append(time.perf_counter_ns())
    out = {"id": id, "value": id * 2}
    _stamps.append(time.perf_counter_ns())
    return out


def sync_get(id: int) -> dict[str, int]:
    """``get`` as a plain function: Monty calls it on its own threads, with no event-loop turn."""
    _stamps.append(time.perf_counter_ns())
    out = {"id": id, "value": id * 2}
    _stamps.append(time.perf_counter_ns())
    return out


def sync_spin_get(id: int) -> dict[str, int]:
    """``sync_get`` spinning ``BUSY_US`` first (``spin_host``'s work)."""
    _stamps.append(time.perf_counter_ns())
    end = _stamps[-1] + BUSY_US * 1000
    while time.perf_counter_ns() < end:
        pass
    out = {"id": id, "value": id * 2}
    _stamps.append(time.perf_counter_ns())
    return out


async def spin_get(id: int) -> dict[str, int]:
    """``get`` spinning ``BUSY_US`` first."""
    return sync_spin_get(id)


async def host(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return await get(**kwargs)


SPLIT_US = 20  # split_host: how much of it runs after the answer
BUSY_US = 45  # about what tether's host function spends per call (the "in call" column of `tether`)


async def busy_host(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A host function that spins BUSY_US of plain Python work inside its stamps, then answers."""
    _stamps.append(time.perf_counter_ns())
    end = _stamps[-1] + BUSY_US * 1000
    junk = []
    while time.perf_counter_ns() < end:
        junk.append(json.dumps({"id": kwargs["id"], "args": [1, 2, 3]}, sort_keys=True))
    out = {"id": kwargs["id"], "value": kwargs["id"] * 2}
    _stamps.append(time.perf_counter_ns())
    return out


async def spin_host(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``busy_host``'s time, spent in a loop that touches almost no memory (the GIL held)."""
    _stamps.append(time.perf_counter_ns())
    end = _stamps[-1] + BUSY_US * 1000
    while time.perf_counter_ns() < end:
        pass
    out = {"id": kwargs["id"], "value": kwargs["id"] * 2}
    _stamps.append(time.perf_counter_ns())
    return out


async def sleep_host(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``busy_host``'s time, the thread asleep (the GIL released, the core free)."""
    _stamps.append(time.perf_counter_ns())
    time.sleep(BUSY_US / 1e6)  # noqa: ASYNC251 - blocking on purpose: the loop and the GIL left idle
    out = {"id": kwargs["id"], "value": kwargs["id"] * 2}
    _stamps.append(time.perf_counter_ns())
    return out


def _json_work(us: float, id: int) -> None:
    end = time.perf_counter_ns() + us * 1000
    junk = []
    while time.perf_counter_ns() < end:
        junk.append(json.dumps({"id": id, "args": [1, 2, 3]}, sort_keys=True))


async def split_host(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``busy_host``'s work, the last ``SPLIT_US`` of it run after the answer (a ``call_soon``), while the
    worker runs the program on to its next call: what deferring a call's bookkeeping would buy."""
    _stamps.append(time.perf_counter_ns())
    _json_work(BUSY_US - SPLIT_US, kwargs["id"])
    asyncio.get_running_loop().call_soon(_json_work, SPLIT_US, kwargs["id"])
    out = {"id": kwargs["id"], "value": kwargs["id"] * 2}
    _stamps.append(time.perf_counter_ns())
    return out


async def churn_host(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``busy_host``'s time, spent touching ~2,000 fresh objects (as a host call's many small ones are)."""
    _stamps.append(time.perf_counter_ns())
    end = _stamps[-1] + BUSY_US * 1000
    junk: list[Any] = []
    while time.perf_counter_ns() < end:
        junk.extend({"k": str(i), "v": [i, i + 1]} for i in range(50))
    out = {"id": kwargs["id"], "value": kwargs["id"] * 2}
    _stamps.append(time.perf_counter_ns())
    return out


SPEC = monty.SandboxSpec(
    namespaces={"bench": ("get",)},
    builtins=("sleep",),
    sync_builtins=("emit",),
    limits=monty.SandboxLimits(memory_bytes=100_000_000, run_seconds=30.0, host_calls=1000),
    clock=_dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc),
    seed=1,
    type_check=False,
    modules_key="hop",
)


_HOST = boundary.EffectBoundary.host
_RUN = monty.Execution.run
_feed: list[int] = []


async def _stamped_host(self: Any, name: str, args: Any, kwargs: Any) -> Any:
    _stamps.append(time.perf_counter_ns())
    try:
        return await _HOST(self, name, args, kwargs)
    finally:
        _stamps.append(time.perf_counter_ns())


async def _timed_run(self: Any, *a: Any, **k: Any) -> Any:
    t = time.perf_counter_ns()
    try:
        return await _RUN(self, *a, **k)
    finally:
        _feed.append(time.perf_counter_ns() - t)


boundary.EffectBoundary.host = _stamped_host  # type: ignore[method-assign]
monty.Execution.run = _timed_run  # type: ignore[method-assign]


def _gaps() -> list[int]:
    """Return-to-next-entry gaps of one run (ns)."""
    return [_stamps[i + 1] - _stamps[i] for i in range(1, len(_stamps) - 1, 2)]


def _insides() -> list[int]:
    """Entry-to-return times of one run's host calls (ns)."""
    return [_stamps[i + 1] - _stamps[i] for i in range(0, len(_stamps), 2)]


# --segments: every loop callback timed (asyncio.events.Handle._run wrapped) and the main thread's CPU clock
# read at each stamp, so a gap splits into what the loop runs and what it waits for.
_handles: list[tuple[int, int, str]] = []
_cpu: list[int] = []


def _segmenting() -> None:
    import asyncio.events as events

    run = events.Handle._run

    def timed(self: Any) -> None:
        t = time.perf_counter_ns()
        try:
            run(self)
        finally:
            cb = self._callback
            _handles.append((t, time.perf_counter_ns(), getattr(cb, "__name__", type(cb).__name__)))

    events.Handle._run = timed  # type: ignore[method-assign]
    global _stamps
    _stamps = _CpuStamps()


class _CpuStamps(list):
    def append(self, t: Any) -> None:
        _cpu.append(time.thread_time_ns())
        super().append(t)

    def clear(self) -> None:
        _cpu.clear()
        super().clear()


SEGMENTS = ("exit->completer", "PyTaskCompleter", "completer->PyEnsureFuture (Monty's trip)", "PyEnsureFuture",
            "ensure->entry", "gap", "main thread CPU in gap")


def _segments(into: dict[str, list[int]]) -> None:
    for i in range(1, len(_stamps) - 1, 2):
        a, b = _stamps[i], _stamps[i + 1]
        done = [h for h in _handles if h[0] >= a and h[1] <= b and h[2] == "PyTaskCompleter"]
        ensure = [h for h in _handles if h[0] >= a and h[1] <= b and h[2] == "PyEnsureFuture"]
        if len(done) != 1 or len(ensure) != 1:
            continue
        (c0, c1, _), (e0, e1, _) = done[0], ensure[0]
        for k, v in zip(SEGMENTS, (c0 - a, c1 - c0, e0 - c1, e1 - e0, b - e1, b - a, _cpu[i + 1] - _cpu[i])):
            into.setdefault(k, []).append(v)


async def main(rounds: int, segments: bool) -> None:
    if segments:
        _segmenting()
    pool = monty.SandboxPool(min_workers=1, max_workers=1)
    await pool.start()
    raw = pool._pool
    bare_mod = {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": get})})}
    tools = pool.tools_module(SPEC)
    opts: dict[str, Any] = dict(
        limits=monty._limits(SPEC.limits),
        os_policy={"datetime": SPEC.clock, "random_start": {"seed": SPEC.seed}, "sleep": "call_host"})

    def sink(stream: str, text: str) -> None:
        pass

    # An Execution only to lend its _lookup / _print / _os (the feed_run keywords) to the raw contenders.
    lender = pool.execution(SPEC, host, sink)

    async def bare() -> Any:
        async with raw.checkout(external_modules=bare_mod) as s:
            return await s.feed_run(PROGRAM)

    def bare_with(fn: Any, program: str = PROGRAM) -> Any:
        modules = {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": fn})})}

        async def run() -> Any:
            async with raw.checkout(external_modules=modules) as s:
                return await s.feed_run(program)
        return run

    sync_program = PROGRAM.replace("await ", "")

    async def with_opts() -> Any:
        async with raw.checkout(external_modules=bare_mod, **opts) as s:
            return await s.feed_run(PROGRAM)

    async def with_kwargs() -> Any:
        async with raw.checkout(external_modules=bare_mod, **opts) as s:
            return await s.feed_run(PROGRAM, external_lookup=lender._lookup(), print_callback=lender._print,
                                    os=lender._os)

    async def routed() -> Any:
        monty._CURRENT.set(lender)
        async with raw.checkout(external_modules={"tools": tools}, **opts) as s:
            return await s.feed_run(PROGRAM, external_lookup=lender._lookup(), print_callback=lender._print,
                                    os=lender._os)

    def with_host(fn: Any) -> Any:
        async def run() -> Any:
            async with pool.execution(SPEC, fn, sink) as ex:
                return await ex.run(PROGRAM)
        return run

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import common

    # The same pool: the same worker process serves every contender.
    rt = Runtime(tools=common.bench_tools(), store=open_store("sqlite:///:memory:"), pool=pool)
    await rt.__aenter__()

    async def tether() -> Any:
        r = await rt.execute(common.PROGRAM)
        assert r.status == "completed", r.error
        return r.result

    contenders = {"bare": bare, "bare_sync": bare_with(sync_get, sync_program), "bare_spin": bare_with(spin_get),
                  "bare_sync_spin": bare_with(sync_spin_get, sync_program), "opts": with_opts, "kwargs": with_kwargs, "routed": routed,
                  "exec": with_host(host), "exec_spin": with_host(spin_host), "exec_busy": with_host(busy_host),
                  "exec_churn": with_host(churn_host), "exec_sleep": with_host(sleep_host),
                  "exec_split": with_host(split_host), "tether": tether}
    if segments:
        contenders = {n: contenders[n] for n in ("bare", "exec", "exec_busy", "exec_sleep", "tether")}
    names = list(contenders)
    wall: dict[str, list[float]] = {n: [] for n in names}
    gaps: dict[str, list[float]] = {n: [] for n in names}
    inside: dict[str, list[float]] = {n: [] for n in names}
    parts: dict[str, dict[str, list[int]]] = {n: {} for n in names}
    feeds: list[float] = []
    for r in range(rounds + 20):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            _stamps.clear()
            _feed.clear()
            _handles.clear()
            # Each contender runs in a task of its own, as an execute does (and its context is its own).
            t0 = time.perf_counter_ns()
            value = await asyncio.ensure_future(contenders[name]())
            t1 = time.perf_counter_ns()
            assert value == EXPECTED, (name, value)
            await pool.returned()
            if r >= 20:
                wall[name].append((t1 - t0) / 1e3)
                gaps[name].append(statistics.median(_gaps()) / 1e3)
                inside[name].append(statistics.median(_insides()) / 1e3)
                if _feed:
                    feeds.append(_feed[0] / 1e3)
                if segments:
                    _segments(parts[name])
        if r % 50 == 0:
            gc.collect()
    await rt.__aexit__(None, None, None)
    await pool.close()
    print(f"{rounds} rounds, load {os.getloadavg()[0]:.2f}")
    if segments:
        print(f"{'per gap, p50 µs':42}" + "".join(f"{n:>11}" for n in names))
        for k in SEGMENTS:
            print(f"{k:42}" + "".join(f"{statistics.median(parts[n][k]) / 1e3:11.1f}" for n in names))
        return
    print(f"{'contender':14} {'run p50 µs':>11} {'x bare paired':>14} {'gap p50 µs':>11} {'gap - bare':>11} "
          f"{'in call µs':>11}")
    base_gap = statistics.median(gaps["bare"])
    for n in names:
        ratio = statistics.median(a / b for a, b in zip(wall[n], wall["bare"]))
        g = statistics.median(gaps[n])
        print(f"{n:14} {statistics.median(wall[n]):11.0f} {ratio:14.3f} {g:11.1f} {g - base_gap:11.1f} "
              f"{statistics.median(inside[n]):11.1f}")
    print(f"tether's Execution.run (feed_run, its 10 calls included) p50 {statistics.median(feeds):.0f} µs")


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "--segments"]
    asyncio.run(main(int(argv[0]) if argv else 300, "--segments" in sys.argv))
