"""A/B of issue 24's session-5 changes in one process: switched off (as before) and on, alternately, paired.

Not a benchmark run by run_all.py: a one-off measurement kept so the figures in bench/README.md ("issue 24,
session 5") can be taken again. It swaps the old behaviour back in on alternate executes of one warm runtime:
every host-work step off the loop (``HostBudget.run`` ignoring ``inline``) and every run record verified
(``integrity._signed_here`` answering False). It reaches into those two private names, so it breaks (loudly)
when they are renamed; bare Monty ``feed_run`` runs in the same rounds as the floor.

    python bench/ab_fixed_costs.py ROUNDS CALLS [file|memory]     # e.g. 400 1 file
    ONLY=verify|hops python bench/ab_fixed_costs.py ...          # one change alone (the other stays on)
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import pydantic_monty as pm

import common
import tether._engine.integrity as integrity
import tether._hostwork as hostwork
from tether._runtime import Runtime
from tether._store import open_store

ONLY = os.environ.get("ONLY", "both")
_RUN, _SIGNED_HERE = hostwork.HostBudget.run, integrity._signed_here


async def _always_off_loop(self: Any, fn: Any, *args: Any, what: str, inline: bool = False, **kw: Any) -> Any:
    return await _RUN(self, fn, *args, what=what, **kw)


def switch(on: bool) -> None:
    hostwork.HostBudget.run = _RUN if (on or ONLY == "verify") else _always_off_loop  # type: ignore[method-assign]
    integrity._signed_here = _SIGNED_HERE if (on or ONLY == "hops") else (lambda run, mac: False)


async def main(rounds: int, calls: int, store: str) -> None:
    code = (f"import tools\ntotal = 0\nfor i in range({calls}):\n    r = await tools.bench.get(id=i)\n"
            "    total += r[\"value\"]\ntotal\n")
    tmp = tempfile.mkdtemp()
    url = f"sqlite:///{tmp}/ab.db" if store == "file" else "sqlite:///:memory:"
    modules = {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": common.get})})}
    async with pm.AsyncMonty(min_processes=1, max_processes=2) as pool, \
            Runtime(tools=common.bench_tools(), store=open_store(url)) as rt:

        async def bare() -> None:
            async with pool.checkout(external_modules=modules) as s:
                await s.feed_run(code)

        async def tether(on: bool) -> None:
            switch(on)
            r = await rt.execute(code)
            assert r.status == "completed", r.error

        samples: dict[str, list[float]] = {"bare": [], "before": [], "after": []}
        for i in range(rounds + 30):
            if i % 50 == 0:
                gc.collect()
            order = [("bare", bare), ("before", lambda: tether(False)), ("after", lambda: tether(True))]
            for name, fn in order[i % 3:] + order[:i % 3]:
                t = time.perf_counter()
                await fn()
                if i >= 30:
                    samples[name].append(time.perf_counter() - t)
        switch(True)

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(samples[a], samples[b]))

    p50 = {k: statistics.median(v) * 1000 for k, v in samples.items()}
    print(f"calls={calls} store={store} rounds={rounds} only={ONLY} p50 ms: bare {p50['bare']:.3f} before "
          f"{p50['before']:.3f} after {p50['after']:.3f} | before/bare {paired('before', 'bare'):.3f} after/bare "
          f"{paired('after', 'bare'):.3f} after/before {paired('after', 'before'):.3f}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "file"))
