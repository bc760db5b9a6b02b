"""Where a warm execute's time goes: cProfile over many executes of a 1-call and a 10-call program.

Not a benchmark (no ratios, not run by run_all.py): the profile behind bench/README.md's "where a 1-call
execute's time goes". Counts are per execute; the profiler's own overhead inflates the many small calls,
so read it for what is called and how often, and the benchmarks for what it costs.

    python bench/profile_execute.py [--runs 300] [--store file|memory] [--top 30] [--calls 1,10]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hmac
import io
import json
import pstats
import tempfile
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
from tether._runtime import Runtime
from tether._store import open_store


def program(calls: int) -> str:
    return f"import tools\ntotal = 0\nfor i in range({calls}):\n    r = await tools.bench.get(id=i)\n" \
           "    total += r[\"value\"]\ntotal\n"


class Counted:
    """How often the costs named in issue 24 happen per execute: HMACs, json.dumps / encodes."""

    def __init__(self) -> None:
        self.counts = {"hmac.new": 0, "json.dumps": 0, "JSONEncoder.encode": 0}
        self._hmac_new, self._dumps, self._encode = hmac.new, json.dumps, json.JSONEncoder.encode

    def __enter__(self) -> "Counted":
        counts = self.counts
        hmac_new, dumps, encode = self._hmac_new, self._dumps, self._encode

        def counted_hmac(*a: Any, **k: Any) -> Any:
            counts["hmac.new"] += 1
            return hmac_new(*a, **k)

        def counted_dumps(*a: Any, **k: Any) -> Any:
            counts["json.dumps"] += 1
            return dumps(*a, **k)

        def counted_encode(self_: Any, o: Any) -> Any:
            counts["JSONEncoder.encode"] += 1
            return encode(self_, o)

        hmac.new, json.dumps, json.JSONEncoder.encode = counted_hmac, counted_dumps, counted_encode  # type: ignore[assignment, method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        hmac.new, json.dumps, json.JSONEncoder.encode = self._hmac_new, self._dumps, self._encode  # type: ignore[method-assign]


async def profile(calls: int, runs: int, store_url: str, top: int) -> None:
    code = program(calls)
    async with Runtime(tools=common.bench_tools(), store=open_store(store_url)) as rt:
        for _ in range(30):
            assert (await rt.execute(code)).status == "completed"
        with Counted() as counted:
            for _ in range(20):
                await rt.execute(code)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(runs):
            await rt.execute(code)
        prof.disable()
    print(f"\n== {calls}-call execute, {runs} runs, store {store_url.split('?')[0]}")
    print("per execute: " + ", ".join(f"{k} {v / 20:g}" for k, v in counted.counts.items()))
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    print(out.getvalue())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--store", choices=("file", "memory"), default="file")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--calls", default="1,10")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/profile.db" if args.store == "file" else "sqlite:///:memory:"
        for calls in (int(c) for c in args.calls.split(",")):
            asyncio.run(profile(calls, args.runs, url, args.top))


if __name__ == "__main__":
    main()
