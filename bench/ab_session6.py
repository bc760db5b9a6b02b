"""A/B of issue 24's session-6 changes in one process: switched off (as before) and on, alternately, paired.

Not a benchmark run by run_all.py: a one-off measurement kept so the figures in bench/README.md ("Issue 24,
session 6: the 10-call program") can be taken again. It swaps the old behaviour back in on alternate executes
of one warm runtime: the worker given back to the pool before the answer (``Execution.__aexit__`` awaiting the
return), the run's limits and policy parsed on every attempt, the heartbeat's task started with every
attempt, a value's journal size measured with ``json.dumps`` (a new encoder each call), and the run signature's
shared head hashed again for each field. It reaches into private names, so it breaks
(loudly) when they are renamed; bare Monty ``feed_run`` (checkout, run, return) runs in the same rounds.

    python bench/ab_session6.py ROUNDS CALLS [file|memory]     # e.g. 300 10 memory
    ONLY=giveback|parse|heartbeat|size|sign python bench/ab_session6.py ...  # one alone (the others on)
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import pydantic_monty as pm

import common
import tether._engine.attempt.driver as driver
import tether._engine.calls.boundary as boundary
import tether._engine.calls.ledger as ledger
import tether._sandbox.monty as monty
from tether._engine.approvals.capabilities import Keyring
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._store import open_store

ONLY = os.environ.get("ONLY", "both")
_AEXIT, _LIMITS, _POLICY, _HEARTBEAT = monty.Execution.__aexit__, driver._LIMITS, driver._POLICY, driver._Heartbeat
_VALUE_SIZE = ledger.value_size
_MACS = Keyring.macs


def _macs_one_by_one(key: bytes, head: Any, tails: Any) -> list[str]:
    """Session 5's run signature: each field's MAC hashing the shared head again."""
    return [Keyring.mac(key, *head, a, b) for a, b in tails]


def _value_size_dumps(value: Any) -> int:
    """Session 5's value_size: json.dumps with options, a new encoder on every call."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def _heartbeat_task(attempt: Any, boundary: Any) -> Any:
    """Session 5's heartbeat: its task started with every attempt."""
    return asyncio.ensure_future(attempt._heartbeat(boundary))


async def _aexit_awaited(self: Any, *exc: Any) -> None:
    """Session 5's __aexit__: the worker given back before the answer."""
    cm, self._cm = self._cm, None
    if cm is not None:
        self._pool.busy -= 1
        try:
            await cm.__aexit__(None, None, None)
        except Exception:  # noqa: BLE001
            pass


def switch(on: bool) -> None:
    giveback = on or ONLY not in ("both", "giveback")
    parse = on or ONLY not in ("both", "parse")
    heartbeat = on or ONLY not in ("both", "heartbeat")
    size = on or ONLY not in ("both", "size")
    sign = on or ONLY not in ("both", "sign")
    Keyring.macs = staticmethod(_MACS if sign else _macs_one_by_one)  # type: ignore[method-assign]
    boundary.value_size = _VALUE_SIZE if size else _value_size_dumps  # type: ignore[attr-defined]
    ledger.value_size = _VALUE_SIZE if size else _value_size_dumps
    driver._Heartbeat = _HEARTBEAT if heartbeat else _heartbeat_task  # type: ignore[misc, assignment]
    monty.Execution.__aexit__ = _AEXIT if giveback else _aexit_awaited  # type: ignore[method-assign]
    driver._LIMITS = _LIMITS if parse else Limits.from_dict
    driver._POLICY = _POLICY if parse else Policy.from_dict


async def main(rounds: int, calls: int, store: str) -> None:
    code = (f"import tools\ntotal = 0\nfor i in range({calls}):\n    r = await tools.bench.get(id=i)\n"
            "    total += r[\"value\"]\ntotal\n")
    tmp = tempfile.mkdtemp()
    url = f"sqlite:///{tmp}/ab.db" if store == "file" else "sqlite:///:memory:"
    modules = {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": common.get})})}
    cpu: dict[str, list[float]] = {"bare": [], "before": [], "after": []}
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
                t, c = time.perf_counter(), time.process_time()
                await fn()
                if i >= 30:
                    samples[name].append(time.perf_counter() - t)
                    cpu[name].append(time.process_time() - c)
        switch(True)

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(samples[a], samples[b]))

    p50 = {k: statistics.median(v) * 1000 for k, v in samples.items()}
    c50 = {k: statistics.median(v) * 1000 for k, v in cpu.items()}
    print(f"calls={calls} store={store} rounds={rounds} only={ONLY} load={os.getloadavg()[0]:.1f} p50 ms: bare "
          f"{p50['bare']:.3f} before {p50['before']:.3f} after {p50['after']:.3f} | host CPU ms: bare "
          f"{c50['bare']:.3f} before {c50['before']:.3f} after {c50['after']:.3f} | before/bare "
          f"{paired('before', 'bare'):.3f} after/bare {paired('after', 'bare'):.3f} after/before "
          f"{paired('after', 'before'):.3f}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "file"))
