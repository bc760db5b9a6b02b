"""Run a module as ``__main__`` with every Python thread's name given to the OS thread (Linux ``prctl``).

Python 3.11 leaves every thread's ``/proc/PID/task/TID/comm`` as the process's
name, so a CPU split by thread cannot tell the event loop from the store's
threads. Started as ``python bench/named_threads.py tether.cli serve ...``, a
thread named ``tether-store_0`` shows as that (15 bytes at most) and
pg_serve_probe.py can add up each kind's CPU. Measuring only: nothing in
tether depends on it.
"""

from __future__ import annotations

import ctypes
import runpy
import sys
import threading

_PR_SET_NAME = 15
_libc = ctypes.CDLL(None, use_errno=True)
_bootstrap_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _named(self: threading.Thread) -> None:
    _libc.prctl(_PR_SET_NAME, self.name.encode()[:15], 0, 0, 0)
    _bootstrap_inner(self)


threading.Thread._bootstrap_inner = _named  # type: ignore[attr-defined]


def _gc_probe(path: str) -> None:
    """Counts the collector's passes and their time by generation; SIGUSR2 writes the totals to ``path``.

    serve_probe.py reads them around each window, so GC's share of a program is its own line.
    """
    import gc
    import json
    import os
    import signal
    import time

    totals = {g: [0, 0] for g in range(3)}  # generation -> [passes, ns]
    began: list[int] = [0]

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter_ns()
        else:
            spent = totals[info["generation"]]
            spent[0] += 1
            spent[1] += time.perf_counter_ns() - began[0]

    young: dict[str, int] = {}
    seen = [0]

    def dump(signum: int, frame: object) -> None:
        # What the young generations hold at this moment, by type: what each young pass has to scan.
        seen[0] += 1
        for g in (0, 1):
            for o in gc.get_objects(generation=g):
                name = f"gen{g} {type(o).__module__}.{type(o).__qualname__}"
                young[name] = young.get(name, 0) + 1
        # With NAMED_THREADS_SAVEALL set: what only the collector freed since the last dump, by type.
        for o in gc.garbage:
            name = f"cyclic {type(o).__module__}.{type(o).__qualname__}"
            cyclic[name] = cyclic.get(name, 0) + 1
        gc.garbage.clear()
        # The loop's timer heap at this moment: every call_at pushes onto it, in Python comparisons.
        import asyncio

        loop = asyncio.events._get_running_loop()
        heap = getattr(loop, "_scheduled", [])
        timers.append((len(heap), sum(1 for h in heap if h.cancelled())))
        with open(f"{path}.tmp", "w") as f:
            json.dump({**{str(g): v for g, v in totals.items()}, "young": young, "samples": seen[0],
                       "cyclic": cyclic, "timers": timers}, f)
        os.replace(f"{path}.tmp", path)

    cyclic: dict[str, int] = {}
    timers: list[tuple[int, int]] = []
    if os.environ.get("NAMED_THREADS_SAVEALL"):
        gc.set_debug(gc.DEBUG_SAVEALL)
    gc.callbacks.append(watch)
    signal.signal(signal.SIGUSR2, dump)


if __name__ == "__main__" and "NAMED_THREADS_GC" in __import__("os").environ:
    _gc_probe(__import__("os").environ["NAMED_THREADS_GC"])

if __name__ == "__main__":
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
