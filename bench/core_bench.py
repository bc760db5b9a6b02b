"""Core: what one warm `execute` costs against bare Monty, FastMCP Code Mode and plain CPython.

Every contender runs the same program (10 sequentially awaited calls of the
same tool function, then a reduce) in the same process, interleaved round
by round. The baseline is bare Monty driven the fastest way it offers: one
pool reused, ``checkout(external_modules=...)`` + ``feed_run(code)`` with
async host functions. Targets: tether's warm execute with default
settings at most 1.3x that floor on a quiet machine and 1.6x on a busy one
(quiet: the 1-minute load average at most 0.5 per core before the bench
starts, and at the end no more above that than the bench's own process and
its Monty worker add, 1.3); with the type check off (the engine itself), at
most 1.2x. Lineage (P-45, D-64): the same execute under ``[policy] writes =
"guard"``, where each read's tool is untrusted (no label says otherwise) and
journals its label and marks, at most 1.1x the same execute under the default
policy (paired, check off both).

    python bench/core_bench.py [--quick] [--rounds N]
    python bench/core_bench.py --profile [--runs 300] [--store file|memory] [--top 30] [--calls 1,10]

``--profile`` measures nothing against anything: cProfile over many warm executes of a 1-call and a
10-call program, with the HMACs and JSON encodes an execute makes counted. The profiler's own overhead
inflates the many small calls, so read it for what is called and how often, and the ratios for the cost.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hmac
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
from typing import Any

import pydantic_monty as pm

import common
from common import CALLS, EXPECTED, FASTMCP_PROGRAM, PROGRAM, get
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._store import open_store
from tether._tools.catalog import Catalog
from tether._tools.stubs import build_stubs

TARGET_RATIO = 1.2
GUARD_RATIO = 1.1
DEFAULT_QUIET, DEFAULT_BUSY = 1.3, 1.6
# Read before any contender runs: the bench itself keeps about a core busy.
LOAD_AT_START = os.getloadavg()[0]
QUIET_LOAD = 0.5 * (os.cpu_count() or 1)
OWN_LOAD = 1.3


def quiet() -> tuple[bool, str]:
    """Whether the machine was quiet for this run, and the loads that say so."""
    end = os.getloadavg()[0]
    return LOAD_AT_START <= QUIET_LOAD and end <= QUIET_LOAD + OWN_LOAD, f"load {LOAD_AT_START:.1f} → {end:.1f}"

LABELS = {
    "bare_feed_run": "bare Monty feed_run (baseline)",
    "bare_feed_start": "bare Monty feed_start loop",
    "bare_feed_run_tc": "bare Monty feed_run + type check",
    "tether_default": "tether execute, default settings (check = calls)",
    "tether_tc_off": "tether execute, check off",
    "tether_guard": "tether execute, check off, writes = \"guard\" (P-45)",
    "tether_tc_on": "tether execute, check = full (ty; the verdict remembered)",
    "fastmcp": "FastMCP Code Mode (in-memory client)",
    "fastmcp_warm": "FastMCP Code Mode, warm-pool provider",
    "cpython": "CPython, functions awaited directly",
    "bare_0": "bare Monty, program without calls",
    "tether_0": "tether execute tc off, program without calls",
}
# What an inbox read returns: an untrusted result whose marks a guarded run journals (P-45).
INBOX = [{"id": f"m-{i}", "sender": f"user{i}@corp.example", "subject": "Quarterly numbers",
          "body": f"Hi, the figures are at https://files.corp.example/q{i}.pdf; call +41 44 668 18 0{i} if the "
                  "link does not open. Best regards from the finance team."} for i in range(3)]
# A program without host calls: splits tether's cost into per-execute and per-call parts.
PROGRAM_0 = "import tools\ntotal = 0\nfor i in range(10):\n    total += i * 2\ntotal\n"


def bare_modules(stubs: Any = None) -> dict[str, Any]:
    bench = pm.ExternalModule({"get": get}, stubs=stubs.namespace_modules["bench"] if stubs else None)
    return {"tools": pm.ExternalModule({"bench": bench}, stubs=stubs.tools_module if stubs else None)}


class WarmPoolProvider:
    """A FastMCP SandboxProvider that reuses one Monty pool (FastMCP's default starts a pool per execute)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    async def run(self, code: str, *, inputs: dict | None = None, external_functions: dict | None = None) -> Any:
        async with self.pool.checkout(limits={"max_feed_duration_secs": 30.0, "max_memory": 100_000_000}) as session:
            return await session.feed_run(code, inputs=inputs or None, external_lookup=external_functions)


async def feed_start_loop(pool: Any, modules: dict[str, Any]) -> Any:
    """Drive the program by answering every call with a future, then the future snapshot."""
    fns = {"tools.bench.get": get}
    async with pool.checkout(external_modules=modules) as session:
        snap = await session.feed_start(PROGRAM)
        pending: dict[int, Any] = {}
        while not isinstance(snap, pm.MontyComplete):
            if isinstance(snap, pm.AsyncFunctionSnapshot) and not snap.is_os_function:
                pending[snap.call_id] = fns[snap.function_name](*snap.args, **snap.kwargs)
                snap = await snap.resume({"future": ...})
            elif isinstance(snap, pm.AsyncFutureSnapshot):
                ids = list(snap.pending_call_ids)
                values = await asyncio.gather(*(pending.pop(i) for i in ids))
                snap = await snap.resume({i: {"return_value": v} for i, v in zip(ids, values)})
            else:
                snap = await snap.resume_auto()
        return snap.output


async def run(rounds: int, warmup: int, stream: bool = False) -> dict[str, Any]:
    from fastmcp import Client, FastMCP
    from fastmcp.experimental.transforms.code_mode import CodeMode

    catalog = Catalog(common.bench_tools())
    stubs = build_stubs(catalog)
    diag: dict[str, list[dict[str, Any]]] = {"tether_default": [], "tether_tc_off": [], "tether_tc_on": []}

    async with (
        # The floor runs under tether's streamed-calls setting (common.stream_setting), as tether does.
        pm.AsyncMonty(min_processes=1, max_processes=2, stream_async_calls=stream) as pool,
        pm.AsyncMonty(min_processes=1, max_processes=2) as fm_pool,
        Runtime(tools=common.bench_tools()) as rt,
        Runtime(tools=common.bench_tools(), policy=Policy(writes="guard")) as rt_guard,
    ):
        modules = bare_modules()
        modules_tc = bare_modules(stubs)

        async def bare_feed_run() -> Any:
            async with pool.checkout(external_modules=modules) as session:
                return await session.feed_run(PROGRAM)

        async def bare_feed_run_tc() -> Any:
            async with pool.checkout(type_check=True, type_check_stubs=stubs.prelude,
                                     external_modules=modules_tc) as session:
                return await session.feed_run(PROGRAM)

        async def bare_0() -> Any:
            async with pool.checkout(external_modules=modules) as session:
                return await session.feed_run(PROGRAM_0)

        async def tether(check: str | None, code: str = PROGRAM, runtime: Runtime = rt) -> Any:
            result = await (runtime.execute(code, check=check) if check else runtime.execute(code))
            if result.status != "completed":
                raise RuntimeError(f"tether run {result.status}: {result.error}")
            return result

        mcp = FastMCP("bench")
        mcp.tool(get)
        mcp.add_transform(CodeMode())
        mcp_warm = FastMCP("bench-warm")
        mcp_warm.tool(get)
        mcp_warm.add_transform(CodeMode(sandbox_provider=WarmPoolProvider(fm_pool)))

        async with Client(mcp) as client, Client(mcp_warm) as client_warm:

            async def fastmcp(c: Any = client) -> Any:
                r = await c.call_tool("execute", {"code": FASTMCP_PROGRAM})
                return r

            contenders = {
                "bare_feed_run": bare_feed_run,
                "tether_default": lambda: tether(None),
                "tether_tc_off": lambda: tether("off"),
                "tether_guard": lambda: tether("off", runtime=rt_guard),
                "tether_tc_on": lambda: tether("full"),
                "bare_feed_start": lambda: feed_start_loop(pool, modules),
                "bare_feed_run_tc": bare_feed_run_tc,
                "fastmcp": fastmcp,
                "fastmcp_warm": lambda: fastmcp(client_warm),
                "cpython": common.cpython_direct,
                "bare_0": bare_0,
                "tether_0": lambda: tether("off", PROGRAM_0),
            }

            def check(name: str, value: Any) -> None:
                if name.startswith("tether"):
                    diag.setdefault(name, []).append(value.diagnostics)
                    value = value.result
                elif name.startswith("fastmcp"):
                    value = int(value.content[0].text)
                if value != EXPECTED:
                    raise RuntimeError(f"{name} computed {value!r}, not {EXPECTED}")

            samples = await common.interleave(contenders, rounds, warmup, after_each=check)

    rows = common.ratio_rows(samples, "bare_feed_run", LABELS)
    with tempfile.TemporaryDirectory() as tmp:
        parts = await call_parts(500 if rounds < 100 else 5000, tmp)
    guard = common.paired_ratio(samples["tether_guard"], samples["tether_tc_off"])
    return {"rows": rows, "phases": phases(diag), "parts": parts, "guard_ratio": round(guard, 3)}


async def call_parts(iterations: int, store_dir: str) -> list[dict[str, Any]]:
    """What one read costs inside the effect boundary, piece by piece (µs, p50 of batches).

    The pieces are the ones EffectBoundary.call / _tool_call / _dispatch run for
    a read, timed on their own so a fix can be aimed at the biggest. Rows marked
    "(writes only)" or "(not on the read path)" show what the path avoids for
    reads: reads are journaled in batches and awaited in place (docs P-7).
    """
    import time

    from tether._engine.attempt.result import to_json_value
    from tether._engine.calls.call import call_key
    from tether._engine.lineage.values import marks
    from tether._engine.rules import policy
    from tether._store import open_store
    from tether._store.base import CallRecord, RunRecord

    catalog = Catalog(common.bench_tools())
    tool = catalog.get("bench.get")
    args = {"id": 3}
    stores = {"memory": open_store("sqlite:///:memory:"), "file": open_store(f"sqlite:///{store_dir}/parts.db")}
    for st in stores.values():
        st.create_run(RunRecord(run_id="r", status="running", program="", environment={}, policy={}, limits={},
                                created_at=0.0, updated_at=0.0))
    seq = [0]

    def journal_pair(st: Any) -> None:
        seq[0] += 1
        st.record_call(CallRecord("r", seq[0], "tool", "bench.get", args, "k", "read", "pending", started_at=0.0))
        st.update_call("r", seq[0], ["pending"], state="done", outcome={"id": 3, "value": 6}, finished_at=0.0)

    async def plain() -> Any:
        return await tool.handler(args)

    async def task_shield_wait_for() -> Any:
        task = asyncio.ensure_future(asyncio.wait_for(tool.handler(args), timeout=15.0))
        return await asyncio.shield(task)

    async def inline_timeout() -> Any:
        async with asyncio.timeout(15.0):
            return await tool.handler(args)

    batch_records: list[CallRecord] = []

    def journal_batched(st: Any) -> None:
        # One read's share of a 64-read batch: a record in memory, 1/64 of a commit.
        seq[0] += 1
        batch_records.append(CallRecord("r", seq[0], "tool", "bench.get", args, "k", "read", "done",
                                        outcome={"id": 3, "value": 6}, started_at=0.0, finished_at=0.0))
        if len(batch_records) >= 64:
            st.record_calls(list(batch_records))
            batch_records.clear()

    parts: list[tuple[str, Any, bool]] = [
        ("catalog.get", lambda: catalog.get("bench.get"), False),
        ("catalog.validate_args (not on the read path of self-validating tools)",
         lambda: catalog.validate_args("bench.get", args), False),
        ("call_key (json + sha256)", lambda: call_key("tool", "bench.get", args), False),
        ("policy.decide_call", lambda: policy.decide_call(policy.Policy(), "bench.get", False, 0), False),
        ("to_json_value(result)", lambda: to_json_value({"id": 3, "value": 6}), False),
        ("journal, batched (reads), file SQLite", lambda: journal_batched(stores["file"]), False),
        ("journal intent+outcome (writes only), memory SQLite", lambda: journal_pair(stores["memory"]), False),
        ("journal intent+outcome (writes only), file SQLite", lambda: journal_pair(stores["file"]), False),
        ("tool.handler (pydantic validate + jsonable)", plain, True),
        ("handler under asyncio.timeout (reads)", inline_timeout, True),
        ("handler via task+shield (writes only)", task_shield_wait_for, True),
        ("lineage marks of an untrusted read (writes = \"guard\"): a 3-mail inbox",
         lambda: marks(INBOX), False),
    ]
    # Interleaved like the contenders: one batch of each piece per round.
    batch = 20
    per: dict[str, list[float]] = {label: [] for label, _, _ in parts}
    for _ in range(max(5, iterations // batch)):
        for label, fn, is_async in parts:
            t = time.perf_counter()
            for _ in range(batch):
                if is_async:
                    await fn()
                else:
                    fn()
            per[label].append((time.perf_counter() - t) / batch)
    out = [{"part": label, "us": round(statistics.median(xs) * 1e6, 1)} for label, xs in per.items()]
    for st in stores.values():
        st.close()
    return out


def phases(diag: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """p50 of tether's own per-phase diagnostics, per contender."""
    out = []
    for name, ds in diag.items():
        if name == "tether_0":
            continue
        per_call = [c["ms"] for d in ds for c in d.get("per_call", [])]
        out.append({
            "label": LABELS[name],
            "setup_ms": statistics.median(d["setup_ms"] for d in ds),
            "execution_ms": statistics.median(d["execution_ms"] for d in ds),
            "host_ms": round(statistics.median(d["host_ms"] for d in ds), 3),
            "total_ms": round(statistics.median(d["total_ms"] for d in ds), 3),
            "per_call_ms": statistics.median(per_call) if per_call else float("nan"),
        })
    return out


# -- --profile: where a warm execute's time goes (no ratios) ------------------------------------------


def profile_program(calls: int) -> str:
    return f"import tools\ntotal = 0\nfor i in range({calls}):\n    r = await tools.bench.get(id=i)\n" \
           "    total += r[\"value\"]\ntotal\n"


class Counted:
    """How often an execute makes the costs the signing and the journal add: HMACs, json.dumps, encodes."""

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
    code = profile_program(calls)
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


def profile_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description="core_bench --profile: cProfile over warm executes")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--store", choices=("file", "memory"), default="file")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--calls", default="1,10")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/profile.db" if args.store == "file" else "sqlite:///:memory:"
        for calls in (int(c) for c in args.calls.split(",")):
            asyncio.run(profile(calls, args.runs, url, args.top))


def main() -> None:
    if "--profile" in sys.argv[1:]:
        profile_main(sys.argv[1:])
        return
    args = common.add_stream_flag(common.parser(__doc__.splitlines()[0], rounds=200, quick_rounds=20)).parse_args()
    rounds, warmup = common.rounds_of(args)
    stream = common.stream_setting(args)
    out = asyncio.run(run(rounds, warmup, stream))
    rows, by = out["rows"], {r["contender"]: r for r in out["rows"]}
    print(common.table(rows, common.RATIO_COLUMNS,
                       title=f"core: {CALLS} sequential awaited calls + reduce, {rounds} interleaved rounds "
                             f"(ratios against bare Monty feed_run; streamed async calls "
                             f"{'on' if stream else 'off'} for both)"))
    print()
    print(common.table(out["phases"], [("label", "tether phase p50"), ("setup_ms", "setup ms"),
                                       ("execution_ms", "execution ms"), ("host_ms", "host ms"),
                                       ("per_call_ms", "per call ms"), ("total_ms", "total ms")]))
    print()
    print(common.table(out["parts"], [("part", "one read inside the boundary, piece by piece"), ("us", "p50 µs")]))
    base = by["bare_feed_run"]["p50_ms"]
    where = {
        "type_check_ms": round(by["tether_tc_on"]["p50_ms"] - by["tether_tc_off"]["p50_ms"], 3),
        "monty_type_check_ms": round(by["bare_feed_run_tc"]["p50_ms"] - base, 3),
        "tether_overhead_per_execute_ms": round(by["tether_0"]["p50_ms"] - by["bare_0"]["p50_ms"], 3),
        "tether_overhead_per_call_ms": round(((by["tether_tc_off"]["p50_ms"] - by["tether_0"]["p50_ms"])
                                              - (base - by["bare_0"]["p50_ms"])) / CALLS, 3),
        "fastmcp_overhead_per_call_ms": round((by["fastmcp_warm"]["p50_ms"] - base) / CALLS, 3),
    }
    print()
    print("where time goes (p50 differences): " + ", ".join(f"{k}={v}" for k, v in where.items()))
    is_quiet, loads = quiet()
    targets = [
        common.target("tether execute (check off) / bare Monty", by["tether_tc_off"]["paired_ratio"],
                      TARGET_RATIO, "x"),
        common.target(f"tether execute (default settings) / bare Monty, {'quiet' if is_quiet else 'busy'} "
                      f"({loads})", by["tether_default"]["paired_ratio"],
                      DEFAULT_QUIET if is_quiet else DEFAULT_BUSY, "x"),
        common.target("tether execute under writes = \"guard\" / the same under the default policy (check off)",
                      out["guard_ratio"], GUARD_RATIO, "x"),
    ]
    print()
    print(common.table(targets, common.TARGET_COLUMNS))
    common.emit("core", args.quick, {"rounds": rounds, "stream_async_calls": stream, "rows": rows, "phases": out["phases"], "parts": out["parts"],
                                     "where": where,
                                     "targets": targets})


if __name__ == "__main__":
    main()
