"""Streamed async calls on and off (D-80): bare Monty and tether, awaited and gathered calls, paired in one process.

    python bench/stream_bench.py [--quick] [--rounds 200] [--warmup N]

pydantic-monty's ``stream_async_calls`` lets a call the program does not await at once reach the host
without suspending the worker. Eight contenders run interleaved, round-robin: bare Monty ``feed_run`` in a
warm pool and tether's ``execute`` (check off, in-memory store), each with the setting off and on, each on
core_bench's program (ten awaited calls and a reduce) and on the same calls gathered. Each setting's bare
Monty is the baseline of tether's ratio under that setting; "on / off" compares a contender with itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic_monty as pm

import common
from common import CALLS, EXPECTED, PROGRAM
from tether._runtime import Runtime
from tether._sandbox.monty import SandboxPool

# The same calls and reduce as PROGRAM, issued together.
GATHERED = f"""\
import asyncio
import tools
rs = await asyncio.gather(*[tools.bench.get(id=i) for i in range({CALLS})])
total = 0
for r in rs:
    total += r["value"]
total
"""
PROGRAMS = {"awaited": PROGRAM, "gathered": GATHERED}
# A setting's gain at least this large (on / off, paired, tether on the gathered program) is worth its risk.
GAIN_WORTH_IT = 0.95


def _modules() -> dict[str, Any]:
    return {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": common.get})})}


async def run(rounds: int, warmup: int) -> dict[str, Any]:
    modules = _modules()
    async with (
        pm.AsyncMonty(min_processes=1, max_processes=2, stream_async_calls=False) as bare_off,
        pm.AsyncMonty(min_processes=1, max_processes=2, stream_async_calls=True) as bare_on,
    ):
        pools = {False: SandboxPool(max_workers=2, request_timeout=65.0, stream_async_calls=False),
                 True: SandboxPool(max_workers=2, request_timeout=65.0, stream_async_calls=True)}
        try:
            async with (
                Runtime(tools=common.bench_tools(), pool=pools[False], check="off") as rt_off,
                Runtime(tools=common.bench_tools(), pool=pools[True], check="off") as rt_on,
            ):
                def bare(pool: Any, code: str) -> Any:
                    async def go() -> Any:
                        async with pool.checkout(external_modules=modules) as session:
                            return await session.feed_run(code)
                    return go

                def tether(rt: Runtime, code: str) -> Any:
                    async def go() -> Any:
                        r = await rt.execute(code)
                        if r.status != "completed":
                            raise RuntimeError(f"tether run {r.status}: {r.error}")
                        return r.result
                    return go

                contenders = {}
                for shape, code in PROGRAMS.items():
                    contenders[f"bare_{shape}_off"] = bare(bare_off, code)
                    contenders[f"bare_{shape}_on"] = bare(bare_on, code)
                    contenders[f"tether_{shape}_off"] = tether(rt_off, code)
                    contenders[f"tether_{shape}_on"] = tether(rt_on, code)

                def check(name: str, value: Any) -> None:
                    if value != EXPECTED:
                        raise RuntimeError(f"{name} computed {value!r}, not {EXPECTED}")

                samples = await common.interleave(contenders, rounds, warmup, after_each=check)
        finally:
            for pool in pools.values():
                await pool.close()
    rows = []
    for shape in PROGRAMS:
        for who in ("bare", "tether"):
            off, on = samples[f"{who}_{shape}_off"], samples[f"{who}_{shape}_on"]
            rows.append({"contender": f"{who} {shape}", "off_ms": round(common.stats(off).p50 * 1000, 3),
                         "on_ms": round(common.stats(on).p50 * 1000, 3),
                         "on_over_off": round(common.paired_ratio(on, off), 3)})
        for setting in ("off", "on"):
            t, b = samples[f"tether_{shape}_{setting}"], samples[f"bare_{shape}_{setting}"]
            rows.append({"contender": f"tether / bare {shape}, {setting}", "ratio": round(common.paired_ratio(t, b), 3)})
    return {"rows": rows}


def main() -> None:
    args = common.parser(__doc__.splitlines()[0], rounds=200, quick_rounds=30).parse_args()
    rounds, warmup = common.rounds_of(args)
    out = asyncio.run(run(rounds, warmup))
    rows = out["rows"]
    print(common.table([r for r in rows if "on_over_off" in r],
                       [("contender", "contender"), ("off_ms", "off p50 ms"), ("on_ms", "on p50 ms"),
                        ("on_over_off", "on / off paired")],
                       title=f"streamed async calls, {rounds} interleaved rounds"))
    print()
    print(common.table([r for r in rows if "ratio" in r], [("contender", "under one setting"),
                                                           ("ratio", "paired ratio")]))
    gathered = next(r for r in rows if r["contender"] == "tether gathered")
    targets = [common.target("tether, gathered calls, streamed on / off (paired; informational, D-80)",
                             gathered["on_over_off"], GAIN_WORTH_IT, "x")]
    print()
    print(common.table(targets, common.TARGET_COLUMNS))
    common.emit("stream", args.quick, {"rounds": rounds, "rows": rows, "targets": targets})


if __name__ == "__main__":
    main()
