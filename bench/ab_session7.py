"""A/B of issue 24's session-7 changes to an execute's fixed cost, in one process, paired.

Not a benchmark run by run_all.py: a one-off measurement kept so the figures in bench/README.md ("Issue 24,
session 7: the fixed cost") can be taken again. It swaps the old behaviour back in on alternate executes of
one warm runtime (``before``), bare Monty (checkout, ``feed_run``, return on the same pool) in the same
rounds, and reports p50s and the paired ratio. It reaches into private names, so it breaks (loudly) when
they are renamed.

    python bench/ab_session7.py [--rounds 400] [--calls 0|10] [--store memory|file] [--settled]
    ONLY=giveback|random|nulls|overlap|sparse|format1 python bench/ab_session7.py ...   # one alone (the others on)

By default each execute follows the previous one at once (the previous run's worker may still be on its
way back); ``--settled`` waits for every worker to be back before each timed execute.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import hmac
import os
import secrets
import statistics
import tempfile
import time
from typing import Any

import pydantic_monty as pm

import common
import tether._engine.integrity as integrity
import tether._engine.launcher as launcher
import tether._sandbox.monty as monty
from tether._engine.approvals.capabilities import _CANONICAL, Keyring
from tether._runtime import Runtime
from tether._store import open_store

ONLY = os.environ.get("ONLY", "all")
NAME = "ab_session7"  # what the report is headed with (ab_session8.py runs this harness on its own changes)


# -- session 6's behaviour, for "before" -----------------------------------------------------------


async def _give_back_at_once(self: Any, cm: Any) -> None:
    """Session 6: the worker's return started in its task's first step, queued ahead of the caller's wake-up."""
    try:
        await cm.__aexit__(None, None, None)
    except Exception:  # noqa: BLE001
        pass
    finally:
        self.busy -= 1


def _new_run_two_reads(engine: Any, code: str, **kw: Any) -> Any:
    """Session 6: the run id and the seed from two reads of the OS's randomness."""
    run = _NEW_RUN(engine, code, **kw)
    run.run_id = f"run_{secrets.token_hex(8)}"
    run.environment["seed"] = secrets.randbits(63)
    return run


def _macs_encoding_nulls(key: bytes, head: Any, tails: Any) -> list[str]:
    """Session 6: every field's value through the encoder, None included."""
    base = hmac.new(key, ("[" + ",".join(_CANONICAL.encode(p) for p in head) + ",").encode(), hashlib.sha256)
    out = []
    for a, b in tails:
        h = base.copy()
        h.update((_CANONICAL.encode(a) + "," + _CANONICAL.encode(b) + "]").encode())
        out.append(h.hexdigest())
    return out


async def _reserve_and_wait(self: Any, spec: Any) -> Any:
    """Session 6: the worker checked out before the rest of the attempt is built (nothing overlaps its trip)."""
    reserved = await _RESERVE(self, spec)
    try:
        await reserved.session  # awaited here, as Execution.__aenter__ awaited the checkout before
    except Exception:  # noqa: BLE001 - raised again where the execution enters it
        pass
    return reserved


def _sign_every_field(keyring: Any, run: Any, version: int = 1) -> Any:
    """Session 6: a MAC for each of the 14 signed fields, None ones included (D-51 signs those by absence)."""
    signed = integrity.signed_run_fields(run)
    macs = Keyring.macs(keyring.current, ("run", run.run_id), signed)
    fields = {name: mac[:32] for (name, _), mac in zip(signed, macs)}
    return integrity._SignedHere({"secret_id": keyring.current_id, "fields": fields}, run, [v for _, v in signed])


def _sign_format_1(keyring: Any, run: Any, version: int = 2) -> Any:
    """Before D-55: the run signature of format 1 (no version tag, no MAC over the names of the fields)."""
    return _SIGN_RUN(keyring, run, 1)


_SIGN_RUN = integrity.sign_run
_NEW_RUN = launcher.new_run
_RESERVE = monty.SandboxPool.reserve
# name -> (object, attribute, the value before). Each is put back by switch(on=False).
CHANGES: dict[str, tuple[Any, str, Any]] = {
    "giveback": (monty.SandboxPool, "_give_back", _give_back_at_once),
    "random": (launcher, "new_run", _new_run_two_reads),
    "nulls": (Keyring, "macs", staticmethod(_macs_encoding_nulls)),
    "overlap": (monty.SandboxPool, "reserve", _reserve_and_wait),
    "format1": (launcher, "sign_run", _sign_format_1),
    "sparse": (launcher, "sign_run", _sign_every_field),  # after format1: with both before, session 6's wins
}
_AFTER = {name: owner.__dict__[attr] for name, (owner, attr, _old) in CHANGES.items()}


def switch(on: bool) -> None:
    # Every change's "after" first, then the "before" ones: two changes of one attribute (format1, sparse)
    # must not have the one left on undo the one being measured.
    befores = [(owner, attr, old) for name, (owner, attr, old) in CHANGES.items()
               if not (on or ONLY not in ("all", name))]
    for name, (owner, attr, _old) in CHANGES.items():
        setattr(owner, attr, _AFTER[name])
    for owner, attr, old in befores:
        setattr(owner, attr, old)


def program(calls: int) -> str:
    if calls == 0:
        return "import tools\ntotal = 0\nfor i in range(10):\n    total += i * 2\ntotal\n"
    return (f"import tools\ntotal = 0\nfor i in range({calls}):\n    r = await tools.bench.get(id=i)\n"
            "    total += r[\"value\"]\ntotal\n")


async def main_async(args: argparse.Namespace) -> None:
    code = program(args.calls)
    tmp = tempfile.TemporaryDirectory()
    store = open_store(f"sqlite:///{os.path.join(tmp.name, 'runs.db')}") if args.store == "file" else None
    wall: dict[str, list[float]] = {"before": [], "after": [], "bare": []}
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    async with Runtime(tools=common.bench_tools(), store=store) as rt:
        pool = rt.engine.pool._pool
        modules = {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": common.get})})}

        async def bare() -> float:
            await rt.engine.pool.returned()
            t = time.perf_counter()
            async with pool.checkout(external_modules=modules) as session:
                await session.feed_run(code)
            return time.perf_counter() - t

        async def tether(on: bool) -> tuple[float, float]:
            switch(on)
            if args.settled:
                await rt.engine.pool.returned()
            c = time.process_time()
            t = time.perf_counter()
            result = await rt.execute(code, check=args.check)
            t, c = time.perf_counter() - t, time.process_time() - c
            if result.status != "completed":
                raise SystemExit(f"tether run {result.status}: {result.error}")
            return t, c

        for i in range(args.warmup + args.rounds):
            b = await bare()
            first = i % 2 == 0
            one = await tether(first)
            two = await tether(not first)
            after, before = (one, two) if first else (two, one)
            if i >= args.warmup:
                wall["bare"].append(b)
                wall["after"].append(after[0])
                wall["before"].append(before[0])
                cpu["after"].append(after[1])
                cpu["before"].append(before[1])
            if i % 50 == 0:
                gc.collect()
        switch(True)
    tmp.cleanup()

    def p50(values: list[float]) -> float:
        return statistics.median(values) * 1000

    ratio = statistics.median(a / b for a, b in zip(wall["after"], wall["before"]))
    cpu_ratio = statistics.median(a / b for a, b in zip(cpu["after"], cpu["before"]) if b > 0)
    print(f"{NAME} {ONLY}: {args.calls} calls, {args.store} store, check {args.check}, "
          f"{'settled' if args.settled else 'back to back'}, {args.rounds} rounds, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"  p50 ms: bare {p50(wall['bare']):.3f}  before {p50(wall['before']):.3f}  after {p50(wall['after']):.3f}")
    print(f"  after/before paired: wall {ratio:.3f}  process CPU {cpu_ratio:.3f}")
    print(f"  vs bare (p50s): before {p50(wall['before']) / p50(wall['bare']):.2f}x  "
          f"after {p50(wall['after']) / p50(wall['bare']):.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--store", choices=("memory", "file"), default="memory")
    p.add_argument("--check", choices=("off", "calls", "full"), default="off")
    p.add_argument("--settled", action="store_true")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
